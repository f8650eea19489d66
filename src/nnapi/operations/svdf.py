"""SVDF: the singular value decomposition filter (float32, float16, relaxed float32).

Inputs: input [batch, input_size], weights_feature [num_filters, input_size],
weights_time [num_filters, memory_size], optional bias [num_units], state
[batch, memory_size * num_filters], rank (num_filters = num_units * rank), activation.
Outputs: the new state (same shape as the state) and output [batch, num_units].

The state holds, per batch and filter, the last memory_size feature activations,
oldest first (Android's layout; the spec's "(memory_size - 1)" wording does not match
the vectors). One step: the newest slot receives input . weights_feature, each filter's
memory is dotted with its weights_time row, the rank filters of each unit are summed,
bias and activation applied, then the memory shifts by one slot (newest slot zeroed).
"""

from __future__ import annotations

import numpy as np

from nnapi.codes import OperandCode, OperationCode
from nnapi.operations._lstm_cell import ACTIVATIONS, activate
from nnapi.operations.base import ExecutionContext, Operation, Shape, ValidationContext, register
from nnapi.operations.common import FLOAT_TENSORS

T = OperandCode


@register(OperationCode.SVDF, omitted_operands=True)
class Svdf(Operation):
    def validate(self, ctx: ValidationContext) -> None:
        ctx.check_counts(inputs=7, outputs=2)
        ctx.check_input_type(0, FLOAT_TENSORS)
        code = ctx.input_type(0)
        ctx.check_input_types([code, code, code, code, code, T.INT32, T.INT32])
        ctx.check_output_types([code, code])
        for index, rank in ((0, 2), (1, 2), (2, 2), (4, 2)):
            ctx.check_input_rank(index, rank)

    def _setup(self, ctx: ExecutionContext):
        for index, what in ((0, "input"), (1, "weights_feature"), (2, "weights_time"), (4, "state")):
            ctx.require(not ctx.is_omitted(index), f"{what} must be present")
        x, features, times, state = (np.asarray(ctx.value(i), dtype=np.float32) for i in (0, 1, 2, 4))
        rank = int(ctx.scalar(5))
        activation = int(ctx.scalar(6))
        ctx.require(activation in ACTIVATIONS, f"unsupported activation {activation}")
        ctx.require(x.ndim == 2 and features.ndim == 2 and times.ndim == 2 and state.ndim == 2,
                    "input, weights_feature, weights_time and state must be 2-D")
        batch, input_size = x.shape
        filters = features.shape[0]
        ctx.require(rank > 0 and filters % rank == 0, f"rank {rank} must divide the {filters} filters")
        ctx.require(features.shape[1] == input_size,
                    f"weights_feature has {features.shape[1]} columns, input size is {input_size}")
        ctx.require(times.shape[0] == filters, f"weights_time must have {filters} rows")
        memory = times.shape[1]
        ctx.require(state.shape == (batch, memory * filters),
                    f"state has shape {list(state.shape)}, expected {[batch, memory * filters]}")
        units = filters // rank
        bias = None if ctx.is_omitted(3) else np.asarray(ctx.value(3), dtype=np.float32)
        if bias is not None:
            ctx.require(bias.shape == (units,), f"bias must have shape [{units}]")
        return x, features, times, bias, state, rank, activation, units

    def prepare(self, ctx: ExecutionContext) -> list[Shape]:
        x, _, _, _, state, _, _, units = self._setup(ctx)
        return [state.shape, (x.shape[0], units)]

    def execute(self, ctx: ExecutionContext) -> list[np.ndarray]:
        x, features, times, bias, state, rank, activation, units = self._setup(ctx)
        batch, filters, memory = x.shape[0], features.shape[0], times.shape[1]
        memory_state = state.reshape(batch, filters, memory).copy()
        memory_state[:, :, -1] = np.matmul(x, features.T)
        per_filter = np.einsum("bfm,fm->bf", memory_state, times)
        output = per_filter.reshape(batch, units, rank).sum(axis=-1)
        if bias is not None:
            output = output + bias
        output = activate(output, activation)
        shifted = np.zeros_like(memory_state)
        shifted[:, :, :-1] = memory_state[:, :, 1:]
        dtype = ctx.output_dtype(0)
        return [shifted.reshape(state.shape).astype(dtype), output.astype(dtype)]
