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
from nnapi.operations.base import ExecutionContext, Operation, Shape, ValidationContext, register
from nnapi.operations.common import FLOAT_TENSORS
from nnapi.operations.lstm_cell import ACTIVATIONS, activate

# Input and output positions, as Android names them (kInputTensor, ...).
INPUT_TENSOR = 0
WEIGHTS_FEATURE_TENSOR = 1
WEIGHTS_TIME_TENSOR = 2
BIAS_TENSOR = 3
STATE_IN_TENSOR = 4
RANK_PARAM = 5
ACTIVATION_PARAM = 6
_MATRICES = (INPUT_TENSOR, WEIGHTS_FEATURE_TENSOR, WEIGHTS_TIME_TENSOR, STATE_IN_TENSOR)

T = OperandCode


@register(OperationCode.SVDF, omitted_operands=True)
class Svdf(Operation):
    def validate(self, ctx: ValidationContext) -> None:
        ctx.check_counts(inputs=7, outputs=2)
        ctx.check_input_type(INPUT_TENSOR, FLOAT_TENSORS)
        code = ctx.input_type(INPUT_TENSOR)
        ctx.check_input_types([code, code, code, code, code, T.INT32, T.INT32])
        ctx.check_output_types([code, code])
        for index in _MATRICES:
            ctx.check_input_rank(index, 2)

    def _setup(self, ctx: ExecutionContext):
        """The weights (float32), bias, rank, activation and units, checked against the
        input's and state's shapes (their values are not read: inputs fed at run time keep
        the output shapes static)."""
        for index, what in ((INPUT_TENSOR, "input"), (WEIGHTS_FEATURE_TENSOR, "weights_feature"),
                            (WEIGHTS_TIME_TENSOR, "weights_time"), (STATE_IN_TENSOR, "state")):
            ctx.require(not ctx.is_omitted(index), f"{what} must be present")
        x, state = ctx.input(INPUT_TENSOR).shape, ctx.input(STATE_IN_TENSOR).shape
        features, times = (np.asarray(ctx.value(i), dtype=np.float32) for i in (WEIGHTS_FEATURE_TENSOR,
                                                                               WEIGHTS_TIME_TENSOR))
        rank = int(ctx.scalar(RANK_PARAM))
        activation = int(ctx.scalar(ACTIVATION_PARAM))
        ctx.require(activation in ACTIVATIONS, f"unsupported activation {activation}")
        ctx.require(len(x) == 2 and features.ndim == 2 and times.ndim == 2 and len(state) == 2,
                    "input, weights_feature, weights_time and state must be 2-D")
        batch, input_size = x
        filters = features.shape[0]
        ctx.require(rank > 0 and filters % rank == 0, f"rank {rank} must divide the {filters} filters")
        ctx.require(features.shape[1] == input_size,
                    f"weights_feature has {features.shape[1]} columns, input size is {input_size}")
        ctx.require(times.shape[0] == filters, f"weights_time must have {filters} rows")
        memory = times.shape[1]
        ctx.require(tuple(state) == (batch, memory * filters),
                    f"state has shape {list(state)}, expected {[batch, memory * filters]}")
        units = filters // rank
        bias = None if ctx.is_omitted(BIAS_TENSOR) else np.asarray(ctx.value(BIAS_TENSOR), dtype=np.float32)
        if bias is not None:
            ctx.require(bias.shape == (units,), f"bias must have shape [{units}]")
        return features, times, bias, rank, activation, units

    def prepare(self, ctx: ExecutionContext) -> list[Shape]:
        units = self._setup(ctx)[-1]
        return [tuple(ctx.input(STATE_IN_TENSOR).shape), (ctx.input(INPUT_TENSOR).shape[0], units)]

    def execute(self, ctx: ExecutionContext) -> list[np.ndarray]:
        return self._kernel(ctx)(ctx.values())

    plan_sees_omitted = True  # the bias is optional

    def plan(self, ctx: ExecutionContext):
        """Constant weights: converted and checked once (``execute`` does it every call);
        the step is ``execute``'s."""
        return self._kernel(ctx)

    def _kernel(self, ctx: ExecutionContext):
        features, times, bias, rank, activation, units = self._setup(ctx)
        dtype = ctx.output_dtype(0)

        def step(values: list) -> list[np.ndarray]:
            x = np.asarray(values[INPUT_TENSOR], dtype=np.float32)
            state = np.asarray(values[STATE_IN_TENSOR], dtype=np.float32)
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
            return [shifted.reshape(state.shape).astype(dtype), output.astype(dtype)]

        return step
