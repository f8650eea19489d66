"""TFLite import: RESIZE_*, SPACE_TO_DEPTH / DEPTH_TO_SPACE, SPACE_TO_BATCH_ND /
BATCH_TO_SPACE_ND.
"""

from __future__ import annotations

import numpy as np

from nnapi.codes import OperandCode as T
from nnapi.codes import OperationCode as Op
from nnapi.importers.tflite.converter import _Converter, _converter
from nnapi.importers.tflite.elementwise import _in_float32
from nnapi.importers.tflite.reader import _QUANT8, UnsupportedOperator, _Operator
from nnapi.operand import OperandType
from nnapi.operations.quant_math import half_below


@_converter("RESIZE_BILINEAR", "RESIZE_NEAREST_NEIGHBOR")
def _resize(c: _Converter, op: _Operator) -> None:
    bilinear = op.name == "RESIZE_BILINEAR"
    options = op.options("ResizeBilinearOptions" if bilinear else "ResizeNearestNeighborOptions")
    size = c.const_values(1, "size").reshape(-1)
    code = Op.RESIZE_BILINEAR if bilinear else Op.RESIZE_NEAREST_NEIGHBOR

    def emit(inputs: list[int], out: int) -> None:
        c.emit(code, [inputs[0], c.i32(int(size[1])), c.i32(int(size[0])), c.boolean(False),
                      c.boolean(bool(options.AlignCorners())), c.boolean(bool(options.HalfPixelCenters()))],
               [out])
    x_type = c.type_of(c.input(0))
    if bilinear and x_type.type == T.TENSOR_QUANT8_ASYMM:
        # NNAPI's quantized bilinear blend truncates toward zero (Android's kernel casts);
        # LiteRT rounds it to nearest (every uint8 path: the float32 blend of the stored
        # integers, rounded). Truncation biased every uint8 resize by ~0.5 step against
        # LiteRT. The same blend of the stored integers (CAST keeps them) in float32, then
        # trunc(x + half_below(0.5)) = C's round for x >= 0, CAST back.
        out = c.output()
        stored = c.temp(OperandType(T.TENSOR_FLOAT32, x_type.dimensions))
        c.emit(Op.CAST, [c.input(0)], [stored])
        blend = c.temp(OperandType(T.TENSOR_FLOAT32, c.type_of(out).dimensions))
        emit([stored], blend)
        shifted = c.temp(OperandType(T.TENSOR_FLOAT32, c.type_of(out).dimensions))
        half = c.const_operand(np.array([half_below(np.float32)], np.float32), OperandType(T.TENSOR_FLOAT32, [1]))
        c.emit(Op.ADD, [blend, half, c.i32(0)], [shifted])
        c.emit(Op.CAST, [shifted], [out])
        c.lowered("uint8 RESIZE_BILINEAR as CAST, RESIZE_BILINEAR of the stored integers in float32, + 0.5, CAST "
                  "(LiteRT rounds the blend to nearest; NNAPI's quantized kernel truncates)")
        return
    if bilinear and x_type.type in _QUANT8:
        # int8: LiteRT's builtin kernel blends in fixed point and rounds to nearest, XNNPACK
        # its own way; NNAPI's truncation toward zero pulled values toward 0. The blend of
        # the real values in float32 and one QUANTIZE (round to nearest) is unbiased.
        _in_float32(c, op, emit)
        c.lowered("int8 RESIZE_BILINEAR as DEQUANTIZE, RESIZE_BILINEAR in float32, QUANTIZE (LiteRT rounds "
                  "the blend to nearest; NNAPI's quantized kernel truncates)")
        return
    emit([c.input(0)], c.output())


@_converter("SPACE_TO_DEPTH", "DEPTH_TO_SPACE")
def _space_depth(c: _Converter, op: _Operator) -> None:
    s2d = op.name == "SPACE_TO_DEPTH"
    options = op.options("SpaceToDepthOptions" if s2d else "DepthToSpaceOptions")
    code = Op.SPACE_TO_DEPTH if s2d else Op.DEPTH_TO_SPACE
    c.emit(code, [c.input(0), c.i32(options.BlockSize()), c.boolean(False)], [c.output()])


@_converter("SPACE_TO_BATCH_ND")
def _space_to_batch(c: _Converter, op: _Operator) -> None:
    paddings = c.const_values(2, "paddings").astype(np.int32)
    c.emit(Op.SPACE_TO_BATCH_ND, [c.input(0), c.vector(c.const_values(1, "block shape")),
                                  c.const_operand(paddings, OperandType(T.TENSOR_INT32, list(paddings.shape)))],
           [c.output()])


@_converter("BATCH_TO_SPACE_ND")
def _batch_to_space(c: _Converter, op: _Operator) -> None:
    if len(op.tensor(0).shape) != 4:
        raise UnsupportedOperator(f"BATCH_TO_SPACE_ND of a rank-{len(op.tensor(0).shape)} tensor (NNAPI's takes "
                                  "rank 4)")
    block = c.vector(c.const_values(1, "block shape"))
    crops = c.const_values(2, "crops").astype(np.int64) if op.has_input(2) else np.zeros((2, 2), np.int64)
    if not crops.any():
        c.emit(Op.BATCH_TO_SPACE_ND, [c.input(0), block, c.boolean(False)], [c.output()])
        return
    out_type = c.nn_type(op.out_tensor())
    shape = list(out_type.dimensions)
    full = [shape[0], shape[1] + int(crops[0].sum()), shape[2] + int(crops[1].sum()), shape[3]]
    temp = c.temp(out_type, full)
    c.emit(Op.BATCH_TO_SPACE_ND, [c.input(0), block, c.boolean(False)], [temp])
    c.emit(Op.SLICE, [temp, c.vector([0, int(crops[0, 0]), int(crops[1, 0]), 0]), c.vector(shape)], [c.output()])
    c.lowered("BATCH_TO_SPACE_ND with crops: NNAPI has none, so BATCH_TO_SPACE_ND + SLICE")
