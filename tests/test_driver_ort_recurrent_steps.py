"""nnapi-ort-cpu's forms for the operations of an unrolled recurrent layer's steps, which
run on tiny values where ONNX Runtime's cost per node is most of the run: a quantized
product of one pixel or of few rows as one QGemm (no Reshapes to and from an image), the
steps' rows of an 8-bit SPLIT cut by one Split, an 8-bit RESHAPE that only drops leading
1s before a broadcasting ADD / MUL left out, 8-bit TANH as one QLinearSigmoid and 8-bit
SUB of a one-element constant as one QLinearAdd (each where a probe of all 256 stored
values proves it), PACK as one Concat and a Reshape. Each model's lowered nodes are
counted, and its outputs compared with the general form's and nnapi-reference's (TANH
and SUB bit for bit on every stored value, PACK exactly)."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

import nnapi  # noqa: E402
from helpers import constant, lowered_node_types, operand_adder, reference_device, run_on  # noqa: E402
from nnapi import OperandCode as T  # noqa: E402
from nnapi import OperationCode as Op  # noqa: E402
from nnapi.drivers.ort.device import OrtDevice  # noqa: E402
from nnapi.runtime.model_builder import build_hal_model  # noqa: E402

pytestmark = pytest.mark.usefixtures("calibration_file")

_CODES = {"uint8": T.TENSOR_QUANT8_ASYMM, "int8": T.TENSOR_QUANT8_ASYMM_SIGNED}
_RANGES = {"uint8": (0, 255), "int8": (-128, 127)}
#: the nodes that carry an int8 model input / output to and from the driver's uint8
_SHIFTS = ("Cast", "Add")


def _both(model: nnapi.Model, ort_device: nnapi.Device, inputs: list[np.ndarray],
          outputs: list[np.ndarray]) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """``model``'s outputs on nnapi-ort-cpu and on nnapi-reference."""
    ours = run_on(model, ort_device, inputs, [np.zeros_like(o) for o in outputs])
    theirs = run_on(model, reference_device(), inputs, [np.zeros_like(o) for o in outputs])
    return ours, theirs


def _computing(types: list[str]) -> list[str]:
    """The lowered node types less the int8 input / output shifts."""
    return [t for t in types if t not in _SHIFTS]


# --- a quantized product of one pixel, or of few rows, as QGemm ---------------------------

def _one_pixel_model(kind: str, per_channel: bool, fuse: int, rng: np.random.Generator,
                     reshaped_output: bool = True, image: tuple[int, int, int] = (2, 1, 1)
                     ) -> tuple[nnapi.Model, np.ndarray, tuple[int, ...]]:
    """RESHAPE [2, K] -> [2, 1, 1, K], CONV_2D 1x1 (SAME), RESHAPE -> [2, N] (a TFLite
    int8 recurrent step's product), or the CONV_2D's output itself; ``image``: the
    [batch, height, width] the rows are reshaped to (the same products on other pixels)."""
    depth, units, code = 12, 20, _CODES[kind]
    low, high = _RANGES[kind]
    model = nnapi.Model()
    inputs: list[int] = []
    values: list[np.ndarray] = []
    op = operand_adder(model, inputs, values)
    x = op(code, [2, depth], rng.integers(low, high + 1, (2, depth)).astype(kind), 0.02, low + 100, given=True)
    x4 = op(code, [*image, depth], scale=0.02, zero_point=low + 100)
    model.add_operation(Op.RESHAPE, [x, op(T.TENSOR_INT32, [4], np.array([*image, depth], np.int32))], [x4])
    if per_channel:
        w = model.add_operand(nnapi.OperandType(T.TENSOR_QUANT8_SYMM_PER_CHANNEL, [units, 1, 1, depth]))
        scales = rng.uniform(0.002, 0.02, units).astype(np.float32)
        model.set_operand_symm_per_channel_quant_params(w, nnapi.SymmPerChannelQuantParams(0, scales.tolist()))
        model.set_operand_value(w, rng.integers(-127, 128, (units, 1, 1, depth)).astype(np.int8))
        bias = op(T.TENSOR_INT32, [units], rng.integers(-3000, 3000, units).astype(np.int32))
    else:
        w = op(code, [units, 1, 1, depth], rng.integers(low, high + 1, (units, 1, 1, depth)).astype(kind),
               0.01, low + 140)
        bias = op(T.TENSOR_INT32, [units], rng.integers(-3000, 3000, units).astype(np.int32), 0.02 * 0.01)
    scalars = [constant(model, T.INT32, v) for v in (1, 1, 1, fuse)]  # SAME, strides 1, 1, fuse
    y4 = op(code, [*image, units], scale=0.05, zero_point=low + 120)
    model.add_operation(Op.CONV_2D, [x4, w, bias, *scalars], [y4])
    if reshaped_output:
        y = op(code, [2, units], scale=0.05, zero_point=low + 120)
        model.add_operation(Op.RESHAPE, [y4, op(T.TENSOR_INT32, [2], np.array([2, units], np.int32))], [y])
    else:
        y = y4
    model.identify_inputs_and_outputs(inputs, [y])
    model.finish()
    shape = (2, units) if reshaped_output else (*image, units)
    return model, values[0], shape


@pytest.mark.parametrize("kind", ["uint8", "int8"])
@pytest.mark.parametrize("per_channel", [True, False])
@pytest.mark.parametrize("fuse", [0, 1])
def test_one_pixel_convolution_is_one_qgemm(ort_device, kind, per_channel, fuse):
    """A 1x1 CONV_2D of 1x1 images between RESHAPEs: one QGemm of the rows, no Reshape or
    QLinearConv (the two RESHAPEs and the image's were three ORT nodes per step). Its
    values are bit for bit those of the same products as a QLinearConv (the rows as two
    pixels of one image: the general lowering), over many inputs; the reference's within
    a step (QLinearConv's float32 rescale, not Android's fixed point, is a step off on a
    few values, as before)."""
    if kind == "uint8" and per_channel:
        pytest.skip("per-channel weights go with int8 activations")
    model, _, shape = _one_pixel_model(kind, per_channel, fuse, np.random.default_rng(7))
    types = _computing(lowered_node_types(model))
    assert types == ["QGemm"] + (["Clip"] if fuse else []), types
    twin, _, _ = _one_pixel_model(kind, per_channel, fuse, np.random.default_rng(7), image=(1, 2, 1))
    assert "QLinearConv" in lowered_node_types(twin)
    rng = np.random.default_rng(17)
    low, high = _RANGES[kind]
    for _ in range(20):
        x = rng.integers(low, high + 1, (2, 12)).astype(kind)
        ours, theirs = _both(model, ort_device, [x], [np.zeros(shape, kind)])
        conv = run_on(twin, ort_device, [x], [np.zeros(shape, kind)])
        np.testing.assert_array_equal(ours[0], conv[0])
        assert np.abs(ours[0].astype(np.int32) - theirs[0]).max() <= 1


def test_one_pixel_convolution_read_as_an_image_keeps_its_shape(ort_device):
    """The product's output read as the [N, 1, 1, units] image itself (a graph output here):
    QGemm and one Reshape to the image; the reference's values bit for bit."""
    rng = np.random.default_rng(8)
    model, x, shape = _one_pixel_model("uint8", False, 0, rng, reshaped_output=False)
    assert _computing(lowered_node_types(model)) == ["QGemm", "Reshape"]
    ours, theirs = _both(model, ort_device, [x], [np.zeros(shape, np.uint8)])
    np.testing.assert_array_equal(ours[0], theirs[0])


@pytest.mark.parametrize("rows", [1, 3])
def test_fully_connected_of_few_rows_is_one_qgemm(ort_device, rows):
    """A quantized FULLY_CONNECTED of fewer rows than _ROWS_AS_PIXELS: one QGemm where a
    Reshape, a 1x1 QLinearConv and a Reshape were three nodes; bit for bit the reference's."""
    rng = np.random.default_rng(9)
    depth, units = 16, 10
    model = nnapi.Model()
    inputs: list[int] = []
    values: list[np.ndarray] = []
    op = operand_adder(model, inputs, values)
    x = op(T.TENSOR_QUANT8_ASYMM, [rows, depth], None, 0.03, 120, given=True)
    w = op(T.TENSOR_QUANT8_ASYMM, [units, depth], rng.integers(0, 256, (units, depth)).astype(np.uint8), 0.01, 131)
    bias = op(T.TENSOR_INT32, [units], rng.integers(-2000, 2000, units).astype(np.int32), 0.03 * 0.01)
    y = op(T.TENSOR_QUANT8_ASYMM, [rows, units], scale=0.08, zero_point=100)
    model.add_operation(Op.FULLY_CONNECTED, [x, w, bias, constant(model, T.INT32, 0)], [y])
    model.identify_inputs_and_outputs(inputs, [y])
    model.finish()
    assert lowered_node_types(model) == ["QGemm"]
    for _ in range(20):
        feed = rng.integers(0, 256, (rows, depth)).astype(np.uint8)
        ours, theirs = _both(model, ort_device, [feed], [np.zeros((rows, units), np.uint8)])
        np.testing.assert_array_equal(ours[0], theirs[0])


def test_large_one_row_products_keep_the_convolution():
    """From CLASSIFIER_MIN_WEIGHTS weights (a classifier's 1024 x 1001) the 1x1 QLinearConv
    stays, as fast as QGemm there or faster: a FULLY_CONNECTED of one row by [512, 512]
    weights, and one by [511, 512] below the bound as QGemm."""
    from nnapi.drivers.ort.convolutions import CLASSIFIER_MIN_WEIGHTS

    assert 512 * 512 >= CLASSIFIER_MIN_WEIGHTS > 511 * 512
    for units, expected, other in ((512, "QLinearConv", "QGemm"), (511, "QGemm", "QLinearConv")):
        model = nnapi.Model()
        inputs: list[int] = []
        values: list[np.ndarray] = []
        op = operand_adder(model, inputs, values)
        x = op(T.TENSOR_QUANT8_ASYMM, [1, 512], None, 0.03, 120, given=True)
        w = op(T.TENSOR_QUANT8_ASYMM, [units, 512], np.full((units, 512), 131, np.uint8), 0.01, 128)
        bias = op(T.TENSOR_INT32, [units], np.zeros(units, np.int32), 0.03 * 0.01)
        y = op(T.TENSOR_QUANT8_ASYMM, [1, units], scale=0.08, zero_point=100)
        model.add_operation(Op.FULLY_CONNECTED, [x, w, bias, constant(model, T.INT32, 0)], [y])
        model.identify_inputs_and_outputs(inputs, [y])
        model.finish()
        types = lowered_node_types(model)
        assert expected in types and other not in types, types

# --- the steps' rows and their broadcast products -------------------------------------------

@pytest.mark.parametrize("kind", ["uint8", "int8"])
def test_split_rows_of_8_bit_steps_are_one_split(ort_device, kind):
    """An 8-bit [T, 1, K] SPLIT into its T rows, each RESHAPEd to [1, K] (an unrolled int8
    layer's time steps): one Reshape and one Split (there were a Split and a Reshape per
    step); the rows bit for bit."""
    steps, depth, code = 5, 6, _CODES[kind]
    low, high = _RANGES[kind]
    model = nnapi.Model()
    inputs: list[int] = []
    values: list[np.ndarray] = []
    op = operand_adder(model, inputs, values)
    x = op(code, [steps, 1, depth], None, 0.1, low + 3, given=True)
    parts = [op(code, [1, 1, depth], scale=0.1, zero_point=low + 3) for _ in range(steps)]
    model.add_operation(Op.SPLIT, [x, constant(model, T.INT32, 0), constant(model, T.INT32, steps)], parts)
    rows = [op(code, [1, depth], scale=0.1, zero_point=low + 3) for _ in range(steps)]
    for part, row in zip(parts, rows):
        model.add_operation(Op.RESHAPE, [part, op(T.TENSOR_INT32, [2], np.array([1, depth], np.int32))], [row])
    model.identify_inputs_and_outputs(inputs, rows)
    model.finish()
    assert _computing(lowered_node_types(model)) == ["Reshape", "Split"]
    feed = np.random.default_rng(3).integers(low, high + 1, (steps, 1, depth)).astype(kind)
    ours, theirs = _both(model, ort_device, [feed], [np.zeros((1, depth), kind) for _ in range(steps)])
    for step in range(steps):
        np.testing.assert_array_equal(ours[step], feed[step])
        np.testing.assert_array_equal(theirs[step], feed[step])


def _broadcast_model(code: int, reshaped: bool) -> nnapi.Model:
    """ADD / MUL of an 8-bit [1, K] value, RESHAPEd to [K] first or not, and a [1, K] one."""
    depth = 32
    model = nnapi.Model()
    inputs: list[int] = []
    values: list[np.ndarray] = []
    op = operand_adder(model, inputs, values)
    a = op(T.TENSOR_QUANT8_ASYMM, [1, depth], None, 0.05, 120, given=True)
    b = op(T.TENSOR_QUANT8_ASYMM, [1, depth], None, 0.07, 130, given=True)
    if reshaped:
        flat = op(T.TENSOR_QUANT8_ASYMM, [depth], scale=0.05, zero_point=120)
        model.add_operation(Op.RESHAPE, [a, op(T.TENSOR_INT32, [1], np.array([depth], np.int32))], [flat])
        a = flat
    y = op(T.TENSOR_QUANT8_ASYMM, [1, depth], scale=0.1, zero_point=128)
    model.add_operation(code, [a, b, constant(model, T.INT32, 0)], [y])
    model.identify_inputs_and_outputs(inputs, [y])
    model.finish()
    return model


@pytest.mark.parametrize("code", [Op.ADD, Op.MUL])
def test_8_bit_reshape_dropping_leading_ones_before_a_broadcast_runs_nothing(ort_device, code):
    """An 8-bit [1, K] value RESHAPEd to [K] and read only by a quantized ADD / MUL with a
    [1, K] value (an unrolled int8 LSTM's recurrent product before its ADD): the [1, K]
    value itself broadcasts to the same elements, no Reshape; the values bit for bit those
    of the operation on the [1, K] value (and the reference's within a step, QLinearAdd's
    as ever)."""
    model, twin = _broadcast_model(code, True), _broadcast_model(code, False)
    assert lowered_node_types(model) == ["QLinearAdd" if code == Op.ADD else "QLinearMul"]
    rng = np.random.default_rng(4)
    for _ in range(10):
        feeds = [rng.integers(0, 256, (1, 32)).astype(np.uint8) for _ in range(2)]
        ours, theirs = _both(model, ort_device, feeds, [np.zeros((1, 32), np.uint8)])
        np.testing.assert_array_equal(ours[0], run_on(twin, ort_device, feeds, [np.zeros((1, 32), np.uint8)])[0])
        assert np.abs(ours[0].astype(np.int32) - theirs[0]).max() <= 1


# --- 8-bit TANH and SUB of a constant, each one node where proven -------------------------

def _quantizations(kind: str, seed: int, count: int = 6) -> list[tuple[float, int]]:
    rng = np.random.default_rng(seed)
    low, high = _RANGES[kind]
    return [(float(np.float32(10 ** rng.uniform(-3, 0))), int(rng.integers(low, high + 1))) for _ in range(count)]


def _unary_model(kind: str, code: int, scale: float, zero_point: int, output: tuple[float, int],
                 fuse: int = 0, constant_first: bool = True, value: int = 0) -> nnapi.Model:
    """TANH of an 8-bit [256] input, or SUB of it and a one-element constant ``value``
    (``constant_first``: c - x), ``output`` the result's scale and zero point."""
    model = nnapi.Model()
    inputs: list[int] = []
    values: list[np.ndarray] = []
    op = operand_adder(model, inputs, values)
    tensor = _CODES[kind]
    x = op(tensor, [256], None, scale, zero_point, given=True)
    y = op(tensor, [256], scale=output[0], zero_point=output[1])
    if code == Op.TANH:
        model.add_operation(Op.TANH, [x], [y])
    else:
        c = op(tensor, [1], np.array([value], kind), 0.25 * scale + 0.001, zero_point // 2)
        model.add_operation(Op.SUB, [*([c, x] if constant_first else [x, c]), constant(model, T.INT32, fuse)], [y])
    model.identify_inputs_and_outputs(inputs, [y])
    model.finish()
    return model


def _every_stored_value(model: nnapi.Model, ort_device: nnapi.Device, kind: str) -> None:
    low, high = _RANGES[kind]
    stored = np.arange(low, high + 1).astype(kind)
    ours, theirs = _both(model, ort_device, [stored], [np.zeros(256, kind)])
    np.testing.assert_array_equal(ours[0], theirs[0])


@pytest.mark.parametrize("kind", ["uint8", "int8"])
def test_8_bit_tanh_is_one_quantized_sigmoid(ort_device, kind):
    """8-bit TANH: one QLinearSigmoid of the input on twice its scale (tanh(x) =
    2 sigmoid(2x) - 1 on TANH's fixed output quantization), where DequantizeLinear, Tanh
    and QuantizeLinear were three nodes; the reference's value for every stored value."""
    output = (1.0 / 128, 128 if kind == "uint8" else 0)
    for scale, zero_point in _quantizations(kind, 11):
        model = _unary_model(kind, Op.TANH, scale, zero_point, output)
        assert _computing(lowered_node_types(model)) == ["QLinearSigmoid"], (scale, zero_point)
        _every_stored_value(model, ort_device, kind)


@pytest.mark.parametrize("fuse", [0, 1, 3])
@pytest.mark.parametrize("constant_first", [True, False])
@pytest.mark.parametrize("kind", ["uint8", "int8"])
def test_8_bit_sub_of_a_constant_is_one_quantized_add(ort_device, kind, constant_first, fuse):
    """8-bit SUB of an input and a one-element constant (a GRU's 1 - z), either order, any
    fused activation: one QLinearAdd with the subtrahend's scale negated, where the
    DequantizeLinear of each (ORT does not fold the constant's), Sub and QuantizeLinear were
    four nodes; the reference's value for every stored value."""
    low, high = _RANGES[kind]
    rng = np.random.default_rng(12)
    for (scale, zero_point), output in zip(_quantizations(kind, 13), _quantizations(kind, 14)):
        model = _unary_model(kind, Op.SUB, scale, zero_point, output, fuse, constant_first,
                             int(rng.integers(low, high + 1)))
        types = _computing(lowered_node_types(model))
        assert types == ["QLinearAdd"] + (["Clip"] if "Clip" in types else []), types
        _every_stored_value(model, ort_device, kind)


def test_unproven_forms_keep_the_general_lowering(ort_device, monkeypatch):
    """Where the probe does not give the reference's values (here: made to fail), TANH
    keeps DequantizeLinear > Tanh > QuantizeLinear and SUB the Gather of the reference's
    table; the reference's values still."""
    from nnapi.drivers.ort import elementwise

    monkeypatch.setattr(elementwise, "_probe", lambda *arguments: None)
    monkeypatch.setattr(elementwise, "_FORM_PROVEN", {})
    tanh = _unary_model("int8", Op.TANH, 0.02, -3, (1.0 / 128, 0))
    assert _computing(lowered_node_types(tanh)) == ["DequantizeLinear", "Tanh", "QuantizeLinear"]
    _every_stored_value(tanh, ort_device, "int8")
    sub = _unary_model("uint8", Op.SUB, 0.02, 100, (0.03, 90), 0, True, 200)
    assert "Gather" in lowered_node_types(sub) and "QLinearAdd" not in lowered_node_types(sub)
    _every_stored_value(sub, ort_device, "uint8")


# --- PACK --------------------------------------------------------------------------------

@pytest.mark.parametrize("axis", [0, 1, 2])
def test_pack_before_the_last_axis_is_one_concat(ort_device, axis):
    """PACK of three [1, 48] float tensors (an unrolled layer's outputs) on axis 0 or 1: one
    Concat and a Reshape (one Unsqueeze per tensor before); on the last axis the Unsqueezes
    stay. The reference's values exactly (nothing is computed)."""
    model = nnapi.Model()
    inputs: list[int] = []
    values: list[np.ndarray] = []
    op = operand_adder(model, inputs, values)
    rng = np.random.default_rng(5)
    parts = [op(T.TENSOR_FLOAT32, [1, 48], rng.standard_normal((1, 48)).astype(np.float32), given=True)
             for _ in range(3)]
    shape = [[3, 1, 48], [1, 3, 48], [1, 48, 3]][axis]
    y = op(T.TENSOR_FLOAT32, shape)
    model.add_operation(Op.PACK, [constant(model, T.INT32, axis), *parts], [y])
    model.identify_inputs_and_outputs(inputs, [y])
    model.finish()
    expected = ["Concat", "Reshape"] if axis < 2 else ["Unsqueeze"] * 3 + ["Concat"]
    assert lowered_node_types(model) == expected
    ours, theirs = _both(model, ort_device, values, [np.zeros(shape, np.float32)])
    np.testing.assert_array_equal(ours[0], np.stack(values, axis=axis).reshape(shape))
    np.testing.assert_array_equal(theirs[0], ours[0])


def test_one_pixel_convolution_of_unknown_depth_is_claimed(ort_device):
    """A 1x1 CONV_2D of 1x1 images whose input depth is unknown at preparation ([2, 1, 1, 0])
    and a constant [5, 1, 1, 3] filter: claimed (the depth is the filter's), the reference's
    values bit for bit (the one-pixel form reshaped the filter to [5, 0] and declined with
    numpy's ValueError)."""
    rng = np.random.default_rng(11)
    model = nnapi.Model()
    op = operand_adder(model)
    x = model.add_operand(nnapi.OperandType(T.TENSOR_QUANT8_ASYMM, [2, 1, 1, 0], 0.02, 100))
    w = op(T.TENSOR_QUANT8_ASYMM, [5, 1, 1, 3], rng.integers(0, 256, (5, 1, 1, 3)).astype(np.uint8), 0.01, 140)
    bias = op(T.TENSOR_INT32, [5], rng.integers(-3000, 3000, 5).astype(np.int32), 0.02 * 0.01)
    scalars = [constant(model, T.INT32, v) for v in (1, 1, 1, 0)]  # SAME, strides 1, 1, no activation
    y = op(T.TENSOR_QUANT8_ASYMM, [2, 1, 1, 5], scale=0.05, zero_point=120)
    model.add_operation(Op.CONV_2D, [x, w, bias, *scalars], [y])
    model.identify_inputs_and_outputs([x], [y])
    model.finish()
    assert OrtDevice().get_unsupported_reasons(build_hal_model(model)[0]) == [None]
    rows = rng.integers(0, 256, (2, 1, 1, 3)).astype(np.uint8)
    results = []
    for device in (ort_device, reference_device()):
        compilation = nnapi.Compilation(model, [device])
        compilation.finish()
        execution = nnapi.Execution(compilation)
        execution.set_input(0, rows, nnapi.OperandType(T.TENSOR_QUANT8_ASYMM, [2, 1, 1, 3], 0.02, 100))
        out = np.zeros((2, 1, 1, 5), np.uint8)
        execution.set_output(0, out)
        execution.compute()
        results.append(out)
    np.testing.assert_array_equal(results[0], results[1])
    assert len(set(results[1].ravel().tolist())) > 2  # real products, not a constant
