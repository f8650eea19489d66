"""CONCATENATION: joins n tensors along an axis.

Inputs 0..n-1 are tensors of one type and rank that agree on every dimension but the
axis; input n is the INT32 axis in [0, rank). Quant8 inputs may each have their own
scale and zero point: every input is requantized into the output's before joining, as
Android's kernel does (quant_math.requantize_concatenated: C float arithmetic, inputs that
already match copied exactly; the plan makes each input's 256-entry table once). Zero-sized
inputs are allowed.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from nnapi.codes import OperandCode, OperationCode
from nnapi.operations._shape_common import DATA_TYPES
from nnapi.operations.base import ExecutionContext, Operation, Shape, ValidationContext, register
from nnapi.operations.common import QUANT8_TENSORS
from nnapi.operations.elementwise import prepared_quant8
from nnapi.operations.quant_math import concatenation_table, requantize_concatenated

T = OperandCode

# Named input positions (Android's concatenation.cpp): the tensors from FIRST_INPUT, the axis last.
FIRST_INPUT = 0

_MAX_RANK = 4


def _check_shapes(ctx: ValidationContext, count: int, rank: int, axis: int) -> None:
    """With the axis known: it is in range, the inputs agree off the axis, and the
    declared output has their shape with the axis dimensions summed (0s are unknown)."""
    if not 0 <= axis < rank:
        ctx.fail(f"input {count} (axis) is {axis}, out of range for rank {rank}")
    output = ctx.outputs[0]
    if output.rank and output.rank != rank:
        ctx.fail(f"output 0 must have rank {rank}, got {output.rank}")
    for dim in range(rank):
        if dim == axis:
            continue
        known = [(f"input {i}", ctx.dim(i, dim)) for i in range(count) if ctx.inputs[i].rank]
        if output.rank:
            known.append(("output 0", ctx.dim(0, dim, output=True)))
        known = [(name, size) for name, size in known if size]
        for name, size in known[1:]:
            if size != known[0][1]:
                ctx.fail(f"{name} dimension {dim} is {size} but {known[0][0]}'s is {known[0][1]}: "
                         f"only axis {axis} may differ")
    sizes = [ctx.dim(i, axis) for i in range(count)]
    if output.rank and all(sizes) and ctx.dim(0, axis, output=True):
        ctx.check_dims_agree(f"output 0 dimension {axis} must be the sum of the inputs'",
                             ctx.dim(0, axis, output=True), sum(sizes))


@register(OperationCode.CONCATENATION, zero_sized_inputs=True)
class Concatenation(Operation):
    def validate(self, ctx: ValidationContext) -> None:
        if len(ctx.inputs) < 2:
            ctx.fail(f"expected at least 2 inputs (a tensor and the axis), got {len(ctx.inputs)}")
        ctx.check_counts(inputs=len(ctx.inputs), outputs=1)
        count = len(ctx.inputs) - 1
        ctx.check_input_type(FIRST_INPUT, DATA_TYPES)
        ranks = set()
        for index in range(count):
            ctx.check_input_type(index, ctx.input_type(FIRST_INPUT))
            ctx.check_input_max_rank(index, _MAX_RANK)
            if ctx.inputs[index].rank:
                ranks.add(ctx.inputs[index].rank)
        if len(ranks) > 1:
            ctx.fail(f"inputs 0..{count - 1} must all have the same rank, got ranks {sorted(ranks)}")
        ctx.check_input_type(count, T.INT32)
        ctx.check_output_type(0, ctx.input_type(FIRST_INPUT))
        axis = ctx.constant(count)
        if axis is not None and ranks:
            _check_shapes(ctx, count, ranks.pop(), int(axis))

    def prepare(self, ctx: ExecutionContext) -> list[Shape]:
        count = len(ctx.inputs) - 1
        return [joined_shape([ctx.input(index).shape for index in range(count)], int(ctx.scalar(count)), ctx.fail)]

    def execute(self, ctx: ExecutionContext) -> list[np.ndarray]:
        count = len(ctx.inputs) - 1
        axis = int(ctx.scalar(count))
        output = ctx.output(0)
        if output.type in QUANT8_TENSORS:
            parts = [requantize_concatenated(t.value, t.scale, t.zero_point, output.scale, output.zero_point)
                     for t in (ctx.input(index) for index in range(count))]
        else:
            parts = [ctx.value(index) for index in range(count)]
        return [np.concatenate(parts, axis=axis).astype(ctx.output_dtype(0), copy=False)]

    def plan(self, ctx: ExecutionContext):
        """One concatenate with the axis read once; quant8 inputs of another scale or zero
        point than the output's go through their ``concatenation_table``, made here once
        (``execute`` makes it on every call)."""
        count = len(ctx.inputs) - 1
        output = ctx.output(0)
        if any(ctx.input(i).type != output.type for i in range(count)):
            return None
        axis = int(ctx.scalar(count))
        lookups = [None] * count
        if output.type in QUANT8_TENSORS:
            dtype = ctx.output_dtype(0)
            lookups = [None if table is None else prepared_quant8(table) for table in (
                concatenation_table(dtype, ctx.input(i).scale, ctx.input(i).zero_point, output.scale,
                                    output.zero_point) for i in range(count))]
        if not any(lookups):
            return lambda values: [np.concatenate(values[:count], axis=axis)]

        def requantizing(values: list) -> list[np.ndarray]:
            return [np.concatenate([value if lookup is None else lookup(value)
                                    for value, lookup in zip(values[:count], lookups, strict=True)], axis=axis)]

        return requantizing

    def plan_dynamic(self, ctx: ExecutionContext):
        """Inputs whose shapes are known only at run time (pieces of a loop body's buffer
        sliced at its index), with a constant axis and ``plan``'s types: their shapes
        checked as ``prepare`` checks them, then one concatenate."""
        count = len(ctx.inputs) - 1
        joined, axis, fail = self.plan(ctx), int(ctx.scalar(count)), ctx.fail
        if joined is None:
            return None

        def run(values: list) -> list[np.ndarray]:
            joined_shape([value.shape for value in values[:count]], axis, fail)
            return joined(values)

        return run


def joined_shape(shapes: list[tuple[int, ...]], axis: int, fail: Callable[[str], None]) -> tuple[int, ...]:
    """The shape of inputs of ``shapes`` joined along ``axis``; ``fail`` is called with what
    is wrong when the axis is out of range or the inputs disagree off the axis."""
    first = shapes[0]
    rank = len(first)
    if not 0 <= axis < rank:
        fail(f"axis {axis} is out of range for rank {rank}")
    total = 0
    # the messages are formatted only on failure (a loop body joins at every iteration)
    for index, shape in enumerate(shapes):
        if len(shape) != rank or any(a != b for d, (a, b) in enumerate(zip(shape, first, strict=True)) if d != axis):
            fail(f"input {index} of shape {list(shape)} does not match input 0 {list(first)} off axis {axis}")
        total += shape[axis]
    return first[:axis] + (total,) + first[axis + 1:]
