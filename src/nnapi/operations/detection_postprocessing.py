"""DETECTION_POSTPROCESSING: SSD-style decoding of anchor deltas followed by hard NMS.

Inputs: 0 class scores [batches, num_anchors, num_classes] (class 0: background), 1 box
encodings [batches, num_anchors, >= 4] ([dy, dx, dh, dw, ...]), 2 anchors [num_anchors, 4]
([center y, center x, h, w]), 3-6 scales of dy, dx, dh, dw, 7 regular (per-class) NMS
flag, 8 maximum detections, 9 classes per detection (fast NMS), 10 detections per class
(regular NMS), 11 score threshold, 12 IoU threshold, 13 whether label 0 is the background.
Outputs: 0 scores [batches, d], 1 boxes [batches, d, 4] ([y1, x1, y2, x2]), 2 classes
[batches, d], 3 valid detections per image [batches]; d = maximum detections (times the
classes per detection for fast NMS); unused slots are zero.

Regular NMS runs hard NMS per class and keeps the best overall; fast NMS runs one hard
NMS on each anchor's best class score and reports that anchor's top classes. Computed in
float32 for float16 too. Regular NMS advances only the class walks whose selections can
still reach the output (``_regular``): at an SSD's 1,917 anchors x 90 classes, 100 kept,
that is ~100 selection steps where walking every class to its end took ~9,000. With
nnapi[fast] both walks run compiled (``_numba_nms``, the same selections as
``greedy_nms``).
"""

from __future__ import annotations

import numpy as np

from nnapi.codes import OperandCode, OperationCode
from nnapi.operations import _jit
from nnapi.operations.base import ExecutionContext, Operation, Shape, ValidationContext, register
from nnapi.operations.detection_common import (
    FLOAT_TENSORS,
    GreedyWalk,
    check_signature,
    float_scalar,
    from_float32,
    greedy_nms,
    hard_suppressor,
    to_float32,
)

# Input and output positions, as Android names them (kInputTensor, ...).
SCORE_TENSOR = 0
DELTA_TENSOR = 1
ANCHOR_TENSOR = 2
SCALE_Y_SCALAR = 3
SCALE_X_SCALAR = 4
SCALE_H_SCALAR = 5
SCALE_W_SCALAR = 6
USE_REGULAR_NMS_SCALAR = 7
MAX_NUM_DETECTION_SCALAR = 8
MAX_CLASSES_PER_DETECTION_SCALAR = 9
MAX_NUM_DETECTION_PER_CLASS_SCALAR = 10
SCORE_THRESHOLD_SCALAR = 11
IOU_THRESHOLD_SCALAR = 12
IS_BG_IN_LABEL_SCALAR = 13
OUTPUT_SCORE_TENSOR = 0
OUTPUT_ROI_TENSOR = 1
OUTPUT_CLASS_TENSOR = 2
OUTPUT_DETECTION_TENSOR = 3

T = OperandCode

_compiled_module = None


def _compiled_nms():
    """The compiled NMS kernels (``_numba_nms``), or None (numba missing, ``NNAPI_NO_NUMBA``,
    or a kernel that failed to load). Loaded once per process, at the first preparation."""
    global _compiled_module
    if _jit.kernels() is None:
        return None
    if _compiled_module is None:
        from nnapi.operations import _numba_nms as kernels

        empty, boxes, scores = np.zeros(0, np.int64), np.zeros((0, 4), np.float32), np.zeros((0, 2), np.float32)
        small = np.zeros(2, np.int64)
        if (_jit.warm_up(kernels.greedy_nms_hard, empty, boxes, np.zeros(0, np.float32), np.float32(0.5), 1,
                         empty.copy(), np.zeros((5, 0), np.float32), np.zeros(0, np.bool_))
                and _jit.warm_up(kernels.greedy_nms_hard_by_score, empty, boxes, np.zeros(0, np.float32),
                                 np.float32(0.5), 1, empty.copy())
                and _jit.warm_up(kernels.per_class_nms_merged, scores, boxes, np.float32(0), np.float32(0.5), 1, 1,
                                 np.zeros((2, 0), np.int64), small, small.copy(), np.zeros(2, np.float32),
                                 np.zeros(2, np.bool_), small.copy(), empty.copy(), empty.copy())
                and _jit.warm_up(kernels.row_maxima, scores, 1, np.zeros(0, np.float32))):
            _compiled_module = kernels
    return _compiled_module


@register(OperationCode.DETECTION_POSTPROCESSING)
class DetectionPostprocessing(Operation):
    def validate(self, ctx: ValidationContext) -> None:
        ctx.check_counts(inputs=14, outputs=4)
        kind = ctx.input_type(SCORE_TENSOR)
        if kind not in FLOAT_TENSORS:
            ctx.fail(f"input 0 must be TENSOR_FLOAT32 or TENSOR_FLOAT16, got {kind.name}")
        real = float_scalar(kind)
        check_signature(ctx, [kind, kind, kind, real, real, real, real, T.BOOL, T.INT32, T.INT32, T.INT32, real,
                              real, T.BOOL], [kind, kind, T.TENSOR_INT32, T.TENSOR_INT32],
                        input_ranks={0: 3, 1: 3, 2: 2}, output_ranks={0: 2, 1: 3, 2: 2, 3: 1})

    def prepare(self, ctx: ExecutionContext) -> list[Shape]:
        scores, deltas, anchors = ctx.input(SCORE_TENSOR), ctx.input(DELTA_TENSOR), ctx.input(ANCHOR_TENSOR)
        ctx.require(scores.rank == 3 and deltas.rank == 3 and anchors.rank == 2, "inputs must have ranks 3, 3, 2")
        batches, num_anchors, num_classes = scores.shape
        ctx.require(deltas.shape[:2] == (batches, num_anchors) and deltas.shape[2] >= 4,
                    f"box encodings must be [{batches}, {num_anchors}, >= 4], got {list(deltas.shape)}")
        ctx.require(anchors.shape == (num_anchors, 4), f"anchors must be [{num_anchors}, 4]")
        ctx.require(num_classes > 1, "num_classes must be greater than 1 (class 0 is the background)")
        ctx.require(all(ctx.scalar(i) > 0 for i in (3, 4, 5, 6)), "box scales must be positive")
        ctx.require(ctx.scalar(SCORE_THRESHOLD_SCALAR) >= 0 and ctx.scalar(IOU_THRESHOLD_SCALAR) >= 0,
                    "thresholds must be non-negative")
        detections = ctx.scalar(MAX_NUM_DETECTION_SCALAR)
        ctx.require(detections > 0, "the maximum number of detections must be positive")
        if ctx.scalar(USE_REGULAR_NMS_SCALAR):
            ctx.require(ctx.scalar(MAX_NUM_DETECTION_PER_CLASS_SCALAR) > 0, "detections per class must be positive")
        else:
            ctx.require(ctx.scalar(MAX_CLASSES_PER_DETECTION_SCALAR) > 0, "classes per detection must be positive")
            detections *= ctx.scalar(MAX_CLASSES_PER_DETECTION_SCALAR)
        _compiled_nms()  # loaded here, at preparation, rather than in a run
        return [(batches, detections), (batches, detections, 4), (batches, detections), (batches,)]

    def execute(self, ctx: ExecutionContext) -> list[np.ndarray]:
        scores = to_float32(ctx.input(SCORE_TENSOR))
        batches, num_anchors, num_classes = scores.shape
        deltas = to_float32(ctx.input(DELTA_TENSOR))[..., :4]
        anchors = to_float32(ctx.input(ANCHOR_TENSOR))
        scale_y, scale_x, scale_h, scale_w = (np.float32(ctx.scalar(i)) for i in (3, 4, 5, 6))
        regular = bool(ctx.scalar(USE_REGULAR_NMS_SCALAR))
        max_detections, classes_per_detection, per_class = (int(ctx.scalar(i)) for i in (8, 9, 10))
        threshold = np.float32(ctx.scalar(SCORE_THRESHOLD_SCALAR))
        iou_threshold = np.float32(ctx.scalar(IOU_THRESHOLD_SCALAR))
        suppress = hard_suppressor(iou_threshold)
        label_offset = 0 if ctx.scalar(IS_BG_IN_LABEL_SCALAR) else 1
        slots = max_detections if regular else max_detections * classes_per_detection
        out_scores = np.zeros((batches, slots), np.float32)
        out_boxes = np.zeros((batches, slots, 4), np.float32)
        out_classes = np.zeros((batches, slots), np.int32)
        out_counts = np.zeros(batches, np.int32)
        # Decoded boxes [batches, anchors, 4] as [y1, x1, y2, x2] (IoU does not care which
        # axis comes first).
        half = np.float32(0.5)
        with np.errstate(over="ignore"):
            center_y = anchors[:, 0] + anchors[:, 2] * deltas[..., 0] / scale_y
            center_x = anchors[:, 1] + anchors[:, 3] * deltas[..., 1] / scale_x
            half_h = anchors[:, 2] * np.exp(deltas[..., 2] / scale_h) * half
            half_w = anchors[:, 3] * np.exp(deltas[..., 3] / scale_w) * half
        decoded = np.stack([center_y - half_h, center_x - half_w, center_y + half_h, center_x + half_w],
                           axis=-1).astype(np.float32)
        for b in range(batches):
            boxes = decoded[b]
            if regular:
                anchor_of, classes, kept_scores = self._regular(scores[b], boxes, threshold, suppress, per_class,
                                                                max_detections, iou_threshold)
            else:
                anchor_of, classes, kept_scores = self._fast(scores[b], boxes, threshold, suppress, max_detections,
                                                             min(num_classes - 1, classes_per_detection),
                                                             iou_threshold)
            count = anchor_of.size
            out_scores[b, :count] = kept_scores
            out_boxes[b, :count] = boxes[anchor_of]
            out_classes[b, :count] = classes - label_offset
            out_counts[b] = count
        return [from_float32(out_scores, ctx.output(OUTPUT_SCORE_TENSOR)),
                from_float32(out_boxes, ctx.output(OUTPUT_ROI_TENSOR)), out_classes,
                out_counts]

    @staticmethod
    def _regular(scores: np.ndarray, boxes: np.ndarray, threshold: np.float32, suppress, per_class: int,
                 max_detections: int, iou_threshold: np.float32):
        """Hard NMS per foreground class, then the best ``max_detections`` overall (by
        descending score, equal scores by class, then selection order). Each class's walk
        selects in non-increasing score order, so the walks are merged: only the class
        whose next selection scores highest advances, until ``max_detections`` are taken;
        the classes' walks past that point cannot reach the output."""
        num_anchors, num_classes = scores.shape
        compiled = _compiled_nms()
        if compiled is not None:
            scores = np.ascontiguousarray(scores, dtype=np.float32)
            length, best, picked = (np.zeros(num_classes, np.int64) for _ in range(3))
            anchor_of, classes = np.empty(max_detections, np.int64), np.empty(max_detections, np.int64)
            count = compiled.per_class_nms_merged(
                scores, np.ascontiguousarray(boxes, dtype=np.float32), threshold, iou_threshold, per_class,
                max_detections, np.empty((num_classes, num_anchors), np.int64), length, best,
                np.zeros(num_classes, np.float32), np.zeros(num_classes, np.bool_), picked, anchor_of, classes)
            anchor_of, classes = anchor_of[:count], classes[:count]
            return anchor_of, classes, scores[anchor_of, classes]
        foreground = scores[:, 1:]
        candidate = foreground > threshold
        # each class's first selection: its best candidate
        heads = np.where(candidate, foreground, np.float32(-np.inf)).max(axis=0, initial=np.float32(-np.inf))
        active = candidate.any(axis=0)
        walks: dict[int, GreedyWalk] = {}
        picked = np.zeros(num_classes - 1, np.int64)
        anchors: list[int] = []
        labels: list[int] = []
        while len(anchors) < max_detections:
            column = int(np.argmax(np.where(active, heads, np.float32(-np.inf))))  # the first of equal scores
            if not active[column]:
                break
            walk = walks.get(column)
            if walk is None:
                walk = walks[column] = GreedyWalk(scores[:, column + 1], boxes, np.flatnonzero(candidate[:, column]),
                                                  suppress)
            anchors.append(walk.take()[0])
            labels.append(column + 1)
            picked[column] += 1
            if walk.size == 0 or picked[column] >= per_class:
                active[column] = False
            else:
                heads[column] = walk.best_score()
        anchor_of, classes = np.array(anchors, np.int64), np.array(labels, np.int64)
        return anchor_of, classes, scores[anchor_of, classes]

    @staticmethod
    def _fast(scores: np.ndarray, boxes: np.ndarray, threshold: np.float32, suppress, max_detections: int,
              classes_per_anchor: int, iou_threshold: np.float32):
        """One hard NMS on each anchor's best foreground score; each kept anchor reports its
        ``classes_per_anchor`` best classes."""
        foreground = scores[:, 1:]
        compiled = _compiled_nms()
        if compiled is not None:
            best = np.empty(scores.shape[0], np.float32)
            compiled.row_maxima(np.ascontiguousarray(scores, dtype=np.float32), 1, best)
            candidates = np.flatnonzero(best > threshold)
            selected = np.empty(candidates.size, np.int64)
            boxes = np.ascontiguousarray(boxes, dtype=np.float32)
            count = compiled.greedy_nms_hard_by_score(candidates.copy(), boxes, best, iou_threshold, max_detections,
                                                      selected)
            if count < 0:  # candidates of equal scores: the walk's order decides
                count = compiled.greedy_nms_hard(candidates, boxes, best, iou_threshold, max_detections, selected,
                                                 np.empty((5, candidates.size), np.float32),
                                                 np.empty(candidates.size, np.bool_))
            kept = selected[:count]
        else:
            best = foreground.max(axis=1)
            kept = greedy_nms(best.copy(), boxes, np.flatnonzero(best > threshold), suppress, max_detections)
        ranked = np.argsort(-foreground[kept], axis=1, kind="stable")[:, :classes_per_anchor] + 1
        anchor_of = np.repeat(kept, classes_per_anchor)
        classes = ranked.reshape(-1)
        return anchor_of, classes, scores[anchor_of, classes]
