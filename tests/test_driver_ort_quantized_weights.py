"""nnapi-ort-cpu with quantized weights given at run time: per-channel filters of CONV_2D,
DEPTHWISE_CONV_2D, GROUPED_CONV_2D and TRANSPOSE_CONV_2D, quant8 weights of
FULLY_CONNECTED, with the int32 bias given at run time too. Each runs the integers the
constant form runs (the same ONNX operator on the same values), so its outputs equal the
constant form's bit for bit, and the reference's within the step the constant form is
allowed (ORT requantizes in float32 where Android uses a fixed-point multiplier).
DEQUANTIZE of such weights: the reference's float32 products exactly."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

import nnapi  # noqa: E402
from helpers import reference_device  # noqa: E402
from nnapi import OperandCode as T  # noqa: E402
from nnapi import OperandType  # noqa: E402
from nnapi import OperationCode as Op  # noqa: E402
from nnapi.drivers.ort.convolutions import EXACT_CONV_TRANSPOSE_VERSION  # noqa: E402
from nnapi.drivers.ort.versions import onnxruntime_at_least  # noqa: E402
from nnapi.operand import SymmPerChannelQuantParams  # noqa: E402

pytestmark = pytest.mark.usefixtures("calibration_file")


def _run(model: nnapi.Model, device: nnapi.Device, inputs: list[np.ndarray], output: np.ndarray) -> np.ndarray:
    """The model's one output on ``device`` alone (which must take the whole model)."""
    compilation = nnapi.Compilation(model, [device])
    compilation.finish()
    assert compilation.step_devices == [device.name]
    execution = nnapi.Execution(compilation)
    for position, value in enumerate(inputs):
        execution.set_input(position, value)
    result = np.zeros_like(output)
    execution.set_output(0, result)
    execution.compute()
    return result


def _scalar(model: nnapi.Model, code: int, value) -> int:
    index = model.add_operand(OperandType(code))
    model.set_operand_value(index, value)
    return index


def _layer(code: Op, activation: int, weights: OperandType, weight_values: np.ndarray, bias_values: np.ndarray,
           input_shape: list[int], output_shape: list[int], parameters: list[tuple[int, object]], given: bool,
           input_scale: float = 0.05, output_scale: float = 0.5) -> nnapi.Model:
    """One quantized layer: input, weights, int32 bias, then ``parameters``; the weights and
    the bias are model inputs where ``given``, constants otherwise."""
    zero_point = {T.TENSOR_QUANT8_ASYMM: 110, T.TENSOR_QUANT8_ASYMM_SIGNED: -18}[activation]
    model = nnapi.Model()
    x = model.add_operand(OperandType(activation, input_shape, scale=input_scale, zero_point=zero_point))
    w = model.add_operand(weights.with_channel_quant(None))
    if weights.channel_quant is not None:
        model.set_operand_symm_per_channel_quant_params(w, weights.channel_quant)
    bias_scale = 0.0 if weights.channel_quant is not None else input_scale * weights.scale
    bias = model.add_operand(OperandType(T.TENSOR_INT32, [len(bias_values)], scale=bias_scale))
    if not given:
        model.set_operand_value(w, weight_values)
        model.set_operand_value(bias, bias_values)
    rest = [_scalar(model, kind, value) for kind, value in parameters]
    y = model.add_operand(OperandType(activation, output_shape, scale=output_scale, zero_point=zero_point // 2))
    model.add_operation(code, [x, w, bias, *rest], [y])
    model.identify_inputs_and_outputs([x, w, bias] if given else [x], [y])
    model.finish()
    return model


def _image(activation: int, shape: list[int], seed: int) -> np.ndarray:
    dtype = np.uint8 if activation == T.TENSOR_QUANT8_ASYMM else np.int8
    info = np.iinfo(dtype)
    values = np.random.default_rng(seed).integers(info.min, info.max + 1, shape).astype(dtype)
    values.reshape(-1)[:2] = [info.min, info.max]  # the ends of the range
    return values


def _check(model_given, model_constant, ort_device, x, weights, bias, output):
    """The weights given at run time: the constant form's outputs bit for bit, the
    reference's within a step, and values enough to tell."""
    ours = _run(model_given, ort_device, [x, weights, bias], output)
    constant = _run(model_constant, ort_device, [x], output)
    theirs = _run(model_given, reference_device(), [x, weights, bias], output)
    np.testing.assert_array_equal(ours, constant)
    assert np.abs(ours.astype(int) - theirs).max() <= 1
    assert len(np.unique(theirs)) > 20


_INT32, _BOOL = T.INT32, T.BOOL
#: quantized TRANSPOSE_CONV_2D runs on ORT from 1.22 on (declined before: EXACT_CONV_TRANSPOSE_VERSION)
_exact_conv_transpose = pytest.mark.skipif(not onnxruntime_at_least(EXACT_CONV_TRANSPOSE_VERSION),
                                           reason="this onnxruntime's ConvTranspose is declined")


@pytest.mark.parametrize("activation", [T.TENSOR_QUANT8_ASYMM, T.TENSOR_QUANT8_ASYMM_SIGNED])
@pytest.mark.parametrize("code", [Op.CONV_2D, Op.DEPTHWISE_CONV_2D, Op.GROUPED_CONV_2D])
def test_per_channel_filter_given_at_run_time(ort_device, code, activation):
    """A per-channel int8 filter and its bias given at run time (stride 2, SAME, RELU for
    CONV_2D; explicit padding and a depth multiplier of 2 for DEPTHWISE_CONV_2D; 2 groups):
    an int8 input of the ONNX graph read by the same QLinearConv as a constant filter."""
    rng = np.random.default_rng(int(code) * 10 + int(activation))
    height, width, depth = 9, 8, 8
    if code == Op.CONV_2D:
        channels, filter_shape, axis = 6, [6, 3, 3, depth], 0
        parameters = [(_INT32, 1), (_INT32, 2), (_INT32, 2), (_INT32, 1)]  # SAME, strides 2, RELU
        output_shape = [1, 5, 4, channels]
    elif code == Op.DEPTHWISE_CONV_2D:
        channels, filter_shape, axis = 2 * depth, [1, 3, 2, 2 * depth], 3
        parameters = [(_INT32, v) for v in (1, 0, 1, 1, 1, 1, 2, 0)]  # pads l r t b, strides, multiplier, none
        output_shape = [1, height, width, channels]
    else:
        channels, filter_shape, axis = 6, [6, 2, 3, depth // 2], 0
        parameters = [(_INT32, 2), (_INT32, 1), (_INT32, 1), (_INT32, 2), (_INT32, 1), (_BOOL, False)]
        output_shape = [1, height - 1, width - 2, channels]  # VALID, 2 groups, RELU
    scales = (0.01 * (1 + np.arange(channels) % 4)).astype(np.float32)
    weights_type = OperandType(T.TENSOR_QUANT8_SYMM_PER_CHANNEL, filter_shape,
                               channel_quant=SymmPerChannelQuantParams(axis, scales.tolist()))
    weights = rng.integers(-127, 128, filter_shape).astype(np.int8)
    bias = rng.integers(-3000, 3000, channels).astype(np.int32)
    layers = [_layer(code, activation, weights_type, weights, bias, [1, height, width, depth], output_shape,
                     parameters, given, output_scale=1.0 if code == Op.CONV_2D else 0.5) for given in (True, False)]
    x = _image(activation, [1, height, width, depth], int(code))
    output = np.zeros(output_shape, np.uint8 if activation == T.TENSOR_QUANT8_ASYMM else np.int8)
    _check(*layers, ort_device, x, weights, bias, output)


@pytest.mark.parametrize("activation, weight_zero_point", [(T.TENSOR_QUANT8_ASYMM, 120),
                                                           (T.TENSOR_QUANT8_ASYMM, 3),
                                                           (T.TENSOR_QUANT8_ASYMM_SIGNED, -7)])
def test_fully_connected_weights_given_at_run_time(ort_device, activation, weight_zero_point):
    """FULLY_CONNECTED with quant8 weights (their own zero point, uint8 or int8) and bias
    given at run time: a Reshape of the weights into the constant form's 1x1 QLinearConv.
    Zero point 3 keeps q - zero point out of int8, so the constant form keeps uint8 too;
    120 centres them to int8 there: the same sums either way."""
    rng = np.random.default_rng(weight_zero_point + 200)
    units, depth = 24, 40
    weights_type = OperandType(activation, [units, depth], scale=0.02, zero_point=weight_zero_point)
    info = np.iinfo(np.uint8 if activation == T.TENSOR_QUANT8_ASYMM else np.int8)
    weights = rng.integers(info.min, info.max + 1, (units, depth)).astype(info.dtype)
    bias = rng.integers(-5000, 5000, units).astype(np.int32)
    layers = [_layer(Op.FULLY_CONNECTED, activation, weights_type, weights, bias, [3, depth], [3, units],
                     [(_INT32, 0)], given, output_scale=1.0) for given in (True, False)]
    x = _image(activation, [3, depth], 5)
    _check(*layers, ort_device, x, weights, bias, np.zeros((3, units), info.dtype))


@_exact_conv_transpose
@pytest.mark.parametrize("activation", [T.TENSOR_QUANT8_ASYMM, T.TENSOR_QUANT8_ASYMM_SIGNED])
def test_transpose_conv_per_channel_filter_given_at_run_time(ort_device, activation):
    """A per-channel TRANSPOSE_CONV_2D filter given at run time (stride 2, SAME; one bias
    beyond float32's exact integers): its int8 values cast to float32 (exact) in place of
    the constant form's float32 integers, the same ConvTranspose and output stage."""
    rng = np.random.default_rng(23)
    channels, depth = 4, 6
    scales = [0.02, 0.01, 0.03, 0.015]
    weights_type = OperandType(T.TENSOR_QUANT8_SYMM_PER_CHANNEL, [channels, 3, 3, depth],
                               channel_quant=SymmPerChannelQuantParams(0, scales))
    weights = rng.integers(-127, 128, (channels, 3, 3, depth)).astype(np.int8)
    bias = np.array([16_777_217, -3, 5000, -700], np.int32)
    layers = []
    for given in (True, False):
        model = nnapi.Model()
        zero_point = 100 if activation == T.TENSOR_QUANT8_ASYMM else -28
        x = model.add_operand(OperandType(activation, [1, 5, 5, depth], scale=0.05, zero_point=zero_point))
        w = model.add_operand(weights_type.with_channel_quant(None))
        model.set_operand_symm_per_channel_quant_params(w, weights_type.channel_quant)
        b = model.add_operand(OperandType(T.TENSOR_INT32, [channels]))
        if not given:
            model.set_operand_value(w, weights)
            model.set_operand_value(b, bias)
        shape = model.add_operand(OperandType(T.TENSOR_INT32, [4]))
        model.set_operand_value(shape, np.array([1, 10, 10, channels], np.int32))
        rest = [_scalar(model, _INT32, v) for v in (1, 2, 2, 0)] + [_scalar(model, _BOOL, False)]
        y = model.add_operand(OperandType(activation, [1, 10, 10, channels], scale=0.2, zero_point=zero_point))
        model.add_operation(Op.TRANSPOSE_CONV_2D, [x, w, b, shape, *rest], [y])
        model.identify_inputs_and_outputs([x, w, b] if given else [x], [y])
        model.finish()
        layers.append(model)
    x = _image(activation, [1, 5, 5, depth], 3)
    _check(*layers, ort_device, x, weights, bias, np.zeros((1, 10, 10, channels), x.dtype))


@_exact_conv_transpose
def test_transpose_conv_filter_given_at_run_time_declined_past_float32s_exact_sums():
    """A per-channel TRANSPOSE_CONV_2D filter given at run time whose sums could reach 2^24
    (255 * 128 * 576 taps) is declined naming the rule; the same filter as a constant with
    small values is not."""
    from nnapi.drivers.ort.device import OrtDevice
    from nnapi.runtime.model_builder import build_hal_model

    def reasons(given: bool) -> list[str | None]:
        model = nnapi.Model()
        x = model.add_operand(OperandType(T.TENSOR_QUANT8_ASYMM, [1, 4, 4, 64], scale=0.05, zero_point=100))
        w = model.add_operand(OperandType(T.TENSOR_QUANT8_SYMM_PER_CHANNEL, [2, 3, 3, 64]))
        model.set_operand_symm_per_channel_quant_params(w, SymmPerChannelQuantParams(0, [0.01, 0.02]))
        b = model.add_operand(OperandType(T.TENSOR_INT32, [2]))
        model.set_operand_value(b, np.zeros(2, np.int32))
        if not given:
            model.set_operand_value(w, np.ones((2, 3, 3, 64), np.int8))
        rest = [_scalar(model, _INT32, v) for v in (0, 0, 0, 0, 1, 1, 0)] + [_scalar(model, _BOOL, False)]
        y = model.add_operand(OperandType(T.TENSOR_QUANT8_ASYMM, [1, 6, 6, 2], scale=0.5, zero_point=0))
        model.add_operation(Op.TRANSPOSE_CONV_2D, [x, w, b, *rest], [y])
        model.identify_inputs_and_outputs([x, w] if given else [x], [y])
        model.finish()
        return OrtDevice().get_unsupported_reasons(build_hal_model(model)[0])

    assert reasons(given=True) == ["the integer sums could leave float32's exact range"]
    assert reasons(given=False) == [None]


@pytest.mark.parametrize("output_code", [T.TENSOR_FLOAT32, T.TENSOR_FLOAT16])
@pytest.mark.parametrize("channel_dim", [None, 0, 2])
def test_dequantize_of_symmetric_weights_given_at_run_time_equals_the_reference(ort_device, channel_dim,
                                                                                  output_code):
    """DEQUANTIZE of a TENSOR_QUANT8_SYMM (``channel_dim`` None) or per-channel operand given
    at run time, every int8 value, scales that round (0.1, 1/3, ...): DequantizeLinear's
    float32 product on nnapi-ort-cpu, the reference's values bit for bit (float16 rounded
    from it alike)."""
    shape = [4, 8, 8]
    model = nnapi.Model()
    if channel_dim is None:
        x = model.add_operand(OperandType(T.TENSOR_QUANT8_SYMM, shape, scale=0.1))
    else:
        x = model.add_operand(OperandType(T.TENSOR_QUANT8_SYMM_PER_CHANNEL, shape))
        scales = [0.1, 1 / 3, 2.5, 7e-3, 1e-2, 0.75, 3.0, 1 / 7][:shape[channel_dim]]
        model.set_operand_symm_per_channel_quant_params(x, SymmPerChannelQuantParams(channel_dim, scales))
    y = model.add_operand(OperandType(output_code, shape))
    model.add_operation(Op.DEQUANTIZE, [x], [y])
    model.identify_inputs_and_outputs([x], [y])
    model.finish()
    values = np.arange(-128, 128, dtype=np.int16).astype(np.int8).reshape(shape)
    output = np.zeros(shape, np.float32 if output_code == T.TENSOR_FLOAT32 else np.float16)
    ours, theirs = (_run(model, device, [values], output) for device in (ort_device, reference_device()))
    np.testing.assert_array_equal(ours, theirs)
    assert len(np.unique(theirs)) > 200
