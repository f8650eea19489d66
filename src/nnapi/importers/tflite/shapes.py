"""TFLite import: RESHAPE, SQUEEZE, EXPAND_DIMS (complex tensors' too), SHAPE and RANK.
"""

from __future__ import annotations

import numpy as np

from nnapi.codes import OperandCode as T
from nnapi.codes import OperationCode as Op
from nnapi.importers.tflite.converter import _Const, _Converter, _converter
from nnapi.importers.tflite.float_moves import _reshape_other_type
from nnapi.importers.tflite.high_rank import _high_rank_chain, _high_rank_tree, _lift
from nnapi.importers.tflite.reader import (
    _INT32,
    _RESHAPE_TYPES,
    UnsupportedOperator,
    _operand_shape,
    _Operator,
    _static_shape,
)


def _reshape_complex(c: _Converter, op: _Operator) -> None:
    """RESHAPE / SQUEEZE / EXPAND_DIMS of a complex tensor (RFFT2D's): both parts."""
    shape = _static_shape(c, op.out_tensor())
    if shape is None:
        raise UnsupportedOperator("complex tensor of unknown shape")
    dims = list(_operand_shape(shape))
    parts = []
    for part in c.complex_parts[op.inputs[0]]:
        moved = c.temp(c.type_of(part), dims)
        c.emit(Op.RESHAPE, [part, c.vector(dims)], [moved])
        parts.append(moved)
    c.complex_parts[op.outputs[0]] = (parts[0], parts[1])
    c.lowered(f"{op.name} of a complex tensor: of its real and imaginary parts")


@_converter("RESHAPE")
def _reshape(c: _Converter, op: _Operator) -> None:
    if op.inputs[0] in c.complex_parts:
        _reshape_complex(c, op)
        return
    out = op.out_tensor()
    static = _static_shape(c, out)
    const = c.const_of(op.inputs[0])
    if const is not None and const.channel is None and static is not None and op.inputs[0] not in c.operands:
        # A reshaped constant is a constant: reshaped here, once.
        c.consts[op.outputs[0]] = _Const(const.data.reshape(static), const.code, const.scale, const.zero_point)
        c.lowered("a constant reshaped at import")
        return
    if _high_rank_chain(c, op) or _high_rank_tree(c, op) or _lift(c, op, static):
        return
    x = c.input(0)
    if c.type_of(x).type not in _RESHAPE_TYPES:
        _reshape_other_type(c, op, x, static)
        return
    if static is not None:
        shape = c.vector(static)
    elif op.has_input(1) and c.const_of(op.inputs[1]) is not None:
        shape = c.vector(c.const_of(op.inputs[1]).data)
    elif op.has_input(1):
        shape = c.input(1)
    else:
        options = op.options("ReshapeOptions")
        shape = c.vector(options.NewShapeAsNumpy())
    c.emit(Op.RESHAPE, [x, shape], [c.output()])


@_converter("SQUEEZE")
def _squeeze(c: _Converter, op: _Operator) -> None:
    if op.inputs[0] in c.complex_parts:
        _reshape_complex(c, op)
        return
    x = c.input(0)
    in_info = op.tensor(0)
    options = op.options("SqueezeOptions")
    dims = [int(d) for d in options.SqueezeDimsAsNumpy()] if options is not None and \
        options.SqueezeDimsLength() else [i for i, d in enumerate(in_info.shape) if d == 1]
    if not dims or len(in_info.shape) == len(dims):
        # Nothing to squeeze, or a squeeze to rank 0 (NNAPI's [1]): a RESHAPE does it.
        c.emit(Op.RESHAPE, [x, c.vector(_operand_shape(op.out_tensor().shape))], [c.output()])
        return
    c.emit(Op.SQUEEZE, [x, c.vector(dims)], [c.output()])


@_converter("EXPAND_DIMS")
def _expand_dims(c: _Converter, op: _Operator) -> None:
    if op.inputs[0] in c.complex_parts:
        _reshape_complex(c, op)
        return
    if _high_rank_chain(c, op) or _high_rank_tree(c, op):
        return
    axis = int(c.const_values(1, "axis").reshape(-1)[0])
    x = c.input(0)
    if len(op.tensor(0).shape) == 0:
        c.emit(Op.RESHAPE, [x, c.vector(_operand_shape(op.out_tensor().shape))], [c.output()])
        return
    c.emit(Op.EXPAND_DIMS, [x, c.i32(axis)], [c.output()])


@_converter("RANK")
def _rank(c: _Converter, op: _Operator) -> None:
    """A TFLite tensor's rank is in the file even where its dimensions are not, so RANK is a
    constant. (NNAPI's RANK would say 1 for a rank-0 tensor, which it holds as [1].)"""
    if op.out_tensor().tfl_type != _INT32:
        raise UnsupportedOperator(f"RANK with {op.out_tensor().type_name} output (NNAPI's RANK gives int32)")
    rank = len(op.tensor(0).shape)
    c.consts[op.outputs[0]] = _Const(np.array(rank, np.int32), T.TENSOR_INT32)
    c.lowered(f"RANK folded to the constant {rank} (the input's rank in the file)")


@_converter("SHAPE")
def _shape(c: _Converter, op: _Operator) -> None:
    shape = op.tensor(0).shape
    if any(d < 0 for d in shape):
        raise UnsupportedOperator(f"SHAPE of a tensor with unknown dimensions {list(shape)} (NNAPI has no "
                                  "SHAPE operation; only a static shape is folded)")
    if not shape:
        raise UnsupportedOperator("SHAPE of a rank-0 tensor is an empty tensor, which NNAPI cannot hold")
    c.consts[op.outputs[0]] = _Const(np.array(shape, np.int32), T.TENSOR_INT32)
    c.lowered(f"SHAPE of a static shape folded to the constant {list(shape)}")
