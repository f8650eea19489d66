"""Lowerings of the resizes: RESIZE_BILINEAR and RESIZE_NEAREST_NEIGHBOR, with the check
that ORT's Resize takes the specification's taps (``resize_matches_taps``)."""

from __future__ import annotations

import functools
import math

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from nnapi.codes import OperationCode
from nnapi.drivers.ort.builder import (
    FLOATS,
    NHWC_TO_NCHW,
    QUANT8,
    Declined,
    GraphBuilder,
    T,
    Value,
    check_same_quantization,
    from_nchw,
    lowers,
    probe_outputs,
    require_rank,
    resize_in_rows,
    to_nchw,
    type_name,
)
from nnapi.drivers.ort.channel_padding import set_channels
from nnapi.hal import Operand, Operation
from nnapi.operations.common import nearest_indexes
from nnapi.operations.resize import weighted_taps


@lowers(OperationCode.RESIZE_BILINEAR)
def lower_resize_bilinear(g: GraphBuilder, operation: Operation) -> None:
    output = g.operand(operation.outputs[0])
    nchw = bool(g.optional_scalar(operation, 3, False))
    # channels padded to the NCHWc block (wants_padding): each channel is resized on its
    # own, so the zero channels stay zero and ORT keeps the Resize in its blocked layout
    padded = output.type in FLOATS and operation.inputs[0] in g.padded and not nchw
    x = g.blocked_value(operation.inputs[0]) if padded else g.value(operation.inputs[0])
    require_rank(x, 4, "the input")
    align_corners = bool(g.optional_scalar(operation, 4, False))
    half_pixel = bool(g.optional_scalar(operation, 5, False))
    if align_corners and half_pixel:
        raise Declined("align_corners and half_pixel_centers together are not valid")
    height_axis, width_axis = (2, 3) if nchw else (1, 2)
    if not x.dims[height_axis] or not x.dims[width_axis]:
        raise Declined("the input's height and width must be known")
    if g.operand(operation.inputs[1]).type == T.INT32:
        width, height = int(g.scalar(operation.inputs[1])), int(g.scalar(operation.inputs[2]))
    else:
        # in float32, as the reference: a product float64 puts just under an integer can
        # round up to it in float32
        scale_w, scale_h = np.float32(g.scalar(operation.inputs[1])), np.float32(g.scalar(operation.inputs[2]))
        width = int(math.floor(np.float32(x.dims[width_axis]) * scale_w))
        height = int(math.floor(np.float32(x.dims[height_axis]) * scale_h))
    if width <= 0 or height <= 0:
        raise Declined("the output size must be positive")
    channels = x.dims[1 if nchw else 3]
    if not channels:
        raise Declined("the input's channel count must be known")
    mode = resize_mode(align_corners, half_pixel)
    if output.type not in FLOATS and output.type not in QUANT8:
        raise Declined(f"RESIZE_BILINEAR on {type_name(output.type)} is not supported")

    def sizes(rest: list[int]) -> str:
        """The output's sizes: the batch (the input's, at run time where it is not known) and ``rest``."""
        if x.dims[0]:
            return g.constant(np.array([x.dims[0], *rest], np.int64))
        batch = g.one("Slice", [g.one("Shape", [x.name]), *(g.constant(np.array([v], np.int64)) for v in (0, 1))])
        return g.one("Concat", [batch, g.constant(np.array(rest, np.int64))], axis=0)

    if not padded and resize_in_rows(g, operation):
        g.set_output(operation.outputs[0], g.one("Resize", [x.name, "", "", sizes([height, width, channels])],
                                                 mode="linear", coordinate_transformation_mode=mode))
        return
    if output.type in QUANT8:
        g.set_output(operation.outputs[0], _truncated_blend(g, x, output, (height_axis, width_axis),
                                                            (height, width), align_corners, half_pixel))
        return
    sizes = sizes([channels, height, width])
    # half_pixel here is TF's: a length-1 output still samples from the half-pixel position
    y = g.one("Resize", [to_nchw(g, x.name, nchw), "", "", sizes], mode="linear",
              coordinate_transformation_mode=mode)
    if padded:
        set_channels(g, operation.outputs[0], from_nchw(g, y, nchw), channels)
        return
    g.set_output(operation.outputs[0], from_nchw(g, y, nchw))


#: a weight that is a multiple of 2**-6 of magnitude <= 2 makes every product of an 8-bit
#: integer and two weights (<= 1020, a multiple of 2**-12) and every sum of four (< 2**12)
#: exact in float32: the blend is then exact in any order
_EXACT_WEIGHT_STEP = 2.0 ** -6


def resize_mode(align_corners: bool, half_pixel: bool) -> str:
    """ONNX Resize's coordinate_transformation_mode for NNAPI's flags (half_pixel here is
    TF's: a length-1 output still samples from the half-pixel position)."""
    return "align_corners" if align_corners else "half_pixel" if half_pixel else "asymmetric"


def exact_taps(*taps: tuple) -> bool:
    """Whether every weight of the resize taps given (``weighted_taps``' tables, weights from
    their third element on) is a multiple of 2**-6 of magnitude at most 2, which makes an
    8-bit blend of them exact in float32 in any order (``_EXACT_WEIGHT_STEP``)."""
    weights = np.concatenate([np.asarray(t[2:], np.float64).ravel() for t in taps])
    steps = weights / _EXACT_WEIGHT_STEP
    return bool(np.all(steps == np.round(steps)) and np.all(np.abs(weights) <= 2))


@functools.lru_cache(maxsize=64)
def resize_matches_taps(height: int, width: int, out_height: int, out_width: int, align_corners: bool,
                        half_pixel: bool, nchw: bool) -> bool:
    """Whether ORT's float Resize of a Cast uint8 image (NCHW or NHWC), in the mode given,
    blends with the reference's taps (``weighted_taps``, exact binary fractions here): a
    one-off run of that Cast + Resize on probe planes compared with the reference's blend
    bit for bit. Resize is separable and the exact taps make every sum exact, so planes
    marking every third row (or column) fix both weight tables (an output row's two taps
    are adjacent rows: at most one of them is marked; a common factor between the tables
    cancels, each sums to one) and with them every output: then ORT's Resize is the
    reference's blend on every image, at Resize's speed (deeplab's 32x32 -> 256x256x21
    head: the gathered blend took ~5 ms)."""
    from nnapi.operations.resize import bilinear_blend

    mode = resize_mode(align_corners, half_pixel)
    probe = np.zeros((1, height, width, 6), np.uint8)
    for phase in range(3):
        probe[0, phase::3, :, phase] = 1
        probe[0, :, phase::3, 3 + phase] = 1
    shape_in, shape_out = list(probe.shape), [1, out_height, out_width, 6]
    if nchw:
        shape_in, shape_out = [shape_in[i] for i in NHWC_TO_NCHW], [shape_out[i] for i in NHWC_TO_NCHW]
    sizes = numpy_helper.from_array(np.array(shape_out, np.int64), "sizes")
    graph = helper.make_graph(
        [helper.make_node("Cast", ["x"], ["f"], to=TensorProto.FLOAT),
         helper.make_node("Resize", ["f", "", "", "sizes"], ["y"], mode="linear",
                          coordinate_transformation_mode=mode)],
        "probe", [helper.make_tensor_value_info("x", TensorProto.UINT8, shape_in)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape_out)], [sizes])
    try:
        outputs = probe_outputs(graph, {"x": probe.transpose(NHWC_TO_NCHW) if nchw else probe})
    except ImportError:  # lowering without a runtime: the gathered blend, proven anyway
        return False
    if outputs is None:  # a runtime that refuses the probe: the gathered blend
        return False
    ours = outputs[0]
    rows = weighted_taps(height, out_height, align_corners, half_pixel)
    cols = weighted_taps(width, out_width, align_corners, half_pixel)
    expected = bilinear_blend(probe.astype(np.float32), rows, cols)
    return bool(np.array_equal(ours, expected.transpose(NHWC_TO_NCHW) if nchw else expected))


def _truncated_blend(g: GraphBuilder, x: Value, output: Operand, axes: tuple[int, int], sizes: tuple[int, int],
                     align_corners: bool, half_pixel: bool) -> str:
    """A quantized bilinear resize as the reference (Android's kernel) computes it: the
    stored integers blended in float32 with the reference's own taps (``weighted_taps``,
    computed here once), ``a * wy0 * wx0 + b * wy1 * wx0 + c * wy0 * wx1 + d * wy1 * wx1``
    left to right, truncated toward zero; input and output share their quantization. Each
    step is one IEEE float32 operation, so the result is the reference's bit for bit. ORT's
    Resize between DequantizeLinear and QuantizeLinear rounded the blend to nearest even
    instead and weighs in another order: 28-48% of a test image's values and about half of
    deeplab's 256x256x21 head a step off. The gathers work in either layout: no Transpose.
    Where the taps are exact binary fractions (power-of-two scales without align_corners)
    and a probe shows ORT's Resize using them (``resize_matches_taps``), that Resize
    computes the same blend, ~8x faster."""
    height_axis, width_axis = axes
    rows = weighted_taps(x.dims[height_axis], sizes[0], align_corners, half_pixel)
    cols = weighted_taps(x.dims[width_axis], sizes[1], align_corners, half_pixel)
    row_shape = [-1] + [1] * (x.rank - height_axis - 1)
    col_shape = [-1] + [1] * (x.rank - width_axis - 1)
    nchw = height_axis == 2
    signed = output.type == T.TENSOR_QUANT8_ASYMM_SIGNED
    # the operand's own integers (truncation toward zero differs below zero): an int8 graph
    # input's own bits where the value is one
    source = g.signed_source(x.name) if signed else None
    values = g.one("Cast", [source or x.name], to=TensorProto.FLOAT)
    if signed and source is None:
        values = g.one("Sub", [values, g.constant(np.float32(128))])
    if (not g.isolated and all(x.dims) and exact_taps(rows, cols)
            and resize_matches_taps(x.dims[height_axis], x.dims[width_axis], *sizes, align_corners, half_pixel,
                                     nchw)):
        mode = resize_mode(align_corners, half_pixel)
        shape = list(x.dims)
        shape[height_axis], shape[width_axis] = sizes
        blend = g.one("Resize", [values, "", "", g.constant(np.array(shape, np.int64))], mode="linear",
                      coordinate_transformation_mode=mode)
        return _truncated(g, blend, signed)

    def gather(name: str, indexes: np.ndarray, axis: int) -> str:
        return g.one("Gather", [name, g.constant(indexes.astype(np.int64))], axis=axis)

    def weigh(name: str, weights: np.ndarray, shape: list[int]) -> str:
        return g.one("Mul", [name, g.constant(weights.astype(np.float32).reshape(shape))])

    top = weigh(gather(values, rows[0], height_axis), rows[2], row_shape)
    bottom = weigh(gather(values, rows[1], height_axis), rows[3], row_shape)
    blend = weigh(gather(top, cols[0], width_axis), cols[2], col_shape)
    for source, lower, weight in ((bottom, 0, 2), (top, 1, 3), (bottom, 1, 3)):
        blend = g.one("Add", [blend, weigh(gather(source, cols[lower], width_axis), cols[weight], col_shape)])
    return _truncated(g, blend, signed)


def _truncated(g: GraphBuilder, blend: str, signed: bool) -> str:
    """A float blend of stored integers as the internal uint8 value: truncated toward zero
    by a float to 8-bit Cast (C's conversion; every blend lies within the type's range),
    an int8 one shifted to the internal encoding after."""
    if signed:
        return g.shift_signed(g.one("Cast", [blend], to=TensorProto.INT8), to_unsigned=True)
    return g.one("Cast", [blend], to=TensorProto.UINT8)


@lowers(OperationCode.RESIZE_NEAREST_NEIGHBOR)
def lower_resize_nearest(g: GraphBuilder, operation: Operation) -> None:
    """Two Gathers of rows and columns whose indexes are the reference's own (computed here,
    once, from the static sizes): exact for every type, whatever the rounding flags."""
    x = g.value(operation.inputs[0])
    require_rank(x, 4, "the input")
    output = g.operand(operation.outputs[0])
    check_same_quantization(x, output)
    nchw = bool(g.optional_scalar(operation, 3, False))
    align_corners = bool(g.optional_scalar(operation, 4, False))
    half_pixel = bool(g.optional_scalar(operation, 5, False))
    height_axis, width_axis = (2, 3) if nchw else (1, 2)
    height, width = x.dims[height_axis], x.dims[width_axis]
    if not height or not width:
        raise Declined("the input's height and width must be known")
    if g.operand(operation.inputs[1]).type == T.INT32:
        out_w, out_h = int(g.scalar(operation.inputs[1])), int(g.scalar(operation.inputs[2]))
    else:
        scale_w, scale_h = np.float32(g.scalar(operation.inputs[1])), np.float32(g.scalar(operation.inputs[2]))
        if not (np.isfinite(scale_w) and np.isfinite(scale_h)):
            raise Declined("scales must be finite")
        out_w, out_h = math.floor(np.float32(width) * scale_w), math.floor(np.float32(height) * scale_h)
    if out_w <= 0 or out_h <= 0:
        raise Declined("the output size must be positive")
    rows = nearest_indexes(height, out_h, align_corners, half_pixel).astype(np.int64)
    cols = nearest_indexes(width, out_w, align_corners, half_pixel).astype(np.int64)
    y = g.one("Gather", [x.name, g.constant(rows)], axis=height_axis)
    y = g.one("Gather", [y, g.constant(cols)], axis=width_axis)
    g.set_output(operation.outputs[0], y)
