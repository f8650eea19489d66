"""CHANNEL_SHUFFLE: regroups the channels of one axis, as in ShuffleNet.

With G = num_groups and group_size = channels / G:
output_channel[k * G + g] = input_channel[g * group_size + k], i.e. the axis viewed as
[G, group_size] is transposed to [group_size, G]. The axis may be negative.
"""

from __future__ import annotations

import numpy as np

from nnapi.codes import OperandCode, OperationCode
from nnapi.operations._shape_common import DATA_TYPES, axis_value, check_output_like_input
from nnapi.operations.base import ExecutionContext, Operation, Shape, ValidationContext, register

T = OperandCode

# Named input positions (Android's channel_shuffle.cpp).
INPUT = 0
NUM_GROUPS = 1
AXIS = 2

_MAX_RANK = 4


def _groups_and_axis(ctx: ExecutionContext) -> tuple[int, int]:
    shape = ctx.input(INPUT).shape
    axis = axis_value(ctx, AXIS, len(shape))
    groups = int(ctx.scalar(NUM_GROUPS))
    ctx.require(groups > 0, f"num_groups must be positive, got {groups}")
    ctx.require(shape[axis] % groups == 0, f"{shape[axis]} channels are not divisible into {groups} groups")
    return groups, axis


@register(OperationCode.CHANNEL_SHUFFLE)
class ChannelShuffle(Operation):
    def validate(self, ctx: ValidationContext) -> None:
        ctx.check_counts(inputs=3, outputs=1)
        ctx.check_input_types([DATA_TYPES, T.INT32, T.INT32])
        ctx.check_input_max_rank(INPUT, _MAX_RANK)
        check_output_like_input(ctx)

    def prepare(self, ctx: ExecutionContext) -> list[Shape]:
        _groups_and_axis(ctx)
        return [ctx.input(INPUT).shape]

    def execute(self, ctx: ExecutionContext) -> list[np.ndarray]:
        groups, axis = _groups_and_axis(ctx)
        x = ctx.value(INPUT)
        shape = x.shape
        grouped = x.reshape(shape[:axis] + (groups, shape[axis] // groups) + shape[axis + 1:])
        return [np.ascontiguousarray(np.swapaxes(grouped, axis, axis + 1)).reshape(shape)]

    def plan(self, ctx: ExecutionContext):
        """The grouped shape resolved once."""
        groups, axis = _groups_and_axis(ctx)
        shape = ctx.input(INPUT).shape
        grouped = shape[:axis] + (groups, shape[axis] // groups) + shape[axis + 1:]
        return lambda values: [np.ascontiguousarray(np.swapaxes(values[INPUT].reshape(grouped), axis,
                                                                axis + 1)).reshape(shape)]
