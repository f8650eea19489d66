"""CONCATENATION: joins n tensors along an axis.

Inputs 0..n-1 are tensors of one type and rank that agree on every dimension but the
axis; input n is the INT32 axis in [0, rank). Quant8 inputs may each have their own
scale and zero point: every input is requantized into the output's before joining
(inputs that already match are copied exactly). Zero-sized inputs are allowed.
"""

from __future__ import annotations

import numpy as np

from nnapi.codes import OperandCode, OperationCode
from nnapi.operations._shape_common import DATA_TYPES
from nnapi.operations.base import ExecutionContext, Operation, Shape, ValidationContext, register
from nnapi.operations.common import QUANT8_TENSORS
from nnapi.operations.quant_math import requantize

T = OperandCode
_MAX_RANK = 4


@register(OperationCode.CONCATENATION, zero_sized_inputs=True)
class Concatenation(Operation):
    def validate(self, ctx: ValidationContext) -> None:
        if len(ctx.inputs) < 2:
            ctx.fail(f"expected at least 2 inputs (a tensor and the axis), got {len(ctx.inputs)}")
        ctx.check_counts(inputs=len(ctx.inputs), outputs=1)
        count = len(ctx.inputs) - 1
        ctx.check_input_type(0, DATA_TYPES)
        ranks = set()
        for index in range(count):
            ctx.check_input_type(index, ctx.input_type(0))
            ctx.check_input_max_rank(index, _MAX_RANK)
            if ctx.inputs[index].rank:
                ranks.add(ctx.inputs[index].rank)
        if len(ranks) > 1:
            ctx.fail(f"inputs 0..{count - 1} must all have the same rank, got ranks {sorted(ranks)}")
        ctx.check_input_type(count, T.INT32)
        ctx.check_output_type(0, ctx.input_type(0))

    def prepare(self, ctx: ExecutionContext) -> list[Shape]:
        count = len(ctx.inputs) - 1
        first = ctx.input(0).shape
        rank = len(first)
        axis = int(ctx.scalar(count))
        ctx.require(0 <= axis < rank, f"axis {axis} is out of range for rank {rank}")
        total = 0
        for index in range(count):
            shape = ctx.input(index).shape
            ctx.require(len(shape) == rank and all(a == b for d, (a, b) in enumerate(zip(shape, first, strict=True))
                                                   if d != axis),
                        f"input {index} of shape {list(shape)} does not match input 0 {list(first)} "
                        f"off axis {axis}")
            total += shape[axis]
        return [first[:axis] + (total,) + first[axis + 1:]]

    def execute(self, ctx: ExecutionContext) -> list[np.ndarray]:
        count = len(ctx.inputs) - 1
        axis = int(ctx.scalar(count))
        output = ctx.output(0)
        if output.type in QUANT8_TENSORS:
            parts = [requantize(t.value, t.scale, t.zero_point, output.scale, output.zero_point)
                     for t in (ctx.input(index) for index in range(count))]
        else:
            parts = [ctx.value(index) for index in range(count)]
        return [np.concatenate(parts, axis=axis).astype(ctx.output_dtype(0), copy=False)]
