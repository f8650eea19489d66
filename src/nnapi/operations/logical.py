"""LOGICAL_AND, LOGICAL_OR (broadcasting) and LOGICAL_NOT on TENSOR_BOOL8 tensors."""

from __future__ import annotations

import numpy as np

from nnapi.codes import OperandCode, OperationCode
from nnapi.operations.base import ExecutionContext, Operation, Shape, ValidationContext, register
from nnapi.operations.elementwise import (
    broadcast_output_shape,
    check_broadcast,
    check_same_shape_output,
)

T = OperandCode

# Named input positions (Android's logical_and_or.cpp / logical_not.cpp).
INPUT1 = 0  # LOGICAL_AND / LOGICAL_OR
INPUT2 = 1
INPUT = 0  # LOGICAL_NOT

Op = OperationCode

_BINARY = {Op.LOGICAL_AND: np.logical_and, Op.LOGICAL_OR: np.logical_or}


@register(Op.LOGICAL_AND, Op.LOGICAL_OR)
class LogicalBinary(Operation):
    def validate(self, ctx: ValidationContext) -> None:
        ctx.check_counts(inputs=2, outputs=1)
        ctx.check_input_types([T.TENSOR_BOOL8, T.TENSOR_BOOL8])
        ctx.check_output_type(0, T.TENSOR_BOOL8)
        check_broadcast(ctx)

    def prepare(self, ctx: ExecutionContext) -> list[Shape]:
        return [broadcast_output_shape(ctx)]

    def execute(self, ctx: ExecutionContext) -> list[np.ndarray]:
        result = _BINARY[self.code](ctx.value(INPUT1), ctx.value(INPUT2))
        return [np.asarray(result, dtype=np.bool_)]

    def plan(self, ctx: ExecutionContext):
        """``execute`` without a context per call (a WHILE condition runs one per iteration)."""
        combine = _BINARY[self.code]
        return lambda values: [np.asarray(combine(values[INPUT1], values[INPUT2]), dtype=np.bool_)]


@register(Op.LOGICAL_NOT)
class LogicalNot(Operation):
    def validate(self, ctx: ValidationContext) -> None:
        ctx.check_counts(inputs=1, outputs=1)
        ctx.check_input_type(INPUT, T.TENSOR_BOOL8)
        ctx.check_output_type(0, T.TENSOR_BOOL8)
        check_same_shape_output(ctx)

    def prepare(self, ctx: ExecutionContext) -> list[Shape]:
        return [ctx.input(INPUT).shape]

    def execute(self, ctx: ExecutionContext) -> list[np.ndarray]:
        return [np.logical_not(ctx.value(INPUT))]

    def plan(self, ctx: ExecutionContext):
        """``execute`` without a context per call."""
        return lambda values: [np.logical_not(values[INPUT])]

