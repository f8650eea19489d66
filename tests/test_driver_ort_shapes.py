"""nnapi-ort-cpu with temporaries declared with unknown dimensions: the shapes the
reference's ``prepare`` gives from known input shapes and constants are filled in before
lowering (drivers/ort/shapes.py); shapes that need a value computed at run time stay unknown."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

import nnapi  # noqa: E402
from nnapi import OperandCode as T  # noqa: E402
from nnapi import OperandType  # noqa: E402
from nnapi import OperationCode as Op  # noqa: E402
from nnapi.drivers.ort.device import OrtDevice  # noqa: E402
from nnapi.drivers.ort.shapes import infer_temporary_shapes  # noqa: E402
from nnapi.runtime.model_builder import build_hal_model  # noqa: E402

pytestmark = pytest.mark.usefixtures("calibration_file")


def _scalar(model: nnapi.Model, code: int, value) -> int:
    index = model.add_operand(OperandType(code))
    model.set_operand_value(index, value)
    return index


def _conv_after_add(quantized: bool) -> nnapi.Model:
    """ADD(x, 0) -> CONV_2D (SAME, stride 2) -> y, the temporary and the output declared
    [0, 0, 0, 0] (as Android's dynamic-output-shape tests declare them)."""
    rng = np.random.default_rng(4)
    model = nnapi.Model()
    if quantized:
        activation = {"type": T.TENSOR_QUANT8_ASYMM, "scale": 0.05, "zero_point": 120}
        x = model.add_operand(OperandType(dimensions=[1, 9, 7, 5], **activation))
        zero = model.add_operand(OperandType(dimensions=[1], **activation))
        model.set_operand_value(zero, np.array([120], np.uint8))
        t = model.add_operand(OperandType(dimensions=[0, 0, 0, 0], **activation))
        w = model.add_operand(OperandType(T.TENSOR_QUANT8_ASYMM, [6, 3, 3, 5], scale=0.01, zero_point=128))
        model.set_operand_value(w, rng.integers(0, 256, (6, 3, 3, 5)).astype(np.uint8))
        b = model.add_operand(OperandType(T.TENSOR_INT32, [6], scale=0.05 * 0.01))
        model.set_operand_value(b, rng.integers(-500, 500, 6).astype(np.int32))
        y = model.add_operand(OperandType(T.TENSOR_QUANT8_ASYMM, [0, 0, 0, 0], scale=0.5, zero_point=100))
    else:
        x = model.add_operand(OperandType(T.TENSOR_FLOAT32, [1, 9, 7, 5]))
        zero = model.add_operand(OperandType(T.TENSOR_FLOAT32, [1]))
        model.set_operand_value(zero, np.zeros(1, np.float32))
        t = model.add_operand(OperandType(T.TENSOR_FLOAT32, [0, 0, 0, 0]))
        w = model.add_operand(OperandType(T.TENSOR_FLOAT32, [6, 3, 3, 5]))
        model.set_operand_value(w, rng.standard_normal((6, 3, 3, 5)).astype(np.float32))
        b = model.add_operand(OperandType(T.TENSOR_FLOAT32, [6]))
        model.set_operand_value(b, rng.standard_normal(6).astype(np.float32))
        y = model.add_operand(OperandType(T.TENSOR_FLOAT32, [0, 0, 0, 0]))
    model.add_operation(Op.ADD, [x, zero, _scalar(model, T.INT32, 0)], [t])
    model.add_operation(Op.CONV_2D, [t, w, b, *(_scalar(model, T.INT32, v) for v in (1, 2, 2, 0))], [y])
    model.identify_inputs_and_outputs([x], [y])
    model.finish()
    return model


@pytest.mark.parametrize("quantized", [False, True])
def test_a_temporary_of_unknown_shape_gets_its_shape_and_runs_on_ort(ort_device, quantized):
    """The convolution's SAME padding needs its input's size, declared unknown: inferred as
    ADD's broadcast [1, 9, 7, 5], so nnapi-ort-cpu takes the whole model; the output (still
    declared unknown) is [1, 5, 4, 6] with the reference's values (quantized: within a step,
    as the constant-filter QLinearConv is)."""
    model = _conv_after_add(quantized)
    hal = build_hal_model(model)[0]
    shaped = infer_temporary_shapes(hal)
    assert shaped.main.operands[2].dimensions == [1, 9, 7, 5]
    assert shaped.main.operations is hal.main.operations  # the same operations, outputs left as declared
    assert [shaped.main.operands[i].dimensions for i in shaped.main.output_indexes] == [[0, 0, 0, 0]]
    assert hal.main.operands[2].dimensions == [0, 0, 0, 0]  # the model itself is not changed
    x = (np.random.default_rng(1).integers(0, 256, (1, 9, 7, 5)).astype(np.uint8) if quantized
         else np.random.default_rng(1).standard_normal((1, 9, 7, 5)).astype(np.float32))
    results = []
    for device in (ort_device, next(d for d in nnapi.get_devices() if d.name == "nnapi-reference")):
        compilation = nnapi.Compilation(model, [device])
        compilation.finish()
        assert compilation.step_devices == [device.name]
        execution = nnapi.Execution(compilation)
        execution.set_input(0, x)
        y = np.zeros((1, 5, 4, 6), x.dtype)
        execution.set_output(0, y)
        execution.compute()
        assert execution.get_output_operand_dimensions(0) == [1, 5, 4, 6]
        results.append(y)
    if quantized:
        assert np.abs(results[0].astype(int) - results[1]).max() <= 1 and len(np.unique(results[1])) > 20
    else:
        np.testing.assert_allclose(results[0], results[1], rtol=1e-5, atol=1e-5)


def test_a_shape_that_needs_a_run_time_value_stays_unknown():
    """RESHAPE to a shape given as a model input: its output's shape is known only at run
    time, and so is the shape of what reads it (nothing is guessed); the device declines the
    convolution after it naming its need; a model without unknown temporaries comes back
    as itself."""
    model = nnapi.Model()
    x = model.add_operand(OperandType(T.TENSOR_FLOAT32, [1, 4, 4, 2]))
    shape = model.add_operand(OperandType(T.TENSOR_INT32, [4]))
    t = model.add_operand(OperandType(T.TENSOR_FLOAT32, [0, 0, 0, 0]))
    u = model.add_operand(OperandType(T.TENSOR_FLOAT32, [0, 0, 0, 0]))
    w = model.add_operand(OperandType(T.TENSOR_FLOAT32, [1, 3, 3, 2]))
    model.set_operand_value(w, np.ones((1, 3, 3, 2), np.float32))
    b = model.add_operand(OperandType(T.TENSOR_FLOAT32, [1]))
    model.set_operand_value(b, np.zeros(1, np.float32))
    y = model.add_operand(OperandType(T.TENSOR_FLOAT32, [0, 0, 0, 0]))
    model.add_operation(Op.RESHAPE, [x, shape], [t])
    model.add_operation(Op.RELU, [t], [u])
    model.add_operation(Op.CONV_2D, [u, w, b, *(_scalar(model, T.INT32, v) for v in (1, 2, 2, 0))], [y])
    model.identify_inputs_and_outputs([x, shape], [y])
    model.finish()
    hal = build_hal_model(model)[0]
    assert infer_temporary_shapes(hal) is hal
    reasons = OrtDevice().get_unsupported_reasons(hal)
    # (at stride 2 SAME's padding depends on the size; at stride 1 it would not)
    assert reasons[2] == "SAME padding needs the filter's spatial sizes, and the input's where the stride is not 1"
    known = build_hal_model(_conv_after_add(False))[0]
    known.main.operands[2].dimensions = [1, 9, 7, 5]
    assert infer_temporary_shapes(known) is known


@pytest.mark.parametrize("strides, dilation, runs_on_ort", [((1, 1), 2, True), ((1, 2), 1, False)])
def test_same_padding_at_stride_1_needs_no_input_size(ort_device, strides, dilation, runs_on_ort):
    """A convolution with SAME padding on an input whose width is known only at run time (a
    Conv1D over a sequence of any length): at stride 1 the padding, (kernel - 1) * dilation,
    does not depend on the width, so nnapi-ort-cpu takes it (it declined before) and
    matches the reference at widths 5 and 11; at stride 2 it still declines."""
    rng = np.random.default_rng(6)
    model = nnapi.Model()
    x = model.add_operand(OperandType(T.TENSOR_FLOAT32, [1, 1, 0, 4]))
    w = model.add_operand(OperandType(T.TENSOR_FLOAT32, [3, 1, 3, 4]))
    model.set_operand_value(w, rng.standard_normal((3, 1, 3, 4)).astype(np.float32))
    b = model.add_operand(OperandType(T.TENSOR_FLOAT32, [3]))
    model.set_operand_value(b, rng.standard_normal(3).astype(np.float32))
    y = model.add_operand(OperandType(T.TENSOR_FLOAT32, [1, 1, 0, 3]))
    params = [_scalar(model, T.INT32, v) for v in (1, strides[1], strides[0], 0)]
    params += [_scalar(model, T.BOOL, False), _scalar(model, T.INT32, dilation), _scalar(model, T.INT32, dilation)]
    model.add_operation(Op.CONV_2D, [x, w, b, *params], [y])
    model.identify_inputs_and_outputs([x], [y])
    model.finish()
    assert model.get_supported_operations_for_devices([ort_device]) == [runs_on_ort]
    if not runs_on_ort:
        return
    reference = next(d for d in nnapi.get_devices() if d.name == "nnapi-reference")
    for width in (5, 11):
        value = rng.standard_normal((1, 1, width, 4)).astype(np.float32)
        results = []
        for device in (ort_device, reference):
            compilation = nnapi.Compilation(model, [device])
            compilation.finish()
            execution = nnapi.Execution(compilation)
            execution.set_input(0, value)
            out = np.zeros((1, 1, width, 3), np.float32)
            execution.set_output(0, out)
            execution.compute()
            results.append(out)
        np.testing.assert_allclose(results[0], results[1], rtol=1e-5, atol=1e-5)


# --- sizes only a run gives, the other dimensions fixed by the operation ---------------------
def _nms_outputs(model: nnapi.Model) -> list[int]:
    """BOX_WITH_NMS_LIMIT's four outputs (scores, boxes, classes, batch indexes), declared of
    unknown dimensions."""
    return [model.add_operand(OperandType(code, dims)) for code, dims in (
        (T.TENSOR_FLOAT32, [0]), (T.TENSOR_FLOAT32, [0, 0]), (T.TENSOR_INT32, [0]), (T.TENSOR_INT32, [0]))]


def _detections(model: nnapi.Model, rois: int) -> tuple[list[int], int, int]:
    """BOX_WITH_NMS_LIMIT of run-time scores [rois, 2], boxes [rois, 8] and batch indexes
    (the inputs), as a dynamic_outputs model declares it: its kept boxes and their batch
    indexes temporaries of unknown dimensions, its scores and classes outputs. Returns
    (inputs, boxes, batch indexes)."""
    scores = model.add_operand(OperandType(T.TENSOR_FLOAT32, [rois, 2]))
    boxes = model.add_operand(OperandType(T.TENSOR_FLOAT32, [rois, 8]))
    batches = model.add_operand(OperandType(T.TENSOR_INT32, [rois]))
    kept = _nms_outputs(model)
    parameters = [_scalar(model, T.FLOAT32, 0.3), _scalar(model, T.INT32, -1), _scalar(model, T.INT32, 0),
                  _scalar(model, T.FLOAT32, 0.4), _scalar(model, T.FLOAT32, 1.0), _scalar(model, T.FLOAT32, 0.3)]
    model.add_operation(Op.BOX_WITH_NMS_LIMIT, [scores, boxes, batches, *parameters], kept)
    return [scores, boxes, batches, kept[0], kept[2]], kept[1], kept[3]


def _roi_align(model: nnapi.Model, feature: int, boxes: int, batches: int) -> int:
    """ROI_ALIGN to 2 x 2 (NHWC, scale 1, sampling 2), its output of unknown dimensions."""
    aligned = model.add_operand(OperandType(T.TENSOR_FLOAT32, [0, 0, 0, 0]))
    parameters = [_scalar(model, T.INT32, 2), _scalar(model, T.INT32, 2), _scalar(model, T.FLOAT32, 1.0),
                  _scalar(model, T.FLOAT32, 1.0), _scalar(model, T.INT32, 2), _scalar(model, T.INT32, 2),
                  _scalar(model, T.BOOL, False)]
    model.add_operation(Op.ROI_ALIGN, [feature, boxes, batches, *parameters], [aligned])
    return aligned


def _detection_inputs(rng: np.random.Generator, rois: int, threshold_passed: bool) -> list[np.ndarray]:
    """Scores (above NMS's 0.3 where ``threshold_passed``, else none), boxes on an 8 x 8
    image (x1 <= x2, y1 <= y2), one image."""
    scores = rng.uniform(0.35, 1.0, (rois, 2)) if threshold_passed else rng.uniform(0.0, 0.25, (rois, 2))
    corners = np.sort(rng.uniform(0.0, 8.0, (rois, 2, 2, 2)), axis=2)  # [roi, class, (lo, hi), (x, y)]
    boxes = np.concatenate([corners[:, :, 0, :], corners[:, :, 1, :]], axis=2).reshape(rois, 8)
    return [scores.astype(np.float32), boxes.astype(np.float32), np.zeros(rois, np.int32)]


def _run_on_both(ort_device, model: nnapi.Model, inputs: list[np.ndarray], outputs: list[tuple]) -> list[list]:
    """The outputs (``(dtype, room)`` each, cut to the dimensions the execution reports) on
    nnapi-ort-cpu alone and on the reference."""
    reference = next(d for d in nnapi.get_devices() if d.name == "nnapi-reference")
    results = []
    for device in (ort_device, reference):
        compilation = nnapi.Compilation(model, [device])
        compilation.finish()
        execution = nnapi.Execution(compilation)
        for position, value in enumerate(inputs):
            execution.set_input(position, value)
        arrays = [np.zeros(room, dtype) for dtype, room in outputs]
        for position, array in enumerate(arrays):
            execution.set_output(position, array)
        execution.compute()
        shapes = [execution.get_output_operand_dimensions(p) for p in range(len(outputs))]
        results.append([a.reshape(-1)[:int(np.prod(s))].reshape(s) for a, s in zip(arrays, shapes)])
    return results


@pytest.mark.parametrize("resize", [Op.RESIZE_BILINEAR, Op.RESIZE_NEAREST_NEIGHBOR], ids=["bilinear", "nearest"])
def test_roi_align_output_height_and_width_are_known_for_a_resize(ort_device, resize):
    """BOX_WITH_NMS_LIMIT -> ROI_ALIGN -> RESIZE with every temporary declared of unknown
    dimensions (Android's dynamic-output-shape tests): the kept boxes are [n, 4] and the
    aligned regions [n, 2, 2, 3] whatever n, so the resize's input height and width are known
    and nnapi-ort-cpu takes the whole model (it declined the resize before); 3 x 3 regions
    as the reference's, for some boxes kept and for none (zero-sized)."""
    rng = np.random.default_rng(8)
    model = nnapi.Model()
    inputs, boxes, batches = _detections(model, 6)
    feature = model.add_operand(OperandType(T.TENSOR_FLOAT32, [1, 8, 8, 3]))
    aligned = _roi_align(model, feature, boxes, batches)
    resized = model.add_operand(OperandType(T.TENSOR_FLOAT32, [0, 0, 0, 0]))
    model.add_operation(resize, [aligned, _scalar(model, T.INT32, 3), _scalar(model, T.INT32, 3),
                                 _scalar(model, T.BOOL, False)], [resized])
    model.identify_inputs_and_outputs([*inputs[:3], feature], [*inputs[3:], resized])
    model.finish()
    hal = build_hal_model(model)[0]
    shaped = infer_temporary_shapes(hal).main.operands
    assert shaped[boxes].dimensions == [0, 4] and shaped[batches].dimensions == [0]
    assert shaped[aligned].dimensions == [0, 2, 2, 3]
    assert OrtDevice().get_unsupported_reasons(hal) == [None] * 3
    kept = 0
    for threshold_passed in (True, True, False):
        values = [*_detection_inputs(rng, 6, threshold_passed), rng.standard_normal((1, 8, 8, 3)).astype(np.float32)]
        ort_results, reference_results = _run_on_both(ort_device, model, values, [
            (np.float32, 12), (np.int32, 12), (np.float32, 12 * 27)])
        for got, want in zip(ort_results, reference_results, strict=True):
            assert got.shape == want.shape
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
        kept += len(reference_results[0])
        assert reference_results[2].shape == (len(reference_results[0]), 3, 3, 3)
    assert kept > 0


def test_fully_connected_units_give_a_detection_its_class_count(ort_device):
    """Two stages of detection as Android's bbox_graph test: regions of the kept boxes
    (ROI_ALIGN), per region FULLY_CONNECTED class scores [n, 3] and box deltas [n, 12],
    AXIS_ALIGNED_BBOX_TRANSFORM, then BOX_WITH_NMS_LIMIT again; every temporary declared of
    unknown dimensions. The units give the second NMS its class count (3), so
    nnapi-ort-cpu takes the whole model (it declined the second NMS before); selections as
    the reference's. Weights in sixteenths and a constant feature map keep the sums exact."""
    rng = np.random.default_rng(9)
    model = nnapi.Model()
    inputs, boxes, batches = _detections(model, 5)
    feature = model.add_operand(OperandType(T.TENSOR_FLOAT32, [1, 8, 8, 3]))
    aligned = _roi_align(model, feature, boxes, batches)
    stage = []
    for units in (3, 12):
        weights = model.add_operand(OperandType(T.TENSOR_FLOAT32, [units, 12]))
        model.set_operand_value(weights, (rng.integers(-4, 5, (units, 12)) / 16).astype(np.float32))
        bias = model.add_operand(OperandType(T.TENSOR_FLOAT32, [units]))
        model.set_operand_value(bias, (rng.integers(0, 16, units) / 16).astype(np.float32))
        out = model.add_operand(OperandType(T.TENSOR_FLOAT32, [0, 0]))
        model.add_operation(Op.FULLY_CONNECTED, [aligned, weights, bias, _scalar(model, T.INT32, 0)], [out])
        stage.append(out)
    image = model.add_operand(OperandType(T.TENSOR_FLOAT32, [1, 2]))
    model.set_operand_value(image, np.array([8, 8], np.float32))
    refined = model.add_operand(OperandType(T.TENSOR_FLOAT32, [0, 0]))
    model.add_operation(Op.AXIS_ALIGNED_BBOX_TRANSFORM, [boxes, stage[1], batches, image], [refined])
    final = _nms_outputs(model)
    parameters = [_scalar(model, T.FLOAT32, 0.1), _scalar(model, T.INT32, -1), _scalar(model, T.INT32, 0),
                  _scalar(model, T.FLOAT32, 0.5), _scalar(model, T.FLOAT32, 1.0), _scalar(model, T.FLOAT32, 0.1)]
    model.add_operation(Op.BOX_WITH_NMS_LIMIT, [stage[0], refined, batches, *parameters], final)
    model.identify_inputs_and_outputs([*inputs[:3], feature], [*inputs[3:], *final])
    model.finish()
    hal = build_hal_model(model)[0]
    shaped = infer_temporary_shapes(hal).main.operands
    assert [shaped[i].dimensions for i in (aligned, *stage, refined)] == [[0, 2, 2, 3], [0, 3], [0, 12], [0, 12]]
    assert OrtDevice().get_unsupported_reasons(hal) == [None] * 6
    selected = 0
    for threshold_passed in (True, True, False):
        values = [*_detection_inputs(rng, 5, threshold_passed),
                  np.broadcast_to(rng.integers(0, 4, 3) / 4, (1, 8, 8, 3)).astype(np.float32)]
        ort_results, reference_results = _run_on_both(ort_device, model, values, [
            (np.float32, 10), (np.int32, 10), (np.float32, 40), (np.float32, 160), (np.int32, 40), (np.int32, 40)])
        for got, want in zip(ort_results, reference_results, strict=True):
            assert got.shape == want.shape
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
        selected += len(reference_results[2])
    assert selected > 0


def _proposals_pooled_resized(model: nnapi.Model) -> tuple[list[int], list[int], int, int, int]:
    """GENERATE_PROPOSALS of run-time scores [1, 2, 2, 2] and deltas [1, 2, 2, 8] (two
    constant anchors on an 8 x 8 image), its three outputs declared of unknown rank (as a
    dynamic_outputs model may), ROI_POOLING of a run-time [1, 8, 8, 3] feature map to 2 x 2
    in its boxes, RESIZE_BILINEAR of the regions to 3 x 3 (both of unknown dimensions).
    Returns (inputs, outputs, proposal boxes, pooled regions, resized regions)."""
    scores = model.add_operand(OperandType(T.TENSOR_FLOAT32, [1, 2, 2, 2]))
    deltas = model.add_operand(OperandType(T.TENSOR_FLOAT32, [1, 2, 2, 8]))
    anchors = model.add_operand(OperandType(T.TENSOR_FLOAT32, [2, 4]))
    model.set_operand_value(anchors, np.array([[0, 0, 4, 4], [1, 1, 6, 5]], np.float32))
    image = model.add_operand(OperandType(T.TENSOR_FLOAT32, [1, 2]))
    model.set_operand_value(image, np.array([8, 8], np.float32))
    parameters = [_scalar(model, T.FLOAT32, 4.0), _scalar(model, T.FLOAT32, 4.0), _scalar(model, T.INT32, -1),
                  _scalar(model, T.INT32, -1), _scalar(model, T.FLOAT32, 0.5), _scalar(model, T.FLOAT32, 1.0),
                  _scalar(model, T.BOOL, False)]
    kept, boxes, batches = (model.add_operand(OperandType(code, [])) for code in (
        T.TENSOR_FLOAT32, T.TENSOR_FLOAT32, T.TENSOR_INT32))
    model.add_operation(Op.GENERATE_PROPOSALS, [scores, deltas, anchors, image, *parameters], [kept, boxes, batches])
    feature = model.add_operand(OperandType(T.TENSOR_FLOAT32, [1, 8, 8, 3]))
    pooled = model.add_operand(OperandType(T.TENSOR_FLOAT32, [0, 0, 0, 0]))
    model.add_operation(Op.ROI_POOLING, [feature, boxes, batches, _scalar(model, T.INT32, 2),
                                         _scalar(model, T.INT32, 2), _scalar(model, T.FLOAT32, 1.0),
                                         _scalar(model, T.FLOAT32, 1.0), _scalar(model, T.BOOL, False)], [pooled])
    resized = model.add_operand(OperandType(T.TENSOR_FLOAT32, [0, 0, 0, 0]))
    model.add_operation(Op.RESIZE_BILINEAR, [pooled, _scalar(model, T.INT32, 3), _scalar(model, T.INT32, 3),
                                             _scalar(model, T.BOOL, False)], [resized])
    return [scores, deltas, feature], [kept, resized], boxes, pooled, resized


def test_proposal_boxes_and_pooled_regions_get_their_known_dimensions(ort_device):
    """GENERATE_PROPOSALS -> ROI_POOLING -> RESIZE_BILINEAR, every temporary of unknown
    dimensions (the proposals' of unknown rank): the proposal boxes are [n, 4] and the
    pooled regions [n, 2, 2, 3] whatever n (shapes._PARTIAL), so nnapi-ort-cpu takes the
    whole model (without the proposals' entry ROI_POOLING reads boxes of unknown rank, without
    ROI_POOLING's the resize has no height and width: each declined); the reference's
    values. (None kept is no case: ROI_POOLING refuses zero-sized boxes, as Android's.)"""
    rng = np.random.default_rng(10)
    model = nnapi.Model()
    inputs, outputs, boxes, pooled, resized = _proposals_pooled_resized(model)
    model.identify_inputs_and_outputs(inputs, outputs)
    model.finish()
    hal = build_hal_model(model)[0]
    shaped = infer_temporary_shapes(hal).main.operands
    assert shaped[boxes].dimensions == [0, 4] and shaped[pooled].dimensions == [0, 2, 2, 3]
    assert OrtDevice().get_unsupported_reasons(hal) == [None] * 3
    kept = []
    for _ in range(3):
        values = [rng.uniform(0, 1, (1, 2, 2, 2)).astype(np.float32),
                  rng.uniform(-0.5, 0.5, (1, 2, 2, 8)).astype(np.float32),
                  rng.standard_normal((1, 8, 8, 3)).astype(np.float32)]
        ort_results, reference_results = _run_on_both(ort_device, model, values, [(np.float32, 8),
                                                                                  (np.float32, 8 * 27)])
        for got, want in zip(ort_results, reference_results, strict=True):
            assert got.shape == want.shape
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
        assert reference_results[1].shape == (len(reference_results[0]), 3, 3, 3)
        kept.append(len(reference_results[0]))
    assert min(kept) > 0
