"""DEPTHWISE_CONV_2D: per-channel 2-D convolution with a depth multiplier; explicit or
implicit padding, strides, the optional NCHW layout and dilation; float32 / float16,
quant8 (signed) with a per-tensor or per-channel (channelDim 3) filter.

Each input channel c feeds output channels c * multiplier + q. The sums are a loop over
the kernel taps, each one vectorized multiply-add over the whole output
(``_conv_common.depthwise_accumulate``); quantized layers requantize the exact integer
sums with Android's fixed-point output stage.
"""

from __future__ import annotations

import numpy as np

from nnapi.codes import OperationCode
from nnapi.operations._conv_common import (
    BIAS,
    FILTER,
    FIRST_ARGUMENT,
    INPUT,
    SpatialArgs,
    check_conv_shapes,
    convolve,
    depthwise_accumulate,
    spatial_dims,
    validate_conv_tensors,
)
from nnapi.operations._conv_fast import PreparedDepthwise
from nnapi.operations.base import ExecutionContext, Operation, Shape, ValidationContext, register
from nnapi.operations.common import conv_output_size, layout_shape

_ARGS = SpatialArgs(first=FIRST_ARGUMENT, extras=("multiplier",), dilation=True)


def _output_shape(ctx: ExecutionContext):
    data, weights, bias = ctx.input(INPUT), ctx.input(FILTER), ctx.input(BIAS)
    ctx.require(data.rank == 4, f"input 0 must have rank 4, got {data.rank}")
    ctx.require(weights.rank == 4, f"input 1 must have rank 4, got {weights.rank}")
    ctx.require(bias.rank == 1, f"input 2 must have rank 1, got {bias.rank}")
    one, kh, kw, out_channels = weights.shape
    ctx.require(one == 1, f"input 1 must have shape [1, height, width, depth_out], got {list(weights.shape)}")
    sp = _ARGS.read(ctx, data.shape, (kh, kw))
    batches, height, width, channels = spatial_dims(data.shape, sp.nchw)
    multiplier = sp.extras["multiplier"]
    ctx.require(multiplier > 0, f"depth multiplier must be positive, got {multiplier}")
    ctx.require(channels * multiplier == out_channels,
                f"input depth {channels} x multiplier {multiplier} != filter depth {out_channels}")
    ctx.require(bias.shape[0] == out_channels, f"bias has {bias.shape[0]} values for {out_channels} channels")
    ctx.require(height > 0 and width > 0 and channels > 0, "only the batch dimension may be zero")
    out_h = conv_output_size(height, kh, sp.stride_h, sp.dilation_h, sp.pad_top, sp.pad_bottom)
    out_w = conv_output_size(width, kw, sp.stride_w, sp.dilation_w, sp.pad_left, sp.pad_right)
    ctx.require(out_h > 0 and out_w > 0, f"output would be {out_h}x{out_w}")
    return sp, (out_h, out_w), layout_shape((batches, out_h, out_w, out_channels), sp.nchw)


@register(OperationCode.DEPTHWISE_CONV_2D, zero_sized_inputs=True, omitted_operands=True)
class DepthwiseConv2D(Operation):
    def validate(self, ctx: ValidationContext) -> None:
        ctx.require(len(ctx.outputs) == 1, f"expected 1 output, got {len(ctx.outputs)}")
        ctx.require(len(ctx.inputs) >= 3, f"expected at least 8 inputs, got {len(ctx.inputs)}")
        _ARGS.validate(ctx)
        validate_conv_tensors(ctx, channel_dim=3)
        check_conv_shapes(ctx, _ARGS.layout(ctx), multiplier=_ARGS.extra(ctx, "multiplier"))

    def prepare(self, ctx: ExecutionContext) -> list[Shape]:
        return [_output_shape(ctx)[2]]

    def execute(self, ctx: ExecutionContext) -> list[np.ndarray]:
        sp, out_hw, _ = _output_shape(ctx)
        multiplier = sp.extras["multiplier"]
        return [convolve(ctx, sp, out_hw, lambda x, f: depthwise_accumulate(x, f[0], multiplier, sp, out_hw))]

    def plan(self, ctx: ExecutionContext) -> PreparedDepthwise:
        sp, out_hw, _ = _output_shape(ctx)
        return PreparedDepthwise(ctx, sp, out_hw, sp.extras["multiplier"])
