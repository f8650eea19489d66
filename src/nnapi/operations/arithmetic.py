"""ADD, SUB, MUL, DIV: broadcasting element-wise arithmetic with a fused activation.

Inputs: 0 and 1 are tensors of one type (quantized inputs may differ in scale and zero
point), 2 is the INT32 FuseCode. Quantized results are computed as Android's CPU driver
computes them, in fixed point (quant_math.FixedPointAdd / FixedPointMul: TFLite's integer
kernels' arithmetic), which differs from the real result rounded once by a step on some
pairs of stored values; TENSOR_INT32 requires FUSED_NONE and
DIV on it is floor division (division by zero gives 0, as on Android). Quantized MUL
requires output_scale > input1_scale * input2_scale (BAD_DATA otherwise).
"""

from __future__ import annotations

import numpy as np

from nnapi.codes import FuseCode, OperandCode, OperationCode
from nnapi.operand import dtype_of
from nnapi.operations.base import ExecutionContext, Operation, Shape, ValidationContext, register
from nnapi.operations.common import (
    activation_bounds_float,
    activation_bounds_quantized,
    broadcast_shapes,
    dequantize_tensor,
    is_valid_fuse_code,
    quantize_with_activation,
)
from nnapi.operations.elementwise import map_quant8_pair, prepared_quant8_pair
from nnapi.operations.quant_math import FixedPointAdd, FixedPointMul

T = OperandCode

# Named input positions (Android's broadcast.cpp kInputTensor1, kInputTensor2, kActivationScalar).
INPUT1 = 0
INPUT2 = 1
ACTIVATION = 2

#: input positions
INPUT1, INPUT2, ACTIVATION = 0, 1, 2
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


def quantized_mul_scales_allowed(a_scale: float, b_scale: float, out_scale: float) -> bool:
    """NNAPI's condition on a quantized MUL's scales (ANeuralNetworksModel_addOperation
    with ANEURALNETWORKS_MUL): output scale > input1 scale * input2 scale, on float32
    scales as the NDK stores them. The one statement of the rule: the validation here and
    the TFLite importer (which takes another form where it fails) ask it."""
    return bool(np.float32(out_scale) > np.float32(a_scale) * np.float32(b_scale))


@register(OperationCode.ADD, OperationCode.SUB, OperationCode.MUL, OperationCode.DIV, zero_sized_inputs=True)
class BinaryArithmetic(Operation):
    def validate(self, ctx: ValidationContext) -> None:
        ctx.check_counts(inputs=3, outputs=1)
        ctx.check_input_types([_TYPES[self.code], ctx.input_type(INPUT1), T.INT32])
        ctx.check_output_type(0, ctx.input_type(INPUT1))
        for index in (INPUT1, INPUT2):
            ctx.check_input_max_rank(index, _MAX_RANK)
        a, b = ctx.inputs[INPUT1].dimensions, ctx.inputs[INPUT2].dimensions
        if a and b and 0 not in a and 0 not in b and broadcast_shapes(a, b) is None:
            ctx.fail(f"input shapes {list(a)} and {list(b)} do not broadcast")
        if self.code == OperationCode.MUL and ctx.input_type(INPUT1) in _QUANT8_TYPES:
            a_scale, b_scale, out_scale = ctx.inputs[INPUT1].scale, ctx.inputs[INPUT2].scale, ctx.outputs[0].scale
            if not quantized_mul_scales_allowed(a_scale, b_scale, out_scale):
                ctx.fail(f"output 0 scale {out_scale} must exceed the product of the input "
                         f"scales ({np.float32(a_scale) * np.float32(b_scale)})")

    def prepare(self, ctx: ExecutionContext) -> list[Shape]:
        a, b = ctx.input(INPUT1).shape, ctx.input(INPUT2).shape
        shape = broadcast_shapes(a, b)
        ctx.require(shape is not None, f"input shapes {list(a)} and {list(b)} do not broadcast")
        fuse = ctx.scalar(ACTIVATION)
        ctx.require(is_valid_fuse_code(fuse), f"invalid fuse code {fuse}")
        if ctx.input(INPUT1).type == T.TENSOR_INT32:
            ctx.require(fuse == FuseCode.FUSED_NONE, "TENSOR_INT32 requires FUSED_NONE")
        return [shape]  # type: ignore[list-item]

    def execute(self, ctx: ExecutionContext) -> list[np.ndarray]:
        a, b = ctx.input(INPUT1), ctx.input(INPUT2)
        fuse = ctx.scalar(ACTIVATION)
        code = a.type
        if code == T.TENSOR_INT32:
            if self.code == OperationCode.DIV:
                return [_floor_divide_int32(a.value, b.value)]
            return [_INT_MATH[self.code](a.value, b.value).astype(np.int32)]
        if code in _QUANT8_TYPES:
            return [map_quant8_pair(a.value, b.value, self._on_stored(ctx))]
        # Float16 is computed in float32 and rounded once, as Android's kernels do.
        math = _FLOAT_MATH[self.code]
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            real = math(dequantize_tensor(a, dtype=np.float32), dequantize_tensor(b, dtype=np.float32))
        return [quantize_with_activation(real, ctx.output(0), fuse)]

    def _on_stored(self, ctx: ExecutionContext):
        """The quantized operation on stored values, in Android's fixed-point arithmetic
        (quant_math.FixedPointAdd for ADD / SUB, FixedPointMul for MUL), prepared for this
        context's quantizations and fused activation."""
        a, b, output = ctx.input(INPUT1), ctx.input(INPUT2), ctx.output(0)
        low, high = activation_bounds_quantized(ctx.scalar(ACTIVATION), output)
        quantizations = ((a.scale, a.zero_point), (b.scale, b.zero_point), (output.scale, output.zero_point))
        if self.code == OperationCode.MUL:
            return FixedPointMul(*quantizations, low, high, dtype_of(output.type))
        return FixedPointAdd(*quantizations, low, high, dtype_of(output.type),
                             subtract=self.code == OperationCode.SUB)

    def plan(self, ctx: ExecutionContext):
        a, b = ctx.input(INPUT1), ctx.input(INPUT2)
        code = a.type
        if code == T.TENSOR_INT32:  # what ``execute`` computes, without its context (a loop counter's ADD)
            if self.code == OperationCode.DIV:
                return lambda values: [_floor_divide_int32(values[INPUT1], values[INPUT2])]
            integer_math = _INT_MATH[self.code]
            return lambda values: [integer_math(values[INPUT1], values[INPUT2]).astype(np.int32)]
        if code in _QUANT8_TYPES:
            return prepared_quant8_pair(self._on_stored(ctx), dtype_of(a.type), dtype_of(b.type), a.shape,
                                        b.shape)
        math = _FLOAT_MATH[self.code]
        fuse = ctx.scalar(ACTIVATION)
        bounds = activation_bounds_float(fuse) if fuse != FuseCode.FUSED_NONE else None
        to_float16 = code == T.TENSOR_FLOAT16

        def run(values: list) -> list[np.ndarray]:
            first, second = values[INPUT1], values[INPUT2]
            if to_float16:
                first, second = first.astype(np.float32), second.astype(np.float32)
            result = math(first, second)  # the driver runs kernels under np.errstate(all="ignore")
            if type(result) is not np.ndarray:  # two scalars
                result = np.asarray(result)
            if bounds is not None:
                np.clip(result, *bounds, out=result)
            return [result.astype(np.float16) if to_float16 else result]

        return run
