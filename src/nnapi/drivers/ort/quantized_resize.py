"""A quantized RESIZE_BILINEAR that rounds its blend to nearest, as the TFLite importer
writes it (LiteRT rounds; NNAPI's quantized kernel truncates), recognised as a chain and
lowered to ONNX Runtime as one float Resize of the stored integers and one QuantizeLinear.

The importer's chains (importers/tflite/spatial.py, ``_resize``):

- uint8: CAST (the stored integers to float32), RESIZE_BILINEAR in float32, ADD
  half_below(0.5), CAST to uint8: trunc(B + 0.5 - 2**-25) = floor(B + 1/2) of the blend B
  of the stored integers (B >= 0).
- int8 (any 8-bit type, input and output of one scale and zero point): DEQUANTIZE,
  RESIZE_BILINEAR in float32, QUANTIZE: zp + round(blend of the reals / scale), halves away
  from zero, which is zp + round(B - zp) with B the blend of the stored integers, up to the
  float32 roundings of the reals' blend.

Lowered operation by operation, the blend came out at full size in float32 and the
rounding took five to seven passes over it (QUANTIZE's halves away from zero: Div, Abs,
Add, Floor, Sign, Mul, QuantizeLinear; the uint8 CAST's saturation: Clip, IsNaN, Where),
around a Resize in NCHW between two Transposes: deeplab_like_int8's 32x32 -> 256x256x21
head took ~7 ms of node time where its truncating Cast / Resize / Cast had taken ~0.75.

Here: DequantizeLinear of scale 1 and zero point c on the small input (the stored
integers minus c, exact), the Resize in NHWC (deeplab_like_int8 2.57 ms, seg_up_int8 1.28,
against 2.71 and 1.48 in NCHW between two Transposes; one channel excepted, below), and
QuantizeLinear with scale 1 - 2**-22 and zero point c, where c is the value rounding goes
away from (0 for the uint8 chain, whose blend is never negative; the zero point for a
requantizing one). QuantizeLinear divides (IEEE, correctly rounded) and rounds halves to
even; dividing by 1 - 2**-22 moves every value y by |y| * 2**-22 (plus a rounding) away from
zero. Where the taps are exact binary fractions (multiples of 2**-6: power-of-two scales,
deeplab's 8x head; ``exact_taps``) and a probe shows ORT's Resize using the reference's
taps (``resize_matches_taps``), the blend y of the integers is exact and a multiple of
2**-12 of magnitude at most 255: a half n + 1/2 then moves by |y| * 2**-22 >= 2 ulp(y) and
rounds away from zero, and every other value, at least 2**-12 from a half, moves less than
2**-14 + 2**-17 and keeps its nearest integer. So the result is exactly round-half-away(y)
+ c: the uint8 chain's value bit for bit, a requantizing chain's everywhere the blend is
not exactly a half (there the reference's float32 roundings of the real values, at most
~1.1e-4 of a step, decide: they round ~70-85% of the halves away, within a step either
way). A one-off probe checks that this runtime's QuantizeLinear rounds the multiples of
2**-12 in [-256, 256] so (``_quantize_rounds_halves_away``); without it, where the tap probe
refuses exact taps (ORT derives a 7 -> 2 width's from 2/7), for an NCHW operand or a size
known only at run time, each operation lowers on its own. Other taps (13 -> 40) blend in
float32 as the operation-by-operation Resize does, within float32's rounding of the
reference's blend.
"""

from __future__ import annotations

import functools

import numpy as np
from onnx import TensorProto, helper

from nnapi.codes import FuseCode, OperandCode, OperationCode
from nnapi.drivers.ort.builder import QUANT8, GraphBuilder, Value, internal_zero_point, lowers, probe_outputs
from nnapi.drivers.ort.resize import exact_taps, lower_resize_bilinear, resize_matches_taps, resize_mode
from nnapi.hal import Operation
from nnapi.operations.quant_math import HALF_BELOW_FLOAT32
from nnapi.operations.resize import weighted_taps

T = OperandCode
Op = OperationCode

#: QuantizeLinear's scale that makes its halves-to-even round halves away from zero on the
#: exact blends of 8-bit integers (see the module's docstring)
ROUNDING_SCALE = np.float32(1 - 2.0 ** -22)


@functools.lru_cache(maxsize=1)
def _quantize_rounds_halves_away() -> bool:
    """Whether this ONNX Runtime's QuantizeLinear of scale ``ROUNDING_SCALE`` rounds every
    multiple of 2**-12 in [-256, 256] to its nearest integer, halves away from zero, as the
    module's docstring argues: a one-off run on every half n + 1/2 and its two neighbours
    n + 1/2 -+ 2**-12. Dividing by a positive scale and rounding are both monotonic, so the
    multiples between two such neighbours (n - 1/2 + 2**-12 ... n + 1/2 - 2**-12) then all
    give n too."""
    halves = np.arange(-256, 256, dtype=np.float64) + 0.5
    neighbours = (halves[:, None] + np.array([-2.0 ** -12, 0, 2.0 ** -12])).reshape(-1)
    # and three integers, so that the count is no multiple of a vector's width: the tail too
    values = np.concatenate([neighbours, [-1.0, 0.0, 1.0]]).astype(np.float32)  # exact
    expected = np.copysign(np.floor(np.abs(values.astype(np.float64)) + 0.5), values)
    scale = helper.make_tensor("scale", TensorProto.FLOAT, [], [float(ROUNDING_SCALE)])
    nodes, outputs, initializers = [], [], [scale]
    for zero_point in (0, 255):  # the non-negative values, then the non-positive ones
        initializers.append(helper.make_tensor(f"zp{zero_point}", TensorProto.UINT8, [], [zero_point]))
        nodes.append(helper.make_node("QuantizeLinear", ["x", "scale", f"zp{zero_point}"], [f"y{zero_point}"]))
        outputs.append(helper.make_tensor_value_info(f"y{zero_point}", TensorProto.UINT8, [len(values)]))
    graph = helper.make_graph(nodes, "rounding_probe", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                                      [len(values)])],
                              outputs, initializers)
    try:
        results = probe_outputs(graph, {"x": values})
    except ImportError:  # lowering without a runtime: each operation on its own
        return False
    if results is None:
        return False
    up, down = (np.asarray(r, np.float64) for r in results)
    return bool(np.array_equal(up[values >= 0], np.minimum(expected[values >= 0], 255))
                and np.array_equal(down[values <= 0], np.maximum(expected[values <= 0] + 255, 0)))


def _only_reader(g: GraphBuilder, index: int, code: OperationCode) -> Operation | None:
    """The one operation reading ``index``, where it is a ``code`` reading it once and
    ``index`` is no graph output; else None."""
    readers = g.readers(index)
    if len(readers) != 1 or readers[0].type != code or index in g.subgraph.output_indexes:
        return None
    return readers[0] if list(readers[0].inputs).count(index) == 1 else None


def _uint8_chain(g: GraphBuilder, resize: Operation) -> tuple[Value, int, list[Operation]] | None:
    """(the stored uint8 value, 0, [ADD, CAST]) where ``resize`` is the importer's uint8
    chain: CAST from TENSOR_QUANT8_ASYMM, this RESIZE_BILINEAR, ADD of half_below(0.5)
    without activation, CAST to TENSOR_QUANT8_ASYMM."""
    cast = g.producer(resize.inputs[0])
    if cast is None or cast.type != Op.CAST or g.operand(cast.inputs[0]).type != T.TENSOR_QUANT8_ASYMM \
            or len(g.readers(resize.inputs[0])) != 1:
        return None
    add = _only_reader(g, resize.outputs[0], Op.ADD)
    if add is None or len(add.inputs) != 3:
        return None
    half = add.inputs[1] if add.inputs[0] == resize.outputs[0] else add.inputs[0]
    raw, fuse = g.raw_constant(half), g.raw_constant(add.inputs[2])
    if raw is None or raw.size != 1 or g.operand(half).type != T.TENSOR_FLOAT32 or raw.reshape(-1)[0] != \
            np.float32(HALF_BELOW_FLOAT32) or fuse is None or int(fuse.reshape(-1)[0]) != FuseCode.FUSED_NONE:
        return None
    back = _only_reader(g, add.outputs[0], Op.CAST)
    if back is None or g.operand(back.outputs[0]).type != T.TENSOR_QUANT8_ASYMM:
        return None
    return g.value(cast.inputs[0]), 0, [add, back]


def _requantized_chain(g: GraphBuilder, resize: Operation) -> tuple[Value, int, list[Operation]] | None:
    """(the quantized value, its internal zero point, [QUANTIZE]) where ``resize`` blends a
    DEQUANTIZE to float32 of an 8-bit value and only a QUANTIZE to its scale and zero point
    reads the blend."""
    source = g.dequantized.get(resize.inputs[0])
    quantize = _only_reader(g, resize.outputs[0], Op.QUANTIZE)
    if source is None or quantize is None:
        return None
    dequantize = g.producer(resize.inputs[0])
    output = g.operand(quantize.outputs[0])
    if dequantize is None or output.type not in QUANT8 or output.type != g.operand(dequantize.inputs[0]).type \
            or np.float32(output.scale) != np.float32(source.scale) \
            or internal_zero_point(output) != source.zero_point:
        return None
    return source, source.zero_point, [quantize]


@lowers(Op.RESIZE_BILINEAR)
def lower_resize_bilinear_chain(g: GraphBuilder, operation: Operation) -> None:
    """RESIZE_BILINEAR, and where it is the middle of one of the importer's rounding chains
    (the module's docstring) the whole chain as DequantizeLinear, Resize, QuantizeLinear."""
    chain = None
    if not g.isolated and g.operand(operation.outputs[0]).type == T.TENSOR_FLOAT32:
        chain = _uint8_chain(g, operation) or _requantized_chain(g, operation)
    if chain is None or not _lower_chain(g, operation, *chain):
        lower_resize_bilinear(g, operation)


def _lower_chain(g: GraphBuilder, resize: Operation, x: Value, center: int, after: list[Operation]) -> bool:
    """The chain through ``resize`` ending in ``after[-1]``'s output: False (nothing emitted)
    where this form does not apply."""
    if len(resize.inputs) > 3 and g.optional_scalar(resize, 3, False):
        return False  # NCHW: the importer writes NHWC only
    if g.operand(resize.inputs[1]).type != T.INT32 or x.rank != 4 or not all(x.dims):
        return False
    align_corners = bool(g.optional_scalar(resize, 4, False))
    half_pixel = bool(g.optional_scalar(resize, 5, False))
    width, height = int(g.scalar(resize.inputs[1])), int(g.scalar(resize.inputs[2]))
    if (align_corners and half_pixel) or width <= 0 or height <= 0:
        return False  # the operation's own lowering declines them, naming why
    batch, in_height, in_width, channels = x.dims
    if in_height == in_width == 1:
        # one pixel (DeepLab's image-pooling branch, global average then 1x1 convolution,
        # blended back to the feature map's size): every output pixel blends the stored
        # integer v with itself, weights summing to 1, v (1 +- a few ulp), which both chains
        # round back to v (a step's error would need |v| * 2**-22 >= 1/2): v repeated, one
        # Expand where DequantizeLinear / Resize / QuantizeLinear took three nodes
        g.set_output(after[-1].outputs[0], g.one("Expand", [x.name, g.constant(np.array(
            [batch, height, width, channels], np.int64))]))
        g.covered.update(id(operation) for operation in after)
        return True
    rows = weighted_taps(in_height, height, align_corners, half_pixel)
    cols = weighted_taps(in_width, width, align_corners, half_pixel)
    nchw = channels == 1  # see below
    if exact_taps(rows, cols) and not resize_matches_taps(in_height, in_width, height, width, align_corners,
                                                             half_pixel, nchw):
        return False
    if not _quantize_rounds_halves_away():
        return False
    one = g.constant(np.array(1.0, np.float32))
    zero_point = g.constant(np.array(center, np.uint8))
    shifted = g.one("DequantizeLinear", [x.name, one, zero_point])
    mode = resize_mode(align_corners, half_pixel)
    if nchw:
        # one channel: NCHW between Transposes that only rename axes, which ORT's layout
        # optimizer moves on through the consumers; resized in NHWC, the value and what
        # follows end in an axis of 1, over which ORT's broadcasting element-wise operators
        # step one element at a time (gray_preproc_int8f's 96x128x1 normalisation: a Div and
        # an Add of a scalar at 80 us each against 4; the model 1.07 -> 0.76 ms)
        planes = g.one("Transpose", [shifted], perm=[0, 3, 1, 2])
        blend = g.one("Resize", [planes, "", "", g.constant(np.array([batch, 1, height, width], np.int64))],
                      mode="linear", coordinate_transformation_mode=mode)
        blend = g.one("Transpose", [blend], perm=[0, 2, 3, 1])
    else:
        blend = g.one("Resize", [shifted, "", "", g.constant(np.array([batch, height, width, channels], np.int64))],
                      mode="linear", coordinate_transformation_mode=mode)
    rounded = g.one("QuantizeLinear", [blend, g.constant(np.array(ROUNDING_SCALE, np.float32)), zero_point])
    g.set_output(after[-1].outputs[0], rounded)
    g.covered.update(id(operation) for operation in after)
    return True
