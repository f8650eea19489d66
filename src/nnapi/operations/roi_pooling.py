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
from nnapi.operations.base import ExecutionContext, Operation, Shape, ValidationContext, register
from nnapi.operations.common import from_nhwc, round_half_away, to_nhwc
from nnapi.operations.detection_common import (
    FLOAT_TENSORS,
    QUANT8_TENSORS,
    check_box_quantization,
    check_signature,
    float_scalar,
    roi_corners,
    roi_output_shape,
)

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
        return [roi_output_shape(ctx, bool(ctx.scalar(LAYOUT_SCALAR)))]

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
        batch_ids, corners = roi_corners(ctx, batch, height, width)
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
            pooled = _first_maximum(flat[index])                        # [r, i, kh, j, kw, c] -> [r, i, j, c]
            out[part] = np.where(empty[part, :, :, None], empty_value, pooled)
        return [from_nhwc(out, nchw)]


def _first_maximum(windows: np.ndarray) -> np.ndarray:
    """The maximum over axes 2 and 4 of [r, i, kh, j, kw, c] as Android's scan picks it
    (RoiPooling.cpp: the first value in row-major order, then each value > the maximum so
    far): of equal values the first, which tells -0 from +0; a NaN first stays, a later NaN
    is never taken (np.max gives NaN for any and either zero). 8-bit values: their max."""
    if windows.dtype.kind != "f":
        return windows.max(axis=(2, 4))
    r, i, kh, j, kw, c = windows.shape
    scan = windows.transpose(0, 1, 3, 2, 4, 5).reshape(r, i, j, kh * kw, c)   # each bin in scan order
    later = np.isnan(scan)
    later[:, :, :, 0] = False
    if later.any():
        scan = np.where(later, scan.dtype.type(-np.inf), scan)  # taken only where all are -inf: the first
    first = np.argmax(scan, axis=3)[:, :, :, None]               # the first maximum (a NaN at 0 included)
    return np.take_along_axis(scan, first, axis=3)[:, :, :, 0]


def _bins(start: np.ndarray, stop: np.ndarray, bins: int, size: int) -> tuple[np.ndarray, np.ndarray]:
    """[first, last) pixel of each of ``bins`` bins of each region, clipped to [0, size]."""
    extent = np.maximum(stop - start + 1, 1).astype(np.float32)
    step = extent / np.float32(bins)
    offsets = np.arange(bins, dtype=np.float32)
    first = np.floor(step[:, None] * offsets + start[:, None].astype(np.float32))
    last = np.ceil(step[:, None] * (offsets + 1) + start[:, None].astype(np.float32))
    return np.minimum(first, size).astype(np.int64), np.minimum(last, size).astype(np.int64)
