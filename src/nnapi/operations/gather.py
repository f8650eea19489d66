"""GATHER: picks slices of a tensor along an axis by index.

Inputs: 0 the n-D tensor, 1 the INT32 axis (negative counts from the end), 2 a k-D
TENSOR_INT32 of indices, each in [0, size of the axis). The output has shape
input[:axis] + indices.shape + input[axis+1:].
"""

from __future__ import annotations

import numpy as np

from nnapi.codes import OperandCode, OperationCode
from nnapi.operations._shape_common import (
    DATA_TYPES_INT,
    axis_value,
    check_known_rank_at_least,
    check_output_like_input,
)
from nnapi.operations.base import ExecutionContext, Operation, OperationFailed, Shape, ValidationContext, register

T = OperandCode

# Named input positions (Android's gather.cpp kInputTensor, kInputAxis, kInputIndices).
INPUT = 0
AXIS = 1
INDICES = 2



# Beyond Android's CPU kernels, which refuse a zero-sized input here: the result is well defined
# and tests/test_ops_shape.py::TestZeroSized relies on it.
@register(OperationCode.GATHER, zero_sized_inputs=True)
class Gather(Operation):
    def validate(self, ctx: ValidationContext) -> None:
        ctx.check_counts(inputs=3, outputs=1)
        ctx.check_input_types([DATA_TYPES_INT, T.INT32, T.TENSOR_INT32])
        check_known_rank_at_least(ctx, INPUT, 1)
        check_output_like_input(ctx)

    def prepare(self, ctx: ExecutionContext) -> list[Shape]:
        shape = ctx.input(INPUT).shape
        axis = axis_value(ctx, AXIS, len(shape))
        indices = ctx.value(INDICES)
        ctx.require(indices is not None, "input 2 (indices) has no value")
        # The output's shape follows from the indices' shape alone. Their values are
        # checked here when known (a constant, or at execution); at preparation, indices
        # computed at run time (a loop counter) are not, and the prepared kernel checks them.
        if isinstance(indices, np.ndarray):
            ctx.require(_in_range(indices, shape[axis]), f"indices must be in [0, {shape[axis]})")
        return [shape[:axis] + tuple(ctx.input(INDICES).shape) + shape[axis + 1:]]

    def execute(self, ctx: ExecutionContext) -> list[np.ndarray]:
        axis = axis_value(ctx, AXIS, ctx.input(INPUT).rank)
        return [np.take(ctx.value(INPUT), ctx.value(INDICES), axis=axis)]

    def plan(self, ctx: ExecutionContext):
        """The axis resolved once (static shapes, constant axis); each call checks the
        indices (their values may be known only at run time) and takes."""
        axis = axis_value(ctx, AXIS, ctx.input(INPUT).rank)
        size = ctx.input(INPUT).shape[axis]
        message = f"{ctx.code.name}: indices must be in [0, {size})"  # as ``ExecutionContext.require`` says it

        def run(values: list) -> list[np.ndarray]:
            indices = values[INDICES]
            # one index (a loop body's time step): its value read directly, not two reductions
            if not (0 <= indices.item() < size if indices.size == 1 else _in_range(indices, size)):
                raise OperationFailed(message)
            return [values[INPUT].take(indices, axis=axis)]  # np.take without its Python wrapper
        return run


def _in_range(indices: np.ndarray, size: int) -> bool:
    """Whether every index is in [0, ``size``)."""
    return not indices.size or (int(indices.min()) >= 0 and int(indices.max()) < size)
