"""ARGMAX and ARGMIN: the index of the largest / smallest element along an axis.

Inputs: 0 a non-empty tensor of rank >= 1, 1 the INT32 axis (negative counts from the
end). The output is TENSOR_INT32 without the axis dimension ([1] for a 1-D input);
ties resolve to the first (smallest) index. Quantized inputs compare stored integers,
which order like their real values since the scale is positive. NaN as Android's scan
(ArgMinMax.cpp: the first value, then each later one taken where value > best, or < for
ARGMIN): a NaN first stays (no comparison with it holds), a later NaN is never taken.
"""

from __future__ import annotations

import math

import numpy as np

from nnapi.codes import OperandCode, OperationCode
from nnapi.operations import _jit
from nnapi.operations._shape_common import DATA_TYPES_INT, axis_value, check_known_rank_at_least
from nnapi.operations.base import ExecutionContext, Operation, Shape, ValidationContext, register

T = OperandCode

# Named input positions (Android's arg_min_max.cpp).
INPUT = 0
AXIS = 1



@register(OperationCode.ARGMAX, OperationCode.ARGMIN)
class ArgMinMax(Operation):
    def validate(self, ctx: ValidationContext) -> None:
        ctx.check_counts(inputs=2, outputs=1)
        ctx.check_input_types([DATA_TYPES_INT, T.INT32])
        check_known_rank_at_least(ctx, INPUT, 1)
        ctx.check_output_type(0, T.TENSOR_INT32)

    def prepare(self, ctx: ExecutionContext) -> list[Shape]:
        shape = ctx.input(INPUT).shape
        axis = axis_value(ctx, AXIS, len(shape))
        ctx.require(0 not in shape, f"input 0 must be non-empty, got shape {list(shape)}")
        return [shape[:axis] + shape[axis + 1:] or (1,)]

    def execute(self, ctx: ExecutionContext) -> list[np.ndarray]:
        x = ctx.value(INPUT)
        axis = axis_value(ctx, AXIS, x.ndim)
        find = _finder(self.code)
        return [find(x, axis=axis).astype(np.int32).reshape(self.prepare(ctx)[0])]

    def plan(self, ctx: ExecutionContext):
        """The axis and output shape resolved once. Along a short axis (numpy spends ~60 ns
        per row on it) of a float32 or 8-bit tensor, the compiled row scan of ``nnapi[fast]``
        on float32 values (8-bit ones convert exactly; ARGMIN scans the negated values: -v >
        -best where v < best, NaN staying NaN)."""
        tensor = ctx.input(INPUT)
        axis = axis_value(ctx, AXIS, tensor.rank)
        shape = self.prepare(ctx)[0]
        find = _finder(self.code)
        length = tensor.shape[axis]
        compiled = None
        if 1 < length <= _SHORT_AXIS and math.prod(shape) > 1 and tensor.type in _SCANNED:
            compiled = _compiled_argmax()
        if compiled is None:
            return lambda values: [find(values[INPUT], axis=axis).astype(np.int32).reshape(shape)]
        negate = self.code == OperationCode.ARGMIN

        def scan(values: list) -> list[np.ndarray]:
            x = np.moveaxis(values[INPUT], axis, -1)
            if negate:
                x = np.negative(x, dtype=np.float32)  # a new C-contiguous array
            elif x.dtype != np.float32:
                x = x.astype(np.float32)
            else:
                x = _jit.kernel_input(x)
            out = np.empty(shape, np.int32)
            compiled(x.reshape(-1, length), out.reshape(-1))
            return [out]
        return scan


def _finder(code: OperationCode):
    """np.argmax / np.argmin as Android's scan treats NaN: NumPy takes the first NaN, Android
    keeps a NaN at index 0 and never takes a later one. A later NaN becomes -inf for ARGMAX
    (+inf for ARGMIN), which is taken only where every value is -inf (+inf), index 0 first
    among them; a NaN at index 0 stays, and NumPy returns it as the first NaN."""
    find, fill = (np.argmax, -np.inf) if code == OperationCode.ARGMAX else (np.argmin, np.inf)

    def scan(x: np.ndarray, axis: int) -> np.ndarray:
        if x.dtype.kind == "f" and x.shape[axis] > 1:
            later = np.isnan(x)
            first = [slice(None)] * x.ndim
            first[axis] = 0
            later[tuple(first)] = False  # a NaN at index 0 stays
            if later.any():
                x = np.where(later, x.dtype.type(fill), x)
        return find(x, axis=axis)
    return scan


#: axes up to this long take the compiled row scan
_SHORT_AXIS = 128
#: the input types whose values float32 holds exactly
_SCANNED = (T.TENSOR_FLOAT32, T.TENSOR_QUANT8_ASYMM, T.TENSOR_QUANT8_ASYMM_SIGNED)


def _compiled_argmax():
    """The compiled row scan (``_numba_quant.argmax_rows``), or None."""
    if _jit.kernels() is None:
        return None
    from nnapi.operations._numba_quant import argmax_rows

    ready = _jit.warm_up(argmax_rows, np.zeros((0, 2), np.float32), np.zeros(0, np.int32))
    return argmax_rows if ready else None
