"""BATCH_MATMUL (feature level 6): matrix products of the last two dimensions of two
tensors of rank 2 to 4 with the same batch dimensions, each side optionally adjointed
(transposed: the types are real); float32 / float16 / int32 / quant8 asymm signed.

Float products go through BLAS (float16 computed in float32 and rounded once); int32
products are exact in int64 and wrap to int32; quantized products accumulate the exact
integer (q - zero_point) sums and requantize them with Android's fixed-point output
stage (multiplier scale_x * scale_y / scale_out).
"""

from __future__ import annotations

import numpy as np

from nnapi.codes import FuseCode, OperandCode, OperationCode
from nnapi.operations import _jit
from nnapi.operations._conv_common import (
    exact_float_dtype,
    output_stage,
    quantized_conv_dtype,
    requantize_accumulators,
    shifted,
)
from nnapi.operations.base import ExecutionContext, Operation, Shape, ValidationContext, register
from nnapi.operations.elementwise import check_output_shape
from nnapi.operations.quant_math import OutputStage, rescale_multipliers

T = OperandCode

# Named input positions (Android's batch_matmul.cpp kInputLHSTensor, kInputRHSTensor, ...).
LHS = 0
RHS = 1
ADJOINT_LHS = 2
ADJOINT_RHS = 3

_TYPES = (T.TENSOR_FLOAT32, T.TENSOR_FLOAT16, T.TENSOR_INT32, T.TENSOR_QUANT8_ASYMM_SIGNED)


def _flag(ctx: ExecutionContext, index: int) -> bool:
    return index < len(ctx.inputs) and not ctx.is_omitted(index) and bool(ctx.scalar(index))


def _result_shape(a: tuple[int, ...], b: tuple[int, ...], adj_a: bool, adj_b: bool):
    """(output shape, None) or (None, what is wrong)."""
    if len(a) != len(b):
        return None, f"inputs must have the same rank, got {len(a)} and {len(b)}"
    if tuple(a[:-2]) != tuple(b[:-2]):
        return None, f"batch dimensions {list(a[:-2])} and {list(b[:-2])} differ"
    rows, inner_a = (a[-1], a[-2]) if adj_a else (a[-2], a[-1])
    inner_b, cols = (b[-1], b[-2]) if adj_b else (b[-2], b[-1])
    if inner_a != inner_b:
        return None, f"inner dimensions {inner_a} and {inner_b} differ"
    return (*a[:-2], rows, cols), None


@register(OperationCode.BATCH_MATMUL, omitted_operands=True)
class BatchMatmul(Operation):
    def validate(self, ctx: ValidationContext) -> None:
        ctx.check_counts(inputs=(2, 3, 4), outputs=1)
        ctx.check_input_type(LHS, _TYPES)
        code = ctx.input_type(LHS)
        ctx.check_input_types([code, T.BOOL, T.BOOL], start=RHS)
        ctx.check_output_type(0, code)
        for index in (LHS, RHS):
            rank = ctx.inputs[index].rank
            if rank and not 2 <= rank <= 4:
                ctx.fail(f"input {index} must have rank 2 to 4, got {rank}")
        a, b = ctx.inputs[LHS].dimensions, ctx.inputs[RHS].dimensions
        if a and b and len(a) != len(b):
            ctx.fail(f"inputs 0 and 1 must have the same rank, got {len(a)} and {len(b)}")
        flags = [False if index >= len(ctx.inputs) else ctx.constant(index) for index in (ADJOINT_LHS, ADJOINT_RHS)]
        if ctx.inputs[LHS].is_fully_specified and ctx.inputs[RHS].is_fully_specified and None not in flags:
            shape, problem = _result_shape(tuple(a), tuple(b), bool(flags[0]), bool(flags[1]))
            if shape is None:
                ctx.fail(f"input 0 {list(a)} and input 1 {list(b)}: {problem}")
            check_output_shape(ctx, shape)

    def prepare(self, ctx: ExecutionContext) -> list[Shape]:
        a, b = ctx.input(LHS), ctx.input(RHS)
        ctx.require(2 <= a.rank <= 4 and 2 <= b.rank <= 4, f"inputs must have rank 2 to 4, got {a.rank}, {b.rank}")
        shape, problem = _result_shape(a.shape, b.shape, _flag(ctx, ADJOINT_LHS), _flag(ctx, ADJOINT_RHS))
        ctx.require(shape is not None, problem or "")
        return [shape]  # type: ignore[list-item]

    def execute(self, ctx: ExecutionContext) -> list[np.ndarray]:
        a, b = ctx.input(LHS), ctx.input(RHS)
        adj_a, adj_b = _flag(ctx, ADJOINT_LHS), _flag(ctx, ADJOINT_RHS)
        shape, _ = _result_shape(a.shape, b.shape, adj_a, adj_b)

        def oriented(values: np.ndarray, adjoint: bool) -> np.ndarray:
            return np.swapaxes(values, -1, -2) if adjoint else values

        if a.type in (T.TENSOR_FLOAT32, T.TENSOR_FLOAT16):
            left = oriented(np.asarray(a.value, dtype=np.float32), adj_a)
            right = oriented(np.asarray(b.value, dtype=np.float32), adj_b)
            return [np.matmul(left, right).astype(a.value.dtype).reshape(shape)]
        if a.type == T.TENSOR_INT32:
            product = np.matmul(oriented(a.value.astype(np.int64), adj_a), oriented(b.value.astype(np.int64), adj_b))
            return [product.astype(np.int32).reshape(shape)]
        inner = a.shape[-2] if adj_a else a.shape[-1]
        work = quantized_conv_dtype(a, b, inner)
        acc = np.matmul(oriented(shifted(a, work), adj_a), oriented(shifted(b, work), adj_b))
        multipliers, shifts = rescale_multipliers(a.scale, np.array([b.scale]), ctx.output(0).scale)
        result = requantize_accumulators(acc, multipliers, shifts, ctx.output(0),
                                         FuseCode.FUSED_NONE)
        return [result.reshape(shape)]

    def plan(self, ctx: ExecutionContext):
        """Float32: the product itself. Quantized: the output stage made once, and the
        sums in float32 wherever the bound on them (the inner size times the largest
        possible |q - zero point| products) allows: exact either way, so ``execute``'s
        choice from the values gives the same integers."""
        a, b = ctx.input(LHS), ctx.input(RHS)
        adj_a, adj_b = _flag(ctx, ADJOINT_LHS), _flag(ctx, ADJOINT_RHS)
        shape, _ = _result_shape(a.shape, b.shape, adj_a, adj_b)
        if a.type == T.TENSOR_FLOAT32:
            def product(values: list) -> list[np.ndarray]:
                left, right = values[LHS], values[RHS]
                return [np.matmul(np.swapaxes(left, -1, -2) if adj_a else left,
                                  np.swapaxes(right, -1, -2) if adj_b else right)]
            return product
        if a.type != T.TENSOR_QUANT8_ASYMM_SIGNED:
            return None
        inner = a.shape[-2] if adj_a else a.shape[-1]
        low, high = -128, 127
        bound = inner * max(abs(low - a.zero_point), abs(high - a.zero_point)) * max(
            abs(low - b.zero_point), abs(high - b.zero_point), 1)
        work = exact_float_dtype(bound)
        multipliers, shifts = rescale_multipliers(a.scale, np.array([b.scale]), ctx.output(0).scale)
        stage = output_stage(multipliers, shifts, ctx.output(0), FuseCode.FUSED_NONE, None)
        zero_a, zero_b = work(a.zero_point), work(b.zero_point)
        fused = _fused_stage(stage, work, shape[-1] if shape else 0, bound)
        if fused is None:  # numpy runs the stage at every call
            stage.prepare()

        def quantized(values: list) -> list[np.ndarray]:
            left = np.subtract(values[LHS], zero_a, dtype=work)
            right = np.subtract(values[RHS], zero_b, dtype=work)
            acc = np.matmul(np.swapaxes(left, -1, -2) if adj_a else left,
                            np.swapaxes(right, -1, -2) if adj_b else right)
            if fused is not None:  # the compiled output stage, one pass (``_jit``)
                return [fused(acc, np.empty(acc.shape, np.int8)).reshape(shape)]
            return [stage(acc).reshape(shape)]
        quantized.compiled = fused is not None  # type: ignore[attr-defined]
        return quantized


def _fused_stage(stage: OutputStage, work, columns: int, bound: int) -> _jit.FusedOutputStage | None:
    """The output stage compiled (``nnapi[fast]``) for accumulators of ``columns`` columns
    bounded by ``bound``, or None (numba absent or disabled, a stage it cannot hold)."""
    module = _jit.kernels()
    if module is None or not columns or not _jit.compilable(stage):
        return None
    fused = _jit.FusedOutputStage(stage, module, work, columns, acc_bound=bound)
    return fused if fused.ready else None
