"""Quantized ADD / SUB / MUL on nnapi-reference as Android's CPU driver computes them (in
fixed point, TFLite's integer kernels' arithmetic), against a straightforward integer
implementation written here from the definitions: every one of the 65,536 pairs of
stored values, for many random scale / zero-point triples (multipliers at the edges of
their ranges among them), each fused activation, both 8-bit types; and the reference's
fast paths (the 256 x 256 table, its compiled lookup, numpy's broadcast) against its
direct computation."""

from __future__ import annotations

import math

import numpy as np
import pytest

import nnapi
from helpers import constant, reference_device, run_on
from nnapi import OperandCode as T
from nnapi import OperandType
from nnapi import OperationCode as Op
from nnapi.codes import FuseCode
from nnapi.operations import get_operation
from nnapi.operations.base import ExecutionContext, Tensor

_KINDS = {T.TENSOR_QUANT8_ASYMM: (np.uint8, 0, 255), T.TENSOR_QUANT8_ASYMM_SIGNED: (np.int8, -128, 127)}


# --- the definitions, one element at a time in Python integers (vectorized only where the
# --- same integer formula is applied to an array) ----------------------------------------
def _multiplier(real: float) -> tuple[int, int]:
    """QuantizeMultiplier: real = m * 2**(e - 31), m in [2**30, 2**31) rounded half away
    from zero (a carry to 2**31 halves it), exponents below -31 flushed to (0, 0)."""
    if real == 0:
        return 0, 0
    fraction, exponent = math.frexp(real)
    fixed = math.floor(fraction * 2**31 + 0.5)  # fraction > 0: half away from zero
    if fixed == 2**31:
        fixed, exponent = fixed // 2, exponent + 1
    return (0, 0) if exponent < -31 else (fixed, exponent)


def _high_multiply(x: np.ndarray, m: int) -> np.ndarray:
    """SaturatingRoundingDoublingHighMul(x, m) for int32 x and m (neither INT32_MIN here):
    (x * m + nudge) / 2**31 truncated toward zero, nudge 2**30 or 1 - 2**30 (negative
    products)."""
    product = x.astype(np.int64) * m
    nudged = product + np.where(product >= 0, 2**30, 1 - 2**30)
    return np.sign(nudged) * (np.abs(nudged) // 2**31)


def _divide_by_power(x: np.ndarray, exponent: int) -> np.ndarray:
    """RoundingDivideByPOT: x / 2**exponent rounded to nearest, halves away from zero."""
    if exponent == 0:
        return x
    return np.sign(x) * ((np.abs(x) + 2 ** (exponent - 1)) >> exponent)


def _rescale(x: np.ndarray, m: int, e: int) -> np.ndarray:
    """MultiplyByQuantizedMultiplier for e <= 0 (Android's SmallerThanOneExp)."""
    assert e <= 0
    return _divide_by_power(_high_multiply(x, m), -e)


def _bounds(fuse: int, scale: float, zero_point: int, qmin: int, qmax: int) -> tuple[int, int]:
    """CalculateActivationRange: zero_point + round(f / scale) for the activation's limits."""
    def q(f: float) -> int:
        scaled = f / scale
        return zero_point + int(math.copysign(math.floor(abs(scaled) + 0.5), scaled))
    low, high = {FuseCode.FUSED_NONE: (None, None), FuseCode.FUSED_RELU: (0.0, None),
                 FuseCode.FUSED_RELU1: (-1.0, 1.0), FuseCode.FUSED_RELU6: (0.0, 6.0)}[fuse]
    return (qmin if low is None else max(qmin, q(low))), (qmax if high is None else min(qmax, q(high)))


def _expected(code: Op, a: np.ndarray, b: np.ndarray, quant: list[tuple[float, int]], fuse: int,
              kind: T) -> np.ndarray:
    """Android's addQuant8 / subQuant8 / mulQuant8 on stored values ``a`` and ``b``."""
    (s1, z1), (s2, z2), (so, zo) = [(float(np.float32(s)), z) for s, z in quant]
    dtype, qmin, qmax = _KINDS[kind]
    x1 = a.astype(np.int64) - z1
    x2 = b.astype(np.int64) - z2
    if code == Op.MUL:
        m, e = _multiplier(float(np.float32(np.float32(s1) * np.float32(s2))) / so)
        raw = _rescale(x1 * x2, m, e)
    else:
        twice = 2 * max(s1, s2)  # exact in float32 too
        m1, e1 = _multiplier(s1 / twice)
        m2, e2 = _multiplier(s2 / twice)
        if code == Op.SUB:
            m2 = -m2
        mo, eo = _multiplier(twice / (2**20 * so))
        raw = _rescale(_rescale(x1 << 20, m1, e1) + _rescale(x2 << 20, m2, e2), mo, eo)
    low, high = _bounds(fuse, so, zo, qmin, qmax)
    return np.clip(raw + zo, low, high).astype(dtype)


# --- random quantizations -----------------------------------------------------------------
def _triples(seed: int, count: int, code: Op):
    """``count`` random (scale, zero point) triples for ``code``: scales over four decades,
    powers of two (ties in every rounding step), ADD / SUB output scales near the smallest
    Android accepts (the output multiplier just below 1) and inputs whose ratio is huge
    (the smaller input's multiplier near the flush to zero), MUL output scales just above
    the product of the inputs' (the multiplier just below 1)."""
    rng = np.random.default_rng(seed)
    for trial in range(count):
        kind = (T.TENSOR_QUANT8_ASYMM, T.TENSOR_QUANT8_ASYMM_SIGNED)[trial % 2]
        _, qmin, qmax = _KINDS[kind]
        style = trial % 5
        if style == 0:
            scales = [2.0 ** -int(rng.integers(0, 10)) for _ in range(3)]
        else:
            scales = [float(np.float32(10 ** rng.uniform(-4, 0))) for _ in range(3)]
        if style == 2:  # multipliers at the edge
            if code == Op.MUL:
                scales[2] = float(np.nextafter(np.float32(scales[0]) * np.float32(scales[1]), np.float32(1)))
            else:
                scales[2] = float(np.float32(2 * max(scales[:2]) / 2**20 * 1.0001))
        elif style == 3 and code != Op.MUL:
            scales[1] = float(np.float32(scales[0] * 2.0 ** -int(rng.integers(20, 31))))
        if code == Op.MUL and not np.float32(scales[2]) > np.float32(scales[0]) * np.float32(scales[1]):
            scales[2] = float(np.float32(scales[0]) * np.float32(scales[1]) * np.float32(rng.uniform(1.01, 400)))
        zeros = [int(rng.integers(qmin, qmax + 1)) for _ in range(3)]
        fuse = (FuseCode.FUSED_NONE, FuseCode.FUSED_RELU, FuseCode.FUSED_RELU1, FuseCode.FUSED_RELU6)[trial % 4]
        yield kind, list(zip(scales, zeros, strict=True)), fuse


def _tensor(kind: T, value: np.ndarray, scale: float, zero_point: int) -> Tensor:
    return Tensor(kind, tuple(value.shape), scale, zero_point, None, value)


def _all_pairs(kind: T) -> tuple[np.ndarray, np.ndarray]:
    """Every stored value down the rows (256, 1), every one along the columns (1, 256)."""
    dtype, qmin, qmax = _KINDS[kind]
    values = np.arange(qmin, qmax + 1).astype(dtype)
    return values[:, None], values[None, :]


def _executed(code: Op, kind: T, quant: list[tuple[float, int]], fuse: int = FuseCode.FUSED_NONE) -> np.ndarray:
    """The reference kernel's ``execute`` on every pair of stored values (``_all_pairs``):
    (scale, zero point) of each input and the output in ``quant``."""
    a, b = _all_pairs(kind)
    context = ExecutionContext(code, [_tensor(kind, a, *quant[0]), _tensor(kind, b, *quant[1]),
                                      Tensor(T.INT32, (), 0.0, 0, None, np.array(fuse, np.int32))],
                               [OperandType(kind, [256, 256], *quant[2])])
    return get_operation(code).execute(context)[0]


@pytest.mark.parametrize("code", [Op.ADD, Op.SUB, Op.MUL])
def test_every_pair_is_androids_fixed_point_result(code):
    """The reference's kernel (``execute``: its 256 x 256 table on 65,536 pairs) equals the
    integer definition on every pair of stored values, for 60 quantizations per operation."""
    for trial, (kind, quant, fuse) in enumerate(_triples(7 + int(code), 60, code)):
        a, b = _all_pairs(kind)
        got = _executed(code, kind, quant, fuse)
        expected = _expected(code, a, b, quant, fuse, kind)
        assert got.dtype == expected.dtype and got.shape == (256, 256)
        np.testing.assert_array_equal(got, expected, err_msg=f"trial {trial}: {kind.name} {quant} fuse {fuse}")


def test_fixed_point_differs_from_the_rounded_real_result():
    """The case that made the difference known (an int8 squeeze-and-excitation MUL of
    PP-OCR's direction classifier): the fixed-point multiplier moves some products by a
    step from the real product rounded once, and the reference gives Android's value."""
    kind = T.TENSOR_QUANT8_ASYMM_SIGNED
    quant = [(0.020245200023055077, -128), (0.0011099022813141346, -128), (0.0043408749625086784, -128)]
    a, b = _all_pairs(kind)
    got = _executed(Op.MUL, kind, quant)
    np.testing.assert_array_equal(got, _expected(Op.MUL, a, b, quant, 0, kind))
    real = (a.astype(np.float64) + 128) * quant[0][0] * (b.astype(np.float64) + 128) * quant[1][0]
    scaled = real / np.float32(quant[2][0])
    rounded = np.clip(np.floor(scaled + 0.5) - 128, -128, 127)
    assert 0 < int((got != rounded).sum()) < 1000 and np.abs(got - rounded).max() == 1


def _model(code: Op, kind: T, quant, fuse: int, first_shape, second_shape, out_shape) -> nnapi.Model:
    model = nnapi.Model()
    (s1, z1), (s2, z2), (so, zo) = quant
    a = model.add_operand(OperandType(kind, list(first_shape), s1, z1))
    b = model.add_operand(OperandType(kind, list(second_shape), s2, z2))
    y = model.add_operand(OperandType(kind, list(out_shape), so, zo))
    model.add_operation(code, [a, b, constant(model, T.INT32, fuse)], [y])
    model.identify_inputs_and_outputs([a, b], [y])
    model.finish()
    return model


@pytest.mark.parametrize("code", [Op.ADD, Op.SUB, Op.MUL])
@pytest.mark.parametrize("shapes", [
    ((256, 256), (256,)),          # the second repeats along leading axes: the compiled lookup
    ((256,), (256, 256)),          # the first repeats: the transposed table
    ((256, 1), (1, 256)),          # both broadcast: numpy's lookup of the table
    ((4, 8), (8,)),                # fewer than 256 outputs: computed directly
    ((1,), (300,)),                # one value against a vector
])
def test_the_prepared_paths_equal_the_definition(code, shapes):
    """Compiled on nnapi-reference (its prepared plan: the table and, with ``nnapi[fast]``,
    the compiled lookup), each broadcast form gives the integer definition's values."""
    first_shape, second_shape = shapes
    out_shape = np.broadcast_shapes(first_shape, second_shape)
    rng = np.random.default_rng(3)
    for kind, quant, fuse in list(_triples(100 + int(code), 4, code)):
        dtype, qmin, qmax = _KINDS[kind]
        if first_shape == (256, 256):
            a = np.repeat(np.arange(qmin, qmax + 1), 256).reshape(256, 256).astype(dtype)
            b = np.arange(qmin, qmax + 1).astype(dtype)
        else:
            a = rng.integers(qmin, qmax + 1, first_shape).astype(dtype)
            b = rng.integers(qmin, qmax + 1, second_shape).astype(dtype)
        model = _model(code, kind, quant, fuse, first_shape, second_shape, out_shape)
        got = run_on(model, reference_device(), [a, b], [np.zeros(out_shape, dtype)])[0]
        np.testing.assert_array_equal(got, _expected(code, a, b, quant, fuse, kind),
                                      err_msg=f"{kind.name} {quant} fuse {fuse}")


def test_rank_0_values_keep_their_shape():
    """The shared kernels on two rank-0 stored values give a rank-0 result (the output
    stage's one-element constants would otherwise add a dimension)."""
    from nnapi.operations.quant_math import FixedPointAdd, FixedPointMul

    quant = [(0.5, 3), (0.25, -7), (0.75, 1)]
    first, second = np.array(100, np.int8), np.array(-90, np.int8)
    for code, kernel in ((Op.ADD, FixedPointAdd(*quant, -128, 127, np.int8)),
                         (Op.MUL, FixedPointMul(*quant, -128, 127, np.int8))):
        got = kernel(first, second)
        assert got.shape == () and got.dtype == np.int8
        assert got == _expected(code, first, second, quant, FuseCode.FUSED_NONE, T.TENSOR_QUANT8_ASYMM_SIGNED)


def test_mul_multiplier_is_from_the_float32_product_of_the_scales():
    """Android multiplies the two input scales in C float before dividing in double: with
    these scales the multiplier of the exact product differs (1356445257 against
    1356445283, both with exponent -7) and moves 2 of the 65,536 results; the reference
    gives the float32 product's."""
    kind = T.TENSOR_QUANT8_ASYMM
    quant = [(0.005252982955425978, 0), (0.16759651899337769, 0), (0.17840562760829926, 0)]
    a, b = _all_pairs(kind)
    got = _executed(Op.MUL, kind, quant)
    np.testing.assert_array_equal(got, _expected(Op.MUL, a, b, quant, FuseCode.FUSED_NONE, kind))
    exact = _multiplier(quant[0][0] * quant[1][0] / quant[2][0])
    assert exact == (1356445257, -7)
    other = np.clip(_rescale(a.astype(np.int64) * b, *exact), 0, 255)
    assert int((other != got).sum()) == 2


def test_sub_negates_the_second_multiplier_not_its_term():
    """Android's SUB is its ADD with the second input's multiplier negated. The doubling
    high multiply rounds a negative tie toward zero and a positive one away from it, so
    that is not the negated term: with a multiplier of ten trailing zero bits (the
    scale ratio 0.375 + 2**-22) odd offsets give ties, and 128 of the 65,536 results
    differ from the negated term's; the reference gives the negated multiplier's."""
    kind = T.TENSOR_QUANT8_ASYMM
    quant = [(1.0, 96), (float(np.float32(0.75 + 2**-21)), 193), (0.5, 81)]
    a, b = _all_pairs(kind)
    got = _executed(Op.SUB, kind, quant)
    np.testing.assert_array_equal(got, _expected(Op.SUB, a, b, quant, FuseCode.FUSED_NONE, kind))
    m1, e1 = _multiplier(quant[0][0] / 2)
    m2, e2 = _multiplier(quant[1][0] / 2)
    mo, eo = _multiplier(2 / (2**20 * quant[2][0]))
    assert m2 % 2**10 == 0 and m2 % 2**11 != 0
    negated_term = _rescale(_rescale((a.astype(np.int64) - 96) << 20, m1, e1)
                            - _rescale((b.astype(np.int64) - 193) << 20, m2, e2), mo, eo)
    assert int((np.clip(negated_term + 81, 0, 255) != got).sum()) == 128
