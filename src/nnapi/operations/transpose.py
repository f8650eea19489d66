"""TRANSPOSE: permutes a tensor's dimensions (output dimension i is input dimension perm[i]).

The permutation is an optional 1-D TENSOR_INT32; omitted, it reverses the dimensions
(a matrix transpose for 2-D inputs). Zero-sized inputs are allowed.
"""

from __future__ import annotations

import numpy as np

from nnapi.codes import OperationCode
from nnapi.operations._shape_common import DATA_TYPES, check_output_like_input, check_vector_input, int_values
from nnapi.operations.base import ExecutionContext, Operation, Shape, ValidationContext, register

# Named input positions (Android's transpose.cpp kInputTensor, kPermTensor).
INPUT = 0
PERMUTATION = 1

_MAX_RANK = 4


def _permutation(ctx: ExecutionContext) -> tuple[int, ...]:
    rank = ctx.input(INPUT).rank
    if ctx.is_omitted(PERMUTATION):
        return tuple(range(rank - 1, -1, -1))
    perm = int_values(ctx, PERMUTATION, "permutation", length=rank)
    ctx.require(sorted(perm.tolist()) == list(range(rank)),
                f"{perm.tolist()} is not a permutation of {rank} dimensions")
    return tuple(int(p) for p in perm)


@register(OperationCode.TRANSPOSE, zero_sized_inputs=True, omitted_operands=True)
class Transpose(Operation):
    def validate(self, ctx: ValidationContext) -> None:
        ctx.check_counts(inputs=2, outputs=1)
        ctx.check_input_type(INPUT, DATA_TYPES)
        ctx.check_input_max_rank(INPUT, _MAX_RANK)
        check_vector_input(ctx, PERMUTATION, "permutation")
        perm_dims = ctx.inputs[PERMUTATION].dimensions
        rank = ctx.inputs[INPUT].rank
        if rank and perm_dims and perm_dims[0] and perm_dims[0] != rank:
            ctx.fail(f"input 1 (permutation) must have {rank} elements, got {perm_dims[0]}")
        check_output_like_input(ctx)

    def prepare(self, ctx: ExecutionContext) -> list[Shape]:
        shape = ctx.input(INPUT).shape
        return [tuple(shape[p] for p in _permutation(ctx))]

    def execute(self, ctx: ExecutionContext) -> list[np.ndarray]:
        # A contiguous copy: the driver writes outputs out as flat row-major bytes.
        return [np.ascontiguousarray(np.transpose(ctx.value(INPUT), _permutation(ctx)))]

    def plan(self, ctx: ExecutionContext):
        """The permutation resolved once."""
        perm = _permutation(ctx)
        return lambda values: [np.ascontiguousarray(np.transpose(values[INPUT], perm))]
