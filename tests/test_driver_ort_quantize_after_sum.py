"""nnapi-ort-cpu's QUANTIZE of a float value computed from a sum ORT orders otherwise than the
reference (drivers/ort/quantization.py: BATCH_MATMUL, FULLY_CONNECTED, MEAN, SOFTMAX, through
element-wise operations and moves) or from a function it approximates otherwise (LOGISTIC,
TANH, EXP): one QuantizeLinear, within a step of the reference (as
the general rounding of ORT's value was: the float value itself differs in its last bits);
a value computed exactly keeps the general rounding, equal to the reference bit for bit."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

import nnapi  # noqa: E402
from helpers import constant, lowered_node_types, operand_adder, reference_device, run_on  # noqa: E402
from nnapi import OperandCode as T  # noqa: E402
from nnapi import OperationCode as Op  # noqa: E402

pytestmark = pytest.mark.usefixtures("calibration_file")

def _finish(model: nnapi.Model, inputs: list[int], real: int, shape: list[int], scale: float) -> nnapi.Model:
    operand = operand_adder(model)
    y = operand(T.TENSOR_QUANT8_ASYMM_SIGNED, shape, scale=scale, zero_point=-9)
    model.add_operation(Op.QUANTIZE, [real], [y])
    model.identify_inputs_and_outputs(inputs, [y])
    model.finish()
    return model


def _attention_model() -> nnapi.Model:
    """SOFTMAX(a @ b^T) @ v over [2, 16, 24] float32 inputs, quantized (PT2E attention)."""
    model = nnapi.Model()
    operand = operand_adder(model)
    a, b, v = (operand(T.TENSOR_FLOAT32, [2, 16, 24]) for _ in range(3))
    scores, weights, mixed = (operand(T.TENSOR_FLOAT32, [2, 16, 16]), operand(T.TENSOR_FLOAT32, [2, 16, 16]),
                              operand(T.TENSOR_FLOAT32, [2, 16, 24]))
    model.add_operation(Op.BATCH_MATMUL, [a, b, constant(model, T.BOOL, False), constant(model, T.BOOL, True)],
                        [scores])
    model.add_operation(Op.SOFTMAX, [scores, constant(model, T.FLOAT32, np.float32(1.0))], [weights])
    model.add_operation(Op.BATCH_MATMUL, [weights, v, constant(model, T.BOOL, False),
                                          constant(model, T.BOOL, False)], [mixed])
    return _finish(model, [a, b, v], mixed, [2, 16, 24], 0.0173)


def _rms_model() -> nnapi.Model:
    """RSQRT(MEAN(x * x) + eps) of [1, 64, 256] float32 values, reshaped to [1, 64, 1] and
    quantized (the RMS norm of sdpa PT2E)."""
    model = nnapi.Model()
    operand = operand_adder(model)
    x = operand(T.TENSOR_FLOAT32, [1, 64, 256])
    square, mean, shifted, column, root = (operand(T.TENSOR_FLOAT32, d) for d in
                                           ([1, 64, 256], [1, 64], [1, 64], [1, 64, 1], [1, 64, 1]))
    none = constant(model, T.INT32, np.int32(0))
    model.add_operation(Op.MUL, [x, x, none], [square])
    model.add_operation(Op.MEAN, [square, constant(model, T.TENSOR_INT32, np.array([2], np.int32), [1]),
                                  constant(model, T.INT32, np.int32(0))], [mean])
    model.add_operation(Op.ADD, [mean, constant(model, T.TENSOR_FLOAT32, np.array([1e-6], np.float32), [1]),
                                 none], [shifted])
    model.add_operation(Op.RESHAPE, [shifted, constant(model, T.TENSOR_INT32, np.array([1, 64, 1], np.int32),
                                                       [3])], [column])
    model.add_operation(Op.RSQRT, [column], [root])
    return _finish(model, [x], root, [1, 64, 1], 0.05)


def _gate_model() -> nnapi.Model:
    """An LSTM step's hidden output as PT2E leaves it in float: FULLY_CONNECTED of a [1, 48]
    float32 input into [1, 128], SLICEd into two gates, LOGISTIC(first) * TANH(second),
    quantized."""
    model = nnapi.Model()
    operand = operand_adder(model)
    rng = np.random.default_rng(5)
    x = operand(T.TENSOR_FLOAT32, [1, 48])
    weights = operand(T.TENSOR_FLOAT32, [128, 48], rng.normal(0, 0.3, (128, 48)).astype(np.float32))
    bias = operand(T.TENSOR_FLOAT32, [128], rng.normal(0, 0.1, 128).astype(np.float32))
    product, first, second, gate, cell, hidden = (operand(T.TENSOR_FLOAT32, d) for d in
                                                  ([1, 128], [1, 64], [1, 64], [1, 64], [1, 64], [1, 64]))
    none = constant(model, T.INT32, np.int32(0))
    model.add_operation(Op.FULLY_CONNECTED, [x, weights, bias, none], [product])
    for begin, part in ((0, first), (64, second)):
        model.add_operation(Op.SLICE, [product, constant(model, T.TENSOR_INT32, np.array([0, begin], np.int32), [2]),
                                       constant(model, T.TENSOR_INT32, np.array([1, 64], np.int32), [2])], [part])
    model.add_operation(Op.LOGISTIC, [first], [gate])
    model.add_operation(Op.TANH, [second], [cell])
    model.add_operation(Op.MUL, [gate, cell, none], [hidden])
    return _finish(model, [x], hidden, [1, 64], 1 / 256)


def _norm_chain_model() -> nnapi.Model:
    """A group norm's centring (x - MEAN(x) over the last axis of [1, 16, 300] float32
    values), then 20 element-wise operations (ten MUL / ADD pairs by scalar constants), EXP
    and RELU of the result added, quantized: the reordered sum lies 23 operations back, past
    the old search's 12."""
    model = nnapi.Model()
    operand = operand_adder(model)
    shape = [1, 16, 300]
    x = operand(T.TENSOR_FLOAT32, shape)
    mean = operand(T.TENSOR_FLOAT32, [1, 16, 1])
    none = constant(model, T.INT32, np.int32(0))
    model.add_operation(Op.MEAN, [x, constant(model, T.TENSOR_INT32, np.array([2], np.int32), [1]),
                                  constant(model, T.INT32, np.int32(1))], [mean])
    value = operand(T.TENSOR_FLOAT32, shape)
    model.add_operation(Op.SUB, [x, mean, none], [value])
    for step in range(10):
        for code, factor in ((Op.MUL, 1.1 - 0.03 * step), (Op.ADD, 0.01 * (step - 5))):
            following = operand(T.TENSOR_FLOAT32, shape)
            model.add_operation(code, [value, constant(model, T.TENSOR_FLOAT32, np.array([factor], np.float32), [1]),
                                       none], [following])
            value = following
    grown, clamped, total = (operand(T.TENSOR_FLOAT32, shape) for _ in range(3))
    model.add_operation(Op.EXP, [value], [grown])
    model.add_operation(Op.RELU, [value], [clamped])
    model.add_operation(Op.ADD, [grown, clamped, none], [total])
    return _finish(model, [x], total, shape, 0.031)


_INPUT_SHAPES = {"_attention_model": [[2, 16, 24]] * 3, "_rms_model": [[1, 64, 256]], "_gate_model": [[1, 48]],
                 "_norm_chain_model": [[1, 16, 300]]}
_OUTPUT_SHAPES = {"_attention_model": [2, 16, 24], "_rms_model": [1, 64, 1], "_gate_model": [1, 64],
                  "_norm_chain_model": [1, 16, 300]}


@pytest.mark.parametrize("build", [_attention_model, _rms_model, _gate_model, _norm_chain_model])
def test_a_quantize_after_a_reordered_sum_is_one_quantize_within_a_step(ort_device, build):
    """Attention's output, an RMS norm's scale, an LSTM step's gated output (through SLICE,
    LOGISTIC, TANH) and a group norm's centring 23 element-wise operations back (through EXP
    and RELU): one QuantizeLinear, none of the general rounding's Floor / Abs; every value
    within a step of the reference, nearly all equal."""
    model = build()
    rng = np.random.default_rng(3)
    model_inputs = [rng.normal(0, 1, d).astype(np.float32) for d in _INPUT_SHAPES[build.__name__]]
    if build is _rms_model:
        # rows of root mean squares 0.15 to 1: scales 1 to 6.7 over the output's steps
        model_inputs = [model_inputs[0] * rng.uniform(0.15, 1.0, (1, 64, 1)).astype(np.float32)]
    shape = _OUTPUT_SHAPES[build.__name__]
    got, want = (run_on(model, device, model_inputs, [np.zeros(shape, np.int8)])[0]
                 for device in (ort_device, reference_device()))
    difference = np.abs(got.astype(np.int64) - want)
    assert difference.max() <= 1 and np.mean(difference == 0) > 0.97, difference.max()
    assert len(np.unique(want)) > 10  # the values span the output's steps, not one saturated end
    types = lowered_node_types(model)
    assert "Floor" not in types and "Abs" not in types, types


def test_a_quantize_of_exact_float_values_keeps_the_general_rounding(ort_device):
    """DEQUANTIZE, ADD of two 8-bit inputs' real values, QUANTIZE: nothing summed beyond one
    exact addition, so the general rounding (its Floor) stays, equal to the reference bit
    for bit, halves included (scales 0.5 and 1: exact halves throughout)."""
    model = nnapi.Model()
    operand = operand_adder(model)
    a, b = (operand(T.TENSOR_QUANT8_ASYMM, [2, 256], scale=0.5, zero_point=128) for _ in range(2))
    ra, rb, total = (operand(T.TENSOR_FLOAT32, [2, 256]) for _ in range(3))
    y = operand(T.TENSOR_QUANT8_ASYMM, [2, 256], scale=1.0, zero_point=128)
    model.add_operation(Op.DEQUANTIZE, [a], [ra])
    model.add_operation(Op.DEQUANTIZE, [b], [rb])
    model.add_operation(Op.ADD, [ra, rb, constant(model, T.INT32, np.int32(0))], [total])
    model.add_operation(Op.QUANTIZE, [total], [y])
    model.identify_inputs_and_outputs([a, b], [y])
    model.finish()
    stored = np.arange(256, dtype=np.uint8)
    values = [np.stack([stored, stored[::-1]]), np.stack([stored[::-1], np.roll(stored, 7)])]
    got, want = (run_on(model, device, values, [np.zeros((2, 256), np.uint8)])[0]
                 for device in (ort_device, reference_device()))
    np.testing.assert_array_equal(got, want)
    assert "Floor" in lowered_node_types(model)


def _post_norm_model(channels: int) -> tuple[nnapi.Model, list[int]]:
    """A PT2E post-norm block's float island over [1, 16, 16, ``channels``] int8 tensors:
    DEQUANTIZE of two, their residual ADD, a batch norm left in float (per-channel SUB, MUL,
    ADD), SiLU (MUL(x, LOGISTIC(x))), QUANTIZE; and that SiLU's float value ADDed to a third
    DEQUANTIZEd tensor (a layer-scaled branch), QUANTIZE. Its inputs' shape too."""
    model = nnapi.Model()
    operand = operand_adder(model)
    rng = np.random.default_rng(8)
    shape = [1, 16, 16, channels]
    quantizations = ((0.0097, -128), (0.0036, -11), (0.0014, -3))
    inputs = [operand(T.TENSOR_QUANT8_ASYMM_SIGNED, shape, scale=s, zero_point=z) for s, z in quantizations]
    reals = [operand(T.TENSOR_FLOAT32, shape) for _ in inputs]
    for x, real in zip(inputs, reals):
        model.add_operation(Op.DEQUANTIZE, [x], [real])
    none = constant(model, T.INT32, np.int32(0))

    def step(code, a, b) -> int:
        out = operand(T.TENSOR_FLOAT32, shape)
        model.add_operation(code, [a, b, none] if b is not None else [a], [out])
        return out

    def per_channel(values) -> int:
        return constant(model, T.TENSOR_FLOAT32, np.asarray(values, np.float32).reshape(1, 1, 1, channels),
                        [1, 1, 1, channels])

    value = step(Op.ADD, reals[0], reals[1])
    value = step(Op.SUB, value, per_channel(rng.normal(0.6, 0.2, channels)))
    value = step(Op.MUL, value, per_channel(rng.uniform(1.5, 3.0, channels)))
    value = step(Op.ADD, value, per_channel(rng.normal(0.0, 0.3, channels)))
    silu = step(Op.MUL, value, step(Op.LOGISTIC, value, None))
    branch = step(Op.ADD, silu, reals[2])
    outputs = []
    for real, (scale, zero_point) in ((silu, (0.0142, -109)), (branch, (0.0145, -105))):
        outputs.append(operand(T.TENSOR_QUANT8_ASYMM_SIGNED, shape, scale=scale, zero_point=zero_point))
        model.add_operation(Op.QUANTIZE, [real], [outputs[-1]])
    model.identify_inputs_and_outputs(inputs, outputs)
    model.finish()
    return model, shape


def test_a_quantize_after_a_silu_over_unprovable_roots_is_one_quantize_within_a_step(ort_device):
    """The SiLU after a residual ADD and a batch norm over 32 channels (two roots: 2**21
    probe values, past the proof's bound) and its sum with a third DEQUANTIZEd tensor (three
    roots: no probe): ORT's Sigmoid differs from the reference's LOGISTIC in its last bits,
    so each QUANTIZE is one QuantizeLinear, every value within a step of the reference."""
    model, shape = _post_norm_model(32)
    rng = np.random.default_rng(4)
    values = [rng.integers(-128, 128, shape, dtype=np.int8) for _ in range(3)]
    outputs = [np.zeros(shape, np.int8) for _ in range(2)]
    got = run_on(model, ort_device, values, [o.copy() for o in outputs])
    want = run_on(model, reference_device(), values, [o.copy() for o in outputs])
    for g, w in zip(got, want):
        difference = np.abs(g.astype(np.int64) - w)
        assert difference.max() <= 1 and np.mean(difference == 0) > 0.97, difference.max()
        assert len(np.unique(w)) > 50
    types = lowered_node_types(model)
    assert "Floor" not in types and "Abs" not in types and types.count("QuantizeLinear") == 2, types
