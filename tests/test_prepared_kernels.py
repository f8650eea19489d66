"""The prepared (optimized) kernels against the reference path, TFLite style: the same
operation on the same random inputs through ``Operation.plan`` (what nnapi-reference runs
for static shapes and constant weights) and through ``prepare`` + ``execute`` (what it runs
when shapes are only known at execution). Quantized results must agree exactly; float
results to rounding."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np
import pytest

from nnapi import OperandCode as T
from nnapi import OperandType
from nnapi import OperationCode as Op
from nnapi.codes import FuseCode
from nnapi.operand import SymmPerChannelQuantParams
from nnapi.operations import _jit, get_operation
from nnapi.operations.base import ExecutionContext, Operation, OperationFailed, Tensor

RNG = np.random.default_rng(11)


@pytest.fixture(autouse=True)
def _values_of_the_test_own(request):
    """Each test draws the same values whichever tests its worker ran before (the checks
    that a case is not degenerate, such as distinct outputs, depend on them): the module's
    generator is seeded from the test's id."""
    global RNG
    RNG = np.random.default_rng(list(request.node.nodeid.encode()))


@pytest.fixture(autouse=True)
def _kernels_run_as_the_driver_runs_them():
    """Kernels here are called directly, without the driver's np.errstate(all="ignore"):
    the NaN / inf inputs these tests feed on purpose would otherwise print numpy warnings."""
    with np.errstate(all="ignore"):
        yield


def _tensor(code, value, scale=0.0, zero_point=0, channel_quant=None) -> Tensor:
    value = np.asarray(value)
    return Tensor(code, tuple(value.shape), scale, zero_point, channel_quant, value)


def _scalar(code, value) -> Tensor:
    dtype = {T.INT32: np.int32, T.BOOL: np.bool_, T.FLOAT32: np.float32}[code]
    return Tensor(code, (), 0.0, 0, None, np.array(value, dtype=dtype))


def _without_integer_products(monkeypatch) -> None:
    """Plans prepared after this take the float BLAS paths they take on processors
    without AVX-512 (``_jit.integer_products`` offers none)."""
    monkeypatch.setattr(_jit, "integer_products", lambda: None)


#: the inputs an operation is fed at run time in these tests (its other inputs are the
#: model's constants: weights, biases, parameters); any other operation: its first input
_RUN_TIME = {Op.LSTM: (0, 18, 19), Op.UNIDIRECTIONAL_SEQUENCE_LSTM: (0, 18, 19),
             Op.BIDIRECTIONAL_SEQUENCE_LSTM: (0, 35, 36, 37, 38, 39), Op.QUANTIZED_16BIT_LSTM: (0, 13, 14),
             Op.RNN: (0, 4), Op.UNIDIRECTIONAL_SEQUENCE_RNN: (0, 4), Op.BIDIRECTIONAL_SEQUENCE_RNN: (0, 4, 8, 9),
             Op.SVDF: (0, 4)}
_BOTH_OPERANDS = {Op.ADD, Op.SUB, Op.MUL, Op.DIV, Op.MAXIMUM, Op.MINIMUM, Op.POW, Op.EQUAL, Op.NOT_EQUAL,
                  Op.LESS, Op.LESS_EQUAL, Op.GREATER, Op.GREATER_EQUAL, Op.LOGICAL_AND, Op.LOGICAL_OR,
                  Op.BATCH_MATMUL}


def _run_time_positions(code: Op, inputs: list[Tensor]) -> list[int]:
    """The positions of ``inputs`` that hold run-time values (never omitted ones)."""
    if code in _RUN_TIME:
        positions = _RUN_TIME[code]
    elif code == Op.CONCATENATION:  # every tensor but the axis
        positions = range(len(inputs) - 1)
    elif code == Op.PACK:  # every tensor after the axis
        positions = range(1, len(inputs))
    elif code in _BOTH_OPERANDS:
        positions = (0, 1)
    else:
        positions = (0,)
    return [i for i in positions if i < len(inputs) and inputs[i].value is not None]


def _unreadable_run_time_values(code: Op, inputs: list[Tensor]) -> list[Tensor]:
    """``inputs`` as preparation sees them: the driver's unreadable marker (any use raises)
    in place of each run-time value, so ``prepare`` and ``plan`` can only read constants."""
    from nnapi.drivers.reference import _UNKNOWN

    runtime = _run_time_positions(code, inputs)
    return [dataclasses.replace(tensor, value=_UNKNOWN) if i in runtime else tensor
            for i, tensor in enumerate(inputs)]


def _fresh_values(code: Op, inputs: list[Tensor]) -> list[Tensor]:
    """``inputs`` with new random run-time values (of each value's dtype, shape and range)."""
    fresh = list(inputs)
    for i in _run_time_positions(code, inputs):
        value = np.asarray(inputs[i].value)
        if value.dtype.kind == "f":
            finite = np.abs(value[np.isfinite(value)])
            scale = float(finite.max()) if finite.size else 1.0
            new = (RNG.standard_normal(value.shape) * max(scale, 0.1)).astype(value.dtype)
        elif value.dtype.kind == "b":
            new = RNG.integers(0, 2, value.shape).astype(np.bool_)
        else:  # quantized values over their stored range; plain integers (indices) within theirs
            info = np.iinfo(value.dtype)
            widen = 5 if inputs[i].type != T.TENSOR_INT32 else 0
            low = max(info.min, int(value.min()) - widen) if value.size else 0
            high = min(info.max, int(value.max()) + widen) if value.size else 0
            new = RNG.integers(low, high + 1, value.shape).astype(value.dtype)
        fresh[i] = dataclasses.replace(inputs[i], value=new)
    return fresh


def _plan_of_constants(code: Op, inputs: list[Tensor], outputs: list[OperandType]):
    """The operation's output shapes and plan prepared as the driver prepares them: from
    the constants, the run-time inputs unreadable (``_UNKNOWN``)."""
    operation = get_operation(code)
    prepared_inputs = _unreadable_run_time_values(code, inputs)
    shapes = operation.prepare(ExecutionContext(code, prepared_inputs, outputs))
    kernel = operation.plan(ExecutionContext(code, prepared_inputs, outputs))
    assert kernel is not None
    return [tuple(int(d) for d in shape) for shape in shapes], kernel


def _runs_of_one_plan(code: Op, inputs: list[Tensor], outputs: list[OperandType]):
    """(plan's outputs, ``execute``'s outputs, output shapes) of one plan run on the test's
    run-time values, then on fresh ones: a plan that kept a run-time value of its
    preparation or of an earlier run disagrees with ``execute`` on one of them."""
    operation = get_operation(code)
    shapes, kernel = _plan_of_constants(code, inputs, outputs)
    runs = []
    for values in (inputs, _fresh_values(code, inputs)):
        reference = operation.execute(ExecutionContext(code, values, outputs))
        runs.append((kernel([tensor.value for tensor in values]), reference, shapes))
    return runs


def _planned_and_executed(code: Op, inputs: list[Tensor], outputs: list[OperandType],
                          agree: Callable[[list, list], None] | None = None) -> tuple[list, list]:
    """The outputs of the operation's plan (prepared from the constants only) and of
    ``execute`` on the test's inputs, after ``agree`` (default: ``_assert_same_bits``)
    checked the same plan against ``execute`` on fresh run-time values."""
    (prepared, reference, _), (fresh, fresh_reference, _) = _runs_of_one_plan(code, inputs, outputs)
    (agree or _assert_same_bits)(fresh, fresh_reference)
    return prepared, reference


def _compare(code: Op, inputs: list[Tensor], output: OperandType | list[OperandType]) -> None:
    """The plan (prepared from the constants only) against ``execute``, on the test's
    run-time values and on fresh ones: float results to rounding, others exactly."""
    outputs = output if isinstance(output, list) else [output]
    for prepared, reference, shapes in _runs_of_one_plan(code, inputs, outputs):
        assert len(prepared) == len(reference) == len(shapes)
        for fast, slow, shape in zip(prepared, reference, shapes, strict=True):
            assert fast.dtype == slow.dtype and fast.shape == slow.shape == tuple(shape)
            if fast.dtype.kind == "f":
                # The tolerance scales with the finite values only: an inf in the result (an
                # inf input) would make atol infinite and let any finite value pass.
                finite = np.abs(slow[np.isfinite(slow)])
                scale = float(finite.max()) if finite.size else 1.0
                np.testing.assert_allclose(fast, slow, rtol=2e-5, atol=1e-4 * max(1.0, scale))
            else:
                np.testing.assert_array_equal(fast, slow)


def _quant_case(kind: str, x_shape, w_shape, channels: int, channel_dim: int, taps: int):
    """(input, filter, bias tensors, output type factory) of one quantization kind."""
    if kind == "float32" or kind == "float16":
        code = T.TENSOR_FLOAT32 if kind == "float32" else T.TENSOR_FLOAT16
        dtype = np.float32 if kind == "float32" else np.float16
        x = _tensor(code, RNG.standard_normal(x_shape).astype(dtype))
        w = _tensor(code, RNG.standard_normal(w_shape).astype(dtype))
        b = _tensor(code, RNG.standard_normal(channels).astype(dtype))
        return x, w, b, lambda shape: OperandType(code, shape)
    if kind == "quant8":
        x = _tensor(T.TENSOR_QUANT8_ASYMM, RNG.integers(0, 256, x_shape).astype(np.uint8), 0.02, 131)
        w = _tensor(T.TENSOR_QUANT8_ASYMM, RNG.integers(0, 256, w_shape).astype(np.uint8), 0.01, 117)
        b = _tensor(T.TENSOR_INT32, RNG.integers(-9000, 9000, channels).astype(np.int32),
                    float(np.float32(0.02) * np.float32(0.01)))
        out_scale = 0.0002 * np.sqrt(taps) * 60
        return x, w, b, lambda shape: OperandType(T.TENSOR_QUANT8_ASYMM, shape, out_scale, 120)
    scales = tuple(float(s) for s in RNG.uniform(0.002, 0.03, channels))
    x = _tensor(T.TENSOR_QUANT8_ASYMM_SIGNED, RNG.integers(-128, 128, x_shape).astype(np.int8), 0.03, -5)
    w = _tensor(T.TENSOR_QUANT8_SYMM_PER_CHANNEL, RNG.integers(-127, 128, w_shape).astype(np.int8), 0.0, 0,
                SymmPerChannelQuantParams(channel_dim, scales))
    b = _tensor(T.TENSOR_INT32, RNG.integers(-20000, 20000, channels).astype(np.int32), 0.0)
    out_scale = 0.03 * 0.015 * np.sqrt(taps) * 40
    return x, w, b, lambda shape: OperandType(T.TENSOR_QUANT8_ASYMM_SIGNED, shape, out_scale, 7)


KINDS = ["float32", "float16", "quant8", "quant8_signed_per_channel"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("kernel, stride, padding, dilation, nchw", [
    (3, 1, (1, 1, 1, 1), 1, False),
    (3, 2, (0, 1, 0, 1), 1, False),
    (1, 1, (0, 0, 0, 0), 1, False),
    (1, 1, (1, 0, 2, 0), 1, True),
    (3, 1, (2, 2, 2, 2), 2, True),
    (2, 3, (0, 0, 0, 0), 1, False),
])
@pytest.mark.parametrize("in_ch", [5, 3])  # 3: the columns gathered transposed (few input channels)
def test_prepared_conv_matches_reference(kind, kernel, stride, padding, dilation, nchw, in_ch):
    batches, size, out_ch = 2, 9, 7
    x_shape = (batches, in_ch, size, size) if nchw else (batches, size, size, in_ch)
    x, w, b, out_type = _quant_case(kind, x_shape, (out_ch, kernel, kernel, in_ch), out_ch, 0,
                                    kernel * kernel * in_ch)
    left, right, top, bottom = padding
    effective = (kernel - 1) * dilation + 1
    oh = (size - effective + top + bottom + stride) // stride
    ow = (size - effective + left + right + stride) // stride
    for fuse in (FuseCode.FUSED_NONE, FuseCode.FUSED_RELU6):
        args = [_scalar(T.INT32, v) for v in (left, right, top, bottom, stride, stride, fuse)]
        args += [_scalar(T.BOOL, nchw), _scalar(T.INT32, dilation), _scalar(T.INT32, dilation)]
        shape = [batches, out_ch, oh, ow] if nchw else [batches, oh, ow, out_ch]
        _compare(Op.CONV_2D, [x, w, b, *args], out_type(shape))


@pytest.mark.parametrize("kind", ["float32", "quant8"])
@pytest.mark.parametrize("kernel, stride", [(3, 1), (5, 2)])
def test_prepared_conv_of_an_image_in_blocks_matches_reference(kind, kernel, stride, monkeypatch):
    """An RGB image large enough for several blocks of output rows: through the integer
    products where the processor has AVX-512 (quantized), and through the transposed
    im2col blocks of the BLAS path."""
    size, out_ch = 100 * stride, 8
    x, w, b, out_type = _quant_case(kind, (1, size, size, 3), (out_ch, kernel, kernel, 3), out_ch, 0,
                                    kernel * kernel * 3)
    pad = kernel // 2
    out = (size + 2 * pad - kernel) // stride + 1
    args = [_scalar(T.INT32, v) for v in (pad, pad, pad, pad, stride, stride, FuseCode.FUSED_RELU)]
    _compare(Op.CONV_2D, [x, w, b, *args], out_type([1, out, out, out_ch]))
    _without_integer_products(monkeypatch)
    kernel_ = get_operation(Op.CONV_2D).plan(ExecutionContext(Op.CONV_2D, [x, w, b, *args],
                                                              [out_type([1, out, out, out_ch])]))
    assert kernel_.planar and kernel_.block_rows < out  # the case meant: several transposed blocks
    _compare(Op.CONV_2D, [x, w, b, *args], out_type([1, out, out, out_ch]))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("multiplier, stride, nchw, dilation", [(1, 1, False, 1), (1, 2, False, 1),
                                                                 (3, 1, False, 1), (2, 2, True, 2)])
def test_prepared_depthwise_matches_reference(kind, multiplier, stride, nchw, dilation):
    batches, size, in_ch = 2, 11, 4
    out_ch = in_ch * multiplier
    x_shape = (batches, in_ch, size, size) if nchw else (batches, size, size, in_ch)
    x, w, b, out_type = _quant_case(kind, x_shape, (1, 3, 3, out_ch), out_ch, 3, 9)
    pad = dilation  # SAME-like explicit padding
    effective = 2 * dilation + 1
    out = (size - effective + 2 * pad + stride) // stride
    for fuse in (FuseCode.FUSED_NONE, FuseCode.FUSED_RELU):
        args = [_scalar(T.INT32, v) for v in (pad, pad, pad, pad, stride, stride, multiplier, fuse)]
        args += [_scalar(T.BOOL, nchw), _scalar(T.INT32, dilation), _scalar(T.INT32, dilation)]
        shape = [batches, out_ch, out, out] if nchw else [batches, out, out, out_ch]
        _compare(Op.DEPTHWISE_CONV_2D, [x, w, b, *args], out_type(shape))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("in_ch, multiplier, stride, nchw", [(6, 1, 1, False), (6, 2, 2, False), (5, 3, 1, True),
                                                             (64, 1, 1, False)])
def test_prepared_grouped_conv_of_one_channel_per_group_matches_reference(kind, in_ch, multiplier, stride, nchw):
    """GROUPED_CONV_2D with as many groups as input channels (a depthwise convolution in
    grouped form) through DEPTHWISE_CONV_2D's prepared kernel against ``execute``; the
    per-channel filter's scales (channelDim 0 there) follow its output channels."""
    batches, size = 2, 9
    out_ch = in_ch * multiplier
    x_shape = (batches, in_ch, size, size) if nchw else (batches, size, size, in_ch)
    x, w, b, out_type = _quant_case(kind, x_shape, (out_ch, 3, 3, 1), out_ch, 0, 9)
    out = (size - 3 + 2 + stride) // stride
    for fuse in (FuseCode.FUSED_NONE, FuseCode.FUSED_RELU6):
        args = [_scalar(T.INT32, v) for v in (1, 1, 1, 1, stride, stride, in_ch, fuse)] + [_scalar(T.BOOL, nchw)]
        shape = [batches, out_ch, out, out] if nchw else [batches, out, out, out_ch]
        if kind != "float16":
            _compare(Op.GROUPED_CONV_2D, [x, w, b, *args], out_type(shape))
            continue
        # float16: the float32 sums (BLAS's order against the depthwise kernel's) may
        # round to neighbouring float16 values: one float16 step apart at most

        def one_step_apart(prepared: list, reference: list, shape: tuple = tuple(shape)) -> None:
            (fast,), (slow,) = prepared, reference
            assert fast.dtype == slow.dtype == np.float16 and fast.shape == slow.shape == shape
            np.testing.assert_allclose(fast.astype(np.float32), slow.astype(np.float32), rtol=2.0**-10,
                                       atol=2.0**-14)

        one_step_apart(*_planned_and_executed(Op.GROUPED_CONV_2D, [x, w, b, *args], [out_type(shape)],
                                              one_step_apart))


def test_grouped_conv_of_several_channels_per_group_runs_execute():
    x, w, b, out_type = _quant_case("quant8", (1, 5, 5, 4), (6, 3, 3, 2), 6, 0, 18)
    args = [_scalar(T.INT32, v) for v in (1, 1, 1, 1, 1, 1, 2, FuseCode.FUSED_NONE)] + [_scalar(T.BOOL, False)]
    context = ExecutionContext(Op.GROUPED_CONV_2D, [x, w, b, *args], [out_type([1, 5, 5, 6])])
    assert get_operation(Op.GROUPED_CONV_2D).plan(context) is None


@pytest.mark.parametrize("code", [Op.MAX_POOL_2D, Op.AVERAGE_POOL_2D, Op.L2_POOL_2D])
@pytest.mark.parametrize("kind", ["float32", "float16", "quant8", "quant8_signed"])
@pytest.mark.parametrize("filt, stride, pad, nchw, batches", [
    (2, 2, 0, False, 2),   # windows tile the input (odd size: the last row and column are dropped)
    (3, 2, 1, False, 2),   # overlapping windows over padding
    (3, 1, 1, True, 1),
    (9, 9, 0, False, 2),   # global
    (9, 1, 0, False, 2),   # global with stride 1 (the converter's VALID 7x7 of a 7x7 map)
    (9, 1, 0, True, 1),    # ... in NCHW
    (4, 1, 0, False, 0),   # empty batch
])
def test_prepared_pooling_matches_reference(code, kind, filt, stride, pad, nchw, batches):
    if code == Op.L2_POOL_2D and kind.startswith("quant"):
        pytest.skip("L2_POOL_2D is float only")
    size, channels = 9, 3
    shape = (batches, channels, size, size) if nchw else (batches, size, size, channels)
    if kind.startswith("float"):
        code_type = T.TENSOR_FLOAT32 if kind == "float32" else T.TENSOR_FLOAT16
        x = _tensor(code_type, RNG.standard_normal(shape).astype(np.float32 if kind == "float32" else np.float16))
        out_type = lambda dims: OperandType(code_type, dims)  # noqa: E731
    else:
        code_type = T.TENSOR_QUANT8_ASYMM if kind == "quant8" else T.TENSOR_QUANT8_ASYMM_SIGNED
        dtype = np.uint8 if kind == "quant8" else np.int8
        info = np.iinfo(dtype)
        x = _tensor(code_type, RNG.integers(info.min, info.max + 1, shape).astype(dtype), 0.05, 3)
        out_type = lambda dims: OperandType(code_type, dims, 0.05, 3)  # noqa: E731
    out = (size + 2 * pad - filt) // stride + 1
    for fuse in (FuseCode.FUSED_NONE, FuseCode.FUSED_RELU1):
        args = [_scalar(T.INT32, v) for v in (pad, pad, pad, pad, stride, stride, filt, filt, fuse)]
        dims = [batches, channels, out, out] if nchw else [batches, out, out, channels]
        _compare(code, [x, *args, _scalar(T.BOOL, nchw)], out_type(dims))


@pytest.mark.parametrize("kind", KINDS[:3])
@pytest.mark.parametrize("x_shape", [(3, 20), (2, 2, 5, 4)])
def test_prepared_fully_connected_matches_reference(kind, x_shape):
    units, input_size = 6, x_shape[-1] if len(x_shape) == 2 else 20
    x, w, b, out_type = _quant_case(kind, x_shape, (units, input_size), units, 0, input_size)
    rows = int(np.prod(x_shape)) // input_size
    for fuse in (FuseCode.FUSED_NONE, FuseCode.FUSED_RELU1):
        _compare(Op.FULLY_CONNECTED, [x, w, b, _scalar(T.INT32, fuse)], out_type([rows, units]))


def test_prepared_depthwise_large_accumulators_use_exact_float64():
    """A filter and input at full quant8 range over many taps: the exact-dtype choice
    must not round (float32 would, past 2**24)."""
    x = _tensor(T.TENSOR_QUANT8_ASYMM, np.full((1, 70, 70, 2), 255, np.uint8), 1.0, 0)
    w = _tensor(T.TENSOR_QUANT8_ASYMM, np.full((1, 64, 64, 2), 255, np.uint8), 1.0, 0)
    b = _tensor(T.TENSOR_INT32, np.array([1, -1], np.int32), 1.0)
    args = [_scalar(T.INT32, v) for v in (0, 0, 0, 0, 1, 1, 1, 0)]
    _compare(Op.DEPTHWISE_CONV_2D, [x, w, b, *args],
             OperandType(T.TENSOR_QUANT8_ASYMM, [1, 7, 7, 2], 2.0**20, 0))


@pytest.mark.parametrize("margin", [-1, 0, 1])
def test_prepared_fully_connected_exact_dtype_follows_the_filter_sums(margin, monkeypatch):
    """The float32 / float64 choice bounds every partial sum by max|x - zp| times the
    largest per-unit sum of |w - zp|: at the float32 limit (2**24) the results stay exact,
    and the dtype switches exactly there (a sparse filter over many taps stays float32)."""
    input_size = 4096
    limit = 2**24 // 255  # units of |w| one unit may sum to with inputs at 255
    total = limit + margin
    row = np.zeros(input_size, np.int64)
    row[: total // 127] = 127
    row[total // 127] = total % 127
    w_values = np.stack([row, -row, row[::-1]]).astype(np.int16) + 128
    x = _tensor(T.TENSOR_QUANT8_ASYMM, np.full((2, input_size), 255, np.uint8), 0.5, 0)
    x.value[1, ::3] = 0
    w = _tensor(T.TENSOR_QUANT8_ASYMM, w_values.astype(np.uint8), 0.25, 128)
    b = _tensor(T.TENSOR_INT32, np.array([7, -7, 0], np.int32), 0.125)
    args = [x, w, b, _scalar(T.INT32, FuseCode.FUSED_NONE)]
    output = OperandType(T.TENSOR_QUANT8_ASYMM, [2, 3], 2.0**16, 128)
    _compare(Op.FULLY_CONNECTED, args, output)
    _without_integer_products(monkeypatch)
    _compare(Op.FULLY_CONNECTED, args, output)
    kernel = get_operation(Op.FULLY_CONNECTED).plan(ExecutionContext(Op.FULLY_CONNECTED, args, [output]))
    kernel._lay_out()  # two rows: with nnapi[fast] the compiled product runs, the BLAS one is laid out on demand
    if 255 * total < 2**24:
        assert kernel.work == np.float32 and kernel.parts is None
    else:  # float64, or with the compiled kernels (nnapi[fast]) exact float32 parts
        assert kernel.work == np.float64 and kernel.parts is None or \
            kernel.work == np.float32 and len(kernel.parts) >= 2


@pytest.mark.parametrize("code", [Op.ADD, Op.SUB, Op.MUL, Op.DIV])
@pytest.mark.parametrize("kind", ["float32", "float16", "quant8", "quant8_signed"])
@pytest.mark.parametrize("shapes", [((2, 3, 4), (4,)), ((1, 300, 300, 1), (1, 1, 1, 1)), ((), ())])
def test_prepared_arithmetic_matches_reference(code, kind, shapes):
    if code == Op.DIV and kind.startswith("quant8"):
        pytest.skip("DIV has no quantized form")
    tensors = []
    for number, shape in enumerate(shapes):
        if kind.startswith("float"):
            operand = T.TENSOR_FLOAT32 if kind == "float32" else T.TENSOR_FLOAT16
            value = RNG.standard_normal(shape).astype(np.float32 if kind == "float32" else np.float16)
            tensors.append(_tensor(operand, value))
        elif kind == "quant8":
            tensors.append(_tensor(T.TENSOR_QUANT8_ASYMM, RNG.integers(0, 256, shape).astype(np.uint8),
                                   0.05 + 0.02 * number, 100 + number))
        else:
            tensors.append(_tensor(T.TENSOR_QUANT8_ASYMM_SIGNED, RNG.integers(-128, 128, shape).astype(np.int8),
                                   0.05 + 0.02 * number, -3 + number))
    shape = list(np.broadcast_shapes(*shapes))
    first = tensors[0]
    out = OperandType(first.type, shape, 0.5 if kind.startswith("quant8") else 0.0,
                      first.zero_point if kind.startswith("quant8") else 0)
    for fuse in (FuseCode.FUSED_NONE, FuseCode.FUSED_RELU):
        _compare(code, [*tensors, _scalar(T.INT32, fuse)], out)


@pytest.mark.parametrize("code, second", [(Op.RESHAPE, np.array([3, -1], np.int32)),
                                          (Op.SQUEEZE, np.array([1], np.int32)),
                                          (Op.EXPAND_DIMS, np.array(0, np.int32))])
def test_prepared_reshapes_match_reference(code, second):
    data = _tensor(T.TENSOR_FLOAT32, RNG.standard_normal((3, 1, 4)).astype(np.float32))
    operand = T.INT32 if second.ndim == 0 else T.TENSOR_INT32
    shape = {Op.RESHAPE: [3, 4], Op.SQUEEZE: [3, 4], Op.EXPAND_DIMS: [1, 3, 1, 4]}[code]
    _compare(code, [data, _tensor(operand, second)], OperandType(T.TENSOR_FLOAT32, shape))


@pytest.mark.parametrize("code", [Op.RELU, Op.RELU1, Op.RELU6, Op.LOGISTIC, Op.TANH, Op.HARD_SWISH])
@pytest.mark.parametrize("kind", ["float32", "float16", "quant8", "quant8_signed"])
def test_prepared_activations_match_reference(code, kind):
    shape = (2, 5, 7, 3)
    if kind.startswith("float"):
        operand = T.TENSOR_FLOAT32 if kind == "float32" else T.TENSOR_FLOAT16
        value = (RNG.standard_normal(shape) * 4).astype(np.float32 if kind == "float32" else np.float16)
        value.reshape(-1)[:3] = [np.nan, np.inf, -np.inf]
        data, out = _tensor(operand, value), OperandType(operand, list(shape))
    else:
        operand = T.TENSOR_QUANT8_ASYMM if kind == "quant8" else T.TENSOR_QUANT8_ASYMM_SIGNED
        dtype = np.uint8 if kind == "quant8" else np.int8
        info = np.iinfo(dtype)
        data = _tensor(operand, RNG.integers(info.min, info.max + 1, shape).astype(dtype), 0.05, 3)
        if code in (Op.LOGISTIC, Op.TANH):
            scale, zero = {(Op.LOGISTIC, "quant8"): (1 / 256, 0), (Op.LOGISTIC, "quant8_signed"): (1 / 256, -128),
                           (Op.TANH, "quant8"): (1 / 128, 128), (Op.TANH, "quant8_signed"): (1 / 128, 0)}[code, kind]
        elif code == Op.HARD_SWISH:
            scale, zero = 0.04, 5
        else:
            scale, zero = 0.05, 3
        out = OperandType(operand, list(shape), scale, zero)
    operation = get_operation(code)
    inputs = [data]
    if operation.plan(ExecutionContext(code, inputs, [out])) is None:
        pytest.skip("no prepared kernel (runs execute)")
    _compare(code, inputs, out)


@pytest.mark.parametrize("alpha_shape", [(3,), (1, 1, 3), (5, 7, 1)])
def test_prepared_prelu_matches_reference(alpha_shape):
    value = RNG.standard_normal((2, 5, 7, 3)).astype(np.float32)
    value.reshape(-1)[:4] = [np.nan, np.inf, -np.inf, -0.0]
    alpha = _tensor(T.TENSOR_FLOAT32, RNG.standard_normal(alpha_shape).astype(np.float32))
    _compare(Op.PRELU, [_tensor(T.TENSOR_FLOAT32, value), alpha], OperandType(T.TENSOR_FLOAT32, [2, 5, 7, 3]))


def _prelu_bits(x: np.ndarray, alpha: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """PRELU of x and alpha through ``plan`` and through ``execute``, as bit patterns."""
    operation = get_operation(Op.PRELU)
    inputs = [_tensor(T.TENSOR_FLOAT32, x), _tensor(T.TENSOR_FLOAT32, alpha)]
    out = OperandType(T.TENSOR_FLOAT32, list(np.broadcast_shapes(x.shape, alpha.shape)))
    with np.errstate(all="ignore"):  # as the driver runs kernels (inf * 0 and NaN are inputs here)
        reference = operation.execute(ExecutionContext(Op.PRELU, inputs, [out]))[0]
        prepared = operation.plan(ExecutionContext(Op.PRELU, inputs, [out]))([x, alpha])[0]
    assert prepared.dtype == reference.dtype == np.float32 and prepared.shape == reference.shape
    return prepared.view(np.int32), reference.view(np.int32)


_PRELU_SPECIALS = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, -1e-45, 3.4e38, -3.4e38, 1.0, -1.0],
                           np.float32)


@pytest.mark.parametrize("alphas", ["below_one", "mixed", "above_one", "with_zero", "not_finite"])
@pytest.mark.parametrize("alpha_shape", [(4,), (1, 1, 4), (3, 1, 1)])
def test_prepared_prelu_is_bit_exact(alphas, alpha_shape):
    """Every alpha regime (max(alpha x, x), its mirror for alpha > 1, the slope fallback
    for alpha 0 and non-finite alphas) against ``execute`` bit for bit, signed zeros,
    infinities, NaN and extremes included."""
    x = (RNG.standard_normal((2, 3, 5, 4)) * 3).astype(np.float32)
    x.reshape(-1)[:_PRELU_SPECIALS.size] = _PRELU_SPECIALS
    x.reshape(-1)[-_PRELU_SPECIALS.size:] = _PRELU_SPECIALS[::-1]
    pool = {"below_one": [-2.5, -1.0, -0.25, 1e-30, 0.3, 1.0], "mixed": [-1.5, -0.5, 0.5, 1.0, 1.5, 7.0],
            "above_one": [1.0000001, 2.0, 3.5, 100.0], "with_zero": [0.0, -0.0, 0.5, 2.0],
            "not_finite": [np.inf, -np.inf, np.nan, 0.5]}[alphas]
    alpha = RNG.choice(np.array(pool, np.float32), size=alpha_shape).astype(np.float32)
    alpha.reshape(-1)[:len(pool)] = pool[:alpha.size]
    fast, slow = _prelu_bits(x, alpha)
    np.testing.assert_array_equal(fast, slow)


def test_prepared_prelu_alpha_broadcasting_the_input_up():
    x = RNG.standard_normal((5, 1)).astype(np.float32)
    alpha = np.array([[-0.5, 0.25, 2.0]], np.float32)
    fast, slow = _prelu_bits(x, alpha)
    assert fast.shape == (5, 3)
    np.testing.assert_array_equal(fast, slow)


def _dequantized_weights_model():
    """x [2, 3] -> FULLY_CONNECTED with weights DEQUANTIZE(constant uint8 [4, 3])."""
    import nnapi

    model = nnapi.Model()
    x = model.add_operand(OperandType(T.TENSOR_FLOAT32, [2, 3]))
    stored = model.add_operand(OperandType(T.TENSOR_QUANT8_ASYMM, [4, 3], 0.5, 10))
    weights = model.add_operand(OperandType(T.TENSOR_FLOAT32, [4, 3]))
    bias = model.add_operand(OperandType(T.TENSOR_FLOAT32, [4]))
    fuse = model.add_operand(OperandType(T.INT32))
    y = model.add_operand(OperandType(T.TENSOR_FLOAT32, [2, 4]))
    stored_value = np.arange(12, dtype=np.uint8).reshape(4, 3) * 7
    model.set_operand_value(stored, stored_value)
    model.set_operand_value(bias, np.array([1, 2, 3, 4], np.float32))
    model.set_operand_value(fuse, np.int32(0))
    model.add_operation(Op.DEQUANTIZE, [stored], [weights])
    model.add_operation(Op.FULLY_CONNECTED, [x, weights, bias, fuse], [y])
    model.identify_inputs_and_outputs([x], [y])
    model.finish()
    return model, (stored_value.astype(np.float64) - 10) * 0.5


def test_operations_on_constants_are_folded_at_preparation():
    """DEQUANTIZE of constant weights runs once at preparation; the FULLY_CONNECTED that
    reads it is then prepared with constant weights (a prepared kernel), and the results
    are those of the model."""
    import nnapi
    from nnapi.drivers.reference import ReferenceDevice
    from nnapi.runtime.model_builder import build_hal_model

    model, real_weights = _dequantized_weights_model()
    prepared = ReferenceDevice().prepare_model(build_hal_model(model)[0])
    (step,) = prepared._plans[0].steps
    assert step.code == Op.FULLY_CONNECTED and step.kernel is not None
    x = RNG.standard_normal((2, 3)).astype(np.float32)
    compilation = nnapi.Compilation(model)
    compilation.finish()
    execution = nnapi.Execution(compilation)
    execution.set_input(0, x)
    y = np.empty((2, 4), np.float32)
    execution.set_output(0, y)
    execution.compute()
    np.testing.assert_allclose(y, x @ real_weights.T + [1, 2, 3, 4], rtol=1e-5)


def test_plans_specialize_to_the_input_shapes_of_each_call():
    """A model input of unspecified shape: each new shape gets a plan prepared for it (kept
    for the next execution of that shape) and the results follow the shape."""
    import nnapi

    model = nnapi.Model()
    x = model.add_operand(OperandType(T.TENSOR_FLOAT32, [0, 0]))
    one = model.add_operand(OperandType(T.TENSOR_FLOAT32, [1]))
    fuse = model.add_operand(OperandType(T.INT32))
    y = model.add_operand(OperandType(T.TENSOR_FLOAT32, [0, 0]))
    model.set_operand_value(one, np.array([1], np.float32))
    model.set_operand_value(fuse, np.int32(0))
    model.add_operation(Op.ADD, [x, one, fuse], [y])
    model.identify_inputs_and_outputs([x], [y])
    model.finish()
    compilation = nnapi.Compilation(model)
    compilation.finish()
    for shape in [(2, 3), (4, 1), (2, 3)]:
        value = RNG.standard_normal(shape).astype(np.float32)
        execution = nnapi.Execution(compilation)
        execution.set_input(0, value)
        out = np.empty(shape, np.float32)
        execution.set_output(0, out, OperandType(T.TENSOR_FLOAT32, list(shape)))
        execution.compute()
        np.testing.assert_array_equal(out, value + 1)


def _sequence_lstm_inputs(variant: str, time_major: bool, activation: int):
    """The 28 inputs of UNIDIRECTIONAL_SEQUENCE_LSTM (steps 5, batch 2, input 3, 4 units)."""
    steps, batch, size, units = 5, 2, 3, 4
    out = 3 if variant == "projection" else units
    f32 = T.TENSOR_FLOAT32

    def tensor(shape, scale=0.5):
        return _tensor(f32, (RNG.standard_normal(shape) * scale).astype(np.float32))

    omitted = Tensor(f32, (0,), 0.0, 0, None, None)
    cifg = variant == "cifg"
    weights = [omitted if cifg else tensor((units, size))] + [tensor((units, size)) for _ in range(3)]
    weights += [omitted if cifg else tensor((units, out))] + [tensor((units, out)) for _ in range(3)]
    weights += [omitted] * 3  # no peephole
    weights += [omitted if cifg else tensor((units,))] + [tensor((units,)) for _ in range(3)]
    weights += [tensor((out, units)), tensor((out,))] if variant == "projection" else [omitted, omitted]
    x_shape = (steps, batch, size) if time_major else (batch, steps, size)
    clips = (3.0, 0.4) if variant == "projection" else (0.0, 0.0)
    inputs = [tensor(x_shape, 2.0), *weights, tensor((batch, out)), tensor((batch, units)),
              _scalar(T.INT32, activation), _scalar(T.FLOAT32, clips[0]), _scalar(T.FLOAT32, clips[1]),
              _scalar(T.BOOL, time_major), omitted, omitted, omitted, omitted]
    seq_shape = [steps, batch, out] if time_major else [batch, steps, out]
    outputs = [OperandType(f32, seq_shape), OperandType(f32, [batch, out]), OperandType(f32, [batch, units])]
    return inputs, outputs


@pytest.mark.parametrize("variant", ["plain", "cifg", "projection"])
@pytest.mark.parametrize("time_major", [True, False])
@pytest.mark.parametrize("activation", [0, 4])  # none, tanh (the compiled loop's)
@pytest.mark.parametrize("merge, outputs", [(True, 1), (True, 5), (False, 2), (False, 6)])
@pytest.mark.parametrize("numpy_only", [False, True])
def test_prepared_bidirectional_lstm_matches_reference(variant, time_major, activation, merge, outputs, numpy_only,
                                                       monkeypatch):
    """BIDIRECTIONAL_SEQUENCE_LSTM prepared (two PreparedLstm loops, the backward one over
    the sequence in reverse) against ``execute`` (run_lstm forward and reverse), bit for bit:
    merged or separate outputs, with and without the final states, time- or batch-major,
    with and without the compiled loops."""
    from nnapi.operations import _jit

    if numpy_only:
        monkeypatch.setenv(_jit.DISABLE_VARIABLE, "1")
    forward, types = _sequence_lstm_inputs(variant, time_major, activation)
    backward, _ = _sequence_lstm_inputs(variant, time_major, activation)
    omitted = Tensor(T.TENSOR_FLOAT32, (0,), 0.0, 0, None, None)
    inputs = [forward[0], *forward[1:18], *backward[1:18], forward[18], forward[19], backward[18], backward[19],
              omitted, *[omitted] * 8, *forward[20:23], _scalar(T.BOOL, merge), _scalar(T.BOOL, time_major),
              *[omitted] * 8]
    sequence, state, cell = types
    if merge:
        declared = [OperandType(T.TENSOR_FLOAT32, [*sequence.dimensions[:2], 2 * sequence.dimensions[2]])]
    else:
        declared = [sequence, sequence]
    declared = (declared + [state, cell, state, cell])[:outputs]
    prepared, reference = _planned_and_executed(Op.BIDIRECTIONAL_SEQUENCE_LSTM, inputs, declared)
    assert len(prepared) == len(reference) == outputs
    for fast, slow in zip(prepared, reference, strict=True):
        assert fast.dtype == slow.dtype == np.float32 and fast.shape == slow.shape
        np.testing.assert_array_equal(fast.view(np.uint32), slow.view(np.uint32))
    assert not np.array_equal(reference[0][..., :2], reference[0][..., -2:])  # the directions differ


@pytest.mark.parametrize("variant", ["plain", "cifg", "projection"])
@pytest.mark.parametrize("time_major", [True, False])
@pytest.mark.parametrize("activation", [0, 1, 4, 6])  # none, relu, tanh, sigmoid
@pytest.mark.parametrize("outputs", [1, 3])
def test_prepared_sequence_lstm_matches_reference(variant, time_major, activation, outputs):
    inputs, output_types = _sequence_lstm_inputs(variant, time_major, activation)
    prepared, reference = _planned_and_executed(Op.UNIDIRECTIONAL_SEQUENCE_LSTM, inputs, output_types[:outputs])
    assert len(prepared) == len(reference) == outputs
    for fast, slow in zip(prepared, reference, strict=True):
        assert fast.dtype == slow.dtype == np.float32 and fast.shape == slow.shape
        np.testing.assert_array_equal(fast, slow)  # the same float32 operations


@pytest.mark.parametrize("variant", ["plain", "cifg", "projection", "peephole", "layer_norm"])
@pytest.mark.parametrize("kind", ["float32", "float16"])
def test_prepared_lstm_step_matches_reference(variant, kind):
    """LSTM (one time step) with constant weights of every variant: the stacked matrices
    made once by the plan; all four outputs (the scratch buffer's gate values included)
    bit for bit as ``execute``'s, with the states fed at run time."""
    code, dtype = (T.TENSOR_FLOAT32, np.float32) if kind == "float32" else (T.TENSOR_FLOAT16, np.float16)
    batch, size, units = 2, 3, 4
    out = 3 if variant == "projection" else units

    def tensor(shape, scale=0.5):
        return _tensor(code, (RNG.standard_normal(shape) * scale).astype(dtype))

    omitted = Tensor(code, (0,), 0.0, 0, None, None)
    cifg, peephole, norm = variant == "cifg", variant == "peephole", variant == "layer_norm"
    weights = [omitted if cifg else tensor((units, size))] + [tensor((units, size)) for _ in range(3)]
    weights += [omitted if cifg else tensor((units, out))] + [tensor((units, out)) for _ in range(3)]
    weights += [tensor((units,)) for _ in range(3)] if peephole else [omitted] * 3
    weights += [omitted if cifg else tensor((units,))] + [tensor((units,)) for _ in range(3)]
    weights += [tensor((out, units)), tensor((out,))] if variant == "projection" else [omitted, omitted]
    scalar = T.FLOAT32 if kind == "float32" else T.FLOAT16
    clips = [Tensor(scalar, (), 0.0, 0, None, np.array(value, dtype)) for value in (3.0, 0.0)]
    inputs = [tensor((batch, size), 2.0), *weights, tensor((batch, out)), tensor((batch, units)),
              _scalar(T.INT32, 4), *clips]
    if norm:
        inputs += [tensor((units,)) for _ in range(4)]
    outputs = [OperandType(code, [batch, units * (3 if cifg else 4)]), OperandType(code, [batch, out]),
               OperandType(code, [batch, units]), OperandType(code, [batch, out])]
    prepared, reference = _planned_and_executed(Op.LSTM, inputs, outputs)
    assert len(prepared) == len(reference) == 4
    for fast, slow in zip(prepared, reference, strict=True):
        assert fast.dtype == slow.dtype == dtype and fast.shape == slow.shape
        np.testing.assert_array_equal(fast.view(np.uint8), slow.view(np.uint8))
    assert np.unique(reference[0]).size > 4 and np.unique(reference[3]).size > 2


def _as_float16(tensors: list[Tensor]) -> list[Tensor]:
    """The same float32 tensors and scalars as float16 ones (other inputs as they are)."""
    kinds = {T.TENSOR_FLOAT32: T.TENSOR_FLOAT16, T.FLOAT32: T.FLOAT16}
    return [Tensor(kinds[t.type], t.shape, 0.0, 0, None, None if t.value is None else t.value.astype(np.float16))
            if t.type in kinds else t for t in tensors]


def _assert_same_bits(prepared: list, reference: list) -> None:
    assert len(prepared) == len(reference)
    for fast, slow in zip(prepared, reference, strict=True):
        assert fast.dtype == slow.dtype and fast.shape == slow.shape
        np.testing.assert_array_equal(fast.view(np.uint8), slow.view(np.uint8))


@pytest.mark.parametrize("variant", ["peephole", "layer_norm", "float16"])
@pytest.mark.parametrize("outputs", [1, 3])
def test_prepared_sequence_lstm_of_execute_s_variants_matches_reference(variant, outputs):
    """Peephole, layer normalization and float16: ``execute``'s loop (no PreparedLstm)
    with the stacked matrices made once by the plan, bit for bit."""
    inputs, output_types = _sequence_lstm_inputs("plain", True, 4)
    if variant == "peephole":
        for index in (9, 10, 11):  # cell_to_input / forget / output
            inputs[index] = _tensor(T.TENSOR_FLOAT32, RNG.standard_normal(4).astype(np.float32))
    if variant == "layer_norm":
        for index in (24, 25, 26, 27):
            inputs[index] = _tensor(T.TENSOR_FLOAT32, RNG.uniform(0.5, 1.5, 4).astype(np.float32))
    if variant == "float16":
        inputs = _as_float16(inputs)
        output_types = [OperandType(T.TENSOR_FLOAT16, t.dimensions) for t in output_types]
    prepared, reference = _planned_and_executed(Op.UNIDIRECTIONAL_SEQUENCE_LSTM, inputs, output_types[:outputs])
    _assert_same_bits(prepared, reference)


@pytest.mark.parametrize("linking", ["parallel", "cross", "peephole"])
@pytest.mark.parametrize("merge, outputs", [(True, 1), (False, 6)])
def test_prepared_bidirectional_lstm_of_execute_s_variants_matches_reference(linking, merge, outputs):
    """An auxiliary input (replacing the backward input, or through auxiliary weights of
    both directions) and peephole directions: ``execute``'s two loops with both
    directions' stacked matrices made once by the plan, bit for bit."""
    forward, types = _sequence_lstm_inputs("plain", True, 4)
    backward, _ = _sequence_lstm_inputs("plain", True, 4)
    omitted = Tensor(T.TENSOR_FLOAT32, (0,), 0.0, 0, None, None)
    aux, aux_weights = omitted, [omitted] * 8
    if linking != "peephole":  # (parallel: the backward direction's input, of the input's size)
        size = 6 if linking == "cross" else 3
        aux = _tensor(T.TENSOR_FLOAT32, RNG.standard_normal((5, 2, size)).astype(np.float32))
    if linking == "cross":
        aux_weights = [_tensor(T.TENSOR_FLOAT32, (RNG.standard_normal((4, 6)) * 0.5).astype(np.float32))
                       for _ in range(8)]
    if linking == "peephole":
        for direction in (forward, backward):
            for index in (9, 10, 11):
                direction[index] = _tensor(T.TENSOR_FLOAT32, RNG.standard_normal(4).astype(np.float32))
    inputs = [forward[0], *forward[1:18], *backward[1:18], forward[18], forward[19], backward[18], backward[19],
              aux, *aux_weights, *forward[20:23], _scalar(T.BOOL, merge), _scalar(T.BOOL, True), *[omitted] * 8]
    sequence, state, cell = types
    declared = ([OperandType(T.TENSOR_FLOAT32, [*sequence.dimensions[:2], 2 * sequence.dimensions[2]])] if merge
                else [sequence, sequence])
    declared = (declared + [state, cell, state, cell])[:outputs]
    prepared, reference = _planned_and_executed(Op.BIDIRECTIONAL_SEQUENCE_LSTM, inputs, declared)
    _assert_same_bits(prepared, reference)


@pytest.mark.parametrize("batch, input_size, units", [(1, 5, 4), (3, 16, 24)])
def test_prepared_quantized_16bit_lstm_matches_reference(batch, input_size, units):
    """Constant weights and biases: the stacked product matrix, biases and multiplier made
    once by the plan; the new cell state and output bit for bit as ``execute``'s."""
    weights_scale = 0.0078125 * 0.37

    def q8(shape, scale=weights_scale, zero=131):
        return _tensor(T.TENSOR_QUANT8_ASYMM, RNG.integers(0, 256, shape).astype(np.uint8), scale, zero)

    inputs = [q8((batch, input_size), 1 / 128, 128), *(q8((units, input_size)) for _ in range(4)),
              *(q8((units, units)) for _ in range(4)),
              *(_tensor(T.TENSOR_INT32, RNG.integers(-9000, 9000, units).astype(np.int32), weights_scale / 128)
                for _ in range(4)),
              _tensor(T.TENSOR_QUANT16_SYMM, RNG.integers(-30000, 30000, (batch, units)).astype(np.int16), 2.0**-11),
              q8((batch, units), 1 / 128, 128)]
    outputs = [OperandType(T.TENSOR_QUANT16_SYMM, [batch, units], 2.0**-11),
               OperandType(T.TENSOR_QUANT8_ASYMM, [batch, units], 1 / 128, 128)]
    _compare(Op.QUANTIZED_16BIT_LSTM, inputs, outputs)
    prepared, _ = _planned_and_executed(Op.QUANTIZED_16BIT_LSTM, inputs, outputs)
    assert len(np.unique(prepared[1])) > 3 and len(np.unique(prepared[0])) > 3  # not saturated to a constant


@pytest.mark.parametrize("code, linking", [(Op.RNN, None), (Op.UNIDIRECTIONAL_SEQUENCE_RNN, None),
                                           (Op.BIDIRECTIONAL_SEQUENCE_RNN, None),
                                           (Op.BIDIRECTIONAL_SEQUENCE_RNN, "parallel"),
                                           (Op.BIDIRECTIONAL_SEQUENCE_RNN, "cross")])
@pytest.mark.parametrize("kind", ["float32", "float16"])
@pytest.mark.parametrize("full", [False, True])  # every output, or the fewest
def test_prepared_rnn_matches_reference(code, linking, kind, full):
    """The RNN family with constant weights: the recurrent matrices transposed once by the
    plan, the inputs and hidden states fed at run time; every output bit for bit as
    ``execute``'s (time-major and batch-major, merged or not)."""
    tensor_code, dtype = (T.TENSOR_FLOAT32, np.float32) if kind == "float32" else (T.TENSOR_FLOAT16, np.float16)
    steps, batch, size, units, aux_size = 4, 2, 3, 5, 3 if linking == "parallel" else 6
    # values of this case's own (not the module's generator, whose state depends on which
    # tests a worker ran before: the not-degenerate checks below saw 4 distinct relu values)
    rng = np.random.default_rng([int(code), int(full), dtype().itemsize, (None, "parallel", "cross").index(linking)])

    def tensor(*shape, scale=0.5):
        return _tensor(tensor_code, (rng.standard_normal(shape) * scale).astype(dtype))

    omitted = Tensor(tensor_code, (0,), 0.0, 0, None, None)
    activation = _scalar(T.INT32, 4 if full else 1)  # tanh, relu
    if code == Op.RNN:
        inputs = [tensor(batch, size, scale=2), tensor(units, size), tensor(units, units), tensor(units),
                  tensor(batch, units), activation]
        outputs = [OperandType(tensor_code, [batch, units])] * 2
    elif code == Op.UNIDIRECTIONAL_SEQUENCE_RNN:
        x_shape = (steps, batch, size) if full else (batch, steps, size)
        inputs = [tensor(*x_shape, scale=2), tensor(units, size), tensor(units, units), tensor(units),
                  tensor(batch, units), activation, _scalar(T.INT32, int(full))]
        outputs = [OperandType(tensor_code, [*x_shape[:2], units]), OperandType(tensor_code, [batch, units])]
        outputs = outputs if full else outputs[:1]
    else:
        merge = not full
        cell = [tensor(units, size), tensor(units, units), tensor(units), tensor(batch, units)]
        backward = [tensor(units, aux_size if linking == "parallel" else size), tensor(units, units), tensor(units),
                    tensor(batch, units)]
        aux = tensor(steps, batch, aux_size) if linking else omitted
        aux_weights = [tensor(units, aux_size), tensor(units, aux_size)] if linking == "cross" else [omitted] * 2
        inputs = [tensor(steps, batch, size, scale=2), *cell, *backward, aux, *aux_weights, activation,
                  _scalar(T.BOOL, True), _scalar(T.BOOL, merge)]
        outputs = ([OperandType(tensor_code, [steps, batch, 2 * units])] if merge
                   else [OperandType(tensor_code, [steps, batch, units])] * 2)
        if full:
            outputs += [OperandType(tensor_code, [batch, units])] * 2
    prepared, reference = _planned_and_executed(code, inputs, outputs)
    _assert_same_bits(prepared, reference)
    assert np.unique(reference[0]).size > 4


@pytest.mark.parametrize("kind", ["float32", "float16"])
@pytest.mark.parametrize("rank, with_bias", [(1, True), (2, False)])
def test_prepared_svdf_matches_reference(kind, rank, with_bias):
    """SVDF with constant weights: converted and checked once by the plan, the input and
    state fed at run time; the new state and output bit for bit as ``execute``'s."""
    code, dtype = (T.TENSOR_FLOAT32, np.float32) if kind == "float32" else (T.TENSOR_FLOAT16, np.float16)
    batch, size, units, memory = 2, 5, 3, 4
    filters = units * rank

    def tensor(*shape):
        return _tensor(code, RNG.standard_normal(shape).astype(dtype))

    bias = tensor(units) if with_bias else Tensor(code, (0,), 0.0, 0, None, None)
    inputs = [tensor(batch, size), tensor(filters, size), tensor(filters, memory), bias,
              tensor(batch, memory * filters), _scalar(T.INT32, rank), _scalar(T.INT32, 4 if with_bias else 0)]
    outputs = [OperandType(code, [batch, memory * filters]), OperandType(code, [batch, units])]
    prepared, reference = _planned_and_executed(Op.SVDF, inputs, outputs)
    _assert_same_bits(prepared, reference)
    assert np.unique(reference[1]).size > 2 and np.unique(reference[0]).size > 4


@pytest.mark.parametrize(("constant_shape", "shape"), [((8,), (1, 128, 128, 8)), ((1, 1, 3), (2, 5, 7, 3)),
                                                       ((5, 1, 1), (2, 5, 7, 3)), ((), (4, 4)), ((3,), (3,)),
                                                       ((2, 1), (2, 300))])
def test_tile_trailing_broadcasts_to_the_same_values(constant_shape, shape):
    from nnapi.operations.elementwise import tile_trailing

    constant = RNG.standard_normal(constant_shape).astype(np.float32)
    tiled = tile_trailing(constant, shape)
    assert tiled.flags.c_contiguous and tiled.ndim <= len(shape)
    x = RNG.standard_normal(shape).astype(np.float32)
    np.testing.assert_array_equal(x * tiled, x * constant)
    assert tiled.size >= min(256, int(np.prod(shape)))  # one innermost run per row, not per element


def _compare_exactly(code: Op, inputs: list[Tensor], output: OperandType) -> None:
    """``plan`` against ``execute``: the same dtype, shape and bits (copying operations)."""
    prepared, reference = _planned_and_executed(code, inputs, [output])
    for fast, slow in zip(prepared, reference, strict=True):
        assert fast.dtype == slow.dtype and fast.shape == slow.shape and fast.flags.c_contiguous
        np.testing.assert_array_equal(fast.view(np.uint8), slow.view(np.uint8))


_COPY_KINDS = {"float32": (T.TENSOR_FLOAT32, np.float32, 0.0, 0), "float16": (T.TENSOR_FLOAT16, np.float16, 0.0, 0),
               "quant8": (T.TENSOR_QUANT8_ASYMM, np.uint8, 0.5, 7),
               "quant8_signed": (T.TENSOR_QUANT8_ASYMM_SIGNED, np.int8, 0.5, -3)}


def _copy_input(kind: str, shape) -> Tensor:
    code, dtype, scale, zero = _COPY_KINDS[kind]
    if dtype in (np.uint8, np.int8):
        info = np.iinfo(dtype)
        return _tensor(code, RNG.integers(info.min, info.max + 1, shape).astype(dtype), scale, zero)
    value = RNG.standard_normal(shape).astype(dtype)
    value.reshape(-1)[:2] = [-0.0, np.nan]
    return _tensor(code, value, scale, zero)


@pytest.mark.parametrize("kind", list(_COPY_KINDS))
@pytest.mark.parametrize("code", [Op.PAD, Op.PAD_V2])
@pytest.mark.parametrize("paddings", [[[0, 0], [1, 2], [0, 1], [0, 4]], [[0, 0], [0, 0], [0, 0], [0, 0]]])
def test_prepared_pad_matches_reference(kind, code, paddings):
    data = _copy_input(kind, (2, 3, 4, 5))
    pads = np.array(paddings, np.int32)
    inputs = [data, _tensor(T.TENSOR_INT32, pads)]
    if code == Op.PAD_V2:
        float_kind = kind.startswith("float")
        value_code = {"float32": T.FLOAT32, "float16": T.FLOAT16}.get(kind, T.INT32)
        value = np.array(-0.0 if kind == "float32" else 1.5, np.float16 if kind == "float16" else np.float32) \
            if float_kind else np.array(9, np.int32)
        inputs.append(Tensor(value_code, (), 0.0, 0, None, value))
    shape = [d + int(b) + int(a) for d, (b, a) in zip(data.shape, paddings, strict=True)]
    code_type, _, scale, zero = _COPY_KINDS[kind]
    _compare_exactly(code, inputs, OperandType(code_type, shape, scale, zero))


@pytest.mark.parametrize("kind", list(_COPY_KINDS))
@pytest.mark.parametrize("axis, count", [(0, 2), (1, 5), (-1, 3), (2, 1)])
def test_prepared_split_matches_reference(kind, axis, count):
    code_type, _, scale, zero = _COPY_KINDS[kind]
    data = _copy_input(kind, (2, 5, 6))
    part = list(data.value.shape)
    part[axis] //= count
    outputs = [OperandType(code_type, part, scale, zero)] * count
    inputs = [data, _scalar(T.INT32, axis), _scalar(T.INT32, count)]
    prepared, reference = _planned_and_executed(Op.SPLIT, inputs, outputs)
    assert len(prepared) == len(reference) == count
    for fast, slow in zip(prepared, reference, strict=True):
        assert fast.dtype == slow.dtype and fast.shape == slow.shape == tuple(part) and fast.flags.c_contiguous
        np.testing.assert_array_equal(fast.view(np.uint8), slow.view(np.uint8))
    np.testing.assert_array_equal(np.concatenate(prepared, axis=axis).view(np.uint8), data.value.view(np.uint8))


@pytest.mark.parametrize("kind", list(_COPY_KINDS))
@pytest.mark.parametrize("axis, indices", [(0, [1, 0, 1]), (1, [[4, 0], [2, 2]]), (-1, [5]), (2, 3)])
def test_prepared_gather_matches_reference(kind, axis, indices):
    """GATHER prepared (indices known only at the call, as a loop body computes them):
    the same values as ``execute``, and indices out of range fail the call as they do there."""
    data = _copy_input(kind, (2, 5, 6))
    index_tensor = _tensor(T.TENSOR_INT32, np.array(indices, np.int32))
    shape = list(data.value.shape)
    resolved = axis % 3
    out_shape = shape[:resolved] + list(index_tensor.value.shape) + shape[resolved + 1:]
    code_type, _, scale, zero = _COPY_KINDS[kind]
    inputs = [data, _scalar(T.INT32, axis), index_tensor]
    _compare_exactly(Op.GATHER, inputs, OperandType(code_type, out_shape, scale, zero))
    kernel = get_operation(Op.GATHER).plan(ExecutionContext(Op.GATHER, inputs, [OperandType(code_type, out_shape)]))
    for bad in (-1, shape[resolved]):
        wrong = np.array(indices, np.int32)
        wrong.reshape(-1)[-1] = bad
        with pytest.raises(OperationFailed, match=rf"GATHER: indices must be in \[0, {shape[resolved]}\)"):
            kernel([data.value, np.int32(axis), wrong])


@pytest.mark.parametrize("code", [Op.ADD, Op.SUB, Op.MUL, Op.DIV])
def test_prepared_int32_arithmetic_matches_reference(code):
    """int32 arithmetic prepared: wrap-around, floor division, division by zero (0), broadcasting."""
    a = RNG.integers(-(2**31), 2**31, (3, 4)).astype(np.int32)
    a[0, :2] = [2**31 - 1, -(2**31)]
    b = RNG.integers(-5, 6, (1, 4)).astype(np.int32)
    b[0, 0] = 0
    inputs = [_tensor(T.TENSOR_INT32, a), _tensor(T.TENSOR_INT32, b), _scalar(T.INT32, 0)]
    _compare_exactly(code, inputs, OperandType(T.TENSOR_INT32, [3, 4]))
    scalars = [_tensor(T.TENSOR_INT32, np.array(7, np.int32)), _tensor(T.TENSOR_INT32, np.array(2, np.int32)),
               _scalar(T.INT32, 0)]
    (value,) = get_operation(code).plan(ExecutionContext(code, scalars, [OperandType(T.TENSOR_INT32, [])]))(
        [t.value for t in scalars])
    assert int(value) == {Op.ADD: 9, Op.SUB: 5, Op.MUL: 14, Op.DIV: 3}[code]


_COMPARED = {"float32": (T.TENSOR_FLOAT32, lambda shape: RNG.integers(-2, 3, shape).astype(np.float32), 0.0, 0),
             "int32": (T.TENSOR_INT32, lambda shape: RNG.integers(-2, 3, shape).astype(np.int32), 0.0, 0),
             "bool8": (T.TENSOR_BOOL8, lambda shape: RNG.integers(0, 2, shape).astype(np.bool_), 0.0, 0),
             "quant8": (T.TENSOR_QUANT8_ASYMM, lambda shape: RNG.integers(0, 4, shape).astype(np.uint8), 0.5, 1)}


@pytest.mark.parametrize("kind", list(_COMPARED))
@pytest.mark.parametrize("code", [Op.LESS, Op.LESS_EQUAL, Op.EQUAL, Op.NOT_EQUAL, Op.GREATER, Op.GREATER_EQUAL])
def test_prepared_comparisons_match_reference(kind, code):
    """Comparisons prepared where both inputs share one quantization; inputs of two
    quantizations are compared as real values by ``execute`` (no plan)."""
    code_type, values, scale, zero = _COMPARED[kind]
    inputs = [_tensor(code_type, values((2, 3)), scale, zero), _tensor(code_type, values((3,)), scale, zero)]
    _compare_exactly(code, inputs, OperandType(T.TENSOR_BOOL8, [2, 3]))
    if kind == "quant8":
        other = [inputs[0], _tensor(code_type, inputs[1].value, 0.25, 3)]
        assert get_operation(code).plan(ExecutionContext(code, other, [OperandType(T.TENSOR_BOOL8, [2, 3])])) is None


@pytest.mark.parametrize("code", [Op.LOGICAL_AND, Op.LOGICAL_OR])
def test_prepared_logical_matches_reference(code):
    inputs = [_tensor(T.TENSOR_BOOL8, RNG.integers(0, 2, (4, 1)).astype(np.bool_)),
              _tensor(T.TENSOR_BOOL8, RNG.integers(0, 2, (3,)).astype(np.bool_))]
    _compare_exactly(code, inputs, OperandType(T.TENSOR_BOOL8, [4, 3]))


@pytest.mark.parametrize("kind", list(_COPY_KINDS))
def test_prepared_slices_match_reference(kind):
    code_type, _, scale, zero = _COPY_KINDS[kind]
    data = _copy_input(kind, (2, 5, 6, 3))
    begin, size = np.array([0, 1, 2, 0], np.int32), np.array([-1, 3, 2, 2], np.int32)
    _compare_exactly(Op.SLICE, [data, _tensor(T.TENSOR_INT32, begin), _tensor(T.TENSOR_INT32, size)],
                     OperandType(code_type, [2, 3, 2, 2], scale, zero))
    strided = [data, _tensor(T.TENSOR_INT32, np.array([0, 4, 1, 0], np.int32)),
               _tensor(T.TENSOR_INT32, np.array([1, 0, 6, 3], np.int32)),
               _tensor(T.TENSOR_INT32, np.array([1, -2, 2, 1], np.int32)),
               _scalar(T.INT32, 0), _scalar(T.INT32, 0), _scalar(T.INT32, 1)]
    _compare_exactly(Op.STRIDED_SLICE, strided, OperandType(code_type, [2, 3, 3], scale, zero))


@pytest.mark.parametrize("kind", list(_COPY_KINDS))
@pytest.mark.parametrize("axis", [0, 3])
def test_prepared_concatenation_matches_reference(kind, axis):
    code_type, _, scale, zero = _COPY_KINDS[kind]
    first, second = _copy_input(kind, (2, 3, 4, 5)), _copy_input(kind, (2, 3, 4, 5))
    shape = [2, 3, 4, 5]
    shape[axis] *= 2
    _compare_exactly(Op.CONCATENATION, [first, second, _scalar(T.INT32, axis)],
                     OperandType(code_type, shape, scale, zero))


@pytest.mark.parametrize("code, dtype", [(T.TENSOR_QUANT8_ASYMM, np.uint8), (T.TENSOR_QUANT8_ASYMM_SIGNED, np.int8)])
def test_prepared_requantizing_concatenation_matches_reference(code, dtype):
    """Inputs of other scales and zero points than the output's go through tables the plan
    makes once: every stored value of each, bit for bit as ``execute``; an input of the
    output's quantization is copied as it is."""
    every = np.arange(256, dtype=np.uint8).view(dtype).reshape(2, 128)
    inputs = [_tensor(code, every, 0.5, 7), _tensor(code, every[::-1], 1.0, 7),
              _tensor(code, every, 0.013, -20 if dtype == np.int8 else 200), _scalar(T.INT32, 0)]
    output = OperandType(code, [6, 128], 1.0, 7)
    _compare_exactly(Op.CONCATENATION, inputs, output)
    prepared, _ = _planned_and_executed(Op.CONCATENATION, inputs, [output])
    joined = prepared[0].astype(np.int64)
    # (q - 7) * 0.5 + 7, halves away from zero: 8 -> 7.5 -> 8, 6 -> 6.5 -> 6; then the copy
    position = {int(v): i for i, v in enumerate(every.reshape(-1))}
    assert joined.reshape(-1)[position[8]] == 8 and joined.reshape(-1)[position[6]] == 6
    assert joined.reshape(-1)[position[11]] == 9 and joined.reshape(-1)[position[3]] == 5
    np.testing.assert_array_equal(joined[2:4], every[::-1])


@pytest.mark.parametrize("kind", list(_COPY_KINDS))
@pytest.mark.parametrize("code", [Op.RESIZE_BILINEAR, Op.RESIZE_NEAREST_NEIGHBOR])
@pytest.mark.parametrize("flags", [(False, False), (True, False), (False, True)])  # align_corners, half_pixel
@pytest.mark.parametrize("size, nchw", [((7, 9), False), ((3, 2), False), ((12, 5), True)])
def test_prepared_resize_matches_reference(kind, code, flags, size, nchw):
    """Prepared taps (and, with nnapi[fast], the compiled blend) against execute, bit for
    bit: both compute each output with the same float32 operations in the same order."""
    data = _copy_input(kind, (2, 3, 4, 5) if nchw else (2, 4, 5, 3))
    code_type, _, scale, zero = _COPY_KINDS[kind]
    out_h, out_w = size
    inputs = [data, _scalar(T.INT32, out_w), _scalar(T.INT32, out_h), _scalar(T.BOOL, nchw),
              _scalar(T.BOOL, flags[0]), _scalar(T.BOOL, flags[1])]
    shape = [2, 3, out_h, out_w] if nchw else [2, out_h, out_w, 3]
    _compare_exactly(code, inputs, OperandType(code_type, shape, scale, zero))


@pytest.mark.parametrize("code", [Op.MAXIMUM, Op.MINIMUM, Op.POW])
@pytest.mark.parametrize("kind", ["float32", "int32", "quant8", "quant8_signed", "quant8_requantized"])
@pytest.mark.parametrize("shapes", [((2, 16, 16, 3), (2, 16, 16, 3)), ((2, 16, 16, 3), (3,)), ((4,), (2, 1, 4))])
def test_prepared_binary_math_matches_reference(code, kind, shapes):
    """MAXIMUM / MINIMUM / POW plans against execute, bit for bit: the quantized inputs of
    one quantization as plain max / min of stored values, the others through the table."""
    if code == Op.POW and kind != "float32":
        return
    first_shape, second_shape = shapes
    if kind == "float32":
        first, second = (_copy_input("float32", s) for s in shapes)
        if code == Op.POW:
            first = _tensor(T.TENSOR_FLOAT32, np.abs(first.value))
        output = OperandType(T.TENSOR_FLOAT32, list(np.broadcast_shapes(first_shape, second_shape)))
    elif kind == "int32":
        first, second = (_tensor(T.TENSOR_INT32, RNG.integers(-1000, 1000, s).astype(np.int32)) for s in shapes)
        output = OperandType(T.TENSOR_INT32, list(np.broadcast_shapes(first_shape, second_shape)))
    else:
        base = "quant8" if kind == "quant8_requantized" else kind
        first, second = (_copy_input(base, s) for s in shapes)
        code_type, _, scale, zero = _COPY_KINDS[base]
        if kind == "quant8_requantized":
            second = Tensor(second.type, second.shape, 0.3, 100, None, second.value)
            scale, zero = 0.7, 20
        output = OperandType(code_type, list(np.broadcast_shapes(first_shape, second_shape)), scale, zero)
    _compare_exactly(code, [first, second], output)


@pytest.mark.parametrize("code", [Op.LOGISTIC, Op.HARD_SWISH])
def test_prepared_float32_activations_are_bit_exact(code):
    """The in-place float32 kernels do execute's operations in its order: the same bits,
    -0, NaN, infinities and the clamp's edges included."""
    value = (RNG.standard_normal((4, 9, 11, 8)) * 6).astype(np.float32)
    value.reshape(-1)[:9] = [np.nan, np.inf, -np.inf, -0.0, 0.0, -3.0, 3.0, 100.0, -100.0]
    _compare_exactly(code, [_tensor(T.TENSOR_FLOAT32, value)], OperandType(T.TENSOR_FLOAT32, list(value.shape)))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("kernel, stride, padding, nchw", [
    (3, 2, (0, 1, 0, 1), False),   # a MediaPipe decoder's 2x upsampling (SAME)
    (3, 1, (1, 1, 1, 1), True),
    (2, 2, (0, 0, 0, 0), False),
    (5, 3, (2, 0, 1, 3), False),
    (1, 1, (0, 0, 0, 0), True),
])
def test_prepared_transpose_conv_matches_reference(kind, kernel, stride, padding, nchw):
    """TRANSPOSE_CONV_2D's plan against execute: quantized bit for bit, float to rounding,
    explicit paddings and the implicit form's output-shape tensor."""
    batches, size, in_ch, out_ch = 2, 6, 5, 4
    x_shape = (batches, in_ch, size, size) if nchw else (batches, size, size, in_ch)
    x, w, b, out_type = _quant_case(kind, x_shape, (out_ch, kernel, kernel, in_ch), out_ch, 0,
                                    kernel * kernel * in_ch)
    left, right, top, bottom = padding
    oh = size * stride + kernel - stride - top - bottom
    ow = size * stride + kernel - stride - left - right
    shape = [batches, out_ch, oh, ow] if nchw else [batches, oh, ow, out_ch]
    for fuse in (FuseCode.FUSED_NONE, FuseCode.FUSED_RELU1):
        args = [_scalar(T.INT32, v) for v in (left, right, top, bottom, stride, stride, fuse)]
        _compare(Op.TRANSPOSE_CONV_2D, [x, w, b, *args, _scalar(T.BOOL, nchw)], out_type(shape))
    if not nchw:  # implicit padding: SAME for the output shape asked
        want = [batches, size * stride, size * stride, out_ch]
        args = [_tensor(T.TENSOR_INT32, np.array(want, np.int32)), _scalar(T.INT32, 1),
                *[_scalar(T.INT32, v) for v in (stride, stride, FuseCode.FUSED_RELU)], _scalar(T.BOOL, False)]
        _compare(Op.TRANSPOSE_CONV_2D, [x, w, b, *args], out_type(want))


def test_work_dtype_is_float32_exactly_when_every_channel_s_sums_fit():
    """The product dtype of a quantized filter: float32 exactly when max|x - zero_point|
    times the largest per-channel sum of |w| stays below 2**24 (float64 otherwise),
    whether the quick bound taps * max|w| settles it or the sums are needed: filters
    around the limit, sparse ones, every layout's channel axes."""
    from nnapi.operations._conv_fast import _work_dtype

    rng = np.random.default_rng(3)
    seen = set()
    for trial in range(400):
        shape = tuple(int(d) for d in rng.integers(1, 12, 4)) if trial % 2 else (int(rng.integers(1, 40)),
                                                                               int(rng.integers(1, 3000)))
        axes = (0,) if len(shape) == 2 or trial % 4 == 1 else (3,)
        high = int(rng.choice([1, 8, 64, 255]))
        weights = rng.integers(-high, high + 1, shape).astype(np.int16)
        if trial % 3 == 0:
            weights[rng.random(shape) < 0.8] = 0
        zero_point = int(rng.integers(0, 256))
        data = _tensor(T.TENSOR_QUANT8_ASYMM, np.zeros((1, 1), np.uint8), 0.5, zero_point)
        summed = tuple(axis for axis in range(len(shape)) if axis not in axes)
        largest = int(np.abs(weights.astype(np.int64)).sum(axis=summed).max())
        want = np.float32 if max(zero_point, 255 - zero_point) * max(largest, 1) < 2**24 else np.float64
        assert _work_dtype(data, weights, axes) == want, trial
        # the same filter as stored 8-bit values and their zero point (no shifted copy)
        if high <= 127:
            filter_zero_point = int(rng.integers(-128 + high, 128 - high)) if trial % 5 else 0
            stored = (weights + filter_zero_point).astype(np.int8)
            assert _work_dtype(data, stored, axes, filter_zero_point) == want, trial
        if trial % 5 == 0:
            filter_zero_point = int(rng.integers(high, 256 - high)) if high <= 127 else 0
            if high <= 127:
                stored = (weights + filter_zero_point).astype(np.uint8)
                assert _work_dtype(data, stored, axes, filter_zero_point) == want, trial
        seen.add(want)
    assert seen == {np.float32, np.float64}


def test_filter_magnitudes_are_exact_for_every_stored_value():
    """_magnitudes: |w - zero_point| of every int8 and uint8 value (int8's -128 included,
    whose absolute value wraps in int8), with and without a zero point."""
    from nnapi.operations._conv_fast import _magnitudes

    for dtype in (np.int8, np.uint8):
        stored = np.arange(256, dtype=np.uint8).view(dtype).reshape(16, 16)
        for zero_point in (0, 1, -128 if dtype == np.int8 else 128, 127 if dtype == np.int8 else 255):
            got = _magnitudes(stored, zero_point)
            want = np.abs(stored.astype(np.int64) - zero_point)
            assert np.array_equal(got.astype(np.int64), want), (dtype, zero_point)


# --- every CTS vector of a planned operation: plan against execute ----------------------------


def _single_operation_records() -> list[dict]:
    """The CTS vectors with one operation that has a ``plan``, in their quant8 signed
    variant too: the cases each plan must answer as ``execute`` does."""
    from nnapi.conformance import default_vector_files, load_records, variant_quant8_signed

    records = []
    for path in default_vector_files():
        for record in load_records(path):
            main = record["main"]
            if len(main["operations"]) != 1 or record["referenced"] or record.get("expectFailure"):
                continue
            operation = get_operation(Op[main["operations"][0]["type"]])
            if operation is None or type(operation).plan is Operation.plan:
                continue
            records.append(record)
            signed = variant_quant8_signed(record)
            if signed is not None:
                records.append(signed)
    return records


_PLANNED_RECORDS = _single_operation_records()


def _record_contexts(record: dict) -> tuple[ExecutionContext, ExecutionContext] | None:
    """(the context ``plan`` sees at preparation: model inputs with shapes but unreadable
    values; the context ``execute`` sees), or None when an input shape is not static."""
    from nnapi.conformance import _array, _operand_type
    from nnapi.drivers.reference import _UNKNOWN

    main = record["main"]
    operation = main["operations"][0]
    at_preparation, at_execution = [], []
    for index in operation["inputs"]:
        operand = main["operands"][index]
        declared = _operand_type(operand)
        if operand["lifetime"] == "NO_VALUE" or (declared.is_tensor and not operand["data"]):
            value = None
        else:
            value = _array(operand["data"], declared.type).reshape(declared.dimensions)
        if declared.is_tensor and (not declared.dimensions or 0 in declared.dimensions) and value is None:
            return None
        tensor = Tensor(declared.type, tuple(declared.dimensions) if value is None else value.shape,
                        declared.scale, declared.zero_point, declared.channel_quant, value)
        at_execution.append(tensor)
        unknown = operand["lifetime"] == "SUBGRAPH_INPUT" and value is not None
        at_preparation.append(Tensor(*dataclasses.astuple(tensor)[:5], _UNKNOWN) if unknown else tensor)
    outputs = [_operand_type(main["operands"][i]) for i in operation["outputs"]]
    code, relaxed = Op[operation["type"]], bool(record.get("isRelaxed"))
    return (ExecutionContext(code, at_preparation, outputs, relaxed),
            ExecutionContext(code, at_execution, outputs, relaxed))


@pytest.mark.parametrize("record", _PLANNED_RECORDS, ids=[r["test"] for r in _PLANNED_RECORDS])
def test_plans_answer_every_cts_vector_as_execute_does(record):
    """Quantized and integer results bit for bit; float results to rounding (the tolerance
    of ``_compare``); the output shapes and dtypes exactly."""
    contexts = _record_contexts(record)
    if contexts is None:
        pytest.skip("an input without a static shape")
    preparing, executing = contexts
    operation = get_operation(executing.code)
    try:
        operation.prepare(preparing)
        kernel = operation.plan(preparing)
    except Exception:  # noqa: BLE001 - the driver runs ``execute`` then (as here: nothing to compare)
        kernel = None
    if kernel is None:
        pytest.skip("no prepared kernel for this case")
    operation.check_inputs(executing)
    shapes = [tuple(shape) for shape in operation.prepare(executing)]
    with np.errstate(all="ignore"):  # as the driver runs kernels
        expected = operation.execute(executing)
        actual = kernel([tensor.value for tensor in executing.inputs])
    assert len(actual) == len(expected) == len(shapes)
    for fast, slow, shape in zip(actual, expected, shapes, strict=True):
        fast, slow = np.asarray(fast), np.asarray(slow)
        assert fast.dtype == slow.dtype and fast.shape == slow.shape == shape
        if fast.dtype.kind == "f":
            scale = float(np.nanmax(np.abs(slow), initial=0)) if slow.size else 1.0
            np.testing.assert_allclose(fast, slow, rtol=2e-5, atol=1e-4 * max(1.0, scale))
        else:
            np.testing.assert_array_equal(fast, slow)


def _q8s(values, scale, zero_point) -> Tensor:
    return _tensor(T.TENSOR_QUANT8_ASYMM_SIGNED, np.asarray(values, np.int8), scale, zero_point)


@pytest.mark.parametrize("kind", ["float32", "quant8_signed"])
@pytest.mark.parametrize("shapes, adjoints", [
    (((3, 4), (4, 5)), (False, False)),
    (((2, 4, 3), (2, 4, 5)), (True, False)),
    (((2, 2, 3, 4), (2, 2, 5, 4)), (False, True)),
    (((1, 300, 2), (1, 300, 3)), (True, False)),  # inner 300: the quantized sums need float64
])
def test_prepared_batch_matmul_matches_reference(kind, shapes, adjoints):
    (a_shape, b_shape), (adj_a, adj_b) = shapes, adjoints
    rows = a_shape[-1] if adj_a else a_shape[-2]
    columns = b_shape[-2] if adj_b else b_shape[-1]
    out_shape = (*a_shape[:-2], rows, columns)
    if kind == "float32":
        a = _tensor(T.TENSOR_FLOAT32, RNG.standard_normal(a_shape).astype(np.float32))
        b = _tensor(T.TENSOR_FLOAT32, RNG.standard_normal(b_shape).astype(np.float32))
        output = OperandType(T.TENSOR_FLOAT32, out_shape)
    else:  # extremes included: the bound on the sums is reached
        a = _q8s(np.where(RNG.random(a_shape) < 0.5, -128, RNG.integers(-128, 128, a_shape)), 0.05, 127)
        b = _q8s(np.where(RNG.random(b_shape) < 0.5, 127, RNG.integers(-128, 128, b_shape)), 0.02, -128)
        output = OperandType(T.TENSOR_QUANT8_ASYMM_SIGNED, out_shape, 0.05 * 0.02 * 40, 3)
    _compare(Op.BATCH_MATMUL, [a, b, _scalar(T.BOOL, adj_a), _scalar(T.BOOL, adj_b)], output)


def test_prepared_quantize_matches_reference_at_the_edges():
    """Ties of both signs, values just below a half (x + 0.5 rounds up in float32), NaN,
    infinities and values beyond the range: the clamp the plan applies before rounding."""
    edges = np.array([0.5, -0.5, 1.5, -1.5, 2.5, -2.5, 0.49999997, -0.49999997, np.nan, np.inf, -np.inf,
                      1e30, -1e30, 126.5, 127.5, -128.5, -129.5, 0.0, -0.0, 3.4e38], np.float32)
    x = np.concatenate([edges, RNG.standard_normal(200).astype(np.float32) * 200]).reshape(4, -1)
    for code, scale, zero_point in [(T.TENSOR_QUANT8_ASYMM_SIGNED, 1.0, 0), (T.TENSOR_QUANT8_ASYMM_SIGNED, 0.5, -7),
                                    (T.TENSOR_QUANT8_ASYMM, 1.0, 128), (T.TENSOR_QUANT8_ASYMM, 0.25, 0),
                                    (T.TENSOR_QUANT8_ASYMM, 2.0, 255)]:
        _compare(Op.QUANTIZE, [_tensor(T.TENSOR_FLOAT32, x)], OperandType(code, x.shape, scale, zero_point))


@pytest.mark.parametrize("code", [Op.SOFTMAX, Op.L2_NORMALIZATION, Op.MEAN, Op.ARGMAX, Op.TRANSPOSE])
@pytest.mark.parametrize("kind", ["float32", "quant8", "quant8_signed"])
@pytest.mark.parametrize("axis", [-1, 1, 0])
def test_prepared_axis_operations_match_reference(code, kind, axis):
    """Along every axis of a 3-D tensor, with saturating values (whole rows at one extreme)."""
    shape = (3, 5, 70)
    if kind == "float32":
        x = _tensor(T.TENSOR_FLOAT32, RNG.standard_normal(shape).astype(np.float32) * 3)
    else:
        signed = kind == "quant8_signed"
        low = -128 if signed else 0
        values = RNG.integers(low, low + 256, shape)
        values[0] = low + 255  # a row of maxima
        values[1, 0] = low
        x = _tensor(T.TENSOR_QUANT8_ASYMM_SIGNED if signed else T.TENSOR_QUANT8_ASYMM,
                    values.astype(np.int8 if signed else np.uint8), 0.07, low + 131)
    axis_scalar = _scalar(T.INT32, axis)
    normalized = axis % 3
    if code == Op.SOFTMAX:
        zero = {"float32": 0, "quant8": 0, "quant8_signed": -128}[kind]
        output = OperandType(x.type, shape, 0.0 if kind == "float32" else 1 / 256, zero)
        for beta in (1.0, 0.37):
            _compare(code, [x, _scalar(T.FLOAT32, beta), axis_scalar], output)
    elif code == Op.L2_NORMALIZATION:
        zero = {"float32": 0, "quant8": 128, "quant8_signed": 0}[kind]
        _compare(code, [x, axis_scalar], OperandType(x.type, shape, 0.0 if kind == "float32" else 1 / 128, zero))
    elif code == Op.MEAN:
        for axes, keep in (([axis], 1), ([axis, (axis + 1) % 3], 0), ([0, 2], 1)):
            kept = [1 if i in [a % 3 for a in axes] else n for i, n in enumerate(shape)]
            if not keep:
                kept = [n for i, n in enumerate(shape) if i not in [a % 3 for a in axes]]
            _compare(code, [x, _tensor(T.TENSOR_INT32, np.array(axes, np.int32)), _scalar(T.INT32, keep)],
                     OperandType(x.type, kept, x.scale, x.zero_point))
    elif code == Op.ARGMAX:
        _compare(code, [x, axis_scalar], OperandType(T.TENSOR_INT32, [n for i, n in enumerate(shape)
                                                                       if i != normalized]))
    else:
        perm = np.roll(np.arange(3), normalized).astype(np.int32)
        _compare(code, [x, _tensor(T.TENSOR_INT32, perm)],
                 OperandType(x.type, [shape[p] for p in perm], x.scale, x.zero_point))


def _table_samples():
    from test_operation_table import SAMPLES

    return {code: sample for code, sample in SAMPLES.items()
            if type(get_operation(code)).plan is not Operation.plan}


_TABLE_SAMPLES = _table_samples()


@pytest.mark.parametrize("code", sorted(_TABLE_SAMPLES, key=lambda c: c.name), ids=lambda c: c.name)
def test_plans_answer_the_operation_table_samples_as_execute_does(code):
    """The operation table's sample of every operation with a plan (hand-written ones for
    the operations newer than the CTS vectors: ELU, PACK, REVERSE, BATCH_MATMUL, ...)."""
    sample = _TABLE_SAMPLES[code]
    operation = get_operation(code)
    if operation.plan(sample.context()) is None:
        pytest.skip(f"no prepared kernel for the sample ({sample.source})")
    _compare(code, sample.tensors(), list(sample.outputs))


@pytest.mark.parametrize("shape, perm", [
    ((1, 56, 56, 64), (0, 3, 1, 2)),    # NHWC -> NCHW: [3136, 64] -> [64, 3136], tiled along the rows
    ((1, 64, 56, 56), (0, 2, 3, 1)),    # NCHW -> NHWC: tiled along the columns
    ((3, 37, 41, 29), (0, 3, 1, 2)),    # batches of [1517, 29], tiles not dividing the rows
    ((2, 3, 97, 131), (0, 1, 3, 2)),    # batches of [97, 131] (the first two dimensions merged)
    ((300, 1, 257), (2, 1, 0)),         # a size-1 dimension dropped: [300, 257] -> [257, 300]
    ((2, 40, 30, 20), (3, 1, 0, 2)),    # not a swap of two: numpy's copy
])
@pytest.mark.parametrize("dtype", [np.float32, np.int8])
def test_prepared_transpose_in_tiles_matches_reference(shape, perm, dtype):
    code = T.TENSOR_FLOAT32 if dtype == np.float32 else T.TENSOR_QUANT8_ASYMM_SIGNED
    x = _tensor(code, RNG.integers(-128, 128, shape).astype(dtype), 0.5 if dtype == np.int8 else 0.0)
    _compare(Op.TRANSPOSE, [x, _tensor(T.TENSOR_INT32, np.array(perm, np.int32))],
             OperandType(code, [shape[p] for p in perm], x.scale, x.zero_point))


@pytest.mark.parametrize("code", [Op.ADD, Op.SUB, Op.MUL])
@pytest.mark.parametrize("types", [(T.TENSOR_QUANT8_ASYMM, T.TENSOR_QUANT8_ASYMM),
                                   (T.TENSOR_QUANT8_ASYMM_SIGNED, T.TENSOR_QUANT8_ASYMM_SIGNED)])
@pytest.mark.parametrize("fuse", [FuseCode.FUSED_NONE, FuseCode.FUSED_RELU6])
def test_pair_tables_computed_in_blocks_equal_the_whole_table(code, types, fuse):
    """The table of every pair of stored values (quantized ADD / SUB / MUL on large
    tensors), computed in blocks of rows, holds the values of one call on the whole
    256 x 256 grid, bit for bit, including ties rounded away from zero and saturation."""
    from nnapi.operand import dtype_of
    from nnapi.operations.elementwise import all_stored_values, pair_table

    low = 0 if types[0] == T.TENSOR_QUANT8_ASYMM else -128
    a = Tensor(types[0], (1, 300, 300, 1), 0.5, low + 3, None, None)
    b = Tensor(types[1], (1, 300, 300, 1), 0.25, low + 200, None, None)  # ties: halves of 0.25 / 0.5
    output = OperandType(types[0], [1, 300, 300, 1], 0.5, low + 100)
    on_stored = get_operation(code)._on_stored(ExecutionContext(code, [a, b, _scalar(T.INT32, fuse)], [output]))
    dtype = dtype_of(types[0])
    whole = on_stored(all_stored_values(dtype)[:, None], all_stored_values(dtype)[None, :])
    blocks = pair_table(on_stored, dtype, dtype)
    assert blocks.dtype == whole.dtype == dtype and blocks.shape == whole.shape == (256, 256)
    np.testing.assert_array_equal(blocks, whole)
    assert len(np.unique(whole)) >= 13  # (RELU6: 0 to 6 in steps of 0.5)


@pytest.mark.parametrize("code, kind", [(Op.CONV_2D, "quant8"), (Op.CONV_2D, "quant8_signed_per_channel"),
                                        (Op.FULLY_CONNECTED, "quant8")])  # (per-tensor filters only)
def test_few_row_quantized_products_run_transposed_and_match_reference(code, kind, monkeypatch):
    """Quantized products of few rows by a large filter (a 7x7 image's 1x1 convolution, a
    batch of 20 rows) run as filter @ rows.T (``_exact_matmul``) where they take the BLAS
    products (the integer products, where the processor has AVX-512, are switched off
    after a first comparison): the values of execute's."""
    from nnapi.operations import _conv_fast

    if code == Op.CONV_2D:
        units, depth = 512, 512
        x, w, b, out_type = _quant_case(kind, (1, 7, 7, depth), (units, 1, 1, depth), units, 0, depth)
        args = [_scalar(T.INT32, v) for v in (0, 0, 0, 0, 1, 1, FuseCode.FUSED_RELU6)]
        inputs, output = [x, w, b, *args], out_type([1, 7, 7, units])
    else:
        units, depth = 300, 512
        x, w, b, out_type = _quant_case(kind, (20, depth), (units, depth), units, 0, depth)
        inputs, output = [x, w, b, _scalar(T.INT32, FuseCode.FUSED_NONE)], out_type([20, units])
    _compare(code, inputs, output)
    _without_integer_products(monkeypatch)
    kernel = get_operation(code).plan(ExecutionContext(code, inputs, [output]))
    kernel._lay_out()
    # the case meant: few rows, a filter past the threshold, its rows read as they lie
    assert kernel.weights.size >= _conv_fast._FEW_ROWS_MIN_WEIGHTS
    assert kernel.weights.strides[0] == kernel.weights.itemsize
    _compare(code, inputs, output)


@pytest.mark.parametrize("rows, columns", [(49, 256), (64, 1024), (65, 1024), (7, 300)])
def test_exact_matmul_equals_the_direct_product(rows, columns):
    """``_exact_matmul`` (transposed for few rows) gives the direct product's exact
    integers, whole and on a slice of the summed axis, into ``out`` too."""
    from nnapi.operations import _conv_fast

    cols = RNG.integers(-255, 256, (rows, 600)).astype(np.float32)
    filter_rows = RNG.integers(-255, 256, (columns, 600)).astype(np.float32)
    weights = filter_rows.T
    np.testing.assert_array_equal(_conv_fast._exact_matmul(cols, weights), cols @ weights)
    out = np.empty((rows, columns), np.float32)
    _conv_fast._exact_matmul(cols[:, 100:400], weights[100:400], out=out)
    np.testing.assert_array_equal(out, cols[:, 100:400] @ weights[100:400])
