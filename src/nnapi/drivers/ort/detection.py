"""Lowerings of the detection operations that ONNX expresses exactly: AXIS_ALIGNED_BBOX_TRANSFORM
and HEATMAP_MAX_KEYPOINT as explicit element-wise graphs, ROI_ALIGN as ONNX's RoiAlign (float,
one sampling ratio) or as an explicit gather of its bilinear taps (quantized, or different
height and width ratios), ROI_POOLING as an explicit masked maximum.

The reference (``nnapi.operations``) computes the detection operations in float32 on the
real values (quantized inputs dequantized, TENSOR_QUANT16_ASYMM boxes times 0.125) and
quantizes a result once, round(x / scale + zero point) with halves away from zero; the
graphs here do the same float32 operations in the same order, so results agree to the
float32 rounding of ORT's kernels (Exp may differ by an ulp) and quantized ones by the same
rounding rule. Quantized ROI_ALIGN follows Android's integer pipeline as the reference does
(weights in 1/255 steps, exact integer sums, the fixed-point rescale in int64).

A region or box the reference refuses at execution (a batch index out of range, a negative
coordinate, a region outside the feature map, x1 > x2) fails the run here too
(``fail_unless``), rather than ONNX clamping or wrapping it.

What stays declined, and why:
- ROI_ALIGN's explicit form without the feature map's static shape (its samples per bin are
  bounded by it), and ROI_POOLING's masked maximum or ROI_ALIGN's gathered taps past a size
  (``_POOLING_ELEMENTS``, ``_TAPS_ELEMENTS``), where the reference is the better device;
- the NMS operations here: their greedy selections and tie order are not ONNX's
  NonMaxSuppression; their explicit greedy walk is in nms.py.

The device module imports this one, which registers these lowerings with ``lowering``.
"""

from __future__ import annotations

import numpy as np
from onnx import TensorProto

from nnapi.codes import OperationCode
from nnapi.drivers.ort.builder import (
    FLOATS,
    NCHW_TO_NHWC,
    NHWC_TO_NCHW,
    QUANT8,
    Declined,
    GraphBuilder,
    T,
    Value,
    all_hold,
    f32,
    fail_unless,
    i64,
    internal_zero_point,
    lowers,
    type_name,
)
from nnapi.drivers.ort.elementwise import exact_where
from nnapi.drivers.ort.fixed_point import multiply_by_quantized_multiplier
from nnapi.hal import Operand, Operation
from nnapi.operations.detection_common import BOX_SCALE, BOX_ZERO_POINT
from nnapi.operations.quant_math import HALF_BELOW_FLOAT32, quantize_multiplier

#: the quantized types' stored ranges
_RANGES = {T.TENSOR_QUANT8_ASYMM: (0, 255), T.TENSOR_QUANT8_ASYMM_SIGNED: (-128, 127),
           T.TENSOR_QUANT16_ASYMM: (0, 65535)}


# --- values --------------------------------------------------------------------------------
#: what rounding halves away from zero adds before Floor: the float32 just below one half,
#: so that the result is C's round exactly, as the reference's round_half_away
#: (quant_math.half_below: 0.5 itself rounds 0.5 - 2**-25 up to 1)
_HALF_BELOW = float(HALF_BELOW_FLOAT32)


def real_values(g: GraphBuilder, index: int) -> str:
    """Operand ``index``'s real values as float32, as the reference's ``to_float32``:
    (q - zero point) * scale for quantized values, 8- or 16-bit (exact for boxes: q / 8)."""
    operand = g.operand(index)
    value = g.value(index)
    if value.kind == "float":
        return value.name
    if value.kind == "uint8":
        return g.dequantize(value)
    if value.kind == "uint16":
        if (operand.scale, operand.zero_point) != (BOX_SCALE, BOX_ZERO_POINT):
            raise Declined("TENSOR_QUANT16_ASYMM boxes must have scale 0.125 and zero point 0")
        return g.one("Mul", [g.one("Cast", [value.name], to=TensorProto.FLOAT), f32(g, BOX_SCALE)])
    raise Declined(f"operand {index} of type {type_name(operand.type)} is not supported here")


def encode_real(g: GraphBuilder, name: str, operand: Operand) -> str:
    """Float32 results ``name`` in ``operand``'s internal encoding, as the reference's
    ``from_float32``: floats as they are (float16 rounds at the graph's edge), quantized
    values round(x / scale + zero point) in float32 with halves away from zero, then
    saturated (int8 travels as uint8 + 128, added after the rounding: exact)."""
    if operand.type in FLOATS:
        return name
    if operand.type not in _RANGES:
        raise Declined(f"results of type {type_name(operand.type)} are not supported")
    low, high = _RANGES[operand.type]
    scaled = g.one("Add", [g.one("Div", [name, f32(g, operand.scale)]), f32(g, operand.zero_point)])
    magnitude = g.one("Floor", [g.one("Add", [g.one("Abs", [scaled]), f32(g, _HALF_BELOW)])])
    rounded = g.one("Mul", [magnitude, g.one("Sign", [scaled])])
    clamped = g.one("Clip", [rounded, f32(g, low), f32(g, high)])
    if operand.type == T.TENSOR_QUANT16_ASYMM:
        return g.one("Cast", [clamped], to=TensorProto.UINT16)
    shift = internal_zero_point(operand) - operand.zero_point
    if shift:
        clamped = g.one("Add", [clamped, f32(g, shift)])
    return g.one("Cast", [clamped], to=TensorProto.UINT8)


def _columns(g: GraphBuilder, name: str, count: int) -> list[str]:
    """The ``count`` columns of a [rows, count] value, each [rows, 1]."""
    return g.node("Split", [name, i64(g, *([1] * count))], count, axis=1)


def run_time_dim(g: GraphBuilder, name: str, axis: int) -> str:
    """Dimension ``axis`` of ``name`` at run time, as an int64 [1]."""
    return g.one("Shape", [name], start=axis, end=axis + 1)


def _float_size(g: GraphBuilder, name: str, axis: int) -> str:
    return g.one("Cast", [run_time_dim(g, name, axis)], to=TensorProto.FLOAT)


def _checked_batches(g: GraphBuilder, index: int, batches: str, valid: list[str]) -> str:
    """Batch index operand ``index`` as int64, the run failing unless each is in [0,
    ``batches``) (an int64 [1]) and every condition in ``valid`` holds."""
    value = g.value(index)
    if value.kind != "int32":
        raise Declined("batch indexes must be TENSOR_INT32")
    ids = g.one("Cast", [value.name], to=TensorProto.INT64)
    in_range = g.one("And", [g.one("GreaterOrEqual", [ids, g.constant(np.array(0, np.int64))]),
                             g.one("Less", [ids, batches])])
    return fail_unless(g, all_hold(g, [in_range, *valid]), ids)


def corners_ordered(g: GraphBuilder, x1: str, y1: str, x2: str, y2: str) -> str:
    """x1 <= x2 and y1 <= y2, per box."""
    return g.one("And", [g.one("LessOrEqual", [x1, x2]), g.one("LessOrEqual", [y1, y2])])


def _layout(g: GraphBuilder, index: int) -> bool:
    return bool(g.scalar(index))


# --- AXIS_ALIGNED_BBOX_TRANSFORM ---------------------------------------------------------------
@lowers(OperationCode.AXIS_ALIGNED_BBOX_TRANSFORM)
def lower_bbox_transform(g: GraphBuilder, operation: Operation) -> None:
    """Boxes moved and scaled by per-class deltas, clipped to their image (the reference's
    ``transform_boxes``: the same float32 operations in the same order)."""
    boxes, deltas, batch_index, image_index = operation.inputs
    output = g.operand(operation.outputs[0])
    x1, y1, x2, y2 = _columns(g, real_values(g, boxes), 4)                    # [R, 1] each
    real_deltas = real_values(g, deltas)                                       # [R, classes * 4]
    dx, dy, dw, dh = (g.one("Slice", [real_deltas, i64(g, k), i64(g, 2 ** 62), i64(g, 1), i64(g, 4)])
                      for k in range(4))                                 # [R, classes] each
    image = real_values(g, image_index)                                        # [batches, 2]: height, width
    ids = _checked_batches(g, batch_index, run_time_dim(g, image, 0), [corners_ordered(g, x1, y1, x2, y2)])
    image_height, image_width = _columns(g, g.one("Gather", [image, ids], axis=0), 2)
    corners = decoded_boxes(g, (x1, y1, x2, y2), (dx, dy, dw, dh), image_width, image_height)
    stacked = g.one("Concat", [g.one("Unsqueeze", [corner, i64(g, 2)]) for corner in corners], axis=2)
    result = g.one("Flatten", [stacked], axis=1)                         # [R, classes * 4]
    g.set_output(operation.outputs[0], encode_real(g, result, output))


def decoded_boxes(g: GraphBuilder, box: tuple[str, str, str, str], delta: tuple[str, str, str, str],
                  image_width: str, image_height: str) -> list[str]:
    """The reference's ``transform_boxes`` (AXIS_ALIGNED_BBOX_TRANSFORM, GENERATE_PROPOSALS):
    boxes (x1, y1, x2, y2) moved by (dx, dy) of their size, scaled by exp(dw), exp(dh),
    clipped to [0, the image's width / height]; the same float32 operations in the same
    order. Returns the new x1, y1, x2, y2."""
    x1, y1, x2, y2 = box
    dx, dy, dw, dh = delta
    two, zero = f32(g, 2.0), f32(g, 0.0)
    width = g.one("Sub", [x2, x1])
    height = g.one("Sub", [y2, y1])
    center_x = g.one("Div", [g.one("Add", [x1, x2]), two])
    center_y = g.one("Div", [g.one("Add", [y1, y2]), two])
    new_width = g.one("Mul", [g.one("Exp", [dw]), width])
    new_height = g.one("Mul", [g.one("Exp", [dh]), height])
    new_x = g.one("Add", [center_x, g.one("Mul", [dx, width])])
    new_y = g.one("Add", [center_y, g.one("Mul", [dy, height])])
    half_w, half_h = g.one("Div", [new_width, two]), g.one("Div", [new_height, two])

    def clipped(name: str, limit: str) -> str:
        return g.one("Min", [g.one("Max", [name, zero]), limit])

    return [clipped(g.one("Sub", [new_x, half_w]), image_width), clipped(g.one("Sub", [new_y, half_h]), image_height),
            clipped(g.one("Add", [new_x, half_w]), image_width), clipped(g.one("Add", [new_y, half_h]), image_height)]


# --- regions of interest (ROI_ALIGN, ROI_POOLING) -----------------------------------------------
def _regions(g: GraphBuilder, operation: Operation, feature: str, nchw: bool) -> tuple[str, str]:
    """The regions of an ROI operation in feature-map coordinates (float32 [R, 4]: each
    real corner times 1 / ratio, as the reference's ``roi_corners``) and their batch
    indexes (int64 [R]), the run failing where the reference's does: a batch index out of
    range, a negative corner, a region past the map or with x1 > x2 or y1 > y2."""
    _, regions, batch_index, _, _, height_ratio, width_ratio = operation.inputs[:7]
    height_ratio, width_ratio = float(g.scalar(height_ratio)), float(g.scalar(width_ratio))
    if not (height_ratio > 0 and width_ratio > 0):
        raise Declined("the height and width ratios must be positive")
    real = real_values(g, regions)
    scales = np.float32(1) / np.array([width_ratio, height_ratio, width_ratio, height_ratio], np.float32)
    corners = g.one("Mul", [real, g.constant(scales.astype(np.float32), "ratios")])
    x1, y1, x2, y2 = _columns(g, corners, 4)
    height, width = (_float_size(g, feature, axis) for axis in ((2, 3) if nchw else (1, 2)))
    inside = [g.one("GreaterOrEqual", [real, f32(g, 0.0)]),
              g.one("LessOrEqual", [g.one("Concat", [x1, x2], axis=1), width]),
              g.one("LessOrEqual", [g.one("Concat", [y1, y2], axis=1), height])]
    ids = _checked_batches(g, batch_index, run_time_dim(g, feature, 0), [*inside, corners_ordered(g, x1, y1, x2, y2)])
    return corners, ids


def _feature_nchw(g: GraphBuilder, operation: Operation, nchw: bool) -> tuple[str, str]:
    """The feature map as NCHW in its internal encoding, and as float32 real values."""
    x = g.value(operation.inputs[0])
    if x.rank != 4:
        raise Declined("the feature map must have rank 4")
    stored = x.name if nchw else g.one("Transpose", [x.name], perm=NHWC_TO_NCHW)
    real = stored if x.kind == "float" else g.dequantize(type(x)(stored, x.kind, x.dims, x.scale, x.zero_point))
    return stored, real


def _roi_output(g: GraphBuilder, operation: Operation, nchw_result: str, nchw: bool) -> None:
    g.set_output(operation.outputs[0], nchw_result if nchw else g.one("Transpose", [nchw_result], perm=NCHW_TO_NHWC))


@lowers(OperationCode.ROI_ALIGN)
def lower_roi_align(g: GraphBuilder, operation: Operation) -> None:
    """ROI_ALIGN, always in the explicit form (_roi_align_taps: the reference's own float32
    sampling positions). ONNX's RoiAlign is not used: it places a bin's samples at
    start + (i + 0.5) * bin / count where the reference adds bin / count / 2 and i * bin /
    count, and the two round differently far from the origin: on a 512-row map, regions
    near row 500 had positions an ulp (3e-5) apart, outputs up to 1.7e-5 apart, past the
    CTS tolerance (found by ``nnapi fuzz --device nnapi-ort-cpu --seed 7``)."""
    out_h, out_w = int(g.scalar(operation.inputs[3])), int(g.scalar(operation.inputs[4]))
    ratio_h, ratio_w = int(g.scalar(operation.inputs[7])), int(g.scalar(operation.inputs[8]))
    if out_h <= 0 or out_w <= 0 or ratio_h < 0 or ratio_w < 0:
        raise Declined("output sizes must be positive and sampling ratios non-negative")
    _roi_align_taps(g, operation, _layout(g, operation.inputs[9]), out_h, out_w, ratio_h, ratio_w)


#: the most elements ROI_POOLING's windowed maximum gathers (regions x rows x bins x window x
#: channels) where the map's shape is known: past it the reference is the better device
_POOLING_ELEMENTS = 1 << 26


def _bins(g: GraphBuilder, start: str, stop: str, bins: int, size: str) -> tuple[str, str]:
    """[first, last) of each of ``bins`` bins of regions whose pixels run from ``start`` to
    ``stop`` ([R, 1] integers as float32), clipped to ``size``: the reference's ``_bins``,
    the same float32 operations."""
    extent = g.one("Max", [g.one("Add", [g.one("Sub", [stop, start]), f32(g, 1.0)]), f32(g, 1.0)])
    step = g.one("Div", [extent, f32(g, float(bins))])
    offsets = np.arange(bins, dtype=np.float32)[None, :]
    first = g.one("Floor", [g.one("Add", [g.one("Mul", [step, g.constant(offsets, "offsets")]), start])])
    last = g.one("Ceil", [g.one("Add", [g.one("Mul", [step, g.constant(offsets + 1, "offsets")]), start])])
    return g.one("Min", [first, size]), g.one("Min", [last, size])


def _in_bins(g: GraphBuilder, first: str, last: str, size: str) -> str:
    """[R, bins, size]: whether pixel p lies in [first, last) of each bin (``size``: an int64 [1])."""
    zero, one = (g.constant(np.array(v, np.int64)) for v in (0, 1))
    pixels = g.one("Cast", [g.one("Range", [zero, g.one("Squeeze", [size]), one])], to=TensorProto.FLOAT)
    first, last = (g.one("Unsqueeze", [name, i64(g, 2)]) for name in (first, last))
    return g.one("And", [g.one("GreaterOrEqual", [pixels, first]), g.one("Less", [pixels, last])])


@lowers(OperationCode.ROI_POOLING)
def lower_roi_pooling(g: GraphBuilder, operation: Operation) -> None:
    """ROI_POOLING as an explicit maximum over each bin. ONNX's MaxRoiPool has a single
    spatial scale and adds the region's start after flooring its bins (the reference floors
    start + offset in float32: they part where that sum rounds up to an integer), and ORT's
    kernel starts each maximum at the smallest positive float, so a bin of negative values
    gives 1.2e-38. Here each bin's rows and columns come from the reference's float32
    arithmetic; the maximum is taken over the columns in each bin, then over the rows
    (uint8 values compared as stored: the order of their real values), and an empty bin (a
    region on the map's far edge) gives zero (the zero point). Where the map's shape is
    known, each bin is read as a window of a fixed size bounding every bin's (positions
    past its end repeat its last pixel, as the reference's gather does); otherwise the
    whole map is masked per bin."""
    output = g.operand(operation.outputs[0])
    out_h, out_w = int(g.scalar(operation.inputs[3])), int(g.scalar(operation.inputs[4]))
    if out_h <= 0 or out_w <= 0:
        raise Declined("output sizes must be positive")
    nchw = _layout(g, operation.inputs[7])
    x = g.value(operation.inputs[0])
    if x.kind not in ("float", "uint8") or x.rank != 4:
        raise Declined(f"ROI_POOLING on {type_name(g.operand(operation.inputs[0]).type)} is not supported")
    if x.kind == "uint8" and (output.type not in QUANT8 or (output.scale, internal_zero_point(output))
                              != (x.scale, x.zero_point)):
        raise Declined("a quantized ROI_POOLING's output must keep the input's quantization")
    corners, ids = _regions(g, operation, x.name, nchw)
    pixels = g.one("Floor", [g.one("Add", [corners, f32(g, _HALF_BELOW)])])  # halves away: corners are >= 0
    x1, y1, x2, y2 = _columns(g, pixels, 4)
    height, width = (_float_size(g, x.name, axis) for axis in ((2, 3) if nchw else (1, 2)))
    first_h, last_h = _bins(g, y1, y2, out_h, height)
    first_w, last_w = _bins(g, x1, x2, out_w, width)
    if x.kind == "float":
        empty_value = f32(g, 0.0)
    else:
        empty_value = g.constant(np.array(x.zero_point, np.uint8))
    shape = (x.dims[2], x.dims[3], x.dims[1]) if nchw else tuple(x.dims[1:])
    if all(shape):
        pooled = _windowed_maximum(g, operation, x.name if not nchw else g.one("Transpose", [x.name],
                                                                                 perm=NCHW_TO_NHWC),
                                   shape, ids, (first_h, last_h), (first_w, last_w), out_h, out_w)
        channel_axis = 3
    else:
        pooled = _masked_maximum(g, x, nchw, ids, (first_h, last_h), (first_w, last_w))
        channel_axis = 1
    empty = g.one("Or", [g.one("Unsqueeze", [g.one("LessOrEqual", [last_h, first_h]), i64(g, 2)]),
                         g.one("Unsqueeze", [g.one("LessOrEqual", [last_w, first_w]), i64(g, 1)])])
    result = g.one("Where", [g.one("Unsqueeze", [empty, i64(g, channel_axis)]), empty_value, pooled])
    if channel_axis == 3:
        g.set_output(operation.outputs[0], g.one("Transpose", [result], perm=NHWC_TO_NCHW) if nchw else result)
    else:
        _roi_output(g, operation, result, nchw)


def _window(g: GraphBuilder, bounds: tuple[str, str], size: int, bins: int) -> tuple[str, int]:
    """Each bin's pixels as a window of ``span`` indexes (int64 [R, bins, span]): first + k,
    held at the bin's last pixel past its end (the maximum is unchanged), clipped to the
    map (an empty bin's, replaced later, too). A bin spans at most ceil(step) + 1 pixels
    (step <= (size + 1) / bins: regions are clipped to the map); two more cover float32's
    rounding."""
    first, last = bounds
    span = min(size, -(-(size + 1) // bins) + 2)
    offsets = g.constant(np.arange(span, dtype=np.float32)[None, None, :], "window")
    held = g.one("Min", [g.one("Add", [g.one("Unsqueeze", [first, i64(g, 2)]), offsets]),
                         g.one("Unsqueeze", [g.one("Sub", [last, f32(g, 1.0)]), i64(g, 2)])])
    clipped = g.one("Min", [g.one("Max", [held, f32(g, 0.0)]), f32(g, float(size - 1))])
    return g.one("Cast", [clipped], to=TensorProto.INT64), span


def _windowed_maximum(g: GraphBuilder, operation: Operation, nhwc: str, shape: tuple[int, int, int], ids: str,
                      rows: tuple[str, str], cols: tuple[str, str], out_h: int, out_w: int) -> str:
    """[R, oh, ow, C]: the maximum over each bin's window, columns first (a gather of
    [R, H, ow, span_w] pixels), then rows (a gather of [R, oh, span_h] rows of that)."""
    height, width, depth = shape
    col_index, span_w = _window(g, cols, width, out_w)
    row_index, span_h = _window(g, rows, height, out_h)
    rois = g.operand(operation.inputs[1]).dimensions
    elements = (rois[0] if rois and rois[0] else 1) * height * out_w * span_w * depth
    if elements > _POOLING_ELEMENTS:
        raise Declined(f"the windowed maximum would gather {elements} elements (more than {_POOLING_ELEMENTS})")
    table = g.one("Reshape", [nhwc, i64(g, -1, depth)])                                  # [B * H * W, C]
    base = g.one("Mul", [g.one("Unsqueeze", [ids, i64(g, 1, 2, 3)]),
                         g.constant(np.array(height * width, np.int64))])                 # [R, 1, 1, 1]
    lines = g.constant((np.arange(height, dtype=np.int64) * width)[None, :, None, None], "rows")
    index = g.one("Add", [g.one("Add", [base, lines]), g.one("Unsqueeze", [col_index, i64(g, 1)])])
    wide = g.one("Gather", [table, index], axis=0)                                        # [R, H, ow, span_w, C]
    by_columns = g.one("ReduceMax", [wide], axes=[3], keepdims=0)                         # [R, H, ow, C]
    stacked = g.one("Reshape", [by_columns, i64(g, -1, out_w, depth)])                  # [R * H, ow, C]
    regions = g.one("Range", [g.constant(np.array(0, np.int64)), g.one("Squeeze", [run_time_dim(g, ids, 0)]),
                              g.constant(np.array(1, np.int64))])
    first_row = g.one("Mul", [g.one("Unsqueeze", [regions, i64(g, 1, 2)]), g.constant(np.array(height, np.int64))])
    tall = g.one("Gather", [stacked, g.one("Add", [first_row, row_index])], axis=0)     # [R, oh, span_h, ow, C]
    return g.one("ReduceMax", [tall], axes=[2], keepdims=0)                               # [R, oh, ow, C]


def _masked_maximum(g: GraphBuilder, x: Value, nchw: bool, ids: str, rows: tuple[str, str], cols: tuple[str, str]
                    ) -> str:
    """[R, C, oh, ow]: the maximum over each bin, every pixel of the map outside it masked
    with the lowest value (the map's shape known only at run time)."""
    feature = x.name if nchw else g.one("Transpose", [x.name], perm=NHWC_TO_NCHW)
    low = np.array(-np.inf, np.float32) if x.kind == "float" else np.array(0, np.uint8)
    lowest = Value(g.constant(low), x.kind, [], const=low)

    def masked(mask: str, values: str) -> str:
        # the picked values' bits kept (a -0 maximum stays -0: exact_where)
        return exact_where(g, mask, Value(values, x.kind, []), lowest)

    regions = g.one("Gather", [feature, ids], axis=0)                                    # [R, C, H, W]
    in_columns = _in_bins(g, *cols, run_time_dim(g, feature, 3))                                 # [R, ow, W]
    columns = g.one("Unsqueeze", [in_columns, i64(g, 1, 2)])                              # [R, 1, 1, ow, W]
    wide = masked(columns, g.one("Unsqueeze", [regions, i64(g, 3)]))                      # [R, C, H, ow, W]
    by_columns = g.one("ReduceMax", [wide], axes=[4], keepdims=0)                          # [R, C, H, ow]
    in_rows = _in_bins(g, *rows, run_time_dim(g, feature, 2))                                    # [R, oh, H]
    row_mask = g.one("Unsqueeze", [in_rows, i64(g, 1, 4)])                                # [R, 1, oh, H, 1]
    tall = masked(row_mask, g.one("Unsqueeze", [by_columns, i64(g, 2)]))                  # [R, C, oh, H, ow]
    return g.one("ReduceMax", [tall], axes=[3], keepdims=0)                                # [R, C, oh, ow]


# --- HEATMAP_MAX_KEYPOINT --------------------------------------------------------------------
@lowers(OperationCode.HEATMAP_MAX_KEYPOINT)
def lower_heatmap_max_keypoint(g: GraphBuilder, operation: Operation) -> None:
    """The reference's sub-pixel maximum as an explicit graph: the first arg-max of each
    heatmap (ArgMax), its 3x3 neighbourhood with out-of-range rows and columns mirrored
    (GatherElements), the Taylor step's float32 arithmetic in the reference's order, and
    the keypoint mapped into its box."""
    heatmap, boxes, layout = operation.inputs
    score_out, keypoint_out = (g.operand(index) for index in operation.outputs)
    nchw = _layout(g, layout)
    source = g.value(heatmap)
    if source.rank != 4:
        raise Declined("the heatmaps must have rank 4")
    side_axes = (2, 3) if nchw else (1, 2)
    known = [source.dims[a] for a in side_axes]
    if all(known) and (known[0] != known[1] or known[0] < 2):
        raise Declined("the heatmaps must be square and at least 2x2")
    real = real_values(g, heatmap)
    maps = real if nchw else g.one("Transpose", [real], perm=NHWC_TO_NCHW)       # [N, K, S, S]
    size = run_time_dim(g, maps, 2)                                                      # int64 [1]
    square = g.one("Equal", [run_time_dim(g, maps, 3), size])
    large = g.one("GreaterOrEqual", [size, g.constant(np.array([2], np.int64))])
    leading = g.one("Shape", [maps], start=0, end=2)                              # [N, K]
    flat = g.one("Reshape", [maps, g.one("Concat", [leading, g.one("Mul", [size, size])], axis=0)])
    x1, y1, x2, y2 = (g.one("Unsqueeze", [column, i64(g, 2)]) for column in _columns(g, real_values(g, boxes), 4))

    def op(kind: str, *names: str) -> str:
        return g.one(kind, list(names))

    # Android's scan takes a value where -FLT_MAX (its start) < value: NaN and values up to
    # -FLT_MAX become -inf, never the first maximum unless all are (index 0, score -FLT_MAX)
    lowest = f32(g, float(-np.finfo(np.float32).max))
    minus_inf = np.array(-np.inf, np.float32)
    # a -0 peak stays -0 (exact_where: ORT's Where gives +0 for a -0 from its X input)
    candidates = exact_where(g, op("Greater", flat, lowest), Value(flat, "float", []),
                             Value(g.constant(minus_inf), "float", [], const=minus_inf))
    peak = g.one("ArgMax", [candidates], axis=2, keepdims=1, select_last_index=0)  # [N, K, 1], first maximum
    peak = fail_unless(g, all_hold(g, [square, large, corners_ordered(g, x1, y1, x2, y2)]), peak)
    peak_score = op("Max", g.one("GatherElements", [candidates, peak], axis=2), lowest)
    row, col = g.one("Div", [peak, size]), g.one("Mod", [peak, size])

    def mirrored(centre: str) -> str:
        """[N, K, 3]: centre - 1, centre, centre + 1, with -1 read as 1 and size as size - 2."""
        around = g.one("Add", [centre, g.constant(np.array([-1, 0, 1], np.int64))])
        below = g.one("Less", [around, g.constant(np.array(0, np.int64))])
        past = g.one("GreaterOrEqual", [around, size])
        inner = g.one("Where", [past, g.one("Sub", [size, g.constant(np.array(2, np.int64))]), around])
        return g.one("Where", [below, g.constant(np.array(1, np.int64)), inner])

    rows, cols = mirrored(row), mirrored(col)
    index = g.one("Add", [g.one("Mul", [g.one("Unsqueeze", [rows, i64(g, 3)]), size]),
                          g.one("Unsqueeze", [cols, i64(g, 2)])])                # [N, K, 3, 3]
    index = g.one("Reshape", [index, g.one("Concat", [leading, i64(g, 9)], axis=0)])
    grid = g.node("Split", [g.one("GatherElements", [flat, index], axis=2), i64(g, *([1] * 9))], 9, axis=2)

    def at(a: int, b: int) -> str:
        return grid[a * 3 + b]

    two, four, half, zero, one = f32(g, 2.0), f32(g, 4.0), f32(g, 0.5), f32(g, 0.0), f32(g, 1.0)
    limit = f32(g, 1.5)
    tolerance = f32(g, 1e-3 if g.operand(heatmap).type == T.TENSOR_FLOAT16 else 1e-5)
    center = at(1, 1)
    b0 = op("Neg", op("Div", op("Sub", at(1, 2), at(1, 0)), two))
    b1 = op("Neg", op("Div", op("Sub", at(2, 1), at(0, 1)), two))
    a00 = op("Add", op("Sub", at(1, 0), op("Mul", two, center)), at(1, 2))
    a01 = op("Div", op("Add", op("Sub", op("Sub", at(2, 2), at(2, 0)), at(0, 2)), at(0, 0)), four)
    a11 = op("Add", op("Sub", at(0, 1), op("Mul", two, center)), at(2, 1))
    cross = op("Mul", a00, a11)
    det = op("Sub", cross, op("Mul", a01, a01))
    # Android's comparisons as written (see the reference's _taylor_refine): NaN goes on
    solvable = op("Not", op("Less", op("Abs", det), op("Add", tolerance, op("Mul", tolerance, cross))))
    safe_det = op("Where", solvable, det, one)
    zero_value = Value(zero, "float", [], const=np.array(0.0, np.float32))

    def kept(condition: str, first: str, second: Value) -> str:
        # a -0 picked from ``first`` stays -0, as the reference's np.where keeps it (exact_where)
        return exact_where(g, condition, Value(first, "float", []), second)

    d0 = kept(solvable, op("Div", op("Sub", op("Mul", a11, b0), op("Mul", a01, b1)), safe_det), zero_value)
    d1 = kept(solvable, op("Div", op("Sub", op("Mul", a00, b1), op("Mul", a01, b0)), safe_det), zero_value)
    size0, size1 = op("Abs", d0), op("Abs", d1)
    largest = op("Where", op("Less", size0, size1), size1, size0)
    too_far = op("Or", op("Greater", size0, limit), op("Greater", size1, limit))
    shrink = op("Where", too_far, op("Div", limit, op("Where", too_far, largest, one)), one)
    d0, d1 = op("Mul", d0, shrink), op("Mul", d1, shrink)
    quadratic = op("Add", op("Mul", op("Add", op("Mul", a00, d0), op("Mul", a01, d1)), d0),
                   op("Mul", op("Add", op("Mul", a01, d0), op("Mul", a11, d1)), d1))
    refined = op("Add", op("Sub", op("Sub", center, op("Mul", b0, d0)), op("Mul", b1, d1)), op("Div", quadratic, two))
    score = kept(solvable, refined, Value(peak_score, "float", []))                # [N, K, 1]
    side = g.one("Cast", [size], to=TensorProto.FLOAT)

    def keypoint(pixel: str, delta: str, start: str, end: str) -> str:
        position = op("Add", op("Add", g.one("Cast", [pixel], to=TensorProto.FLOAT), delta), half)
        return op("Add", op("Mul", op("Div", position, side), op("Sub", end, start)), start)

    keypoints = g.one("Concat", [keypoint(col, d0, x1, x2), keypoint(row, d1, y1, y2)], axis=2)
    g.set_output(operation.outputs[0], encode_real(g, g.one("Squeeze", [score, i64(g, 2)]), score_out))
    g.set_output(operation.outputs[1], encode_real(g, keypoints, keypoint_out))


#: the quantum of the reference's integer bilinear weights (quantized ROI_ALIGN)
_WEIGHT_STEP = np.float32(1.0 / 255.0)
#: the most gathered elements (regions x bins x taps x channels, shapes known) ROI_ALIGN's
#: explicit form builds; past it the reference is the better device
_TAPS_ELEMENTS = 1 << 25


def _axis_taps(g: GraphBuilder, start: str, end: str, bins: int, ratio: int, samples: int, size: int
               ) -> tuple[str, str, str]:
    """One axis of the reference's ROI_ALIGN sampling (roi_align._axis_samples, the same
    float32 operations): for regions from ``start`` to ``end`` ([R, 1]), the two pixel
    indexes (int64 [R, bins, samples, 2]) and bilinear weights (float32, zero for the
    samples past a region's own count) of each of ``samples`` samples per bin (``ratio``
    of them, or ceil(bin size) where ``ratio`` is 0), and that count (float32 [R, 1])."""
    one = f32(g, 1.0)
    step = g.one("Div", [g.one("Max", [g.one("Sub", [end, start]), one]), f32(g, float(bins))])
    # [R, 1]: ceil(bin size), or the ratio itself
    count = g.one("Ceil", [step]) if ratio == 0 else g.one("Expand", [f32(g, float(ratio)), g.one("Shape", [step])])
    sub = g.one("Div", [step, count])
    bin_start = g.one("Add", [g.one("Mul", [step, g.constant(np.arange(bins, dtype=np.float32)[None, :], "bins")]),
                              start])                                    # [R, bins]
    offsets = g.constant(np.arange(samples, dtype=np.float32)[None, None, :], "samples")
    position = g.one("Add", [g.one("Add", [g.one("Unsqueeze", [bin_start, i64(g, 2)]),
                                           g.one("Unsqueeze", [g.one("Div", [sub, f32(g, 2.0)]), i64(g, 2)])]),
                             g.one("Mul", [g.one("Unsqueeze", [sub, i64(g, 2)]), offsets])])  # [R, bins, samples]
    low = g.one("Floor", [position])
    frac = g.one("Sub", [position, low])
    last = f32(g, float(size - 1))
    at_edge = g.one("GreaterOrEqual", [low, last])
    low = g.one("Where", [at_edge, last, low])
    high = g.one("Where", [at_edge, last, g.one("Add", [low, one])])
    frac = g.one("Where", [at_edge, f32(g, 0.0), frac])
    taken = g.one("Cast", [g.one("Less", [offsets, g.one("Unsqueeze", [count, i64(g, 2)])])], to=TensorProto.FLOAT)
    weights = g.one("Concat", [g.one("Unsqueeze", [g.one("Mul", [g.one("Sub", [one, frac]), taken]), i64(g, 3)]),
                               g.one("Unsqueeze", [g.one("Mul", [frac, taken]), i64(g, 3)])], axis=3)
    indexes = g.one("Cast", [g.one("Concat", [g.one("Unsqueeze", [low, i64(g, 3)]),
                                              g.one("Unsqueeze", [high, i64(g, 3)])], axis=3)],
                    to=TensorProto.INT64)
    return indexes, weights, count


def _roi_align_taps(g: GraphBuilder, operation: Operation, nchw: bool, out_h: int, out_w: int,
                    ratio_h: int, ratio_w: int) -> None:
    """ROI_ALIGN as the reference computes it: every bilinear tap of every output pixel
    gathered with its weight (samples per bin bounded by the map's size where adaptive,
    the extra ones weighing zero), then one dot product per pixel. Floats: the float32
    weighted sum over the sample count. Quantized (Android's integer pipeline): the weights
    in 1/255 steps (rounded halves away), the integer sums exact (MatMulInteger), the
    fixed-point rescale of quant_math (its multiplier and shift for each possible sample
    count, chosen per region) in int64 arithmetic, the zero point added and saturated."""
    x = g.value(operation.inputs[0])
    output = g.operand(operation.outputs[0])
    if x.rank != 4 or not all(x.dims[1:]):
        raise Declined("ROI_ALIGN's explicit form needs the feature map's shape")
    height, width = (x.dims[2], x.dims[3]) if nchw else (x.dims[1], x.dims[2])
    depth = x.dims[1] if nchw else x.dims[3]
    samples_h = ratio_h or -(-max(height, 1) // out_h)
    samples_w = ratio_w or -(-max(width, 1) // out_w)
    taps = 4 * samples_h * samples_w
    rois = g.operand(operation.inputs[1]).dimensions
    elements = (rois[0] if rois and rois[0] else 1) * out_h * out_w * taps * depth
    if elements > _TAPS_ELEMENTS:
        raise Declined(f"ROI_ALIGN's explicit form would gather {elements} elements (more than {_TAPS_ELEMENTS})")
    corners, ids = _regions(g, operation, x.name, nchw)
    x1, y1, x2, y2 = _columns(g, corners, 4)
    rows, row_weights, count_h = _axis_taps(g, y1, y2, out_h, ratio_h, samples_h, height)
    cols, col_weights, count_w = _axis_taps(g, x1, x2, out_w, ratio_w, samples_w, width)

    def spread(name: str, axes_rows: bool) -> str:
        # rows [R, oh, S, 2] -> [R, oh, 1, S, 2, 1, 1]; columns [R, ow, S, 2] -> [R, 1, ow, 1, 1, S, 2]
        return g.one("Unsqueeze", [name, i64(g, 2, 5, 6) if axes_rows else i64(g, 1, 3, 4)])

    regions = run_time_dim(g, ids, 0)
    flat_shape = g.one("Concat", [regions, i64(g, out_h, out_w, taps)], axis=0)
    base = g.one("Unsqueeze", [g.one("Mul", [ids, g.constant(np.array(height * width, np.int64))]),
                               i64(g, 1, 2, 3, 4, 5, 6)])
    index = g.one("Add", [g.one("Add", [base, g.one("Mul", [spread(rows, True),
                                                            g.constant(np.array(width, np.int64))])]),
                          spread(cols, False)])
    index = g.one("Reshape", [index, flat_shape])                                    # [R, oh, ow, T]
    weights = g.one("Mul", [spread(row_weights, True), spread(col_weights, False)])
    weights = g.one("Reshape", [weights, g.one("Concat", [regions, i64(g, out_h, out_w, 1, taps)], axis=0)])
    nhwc = x.name if not nchw else g.one("Transpose", [x.name], perm=NCHW_TO_NHWC)
    table = g.one("Reshape", [nhwc, i64(g, -1, depth)])                            # [B * H * W, C]
    values = g.one("Gather", [table, index], axis=0)                                 # [R, oh, ow, T, C]
    samples = g.one("Mul", [count_h, count_w])                                       # [R, 1], float32
    by_region = i64(g, 2, 3)
    if output.type in FLOATS:
        summed = g.one("Squeeze", [g.one("MatMul", [weights, values]), i64(g, 3)])  # [R, oh, ow, C]
        result = g.one("Div", [summed, g.one("Unsqueeze", [samples, by_region])])
    else:
        result = _integer_roi_align(g, x, output, weights, values, samples, samples_h * samples_w)
    g.set_output(operation.outputs[0], g.one("Transpose", [result], perm=NHWC_TO_NCHW) if nchw else result)


def _integer_roi_align(g: GraphBuilder, x: Value, output: Operand, weights: str, values: str, samples: str,
                       most: int) -> str:
    """The quantized pixels [R, oh, ow, C] (internal encoding) of roi_align's ``_quantized``."""
    integer_weights = g.one("Floor", [g.one("Add", [g.one("Div", [weights, f32(g, float(_WEIGHT_STEP))]),
                                                    f32(g, _HALF_BELOW)])])          # weights are >= 0
    # sum(w * (q - zero point)) exactly in int32 (|sum| <= taps * 255 * 255), the weights
    # (0..255) and the stored values as they are
    sums = g.one("MatMulInteger", [g.one("Cast", [integer_weights], to=TensorProto.UINT8), values,
                                   g.constant(np.array(0, np.uint8)), g.constant(np.array(x.zero_point, np.uint8))])
    sums = g.one("Cast", [g.one("Squeeze", [sums, i64(g, 3)])], to=TensorProto.INT64)
    multipliers, lefts, rights = [], [], []
    for count in range(1, most + 1):
        real = np.float32(x.scale) * _WEIGHT_STEP / np.float32(output.scale) / np.float32(count)
        multiplier, shift = quantize_multiplier(float(real))
        multipliers.append(multiplier)
        lefts.append(1 << max(shift, 0))
        rights.append(1 << max(-shift, 0))
    which = g.one("Sub", [g.one("Unsqueeze", [g.one("Cast", [samples], to=TensorProto.INT64), i64(g, 2, 3)]),
                          g.constant(np.array(1, np.int64))])                          # [R, 1, 1, 1]

    def per_region(table: list[int]) -> str:
        return g.one("Gather", [g.constant(np.array(table, np.int64)), which], axis=0)

    # QuantizeMultiplier's mantissas are positive: no saturating product of two INT32_MIN
    rounded = multiply_by_quantized_multiplier(g, sums, per_region(multipliers), per_region(lefts),
                                               per_region(rights), saturating=False)
    stored = g.one("Add", [rounded, g.constant(np.array(internal_zero_point(output), np.int64))])
    clamped = g.one("Min", [g.one("Max", [stored, g.constant(np.array(0, np.int64))]),
                            g.constant(np.array(255, np.int64))])
    return g.one("Cast", [clamped], to=TensorProto.UINT8)
