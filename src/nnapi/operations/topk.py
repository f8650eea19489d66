"""TOPK_V2: the k largest entries of each last-dimension row, with their indices.

Inputs: 0 the tensor (rank >= 1), 1 the INT32 k in [1, last dimension]. Outputs: 0 the
values, descending, of the input's type and quantization; 1 their TENSOR_INT32 indices.
Equal values list the larger index first (the spec's tie rule).
"""

from __future__ import annotations

import numpy as np

from nnapi.codes import OperandCode, OperationCode
from nnapi.operations._shape_common import DATA_TYPES_INT, check_known_rank_at_least, check_output_like_input
from nnapi.operations.base import ExecutionContext, Operation, Shape, ValidationContext, register

T = OperandCode

# Named input positions (Android's topk_v2.cpp kInputTensor, kTopKTensor).
INPUT = 0
K = 1



@register(OperationCode.TOPK_V2)
class TopKV2(Operation):
    def validate(self, ctx: ValidationContext) -> None:
        ctx.check_counts(inputs=2, outputs=2)
        ctx.check_input_types([DATA_TYPES_INT, T.INT32])
        check_known_rank_at_least(ctx, INPUT, 1)
        check_output_like_input(ctx, 0)
        ctx.check_output_type(1, T.TENSOR_INT32)

    def prepare(self, ctx: ExecutionContext) -> list[Shape]:
        shape = ctx.input(INPUT).shape
        ctx.require(len(shape) >= 1, "input 0 must have rank at least 1")
        k = int(ctx.scalar(K))
        ctx.require(1 <= k <= shape[-1], f"k = {k} is out of range [1, {shape[-1]}]")
        out = shape[:-1] + (k,)
        return [out, out]

    def execute(self, ctx: ExecutionContext) -> list[np.ndarray]:
        x = ctx.value(INPUT)
        k = int(ctx.scalar(K))
        rows = x.reshape(-1, x.shape[-1])
        order = _top_k_positions(rows, k).reshape(x.shape[:-1] + (k,))
        values = np.take_along_axis(x, order, axis=-1)
        return [np.ascontiguousarray(values), order.astype(np.int32)]


def _top_k_positions(rows: np.ndarray, k: int) -> np.ndarray:
    """Per row of the 2-D ``rows``, the positions of the k largest values: descending,
    and the larger position first among equal values.

    A partition finds each row's k-th largest value (linear time); everything above it
    is in, and of the values equal to it the right-most ones fill the remaining places.
    Only the k chosen entries are then sorted, instead of whole rows.
    """
    count, width = rows.shape
    if count == 0:
        return np.zeros((0, k), dtype=np.int64)
    threshold = np.partition(rows, width - k, axis=-1)[:, width - k, None]
    above = rows > threshold
    equal = rows == threshold
    needed = k - above.sum(axis=-1, keepdims=True)
    # how many threshold-valued entries sit at or right of each position
    from_right = np.cumsum(equal[:, ::-1], axis=-1)[:, ::-1]
    chosen = above | (equal & (from_right <= needed))
    flat = np.flatnonzero(chosen)
    if flat.size != count * k:
        # The threshold itself was NaN (it compares neither above nor equal): rank the
        # whole rows instead, where NaN sorts last and so counts as the largest.
        everywhere = np.broadcast_to(np.arange(width), rows.shape)
        return np.lexsort((everywhere, rows), axis=-1)[:, ::-1][:, :k]
    # exactly k per row, so the row-major positions reshape into [count, k]
    positions = (flat % width).reshape(count, k)
    picked = np.take_along_axis(rows, positions, axis=-1)
    # ascending by (value, position), then read backwards
    ranking = np.lexsort((positions, picked), axis=-1)[:, ::-1]
    return np.take_along_axis(positions, ranking, axis=-1)
