"""TFLite operators whose inputs are all constants known at import, folded into constants.

TensorFlow writes shape arithmetic into its graphs (``tf.signal.frame``: SHAPE, SPLIT_V,
FLOOR_DIV, PACK, RANGE, GATHER, REDUCE_PROD, ...). Once the shapes are static, SHAPE is a
constant (shapes.py) and so is everything computed from it; several of those operators
have no NNAPI operation at all (FLOOR_DIV, RANGE, PACK of scalars). Folding them here, in
numpy with TensorFlow's meaning of each, leaves the NNAPI model only the work that depends
on its inputs. Only unquantized int32 / int64 / float32 / bool values are folded, never a
subgraph's output, and a folded value must have the shape the file declares.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from nnapi.codes import OperandCode
from nnapi.codes import OperandCode as T

if TYPE_CHECKING:
    from nnapi.importers.tflite.converter import _Converter
    from nnapi.importers.tflite.reader import _Operator

#: TFLite's tensor type codes (schema.fbs; the values of reader.py's constants)
_FLOAT32, _INT32, _INT64, _BOOL = 0, 2, 4, 6
#: TFLite tensor type -> (numpy dtype, NNAPI operand code of the folded constant); int64
#: narrows to int32 as the importer's int64 constants do
_FOLDED_TYPES = {_FLOAT32: (np.float32, T.TENSOR_FLOAT32), _INT32: (np.int32, T.TENSOR_INT32),
                 _INT64: (np.int64, T.TENSOR_INT32), _BOOL: (np.bool_, T.TENSOR_BOOL8)}
#: the largest constant folded (elements): past it the operation stays in the model
_MAX_ELEMENTS = 1 << 22
_FOLDERS: dict[str, Callable[[_Operator, list[np.ndarray]], list[np.ndarray]]] = {}


def _folder(*names: str):
    def wrap(function):
        for name in names:
            _FOLDERS[name] = function
        return function

    return wrap


def folded_values(c: _Converter, op: _Operator) -> list[tuple[np.ndarray, OperandCode]] | None:
    """The values of ``op``'s outputs (each with the NNAPI operand code of its constant)
    when every input is an unquantized constant the importer knows and this module folds
    the operator; None where it does not. The caller checks them against the declared
    shapes."""
    folder = _FOLDERS.get(op.name)
    if folder is None or not op.outputs or any(t in c.graph.outputs for t in op.outputs):
        return None
    values = []
    # RESHAPE / SQUEEZE / EXPAND_DIMS take the shape the file declares, not their shape input
    # (which an empty buffer can leave unknown)
    for tensor in op.inputs[:1] if folder is _reshape else op.inputs:
        if tensor < 0:
            values.append(None)
            continue
        const = c.const_of(tensor) if tensor not in c.operands else None
        if const is None or const.scale or const.channel is not None or \
                const.code not in (T.TENSOR_INT32, T.TENSOR_FLOAT32, T.TENSOR_BOOL8):
            return None
        values.append(const.data)
    outputs = [c.graph.tensors[t] for t in op.outputs]
    if any(o.tfl_type not in _FOLDED_TYPES or o.scales is not None for o in outputs):
        return None
    try:
        with np.errstate(all="ignore"):
            results = folder(op, values)
    except (_NotFoldable, ValueError, IndexError, TypeError):  # numpy refusing values the file got wrong
        return None
    folded = []
    for info, result in zip(outputs, results):
        dtype, code = _FOLDED_TYPES[info.tfl_type]
        result = np.asarray(result)
        if result.size > _MAX_ELEMENTS or \
                info.tfl_type == _INT64 and result.size and (result.min() < -2**31 or result.max() >= 2**31):
            return None
        folded.append((result.astype(np.int32 if info.tfl_type == _INT64 else dtype), code))  # (range checked)
    return folded


class _NotFoldable(Exception):
    """An operator's options or values this module does not fold (it stays in the model)."""


def _activation_none(op: _Operator, cls_name: str) -> None:
    options = op.options(cls_name)
    if options is not None and options.FusedActivationFunction() != 0:
        raise _NotFoldable


def _axis(axis: int, rank: int) -> int:
    if not -rank <= axis < max(rank, 1):
        raise _NotFoldable
    return axis % max(rank, 1)


def _scalar(value: np.ndarray) -> int:
    if value.size != 1:
        raise _NotFoldable
    return int(value.reshape(-1)[0])


@_folder("ADD", "SUB", "MUL")
def _arithmetic(op, v):
    _activation_none(op, {"ADD": "AddOptions", "SUB": "SubOptions", "MUL": "MulOptions"}[op.name])
    a, b = v
    if a.dtype != b.dtype or a.dtype == np.bool_:
        raise _NotFoldable
    if a.dtype == np.int32:  # TensorFlow's int32 arithmetic wraps
        a, b = a.astype(np.int64), b.astype(np.int64)
    result = {"ADD": np.add, "SUB": np.subtract, "MUL": np.multiply}[op.name](a, b)
    return [result.astype(v[0].dtype)]


@_folder("FLOOR_DIV", "FLOOR_MOD")
def _floor_div(op, v):
    a, b = v
    if a.dtype != b.dtype or a.dtype == np.bool_ or (a.dtype == np.int32 and np.any(b == 0)):
        raise _NotFoldable
    if op.name == "FLOOR_MOD":
        return [np.mod(a, b)]  # the divisor's sign, as TensorFlow's floormod
    return [np.floor(a / b) if a.dtype == np.float32 else np.floor_divide(a, b)]


@_folder("DIV")
def _div(op, v):
    """int32 DIV only (TFLite's truncates toward zero); float quotients stay with the devices.
    A zero divisor, or INT32_MIN by -1, is left to the model."""
    _activation_none(op, "DivOptions")
    a, b = (np.asarray(x, np.int64) for x in v)
    if v[0].dtype != np.int32 or v[1].dtype != np.int32 or np.any(b == 0) or \
            np.any((a == -2**31) & (b == -1)):
        raise _NotFoldable
    quotient = np.abs(a) // np.abs(b) * np.sign(a) * np.sign(b)
    return [quotient.astype(np.int32)]


@_folder("MAXIMUM", "MINIMUM")
def _extremum(op, v):
    a, b = v
    if a.dtype != b.dtype:
        raise _NotFoldable
    return [(np.maximum if op.name == "MAXIMUM" else np.minimum)(a, b)]


@_folder("CAST")
def _cast(op, v):
    target = _FOLDED_TYPES[op.graph.tensors[op.outputs[0]].tfl_type][0]
    if target in (np.int32, np.int64) and v[0].dtype == np.float32:
        if not np.all(np.isfinite(v[0])) or np.any(np.abs(v[0]) >= 2**31):
            raise _NotFoldable
        return [np.trunc(v[0]).astype(target)]
    return [v[0].astype(target)]


@_folder("PACK")
def _pack(op, v):
    options = op.options("PackOptions")
    axis = options.Axis() if options is not None else 0
    return [np.stack(v, axis=_axis(axis, v[0].ndim + 1))]


@_folder("UNPACK")
def _unpack(op, v):
    options = op.options("UnpackOptions")
    axis = _axis(options.Axis() if options is not None else 0, v[0].ndim)
    return [np.take(v[0], i, axis=axis) for i in range(v[0].shape[axis])]


@_folder("CONCATENATION")
def _concatenation(op, v):
    _activation_none(op, "ConcatenationOptions")
    options = op.options("ConcatenationOptions")
    return [np.concatenate(v, axis=_axis(options.Axis() if options is not None else 0, v[0].ndim))]


@_folder("RESHAPE", "SQUEEZE", "EXPAND_DIMS")
def _reshape(op, v):
    declared = op.graph.tensors[op.outputs[0]].shape
    if any(d < 0 for d in declared):
        raise _NotFoldable
    return [v[0].reshape(declared)]


@_folder("SPLIT_V")
def _split_v(op, v):
    value, sizes, axis = v
    axis = _axis(_scalar(axis), value.ndim)
    sizes = [int(s) for s in sizes.reshape(-1)]
    if sizes.count(-1) == 1:
        sizes[sizes.index(-1)] = value.shape[axis] - (sum(sizes) + 1)
    if any(s < 0 for s in sizes) or sum(sizes) != value.shape[axis]:
        raise _NotFoldable
    return np.split(value, np.cumsum(sizes)[:-1], axis=axis)


@_folder("SPLIT")
def _split(op, v):
    axis, value = v
    axis = _axis(_scalar(axis), value.ndim)
    parts = len(op.outputs)
    if value.shape[axis] % parts:
        raise _NotFoldable
    return np.split(value, parts, axis=axis)


@_folder("GATHER")
def _gather(op, v):
    options = op.options("GatherOptions")
    axis = options.Axis() if options is not None else 0
    if options is not None and options.BatchDims() != 0:
        raise _NotFoldable
    params, indices = v
    axis = _axis(axis, params.ndim)
    if indices.dtype != np.int32 or np.any(indices < 0) or np.any(indices >= params.shape[axis]):
        raise _NotFoldable
    return [np.take(params, indices, axis=axis)]


@_folder("RANGE")
def _range(op, v):
    start, limit, delta = (x.reshape(-1)[0] for x in v)
    if delta == 0:
        raise _NotFoldable
    return [np.arange(start, limit, delta, dtype=v[0].dtype)]


@_folder("FILL")
def _fill(op, v):
    dims, value = v
    if np.any(dims < 0) or int(np.prod(dims, dtype=np.int64)) > _MAX_ELEMENTS:
        raise _NotFoldable
    return [np.full(tuple(int(d) for d in dims.reshape(-1)), value.reshape(-1)[0], value.dtype)]


@_folder("REDUCE_PROD", "SUM", "REDUCE_MAX", "REDUCE_MIN")
def _reduce(op, v):
    value, axes = v
    options = op.options("ReducerOptions")
    keep = bool(options.KeepDims()) if options is not None else False
    axes_tuple = tuple(sorted({_axis(int(a), value.ndim) for a in axes.reshape(-1)}))
    function = {"REDUCE_PROD": np.prod, "SUM": np.sum, "REDUCE_MAX": np.max, "REDUCE_MIN": np.min}[op.name]
    if value.size == 0 and op.name in ("REDUCE_MAX", "REDUCE_MIN"):
        raise _NotFoldable
    return [function(value, axis=axes_tuple, keepdims=keep).astype(value.dtype)]


@_folder("STRIDED_SLICE")
def _strided_slice(op, v):
    value, begin, end, strides = v
    options = op.options("StridedSliceOptions")
    masks = (0, 0, 0, 0, 0) if options is None else (options.BeginMask(), options.EndMask(),
                                                     options.EllipsisMask(), options.NewAxisMask(),
                                                     options.ShrinkAxisMask())
    begin_mask, end_mask, ellipsis_mask, new_axis_mask, shrink_mask = masks
    if ellipsis_mask or new_axis_mask or (options is not None and getattr(options, "Offset", lambda: False)()) or \
            not begin.size == end.size == strides.size or begin.size > value.ndim:
        raise _NotFoldable
    index = []
    for i in range(begin.size):
        stride = int(strides[i])
        if stride == 0:
            raise _NotFoldable
        if shrink_mask >> i & 1:
            position = int(begin[i]) + (value.shape[i] if begin[i] < 0 else 0)
            if not 0 <= position < value.shape[i]:
                raise _NotFoldable
            index.append(position)
            continue
        start = None if begin_mask >> i & 1 else int(begin[i])
        stop = None if end_mask >> i & 1 else int(end[i])
        index.append(slice(start, stop, stride))
    return [np.asarray(value[tuple(index)])]


@_folder("SLICE")
def _slice(op, v):
    value, begin, size = v
    if begin.size != value.ndim or size.size != value.ndim:
        raise _NotFoldable
    index = []
    for b, s, d in zip(begin.reshape(-1), size.reshape(-1), value.shape):
        stop = d if s == -1 else int(b) + int(s)
        if not 0 <= b <= stop <= d:
            raise _NotFoldable
        index.append(slice(int(b), stop))
    return [value[tuple(index)]]


@_folder("TRANSPOSE")
def _transpose(op, v):
    value, perm = v
    if sorted(int(p) % max(value.ndim, 1) for p in perm.reshape(-1)) != list(range(value.ndim)):
        raise _NotFoldable
    return [np.transpose(value, [int(p) % value.ndim for p in perm.reshape(-1)])]


@_folder("TILE")
def _tile(op, v):
    value, multiples = v
    if np.any(multiples < 0) or multiples.size != value.ndim:
        raise _NotFoldable
    return [np.tile(value, tuple(int(m) for m in multiples))]
