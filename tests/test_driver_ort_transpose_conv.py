"""nnapi-ort-cpu's quantized TRANSPOSE_CONV_2D as one QLinearConv of its phases
(convolutions._phased_transpose_conv): every kernel, stride, crop (explicit paddings, SAME
and VALID, a tail reaching past the last tap) and layout. Each output pixel sums the very
integer products of the transposed convolution, so the lowering equals, bit for bit, a
quantized CONV_2D on nnapi-ort-cpu of the input spread with its zero point and the filter
turned around (the same sums, requantized by the same QLinearConv), and it is within a step
of the reference's fixed-point output stage, as every quantized convolution here is."""

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
from nnapi.drivers.ort.convolutions import _phase_taps  # noqa: E402
from nnapi.drivers.ort.lowering import lower_model  # noqa: E402
from nnapi.operand import SymmPerChannelQuantParams  # noqa: E402
from nnapi.operations.common import transpose_conv_padding  # noqa: E402
from nnapi.runtime.model_builder import build_hal_model  # noqa: E402

pytestmark = pytest.mark.usefixtures("calibration_file")

_DTYPES = {T.TENSOR_QUANT8_ASYMM: np.uint8, T.TENSOR_QUANT8_ASYMM_SIGNED: np.int8}


def _operators(model: nnapi.Model) -> list[str]:
    return [node.op_type for node in lower_model(build_hal_model(model)[0])[0].graph.node]


class _Layer:
    """One quantized TRANSPOSE_CONV_2D's operands, random but for what the case fixes:
    ``filter_kind`` "per_channel" (int8 per-channel), "centered" (uint8 of zero point 128
    whose values center to int8), "offset" (uint8 of zero point 10 over 0..255: stored as
    q - 128 of zero point -118) or "signed_offset" (int8 of zero point -100 over
    -128..127: kept, zero point -100). The last two store a zero tap as the zero point."""

    def __init__(self, code: int, filter_kind: str, batch: int, size: tuple[int, int], depth: int, channels: int,
                 kernel: tuple[int, int], seed: int) -> None:
        rng = np.random.default_rng(seed)
        self.code, self.filter_kind, self.depth, self.channels, self.kernel = code, filter_kind, depth, channels, kernel
        self.shape_in = [batch, *size, depth]
        self.filter_shape = [channels, *kernel, depth]
        dtype = _DTYPES[code]
        info = np.iinfo(dtype)
        self.x_zero = -7 if code == T.TENSOR_QUANT8_ASYMM_SIGNED else 121
        self.x = rng.integers(info.min, int(info.max) + 1, self.shape_in).astype(dtype)
        if filter_kind == "per_channel":
            self.scales = rng.uniform(0.004, 0.012, channels).astype(np.float32)
            self.weights = rng.integers(-127, 128, self.filter_shape).astype(np.int8)
            bias_scale = self.scales * 0.05
        elif filter_kind == "signed_offset":
            self.weights = rng.integers(-128, 128, self.filter_shape).astype(np.int8)
            bias_scale = np.full(channels, 0.05 * 0.008)
        else:
            low, high = (60, 200) if filter_kind == "centered" else (0, 256)
            self.weights = rng.integers(low, high, self.filter_shape).astype(np.uint8)
            bias_scale = np.full(channels, 0.05 * 0.008)
        # one bias past float32's exact integers (2^24 + 1): the int32 sum keeps it
        self.bias = (rng.standard_normal(channels) * 0.4 / bias_scale).astype(np.int32)
        self.bias[0] = 16_777_217
        self.y_zero = -4 if code == T.TENSOR_QUANT8_ASYMM_SIGNED else 124

    def add_input(self, model: nnapi.Model, shape: list[int]) -> int:
        return model.add_operand(OperandType(self.code, shape, scale=0.05, zero_point=self.x_zero))

    def add_filter(self, model: nnapi.Model, weights: np.ndarray) -> int:
        shape = list(weights.shape)
        if self.filter_kind == "per_channel":
            index = model.add_operand(OperandType(T.TENSOR_QUANT8_SYMM_PER_CHANNEL, shape))
            model.set_operand_symm_per_channel_quant_params(index, SymmPerChannelQuantParams(0, self.scales))
        elif self.filter_kind == "signed_offset":
            index = model.add_operand(OperandType(T.TENSOR_QUANT8_ASYMM_SIGNED, shape, scale=0.008, zero_point=-100))
        else:
            zero = 128 if self.filter_kind == "centered" else 10
            index = model.add_operand(OperandType(T.TENSOR_QUANT8_ASYMM, shape, scale=0.008, zero_point=zero))
        model.set_operand_value(index, weights)
        return index

    def add_bias(self, model: nnapi.Model) -> int:
        scale = 0.0 if self.filter_kind == "per_channel" else 0.05 * 0.008
        index = model.add_operand(OperandType(T.TENSOR_INT32, [self.channels], scale=scale))
        model.set_operand_value(index, self.bias)
        return index

    def add_output(self, model: nnapi.Model, shape: list[int]) -> int:
        return model.add_operand(OperandType(self.code, shape, scale=0.1, zero_point=self.y_zero))


def _nchw(shape: list[int]) -> list[int]:
    return [shape[i] for i in (0, 3, 1, 2)]


def _transpose_conv(layer: _Layer, stride: tuple[int, int], padding: tuple, fuse: int,
                    nchw: bool) -> tuple[nnapi.Model, list[int], tuple[int, int, int, int]]:
    """The TRANSPOSE_CONV_2D model, its NHWC output shape and its (left, right, top, bottom)
    crop. ``padding``: ("explicit", left, right, top, bottom) or ("same" / "valid", out_h,
    out_w) for the implicit form."""
    batch, height, width, _ = layer.shape_in
    kernel_h, kernel_w = layer.kernel
    stride_h, stride_w = stride
    model = nnapi.Model()
    x = layer.add_input(model, _nchw(layer.shape_in) if nchw else layer.shape_in)
    w, b = layer.add_filter(model, layer.weights), layer.add_bias(model)
    if padding[0] == "explicit":
        left, right, top, bottom = padding[1:]
        rest = [constant(model, T.INT32, v) for v in (left, right, top, bottom, stride_w, stride_h, fuse)]
    else:
        scheme = 1 if padding[0] == "same" else 2
        out_h, out_w = padding[1:]
        top, bottom = transpose_conv_padding(out_h, stride_h, kernel_h, scheme)
        left, right = transpose_conv_padding(out_w, stride_w, kernel_w, scheme)
        given = [batch, out_h, out_w, layer.channels]
        rest = [constant(model, T.TENSOR_INT32, np.array(_nchw(given) if nchw else given, np.int32), [4]),
                *(constant(model, T.INT32, v) for v in (scheme, stride_w, stride_h, fuse))]
    out_h = (height - 1) * stride_h + kernel_h - top - bottom
    out_w = (width - 1) * stride_w + kernel_w - left - right
    shape_out = [batch, out_h, out_w, layer.channels]
    y = layer.add_output(model, _nchw(shape_out) if nchw else shape_out)
    model.add_operation(Op.TRANSPOSE_CONV_2D, [x, w, b, *rest, constant(model, T.BOOL, nchw)], [y])
    model.identify_inputs_and_outputs([x], [y])
    model.finish()
    return model, shape_out, (left, right, top, bottom)


def _spread_conv(layer: _Layer, stride: tuple[int, int], crop: tuple[int, int, int, int], fuse: int,
                 shape_out: list[int]) -> tuple[nnapi.Model, np.ndarray]:
    """The same layer as a CONV_2D (NHWC) of the input spread by the strides with its zero
    point between the pixels (products that add nothing) and the filter turned around,
    padded by kernel - 1 - crop: the transposed convolution's very sums; and that input."""
    batch, height, width, depth = layer.shape_in
    stride_h, stride_w = stride
    spread = np.full((batch, (height - 1) * stride_h + 1, (width - 1) * stride_w + 1, depth), layer.x_zero,
                     layer.x.dtype)
    spread[:, ::stride_h, ::stride_w, :] = layer.x
    left, right, top, bottom = crop
    kernel_h, kernel_w = layer.kernel
    model = nnapi.Model()
    x = layer.add_input(model, list(spread.shape))
    w = layer.add_filter(model, np.ascontiguousarray(layer.weights[:, ::-1, ::-1, :]))
    pads = (kernel_w - 1 - left, kernel_w - 1 - right, kernel_h - 1 - top, kernel_h - 1 - bottom)
    assert min(pads) >= 0, "a crop past the kernel has no CONV_2D twin"
    y = layer.add_output(model, shape_out)
    model.add_operation(Op.CONV_2D, [x, w, layer.add_bias(model), *(constant(model, T.INT32, v) for v in pads),
                                     constant(model, T.INT32, 1), constant(model, T.INT32, 1),
                                     constant(model, T.INT32, fuse)], [y])
    model.identify_inputs_and_outputs([x], [y])
    model.finish()
    return model, spread


_CASES = [
    # kernel, stride, padding, fuse, nchw: a decoder's 3x3 stride-2 SAME (crop at the tail
    # only), 4x4 stride 2 cropped by 1 on each side, VALID 3x3 stride 2, an explicit crop
    # of 2 in front (phases whose first rows are skipped), kernel smaller than the stride
    # (phases of no taps: the bias alone), stride 1 (the filter turned around), 2x2
    # stride 2 (a U-Net's: one tap per phase), unequal strides and kernels, a tail past
    # the last tap (ONNX's output_padding), NCHW
    ((3, 3), (2, 2), ("same", 14, 12), 0, False),
    ((4, 4), (2, 2), ("explicit", 1, 1, 1, 1), 1, False),
    ((3, 3), (2, 2), ("valid", 15, 13), 3, True),
    ((5, 3), (2, 2), ("explicit", 0, 1, 2, 2), 0, False),
    ((2, 2), (3, 3), ("explicit", 0, 0, 0, 0), 0, False),
    ((3, 3), (1, 1), ("same", 7, 6), 1, True),
    ((2, 2), (2, 2), ("explicit", 0, 0, 0, 0), 0, True),
    ((3, 2), (3, 2), ("explicit", 1, 0, 0, 2), 2, False),
    ((3, 3), (2, 2), ("same", 13, 11), 0, False),
    ((2, 2), (3, 3), ("same", 21, 18), 0, False),
]


@pytest.mark.parametrize("code, filter_kind", [(T.TENSOR_QUANT8_ASYMM, "centered"),
                                               (T.TENSOR_QUANT8_ASYMM, "offset"),
                                               (T.TENSOR_QUANT8_ASYMM_SIGNED, "per_channel"),
                                               (T.TENSOR_QUANT8_ASYMM_SIGNED, "signed_offset")])
@pytest.mark.parametrize("case", range(len(_CASES)))
def test_phased_transpose_conv_sums_what_the_spread_conv_sums(ort_device, code, filter_kind, case):
    """The phased QLinearConv form (no float ConvTranspose left) against a CONV_2D of the
    spread input on nnapi-ort-cpu: equal bit for bit (a phase or tap out of place, a crop
    off by one or a bias summed in float32, 2^24 + 1 here, would not be); and within a step
    of the reference, most values equal, on a batch of 2."""
    kernel, stride, padding, fuse, nchw = _CASES[case]
    layer = _Layer(code, filter_kind, 2, (7, 6), 6, 5, kernel, seed=case)
    model, shape_out, crop = _transpose_conv(layer, stride, padding, fuse, nchw)
    operators = _operators(model)
    assert "ConvTranspose" not in operators and operators.count("QLinearConv") == 1
    dtype = _DTYPES[code]
    value = np.ascontiguousarray(layer.x.transpose(0, 3, 1, 2)) if nchw else layer.x
    out = np.zeros(_nchw(shape_out) if nchw else shape_out, dtype)
    ours = run_on(model, ort_device, [value], [out.copy()])[0]
    theirs = run_on(model, reference_device(), [value], [out.copy()])[0]
    if nchw:
        ours, theirs = ours.transpose(0, 2, 3, 1), theirs.transpose(0, 2, 3, 1)
    twin, spread = _spread_conv(layer, stride, crop, fuse, shape_out)
    np.testing.assert_array_equal(ours, run_on(twin, ort_device, [spread], [np.zeros(shape_out, dtype)])[0])
    off = np.abs(ours.astype(int) - theirs)
    assert off.max() <= 1 and off.mean() < 0.05 and len(np.unique(theirs)) > 15


def test_phase_taps_rows():
    """_phase_taps along one axis: ceil(kernel / stride) taps, the input padded by taps - 1
    in front less the rows a crop skips, enough rows after it for the last output row, and
    the rows of the rearranged output before the first kept; None for a crop past the
    front pad."""
    assert _phase_taps(3, 2, 8, 0, 1) == (2, 1, 0, 0)      # SAME 3x3 stride 2: 16 rows exactly
    assert _phase_taps(4, 2, 8, 1, 1) == (2, 1, 1, 1)      # 18 rows, 1 cropped in front and 1 behind
    assert _phase_taps(3, 2, 8, 0, 0) == (2, 1, 1, 0)      # VALID: 17 rows of 9 phased ones
    assert _phase_taps(5, 2, 7, 2, 2) == (3, 1, 1, 0)      # phased row 0 skipped by the crop
    assert _phase_taps(2, 3, 7, 0, 0) == (1, 0, 0, 0)
    assert _phase_taps(3, 1, 7, 1, 1) == (3, 1, 1, 0)      # stride 1: a 3-tap convolution
    assert _phase_taps(3, 2, 8, 0, -3) == (2, 1, 2, 0)     # a tail past the last tap
    assert _phase_taps(3, 2, 8, 4, 0) is None              # front crop past the pad: ConvTranspose
