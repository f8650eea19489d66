"""TFLite import: the custom TFLite_Detection_PostProcess operator.
"""

from __future__ import annotations

import numpy as np

from nnapi.codes import OperandCode as T
from nnapi.codes import OperationCode as Op
from nnapi.importers.tflite.converter import _CUSTOM_CONVERTERS, _Converter, _dequantize_const
from nnapi.importers.tflite.reader import _FLOAT32, _QUANT8, UnsupportedOperator, _Operator
from nnapi.operand import OperandType


def _float_input(c: _Converter, op: _Operator, position: int) -> int:
    """Input ``position`` as float32: a quantized constant dequantized once here, a
    quantized run-time tensor through DEQUANTIZE (exact: what TFLite's kernel reads)."""
    tensor = op.inputs[position]
    const = c.const_of(tensor) if tensor not in c.operands else None
    if const is not None and const.code != T.TENSOR_FLOAT32:
        c.consts[tensor] = _dequantize_const(op.tensor(position), const)
    x = c.operand(tensor)
    x_type = c.type_of(x)
    if x_type.type == T.TENSOR_FLOAT32:
        return x
    if x_type.type not in _QUANT8:
        raise UnsupportedOperator(f"input {position} is {x_type.type.name}; float32 or 8-bit quantized expected")
    real = c.temp(OperandType(T.TENSOR_FLOAT32, x_type.dimensions))
    c.emit(Op.DEQUANTIZE, [x], [real])
    return real


def _detection_postprocess(c: _Converter, op: _Operator) -> None:
    """TFLite's custom ``TFLite_Detection_PostProcess`` (the SSD models' anchor decoding
    and NMS) as DETECTION_POSTPROCESSING, which was made for it (TFLite's NNAPI delegate
    maps it the same way). Options are a FlexBuffer map. TFLite reads box encodings,
    class predictions, anchors (8-bit quantized ones dequantized) and writes boxes,
    classes, scores and the count, all float32; NNAPI takes scores first, writes scores,
    boxes, int32 classes and an int32 count: the classes and count go through CAST. Class
    predictions carry the background as column 0 when they have one column more than
    num_classes (is_bg_in_label false: the labels come out from 0 for the first real
    class); with exactly num_classes columns a zero background column is padded in front."""
    from flatbuffers import flexbuffers

    raw = op.raw.CustomOptionsAsNumpy().tobytes() if op.raw.CustomOptionsLength() else b""
    try:
        options = flexbuffers.Loads(raw)
    except Exception as error:  # a malformed FlexBuffer surfaces as struct / index errors
        raise UnsupportedOperator(f"custom options are not a FlexBuffer map ({type(error).__name__})") from None
    if not isinstance(options, dict):
        raise UnsupportedOperator("custom options are not a FlexBuffer map")

    def option(name: str, kind: type, default=None):
        value = options.get(name, default)
        if value is None:
            raise UnsupportedOperator(f"custom option '{name}' is missing")
        return kind(value)

    max_detections = option("max_detections", int)
    per_detection = option("max_classes_per_detection", int)
    per_class = option("detections_per_class", int, 100)
    regular = option("use_regular_nms", bool, False)
    num_classes = option("num_classes", int)
    scales = [option(name, float) for name in ("y_scale", "x_scale", "h_scale", "w_scale")]
    score_threshold = option("nms_score_threshold", float)
    iou_threshold = option("nms_iou_threshold", float)
    if len(op.inputs) != 3 or len(op.outputs) != 4:
        raise UnsupportedOperator(f"takes 3 inputs and gives 4 outputs; got {len(op.inputs)} and {len(op.outputs)}")
    if min(max_detections, per_detection, per_class, num_classes) <= 0:
        raise UnsupportedOperator("max_detections, max_classes_per_detection, detections_per_class and "
                                  "num_classes must be positive")
    boxes_in, predictions, anchors = (_float_input(c, op, i) for i in range(3))
    pred_type = c.type_of(predictions)
    if pred_type.rank != 3 or pred_type.dimensions[2] not in (num_classes, num_classes + 1):
        raise UnsupportedOperator(f"class predictions {list(pred_type.dimensions)} need num_classes "
                                  f"({num_classes}) or one more columns")
    if pred_type.dimensions[2] == num_classes:  # no background column: NNAPI's class 0 is one
        padded = c.temp(pred_type, [pred_type.dimensions[0], pred_type.dimensions[1], num_classes + 1])
        c.emit(Op.PAD, [predictions, c.const_operand(np.array([[0, 0], [0, 0], [1, 0]], np.int32),
                                                     OperandType(T.TENSOR_INT32, [3, 2]))], [padded])
        predictions = padded
    batches = pred_type.dimensions[0]
    slots = max_detections * per_detection  # TFLite's output size in both modes
    if regular and per_detection != 1:
        raise UnsupportedOperator("regular NMS with max_classes_per_detection > 1: TFLite's outputs hold "
                                  "max_detections * max_classes_per_detection slots, NNAPI's max_detections")
    if per_detection > num_classes:
        raise UnsupportedOperator(f"max_classes_per_detection {per_detection} above num_classes {num_classes}: "
                                  "TFLite pads each box's classes with dummies, NNAPI packs them")
    shapes = ([batches, slots, 4], [batches, slots], [batches, slots], [batches])
    for position, shape in enumerate(shapes):
        info = op.out_tensor(position)
        if info.tfl_type != _FLOAT32:
            raise UnsupportedOperator(f"output {position} is {info.type_name}; TFLite's kernel writes float32")
        info.shape = tuple(shape)  # TFLite sizes these at Prepare; the file may leave them empty
    classes = c.temp(OperandType(T.TENSOR_INT32, shapes[1]))
    count = c.temp(OperandType(T.TENSOR_INT32, shapes[3]))
    boxes_out, scores_out = c.output(0), c.output(2)
    c.emit(Op.DETECTION_POSTPROCESSING,
           [predictions, boxes_in, anchors, *(c.f32(v) for v in scales), c.boolean(regular), c.i32(max_detections),
            c.i32(per_detection), c.i32(per_class), c.f32(score_threshold), c.f32(iou_threshold),
            c.boolean(False)], [scores_out, boxes_out, classes, count])
    c.emit(Op.CAST, [classes], [c.output(1)])
    c.detections.append(tuple(op.outputs[:4]))
    reason = "TFLite_Detection_PostProcess as DETECTION_POSTPROCESSING, its int32 classes and count CAST to " \
             "TFLite's float32"
    if regular or per_detection == 1:
        c.emit(Op.CAST, [count], [c.output(3)])
    else:  # NNAPI counts the (box, class) slots filled, TFLite the boxes: an exact division
        slots_filled = c.temp(OperandType(T.TENSOR_FLOAT32, shapes[3]))
        c.emit(Op.CAST, [count], [slots_filled])
        per_box = c.const_operand(np.array([per_detection], np.float32), OperandType(T.TENSOR_FLOAT32, [1]))
        c.emit(Op.DIV, [slots_filled, per_box, c.i32(0)], [c.output(3)])
        reason += f"; the count of (box, class) slots divided by {per_detection} (TFLite counts boxes)"
    if pred_type.dimensions[2] == num_classes:
        reason += "; class predictions without a background column: one padded in front"
    c.lowered(reason)


_CUSTOM_CONVERTERS["TFLite_Detection_PostProcess"] = _detection_postprocess
