"""GROUPED_CONV_2D: convolution whose input channels and filters are split into groups
(group g's filters see only input channels g * depth_group ...); explicit or implicit
padding, strides and the mandatory layout flag; float32 / float16, quant8 (signed)
with a per-tensor or per-channel (channelDim 0) filter.

One batched BLAS product over an im2col copy of the padded input, one matrix per group
(``_conv_common.conv_accumulate``); quantized layers requantize the exact integer sums
with Android's fixed-point output stage. With a constant filter of one input channel per
group (a depthwise convolution written as a grouped one: ConvNeXt's 7x7 layers), the plan
is DEPTHWISE_CONV_2D's prepared kernel on the filter laid out as a depthwise one, made once.
"""

from __future__ import annotations

import numpy as np

from nnapi.codes import OperationCode
from nnapi.operand import SymmPerChannelQuantParams
from nnapi.operations._conv_common import (
    FILTER,
    FIRST_ARGUMENT,
    SpatialArgs,
    check_conv_shapes,
    conv_accumulate,
    convolve,
    validate_conv_tensors,
)
from nnapi.operations._conv_fast import PreparedDepthwise
from nnapi.operations.base import ExecutionContext, Operation, Shape, Tensor, ValidationContext, register
from nnapi.operations.conv2d import conv_output_shape

_ARGS = SpatialArgs(first=FIRST_ARGUMENT, extras=("groups",), layout_required=True)


@register(OperationCode.GROUPED_CONV_2D, omitted_operands=True)
class GroupedConv2D(Operation):
    def validate(self, ctx: ValidationContext) -> None:
        ctx.require(len(ctx.outputs) == 1, f"expected 1 output, got {len(ctx.outputs)}")
        ctx.require(len(ctx.inputs) >= 3, f"expected 9 or 12 inputs, got {len(ctx.inputs)}")
        _ARGS.validate(ctx)
        validate_conv_tensors(ctx, channel_dim=0)
        check_conv_shapes(ctx, _ARGS.layout(ctx), groups=_ARGS.extra(ctx, "groups"))

    def prepare(self, ctx: ExecutionContext) -> list[Shape]:
        return [conv_output_shape(ctx, _ARGS, "groups")[1]]

    def execute(self, ctx: ExecutionContext) -> list[np.ndarray]:
        sp, shape = conv_output_shape(ctx, _ARGS, "groups")
        out_hw = (shape[2], shape[3]) if sp.nchw else (shape[1], shape[2])
        groups = sp.extras["groups"]
        return [convolve(ctx, sp, out_hw, lambda x, f: conv_accumulate(x, f, groups, sp, out_hw))]

    def plan(self, ctx: ExecutionContext) -> PreparedDepthwise | None:
        """One input channel per group and a constant filter: output channel g * m + k
        reads input channel g alone, as a depthwise convolution of multiplier m does, so
        the (OC, KH, KW, 1) filter is laid out once as the depthwise (1, KH, KW, OC) one
        (per-channel scales along its last axis) for DEPTHWISE_CONV_2D's prepared kernel
        (the filter shifted, the bias and the output stage made there once; the integer
        sums exact as ``execute``'s, float sums to rounding). Other groupings run
        ``execute``."""
        sp, shape = conv_output_shape(ctx, _ARGS, "groups")
        weights = ctx.input(FILTER)
        out_channels, _, _, depth = weights.shape
        if depth != 1 or not isinstance(weights.value, np.ndarray):
            return None
        channel_quant = weights.channel_quant
        if channel_quant is not None:
            channel_quant = SymmPerChannelQuantParams(3, channel_quant.scales)
        filt = np.ascontiguousarray(np.transpose(weights.value, (3, 1, 2, 0)))
        inputs = list(ctx.inputs)
        inputs[FILTER] = Tensor(weights.type, filt.shape, weights.scale, weights.zero_point, channel_quant, filt)
        out_hw = (shape[2], shape[3]) if sp.nchw else (shape[1], shape[2])
        return PreparedDepthwise(ExecutionContext(ctx.code, inputs, ctx.outputs, ctx.relaxed), sp, out_hw,
                                 out_channels // sp.extras["groups"])
