"""Lowerings of the pooling and reductions: AVERAGE_POOL_2D, MAX_POOL_2D, L2_POOL_2D, MEAN,
REDUCE_* (MAX, MIN, SUM, PROD, ANY, ALL), ARGMAX / ARGMIN and TOPK_V2."""

from __future__ import annotations

import math

import numpy as np
from onnx import TensorProto, helper

from nnapi.codes import OperationCode
from nnapi.drivers.ort.builder import (
    FLOATS,
    KIND_ELEM,
    QUANT8,
    Declined,
    GraphBuilder,
    T,
    Value,
    blocked,
    check_same_quantization,
    constant_axis,
    constant_ints,
    fail_unless,
    from_nchw,
    fused_activation,
    has_kernel,
    internal_zero_point,
    lowers,
    middle_axes_sums,
    require_rank,
    run_time_form,
    same_pads,
    to_nchw,
    type_name,
)
from nnapi.drivers.ort.channel_padding import pool_layout_nchw, reads_padded, set_channels
from nnapi.drivers.ort.data_movement import max_pool_padding, pad_of_max_pool
from nnapi.hal import Operand, Operation


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
        set_channels(g, operation.outputs[0], y, x.dims[3])
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


def nonempty(g: GraphBuilder, operation: Operation, source: str, dims: list[int], y: str) -> str:
    """``y``, the result of reduction ``operation`` of ``source``, where ``source`` has no
    dimension of 0; otherwise the run fails, as Android's CPU executor fails MEAN and the
    REDUCE_* operations of a zero-sized input (they are not among those allowing one). A
    check only where a dimension is known only at run time."""
    if dims and all(dims):
        return y
    sizes = g.one("Shape", [source])
    holds = g.one("Greater", [g.one("ReduceMin", [sizes], keepdims=0), g.constant(np.array(0, np.int64))])
    name = OperationCode(operation.type).name
    shape = fail_unless(g, holds, g.one("Shape", [y]), f"input 0 is zero-sized, which {name} does not support")
    return g.one("Reshape", [y, shape])


@lowers(OperationCode.MEAN)
def lower_mean(g: GraphBuilder, operation: Operation) -> None:
    output = g.operand(operation.outputs[0])
    if output.type in FLOATS and operation.inputs[0] in g.padded and reads_padded(g, operation, operation.inputs[0]):
        # channels padded to the NCHWc block (wants_padding; the height and width, kept):
        # the mean of zeros is zero
        x = g.blocked_value(operation.inputs[0])
        nchw = to_nchw(g, x.name, False)
        pooled = nonempty(g, operation, nchw, x.dims, from_nchw(g, g.one("GlobalAveragePool", [nchw]), False))
        set_channels(g, operation.outputs[0], pooled, x.dims[3])
        return
    x = g.value(operation.inputs[0])
    if g.raw_constant(operation.inputs[1]) is None:  # the axes given at run time
        g.set_output(operation.outputs[0], nonempty(g, operation, x.name, x.dims, run_time_form(g, operation, x)))
        return
    axes = np.atleast_1d(np.asarray(g.scalar(operation.inputs[1]))).astype(np.int64)
    keep = int(g.scalar(operation.inputs[2])) != 0
    if x.rank == 0 or np.any(axes < -x.rank) or np.any(axes >= x.rank):
        raise Declined("MEAN axes out of range")
    axes = sorted({int(a) % x.rank for a in axes})
    source = g.dequantized.get(operation.inputs[0])
    if output.type == T.TENSOR_FLOAT32 and axes == [1, 2] and x.rank == 4 and source is not None and all(x.dims):
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
    g.set_output(operation.outputs[0], nonempty(g, operation, x.name, x.dims, y))


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
    sums = middle_axes_sums(g, x.name, x.dims, x.zero_point)
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


def _reduced(g: GraphBuilder, name: str, rank: int, axes: list[int], keep: bool) -> str:
    """NNAPI gives shape [1] where every dimension was reduced away (ONNX a scalar)."""
    if not keep and len(axes) == rank:
        return g.one("Reshape", [name, g.constant(np.array([1], np.int64))])
    return name


def _folded_extreme(g: GraphBuilder, largest: bool, x: Value, axes: list[int], keep: bool, half: bool) -> str:
    """Float REDUCE_MAX / MIN as Android folds them (Reduce.cpp: from the type's lowest /
    highest finite value, std::max(acc, x) / std::min(acc, x) in scan order; the reference's
    reduce._folded_extreme): NaN never enters, a group of only -inf / NaN (+inf / NaN for
    MIN) gives the starting value, and a zero result is the group's first zero, -0 or +0.
    ORT's ReduceMax / Min start from -inf / inf (clamped here to the starting value: Max /
    Min), pick among equal zeros by their own order, and beside a NaN give NaN or, in their
    vector loops, a value that skipped others (a random search: finite results below the
    maximum of the values that are not NaN). So where the input holds a NaN (its sum is NaN:
    one ReduceSum) or a result is zero, an If runs the exact form: NaN as -inf (+inf) first
    (Where keeps a -0 of its third input), and the sign of a zero result the first zero's,
    the least key 2 * position + sign over the group's zeros (int32), applied as +0 times
    +-1; elsewhere the clamped ReduceMax / Min stands. Over no axes each value is folded
    alone: NaN and -inf (+inf) become the starting value."""
    info = np.finfo(np.float16 if half else np.float32)
    start = g.constant(np.array(info.min if largest else info.max, np.float32))
    skipped = g.constant(np.array(-np.inf if largest else np.inf, np.float32))
    reducer, clamp = ("ReduceMax", "Max") if largest else ("ReduceMin", "Min")
    if not axes:
        return g.one(clamp, [g.one("Where", [g.one("IsNaN", [x.name]), skipped, x.name]), start])
    zero = g.constant(np.array(0.0, np.float32))
    fast = g.one(clamp, [g.one(reducer, [x.name], axes=axes, keepdims=1), start])
    # the sum is NaN where a NaN is inside (or infinities of both signs: the exact form too)
    unsure = g.one("Or", [g.one("IsNaN", [g.one("ReduceSum", [x.name], keepdims=0)]),
                          g.one("Equal", [g.one("ReduceMin", [g.one("Abs", [fast])], keepdims=0), zero])])
    exact = g.nested(g.subgraph, "folded")
    clean = exact.one("Where", [exact.one("IsNaN", [x.name]), skipped, x.name])
    y = exact.one(clamp, [exact.one(reducer, [clean], axes=axes, keepdims=1), start])
    keys = _scan_positions(g, x, axes)
    negative = exact.one("Less", [exact.one("Reciprocal", [x.name]), zero])  # -0 (1 / -0 is -inf)
    signed = exact.one("Add", [keys, exact.one("Cast", [negative], to=TensorProto.INT32)])
    none = g.constant(np.array(np.iinfo(np.int32).max, np.int32))
    first = exact.one("ReduceMin", [exact.one("Where", [exact.one("Equal", [x.name, zero]), signed, none])],
                      axes=axes, keepdims=1)
    minus = exact.one("Equal", [exact.one("Mod", [first, g.constant(np.array(2, np.int32))]),
                                g.constant(np.array(1, np.int32))])
    at_zero = exact.one("Equal", [y, zero])
    plain = exact.one("Where", [at_zero, zero, y])  # +0 where zero, y's bits elsewhere
    factor = exact.one("Where", [exact.one("And", [at_zero, minus]), g.constant(np.array(-1.0, np.float32)),
                                 g.constant(np.array(1.0, np.float32))])
    result = exact.one("Mul", [plain, factor])
    then_graph = helper.make_graph(exact.nodes, f"{exact.prefix}graph", [],
                                   [helper.make_tensor_value_info(result, TensorProto.FLOAT, None)], exact.initializers)
    plain_branch = g.nested(g.subgraph, "clamped")
    kept = plain_branch.one("Identity", [fast])
    else_graph = helper.make_graph(plain_branch.nodes, f"{plain_branch.prefix}graph", [],
                                   [helper.make_tensor_value_info(kept, TensorProto.FLOAT, None)])
    y = g.node("If", [unsure], 1, then_branch=then_graph, else_branch=else_graph)[0]
    if not keep:
        y = g.one("Squeeze", [y, g.constant(np.array(axes, np.int64))])
    return y


def _scan_positions(g: GraphBuilder, x: Value, axes: list[int]) -> str:
    """Int32 twice each element's position in its group's scan order (the reduced axes in
    order, row-major), shaped to broadcast against ``x``: a constant where the reduced sizes
    are known; a Range over one reduced axis known only at run time."""
    sizes = [x.dims[a] for a in axes]
    shape = [x.dims[a] if a in axes else 1 for a in range(x.rank)]
    if all(sizes):
        if 2 * math.prod(sizes) >= 2 ** 31:
            raise Declined("a group too large for int32 positions")
        return g.constant((2 * np.arange(math.prod(sizes), dtype=np.int32)).reshape(shape))
    if len(axes) > 1:
        raise Declined("float REDUCE_MAX / MIN over several axes, one of a size known only at run time")
    size = g.one("Cast", [g.one("Shape", [x.name], start=axes[0], end=axes[0] + 1)], to=TensorProto.INT32)
    steps = g.one("Range", [g.constant(np.array(0, np.int32)), g.one("Mul", [g.one("Squeeze", [size]), g.constant(
        np.array(2, np.int32))]), g.constant(np.array(2, np.int32))])
    around = [a for a in range(x.rank) if a != axes[0]]
    return g.one("Unsqueeze", [steps, g.constant(np.array(around, np.int64))]) if around else steps


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
    # An axis reduced of a size known only at run time may be empty there, where the run
    # fails (nonempty); the others need each reduced size known.
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
    if code in (OperationCode.REDUCE_MAX, OperationCode.REDUCE_MIN) and x.kind == "float":
        half = g.operand(operation.inputs[0]).type == T.TENSOR_FLOAT16
        y = _folded_extreme(g, code == OperationCode.REDUCE_MAX, x, axes, keep, half)
        g.set_output(operation.outputs[0], nonempty(g, operation, x.name, x.dims, _reduced(g, y, x.rank, axes, keep)))
        return
    if not axes:
        g.set_output(operation.outputs[0], nonempty(g, operation, x.name, x.dims, g.one("Identity", [x.name])))
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
    g.set_output(operation.outputs[0], nonempty(g, operation, x.name, x.dims, _reduced(g, y, x.rank, axes, keep)))


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
