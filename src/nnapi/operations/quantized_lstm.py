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
(QUANT16_SYMM weights). It follows Android's kernel, which CTS checks drivers against,
bit for bit: each matrix product is rescaled into the gate's intermediate scale (inputs
26-29) with a fixed-point multiplier, layer normalization runs Android's integer algorithm
(inverse square root by fixed-point Newton-Raphson, gate bias added after normalizing), the
hidden state o * tanh(c) is quantized with inputs 30/31, projected and clipped, and the
outputs are written raw in the input states' quantization. The surprising places are
marked "Android:" in the code. Without layer normalization (no CTS vector) the gate goes
to a Q3.12 activation with its bias in the input product, as the NDK documents the bias.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import numpy as np

from nnapi.codes import OperandCode, OperationCode
from nnapi.operations import _jit
from nnapi.operations.base import ExecutionContext, Operation, Shape, Tensor, ValidationContext, register
from nnapi.operations.quant_math import (
    OutputStage,
    inverse_sqrt_multipliers,
    quantize_multiplier,
    rescale_multiplier,
    rounding_divide_by_pot,
    rounding_doubling_high_multiply16,
    wrap32,
)
from nnapi.operations.quant_math import multiply_by_quantized_multiplier as _multiply

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


_srdhm16 = rounding_doubling_high_multiply16  # SaturatingRoundingDoublingHighMul for int16


def _saturating_mul_by_pot16(x: np.ndarray, exponent: int) -> np.ndarray:
    """gemmlowp SaturatingRoundingMultiplyByPOT on int16 raw values."""
    if exponent <= 0:
        return rounding_divide_by_pot(x, -exponent) if exponent else x
    threshold = (1 << (15 - exponent)) - 1
    shifted = _wrap16(x << exponent)
    return np.where(x > threshold, 32767, np.where(x < -threshold, -32768, shifted))


def _constant16(value32: int) -> int:
    """gemmlowp's int16 constant from its Q0.31 (or Qn.31-n) int32 spelling."""
    return int(rounding_divide_by_pot(np.int64(value32), 16))


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


@functools.cache
def table16(function: Callable[[np.ndarray, int], np.ndarray], integer_bits: int) -> np.ndarray:
    """``function`` (fixed_logistic or fixed_tanh) of every int16 raw value, by index
    value + 32768: computed once per process by the definition itself."""
    table = function(np.arange(-32768, 32768, dtype=np.int64), integer_bits)
    table.setflags(write=False)
    return table


def _lookup16(function: Callable[[np.ndarray, int], np.ndarray], a: np.ndarray, integer_bits: int) -> np.ndarray:
    """``function(a, integer_bits)`` through its table: an LSTM step calls the activations
    on a few hundred values, where the definition's ~200 numpy calls cost milliseconds.
    Values outside int16 (no caller passes any: every gate is saturated first) take the
    definition."""
    a = np.asarray(a, dtype=np.int64)
    if a.size and (a.min() < -32768 or a.max() > 32767):
        return function(a, integer_bits)
    return table16(function, integer_bits)[a + 32768]


def logistic16(a: np.ndarray, integer_bits: int) -> np.ndarray:
    """fixed_logistic of int16 raw values, by table."""
    return _lookup16(fixed_logistic, a, integer_bits)


def tanh16(a: np.ndarray, integer_bits: int) -> np.ndarray:
    """fixed_tanh of int16 raw values, by table."""
    return _lookup16(fixed_tanh, a, integer_bits)


# --- int32 fixed-point multipliers, vectorized over arrays of multipliers --------------


def _int_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Exact integer matrix product through float64 BLAS: 8-bit operands keep every
    partial sum far below 2^53, so nothing is rounded (numpy's integer matmul has no BLAS)."""
    return np.matmul(np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)).astype(np.int64)


def float32_multiplier(real: float) -> tuple[int, int]:
    """``real`` as a quantized multiplier and shift, rounded to float32 first: Android
    computes effective scales in float32 before decomposing them."""
    return quantize_multiplier(float(np.float32(real)))


def _log2_exact(scale: float) -> int | None:
    """log2(scale) when scale is (within float32 rounding) a power of two."""
    if scale <= 0:
        return None
    exponent = int(round(np.log2(scale)))
    return exponent if abs(scale - 2.0**exponent) <= 2.0**exponent * 1e-6 else None


# --- QUANTIZED_16BIT_LSTM ---------------------------------------------------------------

# Named input positions (Android's quantized_lstm.cpp): the input, then 4 input weights,
# 4 recurrent weights and 4 biases in gate order input, forget, cell, output, then the states.
Q16_INPUT = 0
Q16_INPUT_WEIGHTS = 1
Q16_RECURRENT_WEIGHTS = 5
Q16_BIASES = 9
Q16_CELL_IN = 13
Q16_OUTPUT_IN = 14
Q16_INPUT_GATE, Q16_FORGET_GATE, Q16_CELL_GATE, Q16_OUTPUT_GATE = range(4)


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-6 * max(abs(a), abs(b))


@register(OperationCode.QUANTIZED_16BIT_LSTM)
class Quantized16BitLstm(Operation):
    def validate(self, ctx: ValidationContext) -> None:
        ctx.check_counts(inputs=15, outputs=2)
        q8, q16 = T.TENSOR_QUANT8_ASYMM, T.TENSOR_QUANT16_SYMM
        ctx.check_input_types([q8] * 9 + [T.TENSOR_INT32] * 4 + [q16, q8])
        ctx.check_output_types([q16, q8])
        for index in (Q16_INPUT, Q16_OUTPUT_IN):
            ctx.check_input_rank(index, 2)
            operand = ctx.inputs[index]
            ctx.require(_close(operand.scale, 1 / 128) and operand.zero_point == 128,
                        f"input {index} must have scale 1/128 and zero point 128")
        out = ctx.outputs[1]
        ctx.require(_close(out.scale, 1 / 128) and out.zero_point == 128,
                    "output 1 must have scale 1/128 and zero point 128")
        weights = ctx.inputs[Q16_INPUT_WEIGHTS]
        ctx.require(weights.scale > 0, "weights must have a positive scale")
        for index in range(Q16_INPUT_WEIGHTS, Q16_BIASES):
            ctx.check_input_rank(index, 2)
            ctx.check_same_quantization(("input", Q16_INPUT_WEIGHTS), ("input", index))
        for index in range(Q16_BIASES, Q16_CELL_IN):
            ctx.check_input_rank(index, 1)
            bias = ctx.inputs[index]
            ctx.require(_close(bias.scale, weights.scale / 128) and bias.zero_point == 0,
                        f"input {index} must have scale weights_scale / 128 and zero point 0")
        for operand, where in ((ctx.inputs[Q16_CELL_IN], "input 13"), (ctx.outputs[0], "output 0")):
            ctx.require(_log2_exact(operand.scale) == -11 and operand.zero_point == 0,
                        f"{where} must have scale 2^-11 and zero point 0")

    def _setup(self, ctx: ExecutionContext):
        for index in range(Q16_OUTPUT_IN + 1):
            ctx.require(not ctx.is_omitted(index), f"input {index} must be present")
        x, h, c = ctx.input(Q16_INPUT), ctx.input(Q16_OUTPUT_IN), ctx.input(Q16_CELL_IN)
        ctx.require(x.rank == 2 and h.rank == 2, "input and previous output must be 2-D")
        batch, input_size = x.shape
        output_size = h.shape[1]
        ctx.require(h.shape[0] == batch and c.shape == (batch, output_size),
                    f"states must be [{batch}, {output_size}]")
        for index in range(Q16_INPUT_WEIGHTS, Q16_BIASES):
            columns = input_size if index < Q16_RECURRENT_WEIGHTS else output_size
            ctx.require(ctx.input(index).shape == (output_size, columns),
                        f"input {index} must have shape [{output_size}, {columns}]")
        for index in range(Q16_BIASES, Q16_CELL_IN):
            ctx.require(ctx.input(index).shape == (output_size,), f"input {index} must have shape [{output_size}]")
        return x, h, c

    def prepare(self, ctx: ExecutionContext) -> list[Shape]:
        _, h, c = self._setup(ctx)
        return [c.shape, h.shape]

    def execute(self, ctx: ExecutionContext) -> list[np.ndarray]:
        x, h, c = self._setup(ctx)
        return _q16_cell(x.value, h.value, c.value, *_q16_constants(ctx))

    def plan(self, ctx: ExecutionContext):
        """Constant weights and biases: their stacked, zero-point-shifted product matrix,
        the biases and the gates' multiplier made once (``execute`` makes them on every
        call); the cell itself as ``execute`` runs it."""
        if not all(isinstance(ctx.value(index), np.ndarray) for index in range(Q16_INPUT_WEIGHTS, Q16_CELL_IN)):
            return None
        constants = _q16_constants(ctx)

        def cell(values: list) -> list[np.ndarray]:
            return _q16_cell(values[Q16_INPUT], values[Q16_OUTPUT_IN], values[Q16_CELL_IN], *constants)

        return cell


def _q16_constants(ctx: ExecutionContext) -> tuple[np.ndarray, np.ndarray, int, int]:
    """What QUANTIZED_16BIT_LSTM's cell computes from its weights and biases alone: the
    transposed float64 product matrix of the four gates' (weights - zero point), the stacked int64
    biases and the multiplier and shift from the accumulators' scale to Q3.12."""
    # Gate order of the stacked product: input, cell (modulation), forget, output.
    order = [(Q16_INPUT_WEIGHTS + gate, Q16_RECURRENT_WEIGHTS + gate, Q16_BIASES + gate)
             for gate in (Q16_INPUT_GATE, Q16_CELL_GATE, Q16_FORGET_GATE, Q16_OUTPUT_GATE)]
    weights_zero = ctx.input(Q16_INPUT_WEIGHTS).zero_point
    # Android assembles each gate's row block as [recurrent weights | input weights] and
    # multiplies it by [input, previous output]; the CTS vectors (input size 2, output
    # size 4) expect exactly that pairing, so it is kept.
    stacked = np.concatenate([np.concatenate([ctx.value(wh), ctx.value(wx)], axis=1) for wx, wh, _ in order])
    biases = np.concatenate([ctx.value(b) for _, _, b in order]).astype(np.int64)
    # Rescale the int32 accumulator (scale bias_scale) to Q3.12 (scale 2^-12).
    multiplier, shift = float32_multiplier(4096 * float(np.float32(ctx.input(Q16_BIASES).scale)))
    # in float64, as ``_int_matmul`` multiplies (|w - zero point| < 2**9: exact)
    weights = np.ascontiguousarray((stacked.astype(np.int64) - weights_zero).T, dtype=np.float64)
    return weights, biases, multiplier, shift


def _q16_cell(x: np.ndarray, h: np.ndarray, c: np.ndarray, weights: np.ndarray, biases: np.ndarray,
              multiplier: int, shift: int) -> list[np.ndarray]:
    """One QUANTIZED_16BIT_LSTM step from the stored input, previous output and cell
    state, with ``_q16_constants``: [new cell state (int16), output (uint8)]."""
    activations = np.concatenate([x, h], axis=1).astype(np.int64) - 128
    accumulator = _int_matmul(activations, weights) + biases
    gates = _clamp16(_multiply(accumulator, multiplier, shift))
    # One logistic over all four blocks (the cell block's is unused) costs less than
    # three calls on the separate blocks.
    input_gate, _, forget_gate, output_gate = np.split(logistic16(gates, 3), 4, axis=1)
    modulation = tanh16(np.split(gates, 4, axis=1)[1], 3)
    previous_cell = np.asarray(c, dtype=np.int64)  # Q4.11
    new_cell = _clamp16(_saturating_mul_by_pot16(_srdhm16(input_gate, modulation), -4)
                        + _srdhm16(forget_gate, previous_cell))
    hidden = _srdhm16(output_gate, tanh16(_saturating_mul_by_pot16(new_cell, 1), 3))
    output = np.clip(rounding_divide_by_pot(hidden, 8), -128, 127) + 128
    return [new_cell.astype(np.int16), output.astype(np.uint8)]


# --- QUANTIZED_LSTM ----------------------------------------------------------------------
#
# Android's kernel is the behaviour CTS checks drivers against, so this one follows it
# step by step, surprises included (each marked "Android:" below). Where Android's result
# is undefined (it reads a buffer before writing it, or dereferences an absent bias) the
# defined reading that agrees with TFLite's integer LSTM is used instead.

INPUT_TENSOR = 0
INPUT_TO_WEIGHTS = {"input": 1, "forget": 2, "cell": 3, "output": 4}
RECURRENT_TO_WEIGHTS = {"input": 5, "forget": 6, "cell": 7, "output": 8}
CELL_TO_WEIGHTS = {"input": 9, "forget": 10, "output": 11}
GATE_BIAS = {"input": 12, "forget": 13, "cell": 14, "output": 15}
PROJECTION_WEIGHTS = 16
PROJECTION_BIAS = 17
PREV_OUTPUT_TENSOR = 18
PREV_CELL_STATE_TENSOR = 19
LAYER_NORM_WEIGHTS = {"input": 20, "forget": 21, "cell": 22, "output": 23}
CELL_CLIP = 24
PROJECTION_CLIP = 25
INTERMEDIATE_SCALE = {"input": 26, "forget": 27, "cell": 28, "output": 29}
HIDDEN_STATE_ZERO_POINT = 30
HIDDEN_STATE_SCALE = 31
OUTPUT_STATE_OUT, CELL_STATE_OUT, OUTPUT_TENSOR = 0, 1, 2

_GATES = ("input", "forget", "cell", "output")
_QLSTM_INPUT_TYPES = ([T.TENSOR_QUANT8_ASYMM_SIGNED] + [T.TENSOR_QUANT8_SYMM] * 8 + [T.TENSOR_QUANT16_SYMM] * 3
                      + [T.TENSOR_INT32] * 4 + [T.TENSOR_QUANT8_SYMM, T.TENSOR_INT32, T.TENSOR_QUANT8_ASYMM_SIGNED,
                                                T.TENSOR_QUANT16_SYMM] + [T.TENSOR_QUANT16_SYMM] * 4
                      + [T.FLOAT32] * 6 + [T.INT32, T.FLOAT32])
_REQUIRED = (INPUT_TENSOR, *(INPUT_TO_WEIGHTS[g] for g in _GATES[1:]), *(RECURRENT_TO_WEIGHTS[g] for g in _GATES[1:]),
             *(GATE_BIAS[g] for g in _GATES[1:]), PREV_OUTPUT_TENSOR, PREV_CELL_STATE_TENSOR)
_MATRICES = (INPUT_TENSOR, *INPUT_TO_WEIGHTS.values(), *RECURRENT_TO_WEIGHTS.values(), PROJECTION_WEIGHTS,
             PREV_OUTPUT_TENSOR, PREV_CELL_STATE_TENSOR)
_VECTORS = (*CELL_TO_WEIGHTS.values(), *GATE_BIAS.values(), PROJECTION_BIAS, *LAYER_NORM_WEIGHTS.values())
# The hidden state's tanh reads the cell state with (15 + log2 scale) integer bits, and
# Android's kernel has tanh for 0 to 6 integer bits only.
_CELL_SHIFTS = range(-15, -8)


def _effective_multiplier(scale: float, factor: float, target: float) -> tuple[int, int]:
    """The multiplier of scale * factor / target: Android computes QUANTIZED_LSTM's
    effective scales in float32 throughout (the quotient too)."""
    return rescale_multiplier(scale, factor, target, float32_quotient=True)


def _accumulate(gate: np.ndarray, values: np.ndarray, weights: Tensor, rescale: tuple[int, int],
                bias: np.ndarray | None = None) -> np.ndarray:
    """gate += rescale(values . weights' (+ bias)), saturating to int16 (Android's
    MatrixBatchVectorMultiplyAccumulate into an int16 gate buffer); ``rescale`` is the
    (multiplier, shift) of the effective scale."""
    accumulator = _int_matmul(values, np.asarray(weights.value).T)
    if bias is not None:
        accumulator = accumulator + bias
    multiplier, shift = rescale
    return _clamp16(gate + _multiply(accumulator, multiplier, shift))


def _layer_norm(gate: np.ndarray, weights: Tensor, bias: np.ndarray) -> np.ndarray:
    """Android's integer layer normalization (ApplyLayerNorm): Q3.12 in, Q3.12 out."""
    units = gate.shape[1]
    total = gate.sum(axis=1)
    squares = (gate * gate).sum(axis=1)
    mean = _c_div(total * 1024, units)
    # Android: the variance divides 2^20 by the unit count before multiplying (exact only
    # for power-of-two counts), then truncates.
    variance = _c_div(squares * ((1 << 20) // units) - mean * mean, 1 << 20)
    # Android: a variance below 1 becomes min(1, int(10000 * weights scale)), i.e. 0 for
    # the usual small scales; 0 and 1 both mean "divide by one" below.
    limit = min(1, int(np.float32(10000) * np.float32(weights.scale)))
    variance = np.where(variance < 1, limit, variance)
    # 1 / sqrt(variance) by Android's fixed-point Newton steps, not exactly rounded: the
    # layer-normalized gates (hence the cell state) follow its last bits
    multipliers, right_shifts = inverse_sqrt_multipliers(variance)
    normalized = _multiply(1024 * gate - mean[:, np.newaxis], multipliers[:, np.newaxis], -right_shifts[:, np.newaxis])
    # Android: the weighted value wraps in int32 (its own note says "saturate this").
    scaled = wrap32(normalized * np.asarray(weights.value, dtype=np.int64) + bias)
    scaled = _c_div(scaled + np.where(scaled > 0, 512, -512), 1024)
    multiplier, shift = quantize_multiplier(float(np.float32(weights.scale)))
    return _clamp16(_multiply(scaled, multiplier, shift + 12))


@register(OperationCode.QUANTIZED_LSTM, omitted_operands=True)
class QuantizedLstm(Operation):
    def validate(self, ctx: ValidationContext) -> None:
        ctx.check_counts(inputs=32, outputs=3)
        ctx.check_input_types(_QLSTM_INPUT_TYPES)
        ctx.check_output_types([T.TENSOR_QUANT8_ASYMM_SIGNED, T.TENSOR_QUANT16_SYMM, T.TENSOR_QUANT8_ASYMM_SIGNED])
        for index in (INPUT_TENSOR, *(INPUT_TO_WEIGHTS[g] for g in _GATES[1:]),
                      *(RECURRENT_TO_WEIGHTS[g] for g in _GATES[1:]), PREV_OUTPUT_TENSOR, PREV_CELL_STATE_TENSOR):
            ctx.check_input_rank(index, 2)
        for index in (GATE_BIAS["forget"], GATE_BIAS["cell"], GATE_BIAS["output"]):
            ctx.check_input_rank(index, 1)
        shift = _log2_exact(ctx.inputs[PREV_CELL_STATE_TENSOR].scale)
        ctx.require(shift in _CELL_SHIFTS,
                    f"input {PREV_CELL_STATE_TENSOR} (cell state) must have a power-of-two scale "
                    "from 2^-15 to 2^-9")

    def _setup(self, ctx: ExecutionContext):
        for index in _REQUIRED:
            ctx.require(not ctx.is_omitted(index), f"input {index} must be present")
        for index in _MATRICES:
            if not ctx.is_omitted(index):
                ctx.require(ctx.input(index).rank == 2, f"input {index} must be 2-D")
        x, h, c = ctx.input(INPUT_TENSOR), ctx.input(PREV_OUTPUT_TENSOR), ctx.input(PREV_CELL_STATE_TENSOR)
        batch, input_size = x.shape
        units = ctx.input(INPUT_TO_WEIGHTS["output"]).shape[0]
        output_size = ctx.input(RECURRENT_TO_WEIGHTS["output"]).shape[1]
        cifg = ctx.is_omitted(INPUT_TO_WEIGHTS["input"])
        expected = {}
        for gate in _GATES:
            expected[INPUT_TO_WEIGHTS[gate]] = (units, input_size)
            expected[RECURRENT_TO_WEIGHTS[gate]] = (units, output_size)
        for index in _VECTORS:
            expected[index] = (units,)
        expected.update({PROJECTION_WEIGHTS: (output_size, units), PROJECTION_BIAS: (output_size,),
                         PREV_OUTPUT_TENSOR: (batch, output_size), PREV_CELL_STATE_TENSOR: (batch, units)})
        for index, shape in expected.items():
            if not ctx.is_omitted(index):
                ctx.require(ctx.input(index).shape == shape,
                            f"input {index} has shape {list(ctx.input(index).shape)}, expected {list(shape)}")
        input_gate = (RECURRENT_TO_WEIGHTS["input"], GATE_BIAS["input"])
        ctx.require(all(ctx.is_omitted(i) == cifg for i in input_gate),
                    "input gate weights and bias must all be present or all omitted (CIFG)")
        peephole = [not ctx.is_omitted(CELL_TO_WEIGHTS[g]) for g in ("forget", "output")]
        ctx.require(all(peephole) or not any(peephole), "peephole weights must be all present or all omitted")
        ctx.require(ctx.is_omitted(CELL_TO_WEIGHTS["input"]) == (cifg or not all(peephole)),
                    "cell-to-input weights must be present exactly with peephole and without CIFG")
        norms = [not ctx.is_omitted(LAYER_NORM_WEIGHTS[g]) for g in _GATES[1:]]
        ctx.require(all(norms) or not any(norms), "layer norm weights must be all present or all omitted")
        ctx.require(ctx.is_omitted(LAYER_NORM_WEIGHTS["input"]) == (cifg or not all(norms)),
                    "input layer norm weights must be present exactly with layer norm and without CIFG")
        ctx.require(not ctx.is_omitted(PROJECTION_WEIGHTS) or ctx.is_omitted(PROJECTION_BIAS),
                    "projection bias needs projection weights")
        ctx.require(not ctx.is_omitted(PROJECTION_WEIGHTS) or output_size == units,
                    "without projection the output size must equal the number of units")
        return x, h, c, cifg, all(peephole), all(norms)

    def prepare(self, ctx: ExecutionContext) -> list[Shape]:
        _, h, c, _, _, _ = self._setup(ctx)
        return [h.shape, c.shape, h.shape]

    plan_sees_omitted = True  # the optional weights decide the variant

    def plan(self, ctx: ExecutionContext):
        """Constant weights, biases and scalars (reading any other value raises, and the
        driver then runs ``execute``): ``PreparedQuantizedLstm``."""
        return PreparedQuantizedLstm(ctx, *self._setup(ctx))

    def execute(self, ctx: ExecutionContext) -> list[np.ndarray]:
        x, h, c, cifg, peephole, layer_norm = self._setup(ctx)
        cell_shift = _log2_exact(c.scale)
        x_values = np.asarray(x.value, dtype=np.int64) - x.zero_point
        h_values = np.asarray(h.value, dtype=np.int64) - h.zero_point
        previous_cell = np.asarray(c.value, dtype=np.int64)
        batch, units = previous_cell.shape

        def gate_preactivation(gate: str, cell: np.ndarray) -> np.ndarray:
            # Without layer normalization the NDK calls inputs 26-29 the scale of the
            # "input to layer normalization" and gives the gate biases the scale
            # input_scale * weights_scale: the gate goes straight to a Q3.12 activation
            # and its bias joins the input product (TFLite's integer LSTM). Android's
            # kernel (no CTS vector covers this case) would drop the biases here.
            target = float(ctx.scalar(INTERMEDIATE_SCALE[gate])) if layer_norm else 2.0**-12
            bias = np.asarray(ctx.value(GATE_BIAS[gate]), dtype=np.int64)
            result = np.zeros((batch, units), dtype=np.int64)
            input_weights, recurrent_weights = ctx.input(INPUT_TO_WEIGHTS[gate]), ctx.input(RECURRENT_TO_WEIGHTS[gate])
            result = _accumulate(result, x_values, input_weights,
                                 _effective_multiplier(input_weights.scale, x.scale, target),
                                 None if layer_norm else bias)
            result = _accumulate(result, h_values, recurrent_weights,
                                 _effective_multiplier(recurrent_weights.scale, h.scale, target))
            if peephole and gate in CELL_TO_WEIGHTS:
                weights = ctx.input(CELL_TO_WEIGHTS[gate])
                multiplier, shift = _effective_multiplier(2.0**cell_shift, weights.scale, target)
                product = cell * np.asarray(weights.value, dtype=np.int64)
                result = _clamp16(result + _multiply(product, multiplier, shift))
            if layer_norm:
                result = _layer_norm(result, ctx.input(LAYER_NORM_WEIGHTS[gate]), bias)
            return result

        # Android: the input and forget peepholes read the cell state *output* buffer
        # before anything is written to it (undefined); they read the previous cell state
        # here, as the equations and TFLite do. The output gate's peephole reads the new
        # cell state in both.
        forget = logistic16(gate_preactivation("forget", previous_cell), 3)
        modulation = tanh16(gate_preactivation("cell", previous_cell), 3)
        if cifg:
            input_gate = _ONE_Q0 - forget
        else:
            input_gate = logistic16(gate_preactivation("input", previous_cell), 3)
        # Android: both products are cast to int16 (wrap-around), only their sum saturates.
        kept = _wrap16(rounding_divide_by_pot(forget * previous_cell, 15))
        added = _wrap16(rounding_divide_by_pot(input_gate * modulation, 30 + cell_shift))
        cell = _clamp16(kept + added)
        limit = _clip_limit(ctx, CELL_CLIP, c.scale, 32767)
        if limit:
            cell = np.clip(cell, -limit, limit)
        output_gate = logistic16(gate_preactivation("output", cell), 3)
        cell_tanh = tanh16(cell, cell_shift + 15)
        hidden_scale = float(ctx.scalar(HIDDEN_STATE_SCALE))
        hidden_zero = int(ctx.scalar(HIDDEN_STATE_ZERO_POINT))
        multiplier, shift = quantize_multiplier(float(np.float32(2.0**-15 / hidden_scale * 2.0**-15)))
        # Android: the hidden state's zero point is *subtracted* (the projection below adds
        # it back), so the int8 hidden values are v - zero_point.
        hidden = np.clip(_multiply(output_gate * cell_tanh, multiplier, shift) - hidden_zero, -128, 127)
        if ctx.is_omitted(PROJECTION_WEIGHTS):
            # Android: without projection the output is the hidden state's raw int8 values,
            # whatever the output's declared scale (CTS qlstm_noprojection relies on it).
            output = hidden
        else:
            projection = ctx.input(PROJECTION_WEIGHTS)
            weights = np.asarray(projection.value, dtype=np.int64)
            # Android adds hidden_zero * row sums to the projection bias (it dereferences the
            # absent bias when there is none; an absent bias reads as zeros here).
            bias = hidden_zero * weights.sum(axis=1)
            if not ctx.is_omitted(PROJECTION_BIAS):
                bias = bias + np.asarray(ctx.value(PROJECTION_BIAS), dtype=np.int64)
            accumulator = _int_matmul(hidden, weights.T) + bias
            multiplier, shift = _effective_multiplier(projection.scale, hidden_scale, h.scale)
            output = np.clip(_multiply(accumulator, multiplier, shift) + h.zero_point, -128, 127)
            # Android: the threshold is in units of the projection *weights'* scale and
            # clips symmetrically around 0, not around the output's zero point.
            limit = _clip_limit(ctx, PROJECTION_CLIP, projection.scale, 127)
            if limit:
                output = np.clip(output, -limit, limit)
        # Android: all three outputs are written raw, in the input states' quantization.
        output = output.astype(np.int8)
        return [output, cell.astype(np.int16), output.copy()]


def _clip_limit(ctx: ExecutionContext, position: int, scale: float, high: int) -> int:
    """CELL_CLIP / PROJECTION_CLIP at input ``position`` in stored units, as Android computes
    it (clip / scale in float32, saturated to the stored type's largest value ``high``,
    truncated); 0 where there is no clipping (omitted, 0, or below one unit)."""
    clip = 0.0 if ctx.is_omitted(position) else float(ctx.scalar(position))
    if not clip > 0:
        return 0
    return max(0, int(min(max(np.float32(clip) / np.float32(scale), -(high + 1.0)), float(high))))


def _clip_in_place(values: np.ndarray, low: int, high: int) -> np.ndarray:
    """np.clip(values, low, high) into ``values`` by two ufunc calls (np.clip's Python
    wrapper costs more than the clipping of a step's few hundred values)."""
    np.maximum(values, low, out=values)
    return np.minimum(values, high, out=values)


_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


def _rescale(multipliers, shifts, bias=None, zero_point: int = 0, low: int = _INT64_MIN,
             high: int = _INT64_MAX) -> OutputStage:
    """quant_math's OutputStage, prepared: clip(multiply_by_quantized_multiplier(acc + bias,
    multipliers, shifts) + zero_point, low, high) of int64 sums (one multiplier and shift
    per column, or one for all), x = acc + bias saturated to int32 as the definition does
    (``saturate``: the exact int64 sums may pass it where Android's int32 ones would wrap).
    The default range is int64's: no clamp, for a value added to another before saturating."""
    return OutputStage(multipliers, shifts, bias, zero_point, low, high, np.int64, saturate=True).prepare()


def _round_shift(values: np.ndarray, exponent: int) -> np.ndarray:
    """rounding_divide_by_pot(values, exponent) for one exponent > 0, in OutputStage's floor
    form: floor((v + 2^(e - 1) - [v < 0]) / 2^e)."""
    return (values + ((1 << (exponent - 1)) - (values < 0))) >> exponent


class PreparedQuantizedLstm:
    """QUANTIZED_LSTM's ``execute`` with everything that depends only on constants done
    once: the four gates' input and recurrent weights stacked into one float64 matrix each
    (two exact BLAS products per step instead of eight), the input zero points folded into
    the biases (x . W - zero_point * column sums, exact in integers), every fixed-point
    multiplier and shift decomposed, laid out per column of the stacked product, the clip
    limits and the projection's bias. Each element goes through the same integer steps as
    in ``execute`` (rescale, saturate to int16 after each accumulation, peephole, layer
    normalization, table activations), so the results are equal bit for bit."""

    def __init__(self, ctx: ExecutionContext, x: Tensor, h: Tensor, c: Tensor, cifg: bool, peephole: bool,
                 layer_norm: bool) -> None:
        self.cell_shift = cell_shift = _log2_exact(c.scale)
        units = self.units = c.shape[1]
        self.gates = [g for g in ("forget", "cell", "input", "output") if not (cifg and g == "input")]
        self.cifg, self.layer_norm = cifg, layer_norm
        self.slices = {gate: slice(k * units, (k + 1) * units) for k, gate in enumerate(self.gates)}
        input_columns, recurrent_columns, input_biases, recurrent_biases = [], [], [], []
        input_scales, recurrent_scales = [], []
        self.peepholes: dict[str, tuple[np.ndarray, int, int]] = {}
        self.norms: dict[str, tuple[Tensor, np.ndarray]] = {}
        for gate in self.gates:
            target = float(ctx.scalar(INTERMEDIATE_SCALE[gate])) if layer_norm else 2.0**-12
            bias = np.asarray(ctx.value(GATE_BIAS[gate]), dtype=np.int64)
            input_weights, recurrent_weights = ctx.input(INPUT_TO_WEIGHTS[gate]), ctx.input(RECURRENT_TO_WEIGHTS[gate])
            wx = np.asarray(input_weights.value, dtype=np.int64)
            wh = np.asarray(recurrent_weights.value, dtype=np.int64)
            input_columns.append(wx.T)
            recurrent_columns.append(wh.T)
            # (x - zx) . W' + b = x . W' + (b - zx * row sums of W): the same integers
            folded = -x.zero_point * wx.sum(axis=1)
            input_biases.append(folded if layer_norm else folded + bias)  # layer norm adds it later
            recurrent_biases.append(-h.zero_point * wh.sum(axis=1))
            input_scales.append(_effective_multiplier(input_weights.scale, x.scale, target))
            recurrent_scales.append(_effective_multiplier(recurrent_weights.scale, h.scale, target))
            if peephole and gate in CELL_TO_WEIGHTS:
                weights = ctx.input(CELL_TO_WEIGHTS[gate])
                multiplier, shift = _effective_multiplier(2.0**cell_shift, weights.scale, target)
                self.peepholes[gate] = (np.asarray(weights.value, dtype=np.int64), _rescale(multiplier, shift))
            if layer_norm:
                weights = ctx.input(LAYER_NORM_WEIGHTS[gate])
                constant = Tensor(weights.type, weights.shape, weights.scale, weights.zero_point, None,
                                  np.asarray(weights.value))
                self.norms[gate] = (constant, bias)
        self.input_weights = np.concatenate(input_columns, axis=1).astype(np.float64)
        self.recurrent_weights = np.concatenate(recurrent_columns, axis=1).astype(np.float64)
        self.input_bias = np.concatenate(input_biases)
        self.recurrent_bias = np.concatenate(recurrent_biases)

        def per_column(pairs: list[tuple[int, int]], bias: np.ndarray, **clamp: int) -> OutputStage:
            return _rescale(np.repeat(np.array([m for m, _ in pairs], dtype=np.int64), units),
                            np.repeat(np.array([s for _, s in pairs], dtype=np.int64), units), bias, **clamp)

        # the input product's rescale saturates to int16 (the gate buffer), the recurrent
        # one's is added to it first
        self.input_rescale = per_column(input_scales, self.input_bias, low=-32768, high=32767)
        self.recurrent_rescale = per_column(recurrent_scales, self.recurrent_bias)
        self.cell_limit = _clip_limit(ctx, CELL_CLIP, c.scale, 32767)
        hidden_scale = float(ctx.scalar(HIDDEN_STATE_SCALE))
        self.hidden_zero = int(ctx.scalar(HIDDEN_STATE_ZERO_POINT))
        # the hidden state's int8 values (v - zero point, clamped)
        self.hidden_rescale = _rescale(*quantize_multiplier(float(np.float32(2.0**-15 / hidden_scale * 2.0**-15))),
                                       zero_point=-self.hidden_zero, low=-128, high=127)
        self.projection = None
        if not ctx.is_omitted(PROJECTION_WEIGHTS):
            projection = ctx.input(PROJECTION_WEIGHTS)
            weights = np.asarray(projection.value, dtype=np.int64)
            bias = self.hidden_zero * weights.sum(axis=1)
            if not ctx.is_omitted(PROJECTION_BIAS):
                bias = bias + np.asarray(ctx.value(PROJECTION_BIAS), dtype=np.int64)
            self.projection = (weights.T.astype(np.float64),
                               _rescale(*_effective_multiplier(projection.scale, hidden_scale, h.scale), bias,
                                        h.zero_point, -128, 127),
                               _clip_limit(ctx, PROJECTION_CLIP, projection.scale, 127))
        self.logistic = table16(fixed_logistic, 3)
        self.tanh = table16(fixed_tanh, 3)
        self.cell_tanh = table16(fixed_tanh, cell_shift + 15)
        self.compiled = None if peephole or layer_norm else self._compiled_step(units)

    def _compiled_step(self, units: int):
        """The compiled step (``_numba_qlstm.qlstm_step_with_products``, nnapi[fast]: the
        products and everything after them in one call) with its constant arguments, or
        None (the numpy step)."""
        if _jit.kernels() is None:
            return None
        from nnapi.operations._numba_qlstm import qlstm_step_with_products

        columns = len(self.gates) * units
        offsets = np.array([self.slices[g].start if g in self.slices else -1
                            for g in ("forget", "cell", "input", "output")], dtype=np.int64)
        weights = (np.ascontiguousarray(self.input_weights), np.ascontiguousarray(self.recurrent_weights))
        if not all(_jit.compilable(stage) for stage in (self.input_rescale, self.recurrent_rescale,
                                                         self.hidden_rescale)):
            return None

        def packed(stage: OutputStage, count: int) -> tuple[np.ndarray, np.int64, np.int64]:
            # _jit.stage_parameters' saturating form as one [6, count] block (bias,
            # multipliers, left shifts, right shifts, offsets, negatives) and the clamp range:
            # one array argument per stage (each costs the compiled call's dispatch)
            bias, multipliers, lefts, rights, offsets, negatives, _, low, high, _ = _jit.stage_parameters(stage, count)
            return np.stack([bias, multipliers.astype(np.int64), lefts, rights, offsets, negatives]), low, high

        constants = (*packed(self.input_rescale, columns), *packed(self.recurrent_rescale, columns), offsets)
        tables = (self.logistic, self.tanh, self.cell_tanh)
        hidden = (int(self.cell_shift), int(self.cell_limit), *packed(self.hidden_rescale, 1))

        def step(x: np.ndarray, h: np.ndarray, previous_cell: np.ndarray, cell: np.ndarray,
                 hidden_values: np.ndarray) -> None:
            batch = x.shape[0]
            qlstm_step_with_products(x, h, *weights, np.empty((batch, columns)), np.empty((batch, columns)),
                                     *constants, previous_cell, *tables, *hidden,
                                     np.empty((batch, columns), np.int64), cell, hidden_values)

        stored = np.zeros((0, weights[0].shape[0]), np.int8), np.zeros((0, weights[1].shape[0]), np.int8)
        if not _jit.warm_up(step, *stored, np.zeros((0, units), np.int16), np.zeros((0, units), np.int16),
                            np.zeros((0, units), np.int64)):
            return None
        return step

    def __call__(self, values: list) -> list[np.ndarray]:
        if self.compiled is not None:
            return self._compiled_call(values)
        x, h = values[INPUT_TENSOR], values[PREV_OUTPUT_TENSOR]
        previous_cell = np.asarray(values[PREV_CELL_STATE_TENSOR], dtype=np.int64)
        # the products are exact integers in float64: the stages cast them
        gates = self.input_rescale(np.matmul(x.astype(np.float64), self.input_weights))
        gates += self.recurrent_rescale(np.matmul(h.astype(np.float64), self.recurrent_weights))
        _clip_in_place(gates, -32768, 32767)

        def preactivation(gate: str, cell: np.ndarray) -> np.ndarray:
            result = gates[:, self.slices[gate]]
            peephole = self.peepholes.get(gate)
            if peephole is not None:
                weights, rescale = peephole
                result = _clip_in_place(result + rescale(cell * weights), -32768, 32767)
            norm = self.norms.get(gate)
            if norm is not None:
                result = _layer_norm(result, *norm)
            return result + 32768  # the tables' index

        forget = self.logistic[preactivation("forget", previous_cell)]
        modulation = self.tanh[preactivation("cell", previous_cell)]
        if self.cifg:
            input_gate = _ONE_Q0 - forget
        else:
            input_gate = self.logistic[preactivation("input", previous_cell)]
        # Android: both products are cast to int16 (wrap-around), only their sum saturates.
        kept = _wrap16(_round_shift(forget * previous_cell, 15))
        added = _wrap16(_round_shift(input_gate * modulation, 30 + self.cell_shift))
        cell = _clip_in_place(kept + added, -32768, 32767)
        if self.cell_limit:
            _clip_in_place(cell, -self.cell_limit, self.cell_limit)
        output_gate = self.logistic[preactivation("output", cell)]
        hidden = self.hidden_rescale(output_gate * self.cell_tanh[cell + 32768])
        return self._outputs(hidden, cell.astype(np.int16))

    def _compiled_call(self, values: list) -> list[np.ndarray]:
        """``__call__`` as one compiled call: the products (exact integers, as numpy's
        float64 ones), the gates, the cell and the hidden state."""
        x = _jit.kernel_input(values[INPUT_TENSOR])
        batch, units = x.shape[0], self.units
        cell = np.empty((batch, units), np.int16)
        hidden = np.empty((batch, units), np.int64)
        self.compiled(x, _jit.kernel_input(values[PREV_OUTPUT_TENSOR]),
                      _jit.kernel_input(values[PREV_CELL_STATE_TENSOR]), cell, hidden)
        return self._outputs(hidden, cell)

    def _outputs(self, hidden: np.ndarray, cell: np.ndarray) -> list[np.ndarray]:
        """The three outputs from the hidden state's int8 values (int64) and the new cell
        state (int16): the output through the projection when there is one."""
        if self.projection is None:
            output = hidden
        else:
            weights, rescale, limit = self.projection
            output = rescale(np.matmul(hidden.astype(np.float64), weights))
            if limit:
                _clip_in_place(output, -limit, limit)
        output = output.astype(np.int8)
        return [output, cell, output.copy()]
