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
from nnapi.operations.base import ExecutionContext, Operation, Shape, ValidationContext, check_deadline, register
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


def _shape(ctx: ExecutionContext, index: int, what: str) -> Shape:
    """The shape of a required input (its value is not read: shape inference needs only
    the shape, so inputs fed at run time keep the output shapes static)."""
    ctx.require(not ctx.is_omitted(index), f"{what} must be present")
    return tuple(ctx.input(index).shape)


class _Cell:
    """One direction's weights, checked against the input size and batch, and the shape
    of its hidden state (whose value ``state`` reads)."""

    def __init__(self, ctx: ExecutionContext, indexes: tuple[int, int, int, int], input_size: int, batch: int,
                 label: str):
        weights, recurrent, bias = (_value(ctx, i, f"{label} {name}") for i, name in
                                    zip(indexes[:3], ("weights", "recurrent weights", "bias"), strict=True))
        state = _shape(ctx, indexes[3], f"{label} hidden state")
        ctx.require(weights.ndim == 2 and recurrent.ndim == 2 and bias.ndim == 1 and len(state) == 2,
                    f"{label} weights, recurrent weights, bias and hidden state must be 2-D, 2-D, 1-D, 2-D")
        units = weights.shape[0]
        ctx.require(weights.shape[1] == input_size,
                    f"{label} weights have {weights.shape[1]} columns, input size is {input_size}")
        ctx.require(recurrent.shape == (units, units), f"{label} recurrent weights must be [{units}, {units}]")
        ctx.require(bias.shape == (units,), f"{label} bias must be [{units}]")
        ctx.require(state == (batch, units), f"{label} hidden state must be [{batch}, {units}]")
        self.weights, self.recurrent, self.bias, self.state_shape = weights, recurrent, bias, state
        self.state_index = indexes[3]
        self.units = units

    def state(self, values: list) -> np.ndarray:
        """The hidden state's value among an operation's input ``values``, as float32."""
        return np.asarray(values[self.state_index], dtype=np.float32)

    def run(self, x: np.ndarray, state: np.ndarray, activation: int, recurrent_t: np.ndarray | None = None,
            **options) -> tuple[np.ndarray, np.ndarray]:
        """``run_rnn`` of this cell over the time-major sequence ``x`` from ``state``."""
        return run_rnn(x, self.weights, self.recurrent, self.bias, state, activation, recurrent_t=recurrent_t,
                       **options)


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

    def _cell(self, ctx: ExecutionContext) -> _Cell:
        x = _shape(ctx, INPUT, "input")
        ctx.require(len(x) == 2, "input must be 2-D")
        return _Cell(ctx, CELL, x[1], x[0], "")

    def prepare(self, ctx: ExecutionContext) -> list[Shape]:
        cell = self._cell(ctx)
        _activation(ctx, ACTIVATION)
        return [cell.state_shape, cell.state_shape]

    def execute(self, ctx: ExecutionContext) -> list[np.ndarray]:
        return self._kernel(ctx, recurrent_t=None)(ctx.values())

    def plan(self, ctx: ExecutionContext):
        """Constant weights: the recurrent matrix transposed once (``run_rnn`` copies it
        at every call otherwise)."""
        cell = self._cell(ctx)
        return self._kernel(ctx, cell.recurrent.T.copy(), cell)

    def _kernel(self, ctx: ExecutionContext, recurrent_t: np.ndarray | None, cell: _Cell | None = None):
        cell = cell if cell is not None else self._cell(ctx)
        activation, dtype = _activation(ctx, ACTIVATION), ctx.output_dtype(0)

        def step(values: list) -> list[np.ndarray]:
            x = np.asarray(values[INPUT], dtype=np.float32)
            _, h = cell.run(x[np.newaxis], cell.state(values), activation, recurrent_t)
            result = h.astype(dtype)
            return [result, result.copy()]

        return step


@register(OperationCode.UNIDIRECTIONAL_SEQUENCE_RNN)
class UnidirectionalSequenceRnn(Operation):
    def validate(self, ctx: ValidationContext) -> None:
        ctx.check_counts(inputs=SEQ_TIME_MAJOR + 1, outputs=(1, 2))
        _validate_types(ctx, list(CELL), {ACTIVATION: T.INT32, SEQ_TIME_MAJOR: T.INT32})
        for index, rank in _CELL_RANKS:
            ctx.check_input_rank(index, 3 if index == INPUT else rank)

    def _setup(self, ctx: ExecutionContext) -> tuple[Shape, bool, _Cell]:
        x = _shape(ctx, INPUT, "input")
        ctx.require(len(x) == 3, "input must be 3-D")
        time_major = int(ctx.scalar(SEQ_TIME_MAJOR))
        ctx.require(time_major in (0, 1), f"time_major must be 0 or 1, got {time_major}")
        batch = x[1] if time_major else x[0]
        return x, bool(time_major), _Cell(ctx, CELL, x[2], batch, "")

    def prepare(self, ctx: ExecutionContext) -> list[Shape]:
        x, _, cell = self._setup(ctx)
        _activation(ctx, ACTIVATION)
        return [(*x[:2], cell.units), cell.state_shape][: len(ctx.outputs)]

    def execute(self, ctx: ExecutionContext) -> list[np.ndarray]:
        return self._kernel(ctx, None, ctx.check_deadline)(ctx.values())

    def plan(self, ctx: ExecutionContext):
        """Constant weights: the recurrent matrix transposed once."""
        setup = self._setup(ctx)
        return self._kernel(ctx, setup[2].recurrent.T.copy(), check_deadline, setup)

    def _kernel(self, ctx: ExecutionContext, recurrent_t: np.ndarray | None, check,
                setup: tuple[Shape, bool, _Cell] | None = None):
        """``setup``: ``_setup``'s result where the caller has it (its weights converted once)."""
        _, time_major, cell = setup if setup is not None else self._setup(ctx)
        activation, dtype, count = _activation(ctx, ACTIVATION), ctx.output_dtype(0), len(ctx.outputs)

        def run(values: list) -> list[np.ndarray]:
            x = to_time_major(np.asarray(values[INPUT], dtype=np.float32), time_major)
            outputs, h = cell.run(x, cell.state(values), activation, recurrent_t, check=check)
            return [from_time_major(outputs, time_major).astype(dtype), h.astype(dtype)][:count]

        return run


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
        x = _shape(ctx, INPUT, "input")
        ctx.require(len(x) == 3, "input must be 3-D")
        time_major = bool(ctx.scalar(BIDI_TIME_MAJOR))
        merge = bool(ctx.scalar(BIDI_MERGE_OUTPUTS))
        expected = (1, 3) if merge else (2, 4)
        ctx.require(len(ctx.outputs) in expected,
                    f"{len(ctx.outputs)} outputs do not fit merge_outputs={merge} (expected {expected})")
        batch = x[1] if time_major else x[0]
        has_aux = not ctx.is_omitted(BIDI_AUX_INPUT)
        aux_weights = [not ctx.is_omitted(i) for i in (BIDI_FW_AUX_WEIGHTS, BIDI_BW_AUX_WEIGHTS)]
        ctx.require(all(aux_weights) or not any(aux_weights),
                    "forward and backward auxiliary weights must be both present or both omitted")
        ctx.require(has_aux or not any(aux_weights), "auxiliary weights need an auxiliary input")
        cross = has_aux and all(aux_weights)
        parallel = has_aux and not cross
        aux = None
        if has_aux:
            aux = _shape(ctx, BIDI_AUX_INPUT, "auxiliary input")
            ctx.require(len(aux) == 3 and aux[:2] == x[:2],
                        f"auxiliary input shape {list(aux)} does not match input {list(x)}")
        fw = _Cell(ctx, CELL, x[2], batch, "forward")
        bw = _Cell(ctx, BIDI_BW_CELL, aux[2] if parallel else x[2], batch, "backward")  # type: ignore[index]
        fw_aux = bw_aux = None
        if cross:
            fw_aux = _value(ctx, BIDI_FW_AUX_WEIGHTS, "forward aux weights")
            bw_aux = _value(ctx, BIDI_BW_AUX_WEIGHTS, "backward aux weights")
            for cell, weights, label in ((fw, fw_aux, "forward"), (bw, bw_aux, "backward")):
                ctx.require(weights.shape == (cell.units, aux[2]),  # type: ignore[index]
                            f"{label} auxiliary weights have shape {list(weights.shape)}")
        return x, has_aux, time_major, merge, parallel, fw, bw, fw_aux, bw_aux

    def prepare(self, ctx: ExecutionContext) -> list[Shape]:
        x, _, _, merge, _, fw, bw, _, _ = self._setup(ctx)
        _activation(ctx, BIDI_ACTIVATION)
        lead = x[:2]
        shapes: list[Shape] = [(*lead, fw.units + bw.units)] if merge else [(*lead, fw.units), (*lead, bw.units)]
        if len(ctx.outputs) > len(shapes):
            shapes += [fw.state_shape, bw.state_shape]
        return shapes

    def execute(self, ctx: ExecutionContext) -> list[np.ndarray]:
        return self._kernel(ctx, (None, None), ctx.check_deadline)(ctx.values())

    plan_sees_omitted = True  # the auxiliary input and weights are optional

    def plan(self, ctx: ExecutionContext):
        """Constant weights: both cells' recurrent matrices transposed once."""
        setup = self._setup(ctx)
        fw, bw = setup[5], setup[6]
        return self._kernel(ctx, (fw.recurrent.T.copy(), bw.recurrent.T.copy()), check_deadline, setup)

    def _kernel(self, ctx: ExecutionContext, recurrent_t: tuple, check, setup: tuple | None = None):
        """``setup``: ``_setup``'s result where the caller has it (its weights converted once)."""
        setup = setup if setup is not None else self._setup(ctx)
        _, has_aux, time_major, merge, parallel, fw, bw, fw_aux, bw_aux = setup
        activation, dtype, count = _activation(ctx, BIDI_ACTIVATION), ctx.output_dtype(0), len(ctx.outputs)

        def run(values: list) -> list[np.ndarray]:
            x = to_time_major(np.asarray(values[INPUT], dtype=np.float32), time_major)
            aux = to_time_major(np.asarray(values[BIDI_AUX_INPUT], dtype=np.float32), time_major) if has_aux else None
            fw_out, fw_h = fw.run(x, fw.state(values), activation, recurrent_t[0], aux=aux, aux_weights=fw_aux,
                                  check=check)
            bw_input = aux if parallel else x
            bw_out, bw_h = bw.run(bw_input, bw.state(values), activation, recurrent_t[1],  # type: ignore[arg-type]
                                  aux=aux, aux_weights=bw_aux, reverse=True, check=check)
            if merge:
                results = [from_time_major(np.concatenate([fw_out, bw_out], axis=-1), time_major).astype(dtype)]
            else:
                results = [from_time_major(fw_out, time_major).astype(dtype),
                           from_time_major(bw_out, time_major).astype(dtype)]
            if count > len(results):
                results += [fw_h.astype(dtype), bw_h.astype(dtype)]
            return results

        return run
