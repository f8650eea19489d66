"""FULLY_CONNECTED: outputs = activation(inputs x weights' + bias), the input
flattened to [batch_size, input_size]; float32 / float16, quant8 (signed) with an int32
bias of scale input_scale * weights_scale.

One BLAS product; quantized layers multiply the exact integer (q - zero_point) values
(in float32 when every partial sum is exact there, else float64) and requantize with
Android's fixed-point output stage.
"""

from __future__ import annotations

import math

import numpy as np

from nnapi.codes import OperandCode, OperationCode
from nnapi.operations._conv_common import (
    CONV_INPUT_TYPES,
    FLOAT_TENSORS,
    quantized_conv_dtype,
    requantize_accumulators,
    shifted,
    validate_quantized_weights,
)
from nnapi.operations._conv_fast import PreparedFullyConnected
from nnapi.operations.base import ExecutionContext, Operation, Shape, ValidationContext, register
from nnapi.operations.common import apply_activation_float, is_valid_fuse_code
from nnapi.operations.quant_math import rescale_multipliers

T = OperandCode

# Named input positions (Android's fully_connected.cpp kInputTensor, kWeightsTensor, ...).
INPUT = 0
WEIGHTS = 1
BIAS = 2
ACTIVATION = 3



def _check_shapes(ctx: ValidationContext) -> None:
    """The input splits into rows of the weights' input size, and the declared output is
    [rows, units] (only what the declared shapes know is compared)."""
    data, weights = ctx.inputs[INPUT], ctx.inputs[WEIGHTS]
    units, input_size = (ctx.dim(WEIGHTS, 0), ctx.dim(WEIGHTS, 1)) if weights.rank == 2 else (0, 0)
    rows = 0
    if input_size and data.is_fully_specified:
        elements = math.prod(data.dimensions)
        if elements % input_size:
            ctx.fail(f"input 0 {list(data.dimensions)} has {elements} values, which do not split into rows of "
                     f"the weights' input size {input_size}")
        rows = elements // input_size
    if ctx.outputs[0].rank:
        ctx.require(ctx.outputs[0].rank == 2, f"output 0 must have rank 2, got {ctx.outputs[0].rank}")
        ctx.check_dims_agree("output 0 dimension 0 must equal the input's rows", ctx.dim(0, 0, output=True), rows)
        ctx.check_dims_agree("output 0 dimension 1 must equal the number of units", ctx.dim(0, 1, output=True),
                             units)


@register(OperationCode.FULLY_CONNECTED, zero_sized_inputs=True)
class FullyConnected(Operation):
    def validate(self, ctx: ValidationContext) -> None:
        ctx.check_counts(inputs=4, outputs=1)
        ctx.check_input_type(INPUT, CONV_INPUT_TYPES)
        code = ctx.input_type(INPUT)
        bias_type = code if code in FLOAT_TENSORS else T.TENSOR_INT32
        ctx.check_input_types([code, bias_type, T.INT32], start=WEIGHTS)
        ctx.check_output_type(0, code)
        rank = ctx.inputs[INPUT].rank
        if rank:
            ctx.require(2 <= rank <= 4, f"input 0 must have rank 2 to 4, got {rank}")
        ctx.check_input_rank(WEIGHTS, 2)
        ctx.check_input_rank(BIAS, 1)
        weights, bias = ctx.inputs[WEIGHTS].dimensions, ctx.inputs[BIAS].dimensions
        if len(weights) == 2 and len(bias) == 1 and weights[0] and bias[0] and weights[0] != bias[0]:
            ctx.fail(f"input 2 (bias) has {bias[0]} values for {weights[0]} units")
        _check_shapes(ctx)
        if code not in FLOAT_TENSORS:
            validate_quantized_weights(ctx, channel_dim=0)

    def prepare(self, ctx: ExecutionContext) -> list[Shape]:
        data, weights, bias = ctx.input(INPUT), ctx.input(WEIGHTS), ctx.input(BIAS)
        ctx.require(2 <= data.rank <= 4, f"input 0 must have rank 2 to 4, got {data.rank}")
        ctx.require(weights.rank == 2 and bias.rank == 1, "weights must be 2-D and bias 1-D")
        units, input_size = weights.shape
        ctx.require(units > 0 and input_size > 0, f"weights shape {list(weights.shape)} has a zero dimension")
        ctx.require(bias.shape[0] == units, f"bias has {bias.shape[0]} values for {units} units")
        elements = math.prod(data.shape)
        ctx.require(elements % input_size == 0, f"{elements} input values do not split into rows of {input_size}")
        fuse = ctx.scalar(ACTIVATION)
        ctx.require(is_valid_fuse_code(fuse), f"invalid fuse code {fuse}")
        return [(elements // input_size, units)]

    def execute(self, ctx: ExecutionContext) -> list[np.ndarray]:
        data, weights, bias = ctx.input(INPUT), ctx.input(WEIGHTS), ctx.input(BIAS)
        output = ctx.output(0)
        fuse = ctx.scalar(ACTIVATION)
        units, input_size = weights.shape
        if data.value.size == 0:
            return [np.zeros((0, units), dtype=data.value.dtype)]
        if data.type in FLOAT_TENSORS:
            rows = np.asarray(data.value, dtype=np.float32).reshape(-1, input_size)
            result = rows @ np.asarray(weights.value, dtype=np.float32).T + np.asarray(bias.value, dtype=np.float32)
            return [apply_activation_float(result, fuse).astype(data.value.dtype)]
        work = quantized_conv_dtype(data, weights, input_size)
        rows = shifted(data, work).reshape(-1, input_size)
        acc = rows @ shifted(weights, work).T  # exact integers
        multipliers, shifts = rescale_multipliers(data.scale, np.array([weights.scale]), output.scale)
        return [requantize_accumulators(acc, multipliers, shifts, output, fuse, bias.value)]

    def plan(self, ctx: ExecutionContext) -> PreparedFullyConnected:
        return PreparedFullyConnected(ctx, ctx.scalar(ACTIVATION))
