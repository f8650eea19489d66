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
float32 for float16 too. With nnapi[fast] the per-class NMS of regular NMS runs compiled
(``_numba_nms``, the same selections as ``greedy_nms``).
"""

from __future__ import annotations

import numpy as np

from nnapi.codes import OperandCode, OperationCode
from nnapi.operations import _jit
from nnapi.operations._detection_common import (
    FLOAT_TENSORS,
    check_signature,
    float_scalar,
    from_float32,
    greedy_nms,
    greedy_nms_groups,
    hard_suppressor,
    sort_by_score,
    to_float32,
)
from nnapi.operations.base import ExecutionContext, Operation, Shape, ValidationContext, register

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

_compiled_kernel = None


def _compiled_nms():
    """The compiled greedy hard NMS, or None (numba missing, ``NNAPI_NO_NUMBA``, or a
    kernel that failed to load). Loaded once per process, at the first preparation."""
    global _compiled_kernel
    if _jit.kernels() is None:
        return None
    if _compiled_kernel is None:
        from nnapi.operations import _numba_nms

        empty = np.zeros(0, np.int64)
        if _jit.warm_up(_numba_nms.greedy_nms_hard, empty, np.zeros((0, 4), np.float32), np.zeros(0, np.float32),
                        np.float32(0.5), 1, empty.copy()):
            _compiled_kernel = _numba_nms.greedy_nms_hard
    return _compiled_kernel


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
                                                             min(num_classes - 1, classes_per_detection))
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
        """Hard NMS per foreground class, then the best ``max_detections`` overall."""
        num_anchors, num_classes = scores.shape
        flat_scores = scores.reshape(-1).copy()
        compiled = _compiled_nms()
        if compiled is not None:
            corners = np.ascontiguousarray(boxes, dtype=np.float32)
            selected = np.empty(num_anchors, np.int64)
            kept = []
            for label in range(1, num_classes):
                column = np.ascontiguousarray(scores[:, label])
                count = compiled(np.flatnonzero(column > threshold).astype(np.int64, copy=False), corners, column,
                                 iou_threshold, per_class, selected)
                kept.append(selected[:count] * num_classes + label)
            chosen = sort_by_score(np.concatenate(kept), flat_scores)[:max_detections]
            anchor_of, classes = np.divmod(chosen, num_classes)
            return anchor_of, classes, flat_scores[chosen]
        flat_boxes = np.repeat(boxes, num_classes, axis=0)   # flat index a * num_classes + c
        flat = np.arange(num_anchors)[:, None] * num_classes + np.arange(1, num_classes)
        candidates = [column[flat_scores[column] > threshold] for column in flat.T]
        kept = greedy_nms_groups(flat_scores, flat_boxes, candidates, suppress, per_class)
        chosen = sort_by_score(np.concatenate(kept), flat_scores)[:max_detections]
        anchor_of, classes = np.divmod(chosen, num_classes)
        return anchor_of, classes, flat_scores[chosen]

    @staticmethod
    def _fast(scores: np.ndarray, boxes: np.ndarray, threshold: np.float32, suppress, max_detections: int,
              classes_per_anchor: int):
        """One hard NMS on each anchor's best foreground score; each kept anchor reports its
        ``classes_per_anchor`` best classes."""
        foreground = scores[:, 1:]
        best = foreground.max(axis=1)
        candidates = np.flatnonzero(best > threshold)
        kept = greedy_nms(best.copy(), boxes, candidates, suppress, max_detections)
        ranked = np.argsort(-foreground[kept], axis=1, kind="stable")[:, :classes_per_anchor] + 1
        anchor_of = np.repeat(kept, classes_per_anchor)
        classes = ranked.reshape(-1)
        return anchor_of, classes, scores[anchor_of, classes]
