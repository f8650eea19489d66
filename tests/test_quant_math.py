"""quant_math against the fixed-point definitions, written out in plain Python integers
(C semantics: division truncates toward zero) and checked over edge cases and many
random values."""

from __future__ import annotations

import math

import numpy as np
import pytest

from nnapi.operations.quant_math import (
    OutputStage,
    dequantize,
    dequantize_per_channel,
    multiply_by_quantized_multiplier,
    quantize,
    quantize_multiplier,
    quantize_multipliers,
    quantize_scalar,
    requantize,
    rescale_multiplier,
    rescale_multipliers,
    round_half_away,
    rounding_divide_by_pot,
    rounding_doubling_high_multiply,
)

RNG = np.random.default_rng(17)
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1


def _c_round(x: float) -> int:
    return int(math.copysign(math.floor(abs(x) + 0.5), x))


def _quantize_multiplier(real: float) -> tuple[int, int]:
    """Android's QuantizeMultiplier (OperationsUtils.cpp), as written there."""
    if real == 0.0:
        return 0, 0
    q, shift = math.frexp(real)
    fixed = _c_round(q * (1 << 31))
    if fixed == 1 << 31:
        fixed //= 2
        shift += 1
    if shift < -31:
        return 0, 0
    return fixed, shift


def _c_div(a: int, b: int) -> int:
    quotient = abs(a) // abs(b)
    return quotient if (a >= 0) == (b > 0) else -quotient


def _srdhm(a: int, b: int) -> int:
    if a == b == INT32_MIN:
        return INT32_MAX
    product = a * b
    nudge = (1 << 30) if product >= 0 else 1 - (1 << 30)
    return _c_div(product + nudge, 1 << 31)


def _rounding_divide_by_pot(x: int, exponent: int) -> int:
    mask = (1 << exponent) - 1
    remainder = x & mask
    threshold = (mask >> 1) + (1 if x < 0 else 0)
    return (x >> exponent) + (1 if remainder > threshold else 0)


def _multiply(x: int, multiplier: int, shift: int) -> int:
    left, right = max(shift, 0), max(-shift, 0)
    x = min(max(x * (1 << left), INT32_MIN), INT32_MAX)
    return _rounding_divide_by_pot(_srdhm(x, multiplier), right)


REALS = [0.0, 1.0, 0.5, 0.75, 2.0**-31, 2.0**-32, 2.0**-33, 3 * 2.0**-34, 1e-12, 0.9999999999, 1 - 2.0**-33,
         2.0**-31 * (1 - 2.0**-40), 7.5, 1234.5678, 0.0003921568627, 1 / 3]


def test_quantize_multiplier_matches_android_definition():
    reals = REALS + list(RNG.uniform(0, 2, 2000)) + list(2.0 ** RNG.uniform(-40, 10, 2000))
    fixed, exponents = quantize_multipliers(np.array(reals))
    for real, m, e in zip(reals, fixed, exponents, strict=True):
        assert (int(m), int(e)) == _quantize_multiplier(real), real
        assert quantize_multiplier(real) == _quantize_multiplier(real)


def test_rescale_multipliers_derive_from_float32_scales_as_android_writes_it():
    """float(s1) * float(s2) / (double) float(s3), or a float quotient: the two C forms the
    kernels use, each against the definition; they disagree on most random scales."""
    scales = [(float(a), float(b), float(c)) for a, b, c in 10 ** RNG.uniform(-6, 1, (500, 3))]
    disagree = 0
    for a, b, c in scales:
        f = np.float32
        double = _quantize_multiplier(float(f(a) * f(b)) / float(f(c)))
        single = _quantize_multiplier(float(f(f(a) * f(b)) / f(c)))
        assert rescale_multiplier(a, b, c) == double
        assert rescale_multiplier(a, b, c, float32_quotient=True) == single
        disagree += double != single
    assert disagree > 400
    fixed, exponents = rescale_multipliers(scales[0][0], np.array([s[1] for s in scales]), scales[0][2])
    assert fixed.shape == exponents.shape == (500,)
    for (_, b, _), m, e in zip(scales, fixed, exponents, strict=True):
        assert (int(m), int(e)) == rescale_multiplier(scales[0][0], b, scales[0][2])


def test_tiny_multipliers_flush_to_zero():
    assert quantize_multiplier(2.0**-33) == (0, 0)
    assert quantize_multiplier(2.0**-32) == (1 << 30, -31)


EDGE_VALUES = [0, 1, -1, 2, -2, 3, -3, INT32_MAX, INT32_MIN, INT32_MAX - 1, INT32_MIN + 1, 1 << 30, -(1 << 30),
               12345, -12345, 65535, -65536]


@pytest.mark.parametrize("shift", [-31, -20, -9, -1, 0, 1, 3])
def test_multiply_by_quantized_multiplier_matches_definition(shift):
    values = EDGE_VALUES + list(RNG.integers(INT32_MIN, INT32_MAX, 3000, dtype=np.int64))
    multipliers = [1 << 30, INT32_MAX, (1 << 30) + 1, 1518500250, 1073741825, 2147483000, 0]
    for multiplier in multipliers:
        got = multiply_by_quantized_multiplier(np.array(values, np.int64), multiplier, shift)
        want = [_multiply(int(v), multiplier, shift) for v in values]
        np.testing.assert_array_equal(got, want)


def test_multiply_rounding_of_ties():
    # x * 2**30 / 2**31 = x / 2: the high multiply rounds halves up (gemmlowp's nudge)
    got = multiply_by_quantized_multiplier(np.array([1, -1, 3, -3, 5, -5]), 1 << 30, 0)
    np.testing.assert_array_equal(got, [1, 0, 2, -1, 3, -2])
    # the rounding right shift rounds halves away from zero: 6 / 4 and -6 / 4
    got = multiply_by_quantized_multiplier(np.array([12, -12]), 1 << 30, -2)
    np.testing.assert_array_equal(got, [2, -2])


@pytest.mark.parametrize("shift_range", [(-12, 0), (-1, 0), (0, 0), (-3, 2)])
def test_output_stage_fast_path_matches_definition(shift_range):
    channels = 8
    multipliers = RNG.integers(1 << 30, INT32_MAX, channels)
    shifts = RNG.integers(shift_range[0], shift_range[1] + 1, channels)
    bias = RNG.integers(-50000, 50000, channels)
    acc = np.concatenate([RNG.integers(-2**22, 2**22, (500, channels)),
                          np.arange(-4000, 4000).reshape(-1, channels)])
    for low, high, zero_point, dtype in ((-128, 127, -3, np.int8), (0, 255, 128, np.uint8), (10, 70, 5, np.uint8)):
        stage = OutputStage(multipliers, shifts, bias, zero_point, low, high, dtype)
        fast = stage(acc.astype(np.float64))
        want = np.array([[min(max(_multiply(int(a) + int(b), int(m), int(s)) + zero_point, low), high)
                          for a, b, m, s in zip(row, bias, multipliers, shifts, strict=True)] for row in acc])
        np.testing.assert_array_equal(fast, want)
        np.testing.assert_array_equal(stage.reference(acc), want)
        assert fast.dtype == np.dtype(dtype)


@pytest.mark.parametrize("shift", [-3, 2])  # the folded form, and the definition's (a left shift)
def test_output_stage_keeps_the_accumulators_shape(shift):
    """One multiplier for all channels (as a scalar or one element, as FULLY_CONNECTED
    passes it) adds no dimension, not even to a 0-d accumulator (ADD / MUL of scalars)."""
    for multiplier, bias in ((1518500250, None), (np.array([1518500250]), np.array([-7]))):
        stage = OutputStage(multiplier, np.full(np.shape(multiplier), shift), bias, 3, -128, 127, np.int8)
        for acc in (np.array(-1234), np.array([77]), np.arange(-30, 30).reshape(3, 4, 5) * 41):
            got = stage(acc)
            assert isinstance(got, np.ndarray) and got.shape == acc.shape and got.dtype == np.int8
            b = 0 if bias is None else int(bias[0])
            want = [min(max(_multiply(int(a) + b, 1518500250, shift) + 3, -128), 127) for a in acc.reshape(-1)]
            np.testing.assert_array_equal(got.reshape(-1), want)
            assert stage.reference(acc).shape == acc.shape


def test_requantize_matches_android_requantize():
    """Android (OperationsUtils.cpp requantize): round((q - zp) * scale / new_scale + new_zp)
    in double, saturated; every uint8 / int8 value, several scale pairs (ties included)."""
    for dtype, lo, hi in ((np.uint8, 0, 255), (np.int8, -128, 127)):
        values = np.arange(lo, hi + 1).astype(dtype)
        for scale, zp, to_scale, to_zp in ((0.5, 3, 1.0, 7), (0.1, 0, 0.3, -2 if lo else 2), (1.0, 0, 2.0, 0),
                                           (0.0078125, 10, 0.00390625, 0)):
            want = [min(max(_c_round((int(v) - zp) * scale / to_scale + to_zp), lo), hi) for v in values]
            np.testing.assert_array_equal(requantize(values, scale, zp, to_scale, to_zp), want)
            big = np.tile(values, 5)  # through the 256-entry table
            np.testing.assert_array_equal(requantize(big, scale, zp, to_scale, to_zp), np.tile(want, 5))


def test_dequantize_computes_in_the_requested_dtype():
    values = np.array([0, 1, 255], np.uint8)
    np.testing.assert_array_equal(dequantize(values, 0.1, 1), (np.array([0, 1, 255]) - 1) * 0.1)
    as32 = dequantize(values, 0.1, 1, np.float32)
    assert as32.dtype == np.float32
    np.testing.assert_array_equal(as32, (values.astype(np.float32) - np.float32(1)) * np.float32(0.1))


@pytest.mark.parametrize("channel_dim", [0, 1, 2])
def test_dequantize_per_channel_scales_each_channel(channel_dim):
    values = RNG.integers(-127, 128, (3, 4, 5)).astype(np.int8)
    scales = RNG.uniform(0.01, 2.0, values.shape[channel_dim]).astype(np.float32)
    real = dequantize_per_channel(values, scales, channel_dim)
    assert real.dtype == np.float32
    for c, scale in enumerate(scales):
        channel = np.take(values, c, axis=channel_dim).astype(np.float32)
        np.testing.assert_array_equal(np.take(real, c, axis=channel_dim), channel * scale)


def test_quantize_in_both_of_androids_rounding_orders():
    """zero_point + round(real / scale) (QUANTIZE, fused activations, TFLite): a negative
    tie rounds away from zero before the zero point moves it; values computed in float
    are converted the other way round, as Android's convertFloat32ToQuant does."""
    from nnapi import OperandCode as T
    from nnapi import OperandType
    from nnapi.operations.common import activation_bounds_quantized, quantize_with_activation
    from nnapi.operations.common import quantize as quantize_to

    reals = np.array([-0.5, 0.5, -1.5, 2.5, -2.49])
    np.testing.assert_array_equal(quantize(reals, 1.0, 1), [0, 2, -1, 4, -1])
    # Android's other order (convertFloat32ToQuant, requantize): the zero point first
    np.testing.assert_array_equal(quantize(reals, 1.0, 1, round_last=True), [1, 2, -1, 4, -1])
    output = OperandType(T.TENSOR_QUANT8_ASYMM, (5,), 1.0, 1)
    np.testing.assert_array_equal(quantize_to(reals, output), [1, 2, 0, 4, 0])  # round last, saturated
    np.testing.assert_array_equal(quantize_with_activation(reals, output, 0), [0, 2, 0, 4, 0])
    signed = OperandType(T.TENSOR_QUANT8_ASYMM_SIGNED, (5,), 0.5, 3)
    assert activation_bounds_quantized(1, signed) == (3, 127)  # RELU: real 0 is q 3
    assert activation_bounds_quantized(2, signed) == (1, 5)  # RELU1: reals -1..1
    as32 = quantize(np.float32(0.3), 0.1, 0, np.float32)
    assert as32.dtype == np.float32 and as32 == np.float32(3)


def test_fixed_point_steps_match_gemmlowp():
    """The two steps of MultiplyByQuantizedMultiplier, shared with QUANTIZED_LSTM."""
    assert rounding_doubling_high_multiply(INT32_MIN, INT32_MIN) == INT32_MAX
    a = RNG.integers(INT32_MIN, INT32_MAX, 2000, dtype=np.int64)
    b = RNG.integers(INT32_MIN, INT32_MAX, 2000, dtype=np.int64)
    # exact integer division (Python ints), truncating toward zero like C
    exact = [(x * y + (1 << 30 if x * y >= 0 else 1 - (1 << 30))) for x, y in zip(a.tolist(), b.tolist(), strict=True)]
    exact = [abs(n) // 2**31 * (1 if n >= 0 else -1) for n in exact]
    np.testing.assert_array_equal(rounding_doubling_high_multiply(a, b), exact)
    np.testing.assert_array_equal(rounding_divide_by_pot([5, -5, 6, -6, 7, -7], 1), [3, -3, 3, -3, 4, -4])
    np.testing.assert_array_equal(rounding_divide_by_pot([12, -12, 13], [3, 3, 0]), [2, -2, 13])


def test_quantize_scalar_is_quantize_of_one_value():
    """The Python-float ``quantize`` of one real (activation clamp ranges) gives numpy's
    float64 result bit for bit: ties away from zero on both sides of the zero point, values
    beyond any 8-bit range, tiny and huge scales, signed zero, and infinity."""
    rng = np.random.default_rng(5)
    scales = [0.5, 0.25, 1 / 3, 0.1, 2.0**-20, 1e-30, 3e30, float(np.float32(0.0235))]
    reals = [0.0, -0.0, 6.0, -6.0, 1.0, -1.0, 0.25, -0.25, 0.75, -0.75, 1e300, -1e300,
             *rng.standard_normal(200) * 10.0, *(rng.integers(-600, 600, 100) / 4.0)]
    for scale in scales:
        for zero_point in (-128, -3, 0, 7, 255):
            for real in reals:
                with np.errstate(over="ignore"):  # (1e300 / 1e-30: infinity, as intended)
                    want = quantize(real, scale, zero_point)
                    got = quantize_scalar(real, scale, zero_point)
                assert isinstance(got, float)
                assert np.float64(got).tobytes() == np.float64(want).tobytes(), (real, scale, zero_point)
    assert quantize_scalar(0.75, 0.5, 0) == 2.0 and quantize_scalar(-0.75, 0.5, 0) == -2.0  # ties away from zero
    with np.errstate(over="ignore"):
        assert quantize_scalar(1e300, 1e-30, 0) == math.inf  # overflows as numpy's division does


def _exact_c_round(values: np.ndarray) -> np.ndarray:
    """C's round of each value, exactly (rational arithmetic): floor(|v| + 1/2) with v's sign."""
    from fractions import Fraction

    exact = [math.copysign(math.floor(abs(Fraction(float(v))) + Fraction(1, 2)), float(v)) for v in values.ravel()]
    return np.array(exact, np.float64).reshape(values.shape)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_round_half_away_is_c_round_exactly_at_every_edge(dtype):
    """round_half_away is C's round (std::round, what Android's kernels call) bit for bit,
    also where |x| + 0.5 rounds up in floating point: the largest value below one half
    (0.5 - 2**-25 in float32: |x| + 0.5 rounds to 1.0, C's round gives 0) and the odd
    integers past the mantissa (2**23 + 1 in float32: + 0.5 rounds to the even neighbour);
    ties, values just below each tie, and random values besides."""
    info = np.finfo(dtype)
    below_half = np.nextafter(dtype(0.5), dtype(0))
    ties = np.arange(0, 40, dtype=dtype) + dtype(0.5)
    below_ties = np.nextafter(ties, dtype(0))
    odd = dtype(2.0 ** info.nmant) + np.arange(1, 9, 2, dtype=dtype)
    noise = np.random.default_rng(9).uniform(-50, 50, 300).astype(dtype)
    magnitudes = np.concatenate([[below_half, dtype(0.5), dtype(0), info.smallest_subnormal], ties, below_ties, odd,
                                 np.abs(noise)]).astype(dtype)
    values = np.concatenate([magnitudes, -magnitudes])
    rounded = round_half_away(values)
    assert rounded.dtype == dtype
    np.testing.assert_array_equal(rounded, _exact_c_round(values).astype(dtype))
    assert round_half_away(below_half) == 0 and round_half_away(-below_half) == 0
    np.testing.assert_array_equal(quantize(values, 1.0, 3, dtype), _exact_c_round(values).astype(dtype) + 3)
    if dtype == np.float64:
        for value in values[:200]:
            assert quantize_scalar(float(value) * 0.25, 0.25, -3) == float(_exact_c_round(np.array([value]))[0]) - 3
