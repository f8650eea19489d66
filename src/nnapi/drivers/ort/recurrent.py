"""Lowerings of the recurrent operations (LSTM and RNN families, float) to ONNX's own
LSTM and RNN operators, which ORT runs as one fused kernel over the whole sequence.

The NNAPI cells and ONNX's compute the same thing where their variants meet:

- LSTM: gates i, f, c, o from the input and recurrent products plus the bias; CIFG's
  input gate i = 1 - f is sigmoid(-z_f), an input gate with the forget gate's weights,
  bias and peephole negated (ONNX's ``input_forget`` couples the gates the other way
  round: f = 1 - i); peephole weights are ONNX's ``P``; NNAPI's
  activation is ONNX's g and h functions (the gates' f is the sigmoid in both). ONNX
  stacks the gates in the order i, o, f, c, with the input and recurrent biases apart.
  What ONNX has no form for is declined: projection, layer normalization, RELU1 / RELU6
  and an auxiliary input. Cell clipping (which ONNX's ``clip``, bounding the gates'
  pre-activations, is not) runs ONNX's LSTM where its outputs prove the clip never acted,
  else the time steps unrolled with the clip (_clipped_lstm; forward direction, no
  peephole, tanh).
- RNN: h = act(x W' + h R' + b), ONNX's RNN with the bias as Wb and a zero Rb.

Weights may be constants or computed at run time (the CTS feeds them as inputs): the
stacked ONNX weights are Concat nodes, which ORT folds when their parts are constants.
The single-step LSTM, whose scratch output holds the gate values, is not lowered here.
The device module imports this one, which registers these lowerings with ``lowering``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper

from nnapi.codes import OperationCode
from nnapi.drivers.ort.lowering import FLOATS, Declined, GraphBuilder, L, _same_kind, lowers
from nnapi.hal import Operation
from nnapi.operations import lstm as lstm_op
from nnapi.operations import rnn as rnn_op
from nnapi.operations._lstm_cell import ACT_NONE, ACT_RELU, ACT_SIGMOID, ACT_TANH, NORM_NAMES, WEIGHT_NAMES

#: NNAPI activation code -> ONNX activation function (name, attributes' alpha, beta)
_ACTIVATIONS = {ACT_TANH: ("Tanh", None, None), ACT_RELU: ("Relu", None, None),
                ACT_SIGMOID: ("Sigmoid", None, None), ACT_NONE: ("Affine", 1.0, 0.0)}
#: ONNX's gate order in W, R and B
_ONNX_GATES = ("input", "output", "forget", "cell")
#: ONNX's peephole order in P
_ONNX_PEEPHOLES = ("input", "output", "forget")


def _activation(g: GraphBuilder, index: int) -> tuple[str, float | None, float | None]:
    code = int(g.scalar(index))
    if code not in _ACTIVATIONS:
        raise Declined(f"activation {code} has no ONNX recurrent form (RELU1 / RELU6)")
    return _ACTIVATIONS[code]


def _activation_attributes(functions: list[tuple[str, float | None, float | None]]) -> dict:
    """ONNX's activations / activation_alpha / activation_beta attributes for functions."""
    attributes: dict = {"activations": [name for name, _, _ in functions]}
    if any(alpha is not None for _, alpha, _ in functions):
        # alpha / beta are listed for the functions that take them, in order
        attributes["activation_alpha"] = [alpha for _, alpha, _ in functions if alpha is not None]
        attributes["activation_beta"] = [beta for _, _, beta in functions if beta is not None]
    return attributes


def _omitted(g: GraphBuilder, index: int) -> bool:
    return g.operand(index).lifetime == L.NO_VALUE


def _float(g: GraphBuilder, index: int, what: str, dims: list[int]) -> str:
    """A float tensor input of the shape the cell needs."""
    value = g.value(index)
    if value.kind != "float":
        raise Declined(f"{what} is not a float tensor")
    if value.dims != dims:
        raise Declined(f"{what} has shape {value.dims}, expected {dims}")
    return value.name


def _stacked(g: GraphBuilder, directions: list[str]) -> str:
    """One value per direction stacked along a new leading direction axis."""
    axis = g.constant(np.array([0], np.int64))
    parts = [g.one("Unsqueeze", [name, axis]) for name in directions]
    return parts[0] if len(parts) == 1 else g.one("Concat", parts, axis=0)


def _no_direction_axis(g: GraphBuilder, name: str, axis: int) -> str:
    return g.one("Squeeze", [name, g.constant(np.array([axis], np.int64))])


def _time_major(g: GraphBuilder, name: str, time_major: bool) -> str:
    """[T, B, ...] from the operation's layout (its own inverse: swapping axes 0 and 1)."""
    return name if time_major else g.one("Transpose", [name], perm=[1, 0, 2])


def _sequence_dims(g: GraphBuilder, index: int, time_major: bool) -> tuple[int, int]:
    """The input's batch and feature sizes, which must be known to check the weights."""
    x = g.value(index)
    if x.kind != "float" or x.rank != 3:
        raise Declined("the input must be a 3-D float tensor")
    batch, size = (x.dims[1] if time_major else x.dims[0]), x.dims[2]
    if not batch or not size:
        raise Declined("the input's batch and feature sizes must be known")
    return batch, size


def _layout(inputs: list[int], weights: int, norms: int) -> dict[str, int]:
    """One direction's weight name -> operand, its 17 weights from input ``weights`` on and
    its 4 layer normalization weights from ``norms`` on."""
    layout = {name: inputs[weights + i] for i, name in enumerate(WEIGHT_NAMES)}
    layout.update({name: inputs[norms + i] for i, name in enumerate(NORM_NAMES)})
    return layout


@dataclass
class _LstmWeights:
    """One direction's ONNX LSTM inputs: W [4H, in], R [4H, H], B [8H], P [3H] or None
    (each without the direction axis) and its number of units."""

    w: str
    r: str
    b: str
    p: str | None
    units: int


def _lstm_weights(g: GraphBuilder, layout: dict[str, int], input_size: int, label: str) -> _LstmWeights:
    present = {name: not _omitted(g, index) for name, index in layout.items()}
    for name in ("projection", "projection_bias", "input_norm", "forget_norm", "cell_norm", "output_norm"):
        if present.get(name):
            raise Declined(f"{label}LSTM with {name.replace('_', ' ')} weights has no ONNX LSTM form")
    if not present["input_to_output"]:
        raise Declined(f"{label}input_to_output weights must be present")
    units = g.value(layout["input_to_output"]).dims[0]
    if not units:
        raise Declined(f"{label}the number of units must be known")
    cifg = not present["input_to_input"]
    peephole = present["cell_to_forget"]

    def part(gate: str, template: str, dims: list[int]) -> str:
        """The weights ``template`` names for ``gate``; CIFG's input gate: the forget gate's negated."""
        if gate == "input" and cifg:
            return g.one("Neg", [part("forget", template, dims)])
        name = template.format(gate)
        if not present[name]:
            raise Declined(f"{label}{name} weights must be present")
        return _float(g, layout[name], f"{label}{name} weights", dims)

    w = g.one("Concat", [part(gate, "input_to_{}", [units, input_size]) for gate in _ONNX_GATES], axis=0)
    r = g.one("Concat", [part(gate, "recurrent_to_{}", [units, units]) for gate in _ONNX_GATES], axis=0)
    biases = [part(gate, "{}_bias", [units]) for gate in _ONNX_GATES]
    b = g.one("Concat", [*biases, g.constant(np.zeros(4 * units, np.float32))], axis=0)
    p = None
    if peephole:
        p = g.one("Concat", [part(gate, "cell_to_{}", [units]) for gate in _ONNX_PEEPHOLES], axis=0)
    return _LstmWeights(w, r, b, p, units)


def _check_clip(g: GraphBuilder, index: int) -> None:
    if float(g.scalar(index)) != 0.0:
        raise Declined("cell clipping bounds the cell state in NNAPI, ONNX's clip the gates' inputs")


#: a clipped cell's proof (_clipped_lstm) asks |h| <= o * tanh(clip) * (1 - this): room for
#: the float32 differences between ORT's LSTM and the recomputed output gate (~1e-6)
_PROOF_MARGIN = 1e-3
#: ... and an output gate at least this open, so that h still shows tanh(c)
_SMALLEST_OUTPUT_GATE = 1e-6


def _clipped_lstm(g: GraphBuilder, sequence: str, direction: _LstmWeights, h0: int, c0: int, batch: int,
                  steps: int, activation: int, clip: float) -> tuple[str, str, str]:
    """A forward LSTM whose cell state NNAPI clips to [-clip, clip] (every Keras LSTM the
    TFLite converter writes: clip 10), as ONNX's LSTM, which cannot clip the cell, where
    its own outputs prove the clip never acted, else the time steps unrolled with the clip.

    The proof: h_t = o_t * tanh(c_t) for every step, and the output gate o_t depends only
    on x_t and h_{t-1} (no peephole), so it is recomputed for all steps at once from the
    LSTM's outputs; |h_t| <= o_t * tanh(clip) * (1 - _PROOF_MARGIN) with o_t not closed
    shows |c_t| < clip at every step, where the clipped and unclipped cells agree. A NaN
    fails the proof. ONNX's If then takes the LSTM's outputs, or runs the unrolled steps
    (exact, ~2x slower: 138 against 61 us for 1x20x40 -> 128). Peephole weights (o_t would
    need c_t) and activations other than tanh are declined."""
    if direction.p is not None:
        raise Declined("cell clipping with peephole weights has no ONNX form here")
    if int(g.scalar(activation)) != ACT_TANH:
        raise Declined("cell clipping needs the tanh activation here (h = o * tanh(c) shows the cell)")
    if steps < 1:
        raise Declined("the number of time steps must be known")
    units = direction.units
    y, y_h, y_c = _lstm(g, sequence, [direction], [h0], [c0], batch, activation)
    outputs = _no_direction_axis(g, y, 1)  # [T, B, H]
    first = _float(g, h0, "output state in", [batch, units])
    axis0 = g.constant(np.array([0], np.int64))
    previous = g.one("Unsqueeze", [first, axis0])
    if steps > 1:
        earlier = g.one("Slice", [outputs, axis0, g.constant(np.array([steps - 1], np.int64)), axis0])
        previous = g.one("Concat", [previous, earlier], axis=0)

    def output_rows(stacked: str) -> str:  # the output gate's rows: ONNX's order is i, o, f, c
        return g.one("Slice", [stacked, g.constant(np.array([units], np.int64)),
                               g.constant(np.array([2 * units], np.int64)), axis0])

    gate = g.one("Sigmoid", [g.one("Add", [
        g.one("Add", [g.one("MatMul", [sequence, g.one("Transpose", [output_rows(direction.w)])]),
                      g.one("MatMul", [previous, g.one("Transpose", [output_rows(direction.r)])])]),
        output_rows(direction.b)])])
    bound = np.float32(np.tanh(np.float64(clip)) * (1 - _PROOF_MARGIN))
    slack = g.one("Min", [g.one("Sub", [g.one("Mul", [gate, g.constant(bound)]), g.one("Abs", [outputs])]),
                          g.one("Sub", [gate, g.constant(np.float32(_SMALLEST_OUTPUT_GATE))])])
    zero = g.constant(np.float32(0))
    proven = g.one("And", [g.one("GreaterOrEqual", [g.one("ReduceMin", [slack], keepdims=0), zero]),
                           g.one("Not", [g.one("IsNaN", [g.one("ReduceSum", [slack], keepdims=0)])])])
    then_branch = g.nested(g.subgraph, "proven")
    results = [then_branch.one("Identity", [name]) for name in (y, y_h, y_c)]
    else_branch = _unrolled_lstm(g, sequence, direction, first, _float(g, c0, "cell state in", [batch, units]),
                                 steps, clip)
    infos = [helper.make_tensor_value_info(name, TensorProto.FLOAT, None) for name in results]
    then_graph = helper.make_graph(then_branch.nodes, f"{then_branch.prefix}graph", [], infos)
    return tuple(g.node("If", [proven], 3, then_branch=then_graph, else_branch=else_branch))  # type: ignore[return-value]


def _unrolled_lstm(g: GraphBuilder, sequence: str, direction: _LstmWeights, h0: str, c0: str, steps: int,
                   clip: float) -> onnx.GraphProto:
    """The forward LSTM with the cell clipped, one time step after the other (the gates in
    ONNX's order from the stacked W, R, B; CIFG's input gate is already there as the
    negated forget gate): an If branch reading those from the enclosing graph, giving Y
    [T, 1, B, H], Y_h and Y_c as ONNX's LSTM does."""
    b = g.nested(g.subgraph, "unrolled")
    units = direction.units
    axis0 = b.constant(np.array([0], np.int64))
    bias = b.one("Slice", [direction.b, axis0, b.constant(np.array([4 * units], np.int64)), axis0])
    pre = b.one("Add", [b.one("MatMul", [sequence, b.one("Transpose", [direction.w])]), bias])  # [T, B, 4H]
    recurrent = b.one("Transpose", [direction.r])  # [H, 4H]
    parts = b.node("Split", [pre, b.constant(np.ones(steps, np.int64))], steps, axis=0) if steps > 1 else [pre]
    low, high = b.constant(np.float32(-clip)), b.constant(np.float32(clip))
    h, c, states = h0, c0, []
    for part in parts:
        z = b.one("Gemm", [h, recurrent, b.one("Squeeze", [part, axis0])])
        gates, candidate = b.node("Split", [z, b.constant(np.array([3 * units, units], np.int64))], 2, axis=1)
        i, o, f = b.node("Split", [b.one("Sigmoid", [gates]), b.constant(np.array([units] * 3, np.int64))], 3,
                         axis=1)
        c = b.one("Clip", [b.one("Add", [b.one("Mul", [f, c]), b.one("Mul", [i, b.one("Tanh", [candidate])])]),
                           low, high])
        h = b.one("Mul", [o, b.one("Tanh", [c])])
        states.append(b.one("Unsqueeze", [h, axis0]))
    sequence_out = states[0] if steps == 1 else b.one("Concat", states, axis=0)
    results = [b.one("Unsqueeze", [sequence_out, b.constant(np.array([1], np.int64))]),
               b.one("Unsqueeze", [h, axis0]), b.one("Unsqueeze", [c, axis0])]
    infos = [helper.make_tensor_value_info(name, TensorProto.FLOAT, None) for name in results]
    return helper.make_graph(b.nodes, f"{b.prefix}graph", [], infos, b.initializers)


def _initial_state(g: GraphBuilder, indexes: list[int], batch: int, units: int, what: str) -> str:
    return _stacked(g, [_float(g, index, what, [batch, units]) for index in indexes])


def _lstm(g: GraphBuilder, sequence: str, directions: list[_LstmWeights], h0: list[int], c0: list[int],
          batch: int, activation: int) -> tuple[str, str, str]:
    """ONNX LSTM over time-major ``sequence``: (Y [T, D, B, H], Y_h [D, B, H], Y_c)."""
    units = directions[0].units
    if any(d.units != units for d in directions):
        raise Declined("the two directions must have the same number of units")
    if len({d.p is None for d in directions}) != 1:
        raise Declined("the two directions must both have peephole weights or neither")
    function = _activation(g, activation)
    inputs = [sequence, _stacked(g, [d.w for d in directions]), _stacked(g, [d.r for d in directions]),
              _stacked(g, [d.b for d in directions]), "",
              _initial_state(g, h0, batch, units, "output state in"),
              _initial_state(g, c0, batch, units, "cell state in")]
    if directions[0].p is not None:
        inputs.append(_stacked(g, [d.p for d in directions]))  # type: ignore[misc]
    attributes = _activation_attributes([("Sigmoid", None, None), function, function] * len(directions))
    y, y_h, y_c = g.node("LSTM", inputs, 3, hidden_size=units,
                         direction="bidirectional" if len(directions) == 2 else "forward", **attributes)
    return y, y_h, y_c


@lowers(OperationCode.UNIDIRECTIONAL_SEQUENCE_LSTM)
def lower_unidirectional_lstm(g: GraphBuilder, operation: Operation) -> None:
    """One ONNX LSTM (forward); the final states, when asked for, are its Y_h and Y_c."""
    _same_kind(g, operation, FLOATS)
    inputs = operation.inputs
    if len(inputs) != lstm_op.SEQ_INPUT_COUNT:
        raise Declined(f"expected {lstm_op.SEQ_INPUT_COUNT} inputs")
    time_major = bool(g.scalar(inputs[lstm_op.SEQ_TIME_MAJOR]))
    batch, size = _sequence_dims(g, inputs[lstm_op.INPUT], time_major)
    clip = float(g.scalar(inputs[lstm_op.CELL_CLIP]))
    direction = _lstm_weights(g, _layout(inputs, lstm_op.WEIGHTS, lstm_op.SEQ_NORM_WEIGHTS), size, "")
    x = g.value(inputs[lstm_op.INPUT])
    sequence = _time_major(g, x.name, time_major)
    if clip > 0:
        y, y_h, y_c = _clipped_lstm(g, sequence, direction, inputs[lstm_op.OUTPUT_STATE_IN],
                                    inputs[lstm_op.CELL_STATE_IN], batch, x.dims[0 if time_major else 1],
                                    inputs[lstm_op.ACTIVATION], clip)
    else:
        y, y_h, y_c = _lstm(g, sequence, [direction], [inputs[lstm_op.OUTPUT_STATE_IN]],
                            [inputs[lstm_op.CELL_STATE_IN]], batch, inputs[lstm_op.ACTIVATION])
    outputs = operation.outputs
    g.set_output(outputs[0], _time_major(g, _no_direction_axis(g, y, 1), time_major))
    if len(outputs) == 3:
        g.set_output(outputs[1], _no_direction_axis(g, y_h, 0))
        g.set_output(outputs[2], _no_direction_axis(g, y_c, 0))


def _directions_out(g: GraphBuilder, y: str, merge: bool, time_major: bool) -> list[str]:
    """Y [T, 2, B, H] as NNAPI's outputs: the two directions' [T, B, H] (or batch-major),
    or with merge_outputs one [T, B, 2H] with the forward units first."""
    if merge:
        both = g.one("Transpose", [y], perm=[0, 2, 1, 3])  # [T, B, 2, H]
        merged = g.one("Reshape", [both, g.constant(np.array([0, 0, -1], np.int64))])
        return [_time_major(g, merged, time_major)]
    forward, backward = g.node("Split", [y, g.constant(np.array([1, 1], np.int64))], 2, axis=1)
    return [_time_major(g, _no_direction_axis(g, half, 1), time_major) for half in (forward, backward)]


def _states_out(g: GraphBuilder, states: list[str]) -> list[list[str]]:
    """Per direction, [2, B, H] final states split into [B, H] ones: forward first."""
    out = []
    for state in states:
        halves = g.node("Split", [state, g.constant(np.array([1, 1], np.int64))], 2, axis=0)
        out.append([_no_direction_axis(g, half, 0) for half in halves])
    return out


@lowers(OperationCode.BIDIRECTIONAL_SEQUENCE_LSTM)
def lower_bidirectional_lstm(g: GraphBuilder, operation: Operation) -> None:
    """One ONNX LSTM (bidirectional) over the one input; an auxiliary input is declined."""
    _same_kind(g, operation, FLOATS)
    inputs = operation.inputs
    if len(inputs) != lstm_op.BIDI_INPUT_COUNT:
        raise Declined(f"expected {lstm_op.BIDI_INPUT_COUNT} inputs")
    if not _omitted(g, inputs[lstm_op.BIDI_AUX_INPUT]):
        raise Declined("an auxiliary input has no ONNX LSTM form")
    time_major = bool(g.scalar(inputs[lstm_op.BIDI_TIME_MAJOR]))
    merge = bool(g.scalar(inputs[lstm_op.BIDI_MERGE_OUTPUTS]))
    if len(operation.outputs) not in ((1, 5) if merge else (2, 6)):
        raise Declined("the outputs do not match merge_outputs")
    batch, size = _sequence_dims(g, inputs[lstm_op.INPUT], time_major)
    directions = [_lstm_weights(g, _layout(inputs, weights, norm), size, label)
                  for label, weights, norm in (("forward ", lstm_op.WEIGHTS, lstm_op.BIDI_FW_NORM_WEIGHTS),
                                               ("backward ", lstm_op.BIDI_BW_WEIGHTS, lstm_op.BIDI_BW_NORM_WEIGHTS))]
    _check_clip(g, inputs[lstm_op.BIDI_CELL_CLIP])
    sequence = _time_major(g, g.value(inputs[lstm_op.INPUT]).name, time_major)
    fw_state, bw_state = lstm_op.BIDI_FW_STATE, lstm_op.BIDI_BW_STATE
    y, y_h, y_c = _lstm(g, sequence, directions, [inputs[fw_state[0]], inputs[bw_state[0]]],
                        [inputs[fw_state[1]], inputs[bw_state[1]]], batch, inputs[lstm_op.BIDI_ACTIVATION])
    results = _directions_out(g, y, merge, time_major)
    if len(operation.outputs) > 2:
        (fw_h, bw_h), (fw_c, bw_c) = _states_out(g, [y_h, y_c])
        results += [fw_h, fw_c, bw_h, bw_c]
    for index, name in zip(operation.outputs, results, strict=True):
        g.set_output(index, name)


def _rnn_weights(g: GraphBuilder, cell: tuple[int, int, int, int], input_size: int, batch: int,
                 label: str) -> tuple[str, str, str, str, int]:
    """One RNN direction's W [H, in], R [H, H], B [2H], initial state [B, H] and H."""
    weights, recurrent, bias, state = cell
    units = g.value(weights).dims[0]
    if not units:
        raise Declined(f"{label}the number of units must be known")
    b = g.one("Concat", [_float(g, bias, f"{label}bias", [units]), g.constant(np.zeros(units, np.float32))],
              axis=0)
    return (_float(g, weights, f"{label}weights", [units, input_size]),
            _float(g, recurrent, f"{label}recurrent weights", [units, units]), b,
            _float(g, state, f"{label}hidden state", [batch, units]), units)


def _rnn(g: GraphBuilder, sequence: str, cells: list[tuple[str, str, str, str, int]], activation: int
         ) -> tuple[str, str]:
    """ONNX RNN over time-major ``sequence``: (Y [T, D, B, H], Y_h [D, B, H])."""
    if len({cell[4] for cell in cells}) != 1:
        raise Declined("the two directions must have the same number of units")
    inputs = [sequence, *(_stacked(g, [cell[i] for cell in cells]) for i in range(3)), "",
              _stacked(g, [cell[3] for cell in cells])]
    y, y_h = g.node("RNN", inputs, 2, hidden_size=cells[0][4],
                    direction="bidirectional" if len(cells) == 2 else "forward",
                    **_activation_attributes([_activation(g, activation)] * len(cells)))
    return y, y_h


@lowers(OperationCode.RNN)
def lower_rnn(g: GraphBuilder, operation: Operation) -> None:
    """One step of ONNX RNN; the new state is both outputs."""
    _same_kind(g, operation, FLOATS)
    x = g.value(operation.inputs[rnn_op.INPUT])
    if x.kind != "float" or x.rank != 2 or not x.dims[0] or not x.dims[1]:
        raise Declined("the input must be a 2-D float tensor of known shape")
    cell = _rnn_weights(g, tuple(operation.inputs[i] for i in rnn_op.CELL), x.dims[1], x.dims[0], "")
    _, y_h = _rnn(g, _stacked(g, [x.name]), [cell], operation.inputs[rnn_op.ACTIVATION])
    state = _no_direction_axis(g, y_h, 0)
    g.set_output(operation.outputs[0], state)
    g.set_output(operation.outputs[1], g.one("Identity", [state]))


@lowers(OperationCode.UNIDIRECTIONAL_SEQUENCE_RNN)
def lower_unidirectional_rnn(g: GraphBuilder, operation: Operation) -> None:
    _same_kind(g, operation, FLOATS)
    inputs = operation.inputs
    time_major = bool(g.scalar(inputs[rnn_op.SEQ_TIME_MAJOR]))
    batch, size = _sequence_dims(g, inputs[rnn_op.INPUT], time_major)
    cell = _rnn_weights(g, tuple(inputs[i] for i in rnn_op.CELL), size, batch, "")
    sequence = _time_major(g, g.value(inputs[rnn_op.INPUT]).name, time_major)
    y, y_h = _rnn(g, sequence, [cell], inputs[rnn_op.ACTIVATION])
    g.set_output(operation.outputs[0], _time_major(g, _no_direction_axis(g, y, 1), time_major))
    if len(operation.outputs) == 2:
        g.set_output(operation.outputs[1], _no_direction_axis(g, y_h, 0))


@lowers(OperationCode.BIDIRECTIONAL_SEQUENCE_RNN)
def lower_bidirectional_rnn(g: GraphBuilder, operation: Operation) -> None:
    """One ONNX RNN (bidirectional) over the one input; an auxiliary input is declined."""
    _same_kind(g, operation, FLOATS)
    inputs = operation.inputs
    if not _omitted(g, inputs[rnn_op.BIDI_AUX_INPUT]):
        raise Declined("an auxiliary input has no ONNX RNN form")
    time_major = bool(g.scalar(inputs[rnn_op.BIDI_TIME_MAJOR]))
    merge = bool(g.scalar(inputs[rnn_op.BIDI_MERGE_OUTPUTS]))
    if len(operation.outputs) not in ((1, 3) if merge else (2, 4)):
        raise Declined("the outputs do not match merge_outputs")
    batch, size = _sequence_dims(g, inputs[rnn_op.INPUT], time_major)
    cells = [_rnn_weights(g, tuple(inputs[i] for i in rnn_op.CELL), size, batch, "forward "),
             _rnn_weights(g, tuple(inputs[i] for i in rnn_op.BIDI_BW_CELL), size, batch, "backward ")]
    sequence = _time_major(g, g.value(inputs[rnn_op.INPUT]).name, time_major)
    y, y_h = _rnn(g, sequence, cells, inputs[rnn_op.BIDI_ACTIVATION])
    results = _directions_out(g, y, merge, time_major)
    if len(operation.outputs) > 2:
        results += _states_out(g, [y_h])[0]
    for index, name in zip(operation.outputs, results, strict=True):
        g.set_output(index, name)
