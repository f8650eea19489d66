"""Quantization arithmetic, defined once for every operation.

- ``quantize`` / ``dequantize`` / ``dequantize_per_channel`` / ``requantize``: q =
  round(real / scale) + zero_point, real = (q - zero_point) * scale (per channel:
  q * scales[c]), and stored values
  re-expressed in another quantization with rounding half away from zero (C's round, as
  Android's kernels use) and saturation to the stored type.
- ``quantize_multiplier(s)``: a real multiplier as an int32 Q31 mantissa and a power of
  two exponent, exactly as Android's QuantizeMultiplier (frexp, round, carry, flush to
  zero below 2**-31).
- ``rescale_multiplier(s)``: that of an effective scale scale * factor / output scale,
  derived from the float32 scales as Android's kernels do (a float product, a double or,
  where the kernel says so, a float quotient): every quantized operation's multiplier.
- ``multiply_by_quantized_multiplier``: TFLite's MultiplyByQuantizedMultiplier step by step
  (saturating left shift, rounding doubling high multiply, rounding right shift), the
  definition the fast output stage is tested against.
- ``inverse_sqrt_multipliers`` / ``l2_normalize_fixed_point``: 8-bit L2_NORMALIZATION as
  Android's kernels compute it (an int32 sum of squares, its inverse square root by
  Newton's iteration in gemmlowp fixed point, one rescale per element).
- ``prelu_fixed_point``: 8-bit PRELU as Android's kernel computes it (two quantized
  multipliers, one for x >= 0 and one for the product x * alpha).
- ``mean_multiplier``: the fixed-point multiplier with which TFLite's 8-bit Mean rescales
  its int32 sum when the output's quantization differs from the input's.
- ``OutputStage``: the quantized output stage of convolutions and matrix products
  (int32 accumulators + bias -> MultiplyByQuantizedMultiplier per channel -> + zero point
  -> activation clamp) with everything that depends on constants computed once, and the
  per-element work folded into a few in-place int64 passes.
"""

from __future__ import annotations

import math

import numpy as np

_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


# --- rounding, (de)quantization ---------------------------------------------------------
def half_below(dtype) -> np.floating:
    """The largest value of float ``dtype`` below one half (0.5 - 2**-25 in float32).

    C's round (std::round: halves away from zero, what Android's kernels call) is
    trunc(|x| + 0.5) in exact arithmetic, but in floating point |x| + 0.5 itself rounds:
    up to 1 for the largest value below one half (C's round gives 0), and to the even
    neighbour for odd integers past the mantissa (2**23 + 1 in float32). Adding this
    constant instead rounds exactly as C does for every finite x of ``dtype``, with no
    extra operation: a tie n + 0.5 gives n + 1 - 2**-25, which rounds to n + 1 (for n >= 1
    the spacing there is at least 2**-23; for n = 0, 1 - 2**-25 is halfway between 1 - 2**-24
    and 1 and goes to 1, the even one), a value below a tie stays below n + 1 (n + 1 - ulp
    is representable), and an integer past the mantissa gains less than half its ulp."""
    return np.nextafter(np.dtype(dtype).type(0.5), np.dtype(dtype).type(0))


#: ``half_below`` of float32 and float64, computed once here for every kernel and lowering
#: that rounds as C does (numba kernels read them as constants, ONNX graphs as initializers)
HALF_BELOW_FLOAT32 = half_below(np.float32)
HALF_BELOW_FLOAT64 = half_below(np.float64)
_HALF_BELOW = {np.dtype(np.float16): half_below(np.float16), np.dtype(np.float32): HALF_BELOW_FLOAT32,
               np.dtype(np.float64): HALF_BELOW_FLOAT64}
#: ``half_below`` of float64, as a Python float (quantize_scalar's)
_HALF_BELOW_FLOAT = float(HALF_BELOW_FLOAT64)


def round_half_away(x: np.ndarray) -> np.ndarray:
    """Round to nearest, halves away from zero, exactly as C's round (used by Android's
    kernels): copysign(trunc(|x| + half_below), x) (see ``half_below``: |x| + 0.5 would
    round 0.5 - 2**-25 up to 1 in float32), computed without numpy's copysign of a scalar
    and a float64 array (~7 ns per element, against ~1 for these three passes)."""
    magnitude = np.abs(x)
    if isinstance(magnitude, np.ndarray) and magnitude.dtype.kind == "f":  # one new array, worked in place
        magnitude += _HALF_BELOW[magnitude.dtype]
        np.trunc(magnitude, out=magnitude)
        return np.copysign(magnitude, x, out=magnitude)
    if isinstance(magnitude, np.floating):
        return np.copysign(np.trunc(magnitude + _HALF_BELOW[magnitude.dtype]), x)
    return np.copysign(np.trunc(magnitude + _HALF_BELOW_FLOAT), x)  # Python numbers: float64


def quantize(real, scale: float, zero_point: int, dtype=np.float64, *, round_last: bool = False) -> np.ndarray:
    """Stored values of reals, halves rounded away from zero, computed in ``dtype``
    (float64, or float32 where Android divides in float32); not yet saturated.

    Android rounds in two orders, which differ on negative ties: zero_point +
    round(real / scale) (QUANTIZE, activation ranges, TFLite's quantize) and, with
    ``round_last``, round(real / scale + zero_point) (convertFloat32ToQuant and requantize,
    for results computed in float)."""
    scaled = np.asarray(real, dtype=dtype) / dtype(scale)
    if not isinstance(scaled, np.ndarray) or np.ndim(zero_point):  # a scalar, or zero points to broadcast
        if round_last:
            return round_half_away(scaled + dtype(zero_point))
        return round_half_away(scaled) + dtype(zero_point)
    # the same operations on arrays this function owns, in place (large arrays: each new
    # one costs its page faults)
    if round_last:
        scaled += dtype(zero_point)
        return round_half_away(scaled)
    rounded = round_half_away(scaled)
    rounded += dtype(zero_point)
    return rounded


def quantize_scalar(real: float, scale: float, zero_point: int) -> float:
    """``quantize`` of one real in float64 (zero_point + round(real / scale)): the same
    IEEE double operations on Python floats, where numpy's scalar path costs ~10 us (an
    activation's clamp range, at every preparation of a quantized operation)."""
    scaled = float(real) / float(scale)
    magnitude = abs(scaled) + _HALF_BELOW_FLOAT  # C's round exactly (see half_below)
    if magnitude != magnitude or magnitude in (math.inf, -math.inf):  # NaN or infinite: as numpy's
        return float(quantize(real, scale, zero_point))
    return math.copysign(float(math.floor(magnitude)), scaled) + float(zero_point)


def dequantize(values: np.ndarray, scale: float, zero_point: int, dtype=np.float64) -> np.ndarray:
    """Real values of stored quantized integers, (q - zero_point) * scale, computed in
    ``dtype``; scale and zero point may be arrays that broadcast against ``values``."""
    return (np.asarray(values).astype(dtype) - dtype(zero_point)) * dtype(scale)


def dequantize_per_channel(values: np.ndarray, scales, channel_dim: int, dtype=np.float32) -> np.ndarray:
    """Real values of TENSOR_QUANT8_SYMM_PER_CHANNEL integers: q * scales[c] along
    ``channel_dim`` (zero point 0), computed in ``dtype``."""
    values = np.asarray(values).astype(dtype)
    shape = [1] * values.ndim
    shape[channel_dim] = -1
    return values * np.asarray(scales, dtype=dtype).reshape(shape)


def requantize(values: np.ndarray, scale: float, zero_point: int, to_scale: float, to_zero_point: int,
               dtype=None) -> np.ndarray:
    """Stored values re-expressed in another scale / zero point, as Android's requantize:
    round((q - zero_point) * scale / to_scale + to_zero_point) in float64, halves away
    from zero, saturated to ``dtype`` (by default the values' own). 8-bit values go
    through a 256-entry table: each possible value is computed once."""
    values = np.asarray(values)
    dtype = np.dtype(dtype or values.dtype)
    if (scale, zero_point) == (to_scale, to_zero_point) and dtype == values.dtype:
        return values
    if values.dtype.itemsize == 1 and values.size > 256:
        stored = np.arange(256, dtype=np.uint8).view(values.dtype)  # by bit pattern
        return np.take(_requantize(stored, scale, zero_point, to_scale, to_zero_point, dtype),
                       values.view(np.uint8))
    return _requantize(values, scale, zero_point, to_scale, to_zero_point, dtype)


def _requantize(values, scale, zero_point, to_scale, to_zero_point, dtype) -> np.ndarray:
    info = np.iinfo(dtype)
    scaled = quantize(dequantize(values, scale, zero_point), to_scale, to_zero_point, round_last=True)
    return np.clip(scaled, info.min, info.max).astype(dtype)


def requantize_concatenated(values: np.ndarray, scale: float, zero_point: int, to_scale: float,
                            to_zero_point: int) -> np.ndarray:
    """8-bit stored values re-expressed in another quantization as Android's CONCATENATION
    does it (TFLite's legacy reference Concatenation with scales; int8 as uint8 + 128,
    both zero points moved with it): unchanged where the quantizations are equal, else
    round(u * s + b) + to_zero_point in C float, s = scale * (1 / to_scale) and
    b = -zero_point * s each rounded to float32, u * s and the sum too, then C's round
    (halves away from zero) and saturation. Differs from ``requantize`` (one rounding of
    the float64 real value, the zero point inside it) on ties and near them. Through the
    256-entry ``concatenation_table``."""
    values = np.asarray(values)
    table = concatenation_table(values.dtype, scale, zero_point, to_scale, to_zero_point)
    return values if table is None else np.take(table, values.view(np.uint8))


def concatenation_table(dtype, scale: float, zero_point: int, to_scale: float,
                        to_zero_point: int) -> np.ndarray | None:
    """``requantize_concatenated``'s result for each of the 256 values of the 8-bit
    ``dtype``, by bit pattern (index: the value's uint8 view), in that dtype; None where
    the quantizations are equal (the values are kept as they are). Prepared kernels
    make it once, at preparation."""
    if (float(scale), int(zero_point)) == (float(to_scale), int(to_zero_point)):
        return None
    dtype = np.dtype(dtype)
    shift = 128 if dtype == np.int8 else 0
    # the uint8 domain's stored value of each bit pattern
    unsigned = (np.arange(256, dtype=np.uint8).view(dtype).astype(np.int64) + shift).astype(np.float32)
    factor = np.float32(scale) * (np.float32(1) / np.float32(to_scale))
    bias = np.float32(-(int(zero_point) + shift)) * factor
    rounded = round_half_away(unsigned * factor + bias).astype(np.int64) + (int(to_zero_point) + shift)
    return (np.clip(rounded, 0, 255) - shift).astype(dtype)


# --- fixed-point multipliers ---------------------------------------------------------------
def quantize_multipliers(reals) -> tuple[np.ndarray, np.ndarray]:
    """Android's QuantizeMultiplier over an array of non-negative reals: int64 arrays of
    Q31 mantissas and exponents with real = mantissa * 2**(exponent - 31); multipliers
    below 2**-32 (exponent < -31) flush to (0, 0)."""
    mantissa, exponent = np.frexp(np.asarray(reals, dtype=np.float64))
    fixed = round_half_away(mantissa * float(1 << 31)).astype(np.int64)
    exponent = exponent.astype(np.int64)
    carry = fixed == (1 << 31)
    fixed = np.where(carry, fixed // 2, fixed)
    exponent = exponent + carry
    tiny = exponent < -31
    return np.where(tiny, 0, fixed), np.where(tiny, 0, exponent)


def quantize_multiplier(real: float) -> tuple[int, int]:
    """Android's QuantizeMultiplier for one real: (int32 Q31 mantissa, exponent)."""
    fixed, exponent = quantize_multipliers(real)
    return int(fixed), int(exponent)


def rescale_multipliers(scale, factor, output_scale, *,
                        float32_quotient: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Android's QuantizeMultiplier (``quantize_multipliers``) of the effective scale
    scale * factor / output_scale, derived from the NDK's float32 scales as Android's
    kernels write it in C: the product scale * factor in float (rounded to float32; a
    ``factor`` of 1 leaves the scale as it is), divided by the output scale in double (the
    product held in a double first: convolutions, FULLY_CONNECTED, BATCH_MATMUL, MUL, ADD,
    PRELU's negative side, Mean's rescale) or, with ``float32_quotient``, in float (PRELU's
    positive side divides two floats before the double; QUANTIZED_LSTM's effective scales
    and TFLite's MUL are float throughout). The two quotients differ in the multiplier's
    last bits, so the choice is each kernel's, not ours. ``factor`` may be an array (one
    per channel, or candidates); returns int64 arrays of its shape (0-d for scalars)."""
    product = np.float32(scale) * np.asarray(factor, dtype=np.float32)
    if float32_quotient:
        real = np.asarray(product / np.float32(output_scale), dtype=np.float64)
    else:
        real = np.asarray(product, dtype=np.float64) / np.float64(np.float32(output_scale))
    return quantize_multipliers(real)


def rescale_multiplier(scale, factor, output_scale, *, float32_quotient: bool = False) -> tuple[int, int]:
    """``rescale_multipliers`` of one scale product: (int32 Q31 mantissa, exponent)."""
    fixed, exponent = rescale_multipliers(scale, factor, output_scale, float32_quotient=float32_quotient)
    return int(fixed), int(exponent)


def multiply_by_quantized_multiplier(values, multiplier, shift) -> np.ndarray:
    """TFLite's MultiplyByQuantizedMultiplier, element-wise (``multiplier`` and ``shift``
    may be arrays that broadcast against ``values``): x saturated to int32 after a left
    shift by max(shift, 0), the rounding doubling high multiply
    trunc((x * m + nudge) / 2**31) (nudge 2**30, or 1 - 2**30 for negative products;
    a product of two INT32_MIN saturates), then a right shift by max(-shift, 0) rounding
    halves away from zero. Returns int64."""
    x = np.asarray(values, dtype=np.int64)
    shift = np.asarray(shift, dtype=np.int64)
    x = np.clip(x << np.maximum(shift, 0), _INT32_MIN, _INT32_MAX)
    return rounding_divide_by_pot(rounding_doubling_high_multiply(x, multiplier), np.maximum(-shift, 0))


def _doubling_high_multiply(a, b, bits: int) -> np.ndarray:
    """gemmlowp's SaturatingRoundingDoublingHighMul on ``bits``-wide signed values:
    trunc((a * b + nudge) / 2**(bits - 1)), the nudge 2**(bits - 2) or 1 - 2**(bits - 2) for
    negative products; the product of two minimum values saturates to the maximum."""
    a = np.asarray(a, dtype=np.int64)
    b = np.asarray(b, dtype=np.int64)
    low = -(1 << (bits - 1))
    product = a * b
    half = 1 << (bits - 2)
    nudged = product + np.where(product >= 0, half, 1 - half)
    high = np.where(nudged >= 0, nudged >> (bits - 1), -((-nudged) >> (bits - 1)))  # C division truncates
    return np.where((a == low) & (b == low), -low - 1, high)


def rounding_doubling_high_multiply(a, b) -> np.ndarray:
    """gemmlowp's SaturatingRoundingDoublingHighMul on int32 values, element-wise:
    trunc((a * b + nudge) / 2**31) with nudge 2**30, or 1 - 2**30 for negative products;
    a product of two INT32_MIN saturates to INT32_MAX. Returns int64."""
    return _doubling_high_multiply(a, b, 32)


def rounding_divide_by_pot(x, exponent) -> np.ndarray:
    """gemmlowp's RoundingDivideByPOT: x / 2**exponent rounded to nearest, halves away from
    zero (``exponent`` >= 0, may be an array). Returns int64."""
    x = np.asarray(x, dtype=np.int64)
    exponent = np.asarray(exponent, dtype=np.int64)
    mask = (np.int64(1) << exponent) - 1
    remainder = x & mask
    threshold = (mask >> 1) + (x < 0)
    return (x >> exponent) + (remainder > threshold)


def rounding_doubling_high_multiply16(a, b) -> np.ndarray:
    """gemmlowp's SaturatingRoundingDoublingHighMul on int16 values, element-wise:
    trunc((a * b + nudge) / 2**15) with nudge 2**14, or 1 - 2**14 for negative products;
    a product of two INT16_MIN saturates to INT16_MAX. Returns int64."""
    return _doubling_high_multiply(a, b, 16)


def rounding_divide_by_pot16(x, exponent: int) -> np.ndarray:
    """gemmlowp's RoundingDivideByPOT on int16 values: as ``rounding_divide_by_pot``, but
    its mask 2**exponent - 1 is an int16 too, all ones from an exponent of 16 on (TFLite's
    int16 kernels shift that far for tiny multipliers: the result is then the sign's -1 or
    +1 as they compute it, never the 0 a wider mask gives). Returns int64."""
    x = np.asarray(x, dtype=np.int64)
    mask = (((1 << exponent) - 1 + 32768) & 0xFFFF) - 32768
    threshold = (mask >> 1) + (x < 0)
    return (x >> exponent) + ((x & mask) > threshold)


def int16_multiplier(real: float) -> tuple[int, int]:
    """TFLite's QuantizeMultiplier then DownScaleInt32ToInt16Multiplier: (Q15 mantissa,
    exponent), the Q31 mantissa rounded to 16 bits (halves up), at most INT16_MAX."""
    fixed, exponent = quantize_multiplier(real)
    return min(32767, (fixed + (1 << 15)) >> 16), exponent


def saturating_shift_left(x, exponent: int) -> np.ndarray:
    """gemmlowp's SaturatingRoundingMultiplyByPOT for a positive ``exponent`` on int32
    values: x * 2**exponent, saturated to INT32_MIN / INT32_MAX where |x| exceeds
    2**(31 - exponent) - 1. Returns int64."""
    x = np.asarray(x, dtype=np.int64)
    threshold = (1 << (31 - exponent)) - 1
    return np.where(x > threshold, _INT32_MAX, np.where(x < -threshold, _INT32_MIN, x << exponent))


def wrap32(x: np.ndarray) -> np.ndarray:
    """int64 values reduced to int32 as two's complement wraps them (gemmlowp's raw
    subtraction of fixed-point values does not saturate)."""
    return ((x - _INT32_MIN) & 0xFFFFFFFF) + _INT32_MIN


#: gemmlowp's fixed-point constants of the inverse square root: 1.5 with 3 integer bits
#: (Q3.28) and sqrt(2) / 2 with none (Q0.31), and the Q3.28 one
_HALF_THREE_Q3 = (1 << 28) + (1 << 27)
_HALF_SQRT2_Q0 = 1518500250
_ONE_Q3 = 1 << 28


def inverse_sqrt_multipliers(sums) -> tuple[np.ndarray, np.ndarray]:
    """TFLite's GetInvSqrtQuantizedMultiplierExp (used by Android's 8-bit L2_NORMALIZATION
    and QUANTIZED_LSTM's layer normalization) over an array of non-negative int32 sums:
    (Q31 multipliers, right shifts >= 0) with multiplier * 2**-(31 + shift) close to 1 / sqrt(sum).

    Sums of 0 or 1 give (INT32_MAX, 0). Otherwise the sum is brought into [2**27, 2**29)
    by dividing by 4 (truncating) or shifting left by pairs of bits, the shift tracked from
    11; its inverse square root is five Newton steps x <- 1.5 x - (sum / 2) x**3 in Q3.28
    fixed point from x = 1 (products: SaturatingRoundingDoublingHighMul; the cube rescaled
    by a saturating shift of 6, the step's result by 3, their difference wrapping as
    int32), times sqrt(2) / 2 in Q0.31; a negative shift is moved into the multiplier."""
    x = np.atleast_1d(np.asarray(sums, dtype=np.int64)).copy()
    trivial = x <= 1
    shift = np.full(x.shape, 11, dtype=np.int64)
    while np.any(big := x >= (1 << 29)):
        x = np.where(big, x // 4, x)
        shift += big
    x = np.where(trivial, 1 << 27, x)  # any value in range; replaced below
    # left shift by pairs of bits, one pair fewer than the leading zeros allow
    leading_zeros = 32 - _bit_length(x)
    pairs = (leading_zeros - 1) // 2 - 1
    shift -= pairs
    x <<= 2 * pairs
    half_input = rounding_divide_by_pot(x >> 1, 1)  # x / 2 in Q3.28 (x itself is Q3.28 of x >> 1)
    estimate = np.full(x.shape, _ONE_Q3, dtype=np.int64)
    for _ in range(5):
        cube = rounding_doubling_high_multiply(rounding_doubling_high_multiply(estimate, estimate), estimate)
        cube = saturating_shift_left(cube, 6)
        step = wrap32(rounding_doubling_high_multiply(_HALF_THREE_Q3, estimate)
                      - rounding_doubling_high_multiply(half_input, cube))
        estimate = saturating_shift_left(step, 3)
    multiplier = rounding_doubling_high_multiply(estimate, _HALF_SQRT2_Q0)
    negative = shift < 0
    multiplier = np.where(negative, wrap32(multiplier << np.where(negative, -shift, 0)), multiplier)
    shift = np.where(negative, 0, shift)
    return np.where(trivial, _INT32_MAX, multiplier), np.where(trivial, 0, shift)


def _bit_length(x: np.ndarray) -> np.ndarray:
    """Bit lengths of non-negative int64 values below 2**53 (exact through float64's
    exponent)."""
    return np.where(x > 0, np.frexp(x.astype(np.float64))[1], 0).astype(np.int64)


def l2_normalize_fixed_point(offsets: np.ndarray, output_zero_point: int, low: int, high: int,
                             shift_into_multiplier: bool = False) -> np.ndarray:
    """Android's 8-bit L2_NORMALIZATION along the last axis of ``offsets`` (the stored
    values minus the input zero point, integers): the int32 sum of squares per vector,
    its ``inverse_sqrt_multipliers`` (m, right shift r), then each offset x rescaled onto
    the output's 1/128 scale, plus the output zero point (128 or 0), clamped to [``low``,
    ``high``]. Returns int64.

    Android rescales in two ways: x * 128 by m then divided by 2**r
    (SaturatingRoundingDoublingHighMul, RoundingDivideByPOT: its uint8 kernels and its
    int8 one along an axis other than the last), or, with ``shift_into_multiplier`` (int8
    along the last axis: TFLite's integer kernel, which LiteRT runs too),
    MultiplyByQuantizedMultiplier(x, m, 7 - r), the 2**7 folded into the exponent (a left
    shift before the high multiply where 7 > r), which rounds differently. The sum would
    wrap as int32 only past 33,000 elements of 255; it is kept in int64."""
    offsets = np.asarray(offsets, dtype=np.int64)
    sums = np.einsum("...i,...i->...", offsets, offsets)
    multiplier, shift = inverse_sqrt_multipliers(sums.reshape(-1))
    multiplier = multiplier.reshape(sums.shape)[..., None]
    shift = shift.reshape(sums.shape)[..., None]
    if shift_into_multiplier:
        scaled = multiply_by_quantized_multiplier(offsets, multiplier, 7 - shift)
    else:
        scaled = rounding_divide_by_pot(rounding_doubling_high_multiply(offsets * 128, multiplier), shift)
    return np.clip(scaled + output_zero_point, low, high)


def prelu_multipliers(input_scale: float, alpha_scale: float, output_scale: float
                      ) -> tuple[tuple[int, int], tuple[int, int]]:
    """The (Q31 mantissa, exponent) pairs of ``prelu_fixed_point``'s two rescales: x >= 0
    by input scale / output scale (a float quotient), x < 0 the product x * alpha by
    (input scale * alpha scale) / output scale (divided in double)."""
    return (rescale_multiplier(input_scale, 1, output_scale, float32_quotient=True),
            rescale_multiplier(input_scale, alpha_scale, output_scale))


def prelu_fixed_point(x_offsets, alpha_offsets, input_scale: float, alpha_scale: float, output_scale: float,
                      output_zero_point: int, low: int, high: int) -> np.ndarray:
    """Android's 8-bit PRELU (TFLite's integer PReLU too) on offset values x = q - zero
    point and alpha = q_alpha - alpha zero point (broadcasting): x >= 0 rescaled by the
    quantized multiplier of input scale / output scale, x < 0 the int32 product x * alpha
    rescaled by that of (input scale * alpha scale) / output scale (both in C float from
    the float32 scales, the product kept in float32 and divided in double, as Android's
    kernel does), plus the output zero point, saturated to [``low``, ``high``]. Returns
    int64."""
    positive, negative = prelu_multipliers(input_scale, alpha_scale, output_scale)
    x = np.asarray(x_offsets, dtype=np.int64)
    alpha = np.asarray(alpha_offsets, dtype=np.int64)
    result = np.where(x >= 0, multiply_by_quantized_multiplier(x, *positive),
                      multiply_by_quantized_multiplier(x * alpha, *negative))
    return np.clip(result + output_zero_point, low, high)


def mean_multiplier(input_scale: float, output_scale: float, count: int) -> tuple[int, int]:
    """TFLite's 8-bit Mean (LiteRT's builtin kernel) with an output quantization other than
    its input's: the int32 sum of (q - input zero point) over ``count`` elements becomes
    MultiplyByQuantizedMultiplier(sum, m, e) + output zero point, with (m, e) derived here:
    QuantizeMultiplier of input scale / output scale (float32 scales, double quotient), then
    m shifted left by k = min(floor(log2 count), 32, 31 + e) bits and divided by ``count``
    in integers (truncating), e lowered by k. The mantissa may fall below 2**30 (it is
    not renormalized), so no QuantizeMultiplier of a real gives it in general."""
    fixed, exponent = rescale_multiplier(input_scale, 1, output_scale)
    shift = min(int(count).bit_length() - 1, 32, 31 + exponent)
    return (fixed << shift) // int(count), exponent - shift


# --- the output stage of convolutions and matrix products -----------------------------------
class OutputStage:
    """Int32 accumulators to quantized outputs, prepared once.

    ``multipliers`` / ``shifts`` (one per output channel, channels last, or one for all:
    then held 0-d, so that the outputs keep the accumulators' shape, a 0-d one included),
    ``bias`` (int32 per channel or None), the output ``zero_point``, the clamp range
    [``low``, ``high``] (the type's range narrowed by the fused activation) and the output
    ``dtype``. Applying it equals, element by element,
    clip(multiply_by_quantized_multiplier(acc + bias, m, shift) + zero_point, low, high).

    For shifts <= 0 (multipliers below one, the usual case) the high multiply and the
    rounding right shift by r compose into one floor division by 2**(31 + r):
    floor((x * m + 2**30 + half * 2**31 - [x * m < -2**30] * 2**31) / 2**(31 + r)) with
    half = 2**(r - 1) (0 when r = 0, where the negative correction also vanishes), and the
    bias and zero point fold into the per-channel constant; in int64 the correction is
    applied after the first shift by 31 so no step can overflow. The correction only
    changes results at or below the zero point, so it is skipped when the clamp maps all
    of those to the zero point (fused ReLU / ReLU6).

    With ``saturate`` (accumulators that may pass int32: QUANTIZED_LSTM's int64 sums) or
    any shift > 0, x = acc + bias is formed first, shifted left by max(shift, 0) and
    saturated to int32, as the definition does, and the same folded rounding follows
    (the bias then out of the constant; a left-shifted channel has r = 0).
    """

    def __init__(self, multipliers, shifts, bias, zero_point: int, low: int, high: int, dtype, *,
                 saturate: bool = False) -> None:
        self.multipliers = _per_channel(multipliers)
        self.shifts = _per_channel(shifts)
        self.bias = _per_channel(0 if bias is None else bias)
        self.zero_point, self.low, self.high = int(zero_point), int(low), int(high)
        self.dtype = np.dtype(dtype)
        #: x = acc + bias saturated to int32 before the multiply (see the class)
        self.saturating = bool(saturate) or bool(np.any(self.shifts > 0))
        # The folded form's constants (``_folded``) are made at the first call, or by
        # ``prepare``: a stage that a compiled kernel runs (``_jit.FusedOutputStage``, which
        # reads only the fields above) never needs them, and each costs a few numpy calls.
        self._folding: tuple | None = None

    def prepare(self) -> OutputStage:
        """Make the folded form's constants now (at preparation, for a stage numpy runs)."""
        if self._folding is None:
            self._folding = self._folded()
        return self

    def _folded(self) -> tuple:
        """(fast, left shifts or None, constant, rounds, right shifts, total shift, uniform
        right shift or None, correction threshold, clamp bounds as int64): the folded form
        (see the class)."""
        right = np.maximum(-self.shifts, 0)
        # the folded form shifts the zero point left by 31 + r: it must fit in int64
        fast = 32 + int(right.max()) + abs(self.zero_point).bit_length() < 63
        left = np.maximum(self.shifts, 0) if np.any(self.shifts > 0) else None
        half = np.where(right > 0, np.left_shift(1, np.maximum(right - 1, 0)), 0)
        m = self.multipliers
        folded_bias = 0 if self.saturating else self.bias  # else added before the saturation
        constant = folded_bias * m + (1 << 30) + (half << 31) + (np.int64(self.zero_point) << (31 + right))
        uniform_right = int(right.flat[0]) if np.all(right == right.flat[0]) else None
        total_shift = 31 + uniform_right if uniform_right is not None else 31 + right
        # x * m < -2**30 with x = acc + bias  <=>  acc * m < -2**30 - bias * m
        threshold = np.where(right > 0, -(1 << 30) - folded_bias * m, np.iinfo(np.int64).min)
        return (fast, left, constant, bool(np.any(right > 0)), right, total_shift, uniform_right, threshold,
                np.int64(self.low), np.int64(self.high))

    def __call__(self, acc: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """The quantized outputs of ``acc`` (integers, or floats holding exact integers),
        written into ``out`` (of the output dtype and ``acc``'s shape) when given."""
        folding = self._folding
        if folding is None:  # two threads may both compute it: equal values
            folding = self._folding = self._folded()
        fast, left, constant, rounds, right, total_shift, uniform_right, threshold, low64, high64 = folding
        if not fast:
            result = self.reference(acc)
            if out is None:
                return result
            out[...] = result
            return out
        if self.saturating:  # x = acc + bias, shifted left, saturated to int32, then multiplied
            p = np.asarray(np.add(acc, self.bias, dtype=np.int64, casting="unsafe"))  # (0-d: an array too)
            if left is not None:
                p <<= left
            np.maximum(p, _INT32_MIN, out=p)
            np.minimum(p, _INT32_MAX, out=p)
            p *= self.multipliers
        else:  # one pass: the accumulators (exact integers) cast to int64 and multiplied
            p = np.multiply(acc, self.multipliers, dtype=np.int64, casting="unsafe")
        # The negative-tie correction only moves results at or below the zero point; when
        # the clamp (a fused ReLU) sends all of those to the zero point it can be skipped.
        correct = rounds and self.low < self.zero_point
        if correct:
            negative = p < threshold
        p += constant
        if correct:
            p >>= 31
            p -= negative
            p >>= uniform_right if uniform_right is not None else right
        else:  # the nested floors compose into one shift
            p >>= total_shift
        if out is None and self.dtype == np.int64 and isinstance(p, np.ndarray):
            # int64 results: clamped in place, each bound only where it can bind (two ufunc
            # calls cost less than np.clip's wrapper on a recurrent step's few hundred values)
            if self.low > _INT64_MIN:
                np.maximum(p, low64, out=p)
            if self.high < _INT64_MAX:
                np.minimum(p, high64, out=p)
            return p
        if out is None:
            out = np.empty(p.shape, self.dtype)
        # clamp and narrow in one pass (the clamped values fit the output dtype); ``out``
        # itself is returned (numpy's clip gives a scalar for a 0-d one)
        np.clip(p, low64, high64, out=out, casting="unsafe")
        return out

    def reference(self, acc: np.ndarray) -> np.ndarray:
        """The same stage by its definition (any shifts, no folding)."""
        total = np.asarray(acc).astype(np.int64) + self.bias
        scaled = multiply_by_quantized_multiplier(total, self.multipliers, self.shifts)
        return np.asarray(np.clip(scaled + self.zero_point, self.low, self.high).astype(self.dtype))


def _per_channel(values) -> np.ndarray:
    """An output stage's constants as int64: one value for all channels 0-d (it then
    broadcasts against accumulators of any shape without adding a dimension)."""
    values = np.asarray(values, dtype=np.int64)
    return values.reshape(()) if values.size == 1 else values


# --- quantized ADD / SUB / MUL as Android's CPU driver computes them -----------------------
#: how far Android's 8-bit ADD / SUB shift each input's offset values left before rescaling
#: them (its kernels' left_shift: room for the rescaled values' fraction in int32)
ADD_LEFT_SHIFT = 20


def _float32(value: float) -> np.float32:
    """A scale as the NDK stores it (C float), for multipliers derived as Android does."""
    return np.float32(value)


class FixedPointAdd:
    """Android's quantized ADD (and SUB, ``subtract``) of 8-bit stored values, prepared
    once for two input quantizations and an output: each input's offset value (q - zero
    point) shifted left by ``ADD_LEFT_SHIFT``, rescaled by the quantized multiplier of
    scale / (2 * max input scale) (SaturatingRoundingDoublingHighMul, then
    RoundingDivideByPOT), the two summed (SUB: the second's multiplier negated, which
    rounds its negative ties as the doubling high multiply does, not as a negated sum),
    then the output stage: the multiplier of 2 * max input scale / (2**20 * output scale),
    plus the output zero point, clamped to [``low``, ``high``] (the type's range narrowed
    by the fused activation). The multipliers are derived as Android's kernel does: float32
    scales, 2 * max in float32, the ratios in double, QuantizeMultiplier.

    Each input has 256 stored values, so its rescaled terms form a 256-entry int64 table
    (``terms``, by the values' uint8 views); a call looks both up and runs the output stage
    on their sums. Android's kernel refuses an output multiplier of 1 or more (an output
    scale below 2 * max input scale / 2**20); here the output stage then shifts left, as
    TFLite's MultiplyByQuantizedMultiplier does."""

    def __init__(self, first: tuple[float, int], second: tuple[float, int], output: tuple[float, int],
                 low: int, high: int, dtype, subtract: bool = False) -> None:
        first_scale, second_scale, output_scale = (_float32(q[0]) for q in (first, second, output))
        twice_max = np.float32(2) * max(first_scale, second_scale)
        m1, s1 = rescale_multiplier(first_scale, 1, twice_max)
        m2, s2 = rescale_multiplier(second_scale, 1, twice_max)
        m_out, s_out = rescale_multiplier(twice_max, 1, np.float32(1 << ADD_LEFT_SHIFT) * output_scale)
        self.multipliers = ((m1, s1), (-m2 if subtract else m2, s2), (m_out, s_out))
        self.dtype = np.dtype(dtype)
        stored = np.arange(256, dtype=np.uint8).view(self.dtype)
        #: each input's rescaled offset values, by the stored values' uint8 views
        self.terms = tuple(
            multiply_by_quantized_multiplier((stored.astype(np.int64) - int(zero_point)) << ADD_LEFT_SHIFT, m, s)
            for (_, zero_point), (m, s) in ((first, (m1, s1)), (second, self.multipliers[1])))
        self.stage = OutputStage(m_out, s_out, None, int(output[1]), low, high, self.dtype).prepare()

    def __call__(self, first: np.ndarray, second: np.ndarray) -> np.ndarray:
        """The stored results of two arrays of stored values (broadcasting)."""
        first, second = np.asarray(first), np.asarray(second)
        total = self.terms[0][first.view(np.uint8)] + self.terms[1][second.view(np.uint8)]
        return self.stage(total)


class FixedPointMul:
    """Android's quantized MUL of 8-bit stored values, prepared once: the two offset
    values (q - zero point) multiplied in integers, rescaled once by the quantized
    multiplier of s1 * s2 / output scale (the product of the float32 scales rounded to
    float32, as Android's kernel computes it in C float, then divided in double), plus the
    output zero point, clamped to [``low``, ``high``]."""

    def __init__(self, first: tuple[float, int], second: tuple[float, int], output: tuple[float, int],
                 low: int, high: int, dtype) -> None:
        self.multiplier = rescale_multiplier(first[0], second[0], output[0])
        self.zero_points = (int(first[1]), int(second[1]))
        self.stage = OutputStage(*self.multiplier, None, int(output[1]), low, high, dtype).prepare()

    def __call__(self, first: np.ndarray, second: np.ndarray) -> np.ndarray:
        """The stored results of two arrays of stored values (broadcasting)."""
        product = np.subtract(first, self.zero_points[0], dtype=np.int64)
        product = product * np.subtract(second, self.zero_points[1], dtype=np.int64)
        return self.stage(product)
