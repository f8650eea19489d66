"""TILE: repeats a tensor multiples[i] times along each dimension i.

Input 1 is a 1-D TENSOR_INT32 with one non-negative multiple per input dimension.
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

# Named input positions (Android's tile.cpp kInputTensor, kMultiplesTensor).
INPUT = 0
MULTIPLES = 1


def _multiples(ctx: ExecutionContext) -> list[int]:
    multiples = int_values(ctx, MULTIPLES, "multiples", length=ctx.input(INPUT).rank)
    ctx.require(bool(np.all(multiples >= 0)), f"multiples must be non-negative, got {multiples.tolist()}")
    return [int(m) for m in multiples]


# Beyond Android's CPU kernels, which refuse a zero-sized input here: the result is well defined
# and tests/test_ops_shape.py::TestZeroSized relies on it.
@register(OperationCode.TILE, zero_sized_inputs=True)
class Tile(Operation):
    def validate(self, ctx: ValidationContext) -> None:
        ctx.check_counts(inputs=2, outputs=1)
        ctx.check_input_type(INPUT, DATA_TYPES_INT)
        check_known_rank_at_least(ctx, INPUT, 1)
        check_vector_input(ctx, MULTIPLES, "multiples")
        rank, dims = ctx.inputs[INPUT].rank, ctx.inputs[MULTIPLES].dimensions
        if rank and len(dims) == 1 and dims[0] and dims[0] != rank:
            ctx.fail(f"input 1 (multiples) must have {rank} elements, got {dims[0]}")
        check_output_like_input(ctx)

    def prepare(self, ctx: ExecutionContext) -> list[Shape]:
        multiples = _multiples(ctx)
        return [tuple(size * m for size, m in zip(ctx.input(INPUT).shape, multiples, strict=True))]

    def execute(self, ctx: ExecutionContext) -> list[np.ndarray]:
        return [np.tile(ctx.value(INPUT), _multiples(ctx))]

    def plan(self, ctx: ExecutionContext):
        """The multiples resolved once."""
        multiples = _multiples(ctx)
        return lambda values: [np.tile(values[INPUT], multiples)]
