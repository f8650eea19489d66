"""ABS, NEG, EXP, LOG, SQRT, RSQRT, SIN, FLOOR: one-input element-wise math.

All take one tensor and produce a tensor of the same type and shape. Float16 is computed
in float32 and rounded once; ABS and NEG also take TENSOR_INT32 (feature level 4), whose
extremes wrap as two's complement (|INT32_MIN| is INT32_MIN) like the C++ kernels. FLOOR
is limited to rank 4; the others accept any rank. None of them accepts zero-sized inputs
(the specification does not allow them here), matching Android's runtime.
"""

from __future__ import annotations

import numpy as np

from nnapi.codes import OperandCode, OperationCode
from nnapi.operations.base import ExecutionContext, Operation, Shape, ValidationContext, register
from nnapi.operations.elementwise import (
    FLOAT_TENSORS,
    check_same_shape_output,
    float_input,
)

T = OperandCode

# Named input positions (Android's elementwise.cpp kInputTensor).
INPUT = 0

Op = OperationCode


def _rsqrt(x: np.ndarray) -> np.ndarray:
    return np.float32(1.0) / np.sqrt(x)


_FLOAT_FUNCTIONS = {
    Op.ABS: np.abs,
    Op.NEG: np.negative,
    Op.EXP: np.exp,
    Op.LOG: np.log,
    Op.SQRT: np.sqrt,
    Op.RSQRT: _rsqrt,
    Op.SIN: np.sin,
    Op.FLOOR: np.floor,
}
_INT_FUNCTIONS = {Op.ABS: np.abs, Op.NEG: np.negative}
_TYPES = {code: FLOAT_TENSORS + ((T.TENSOR_INT32,) if code in _INT_FUNCTIONS else ()) for code in _FLOAT_FUNCTIONS}
_MAX_RANK = {Op.FLOOR: 4}


@register(*_FLOAT_FUNCTIONS)
class UnaryMath(Operation):
    def validate(self, ctx: ValidationContext) -> None:
        ctx.check_counts(inputs=1, outputs=1)
        ctx.check_input_type(INPUT, _TYPES[self.code])
        ctx.check_output_type(0, ctx.input_type(INPUT))
        if self.code in _MAX_RANK:
            ctx.check_input_max_rank(INPUT, _MAX_RANK[self.code])
        check_same_shape_output(ctx)

    def prepare(self, ctx: ExecutionContext) -> list[Shape]:
        shape = ctx.input(INPUT).shape
        if self.code in _MAX_RANK:
            ctx.require(len(shape) <= _MAX_RANK[self.code], f"input 0 must have rank at most "
                        f"{_MAX_RANK[self.code]}, got {len(shape)}")
        return [shape]

    def execute(self, ctx: ExecutionContext) -> list[np.ndarray]:
        tensor = ctx.input(INPUT)
        if tensor.type == T.TENSOR_INT32:
            # numpy wraps like two's complement C++ here; silence its overflow warning.
            with np.errstate(over="ignore"):
                return [_INT_FUNCTIONS[self.code](tensor.value).astype(np.int32, copy=False)]
        # log(-1), sqrt(-1), exp(1000) give NaN / inf as the C library does; not an error.
        with np.errstate(all="ignore"):
            result = _FLOAT_FUNCTIONS[self.code](float_input(tensor))
        return [result.astype(ctx.output_dtype(0), copy=False)]

    def plan(self, ctx: ExecutionContext):
        """Float32 and int32: the function itself (the driver runs kernels with numpy's
        floating-point warnings off, and int32 wraps as in ``execute``)."""
        code = ctx.input(INPUT).type
        if code == T.TENSOR_INT32:
            function = _INT_FUNCTIONS[self.code]
            return lambda values: [function(values[INPUT])]
        if code != T.TENSOR_FLOAT32:
            return None
        function = _FLOAT_FUNCTIONS[self.code]
        return lambda values: [function(values[INPUT])]
