"""Synthetic LSTMs for the importer's QUANTIZED_LSTM / QUANTIZED_16BIT_LSTM / LSTM
lowerings: TFLite's int8 LSTM / UNIDIRECTIONAL_SEQUENCE_LSTM (int16 cell state, optional
CIFG, peephole, layer normalization, projection, clipping) and its uint8 and float basic LSTM.

Weights are drawn in float and quantized as TFLite's converter does (symmetric int8
weights, int16 layer-norm and peephole weights, int32 biases); the operator's
``intermediates`` carry the gate and hidden-state scales.
"""

from __future__ import annotations

import numpy as np

from tflite_builder import Operator, Subgraph, Tensor, build

GATES = "ifco"  # TFLite's order of the full kernel's inputs: input, forget, cell, output
OUTPUT_STATE_ZERO_POINT = -2


def _symmetric(rng, shape, bits: int, spread: float = 0.4) -> tuple[np.ndarray, float]:
    values = spread * rng.standard_normal(shape)
    top = 2 ** (bits - 1) - 1
    scale = float(np.float32(np.abs(values).max() / top))
    return np.clip(np.round(values / scale), -top, top).astype(np.int8 if bits == 8 else np.int16), scale


def integer_lstm(*, sequence: bool, steps: int = 1, batch: int = 2, inputs: int = 3, units: int = 4,
                 output: int | None = None, cifg: bool = False, peephole: bool = False, layer_norm: bool = False,
                 projection_bias: bool = True, cell_clip: float = 0.0, proj_clip: float = 0.0,
                 time_major: bool = False, hidden_zero_point: int = 0, cell_type: str = "int16",
                 layer_norm_spread: float = 0.4, seed: int = 5, quantized_gates: bool = True) -> bytes:
    """One int8 LSTM (``sequence``: UNIDIRECTIONAL_SEQUENCE_LSTM over ``steps``) in a model."""
    rng = np.random.default_rng(seed)
    projected = output is not None
    output = output if projected else units
    x_scale, x_zero = 0.05, 3
    h_scale, h_zero = 1 / 128, OUTPUT_STATE_ZERO_POINT
    hidden_scale = 1 / 128
    cell_scale = 2.0**-11
    gate_scale = 2.0**-10  # the layer-normalized gates' matmul scale (intermediates 0-3)
    tensors: list[Tensor] = []

    def add(tensor: Tensor) -> int:
        tensors.append(tensor)
        return len(tensors) - 1

    shape = ([steps, batch, inputs] if time_major else [batch, steps, inputs]) if sequence else [batch, inputs]
    x = add(Tensor("x", "int8", shape, scale=x_scale, zero_point=x_zero))
    slots = [-1] * 24
    slots[0] = x
    for g_index, g in enumerate(GATES):
        if cifg and g == "i":
            continue
        w, ws = _symmetric(rng, (units, inputs), 8)
        slots[1 + g_index] = add(Tensor(f"w_{g}", "int8", [units, inputs], data=w, scale=ws, zero_point=0))
        r, rs = _symmetric(rng, (units, output), 8)
        slots[5 + g_index] = add(Tensor(f"r_{g}", "int8", [units, output], data=r, scale=rs, zero_point=0))
        if layer_norm:
            bias_scale = 2.0**-10 * 1.0  # layer norm adds the bias in units of its weights' scale / 1024
            ln, ln_scale = _symmetric(rng, (units,), 16, layer_norm_spread)
            ln = np.abs(ln).astype(np.int16)
            slots[20 + g_index] = add(Tensor(f"ln_{g}", "int16", [units], data=ln, scale=ln_scale, zero_point=0))
            bias_scale = ln_scale * 2.0**-10
        else:
            bias_scale = x_scale * ws
        bias = np.round(0.2 * rng.standard_normal(units) / bias_scale).astype(np.int32)
        slots[12 + g_index] = add(Tensor(f"b_{g}", "int32", [units], data=bias, scale=float(np.float32(bias_scale)),
                                         zero_point=0))
        if peephole and g != "c" and not (cifg and g == "i"):
            p, ps = _symmetric(rng, (units,), 16, 0.3)
            slots[9 + {"i": 0, "f": 1, "o": 2}[g]] = add(Tensor(f"p_{g}", "int16", [units], data=p, scale=ps,
                                                               zero_point=0))
    if projected:
        p, ps = _symmetric(rng, (output, units), 8)
        slots[16] = add(Tensor("proj", "int8", [output, units], data=p, scale=ps, zero_point=0))
        if projection_bias:
            pb = np.round(0.1 * rng.standard_normal(output) / (hidden_scale * ps)).astype(np.int32)
            slots[17] = add(Tensor("proj_b", "int32", [output], data=pb, scale=float(np.float32(hidden_scale * ps)),
                                   zero_point=0))
    slots[18] = add(Tensor("h", "int8", [batch, output], scale=h_scale, zero_point=h_zero, variable=True))
    if cell_type == "int16":
        slots[19] = add(Tensor("c", "int16", [batch, units], scale=cell_scale, zero_point=0, variable=True))
    else:
        slots[19] = add(Tensor("c", "int8", [batch, units], scale=1 / 16, zero_point=0, variable=True))
    out_shape = ([steps, batch, output] if time_major else [batch, steps, output]) if sequence else [batch, output]
    y = add(Tensor("y", "int8", out_shape, scale=h_scale, zero_point=h_zero))
    # Without layer norm the converter (TF 2.21) leaves the gates' intermediates float32 and
    # unquantized (quantized_gates=False); TFLite's kernel then takes 2**-12 for them.
    intermediates = [add(Tensor(f"gate_{g}", "int16", [0], scale=gate_scale, zero_point=0) if quantized_gates
                         else Tensor(f"gate_{g}", "float32", [0])) for g in GATES]
    intermediates.append(add(Tensor("hidden", "int8", [0], scale=hidden_scale, zero_point=hidden_zero_point)))
    if sequence:
        options = ("UnidirectionalSequenceLSTMOptions", {"FusedActivationFunction": 4, "CellClip": cell_clip,
                                                         "ProjClip": proj_clip, "TimeMajor": time_major})
        op = "UNIDIRECTIONAL_SEQUENCE_LSTM"
    else:
        options = ("LSTMOptions", {"FusedActivationFunction": 4, "CellClip": cell_clip, "ProjClip": proj_clip})
        op = "LSTM"
    operator = Operator(op, slots, [y], options, intermediates=intermediates)
    return build(Subgraph(tensors, [operator], [x], [y]))


def basic_uint8_lstm(batch: int = 2, inputs: int = 3, units: int = 4, weights_scale: float = 0.02,
                     input_scale: float = 1 / 128, seed: int = 9) -> bytes:
    """TFLite's 8-bit BASIC LSTM kernel (LSTM with kernel_type BASIC): uint8 input and output
    (scale 1/128, zero point 128), one uint8 weight matrix [4 * units, input + units] over
    [input, previous output], int32 biases (scale weights_scale / 128), int16 state (2^-11)."""
    rng = np.random.default_rng(seed)
    weights = rng.integers(90, 166, (4 * units, inputs + units)).astype(np.uint8)
    bias = rng.integers(-3000, 3000, 4 * units).astype(np.int32)
    t = [Tensor("x", "uint8", [batch, inputs], scale=input_scale, zero_point=128),
         Tensor("h_in", "uint8", [batch, units], scale=1 / 128, zero_point=128),
         Tensor("w", "uint8", [4 * units, inputs + units], data=weights, scale=weights_scale, zero_point=128),
         Tensor("b", "int32", [4 * units], data=bias, scale=weights_scale / 128, zero_point=0),
         Tensor("c_in", "int16", [batch, units], scale=2.0**-11, zero_point=0),
         Tensor("h", "uint8", [batch, units], scale=1 / 128, zero_point=128),
         Tensor("c", "int16", [batch, units], scale=2.0**-11, zero_point=0),
         Tensor("concat", "uint8", [batch, inputs + units], scale=1 / 128, zero_point=128),
         Tensor("activations", "int16", [batch, 4 * units], scale=2.0**-12, zero_point=0)]
    op = Operator("LSTM", [0, 1, 2, 3, 4], [5, 6, 7, 8], ("LSTMOptions", {"FusedActivationFunction": 4,
                                                                         "KernelType": 1}))
    return build(Subgraph(t, [op], [0, 1, 4], [5, 6]))


def basic_float_lstm(batch: int = 2, inputs: int = 3, units: int = 4, seed: int = 13) -> bytes:
    """TFLite's BASIC LSTM kernel on float32 (one weight matrix over [input, previous output])."""
    rng = np.random.default_rng(seed)
    t = [Tensor("x", "float32", [batch, inputs]),
         Tensor("h_in", "float32", [batch, units]),
         Tensor("w", "float32", [4 * units, inputs + units],
                data=(0.5 * rng.standard_normal((4 * units, inputs + units))).astype(np.float32)),
         Tensor("b", "float32", [4 * units], data=(0.2 * rng.standard_normal(4 * units)).astype(np.float32)),
         Tensor("c_in", "float32", [batch, units]),
         Tensor("h", "float32", [batch, units]),
         Tensor("c", "float32", [batch, units]),
         Tensor("concat", "float32", [batch, inputs + units]),
         Tensor("activations", "float32", [batch, 4 * units])]
    op = Operator("LSTM", [0, 1, 2, 3, 4], [5, 6, 7, 8], ("LSTMOptions", {"FusedActivationFunction": 4,
                                                                         "KernelType": 1}))
    return build(Subgraph(t, [op], [0, 1, 4], [5, 6]))
