"""ROI_ALIGN: average of bilinearly interpolated sampling points in each bin of each region.

Inputs: 0 feature map (4-D, NHWC or NCHW), 1 regions [num_rois, 4] ([x1, y1, x2, y2] in
image coordinates), 2 batch index of each region, 3/4 output height/width, 5/6 height/width
ratio of the image to the feature map, 7/8 sampling points per bin in height/width (0:
ceil(bin size)), 9 NCHW flag. Output: [num_rois, out_h, out_w, depth] (NCHW: depth
first). num_rois may be 0.

Float types are computed in float32. Quantized feature maps follow Android's integer
pipeline: the four bilinear weights are quantized to 1/255 steps, the weighted sums are
accumulated in integers and rescaled with a fixed-point multiplier, so results match the
reference to the last unit.
"""

from __future__ import annotations

import numpy as np

from nnapi.codes import OperandCode, OperationCode
from nnapi.operations.base import ExecutionContext, Operation, Shape, ValidationContext, register
from nnapi.operations.common import (
    from_nhwc,
    integer_range,
    to_nhwc,
)
from nnapi.operations.detection_common import (
    FLOAT_TENSORS,
    QUANT8_TENSORS,
    check_box_quantization,
    check_signature,
    float_scalar,
    from_float32,
    roi_corners,
    roi_output_shape,
)
from nnapi.operations.quant_math import multiply_by_quantized_multiplier, quantize_multiplier, round_half_away

# Input and output positions, as Android names them (kInputTensor, ...).
INPUT_TENSOR = 0
ROI_TENSOR = 1
BATCH_SPLIT_TENSOR = 2
OUTPUT_HEIGHT_SCALAR = 3
OUTPUT_WIDTH_SCALAR = 4
HEIGHT_STRIDE_SCALAR = 5
WIDTH_STRIDE_SCALAR = 6
HEIGHT_SAMPLING_RATIO_SCALAR = 7
WIDTH_SAMPLING_RATIO_SCALAR = 8
LAYOUT_SCALAR = 9
OUTPUT_TENSOR = 0

T = OperandCode
#: the quantum of the integer bilinear weights of the quantized path
_WEIGHT_STEP = np.float32(1.0 / 255.0)
#: gathered elements per chunk of regions (bounds the temporary memory)
_CHUNK_ELEMENTS = 1 << 22


@register(OperationCode.ROI_ALIGN, zero_sized_inputs=True)
class RoiAlign(Operation):
    def validate(self, ctx: ValidationContext) -> None:
        ctx.check_counts(inputs=10, outputs=1)
        kind = ctx.input_type(INPUT_TENSOR)
        if kind not in FLOAT_TENSORS + QUANT8_TENSORS:
            ctx.fail(f"input 0 must be a float or quant8 asymm tensor, got {kind.name}")
        box_type = kind if kind in FLOAT_TENSORS else T.TENSOR_QUANT16_ASYMM
        real = float_scalar(kind)
        check_signature(ctx, [kind, box_type, T.TENSOR_INT32, T.INT32, T.INT32, real, real, T.INT32, T.INT32,
                              T.BOOL], [kind], input_ranks={0: 4, 1: 2, 2: 1}, output_ranks={0: 4})
        check_box_quantization(ctx, "input", 1)

    def prepare(self, ctx: ExecutionContext) -> list[Shape]:
        nchw = bool(ctx.scalar(LAYOUT_SCALAR))
        shape = roi_output_shape(ctx, nchw)
        feature = ctx.input(INPUT_TENSOR)
        ctx.require(min(feature.shape) > 0, "the feature map must not be empty")
        ctx.require(ctx.scalar(HEIGHT_SAMPLING_RATIO_SCALAR) >= 0 and ctx.scalar(WIDTH_SAMPLING_RATIO_SCALAR) >= 0,
                    "sampling ratios must be non-negative")
        return [shape]

    def execute(self, ctx: ExecutionContext) -> list[np.ndarray]:
        nchw = bool(ctx.scalar(LAYOUT_SCALAR))
        feature = to_nhwc(np.asarray(ctx.value(INPUT_TENSOR)), nchw)
        batch, height, width, depth = feature.shape
        out_h, out_w = ctx.scalar(OUTPUT_HEIGHT_SCALAR), ctx.scalar(OUTPUT_WIDTH_SCALAR)
        num_rois = ctx.input(ROI_TENSOR).shape[0]
        quantized = ctx.input(INPUT_TENSOR).type in QUANT8_TENSORS
        out = np.zeros((num_rois, out_h, out_w, depth), dtype=ctx.output_dtype(OUTPUT_TENSOR))
        if num_rois == 0:
            return [from_nhwc(out, nchw)]
        batch_ids, corners = roi_corners(ctx, batch, height, width)
        one = np.float32(1)
        step_w = np.maximum(corners[:, 2] - corners[:, 0], one) / np.float32(out_w)
        step_h = np.maximum(corners[:, 3] - corners[:, 1], one) / np.float32(out_h)
        sampling_w, sampling_h = ctx.scalar(WIDTH_SAMPLING_RATIO_SCALAR), ctx.scalar(HEIGHT_SAMPLING_RATIO_SCALAR)
        ratio_w = np.full(num_rois, sampling_w, np.int64) if sampling_w > 0 else np.ceil(step_w).astype(np.int64)
        ratio_h = np.full(num_rois, sampling_h, np.int64) if sampling_h > 0 else np.ceil(step_h).astype(np.int64)
        flat = feature.reshape(batch * height * width, depth)
        if not quantized:
            flat = flat.astype(np.float32, copy=False)
        # Regions with the same sampling grid are computed together.
        for sh, sw in sorted(set(zip(ratio_h.tolist(), ratio_w.tolist(), strict=True))):
            group = np.flatnonzero((ratio_h == sh) & (ratio_w == sw))
            ys, wy = _axis_samples(corners[group, 1], step_h[group], sh, out_h, height)
            xs, wx = _axis_samples(corners[group, 0], step_w[group], sw, out_w, width)
            base = batch_ids[group] * (height * width)
            taps = sh * 2 * sw * 2      # (sample, corner) pairs in y times those in x
            chunk = max(1, _CHUNK_ELEMENTS // (out_h * out_w * taps * depth))
            for first in range(0, group.size, chunk):
                part = slice(first, first + chunk)
                count = group[part].size
                # [r, i, j, sy, corner_y, sx, corner_x]: every tap of every output pixel, with
                # its bilinear weight, so that each output pixel is one dot product.
                index = (base[part, None, None, None, None, None, None]
                         + ys[part][:, :, None, :, :, None, None] * width + xs[part][:, None, :, None, None, :, :])
                weights = wy[part][:, :, None, :, :, None, None] * wx[part][:, None, :, None, None, :, :]
                index = index.reshape(count, out_h, out_w, taps)
                weights = weights.reshape(count, out_h, out_w, 1, taps)
                values = flat[index]                                    # [r, i, j, taps, depth]
                if quantized:
                    result = self._quantized(ctx, values, weights, sh * sw)
                else:
                    summed = np.matmul(weights, values)[..., 0, :]
                    result = from_float32(summed / np.float32(sh * sw), ctx.output(OUTPUT_TENSOR))
                out[group[part]] = result
        return [from_nhwc(out, nchw)]

    @staticmethod
    def _quantized(ctx: ExecutionContext, values: np.ndarray, weights: np.ndarray, samples: int) -> np.ndarray:
        """Android's integer ROI_ALIGN: weights in 1/255 steps, integer sums, fixed-point rescale."""
        source, output = ctx.input(INPUT_TENSOR), ctx.output(OUTPUT_TENSOR)
        integer_weights = round_half_away(weights / _WEIGHT_STEP)
        # The integer dot products run through BLAS on floats, exactly: every product and
        # partial sum is an integer below 2**24 (float32) or 2**53 (float64).
        taps = weights.shape[-1]
        exact = np.float32 if taps * 255 * 255 < 2**24 else np.float64
        centered = values.astype(exact) - exact(source.zero_point)
        sums = np.matmul(integer_weights.astype(exact), centered)[..., 0, :].astype(np.int64)
        real_multiplier = np.float32(source.scale) * _WEIGHT_STEP / np.float32(output.scale) / np.float32(samples)
        multiplier, shift = quantize_multiplier(float(real_multiplier))
        scaled = multiply_by_quantized_multiplier(sums, multiplier, shift) + output.zero_point
        low, high = integer_range(output.type)
        return np.clip(scaled, low, high).astype(ctx.output_dtype(OUTPUT_TENSOR))


def _axis_samples(start: np.ndarray, step: np.ndarray, ratio: int, bins: int, size: int
                  ) -> tuple[np.ndarray, np.ndarray]:
    """Sampling positions along one axis for regions starting at ``start`` with bin size
    ``step``: the two neighbouring pixel indexes [r, bin, sample, 2] and their bilinear
    weights. Samples at or past the last pixel use it alone."""
    sub = step / np.float32(ratio)
    bin_start = step[:, None] * np.arange(bins, dtype=np.float32)[None, :] + start[:, None]
    position = (bin_start[:, :, None] + (sub / np.float32(2))[:, None, None]
                + sub[:, None, None] * np.arange(ratio, dtype=np.float32)[None, None, :])
    low = np.floor(position)
    frac = (position - low).astype(np.float32)
    low = low.astype(np.int64)
    at_edge = low >= size - 1
    low = np.where(at_edge, size - 1, low)
    high = np.where(at_edge, size - 1, low + 1)
    frac = np.where(at_edge, np.float32(0), frac)
    indexes = np.stack([low, high], axis=-1)
    weights = np.stack([np.float32(1) - frac, frac], axis=-1).astype(np.float32)
    return indexes, weights
