"""POW, MAXIMUM, MINIMUM: broadcasting two-input element-wise math without a fused
activation.

POW takes float tensors only (base ** exponent, computed in float32; a negative base with
a non-integer exponent gives NaN, as C's pow does). MAXIMUM and MINIMUM also take
TENSOR_INT32 and quantized tensors; quantized inputs may each have their own scale and
zero point, and the output its own: the larger / smaller real value is quantized into the
output (the same as requantizing both first, since requantizing is monotonic).
"""

from __future__ import annotations

import numpy as np

from nnapi.codes import OperandCode, OperationCode
from nnapi.operations._elementwise import (
    FLOAT_TENSORS,
    QUANT8_TENSORS,
    broadcast_output_shape,
    check_broadcast,
    float_input,
    map_quant8_pair,
)
from nnapi.operations.base import ExecutionContext, Operation, Shape, ValidationContext, register
from nnapi.operations.common import quantize
from nnapi.operations.quant_math import dequantize

T = OperandCode

# Named input positions (Android's pow.cpp / maximum_minimum.cpp kInputTensor1, kInputTensor2).
INPUT1 = 0
INPUT2 = 1

Op = OperationCode

_TYPES = {
    Op.POW: FLOAT_TENSORS,
    Op.MAXIMUM: FLOAT_TENSORS + (T.TENSOR_INT32,) + QUANT8_TENSORS,
    Op.MINIMUM: FLOAT_TENSORS + (T.TENSOR_INT32,) + QUANT8_TENSORS,
}
_FUNCTIONS = {Op.POW: np.power, Op.MAXIMUM: np.maximum, Op.MINIMUM: np.minimum}


@register(Op.POW, Op.MAXIMUM, Op.MINIMUM)
class BinaryMath(Operation):
    def validate(self, ctx: ValidationContext) -> None:
        ctx.check_counts(inputs=2, outputs=1)
        ctx.check_input_type(INPUT1, _TYPES[self.code])
        ctx.check_input_type(INPUT2, ctx.input_type(INPUT1))
        ctx.check_output_type(0, ctx.input_type(INPUT1))
        check_broadcast(ctx)

    def prepare(self, ctx: ExecutionContext) -> list[Shape]:
        return [broadcast_output_shape(ctx)]

    def execute(self, ctx: ExecutionContext) -> list[np.ndarray]:
        a, b = ctx.input(INPUT1), ctx.input(INPUT2)
        function = _FUNCTIONS[self.code]
        if a.type == T.TENSOR_INT32:
            return [function(a.value, b.value).astype(np.int32, copy=False)]
        if a.type in QUANT8_TENSORS:
            output = ctx.output(0)

            def on_stored(stored_a: np.ndarray, stored_b: np.ndarray) -> np.ndarray:
                real = function(dequantize(stored_a, a.scale, a.zero_point),
                                dequantize(stored_b, b.scale, b.zero_point))
                return quantize(real, output)

            return [map_quant8_pair(a.value, b.value, on_stored)]
        with np.errstate(all="ignore"):
            result = function(float_input(a), float_input(b))
        return [result.astype(ctx.output_dtype(0), copy=False)]
