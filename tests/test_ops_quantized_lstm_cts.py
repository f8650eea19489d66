"""QUANTIZED_LSTM against the values of Android's CTS tests qlstm_noprojection and
qlstm_projection (feature level 4; Apache-2.0 test data from the Android Open Source
Project). Our conformance vectors stop at feature level 3, so these three examples are
the regression test for matching Android's kernel bit for bit: layer normalization with
and without CIFG, with and without projection, a hidden-state scale that differs from the
output's (the output without projection is the hidden state's raw int8 values)."""

from __future__ import annotations

import numpy as np
import pytest

from helpers import run_single_op, s8, scalar
from nnapi import OperandCode as T
from nnapi import OperandType as OT
from nnapi import OperationCode as Op

BATCH, INPUT_SIZE, UNITS = 2, 5, 4
X = [90, 102, 13, 26, 38, 102, 13, 26, 51, 64]
INPUT_TO = {
    "input": [64, 77, 89, -102, -115, 13, 25, 38, -51, 64, -102, 89, -77, 64, -51, -64, -51, -38, -25, -13],
    "forget": [-77, -13, 38, 25, 115, -64, -25, -51, 38, -102, -51, 38, -64, -51, -77, 38, -51, -77, -64, -64],
    "cell": [-51, -38, -25, -13, -64, 64, -25, -38, -25, -77, 77, -13, -51, -38, -89, 89, -115, -64, 102, 77],
    "output": [-102, -51, -25, -115, -13, -89, 38, -38, -102, -25, 77, -25, 51, -89, -38, -64, 13, 64, -77, -51],
}
RECURRENT_TO = {  # first 12 values for output size 3, all 16 for output size 4
    "input": [-25, -38, 51, 13, -64, 115, -25, -38, -89, 6, -25, -77],
    "forget": [-64, -38, -64, -25, 77, 51, 115, 38, -13, 25, 64, 25, 25, 38, -13, 51],
    "cell": [-38, 25, 13, -38, 102, -10, -25, 38, 102, -77, -13, 25, 38, -13, 25, 64],
    "output": [38, -13, 13, -25, -64, -89, -25, -77, -13, -51, -89, -25, 13, 64, 25, -38],
}
BIAS = {
    "input": [644245, 3221226, 4724464, 8160438],
    "forget": [2147484, -6442451, -4294968, 2147484],
    "cell": [-1073742, 15461883, 5368709, 1717987],
    "output": [1073742, -214748, 4294968, 2147484],
}
LAYER_NORM = {
    "input": [3277, 6553, 9830, 16384],
    "forget": [6553, 6553, 13107, 9830],
    "cell": [22937, 6553, 9830, 26214],
    "output": [19660, 6553, 6553, 16384],
}
PROJECTION = [-25, 51, 3, -51, 25, 127, 77, 20, 18, 51, -102, 51]
GATES = ("input", "forget", "cell", "output")

CASES = {
    # name: (cifg, output size, expected output, expected cell state)
    "noprojection_cifg": (True, 4, [-15, 21, 14, 20, -15, 15, 5, 27],
                          [-11692, 9960, 5491, 8861, -9422, 7726, 2056, 13149]),
    "projection": (False, 3, [127, 127, -108, -67, 127, 127],
                   [-14650, 8939, 5771, 6715, -11843, 7847, 1508, 12939]),
    "projection_cifg": (True, 3, [127, 127, 127, -128, 127, 127],
                        [-11692, 9960, 5491, 8861, -9422, 7726, 2056, 13149]),
}


def _operands(cifg: bool, output_size: int, inputs_as_constants: bool):
    """The 32 inputs (tensors as model inputs or as constants, absent ones omitted), the
    three output types and the feeds for the model inputs."""
    weights_scale, state_scale = 0.00784314, 3.05176e-05
    projection = output_size != UNITS
    slots = [(T.TENSOR_QUANT8_ASYMM_SIGNED, (BATCH, INPUT_SIZE), 0.0078125, X)]
    slots += [(T.TENSOR_QUANT8_SYMM, (UNITS, INPUT_SIZE), weights_scale,
               None if cifg and gate == "input" else INPUT_TO[gate]) for gate in GATES]
    slots += [(T.TENSOR_QUANT8_SYMM, (UNITS, output_size), weights_scale,
               None if cifg and gate == "input" else RECURRENT_TO[gate][:UNITS * output_size]) for gate in GATES]
    slots += [(T.TENSOR_QUANT16_SYMM, (UNITS,), 1.0, None)] * 3  # no peephole
    slots += [(T.TENSOR_INT32, (UNITS,), 4.65661e-08, None if cifg and gate == "input" else BIAS[gate])
              for gate in GATES]
    slots += [(T.TENSOR_QUANT8_SYMM, (output_size, UNITS), 0.00392157, PROJECTION if projection else None),
              (T.TENSOR_INT32, (output_size,), 0.0, [0] * output_size if projection else None)]
    slots += [(T.TENSOR_QUANT8_ASYMM_SIGNED, (BATCH, output_size), state_scale, [0] * BATCH * output_size),
              (T.TENSOR_QUANT16_SYMM, (BATCH, UNITS), state_scale, [0] * BATCH * UNITS)]
    slots += [(T.TENSOR_QUANT16_SYMM, (UNITS,), 3.05182e-05, None if cifg and gate == "input" else LAYER_NORM[gate])
              for gate in GATES]
    inputs, feeds = [], []
    for code, shape, scale, values in slots:
        operand = OT(code, shape, scale)
        if values is None:
            inputs.append((operand, "omitted"))
            continue
        value = np.asarray(values, dtype=operand.dtype).reshape(shape)
        inputs.append((operand, value if inputs_as_constants else None))
        if not inputs_as_constants:
            feeds.append(value)
    inputs += [scalar(T.FLOAT32, 0.0), scalar(T.FLOAT32, 0.0)]  # no clipping
    inputs += [scalar(T.FLOAT32, s) for s in (0.007059, 0.007812, 0.007059, 0.007812)]  # intermediate scales
    inputs += [scalar(T.INT32, 0), scalar(T.FLOAT32, 0.007)]  # hidden state zero point and scale
    outputs = [s8((BATCH, output_size), state_scale, 0), OT(T.TENSOR_QUANT16_SYMM, (BATCH, UNITS), state_scale),
               s8((BATCH, output_size), state_scale, 0)]
    return inputs, outputs, feeds


@pytest.mark.parametrize("inputs_as_constants", [False, True])
@pytest.mark.parametrize("case", sorted(CASES))
def test_quantized_lstm_matches_android_cts(case, inputs_as_constants):
    cifg, output_size, expected_output, expected_cell = CASES[case]
    inputs, outputs, feeds = _operands(cifg, output_size, inputs_as_constants)
    state_out, cell_out, out = run_single_op(Op.QUANTIZED_LSTM, inputs, outputs, feeds)
    np.testing.assert_array_equal(cell_out.reshape(-1), expected_cell)
    np.testing.assert_array_equal(out.reshape(-1), expected_output)
    np.testing.assert_array_equal(state_out.reshape(-1), expected_output)


# --- the prepared kernel (constant weights) against ``execute`` -----------------------------


def _random_qlstm_inputs(rng, cifg: bool, peephole: bool, layer_norm: bool, projection: bool, clip: bool,
                         batch: int, cell_shift: int, ties: bool = False) -> list:
    """The 32 input tensors of a QUANTIZED_LSTM with random weights, zero points, scales
    and states (wide enough that gates and states saturate sometimes); with ``ties``,
    scales of powers of two, so that the multipliers are one half and most roundings are
    halfway cases."""
    from nnapi.operations.base import Tensor

    input_size, units = int(rng.integers(1, 9)), int(rng.integers(1, 9))
    output_size = int(rng.integers(1, 7)) if projection else units

    def tensor(code, shape, scale=0.0, zero_point=0, low=-128, high=128):
        dtype = OT(code, (1,)).dtype if shape else None
        value = rng.integers(low, high, shape).astype(dtype)
        return Tensor(code, tuple(shape), scale, zero_point, None, value)

    def scalar_tensor(code, value):
        return Tensor(code, (), 0.0, 0, None, np.array(value, dtype=np.float32 if code == T.FLOAT32 else np.int32))

    def omitted(code):
        return Tensor(code, (0,), 0.0, 0, None, None)

    def scale():
        if ties:
            return 2.0 ** -int(rng.integers(4, 9))
        return float(np.float32(rng.uniform(0.002, 0.05)))

    inputs = [tensor(T.TENSOR_QUANT8_ASYMM_SIGNED, (batch, input_size), scale(), int(rng.integers(-20, 20)))]
    for size in (input_size, output_size):
        for gate in GATES:
            inputs.append(omitted(T.TENSOR_QUANT8_SYMM) if cifg and gate == "input" else
                          tensor(T.TENSOR_QUANT8_SYMM, (units, size), scale(), 0, -127, 128))
    for gate in ("input", "forget", "output"):
        present = peephole and not (cifg and gate == "input")
        inputs.append(tensor(T.TENSOR_QUANT16_SYMM, (units,), 2.0**-12, 0, -3000, 3000) if present
                      else omitted(T.TENSOR_QUANT16_SYMM))
    for gate in GATES:
        inputs.append(omitted(T.TENSOR_INT32) if cifg and gate == "input" else
                      tensor(T.TENSOR_INT32, (units,), 1e-6, 0, -10000, 10000))
    if projection:
        inputs += [tensor(T.TENSOR_QUANT8_SYMM, (output_size, units), scale(), 0, -127, 128),
                   tensor(T.TENSOR_INT32, (output_size,), 1e-5, 0, -5000, 5000)]
    else:
        inputs += [omitted(T.TENSOR_QUANT8_SYMM), omitted(T.TENSOR_INT32)]
    inputs += [tensor(T.TENSOR_QUANT8_ASYMM_SIGNED, (batch, output_size), 1 / 128, int(rng.integers(-5, 5))),
               tensor(T.TENSOR_QUANT16_SYMM, (batch, units), 2.0**cell_shift, 0, -32768, 32768)]
    for gate in GATES:
        present = layer_norm and not (cifg and gate == "input")
        inputs.append(tensor(T.TENSOR_QUANT16_SYMM, (units,), 1 / 1024, 0, 1, 30000) if present
                      else omitted(T.TENSOR_QUANT16_SYMM))
    inputs += [scalar_tensor(T.FLOAT32, 0.5 if clip else 0.0), scalar_tensor(T.FLOAT32, 0.3 if clip else 0.0)]
    inputs += [scalar_tensor(T.FLOAT32, rng.uniform(0.001, 0.01)) for _ in GATES]
    inputs += [scalar_tensor(T.INT32, int(rng.integers(-10, 10))),
               scalar_tensor(T.FLOAT32, 2.0 ** -int(rng.integers(6, 9)) if ties else rng.uniform(0.004, 0.02))]
    return inputs


@pytest.mark.parametrize("compiled", [False, True], ids=["numpy", "compiled"])
@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("variant", ["plain", "cifg", "peephole", "layer_norm", "projection_clip", "everything",
                                     "ties"])
def test_prepared_quantized_lstm_equals_execute_bit_for_bit(variant, seed, compiled, monkeypatch):
    """PreparedQuantizedLstm (constant weights, the input and states unknown at
    preparation) against ``execute`` over five chained steps, every output exactly: its
    numpy step, and its compiled step (nnapi[fast]) where the variant has one (no
    peephole, no layer normalization)."""
    import dataclasses

    from nnapi.drivers.reference import _UNKNOWN
    from nnapi.operations import _jit

    if compiled and _jit.kernels() is None:
        pytest.skip("numba is not installed")
    if not compiled:
        monkeypatch.setenv(_jit.DISABLE_VARIABLE, "1")
    from nnapi.operations import get_operation
    from nnapi.operations.base import ExecutionContext
    from nnapi.operations.quantized_lstm import INPUT_TENSOR, PREV_CELL_STATE_TENSOR, PREV_OUTPUT_TENSOR

    rng = np.random.default_rng([seed, len(variant)])
    everything = variant == "everything"
    inputs = _random_qlstm_inputs(
        rng, cifg=variant == "cifg" or (everything and seed % 2 == 1), peephole=variant in ("peephole", "everything"),
        layer_norm=variant in ("layer_norm", "everything"), projection=variant in ("projection_clip", "everything"),
        clip=variant in ("projection_clip", "everything"), batch=int(rng.integers(1, 4)),
        cell_shift=int(rng.integers(-15, -8)), ties=variant == "ties")
    x, h, c = inputs[INPUT_TENSOR], inputs[PREV_OUTPUT_TENSOR], inputs[PREV_CELL_STATE_TENSOR]
    outputs = [OT(T.TENSOR_QUANT8_ASYMM_SIGNED, h.shape, h.scale, h.zero_point),
               OT(T.TENSOR_QUANT16_SYMM, c.shape, c.scale), OT(T.TENSOR_QUANT8_ASYMM_SIGNED, h.shape, h.scale,
                                                              h.zero_point)]
    operation = get_operation(Op.QUANTIZED_LSTM)
    preparing = list(inputs)
    for index in (INPUT_TENSOR, PREV_OUTPUT_TENSOR, PREV_CELL_STATE_TENSOR):
        preparing[index] = dataclasses.replace(inputs[index], value=_UNKNOWN)
    context = ExecutionContext(Op.QUANTIZED_LSTM, preparing, outputs)
    operation.prepare(context)
    kernel = operation.plan(context)
    assert kernel is not None
    assert (kernel.compiled is not None) == (compiled and variant in ("plain", "cifg", "projection_clip", "ties"))
    for _ in range(5):
        expected = operation.execute(ExecutionContext(Op.QUANTIZED_LSTM, inputs, outputs))
        actual = kernel([tensor.value for tensor in inputs])
        for fast, slow in zip(actual, expected, strict=True):
            assert fast.dtype == slow.dtype and fast.shape == slow.shape
            np.testing.assert_array_equal(fast, slow)
        inputs[PREV_OUTPUT_TENSOR] = dataclasses.replace(h, value=expected[0])
        inputs[PREV_CELL_STATE_TENSOR] = dataclasses.replace(c, value=expected[1])
        inputs[INPUT_TENSOR] = dataclasses.replace(x, value=rng.integers(-128, 128, x.shape).astype(np.int8))


@pytest.mark.parametrize("shift", [-12, -5, -2, -1, 0, 1, 3])
def test_prepared_rescale_equals_the_definition(shift):
    """The prepared rescale (quant_math's OutputStage saturating int64 sums) against
    multiply_by_quantized_multiplier on every value of a range, where ties of both
    roundings are frequent (multiplier 2^30 is one half), values beyond int32 (float64
    products too), per-column multipliers and shifts mixing 0 with rounding, and with a
    bias, a zero point and a clamp (the hidden state's and the projection's form)."""
    from nnapi.operations.quant_math import multiply_by_quantized_multiplier
    from nnapi.operations.quantized_lstm import _rescale

    rng = np.random.default_rng(shift + 100)
    values = np.concatenate([np.arange(-70000, 70000), rng.integers(-(2**33), 2**33, 20000),
                             [-(2**31), 2**31 - 1, -(2**31) - 1, 2**31]]).astype(np.int64)
    for multiplier in (1 << 30, (1 << 30) + 1, (1 << 31) - 1, int(rng.integers(1 << 30, 1 << 31)), 0):
        expected = multiply_by_quantized_multiplier(values, multiplier, shift)
        np.testing.assert_array_equal(_rescale(multiplier, shift)(values), expected)
        np.testing.assert_array_equal(_rescale(multiplier, shift)(values.astype(np.float64)), expected)
        np.testing.assert_array_equal(_rescale(multiplier, shift, 1234, -7, -128, 127)(values),
                                      np.clip(multiply_by_quantized_multiplier(values + 1234, multiplier, shift) - 7,
                                              -128, 127))
    columns = values[:139998].reshape(-1, 6)
    multipliers = np.array([1 << 30, (1 << 30) + 7, 1 << 30, (1 << 31) - 1, 1 << 30, 1 << 30], dtype=np.int64)
    shifts = np.array([shift, 0, -3, shift, 2, -1], dtype=np.int64)
    bias = np.array([0, -5, 2**31, 7, -(2**20), 1], dtype=np.int64)
    np.testing.assert_array_equal(_rescale(multipliers, shifts)(columns),
                                  multiply_by_quantized_multiplier(columns, multipliers, shifts))
    np.testing.assert_array_equal(_rescale(multipliers, shifts, bias, 0, -32768, 32767)(columns),
                                  np.clip(multiply_by_quantized_multiplier(columns + bias, multipliers, shifts),
                                          -32768, 32767))


def test_prepared_round_shift_equals_rounding_divide_by_pot():
    from nnapi.operations.quant_math import rounding_divide_by_pot
    from nnapi.operations.quantized_lstm import _round_shift

    values = np.concatenate([np.arange(-(1 << 17), 1 << 17), [-(2**40) - 1, 2**40 + 3]]).astype(np.int64)
    for exponent in (1, 2, 11, 15, 21):
        np.testing.assert_array_equal(_round_shift(values, exponent), rounding_divide_by_pot(values, exponent))
