"""LSTM, UNIDIRECTIONAL_SEQUENCE_LSTM and BIDIRECTIONAL_SEQUENCE_LSTM (float32, float16,
relaxed float32), all running the one cell of ``lstm_cell``.

LSTM is one time step with 23 inputs (feature level 1) or 27 (layer normalization,
feature level 3) and four outputs (scratch, output state, cell state, output).
UNIDIRECTIONAL_SEQUENCE_LSTM unrolls it over a time-major or batch-major sequence (28
inputs; 1 output, or 3 with the final states). BIDIRECTIONAL_SEQUENCE_LSTM runs a forward
and a backward direction (61 inputs); an auxiliary input either feeds both directions
through auxiliary weights (cross-linking) or, without auxiliary weights, replaces the
backward direction's input (parallel linking); merge_outputs concatenates the two outputs
along the last axis; the final states are 4 optional extra outputs.
"""

from __future__ import annotations

import numpy as np

from nnapi.codes import OperandCode, OperationCode
from nnapi.operations.base import ExecutionContext, Operation, Shape, ValidationContext, check_deadline, register
from nnapi.operations.common import FLOAT_TENSORS
from nnapi.operations.lstm_cell import (
    AUX_NAMES,
    NORM_NAMES,
    WEIGHT_NAMES,
    PreparedLstm,
    check_direction,
    from_time_major,
    lstm_stacks,
    read_direction,
    run_lstm,
    to_time_major,
)

T = OperandCode
_CLIP_SCALAR = {T.TENSOR_FLOAT32: T.FLOAT32, T.TENSOR_FLOAT16: T.FLOAT16}

# Named input positions (Android's lstm.h kInputTensor, ...). The weights and biases
# are WEIGHT_NAMES in order from WEIGHTS; the layer normalization weights NORM_NAMES.
INPUT = 0
WEIGHTS = 1  # input_to_input_weights, the first of the 17 WEIGHT_NAMES
OUTPUT_STATE_IN = 18
CELL_STATE_IN = 19
ACTIVATION = 20
CELL_CLIP = 21
PROJ_CLIP = 22
LSTM_NORM_WEIGHTS = 23  # LSTM's 4 optional layer normalization weights (27 inputs)
LSTM_INPUT_COUNTS = (23, 27)
# UNIDIRECTIONAL_SEQUENCE_LSTM: LSTM's first 23 inputs, then
SEQ_TIME_MAJOR = 23
SEQ_NORM_WEIGHTS = 24
SEQ_INPUT_COUNT = 28
# BIDIRECTIONAL_SEQUENCE_LSTM: the forward direction's weights at WEIGHTS, then
BIDI_BW_WEIGHTS = 18
BIDI_FW_STATE = (35, 36)  # activation state, cell state
BIDI_BW_STATE = (37, 38)
BIDI_AUX_INPUT = 39
BIDI_FW_AUX_WEIGHTS = 40
BIDI_BW_AUX_WEIGHTS = 44
BIDI_ACTIVATION = 48
BIDI_CELL_CLIP = 49
BIDI_PROJ_CLIP = 50
BIDI_MERGE_OUTPUTS = 51
BIDI_TIME_MAJOR = 52
BIDI_FW_NORM_WEIGHTS = 53
BIDI_BW_NORM_WEIGHTS = 57
BIDI_INPUT_COUNT = 61


def _layout(weights: int, norm: int, aux: int | None = None) -> dict[str, int]:
    """Weight name -> input index of one direction."""
    layout = {name: weights + i for i, name in enumerate(WEIGHT_NAMES)}
    layout.update({name: norm + i for i, name in enumerate(NORM_NAMES)})
    if aux is not None:
        layout.update({name: aux + i for i, name in enumerate(AUX_NAMES)})
    return layout


_PLAIN = {name: WEIGHTS + i for i, name in enumerate(WEIGHT_NAMES)}
_LSTM_LAYOUT = _layout(WEIGHTS, LSTM_NORM_WEIGHTS)
_SEQUENCE_LAYOUT = _layout(WEIGHTS, SEQ_NORM_WEIGHTS)
_FW_LAYOUT = _layout(WEIGHTS, BIDI_FW_NORM_WEIGHTS, BIDI_FW_AUX_WEIGHTS)
_BW_LAYOUT = _layout(BIDI_BW_WEIGHTS, BIDI_BW_NORM_WEIGHTS, BIDI_BW_AUX_WEIGHTS)


def _validate_signature(ctx: ValidationContext, tensors: range | list[int], activation: int,
                        clips: tuple[int, int], bools: tuple[int, ...] = ()) -> OperandCode:
    """Common type rules: every tensor input and output has the input's float type, the
    activation is INT32, the clipping thresholds are scalars of the matching float type."""
    ctx.check_input_type(INPUT, FLOAT_TENSORS)
    code = ctx.input_type(INPUT)
    for index in tensors:
        ctx.check_input_type(index, code)
    ctx.check_input_type(activation, T.INT32)
    for index in clips:
        ctx.check_input_type(index, _CLIP_SCALAR[code])
    for index in bools:
        ctx.check_input_type(index, T.BOOL)
    for index in range(len(ctx.outputs)):
        ctx.check_output_type(index, code)
    return code


def _check_ranks(ctx: ValidationContext, layout: dict[str, int]) -> None:
    # Omitted optional operands are often declared with placeholder shapes, so only the
    # required weights' ranks are checked here; the rest are checked at execution.
    for name in ("input_to_forget", "input_to_cell", "input_to_output", "recurrent_to_forget",
                 "recurrent_to_cell", "recurrent_to_output"):
        ctx.check_input_rank(layout[name], 2)
    for name in ("forget_bias", "cell_bias", "output_bias"):
        ctx.check_input_rank(layout[name], 1)


def _state(ctx: ExecutionContext, index: int, shape: tuple[int, int], what: str, read: bool = True
           ) -> np.ndarray | None:
    """A state input checked against ``shape``, as float32 (None unless ``read``: shape
    inference needs only its shape, so a state fed by the caller keeps shapes static)."""
    ctx.require(not ctx.is_omitted(index), f"{what} must be present")
    actual = tuple(ctx.input(index).shape)
    ctx.require(actual == shape, f"{what} has shape {list(actual)}, expected {list(shape)}")
    return np.asarray(ctx.value(index), dtype=np.float32) if read else None


def _clips(ctx: ExecutionContext, cell: int, proj: int) -> tuple[float, float]:
    return float(ctx.scalar(cell)), float(ctx.scalar(proj))


@register(OperationCode.LSTM, omitted_operands=True)
class Lstm(Operation):
    def validate(self, ctx: ValidationContext) -> None:
        ctx.check_counts(inputs=LSTM_INPUT_COUNTS, outputs=4)
        tensors = list(range(ACTIVATION)) + list(range(LSTM_NORM_WEIGHTS, len(ctx.inputs)))
        _validate_signature(ctx, tensors, ACTIVATION, (CELL_CLIP, PROJ_CLIP))
        ctx.check_input_rank(INPUT, 2)
        _check_ranks(ctx, _PLAIN)
        for index in (OUTPUT_STATE_IN, CELL_STATE_IN):
            ctx.check_input_rank(index, 2)

    def _direction(self, ctx: ExecutionContext, read_states: bool = True):
        ctx.require(not ctx.is_omitted(INPUT), "input must be present")
        x = ctx.input(INPUT)
        ctx.require(x.rank == 2, f"input must be 2-D, got rank {x.rank}")
        layout = _LSTM_LAYOUT if len(ctx.inputs) > LSTM_NORM_WEIGHTS else _PLAIN
        d = read_direction(ctx, layout, int(ctx.scalar(ACTIVATION)), *_clips(ctx, CELL_CLIP, PROJ_CLIP))
        check_direction(ctx, d, x.shape[1], None)
        batch = x.shape[0]
        h0 = _state(ctx, OUTPUT_STATE_IN, (batch, d.output_size), "output state in", read_states)
        c0 = _state(ctx, CELL_STATE_IN, (batch, d.num_units), "cell state in", read_states)
        return d, h0, c0

    def prepare(self, ctx: ExecutionContext) -> list[Shape]:
        d, _, _ = self._direction(ctx, read_states=False)
        batch = ctx.input(INPUT).shape[0]
        scratch = (batch, d.num_units * len(d.gates()))
        return [scratch, (batch, d.output_size), (batch, d.num_units), (batch, d.output_size)]

    def execute(self, ctx: ExecutionContext) -> list[np.ndarray]:
        d, h0, c0 = self._direction(ctx)
        return _lstm_step(d, ctx.value(INPUT), h0, c0, ctx.output_dtype(0))

    plan_sees_omitted = True

    def plan(self, ctx: ExecutionContext):
        """Constant weights (any variant): ``run_lstm``'s stacked matrices and biases
        (``lstm_stacks``) built once, where ``execute`` builds them at every step (about
        as much work as the step's products); the step itself is ``execute``'s."""
        d, _, _ = self._direction(ctx, read_states=False)
        stacks, dtype = lstm_stacks(d), ctx.output_dtype(0)

        def step(values: list) -> list[np.ndarray]:
            h0 = np.asarray(values[OUTPUT_STATE_IN], dtype=np.float32)
            c0 = np.asarray(values[CELL_STATE_IN], dtype=np.float32)
            return _lstm_step(d, values[INPUT], h0, c0, dtype, stacks)

        return step


def _lstm_step(d, x, h0: np.ndarray, c0: np.ndarray, dtype, stacks=None) -> list[np.ndarray]:
    """LSTM's outputs (scratch, output state, cell state, output) of one time step."""
    outputs, h, c, scratch = run_lstm(d, np.asarray(x, dtype=np.float32)[np.newaxis], h0, c0, stacks=stacks)
    return [scratch.astype(dtype), h.astype(dtype), c.astype(dtype), outputs[0].astype(dtype)]


@register(OperationCode.UNIDIRECTIONAL_SEQUENCE_LSTM, omitted_operands=True)
class UnidirectionalSequenceLstm(Operation):
    def validate(self, ctx: ValidationContext) -> None:
        ctx.check_counts(inputs=SEQ_INPUT_COUNT, outputs=(1, 3))
        tensors = list(range(ACTIVATION)) + list(range(SEQ_NORM_WEIGHTS, SEQ_INPUT_COUNT))
        _validate_signature(ctx, tensors, ACTIVATION, (CELL_CLIP, PROJ_CLIP), bools=(SEQ_TIME_MAJOR,))
        ctx.check_input_rank(INPUT, 3)
        _check_ranks(ctx, _PLAIN)
        for index in (OUTPUT_STATE_IN, CELL_STATE_IN):
            ctx.check_input_rank(index, 2)

    def _setup(self, ctx: ExecutionContext, read_states: bool = True):
        ctx.require(not ctx.is_omitted(INPUT), "input must be present")
        x = ctx.input(INPUT)
        ctx.require(x.rank == 3, f"input must be 3-D, got rank {x.rank}")
        time_major = bool(ctx.scalar(SEQ_TIME_MAJOR))
        batch = x.shape[1] if time_major else x.shape[0]
        d = read_direction(ctx, _SEQUENCE_LAYOUT, int(ctx.scalar(ACTIVATION)), *_clips(ctx, CELL_CLIP, PROJ_CLIP))
        check_direction(ctx, d, x.shape[2], None)
        h0 = _state(ctx, OUTPUT_STATE_IN, (batch, d.output_size), "output state in", read_states)
        c0 = _state(ctx, CELL_STATE_IN, (batch, d.num_units), "cell state in", read_states)
        return d, time_major, h0, c0

    def prepare(self, ctx: ExecutionContext) -> list[Shape]:
        d, _, _, _ = self._setup(ctx, read_states=False)
        x = ctx.input(INPUT)
        batch = x.shape[1] if bool(ctx.scalar(SEQ_TIME_MAJOR)) else x.shape[0]
        shape = (*x.shape[:2], d.output_size)
        return [shape, (batch, d.output_size), (batch, d.num_units)][: len(ctx.outputs)]

    plan_sees_omitted = True

    def plan(self, ctx: ExecutionContext):
        """Float32 with constant weights (plain, CIFG or projection variants): the time
        loop of ``PreparedLstm``, its stacked weights built once. Other constant weights
        (peephole, layer normalization, float16): ``execute``'s loop with its stacked
        matrices (``lstm_stacks``) built once."""
        x = ctx.input(INPUT)
        d, time_major, _, _ = self._setup(ctx, read_states=False)
        count = len(ctx.outputs)
        if x.type != T.TENSOR_FLOAT32 or ctx.output_dtype(0) != np.float32 or not PreparedLstm.supports(d):
            stacks, dtype = lstm_stacks(d), ctx.output_dtype(0)

            def unrolled(values: list) -> list[np.ndarray]:
                return _unidirectional(d, values[INPUT], np.asarray(values[OUTPUT_STATE_IN], dtype=np.float32),
                                       np.asarray(values[CELL_STATE_IN], dtype=np.float32), time_major, dtype,
                                       count, check_deadline, stacks)

            return unrolled
        cell = PreparedLstm(d)

        def kernel(values: list) -> list[np.ndarray]:
            sequence = to_time_major(np.asarray(values[INPUT], dtype=np.float32), time_major)
            outputs, h, c = cell(sequence, values[OUTPUT_STATE_IN], values[CELL_STATE_IN])
            return [from_time_major(outputs, time_major), h, c][:count]

        return kernel

    def execute(self, ctx: ExecutionContext) -> list[np.ndarray]:
        d, time_major, h0, c0 = self._setup(ctx)
        return _unidirectional(d, ctx.value(INPUT), h0, c0, time_major, ctx.output_dtype(0), len(ctx.outputs),
                               ctx.check_deadline)


def _unidirectional(d, x, h0: np.ndarray, c0: np.ndarray, time_major: bool, dtype, count: int, check,
                    stacks=None) -> list[np.ndarray]:
    """UNIDIRECTIONAL_SEQUENCE_LSTM's first ``count`` outputs through ``run_lstm``."""
    x = to_time_major(np.asarray(x, dtype=np.float32), time_major)
    outputs, h, c, _ = run_lstm(d, x, h0, c0, check=check, stacks=stacks)
    return [from_time_major(outputs, time_major).astype(dtype), h.astype(dtype), c.astype(dtype)][:count]


@register(OperationCode.BIDIRECTIONAL_SEQUENCE_LSTM, omitted_operands=True)
class BidirectionalSequenceLstm(Operation):
    def validate(self, ctx: ValidationContext) -> None:
        ctx.check_counts(inputs=BIDI_INPUT_COUNT, outputs=(1, 2, 5, 6))
        tensors = list(range(BIDI_ACTIVATION)) + list(range(BIDI_FW_NORM_WEIGHTS, BIDI_INPUT_COUNT))
        _validate_signature(ctx, tensors, BIDI_ACTIVATION, (BIDI_CELL_CLIP, BIDI_PROJ_CLIP),
                            bools=(BIDI_MERGE_OUTPUTS, BIDI_TIME_MAJOR))
        ctx.check_input_rank(INPUT, 3)
        _check_ranks(ctx, _FW_LAYOUT)
        _check_ranks(ctx, _BW_LAYOUT)
        for index in (*BIDI_FW_STATE, *BIDI_BW_STATE):
            ctx.check_input_rank(index, 2)

    def _setup(self, ctx: ExecutionContext, read_states: bool = True):
        ctx.require(not ctx.is_omitted(INPUT), "input must be present")
        x = ctx.input(INPUT)
        ctx.require(x.rank == 3, f"input must be 3-D, got rank {x.rank}")
        merge = bool(ctx.scalar(BIDI_MERGE_OUTPUTS))
        time_major = bool(ctx.scalar(BIDI_TIME_MAJOR))
        expected = (1, 5) if merge else (2, 6)
        ctx.require(len(ctx.outputs) in expected,
                    f"{len(ctx.outputs)} outputs do not fit merge_outputs={merge} (expected {expected})")
        batch = x.shape[1] if time_major else x.shape[0]
        activation = int(ctx.scalar(BIDI_ACTIVATION))
        clips = _clips(ctx, BIDI_CELL_CLIP, BIDI_PROJ_CLIP)
        fw = read_direction(ctx, _FW_LAYOUT, activation, *clips)
        bw = read_direction(ctx, _BW_LAYOUT, activation, *clips)
        has_aux_input = not ctx.is_omitted(BIDI_AUX_INPUT)
        ctx.require(fw.has_aux_weights == bw.has_aux_weights,
                    "forward and backward auxiliary weights must be both present or both omitted")
        ctx.require(has_aux_input or not fw.has_aux_weights, "auxiliary weights need an auxiliary input")
        aux_size = None
        if has_aux_input:
            aux = ctx.input(BIDI_AUX_INPUT)
            ctx.require(aux.rank == 3 and aux.shape[:2] == x.shape[:2],
                        f"auxiliary input shape {list(aux.shape)} does not match input {list(x.shape)}")
            aux_size = aux.shape[2]
        parallel = has_aux_input and not fw.has_aux_weights
        check_direction(ctx, fw, x.shape[2], aux_size if fw.has_aux_weights else None, "forward")
        bw_input_size = aux_size if parallel else x.shape[2]
        check_direction(ctx, bw, bw_input_size, aux_size if bw.has_aux_weights else None, "backward")
        shapes = [(batch, fw.output_size), (batch, fw.num_units), (batch, bw.output_size), (batch, bw.num_units)]
        states = [_state(ctx, index, shape, what, read_states) for index, shape, what in zip(
            (*BIDI_FW_STATE, *BIDI_BW_STATE), shapes,
            ("forward activation state", "forward cell state", "backward activation state", "backward cell state"),
            strict=True)]
        return fw, bw, merge, time_major, parallel, has_aux_input, states if read_states else shapes

    def prepare(self, ctx: ExecutionContext) -> list[Shape]:
        # the states' shapes only: states fed at run time keep the output shapes static
        fw, bw, merge, _, _, _, state_shapes = self._setup(ctx, read_states=False)
        lead = ctx.input(INPUT).shape[:2]
        shapes: list[Shape] = []
        if merge:
            shapes.append((*lead, fw.output_size + bw.output_size))
        else:
            shapes += [(*lead, fw.output_size), (*lead, bw.output_size)]
        if len(ctx.outputs) > 2:
            shapes += state_shapes
        return shapes

    plan_sees_omitted = True

    def plan(self, ctx: ExecutionContext):
        """Float32 with constant weights, no auxiliary input, each direction a plain, CIFG
        or projection one: the two time loops of ``PreparedLstm`` (the backward one over
        the sequence in reverse), their stacked weights built once. Other constant
        weights: ``execute``'s loops with both directions' ``lstm_stacks`` built once."""
        x = ctx.input(INPUT)
        fw, bw, merge, time_major, parallel, has_aux_input, _ = self._setup(ctx, read_states=False)
        count = len(ctx.outputs)
        if (x.type != T.TENSOR_FLOAT32 or ctx.output_dtype(0) != np.float32 or has_aux_input
                or not (PreparedLstm.supports(fw) and PreparedLstm.supports(bw))):
            stacks, dtype = (lstm_stacks(fw), lstm_stacks(bw)), ctx.output_dtype(0)

            def unrolled(values: list) -> list[np.ndarray]:
                states = [np.asarray(values[index], dtype=np.float32) for index in (*BIDI_FW_STATE, *BIDI_BW_STATE)]
                return _bidirectional(fw, bw, values[INPUT], values[BIDI_AUX_INPUT] if has_aux_input else None,
                                      states, merge, time_major, parallel, dtype, count, check_deadline, stacks)

            return unrolled
        forward, backward = PreparedLstm(fw), PreparedLstm(bw)

        def kernel(values: list) -> list[np.ndarray]:
            sequence = to_time_major(np.asarray(values[INPUT], dtype=np.float32), time_major)
            fw_out, fw_h, fw_c = forward(sequence, values[BIDI_FW_STATE[0]], values[BIDI_FW_STATE[1]])
            bw_out, bw_h, bw_c = backward(sequence, values[BIDI_BW_STATE[0]], values[BIDI_BW_STATE[1]], reverse=True)
            if merge:
                results = [from_time_major(np.concatenate([fw_out, bw_out], axis=-1), time_major)]
            else:
                results = [from_time_major(fw_out, time_major), from_time_major(bw_out, time_major)]
            return results + [fw_h, fw_c, bw_h, bw_c] if count > 2 else results

        return kernel

    def execute(self, ctx: ExecutionContext) -> list[np.ndarray]:
        fw, bw, merge, time_major, parallel, has_aux_input, states = self._setup(ctx)
        return _bidirectional(fw, bw, ctx.value(INPUT), ctx.value(BIDI_AUX_INPUT) if has_aux_input else None,
                              states, merge, time_major, parallel, ctx.output_dtype(0), len(ctx.outputs),
                              ctx.check_deadline)


def _bidirectional(fw, bw, x, aux, states: list[np.ndarray], merge: bool, time_major: bool, parallel: bool, dtype,
                   count: int, check, stacks=(None, None)) -> list[np.ndarray]:
    """BIDIRECTIONAL_SEQUENCE_LSTM's ``count`` outputs through ``run_lstm`` forward and in
    reverse (``aux``: the auxiliary input's value, None when omitted)."""
    x = to_time_major(np.asarray(x, dtype=np.float32), time_major)
    if aux is not None:
        aux = to_time_major(np.asarray(aux, dtype=np.float32), time_major)
    fw_out, fw_h, fw_c, _ = run_lstm(fw, x, states[0], states[1], aux=None if parallel else aux, check=check,
                                     stacks=stacks[0])
    bw_input = aux if parallel else x
    bw_out, bw_h, bw_c, _ = run_lstm(bw, bw_input, states[2], states[3], aux=None if parallel else aux,
                                     reverse=True, check=check, stacks=stacks[1])
    results = []
    if merge:
        results.append(from_time_major(np.concatenate([fw_out, bw_out], axis=-1), time_major).astype(dtype))
    else:
        results += [from_time_major(fw_out, time_major).astype(dtype),
                    from_time_major(bw_out, time_major).astype(dtype)]
    if count > 2:
        results += [s.astype(dtype) for s in (fw_h, fw_c, bw_h, bw_c)]
    return results
