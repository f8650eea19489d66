"""RESHAPE, SQUEEZE, EXPAND_DIMS: operations that change a tensor's shape, not its data.

RESHAPE takes the new shape as a 1-D TENSOR_INT32 (one entry may be -1, inferred from
the element count); SQUEEZE drops size-1 dimensions (all of them, or those listed by
its optional axes tensor); EXPAND_DIMS inserts a size-1 dimension at an axis in
[-(n+1), n+1). Quantized outputs keep the input's scale and zero point.
"""

from __future__ import annotations

import math

import numpy as np

from nnapi.codes import OperandCode, OperationCode
from nnapi.operations._shape_common import (
    DATA_TYPES,
    DATA_TYPES_INT,
    check_known_rank_at_least,
    check_output_like_input,
    check_vector_input,
    int_values,
)
from nnapi.operations.base import ExecutionContext, Operation, Shape, ValidationContext, register
from nnapi.operations.common import normalize_axis

T = OperandCode

# Named input positions (Android's reshape.cpp kInputTensor, kTargetShape, ...).
INPUT = 0
RESHAPE_SHAPE = 1
SQUEEZE_AXES = 1
EXPAND_DIMS_AXIS = 1

_MAX_RANK = 4


# Beyond Android's CPU kernels, which refuse a zero-sized input here: the result is well defined
# and tests/test_ops_shape.py::TestZeroSized relies on it.
@register(OperationCode.RESHAPE, zero_sized_inputs=True)
class Reshape(Operation):
    def validate(self, ctx: ValidationContext) -> None:
        ctx.check_counts(inputs=2, outputs=1)
        ctx.check_input_type(INPUT, DATA_TYPES)
        ctx.check_input_max_rank(INPUT, _MAX_RANK)
        check_vector_input(ctx, RESHAPE_SHAPE, "shape")
        check_output_like_input(ctx)

    def prepare(self, ctx: ExecutionContext) -> list[Shape]:
        target = int_values(ctx, RESHAPE_SHAPE, "shape")
        count = math.prod(ctx.input(INPUT).shape)
        stretch = np.flatnonzero(target == -1)
        ctx.require(stretch.size <= 1, "at most one dimension of the new shape may be -1")
        known = np.delete(target, stretch)
        ctx.require(bool(np.all(known >= 0)), f"invalid new shape {target.tolist()}")
        known_count = int(np.prod(known))
        shape = target.copy()
        if stretch.size:
            # An inferred dimension next to a zero-sized one is only defined when the
            # input is empty too; then it is 0 as well.
            if known_count == 0:
                ctx.require(count == 0, f"cannot infer -1 in {target.tolist()} for {count} elements")
                shape[stretch[0]] = 0
            else:
                shape[stretch[0]] = count // known_count
        ctx.require(int(np.prod(shape)) == count,
                    f"shape {target.tolist()} does not hold {count} elements")
        return [tuple(int(d) for d in shape)]

    def execute(self, ctx: ExecutionContext) -> list[np.ndarray]:
        return [ctx.value(INPUT).reshape(self.prepare(ctx)[0])]

    def plan(self, ctx: ExecutionContext):
        shape = self.prepare(ctx)[0]  # static: a view with the shape found at preparation
        return lambda values: [values[0].reshape(shape)]


@register(OperationCode.SQUEEZE, omitted_operands=True)
class Squeeze(Operation):
    def validate(self, ctx: ValidationContext) -> None:
        ctx.check_counts(inputs=2, outputs=1)
        ctx.check_input_type(INPUT, DATA_TYPES)
        ctx.check_input_max_rank(INPUT, _MAX_RANK)
        check_vector_input(ctx, SQUEEZE_AXES, "squeeze dimensions")
        check_output_like_input(ctx)

    def prepare(self, ctx: ExecutionContext) -> list[Shape]:
        shape = ctx.input(INPUT).shape
        rank = len(shape)
        if ctx.is_omitted(SQUEEZE_AXES):
            squeezed = {axis for axis, size in enumerate(shape) if size == 1}
        else:
            squeezed = set()
            for axis in int_values(ctx, SQUEEZE_AXES, "squeeze dimensions").tolist():
                normalized = normalize_axis(axis, rank)
                ctx.require(normalized is not None, f"axis {axis} is out of range for rank {rank}")
                ctx.require(shape[normalized] == 1,
                            f"cannot squeeze dimension {axis} of size {shape[normalized]}")
                squeezed.add(normalized)
        kept = tuple(size for axis, size in enumerate(shape) if axis not in squeezed)
        return [kept or (1,)]

    def execute(self, ctx: ExecutionContext) -> list[np.ndarray]:
        return [ctx.value(INPUT).reshape(self.prepare(ctx)[0])]

    def plan(self, ctx: ExecutionContext):
        shape = self.prepare(ctx)[0]  # static: a view with the shape found at preparation
        return lambda values: [values[0].reshape(shape)]


@register(OperationCode.EXPAND_DIMS)
class ExpandDims(Operation):
    def validate(self, ctx: ValidationContext) -> None:
        ctx.check_counts(inputs=2, outputs=1)
        ctx.check_input_types([DATA_TYPES_INT, T.INT32])
        check_known_rank_at_least(ctx, INPUT, 1)
        check_output_like_input(ctx)

    def prepare(self, ctx: ExecutionContext) -> list[Shape]:
        shape = ctx.input(INPUT).shape
        axis = int(ctx.scalar(EXPAND_DIMS_AXIS))
        normalized = normalize_axis(axis, len(shape) + 1)
        ctx.require(normalized is not None, f"axis {axis} is out of range for rank {len(shape)}")
        return [shape[:normalized] + (1,) + shape[normalized:]]

    def execute(self, ctx: ExecutionContext) -> list[np.ndarray]:
        return [ctx.value(INPUT).reshape(self.prepare(ctx)[0])]

    def plan(self, ctx: ExecutionContext):
        shape = self.prepare(ctx)[0]  # static: a view with the shape found at preparation
        return lambda values: [values[0].reshape(shape)]
