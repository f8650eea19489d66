"""The ORT driver's one spelling of the fixed-point rescale (drivers/ort/fixed_point.py)
run on ONNX Runtime and compared bit for bit with quant_math's numpy definitions: every
value of a range around zero and random int32 / int64 values, by every shift (constants
and per-row tensors), with multipliers that include the extremes."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from nnapi.drivers.ort import fixed_point as fp
from nnapi.drivers.ort.builder import GraphBuilder, probe_outputs
from nnapi.operations import quant_math as qm

pytest.importorskip("onnxruntime")

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1


def _run(build, feeds: dict[str, np.ndarray]) -> np.ndarray:
    """The int64 output of the graph ``build(g, *input names)`` makes, run on ``feeds``."""
    g = GraphBuilder(None, None)  # only its node and constant methods are used
    output = build(g, *feeds)
    inputs = [helper.make_tensor_value_info(name, TensorProto.INT64, None) for name in feeds]
    graph = helper.make_graph(g.nodes, "fixed_point", inputs,
                              [helper.make_tensor_value_info(output, TensorProto.INT64, None)], g.initializers)
    outputs = probe_outputs(graph, {name: np.asarray(value, np.int64) for name, value in feeds.items()})
    assert outputs is not None, "onnxruntime refused or failed the graph"
    return outputs[0]


def _values(rng: np.random.Generator, around: int, count: int, bound: int) -> np.ndarray:
    """Every integer in [-around, around] and ``count`` random ones in [-bound, bound]."""
    return np.concatenate([np.arange(-around, around + 1), rng.integers(-bound, bound, count, endpoint=True),
                           [-bound, bound, INT32_MIN, INT32_MAX, -1, 0, 1]]).astype(np.int64)


def test_rounding_divide_by_pot_equals_quant_math():
    rng = np.random.default_rng(1)
    x = _values(rng, 1 << 12, 20_000, 1 << 40)
    for exponent in range(0, 33):
        got = _run(lambda g, v, e=exponent: fp.rounding_divide_by_pot(g, v, 1 << e), {"x": x})
        np.testing.assert_array_equal(got, qm.rounding_divide_by_pot(x, exponent), err_msg=f"exponent {exponent}")
    # a tensor of powers, one per row
    exponents = np.arange(0, 33)[:, None]
    got = _run(lambda g, v, p: fp.rounding_divide_by_pot(g, v, p), {"x": x[None, :], "p": 1 << exponents})
    np.testing.assert_array_equal(got, qm.rounding_divide_by_pot(x[None, :], exponents))


def test_doubling_high_multiply_equals_quant_math():
    rng = np.random.default_rng(2)
    a = _values(rng, 1 << 12, 20_000, INT32_MAX)
    a = np.clip(a, INT32_MIN, INT32_MAX)
    multipliers = [INT32_MIN, INT32_MIN + 1, -1, 0, 1, 1 << 30, INT32_MAX, *rng.integers(INT32_MIN, INT32_MAX, 6)]
    for m in multipliers:
        got = _run(lambda g, v, m=int(m): fp.doubling_high_multiply(g, v, m), {"a": a})
        np.testing.assert_array_equal(got, qm.rounding_doubling_high_multiply(a, m), err_msg=f"multiplier {m}")
    column = np.array(multipliers, np.int64)[:, None]
    got = _run(lambda g, v, b: fp.doubling_high_multiply(g, v, b), {"a": a[None, :], "b": column})
    np.testing.assert_array_equal(got, qm.rounding_doubling_high_multiply(a[None, :], column))
    # int16: every pair of a value in [-32768, 32767] with a sample of the other operand
    a16 = np.arange(-32768, 32768, dtype=np.int64)[None, :]
    b16 = np.concatenate([[-32768, -32767, -1, 0, 1, 32767], rng.integers(-32768, 32767, 26)])[:, None]
    got = _run(lambda g, v, b: fp.doubling_high_multiply(g, v, b, 16), {"a": a16, "b": b16})
    np.testing.assert_array_equal(got, qm.rounding_doubling_high_multiply16(a16, b16))


def test_multiply_by_quantized_multiplier_equals_quant_math():
    """Every int32 in [-2**14, 2**14] and random ones (past int32 too, which saturate),
    by every shift in [-31, 12] with multipliers from QuantizeMultiplier and the extremes."""
    rng = np.random.default_rng(3)
    x = _values(rng, 1 << 14, 30_000, 1 << 40)
    shifts = np.arange(-31, 13)
    mantissas = rng.integers(1 << 30, INT32_MAX, shifts.size, endpoint=True)
    for shift, m in zip(shifts.tolist(), mantissas.tolist(), strict=True):
        for multiplier in (m, INT32_MAX, INT32_MIN):
            got = _run(lambda g, v, m=multiplier, s=shift: fp.multiply_by_quantized_multiplier(g, v, m, *fp.powers(s)),
                       {"x": x})
            np.testing.assert_array_equal(got, qm.multiply_by_quantized_multiplier(x, multiplier, shift),
                                          err_msg=f"multiplier {multiplier}, shift {shift}")
    # per-row tensors (as ROI_ALIGN gathers them), without the INT32_MIN check
    left = np.array([fp.powers(s)[0] for s in shifts.tolist()], np.int64)[:, None]
    right = np.array([fp.powers(s)[1] for s in shifts.tolist()], np.int64)[:, None]
    got = _run(lambda g, v, m, lo, hi: fp.multiply_by_quantized_multiplier(g, v, m, lo, hi, saturating=False),
               {"x": x[None, :], "m": mantissas[:, None], "lo": left, "hi": right})
    np.testing.assert_array_equal(got, qm.multiply_by_quantized_multiplier(x[None, :], mantissas[:, None],
                                                                           shifts[:, None]))


def test_high_multiply_with_a_folded_power_equals_the_doubling_high_multiply():
    """L2_NORMALIZATION's form: the rounding at 2**24 of d * m is the doubling high
    multiply of 128 d by m, for every offset d of 8-bit values and many multipliers."""
    rng = np.random.default_rng(4)
    d = np.arange(-255, 256, dtype=np.int64)[None, :]
    m = np.concatenate([[0, 1, 1 << 30, INT32_MAX], rng.integers(0, INT32_MAX, 60)])[:, None]
    got = _run(lambda g, p: fp.rounding_high_multiply(g, p, 24), {"p": d * m})
    np.testing.assert_array_equal(got, qm.rounding_doubling_high_multiply(128 * d, m))
