"""8-bit L2_NORMALIZATION and PRELU on nnapi-reference as Android's CPU driver computes them
(TFLite's integer kernels' fixed point): hand-computed values where fixed point and the
real value rounded once differ, and LiteRT's builtin kernels on every stored value
(skipped without ai-edge-litert)."""

from __future__ import annotations

import numpy as np
import pytest

from helpers import imported_output, litert_builtin_output, q8, run_single_op, s8
from nnapi import OperandCode as T
from nnapi import OperandType
from nnapi import OperationCode as Op
from nnapi.operations.quant_math import (
    inverse_sqrt_multipliers,
    l2_normalize_fixed_point,
    multiply_by_quantized_multiplier,
    quantize_multiplier,
)

_RANGES = {"uint8": (0, 255), "int8": (-128, 127)}


def _scale(rng: np.random.Generator, low: float = -3, high: float = -0.5) -> float:
    return float(np.float32(10 ** rng.uniform(low, high)))


# --- L2_NORMALIZATION ------------------------------------------------------------------
def test_inverse_sqrt_multipliers_approximate_the_inverse_square_root():
    sums = np.array([2, 3, 25, 401, 65025, 255 * 255 * 300, 1 << 29, (1 << 31) - 1])
    fixed, shift = inverse_sqrt_multipliers(sums)
    assert np.all((fixed > 0) & (fixed < 1 << 31)) and np.all(shift >= 0)
    np.testing.assert_allclose(fixed * 2.0 ** -(31 + shift), 1 / np.sqrt(sums), rtol=2e-6)
    # 0 and 1: the kernel's INT32_MAX, no shift
    np.testing.assert_array_equal(np.stack(inverse_sqrt_multipliers(np.array([0, 1]))), [[2**31 - 1] * 2, [0, 0]])


def test_l2_normalization_rounds_as_androids_fixed_point():
    # offsets [1, 20]: sum of squares 401, multiplier (214480438, right shift 1), the exact
    # 1 / sqrt(401) to 2e-7. Android's uint8 kernel: 128 * 1 = 128 by the high multiply
    # (128 * 214480438 / 2**31 = 12.78 -> 13), then halved with rounding (6.5 -> 7); the
    # real 128 / sqrt(401) = 6.39 rounds to 6. The second: 2560 -> 255.69 -> 256 -> 128,
    # + 128 saturates at 255.
    assert tuple(int(v[0]) for v in inverse_sqrt_multipliers(np.array([401]))) == (214480438, 1)
    out = run_single_op(
        Op.L2_NORMALIZATION,
        [(q8([1, 2], 0.1, 128), None)],
        [q8([1, 2], 1 / 128, 128)],
        [np.array([[129, 148]], np.uint8)],
    )[0]
    np.testing.assert_array_equal(out, [[135, 255]])
    # Android's int8 kernel along the last axis (TFLite's) folds the 128 into the exponent:
    # 1 << 6 = 64 by the high multiply, 64 * 214480438 / 2**31 = 6.39 -> 6; 20 -> 127.84 -> 128,
    # saturated to 127
    out = run_single_op(
        Op.L2_NORMALIZATION, [(s8([1, 2], 0.1, -3), None)], [s8([1, 2], 1 / 128, 0)], [np.array([[-2, 17]], np.int8)]
    )[0]
    np.testing.assert_array_equal(out, [[6, 127]])
    # ... and along another axis multiplies by 128 first, as its uint8 kernel: 7
    axis0 = OperandType(T.INT32)
    out = run_single_op(
        Op.L2_NORMALIZATION,
        [(s8([2, 1], 0.1, -3), None), (axis0, 0)],
        [s8([2, 1], 1 / 128, 0)],
        [np.array([[-2], [17]], np.int8)],
    )[0]
    np.testing.assert_array_equal(out, [[7], [127]])


def test_l2_normalization_of_zeros_is_the_zero_point():
    out = run_single_op(
        Op.L2_NORMALIZATION,
        [(q8([2, 3], 0.5, 100), None)],
        [q8([2, 3], 1 / 128, 128)],
        [np.array([[100, 100, 100], [100, 101, 100]], np.uint8)],
    )[0]
    # a sum of squares of 0 or 1: multiplier INT32_MAX, so x * 128 passes unchanged
    np.testing.assert_array_equal(out, [[128, 128, 128], [128, 255, 128]])


@pytest.mark.parametrize("kind", ["uint8", "int8"])
def test_l2_normalization_equals_litert(kind):
    pytest.importorskip("ai_edge_litert")
    from tflite_builder import Operator, Subgraph, Tensor, build

    rng = np.random.default_rng(5)
    low, high = _RANGES[kind]
    out_zero = 128 if kind == "uint8" else 0
    for length in (1, 2, 3, 8, 64, 300):
        for _ in range(3):
            in_scale, in_zero = _scale(rng, -3, 0), int(rng.integers(low, high + 1))
            tensors = [
                Tensor("x", kind, [32, length], scale=in_scale, zero_point=in_zero),
                Tensor("y", kind, [32, length], scale=1 / 128, zero_point=out_zero),
            ]
            data = build(Subgraph(tensors, [Operator("L2_NORMALIZATION", [0], [1])], [0], [1]))
            feed = rng.integers(low, high + 1, size=[32, length]).astype(kind)
            np.testing.assert_array_equal(
                imported_output(data, feed),
                litert_builtin_output(data, feed),
                err_msg=f"{kind} {length} {in_scale} {in_zero}",
            )


def test_l2_normalize_fixed_point_by_its_definition():
    """Each offset's rescale is MultiplyByQuantizedMultiplier's steps as written out."""
    rng = np.random.default_rng(3)
    offsets = rng.integers(-255, 256, size=(50, 7))
    sums = (offsets * offsets).sum(axis=1)
    fixed, shift = inverse_sqrt_multipliers(sums)
    by_pair = multiply_by_quantized_multiplier(offsets * 128, fixed[:, None], 0)
    halves = np.where(by_pair >= 0, 1, -1) * ((np.abs(by_pair) + (1 << shift[:, None]) // 2) >> shift[:, None])
    np.testing.assert_array_equal(l2_normalize_fixed_point(offsets, 0, -(10**6), 10**6), halves)
    folded = multiply_by_quantized_multiplier(offsets, fixed[:, None], 7 - shift[:, None])
    np.testing.assert_array_equal(l2_normalize_fixed_point(offsets, 0, -(10**6), 10**6, True), folded)


# --- PRELU -----------------------------------------------------------------------------
def test_prelu_rounds_as_androids_fixed_point():
    # x scale 0.5, alpha 1 * 0.25, output scale 0.3: the negative side's multiplier is
    # QuantizeMultiplier(0.125 / 0.3) = (1789569636, -1). x = -128: the high multiply gives
    # -128 * 1789569636 / 2**31 = -106.67 -> -107, halved with rounding -53.5 -> -54 (the
    # real -53.33 rounds to -53); x = -126: -105.0 (just above) -> -105 -> -52.5 -> -53
    # (real -52.5 - 2e-7: -52). The positive side: (1789569664, 1), 50 -> 100 -> 83.3 -> 83.
    assert quantize_multiplier(0.125 / float(np.float32(0.3))) == (1789569636, -1)
    out = run_single_op(
        Op.PRELU,
        [(s8([3], 0.5, 0), None), (s8([1], 0.25, 0), np.array([1], np.int8))],
        [s8([3], 0.3, 0)],
        [np.array([-128, -126, 50], np.int8)],
    )[0]
    np.testing.assert_array_equal(out, [-54, -53, 83])


@pytest.mark.parametrize("kind", ["uint8", "int8"])
def test_prelu_equals_litert_on_every_stored_value(kind):
    pytest.importorskip("ai_edge_litert")
    from tflite_builder import Operator, Subgraph, Tensor, build

    rng = np.random.default_rng(8)
    low, high = _RANGES[kind]
    stored = np.arange(low, high + 1)
    for _ in range(20):
        (in_scale, in_zero), (out_scale, out_zero) = ((_scale(rng), int(rng.integers(low, high + 1))) for _ in "ab")
        alpha_scale, alpha_zero = _scale(rng, -3, -1), int(rng.integers(low, high + 1))
        alpha = rng.integers(low, high + 1, size=[4]).astype(kind)
        tensors = [
            Tensor("x", kind, [256, 4], scale=in_scale, zero_point=in_zero),
            Tensor("a", kind, [4], data=alpha, scale=alpha_scale, zero_point=alpha_zero),
            Tensor("y", kind, [256, 4], scale=out_scale, zero_point=out_zero),
        ]
        data = build(Subgraph(tensors, [Operator("PRELU", [0, 1], [2])], [0], [2]))
        feed = np.repeat(stored, 4).reshape(256, 4).astype(kind)  # every stored value against each alpha
        np.testing.assert_array_equal(imported_output(data, feed), litert_builtin_output(data, feed))
