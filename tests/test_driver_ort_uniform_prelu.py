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
    alpha, far below it, zeros, infinities, NaN. MAXIMUM(c, PRELU(x)) keeps LeakyRelu:
    its value for a NaN x is c (Android's std::max keeps its first input), which this
    form would give as NaN."""
    shape = [1, 6, 5, 16]
    model = _leaky_floor_model(shape, alpha, floor, floor_first=floor_first)
    types = lowered_node_types(model)
    if floor_first:
        assert "LeakyRelu" in types
    else:
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
    then the MAXIMUM (Clip of its one constant), the reference's values bit for bit."""
    shape = [1, 6, 5, 16]
    model = _leaky_floor_model(shape, alpha, floor)
    types = lowered_node_types(model)
    assert "LeakyRelu" in types and "Clip" in types
    value = _input(shape, 4)
    ours, theirs = (run_on(model, device, [value], [np.zeros(shape, np.float32)])[0]
                    for device in (ort_device, reference_device()))
    np.testing.assert_array_equal(ours, theirs)


#: x scale, x zero point, stored alpha, alpha scale, alpha zero point, y scale, y zero point
#: (unsigned; int8 takes each zero point and stored value less 128), and the ORT form
_UNIFORM_QUANTIZATIONS = [
    # the importer's LEAKY_RELU (alpha one step of scale alpha): the fixed point rounds the
    # negative side twice (exponent -2 and -3), where one table rounds once (the float form
    # of the model's scales missed 26 values here and 17 on YOLO's, so the Gather ran)
    ((0.05, 120, 1, 0.2, 0, 0.04, 100), "two tables"),
    ((0.011826866306364536, 131, 1, 0.1, 0, 0.006353872362524271, 24), "two tables"),  # yolo_tiny_int8's first
    ((0.1, 128, 3, 0.1, 0, 0.1, 128), "one table"),  # the model's scales missed 2 values (2 Where)
    ((0.0038, 197, 125, 0.00562, 122, 0.0013, 115), "one table corrected"),  # alpha of 3 steps: no two tables
    ((0.028, 146, 148, 0.00962, 83, 0.0762, 186), "table"),  # 65 steps: no table within 4 values
    ((0.02, 200, 100, 0.01, 120, 0.03, 20), "leaky_relu"),  # a negative alpha, -0.2: exact as it is
    ((0.0119, 78, 0, 0.00997, 12, 0.0096, 28), "leaky_relu corrected"),  # negative, 1-4 values off
    ((0.0812, 145, 7, 0.00479, 105, 0.1823, 170), "table"),  # negative, more off
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
    """The form of a quantized PRELU of one alpha value: leaky_tables.py's QLinearLeakyRelu
    tables (one or two), the float form of the model's scales as it is (LeakyRelu), either
    corrected on a few values (Where), or the reference's table (Gather)."""
    if "Gather" in types:
        return "table"
    tables = types.count("QLinearLeakyRelu")
    form = {0: "leaky_relu", 1: "one table", 2: "two tables"}[tables]
    assert types.count("LeakyRelu") == (0 if tables else 1)
    return form + " corrected" if "Where" in types else form


def _all_stored(code: int, channels: int) -> np.ndarray:
    """Pixel p holds stored value p in every channel: [1, 16, 16, channels]."""
    low = -128 if code == T.TENSOR_QUANT8_ASYMM_SIGNED else 0
    dtype = np.int8 if low else np.uint8
    return np.repeat((np.arange(256) + low).astype(dtype), channels).reshape(1, 16, 16, channels)


@pytest.mark.parametrize("code", [T.TENSOR_QUANT8_ASYMM, T.TENSOR_QUANT8_ASYMM_SIGNED])
@pytest.mark.parametrize(("quantization", "form"), _UNIFORM_QUANTIZATIONS)
@pytest.mark.parametrize("alpha_shape", [[1], [1, 1, 3]])  # one value, or one value in every channel
def test_quantized_uniform_prelu_is_the_references_fixed_point(ort_device, code, quantization, form, alpha_shape):
    """A quantized PRELU of one alpha value: one or two QLinearLeakyRelu tables whose
    float parameters leaky_tables.py searched (some with a few values corrected by Where),
    else DequantizeLinear, LeakyRelu, QuantizeLinear at the model's scales (ORT makes them one
    QLinearLeakyRelu table), as it is or corrected, else a Gather from the reference's
    table; each where a probe of all 256 stored values in ORT shows it gives the
    reference's fixed point (Android's two quantized multipliers), which it then equals on
    every stored value."""
    model = _uniform_quantized_model(code, quantization, alpha_shape)
    assert _uniform_form(lowered_node_types(model)) == form
    stored = _all_stored(code, alpha_shape[-1])
    ours, theirs = (run_on(model, device, [stored], [np.zeros_like(stored)])[0]
                    for device in (ort_device, reference_device()))
    np.testing.assert_array_equal(ours, theirs)
    xs, xz, a_raw, a_scale, a_zero, ys, yz = quantization
    assert len(np.unique(ours[stored.astype(np.int32) - stored.min() < xz])) > 10  # the negative side scaled


def test_the_model_scales_miss_where_the_tables_are_taken():
    """The quantizations above where tables are taken are ones the float form of the
    model's own scales (one rounding, as ORT's QLinearLeakyRelu of them computes) misses on
    some stored values: the two-table ones on more than the 4 that Where corrects (so
    before leaky_tables.py the Gather ran), the one-table one on a few."""
    from nnapi.operations.quant_math import prelu_fixed_point

    for (xs, xz, a_raw, a_scale, a_zero, ys, yz), form in _UNIFORM_QUANTIZATIONS:
        offsets = np.arange(256) - xz
        reference = prelu_fixed_point(offsets, a_raw - a_zero, xs, a_scale, ys, yz, 0, 255)
        real = offsets.astype(np.float32) * np.float32(xs)
        alpha = np.float32(a_raw - a_zero) * np.float32(a_scale)
        rounded_once = np.clip(np.rint(np.where(real >= 0, real, real * alpha) / np.float32(ys)) + yz, 0, 255)
        misses = int(np.sum(rounded_once != reference))
        if form == "two tables":
            assert misses > 4
        elif form.endswith("table") or form.endswith("corrected"):
            assert misses > 0


@pytest.mark.parametrize("code", [T.TENSOR_QUANT8_ASYMM, T.TENSOR_QUANT8_ASYMM_SIGNED])
def test_the_importers_leaky_relu_is_tables_on_random_quantizations(ort_device, code):
    """The importer's quantized LEAKY_RELU (alpha one step of scale alpha) on random
    quantizations and slopes: one or two tables every time, no correction and no Gather,
    with the reference's values on all 256 stored values."""
    rng = np.random.default_rng(3)
    for _ in range(12):
        xs = float(10 ** rng.uniform(-3, -0.5))
        quantization = (xs, int(rng.integers(0, 256)), 1, float(rng.choice([0.01, 0.05, 0.1, 0.2, 0.3])), 0,
                        xs * float(10 ** rng.uniform(-0.7, 0.7)), int(rng.integers(0, 256)))
        model = _uniform_quantized_model(code, quantization, [1])
        assert _uniform_form(lowered_node_types(model)) in ("one table", "two tables"), quantization
        stored = _all_stored(code, 1)
        ours, theirs = (run_on(model, device, [stored], [np.zeros_like(stored)])[0]
                        for device in (ort_device, reference_device()))
        np.testing.assert_array_equal(ours, theirs, err_msg=str(quantization))


def test_leaky_tables_give_the_fixed_point_in_their_float_arithmetic():
    """leaky_tables.py on its own (no ONNX Runtime): for 300 random quantizations of the
    importer's LEAKY_RELU, tables are found, without corrections, and their float32
    arithmetic (ORT's, copied) gives quant_math.prelu_fixed_point on every stored value;
    two tables exactly where a side's multiplier exponent is negative and one rounding
    misses; none for an alpha <= 0."""
    from nnapi.drivers.ort.leaky_tables import apply_tables, leaky_tables
    from nnapi.operations.quant_math import prelu_fixed_point

    rng = np.random.default_rng(11)
    counts = {1: 0, 2: 0}
    for _ in range(300):
        xs = float(np.float32(10 ** rng.uniform(-3, -0.5)))
        ys = float(np.float32(xs * 10 ** rng.uniform(-0.7, 0.7)))
        a_scale = float(np.float32(rng.choice([0.01, 0.05, 0.1, 0.2, 0.3])))
        xz, yz = int(rng.integers(0, 256)), int(rng.integers(0, 256))
        table = prelu_fixed_point(np.arange(256) - xz, 1, xs, a_scale, ys, yz, 0, 255)
        found = leaky_tables(table, xz, yz, 1, xs, a_scale, ys)
        assert found is not None and found[1].size == 0, (xs, xz, a_scale, ys, yz)
        tables = found[0]
        np.testing.assert_array_equal(apply_tables(tables, np.arange(256)), table)
        counts[len(tables)] += 1
        assert leaky_tables(table, xz, yz, 0, xs, a_scale, ys, 4) is None
        assert leaky_tables(table, xz, yz, -1, xs, a_scale, ys, 4) is None
    assert counts[1] > 50 and counts[2] > 50


def test_tables_are_taken_only_where_onnx_runtime_proves_them(ort_device, monkeypatch):
    """Tables whose float copy is right but which ORT computes otherwise are never taken:
    with the search answering a table of a slope a step off, the probe in ORT differs from
    the reference and the PRELU keeps the Gather, with the reference's values."""
    from nnapi.drivers.ort import uniform_prelu

    def off(*args, **kwargs):
        found = uniform_prelu_leaky_tables(*args, **kwargs)
        alpha, scale, zero_point, output_zero_point = found[0][-1]
        return [*found[0][:-1], (alpha * 1.25, scale, zero_point, output_zero_point)], found[1]

    uniform_prelu_leaky_tables = uniform_prelu.leaky_tables
    monkeypatch.setattr(uniform_prelu, "leaky_tables", off)
    monkeypatch.setattr(uniform_prelu, "_TABLES_PROVEN", {})
    code = T.TENSOR_QUANT8_ASYMM_SIGNED
    model = _uniform_quantized_model(code, _UNIFORM_QUANTIZATIONS[0][0], [1])
    assert _uniform_form(lowered_node_types(model)) == "table"
    stored = _all_stored(code, 1)
    ours, theirs = (run_on(model, device, [stored], [np.zeros_like(stored)])[0]
                    for device in (ort_device, reference_device()))
    np.testing.assert_array_equal(ours, theirs)


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
def _pooled_prelu_model(code: int, alpha_step: int, scheme: int, filter_size: int, fuse: int = 0,
                        prelu_is_output: bool = False) -> nnapi.Model:
    """PRELU (the importer's LEAKY_RELU quantization, alpha ``alpha_step`` steps of 0.1) of
    [1, 16, 16, 3], then MAX_POOL_2D of ``filter_size`` stride 2 (padding ``scheme``: 1 SAME,
    2 VALID) with fused activation ``fuse``."""
    low = -128 if code == T.TENSOR_QUANT8_ASYMM_SIGNED else 0
    dtype = np.int8 if low else np.uint8
    model = nnapi.Model()
    operand = operand_adder(model)
    x = operand(code, [1, 16, 16, 3], scale=0.011826866306364536, zero_point=131 + low)
    alpha = operand(code, [1], np.array([alpha_step + 100 + low], dtype), 0.1, 100 + low)
    y = operand(code, [1, 16, 16, 3], scale=0.006353872362524271, zero_point=24 + low)
    model.add_operation(Op.PRELU, [x, alpha], [y])
    side = 8 if scheme == 1 else (16 - filter_size) // 2 + 1
    pooled = operand(code, [1, side, side, 3], scale=0.006353872362524271, zero_point=24 + low)
    scalars = [operand(T.INT32, [], np.array(v, np.int32)) for v in (scheme, 2, 2, filter_size, filter_size, fuse)]
    model.add_operation(Op.MAX_POOL_2D, [y, *scalars], [pooled])
    model.identify_inputs_and_outputs([x], [pooled, y] if prelu_is_output else [pooled])
    model.finish()
    return model


def _every_stored_value_in_every_window(code: int) -> np.ndarray:
    """[1, 16, 16, 3] holding each stored value 3 times, shuffled (seeded)."""
    low = -128 if code == T.TENSOR_QUANT8_ASYMM_SIGNED else 0
    values = np.random.default_rng(4).permutation(np.repeat(np.arange(256), 3)) + low
    return values.astype(np.int8 if low else np.uint8).reshape(1, 16, 16, 3)


@pytest.mark.parametrize("code", [T.TENSOR_QUANT8_ASYMM, T.TENSOR_QUANT8_ASYMM_SIGNED])
@pytest.mark.parametrize(("scheme", "filter_size"), [(2, 2), (1, 3), (2, 3)])
@pytest.mark.parametrize("alpha_step", [1, 0])
def test_a_max_pool_of_a_quantized_leaky_relu_runs_first(ort_device, code, scheme, filter_size, alpha_step):
    """pooled_prelu.py: MAX_POOL_2D(PRELU(x)) of an 8-bit PRELU of one alpha >= 0 runs as
    PRELU(MAX_POOL_2D(x)) (a non-decreasing function of the stored value commutes with the
    largest of a window; SAME padding's edges take no padding value): the pool first in the
    lowered graph, its tables on the pooled values, the reference's values."""
    model = _pooled_prelu_model(code, alpha_step, scheme, filter_size)
    types = lowered_node_types(model)
    assert "MaxPool" in types and types.index("MaxPool") < _first_prelu_node(types)
    x = _every_stored_value_in_every_window(code)
    out = np.zeros(_pooled_shape(model), x.dtype)
    ours, theirs = (run_on(model, device, [x], [np.zeros_like(out)])[0] for device in (ort_device, reference_device()))
    np.testing.assert_array_equal(ours, theirs)
    assert len(np.unique(theirs)) > 20


def _first_prelu_node(types: list[str]) -> int:
    """The position of the first node of a quantized PRELU's forms (tables, the float form
    of the model's scales, the Gather of the reference's table)."""
    return min(k for k, t in enumerate(types) if t in ("QLinearLeakyRelu", "DequantizeLinear", "Gather"))


def _pooled_shape(model: nnapi.Model) -> list[int]:
    return list(model.operand_type(model.outputs[0]).dimensions)


@pytest.mark.parametrize(("alpha_step", "fuse", "prelu_is_output"), [
    (-1, 0, False),  # a negative alpha: PRELU decreases on the negative side, max does not commute
    (1, 1, False),   # the pool's fused RELU
    (1, 0, True),    # the PRELU's values read elsewhere too (a model output)
])
def test_other_max_pools_of_a_quantized_prelu_stay_after_it(ort_device, alpha_step, fuse, prelu_is_output):
    """Where the order matters or the PRELU's values are needed as they are, the PRELU runs
    first, with the reference's values."""
    code = T.TENSOR_QUANT8_ASYMM_SIGNED
    model = _pooled_prelu_model(code, alpha_step, 2, 2, fuse, prelu_is_output)
    types = lowered_node_types(model)
    assert "MaxPool" in types and _first_prelu_node(types) < types.index("MaxPool")
    x = _every_stored_value_in_every_window(code)
    outputs = [np.zeros(_pooled_shape(model), x.dtype)] + ([np.zeros_like(x)] if prelu_is_output else [])
    ours, theirs = (run_on(model, device, [x], [np.zeros_like(o) for o in outputs])
                    for device in (ort_device, reference_device()))
    for mine, reference in zip(ours, theirs, strict=True):
        np.testing.assert_array_equal(mine, reference)
