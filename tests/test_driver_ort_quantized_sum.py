"""nnapi-ort-cpu's quantized FULLY_CONNECTED of one unit whose weights are all one value
(the TFLite importer's MEAN into another quantization): each row's int32 sum and a Gather
from the reference's output stage of every possible sum, bit for bit the reference's values
where QLinearConv's float rescale (one rounding, half to even) is not."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

import nnapi  # noqa: E402
from helpers import lowered_node_types, operand_adder, reference_device, run_on  # noqa: E402
from nnapi import OperandCode as T  # noqa: E402
from nnapi import OperationCode as Op  # noqa: E402
from nnapi.operations.quant_math import OutputStage, quantize_multiplier  # noqa: E402

pytestmark = pytest.mark.usefixtures("calibration_file")


def _sum_model(code: T, rows: int, depth: int, x_quant, weight, w_quant, out_quant, fuse: int = 0) -> nnapi.Model:
    model = nnapi.Model()
    operand = operand_adder(model)
    x = operand(code, [rows, depth], scale=x_quant[0], zero_point=x_quant[1])
    dtype = np.uint8 if code == T.TENSOR_QUANT8_ASYMM else np.int8
    w = operand(code, [1, depth], np.full((1, depth), weight, dtype), scale=w_quant[0], zero_point=w_quant[1])
    bias_scale = float(np.float32(x_quant[0]) * np.float32(w_quant[0]))
    b = operand(T.TENSOR_INT32, [1], np.zeros(1, np.int32), scale=bias_scale)
    act = operand(T.INT32, None, np.int32(fuse))
    y = operand(code, [rows, 1], scale=out_quant[0], zero_point=out_quant[1])
    model.add_operation(Op.FULLY_CONNECTED, [x, w, b, act], [y])
    model.identify_inputs_and_outputs([x], [y])
    model.finish()
    return model


def test_sum_by_ones_is_the_references_fixed_point(ort_device):
    # 12 values of scale 0.5 summed into scale 0.25 by weights 1 of scale float32(1/12): the
    # multiplier (1431655808, -2), 1/6 + 3e-9. Sums 3 and 15 are 0.5 and 2.5 a hair above:
    # the fixed point gives 1 and 3, where QLinearConv's float32 product is exactly 0.5 / 2.5
    # and rounds to even (0, 2)
    model = _sum_model(T.TENSOR_QUANT8_ASYMM, 2, 12, (0.5, 10), 1, (float(np.float32(1 / 12)), 0), (0.25, 0))
    types = lowered_node_types(model)
    assert "Gather" in types and "MatMulInteger" in types and "QLinearConv" not in types
    x = np.full((2, 12), 10, np.uint8)
    x[0, :3] = 11  # sum of q - 10: 3
    x[1, :7], x[1, 7] = 12, 11  # 15
    ours, theirs = (run_on(model, device, [x], [np.zeros((2, 1), np.uint8)])[0]
                    for device in (ort_device, reference_device()))
    np.testing.assert_array_equal(ours, theirs)
    m, shift = quantize_multiplier(float(np.float32(0.5) * np.float32(1 / 12)) / 0.25)
    stage = OutputStage(m, shift, None, 0, 0, 255, np.uint8)
    np.testing.assert_array_equal(theirs.reshape(-1), stage(np.array([3, 15])))
    np.testing.assert_array_equal(theirs.reshape(-1), [1, 3])


@pytest.mark.parametrize("code", [T.TENSOR_QUANT8_ASYMM, T.TENSOR_QUANT8_ASYMM_SIGNED])
def test_sum_by_table_equals_the_reference_on_random_rows(ort_device, code):
    rng = np.random.default_rng(4)
    low, high = (0, 255) if code == T.TENSOR_QUANT8_ASYMM else (-128, 127)
    dtype = np.uint8 if code == T.TENSOR_QUANT8_ASYMM else np.int8
    for case in range(12):
        depth = int(rng.choice([3, 12, 35, 49, 81]))
        x_quant = (float(np.float32(10 ** rng.uniform(-2, 0))), int(rng.integers(low, high + 1)))
        out_quant = (float(np.float32(10 ** rng.uniform(-2, 0))), int(rng.integers(low, high + 1)))
        w_quant = (float(np.float32(10 ** rng.uniform(-3, -1))), int(rng.integers(low, 0 if low else 100)))
        weight = w_quant[1] + int(rng.integers(1, 20))
        fuse = case % 4
        model = _sum_model(code, 64, depth, x_quant, weight, w_quant, out_quant, fuse)
        x = rng.integers(low, high + 1, size=(64, depth)).astype(dtype)
        ours, theirs = (run_on(model, device, [x], [np.zeros((64, 1), dtype)])[0]
                        for device in (ort_device, reference_device()))
        np.testing.assert_array_equal(ours, theirs, err_msg=f"{depth} {x_quant} {w_quant} {weight} {out_quant}")


def _mean_model(code: T, dims: list[int], x_quant, w_scale: float, out_quant, read_transpose: bool) -> nnapi.Model:
    """The importer's MEAN over height and width into another quantization: TRANSPOSE to
    [N, C, H, W], FULLY_CONNECTED by ones, RESHAPE to [N, C] (and, with ``read_transpose``,
    the TRANSPOSE's value as a second output)."""
    n, h, w, c = dims
    model = nnapi.Model()
    operand = operand_adder(model)
    dtype = np.uint8 if code == T.TENSOR_QUANT8_ASYMM else np.int8
    x = operand(code, dims, scale=x_quant[0], zero_point=x_quant[1])
    perm = operand(T.TENSOR_INT32, [4], np.array([0, 3, 1, 2], np.int32))
    moved = operand(code, [n, c, h, w], scale=x_quant[0], zero_point=x_quant[1])
    model.add_operation(Op.TRANSPOSE, [x, perm], [moved])
    ones = operand(code, [1, h * w], np.ones((1, h * w), dtype), scale=w_scale, zero_point=0)
    bias_scale = float(np.float32(x_quant[0]) * np.float32(w_scale))
    bias = operand(T.TENSOR_INT32, [1], np.zeros(1, np.int32), scale=bias_scale)
    act = operand(T.INT32, None, np.int32(0))
    summed = operand(code, [n * c, 1], scale=out_quant[0], zero_point=out_quant[1])
    model.add_operation(Op.FULLY_CONNECTED, [moved, ones, bias, act], [summed])
    shape = operand(T.TENSOR_INT32, [2], np.array([n, c], np.int32))
    y = operand(code, [n, c], scale=out_quant[0], zero_point=out_quant[1])
    model.add_operation(Op.RESHAPE, [summed, shape], [y])
    model.identify_inputs_and_outputs([x], [y, moved] if read_transpose else [y])
    model.finish()
    return model


@pytest.mark.parametrize("code", [T.TENSOR_QUANT8_ASYMM, T.TENSOR_QUANT8_ASYMM_SIGNED])
@pytest.mark.parametrize("read_transpose", [False, True])
def test_mean_after_transpose_sums_in_the_inputs_layout(ort_device, code, read_transpose):
    # the row sums come from the [N, H * W, C] value itself (no Transpose run unless another
    # reader needs it), the same integers as the transposed rows' sums
    rng = np.random.default_rng(7)
    low, high = (0, 255) if code == T.TENSOR_QUANT8_ASYMM else (-128, 127)
    dtype = np.uint8 if code == T.TENSOR_QUANT8_ASYMM else np.int8
    for dims in ([1, 5, 7, 16], [2, 3, 4, 5], [1, 1, 9, 3]):
        x_quant = (float(np.float32(10 ** rng.uniform(-2, 0))), int(rng.integers(low, high + 1)))
        out_quant = (float(np.float32(10 ** rng.uniform(-2, 0))), int(rng.integers(low, high + 1)))
        w_scale = float(np.float32(1 / (dims[1] * dims[2]) * rng.uniform(0.5, 2)))
        model = _mean_model(code, dims, x_quant, w_scale, out_quant, read_transpose)
        types = lowered_node_types(model)
        assert "Gather" in types and types.count("MatMulInteger") == 1 and "QLinearConv" not in types
        assert ("Transpose" in types) == read_transpose
        x = rng.integers(low, high + 1, size=dims).astype(dtype)
        outputs = [np.zeros((dims[0], dims[3]), dtype)]
        if read_transpose:
            outputs.append(np.zeros((dims[0], dims[3], dims[1], dims[2]), dtype))
        ours, theirs = (run_on(model, device, [x], [o.copy() for o in outputs])
                        for device in (ort_device, reference_device()))
        for mine, reference in zip(ours, theirs):
            np.testing.assert_array_equal(mine, reference, err_msg=f"{dims} {x_quant} {w_scale} {out_quant}")
