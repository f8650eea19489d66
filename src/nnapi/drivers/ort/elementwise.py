"""Lowerings of the element-wise operations: the binary arithmetic (ADD, SUB, MUL, DIV),
activations (LOGISTIC, TANH, RELU, RELU1, RELU6, HARD_SWISH, ELU, PRELU, ...), MAXIMUM /
MINIMUM, POW, comparisons, SELECT and the logical operations."""

from __future__ import annotations

import hashlib
import math

import numpy as np
from onnx import TensorProto, helper

from nnapi.codes import FuseCode, OperationCode
from nnapi.drivers.ort import requantize
from nnapi.drivers.ort.builder import (
    CLAMPS,
    FLOATS,
    MS_DOMAIN,
    NCHWC_BLOCK,
    QUANT8,
    Declined,
    GraphBuilder,
    T,
    Value,
    blocked,
    channel_scale,
    check_same_quantization,
    encode,
    from_nchw,
    fused_activation,
    has_kernel,
    internal_zero_point,
    lowers,
    probe_form,
    read_counts,
    to_nchw,
    type_name,
)
from nnapi.drivers.ort.channel_padding import pad_channels, reads_padded, set_channels
from nnapi.drivers.ort.int32_moves import rejoined_move
from nnapi.drivers.ort.value_ranges import decided
from nnapi.drivers.ort.versions import onnxruntime_at_least
from nnapi.hal import Operand, Operation
from nnapi.operand import OperandType
from nnapi.operations import ExecutionContext, Tensor, get_operation
from nnapi.operations.common import activation_bounds_float, activation_bounds_quantized
from nnapi.operations.quant_math import FixedPointMul, prelu_fixed_point, rescale_multiplier

#: the first ONNX Runtime release with a uint8 Less on the CPU
UINT8_LESS_VERSION = (1, 21)

_BINARY = {OperationCode.ADD: ("Add", "QLinearAdd"), OperationCode.MUL: ("Mul", "QLinearMul"),
           OperationCode.SUB: ("Sub", None), OperationCode.DIV: ("Div", None)}


@lowers(*_BINARY)
def lower_binary(g: GraphBuilder, operation: Operation) -> None:
    code = OperationCode(operation.type)
    output = g.operand(operation.outputs[0])
    fuse = int(g.scalar(operation.inputs[2]))
    if output.type == T.TENSOR_INT32 and rejoined_move(g, operation):
        return
    if code == OperationCode.ADD and output.type in FLOATS and any(i in g.padded for i in operation.inputs[:2]) \
            and g.operand(operation.inputs[0]).dimensions == g.operand(operation.inputs[1]).dimensions:
        # channels padded to the NCHWc block (wants_padding): zeros + zeros stay zeros
        a, b = (g.blocked_value(i) for i in operation.inputs[:2])
        channels = max(a.dims[3], b.dims[3])
        a_name, b_name = (v.name if v.dims[3] == channels else pad_channels(g, v.name, channels - v.dims[3])
                          for v in (a, b))
        y = _clamped_add(g, operation, a_name, b_name, output, channels)
        set_channels(g, operation.outputs[0], y, channels)
        return
    if code == OperationCode.MUL and output.type in FLOATS and _scaled_padded(g, operation):
        y, channels = _padded_mul(g, operation)
        set_channels(g, operation.outputs[0], fused_activation(g, y, fuse, output), channels)
        return
    a, b = g.value(operation.inputs[0]), g.value(operation.inputs[1])
    float_op, quant_op = _BINARY[code]
    if output.type in FLOATS and code == OperationCode.MUL and not g.isolated and not any(
            g.producer(i) is not None and g.producer(i).type in _UNBLOCKED for i in operation.inputs[:2]) and \
            not _scaled_dequantized(g, operation):
        y = _blocked_product(g, a, b)
        if y is not None:
            g.set_output(operation.outputs[0], fused_activation(g, y, fuse, output))
            return
    if output.type in FLOATS and code == OperationCode.ADD and a.dims == b.dims == list(output.dimensions):
        channels = a.dims[3] if a.rank == 4 else 0
        g.set_output(operation.outputs[0], _clamped_add(g, operation, a.name, b.name, output, channels))
        return
    if output.type in FLOATS:
        y = g.one(float_op, [a.name, b.name])
    elif output.type in QUANT8:
        scaled = _channel_product(g, operation, output, fuse) if code == OperationCode.MUL else None
        if scaled is not None:
            g.set_output(operation.outputs[0], scaled)
            return
        start = len(g.nodes)
        source = _scalar_operand_source(g, operation)
        if code == OperationCode.SUB and source is not None:
            y = fused_activation(g, _negated_add(g, a, b, output), fuse, output)
            if proven_form(g, operation, source, start, y, "negated add"):
                g.set_output(operation.outputs[0], y)
                return
        if quant_op is not None:
            a_name, b_name = spread_channel_factor(g, a, b, list(output.dimensions))
            y = g.one(quant_op, [a_name, *g.qparams(a), b_name, *g.qparams(b), *g.qparams(output)],
                      domain=MS_DOMAIN)
        else:
            y = g.quantize(g.one(float_op, [g.dequantize(a), g.dequantize(b)]), output)
        if source is not None:
            fast = fused_activation(g, y, fuse, output)
            g.set_output(operation.outputs[0], proven_or_table(g, operation, source, start, fast))
            return
    elif output.type == T.TENSOR_INT32 and code in (OperationCode.ADD, OperationCode.MUL, OperationCode.SUB):
        if fuse != FuseCode.FUSED_NONE:
            raise Declined("a fused activation on int32")
        y = g.one(float_op, [a.name, b.name])
    else:
        raise Declined(f"{code.name} on {type_name(output.type)} is not supported")
    g.set_output(operation.outputs[0], fused_activation(g, y, fuse, output))


def _negated_add(g: GraphBuilder, a: Value, b: Value, output: Operand) -> str:
    """8-bit a - b as one QLinearAdd of a and b on the negated scale (exact in float32):
    the same real sum, where DequantizeLinear of both (ORT keeps a constant's: it does not
    fold DequantizeLinear), Sub and QuantizeLinear are four nodes (a GRU's 1 - z, once per
    step); for SUB with a one-element constant, taken where proven (proven_form)."""
    negated = g.constant(np.array(-np.float32(b.scale), np.float32), "scale")
    rank = len(output.dimensions)
    return g.one("QLinearAdd", [at_rank(g, a, rank), *g.qparams(a), at_rank(g, b, rank), negated, g.qparams(b)[1],
                                *g.qparams(output)], domain=MS_DOMAIN)


def spread_channel_factor(g: GraphBuilder, a: Value, b: Value, dims: list[int]) -> tuple[str, str]:
    """The operands of a QLinearMul / QLinearAdd, a [N, 1, 1, C] value computed at run time
    (a squeeze-and-excitation gate) spread over the other's [N, H, W, C] by an Expand
    first: ORT's broadcast kernel runs the C values of each pixel as a call of its own
    (~0.35 ns per element at C = 32, 0.12 at 16 / 0.05 as one Expand and a Mul of equal
    shapes). The same values in the same products. A constant of lower rank comes at the
    output's (at_rank)."""
    names = [at_rank(g, a, len(dims)), at_rank(g, b, len(dims))]
    if g.isolated or len(dims) != 4 or not all(dims) or dims[1] * dims[2] == 1:
        return names[0], names[1]
    for position, (x, factor) in enumerate(((a, b), (b, a))):
        if x.dims == dims and factor.const is None and factor.dims == [dims[0], 1, 1, dims[3]]:
            names[1 - position] = g.one("Expand", [factor.name, g.constant(np.array(dims, np.int64))])
            break
    return names[0], names[1]


def at_rank(g: GraphBuilder, x: Value, rank: int) -> str:
    """The name of ``x``, or where ``x`` is a constant of lower rank than ``rank``, of the
    same constant with leading 1s up to it (the same broadcast, the same values): ONNX
    Runtime broadcasts a lower-rank operand over a tensor whose last axis is 1 element by
    element (a [1] factor over [1, 96, 96, 1] uint8, one thread, best of 15: QLinearMul
    177 us, at rank 4 5 us; QLinearAdd and a uint8 Min likewise; other shapes measured the
    same either way). scalar_broadcast.widen_scalars does this for the float operators
    after lowering, from ONNX's shape inference, which knows no QLinear operators (nor the
    shapes after them), so quantized operands get it here, from the operands' own shapes."""
    if g.isolated or x.const is None or x.rank >= rank:
        return x.name
    return g.constant(x.const.reshape([1] * (rank - x.const.ndim) + list(x.const.shape)))


#: operations ORT computes outside its blocked layout: a MUL of their result (an attention's
#: scaled scores, BATCH_MATMUL's) is a plain Mul, not a convolution between two Transposes
_UNBLOCKED = (OperationCode.BATCH_MATMUL, OperationCode.FULLY_CONNECTED, OperationCode.TRANSPOSE,
              OperationCode.RESHAPE, OperationCode.SOFTMAX, OperationCode.GATHER)


def _scaled_dequantized(g: GraphBuilder, operation: Operation) -> bool:
    """Whether MUL ``operation`` scales a DEQUANTIZE's output by a constant (a PT2E
    attention's queries and keys by 1 / sqrt(depth)): ORT holds a DequantizeLinear's output
    in NHWC, so the depthwise convolution's Transposes would be passes of their own (sdpa
    PT2E's [1, 4, 64, 64] queries: ~40 us each, where the Mul takes ~3)."""
    for position in (0, 1):
        x, factor = operation.inputs[position], operation.inputs[1 - position]
        producer = g.producer(x)
        if producer is not None and producer.type == OperationCode.DEQUANTIZE and g.raw_constant(factor) is not None:
            return True
    return False


def _blocked_product(g: GraphBuilder, a: Value, b: Value) -> str | None:
    """A float MUL of an NHWC value ORT holds in its blocked layout (NCHWc) by a per-channel
    factor, in operators it keeps there (a squeeze-and-excitation block's scaling): by a
    constant (a scalar or one per channel), a 1x1 depthwise convolution (one rounded
    product, as Mul); by a [N, 1, 1, C] value, that value spread over the height and width
    by a nearest Resize (copies) and an element-wise Mul of equal shapes. ORT's blocked Mul
    takes equal shapes only, so the broadcast Mul reordered the whole value out and back
    in. None where it does not apply."""
    for x, factor in ((a, b), (b, a)):
        if not blocked(x.dims, x.kind) or factor.kind != "float":
            continue
        channels = x.dims[3]
        if factor.const is not None and factor.const.size in (1, channels) and factor.rank <= 4 and (
                factor.rank == 0 or factor.dims[-1] in (1, channels)) and all(d == 1 for d in factor.dims[:-1]):
            scales = np.broadcast_to(factor.const.reshape(-1), (channels,))
            return from_nchw(g, channel_scale(g, to_nchw(g, x.name, False), scales), False)
        if factor.const is None and factor.dims == [x.dims[0], 1, 1, channels] and x.dims[1] * x.dims[2] > 1:
            spread = g.one("Resize", [to_nchw(g, factor.name, False), "",
                                      g.constant(np.array([1, 1, *x.dims[1:3]], np.float32))],
                           mode="nearest", coordinate_transformation_mode="asymmetric", nearest_mode="floor")
            return g.one("Mul", [x.name, from_nchw(g, spread, False)] if x is a else [from_nchw(g, spread, False),
                                                                                     x.name])
    return None


def _scaled_padded(g: GraphBuilder, operation: Operation) -> bool:
    """Whether a float MUL lowers in the padded form: its input that is scaled (not the
    constant, not the [N, 1, 1, C] gate) was computed padded and takes that form (a padded
    gate alone is cut back to its real channels instead: padding the value it scales would
    be a pass over that value)."""
    for position, index in enumerate(operation.inputs[:2]):
        other = g.operand(operation.inputs[1 - position]).dimensions
        scaled = g.raw_constant(operation.inputs[1 - position]) is not None or (
            len(other) == 4 and other[1] * other[2] == 1)
        if scaled and index in g.padded and reads_padded(g, operation, index):
            return True
    return False


def _padded_mul(g: GraphBuilder, operation: Operation) -> tuple[str, int]:
    """A float MUL with an input computed with its channels padded to the NCHWc block
    (_padded_product): the padded NHWC product and its channel count. Its padded channels
    are zeros: zero times a finite constant (or 0), zero times a gate's zero."""
    for position in (0, 1):
        index, other = operation.inputs[position], operation.inputs[1 - position]
        dims = g.operand(other).dimensions
        if index not in g.padded or (g.raw_constant(other) is None and not (len(dims) == 4 and dims[1] * dims[2] == 1)):
            continue
        x = g.blocked_value(index)
        channels = x.dims[3]
        known = g.raw_constant(other)
        if known is not None:
            real = g.operand(index).dimensions[3]
            scales = np.broadcast_to(known.astype(np.float32).reshape(-1), (real,))
            y = channel_scale(g, to_nchw(g, x.name, False), np.pad(scales, (0, channels - real)))
            return from_nchw(g, y, False), channels
        factor = g.blocked_value(other)
        factor_name = factor.name
        if factor.dims[3] != channels:
            # a gate not padded (a LOGISTIC's: selfie_segmentation's decoder), padded here and
            # passed through an identity 1x1 depthwise convolution (x * 1.0, exact) so that
            # ORT spreads it in its blocked layout (Resize 20 -> Upsample 3 us)
            padded = pad_channels(g, factor.name, channels - factor.dims[3])
            factor_name = from_nchw(g, channel_scale(g, to_nchw(g, padded, False), np.ones(channels, np.float32)),
                                    False)
        factor = Value(factor_name, "float", [*factor.dims[:3], channels])
        y = _blocked_product(g, x, factor) if position == 0 else _blocked_product(g, factor, x)
        if y is None:  # a [N, 1, 1, C] value scaled by a gate of its own shape
            y = g.one("Mul", [x.name, factor.name] if position == 0 else [factor.name, x.name])
        return y, channels
    raise Declined("no padded input")  # not reached: the caller checked


#: the fewest channels from which _channel_product's depthwise convolution beats QLinearMul
#: (process time alone, 1x1 depthwise against QLinearMul): by a factor per channel (ORT's
#: broadcast path; 112x112x8: 276 -> 79 us, 56x56x16: 35 -> 19) and by one for all (a
#: vectorized path: 56x56x32 21 / 21 us, x64 38 -> 26, 224x224x3 32 -> 450); one pixel
#: (a squeeze-and-excitation gate's scaling) is left to QLinearMul too (1x1x96: 6.9 / 7.4)
CHANNEL_PRODUCT_MIN_CHANNELS = {False: 8, True: 64}


def _channel_product(g: GraphBuilder, operation: Operation, output: Operand, fuse: int) -> str | None:
    """A quantized MUL of an NHWC value by a constant with one factor per channel (or one
    for all): a batch normalization's scale in a pre-activation network (DenseNet-121's 62,
    after each concatenation), as a 1x1 depthwise QLinearConv whose int8 weights and
    per-channel scales carry the factors (w = b - zero point where that fits in int8, else
    its sign, the magnitude going into the channel's weight scale). ORT runs that in its
    NHWC depthwise kernel, ~2.4x faster than QLinearMul's broadcast (56x56x256: 164 -> 69
    us). The input has 256 stored values, so the result of every value in every channel
    is known at preparation: this form is taken only where ORT's requantization
    (round-half-even of the float32 accumulator times float32(x_scale * w_scale) / y_scale,
    then the activation's clamp) gives the reference's result (Android's fixed-point
    product) for all of them. None where it does not apply."""
    if g.isolated or fuse not in (FuseCode.FUSED_NONE, FuseCode.FUSED_RELU, FuseCode.FUSED_RELU1,
                                  FuseCode.FUSED_RELU6):
        return None  # a support query: QLinearMul answers it the same
    for position in (0, 1):
        x_index, factor_index = operation.inputs[position], operation.inputs[1 - position]
        x, factor = g.operand(x_index), g.operand(factor_index)
        raw = g.raw_constant(factor_index)
        dims = list(x.dimensions)
        if (raw is None or len(dims) != 4 or not all(dims) or list(output.dimensions) != dims
                or factor.type not in QUANT8 or x.type not in QUANT8):
            continue
        channels = dims[3]
        if raw.size not in (1, channels) or len(factor.dimensions) > 4 or any(d != 1 for d in factor.dimensions[:-1]):
            continue
        if dims[1] * dims[2] == 1 or channels < CHANNEL_PRODUCT_MIN_CHANNELS[raw.size == 1]:
            continue  # a single pixel, few channels: the kernel's cost per pixel outweighs the gain
        factors = np.broadcast_to(raw.reshape(-1).astype(np.int64) - factor.zero_point, (channels,))
        form = _channel_product_form(x, factor, output, fuse, factors)
        if form is None:
            continue
        weights, bias, weight_scales = form
        source = g.value(x_index)
        shape = [channels, 1, 1, 1]
        y = g.one("QLinearConv", [to_nchw(g, source.name, False), *g.qparams(source),
                                  g.constant(weights.reshape(shape), "weights"), g.constant(weight_scales, "wscale"),
                                  g.constant(np.zeros(channels, np.int8), "wzp"), *g.qparams(output),
                                  *([] if bias is None else [g.constant(bias, "bias")])],
                  kernel_shape=[1, 1], group=channels)
        return fused_activation(g, from_nchw(g, y, False), fuse, output)
    return None


def _stored_column(operand: Operand) -> np.ndarray:
    """Every stored value of an 8-bit operand, as a (256, 1) int64 column."""
    return np.arange(*((-128, 128) if operand.type == T.TENSOR_QUANT8_ASYMM_SIGNED else (0, 256)))[:, None]


def _reference_products(x: Operand, factor: Operand, output: Operand, fuse: int, factors: np.ndarray) -> np.ndarray:
    """The reference's MUL (Android's fixed-point product, quant_math.FixedPointMul) of
    every stored value of ``x`` (rows) by each channel's factor (columns; ``factors``: the
    constant's values less its zero point), clamped by the fused activation: (256, C) int64."""
    low, high = activation_bounds_quantized(fuse, output)
    multiply = FixedPointMul((x.scale, x.zero_point), (factor.scale, factor.zero_point),
                             (output.scale, output.zero_point), low, high, np.int64)
    return multiply(_stored_column(x), factors[None, :] + factor.zero_point)


def _channel_product_form(x: Operand, factor: Operand, output: Operand, fuse: int,
                          factors: np.ndarray) -> tuple[np.ndarray, np.ndarray | None, np.ndarray] | None:
    """(int8 weights, int32 bias or None, float32 weight scales) of _channel_product's
    QLinearConv that give the reference's MUL (``_reference_products``) for every stored
    value of ``x`` in every channel, or None.

    The reference's fixed-point product rounds twice (the doubling high multiply to an
    integer, then the rounding right shift by r), which composes into one rounding of
    |p| * M + 2**-(r + 1) for p = (x - zero point) * b: its thresholds sit a constant
    2**-(r + 1) of a step from the real product's (1/256 at DenseNet-121's r = 7).
    ORT rounds (acc + bias) * S once, acc = (x - zero point) * w, S = x_scale * w_scale /
    y_scale. Each of the 256 accumulators bounds S (its result's rounding interval, open
    on the side of a clamp the fused activation applies anyway); where the bounds meet,
    their middle is taken. First the weights b - zero point (their sign past int8, the
    magnitude in the scale) with no bias; where a channel's bounds do not meet (a
    constant offset is no scale), weights of +-127 and a bias near the offset in their
    units, 2**-(r + 1) * 127 / (|b| * M), and its neighbours. The result is then checked
    as ORT computes it (``_channel_product_exact``)."""
    low, high = activation_bounds_quantized(fuse, output)
    expected = _reference_products(x, factor, output, fuse, factors)
    stored = _stored_column(x) - x.zero_point
    target = (expected - output.zero_point).astype(np.float64)
    below = np.where(expected <= low, -np.inf, target - 0.5)  # (acc + bias) * S must lie in [below, above]
    above = np.where(expected >= high, np.inf, target + 0.5)

    def bounds(weights: np.ndarray, bias: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        shifted = stored * weights[None, :].astype(np.int64) + bias[None, :]
        with np.errstate(divide="ignore", invalid="ignore"):
            first, second = below / shifted, above / shifted
        positive, negative = shifted > 0, shifted < 0
        return (np.max(np.where(positive, first, np.where(negative, second, -np.inf)), axis=0),
                np.min(np.where(positive, second, np.where(negative, first, np.inf)), axis=0))

    multiplier, shift = rescale_multiplier(x.scale, factor.scale, output.scale)
    per_step = multiplier * 2.0 ** (shift - 31)  # the output steps per unit of p
    sign = np.where(factors < 0, -1, 1)
    plain = np.where(np.abs(factors) <= 127, factors, sign).astype(np.int8)
    wide = np.where(factors == 0, 0, 127 * sign).astype(np.int8)
    offset = 2.0 ** (shift - 1) * 127 / np.maximum(np.abs(factors) * per_step, 1e-300)  # shift <= 0
    centre = np.round(np.minimum(offset, 2.0 ** 20)).astype(np.int64)
    zeros = np.zeros(len(factors), np.int64)
    candidates = [(plain, zeros)] + [(wide, np.maximum(centre + delta, 0)) for delta in (0, -1, 1, -2, 2, -3, 3)]
    weights, bias = plain.copy(), zeros.copy()
    lower, upper = bounds(plain, zeros)
    for candidate_weights, candidate_bias in candidates[1:]:
        open_channels = ~(lower < upper)
        if not open_channels.any():
            break
        new_lower, new_upper = bounds(candidate_weights, candidate_bias)
        take = open_channels & (new_lower < new_upper)
        weights[take], bias[take] = candidate_weights[take], candidate_bias[take]
        lower, upper = np.where(take, new_lower, lower), np.where(take, new_upper, upper)
    if not np.all((lower < upper) | (factors == 0)):
        return None
    ratio = np.float64(output.scale) / np.float64(x.scale)
    real = np.abs(factors) * per_step / np.maximum(np.abs(weights.astype(np.float64)), 1)
    with np.errstate(invalid="ignore"):  # the middle of an unbounded side is not taken
        middle = (lower + upper) / 2
    scale = np.where(np.isfinite(lower) & np.isfinite(upper), middle, np.clip(real, lower, upper))
    scale = np.where((factors == 0) | ~(scale > 0), real, scale)
    weight_scales = np.where(scale > 0, scale, 1.0) * ratio
    weight_scales = weight_scales.astype(np.float32)
    bias_or_none = bias.astype(np.int32) if bias.any() else None
    if not _channel_product_exact(x, output, fuse, weights, bias, weight_scales, expected):
        return None
    return weights, bias_or_none, weight_scales


def _channel_product_exact(x: Operand, output: Operand, fuse: int, weights: np.ndarray, bias: np.ndarray,
                           weight_scales: np.ndarray, expected: np.ndarray) -> bool:
    """Whether _channel_product's QLinearConv gives ``expected`` (the reference's MUL,
    _reference_products) for every stored value of ``x`` in every channel."""
    low, high = activation_bounds_quantized(fuse, output)
    # ORT: the int32 accumulator plus the bias as float32, times float32(x_scale * w_scale)
    # / y_scale in float32, rounded half to even, plus the zero point, saturated (stored
    # values: the int8 ones' +128 shift cancels between the input's zero point and the
    # output's)
    scales = (np.float32(x.scale) * weight_scales) / np.float32(output.scale)
    accumulators = (_stored_column(x) - x.zero_point) * weights[None, :].astype(np.int64) + bias[None, :]
    computed = np.clip(np.rint(accumulators.astype(np.float32) * scales[None, :]).astype(np.int64)
                       + output.zero_point, low, high)
    return bool(np.array_equal(computed, expected))


def _clamped_add(g: GraphBuilder, operation: Operation, a: str, b: str, output: Operand, channels: int) -> str:
    """A float ADD of two NHWC values of one shape (``channels`` channels, padded ones
    included; 0 for a value not of rank 4) with its fused activation. ORT's blocked layout (NCHWc) takes an Add into
    the convolution before it and a Relu after that, but has no blocked Clip: a bare Clip
    after the sum leaves the layout and comes back, two reorders and an unvectorized
    clamp per residual (pose_landmark_full's RELU6 residual chains: 39 reorders). So a
    RELU6 / RELU1 becomes part of a convolution: the one that computes an operand of the
    sum (_clamp_into_conv), or else an identity 1x1 depthwise one after the sum (x * 1.0,
    exact) that ORT fuses the Clip into, where the sum is blocked."""
    fuse = int(g.scalar(operation.inputs[2]))
    if fuse not in (FuseCode.FUSED_RELU1, FuseCode.FUSED_RELU6) or g.isolated:
        return fused_activation(g, g.one("Add", [a, b]), fuse, output)
    fused = _clamp_into_conv(g, operation, a, b, fuse)
    if fused is not None:
        return fused
    total = g.one("Add", [a, b])
    if not channels or channels % NCHWC_BLOCK or len(output.dimensions) != 4:
        return fused_activation(g, total, fuse, output)
    identity = channel_scale(g, to_nchw(g, total, False), np.ones(channels, np.float32))
    return from_nchw(g, fused_activation(g, identity, fuse, output), False)


def _clamp_into_conv(g: GraphBuilder, operation: Operation, a: str, b: str, fuse: int) -> str | None:
    """ADD + RELU1 / RELU6 where one operand is a float convolution's output read by
    nothing else, as that convolution in ORT's FusedConv with the other operand as its
    sum input Z and the clamp as its activation: conv + bias + Z, clamped, in one pass that
    ORT runs in its blocked layout (what it does itself for Conv + Add + Relu). The sum is
    the same three terms, added in another order (float32 rounding, as ORT's own Add
    fusion). The convolution's nodes move after Z's, so the graph stays in order. None
    where it does not apply."""
    low, high = activation_bounds_float(fuse)
    reads = read_counts(g.nodes)
    for position, (mine, other) in enumerate(((a, b), (b, a))):
        index = operation.inputs[position]
        recorded = g.convolutions.get(index)
        if recorded is None or operation.inputs[:2].count(index) != 1 or index in g.subgraph.output_indexes:
            continue
        conv, transpose = recorded
        if transpose.output[0] != mine or mine in reads or len(g.readers(index)) != 1:
            continue
        g.nodes.remove(conv)
        g.nodes.remove(transpose)
        if len(conv.input) < 3:
            conv.input.append("")
        conv.input.append(to_nchw(g, other, False))
        conv.op_type, conv.domain = "FusedConv", MS_DOMAIN
        conv.attribute.extend([helper.make_attribute("activation", "Clip"),
                               helper.make_attribute("activation_params", [float(low), float(high)])])
        g.uses_ms_domain = True
        g.nodes.extend([conv, transpose])
        del g.convolutions[index]
        return mine
    return None


_UNARY_FLOAT = {OperationCode.LOGISTIC: "Sigmoid", OperationCode.TANH: "Tanh", OperationCode.RELU: "Relu",
                OperationCode.HARD_SWISH: "HardSwish", OperationCode.ABS: "Abs", OperationCode.EXP: "Exp",
                OperationCode.FLOOR: "Floor", OperationCode.NEG: "Neg", OperationCode.SQRT: "Sqrt",
                OperationCode.ELU: "Elu", OperationCode.LOG: "Log", OperationCode.SIN: "Sin"}
#: the unary operations that also take TENSOR_INT32, wrapping as two's complement (|INT32_MIN|
#: and -INT32_MIN are INT32_MIN), as ONNX Runtime's Abs and Neg do
_UNARY_INT32 = (OperationCode.ABS, OperationCode.NEG)


@lowers(*_UNARY_FLOAT, OperationCode.RELU1, OperationCode.RELU6, OperationCode.RSQRT)
def lower_unary(g: GraphBuilder, operation: Operation) -> None:
    code = OperationCode(operation.type)
    output = g.operand(operation.outputs[0])
    if code in CLAMPS and output.type in FLOATS and operation.inputs[0] in g.padded:
        x = g.blocked_value(operation.inputs[0])  # channels padded to the block: clamped zeros stay zeros
        low, high = CLAMPS[code]
        y = g.one("Relu", [x.name]) if high == math.inf else g.one(
            "Clip", [x.name, g.constant(np.array(low, np.float32)), g.constant(np.array(high, np.float32))])
        set_channels(g, operation.outputs[0], y, x.dims[3])
        return
    if code == OperationCode.HARD_SWISH and output.type in FLOATS and operation.inputs[0] in g.padded:
        x = g.blocked_value(operation.inputs[0])  # channels padded to the block: 0 * relu6(0 + 3) / 6 = 0
        set_channels(g, operation.outputs[0], g.one("HardSwish", [x.name]), x.dims[3])
        return
    x = g.value(operation.inputs[0])
    if code == OperationCode.ELU:
        alpha = float(g.scalar(operation.inputs[1]))
    elif len(operation.inputs) != 1:
        raise Declined(f"{code.name} takes one input")
    if code in _UNARY_INT32 and output.type == T.TENSOR_INT32 and x.kind == "int32":
        g.set_output(operation.outputs[0], g.one(_UNARY_FLOAT[code], [x.name]))
        return
    if code not in (OperationCode.LOGISTIC, OperationCode.TANH, *CLAMPS, OperationCode.HARD_SWISH) and \
            output.type not in FLOATS:
        raise Declined(f"{code.name} on {type_name(output.type)} is not supported")

    def apply(name: str) -> str:
        if code in (OperationCode.RELU1, OperationCode.RELU6):
            low, high = CLAMPS[code]
            return g.one("Clip", [name, g.constant(np.array(low, np.float32)),
                                  g.constant(np.array(high, np.float32))])
        if code == OperationCode.ELU:
            return _elu(g, name, alpha)
        if code == OperationCode.RSQRT:  # ONNX has no Rsqrt (a layer norm's 1 / sqrt(variance))
            return g.one("Reciprocal", [g.one("Sqrt", [name])])
        if code == OperationCode.LOGISTIC and output.type == T.TENSOR_FLOAT32 and \
                not _is_gate(g, operation.outputs[0]):
            return _logistic(g, name)
        return g.one(_UNARY_FLOAT[code], [name])

    if output.type in FLOATS:
        y = apply(x.name)
    elif output.type in QUANT8 and x.kind == "uint8":
        same = x.scale == output.scale and x.zero_point == internal_zero_point(output)
        if code in CLAMPS and same:
            fuse = {OperationCode.RELU: FuseCode.FUSED_RELU, OperationCode.RELU1: FuseCode.FUSED_RELU1,
                    OperationCode.RELU6: FuseCode.FUSED_RELU6}[code]
            y = fused_activation(g, x.name, fuse, output)
            if y == x.name:
                y = g.one("Identity", [x.name])
        else:
            start = len(g.nodes)
            if code == OperationCode.TANH:
                y = _tanh_as_sigmoid(g, x, output)
                if y is not None and proven_form(g, operation, operation.inputs[0], start, y, "sigmoid"):
                    g.set_output(operation.outputs[0], y)
                    return
            y = g.quantize(apply(g.dequantize(x)), output)
            if code == OperationCode.HARD_SWISH:
                y = proven_or_table(g, operation, operation.inputs[0], start, y)
    else:
        raise Declined(f"{code.name} on {type_name(output.type)} is not supported")
    g.set_output(operation.outputs[0], y)


def _tanh_as_sigmoid(g: GraphBuilder, x: Value, output: Operand) -> str | None:
    """8-bit TANH as one QLinearSigmoid (ORT's table of its 256 values): tanh(x) =
    2 * sigmoid(2 x) - 1, and on TANH's fixed output quantization (scale 1/128, internal
    zero point 128) round(128 * tanh(x)) + 128 = round(256 * sigmoid(2 x)): the sigmoid of
    the input on twice its scale (exact in float32), quantized with scale 1/256 and zero
    point 0. One node where DequantizeLinear > Tanh > QuantizeLinear are three, ORT having
    no quantized Tanh to fuse them into (an unrolled int8 GRU: 48 of them, ~0.2 us a node
    at its [1, 48]); taken where proven (proven_form). None where the output's quantization
    is not TANH's."""
    if output.scale != 1.0 / 128 or internal_zero_point(output) != 128:
        return None
    doubled = g.constant(np.array(np.float32(x.scale) * np.float32(2), np.float32), "scale")
    y_scale, y_zero = g.constant(np.array(1.0 / 256, np.float32), "scale"), g.constant(np.array(0, np.uint8), "zp")
    return g.one("QLinearSigmoid", [x.name, doubled, g.qparams(x)[1], y_scale, y_zero], domain=MS_DOMAIN)


def _is_gate(g: GraphBuilder, index: int, shifted: bool = True) -> bool:
    """Whether operand ``index`` is read only by MULs, inside the graph (a gate), or by
    an ADD or SUB whose result is such a gate (a GRU's 1 - z: an error e in the gate is
    an error e times the gated value either way)."""
    if index in g.subgraph.output_indexes:
        return False
    readers = g.readers(index)
    return bool(readers) and all(op.type == OperationCode.MUL or (
        shifted and op.type in (OperationCode.ADD, OperationCode.SUB) and _is_gate(g, op.outputs[0], False))
        for op in readers)


def _logistic(g: GraphBuilder, x: str) -> str:
    """float32 LOGISTIC, unless a gate, as 1 / (1 + exp(-x)). ORT's Sigmoid
    is off by up to ~1.7e-7 in absolute terms, which is all of a small result:
    sigmoid(-21) = 7.6e-10 comes out 0 (pose_landmark_full's pose score on a random image;
    LiteRT, XNNPACK included, is accurate relative to the result). Here Exp's relative
    error carries through: within ~2e-7 of the result everywhere; below -88.7 exp
    overflows and the result is 0 where the exact one is under 2**-127. Four passes, about
    twice Sigmoid's time (64k elements: 48 vs 24 us). A gate (read only by MULs inside the
    graph: squeeze-and-excitation; or through 1 - z: a GRU's, see _is_gate) keeps Sigmoid:
    it scales each gated value with an error of at most 1.7e-7 of it, the product's own
    float32 rounding, and ORT fuses it into the convolution before it as the convolution's
    activation (selfie_segmentation's ten gates: the four-pass form is four operations
    more each, ~1.06x LiteRT instead of ~1.0x). The quantized path keeps Sigmoid: its error is far below a step."""
    one = g.constant(np.array(1.0, np.float32))
    return g.one("Reciprocal", [g.one("Add", [g.one("Exp", [g.one("Neg", [x])]), one])])


def _elu(g: GraphBuilder, x: str, alpha: float) -> str:
    """ELU as relu(x) + alpha * (exp(min(x, 0)) - 1): ORT's Elu is a scalar loop (16x64x64:
    95 us), these five vectorized passes 35 us (misc_ops' ELU layer). exp(m) - 1 for m <= 0 is
    within ~6e-8 absolute of the reference's expm1 form (as ORT's Elu); inf gives inf, -inf
    gives -alpha."""
    exp = g.one("Exp", [g.one("Min", [x, g.constant(np.array(0.0, np.float32))])])
    negative = g.one("Mul", [g.one("Sub", [exp, g.constant(np.array(1.0, np.float32))]),
                             g.constant(np.array(alpha, np.float32))])
    return g.one("Add", [g.one("Relu", [x]), negative])


@lowers(OperationCode.PRELU)
def lower_prelu(g: GraphBuilder, operation: Operation) -> None:
    output = g.operand(operation.outputs[0])
    if output.type in FLOATS and operation.inputs[0] in g.padded and reads_padded(g, operation, operation.inputs[0]):
        x = g.blocked_value(operation.inputs[0])  # channels padded to the block: alpha 0 there, PRELU(0) = 0
        real = g.operand(operation.inputs[0]).dimensions[3]
        known = np.broadcast_to(g.raw_constant(operation.inputs[1]).astype(np.float32).reshape(-1), (real,))
        y = _prelu_blocked(g, x, np.pad(known, (0, x.dims[3] - real)))
        set_channels(g, operation.outputs[0], y, x.dims[3])
        return
    x, alpha = g.value(operation.inputs[0]), g.value(operation.inputs[1])
    if not all(alpha.dims) or alpha.rank > x.rank:
        raise Declined("PRELU needs alpha of a known shape, of no higher rank than the input")
    # (an input dimension known only at run time, a free batch, is checked by that run: where it
    # differs from alpha's the broadcast fails it, as the reference's preparation does)
    if any(a not in (1, d) for a, d in zip(alpha.dims[::-1], x.dims[::-1]) if d):
        raise Declined("alpha must broadcast to the input's shape")
    if output.type in FLOATS:
        known = g.raw_constant(operation.inputs[1])
        # The faster forms multiply alpha by zeros where x >= 0 (or by x = 0), which is NaN
        # for an infinite or NaN alpha where PRELU gives x: they need a finite constant.
        finite = known is not None and known.size > 0 and bool(np.isfinite(known).all())
        if finite and x.rank == 4 and x.dims[3] and all(d == 1 for d in alpha.dims[:-1]):
            y = _prelu_blocked(g, x, known.astype(np.float32).reshape(-1))
        elif finite and bool(np.all(known.astype(np.float32) <= 1.0)):
            # alpha <= 1: x >= alpha * x exactly where x >= 0, so the larger of the two is
            # PRELU's value, in two ops instead of four
            y = g.one("Max", [x.name, g.one("Mul", [x.name, alpha.name])])
        elif finite:
            y = _prelu(g, x.name, alpha.name)
        else:  # alpha given at execution, or not finite: PRELU's own definition (x = -0 gives -0)
            zero = g.constant(np.array(0.0, np.float32))
            scaled = g.one("Mul", [x.name, alpha.name])
            if any(d == 0 and a > 1 for a, d in zip(alpha.dims[::-1], x.dims[::-1])):
                # a dimension of x known only at run time may be 1 where alpha's is larger:
                # exact_where's sides must have the output's shape, the product's
                x = Value(g.one("Expand", [x.name, g.one("Shape", [scaled])]), "float", list(x.dims))
            y = exact_where(g, g.one("GreaterOrEqual", [x.name, zero]), x,
                            Value(scaled, "float", list(x.dims)))
    elif output.type in QUANT8 and x.kind == "uint8":
        y = _quantized_prelu(g, operation, x, output)
    else:
        raise Declined(f"PRELU on {type_name(output.type)} is not supported")
    g.set_output(operation.outputs[0], y)


#: the most constant alpha values a quantized PRELU's table covers (256 entries each)
_PRELU_TABLE_ALPHAS = 4096


def _quantized_prelu(g: GraphBuilder, operation: Operation, x: Value, output: Operand) -> str:
    """8-bit PRELU with a constant alpha as a Gather from the table of the reference's
    fixed point (``quant_math.prelu_fixed_point``, Android's two quantized multipliers)
    of every internal stored value against every alpha value: 256 entries per alpha value,
    indexed by u * A + k for the internal value u and alpha's flat position k (a constant
    of alpha's shape, broadcast against the input as PRELU broadcasts). One alpha value
    (TFLite's LEAKY_RELU as the importer writes it) needs only u. An alpha computed at run
    time (or of more values) indexes the 65,536-entry table of every pair of stored values
    by u * 256 + its own internal value. (The results depend on each pair through the int32
    product x * alpha, which no ONNX quantized operator rounds as the fixed point does.)"""
    known = g.raw_constant(operation.inputs[1])
    alpha = g.operand(operation.inputs[1])
    if known is None or known.size > _PRELU_TABLE_ALPHAS:
        given = g.value(operation.inputs[1])
        if given.kind != "uint8":
            raise Declined("a quantized PRELU's alpha must be quantized as 8 bits")
        table = prelu_table(g.operand(operation.inputs[0]), alpha, requantize.stored_values(alpha), output)
        positions = g.one("Add", [g.one("Mul", [stored_positions(g, x.name),
                                                g.constant(np.array(256, np.int32))]),
                                  g.one("Cast", [given.name], to=TensorProto.INT32)])
        return gather_table(g, table, positions)
    if known.size == 0:
        raise Declined("a quantized PRELU's alpha has no values")
    flat = known.reshape(-1)
    uniform = bool(np.all(flat == flat[0]))
    values = flat[:1] if uniform else flat
    table = prelu_table(g.operand(operation.inputs[0]), alpha, values, output)
    positions = stored_positions(g, x.name)
    if not uniform:
        count = np.array(values.size, np.int32)
        offsets = np.arange(values.size, dtype=np.int32).reshape(known.shape)
        positions = g.one("Add", [g.one("Mul", [positions, g.constant(count)]), g.constant(offsets, "alpha_index")])
    return gather_table(g, table, positions)


def prelu_table(source: Operand | OperandType, alpha: Operand | OperandType, alpha_stored: np.ndarray,
                output: Operand | OperandType) -> np.ndarray:
    """The reference's 8-bit PRELU (``quant_math.prelu_fixed_point``) of each internal
    value of ``source`` (uint8; int8 as + 128) by each stored alpha value: [256, alpha
    values] in ``output``'s internal encoding."""
    stored = requantize.stored_values(source).astype(np.int64)[:, None]
    alphas = np.asarray(alpha_stored, dtype=np.int64).reshape(1, -1)
    info = np.iinfo(np.uint8 if output.type == T.TENSOR_QUANT8_ASYMM else np.int8)
    table = prelu_fixed_point(stored - source.zero_point, alphas - alpha.zero_point, source.scale, alpha.scale,
                              output.scale, output.zero_point, info.min, info.max)
    return encode(table.astype(info.dtype), output)


def stored_positions(g: GraphBuilder, name: str) -> str:
    """An 8-bit value's internal stored values (uint8; int8 as + 128) as int32 Gather indices."""
    return g.one("Cast", [name], to=TensorProto.INT32)


def gather_table(g: GraphBuilder, table: np.ndarray, positions: str) -> str:
    """The entries of a constant table (flattened) at int32 ``positions``."""
    return g.one("Gather", [g.constant(table.reshape(-1), "table"), positions], axis=0)


#: the binary operations whose 8-bit form with a one-element constant operand is a table
_TABLE_BINARY = (OperationCode.ADD, OperationCode.SUB, OperationCode.MUL)


def _scalar_operand_source(g: GraphBuilder, operation: Operation) -> int | None:
    """The operand index of the 8-bit value that 8-bit ADD / SUB / MUL ``operation``
    combines with a constant of one element (the importer's requantizing RELU, a MUL by
    2**k with the activation fused; a scaling or offset of a tensor), or None."""
    if operation.type not in _TABLE_BINARY or g.isolated:
        return None
    for position in (0, 1):
        source, other = operation.inputs[position], operation.inputs[1 - position]
        if g.operand(other).type not in QUANT8 or g.operand(source).type not in QUANT8:
            return None
        known = g.raw_constant(other)
        if known is not None and known.size == 1 and g.raw_constant(source) is None \
                and g.value(source).kind == "uint8":
            return source
    return None


def _reference_table(g: GraphBuilder, operation: Operation, source: int) -> tuple[bytes, np.ndarray | None]:
    """(key, table): the reference's own kernel of ``operation`` run on every internal
    value of its 8-bit input ``source`` (its other inputs constants of one element, or of
    one value repeated), in the output's internal encoding (256 entries; None where the
    reference refuses). ``key`` digests everything the table depends on (quantizations,
    constants, the operation)."""
    digest = hashlib.sha256(repr(int(operation.type)).encode())
    inputs = []
    for index in operation.inputs:
        operand = g.operand(index)
        digest.update(repr((index == source, int(operand.type), float(operand.scale),
                            int(operand.zero_point))).encode())
        if index == source:
            inputs.append(Tensor(operand.type, (256,), operand.scale, operand.zero_point, None,
                                 requantize.stored_values(operand)))
            continue
        raw = np.asarray(g.raw_constant(index))
        digest.update(np.ascontiguousarray(raw).tobytes())
        if raw.size > 1 and np.all(raw == raw.reshape(-1)[0]):
            raw = raw.reshape(-1)[:1]  # one value in every position (a PRELU's one alpha in C channels)
        shape = () if not operand.dimensions else (raw.size,)  # broadcast over the 256 values
        inputs.append(Tensor(operand.type, shape, operand.scale, operand.zero_point, None, raw.reshape(shape)))
    output = g.operand(operation.outputs[0])
    digest.update(repr((int(output.type), float(output.scale), int(output.zero_point))).encode())
    key = digest.digest()
    cached = _TABLES.get(key, _MISSING)  # one read: another thread may empty the cache between two
    if cached is not _MISSING:
        return key, cached
    code = OperationCode(operation.type)
    result = OperandType(output.type, [256], output.scale, output.zero_point)
    try:
        values = np.asarray(get_operation(code).execute(ExecutionContext(code, inputs, [result]))[0])
        table = encode(values.reshape(-1).astype(values.dtype), output) if values.size == 256 else None
    except Exception:  # noqa: BLE001 - values the reference refuses: the ONNX form as it is
        table = None
    _remember(_TABLES, key, table)
    return key, table


#: the reference's tables (by _reference_table's key) and the values on which the ONNX
#: forms miss them (None: the Gather): a model prepared again, or an operation repeated
#: with the same quantizations and constants, runs the reference and probes once
_TABLES: dict[bytes, np.ndarray | None] = {}
_FORM_PROVEN: dict[bytes, np.ndarray | None] = {}
_TABLE_LIMIT = 4096
#: a key the caches do not hold (their values may be None)
_MISSING = object()


def _remember(cache: dict[bytes, np.ndarray | None], key: bytes, value: np.ndarray | None) -> None:
    """``cache[key] = value``, the cache emptied first when it holds _TABLE_LIMIT entries (a
    process preparing ever new quantizations keeps caching the newest, in bounded memory)."""
    if len(cache) >= _TABLE_LIMIT:
        cache.clear()
    cache[key] = value


def proven_or_table(g: GraphBuilder, operation: Operation, source: int, start: int, fast: str) -> str:
    """8-bit ``operation``, a function of its one input ``source``'s stored value (the
    others constants): its ONNX form ``fast`` (the nodes emitted from ``start``: a
    QLinearMul / QLinearAdd of a constant, ORT's quantized HardSwish), where that form run
    on all 256 internal values in ONNX Runtime with the device's session options gives the
    reference's values bit for bit. Where it misses on a few values (_CORRECTIONS at most),
    each of them is set right by a Where(Equal(x, v), the reference's value, ...) after it,
    where a probe of that proves it. Otherwise those nodes are dropped for a Gather from
    the reference's own results on the 256 values (QLinearMul's float rescale is not
    Android's fixed-point product: it differs by a step on a few values of most
    quantizations). A Gather costs ~7x ORT's quantized HardSwish, one correction about as
    much as the HardSwish (1x112x112x16 uint8, one thread: HardSwish 77 us, with one
    correction 150, Gather 525). A support query (``g.isolated``: no constants' bytes)
    keeps ``fast``."""
    if g.isolated:
        return fast
    key, table = _reference_table(g, operation, source)
    if table is None:
        return fast
    x = g.value(source).name
    y = fast
    misses = _FORM_PROVEN.get(key, _MISSING)  # one read (see _reference_table)
    if misses is not _MISSING:
        if misses is not None:
            y = _corrected(g, x, fast, misses, table)
    else:
        found = _probe(g, x, start, fast)
        misses = None
        if found is not None:
            misses = np.flatnonzero(found != table)
            if 0 < misses.size <= _CORRECTIONS:
                # the corrections emitted once: probed as they stand, kept where proven
                y = _corrected(g, x, fast, misses, table)
                checked = _probe(g, x, start, y)
                if checked is None or not np.array_equal(checked, table):
                    misses = None
            elif misses.size:
                misses = None
        _remember(_FORM_PROVEN, key, misses)
    if misses is None:
        del g.nodes[start:]
        return gather_table(g, table, stored_positions(g, x))
    return y


#: the most values on which proven_or_table corrects a form rather than take the Gather
_CORRECTIONS = 4


def proven_form(g: GraphBuilder, operation: Operation, source: int, start: int, result: str, form: str) -> bool:
    """Whether the nodes emitted from ``start`` (computing ``result``, a form named ``form``
    of 8-bit ``operation``, a function of its input ``source``'s stored value) give the
    reference's values (_reference_table) bit for bit on all 256 internal values in ONNX
    Runtime with the device's session options; if not, those nodes are dropped, for the
    caller's general form. Proven once per table and form (a model prepared again, or an
    operation repeated with the same quantizations and constants, probes once). A support
    query (``g.isolated``) keeps the nodes: the general form answers it the same."""
    if g.isolated:
        return True
    key, table = _reference_table(g, operation, source)
    proven = False
    if table is not None:
        key = key + form.encode()
        known = _FORM_PROVEN.get(key, _MISSING)  # one read (see _reference_table)
        if known is _MISSING:
            found = _probe(g, g.value(source).name, start, result)
            known = None if found is None or not np.array_equal(found, table) else np.zeros(0, np.int64)
            _remember(_FORM_PROVEN, key, known)
        proven = known is not None
    if not proven:
        del g.nodes[start:]
    return proven


def _corrected(g: GraphBuilder, x: str, y: str, misses: np.ndarray, table: np.ndarray) -> str:
    """``y`` with its value where ``x`` (internal values) is each of ``misses`` replaced by
    ``table``'s."""
    for value in misses:
        equal = g.one("Equal", [x, g.constant(np.array(value, np.uint8))])
        y = g.one("Where", [equal, g.constant(np.array(table[value], np.uint8)), y])
    return y


def _probe(g: GraphBuilder, source: str, start: int, result: str) -> np.ndarray | None:
    """The 256 values ``result`` takes in ONNX Runtime when the nodes emitted from ``start``
    are copied into a probe with ``source`` a uint8 vector of all 256 internal values;
    None where they read a value the copy lacks or the runtime refuses them."""
    nodes = list(g.nodes[start:])
    produced = {name for node in nodes for name in node.output}
    initializers = g.initializer_index().by_key
    needed = {name for node in nodes for name in node.input if name and name not in produced and name != source}
    if any(name not in initializers for name in needed):
        return None
    if result == source:
        return np.arange(256)
    outputs = probe_form(nodes, [initializers[name] for name in sorted(needed)],
                         {source: np.arange(256, dtype=np.uint8)}, [(result, TensorProto.UINT8, None)])
    if not outputs or outputs[0].size != 256:  # (None: refused, or no runtime: the table)
        return None
    return outputs[0].reshape(-1)


def _prelu_blocked(g: GraphBuilder, x: Value, alpha: np.ndarray) -> str:
    """PRELU with a constant per-channel alpha on a value ORT holds in NCHWc, in operators
    it keeps there: relu(x) + (-alpha) * relu(-x), the two scalings as 1x1 depthwise
    convolutions (ORT adds the relu(x) inside the second one). Exact for any alpha: -x and
    -alpha are exact, one of the two terms is zero, and (-alpha) * (-x) is alpha * x
    rounded once. Max / Min have no NCHWc kernel, so the other forms cost two reorders
    per PRELU (iris_landmark: 1.75 -> 1.43 ms). With channels off the block ORT runs the
    scalings as plain depthwise convolutions, still faster than Max and Mul (hand_recrop's
    8-channel PRELUs at 128x128)."""
    channels = x.dims[3]
    alpha = np.broadcast_to(alpha, (channels,))
    source = to_nchw(g, x.name, False)
    negative_part = g.one("Relu", [channel_scale(g, source, -np.ones(channels, np.float32))])
    y = g.one("Add", [channel_scale(g, negative_part, -alpha), g.one("Relu", [source])])
    return from_nchw(g, y, False)


def _prelu(g: GraphBuilder, x: str, alpha: str) -> str:
    """PRELU in float as relu(x) + min(x, 0) * alpha: the same values as ONNX PRelu (x
    where x >= 0, alpha * x below), but ORT runs PRelu's per-channel broadcast element
    by element (90% of MediaPipe's face and iris models' time, 10x slower than this
    form, whose broadcast multiply is vectorized and whose ops stay in ORT's NCHWc layout)."""
    negative = g.one("Min", [x, g.constant(np.array(0.0, np.float32))])
    return g.one("Add", [g.one("Relu", [x]), g.one("Mul", [negative, alpha])])


@lowers(OperationCode.MAXIMUM, OperationCode.MINIMUM)
def lower_maximum(g: GraphBuilder, operation: Operation) -> None:
    """Max / Min of int32, or of quant8 values in the output's quantization (then
    the integer comparison is the real one's): inputs in another are requantized first by
    the reference's table (_requantized; requantizing is monotone). A constant of lower
    rank comes at the output's (at_rank: a uint8 Min of a [1] constant over [1, 96, 96,
    1], ESPCN's clip, 49 us of its 180). Float: _float_maximum (Android's std::max / std::min)."""
    a, b = g.value(operation.inputs[0]), g.value(operation.inputs[1])
    output = g.operand(operation.outputs[0])
    if output.type in FLOATS and a.kind == b.kind == "float":
        g.set_output(operation.outputs[0], _float_maximum(g, operation.type, a, b, output))
        return
    names = [at_rank(g, a, len(output.dimensions)), at_rank(g, b, len(output.dimensions))]
    if output.type in QUANT8:
        if a.kind != "uint8" or b.kind != "uint8":
            raise Declined("the inputs must be quantized as the output")
        if any(v.scale != output.scale or v.zero_point != internal_zero_point(output) for v in (a, b)):
            names = _requantized(g, operation.type, operation.inputs[:2], output)
    elif output.type not in (*FLOATS, T.TENSOR_INT32) or a.kind != b.kind:
        raise Declined(f"{OperationCode(operation.type).name} on {type_name(output.type)} is not supported")
    op_type = "Max" if operation.type == OperationCode.MAXIMUM else "Min"
    if output.type in QUANT8 and not has_kernel(op_type, TensorProto.UINT8):
        # releases before 1.24 have no uint8 Max / Min: the same choice by a comparison,
        # whose uint8 kernel came in 1.21
        if not onnxruntime_at_least(UINT8_LESS_VERSION):
            raise Declined(f"this onnxruntime has no uint8 {op_type} or Less kernel (1.21 has Less, 1.24 {op_type})")
        first, second = names if operation.type == OperationCode.MINIMUM else names[::-1]
        g.set_output(operation.outputs[0], g.one("Where", [g.one("Less", names), first, second]))
        return
    g.set_output(operation.outputs[0], g.one(op_type, names))


def _float_maximum(g: GraphBuilder, code: int, a: Value, b: Value, output: Operand) -> str:
    """Float MAXIMUM / MINIMUM as Android's std::max / std::min: MAXIMUM(a, b) is b where
    a < b, else a (so a NaN ``a`` gives NaN, a NaN ``b`` gives ``a``, and of -0 and +0 the
    first); MINIMUM is b where b < a, else a. ONNX Runtime's Max / Min (1.32) give NaN where
    either is NaN and of two equal values the second (the scalar where one is). So: b one
    constant c (not NaN) over an ``a`` of the output's shape: Relu for MAXIMUM(a, +0), else
    Clip(a, c, inf) / Clip(a, -inf, c), which keep ``a`` on a tie and a NaN ``a`` as
    Android does (as fast as Max); b a constant without NaN or zero: Max / Min (no NaN b,
    no tie of two zeros); otherwise Where(a < b, b, a) / Where(b < a, b, a) with the bits
    kept (exact_where; up to 30x Max's time on a random condition)."""
    maximum = code == OperationCode.MAXIMUM
    rank = len(output.dimensions)
    c = b.const
    if c is not None and c.size == 1 and not np.isnan(c).any() and list(a.dims) == list(output.dimensions):
        bound = np.array(c.reshape(()), np.float32)
        if maximum and bound == 0 and not np.signbit(bound):
            return g.one("Relu", [a.name])
        infinity = g.constant(np.array(math.inf if maximum else -math.inf, np.float32))
        limit = g.constant(bound)
        return g.one("Clip", [a.name, limit, infinity] if maximum else [a.name, infinity, limit])
    names = [at_rank(g, a, rank), at_rank(g, b, rank)]
    if c is not None and not (np.isnan(c) | (c == 0)).any():
        return g.one("Max" if maximum else "Min", names)
    condition = g.one("Less", names if maximum else names[::-1])
    first, second = (Value(name, v.kind, list(v.dims), const=v.const) for name, v in zip(names[::-1], (b, a)))
    if not (_never_negative_zero(first) or _never_negative_zero(second)):
        # exact_where stacks the two sides: both at the output's shape (the condition's)
        shape = g.one("Shape", [condition])
        first, second = (v if list(v.dims) == list(output.dimensions) and 0 not in v.dims else
                         Value(g.one("Expand", [v.name, shape]), v.kind, list(output.dimensions))
                         for v in (first, second))
    return exact_where(g, condition, first, second)


def _requantized(g: GraphBuilder, code: int, inputs: list[int], output: Operand) -> list[str]:
    """The 8-bit ``inputs`` of selection ``code`` each requantized into ``output``'s
    quantization as a Gather from the reference's table (requantize.py; one already in it as
    it is); declined unless the tables give the reference's results for every value."""
    a, b = (g.operand(i) for i in inputs)
    if not requantize.proven(code, a, b, output):
        raise Declined("requantizing by table does not give the reference's values")
    names = []
    for index, operand in zip(inputs, (a, b)):
        value = g.value(index)
        if (operand.scale, operand.zero_point) == (output.scale, output.zero_point):
            names.append(value.name)
            continue
        positions = g.one("Cast", [value.name], to=TensorProto.INT32)
        table = encode(requantize.table(operand, output), output)
        names.append(g.one("Gather", [g.constant(table, "table"), positions], axis=0))
    return names


_COMPARISONS = {OperationCode.EQUAL: "Equal", OperationCode.NOT_EQUAL: "Equal", OperationCode.GREATER: "Greater",
                OperationCode.GREATER_EQUAL: "GreaterOrEqual", OperationCode.LESS: "Less",
                OperationCode.LESS_EQUAL: "LessOrEqual"}


#: operations whose result is a function of their inputs' values alone, never a run-time
#: error: one the bounds fix completely may be a constant
_FOLDABLE = (OperationCode.ADD, OperationCode.SUB, OperationCode.MUL, OperationCode.DIV, OperationCode.CAST,
             OperationCode.MINIMUM, OperationCode.MAXIMUM, OperationCode.FLOOR, OperationCode.NEG, OperationCode.ABS,
             OperationCode.SELECT, OperationCode.RESHAPE, OperationCode.SQUEEZE, OperationCode.EXPAND_DIMS,
             OperationCode.STRIDED_SLICE, OperationCode.SLICE, OperationCode.TRANSPOSE, OperationCode.TILE,
             OperationCode.CONCATENATION, OperationCode.PACK, *_COMPARISONS, *(OperationCode.LOGICAL_AND,
                                                                                 OperationCode.LOGICAL_OR,
                                                                                 OperationCode.LOGICAL_NOT))


def fixed_by_bounds(g: GraphBuilder, operation: Operation) -> bool:
    """An operation whose one output value_ranges.py fixes element by element (low ==
    high: a decode head's x // 65536 of an index below 256, its product and the rest of
    TensorFlow's FLOOR_MOD of it) as that constant, its output set: int32 and booleans, and
    floats without a zero (whose sign, -0 or +0, the bounds do not tell). False otherwise."""
    if operation.type not in _FOLDABLE or len(operation.outputs) != 1:
        return False
    index = operation.outputs[0]
    operand = g.operand(index)
    known = g.ranges.get(index)
    dims = list(operand.dimensions)
    if (known is None or not dims or not all(dims) or not np.array_equal(known[0], known[1])
            or operand.type not in (T.TENSOR_INT32, T.TENSOR_BOOL8, T.TENSOR_FLOAT32)
            or (operand.type == T.TENSOR_FLOAT32 and not np.all(known[0] != 0))):
        return False
    kind = {T.TENSOR_INT32: "int32", T.TENSOR_BOOL8: "bool", T.TENSOR_FLOAT32: "float"}[operand.type]
    array = np.broadcast_to(known[0], dims).astype({"int32": np.int32, "bool": np.bool_, "float": np.float32}[kind])
    g.values[index] = Value(g.constant(array, "fixed"), kind, dims, const=array)
    return True


def identity_by_bounds(g: GraphBuilder, operation: Operation) -> bool:
    """An int32 ADD / SUB of 0 or MUL by 1 (the operand the bounds fix so, value_ranges.py:
    the folded rest of a decode head's FLOOR_MOD) as its other input itself, its output
    set; False where it does not apply (floats: x + 0 turns -0 into +0)."""
    code = operation.type
    if code not in (OperationCode.ADD, OperationCode.SUB, OperationCode.MUL) or len(operation.inputs) != 3:
        return False
    output = g.operand(operation.outputs[0])
    if output.type != T.TENSOR_INT32 or g.raw_constant(operation.inputs[2]) is None \
            or int(g.scalar(operation.inputs[2])) != 0:
        return False
    neutral = 1 if code == OperationCode.MUL else 0
    sides = (0, 1) if code != OperationCode.SUB else (0,)  # x - 0 only
    for kept in sides:
        other = g.ranges.get(operation.inputs[1 - kept])
        if other is None or not (np.all(other[0] == neutral) and np.all(other[1] == neutral)):
            continue
        value = g.value(operation.inputs[kept])
        if value.dims == list(output.dimensions) and all(value.dims):
            g.values[operation.outputs[0]] = value
            return True
    return False


def decided_constant(g: GraphBuilder, operation: Operation) -> bool:
    """A boolean operation whose result value_ranges.py decides for every input (a bounds
    check of an index whose bounds lie inside: a decode head's gather_nd guards) as that
    constant, its output set; False where it is not decided or its shape is not known."""
    index = operation.outputs[0]
    known = decided(g.ranges.get(index))
    dims = list(g.operand(index).dimensions)
    if known is None or not all(dims):
        return False
    array = np.broadcast_to(known, dims).copy()
    g.values[index] = Value(g.constant(array, "decided"), "bool", dims, const=array)
    return True


@lowers(*_COMPARISONS)
def lower_comparison(g: GraphBuilder, operation: Operation) -> None:
    """Broadcasting comparisons to BOOL8. Quantized inputs sharing one quantization compare
    their stored integers (as int32); with different ones their real values, dequantized in
    float32 as (q - zero_point) * scale like the reference; booleans compare as 0 / 1. One
    the inputs' bounds decide is a constant (decided_constant)."""
    a, b = g.value(operation.inputs[0]), g.value(operation.inputs[1])
    if a.kind == b.kind and decided_constant(g, operation):
        return
    if a.kind != b.kind:
        raise Declined("the inputs have different types")
    if a.kind == "uint8" and (a.scale, a.zero_point) != (b.scale, b.zero_point):
        left, right = g.dequantize(a), g.dequantize(b)
    elif a.kind in ("uint8", "bool"):
        left, right = (g.one("Cast", [v.name], to=TensorProto.INT32) for v in (a, b))
    else:
        left, right = a.name, b.name
    y = g.one(_COMPARISONS[OperationCode(operation.type)], [left, right])
    if operation.type == OperationCode.NOT_EQUAL:
        y = g.one("Not", [y])  # IEEE: NaN != NaN, as Not(Equal) gives
    g.set_output(operation.outputs[0], y)


def _never_negative_zero(value: Value) -> bool:
    """Whether ``value`` holds no -0: not a float, or a constant without one."""
    return value.kind != "float" or (value.const is not None
                                     and not bool(np.any((value.const == 0) & np.signbit(value.const))))


def _from_not(g: GraphBuilder, name: str) -> str | None:
    """The input of the Not node that writes ``name`` (ORT's optimizer would fuse it into a
    Where reading ``name``); None where no Not writes it."""
    node = g.node_index().by_key.get(name)
    return node.input[0] if node is not None and node.op_type == "Not" else None


def exact_where(g: GraphBuilder, condition: str, first: Value, second: Value) -> str:
    """Where(condition, first, second) with every picked value's bits kept. ONNX Runtime's
    float Where (1.32) gives +0 where it picks -0 from ``first`` (its X input: it merges the
    two sides by testing X's pick against zero), and its optimizer rewrites Where(Not(c),
    a, b) as Where(c, b, a). So Where serves where X can hold no -0: both sides constants
    without one; ``first`` such a constant (the condition fed as no Not's output, so that
    it stays X); ``second`` such a constant (Where of the negated condition, ``second`` as
    X: the Not's input where a Not wrote the condition, else Xor with true, which ORT does
    not fuse). Otherwise GatherElements picks from the two stacked (a copy of the bits): on
    a [1, 112, 112, 16] SELECT ~0.33 ms whatever the condition, where Where takes ~1.9 ms
    on a random one (it branches per element) and ~0.13 ms on runs of 8; ~2 us more on a
    few elements."""
    safe_first, safe_second = _never_negative_zero(first), _never_negative_zero(second)
    if safe_first and safe_second:
        return g.one("Where", [condition, first.name, second.name])
    if safe_first:
        if _from_not(g, condition) is not None:
            condition = g.one("Xor", [condition, g.constant(np.array(False))])
        return g.one("Where", [condition, first.name, second.name])
    if safe_second:
        negated = _from_not(g, condition)
        if negated is None or _from_not(g, negated) is not None:
            negated = g.one("Xor", [condition, g.constant(np.array(True))])
        return g.one("Where", [negated, second.name, first.name])
    axis = g.constant(np.array([0], np.int64))
    stacked = g.one("Concat", [g.one("Unsqueeze", [side.name, axis]) for side in (second, first)], axis=0)
    picks = g.one("Unsqueeze", [g.one("Cast", [condition], to=TensorProto.INT64), axis])  # 1: first
    return g.one("Squeeze", [g.one("GatherElements", [stacked, picks], axis=0), axis])


@lowers(OperationCode.SELECT)
def lower_select(g: GraphBuilder, operation: Operation) -> None:
    """Where(condition, input1, input2) (exact_where: a float -0 is kept); quantized inputs
    in another quantization than the output's are requantized first by the reference's
    table (_requantized: QuantizeLinear would round halves to even)."""
    condition, a, b = (g.value(i) for i in operation.inputs[:3])
    output = g.operand(operation.outputs[0])
    if condition.kind != "bool":
        raise Declined("the condition must be BOOL8")
    known = decided(g.ranges.get(operation.inputs[0]))
    if known is not None and (known.all() or not known.any()):
        # a condition value_ranges.py decides, the same for every element: the input it
        # picks, where that is the output as it stands (its shape, its quantization)
        picked = a if known.all() else b
        if (picked.dims == list(output.dimensions) and all(picked.dims)
                and (output.type not in QUANT8 or (picked.scale, picked.zero_point)
                     == (output.scale, internal_zero_point(output)))):
            g.values[operation.outputs[0]] = picked
            return
    names = [a.name, b.name]
    if output.type in QUANT8 and a.kind == b.kind == "uint8" and any(
            v.scale != output.scale or v.zero_point != internal_zero_point(output) for v in (a, b)):
        names = _requantized(g, operation.type, operation.inputs[1:3], output)
        g.set_output(operation.outputs[0], g.one("Where", [condition.name, *names]))
        return
    for v in (a, b):
        check_same_quantization(v, output)
    g.set_output(operation.outputs[0], exact_where(g, condition.name, a, b))


_LOGICAL = {OperationCode.LOGICAL_AND: "And", OperationCode.LOGICAL_OR: "Or", OperationCode.LOGICAL_NOT: "Not"}


@lowers(*_LOGICAL)
def lower_logical(g: GraphBuilder, operation: Operation) -> None:
    inputs = [g.value(i) for i in operation.inputs]
    if any(v.kind != "bool" for v in inputs):
        raise Declined(f"{OperationCode(operation.type).name} takes BOOL8 tensors")
    if decided_constant(g, operation):
        return
    g.set_output(operation.outputs[0], g.one(_LOGICAL[OperationCode(operation.type)], [v.name for v in inputs]))


@lowers(OperationCode.POW)
def lower_pow(g: GraphBuilder, operation: Operation) -> None:
    base, exponent = g.value(operation.inputs[0]), g.value(operation.inputs[1])
    if base.kind != "float" or exponent.kind != "float":
        raise Declined("POW takes float tensors")
    g.set_output(operation.outputs[0], g.one("Pow", [base.name, exponent.name]))
