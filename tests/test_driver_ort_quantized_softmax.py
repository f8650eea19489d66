"""nnapi-ort-cpu's quantized SOFTMAX over two classes (drivers/ort/quantized_softmax.py): the
logistic of the stored values' difference, proven at preparation on every pair of stored
values, equals the reference bit for bit; what the proof refuses or the form does not
cover keeps ONNX's Softmax."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

import nnapi  # noqa: E402
from helpers import lowered_node_types, reference_device, run_on  # noqa: E402
from nnapi import OperandCode as T  # noqa: E402
from nnapi import OperandType  # noqa: E402
from nnapi import OperationCode as Op  # noqa: E402
from nnapi.drivers.ort import quantized_softmax  # noqa: E402
from nnapi.operand import dtype_of  # noqa: E402

pytestmark = pytest.mark.usefixtures("calibration_file")

_OUTPUT_ZERO_POINT = {T.TENSOR_QUANT8_ASYMM: 0, T.TENSOR_QUANT8_ASYMM_SIGNED: -128}


def _softmax_model(code, shape, scale, zero_point, beta, axis=None) -> nnapi.Model:
    model = nnapi.Model()
    x = model.add_operand(OperandType(code, shape, scale, zero_point))
    beta_index = model.add_operand(OperandType(T.FLOAT32))
    model.set_operand_value(beta_index, np.float32(beta))
    inputs = [x, beta_index]
    if axis is not None:
        axis_index = model.add_operand(OperandType(T.INT32))
        model.set_operand_value(axis_index, np.int32(axis))
        inputs.append(axis_index)
    y = model.add_operand(OperandType(code, shape, 1 / 256, _OUTPUT_ZERO_POINT[code]))
    model.add_operation(Op.SOFTMAX, inputs, [y])
    model.identify_inputs_and_outputs([x], [y])
    model.finish()
    return model


def _run(model: nnapi.Model, device: nnapi.Device, value: np.ndarray) -> np.ndarray:
    return run_on(model, device, [value], [np.zeros_like(value)])[0]


def _all_pairs(code) -> np.ndarray:
    """Every pair of stored values, as [1, 256, 256, 2]."""
    stored = np.arange(256).astype(np.uint8).view(dtype_of(code))
    return np.stack(np.meshgrid(stored, stored, indexing="ij"), -1)[None]


@pytest.mark.parametrize("code", [T.TENSOR_QUANT8_ASYMM, T.TENSOR_QUANT8_ASYMM_SIGNED])
@pytest.mark.parametrize(("scale", "zero_point", "beta", "axis"), [
    (0.0625, 3, 1.0, None), (0.3, 100, 1.0, -1), (0.0123, 0, 0.5, 3), (1.7, 17, 2.0, None)])
def test_two_classes_are_a_logistic_equal_to_the_reference(ort_device, code, scale, zero_point, beta, axis):
    """Every pair of stored values gives the reference's probabilities bit for bit, through
    Sigmoid and no Softmax."""
    zero_point = zero_point - 128 if code == T.TENSOR_QUANT8_ASYMM_SIGNED else zero_point
    value = _all_pairs(code)
    model = _softmax_model(code, list(value.shape), scale, zero_point, beta, axis)
    types = lowered_node_types(model)
    assert "Sigmoid" in types and "Softmax" not in types
    ours, theirs = _run(model, ort_device, value), _run(model, reference_device(), value)
    np.testing.assert_array_equal(ours, theirs)
    assert len(np.unique(ours)) >= 5  # not a constant


def test_a_probe_that_differs_keeps_softmax(ort_device, monkeypatch):
    """A logistic factor 1% off (as a runtime whose nodes computed otherwise would give)
    fails the proof on some pair, and the lowering keeps ONNX's Softmax."""
    code = T.TENSOR_QUANT8_ASYMM
    model = _softmax_model(code, [1, 256, 256, 2], 0.05, 128, 1.0)
    exact = quantized_softmax._factor
    monkeypatch.setattr(quantized_softmax, "_factor", lambda scale, beta: np.float32(exact(scale, beta) * 1.01))
    quantized_softmax._proven.cache_clear()
    try:
        assert not quantized_softmax._proven((int(code), 0.05, 128), 1.0, (int(code), 1 / 256, 0))
        types = lowered_node_types(model)
    finally:
        quantized_softmax._proven.cache_clear()
    assert "Softmax" in types and "Sigmoid" not in types
    value = _all_pairs(code)
    ours, theirs = _run(model, ort_device, value), _run(model, reference_device(), value)
    assert np.abs(ours.astype(int) - theirs).max() <= 1


@pytest.mark.parametrize(("shape", "axis"), [([2, 5, 3], -1), ([4, 2, 3], 1)])
def test_other_class_counts_and_axes_keep_softmax(ort_device, shape, axis):
    """Three classes, or two along an inner axis: ONNX's Softmax, within a step of the
    reference."""
    code = T.TENSOR_QUANT8_ASYMM
    model = _softmax_model(code, shape, 0.1, 128, 1.0, axis)
    assert "Softmax" in lowered_node_types(model)
    value = np.random.default_rng(3).integers(0, 256, shape).astype(np.uint8)
    ours, theirs = _run(model, ort_device, value), _run(model, reference_device(), value)
    assert np.abs(ours.astype(int) - theirs).max() <= 1
