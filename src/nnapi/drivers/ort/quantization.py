"""Lowerings of the type conversions: QUANTIZE, DEQUANTIZE and CAST, and the float-to-8-bit
rounding (half away from zero, ``quantize_half_away``) the other families' quantized
lowerings share.

A QUANTIZE rounds as the reference does (the general rounding: ~8 nodes) unless its float
value is one ORT computes otherwise than the reference (``computed_otherwise``): through a
sum of its own order (MatMul, ReduceMean, Softmax; 11d337f) or a function it approximates
with its own kernels (Sigmoid, Tanh, Exp for LOGISTIC, TANH, EXP). There ORT's float value
is the reference's to within its last bits, not equal to it, so the general rounding of it
was only within a step of the reference; one QuantizeLinear (halves to even) is within a
step as well (the rule of 11d337f, nothing looser): one node in place of eight. A
post-norm PT2E block's residual ADD, batch norm and SiLU over two DEQUANTIZEd roots x 32
channels (2**21 values, past requantizing_quantize's proof) measured so: the general
rounding of ORT's value differed from the reference on 8 of its 2,097,152 (value, value,
channel) triples, one QuantizeLinear on 9, one step each."""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np
from onnx import TensorProto

from nnapi.codes import OperationCode
from nnapi.drivers.ort.builder import (
    FLOATS,
    QUANT8,
    Declined,
    GraphBuilder,
    T,
    Value,
    internal_zero_point,
    lowers,
    type_name,
)
from nnapi.hal import Operand, Operation
from nnapi.operations.quant_math import HALF_BELOW_FLOAT32, dequantize, dequantize_per_channel


@lowers(OperationCode.CAST)
def lower_cast(g: GraphBuilder, operation: Operation) -> None:
    """CAST as C's static_cast, quantized tensors as their stored integers: floats to
    integers truncate toward zero after saturating to the target's range (NaN gives 0, as
    the reference defines it; one Cast where the value's bounds lie inside it), to
    float16 rounds once (a float16 round trip, kept in float32 inside); identity casts
    copy."""
    x = g.value(operation.inputs[0])
    source, target = g.operand(operation.inputs[0]).type, g.operand(operation.outputs[0]).type
    if source == target:
        g.set_output(operation.outputs[0], g.one("Identity", [x.name]))
        return
    convertible = (*FLOATS, T.TENSOR_INT32, T.TENSOR_QUANT8_ASYMM)
    if source not in convertible or target not in convertible:
        raise Declined(f"CAST from {type_name(source)} to {type_name(target)} is not supported")
    if target in FLOATS:
        y = x.name if x.kind == "float" else g.one("Cast", [x.name], to=TensorProto.FLOAT)
        if target == T.TENSOR_FLOAT16 and source != T.TENSOR_FLOAT16:
            y = g.one("Cast", [g.one("Cast", [y], to=TensorProto.FLOAT16)], to=TensorProto.FLOAT)
        g.set_output(operation.outputs[0], y)
        return
    low, high = (0, 255) if target == T.TENSOR_QUANT8_ASYMM else (-(2 ** 31), 2 ** 31 - 1)
    to = TensorProto.UINT8 if target == T.TENSOR_QUANT8_ASYMM else TensorProto.INT32
    known = g.ranges.get(operation.inputs[0])
    if (x.kind == "float" and known is not None and low <= known[0].min()
            and known[1].max() <= min(high, 2 ** 31 - 128)):
        # bounds value_ranges.py proves inside the target's range (a decode head's scaled
        # and floored index): no NaN, nothing to saturate, Cast truncates as static_cast
        # does, one node where the guarded form below takes five or six
        y = g.one("Cast", [x.name], to=to)
    elif x.kind == "float":
        # float32's largest value below 2^31 is 2^31 - 128: the top of int32 is chosen apart
        clipped = g.one("Clip", [x.name, g.constant(np.array(low, np.float32)),
                                 g.constant(np.array(min(high, 2 ** 31 - 128), np.float32))])
        clipped = g.one("Where", [g.one("IsNaN", [x.name]), g.constant(np.array(0.0, np.float32)), clipped])
        y = g.one("Cast", [clipped], to=to)
        if high > 2 ** 31 - 128:
            y = g.one("Where", [g.one("GreaterOrEqual", [x.name, g.constant(np.array(2.0 ** 31, np.float32))]),
                                g.constant(np.array(high, np.int32)), y])
    else:  # int32 to uint8 saturates; uint8 to int32 is exact
        y = x.name if to == TensorProto.INT32 else g.one(
            "Clip", [x.name, g.constant(np.array(low, np.int32)), g.constant(np.array(high, np.int32))])
        y = g.one("Cast", [y], to=to)
    g.set_output(operation.outputs[0], y)


@lowers(OperationCode.QUANTIZE)
def lower_quantize(g: GraphBuilder, operation: Operation) -> None:
    x = g.value(operation.inputs[0])
    output = g.operand(operation.outputs[0])
    if x.kind != "float" or output.type not in QUANT8:
        raise Declined("QUANTIZE from float to quant8 only")
    source = g.dequantized.get(operation.inputs[0])
    if source is not None and _same_internal_quantization(source, output):
        # DEQUANTIZE then QUANTIZE into the same scale and zero point (int8 as uint8 + 128):
        # the stored values themselves, the importer's TFLite QUANTIZE of a uint8 model's
        # input into its int8 graph (and back at its output): ~0.25 ms of Div, Abs, Floor,
        # Mul, Clip over EfficientDet-Lite0's 320x320x3 image
        g.set_output(operation.outputs[0], source.name)
        return
    if operation.inputs[0] in g.integer_means:
        # the importer's quantized MEAN (DEQUANTIZE, MEAN, QUANTIZE: a squeeze-and-excitation
        # pool) whose mean _integer_mean already rounds otherwise than the reference (one
        # product of the exact sum): QuantizeLinear rounds halves to even where the
        # reference rounds them away, within a step either way, in one node where
        # quantize_half_away's four to seven nodes cost ~2 us each on a few hundred values
        # (efficientnet_b0's 16 gates and head: ~0.3 ms of ~6)
        g.set_output(operation.outputs[0], g.quantize(x.name, output))
        return
    name = _nan_as_infinity(g, operation.inputs[0], x.name)
    if computed_otherwise(g, operation.inputs[0]):
        # a float value ORT computes through a sum of its own order (a MatMul, ReduceMean
        # or Softmax: PT2E transformers' attention, layer norms, RMS norms) or a
        # function of its own approximation (Sigmoid, Tanh, Exp: PT2E's SiLU after a
        # residual ADD), so within a few ulps of the reference's, not equal to it: the
        # reference's rounding of its own value and QuantizeLinear's of ORT's differ by a
        # step wherever a half lies between the two or on ORT's, halves to even adding only
        # values exactly on a half, so the result stays within a step of the reference as
        # before, in one node where the general rounding takes eight (tinyvit PT2E: 13 of
        # its 17 QUANTIZEs)
        g.set_output(operation.outputs[0], g.quantize(name, output))
        return
    known = g.ranges.get(operation.inputs[0])
    g.set_output(operation.outputs[0], quantize_half_away(g, name, output,
                                                          nonnegative=known is not None and known[0].min() >= 0))


def _nan_as_infinity(g: GraphBuilder, index: int, name: str) -> str:
    """Float ``name`` (operand ``index``) with NaN replaced by +inf, which QuantizeLinear
    saturates to the top of the range: Android's QUANTIZE clamps as max(low, min(high, zero
    point + round(x / scale))) and std::min(high, NaN) is high (255 for uint8, 127 for int8),
    where QuantizeLinear gives NaN the zero point. A DEQUANTIZE's output holds no NaN, nor
    does a value of known bounds (value_ranges.py), so those go through as they are."""
    if index in g.dequantized or index in g.ranges:
        return name
    return g.one("Where", [g.one("IsNaN", [name]), g.constant(np.array(np.inf, np.float32)), name])


#: float32 operations that keep a value's inexactness (element-wise, or moves): besides the
#: arithmetic, the element-wise functions of PT2E's float islands (an LSTM's LOGISTIC and TANH
#: gates after its FULLY_CONNECTED, the EXP and RELU of the importer's 21-operation GELU after
#: a group norm's MEAN) and the slices an LSTM cuts its gates with. A function of a value
#: within a few ulps of the reference's stays within a few ulps times its condition number
#: (|x f'(x) / f(x)|: at most 1 for LOGISTIC, TANH and RELU, |x| <= 88 for EXP), far below a
#: quantization step, and either rounding of it is within a step of the reference's
_CARRIERS = (OperationCode.ADD, OperationCode.SUB, OperationCode.MUL, OperationCode.DIV, OperationCode.RSQRT,
             OperationCode.SQRT, OperationCode.NEG, OperationCode.ABS, OperationCode.RESHAPE,
             OperationCode.TRANSPOSE, OperationCode.SQUEEZE, OperationCode.EXPAND_DIMS,
             OperationCode.LOGISTIC, OperationCode.TANH, OperationCode.EXP, OperationCode.RELU,
             OperationCode.RELU1, OperationCode.RELU6, OperationCode.SLICE, OperationCode.STRIDED_SLICE)
#: float32 functions ORT evaluates with approximations of its own (MLAS's Sigmoid, Tanh and
#: Exp; a LOGISTIC that is no gate as Reciprocal(1 + Exp(-x)), elementwise.py), not the
#: reference's: on 2**20 values spread over [-8, 8] ORT's Sigmoid / Tanh / Exp differ from the
#: reference's LOGISTIC / TANH / EXP on 70% / 62% / 40% of them (by at most 1.8e-7 and 3.0e-7
#: absolute, 2 ulps; onnxruntime 1.32), so a value computed through one is the reference's to
#: within its last bits, not equal to it, as after a reordered sum. (A chain over DEQUANTIZEd
#: 8-bit values that requantizing_quantize.py probes keeps the general rounding where that
#: rounding is the reference's on every probed value.)
_OWN_FUNCTIONS = (OperationCode.LOGISTIC, OperationCode.TANH, OperationCode.EXP)
#: how many operations back the search goes (a group norm's MEAN lies ~28 back, behind the
#: GELU's 21 operations and the norm's affine; a walk of the graph at preparation only)
_CARRIER_DEPTH = 48


def computed_otherwise(g: GraphBuilder, index: int) -> bool:
    """Whether float32 operand ``index`` is computed, through at most _CARRIER_DEPTH
    element-wise operations or moves (_CARRIERS), from a sum of more than one term that ORT
    orders otherwise than the reference: BATCH_MATMUL or FULLY_CONNECTED (MatMul, Gemm),
    MEAN (ReduceMean), SOFTMAX (its exponentials' sum); or from a function ORT approximates
    otherwise (_OWN_FUNCTIONS)."""
    pending, seen = [index], set()
    while pending and len(seen) < _CARRIER_DEPTH:
        i = pending.pop()
        operation = g.producer(i)
        if operation is None or id(operation) in seen or g.operand(i).type != T.TENSOR_FLOAT32:
            continue
        seen.add(id(operation))
        if operation.type in _OWN_FUNCTIONS or _reordered_sum(g, operation):
            return True
        if operation.type in _CARRIERS:
            pending.extend(operation.inputs[:2])
    return False


def approximated(operations: Iterable[Operation]) -> bool:
    """Whether one of ``operations`` is a function ORT approximates otherwise (_OWN_FUNCTIONS):
    computed_otherwise's answer for the value of element-wise float32 operations whose other
    inputs are constants and DEQUANTIZE outputs (requantizing_quantize.py's chains), where its
    walk meets these operations and no sum."""
    return any(operation.type in _OWN_FUNCTIONS for operation in operations)


def _reordered_sum(g: GraphBuilder, operation: Operation) -> bool:
    """Whether float32 ``operation`` sums more than one term (see computed_otherwise)."""
    inputs = [g.operand(i) for i in operation.inputs]
    if any(o.type != T.TENSOR_FLOAT32 for o in inputs[:1]) or not all(inputs[0].dimensions):
        return False
    dims = list(inputs[0].dimensions)
    if operation.type == OperationCode.BATCH_MATMUL:  # the contracted axis is one of the last two
        return len(dims) >= 2 and min(dims[-2:]) > 1
    if operation.type == OperationCode.FULLY_CONNECTED:
        return len(inputs[1].dimensions) == 2 and inputs[1].dimensions[1] > 1
    if operation.type == OperationCode.MEAN:
        output = g.operand(operation.outputs[0])
        return all(output.dimensions) and math.prod(dims) > math.prod(output.dimensions)
    if operation.type == OperationCode.SOFTMAX:
        axis = int(g.scalar(operation.inputs[2])) if len(operation.inputs) > 2 else -1
        return -len(dims) <= axis < len(dims) and dims[axis] > 1
    return False


def _same_internal_quantization(source: Value, output: Operand) -> bool:
    """Whether QUANTIZE into ``output`` of the DEQUANTIZE of 8-bit ``source`` gives back
    ``source``'s internal values: one float32 scale and one internal zero point. With d = q -
    zero point (|d| <= 255) the float32 d * scale / scale is d to within 255 * 2**-22, far
    from a half, so the rounding gives d back (a scale so large that d * scale overflows is
    left to the general form)."""
    scale = np.float32(source.scale)
    return (source.kind == "uint8" and scale == np.float32(output.scale) and 0 < scale < _LARGEST_FLOAT32 / 256
            and source.zero_point == internal_zero_point(output))


_LARGEST_FLOAT32 = float(np.finfo(np.float32).max)


def quantize_half_away(g: GraphBuilder, name: str, output: Operand, scale: float | None = None,
                       nonnegative: bool = False) -> str:
    """Float ``name`` quantized to ``output`` in its internal encoding as Android rounds:
    halves away from zero (std::round), where QuantizeLinear rounds half to even; round(x /
    scale) that way (the output's scale unless given), then the zero point added and
    saturated by a QuantizeLinear of scale 1 (exact on integers: one node for the Add, Clip
    and Cast it replaced). Where the internal zero point is 0 every negative value
    saturates to 0 anyway, so rounding halves up (floor(x + 0.5)) is the same: four nodes
    instead of nine. Transformer models quantize many small tensors, where ORT's cost is
    per node (vit_tiny_int8's 39 QUANTIZE). The "0.5" added is the float32 just below it
    (quant_math.half_below, as the reference rounds): with 0.5 itself, 0.5 - 2**-25 + 0.5
    rounds up to 1.0 in float32 and the value to 1, where C's round gives 0; exact for
    every float32, at no extra node. ``nonnegative``: ``name`` is known to hold no value
    below 0 (value_ranges.py's bounds), where halves away from zero are halves up too."""
    scale = output.scale if scale is None else scale
    scaled = name if scale == 1.0 else g.one("Div", [name, g.constant(np.array(scale, np.float32))])
    half = g.constant(np.array(HALF_BELOW_FLOAT32, np.float32))
    zero_point = internal_zero_point(output)
    if zero_point == 0 or nonnegative:
        rounded = g.one("Floor", [g.one("Add", [scaled, half])])
    else:
        magnitude = g.one("Floor", [g.one("Add", [g.one("Abs", [scaled]), half])])
        if all(output.dimensions) and math.prod(output.dimensions) >= _CLIPPED_SIGN_SIZE:
            # the sign as Clip(x * 2**126, -1, 1): +-1 for every normal value and the
            # infinities, smaller only for a denormal, whose magnitude rounds to 0 anyway
            # (NaN: a NaN magnitude either way); ORT's Sign is a scalar loop, ~4x slower
            # (onnxruntime 1.32: 142 us over 257x257x3 against 34 for the Mul and Clip)
            sign = g.one("Clip", [g.one("Mul", [scaled, g.constant(np.array(2.0 ** 126, np.float32))]),
                                  g.constant(np.array(-1.0, np.float32)), g.constant(np.array(1.0, np.float32))])
        else:  # one node: on a few thousand values ORT's per-node cost outweighs the loop
            sign = g.one("Sign", [scaled])
        rounded = g.one("Mul", [magnitude, sign])
    return g.one("QuantizeLinear", [rounded, g.constant(np.array(1.0, np.float32)),
                                    g.constant(np.array(zero_point, np.uint8))])


#: the QUANTIZE size from which quantize_half_away takes the sign with a Mul and a Clip
_CLIPPED_SIGN_SIZE = 4096


@lowers(OperationCode.DEQUANTIZE)
def lower_dequantize(g: GraphBuilder, operation: Operation) -> None:
    index = operation.inputs[0]
    operand = g.operand(index)
    output = g.operand(operation.outputs[0])
    if output.type not in FLOATS:
        raise Declined("DEQUANTIZE to float only")
    raw = g.raw_constant(index)
    if raw is not None:  # a constant (MediaPipe's float16 weights): dequantized once, here
        values = raw.astype(np.float32)
        if operand.type == T.TENSOR_QUANT8_SYMM_PER_CHANNEL:
            quant = operand.channel_quant
            if quant is None:
                raise Declined("per-channel operand without scales")
            values = dequantize_per_channel(raw, quant.scales, quant.channel_dim, np.float32)
        elif operand.type in (*QUANT8, T.TENSOR_QUANT8_SYMM):
            values = dequantize(raw, operand.scale, operand.zero_point, np.float32)
        elif operand.type not in FLOATS:
            raise Declined(f"DEQUANTIZE from {type_name(operand.type)} is not supported")
        if output.type == T.TENSOR_FLOAT16:
            values = values.astype(np.float16).astype(np.float32)
        name = g.constant(values.astype(np.float32), "dequantized")
        g.values[operation.outputs[0]] = Value(name, "float", list(output.dimensions), const=values)
        return
    if operand.type in QUANT8:
        x = g.value(index)
        y = g.dequantize(x)
        if output.type == T.TENSOR_FLOAT32 and x.kind == "uint8":
            g.dequantized[operation.outputs[0]] = x
    elif operand.type in FLOATS:
        y = g.one("Identity", [g.value(index).name])
    elif operand.type in (T.TENSOR_QUANT8_SYMM, T.TENSOR_QUANT8_SYMM_PER_CHANNEL):
        y = _dequantize_symmetric(g, g.value(index), operand)
    else:
        raise Declined(f"DEQUANTIZE of a non-constant {type_name(operand.type)} is not supported")
    g.set_output(operation.outputs[0], y)


def _dequantize_symmetric(g: GraphBuilder, x: Value, operand: Operand) -> str:
    """8-bit symmetric weights given at run time (int8 as stored, zero point 0) as reals:
    DequantizeLinear's float32 (q - 0) * scale is the reference's float32 q * scale, per
    channel along the operand's channel dimension (ONNX's axis)."""
    if operand.type == T.TENSOR_QUANT8_SYMM:
        scales, axis = np.array(operand.scale, np.float32), {}
    else:
        quant = operand.channel_quant
        if quant is None or not 0 <= quant.channel_dim < x.rank:
            raise Declined("per-channel scales must run along one of the operand's dimensions")
        scales, axis = np.asarray(quant.scales, np.float32), {"axis": quant.channel_dim}
    zero_points = g.constant(np.zeros(scales.shape, np.int8), "zp")
    return g.one("DequantizeLinear", [x.name, g.constant(scales, "scale"), zero_points], **axis)
