"""Helpers shared by the element-wise operation modules (activations, unary, binary_math,
comparisons, logical, select, cast, quantization): shape checks at validation time,
broadcast shape inference, the zero-sized input rule, and float working precision.

Not an operation module (the leading underscore keeps the package loader from treating
it as one); the family modules import it.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from nnapi.codes import OperandCode
from nnapi.operations.base import ExecutionContext, Shape, Tensor, ValidationContext
from nnapi.operations.common import broadcast_shapes

T = OperandCode

FLOAT_TENSORS = (T.TENSOR_FLOAT32, T.TENSOR_FLOAT16)
QUANT8_TENSORS = (T.TENSOR_QUANT8_ASYMM, T.TENSOR_QUANT8_ASYMM_SIGNED)


def _known(dims: Sequence[int]) -> bool:
    """A declared shape with a rank and no unspecified dimension."""
    return len(dims) > 0 and 0 not in dims


def check_output_shape(ctx: ValidationContext, expected: Sequence[int] | None, output: int = 0) -> None:
    """BAD_DATA when output ``output`` is declared with a shape that cannot be ``expected``.

    ``expected`` may hold 0s (unknown dimensions) or be empty/None (unknown rank); only
    what both sides know is compared, so partially specified outputs stay legal."""
    declared = ctx.outputs[output].dimensions
    if not expected or not declared:
        return
    if len(declared) != len(expected):
        ctx.fail(f"output {output} must have rank {len(expected)}, got {len(declared)}")
    for axis, (want, got) in enumerate(zip(expected, declared, strict=True)):
        if want and got and want != got:
            ctx.fail(f"output {output} dimension {axis} must be {want}, got {got}")


def check_same_shape_output(ctx: ValidationContext, source: int = 0, output: int = 0) -> None:
    """The output of an element-wise operation has the shape of input ``source``."""
    check_output_shape(ctx, ctx.inputs[source].dimensions, output)


def check_broadcast(ctx: ValidationContext, first: int = 0, second: int = 1, output: int | None = 0) -> None:
    """Inputs ``first`` and ``second`` broadcast (when their shapes are known) and the
    declared output agrees with the broadcast shape."""
    a, b = ctx.inputs[first].dimensions, ctx.inputs[second].dimensions
    if not (_known(a) and _known(b)):
        return
    shape = broadcast_shapes(a, b)
    if shape is None:
        ctx.fail(f"input {first} shape {list(a)} and input {second} shape {list(b)} do not broadcast")
    if output is not None:
        check_output_shape(ctx, shape, output)


def broadcast_output_shape(ctx: ExecutionContext, first: int = 0, second: int = 1) -> Shape:
    """The broadcast shape of two inputs at execution time (OP_FAILED if incompatible)."""
    a, b = ctx.input(first).shape, ctx.input(second).shape
    shape = broadcast_shapes(a, b)
    if shape is None:
        ctx.fail(f"input {first} shape {list(a)} and input {second} shape {list(b)} do not broadcast")
    return shape  # type: ignore[return-value]


def reject_zero_sized(ctx: ExecutionContext, *indexes: int) -> None:
    """Fail (OP_FAILED) on a zero-sized input for operations whose specification does not
    allow one, as Android's runtime does (only operations documented "may be zero-sized"
    accept them)."""
    for index in indexes or range(len(ctx.inputs)):
        tensor = ctx.input(index)
        if tensor.value is not None and tensor.value.ndim and tensor.value.size == 0:
            ctx.fail(f"input {index} is zero-sized (shape {list(tensor.shape)}), which "
                     f"{ctx.code.name} does not support")


def float_input(tensor: Tensor) -> np.ndarray:
    """A float tensor's values in float32: float16 operands are computed in float32 and
    rounded once at the end, as Android's kernels do."""
    value = tensor.value
    return value if value.dtype == np.float32 else value.astype(np.float32)


def real_values(tensor: Tensor, dtype=np.float64) -> np.ndarray:
    """Real values of a single-scale quantized tensor: (q - zero_point) * scale."""
    return (tensor.value.astype(dtype) - dtype(tensor.zero_point)) * dtype(tensor.scale)
