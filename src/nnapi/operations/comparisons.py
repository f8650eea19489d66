"""EQUAL, NOT_EQUAL, GREATER, GREATER_EQUAL, LESS, LESS_EQUAL: broadcasting element-wise
comparisons producing TENSOR_BOOL8.

Both inputs have one type (BOOL8, FLOAT16, FLOAT32, INT32, QUANT8_ASYMM or
QUANT8_ASYMM_SIGNED). Quantized inputs may have different scales and zero points: their
real values are compared, computed in float32 as (q - zero_point) * scale the way
Android's kernel does, so that values equal in float32 compare equal.
"""

from __future__ import annotations

import operator

import numpy as np

from nnapi.codes import OperandCode, OperationCode
from nnapi.operations.base import ExecutionContext, Operation, Shape, ValidationContext, register
from nnapi.operations.elementwise import (
    FLOAT_TENSORS,
    QUANT8_TENSORS,
    broadcast_output_shape,
    check_broadcast,
)
from nnapi.operations.quant_math import dequantize

T = OperandCode

# Named input positions (Android's comparisons.cpp kInputTensor1, kInputTensor2).
INPUT1 = 0
INPUT2 = 1

Op = OperationCode

_TYPES = (T.TENSOR_BOOL8,) + FLOAT_TENSORS + (T.TENSOR_INT32,) + QUANT8_TENSORS
_COMPARE = {
    Op.EQUAL: operator.eq,
    Op.NOT_EQUAL: operator.ne,
    Op.GREATER: operator.gt,
    Op.GREATER_EQUAL: operator.ge,
    Op.LESS: operator.lt,
    Op.LESS_EQUAL: operator.le,
}


@register(*_COMPARE)
class Comparison(Operation):
    def validate(self, ctx: ValidationContext) -> None:
        ctx.check_counts(inputs=2, outputs=1)
        ctx.check_input_type(INPUT1, _TYPES)
        ctx.check_input_type(INPUT2, ctx.input_type(INPUT1))
        ctx.check_output_type(0, T.TENSOR_BOOL8)
        check_broadcast(ctx)

    def prepare(self, ctx: ExecutionContext) -> list[Shape]:
        return [broadcast_output_shape(ctx)]

    def execute(self, ctx: ExecutionContext) -> list[np.ndarray]:
        a, b = ctx.input(INPUT1), ctx.input(INPUT2)
        if a.type in QUANT8_TENSORS and (a.scale, a.zero_point) != (b.scale, b.zero_point):
            left = dequantize(a.value, a.scale, a.zero_point, np.float32)
            right = dequantize(b.value, b.scale, b.zero_point, np.float32)
        else:
            # Same quantization: comparing the stored integers is comparing real values.
            left, right = a.value, b.value
        return [np.asarray(_COMPARE[self.code](left, right), dtype=np.bool_)]

    def plan(self, ctx: ExecutionContext):
        """Inputs of one quantization (or none) compared as stored, without a context per
        call (a WHILE condition runs one per iteration); others go through ``execute``."""
        a, b = ctx.input(INPUT1), ctx.input(INPUT2)
        if a.type in QUANT8_TENSORS and (a.scale, a.zero_point) != (b.scale, b.zero_point):
            return None
        compare = _COMPARE[self.code]
        return lambda values: [np.asarray(compare(values[INPUT1], values[INPUT2]), dtype=np.bool_)]
