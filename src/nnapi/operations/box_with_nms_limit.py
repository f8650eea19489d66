"""BOX_WITH_NMS_LIMIT: per-image, per-class greedy non-maximum suppression with a limit.

Inputs: 0 scores [num_rois, num_classes], 1 boxes [num_rois, num_classes * 4], 2 batch index
of each roi [num_rois] (boxes of one image are consecutive), 3 score threshold, 4 maximum
detections per image (< 0: no limit), 5 kernel (0 hard, 1 linear, 2 gaussian), 6 IoU
threshold, 7 gaussian sigma, 8 NMS score threshold. Class 0 is the background and is
skipped. Outputs (num_output_rois may be 0): 0 scores, 1 boxes [n, 4], 2 classes, 3 batch
indexes; grouped by image, then ordered by class and descending score.

Quantized scores come with TENSOR_QUANT16_ASYMM boxes (scale 0.125, zero point 0), copied
to the output unchanged; output scores keep the input's scale and zero point.
"""

from __future__ import annotations

import numpy as np

from nnapi.codes import OperandCode, OperationCode
from nnapi.operations.base import ExecutionContext, Operation, Shape, ValidationContext, register
from nnapi.operations.detection_common import (
    FLOAT_TENSORS,
    QUANT8_TENSORS,
    batch_runs,
    check_box_quantization,
    check_signature,
    float_scalar,
    from_float32,
    greedy_nms_groups,
    soft_suppressor,
    sort_by_score,
    to_float32,
)

# Input and output positions, as Android names them (kInputTensor, ...).
SCORE_TENSOR = 0
ROI_TENSOR = 1
BATCHES_TENSOR = 2
SCORE_THRESHOLD_SCALAR = 3
MAX_NUM_DETECTION_SCALAR = 4
NMS_KERNEL_SCALAR = 5
IOU_THRESHOLD_SCALAR = 6
SIGMA_SCALAR = 7
NMS_SCORE_THRESHOLD_SCALAR = 8
OUTPUT_SCORE_TENSOR = 0
OUTPUT_ROI_TENSOR = 1
OUTPUT_CLASS_TENSOR = 2
OUTPUT_BATCHES_TENSOR = 3

T = OperandCode


@register(OperationCode.BOX_WITH_NMS_LIMIT, zero_sized_inputs=True)
class BoxWithNmsLimit(Operation):
    def validate(self, ctx: ValidationContext) -> None:
        ctx.check_counts(inputs=9, outputs=4)
        score_type = ctx.input_type(SCORE_TENSOR)
        if score_type in FLOAT_TENSORS:
            box_type = score_type
        elif score_type in QUANT8_TENSORS:
            box_type = T.TENSOR_QUANT16_ASYMM
        else:
            ctx.fail(f"input 0 must be a float or quant8 asymm tensor, got {score_type.name}")
        real = float_scalar(score_type)
        check_signature(ctx, [score_type, box_type, T.TENSOR_INT32, real, T.INT32, T.INT32, real, real, real],
                        [score_type, box_type, T.TENSOR_INT32, T.TENSOR_INT32],
                        input_ranks={0: 2, 1: 2, 2: 1}, output_ranks={0: 1, 1: 2, 2: 1, 3: 1})
        check_box_quantization(ctx, "input", 1)
        check_box_quantization(ctx, "output", 1)
        if score_type in QUANT8_TENSORS:
            ctx.check_same_quantization(("input", 0), ("output", 0))

    def prepare(self, ctx: ExecutionContext) -> list[Shape]:
        scores, boxes, batches = ctx.input(SCORE_TENSOR), ctx.input(ROI_TENSOR), ctx.input(BATCHES_TENSOR)
        ctx.require(scores.rank == 2 and boxes.rank == 2 and batches.rank == 1, "inputs must have ranks 2, 2, 1")
        num_rois, num_classes = scores.shape
        ctx.require(num_classes > 1, "num_classes must be greater than 1 (class 0 is the background)")
        ctx.require(boxes.shape == (num_rois, num_classes * 4),
                    f"boxes must be [{num_rois}, {num_classes * 4}], got {list(boxes.shape)}")
        ctx.require(batches.shape == (num_rois,), f"batch indexes must be [{num_rois}], got {list(batches.shape)}")
        kernel = ctx.scalar(NMS_KERNEL_SCALAR)
        ctx.require(kernel in (0, 1, 2), f"NMS kernel must be 0, 1 or 2, got {kernel}")
        selected, batch_of = self._select(ctx, num_rois, num_classes, kernel)
        ctx.scratch["selection"] = (selected, batch_of)
        count = len(selected[0])
        return [(count,), (count, 4), (count,), (count,)]

    @staticmethod
    def _select(ctx: ExecutionContext, num_rois: int, num_classes: int, kernel: int):
        """The kept (flat score index, adjusted score) pairs of every image, in output order."""
        score_threshold = np.float32(ctx.scalar(SCORE_THRESHOLD_SCALAR))
        max_detections = int(ctx.scalar(MAX_NUM_DETECTION_SCALAR))
        suppress = soft_suppressor(kernel, ctx.scalar(IOU_THRESHOLD_SCALAR), ctx.scalar(SIGMA_SCALAR),
                                   ctx.scalar(NMS_SCORE_THRESHOLD_SCALAR))
        all_scores = to_float32(ctx.input(SCORE_TENSOR))
        all_boxes = to_float32(ctx.input(ROI_TENSOR)).reshape(num_rois, num_classes, 4)
        batch_ids = np.asarray(ctx.value(BATCHES_TENSOR))
        kept_index, kept_score, kept_batch = [], [], []
        for start, stop in batch_runs(batch_ids):
            boxes = all_boxes[start:stop].reshape(-1, 4)
            ctx.require(bool(np.all((boxes[:, 0] <= boxes[:, 2]) & (boxes[:, 1] <= boxes[:, 3]))),
                        "every box needs x1 <= x2 and y1 <= y2")
            # Flat index b * num_classes + c names the score and the box of roi b, class c.
            scores = all_scores[start:stop].reshape(-1).copy()
            # One NMS per foreground class, all classes advanced together.
            flat = np.arange(stop - start)[:, None] * num_classes + np.arange(1, num_classes)
            candidates = [column[scores[column] > score_threshold] for column in flat.T]
            per_class = greedy_nms_groups(scores, boxes, candidates, suppress, max_detections)
            chosen = sort_by_score(np.concatenate(per_class), scores)
            if max_detections >= 0:
                chosen = chosen[:max_detections]
            # Within an image: by class, then by descending score.
            chosen = chosen[np.lexsort((-scores[chosen], chosen % num_classes))]
            kept_index.append(chosen + start * num_classes)
            kept_score.append(scores[chosen])
            kept_batch.append(np.full(chosen.size, batch_ids[start], dtype=np.int32))
        if not kept_index:
            empty = np.zeros(0, dtype=np.int64)
            return (empty, np.zeros(0, np.float32)), np.zeros(0, np.int32)
        return (np.concatenate(kept_index), np.concatenate(kept_score)), np.concatenate(kept_batch)

    def execute(self, ctx: ExecutionContext) -> list[np.ndarray]:
        (flat_index, scores), batch_of = ctx.scratch["selection"]
        num_classes = ctx.input(SCORE_TENSOR).shape[1]
        roi_index, classes = np.divmod(flat_index, num_classes)
        raw_boxes = np.asarray(ctx.value(ROI_TENSOR)).reshape(-1, num_classes, 4)
        boxes = raw_boxes[roi_index, classes].astype(ctx.output_dtype(OUTPUT_ROI_TENSOR), copy=False).reshape(-1, 4)
        return [from_float32(scores, ctx.output(OUTPUT_SCORE_TENSOR)), boxes, classes.astype(np.int32),
                batch_of.astype(np.int32)]
