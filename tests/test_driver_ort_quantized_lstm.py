"""QUANTIZED_16BIT_LSTM on nnapi-ort-cpu (exact integer ONNX operators): the reference's
outputs bit for bit, on random models whose values reach the saturations."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

import nnapi  # noqa: E402
from helpers import operand_adder, reference_device, run_on  # noqa: E402
from nnapi import OperandCode as T  # noqa: E402
from nnapi import OperandType  # noqa: E402
from nnapi import OperationCode as Op  # noqa: E402
from nnapi.drivers.ort.device import OrtDevice  # noqa: E402
from nnapi.runtime.model_builder import build_hal_model  # noqa: E402


def _model(rng: np.random.Generator, batch: int, size: int, units: int, given: bool, bias_range: int):
    """A QUANTIZED_16BIT_LSTM with random weights (constants, or model inputs when
    ``given``): the model and its input values."""
    model = nnapi.Model()
    inputs, values = [], []
    weights_scale, weights_zero = float(rng.uniform(0.001, 0.02)), int(rng.integers(0, 256))
    operand = operand_adder(model, inputs, values)

    x = operand(T.TENSOR_QUANT8_ASYMM, [batch, size], rng.integers(0, 256, [batch, size], dtype=np.uint8),
                1 / 128, 128, given=True)
    weights = [operand(T.TENSOR_QUANT8_ASYMM, [units, columns], rng.integers(0, 256, [units, columns], dtype=np.uint8),
                       weights_scale, weights_zero, given=given)
               for columns in [size] * 4 + [units] * 4]
    biases = [operand(T.TENSOR_INT32, [units], rng.integers(-bias_range, bias_range, [units], dtype=np.int32),
                      weights_scale / 128, 0, given=given) for _ in range(4)]
    cell = rng.integers(-32768, 32768, [batch, units], dtype=np.int16)
    cell.reshape(-1)[:2] = [-32768, 32767][:cell.size]
    state = operand(T.TENSOR_QUANT16_SYMM, [batch, units], cell, 2.0 ** -11, 0, given=True)
    output_in = operand(T.TENSOR_QUANT8_ASYMM, [batch, units], rng.integers(0, 256, [batch, units], dtype=np.uint8),
                        1 / 128, 128, given=True)
    outputs = [model.add_operand(OperandType(T.TENSOR_QUANT16_SYMM, [batch, units], 2.0 ** -11, 0)),
               model.add_operand(OperandType(T.TENSOR_QUANT8_ASYMM, [batch, units], 1 / 128, 128))]
    model.add_operation(Op.QUANTIZED_16BIT_LSTM, [x, *weights, *biases, state, output_in], outputs)
    model.identify_inputs_and_outputs(inputs, outputs)
    model.finish()
    return model, values


def _run(model, values, shape, device):
    return run_on(model, device, values, [np.zeros(shape, np.int16), np.zeros(shape, np.uint8)])


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("given", [False, True])
def test_quantized_16bit_lstm_is_the_reference_bit_for_bit(ort_device, seed, given):
    """Random sizes, weights (constants or given at run time), biases up to +-2^20 (gates
    saturating at the int16 range) and cell states over the whole int16 range: the new
    cell state and output are the reference's, bit for bit."""
    rng = np.random.default_rng(seed)
    batch, size, units = int(rng.integers(1, 4)), int(rng.integers(1, 9)), int(rng.integers(1, 9))
    model, values = _model(rng, batch, size, units, given, bias_range=1 << (12 + 2 * (seed % 5)))
    assert OrtDevice().get_unsupported_reasons(build_hal_model(model)[0]) == [None]
    ours = _run(model, values, [batch, units], ort_device)
    theirs = _run(model, values, [batch, units], reference_device())
    for mine, reference in zip(ours, theirs, strict=True):
        np.testing.assert_array_equal(mine, reference)
    assert len(np.unique(theirs[1])) > 1 or batch * units == 1
