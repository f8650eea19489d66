"""TFLite import: QUANTIZE, DEQUANTIZE, DENSIFY and CAST.
"""

from __future__ import annotations

import numpy as np

from nnapi.codes import OperandCode as T
from nnapi.codes import OperationCode as Op
from nnapi.importers.tflite.converter import _Const, _Converter, _converter, _dequantize_const
from nnapi.importers.tflite.float_moves import _select_one_zero
from nnapi.importers.tflite.reader import (
    _BOOL,
    _FLOAT32,
    _FLOAT_TYPES,
    _QUANT8,
    UnsupportedOperator,
    _Operator,
    _TensorInfo,
    _tfl,
)
from nnapi.operand import OperandType


def _requantize(c: _Converter, source: int, target: int) -> None:
    """Re-express a quantized tensor at another scale / zero point / signedness."""
    source_type = c.type_of(source)
    real = c.temp(OperandType(T.TENSOR_FLOAT32, source_type.dimensions))
    c.emit(Op.DEQUANTIZE, [source], [real])
    c.emit(Op.QUANTIZE, [real], [target])


@_converter("QUANTIZE")
def _quantize(c: _Converter, op: _Operator) -> None:
    _quantize_operand(c, c.input(0), c.output())


def _quantize_operand(c: _Converter, x: int, target: int) -> None:
    """TFLite's QUANTIZE of operand ``x`` into ``target``: NNAPI's QUANTIZE from float, a
    requantization (DEQUANTIZE + QUANTIZE) from a quantized tensor."""
    if c.type_of(x).type in _FLOAT_TYPES:
        c.emit(Op.QUANTIZE, [x], [target])
        return
    _requantize(c, x, target)
    c.lowered("requantizing QUANTIZE (quantized input): DEQUANTIZE + QUANTIZE")


@_converter("DEQUANTIZE")
def _dequantize(c: _Converter, op: _Operator) -> None:
    const = c.const_of(op.inputs[0])
    if const is not None:
        # float16 (or int8) weights stored compactly: fold into a float32 constant once.
        c.consts[op.outputs[0]] = _dequantize_const(op.tensor(0), const)
        c.lowered(f"constant {op.tensor(0).type_name} tensor dequantized at import")
        return
    _dequantize_operand(c, c.input(0), c.output())


def _dequantize_operand(c: _Converter, x: int, target: int) -> None:
    """TFLite's DEQUANTIZE of operand ``x`` into ``target`` (CAST from float16)."""
    if c.type_of(x).type == T.TENSOR_FLOAT16:
        c.emit(Op.CAST, [x], [target])
        c.lowered("DEQUANTIZE of a float16 tensor as CAST")
        return
    c.emit(Op.DEQUANTIZE, [x], [target])


@_converter("DENSIFY")
def _densify(c: _Converter, op: _Operator) -> None:
    info = op.tensor(0)
    if info.data is None or info.sparsity is None:
        raise UnsupportedOperator("DENSIFY of a tensor that is not a sparse constant")
    dense = _densify_tensor(info)
    op_type = c.nn_type(info)
    c.consts[op.outputs[0]] = _Const(dense, op_type.type, op_type.scale, op_type.zero_point,
                                     c.channel_params(info))
    c.lowered("sparse constant densified at import")


def _densify_tensor(info: _TensorInfo) -> np.ndarray:
    """Expand a TFLite sparse constant (SparsityParameters: traversal order, block map,
    DENSE / SPARSE_CSR dimension metadata) into its dense array."""
    sparsity = info.sparsity
    order = [int(d) for d in sparsity.TraversalOrderAsNumpy()]
    block_map = [int(d) for d in sparsity.BlockMapAsNumpy()] if sparsity.BlockMapLength() else []
    rank = len(info.shape)
    metadata = [sparsity.DimMetadata(i) for i in range(sparsity.DimMetadataLength())]
    values = info.data.reshape(-1)

    def union_values(meta, which: str) -> np.ndarray:
        kind = meta.ArraySegmentsType() if which == "segments" else meta.ArrayIndicesType()
        table = meta.ArraySegments() if which == "segments" else meta.ArrayIndices()
        cls = {1: _tfl.Int32Vector, 2: _tfl.Uint16Vector, 3: _tfl.Uint8Vector}.get(kind)
        if cls is None or table is None:
            raise UnsupportedOperator(f"sparse tensor {info.index} has unreadable {which}")
        vec = cls()
        vec.Init(table.Bytes, table.Pos)
        return np.asarray(vec.ValuesAsNumpy(), np.int64)

    # Dense sizes of each traversal dimension (block dimensions come after the rank ones).
    sizes = [int(meta.DenseSize()) for meta in metadata]
    dense_shape = list(info.shape)
    block_sizes = {}
    for k, original in enumerate(block_map):
        block_sizes[original] = sizes[rank + k]
    out = np.zeros(dense_shape, info.data.dtype)
    position = [0]

    def walk(level: int, index_prefix: list[int], parent: int) -> None:
        meta = metadata[level]
        if meta.Format() == 0:  # DENSE
            children = [(i, parent * sizes[level] + i) for i in range(sizes[level])]
        else:
            segments, indices = union_values(meta, "segments"), union_values(meta, "indices")
            children = [(int(indices[j]), j) for j in range(int(segments[parent]), int(segments[parent + 1]))]
        for coordinate, child in children:
            prefix = [*index_prefix, coordinate]
            if level + 1 == len(metadata):
                original = [0] * rank
                for traversal_level, dim in enumerate(order):
                    if dim < rank:
                        original[dim] += prefix[traversal_level] * block_sizes.get(dim, 1)
                    else:
                        original[block_map[dim - rank]] += prefix[traversal_level]
                out[tuple(original)] = values[position[0]]
                position[0] += 1
            else:
                walk(level + 1, prefix, child)

    walk(0, [], 0)
    return out


@_converter("CAST")
def _cast(c: _Converter, op: _Operator) -> None:
    if op.inputs[0] in c.complex_parts:
        if op.out_tensor().tfl_type != _FLOAT32:
            raise UnsupportedOperator(f"CAST of a complex tensor to {op.out_tensor().type_name}")
        # TFLite's CAST of complex64 keeps the real part (std::real)
        real = c.complex_parts[op.inputs[0]][0]
        c.emit(Op.RESHAPE, [real, c.vector(list(c.type_of(real).dimensions))], [c.output()])
        c.lowered("CAST of RFFT2D's complex result to float32: its real part, as TFLite's CAST")
        return
    # NNAPI's CAST takes no TENSOR_BOOL8: x != 0 makes a bool, SELECT(b, 1, 0) reads one.
    x = c.input(0)
    x_type = c.type_of(x)
    if op.out_tensor().tfl_type == _BOOL and x_type.type != T.TENSOR_BOOL8:
        if x_type.type not in (*_FLOAT_TYPES, T.TENSOR_INT32, *_QUANT8):
            raise UnsupportedOperator(f"CAST of {x_type.type.name} to bool has no NNAPI equivalent")
        zero = np.full(1, x_type.zero_point, x_type.dtype)
        c.emit(Op.NOT_EQUAL, [x, c.const_operand(zero, x_type.with_dimensions([1]))], [c.output()])
        c.lowered("CAST to bool as NOT_EQUAL 0 (NNAPI's CAST takes no TENSOR_BOOL8)")
        return
    if x_type.type == T.TENSOR_BOOL8 and op.out_tensor().tfl_type != _BOOL:
        out = c.output()
        out_type = c.type_of(out)
        if out_type.type not in (*_FLOAT_TYPES, T.TENSOR_INT32) or not x_type.is_fully_specified:
            raise UnsupportedOperator(f"CAST of bool to {out_type.type.name} needs a float or int32 output and a "
                                      "static shape")
        _select_one_zero(c, x, out_type.with_dimensions(list(x_type.dimensions)), out)
        c.lowered("CAST of bool as SELECT(x, 1, 0) (NNAPI's CAST takes no TENSOR_BOOL8)")
        return
    c.emit(Op.CAST, [x], [c.output()])


def _check_stored_values_recovered(x_type: OperandType, shift: int, what: str) -> None:
    """Refuse (naming ``what``) where the float32 chain that recovers an 8-bit tensor's
    stored values as whole numbers, DEQUANTIZE ((q - zero point) * scale), MUL by
    float32(1 / scale), ADD of shift + 0.5, FLOOR, does not give q - zero point + shift
    exactly for every stored value q: the same float32 arithmetic the devices do, over
    all 256 values, at import. An extreme scale (1e37: 255 * scale overflows to inf; or
    one whose inverse does) makes an index out of range, which only failed the run."""
    info = np.iinfo(x_type.dtype)
    stored = np.arange(int(info.min), int(info.max) + 1, dtype=np.int64)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        real = (stored - x_type.zero_point).astype(np.float32) * np.float32(x_type.scale)
        scaled = real * (np.float32(1.0) / np.float32(x_type.scale))
        whole = np.floor(scaled + np.float32(shift + 0.5))
    if not np.array_equal(whole, (stored - x_type.zero_point + shift).astype(np.float32)):
        raise UnsupportedOperator(f"{what}: the input's stored values are not recovered exactly in float32 "
                                  f"(DEQUANTIZE, MUL by 1 / scale, ADD, FLOOR) with its scale {x_type.scale}, which "
                                  "the lowering's table lookup needs")
