"""QUANTIZE and DEQUANTIZE: convert between float tensors and quantized tensors.

QUANTIZE: TENSOR_FLOAT16 / TENSOR_FLOAT32 -> TENSOR_QUANT8_ASYMM / TENSOR_QUANT8_ASYMM_SIGNED,
output = clamp(round(input / scale) + zero_point). The division is done in float32 and
rounds halves away from zero, as Android's kernel (std::round on floats) does; NaN
saturates to the top of the range as its max(low, min(high, x)) does.

DEQUANTIZE: TENSOR_QUANT8_ASYMM, TENSOR_QUANT8_ASYMM_SIGNED, TENSOR_QUANT8_SYMM or
TENSOR_QUANT8_SYMM_PER_CHANNEL -> TENSOR_FLOAT16 / TENSOR_FLOAT32,
output = (input - zero_point) * scale (per channel: scales[c] along the channel
dimension), computed in float32 and rounded once to float16 where needed. Rank up to 4.

Both accept zero-sized inputs, as the specification allows.
"""

from __future__ import annotations

import numpy as np

from nnapi.codes import OperandCode, OperationCode
from nnapi.operations import _jit
from nnapi.operations.base import ExecutionContext, Operation, Shape, ValidationContext, register
from nnapi.operations.common import integer_range
from nnapi.operations.elementwise import FLOAT_TENSORS, QUANT8_TENSORS, check_same_shape_output, float_input
from nnapi.operations.quant_math import dequantize, dequantize_per_channel, quantize, round_half_away

T = OperandCode

# Named input positions (Android's quantize.cpp / dequantize.cpp kInputTensor).
INPUT = 0


_DEQUANTIZE_INPUTS = QUANT8_TENSORS + (T.TENSOR_QUANT8_SYMM, T.TENSOR_QUANT8_SYMM_PER_CHANNEL)
_DEQUANTIZE_MAX_RANK = 4


@register(OperationCode.QUANTIZE, zero_sized_inputs=True)
class Quantize(Operation):
    def validate(self, ctx: ValidationContext) -> None:
        ctx.check_counts(inputs=1, outputs=1)
        ctx.check_input_type(INPUT, FLOAT_TENSORS)
        ctx.check_output_type(0, QUANT8_TENSORS)
        check_same_shape_output(ctx)

    def prepare(self, ctx: ExecutionContext) -> list[Shape]:
        return [ctx.input(INPUT).shape]

    def execute(self, ctx: ExecutionContext) -> list[np.ndarray]:
        output = ctx.output(0)
        low, high = integer_range(output.type)
        with np.errstate(all="ignore"):
            shifted = quantize(float_input(ctx.input(INPUT)), output.scale, output.zero_point, np.float32)
        # fmin first: NaN becomes ``high``, as min(high, NaN) does in C++.
        clamped = np.fmax(np.fmin(shifted, np.float32(high)), np.float32(low))
        return [clamped.astype(ctx.output_dtype(0))]

    def plan(self, ctx: ExecutionContext):
        """Float32: the clamp moved before the rounding, into the one array the kernel
        owns. Rounding is monotonic and the bounds are integers, so clamping x / scale to
        [low - zero point, high - zero point] first gives the same stored values (NaN to
        the top, as ``execute``'s fmin does), and the rounded values fit 16-bit integers."""
        tensor, output = ctx.input(INPUT), ctx.output(0)
        if tensor.type != T.TENSOR_FLOAT32:
            return None
        low, high = integer_range(output.type)
        scale, zero_point = np.float32(output.scale), np.int16(output.zero_point)
        bottom, top = np.float32(low - output.zero_point), np.float32(high - output.zero_point)
        dtype = ctx.output_dtype(0)
        compiled = _compiled_quantize()
        if compiled is not None:
            def quantize_compiled(values: list) -> list[np.ndarray]:
                x = _jit.kernel_input(values[INPUT])
                rounded = np.empty(x.shape, np.int16)
                compiled(x.reshape(-1), scale, bottom, top, zero_point, rounded.reshape(-1))
                return [rounded.astype(dtype)]
            return quantize_compiled

        def quantize_float32(values: list) -> list[np.ndarray]:
            scaled = np.divide(values[INPUT], scale)
            np.fmin(scaled, top, out=scaled)
            np.fmax(scaled, bottom, out=scaled)
            rounded = round_half_away(scaled).astype(np.int16)
            rounded += zero_point
            return [rounded.astype(dtype)]
        return quantize_float32


def _compiled_quantize():
    """The compiled one-pass QUANTIZE of float32 (``_numba_quant``), or None."""
    if _jit.kernels() is None:
        return None
    from nnapi.operations._numba_quant import quantize_float32

    probe = np.zeros(0, np.float32)
    one = np.float32(1)
    ready = _jit.warm_up(quantize_float32, probe, one, one, one, np.int16(0), np.zeros(0, np.int16))
    return quantize_float32 if ready else None


@register(OperationCode.DEQUANTIZE, zero_sized_inputs=True)
class Dequantize(Operation):
    def validate(self, ctx: ValidationContext) -> None:
        ctx.check_counts(inputs=1, outputs=1)
        ctx.check_input_type(INPUT, _DEQUANTIZE_INPUTS)
        ctx.check_output_type(0, FLOAT_TENSORS)
        ctx.check_input_max_rank(INPUT, _DEQUANTIZE_MAX_RANK)
        # Per-channel parameters may be set after add_operation; Model.finish requires them.
        check_same_shape_output(ctx)

    def prepare(self, ctx: ExecutionContext) -> list[Shape]:
        shape = ctx.input(INPUT).shape
        ctx.require(len(shape) <= _DEQUANTIZE_MAX_RANK,
                    f"input 0 must have rank at most {_DEQUANTIZE_MAX_RANK}, got {len(shape)}")
        tensor = ctx.input(INPUT)
        if tensor.type == T.TENSOR_QUANT8_SYMM_PER_CHANNEL:
            params = tensor.channel_quant
            ctx.require(params is not None and params.channel_dim < len(shape)
                        and len(params.scales) == shape[params.channel_dim],
                        "per-channel scales do not match the channel dimension")
        return [shape]

    def execute(self, ctx: ExecutionContext) -> list[np.ndarray]:
        tensor = ctx.input(INPUT)
        if tensor.type == T.TENSOR_QUANT8_SYMM_PER_CHANNEL:
            params = tensor.channel_quant
            real = dequantize_per_channel(tensor.value, params.scales, params.channel_dim, np.float32)
        else:
            real = dequantize(tensor.value, tensor.scale, tensor.zero_point, np.float32)
        return [real.astype(ctx.output_dtype(0), copy=False)]

    def plan(self, ctx: ExecutionContext):
        """The scale (per channel: the broadcast scales) and zero point as float32
        constants made once; ``execute``'s float32 arithmetic."""
        tensor = ctx.input(INPUT)
        dtype = ctx.output_dtype(0)
        if tensor.type == T.TENSOR_QUANT8_SYMM_PER_CHANNEL:
            params = tensor.channel_quant
            shape = [1] * tensor.rank
            shape[params.channel_dim] = -1
            scales = np.asarray(params.scales, dtype=np.float32).reshape(shape)

            def per_channel(values: list) -> list[np.ndarray]:
                real = values[INPUT].astype(np.float32)
                real *= scales
                return [real.astype(dtype, copy=False)]
            return per_channel
        scale, zero_point = np.float32(tensor.scale), np.float32(tensor.zero_point)
        compiled = _jit.dequantize_kernel(tensor) if dtype == np.float32 else None
        if compiled is not None:
            kernel, flip, offset = compiled

            def dequantize_compiled(values: list) -> list[np.ndarray]:
                stored = _jit.kernel_input(values[INPUT])
                real = np.empty(stored.shape, np.float32)
                kernel(stored.reshape(-1).view(np.uint8), flip, offset, scale, real.reshape(-1))
                return [real]
            return dequantize_compiled

        def dequantize_8bit(values: list) -> list[np.ndarray]:
            real = np.subtract(values[INPUT], zero_point, dtype=np.float32)
            real *= scale
            return [real.astype(dtype, copy=False)]
        return dequantize_8bit
