"""nnapi-ort-cpu's quantized L2_NORMALIZATION: the reference's fixed point (Android's
kernels: an int32 sum of squares, its inverse square root by Newton's iteration in
gemmlowp Q3.28 looked up from tables made at preparation, the rescale rounding twice) in
exact integer operators, bit for bit the reference's values; declined where the sums of
squares could pass the tables."""

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

pytestmark = pytest.mark.usefixtures("calibration_file")


def _model(code: T, shape: list[int], scale: float, zero_point: int, axis: int | None) -> nnapi.Model:
    model = nnapi.Model()
    x = model.add_operand(OperandType(code, shape, scale, zero_point))
    inputs = [x]
    if axis is not None:
        a = model.add_operand(OperandType(T.INT32))
        model.set_operand_value(a, np.int32(axis))
        inputs.append(a)
    y = model.add_operand(OperandType(code, shape, 1 / 128, 128 if code == T.TENSOR_QUANT8_ASYMM else 0))
    model.add_operation(Op.L2_NORMALIZATION, inputs, [y])
    model.identify_inputs_and_outputs([x], [y])
    model.finish()
    return model


def test_quantized_l2_normalization_rounds_as_the_fixed_point(ort_device):
    # offsets [1, 20]: Android's uint8 kernel gives 7 (128 / sqrt(401) = 6.39 rounded twice,
    # 12.78 -> 13 -> 6.5 -> 7) and 128 + 128 saturated at 255 (tests/test_quantized_fixed_point_ops.py)
    model = _model(T.TENSOR_QUANT8_ASYMM, [1, 2], 0.1, 128, None)
    assert "Gather" in lowered_node_types(model)
    feed = np.array([[129, 148]], np.uint8)
    out = run_on(model, ort_device, [feed], [np.zeros_like(feed)])[0]
    np.testing.assert_array_equal(out, [[135, 255]])


@pytest.mark.parametrize("code", [T.TENSOR_QUANT8_ASYMM, T.TENSOR_QUANT8_ASYMM_SIGNED])
@pytest.mark.parametrize("axis", [None, 0, 1, 2])
def test_quantized_l2_normalization_equals_the_reference(ort_device, code, axis):
    rng = np.random.default_rng(6)
    low = -128 if code == T.TENSOR_QUANT8_ASYMM_SIGNED else 0
    dtype = np.int8 if low else np.uint8
    for length in (1, 2, 3, 8, 16):
        shape = [4, 5, length] if axis in (None, 2) else [length, 5, 7] if axis == 0 else [4, length, 7]
        # (16 elements: the table holds sums of up to 16 * 128**2, a zero point of 128 or 127)
        zero_point = (128 if length == 16 else int(rng.integers(100, 156))) + low
        model = _model(code, shape, float(np.float32(10 ** rng.uniform(-3, 0))), zero_point, axis)
        feed = rng.integers(low, low + 256, size=shape).astype(dtype)
        ours, theirs = (run_on(model, device, [feed], [np.zeros_like(feed)])[0]
                        for device in (ort_device, reference_device()))
        np.testing.assert_array_equal(ours, theirs, err_msg=f"{length} {zero_point}")


def test_quantized_l2_normalization_of_long_vectors_is_declined(ort_device):
    # 64 offsets of up to 128: sums of squares up to 2**20, past the 2**18-entry tables
    assert _model(T.TENSOR_QUANT8_ASYMM, [2, 64], 0.1, 128, None).get_supported_operations_for_devices(
        [ort_device]) == [False]
    assert _model(T.TENSOR_QUANT8_ASYMM, [2, 8], 0.1, 128, None).get_supported_operations_for_devices(
        [ort_device]) == [True]


@pytest.mark.parametrize("code, axis", [(T.TENSOR_QUANT8_ASYMM, None), (T.TENSOR_QUANT8_ASYMM_SIGNED, None),
                                        (T.TENSOR_QUANT8_ASYMM_SIGNED, 0)])
def test_quantized_l2_normalization_of_every_pair_equals_the_reference(ort_device, code, axis):
    """Every pair of stored values as a vector of two: two tables, the multiplier (with the
    factor before the high multiply: int8 along the last axis) and the power after it (a
    factor of 128 is folded into the high multiply's shift, not looked up); the reference's
    values on all 65,536."""
    low = -128 if code == T.TENSOR_QUANT8_ASYMM_SIGNED else 0
    dtype = np.int8 if low else np.uint8
    stored = (np.arange(256) + low).astype(dtype)
    pairs = np.stack(np.meshgrid(stored, stored, indexing="ij"), axis=-1).reshape(-1, 2)
    if axis == 0:
        pairs = np.ascontiguousarray(pairs.T)
    model = _model(code, list(pairs.shape), 0.02, 128 + low, axis)
    assert lowered_node_types(model).count("Gather") == 2
    ours, theirs = (run_on(model, device, [pairs], [np.zeros_like(pairs)])[0]
                    for device in (ort_device, reference_device()))
    np.testing.assert_array_equal(ours, theirs)
    assert len(np.unique(theirs)) > 200
