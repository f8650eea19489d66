"""nnapi-ort-cpu's QUANTIZE of a DEQUANTIZEd 8-bit tensor (drivers/ort/requantizing_quantize.py:
the importer's requantizing QUANTIZE): into the same scale the stored values shifted between
the zero points, into another a DequantizeLinear / QuantizeLinear pair where ONNX Runtime's
rounding proves equal; both equal to the reference bit for bit, without the float rounding
chain; a pair whose halves ONNX Runtime would round otherwise keeps the general lowering."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

import nnapi  # noqa: E402
from helpers import constant, lowered_node_types, operand_adder, reference_device, run_on  # noqa: E402
from nnapi import OperandCode as T  # noqa: E402
from nnapi import OperandType  # noqa: E402
from nnapi import OperationCode as Op  # noqa: E402
from nnapi.operand import dtype_of  # noqa: E402

pytestmark = pytest.mark.usefixtures("calibration_file")


_SHAPE = [2, 256]


def _around(source: tuple, output: tuple, middle=None) -> nnapi.Model:
    """DEQUANTIZE of a [2, 256] tensor, ``middle(model, real)`` of its float32 values (the
    float32 operand it writes, and the further model outputs it adds), QUANTIZE of that:
    (code, scale, zero point) each; without ``middle`` the QUANTIZE reads the DEQUANTIZE's
    output."""
    model = nnapi.Model()
    x = model.add_operand(OperandType(source[0], _SHAPE, source[1], source[2]))
    real = model.add_operand(OperandType(T.TENSOR_FLOAT32, _SHAPE))
    model.add_operation(Op.DEQUANTIZE, [x], [real])
    activation, extra = middle(model, real) if middle is not None else (real, [])
    y = model.add_operand(OperandType(output[0], _SHAPE, output[1], output[2]))
    model.add_operation(Op.QUANTIZE, [activation], [y])
    model.identify_inputs_and_outputs([x], [y, *extra])
    model.finish()
    return model


def _requantize_model(source: tuple, output: tuple) -> nnapi.Model:
    """DEQUANTIZE then QUANTIZE of a [2, 256] tensor: (code, scale, zero point) each."""
    return _around(source, output)


def _run(model: nnapi.Model, device: nnapi.Device, value: np.ndarray, code) -> np.ndarray:
    return run_on(model, device, [value], [np.zeros(value.shape, dtype_of(code))])[0]


def _every_value(code) -> np.ndarray:
    stored = np.arange(256).astype(np.uint8).view(dtype_of(code))
    return np.stack([stored, stored[::-1]])


@pytest.mark.parametrize(("source", "output"), [
    ((T.TENSOR_QUANT8_ASYMM, 0.00392157, 0), (T.TENSOR_QUANT8_ASYMM_SIGNED, 0.00392157, -128)),   # uint8 input
    ((T.TENSOR_QUANT8_ASYMM_SIGNED, 0.0125, -3), (T.TENSOR_QUANT8_ASYMM, 0.0125, 125)),           # uint8 output
    ((T.TENSOR_QUANT8_ASYMM, 0.3, 7), (T.TENSOR_QUANT8_ASYMM, 0.3, 7)),
    ((T.TENSOR_QUANT8_ASYMM, 0.05, 3), (T.TENSOR_QUANT8_ASYMM, 0.05, 200)),                      # saturating
    ((T.TENSOR_QUANT8_ASYMM_SIGNED, 1.7, 5), (T.TENSOR_QUANT8_ASYMM_SIGNED, 1.7, -100)),
    ((T.TENSOR_QUANT8_ASYMM_SIGNED, 0.02, 0), (T.TENSOR_QUANT8_ASYMM, 0.02, 0)),
])
def test_same_scale_requantize_is_the_shift_equal_to_the_reference(ort_device, source, output):
    """Every stored value gives the reference's result bit for bit, and the lowered graph has
    none of the float rounding's nodes (Div, Floor): the general lowering had both."""
    model = _requantize_model(source, output)
    value = _every_value(source[0])
    want = _run(model, reference_device(), value, output[0])
    np.testing.assert_array_equal(_run(model, ort_device, value, output[0]), want)
    types = lowered_node_types(model)
    assert "Div" not in types and "Floor" not in types, types


@pytest.mark.parametrize(("source", "output"), [
    ((T.TENSOR_QUANT8_ASYMM_SIGNED, 0.00390625, -128), (T.TENSOR_QUANT8_ASYMM_SIGNED, 0.011785468086600304, -89)),
    ((T.TENSOR_QUANT8_ASYMM_SIGNED, 0.042037, -121), (T.TENSOR_QUANT8_ASYMM_SIGNED, 0.031472, -119)),
    ((T.TENSOR_QUANT8_ASYMM, 0.05, 3), (T.TENSOR_QUANT8_ASYMM, 0.07, 10)),
    ((T.TENSOR_QUANT8_ASYMM, 0.05, 3), (T.TENSOR_QUANT8_ASYMM_SIGNED, 0.011, 100)),                # saturating
])
def test_other_scales_are_a_proven_pair_equal_to_the_reference(ort_device, source, output):
    """YOLOv8's class scores into its detections' scale (the first pair) and others: equal to
    the reference on every stored value, through DequantizeLinear / QuantizeLinear only."""
    model = _requantize_model(source, output)
    value = _every_value(source[0])
    np.testing.assert_array_equal(_run(model, ort_device, value, output[0]),
                                  _run(model, reference_device(), value, output[0]))
    types = lowered_node_types(model)
    assert "Div" not in types and "Floor" not in types, types


def test_a_pair_with_halves_keeps_the_general_lowering(ort_device):
    """Scales 0.5 -> 1: every odd stored value is an exact half, which QuantizeLinear rounds
    to even and the reference away from zero: the general lowering (its Floor), still equal
    to the reference."""
    source, output = (T.TENSOR_QUANT8_ASYMM, 0.5, 3), (T.TENSOR_QUANT8_ASYMM, 1.0, 100)
    model = _requantize_model(source, output)
    value = _every_value(source[0])
    np.testing.assert_array_equal(_run(model, ort_device, value, output[0]),
                                  _run(model, reference_device(), value, output[0]))
    assert "Floor" in lowered_node_types(model)


def _chain_model(source: tuple, output: tuple, silu: bool = True, logistic_output: bool = False) -> nnapi.Model:
    """DEQUANTIZE, then MUL(x, LOGISTIC(x)) (PT2E's SiLU as ai-edge-torch writes it; with
    ``logistic_output`` the LOGISTIC is a model output too) or RELU, then QUANTIZE, over a
    [2, 256] tensor: (code, scale, zero point) each."""
    def middle(model: nnapi.Model, real: int) -> tuple[int, list[int]]:
        activation = model.add_operand(OperandType(T.TENSOR_FLOAT32, _SHAPE))
        if not silu:
            model.add_operation(Op.RELU, [real], [activation])
            return activation, []
        gate = model.add_operand(OperandType(T.TENSOR_FLOAT32, _SHAPE))
        model.add_operation(Op.LOGISTIC, [real], [gate])
        model.add_operation(Op.MUL, [real, gate, constant(model, T.INT32, np.int32(0))], [activation])
        return activation, [gate] if logistic_output else []
    return _around(source, output, middle)


@pytest.mark.parametrize("logistic_output", [False, True])
@pytest.mark.parametrize(("source", "output"), [
    ((T.TENSOR_QUANT8_ASYMM, 0.05, 3), (T.TENSOR_QUANT8_ASYMM, 0.03, 10)),
    ((T.TENSOR_QUANT8_ASYMM_SIGNED, 0.04, -5), (T.TENSOR_QUANT8_ASYMM_SIGNED, 0.021, -100)),
    ((T.TENSOR_QUANT8_ASYMM_SIGNED, 0.0712, 17), (T.TENSOR_QUANT8_ASYMM_SIGNED, 0.0389, -117)),
])
def test_a_silu_between_dequantize_and_quantize_is_proven_equal_to_the_reference(ort_device, source, output,
                                                                                 logistic_output):
    """PT2E's SiLU (DEQUANTIZE, LOGISTIC, MUL, QUANTIZE): equal to the reference on every
    stored value, its QUANTIZE one QuantizeLinear (no Floor or Sign of the general
    rounding) after one QuickGelu; a LOGISTIC that is also an output keeps its own value,
    and the QuantizeLinear reads the chain's Mul."""
    model = _chain_model(source, output, logistic_output=logistic_output)
    value = _every_value(source[0])
    outputs = [np.zeros(value.shape, dtype_of(output[0]))]
    if logistic_output:
        outputs.append(np.zeros(value.shape, np.float32))
    got = run_on(model, ort_device, [value], [o.copy() for o in outputs])
    want = run_on(model, reference_device(), [value], [o.copy() for o in outputs])
    np.testing.assert_array_equal(got[0], want[0])
    if logistic_output:
        np.testing.assert_allclose(got[1], want[1], rtol=1e-5, atol=1e-6)
    types = lowered_node_types(model)
    assert "Floor" not in types and "Sign" not in types, types
    assert types.count("QuantizeLinear") == 1, types
    if logistic_output:  # the LOGISTIC read by the model: its own lowering and the Mul stay
        assert "Mul" in types and "QuickGelu" not in types, types
    else:  # read by nothing else: one QuickGelu in their place
        assert types.count("QuickGelu") == 1 and "Sigmoid" not in types and "Mul" not in types, types


def test_a_chain_with_halves_keeps_the_general_lowering(ort_device):
    """RELU of a 0.5 scale into scale 1: every odd positive stored value is an exact half,
    which QuantizeLinear rounds to even and the reference away from zero: the probe fails and
    the general lowering (its Floor) stays, equal to the reference."""
    source, output = (T.TENSOR_QUANT8_ASYMM, 0.5, 3), (T.TENSOR_QUANT8_ASYMM, 1.0, 100)
    model = _chain_model(source, output, silu=False)
    value = _every_value(source[0])
    np.testing.assert_array_equal(_run(model, ort_device, value, output[0]),
                                  _run(model, reference_device(), value, output[0]))
    assert "Floor" in lowered_node_types(model)


def test_a_refuted_chain_through_a_logistic_keeps_a_general_rounding_that_is_exact(ort_device):
    """x / 2 + 0 * LOGISTIC(x) of a scale-1 input into scale 1: every odd stored value is an
    exact half (QuantizeLinear rounds it to even, the reference away from zero), so the probe
    refutes one QuantizeLinear; the chain holds a LOGISTIC (a function ORT approximates
    otherwise, after which quantization.py would take one QuantizeLinear), but the probe
    finds the general rounding of ORT's value equal to the reference on every stored value:
    it stays (its Floor), equal to the reference."""
    source, output = (T.TENSOR_QUANT8_ASYMM, 1.0, 128), (T.TENSOR_QUANT8_ASYMM, 1.0, 128)
    model = nnapi.Model()
    operand = operand_adder(model)
    x = operand(source[0], [2, 256], scale=source[1], zero_point=source[2])
    real, half, gate, nothing, total = (operand(T.TENSOR_FLOAT32, [2, 256]) for _ in range(5))
    none = constant(model, T.INT32, np.int32(0))
    model.add_operation(Op.DEQUANTIZE, [x], [real])
    model.add_operation(Op.MUL, [real, constant(model, T.TENSOR_FLOAT32, np.array([0.5], np.float32), [1]), none],
                        [half])
    model.add_operation(Op.LOGISTIC, [real], [gate])
    model.add_operation(Op.MUL, [gate, constant(model, T.TENSOR_FLOAT32, np.array([0.0], np.float32), [1]), none],
                        [nothing])
    model.add_operation(Op.ADD, [half, nothing, none], [total])
    y = operand(output[0], [2, 256], scale=output[1], zero_point=output[2])
    model.add_operation(Op.QUANTIZE, [total], [y])
    model.identify_inputs_and_outputs([x], [y])
    model.finish()
    value = _every_value(source[0])
    want = _run(model, reference_device(), value, output[0])
    np.testing.assert_array_equal(_run(model, ort_device, value, output[0]), want)
    assert len(np.unique(want)) > 100
    assert "Floor" in lowered_node_types(model)


def _gelu_model(code: str, source: tuple, output: tuple) -> nnapi.Model:
    """TFLite's quantized GELU (erf form) on [2, 128] values, (scale, zero point) each: the
    importer writes DEQUANTIZE, the 21 float32 operations of its erf form, QUANTIZE."""
    from tflite_builder import Tensor, single_op

    tensors = [Tensor("x", code, [2, 128], scale=source[0], zero_point=source[1]),
               Tensor("y", code, [2, 128], scale=output[0], zero_point=output[1])]
    return nnapi.load_tflite(single_op("GELU", tensors, [0], [1], ("GeluOptions", {"Approximate": False}))).model


@pytest.mark.parametrize(("code", "source", "output"), [
    ("int8", (4 / 127, 0), (0.02, -20)),
    ("int8", (0.0473, -7), (0.0291, -111)),       # tinyvit PT2E's MLP: a wide input, outputs >= -0.17
    ("uint8", (0.031, 140), (0.017, 12)),
])
def test_a_quantized_gelu_is_a_proven_gelu_and_one_quantize_equal_to_the_reference(ort_device, code, source, output):
    """A quantized GELU (PT2E transformers' MLP) is ORT's Gelu on the dequantized values and
    one QuantizeLinear (none of the general rounding's Floor, Abs, Div), equal to the
    reference's 21 operations and QUANTIZE on every stored value."""
    model = _gelu_model(code, source, output)
    value = np.arange(256).astype(np.uint8).view(np.dtype(code)).reshape(2, 128)
    want = _run(model, reference_device(), value, T.TENSOR_QUANT8_ASYMM_SIGNED if code == "int8"
                else T.TENSOR_QUANT8_ASYMM)
    got = _run(model, ort_device, value, T.TENSOR_QUANT8_ASYMM_SIGNED if code == "int8" else T.TENSOR_QUANT8_ASYMM)
    np.testing.assert_array_equal(got, want)
    assert len(np.unique(want)) > 50  # the values span the output's range, not one saturated end
    types = lowered_node_types(model)
    assert types.count("Gelu") == 1 and types.count("QuantizeLinear") == 1, types
    assert not {"Floor", "Abs", "Div", "Sign"} & set(types), types


def _scaled_model(source: tuple, factor: float, output: tuple) -> nnapi.Model:
    """DEQUANTIZE, MUL by a float32 constant of one element, QUANTIZE over [2, 256]."""
    def middle(model: nnapi.Model, real: int) -> tuple[int, list[int]]:
        scaled = model.add_operand(OperandType(T.TENSOR_FLOAT32, _SHAPE))
        model.add_operation(Op.MUL, [real, constant(model, T.TENSOR_FLOAT32, np.array([factor], np.float32), [1]),
                                     constant(model, T.INT32, np.int32(0))], [scaled])
        return scaled, []
    return _around(source, output, middle)


@pytest.mark.parametrize(("factor", "proven"), [(0.3, True), (0.5, False)])
def test_a_chain_with_a_constant_is_proven_or_keeps_the_general_lowering(ort_device, factor, proven):
    """A chain may read float32 constants of one element: x * 0.3 from scale 0.0473 into
    scale 0.0291 is proven (one QuantizeLinear); x * 0.5 from scale 1 into scale 1 makes every odd
    stored value an exact half, which the probe catches: the general lowering. Both equal
    to the reference on every stored value."""
    source = (T.TENSOR_QUANT8_ASYMM, 0.0473 if proven else 1.0, 3)
    output = (T.TENSOR_QUANT8_ASYMM, 0.0291 if proven else 1.0, 100)
    model = _scaled_model(source, factor, output)
    value = _every_value(source[0])
    np.testing.assert_array_equal(_run(model, ort_device, value, output[0]),
                                  _run(model, reference_device(), value, output[0]))
    types = lowered_node_types(model)
    assert ("Floor" not in types) == proven, types


def _residual_model(code, first: tuple, second: tuple, output: tuple, operation=Op.ADD,
                    sum_output: bool = False) -> nnapi.Model:
    """DEQUANTIZE of two [256, 256] 8-bit tensors of ``code`` ((scale, zero point) each), ADD
    (or ``operation``) of their real values, QUANTIZE into ``output``: a PT2E residual ADD;
    with ``sum_output`` the float sum is a model output too."""
    model = nnapi.Model()
    shape = [256, 256]
    a, b = (model.add_operand(OperandType(code, shape, *q)) for q in (first, second))
    ra, rb, total = (model.add_operand(OperandType(T.TENSOR_FLOAT32, shape)) for _ in range(3))
    y = model.add_operand(OperandType(code, shape, *output))
    model.add_operation(Op.DEQUANTIZE, [a], [ra])
    model.add_operation(Op.DEQUANTIZE, [b], [rb])
    model.add_operation(operation, [ra, rb, constant(model, T.INT32, np.int32(0))], [total])
    model.add_operation(Op.QUANTIZE, [total], [y])
    model.identify_inputs_and_outputs([a, b], [y, total] if sum_output else [y])
    model.finish()
    return model


@pytest.mark.parametrize("sum_output", [False, True])
@pytest.mark.parametrize(("code", "first", "second", "output", "operation"), [
    (T.TENSOR_QUANT8_ASYMM_SIGNED, (0.0473, -7), (0.0391, 12), (0.0517, -3), Op.ADD),   # a residual ADD
    (T.TENSOR_QUANT8_ASYMM, (0.0213, 128), (0.0297, 100), (0.0421, 131), Op.ADD),
    (T.TENSOR_QUANT8_ASYMM_SIGNED, (0.0473, -7), (0.00392, -128), (0.0291, 5), Op.MUL),  # x * a sigmoid gate
])
def test_two_dequantized_tensors_combined_are_proven_on_every_pair(ort_device, code, first, second, output,
                                                                  operation, sum_output):
    """A QUANTIZE of two DEQUANTIZEd 8-bit tensors' ADD (or MUL): every one of the 65,536
    pairs of stored values gives the reference's result, through one QuantizeLinear (no
    Floor); with the float sum a model output too (its Add then read twice, which ORT fuses
    otherwise: the probe reads it as well), the sum keeps its values."""
    model = _residual_model(code, first, second, output, operation, sum_output)
    stored = np.arange(256).astype(np.uint8).view(dtype_of(code))
    values = [np.repeat(stored, 256).reshape(256, 256), np.tile(stored, 256).reshape(256, 256)]
    outputs = [np.zeros((256, 256), dtype_of(code))] + ([np.zeros((256, 256), np.float32)] if sum_output else [])
    got = run_on(model, ort_device, values, [o.copy() for o in outputs])
    want = run_on(model, reference_device(), values, [o.copy() for o in outputs])
    np.testing.assert_array_equal(got[0], want[0])
    if sum_output:
        np.testing.assert_array_equal(got[1], want[1])
    types = lowered_node_types(model)
    assert "Floor" not in types and types.count("QuantizeLinear") == 1, types


def _per_channel_model(code, source: tuple, output: tuple, shape: list[int], steps: list[tuple],
                       roots: int = 1) -> nnapi.Model:
    """DEQUANTIZE of one (or two, ADDed) 8-bit tensor(s) of ``shape`` and ``code`` ((scale,
    zero point) each), then ``steps`` in order, each (operation, constant array) for a MUL /
    ADD / SUB by a float32 constant (per channel: it broadcasts along some axes) or
    (operation, None) for a unary one, then QUANTIZE into ``output``: a batch norm PT2E
    leaves in float, a layer scale."""
    model = nnapi.Model()
    operand = operand_adder(model)
    inputs = [operand(code, shape, scale=source[0], zero_point=source[1]) for _ in range(roots)]
    reals = [operand(T.TENSOR_FLOAT32, shape) for _ in inputs]
    for x, real in zip(inputs, reals):
        model.add_operation(Op.DEQUANTIZE, [x], [real])
    value = reals[0]
    none = constant(model, T.INT32, np.int32(0))
    if roots == 2:
        value = operand(T.TENSOR_FLOAT32, shape)
        model.add_operation(Op.ADD, [reals[0], reals[1], none], [value])
    for operation, array in steps:
        following = operand(T.TENSOR_FLOAT32, shape)
        if array is None:
            model.add_operation(operation, [value], [following])
        else:
            array = np.asarray(array, np.float32)
            model.add_operation(operation, [value, constant(model, T.TENSOR_FLOAT32, array, list(array.shape)), none],
                                [following])
        value = following
    y = operand(code, shape, scale=output[0], zero_point=output[1])
    model.add_operation(Op.QUANTIZE, [value], [y])
    model.identify_inputs_and_outputs(inputs, [y])
    model.finish()
    return model


def _every_value_per_channel(code, shape: list[int], axis: int, offset: int = 0) -> np.ndarray:
    """An 8-bit tensor of ``shape`` whose every lane along ``axis`` (a channel) holds all 256
    stored values, shifted by 37 (and ``offset``) from channel to channel: the position
    along the other axes of size > 1 counts 0 to 255."""
    positions = np.arange(int(np.prod(shape))).reshape(shape)
    channel = (positions // int(np.prod(shape[axis + 1:]))) % shape[axis]
    others = [d for i, d in enumerate(shape) if i != axis]
    assert int(np.prod(others)) == 256, shape
    count = np.moveaxis(np.arange(256).reshape([d for i, d in enumerate(shape) if i != axis] + [1]), -1, axis)
    stored = (count + 37 * channel + offset) % 256
    return stored.astype(np.uint8).view(dtype_of(code))


_SIGNED = T.TENSOR_QUANT8_ASYMM_SIGNED


@pytest.mark.parametrize(("shape", "axis", "steps"), [
    # [1, T, C]: a batch norm's MUL and ADD along the last axis, then RELU
    ([1, 256, 24], 2, [(Op.MUL, np.linspace(0.41, 1.73, 24)), (Op.ADD, np.linspace(-0.31, 0.27, 24)),
                       (Op.RELU, None)]),
    # [1, C, T] (wav2vec2's layout): constants [C, 1]
    ([1, 12, 256], 1, [(Op.SUB, np.linspace(-0.2, 0.3, 12).reshape(12, 1)),
                       (Op.MUL, np.linspace(0.77, 1.31, 12).reshape(12, 1))]),
    # NHWC with 32 channels, which ORT holds blocked: the MUL of a non-DEQUANTIZE value is a
    # 1x1 depthwise Conv between Transposes (builder.channel_scale) in the probe too
    ([1, 16, 16, 32], 3, [(Op.ADD, np.linspace(-0.4, 0.35, 32).reshape(1, 1, 1, 32)),
                          (Op.MUL, np.linspace(0.53, 1.47, 32)), (Op.RELU6, None)]),
])
def test_a_per_channel_chain_is_proven_on_every_stored_value_of_every_channel(ort_device, shape, axis, steps):
    """Constants that broadcast along one axis (per channel): the chain is proven on a probe
    of every channel's 256 stored values and lowered as one QuantizeLinear (none of the
    general rounding's Floor, Sign, Div), equal to the reference on every stored value of
    every channel."""
    model = _per_channel_model(_SIGNED, (0.0473, -7), (0.0291, -20), shape, steps)
    value = _every_value_per_channel(_SIGNED, shape, axis)
    output = np.zeros(shape, np.int8)
    got, want = (run_on(model, device, [value], [output.copy()])[0] for device in (ort_device, reference_device()))
    np.testing.assert_array_equal(got, want)
    assert len(np.unique(want)) > 100  # the values span the output's steps
    types = lowered_node_types(model)
    assert types.count("QuantizeLinear") == 1 and not {"Floor", "Sign", "Div"} & set(types), types
    if len(shape) == 4:
        assert "Conv" in types, types  # the blocked channel scale, proven as it is emitted


@pytest.mark.parametrize("per_channel", [False, True])
def test_a_chain_over_a_free_batch_is_proven(ort_device, per_channel):
    """A free batch dimension (0: known at run time) takes no part in the probe: a chain of
    scalar constants and one of per-channel constants over [0, 256, 8] are proven (one
    QuantizeLinear), equal to the reference on every stored value of every channel in a
    batch of two."""
    factors = np.linspace(0.61, 1.39, 8) if per_channel else np.array([0.83])
    model = _per_channel_model(_SIGNED, (0.0473, -7), (0.0291, -20), [0, 256, 8],
                               [(Op.MUL, factors), (Op.RELU, None)])
    value = np.concatenate([_every_value_per_channel(_SIGNED, [1, 256, 8], 2, offset) for offset in (0, 101)])
    output = np.zeros(value.shape, np.int8)
    got, want = (run_on(model, device, [value], [output.copy()])[0] for device in (ort_device, reference_device()))
    np.testing.assert_array_equal(got, want)
    types = lowered_node_types(model)
    assert types.count("QuantizeLinear") == 1 and "Floor" not in types, types


def test_a_per_channel_chain_with_halves_in_one_channel_keeps_the_general_lowering(ort_device):
    """Scales 1 -> 1 and a MUL by 0.5 in one channel of eight (1.0 in the others): that
    channel's odd stored values are exact halves, which QuantizeLinear rounds to even and
    the reference away from zero: the probe refuses, the general lowering (its Floor) stays,
    equal to the reference on every value of every channel."""
    factors = np.ones(8, np.float32)
    factors[5] = 0.5
    shape = [1, 256, 8]
    model = _per_channel_model(T.TENSOR_QUANT8_ASYMM, (1.0, 128), (1.0, 128), shape, [(Op.MUL, factors)])
    value = _every_value_per_channel(T.TENSOR_QUANT8_ASYMM, shape, 2)
    output = np.zeros(shape, np.uint8)
    got, want = (run_on(model, device, [value], [output.copy()])[0] for device in (ort_device, reference_device()))
    np.testing.assert_array_equal(got, want)
    assert "Floor" in lowered_node_types(model)


def test_a_two_root_per_channel_chain_is_proven_on_every_pair_or_bounded(ort_device):
    """A residual ADD of two 8-bit tensors then a per-channel MUL (a post-add batch norm):
    with 8 channels the probe holds every pair of stored values in each (524,288 values)
    and proves it (one QuantizeLinear, equal to the reference on every pair of every
    channel); with 32 channels it would hold 2,097,152, past the bound (2**20): the general
    lowering, still equal."""
    for channels, proven in ((8, True), (32, False)):
        shape = [256, 256, channels]
        factors = np.linspace(0.61, 1.39, channels)
        model = _per_channel_model(_SIGNED, (0.0473, -7), (0.0517, -3), shape, [(Op.MUL, factors)], roots=2)
        stored = np.arange(256).astype(np.uint8).view(np.int8)
        first = np.broadcast_to(stored.reshape(256, 1, 1), shape)
        second = np.broadcast_to(stored.reshape(1, 256, 1), shape)
        values = [np.ascontiguousarray(first), np.ascontiguousarray(second)]
        output = np.zeros(shape, np.int8)
        got, want = (run_on(model, device, values, [output.copy()])[0] for device in (ort_device, reference_device()))
        np.testing.assert_array_equal(got, want)
        types = lowered_node_types(model)
        assert ("Floor" not in types) == proven, (channels, types)


@pytest.mark.parametrize(("dims", "constants", "channels", "axis"), [
    ([1, 300, 24], [[24], [1]], [1, 1, 24], 0),              # per channel along the last axis
    ([1, 12, 300], [[12, 1]], [1, 12, 1], 0),                # [C, 1] over [1, C, T]
    ([4, 12, 300], [[12, 1], [1, 1, 300]], [1, 12, 300], 0),  # two axes: the stored values on the first free one
    ([1, 16, 16, 32], [[1, 1, 1, 32], [32]], [1, 1, 1, 32], 0),
    ([6, 5], [[6, 1]], [6, 1], 1),                           # the first axis varies: values along the second
    ([1, 12, 300], [[12, 1], [300]], [1, 12, 300], 0),       # every axis > 1 varies: the batch of 1 takes them
    ([1, 300, 24], [[1], [1, 1, 1]], None, 0),               # one element each: the scalar probe
])
def test_the_per_channel_probe_layout(dims, constants, channels, axis):
    """Where the probe puts the stored values and which axes keep their extent, and that
    every constant broadcasts over it (shape.fits)."""
    from nnapi.drivers.ort.requantizing_quantize import _chain_shape

    shape = _chain_shape(dims, constants)
    assert shape is not None and shape.channels == channels and shape.axis == axis
    if channels is None:
        assert shape.probe_dims(256) == [256]
        return
    probe = shape.probe_dims(256)
    assert probe[axis] == 256 and len(probe) == len(dims)
    assert all(shape.fits(c) for c in constants)
    for c in constants:
        np.broadcast_shapes(tuple(c), tuple(probe))  # raises where it would not broadcast
    spread = shape.spread(np.arange(256, dtype=np.uint8))
    assert list(spread.shape) == probe and spread.flags.c_contiguous
    assert np.array_equal(np.moveaxis(spread, axis, 0).reshape(256, -1)[:, -1], np.arange(256))


@pytest.mark.parametrize(("dims", "constants"), [
    ([6, 5], [[6, 5]]),             # a constant of the whole shape: no axis left for the values
    ([1, 12, 300], [[12]]),          # 12 does not broadcast over 300
    ([12, 300], [[1, 12, 300]]),     # a constant of higher rank than the chain
])
def test_the_per_channel_probe_layout_refuses_what_it_cannot_hold(dims, constants):
    """No probe layout where constants cover every axis, do not broadcast, or have a higher
    rank than the chain: the general lowering."""
    from nnapi.drivers.ort.requantizing_quantize import _chain_shape

    assert _chain_shape(dims, constants) is None
