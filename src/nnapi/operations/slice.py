"""SLICE and STRIDED_SLICE: extract a (strided) sub-tensor.

SLICE takes 1-D TENSOR_INT32 begin and size tensors (size -1 means "to the end").
STRIDED_SLICE takes begin, end and non-zero strides plus three INT32 bit masks: a set
bit i of begin_mask / end_mask uses the fullest range in dimension i, and of
shrink_axis_mask drops dimension i, whose slice must then hold exactly one element.
Out-of-range begin / end values are clamped as Android (and TFLite) clamp them.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from nnapi.codes import OperandCode, OperationCode
from nnapi.operations._shape_common import (
    DATA_TYPES,
    DATA_TYPES_INT,
    check_known_rank_at_least,
    check_output_like_input,
    check_vector_input,
    int_values,
    vector_values,
)
from nnapi.operations.base import ExecutionContext, Operation, Shape, ValidationContext, register

T = OperandCode

# Named input positions (Android's slice.cpp and strided_slice.cpp kInputTensor, kBeginTensor, ...).
INPUT = 0
BEGIN = 1
SLICE_SIZE = 2
STRIDED_END = 2
STRIDED_STRIDES = 3
STRIDED_BEGIN_MASK = 4
STRIDED_END_MASK = 5
STRIDED_SHRINK_AXIS_MASK = 6

_MAX_RANK = 4


def _check_vector_lengths(ctx: ValidationContext, indexes: range, what: str) -> None:
    rank = ctx.inputs[INPUT].rank
    for index in indexes:
        dims = ctx.inputs[index].dimensions
        if rank and len(dims) == 1 and dims[0] and dims[0] != rank:
            ctx.fail(f"input {index} ({what}) must have {rank} elements, got {dims[0]}")


@register(OperationCode.SLICE, zero_sized_inputs=True)
class Slice(Operation):
    def validate(self, ctx: ValidationContext) -> None:
        ctx.check_counts(inputs=3, outputs=1)
        ctx.check_input_type(INPUT, DATA_TYPES_INT)
        check_known_rank_at_least(ctx, INPUT, 1)
        check_vector_input(ctx, BEGIN, "begin")
        check_vector_input(ctx, SLICE_SIZE, "size")
        _check_vector_lengths(ctx, range(BEGIN, SLICE_SIZE + 1), "begin / size")
        check_output_like_input(ctx)

    def _bounds(self, ctx: ExecutionContext) -> tuple[list[int], list[int]]:
        return slice_bounds(ctx.input(INPUT).shape, ctx.value(BEGIN), ctx.value(SLICE_SIZE), ctx.fail)

    def prepare(self, ctx: ExecutionContext) -> list[Shape]:
        _, size = self._bounds(ctx)
        return [tuple(size)]

    def execute(self, ctx: ExecutionContext) -> list[np.ndarray]:
        begin, size = self._bounds(ctx)
        window = tuple([slice(b, b + s) for b, s in zip(begin, size, strict=True)])
        return [np.ascontiguousarray(ctx.value(INPUT)[window])]

    def plan(self, ctx: ExecutionContext):
        """The window found once (static shape, constant begin and size)."""
        begin, size = self._bounds(ctx)
        window = tuple([slice(b, b + s) for b, s in zip(begin, size, strict=True)])
        return lambda values: [np.ascontiguousarray(values[INPUT][window])]

    def plan_dynamic(self, ctx: ExecutionContext):
        """Begin or size computed at run time (a loop body's slice at its index): the
        window found per call from the bare values, with ``prepare``'s checks."""
        fail = ctx.fail

        def run(values: list) -> list[np.ndarray]:
            data = values[INPUT]
            begin, size = slice_bounds(data.shape, values[BEGIN], values[SLICE_SIZE], fail)
            return [np.ascontiguousarray(data[tuple([slice(b, b + s) for b, s in zip(begin, size, strict=True)])])]

        return run


def slice_bounds(shape: tuple[int, ...], begin_value, size_value, fail: Callable[[str], None]
                 ) -> tuple[list[int], list[int]]:
    """SLICE's begin and size (-1 resolved), checked against the input's ``shape`` (``fail``
    called with what is wrong); in Python ints: a loop body slicing at its index runs this
    at every iteration, where numpy's calls on a few values cost ten times more."""
    rank = len(shape)
    if rank < 1:
        fail("input 0 must have rank at least 1")
    begin = vector_values(begin_value, BEGIN, "begin", rank, fail).tolist()
    size = vector_values(size_value, SLICE_SIZE, "size", rank, fail).tolist()
    size = [dim - b if s == -1 else s for b, s, dim in zip(begin, size, shape, strict=True)]
    # the messages are formatted only on failure
    if not all(0 <= b <= dim for b, dim in zip(begin, shape, strict=True)):
        fail(f"begin {begin} is out of range")
    if not all(s >= 0 and b + s <= dim for b, s, dim in zip(begin, size, shape, strict=True)):
        fail(f"slice begin {begin} size {size} exceeds shape {list(shape)}")
    return begin, size


def _clamp(index: int, dim: int, positive: bool) -> int:
    """Where a begin/end index lands, as Android's ClampedIndex puts it."""
    if positive:
        if index >= dim:
            return dim
        return max(index + dim, 0) if index < 0 else index
    if index < -dim:
        return -1
    index = min(index, dim - 1)
    return index + dim if index < 0 else index


@register(OperationCode.STRIDED_SLICE)
class StridedSlice(Operation):
    def validate(self, ctx: ValidationContext) -> None:
        ctx.check_counts(inputs=7, outputs=1)
        ctx.check_input_type(INPUT, DATA_TYPES)
        ctx.check_input_max_rank(INPUT, _MAX_RANK)
        for index, what in ((1, "begin"), (2, "end"), (3, "strides")):
            check_vector_input(ctx, index, what)
        _check_vector_lengths(ctx, range(BEGIN, STRIDED_STRIDES + 1), "begin / end / strides")
        ctx.check_input_types([T.INT32] * 3, start=STRIDED_BEGIN_MASK)
        check_output_like_input(ctx)

    def _plan(self, ctx: ExecutionContext) -> tuple[tuple[slice, ...], tuple[int, ...]]:
        """The per-dimension slices and the output shape."""
        shape = ctx.input(INPUT).shape
        rank = len(shape)
        begin = int_values(ctx, BEGIN, "begin", length=rank).tolist()
        end = int_values(ctx, STRIDED_END, "end", length=rank).tolist()
        strides = int_values(ctx, STRIDED_STRIDES, "strides", length=rank).tolist()
        begin_mask, end_mask, shrink_mask = (int(ctx.scalar(i)) for i in (
            STRIDED_BEGIN_MASK, STRIDED_END_MASK, STRIDED_SHRINK_AXIS_MASK))
        slices, out_shape = [], []
        for axis, dim in enumerate(shape):
            stride = strides[axis]
            ctx.require(stride != 0, f"stride {axis} is zero")
            positive = stride > 0
            if dim == 0:
                start = stop = 0
            else:
                start = (0 if positive else dim - 1) if begin_mask >> axis & 1 else _clamp(begin[axis], dim, positive)
                stop = (dim if positive else -1) if end_mask >> axis & 1 else _clamp(end[axis], dim, positive)
            length = max(0, -(-(stop - start) // stride))
            # A stop of -1 (before index 0 going backwards) has no slice spelling but None;
            # nor has a start of -1 there (a begin below -dim: nothing selected), which
            # Python would read as the last index.
            slices.append(slice(start, stop if stop >= 0 else None, stride) if length else slice(0, 0, stride))
            if shrink_mask >> axis & 1:
                ctx.require(positive, f"shrunk dimension {axis} needs a positive stride")
                ctx.require(length == 1, f"shrunk dimension {axis} must select one element, selects {length}")
            else:
                out_shape.append(length)
        return tuple(slices), tuple(out_shape) or (1,)

    def prepare(self, ctx: ExecutionContext) -> list[Shape]:
        return [self._plan(ctx)[1]]

    def execute(self, ctx: ExecutionContext) -> list[np.ndarray]:
        slices, shape = self._plan(ctx)
        return [np.ascontiguousarray(ctx.value(INPUT)[slices]).reshape(shape)]

    def plan(self, ctx: ExecutionContext):
        """The slices and the output shape found once (static shape, constant arguments)."""
        slices, shape = self._plan(ctx)
        return lambda values: [np.ascontiguousarray(values[INPUT][slices]).reshape(shape)]
