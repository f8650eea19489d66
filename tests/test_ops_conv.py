"""Convolution, pooling, fully connected, BATCH_MATMUL, softmax, normalization and resize
operations: what the CTS vectors do not cover.

TENSOR_QUANT8_ASYMM_SIGNED (feature level 4) against float references, per-channel
filters, NCHW and dilation against a naive convolution, outputs declared with
unspecified dimensions, constants through shared memory, zero-sized batches,
BATCH_MATMUL (feature level 6), RESIZE's align_corners / half_pixel_centers (feature
level 4), bad signatures (BAD_DATA at add_operation) and bad values (OP_FAILED).
"""

from __future__ import annotations

import numpy as np
import pytest

import nnapi
from helpers import build_single_op_model, run_single_op
from nnapi import FuseCode, OperandType, PaddingCode, SymmPerChannelQuantParams
from nnapi import OperandCode as T
from nnapi import OperationCode as Op
from nnapi.operations import get_operation
from nnapi.operations._conv_common import output_stage, requantize_accumulators
from nnapi.operations.base import ExecutionContext, Tensor
from nnapi.operations.quant_math import rescale_multipliers

RNG = np.random.default_rng(1234)


# --- shorthands ------------------------------------------------------------------------
def f32(*dims):
    return OperandType(T.TENSOR_FLOAT32, dims)


def f16(*dims):
    return OperandType(T.TENSOR_FLOAT16, dims)


def i32(*dims, scale=0.0):
    return OperandType(T.TENSOR_INT32, dims, scale)


def q8s(*dims, scale=0.5, zero_point=-10):
    return OperandType(T.TENSOR_QUANT8_ASYMM_SIGNED, dims, scale, zero_point)


def q8(*dims, scale=0.5, zero_point=100):
    return OperandType(T.TENSOR_QUANT8_ASYMM, dims, scale, zero_point)


def per_channel(dims, scales, channel_dim):
    return OperandType(T.TENSOR_QUANT8_SYMM_PER_CHANNEL, dims, 0.0, 0,
                       SymmPerChannelQuantParams(channel_dim, scales))


def INT(value):  # noqa: N802 - reads as an operand type
    return (OperandType(T.INT32), value)


def BOOL(value):  # noqa: N802
    return (OperandType(T.BOOL), value)


def FLOAT(value):  # noqa: N802
    return (OperandType(T.FLOAT32), value)


def dequant(q, op_type):
    return (q.astype(np.float64) - op_type.zero_point) * op_type.scale


def naive_conv(x, w, b, pads, strides, dilations, groups=1):
    """Direct NHWC grouped convolution in float64: x (N,H,W,C), w (OC,KH,KW,C/groups);
    pads (top, bottom, left, right)."""
    top, bottom, left, right = pads
    xp = np.pad(x, ((0, 0), (top, bottom), (left, right), (0, 0)))
    n, hp, wp, c = xp.shape
    oc, kh, kw, cg = w.shape
    out_h = (hp - ((kh - 1) * dilations[0] + 1)) // strides[0] + 1
    out_w = (wp - ((kw - 1) * dilations[1] + 1)) // strides[1] + 1
    per_group = oc // groups
    out = np.zeros((n, out_h, out_w, oc))
    for y in range(out_h):
        for z in range(out_w):
            for k in range(oc):
                g = k // per_group
                rows = y * strides[0] + np.arange(kh) * dilations[0]
                cols = z * strides[1] + np.arange(kw) * dilations[1]
                patch = xp[:, rows][:, :, cols][..., g * cg:(g + 1) * cg]
                out[:, y, z, k] = np.sum(patch * w[k], axis=(1, 2, 3)) + b[k]
    return out


def quantize_ref(real, op_type, fuse=FuseCode.FUSED_NONE):
    low, high = (-128, 127) if op_type.type == T.TENSOR_QUANT8_ASYMM_SIGNED else (0, 255)
    if fuse == FuseCode.FUSED_RELU:
        real = np.maximum(real, 0)
    q = np.floor(real / op_type.scale + 0.5) + op_type.zero_point
    return np.clip(q, low, high)


def assert_within_one(actual, expected):
    diff = np.abs(actual.astype(np.int64) - expected.astype(np.int64))
    assert diff.max() <= 1, f"max difference {diff.max()}"


# --- CONV_2D ---------------------------------------------------------------------------
def test_conv_quant8_signed_explicit_padding_strides_dilation_relu():
    x_type, w_type = q8s(2, 7, 6, 3, scale=0.1, zero_point=-5), q8s(4, 3, 2, 3, scale=0.05, zero_point=3)
    b_type = i32(4, scale=float(np.float32(0.1) * np.float32(0.05)))
    out_type = q8s(0, 0, 0, 0, scale=0.2, zero_point=2)
    x = RNG.integers(-128, 128, (2, 7, 6, 3)).astype(np.int8)
    w = RNG.integers(-128, 128, (4, 3, 2, 3)).astype(np.int8)
    b = RNG.integers(-300, 300, 4).astype(np.int32)
    inputs = [(x_type, None), (w_type, w), (b_type, b), INT(1), INT(0), INT(2), INT(1), INT(1), INT(2),
              INT(FuseCode.FUSED_RELU), BOOL(False), INT(2), INT(1)]
    (out,) = run_single_op(Op.CONV_2D, inputs, [out_type], [x])
    real = naive_conv(dequant(x, x_type), dequant(w, w_type), b * b_type.scale, (2, 1, 1, 0), (2, 1), (1, 2))
    assert out.shape == real.shape == (2, 4, 5, 4)
    assert_within_one(out, quantize_ref(real, out_type, FuseCode.FUSED_RELU))


def test_conv_per_channel_signed_implicit_same():
    scales = (0.02, 0.05, 0.01)
    x_type = q8s(1, 5, 5, 2, scale=0.25, zero_point=7)
    out_type = q8s(1, 5, 5, 3, scale=0.1, zero_point=-3)
    x = RNG.integers(-128, 128, (1, 5, 5, 2)).astype(np.int8)
    w = RNG.integers(-127, 128, (3, 3, 3, 2)).astype(np.int8)
    b = RNG.integers(-100, 100, 3).astype(np.int32)
    inputs = [(x_type, None), (per_channel((3, 3, 3, 2), scales, 0), w), (i32(3), b),
              INT(PaddingCode.PADDING_SAME), INT(1), INT(1), INT(FuseCode.FUSED_NONE)]
    (out,) = run_single_op(Op.CONV_2D, inputs, [out_type], [x])
    real_w = w * np.array(scales)[:, None, None, None]
    real_b = b * 0.25 * np.array(scales)
    real = naive_conv(dequant(x, x_type), real_w, real_b, (1, 1, 1, 1), (1, 1), (1, 1))
    assert_within_one(out, quantize_ref(real, out_type))


def test_conv_nchw_matches_nhwc_and_dilation_matches_naive():
    x = RNG.standard_normal((2, 9, 8, 3)).astype(np.float32)
    w = RNG.standard_normal((5, 3, 3, 3)).astype(np.float32)
    b = RNG.standard_normal(5).astype(np.float32)
    common = [(f32(5, 3, 3, 3), w), (f32(5), b), INT(PaddingCode.PADDING_SAME), INT(1), INT(2),
              INT(FuseCode.FUSED_NONE)]
    (nhwc,) = run_single_op(Op.CONV_2D, [(f32(2, 9, 8, 3), None), *common, BOOL(False), INT(2), INT(3)],
                            [f32(0, 0, 0, 0)], [x])
    (nchw,) = run_single_op(Op.CONV_2D, [(f32(2, 3, 9, 8), None), *common, BOOL(True), INT(2), INT(3)],
                            [f32(0, 0, 0, 0)], [np.ascontiguousarray(x.transpose(0, 3, 1, 2))])
    np.testing.assert_allclose(nchw.transpose(0, 2, 3, 1), nhwc, rtol=1e-5, atol=1e-5)
    # SAME with dilation (height 3, width 2): effective filter 7 x 5, stride (2, 1)
    pad_h, pad_w = (5 - 1) * 2 + 7 - 9, (8 - 1) * 1 + 5 - 8  # (out - 1) * stride + effective - in
    expected = naive_conv(x, w, b, (pad_h // 2, pad_h - pad_h // 2, pad_w // 2, pad_w - pad_w // 2), (2, 1), (3, 2))
    assert nhwc.shape == (2, 5, 8, 5)
    np.testing.assert_allclose(nhwc, expected, rtol=1e-5, atol=1e-4)


def test_conv_constants_through_shared_memory_and_float16():
    x = RNG.standard_normal((1, 4, 4, 2)).astype(np.float16)
    w = RNG.standard_normal((3, 2, 2, 2)).astype(np.float16)
    b = RNG.standard_normal(3).astype(np.float16)
    inputs = [(f16(1, 4, 4, 2), None), (f16(3, 2, 2, 2), w), (f16(3), b), INT(PaddingCode.PADDING_VALID),
              INT(1), INT(1), INT(FuseCode.FUSED_RELU6)]
    (out,) = run_single_op(Op.CONV_2D, inputs, [f16(1, 3, 3, 3)], [x], constant_memory=True)
    expected = np.clip(naive_conv(x.astype(np.float64), w.astype(np.float64), b.astype(np.float64),
                                  (0, 0, 0, 0), (1, 1), (1, 1)), 0, 6)
    assert out.dtype == np.float16
    np.testing.assert_allclose(out.astype(np.float64), expected, rtol=5e-3, atol=5e-3)


def _run_kernel(code, inputs, outputs):
    """prepare + execute of one operation on ready tensors (zero-sized batches arise only
    between operations: the NDK cannot declare a zero dimension on a model input)."""
    tensors = [Tensor(t.type, tuple(np.shape(v)), t.scale, t.zero_point, t.channel_quant, np.asarray(v, t.dtype))
               for t, v in inputs]
    context = ExecutionContext(code, tensors, outputs)
    operation = get_operation(code)
    shapes = operation.prepare(context)
    results = operation.execute(context)
    for shape, result, output in zip(shapes, results, outputs, strict=True):
        assert result.shape == tuple(shape) and result.dtype == output.dtype
    return results


def test_zero_batch_passes_through():
    x = np.zeros((0, 3, 3, 2), np.int8)
    w = np.ones((4, 1, 1, 2), np.int8)
    tail = [INT(PaddingCode.PADDING_SAME), INT(1), INT(1), INT(0)]
    (conv,) = _run_kernel(Op.CONV_2D, [(q8s(0, 3, 3, 2), x), (q8s(4, 1, 1, 2), w), (i32(4, scale=0.25),
                                                                                       np.zeros(4)), *tail],
                          [q8s(0, 0, 0, 0)])
    assert conv.shape == (0, 3, 3, 4)
    (depthwise,) = _run_kernel(Op.DEPTHWISE_CONV_2D, [(q8s(0, 3, 3, 2), x), (q8s(1, 2, 2, 2), np.ones((1, 2, 2, 2))),
                                                      (i32(2, scale=0.25), np.zeros(2)), *tail[:3], INT(1),
                                                      INT(0)], [q8s(0, 0, 0, 0)])
    assert depthwise.shape == (0, 3, 3, 2)
    (pool,) = _run_kernel(Op.MAX_POOL_2D, [(q8s(0, 3, 3, 2), x), *tail[:3], INT(2), INT(2), INT(0)],
                          [q8s(0, 0, 0, 0)])
    assert pool.shape == (0, 3, 3, 2)
    (fc,) = _run_kernel(Op.FULLY_CONNECTED, [(f32(0, 3), np.zeros((0, 3))), (f32(2, 3), np.ones((2, 3))),
                                             (f32(2), np.zeros(2)), INT(0)], [f32(0, 0)])
    assert fc.shape == (0, 2)
    (resized,) = _run_kernel(Op.RESIZE_BILINEAR, [(q8s(0, 3, 3, 2), x), INT(5), INT(4)], [q8s(0, 0, 0, 0)])
    assert resized.shape == (0, 4, 5, 2)
    (soft,) = _run_kernel(Op.SOFTMAX, [(f32(0, 3), np.zeros((0, 3))), FLOAT(1.0)], [f32(0, 0)])
    assert soft.shape == (0, 3)


# --- DEPTHWISE / GROUPED / TRANSPOSE ---------------------------------------------------------
def test_depthwise_per_channel_signed_nchw_multiplier_dilation():
    scales = tuple(float(s) for s in RNG.uniform(0.01, 0.05, 4))
    x_type = q8s(1, 2, 6, 6, scale=0.2, zero_point=1)
    out_type = q8s(0, 0, 0, 0, scale=0.15, zero_point=0)
    x = RNG.integers(-128, 128, (1, 2, 6, 6)).astype(np.int8)
    w = RNG.integers(-127, 128, (1, 2, 2, 4)).astype(np.int8)
    b = RNG.integers(-50, 50, 4).astype(np.int32)
    inputs = [(x_type, None), (per_channel((1, 2, 2, 4), scales, 3), w), (i32(4), b),
              INT(0), INT(1), INT(1), INT(0), INT(1), INT(1), INT(2), INT(FuseCode.FUSED_NONE), BOOL(True),
              INT(2), INT(2)]
    (out,) = run_single_op(Op.DEPTHWISE_CONV_2D, inputs, [out_type], [x])
    real_x = dequant(x, x_type).transpose(0, 2, 3, 1)
    real_w = (w * np.array(scales))[0]  # (KH, KW, 4): output channel c*2+q reads input channel c
    full_w = np.zeros((4, 2, 2, 1))
    for k in range(4):
        full_w[k, :, :, 0] = real_w[:, :, k]
    # as a grouped convolution: 2 groups (input channels) of 2 filters each
    expected = naive_conv(real_x, full_w, b * 0.2 * np.array(scales), (1, 0, 0, 1), (1, 1), (2, 2), groups=2)
    assert out.shape == (1, 4, 5, 5)
    assert_within_one(out.transpose(0, 2, 3, 1), quantize_ref(expected, out_type))


def test_grouped_conv_quant8_signed():
    x_type, w_type = q8s(1, 4, 4, 4, scale=0.1, zero_point=0), q8s(6, 2, 2, 2, scale=0.03, zero_point=-2)
    b_type = i32(6, scale=float(np.float32(0.1) * np.float32(0.03)))
    out_type = q8s(1, 3, 3, 6, scale=0.05, zero_point=5)
    x = RNG.integers(-128, 128, (1, 4, 4, 4)).astype(np.int8)
    w = RNG.integers(-128, 128, (6, 2, 2, 2)).astype(np.int8)
    b = RNG.integers(-200, 200, 6).astype(np.int32)
    inputs = [(x_type, None), (w_type, w), (b_type, b), INT(PaddingCode.PADDING_VALID), INT(1), INT(1), INT(2),
              INT(FuseCode.FUSED_NONE), BOOL(False)]
    (out,) = run_single_op(Op.GROUPED_CONV_2D, inputs, [out_type], [x])
    expected = naive_conv(dequant(x, x_type), dequant(w, w_type), b * b_type.scale, (0, 0, 0, 0), (1, 1), (1, 1),
                          groups=2)
    assert_within_one(out, quantize_ref(expected, out_type))


def test_transpose_conv_quant8_signed_implicit_same():
    x_type, w_type = q8s(1, 2, 2, 1, scale=0.5, zero_point=0), q8s(1, 3, 3, 1, scale=0.5, zero_point=0)
    out_type = q8s(0, 0, 0, 0, scale=0.25, zero_point=-1)
    x = np.array([1, 2, 3, 4], np.int8).reshape(1, 2, 2, 1)
    w = np.ones((1, 3, 3, 1), np.int8)
    inputs = [(x_type, None), (w_type, w), (i32(1, scale=0.25), np.array([0], np.int32)),
              (i32(4), np.array([1, 4, 4, 1], np.int32)), INT(PaddingCode.PADDING_SAME), INT(2), INT(2),
              INT(FuseCode.FUSED_NONE), BOOL(False)]
    (out,) = run_single_op(Op.TRANSPOSE_CONV_2D, inputs, [out_type], [x])
    # real input [[.5, 1], [1.5, 2]] scattered with stride 2 through a 3x3 of 0.5s
    full = np.zeros((5, 5))
    for (i, j), v in np.ndenumerate(np.array([[0.5, 1.0], [1.5, 2.0]])):
        full[2 * i: 2 * i + 3, 2 * j: 2 * j + 3] += v * 0.5
    assert out.shape == (1, 4, 4, 1)
    np.testing.assert_array_equal(out[0, :, :, 0], quantize_ref(full[:4, :4], out_type))


# --- pooling ------------------------------------------------------------------------------
def test_average_pool_signed_rounds_half_away_and_excludes_padding():
    x_type = q8s(1, 2, 2, 1, scale=1.0, zero_point=0)
    x = np.array([-3, -2, 5, 6], np.int8).reshape(1, 2, 2, 1)
    inputs = [(x_type, None), INT(PaddingCode.PADDING_SAME), INT(1), INT(1), INT(1), INT(2), INT(0)]
    (out,) = run_single_op(Op.AVERAGE_POOL_2D, inputs, [q8s(0, 0, 0, 0, scale=1.0, zero_point=0)], [x])
    # windows 1 wide and 2 tall: (-3+5)/2=1, (-2+6)/2=2 on row 0; row 1 only itself (padding excluded)
    np.testing.assert_array_equal(out.reshape(2, 2), [[1, 2], [5, 6]])
    x2 = np.array([-3, -2], np.int8).reshape(1, 1, 2, 1)
    inputs = [(q8s(1, 1, 2, 1, scale=1.0, zero_point=0), None), INT(PaddingCode.PADDING_VALID), INT(1), INT(1),
              INT(2), INT(1), INT(0)]
    (out,) = run_single_op(Op.AVERAGE_POOL_2D, inputs, [q8s(1, 1, 1, 1, scale=1.0, zero_point=0)], [x2])
    assert out.item() == -3  # -2.5 rounds away from zero


def test_max_and_l2_pool_nchw_with_unspecified_output():
    x = RNG.standard_normal((1, 2, 4, 4)).astype(np.float32)
    args = [INT(0), INT(0), INT(0), INT(0), INT(2), INT(2), INT(2), INT(2), INT(0), BOOL(True)]
    (mx,) = run_single_op(Op.MAX_POOL_2D, [(f32(1, 2, 4, 4), None), *args], [OperandType(T.TENSOR_FLOAT32)], [x])
    (l2,) = run_single_op(Op.L2_POOL_2D, [(f32(1, 2, 4, 4), None), *args], [f32(0, 0, 0, 0)], [x])
    blocks = x.reshape(1, 2, 2, 2, 2, 2)
    np.testing.assert_allclose(mx, blocks.max(axis=(3, 5)))
    np.testing.assert_allclose(l2, np.sqrt((blocks ** 2).mean(axis=(3, 5))), rtol=1e-6)


# --- FULLY_CONNECTED --------------------------------------------------------------------
def test_fully_connected_signed_flattens_input_unspecified_output():
    x_type, w_type = q8s(2, 3, 4, scale=0.1, zero_point=-1), q8s(5, 4, scale=0.2, zero_point=2)
    b_type = i32(5, scale=float(np.float32(0.1) * np.float32(0.2)))
    out_type = q8s(0, 0, scale=0.3, zero_point=0)
    x = RNG.integers(-128, 128, (2, 3, 4)).astype(np.int8)
    w = RNG.integers(-128, 128, (5, 4)).astype(np.int8)
    b = RNG.integers(-100, 100, 5).astype(np.int32)
    (out,) = run_single_op(Op.FULLY_CONNECTED, [(x_type, None), (w_type, w), (b_type, b), INT(0)], [out_type], [x])
    real = dequant(x, x_type).reshape(6, 4) @ dequant(w, w_type).T + b * b_type.scale
    assert out.shape == (6, 5)
    assert_within_one(out, quantize_ref(real, out_type))


# --- BATCH_MATMUL -----------------------------------------------------------------------------
@pytest.mark.parametrize("adj_x,adj_y", [(False, False), (True, False), (False, True), (True, True)])
def test_batch_matmul_float32_adjoints(adj_x, adj_y):
    a = RNG.standard_normal((2, 3, 4, 5)).astype(np.float32)
    b = RNG.standard_normal((2, 3, 5, 6)).astype(np.float32)
    a_in = np.swapaxes(a, -1, -2).copy() if adj_x else a
    b_in = np.swapaxes(b, -1, -2).copy() if adj_y else b
    (out,) = run_single_op(Op.BATCH_MATMUL, [(f32(*a_in.shape), None), (f32(*b_in.shape), None), BOOL(adj_x),
                                            BOOL(adj_y)], [f32(0, 0, 0, 0)], [a_in, b_in])
    np.testing.assert_allclose(out, a @ b, rtol=1e-5, atol=1e-5)


def test_batch_matmul_float16_int32_and_optional_flags():
    a = RNG.standard_normal((3, 2)).astype(np.float16)
    b = RNG.standard_normal((2, 4)).astype(np.float16)
    (out,) = run_single_op(Op.BATCH_MATMUL, [(f16(3, 2), a), (f16(2, 4), b)], [f16(3, 4)])
    assert out.dtype == np.float16
    expected = (a.astype(np.float32) @ b.astype(np.float32)).astype(np.float16)
    np.testing.assert_allclose(out.astype(np.float32), expected.astype(np.float32))  # float16 rtol underflows
    ai = np.arange(12, dtype=np.int32).reshape(2, 2, 3) - 5
    bi = np.arange(12, dtype=np.int32).reshape(2, 3, 2) * 3
    (out,) = run_single_op(Op.BATCH_MATMUL, [(i32(2, 2, 3), ai), (i32(2, 3, 2), bi), (OperandType(T.BOOL), "omitted")],
                           [i32(2, 2, 2)])
    np.testing.assert_array_equal(out, ai @ bi)


def test_batch_matmul_quant8_signed():
    a_type, b_type = q8s(2, 3, 4, scale=0.05, zero_point=-3), q8s(2, 4, 2, scale=0.1, zero_point=4)
    out_type = q8s(2, 3, 2, scale=0.07, zero_point=1)
    a = RNG.integers(-128, 128, (2, 3, 4)).astype(np.int8)
    b = RNG.integers(-128, 128, (2, 4, 2)).astype(np.int8)
    (out,) = run_single_op(Op.BATCH_MATMUL, [(a_type, None), (b_type, None)], [out_type], [a, b])
    assert_within_one(out, quantize_ref(dequant(a, a_type) @ dequant(b, b_type), out_type))


def test_batch_matmul_bad_signatures_and_values():
    with pytest.raises(nnapi.BadDataError):
        build_single_op_model(Op.BATCH_MATMUL, [(f32(2, 3, 4), None), (f32(4, 2), None)], [f32(2, 3, 2)])
    with pytest.raises(nnapi.BadDataError):
        build_single_op_model(Op.BATCH_MATMUL, [(q8(3, 4), None), (q8(4, 2), None)], [q8(3, 2)])
    with pytest.raises(nnapi.BadDataError):
        build_single_op_model(Op.BATCH_MATMUL, [(f32(3, 4), None), (f16(4, 2), None)], [f32(3, 2)])
    # declared shapes whose inner dimensions differ: refused at add_operation (#17)
    with pytest.raises(nnapi.BadDataError, match="inner dimensions 4 and 3 differ"):
        build_single_op_model(Op.BATCH_MATMUL, [(f32(3, 4), None), (f32(3, 2), None)], [f32(0, 0)])
    # shapes only known at execution: refused at compute
    with pytest.raises(nnapi.OpFailedError):
        run_single_op(Op.BATCH_MATMUL, [(f32(0, 0), None), (f32(3, 2), None)], [f32(0, 0)],
                      [np.zeros((3, 4), np.float32), np.zeros((3, 2), np.float32)])


# --- SOFTMAX / normalization ---------------------------------------------------------------
def test_softmax_signed_axis_and_log_softmax():
    x_type = q8s(2, 3, scale=0.1, zero_point=0)
    x = np.array([[10, 20, 30], [-5, -5, 40]], np.int8)
    (out,) = run_single_op(Op.SOFTMAX, [(x_type, None), FLOAT(2.0), INT(0)],
                           [OperandType(T.TENSOR_QUANT8_ASYMM_SIGNED, (0, 0), 1 / 256, -128)], [x])
    real = dequant(x, x_type) * 2.0
    expected = np.exp(real) / np.exp(real).sum(axis=0)
    assert_within_one(out, np.clip(np.floor(expected * 256 + 0.5) - 128, -128, 127))
    xf = RNG.standard_normal((3, 4)).astype(np.float32)
    (out,) = run_single_op(Op.LOG_SOFTMAX, [(f32(3, 4), None), FLOAT(0.5), INT(-2)], [f32(3, 4)], [xf])
    scaled = xf.astype(np.float64) * 0.5
    np.testing.assert_allclose(out, scaled - np.log(np.exp(scaled).sum(axis=0)), rtol=1e-5, atol=1e-6)


def test_l2_normalization_signed_and_zero_vector():
    x_type = q8s(2, 3, scale=0.1, zero_point=4)
    x = np.array([[7, 8, 16], [4, 4, 4]], np.int8)  # second row is all zeros in real terms
    (out,) = run_single_op(Op.L2_NORMALIZATION, [(x_type, None)],
                           [OperandType(T.TENSOR_QUANT8_ASYMM_SIGNED, (2, 3), 1 / 128, 0)], [x])
    real = np.array([3.0, 4.0, 12.0]) / 13.0
    assert_within_one(out[0], np.clip(np.floor(real * 128 + 0.5), -128, 127))
    np.testing.assert_array_equal(out[1], [0, 0, 0])


def test_lrn_axis_and_instance_norm_layouts():
    x = RNG.standard_normal((2, 5, 3)).astype(np.float32)
    (out,) = run_single_op(Op.LOCAL_RESPONSE_NORMALIZATION, [(f32(2, 5, 3), None), INT(1), FLOAT(1.0), FLOAT(0.5),
                                                             FLOAT(0.75), INT(1)], [f32(2, 5, 3)], [x])
    squares = x.astype(np.float64) ** 2
    window = np.stack([squares[:, max(0, d - 1): d + 2].sum(axis=1) for d in range(5)], axis=1)
    np.testing.assert_allclose(out, x / (1.0 + 0.5 * window) ** 0.75, rtol=1e-5)
    y = RNG.standard_normal((2, 3, 4, 5)).astype(np.float32)
    scalars = [FLOAT(1.5), FLOAT(0.25), FLOAT(1e-3)]
    (nhwc,) = run_single_op(Op.INSTANCE_NORMALIZATION, [(f32(2, 3, 4, 5), None), *scalars, BOOL(False)],
                            [f32(2, 3, 4, 5)], [y])
    (nchw,) = run_single_op(Op.INSTANCE_NORMALIZATION, [(f32(2, 5, 3, 4), None), *scalars, BOOL(True)],
                            [f32(2, 5, 3, 4)], [np.ascontiguousarray(y.transpose(0, 3, 1, 2))])
    mean, var = y.mean(axis=(1, 2), keepdims=True), y.var(axis=(1, 2), keepdims=True)
    np.testing.assert_allclose(nhwc, (y - mean) * 1.5 / np.sqrt(var + 1e-3) + 0.25, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(nchw.transpose(0, 2, 3, 1), nhwc, rtol=1e-5, atol=1e-5)


# --- RESIZE ---------------------------------------------------------------------------------
IMAGE = np.array([[0.0, 1.0], [2.0, 3.0]], np.float32).reshape(1, 2, 2, 1)


def test_resize_bilinear_align_corners_and_half_pixel():
    (out,) = run_single_op(Op.RESIZE_BILINEAR, [(f32(1, 2, 2, 1), None), INT(3), INT(3), BOOL(False), BOOL(True),
                                                BOOL(False)], [f32(0, 0, 0, 0)], [IMAGE])
    np.testing.assert_allclose(out[0, :, :, 0], [[0, 0.5, 1], [1, 1.5, 2], [2, 2.5, 3]])
    (out,) = run_single_op(Op.RESIZE_BILINEAR, [(f32(1, 2, 2, 1), None), FLOAT(2.0), FLOAT(2.0), BOOL(False),
                                                BOOL(False), BOOL(True)], [f32(0, 0, 0, 0)], [IMAGE])
    steps = np.array([0, 0.25, 0.75, 1.0])
    np.testing.assert_allclose(out[0, :, :, 0], 2 * steps[:, None] + steps[None, :])


def test_resize_nearest_flags_signed_and_nchw():
    image = np.array([[-10, 20], [30, 40]], np.int8).reshape(1, 1, 2, 2)  # NCHW
    (out,) = run_single_op(Op.RESIZE_NEAREST_NEIGHBOR, [(q8s(1, 1, 2, 2), None), INT(4), INT(4), BOOL(True),
                                                        BOOL(False), BOOL(True)], [q8s(1, 1, 4, 4)], [image])
    np.testing.assert_array_equal(out[0, 0], np.array([[-10, -10, 20, 20]] * 2 + [[30, 30, 40, 40]] * 2))
    (out,) = run_single_op(Op.RESIZE_NEAREST_NEIGHBOR, [(q8s(1, 1, 2, 2), None), INT(3), INT(3), BOOL(True),
                                                        BOOL(True), BOOL(False)], [q8s(0, 0, 0, 0)], [image])
    np.testing.assert_array_equal(out[0, 0], [[-10, 20, 20], [30, 40, 40], [30, 40, 40]])
    with pytest.raises(nnapi.BadDataError, match="add_operation.*exclusive"):
        run_single_op(Op.RESIZE_NEAREST_NEIGHBOR, [(q8s(1, 1, 2, 2), None), INT(3), INT(3), BOOL(True),
                                                   BOOL(True), BOOL(True)], [q8s(0, 0, 0, 0)], [image])
    with pytest.raises(nnapi.OpFailedError):  # the input's shape known only at compute
        run_single_op(Op.RESIZE_NEAREST_NEIGHBOR, [(q8s(0, 0, 0, 0), None), INT(3), INT(3), BOOL(True),
                                                   BOOL(True), BOOL(True)], [q8s(0, 0, 0, 0)], [image])


# --- bad signatures -------------------------------------------------------------------------
_CONV_TAIL = [INT(PaddingCode.PADDING_SAME), INT(1), INT(1), INT(0)]


@pytest.mark.parametrize("inputs,outputs", [
    # too few inputs
    ([(f32(1, 3, 3, 1), None), (f32(1, 1, 1, 1), None), (f32(1), None), INT(1), INT(1)], [f32(1, 3, 3, 1)]),
    # float bias for a quantized convolution
    ([(q8(1, 3, 3, 1), None), (q8(1, 1, 1, 1), None), (f32(1), None), *_CONV_TAIL], [q8(1, 3, 3, 1)]),
    # bias scale is not input scale x filter scale
    ([(q8(1, 3, 3, 1), None), (q8(1, 1, 1, 1), None), (i32(1, scale=0.3), None), *_CONV_TAIL], [q8(1, 3, 3, 1)]),
    # per-channel filter with the wrong channel dimension
    ([(q8s(1, 3, 3, 1), None), (per_channel((2, 1, 1, 1), (0.1, 0.2), 3), None), (i32(2), None), *_CONV_TAIL],
     [q8s(1, 3, 3, 2)]),
    # filter of rank 3
    ([(f32(1, 3, 3, 1), None), (f32(1, 1, 1), None), (f32(1), None), *_CONV_TAIL], [f32(1, 3, 3, 1)]),
    # output of another type
    ([(f32(1, 3, 3, 1), None), (f32(1, 1, 1, 1), None), (f32(1), None), *_CONV_TAIL], [f16(1, 3, 3, 1)]),
    # a non-BOOL layout flag
    ([(f32(1, 3, 3, 1), None), (f32(1, 1, 1, 1), None), (f32(1), None), *_CONV_TAIL, INT(0)], [f32(1, 3, 3, 1)]),
])
def test_conv_bad_signatures(inputs, outputs):
    with pytest.raises(nnapi.BadDataError):
        build_single_op_model(Op.CONV_2D, inputs, outputs)


@pytest.mark.parametrize("code,inputs,outputs", [
    (Op.SOFTMAX, [(q8(1, 4), None), FLOAT(1.0)], [q8(1, 4, scale=0.5, zero_point=0)]),
    (Op.SOFTMAX, [(f16(1, 4), None), FLOAT(1.0)], [f16(1, 4)]),
    (Op.L2_POOL_2D, [(q8(1, 2, 2, 1), None), *_CONV_TAIL[:3], INT(1), INT(1), INT(0)], [q8(1, 2, 2, 1)]),
    (Op.AVERAGE_POOL_2D, [(q8(1, 2, 2, 1), None), *_CONV_TAIL[:3], INT(1), INT(1), INT(0)],
     [q8(1, 2, 2, 1, scale=0.25)]),
    (Op.FULLY_CONNECTED, [(f32(2, 3), None), (f32(1, 4, 3), None), (f32(4), None), INT(0)], [f32(2, 4)]),
    (Op.L2_NORMALIZATION, [(q8s(1, 4), None)], [q8s(1, 4, scale=1 / 128, zero_point=5)]),
    (Op.RESIZE_BILINEAR, [(f32(1, 2, 2, 1), None), INT(3), FLOAT(1.5)], [f32(1, 3, 3, 1)]),
    (Op.INSTANCE_NORMALIZATION, [(f32(1, 2, 2, 1), None), FLOAT(1.0), FLOAT(0.0), FLOAT(1e-3)], [f32(1, 2, 2, 1)]),
    (Op.DEPTHWISE_CONV_2D, [(q8(1, 3, 3, 1), None), (q8(1, 1, 1, 1), None), (i32(1, scale=0.25), None),
                            *_CONV_TAIL], [q8(1, 3, 3, 1)]),
    (Op.TRANSPOSE_CONV_2D, [(f32(1, 3, 3, 1), None), (f32(1, 1, 1, 1), None), (f32(1), None),
                            (i32(4), None), *_CONV_TAIL, INT(0)], [f32(1, 3, 3, 1)]),
])
def test_other_bad_signatures(code, inputs, outputs):
    with pytest.raises(nnapi.BadDataError):
        build_single_op_model(code, inputs, outputs)


def test_bad_values_fail_at_compute():
    x = np.zeros((1, 3, 3, 1), np.float32)
    bad_stride = [(f32(1, 3, 3, 1), None), (f32(1, 1, 1, 1), np.ones((1, 1, 1, 1), np.float32)),
                  (f32(1), np.zeros(1, np.float32)), INT(PaddingCode.PADDING_SAME), INT(0), INT(1), INT(0)]
    with pytest.raises(nnapi.BadDataError, match="add_operation.*strides must be positive"):
        run_single_op(Op.CONV_2D, bad_stride, [f32(0, 0, 0, 0)], [x])
    with pytest.raises(nnapi.OpFailedError):  # the input's shape known only at compute
        run_single_op(Op.CONV_2D, [(f32(0, 0, 0, 0), None), *bad_stride[1:]], [f32(0, 0, 0, 0)], [x])
    # input depth 1 against filter depth 2: refused at add_operation when the shapes are
    # declared (#17), at compute when the input's shape is only known then
    bad_channels = [(f32(1, 3, 3, 1), None), (f32(1, 1, 1, 2), np.ones((1, 1, 1, 2), np.float32)),
                    (f32(1), np.zeros(1, np.float32)), *_CONV_TAIL]
    with pytest.raises(nnapi.BadDataError, match="filter depth 2"):
        run_single_op(Op.CONV_2D, bad_channels, [f32(0, 0, 0, 0)], [x])
    with pytest.raises(nnapi.OpFailedError):
        run_single_op(Op.CONV_2D, [(f32(0, 0, 0, 0), None), *bad_channels[1:]], [f32(0, 0, 0, 0)], [x])
    with pytest.raises(nnapi.BadDataError, match="add_operation.*beta must be positive"):
        run_single_op(Op.SOFTMAX, [(f32(1, 3), None), FLOAT(-1.0)], [f32(1, 3)], [np.zeros((1, 3), np.float32)])
    with pytest.raises(nnapi.OpFailedError):
        run_single_op(Op.SOFTMAX, [(f32(0, 3), None), FLOAT(-1.0)], [f32(1, 3)], [np.zeros((1, 3), np.float32)])


# --- the folded fixed-point output stage -------------------------------------------------------
def test_requantize_fast_path_matches_step_by_step_pipeline():
    out = q8s(1, scale=0.07, zero_point=-9)
    multipliers, shifts = rescale_multipliers(0.013, np.array([0.5, 0.031, 0.0007, 0.25], np.float32), 0.07)
    assert np.all(shifts <= 0)
    acc = np.concatenate([np.arange(-5000, 5000), RNG.integers(-2**24, 2**24, 20000)]).reshape(-1, 4)
    bias = np.array([-77, 0, 12345, 3])
    for fuse in (FuseCode.FUSED_NONE, FuseCode.FUSED_RELU6):
        fast = requantize_accumulators(acc.astype(np.float64), multipliers, shifts, out, fuse,
                                       bias)
        np.testing.assert_array_equal(fast, output_stage(multipliers, shifts, out, fuse, bias).reference(acc))
