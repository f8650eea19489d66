"""The lowering's channel padding: float NHWC values whose channels are not a multiple of ORT's
NCHWc block computed padded with zero channels where every consumer takes them so
(``wants_padding``, ``reads_padded``), and ``set_channels``, which keeps or cuts them.
"""

from __future__ import annotations

import numpy as np

from nnapi.codes import OperationCode
from nnapi.drivers.ort.builder import FLOATS, NCHWC_BLOCK, Declined, GraphBuilder, conv_params, resize_in_rows
from nnapi.hal import Operation


def padded_channels(channels: int) -> int:
    return -(-channels // NCHWC_BLOCK) * NCHWC_BLOCK


#: operations that take (and give) a float NHWC value with its channels padded with zeros
#: to the NCHWc block, when their parameters allow (reads_padded)
_PADDED_CONSUMERS = (OperationCode.CONV_2D, OperationCode.DEPTHWISE_CONV_2D, OperationCode.ADD, OperationCode.PAD,
                     OperationCode.PAD_V2, OperationCode.MAX_POOL_2D, OperationCode.AVERAGE_POOL_2D,
                     OperationCode.RELU, OperationCode.RELU1, OperationCode.RELU6, OperationCode.PRELU,
                     OperationCode.RESIZE_BILINEAR, OperationCode.MEAN, OperationCode.MUL,
                     OperationCode.HARD_SWISH)


def wants_padding(g: GraphBuilder, index: int) -> bool:
    """Whether float NHWC operand ``index``, whose channels are not a multiple of the
    NCHWc block, is better computed with them padded with zeros to the block: ORT keeps
    only block-aligned values in NCHWc between operators, so BlazeFace's 28-, 36- and
    42-channel residual blocks left it at every ADD, channel PAD and pooling (two reorders
    each, the ADD and PAD unvectorized); padded, the chain stays blocked and the PADs of
    the skip connections vanish (their zeros are already there). Only where every consumer
    takes the padded form (it is not a graph output), so no cut back is needed: the
    convolutions read the extra channels with zero weights and give zeros there, the
    element-wise operations and pooling keep zeros zero. (For a non-finite input a dense
    convolution's padded channels are NaN, 0 * inf, where its real ones are non-finite
    already.) The batch may be free (MediaPipe's face_landmarks_detector: ~25% of its time
    went to the 8-channel values, the channel PADs and the PRELUs around them leaving the
    blocked layout at every block, where at batch 1 they did not)."""
    operand = g.operand(index)
    dims = operand.dimensions
    if (g.isolated or operand.type not in FLOATS or len(dims) != 4 or not all(dims[1:]) or dims[3] % NCHWC_BLOCK == 0
            or dims[3] < NCHWC_BLOCK // 2 or index in g.subgraph.output_indexes):
        return False
    consumers = g.readers(index)
    return bool(consumers) and all(reads_padded(g, op, index) for op in consumers)


def reads_padded(g: GraphBuilder, operation: Operation, index: int) -> bool:
    """Whether ``operation`` lowers with input ``index`` in the padded form (as the padded
    branches of the lowerings do)."""
    code = operation.type
    inputs = list(operation.inputs)
    if code not in _PADDED_CONSUMERS or inputs.count(index) != 1:
        return False
    position = inputs.index(index)
    if g.operand(operation.outputs[0]).type not in FLOATS:
        return False
    try:
        if code in (OperationCode.CONV_2D, OperationCode.DEPTHWISE_CONV_2D):
            depthwise = code == OperationCode.DEPTHWISE_CONV_2D
            params = conv_params(g, operation, depthwise)
            return (position == 0 and not params.nchw and (not depthwise or params.multiplier == 1)
                    and g.raw_constant(inputs[1]) is not None and g.raw_constant(inputs[2]) is not None)
        if code == OperationCode.ADD:
            return position < 2 and g.operand(inputs[0]).dimensions == g.operand(inputs[1]).dimensions
        if code in (OperationCode.PAD, OperationCode.PAD_V2):
            paddings = g.raw_constant(inputs[1])
            return (position == 0 and paddings is not None and paddings.size == 8
                    and int(paddings.reshape(4, 2)[3, 0]) == 0 and pad_value_is_zero(g, operation))
        if code in (OperationCode.MAX_POOL_2D, OperationCode.AVERAGE_POOL_2D):
            return position == 0 and not pool_layout_nchw(g, operation)
        if code == OperationCode.RESIZE_BILINEAR:
            if position != 0 or g.optional_scalar(operation, 3, False) or resize_in_rows(g, operation):
                return False
            # An enlarging resize whose result is cut back to the real channels anyway (a
            # segmentation head's logits to ARG_MAX: 21 of 32 channels at 257x257) would
            # blend and move the zero channels at the large size: cut them before it
            out_dims = g.operand(operation.outputs[0]).dimensions
            enlarges = out_dims[1] * out_dims[2] > g.operand(index).dimensions[1] * g.operand(index).dimensions[2]
            return not enlarges or wants_padding(g, operation.outputs[0])
        if code == OperationCode.MEAN:
            axes = g.raw_constant(inputs[1])
            return (position == 0 and axes is not None and sorted({int(a) % 4 for a in np.atleast_1d(axes)}) == [1, 2]
                    and bool(g.scalar(inputs[2])))
        if code == OperationCode.MUL:
            return position < 2 and _padded_product(g, operation, position)
        if code == OperationCode.PRELU:
            alpha = g.raw_constant(inputs[1])
            return position == 0 and alpha is not None and alpha.size > 0 and bool(np.isfinite(alpha).all()) and (
                len(g.operand(inputs[1]).dimensions) <= 4 and all(d == 1 for d in alpha.shape[:-1]))
    except (Declined, ValueError, TypeError, IndexError):
        return False
    return True  # RELU, RELU1, RELU6


def _padded_product(g: GraphBuilder, operation: Operation, position: int) -> bool:
    """Whether a float MUL takes its input ``position`` with channels padded to the NCHWc
    block: a squeeze-and-excitation block's scalings on 72 or 120 channels (MobileNet v3),
    which left ORT's blocked layout at each (ReorderOutput, Slice, Transpose, ReduceMean
    and back: ~90 us per block, where the 16-aligned blocks stay blocked). The other
    operand is a finite constant (a scalar or one per channel: the padded channels scaled
    by 0), or a [N, 1, 1, C] gate scaling an [N, H, W, C] value (a gate not padded is
    padded after, a few floats; the gate is padded where the value is)."""
    inputs = operation.inputs
    mine, other = g.operand(inputs[position]).dimensions, inputs[1 - position]
    dims = list(g.operand(other).dimensions)
    if len(mine) != 4 or g.operand(other).type not in FLOATS:
        return False
    real = mine[3]
    known = g.raw_constant(other)
    if known is not None:
        return (known.size in (1, real) and all(d == 1 for d in dims[:-1]) and (not dims or dims[-1] in (1, real))
                and bool(np.isfinite(known).all()))
    gate = [mine[0], 1, 1, real]
    if list(mine) == gate and len(dims) == 4 and dims[0] == mine[0] and dims[3] == real and dims[1] * dims[2] > 1:
        return wants_padding(g, other)
    return dims == gate and mine[1] * mine[2] > 1


def pad_value_is_zero(g: GraphBuilder, operation: Operation) -> bool:
    return operation.type == OperationCode.PAD or float(g.scalar(operation.inputs[2])) == 0.0


def pool_layout_nchw(g: GraphBuilder, operation: Operation) -> bool:
    return bool(g.optional_scalar(operation, 10 if len(operation.inputs) in (10, 11) else 7, False))


def pad_channels(g: GraphBuilder, name: str, extra: int) -> str:
    """NHWC ``name`` with ``extra`` zero channels after its own."""
    pads = g.constant(np.array([0, 0, 0, 0, 0, 0, 0, extra], np.int64))
    return g.one("Pad", [name, pads, g.constant(np.array(0.0, np.float32))], mode="constant")


def set_channels(g: GraphBuilder, index: int, name: str, channels: int) -> None:
    """Output ``index`` computed as NHWC ``name`` with ``channels`` channels: the real
    ones, then zeros. Kept padded where every consumer takes it so (wants_padding),
    else cut to the real channels."""
    real = g.operand(index).dimensions[3]
    if channels == real:
        g.set_output(index, name)
    elif channels == padded_channels(real) and wants_padding(g, index):
        g.padded[index] = (name, channels)
    else:
        g.set_output(index, g.channel_slice(name, real))
