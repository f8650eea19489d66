"""The TFLite importer's lowerings of a quantized RELU / RELU6 / RELU_N1_TO_1 and MEAN whose
output quantization differs from the input's (NNAPI's keep it): hand-computed values, and
LiteRT's builtin kernels on every stored value / random tensors (skipped without
ai-edge-litert)."""

from __future__ import annotations

import numpy as np
import pytest

import nnapi
from helpers import imported_output, litert_builtin_output
from nnapi.operations.quant_math import mean_multiplier, quantize_multiplier

pytest.importorskip("tflite")

_RANGES = {"uint8": (0, 255), "int8": (-128, 127)}


def _scale(rng: np.random.Generator, low: float = -3, high: float = -0.5) -> float:
    return float(np.float32(10 ** rng.uniform(low, high)))


def _relu_model(name: str, kind: str, quant: tuple[float, int, float, int]) -> bytes:
    from tflite_builder import Operator, Subgraph, Tensor, build

    in_scale, in_zero, out_scale, out_zero = quant
    tensors = [
        Tensor("x", kind, [256], scale=in_scale, zero_point=in_zero),
        Tensor("y", kind, [256], scale=out_scale, zero_point=out_zero),
    ]
    return build(Subgraph(tensors, [Operator(name, [0], [1])], [0], [1]))


def test_requantizing_relu_is_tflites_single_rescale():
    # 0.1 -> 0.3: TFLite rescales x by QuantizeMultiplier(float 0.1 / 0.3) = (1431655680, -1):
    # 1 -> the high multiply's 0.67 -> 1, halved 0.5 -> 1; 4 -> 2.67 -> 3 -> 1.5 -> 2;
    # 7 -> 4.67 -> 5 -> 2.5 -> 3 (the reals 0.33, 1.33, 2.33 round to 0, 1, 2, which the
    # earlier ADD-of-0 lowering gave)
    assert quantize_multiplier(float(np.float32(0.1) / np.float32(0.3))) == (1431655680, -1)
    data = _relu_model("RELU", "uint8", (0.1, 0, 0.3, 0))
    stored = np.arange(256, dtype=np.uint8)
    out = imported_output(data, stored)
    np.testing.assert_array_equal(out[[0, 1, 4, 7]], [0, 1, 2, 3])
    assert [name for lowering in nnapi.load_tflite(data).lowerings for name in lowering.operations] == ["MUL"]


@pytest.mark.parametrize("name", ["RELU", "RELU6", "RELU_N1_TO_1"])
@pytest.mark.parametrize("kind", ["uint8", "int8"])
def test_requantizing_relu_equals_litert_on_every_stored_value(name, kind):
    pytest.importorskip("ai_edge_litert")
    rng = np.random.default_rng(21)
    low, high = _RANGES[kind]
    stored = np.arange(low, high + 1).astype(kind)
    for _ in range(20):
        quant = (_scale(rng), int(rng.integers(low, high + 1)), _scale(rng), int(rng.integers(low, high + 1)))
        data = _relu_model(name, kind, quant)
        np.testing.assert_array_equal(
            imported_output(data, stored), litert_builtin_output(data, stored), err_msg=str(quant)
        )


def test_mean_multiplier_is_tflites():
    # 0.5 / 0.25 = 2: QuantizeMultiplier (2**30, 2); 3 elements: k = 1, (2**31) // 3
    assert mean_multiplier(0.5, 0.25, 3) == ((1 << 31) // 3, 1)
    # 0.02 / 0.5 over 49: exponent -4, k = floor(log2 49) = 5: (m << 5) // 49, exponent -9
    fixed, exponent = quantize_multiplier(float(np.float32(0.02)) / float(np.float32(0.5)))
    assert mean_multiplier(0.02, 0.5, 49) == ((fixed << 5) // 49, exponent - 5)
    assert (fixed << 5) // 49 < 1 << 30  # not renormalized


def _mean_model(kind: str, shape, axes, quant, keep: bool = False) -> bytes:
    from tflite_builder import Operator, Subgraph, Tensor, build

    in_scale, in_zero, out_scale, out_zero = quant
    out_shape = (
        [1 if i in axes else d for i, d in enumerate(shape)]
        if keep
        else [d for i, d in enumerate(shape) if i not in axes]
    )
    tensors = [
        Tensor("x", kind, shape, scale=in_scale, zero_point=in_zero),
        Tensor("axes", "int32", [len(axes)], data=np.array(axes, np.int32)),
        Tensor("y", kind, out_shape, scale=out_scale, zero_point=out_zero),
    ]
    return build(Subgraph(tensors, [Operator("MEAN", [0, 1], [2], ("ReducerOptions", {"KeepDims": keep}))], [0], [2]))


def test_requantizing_mean_is_a_table_of_tflites_integer_rescale():
    # mean of 6 values over axes (0, 2) of [2, 2, 3], 0.5 -> 0.25 (zero points 3, -1): TFLite's
    # multiplier is (2**30 << 2) // 6 = 715827882 with exponent 2 - 2 = 0, a real 1/3 - 2e-10
    data = _mean_model("int8", [2, 2, 3], [0, 2], (0.5, 3, 0.25, -1), keep=True)
    emitted = [name for lowering in nnapi.load_tflite(data).lowerings for name in lowering.operations]
    assert emitted == ["DEQUANTIZE", "REDUCE_SUM", "MUL", "ADD", "FLOOR", "ADD", "CAST", "GATHER"]
    x = np.array([[[4, 5, 6], [3, 3, 3]], [[9, 3, 3], [10, 2, 3]]], np.int8)
    # sums of q - 3 at axis-1 index 0: 1+2+3+6+0+0 = 12 -> 4.0 - 1e-8 -> 4, + zero point -1 = 3;
    # at index 1: 0+0+0+7-1+0 = 6 -> 2, 1
    for device in ("nnapi-reference", "nnapi-ort-cpu"):
        np.testing.assert_array_equal(imported_output(data, x, device), [[[3], [1]]])


def _rows_of_every_sum(kind: str, count: int, zero_point: int) -> np.ndarray:
    """[count * 255 + 1, count] stored values whose rows' sums of (q - zero point) are every
    possible one, in order."""
    low, high = _RANGES[kind]
    totals = np.arange(count * low, count * high + 1)
    base = np.floor_divide(totals, count)
    rows = np.repeat(base[:, None], count, axis=1) + (np.arange(count)[None, :] < (totals - base * count)[:, None])
    assert np.array_equal(rows.sum(axis=1), totals) and rows.min() >= low and rows.max() <= high
    return rows.astype(kind)


def test_requantizing_mean_equals_litert_on_every_sum():
    """Against LiteRT's builtin general Mean kernel (every MEAN but keep_dims over axes 1
    and 2 of a 4-D tensor, the next test's): equal on each device, over rows giving every possible sum for
    quantizations like a LayerNormalization's (48 values: ViT-tiny's int8 moments, where the
    FULLY_CONNECTED lowering, whose multiplier is not TFLite's, was a step off on ~1% of the
    sums), and on random tensors of other shapes, axes and zero points."""
    pytest.importorskip("ai_edge_litert")
    rng = np.random.default_rng(21)
    # rows of every sum: 48 values (summed before FLOOR), 127 (the most summed so) with the
    # zero point at the end of the range (|q - zero point| up to 255), 160 (FLOOR first)
    cases = [("int8", [12241, 48], [1], (0.0112, -5, 0.000587, 11), False),
             ("uint8", [12241, 48], [1], (0.05, 130, 0.004, 200), True),
             ("uint8", [32386, 127], [1], (0.0371, 0, 0.0009, 3), False),
             ("int8", [40801, 160], [1], (0.0093, 127, 0.00071, -20), True)]
    for case in range(40):
        kind = ("uint8", "int8")[case % 2]
        low, high = _RANGES[kind]
        shape, axes, keep = [([1, 7, 5, 8], [1, 2], False), ([4, 33], [1], True), ([3, 4, 5], [0, 2], True),
                             ([1, 17, 48], [2], True), ([2, 3, 4, 5], [3], True), ([3, 200], [1], False)][case % 6]
        cases.append((kind, shape, axes, (_scale(rng, -2, 0), int(rng.integers(low, high + 1)), _scale(rng, -2, 0),
                                          int(rng.integers(low, high + 1))), keep))
    lowerings = set()
    for kind, shape, axes, quant, keep in cases:
        low, high = _RANGES[kind]
        data = _mean_model(kind, shape, axes, quant, keep)
        every_sum = shape[0] == shape[1] * (high - low) + 1
        feed = _rows_of_every_sum(kind, shape[1], quant[1]) if every_sum else \
            rng.integers(low, high + 1, size=shape).astype(kind)
        text = str(nnapi.load_tflite(data).lowerings[0])
        kind_of = "exact FULLY_CONNECTED" if "checked at import" in text else \
            "table, summed first" if "REDUCE_SUM, MUL" in text else "table, FLOOR first"
        if kind_of != "exact FULLY_CONNECTED":
            assert (kind_of == "table, summed first") == (int(np.prod([shape[a] for a in axes])) <= 127)
        lowerings.add(kind_of)
        want = litert_builtin_output(data, feed)
        for device in ("nnapi-reference", "nnapi-ort-cpu"):
            np.testing.assert_array_equal(imported_output(data, feed, device), want, err_msg=f"{device} {quant}")
    assert lowerings == {"exact FULLY_CONNECTED", "table, summed first", "table, FLOOR first"}, lowerings


def test_requantizing_global_average_mean_keeps_the_fully_connected_rescale():
    """LiteRT's 4-D Mean (keep_dims over axes 1 and 2: a global average pool) rounds
    otherwise than its general kernel; it keeps the FULLY_CONNECTED lowering (its XNNPACK
    delegate's results on the shared int8 MobileNets): against LiteRT's builtin kernel on
    random inputs and quantizations every value within one step, on each device."""
    pytest.importorskip("ai_edge_litert")
    rng = np.random.default_rng(2)
    for case in range(30):
        kind = ("uint8", "int8")[case % 2]
        low, high = _RANGES[kind]
        shape = [[1, 7, 5, 8], [1, 9, 9, 16], [2, 4, 6, 3]][case % 3]
        quant = (
            _scale(rng, -2, 0),
            int(rng.integers(low, high + 1)),
            _scale(rng, -2, 0),
            int(rng.integers(low, high + 1)),
        )
        data = _mean_model(kind, shape, [1, 2] if case % 4 else [2, 1], quant, keep=True)
        emitted = [name for lowering in nnapi.load_tflite(data).lowerings for name in lowering.operations]
        assert "FULLY_CONNECTED" in emitted and "GATHER" not in emitted
        feed = rng.integers(low, high + 1, size=shape).astype(kind)
        want = litert_builtin_output(data, feed).astype(int)
        for device in ("nnapi-reference", "nnapi-ort-cpu"):
            assert np.abs(imported_output(data, feed, device).astype(int) - want).max() <= 1


@pytest.mark.parametrize("kind", ["uint8", "int8"])
def test_leaky_relu_equals_litert_on_every_stored_value(kind):
    """LEAKY_RELU, imported as PRELU by one constant slope, is the reference's fixed-point
    PRELU: TFLite's two quantized multipliers (identity and alpha)."""
    pytest.importorskip("ai_edge_litert")
    from tflite_builder import Operator, Subgraph, Tensor, build

    rng = np.random.default_rng(13)
    low, high = _RANGES[kind]
    stored = np.arange(low, high + 1).astype(kind)
    for _ in range(20):
        (in_scale, in_zero), (out_scale, out_zero) = ((_scale(rng), int(rng.integers(low, high + 1))) for _ in "ab")
        alpha = float(np.float32(rng.choice([0.01, 0.1, 0.2, 0.3])))
        tensors = [
            Tensor("x", kind, [256], scale=in_scale, zero_point=in_zero),
            Tensor("y", kind, [256], scale=out_scale, zero_point=out_zero),
        ]
        options = ("LeakyReluOptions", {"Alpha": alpha})
        data = build(Subgraph(tensors, [Operator("LEAKY_RELU", [0], [1], options)], [0], [1]))
        np.testing.assert_array_equal(imported_output(data, stored), litert_builtin_output(data, stored))


def test_quantized_abs_equals_litert_on_every_stored_value():
    """Quantized ABS (NNAPI's takes no quantized tensors; it was refused) as a table of
    TFLite's integer kernel: equal to LiteRT's builtin ABS on every int8 stored value, with
    the output scale equal to the input's, exactly twice it (the rescale's ties: 5 * 0.5 is
    3 in TFLite's fixed point, 2 rounded half to even) and others, on each device; uint8 (which LiteRT's
    ABS refuses too) is refused, naming the rule."""
    pytest.importorskip("ai_edge_litert")
    from tflite_builder import Operator, Subgraph, Tensor, build

    rng = np.random.default_rng(31)
    low, high = _RANGES["int8"]
    stored = np.arange(low, high + 1).astype(np.int8)
    for case in range(12):
        in_scale, in_zero = _scale(rng), int(rng.integers(low, high + 1))
        out_scale, out_zero = (in_scale, in_zero) if case == 0 else \
            (float(np.float32(in_scale) * 2), int(rng.integers(low, 0))) if case == 1 else \
            (float(np.float32(in_scale * rng.uniform(0.6, 1.8))), int(rng.integers(low, 0)))
        tensors = [Tensor("x", "int8", [256], scale=in_scale, zero_point=in_zero),
                   Tensor("y", "int8", [256], scale=out_scale, zero_point=out_zero)]
        data = build(Subgraph(tensors, [Operator("ABS", [0], [1])], [0], [1]))
        want = litert_builtin_output(data, stored)
        assert len(np.unique(want)) > 8
        for device in ("nnapi-reference", "nnapi-ort-cpu"):
            np.testing.assert_array_equal(imported_output(data, stored, device), want, err_msg=f"{device} {case}")
    tensors = [Tensor("x", "uint8", [4], scale=0.1, zero_point=128), Tensor("y", "uint8", [4], scale=0.1, zero_point=0)]
    with pytest.raises(nnapi.BadDataError, match=r"ABS of TENSOR_QUANT8_ASYMM \(TFLite's kernel takes int8"):
        nnapi.load_tflite(build(Subgraph(tensors, [Operator("ABS", [0], [1])], [0], [1])))


@pytest.mark.parametrize("scale", [1e37, 1e-39])
def test_table_lowerings_refuse_scales_that_float32_cannot_recover(scale):
    """int8 ABS and the requantizing MEAN read a table by each stored value recovered in
    float32 (DEQUANTIZE, MUL by 1 / scale, ADD, FLOOR): with an input scale of 1e37, 255 *
    scale overflows to inf (the import succeeded, the run failed with GATHER index 256); with
    1e-39 (subnormal) its inverse does. Checked at import over all 256 values: refused,
    naming the rule. (A MEAN of ViT's LayerNormalization quantization, whose FULLY_CONNECTED
    form is not exact, so that the table is taken, scaled up to 5e37.)"""
    from tflite_builder import Operator, Subgraph, Tensor, build

    tensors = [Tensor("x", "int8", [4], scale=scale, zero_point=-128),
               Tensor("y", "int8", [4], scale=scale * 2, zero_point=0)]
    abs_model = build(Subgraph(tensors, [Operator("ABS", [0], [1])], [0], [1]))
    factor = 5e37 / 0.0112 if scale > 1 else 1e-39 / 0.0112
    mean_model = _mean_model("int8", [3, 48], [1], (0.0112 * factor, -5, 0.000587 * factor, 11))
    for data in (abs_model, mean_model):
        with pytest.raises(nnapi.BadDataError, match="stored values are not recovered exactly in float32"):
            nnapi.load_tflite(data)
    # the check refuses no ordinary scale: these import
    tensors = [Tensor("x", "int8", [4], scale=1e-3, zero_point=-128),
               Tensor("y", "int8", [4], scale=2e-3, zero_point=0)]
    nnapi.load_tflite(build(Subgraph(tensors, [Operator("ABS", [0], [1])], [0], [1])))
    nnapi.load_tflite(_mean_model("int8", [3, 48], [1], (0.0112, -5, 0.000587, 11)))


@pytest.mark.parametrize("factor", [1e37, 1e-36])
def test_requantizing_mean_table_of_extreme_scales_recovers_each_value_first(factor):
    """The table's sum of up to 127 values is taken before FLOOR where its float32 error
    bound holds: not where the sum of the reals overflows (48 * 255 * 1.12e35) or the
    reals are subnormal (a scale of 1.12e-38); there each stored value is recovered first
    and the integers summed, equal to LiteRT's builtin kernel on every sum, on each
    device."""
    pytest.importorskip("ai_edge_litert")
    quant = (0.0112 * factor, -5, 0.000587 * factor, 11)
    data = _mean_model("int8", [12241, 48], [1], quant)
    emitted = [name for lowering in nnapi.load_tflite(data).lowerings for name in lowering.operations]
    assert emitted == ["DEQUANTIZE", "MUL", "ADD", "FLOOR", "REDUCE_SUM", "ADD", "CAST", "GATHER"]
    feed = _rows_of_every_sum("int8", 48, quant[1])
    want = litert_builtin_output(data, feed)
    for device in ("nnapi-reference", "nnapi-ort-cpu"):
        np.testing.assert_array_equal(imported_output(data, feed, device), want, err_msg=device)
