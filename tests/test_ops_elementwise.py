"""Element-wise operations beyond the CTS vectors: TENSOR_QUANT8_ASYMM_SIGNED and the other
feature level 4+ types, ELU / HARD_SWISH, outputs with unspecified dimensions, constants
through shared memory, bad signatures (BAD_DATA at add_operation) and zero-sized inputs.

Expected values are worked out by hand from the specification's formulas.
"""

from __future__ import annotations

import numpy as np
import pytest

import nnapi
from helpers import b8, build_single_op_model, f16, f32, i32, q8, run_single_op, s8
from nnapi import OperandCode as T
from nnapi import OperandType, SymmPerChannelQuantParams
from nnapi import OperationCode as Op
from nnapi.operations import ExecutionContext, OperationFailed, Tensor, get_operation
from nnapi.operations.quant_math import multiply_by_quantized_multiplier, quantize_multiplier

INT32 = OperandType(T.INT32)


def run(code, inputs, output, feeds=(), constant_memory=False):
    """Run a one-operation model and return its only output."""
    return run_single_op(code, inputs, [output], feeds, constant_memory=constant_memory)[0]


def unary(code, in_type, out_type, values):
    return run(code, [(in_type, None)], out_type, [np.asarray(values, dtype=in_type.dtype)])


def binary(code, a_type, b_type, out_type, a, b):
    return run(code, [(a_type, None), (b_type, None)], out_type,
               [np.asarray(a, dtype=a_type.dtype), np.asarray(b, dtype=b_type.dtype)])


def assert_bad(code, inputs, outputs):
    """add_operation (inside build_single_op_model) rejects the signature with BAD_DATA."""
    with pytest.raises(nnapi.BadDataError):
        build_single_op_model(code, inputs, outputs)


# --- activations ---------------------------------------------------------------------
def test_relu_family_quant8_signed_clamps_in_quantized_units():
    values = [-128, -20, -10, 0, 127]  # real (q + 10) * 0.5: -59, -5, 0, 5, 68.5
    t = s8([5], 0.5, -10)
    np.testing.assert_array_equal(unary(Op.RELU, t, t, values), [-10, -10, -10, 0, 127])
    np.testing.assert_array_equal(unary(Op.RELU1, t, t, values), [-12, -12, -10, -8, -8])
    np.testing.assert_array_equal(unary(Op.RELU6, t, t, values), [-10, -10, -10, 0, 2])


def test_relu_float_sends_nan_to_lower_bound():
    values = np.array([np.nan, -3.0, 0.5, 9.0], dtype=np.float32)
    np.testing.assert_array_equal(unary(Op.RELU6, f32([4]), f32([4]), values), [0.0, 0.0, 0.5, 6.0])
    np.testing.assert_array_equal(unary(Op.RELU1, f16([4]), f16([4]), values), [-1.0, -1.0, 0.5, 1.0])


def test_logistic_and_tanh_quant8_signed():
    values = [-100, -10, 0, 10, 100]  # real values -10, -1, 0, 1, 10
    out = unary(Op.LOGISTIC, s8([5], 0.1, 0), s8([5], 1 / 256, -128), values)
    np.testing.assert_array_equal(out, [-128, -59, 0, 59, 127])
    out = unary(Op.TANH, s8([5], 0.1, 0), s8([5], 1 / 128, 0), values)
    np.testing.assert_array_equal(out, [-128, -97, 0, 97, 127])


def test_logistic_tanh_require_the_prescribed_output_quantization():
    assert_bad(Op.LOGISTIC, [(q8([2], 0.1, 0), None)], [q8([2], 1 / 128, 0)])
    assert_bad(Op.LOGISTIC, [(s8([2], 0.1, 0), None)], [s8([2], 1 / 256, 0)])
    assert_bad(Op.TANH, [(q8([2], 0.1, 0), None)], [q8([2], 1 / 128, 0)])
    assert_bad(Op.TANH, [(s8([2], 0.1, 0), None)], [s8([2], 1 / 128, 128 - 256)])
    build_single_op_model(Op.TANH, [(q8([2], 0.1, 0), None)], [q8([2], 1 / 128, 128)])


def test_relu_quantized_output_must_keep_input_quantization():
    assert_bad(Op.RELU, [(s8([2], 0.5, 0), None)], [s8([2], 0.25, 0)])
    assert_bad(Op.RELU6, [(q8([2], 0.5, 3), None)], [q8([2], 0.5, 4)])


def test_hard_swish_float_and_quantized():
    x = [-5.0, -3.0, -1.0, 0.0, 1.0, 3.0, 5.0]
    expected = [0.0, 0.0, -1 / 3, 0.0, 2 / 3, 3.0, 5.0]
    np.testing.assert_allclose(unary(Op.HARD_SWISH, f32([7]), f32([7]), x), expected, rtol=1e-6)
    np.testing.assert_allclose(unary(Op.HARD_SWISH, f16([7]), f16([7]), x), expected, rtol=1e-3)
    # real = q * 0.05; output scale 0.04, zero point -10 (may differ from the input's)
    out = unary(Op.HARD_SWISH, s8([7], 0.05, 0), s8([7], 0.04, -10), [-100, -60, -20, 0, 20, 60, 100])
    np.testing.assert_array_equal(out, [-10, -10, -18, -10, 7, 65, 115])
    out = unary(Op.HARD_SWISH, q8([7], 0.05, 100), q8([7], 0.04, 10), [0, 40, 80, 100, 120, 160, 200])
    np.testing.assert_array_equal(out, [10, 10, 2, 10, 27, 85, 135])


@pytest.mark.parametrize("kind, scales, values, expected", [
    # LiteRT's (and Android's) int16 fixed-point kernel, recorded: where rounding the real
    # value once gives one more (9, 73, 112 / 88, 93 / 209 for the tiny multiplier, whose
    # rounding shift by 16 in int16 gives the sign's -1 or +1)
    ("int8", (0.03243685141205788, -25, 0.020794300362467766, -110), [56, 92, 117, -25, -128, 127],
     [8, 72, 111, -110, -110, 127]),
    ("uint8", (0.05, 100, 0.04, 10), [162, 166, 170, 100, 0, 255], [87, 92, 97, 10, 10, 204]),
    ("uint8", (0.0012682965025305748, 151, 0.9143238067626953, 209), [0, 150, 151, 255], [208, 208, 210, 210])])
def test_quantized_hard_swish_is_the_fixed_point_kernel(kind, scales, values, expected):
    in_scale, in_zero, out_scale, out_zero = scales
    make = s8 if kind == "int8" else q8
    out = unary(Op.HARD_SWISH, make([len(values)], in_scale, in_zero), make([len(values)], out_scale, out_zero),
                values)
    np.testing.assert_array_equal(out, expected)


def test_quantized_hard_swish_equals_litert_on_every_stored_value():
    """Against LiteRT's reference kernel on all 256 stored values of 40 random scale and
    zero point pairs (int8 and uint8) that LiteRT accepts."""
    pytest.importorskip("ai_edge_litert")
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    from tflite_builder import Operator, Subgraph, Tensor, build

    rng = np.random.default_rng(12)
    checked = 0
    while checked < 40:
        kind = ("int8", "uint8")[checked % 2]
        low, high = (-128, 127) if kind == "int8" else (0, 255)
        in_scale, out_scale = (float(np.float32(10 ** rng.uniform(-3, 0))) for _ in range(2))
        in_zero, out_zero = (int(rng.integers(low, high + 1)) for _ in range(2))
        tensors = [Tensor("x", kind, [256], scale=in_scale, zero_point=in_zero),
                   Tensor("y", kind, [256], scale=out_scale, zero_point=out_zero)]
        data = build(Subgraph(tensors, [Operator("HARD_SWISH", [0], [1])], [0], [1]))
        interpreter = Interpreter(model_content=data, experimental_op_resolver_type=OpResolverType.BUILTIN_REF)
        try:
            interpreter.allocate_tensors()
        except RuntimeError:  # its output multiplier must be below one
            continue
        stored = np.arange(low, high + 1).astype(kind)
        interpreter.set_tensor(interpreter.get_input_details()[0]["index"], stored)
        interpreter.invoke()
        want = interpreter.get_tensor(interpreter.get_output_details()[0]["index"])
        make = s8 if kind == "int8" else q8
        got = unary(Op.HARD_SWISH, make([256], in_scale, in_zero), make([256], out_scale, out_zero), stored)
        np.testing.assert_array_equal(got, want, err_msg=f"{kind} {in_scale} {in_zero} -> {out_scale} {out_zero}")
        checked += 1


def test_hard_swish_has_no_rank_limit():
    x = np.linspace(-4, 4, 32, dtype=np.float32).reshape(1, 2, 2, 2, 2, 2)
    out = unary(Op.HARD_SWISH, f32(x.shape), f32(x.shape), x)
    np.testing.assert_allclose(out, x * np.clip(x + 3, 0, 6) / 6, rtol=1e-6)


def test_elu_float32_and_float16():
    x = [-2.0, -0.5, 0.0, 1.5]
    out = run(Op.ELU, [(f32([4]), None), (OperandType(T.FLOAT32), 0.5)], f32([4]), [np.array(x, np.float32)])
    np.testing.assert_allclose(out, [0.5 * (np.exp(-2) - 1), 0.5 * (np.exp(-0.5) - 1), 0.0, 1.5], rtol=1e-6)
    out = run(Op.ELU, [(f16([4]), None), (OperandType(T.FLOAT16), 1.0)], f16([4]), [np.array(x, np.float16)])
    np.testing.assert_allclose(out.astype(np.float32), [np.exp(-2) - 1, np.exp(-0.5) - 1, 0.0, 1.5], rtol=1e-3)


def test_elu_alpha_must_match_the_tensor_type():
    assert_bad(Op.ELU, [(f16([4]), None), (OperandType(T.FLOAT32), 1.0)], [f16([4])])
    assert_bad(Op.ELU, [(q8([4], 0.5, 0), None), (OperandType(T.FLOAT32), 1.0)], [q8([4], 0.5, 0)])


def test_prelu_quant8_signed_broadcast_alpha():
    # x real = q * 0.5; alpha real = (q + 4) * 0.25 = 0.5; output scale 0.25, zero point 1
    out = binary(Op.PRELU, s8([5], 0.5, 0), s8([1], 0.25, -4), s8([5], 0.25, 1), [-4, -2, 0, 2, 4], [-2])
    np.testing.assert_array_equal(out, [-3, -1, 1, 5, 9])


def test_prelu_alpha_constant_in_shared_memory():
    alpha = np.array([0.1, 0.2, 0.3], dtype=np.float32)
    x = np.array([[-1.0, -2.0, -3.0], [1.0, 2.0, 3.0]], dtype=np.float32)
    out = run(Op.PRELU, [(f32([2, 3]), None), (f32([3]), alpha)], f32([0, 0]), [x], constant_memory=True)
    np.testing.assert_allclose(out, [[-0.1, -0.4, -0.9], [1.0, 2.0, 3.0]], rtol=1e-6)


# --- unary math ----------------------------------------------------------------------
def test_abs_and_neg_int32():
    values = [-5, 0, 7, -(2**31)]
    np.testing.assert_array_equal(unary(Op.ABS, i32([4]), i32([4]), values), [5, 0, 7, -(2**31)])
    np.testing.assert_array_equal(unary(Op.NEG, i32([4]), i32([4]), values), [5, 0, -7, -(2**31)])


def test_unary_float16_and_unspecified_output():
    out = unary(Op.RSQRT, f16([2, 2]), f16([0, 0]), [[4.0, 16.0], [0.25, 1.0]])
    assert out.shape == (2, 2) and out.dtype == np.float16
    np.testing.assert_allclose(out.astype(np.float32), [[0.5, 0.25], [2.0, 1.0]])
    out = unary(Op.EXP, f32([3]), f32([]), [0.0, 1.0, -1.0])  # output of unknown rank
    np.testing.assert_allclose(out, np.exp([0.0, 1.0, -1.0]), rtol=1e-6)


def test_floor_rank_limit():
    assert_bad(Op.FLOOR, [(f32([1, 1, 1, 1, 2]), None)], [f32([1, 1, 1, 1, 2])])
    assert_bad(Op.RELU, [(f32([1, 1, 1, 1, 2]), None)], [f32([1, 1, 1, 1, 2])])


def test_unary_bad_signatures():
    assert_bad(Op.EXP, [(i32([2]), None)], [i32([2])])  # EXP has no integer form
    assert_bad(Op.SQRT, [(f32([2]), None)], [f16([2])])  # output type must match
    assert_bad(Op.SIN, [(f32([2]), None), (f32([2]), None)], [f32([2])])  # one input only
    assert_bad(Op.LOG, [(f32([2]), None)], [f32([3])])  # declared output shape disagrees


# --- binary math ---------------------------------------------------------------------
def test_maximum_minimum_quant8_signed_with_three_quantizations():
    a, b = s8([3], 1.0, 0), s8([3], 0.5, 2)  # reals a: -3, 5, 10; b: 0, -1, 14
    out_type = s8([3], 2.0, -1)
    np.testing.assert_array_equal(binary(Op.MAXIMUM, a, b, out_type, [-3, 5, 10], [2, 0, 30]), [-1, 2, 6])
    np.testing.assert_array_equal(binary(Op.MINIMUM, a, b, out_type, [-3, 5, 10], [2, 0, 30]), [-3, -2, 4])


def _std_max_min(code, a, b):
    """Android's maximum_minimum.cpp: std::max(a, b) is (a < b) ? b : a, std::min(a, b)
    (b < a) ? b : a, element by element."""
    pick = (lambda x, y: y if x < y else x) if code == Op.MAXIMUM else (lambda x, y: y if y < x else x)
    return np.array([pick(x, y) for x, y in zip(a.tolist(), b.tolist(), strict=True)], a.dtype)


@pytest.mark.parametrize("kind", [f32, f16])
@pytest.mark.parametrize("code", [Op.MAXIMUM, Op.MINIMUM])
def test_maximum_minimum_float_nan_and_signed_zeros_as_std_max_min(code, kind):
    # np.maximum / np.minimum gave NaN for either NaN: Android's std::max(1, NaN) is 1,
    # std::max(NaN, 1) NaN, and of -0 and +0 (equal) the first
    special = [np.nan, -0.0, 0.0, 1.0, -1.0, np.inf, -np.inf]
    a, b = (np.array(v, kind([1]).dtype) for v in zip(*[(x, y) for x in special for y in special], strict=True))
    out = binary(code, kind([a.size]), kind([a.size]), kind([a.size]), a, b)
    np.testing.assert_array_equal(out.view(np.uint16 if out.dtype == np.float16 else np.uint32),
                                  _std_max_min(code, a, b).view(out.view(np.uint16 if out.dtype == np.float16
                                                                         else np.uint32).dtype))
    def at(x: int, y: int) -> float:  # the result for special[x], special[y]
        return out[x * len(special) + y]

    assert at(3, 0) == 1.0 and np.isnan(at(0, 3))  # (1, NaN) and (NaN, 1)
    assert np.signbit(at(1, 2)) and not np.signbit(at(2, 1))  # (-0, +0) and (+0, -0)


def test_maximum_int32_broadcast_unspecified_output():
    out = binary(Op.MAXIMUM, i32([2, 1]), i32([3]), i32([]), [[0], [5]], [1, 4, 9])
    np.testing.assert_array_equal(out, [[1, 4, 9], [5, 5, 9]])


def test_pow_broadcast_and_constant_exponent_in_shared_memory():
    exponent = np.array([0.0, 1.0, 2.0], dtype=np.float32)
    base = np.array([[2.0], [3.0]], dtype=np.float32)
    out = run(Op.POW, [(f32([2, 1]), None), (f32([3]), exponent)], f32([0, 0]), [base], constant_memory=True)
    np.testing.assert_allclose(out, [[1, 2, 4], [1, 3, 9]])


def test_binary_bad_signatures():
    assert_bad(Op.POW, [(i32([2]), None), (i32([2]), None)], [i32([2])])
    assert_bad(Op.MAXIMUM, [(f32([2]), None), (f16([2]), None)], [f32([2])])
    assert_bad(Op.MINIMUM, [(f32([2]), None), (f32([3]), None)], [f32([3])])  # shapes do not broadcast
    assert_bad(Op.MAXIMUM, [(f32([2, 1]), None), (f32([3]), None)], [f32([2, 2])])  # wrong output shape


# --- arithmetic (feature level 4 types) ------------------------------------------------
def test_add_sub_mul_quant8_signed():
    a, b = s8([2], 0.5, 0), s8([2], 0.25, -1)  # reals a: 1, 2; b: 1, -1
    none = (INT32, 0)
    out = run(Op.ADD, [(a, None), (b, None), none], s8([2], 0.5, 1),
              [np.array([2, 4], np.int8), np.array([3, -5], np.int8)])
    np.testing.assert_array_equal(out, [5, 3])
    out = run(Op.SUB, [(a, None), (b, None), none], s8([2], 0.5, 1),
              [np.array([2, 4], np.int8), np.array([3, -5], np.int8)])
    np.testing.assert_array_equal(out, [1, 7])
    out = run(Op.MUL, [(a, None), (b, None), (INT32, 1)], s8([2], 0.5, 0),
              [np.array([2, -4], np.int8), np.array([3, 7], np.int8)])
    np.testing.assert_array_equal(out, [2, 0])  # 1 * 1 = 1; RELU clamps -2 * 2 to 0


def test_int32_arithmetic():
    none = (INT32, 0)
    out = run(Op.DIV, [(i32([4]), None), (i32([4]), None), none], i32([4]),
              [np.array([-5, 5, 7, -7], np.int32), np.array([2, 2, -2, -2], np.int32)])
    np.testing.assert_array_equal(out, [-3, 2, -4, 3])
    out = run(Op.MUL, [(i32([2]), None), (i32([1]), None), none], i32([0]),
              [np.array([3, -4], np.int32), np.array([6], np.int32)])
    np.testing.assert_array_equal(out, [18, -24])


def test_mul_quantized_output_scale_rule():
    assert_bad(Op.MUL, [(q8([2], 0.5, 0), None), (q8([2], 0.5, 0), None), (INT32, 0)], [q8([2], 0.25, 0)])
    assert_bad(Op.MUL, [(s8([2], 0.5, 0), None), (s8([2], 0.5, 0), None), (INT32, 0)], [s8([2], 0.2, 0)])


# --- comparisons, logical, select -----------------------------------------------------
def test_comparisons_quant8_signed_compare_real_values():
    a, b = s8([3], 1.0, 0), s8([3], 0.5, 0)  # reals a: 1, 2, 3; b: 1, 2, 4
    expected = {
        Op.LESS: [False, False, True],
        Op.LESS_EQUAL: [True, True, True],
        Op.EQUAL: [True, True, False],
        Op.NOT_EQUAL: [False, False, True],
        Op.GREATER: [False, False, False],
        Op.GREATER_EQUAL: [True, True, False],
    }
    for code, want in expected.items():
        np.testing.assert_array_equal(binary(code, a, b, b8([3]), [1, 2, 3], [2, 4, 8]), want, err_msg=code.name)


def test_comparison_bool8_broadcast_unspecified_output():
    out = binary(Op.GREATER, b8([2, 1]), b8([2]), b8([0, 0]), [[True], [False]], [False, True])
    np.testing.assert_array_equal(out, [[True, False], [False, False]])


def test_comparison_output_must_be_bool8():
    assert_bad(Op.EQUAL, [(f32([2]), None), (f32([2]), None)], [f32([2])])
    assert_bad(Op.LESS, [(q8([2], 1.0, 0), None), (s8([2], 1.0, 0), None)], [b8([2])])


def test_logical_ops_broadcast():
    a = [[True, False], [True, True]]
    np.testing.assert_array_equal(binary(Op.LOGICAL_AND, b8([2, 2]), b8([2]), b8([]), a, [True, False]),
                                  [[True, False], [True, False]])
    np.testing.assert_array_equal(binary(Op.LOGICAL_OR, b8([2, 2]), b8([1]), b8([2, 2]), a, [False]), a)
    np.testing.assert_array_equal(unary(Op.LOGICAL_NOT, b8([3]), b8([0]), [True, False, True]), [False, True, False])
    assert_bad(Op.LOGICAL_AND, [(i32([2]), None), (i32([2]), None)], [b8([2])])


def test_select_quant8_signed_requantizes_into_output():
    out = run(Op.SELECT, [(b8([3]), None), (s8([3], 1.0, 0), None), (s8([3], 0.5, 0), None)], s8([3], 1.0, 5),
              [np.array([True, False, True]), np.array([1, 2, 3], np.int8), np.array([10, 20, 30], np.int8)])
    np.testing.assert_array_equal(out, [6, 15, 8])


def test_select_with_constants_in_shared_memory():
    a = np.arange(6, dtype=np.int32).reshape(2, 3)
    b = -a
    out = run(Op.SELECT, [(b8([2, 3]), None), (i32([2, 3]), a), (i32([2, 3]), b)], i32([0, 0]),
              [np.array([[True, False, True], [False, True, False]])], constant_memory=True)
    np.testing.assert_array_equal(out, [[0, -1, 2], [-3, 4, -5]])


def test_select_bad_signatures():
    assert_bad(Op.SELECT, [(i32([3]), None), (i32([3]), None), (i32([3]), None)], [i32([3])])
    assert_bad(Op.SELECT, [(b8([3]), None), (i32([3]), None), (f32([3]), None)], [i32([3])])
    assert_bad(Op.SELECT, [(b8([3]), None), (i32([3]), None), (i32([2]), None)], [i32([3])])


# --- cast ------------------------------------------------------------------------------
def test_cast_float_to_integers_truncates_and_saturates():
    values = np.array([-1.7, 1.7, 2.5, np.nan, 3e9, -3e9], dtype=np.float32)
    out = unary(Op.CAST, f32([6]), i32([6]), values)
    np.testing.assert_array_equal(out, [-1, 1, 2, 0, 2**31 - 1, -(2**31)])
    out = unary(Op.CAST, f32([3]), q8([3], 0.5, 7), [-3.0, 2.9, 300.0])  # scale / zero point ignored
    np.testing.assert_array_equal(out, [0, 2, 255])


def test_cast_int32_to_float16_and_quant8_to_float():
    np.testing.assert_array_equal(unary(Op.CAST, i32([3]), f16([3]), [-2, 2048, 70000]), [-2, 2048, np.inf])
    np.testing.assert_array_equal(unary(Op.CAST, q8([2], 0.5, 100), f32([2]), [0, 255]), [0.0, 255.0])


def test_cast_identity_for_feature_level_4_types():
    out = unary(Op.CAST, s8([3], 0.5, 1), s8([3], 2.0, -3), [-128, 5, 127])
    np.testing.assert_array_equal(out, [-128, 5, 127])
    np.testing.assert_array_equal(unary(Op.CAST, b8([2]), b8([2]), [True, False]), [True, False])
    q16 = OperandType(T.TENSOR_QUANT16_SYMM, [2], 0.5, 0)
    np.testing.assert_array_equal(unary(Op.CAST, q16, q16, [-300, 300]), [-300, 300])
    q8s = OperandType(T.TENSOR_QUANT8_SYMM, [2], 0.5, 0)
    np.testing.assert_array_equal(unary(Op.CAST, q8s, OperandType(T.TENSOR_QUANT8_SYMM, [0], 0.5, 0), [-3, 3]), [-3, 3])


def test_cast_unsupported_pairs():
    assert_bad(Op.CAST, [(b8([2]), None)], [i32([2])])
    assert_bad(Op.CAST, [(s8([2], 1.0, 0), None)], [f32([2])])
    assert_bad(Op.CAST, [(f32([2]), None)], [s8([2], 1.0, 0)])
    assert_bad(Op.CAST, [(f32([2]), None)], [b8([2])])


# --- quantize / dequantize ----------------------------------------------------------------
def test_quantize_rounds_half_away_and_saturates():
    values = np.array([-1.0, 0.25, 0.3, 100.0], dtype=np.float32)
    np.testing.assert_array_equal(unary(Op.QUANTIZE, f32([4]), s8([4], 0.5, -3), values), [-5, -2, -2, 127])
    np.testing.assert_array_equal(unary(Op.QUANTIZE, f16([2]), q8([2], 0.5, 10), [-0.25, 0.25]), [9, 11])


def test_quantize_bad_signatures():
    assert_bad(Op.QUANTIZE, [(f32([2]), None)], [OperandType(T.TENSOR_QUANT16_ASYMM, [2], 0.5, 0)])
    assert_bad(Op.QUANTIZE, [(i32([2]), None)], [q8([2], 0.5, 0)])


def test_dequantize_signed_symm_and_per_channel():
    out = unary(Op.DEQUANTIZE, s8([3], 0.5, -3), f32([0]), [-128, -3, 127])
    np.testing.assert_array_equal(out, [-62.5, 0.0, 65.0])
    out = unary(Op.DEQUANTIZE, OperandType(T.TENSOR_QUANT8_SYMM, [3], 0.25, 0), f16([3]), [-8, 0, 6])
    assert out.dtype == np.float16
    np.testing.assert_array_equal(out, [-2.0, 0.0, 1.5])
    per_channel = OperandType(T.TENSOR_QUANT8_SYMM_PER_CHANNEL, [2, 3], 0.0, 0,
                              SymmPerChannelQuantParams(1, [1.0, 0.5, 0.25]))
    out = unary(Op.DEQUANTIZE, per_channel, f32([2, 3]), [[4, 4, 4], [-8, -8, -8]])
    np.testing.assert_array_equal(out, [[4.0, 2.0, 1.0], [-8.0, -4.0, -2.0]])


def test_dequantize_bad_signatures():
    assert_bad(Op.DEQUANTIZE, [(f32([2]), None)], [f32([2])])
    assert_bad(Op.DEQUANTIZE, [(q8([2], 0.5, 0), None)], [i32([2])])
    assert_bad(Op.DEQUANTIZE, [(q8([1, 1, 1, 1, 2], 0.5, 0), None)], [f32([1, 1, 1, 1, 2])])


# --- zero-sized inputs (only produced inside a model, so the kernels are called directly) --
def _run_kernel(code, inputs, outputs):
    operation = get_operation(code)
    context = ExecutionContext(code, inputs, outputs)
    operation.check_inputs(context)  # the registration flags, as the driver enforces them
    shapes = operation.prepare(context)
    results = operation.execute(context)
    return shapes, results


def _tensor(operand_type, value):
    value = np.asarray(value, dtype=operand_type.dtype)
    return Tensor(operand_type.type, value.shape, operand_type.scale, operand_type.zero_point,
                  operand_type.channel_quant, value)


@pytest.mark.parametrize("code, in_type, out_type", [
    (Op.RELU, f32([0, 3]), f32([0, 3])),
    (Op.RELU6, s8([0, 3], 0.5, 0), s8([0, 3], 0.5, 0)),
    (Op.LOGISTIC, q8([0, 3], 0.5, 0), q8([0, 3], 1 / 256, 0)),
    (Op.TANH, f16([0, 3]), f16([0, 3])),
    (Op.HARD_SWISH, s8([0, 3], 0.5, 0), s8([0, 3], 0.25, 1)),
    (Op.QUANTIZE, f32([0, 3]), q8([0, 3], 0.5, 0)),
    (Op.DEQUANTIZE, s8([0, 3], 0.5, 0), f32([0, 3])),
])
def test_zero_sized_input_where_the_spec_allows_it(code, in_type, out_type):
    shapes, results = _run_kernel(code, [_tensor(in_type, np.zeros((0, 3)))], [out_type])
    assert shapes == [(0, 3)]
    assert results[0].shape == (0, 3) and results[0].dtype == out_type.dtype


def test_zero_sized_input_for_elu_and_add():
    alpha = _tensor(OperandType(T.FLOAT32), 1.0)
    shapes, results = _run_kernel(Op.ELU, [_tensor(f32([0, 2]), np.zeros((0, 2))), alpha], [f32([0, 2])])
    assert shapes == [(0, 2)] and results[0].shape == (0, 2)
    fuse = _tensor(INT32, 0)
    shapes, results = _run_kernel(Op.ADD, [_tensor(f32([0, 2]), np.zeros((0, 2))), _tensor(f32([1]), [1.0]), fuse],
                                  [f32([0, 2])])
    assert shapes == [(0, 2)] and results[0].shape == (0, 2)


def test_zero_sized_input_rejected_where_the_spec_does_not_allow_it():
    with pytest.raises(OperationFailed):
        _run_kernel(Op.EXP, [_tensor(f32([0, 2]), np.zeros((0, 2)))], [f32([0, 2])])
    with pytest.raises(OperationFailed):
        _run_kernel(Op.EQUAL, [_tensor(i32([0]), np.zeros(0)), _tensor(i32([1]), [1])], [b8([0])])


# --- large quantized tensors (evaluated through lookup tables) ---------------------------
def _round_half_away(x):
    return np.trunc(x + np.copysign(0.5, x))


def _quantize_reference(real, scale, zero_point, low, high):
    """Android's fixed-point kernels: round the scaled value, then add the zero point."""
    return np.clip(_round_half_away(real / scale) + zero_point, low, high)


def _requantize_reference(real, scale, zero_point, low, high):
    """Android's requantize (MAXIMUM, MINIMUM, SELECT): add the zero point, then round."""
    return np.clip(_round_half_away(real / scale + zero_point), low, high)


def test_large_quantized_binary_ops_match_elementwise_math():
    rng = np.random.default_rng(7)
    shape = (1, 64, 64, 32)  # large enough for the 256 x 256 table path
    a = rng.integers(0, 256, shape).astype(np.uint8)
    b = rng.integers(0, 256, shape[-1:]).astype(np.uint8)
    ta, tb, out = q8(shape, 0.07, 120), q8(shape[-1:], 0.03, 10), q8(shape, 0.11, 100)
    real_a, real_b = (a - 120.0) * 0.07, (b - 10.0) * 0.03
    got = run(Op.ADD, [(ta, None), (tb, None), (INT32, 3)], out, [a, b])
    want = np.clip(_quantize_reference(real_a + real_b, 0.11, 100, 0, 255), 100, 100 + round(6 / 0.11))
    np.testing.assert_array_equal(got, want)
    got = binary(Op.PRELU, ta, tb, out, a, b)
    # Android's fixed point: x - 120 by the multiplier of 0.07 / 0.11 (float32 quotient),
    # (x - 120) * (alpha - 10) by that of float32(0.07 * 0.03) / 0.11 (double quotient)
    positive = quantize_multiplier(float(np.float32(0.07) / np.float32(0.11)))
    negative = quantize_multiplier(float(np.float32(0.07) * np.float32(0.03)) / float(np.float32(0.11)))
    x, alpha = a.astype(np.int64) - 120, b.astype(np.int64) - 10
    want = np.clip(np.where(x >= 0, multiply_by_quantized_multiplier(x, *positive),
                            multiply_by_quantized_multiplier(x * alpha, *negative)) + 100, 0, 255)
    np.testing.assert_array_equal(got, want)
    sa, sb = a.view(np.int8), b.view(np.int8)
    got = binary(Op.MINIMUM, s8(shape, 0.07, -8), s8(shape[-1:], 0.03, 10), s8(shape, 0.11, 3), sa, sb)
    want = _requantize_reference(np.minimum((sa + 8.0) * 0.07, (sb - 10.0) * 0.03), 0.11, 3, -128, 127)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("code, low, high", [(Op.RELU, 0.0, np.inf), (Op.RELU1, -1.0, 1.0), (Op.RELU6, 0.0, 6.0)])
def test_relu_float16_every_value(code, low, high):
    every = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)
    out = unary(code, f16([every.size]), f16([every.size]), every)
    wide = every.astype(np.float32)
    want = np.where(np.isnan(wide), low, np.clip(wide, low, high)).astype(np.float16)
    np.testing.assert_array_equal(out, want)


def test_select_float_keeps_every_bit():
    x = np.array([np.nan, -0.0, np.inf, 1e-45], dtype=np.float32)
    y = np.array([1.0, 2.0, 3.0, 4.0], dtype=np.float32)
    out = run(Op.SELECT, [(b8([4]), None), (f32([4]), None), (f32([4]), None)], f32([4]),
              [np.array([True, True, False, True]), x, y])
    np.testing.assert_array_equal(out.view(np.uint32), np.array([x[0], x[1], y[2], x[3]]).view(np.uint32))


def test_quantize_nan_and_infinities_saturate():
    values = np.array([np.nan, np.inf, -np.inf], dtype=np.float32)
    np.testing.assert_array_equal(unary(Op.QUANTIZE, f32([3]), q8([3], 0.5, 10), values), [255, 255, 0])
    np.testing.assert_array_equal(unary(Op.QUANTIZE, f32([3]), s8([3], 0.5, 10), values), [127, 127, -128])


def test_cast_float16_to_quant8_truncates():
    out = unary(Op.CAST, f16([4]), q8([4], 1.0, 0), [2.7, 255.9, -0.5, 1000.0])
    np.testing.assert_array_equal(out, [2, 255, 0, 255])


def test_activation_bad_signatures():
    assert_bad(Op.HARD_SWISH, [(i32([2]), None)], [i32([2])])
    assert_bad(Op.PRELU, [(f32([2]), None), (f16([2]), None)], [f32([2])])
    assert_bad(Op.PRELU, [(f32([2, 3]), None), (f32([2]), None)], [f32([2, 3])])  # alpha does not broadcast
    assert_bad(Op.TANH, [(f32([2]), None)], [f32([2, 1])])  # declared output rank differs
    assert_bad(Op.LOGISTIC, [(f32([2]), None)], [f32([2]), f32([2])])  # one output only
