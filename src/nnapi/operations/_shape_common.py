"""Helpers shared by the shape-manipulation and reduction operations (issue 5):
their common type lists, output-matches-input checks and readers of the small INT32
parameter tensors (axes, shapes, paddings) that ``prepare`` turns into output shapes.

The module name starts with an underscore so the operations package does not treat it
as an operation module.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from nnapi.codes import OperandCode
from nnapi.operations.base import ExecutionContext, ValidationContext
from nnapi.operations.common import FLOAT_AND_QUANT8_TENSORS as DATA_TYPES
from nnapi.operations.common import QUANT8_TENSORS, normalize_axis

T = OperandCode

#: the four element types most data-movement operations accept
#: the same plus TENSOR_INT32 (the operations added at feature level 3 and later)
DATA_TYPES_INT = (*DATA_TYPES, T.TENSOR_INT32)


def check_output_like_input(ctx: ValidationContext, output: int = 0, source: int = 0) -> None:
    """Output ``output`` has the type of input ``source``, and for quant8 tensors the same
    scale and zero point (the spec's "must be the same as input0")."""
    ctx.check_output_type(output, ctx.input_type(source))
    if ctx.input_type(source) in QUANT8_TENSORS:
        ctx.check_same_quantization(("input", source), ("output", output))


def check_vector_input(ctx: ValidationContext, index: int, what: str) -> None:
    """Input ``index`` is a TENSOR_INT32 of rank 1 (when its rank is known)."""
    ctx.check_input_type(index, T.TENSOR_INT32)
    rank = ctx.inputs[index].rank
    if rank and rank != 1:
        ctx.fail(f"input {index} ({what}) must be a 1-D tensor, got rank {rank}")


def check_paddings_input(ctx: ValidationContext, index: int, data_index: int = 0,
                         rows: int | None = None) -> None:
    """Input ``index`` is a [rows, 2] TENSOR_INT32 of paddings; ``rows`` defaults to the
    rank of input ``data_index`` when that is known."""
    ctx.check_input_type(index, T.TENSOR_INT32)
    dims = ctx.inputs[index].dimensions
    if not dims:
        return
    if len(dims) != 2:
        ctx.fail(f"input {index} (paddings) must be a 2-D tensor, got rank {len(dims)}")
    if dims[1] and dims[1] != 2:
        ctx.fail(f"input {index} (paddings) must have shape [n, 2], got {list(dims)}")
    expected = rows if rows is not None else ctx.inputs[data_index].rank
    if expected and dims[0] and dims[0] != expected:
        ctx.fail(f"input {index} (paddings) must have {expected} rows, got {dims[0]}")


def check_known_rank_at_least(ctx: ValidationContext, index: int, minimum: int) -> None:
    rank = ctx.inputs[index].rank
    if rank and rank < minimum:
        ctx.fail(f"input {index} must have rank at least {minimum}, got {rank}")


def int_values(ctx: ExecutionContext, index: int, what: str, length: int | None = None) -> np.ndarray:
    """The values of 1-D TENSOR_INT32 input ``index`` as int64 (exact arithmetic)."""
    return vector_values(ctx.value(index), index, what, length, ctx.fail)


def vector_values(value, index: int, what: str, length: int | None, fail: Callable[[str], None]) -> np.ndarray:
    """``int_values`` of a bare value (a kernel of run-time shapes checks its inputs so):
    ``fail`` is called with the message of what is wrong."""
    # the messages are formatted only on failure: a loop body's SLICE reads its bounds here
    # at every iteration
    if value is None:
        fail(f"input {index} ({what}) has no value")
    shape = value.shape if type(value) is np.ndarray else np.shape(value)  # np.shape's dispatch: ~1 us
    if len(shape) != 1:
        fail(f"input {index} ({what}) must be 1-D, got shape {list(shape)}")
    if length is not None and shape[0] != length:
        fail(f"input {index} ({what}) must have {length} elements, got {shape[0]}")
    return np.asarray(value, dtype=np.int64)


def paddings_values(ctx: ExecutionContext, index: int, rows: int) -> np.ndarray:
    """The [rows, 2] paddings of input ``index`` as int64, all non-negative."""
    tensor = ctx.input(index)
    ctx.require(tensor.value is not None, f"input {index} (paddings) has no value")
    ctx.require(tuple(tensor.shape) == (rows, 2),
                f"input {index} (paddings) must have shape [{rows}, 2], got {list(tensor.shape)}")
    paddings = np.asarray(tensor.value, dtype=np.int64)
    ctx.require(bool(np.all(paddings >= 0)), f"paddings must be non-negative, got {paddings.tolist()}")
    return paddings


def axis_value(ctx: ExecutionContext, index: int, rank: int, what: str = "axis") -> int:
    """Scalar axis input ``index`` normalized into [0, rank); OP_FAILED when out of range."""
    axis = int(ctx.scalar(index))
    normalized = normalize_axis(axis, rank)
    if normalized is None:
        ctx.fail(f"{what} {axis} is out of range for rank {rank}")
    return normalized  # type: ignore[return-value]


def axes_values(ctx: ExecutionContext, index: int, rank: int) -> list[int]:
    """The distinct axes listed by 1-D input ``index``, normalized into [0, rank)."""
    axes = []
    for axis in int_values(ctx, index, "axes").tolist():
        normalized = normalize_axis(axis, rank)
        if normalized is None:
            ctx.fail(f"axis {axis} is out of range for rank {rank}")
        if normalized not in axes:
            axes.append(normalized)
    return axes


def reduced_shape(shape: Sequence[int], axes: Sequence[int], keep_dims: bool) -> tuple[int, ...]:
    """The shape after reducing ``axes``; [1] when every dimension goes (NNAPI's rule)."""
    if keep_dims:
        return tuple(1 if axis in axes else size for axis, size in enumerate(shape))
    kept = tuple(size for axis, size in enumerate(shape) if axis not in axes)
    return kept or (1,)
