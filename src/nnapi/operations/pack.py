"""PACK (feature level 6): stacks N tensors of rank R into one tensor of rank R+1.

Input 0 is the INT32 axis in [-(R+1), R+1); inputs 1..N are the tensors, of one type
and one shape. Quant8 inputs and the output share one scale and zero point. The
output's dimension ``axis`` has size N and selects the input tensor.
"""

from __future__ import annotations

import numpy as np

from nnapi.codes import OperandCode, OperationCode
from nnapi.operations._shape_common import DATA_TYPES_INT, check_known_rank_at_least
from nnapi.operations.base import ExecutionContext, Operation, Shape, ValidationContext, register
from nnapi.operations.common import QUANT8_TENSORS, normalize_axis

T = OperandCode

# Named input positions (Android's pack.cpp kInputAxisScalar, kInputFirstTensor).
AXIS = 0
FIRST_INPUT = 1



def _axis(ctx: ExecutionContext) -> int:
    rank = ctx.input(FIRST_INPUT).rank
    axis = int(ctx.scalar(AXIS))
    normalized = normalize_axis(axis, rank + 1)
    ctx.require(normalized is not None, f"axis {axis} is out of range for inputs of rank {rank}")
    return normalized  # type: ignore[return-value]


@register(OperationCode.PACK)
class Pack(Operation):
    def validate(self, ctx: ValidationContext) -> None:
        if len(ctx.inputs) < 2:
            ctx.fail(f"expected at least 2 inputs (the axis and a tensor), got {len(ctx.inputs)}")
        ctx.check_counts(inputs=len(ctx.inputs), outputs=1)
        ctx.check_input_type(AXIS, T.INT32)
        ctx.check_input_type(FIRST_INPUT, DATA_TYPES_INT)
        code = ctx.input_type(FIRST_INPUT)
        known = [ctx.inputs[i].dimensions for i in range(FIRST_INPUT, len(ctx.inputs)) if ctx.inputs[i].rank]
        for index in range(FIRST_INPUT, len(ctx.inputs)):
            ctx.check_input_type(index, code)
            check_known_rank_at_least(ctx, index, 1)
            if code in QUANT8_TENSORS:
                ctx.check_same_quantization(("input", 1), ("input", index))
        if len({len(d) for d in known}) > 1:
            ctx.fail("the tensors to pack must all have the same rank")
        specified = {d for d in known if 0 not in d}
        if len(specified) > 1:
            ctx.fail(f"the tensors to pack must all have the same shape, got {sorted(map(list, specified))}")
        ctx.check_output_type(0, code)
        if code in QUANT8_TENSORS:
            ctx.check_same_quantization(("input", 1), ("output", 0))
        out_rank = ctx.outputs[0].rank
        if known and out_rank and out_rank != len(known[0]) + 1:
            ctx.fail(f"output 0 must have rank {len(known[0]) + 1}, got {out_rank}")

    def prepare(self, ctx: ExecutionContext) -> list[Shape]:
        shape = ctx.input(FIRST_INPUT).shape
        ctx.require(len(shape) >= 1, "the tensors to pack must have rank at least 1")
        for index in range(2, len(ctx.inputs)):
            ctx.require(ctx.input(index).shape == shape,
                        f"input {index} has shape {list(ctx.input(index).shape)}, input 1 has {list(shape)}")
        axis = _axis(ctx)
        return [shape[:axis] + (len(ctx.inputs) - 1,) + shape[axis:]]

    def execute(self, ctx: ExecutionContext) -> list[np.ndarray]:
        values = [ctx.value(index) for index in range(FIRST_INPUT, len(ctx.inputs))]
        return [np.stack(values, axis=_axis(ctx)).astype(ctx.output_dtype(0), copy=False)]

    def plan(self, ctx: ExecutionContext):
        """The axis and output dtype resolved once."""
        axis, dtype = _axis(ctx), ctx.output_dtype(0)
        return lambda values: [np.stack(values[FIRST_INPUT:], axis=axis).astype(dtype, copy=False)]
