"""nnapi-ort-cpu's faster forms for a keypoint / detection model's layers and decode head
(the zoo's pose heads and MoveNet): a DEPTHWISE_CONV_2D of depth multiplier above 1 as a
Gather of its input's channels then a multiplier-1 convolution (convolutions.spread_channels).
Each is compared with the reference device on real values (quantized ones bit for bit),
its node structure asserted, and the cases that keep the plain form checked."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

import nnapi  # noqa: E402
from helpers import lowered_graph, reference_device, run_on  # noqa: E402
from nnapi import OperandCode as T  # noqa: E402
from nnapi import OperandType  # noqa: E402
from nnapi import OperationCode as Op  # noqa: E402
from nnapi.operand import SymmPerChannelQuantParams  # noqa: E402

pytestmark = pytest.mark.usefixtures("calibration_file")


def _scalar(model: nnapi.Model, value: int) -> int:
    index = model.add_operand(OperandType(T.INT32))
    model.set_operand_value(index, np.int32(value))
    return index


def _depthwise(code: int, channels: int, multiplier: int, size: int = 9, stride: int = 1,
               nchw: bool = False) -> nnapi.Model:
    """DEPTHWISE_CONV_2D 3x3 (padding SAME, ``stride``, RELU) of ``channels`` by
    ``multiplier``: float32, or 8-bit (``code``) with int8 per-channel weights."""
    rng = np.random.default_rng(channels * 10 + multiplier)
    model = nnapi.Model()
    out_channels, out_size = channels * multiplier, -(-size // stride)
    quantized = code != T.TENSOR_FLOAT32
    zero = {T.TENSOR_QUANT8_ASYMM: 128, T.TENSOR_QUANT8_ASYMM_SIGNED: 0}.get(code, 0)
    in_shape = [1, channels, size, size] if nchw else [1, size, size, channels]
    out_shape = [1, out_channels, out_size, out_size] if nchw else [1, out_size, out_size, out_channels]
    x = model.add_operand(OperandType(code, in_shape, 0.05 if quantized else 0.0, zero + 3 if quantized else 0))
    if quantized:
        scales = rng.uniform(0.004, 0.012, out_channels).astype(np.float32)
        w = model.add_operand(OperandType(T.TENSOR_QUANT8_SYMM_PER_CHANNEL, [1, 3, 3, out_channels]))
        model.set_operand_symm_per_channel_quant_params(w, SymmPerChannelQuantParams(3, scales))
        model.set_operand_value(w, rng.integers(-127, 128, [1, 3, 3, out_channels]).astype(np.int8))
        b = model.add_operand(OperandType(T.TENSOR_INT32, [out_channels]))
        model.set_operand_value(b, rng.integers(-600, 600, out_channels).astype(np.int32))
    else:
        w = model.add_operand(OperandType(T.TENSOR_FLOAT32, [1, 3, 3, out_channels]))
        model.set_operand_value(w, rng.standard_normal([1, 3, 3, out_channels]).astype(np.float32))
        b = model.add_operand(OperandType(T.TENSOR_FLOAT32, [out_channels]))
        model.set_operand_value(b, rng.standard_normal(out_channels).astype(np.float32))
    y = model.add_operand(OperandType(code, out_shape, 0.07 if quantized else 0.0, zero - 100 if quantized else 0))
    params = [_scalar(model, v) for v in (1, stride, stride, multiplier, 1)]  # SAME, strides, multiplier, RELU
    if nchw:
        layout = model.add_operand(OperandType(T.BOOL))
        model.set_operand_value(layout, True)
        params.append(layout)
    model.add_operation(Op.DEPTHWISE_CONV_2D, [x, w, b, *params], [y])
    model.identify_inputs_and_outputs([x], [y])
    model.finish()
    return model


def _run_both(model: nnapi.Model, ort_device: nnapi.Device, code: int, shape: list[int],
              out_shape: list[int]) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(7)
    if code == T.TENSOR_FLOAT32:
        x = rng.standard_normal(shape).astype(np.float32)
    else:
        dtype = np.uint8 if code == T.TENSOR_QUANT8_ASYMM else np.int8
        x = rng.integers(np.iinfo(dtype).min, np.iinfo(dtype).max + 1, shape).astype(dtype)
    dtype = x.dtype
    ours = run_on(model, ort_device, [x], [np.zeros(out_shape, dtype)])[0]
    theirs = run_on(model, reference_device(), [x], [np.zeros(out_shape, dtype)])[0]
    return ours, theirs


@pytest.mark.parametrize("code", [T.TENSOR_QUANT8_ASYMM_SIGNED, T.TENSOR_QUANT8_ASYMM, T.TENSOR_FLOAT32])
@pytest.mark.parametrize(("channels", "multiplier", "stride", "nchw"),
                         [(4, 2, 1, False), (3, 4, 2, False), (5, 3, 1, True)])
def test_depthwise_multiplier_runs_on_spread_channels(ort_device, code, channels, multiplier, stride, nchw):
    """A multiplier above 1: the input's channels gathered (each repeated multiplier times,
    in order), then a convolution with one group per output channel; the reference's
    values (bit for bit where quantized)."""
    model = _depthwise(code, channels, multiplier, stride=stride, nchw=nchw)
    graph = lowered_graph(model)
    convolution = next(n for n in graph.node if n.op_type in ("Conv", "QLinearConv"))
    group = next(a.i for a in convolution.attribute if a.name == "group")
    assert group == channels * multiplier
    gather = next(n for n in graph.node if n.op_type == "Gather")
    indices = next(np.frombuffer(t.raw_data, np.int64) for t in graph.initializer if t.name == gather.input[1])
    assert indices.tolist() == np.repeat(np.arange(channels), multiplier).tolist()
    assert [n.output[0] for n in graph.node].index(gather.output[0]) < list(graph.node).index(convolution)
    out_size = -(-9 // stride)
    shape = [1, channels, 9, 9] if nchw else [1, 9, 9, channels]
    out_shape = [1, channels * multiplier, out_size, out_size] if nchw else [1, out_size, out_size,
                                                                            channels * multiplier]
    ours, theirs = _run_both(model, ort_device, code, shape, out_shape)
    if code == T.TENSOR_FLOAT32:
        np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-5)
    else:
        # ORT requantizes in float32 where Android uses fixed point: within a step
        assert np.abs(ours.astype(np.int32) - theirs.astype(np.int32)).max() <= 1
        assert np.abs(ours.astype(np.int32) - theirs.astype(np.int32)).mean() < 0.05


@pytest.mark.parametrize(("channels", "multiplier"), [(6, 1), (1, 4)])
def test_depthwise_without_spread(ort_device, channels, multiplier):
    """A multiplier of 1, or one input channel (a CONV_2D of multiplier filters): no Gather."""
    code = T.TENSOR_QUANT8_ASYMM_SIGNED
    model = _depthwise(code, channels, multiplier)
    assert "Gather" not in [n.op_type for n in lowered_graph(model).node]
    ours, theirs = _run_both(model, ort_device, code, [1, 9, 9, channels], [1, 9, 9, channels * multiplier])
    assert np.abs(ours.astype(np.int32) - theirs.astype(np.int32)).max() <= 1
