"""RNN, UNIDIRECTIONAL_SEQUENCE_RNN and BIDIRECTIONAL_SEQUENCE_RNN (float32, float16,
relaxed float32): h = activation(x W' + h R' + b), one step or unrolled over a sequence.

RNN (6 inputs) gives the new hidden state twice (state out, output).
UNIDIRECTIONAL_SEQUENCE_RNN (7 inputs, time_major as INT32 0/1) gives the sequence of
outputs and optionally the final hidden state. BIDIRECTIONAL_SEQUENCE_RNN (15 inputs)
runs a forward and a backward cell; an auxiliary input with auxiliary weights feeds both
(cross-linking), an auxiliary input alone replaces the backward cell's input (parallel
linking); merge_outputs concatenates the outputs; 2 optional final-state outputs follow.
"""

from __future__ import annotations

import numpy as np

from nnapi.codes import OperandCode, OperationCode
from nnapi.operations.base import ExecutionContext, Operation, Shape, ValidationContext, register
from nnapi.operations.common import FLOAT_TENSORS
from nnapi.operations.lstm_cell import ACTIVATIONS, from_time_major, run_rnn, to_time_major

T = OperandCode

# Named input positions (Android's rnn.h kInputTensor, ...).
INPUT = 0
WEIGHTS = 1
RECURRENT_WEIGHTS = 2
BIAS = 3
HIDDEN_STATE_IN = 4
ACTIVATION = 5
SEQ_TIME_MAJOR = 6  # UNIDIRECTIONAL_SEQUENCE_RNN: RNN's 6 inputs, then time_major
#: one direction's weights, recurrent weights, bias and hidden state
CELL = (WEIGHTS, RECURRENT_WEIGHTS, BIAS, HIDDEN_STATE_IN)
# BIDIRECTIONAL_SEQUENCE_RNN: the forward cell at CELL, then
BIDI_BW_CELL = (5, 6, 7, 8)
BIDI_AUX_INPUT = 9
BIDI_FW_AUX_WEIGHTS = 10
BIDI_BW_AUX_WEIGHTS = 11
BIDI_ACTIVATION = 12
BIDI_TIME_MAJOR = 13
BIDI_MERGE_OUTPUTS = 14
#: the required rank of each tensor input of one cell (its input first)
_CELL_RANKS = ((INPUT, 2), (WEIGHTS, 2), (RECURRENT_WEIGHTS, 2), (BIAS, 1), (HIDDEN_STATE_IN, 2))


def _validate_types(ctx: ValidationContext, tensors: list[int], scalars: dict[int, OperandCode]) -> None:
    ctx.check_input_type(INPUT, FLOAT_TENSORS)
    code = ctx.input_type(INPUT)
    for index in tensors:
        ctx.check_input_type(index, code)
    for index, scalar in scalars.items():
        ctx.check_input_type(index, scalar)
    for index in range(len(ctx.outputs)):
        ctx.check_output_type(index, code)


def _value(ctx: ExecutionContext, index: int, what: str) -> np.ndarray:
    ctx.require(not ctx.is_omitted(index), f"{what} must be present")
    return np.asarray(ctx.value(index), dtype=np.float32)


class _Cell:
    """One direction's weights, checked against the input size and batch."""

    def __init__(self, ctx: ExecutionContext, indexes: tuple[int, int, int, int], input_size: int, batch: int,
                 label: str):
        weights, recurrent, bias, state = (_value(ctx, i, f"{label} {name}") for i, name in
                                           zip(indexes, ("weights", "recurrent weights", "bias", "hidden state"),
                                               strict=True))
        ctx.require(weights.ndim == 2 and recurrent.ndim == 2 and bias.ndim == 1 and state.ndim == 2,
                    f"{label} weights, recurrent weights, bias and hidden state must be 2-D, 2-D, 1-D, 2-D")
        units = weights.shape[0]
        ctx.require(weights.shape[1] == input_size,
                    f"{label} weights have {weights.shape[1]} columns, input size is {input_size}")
        ctx.require(recurrent.shape == (units, units), f"{label} recurrent weights must be [{units}, {units}]")
        ctx.require(bias.shape == (units,), f"{label} bias must be [{units}]")
        ctx.require(state.shape == (batch, units), f"{label} hidden state must be [{batch}, {units}]")
        self.weights, self.recurrent, self.bias, self.state = weights, recurrent, bias, state
        self.units = units


def _activation(ctx: ExecutionContext, index: int) -> int:
    code = int(ctx.scalar(index))
    ctx.require(code in ACTIVATIONS, f"unsupported activation {code}")
    return code


@register(OperationCode.RNN)
class Rnn(Operation):
    def validate(self, ctx: ValidationContext) -> None:
        ctx.check_counts(inputs=ACTIVATION + 1, outputs=2)
        _validate_types(ctx, list(CELL), {ACTIVATION: T.INT32})
        for index, rank in _CELL_RANKS:
            ctx.check_input_rank(index, rank)

    def _cell(self, ctx: ExecutionContext) -> tuple[np.ndarray, _Cell]:
        x = _value(ctx, INPUT, "input")
        ctx.require(x.ndim == 2, "input must be 2-D")
        return x, _Cell(ctx, CELL, x.shape[1], x.shape[0], "")

    def prepare(self, ctx: ExecutionContext) -> list[Shape]:
        _, cell = self._cell(ctx)
        _activation(ctx, ACTIVATION)
        return [cell.state.shape, cell.state.shape]

    def execute(self, ctx: ExecutionContext) -> list[np.ndarray]:
        x, cell = self._cell(ctx)
        outputs, h = run_rnn(x[np.newaxis], cell.weights, cell.recurrent, cell.bias, cell.state,
                             _activation(ctx, ACTIVATION))
        result = h.astype(ctx.output_dtype(0))
        return [result, result.copy()]


@register(OperationCode.UNIDIRECTIONAL_SEQUENCE_RNN)
class UnidirectionalSequenceRnn(Operation):
    def validate(self, ctx: ValidationContext) -> None:
        ctx.check_counts(inputs=SEQ_TIME_MAJOR + 1, outputs=(1, 2))
        _validate_types(ctx, list(CELL), {ACTIVATION: T.INT32, SEQ_TIME_MAJOR: T.INT32})
        for index, rank in _CELL_RANKS:
            ctx.check_input_rank(index, 3 if index == INPUT else rank)

    def _setup(self, ctx: ExecutionContext):
        x = _value(ctx, INPUT, "input")
        ctx.require(x.ndim == 3, "input must be 3-D")
        time_major = int(ctx.scalar(SEQ_TIME_MAJOR))
        ctx.require(time_major in (0, 1), f"time_major must be 0 or 1, got {time_major}")
        batch = x.shape[1] if time_major else x.shape[0]
        return x, bool(time_major), _Cell(ctx, CELL, x.shape[2], batch, "")

    def prepare(self, ctx: ExecutionContext) -> list[Shape]:
        x, _, cell = self._setup(ctx)
        _activation(ctx, ACTIVATION)
        return [(*x.shape[:2], cell.units), cell.state.shape][: len(ctx.outputs)]

    def execute(self, ctx: ExecutionContext) -> list[np.ndarray]:
        x, time_major, cell = self._setup(ctx)
        outputs, h = run_rnn(to_time_major(x, time_major), cell.weights, cell.recurrent, cell.bias, cell.state,
                             _activation(ctx, ACTIVATION), check=ctx.check_deadline)
        dtype = ctx.output_dtype(0)
        return [from_time_major(outputs, time_major).astype(dtype), h.astype(dtype)][: len(ctx.outputs)]


@register(OperationCode.BIDIRECTIONAL_SEQUENCE_RNN, omitted_operands=True)
class BidirectionalSequenceRnn(Operation):
    def validate(self, ctx: ValidationContext) -> None:
        ctx.check_counts(inputs=BIDI_MERGE_OUTPUTS + 1, outputs=(1, 2, 3, 4))
        _validate_types(ctx, list(range(WEIGHTS, BIDI_ACTIVATION)),
                        {BIDI_ACTIVATION: T.INT32, BIDI_TIME_MAJOR: T.BOOL, BIDI_MERGE_OUTPUTS: T.BOOL})
        for index, rank in _CELL_RANKS:
            ctx.check_input_rank(index, 3 if index == INPUT else rank)
        for index, (_, rank) in zip(BIDI_BW_CELL, _CELL_RANKS[1:], strict=True):
            ctx.check_input_rank(index, rank)

    def _setup(self, ctx: ExecutionContext):
        x = _value(ctx, INPUT, "input")
        ctx.require(x.ndim == 3, "input must be 3-D")
        time_major = bool(ctx.scalar(BIDI_TIME_MAJOR))
        merge = bool(ctx.scalar(BIDI_MERGE_OUTPUTS))
        expected = (1, 3) if merge else (2, 4)
        ctx.require(len(ctx.outputs) in expected,
                    f"{len(ctx.outputs)} outputs do not fit merge_outputs={merge} (expected {expected})")
        batch = x.shape[1] if time_major else x.shape[0]
        has_aux = not ctx.is_omitted(BIDI_AUX_INPUT)
        aux_weights = [not ctx.is_omitted(i) for i in (BIDI_FW_AUX_WEIGHTS, BIDI_BW_AUX_WEIGHTS)]
        ctx.require(all(aux_weights) or not any(aux_weights),
                    "forward and backward auxiliary weights must be both present or both omitted")
        ctx.require(has_aux or not any(aux_weights), "auxiliary weights need an auxiliary input")
        cross = has_aux and all(aux_weights)
        parallel = has_aux and not cross
        aux = None
        if has_aux:
            aux = _value(ctx, BIDI_AUX_INPUT, "auxiliary input")
            ctx.require(aux.ndim == 3 and aux.shape[:2] == x.shape[:2],
                        f"auxiliary input shape {list(aux.shape)} does not match input {list(x.shape)}")
        fw = _Cell(ctx, CELL, x.shape[2], batch, "forward")
        bw = _Cell(ctx, BIDI_BW_CELL, aux.shape[2] if parallel else x.shape[2], batch, "backward")
        fw_aux = bw_aux = None
        if cross:
            fw_aux = _value(ctx, BIDI_FW_AUX_WEIGHTS, "forward aux weights")
            bw_aux = _value(ctx, BIDI_BW_AUX_WEIGHTS, "backward aux weights")
            for cell, weights, label in ((fw, fw_aux, "forward"), (bw, bw_aux, "backward")):
                ctx.require(weights.shape == (cell.units, aux.shape[2]),  # type: ignore[union-attr]
                            f"{label} auxiliary weights have shape {list(weights.shape)}")
        return x, aux, time_major, merge, parallel, fw, bw, fw_aux, bw_aux

    def prepare(self, ctx: ExecutionContext) -> list[Shape]:
        x, _, _, merge, _, fw, bw, _, _ = self._setup(ctx)
        _activation(ctx, BIDI_ACTIVATION)
        lead = x.shape[:2]
        shapes: list[Shape] = [(*lead, fw.units + bw.units)] if merge else [(*lead, fw.units), (*lead, bw.units)]
        if len(ctx.outputs) > len(shapes):
            shapes += [fw.state.shape, bw.state.shape]
        return shapes

    def execute(self, ctx: ExecutionContext) -> list[np.ndarray]:
        x, aux, time_major, merge, parallel, fw, bw, fw_aux, bw_aux = self._setup(ctx)
        activation = _activation(ctx, BIDI_ACTIVATION)
        x = to_time_major(x, time_major)
        if aux is not None:
            aux = to_time_major(aux, time_major)
        fw_out, fw_h = run_rnn(x, fw.weights, fw.recurrent, fw.bias, fw.state, activation,
                               aux=aux, aux_weights=fw_aux, check=ctx.check_deadline)
        bw_input = aux if parallel else x
        bw_out, bw_h = run_rnn(bw_input, bw.weights, bw.recurrent, bw.bias, bw.state, activation,  # type: ignore[arg-type]
                               aux=aux, aux_weights=bw_aux, reverse=True, check=ctx.check_deadline)
        dtype = ctx.output_dtype(0)
        if merge:
            results = [from_time_major(np.concatenate([fw_out, bw_out], axis=-1), time_major).astype(dtype)]
        else:
            results = [from_time_major(fw_out, time_major).astype(dtype),
                       from_time_major(bw_out, time_major).astype(dtype)]
        if len(ctx.outputs) > len(results):
            results += [fw_h.astype(dtype), bw_h.astype(dtype)]
        return results
