"""MEAN and REDUCE_ALL / ANY / MAX / MIN / PROD / SUM: reductions over listed axes.

Inputs: 0 the tensor (rank up to 4), 1 a 1-D TENSOR_INT32 of axes in [-rank, rank)
(repeats allowed; an empty list reduces nothing), 2 keep_dims: INT32 (> 0 keeps) for
MEAN, BOOL for REDUCE_*. Reduced dimensions are dropped, or kept with size 1; when
every dimension goes the output shape is [1]. Quantized MEAN / MAX / MIN share the
input's scale and zero point, so they work on the stored integers directly. A zero-sized
input fails the run (OP_FAILED), as on Android.
"""

from __future__ import annotations

import math

import numpy as np

from nnapi.codes import OperandCode, OperationCode
from nnapi.operations import _jit
from nnapi.operations._shape_common import (
    DATA_TYPES,
    axes_values,
    check_output_like_input,
    check_vector_input,
    reduced_shape,
)
from nnapi.operations.base import ExecutionContext, Operation, Shape, ValidationContext, register
from nnapi.operations.common import integer_range, round_half_away

T = OperandCode

# Named input positions (Android's reduce.cpp kInputTensor, kInputAxes, kInputKeepDims).
INPUT = 0
AXES = 1
KEEP_DIMS = 2

_CODE = OperationCode
_FLOAT = (T.TENSOR_FLOAT32, T.TENSOR_FLOAT16)
_TYPES = {
    _CODE.MEAN: DATA_TYPES,
    _CODE.REDUCE_ALL: (T.TENSOR_BOOL8,),
    _CODE.REDUCE_ANY: (T.TENSOR_BOOL8,),
    _CODE.REDUCE_MAX: DATA_TYPES,
    _CODE.REDUCE_MIN: DATA_TYPES,
    _CODE.REDUCE_PROD: _FLOAT,
    _CODE.REDUCE_SUM: _FLOAT,
}
_MAX_RANK = 4


def _extreme(dtype: np.dtype, largest: bool):
    """The identity of max (lowest value) or min (highest value) for ``dtype``: the result
    of reducing an empty set, which Android's kernels start from."""
    if dtype.kind == "f":
        info = np.finfo(dtype)
        return info.max if largest else info.min
    info = np.iinfo(dtype)
    return info.max if largest else info.min


# No zero-sized input, as Android's CPU executor (the REDUCE_* registrations have no
# allowZeroSizedInput; MEAN is checked with the other operations of its switch): the run fails.
@register(*_TYPES)
class Reduce(Operation):
    def validate(self, ctx: ValidationContext) -> None:
        ctx.check_counts(inputs=3, outputs=1)
        ctx.check_input_type(INPUT, _TYPES[self.code])
        ctx.check_input_max_rank(INPUT, _MAX_RANK)
        check_vector_input(ctx, AXES, "axes")
        ctx.check_input_type(KEEP_DIMS, T.INT32 if self.code == _CODE.MEAN else T.BOOL)
        check_output_like_input(ctx)

    def _axes(self, ctx: ExecutionContext) -> tuple[tuple[int, ...], bool]:
        axes = tuple(axes_values(ctx, AXES, ctx.input(INPUT).rank))
        keep = ctx.scalar(KEEP_DIMS)
        return axes, bool(keep > 0 if self.code == _CODE.MEAN else keep)

    def prepare(self, ctx: ExecutionContext) -> list[Shape]:
        axes, keep = self._axes(ctx)
        return [reduced_shape(ctx.input(INPUT).shape, axes, keep)]

    def execute(self, ctx: ExecutionContext) -> list[np.ndarray]:
        axes, keep = self._axes(ctx)
        x = ctx.value(INPUT)
        return [_reduce(self.code, x, axes, reduced_shape(x.shape, axes, keep), ctx.output_dtype(0))]

    def plan(self, ctx: ExecutionContext):
        """The axes, output shape and dtype resolved once."""
        axes, keep = self._axes(ctx)
        shape = ctx.input(INPUT).shape
        if any(shape[axis] == 0 for axis in axes):
            return None  # a zero-sized input: the run fails (check_inputs) before any kernel
        code, out_shape, dtype = self.code, reduced_shape(shape, axes, keep), ctx.output_dtype(0)
        axes_tuple = tuple(axes)
        if code == _CODE.MEAN and ctx.input(INPUT).type == T.TENSOR_FLOAT32:
            compiled = _compiled_mean(shape, axes_tuple, out_shape)
            if compiled is not None:
                return compiled
        return lambda values: [_reduce(code, values[INPUT], axes_tuple, out_shape, dtype, fast_sums=True)]


def _compiled_mean(shape: Shape, axes: tuple[int, ...], out_shape: Shape):
    """Float32 MEAN over adjacent ``axes`` followed by others (a global average over height
    and width) through the compiled ``mean_float`` (nnapi[fast]): numpy's float64 sums in
    numpy's order, one pass; None elsewhere (a reduction along the last axis sums
    pairwise in numpy: its bits stay numpy's)."""
    module = _jit.kernels()
    if module is None or not axes:
        return None
    first, last = min(axes), max(axes)
    if last - first + 1 != len(axes) or last == len(shape) - 1:
        return None
    outer, reduced = math.prod(shape[:first]), math.prod(shape[first:last + 1])
    inner = math.prod(shape[last + 1:])
    count = np.float64(reduced)
    if not _jit.warm_up(module.mean_float, np.zeros((0, 1, 1), np.float32), count, np.empty((0, 1), np.float32),
                        np.empty(1, np.float64)):
        return None
    kernel = module.mean_float

    def mean(values: list) -> list[np.ndarray]:
        x = _jit.kernel_input(values[INPUT]).reshape(outer, reduced, inner)
        out = np.empty(out_shape, np.float32)
        kernel(x, count, out.reshape(outer, inner), _jit.scratch((inner,), np.float64))
        return [out]

    return mean


def _folded_extreme(x: np.ndarray, axes: tuple[int, ...], largest: bool, initial) -> np.ndarray:
    """Float REDUCE_MAX / MIN as Android's kernel folds (Reduce.cpp through tflite's
    ReduceGeneric: each output starts at the type's lowest / highest finite value and takes
    std::max(acc, x) / std::min(acc, x) in the input's order): a NaN never enters (the
    comparison fails), a group of only -inf (+inf) or NaN gives the starting value, and of
    equal values the first stays, which for a maximum of zero is the first -0 or +0 in
    scan order. np.fmax / np.fmin skip NaN; the zero's sign is taken from the group's first
    zero (numpy's choice among equal zeros is its own)."""
    result = (np.fmax if largest else np.fmin).reduce(x, axis=axes, initial=initial)
    zero = result == 0
    if axes and zero.any():
        reduced = sorted(set(axes))
        kept = [n for axis, n in enumerate(x.shape) if axis not in reduced]
        # the reduced axes last, in their order: each group's values in scan order
        groups = np.moveaxis(x, reduced, range(x.ndim - len(reduced), x.ndim)).reshape(*kept, -1)
        first = np.argmax(groups == 0, axis=-1)[..., None]
        negative = np.signbit(np.take_along_axis(groups, first, axis=-1)[..., 0])
        result = np.where(zero, np.where(negative, x.dtype.type(-0.0), x.dtype.type(0.0)), result)
    return result


def _block_sums(x: np.ndarray, axes: tuple[int, ...], work) -> np.ndarray | None:
    """The sums of ``x`` over ``axes`` as one matrix product with a vector of ones, in
    ``work`` (float32 or float64), when the axes are adjacent dimensions (numpy's
    reductions over a short innermost axis, a layer's channels, take ~100 ns per row); the
    kept dimensions in order. None when they are not adjacent."""
    first, last = min(axes), max(axes)
    if last - first + 1 != len(axes):
        return None
    before, reduced = int(np.prod(x.shape[:first])), int(np.prod(x.shape[first:last + 1]))
    after = int(np.prod(x.shape[last + 1:]))
    values = x.reshape(before, reduced, after).astype(work, copy=False)
    ones = np.ones(reduced, dtype=work)
    return values[..., 0] @ ones if after == 1 else np.matmul(ones, values)


def _reduce(code: OperationCode, x: np.ndarray, axes, out_shape: Shape, dtype: np.dtype,
            fast_sums: bool = False) -> np.ndarray:
    """``code``'s reduction of ``x`` over ``axes``, shaped ``out_shape``, in ``dtype``."""
    axes = tuple(axes)
    if code == _CODE.MEAN:
        if x.dtype.kind == "f":
            # float16 is averaged in float32 and rounded once, as Android does; the
            # mean of an empty group is NaN
            with np.errstate(invalid="ignore", divide="ignore"):
                total = np.sum(x, axis=axes, dtype=np.float64)
                count = np.prod([x.shape[axis] for axis in axes], dtype=np.float64)
                result = (total / count).astype(dtype)
        else:
            low, high = integer_range(x.dtype)
            count = int(np.prod([x.shape[axis] for axis in axes]))
            # float32 sums of integers are exact while below 2**24 (in any order): the
            # float64 sum np.mean forms
            sums = _block_sums(x, axes, np.float32) if fast_sums and count * 256 <= 2**24 else None
            mean = np.mean(x, axis=axes, dtype=np.float64) if sums is None else sums.astype(np.float64) / count
            result = np.clip(round_half_away(mean), low, high).astype(dtype)
    elif code in (_CODE.REDUCE_MAX, _CODE.REDUCE_MIN):
        largest = code == _CODE.REDUCE_MAX
        initial = _extreme(x.dtype, not largest)
        if x.dtype.kind != "f":
            result = (np.max if largest else np.min)(x, axis=axes, initial=initial)
        else:
            result = _folded_extreme(x, axes, largest, initial)
    elif code == _CODE.REDUCE_SUM:
        result = np.sum(x, axis=axes, dtype=np.float32).astype(dtype)
    elif code == _CODE.REDUCE_PROD:
        with np.errstate(invalid="ignore", over="ignore"):
            product = np.prod(x, axis=axes, dtype=np.float32)
        # Any zero factor makes the product 0 (even next to an infinity, where
        # IEEE would give NaN), as Android's kernel defines it.
        result = np.where(np.any(x == 0, axis=axes), np.float32(0), product).astype(dtype)
    elif code == _CODE.REDUCE_ALL:
        result = np.all(x, axis=axes)
    else:
        result = np.any(x, axis=axes)
    return np.asarray(result, dtype=dtype).reshape(out_shape)
