"""GROUPED_CONV_2D: convolution whose input channels and filters are split into groups
(group g's filters see only input channels g * depth_group ...); explicit or implicit
padding, strides and the mandatory layout flag; float32 / float16, quant8 (signed)
with a per-tensor or per-channel (channelDim 0) filter.

One batched BLAS product over an im2col copy of the padded input, one matrix per group
(``_conv_common.conv_accumulate``); quantized layers requantize the exact integer sums
with Android's fixed-point output stage.
"""

from __future__ import annotations

import numpy as np

from nnapi.codes import OperationCode
from nnapi.operations._conv_common import (
    FIRST_ARGUMENT,
    SpatialArgs,
    check_conv_shapes,
    conv_accumulate,
    convolve,
    validate_conv_tensors,
)
from nnapi.operations.base import ExecutionContext, Operation, Shape, ValidationContext, register
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
