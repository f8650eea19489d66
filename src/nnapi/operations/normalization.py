"""L2_NORMALIZATION, LOCAL_RESPONSE_NORMALIZATION and INSTANCE_NORMALIZATION.

- L2_NORMALIZATION divides by the L2 norm along an axis (default -1; a vector of zeros
  gives zeros); float32 / float16 / quant8 / quant8 signed, the quantized output with
  scale 1/128 and zero point 128 (unsigned) or 0 (signed). The norm is scale-free, so
  quantized inputs are normalized as their integer (q - zero_point) values, in Android's
  fixed point (``quant_math.l2_normalize_fixed_point``: equal to LiteRT's integer kernel;
  the float64 quotient rounded once differed by a step on 374 of 107,712 uint8 values and
  14,810 of 65,856 int8 values of 20 random quantizations each).
- LOCAL_RESPONSE_NORMALIZATION: x / (bias + alpha * sum of squares within the radius
  along an axis) ** beta; float32 / float16. The window sums come from a cumulative sum.
- INSTANCE_NORMALIZATION: (x - mean) * gamma / sqrt(var + epsilon) + beta, mean and
  variance over height and width of each batch and channel; float32 / float16, NHWC or
  NCHW.
L2_NORMALIZATION computes float tensors in float32 (as Android does); the others compute
in float64 and round once to the output type.
"""

from __future__ import annotations

import numpy as np

from nnapi.codes import FeatureLevelCode, OperandCode, OperationCode
from nnapi.operations.base import ExecutionContext, Operation, Shape, ValidationContext, register
from nnapi.operations.common import dtype_of, normalize_axis, quantize
from nnapi.operations.quant_math import l2_normalize_fixed_point

T = OperandCode

# Named input positions (Android's l2_normalization.cpp / local_response_normalization.cpp /
# instance_normalization.cpp kInputTensor, kAxisScalar, ...).
INPUT = 0
L2_AXIS = 1
LRN_RADIUS = 1
LRN_BIAS = 2
LRN_ALPHA = 3
LRN_BETA = 4
LRN_AXIS = 5
INSTANCE_GAMMA = 1
INSTANCE_BETA = 2
INSTANCE_EPSILON = 3
INSTANCE_LAYOUT = 4

_FLOAT = (T.TENSOR_FLOAT32, T.TENSOR_FLOAT16)
_L2_TYPES = _FLOAT + (T.TENSOR_QUANT8_ASYMM, T.TENSOR_QUANT8_ASYMM_SIGNED)
_L2_OUTPUT_ZERO_POINT = {T.TENSOR_QUANT8_ASYMM: 128, T.TENSOR_QUANT8_ASYMM_SIGNED: 0}
#: Android's floor on the L2 norm (float kernels), which turns all-zero vectors into zeros
_L2_EPSILON = 1e-6


def _scalar_type(code: OperandCode) -> OperandCode:
    return T.FLOAT16 if code == T.TENSOR_FLOAT16 else T.FLOAT32


def _axis(ctx: ExecutionContext, index: int) -> int:
    rank = ctx.input(INPUT).rank
    axis = -1 if ctx.is_omitted(index) else int(ctx.scalar(index))
    normalized = normalize_axis(axis, rank)
    ctx.require(rank > 0 and normalized is not None, f"axis {axis} is out of range for rank {rank}")
    return normalized  # type: ignore[return-value]


@register(OperationCode.L2_NORMALIZATION, omitted_operands=True)
class L2Normalization(Operation):
    def validate(self, ctx: ValidationContext) -> None:
        ctx.check_counts(inputs=(1, 2), outputs=1)
        ctx.check_input_types([_L2_TYPES, T.INT32])
        if len(ctx.inputs) > L2_AXIS:
            ctx.at_least(FeatureLevelCode.FEATURE_LEVEL_3)  # the axis
        code = ctx.input_type(INPUT)
        ctx.check_output_type(0, code)
        ctx.check_input_max_rank(INPUT, 4)
        if code in _L2_OUTPUT_ZERO_POINT:
            out = ctx.outputs[0]
            if out.scale != 1.0 / 128 or out.zero_point != _L2_OUTPUT_ZERO_POINT[code]:
                ctx.fail(f"output 0 must have scale 1/128 and zero point {_L2_OUTPUT_ZERO_POINT[code]}, "
                         f"got ({out.scale}, {out.zero_point})")

    def prepare(self, ctx: ExecutionContext) -> list[Shape]:
        ctx.require(ctx.input(INPUT).rank <= 4, f"input 0 must have rank at most 4, got {ctx.input(INPUT).rank}")
        _axis(ctx, L2_AXIS)
        return [ctx.input(INPUT).shape]

    def execute(self, ctx: ExecutionContext) -> list[np.ndarray]:
        data = ctx.input(INPUT)
        if data.value.size == 0:
            return [np.zeros(data.shape, dtype=data.value.dtype)]
        axis = _axis(ctx, L2_AXIS)
        if data.type not in _FLOAT:
            return [_l2_quantized(data.value, data.zero_point, axis, ctx.output(0))]
        x = data.value.astype(np.float32)  # float16 too, as Android computes
        norm = np.sqrt(np.sum(x * x, axis=axis, keepdims=True))
        result = x / np.maximum(norm, x.dtype.type(_L2_EPSILON))
        return [quantize(result, ctx.output(0))]

    def plan(self, ctx: ExecutionContext):
        """Float32: ``execute``'s passes on the axis resolved once. Quantized: ``execute``'s
        fixed point with the axis and output resolved once."""
        data, output = ctx.input(INPUT), ctx.output(0)
        axis = _axis(ctx, L2_AXIS)
        if 0 in data.shape or data.type == T.TENSOR_FLOAT16:
            return None
        if data.type == T.TENSOR_FLOAT32:
            epsilon = np.float32(_L2_EPSILON)

            def l2_float(values: list) -> list[np.ndarray]:
                x = values[INPUT]
                norm = np.sqrt(np.sum(x * x, axis=axis, keepdims=True))
                return [x / np.maximum(norm, epsilon)]
            return l2_float
        zero_point = data.zero_point

        def l2_quantized(values: list) -> list[np.ndarray]:
            return [_l2_quantized(values[INPUT], zero_point, axis, output)]
        return l2_quantized


def _l2_quantized(values: np.ndarray, zero_point: int, axis: int, output) -> np.ndarray:
    """8-bit L2_NORMALIZATION along ``axis`` in Android's fixed point, stored as ``output``."""
    offsets = np.moveaxis(np.subtract(values, zero_point, dtype=np.int64), axis, -1)
    info = np.iinfo(dtype_of(output.type))
    # Android's int8 kernel along the last axis is TFLite's, which folds the 2**7 into the
    # rescale's exponent; its other 8-bit kernels multiply by 128 first
    last_signed = info.dtype == np.int8 and axis == values.ndim - 1
    result = l2_normalize_fixed_point(offsets, output.zero_point, info.min, info.max, last_signed)
    return np.moveaxis(result, -1, axis).astype(info.dtype)


@register(OperationCode.LOCAL_RESPONSE_NORMALIZATION, omitted_operands=True)
class LocalResponseNormalization(Operation):
    def validate(self, ctx: ValidationContext) -> None:
        ctx.check_counts(inputs=(5, 6), outputs=1)
        if len(ctx.inputs) > LRN_AXIS:
            ctx.at_least(FeatureLevelCode.FEATURE_LEVEL_3)  # the axis
        ctx.check_input_type(INPUT, _FLOAT)
        scalar = _scalar_type(ctx.input_type(INPUT))
        ctx.check_input_types([T.INT32, scalar, scalar, scalar, T.INT32], start=LRN_RADIUS)
        ctx.check_output_type(0, ctx.input_type(INPUT))
        ctx.check_input_max_rank(INPUT, 4)

    def prepare(self, ctx: ExecutionContext) -> list[Shape]:
        ctx.require(ctx.input(INPUT).rank <= 4, f"input 0 must have rank at most 4, got {ctx.input(INPUT).rank}")
        ctx.require(int(ctx.scalar(LRN_RADIUS)) >= 0, f"radius must be non-negative, got {ctx.scalar(LRN_RADIUS)}")
        _axis(ctx, LRN_AXIS)
        return [ctx.input(INPUT).shape]

    def execute(self, ctx: ExecutionContext) -> list[np.ndarray]:
        data = ctx.input(INPUT)
        if data.value.size == 0:
            return [np.zeros(data.shape, dtype=data.value.dtype)]
        axis = _axis(ctx, LRN_AXIS)
        radius = int(ctx.scalar(LRN_RADIUS))
        bias, alpha, beta = (float(ctx.scalar(i)) for i in (LRN_BIAS, LRN_ALPHA, LRN_BETA))
        x = np.moveaxis(data.value.astype(np.float64), axis, -1)
        depth = x.shape[-1]
        # running[..., k] = sum of squares of channels < k; a window sum is a difference
        running = np.concatenate([np.zeros((*x.shape[:-1], 1)), np.cumsum(x * x, axis=-1)], axis=-1)
        index = np.arange(depth)
        upper = np.minimum(index + radius + 1, depth)
        lower = np.maximum(index - radius, 0)
        squares = running[..., upper] - running[..., lower]
        result = x / np.power(bias + alpha * squares, beta)
        return [np.moveaxis(result, -1, axis).astype(data.value.dtype)]

    def plan(self, ctx: ExecutionContext):
        """The window bounds, axis and parameters resolved once; ``execute``'s float64 passes."""
        data = ctx.input(INPUT)
        if 0 in data.shape:
            return None
        axis = _axis(ctx, LRN_AXIS)
        radius = int(ctx.scalar(LRN_RADIUS))
        bias, alpha, beta = (float(ctx.scalar(i)) for i in (LRN_BIAS, LRN_ALPHA, LRN_BETA))
        depth = data.shape[axis]
        index = np.arange(depth)
        upper, lower = np.minimum(index + radius + 1, depth), np.maximum(index - radius, 0)
        dtype = np.float16 if data.type == T.TENSOR_FLOAT16 else np.float32

        def lrn(values: list) -> list[np.ndarray]:
            x = np.moveaxis(values[INPUT].astype(np.float64), axis, -1)
            running = np.concatenate([np.zeros((*x.shape[:-1], 1)), np.cumsum(x * x, axis=-1)], axis=-1)
            squares = running[..., upper] - running[..., lower]
            result = x / np.power(bias + alpha * squares, beta)
            return [np.moveaxis(result, -1, axis).astype(dtype)]
        return lrn


@register(OperationCode.INSTANCE_NORMALIZATION)
class InstanceNormalization(Operation):
    def validate(self, ctx: ValidationContext) -> None:
        ctx.check_counts(inputs=5, outputs=1)
        ctx.check_input_type(INPUT, _FLOAT)
        scalar = _scalar_type(ctx.input_type(INPUT))
        ctx.check_input_types([scalar, scalar, scalar, T.BOOL], start=INSTANCE_GAMMA)
        ctx.check_output_type(0, ctx.input_type(INPUT))
        ctx.check_input_rank(INPUT, 4)

    def prepare(self, ctx: ExecutionContext) -> list[Shape]:
        ctx.require(ctx.input(INPUT).rank == 4, f"input 0 must have rank 4, got {ctx.input(INPUT).rank}")
        return [ctx.input(INPUT).shape]

    def execute(self, ctx: ExecutionContext) -> list[np.ndarray]:
        data = ctx.input(INPUT)
        if data.value.size == 0:
            return [np.zeros(data.shape, dtype=data.value.dtype)]
        gamma, beta, epsilon = (float(ctx.scalar(i)) for i in (INSTANCE_GAMMA, INSTANCE_BETA, INSTANCE_EPSILON))
        spatial = (2, 3) if bool(ctx.scalar(INSTANCE_LAYOUT)) else (1, 2)
        x = data.value.astype(np.float64)
        mean = x.mean(axis=spatial, keepdims=True)
        centered = x - mean
        variance = np.mean(centered * centered, axis=spatial, keepdims=True)
        result = centered * gamma / np.sqrt(variance + epsilon) + beta
        return [result.astype(data.value.dtype)]

    def plan(self, ctx: ExecutionContext):
        """The parameters and spatial axes resolved once; ``execute``'s float64 passes."""
        data = ctx.input(INPUT)
        if 0 in data.shape:
            return None
        gamma, beta, epsilon = (float(ctx.scalar(i)) for i in (INSTANCE_GAMMA, INSTANCE_BETA, INSTANCE_EPSILON))
        spatial = (2, 3) if bool(ctx.scalar(INSTANCE_LAYOUT)) else (1, 2)
        dtype = np.float16 if data.type == T.TENSOR_FLOAT16 else np.float32

        def instance_normalization(values: list) -> list[np.ndarray]:
            x = values[INPUT].astype(np.float64)
            centered = x - x.mean(axis=spatial, keepdims=True)
            variance = np.mean(centered * centered, axis=spatial, keepdims=True)
            return [(centered * gamma / np.sqrt(variance + epsilon) + beta).astype(dtype)]
        return instance_normalization
