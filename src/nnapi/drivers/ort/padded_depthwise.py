"""Quantized depthwise convolutions on channel counts off a multiple of 16, computed with
their channels padded to one: the chains that feed and read them carry the padding.

ORT's quantized depthwise kernel (QLinearConv with group = channels) runs 2.5-3x slower
per multiply-add when the channel count is not a multiple of 16: a 28x28x88 3x3 layer
49 us where 96 channels take 21, 56x56x72 stride 2 43 against 19 for 80 (channels-last,
single thread; 80 / 96 / 112 / 128 all run at full rate, 24 / 40 / 56 / 72 / 88 / 104 /
120 / 184 / 200 at a third). MobileNetV3's expansions (72, 88, 120, 184, 200) are such
counts. A Pad before the layer and a Slice after it cost about what they save (and more
at stride 2, where the input is four times the output), so the padding comes from the
convolution that writes the layer's input instead: that CONV_2D computes the extra
channels with zero filters and zero biases (their values the zero point: real 0, which a
fused RELU / RELU1 / RELU6 keeps), the depthwise layer computes them with zero taps and
zero biases (the zero point again), and a CONV_2D reading its output takes the extra
input channels with zero taps. Every real channel sums the very integer products it did
and is requantized with its own scale: the outputs are the plain lowering's bit for bit.
A 1x1 convolution's cost barely moves with 8 more channels (28x28 24 -> 88 / 96: 11.2 /
11.1 us; 72 / 80 -> 24 at 56x56: 23.3 / 24.9 us).

Only where every reader of a padded value takes it so (a quantized NHWC CONV_2D or
DEPTHWISE_CONV_2D with constant filter and bias, the value its input; a depth multiplier
of 1): otherwise the value is cut back to its real channels (one Slice) or, for a
CONV_2D's output, not padded at all. A CONV_2D pads its output only for a depthwise
reader, where the gain is, and not where the plain lowering merges its columns (an
image's 3 channels: that form saves more). A stride-1 depthwise layer whose input no
convolution padded pads it with one Pad of the zero point (28x28x88 3x3: 49 -> 32 us
with a Slice after it); at stride 2 the Pad of the four times larger input costs more
than the layer saves.
"""

from __future__ import annotations

import numpy as np

from nnapi.codes import OperandCode, OperationCode
from nnapi.drivers.ort.builder import (
    QUANT8,
    Declined,
    GraphBuilder,
    conv_params,
    from_nchw,
    fused_activation,
    lowers,
    to_nchw,
)
from nnapi.drivers.ort.convolutions import (
    SYM_INPUT_CHANNEL_ALIGN,
    constant_filter,
    conv_attributes,
    filter_zero_point,
    lower_conv,
    merges_few_outputs,
)
from nnapi.hal import Operation

T = OperandCode
Op = OperationCode
#: ORT's quantized depthwise kernel runs at full rate on multiples of this many channels
DEPTHWISE_CHANNEL_BLOCK = 16
#: the fewest real channels worth padding (a few channels more than double the work)
_MIN_CHANNELS = DEPTHWISE_CHANNEL_BLOCK // 2


def padded_count(channels: int) -> int:
    return -(-channels // DEPTHWISE_CHANNEL_BLOCK) * DEPTHWISE_CHANNEL_BLOCK


def _off_block(dims: list[int]) -> bool:
    """An NHWC shape, fully known, whose channels are worth padding to the block."""
    return len(dims) == 4 and all(dims) and dims[3] % DEPTHWISE_CHANNEL_BLOCK != 0 and dims[3] >= _MIN_CHANNELS


def takes_padded(g: GraphBuilder, operation: Operation, index: int) -> bool:
    """Whether ``operation`` reads operand ``index`` in the padded form (_padded_conv
    below lowers it so): a quantized NHWC CONV_2D / DEPTHWISE_CONV_2D (multiplier 1) with
    a constant filter and bias, ``index`` its input only. A stride-1 CONV_2D to fewer than
    FEW_OUTPUTS channels that the lowering runs with pixels merged
    (convolutions.merges_few_outputs) reads its input unpadded; one it runs plain (an odd
    count above 8 of a kernel larger than 1x1, a width the factor does not divide, weights
    not symmetric, ...) takes it padded."""
    if operation.type not in (Op.CONV_2D, Op.DEPTHWISE_CONV_2D) or list(operation.inputs).count(index) != 1 \
            or operation.inputs[0] != index:
        return False
    inputs = operation.inputs
    depthwise = operation.type == Op.DEPTHWISE_CONV_2D
    if g.operand(operation.outputs[0]).type not in QUANT8 or g.raw_constant(inputs[1]) is None \
            or g.raw_constant(inputs[2]) is None or g.operand(inputs[2]).type != T.TENSOR_INT32:
        return False
    filter_operand = g.operand(inputs[1])
    if filter_operand.type == T.TENSOR_QUANT8_SYMM_PER_CHANNEL:
        quant = filter_operand.channel_quant
        if quant is None or quant.channel_dim != (3 if depthwise else 0):
            return False
    elif filter_operand.type not in QUANT8:
        return False
    try:
        params = conv_params(g, operation, depthwise)
    except (Declined, ValueError, TypeError, IndexError):
        return False
    dims = filter_operand.dimensions
    if params.nchw or len(dims) != 4 or (depthwise and (params.multiplier != 1 or dims[0] != 1)):
        return False
    if not depthwise and merges_few_outputs(g, operation, params):
        return False
    return True


def _merges_columns(g: GraphBuilder, operation: Operation) -> bool:
    """Whether the plain lowering runs this CONV_2D in its merged-columns form (an image's
    3 channels, or a stride-1 layer to fewer than FEW_OUTPUTS channels whose pixels it
    merges: convolutions.merges_few_outputs): kept, and its output not padded
    (MobileNet-like stems: 31 us merged against 81 us plain)."""
    if operation.type != Op.CONV_2D:
        return False
    try:
        params = conv_params(g, operation, False)
    except (Declined, ValueError, TypeError, IndexError):
        return False
    few = merges_few_outputs(g, operation, params)
    return g.operand(operation.inputs[0]).dimensions[3] % SYM_INPUT_CHANNEL_ALIGN != 0 or few


def _keeps_padding(g: GraphBuilder, index: int, for_depthwise: bool) -> bool:
    """Whether 8-bit NHWC operand ``index`` (channels not a block multiple) is best kept
    padded: every reader takes it so, and (``for_depthwise``) one of them is a depthwise
    convolution."""
    operand = g.operand(index)
    if g.isolated or operand.type not in QUANT8 or not _off_block(operand.dimensions) \
            or index in g.subgraph.output_indexes:
        return False
    readers = g.readers(index)
    if not readers or not all(takes_padded(g, reader, index) for reader in readers):
        return False
    return not for_depthwise or any(reader.type == Op.DEPTHWISE_CONV_2D for reader in readers)


def _padded_conv(g: GraphBuilder, operation: Operation) -> bool:
    """The convolution with its input, output or both padded (see the module's
    docstring); False where it does not apply (the plain lowering then runs)."""
    if g.isolated:
        return False
    depthwise = operation.type == Op.DEPTHWISE_CONV_2D
    inputs, index = operation.inputs, operation.outputs[0]
    output = g.operand(index)
    padded_in = inputs[0] in g.padded
    pad_out = not depthwise and not _merges_columns(g, operation) and _keeps_padding(g, index, True)
    # a depthwise layer whose input no convolution padded: a Pad of its input where the
    # stride is 1 (28x28x88 3x3 49 -> 32 us with a Slice after; at stride 2 the Pad of the
    # larger input costs more than it saves)
    try:
        params = conv_params(g, operation, depthwise)
    except (Declined, ValueError, TypeError, IndexError):
        return False  # the plain lowering says why
    pad_in = depthwise and not padded_in and params.strides == [1, 1] and _off_block(g.operand(inputs[0]).dimensions)
    if not (padded_in or pad_out or pad_in) or not takes_padded(g, operation, inputs[0]) \
            or g.operand(inputs[0]).type not in QUANT8:
        return False
    known = constant_filter(g, inputs[1], depthwise)
    if known is None:
        return False
    array, centered = known
    filter_operand = g.operand(inputs[1])
    real_in = g.operand(inputs[0]).dimensions[3]
    if array.shape[0 if depthwise else 1] != real_in:
        return False
    if padded_in:
        source, depth = g.padded[inputs[0]]
    elif pad_in:
        depth = padded_count(real_in)
        pads = g.constant(np.array([0, 0, 0, 0, 0, 0, 0, depth - real_in], np.int64))
        source = g.one("Pad", [g.value(inputs[0]).name, pads, g.qparams(g.operand(inputs[0]))[1]], mode="constant")
    else:
        source, depth = g.value(inputs[0]).name, real_in
    real_out = output.dimensions[3]
    channels = depth if depthwise else (padded_count(real_out) if pad_out else real_out)
    # taps and filters added hold the weights' zero point: (w - zero point) = 0 in every product
    per_channel = filter_operand.type == T.TENSOR_QUANT8_SYMM_PER_CHANNEL
    zero = filter_zero_point(filter_operand, centered)
    if depthwise:
        weights = np.pad(array, ((0, channels - array.shape[0]), (0, 0), (0, 0), (0, 0)), constant_values=zero)
    else:
        weights = np.pad(array, ((0, channels - array.shape[0]), (0, depth - array.shape[1]), (0, 0), (0, 0)),
                         constant_values=zero)
    if per_channel:
        scales = np.asarray(filter_operand.channel_quant.scales, np.float32)
        # a padded filter's scale only scales its zero sums: any positive value
        w_scale = g.constant(np.pad(scales, (0, channels - scales.size), constant_values=1.0), "wscale")
        w_zero = g.constant(np.zeros(channels, np.int8), "wzp")
    else:
        w_scale = g.constant(np.array(filter_operand.scale, np.float32), "wscale")
        w_zero = g.constant(np.array(zero, weights.dtype), "wzp")
    bias = np.pad(g.raw_constant(inputs[2]).astype(np.int32).reshape(-1), (0, channels - real_out))
    attributes = conv_attributes(params, list(weights.shape[2:]), channels if depthwise else 1)
    y = g.one("QLinearConv", [to_nchw(g, source, False), *g.qparams(g.operand(inputs[0])),
                              g.constant(np.ascontiguousarray(weights), "filter"), w_scale, w_zero,
                              *g.qparams(output), g.constant(bias, "w")], **attributes)
    y = fused_activation(g, from_nchw(g, y, False), params.fuse, output)
    if channels == real_out:
        g.set_output(index, y)
    elif pad_out or _keeps_padding(g, index, False):
        g.padded[index] = (y, channels)
    else:
        g.set_output(index, g.channel_slice(y, real_out))
    return True


@lowers(OperationCode.CONV_2D, OperationCode.DEPTHWISE_CONV_2D)
def lower_conv_padded(g: GraphBuilder, operation: Operation) -> None:
    """CONV_2D / DEPTHWISE_CONV_2D, quantized chains around a depthwise layer off the
    channel block padded (see the module's docstring); otherwise ``convolutions.lower_conv``."""
    if not _padded_conv(g, operation):
        lower_conv(g, operation)
