"""nnapi-ort-cpu's quantized depthwise layers on channel counts off a multiple of 16
(drivers/ort/padded_depthwise.py): the CONV_2D before such a layer computes 16-aligned
channels, the layer and the CONV_2D after it read them with zero taps. The outputs equal
the plain lowering's bit for bit (and the reference's, but for the steps ORT's float32
requantization is allowed per layer); a value some other operation reads is cut back or
not padded."""

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
from nnapi.drivers.ort import padded_depthwise  # noqa: E402
from nnapi.drivers.ort.lowering import lower_model  # noqa: E402
from nnapi.operand import SymmPerChannelQuantParams  # noqa: E402
from nnapi.runtime.model_builder import build_hal_model  # noqa: E402

pytestmark = pytest.mark.usefixtures("calibration_file")

_SAME = 1


def _scalar(model: nnapi.Model, code: int, value) -> int:
    index = model.add_operand(OperandType(code))
    model.set_operand_value(index, value)
    return index


def _filter(model: nnapi.Model, rng: np.random.Generator, shape: list[int], channel_dim: int,
            per_channel: bool, zero_point: int = 128) -> tuple[int, float | np.ndarray]:
    """Constant weights: int8 per channel along ``channel_dim``, or uint8 in [60, 200) of
    ``zero_point`` (128: they center to int8; 10: they do not, stored as q - 128)."""
    if per_channel:
        scales = rng.uniform(0.004, 0.012, shape[channel_dim]).astype(np.float32)
        index = model.add_operand(OperandType(T.TENSOR_QUANT8_SYMM_PER_CHANNEL, shape))
        model.set_operand_symm_per_channel_quant_params(index, SymmPerChannelQuantParams(channel_dim, scales))
        model.set_operand_value(index, rng.integers(-127, 128, shape).astype(np.int8))
        return index, scales
    index = model.add_operand(OperandType(T.TENSOR_QUANT8_ASYMM, shape, scale=0.008, zero_point=zero_point))
    model.set_operand_value(index, rng.integers(60, 200, shape).astype(np.uint8))
    return index, np.float32(0.008)


def _bias(model: nnapi.Model, rng: np.random.Generator, channels: int, scale: float) -> int:
    """int32 biases; ``scale`` the input's times the weights' (0 for per-channel weights)."""
    index = model.add_operand(OperandType(T.TENSOR_INT32, [channels], scale=scale))
    model.set_operand_value(index, rng.integers(-600, 600, channels).astype(np.int32))
    return index


def _block(activation: int, channels: int, stride: int, per_channel: bool, extra_reader: str | None = None,
           size: int = 12, depth: int = 24, filter_zero_point: int = 128) -> nnapi.Model:
    """CONV_2D 1x1 (depth -> channels, RELU), DEPTHWISE_CONV_2D 3x3 (RELU6, ``stride``),
    CONV_2D 1x1 (channels -> depth). ``extra_reader``: "expanded" also makes the first
    convolution's output a model output, "depthwise" the depthwise layer's."""
    rng = np.random.default_rng(channels * 10 + stride)
    zero = {T.TENSOR_QUANT8_ASYMM: 128, T.TENSOR_QUANT8_ASYMM_SIGNED: 0}[activation]
    # zero points: x's near the middle; the RELU outputs' near the bottom of the range
    model = nnapi.Model()
    out = size // stride

    def value(shape: list[int], scale: float, zero_point: int) -> int:
        return model.add_operand(OperandType(activation, shape, scale=scale, zero_point=zero_point))

    x = value([1, size, size, depth], 0.05, zero + 3)
    scalars = [_scalar(model, T.INT32, np.int32(v)) for v in (_SAME, 1, 1)]
    w1, _ = _filter(model, rng, [channels, 1, 1, depth], 0, per_channel)

    def bias_scale(input_scale: float) -> float:
        return 0.0 if per_channel else input_scale * 0.008

    expanded = value([1, size, size, channels], 0.08, zero - 100)
    model.add_operation(Op.CONV_2D, [x, w1, _bias(model, rng, channels, bias_scale(0.05)), *scalars,
                                     _scalar(model, T.INT32, np.int32(nnapi.FuseCode.FUSED_RELU))], [expanded])
    w2, _ = _filter(model, rng, [1, 3, 3, channels], 3, per_channel, filter_zero_point)
    filtered = value([1, out, out, channels], 0.05, zero - 90)
    strides = [_scalar(model, T.INT32, np.int32(v)) for v in (_SAME, stride, stride, 1)]
    relu6 = _scalar(model, T.INT32, np.int32(nnapi.FuseCode.FUSED_RELU6))
    model.add_operation(Op.DEPTHWISE_CONV_2D, [expanded, w2, _bias(model, rng, channels, bias_scale(0.08)), *strides,
                                               relu6], [filtered])
    w3, _ = _filter(model, rng, [depth, 1, 1, channels], 0, per_channel)
    y = value([1, out, out, depth], 0.2, zero + 5)
    model.add_operation(Op.CONV_2D, [filtered, w3, _bias(model, rng, depth, bias_scale(0.05)), *scalars,
                                     _scalar(model, T.INT32, np.int32(nnapi.FuseCode.FUSED_NONE))], [y])
    outputs = [y] + ({"expanded": [expanded], "depthwise": [filtered]}.get(extra_reader, []))
    model.identify_inputs_and_outputs([x], outputs)
    model.finish()
    return model


def _lowered(model: nnapi.Model):
    hal, _ = build_hal_model(model)
    return lower_model(hal)[0]


def _node_types(model: nnapi.Model) -> list[str]:
    return [node.op_type for node in _lowered(model).graph.node]


def _groups(model: nnapi.Model) -> list[int]:
    """The group attribute of every QLinearConv of the lowered graph, in order."""
    groups = []
    for node in _lowered(model).graph.node:
        if node.op_type == "QLinearConv":
            groups.append(next((a.i for a in node.attribute if a.name == "group"), 1))
    return groups


def _run(model: nnapi.Model, device: nnapi.Device, x: np.ndarray, shapes: list[list[int]]) -> list[np.ndarray]:
    """The model's outputs on ``device`` alone (which must take the whole model)."""
    compilation = nnapi.Compilation(model, [device])
    compilation.finish()
    assert compilation.step_devices == [device.name]
    execution = nnapi.Execution(compilation)
    execution.set_input(0, x)
    results = [np.zeros(shape, x.dtype) for shape in shapes]
    for position, result in enumerate(results):
        execution.set_output(position, result)
    execution.compute()
    return results


def _image(activation: int, shape: list[int]) -> np.ndarray:
    dtype = np.uint8 if activation == T.TENSOR_QUANT8_ASYMM else np.int8
    info = np.iinfo(dtype)
    return np.random.default_rng(5).integers(info.min, info.max + 1, shape).astype(dtype)


def _near_reference(ours: np.ndarray, theirs: np.ndarray) -> None:
    """ORT requantizes in float32 where Android uses a fixed-point multiplier: a step off
    here and there in each layer, which the next layer's weights carry on (up to 3 steps
    after two layers here); nearly every value is the reference's, and the values vary."""
    assert np.mean(ours != theirs) < 0.06
    assert np.abs(ours.astype(int) - theirs).max() <= 3
    assert len(np.unique(theirs)) > 100


def _plain(monkeypatch) -> None:
    """The lowering without this module's padding (what ran before it)."""
    monkeypatch.setattr(padded_depthwise, "_padded_conv", lambda g, operation: False)


def _shapes(channels: int, stride: int, extra_reader: str | None, size: int = 12, depth: int = 24) -> list[list[int]]:
    out = size // stride
    return [[1, out, out, depth]] + {"expanded": [[1, size, size, channels]],
                                     "depthwise": [[1, out, out, channels]]}.get(extra_reader, [])


@pytest.mark.parametrize(("activation", "channels", "stride", "per_channel", "filter_zero_point"), [
    (T.TENSOR_QUANT8_ASYMM_SIGNED, 88, 1, True, 128),
    (T.TENSOR_QUANT8_ASYMM_SIGNED, 72, 2, True, 128),
    (T.TENSOR_QUANT8_ASYMM, 40, 1, False, 128),
    (T.TENSOR_QUANT8_ASYMM, 40, 1, False, 10),  # a uint8 depthwise filter stored as q - 128
    (T.TENSOR_QUANT8_ASYMM, 120, 2, True, 128),
])
def test_padded_chain_equals_the_plain_lowering_and_the_reference(ort_device, monkeypatch, activation, channels,
                                                                  stride, per_channel, filter_zero_point):
    """The depthwise layer runs on the channels rounded up to 16 (its convolutions too),
    and the outputs are the plain lowering's bit for bit."""
    model = _block(activation, channels, stride, per_channel, filter_zero_point=filter_zero_point)
    padded = -(-channels // 16) * 16
    assert _groups(model) == [1, padded, 1]
    x = _image(activation, [1, 12, 12, 24])
    shapes = _shapes(channels, stride, None)
    ours = _run(model, ort_device, x, shapes)[0]
    theirs = _run(model, reference_device(), x, shapes)[0]
    _near_reference(ours, theirs)
    _plain(monkeypatch)
    assert _groups(model) == [1, channels, 1]
    np.testing.assert_array_equal(_run(model, ort_device, x, shapes)[0], ours)


@pytest.mark.parametrize(("extra_reader", "stride", "groups", "cut"), [
    ("expanded", 1, [1, 96, 1], ["Pad"]),
    ("expanded", 2, [1, 88, 1], []),
    ("depthwise", 1, [1, 96, 1], ["Slice"]),
])
def test_values_read_elsewhere(ort_device, monkeypatch, extra_reader, stride, groups, cut):
    """A first convolution whose output is also a model output is not padded: at stride 1
    the depthwise layer pads its input with a Pad, at stride 2 it keeps its 88 channels;
    a depthwise output that is also a model output is computed padded and cut back to its
    88 channels by a Slice. Every output equals the plain lowering's bit for bit."""
    activation = T.TENSOR_QUANT8_ASYMM_SIGNED
    model = _block(activation, 88, stride, True, extra_reader)
    assert _groups(model) == groups
    assert [t for t in _node_types(model) if t in ("Pad", "Slice")] == cut
    x = _image(activation, [1, 12, 12, 24])
    shapes = _shapes(88, stride, extra_reader)
    ours = _run(model, ort_device, x, shapes)
    theirs = _run(model, reference_device(), x, shapes)
    for mine, reference in zip(ours, theirs):
        _near_reference(mine, reference)
    _plain(monkeypatch)
    for mine, plain in zip(ours, _run(model, ort_device, x, shapes)):
        np.testing.assert_array_equal(mine, plain)


def test_aligned_channels_are_not_padded():
    """96 channels are already a multiple of 16: the plain lowering."""
    assert _groups(_block(T.TENSOR_QUANT8_ASYMM_SIGNED, 96, 1, True)) == [1, 96, 1]


def test_image_stem_keeps_its_merged_columns(ort_device, monkeypatch):
    """A first convolution on an image's 3 channels keeps the plain lowering's merged
    columns (not padded): the depthwise layer after it pads its input with a Pad, and its
    output, read by a 1x1 convolution to 3 channels (merged columns too), is cut back.
    Outputs equal the plain lowering's bit for bit."""
    activation = T.TENSOR_QUANT8_ASYMM
    model = _block(activation, 24, 1, False, depth=3)
    assert _groups(model) == [1, 32, 1]
    assert [t for t in _node_types(model) if t in ("Pad", "Slice")] == ["Pad", "Slice"]
    x = _image(activation, [1, 12, 12, 3])
    shapes = _shapes(24, 1, None, depth=3)
    ours = _run(model, ort_device, x, shapes)[0]
    _plain(monkeypatch)
    assert _groups(model) == [1, 24, 1]
    np.testing.assert_array_equal(_run(model, ort_device, x, shapes)[0], ours)


def _conv_to_depthwise(channels: int, kernel: int, width: int = 16) -> nnapi.Model:
    """int8 [1, 16, width, 16] -> CONV_2D kernel x kernel stride 1 SAME to ``channels`` ->
    3x3 DEPTHWISE_CONV_2D (multiplier 1)."""
    rng = np.random.default_rng(11)
    model = nnapi.Model()

    def q8(shape: list[int], scale: float) -> int:
        return model.add_operand(OperandType(T.TENSOR_QUANT8_ASYMM_SIGNED, shape, scale=scale, zero_point=-3))

    def layer(x: int, k: int, cin: int, depthwise: bool, scale: float) -> int:
        shape = [1, k, k, channels] if depthwise else [channels, k, k, cin]
        w, _ = _filter(model, rng, shape, 3 if depthwise else 0, True)
        y = q8([1, 16, width, channels], scale)
        options = [_SAME, 1, 1] + ([1] if depthwise else []) + [0]
        model.add_operation(Op.DEPTHWISE_CONV_2D if depthwise else Op.CONV_2D,
                            [x, w, _bias(model, rng, channels, 0.0), *(_scalar(model, T.INT32, v) for v in options)],
                            [y])
        return y

    x = q8([1, 16, width, 16], 0.05)
    y = layer(layer(x, kernel, 16, False, 0.2), 3, channels, True, 0.4)
    model.identify_inputs_and_outputs([x], [y])
    model.finish()
    return model


@pytest.mark.parametrize("channels, kernel, width, merged", [
    (9, 3, 16, False),   # an odd count above 8 of a 3x3 kernel: _few_outputs_factor does not merge it
    (10, 3, 15, False),  # a width no factor above 1 divides
    (9, 1, 16, True),    # a 1x1 kernel merges at any count below 16
    (10, 3, 16, True),
])
def test_a_few_output_convolution_is_padded_unless_its_pixels_merge(ort_device, channels, kernel, width,
                                                                    merged):
    """A stride-1 CONV_2D to fewer than 16 channels feeding a depthwise layer: where the
    lowering merges its pixels, it keeps that form and the depthwise layer pads its input
    (a Pad); where it runs plain (convolutions.merges_few_outputs false), it computes the
    padded channels itself and no Pad runs. few_outputs() alone said 'merged' for all four,
    and the first two paid a Pad (reviewer R2). Values within the usual steps of the
    reference's."""
    model = _conv_to_depthwise(channels, kernel, width)
    types = _node_types(model)
    convs = [t for t in types if t in ("QLinearConv", "Pad", "Slice")]
    if merged:
        assert convs == ["QLinearConv", "Pad", "QLinearConv", "Slice"], types
    else:
        assert convs == ["QLinearConv", "QLinearConv", "Slice"], types
        assert _groups(model) == [1, 16]
    x = np.random.default_rng(3).integers(-128, 128, (1, 16, width, 16)).astype(np.int8)
    shape = [[1, 16, width, channels]]
    _near_reference(_run(model, ort_device, x, shape)[0], _run(model, reference_device(), x, shape)[0])
