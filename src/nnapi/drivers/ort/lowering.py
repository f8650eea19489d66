"""Lowering: one HAL subgraph to one ONNX graph (``lower_model``), the device's question
whether one operation lowers (``operation_support``), and the operations' lowerings not yet
in a module of their family's (quantization.py, convolutions.py, elementwise.py,
normalization.py, resize.py hold theirs, each registered by importing it here).
"""

from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from nnapi.codes import FuseCode, OperationCode
from nnapi.drivers.ort import (
    convolutions,  # noqa: F401  (importing it registers its lowerings)
    elementwise,  # noqa: F401  (importing it registers its lowerings)
    normalization,  # noqa: F401  (importing it registers its lowerings)
    quantization,  # noqa: F401  (importing it registers its lowerings)
    resize,  # noqa: F401  (importing it registers its lowerings)
)
from nnapi.drivers.ort.builder import (
    FLOATS,
    HAL_ELEM,
    KIND_ELEM,
    MS_DOMAIN,
    NCHW_TO_NHWC,
    NHWC_TO_NCHW,
    NUMPY_KIND,
    QUANT8,
    Declined,
    GraphBuilder,
    L,
    T,
    Value,
    blocked,
    check_same_quantization,
    constant_axis,
    constant_ints,
    conv_params,
    fail_unless,
    from_nchw,
    fused_activation,
    has_kernel,
    internal_kind,
    internal_zero_point,
    keep_blocked,
    lower_operation,
    lowers,
    onnx_model,
    pad_value_is_zero,
    padded_channels,
    pool_layout_nchw,
    read_counts,
    reads_padded,
    require_rank,
    run_time_form,
    same_pads,
    to_nchw,
    type_name,
    wants_padding,
)
from nnapi.drivers.ort.composites import LAYER_NORM, QUANTIZED_SWISH, find_composites
from nnapi.drivers.ort.padded_add import split_padded_adds
from nnapi.drivers.ort.scalar_broadcast import widen_scalars
from nnapi.drivers.ort.shapes import infer_temporary_shapes
from nnapi.drivers.ort.twins import merge_twin_branches
from nnapi.hal import Model, Operand, Operation


@lowers(OperationCode.AVERAGE_POOL_2D, OperationCode.MAX_POOL_2D, OperationCode.L2_POOL_2D)
def lower_pool(g: GraphBuilder, operation: Operation) -> None:
    code = OperationCode(operation.type)
    inputs = operation.inputs
    # channels padded to the NCHWc block (wants_padding): the pooled zeros stay zeros
    padded = (code != OperationCode.L2_POOL_2D and g.operand(operation.outputs[0]).type in FLOATS
              and inputs[0] in g.padded and not pool_layout_nchw(g, operation))
    pad = g.producer(inputs[0])
    added = (pad_of_max_pool(g, pad) if pad is not None and pad.type in (OperationCode.PAD, OperationCode.PAD_V2)
             else None)
    if added is not None:  # the PAD before it, as more of its own padding
        explicit = len(inputs) in (10, 11)
        own, kernel = max_pool_padding(g, operation, list(g.operand(inputs[0]).dimensions))
        strides = [int(g.scalar(inputs[i])) for i in ((6, 5) if explicit else (3, 2))]
        source = g.value(pad.inputs[0])
        y = g.one("MaxPool", [to_nchw(g, source.name, False)], kernel_shape=kernel, strides=strides,
                  pads=[a + b for a, b in zip(own, added)])
        fuse = int(g.scalar(inputs[9 if explicit else 6]))
        g.set_output(operation.outputs[0], fused_activation(g, from_nchw(g, y, False), fuse,
                                                            g.operand(operation.outputs[0])))
        return
    x = g.blocked_value(inputs[0]) if padded else g.value(inputs[0])
    require_rank(x, 4, "the input")
    output = g.operand(operation.outputs[0])
    if len(inputs) in (10, 11):
        left, right, top, bottom = (int(g.scalar(inputs[i])) for i in (1, 2, 3, 4))
        stride_w, stride_h, filter_w, filter_h = (int(g.scalar(inputs[i])) for i in (5, 6, 7, 8))
        fuse, nchw = int(g.scalar(inputs[9])), bool(g.optional_scalar(operation, 10, False))
        padding: dict = {"pads": [top, left, bottom, right]}
    else:
        scheme = int(g.scalar(inputs[1]))
        stride_w, stride_h, filter_w, filter_h = (int(g.scalar(inputs[i])) for i in (2, 3, 4, 5))
        fuse, nchw = int(g.scalar(inputs[6])), bool(g.optional_scalar(operation, 7, False))
        if scheme not in (1, 2):
            raise Declined(f"padding scheme {scheme} is not valid")
        padding = ({"pads": same_pads(x.dims, nchw, (filter_h, filter_w), (stride_h, stride_w), (1, 1))}
                   if scheme == 1 else {"auto_pad": "VALID"})
    attributes = {"kernel_shape": [filter_h, filter_w], "strides": [stride_h, stride_w], **padding}
    if code == OperationCode.AVERAGE_POOL_2D and output.type in QUANT8 and filter_h * filter_w <= _NUDGED_TAPS:
        y = _quantized_average_pool(g, x, output, attributes, nchw)
        g.set_output(operation.outputs[0], fused_activation(g, y, fuse, output))
        return
    name = to_nchw(g, x.name, nchw)
    if code == OperationCode.MAX_POOL_2D and output.type in QUANT8:
        if x.scale != output.scale or x.zero_point != internal_zero_point(output):
            raise Declined("quantized MAX_POOL_2D with different input and output quantization")
        y = g.one("MaxPool", [name], **attributes)
    elif output.type in FLOATS or output.type in QUANT8:
        real = g.dequantize(Value(name, x.kind, x.dims, x.scale, x.zero_point))
        if code == OperationCode.MAX_POOL_2D:
            y = g.one("MaxPool", [real], **attributes)
        elif code == OperationCode.AVERAGE_POOL_2D:
            y = g.one("AveragePool", [real], count_include_pad=0, **attributes)
        else:  # the root of the mean of squares over the window's valid pixels
            if output.type not in FLOATS:
                raise Declined("quantized L2_POOL_2D is not supported")
            y = g.one("Sqrt", [g.one("AveragePool", [g.one("Mul", [real, real])], count_include_pad=0,
                                     **attributes)])
        if output.type in QUANT8:
            y = g.quantize(y, output)
    else:
        raise Declined(f"{code.name} on {type_name(output.type)} is not supported")
    y = from_nchw(g, y, nchw)
    y = fused_activation(g, y, fuse, output)
    if padded:
        g.set_channels(operation.outputs[0], y, x.dims[3])
    else:
        g.set_output(operation.outputs[0], y)



#: the widest window whose quantized average _quantized_average_pool rounds exactly
_NUDGED_TAPS = 1024


#: how far it scales an average away from zero before rounding half to even: 2**-20
_NUDGE = 2.0 ** -20



def _quantized_average_pool(g: GraphBuilder, x: Value, output: Operand, attributes: dict, nchw: bool) -> str:
    """A quantized AVERAGE_POOL_2D (NNAPI keeps the input's scale and zero point: an
    integer average) as Android computes it: the sum of the window's stored values over
    the count of its real pixels, rounded half away from zero. ORT's float AveragePool
    computes it in its blocked layout, the Cast to float before it and the rounding after
    it fused with the reorders: about four times faster than the QLinearAveragePool ORT
    makes of DequantizeLinear -> AveragePool -> QuantizeLinear (Inception v3's nine 3x3
    pools: ~9 of ~29 ms), which rounds halves to even besides.

    Exact for windows of up to 1024 taps: the stored values (u = q, or q + 128 for int8,
    whose average is of q = u - 128) and their sum are exact in float32, the quotient
    sum / count within ~2**-23 of it relatively. QuantizeLinear rounds half to even, so
    the average a, centered on the stored zero (128 for int8), is scaled by 1 + 2**-20
    (through QuantizeLinear's scale) first: a half (sum / count with count even) moves
    away from zero by |a| * 2**-20, four times its rounding error, and off the tie; a
    quotient that is not a half lies at least 1 / (2 * count) >= 2**-11 from one, and
    moves by at most 255 * 2**-20 ~ 2**-12, its error included.

    A window that never reaches past the edges (no padding: DenseNet's 2x2 transitions)
    is a 1x1-per-channel sum instead: _summed_average_pool."""
    summed = _summed_average_pool(g, x, output, attributes, nchw)
    if summed is not None:
        return summed
    values = g.one("Cast", [x.name], to=TensorProto.FLOAT)
    pooled = from_nchw(g, g.one("AveragePool", [to_nchw(g, values, nchw)], count_include_pad=0, **attributes),
                       nchw)
    center = 128 if output.type == T.TENSOR_QUANT8_ASYMM_SIGNED else 0
    if center:
        pooled = g.one("Add", [pooled, g.constant(np.array(-center, np.float32))])
    return g.one("QuantizeLinear", [pooled, g.constant(np.array(1.0 / (1.0 + _NUDGE), np.float32)),
                                    g.constant(np.array(center, np.uint8))])



def _summed_average_pool(g: GraphBuilder, x: Value, output: Operand, attributes: dict, nchw: bool) -> str | None:
    """_quantized_average_pool's average where every window lies inside the image (no
    padding, so every count is the window's area) as a depthwise QLinearConv of ones: the
    int32 sum of the stored values less the stored zero (0, or 128 for int8), times
    float32((1 + 2**-20) / area) (its x scale; w and y scales 1), rounded half to even plus
    that zero: the same exact sum and the same nudged quotient as the float route (the
    scale's own rounding, 2**-24 relatively, is within the nudge's margin likewise). ORT
    runs it in its NHWC depthwise kernel, where the float route's Transposes, Cast,
    reorders into and out of NCHWc, Add and QuantizeLinear took ~4.5x the time (56x56x128
    2x2 stride 2: 117 -> 26 us alone) and left DenseNet's next dense block in NCHW (a
    Transpose before each convolution and after each concatenation). None with padding,
    an unknown channel count, or for a support query."""
    channels = x.dims[1 if nchw else 3]
    if g.isolated or not channels or any(attributes.get("pads", [])):
        return None
    kernel_h, kernel_w = attributes["kernel_shape"]
    center = np.array(128 if output.type == T.TENSOR_QUANT8_ASYMM_SIGNED else 0, np.uint8)
    one = g.constant(np.array(1, np.float32), "one")
    ones = g.constant(np.ones((channels, 1, kernel_h, kernel_w), np.int8), "ones")
    y = g.one("QLinearConv", [to_nchw(g, x.name, nchw),
                              g.constant(np.array((1.0 + _NUDGE) / (kernel_h * kernel_w), np.float32), "scale"),
                              g.constant(center, "zp"), ones, one, g.constant(np.array(0, np.int8), "wzp"), one,
                              g.constant(center, "zp")],
              kernel_shape=[kernel_h, kernel_w], strides=attributes["strides"], pads=[0, 0, 0, 0], group=channels)
    return from_nchw(g, y, nchw)



@lowers(OperationCode.MEAN)
def lower_mean(g: GraphBuilder, operation: Operation) -> None:
    output = g.operand(operation.outputs[0])
    if output.type in FLOATS and operation.inputs[0] in g.padded and reads_padded(g, operation, operation.inputs[0]):
        # channels padded to the NCHWc block (wants_padding; the height and width, kept):
        # the mean of zeros is zero
        x = g.blocked_value(operation.inputs[0])
        pooled = from_nchw(g, g.one("GlobalAveragePool", [to_nchw(g, x.name, False)]), False)
        g.set_channels(operation.outputs[0], pooled, x.dims[3])
        return
    x = g.value(operation.inputs[0])
    if g.raw_constant(operation.inputs[1]) is None:  # the axes given at run time
        g.set_output(operation.outputs[0], run_time_form(g, operation, x))
        return
    axes = np.atleast_1d(np.asarray(g.scalar(operation.inputs[1]))).astype(np.int64)
    keep = int(g.scalar(operation.inputs[2])) != 0
    if x.rank == 0 or np.any(axes < -x.rank) or np.any(axes >= x.rank):
        raise Declined("MEAN axes out of range")
    axes = sorted({int(a) % x.rank for a in axes})
    source = g.dequantized.get(operation.inputs[0])
    if output.type == T.TENSOR_FLOAT32 and axes == [1, 2] and source is not None and all(x.dims):
        y = _integer_mean(g, source, keep)
        g.integer_means.add(operation.outputs[0])
    elif output.type in FLOATS and axes == [1, 2] and blocked(x.dims, x.kind) and not g.isolated:
        # the global pool of a squeeze-and-excitation block: ORT keeps GlobalAveragePool in
        # its blocked layout (the gate's convolutions after it too), where ReduceMean
        # reorders the whole value out first (the same sum of the same terms, in order);
        # on a free batch too (the Reshape's 0 copies it; zoo4's dyn_batch_float: 2.2 -> 1.4x)
        pooled = from_nchw(g, g.one("GlobalAveragePool", [to_nchw(g, x.name, False)]), False)
        shape = [x.dims[0], 1, 1, x.dims[3]] if keep else [x.dims[0], x.dims[3]]
        y = pooled if keep else g.one("Reshape", [pooled, g.constant(np.array(shape, np.int64))])
    elif output.type in FLOATS:
        y = _reduce_mean(g, x.name, x.dims, axes, keep)
    elif output.type in QUANT8 and all(x.dims):
        y = _quantized_mean(g, x, axes, keep, internal_zero_point(output) - output.zero_point)
    elif output.type in QUANT8:  # a shape known at run time: its groups may be empty
        y = run_time_form(g, operation, x)
    else:
        raise Declined(f"MEAN on {type_name(output.type)} is not supported")
    g.set_output(operation.outputs[0], y)



def _integer_mean(g: GraphBuilder, x: Value, keep: bool) -> str:
    """The float32 MEAN over NHWC's height and width of a DEQUANTIZE of the 8-bit ``x``
    (TFLite's quantized MEAN, imported as DEQUANTIZE, MEAN, QUANTIZE: the pool of an
    efficientnet's squeeze-and-excitation block), from ``x`` itself: the sums of q - zero
    point are a MatMulInteger of a row of ones with the [height * width, channels] matrix,
    exact in int32, then scaled by scale / count once. ORT reads the 8-bit values once
    (~0.07 ns per element) where the dequantized float copy, written then summed, took
    ~0.3-0.4 (and a Transpose before it). The same mean as the float sum of the
    dequantized values, better rounded (one float32 product of the exact sum). The
    DEQUANTIZE's node, read by nothing else, is dropped (_drop_unread_nodes)."""
    n, height, width, channels = x.dims
    rows = g.one("Reshape", [x.name, g.constant(np.array([n, height * width, channels], np.int64))])
    sums = g.one("MatMulInteger", [g.constant(np.ones((1, height * width), np.uint8), "ones"), rows,
                                   g.constant(np.array(0, np.uint8)), g.constant(np.array(x.zero_point, np.uint8))])
    # reshaped before the scaling: ORT's QDQ propagation would move a DequantizeLinear of
    # int32 past the Reshape as an int32 QuantizeLinear, which it then refuses
    shape = [n, 1, 1, channels] if keep else [n, channels]
    sums = g.one("Reshape", [sums, g.constant(np.array(shape, np.int64))])
    return g.one("DequantizeLinear", [sums, g.constant(np.array(x.scale / (height * width), np.float32)),
                                      g.constant(np.array(0, np.int32))])



def _quantized_mean(g: GraphBuilder, x: Value, axes: list[int], keep: bool, offset: int) -> str:
    """The quantized MEAN (in the input's quantization) of ``x`` of known dimensions over
    constant ``axes``, exactly as the reference: the int32 sums of the stored values (over
    NHWC's height and width a MatMulInteger of a row of ones, as _integer_mean; else a
    ReduceSum), then rounded_mean. QuantizeLinear of a float mean would round halves to
    even and miss a step here and there (5 of 64 six-value means of random uint8s). A
    1x7x7x1024 global pool: ~13 us either way."""
    count = math.prod(x.dims[a] for a in axes)
    if x.rank == 4 and axes == [1, 2]:
        n, height, width, channels = x.dims
        rows = g.one("Reshape", [x.name, g.constant(np.array([n, height * width, channels], np.int64))])
        zero = g.constant(np.array(0, np.uint8))
        sums = g.one("MatMulInteger", [g.constant(np.ones((1, height * width), np.uint8), "ones"), rows, zero, zero])
        shape = [n, 1, 1, channels] if keep else [n, channels]
        sums = g.one("Reshape", [sums, g.constant(np.array(shape, np.int64))])
    else:
        sums = g.one("ReduceSum", [g.one("Cast", [x.name], to=TensorProto.INT32),
                                   g.constant(np.array(axes, np.int64))], keepdims=int(keep))
        sums = _reduced(g, sums, x.rank, axes, keep)
    return rounded_mean(g, sums, count, offset)



def rounded_mean(g: GraphBuilder, sums: str, count: int | str, offset: int) -> str:
    """The reference's quantized mean as an 8-bit value in its internal encoding: from the
    int32 (or int64) ``sums`` of ``count`` internal values each (a Python int, or an int64
    scalar computed at run time, at least 1) and the internal encoding's ``offset`` (128
    for int8, 0 for uint8): S = sums - offset * count, the stored values' sum, and
    round(S / count) halves away from zero as sign(S) * floor((2|S| + count) / 2count),
    exact in int64, saturated, plus the offset."""
    total = g.one("Cast", [sums], to=TensorProto.INT64)
    n = g.constant(np.array(count, np.int64)) if isinstance(count, int) else count
    if offset:
        total = g.one("Sub", [total, g.one("Mul", [n, g.constant(np.array(offset, np.int64))])])
    two = g.constant(np.array(2, np.int64))
    doubled = g.one("Mul", [g.one("Abs", [total]), two])
    magnitude = g.one("Div", [g.one("Add", [doubled, n]), g.one("Mul", [n, two])])
    rounded = g.one("Mul", [g.one("Sign", [total]), magnitude])
    low, high = (-offset, 255 - offset)
    clipped = g.one("Clip", [rounded, g.constant(np.array(low, np.int64)), g.constant(np.array(high, np.int64))])
    if offset:
        clipped = g.one("Add", [clipped, g.constant(np.array(offset, np.int64))])
    return g.one("Cast", [clipped], to=TensorProto.UINT8)



def _reduce_mean(g: GraphBuilder, name: str, dims: list[int], axes: list[int], keep: bool) -> str:
    """ReduceMean over ``axes``. Adjacent axes after dimensions of 1 (a global pool over
    NHWC's height and width) reduce as the first axis of a [rows, columns] matrix: ORT's
    vectorized row sum, where its reduction over middle axes of a 4-d value walks them
    element by element (MobileNet v1's 7x7x1024 mean: 34 -> 10 us, the same values)."""
    first, last = axes[0], axes[-1]
    if (not all(dims) or last - first + 1 != len(axes) or any(d != 1 for d in dims[:first])
            or last == len(dims) - 1):
        return _reduced(g, g.one("ReduceMean", [name], axes=axes, keepdims=int(keep)), len(dims), axes, keep)
    rows = math.prod(dims[first:last + 1])
    matrix = g.one("Reshape", [name, g.constant(np.array([rows, math.prod(dims[last + 1:])], np.int64))])
    mean = g.one("ReduceMean", [matrix], axes=[0], keepdims=1)
    shape = [1 if i in axes else d for i, d in enumerate(dims)] if keep else [
        d for i, d in enumerate(dims) if i not in axes]
    return g.one("Reshape", [mean, g.constant(np.array(shape or [1], np.int64))])



@lowers(OperationCode.RESHAPE)
def lower_reshape(g: GraphBuilder, operation: Operation) -> None:
    x = g.value(operation.inputs[0])
    output = g.operand(operation.outputs[0])
    if g.raw_constant(operation.inputs[1]) is None:
        # given at run time: ONNX's Reshape with 0 meaning 0 (allowzero), as NNAPI's; a shape
        # that does not hold the elements fails the run in both
        check_same_quantization(x, output)
        shape = g.one("Cast", [g.value(operation.inputs[1]).name], to=TensorProto.INT64)
        g.set_output(operation.outputs[0], g.one("Reshape", [x.name, shape], allowzero=1))
        return
    shape = np.atleast_1d(np.asarray(g.scalar(operation.inputs[1]))).astype(np.int64)
    if np.any(shape == 0) or np.sum(shape == -1) > 1 or np.any(shape < -1):
        raise Declined("RESHAPE's shape must be positive (one -1 at most)")
    if output.dimensions and all(output.dimensions) and len(output.dimensions) == len(shape):
        shape = np.array(output.dimensions, np.int64)
    check_same_quantization(x, output)
    if x.dims and all(x.dims) and x.dims == shape.tolist():
        g.set_output(operation.outputs[0], x.name)  # the same shape: nothing to run
        return
    if _only_broadcast(g, operation.outputs[0], x, shape.tolist()):
        g.values[operation.outputs[0]] = Value(x.name, x.kind, list(x.dims), x.scale, x.zero_point)
        return
    g.set_output(operation.outputs[0], g.one("Reshape", [x.name, g.constant(shape)]))



_BROADCASTING = (OperationCode.ADD, OperationCode.SUB, OperationCode.MUL, OperationCode.DIV)



def _only_broadcast(g: GraphBuilder, index: int, x: Value, shape: list[int]) -> bool:
    """Whether RESHAPE output ``index`` (``x`` to ``shape``) only drops leading 1s and is
    read only by element-wise float operations whose outputs have at least ``x``'s rank:
    broadcasting ``x`` itself there gives the same elements in the same places (an
    unrolled LSTM's [1, 4n] product reshaped to [4n] before its ADD, once per step)."""
    if g.isolated or x.kind != "float" or not x.dims or not all(x.dims) or len(shape) >= x.rank \
            or x.dims[x.rank - len(shape):] != shape or any(d != 1 for d in x.dims[:x.rank - len(shape)]) \
            or index in g.subgraph.output_indexes or index in g.padded:
        return False
    readers = g.readers(index)
    return bool(readers) and all(
        op.type in _BROADCASTING and index in op.inputs[:2] and g.operand(op.outputs[0]).type == T.TENSOR_FLOAT32
        and len(g.operand(op.outputs[0]).dimensions) >= x.rank for op in readers)



@lowers(OperationCode.CONCATENATION)
def lower_concatenation(g: GraphBuilder, operation: Operation) -> None:
    parts = [g.value(i) for i in operation.inputs[:-1]]
    axis = int(g.scalar(operation.inputs[-1]))
    output = g.operand(operation.outputs[0])
    rank = parts[0].rank
    if not -rank <= axis < rank:
        raise Declined("CONCATENATION axis out of range")
    kind = internal_kind(output.type)
    if output.type in QUANT8 and any(p.scale != output.scale or p.zero_point != internal_zero_point(output)
                                     for p in parts):
        y = g.quantize(g.one("Concat", [g.dequantize(p) for p in parts], axis=axis), output)
    else:
        if any(p.kind != kind for p in parts):
            raise Declined("inputs of different types")
        y = g.one("Concat", [p.name for p in parts], axis=axis)
    g.set_output(operation.outputs[0], y)



@lowers(OperationCode.PAD, OperationCode.PAD_V2)
def lower_pad(g: GraphBuilder, operation: Operation) -> None:
    if _padded_pad(g, operation) or pad_of_max_pool(g, operation) is not None:
        return  # (the second: the MAX_POOL_2D reading it pads its input itself)
    x = g.value(operation.inputs[0])
    output = g.operand(operation.outputs[0])
    if g.raw_constant(operation.inputs[1]) is None:
        # given at run time: [rank, 2] as ONNX's begins then ends; a negative one (which
        # ONNX would crop with) fails the run, as NNAPI requires
        given = g.value(operation.inputs[1])
        if given.dims != [x.rank, 2]:
            raise Declined("paddings must be [rank, 2]")
        flat = g.one("Reshape", [g.one("Transpose", [g.one("Cast", [given.name], to=TensorProto.INT64)], perm=[1, 0]),
                                 g.constant(np.array([-1], np.int64))])
        valid = g.one("GreaterOrEqual", [g.one("ReduceMin", [flat], keepdims=0), g.constant(np.array(0, np.int64))])
        pads_name = fail_unless(g, valid, flat)
    else:
        pads_name = None
        paddings = np.asarray(g.scalar(operation.inputs[1])).astype(np.int64).reshape(-1, 2)
        if paddings.shape[0] != x.rank or np.any(paddings < 0):
            raise Declined("paddings must be [rank, 2] and non-negative")
    check_same_quantization(x, output)
    if x.kind == "float":
        pad_value = np.array(float(g.scalar(operation.inputs[2])) if operation.type == OperationCode.PAD_V2
                             else 0.0, np.float32)
    elif x.kind == "uint8":
        if operation.type == OperationCode.PAD_V2:
            raw = int(g.scalar(operation.inputs[2]))
            raw += 128 if output.type == T.TENSOR_QUANT8_ASYMM_SIGNED else 0
            if not 0 <= raw <= 255:
                raise Declined("pad value out of range")
        else:
            raw = x.zero_point  # PAD pads with the real value 0
        pad_value = np.array(raw, np.uint8)
    elif x.kind == "int32" and operation.type == OperationCode.PAD:
        pad_value = np.array(0, np.int32)
    else:
        raise Declined(f"{OperationCode(operation.type).name} on {type_name(output.type)} is not supported")
    if pads_name is None:
        pads_name = g.constant(np.concatenate([paddings[:, 0], paddings[:, 1]]))
    y = g.one("Pad", [x.name, pads_name, g.constant(pad_value)], mode="constant")
    g.set_output(operation.outputs[0], keep_blocked(g, operation, y))



def _non_negative(g: GraphBuilder, index: int) -> bool:
    """Whether every element of float operand ``index`` is >= 0 (NaN aside) because the
    operation computing it ends with a RELU / RELU6 (its own or a convolution's fused one)."""
    producer = g.producer(index)
    if producer is None or g.operand(index).type not in FLOATS:
        return False
    code = producer.type
    if code in (OperationCode.RELU, OperationCode.RELU6):
        return True
    if code in (OperationCode.CONV_2D, OperationCode.DEPTHWISE_CONV_2D, OperationCode.GROUPED_CONV_2D):
        try:
            fuse = conv_params(g, producer, code != OperationCode.CONV_2D).fuse
        except (Declined, ValueError, TypeError, IndexError):
            return False
        return fuse in (FuseCode.FUSED_RELU, FuseCode.FUSED_RELU6)
    return False



def pad_of_max_pool(g: GraphBuilder, operation: Operation) -> list[int] | None:
    """A float PAD / PAD_V2 with zeros of the height and width only, of a value >= 0
    (_non_negative: a convolution's ReLU output), read only by a MAX_POOL_2D in NHWC:
    its [top, left, bottom, right] amounts, which that pool adds to its own padding (ONNX
    MaxPool's padding is left out of each window's maximum), or None. The same maxima:
    each window keeps at least one real element (every side's padding in all below its
    kernel's extent), and those are >= 0, so the zeros the PAD would add change no
    maximum. ResNet-50 and DenseNet-121 pad their first ReLU's output for a VALID 3x3
    pool: as a Pad, ORT leaves its blocked layout for it (ReorderOutput 133 + Pad 176 +
    ReorderInput 86 us); folded, nothing but the pool."""
    index = operation.outputs[0]
    readers = g.readers(index)
    source = operation.inputs[0]
    if (g.isolated or g.operand(index).type not in FLOATS or len(readers) != 1 or index in g.subgraph.output_indexes
            or source in g.padded or len(g.operand(index).dimensions) != 4 or not _non_negative(g, source)):
        return None
    pool = readers[0]
    paddings = g.raw_constant(operation.inputs[1])
    if (pool.type != OperationCode.MAX_POOL_2D or list(pool.inputs).count(index) != 1 or pool.inputs[0] != index
            or g.operand(pool.outputs[0]).type not in FLOATS or pool_layout_nchw(g, pool)
            or paddings is None or paddings.size != 8 or not pad_value_is_zero(g, operation)):
        return None
    paddings = paddings.reshape(4, 2).astype(np.int64)
    if paddings[0].any() or paddings[3].any() or (paddings < 0).any():
        return None
    try:
        own, kernel = max_pool_padding(g, pool, list(g.operand(index).dimensions))
    except (Declined, ValueError, TypeError, IndexError):
        return None
    added = [int(paddings[1, 0]), int(paddings[2, 0]), int(paddings[1, 1]), int(paddings[2, 1])]
    if any(a + b >= k for a, b, k in zip(own, added, kernel * 2)):
        return None
    return added



def max_pool_padding(g: GraphBuilder, operation: Operation, dims: list[int]) -> tuple[list[int], list[int]]:
    """A MAX_POOL_2D's own padding (top, left, bottom, right) of an NHWC input of ``dims``
    and its kernel (height, width)."""
    inputs = operation.inputs
    if len(inputs) in (10, 11):
        left, right, top, bottom = (int(g.scalar(inputs[i])) for i in (1, 2, 3, 4))
        stride_w, stride_h, filter_w, filter_h = (int(g.scalar(inputs[i])) for i in (5, 6, 7, 8))
        return [top, left, bottom, right], [filter_h, filter_w]
    scheme = int(g.scalar(inputs[1]))
    stride_w, stride_h, filter_w, filter_h = (int(g.scalar(inputs[i])) for i in (2, 3, 4, 5))
    if scheme not in (1, 2):
        raise Declined(f"padding scheme {scheme} is not valid")
    pads = same_pads(dims, False, (filter_h, filter_w), (stride_h, stride_w), (1, 1)) if scheme == 1 else [0, 0, 0, 0]
    return pads, [filter_h, filter_w]



def _padded_pad(g: GraphBuilder, operation: Operation) -> bool:
    """A float PAD with zeros reading or giving channels padded to the NCHWc block (see
    wants_padding): the padded input's zero channels are the first of the channels it
    adds, so a skip connection's channel PAD within the block is no operation at all."""
    source, index = operation.inputs[0], operation.outputs[0]
    output = g.operand(index)
    if g.isolated or output.type not in FLOATS or g.operand(source).type not in FLOATS:
        return False
    wanted = wants_padding(g, index)
    paddings = g.raw_constant(operation.inputs[1])
    if not (source in g.padded or wanted) or paddings is None or paddings.size != 8 or len(output.dimensions) != 4:
        return False
    paddings = paddings.reshape(4, 2).astype(np.int64)
    if paddings[3, 0] != 0 or np.any(paddings < 0) or not pad_value_is_zero(g, operation):
        return False
    x = g.blocked_value(source)
    real = g.operand(source).dimensions[3] + int(paddings[3, 1])
    channels = padded_channels(real) if wanted else real
    if channels < x.dims[3]:
        return False
    pads = np.concatenate([paddings[:, 0], [*paddings[:3, 1], channels - x.dims[3]]])
    y = x.name if not pads.any() else g.one("Pad", [x.name, g.constant(pads), g.constant(np.array(0.0, np.float32))],
                                             mode="constant")
    g.set_channels(index, y, channels)
    return True



@lowers(OperationCode.DEPTH_TO_SPACE, OperationCode.SPACE_TO_DEPTH)
def lower_depth_space(g: GraphBuilder, operation: Operation) -> None:
    x = g.value(operation.inputs[0])
    require_rank(x, 4, "the input")
    output = g.operand(operation.outputs[0])
    check_same_quantization(x, output)
    block = int(g.scalar(operation.inputs[1]))
    nchw = bool(g.optional_scalar(operation, 2, False))
    if block < 1:
        raise Declined("block size must be positive")
    op_type = "DepthToSpace" if operation.type == OperationCode.DEPTH_TO_SPACE else "SpaceToDepth"
    extra = {"mode": "DCR"} if op_type == "DepthToSpace" else {}  # NNAPI's channel order is TF's: DCR
    if not has_kernel(op_type, KIND_ELEM[x.kind], blocksize=2, **extra):
        raise Declined(f"this onnxruntime has no {op_type} kernel for {x.kind} values")
    y = g.one(op_type, [to_nchw(g, x.name, nchw)], blocksize=block, **extra)
    g.set_output(operation.outputs[0], from_nchw(g, y, nchw))



@lowers(OperationCode.STRIDED_SLICE)
def lower_strided_slice(g: GraphBuilder, operation: Operation) -> None:
    x = g.value(operation.inputs[0])
    output = g.operand(operation.outputs[0])
    check_same_quantization(x, output)
    if not x.dims or not all(x.dims) or any(g.raw_constant(i) is None for i in operation.inputs[1:7]):
        # begin, end or strides given at run time, or a shape known only then (a mask given
        # then: declined there, naming it)
        g.set_output(operation.outputs[0], keep_blocked(g, operation, run_time_form(g, operation, x)))
        return
    if _slices_as_split(g, operation, x):
        return
    begin, end, strides = (np.asarray(g.scalar(operation.inputs[i])).reshape(-1).astype(np.int64)
                           for i in (1, 2, 3))
    begin_mask, end_mask, shrink = (int(g.scalar(operation.inputs[i])) for i in (4, 5, 6))
    rank = x.rank
    if not len(begin) == len(end) == len(strides) == rank or np.any(strides == 0):
        raise Declined("begin, end and strides must have one entry per dimension and non-zero strides")
    starts, ends, keep_shape = [], [], []
    for axis in range(rank):
        size, stride = x.dims[axis], int(strides[axis])
        start, stop = int(begin[axis]), int(end[axis])
        if shrink & (1 << axis):
            # Android keeps a shrunk axis only where begin:end:stride selects one element
            # with a positive stride; anything else fails there, so it is declined here
            if stride < 0 or len(range(*slice(start, stop, stride).indices(size))) != 1:
                raise Declined("a shrunk axis must select exactly one element with a positive stride")
            start = start + size if start < 0 else start
            stop, stride = start + 1, 1
            strides[axis] = 1
        else:
            if begin_mask & (1 << axis):
                start = 0 if stride > 0 else size - 1
            if end_mask & (1 << axis):
                stop = size if stride > 0 else -size - 1
            keep_shape.append(axis)
        starts.append(start)
        ends.append(stop if not (end_mask & (1 << axis)) or stride > 0 else -(2 ** 62))
    produced = [len(range(*slice(start, stop, int(step)).indices(size)))
                for start, stop, step, size in zip(starts, ends, strides, x.dims)]
    shape = [size for axis, size in enumerate(produced) if not shrink & (1 << axis)] or [1]  # NNAPI keeps [1]
    if any(size <= 0 for size in produced) or (output.dimensions and any(
            d and d != s for d, s in zip(output.dimensions, shape)) or len(output.dimensions) not in (0, len(shape))):
        raise Declined(f"STRIDED_SLICE gives shape {shape}, which the output operand does not allow")
    y = g.one("Slice", [x.name, g.constant(np.array(starts, np.int64)), g.constant(np.array(ends, np.int64)),
                        g.constant(np.arange(rank, dtype=np.int64)), g.constant(strides.astype(np.int64))])
    squeezed = [axis for axis in range(rank) if shrink & (1 << axis)]
    if len(squeezed) == rank:
        y = g.one("Reshape", [y, g.constant(np.array([1], np.int64))])
    elif squeezed:
        y = g.one("Squeeze", [y, g.constant(np.array(squeezed, np.int64))])
    g.set_output(operation.outputs[0], keep_blocked(g, operation, y))



def sliced_block(g: GraphBuilder, operation: Operation, dims: list[int]) -> tuple[int, int, int] | None:
    """(axis, start, stop) where STRIDED_SLICE ``operation`` of a ``dims`` tensor takes
    ``start:stop`` of one axis and all of the others, with unit strides and nothing shrunk;
    else None."""
    if any(g.raw_constant(operation.inputs[i]) is None for i in range(1, 7)):
        return None
    begin, end, strides = (np.asarray(g.scalar(operation.inputs[i])).reshape(-1).astype(np.int64)
                           for i in (1, 2, 3))
    begin_mask, end_mask, shrink = (int(g.scalar(operation.inputs[i])) for i in (4, 5, 6))
    if shrink or not len(begin) == len(end) == len(strides) == len(dims) or np.any(strides != 1):
        return None
    cut = []
    for axis, size in enumerate(dims):
        start = 0 if begin_mask & (1 << axis) else int(begin[axis])
        stop = size if end_mask & (1 << axis) else int(end[axis])
        start, stop, _ = slice(start, stop).indices(size)
        if stop <= start:
            return None
        if (start, stop) != (0, size):
            cut.append((axis, start, stop))
    return cut[0] if len(cut) == 1 else None



def _slices_as_split(g: GraphBuilder, operation: Operation, x: Value) -> bool:
    """Where every reader of the input is a STRIDED_SLICE taking a block of the same axis
    (an RNN cell's gates cut from one product), the blocks disjoint: one Split computes
    them all (its pieces between the blocks unread), one node instead of one per block
    (per-node cost dominates a small model's run). The same values: a Split copies them."""
    source = operation.inputs[0]
    readers = g.readers(source)
    if len(readers) < 2 or any(op.type != OperationCode.STRIDED_SLICE or op.inputs[0] != source
                               or op.outputs[0] in g.subgraph.output_indexes for op in readers):
        return False
    if any(blocked(list(g.operand(op.outputs[0]).dimensions), x.kind) for op in readers):
        return False  # keep_blocked's layout choice stays with the plain lowering
    blocks = [sliced_block(g, op, x.dims) for op in readers]
    if any(b is None for b in blocks) or len({b[0] for b in blocks}) != 1:
        return False
    axis = blocks[0][0]
    order = sorted(range(len(blocks)), key=lambda k: blocks[k][1])
    sizes, wanted, position = [], [], 0  # the Split's pieces; whether each is a block
    for k in order:
        _, start, stop = blocks[k]
        if start < position:
            return False  # overlapping blocks
        if start > position:
            sizes.append(start - position)
            wanted.append(False)
        sizes.append(stop - start)
        wanted.append(True)
        position = stop
    if position < x.dims[axis]:
        sizes.append(x.dims[axis] - position)
        wanted.append(False)
    for op, (_, start, stop) in zip(readers, blocks):
        output = g.operand(op.outputs[0])
        shape = [*x.dims[:axis], stop - start, *x.dims[axis + 1:]]
        fits = not output.dimensions or (len(output.dimensions) == len(shape) and all(
            not d or d == e for d, e in zip(output.dimensions, shape)))
        if output.type != g.operand(source).type or output.scale != x.scale or \
                internal_zero_point(output) != x.zero_point or not fits:
            return False  # each on its own: the plain lowering declines what it must
    pieces = g.node("Split", [x.name, g.constant(np.array(sizes, np.int64))], len(sizes), axis=axis)
    for k, piece in zip(order, [piece for piece, block in zip(pieces, wanted) if block]):
        g.set_output(readers[k].outputs[0], piece)
    return True



@lowers(OperationCode.TRANSPOSE)
def lower_transpose(g: GraphBuilder, operation: Operation) -> None:
    x = g.value(operation.inputs[0])
    output = g.operand(operation.outputs[0])
    check_same_quantization(x, output)
    if x.rank == 0:
        raise Declined("TRANSPOSE needs the input's rank")
    if len(operation.inputs) > 1 and g.operand(operation.inputs[1]).lifetime != L.NO_VALUE and \
            g.raw_constant(operation.inputs[1]) is None:  # perm given at run time: a Gather of indexes
        g.set_output(operation.outputs[0], run_time_form(g, operation, x))
        return
    perm = g.optional_scalar(operation, 1, None)
    perm = list(range(x.rank))[::-1] if perm is None else [int(p) for p in np.asarray(perm).reshape(-1)]
    if sorted(perm) != list(range(x.rank)):
        raise Declined("perm must be a permutation of the input's axes")
    g.set_output(operation.outputs[0], g.one("Transpose", [x.name], perm=perm))



@lowers(OperationCode.REVERSE)
def lower_reverse(g: GraphBuilder, operation: Operation) -> None:
    """REVERSE as a Slice with step -1 along the axis (a constant in [0, rank))."""
    x = g.value(operation.inputs[0])
    check_same_quantization(x, g.operand(operation.outputs[0]))
    axis = int(np.asarray(g.scalar(operation.inputs[1])).reshape(-1)[0])
    if not 0 <= axis < x.rank:
        raise Declined(f"axis {axis} is out of range [0, {x.rank})")
    ends = np.iinfo(np.int64).min  # past the first element, walking backwards
    slices = [g.constant(np.array([v], np.int64)) for v in (-1, ends, axis, -1)]
    g.set_output(operation.outputs[0], g.one("Slice", [x.name, *slices]))



@lowers(OperationCode.SQUEEZE)
def lower_squeeze(g: GraphBuilder, operation: Operation) -> None:
    x = g.value(operation.inputs[0])
    output = g.operand(operation.outputs[0])
    check_same_quantization(x, output)
    given = len(operation.inputs) > 1 and g.operand(operation.inputs[1]).lifetime != L.NO_VALUE
    if given and g.raw_constant(operation.inputs[1]) is None:
        # axes given at run time: ONNX's Squeeze refuses an axis out of range or of a size
        # other than 1, as NNAPI does; NNAPI keeps shape [1] where all go, so there must be
        # fewer axes than dimensions (or a dimension that is not 1)
        count = g.operand(operation.inputs[1]).dimensions
        if x.rank == 0 or not (len(count) == 1 and 0 < count[0] < x.rank) and not (
                all(x.dims) and any(d != 1 for d in x.dims)):
            raise Declined("SQUEEZE by axes given at run time needs the input's rank and fewer axes")
        axes = g.one("Cast", [g.value(operation.inputs[1]).name], to=TensorProto.INT64)
        g.set_output(operation.outputs[0], g.one("Squeeze", [x.name, axes]))
        return
    axes = g.optional_scalar(operation, 1, None)
    if x.rank == 0 or (axes is None and not all(x.dims)):
        raise Declined("SQUEEZE without axes needs the input's shape")
    if axes is not None and any(not -x.rank <= int(a) < x.rank for a in np.asarray(axes).reshape(-1)):
        raise Declined("SQUEEZE axes out of range")
    axes = [a for a, d in enumerate(x.dims) if d == 1] if axes is None else \
        sorted({int(a) % x.rank for a in np.asarray(axes).reshape(-1)})
    if axes != [] and any(x.dims[a] != 1 for a in axes):
        raise Declined("SQUEEZE of an axis whose size is not known to be 1")
    if not all(x.dims):
        # the other dimensions known only at run time (a free batch): ONNX's Squeeze of the
        # axes, which all are known to be 1, and fewer than all since one is not known
        g.set_output(operation.outputs[0], g.one("Squeeze", [x.name, g.constant(np.array(axes, np.int64))]))
        return
    shape = [d for a, d in enumerate(x.dims) if a not in axes] or [1]  # NNAPI keeps shape [1]
    g.set_output(operation.outputs[0], g.one("Reshape", [x.name, g.constant(np.array(shape, np.int64))]))



@lowers(OperationCode.EXPAND_DIMS)
def lower_expand_dims(g: GraphBuilder, operation: Operation) -> None:
    x = g.value(operation.inputs[0])
    output = g.operand(operation.outputs[0])
    check_same_quantization(x, output)
    axis = int(g.scalar(operation.inputs[1]))
    if not -(x.rank + 1) <= axis <= x.rank:
        raise Declined("EXPAND_DIMS axis out of range")
    axis %= x.rank + 1
    g.set_output(operation.outputs[0], g.one("Unsqueeze", [x.name, g.constant(np.array([axis], np.int64))]))



@lowers(OperationCode.CHANNEL_SHUFFLE)
def lower_channel_shuffle(g: GraphBuilder, operation: Operation) -> None:
    """[.., groups, C / groups] -> [.., C / groups, groups] along the axis: two reshapes and
    a transpose, data movement only."""
    x = g.value(operation.inputs[0])
    output = g.operand(operation.outputs[0])
    check_same_quantization(x, output)
    groups, axis = int(g.scalar(operation.inputs[1])), int(g.scalar(operation.inputs[2]))
    if x.rank == 0 or not all(x.dims) or not -x.rank <= axis < x.rank:
        raise Declined("CHANNEL_SHUFFLE needs the input's shape and an axis in range")
    axis %= x.rank
    channels = x.dims[axis]
    if groups < 1 or channels % groups:
        raise Declined("num_groups must divide the channels")
    split = [*x.dims[:axis], groups, channels // groups, *x.dims[axis + 1:]]
    perm = list(range(len(split)))
    perm[axis], perm[axis + 1] = perm[axis + 1], perm[axis]
    y = g.one("Reshape", [x.name, g.constant(np.array(split, np.int64))])
    y = g.one("Transpose", [y], perm=perm)
    g.set_output(operation.outputs[0], g.one("Reshape", [y, g.constant(np.array(x.dims, np.int64))]))



def _reduced(g: GraphBuilder, name: str, rank: int, axes: list[int], keep: bool) -> str:
    """NNAPI gives shape [1] where every dimension was reduced away (ONNX a scalar)."""
    if not keep and len(axes) == rank:
        return g.one("Reshape", [name, g.constant(np.array([1], np.int64))])
    return name



@lowers(OperationCode.REDUCE_MAX, OperationCode.REDUCE_MIN, OperationCode.REDUCE_SUM, OperationCode.REDUCE_PROD,
        OperationCode.REDUCE_ANY, OperationCode.REDUCE_ALL)
def lower_reduce(g: GraphBuilder, operation: Operation) -> None:
    """ReduceMax / Min on float and on quant8 in the input's own quantization (the integers'
    order is the real values'), ReduceSum / Prod on float, ANY / ALL as the max / min of the
    booleans as int32. An empty axis list reduces nothing; PROD is 0 wherever a factor is
    0, even beside an infinity, as Android defines it."""
    code = OperationCode(operation.type)
    x = g.value(operation.inputs[0])
    output = g.operand(operation.outputs[0])
    if x.rank == 0:
        raise Declined(f"{code.name} needs the input's rank")
    axes = []
    for axis in constant_ints(g, operation.inputs[1], "the axes"):
        if not -x.rank <= axis < x.rank:
            raise Declined(f"axis {axis} is out of range for rank {x.rank}")
        if int(axis) % x.rank not in axes:
            axes.append(int(axis) % x.rank)
    axes.sort()
    # An axis reduced of a size known only at run time may be empty there: float sums and
    # products give ONNX's and the reference's identities (0, 1); a float maximum / minimum
    # gives ONNX's -inf / inf where the reference gives the lowest / highest finite value,
    # so that case is selected in the graph; the others need each reduced size known.
    open_axes = not all(x.dims[a] for a in axes)
    if open_axes and (x.kind != "float" or code in (OperationCode.REDUCE_ANY, OperationCode.REDUCE_ALL)):
        raise Declined(f"{code.name} needs the size of each axis it reduces")
    keep = bool(g.scalar(operation.inputs[2]))
    if code in (OperationCode.REDUCE_ANY, OperationCode.REDUCE_ALL):
        if x.kind != "bool":
            raise Declined(f"{code.name} takes BOOL8 tensors")
    elif code in (OperationCode.REDUCE_MAX, OperationCode.REDUCE_MIN):
        if x.kind not in ("float", "uint8"):
            raise Declined(f"{code.name} on {x.kind} is not supported")
        check_same_quantization(x, output)
    elif x.kind != "float":
        raise Declined(f"{code.name} takes float tensors")
    if not axes:
        g.set_output(operation.outputs[0], g.one("Identity", [x.name]))
        return
    attributes = {"axes": axes, "keepdims": int(keep)}
    if code in (OperationCode.REDUCE_ANY, OperationCode.REDUCE_ALL):
        as_int = g.one("Cast", [x.name], to=TensorProto.INT32)
        reduced = g.one("ReduceMax" if code == OperationCode.REDUCE_ANY else "ReduceMin", [as_int], **attributes)
        y = g.one("Cast", [reduced], to=TensorProto.BOOL)
    elif code == OperationCode.REDUCE_SUM:
        y = g.one("ReduceSum", [x.name, g.constant(np.array(axes, np.int64))], keepdims=int(keep))
    elif code == OperationCode.REDUCE_PROD:
        product = g.one("ReduceProd", [x.name], **attributes)
        zeros = g.one("Cast", [g.one("Equal", [x.name, g.constant(np.array(0.0, np.float32))])], to=TensorProto.INT32)
        # (a count, not ReduceMax, which gives INT_MIN, so True, over an empty axis)
        any_zero = g.one("Greater", [g.one("ReduceSum", [zeros, g.constant(np.array(axes, np.int64))],
                                           keepdims=int(keep)), g.constant(np.array(0, np.int32))])
        y = g.one("Where", [any_zero, g.constant(np.array(0.0, np.float32)), product])
    else:
        y = g.one("ReduceMax" if code == OperationCode.REDUCE_MAX else "ReduceMin", [x.name], **attributes)
        if open_axes:
            extent = g.one("ReduceProd", [g.one("Gather", [g.one("Shape", [x.name]),
                                                           g.constant(np.array(axes, np.int64))], axis=0)], keepdims=0)
            empty = g.one("Equal", [extent, g.constant(np.array(0, np.int64))])
            finfo = np.finfo(np.float16 if g.operand(operation.inputs[0]).type == T.TENSOR_FLOAT16 else np.float32)
            identity = np.array(finfo.min if code == OperationCode.REDUCE_MAX else finfo.max, np.float32)
            y = g.one("Where", [empty, g.constant(identity), y])
    g.set_output(operation.outputs[0], _reduced(g, y, x.rank, axes, keep))



@lowers(OperationCode.ARGMAX, OperationCode.ARGMIN)
def lower_argminmax(g: GraphBuilder, operation: Operation) -> None:
    """ArgMax / ArgMin (the first index of equal extremes, as the reference's numpy does) as
    int32; quant8 compares the stored integers, whose order is the real values'."""
    x = g.value(operation.inputs[0])
    if x.kind not in ("float", "int32", "uint8"):
        raise Declined(f"{OperationCode(operation.type).name} on {x.kind} is not supported")
    if not all(x.dims):
        raise Declined("the input's shape must be known")
    axis = constant_axis(g, operation.inputs[1], x.rank)
    op_type = "ArgMax" if operation.type == OperationCode.ARGMAX else "ArgMin"
    if not has_kernel(op_type, KIND_ELEM[x.kind], axis=0):
        raise Declined(f"this onnxruntime has no {op_type} kernel for {x.kind} values")
    source = x.name
    if x.kind == "uint8" and math.prod(x.dims) >= _FLOAT_ARGMAX_SIZE:
        # the stored integers as float32 (exact, same order): ORT's float ArgMax / ArgMin is
        # ~3x its uint8 one (onnxruntime 1.32, one thread: a segmentation head's 256x256x21
        # along the channels 1.75 ms -> 0.62 with the Cast, 21x128x128 along axis 1 0.87
        # -> 0.40, 64x64x21 72 -> 42 us; even at 16x16x21, 5,376 values)
        source = g.one("Cast", [x.name], to=TensorProto.FLOAT)
    index = g.one(op_type, [source], axis=axis, keepdims=0, select_last_index=0)
    y = g.one("Cast", [index], to=TensorProto.INT32)
    g.set_output(operation.outputs[0], _reduced(g, y, x.rank, [axis], False))



#: the quantized ARG_MAX / ARG_MIN input size from which its ArgMax / ArgMin reads float32
_FLOAT_ARGMAX_SIZE = 16384



@lowers(OperationCode.GATHER)
def lower_gather(g: GraphBuilder, operation: Operation) -> None:
    """Gather along a constant axis. NNAPI refuses indices outside [0, size) where ONNX
    would count a negative one from the end: constant indices are checked here, indices
    given at run time are sent out of range when negative, so that the run fails as the
    reference's does instead of reading another element (past any size where the size is
    known only at run time; Gather refuses an index past the end in the same way)."""
    x = g.value(operation.inputs[0])
    output = g.operand(operation.outputs[0])
    check_same_quantization(x, output)
    if x.rank == 0:
        raise Declined("GATHER needs the input's rank")
    axis = constant_axis(g, operation.inputs[1], x.rank)
    size = x.dims[axis]
    known = g.raw_constant(operation.inputs[2])
    if known is not None and known.size and not bool(np.all((known >= 0) & (known < (size or np.inf)))):
        raise Declined(f"indices must be in [0, {size or 'the size'})")
    if known is not None and size:
        indices = g.value(operation.inputs[2]).name
    else:
        given = g.value(operation.inputs[2]).name
        negative = g.one("Less", [given, g.constant(np.array(0, np.int32))])
        past = size or np.iinfo(np.int32).max
        indices = g.one("Where", [negative, g.constant(np.array(past, np.int32)), given])
    g.set_output(operation.outputs[0], g.one("Gather", [x.name, indices], axis=axis))



@lowers(OperationCode.SPLIT)
def lower_split(g: GraphBuilder, operation: Operation) -> None:
    x = g.value(operation.inputs[0])
    if x.rank == 0 or not all(x.dims):
        raise Declined("SPLIT needs the input's shape")
    axis = constant_axis(g, operation.inputs[1], x.rank)
    count = int(g.scalar(operation.inputs[2]))
    if count != len(operation.outputs) or count < 1 or x.dims[axis] % count:
        raise Declined("num_splits must divide the axis and match the outputs")
    for index in operation.outputs:
        check_same_quantization(x, g.operand(index))
    if count == x.dims[axis] and _split_rows(g, operation, x, axis):
        return
    sizes = g.constant(np.full(count, x.dims[axis] // count, np.int64))
    for index, name in zip(operation.outputs, g.node("Split", [x.name, sizes], count, axis=axis)):
        g.set_output(index, name)



def _split_rows(g: GraphBuilder, operation: Operation, x: Value, axis: int) -> bool:
    """A SPLIT into single rows each read only by a RESHAPE to [1, row] (an unrolled RNN's
    time steps, the Keras way): the rows of one Reshape of the input to [steps, row], cut
    by one Split; and where each step's row is read only by a FULLY_CONNECTED with the
    same weights, bias and activation (the input's product of every step), that one
    product of the whole matrix, cut into the steps' results. Two or three nodes instead
    of two or three per step; each row's product is the same dot products (FULLY_CONNECTED
    leaves their order of summation open). The SPLIT's and RESHAPEs' own outputs are then
    never computed (nothing else reads them)."""
    subgraph = g.subgraph
    if g.isolated or any(d != 1 for d in x.dims[:axis]) or x.kind != "float":
        return False
    row = math.prod(x.dims[axis + 1:])
    reshapes = []
    for index in operation.outputs:
        readers = g.readers(index)
        if index in subgraph.output_indexes or len(readers) != 1 or readers[0].type != OperationCode.RESHAPE \
                or readers[0].inputs[0] != index or list(g.operand(readers[0].outputs[0]).dimensions) != [1, row] \
                or g.operand(readers[0].outputs[0]).type != g.operand(index).type:
            return False
        reshapes.append(readers[0])
    steps = len(operation.outputs)
    flat = g.one("Reshape", [x.name, g.constant(np.array([steps, row], np.int64))])
    products = [g.readers(op.outputs[0]) for op in reshapes]
    first = products[0][0] if products[0] else None
    biases = _same_products(g, reshapes, products, first) if first is not None else None
    if biases is not None:
        # one bias row per step (an unrolled LSTM's converter folds a different constant
        # into each step's): Gemm adds row k to row k, as each step's Gemm adds its bias
        bias = g.value(first.inputs[2]).name if all(np.array_equal(b, biases[0]) for b in biases) \
            else g.constant(np.stack(biases).astype(np.float32), "bias")
        y = fused_activation(g, g.one("Gemm", [flat, g.value(first.inputs[1]).name, bias], transB=1),
                             int(g.scalar(first.inputs[3])), g.operand(first.outputs[0]))
        done = [*operation.outputs, *(op.outputs[0] for op in reshapes)]
        gates = _gate_splits(g, [step[0] for step in products])
        if gates is not None:
            # each step's product cut into the same gate blocks (a GRU's SPLIT into z, r, h):
            # the blocks of all steps first, then each block's rows, k + 1 nodes instead of T + 1
            ones = g.constant(np.ones(steps, np.int64))
            for block, name in enumerate(g.node("Split", [y, g.constant(np.array(gates[1], np.int64))],
                                                len(gates[1]), axis=1)):
                for split, row in zip(gates[0], g.node("Split", [name, ones], steps, axis=0)):
                    g.set_output(split.outputs[block], row)
            done += [step[0].outputs[0] for step in products]
        else:
            rows = g.node("Split", [y, g.constant(np.ones(steps, np.int64))], steps, axis=0)
            for step, name in zip(products, rows):
                g.set_output(step[0].outputs[0], name)
    else:
        rows = g.node("Split", [flat, g.constant(np.ones(steps, np.int64))], steps, axis=0)
        for op, name in zip(reshapes, rows):
            g.set_output(op.outputs[0], name)
        done = list(operation.outputs)
    for index in done:  # read by nothing lowered: a name no node makes (ORT refuses a graph reading it)
        g.set_output(index, f"never_computed_{index}")
    return True



def _gate_splits(g: GraphBuilder, products: list[Operation]) -> tuple[list[Operation], list[int]] | None:
    """(the SPLITs, their block sizes) where each FULLY_CONNECTED result of ``products`` is
    read only by one float SPLIT of its last axis into the same number of blocks (not a
    graph output); else None."""
    splits = []
    for product in products:
        index = product.outputs[0]
        readers = g.readers(index)
        if index in g.subgraph.output_indexes or len(readers) != 1 or readers[0].type != OperationCode.SPLIT \
                or readers[0].inputs[0] != index:
            return None
        split = readers[0]
        if any(g.raw_constant(i) is None for i in split.inputs[1:3]) or \
                int(g.scalar(split.inputs[1])) not in (1, -1) or any(
                    g.operand(i).type != T.TENSOR_FLOAT32 for i in split.outputs):
            return None
        splits.append(split)
    counts = {int(g.scalar(split.inputs[2])) for split in splits}
    units = g.operand(products[0].outputs[0]).dimensions[-1] if g.operand(products[0].outputs[0]).dimensions else 0
    if len(counts) != 1 or not units:
        return None
    count = counts.pop()
    if count < 1 or units % count or any(len(split.outputs) != count for split in splits):
        return None
    return splits, [units // count] * count



def _same_products(g: GraphBuilder, reshapes: list[Operation], products: list[list[Operation]],
                   first: Operation) -> list[np.ndarray] | None:
    """Each step's bias where each RESHAPE's output is read only by one float32
    FULLY_CONNECTED (as its input, not a graph output) whose weights and activation are
    constants equal to ``first``'s and whose bias is a constant; else None."""
    def constant(index: int) -> np.ndarray | None:
        operand = g.operand(index)
        return None if operand.lifetime not in (L.CONSTANT_COPY, L.CONSTANT_REFERENCE) else g.raw_constant(index)

    weights, fuse = constant(first.inputs[1]), constant(first.inputs[3])
    if len(first.inputs) != 4 or weights is None or fuse is None or weights.ndim != 2 or \
            g.operand(first.outputs[0]).type != T.TENSOR_FLOAT32 or \
            weights.shape[1] != g.operand(reshapes[0].outputs[0]).dimensions[1]:
        return None
    units = weights.shape[0]
    biases = []
    for op, readers in zip(reshapes, products):
        if len(readers) != 1 or readers[0].type != OperationCode.FULLY_CONNECTED:
            return None
        product = readers[0]
        if product.inputs[0] != op.outputs[0] or op.outputs[0] in product.inputs[1:] or len(product.inputs) != 4 \
                or product.outputs[0] in g.subgraph.output_indexes \
                or list(g.operand(product.outputs[0]).dimensions) not in ([1, units], [0, units], []):
            return None
        for index, same, expected in ((product.inputs[1], first.inputs[1], weights),
                                      (product.inputs[3], first.inputs[3], fuse)):
            value = expected if index == same else constant(index)
            if value is None or value.dtype != expected.dtype or not np.array_equal(value, expected):
                return None
        bias = constant(product.inputs[2])
        if bias is None or bias.dtype != np.float32 or bias.shape != (units,):
            return None
        biases.append(bias)
    return biases



@lowers(OperationCode.SLICE)
def lower_slice(g: GraphBuilder, operation: Operation) -> None:
    """Slice from begin for size elements (-1: to the end). Constant begin / size are
    checked here; given at run time (or the input's shape known only then), the run fails
    unless 0 <= begin <= begin + size <= dimension everywhere, as the reference's does."""
    x = g.value(operation.inputs[0])
    output = g.operand(operation.outputs[0])
    check_same_quantization(x, output)
    if x.rank == 0:
        raise Declined("SLICE needs the input's rank")
    dims = np.array(x.dims, np.int64)
    axes = g.constant(np.arange(x.rank, dtype=np.int64))
    known_begin, known_size = (g.raw_constant(i) for i in operation.inputs[1:3])
    if known_begin is not None and known_size is not None and all(x.dims):
        begin, size = (np.asarray(v).reshape(-1).astype(np.int64) for v in (known_begin, known_size))
        if len(begin) != x.rank or len(size) != x.rank:
            raise Declined("begin and size must have one entry per dimension")
        end = np.where(size == -1, dims, begin + size)
        if np.any(begin < 0) or np.any((size < 1) & (size != -1)) or np.any(end > dims) or np.any(end <= begin):
            raise Declined("begin and size must select a non-empty part of each dimension")
        y = g.one("Slice", [x.name, g.constant(begin), g.constant(end), axes])
    else:
        # given at run time, or a shape known only then
        begin, size = (g.one("Cast", [g.value(i).name], to=TensorProto.INT64) for i in operation.inputs[1:3])
        shape = g.constant(dims) if all(x.dims) else g.one("Shape", [x.name])
        size = g.one("Where", [g.one("Equal", [size, g.constant(np.array(-1, np.int64))]),
                               g.one("Sub", [shape, begin]), size])
        end = g.one("Add", [begin, size])
        zero = g.constant(np.array(0, np.int64))
        checks = [g.one("GreaterOrEqual", [begin, zero]), g.one("GreaterOrEqual", [size, zero]),
                  g.one("LessOrEqual", [end, shape])]
        valid = g.one("And", [g.one("And", checks[:2]), checks[2]])
        valid = g.one("Cast", [g.one("ReduceMin", [g.one("Cast", [valid], to=TensorProto.INT32)], keepdims=0)],
                      to=TensorProto.BOOL)
        y = g.one("Slice", [x.name, fail_unless(g, valid, begin), end, axes])
    g.set_output(operation.outputs[0], y)



@lowers(OperationCode.TILE)
def lower_tile(g: GraphBuilder, operation: Operation) -> None:
    """Tile; multiples given at run time go to it as they are (ORT refuses a negative one,
    as the reference does, and 0 gives an empty dimension in both)."""
    x = g.value(operation.inputs[0])
    output = g.operand(operation.outputs[0])
    check_same_quantization(x, output)
    if x.rank == 0:
        raise Declined("TILE needs the input's rank")
    known = g.raw_constant(operation.inputs[1])
    if known is None:
        multiples = g.one("Cast", [g.value(operation.inputs[1]).name], to=TensorProto.INT64)
    else:
        values = np.asarray(known).reshape(-1).astype(np.int64)
        if len(values) != x.rank or np.any(values < 1):
            raise Declined("multiples must be positive, one per dimension")
        multiples = g.constant(values)
    g.set_output(operation.outputs[0], g.one("Tile", [x.name, multiples]))



@lowers(OperationCode.SPACE_TO_BATCH_ND, OperationCode.BATCH_TO_SPACE_ND)
def lower_space_batch(g: GraphBuilder, operation: Operation) -> None:
    """TensorFlow's block rearrangement as Pad (the zero point for quant8), Reshape,
    Transpose, Reshape, in NHWC: batch index (i * block_w + j) * batches + b holds block
    offset (i, j) of image b. Data movement only, exact for every type."""
    space_to_batch = operation.type == OperationCode.SPACE_TO_BATCH_ND
    x = g.value(operation.inputs[0])
    require_rank(x, 4, "the input")
    output = g.operand(operation.outputs[0])
    check_same_quantization(x, output)
    if g.raw_constant(operation.inputs[1]) is None or (
            space_to_batch and g.raw_constant(operation.inputs[2]) is None):
        _space_batch_at_run_time(g, operation, x, space_to_batch)
        return
    if not all(x.dims):
        raise Declined("the input's shape must be known")
    block_h, block_w = (int(b) for b in constant_ints(g, operation.inputs[1], "the block sizes"))
    layout_position = 3 if space_to_batch else 2
    nchw = bool(g.optional_scalar(operation, layout_position, False))
    if block_h < 1 or block_w < 1:
        raise Declined("block sizes must be positive")
    name = g.one("Transpose", [x.name], perm=NCHW_TO_NHWC) if nchw else x.name
    batches, height, width, depth = (x.dims[0], x.dims[2], x.dims[3], x.dims[1]) if nchw else x.dims
    if space_to_batch:
        paddings = constant_ints(g, operation.inputs[2], "the paddings").reshape(-1)
        if paddings.size != 4 or np.any(paddings < 0):
            raise Declined("paddings must be [2, 2] and non-negative")
        height += int(paddings[0] + paddings[1])
        width += int(paddings[2] + paddings[3])
        if height % block_h or width % block_w:
            raise Declined("the padded size is not a multiple of the blocks")
        if paddings.any():
            fill = np.array(x.zero_point, np.uint8) if x.kind == "uint8" else np.array(0, NUMPY_KIND[x.kind])
            pads = np.array([0, paddings[0], paddings[2], 0, 0, paddings[1], paddings[3], 0], np.int64)
            name = g.one("Pad", [name, g.constant(pads), g.constant(fill)], mode="constant")
        split = [batches, height // block_h, block_h, width // block_w, block_w, depth]
        perm = [2, 4, 0, 1, 3, 5]
        shape = [batches * block_h * block_w, height // block_h, width // block_w, depth]
    else:
        if batches % (block_h * block_w):
            raise Declined("the batches are not a multiple of the blocks")
        split = [block_h, block_w, batches // (block_h * block_w), height, width, depth]
        perm = [2, 3, 0, 4, 1, 5]
        shape = [batches // (block_h * block_w), height * block_h, width * block_w, depth]
    y = g.one("Reshape", [name, g.constant(np.array(split, np.int64))])
    y = g.one("Transpose", [y], perm=perm)
    y = g.one("Reshape", [y, g.constant(np.array(shape, np.int64))])
    g.set_output(operation.outputs[0], g.one("Transpose", [y], perm=NHWC_TO_NCHW) if nchw else y)



def _space_batch_at_run_time(g: GraphBuilder, operation: Operation, x: Value, space_to_batch: bool) -> None:
    """SPACE_TO_BATCH_ND / BATCH_TO_SPACE_ND with the block sizes or paddings given at run
    time: the same Pad, Reshape, Transpose, Reshape with the shapes computed in the graph;
    a block below 1, a negative padding or sizes the blocks do not divide fail the run, as
    the reference's do."""
    nchw = bool(g.optional_scalar(operation, 3 if space_to_batch else 2, False))
    name = g.one("Transpose", [x.name], perm=NCHW_TO_NHWC) if nchw else x.name

    def ints(index: int) -> str:
        return g.one("Reshape", [g.one("Cast", [g.value(index).name], to=TensorProto.INT64),
                                 g.constant(np.array([-1], np.int64))])

    def pick(vector: str, positions: list[int]) -> str:
        return g.one("Gather", [vector, g.constant(np.array(positions, np.int64))], axis=0)

    zero, one = g.constant(np.array([0], np.int64)), g.constant(np.array([1], np.int64))
    block = ints(operation.inputs[1])
    checks = [g.one("GreaterOrEqual", [block, one])]
    if space_to_batch:
        paddings = ints(operation.inputs[2])
        checks.append(g.one("GreaterOrEqual", [paddings, zero]))
        fill = np.array(x.zero_point, np.uint8) if x.kind == "uint8" else np.array(0, NUMPY_KIND[x.kind])
        # [0, top, left, 0, 0, bottom, right, 0] from [top, bottom, left, right]
        pads = pick(g.one("Concat", [zero, paddings], axis=0), [0, 1, 3, 0, 0, 2, 4, 0])
        name = g.one("Pad", [name, pads, g.constant(fill)], mode="constant")
    shape = g.one("Shape", [name])
    batches, height, width, depth = (pick(shape, [i]) for i in range(4))
    block_h, block_w = pick(block, [0]), pick(block, [1])
    if space_to_batch:
        parts = [g.one("Mod", [height, block_h]), g.one("Mod", [width, block_w])]
        rows, cols = g.one("Div", [height, block_h]), g.one("Div", [width, block_w])
        split = [batches, rows, block_h, cols, block_w, depth]
        perm = [2, 4, 0, 1, 3, 5]
        shape_out = [g.one("Mul", [batches, g.one("Mul", [block_h, block_w])]), rows, cols, depth]
    else:
        area = g.one("Mul", [block_h, block_w])
        parts = [g.one("Mod", [batches, area])]
        images = g.one("Div", [batches, area])
        split = [block_h, block_w, images, height, width, depth]
        perm = [2, 3, 0, 4, 1, 5]
        shape_out = [images, g.one("Mul", [height, block_h]), g.one("Mul", [width, block_w]), depth]
    checks += [g.one("Equal", [part, zero]) for part in parts]
    valid = g.one("Cast", [g.one("ReduceMin", [g.one("Concat", [g.one("Cast", [c], to=TensorProto.INT32)
                                                                 for c in checks], axis=0)], keepdims=0)],
                  to=TensorProto.BOOL)
    split_shape = fail_unless(g, valid, g.one("Concat", split, axis=0))
    y = g.one("Reshape", [name, split_shape])
    y = g.one("Transpose", [y], perm=perm)
    y = g.one("Reshape", [y, g.one("Concat", shape_out, axis=0)])
    g.set_output(operation.outputs[0], g.one("Transpose", [y], perm=NHWC_TO_NCHW) if nchw else y)



@lowers(OperationCode.TOPK_V2)
def lower_topk(g: GraphBuilder, operation: Operation) -> None:
    """TopK along the last axis of the input reversed there: ONNX lists equal values by
    lower index first, NNAPI by larger index first, so the reversed row's order is NNAPI's
    and index i of it is n - 1 - i. Quant8 values compare as their integers (as int32, for
    which ORT has a kernel). Where n is known only at run time, k > n fails the run there."""
    x = g.value(operation.inputs[0])
    values_index, indices_index = operation.outputs
    check_same_quantization(x, g.operand(values_index))
    if x.rank == 0 or x.kind not in ("float", "int32", "uint8"):
        raise Declined("TOPK_V2 needs the input's rank and float, int32 or quant8 values")
    count = int(g.scalar(operation.inputs[1]))
    k = g.constant(np.array([count], np.int64))
    if x.dims[-1]:
        size = g.constant(np.array([x.dims[-1]], np.int64))
        if not 1 <= count <= x.dims[-1]:
            raise Declined(f"k must be in [1, {x.dims[-1]}]")
    else:  # the last dimension is known at run time only: checked then
        size = g.one("Gather", [g.one("Shape", [x.name]), g.constant(np.array([-1], np.int64))], axis=0)
        valid = g.one("And", [g.one("GreaterOrEqual", [k, g.constant(np.array([1], np.int64))]),
                              g.one("LessOrEqual", [k, size])])
        k = fail_unless(g, g.one("Squeeze", [valid]), k)
    reversed_row = g.one("Slice", [x.name, g.constant(np.array([-1], np.int64)),
                                   g.constant(np.array([np.iinfo(np.int64).min], np.int64)),
                                   g.constant(np.array([-1], np.int64)), g.constant(np.array([-1], np.int64))])
    data = g.one("Cast", [reversed_row], to=TensorProto.INT32) if x.kind == "uint8" else reversed_row
    values, positions = g.node("TopK", [data, k], 2, axis=-1, largest=1, sorted=1)
    if x.kind == "uint8":
        values = g.one("Cast", [values], to=TensorProto.UINT8)
    indices = g.one("Sub", [g.one("Sub", [size, g.constant(np.array([1], np.int64))]), positions])
    g.set_output(values_index, values)
    g.set_output(indices_index, g.one("Cast", [indices], to=TensorProto.INT32))



def lower_model(model: Model, shaped: Model | None = None) -> tuple[onnx.ModelProto, list[str], list[str]]:
    """The ONNX model of ``model.main`` with its input and output names (one per HAL
    input / output, in order). Raises Declined if any part cannot be lowered.
    ``shaped``: infer_temporary_shapes(model) when the caller has it already (the device
    computes it to check the operations), not computed again."""
    model = split_padded_adds(merge_twin_branches(infer_temporary_shapes(model) if shaped is None else shaped))
    subgraph = model.main
    g = GraphBuilder(model, subgraph)
    for index in subgraph.input_indexes:
        g.value(index)
    input_names = [i.name for i in g.inputs]
    composites = find_composites(model, subgraph)
    for operation in subgraph.operations:
        if id(operation) in composites.inner:
            continue  # computed by its composite's one operator, at the composite's last operation
        fused = composites.roots.get(id(operation))
        if fused is not None:
            g.set_output(operation.outputs[0], _composite(g, operation, *fused))
        else:
            lower_operation(g, operation)
    outputs, output_names = [], []
    for position, index in enumerate(subgraph.output_indexes):
        operand = subgraph.operands[index]
        value = g.value(index)
        name = f"out_{position}"
        if operand.type == T.TENSOR_FLOAT16:
            g.node("Cast", [value.name], [name], to=TensorProto.FLOAT16)
        elif operand.type == T.TENSOR_QUANT8_ASYMM_SIGNED:
            if not _quantize_to_int8(g, value.name, name):
                g.node("Identity", [g.shift_signed(value.name, to_unsigned=False, dims=value.dims)], [name])
        else:
            g.node("Identity", [value.name], [name])
        dims = [d if d else None for d in operand.dimensions]
        outputs.append(helper.make_tensor_value_info(name, HAL_ELEM[operand.type], dims))
        output_names.append(name)
    _drop_unread_nodes(g, output_names)  # first, so that a value read only by its output's Identity is seen so
    _drop_output_identities(g)
    graph = helper.make_graph(g.nodes, "nnapi", g.inputs, outputs, g.initializers)
    lowered = onnx_model(graph, g.uses_ms_domain, producer_name="nnapi")
    widen_scalars(lowered)
    return lowered, input_names, output_names



def _composite(g: GraphBuilder, root: Operation, op_type: str, source: int, parameters: tuple) -> str:
    """A composite (composites.py) ending at ``root`` as ORT's one operator on ``source``;
    a quantized swish computes it on the dequantized values and quantizes into the root's
    output with its fused activation."""
    x = g.value(source)
    if op_type == LAYER_NORM:
        # on a [rows, channels] view: ORT fuses an Add before a LayerNormalization of the
        # same shape into its SkipLayerNormalization, ~6x slower on CPU (onnxruntime 1.32,
        # 128 x 128: 79 us against 6 + 12 for the Add and the norm); the Reshapes are views
        gamma, beta, epsilon = parameters
        rows = g.one("Reshape", [x.name, g.constant(np.array([-1, x.dims[-1]], np.int64))])
        norm = g.one(LAYER_NORM, [rows, g.constant(gamma, "gamma"), g.constant(beta, "beta")], axis=-1,
                     epsilon=epsilon)
        return g.one("Reshape", [norm, g.constant(np.array(x.dims, np.int64))])
    if op_type != QUANTIZED_SWISH:
        return g.one(op_type, [x.name], domain=MS_DOMAIN)
    output = g.operand(root.outputs[0])
    swish = g.one(QUANTIZED_SWISH, [g.dequantize(x)], domain=MS_DOMAIN, alpha=1.0)
    return fused_activation(g, g.quantize(swish, output), int(g.scalar(root.inputs[2])), output)



def _drop_output_identities(g: GraphBuilder) -> None:
    """Let the node producing a graph output write it directly (no Identity copy) where the
    value is produced by a node and read by nothing else."""
    producers = {output: node for node in g.nodes for output in node.output}
    reads = read_counts(g.nodes)
    for node in list(g.nodes):
        if node.op_type != "Identity" or not node.output[0].startswith("out_"):
            continue
        source = node.input[0]
        producer = producers.get(source)
        if producer is None or reads.get(source, 0) != 1 or source.startswith("out_"):
            continue
        producer.output[list(producer.output).index(source)] = node.output[0]
        g.nodes.remove(node)



def _quantize_to_int8(g: GraphBuilder, name: str, output: str) -> bool:
    """An int8 graph output computed by a QuantizeLinear read by nothing else (a padded
    quantized AVERAGE_POOL_2D's) as that QuantizeLinear to int8 with its zero
    point - 128: the same q = u - 128, saturated alike, in one pass where shift_signed
    adds two more over the output (its int16 Cast, Add, Cast took ~0.6 of deeplab_like_int8's
    ~8 ms at 257x257x21). The uint8 one, now unread, is dropped. False where it does not apply."""
    def only_producer(value: str, readers: int) -> onnx.NodeProto | None:
        """The node computing ``value``, where ``readers`` nodes read it."""
        if read_counts(g.nodes).get(value, 0) != readers:
            return None
        return next((node for node in g.nodes if value in node.output), None)

    producer = only_producer(name, 0)
    transpose = None
    if producer is not None and producer.op_type == "Transpose":  # from_nchw after an NCHW operator
        transpose, producer = producer, only_producer(producer.input[0], 1)
    if producer is None or producer.op_type != "QuantizeLinear" or len(producer.input) != 3:
        return False
    zero_point = next((numpy_helper.to_array(tensor) for tensor in g.initializers
                       if tensor.name == producer.input[2]), None)
    if zero_point is None or zero_point.dtype != np.uint8 or zero_point.size != 1:
        return False
    shifted = np.array(int(zero_point.reshape(-1)[0]) - 128, np.int8)
    q = g.one("QuantizeLinear", [producer.input[0], producer.input[1], g.constant(shifted)],
              **{a.name: helper.get_attribute_value(a) for a in producer.attribute})
    g.node("Transpose", [q], [output], perm=list(transpose.attribute[0].ints)) if transpose is not None else \
        g.node("Identity", [q], [output])
    return True



def _drop_unread_nodes(g: GraphBuilder, outputs: list[str]) -> None:
    """Drop the nodes whose results nothing reads (a DEQUANTIZE whose only reader took the
    quantized value instead: _integer_mean); ORT would run them."""
    while True:
        read = set(outputs).union(read_counts(g.nodes))
        kept = [node for node in g.nodes if any(name in read for name in node.output)]
        if len(kept) == len(g.nodes):
            return
        g.nodes[:] = kept



def operation_support(model: Model, operation: Operation) -> str | None:
    """None if ``operation`` (of the main subgraph) lowers, else why not."""
    g = GraphBuilder(model, model.main, isolated=True)
    try:
        lower_operation(g, operation)
    except Declined as reason:
        return str(reason)
    return None
