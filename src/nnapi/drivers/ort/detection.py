"""Lowerings of the detection operations that ONNX expresses exactly: AXIS_ALIGNED_BBOX_TRANSFORM
and HEATMAP_MAX_KEYPOINT as explicit element-wise graphs, ROI_ALIGN (float) as ONNX's RoiAlign
and ROI_POOLING as an explicit masked maximum.

The reference (``nnapi.operations``) computes every detection operation in float32 on the
real values (quantized inputs dequantized, TENSOR_QUANT16_ASYMM boxes times 0.125) and
quantizes a result once, round(x / scale + zero point) with halves away from zero; the
graphs here do the same float32 operations in the same order, so float results agree to
the last bit where ONNX Runtime's kernels round as numpy does (Exp may differ by an ulp) and
quantized ones by the same rounding rule.

A region or box the reference refuses at execution (a batch index out of range, a negative
coordinate, a region outside the feature map, x1 > x2) fails the run here too
(``fail_unless``), rather than ONNX clamping or wrapping it.

What stays declined, and why:
- quantized ROI_ALIGN: the reference follows Android's integer pipeline (bilinear weights
  quantized to 1/255 steps, integer sums, a fixed-point rescale), which dequantize ->
  RoiAlign -> quantize does not reproduce;
- ROI_ALIGN with different height and width sampling ratios (ONNX's RoiAlign has one);
- BOX_WITH_NMS_LIMIT, GENERATE_PROPOSALS, DETECTION_POSTPROCESSING: no ONNX lowering (their
  greedy selections, soft-NMS rescoring and tie order are not ONNX's NonMaxSuppression).

The device module imports this one, which registers these lowerings with ``lowering``.
"""

from __future__ import annotations

import numpy as np
from onnx import TensorProto

from nnapi.codes import OperationCode
from nnapi.drivers.ort.lowering import (
    FLOATS,
    NCHW_TO_NHWC,
    NHWC_TO_NCHW,
    QUANT8,
    Declined,
    GraphBuilder,
    T,
    _name,
    fail_unless,
    internal_zero_point,
    lowers,
)
from nnapi.hal import Operand, Operation
from nnapi.operations._detection_common import BOX_SCALE, BOX_ZERO_POINT

#: the quantized types' stored ranges
_RANGES = {T.TENSOR_QUANT8_ASYMM: (0, 255), T.TENSOR_QUANT8_ASYMM_SIGNED: (-128, 127),
           T.TENSOR_QUANT16_ASYMM: (0, 65535)}


# --- values --------------------------------------------------------------------------------
def _f32(g: GraphBuilder, value: float) -> str:
    return g.constant(np.array(value, np.float32))


def _i64(g: GraphBuilder, *values: int) -> str:
    return g.constant(np.array(values, np.int64))


def _real(g: GraphBuilder, index: int) -> str:
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
        return g.one("Mul", [g.one("Cast", [value.name], to=TensorProto.FLOAT), _f32(g, BOX_SCALE)])
    raise Declined(f"operand {index} of type {_name(operand.type)} is not supported here")


def _store(g: GraphBuilder, name: str, operand: Operand) -> str:
    """Float32 results ``name`` in ``operand``'s internal encoding, as the reference's
    ``from_float32``: floats as they are (float16 rounds at the graph's edge), quantized
    values round(x / scale + zero point) in float32 with halves away from zero, then
    saturated (int8 travels as uint8 + 128, added after the rounding: exact)."""
    if operand.type in FLOATS:
        return name
    if operand.type not in _RANGES:
        raise Declined(f"results of type {_name(operand.type)} are not supported")
    low, high = _RANGES[operand.type]
    scaled = g.one("Add", [g.one("Div", [name, _f32(g, operand.scale)]), _f32(g, operand.zero_point)])
    magnitude = g.one("Floor", [g.one("Add", [g.one("Abs", [scaled]), _f32(g, 0.5)])])
    rounded = g.one("Mul", [magnitude, g.one("Sign", [scaled])])
    clamped = g.one("Clip", [rounded, _f32(g, low), _f32(g, high)])
    if operand.type == T.TENSOR_QUANT16_ASYMM:
        return g.one("Cast", [clamped], to=TensorProto.UINT16)
    shift = internal_zero_point(operand) - operand.zero_point
    if shift:
        clamped = g.one("Add", [clamped, _f32(g, shift)])
    return g.one("Cast", [clamped], to=TensorProto.UINT8)


def _all(g: GraphBuilder, condition: str) -> str:
    """A scalar bool: every element of the bool tensor ``condition`` holds (an empty one: true)."""
    failures = g.one("ReduceSum", [g.one("Cast", [g.one("Not", [condition])], to=TensorProto.INT64)], keepdims=0)
    return g.one("Equal", [failures, g.constant(np.array(0, np.int64))])


def _and(g: GraphBuilder, *conditions: str) -> str:
    result = conditions[0]
    for condition in conditions[1:]:
        result = g.one("And", [result, condition])
    return result


def _columns(g: GraphBuilder, name: str, count: int) -> list[str]:
    """The ``count`` columns of a [rows, count] value, each [rows, 1]."""
    return g.node("Split", [name, _i64(g, *([1] * count))], count, axis=1)


def _size(g: GraphBuilder, name: str, axis: int) -> str:
    """Dimension ``axis`` of ``name`` at run time, as an int64 [1]."""
    return g.one("Shape", [name], start=axis, end=axis + 1)


def _float_size(g: GraphBuilder, name: str, axis: int) -> str:
    return g.one("Cast", [_size(g, name, axis)], to=TensorProto.FLOAT)


def _checked_batches(g: GraphBuilder, index: int, batches: str, valid: list[str]) -> str:
    """Batch index operand ``index`` as int64, the run failing unless each is in [0,
    ``batches``) (an int64 [1]) and every condition in ``valid`` holds."""
    value = g.value(index)
    if value.kind != "int32":
        raise Declined("batch indexes must be TENSOR_INT32")
    ids = g.one("Cast", [value.name], to=TensorProto.INT64)
    in_range = g.one("And", [g.one("GreaterOrEqual", [ids, g.constant(np.array(0, np.int64))]),
                             g.one("Less", [ids, batches])])
    return fail_unless(g, _and(g, *[_all(g, c) for c in [in_range, *valid]]), ids)


def _ordered(g: GraphBuilder, x1: str, y1: str, x2: str, y2: str) -> str:
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
    x1, y1, x2, y2 = _columns(g, _real(g, boxes), 4)                    # [R, 1] each
    real_deltas = _real(g, deltas)                                       # [R, classes * 4]
    dx, dy, dw, dh = (g.one("Slice", [real_deltas, _i64(g, k), _i64(g, 2 ** 62), _i64(g, 1), _i64(g, 4)])
                      for k in range(4))                                 # [R, classes] each
    image = _real(g, image_index)                                        # [batches, 2]: height, width
    ids = _checked_batches(g, batch_index, _size(g, image, 0), [_ordered(g, x1, y1, x2, y2)])
    image_height, image_width = _columns(g, g.one("Gather", [image, ids], axis=0), 2)
    two, zero = _f32(g, 2.0), _f32(g, 0.0)
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
        return g.one("Unsqueeze", [g.one("Min", [g.one("Max", [name, zero]), limit]), _i64(g, 2)])

    stacked = g.one("Concat", [clipped(g.one("Sub", [new_x, half_w]), image_width),
                               clipped(g.one("Sub", [new_y, half_h]), image_height),
                               clipped(g.one("Add", [new_x, half_w]), image_width),
                               clipped(g.one("Add", [new_y, half_h]), image_height)], axis=2)
    result = g.one("Flatten", [stacked], axis=1)                         # [R, classes * 4]
    g.set_output(operation.outputs[0], _store(g, result, output))


# --- regions of interest (ROI_ALIGN, ROI_POOLING) -----------------------------------------------
def _regions(g: GraphBuilder, operation: Operation, feature_nchw: str) -> tuple[str, str]:
    """The regions of an ROI operation in feature-map coordinates (float32 [R, 4]: each
    real corner times 1 / ratio, as the reference's ``roi_corners``) and their batch
    indexes (int64 [R]), the run failing where the reference's does: a batch index out of
    range, a negative corner, a region past the map or with x1 > x2 or y1 > y2."""
    _, regions, batch_index, _, _, height_ratio, width_ratio = operation.inputs[:7]
    height_ratio, width_ratio = float(g.scalar(height_ratio)), float(g.scalar(width_ratio))
    if not (height_ratio > 0 and width_ratio > 0):
        raise Declined("the height and width ratios must be positive")
    real = _real(g, regions)
    scales = np.float32(1) / np.array([width_ratio, height_ratio, width_ratio, height_ratio], np.float32)
    corners = g.one("Mul", [real, g.constant(scales.astype(np.float32), "ratios")])
    x1, y1, x2, y2 = _columns(g, corners, 4)
    height, width = _float_size(g, feature_nchw, 2), _float_size(g, feature_nchw, 3)
    inside = [g.one("GreaterOrEqual", [real, _f32(g, 0.0)]),
              g.one("LessOrEqual", [g.one("Concat", [x1, x2], axis=1), width]),
              g.one("LessOrEqual", [g.one("Concat", [y1, y2], axis=1), height])]
    ids = _checked_batches(g, batch_index, _size(g, feature_nchw, 0), [*inside, _ordered(g, x1, y1, x2, y2)])
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
    """Float ROI_ALIGN as ONNX's RoiAlign (average, ``output_half_pixel``: corners as given,
    regions at least one pixel, ``sampling_ratio`` 0 adaptive as ceil(bin size)) on the
    regions pre-scaled by the separate height and width ratios (spatial scale 1). ONNX
    gives no weight to a sample past the map's far edge, where the reference reads the
    last row / column: a region narrower than a pixel at that edge puts samples up to a
    pixel past it, so the map is extended by two copies of its last row and column
    (edge padding), on which ONNX's interpolation gives those same values."""
    output = g.operand(operation.outputs[0])
    if output.type not in FLOATS:
        raise Declined("quantized ROI_ALIGN follows Android's integer pipeline (bilinear weights in 1/255 "
                       "steps, a fixed-point rescale), which dequantize -> RoiAlign -> quantize does not "
                       "reproduce")
    out_h, out_w = int(g.scalar(operation.inputs[3])), int(g.scalar(operation.inputs[4]))
    ratio_h, ratio_w = int(g.scalar(operation.inputs[7])), int(g.scalar(operation.inputs[8]))
    if out_h <= 0 or out_w <= 0 or ratio_h < 0 or ratio_w < 0:
        raise Declined("output sizes must be positive and sampling ratios non-negative")
    if ratio_h != ratio_w:
        raise Declined(f"ONNX's RoiAlign has one sampling ratio; the height's ({ratio_h}) and width's "
                       f"({ratio_w}) differ")
    nchw = _layout(g, operation.inputs[9])
    _, feature = _feature_nchw(g, operation, nchw)
    corners, ids = _regions(g, operation, feature)
    padded = g.one("Pad", [feature, _i64(g, 0, 0, 0, 0, 0, 0, 2, 2)], mode="edge")
    result = g.one("RoiAlign", [padded, corners, ids], mode="avg", output_height=out_h, output_width=out_w,
                   sampling_ratio=ratio_h, spatial_scale=1.0, coordinate_transformation_mode="output_half_pixel")
    _roi_output(g, operation, result, nchw)


#: the largest intermediate (regions x channels x rows x bins x columns) ROI_POOLING's masked
#: maximum builds, where the shapes are known: past it (a detector's 300 regions over a
#: 38 x 38 x 512 map) the reference's windowed gather is the better device
_POOLING_ELEMENTS = 1 << 26


def _bins(g: GraphBuilder, start: str, stop: str, bins: int, size: str) -> tuple[str, str]:
    """[first, last) of each of ``bins`` bins of regions whose pixels run from ``start`` to
    ``stop`` ([R, 1] integers as float32), clipped to ``size``: the reference's ``_bins``,
    the same float32 operations."""
    extent = g.one("Max", [g.one("Add", [g.one("Sub", [stop, start]), _f32(g, 1.0)]), _f32(g, 1.0)])
    step = g.one("Div", [extent, _f32(g, float(bins))])
    offsets = np.arange(bins, dtype=np.float32)[None, :]
    first = g.one("Floor", [g.one("Add", [g.one("Mul", [step, g.constant(offsets, "offsets")]), start])])
    last = g.one("Ceil", [g.one("Add", [g.one("Mul", [step, g.constant(offsets + 1, "offsets")]), start])])
    return g.one("Min", [first, size]), g.one("Min", [last, size])


def _in_bins(g: GraphBuilder, first: str, last: str, size: str) -> str:
    """[R, bins, size]: whether pixel p lies in [first, last) of each bin (``size``: an int64 [1])."""
    zero, one = (g.constant(np.array(v, np.int64)) for v in (0, 1))
    pixels = g.one("Cast", [g.one("Range", [zero, g.one("Squeeze", [size]), one])], to=TensorProto.FLOAT)
    first, last = (g.one("Unsqueeze", [name, _i64(g, 2)]) for name in (first, last))
    return g.one("And", [g.one("GreaterOrEqual", [pixels, first]), g.one("Less", [pixels, last])])


@lowers(OperationCode.ROI_POOLING)
def lower_roi_pooling(g: GraphBuilder, operation: Operation) -> None:
    """ROI_POOLING as an explicit masked maximum. ONNX's MaxRoiPool has a single spatial
    scale and adds the region's start after flooring its bins (the reference floors
    start + offset in float32: they part where that sum rounds up to an integer), and ORT's
    kernel starts each maximum at the smallest positive float, so a bin of negative values
    gives 1.2e-38. Here each bin's rows and columns come from the reference's float32
    arithmetic, the maximum is taken over the columns in each bin, then over the rows, the
    others masked with the lowest value (uint8 values compared as stored: the order of
    their real values), and an empty bin (a region on the map's far edge) gives zero (the
    zero point)."""
    output = g.operand(operation.outputs[0])
    out_h, out_w = int(g.scalar(operation.inputs[3])), int(g.scalar(operation.inputs[4]))
    if out_h <= 0 or out_w <= 0:
        raise Declined("output sizes must be positive")
    nchw = _layout(g, operation.inputs[7])
    x = g.value(operation.inputs[0])
    if x.kind not in ("float", "uint8"):
        raise Declined(f"ROI_POOLING on {_name(g.operand(operation.inputs[0]).type)} is not supported")
    if x.kind == "uint8" and (output.type not in QUANT8 or (output.scale, internal_zero_point(output))
                              != (x.scale, x.zero_point)):
        raise Declined("a quantized ROI_POOLING's output must keep the input's quantization")
    rois = g.operand(operation.inputs[1]).dimensions
    if rois and all(x.dims) and rois[0]:
        elements = rois[0] * x.dims[1] * x.dims[2] * x.dims[3] * max(out_h, out_w)
        if elements > _POOLING_ELEMENTS:
            raise Declined(f"the masked maximum would take {elements} elements (more than {_POOLING_ELEMENTS})")
    feature, _ = _feature_nchw(g, operation, nchw)
    corners, ids = _regions(g, operation, feature)
    pixels = g.one("Floor", [g.one("Add", [corners, _f32(g, 0.5)])])  # halves away: corners are >= 0
    x1, y1, x2, y2 = _columns(g, pixels, 4)
    height, width = _float_size(g, feature, 2), _float_size(g, feature, 3)
    first_h, last_h = _bins(g, y1, y2, out_h, height)
    first_w, last_w = _bins(g, x1, x2, out_w, width)
    if x.kind == "float":
        lowest, empty_value = _f32(g, -np.inf), _f32(g, 0.0)
    else:
        lowest = g.constant(np.array(0, np.uint8))
        empty_value = g.constant(np.array(x.zero_point, np.uint8))
    regions = g.one("Gather", [feature, ids], axis=0)                                    # [R, C, H, W]
    in_columns = _in_bins(g, first_w, last_w, _size(g, feature, 3))                     # [R, ow, W]
    columns = g.one("Unsqueeze", [in_columns, _i64(g, 1, 2)])                              # [R, 1, 1, ow, W]
    wide = g.one("Where", [columns, g.one("Unsqueeze", [regions, _i64(g, 3)]), lowest])   # [R, C, H, ow, W]
    by_columns = g.one("ReduceMax", [wide], axes=[4], keepdims=0)                          # [R, C, H, ow]
    in_rows = _in_bins(g, first_h, last_h, _size(g, feature, 2))                          # [R, oh, H]
    rows = g.one("Unsqueeze", [in_rows, _i64(g, 1, 4)])                                    # [R, 1, oh, H, 1]
    tall = g.one("Where", [rows, g.one("Unsqueeze", [by_columns, _i64(g, 2)]), lowest])    # [R, C, oh, H, ow]
    pooled = g.one("ReduceMax", [tall], axes=[3], keepdims=0)                              # [R, C, oh, ow]
    empty = g.one("Or", [g.one("Unsqueeze", [g.one("LessOrEqual", [last_h, first_h]), _i64(g, 2)]),
                         g.one("Unsqueeze", [g.one("LessOrEqual", [last_w, first_w]), _i64(g, 1)])])
    result = g.one("Where", [g.one("Unsqueeze", [empty, _i64(g, 1)]), empty_value, pooled])
    _roi_output(g, operation, result, nchw)
