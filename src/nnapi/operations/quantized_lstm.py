"""QUANTIZED_16BIT_LSTM and QUANTIZED_LSTM: LSTM cells in integer arithmetic.

Both keep gate pre-activations as int16 fixed point with 3 integer bits (Q3.12), gate
activations as Q0.15 and the cell state as int16 with a power-of-two scale, and compute
sigmoid and tanh with gemmlowp's fixed-point algorithms (reimplemented here, vectorized
over int64 arrays that hold the int16 raw values; the ``_wrap16`` calls reproduce int16
wrap-around where gemmlowp adds without saturating).

QUANTIZED_16BIT_LSTM (feature level 3): uint8 input and output (scale 1/128, zero point
128), uint8 weights sharing one scale and zero point, int32 biases (scale
weights_scale / 128), a QUANT16_SYMM cell state with scale 2^-11. The fully connected
part accumulates in int32 and is rescaled to Q3.12 by 4096 * bias_scale; its weight
matrix is laid out as Android's kernel lays it out (see ``execute``).

QUANTIZED_LSTM (feature level 4): int8 asymmetric input and output, int8 symmetric
weights, optional CIFG / peephole (QUANT16_SYMM) / projection / layer normalization
(QUANT16_SYMM weights). Each matrix product is rescaled into the gate's intermediate
scale (inputs 26-29) with a fixed-point multiplier; without layer normalization the gate
goes straight to the activation, so its intermediate scale is Q3.12's 2^-12 (as in
TFLite's integer LSTM) and the gate bias (scale input_scale * weights_scale) joins the
input product. With layer normalization the bias is added after normalization in units of
layer_norm_scale / 1024 (TFLite's integer layer norm). The hidden state o * tanh(c) is
quantized with inputs 30/31, projected (bias scale weights_scale * hidden_scale) into the
output state's quantization and clipped. Departures from Android's kernel, which has no
CTS vectors: the peepholes of the input and forget gates read the previous cell state
(the spec's equations), the projection subtracts the hidden state's zero point, and the
clipping thresholds are quantized with the scale of the value they clip.
"""

from __future__ import annotations

import numpy as np

from nnapi.codes import OperandCode, OperationCode
from nnapi.operations.base import ExecutionContext, Operation, Shape, Tensor, ValidationContext, register
from nnapi.operations.common import quantize_multiplier, round_half_away

T = OperandCode

# --- gemmlowp fixed point on int16 raw values -----------------------------------------


def _wrap16(x: np.ndarray) -> np.ndarray:
    """int16 two's-complement wrap-around of int64 values."""
    return ((x + 32768) & 0xFFFF) - 32768


def _clamp16(x: np.ndarray) -> np.ndarray:
    return np.clip(x, -32768, 32767)


def _c_div(numerator: np.ndarray, denominator: int) -> np.ndarray:
    """C integer division (truncates toward zero)."""
    quotient = np.abs(numerator) // denominator
    return np.where(numerator < 0, -quotient, quotient)


def _srdhm16(a: np.ndarray, b: np.ndarray | int) -> np.ndarray:
    """SaturatingRoundingDoublingHighMul for int16: round(a * b / 2^15), saturated."""
    product = np.asarray(a, dtype=np.int64) * np.asarray(b, dtype=np.int64)
    nudged = product + np.where(product >= 0, 1 << 14, 1 - (1 << 14))
    high = _c_div(nudged, 1 << 15)
    return np.where((np.asarray(a) == -32768) & (np.asarray(b) == -32768), 32767, high)


def _rounding_divide_by_pot(x: np.ndarray, exponent) -> np.ndarray:
    """Round-to-nearest (ties away from zero) arithmetic right shift; exponent may be an array."""
    exponent = np.asarray(exponent, dtype=np.int64)
    mask = (np.int64(1) << exponent) - 1
    remainder = x & mask
    threshold = (mask >> 1) + (x < 0)
    return (x >> exponent) + (remainder > threshold)


def _saturating_mul_by_pot16(x: np.ndarray, exponent: int) -> np.ndarray:
    """gemmlowp SaturatingRoundingMultiplyByPOT on int16 raw values."""
    if exponent <= 0:
        return _rounding_divide_by_pot(x, -exponent) if exponent else x
    threshold = (1 << (15 - exponent)) - 1
    shifted = _wrap16(x << exponent)
    return np.where(x > threshold, 32767, np.where(x < -threshold, -32768, shifted))


def _constant16(value32: int) -> int:
    """gemmlowp's int16 constant from its Q0.31 (or Qn.31-n) int32 spelling."""
    return int(_rounding_divide_by_pot(np.int64(value32), 16))


_ONE_Q0 = 32767  # FixedPoint<int16, 0>::One()


def _exp_on_interval_near_zero(a: np.ndarray) -> np.ndarray:
    """exp(a) for a in [-1/4, 0), Q0.15 in and out (Taylor series around -1/8)."""
    constant_term = _constant16(1895147668)
    one_third = _constant16(715827883)
    x = _wrap16(a + (1 << 12))
    x2 = _srdhm16(x, x)
    x3 = _srdhm16(x2, x)
    x4 = _srdhm16(x2, x2)
    x4_over_4 = _saturating_mul_by_pot16(x4, -2)
    series = _saturating_mul_by_pot16(_wrap16(_srdhm16(_wrap16(x4_over_4 + x3), one_third) + x2), -1)
    return _clamp16(constant_term + _srdhm16(constant_term, _wrap16(x + series)))


_EXP_BARREL = ((-2, 1672461947), (-1, 1302514674), (0, 790015084), (1, 290630308), (2, 39332535),
               (3, 720401), (4, 242))


def _exp_on_negative_values(a: np.ndarray, integer_bits: int) -> np.ndarray:
    """exp(a) for a <= 0 in Q(integer_bits).(15 - integer_bits); result Q0.15."""
    fractional_bits = 15 - integer_bits
    quarter = 1 << (fractional_bits - 2)
    a_mod = _wrap16((a & (quarter - 1)) - quarter)
    result = _exp_on_interval_near_zero(_saturating_mul_by_pot16(a_mod, integer_bits))
    remainder = _wrap16(a_mod - a)
    for exponent, multiplier in _EXP_BARREL:
        if integer_bits > exponent:
            bit = np.int64(1) << (fractional_bits + exponent)
            result = np.where((remainder & bit) != 0, _srdhm16(result, _constant16(multiplier)), result)
    if integer_bits > 5:
        clamp = _constant16(-(1 << (36 - integer_bits)))
        result = np.where(a < clamp, 0, result)
    return np.where(a == 0, _ONE_Q0, result)


def _newton_reciprocal(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Newton-Raphson for 2 / (1 + a), a in [0, 1] (Q0.15); returns (x in Q2.13, half
    denominator)."""
    total = a + _ONE_Q0
    half_denominator = _c_div(total + np.where(total >= 0, 1, -1), 2)
    x = _wrap16(_constant16(1515870810) + _srdhm16(half_denominator, _constant16(-1010580540)))
    for _ in range(3):
        one_minus = _wrap16((1 << 13) - _srdhm16(half_denominator, x))
        x = _wrap16(x + _saturating_mul_by_pot16(_srdhm16(x, one_minus), 2))
    return x, half_denominator


def _one_over_one_plus_x(a: np.ndarray) -> np.ndarray:
    x, _ = _newton_reciprocal(a)
    return _saturating_mul_by_pot16(x, 1)


def _one_minus_x_over_one_plus_x(a: np.ndarray) -> np.ndarray:
    x, _ = _newton_reciprocal(a)
    return _saturating_mul_by_pot16(_wrap16(x - (1 << 13)), 2)


def fixed_logistic(a: np.ndarray, integer_bits: int) -> np.ndarray:
    """gemmlowp logistic: int16 Q(integer_bits) raw in, Q0.15 raw out (int64 arrays)."""
    a = np.asarray(a, dtype=np.int64)
    positive = a > 0
    magnitude = np.where(positive, a, _wrap16(-a))
    if_positive = _one_over_one_plus_x(_exp_on_negative_values(_wrap16(-magnitude), integer_bits))
    result = np.where(positive, if_positive, _wrap16(_ONE_Q0 - if_positive))
    return np.where(a == 0, _constant16(1 << 30), result)


def fixed_tanh(a: np.ndarray, integer_bits: int) -> np.ndarray:
    """gemmlowp tanh: int16 Q(integer_bits) raw in, Q0.15 raw out (int64 arrays)."""
    a = np.asarray(a, dtype=np.int64)
    negative = a < 0
    n = np.where(negative, a, _wrap16(-a))
    # exp(2n): the same raw value read with one more integer bit
    t = _one_minus_x_over_one_plus_x(_exp_on_negative_values(n, integer_bits + 1))
    return np.where(a == 0, 0, np.where(negative, _wrap16(-t), t))


# --- int32 fixed-point multipliers, vectorized over arrays of multipliers --------------


def _multiply(x: np.ndarray, multiplier, shift) -> np.ndarray:
    """TFLite MultiplyByQuantizedMultiplier with array-valued multiplier and shift."""
    x = np.asarray(x, dtype=np.int64)
    multiplier = np.asarray(multiplier, dtype=np.int64)
    shift = np.asarray(shift, dtype=np.int64)
    left = np.maximum(shift, 0)
    x = np.clip(x << left, -(2**31), 2**31 - 1)
    product = x * multiplier
    high = _c_div(product + np.where(product >= 0, 1 << 30, 1 - (1 << 30)), 1 << 31)
    return _rounding_divide_by_pot(high, np.maximum(-shift, 0))


def _int_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Exact integer matrix product through float64 BLAS: 8-bit operands keep every
    partial sum far below 2^53, so nothing is rounded (numpy's integer matmul has no BLAS)."""
    return np.matmul(np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)).astype(np.int64)


def _multiplier(real: float) -> tuple[int, int]:
    # Android computes effective scales in float32 before decomposing them.
    return quantize_multiplier(float(np.float32(real)))


def _multipliers(reals: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """quantize_multiplier over an array of positive reals."""
    mantissa, exponent = np.frexp(reals)
    fixed = round_half_away(mantissa * float(1 << 31)).astype(np.int64)
    exponent = exponent.astype(np.int64)
    carry = fixed == (1 << 31)
    return np.where(carry, fixed // 2, fixed), np.where(carry, exponent + 1, exponent)


def _log2_exact(scale: float) -> int | None:
    """log2(scale) when scale is (within float32 rounding) a power of two."""
    if scale <= 0:
        return None
    exponent = int(round(np.log2(scale)))
    return exponent if abs(scale - 2.0**exponent) <= 2.0**exponent * 1e-6 else None


# --- QUANTIZED_16BIT_LSTM ---------------------------------------------------------------

_Q16_INPUT, _Q16_CELL_IN, _Q16_OUTPUT_IN = 0, 13, 14


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-6 * max(abs(a), abs(b))


@register(OperationCode.QUANTIZED_16BIT_LSTM)
class Quantized16BitLstm(Operation):
    def validate(self, ctx: ValidationContext) -> None:
        ctx.check_counts(inputs=15, outputs=2)
        q8, q16 = T.TENSOR_QUANT8_ASYMM, T.TENSOR_QUANT16_SYMM
        ctx.check_input_types([q8] * 9 + [T.TENSOR_INT32] * 4 + [q16, q8])
        ctx.check_output_types([q16, q8])
        for index in (_Q16_INPUT, _Q16_OUTPUT_IN):
            ctx.check_input_rank(index, 2)
            operand = ctx.inputs[index]
            ctx.require(_close(operand.scale, 1 / 128) and operand.zero_point == 128,
                        f"input {index} must have scale 1/128 and zero point 128")
        out = ctx.outputs[1]
        ctx.require(_close(out.scale, 1 / 128) and out.zero_point == 128,
                    "output 1 must have scale 1/128 and zero point 128")
        weights = ctx.inputs[1]
        ctx.require(weights.scale > 0, "weights must have a positive scale")
        for index in range(1, 9):
            ctx.check_input_rank(index, 2)
            ctx.check_same_quantization(("input", 1), ("input", index))
        for index in range(9, 13):
            ctx.check_input_rank(index, 1)
            bias = ctx.inputs[index]
            ctx.require(_close(bias.scale, weights.scale / 128) and bias.zero_point == 0,
                        f"input {index} must have scale weights_scale / 128 and zero point 0")
        for operand, where in ((ctx.inputs[_Q16_CELL_IN], "input 13"), (ctx.outputs[0], "output 0")):
            ctx.require(_log2_exact(operand.scale) == -11 and operand.zero_point == 0,
                        f"{where} must have scale 2^-11 and zero point 0")

    def _setup(self, ctx: ExecutionContext):
        for index in range(15):
            ctx.require(not ctx.is_omitted(index), f"input {index} must be present")
        x, h, c = ctx.input(_Q16_INPUT), ctx.input(_Q16_OUTPUT_IN), ctx.input(_Q16_CELL_IN)
        ctx.require(x.rank == 2 and h.rank == 2, "input and previous output must be 2-D")
        batch, input_size = x.shape
        output_size = h.shape[1]
        ctx.require(h.shape[0] == batch and c.shape == (batch, output_size),
                    f"states must be [{batch}, {output_size}]")
        for index in range(1, 9):
            columns = input_size if index <= 4 else output_size
            ctx.require(ctx.input(index).shape == (output_size, columns),
                        f"input {index} must have shape [{output_size}, {columns}]")
        for index in range(9, 13):
            ctx.require(ctx.input(index).shape == (output_size,), f"input {index} must have shape [{output_size}]")
        return x, h, c

    def prepare(self, ctx: ExecutionContext) -> list[Shape]:
        _, h, c = self._setup(ctx)
        return [c.shape, h.shape]

    def execute(self, ctx: ExecutionContext) -> list[np.ndarray]:
        x, h, c = self._setup(ctx)
        # Gate order of the stacked product: input, cell (modulation), forget, output.
        order = ((1, 5, 9), (3, 7, 11), (2, 6, 10), (4, 8, 12))
        weights_zero = ctx.input(1).zero_point
        # Android assembles each gate's row block as [recurrent weights | input weights] and
        # multiplies it by [input, previous output]; the CTS vectors (input size 2, output
        # size 4) expect exactly that pairing, so it is kept.
        stacked = np.concatenate([np.concatenate([ctx.value(wh), ctx.value(wx)], axis=1) for wx, wh, _ in order])
        biases = np.concatenate([ctx.value(b) for _, _, b in order]).astype(np.int64)
        activations = np.concatenate([x.value, h.value], axis=1).astype(np.int64) - 128
        accumulator = _int_matmul(activations, (stacked.astype(np.int64) - weights_zero).T) + biases
        # Rescale the int32 accumulator (scale bias_scale) to Q3.12 (scale 2^-12).
        multiplier, shift = _multiplier(4096 * float(np.float32(ctx.input(9).scale)))
        gates = _clamp16(_multiply(accumulator, multiplier, shift))
        # One logistic over all four blocks (the cell block's is unused) costs less than
        # three calls on the separate blocks.
        input_gate, _, forget_gate, output_gate = np.split(fixed_logistic(gates, 3), 4, axis=1)
        modulation = fixed_tanh(np.split(gates, 4, axis=1)[1], 3)
        previous_cell = np.asarray(c.value, dtype=np.int64)  # Q4.11
        new_cell = _clamp16(_saturating_mul_by_pot16(_srdhm16(input_gate, modulation), -4)
                            + _srdhm16(forget_gate, previous_cell))
        hidden = _srdhm16(output_gate, fixed_tanh(_saturating_mul_by_pot16(new_cell, 1), 3))
        output = np.clip(_rounding_divide_by_pot(hidden, 8), -128, 127) + 128
        return [new_cell.astype(np.int16), output.astype(np.uint8)]


# --- QUANTIZED_LSTM ----------------------------------------------------------------------

_GATES = ("input", "forget", "cell", "output")
_QL = {
    "input": 0, "output_state": 18, "cell_state": 19,
    "input_to": dict(zip(_GATES, (1, 2, 3, 4), strict=True)),
    "recurrent_to": dict(zip(_GATES, (5, 6, 7, 8), strict=True)),
    "cell_to": {"input": 9, "forget": 10, "output": 11},
    "bias": dict(zip(_GATES, (12, 13, 14, 15), strict=True)),
    "norm": dict(zip(_GATES, (20, 21, 22, 23), strict=True)),
    "intermediate": dict(zip(_GATES, (26, 27, 28, 29), strict=True)),
}
_PROJECTION, _PROJECTION_BIAS, _CELL_CLIP, _PROJ_CLIP, _HIDDEN_ZERO, _HIDDEN_SCALE = 16, 17, 24, 25, 30, 31
_QLSTM_INPUT_TYPES = ([T.TENSOR_QUANT8_ASYMM_SIGNED] + [T.TENSOR_QUANT8_SYMM] * 8 + [T.TENSOR_QUANT16_SYMM] * 3
                      + [T.TENSOR_INT32] * 4 + [T.TENSOR_QUANT8_SYMM, T.TENSOR_INT32, T.TENSOR_QUANT8_ASYMM_SIGNED,
                                                T.TENSOR_QUANT16_SYMM] + [T.TENSOR_QUANT16_SYMM] * 4
                      + [T.FLOAT32] * 6 + [T.INT32, T.FLOAT32])


def _optional_scalar(ctx: ExecutionContext, index: int) -> float:
    """An optional clipping threshold; omitted means 0 (no clipping)."""
    return 0.0 if ctx.is_omitted(index) else float(ctx.scalar(index))


def _accumulate(gate: np.ndarray, values: np.ndarray, weights: Tensor, input_scale: float, target_scale: float,
                bias: np.ndarray | None = None) -> np.ndarray:
    """gate += rescale(values . weights' (+ bias)), saturating to int16 (TFLite's
    MatrixBatchVectorMultiplyAccumulate into an int16 gate buffer)."""
    accumulator = _int_matmul(values, np.asarray(weights.value).T)
    if bias is not None:
        accumulator = accumulator + bias
    multiplier, shift = _multiplier(weights.scale * input_scale / target_scale)
    return _clamp16(gate + _multiply(accumulator, multiplier, shift))


def _layer_norm(gate: np.ndarray, weights: Tensor, bias: np.ndarray) -> np.ndarray:
    """TFLite's integer layer normalization: Q3.12 in, Q3.12 out."""
    units = gate.shape[1]
    total = gate.sum(axis=1)
    squares = (gate * gate).sum(axis=1)
    mean = _c_div(total * 1024, units)
    variance = (squares << 20) // units - mean * mean
    variance = _c_div(variance, 1 << 20)
    limit = min(1, int(10000 * weights.scale))
    variance = np.where(variance < 1, limit, variance)
    # 1 / stddev as a fixed-point multiplier per batch row (TFLite approximates the same
    # value by Newton-Raphson; variances of 0 or 1 give a multiplier of 1).
    inv_std = 1.0 / np.sqrt(np.maximum(variance, 1).astype(np.float64))
    multipliers, shifts = _multipliers(inv_std)
    normalized = _multiply(1024 * gate - mean[:, np.newaxis], multipliers[:, np.newaxis], shifts[:, np.newaxis])
    scaled = normalized * np.asarray(weights.value, dtype=np.int64) + bias
    scaled = _c_div(scaled + np.where(scaled > 0, 512, -512), 1024)
    multiplier, shift = _multiplier(weights.scale)
    return _clamp16(_multiply(scaled, multiplier, shift + 12))


def _requantize_to(values: np.ndarray, scale: float, zero_point: int, target, dtype) -> np.ndarray:
    """Express integer results in a declared output quantization when it differs."""
    if (scale, zero_point) == (target.scale, target.zero_point) or target.scale == 0:
        return values.astype(dtype)
    real = (values.astype(np.float64) - zero_point) * scale
    info = np.iinfo(dtype)
    return np.clip(round_half_away(real / target.scale) + target.zero_point, info.min, info.max).astype(dtype)


@register(OperationCode.QUANTIZED_LSTM)
class QuantizedLstm(Operation):
    def validate(self, ctx: ValidationContext) -> None:
        ctx.check_counts(inputs=32, outputs=3)
        ctx.check_input_types(_QLSTM_INPUT_TYPES)
        ctx.check_output_types([T.TENSOR_QUANT8_ASYMM_SIGNED, T.TENSOR_QUANT16_SYMM, T.TENSOR_QUANT8_ASYMM_SIGNED])
        for index in (0, 2, 3, 4, 6, 7, 8, 18, 19):
            ctx.check_input_rank(index, 2)
        for index in (13, 14, 15):
            ctx.check_input_rank(index, 1)
        shift = _log2_exact(ctx.inputs[19].scale)
        ctx.require(shift is not None and shift <= -9,
                    "input 19 (cell state) must have a power-of-two scale of at most 2^-9")

    def _setup(self, ctx: ExecutionContext):
        for index in (0, 2, 3, 4, 6, 7, 8, 13, 14, 15, 18, 19):
            ctx.require(not ctx.is_omitted(index), f"input {index} must be present")
        for index in (0, 2, 3, 4, 6, 7, 8, 18, 19):
            ctx.require(ctx.input(index).rank == 2, f"input {index} must be 2-D")
        x, h, c = ctx.input(0), ctx.input(18), ctx.input(19)
        batch, input_size = x.shape
        units = ctx.input(4).shape[0]
        output_size = ctx.input(8).shape[1]
        cifg = ctx.is_omitted(1)
        expected = {}
        for gate in _GATES:
            if gate == "input" and cifg:
                continue
            expected[_QL["input_to"][gate]] = (units, input_size)
            expected[_QL["recurrent_to"][gate]] = (units, output_size)
            expected[_QL["bias"][gate]] = (units,)
        for index in (*_QL["cell_to"].values(), *_QL["norm"].values()):
            expected[index] = (units,)
        expected.update({_PROJECTION: (output_size, units), _PROJECTION_BIAS: (output_size,),
                         18: (batch, output_size), 19: (batch, units)})
        for index, shape in expected.items():
            if not ctx.is_omitted(index):
                ctx.require(ctx.input(index).shape == shape,
                            f"input {index} has shape {list(ctx.input(index).shape)}, expected {list(shape)}")
        ctx.require(ctx.is_omitted(5) == cifg and ctx.is_omitted(12) == cifg,
                    "input gate weights and bias must all be present or all omitted (CIFG)")
        peephole = [not ctx.is_omitted(i) for i in (10, 11)]
        ctx.require(all(peephole) or not any(peephole), "peephole weights must be all present or all omitted")
        ctx.require(ctx.is_omitted(9) == (cifg or not all(peephole)),
                    "cell-to-input weights must be present exactly with peephole and without CIFG")
        norms = [not ctx.is_omitted(i) for i in (21, 22, 23)]
        ctx.require(all(norms) or not any(norms), "layer norm weights must be all present or all omitted")
        ctx.require(ctx.is_omitted(20) == (cifg or not all(norms)),
                    "input layer norm weights must be present exactly with layer norm and without CIFG")
        ctx.require(not ctx.is_omitted(_PROJECTION) or ctx.is_omitted(_PROJECTION_BIAS),
                    "projection bias needs projection weights")
        ctx.require(not ctx.is_omitted(_PROJECTION) or output_size == units,
                    "without projection the output size must equal the number of units")
        return x, h, c, cifg, all(peephole), all(norms)

    def prepare(self, ctx: ExecutionContext) -> list[Shape]:
        _, h, c, _, _, _ = self._setup(ctx)
        return [h.shape, c.shape, h.shape]

    def execute(self, ctx: ExecutionContext) -> list[np.ndarray]:
        x, h, c, cifg, peephole, layer_norm = self._setup(ctx)
        cell_shift = _log2_exact(c.scale)
        ctx.require(cell_shift is not None and cell_shift <= -9, "cell state scale must be a power of two <= 2^-9")
        x_values = np.asarray(x.value, dtype=np.int64) - x.zero_point
        h_values = np.asarray(h.value, dtype=np.int64) - h.zero_point
        previous_cell = np.asarray(c.value, dtype=np.int64)
        batch, units = previous_cell.shape

        def gate_preactivation(gate: str, cell: np.ndarray) -> np.ndarray:
            target = float(ctx.scalar(_QL["intermediate"][gate])) if layer_norm else 2.0**-12
            bias = np.asarray(ctx.value(_QL["bias"][gate]), dtype=np.int64)
            result = np.zeros((batch, units), dtype=np.int64)
            result = _accumulate(result, x_values, ctx.input(_QL["input_to"][gate]), x.scale, target,
                                 None if layer_norm else bias)
            result = _accumulate(result, h_values, ctx.input(_QL["recurrent_to"][gate]), h.scale, target)
            if peephole and gate in _QL["cell_to"]:
                weights = ctx.input(_QL["cell_to"][gate])
                multiplier, shift = _multiplier(2.0**cell_shift * weights.scale / target)
                product = cell * np.asarray(weights.value, dtype=np.int64)
                result = _clamp16(result + _multiply(product, multiplier, shift))
            if layer_norm:
                result = _layer_norm(result, ctx.input(_QL["norm"][gate]), bias)
            return result

        forget = fixed_logistic(gate_preactivation("forget", previous_cell), 3)
        modulation = fixed_tanh(gate_preactivation("cell", previous_cell), 3)
        if cifg:
            input_gate = _wrap16(_ONE_Q0 - forget)
        else:
            input_gate = fixed_logistic(gate_preactivation("input", previous_cell), 3)
        kept = _clamp16(_rounding_divide_by_pot(forget * previous_cell, 15))
        added = _clamp16(_rounding_divide_by_pot(input_gate * modulation, 30 + cell_shift))
        cell = _clamp16(kept + added)
        cell_clip = _optional_scalar(ctx, _CELL_CLIP)
        if cell_clip > 0:
            limit = int(min(cell_clip / c.scale, 32767.0))
            cell = np.clip(cell, -limit, limit)
        output_gate = fixed_logistic(gate_preactivation("output", cell), 3)
        cell_tanh = fixed_tanh(cell, cell_shift + 15)
        hidden_scale = float(ctx.scalar(_HIDDEN_SCALE))
        hidden_zero = int(ctx.scalar(_HIDDEN_ZERO))
        multiplier, shift = _multiplier(2.0**-30 / hidden_scale)
        hidden = np.clip(_multiply(output_gate * cell_tanh, multiplier, shift) + hidden_zero, -128, 127)
        if ctx.is_omitted(_PROJECTION):
            output = _requantize_to(hidden, hidden_scale, hidden_zero, h, np.int8).astype(np.int64)
        else:
            projection = ctx.input(_PROJECTION)
            accumulator = _int_matmul(hidden - hidden_zero, np.asarray(projection.value).T)
            if not ctx.is_omitted(_PROJECTION_BIAS):
                accumulator = accumulator + np.asarray(ctx.value(_PROJECTION_BIAS), dtype=np.int64)
            multiplier, shift = _multiplier(projection.scale * hidden_scale / h.scale)
            output = np.clip(_multiply(accumulator, multiplier, shift) + h.zero_point, -128, 127)
            proj_clip = _optional_scalar(ctx, _PROJ_CLIP)
            if proj_clip > 0:
                limit = int(min(proj_clip / h.scale, 127.0))
                output = np.clip(output, h.zero_point - limit, h.zero_point + limit)
            output = np.clip(output, -128, 127)
        out_state = _requantize_to(output, h.scale, h.zero_point, ctx.output(0), np.int8)
        out_cell = _requantize_to(cell, c.scale, 0, ctx.output(1), np.int16)
        out = _requantize_to(output, h.scale, h.zero_point, ctx.output(2), np.int8)
        return [out_state, out_cell, out]
