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
from nnapi.operations._elementwise import FLOAT_TENSORS, QUANT8_TENSORS, check_same_shape_output, float_input
from nnapi.operations.base import ExecutionContext, Operation, Shape, ValidationContext, register
from nnapi.operations.common import integer_range
from nnapi.operations.quant_math import dequantize, dequantize_per_channel, quantize

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
