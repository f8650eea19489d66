"""Android's fixed-point rescaling steps (gemmlowp's, as operations/quant_math.py defines
them for the reference) as exact int64 ONNX operators, written once for every lowering
that needs them: the quantized L2_NORMALIZATION (normalization.py), the quantized
ROI_ALIGN (detection.py) and QUANTIZED_16BIT_LSTM (quantized_recurrent.py).

- ``rounding_high_multiply``: the rounding of SaturatingRoundingDoublingHighMul given the
  product, trunc((p + nudge) / 2**bits);
- ``doubling_high_multiply``: SaturatingRoundingDoublingHighMul of two values
  (``quant_math.rounding_doubling_high_multiply`` / ``rounding_doubling_high_multiply16``);
- ``rounding_divide_by_pot``: RoundingDivideByPOT (``quant_math.rounding_divide_by_pot``);
- ``multiply_by_quantized_multiplier``: TFLite's MultiplyByQuantizedMultiplier
  (``quant_math.multiply_by_quantized_multiplier``).

The values are int64 tensors (the callers cast their int32 / int16 / uint8 values first),
so no product or sum here can overflow. Multipliers, shifts and divisors are constants
(Python ints) or the names of int64 tensors broadcasting against the values (tables
gathered per row, say). Both divisions rely on ONNX Runtime's integer Div truncating
toward zero (C's division; integer_div.py relies on it too), which the tests check against
quant_math bit for bit on every int32 of a range and random ones.
"""

from __future__ import annotations

from nnapi.drivers.ort.builder import GraphBuilder, scalar_i64

#: a constant, or the name of an int64 tensor that broadcasts against the values
IntOrName = int | str


def _tensor(g: GraphBuilder, value: IntOrName) -> str:
    return scalar_i64(g, value) if isinstance(value, int) else value


def rounding_high_multiply(g: GraphBuilder, product: str, bits: int = 31) -> str:
    """trunc((product + nudge) / 2**bits) with nudge 2**(bits - 1), or 1 - 2**(bits - 1)
    for a negative product: the rounding of gemmlowp's SaturatingRoundingDoublingHighMul
    (``quant_math._doubling_high_multiply``) once the product is formed: ``bits`` 31 for
    int32 operands (``rounding_doubling_high_multiply``), 15 for int16 ones
    (``rounding_doubling_high_multiply16``); another ``bits`` is that rounding of the
    product times 2**(31 - bits), for a caller that folds a power of two of one operand
    into the shift. Without the saturation of two minimum operands (see
    ``doubling_high_multiply``)."""
    nudge = g.one("Where", [g.one("GreaterOrEqual", [product, scalar_i64(g, 0)]), scalar_i64(g, 1 << (bits - 1)),
                            scalar_i64(g, 1 - (1 << (bits - 1)))])
    return g.one("Div", [g.one("Add", [product, nudge]), scalar_i64(g, 1 << bits)])


def doubling_high_multiply(g: GraphBuilder, a: str, b: IntOrName, bits: int = 32, *,
                           saturating: bool = True) -> str:
    """``quant_math.rounding_doubling_high_multiply`` (``bits`` 32) or
    ``rounding_doubling_high_multiply16`` (``bits`` 16) of int64 tensors holding
    ``bits``-wide values: ``rounding_high_multiply`` of a * b, and the product of two
    minimum values saturated to the maximum. A constant ``b`` other than the minimum needs
    no such check, so none is made; ``saturating`` False leaves it out for a tensor ``b``
    that the caller knows never holds the minimum (QuantizeMultiplier's mantissas are
    positive)."""
    high = rounding_high_multiply(g, g.one("Mul", [a, _tensor(g, b)]), bits - 1)
    lowest = -(1 << (bits - 1))
    if not saturating:
        return high
    if isinstance(b, int):
        if b != lowest:
            return high
        both = g.one("Equal", [a, scalar_i64(g, lowest)])
    else:
        both = g.one("And", [g.one("Equal", [a, scalar_i64(g, lowest)]), g.one("Equal", [b, scalar_i64(g, lowest)])])
    return g.one("Where", [both, scalar_i64(g, -lowest - 1), high])


def rounding_divide_by_pot(g: GraphBuilder, x: str, power: IntOrName) -> str:
    """``quant_math.rounding_divide_by_pot`` (gemmlowp's RoundingDivideByPOT): x / 2**e
    rounded to nearest, halves away from zero, with ``power`` = 2**e (a constant, or a
    tensor of powers of two). As trunc((x + sign(x) * 2**e // 2) / 2**e): for x >= 0
    that is floor((x + half) / 2**e), and for x < 0 its mirror image, which is what
    rounding halves away from zero means (a power of 1 adds 0 and divides by 1)."""
    if power == 1:
        return x
    half = scalar_i64(g, power >> 1) if isinstance(power, int) else g.one("Div", [power, scalar_i64(g, 2)])
    nudged = g.one("Add", [x, g.one("Mul", [g.one("Sign", [x]), half])])
    return g.one("Div", [nudged, _tensor(g, power)])


def multiply_by_quantized_multiplier(g: GraphBuilder, x: str, multiplier: IntOrName, left: IntOrName,
                                     right: IntOrName, *, saturating: bool = True) -> str:
    """``quant_math.multiply_by_quantized_multiplier`` (TFLite's MultiplyByQuantizedMultiplier)
    of int64 values x with a shift given as its two powers of two, ``left`` = 2**max(shift,
    0) and ``right`` = 2**max(-shift, 0) (constants or tensors; ``powers`` makes them of a
    constant shift): x * left saturated to int32, ``doubling_high_multiply`` by the
    multiplier (``saturating``: as there), ``rounding_divide_by_pot`` by ``right``."""
    if left != 1:
        x = g.one("Mul", [x, _tensor(g, left)])
    x = g.one("Max", [g.one("Min", [x, scalar_i64(g, (1 << 31) - 1)]), scalar_i64(g, -(1 << 31))])
    return rounding_divide_by_pot(g, doubling_high_multiply(g, x, multiplier, saturating=saturating), right)


def powers(shift: int) -> tuple[int, int]:
    """The left and right powers of two of a quantized multiplier's shift:
    (2**max(shift, 0), 2**max(-shift, 0))."""
    return 1 << max(shift, 0), 1 << max(-shift, 0)
