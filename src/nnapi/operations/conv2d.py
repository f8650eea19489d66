"""CONV_2D: 2-D convolution with explicit or implicit padding, strides, the optional
NCHW layout and dilation; float32 / float16, quant8 (signed) with a per-tensor or a
per-channel (TENSOR_QUANT8_SYMM_PER_CHANNEL, channelDim 0) filter.

The sums of products are one BLAS matrix product over an im2col copy of the padded
input (``_conv_common.conv_accumulate``); quantized layers accumulate the exact integer
sums of (q - zero_point) products and requantize them with Android's fixed-point
output stage.
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
    conv_accumulate,
    convolve,
    spatial_dims,
    validate_conv_tensors,
)
from nnapi.operations._conv_fast import PreparedConv
from nnapi.operations.base import ExecutionContext, Operation, Shape, ValidationContext, register
from nnapi.operations.common import conv_output_size, layout_shape

_ARGS = SpatialArgs(first=FIRST_ARGUMENT, dilation=True)


def conv_output_shape(ctx: ExecutionContext, args: SpatialArgs, groups_name: str | None = None):
    """Shared prepare of CONV_2D and GROUPED_CONV_2D: (spatial args, output shape)."""
    data, weights, bias = ctx.input(INPUT), ctx.input(FILTER), ctx.input(BIAS)
    ctx.require(data.rank == 4, f"input 0 must have rank 4, got {data.rank}")
    ctx.require(weights.rank == 4, f"input 1 must have rank 4, got {weights.rank}")
    ctx.require(bias.rank == 1, f"input 2 must have rank 1, got {bias.rank}")
    out_channels, kh, kw, depth = weights.shape
    sp = args.read(ctx, data.shape, (kh, kw))
    batches, height, width, channels = spatial_dims(data.shape, sp.nchw)
    groups = sp.extras.get(groups_name, 1) if groups_name else 1
    ctx.require(groups > 0, f"number of groups must be positive, got {groups}")
    ctx.require(channels == depth * groups,
                f"input depth {channels} does not match filter depth {depth} x {groups} group(s)")
    ctx.require(out_channels % groups == 0, f"{out_channels} filters do not divide into {groups} groups")
    ctx.require(bias.shape[0] == out_channels, f"bias has {bias.shape[0]} values for {out_channels} filters")
    ctx.require(height > 0 and width > 0 and channels > 0 and out_channels > 0,
                "only the batch dimension may be zero")
    out_h = conv_output_size(height, kh, sp.stride_h, sp.dilation_h, sp.pad_top, sp.pad_bottom)
    out_w = conv_output_size(width, kw, sp.stride_w, sp.dilation_w, sp.pad_left, sp.pad_right)
    ctx.require(out_h > 0 and out_w > 0, f"output would be {out_h}x{out_w}")
    return sp, layout_shape((batches, out_h, out_w, out_channels), sp.nchw)


@register(OperationCode.CONV_2D, zero_sized_inputs=True, omitted_operands=True)
class Conv2D(Operation):
    def validate(self, ctx: ValidationContext) -> None:
        ctx.require(len(ctx.outputs) == 1, f"expected 1 output, got {len(ctx.outputs)}")
        ctx.require(len(ctx.inputs) >= 3, f"expected at least 7 inputs, got {len(ctx.inputs)}")
        _ARGS.validate(ctx)
        validate_conv_tensors(ctx, channel_dim=0)
        check_conv_shapes(ctx, _ARGS.layout(ctx))

    def prepare(self, ctx: ExecutionContext) -> list[Shape]:
        _, shape = conv_output_shape(ctx, _ARGS)
        return [shape]

    def execute(self, ctx: ExecutionContext) -> list[np.ndarray]:
        sp, shape = conv_output_shape(ctx, _ARGS)
        out_hw = (shape[2], shape[3]) if sp.nchw else (shape[1], shape[2])
        return [convolve(ctx, sp, out_hw, lambda x, f: conv_accumulate(x, f, 1, sp, out_hw))]

    def plan(self, ctx: ExecutionContext) -> PreparedConv:
        sp, shape = conv_output_shape(ctx, _ARGS)
        return PreparedConv(ctx, sp, (shape[2], shape[3]) if sp.nchw else (shape[1], shape[2]))
