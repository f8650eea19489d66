"""Helpers shared by the element-wise operation modules (activations, unary, binary_math,
comparisons, logical, select, cast, quantization, and ADD/SUB/MUL in arithmetic): shape
checks at validation time, broadcast shape inference, the zero-sized input rule, float
working precision, lookup tables for 8-bit quantized inputs and a branch-free select.

Not an operation module (the package loader skips it: ``_HELPER_MODULES``); the family
modules import it, and so does the ONNX Runtime driver (drivers/ort/composites.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from nnapi.codes import OperandCode
from nnapi.operations import _jit
from nnapi.operations.base import ExecutionContext, Shape, Tensor, ValidationContext
from nnapi.operations.common import FLOAT_TENSORS as FLOAT_TENSORS  # re-exported
from nnapi.operations.common import QUANT8_TENSORS as QUANT8_TENSORS  # re-exported
from nnapi.operations.common import broadcast_shapes

T = OperandCode



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


#: the shortest innermost run ``tile_trailing`` leaves a broadcast constant
_MIN_BROADCAST_RUN = 256


def tile_trailing(constant: np.ndarray, shape: Shape) -> np.ndarray:
    """``constant`` as an array that broadcasts against ``shape`` to the same values,
    materialized over ``shape``'s trailing axes until its innermost contiguous run has at
    least 256 elements (or covers every axis). numpy's broadcasting loops run once per
    innermost run, so a per-channel constant of shape (C,) against (N, H, W, C) pays one
    loop per pixel (a few times slower than the arithmetic for C = 8); tiled to (W, C),
    one per row. Prepared kernels call this once, at preparation."""
    constant = np.asarray(constant)
    if not shape or constant.ndim > len(shape) or np.broadcast_shapes(constant.shape, shape) != tuple(shape):
        return constant
    full = constant.reshape((1,) * (len(shape) - constant.ndim) + constant.shape)
    axes, run = 0, 1
    while axes < len(shape) and run < _MIN_BROADCAST_RUN:
        axes += 1
        run *= shape[-axes]
    target = full.shape[:len(shape) - axes] + tuple(shape[len(shape) - axes:])
    return np.ascontiguousarray(np.broadcast_to(full, target))


def float_input(tensor: Tensor) -> np.ndarray:
    """A float tensor's values in float32: float16 operands are computed in float32 and
    rounded once at the end, as Android's kernels do."""
    value = tensor.value
    return value if value.dtype == np.float32 else value.astype(np.float32)


# --- lookup tables for 8-bit quantized inputs --------------------------------------------
# An 8-bit input has only 256 possible values, so an element-wise function of one (or two)
# quantized inputs is evaluated once per possible value (or pair) and the tensor is mapped
# through the table: the same results as evaluating every element, at a fraction of the
# cost on large tensors.

#: below this many output elements a 256 x 256 table costs more than computing directly
_PAIR_TABLE_MIN_ELEMENTS = 1 << 16


def all_stored_values(dtype: np.dtype) -> np.ndarray:
    """The 256 values an 8-bit dtype can hold, ordered by bit pattern (the uint8 view), so
    that ``table[value.view(np.uint8)]`` looks a value up."""
    return np.arange(256, dtype=np.uint8).view(dtype)


def map_quant8(stored: np.ndarray, function) -> np.ndarray:
    """``function(stored)`` for an 8-bit array, through a 256-entry table."""
    stored = np.asarray(stored)
    table = function(all_stored_values(stored.dtype))
    return np.take(table, stored.view(np.uint8))


def prepared_quant8(table: np.ndarray) -> Callable[[np.ndarray], np.ndarray]:
    """The lookup of 8-bit arrays in ``table`` (256 entries, by the values' uint8 views),
    made at preparation: compiled in one pass (``nnapi[fast]``) for 8-bit results, else
    ``np.take``; the two give the same arrays."""
    compiled = _compiled_lookup() if table.dtype.itemsize == 1 else None
    if compiled is None:
        return lambda stored: np.take(table, stored.view(np.uint8))
    bits = _jit.constant(table.view(np.uint8), np.uint8)

    def lookup(stored: np.ndarray) -> np.ndarray:
        stored = _jit.kernel_input(stored)
        out = np.empty(stored.shape, table.dtype)
        compiled(stored.view(np.uint8).reshape(-1), bits, out.view(np.uint8).reshape(-1))
        return out

    return lookup


def _compiled_lookup():
    """The compiled one-table lookup (``_numba_quant.lookup``), or None."""
    if _jit.kernels() is None:
        return None
    from nnapi.operations._numba_quant import lookup

    empty = np.zeros(0, np.uint8)
    return lookup if _jit.warm_up(lookup, empty, np.zeros(256, np.uint8), empty.copy()) else None


#: rows of the 256 x 256 table of ``pair_table`` computed at once: the float64 temporaries
#: of a block stay in the cache and below malloc's mmap threshold (128 KiB), where those
#: of a whole table (512 KiB each) are fresh pages every time (~4x slower)
_PAIR_TABLE_ROWS = 32


def pair_table(function, first_dtype, second_dtype) -> np.ndarray:
    """``function`` (elementwise, broadcasting) of every pair of stored values of two 8-bit
    dtypes, (256, 256) with the first's values along the rows (``all_stored_values``
    order): computed in blocks of rows, each element as one call on the whole table
    computes it."""
    firsts = all_stored_values(np.dtype(first_dtype))
    seconds = all_stored_values(np.dtype(second_dtype))[None, :]
    return np.concatenate([function(firsts[start:start + _PAIR_TABLE_ROWS, None], seconds)
                           for start in range(0, 256, _PAIR_TABLE_ROWS)])


def map_quant8_pair(first: np.ndarray, second: np.ndarray, function) -> np.ndarray:
    """``function(first, second)`` (broadcasting) for two 8-bit arrays, through a
    256 x 256 table when the output is large enough to pay for it."""
    first, second = np.asarray(first), np.asarray(second)
    shape = np.broadcast_shapes(first.shape, second.shape)
    if int(np.prod(shape)) < _PAIR_TABLE_MIN_ELEMENTS:
        return function(first, second)
    table = pair_table(function, first.dtype, second.dtype)
    index = (first.view(np.uint8).astype(np.uint16) << 8) | second.view(np.uint8)
    return np.take(table.reshape(-1), index)


def prepared_quant8_pair(function, first_dtype, second_dtype, first_shape: Shape,
                         second_shape: Shape) -> Callable[[list], list[np.ndarray]]:
    """``map_quant8_pair`` prepared for inputs of ``first_shape`` and ``second_shape``: the
    table of every pair of stored values is computed once, at preparation (unless the
    output is tiny), and each execution only looks the pairs up; the returned kernel maps
    [first, second] to [result]. Compiled (``nnapi[fast]``) where the inputs have one shape
    or one broadcasts along leading axes only (``_period``: a per-channel constant, a
    squeeze-and-excitation scale), that one read with its period; else numpy's broadcast."""
    shape = tuple(broadcast_shapes(first_shape, second_shape))
    if math.prod(shape) < 256:
        return lambda values: [function(values[0], values[1])]
    table = pair_table(function, first_dtype, second_dtype).reshape(-1)
    compiled = _compiled_pairs(table)
    shapes = (tuple(first_shape), tuple(second_shape))
    # which input repeats: the second (the table as it is), or the first (the transposed table)
    size, periods = math.prod(shape), (_period(shapes[0], shape), _period(shapes[1], shape))
    swapped = periods[0] != size
    periodic = None
    if compiled is not None and periods[1 if swapped else 0] == size and periods[0 if swapped else 1]:
        if swapped:
            periodic = _jit.constant(table.reshape(256, 256).T.reshape(-1).view(np.uint8), np.uint8)
        else:  # the table itself, a new C array of this plan's (no copy of its 64 KiB)
            bits = table.view(np.uint8)
            periodic = bits if bits.flags.c_contiguous and bits.flags.writeable else _jit.constant(bits, np.uint8)

    def run(values: list) -> list[np.ndarray]:
        first, second = values[0], values[1]
        if periodic is not None and (first.shape, second.shape) == shapes:
            full, repeated = (second, first) if swapped else (first, second)
            full, repeated = _jit.kernel_input(full), _jit.kernel_input(repeated)
            out = np.empty(shape, table.dtype)
            compiled(full.view(np.uint8).reshape(-1), repeated.view(np.uint8).reshape(-1), periodic,
                     out.view(np.uint8).reshape(-1))
            return [out]
        index = (first.view(np.uint8).astype(np.uint16) << 8) | second.view(np.uint8)
        return [np.take(table, index)]

    run.compiled = periodic is not None  # type: ignore[attr-defined]
    return run


def _period(input_shape: Shape, shape: Shape) -> int | None:
    """The length of the run with which an input of ``input_shape`` repeats in the flat
    broadcast ``shape`` when it broadcasts along leading axes only (its shape, after its
    leading 1s, is ``shape``'s trailing one): the product of those trailing axes; None
    where it broadcasts along an inner axis too."""
    dims = (1,) * (len(shape) - len(input_shape)) + tuple(input_shape)
    first = 0
    while first < len(dims) and dims[first] == 1:
        first += 1
    if dims[first:] != tuple(shape[first:]):
        return None
    return math.prod(shape[first:])


def _compiled_pairs(table: np.ndarray):
    """The compiled one-pass lookup (``nnapi[fast]``) for a table of 8-bit results, or None."""
    compiled = _jit.kernels()
    if compiled is None or table.dtype.itemsize != 1:
        return None
    empty = np.zeros(0, np.uint8)
    if not _jit.warm_up(compiled.lookup_pairs, empty, empty, _jit.constant(table.view(np.uint8), np.uint8),
                        np.empty(0, np.uint8)):
        return None
    return compiled.lookup_pairs


# --- branch-free selection --------------------------------------------------------------
_SAME_SIZE_INTS = {1: np.int8, 2: np.int16, 4: np.int32, 8: np.int64}


def select_by_bits(condition: np.ndarray, if_true: np.ndarray, if_false: np.ndarray) -> np.ndarray:
    """``np.where(condition, if_true, if_false)`` for arrays of one dtype, broadcasting.

    np.where branches per element, which is slow on unpredictable masks; blending the bit
    patterns (false ^ ((true ^ false) & mask), mask all ones where the condition holds) is
    branch-free and exact for every dtype, NaN payloads included."""
    dtype = np.result_type(if_true, if_false)
    int_type = _SAME_SIZE_INTS[dtype.itemsize]
    true_bits = np.asarray(if_true, dtype=dtype).view(int_type)
    false_bits = np.asarray(if_false, dtype=dtype).view(int_type)
    mask = np.negative(np.asarray(condition).astype(int_type))
    return (false_bits ^ ((true_bits ^ false_bits) & mask)).view(dtype)
