"""BOX_WITH_NMS_LIMIT on nnapi-ort-cpu (drivers/ort/nms.py): the explicit greedy walk
makes the reference's selections exactly (outputs bit for bit, their count included) on
random inputs built to hit the hard cases: score ties, touching and identical boxes, IoUs
exactly at the threshold, degenerate (zero-area) boxes, no candidate at all, several runs
of batch indexes (an image's boxes in two runs too), many classes, per-class and per-image
limits, an NMS score threshold at or below zero (suppressed boxes stay with score 0);
float32, float16 and quantized scores; the hard, linear and gaussian kernels (the
gaussian's exp rounded once from float64 on both devices). Boxes the reference refuses
fail the run here too."""

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
from nnapi.runtime.model_builder import build_hal_model  # noqa: E402

DTYPES = {T.TENSOR_FLOAT32: np.float32, T.TENSOR_FLOAT16: np.float16, T.TENSOR_QUANT8_ASYMM: np.uint8,
          T.TENSOR_QUANT8_ASYMM_SIGNED: np.int8, T.TENSOR_QUANT16_ASYMM: np.uint16, T.TENSOR_INT32: np.int32}
SCORE_QUANT = {T.TENSOR_QUANT8_ASYMM: (0.0625, 16), T.TENSOR_QUANT8_ASYMM_SIGNED: (0.0625, -112)}


def _devices() -> tuple[nnapi.Device, nnapi.Device]:
    found = {d.name: d for d in nnapi.get_devices()}
    return found["nnapi-reference"], found["nnapi-ort-cpu"]


def _nms_model(code: int, rois: int, classes: int, parameters: tuple) -> nnapi.Model:
    """BOX_WITH_NMS_LIMIT of scores, boxes and batch indexes given at run time, the
    parameters (score threshold, max detections, kernel, IoU threshold, sigma, NMS score
    threshold) constants, the four outputs of unknown size."""
    quantized = code in SCORE_QUANT
    scale, zero_point = SCORE_QUANT.get(code, (0.0, 0))
    box_code = T.TENSOR_QUANT16_ASYMM if quantized else code
    box_quant = (0.125, 0) if quantized else (0.0, 0)
    scalar = T.FLOAT16 if code == T.TENSOR_FLOAT16 else T.FLOAT32
    model = nnapi.Model()
    scores = model.add_operand(OperandType(code, [rois, classes], scale, zero_point))
    boxes = model.add_operand(OperandType(box_code, [rois, classes * 4], *box_quant))
    batches = model.add_operand(OperandType(T.TENSOR_INT32, [rois]))
    constants = []
    for kind, value in zip((scalar, T.INT32, T.INT32, scalar, scalar, scalar), parameters, strict=True):
        index = model.add_operand(OperandType(kind))
        model.set_operand_value(index, value)
        constants.append(index)
    outputs = [model.add_operand(OperandType(code, [0], scale, zero_point)),
               model.add_operand(OperandType(box_code, [0, 4], *box_quant)),
               model.add_operand(OperandType(T.TENSOR_INT32, [0])), model.add_operand(OperandType(T.TENSOR_INT32, [0]))]
    model.add_operation(Op.BOX_WITH_NMS_LIMIT, [scores, boxes, batches, *constants], outputs)
    model.identify_inputs_and_outputs([scores, boxes, batches], outputs)
    model.finish()
    return model


def _claimed_and_compiled(model: nnapi.Model, reference: nnapi.Device, ort_device: nnapi.Device
                          ) -> list[nnapi.Compilation]:
    """``model`` compiled on the reference and on the ORT device alone, which must claim it."""
    assert OrtDevice().get_unsupported_reasons(build_hal_model(model)[0]) == [None]
    compilations = []
    for device in (reference, ort_device):
        compilation = nnapi.Compilation(model, [device])
        compilation.finish()
        compilations.append(compilation)
    return compilations


def _run(compilation: nnapi.Compilation, code: int, values: list[np.ndarray], outputs: int = 4) -> list[np.ndarray]:
    """The outputs (scores, boxes, then ``outputs - 2`` int32 ones: BOX_WITH_NMS_LIMIT's
    classes and batch indexes, GENERATE_PROPOSALS' batch indexes), cut to the dimensions
    the execution reports, which must agree."""
    execution = nnapi.Execution(compilation)
    for position, value in enumerate(values):
        execution.set_input(position, value)
    room = values[0].size
    box_dtype = np.uint16 if code in SCORE_QUANT else DTYPES[code]
    results = [np.zeros(room, DTYPES[code]), np.zeros((room, 4), box_dtype),
               *(np.zeros(room, np.int32) for _ in range(outputs - 2))]
    for position, array in enumerate(results):
        execution.set_output(position, array)
    execution.compute()
    count = execution.get_output_operand_dimensions(0)[0]
    for position in range(outputs):
        assert execution.get_output_operand_dimensions(position)[0] == count
    return [array[:count] for array in results]


def _inputs(rng: np.random.Generator, code: int, rois: int, classes: int, grid: int,
            batches: np.ndarray) -> list[np.ndarray]:
    """Scores from few levels (ties), boxes on a small integer grid (touching, identical
    and zero-area boxes; IoUs such as 1/2 exactly), in each type's encoding."""
    x = np.sort(rng.integers(0, grid, (rois, classes, 2)), axis=2)
    y = np.sort(rng.integers(0, grid, (rois, classes, 2)), axis=2)
    boxes = np.stack([x[..., 0], y[..., 0], x[..., 1], y[..., 1]], axis=2).reshape(rois, classes * 4)
    levels = rng.integers(0, 8, (rois, classes))
    if code in SCORE_QUANT:
        scale, zero_point = SCORE_QUANT[code]
        scores = (levels * 2 + zero_point).astype(DTYPES[code])
        boxes = (boxes * 8).astype(np.uint16)  # scale 0.125
    else:
        scores = (levels / 8).astype(DTYPES[code])
        boxes = boxes.astype(DTYPES[code])
    return [scores, boxes, batches.astype(np.int32)]


@pytest.mark.parametrize("code", [T.TENSOR_FLOAT32, T.TENSOR_FLOAT16, T.TENSOR_QUANT8_ASYMM,
                                  T.TENSOR_QUANT8_ASYMM_SIGNED])
@pytest.mark.parametrize("kernel", [0, 1, 2])
def test_box_with_nms_limit_makes_the_reference_selections(code, kernel):
    reference, ort_device = _devices()
    rng = np.random.default_rng(12 + kernel)
    cases = [  # rois, classes, grid, batch indexes, score threshold, max detections, IoU threshold, NMS floor
        (12, 3, 4, np.zeros(12), 0.1, -1, 0.5, 0.0),
        (12, 3, 4, np.zeros(12), 0.1, -1, 0.5, 0.05),
        (20, 4, 5, np.repeat([0, 1, 2], [7, 0, 13]), 0.2, 3, 0.5, 0.2),
        (16, 2, 3, np.array([0] * 5 + [1] * 6 + [0] * 5), 0.0, 2, 0.3, -1.0),
        (30, 5, 6, np.repeat([0, 1, 3], [10, 10, 10]), 0.05, 10, 0.5, 0.1),
        (9, 3, 4, np.repeat([0, 1], [4, 5]), 0.9, -1, 0.5, 0.0),   # no candidate scores above 0.9
        (14, 3, 3, np.repeat([2, 1], [7, 7]), 0.1, 0, 0.4, 0.0),   # max detections 0: nothing
        (10, 6, 2, np.zeros(10), -1.0, 4, 1.0, 0.0),              # IoU threshold 1: identical boxes only
    ]
    for rois, classes, grid, batches, score_threshold, max_detections, iou, floor in cases:
        # sigma 0.3 for the gaussian kernel: exp(-IoU^2 / 0.3) of these IoUs (quarters, thirds,
        # fifths ...) is inexact, so the rescored scores test how it is rounded
        sigma = 0.3 if kernel == 2 else 1.0
        model = _nms_model(code, rois, classes, (score_threshold, max_detections, kernel, iou, sigma, floor))
        compilations = _claimed_and_compiled(model, reference, ort_device)
        selected = 0
        for _ in range(6):
            values = _inputs(rng, code, rois, classes, grid, batches)
            expected, actual = (_run(compilation, code, values) for compilation in compilations)
            for want, got in zip(expected, actual, strict=True):
                assert got.dtype == want.dtype and got.shape == want.shape
                assert np.array_equal(got.view(np.uint8), want.view(np.uint8)), (got, want)
            selected += len(expected[0])
        assert (selected > 0) == (score_threshold < 0.9 and max_detections != 0)


def test_box_with_nms_limit_fails_where_the_reference_does():
    """A box with x1 > x2 fails the run on both devices."""
    model = _nms_model(T.TENSOR_FLOAT32, 2, 2, (0.1, -1, 0, 0.5, 1.0, 0.0))
    values = [np.full((2, 2), 0.5, np.float32), np.array([[0, 0, 1, 1, 0, 0, 1, 1], [0, 0, 1, 1, 2, 0, 1, 1]],
                                                         np.float32), np.zeros(2, np.int32)]
    for device in _devices():
        compilation = nnapi.Compilation(model, [device])
        compilation.finish()
        with pytest.raises(nnapi.OpFailedError):
            _run(compilation, T.TENSOR_FLOAT32, values)


def test_box_with_nms_limit_gaussian_rescoring_matches_the_reference_bit_for_bit():
    """Two boxes of one class, the second overlapping the first by IoUs across (0, 1]: its
    rescored score, exp(-IoU^2 / sigma) times its score, is the reference's bit for bit,
    which is Android's: the float32 exponent's exp rounded once to float32 (ORT's float32
    Exp, and numpy's, are an ulp off for some of them)."""
    reference, ort_device = _devices()
    model = _nms_model(T.TENSOR_FLOAT32, 2, 2, (0.0, -1, 2, 0.5, 0.7, 0.0))
    compilations = _claimed_and_compiled(model, reference, ort_device)
    for width in range(1, 200):
        # box 1 is [0, 0, 200, 1], box 2 [0, 0, width, 1]: IoU width / 200
        boxes = np.array([[0, 0, 0, 0, 0, 0, 200, 1], [0, 0, 0, 0, 0, 0, width, 1]], np.float32)
        values = [np.array([[0.0, 0.9], [0.0, 0.8]], np.float32), boxes, np.zeros(2, np.int32)]
        expected, actual = (_run(compilation, T.TENSOR_FLOAT32, values) for compilation in compilations)
        assert len(expected[0]) == 2
        for want, got in zip(expected, actual, strict=True):
            assert np.array_equal(got.view(np.uint8), want.view(np.uint8)), (width, got, want)
        iou = np.float32(width) / np.float32(200)
        factor = np.float32(np.exp(np.float64(-(iou * iou) / np.float32(0.7))))
        assert expected[0][1] == factor * np.float32(0.8)


# --- GENERATE_PROPOSALS ----------------------------------------------------------------------
def _proposals_model(code: int, batches: int, height: int, width: int, anchors: int, nchw: bool,
                     parameters: tuple) -> nnapi.Model:
    """GENERATE_PROPOSALS of scores, deltas, anchors and image sizes given at run time, the
    parameters (strides, pre / post NMS limits, IoU threshold, minimum size) constants."""
    quantized = code in SCORE_QUANT
    scale, zero_point = SCORE_QUANT.get(code, (0.0, 0))
    scalar = T.FLOAT16 if code == T.TENSOR_FLOAT16 else T.FLOAT32
    model = nnapi.Model()
    feature = [batches, anchors, height, width] if nchw else [batches, height, width, anchors]
    deltas_shape = [batches, anchors * 4, height, width] if nchw else [batches, height, width, anchors * 4]
    scores = model.add_operand(OperandType(code, feature, scale, zero_point))
    deltas = model.add_operand(OperandType(code, deltas_shape, 0.125 if quantized else 0.0,
                                           zero_point if quantized else 0))
    anchor = model.add_operand(OperandType(T.TENSOR_QUANT16_SYMM if quantized else code, [anchors, 4],
                                           0.125 if quantized else 0.0))
    image = model.add_operand(OperandType(T.TENSOR_QUANT16_ASYMM if quantized else code, [batches, 2],
                                          0.125 if quantized else 0.0))
    constants = []
    for kind, value in zip((scalar, scalar, T.INT32, T.INT32, scalar, scalar, T.BOOL), (*parameters, nchw),
                           strict=True):
        index = model.add_operand(OperandType(kind))
        model.set_operand_value(index, value)
        constants.append(index)
    box_code = T.TENSOR_QUANT16_ASYMM if quantized else code
    outputs = [model.add_operand(OperandType(code, [0], scale, zero_point)),
               model.add_operand(OperandType(box_code, [0, 4], 0.125 if quantized else 0.0)),
               model.add_operand(OperandType(T.TENSOR_INT32, [0]))]
    model.add_operation(Op.GENERATE_PROPOSALS, [scores, deltas, anchor, image, *constants], outputs)
    model.identify_inputs_and_outputs([scores, deltas, anchor, image], outputs)
    model.finish()
    return model


def _proposal_inputs(rng, code, batches, height, width, anchors, nchw, scaled: bool) -> list[np.ndarray]:
    """Scores from few levels (ties), deltas in eighths (dw, dh zero unless ``scaled``: exp(0)
    is 1 in every float32 exp), integer anchors (some zero-area), image sizes in eighths."""
    levels = rng.integers(0, 6, (batches, height, width, anchors))
    moves = rng.integers(-6, 7, (batches, height, width, anchors, 4)) / 8
    if not scaled:
        moves[..., 2:] = 0
    corner = rng.integers(0, 6, (anchors, 2))
    size = rng.integers(0, 6, (anchors, 2))
    anchor = np.concatenate([corner, corner + size], axis=1).astype(np.float64)
    image = rng.integers(8 * 6, 8 * 14, (batches, 2)) / 8
    deltas = moves.reshape(batches, height, width, anchors * 4)
    if nchw:
        levels, deltas = levels.transpose(0, 3, 1, 2), deltas.transpose(0, 3, 1, 2)
    if code in SCORE_QUANT:
        _, zero_point = SCORE_QUANT[code]
        return [(levels * 3 + zero_point).astype(DTYPES[code]), (deltas * 8 + zero_point).astype(DTYPES[code]),
                (anchor * 8).astype(np.int16), (image * 8).astype(np.uint16)]
    dtype = DTYPES[code]
    return [(levels / 6).astype(dtype), deltas.astype(dtype), anchor.astype(dtype), image.astype(dtype)]


@pytest.mark.parametrize("code", [T.TENSOR_FLOAT32, T.TENSOR_FLOAT16, T.TENSOR_QUANT8_ASYMM,
                                  T.TENSOR_QUANT8_ASYMM_SIGNED])
@pytest.mark.parametrize("nchw", [False, True])
def test_generate_proposals_makes_the_reference_selections(code, nchw):
    """Bit for bit where exp is exact (dw = dh = 0); with scaled boxes (ORT's Exp may differ
    from numpy's by an ulp) the same count and floats within the CTS tolerance here."""
    from nnapi.conformance import float_tolerance, within_tolerance

    reference, ort_device = _devices()
    rng = np.random.default_rng(40 + nchw)
    cases = [  # batches, height, width, anchors, (strides, pre limit, post limit, IoU, min size)
        (2, 3, 4, 3, (2.0, 1.5, 0, 0, 0.5, 0.0)),
        (1, 4, 4, 2, (1.0, 1.0, 10, 5, 0.3, 0.5)),
        (3, 2, 5, 2, (4.0, 2.0, 100, -1, 0.7, 1.0)),
        (2, 3, 3, 4, (1.0, 1.0, 6, 0, 1.0, 0.0)),
    ]
    for batches, height, width, anchors, parameters in cases:
        model = _proposals_model(code, batches, height, width, anchors, nchw, parameters)
        compilations = _claimed_and_compiled(model, reference, ort_device)
        proposed = 0
        for trial in range(6):
            scaled = trial >= 4
            values = _proposal_inputs(rng, code, batches, height, width, anchors, nchw, scaled)
            expected, actual = (_run(compilation, code, values, outputs=3) for compilation in compilations)
            proposed += len(expected[0])
            for position, (want, got) in enumerate(zip(expected, actual, strict=True)):
                assert got.dtype == want.dtype and got.shape == want.shape
                if scaled and position == 1 and code in (T.TENSOR_FLOAT32, T.TENSOR_FLOAT16):
                    assert within_tolerance(code, want, got, float_tolerance(code, False)).all()
                elif scaled and position == 1:
                    assert np.abs(got.astype(np.int64) - want).max(initial=0) <= 1
                else:
                    assert np.array_equal(got.view(np.uint8), want.view(np.uint8)), (position, got, want)
        assert proposed > 0


def test_generate_proposals_past_its_candidate_bound_is_declined_with_the_reason():
    """More than 64 candidates per image (the pre-NMS limit, or every anchor position): the
    walk of one group per image is slower than the reference's, so it stays there."""
    for pre_limit, claimed in ((-1, False), (200, False), (64, True)):
        model = _proposals_model(T.TENSOR_FLOAT32, 1, 8, 8, 2, False, (1.0, 1.0, pre_limit, 10, 0.5, 0.0))
        [why] = OrtDevice().get_unsupported_reasons(build_hal_model(model)[0])
        assert (why is None) == claimed
        if not claimed:
            assert "candidates per image" in why and "reference" in why


# --- DETECTION_POSTPROCESSING ----------------------------------------------------------------
def _postprocessing_model(code: int, batches: int, anchors: int, classes: int, parameters: tuple) -> nnapi.Model:
    """DETECTION_POSTPROCESSING of scores, box encodings and anchors given at run time; the
    parameters (4 scales, regular, max detections, classes per detection, detections per
    class, score threshold, IoU threshold, background flag) constants."""
    scalar = T.FLOAT16 if code == T.TENSOR_FLOAT16 else T.FLOAT32
    regular, max_detections, classes_per_detection = parameters[4], parameters[5], parameters[6]
    slots = max_detections if regular else max_detections * classes_per_detection
    model = nnapi.Model()
    inputs = [model.add_operand(OperandType(code, shape))
              for shape in ([batches, anchors, classes], [batches, anchors, 4], [anchors, 4])]
    kinds = (scalar,) * 4 + (T.BOOL, T.INT32, T.INT32, T.INT32, scalar, scalar, T.BOOL)
    constants = []
    for kind, value in zip(kinds, parameters, strict=True):
        index = model.add_operand(OperandType(kind))
        model.set_operand_value(index, value)
        constants.append(index)
    outputs = [model.add_operand(OperandType(code, [batches, slots])),
               model.add_operand(OperandType(code, [batches, slots, 4])),
               model.add_operand(OperandType(T.TENSOR_INT32, [batches, slots])),
               model.add_operand(OperandType(T.TENSOR_INT32, [batches]))]
    model.add_operation(Op.DETECTION_POSTPROCESSING, [*inputs, *constants], outputs)
    model.identify_inputs_and_outputs(inputs, outputs)
    model.finish()
    return model


@pytest.mark.parametrize("code", [T.TENSOR_FLOAT32, T.TENSOR_FLOAT16])
@pytest.mark.parametrize("regular", [True, False])
def test_detection_postprocessing_makes_the_reference_selections(code, regular):
    """Bit for bit where exp is exact (dh = dw = 0: boxes on a small grid, touching and
    identical ones, IoUs exactly at the threshold; scores from few levels: ties); with
    scaled boxes (ORT's Exp may differ from numpy's by an ulp) the boxes within the CTS
    tolerance and the rest equal."""
    from nnapi.conformance import float_tolerance, within_tolerance

    reference, ort_device = _devices()
    rng = np.random.default_rng(70 + regular)
    dtype = DTYPES[code]
    cases = [  # batches, anchors, classes, (max detections, classes per detection, per class, thresholds, bg)
        (2, 12, 3, (5, 2, 3, 0.1, 0.5, True)),
        (1, 20, 4, (10, 3, 10, 0.0, 0.3, False)),
        (3, 9, 2, (4, 1, 2, 0.3, 1.0, True)),
    ]
    for batches, anchors, classes, (max_det, per_detection, per_class, score_thr, iou, background) in cases:
        parameters = (2.0, 2.0, 1.0, 1.0, regular, max_det, per_detection, per_class, score_thr, iou, background)
        model = _postprocessing_model(code, batches, anchors, classes, parameters)
        compilations = _claimed_and_compiled(model, reference, ort_device)
        slots = max_det if regular else max_det * per_detection
        detected = 0
        for trial in range(6):
            scaled = trial >= 4
            scores = (rng.integers(0, 6, (batches, anchors, classes)) / 6).astype(dtype)
            deltas = rng.integers(-4, 5, (batches, anchors, 4)) / 2
            if not scaled:
                deltas[..., 2:] = 0
            centre = rng.integers(0, 4, (anchors, 2))
            size = rng.integers(0, 4, (anchors, 2))
            values = [scores, deltas.astype(dtype), np.concatenate([centre, size], axis=1).astype(dtype)]
            results = []
            for compilation in compilations:
                execution = nnapi.Execution(compilation)
                for position, value in enumerate(values):
                    execution.set_input(position, value)
                out = [np.zeros((batches, slots), dtype), np.zeros((batches, slots, 4), dtype),
                       np.zeros((batches, slots), np.int32), np.zeros(batches, np.int32)]
                for position, array in enumerate(out):
                    execution.set_output(position, array)
                execution.compute()
                results.append(out)
            expected, actual = results
            detected += int(expected[3].sum())
            for position, (want, got) in enumerate(zip(expected, actual, strict=True)):
                if scaled and position == 1:
                    assert within_tolerance(code, want, got, float_tolerance(code, False)).all()
                else:
                    assert np.array_equal(got.view(np.uint8), want.view(np.uint8)), (position, got, want)
        assert detected > 0


def test_detection_postprocessing_past_its_size_is_declined_with_the_reason():
    model = _postprocessing_model(T.TENSOR_FLOAT32, 1, 1917, 91,
                                  (10.0, 10.0, 5.0, 5.0, True, 100, 1, 100, 1e-8, 0.6, False))
    [why] = OrtDevice().get_unsupported_reasons(build_hal_model(model)[0])
    assert why is not None and "candidates per image" in why and "reference" in why
