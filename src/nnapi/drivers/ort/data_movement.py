"""Lowerings of the shape and data-movement operations: RESHAPE, SQUEEZE, EXPAND_DIMS,
TRANSPOSE, REVERSE, CONCATENATION, SPLIT, SLICE, STRIDED_SLICE, GATHER, TILE, PAD / PAD_V2,
CHANNEL_SHUFFLE, DEPTH_TO_SPACE / SPACE_TO_DEPTH and SPACE_TO_BATCH_ND / BATCH_TO_SPACE_ND."""

from __future__ import annotations

import math

import numpy as np
from onnx import TensorProto

from nnapi.codes import FuseCode, OperationCode
from nnapi.drivers.ort.builder import (
    FLOATS,
    KIND_ELEM,
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
    lowers,
    require_rank,
    run_time_form,
    same_pads,
    to_nchw,
    type_name,
)
from nnapi.drivers.ort.channel_padding import (
    pad_value_is_zero,
    padded_channels,
    pool_layout_nchw,
    set_channels,
    wants_padding,
)
from nnapi.drivers.ort.mean_table import lower_table_mean
from nnapi.hal import Operation


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
    producer = g.producer(operation.inputs[0])
    if producer is not None and producer.type == OperationCode.RESHAPE and not g.isolated:
        # a RESHAPE back to the shape before the one it reads (a Conv1D's [N, 1, T, C] ->
        # [N, T, C] -> [N, 1, T, C] between two layers): that value itself. ORT merges the
        # two Reshapes into one that changes nothing but still runs, and keeps a float value
        # out of its blocked layout there (a ReorderOutput and a ReorderInput per layer)
        before = g.value(producer.inputs[0])
        if before.kind == x.kind and before.dims and all(before.dims) and before.dims == shape.tolist():
            g.set_output(operation.outputs[0], before.name)
            return
    if _only_broadcast(g, operation.outputs[0], x, shape.tolist()):
        g.values[operation.outputs[0]] = Value(x.name, x.kind, list(x.dims), x.scale, x.zero_point)
        return
    g.set_output(operation.outputs[0], g.one("Reshape", [x.name, g.constant(shape)]))


_BROADCASTING = (OperationCode.ADD, OperationCode.SUB, OperationCode.MUL, OperationCode.DIV)


def _only_broadcast(g: GraphBuilder, index: int, x: Value, shape: list[int]) -> bool:
    """Whether RESHAPE output ``index`` (``x`` to ``shape``) only drops leading 1s and is
    read only by element-wise float (or 8-bit: QLinearAdd / QLinearMul broadcast alike)
    operations whose outputs have at least ``x``'s rank: broadcasting ``x`` itself there
    gives the same elements in the same places (an unrolled LSTM's [1, 4n] product
    reshaped to [4n] before its ADD, once per step)."""
    if g.isolated or x.kind not in ("float", "uint8") or not x.dims or not all(x.dims) or len(shape) >= x.rank \
            or x.dims[x.rank - len(shape):] != shape or any(d != 1 for d in x.dims[:x.rank - len(shape)]) \
            or index in g.subgraph.output_indexes or index in g.padded:
        return False
    readers = g.readers(index)
    return bool(readers) and all(
        op.type in _BROADCASTING and index in op.inputs[:2] and len(g.operand(op.outputs[0]).dimensions) >= x.rank
        and (g.operand(op.outputs[0]).type == T.TENSOR_FLOAT32 if x.kind == "float" else
             g.operand(op.outputs[0]).type in QUANT8) for op in readers)


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
    set_channels(g, index, y, channels)
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
    if x.kind == "uint8" and not nchw and x.dims and all(x.dims) and not g.isolated and (
            x.dims[3] // (block * block) if operation.type == OperationCode.DEPTH_TO_SPACE else x.dims[3]) >= 4:
        g.set_output(operation.outputs[0], _depth_space_rows(g, x, block, op_type == "DepthToSpace"))
        return
    if x.kind == "float" and op_type == "DepthToSpace" and x.dims and all(x.dims):
        g.set_output(operation.outputs[0], from_nchw(g, _depth_to_space_planes(g, to_nchw(g, x.name, nchw), [
            x.dims[i] for i in ((0, 1, 2, 3) if nchw else (0, 3, 1, 2))], block), nchw))
        return
    if not has_kernel(op_type, KIND_ELEM[x.kind], blocksize=2, **extra):
        raise Declined(f"this onnxruntime has no {op_type} kernel for {x.kind} values")
    y = g.one(op_type, [to_nchw(g, x.name, nchw)], blocksize=block, **extra)
    g.set_output(operation.outputs[0], from_nchw(g, y, nchw))


def _depth_to_space_planes(g: GraphBuilder, x: str, dims: list[int], block: int) -> str:
    """DEPTH_TO_SPACE of a float NCHW value ``x`` of ``dims`` [N, b * b * C, H, W] (TF's
    channel order, ONNX's DCR: channel (by * b + bx) * C + c of pixel (h, w) is pixel (h * b +
    by, w * b + bx)'s channel c) as two Transposes, where ORT's DepthToSpace moves each float
    alone: [N, by, bx, C * H, W] -> [N, bx, C * H, by, W] moves rows of W floats (the rows
    of each block row next to their image row), then [N, bx, M] -> [N, M, bx] interleaves
    the b column phases (ORT's transpose of a matrix with its own kernel). The same values
    (a permutation). onnxruntime 1.32, one thread, load ~1: [1, 64, 48, 48] to [1, 16, 96,
    96] 169 -> 60 us, [1, 64, 24, 24] 47 -> 17, [1, 27, 32, 32] to 3 channels 27 -> 13;
    SpaceToDepth keeps ORT's operator (3-10x faster than the inverse Transposes)."""
    batches, depth, height, width = dims
    channels = depth // (block * block)
    rows = g.one("Transpose", [g.one("Reshape", [x, g.constant(np.array(
        [batches, block, block, channels * height, width], np.int64))])], perm=[0, 2, 3, 1, 4])
    columns = g.one("Transpose", [g.one("Reshape", [rows, g.constant(np.array(
        [batches, block, channels * height * block * width], np.int64))])], perm=[0, 2, 1])
    return g.one("Reshape", [columns, g.constant(np.array([batches, channels, height * block, width * block],
                                                          np.int64))])


def _depth_space_rows(g: GraphBuilder, x: Value, block: int, to_space: bool) -> str:
    """DEPTH_TO_SPACE / SPACE_TO_DEPTH of an 8-bit NHWC value as its rows moved in place:
    channel (by * b + bx) * C + c of pixel (h, w) is pixel (h * b + by, w * b + bx)'s
    channel c (TF's order, ONNX's DCR), so a Reshape to [N, H, W, b, b, C] (or [N, H, b, W,
    b, C]), one Transpose swapping the middle axes and a Reshape back: one pass in NHWC,
    where ORT's DepthToSpace / SpaceToDepth run in NCHW between two Transposes (zoo
    depthspace_int8's ORT run 35.0 -> 31.5 us, load ~7; its uint8 DepthToSpace alone 8 us).
    Where C, the run of bytes each move copies, is at least 4: the Transpose and
    DepthToSpace alone, onnxruntime 1.32, load ~10: 128x128x16 block 2 to 4 channels 251
    -> 20 us, 64x64x32 to 8 115 -> 55, 64x64x128 to 32 525 -> 64; to 3 channels 54 -> 55
    (even), and ESPCN's 3x upscale to one channel 7 -> 21 us (the Transposes around its
    DepthToSpace move nothing there). Float values keep the ONNX operators, which ORT runs
    next to its blocked convolutions (the same model in float 62.5 -> 64.8 us this way: its
    RELU no longer fused)."""
    batches, height, width, depth = x.dims
    if to_space:
        channels = depth // (block * block)
        blocks = [batches, height, width, block, block, channels]
        shape = [batches, height * block, width * block, channels]
    else:
        blocks = [batches, height // block, block, width // block, block, depth]
        shape = [batches, height // block, width // block, depth * block * block]
    moved = g.one("Transpose", [g.one("Reshape", [x.name, g.constant(np.array(blocks, np.int64))])],
                  perm=[0, 1, 3, 2, 4, 5])
    return g.one("Reshape", [moved, g.constant(np.array(shape, np.int64))])


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
    if any(size <= 0 for size in produced):
        # an empty result (the reference's zero-sized output): named as such, where the
        # reason blamed the output operand, which allows it
        raise Declined(f"STRIDED_SLICE selects no element along an axis (shape {shape}): a zero-sized "
                       f"output is not lowered")
    if output.dimensions and (any(d and d != s for d, s in zip(output.dimensions, shape))
                              or len(output.dimensions) not in (0, len(shape))):
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


@lowers(OperationCode.GATHER)
def lower_gather(g: GraphBuilder, operation: Operation) -> None:
    """Gather along a constant axis. NNAPI refuses indices outside [0, size) where ONNX
    would count a negative one from the end: constant indices are checked here, indices
    given at run time are sent out of range when negative, so that the run fails as the
    reference's does instead of reading another element (past any size where the size is
    known only at run time; Gather refuses an index past the end in the same way). The
    importer's quantized MEAN as a table reads its index from the exact integer sum
    (mean_table.py)."""
    if lower_table_mean(g, operation):
        return
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
    bounds = g.ranges.get(operation.inputs[2])
    if (known is not None and size) or (bounds is not None and bounds[0].min() >= 0):
        # constant, or never negative by the bounds value_ranges.py proves (a decode head's
        # index, its own checks folded): Gather refuses one past the end as the reference does
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
    time steps, the Keras way; float or 8-bit): the rows of one Reshape of the input to
    [steps, row], cut by one Split; and where each step's row is read only by a FULLY_CONNECTED with the
    same weights, bias and activation (the input's product of every step), that one
    product of the whole matrix, cut into the steps' results. Two or three nodes instead
    of two or three per step; each row's product is the same dot products (FULLY_CONNECTED
    leaves their order of summation open). The SPLIT's and RESHAPEs' own outputs are then
    never computed (nothing else reads them)."""
    subgraph = g.subgraph
    if g.isolated or any(d != 1 for d in x.dims[:axis]) or x.kind not in ("float", "uint8"):
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

    if first.type != OperationCode.FULLY_CONNECTED or len(first.inputs) != 4:
        return None  # the rows are read by something else (a TILE, an ADD): no common product
    weights, fuse = constant(first.inputs[1]), constant(first.inputs[3])
    if weights is None or fuse is None or weights.ndim != 2 or \
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
