"""A float RESIZE_BILINEAR read only by a 1x1 CONV_2D to fewer channels, lowered to ONNX
Runtime with the convolution first: both are linear, so the convolution of the resized
image is the resize of the convolved one, and the convolution's multiply-adds shrink by the
resize's area factor.

MediaPipe's pose_detector (BlazePose's feature pyramid) doubles its 7x7x1152 features to
14x14 and reduces them to 192 channels with a 1x1 convolution (43M multiply-adds, ~360 us
of its ~5 ms on ORT), then 14x14x192 to 28x28 and to 96 channels (14M). Here

    CONV_2D(RESIZE_BILINEAR(x), W, b, act)  ->  act(RESIZE_BILINEAR(CONV_2D(x, W, 0)) + b)

the bias and activation after the resize as an identity 1x1 depthwise convolution (x * 1
+ b, ORT's blocked layout keeps it and fuses the clamp into it). Each output is the same
sum of the same products and blend weights in another order (float32 rounding; the blend
weights sum to 1, so the bias is the same). Only NHWC float32 values, a RESIZE_BILINEAR
whose output is read by that one convolution (as its input, once) and nothing else, and a
1x1 convolution of stride 1 without padding with a constant filter and bias.
"""

from __future__ import annotations

import numpy as np

from nnapi.codes import FuseCode, OperandCode, OperationCode
from nnapi.drivers.ort.builder import GraphBuilder, Value, conv_params, from_nchw, fused_activation, lowers, to_nchw
from nnapi.drivers.ort.quantized_resize import lower_resize_bilinear_chain
from nnapi.hal import Operation

T = OperandCode
Op = OperationCode


def _reducing_conv(g: GraphBuilder, resize: Operation) -> Operation | None:
    """The 1x1 CONV_2D to fewer channels that alone reads ``resize``'s output, or None."""
    index = resize.outputs[0]
    readers = g.readers(index)
    if len(readers) != 1 or index in g.subgraph.output_indexes or g.isolated:
        return None
    conv = readers[0]
    if conv.type != Op.CONV_2D or conv.inputs[0] != index or list(conv.inputs).count(index) != 1:
        return None
    source, output = g.operand(resize.inputs[0]), g.operand(conv.outputs[0])
    dims = list(g.operand(index).dimensions)
    weights, bias = g.raw_constant(conv.inputs[1]), g.raw_constant(conv.inputs[2])
    if (source.type != T.TENSOR_FLOAT32 or output.type != T.TENSOR_FLOAT32 or len(dims) != 4 or not all(dims[1:])
            or weights is None or bias is None or weights.ndim != 4 or weights.shape[1:] != (1, 1, dims[3])
            or weights.shape[0] >= dims[3] or resize.inputs[0] in g.padded):
        return None
    if len(resize.inputs) > 3 and g.optional_scalar(resize, 3, False):
        return None  # NCHW
    params = conv_params(g, conv, False)
    fuses = (FuseCode.FUSED_NONE, FuseCode.FUSED_RELU, FuseCode.FUSED_RELU1, FuseCode.FUSED_RELU6)
    if params.nchw or params.strides != [1, 1] or any(params.pads or []) or params.fuse not in fuses:
        return None
    return conv if list(output.dimensions)[1:3] == dims[1:3] else None


@lowers(Op.RESIZE_BILINEAR)
def lower_resize_then_pointwise(g: GraphBuilder, operation: Operation) -> None:
    """RESIZE_BILINEAR, and where a 1x1 CONV_2D to fewer channels alone reads it, the two
    as the module's docstring says (the convolution first)."""
    conv = _reducing_conv(g, operation)
    if conv is None:
        lower_resize_bilinear_chain(g, operation)
        return
    x = g.value(operation.inputs[0])
    weights = g.raw_constant(conv.inputs[1]).astype(np.float32)
    channels = weights.shape[0]
    filters = g.constant(np.ascontiguousarray(weights.transpose(0, 3, 1, 2)), "filter")
    reduced = from_nchw(g, g.one("Conv", [to_nchw(g, x.name, False), filters], kernel_shape=[1, 1]), False)
    # the resize's own lowering, on the reduced value in place of its input (same height and width)
    index = operation.inputs[0]
    g.values[index] = Value(reduced, "float", [*x.dims[:3], channels])
    try:
        lower_resize_bilinear_chain(g, operation)
    finally:
        g.values[index] = x
    resized = g.values.pop(operation.outputs[0]).name
    bias = g.constant(g.raw_constant(conv.inputs[2]).astype(np.float32).reshape(-1), "w")
    ones = g.constant(np.ones((channels, 1, 1, 1), np.float32), "scale")
    y = g.one("Conv", [to_nchw(g, resized, False), ones, bias], group=channels, kernel_shape=[1, 1])
    y = fused_activation(g, y, conv_params(g, conv, False).fuse, g.operand(conv.outputs[0]))
    g.set_output(conv.outputs[0], from_nchw(g, y, False))
    g.covered.add(id(conv))
