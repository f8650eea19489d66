"""GENERATE_PROPOSALS: region proposals from anchor scores and box deltas (Faster R-CNN's RPN).

Inputs: 0 scores [batches, height, width, num_anchors] (NCHW: anchors first), 1 deltas
[batches, height, width, num_anchors * 4] ([dx, dy, dw, dh]), 2 anchors [num_anchors, 4]
([x1, y1, x2, y2]), 3 image sizes [batches, 2] ([height, width]), 4/5 height/width stride
of the feature map, 6 pre-NMS limit, 7 post-NMS limit (both <= 0: none), 8 IoU threshold,
9 minimum box size, 10 NCHW flag. Outputs: 0 scores [n], 1 boxes [n, 4], 2 batch index [n],
grouped by image in the order hard NMS selected them; n may be 0.

For each image: every anchor is placed at every feature-map position, moved by its deltas
and clipped to the image; the best ``pre-NMS limit`` are kept, boxes smaller than the
minimum size or centred outside the image are dropped, and hard NMS keeps at most
``post-NMS limit``. Quantized scores come with TENSOR_QUANT16_SYMM anchors and
TENSOR_QUANT16_ASYMM image sizes and output boxes (scale 0.125).
"""

from __future__ import annotations

import numpy as np

from nnapi.codes import OperandCode, OperationCode
from nnapi.operations.base import ExecutionContext, Operation, Shape, ValidationContext, register
from nnapi.operations.common import to_nhwc
from nnapi.operations.detection_common import (
    BOX_SCALE,
    FLOAT_TENSORS,
    QUANT8_TENSORS,
    check_box_quantization,
    check_signature,
    float_scalar,
    from_float32,
    greedy_nms,
    hard_suppressor,
    sort_by_score,
    to_float32,
    transform_boxes,
)

# Input and output positions, as Android names them (kInputTensor, ...).
SCORE_TENSOR = 0
DELTA_TENSOR = 1
ANCHOR_TENSOR = 2
IMAGE_INFO_TENSOR = 3
HEIGHT_STRIDE_SCALAR = 4
WIDTH_STRIDE_SCALAR = 5
PRE_NMS_MAX_SCALAR = 6
POST_NMS_MAX_SCALAR = 7
IOU_THRESHOLD_SCALAR = 8
MIN_SIZE_SCALAR = 9
LAYOUT_SCALAR = 10
OUTPUT_SCORE_TENSOR = 0
OUTPUT_ROI_TENSOR = 1
OUTPUT_BATCHES_TENSOR = 2

T = OperandCode


@register(OperationCode.GENERATE_PROPOSALS)
class GenerateProposals(Operation):
    def validate(self, ctx: ValidationContext) -> None:
        ctx.check_counts(inputs=11, outputs=3)
        kind = ctx.input_type(SCORE_TENSOR)
        if kind in FLOAT_TENSORS:
            anchor_type = image_type = box_type = kind
        elif kind in QUANT8_TENSORS:
            anchor_type, image_type, box_type = T.TENSOR_QUANT16_SYMM, T.TENSOR_QUANT16_ASYMM, T.TENSOR_QUANT16_ASYMM
        else:
            ctx.fail(f"input 0 must be a float or quant8 asymm tensor, got {kind.name}")
        real = float_scalar(kind)
        check_signature(ctx, [kind, kind, anchor_type, image_type, real, real, T.INT32, T.INT32, real, real, T.BOOL],
                        [kind, box_type, T.TENSOR_INT32], input_ranks={0: 4, 1: 4, 2: 2, 3: 2},
                        output_ranks={0: 1, 1: 2, 2: 1})
        check_box_quantization(ctx, "input", 3)
        check_box_quantization(ctx, "output", 1)
        if kind in QUANT8_TENSORS:
            anchors = ctx.inputs[ANCHOR_TENSOR]
            if anchors.scale != BOX_SCALE:
                ctx.fail(f"input 2 (anchors) must have scale 0.125, got {anchors.scale}")
            ctx.check_same_quantization(("input", 0), ("output", 0))

    def prepare(self, ctx: ExecutionContext) -> list[Shape]:
        scores, deltas, anchors, image = (ctx.input(i) for i in range(4))
        nchw = bool(ctx.scalar(LAYOUT_SCALAR))
        ctx.require(scores.rank == 4 and deltas.rank == 4 and anchors.rank == 2 and image.rank == 2,
                    "inputs must have ranks 4, 4, 2, 2")
        batches, height, width, num_anchors = (scores.shape[0], *scores.shape[2:], scores.shape[1]) if nchw \
            else scores.shape
        expected = (batches, num_anchors * 4, height, width) if nchw else (batches, height, width, num_anchors * 4)
        ctx.require(deltas.shape == expected, f"deltas must be {list(expected)}, got {list(deltas.shape)}")
        ctx.require(anchors.shape == (num_anchors, 4), f"anchors must be [{num_anchors}, 4]")
        ctx.require(image.shape == (batches, 2), f"image info must be [{batches}, 2]")
        ctx.scratch["proposals"] = self._propose(ctx, nchw)
        count = ctx.scratch["proposals"][0].shape[0]
        return [(count,), (count, 4), (count,)]

    @staticmethod
    def _propose(ctx: ExecutionContext, nchw: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        scores = to_nhwc(to_float32(ctx.input(SCORE_TENSOR)), nchw)
        batches, height, width, num_anchors = scores.shape
        positions = height * width * num_anchors
        scores = scores.reshape(batches, positions)
        deltas = to_nhwc(to_float32(ctx.input(DELTA_TENSOR)), nchw).reshape(batches, positions, 4)
        anchors = to_float32(ctx.input(ANCHOR_TENSOR))
        image = to_float32(ctx.input(IMAGE_INFO_TENSOR))
        ctx.require(bool(np.all((anchors[:, 0] <= anchors[:, 2]) & (anchors[:, 1] <= anchors[:, 3]))),
                    "every anchor needs x1 <= x2 and y1 <= y2")
        height_stride = np.float32(ctx.scalar(HEIGHT_STRIDE_SCALAR))
        width_stride = np.float32(ctx.scalar(WIDTH_STRIDE_SCALAR))
        pre_limit, post_limit = int(ctx.scalar(PRE_NMS_MAX_SCALAR)), int(ctx.scalar(POST_NMS_MAX_SCALAR))
        suppress = hard_suppressor(ctx.scalar(IOU_THRESHOLD_SCALAR))
        min_size = np.float32(ctx.scalar(MIN_SIZE_SCALAR))
        # Anchor a at feature position (h, w), in image coordinates: [h, w, a, 4] flattened.
        shift_y = np.arange(height, dtype=np.float32) * height_stride
        shift_x = np.arange(width, dtype=np.float32) * width_stride
        shifts = np.zeros((height, width, 1, 4), dtype=np.float32)
        shifts[..., 0::2] = shift_x[None, :, None, None]
        shifts[..., 1::2] = shift_y[:, None, None, None]
        placed = (anchors[None, None, :, :] + shifts).reshape(-1, 4)
        out_scores, out_boxes, out_batches = [], [], []
        for b in range(batches):
            image_height, image_width = image[b, 0], image[b, 1]
            boxes = transform_boxes(placed, deltas[b][:, None, :], image_height, image_width)[:, 0, :]
            candidates = np.arange(placed.shape[0])
            if 0 < pre_limit < candidates.size:
                candidates = sort_by_score(candidates, scores[b])[:pre_limit]
            chosen = boxes[candidates]
            box_w = chosen[:, 2] - chosen[:, 0]
            box_h = chosen[:, 3] - chosen[:, 1]
            center_x = chosen[:, 0] + box_w / np.float32(2)
            center_y = chosen[:, 1] + box_h / np.float32(2)
            usable = (box_w > min_size) & (box_h > min_size) & (center_x < image_width) & (center_y < image_height)
            candidates = candidates[usable]
            kept = greedy_nms(scores[b].copy(), boxes, candidates, suppress, post_limit if post_limit > 0 else -1)
            out_scores.append(scores[b][kept])
            out_boxes.append(boxes[kept])
            out_batches.append(np.full(kept.size, b, dtype=np.int32))
        if not out_scores:   # no images (a zero-sized batch from an earlier operation)
            return np.zeros(0, np.float32), np.zeros((0, 4), np.float32), np.zeros(0, np.int32)
        return np.concatenate(out_scores), np.concatenate(out_boxes).reshape(-1, 4), np.concatenate(out_batches)

    def execute(self, ctx: ExecutionContext) -> list[np.ndarray]:
        scores, boxes, batch_ids = ctx.scratch["proposals"]
        return [from_float32(scores, ctx.output(OUTPUT_SCORE_TENSOR)),
                from_float32(boxes, ctx.output(OUTPUT_ROI_TENSOR)), batch_ids]
