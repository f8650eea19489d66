"""nnapi-ort-cpu folds a PAD of zeros before a convolution into the convolution's padding
(drivers/ort/pad_into_conv.py), through a Conv1D's RESHAPE to [N, 1, T, C] too, and drops a
RESHAPE back to the shape its input's RESHAPE read (data_movement.lower_reshape): no Pad
node left, the same sums, so quantized outputs equal the unfolded lowering's bit for bit
and float ones the reference's to float32 rounding; PADs it must keep (another value, a
second reader, the channel axis, a SAME convolution after it) stay."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

import nnapi  # noqa: E402
from helpers import constant, reference_device, run_on  # noqa: E402
from nnapi import OperandCode as T  # noqa: E402
from nnapi import OperandType  # noqa: E402
from nnapi import OperationCode as Op  # noqa: E402
from nnapi.drivers.ort import lowering  # noqa: E402
from nnapi.operand import SymmPerChannelQuantParams  # noqa: E402
from nnapi.runtime.model_builder import build_hal_model  # noqa: E402

pytestmark = pytest.mark.usefixtures("calibration_file")

_DTYPES = {T.TENSOR_FLOAT32: np.float32, T.TENSOR_QUANT8_ASYMM: np.uint8, T.TENSOR_QUANT8_ASYMM_SIGNED: np.int8}


def _operators(model: nnapi.Model) -> list[str]:
    return [node.op_type for node in lowering.lower_model(build_hal_model(model)[0])[0].graph.node]


class _Builder:
    """A model of ``code`` values (quantized: scale 0.05, zero point 7 / -7)."""

    def __init__(self, code: int, seed: int) -> None:
        self.code, self.model, self.rng = code, nnapi.Model(), np.random.default_rng(seed)
        self.zero = {T.TENSOR_QUANT8_ASYMM: 7, T.TENSOR_QUANT8_ASYMM_SIGNED: -7}.get(code, 0)
        self.scales: dict[int, float] = {}

    def value(self, shape: list[int], scale: float = 0.05) -> int:
        if self.code == T.TENSOR_FLOAT32:
            return self.model.add_operand(OperandType(self.code, shape))
        index = self.model.add_operand(OperandType(self.code, shape, scale=scale, zero_point=self.zero))
        self.scales[index] = scale
        return index

    def like(self, x: int, shape: list[int]) -> int:
        """A value of ``x``'s quantization (what PAD and RESHAPE write)."""
        return self.value(shape, self.scales.get(x, 0.05))

    def pad(self, x: int, shape: list[int], paddings: list[list[int]], value=None) -> int:
        padded = [d + a + b for d, (a, b) in zip(shape, paddings, strict=True)]
        y = self.like(x, padded)
        inputs = [x, constant(self.model, T.TENSOR_INT32, np.array(paddings, np.int32), [len(shape), 2])]
        if value is None:
            self.model.add_operation(Op.PAD, inputs, [y])
        else:
            code = T.FLOAT32 if self.code == T.TENSOR_FLOAT32 else T.INT32
            self.model.add_operation(Op.PAD_V2, [*inputs, constant(self.model, code, value)], [y])
        return y

    def reshape(self, x: int, shape: list[int]) -> int:
        y = self.like(x, shape)
        self.model.add_operation(Op.RESHAPE, [x, constant(self.model, T.TENSOR_INT32, np.array(shape, np.int32),
                                                          [len(shape)])], [y])
        return y

    def conv(self, x: int, depth: int, channels: int, kernel: tuple[int, int], out_shape: list[int],
             padding: tuple, stride: int = 1, dilation: int = 1, fuse: int = 1, depthwise: bool = False) -> int:
        """``padding``: (left, right, top, bottom) or "valid" / "same"."""
        shape = [1, *kernel, channels] if depthwise else [channels, *kernel, depth]
        if self.code == T.TENSOR_FLOAT32:
            w = constant(self.model, T.TENSOR_FLOAT32, self.rng.standard_normal(shape).astype(np.float32), shape)
            b = constant(self.model, T.TENSOR_FLOAT32, self.rng.standard_normal(channels).astype(np.float32),
                         [channels])
        else:
            w = self.model.add_operand(OperandType(T.TENSOR_QUANT8_SYMM_PER_CHANNEL, shape))
            scales = self.rng.uniform(0.005, 0.02, channels).astype(np.float32)
            self.model.set_operand_symm_per_channel_quant_params(w, SymmPerChannelQuantParams(3 if depthwise else 0,
                                                                                           scales))
            self.model.set_operand_value(w, self.rng.integers(-127, 128, shape).astype(np.int8))
            b = self.model.add_operand(OperandType(T.TENSOR_INT32, [channels]))
            self.model.set_operand_value(b, self.rng.integers(-300, 300, channels).astype(np.int32))
        scalars = (list(padding) if isinstance(padding, tuple) else [1 if padding == "same" else 2])
        scalars += [stride, stride] + ([1] if depthwise else []) + [fuse]
        extra = [constant(self.model, T.BOOL, False), constant(self.model, T.INT32, dilation),
                 constant(self.model, T.INT32, dilation)] if dilation != 1 else []
        y = self.value(out_shape, scale=0.2)
        self.model.add_operation(Op.DEPTHWISE_CONV_2D if depthwise else Op.CONV_2D,
                                 [x, w, b, *(constant(self.model, T.INT32, v) for v in scalars), *extra], [y])
        return y

    def random(self, shape: list[int]) -> np.ndarray:
        if self.code == T.TENSOR_FLOAT32:
            return self.rng.standard_normal(shape).astype(np.float32)
        info = np.iinfo(_DTYPES[self.code])
        return self.rng.integers(info.min, int(info.max) + 1, shape).astype(_DTYPES[self.code])

    def finish(self, inputs: list[int], outputs: list[int]) -> nnapi.Model:
        self.model.identify_inputs_and_outputs(inputs, outputs)
        self.model.finish()
        return self.model


def _conv1d_stack(code: int) -> tuple[nnapi.Model, list[int], list[int]]:
    """A causal Conv1D stack as Keras writes it: PAD 2 steps in front of [1, 40, 12], RESHAPE
    to [1, 1, 42, 12], VALID 1x3 CONV_2D to 16, RESHAPE to [1, 40, 16]; then PAD 4, RESHAPE,
    a 1x3 CONV_2D of dilation 2 with explicit paddings of its own (1 on the right), RESHAPE."""
    b = _Builder(code, seed=3)
    x = b.value([1, 40, 12])
    padded = b.reshape(b.pad(x, [1, 40, 12], [[0, 0], [2, 0], [0, 0]]), [1, 1, 42, 12])
    first = b.reshape(b.conv(padded, 12, 16, (1, 3), [1, 1, 40, 16], "valid"), [1, 40, 16])
    padded = b.reshape(b.pad(first, [1, 40, 16], [[0, 0], [4, 0], [0, 0]]), [1, 1, 44, 16])
    second = b.conv(padded, 16, 16, (1, 3), [1, 1, 41, 16], (0, 1, 0, 0), dilation=2, fuse=0)
    y = b.reshape(second, [1, 41, 16])
    return b.finish([x], [y]), [1, 40, 12], [1, 41, 16]


def _zero_padding_2d(code: int, value=None) -> tuple[nnapi.Model, list[int], list[int]]:
    """ZeroPadding2D ((1, 2), (0, 1)) before a stride-2 3x3 DEPTHWISE_CONV_2D (VALID) and a
    CONV_2D of explicit paddings reading a second PAD (PAD_V2 of ``value`` when given)."""
    b = _Builder(code, seed=5)
    x = b.value([1, 9, 10, 8])
    padded = b.pad(x, [1, 9, 10, 8], [[0, 0], [1, 2], [0, 1], [0, 0]], value)
    y = b.conv(padded, 8, 8, (3, 3), [1, 5, 5, 8], "valid", stride=2, depthwise=True)
    padded = b.pad(y, [1, 5, 5, 8], [[0, 0], [0, 1], [1, 1], [0, 0]], value)
    z = b.conv(padded, 8, 16, (3, 3), [1, 5, 6, 16], (1, 0, 0, 1), fuse=3)
    return b.finish([x], [z]), [1, 9, 10, 8], [1, 5, 6, 16]


def _check(model: nnapi.Model, code: int, in_shape: list[int], out_shape: list[int], ort_device,
           monkeypatch) -> None:
    """The folded model against the reference and (quantized) against the unfolded lowering."""
    image = _Builder(code, seed=9).random(in_shape)
    dtype = _DTYPES[code]
    ours = run_on(model, ort_device, [image], [np.zeros(out_shape, dtype)])[0]
    theirs = run_on(model, reference_device(), [image], [np.zeros(out_shape, dtype)])[0]
    if code == T.TENSOR_FLOAT32:
        np.testing.assert_allclose(ours, theirs, rtol=0, atol=3e-6 * np.abs(theirs).max())
        assert len(np.unique(theirs)) > 100
        return
    # two layers, each within a step of the reference's fixed-point stage (QLinearConv's
    # float32 rescale): a step of the first can move the second's by one more
    off = np.abs(ours.astype(int) - theirs)
    assert off.max() <= 2 and off.mean() < 0.1 and len(np.unique(theirs)) > 20
    monkeypatch.setattr(lowering, "fold_pads_into_convs", lambda model: model)
    assert "Pad" in _operators(model)
    plain = run_on(model, ort_device, [image], [np.zeros(out_shape, dtype)])[0]
    np.testing.assert_array_equal(ours, plain)


@pytest.mark.parametrize("code", [T.TENSOR_FLOAT32, T.TENSOR_QUANT8_ASYMM_SIGNED, T.TENSOR_QUANT8_ASYMM])
def test_conv1d_pads_fold_into_the_convolutions(ort_device, monkeypatch, code):
    """A causal Conv1D stack: no Pad, and no Reshape between the layers (a RESHAPE to [N, T,
    C] and back is the value itself); one Reshape into the first layer and one out of the
    last. Float within float32 rounding of the reference; 8-bit equal to the unfolded
    lowering bit for bit (the zero point pads as PAD's zero point did) and within a step of
    the reference."""
    model, in_shape, out_shape = _conv1d_stack(code)
    operators = _operators(model)
    assert "Pad" not in operators and operators.count("Reshape") == 2, operators
    _check(model, code, in_shape, out_shape, ort_device, monkeypatch)


@pytest.mark.parametrize("code, value", [(T.TENSOR_FLOAT32, None), (T.TENSOR_FLOAT32, 0.0),
                                         (T.TENSOR_QUANT8_ASYMM_SIGNED, None), (T.TENSOR_QUANT8_ASYMM, 7),
                                         (T.TENSOR_QUANT8_ASYMM_SIGNED, -7)])
def test_zero_padding_folds_into_depthwise_and_explicit_padding(ort_device, monkeypatch, code, value):
    """ZeroPadding2D before a stride-2 depthwise layer and before a CONV_2D of explicit
    paddings (added to its own), PAD or PAD_V2 of zero / the zero point: no Pad left."""
    model, in_shape, out_shape = _zero_padding_2d(code, value)
    assert "Pad" not in _operators(model)
    _check(model, code, in_shape, out_shape, ort_device, monkeypatch)


@pytest.mark.parametrize("case", ["nonzero", "negative zero", "read twice", "channels", "same"])
def test_pads_that_are_not_the_convolution_s_padding_stay(ort_device, case):
    """A PAD_V2 of another value (1 step above the zero point; -0.0 in float: a padded
    product -0.0 * w is not the +0 a convolution pads with), a PAD whose value another
    operation reads too, one of the channel axis and one before a SAME convolution keep
    their Pad, with the reference's values."""
    code = T.TENSOR_FLOAT32 if case == "negative zero" else T.TENSOR_QUANT8_ASYMM_SIGNED
    b = _Builder(code, seed=11)
    x = b.value([1, 8, 8, 8])
    paddings = [[0, 0], [1, 1], [1, 1], [0, 0]] if case != "channels" else [[0, 0], [0, 0], [0, 0], [0, 8]]
    value = {"nonzero": -6, "negative zero": -0.0}.get(case)
    padded = b.pad(x, [1, 8, 8, 8], paddings, value)
    padded_shape = [1, 10, 10, 8] if case != "channels" else [1, 8, 8, 16]
    depth = padded_shape[3]
    out_shape = [1, 10, 10, 16] if case == "same" else [1, padded_shape[1] - 2, padded_shape[2] - 2, 16]
    y = b.conv(padded, depth, 16, (3, 3), out_shape, "same" if case == "same" else "valid")
    outputs, shapes = ([y, padded], [out_shape, padded_shape]) if case == "read twice" else ([y], [out_shape])
    model = b.finish([x], outputs)
    assert "Pad" in _operators(model)
    image = b.random([1, 8, 8, 8])
    dtype = _DTYPES[code]
    zeros = [np.zeros(shape, dtype) for shape in shapes]
    ours = run_on(model, ort_device, [image], [z.copy() for z in zeros])
    theirs = run_on(model, reference_device(), [image], [z.copy() for z in zeros])
    for got, expected in zip(ours, theirs, strict=True):
        if code == T.TENSOR_FLOAT32:
            np.testing.assert_allclose(got, expected, rtol=0, atol=3e-6 * np.abs(expected).max())
        else:
            assert np.abs(got.astype(int) - expected).max() <= 1
