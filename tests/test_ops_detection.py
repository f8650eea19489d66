"""Detection operations beyond the CTS vectors: TENSOR_QUANT8_ASYMM_SIGNED, the three NMS
kernels worked out by hand, batch splits, outputs with unspecified dimensions, constants
through shared memory, zero-sized results flowing into another operation, float16, and
bad signatures (BAD_DATA at add_operation)."""

from __future__ import annotations

import numpy as np
import pytest

import nnapi
from helpers import build_single_op_model, f16, f32, i32, q8, run_single_op, s8
from nnapi import OperandCode as T
from nnapi import OperandType
from nnapi import OperationCode as Op


def boxes16(dims):
    return OperandType(T.TENSOR_QUANT16_ASYMM, dims, 0.125, 0)


FLOAT = OperandType(T.FLOAT32)
HALF = OperandType(T.FLOAT16)
INT = OperandType(T.INT32)
BOOL = OperandType(T.BOOL)


def iou(a, b):
    inter = max(min(a[2], b[2]) - max(a[0], b[0]), 0) * max(min(a[3], b[3]) - max(a[1], b[1]), 0)
    area = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1])
    return inter / (area - inter)


# --- BOX_WITH_NMS_LIMIT -----------------------------------------------------------------
# Three class-1 boxes: the first two overlap (IoU 81 / 119), the third is apart.
NMS_SCORES = np.array([[0.1, 0.9], [0.1, 0.8], [0.1, 0.7]], np.float32)
NMS_BOXES = np.array([[0, 0, 1, 1, 0, 0, 10, 10], [0, 0, 1, 1, 1, 1, 11, 11], [0, 0, 1, 1, 20, 20, 30, 30]],
                     np.float32)
OVERLAP = iou([0, 0, 10, 10], [1, 1, 11, 11])


def nms(kernel, scores=NMS_SCORES, boxes=NMS_BOXES, batches=(0, 0, 0), max_detections=-1, score_type=f32,
        box_type=f32, scalar=FLOAT, iou_threshold=0.5, sigma=0.5, nms_threshold=0.1, **feeds_kw):
    rois, classes = scores.shape
    score_operand = score_type((rois, classes))
    outputs = [score_type((0,)), box_type((0, 4)), i32((0,)), i32((0,))]
    return run_single_op(Op.BOX_WITH_NMS_LIMIT, [
        (score_operand, None), (box_type((rois, classes * 4)), None), (i32((rois,)), np.array(batches)),
        (scalar, 0.3), (INT, max_detections), (INT, kernel), (scalar, iou_threshold), (scalar, sigma),
        (scalar, nms_threshold)], outputs, [scores, boxes], **feeds_kw)


def test_nms_hard_kernel_drops_the_overlapping_box():
    scores, boxes, classes, batches = nms(0)
    np.testing.assert_allclose(scores, [0.9, 0.7])
    np.testing.assert_array_equal(boxes, [[0, 0, 10, 10], [20, 20, 30, 30]])
    assert classes.tolist() == [1, 1] and batches.tolist() == [0, 0]


def test_nms_linear_kernel_rescales_the_overlapping_box():
    scores, boxes, classes, _ = nms(1)
    np.testing.assert_allclose(scores, [0.9, 0.7, 0.8 * (1 - OVERLAP)], rtol=1e-6)
    np.testing.assert_array_equal(boxes[2], [1, 1, 11, 11])
    assert classes.tolist() == [1, 1, 1]


def test_nms_gaussian_kernel_and_score_floor():
    scores, _, _, _ = nms(2)
    np.testing.assert_allclose(scores, [0.9, 0.7, 0.8 * np.exp(-OVERLAP**2 / 0.5)], rtol=1e-6)
    # A floor above the rescaled score drops the box.
    scores, _, _, _ = nms(2, nms_threshold=0.35)
    np.testing.assert_allclose(scores, [0.9, 0.7])


def test_nms_limit_and_batch_split():
    scores = np.concatenate([NMS_SCORES, NMS_SCORES[::-1]])
    boxes = np.concatenate([NMS_BOXES, NMS_BOXES[::-1]])
    out_scores, out_boxes, classes, batches = nms(1, scores, boxes, batches=(4, 4, 4, 2, 2, 2), max_detections=2)
    np.testing.assert_allclose(out_scores, [0.9, 0.7, 0.9, 0.7])
    assert batches.tolist() == [4, 4, 2, 2]
    np.testing.assert_array_equal(out_boxes[2:], [[0, 0, 10, 10], [20, 20, 30, 30]])


def test_nms_quant8_signed_matches_unsigned():
    real_boxes = NMS_BOXES
    q_boxes = (real_boxes / 0.125).astype(np.uint16)
    unsigned = nms(1, np.round(NMS_SCORES / 0.01).astype(np.uint8), q_boxes,
                   score_type=lambda d: q8(d, 0.01, 0), box_type=boxes16)
    signed = nms(1, (np.round(NMS_SCORES / 0.01) - 128).astype(np.int8), q_boxes,
                 score_type=lambda d: s8(d, 0.01, -128), box_type=boxes16)
    assert signed[0].dtype == np.int8
    np.testing.assert_array_equal(signed[0].astype(int) + 128, unsigned[0])
    for got, want in zip(signed[1:], unsigned[1:], strict=True):
        np.testing.assert_array_equal(got, want)
    np.testing.assert_allclose((signed[0].astype(int) + 128) * 0.01, [0.9, 0.7, 0.8 * (1 - OVERLAP)], atol=0.01)


def test_nms_float16_with_constants_in_shared_memory():
    scores, boxes, classes, _ = run_single_op(Op.BOX_WITH_NMS_LIMIT, [
        (f16((3, 2)), NMS_SCORES), (f16((3, 8)), NMS_BOXES), (i32((3,)), np.zeros(3)), (HALF, 0.3), (INT, -1),
        (INT, 0), (HALF, 0.5), (HALF, 0.5), (HALF, 0.1)],
        [f16((0,)), f16((0, 4)), i32((0,)), i32((0,))], constant_memory=True)
    assert scores.dtype == np.float16
    np.testing.assert_allclose(scores, [0.9, 0.7], rtol=1e-3)
    np.testing.assert_array_equal(boxes, [[0, 0, 10, 10], [20, 20, 30, 30]])


def test_nms_nothing_survives_gives_zero_sized_outputs():
    scores, boxes, classes, batches = nms(0, scores=NMS_SCORES * 0.1)
    assert scores.shape == (0,) and boxes.shape == (0, 4) and classes.shape == (0,) and batches.shape == (0,)


def test_zero_sized_nms_result_flows_into_roi_align():
    """BOX_WITH_NMS_LIMIT keeps nothing; ROI_ALIGN then pools zero regions."""
    model = nnapi.Model()
    keep = []

    def constant(op_type, value):
        index = model.add_operand(op_type)
        array = np.asarray(value, dtype=op_type.dtype)
        keep.append(array)
        model.set_operand_value(index, array)
        return index

    scores = model.add_operand(f32((3, 2)))
    nms_inputs = [scores, constant(f32((3, 8)), NMS_BOXES), constant(i32((3,)), [0, 0, 0]), constant(FLOAT, 0.95),
                  constant(INT, -1), constant(INT, 0), constant(FLOAT, 0.5), constant(FLOAT, 0.5),
                  constant(FLOAT, 0.1)]
    nms_outputs = [model.add_operand(t) for t in (f32((0,)), f32((0, 4)), i32((0,)), i32((0,)))]
    model.add_operation(Op.BOX_WITH_NMS_LIMIT, nms_inputs, nms_outputs)
    feature = model.add_operand(f32((1, 4, 4, 1)))
    pooled = model.add_operand(f32((0, 2, 2, 1)))
    model.add_operation(Op.ROI_ALIGN, [feature, nms_outputs[1], nms_outputs[3], constant(INT, 2), constant(INT, 2),
                                       constant(FLOAT, 1.0), constant(FLOAT, 1.0), constant(INT, 2),
                                       constant(INT, 2), constant(BOOL, False)], [pooled])
    model.identify_inputs_and_outputs([scores, feature], [nms_outputs[0], pooled])
    model.finish()
    compilation = nnapi.Compilation(model)
    compilation.finish()
    execution = nnapi.Execution(compilation)
    execution.set_input(0, NMS_SCORES)
    execution.set_input(1, np.arange(16, dtype=np.float32).reshape(1, 4, 4, 1))
    execution.set_output(0, np.zeros(0, np.float32))
    execution.set_output(1, np.zeros(0, np.float32))
    execution.compute()
    assert execution.get_output_operand_dimensions(0) == [0]
    assert execution.get_output_operand_dimensions(1) == [0, 2, 2, 1]


def test_nms_bad_signatures():
    base = [(f32((3, 2)), None), (f32((3, 8)), None), (i32((3,)), None), (FLOAT, 0.3), (INT, -1), (INT, 0),
            (FLOAT, 0.5), (FLOAT, 0.5), (FLOAT, 0.1)]
    outputs = [f32((0,)), f32((0, 4)), i32((0,)), i32((0,))]
    with pytest.raises(nnapi.BadDataError, match="input 1"):
        build_single_op_model(Op.BOX_WITH_NMS_LIMIT, [base[0], (boxes16((3, 8)), None), *base[2:]], outputs)
    with pytest.raises(nnapi.BadDataError, match="input 3"):
        build_single_op_model(Op.BOX_WITH_NMS_LIMIT, [*base[:3], (HALF, 0.3), *base[4:]], outputs)
    with pytest.raises(nnapi.BadDataError, match="inputs"):
        build_single_op_model(Op.BOX_WITH_NMS_LIMIT, base[:8], outputs)
    with pytest.raises(nnapi.BadDataError, match="input 0 must have rank 2"):
        build_single_op_model(Op.BOX_WITH_NMS_LIMIT, [(f32((3, 2, 1)), None), *base[1:]], outputs)
    quant_outputs = [q8((0,), 0.02, 0), boxes16((0, 4)), i32((0,)), i32((0,))]
    with pytest.raises(nnapi.BadDataError, match="scale"):
        build_single_op_model(Op.BOX_WITH_NMS_LIMIT, [(q8((3, 2), 0.01, 0), None), (boxes16((3, 8)), None),
                                                      *base[2:]], quant_outputs)


# --- AXIS_ALIGNED_BBOX_TRANSFORM --------------------------------------------------------------
def test_bbox_transform_quant16_with_signed_deltas():
    rois = np.array([[8, 8, 24, 40]], np.float32)          # w 16, h 32, centre (16, 24)
    deltas = np.array([[0.5, -0.25, 0.0, np.log(0.5)]], np.float32)
    expected = [[16 + 8 - 8, 24 - 8 - 8, 16 + 8 + 8, 24 - 8 + 8]]   # centre (24, 16), w 16, h 16
    (out,) = run_single_op(Op.AXIS_ALIGNED_BBOX_TRANSFORM, [
        (boxes16((1, 4)), (rois / 0.125).astype(np.uint16)),
        (s8((1, 4), 0.05, 3), None), (i32((1,)), [0]), (boxes16((1, 2)), [[64 / 0.125, 64 / 0.125]])],
        [boxes16((0, 0))], [np.round(deltas / 0.05 + 3).astype(np.int8)])
    assert out.dtype == np.uint16
    np.testing.assert_allclose(out * 0.125, expected, atol=0.3)


def test_bbox_transform_clips_to_the_image_with_unspecified_output():
    (out,) = run_single_op(Op.AXIS_ALIGNED_BBOX_TRANSFORM, [
        (f32((1, 4)), [[0, 0, 10, 10]]), (f32((1, 8)), [[0, 0, 0, 0, 1.0, 1.0, 0, 0]]), (i32((1,)), [0]),
        (f32((1, 2)), [[12, 15]])], [f32((1, 8))])
    np.testing.assert_allclose(out, [[0, 0, 10, 10, 10, 10, 15, 12]])
    (empty,) = run_single_op(Op.AXIS_ALIGNED_BBOX_TRANSFORM, [
        (f32((1, 4)), [[0, 0, 10, 10]]), (f32((1, 4)), [[0, 0, 0, 0]]), (i32((1,)), [0]), (f32((1, 2)), [[8, 8]])],
        [f32((0, 0))])
    np.testing.assert_allclose(empty, [[0, 0, 8, 8]])


def test_bbox_transform_bad_signature():
    with pytest.raises(nnapi.BadDataError, match="input 1"):
        build_single_op_model(Op.AXIS_ALIGNED_BBOX_TRANSFORM, [
            (boxes16((1, 4)), None), (f32((1, 4)), None), (i32((1,)), None), (boxes16((1, 2)), None)],
            [boxes16((1, 4))])
    with pytest.raises(nnapi.BadDataError, match="scale"):
        build_single_op_model(Op.AXIS_ALIGNED_BBOX_TRANSFORM, [
            (OperandType(T.TENSOR_QUANT16_ASYMM, (1, 4), 0.25, 0), None), (q8((1, 4), 0.1, 0), None),
            (i32((1,)), None), (boxes16((1, 2)), None)], [boxes16((1, 4))])


# --- ROI_ALIGN / ROI_POOLING ----------------------------------------------------------------
FEATURE = np.arange(16, dtype=np.float32).reshape(1, 4, 4, 1)   # value = 4 * y + x


def roi_align(feature_type, roi_type, feature, rois, out_type, nchw=False, scalar=FLOAT, ratio=2):
    return run_single_op(Op.ROI_ALIGN, [
        (feature_type, feature), (roi_type, rois), (i32((len(rois),)), np.zeros(len(rois))), (INT, 2), (INT, 2),
        (scalar, 1.0), (scalar, 1.0), (INT, ratio), (INT, ratio), (BOOL, nchw)], [out_type])[0]


def test_roi_align_float_is_bilinear_average():
    # Region [0, 0, 2, 2]: bins of 1 pixel, samples at .25 / .75: the value is linear in x and
    # y, so each bin averages to the value at its centre (x + 0.5, y + 0.5).
    out = roi_align(f32((1, 4, 4, 1)), f32((1, 4)), FEATURE, [[0, 0, 2, 2]], f32((0, 0, 0, 0)))
    np.testing.assert_allclose(out[0, :, :, 0], [[2.5, 3.5], [6.5, 7.5]], rtol=1e-6)


def test_roi_align_output_of_unknown_rank():
    out = roi_align(f32((1, 4, 4, 1)), f32((1, 4)), FEATURE, [[0, 0, 2, 2]], f32(()))
    assert out.shape == (1, 2, 2, 1)
    np.testing.assert_allclose(out[0, :, :, 0], [[2.5, 3.5], [6.5, 7.5]], rtol=1e-6)


def test_roi_align_nchw_and_float16_match_nhwc():
    nhwc = roi_align(f32((1, 4, 4, 1)), f32((2, 4)), FEATURE, [[0, 0, 2, 2], [1, 0.5, 3.5, 3]], f32((2, 2, 2, 1)))
    nchw = roi_align(f32((1, 1, 4, 4)), f32((2, 4)), FEATURE.transpose(0, 3, 1, 2), [[0, 0, 2, 2], [1, 0.5, 3.5, 3]],
                     f32((2, 1, 2, 2)), nchw=True)
    np.testing.assert_allclose(nchw.transpose(0, 2, 3, 1), nhwc, rtol=1e-6)
    half = roi_align(f16((1, 4, 4, 1)), f16((2, 4)), FEATURE, [[0, 0, 2, 2], [1, 0.5, 3.5, 3]], f16((2, 2, 2, 1)),
                     scalar=HALF)
    np.testing.assert_allclose(half.astype(np.float32), nhwc, rtol=2e-3)


def test_roi_align_quant8_signed_matches_unsigned_and_float():
    rois = (np.array([[0, 0, 2, 2], [1, 0.5, 3.5, 3]]) / 0.125).astype(np.uint16)
    reference = roi_align(f32((1, 4, 4, 1)), f32((2, 4)), FEATURE, rois * 0.125, f32((2, 2, 2, 1)))
    unsigned = roi_align(q8((1, 4, 4, 1), 0.25, 10), boxes16((2, 4)), (FEATURE / 0.25 + 10).astype(np.uint8), rois,
                         q8((2, 2, 2, 1), 0.125, 5))
    signed = roi_align(s8((1, 4, 4, 1), 0.25, -118), boxes16((2, 4)), (FEATURE / 0.25 - 118).astype(np.int8), rois,
                       s8((2, 2, 2, 1), 0.125, -123))
    assert signed.dtype == np.int8
    np.testing.assert_array_equal(signed.astype(int) + 128, unsigned)
    np.testing.assert_allclose((signed.astype(int) + 123) * 0.125, reference, atol=0.125)


def test_roi_align_bad_signature():
    with pytest.raises(nnapi.BadDataError, match="input 1"):
        build_single_op_model(Op.ROI_ALIGN, [
            (q8((1, 4, 4, 1), 0.25, 0), None), (f32((1, 4)), None), (i32((1,)), None), (INT, 2), (INT, 2),
            (FLOAT, 1.0), (FLOAT, 1.0), (INT, 2), (INT, 2), (BOOL, False)], [q8((1, 2, 2, 1), 0.25, 0)])
    with pytest.raises(nnapi.BadDataError, match="input 0 must have rank 4"):
        build_single_op_model(Op.ROI_ALIGN, [
            (f32((4, 4, 1)), None), (f32((1, 4)), None), (i32((1,)), None), (INT, 2), (INT, 2),
            (FLOAT, 1.0), (FLOAT, 1.0), (INT, 2), (INT, 2), (BOOL, False)], [f32((1, 2, 2, 1))])


def test_roi_pooling_quant8_signed_max():
    feature = (FEATURE - 8).astype(np.int8)                      # scale 1, zero point 0: reals -8..7
    (out,) = run_single_op(Op.ROI_POOLING, [
        (s8((1, 4, 4, 1), 1.0, 0), feature), (boxes16((2, 4)), (np.array([[0, 0, 3, 3], [0, 0, 1, 1]]) / 0.125)),
        (i32((2,)), [0, 0]), (INT, 2), (INT, 2), (FLOAT, 1.0), (FLOAT, 1.0), (BOOL, False)],
        [s8((0, 0, 0, 0), 1.0, 0)])
    assert out.dtype == np.int8
    # Region 0 covers pixels 0..3: bins [0, 2) and [2, 4) in each axis.
    np.testing.assert_array_equal(out[0, :, :, 0] + 8, [[5, 7], [13, 15]])
    # Region 1 covers pixels 0..1: one pixel per bin.
    np.testing.assert_array_equal(out[1, :, :, 0] + 8, [[0, 1], [4, 5]])


def test_roi_pooling_requires_same_quantization():
    with pytest.raises(nnapi.BadDataError, match="scale and zero point"):
        build_single_op_model(Op.ROI_POOLING, [
            (q8((1, 4, 4, 1), 0.5, 0), None), (boxes16((1, 4)), None), (i32((1,)), None), (INT, 2), (INT, 2),
            (FLOAT, 1.0), (FLOAT, 1.0), (BOOL, False)], [q8((1, 2, 2, 1), 0.25, 0)])


# --- HEATMAP_MAX_KEYPOINT -------------------------------------------------------------------
def test_heatmap_peak_in_the_middle_of_a_symmetric_bump():
    # A symmetric peak at (row 2, col 1): the Taylor step is zero, the keypoint is the pixel centre.
    heat = np.zeros((1, 5, 5, 1), np.float32)
    heat[0, 2, 1, 0], heat[0, 1, 1, 0], heat[0, 3, 1, 0], heat[0, 2, 0, 0], heat[0, 2, 2, 0] = 4, 1, 1, 1, 1
    boxes = np.array([[10, 20, 20, 30]], np.float32)
    scores, points = run_single_op(Op.HEATMAP_MAX_KEYPOINT, [(f32((1, 5, 5, 1)), heat), (f32((1, 4)), boxes),
                                                             (BOOL, False)], [f32((0, 0)), f32((0, 0, 0))])
    np.testing.assert_allclose(scores, [[4.0]])
    np.testing.assert_allclose(points, [[[10 + 1.5 / 5 * 10, 20 + 2.5 / 5 * 10]]], rtol=1e-6)


def test_heatmap_quant8_signed():
    heat = np.zeros((1, 1, 4, 4), np.float32)                     # NCHW
    heat[0, 0, 1, 2] = 2.0
    boxes = np.array([[0, 0, 16, 16]])
    scores, points = run_single_op(Op.HEATMAP_MAX_KEYPOINT, [
        (s8((1, 1, 4, 4), 0.5, -10), (heat / 0.5 - 10).astype(np.int8)), (boxes16((1, 4)), boxes / 0.125),
        (BOOL, True)], [s8((1, 1), 0.25, 0), boxes16((1, 1, 2))])
    assert scores.dtype == np.int8 and points.dtype == np.uint16
    # A lone symmetric spike: the Hessian is invertible and the Taylor step is zero.
    np.testing.assert_allclose(scores * 0.25, [[2.0]], atol=0.25)
    np.testing.assert_allclose(points * 0.125, [[[(2 + 0.5) / 4 * 16, (1 + 0.5) / 4 * 16]]], atol=0.125)


# --- GENERATE_PROPOSALS / DETECTION_POSTPROCESSING ------------------------------------------
def test_generate_proposals_quant8_signed_and_unspecified_outputs():
    # One 2x2 anchor on a 2x2 map with stride 4, no deltas: proposals are the shifted anchors.
    scores = np.array([0.9, 0.8, 0.7, 0.6], np.float32).reshape(1, 2, 2, 1)
    anchors = np.array([[0, 0, 2, 2]], np.float32)
    outs = run_single_op(Op.GENERATE_PROPOSALS, [
        (s8((1, 2, 2, 1), 0.01, 0), np.round(scores / 0.01).astype(np.int8)),
        (s8((1, 2, 2, 4), 0.1, 0), np.zeros((1, 2, 2, 4))),
        (OperandType(T.TENSOR_QUANT16_SYMM, (1, 4), 0.125, 0), anchors / 0.125),
        (boxes16((1, 2)), [[64, 64]]), (FLOAT, 4.0), (FLOAT, 4.0), (INT, -1), (INT, 3), (FLOAT, 0.5), (FLOAT, 0.5),
        (BOOL, False)], [s8((0,), 0.01, 0), boxes16((0, 0)), i32((0,))])
    out_scores, out_boxes, batches = outs
    np.testing.assert_array_equal(out_scores, [90, 80, 70])
    np.testing.assert_allclose(out_boxes * 0.125, [[0, 0, 2, 2], [4, 0, 6, 2], [0, 4, 2, 6]])
    assert batches.tolist() == [0, 0, 0]


def test_detection_postprocessing_fast_nms_float16():
    scores = np.array([[[0.0, 0.9, 0.2], [0.0, 0.85, 0.3], [0.0, 0.1, 0.6]]], np.float32)
    anchors = np.array([[0.5, 0.5, 1, 1], [0.5, 0.55, 1, 1], [5, 5, 1, 1]], np.float32)
    out = run_single_op(Op.DETECTION_POSTPROCESSING, [
        (f16((1, 3, 3)), scores), (f16((1, 3, 4)), np.zeros((1, 3, 4))), (f16((3, 4)), anchors),
        (HALF, 10.0), (HALF, 10.0), (HALF, 5.0), (HALF, 5.0), (BOOL, False), (INT, 2), (INT, 2), (INT, 1),
        (HALF, 0.15), (HALF, 0.5), (BOOL, True)], [f16((0, 0)), f16((0, 0, 0)), i32((0, 0)), i32((0,))])
    out_scores, out_boxes, classes, counts = out
    assert out_scores.shape == (1, 4) and counts.tolist() == [4]
    # Anchor 1 overlaps anchor 0 (IoU 0.9 / 1.1) and is suppressed.
    np.testing.assert_allclose(out_scores[0].astype(np.float32), [0.9, 0.2, 0.6, 0.1], rtol=1e-3)
    assert classes[0].tolist() == [1, 2, 2, 1]
    np.testing.assert_allclose(out_boxes[0, 2].astype(np.float32), [4.5, 4.5, 5.5, 5.5])


def test_detection_postprocessing_bad_signature():
    with pytest.raises(nnapi.BadDataError, match="input 0"):
        build_single_op_model(Op.DETECTION_POSTPROCESSING, [
            (q8((1, 3, 3), 0.1, 0), None), (f32((1, 3, 4)), None), (f32((3, 4)), None), (FLOAT, 10.0),
            (FLOAT, 10.0), (FLOAT, 5.0), (FLOAT, 5.0), (BOOL, False), (INT, 2), (INT, 2), (INT, 1), (FLOAT, 0.1),
            (FLOAT, 0.5), (BOOL, True)], [f32((1, 2)), f32((1, 2, 4)), i32((1, 2)), i32((1,))])


def test_swap_compaction_matches_in_place_walk():
    """The vectorized compaction equals walking the candidates and swapping each dropped
    one with the last unexamined candidate (the order that breaks score ties)."""
    from nnapi.operations.detection_common import _compaction_order

    rng = np.random.default_rng(1)
    for _ in range(200):
        size = int(rng.integers(0, 12))
        keep = rng.random(size) < 0.5
        items = list(range(size))
        flags = list(keep)
        position, end = 0, size
        while position < end:
            if flags[position]:
                position += 1
            else:
                end -= 1
                items[position], items[end] = items[end], items[position]
                flags[position], flags[end] = flags[end], flags[position]
        assert _compaction_order(keep).tolist() == items[:end]


def _kernel(code, inputs, outputs):
    """Run a registered kernel directly on tensors (for zero-sized inputs, which only an
    earlier operation can produce)."""
    from nnapi.operations import ExecutionContext, Tensor, get_operation

    tensors = [Tensor(t.type, np.shape(v), t.scale, t.zero_point, None, np.asarray(v, dtype=t.dtype))
               for t, v in inputs]
    ctx = ExecutionContext(code, tensors, outputs)
    operation = get_operation(code)
    shapes = operation.prepare(ctx)
    results = operation.execute(ctx)
    assert [r.shape for r in results] == [tuple(s) for s in shapes]
    return results


def test_zero_sized_inputs_at_kernel_level():
    scores, boxes, batches = _kernel(Op.GENERATE_PROPOSALS, [
        (f32((0, 2, 2, 1)), np.zeros((0, 2, 2, 1))), (f32((0, 2, 2, 4)), np.zeros((0, 2, 2, 4))),
        (f32((1, 4)), [[0, 0, 2, 2]]), (f32((0, 2)), np.zeros((0, 2))), (FLOAT, 4.0), (FLOAT, 4.0), (INT, -1),
        (INT, -1), (FLOAT, 0.5), (FLOAT, 0.5), (BOOL, False)], [f32((0,)), f32((0, 4)), i32((0,))])
    assert scores.shape == (0,) and boxes.shape == (0, 4) and batches.shape == (0,)
    heat_scores, points = _kernel(Op.HEATMAP_MAX_KEYPOINT, [
        (f32((0, 4, 4, 3)), np.zeros((0, 4, 4, 3))), (f32((0, 4)), np.zeros((0, 4))), (BOOL, False)],
        [f32((0, 3)), f32((0, 3, 2))])
    assert heat_scores.shape == (0, 3) and points.shape == (0, 3, 2)
    (moved,) = _kernel(Op.AXIS_ALIGNED_BBOX_TRANSFORM, [
        (f32((0, 4)), np.zeros((0, 4))), (f32((0, 8)), np.zeros((0, 8))), (i32((0,)), np.zeros(0)),
        (f32((1, 2)), [[8, 8]])], [f32((0, 8))])
    assert moved.shape == (0, 8)
    (pooled,) = _kernel(Op.ROI_POOLING, [
        (f32((1, 4, 4, 1)), FEATURE), (f32((0, 4)), np.zeros((0, 4))), (i32((0,)), np.zeros(0)), (INT, 2), (INT, 2),
        (FLOAT, 1.0), (FLOAT, 1.0), (BOOL, True)], [f32((0, 4, 2, 2))])
    assert pooled.shape == (0, 4, 2, 2)


def test_zero_rois_and_anchors_at_kernel_level():
    outs = _kernel(Op.BOX_WITH_NMS_LIMIT, [
        (f32((0, 2)), np.zeros((0, 2))), (f32((0, 8)), np.zeros((0, 8))), (i32((0,)), np.zeros(0)), (FLOAT, 0.3),
        (INT, -1), (INT, 1), (FLOAT, 0.5), (FLOAT, 0.5), (FLOAT, 0.1)],
        [f32((0,)), f32((0, 4)), i32((0,)), i32((0,))])
    assert [o.shape for o in outs] == [(0,), (0, 4), (0,), (0,)]
    for regular in (True, False):
        scores, boxes, classes, counts = _kernel(Op.DETECTION_POSTPROCESSING, [
            (f32((1, 0, 3)), np.zeros((1, 0, 3))), (f32((1, 0, 4)), np.zeros((1, 0, 4))),
            (f32((0, 4)), np.zeros((0, 4))),
            (FLOAT, 10.0), (FLOAT, 10.0), (FLOAT, 5.0), (FLOAT, 5.0), (BOOL, regular), (INT, 2), (INT, 1), (INT, 1),
            (FLOAT, 0.1), (FLOAT, 0.5), (BOOL, False)], [f32((1, 2)), f32((1, 2, 4)), i32((1, 2)), i32((1,))])
        assert counts.tolist() == [0] and scores.tolist() == [[0.0, 0.0]] and boxes.shape == (1, 2, 4)


@pytest.mark.parametrize("kernel", [0, 1, 2, "hard-drop"])
def test_grouped_nms_matches_one_group_at_a_time(kernel):
    """All classes advanced together select, rescore and break ties exactly as NMS run on
    each class alone (scores with many ties, degenerate boxes, every limit)."""
    from nnapi.operations.detection_common import greedy_nms, greedy_nms_groups, hard_suppressor, soft_suppressor

    rng = np.random.default_rng(7)
    for _ in range(150):
        size, groups = int(rng.integers(0, 25)), int(rng.integers(1, 5))
        scores = (np.round(rng.random(size * groups) * 10) / 10).astype(np.float32)
        corner = rng.integers(0, 8, (size * groups, 2))
        boxes = np.concatenate([corner, corner + rng.integers(0, 6, (size * groups, 2))], axis=1).astype(np.float32)
        shuffled = rng.permutation(size * groups)
        candidates = [shuffled[g::groups][rng.random(shuffled[g::groups].size) < 0.8] for g in range(groups)]
        suppress = hard_suppressor(0.4) if kernel == "hard-drop" else soft_suppressor(kernel, 0.4, 0.5, 0.05)
        limit = int(rng.choice([-1, 0, 1, 3]))
        alone_scores, together_scores = scores.copy(), scores.copy()
        alone = [greedy_nms(alone_scores, boxes, c, suppress, limit) for c in candidates]
        together = greedy_nms_groups(together_scores, boxes, candidates, suppress, limit)
        assert [a.tolist() for a in alone] == [t.tolist() for t in together]
        chosen = np.concatenate(alone)
        np.testing.assert_array_equal(alone_scores[chosen], together_scores[chosen])


def _per_class_then_sorted(scores, boxes, threshold, iou_threshold, per_class, max_detections):
    """Regular NMS as the specification states it: every foreground class's greedy hard
    NMS to its end (at most ``per_class``), the selections concatenated by class, sorted
    by descending score (stable) and cut to ``max_detections``."""
    from nnapi.operations.detection_common import greedy_nms, hard_suppressor, sort_by_score

    classes = scores.shape[1]
    kept = [greedy_nms(scores[:, label].copy(), boxes, np.flatnonzero(scores[:, label] > threshold),
                       hard_suppressor(iou_threshold), per_class) * classes + label for label in range(1, classes)]
    chosen = sort_by_score(np.concatenate(kept), scores.reshape(-1))[:max_detections]
    return np.divmod(chosen, classes)


def random_detection_case(rng, case):
    """Scores with few levels on odd cases (ties within and across classes), boxes on a
    small grid (equal and touching boxes), some degenerate."""
    anchors, classes = int(rng.integers(0, 60)), int(rng.integers(2, 9))
    levels = int(rng.integers(2, 6))
    scores = ((rng.integers(0, levels, (anchors, classes)) / levels) if case % 2 else
              rng.random((anchors, classes))).astype(np.float32)
    corner = rng.integers(0, 8, (anchors, 2))
    boxes = np.concatenate([corner, corner + rng.integers(0, 5, (anchors, 2))], axis=1).astype(np.float32)
    threshold = np.float32(rng.choice([0.0, 0.1, 0.5]))
    iou_threshold = np.float32(rng.choice([0.0, 0.3, 0.6, 1.0]))
    return scores, boxes, threshold, iou_threshold, int(rng.integers(1, 8)), int(rng.integers(1, 30))


def test_regular_detection_postprocessing_merges_the_class_walks_exactly(monkeypatch):
    """Regular NMS advancing only the class whose next selection scores highest gives what
    running every class's walk to its end and sorting gives: the same anchors and classes
    in the same order, score ties within and across classes included (numpy path)."""
    from nnapi.operations import _jit
    from nnapi.operations import detection_postprocessing as dp
    from nnapi.operations.detection_common import hard_suppressor

    monkeypatch.setenv(_jit.DISABLE_VARIABLE, "1")
    rng = np.random.default_rng(11)
    selected = 0
    for case in range(300):
        scores, boxes, threshold, iou_threshold, per_class, limit = random_detection_case(rng, case)
        want = _per_class_then_sorted(scores, boxes, threshold, iou_threshold, per_class, limit)
        anchors, classes, kept = dp.DetectionPostprocessing._regular(
            scores, boxes, threshold, hard_suppressor(iou_threshold), per_class, limit, iou_threshold)
        assert anchors.tolist() == want[0].tolist() and classes.tolist() == want[1].tolist(), f"case {case}"
        np.testing.assert_array_equal(kept, scores[want[0], want[1]])
        selected += anchors.size
    assert selected > 1500
