"""nnapi-ort-cpu: a float PRELU whose constant alpha is one value (TFLite's LEAKY_RELU) is
lowered as ONNX LeakyRelu (uniform_prelu.py), with the reference's values bit for bit."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

import nnapi  # noqa: E402
from helpers import lowered_node_types, operand_adder, reference_device, run_on  # noqa: E402
from nnapi import OperandCode as T  # noqa: E402
from nnapi import OperandType  # noqa: E402
from nnapi import OperationCode as Op  # noqa: E402

pytestmark = pytest.mark.usefixtures("calibration_file")

#: inputs every test sets somewhere: zeros of both signs, infinities, NaN
_SPECIALS = [0.0, -0.0, np.inf, -np.inf, np.nan, -1e-30, 1e-30, -3.0e38]


def _prelu_model(shape: list[int], alpha: np.ndarray, code: int = T.TENSOR_FLOAT32) -> nnapi.Model:
    model = nnapi.Model()
    x = model.add_operand(OperandType(code, shape))
    a = model.add_operand(OperandType(code, list(alpha.shape)))
    model.set_operand_value(a, alpha)
    y = model.add_operand(OperandType(code, shape))
    model.add_operation(Op.PRELU, [x, a], [y])
    model.identify_inputs_and_outputs([x], [y])
    model.finish()
    return model


def _input(shape: list[int], seed: int) -> np.ndarray:
    value = np.random.default_rng(seed).standard_normal(shape).astype(np.float32) * 3
    value.reshape(-1)[:len(_SPECIALS)] = _SPECIALS
    return value


@pytest.mark.parametrize("alpha", [
    np.array([0.2], np.float32),                      # LEAKY_RELU as the importer writes it
    np.full((1, 1, 24), -1.25, np.float32),           # one value per channel, all equal
    np.array([[[1.5]]], np.float32),                  # above 1
    np.array([0.0], np.float32),
    np.array([1e-7], np.float32),                     # a tiny slope: no error that grows as alpha shrinks
])
@pytest.mark.parametrize("shape", [[1, 5, 6, 24], [2, 7, 24], [3, 24]])
def test_uniform_prelu_is_leaky_relu_with_the_reference_values(ort_device, alpha, shape):
    """LeakyRelu alone, no Relu / Max / Min / Mul / Conv pass, and every value (NaN, zeros of
    both signs, infinities, alpha * x below zero) the reference's bit for bit."""
    if alpha.ndim > len(shape):
        alpha = alpha.reshape(alpha.shape[-len(shape):])
    model = _prelu_model(shape, alpha)
    types = lowered_node_types(model)
    assert "LeakyRelu" in types
    assert not {"Relu", "Max", "Min", "Mul", "Conv", "Where"} & set(types)
    value = _input(shape, len(shape))
    ours, theirs = (run_on(model, device, [value], [np.zeros(shape, np.float32)])[0]
                    for device in (ort_device, reference_device()))
    np.testing.assert_array_equal(ours, theirs)
    a = np.float32(alpha.reshape(-1)[0])
    with np.errstate(invalid="ignore", over="ignore"):
        np.testing.assert_array_equal(ours, np.where(value >= 0, value, value * a))
    assert np.signbit(ours.reshape(-1)[1])  # PRELU(-0) = -0


def test_uniform_prelu_on_a_free_batch_equals_the_reference(ort_device):
    """openWakeWord's embedding model: LEAKY_RELU on [?, H, W, C]; every batch a run gives."""
    model = _prelu_model([0, 4, 3, 24], np.array([0.2], np.float32))
    assert "LeakyRelu" in lowered_node_types(model)
    for batch in (1, 3):
        value = _input([batch, 4, 3, 24], batch)
        ours, theirs = (run_on(model, device, [value], [np.zeros(value.shape, np.float32)], typed=True)[0]
                        for device in (ort_device, reference_device()))
        np.testing.assert_array_equal(ours, theirs)


def _conv_leaky_conv(channels: int, alpha: float) -> nnapi.Model:
    """[1, 8, 8, 3] -> CONV_2D 3x3 to ``channels`` -> PRELU(alpha) -> CONV_2D 1x1 to 16: the
    darknet block (the PRELU's input padded to the NCHWc block where ``channels`` is not a
    multiple of 16)."""
    rng = np.random.default_rng(channels)
    model = nnapi.Model()

    operand = operand_adder(model)

    def conv(x, cin, cout, kernel):
        w = operand(T.TENSOR_FLOAT32, [cout, kernel, kernel, cin],
                    rng.standard_normal((cout, kernel, kernel, cin)).astype(np.float32))
        b = operand(T.TENSOR_FLOAT32, [cout], rng.standard_normal(cout).astype(np.float32))
        y = operand(T.TENSOR_FLOAT32, [1, 8, 8, cout])
        scalars = [operand(T.INT32, [], np.int32(v)) for v in (1, 1, 1, 0)]  # SAME, strides 1, no activation
        model.add_operation(Op.CONV_2D, [x, w, b, *scalars], [y])
        return y

    x = operand(T.TENSOR_FLOAT32, [1, 8, 8, 3])
    h = conv(x, 3, channels, 3)
    a = operand(T.TENSOR_FLOAT32, [1], np.array([alpha], np.float32))
    p = operand(T.TENSOR_FLOAT32, [1, 8, 8, channels])
    model.add_operation(Op.PRELU, [h, a], [p])
    y = conv(p, channels, 16, 1)
    model.identify_inputs_and_outputs([x], [y])
    model.finish()
    return model


@pytest.mark.parametrize("channels", [16, 24])
def test_leaky_relu_between_convolutions_equals_the_reference(ort_device, channels):
    """A convolution, LEAKY_RELU 0.1, a convolution: LeakyRelu (which ORT fuses into the first
    convolution) on the padded channels where there are some (no Slice back), the outputs the
    reference's within float32 summation order."""
    model = _conv_leaky_conv(channels, 0.1)
    types = lowered_node_types(model)
    assert types.count("LeakyRelu") == 1 and "Relu" not in types and "Slice" not in types
    value = np.random.default_rng(1).uniform(-1, 1, (1, 8, 8, 3)).astype(np.float32)
    ours, theirs = (run_on(model, device, [value], [np.zeros((1, 8, 8, 16), np.float32)])[0]
                    for device in (ort_device, reference_device()))
    assert np.abs(ours - theirs).max() <= 2e-6 * np.abs(theirs).max()
    assert len(np.unique(ours)) > 500


@pytest.mark.parametrize("alpha", [
    np.array([[[0.25, 0.5]]], np.float32),            # two values: the per-channel forms
    np.array([np.inf], np.float32),                   # not finite: PRELU's own definition
    np.array([np.nan], np.float32),
])
def test_other_alphas_keep_the_general_forms(ort_device, alpha):
    model = _prelu_model([1, 4, 3, 2], alpha)
    assert "LeakyRelu" not in lowered_node_types(model)
    value = _input([1, 4, 3, 2], 5)
    ours, theirs = (run_on(model, device, [value], [np.zeros(value.shape, np.float32)])[0]
                    for device in (ort_device, reference_device()))
    np.testing.assert_array_equal(ours, theirs)


def test_uniform_alpha_wider_than_a_free_dimension_keeps_the_broadcast(ort_device):
    """An alpha of 3 equal rows against a batch known only at run time: PRELU's broadcast
    decides that run (the reference refuses a batch of 2), so no LeakyRelu, which would
    accept it."""
    model = _prelu_model([0, 2], np.full((3, 2), 0.5, np.float32))
    assert "LeakyRelu" not in lowered_node_types(model)


def _leaky_floor_model(shape: list[int], alpha: float, floor: float, conv_channels: int | None = None,
                       floor_first: bool = False) -> nnapi.Model:
    """[CONV_2D 1x1 to ``conv_channels`` ->] PRELU(alpha) -> MAXIMUM(., floor) [-> CONV_2D 1x1
    to 16]: openWakeWord's embedding blocks (LEAKY_RELU 0.2 floored at -0.4)."""
    rng = np.random.default_rng(len(shape) + (conv_channels or 0))
    model = nnapi.Model()

    operand = operand_adder(model)

    def conv(x, cin, cout):
        w = operand(T.TENSOR_FLOAT32, [cout, 1, 1, cin], rng.standard_normal((cout, 1, 1, cin)).astype(np.float32))
        b = operand(T.TENSOR_FLOAT32, [cout], rng.standard_normal(cout).astype(np.float32))
        y = operand(T.TENSOR_FLOAT32, [*shape[:3], cout])
        model.add_operation(Op.CONV_2D, [x, w, b, *[operand(T.INT32, [], np.int32(v)) for v in (1, 1, 1, 0)]], [y])
        return y

    x = operand(T.TENSOR_FLOAT32, shape)
    h = conv(x, shape[3], conv_channels) if conv_channels else x
    channels = conv_channels or shape[3]
    leaky = operand(T.TENSOR_FLOAT32, [*shape[:3], channels])
    model.add_operation(Op.PRELU, [h, operand(T.TENSOR_FLOAT32, [1], np.array([alpha], np.float32))], [leaky])
    floored = operand(T.TENSOR_FLOAT32, [*shape[:3], channels])
    c = operand(T.TENSOR_FLOAT32, [1], np.array([floor], np.float32))
    model.add_operation(Op.MAXIMUM, [c, leaky] if floor_first else [leaky, c], [floored])
    y = conv(floored, channels, 16) if conv_channels else floored
    model.identify_inputs_and_outputs([x], [y])
    model.finish()
    return model


@pytest.mark.parametrize("alpha, floor", [(0.2, -0.4), (0.1, -1.0), (1.5, -3.0)])
@pytest.mark.parametrize("floor_first", [False, True])
def test_floored_leaky_relu_stays_blocked_with_the_reference_values(ort_device, alpha, floor, floor_first):
    """MAXIMUM(PRELU(x, alpha), c) with alpha * (c / alpha) rounding to c: relu(x) plus the
    clipped negation scaled (Relu, Clip, Conv, Add: no Max, which leaves ORT's blocked
    layout), and every value the reference's bit for bit: inputs around the threshold c /
    alpha, far below it, zeros, infinities, NaN."""
    shape = [1, 6, 5, 16]
    model = _leaky_floor_model(shape, alpha, floor, floor_first=floor_first)
    types = lowered_node_types(model)
    assert "Clip" in types and not {"Max", "LeakyRelu"} & set(types)
    t = np.float32(floor) / np.float32(alpha)
    value = _input(shape, 3)
    value.reshape(-1)[len(_SPECIALS):] *= abs(t) / 2  # about as many below the threshold as above
    near = [np.nextafter(t, np.float32(-np.inf)), t, np.nextafter(t, np.float32(0)), t * 2, t / 2]
    value.reshape(-1)[len(_SPECIALS):len(_SPECIALS) + len(near)] = near
    ours, theirs = (run_on(model, device, [value], [np.zeros(shape, np.float32)])[0]
                    for device in (ort_device, reference_device()))
    np.testing.assert_array_equal(ours, theirs)
    assert (ours == np.float32(floor)).sum() > 10 and (ours < 0).sum() > (ours == np.float32(floor)).sum()


@pytest.mark.parametrize("channels", [16, 24])
def test_floored_leaky_relu_between_convolutions_equals_the_reference(ort_device, channels):
    """The embedding model's block: a convolution, LEAKY_RELU 0.2, MAXIMUM -0.4, a convolution,
    on 16 channels or 24 computed padded to 32 (no Slice back, no Max): the outputs the
    reference's within float32 summation order."""
    model = _leaky_floor_model([1, 6, 5, 8], 0.2, -0.4, conv_channels=channels)
    types = lowered_node_types(model)
    assert "Clip" in types and not {"Max", "Slice", "LeakyRelu"} & set(types)
    value = np.random.default_rng(2).uniform(-3, 3, (1, 6, 5, 8)).astype(np.float32)
    ours, theirs = (run_on(model, device, [value], [np.zeros((1, 6, 5, 16), np.float32)])[0]
                    for device in (ort_device, reference_device()))
    assert np.abs(ours - theirs).max() <= 2e-6 * np.abs(theirs).max()
    assert len(np.unique(ours)) > 400


@pytest.mark.parametrize("alpha, floor", [(0.01, -0.4), (0.2, 0.5), (-0.2, -0.4)])
def test_other_floors_keep_leaky_relu_and_max(ort_device, alpha, floor):
    """No input of 0.01 * t rounds to -0.4; a floor above zero; a negative slope: LeakyRelu
    then Max, the reference's values bit for bit."""
    shape = [1, 6, 5, 16]
    model = _leaky_floor_model(shape, alpha, floor)
    types = lowered_node_types(model)
    assert "LeakyRelu" in types and "Max" in types
    value = _input(shape, 4)
    ours, theirs = (run_on(model, device, [value], [np.zeros(shape, np.float32)])[0]
                    for device in (ort_device, reference_device()))
    np.testing.assert_array_equal(ours, theirs)


#: x scale, x zero point, stored alpha, alpha scale, alpha zero point, y scale, y zero point
_UNIFORM_QUANTIZATIONS = [
    (0.05, 120, 1, 0.2, 0, 0.04, 100),  # the importer's int8 LEAKY_RELU: alpha 1 step of scale 0.2
    (0.1, 128, 3, 0.1, 0, 0.1, 128),
    (0.02, 200, 100, 0.01, 120, 0.03, 20),  # a negative alpha, -0.2
]


def _uniform_quantized_model(code: int, quantization: tuple, alpha_shape: list[int]) -> nnapi.Model:
    xs, xz, a_raw, a_scale, a_zero, ys, yz = quantization
    low = -128 if code == T.TENSOR_QUANT8_ASYMM_SIGNED else 0
    channels = alpha_shape[-1]
    model = nnapi.Model()
    x = model.add_operand(OperandType(code, [1, 16, 16, channels], xs, xz + low))
    a = model.add_operand(OperandType(code, alpha_shape, a_scale, a_zero + low))
    model.set_operand_value(a, np.full(alpha_shape, a_raw + low, np.int8 if low else np.uint8))
    y = model.add_operand(OperandType(code, [1, 16, 16, channels], ys, yz + low))
    model.add_operation(Op.PRELU, [x, a], [y])
    model.identify_inputs_and_outputs([x], [y])
    model.finish()
    return model


def _uniform_form(types: list[str]) -> str:
    """The form of a quantized PRELU of one alpha value: the float form as it is, corrected
    on a few values (Where), or the reference's table (Gather)."""
    return "table" if "Gather" in types else "corrected" if "Where" in types else "leaky_relu"


@pytest.mark.parametrize("code", [T.TENSOR_QUANT8_ASYMM, T.TENSOR_QUANT8_ASYMM_SIGNED])
@pytest.mark.parametrize("quantization", _UNIFORM_QUANTIZATIONS)
@pytest.mark.parametrize("alpha_shape", [[1], [1, 1, 3]])  # one value, or one value in every channel
def test_quantized_uniform_prelu_is_the_references_fixed_point(ort_device, code, quantization, alpha_shape):
    """A quantized PRELU of one alpha value: DequantizeLinear, LeakyRelu, QuantizeLinear (ORT
    makes them one QLinearLeakyRelu table) where a probe shows that float form gives the
    reference's fixed point (Android's two quantized multipliers) on every stored value;
    where it misses on a few values (elementwise.proven_or_table), that form with each of
    them set by a Where; else a Gather from the reference's table; the reference's values
    every way."""
    from nnapi.drivers.ort.elementwise import _CORRECTIONS

    xs, xz, a_raw, a_scale, a_zero, ys, yz = quantization
    low = -128 if code == T.TENSOR_QUANT8_ASYMM_SIGNED else 0
    dtype = np.int8 if low else np.uint8
    model = _uniform_quantized_model(code, quantization, alpha_shape)
    types = lowered_node_types(model)
    channels = alpha_shape[-1]
    stored = np.repeat((np.arange(256) + low).astype(dtype), channels).reshape(1, 16, 16, channels)
    ours, theirs = (run_on(model, device, [stored], [np.zeros_like(stored)])[0]
                    for device in (ort_device, reference_device()))
    np.testing.assert_array_equal(ours, theirs)
    real = (stored.astype(np.int32) - (xz + low)).astype(np.float32) * np.float32(xs)
    alpha = np.float32(a_raw - a_zero) * np.float32(a_scale)
    rounded_once = np.clip(np.rint(np.where(real >= 0, real, real * alpha) / np.float32(ys)) + yz + low, low, low + 255)
    differing = np.unique(stored[rounded_once.astype(dtype) != theirs])
    if differing.size == 0:
        assert types.count("LeakyRelu") == 1 and not {"Relu", "Min", "Mul", "Gather", "Where"} & set(types)
    elif differing.size <= _CORRECTIONS:  # the float form rounds once where the fixed point rounds twice
        assert types.count("LeakyRelu") == 1 and types.count("Where") == differing.size and "Gather" not in types
    else:
        assert "Gather" in types and "LeakyRelu" not in types
    assert len(np.unique(ours[real < 0])) > 10  # the negative side scaled, not clamped


def test_quantized_uniform_prelu_forms_all_occur():
    """Of the quantizations above, the float form is exact for one, corrected on a few
    values for another, and replaced by the table for the third (so every branch of the
    test above runs)."""
    forms = [_uniform_form(lowered_node_types(_uniform_quantized_model(T.TENSOR_QUANT8_ASYMM, quantization, [1])))
             for quantization in _UNIFORM_QUANTIZATIONS]
    assert forms == ["table", "corrected", "leaky_relu"]


@pytest.mark.parametrize("code", [T.TENSOR_QUANT8_ASYMM, T.TENSOR_QUANT8_ASYMM_SIGNED])
@pytest.mark.parametrize("alpha_shape", [[4], [1, 1, 4], [16, 1]])
def test_quantized_prelu_of_several_alphas_is_the_references_table(ort_device, code, alpha_shape):
    """A quantized PRELU of a constant alpha with several values: a Gather from the
    reference's table of every stored value against every alpha value, indexed by the
    internal value times their count plus alpha's position (broadcast as PRELU does);
    the reference's values for every stored value against every alpha."""
    low = -128 if code == T.TENSOR_QUANT8_ASYMM_SIGNED else 0
    dtype = np.int8 if low else np.uint8
    rng = np.random.default_rng(9)
    alpha_values = (rng.integers(0, 256, size=alpha_shape) + low).astype(dtype)
    model = nnapi.Model()
    x = model.add_operand(OperandType(code, [1, 16, 16, 4], 0.05, 120 + low))
    a = model.add_operand(OperandType(code, alpha_shape, 0.01, 100 + low))
    model.set_operand_value(a, alpha_values)
    y = model.add_operand(OperandType(code, [1, 16, 16, 4], 0.03, 90 + low))
    model.add_operation(Op.PRELU, [x, a], [y])
    model.identify_inputs_and_outputs([x], [y])
    model.finish()
    types = lowered_node_types(model)
    assert "Gather" in types and "LeakyRelu" not in types and "QuantizeLinear" not in types
    # pixel p holds stored value p in all 4 channels: every value against every alpha
    feed = np.repeat((np.arange(256) + low).astype(dtype), 4).reshape(1, 16, 16, 4)
    ours, theirs = (run_on(model, device, [feed], [np.zeros_like(feed)])[0]
                    for device in (ort_device, reference_device()))
    np.testing.assert_array_equal(ours, theirs)
    assert len(np.unique(theirs)) > 100  # the negative side scaled by several alphas


def test_quantized_prelu_of_an_alpha_given_at_run_time_is_the_pair_table(ort_device):
    """An alpha the model receives (or computes) indexes the table of every pair of stored
    values: the reference's values for all 65,536 pairs."""
    code = T.TENSOR_QUANT8_ASYMM_SIGNED
    model = nnapi.Model()
    x = model.add_operand(OperandType(code, [256, 256], 0.05, -8))
    a = model.add_operand(OperandType(code, [256, 256], 0.01, 20))
    y = model.add_operand(OperandType(code, [256, 256], 0.03, -38))
    model.add_operation(Op.PRELU, [x, a], [y])
    model.identify_inputs_and_outputs([x, a], [y])
    model.finish()
    assert "Gather" in lowered_node_types(model)
    stored = np.arange(-128, 128).astype(np.int8)
    xs, alphas = (np.ascontiguousarray(v) for v in np.meshgrid(stored, stored, indexing="ij"))
    ours, theirs = (run_on(model, device, [xs, alphas], [np.zeros_like(xs)])[0]
                    for device in (ort_device, reference_device()))
    np.testing.assert_array_equal(ours, theirs)
