"""A QUANTIZE of a DEQUANTIZEd 8-bit tensor (the importer's requantizing QUANTIZE) in two
nodes at most, proven equal to the reference at preparation.

The TFLite importer writes a requantizing QUANTIZE (8-bit in, 8-bit out) as DEQUANTIZE +
QUANTIZE: a model's uint8 input or output around an int8 graph (yolov5's TF export,
MobileNet's uint8 I/O), or the alignment of CONCATENATION inputs to one quantization
(YOLOv8's class scores, 1/256 after their LOGISTIC, into the detections' scale). The general
lowering rounds the float values halves away from zero as the reference does (Div, Abs,
Floor, Sign or Clip, Mul, QuantizeLinear): ~0.3 ms over a 320x320x3 image, ~0.5 ms over
yolov5's [1, 6300, 85] detections, ~0.15 ms over YOLOv8's [1, 80, 2100] scores. Here:

- one scale on both sides: the reference computes round((q - z) * s / s) + z' in float32,
  which is (q - z) + z' exactly (the two roundings move (q - z) by at most 255 * 2**-23
  relative, far from the next half). Where the internal zero points agree too (int8 <->
  uint8 of zero points 128 apart: this driver holds int8 as uint8 + 128) ``lower_quantize``
  itself passes the stored values on; otherwise a DequantizeLinear / QuantizeLinear pair
  of scale 1 (integers, exact, saturated);
- other scales: DequantizeLinear / QuantizeLinear of the two quantizations, where ONNX
  Runtime's QuantizeLinear (halves to even) gives the reference's result on all 256 stored
  values: it differs only on an exact half, which most scale pairs never produce (none of
  206 random pairs did; a ratio of 0.5 does).

The reference's own DEQUANTIZE and QUANTIZE run once on all 256 stored values per
quantization pair (cached), the second form in ONNX Runtime beside them; anything that
differs keeps the general lowering.
"""

from __future__ import annotations

import functools

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from nnapi.codes import OperandCode, OperationCode
from nnapi.drivers.ort.builder import QUANT8, GraphBuilder, internal_zero_point, lowers, probe_outputs
from nnapi.drivers.ort.quantization import lower_quantize
from nnapi.hal import Operation
from nnapi.operand import OperandType
from nnapi.operations import ExecutionContext, Tensor, get_operation

T = OperandCode


@lowers(OperationCode.QUANTIZE)
def lower_requantizing_quantize(g: GraphBuilder, operation: Operation) -> None:
    """QUANTIZE of a float32 DEQUANTIZE of an 8-bit tensor as above; otherwise
    ``quantization.lower_quantize``."""
    source = g.dequantized.get(operation.inputs[0])
    output = g.operand(operation.outputs[0])
    same_scale = source is not None and np.float32(source.scale) == np.float32(output.scale)
    if source is None or output.type not in QUANT8 or (same_scale and source.zero_point == internal_zero_point(output)):
        lower_quantize(g, operation)  # one quantization: it passes the stored values on
        return
    key = (float(source.scale), int(source.zero_point), int(output.type), float(output.scale),
           int(output.zero_point))
    zero_from, zero_to = int(source.zero_point), internal_zero_point(output)
    if same_scale and _shift_proven(*key, zero_to):
        scale_from = scale_to = 1.0
    elif _pair_proven(*key, zero_to):
        scale_from, scale_to = source.scale, output.scale
    else:
        lower_quantize(g, operation)
        return
    real = g.one("DequantizeLinear", [source.name, g.constant(np.array(scale_from, np.float32)),
                                      g.constant(np.array(zero_from, np.uint8))])
    g.set_output(operation.outputs[0], g.one("QuantizeLinear", [
        real, g.constant(np.array(scale_to, np.float32)), g.constant(np.array(zero_to, np.uint8))]))


_INTERNAL = np.arange(256, dtype=np.uint8)


@functools.cache
def _reference(scale: float, zero_point: int, output_code: int, output_scale: float,
               output_zero_point: int) -> np.ndarray:
    """The reference's DEQUANTIZE (float32) then QUANTIZE of every internal value of a source
    of ``scale`` and internal ``zero_point`` (as uint8: the same real values as its int8
    form), in the output's internal encoding."""
    source = Tensor(T.TENSOR_QUANT8_ASYMM, (256,), scale, zero_point, None, _INTERNAL)
    real = get_operation(OperationCode.DEQUANTIZE).execute(
        ExecutionContext(OperationCode.DEQUANTIZE, [source], [OperandType(T.TENSOR_FLOAT32, [256])]))[0]
    output = OperandType(output_code, [256], output_scale, output_zero_point)
    stored = get_operation(OperationCode.QUANTIZE).execute(ExecutionContext(
        OperationCode.QUANTIZE, [Tensor(T.TENSOR_FLOAT32, (256,), 0.0, 0, None, real)], [output]))[0]
    if output_code == T.TENSOR_QUANT8_ASYMM_SIGNED:
        return stored.view(np.uint8) ^ np.uint8(0x80)
    return stored.view(np.uint8)


@functools.cache
def _shift_proven(scale: float, zero_point: int, output_code: int, output_scale: float,
                  output_zero_point: int, internal_output_zero_point: int) -> bool:
    """Whether the reference's result is the shift u - zero_point + the output's internal
    zero point, saturated, on every internal value."""
    shifted = np.clip(_INTERNAL.astype(np.int64) - zero_point + internal_output_zero_point, 0, 255)
    return bool(np.array_equal(_reference(scale, zero_point, output_code, output_scale, output_zero_point), shifted))


@functools.cache
def _pair_proven(scale: float, zero_point: int, output_code: int, output_scale: float,
                 output_zero_point: int, internal_output_zero_point: int) -> bool:
    """Whether ONNX Runtime's DequantizeLinear / QuantizeLinear of the two quantizations
    gives the reference's result on every internal value."""
    initializers = [numpy_helper.from_array(np.array(scale, np.float32), "s"),
                    numpy_helper.from_array(np.array(zero_point, np.uint8), "z"),
                    numpy_helper.from_array(np.array(output_scale, np.float32), "os"),
                    numpy_helper.from_array(np.array(internal_output_zero_point, np.uint8), "oz")]
    graph = helper.make_graph(
        [helper.make_node("DequantizeLinear", ["x", "s", "z"], ["real"]),
         helper.make_node("QuantizeLinear", ["real", "os", "oz"], ["y"])], "probe",
        [helper.make_tensor_value_info("x", TensorProto.UINT8, [256])],
        [helper.make_tensor_value_info("y", TensorProto.UINT8, [256])], initializers)
    try:
        outputs = probe_outputs(graph, {"x": _INTERNAL})
    except ImportError:  # lowering without a runtime: the general lowering
        return False
    if not outputs:  # a runtime that refuses the probe: the general lowering
        return False
    return bool(np.array_equal(outputs[0], _reference(scale, zero_point, output_code, output_scale,
                                                      output_zero_point)))
