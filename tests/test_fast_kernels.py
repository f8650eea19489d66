"""The compiled kernels (``nnapi[fast]``, numba) against the numpy path they replace.

The same prepared operation is built twice, once with the compiled kernels and once with
``NNAPI_NO_NUMBA=1`` (the numpy path, itself tested against the reference in
test_prepared_kernels), on random shapes and values including the edge cases: per-channel
filters, positive and negative shifts, saturation, dilation, padding wider than the
kernel reach, depth multipliers, empty batches, NCHW. Quantized results must agree bit
for bit, float32 results to rounding. Skipped when numba is not installed.
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("numba")

from nnapi import OperandCode as T  # noqa: E402
from nnapi import OperandType  # noqa: E402
from nnapi import OperationCode as Op  # noqa: E402
from nnapi.codes import FuseCode  # noqa: E402
from nnapi.operand import SymmPerChannelQuantParams  # noqa: E402
from nnapi.operations import _conv_fast, _jit, get_operation  # noqa: E402
from nnapi.operations._conv_fast import PreparedDepthwise  # noqa: E402
from nnapi.operations.base import ExecutionContext, Tensor  # noqa: E402
from nnapi.operations.lstm_cell import PreparedLstm  # noqa: E402
from nnapi.operations.quant_math import OutputStage, quantize_multipliers  # noqa: E402

RNG = np.random.default_rng(23)


@pytest.fixture(autouse=True)
def _kernels_run_as_the_driver_runs_them():
    """Kernels here are called directly, without the driver's np.errstate(all="ignore"):
    the NaN / inf inputs these tests feed on purpose would otherwise print numpy warnings."""
    with np.errstate(all="ignore"):
        yield


INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1


def _tensor(code, value, scale=0.0, zero_point=0, channel_quant=None) -> Tensor:
    value = np.asarray(value)
    return Tensor(code, tuple(value.shape), scale, zero_point, channel_quant, value)


def _scalar(code, value) -> Tensor:
    dtype = {T.INT32: np.int32, T.BOOL: np.bool_, T.FLOAT32: np.float32}[code]
    return Tensor(code, (), 0.0, 0, None, np.array(value, dtype=dtype))


# --- the output stage -----------------------------------------------------------------------
def _stage(channels: int, shifts, dtype, low=None, high=None, zero_point=None, biases=None) -> OutputStage:
    info = np.iinfo(dtype)
    multipliers = RNG.integers(1 << 30, 1 << 31, len(shifts))
    multipliers[:1] = (1 << 31) - 1  # the largest Q31 mantissa
    zero_point = int(RNG.integers(info.min, info.max + 1)) if zero_point is None else zero_point
    bias = RNG.integers(-(1 << 20), 1 << 20, channels if biases is None else biases)
    return OutputStage(multipliers, shifts, bias, zero_point, info.min if low is None else low,
                       info.max if high is None else high, dtype)


@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
@pytest.mark.parametrize("acc_dtype", [np.float32, np.float64, np.int32, np.int64])
@pytest.mark.parametrize("shifts", ["negative", "mixed", "zero", "one"])
@pytest.mark.parametrize("folded", [False, True])
def test_output_stage_matches_numpy(dtype, acc_dtype, shifts, folded):
    """Both forms of the compiled stage: the general one and, for accumulators of a known
    bound and no left shifts, the one with the bias folded into a per-channel constant."""
    channels = int(RNG.integers(1, 40))
    shift = {"negative": RNG.integers(-31, 0, channels), "mixed": RNG.integers(-20, 6, channels),
             "zero": np.zeros(channels, np.int64), "one": np.array([-7])}[shifts]
    if shifts == "one":  # a single (per-tensor) multiplier and shift for every channel
        stage = _stage(1, shift, dtype, biases=channels)
    else:
        stage = _stage(channels, shift, dtype)
    bound = 2**23 if acc_dtype == np.float32 else 2**30
    acc = RNG.integers(-bound, bound, (257, channels))
    acc[:8] = RNG.integers(-300, 300, (8, channels))  # near zero: rounding ties, the zero point
    acc[8] = -stage.bias  # x = 0
    acc = acc.astype(acc_dtype)
    fused = _jit.FusedOutputStage(stage, _jit.kernels(), acc_dtype, channels, acc_bound=bound if folded else None)
    out = np.empty(acc.shape, dtype)
    assert fused.folded == (folded and not np.any(shift > 0))
    assert fused(acc, out) is out
    np.testing.assert_array_equal(out, stage.reference(acc))
    np.testing.assert_array_equal(out, stage(acc))
    # a fused ReLU (the clamp from the zero point up): the forms without the negative-tie
    # correction, and with one multiplier and shift for all channels
    relu = OutputStage(stage.multipliers, stage.shifts, stage.bias, stage.zero_point, stage.zero_point,
                       np.iinfo(dtype).max, dtype)
    fused = _jit.FusedOutputStage(relu, _jit.kernels(), acc_dtype, channels, acc_bound=bound if folded else None)
    # one channel (RNG draws 1 now and then) has one multiplier and shift whatever its kind
    want = _jit.SATURATING if not fused.folded else _jit.UNIFORM if channels == 1 or shifts == "one" \
        else _jit.CLAMPED
    if fused.folded:
        # the clamped forms fold the offsets 2**(r - 1) + zero point * 2**r, shifted left by
        # 31, into the per-channel constant: only where every sum stays within int64
        rights = [max(-int(s), 0) for s in np.broadcast_to(relu.shifts, (channels,))]
        offsets = [(1 << r >> 1) + (relu.zero_point << r) for r in rights]
        largest = (bound + int(np.abs(relu.bias).max())) * int(relu.multipliers.max()) + (1 << 30) \
            + (max(abs(o) for o in offsets) << 31)
        if largest >= 2**63:
            want = _jit.FOLDED
    assert fused.mode == want or (fused.folded and shifts == "zero" and fused.mode in (_jit.CLAMPED, _jit.UNIFORM))
    np.testing.assert_array_equal(fused(acc, np.empty(acc.shape, dtype)), relu.reference(acc))


@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
def test_output_stage_saturates_like_the_definition(dtype):
    """Accumulators + bias past int32 saturate before the multiply; positive shifts
    saturate after the left shift; results past the type or a fused clamp saturate."""
    channels = 6
    stage = _stage(channels, np.array([3, 0, -1, -31, 1, 30]), dtype)
    acc = np.array([[INT32_MAX] * channels, [INT32_MIN] * channels, [2**40] * channels, [-(2**40)] * channels,
                    [1 << 29] * channels, [-(1 << 29)] * channels, [0] * channels], np.int64)
    fused = _jit.FusedOutputStage(stage, _jit.kernels(), np.int64, channels)
    out = np.empty(acc.shape, dtype)
    np.testing.assert_array_equal(fused(acc, out), stage.reference(acc))
    info = np.iinfo(dtype)
    clamped = _stage(channels, np.full(channels, -9), dtype, low=info.min + 20, high=info.min + 40,
                     zero_point=info.min + 20)
    acc = RNG.integers(-(1 << 20), 1 << 20, (300, channels)).astype(np.float32)
    fused = _jit.FusedOutputStage(clamped, _jit.kernels(), np.float32, channels)
    np.testing.assert_array_equal(fused(acc, np.empty(acc.shape, dtype)), clamped.reference(acc))


def test_output_stage_of_real_multipliers_matches_numpy():
    """Multipliers from QuantizeMultiplier of real scale ratios (the production case),
    tiny ones flushed to zero included."""
    reals = np.concatenate([RNG.uniform(1e-5, 0.9, 30), [2.0**-33, 1.0, 1.5, 3.99]])
    multipliers, shifts = quantize_multipliers(reals)
    stage = OutputStage(multipliers, shifts, RNG.integers(-5000, 5000, reals.size), -3, -128, 127, np.int8)
    acc = RNG.integers(-(1 << 21), 1 << 21, (100, reals.size)).astype(np.float32)
    fused = _jit.FusedOutputStage(stage, _jit.kernels(), np.float32, reals.size)
    np.testing.assert_array_equal(fused(acc, np.empty(acc.shape, np.int8)), stage(acc))


def test_output_stage_writes_strided_outputs_through_numpy():
    stage = _stage(4, np.full(4, -8), np.uint8)
    fused = _jit.FusedOutputStage(stage, _jit.kernels(), np.float32, 4)
    acc = RNG.integers(-(1 << 16), 1 << 16, (5, 8)).astype(np.float32)[:, ::2]
    out = np.zeros((5, 8), np.uint8)[:, 1::2]
    fused(acc, out)
    np.testing.assert_array_equal(out, stage.reference(acc))


# --- depthwise convolution -------------------------------------------------------------------
def _depthwise_case(kind: str, rng, three: bool = False, rows: bool = False):
    """Random DEPTHWISE_CONV_2D inputs and output type of one kind; ``three``: a 3x3
    filter of depth multiplier 1 over inputs wide enough to have an interior (the
    compiled kernels' one-pass path), with up to 40 channels; ``rows``: multiplier 1 and
    stride 1 along rows (whole rows at once below ``_conv_fast._ROW_CHANNELS`` channels),
    with up to 79 channels."""
    batches = int(rng.choice([0, 1, 2]))
    channels, multiplier = int(rng.integers(1, 9)), int(rng.integers(1, 4))
    kh, kw = int(rng.integers(1, 6)), int(rng.integers(1, 6))
    stride_h, stride_w = int(rng.integers(1, 4)), int(rng.integers(1, 4))
    dilation_h, dilation_w = int(rng.integers(1, 3)), int(rng.integers(1, 3))
    height, width = int(rng.integers(1, 12)), int(rng.integers(1, 12))
    if three:
        batches, channels, multiplier, kh, kw = int(rng.integers(1, 3)), int(rng.integers(1, 41)), 1, 3, 3
        height, width = int(rng.integers(3, 20)), int(rng.integers(3, 20))
    if rows:
        multiplier, stride_w, channels = 1, 1, int(rng.integers(1, 80))
    pads = [int(p) for p in rng.integers(0, 5, 4)]  # left, right, top, bottom; wider than reach sometimes
    out_h = (height + pads[2] + pads[3] - (kh - 1) * dilation_h - 1) // stride_h + 1
    out_w = (width + pads[0] + pads[1] - (kw - 1) * dilation_w - 1) // stride_w + 1
    if out_h <= 0 or out_w <= 0:
        return None
    nchw = bool(rng.integers(0, 2))
    depth = channels * multiplier
    x_shape = (batches, channels, height, width) if nchw else (batches, height, width, channels)
    out_shape = [batches, depth, out_h, out_w] if nchw else [batches, out_h, out_w, depth]
    fuse = int(rng.choice([FuseCode.FUSED_NONE, FuseCode.FUSED_RELU, FuseCode.FUSED_RELU1, FuseCode.FUSED_RELU6]))
    args = [_scalar(T.INT32, v) for v in (*pads, stride_w, stride_h, multiplier, fuse)]
    args += [_scalar(T.BOOL, nchw), _scalar(T.INT32, dilation_w), _scalar(T.INT32, dilation_h)]
    taps = kh * kw
    if kind == "float32":
        x = _tensor(T.TENSOR_FLOAT32, rng.standard_normal(x_shape).astype(np.float32))
        w = _tensor(T.TENSOR_FLOAT32, rng.standard_normal((1, kh, kw, depth)).astype(np.float32))
        b = _tensor(T.TENSOR_FLOAT32, rng.standard_normal(depth).astype(np.float32))
        return [x, w, b, *args], OperandType(T.TENSOR_FLOAT32, out_shape)
    if kind == "quant8":
        x_zp, w_zp = int(rng.integers(0, 256)), int(rng.integers(0, 256))
        x = _tensor(T.TENSOR_QUANT8_ASYMM, rng.integers(0, 256, x_shape).astype(np.uint8), 0.02, x_zp)
        w = _tensor(T.TENSOR_QUANT8_ASYMM, rng.integers(0, 256, (1, kh, kw, depth)).astype(np.uint8), 0.01, w_zp)
        b = _tensor(T.TENSOR_INT32, rng.integers(-20000, 20000, depth).astype(np.int32),
                    float(np.float32(0.02) * np.float32(0.01)))
        # small output scales saturate often; large ones exercise positive shifts rarely
        out_scale = float(0.0002 * np.sqrt(taps) * rng.choice([0.5, 20, 60, 2000]))
        return [x, w, b, *args], OperandType(T.TENSOR_QUANT8_ASYMM, out_shape, out_scale, int(rng.integers(0, 256)))
    scales = tuple(float(s) for s in rng.uniform(0.0005, 0.05, depth))
    x = _tensor(T.TENSOR_QUANT8_ASYMM_SIGNED, rng.integers(-128, 128, x_shape).astype(np.int8), 0.03,
                int(rng.integers(-128, 128)))
    w = _tensor(T.TENSOR_QUANT8_SYMM_PER_CHANNEL, rng.integers(-127, 128, (1, kh, kw, depth)).astype(np.int8),
                0.0, 0, SymmPerChannelQuantParams(3, scales))
    b = _tensor(T.TENSOR_INT32, rng.integers(-40000, 40000, depth).astype(np.int32), 0.0)
    out_scale = float(0.03 * 0.01 * np.sqrt(taps) * rng.choice([0.001, 1, 40, 200]))
    return [x, w, b, *args], OperandType(T.TENSOR_QUANT8_ASYMM_SIGNED, out_shape, out_scale,
                                         int(rng.integers(-128, 128)))


def _plan(code, inputs, output):
    return get_operation(code).plan(ExecutionContext(code, inputs, [output]))


def _numpy_plan(code, inputs, output, monkeypatch):
    """The plan prepared with numba disabled (``NNAPI_NO_NUMBA``): the numpy reference
    the compiled plans are compared with."""
    with monkeypatch.context() as patch:
        patch.setenv(_jit.DISABLE_VARIABLE, "1")
        return _plan(code, inputs, output)


def _assert_depthwise_matches_numpy(kind, compiled, inputs, output, monkeypatch) -> None:
    """The compiled DEPTHWISE_CONV_2D plan against the numpy one built with numba disabled:
    the same dtype and shape, the same bits (quantized) or float32 rounding (float)."""
    reference = _numpy_plan(Op.DEPTHWISE_CONV_2D, inputs, output, monkeypatch)
    assert reference.compiled is None
    values = [tensor.value for tensor in inputs]
    fast, slow = compiled(values)[0], reference(values)[0]
    assert fast.dtype == slow.dtype and fast.shape == slow.shape == tuple(output.dimensions)
    if kind == "float32":
        np.testing.assert_allclose(fast, slow, rtol=1e-5, atol=1e-5 * max(1.0, float(np.abs(slow).max(initial=0))))
    else:
        np.testing.assert_array_equal(fast, slow)


@pytest.mark.parametrize("kind", ["quant8", "quant8_signed_per_channel", "float32"])
@pytest.mark.parametrize("seed", range(12))
def test_depthwise_matches_numpy(kind, seed, monkeypatch):
    rng = np.random.default_rng(1000 + seed)
    case = None
    while case is None:
        case = _depthwise_case(kind, rng)
    inputs, output = case
    compiled = _plan(Op.DEPTHWISE_CONV_2D, inputs, output)
    assert isinstance(compiled, PreparedDepthwise) and compiled.compiled is not None
    _assert_depthwise_matches_numpy(kind, compiled, inputs, output, monkeypatch)


@pytest.mark.parametrize("kind", ["quant8", "quant8_signed_per_channel", "float32"])
@pytest.mark.parametrize("seed", range(12))
def test_depthwise_3x3_interior_matches_numpy(kind, seed, monkeypatch):
    """3x3 filters: the interior pixels' nine-tap pass (raw values times the filter less
    the zero point's share) and the border's tap-by-tap path, every stride, dilation and
    padding, against the numpy path (every channel count: multiplier 1 at stride 1 along
    rows would otherwise run whole rows below ``_ROW_CHANNELS``)."""
    monkeypatch.setattr(_conv_fast, "_ROW_CHANNELS", 1)
    rng = np.random.default_rng(2000 + seed)
    case = None
    while case is None:
        case = _depthwise_case(kind, rng, three=True)
    inputs, output = case
    compiled = _plan(Op.DEPTHWISE_CONV_2D, inputs, output)
    assert compiled.compiled is not None
    _assert_depthwise_matches_numpy(kind, compiled, inputs, output, monkeypatch)


@pytest.mark.parametrize("kind", ["quant8", "quant8_signed_per_channel", "float32"])
@pytest.mark.parametrize("seed", range(12))
def test_depthwise_rows_match_numpy(kind, seed, monkeypatch):
    """Multiplier 1 at stride 1 along rows: below ``_ROW_CHANNELS`` (64) channels whole
    rows are one run per tap (the filter and output stage tiled along a row), every filter size, dilation,
    vertical stride and padding, against the numpy path."""
    rng = np.random.default_rng(4000 + seed)
    case = None
    while case is None:
        case = _depthwise_case(kind, rng, rows=True)
    inputs, output = case
    compiled = _plan(Op.DEPTHWISE_CONV_2D, inputs, output)
    assert compiled.compiled is not None
    assert compiled.compiled.__name__.endswith("_rows") == (inputs[1].value.shape[3] < _conv_fast._ROW_CHANNELS)
    _assert_depthwise_matches_numpy(kind, compiled, inputs, output, monkeypatch)


def test_depthwise_mobilenet_layer_matches_numpy():
    """A MobileNet-sized layer (112x112x32, 3x3, SAME, ReLU6) at full input range."""
    inputs = [
        _tensor(T.TENSOR_QUANT8_ASYMM, RNG.integers(0, 256, (1, 112, 112, 32)).astype(np.uint8), 0.0235, 0),
        _tensor(T.TENSOR_QUANT8_ASYMM, RNG.integers(0, 256, (1, 3, 3, 32)).astype(np.uint8), 0.34, 165),
        _tensor(T.TENSOR_INT32, RNG.integers(-30000, 30000, 32).astype(np.int32),
                float(np.float32(0.0235) * np.float32(0.34))),
        *[_scalar(T.INT32, v) for v in (1, 1, 1, 1, 1, 1, 1, FuseCode.FUSED_RELU6)],
    ]
    output = OperandType(T.TENSOR_QUANT8_ASYMM, [1, 112, 112, 32], 0.0235, 0)
    compiled = _plan(Op.DEPTHWISE_CONV_2D, inputs, output)
    values = [tensor.value for tensor in inputs]
    want = get_operation(Op.DEPTHWISE_CONV_2D).execute(ExecutionContext(Op.DEPTHWISE_CONV_2D, inputs, [output]))
    np.testing.assert_array_equal(compiled(values)[0], want[0])


def test_disabled_by_the_environment(monkeypatch):
    assert _jit.kernels() is not None
    monkeypatch.setenv(_jit.DISABLE_VARIABLE, "1")
    assert _jit.kernels() is None
    monkeypatch.setenv(_jit.DISABLE_VARIABLE, "0")
    assert _jit.kernels() is not None


def test_depthwise_keeps_float16_and_overflowing_sums_on_numpy():
    """float16 is computed by the numpy path; so are quantized sums that int32 could not hold."""
    f16 = [_tensor(T.TENSOR_FLOAT16, RNG.standard_normal((1, 5, 5, 2)).astype(np.float16)),
           _tensor(T.TENSOR_FLOAT16, RNG.standard_normal((1, 3, 3, 2)).astype(np.float16)),
           _tensor(T.TENSOR_FLOAT16, RNG.standard_normal(2).astype(np.float16)),
           *[_scalar(T.INT32, v) for v in (0, 0, 0, 0, 1, 1, 1, 0)]]
    assert _plan(Op.DEPTHWISE_CONV_2D, f16, OperandType(T.TENSOR_FLOAT16, [1, 3, 3, 2])).compiled is None
    big = [_tensor(T.TENSOR_QUANT8_ASYMM, np.full((1, 190, 190, 1), 255, np.uint8), 1.0, 0),
           _tensor(T.TENSOR_QUANT8_ASYMM, np.full((1, 190, 190, 1), 255, np.uint8), 1.0, 0),
           _tensor(T.TENSOR_INT32, np.zeros(1, np.int32), 1.0),
           *[_scalar(T.INT32, v) for v in (0, 0, 0, 0, 1, 1, 1, 0)]]
    output = OperandType(T.TENSOR_QUANT8_ASYMM, [1, 1, 1, 1], 2.0**30, 0)
    kernel = _plan(Op.DEPTHWISE_CONV_2D, big, output)
    assert kernel.compiled is None
    assert kernel([t.value for t in big])[0][0, 0, 0, 0] == round(190 * 190 * 255 * 255 / 2**30)


def _conv_filter(rng, per_channel: bool, code, dtype, w_shape: tuple[int, ...], b: np.ndarray, extreme: bool,
                 zero_point) -> tuple[Tensor, Tensor]:
    """A random CONV_2D filter and bias, input scale 0.05: per-channel int8 (symmetric) or
    per-tensor of ``code`` at ``zero_point()`` (drawn after the values), with values at the
    ends of the range where ``extreme``."""
    units = w_shape[0]
    info = np.iinfo(dtype)
    if per_channel:
        scales = rng.uniform(0.002, 0.02, units).astype(np.float32)
        w_values = rng.choice(np.array([-127, 127], np.int8), w_shape) if extreme else \
            rng.integers(-127, 128, w_shape).astype(np.int8)
        return (_tensor(T.TENSOR_QUANT8_SYMM_PER_CHANNEL, w_values, 0.0, 0, SymmPerChannelQuantParams(0, scales)),
                _tensor(T.TENSOR_INT32, b, 0.0))
    w_values = rng.choice(np.array([info.min, info.max], dtype), w_shape) if extreme else \
        rng.integers(info.min, info.max + 1, w_shape).astype(dtype)
    return (_tensor(code, w_values, 0.01, zero_point()),
            _tensor(T.TENSOR_INT32, b, float(np.float32(0.05) * np.float32(0.01))))


# --- stride-1 convolutions of few output channels from per-tap products ----------------------
@pytest.mark.parametrize("kind", [T.TENSOR_QUANT8_ASYMM, T.TENSOR_QUANT8_ASYMM_SIGNED])
@pytest.mark.parametrize("kernel, dilation, pads, batches, nchw, extreme", [
    ((3, 3), 1, (1, 1, 1, 1), 1, False, False),   # a DenseNet 3x3 (SAME)
    ((3, 3), 1, (0, 0, 0, 0), 2, False, False),   # VALID, two images
    ((1, 3), 1, (1, 1, 0, 0), 1, True, False),    # a row filter, NCHW
    ((3, 2), 2, (2, 1, 2, 0), 1, False, False),   # dilated, uneven padding
    ((3, 3), 1, (1, 1, 1, 1), 1, False, True),    # full-range values: float32 parts in numpy
])
def test_conv_tap_products_match_numpy(kind, kernel, dilation, pads, batches, nchw, extreme, monkeypatch):
    """CONV_2D of few output channels over many input channels at stride 1 runs one
    product of the padded input with every tap's filter and sums the taps' products in
    the compiled output pass: the numpy im2col plan's values bit for bit, per-tensor and
    per-channel filters, every fused clamp, and sums too large for one float32 product
    (the numpy plan splits them into parts) whose per-tap products are exact. (Where the
    processor has AVX-512 the integer products take these; switched off here.)"""
    _without_integer_products(monkeypatch)
    rng = np.random.default_rng(int(kind) * 100 + kernel[0] * 10 + kernel[1] + dilation)
    dtype = np.uint8 if kind == T.TENSOR_QUANT8_ASYMM else np.int8
    info = np.iinfo(dtype)
    size, depth, units = 30, 64 + int(rng.integers(0, 64)), int(rng.integers(1, 49))
    shape = (batches, depth, size, size) if nchw else (batches, size, size, depth)
    x_zero = int(info.min) if extreme else int(info.min) + 120
    x_values = rng.choice(np.array([info.min, info.max], dtype), shape) if extreme else \
        rng.integers(info.min, info.max + 1, shape).astype(dtype)
    x = _tensor(kind, x_values, 0.05, x_zero)
    w_shape = (units, *kernel, depth)
    b = rng.integers(-(1 << 14), 1 << 14, units).astype(np.int32)
    w, bias = _conv_filter(rng, kind == T.TENSOR_QUANT8_ASYMM_SIGNED, kind, dtype, w_shape, b, extreme,
                           lambda: int(info.min) + 128)
    left, right, top, bottom = pads
    out_h = size + top + bottom - (kernel[0] - 1) * dilation
    out_w = size + left + right - (kernel[1] - 1) * dilation
    dims = [batches, units, out_h, out_w] if nchw else [batches, out_h, out_w, units]
    for fuse in (FuseCode.FUSED_NONE, FuseCode.FUSED_RELU6):
        args = [_scalar(T.INT32, v) for v in (left, right, top, bottom, 1, 1, fuse)]
        args += [_scalar(T.BOOL, nchw), _scalar(T.INT32, dilation), _scalar(T.INT32, dilation)]
        inputs = [x, w, bias, *args]
        output = OperandType(kind, dims, 0.5 * np.sqrt(depth * kernel[0] * kernel[1]), int(info.min) + 100)
        compiled = _plan(Op.CONV_2D, inputs, output)
        reference = _numpy_plan(Op.CONV_2D, inputs, output, monkeypatch)
        assert compiled.taps is not None and reference.taps is None
        assert (compiled.parts is not None) == extreme
        values = [tensor.value for tensor in inputs]
        fast, slow = compiled(values)[0], reference(values)[0]
        assert fast.dtype == dtype and fast.shape == tuple(dims)
        np.testing.assert_array_equal(fast, slow)
        np.testing.assert_array_equal(fast, get_operation(Op.CONV_2D).execute(
            ExecutionContext(Op.CONV_2D, inputs, [output]))[0])


def _without_integer_products(monkeypatch) -> None:
    """Plans prepared after this take the float32 BLAS paths they take on processors
    without AVX-512 (``_jit.integer_products`` offers none)."""
    monkeypatch.setattr(_jit, "integer_products", lambda: None)


needs_integer_products = pytest.mark.skipif(_jit.integer_products() is None,
                                            reason="the integer products need AVX2 or AVX-512 BW")
#: every form of the integer products this processor runs (AVX-512 and AVX2 on an AVX-512 one)
integer_forms = pytest.mark.parametrize("form", _jit.integer_forms(), ids=lambda form: form.name)


def _with_integer_form(monkeypatch, form) -> None:
    """Plans prepared after this take the integer products in ``form`` (as on a processor
    whose widest form it is), still none with numba disabled (the numpy plan)."""
    monkeypatch.setattr(_jit, "integer_products", lambda: form if _jit.kernels() is not None else None)


# --- convolutions as integer products (AVX-512) ------------------------------------------------
@needs_integer_products
@integer_forms
@pytest.mark.parametrize("kind", ["quant8", "quant8_signed_per_channel", "quant8_signed"])
@pytest.mark.parametrize("kernel, stride, dilation, pads, batches, depth, units, nchw", [
    ((1, 1), 1, 1, (0, 0, 0, 0), 1, 64, 128, False),    # a MobileNet pointwise layer
    ((1, 1), 1, 1, (0, 0, 0, 0), 2, 37, 70, False),     # odd depth, a partial panel, two images
    ((3, 3), 2, 1, (0, 1, 0, 1), 1, 3, 32, False),      # a first layer: RGB, stride 2, SAME
    ((3, 3), 1, 1, (1, 1, 1, 1), 1, 128, 32, False),    # a DenseNet 3x3
    ((3, 2), 1, 2, (2, 1, 2, 0), 1, 24, 40, True),      # dilated, uneven padding, NCHW
    ((5, 5), 3, 1, (7, 7, 7, 7), 1, 5, 9, False),       # padding wider than the kernel's reach
    ((1, 1), 2, 1, (0, 0, 0, 0), 3, 16, 33, False),     # a strided 1x1
])
def test_integer_conv_matches_numpy(form, kind, kernel, stride, dilation, pads, batches, depth, units, nchw,
                                    monkeypatch):
    """CONV_2D on the 16-bit multiply-add (``_numba_igemm``), each form this processor
    runs (AVX-512, AVX2): the numpy plan's bits for every geometry (tiles of fewer than
    six pixels, odd summed lengths, partial panels, padding, strides, dilation, NCHW),
    uint8 and int8, per-tensor and per-channel filters, every fused clamp, and at full
    input and filter range (the largest sums)."""
    _with_integer_form(monkeypatch, form)
    rng = np.random.default_rng(len(kind) * 10000 + sum(kernel) * 1000 + stride * 100 + depth + units)
    dtype = np.uint8 if kind == "quant8" else np.int8
    info = np.iinfo(dtype)
    code = T.TENSOR_QUANT8_ASYMM if kind == "quant8" else T.TENSOR_QUANT8_ASYMM_SIGNED
    size = 13
    shape = (batches, depth, size, size) if nchw else (batches, size, size, depth)
    w_shape = (units, *kernel, depth)
    for extreme in (False, True):
        # zero points near the middle (sums centred on zero), or at the end (the widest values)
        x_zero = int(info.min) if extreme else int(info.min) + 128 + int(rng.integers(-8, 9))
        x_values = rng.choice(np.array([info.min, info.max], dtype), shape) if extreme else \
            rng.integers(info.min, info.max + 1, shape).astype(dtype)
        x = _tensor(code, x_values, 0.05, x_zero)
        b = rng.integers(-(1 << 14), 1 << 14, units).astype(np.int32)
        # uint8 filters: zero points as the input's; int8 ones symmetric
        w_zero = (lambda: 0) if kind != "quant8" else (lambda: int(info.min)) if extreme else \
            (lambda: int(info.min) + 128 + int(rng.integers(-8, 9)))
        w, bias = _conv_filter(rng, kind == "quant8_signed_per_channel", code, dtype, w_shape, b, extreme, w_zero)
        left, right, top, bottom = pads
        out_h = (size + top + bottom - (kernel[0] - 1) * dilation - 1) // stride + 1
        out_w = (size + left + right - (kernel[1] - 1) * dilation - 1) // stride + 1
        dims = [batches, units, out_h, out_w] if nchw else [batches, out_h, out_w, units]
        taps = depth * kernel[0] * kernel[1]
        # outputs spread over the type's range: sums ~ N(0, taps * 74**4), or up to taps * 255**2
        scale = 0.05 * 0.01 * (taps * 255 * 255 / 100 if extreme else np.sqrt(taps) * 74 * 74 / 30)
        for fuse in (FuseCode.FUSED_NONE, FuseCode.FUSED_RELU, FuseCode.FUSED_RELU6):
            args = [_scalar(T.INT32, v) for v in (left, right, top, bottom, stride, stride, fuse)]
            args += [_scalar(T.BOOL, nchw), _scalar(T.INT32, dilation), _scalar(T.INT32, dilation)]
            inputs = [x, w, bias, *args]
            output = OperandType(code, dims, scale, int(info.min) + 100)
            compiled = _plan(Op.CONV_2D, inputs, output)
            reference = _numpy_plan(Op.CONV_2D, inputs, output, monkeypatch)
            assert compiled.integer.run is form.conv_quantized and reference.integer is None
            values = [tensor.value for tensor in inputs]
            fast, slow = compiled(values)[0], reference(values)[0]
            assert fast.dtype == dtype and fast.shape == tuple(dims)
            np.testing.assert_array_equal(fast, slow)
            if fuse == FuseCode.FUSED_NONE:
                assert len(np.unique(fast)) > 3  # outputs spread over the range, not saturated
                np.testing.assert_array_equal(fast, get_operation(Op.CONV_2D).execute(
                    ExecutionContext(Op.CONV_2D, inputs, [output]))[0])
    # int8 inputs and outputs go through uint8 views: one machine code for both types
    assert all(str(signature[0].dtype) == "uint8" and str(signature[6].dtype) == "uint8"
               for signature in form.conv_quantized.signatures)


@needs_integer_products
@integer_forms
@pytest.mark.parametrize("kind", ["quant8", "quant8_signed"])
@pytest.mark.parametrize("rows, depth, units", [(5, 1001, 37), (64, 256, 256), (13, 7, 3)])
def test_integer_fully_connected_matches_numpy(form, kind, rows, depth, units, monkeypatch):
    """FULLY_CONNECTED of more rows than the few-row product takes runs the integer
    products (its rows as a batch of 1x1 images), each form this processor runs: the
    numpy plan's bits, every clamp."""
    _with_integer_form(monkeypatch, form)
    rng = np.random.default_rng(rows * 1000 + depth + len(kind))
    dtype = np.uint8 if kind == "quant8" else np.int8
    info = np.iinfo(dtype)
    code = T.TENSOR_QUANT8_ASYMM if kind == "quant8" else T.TENSOR_QUANT8_ASYMM_SIGNED
    x = _tensor(code, rng.integers(info.min, info.max + 1, (rows, depth)).astype(dtype), 0.5, int(info.min) + 120)
    w_zero = int(info.min) + 131 if kind == "quant8" else 0
    w = _tensor(code, rng.integers(info.min, info.max + 1, (units, depth)).astype(dtype), 0.25, w_zero)
    b = _tensor(T.TENSOR_INT32, rng.integers(-(1 << 16), 1 << 16, units).astype(np.int32), 0.125)
    output = OperandType(code, [rows, units], 0.125 * 74 * 74 * np.sqrt(depth) / 30, int(info.min) + 100)
    for fuse in (FuseCode.FUSED_NONE, FuseCode.FUSED_RELU, FuseCode.FUSED_RELU1):
        inputs = [x, w, b, _scalar(T.INT32, int(fuse))]
        compiled = _plan(Op.FULLY_CONNECTED, inputs, output)
        reference = _numpy_plan(Op.FULLY_CONNECTED, inputs, output, monkeypatch)
        assert compiled.integer.run is form.conv_quantized and reference.integer is None
        values = [tensor.value for tensor in inputs]
        fast = compiled(values)[0]
        np.testing.assert_array_equal(fast, reference(values)[0])
        np.testing.assert_array_equal(fast, get_operation(Op.FULLY_CONNECTED).execute(
            ExecutionContext(Op.FULLY_CONNECTED, inputs, [output]))[0])
        if fuse == FuseCode.FUSED_NONE:
            assert len(np.unique(fast)) > 5


@needs_integer_products
def test_integer_conv_past_int32_takes_blas():
    """A convolution whose int32 sums could overflow (uint8 at full range over 33,100
    terms) keeps the float products (split into exact parts or float64)."""
    depth = 33100
    x = _tensor(T.TENSOR_QUANT8_ASYMM, np.zeros((1, 2, 2, depth), np.uint8), 0.5, 255)
    w = _tensor(T.TENSOR_QUANT8_ASYMM, np.zeros((2, 1, 1, depth), np.uint8), 0.25, 255)
    b = _tensor(T.TENSOR_INT32, np.zeros(2, np.int32), 0.125)
    args = [_scalar(T.INT32, v) for v in (0, 0, 0, 0, 1, 1, 0)]
    kernel = _plan(Op.CONV_2D, [x, w, b, *args], OperandType(T.TENSOR_QUANT8_ASYMM, [1, 2, 2, 2], 1000.0, 0))
    kernel._lay_out()
    assert kernel.integer is None and kernel.weights is not None


def test_integer_products_take_the_widest_form():
    """AVX-512 where the processor has it (F and BW), else AVX2: the form preparation takes."""
    import llvmlite.binding as llvm
    import numba

    if _jit.kernels() is None or numba.config.CPU_NAME not in (None, "host") or numba.config.CPU_FEATURES:
        assert _jit.integer_forms() == ()
        return
    from nnapi.operations import _numba_igemm

    features = llvm.get_host_cpu_features()
    wide = bool(features.get("avx512bw") and features.get("avx512f"))
    expected = [form for form, has in ((_numba_igemm.AVX512, wide), (_numba_igemm.AVX2, bool(features.get("avx2"))))
                if has]
    assert list(_jit.integer_forms()) == expected
    assert _jit.integer_products() is (expected[0] if expected else None)
    assert (_numba_igemm.AVX512.panel, _numba_igemm.AVX2.panel) == (32, 16)  # two registers of int32 sums


def test_integer_products_follow_the_switch(monkeypatch):
    """NNAPI_NO_NUMBA keeps convolutions off the integer products too."""
    monkeypatch.setenv(_jit.DISABLE_VARIABLE, "1")
    assert _jit.integer_products() is None


# --- BATCH_MATMUL's output stage -----------------------------------------------------------------
@pytest.mark.parametrize("adjoints", [(False, False), (True, False), (False, True)])
@pytest.mark.parametrize("inner", [7, 64, 1000])
def test_batch_matmul_output_stage_matches_numpy(adjoints, inner, monkeypatch):
    """Quantized BATCH_MATMUL prepared with the compiled output stage: the numpy plan's and
    execute's values bit for bit, every stored value, float32 and float64 sums."""
    rng = np.random.default_rng(inner * 10 + sum(adjoints))
    a_shape = (2, 3, inner, 5) if adjoints[0] else (2, 3, 5, inner)
    b_shape = (2, 3, 6, inner) if adjoints[1] else (2, 3, inner, 6)
    a_values = rng.integers(-128, 128, a_shape).astype(np.int8)
    count = min(256, a_values.size)  # every stored value where the tensor holds 256
    a_values.reshape(-1)[:count] = np.arange(-128, 128)[:count]
    a = _tensor(T.TENSOR_QUANT8_ASYMM_SIGNED, a_values, 0.05, -3)
    b = _tensor(T.TENSOR_QUANT8_ASYMM_SIGNED, rng.integers(-128, 128, b_shape).astype(np.int8), 0.1, 4)
    inputs = [a, b, _scalar(T.BOOL, adjoints[0]), _scalar(T.BOOL, adjoints[1])]
    output = OperandType(T.TENSOR_QUANT8_ASYMM_SIGNED, [2, 3, 5, 6], 0.35 * np.sqrt(inner), 1)
    compiled = _plan(Op.BATCH_MATMUL, inputs, output)
    reference = _numpy_plan(Op.BATCH_MATMUL, inputs, output, monkeypatch)
    assert compiled.compiled and not reference.compiled
    values = [tensor.value for tensor in inputs]
    want = get_operation(Op.BATCH_MATMUL).execute(ExecutionContext(Op.BATCH_MATMUL, inputs, [output]))[0]
    for got in (compiled(values)[0], reference(values)[0]):
        assert got.dtype == np.int8 and got.shape == (2, 3, 5, 6)
        np.testing.assert_array_equal(got, want)


# --- quantized products split into exact float32 parts ---------------------------------------
def _big_product_case(code: Op, rng, depth: int, extreme: bool):
    """A quantized CONV_2D (3x3) or FULLY_CONNECTED whose float32 sums would not be exact."""
    x_zp, w_zp = (0, 0) if extreme else (int(rng.integers(0, 256)), 128)
    units = 23
    if code == Op.FULLY_CONNECTED:
        x_shape, w_shape = (3, depth), (units, depth)
    else:
        x_shape, w_shape = (1, 6, 5, depth // 9), (units, 3, 3, depth // 9)
    x_values = np.full(x_shape, 255, np.uint8) if extreme else rng.integers(0, 256, x_shape).astype(np.uint8)
    w_values = rng.choice(np.array([0, 255], np.uint8), w_shape) if extreme else \
        rng.integers(0, 256, w_shape).astype(np.uint8)
    x = _tensor(T.TENSOR_QUANT8_ASYMM, x_values, 0.5, x_zp)
    w = _tensor(T.TENSOR_QUANT8_ASYMM, w_values, 0.25, w_zp)
    b = _tensor(T.TENSOR_INT32, rng.integers(-(1 << 16), 1 << 16, units).astype(np.int32), 0.125)
    # outputs spread over the type's range: (x - zp) * (w - zp) sums ~ N(0, depth * 74**2 * 74**2),
    # or at full range ~ depth * 255 * 127 (mapped to about 228)
    out_scale = 0.125 * depth * 255 * 127 / 100 if extreme else 0.125 * 74 * 74 * np.sqrt(depth) / 40
    if code == Op.FULLY_CONNECTED:
        return [x, w, b, _scalar(T.INT32, 0)], OperandType(T.TENSOR_QUANT8_ASYMM, [3, units], out_scale, 128)
    args = [_scalar(T.INT32, v) for v in (1, 1, 1, 1, 1, 1, 0)]
    return [x, w, b, *args], OperandType(T.TENSOR_QUANT8_ASYMM, [1, 6, 5, units], out_scale, 128)


@pytest.mark.parametrize("code", [Op.FULLY_CONNECTED, Op.CONV_2D])
@pytest.mark.parametrize("depth, extreme", [(2304, False), (4608, False), (1152, True), (5184, True)])
def test_split_products_match_numpy(code, depth, extreme, monkeypatch):
    """Products whose float32 sums would round run as float32 parts each exact (summed in
    int64), or in float64 past _MAX_PARTS parts; either way equal to the numpy path's
    float64 product, at full input and filter range too. (Convolutions take the integer
    products where the processor has AVX-512: switched off here.)"""
    _without_integer_products(monkeypatch)
    rng = np.random.default_rng(depth + extreme)
    inputs, output = _big_product_case(code, rng, depth, extreme)
    compiled = _plan(code, inputs, output)
    reference = _numpy_plan(code, inputs, output, monkeypatch)
    values = [tensor.value for tensor in inputs]
    if code == Op.FULLY_CONNECTED:
        # three rows run the compiled gemv, which defers the BLAS product (and its parts)
        # to the first call with more rows: six rows lay it out
        assert compiled.gemv is not None and compiled._pending is not None
        more = [np.concatenate([values[0], values[0][::-1]]), *values[1:]]
        np.testing.assert_array_equal(compiled(more)[0], reference(more)[0])
        assert compiled._pending is None
    assert reference.work == np.float64 and reference.parts is None
    if compiled.parts is not None:
        assert compiled.work == np.float32 and len(compiled.parts) >= 2
        columns = np.abs(compiled.weights.astype(np.int64))  # (summed, outputs)
        bound = 255 - inputs[0].zero_point if extreme else max(inputs[0].zero_point, 255 - inputs[0].zero_point)
        for start, stop in compiled.parts:
            assert bound * columns[start:stop].sum(axis=0).max() < 2**24
    else:
        assert compiled.work == np.float64
    np.testing.assert_array_equal(compiled(values)[0], reference(values)[0])


@pytest.mark.parametrize("code", [Op.FULLY_CONNECTED, Op.CONV_2D])
@pytest.mark.parametrize("kind", ["quant8", "quant8_at_128", "quant8_signed_per_channel"])
@pytest.mark.parametrize("rows", [1, 2, 4, 5])
def test_few_row_products_match_numpy(code, kind, rows, monkeypatch):
    """Quantized products of at most four rows (a classifier's FULLY_CONNECTED, a 1x1
    convolution of a 1x1 image) run the compiled int32 ``gemv_quantized`` with the filter
    as 8-bit (int8 filters, and uint8 ones whose values less their zero point fit int8:
    made modulo 256) or 16-bit integers (other uint8 ones less their zero point): the
    numpy plan's bits at full input and filter range, fused ReLU or none; five rows take
    the BLAS product."""
    rng = np.random.default_rng(rows * 10 + len(kind))
    depth, units = 1001, 37
    if kind.startswith("quant8") and "signed" not in kind:
        x = _tensor(T.TENSOR_QUANT8_ASYMM, rng.integers(0, 256, (rows, depth)).astype(np.uint8), 0.5, 3)
        weights = rng.integers(0, 256, (units, depth)).astype(np.uint8)
        weights[:2] = [[0], [255]]  # the widest (w - zero point) of each sign
        w = _tensor(T.TENSOR_QUANT8_ASYMM, weights, 0.25, 131 if kind == "quant8" else 128)
        b = _tensor(T.TENSOR_INT32, rng.integers(-(1 << 20), 1 << 20, units).astype(np.int32), 0.125)
        output = (T.TENSOR_QUANT8_ASYMM, 0.125 * 255 * 127 * np.sqrt(depth) / 30, 100)
    else:
        x = _tensor(T.TENSOR_QUANT8_ASYMM_SIGNED, rng.integers(-128, 128, (rows, depth)).astype(np.int8), 0.5, -128)
        weights = rng.integers(-127, 128, (units, depth)).astype(np.int8)
        if code == Op.CONV_2D:
            scales = tuple(float(v) for v in rng.uniform(0.001, 0.01, units))
            w = _tensor(T.TENSOR_QUANT8_SYMM_PER_CHANNEL, weights, 0.0, 0, SymmPerChannelQuantParams(0, scales))
            b = _tensor(T.TENSOR_INT32, rng.integers(-(1 << 20), 1 << 20, units).astype(np.int32), 0.0)
        else:  # FULLY_CONNECTED takes per-tensor filters only
            w = _tensor(T.TENSOR_QUANT8_ASYMM_SIGNED, weights, 0.005, 0)
            b = _tensor(T.TENSOR_INT32, rng.integers(-(1 << 20), 1 << 20, units).astype(np.int32), 0.0025)
        output = (T.TENSOR_QUANT8_ASYMM_SIGNED, 0.5 * 0.005 * 255 * 127 * np.sqrt(depth) / 40, -5)
    for fuse in (FuseCode.FUSED_NONE, FuseCode.FUSED_RELU):
        if code == Op.FULLY_CONNECTED:
            inputs = [x, w, b, _scalar(T.INT32, int(fuse))]
            out = OperandType(output[0], [rows, units], output[1], output[2])
        else:
            image = lambda t, shape: Tensor(t.type, shape, t.scale, t.zero_point, t.channel_quant,  # noqa: E731
                                            t.value.reshape(shape))
            inputs = [image(x, (rows, 1, 1, depth)), image(w, (units, 1, 1, depth)), b,
                      *[_scalar(T.INT32, v) for v in (0, 0, 0, 0, 1, 1, int(fuse))]]
            out = OperandType(output[0], [rows, 1, 1, units], output[1], output[2])
        compiled = _plan(code, inputs, out)
        assert (compiled.gemv is not None) == (rows <= 4)
        if compiled.gemv is not None:
            assert compiled.gemv.weights.dtype == (np.int16 if kind == "quant8" else np.int8)
            shifted = w.value.reshape(units, depth).astype(np.int64) - w.zero_point
            np.testing.assert_array_equal(compiled.gemv.weights, shifted)
        reference = _numpy_plan(code, inputs, out, monkeypatch)
        assert reference.gemv is None
        values = [tensor.value for tensor in inputs]
        got = compiled(values)[0]
        want = get_operation(code).execute(ExecutionContext(code, inputs, [out]))[0]
        np.testing.assert_array_equal(got, reference(values)[0])
        np.testing.assert_array_equal(got, want)
        assert len(np.unique(got)) > 5  # outputs spread over the range, not saturated
        if compiled.gemv is not None:
            # the BLAS product's float filter is laid out only when a call has more rows
            # than the compiled product takes (never at the plan's static shape)
            assert compiled._pending is not None
            more = [np.concatenate([values[0]] * 5), *values[1:]]
            np.testing.assert_array_equal(compiled(more)[0], reference(more)[0])
            assert compiled._pending is None
            np.testing.assert_array_equal(compiled(values)[0], got)


def test_split_products_of_few_rows_run_transposed_and_match_numpy(monkeypatch):
    """Exact float32 parts of a product of few rows by a large filter (6 rows, 2304 x 64)
    run transposed (``_exact_matmul``, each part a slice of the filter's rows): the
    numpy plan's bits and execute's. (FULLY_CONNECTED takes the integer products where the
    processor has AVX-512: switched off here.)"""
    _without_integer_products(monkeypatch)
    rng = np.random.default_rng(5)
    depth, units, rows = 2304, 64, 6
    x = _tensor(T.TENSOR_QUANT8_ASYMM, rng.integers(0, 256, (rows, depth)).astype(np.uint8), 0.5, 0)
    w = _tensor(T.TENSOR_QUANT8_ASYMM, rng.integers(0, 256, (units, depth)).astype(np.uint8), 0.25, 128)
    b = _tensor(T.TENSOR_INT32, rng.integers(-(1 << 16), 1 << 16, units).astype(np.int32), 0.125)
    inputs = [x, w, b, _scalar(T.INT32, 0)]
    output = OperandType(T.TENSOR_QUANT8_ASYMM, [rows, units], 0.125 * 74 * 74 * np.sqrt(depth) / 40, 128)
    compiled = _plan(Op.FULLY_CONNECTED, inputs, output)
    reference = _numpy_plan(Op.FULLY_CONNECTED, inputs, output, monkeypatch)
    assert compiled.parts is not None and len(compiled.parts) >= 2
    assert compiled.weights.size >= _conv_fast._FEW_ROWS_MIN_WEIGHTS and rows <= _conv_fast._FEW_ROWS
    values = [tensor.value for tensor in inputs]
    got = compiled(values)[0]
    np.testing.assert_array_equal(got, reference(values)[0])
    np.testing.assert_array_equal(got, get_operation(Op.FULLY_CONNECTED).execute(
        ExecutionContext(Op.FULLY_CONNECTED, inputs, [output]))[0])
    assert len(np.unique(got)) > 5


def test_few_row_products_past_int32_take_blas():
    """A product whose int32 sums could overflow (uint8 inputs and filters at full range
    over 33,100 terms) keeps the BLAS product."""
    depth = 33100
    x = _tensor(T.TENSOR_QUANT8_ASYMM, np.zeros((1, depth), np.uint8), 0.5, 255)
    w = _tensor(T.TENSOR_QUANT8_ASYMM, np.zeros((2, depth), np.uint8), 0.25, 255)
    b = _tensor(T.TENSOR_INT32, np.zeros(2, np.int32), 0.125)
    kernel = _plan(Op.FULLY_CONNECTED, [x, w, b, _scalar(T.INT32, 0)], OperandType(T.TENSOR_QUANT8_ASYMM, [1, 2],
                                                                                   1000.0, 0))
    assert kernel.gemv is None


def _greedy_parts(columns: np.ndarray, limit: int) -> list[tuple[int, int]] | None:
    """_float32_parts by its definition: from each start, take columns while every row's
    sum of |w| over the range stays within ``limit``."""
    magnitudes = np.abs(columns.astype(np.int64))
    ranges, start = [], 0
    while start < columns.shape[1]:
        stop, total = start, np.zeros(len(columns), np.int64)
        while stop < columns.shape[1] and (total + magnitudes[:, stop]).max() <= limit:
            total += magnitudes[:, stop]
            stop += 1
        if stop == start or len(ranges) == _conv_fast._MAX_PARTS:
            return None
        ranges.append((start, stop))
        start = stop
    return ranges if len(ranges) > 1 else None


def test_split_ranges_are_the_greedy_ones():
    """The split of a product's summed axis (found from block sums, then within one block)
    is the greedy one: random and sparse filters, ranges ending on and off block
    boundaries, starts inside a block, more parts than allowed (None)."""
    rng = np.random.default_rng(5)
    outcomes = set()
    for trial in range(300):
        rows, depth = int(rng.integers(1, 24)), int(rng.integers(1, 1500))
        columns = rng.integers(-512, 513, (rows, depth)).astype(np.int16)
        if trial % 3 == 0:
            columns[:, rng.integers(0, depth, depth // 2)] = 0
        zero_point = int(rng.integers(0, 256))
        data = _tensor(T.TENSOR_QUANT8_ASYMM, np.zeros((1, 1), np.uint8), 0.5, zero_point)
        want = _greedy_parts(columns, (2**24 - 1) // max(zero_point, 255 - zero_point))
        assert _conv_fast._float32_parts(data, columns) == want, trial
        outcomes.add(0 if want is None else min(len(want), 3))
    assert outcomes == {0, 2, 3}  # unsplit or too many parts, two parts, more


def test_a_kernel_that_fails_to_compile_falls_back_to_numpy(monkeypatch, caplog):
    """A compiled kernel failing at preparation (a numba that cannot compile here, an
    unreadable cache) leaves the operation, and later ones, on the numpy path."""
    def broken(*args):
        raise TypeError("can't unbox array")

    monkeypatch.setattr(_jit, "_unavailable", False)
    monkeypatch.setattr(_jit.kernels(), "depthwise_quantized", broken)
    monkeypatch.setattr(_jit.kernels(), "depthwise_rows_quantized", broken)  # few channels: whole rows
    inputs = [
        _tensor(T.TENSOR_QUANT8_ASYMM, RNG.integers(0, 256, (1, 5, 5, 3)).astype(np.uint8), 0.5, 3),
        _tensor(T.TENSOR_QUANT8_ASYMM, RNG.integers(0, 256, (1, 3, 3, 3)).astype(np.uint8), 0.25, 120),
        _tensor(T.TENSOR_INT32, RNG.integers(-100, 100, 3).astype(np.int32), 0.125),
        *[_scalar(T.INT32, v) for v in (0, 0, 0, 0, 1, 1, 1, 0)],
    ]
    output = OperandType(T.TENSOR_QUANT8_ASYMM, [1, 3, 3, 3], 1.0, 128)
    kernel = _plan(Op.DEPTHWISE_CONV_2D, inputs, output)
    assert kernel.compiled is None and _jit.kernels() is None
    assert "compiled kernels disabled" in caplog.text
    want = get_operation(Op.DEPTHWISE_CONV_2D).execute(ExecutionContext(Op.DEPTHWISE_CONV_2D, inputs, [output]))
    np.testing.assert_array_equal(kernel([t.value for t in inputs])[0], want[0])


# --- RESIZE_BILINEAR ----------------------------------------------------------------------------
@pytest.mark.parametrize("code, dtype", [(T.TENSOR_FLOAT32, np.float32), (T.TENSOR_QUANT8_ASYMM, np.uint8),
                                         (T.TENSOR_QUANT8_ASYMM_SIGNED, np.int8)])
@pytest.mark.parametrize("flags", [(False, False), (True, False), (False, True)])  # align_corners, half_pixel
@pytest.mark.parametrize("shape, size", [((1, 28, 28, 64), (56, 56)), ((2, 5, 7, 3), (3, 11)),
                                         ((1, 1, 1, 2), (4, 4))])
def test_resize_bilinear_matches_numpy(code, dtype, flags, shape, size, monkeypatch):
    """The compiled blend against the numpy one, bit for bit (same float32 operations in
    the same order), on upsampling, mixed up/down sampling and a single pixel."""
    if dtype == np.float32:
        value = RNG.standard_normal(shape).astype(np.float32) * 100
        specials = np.array([np.inf, np.nan, -0.0], np.float32)
        value.reshape(-1)[:3] = specials[:value.size]
    else:
        info = np.iinfo(dtype)
        value = RNG.integers(info.min, info.max + 1, shape).astype(dtype)
    scale, zero = (0.0, 0) if dtype == np.float32 else (0.25, 3)
    out_h, out_w = size
    inputs = [_tensor(code, value, scale, zero), _scalar(T.INT32, out_w), _scalar(T.INT32, out_h),
              _scalar(T.BOOL, False), _scalar(T.BOOL, flags[0]), _scalar(T.BOOL, flags[1])]
    output = OperandType(code, [shape[0], out_h, out_w, shape[3]], scale, zero)
    compiled = _plan(Op.RESIZE_BILINEAR, inputs, output)
    assert compiled.compiled is not None
    reference = _numpy_plan(Op.RESIZE_BILINEAR, inputs, output, monkeypatch)
    assert reference.compiled is None
    fast, slow = compiled([value])[0], reference([value])[0]
    assert fast.dtype == slow.dtype and fast.shape == slow.shape == tuple(output.dimensions)
    np.testing.assert_array_equal(fast.view(np.uint8), slow.view(np.uint8))

# --- how the kernels are loaded ----------------------------------------------------------------
def test_kernels_load_from_the_cache_without_numba_s_compiler_set_up():
    """Every compiled kernel loads through LeanCache; in a fresh process whose cache is
    warm (the first process fills it), preparing and running a float depthwise layer
    loads its kernel without importing numba's implementation registries (numba.np.linalg,
    which imports scipy.linalg when scipy is installed) — a compilation would import them —
    and the float and quantized depthwise kernels take their scratch from the caller
    (no numba.np.arrayobj). The kernels are compiled without numba's runtime, so loading
    them never sets it up (numba compiles its LLVM module for that: ~20 ms)."""
    import importlib
    import pkgutil
    import subprocess
    import sys

    import numba

    from nnapi import operations
    from nnapi.operations import _numba_cache

    modules = [importlib.import_module(f"nnapi.operations.{info.name}") for info in pkgutil.iter_modules(
        operations.__path__) if info.name.startswith("_numba_") and info.name != "_numba_cache"]
    dispatchers = [value for module in modules for value in vars(module).values()
                   if isinstance(value, numba.core.registry.CPUDispatcher) and not value.targetoptions.get("inline")]
    assert len(modules) >= 2 and dispatchers
    assert all(isinstance(d._cache, _numba_cache.LeanCache) for d in dispatchers), \
        "a kernel module defines kernels with numba.njit instead of _numba_cache.kernel"
    assert all(d.targetoptions.get("_nrt") is False and not d._cache._runtime for d in dispatchers)
    child = (
        "import sys, numpy as np\n"
        "from nnapi.operations import _jit\n"
        "from nnapi.operations._conv_fast import PreparedDepthwise\n"
        "from tests.test_fast_kernels import _depthwise_case, _plan, Op\n"
        "inputs, output = None, None\n"
        "rng = np.random.default_rng(5)\n"
        "for kind in ('float32', 'quant8'):\n"
        "    case = None\n"
        "    while case is None:\n"
        "        case = _depthwise_case(kind, rng)\n"
        "    kernel = _plan(Op.DEPTHWISE_CONV_2D, *case)\n"
        "    assert isinstance(kernel, PreparedDepthwise) and kernel.compiled is not None\n"
        "    kernel([t.value for t in case[0]])\n"
        "from numba.core.runtime import rtsys\n"
        "print(_jit.kernels().depthwise_float.stats.cache_hits and 'hit' or 'miss', 'numba.np.linalg' in sys.modules,\n"
        "      'numba.np.arrayobj' in sys.modules, getattr(rtsys, '_init', False))\n"
    )
    first = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, check=True)
    assert first.stdout.split()[0] in ("hit", "miss")
    second = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, check=True)
    # nor numba's array implementation, which a kernel calling np.empty makes it import,
    # nor its runtime
    assert second.stdout.split() == ["hit", "False", "False", "False"], second.stdout + second.stderr


def test_int8_and_uint8_output_stages_share_one_machine_code(monkeypatch):
    """The compiled output stage stores 8-bit results through a uint8 view, so an int8 and
    a uint8 model load one version of it (a second quantized model in a process loads
    nothing more), with the same bits as the numpy stage: results at both ends of the
    int8 range and the zero point included. (Convolutions take the integer products where
    the processor has AVX-512: switched off here.)"""
    _without_integer_products(monkeypatch)
    requantize = _jit.kernels().requantize_rows
    rng = np.random.default_rng(11)
    for code, dtype, zero_point in ((T.TENSOR_QUANT8_ASYMM, np.uint8, 128), (T.TENSOR_QUANT8_ASYMM_SIGNED, np.int8, 0)):
        x = _tensor(code, rng.integers(0, 256, (1, 6, 6, 8)).astype(np.uint8).view(dtype), 0.5, zero_point)
        w = _tensor(code, rng.integers(0, 256, (16, 3, 3, 8)).astype(np.uint8).view(dtype), 0.25, zero_point)
        b = _tensor(T.TENSOR_INT32, rng.integers(-3000, 3000, 16).astype(np.int32), 0.125)
        args = [_scalar(T.INT32, v) for v in (1, 1, 1, 1, 1, 1, 0)]
        output = OperandType(code, [1, 6, 6, 16], 40.0, zero_point)  # spans the whole range
        compiled = _plan(Op.CONV_2D, [x, w, b, *args], output)
        assert isinstance(compiled.epilogue.stage, _jit.FusedOutputStage)
        reference = _numpy_plan(Op.CONV_2D, [x, w, b, *args], output, monkeypatch)
        values = [x.value, w.value, b.value, *[a.value for a in args]]
        fast, slow = compiled(values)[0], reference(values)[0]
        assert fast.dtype == slow.dtype == dtype
        np.testing.assert_array_equal(fast, slow)
        info = np.iinfo(dtype)
        assert fast.min() == info.min and fast.max() == info.max
    assert all(str(signature[2].dtype) != "int8" for signature in requantize.signatures)


def test_a_cache_entry_compiled_with_numba_s_runtime_is_not_loaded_without_it():
    """numba's cache key does not say whether a function was compiled with its runtime:
    LeanCache's does, so machine code calling the runtime (an older cache's) is never
    loaded where the runtime was not set up (unresolved symbols abort the process)."""
    import numba

    from nnapi.operations import _numba_cache

    def double(x, out):  # pragma: no cover - compiled, never run here
        out[0] = x[0] * 2

    signature = (numba.float32[::1], numba.float32[::1])
    codegen = numba.core.registry.cpu_target.target_context.codegen()
    with_runtime = _numba_cache.LeanCache(double, True)._index_key(signature, codegen)
    without = _numba_cache.LeanCache(double, False)._index_key(signature, codegen)
    assert with_runtime != without
    assert with_runtime[-1] == without[-1] == _numba_cache._FORM  # the entries' form (lean loading)
    assert with_runtime[:-2] == without[:-2] == numba.core.caching.FunctionCache(double)._index_key(signature, codegen)


_LINKED_KERNELS = """
import numpy as np
from nnapi.operations._numba_cache import kernel

@kernel()
def scaled(x, factor, out):
    for i in range(x.size):
        out[i] = x[i] * factor

@kernel()
def twice_scaled(x, factor, out):
    scaled(x, factor, out)
    for i in range(x.size):
        out[i] += out[i]
"""

_LINKED_CHILD = """
import sys, numpy as np, numba, llvmlite.binding as ll
import linked_kernels as k
parsed = []
parse = ll.parse_bitcode
ll.parse_bitcode = lambda data: parsed.append(len(data)) or parse(data)
x, out = np.arange(5, dtype=np.float32), np.empty(5, np.float32)
k.scaled(x, np.float32(3), out)
k.twice_scaled(x, np.float32(3), out)
loaded, twice = len(parsed), out.tolist()
@numba.njit  # not cached: compiled here, linking the loaded kernel in
def plus_one(x, factor, out):
    k.scaled(x, factor, out)
    out += 1
plus_one(x, np.float32(2), out)
print(k.scaled.stats.cache_hits and "hit" or "miss", k.twice_scaled.stats.cache_hits and "hit" or "miss",
      loaded, len(parsed), twice == [v * 6 for v in range(5)], out.tolist())
"""


def test_kernels_load_from_the_cache_without_parsing_their_bitcode(tmp_path):
    """LeanCache stores a kernel's defined symbols with its cache entry, so that a process
    loading it from the cache loads its machine code without parsing its LLVM bitcode
    (numba parses it at every load, ~1.2 ms a kernel); the bitcode is parsed only when a
    compilation links the kernel into another function, which then runs correctly. A
    kernel calling another (linked when it was compiled) loads as one entry."""
    import os
    import subprocess
    import sys

    (tmp_path / "linked_kernels.py").write_text(_LINKED_KERNELS)
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "cache"),
               PYTHONPATH=os.pathsep.join([str(tmp_path), *sys.path]))
    runs = [subprocess.run([sys.executable, "-c", _LINKED_CHILD], capture_output=True, text=True, env=env,
                           check=False) for _ in range(2)]
    for run in runs:
        assert run.returncode == 0, run.stderr
    first, second = (run.stdout.strip().split(maxsplit=5) for run in runs)
    assert first[:2] == ["miss", "miss"] and first[4] == "True"
    assert second[:5] == ["hit", "hit", "0", "1", "True"]  # loaded without parsing; one parse for the link
    assert first[5] == second[5] == str([float(v) * 2 + 1 for v in range(5)])


@pytest.mark.parametrize("kind", ["float32", "quant8", "quant8_signed_per_channel"])
def test_read_only_constants_share_one_compiled_version(kind):
    """A layer whose constants are read-only views (a model's weights) and one whose
    constants are fresh arrays call the same machine code: numba keys its versions on
    read-only flags too, and each version is one more load in a process."""
    rng = np.random.default_rng(77)
    case = None
    while case is None:
        case = _depthwise_case(kind, rng)
    inputs, output = case
    kernel = _plan(Op.DEPTHWISE_CONV_2D, inputs, output)
    compiled = _jit.kernels()
    dispatcher = compiled.depthwise_float if kind == "float32" else compiled.depthwise_quantized
    known = set(dispatcher.signatures)
    frozen = []
    for tensor in inputs:
        value = np.array(tensor.value)
        value.flags.writeable = False
        frozen.append(Tensor(tensor.type, tensor.shape, tensor.scale, tensor.zero_point, tensor.channel_quant, value))
    again = _plan(Op.DEPTHWISE_CONV_2D, frozen, output)
    assert again.compiled is not None
    assert set(dispatcher.signatures) == known
    values = [tensor.value for tensor in inputs]
    np.testing.assert_array_equal(again(values)[0], kernel(values)[0])


# --- unpadded quantized products: the input less its zero point ----------------------------------
@pytest.mark.parametrize("kind, zero_point", [(T.TENSOR_QUANT8_ASYMM, 0), (T.TENSOR_QUANT8_ASYMM, 131),
                                              (T.TENSOR_QUANT8_ASYMM, 255), (T.TENSOR_QUANT8_ASYMM_SIGNED, -128),
                                              (T.TENSOR_QUANT8_ASYMM_SIGNED, 5), (T.TENSOR_QUANT8_ASYMM_SIGNED, 127)])
@pytest.mark.parametrize("nchw", [False, True])
def test_pointwise_input_shift_matches_numpy(kind, zero_point, nchw, monkeypatch):
    """A 1x1 CONV_2D (no padding) takes its float32 input (q - zero point) from the compiled
    ``dequantized``: the same float32 values as numpy's subtract (every stored value,
    both 8-bit types, zero points at the ends of the range), hence the same outputs, for
    NHWC inputs and NCHW ones (a transposed view, copied first); a read-only model input
    runs the version loaded at preparation. (The integer products take 1x1 convolutions
    where the processor has AVX-512: switched off here.)"""
    _without_integer_products(monkeypatch)
    rng = np.random.default_rng(zero_point + 128 + 300 * int(nchw))
    dtype = np.uint8 if kind == T.TENSOR_QUANT8_ASYMM else np.int8
    info = np.iinfo(dtype)
    shape = (2, 16, 9, 7) if not nchw else (2, 7, 16, 9)
    stored = rng.integers(info.min, info.max + 1, shape).astype(dtype)
    stored.reshape(-1)[:256] = np.arange(256).astype(np.uint8).view(dtype)  # every stored value
    x = _tensor(kind, stored, 0.05, zero_point)
    unsigned = kind == T.TENSOR_QUANT8_ASYMM
    w_kind, w_zero = (T.TENSOR_QUANT8_ASYMM, 127) if unsigned else (T.TENSOR_QUANT8_ASYMM_SIGNED, 0)
    w = _tensor(w_kind, rng.integers(info.min, info.max + 1, (5, 1, 1, 7)).astype(dtype), 0.01, w_zero)
    b = _tensor(T.TENSOR_INT32, rng.integers(-3000, 3000, 5).astype(np.int32),
                float(np.float32(0.05) * np.float32(0.01)))
    args = [_scalar(T.INT32, v) for v in (0, 0, 0, 0, 1, 1, int(FuseCode.FUSED_RELU))] + [_scalar(T.BOOL, nchw)]
    out_shape = [2, 5, 16, 9] if nchw else [2, 16, 9, 5]
    output = OperandType(kind, out_shape, 0.02, int(info.min) + 3)
    inputs = [x, w, b, *args]
    compiled = _plan(Op.CONV_2D, inputs, output)
    assert compiled.pad.shift is not None
    dispatcher = _jit.kernels().dequantized
    versions = len(dispatcher.signatures)
    numpy_plan = _numpy_plan(Op.CONV_2D, inputs, output, monkeypatch)
    assert numpy_plan.pad.shift is None
    source = np.transpose(stored, (0, 2, 3, 1)) if nchw else stored
    np.testing.assert_array_equal(compiled.pad(source), numpy_plan.pad(source))
    values = [tensor.value for tensor in inputs]
    read_only = np.frombuffer(stored.tobytes(), dtype).reshape(stored.shape)
    want = numpy_plan(values)[0]
    np.testing.assert_array_equal(compiled(values)[0], want)
    np.testing.assert_array_equal(compiled([read_only, *values[1:]])[0], want)
    assert len(dispatcher.signatures) == versions


@pytest.mark.parametrize("kind, zero_point", [(T.TENSOR_QUANT8_ASYMM, 0), (T.TENSOR_QUANT8_ASYMM, 200),
                                              (T.TENSOR_QUANT8_ASYMM_SIGNED, -128), (T.TENSOR_QUANT8_ASYMM_SIGNED, 17),
                                              (T.TENSOR_QUANT8_SYMM, 0)])
@pytest.mark.parametrize("scale", [1.0, 0.0234375, 3.1e-3, 1e-40, 7.5e35])
def test_dequantize_matches_numpy(kind, zero_point, scale, monkeypatch):
    """DEQUANTIZE to float32 through the compiled ``dequantized``: the bits of numpy's plan
    and of ``execute`` for every stored value, scales that round, underflow to subnormals
    and overflow to infinity, contiguous and strided inputs; float16 outputs stay on numpy."""
    dtype = np.uint8 if kind == T.TENSOR_QUANT8_ASYMM else np.int8
    value = RNG.integers(0, 256, (2, 7, 9, 5)).astype(np.uint8).view(dtype)
    value.reshape(-1)[:256] = np.arange(256).astype(np.uint8).view(dtype)
    for data in (value, np.transpose(value, (0, 2, 1, 3))):
        inputs = [_tensor(kind, data, scale, zero_point)]
        output = OperandType(T.TENSOR_FLOAT32, list(data.shape))
        compiled = _plan(Op.DEQUANTIZE, inputs, output)
        assert compiled.__qualname__.endswith("dequantize_compiled")
        numpy_plan = _numpy_plan(Op.DEQUANTIZE, inputs, output, monkeypatch)
        with np.errstate(all="ignore"):
            want = get_operation(Op.DEQUANTIZE).execute(ExecutionContext(Op.DEQUANTIZE, inputs, [output]))[0]
            for got in (compiled([data])[0], numpy_plan([data])[0]):
                assert got.dtype == np.float32 and got.shape == data.shape
                np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
    half = _plan(Op.DEQUANTIZE, inputs, OperandType(T.TENSOR_FLOAT16, list(value.shape)))
    assert not half.__qualname__.endswith("dequantize_compiled")


# --- float32 HARD_SWISH -------------------------------------------------------------------------
def test_hard_swish_matches_numpy(monkeypatch):
    """The compiled HARD_SWISH against the numpy kernel, bit for bit: -0, NaN, infinities,
    the clamp's edges and a strided (NCHW-like) input view."""
    value = (RNG.standard_normal((2, 17, 9, 8)) * 6).astype(np.float32)
    value.reshape(-1)[:9] = [np.nan, np.inf, -np.inf, -0.0, 0.0, -3.0, 3.0, 1e30, -1e30]
    output = OperandType(T.TENSOR_FLOAT32, list(value.shape))
    from nnapi.operations import _numba_activations

    calls = []
    kernel = _numba_activations.hard_swish
    monkeypatch.setattr(_numba_activations, "hard_swish", lambda *args: calls.append(1) or kernel(*args))
    compiled = _plan(Op.HARD_SWISH, [_tensor(T.TENSOR_FLOAT32, value)], output)
    reference = _numpy_plan(Op.HARD_SWISH, [_tensor(T.TENSOR_FLOAT32, value)], output, monkeypatch)
    for data in (value, np.transpose(value, (0, 2, 1, 3))):
        fast, slow = compiled([data])[0], reference([data])[0]
        assert fast.dtype == slow.dtype == np.float32 and fast.shape == slow.shape == data.shape
        np.testing.assert_array_equal(fast.view(np.uint32), slow.view(np.uint32))
    assert len(calls) == 3  # the warm-up at preparation, then both runs of the compiled plan


def test_numba_is_imported_when_the_reference_device_starts():
    """Fresh processes: ``import nnapi`` leaves numba unimported; discovering the devices
    starts nnapi-reference, which imports it (its kernel library), so neither compiling
    a model (float32 ADD and CONV_2D, or a quantized CONV_2D whose output stage is
    compiled) nor running it pays numba's start-up; NNAPI_NO_NUMBA keeps it out."""
    import os
    import subprocess
    import sys

    child = (
        "import sys, numpy as np\n"
        "import nnapi\n"
        "from nnapi import OperandCode as T, OperandType, OperationCode as Op\n"
        "quantized = sys.argv[1] == 'quant8'\n"
        "code = T.TENSOR_QUANT8_ASYMM if quantized else T.TENSOR_FLOAT32\n"
        "dtype = np.uint8 if quantized else np.float32\n"
        "scale = {'scale': 0.5, 'zero_point': 3} if quantized else {}\n"
        "m = nnapi.Model()\n"
        "x = m.add_operand(OperandType(code, [1, 4, 4, 2], **scale))\n"
        "w = m.add_operand(OperandType(code, [3, 1, 1, 2], **scale))\n"
        "m.set_operand_value(w, np.arange(6, dtype=dtype).reshape(3, 1, 1, 2))\n"
        "b = m.add_operand(OperandType(T.TENSOR_INT32 if quantized else T.TENSOR_FLOAT32, [3],"
        " **({'scale': 0.25} if quantized else {})))\n"
        "m.set_operand_value(b, np.zeros(3, np.int32 if quantized else np.float32))\n"
        "args = []\n"
        "for value in (1, 1, 1, 0):\n"
        "    i = m.add_operand(OperandType(T.INT32)); m.set_operand_value(i, np.int32(value)); args.append(i)\n"
        "y = m.add_operand(OperandType(code, [1, 4, 4, 3], **({'scale': 2.0, 'zero_point': 1} if quantized else {})))\n"
        "z = m.add_operand(OperandType(code, [1, 4, 4, 3], **({'scale': 2.0, 'zero_point': 1} if quantized else {})))\n"
        "m.add_operation(Op.CONV_2D, [x, w, b, *args], [y])\n"
        "m.add_operation(Op.ADD, [y, y, args[-1]], [z])\n"
        "m.identify_inputs_and_outputs([x], [z]); m.finish()\n"
        "imported = 'numba' in sys.modules\n"
        "devices = [d for d in nnapi.get_devices() if d.name == 'nnapi-reference']\n"
        "started = 'numba' in sys.modules\n"
        "c = nnapi.Compilation(m, devices); c.finish()\n"
        "compiled = 'numba' in sys.modules\n"
        "e = nnapi.Execution(c); e.set_input(0, np.ones((1, 4, 4, 2), dtype))\n"
        "out = np.empty((1, 4, 4, 3), dtype); e.set_output(0, out); e.compute()\n"
        "print(imported, started, compiled, 'numba' in sys.modules)\n"
    )
    environment = {k: v for k, v in os.environ.items() if k != _jit.DISABLE_VARIABLE}
    for kind in ("float32", "quant8"):
        result = subprocess.run([sys.executable, "-c", child, kind], capture_output=True, text=True, check=True,
                                env=environment)
        assert result.stdout.split() == ["False", "True", "True", "True"], (kind, result.stdout, result.stderr)
    result = subprocess.run([sys.executable, "-c", child, "quant8"], capture_output=True, text=True, check=True,
                            env={**environment, _jit.DISABLE_VARIABLE: "1"})
    assert result.stdout.split() == ["False", "False", "False", "False"], (result.stdout, result.stderr)


def test_a_read_only_model_input_runs_the_machine_code_loaded_at_compilation():
    """An input given as a read-only view (np.frombuffer) reaches a compiled kernel as a
    writable copy: numba would type the view apart and compile or load another version
    of the kernel inside the execution."""
    import nnapi

    model = nnapi.Model()
    x = model.add_operand(OperandType(T.TENSOR_FLOAT32, [1, 8, 8, 4]))
    w = model.add_operand(OperandType(T.TENSOR_FLOAT32, [1, 3, 3, 4]))
    model.set_operand_value(w, RNG.standard_normal((1, 3, 3, 4)).astype(np.float32))
    b = model.add_operand(OperandType(T.TENSOR_FLOAT32, [4]))
    model.set_operand_value(b, np.zeros(4, np.float32))
    args = []
    for value in (1, 1, 1, 1, 1, 1, 1, 0):  # explicit padding 1, strides 1, multiplier 1, no activation
        args.append(model.add_operand(OperandType(T.INT32)))
        model.set_operand_value(args[-1], np.int32(value))
    y = model.add_operand(OperandType(T.TENSOR_FLOAT32, [1, 8, 8, 4]))
    model.add_operation(Op.DEPTHWISE_CONV_2D, [x, w, b, *args], [y])
    model.identify_inputs_and_outputs([x], [y])
    model.finish()
    compilation = nnapi.Compilation(model, [d for d in nnapi.get_devices() if d.name == "nnapi-reference"])
    compilation.finish()
    dispatcher = _jit.kernels().depthwise_float
    known = set(dispatcher.signatures)
    values = RNG.standard_normal((1, 8, 8, 4)).astype(np.float32)
    results = []
    for array in (values, np.frombuffer(values.tobytes(), np.float32).reshape(values.shape)):
        execution = nnapi.Execution(compilation)
        execution.set_input(0, array)
        out = np.empty((1, 8, 8, 4), np.float32)
        execution.set_output(0, out)
        execution.compute()
        results.append(out)
    assert set(dispatcher.signatures) == known
    np.testing.assert_array_equal(results[0], results[1])


# --- PRELU -------------------------------------------------------------------------------------
@pytest.mark.parametrize("shape, alpha_shape", [((2, 5, 7, 3), (3,)), ((1, 4, 4, 20), (1, 1, 20)), ((3, 6, 2), (6, 1)),
                                                ((2, 3, 4), (2, 1, 4)), ((5, 300), (1,)), ((0, 4), (4,)), ((7,), (7,))])
@pytest.mark.parametrize("slopes", ["small", "mirrored", "special"])
def test_prelu_matches_numpy_bit_for_bit(shape, alpha_shape, slopes, monkeypatch):
    """The prepared PRELU with nnapi[fast] against the numpy plan and ``execute``: the same bits, for
    slopes below and above 1 and zero or non-finite ones, and inputs with -0, NaN, inf."""
    rng = np.random.default_rng(len(shape) * 100 + len(alpha_shape))
    x = rng.standard_normal(shape).astype(np.float32)
    if x.size >= 6:
        x.reshape(-1)[:6] = [-0.0, 0.0, np.nan, np.inf, -np.inf, -1e-40]
    alpha = {"small": rng.uniform(0.01, 0.9, alpha_shape), "mirrored": rng.uniform(-2, 3, alpha_shape),
             "special": rng.choice(np.array([0.0, np.inf, -np.inf, np.nan, 0.25, 1.5]), alpha_shape)}[slopes]
    inputs = [_tensor(T.TENSOR_FLOAT32, x), _tensor(T.TENSOR_FLOAT32, alpha.astype(np.float32))]
    output = OperandType(T.TENSOR_FLOAT32, list(shape))
    compiled = _plan(Op.PRELU, inputs, output)
    numpy_plan = _numpy_plan(Op.PRELU, inputs, output, monkeypatch)
    # the compiled loop takes every slope (empty inputs stay on numpy)
    assert compiled.__qualname__.startswith("_compiled_prelu") == bool(x.size)
    assert not numpy_plan.__qualname__.startswith("_compiled_prelu")
    values = [tensor.value for tensor in inputs]
    want = get_operation(Op.PRELU).execute(ExecutionContext(Op.PRELU, inputs, [output]))[0]
    for got in (compiled(values)[0], numpy_plan(values)[0]):
        assert got.dtype == np.float32 and got.shape == shape
        np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


# --- element-wise functions of two 8-bit tensors through a pair table --------------------------
@pytest.mark.parametrize("code", [Op.ADD, Op.SUB, Op.MUL])
@pytest.mark.parametrize("kind", [T.TENSOR_QUANT8_ASYMM, T.TENSOR_QUANT8_ASYMM_SIGNED])
@pytest.mark.parametrize("shapes", [((2, 9, 9, 24), (2, 9, 9, 24)), ((2, 9, 9, 24), (1, 1, 24)),
                                    ((1, 1, 1, 24), (2, 9, 9, 24)), ((9, 9, 24), (1, 9, 9, 24)),
                                    ((2, 9, 9, 24), (1,)), ((2, 9, 9, 80), (1, 1, 80)),
                                    ((2, 9, 9, 24), (9, 1, 24)), ((1, 9, 24), (2, 1, 1, 1))])
def test_pair_table_lookup_matches_numpy(code, kind, shapes, monkeypatch):
    """Quantized ADD / SUB / MUL prepared: the compiled lookup (inputs of one shape, or one
    broadcast along leading axes, first or second) and numpy's (broadcasting) give
    execute's values for every stored value and fuse code."""
    rng = np.random.default_rng(int(code) * 10 + int(kind))
    dtype = np.uint8 if kind == T.TENSOR_QUANT8_ASYMM else np.int8
    info = np.iinfo(dtype)
    shape = np.broadcast_shapes(*shapes)
    first = rng.integers(info.min, info.max + 1, shapes[0]).astype(dtype)
    second = rng.integers(info.min, info.max + 1, shapes[1]).astype(dtype)
    larger = first if first.size >= second.size else second
    count = min(256, larger.size)  # every stored value (where the tensor holds 256)
    larger.reshape(-1)[:count] = np.arange(count).astype(np.uint8).view(dtype)
    for fuse in (FuseCode.FUSED_NONE, FuseCode.FUSED_RELU6):
        inputs = [_tensor(kind, first, 0.05, int(info.min) + 100), _tensor(kind, second, 0.08, int(info.min) + 30),
                  _scalar(T.INT32, fuse)]
        output = OperandType(kind, list(shape), 0.1 if code != Op.MUL else 0.5, int(info.min) + 77)
        compiled = _plan(code, inputs, output)
        numpy_plan = _numpy_plan(code, inputs, output, monkeypatch)
        want = get_operation(code).execute(ExecutionContext(code, inputs, [output]))[0]
        values = [tensor.value for tensor in inputs]
        # the compiled lookup where one input has the output's shape and the other repeats
        assert compiled.compiled == (shapes[1] not in ((9, 1, 24), (2, 1, 1, 1))) and not numpy_plan.compiled
        for got in (compiled(values)[0], numpy_plan(values)[0]):
            assert got.dtype == dtype and got.shape == shape
            np.testing.assert_array_equal(got, want)


# --- MAX_POOL_2D, quantized AVERAGE_POOL_2D ----------------------------------------------------
@pytest.mark.parametrize("code", [Op.MAX_POOL_2D, Op.AVERAGE_POOL_2D])
@pytest.mark.parametrize("kind", [T.TENSOR_FLOAT32, T.TENSOR_QUANT8_ASYMM, T.TENSOR_QUANT8_ASYMM_SIGNED])
@pytest.mark.parametrize("seed", range(8))
def test_pool_matches_numpy(code, kind, seed, monkeypatch):
    """The one-pass MAX_POOL_2D and quantized AVERAGE_POOL_2D against numpy's prepared
    pooling and ``execute``: random windows, strides and padding (up to the window less one:
    every window holds a tap of the input), NCHW, every fused clamp; float inputs with NaN
    and infinities (MAX_POOL_2D; the float AVERAGE_POOL_2D stays numpy's)."""
    if code == Op.AVERAGE_POOL_2D and kind == T.TENSOR_FLOAT32:
        pytest.skip("the float AVERAGE_POOL_2D has no compiled kernel")
    rng = np.random.default_rng(3000 + seed)
    batches, channels = int(rng.integers(0, 3)), int(rng.integers(1, 20))
    fh, fw, sh, sw = (int(v) for v in rng.integers(1, 5, 4))
    if seed < 4:  # 2x2 windows: the four-tap pass inside, tap by tap at the border
        fh = fw = 2
    height, width = int(rng.integers(fh, 14)), int(rng.integers(fw, 14))
    pads = [int(rng.integers(0, fw)), int(rng.integers(0, fw)), int(rng.integers(0, fh)), int(rng.integers(0, fh))]
    nchw = bool(rng.integers(0, 2))
    fuse = int(rng.choice([FuseCode.FUSED_NONE, FuseCode.FUSED_RELU, FuseCode.FUSED_RELU1, FuseCode.FUSED_RELU6]))
    shape = (batches, channels, height, width) if nchw else (batches, height, width, channels)
    if kind == T.TENSOR_FLOAT32:
        values = (rng.standard_normal(shape) * 4).astype(np.float32)
        if values.size > 4:
            values.reshape(-1)[rng.choice(values.size, 4, replace=False)] = [np.nan, np.inf, -np.inf, -0.0]
        x, out_scale, out_zero = _tensor(kind, values), 0.0, 0
    else:
        dtype = np.uint8 if kind == T.TENSOR_QUANT8_ASYMM else np.int8
        info = np.iinfo(dtype)
        x = _tensor(kind, rng.integers(info.min, info.max + 1, shape).astype(dtype), 0.05, int(info.min) + 100)
        out_scale, out_zero = 0.05, int(info.min) + 100
    out_h = (height + pads[2] + pads[3] - fh) // sh + 1
    out_w = (width + pads[0] + pads[1] - fw) // sw + 1
    args = [_scalar(T.INT32, v) for v in (*pads, sw, sh, fw, fh, fuse)] + [_scalar(T.BOOL, nchw)]
    dims = [batches, channels, out_h, out_w] if nchw else [batches, out_h, out_w, channels]
    output = OperandType(kind, dims, out_scale, out_zero)
    inputs = [x, *args]
    compiled = _plan(code, inputs, output)
    numpy_plan = _numpy_plan(code, inputs, output, monkeypatch)
    assert compiled.compiled is not None and numpy_plan.compiled is None
    want = get_operation(code).execute(ExecutionContext(code, inputs, [output]))[0]
    values = [tensor.value for tensor in inputs]
    for got in (compiled(values)[0], numpy_plan(values)[0]):
        assert got.dtype == want.dtype and got.shape == want.shape == tuple(dims)
        np.testing.assert_array_equal(got, want)


def test_read_only_inputs_add_no_kernel_version():
    """PRELU, MAX_POOL_2D and a quantized ADD fed read-only inputs (a model input from
    np.frombuffer) use the version loaded at preparation: no other is compiled or loaded
    inside the execution, and the results are the same."""
    rng = np.random.default_rng(7)
    x = _tensor(T.TENSOR_FLOAT32, rng.standard_normal((1, 8, 8, 4)).astype(np.float32))
    q = _tensor(T.TENSOR_QUANT8_ASYMM, rng.integers(0, 256, (1, 16, 16, 4)).astype(np.uint8), 0.1, 3)
    pool_args = [_scalar(T.INT32, v) for v in (0, 0, 0, 0, 2, 2, 2, 2, 0)] + [_scalar(T.BOOL, False)]
    cases = [
        (Op.PRELU, [x, _tensor(T.TENSOR_FLOAT32, rng.uniform(0.1, 0.5, 4).astype(np.float32))],
         OperandType(T.TENSOR_FLOAT32, [1, 8, 8, 4]), "prelu_float"),
        (Op.MAX_POOL_2D, [x, *pool_args], OperandType(T.TENSOR_FLOAT32, [1, 4, 4, 4]), "max_pool"),
        (Op.ADD, [q, q, _scalar(T.INT32, 0)], OperandType(T.TENSOR_QUANT8_ASYMM, [1, 16, 16, 4], 0.2, 5),
         "lookup_pairs"),
    ]
    for code, inputs, output, name in cases:
        kernel = _plan(code, inputs, output)
        dispatcher = getattr(_jit.kernels(), name)
        versions = len(dispatcher.signatures)
        values = [tensor.value for tensor in inputs]
        read_only = [np.frombuffer(v.tobytes(), v.dtype).reshape(v.shape) if v.ndim else v for v in values]
        assert not read_only[0].flags.writeable
        np.testing.assert_array_equal(kernel(read_only)[0], kernel(values)[0])
        assert len(dispatcher.signatures) == versions, name


# --- quantized element-wise work in one pass (_numba_quant) ------------------------------------
def _compiled_and_numpy_plans(code, inputs, output, monkeypatch, module_name: str):
    """(the compiled plan, the numpy plan, execute's results), asserting the compiled
    kernel ``module_name`` of ``_numba_quant`` is what the first one calls."""
    from nnapi.operations import _numba_quant

    calls = []
    kernel = getattr(_numba_quant, module_name)
    monkeypatch.setattr(_numba_quant, module_name, lambda *args: calls.append(1) or kernel(*args))
    compiled = _plan(code, inputs, output)
    numpy_plan = _numpy_plan(code, inputs, output, monkeypatch)
    with np.errstate(all="ignore"):
        want = get_operation(code).execute(ExecutionContext(code, inputs, [output]))[0]
        values = [tensor.value for tensor in inputs]
        results = (compiled(values)[0], numpy_plan(values)[0])
    assert len(calls) == 2  # the warm-up at preparation and the compiled plan's run
    return results, want


@pytest.mark.parametrize("code", [Op.TANH, Op.LOGISTIC, Op.RELU6])
@pytest.mark.parametrize("kind", [T.TENSOR_QUANT8_ASYMM, T.TENSOR_QUANT8_ASYMM_SIGNED])
def test_activation_lookup_matches_numpy(code, kind, monkeypatch):
    """Quantized activations through their 256-entry table: the compiled lookup, np.take
    and execute agree on every stored value, on a strided input view too."""
    dtype = np.uint8 if kind == T.TENSOR_QUANT8_ASYMM else np.int8
    value = RNG.integers(0, 256, (3, 9, 11, 16)).astype(np.uint8).view(dtype)
    value.reshape(-1)[:256] = np.arange(256).astype(np.uint8).view(dtype)
    zero = {T.TENSOR_QUANT8_ASYMM: 0, T.TENSOR_QUANT8_ASYMM_SIGNED: -128}[kind]
    out_scale, out_zero = {Op.TANH: (1 / 128, zero + 128), Op.LOGISTIC: (1 / 256, zero)}.get(code, (0.05, zero + 7))
    for data in (value, np.transpose(value, (0, 2, 1, 3))):
        inputs = [_tensor(kind, data, 0.06, zero + 120)]
        (fast, slow), want = _compiled_and_numpy_plans(code, inputs, OperandType(kind, list(data.shape), out_scale,
                                                                                out_zero), monkeypatch, "lookup")
        for got in (fast, slow):
            assert got.dtype == dtype and got.shape == data.shape
            np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("kind, scale, zero_point", [(T.TENSOR_QUANT8_ASYMM_SIGNED, 1.0, 0),
                                                     (T.TENSOR_QUANT8_ASYMM_SIGNED, 0.03, -9),
                                                     (T.TENSOR_QUANT8_ASYMM, 0.5, 128),
                                                     (T.TENSOR_QUANT8_ASYMM, 1.0, 255)])
def test_quantize_matches_numpy(kind, scale, zero_point, monkeypatch):
    """QUANTIZE of float32: ties of both signs, values just below a half, NaN, infinities,
    -0 and values beyond the range, in the compiled pass, numpy's plan and execute."""
    edges = np.array([0.5, -0.5, 1.5, -1.5, 2.5, -2.5, 0.49999997, -0.49999997, np.nan, np.inf, -np.inf,
                      1e30, -1e30, 126.5, 127.5, -128.5, -129.5, 0.0, -0.0, 3.4e38], np.float32)
    value = np.concatenate([edges * np.float32(scale), RNG.standard_normal(4 * 7 * 5 * 3 - edges.size)
                            .astype(np.float32) * 150 * np.float32(scale)]).reshape(4, 7, 5, 3)
    dtype = np.uint8 if kind == T.TENSOR_QUANT8_ASYMM else np.int8
    for data in (value, np.transpose(value, (0, 3, 1, 2))):
        inputs = [_tensor(T.TENSOR_FLOAT32, data)]
        output = OperandType(kind, list(data.shape), scale, zero_point)
        (fast, slow), want = _compiled_and_numpy_plans(Op.QUANTIZE, inputs, output, monkeypatch, "quantize_float32")
        for got in (fast, slow):
            assert got.dtype == dtype and got.shape == data.shape
            np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("code", [Op.ARGMAX, Op.ARGMIN])
@pytest.mark.parametrize("kind", [T.TENSOR_FLOAT32, T.TENSOR_QUANT8_ASYMM, T.TENSOR_QUANT8_ASYMM_SIGNED])
@pytest.mark.parametrize("axis", [-1, 1])
def test_argmax_rows_match_numpy(code, kind, axis, monkeypatch):
    """The compiled row scan: ties (the first index wins), NaN (first in a row: index 0;
    later: never taken, as Android's scan), -0 against 0, infinities, along the last axis
    and a middle one."""
    if kind == T.TENSOR_FLOAT32:
        value = RNG.integers(-3, 4, (6, 21, 13)).astype(np.float32)  # many ties
        value[0, :, 0] = np.nan
        value[1, 3, 5] = value[1, 7, 5] = np.nan
        value[2, :, :2] = -0.0
        value[2, 5, :2] = 0.0
        value[3, 2, 4] = np.inf
        value[3, 4, 4] = -np.inf
    else:
        dtype = np.uint8 if kind == T.TENSOR_QUANT8_ASYMM else np.int8
        info = np.iinfo(dtype)
        value = RNG.integers(info.min, info.max + 1, (6, 21, 13)).astype(dtype)
        value[0, :3] = info.max
        value[1, :3] = info.min
    inputs = [_tensor(kind, value, 0.1 if kind != T.TENSOR_FLOAT32 else 0.0), _scalar(T.INT32, axis)]
    shape = [n for i, n in enumerate(value.shape) if i != axis % 3]
    (fast, slow), want = _compiled_and_numpy_plans(code, inputs, OperandType(T.TENSOR_INT32, shape), monkeypatch,
                                                   "argmax_rows")
    for got in (fast, slow):
        assert got.dtype == np.int32 and list(got.shape) == shape
        np.testing.assert_array_equal(got, want)


# --- float32 MEAN over height and width ----------------------------------------------------------
@pytest.mark.parametrize("shape, axes, keep", [((1, 7, 7, 1280), (1, 2), False), ((2, 5, 3, 4), (1, 2), True),
                                               ((3, 40, 9, 2), (1,), False), ((4, 6, 5), (0, 1), False),
                                               ((2, 3, 4, 5), (2, 1), True), ((2, 3, 4, 5), (0, 1, 2), False),
                                               ((0, 3, 4, 5), (1, 2), False)])
def test_mean_matches_numpy(shape, axes, keep, monkeypatch):
    """Float32 MEAN over adjacent axes followed by others runs the compiled ``mean_float``
    with numpy's bits: values over 60 binary orders of magnitude, -0 everywhere in one
    group (+0, as numpy's sum from 0), NaN, infinities and float32 overflow of the mean;
    against the numpy plan and ``execute``. A reduction of the last axis stays on numpy."""
    rng = np.random.default_rng(sum(shape) + len(axes))
    x = (rng.standard_normal(shape) * np.exp2(rng.uniform(-30, 30, shape))).astype(np.float32)
    if x.size:
        x[0] = -0.0
        flat = x.reshape(-1)
        flat[-4:] = [np.nan, np.inf, -np.inf, 3.4e38]
        flat[-40:-36] = 3.4e38
    axes_tensor = _tensor(T.TENSOR_INT32, np.array(axes, np.int32))
    inputs = [_tensor(T.TENSOR_FLOAT32, x), axes_tensor, _scalar(T.INT32, int(keep))]
    out_shape = [1 if axis in axes else size for axis, size in enumerate(shape)] if keep else \
        [size for axis, size in enumerate(shape) if axis not in axes]
    output = OperandType(T.TENSOR_FLOAT32, out_shape)
    compiled = _plan(Op.MEAN, inputs, output)
    assert compiled.__qualname__.startswith("_compiled_mean")
    numpy_plan = _numpy_plan(Op.MEAN, inputs, output, monkeypatch)
    assert not numpy_plan.__qualname__.startswith("_compiled_mean")
    with np.errstate(all="ignore"):
        want = get_operation(Op.MEAN).execute(ExecutionContext(Op.MEAN, inputs, [output]))[0]
        for got in (compiled([x])[0], numpy_plan([x])[0]):
            assert got.dtype == np.float32 and got.shape == tuple(out_shape)
            np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
    last = _plan(Op.MEAN, [inputs[0], _tensor(T.TENSOR_INT32, np.array([len(shape) - 1], np.int32)), inputs[2]],
                 OperandType(T.TENSOR_FLOAT32, [*shape[:-1], 1] if keep else list(shape[:-1])))
    assert not last.__qualname__.startswith("_compiled_mean")


# --- quantized SOFTMAX ----------------------------------------------------------------------------
@pytest.mark.parametrize("kind", [T.TENSOR_QUANT8_ASYMM, T.TENSOR_QUANT8_ASYMM_SIGNED])
@pytest.mark.parametrize("shape", [(1, 1001), (3, 7), (2, 8), (5, 129), (1, 8, 16, 64), (2, 300), (1, 5000), (4, 1)])
@pytest.mark.parametrize("beta", [1.0, 0.37, 25.0])
def test_quantized_softmax_matches_numpy(kind, shape, beta, monkeypatch):
    """Quantized SOFTMAX along the last axis through the compiled ``softmax_quantized``:
    numpy's bits (its pairwise float64 sums replayed: rows below 8, up to 128 and split
    in halves above), every stored value, rows of one value, against the numpy plan and
    ``execute``; another axis stays on numpy."""
    rng = np.random.default_rng(sum(shape) + int(beta * 100))
    dtype = np.uint8 if kind == T.TENSOR_QUANT8_ASYMM else np.int8
    q = rng.integers(0, 256, shape).astype(np.uint8).view(dtype)
    flat = q.reshape(-1)
    flat[:256] = np.arange(256).astype(np.uint8).view(dtype)[:flat.size]
    if shape[0] > 1:
        q[1] = q.reshape(-1)[-1]  # one row of equal values
    zero = 0 if dtype == np.uint8 else -128
    inputs = [_tensor(kind, q, float(rng.uniform(0.01, 0.2)), int(rng.integers(0, 256)) + (zero if zero else 0)),
              _scalar(T.FLOAT32, beta)]
    output = OperandType(kind, list(shape), 1 / 256, zero)
    compiled = _plan(Op.SOFTMAX, inputs, output)
    assert compiled.__qualname__.startswith("_compiled_softmax")
    numpy_plan = _numpy_plan(Op.SOFTMAX, inputs, output, monkeypatch)
    assert not numpy_plan.__qualname__.startswith("_compiled_softmax")
    want = get_operation(Op.SOFTMAX).execute(ExecutionContext(Op.SOFTMAX, inputs, [output]))[0]
    for got in (compiled([q, np.float32(beta)])[0], numpy_plan([q, np.float32(beta)])[0]):
        assert got.dtype == dtype and got.shape == shape
        np.testing.assert_array_equal(got, want)
    if len(shape) > 1:
        other = _plan(Op.SOFTMAX, [*inputs, _scalar(T.INT32, 0)], output)
        assert not other.__qualname__.startswith("_compiled_softmax")


def test_compiled_hard_nms_selects_what_greedy_nms_selects():
    """The compiled greedy hard NMS against ``greedy_nms`` (numpy, Android's order): score
    ties (a few score levels), degenerate, infinite and NaN boxes, IoU thresholds 0..1,
    every limit; the selections (indexes, in order) must be the same, and those of the
    walk by descending score (``greedy_nms_hard_by_score``) too wherever it does not
    decline (equal scores)."""
    from nnapi.operations import _numba_nms
    from nnapi.operations.detection_common import greedy_nms, hard_suppressor

    rng = np.random.default_rng(7)
    compared = selected_total = 0
    by_score = {True: 0, False: 0}
    for case in range(300):
        n = int(rng.integers(1, 80))
        corner = rng.random((n, 2), dtype=np.float32)
        boxes = np.concatenate([corner, corner + rng.random((n, 2), dtype=np.float32) * 0.5], axis=1)
        if case % 3 == 0:
            boxes[rng.integers(0, n, 3)] = [np.nan, 0, np.inf, 1]
            boxes[rng.integers(0, n, 2), 2:] = boxes[rng.integers(0, n, 2), :2]  # some degenerate
        boxes = boxes.astype(np.float32)
        levels = int(rng.integers(1, 6)) if case % 2 else 0
        scores = (rng.integers(0, levels, n) / levels if levels else rng.random(n)).astype(np.float32)
        candidates = np.flatnonzero(scores > np.float32(0.1)) if case % 4 else np.arange(n)
        threshold = np.float32(rng.choice([0.0, 0.3, 0.5, 0.7, 1.0]))
        limit = int(rng.integers(1, n + 2))
        expected = greedy_nms(scores.copy(), boxes, candidates, hard_suppressor(threshold), limit)
        selected = np.empty(n, np.int64)
        count = _numba_nms.greedy_nms_hard(candidates.astype(np.int64), boxes, scores, threshold, limit, selected,
                                           np.empty((5, candidates.size), np.float32),
                                           np.empty(candidates.size, np.bool_))
        np.testing.assert_array_equal(selected[:count], expected, err_msg=f"case {case}")
        compared += 1
        selected_total += count
        # by descending score: the same selections, or -1 where equal scores meet
        count = _numba_nms.greedy_nms_hard_by_score(candidates.astype(np.int64), boxes, scores, threshold, limit,
                                                    selected)
        if count >= 0:
            np.testing.assert_array_equal(selected[:count], expected, err_msg=f"case {case} by score")
        else:
            assert levels, f"case {case}: distinct scores declined"
        by_score[count >= 0] += 1
    assert compared == 300 and selected_total > 1000
    # distinct scores always go by score; few score levels mostly fall back
    assert by_score[True] >= 150 and 20 < by_score[False] < 150


def test_regular_detection_postprocessing_compiled_equals_numpy(monkeypatch):
    """DETECTION_POSTPROCESSING's regular NMS over an SSD-sized input (1,917 anchors, 91
    classes, threshold near 0) and over small random cases with score ties within and
    across classes gives the same detections compiled (``per_class_nms_merged``) and
    with numpy."""
    from nnapi.operations import detection_postprocessing as dp
    from nnapi.operations.detection_common import hard_suppressor
    from test_ops_detection import random_detection_case

    rng = np.random.default_rng(3)
    scores = rng.random((1917, 91), dtype=np.float32)
    scores[:, 5] = np.float32(0.5)  # one class of equal scores: the tie order matters
    scores[:40, 7] = scores[:40, 9] = np.float32(0.99)  # ties across classes at the top
    corner = rng.random((1917, 2), dtype=np.float32)
    boxes = np.concatenate([corner, corner + rng.random((1917, 2), dtype=np.float32) * 0.3], axis=1)
    iou = np.float32(0.6)
    cases = [(scores, boxes, np.float32(1e-8), iou, 100, 100)]
    cases += [random_detection_case(rng, case) for case in range(300)]
    assert dp._compiled_nms() is not None
    compiled = [dp.DetectionPostprocessing._regular(s, b, t, hard_suppressor(i), p, m, i) for s, b, t, i, p, m in cases]
    monkeypatch.setenv(_jit.DISABLE_VARIABLE, "1")
    assert dp._compiled_nms() is None
    for case, (fast, (s, b, t, i, p, m)) in enumerate(zip(compiled, cases, strict=True)):
        slow = dp.DetectionPostprocessing._regular(s, b, t, hard_suppressor(i), p, m, i)
        for got, want in zip(fast, slow, strict=True):
            np.testing.assert_array_equal(got, want, err_msg=f"case {case}")
    assert compiled[0][0].size == 100 and sum(c[0].size for c in compiled) > 1500


def test_fast_detection_postprocessing_compiled_equals_numpy(monkeypatch):
    """Fast NMS (each anchor's best foreground score, one walk) compiled (``row_maxima``,
    ``greedy_nms_hard``) and with numpy: the same anchors, classes and scores, rows with a
    NaN score (no candidate), ties and several classes per detection included."""
    from nnapi.operations import detection_postprocessing as dp
    from nnapi.operations.detection_common import hard_suppressor
    from test_ops_detection import random_detection_case

    rng = np.random.default_rng(5)
    cases = [random_detection_case(rng, case) for case in range(300)]
    for scores, *_ in cases[::7]:
        if scores.size:
            scores[rng.integers(0, scores.shape[0]), rng.integers(0, scores.shape[1])] = np.nan
    per_anchor = [int(rng.integers(1, 4)) for _ in cases]

    def run():
        return [dp.DetectionPostprocessing._fast(s, b, t, hard_suppressor(i), m, min(k, s.shape[1] - 1), i)
                for (s, b, t, i, _, m), k in zip(cases, per_anchor, strict=True)]

    assert dp._compiled_nms() is not None
    compiled = run()
    monkeypatch.setenv(_jit.DISABLE_VARIABLE, "1")
    assert dp._compiled_nms() is None
    for case, (fast, slow) in enumerate(zip(compiled, run(), strict=True)):
        for got, want in zip(fast, slow, strict=True):
            np.testing.assert_array_equal(got, want, err_msg=f"case {case}")
    assert sum(c[0].size for c in compiled) > 1000


_LIBRARY_CHILD = """
import numpy as np, numba
from nnapi import OperandCode as T, OperandType, OperationCode as Op
from nnapi.operand import SymmPerChannelQuantParams
from nnapi.operations import _jit
from tests.test_fast_kernels import _plan, _scalar, _tensor

modules = [_jit.kernels()]
from nnapi.operations import _numba_quant
modules.append(_numba_quant)
if _jit.integer_products() is not None:
    modules.append(_jit.integer_products())

def loaded():
    return {(name, str(sig)) for module in modules for name, value in vars(module).items()
            if isinstance(value, numba.core.registry.CPUDispatcher) for sig in value.signatures}

_jit.load_library()
at_start = loaded()
rng = np.random.default_rng(3)
for code, dtype in ((T.TENSOR_QUANT8_ASYMM_SIGNED, np.int8), (T.TENSOR_QUANT8_ASYMM, np.uint8)):
    info = np.iinfo(dtype)
    def values(shape):
        return rng.integers(info.min, info.max + 1, shape).astype(dtype)
    def image(shape, zero_point):
        return _tensor(code, values(shape), 0.02, zero_point)
    def filters(shape, axis):
        if dtype == np.int8:  # per-channel, as an int8 MobileNet's
            scales = tuple(float(s) for s in rng.uniform(0.001, 0.01, shape[axis]))
            return _tensor(T.TENSOR_QUANT8_SYMM_PER_CHANNEL, rng.integers(-127, 128, shape).astype(np.int8), 0.0, 0,
                           SymmPerChannelQuantParams(axis, scales))
        return _tensor(code, values(shape), 0.01, 120)
    def bias(n):
        return _tensor(T.TENSOR_INT32, rng.integers(-5000, 5000, n).astype(np.int32), 0.0 if dtype == np.int8 else 2e-4)
    zp = 3 if dtype == np.int8 else 130
    out = lambda shape: OperandType(code, list(shape), 0.05, zp)
    relu6 = _scalar(T.INT32, 3)
    cases = [
        (Op.CONV_2D, [image((1, 15, 15, 3), zp), filters((24, 3, 3, 3), 0), bias(24),
                      *[_scalar(T.INT32, v) for v in (0, 1, 0, 1, 2, 2)], relu6], out((1, 8, 8, 24))),
        (Op.CONV_2D, [image((1, 8, 8, 24), zp), filters((48, 1, 1, 24), 0), bias(48),
                      *[_scalar(T.INT32, v) for v in (0, 0, 0, 0, 1, 1)], relu6], out((1, 8, 8, 48))),
        (Op.CONV_2D, [image((1, 7, 7, 2048), zp), filters((16, 1, 1, 2048), 0), bias(16),
                      *[_scalar(T.INT32, v) for v in (0, 0, 0, 0, 1, 1, 0)]], out((1, 7, 7, 16))),
        (Op.DEPTHWISE_CONV_2D, [image((1, 9, 9, 48), zp), filters((1, 3, 3, 48), 3), bias(48),
                                *[_scalar(T.INT32, v) for v in (0, 1, 0, 1, 2, 2, 1)], relu6], out((1, 5, 5, 48))),
        (Op.DEPTHWISE_CONV_2D, [image((1, 9, 9, 32), zp), filters((1, 3, 3, 32), 3), bias(32),
                                *[_scalar(T.INT32, v) for v in (1, 1, 1, 1, 1, 1, 1)], relu6], out((1, 9, 9, 32))),
        (Op.CONV_2D, [image((1, 1, 1, 48), zp), filters((100, 1, 1, 48), 0), bias(100),
                      *[_scalar(T.INT32, v) for v in (0, 0, 0, 0, 1, 1, 0)]], out((1, 1, 1, 100))),
        (Op.FULLY_CONNECTED, [image((1, 48), zp), filters((100, 48), 0), bias(100), _scalar(T.INT32, 0)],
         out((1, 100))),
        (Op.ADD, [image((1, 8, 8, 24), zp), image((1, 8, 8, 24), zp - 2), _scalar(T.INT32, 0)], out((1, 8, 8, 24))),
        (Op.SOFTMAX, [image((1, 100), zp), _tensor(T.FLOAT32, np.float32(1))],
         OperandType(code, [1, 100], 1 / 256, -128 if dtype == np.int8 else 0)),
        (Op.DEQUANTIZE, [image((1, 7, 7, 48), zp)], OperandType(T.TENSOR_FLOAT32, [1, 7, 7, 48])),
        (Op.QUANTIZE, [_tensor(T.TENSOR_FLOAT32, rng.standard_normal((1, 48)).astype(np.float32))], out((1, 48))),
        (Op.AVERAGE_POOL_2D, [image((1, 7, 7, 48), zp), *[_scalar(T.INT32, v) for v in (2, 1, 1, 7, 7, 0)]],
         OperandType(code, [1, 1, 1, 48], 0.02, zp)),
    ]
    for code_, inputs, output in cases:
        assert _plan(code_, inputs, output) is not None, code_
assert _plan(Op.MEAN, [_tensor(T.TENSOR_FLOAT32, rng.standard_normal((1, 7, 7, 48)).astype(np.float32)),
                       _tensor(T.TENSOR_INT32, np.array([1, 2], np.int32)), _scalar(T.INT32, 0)],
             OperandType(T.TENSOR_FLOAT32, [1, 48])) is not None
print(len(at_start), sorted(name for name, _ in loaded() - at_start))
"""


def test_the_library_loaded_at_start_holds_what_quantized_models_bind():
    """``_jit.load_library`` (nnapi-reference's start) loads the kernels of quantized
    convolution models, so that their first preparation loads none: in a fresh process,
    after it, preparing a MobileNet's kinds of operations (padded and 1x1 convolutions, one
    too large for exact float32 sums, depthwise, a classifier as a 1x1 convolution and as
    FULLY_CONNECTED, ADD, SOFTMAX, DEQUANTIZE, QUANTIZE, the global AVERAGE_POOL_2D, float
    MEAN), int8 with per-channel
    filters and uint8, at other shapes and values than its own, loads no further version
    of any kernel."""
    import subprocess
    import sys

    run = subprocess.run([sys.executable, "-c", _LIBRARY_CHILD], capture_output=True, text=True, check=False)
    assert run.returncode == 0, run.stderr
    count, rest = run.stdout.strip().split(maxsplit=1)
    assert int(count) >= 10 and rest == "[]", run.stdout
# --- the prepared LSTM's time step ------------------------------------------------------------
@pytest.mark.parametrize("variant", ["plain", "cifg"])
@pytest.mark.parametrize("activation", [0, 1, 4, 6])  # none, relu, tanh, sigmoid
@pytest.mark.parametrize("clip", [0.0, 0.3])
def test_lstm_step_matches_numpy(variant, activation, clip, monkeypatch):
    """The compiled step arithmetic against numpy's prepared step and ``execute``
    (``run_lstm``): the same float32 values bit for bit, cell clipping included."""
    from test_prepared_kernels import _sequence_lstm_inputs

    code = Op.UNIDIRECTIONAL_SEQUENCE_LSTM
    inputs, outputs = _sequence_lstm_inputs(variant, True, activation)
    inputs[21] = _scalar_float(clip)  # the cell clip
    compiled = get_operation(code).plan(ExecutionContext(code, inputs, outputs))
    with monkeypatch.context() as patch:
        patch.setenv(_jit.DISABLE_VARIABLE, "1")
        numpy_plan = get_operation(code).plan(ExecutionContext(code, inputs, outputs))
    cells = [cell.cell_contents for plan in (compiled, numpy_plan) for cell in plan.__closure__
             if isinstance(cell.cell_contents, PreparedLstm)]
    assert cells[0].compiled is not None and cells[1].compiled is None
    want = get_operation(code).execute(ExecutionContext(code, inputs, outputs))
    values = [tensor.value for tensor in inputs]
    for got in (compiled(values), numpy_plan(values)):
        for fast, slow in zip(got, want, strict=True):
            np.testing.assert_array_equal(fast.view(np.uint32), slow.view(np.uint32))
    if clip:
        assert np.abs(want[2]).max() == np.float32(clip)  # the clip was reached


def _scalar_float(value: float) -> Tensor:
    return Tensor(T.FLOAT32, (), 0.0, 0, None, np.array(value, np.float32))


# --- numpy's own machine code in compiled loops, the whole LSTM time loop --------------------
def test_native_loops_reproduce_numpy():
    """The exp / tanh loops and BLAS products ``_native_loops`` finds compute numpy's values
    bit for bit, at lengths and offsets other than its own check's (SIMD tails, unaligned
    starts) and on saturating, tiny and special values."""
    from nnapi.operations import _native_loops

    found = _native_loops.natives()
    assert found is not None  # numpy's wheels: the float loops and scipy-openblas64 are there
    values = np.concatenate([RNG.standard_normal(4099).astype(np.float32) * np.float32(30),
                             np.array([np.nan, np.inf, -np.inf, 1e-45, -0.0, 88.8, -104.5], np.float32)])
    for ufunc, function, data in ((np.exp, found.exp, found.exp_data), (np.tanh, found.tanh, found.tanh_data)):
        for start, count in ((0, values.size), (1, 7), (3, 65), (5, 1000), (11, 1)):
            part = values[start:start + count].copy()
            want = ufunc(part)
            got = _native_loops._run_loop(function, data, part)
            np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
    assert _native_loops._products_match(found.sgemv, found.sgemm)


def _lstm_direction(cifg: bool, units: int, size: int, out: int, clip: float):
    from nnapi.operations.lstm_cell import ACT_TANH, AUX_NAMES, NORM_NAMES, WEIGHT_NAMES, LstmDirection

    weights: dict = dict.fromkeys((*WEIGHT_NAMES, *NORM_NAMES, *AUX_NAMES))
    for gate in ("input", "forget", "cell", "output"):
        if gate == "input" and cifg:
            continue
        weights[f"input_to_{gate}"] = (RNG.standard_normal((units, size)) * 0.6).astype(np.float32)
        weights[f"recurrent_to_{gate}"] = (RNG.standard_normal((units, out)) * 0.6).astype(np.float32)
        weights[f"{gate}_bias"] = RNG.standard_normal(units).astype(np.float32)
    return LstmDirection(weights, ACT_TANH, clip, 0.0)


@pytest.mark.parametrize("cifg", [False, True])
@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("clip", [0.0, 0.3])
@pytest.mark.parametrize("deadline", [False, True])
def test_lstm_sequence_matches_numpy(cifg, batch, clip, deadline):
    """The compiled time loop (``lstm_sequence``: numpy's exp, tanh and BLAS called from
    numba) against the numpy loop and ``run_lstm``, bit for bit: one row (sgemv) and
    several (sgemm), CIFG, cell clipping, inputs large enough to saturate every gate, and
    under a deadline (the loop in calls of ``_STEPS_PER_CHECK`` steps)."""
    from nnapi.operations import lstm_cell
    from nnapi.operations.base import deadline_checked

    units, size = 24, 5
    d = _lstm_direction(cifg, units, size, units, clip)
    cell = PreparedLstm(d)
    assert cell.sequence is not None
    steps = 2 * lstm_cell._STEPS_PER_CHECK + 3
    inputs = (RNG.standard_normal((steps, batch, size)) * np.float32(4)).astype(np.float32)
    inputs[steps // 2] *= np.float32(50)  # gates at 0 and 1, exp overflowing to inf
    h0 = RNG.uniform(-1, 1, (batch, units)).astype(np.float32)
    c0 = RNG.uniform(-1, 1, (batch, units)).astype(np.float32)
    given = h0.copy(), c0.copy()
    calls = []
    with deadline_checked((lambda: calls.append(1)) if deadline else None):
        got = cell(inputs, h0, c0)
    for before, after in zip(given, (h0, c0), strict=True):  # the states given are not written
        np.testing.assert_array_equal(before, after)
    assert (len(calls) == 3) == deadline  # ceil(35 / 16) checks under a deadline
    want = cell._numpy_loop(*cell._buffers(inputs, h0, c0))
    reference = lstm_cell.run_lstm(d, inputs, h0, c0)[:3]
    for fast, slow, ref in zip(got, want, reference, strict=True):
        np.testing.assert_array_equal(fast.view(np.uint32), slow.view(np.uint32))
        np.testing.assert_array_equal(fast.view(np.uint32), ref.view(np.uint32))
    if clip:
        assert np.abs(got[2]).max() == np.float32(clip)


def test_lstm_sequence_deadline_ends_the_loop():
    """A deadline that passes during the loop raises out of it between two calls."""
    from nnapi.operations.base import deadline_checked

    cell = PreparedLstm(_lstm_direction(False, 8, 3, 8, 0.0))
    inputs = RNG.standard_normal((40, 1, 3)).astype(np.float32)
    calls = []

    def check() -> None:
        calls.append(1)
        if len(calls) == 2:
            raise TimeoutError("deadline")

    with deadline_checked(check), pytest.raises(TimeoutError):
        cell(inputs, np.zeros((1, 8), np.float32), np.zeros((1, 8), np.float32))
    assert len(calls) == 2


def test_lstm_sequence_falls_back(monkeypatch):
    """Without numpy's machine code, or where the compiled loop does not reproduce the
    numpy loop at preparation, the cell keeps the step-wise path (same values)."""
    from nnapi.operations import lstm_cell

    d = _lstm_direction(False, 8, 3, 8, 0.0)
    inputs = RNG.standard_normal((6, 2, 3)).astype(np.float32)
    states = np.zeros((2, 8), np.float32), np.zeros((2, 8), np.float32)
    want = PreparedLstm(d)(inputs, *states)
    monkeypatch.setattr(lstm_cell, "natives", lambda: None)
    assert PreparedLstm(d).sequence is None
    monkeypatch.undo()
    monkeypatch.setattr(PreparedLstm, "_reproduces", lambda self, run, batch: False)
    cell = PreparedLstm(d)
    assert cell.sequence is None and cell.compiled is not None
    for fast, slow in zip(cell(inputs, *states), want, strict=True):
        np.testing.assert_array_equal(fast.view(np.uint32), slow.view(np.uint32))


@pytest.mark.parametrize("shape", [(1, 64), (3, 5, 7), (2, 100003), (0, 4)])
def test_compiled_logistic_matches_numpy(shape):
    """LOGISTIC prepared with the compiled kernel (numpy's exp loop inside) against the
    numpy kernel and ``execute``, bit for bit: saturating, tiny, infinite and NaN inputs,
    and a strided input."""
    from nnapi.operations.activations import _compiled_logistic, _logistic_in_place

    compiled = _compiled_logistic()
    assert compiled is not None
    x = (RNG.standard_normal(shape) * np.float32(30)).astype(np.float32)
    if x.size:
        x.reshape(-1)[:6] = [np.nan, np.inf, -np.inf, 1e-45, -0.0, 104.0]
    for value in (x, x[..., ::2]):
        want = _logistic_in_place(value)
        got = compiled(value)
        assert got.shape == want.shape and got.dtype == np.float32
        np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
    kernel = get_operation(Op.LOGISTIC).plan(
        ExecutionContext(Op.LOGISTIC, [Tensor(T.TENSOR_FLOAT32, shape, 0.0, 0, None, x)],
                         [OperandType(T.TENSOR_FLOAT32, list(shape))]))
    reference = get_operation(Op.LOGISTIC).execute(
        ExecutionContext(Op.LOGISTIC, [Tensor(T.TENSOR_FLOAT32, shape, 0.0, 0, None, x)],
                         [OperandType(T.TENSOR_FLOAT32, list(shape))]))
    np.testing.assert_array_equal(kernel([x])[0].view(np.uint32), reference[0].view(np.uint32))
