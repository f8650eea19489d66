"""Lowerings of the convolutions and matrix products: CONV_2D, DEPTHWISE_CONV_2D,
GROUPED_CONV_2D, TRANSPOSE_CONV_2D, FULLY_CONNECTED and BATCH_MATMUL, with their weight
encodings (centered / signed 8-bit filters, per-channel scales) and the forms ORT runs
fastest (merged columns, channels in rows, single filters, classifiers as 1x1 convolutions)."""

from __future__ import annotations

import math

import numpy as np
from onnx import TensorProto

from nnapi.codes import FuseCode, OperationCode
from nnapi.drivers.ort.builder import (
    CLAMPS,
    FLOATS,
    MS_DOMAIN,
    NCHWC_BLOCK,
    NHWC_TO_NCHW,
    QUANT8,
    ConvParams,
    Declined,
    GraphBuilder,
    T,
    Value,
    conv_params,
    encode,
    from_nchw,
    fused_activation,
    internal_zero_point,
    lowers,
    middle_axes_sums,
    require_rank,
    to_nchw,
    type_name,
)
from nnapi.drivers.ort.channel_padding import padded_channels, set_channels, wants_padding
from nnapi.drivers.ort.quantization import quantize_half_away
from nnapi.drivers.ort.versions import onnxruntime_at_least
from nnapi.hal import Operand, Operation
from nnapi.operations._conv_common import requantize_accumulators
from nnapi.operations.common import activation_bounds_float, transpose_conv_padding
from nnapi.operations.quant_math import rescale_multipliers

#: the first release whose ConvTranspose gives the CTS's quantized TRANSPOSE_CONV_2D results
#: (1.20 and 1.21 were 3 steps off on 16 vectors)
EXACT_CONV_TRANSPOSE_VERSION = (1, 22)


#: float32's unit roundoff (round to nearest): what bounds a computed sum's error
_UNIT_ROUNDOFF = 2.0 ** -24


def value_range(g: GraphBuilder, index: int) -> tuple[float, float] | None:
    """A finite range that every element of float operand ``index`` lies in (NaN aside)
    because the operation computing it in this graph ends with a clamp: a convolution's
    fused RELU1 / RELU6, a RELU1 / RELU6 operation. None where nothing bounds it (an input
    of the graph, a linear layer, a sum)."""
    producer = g.producer(index)
    if producer is None or g.operand(index).type not in FLOATS:
        return None
    code = producer.type
    if code in (OperationCode.RELU1, OperationCode.RELU6):
        return CLAMPS[code]
    if code in (OperationCode.CONV_2D, OperationCode.DEPTHWISE_CONV_2D, OperationCode.GROUPED_CONV_2D):
        try:
            fuse = conv_params(g, producer, code != OperationCode.CONV_2D).fuse
        except (Declined, ValueError, TypeError, IndexError):
            return None
        if fuse in (FuseCode.FUSED_RELU1, FuseCode.FUSED_RELU6):
            return activation_bounds_float(fuse)
    return None


def reachable_activation(g: GraphBuilder, fuse: int, source: int, weights: np.ndarray, bias: np.ndarray) -> int:
    """The fused activation a float convolution of operand ``source`` (constant ``weights``,
    [O, ...] with each output channel's taps in its row, and ``bias``) still needs: a
    FUSED_RELU6 whose upper clamp no output can reach is FUSED_RELU. ORT's convolution
    kernels apply a Relu in their registers, but any other activation (Clip) in a pass of
    its own over the output, 4 floats at a time: a MobileNet v2's 17 depthwise RELU6 cost
    ~6% of its run. Where the input is the output of a clamp (value_range: an expansion's
    RELU6), each output's largest value is bias + sum over the taps of the larger of
    w * low and w * high (0 included for the zero padding), and a float32 sum of those n + 1
    terms, in any order and with or without fused multiply-adds, is within
    gamma(n + 2) * (|bias| + sum |w| * max |x|) of the exact one: below 6 with that margin,
    min(x, 6) changes no output, so Relu gives every output bit that Clip does (a NaN
    stays NaN in both). MobileNet v1 / v2's depthwise outputs are bounded by ~1.2-5.2 that
    way; their pointwise ones (~30-7000) are not, and keep their Clip."""
    if fuse != FuseCode.FUSED_RELU6:
        return fuse
    bounds = value_range(g, source)
    if bounds is None:
        return fuse
    low, high = min(bounds[0], 0.0), max(bounds[1], 0.0)
    taps = np.asarray(weights, np.float64).reshape(len(weights), -1)
    offsets = np.asarray(bias, np.float64).reshape(-1)
    if offsets.size != len(taps) or not (np.isfinite(taps).all() and np.isfinite(offsets).all()):
        return fuse
    largest = offsets + np.maximum(taps * low, taps * high).sum(axis=1)
    count = taps.shape[1] + 2
    gamma = count * _UNIT_ROUNDOFF / (1 - count * _UNIT_ROUNDOFF)
    error = gamma * (np.abs(offsets) + np.abs(taps).sum(axis=1) * max(-low, high))
    # twice the error bound: the bound itself is computed in float64
    if largest.size and float((largest + 2 * error).max()) < activation_bounds_float(fuse)[1]:
        return FuseCode.FUSED_RELU
    return fuse


def conv_attributes(params: ConvParams, kernel: list[int], group: int) -> dict:
    """The attributes of an ONNX Conv / QLinearConv / ConvInteger node for ``params``."""
    attributes: dict = {"strides": params.strides, "dilations": params.dilations, "kernel_shape": kernel,
                        "group": group}
    if params.pads is not None:
        attributes["pads"] = params.pads
    else:
        attributes["auto_pad"] = params.auto_pad
    return attributes


def _filter_to_oihw(g: GraphBuilder, index: int, depthwise: bool) -> tuple[str, np.ndarray | None, bool]:
    """The filter as [O, I, H, W] (depthwise: [C, 1, H, W]), for a constant its array, and
    whether quant8 weights were centered to int8 with zero point 0 (``centered_weights``)."""
    known = constant_filter(g, index, depthwise)
    if known is not None:
        array, centered = known
        return g.constant(array, "filter"), array, centered
    value = g.value(index)
    return g.one("Transpose", [value.name], perm=[3, 0, 1, 2] if depthwise else [0, 3, 1, 2]), None, False


def constant_filter(g: GraphBuilder, index: int, depthwise: bool) -> tuple[np.ndarray, bool] | None:
    """A constant filter as an [O, I, H, W] array and whether it was centered; None for a
    filter given at run time."""
    operand = g.operand(index)
    raw = g.raw_constant(index)
    if raw is None:
        return None
    # quantized weights as int8 for ORT's U8S8 kernels (signed_weights)
    if operand.type in QUANT8:
        kept, centered = signed_weights(raw, operand)
    else:
        kept, centered = encode(raw, operand), False
    return np.ascontiguousarray(kept.transpose([3, 0, 1, 2] if depthwise else [0, 3, 1, 2])), centered


def centered_weights(raw: np.ndarray, zero_point: int) -> np.ndarray | None:
    """Constant quant8 weights as int8 ``q - zero_point`` with zero point 0, where every
    value fits (None otherwise): the same integers enter every product, so QLinearConv's
    sums are unchanged, and ORT runs symmetric int8 weights on its fast U8S8 kernels.
    MobileNet uint8 (zero points near 128, about half of the layers fit): v1 9.3 -> 5.5 ms,
    v2 7.7 -> 6.2 ms on ORT's own run, outputs bit for bit the same."""
    centered = raw.astype(np.int16) - zero_point
    if centered.size == 0 or centered.min() < -128 or centered.max() > 127:
        return None
    return centered.astype(np.int8)


def signed_weights(raw: np.ndarray, operand: Operand) -> tuple[np.ndarray, bool]:
    """Constant quant8 weights as ORT's U8S8 kernels take them (int8), and whether they
    are centered (zero point 0, ``centered_weights``). uint8 weights that do not center
    are q - 128 with zero point - 128 (``_weight_quant``): the same q - zero_point in every
    product, on the U8S8 kernels, which take an int8 zero point, instead of the uint8 x
    uint8 ones (MobileNet v2 uint8's 28 such layers: ORT's run 1.13 -> 1.06x LiteRT, v1
    uint8 0.68 -> 0.63x, outputs bit for bit the same). int8 weights are kept."""
    centered = centered_weights(raw, operand.zero_point)
    if centered is not None:
        return centered, True
    if operand.type == T.TENSOR_QUANT8_ASYMM:
        return (raw.astype(np.int16) - 128).astype(np.int8), False
    return raw, False


def filter_zero_point(operand: Operand, centered: bool) -> int:
    """The zero point of a constant quant8 filter as ``signed_weights`` stores it."""
    if centered or operand.type == T.TENSOR_QUANT8_SYMM_PER_CHANNEL:
        return 0
    if operand.type == T.TENSOR_QUANT8_ASYMM:
        return operand.zero_point - 128
    return operand.zero_point


def _weight_quant(g: GraphBuilder, operand: Operand, depthwise: bool, channels: int,
                  constant: bool = True, centered: bool = False) -> tuple[str, str]:
    """(scale, zero point) initializers of a quantized filter, in the filter's ONNX type:
    a constant quant8 filter is int8 as ``signed_weights`` stores it (its zero point
    ``filter_zero_point``); one computed at run time is in its internal encoding (uint8,
    zero point + 128)."""
    if operand.type in QUANT8:
        if not constant:
            return g.qparams(operand)
        return (g.constant(np.array(operand.scale, np.float32), "wscale"),
                g.constant(np.array(filter_zero_point(operand, centered), np.int8), "wzp"))
    if operand.type == T.TENSOR_QUANT8_SYMM_PER_CHANNEL:
        quant = operand.channel_quant
        expected_dim = 3 if depthwise else 0
        if quant is None or quant.channel_dim != expected_dim:
            raise Declined("per-channel filter scales must run along the output channels")
        return (g.constant(np.array(quant.scales, np.float32), "wscale"),
                g.constant(np.zeros(channels, np.int8), "wzp"))
    raise Declined(f"{type_name(operand.type)} filters are not supported")


#: ORT's symmetric quantized convolution kernels (MlasConvSym) take input channels in
#: multiples of this; other counts fall back to im2col and a generic GEMM
SYM_INPUT_CHANNEL_ALIGN = 4


def _merged_columns(g: GraphBuilder, operation: Operation, params: ConvParams, array: np.ndarray,
                    centered: bool) -> str | None:
    """A quantized NHWC CONV_2D whose input channels ORT's symmetric kernels refuse (an
    image's 3) as the same convolution on the input with every m adjacent columns merged
    into one pixel of m * C channels (a Reshape, no copy), each merged output pixel holding
    the m / stride_w original output pixels side by side as channels (a Reshape back): the
    filter is spread over the merged taps with zeros elsewhere, so every output sums the
    same integer products as before (zeros add nothing) and is requantized the same way.
    MobileNet's first layer (224x224x3, 3x3 stride 2, m = 4) 360 -> 170 us on ORT. Also a
    1x1 convolution of stride 1 to fewer than 16 channels (a segmentation head's classes),
    whose cost ORT pays per pixel more than per product: m adjacent pixels as one, m the
    smallest power of two giving 16 output channels that divides the width (m times the
    multiply-adds, of a block-diagonal filter; a U-Net's 128x128x16 -> 2 head 96 -> 36 us,
    32 -> 4 100 -> 66 us, 24 -> 12 36 -> 20 us), and so one of a larger kernel, SAME
    (_few_outputs_factor: 64x64x16 3x3 to 3 104 -> 49 us). None where it does not apply
    (then the plain QLinearConv is used).

    With 1-3 input channels the batch may be open, and the width need not be a multiple of
    m nor the output's width the input's / stride (VALID padding, odd widths): the input is
    padded on the right to a multiple of m with its zero point, which a convolution reads as
    it reads its own padding (as nothing: QLinearConv subtracts the zero point), and the
    merged output's extra columns are sliced off. ORT's generic path for so few channels
    costs 2-4x its float Conv, so the spread filter pays up to 4x the multiply-adds (stride
    1 on one channel): a microcontroller keyword spotter's or classifier's first layer
    (onnxruntime 1.32, one thread): 84x84x1 VALID 3x3 to 16 channels 104 -> 25 us, the same
    SAME 110 -> 27 us, 96x96x3 SAME 3x3 to 8 150 -> 37 us, 59x49x1 3x3 stride 2 15 -> 10 us.
    A DEPTHWISE_CONV_2D of one input channel (``array`` [multiplier, 1, H, W]) is such a
    convolution too (a fingerprint model's 180x180x1 5x5 stride 2 to 8: 153 -> 51 us)."""
    filter_operand = g.operand(operation.inputs[1])
    symmetric = _symmetric_filter(filter_operand, centered)
    source, output = g.value(operation.inputs[0]), g.operand(operation.outputs[0])
    bias = g.raw_constant(operation.inputs[2])
    if len(source.dims) != 4 or len(output.dimensions) != 4:
        return None
    batches, height, width, depth = source.dims
    channels_out, _, kernel_h, kernel_w = array.shape
    few_factor = _few_outputs_merge(g, operation, params, array.shape, centered, source.dims)
    few_outputs = few_factor > 1
    if (not symmetric or bias is None or not all(source.dims[1:]) or (depth % SYM_INPUT_CHANNEL_ALIGN == 0
                                                                       and not few_outputs)
            or params.dilations != [1, 1] or not all(output.dimensions[1:])):
        return None
    stride_h, stride_w = params.strides
    factor = math.lcm(stride_w, SYM_INPUT_CHANNEL_ALIGN // math.gcd(depth, SYM_INPUT_CHANNEL_ALIGN))
    if few_outputs:
        factor = few_factor
    top, left, bottom, _ = params.pads if params.pads is not None else [0, 0, 0, 0]
    first_tap = (-left) // factor  # merged columns read, relative to the output's own
    last_tap = (stride_w * (factor // stride_w - 1) - left + kernel_w - 1) // factor
    taps = last_tap - first_tap + 1
    per_pixel = factor // stride_w  # original output pixels per merged one
    out_width = output.dimensions[2]
    # merged columns: the input's, padded to cover every output pixel (each merged output
    # pixel is one merged input column: the merged convolution's pads keep the width)
    merged_width = max(-(-width // factor), -(-out_width // per_pixel))
    if (last_tap < 0 or (few_outputs and (width % factor or out_width * stride_w != width))
            or (taps * factor > _MERGED_COST * kernel_w and not few_outputs)):
        return None
    spread = np.zeros((per_pixel, channels_out, kernel_h, taps, factor, depth), array.dtype)
    for position in range(per_pixel):
        for kx in range(kernel_w):
            tap, sub = divmod(stride_w * position - left + kx, factor)
            spread[position, :, :, tap - first_tap, sub, :] = array[:, :, :, kx].transpose(0, 2, 1)
    weights = np.ascontiguousarray(
        spread.reshape(per_pixel * channels_out, kernel_h, taps, factor * depth).transpose(0, 3, 1, 2))
    if filter_operand.type == T.TENSOR_QUANT8_SYMM_PER_CHANNEL:
        quant = filter_operand.channel_quant
        if quant is None or quant.channel_dim != (3 if operation.type == OperationCode.DEPTHWISE_CONV_2D else 0):
            return None
        w_scale = g.constant(np.tile(np.asarray(quant.scales, np.float32), per_pixel), "wscale")
        w_zero = g.constant(np.zeros(per_pixel * channels_out, np.int8), "wzp")
    else:
        w_scale = g.constant(np.array(filter_operand.scale, np.float32), "wscale")
        w_zero = g.constant(np.array(0, np.int8), "wzp")
    padded = source.name
    if merged_width * factor > width:  # read as the convolution's own padding (see above)
        extra = merged_width * factor - width
        padded = g.one("Pad", [source.name, g.constant(np.array([0, 0, 0, 0, 0, 0, extra, 0], np.int64)),
                               g.constant(np.array(source.zero_point, np.uint8), "zp")])
    rows = g.one("Reshape", [padded, g.constant(np.array([batches or -1, height, merged_width, factor * depth],
                                                          np.int64))])
    y = g.one("QLinearConv", [to_nchw(g, rows, False), *g.qparams(source), g.constant(weights, "filter"), w_scale,
                              w_zero, *g.qparams(output), g.constant(np.tile(bias.astype(np.int32), per_pixel), "w")],
              kernel_shape=[kernel_h, taps], strides=[stride_h, 1], dilations=[1, 1], group=1,
              pads=[top, -first_tap, bottom, last_tap])
    batch = output.dimensions[0] or -1
    y = g.one("Reshape", [from_nchw(g, y, False), g.constant(np.array(
        [batch, output.dimensions[1], merged_width * per_pixel, channels_out], np.int64))])
    if merged_width * per_pixel > out_width:
        y = g.one("Slice", [y, g.constant(np.array([0], np.int64)), g.constant(np.array([out_width], np.int64)),
                            g.constant(np.array([2], np.int64))])
    return y


#: how many times a convolution's multiply-adds _merged_columns may spend on 1-3 input
#: channels: ORT's generic path there costs 2-4x its float Conv, so even 4x (stride 1 on
#: one channel, 3x3 or 1x1) runs 3-4x faster (onnxruntime 1.32, one thread)
_MERGED_COST = 4


#: output channels from which ORT's quantized 1x1 convolution is not merged (_merged_columns)
FEW_OUTPUTS = 16


def few_outputs(channels_out: int, params: ConvParams) -> bool:
    """Whether a quantized CONV_2D to ``channels_out`` channels is of the kind whose pixels
    _merged_columns may merge: stride 1, no dilation, fewer than FEW_OUTPUTS channels, any
    kernel. Whether it does is _few_outputs_merge's answer (merges_few_outputs)."""
    return params.strides == [1, 1] and params.dilations == [1, 1] and channels_out < FEW_OUTPUTS


def _symmetric_filter(filter_operand: Operand, centered: bool) -> bool:
    """Whether a quantized filter's stored values are symmetric (zero point 0, or centered
    by signed_weights), as ORT's symmetric kernels and _merged_columns need."""
    return centered or filter_operand.type == T.TENSOR_QUANT8_SYMM_PER_CHANNEL or (
        filter_operand.type == T.TENSOR_QUANT8_ASYMM_SIGNED and filter_operand.zero_point == 0)


def _few_outputs_merge(g: GraphBuilder, operation: Operation, params: ConvParams, shape: tuple[int, ...],
                       centered: bool, source_dims: list[int]) -> int:
    """The m adjacent pixels _merged_columns merges as one for a quantized NHWC CONV_2D of
    stride 1 to fewer than FEW_OUTPUTS channels (filter ``shape`` [O, C, H, W], input
    ``source_dims``), or 1 where it runs plain: input channels a multiple of
    SYM_INPUT_CHANNEL_ALIGN (fewer take the few-input form), _few_outputs_factor > 1,
    symmetric weights, a constant bias, known sizes, the output as wide as the input and
    a merged column's taps reaching the output (explicit pads)."""
    output = g.operand(operation.outputs[0])
    if len(source_dims) != 4 or len(output.dimensions) != 4 or not all(source_dims[1:]) \
            or not all(output.dimensions[1:]) or source_dims[3] % SYM_INPUT_CHANNEL_ALIGN:
        return 1
    width = source_dims[2]
    factor = _few_outputs_factor(shape, params, width)
    left = params.pads[1] if params.pads is not None else 0
    if factor == 1 or not _symmetric_filter(g.operand(operation.inputs[1]), centered) \
            or g.raw_constant(operation.inputs[2]) is None or output.dimensions[2] != width \
            or (factor - 1 - left + shape[3] - 1) // factor < 0:
        return 1
    return factor


def merges_few_outputs(g: GraphBuilder, operation: Operation, params: ConvParams) -> bool:
    """Whether the quantized lowering runs this NHWC CONV_2D to fewer than FEW_OUTPUTS
    channels with adjacent pixels merged (_merged_columns, _few_outputs_merge): its input
    is then read unpadded (padded_depthwise). False for other operations and layouts."""
    if operation.type != OperationCode.CONV_2D or params.nchw \
            or not few_outputs(g.operand(operation.inputs[1]).dimensions[0], params):
        return False
    source_dims = list(g.operand(operation.inputs[0]).dimensions)
    if len(source_dims) == 4 and source_dims[3] % SYM_INPUT_CHANNEL_ALIGN:
        return True  # the few-input merged form reads it unpadded (as before _few_outputs_merge)
    known = constant_filter(g, operation.inputs[1], False)
    if known is None:
        return False
    return _few_outputs_merge(g, operation, params, known[0].shape, known[1], source_dims) > 1


def _few_outputs_factor(shape: tuple[int, ...], params: ConvParams, width: int) -> int:
    """How many adjacent pixels _merged_columns merges for a convolution of stride 1 to
    fewer than FEW_OUTPUTS channels (filter ``shape`` [O, C, H, W], ``few_outputs``): the
    smallest power of two m with m * O >= FEW_OUTPUTS, halved until it divides ``width``;
    1 where that does not apply. ORT's quantized kernel pays a 16-channel block per pixel
    whatever the channels (64x64x16 3x3 to 3 or to 12 channels: 104 / 103 us), so m pixels
    as one cost m times the multiply-adds and still run faster, a 3x3 or 5x5 filter spread
    over 3 merged columns: onnxruntime 1.32, one thread, int8, SAME, load ~4: 64x64x16 3x3
    to 3 104 -> 49 us, to 1 96 -> 37, to 8 98 -> 48, to 12 103 -> 62; 64x64x16 5x5 to 3
    212 -> 76; 64x64x64 to 3 247 -> 174; 64x64x128 to 3 425 -> 342; 128x128x32 to 3 670 ->
    349; 32x32x256 to 2 203 -> 130 (an autoencoder's or super-resolution net's last
    layer to RGB, a segmentation head's classes). Not for an odd count above 8 with a
    kernel larger than 1x1 (2 pixels then make 18-30 channels, which ORT runs slower than
    16: 32x32x64 3x3 to 9 62 -> 72, to 11 65 -> 71, to 13 65 -> 74, to 15 68 -> 74 us,
    where 10 and 12 gain, 146 -> 102 at 64x64x32 and 63 -> 48; load ~10): an ESPCN's 3x3
    to 9 before its 3x upscale. 1x1 filters merge at any count below 16."""
    channels_out = shape[0]
    if not few_outputs(channels_out, params) or (shape[2] * shape[3] > 1 and channels_out > FEW_OUTPUTS // 2
                                                 and channels_out % 2):
        return 1
    factor = 1 << math.ceil(math.log2(FEW_OUTPUTS / channels_out))
    while factor > 1 and width % factor:
        factor //= 2
    return factor


def _padded_conv(g: GraphBuilder, operation: Operation, depthwise: bool) -> bool:
    """A float NHWC convolution reading or giving channels padded to the NCHWc block (see
    wants_padding): zero filter taps for the extra input channels, zero filters and biases
    for the extra output channels. False where it does not apply."""
    inputs, index = operation.inputs, operation.outputs[0]
    output = g.operand(index)
    if g.isolated or output.type not in FLOATS or g.operand(inputs[0]).type not in FLOATS:
        return False
    padded_in = inputs[0] in g.padded
    if not (padded_in or (not depthwise and wants_padding(g, index))):
        return False
    raw_filter, raw_bias = g.raw_constant(inputs[1]), g.raw_constant(inputs[2])
    params = conv_params(g, operation, depthwise)
    real = g.operand(inputs[0]).dimensions
    if (raw_filter is None or raw_bias is None or params.nchw or len(real) != 4 or raw_filter.ndim != 4
            or raw_filter.shape[3] != real[3] or (depthwise and (params.multiplier != 1 or raw_filter.shape[0] != 1))):
        return False
    x = g.blocked_value(inputs[0])
    depth = x.dims[3]
    weights, bias = raw_filter.astype(np.float32), raw_bias.astype(np.float32).reshape(-1)
    if depthwise:
        channels = depth
        weights = np.pad(weights, ((0, 0), (0, 0), (0, 0), (0, channels - weights.shape[3]))).transpose(3, 0, 1, 2)
        group = channels
    else:
        channels = padded_channels(output.dimensions[3]) if wants_padding(g, index) else output.dimensions[3]
        weights = np.pad(weights, ((0, channels - weights.shape[0]), (0, 0), (0, 0), (0, depth - weights.shape[3])))
        weights, group = weights.transpose(0, 3, 1, 2), 1
    bias = np.pad(bias, (0, channels - bias.size))
    rows = None if depthwise else _channels_in_rows(g, operation, params, x, weights)
    if rows is not None:
        y = g.one("Conv", [rows[0], rows[1], g.constant(bias, "w")], **rows[2])
    else:
        attributes = conv_attributes(params, list(weights.shape[2:]), group)
        source = to_nchw(g, x.name, False)
        y = _single_filter_conv(g, source, weights, bias, attributes, output)
        if y is None:
            y = g.one("Conv", [source, g.constant(np.ascontiguousarray(weights), "filter"), g.constant(bias, "w")],
                      **attributes)
    y = _record_convolution(g, index, y, params.fuse, False)
    fuse = reachable_activation(g, params.fuse, inputs[0], weights, bias)
    set_channels(g, index, fused_activation(g, y, fuse, output), channels)
    return True


#: element-wise operations whose output, read by a convolution in rows (_channels_in_rows),
#: is an NHWC value as the graph's input is: an image's normalization (x * a + b)
_ROWS_PRODUCERS = (OperationCode.ADD, OperationCode.SUB, OperationCode.MUL, OperationCode.DIV)


def _channels_in_rows(g: GraphBuilder, operation: Operation, params: ConvParams, source: Value,
                      weights: np.ndarray) -> tuple[str, str, dict] | None:
    """A float NHWC CONV_2D on an input of the graph (or an element-wise function of it,
    _ROWS_PRODUCERS) with fewer channels than ORT's NCHWc block (an image's 3) as the
    same convolution on that input read as one channel of rows of W * C values (a
    Reshape, no copy): each row of a filter's taps laid out as its pixels' channels side
    by side (kernel kh x kw * C), stride sw * C, the left and right pads * C, so every
    output sums the same products. ORT runs such a convolution
    from an NCHW input; this form needs no Transpose of the image first, and its kernel
    makes one pass with rows C times as wide instead of one per channel (MobileNet's
    224x224x3, 3x3 stride 2: Transpose 31 + Conv 153 -> Reshape 4 + Conv 139 us).
    ``weights`` are the [O, C, H, W] filter; (input, filter, attributes), or None where
    it does not apply (dilated rows, an input computed otherwise, an NCHW model). A free
    batch is the Reshape's 0, the input's own."""
    batches, height, width, depth = source.dims if source.rank == 4 else (0, 0, 0, 0)
    producer = g.producer(operation.inputs[0])
    if (g.isolated or params.nchw or (producer is not None and producer.type not in _ROWS_PRODUCERS)
            or not all((height, width))
            or not 1 < depth < NCHWC_BLOCK or params.dilations[1] != 1 or weights.shape[1] != depth):
        return None
    channels, _, kernel_h, kernel_w = weights.shape
    top, left, bottom, right = params.pads if params.pads is not None else (0, 0, 0, 0)
    rows = g.one("Reshape", [source.name, g.constant(np.array([batches, 1, height, width * depth], np.int64))])
    spread = np.ascontiguousarray(weights.transpose(0, 2, 3, 1).reshape(channels, 1, kernel_h, kernel_w * depth))
    attributes = {"strides": [params.strides[0], params.strides[1] * depth], "dilations": [params.dilations[0], 1],
                  "kernel_shape": [kernel_h, kernel_w * depth], "group": 1,
                  "pads": [top, left * depth, bottom, right * depth]}
    return rows, g.constant(spread, "filter"), attributes


#: below this many output pixels a convolution's multiply-adds cost less than a node more
SINGLE_FILTER_MIN_PIXELS = 1024
#: the most filters _single_filter_conv splits (4 ran as the direct form)
SPLIT_FILTERS = 3


def _single_filter_conv(g: GraphBuilder, x: str, weights: np.ndarray, bias: np.ndarray, attributes: dict,
                        output: Operand) -> str | None:
    """A float convolution with one filter larger than 1x1 on a blocked NCHW input (``x``,
    channels a multiple of the NCHWc block; ``weights`` [1, C, H, W]) as a depthwise
    convolution with the filter's slices, then a 1x1 convolution that sums the channels
    and adds the bias. ORT's blocked convolution pads the output channels to the block, so
    the direct form makes 16 filters' multiply-adds to keep one (pose_landmark_full's
    segmentation mask, 3x3 on 256x256x16: 2.5 ms); this form makes 9 + 16 per input
    channel instead of 144. Two or three filters (a super-resolution net's last layer to
    RGB) likewise over copies of the input, one per filter: onnxruntime 1.32, one thread,
    load ~1.8, 3x3 96x96x16 to 2 250 -> 138 us, to 3 251 -> 240 (246 -> 195 in another run),
    64x64x32 to 3 221 -> 172, 48x48x16 to 3 67 -> 53; to 4 even (255 / 257), so not there.
    The same products, summed in another order (float32 rounding). None where it does not
    apply."""
    filters, channels = weights.shape[:2]
    pixels = math.prod(d for d in output.dimensions[1:3]) if len(output.dimensions) == 4 else 0
    if (filters > SPLIT_FILTERS or weights.shape[2] * weights.shape[3] == 1 or channels % NCHWC_BLOCK
            or attributes.get("group", 1) != 1 or pixels < SINGLE_FILTER_MIN_PIXELS or g.isolated):
        return None
    # two or three filters: the input's channels once per filter (Concat), filter f's slices
    # on copy f, one 1x1 convolution summing each copy's channels into its output
    source = x if filters == 1 else g.one("Concat", [x] * filters, axis=1)
    slices = g.constant(np.ascontiguousarray(weights.reshape(filters * channels, 1, *weights.shape[2:]), np.float32),
                        "filter")
    products = g.one("Conv", [source, slices], **{**attributes, "group": filters * channels})
    sums = np.zeros((filters, filters * channels, 1, 1), np.float32)
    for f in range(filters):
        sums[f, f * channels:(f + 1) * channels] = 1
    total = g.constant(np.asarray(bias, np.float32).reshape(filters), "w")
    return g.one("Conv", [products, g.constant(sums, "filter"), total], kernel_shape=[1, 1])


@lowers(OperationCode.CONV_2D, OperationCode.DEPTHWISE_CONV_2D, OperationCode.GROUPED_CONV_2D)
def lower_conv(g: GraphBuilder, operation: Operation) -> None:
    depthwise = operation.type == OperationCode.DEPTHWISE_CONV_2D
    grouped = operation.type == OperationCode.GROUPED_CONV_2D
    if not grouped and _padded_conv(g, operation, depthwise):
        return
    source = g.value(operation.inputs[0])
    require_rank(source, 4, "the input")
    # GROUPED_CONV_2D's arguments sit where DEPTHWISE_CONV_2D's do, num_groups in the
    # depth multiplier's place (and its layout flag is mandatory)
    params = conv_params(g, operation, depthwise or grouped)
    output = g.operand(operation.outputs[0])
    filter_operand = g.operand(operation.inputs[1])
    if len(filter_operand.dimensions) != 4 or not all(filter_operand.dimensions):
        raise Declined("the filter's shape must be known")
    if depthwise:
        _, kernel_h, kernel_w, channels_out = filter_operand.dimensions
        channels_in = source.dims[1 if params.nchw else 3]
        if not channels_in:
            raise Declined("the input's channel count must be known")
        if channels_in * params.multiplier != channels_out:
            raise Declined("depth_multiplier does not match the filter")
        # a multiplier above 1 runs as a multiplier of 1 on the input's channels repeated
        # (spread_channels), so the group is the output's channels
        group = channels_out if channels_in > 1 else channels_in
    elif grouped:
        channels_out, kernel_h, kernel_w, depth = filter_operand.dimensions
        group = params.multiplier
        channels_in = source.dims[1 if params.nchw else 3]
        if group < 1 or channels_out % group or channels_in != depth * group:
            raise Declined("num_groups does not divide the filters and the input's channels")
    else:
        channels_out, kernel_h, kernel_w, channels_in = filter_operand.dimensions
        group = 1
        if source.dims[1 if params.nchw else 3] not in (0, channels_in):
            raise Declined("the filter's depth does not match the input")
    attributes = conv_attributes(params, [kernel_h, kernel_w], group)
    if output.type in FLOATS:
        if g.operand(operation.inputs[0]).type not in FLOATS or filter_operand.type not in FLOATS:
            raise Declined("mixed float and quantized operands")
        bias = g.value(operation.inputs[2])
        known = None if depthwise or grouped else constant_filter(g, operation.inputs[1], False)
        rows = None if known is None else _channels_in_rows(g, operation, params, source, known[0])
        y = None
        if rows is not None:
            array = known[0]
            y = g.one("Conv", [rows[0], rows[1], bias.name], **rows[2])
        else:
            weights, array, _ = _filter_to_oihw(g, operation.inputs[1], depthwise)
            x = spread_channels(g, to_nchw(g, source.name, params.nchw), channels_in, channels_out, depthwise)
            if array is not None and bias.const is not None and not depthwise and not grouped:
                y = _single_filter_conv(g, x, array, bias.const, attributes, output)
            if y is None:
                y = g.one("Conv", [x, weights, bias.name], **attributes)
        y = _record_convolution(g, operation.outputs[0], y, params.fuse, params.nchw)
        fuse = params.fuse if array is None or bias.const is None else reachable_activation(
            g, params.fuse, operation.inputs[0], array, bias.const)
        g.set_output(operation.outputs[0], fused_activation(g, y, fuse, output))
        return
    elif output.type in QUANT8:
        if g.operand(operation.inputs[0]).type not in QUANT8:
            raise Declined("a quantized output needs a quantized input")
        if g.operand(operation.inputs[2]).type != T.TENSOR_INT32:
            raise Declined("a quantized convolution needs an int32 bias")
        # a DEPTHWISE_CONV_2D of one input channel is a CONV_2D (its multiplier the output
        # channels): the merged-columns form applies to it too
        plain = not (depthwise or grouped) or (depthwise and channels_in == 1)
        known = constant_filter(g, operation.inputs[1], depthwise) if plain and not params.nchw else None
        merged = None if known is None else _merged_columns(g, operation, params, *known)
        if merged is not None:
            g.set_output(operation.outputs[0], fused_activation(g, merged, params.fuse, output))
            return
        if plain and known is not None and _one_pixel_product(g, operation, params, [kernel_h, kernel_w], *known):
            return
        weights, array, centered = _filter_to_oihw(g, operation.inputs[1], depthwise)
        w_scale, w_zero = _weight_quant(g, filter_operand, depthwise, channels_out, array is not None, centered)
        bias = g.value(operation.inputs[2])
        # the input's NCHW transpose only here: the merged-columns form above reads NHWC (ORT
        # runs a node whose output nothing reads: MobileNet int8 paid 31 us for one)
        x = spread_channels(g, to_nchw(g, source.name, params.nchw), channels_in, channels_out, depthwise)
        y = g.one("QLinearConv", [x, *g.qparams(source), weights, w_scale, w_zero, *g.qparams(output), bias.name],
                  **attributes)
    else:
        raise Declined(f"{OperationCode(operation.type).name} on {type_name(output.type)} is not supported")
    y = from_nchw(g, y, params.nchw)
    g.set_output(operation.outputs[0], fused_activation(g, y, params.fuse, output))


def spread_channels(g: GraphBuilder, nchw_name: str, channels_in: int, channels_out: int, depthwise: bool) -> str:
    """The NCHW input of a DEPTHWISE_CONV_2D whose depth multiplier is above 1 with each
    channel repeated multiplier times (one Gather of whole planes), so that the convolution
    runs with a multiplier of 1: output channel c * multiplier + j reads input channel c
    either way, the same taps summed in the same order. ORT's depthwise kernels take one
    output per group only; two or more run the grouped im2col + GEMM path, per group
    (pose_heads_int8's 3x3 at 16x16, 32 -> 64 channels: 191 us as QLinearConv group 32,
    9.8 us as Transposes + Gather + group 64; float 28 -> 12 us; 32 -> 128 at 56x56 int8
    2.3 ms -> 0.10 ms, ORT's own runs). ``nchw_name`` itself otherwise (a multiplier of 1, or one
    input channel: that convolution is a CONV_2D)."""
    if not depthwise or channels_in == 1 or channels_out == channels_in:
        return nchw_name
    repeats = np.repeat(np.arange(channels_in, dtype=np.int64), channels_out // channels_in)
    return g.one("Gather", [nchw_name, g.constant(repeats, "channels")], axis=1)


def _one_pixel_product(g: GraphBuilder, operation: Operation, params: ConvParams, kernel: list[int],
                       array: np.ndarray, centered: bool) -> bool:
    """A quantized NHWC CONV_2D of a 1x1 filter on 1x1 images, which reads each image's one
    pixel (no padding), as QGemm of the [N, depth] rows (a recurrent layer's products, which
    the TFLite converter writes as RESHAPE to [1, 1, 1, depth], CONV_2D, RESHAPE to [1, units]),
    its output set; False where it does not apply (CLASSIFIER_MIN_WEIGHTS weights or more: a
    classifier's, where the convolution is as fast). ``quantized_product`` says why."""
    source, output = g.value(operation.inputs[0]), g.operand(operation.outputs[0])
    if (operation.type != OperationCode.CONV_2D or params.nchw or kernel != [1, 1] or source.kind != "uint8"
            or not 0 < array.size < CLASSIFIER_MIN_WEIGHTS or len(source.dims) != 4
            or source.dims[1:3] != [1, 1] or not source.dims[0] or list(output.dimensions[1:3]) != [1, 1]
            or (params.pads is not None and any(params.pads))):
        return False
    # the depth is the filter's: the input's may be unknown (0) at preparation
    units = array.shape[0]
    batch, depth = source.dims[0], array.size // units
    rows = source.name
    producer = g.producer(operation.inputs[0])
    if producer is not None and producer.type == OperationCode.RESHAPE:
        before = g.value(producer.inputs[0])
        if before.dims == [batch, depth] and before.kind == "uint8":
            rows = before.name  # the RESHAPE's node is then dropped where nothing else reads it
    if rows == source.name:
        rows = g.one("Reshape", [rows, g.constant(np.array([batch, depth], np.int64))])
    filter_operand = g.operand(operation.inputs[1])
    w_scale, w_zero = _weight_quant(g, filter_operand, False, units, True, centered)
    y = quantized_product(g, rows, source, array.reshape(units, depth), w_scale, w_zero,
                          g.value(operation.inputs[2]).name, output)
    y = fused_activation(g, y, params.fuse, output)
    index = operation.outputs[0]
    readers = g.readers(index)
    if readers and index not in g.subgraph.output_indexes \
            and all(reader.type == OperationCode.RESHAPE and reader.inputs[0] == index for reader in readers):
        # read only by RESHAPEs: they take the [N, units] rows (one to that shape runs nothing)
        g.values[index] = Value(y, "uint8", [batch, units], output.scale, internal_zero_point(output))
    else:
        g.set_output(index, g.one("Reshape", [y, g.constant(np.array(output.dimensions, np.int64))]))
    return True


def quantized_product(g: GraphBuilder, rows: str, source: Value | Operand, weights: np.ndarray | str, w_scale: str,
                      w_zero: str, bias: str, output: Operand) -> str:
    """The quantized [N, units] product of [N, depth] uint8 ``rows`` by [units, depth]
    ``weights`` (constant, as ``signed_weights`` stores them, or a value's name), the int32
    bias added and requantized into ``output``: ORT's QGemm, the same integer sums and the
    same float32 rescale as a 1x1 QLinearConv (bit for bit: 300 random shapes and
    quantizations, 1,500 rows), without the Reshapes to and from an image that
    ORT runs as nodes (~0.35 us each: an unrolled int8 GRU's 95 products paid 190). Its
    callers take it below CLASSIFIER_MIN_WEIGHTS weights: one row by [48, 144] weights
    4.9 -> 4.1 us, [512, 512] 8.3 -> 7.4, where from [256, 1024] the convolution is as
    fast or faster ([1024, 1001], a classifier: 15.5 against 16.5 us; ORT's own runs, load
    ~3)."""
    w = g.constant(np.ascontiguousarray(weights), "weights") if isinstance(weights, np.ndarray) else weights
    return g.one("QGemm", [rows, *g.qparams(source), w, w_scale, w_zero, bias, *g.qparams(output)],
                 domain=MS_DOMAIN, transB=1)


#: from how many rows a quantized FULLY_CONNECTED runs as one image's pixels
_ROWS_AS_PIXELS = 8


#: the most entries _quantized_sum_by_table's table may have (255 * depth + 1: depth 4112)
_SUM_TABLE_MAX = 1 << 20


def _quantized_sum_by_table(g: GraphBuilder, operation: Operation, source, flat: str, depth: int) -> str | None:
    """A quantized FULLY_CONNECTED of one unit whose constant weights are all one value
    with a constant bias (the TFLite importer's MEAN into another quantization: a sum
    rescaled once) as the int32 sum of each row's internal values (0..255, exact) and a
    Gather from the table of the reference's output stage (quant_math.OutputStage,
    activation clamp included) of every possible sum. QLinearConv's float32 rescale rounds
    once, half to even, where the reference's fixed point rounds twice: with the small
    multipliers of a mean they differed on 18 of 1,552 values of 200 random MEANs. None
    where the form does not apply."""
    weights_operand = g.operand(operation.inputs[1])
    weights, bias = g.raw_constant(operation.inputs[1]), g.raw_constant(operation.inputs[2])
    if (weights is None or bias is None or weights_operand.dimensions[0] != 1 or source.kind != "uint8"
            or weights_operand.type not in QUANT8 or 255 * depth + 1 > _SUM_TABLE_MAX
            or np.any(weights != weights.reshape(-1)[0])):
        return None
    x, output = g.operand(operation.inputs[0]), g.operand(operation.outputs[0])
    fuse = int(g.scalar(operation.inputs[3]))
    factor = int(weights.reshape(-1)[0]) - weights_operand.zero_point
    # internal values u = q - zero point + internal zero point: the row's sum of q - zero point
    # is sum(u) - depth * internal zero point
    sums = np.arange(255 * depth + 1, dtype=np.int64) - depth * internal_zero_point(x)
    multipliers, shifts = rescale_multipliers(x.scale, np.array([weights_operand.scale]), output.scale)
    table = requantize_accumulators(sums * factor, multipliers, shifts, output, fuse, bias.astype(np.int64))
    total = _sums_before_transpose(g, operation.inputs[0], depth)
    if total is None:
        # each row's sum as a MatMulInteger with a column of ones (exact in int32, the 8-bit
        # values read once): ORT's int32 ReduceSum of a Cast copy cost efficientnet_b0
        # int8's squeeze-and-excitation MEANs 0.46 ms of 3.56 per run
        total = g.one("MatMulInteger", [flat, g.constant(np.ones((depth, 1), np.uint8), "ones")])
    return g.one("Gather", [g.constant(encode(table, output), "table"), total], axis=0)


def _sums_before_transpose(g: GraphBuilder, index: int, depth: int) -> str | None:
    """The [rows, 1] int32 row sums of operand ``index`` when it is a TRANSPOSE moving the
    middle axes of an 8-bit [N, M..., C] value last (the importer's MEAN over height and
    width): a row of ones times each batch's [M, C] matrix, read in its own layout, the
    Transpose left unread (dropped when nothing else reads it; 0.1 ms of efficientnet_b0
    int8's run). The same integer sums in another order, exact. None otherwise."""
    producer = g.producer(index)
    if producer is None or producer.type != OperationCode.TRANSPOSE:
        return None
    x = g.value(producer.inputs[0])
    perm = g.raw_constant(producer.inputs[1])
    rank = x.rank
    if (perm is None or rank < 3 or x.kind != "uint8" or not all(x.dims)
            or list(perm.reshape(-1)) != [0, rank - 1, *range(1, rank - 1)]
            or int(np.prod(x.dims[1:-1])) != depth):
        return None
    sums = middle_axes_sums(g, x.name, x.dims)
    return g.one("Reshape", [sums, g.constant(np.array([x.dims[0] * x.dims[-1], 1], np.int64))])


@lowers(OperationCode.FULLY_CONNECTED)
def lower_fully_connected(g: GraphBuilder, operation: Operation) -> None:
    source = g.value(operation.inputs[0])
    weights_operand = g.operand(operation.inputs[1])
    output = g.operand(operation.outputs[0])
    if len(weights_operand.dimensions) != 2 or not all(weights_operand.dimensions):
        raise Declined("the weights' shape must be known")
    units, depth = weights_operand.dimensions
    fuse = int(g.scalar(operation.inputs[3]))
    if source.rank == 2 and source.dims[1] == depth:
        flat = source.name  # already [batch, depth]: a Reshape would be one more node per run (an RNN's steps)
    else:
        flat = g.one("Reshape", [source.name, g.constant(np.array([-1, depth], np.int64))])
    if output.type in FLOATS:
        y = _classifier_conv(g, operation, flat, units, depth)
        if y is None:
            weights = g.value(operation.inputs[1])
            bias = g.value(operation.inputs[2])
            y = g.one("Gemm", [flat, weights.name, bias.name], transB=1)
    elif output.type in QUANT8:
        if weights_operand.type not in QUANT8 or g.operand(operation.inputs[2]).type != T.TENSOR_INT32:
            raise Declined("quantized FULLY_CONNECTED needs quant8 weights and an int32 bias")
        summed = _quantized_sum_by_table(g, operation, source, flat, depth)
        if summed is not None:
            g.set_output(operation.outputs[0], summed)  # the table holds the activation's clamp
            return
        # A 1x1 QLinearConv: exactly NNAPI's integer product, bias and requantization.
        raw = g.raw_constant(operation.inputs[1])
        rows = math.prod(source.dims) // depth if all(source.dims) and depth else 0
        # few rows (one per step of a recurrent layer; 0: known at run time): their product
        # as they are, below a classifier's weights
        as_rows = rows < _ROWS_AS_PIXELS and units * depth < CLASSIFIER_MIN_WEIGHTS
        if raw is None:  # given at run time: its internal encoding (uint8, zero point + 128 for int8)
            w = g.value(operation.inputs[1]).name
            if not as_rows:
                w = g.one("Reshape", [w, g.constant(np.array([units, depth, 1, 1], np.int64))])
            w_scale, w_zero = _weight_quant(g, weights_operand, False, units, constant=False)
        else:
            kept, centered = signed_weights(raw, weights_operand)
            w = np.ascontiguousarray(kept.reshape(units, depth))
            if not as_rows:
                w = g.constant(w.reshape(units, depth, 1, 1), "weights")
            w_scale, w_zero = _weight_quant(g, weights_operand, False, units, centered=centered)
        bias = g.value(operation.inputs[2])
        if as_rows:
            y = quantized_product(g, flat, source, w, w_scale, w_zero, bias.name, output)
            g.set_output(operation.outputs[0], fused_activation(g, y, fuse, output))
            return
        if rows >= _ROWS_AS_PIXELS:
            # Many rows (a transformer's tokens, a per-pixel dense layer): as the pixels of
            # one image, [1, depth, rows, 1]; as QLinearConv's batch each row was a separate
            # 1x1 image (a grayscale FULLY_CONNECTED over 240x320 pixels: 61 ms -> ~0.3)
            x4 = g.one("Reshape", [g.one("Transpose", [flat], perm=[1, 0]),
                                   g.constant(np.array([1, depth, rows, 1], np.int64))])
            y4 = g.one("QLinearConv", [x4, *g.qparams(source), w, w_scale, w_zero, *g.qparams(output), bias.name],
                       kernel_shape=[1, 1])
            y = g.one("Transpose", [g.one("Reshape", [y4, g.constant(np.array([units, rows], np.int64))])],
                      perm=[1, 0])
        else:
            x4 = g.one("Reshape", [flat, g.constant(np.array([-1, depth, 1, 1], np.int64))])
            y4 = g.one("QLinearConv", [x4, *g.qparams(source), w, w_scale, w_zero, *g.qparams(output), bias.name],
                       kernel_shape=[1, 1])
            y = g.one("Reshape", [y4, g.constant(np.array([-1, units], np.int64))])
    else:
        raise Declined(f"FULLY_CONNECTED on {type_name(output.type)} is not supported")
    g.set_output(operation.outputs[0], fused_activation(g, y, fuse, output))


#: operations whose float output ORT computes in its blocked layout (NCHWc), and the
#: reshapes of one: what an image classifier's FULLY_CONNECTED reads
_POOLED = (OperationCode.MEAN, OperationCode.AVERAGE_POOL_2D, OperationCode.MAX_POOL_2D, OperationCode.L2_POOL_2D,
           OperationCode.RESHAPE, OperationCode.SQUEEZE, OperationCode.CONV_2D, OperationCode.DEPTHWISE_CONV_2D)
#: weights from which ORT's 1x1 convolution beats its Gemm on one row (see _classifier_conv)
CLASSIFIER_MIN_WEIGHTS = 1 << 18


def _classifier_conv(g: GraphBuilder, operation: Operation, flat: str, units: int, depth: int) -> str | None:
    """A float FULLY_CONNECTED of one row (``flat``) by large constant weights, read from a
    pooled image (an image classifier's head), as a 1x1 convolution of that row as a
    [1, depth, 1, 1] image: ORT's blocked pointwise kernel streams the weights faster than
    its Gemm does for one row (MobileNet v2's 1280 x 1000: Gemm 254 -> Conv 178 us, per-node
    medians between LiteRT runs), and the pooled value stays in the blocked layout. The
    same products and sums, in another order (float32 rounding). None where it does not
    apply."""
    producer = g.producer(operation.inputs[0])
    rows = math.prod(g.operand(operation.inputs[0]).dimensions) // depth if depth else 0
    if (g.isolated or rows != 1 or producer is None or producer.type not in _POOLED
            or units * depth < CLASSIFIER_MIN_WEIGHTS):
        return None
    raw = g.raw_constant(operation.inputs[1])
    bias = g.value(operation.inputs[2])
    if raw is None or bias.const is None or bias.rank != 1:
        return None
    weights = encode(raw, g.operand(operation.inputs[1])).reshape(units, depth, 1, 1)
    image = g.one("Reshape", [flat, g.constant(np.array([1, depth, 1, 1], np.int64))])
    y = g.one("Conv", [image, g.constant(np.ascontiguousarray(weights), "weights"), bias.name], kernel_shape=[1, 1])
    return g.one("Reshape", [y, g.constant(np.array([1, units], np.int64))])


def _record_convolution(g: GraphBuilder, index: int, nchw_name: str, fuse: int, nchw: bool) -> str:
    """``nchw_name`` (the output of the Conv node just made) back in NHWC, the pair
    recorded for _clamp_into_conv when the convolution has no activation of its own."""
    conv = g.nodes[-1]
    name = from_nchw(g, nchw_name, nchw)
    if fuse == FuseCode.FUSED_NONE and not nchw and not g.isolated and conv.output[0] == nchw_name:
        g.convolutions[index] = (conv, g.nodes[-1])
    return name


@lowers(OperationCode.TRANSPOSE_CONV_2D)
def lower_transpose_conv(g: GraphBuilder, operation: Operation) -> None:
    """ConvTranspose: NNAPI's paddings crop the full output as ONNX's pads do; the
    implicit form's tail padding may be negative (the output reaches past the last tap),
    which is ONNX's output_padding. ORT has no quantized ConvTranspose: a quantized layer
    with a constant filter and bias runs on its integers in float32 (q - zero_point, the
    filter's integers, the int32 bias), where every sum is exact as long as it stays below
    2^24 (checked here from the filter, else declined), then requantized by the real
    multiplier, halves away from zero (within a step of Android's fixed-point stage)."""
    inputs = operation.inputs
    source = g.value(inputs[0])
    require_rank(source, 4, "the input")
    output = g.operand(operation.outputs[0])
    filter_operand = g.operand(inputs[1])
    quantized = output.type in QUANT8
    if quantized:
        if source.kind != "uint8" or g.operand(inputs[2]).type != T.TENSOR_INT32:
            raise Declined("a quantized TRANSPOSE_CONV_2D needs a quantized input and an int32 bias")
        if not onnxruntime_at_least(EXACT_CONV_TRANSPOSE_VERSION):
            raise Declined("this onnxruntime's ConvTranspose gives quantized results 3 steps off (before 1.22)")
    elif output.type not in FLOATS or filter_operand.type not in FLOATS:
        raise Declined(f"TRANSPOSE_CONV_2D on {type_name(output.type)} is not supported")
    if len(filter_operand.dimensions) != 4 or not all(filter_operand.dimensions):
        raise Declined("the filter's shape must be known")
    channels_out, kernel_h, kernel_w, depth = filter_operand.dimensions
    nchw = bool(g.scalar(inputs[-1]))
    fuse = int(g.scalar(inputs[-2]))
    stride_w, stride_h = int(g.scalar(inputs[-4])), int(g.scalar(inputs[-3]))
    if stride_w < 1 or stride_h < 1:
        raise Declined("strides must be positive")
    if source.dims[1 if nchw else 3] not in (0, depth):
        raise Declined("the filter's depth does not match the input")
    if len(inputs) == 11:
        left, right, top, bottom = (int(g.scalar(inputs[i])) for i in (3, 4, 5, 6))
        if min(left, right, top, bottom) < 0:
            raise Declined("paddings must not be negative")
    elif len(inputs) == 9:
        shape = np.asarray(g.scalar(inputs[3])).reshape(-1)
        scheme = int(g.scalar(inputs[4]))
        if shape.size != 4 or scheme not in (1, 2):
            raise Declined("the output shape must have 4 values and the padding scheme be SAME or VALID")
        want_h, want_w = (int(shape[2]), int(shape[3])) if nchw else (int(shape[1]), int(shape[2]))
        top, bottom = transpose_conv_padding(want_h, stride_h, kernel_h, scheme)
        left, right = transpose_conv_padding(want_w, stride_w, kernel_w, scheme)
    else:
        raise Declined("TRANSPOSE_CONV_2D takes 9 or 11 inputs")
    raw = g.raw_constant(inputs[1])
    if quantized and raw is not None and not g.isolated:
        y = _phased_transpose_conv(g, operation, source, raw, nchw, (stride_h, stride_w), (top, left, bottom, right))
        if y is not None:
            g.set_output(operation.outputs[0], fused_activation(g, y, fuse, output))
            return
    multipliers = None
    if quantized:
        weights, multipliers = _quantized_transpose_filter(g, operation, raw, channels_out)
        bias = ""  # added in int32 below, exactly whatever its size
        x = _integers(g, source)
    elif raw is not None:  # ONNX's filter is [in, out, h, w]
        weights = g.constant(np.ascontiguousarray(raw.astype(np.float32).transpose(3, 0, 1, 2)), "filter")
        bias, x = g.value(inputs[2]).name, source.name
    else:
        weights = g.one("Transpose", [g.value(inputs[1]).name], perm=[3, 0, 1, 2])
        bias, x = g.value(inputs[2]).name, source.name
    attributes: dict = {"kernel_shape": [kernel_h, kernel_w], "strides": [stride_h, stride_w],
                        "pads": [top, left, max(bottom, 0), max(right, 0)]}
    if bottom < 0 or right < 0:
        attributes["output_padding"] = [max(-bottom, 0), max(-right, 0)]
    y = g.one("ConvTranspose", [to_nchw(g, x, nchw), weights, bias], **attributes)
    if multipliers is not None:
        per_channel = g.constant(np.array([-1, 1, 1], np.int64))
        with_bias = g.one("Add", [g.one("Cast", [y], to=TensorProto.INT32),
                                  g.one("Reshape", [g.value(inputs[2]).name, per_channel])])
        y = g.one("Mul", [g.one("Cast", [with_bias], to=TensorProto.FLOAT),
                          g.constant(multipliers.reshape(-1, 1, 1), "multiplier")])
    y = from_nchw(g, y, nchw)
    if multipliers is not None:
        y = quantize_half_away(g, y, output, scale=1.0)
    g.set_output(operation.outputs[0], fused_activation(g, y, fuse, output))


def _phase_taps(kernel: int, stride: int, size: int, head: int, tail: int) -> tuple[int, int, int, int] | None:
    """Along one axis of a TRANSPOSE_CONV_2D (filter ``kernel``, ``stride``, input ``size``,
    cropped by ``head`` / ``tail``, a negative tail extending it): the taps T of every
    phase's filter, the phased convolution's pads before / after the input, and the rows its
    rearranged output has before the first one kept. Output row o = q * stride + p (phase p)
    sums x[q - t] * w[p + stride * t] over t < T = ceil(kernel / stride): a convolution of
    T taps with filter f[u] = w[p + stride * (T - 1 - u)] on the input padded by T - 1 in
    front; only rows q from head // stride on are computed. None where that front pad
    would be negative (a crop of more than T strides)."""
    taps = -(-kernel // stride)
    first = head // stride
    before = taps - 1 - first
    if before < 0:
        return None
    kept_end = (size - 1) * stride + kernel - tail  # one past the last output row kept
    after = max(0, -(-kept_end // stride) - size)
    return taps, before, after, head - first * stride


def _phased_transpose_conv(g: GraphBuilder, operation: Operation, source: Value, raw: np.ndarray, nchw: bool,
                           strides: tuple[int, int], pads: tuple[int, int, int, int]) -> str | None:
    """A quantized TRANSPOSE_CONV_2D with a constant filter and bias as one QLinearConv of
    its phases: output pixel (q * s + p) of phase p = (py, px) sums input pixels q - t times
    filter taps p + s * t (_phase_taps), so a convolution of ceil(K / s) taps per axis on
    the input to s_h * s_w * C channels, (py * s_w + px) * C + c holding phase (py, px) of
    channel c (zero taps where p + s * t passes the kernel), computes every output pixel's
    integer sum from the very products ConvTranspose adds; its NHWC rows are then moved
    into place (Reshape, Transpose, Reshape: 0.5 ms less than DepthToSpace's uint8 NCHW
    shuffle on unet_like_int8) and the crop sliced off. Requantized as every quantized
    CONV_2D here (QLinearConv's float32 rescale, within a step of Android's fixed-point
    stage, as the ConvTranspose form's halves-away rounding was). ORT has no quantized
    ConvTranspose: the float form took a DequantizeLinear, a float ConvTranspose and eight
    elementwise passes. A U-Net decoder's 2x2 stride-2 upsampling (one tap per phase):
    unet_like_int8's ORT run 3.6-5.1 -> 2.5-2.6 ms, its output now equal to LiteRT's (was a
    step off); a 3x3 stride-2 SAME layer (2x2 taps, 16 products per input pixel where the
    kernel has 9) ... Float layers keep ConvTranspose (the 2x2 form made unet_like_float
    0.93x -> 1.01x LiteRT). The result in the operation's layout; None where the bias is
    not constant, a dimension unknown or a crop too deep (_phase_taps)."""
    inputs = operation.inputs
    filter_operand, output = g.operand(inputs[1]), g.operand(operation.outputs[0])
    channels_out, kernel_h, kernel_w, depth = filter_operand.dimensions
    stride_h, stride_w = strides
    top, left, bottom, right = pads
    bias = g.raw_constant(inputs[2])
    batches, height, width = source.dims[0], source.dims[2 if nchw else 1], source.dims[3 if nchw else 2]
    if bias is None or not (batches and height and width):
        return None
    rows_h = _phase_taps(kernel_h, stride_h, height, top, bottom)
    rows_w = _phase_taps(kernel_w, stride_w, width, left, right)
    if rows_h is None or rows_w is None:
        return None
    (taps_h, before_h, after_h, skip_h), (taps_w, before_w, after_w, skip_w) = rows_h, rows_w
    out_h = (height - 1) * stride_h + kernel_h - top - bottom
    out_w = (width - 1) * stride_w + kernel_w - left - right
    if out_h < 1 or out_w < 1:
        return None
    kept, centered = signed_weights(raw, filter_operand) if filter_operand.type in QUANT8 else (raw, False)
    # [Cout, ky, kx, Cin] -> [py, px, Cout, Cin, u, v]: phase (py, px)'s filter at tap (u, v)
    # is the kernel's (py + s_h * (T_h - 1 - u), px + s_w * (T_w - 1 - v)); past the kernel the
    # stored zero point, a product of nothing (q - 128 weights store it as zero point - 128)
    phased = np.full((stride_h, stride_w, channels_out, depth, taps_h, taps_w),
                     filter_zero_point(filter_operand, centered), kept.dtype)
    for py in range(stride_h):
        for u in range(taps_h):
            ky = py + stride_h * (taps_h - 1 - u)
            if ky >= kernel_h:
                continue
            for px in range(stride_w):
                for v in range(taps_w):
                    kx = px + stride_w * (taps_w - 1 - v)
                    if kx < kernel_w:
                        phased[py, px, :, :, u, v] = kept[:, ky, kx, :]
    phases = stride_h * stride_w
    weights = np.ascontiguousarray(phased.reshape(phases * channels_out, depth, taps_h, taps_w))
    scale, zero = _weight_quant(g, filter_operand, False, channels_out, True, centered)
    if filter_operand.type == T.TENSOR_QUANT8_SYMM_PER_CHANNEL:  # one scale per output channel, per phase
        scale = g.constant(np.tile(np.asarray(filter_operand.channel_quant.scales, np.float32), phases), "wscale")
        zero = g.constant(np.zeros(phases * channels_out, np.int8), "wzp")
    y = g.one("QLinearConv", [to_nchw(g, source.name, nchw), *g.qparams(source), g.constant(weights, "filter"), scale,
                              zero, *g.qparams(output), g.constant(np.tile(bias.astype(np.int32), phases), "bias")],
              kernel_shape=[taps_h, taps_w], pads=[before_h, before_w, after_h, after_w])
    computed_h = height + before_h + after_h - taps_h + 1
    computed_w = width + before_w + after_w - taps_w + 1
    cropped = (skip_h, skip_w, computed_h * stride_h, computed_w * stride_w) != (0, 0, out_h, out_w)
    if phases == 1 and not cropped:
        return from_nchw(g, y, nchw)
    nhwc = from_nchw(g, y, False)
    if phases > 1:
        blocks = g.one("Reshape", [nhwc, g.constant(np.array([batches, computed_h, computed_w, stride_h, stride_w,
                                                              channels_out], np.int64))])
        moved = g.one("Transpose", [blocks], perm=[0, 1, 3, 2, 4, 5])
        nhwc = g.one("Reshape", [moved, g.constant(np.array(
            [batches, computed_h * stride_h, computed_w * stride_w, channels_out], np.int64))])
    if cropped:
        nhwc = g.one("Slice", [nhwc, g.constant(np.array([skip_h, skip_w], np.int64)),
                               g.constant(np.array([skip_h + out_h, skip_w + out_w], np.int64)),
                               g.constant(np.array([1, 2], np.int64))])
    return g.one("Transpose", [nhwc], perm=NHWC_TO_NCHW) if nchw else nhwc


def _integers(g: GraphBuilder, value: Value) -> str:
    """A quant8 value's integers q - zero_point in float32 (exact)."""
    return g.one("DequantizeLinear", [value.name, g.constant(np.array(1.0, np.float32)),
                                      g.constant(np.array(value.zero_point, np.uint8))])


def _quantized_transpose_filter(g: GraphBuilder, operation: Operation, raw: np.ndarray | None,
                                channels_out: int) -> tuple[str, np.ndarray]:
    """A quantized TRANSPOSE_CONV_2D's filter as float32 integers in ONNX's [in, out, h, w]
    order and the per-output-channel real multipliers input scale * filter scale / output
    scale. The sums of products stay exact in float32 below 2^24: checked from the
    filter's values, or from its type's range for one given at run time (|q - zero point|
    <= 255 for quant8, |q| <= 128 for per-channel int8)."""
    filter_operand, output = g.operand(operation.inputs[1]), g.operand(operation.outputs[0])
    if filter_operand.type == T.TENSOR_QUANT8_SYMM_PER_CHANNEL:
        quant = filter_operand.channel_quant
        if quant is None or quant.channel_dim != 0:
            raise Declined("per-channel filter scales must run along the output channels")
        integers = None if raw is None else raw.astype(np.float64)
        scales, widest = np.asarray(quant.scales, np.float64), 128  # int8, zero point 0
    elif filter_operand.type in QUANT8:
        integers = None if raw is None else raw.astype(np.float64) - filter_operand.zero_point
        scales, widest = np.full(channels_out, filter_operand.scale, np.float64), 255
    else:
        raise Declined(f"a quantized TRANSPOSE_CONV_2D with a {type_name(filter_operand.type)} filter")
    taps = int(np.prod(filter_operand.dimensions[1:]))
    largest = 255 * (widest * taps if integers is None else
                     np.abs(integers).reshape(channels_out, -1).sum(axis=1).max())
    if largest >= 2 ** 24:
        raise Declined("the integer sums could leave float32's exact range")
    multipliers = (g.operand(operation.inputs[0]).scale * scales / output.scale).astype(np.float32)
    if integers is None:
        given = g.value(operation.inputs[1])
        # int8 per-channel integers are their own values: a Cast is exact
        exact = g.one("Cast", [given.name], to=TensorProto.FLOAT) if given.kind == "int8" else _integers(g, given)
        return g.one("Transpose", [exact], perm=[3, 0, 1, 2]), multipliers
    return g.constant(np.ascontiguousarray(integers.astype(np.float32).transpose(3, 0, 1, 2)), "filter"), multipliers


@lowers(OperationCode.BATCH_MATMUL)
def lower_batch_matmul(g: GraphBuilder, operation: Operation) -> None:
    """MatMul of the last two axes, each side Transposed there first when adjointed (a
    transformer's attention scores and context). Quantized: in float32 between
    DequantizeLinear and a quantization rounding halves away from zero, as Android."""
    a, b = g.value(operation.inputs[0]), g.value(operation.inputs[1])
    output = g.operand(operation.outputs[0])
    if a.rank < 2 or a.rank != b.rank or a.kind != b.kind or a.kind not in ("float", "uint8"):
        raise Declined("BATCH_MATMUL of float or quant8 tensors of one rank")
    names = []
    for value, position in ((a, 2), (b, 3)):
        name = g.dequantize(value)
        if g.optional_scalar(operation, position, False):
            perm = [*range(value.rank - 2), value.rank - 1, value.rank - 2]
            name = g.one("Transpose", [name], perm=perm)
        names.append(name)
    product = g.one("MatMul", names)
    g.set_output(operation.outputs[0], product if a.kind == "float" else quantize_half_away(g, product, output))
