"""REVERSE (feature level 7): reverses a tensor along one dimension.

Input 1 is a TENSOR_INT32 of shape [1] naming the dimension, in [0, rank); inputs of
rank up to 8. Quantized outputs keep the input's scale and zero point.
"""

from __future__ import annotations

import numpy as np

from nnapi.codes import OperationCode
from nnapi.operations._shape_common import (
    DATA_TYPES_INT,
    check_known_rank_at_least,
    check_output_like_input,
    check_vector_input,
    int_values,
)
from nnapi.operations.base import ExecutionContext, Operation, Shape, ValidationContext, register

# Named input positions (Android's reverse.cpp kInputTensor, kInputAxisTensor).
INPUT = 0
AXIS = 1

_MAX_RANK = 8


def _axis(ctx: ExecutionContext) -> int:
    rank = ctx.input(INPUT).rank
    axis = int(int_values(ctx, AXIS, "axis", length=1)[0])
    ctx.require(0 <= axis < rank, f"axis {axis} is out of range [0, {rank})")
    return axis


@register(OperationCode.REVERSE)
class Reverse(Operation):
    def validate(self, ctx: ValidationContext) -> None:
        ctx.check_counts(inputs=2, outputs=1)
        ctx.check_input_type(INPUT, DATA_TYPES_INT)
        check_known_rank_at_least(ctx, INPUT, 1)
        ctx.check_input_max_rank(INPUT, _MAX_RANK)
        check_vector_input(ctx, AXIS, "axis")
        dims = ctx.inputs[AXIS].dimensions
        if len(dims) == 1 and dims[0] and dims[0] != 1:
            ctx.fail(f"input 1 (axis) must have shape [1], got {list(dims)}")
        check_output_like_input(ctx)

    def prepare(self, ctx: ExecutionContext) -> list[Shape]:
        _axis(ctx)
        return [ctx.input(INPUT).shape]

    def execute(self, ctx: ExecutionContext) -> list[np.ndarray]:
        return [np.ascontiguousarray(np.flip(ctx.value(INPUT), axis=_axis(ctx)))]

    def plan(self, ctx: ExecutionContext):
        """The axis resolved once."""
        axis = _axis(ctx)
        return lambda values: [np.ascontiguousarray(np.flip(values[INPUT], axis=axis))]
