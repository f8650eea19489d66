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


@register(OperationCode.TOPK_V2)
class TopKV2(Operation):
    def validate(self, ctx: ValidationContext) -> None:
        ctx.check_counts(inputs=2, outputs=2)
        ctx.check_input_types([DATA_TYPES_INT, T.INT32])
        check_known_rank_at_least(ctx, 0, 1)
        check_output_like_input(ctx, 0)
        ctx.check_output_type(1, T.TENSOR_INT32)

    def prepare(self, ctx: ExecutionContext) -> list[Shape]:
        shape = ctx.input(0).shape
        ctx.require(len(shape) >= 1, "input 0 must have rank at least 1")
        k = int(ctx.scalar(1))
        ctx.require(1 <= k <= shape[-1], f"k = {k} is out of range [1, {shape[-1]}]")
        out = shape[:-1] + (k,)
        return [out, out]

    def execute(self, ctx: ExecutionContext) -> list[np.ndarray]:
        x = ctx.value(0)
        k = int(ctx.scalar(1))
        positions = np.broadcast_to(np.arange(x.shape[-1]), x.shape)
        # Ascending by (value, index), then read backwards: descending values, and the
        # larger index first among equal values.
        order = np.lexsort((positions, x), axis=-1)[..., ::-1][..., :k]
        values = np.take_along_axis(x, order, axis=-1)
        return [np.ascontiguousarray(values), np.ascontiguousarray(order.astype(np.int32))]
