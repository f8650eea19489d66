"""POW, MAXIMUM, MINIMUM: broadcasting two-input element-wise math without a fused
activation.

POW takes float tensors only (base ** exponent, computed in float32; a negative base with
a non-integer exponent gives NaN, as C's pow does). Float MAXIMUM and MINIMUM are
Android's std::max / std::min (MAXIMUM(a, b) is b where a < b, else a: a NaN second input
gives the first, a NaN first input NaN, of -0 and +0 the first). They also take
TENSOR_INT32 and quantized tensors; quantized inputs may each have their own scale and
zero point, and the output its own: the larger / smaller real value is quantized into the
output (the same as requantizing both first, since requantizing is monotonic).

``plan`` prepares the quantized cases once: where both inputs share the output's scale
and zero point, requantizing is the identity and the result is the larger / smaller
stored value; otherwise the table of every pair of stored values is built at preparation.
"""

from __future__ import annotations

import numpy as np

from nnapi.codes import OperandCode, OperationCode
from nnapi.operand import dtype_of
from nnapi.operations.base import ExecutionContext, Operation, Shape, ValidationContext, register
from nnapi.operations.common import quantize
from nnapi.operations.elementwise import (
    FLOAT_TENSORS,
    QUANT8_TENSORS,
    all_stored_values,
    broadcast_output_shape,
    check_broadcast,
    float_input,
    map_quant8_pair,
    prepared_quant8_pair,
)
from nnapi.operations.quant_math import dequantize

T = OperandCode

# Named input positions (Android's pow.cpp / maximum_minimum.cpp kInputTensor1, kInputTensor2).
INPUT1 = 0
INPUT2 = 1

Op = OperationCode

_TYPES = {
    Op.POW: FLOAT_TENSORS,
    Op.MAXIMUM: FLOAT_TENSORS + (T.TENSOR_INT32,) + QUANT8_TENSORS,
    Op.MINIMUM: FLOAT_TENSORS + (T.TENSOR_INT32,) + QUANT8_TENSORS,
}
_FUNCTIONS = {Op.POW: np.power, Op.MAXIMUM: np.maximum, Op.MINIMUM: np.minimum}


def _android_maximum(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """std::max(a, b) as Android's kernel computes it: b where a < b, else a (a NaN ``b``
    gives ``a``, a NaN ``a`` NaN, MAXIMUM(-0, +0) -0), where np.maximum gives NaN for
    either NaN."""
    return np.where(a < b, b, a)


def _android_minimum(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """std::min(a, b) as Android's kernel computes it: b where b < a, else a."""
    return np.where(b < a, b, a)


#: the float functions (integers and real values of quantized ones have no NaN or -0, and
#: the NumPy functions are faster there)
_FLOAT_FUNCTIONS = {Op.POW: np.power, Op.MAXIMUM: _android_maximum, Op.MINIMUM: _android_minimum}


@register(Op.POW, Op.MAXIMUM, Op.MINIMUM)
class BinaryMath(Operation):
    def validate(self, ctx: ValidationContext) -> None:
        ctx.check_counts(inputs=2, outputs=1)
        ctx.check_input_type(INPUT1, _TYPES[self.code])
        ctx.check_input_type(INPUT2, ctx.input_type(INPUT1))
        ctx.check_output_type(0, ctx.input_type(INPUT1))
        check_broadcast(ctx)

    def prepare(self, ctx: ExecutionContext) -> list[Shape]:
        return [broadcast_output_shape(ctx)]

    def execute(self, ctx: ExecutionContext) -> list[np.ndarray]:
        a, b = ctx.input(INPUT1), ctx.input(INPUT2)
        function = _FUNCTIONS[self.code]
        if a.type == T.TENSOR_INT32:
            return [function(a.value, b.value).astype(np.int32, copy=False)]
        if a.type in QUANT8_TENSORS:
            return [map_quant8_pair(a.value, b.value, self._on_stored(ctx))]
        with np.errstate(all="ignore"):
            result = _FLOAT_FUNCTIONS[self.code](float_input(a), float_input(b))
        return [result.astype(ctx.output_dtype(0), copy=False)]

    def _on_stored(self, ctx: ExecutionContext):
        """The quantized function on stored values: real values compared, the result
        quantized into the output."""
        a, b, output = ctx.input(INPUT1), ctx.input(INPUT2), ctx.output(0)
        function = _FUNCTIONS[self.code]

        def on_stored(stored_a: np.ndarray, stored_b: np.ndarray) -> np.ndarray:
            real = function(dequantize(stored_a, a.scale, a.zero_point), dequantize(stored_b, b.scale, b.zero_point))
            return quantize(real, output)

        return on_stored

    def plan(self, ctx: ExecutionContext):
        a, b = ctx.input(INPUT1), ctx.input(INPUT2)
        function = _FUNCTIONS[self.code]
        if a.type == T.TENSOR_INT32:
            return lambda values: [function(values[INPUT1], values[INPUT2]).astype(np.int32, copy=False)]
        if a.type in QUANT8_TENSORS:
            if self._requantizing_is_identity(ctx):
                return lambda values: [function(values[INPUT1], values[INPUT2])]
            return prepared_quant8_pair(self._on_stored(ctx), dtype_of(a.type), dtype_of(b.type), a.shape,
                                        b.shape)
        if a.type != T.TENSOR_FLOAT32:
            return None
        function = _FLOAT_FUNCTIONS[self.code]
        return lambda values: [function(values[INPUT1], values[INPUT2])]  # under the driver's np.errstate

    def _requantizing_is_identity(self, ctx: ExecutionContext) -> bool:
        """MAXIMUM / MINIMUM whose inputs share the output's quantization, where quantizing
        each stored value's real value gives that value back (checked on all 256)."""
        a, b, output = ctx.input(INPUT1), ctx.input(INPUT2), ctx.output(0)
        if self.code == Op.POW or not ((a.scale, a.zero_point) == (b.scale, b.zero_point)
                                       == (output.scale, output.zero_point)):
            return False
        values = all_stored_values(dtype_of(a.type))
        return bool(np.array_equal(quantize(dequantize(values, a.scale, a.zero_point), output), values))
