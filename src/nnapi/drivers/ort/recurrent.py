"""Lowerings of the recurrent operations (LSTM and RNN families, SVDF; float) to ONNX's
own LSTM and RNN operators, which ORT runs as one fused kernel over the whole sequence,
and to explicit time steps for what those operators have no form for.

The NNAPI cells and ONNX's compute the same thing where their variants meet:

- LSTM: gates i, f, c, o from the input and recurrent products plus the bias; CIFG's
  input gate i = 1 - f is sigmoid(-z_f), an input gate with the forget gate's weights,
  bias and peephole negated (ONNX's ``input_forget`` couples the gates the other way
  round: f = 1 - i); peephole weights are ONNX's ``P``; NNAPI's
  activation is ONNX's g and h functions (the gates' f is the sigmoid in both). ONNX
  stacks the gates in the order i, o, f, c, with the input and recurrent biases apart.
  Cell clipping (which ONNX's ``clip``, bounding the gates' pre-activations, is not)
  runs ONNX's LSTM where its outputs prove the clip never acted, else the time steps
  unrolled with the clip (_clipped_lstm; forward direction, no peephole, tanh).
- Everything else of the LSTM family runs as explicit steps (_step, unrolled over the
  static time steps by _unroll; the clip's unrolled branch is the same steps): projection
  with its bias and clip, layer normalization (as the reference computes it), RELU1 /
  RELU6, a cell clip with peephole weights or another activation, an auxiliary input
  (its products added: cross-linking; or read by the backward direction instead of the
  input: parallel linking), and the single-step LSTM, whose scratch output holds the
  gate values.
- RNN: h = act(x W' + h R' + b), ONNX's RNN with the bias as Wb and a zero Rb; a
  bidirectional RNN's auxiliary input as [x, aux] against [W, A] (cross-linking) or a
  reverse RNN over it (parallel linking).
- SVDF: the state's memory as a [B, F, M] tensor, MatMul / ReduceSum per filter and unit.

Weights may be constants or computed at run time (the CTS feeds them as inputs): the
stacked weights are Concat nodes, which ORT folds when their parts are constants. An
optional weight given as a model input may be omitted by a request (omitted.py: a graph
per pattern); a support query that cannot know whether it will be (``presence`` None)
checks what every pattern needs, every valid pattern having a form here.
The device module imports this one, which registers these lowerings with ``lowering``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import TensorProto, helper

from nnapi.codes import OperationCode
from nnapi.drivers.ort.builder import FLOATS, Declined, GraphBuilder, L, check_types, lowers
from nnapi.drivers.ort.omitted import optional_inputs, presence
from nnapi.hal import Operation
from nnapi.operations import lstm as lstm_op
from nnapi.operations import rnn as rnn_op
from nnapi.operations import svdf as svdf_op
from nnapi.operations.lstm_cell import (
    ACT_NONE,
    ACT_RELU,
    ACT_RELU1,
    ACT_RELU6,
    ACT_SIGMOID,
    ACT_TANH,
    AUX_NAMES,
    NORM_NAMES,
    WEIGHT_NAMES,
)

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


def activation_attributes(functions: list[tuple[str, float | None, float | None]]) -> dict:
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


def _stacked(g: GraphBuilder, names: list[str]) -> str:
    """The values ``names`` stacked along a new leading axis: one per direction (ONNX's
    direction axis), or a sequence's steps ([T, B, out] from each step's [B, out])."""
    axis = g.constant(np.array([0], np.int64))
    parts = [g.one("Unsqueeze", [name, axis]) for name in names]
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


def _layout(inputs: list[int], weights: int, norms: int, aux: int | None = None) -> dict[str, int]:
    """One direction's weight name -> operand, its 17 weights from input ``weights`` on,
    its 4 layer normalization weights from ``norms`` on and its 4 auxiliary weights from
    ``aux`` on (a bidirectional LSTM's)."""
    layout = {name: inputs[weights + i] for i, name in enumerate(WEIGHT_NAMES)}
    layout.update({name: inputs[norms + i] for i, name in enumerate(NORM_NAMES)})
    if aux is not None:
        layout.update({name: inputs[aux + i] for i, name in enumerate(AUX_NAMES)})
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
    """One direction's weights as ONNX's LSTM takes them, for a layout _onnx_form accepted
    (no projection, layer normalization or auxiliary weights: its callers ask it first)."""
    present = {name: not _omitted(g, index) for name, index in layout.items()}
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
    """The forward LSTM with the cell clipped, one time step after the other (_step; the
    gates in ONNX's order from the stacked W, R, B; CIFG's input gate is already there as
    the negated forget gate): an If branch reading those from the enclosing graph, giving
    Y [T, 1, B, H], Y_h and Y_c as ONNX's LSTM does."""
    b = g.nested(g.subgraph, "unrolled")
    units = direction.units
    axis0 = b.constant(np.array([0], np.int64))
    bias = b.one("Slice", [direction.b, axis0, b.constant(np.array([4 * units], np.int64)), axis0])
    parts = _step_inputs(b, [(sequence, b.one("Transpose", [direction.w]))], bias, steps)
    cell = _Cell(units, _ONNX_GATES[:3], b.one("Transpose", [direction.r]), ACT_TANH, cell_clip=clip)
    outputs, h, c, _ = _unroll(b, cell, parts, h0, c0)
    results = [b.one("Unsqueeze", [_stacked(b, outputs), b.constant(np.array([1], np.int64))]),
               b.one("Unsqueeze", [h, axis0]), b.one("Unsqueeze", [c, axis0])]
    infos = [helper.make_tensor_value_info(name, TensorProto.FLOAT, None) for name in results]
    return helper.make_graph(b.nodes, f"{b.prefix}graph", [], infos, b.initializers)


# --- the explicit steps -------------------------------------------------------------------
#: Android's scratch buffer order of the gate values (LSTM's first output)
_SCRATCH_GATES = ("input", "cell", "forget", "output")
#: layer normalization divides by sqrt(variance + this) (lstm_cell._LAYER_NORM_EPSILON)
_LAYER_NORM_EPSILON = np.float32(1e-8)


@dataclass
class _Cell:
    """One LSTM direction as explicit steps (_step): names of graph values. The recurrent
    products z [B, G * units] hold the sigmoid gates in ``gates`` order, then the cell's
    candidate; without an "input" gate (CIFG) i = 1 - f."""

    units: int
    gates: tuple[str, ...]
    recurrent: str  # [out, G * units], transposed
    activation: int
    peephole: dict[str, str] = field(default_factory=dict)  # gate -> [units]
    norms: dict[str, tuple[str, str]] = field(default_factory=dict)  # gate or "cell" -> (weights, bias)
    projection: str | None = None  # [units, out], transposed
    projection_bias: str | None = None
    cell_clip: float = 0.0
    proj_clip: float = 0.0


def _step_inputs(b: GraphBuilder, products: list[tuple[str, str]], bias: str | None, steps: int) -> list[str]:
    """Every step's input products [B, G * units] in time order: the sum over ``products``
    of sequence [T, B, in] x weights [in, G * units] (the input, and the auxiliary input),
    the bias added when given, computed for all steps at once and split."""
    pre = None
    for sequence, weights in products:
        product = b.one("MatMul", [sequence, weights])
        pre = product if pre is None else b.one("Add", [pre, product])
    if bias is not None:
        pre = b.one("Add", [pre, bias])
    axis0 = b.constant(np.array([0], np.int64))
    parts = b.node("Split", [pre, b.constant(np.ones(steps, np.int64))], steps, axis=0) if steps > 1 else [pre]
    return [b.one("Squeeze", [part, axis0]) for part in parts]


def _layer_norm(b: GraphBuilder, x: str, weights: str, bias: str) -> str:
    """(x - mean) / sqrt(variance + epsilon) * weights + bias over the last axis, as the
    reference computes it (the centered values' mean square)."""
    mean = b.one("ReduceMean", [x], axes=[-1], keepdims=1)
    centered = b.one("Sub", [x, mean])
    variance = b.one("ReduceMean", [b.one("Mul", [centered, centered])], axes=[-1], keepdims=1)
    deviation = b.one("Sqrt", [b.one("Add", [variance, b.constant(_LAYER_NORM_EPSILON)])])
    return b.one("Add", [b.one("Mul", [b.one("Div", [centered, deviation]), weights]), bias])


def _step(b: GraphBuilder, cell: _Cell, pre: str, h: str, c: str) -> tuple[str, str, dict[str, str]]:
    """One time step (lstm_cell.run_lstm's): (h, c, the gate values by name)."""
    units = cell.units
    z = b.one("Gemm", [h, cell.recurrent, pre])
    count = len(cell.gates)
    gates, candidate = b.node("Split", [z, b.constant(np.array([count * units, units], np.int64))], 2, axis=1)
    values: dict[str, str] = {}
    if not cell.peephole and not cell.norms:  # every sigmoid in one node
        activated = b.one("Sigmoid", [gates])
        parts = b.node("Split", [activated, b.constant(np.array([units] * count, np.int64))], count, axis=1) \
            if count > 1 else [activated]
        values.update(zip(cell.gates, parts, strict=True))
    else:
        raw = dict(zip(cell.gates, b.node("Split", [gates, b.constant(np.array([units] * count, np.int64))], count,
                                          axis=1) if count > 1 else [gates], strict=True))

        def gate(name: str, state: str) -> str:
            x = raw[name]
            if name in cell.peephole:
                x = b.one("Add", [x, b.one("Mul", [cell.peephole[name], state])])
            if name in cell.norms:
                x = _layer_norm(b, x, *cell.norms[name])
            return b.one("Sigmoid", [x])

        for name in cell.gates:
            if name != "output":
                values[name] = gate(name, c)
        if "cell" in cell.norms:
            candidate = _layer_norm(b, candidate, *cell.norms["cell"])
    if "input" not in values:  # CIFG
        values["input"] = b.one("Sub", [b.constant(np.float32(1)), values["forget"]])
    values["cell"] = _activate(b, candidate, cell.activation)
    c = b.one("Add", [b.one("Mul", [values["forget"], c]), b.one("Mul", [values["input"], values["cell"]])])
    if cell.cell_clip > 0:
        c = b.one("Clip", [c, b.constant(np.float32(-cell.cell_clip)), b.constant(np.float32(cell.cell_clip))])
    if "output" not in values:
        values["output"] = gate("output", c)
    h = b.one("Mul", [values["output"], _activate(b, c, cell.activation)])
    if cell.projection is not None:
        h = b.one("MatMul", [h, cell.projection])
        if cell.projection_bias is not None:
            h = b.one("Add", [h, cell.projection_bias])
        if cell.proj_clip > 0:
            h = b.one("Clip", [h, b.constant(np.float32(-cell.proj_clip)), b.constant(np.float32(cell.proj_clip))])
    return h, c, values


def _unroll(b: GraphBuilder, cell: _Cell, parts: list[str], h: str, c: str, reverse: bool = False
            ) -> tuple[list[str], str, str, dict[str, str]]:
    """The steps over ``parts`` (the input products in time order; ``reverse``: from the
    last to the first): (the outputs in time order, the last h and c, its gate values)."""
    outputs: list[str] = [""] * len(parts)
    values: dict[str, str] = {}
    for t in (range(len(parts) - 1, -1, -1) if reverse else range(len(parts))):
        h, c, values = _step(b, cell, parts[t], h, c)
        outputs[t] = h
    return outputs, h, c, values


@dataclass
class _Explicit:
    """One direction's explicit form: its cell, the input weights [in, G * units] (and the
    auxiliary input's, or None), the bias of the input products (None with layer
    normalization, which adds it after normalizing), and its sizes."""

    cell: _Cell
    weights: str
    aux_weights: str | None
    bias: str | None
    units: int
    output_size: int


def _present(g: GraphBuilder, index: int) -> bool | None:
    """presence, with an index below 0 for an operand the operation has no input for (the
    23-input LSTM's layer normalization weights)."""
    return False if index < 0 else presence(g, index)


def _presences(g: GraphBuilder, layout: dict[str, int]) -> dict[str, bool | None]:
    return {name: _present(g, index) for name, index in layout.items()}


def _required(g: GraphBuilder, layout: dict[str, int], input_size: int | None, label: str) -> tuple[int, int]:
    """Check the weights every LSTM direction has: (units, output size)."""
    for name in ("input_to_output", "recurrent_to_output"):
        if _present(g, layout[name]) is False:
            raise Declined(f"{label}{name} weights must be present")
    units, size = (g.value(layout["input_to_output"]).dims + [0, 0])[:2]
    out = (g.value(layout["recurrent_to_output"]).dims + [0, 0])[1]
    if not units or not out or not size:
        raise Declined(f"{label}the number of units and the output size must be known")
    if input_size is not None and size != input_size:
        raise Declined(f"{label}input_to_output has {size} columns, the input {input_size} features")
    for gate in ("forget", "cell", "output"):
        if any(_present(g, layout[f"{kind}{gate}{suffix}"]) is False
               for kind, suffix in (("input_to_", ""), ("recurrent_to_", ""), ("", "_bias"))):
            raise Declined(f"{label}the {gate} gate's weights and bias must be present")
        _float(g, layout[f"input_to_{gate}"], f"{label}input_to_{gate} weights", [units, size])
        _float(g, layout[f"recurrent_to_{gate}"], f"{label}recurrent_to_{gate} weights", [units, out])
        _float(g, layout[f"{gate}_bias"], f"{label}{gate}_bias", [units])
    return units, out


def _explicit(g: GraphBuilder, layout: dict[str, int], input_size: int, aux_size: int | None, label: str,
              activation: int, cell_clip: float, proj_clip: float) -> _Explicit:
    """One direction in the explicit form, every NNAPI variant: the presence rules of
    lstm_cell.check_direction (an operand a support query cannot know is declined here:
    the caller asks _uncertain first)."""
    present = _presences(g, layout)
    if any(present[name] is None for name in _MAY_OMIT if name in present):
        raise Declined(f"{label}the omitted weights must be known")
    units, out = _required(g, layout, input_size, label)
    cifg = not present["input_to_input"]
    peephole = present["cell_to_forget"]
    norm = present["forget_norm"]
    aux = present.get("aux_to_forget", False)
    rules = [
        (present["recurrent_to_input"] == (not cifg) and present["input_bias"] == (not cifg),
         "input_to_input, recurrent_to_input and input_bias must be all present or all omitted"),
        (present["cell_to_output"] == peephole and (present["cell_to_input"] == (peephole and not cifg)),
         "peephole weights must be all present or all omitted (cell_to_input omitted with CIFG)"),
        (all(present[f"{gate}_norm"] == norm for gate in ("cell", "output"))
         and present["input_norm"] == (norm and not cifg),
         "layer normalization weights must be all present or all omitted (input's omitted with CIFG)"),
        (present["projection"] or not present["projection_bias"], "projection bias needs projection weights"),
        (present["projection"] or out == units, "without projection the output size must equal the number of units"),
        (aux_size is not None or not aux, "auxiliary weights need an auxiliary input"),
        (not aux or (all(present[f"aux_to_{gate}"] for gate in ("cell", "output"))
                     and present["aux_to_input"] == (not cifg)),
         "auxiliary weights must be all present or all omitted (aux_to_input omitted with CIFG)"),
        (cell_clip >= 0 and proj_clip >= 0, "clipping thresholds must not be negative"),
    ]
    for holds, rule in rules:
        if not holds:
            raise Declined(f"{label}{rule}")
    sigmoid_gates = ("forget", "output") if cifg else ("input", "forget", "output")
    order = (*sigmoid_gates, "cell")

    def stacked(template: str, dims: list[int]) -> str:
        parts = [_float(g, layout[template.format(gate)], f"{label}{template.format(gate)} weights", dims)
                 for gate in order]
        return g.one("Transpose", [g.one("Concat", parts, axis=0)])

    def vector(name: str, size: int) -> str:
        return _float(g, layout[name], f"{label}{name} weights", [size])

    biases = {gate: vector(f"{gate}_bias", units) for gate in order}
    cell = _Cell(units, sigmoid_gates, stacked("recurrent_to_{}", [units, out]), activation,
                 cell_clip=cell_clip, proj_clip=proj_clip)
    if peephole:
        cell.peephole = {gate: vector(f"cell_to_{gate}", units) for gate in sigmoid_gates}
    if norm:
        cell.norms = {gate: (vector(f"{gate}_norm", units), biases[gate]) for gate in order}
    if present["projection"]:
        cell.projection = g.one("Transpose", [_float(g, layout["projection"], f"{label}projection weights",
                                                     [out, units])])
        if present["projection_bias"]:
            cell.projection_bias = vector("projection_bias", out)
    aux_weights = stacked("aux_to_{}", [units, aux_size]) if aux else None  # type: ignore[list-item]
    bias = None if norm else g.one("Concat", [biases[gate] for gate in order], axis=0)
    return _Explicit(cell, stacked("input_to_{}", [units, input_size]), aux_weights, bias, units, out)


#: the optional weights of an LSTM direction
_OPTIONAL_WEIGHTS = ("input_to_input", "recurrent_to_input", "cell_to_input", "cell_to_forget", "cell_to_output",
                     "input_bias", "projection", "projection_bias")
#: ... with the layer normalization and auxiliary ones: every name a request may omit
_MAY_OMIT = frozenset((*_OPTIONAL_WEIGHTS, *NORM_NAMES, *AUX_NAMES))


def _uncertain(g: GraphBuilder, layouts: list[dict[str, int]], others: tuple[int, ...] = ()) -> bool:
    """Whether a support query cannot know the presence of some optional operand (a model
    input a request may omit): every pattern then lowers where the required parts do."""
    return any(_present(g, layout[name]) is None for layout in layouts for name in layout if name in _MAY_OMIT) \
        or any(presence(g, index) is None for index in others)


def _explicit_sequence(g: GraphBuilder, direction: _Explicit, sequence: str, aux: str | None, steps: int,
                       h0: int, c0: int, batch: int, reverse: bool = False) -> tuple[str, str, str]:
    """One direction's explicit steps over time-major ``sequence`` (and ``aux``, with
    auxiliary weights): (outputs [T, B, out], the last h and c)."""
    products = [(sequence, direction.weights)]
    if direction.aux_weights is not None:
        products.append((aux, direction.aux_weights))  # type: ignore[arg-type]
    parts = _step_inputs(g, products, direction.bias, steps)
    h = _float(g, h0, "output state in", [batch, direction.output_size])
    c = _float(g, c0, "cell state in", [batch, direction.units])
    outputs, h, c, _ = _unroll(g, direction.cell, parts, h, c, reverse)
    return _stacked(g, outputs), h, c


def _clips(g: GraphBuilder, cell: int, projection: int) -> tuple[float, float]:
    return float(g.scalar(cell)), float(g.scalar(projection))


def _activation_code(g: GraphBuilder, index: int) -> int:
    code = int(g.scalar(index))
    if code not in (ACT_NONE, ACT_RELU, ACT_RELU1, ACT_RELU6, ACT_TANH, ACT_SIGMOID):
        raise Declined(f"activation {code} is not an NNAPI LSTM activation")
    return code


def _onnx_form(g: GraphBuilder, layouts: list[dict[str, int]], activation: int) -> bool:
    """Whether ONNX's LSTM computes these directions, the cell clip aside: no projection,
    layer normalization or auxiliary weights, and an activation ONNX has."""
    present = [_presences(g, layout) for layout in layouts]
    return (activation in _ACTIVATIONS
            and not any(p[name] for p in present for name in ("projection", "projection_bias", "input_norm",
                                                               "forget_norm", "cell_norm", "output_norm",
                                                               "aux_to_forget") if name in p))


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
    attributes = activation_attributes([("Sigmoid", None, None), function, function] * len(directions))
    y, y_h, y_c = g.node("LSTM", inputs, 3, hidden_size=units,
                         direction="bidirectional" if len(directions) == 2 else "forward", **attributes)
    return y, y_h, y_c


@lowers(OperationCode.UNIDIRECTIONAL_SEQUENCE_LSTM)
def lower_unidirectional_lstm(g: GraphBuilder, operation: Operation) -> None:
    """One ONNX LSTM (forward), the final states, when asked for, its Y_h and Y_c; a cell
    clip proven away by its outputs or else the explicit steps (_clipped_lstm); the
    explicit steps for what ONNX's LSTM has no form for (projection, layer normalization,
    RELU1 / RELU6, a cell clip with peephole weights or another activation than tanh)."""
    check_types(g, operation, FLOATS)
    inputs = operation.inputs
    if len(inputs) != lstm_op.SEQ_INPUT_COUNT:
        raise Declined(f"expected {lstm_op.SEQ_INPUT_COUNT} inputs")
    time_major = bool(g.scalar(inputs[lstm_op.SEQ_TIME_MAJOR]))
    batch, size = _sequence_dims(g, inputs[lstm_op.INPUT], time_major)
    x = g.value(inputs[lstm_op.INPUT])
    steps = x.dims[0 if time_major else 1]
    activation = _activation_code(g, inputs[lstm_op.ACTIVATION])
    clip, proj_clip = _clips(g, inputs[lstm_op.CELL_CLIP], inputs[lstm_op.PROJ_CLIP])
    layout = _layout(inputs, lstm_op.WEIGHTS, lstm_op.SEQ_NORM_WEIGHTS)
    h0, c0 = inputs[lstm_op.OUTPUT_STATE_IN], inputs[lstm_op.CELL_STATE_IN]
    if _uncertain(g, [layout]):
        units, out = _required(g, layout, size, "")
        _float(g, h0, "output state in", [batch, out])
        _float(g, c0, "cell state in", [batch, units])
        if not steps:
            raise Declined("the number of time steps must be known")
        return
    sequence = _time_major(g, x.name, time_major)
    outputs = operation.outputs
    peephole = _present(g, layout["cell_to_forget"])
    if _onnx_form(g, [layout], activation) and (clip == 0 or (not peephole and activation == ACT_TANH and steps)):
        direction = _lstm_weights(g, layout, size, "")
        if clip > 0:
            y, y_h, y_c = _clipped_lstm(g, sequence, direction, h0, c0, batch, steps, inputs[lstm_op.ACTIVATION], clip)
        else:
            y, y_h, y_c = _lstm(g, sequence, [direction], [h0], [c0], batch, inputs[lstm_op.ACTIVATION])
        g.set_output(outputs[0], _time_major(g, _no_direction_axis(g, y, 1), time_major))
        if len(outputs) == 3:
            g.set_output(outputs[1], _no_direction_axis(g, y_h, 0))
            g.set_output(outputs[2], _no_direction_axis(g, y_c, 0))
        return
    if not steps:
        raise Declined("the number of time steps must be known")
    direction = _explicit(g, layout, size, None, "", activation, clip, proj_clip)
    y, h, c = _explicit_sequence(g, direction, sequence, None, steps, h0, c0, batch)
    g.set_output(outputs[0], _time_major(g, y, time_major))
    if len(outputs) == 3:
        g.set_output(outputs[1], h)
        g.set_output(outputs[2], c)


@lowers(OperationCode.LSTM)
def lower_lstm(g: GraphBuilder, operation: Operation) -> None:
    """One time step in the explicit form (every variant): the scratch output holds the
    gate values in Android's order (input, cell, forget, output; no input with CIFG)."""
    check_types(g, operation, FLOATS)
    inputs = operation.inputs
    if len(inputs) not in lstm_op.LSTM_INPUT_COUNTS:
        raise Declined(f"expected {' or '.join(map(str, lstm_op.LSTM_INPUT_COUNTS))} inputs")
    x = g.value(inputs[lstm_op.INPUT])
    if x.kind != "float" or x.rank != 2 or not all(x.dims):
        raise Declined("the input must be a 2-D float tensor of known shape")
    batch, size = x.dims
    activation = _activation_code(g, inputs[lstm_op.ACTIVATION])
    clip, proj_clip = _clips(g, inputs[lstm_op.CELL_CLIP], inputs[lstm_op.PROJ_CLIP])
    layout = {name: inputs[lstm_op.WEIGHTS + i] for i, name in enumerate(WEIGHT_NAMES)}
    if len(inputs) > lstm_op.LSTM_NORM_WEIGHTS:
        layout.update({name: inputs[lstm_op.LSTM_NORM_WEIGHTS + i] for i, name in enumerate(NORM_NAMES)})
    layout.update({name: -1 for name in NORM_NAMES if name not in layout})  # -1: absent (see presence)
    h0, c0 = inputs[lstm_op.OUTPUT_STATE_IN], inputs[lstm_op.CELL_STATE_IN]
    given = {name: index for name, index in layout.items() if index >= 0}
    if _uncertain(g, [given]):
        units, out = _required(g, layout, size, "")
        _float(g, h0, "output state in", [batch, out])
        _float(g, c0, "cell state in", [batch, units])
        return
    direction = _explicit(g, layout, size, None, "", activation, clip, proj_clip)
    h = _float(g, h0, "output state in", [batch, direction.output_size])
    c = _float(g, c0, "cell state in", [batch, direction.units])
    pre = g.one("MatMul", [x.name, direction.weights])
    if direction.bias is not None:
        pre = g.one("Add", [pre, direction.bias])
    h, c, values = _step(g, direction.cell, pre, h, c)
    scratch = [values[gate] for gate in _SCRATCH_GATES if gate != "input" or "input" in direction.cell.gates]
    outputs = operation.outputs
    g.set_output(outputs[0], g.one("Concat", scratch, axis=1))
    g.set_output(outputs[1], h)
    g.set_output(outputs[2], c)
    g.set_output(outputs[3], g.one("Identity", [h]))


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
    """One ONNX LSTM (bidirectional) over the one input where ONNX's LSTM has the
    directions' form (no auxiliary input, no cell clip); else each direction's explicit
    steps, the backward one from the last step to the first: with an auxiliary input and
    auxiliary weights (cross-linking) both add its products, with an auxiliary input alone
    (parallel linking) the backward direction reads it instead of the input."""
    check_types(g, operation, FLOATS)
    inputs = operation.inputs
    if len(inputs) != lstm_op.BIDI_INPUT_COUNT:
        raise Declined(f"expected {lstm_op.BIDI_INPUT_COUNT} inputs")
    time_major = bool(g.scalar(inputs[lstm_op.BIDI_TIME_MAJOR]))
    merge = bool(g.scalar(inputs[lstm_op.BIDI_MERGE_OUTPUTS]))
    if len(operation.outputs) not in ((1, 5) if merge else (2, 6)):
        raise Declined("the outputs do not match merge_outputs")
    batch, size = _sequence_dims(g, inputs[lstm_op.INPUT], time_major)
    x = g.value(inputs[lstm_op.INPUT])
    steps = x.dims[0 if time_major else 1]
    activation = _activation_code(g, inputs[lstm_op.BIDI_ACTIVATION])
    clip, proj_clip = _clips(g, inputs[lstm_op.BIDI_CELL_CLIP], inputs[lstm_op.BIDI_PROJ_CLIP])
    layouts = [_layout(inputs, weights, norm, aux) for weights, norm, aux in (
        (lstm_op.WEIGHTS, lstm_op.BIDI_FW_NORM_WEIGHTS, lstm_op.BIDI_FW_AUX_WEIGHTS),
        (lstm_op.BIDI_BW_WEIGHTS, lstm_op.BIDI_BW_NORM_WEIGHTS, lstm_op.BIDI_BW_AUX_WEIGHTS))]
    aux_index = inputs[lstm_op.BIDI_AUX_INPUT]
    states = [(inputs[h], inputs[c]) for h, c in (lstm_op.BIDI_FW_STATE, lstm_op.BIDI_BW_STATE)]
    if _uncertain(g, layouts, (aux_index,)):
        for layout, (h0, c0), label in zip(layouts, states, ("forward ", "backward "), strict=True):
            # the backward direction may read the auxiliary input (parallel linking)
            units, out = _required(g, layout, size if label == "forward " else None, label)
            _float(g, h0, f"{label}output state in", [batch, out])
            _float(g, c0, f"{label}cell state in", [batch, units])
        if not steps:
            raise Declined("the number of time steps must be known")
        return
    sequence = _time_major(g, x.name, time_major)
    has_aux = presence(g, aux_index)
    # ONNX's bidirectional LSTM: both directions of one size, with peephole weights or without
    alike = len({(g.value(layout["input_to_output"]).dims[0], bool(_present(g, layout["cell_to_forget"])))
                 for layout in layouts}) == 1
    if not has_aux and clip == 0 and alike and _onnx_form(g, layouts, activation):
        directions = [_lstm_weights(g, {k: v for k, v in layout.items() if not k.startswith("aux_")}, size, label)
                      for layout, label in zip(layouts, ("forward ", "backward "), strict=True)]
        y, y_h, y_c = _lstm(g, sequence, directions, [h for h, _ in states], [c for _, c in states], batch,
                            inputs[lstm_op.BIDI_ACTIVATION])
        results = _directions_out(g, y, merge, time_major)
        if len(operation.outputs) > 2:
            (fw_h, bw_h), (fw_c, bw_c) = _states_out(g, [y_h, y_c])
            results += [fw_h, fw_c, bw_h, bw_c]
    else:
        if not steps:
            raise Declined("the number of time steps must be known")
        aux, aux_size = None, None
        if has_aux:
            aux_batch, aux_size = _sequence_dims(g, aux_index, time_major)
            aux_value = g.value(aux_index)
            if aux_batch != batch or aux_value.dims[0 if time_major else 1] != steps:
                raise Declined("the auxiliary input's batch and steps must be the input's")
            aux = _time_major(g, aux_value.name, time_major)
        cross = [bool(_present(g, layout["aux_to_forget"])) for layout in layouts]
        if cross[0] != cross[1]:
            raise Declined("forward and backward auxiliary weights must be both present or both omitted")
        parallel = has_aux and not cross[0]
        forward = _explicit(g, layouts[0], size, aux_size if cross[0] else None, "forward ", activation, clip,
                            proj_clip)
        backward = _explicit(g, layouts[1], aux_size if parallel else size, aux_size if cross[1] else None,  # type: ignore[arg-type]
                             "backward ", activation, clip, proj_clip)
        fw_y, fw_h, fw_c = _explicit_sequence(g, forward, sequence, aux, steps, *states[0], batch)
        bw_y, bw_h, bw_c = _explicit_sequence(g, backward, aux if parallel else sequence, aux, steps,  # type: ignore[arg-type]
                                              *states[1], batch, reverse=True)
        if merge:
            results = [_time_major(g, g.one("Concat", [fw_y, bw_y], axis=2), time_major)]
        else:
            results = [_time_major(g, fw_y, time_major), _time_major(g, bw_y, time_major)]
        if len(operation.outputs) > 2:
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


def _rnn(g: GraphBuilder, sequence: str, cells: list[tuple[str, str, str, str, int]], activation: int,
         direction: str = "forward") -> tuple[str, str]:
    """ONNX RNN over time-major ``sequence``: (Y [T, D, B, H], Y_h [D, B, H]); two cells
    run bidirectional, one in ``direction``."""
    if len({cell[4] for cell in cells}) != 1:
        raise Declined("the two directions must have the same number of units")
    inputs = [sequence, *(_stacked(g, [cell[i] for cell in cells]) for i in range(3)), "",
              _stacked(g, [cell[3] for cell in cells])]
    y, y_h = g.node("RNN", inputs, 2, hidden_size=cells[0][4],
                    direction="bidirectional" if len(cells) == 2 else direction,
                    **activation_attributes([_activation(g, activation)] * len(cells)))
    return y, y_h


@lowers(OperationCode.RNN)
def lower_rnn(g: GraphBuilder, operation: Operation) -> None:
    """One step of ONNX RNN; the new state is both outputs."""
    check_types(g, operation, FLOATS)
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
    check_types(g, operation, FLOATS)
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
    """One ONNX RNN (bidirectional) over the input; with an auxiliary input and auxiliary
    weights (cross-linking) over the input and the auxiliary input side by side, each
    direction's weights and auxiliary weights side by side (x W' + aux A' as one product
    [x, aux] [W, A]', the same terms summed); with an auxiliary input alone (parallel
    linking: the backward cell reads it instead of the input) two ONNX RNNs, forward over
    the input and reverse over the auxiliary input."""
    check_types(g, operation, FLOATS)
    inputs = operation.inputs
    time_major = bool(g.scalar(inputs[rnn_op.BIDI_TIME_MAJOR]))
    merge = bool(g.scalar(inputs[rnn_op.BIDI_MERGE_OUTPUTS]))
    if len(operation.outputs) not in ((1, 3) if merge else (2, 4)):
        raise Declined("the outputs do not match merge_outputs")
    batch, size = _sequence_dims(g, inputs[rnn_op.INPUT], time_major)
    aux, fw_aux, bw_aux = (presence(g, inputs[i]) for i in (rnn_op.BIDI_AUX_INPUT, rnn_op.BIDI_FW_AUX_WEIGHTS,
                                                               rnn_op.BIDI_BW_AUX_WEIGHTS))
    sequence = _time_major(g, g.value(inputs[rnn_op.INPUT]).name, time_major)
    forward = tuple(inputs[i] for i in rnn_op.CELL)
    backward = tuple(inputs[i] for i in rnn_op.BIDI_BW_CELL)
    activation = inputs[rnn_op.BIDI_ACTIVATION]
    if None in (aux, fw_aux, bw_aux):
        # a support query where a request may omit them: every pattern lowers (below) when
        # the cells do, the backward one reading the input or the auxiliary input
        cells = [_rnn_weights(g, cell, g.value(cell[0]).dims[1], batch, label)
                 for cell, label in ((forward, "forward "), (backward, "backward "))]
        if cells[0][4] != cells[1][4]:
            raise Declined("the two directions must have the same number of units")
        _activation(g, activation)
        return
    if not aux:
        if fw_aux or bw_aux:
            raise Declined("auxiliary weights need an auxiliary input")
        cells = [_rnn_weights(g, forward, size, batch, "forward "), _rnn_weights(g, backward, size, batch, "backward ")]
        y, y_h = _rnn(g, sequence, cells, activation)
    else:
        aux_batch, aux_size = _sequence_dims(g, inputs[rnn_op.BIDI_AUX_INPUT], time_major)
        if aux_batch != batch:
            raise Declined("the auxiliary input's batch differs from the input's")
        aux_sequence = _time_major(g, g.value(inputs[rnn_op.BIDI_AUX_INPUT]).name, time_major)
        if fw_aux != bw_aux:
            raise Declined("forward and backward auxiliary weights must be both present or both omitted")
        if fw_aux:
            cells = []
            for label, cell, weights in (("forward ", forward, rnn_op.BIDI_FW_AUX_WEIGHTS),
                                         ("backward ", backward, rnn_op.BIDI_BW_AUX_WEIGHTS)):
                w, r, b, h0, units = _rnn_weights(g, cell, size, batch, label)
                a = _float(g, inputs[weights], f"{label}auxiliary weights", [units, aux_size])
                cells.append((g.one("Concat", [w, a], axis=1), r, b, h0, units))
            y, y_h = _rnn(g, g.one("Concat", [sequence, aux_sequence], axis=2), cells, activation)
        else:
            cells = [_rnn_weights(g, forward, size, batch, "forward "),
                     _rnn_weights(g, backward, aux_size, batch, "backward ")]
            if cells[0][4] != cells[1][4]:
                raise Declined("the two directions must have the same number of units")
            y_fw, h_fw = _rnn(g, sequence, cells[:1], activation)
            y_bw, h_bw = _rnn(g, aux_sequence, cells[1:], activation, "reverse")
            y, y_h = g.one("Concat", [y_fw, y_bw], axis=1), g.one("Concat", [h_fw, h_bw], axis=0)
    results = _directions_out(g, y, merge, time_major)
    if len(operation.outputs) > 2:
        results += _states_out(g, [y_h])[0]
    for index, name in zip(operation.outputs, results, strict=True):
        g.set_output(index, name)


def _optional_positions(weights: int, norms: int, aux: int | None = None) -> list[int]:
    positions = [weights + WEIGHT_NAMES.index(name) for name in _OPTIONAL_WEIGHTS]
    positions += [norms + i for i in range(len(NORM_NAMES))]
    if aux is not None:
        positions += [aux + i for i in range(len(AUX_NAMES))]
    return positions


optional_inputs(OperationCode.LSTM, _optional_positions(lstm_op.WEIGHTS, lstm_op.LSTM_NORM_WEIGHTS))
optional_inputs(OperationCode.UNIDIRECTIONAL_SEQUENCE_LSTM,
                _optional_positions(lstm_op.WEIGHTS, lstm_op.SEQ_NORM_WEIGHTS))
optional_inputs(OperationCode.BIDIRECTIONAL_SEQUENCE_LSTM,
                [*_optional_positions(lstm_op.WEIGHTS, lstm_op.BIDI_FW_NORM_WEIGHTS, lstm_op.BIDI_FW_AUX_WEIGHTS),
                 *_optional_positions(lstm_op.BIDI_BW_WEIGHTS, lstm_op.BIDI_BW_NORM_WEIGHTS,
                                      lstm_op.BIDI_BW_AUX_WEIGHTS), lstm_op.BIDI_AUX_INPUT])
optional_inputs(OperationCode.BIDIRECTIONAL_SEQUENCE_RNN,
                (rnn_op.BIDI_AUX_INPUT, rnn_op.BIDI_FW_AUX_WEIGHTS, rnn_op.BIDI_BW_AUX_WEIGHTS))


def _activate(g: GraphBuilder, name: str, code: int) -> str:
    """NNAPI's activation ``code`` (lstm_cell.activate) applied to ``name``: RELU1 and
    RELU6 as exact Clips, tanh and the sigmoid as ONNX's."""
    if code == ACT_NONE:
        return name
    if code == ACT_RELU:
        return g.one("Relu", [name])
    if code in (ACT_RELU1, ACT_RELU6):
        low, high = (-1.0, 1.0) if code == ACT_RELU1 else (0.0, 6.0)
        return g.one("Clip", [name, g.constant(np.float32(low)), g.constant(np.float32(high))])
    if code == ACT_TANH:
        return g.one("Tanh", [name])
    if code == ACT_SIGMOID:
        return g.one("Sigmoid", [name])
    raise Declined(f"activation {code} is not an NNAPI activation")


@lowers(OperationCode.SVDF)
def lower_svdf(g: GraphBuilder, operation: Operation) -> None:
    """SVDF as the reference computes it (operations/svdf.py): the state [B, M * F] viewed
    as [B, F, M], its newest slot replaced by the input's feature products x F', each
    filter's memory dotted with its time weights, the rank filters of a unit summed, the
    bias added and the activation applied; the new state is the memory shifted by one
    slot with the newest zeroed."""
    check_types(g, operation, FLOATS)
    inputs = operation.inputs
    x = g.value(inputs[svdf_op.INPUT_TENSOR])
    if x.kind != "float" or x.rank != 2 or not all(x.dims):
        raise Declined("the input must be a 2-D float tensor of known shape")
    batch, size = x.dims
    features = g.value(inputs[svdf_op.WEIGHTS_FEATURE_TENSOR])
    times = g.value(inputs[svdf_op.WEIGHTS_TIME_TENSOR])
    if features.rank != 2 or times.rank != 2 or not all(features.dims) or not all(times.dims):
        raise Declined("weights_feature and weights_time must be 2-D of known shape")
    filters, memory = times.dims
    rank = int(g.scalar(inputs[svdf_op.RANK_PARAM]))
    if rank <= 0 or filters % rank:
        raise Declined(f"rank {rank} must divide the {filters} filters")
    units = filters // rank
    _float(g, inputs[svdf_op.WEIGHTS_FEATURE_TENSOR], "weights_feature", [filters, size])
    state = _float(g, inputs[svdf_op.STATE_IN_TENSOR], "state", [batch, memory * filters])
    activation = int(g.scalar(inputs[svdf_op.ACTIVATION_PARAM]))
    has_bias = presence(g, inputs[svdf_op.BIAS_TENSOR])
    bias = _float(g, inputs[svdf_op.BIAS_TENSOR], "bias", [units]) if has_bias else None
    newest = g.one("Unsqueeze", [g.one("MatMul", [x.name, g.one("Transpose", [features.name])]),
                                 g.constant(np.array([2], np.int64))])  # [B, F, 1]
    axis2 = g.constant(np.array([2], np.int64))
    zero = g.constant(np.array([0], np.int64))
    if memory > 1:
        kept = g.one("Slice", [g.one("Reshape", [state, g.constant(np.array([batch, filters, memory], np.int64))]),
                               zero, g.constant(np.array([memory - 1], np.int64)), axis2])
        cells = g.one("Concat", [kept, newest], axis=2)  # [B, F, M]
    else:
        cells = newest
    per_filter = g.one("ReduceSum", [g.one("Mul", [cells, times.name]), axis2], keepdims=0)  # [B, F]
    output = g.one("ReduceSum", [g.one("Reshape", [per_filter, g.constant(np.array([batch, units, rank], np.int64))]),
                                 axis2], keepdims=0)
    if bias is not None:
        output = g.one("Add", [output, bias])
    output = _activate(g, output, activation)
    empty = g.constant(np.zeros((batch, filters, 1), np.float32))
    if memory > 1:
        shifted = g.one("Slice", [cells, g.constant(np.array([1], np.int64)),
                                  g.constant(np.array([memory], np.int64)), axis2])
        new_state = g.one("Reshape", [g.one("Concat", [shifted, empty], axis=2),
                                      g.constant(np.array([batch, memory * filters], np.int64))])
    else:
        new_state = g.one("Reshape", [empty, g.constant(np.array([batch, filters], np.int64))])
    g.set_output(operation.outputs[0], new_state)
    g.set_output(operation.outputs[1], output)


optional_inputs(OperationCode.SVDF, (svdf_op.BIAS_TENSOR,))
