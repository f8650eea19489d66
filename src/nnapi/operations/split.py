"""SPLIT: cuts a tensor along an axis into num_splits equal parts, one per output.

Inputs: 0 the tensor, 1 the INT32 axis (negative counts from the end), 2 the INT32
number of splits, which must equal the output count and divide the axis size.
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
from nnapi.operations.base import ExecutionContext, Operation, Shape, ValidationContext, register

T = OperandCode

# Named input positions (Android's split.cpp).
INPUT = 0
AXIS = 1
NUM_SPLITS = 2


@register(OperationCode.SPLIT)
class Split(Operation):
    def validate(self, ctx: ValidationContext) -> None:
        if not ctx.outputs:
            ctx.fail("expected at least 1 output, got 0")
        ctx.check_counts(inputs=3, outputs=len(ctx.outputs))
        ctx.check_input_types([DATA_TYPES_INT, T.INT32, T.INT32])
        check_known_rank_at_least(ctx, INPUT, 1)
        for index in range(len(ctx.outputs)):
            check_output_like_input(ctx, index)

    def prepare(self, ctx: ExecutionContext) -> list[Shape]:
        shape = ctx.input(INPUT).shape
        axis = axis_value(ctx, AXIS, len(shape))
        splits = int(ctx.scalar(NUM_SPLITS))
        ctx.require(splits == len(ctx.outputs),
                    f"num_splits {splits} does not match the {len(ctx.outputs)} outputs")
        ctx.require(shape[axis] % splits == 0, f"axis size {shape[axis]} is not divisible by {splits}")
        part = shape[:axis] + (shape[axis] // splits,) + shape[axis + 1:]
        return [part] * splits

    def execute(self, ctx: ExecutionContext) -> list[np.ndarray]:
        axis = axis_value(ctx, AXIS, ctx.input(INPUT).rank)
        return [np.ascontiguousarray(part) for part in np.split(ctx.value(INPUT), len(ctx.outputs), axis=axis)]

    def plan(self, ctx: ExecutionContext):
        """The parts' windows found once (static shape, constant axis and count)."""
        (part, *_) = self.prepare(ctx)
        axis = axis_value(ctx, AXIS, ctx.input(INPUT).rank)
        step = part[axis]
        windows = [(slice(None),) * axis + (slice(k * step, (k + 1) * step),) for k in range(len(ctx.outputs))]
        return lambda values: [np.ascontiguousarray(values[INPUT][window]) for window in windows]
