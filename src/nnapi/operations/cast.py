"""CAST: convert a tensor's elements to another type, ignoring scale and zero point.

Supported pairs (the specification's list):
- any of TENSOR_FLOAT16, TENSOR_FLOAT32, TENSOR_INT32, TENSOR_QUANT8_ASYMM to any of
  them (feature level 3), identity casts included;
- identity casts of TENSOR_BOOL8, TENSOR_INT32, TENSOR_QUANT16_ASYMM, TENSOR_QUANT16_SYMM,
  TENSOR_QUANT8_ASYMM_SIGNED and TENSOR_QUANT8_SYMM (feature level 4): a plain copy.

Quantized tensors are treated as their stored integers (a QUANT8_ASYMM input is a uint8
tensor). Conversions follow C's static_cast as Android's kernel applies it: floats to
integers truncate toward zero; values outside QUANT8_ASYMM's 0..255 saturate first. Where
C leaves the result undefined (NaN, or a float beyond the int32 range) this saturates to
the range and sends NaN to 0. Zero-sized inputs are not supported (as on Android).
"""

from __future__ import annotations

import numpy as np

from nnapi.codes import OperandCode, OperationCode
from nnapi.operations.base import ExecutionContext, Operation, Shape, ValidationContext, register
from nnapi.operations.common import integer_range
from nnapi.operations.elementwise import check_same_shape_output

T = OperandCode

# Named input positions (Android's cast.cpp kInputTensor).
INPUT = 0


#: types that convert into one another
_CONVERTIBLE = (T.TENSOR_FLOAT16, T.TENSOR_FLOAT32, T.TENSOR_INT32, T.TENSOR_QUANT8_ASYMM)
#: types that may only be cast to themselves
_IDENTITY_ONLY = (T.TENSOR_BOOL8, T.TENSOR_INT32, T.TENSOR_QUANT16_ASYMM, T.TENSOR_QUANT16_SYMM,
                  T.TENSOR_QUANT8_ASYMM_SIGNED, T.TENSOR_QUANT8_SYMM)


def _convert(values: np.ndarray, target: np.dtype) -> np.ndarray:
    if values.dtype == target:
        # A copy, so that the output never aliases the (read-only) input buffer.
        return values.copy()
    if target.kind == "f":
        # Float to float rounds to nearest; int to float is exact or rounds to nearest;
        # beyond float16's range the result is inf, as in C.
        with np.errstate(over="ignore"):
            return values.astype(target)
    low, high = integer_range(target)
    if values.dtype.kind == "f":
        if values.size and low <= float(values.min()) and float(values.max()) <= high:
            # All finite and in range (NaN fails the test): a plain truncating cast.
            return values.astype(target)
        # In float64 so that int32's bounds are exact; NaN goes to 0.
        wide = np.nan_to_num(values.astype(np.float64), nan=0.0, posinf=high, neginf=low)
        return np.trunc(np.clip(wide, low, high)).astype(target)
    return np.clip(values, low, high).astype(target)


@register(OperationCode.CAST)
class Cast(Operation):
    def validate(self, ctx: ValidationContext) -> None:
        ctx.check_counts(inputs=1, outputs=1)
        source = ctx.input_type(INPUT)
        ctx.check_input_type(INPUT, _CONVERTIBLE + _IDENTITY_ONLY)
        if source in _CONVERTIBLE:
            ctx.check_output_type(0, _CONVERTIBLE)
        else:
            ctx.check_output_type(0, source)
        check_same_shape_output(ctx)

    def prepare(self, ctx: ExecutionContext) -> list[Shape]:
        return [ctx.input(INPUT).shape]

    def execute(self, ctx: ExecutionContext) -> list[np.ndarray]:
        return [_convert(ctx.value(INPUT), ctx.output_dtype(0))]

    def plan(self, ctx: ExecutionContext):
        """The target dtype resolved once."""
        dtype = ctx.output_dtype(0)
        return lambda values: [_convert(values[INPUT], dtype)]
