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
