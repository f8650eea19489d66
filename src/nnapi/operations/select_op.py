"""SELECT: output[i] = condition[i] ? input1[i] : input2[i], element-wise, no broadcasting.

The condition is TENSOR_BOOL8 of the inputs' shape; inputs 1 and 2 share one type and
shape. Quantized inputs may each have their own scale and zero point, and the output its
own: the chosen values are requantized into the output's quantization.
"""

from __future__ import annotations

import numpy as np

from nnapi.codes import OperandCode, OperationCode
from nnapi.operations.base import ExecutionContext, Operation, Shape, ValidationContext, register
from nnapi.operations.elementwise import (
    FLOAT_TENSORS,
    QUANT8_TENSORS,
    check_output_shape,
    select_by_bits,
)
from nnapi.operations.quant_math import requantize

T = OperandCode

# Named input positions (Android's select_v2.cpp kInputCondition, kInputTensor1, kInputTensor2).
CONDITION = 0
INPUT1 = 1
INPUT2 = 2


_TYPES = FLOAT_TENSORS + (T.TENSOR_INT32,) + QUANT8_TENSORS


@register(OperationCode.SELECT)
class Select(Operation):
    def validate(self, ctx: ValidationContext) -> None:
        ctx.check_counts(inputs=3, outputs=1)
        ctx.check_input_type(CONDITION, T.TENSOR_BOOL8)
        ctx.check_input_type(INPUT1, _TYPES)
        ctx.check_input_type(INPUT2, ctx.input_type(INPUT1))
        ctx.check_output_type(0, ctx.input_type(INPUT1))
        # All three inputs and the output have one shape: compare what is declared.
        shapes = [ctx.inputs[i].dimensions for i in (CONDITION, INPUT1, INPUT2)]
        known = [s for s in shapes if s]
        for index, shape in enumerate(shapes):
            for other in known:
                if shape and (len(shape) != len(other) or any(x and y and x != y for x, y in zip(shape, other))):
                    ctx.fail(f"input {index} shape {list(shape)} differs from {list(other)}; SELECT "
                             f"needs inputs of one shape")
        if known:
            merged = [max(dims) for dims in zip(*known)]
            check_output_shape(ctx, merged)

    def prepare(self, ctx: ExecutionContext) -> list[Shape]:
        shape = ctx.input(INPUT1).shape
        for index in (CONDITION, INPUT2):
            other = ctx.input(index).shape
            ctx.require(other == shape, f"input {index} has shape {list(other)}, input 1 has {list(shape)}")
        return [shape]

    def execute(self, ctx: ExecutionContext) -> list[np.ndarray]:
        condition, a, b = ctx.input(CONDITION), ctx.input(INPUT1), ctx.input(INPUT2)
        if a.type in QUANT8_TENSORS:
            output = ctx.output(0)
            chosen_a = requantize(a.value, a.scale, a.zero_point, output.scale, output.zero_point)
            chosen_b = requantize(b.value, b.scale, b.zero_point, output.scale, output.zero_point)
            return [select_by_bits(condition.value, chosen_a, chosen_b)]
        return [select_by_bits(condition.value, a.value, b.value)]

    def plan(self, ctx: ExecutionContext):
        """The requantization parameters (quantized inputs) resolved once."""
        a, b = ctx.input(INPUT1), ctx.input(INPUT2)
        if a.type not in QUANT8_TENSORS:
            return lambda values: [select_by_bits(values[CONDITION], values[INPUT1], values[INPUT2])]
        output = ctx.output(0)
        to_a = (a.scale, a.zero_point, output.scale, output.zero_point)
        to_b = (b.scale, b.zero_point, output.scale, output.zero_point)

        def select(values: list) -> list[np.ndarray]:
            return [select_by_bits(values[CONDITION], requantize(values[INPUT1], *to_a),
                                   requantize(values[INPUT2], *to_b))]
        return select
