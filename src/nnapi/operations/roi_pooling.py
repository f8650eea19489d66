"""ROI_POOLING: max-pool each region of interest into a fixed grid of integer-bounded bins.

Inputs: 0 feature map (4-D, NHWC or NCHW), 1 regions [num_rois, 4] ([x1, y1, x2, y2] in
image coordinates), 2 batch index of each region, 3/4 output height/width, 5/6 height/width
ratio of the image to the feature map, 7 NCHW flag. Output: [num_rois, out_h, out_w, depth]
(NCHW: depth first), of input 0's type and (quantized) scale and zero point.

Region corners are rounded to feature-map pixels; bin j spans [floor(j * step + start),
ceil((j + 1) * step + start)) clipped to the map, so neighbouring bins may share a pixel.
An empty bin (a region past the map's edge) yields the zero point (0.0 for floats).
"""

from __future__ import annotations

import numpy as np

from nnapi.codes import OperandCode, OperationCode
from nnapi.operations._detection_common import (
    FLOAT_TENSORS,
    QUANT8_TENSORS,
    check_box_quantization,
    check_signature,
    float_scalar,
    to_float32,
)
from nnapi.operations.base import ExecutionContext, Operation, Shape, ValidationContext, register
from nnapi.operations.common import from_nhwc, round_half_away, to_nhwc

# Input and output positions, as Android names them (kInputTensor, ...).
INPUT_TENSOR = 0
ROI_TENSOR = 1
BATCH_SPLIT_TENSOR = 2
OUTPUT_HEIGHT_SCALAR = 3
OUTPUT_WIDTH_SCALAR = 4
HEIGHT_STRIDE_SCALAR = 5
WIDTH_STRIDE_SCALAR = 6
LAYOUT_SCALAR = 7
OUTPUT_TENSOR = 0

T = OperandCode
#: gathered elements per chunk of regions (bounds the temporary memory)
_CHUNK_ELEMENTS = 1 << 22


@register(OperationCode.ROI_POOLING)
class RoiPooling(Operation):
    def validate(self, ctx: ValidationContext) -> None:
        ctx.check_counts(inputs=8, outputs=1)
        kind = ctx.input_type(INPUT_TENSOR)
        if kind not in FLOAT_TENSORS + QUANT8_TENSORS:
            ctx.fail(f"input 0 must be a float or quant8 asymm tensor, got {kind.name}")
        box_type = kind if kind in FLOAT_TENSORS else T.TENSOR_QUANT16_ASYMM
        real = float_scalar(kind)
        check_signature(ctx, [kind, box_type, T.TENSOR_INT32, T.INT32, T.INT32, real, real, T.BOOL], [kind],
                        input_ranks={0: 4, 1: 2, 2: 1}, output_ranks={0: 4})
        check_box_quantization(ctx, "input", 1)
        if kind in QUANT8_TENSORS:
            ctx.check_same_quantization(("input", 0), ("output", 0))

    def prepare(self, ctx: ExecutionContext) -> list[Shape]:
        feature, rois, batches = ctx.input(INPUT_TENSOR), ctx.input(ROI_TENSOR), ctx.input(BATCH_SPLIT_TENSOR)
        nchw = bool(ctx.scalar(LAYOUT_SCALAR))
        ctx.require(feature.rank == 4 and rois.rank == 2 and batches.rank == 1, "inputs must have ranks 4, 2, 1")
        depth = feature.shape[1] if nchw else feature.shape[3]
        num_rois = rois.shape[0]
        ctx.require(rois.shape[1] == 4, f"regions must be [num_rois, 4], got {list(rois.shape)}")
        ctx.require(batches.shape[0] == num_rois, f"batch indexes must be [{num_rois}]")
        out_h, out_w = ctx.scalar(OUTPUT_HEIGHT_SCALAR), ctx.scalar(OUTPUT_WIDTH_SCALAR)
        ctx.require(out_h > 0 and out_w > 0, "output height and width must be positive")
        ctx.require(ctx.scalar(HEIGHT_STRIDE_SCALAR) > 0 and ctx.scalar(WIDTH_STRIDE_SCALAR) > 0,
                    "height and width ratios must be positive")
        return [(num_rois, depth, out_h, out_w) if nchw else (num_rois, out_h, out_w, depth)]

    def execute(self, ctx: ExecutionContext) -> list[np.ndarray]:
        nchw = bool(ctx.scalar(LAYOUT_SCALAR))
        feature = to_nhwc(np.asarray(ctx.value(INPUT_TENSOR)), nchw)
        batch, height, width, depth = feature.shape
        out_h, out_w = ctx.scalar(OUTPUT_HEIGHT_SCALAR), ctx.scalar(OUTPUT_WIDTH_SCALAR)
        num_rois = ctx.input(ROI_TENSOR).shape[0]
        dtype = ctx.output_dtype(OUTPUT_TENSOR)
        out = np.zeros((num_rois, out_h, out_w, depth), dtype=dtype)
        if num_rois == 0 or out.size == 0:
            return [from_nhwc(out, nchw)]
        batch_ids = np.asarray(ctx.value(BATCH_SPLIT_TENSOR)).astype(np.int64)
        ctx.require(bool(np.all((batch_ids >= 0) & (batch_ids < batch))), "batch index out of range")
        rois = to_float32(ctx.input(ROI_TENSOR))
        ctx.require(bool(np.all(rois >= 0)), "regions must not have negative coordinates")
        height_scale = np.float32(1) / np.float32(ctx.scalar(HEIGHT_STRIDE_SCALAR))
        width_scale = np.float32(1) / np.float32(ctx.scalar(WIDTH_STRIDE_SCALAR))
        corners = rois * np.array([width_scale, height_scale, width_scale, height_scale], dtype=np.float32)
        ctx.require(bool(np.all((corners[:, 0] <= width) & (corners[:, 2] <= width) & (corners[:, 1] <= height)
                                & (corners[:, 3] <= height))), "regions must lie inside the feature map")
        ctx.require(bool(np.all((rois[:, 0] <= rois[:, 2]) & (rois[:, 1] <= rois[:, 3]))),
                    "every region needs x1 <= x2 and y1 <= y2")
        pixels = round_half_away(corners).astype(np.int64)
        h_start, h_stop = _bins(pixels[:, 1], pixels[:, 3], out_h, height)
        w_start, w_stop = _bins(pixels[:, 0], pixels[:, 2], out_w, width)
        # Every bin is gathered as a fixed-size window. Window positions past the bin's end
        # repeat its last pixel, which leaves the maximum unchanged and needs no mask.
        span_h = max(int((h_stop - h_start).max()), 1)
        span_w = max(int((w_stop - w_start).max()), 1)
        rows = np.minimum(h_start[:, :, None] + np.arange(span_h), h_stop[:, :, None] - 1)   # [r, i, kh]
        cols = np.minimum(w_start[:, :, None] + np.arange(span_w), w_stop[:, :, None] - 1)   # [r, j, kw]
        rows, cols = np.clip(rows, 0, height - 1), np.clip(cols, 0, width - 1)
        # A bin clipped away entirely (a region at the map's edge) yields the zero point.
        empty = (h_stop <= h_start)[:, :, None] | (w_stop <= w_start)[:, None, :]            # [r, i, j]
        flat = feature.reshape(batch * height * width, depth)
        empty_value = np.array(ctx.input(INPUT_TENSOR).zero_point if dtype.kind != "f" else 0, dtype=dtype)
        chunk = max(1, _CHUNK_ELEMENTS // (out_h * span_h * out_w * span_w * depth))
        for first in range(0, num_rois, chunk):
            part = slice(first, first + chunk)
            index = (batch_ids[part, None, None, None, None] * (height * width)
                     + rows[part, :, :, None, None] * width + cols[part, None, None, :, :])
            pooled = flat[index].max(axis=(2, 4))                      # [r, i, kh, j, kw, c] -> [r, i, j, c]
            out[part] = np.where(empty[part, :, :, None], empty_value, pooled)
        return [from_nhwc(out, nchw)]


def _bins(start: np.ndarray, stop: np.ndarray, bins: int, size: int) -> tuple[np.ndarray, np.ndarray]:
    """[first, last) pixel of each of ``bins`` bins of each region, clipped to [0, size]."""
    extent = np.maximum(stop - start + 1, 1).astype(np.float32)
    step = extent / np.float32(bins)
    offsets = np.arange(bins, dtype=np.float32)
    first = np.floor(step[:, None] * offsets + start[:, None].astype(np.float32))
    last = np.ceil(step[:, None] * (offsets + 1) + start[:, None].astype(np.float32))
    return np.minimum(first, size).astype(np.int64), np.minimum(last, size).astype(np.int64)
