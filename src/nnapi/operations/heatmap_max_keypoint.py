"""HEATMAP_MAX_KEYPOINT: sub-pixel maximum of each keypoint heatmap, mapped into its box.

Inputs: 0 heatmaps [num_boxes, size, size, num_keypoints] (NCHW: keypoints first; size >=
2), 1 boxes [num_boxes, 4] ([x1, y1, x2, y2]), 2 NCHW flag. Outputs: 0 scores [num_boxes,
num_keypoints], 1 keypoints [num_boxes, num_keypoints, 2] ([x, y]).

Around the arg-max pixel, a second-order Taylor expansion of the 3x3 neighbourhood (edges
mirrored) gives the offset of the true maximum (clipped to 1.5 pixels) and its score; a
singular Hessian leaves the pixel maximum. Everything is computed in float32 for all boxes
and keypoints at once.
"""

from __future__ import annotations

import numpy as np

from nnapi.codes import OperandCode, OperationCode
from nnapi.operations.base import ExecutionContext, Operation, Shape, ValidationContext, register
from nnapi.operations.common import to_nhwc
from nnapi.operations.detection_common import (
    FLOAT_TENSORS,
    QUANT8_TENSORS,
    check_box_quantization,
    check_signature,
    from_float32,
    to_float32,
)

# Input and output positions, as Android names them (kInputTensor, ...).
HEATMAP_TENSOR = 0
BOXES_TENSOR = 1
LAYOUT_SCALAR = 2
OUTPUT_SCORE_TENSOR = 0
OUTPUT_KEYPOINT_TENSOR = 1

T = OperandCode


@register(OperationCode.HEATMAP_MAX_KEYPOINT)
class HeatmapMaxKeypoint(Operation):
    def validate(self, ctx: ValidationContext) -> None:
        ctx.check_counts(inputs=3, outputs=2)
        kind = ctx.input_type(HEATMAP_TENSOR)
        if kind not in FLOAT_TENSORS + QUANT8_TENSORS:
            ctx.fail(f"input 0 must be a float or quant8 asymm tensor, got {kind.name}")
        box_type = kind if kind in FLOAT_TENSORS else T.TENSOR_QUANT16_ASYMM
        check_signature(ctx, [kind, box_type, T.BOOL], [kind, box_type], input_ranks={0: 4, 1: 2},
                        output_ranks={0: 2, 1: 3})
        check_box_quantization(ctx, "input", 1)
        check_box_quantization(ctx, "output", 1)

    def prepare(self, ctx: ExecutionContext) -> list[Shape]:
        heatmap, boxes = ctx.input(HEATMAP_TENSOR), ctx.input(BOXES_TENSOR)
        nchw = bool(ctx.scalar(LAYOUT_SCALAR))
        ctx.require(heatmap.rank == 4 and boxes.rank == 2, "inputs must have ranks 4 and 2")
        num_boxes, size = heatmap.shape[0], heatmap.shape[2]
        keypoints = heatmap.shape[1] if nchw else heatmap.shape[3]
        other_side = heatmap.shape[3] if nchw else heatmap.shape[1]
        ctx.require(other_side == size, f"heatmaps must be square, got {list(heatmap.shape)}")
        ctx.require(size >= 2, "heatmaps must be at least 2x2")
        ctx.require(boxes.shape == (num_boxes, 4), f"boxes must be [{num_boxes}, 4], got {list(boxes.shape)}")
        return [(num_boxes, keypoints), (num_boxes, keypoints, 2)]

    def execute(self, ctx: ExecutionContext) -> list[np.ndarray]:
        nchw = bool(ctx.scalar(LAYOUT_SCALAR))
        heat = to_nhwc(to_float32(ctx.input(HEATMAP_TENSOR)), nchw)
        boxes = to_float32(ctx.input(BOXES_TENSOR))
        num_boxes, size, _, keypoints = heat.shape
        if num_boxes == 0 or keypoints == 0:
            return [np.zeros((num_boxes, keypoints), ctx.output_dtype(OUTPUT_SCORE_TENSOR)),
                    np.zeros((num_boxes, keypoints, 2), ctx.output_dtype(OUTPUT_KEYPOINT_TENSOR))]
        ctx.require(bool(np.all((boxes[:, 0] <= boxes[:, 2]) & (boxes[:, 1] <= boxes[:, 3]))),
                    "every box needs x1 <= x2 and y1 <= y2")
        tolerance = np.float32(1e-3 if ctx.input(HEATMAP_TENSOR).type == T.TENSOR_FLOAT16 else 1e-5)
        per_keypoint = np.moveaxis(heat, 3, 1).reshape(num_boxes, keypoints, size * size)
        # Android's scan (HeatmapMaxKeypoint.cpp) starts from index 0 and a score of -FLT_MAX
        # and takes a value where maxScore < value: NaN and values up to -FLT_MAX are never
        # taken; as -inf they lose to every other value, and where all are, np.argmax gives 0
        lowest = np.float32(-np.finfo(np.float32).max)
        candidates = np.where(per_keypoint > lowest, per_keypoint, np.float32(-np.inf))
        peak = np.argmax(candidates, axis=2)                         # first maximum, [n, k]
        peak_score = np.maximum(np.take_along_axis(candidates, peak[..., None], axis=2)[..., 0], lowest)
        peak_row, peak_col = np.divmod(peak, size)
        # The 3x3 neighbourhood; out-of-range rows/columns mirror to index 1 / size - 2.
        offsets = np.arange(-1, 2)
        rows = peak_row[..., None] + offsets
        cols = peak_col[..., None] + offsets
        rows = np.where(rows < 0, 1, np.where(rows >= size, size - 2, rows))
        cols = np.where(cols < 0, 1, np.where(cols >= size, size - 2, cols))
        box_index = np.arange(num_boxes)[:, None, None, None]
        key_index = np.arange(keypoints)[None, :, None, None]
        grid = heat[box_index, rows[..., :, None], cols[..., None, :], key_index]   # [n, k, 3, 3]
        delta_x, delta_y, score = _taylor_refine(grid, tolerance, peak_score)
        width = (boxes[:, 2] - boxes[:, 0])[:, None]
        height = (boxes[:, 3] - boxes[:, 1])[:, None]
        fsize = np.float32(size)
        half = np.float32(0.5)
        key_x = (peak_col.astype(np.float32) + delta_x + half) / fsize * width + boxes[:, 0:1]
        key_y = (peak_row.astype(np.float32) + delta_y + half) / fsize * height + boxes[:, 1:2]
        keypoints = np.stack([key_x, key_y], axis=-1)
        return [from_float32(score, ctx.output(OUTPUT_SCORE_TENSOR)),
                from_float32(keypoints, ctx.output(OUTPUT_KEYPOINT_TENSOR))]


def _taylor_refine(grid: np.ndarray, tolerance: np.float32, peak_score: np.ndarray
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Offset (x, y) of the quadratic's maximum and its value, for grids [..., 3, 3]."""
    two, four, limit = np.float32(2), np.float32(4), np.float32(1.5)
    center = grid[..., 1, 1]
    b0 = -(grid[..., 1, 2] - grid[..., 1, 0]) / two
    b1 = -(grid[..., 2, 1] - grid[..., 0, 1]) / two
    a00 = grid[..., 1, 0] - two * center + grid[..., 1, 2]
    a01 = (grid[..., 2, 2] - grid[..., 2, 0] - grid[..., 0, 2] + grid[..., 0, 0]) / four
    a11 = grid[..., 0, 1] - two * center + grid[..., 2, 1]
    cross = a00 * a11
    det = cross - a01 * a01
    # Android's comparisons as written (solveForDelta): it gives up where |det| < tolerance
    # and clips where |d0| > 1.5 || |d1| > 1.5 by std::max(|d0|, |d1|), so a NaN det
    # goes on to NaN steps and a NaN |d0| takes the clip's scale from it
    solvable = ~(np.abs(det) < tolerance + tolerance * cross)
    safe_det = np.where(solvable, det, np.float32(1))
    d0 = np.where(solvable, (a11 * b0 - a01 * b1) / safe_det, np.float32(0)).astype(np.float32)
    d1 = np.where(solvable, (a00 * b1 - a01 * b0) / safe_det, np.float32(0)).astype(np.float32)
    largest = np.where(np.abs(d0) < np.abs(d1), np.abs(d1), np.abs(d0))
    too_far = (np.abs(d0) > limit) | (np.abs(d1) > limit)
    shrink = np.where(too_far, limit / np.where(too_far, largest, np.float32(1)), np.float32(1)).astype(np.float32)
    d0, d1 = d0 * shrink, d1 * shrink
    refined = center - b0 * d0 - b1 * d1 + ((a00 * d0 + a01 * d1) * d0 + (a01 * d0 + a11 * d1) * d1) / two
    score = np.where(solvable, refined, peak_score).astype(np.float32)
    return d0, d1, score
