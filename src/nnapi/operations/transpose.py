"""TRANSPOSE: permutes a tensor's dimensions (output dimension i is input dimension perm[i]).

The permutation is an optional 1-D TENSOR_INT32; omitted, it reverses the dimensions
(a matrix transpose for 2-D inputs). Zero-sized inputs are allowed.
"""

from __future__ import annotations

import math

import numpy as np

from nnapi.codes import OperationCode
from nnapi.operand import dtype_of
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
        """The permutation resolved once. One that amounts to swapping the last two of at
        most three merged dimensions (NHWC <-> NCHW: [HW, C] <-> [C, HW] per image) on a
        large tensor copies in tiles of ~32 KiB, which stay in cache while numpy's
        copy walks one side with a long stride (about 2x faster at 56x56x64)."""
        perm = _permutation(ctx)
        shape = ctx.input(INPUT).shape
        merged_shape, merged_perm = _merged(shape, perm)
        if math.prod(shape) < _TILED_MIN_ELEMENTS or merged_perm not in ((1, 0), (0, 2, 1)):
            return lambda values: [np.ascontiguousarray(np.transpose(values[INPUT], perm))]
        batches, rows, columns = (1, *merged_shape) if len(merged_shape) == 2 else merged_shape
        out_shape = tuple(shape[p] for p in perm)
        along_rows = rows >= columns  # tile the longer side
        step = max(1, _TILE_BYTES // (min(rows, columns) * dtype_of(ctx.input(INPUT).type).itemsize))

        def tiled(values: list) -> list[np.ndarray]:
            source = values[INPUT].reshape(batches, rows, columns)
            out = np.empty((batches, columns, rows), source.dtype)
            for start in range(0, rows if along_rows else columns, step):
                stop = start + step
                if along_rows:
                    out[:, :, start:stop] = source[:, start:stop].transpose(0, 2, 1)
                else:
                    out[:, start:stop] = source[:, :, start:stop].transpose(0, 2, 1)
            return [out.reshape(out_shape)]
        return tiled


#: tensors from this many elements take the tiled copy
_TILED_MIN_ELEMENTS = 1 << 15
#: bytes per tile (of the source; the output's tile is as large)
_TILE_BYTES = 32768


def _merged(shape: tuple[int, ...], perm: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The same permutation on fewer dimensions: size-1 dimensions dropped, and input
    dimensions that stay adjacent (in order) in the output merged into one."""
    kept = [axis for axis in perm if shape[axis] != 1]
    groups: list[list[int]] = []
    for axis in kept:
        if groups and groups[-1][-1] + 1 == axis:
            groups[-1].append(axis)
        else:
            groups.append([axis])
    order = sorted(range(len(groups)), key=lambda g: groups[g][0])  # the groups in input order
    sizes = [math.prod(shape[a] for a in groups[g]) for g in order]
    position = {g: i for i, g in enumerate(order)}
    return tuple(sizes), tuple(position[g] for g in range(len(groups)))
