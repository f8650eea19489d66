"""TFLite import: PAD / PADV2 / MIRROR_PAD, and zero padding folded into the convolutions
reading it.
"""

from __future__ import annotations

import numpy as np

from nnapi.codes import OperandCode as T
from nnapi.codes import OperationCode as Op
from nnapi.importers.tflite.converter import _Converter, _converter
from nnapi.importers.tflite.reader import _INT8, _UINT8, _Operator
from nnapi.operand import OperandType


def _spatial_zero_padding(c: _Converter, op: _Operator) -> tuple[int, int, int, int] | None:
    """(top, bottom, left, right) when the PAD / PADV2 ``op`` pads only the height and
    width of a 4-D tensor with real zeros (0.0, or the zero point when quantized), the
    padding a convolution applies itself; None otherwise."""
    const = c.const_of(op.inputs[1]) if op.has_input(1) else None
    if const is None or const.data.shape != (4, 2) or len(op.tensor(0).shape) != 4:
        return None
    paddings = const.data.astype(np.int64)
    if paddings.min() < 0 or paddings[0].any() or paddings[3].any() or not paddings[1:3].any():
        return None
    info, out = op.tensor(0), op.out_tensor(0)
    if info.tfl_type != out.tfl_type or info.scale != out.scale or info.zero_point != out.zero_point:
        return None
    if op.name == "PADV2" and op.has_input(2):
        value = c.const_of(op.inputs[2])
        if value is None or value.data.size != 1:
            return None
        real_zero = info.zero_point if info.tfl_type in (_UINT8, _INT8) else 0
        if value.data.reshape(-1)[0] != real_zero:
            return None
    return int(paddings[1, 0]), int(paddings[1, 1]), int(paddings[2, 0]), int(paddings[2, 1])


def _pads_into_convolutions(c: _Converter, op: _Operator) -> bool:
    """Fold a spatial zero PAD into the explicit padding of the convolutions reading it
    (the converter writes PAD + VALID convolution for padding SAME cannot express): the
    same values, without materializing the padded copy. Only when every reader is a
    VALID CONV_2D (grouped ones too: GROUPED_CONV_2D takes explicit padding; onnx2tf
    writes a depthwise convolution so, PP-OCRv4's recognizer four of them, ~0.7 ms of
    Pad on nnapi-ort-cpu) or DEPTHWISE_CONV_2D taking it as its input, and the padded
    tensor is no subgraph output."""
    padding = _spatial_zero_padding(c, op)
    tensor = op.outputs[0] if len(op.outputs) == 1 else -1
    readers = c.readers(tensor)
    if padding is None or not readers or tensor in c.graph.outputs:
        return False
    depth = op.tensor(0).shape[3]
    for reader, slot in readers:
        if slot != 0 or reader.custom is not None or reader.name not in ("CONV_2D", "DEPTHWISE_CONV_2D"):
            return False
        options = reader.options("Conv2DOptions" if reader.name == "CONV_2D" else "DepthwiseConv2DOptions")
        if options is None or options.Padding() != 1:  # VALID
            return False
        if reader.name == "CONV_2D" and (len(reader.inputs) < 2 or len(reader.tensor(1).shape) != 4 or
                                         depth <= 0 or reader.tensor(1).shape[3] <= 0 or
                                         depth % reader.tensor(1).shape[3]):
            return False  # unknown depth, or no whole number of groups
    c.folded_pads[tensor] = (op.inputs[0], padding)
    c.lowered("spatial zero padding folded into the explicit padding of the convolution(s) reading it")
    return True


def _data_input(c: _Converter, op: _Operator) -> int:
    """A convolution's input operand: the PAD's input when it reads a folded PAD."""
    folded = c.folded_pads.get(op.inputs[0])
    return c.input(0) if folded is None else c.operand(folded[0])


def _folded_padding(c: _Converter, op: _Operator) -> list[int] | None:
    """For a convolution reading a folded PAD: its explicit padding operands (left, right,
    top, bottom); None when its input is no folded PAD."""
    folded = c.folded_pads.get(op.inputs[0])
    if folded is None:
        return None
    top, bottom, left, right = folded[1]
    c.lowered("reads a PAD folded into its explicit padding")
    return [c.i32(left), c.i32(right), c.i32(top), c.i32(bottom)]


@_converter("PAD", "PADV2")
def _pad(c: _Converter, op: _Operator) -> None:
    if _pads_into_convolutions(c, op):
        return
    x = c.input(0)
    paddings = c.const_values(1, "paddings").astype(np.int32)
    pad = c.const_operand(paddings, OperandType(T.TENSOR_INT32, list(paddings.shape)))
    if op.name == "PADV2" and op.has_input(2):
        value = c.const_values(2, "constant value").reshape(-1)[0]
        x_type = c.type_of(x)
        if x_type.type == T.TENSOR_FLOAT16:
            scalar = c.f16(float(value))
        elif x_type.type == T.TENSOR_FLOAT32:
            scalar = c.f32(float(value))
        else:
            scalar = c.i32(int(value))
        c.emit(Op.PAD_V2, [x, pad, scalar], [c.output()])
        return
    c.emit(Op.PAD, [x, pad], [c.output()])


@_converter("MIRROR_PAD")
def _mirror_pad(c: _Converter, op: _Operator) -> None:
    paddings = c.const_values(1, "paddings").astype(np.int32)
    mode = op.options("MirrorPadOptions").Mode()
    pad = c.const_operand(paddings, OperandType(T.TENSOR_INT32, list(paddings.shape)))
    c.emit(Op.MIRROR_PAD, [c.input(0), pad, c.i32(mode)], [c.output()])
