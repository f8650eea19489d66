"""RESIZE_BILINEAR and RESIZE_NEAREST_NEIGHBOR: resize the height and width of a 4-D
image, to an output size (INT32 scalars) or by scale factors (FLOAT32 / FLOAT16
scalars, output = floor(size * scale)); the optional NCHW layout, align_corners and
half_pixel_centers flags; float32 / float16 / quant8 / quant8 signed (the quantized
output keeps the input's scale and zero point).

Sampling positions follow Android's kernels (TFLite's reference resize), in float32:
the scale is in / out (or (in - 1) / (out - 1) with align_corners), half-pixel centers
shift by 0.5. Rows and columns are gathered with index arrays; bilinear weights
combine four gathered images. Quantized bilinear results are truncated toward zero,
as the reference kernel's cast does.

``plan`` prepares the sampling indexes and weights once; with ``nnapi[fast]`` the
bilinear blend of float32 and 8-bit images runs as one compiled pass
(``_numba_resize``), which tests compare with the numpy kernel bit for bit.
"""

from __future__ import annotations

import math

import numpy as np

from nnapi.codes import FeatureLevelCode, OperandCode, OperationCode
from nnapi.operations import _jit
from nnapi.operations._conv_common import spatial_dims
from nnapi.operations.base import ExecutionContext, Operation, Shape, ValidationContext, register
from nnapi.operations.common import from_nhwc, layout_shape, nearest_indexes, resize_scale, to_nhwc

T = OperandCode

# Named input positions (Android's resize_image_ops.cpp): the output width and height (INT32)
# or the scales (FLOAT), then the optional layout, align_corners and half_pixel_centers flags.
INPUT = 0
WIDTH = 1
HEIGHT = 2
LAYOUT = 3
ALIGN_CORNERS = 4
HALF_PIXEL_CENTERS = 5

_TYPES = (T.TENSOR_FLOAT32, T.TENSOR_FLOAT16, T.TENSOR_QUANT8_ASYMM, T.TENSOR_QUANT8_ASYMM_SIGNED)
_FLOAT = (T.TENSOR_FLOAT32, T.TENSOR_FLOAT16)


def _flag(ctx: ExecutionContext, index: int) -> bool:
    return index < len(ctx.inputs) and not ctx.is_omitted(index) and bool(ctx.scalar(index))


def _bilinear_taps(in_size: int, out_size: int, align_corners: bool, half_pixel: bool):
    """(lower index, upper index, weight of the upper one) per output position."""
    scale = resize_scale(in_size, out_size, align_corners)
    position = np.arange(out_size, dtype=np.float32)
    scaled = (position + np.float32(0.5)) * scale - np.float32(0.5) if half_pixel else position * scale
    lower = np.maximum(np.floor(scaled).astype(np.int64), 0)
    upper = np.minimum(np.ceil(scaled).astype(np.int64), in_size - 1)
    return lower, upper, (scaled - lower.astype(np.float32)).astype(np.float32)


def _bilinear(values: np.ndarray, rows, cols, quantized: bool, dtype: np.dtype) -> np.ndarray:
    """The bilinear blend of NHWC ``values`` (float32) at ``rows`` / ``cols`` = (lower,
    upper, weight of the lower, weight of the upper): each output is
    ``a * wy0 * wx0 + b * wy1 * wx0 + c * wy0 * wx1 + d * wy1 * wx1`` in float32, left to
    right, as Android's kernel computes it (weighting rows before gathering columns
    leaves every product the same)."""
    y0, y1, wy0, wy1 = rows
    x0, x1, wx0, wx1 = cols
    top = values[:, y0] * wy0[None, :, None, None]
    bottom = values[:, y1] * wy1[None, :, None, None]
    wx0, wx1 = wx0[None, None, :, None], wx1[None, None, :, None]
    result = np.take(top, x0, axis=2)
    result *= wx0
    term = np.take(bottom, x0, axis=2)
    term *= wx0
    result += term
    np.take(top, x1, axis=2, out=term)
    term *= wx1
    result += term
    np.take(bottom, x1, axis=2, out=term)
    term *= wx1
    result += term
    if quantized:
        np.trunc(result, out=result)
    return result.astype(dtype, copy=False)


def bilinear_blend(values: np.ndarray, rows, cols) -> np.ndarray:
    """The float32 bilinear blend of NHWC float32 ``values`` with ``weighted_taps`` rows and
    columns, before any truncation (the ONNX Runtime driver checks its Resize against it)."""
    return _bilinear(values, rows, cols, False, np.dtype(np.float32))


def weighted_taps(in_size: int, out_size: int, align_corners: bool, half_pixel: bool):
    """``_bilinear_taps`` as (lower, upper, weight of the lower, weight of the upper); the
    ONNX Runtime driver blends quantized images with these same taps."""
    lower, upper, fraction = _bilinear_taps(in_size, out_size, align_corners, half_pixel)
    return lower, upper, np.float32(1) - fraction, fraction


@register(OperationCode.RESIZE_BILINEAR, OperationCode.RESIZE_NEAREST_NEIGHBOR, zero_sized_inputs=True,
          omitted_operands=True)
class Resize(Operation):
    def validate(self, ctx: ValidationContext) -> None:
        low = 3 if self.code == OperationCode.RESIZE_BILINEAR else 4
        ctx.check_counts(inputs=range(low, 7), outputs=1)
        ctx.check_input_type(INPUT, _TYPES)
        code = ctx.input_type(INPUT)
        scalar = ctx.input_type(HEIGHT)
        allowed = (T.INT32, T.FLOAT16 if code == T.TENSOR_FLOAT16 else T.FLOAT32)
        ctx.check_input_type(HEIGHT, allowed)
        ctx.check_input_type(WIDTH, scalar)
        for index in range(LAYOUT, len(ctx.inputs)):
            ctx.check_input_type(index, T.BOOL)
        if len(ctx.inputs) > LAYOUT or scalar != T.INT32:
            ctx.at_least(FeatureLevelCode.FEATURE_LEVEL_3)  # the layout flag, output scales
        if len(ctx.inputs) > ALIGN_CORNERS:
            ctx.at_least(FeatureLevelCode.FEATURE_LEVEL_4)  # align_corners, half_pixel_centers
        ctx.check_output_type(0, code)
        ctx.check_input_rank(INPUT, 4)
        if code not in _FLOAT:
            ctx.check_same_quantization(("input", 0), ("output", 0))

    def _read(self, ctx: ExecutionContext):
        data = ctx.input(INPUT)
        ctx.require(data.rank == 4, f"input 0 must have rank 4, got {data.rank}")
        nchw, align_corners, half_pixel = _flag(ctx, LAYOUT), _flag(ctx, ALIGN_CORNERS), _flag(ctx, HALF_PIXEL_CENTERS)
        ctx.require(not (align_corners and half_pixel), "align_corners and half_pixel_centers are exclusive")
        batches, height, width, channels = spatial_dims(data.shape, nchw)
        ctx.require(height > 0 and width > 0 and channels > 0, "only the batch dimension may be zero")
        if ctx.input(WIDTH).type == T.INT32:
            out_w, out_h = int(ctx.scalar(WIDTH)), int(ctx.scalar(HEIGHT))
        else:
            scale_w, scale_h = np.float32(ctx.scalar(WIDTH)), np.float32(ctx.scalar(HEIGHT))
            ctx.require(bool(np.isfinite(scale_w) and np.isfinite(scale_h)), "scales must be finite")
            out_w = math.floor(np.float32(width) * scale_w)
            out_h = math.floor(np.float32(height) * scale_h)
        ctx.require(out_h > 0 and out_w > 0, f"output size must be positive, got {out_w}x{out_h}")
        return (nchw, align_corners, half_pixel), (out_h, out_w), layout_shape((batches, out_h, out_w, channels),
                                                                               nchw)

    def prepare(self, ctx: ExecutionContext) -> list[Shape]:
        return [self._read(ctx)[2]]

    def execute(self, ctx: ExecutionContext) -> list[np.ndarray]:
        (nchw, align_corners, half_pixel), (out_h, out_w), _ = self._read(ctx)
        data = ctx.input(INPUT)
        x = np.transpose(data.value, (0, 2, 3, 1)) if nchw else data.value
        height, width = x.shape[1], x.shape[2]
        if x.shape[0] == 0:
            return [from_nhwc(np.zeros((0, out_h, out_w, x.shape[3]), dtype=x.dtype), nchw)]
        if self.code == OperationCode.RESIZE_NEAREST_NEIGHBOR:
            rows = nearest_indexes(height, out_h, align_corners, half_pixel)
            cols = nearest_indexes(width, out_w, align_corners, half_pixel)
            return [from_nhwc(np.ascontiguousarray(x[:, rows][:, :, cols]), nchw)]
        rows = weighted_taps(height, out_h, align_corners, half_pixel)
        cols = weighted_taps(width, out_w, align_corners, half_pixel)
        return [from_nhwc(_bilinear(np.asarray(x, dtype=np.float32), rows, cols, data.type not in _FLOAT, x.dtype),
                          nchw)]

    def plan(self, ctx: ExecutionContext):
        (nchw, align_corners, half_pixel), (out_h, out_w), _ = self._read(ctx)
        data = ctx.input(INPUT)
        batches, height, width, channels = spatial_dims(data.shape, nchw)
        if batches == 0:
            return None
        dtype = ctx.output_dtype(0)
        if self.code == OperationCode.RESIZE_NEAREST_NEIGHBOR:
            rows = nearest_indexes(height, out_h, align_corners, half_pixel)
            cols = nearest_indexes(width, out_w, align_corners, half_pixel)
            return lambda values: [from_nhwc(np.take(np.take(to_nhwc(values[0], nchw), rows, axis=1), cols, axis=2),
                                             nchw)]
        rows = weighted_taps(height, out_h, align_corners, half_pixel)
        cols = weighted_taps(width, out_w, align_corners, half_pixel)
        return PreparedBilinear(rows, cols, data.type not in _FLOAT, dtype, (batches, out_h, out_w, channels), nchw)


class PreparedBilinear:
    """RESIZE_BILINEAR with its taps computed at preparation: the compiled blend
    (``compiled``, with nnapi[fast]) or the numpy one."""

    def __init__(self, rows, cols, quantized: bool, dtype: np.dtype, nhwc_shape: Shape, nchw: bool) -> None:
        self.rows, self.cols, self.quantized, self.dtype = rows, cols, quantized, dtype
        self.nhwc_shape, self.nchw = nhwc_shape, nchw
        self.compiled = _compiled_bilinear(rows, cols, quantized, dtype, nhwc_shape[3])

    def __call__(self, values: list[np.ndarray]) -> list[np.ndarray]:
        x = to_nhwc(values[0], self.nchw)
        if self.compiled is None:
            return [from_nhwc(_bilinear(np.asarray(x, dtype=np.float32), self.rows, self.cols, self.quantized,
                                        self.dtype), self.nchw)]
        out = np.empty(self.nhwc_shape, self.dtype)
        self.compiled(_jit.kernel_input(x), out)
        return [from_nhwc(out, self.nchw)]


def _compiled_bilinear(rows, cols, quantized: bool, dtype: np.dtype, channels: int):
    """The compiled blend bound to its taps, as a function of the NHWC input and the output
    array; None without numba, for float16, or when numba fails to load it."""
    if dtype not in (np.float32, np.uint8, np.int8) or _jit.kernels() is None:
        return None
    from nnapi.operations._numba_resize import bilinear_nhwc

    y0, y1, wy0, wy1 = (np.ascontiguousarray(a) for a in rows)
    x0, x1, wx0, wx1 = (np.ascontiguousarray(a) for a in cols)

    def run(x, out):
        bilinear_nhwc(x, y0, y1, wy0, wy1, x0, x1, wx0, wx1, quantized, out)

    probe = np.zeros((0, 1, 1, channels), dtype)
    if not _jit.warm_up(lambda: bilinear_nhwc(probe, y0, y1, wy0, wy1, x0, x1, wx0, wx1, quantized,
                                              np.zeros((0, y0.size, x0.size, channels), dtype))):
        return None
    return run
