"""nnapi-ort-cpu's requantization between a QUANTIZE and a DEQUANTIZE (QuantizeLinear >
DequantizeLinear > QuantizeLinear > DequantizeLinear in the lowered graph): each rounds to
the model's own grid, as the reference does. ORT's DoubleQDQPairsRemover, which replaces
the four by one pair of a third scale, is disabled in the device's sessions and probes."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

import nnapi  # noqa: E402
from helpers import constant, lowered_node_types, operand_adder, reference_device, run_on  # noqa: E402
from nnapi import OperandCode as T  # noqa: E402
from nnapi import OperationCode as Op  # noqa: E402

pytestmark = pytest.mark.usefixtures("calibration_file")


def _ort_device() -> nnapi.Device:
    return next(device for device in nnapi.get_devices() if device.name == "nnapi-ort-cpu")


def _requantization(square: bool, final: str) -> nnapi.Model:
    """int8 x (scale 0.00383, zero point 66) DEQUANTIZEd, squared or not, QUANTIZEd to int8
    (0.00235, 10), DEQUANTIZEd and QUANTIZEd to uint8 (0.00215, 69), then DEQUANTIZEd
    (``final`` "dequantize") or through a quantized LOGISTIC ("logistic"), as the importer
    writes an int8 SQUARED_DIFFERENCE > QUANTIZE to uint8 > LOGISTIC."""
    model = nnapi.Model()
    operand = operand_adder(model)
    x = operand(T.TENSOR_QUANT8_ASYMM_SIGNED, [256], scale=0.0038283916655927896, zero_point=66)
    real = operand(T.TENSOR_FLOAT32, [256])
    model.add_operation(Op.DEQUANTIZE, [x], [real])
    if square:
        squared = operand(T.TENSOR_FLOAT32, [256])
        model.add_operation(Op.MUL, [real, real, constant(model, T.INT32, np.int32(0))], [squared])
        real = squared
    first = operand(T.TENSOR_QUANT8_ASYMM_SIGNED, [256], scale=0.0023505704011768103, zero_point=10)
    between = operand(T.TENSOR_FLOAT32, [256])
    second = operand(T.TENSOR_QUANT8_ASYMM, [256], scale=0.002146061509847641, zero_point=69)
    model.add_operation(Op.QUANTIZE, [real], [first])
    model.add_operation(Op.DEQUANTIZE, [first], [between])
    model.add_operation(Op.QUANTIZE, [between], [second])
    if final == "dequantize":
        y = operand(T.TENSOR_FLOAT32, [256])
        model.add_operation(Op.DEQUANTIZE, [second], [y])
    else:
        y = operand(T.TENSOR_QUANT8_ASYMM, [256], scale=1 / 256, zero_point=0)
        model.add_operation(Op.LOGISTIC, [second], [y])
    model.identify_inputs_and_outputs([x], [y])
    model.finish()
    return model


@pytest.mark.parametrize("square", [True, False])
@pytest.mark.parametrize("final", ["dequantize", "logistic"])
def test_a_requantization_between_quantize_and_dequantize_rounds_to_the_models_grids(square, final):
    model = _requantization(square, final)
    x = np.arange(-128, 128, dtype=np.int8)
    dtype = np.float32 if final == "dequantize" else np.uint8
    expected = run_on(model, reference_device(), [x], [np.zeros(256, dtype)])[0]
    got = run_on(model, _ort_device(), [x], [np.zeros(256, dtype)])[0]
    np.testing.assert_array_equal(got, expected)
    # many values, not one saturated one: x spans the first quantization's range and past it
    assert len(np.unique(expected)) >= 16


def test_the_squared_requantization_lowers_to_the_four_node_pattern():
    """The graph holds the pattern ORT's optimizer would rewrite (else the test above
    checks nothing of it)."""
    types = lowered_node_types(_requantization(True, "dequantize"))
    assert types[-4:] == ["QuantizeLinear", "DequantizeLinear", "QuantizeLinear", "DequantizeLinear"]
