"""FILL and RANK (feature level 4): operations whose outputs come from values and shapes.

FILL builds a tensor whose shape is the *value* of its 1-D TENSOR_INT32 input 0, every
element set to scalar input 1 (FLOAT16 / FLOAT32 / INT32 matching the output type), so
its output shape is known only at execution. RANK returns the number of dimensions of
its input as an INT32 scalar.
"""

from __future__ import annotations

import numpy as np

from nnapi.codes import OperandCode, OperationCode
from nnapi.operations._shape_common import check_vector_input, int_values
from nnapi.operations.base import ExecutionContext, Operation, Shape, ValidationContext, register

T = OperandCode

# Named input positions (Android's fill.cpp kDimsTensor, kValueScalar; rank.cpp kInputTensor).
FILL_DIMS = 0
FILL_VALUE = 1
RANK_INPUT = 0

_FILL_VALUE_TYPES = {
    T.TENSOR_FLOAT32: T.FLOAT32,
    T.TENSOR_FLOAT16: T.FLOAT16,
    T.TENSOR_INT32: T.INT32,
}
_RANK_INPUT_TYPES = (
    T.TENSOR_FLOAT16, T.TENSOR_FLOAT32, T.TENSOR_INT32, T.TENSOR_QUANT8_ASYMM, T.TENSOR_QUANT16_SYMM,
    T.TENSOR_BOOL8, T.TENSOR_QUANT8_SYMM_PER_CHANNEL, T.TENSOR_QUANT16_ASYMM, T.TENSOR_QUANT8_SYMM,
    T.TENSOR_QUANT8_ASYMM_SIGNED,
)


@register(OperationCode.FILL)
class Fill(Operation):
    def validate(self, ctx: ValidationContext) -> None:
        ctx.check_counts(inputs=2, outputs=1)
        ctx.check_output_type(0, tuple(_FILL_VALUE_TYPES))
        check_vector_input(ctx, FILL_DIMS, "dimensions")
        ctx.check_input_type(FILL_VALUE, _FILL_VALUE_TYPES[ctx.outputs[0].type])
        dims, out_rank = ctx.inputs[FILL_DIMS].dimensions, ctx.outputs[0].rank
        if len(dims) == 1 and dims[0] and out_rank and dims[0] != out_rank:
            ctx.fail(f"output 0 must have rank {dims[0]} (the length of input 0), got {out_rank}")

    def prepare(self, ctx: ExecutionContext) -> list[Shape]:
        dims = int_values(ctx, FILL_DIMS, "dimensions")
        ctx.require(dims.size >= 1, "the output must have rank at least 1")
        ctx.require(bool(np.all(dims >= 0)), f"dimensions must be non-negative, got {dims.tolist()}")
        return [tuple(int(d) for d in dims)]

    def execute(self, ctx: ExecutionContext) -> list[np.ndarray]:
        return [np.full(self.prepare(ctx)[0], ctx.value(FILL_VALUE), dtype=ctx.output_dtype(0))]


@register(OperationCode.RANK)
class Rank(Operation):
    def validate(self, ctx: ValidationContext) -> None:
        ctx.check_counts(inputs=1, outputs=1)
        ctx.check_input_type(RANK_INPUT, _RANK_INPUT_TYPES)
        ctx.check_output_type(0, T.INT32)

    def prepare(self, ctx: ExecutionContext) -> list[Shape]:
        return [()]

    def execute(self, ctx: ExecutionContext) -> list[np.ndarray]:
        return [np.array(ctx.input(RANK_INPUT).rank, dtype=np.int32)]
