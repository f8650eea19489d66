"""Recurrent-family operations beyond the CTS vectors: QUANTIZED_LSTM against a float
LSTM of the same model, the variants the vectors miss (parallel linking, state outputs,
auxiliary inputs of their own size), outputs with unspecified dimensions, constants in
shared memory, omitted operands given as model inputs, FarmHash reference values,
multinomial sampling, and signatures rejected at add_operation."""

from __future__ import annotations

import numpy as np
import pytest

import nnapi
from helpers import run_single_op
from nnapi import OperandCode as T
from nnapi import OperandType as OT
from nnapi import OperationCode as Op
from nnapi.operations.lsh_projection import fingerprint64
from nnapi.operations.quantized_lstm import fixed_logistic, fixed_tanh, logistic16, tanh16

F32 = T.TENSOR_FLOAT32
RNG = np.random.default_rng(1234)


def f32(shape):
    return OT(F32, shape)


def scalar(code, value):
    return (OT(code), value)


# --- a plain float LSTM used as the reference -------------------------------------------


def _sigmoid(x):
    return 1 / (1 + np.exp(-x))


def _norm(x, w, b):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + 1e-8) * w + b


def reference_lstm_step(x, h, c, w, cell_clip=0.0, proj_clip=0.0):
    """One LSTM step in float64 straight from the spec's equations; w maps names to
    arrays (None when absent)."""
    def pre(gate):
        z = x @ w[f"input_to_{gate}"].T + h @ w[f"recurrent_to_{gate}"].T
        if w.get(f"aux_to_{gate}") is not None:
            z = z + w["aux"] @ w[f"aux_to_{gate}"].T
        return z

    def finish(gate, z):
        if w.get("output_norm") is not None:
            return _norm(z, w[f"{gate}_norm"], w[f"{gate}_bias"])
        return z + w[f"{gate}_bias"]

    peephole = w.get("cell_to_output") is not None
    f = _sigmoid(finish("forget", pre("forget") + (w["cell_to_forget"] * c if peephole else 0)))
    if w.get("input_to_input") is None:
        i = 1 - f
    else:
        i = _sigmoid(finish("input", pre("input") + (w["cell_to_input"] * c if peephole else 0)))
    g = np.tanh(finish("cell", pre("cell")))
    c_new = f * c + i * g
    if cell_clip > 0:
        c_new = np.clip(c_new, -cell_clip, cell_clip)
    o = _sigmoid(finish("output", pre("output") + (w["cell_to_output"] * c_new if peephole else 0)))
    h_new = o * np.tanh(c_new)
    if w.get("projection") is not None:
        h_new = h_new @ w["projection"].T + (w["projection_bias"] if w.get("projection_bias") is not None else 0)
        if proj_clip > 0:
            h_new = np.clip(h_new, -proj_clip, proj_clip)
    return h_new, c_new


def random_lstm(input_size, units, output_size, cifg=False, peephole=False, projection=False, layer_norm=False,
                projection_bias=False, aux_size=None):
    w = {}
    gates = ("forget", "cell", "output") if cifg else ("input", "forget", "cell", "output")
    for gate in ("input", "forget", "cell", "output"):
        present = gate in gates
        w[f"input_to_{gate}"] = RNG.uniform(-0.5, 0.5, (units, input_size)) if present else None
        w[f"recurrent_to_{gate}"] = RNG.uniform(-0.5, 0.5, (units, output_size)) if present else None
        w[f"{gate}_bias"] = RNG.uniform(-0.3, 0.3, units) if present else None
        w[f"cell_to_{gate}"] = RNG.uniform(-0.3, 0.3, units) if present and peephole else None
        w[f"{gate}_norm"] = RNG.uniform(0.5, 1.5, units) if present and layer_norm else None
        w[f"aux_to_{gate}"] = (RNG.uniform(-0.5, 0.5, (units, aux_size)) if present and aux_size else None)
    w["projection"] = RNG.uniform(-0.5, 0.5, (output_size, units)) if projection else None
    w["projection_bias"] = RNG.uniform(-0.2, 0.2, output_size) if projection and projection_bias else None
    return w


_WEIGHT_ORDER = ("input_to_input", "input_to_forget", "input_to_cell", "input_to_output",
                 "recurrent_to_input", "recurrent_to_forget", "recurrent_to_cell", "recurrent_to_output",
                 "cell_to_input", "cell_to_forget", "cell_to_output",
                 "input_bias", "forget_bias", "cell_bias", "output_bias", "projection", "projection_bias")
_NORM_ORDER = ("input_norm", "forget_norm", "cell_norm", "output_norm")
_AUX_ORDER = ("aux_to_input", "aux_to_forget", "aux_to_cell", "aux_to_output")


def _operand(value, code=F32, as_input=False, omitted_shape=(0,)):
    """(type, value) for run_single_op: None values become omitted constants, or omitted
    model inputs when ``as_input`` (fed None)."""
    if value is None:
        return (OT(code, omitted_shape), None if as_input else "omitted")
    value = np.asarray(value, dtype=np.float32)
    return (OT(code, value.shape), None if as_input else value)


def _feeds(values):
    return [None if v is None else np.asarray(v, dtype=np.float32) for v in values]


# --- LSTM family -----------------------------------------------------------------------


@pytest.mark.parametrize("options", [
    dict(),
    dict(cifg=True, peephole=True),
    dict(peephole=True, projection=True, projection_bias=True, layer_norm=True),
    dict(cifg=True, layer_norm=True, projection=True),
])
def test_lstm_step_matches_reference_with_omitted_model_inputs(options):
    batch, input_size, units = 2, 3, 4
    output_size = 3 if options.get("projection") else units
    w = random_lstm(input_size, units, output_size, **options)
    x = RNG.uniform(-1, 1, (batch, input_size))
    h = RNG.uniform(-1, 1, (batch, output_size))
    c = RNG.uniform(-1, 1, (batch, units))
    values = [x, *(w[n] for n in _WEIGHT_ORDER), h, c]
    # Every tensor is a model input; omitted optional ones are fed as "no value".
    inputs = [_operand(v, as_input=True) for v in values]
    inputs += [scalar(T.INT32, 4), scalar(T.FLOAT32, 0.0), scalar(T.FLOAT32, 0.0)]
    norms = [w[n] for n in _NORM_ORDER]
    inputs += [_operand(v, as_input=True) for v in norms]
    gates = 3 if options.get("cifg") else 4
    outputs = [f32((batch, units * gates)), f32((batch, output_size)), f32((batch, units)), f32((batch, output_size))]
    scratch, h_out, c_out, out = run_single_op(Op.LSTM, inputs, outputs, feeds=_feeds(values + norms))
    h_ref, c_ref = reference_lstm_step(x, h, c, w)
    np.testing.assert_allclose(out, h_ref, atol=1e-5)
    np.testing.assert_allclose(h_out, h_ref, atol=1e-5)
    np.testing.assert_allclose(c_out, c_ref, atol=1e-5)
    assert scratch.shape == (batch, units * gates)


def _sequence_lstm_inputs(x, w, h0, c0, time_major, cell_clip=0.0, proj_clip=0.0):
    inputs = [_operand(x)] + [_operand(w[n]) for n in _WEIGHT_ORDER] + [_operand(h0), _operand(c0)]
    inputs += [scalar(T.INT32, 4), scalar(T.FLOAT32, cell_clip), scalar(T.FLOAT32, proj_clip),
               scalar(T.BOOL, time_major)]
    inputs += [_operand(w[n]) for n in _NORM_ORDER]
    return inputs


def _reference_sequence(x_tm, w, h, c, reverse=False, aux=None, cell_clip=0.0, proj_clip=0.0):
    steps = range(x_tm.shape[0] - 1, -1, -1) if reverse else range(x_tm.shape[0])
    outputs = [None] * x_tm.shape[0]
    for t in steps:
        weights = dict(w, aux=None if aux is None else aux[t])
        h, c = reference_lstm_step(x_tm[t], h, c, weights, cell_clip, proj_clip)
        outputs[t] = h
    return np.stack(outputs), h, c


def test_unidirectional_lstm_states_unspecified_dims_and_shared_memory_constants():
    steps, batch, input_size, units, output_size = 4, 2, 3, 5, 3
    w = random_lstm(input_size, units, output_size, peephole=True, projection=True, projection_bias=True)
    x = RNG.uniform(-1, 1, (batch, steps, input_size))  # batch-major
    h0, c0 = RNG.uniform(-1, 1, (batch, output_size)), RNG.uniform(-1, 1, (batch, units))
    inputs = _sequence_lstm_inputs(x, w, h0, c0, time_major=False, cell_clip=0.8, proj_clip=0.6)
    outputs = [f32((0, 0, 0)), f32((0, 0)), f32((0, 0))]
    out, h, c = run_single_op(Op.UNIDIRECTIONAL_SEQUENCE_LSTM, inputs, outputs, constant_memory=True)
    ref, h_ref, c_ref = _reference_sequence(np.swapaxes(x, 0, 1), w, h0, c0, cell_clip=0.8, proj_clip=0.6)
    assert out.shape == (batch, steps, output_size)
    np.testing.assert_allclose(out, np.swapaxes(ref, 0, 1), atol=1e-5)
    np.testing.assert_allclose(h, h_ref, atol=1e-5)
    np.testing.assert_allclose(c, c_ref, atol=1e-5)
    assert np.abs(c).max() <= 0.8 + 1e-6 and np.abs(out).max() <= 0.6 + 1e-6


def test_unidirectional_lstm_float16():
    steps, batch, input_size, units = 3, 1, 2, 4
    w = random_lstm(input_size, units, units, cifg=True, peephole=True)
    x = RNG.uniform(-1, 1, (steps, batch, input_size))
    h0, c0 = np.zeros((batch, units)), np.zeros((batch, units))
    f16 = T.TENSOR_FLOAT16

    def half(v):
        if v is None:
            return (OT(f16, (0,)), "omitted")
        v = np.asarray(v, dtype=np.float16)
        return (OT(f16, v.shape), v)

    inputs = [half(x)] + [half(w[n]) for n in _WEIGHT_ORDER] + [half(h0), half(c0)]
    inputs += [scalar(T.INT32, 4), scalar(T.FLOAT16, 0.0), scalar(T.FLOAT16, 0.0), scalar(T.BOOL, True)]
    inputs += [half(w[n]) for n in _NORM_ORDER]
    (out,) = run_single_op(Op.UNIDIRECTIONAL_SEQUENCE_LSTM, inputs, [OT(f16, (steps, batch, units))])
    w16 = {k: (None if v is None else np.asarray(v, np.float16).astype(np.float64)) for k, v in w.items()}
    ref, _, _ = _reference_sequence(np.asarray(x, np.float16).astype(np.float64), w16, h0, c0)
    assert out.dtype == np.float16
    np.testing.assert_allclose(out.astype(np.float64), ref, atol=5e-3, rtol=5e-3)


def _bidirectional_inputs(x, fw, bw, states, aux=None, merge=False, time_major=True):
    inputs = [_operand(x)]
    inputs += [_operand(fw[n]) for n in _WEIGHT_ORDER] + [_operand(bw[n]) for n in _WEIGHT_ORDER]
    inputs += [_operand(s) for s in states]
    inputs += [_operand(aux)] + [_operand(fw.get(n)) for n in _AUX_ORDER] + [_operand(bw.get(n)) for n in _AUX_ORDER]
    inputs += [scalar(T.INT32, 4), scalar(T.FLOAT32, 0.0), scalar(T.FLOAT32, 0.0), scalar(T.BOOL, merge),
               scalar(T.BOOL, time_major)]
    inputs += [_operand(fw[n]) for n in _NORM_ORDER] + [_operand(bw[n]) for n in _NORM_ORDER]
    return inputs


def test_bidirectional_lstm_parallel_linking_with_state_outputs():
    steps, batch, input_size, aux_size, units = 3, 2, 3, 2, 4
    fw = random_lstm(input_size, units, units)
    bw = random_lstm(aux_size, units, units, cifg=True)  # the backward cell reads the aux input
    x = RNG.uniform(-1, 1, (steps, batch, input_size))
    aux = RNG.uniform(-1, 1, (steps, batch, aux_size))
    states = [RNG.uniform(-1, 1, (batch, units)) for _ in range(4)]
    inputs = _bidirectional_inputs(x, fw, bw, states, aux=aux)
    outputs = [f32((steps, batch, units)), f32((steps, batch, units))] + [f32((batch, units))] * 4
    fw_out, bw_out, fw_h, fw_c, bw_h, bw_c = run_single_op(Op.BIDIRECTIONAL_SEQUENCE_LSTM, inputs, outputs)
    fw_ref, fw_h_ref, fw_c_ref = _reference_sequence(x, fw, states[0], states[1])
    bw_ref, bw_h_ref, bw_c_ref = _reference_sequence(aux, bw, states[2], states[3], reverse=True)
    for got, want in ((fw_out, fw_ref), (bw_out, bw_ref), (fw_h, fw_h_ref), (fw_c, fw_c_ref), (bw_h, bw_h_ref),
                      (bw_c, bw_c_ref)):
        np.testing.assert_allclose(got, want, atol=1e-5)


def test_bidirectional_lstm_cross_linking_merged_batch_major():
    steps, batch, input_size, aux_size, units = 3, 2, 3, 2, 4
    fw = random_lstm(input_size, units, units, aux_size=aux_size)
    bw = random_lstm(input_size, units, units, aux_size=aux_size)
    x = RNG.uniform(-1, 1, (batch, steps, input_size))
    aux = RNG.uniform(-1, 1, (batch, steps, aux_size))
    states = [np.zeros((batch, units), np.float32) for _ in range(4)]
    inputs = _bidirectional_inputs(x, fw, bw, states, aux=aux, merge=True, time_major=False)
    outputs = [f32((0, 0, 0))] + [f32((batch, units))] * 4
    merged, fw_h, _, bw_h, _ = run_single_op(Op.BIDIRECTIONAL_SEQUENCE_LSTM, inputs, outputs)
    x_tm, aux_tm = np.swapaxes(x, 0, 1), np.swapaxes(aux, 0, 1)
    fw_ref, fw_h_ref, _ = _reference_sequence(x_tm, fw, states[0], states[1], aux=aux_tm)
    bw_ref, bw_h_ref, _ = _reference_sequence(x_tm, bw, states[2], states[3], aux=aux_tm, reverse=True)
    assert merged.shape == (batch, steps, 2 * units)
    np.testing.assert_allclose(merged, np.swapaxes(np.concatenate([fw_ref, bw_ref], -1), 0, 1), atol=1e-5)
    np.testing.assert_allclose(fw_h, fw_h_ref, atol=1e-5)
    np.testing.assert_allclose(bw_h, bw_h_ref, atol=1e-5)


# --- RNN family and SVDF -------------------------------------------------------------------


def _reference_rnn(x_tm, wx, wh, b, h, reverse=False, aux=None, wa=None):
    steps = range(x_tm.shape[0] - 1, -1, -1) if reverse else range(x_tm.shape[0])
    outputs = [None] * x_tm.shape[0]
    for t in steps:
        z = x_tm[t] @ wx.T + h @ wh.T + b + (aux[t] @ wa.T if wa is not None else 0)
        h = np.maximum(z, 0)  # FUSED_RELU
        outputs[t] = h
    return np.stack(outputs), h


def test_unidirectional_rnn_state_output_and_unspecified_dims():
    steps, batch, input_size, units = 5, 2, 3, 4
    wx, wh = RNG.uniform(-0.5, 0.5, (units, input_size)), RNG.uniform(-0.5, 0.5, (units, units))
    b, h0 = RNG.uniform(-0.2, 0.2, units), RNG.uniform(0, 1, (batch, units))
    x = RNG.uniform(-1, 1, (batch, steps, input_size))
    inputs = [_operand(x), _operand(wx), _operand(wh), _operand(b), _operand(h0), scalar(T.INT32, 1),
              scalar(T.INT32, 0)]
    out, h = run_single_op(Op.UNIDIRECTIONAL_SEQUENCE_RNN, inputs, [f32((0, 0, 0)), f32((0, 0))])
    ref, h_ref = _reference_rnn(np.swapaxes(x, 0, 1), wx, wh, b, h0)
    np.testing.assert_allclose(out, np.swapaxes(ref, 0, 1), atol=1e-5)
    np.testing.assert_allclose(h, h_ref, atol=1e-5)


def test_bidirectional_rnn_parallel_linking_merged_with_states():
    steps, batch, input_size, aux_size, units = 4, 2, 3, 5, 2
    fw = [RNG.uniform(-0.5, 0.5, s) for s in ((units, input_size), (units, units), (units,))]
    bw = [RNG.uniform(-0.5, 0.5, s) for s in ((units, aux_size), (units, units), (units,))]
    h0 = [RNG.uniform(0, 1, (batch, units)) for _ in range(2)]
    x = RNG.uniform(-1, 1, (steps, batch, input_size))
    aux = RNG.uniform(-1, 1, (steps, batch, aux_size))
    inputs = ([_operand(x)] + [_operand(v) for v in fw] + [_operand(h0[0])] + [_operand(v) for v in bw]
              + [_operand(h0[1]), _operand(aux), _operand(None), _operand(None), scalar(T.INT32, 1),
                 scalar(T.BOOL, True), scalar(T.BOOL, True)])
    merged, fw_h, bw_h = run_single_op(Op.BIDIRECTIONAL_SEQUENCE_RNN, inputs,
                                       [f32((steps, batch, 2 * units)), f32((0, 0)), f32((0, 0))])
    fw_ref, fw_h_ref = _reference_rnn(x, *fw, h0[0])
    bw_ref, bw_h_ref = _reference_rnn(aux, *bw, h0[1], reverse=True)
    np.testing.assert_allclose(merged, np.concatenate([fw_ref, bw_ref], -1), atol=1e-5)
    np.testing.assert_allclose(fw_h, fw_h_ref, atol=1e-5)
    np.testing.assert_allclose(bw_h, bw_h_ref, atol=1e-5)


def test_svdf_rank_two_matches_reference():
    batch, input_size, units, rank, memory = 2, 3, 2, 2, 4
    filters = units * rank
    features = RNG.uniform(-1, 1, (filters, input_size))
    times = RNG.uniform(-1, 1, (filters, memory))
    bias = RNG.uniform(-1, 1, units)
    state = RNG.uniform(-1, 1, (batch, filters * memory))
    x = RNG.uniform(-1, 1, (batch, input_size))
    inputs = [_operand(x), _operand(features), _operand(times), _operand(bias), _operand(state),
              scalar(T.INT32, rank), scalar(T.INT32, 0)]
    state_out, out = run_single_op(Op.SVDF, inputs, [f32((0, 0)), f32((0, 0))], constant_memory=True)
    memory_state = state.reshape(batch, filters, memory).copy()
    memory_state[:, :, -1] = x @ features.T
    expected = np.einsum("bfm,fm->bf", memory_state, times).reshape(batch, units, rank).sum(-1) + bias
    np.testing.assert_allclose(out, expected, atol=1e-5)
    shifted = np.concatenate([memory_state[:, :, 1:], np.zeros((batch, filters, 1))], axis=2)
    np.testing.assert_allclose(state_out, shifted.reshape(batch, -1), atol=1e-6)


# --- LSH_PROJECTION and RANDOM_MULTINOMIAL ------------------------------------------------


@pytest.mark.parametrize("length, expected", [
    (0, 0x9AE16A3B2F90404F), (3, 0x26B4DA356B8B9558), (7, 0x1FAFA9EDD289AE25), (12, 0x4BBF2B58E806A1EB),
    (20, 0x337C05223C6016F3), (40, 0xE75E3CEC4CEE5710), (64, 0x111FA8723E25ADCA), (65, 0x366AB6067B570B1),
    (130, 0x6B2400CD0741DF9A),
])
def test_fingerprint64_reference_values(length, expected):
    # Reference values from FarmHash's own Fingerprint64 (pyfarmhash) on bytes (7i + 1) % 256.
    key = np.array([(7 * i + 1) % 256 for i in range(length)], dtype=np.uint8)
    assert int(fingerprint64(key[np.newaxis])[0]) == expected


def _lsh(kind, weights, hashes, data):
    inputs = [(OT(F32, hashes.shape), hashes), (OT(T.TENSOR_INT32, data.shape), data)]
    inputs.append(_operand(weights))
    inputs.append(scalar(T.INT32, kind))
    (out,) = run_single_op(Op.LSH_PROJECTION, inputs, [OT(T.TENSOR_INT32, (0,))])
    return out


def test_lsh_projection_types_agree_with_each_other():
    hashes = RNG.uniform(-1, 1, (3, 4)).astype(np.float32)
    data = RNG.integers(-1000, 1000, (5, 2)).astype(np.int32)
    weights = RNG.uniform(0.1, 2, 5).astype(np.float32)
    dense = _lsh(2, weights, hashes, data)
    sparse = _lsh(3, weights, hashes, data)
    deprecated = _lsh(1, weights, hashes, data)
    assert dense.shape == (12,) and set(np.unique(dense)) <= {0, 1}
    packed = dense.reshape(3, 4) @ (1 << np.arange(3, -1, -1))
    np.testing.assert_array_equal(deprecated, packed)
    np.testing.assert_array_equal(sparse, packed + np.arange(3) * 16)
    # the bit is the sign of the weighted sum of the signed 64-bit hashes of (seed, row)
    seed_bytes = np.float32(hashes[0, 0]).tobytes()
    signatures = [int(fingerprint64(np.frombuffer(seed_bytes + row.tobytes(), np.uint8)[np.newaxis])
                      .view(np.int64)[0]) for row in data]
    assert dense[0] == int(np.dot(weights.astype(np.float64), np.array(signatures, np.float64)) > 0)
    unweighted = _lsh(2, None, hashes, data)
    assert unweighted[0] == int(sum(float(s) for s in signatures) > 0)


def test_random_multinomial_follows_softmax_and_seeds():
    logits = np.log(np.array([[0.1, 0.2, 0.7], [0.5, 0.5, 1e-9]], dtype=np.float32))
    inputs = [(OT(F32, logits.shape), logits), scalar(T.INT32, 20000),
              (OT(T.TENSOR_INT32, (2,)), np.array([7, 11], np.int32))]
    (first,) = run_single_op(Op.RANDOM_MULTINOMIAL, inputs, [OT(T.TENSOR_INT32, (0, 0))])
    (second,) = run_single_op(Op.RANDOM_MULTINOMIAL, inputs, [OT(T.TENSOR_INT32, (2, 20000))])
    np.testing.assert_array_equal(first, second)  # same seeds, same samples
    frequencies = np.stack([np.bincount(row, minlength=3) / row.size for row in first])
    np.testing.assert_allclose(frequencies, [[0.1, 0.2, 0.7], [0.5, 0.5, 0.0]], atol=0.02)


# --- QUANTIZED_LSTM against a float LSTM ---------------------------------------------------


@pytest.mark.parametrize("integer_bits", [0, 3, 4, 6])
def test_fixed_point_sigmoid_and_tanh_over_every_int16(integer_bits):
    raw = np.arange(-32768, 32768, dtype=np.int64)
    real = raw / 2.0 ** (15 - integer_bits)
    logistic = fixed_logistic(raw, integer_bits) / 32768
    tanh = fixed_tanh(raw, integer_bits) / 32768
    # gemmlowp's algorithms are accurate to a few units of 2^-15
    assert np.abs(logistic - 1 / (1 + np.exp(-real))).max() < 2.5e-4
    assert np.abs(tanh - np.tanh(real)).max() < 4e-4
    assert fixed_logistic(np.array([0]), integer_bits)[0] == 16384 and fixed_tanh(np.array([0]), integer_bits)[0] == 0


@pytest.mark.parametrize("integer_bits", [0, 3, 6])
def test_activation_tables_equal_the_definition(integer_bits):
    """The LSTMs' tables give the definition's value for every int16 raw value, in any
    order and shape; a value outside int16 takes the definition."""
    raw = np.random.default_rng(integer_bits).permutation(np.arange(-32768, 32768, dtype=np.int64)).reshape(256, 256)
    np.testing.assert_array_equal(logistic16(raw, integer_bits), fixed_logistic(raw, integer_bits))
    np.testing.assert_array_equal(tanh16(raw, integer_bits), fixed_tanh(raw, integer_bits))
    wide = np.array([[-40000, 5, 40000]])
    np.testing.assert_array_equal(logistic16(wide, integer_bits), fixed_logistic(wide, integer_bits))
    assert logistic16(np.zeros((0, 4), np.int64), integer_bits).shape == (0, 4)


def _q(values, scale, zero_point, dtype):
    info = np.iinfo(dtype)
    return np.clip(np.round(np.asarray(values) / scale) + zero_point, info.min, info.max).astype(dtype)


@pytest.mark.parametrize("options", [
    dict(),
    dict(peephole=True, projection=True, projection_bias=True),
    dict(cifg=True, peephole=True, layer_norm=True),
    dict(layer_norm=True, projection=True, clip=True),
])
def test_quantized_lstm_matches_float_lstm(options):
    batch, input_size, units = 2, 5, 4
    projection = options.get("projection", False)
    layer_norm = options.get("layer_norm", False)
    output_size = 3 if projection else units
    w = random_lstm(input_size, units, output_size, cifg=options.get("cifg", False),
                    peephole=options.get("peephole", False), projection=projection, layer_norm=layer_norm,
                    projection_bias=options.get("projection_bias", False))
    x_scale, x_zero, h_scale, h_zero = 1 / 64, 3, 1 / 128, -2
    cell_scale = 2.0**-11
    # Android's kernel stores the hidden state as v - hidden_zero (and its projection adds
    # the zero point back); without projection those values are the output, so there the
    # hidden quantization must be the output's with the zero point negated.
    hidden_scale, hidden_zero = (1 / 128, 1) if projection else (h_scale, -h_zero)
    norm_scale = 1 / 1024
    intermediate = 2.0**-10
    x = _q(RNG.uniform(-1, 1, (batch, input_size)), x_scale, x_zero, np.int8)
    h = _q(RNG.uniform(-0.8, 0.8, (batch, output_size)), h_scale, h_zero, np.int8)
    c = _q(RNG.uniform(-1, 1, (batch, units)), cell_scale, 0, np.int16)
    quantized, real = {}, {}
    for name, value in w.items():
        if value is None or name.endswith("bias"):
            continue  # biases are quantized below, with their gates' scales
        if name.startswith(("input_to", "recurrent_to", "projection")):
            scale = float(np.abs(value).max() / 127)
            quantized[name] = (OT(T.TENSOR_QUANT8_SYMM, value.shape, scale), _q(value, scale, 0, np.int8))
        elif name.startswith("cell_to"):
            scale = 2.0**-12
            quantized[name] = (OT(T.TENSOR_QUANT16_SYMM, value.shape, scale), _q(value, scale, 0, np.int16))
        elif name.endswith("_norm"):
            quantized[name] = (OT(T.TENSOR_QUANT16_SYMM, value.shape, norm_scale), _q(value, norm_scale, 0, np.int16))
        real[name] = quantized[name][1].astype(np.float64) * quantized[name][0].scale
    for gate in ("input", "forget", "cell", "output"):
        bias = w[f"{gate}_bias"]
        if bias is None:
            continue
        # Bias units: input_scale * weights_scale, or layer_norm_scale / 1024 with layer norm.
        scale = norm_scale / 1024 if layer_norm else x_scale * quantized[f"input_to_{gate}"][0].scale
        quantized[f"{gate}_bias"] = (OT(T.TENSOR_INT32, bias.shape, scale), _q(bias, scale, 0, np.int32))
        real[f"{gate}_bias"] = quantized[f"{gate}_bias"][1] * scale
    if w["projection_bias"] is not None:
        scale = hidden_scale * quantized["projection"][0].scale
        quantized["projection_bias"] = (OT(T.TENSOR_INT32, (output_size,), scale),
                                        _q(w["projection_bias"], scale, 0, np.int32))
        real["projection_bias"] = quantized["projection_bias"][1] * scale
    # The projection clip is in units of the projection weights' scale (Android): 10 steps.
    cell_clip, proj_clip = (0.3, 10.5 * quantized["projection"][0].scale) if options.get("clip") else (0.0, 0.0)
    q8s, q16 = T.TENSOR_QUANT8_ASYMM_SIGNED, T.TENSOR_QUANT16_SYMM

    def slot(name, code):
        # omitted quantized operands still need a valid (positive) scale
        return quantized.get(name, (OT(code, (0,), 0.0 if code == T.TENSOR_INT32 else 1.0), "omitted"))

    inputs = [(OT(q8s, x.shape, x_scale, x_zero), x)]
    inputs += [slot(n, T.TENSOR_QUANT8_SYMM) for n in _WEIGHT_ORDER[:8]]
    inputs += [slot(n, q16) for n in _WEIGHT_ORDER[8:11]]
    inputs += [slot(n, T.TENSOR_INT32) for n in _WEIGHT_ORDER[11:15]]
    inputs += [slot("projection", T.TENSOR_QUANT8_SYMM), slot("projection_bias", T.TENSOR_INT32)]
    inputs += [(OT(q8s, h.shape, h_scale, h_zero), h), (OT(q16, c.shape, cell_scale), c)]
    inputs += [slot(n, q16) for n in _NORM_ORDER]
    inputs += [scalar(T.FLOAT32, cell_clip), scalar(T.FLOAT32, proj_clip)]
    inputs += [scalar(T.FLOAT32, intermediate)] * 4
    inputs += [scalar(T.INT32, hidden_zero), scalar(T.FLOAT32, hidden_scale)]
    outputs = [OT(q8s, (0, 0), h_scale, h_zero), OT(q16, (0, 0), cell_scale), OT(q8s, (batch, output_size),
                                                                                 h_scale, h_zero)]
    state_out, cell_out, out = run_single_op(Op.QUANTIZED_LSTM, inputs, outputs)
    x_real = (x.astype(np.float64) - x_zero) * x_scale
    h_real = (h.astype(np.float64) - h_zero) * h_scale
    c_real = c.astype(np.float64) * cell_scale
    h_ref, c_ref = reference_lstm_step(x_real, h_real, c_real, {**{k: None for k in w}, **real}, cell_clip)
    np.testing.assert_array_equal(state_out, out)
    # within about one step of the output quantization (the gates' fixed-point sigmoid and
    # tanh are accurate to a few 1e-4)
    np.testing.assert_allclose(cell_out * cell_scale, c_ref, atol=0.004)
    inside = np.ones(out.shape, dtype=bool)
    if cell_clip:
        assert np.abs(cell_out * cell_scale).max() <= cell_clip + cell_scale
        # Android clips the int8 projection output to +-(clip / projection weights scale),
        # around 0 rather than around the output's zero point.
        limit = int(proj_clip / quantized["projection"][0].scale)
        assert 0 < limit < 127 and np.abs(out.astype(np.int64)).max() <= limit
        assert (np.abs(out.astype(np.int64)) == limit).any()  # the clip binds
        inside = np.abs(out.astype(np.int64)) < limit
    np.testing.assert_allclose(((out.astype(np.float64) - h_zero) * h_scale)[inside], h_ref[inside],
                               atol=1.5 * h_scale)


# --- signatures rejected at add_operation --------------------------------------------------


def _add(code, inputs, outputs):
    model = nnapi.Model()
    indexes = [model.add_operand(t) for t in inputs]
    out = [model.add_operand(t) for t in outputs]
    model.add_operation(code, indexes, out)


def _lstm_types(dtype=F32, clip=T.FLOAT32, count=23):
    tensors = [OT(dtype, (2, 3))] + [OT(dtype, (4, 3))] * 4 + [OT(dtype, (4, 4))] * 4 + [OT(dtype, (4,))] * 7
    tensors += [OT(dtype, (4, 4)), OT(dtype, (4,)), OT(dtype, (2, 4)), OT(dtype, (2, 4))]
    types = tensors + [OT(T.INT32), OT(clip), OT(clip)]
    return types + [OT(dtype, (4,))] * (count - 23)


def test_lstm_signature_is_checked():
    outputs = [f32((2, 16)), f32((2, 4)), f32((2, 4)), f32((2, 4))]
    _add(Op.LSTM, _lstm_types(), outputs)  # the valid signature is accepted
    _add(Op.LSTM, _lstm_types(count=27), outputs)
    with pytest.raises(nnapi.BadDataError, match="inputs"):
        _add(Op.LSTM, _lstm_types()[:22], outputs)
    with pytest.raises(nnapi.BadDataError, match="input 21"):
        _add(Op.LSTM, _lstm_types(clip=T.FLOAT16), outputs)
    bad_rank = _lstm_types()
    bad_rank[2] = f32((4, 3, 1))
    with pytest.raises(nnapi.BadDataError, match="input 2"):
        _add(Op.LSTM, bad_rank, outputs)
    with pytest.raises(nnapi.BadDataError, match="output 1"):
        _add(Op.LSTM, _lstm_types(), [outputs[0], OT(T.TENSOR_FLOAT16, (2, 4)), *outputs[2:]])


def test_recurrent_signatures_are_checked():
    rnn = [f32((2, 3)), f32((4, 3)), f32((4, 4)), f32((4,)), f32((2, 4)), OT(T.INT32)]
    _add(Op.RNN, rnn, [f32((2, 4))] * 2)
    with pytest.raises(nnapi.BadDataError, match="input 0"):
        _add(Op.RNN, [f32((1, 2, 3))] + rnn[1:], [f32((2, 4))] * 2)
    with pytest.raises(nnapi.BadDataError, match="input 3"):
        _add(Op.RNN, rnn[:3] + [OT(T.TENSOR_FLOAT16, (4,))] + rnn[4:], [f32((2, 4))] * 2)
    seq = [f32((5, 2, 3))] + rnn[1:] + [OT(T.INT32)]
    with pytest.raises(nnapi.BadDataError, match="outputs"):
        _add(Op.UNIDIRECTIONAL_SEQUENCE_RNN, seq, [f32((5, 2, 4))] * 3)
    svdf = [f32((2, 3)), f32((4, 3)), f32((4, 10)), f32((2,)), f32((2, 40)), OT(T.INT32), OT(T.FLOAT32)]
    with pytest.raises(nnapi.BadDataError, match="input 6"):
        _add(Op.SVDF, svdf, [f32((2, 40)), f32((2, 2))])
    with pytest.raises(nnapi.BadDataError, match="output 0"):
        _add(Op.LSH_PROJECTION, [f32((4, 2)), OT(T.TENSOR_INT32, (3, 2)), f32((3,)), OT(T.INT32)],
             [f32((4,))])
    with pytest.raises(nnapi.BadDataError, match="input 2"):
        _add(Op.RANDOM_MULTINOMIAL, [f32((1, 4)), OT(T.INT32), f32((2,))], [OT(T.TENSOR_INT32, (1, 8))])


def test_quantized_lstm_signatures_are_checked():
    q8, q16 = T.TENSOR_QUANT8_ASYMM, T.TENSOR_QUANT16_SYMM
    inputs = [OT(q8, (2, 2), 1 / 128, 128)] + [OT(q8, (4, 2), 0.02, 100)] * 4 + [OT(q8, (4, 4), 0.02, 100)] * 4
    inputs += [OT(T.TENSOR_INT32, (4,), 0.02 / 128)] * 4 + [OT(q16, (2, 4), 2.0**-11), OT(q8, (2, 4), 1 / 128, 128)]
    outputs = [OT(q16, (2, 4), 2.0**-11), OT(q8, (2, 4), 1 / 128, 128)]
    _add(Op.QUANTIZED_16BIT_LSTM, inputs, outputs)
    with pytest.raises(nnapi.BadDataError, match="input 0"):
        _add(Op.QUANTIZED_16BIT_LSTM, [OT(q8, (2, 2), 1 / 64, 128)] + inputs[1:], outputs)
    with pytest.raises(nnapi.BadDataError, match="input 13"):
        _add(Op.QUANTIZED_16BIT_LSTM, inputs[:13] + [OT(q16, (2, 4), 2.0**-10)] + inputs[14:], outputs)
    with pytest.raises(nnapi.BadDataError, match="input 9"):
        _add(Op.QUANTIZED_16BIT_LSTM, inputs[:9] + [OT(T.TENSOR_INT32, (4,), 0.5)] + inputs[10:], outputs)
    with pytest.raises(nnapi.BadDataError, match="inputs"):
        _add(Op.QUANTIZED_LSTM, inputs, [OT(T.TENSOR_QUANT8_ASYMM_SIGNED, (2, 4), 1 / 128)] * 3)
