"""ADD, SUB, MUL, DIV: broadcasting element-wise arithmetic with a fused activation.

Inputs: 0 and 1 are tensors of one type (quantized inputs may differ in scale and zero
point), 2 is the INT32 FuseCode. Quantized results are computed on real values and
quantized into the output's scale and zero point; TENSOR_INT32 requires FUSED_NONE and
DIV on it is floor division (division by zero gives 0, as on Android). Quantized MUL
requires output_scale > input1_scale * input2_scale (BAD_DATA otherwise).
"""

from __future__ import annotations

import numpy as np

from nnapi.codes import FuseCode, OperandCode, OperationCode
from nnapi.operations._elementwise import map_quant8_pair
from nnapi.operations.base import ExecutionContext, Operation, Shape, ValidationContext, register
from nnapi.operations.common import (
    broadcast_shapes,
    dequantize_tensor,
    is_valid_fuse_code,
    quantize_with_activation,
)
from nnapi.operations.quant_math import dequantize

T = OperandCode
_ALL_TYPES = (T.TENSOR_FLOAT32, T.TENSOR_FLOAT16, T.TENSOR_QUANT8_ASYMM, T.TENSOR_QUANT8_ASYMM_SIGNED,
              T.TENSOR_INT32)
_QUANT8_TYPES = (T.TENSOR_QUANT8_ASYMM, T.TENSOR_QUANT8_ASYMM_SIGNED)
_TYPES = {
    OperationCode.ADD: _ALL_TYPES,
    OperationCode.SUB: _ALL_TYPES,
    OperationCode.MUL: _ALL_TYPES,
    OperationCode.DIV: (T.TENSOR_FLOAT32, T.TENSOR_FLOAT16, T.TENSOR_INT32),
}
_FLOAT_MATH = {
    OperationCode.ADD: np.add,
    OperationCode.SUB: np.subtract,
    OperationCode.MUL: np.multiply,
    OperationCode.DIV: np.divide,
}
_INT_MATH = {**_FLOAT_MATH, OperationCode.DIV: np.floor_divide}
_MAX_RANK = 4


def _floor_divide_int32(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Floor division of int32 tensors. Division by zero is undefined in NNAPI but must
    not fail the execution (CTS): Android writes 0 there, and so does this."""
    a64, b64 = np.broadcast_arrays(np.asarray(a, dtype=np.int64), np.asarray(b, dtype=np.int64))
    zero = b64 == 0
    quotient = np.floor_divide(a64, np.where(zero, 1, b64))
    # int32 wrap-around for INT32_MIN / -1, as in C
    return np.where(zero, 0, quotient).astype(np.int32)


@register(OperationCode.ADD, OperationCode.SUB, OperationCode.MUL, OperationCode.DIV)
class BinaryArithmetic(Operation):
    def validate(self, ctx: ValidationContext) -> None:
        ctx.check_counts(inputs=3, outputs=1)
        ctx.check_input_types([_TYPES[self.code], ctx.input_type(0), T.INT32])
        ctx.check_output_type(0, ctx.input_type(0))
        for index in (0, 1):
            ctx.check_input_max_rank(index, _MAX_RANK)
        a, b = ctx.inputs[0].dimensions, ctx.inputs[1].dimensions
        if a and b and 0 not in a and 0 not in b and broadcast_shapes(a, b) is None:
            ctx.fail(f"input shapes {list(a)} and {list(b)} do not broadcast")
        if self.code == OperationCode.MUL and ctx.input_type(0) in _QUANT8_TYPES:
            # The NDK requires output_scale > input1_scale * input2_scale for quantized MUL
            # (float32 scales, as the NDK stores them).
            product = np.float32(ctx.inputs[0].scale) * np.float32(ctx.inputs[1].scale)
            if not np.float32(ctx.outputs[0].scale) > product:
                ctx.fail(f"output 0 scale {ctx.outputs[0].scale} must exceed the product of the input "
                         f"scales ({product})")

    def prepare(self, ctx: ExecutionContext) -> list[Shape]:
        a, b = ctx.input(0).shape, ctx.input(1).shape
        shape = broadcast_shapes(a, b)
        ctx.require(shape is not None, f"input shapes {list(a)} and {list(b)} do not broadcast")
        fuse = ctx.scalar(2)
        ctx.require(is_valid_fuse_code(fuse), f"invalid fuse code {fuse}")
        if ctx.input(0).type == T.TENSOR_INT32:
            ctx.require(fuse == FuseCode.FUSED_NONE, "TENSOR_INT32 requires FUSED_NONE")
        return [shape]  # type: ignore[list-item]

    def execute(self, ctx: ExecutionContext) -> list[np.ndarray]:
        a, b = ctx.input(0), ctx.input(1)
        fuse = ctx.scalar(2)
        code = a.type
        if code == T.TENSOR_INT32:
            if self.code == OperationCode.DIV:
                return [_floor_divide_int32(a.value, b.value)]
            return [_INT_MATH[self.code](a.value, b.value).astype(np.int32)]
        output = ctx.output(0)
        math = _FLOAT_MATH[self.code]
        if code in _QUANT8_TYPES:
            # Quantized inputs are computed on exact real values (float64), through a table
            # of every pair of stored values when the tensors are large.
            def on_stored(stored_a: np.ndarray, stored_b: np.ndarray) -> np.ndarray:
                real = math(dequantize(stored_a, a.scale, a.zero_point), dequantize(stored_b, b.scale, b.zero_point))
                return quantize_with_activation(real, output, fuse)

            return [map_quant8_pair(a.value, b.value, on_stored)]
        # Float16 is computed in float32 and rounded once, as Android's kernels do.
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            real = math(dequantize_tensor(a, dtype=np.float32), dequantize_tensor(b, dtype=np.float32))
        return [quantize_with_activation(real, output, fuse)]
