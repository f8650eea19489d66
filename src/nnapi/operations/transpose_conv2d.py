"""TRANSPOSE_CONV_2D: the transpose (gradient) of CONV_2D; explicit padding, or
implicit padding derived from an output-shape tensor; strides and the mandatory layout
flag; float32 / float16, quant8 (signed) with a per-tensor or per-channel (channelDim
0) filter.

One BLAS product gives every input pixel's contribution to every kernel tap; a loop
over the taps scatter-adds them into the strided output grid, which is then cropped by
the padding (the tail padding may be negative: the output then extends past the last
tap). Quantized layers requantize the exact integer sums with Android's fixed-point
output stage. ``plan`` (constant filter and bias, static shapes) runs the same sums with
everything else prepared (``_conv_fast.PreparedTransposeConv``).
"""

from __future__ import annotations

import numpy as np

from nnapi.codes import OperandCode, OperationCode, PaddingCode
from nnapi.operations._conv_common import (
    BIAS,
    FILTER,
    FIRST_ARGUMENT,
    INPUT,
    Spatial,
    check_conv_shapes,
    convolve,
    spatial_dims,
    validate_conv_tensors,
)
from nnapi.operations._conv_fast import PreparedTransposeConv
from nnapi.operations.base import (
    ExecutionContext,
    Operation,
    Shape,
    ValidationContext,
    check_deadline,
    register,
)
from nnapi.operations.common import is_valid_fuse_code, layout_shape, transpose_conv_padding

T = OperandCode
# Named input positions after INPUT, FILTER, BIAS (Android's transpose_conv_2d.cpp): the
# explicit form's 4 paddings, or the implicit form's output shape and padding scheme; then
# the strides, the FuseCode and the layout flag, last.
EXPLICIT_PADDINGS = FIRST_ARGUMENT  # left, right, top, bottom
IMPLICIT_OUTPUT_SHAPE = FIRST_ARGUMENT
IMPLICIT_PADDING_SCHEME = FIRST_ARGUMENT + 1
_EXPLICIT_COUNT = 11
_IMPLICIT_COUNT = 9


def _read(ctx: ExecutionContext) -> tuple[Spatial, tuple[int, int], Shape]:
    data, weights, bias = ctx.input(INPUT), ctx.input(FILTER), ctx.input(BIAS)
    ctx.require(data.rank == 4, f"input 0 must have rank 4, got {data.rank}")
    ctx.require(weights.rank == 4, f"input 1 must have rank 4, got {weights.rank}")
    ctx.require(bias.rank == 1, f"input 2 must have rank 1, got {bias.rank}")
    out_channels, kh, kw, depth = weights.shape
    explicit = len(ctx.inputs) == _EXPLICIT_COUNT
    nchw = bool(ctx.scalar(len(ctx.inputs) - 1))
    fuse = int(ctx.scalar(len(ctx.inputs) - 2))
    stride_w, stride_h = int(ctx.scalar(len(ctx.inputs) - 4)), int(ctx.scalar(len(ctx.inputs) - 3))
    ctx.require(stride_w > 0 and stride_h > 0, f"strides must be positive, got {stride_w}, {stride_h}")
    ctx.require(is_valid_fuse_code(fuse), f"invalid fuse code {fuse}")
    batches, height, width, channels = spatial_dims(data.shape, nchw)
    if explicit:
        left, right, top, bottom = (int(ctx.scalar(i)) for i in range(EXPLICIT_PADDINGS, EXPLICIT_PADDINGS + 4))
        ctx.require(min(left, right, top, bottom) >= 0,
                    f"padding must be non-negative, got {[left, right, top, bottom]}")
    else:
        shape = ctx.input(IMPLICIT_OUTPUT_SHAPE)
        ctx.require(shape.shape == (4,), f"input 3 (output shape) must have shape [4], got {list(shape.shape)}")
        scheme = int(ctx.scalar(IMPLICIT_PADDING_SCHEME))
        ctx.require(scheme in (PaddingCode.PADDING_SAME, PaddingCode.PADDING_VALID), f"invalid padding scheme {scheme}")
        _, want_h, want_w, _ = spatial_dims([int(v) for v in shape.value], nchw)
        top, bottom = transpose_conv_padding(want_h, stride_h, kh, scheme)
        left, right = transpose_conv_padding(want_w, stride_w, kw, scheme)
    ctx.require(channels == depth, f"input depth {channels} does not match filter depth {depth}")
    ctx.require(bias.shape[0] == out_channels, f"bias has {bias.shape[0]} values for {out_channels} filters")
    ctx.require(height > 0 and width > 0 and channels > 0 and out_channels > 0,
                "only the batch dimension may be zero")
    out_h = height * stride_h + kh - stride_h - top - bottom
    out_w = width * stride_w + kw - stride_w - left - right
    ctx.require(out_h > 0 and out_w > 0, f"output would be {out_h}x{out_w}")
    sp = Spatial(top, bottom, left, right, stride_h, stride_w, 1, 1, fuse, nchw, {})
    return sp, (out_h, out_w), layout_shape((batches, out_h, out_w, out_channels), nchw)


def _transpose_accumulate(x: np.ndarray, filt: np.ndarray, sp: Spatial, out_hw: tuple[int, int]) -> np.ndarray:
    n, h, w, c = x.shape
    oc, kh, kw, _ = filt.shape
    # contributions[n, y, x, i, j, k]: input pixel (y, x) through tap (i, j) to channel k
    contributions = (x.reshape(-1, c) @ filt.transpose(1, 2, 0, 3).reshape(-1, c).T).reshape(n, h, w, kh, kw, oc)
    full_h = max((h - 1) * sp.stride_h + kh, sp.pad_top + out_hw[0])
    full_w = max((w - 1) * sp.stride_w + kw, sp.pad_left + out_hw[1])
    full = np.zeros((n, full_h, full_w, oc), dtype=contributions.dtype)
    for i in range(kh):
        check_deadline()
        for j in range(kw):
            full[:, i: i + sp.stride_h * (h - 1) + 1: sp.stride_h,
                 j: j + sp.stride_w * (w - 1) + 1: sp.stride_w, :] += contributions[:, :, :, i, j, :]
    return full[:, sp.pad_top: sp.pad_top + out_hw[0], sp.pad_left: sp.pad_left + out_hw[1], :]


@register(OperationCode.TRANSPOSE_CONV_2D, zero_sized_inputs=True, omitted_operands=True)
class TransposeConv2D(Operation):
    def validate(self, ctx: ValidationContext) -> None:
        ctx.check_counts(inputs=(_IMPLICIT_COUNT, _EXPLICIT_COUNT), outputs=1)
        validate_conv_tensors(ctx, channel_dim=0)
        if len(ctx.inputs) == _EXPLICIT_COUNT:
            ctx.check_input_types([T.INT32] * 7 + [T.BOOL], start=FIRST_ARGUMENT)
        else:
            ctx.check_input_types([T.TENSOR_INT32] + [T.INT32] * 4 + [T.BOOL], start=FIRST_ARGUMENT)
            ctx.check_input_rank(IMPLICIT_OUTPUT_SHAPE, 1)
        layout = ctx.constant(len(ctx.inputs) - 1)
        check_conv_shapes(ctx, None if layout is None else bool(layout))

    def prepare(self, ctx: ExecutionContext) -> list[Shape]:
        return [_read(ctx)[2]]

    def execute(self, ctx: ExecutionContext) -> list[np.ndarray]:
        sp, out_hw, _ = _read(ctx)
        return [convolve(ctx, sp, out_hw, lambda x, f: _transpose_accumulate(x, f, sp, out_hw))]

    def plan(self, ctx: ExecutionContext) -> PreparedTransposeConv:
        sp, out_hw, _ = _read(ctx)
        return PreparedTransposeConv(ctx, sp, out_hw)
