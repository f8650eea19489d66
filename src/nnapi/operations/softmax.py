"""SOFTMAX and LOG_SOFTMAX along any axis, with the positive exponent scale beta.

SOFTMAX takes float32 / float16 / quant8 / quant8 signed (rank up to 4, the axis input
optional, default -1); its quantized output has scale 1/256 and zero point 0 (unsigned)
or -128 (signed). LOG_SOFTMAX takes float32 / float16 of any rank and a mandatory axis.
Both subtract the maximum before exponentiating; float tensors are computed in float32,
quantized ones in float64, and rounded once to the output type. A quantized input holds
at most 256 values, so exp(beta * scale * (q - max q)) comes from a 256-entry table of
exp(-beta * scale * k), k = max q - q (made per execution by ``execute``, once by ``plan``).
"""

from __future__ import annotations

import numpy as np

from nnapi.codes import FeatureLevelCode, OperandCode, OperationCode
from nnapi.operand import dtype_of
from nnapi.operations import _jit
from nnapi.operations.base import ExecutionContext, Operation, Shape, ValidationContext, register
from nnapi.operations.common import QUANT8_TENSORS, dequantize_tensor, integer_range, normalize_axis, quantize

T = OperandCode

# Named input positions (Android's softmax.cpp kInputTensor, kBetaScalar, kAxisScalar).
INPUT = 0
BETA = 1
AXIS = 2

_SOFTMAX_TYPES = (T.TENSOR_FLOAT32, T.TENSOR_FLOAT16, T.TENSOR_QUANT8_ASYMM, T.TENSOR_QUANT8_ASYMM_SIGNED)
_LOG_SOFTMAX_TYPES = (T.TENSOR_FLOAT32, T.TENSOR_FLOAT16)
_OUTPUT_ZERO_POINT = {T.TENSOR_QUANT8_ASYMM: 0, T.TENSOR_QUANT8_ASYMM_SIGNED: -128}


@register(OperationCode.SOFTMAX, OperationCode.LOG_SOFTMAX, zero_sized_inputs=[OperationCode.SOFTMAX],
          omitted_operands=True)
class Softmax(Operation):
    def validate(self, ctx: ValidationContext) -> None:
        is_log = self.code == OperationCode.LOG_SOFTMAX
        ctx.check_counts(inputs=3 if is_log else (2, 3), outputs=1)
        ctx.check_input_type(INPUT, _LOG_SOFTMAX_TYPES if is_log else _SOFTMAX_TYPES)
        code = ctx.input_type(INPUT)
        beta_type = T.FLOAT16 if code == T.TENSOR_FLOAT16 else T.FLOAT32
        ctx.check_input_types([beta_type, T.INT32], start=BETA)
        if len(ctx.inputs) > AXIS:
            ctx.at_least(FeatureLevelCode.FEATURE_LEVEL_3)  # the axis
        ctx.check_output_type(0, code)
        if not is_log:
            ctx.check_input_max_rank(INPUT, 4)
        if code in _OUTPUT_ZERO_POINT:
            out = ctx.outputs[0]
            if out.scale != 1.0 / 256 or out.zero_point != _OUTPUT_ZERO_POINT[code]:
                ctx.fail(f"output 0 must have scale 1/256 and zero point {_OUTPUT_ZERO_POINT[code]}, "
                         f"got ({out.scale}, {out.zero_point})")

    def _axis(self, ctx: ExecutionContext) -> int:
        rank = ctx.input(INPUT).rank
        axis = -1 if ctx.is_omitted(AXIS) else int(ctx.scalar(AXIS))
        normalized = normalize_axis(axis, rank)
        ctx.require(normalized is not None and rank > 0, f"axis {axis} is out of range for rank {rank}")
        return normalized  # type: ignore[return-value]

    def prepare(self, ctx: ExecutionContext) -> list[Shape]:
        data = ctx.input(INPUT)
        if self.code == OperationCode.SOFTMAX:
            ctx.require(data.rank <= 4, f"input 0 must have rank at most 4, got {data.rank}")
        beta = float(ctx.scalar(BETA))
        ctx.require(beta > 0, f"beta must be positive, got {beta}")
        self._axis(ctx)
        return [data.shape]

    def execute(self, ctx: ExecutionContext) -> list[np.ndarray]:
        data, output = ctx.input(INPUT), ctx.output(0)
        if data.value.size == 0:
            return [np.zeros(data.shape, dtype=data.value.dtype)]
        axis = self._axis(ctx)
        if data.type in QUANT8_TENSORS:
            table = _exp_table(data.scale, float(ctx.scalar(BETA)))
            return [_quantized_softmax(data.value, axis, table, output)]
        # float tensors are computed in float32, as Android does (float16 rounded once at the end)
        x = dequantize_tensor(data, dtype=np.float32)
        result = _float_softmax(x, axis, np.float32(ctx.scalar(BETA)), self.code == OperationCode.LOG_SOFTMAX)
        return [quantize(result, output)]

    def plan(self, ctx: ExecutionContext):
        """The axis, beta and (quantized) the exponential table resolved once."""
        data, output = ctx.input(INPUT), ctx.output(0)
        axis = self._axis(ctx)
        if 0 in data.shape:
            return None
        if data.type in QUANT8_TENSORS:
            table = _exp_table(data.scale, float(ctx.scalar(BETA)))
            if axis == data.rank - 1:
                compiled = _compiled_softmax(data, output, table)
                if compiled is not None:
                    return compiled
            return lambda values: [_quantized_softmax(values[INPUT], axis, table, output)]
        if data.type != T.TENSOR_FLOAT32:
            return None
        beta, log = np.float32(ctx.scalar(BETA)), self.code == OperationCode.LOG_SOFTMAX
        return lambda values: [_float_softmax(values[INPUT], axis, beta, log)]


def _compiled_softmax(data, output, table: np.ndarray):
    """Quantized SOFTMAX along the last axis through the compiled ``softmax_quantized``
    (nnapi[fast]: ``_quantized_softmax``'s float64 operations, numpy's bits), or None."""
    module = _jit.kernels()
    if module is None:
        return None
    flip, _ = _jit.uint8_reading(data)
    low, high = (np.float64(bound) for bound in integer_range(output.type))
    scale, zero_point = np.float64(output.scale), np.float64(output.zero_point)
    table = _jit.constant(table, np.float64)
    dtype = dtype_of(output.type)
    if not _jit.warm_up(module.softmax_quantized, np.zeros((0, 1), np.uint8), flip, table, scale, zero_point, low,
                        high, np.empty((0, 1), np.uint8), np.empty(65, np.float64), np.empty(192, np.int64)):
        return None
    kernel = module.softmax_quantized

    def softmax(values: list) -> list[np.ndarray]:
        q = _jit.kernel_input(values[INPUT])
        n = q.shape[-1] if q.ndim else 1
        out = np.empty(q.shape, dtype)
        if q.size:
            kernel(q.reshape(-1, n).view(np.uint8), flip, table, scale, zero_point, low, high,
                   out.reshape(-1, n).view(np.uint8), _jit.scratch((n + 64,), np.float64),
                   _jit.scratch((192,), np.int64))
        return [out]

    return softmax


def _float_softmax(x: np.ndarray, axis: int, beta: np.float32, log: bool) -> np.ndarray:
    """(LOG_)SOFTMAX of float32 ``x`` along ``axis``, in float32. The maximum subtracted
    is fmax's, which skips NaN (numpy's max reduction along a short innermost axis is
    ~4x slower): a row holding NaN sums to NaN and comes out all NaN either way."""
    scaled = x - np.fmax.reduce(x, axis=axis, keepdims=True)
    if beta != 1:  # x * 1 is x: skipping the pass changes nothing
        scaled *= beta
    if log:
        return scaled - np.log(np.exp(scaled).sum(axis=axis, keepdims=True))
    result = np.exp(scaled, out=scaled)
    result /= result.sum(axis=axis, keepdims=True)
    return result


def _exp_table(scale: float, beta: float) -> np.ndarray:
    """exp(-beta * scale * k) for k = 0..255 (k = max q - q), in float64; beta is the
    model's float32 value."""
    return np.exp(np.arange(256, dtype=np.float64) * -(np.float64(scale) * np.float64(np.float32(beta))))


def _quantized_softmax(q: np.ndarray, axis: int, table: np.ndarray, output) -> np.ndarray:
    """SOFTMAX of 8-bit stored values along ``axis``: exponentials from ``table``, the
    sums and quotients exact in float64, rounded once to ``output``'s quantization."""
    gaps = q.max(axis=axis, keepdims=True).astype(np.int16) - q  # in [0, 255]
    exponentials = np.take(table, gaps)
    exponentials /= exponentials.sum(axis=axis, keepdims=True)
    return quantize(exponentials, output)
