"""The float LSTM and RNN cells shared by LSTM, UNIDIRECTIONAL_SEQUENCE_LSTM,
BIDIRECTIONAL_SEQUENCE_LSTM and the RNN family.

One direction of an LSTM layer is an ``LstmDirection``: its weights (absent optional
weights are None), read from the operation's inputs through a layout that maps weight
names to input indexes. ``run_lstm`` unrolls it over a time-major sequence; the input
(and auxiliary input) contributions of every time step are one matrix product done
before the time loop, so the loop only multiplies the recurrent state.

Variants, as the NNAPI spec defines them: CIFG (no input gate weights: i = 1 - f),
peephole (cell-to-gate weights), projection with optional bias, layer normalization
(gate pre-activations normalized per batch row, scaled, then the gate bias added),
cell and projection clipping (0 disables).

Not an operation module (the package loader skips it: ``_HELPER_MODULES``); the ONNX
Runtime driver's recurrent lowerings (drivers/ort/recurrent.py) read its weight names and
activation codes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from nnapi import vlog
from nnapi.operations import _jit
from nnapi.operations._native_loops import natives
from nnapi.operations.base import ExecutionContext, check_deadline, current_deadline_check

#: time steps of a compiled LSTM loop call between two deadline checks
_STEPS_PER_CHECK = 16
#: names of the per-direction weight inputs, in the order the spec lists them
WEIGHT_NAMES = (
    "input_to_input", "input_to_forget", "input_to_cell", "input_to_output",
    "recurrent_to_input", "recurrent_to_forget", "recurrent_to_cell", "recurrent_to_output",
    "cell_to_input", "cell_to_forget", "cell_to_output",
    "input_bias", "forget_bias", "cell_bias", "output_bias",
    "projection", "projection_bias",
)
NORM_NAMES = ("input_norm", "forget_norm", "cell_norm", "output_norm")
AUX_NAMES = ("aux_to_input", "aux_to_forget", "aux_to_cell", "aux_to_output")
#: the weights every LSTM direction needs
REQUIRED_NAMES = ("input_to_forget", "input_to_cell", "input_to_output", "recurrent_to_forget",
                  "recurrent_to_cell", "recurrent_to_output", "forget_bias", "cell_bias", "output_bias")

# Activation codes of the LSTM "g" function (TfLiteFusedActivation values).
ACT_NONE, ACT_RELU, ACT_RELU1, ACT_RELU6, ACT_TANH, ACT_SIGMOID = 0, 1, 2, 3, 4, 6
ACTIVATIONS = (ACT_NONE, ACT_RELU, ACT_RELU1, ACT_RELU6, ACT_TANH, ACT_SIGMOID)
# Layer normalization divides by sqrt(variance + this), as TFLite's kernels do.
_LAYER_NORM_EPSILON = np.float32(1e-8)


def sigmoid(x: np.ndarray) -> np.ndarray:
    # exp of a large negative argument overflows harmlessly to inf (result 0).
    with np.errstate(over="ignore"):
        return (1.0 / (1.0 + np.exp(-x))).astype(x.dtype, copy=False)


def activate(x: np.ndarray, code: int) -> np.ndarray:
    """Apply an activation code (none, relu, relu1, relu6, tanh, sigmoid)."""
    if code == ACT_RELU:
        return np.maximum(x, 0)
    if code == ACT_RELU1:
        return np.clip(x, -1, 1)
    if code == ACT_RELU6:
        return np.clip(x, 0, 6)
    if code == ACT_TANH:
        return np.tanh(x)
    if code == ACT_SIGMOID:
        return sigmoid(x)
    return x


def activate_into(x: np.ndarray, code: int, out: np.ndarray) -> np.ndarray:
    """``activate(x, code)`` written into ``out`` (the same float32 operations)."""
    if code == ACT_RELU:
        return np.maximum(x, 0, out=out)
    if code == ACT_RELU1:
        return np.clip(x, -1, 1, out=out)
    if code == ACT_RELU6:
        return np.clip(x, 0, 6, out=out)
    if code == ACT_TANH:
        return np.tanh(x, out=out)
    if code == ACT_SIGMOID:
        np.copyto(out, x)
        _sigmoid_in_place(out)
        return out
    np.copyto(out, x)
    return out


def input_products(inputs: np.ndarray, stacked_t: np.ndarray) -> np.ndarray:
    """The products of every time step's inputs [T, B, in] with a stacked weight matrix
    given transposed and contiguous, [in, G * units]: one 2-D product (a 3-D matmul runs
    one small product per step, and a transposed view makes BLAS slower again: 44 ->
    9 us for 20 x 40 -> 512). The reference and prepared cells share it, so they agree
    bit for bit."""
    steps, batch, size = inputs.shape
    return np.matmul(inputs.reshape(steps * batch, size), stacked_t).reshape(steps, batch, stacked_t.shape[1])


def optional_value(ctx: ExecutionContext, index: int | None) -> np.ndarray | None:
    """The float32 value of an optional input, None when omitted or not in the signature."""
    if index is None or ctx.is_omitted(index):
        return None
    return np.asarray(ctx.value(index), dtype=np.float32)


@dataclass
class LstmDirection:
    """The weights of one LSTM direction, float32; absent optional weights are None."""

    weights: dict[str, np.ndarray | None]
    activation: int
    cell_clip: float
    proj_clip: float

    @property
    def use_cifg(self) -> bool:
        return self.weights["input_to_input"] is None

    @property
    def use_layer_norm(self) -> bool:
        return self.weights["output_norm"] is not None

    @property
    def num_units(self) -> int:
        return self.weights["input_to_output"].shape[0]  # type: ignore[union-attr]

    @property
    def output_size(self) -> int:
        return self.weights["recurrent_to_output"].shape[1]  # type: ignore[union-attr]

    @property
    def has_aux_weights(self) -> bool:
        return self.weights.get("aux_to_forget") is not None

    def gates(self) -> tuple[str, ...]:
        """Gate names in scratch-buffer order (Android's: input, cell, forget, output)."""
        return ("cell", "forget", "output") if self.use_cifg else ("input", "cell", "forget", "output")


def read_direction(ctx: ExecutionContext, layout: dict[str, int | None], activation: int, cell_clip: float,
                   proj_clip: float) -> LstmDirection:
    weights = {name: optional_value(ctx, layout.get(name)) for name in (*WEIGHT_NAMES, *NORM_NAMES, *AUX_NAMES)}
    return LstmDirection(weights, activation, cell_clip, proj_clip)


def check_direction(ctx: ExecutionContext, d: LstmDirection, input_size: int, aux_size: int | None,
                    label: str = "") -> None:
    """Shape and presence rules of one direction (prepare time, OP_FAILED on violation)."""
    w = d.weights
    where = f"{label} " if label else ""
    for name in REQUIRED_NAMES:
        ctx.require(w[name] is not None, f"{where}{name} weights must be present")
    ctx.require(d.cell_clip >= 0 and d.proj_clip >= 0, "clipping thresholds must not be negative")
    ctx.require(d.activation in ACTIVATIONS, f"unsupported activation {d.activation}")
    units = w["input_to_output"].shape[0] if w["input_to_output"].ndim == 2 else -1  # type: ignore[union-attr]
    ctx.require(w["recurrent_to_output"].ndim == 2, f"{where}recurrent_to_output must be 2-D")  # type: ignore[union-attr]
    out = w["recurrent_to_output"].shape[1]  # type: ignore[union-attr]
    expected = {
        "input_to_input": (units, input_size), "input_to_forget": (units, input_size),
        "input_to_cell": (units, input_size), "input_to_output": (units, input_size),
        "recurrent_to_input": (units, out), "recurrent_to_forget": (units, out),
        "recurrent_to_cell": (units, out), "recurrent_to_output": (units, out),
        "cell_to_input": (units,), "cell_to_forget": (units,), "cell_to_output": (units,),
        "input_bias": (units,), "forget_bias": (units,), "cell_bias": (units,), "output_bias": (units,),
        "projection": (out, units), "projection_bias": (out,),
        "input_norm": (units,), "forget_norm": (units,), "cell_norm": (units,), "output_norm": (units,),
    }
    if aux_size is not None:
        expected.update({name: (units, aux_size) for name in AUX_NAMES})
    for name, shape in expected.items():
        value = w.get(name)
        if value is not None:
            ctx.require(value.shape == shape, f"{where}{name} has shape {list(value.shape)}, expected {list(shape)}")
    cifg = d.use_cifg
    ctx.require((w["recurrent_to_input"] is None) == cifg,
                f"{where}input_to_input and recurrent_to_input must be both present or both omitted")
    ctx.require((w["input_bias"] is None) == cifg, f"{where}input gate bias must be present exactly without CIFG")
    peephole = [w["cell_to_forget"] is not None, w["cell_to_output"] is not None]
    ctx.require(all(peephole) or not any(peephole), f"{where}peephole weights must be all present or all omitted")
    if cifg:
        ctx.require(w["cell_to_input"] is None, f"{where}cell_to_input must be omitted with CIFG")
    else:
        ctx.require((w["cell_to_input"] is not None) == all(peephole),
                    f"{where}peephole weights must be all present or all omitted")
    ctx.require(w["projection"] is not None or w["projection_bias"] is None,
                f"{where}projection bias needs projection weights")
    ctx.require(w["projection"] is not None or out == units,
                f"{where}without projection the output size must equal the number of units")
    norms = [w[name] is not None for name in NORM_NAMES[1:]]
    ctx.require(all(norms) or not any(norms), f"{where}layer norm weights must be all present or all omitted")
    if cifg:
        ctx.require(w["input_norm"] is None, f"{where}input layer norm weights must be omitted with CIFG")
    else:
        ctx.require((w["input_norm"] is not None) == all(norms),
                    f"{where}layer norm weights must be all present or all omitted")
    aux = [w.get(name) is not None for name in AUX_NAMES[1:]]
    ctx.require(all(aux) or not any(aux), f"{where}auxiliary weights must be all present or all omitted")
    if all(aux):
        ctx.require((w.get("aux_to_input") is not None) == (not cifg),
                    f"{where}aux_to_input weights must be present exactly without CIFG")


def _layer_norm(x: np.ndarray, weight: np.ndarray, bias: np.ndarray) -> np.ndarray:
    mean = x.mean(axis=-1, keepdims=True)
    centered = x - mean
    variance = np.mean(centered * centered, axis=-1, keepdims=True)
    return centered / np.sqrt(variance + _LAYER_NORM_EPSILON) * weight + bias


@dataclass
class LstmStacks:
    """What ``run_lstm`` multiplies by, built from one direction's weights alone: the
    gates' input weights stacked and transposed, the recurrent ones likewise, the biases
    and (with auxiliary weights) the auxiliary ones. A plan builds them once."""

    input_t: np.ndarray
    recurrent: np.ndarray
    biases: np.ndarray
    aux_t: np.ndarray | None


def lstm_stacks(d: LstmDirection) -> LstmStacks:
    """``LstmStacks`` of direction ``d``: one stacked matrix per source, the gates' rows
    side by side, so each time step needs a single recurrent matrix product."""
    w = d.weights
    gates = d.gates()
    stacked_input = np.concatenate([w[f"input_to_{g}"] for g in gates], axis=0)
    stacked_recurrent = np.concatenate([w[f"recurrent_to_{g}"] for g in gates], axis=0).T.copy()
    biases = np.concatenate([w[f"{g}_bias"] for g in gates])
    aux_t = None
    if d.has_aux_weights:
        aux_t = np.ascontiguousarray(np.concatenate([w[f"aux_to_{g}"] for g in gates], axis=0).T)
    return LstmStacks(np.ascontiguousarray(stacked_input.T), stacked_recurrent, biases, aux_t)


def run_lstm(d: LstmDirection, inputs: np.ndarray, h0: np.ndarray, c0: np.ndarray,
             aux: np.ndarray | None = None, reverse: bool = False, check=None, stacks: LstmStacks | None = None):
    """Unroll one direction over a time-major float32 sequence ``inputs`` [T, B, in];
    ``stacks``: ``lstm_stacks(d)`` when a plan made them (else made here).

    Returns (outputs [T, B, out], last output state, last cell state, last gate values
    [B, G * units] in Android's scratch layout).
    """
    w = d.weights
    gates = d.gates()
    units = d.num_units
    if stacks is None:
        stacks = lstm_stacks(d)
    stacked_recurrent, biases = stacks.recurrent, stacks.biases
    pre = input_products(inputs, stacks.input_t)
    if aux is not None and stacks.aux_t is not None:
        pre = pre + input_products(aux, stacks.aux_t)
    if not d.use_layer_norm:
        # Without layer normalization the bias joins the pre-activation directly.
        pre = pre + biases
    steps = inputs.shape[0]
    outputs = np.empty((steps, inputs.shape[1], d.output_size), dtype=np.float32)
    h, c = h0.astype(np.float32), c0.astype(np.float32)
    peephole = w["cell_to_output"] is not None
    projection, projection_bias = w["projection"], w["projection_bias"]
    scratch = np.zeros((inputs.shape[1], len(gates) * units), dtype=np.float32)
    order = range(steps - 1, -1, -1) if reverse else range(steps)
    for t in order:
        if check is not None:
            check()
        z = pre[t] + np.matmul(h, stacked_recurrent)
        parts = dict(zip(gates, np.split(z, len(gates), axis=-1), strict=True))
        if peephole:
            if not d.use_cifg:
                parts["input"] = parts["input"] + w["cell_to_input"] * c
            parts["forget"] = parts["forget"] + w["cell_to_forget"] * c
        if d.use_layer_norm:
            for g in gates:
                if g != "output":
                    parts[g] = _layer_norm(parts[g], w[f"{g}_norm"], w[f"{g}_bias"])
        forget = sigmoid(parts["forget"])
        input_gate = 1.0 - forget if d.use_cifg else sigmoid(parts["input"])
        candidate = activate(parts["cell"], d.activation)
        c = forget * c + input_gate * candidate
        if d.cell_clip > 0:
            c = np.clip(c, -d.cell_clip, d.cell_clip)
        out_pre = parts["output"]
        if peephole:
            out_pre = out_pre + w["cell_to_output"] * c
        if d.use_layer_norm:
            out_pre = _layer_norm(out_pre, w["output_norm"], w["output_bias"])
        output_gate = sigmoid(out_pre)
        hidden = output_gate * activate(c, d.activation)
        if projection is not None:
            hidden = np.matmul(hidden, projection.T)
            if projection_bias is not None:
                hidden = hidden + projection_bias
            if d.proj_clip > 0:
                hidden = np.clip(hidden, -d.proj_clip, d.proj_clip)
        h = hidden.astype(np.float32, copy=False)
        outputs[t] = h
        values = {"input": input_gate, "cell": candidate, "forget": forget, "output": output_gate}
        scratch = np.concatenate([values[g] for g in gates], axis=-1)
    return outputs, h, c.astype(np.float32, copy=False), scratch


class PreparedLstm:
    """``run_lstm`` for one direction whose weights are constants, prepared once: the
    stacked input and recurrent matrices and biases are built here, and each time step is
    one product into a reused buffer with the gate functions applied in place on its
    slices and the states updated in place, the output written straight into the output
    sequence (the same float32 operations as ``run_lstm``, so the same values, with
    about two thirds of the numpy calls and no allocation per step). Covers the plain,
    CIFG and projection variants; peephole and layer normalization stay on ``run_lstm``
    (``supports``)."""

    def __init__(self, d: LstmDirection) -> None:
        w = d.weights
        self.d = d
        gates = d.gates()
        self.units = d.num_units
        # The gates that go through the sigmoid have their weights and bias negated, so
        # the product is -z exactly (rounding is symmetric: (-a) * b + (-c) = -(a * b + c)
        # bit for bit) and the sigmoid 1 / (1 + exp(-z)) needs no negation per step.
        sign = np.concatenate([np.full(d.num_units, 1.0 if g == "cell" else -1.0, np.float32) for g in gates])
        stacked_input = np.concatenate([w[f"input_to_{g}"] for g in gates], axis=0)
        self.stacked_input_t = np.ascontiguousarray(stacked_input.T * sign)
        self.stacked_recurrent = np.ascontiguousarray(
            np.concatenate([w[f"recurrent_to_{g}"] for g in gates], axis=0).T * sign)
        self.biases = np.concatenate([w[f"{g}_bias"] for g in gates]) * sign
        self.projection, self.projection_bias = w["projection"], w["projection_bias"]
        # column ranges of the gates in the stacked product (Android's scratch order)
        u = self.units
        first = {g: i * u for i, g in enumerate(gates)}
        self.input_cols = None if d.use_cifg else slice(first["input"], first["input"] + u)
        self.cell_cols = slice(first["cell"], first["cell"] + u)
        self.forget_cols = slice(first["forget"], first["forget"] + u)
        self.output_cols = slice(first["output"], first["output"] + u)
        self.compiled = self._compiled_step(d, first)
        self.sequence = self._compiled_sequence(d, first)

    def _compiled_step(self, d: LstmDirection, first: dict[str, int]):
        """The compiled arithmetic of a time step (``nnapi[fast]``): (z += pre, the gates
        and cell update) as two functions of the step's arrays, or None (numpy's step)."""
        compiled = _jit.kernels()
        if compiled is None:
            return None
        columns, units = self.stacked_recurrent.shape[1], self.units
        input_gate = -1 if d.use_cifg else first["input"]
        forget, output, clip = first["forget"], first["output"], float(d.cell_clip)
        add_inputs, gates = compiled.lstm_add, compiled.lstm_gates

        def update(z: np.ndarray, c: np.ndarray, candidate: np.ndarray) -> None:
            gates(z, c, candidate, forget, input_gate, output, units, clip)

        empty = np.zeros((0, columns), np.float32)
        if not (_jit.warm_up(add_inputs, empty, empty)
                and _jit.warm_up(update, empty, np.zeros((0, units), np.float32), np.zeros((0, units), np.float32))):
            return None
        return add_inputs, update

    def _compiled_sequence(self, d: LstmDirection, first: dict[str, int]):
        """The whole time loop as one compiled call (``_numba_kernels.lstm_sequence``:
        numpy's own exp, tanh and BLAS product inside, so numpy's values) as a function of
        (pre, h, c, outputs, z, candidate, cell_out, start, stop), or None: without
        ``nnapi[fast]`` or numpy's machine code (``_native_loops``), for other activations
        than tanh, with projection, and for a one-column output state (numpy's product
        takes no BLAS path then). Kept only if it reproduces the numpy loop bit for bit
        here, on random values at batch 1 (BLAS sgemv) and 3 (sgemm)."""
        compiled, addresses = _jit.kernels(), natives()
        if (compiled is None or addresses is None or d.activation != ACT_TANH or self.projection is not None
                or d.output_size < 2):
            return None
        table, sequence = addresses.as_array(), compiled.lstm_sequence
        input_gate = -1 if d.use_cifg else first["input"]
        constants = (first["forget"], input_gate, first["output"], first["cell"], self.units, float(d.cell_clip))

        def run(pre, h, c, outputs, z, candidate, cell_out, start, stop) -> None:
            sequence(table, pre, self.stacked_recurrent, h, outputs, c, z, candidate, cell_out, start, stop,
                     *constants)

        try:
            agree = all(self._reproduces(run, batch) for batch in (1, 3))
        except Exception as error:  # noqa: BLE001 - any failure of the optional path falls back to numpy
            vlog.logger("cpuexe").warning("nnapi[fast]: compiled LSTM loop disabled: %s: %s",
                                          type(error).__name__, error)
            return None
        if not agree:
            vlog.logger("cpuexe").warning("nnapi[fast]: compiled LSTM loop disabled: differs from numpy's")
            return None
        return run

    def _reproduces(self, run, batch: int) -> bool:
        """Whether ``run`` computes the numpy loop's values on a random 3-step sequence."""
        rng = np.random.default_rng(batch)
        inputs = rng.uniform(-2, 2, (3, batch, self.stacked_input_t.shape[0])).astype(np.float32)
        h0 = rng.uniform(-1, 1, (batch, self.d.output_size)).astype(np.float32)
        c0 = rng.uniform(-1, 1, (batch, self.units)).astype(np.float32)
        want = self._numpy_loop(*self._buffers(inputs, h0, c0))
        got = self._sequence_loop(*self._buffers(inputs, h0, c0), run)
        return all(a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))
                   for a, b in zip(want, got, strict=True))

    @staticmethod
    def supports(d: LstmDirection) -> bool:
        return d.weights["cell_to_output"] is None and not d.use_layer_norm and not d.has_aux_weights

    def __call__(self, inputs: np.ndarray, h0: np.ndarray, c0: np.ndarray, reverse: bool = False
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(outputs [T, B, out], last output state, last cell state) of a time-major
        float32 sequence ``inputs`` [T, B, in]; ``reverse``: from its last step to its
        first (``run_lstm``'s reverse: the loop runs over the steps' input products in
        reverse order, and its outputs are put back in the sequence's order)."""
        buffers = self._buffers(inputs, h0, c0, reverse)
        if self.sequence is not None:
            results = self._sequence_loop(*buffers, self.sequence)
        elif self.compiled is not None and self.projection is None:
            results = self._compiled_loop(*buffers)
        else:
            results = self._numpy_loop(*buffers)
        return (results[0][::-1], *results[1:]) if reverse else results

    def _buffers(self, inputs: np.ndarray, h0: np.ndarray, c0: np.ndarray, reverse: bool = False):
        """(pre, outputs, h, c, z, candidate, cell_out) of a sequence: the input products
        with the biases (in the order the loop takes them), the output sequence,
        C-ordered copies of the states (c is updated in place) and the step's scratch."""
        pre = input_products(inputs, self.stacked_input_t)
        pre += self.biases
        if reverse:  # products of the sequence in its order, as run_lstm's, then reordered
            pre = np.ascontiguousarray(pre[::-1])
        steps, batch = inputs.shape[0], inputs.shape[1]
        outputs = np.empty((steps, batch, self.d.output_size), dtype=np.float32)
        h = np.array(h0, dtype=np.float32, order="C")
        c = np.array(c0, dtype=np.float32, order="C")
        z = np.empty((batch, self.stacked_recurrent.shape[1]), dtype=np.float32)
        candidate = np.empty((batch, self.units), dtype=np.float32)
        cell_out = np.empty((batch, self.units), dtype=np.float32)
        return pre, outputs, h, c, z, candidate, cell_out

    def _numpy_loop(self, pre: np.ndarray, outputs: np.ndarray, h: np.ndarray, c: np.ndarray, z: np.ndarray,
                    candidate: np.ndarray, cell_out: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The time loop in numpy calls (the reference of the compiled loops)."""
        d = self.d
        spare = np.empty_like(candidate) if self.input_cols is None else None
        forget, output_gate, cell_part = z[:, self.forget_cols], z[:, self.output_cols], z[:, self.cell_cols]
        input_gate = spare if self.input_cols is None else z[:, self.input_cols]
        activation, one, clip = d.activation, np.float32(1.0), d.cell_clip
        low, high = np.float32(-clip), np.float32(clip)
        projection = self.projection
        steps = pre.shape[0]
        for t in range(steps):
            check_deadline()
            np.matmul(h, self.stacked_recurrent, out=z)
            np.add(pre[t], z, out=z)
            # the candidate first, then every column through the sigmoid at once
            activate_into(cell_part, activation, candidate)
            np.exp(z, out=z)  # the sigmoid of the negated gates (the cell's columns unused)
            np.add(z, one, out=z)
            np.divide(one, z, out=z)
            if spare is not None:
                np.subtract(one, forget, out=spare)  # CIFG: i = 1 - f
            np.multiply(forget, c, out=c)
            np.multiply(input_gate, candidate, out=candidate)
            np.add(c, candidate, out=c)  # c = f * c + i * candidate
            if clip > 0:  # np.clip's values through two ufuncs, without its Python wrapper
                np.minimum(np.maximum(c, low, out=c), high, out=c)
            activate_into(c, activation, cell_out)
            if projection is None:
                h = np.multiply(output_gate, cell_out, out=outputs[t])
                continue
            hidden = np.matmul(output_gate * cell_out, projection.T)
            if self.projection_bias is not None:
                hidden = hidden + self.projection_bias
            if d.proj_clip > 0:
                hidden = np.clip(hidden, -d.proj_clip, d.proj_clip)
            outputs[t] = h = hidden.astype(np.float32, copy=False)
        return outputs, h.copy() if steps else h, c

    def _sequence_loop(self, pre: np.ndarray, outputs: np.ndarray, h: np.ndarray, c: np.ndarray, z: np.ndarray,
                       candidate: np.ndarray, cell_out: np.ndarray, run
                       ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The time loop in compiled calls (``_compiled_sequence``): all steps in one, or
        ``_STEPS_PER_CHECK`` per call between deadline checks when the run has a deadline."""
        steps = pre.shape[0]
        chunk = steps if current_deadline_check() is None else _STEPS_PER_CHECK
        for start in range(0, steps, max(chunk, 1)):
            check_deadline()
            run(pre, h, c, outputs, z, candidate, cell_out, start, min(start + chunk, steps))
        return outputs, outputs[-1].copy() if steps else h, c

    def _compiled_loop(self, pre: np.ndarray, outputs: np.ndarray, h: np.ndarray, c: np.ndarray, z: np.ndarray,
                       candidate: np.ndarray, cell_out: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``__call__``'s time loop without projection, its arithmetic in two compiled calls
        per step around numpy's exponential and activations: the same float32 operations
        in the same order, so the same values."""
        add_inputs, update = self.compiled
        activation, cell_part, output_gate = self.d.activation, z[:, self.cell_cols], z[:, self.output_cols]
        for t in range(pre.shape[0]):
            check_deadline()
            np.matmul(h, self.stacked_recurrent, out=z)
            add_inputs(z, pre[t])
            activate_into(cell_part, activation, candidate)
            np.exp(z, out=z)
            update(z, c, candidate)
            activate_into(c, activation, cell_out)
            h = np.multiply(output_gate, cell_out, out=outputs[t])
        return outputs, h.copy() if pre.shape[0] else h, c


def _sigmoid_in_place(x: np.ndarray) -> None:
    """``sigmoid`` (1 / (1 + exp(-x)), float32) written over ``x``."""
    np.negative(x, out=x)
    np.exp(x, out=x)
    np.add(x, np.float32(1.0), out=x)
    np.divide(np.float32(1.0), x, out=x)


def run_rnn(inputs: np.ndarray, weights: np.ndarray, recurrent: np.ndarray, bias: np.ndarray, h0: np.ndarray,
            activation: int, aux: np.ndarray | None = None, aux_weights: np.ndarray | None = None,
            reverse: bool = False, check=None, recurrent_t: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Basic RNN over a time-major float32 sequence: h = act(x W' + aux A' + h R' + b);
    ``recurrent_t``: R' as a C-ordered array when a plan made it (else made here).

    Returns (outputs [T, B, units], last hidden state)."""
    pre = np.matmul(inputs, weights.T) + bias
    if aux is not None and aux_weights is not None:
        pre = pre + np.matmul(aux, aux_weights.T)
    if recurrent_t is None:
        recurrent_t = recurrent.T.copy()
    outputs = np.empty(pre.shape, dtype=np.float32)
    h = h0.astype(np.float32)
    order = range(pre.shape[0] - 1, -1, -1) if reverse else range(pre.shape[0])
    for t in order:
        if check is not None:
            check()
        h = activate(pre[t] + np.matmul(h, recurrent_t), activation).astype(np.float32, copy=False)
        outputs[t] = h
    return outputs, h


def to_time_major(x: np.ndarray, time_major: bool) -> np.ndarray:
    return x if time_major else np.swapaxes(x, 0, 1)


def from_time_major(x: np.ndarray, time_major: bool) -> np.ndarray:
    return np.ascontiguousarray(x if time_major else np.swapaxes(x, 0, 1))
