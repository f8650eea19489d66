"""Small exact lowerings on nnapi-ort-cpu: element-wise math, lookups, requantizing
selections and parameters given at run time. Each is compared with the reference device
on real values (quantized ones bit for bit); a bad parameter given at run time fails the
run with the reference's result code; what stays declined names its rule."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

import nnapi  # noqa: E402
from helpers import build_single_op_model, reference_device  # noqa: E402
from nnapi import OperandCode as T  # noqa: E402
from nnapi import OperandType  # noqa: E402
from nnapi import OperationCode as Op  # noqa: E402
from nnapi.conformance import float_tolerance, within_tolerance  # noqa: E402
from nnapi.drivers.ort.device import OrtDevice  # noqa: E402
from nnapi.drivers.ort.lowering import lower_model  # noqa: E402
from nnapi.operand import dtype_of  # noqa: E402
from nnapi.runtime.model_builder import build_hal_model  # noqa: E402

pytestmark = pytest.mark.usefixtures("calibration_file")


class _Model:
    """A one-operation model: operands added as constants or as model inputs (with the
    value each run gives them)."""

    def __init__(self) -> None:
        self.model = nnapi.Model()
        self.inputs: list[int] = []
        self.values: list[np.ndarray] = []
        self.outputs: list[int] = []
        self.shapes: list[tuple[OperandType, tuple[int, ...]]] = []

    def given(self, operand: OperandType, value) -> int:
        index = self.model.add_operand(operand)
        self.inputs.append(index)
        self.values.append(np.asarray(value, dtype_of(operand.type)))
        return index

    def constant(self, operand: OperandType, value) -> int:
        index = self.model.add_operand(operand)
        self.model.set_operand_value(index, np.asarray(value, dtype_of(operand.type)) if value is not None else None)
        return index

    def scalar(self, code: int, value) -> int:
        return self.constant(OperandType(code), value)

    def output(self, operand: OperandType, shape: tuple[int, ...] | None = None) -> int:
        index = self.model.add_operand(operand)
        self.outputs.append(index)
        self.shapes.append((operand, tuple(operand.dimensions) if shape is None else shape))
        return index

    def operation(self, code: int, inputs: list[int]) -> nnapi.Model:
        self.model.add_operation(code, inputs, self.outputs)
        self.model.identify_inputs_and_outputs(self.inputs, self.outputs)
        self.model.finish()
        return self.model


def _compute(model: nnapi.Model, device: nnapi.Device, values: list[np.ndarray], shapes) -> list[np.ndarray] | int:
    """The outputs of ``model`` on ``device`` alone, or the NDK result code of its failure."""
    compilation = nnapi.Compilation(model, [device])
    compilation.finish()
    execution = nnapi.Execution(compilation)
    for position, value in enumerate(values):
        execution.set_input(position, value)
    outputs = [np.zeros(shape, dtype_of(operand.type)) for operand, shape in shapes]
    for position, array in enumerate(outputs):
        execution.set_output(position, array)
    try:
        execution.compute()
    except nnapi.NnapiError as error:
        return error.code
    return outputs


def _on_both(built: _Model, model: nnapi.Model, ort_device, values: list[np.ndarray] | None = None):
    """(ours, the reference's): outputs, or the result code where the run failed; the
    model runs on nnapi-ort-cpu alone (it claims every operation)."""
    assert model.get_supported_operations_for_devices([ort_device]) == [True]
    values = built.values if values is None else values
    return (_compute(model, ort_device, values, built.shapes),
            _compute(model, reference_device(), values, built.shapes))


def _reasons(model: nnapi.Model) -> list[str | None]:
    hal_model, _ = build_hal_model(model)
    return OrtDevice().get_unsupported_reasons(hal_model)


# --- element-wise math ----------------------------------------------------------------------
@pytest.mark.parametrize("code", [T.TENSOR_FLOAT32, T.TENSOR_FLOAT16])
@pytest.mark.parametrize("operation", [Op.LOG, Op.SIN])
def test_log_and_sin_are_within_the_cts_tolerance_of_the_reference(ort_device, operation, code):
    """LOG and SIN as ONNX's Log and Sin: large arguments, zeros, negatives, infinities and
    NaN give the reference's values within the CTS tolerance (NaN where it gives NaN)."""
    rng = np.random.default_rng(1)
    largest = float(np.finfo(dtype_of(code)).max)
    value = np.concatenate([rng.uniform(-1e4, 1e4, 500), rng.uniform(-10, 10, 500),
                            [0.0, -0.0, 1e-7, largest, np.inf, -np.inf, np.nan, -1.0]]).astype(dtype_of(code))
    built = _Model()
    x = built.given(OperandType(code, [value.size]), value)
    built.output(OperandType(code, [value.size]))
    ours, theirs = _on_both(built, built.operation(operation, [x]), ort_device)
    if operation == Op.LOG:
        assert np.isnan(theirs[0]).sum() > 250 and np.isinf(theirs[0]).sum() == 3
    assert within_tolerance(code, theirs[0], ours[0], float_tolerance(code)).all()


@pytest.mark.parametrize("code", [T.TENSOR_FLOAT32, T.TENSOR_FLOAT16])
@pytest.mark.parametrize("alpha", [1.0, 0.3])
def test_elu_as_vectorized_passes_is_within_the_cts_tolerance_of_the_reference(ort_device, code, alpha):
    """ELU as relu(x) + alpha * (exp(min(x, 0)) - 1) (ORT's Elu is a scalar loop, ~3x
    slower): large and small arguments of both signs, zeros and infinities give the
    reference's values within the CTS tolerance; the graph has no Elu node."""
    rng = np.random.default_rng(2)
    value = np.concatenate([rng.uniform(-20, 20, 500), rng.uniform(-1e-3, 1e-3, 200), rng.uniform(-1e4, 1e4, 100),
                            [0.0, -0.0, 1e-7, -1e-7, np.inf, -np.inf]]).astype(dtype_of(code))
    built = _Model()
    x = built.given(OperandType(code, [value.size]), value)
    built.output(OperandType(code, [value.size]))
    model = built.operation(Op.ELU, [x, built.scalar(T.FLOAT32 if code == T.TENSOR_FLOAT32 else T.FLOAT16, alpha)])
    ours, theirs = _on_both(built, model, ort_device)
    assert within_tolerance(code, theirs[0], ours[0], float_tolerance(code)).all()
    assert ours[0][-1] == np.float32(-alpha).astype(dtype_of(code)) and ours[0][-2] == np.inf
    hal_model, _ = build_hal_model(model)
    assert "Elu" not in [node.op_type for node in lower_model(hal_model)[0].graph.node]


@pytest.mark.parametrize("operation", [Op.NEG, Op.ABS])
def test_neg_and_abs_of_int32_wrap_as_the_reference(ort_device, operation):
    """NEG and ABS of TENSOR_INT32 (ONNX's Neg and Abs): -INT32_MIN and |INT32_MIN| wrap to
    INT32_MIN as two's complement, as on the reference; every value equal."""
    value = np.array([0, 1, -1, 7, -12345, 2 ** 31 - 1, -(2 ** 31), -(2 ** 31) + 1], np.int32)
    built = _Model()
    x = built.given(OperandType(T.TENSOR_INT32, [value.size]), value)
    built.output(OperandType(T.TENSOR_INT32, [value.size]))
    ours, theirs = _on_both(built, built.operation(operation, [x]), ort_device)
    np.testing.assert_array_equal(ours[0], theirs[0])
    assert ours[0][6] == -(2 ** 31)


@pytest.mark.parametrize("code", [T.TENSOR_QUANT8_ASYMM, T.TENSOR_QUANT8_ASYMM_SIGNED])
@pytest.mark.parametrize("operation", [Op.ARGMAX, Op.ARGMIN])
@pytest.mark.parametrize("shape, axis", [([1, 64, 64, 21], 3), ([1, 21, 40, 40], 1), ([2, 5, 7], 2)])
def test_quantized_argmax_and_argmin_give_the_first_extreme_as_the_reference(ort_device, code, operation, shape,
                                                                            axis):
    """A quantized ARG_MAX / ARG_MIN (a segmentation head's class map) compares the stored
    integers, read as float32 from 16,384 values on (ORT's float ArgMax is ~3x its uint8
    one), uint8 below: the reference's indices exactly, the first of equal extremes (few
    distinct values: many ties)."""
    from nnapi.drivers.ort.lowering import lower_model

    dtype = dtype_of(code)
    value = np.random.default_rng(5).integers(-3, 4, shape).astype(dtype) * 17 + (100 if dtype == np.uint8 else 0)
    built = _Model()
    x = built.given(OperandType(code, shape, 0.5, 10), value)
    built.output(OperandType(T.TENSOR_INT32, [d for i, d in enumerate(shape) if i != axis]))
    model = built.operation(operation, [x, built.scalar(T.INT32, axis)])
    ours, theirs = _on_both(built, model, ort_device)
    np.testing.assert_array_equal(ours[0], theirs[0])
    picks = np.argmax if operation == Op.ARGMAX else np.argmin
    np.testing.assert_array_equal(ours[0], picks(value, axis=axis))
    nodes = lower_model(build_hal_model(model)[0])[0].graph.node
    reduction = next(node for node in nodes if node.op_type in ("ArgMax", "ArgMin"))
    casts = [node for node in nodes if node.op_type == "Cast" and node.output[0] == reduction.input[0]]
    assert bool(casts) == (np.prod(shape) >= 16384)


# --- parameters given at run time ------------------------------------------------------------
def _dynamic_runs(model: nnapi.Model, ort_device, runs: list[list[np.ndarray]], output: OperandType):
    """Each run's one output (of dimensions known only at run time) on nnapi-ort-cpu alone
    and on the reference alone: [(ours, theirs)], each an array or the failure's result code."""
    assert model.get_supported_operations_for_devices([ort_device]) == [True]
    compilations = []
    for device in (ort_device, reference_device()):
        compilation = nnapi.Compilation(model, [device])
        compilation.finish()
        compilations.append(compilation)
    return [tuple(_output_of_run(compilation, values, [None] * len(values), output.type, 256)
                  for compilation in compilations) for values in runs]


def _output_of_run(compilation: nnapi.Compilation, values: list[np.ndarray], types: list, output_code: int,
                   capacity: int):
    """One run's one output as an array of its run-time shape, or the failure's result code
    (``types``: each input's full type where the model leaves its shape open, else None)."""
    execution = nnapi.Execution(compilation)
    for position, (value, operand) in enumerate(zip(values, types, strict=True)):
        execution.set_input(position, value, operand)
    buffer = np.zeros(capacity, dtype_of(output_code))
    execution.set_output(0, buffer)
    try:
        execution.compute()
    except nnapi.NnapiError as error:
        return error.code
    dims = execution.get_output_operand_dimensions(0)
    return buffer[:int(np.prod(dims))].reshape(dims)


def _strided_slice_model(code, masks, given_masks=False):
    shape = [3, 4, 5]
    quantized = code == T.TENSOR_QUANT8_ASYMM_SIGNED
    built = _Model()
    x = built.given(OperandType(code, shape, 0.5 if quantized else 0.0, -3 if quantized else 0),
                    np.arange(60).reshape(shape) - 30)
    vectors = [built.given(OperandType(T.TENSOR_INT32, [3]), [0, 0, 0]) for _ in range(3)]
    mask_operands = [built.given(OperandType(T.INT32), mask) if given_masks else built.scalar(T.INT32, mask)
                     for mask in masks]
    kept = 3 - bin(masks[2]).count("1")
    out = OperandType(code, [0] * max(kept, 1), 0.5 if quantized else 0.0, -3 if quantized else 0)
    built.output(out)
    return built, built.operation(Op.STRIDED_SLICE, [x, *vectors, *mask_operands]), out


def test_a_failed_run_time_check_names_the_operation_not_an_onnx_index(ort_device):
    """A parameter given at run time that breaks NNAPI's rule (a zero stride) fails the run
    with OP_FAILED naming the operation, not with the Gather index error ORT raises for
    the lowering's check."""
    built, model, out = _strided_slice_model(T.TENSOR_FLOAT32, (0, 0, 0))
    compilation = nnapi.Compilation(model, [ort_device])
    compilation.finish()
    execution = nnapi.Execution(compilation)
    for position, value in enumerate([built.values[0], *(np.array(v, np.int32) for v in ([0] * 3, [3, 4, 5],
                                                                                           [1, 0, 1]))]):
        execution.set_input(position, value)
    execution.set_output(0, np.zeros(256, np.float32))
    with pytest.raises(nnapi.OpFailedError) as failure:
        execution.compute()
    assert "STRIDED_SLICE: " in str(failure.value)
    assert "out of data bounds" not in str(failure.value) and "Gather" not in str(failure.value)


@pytest.mark.parametrize("code", [T.TENSOR_FLOAT32, T.TENSOR_QUANT8_ASYMM_SIGNED])
@pytest.mark.parametrize("masks, cases", [
    ((0, 0, 0), [  # begin, end, strides, whether the reference's run fails
        ([0, 1, 4], [3, 3, 0], [1, 1, -1], False),  # forwards and backwards
        ([-2, -9, 9], [9, 9, -9], [2, 3, -2], False),  # out of range: clamped as Android clamps
        ([0, -9, 0], [3, 0, 5], [1, -1, 1], False),  # backwards from before index 0: empty
        ([2, 0, 4], [-9, 4, -9], [-1, 1, -3], False),  # backwards to before index 0
        ([0, 0, 0], [3, 4, 5], [1, 0, 1], True),  # a zero stride
    ]),
    ((5, 2, 0), [([2, 3, 3], [0, 1, 1], [-1, -2, -1], False), ([1, 9, 2], [2, -9, 2], [1, -1, 1], False)]),
    ((0, 0, 2), [([0, 1, 0], [3, 2, 5], [1, 1, 1], False),  # the shrunk axis selects one element
                 ([0, -1, 0], [3, 4, 5], [2, 1, 2], False),
                 ([0, 1, 0], [3, 3, 5], [1, 1, 1], True),  # two elements
                 ([0, 2, 0], [3, 1, 5], [1, -1, 1], True)]),  # a negative stride
    ((0, 0, 7), [([1, 2, -1], [2, 3, 5], [1, 1, 1], False),  # every axis shrunk: shape [1]
                 ([1, 2, 3], [2, 3, 5], [1, 1, 1], True)]),
])
def test_strided_slice_parameters_given_at_run_time_equal_the_reference(ort_device, code, masks, cases):
    """STRIDED_SLICE with begin, end and strides as model inputs (the CTS's
    all_tensors_as_inputs): every case gives the reference's shape and values, clamping as
    Android does (ONNX's Slice alone would read a negative backwards begin from the end), and
    where the reference's run fails (a zero stride, a shrunk axis not selecting exactly one
    element with a positive stride) nnapi-ort-cpu's fails with the same result code."""
    built, model, out = _strided_slice_model(code, masks)
    x = built.values[0]
    runs = [[x, *(np.array(v, np.int32) for v in case[:3])] for case in cases]
    for (ours, theirs), case in zip(_dynamic_runs(model, ort_device, runs, out), cases):
        if case[3]:
            assert ours == theirs == nnapi.ResultCode.OP_FAILED
        else:
            assert isinstance(theirs, np.ndarray)
            np.testing.assert_array_equal(ours, theirs)
            assert ours.shape == theirs.shape and (ours.size or case[0] == [0, -9, 0])
    if masks == (0, 0, 7):
        assert _dynamic_runs(model, ort_device, runs[:1], out)[0][0].shape == (1,)


def test_strided_slice_masks_given_at_run_time_are_declined():
    _, model, _ = _strided_slice_model(T.TENSOR_FLOAT32, (0, 0, 1), given_masks=True)
    (reason,) = _reasons(model)
    assert "begin_mask" in reason and "run time" in reason


def test_an_empty_strided_slice_is_declined_as_empty():
    """A STRIDED_SLICE selecting nothing along an axis (begin 2, end 1, stride 1: the
    reference's output is zero-sized, as TFLite's) is declined naming the empty result,
    not the output operand (which allows it)."""
    model, _, _keep = build_single_op_model(Op.STRIDED_SLICE, [
        (OperandType(T.TENSOR_FLOAT32, [2, 3]), None),
        (OperandType(T.TENSOR_INT32, [2]), [0, 2]), (OperandType(T.TENSOR_INT32, [2]), [2, 1]),
        (OperandType(T.TENSOR_INT32, [2]), [1, 1]),
        (OperandType(T.INT32), 0), (OperandType(T.INT32), 0), (OperandType(T.INT32), 0)],
        [OperandType(T.TENSOR_FLOAT32, [2, 0])])
    (reason,) = _reasons(model)
    assert reason is not None and "selects no element" in reason and "[2, 0]" in reason
    assert "output operand" not in reason


def _mean_model(code, rank_shape, keep, given_keep=False):
    quantized = code in (T.TENSOR_QUANT8_ASYMM, T.TENSOR_QUANT8_ASYMM_SIGNED)
    scale, zero_point = (0.25, -7 if code == T.TENSOR_QUANT8_ASYMM_SIGNED else 9) if quantized else (0.0, 0)
    built = _Model()
    x = built.given(OperandType(code, rank_shape, scale, zero_point), np.zeros(rank_shape))
    axes = built.given(OperandType(T.TENSOR_INT32, [3]), [0, 0, 0])
    keep_dims = built.given(OperandType(T.INT32), keep) if given_keep else built.scalar(T.INT32, keep)
    out = OperandType(code, [0] * len(rank_shape) if keep else [], scale, zero_point)  # (rank unknown)
    built.output(out)
    return built, built.operation(Op.MEAN, [x, axes, keep_dims]), out


@pytest.mark.parametrize("code", [T.TENSOR_FLOAT32, T.TENSOR_QUANT8_ASYMM, T.TENSOR_QUANT8_ASYMM_SIGNED])
@pytest.mark.parametrize("keep", [0, 1])
def test_mean_axes_given_at_run_time_equal_the_reference(ort_device, code, keep):
    """MEAN over axes given at run time, repeated and negative ones included: floats within
    the CTS tolerance, quantized means (the halves rounded away from zero, from the exact
    integer sums) bit for bit; every axis reduced without keep_dims gives shape [1]; an axis
    out of range fails the run as on the reference."""
    shape = [2, 3, 4]
    built, model, out = _mean_model(code, shape, keep)
    rng = np.random.default_rng(7)
    dtype = dtype_of(code)
    if code == T.TENSOR_FLOAT32:
        x = rng.standard_normal(shape).astype(dtype)
    else:
        info = np.iinfo(dtype)
        x = rng.integers(info.min, info.max + 1, shape).astype(dtype)
        x.reshape(-1)[:4] = [info.min, info.min + 1, info.min, info.min + 1]  # a mean of .5 to round
    cases = [[1, 1, -1], [-3, 0, 2], [0, -2, 2], [2, 2, 2], [0, 3, 1], [-4, 0, 0]]  # the last two: out of range
    runs = [[x, np.array(axes, np.int32)] for axes in cases]
    results = _dynamic_runs(model, ort_device, runs, out)
    for ours, theirs in results[:4]:
        assert isinstance(theirs, np.ndarray) and ours.shape == theirs.shape
        if code == T.TENSOR_FLOAT32:
            assert within_tolerance(code, theirs, ours, float_tolerance(code)).all()
        else:
            np.testing.assert_array_equal(ours, theirs)
    assert results[2][0].shape == ((1, 1, 1) if keep else (1,))
    for ours, theirs in results[4:]:
        assert ours == theirs == nnapi.ResultCode.OP_FAILED


def test_mean_keep_dims_given_at_run_time_is_declined():
    _, model, _ = _mean_model(T.TENSOR_FLOAT32, [2, 3, 4], 1, given_keep=True)
    (reason,) = _reasons(model)
    assert "keep_dims" in reason and "run time" in reason


# --- lookups --------------------------------------------------------------------------------
@pytest.mark.parametrize("code", [T.TENSOR_FLOAT32, T.TENSOR_FLOAT16, T.TENSOR_INT32, T.TENSOR_QUANT8_ASYMM,
                                  T.TENSOR_QUANT8_ASYMM_SIGNED])
def test_embedding_lookup_copies_the_reference_rows_and_refuses_rows_out_of_range(ort_device, code):
    """EMBEDDING_LOOKUP as Gather: the rows of every value type bit for bit (repeats
    included); a lookup below 0 (which Gather alone would count from the end) or past the
    last row fails the run with the reference's result code."""
    quantized = code in (T.TENSOR_QUANT8_ASYMM, T.TENSOR_QUANT8_ASYMM_SIGNED)
    table_type = OperandType(code, [4, 2, 3], 0.5 if quantized else 0.0, 1 if quantized else 0)
    table = (np.arange(24).reshape(4, 2, 3) * 5 % 97 - 40).astype(dtype_of(code))
    built = _Model()
    lookups = built.given(OperandType(T.TENSOR_INT32, [5]), [3, 0, 3, 1, 2])
    values = built.given(table_type, table)
    built.output(OperandType(code, [5, 2, 3], table_type.scale, table_type.zero_point))
    model = built.operation(Op.EMBEDDING_LOOKUP, [lookups, values])
    ours, theirs = _on_both(built, model, ort_device)
    np.testing.assert_array_equal(ours[0], table[[3, 0, 3, 1, 2]])
    np.testing.assert_array_equal(ours[0], theirs[0])
    for bad in ([0, 1, -1, 2, 3], [0, 1, 4, 2, 3]):
        ours, theirs = _on_both(built, model, ort_device, [np.array(bad, np.int32), table])
        assert ours == theirs == nnapi.ResultCode.OP_FAILED


@pytest.mark.parametrize("code", [T.TENSOR_FLOAT32, T.TENSOR_INT32, T.TENSOR_QUANT8_ASYMM])
def test_hashtable_lookup_gives_the_reference_rows_hits_and_zeros(ort_device, code):
    """HASHTABLE_LOOKUP: each lookup's row where a key equals it (the first of equal keys,
    as the reference's binary search finds), stored zeros where none does (0, not the zero
    point; +0), and the hits as TENSOR_QUANT8_ASYMM 1 / 0: both outputs bit for bit, a
    found -0 kept."""
    quantized = code == T.TENSOR_QUANT8_ASYMM
    keys = np.array([-50, 3, 3, 7, 2 ** 31 - 1], np.int32)
    table = (np.arange(10).reshape(5, 2) * 7 + 20).astype(dtype_of(code))
    if code == T.TENSOR_FLOAT32:
        table[0] = [-0.0, np.inf]  # a -0 found stays -0 (ORT's Where made it +0)
    lookups = np.array([7, 8, 3, -50, 0, 2 ** 31 - 1, -(2 ** 31)], np.int32)
    built = _Model()
    lookup_index = built.given(OperandType(T.TENSOR_INT32, [7]), lookups)
    key_index = built.given(OperandType(T.TENSOR_INT32, [5]), keys)
    values = built.given(OperandType(code, [5, 2], 0.5 if quantized else 0.0, 9 if quantized else 0), table)
    built.output(OperandType(code, [7, 2], 0.5 if quantized else 0.0, 9 if quantized else 0))
    built.output(OperandType(T.TENSOR_QUANT8_ASYMM, [7], 1.0, 0))
    model = built.operation(Op.HASHTABLE_LOOKUP, [lookup_index, key_index, values])
    ours, theirs = _on_both(built, model, ort_device)
    np.testing.assert_array_equal(ours[1], [1, 0, 1, 1, 0, 1, 0])
    np.testing.assert_array_equal(ours[0], np.where(ours[1][:, None] == 1, table[[3, 0, 1, 0, 0, 4, 0]], 0))
    for mine, expected in zip(ours, theirs):
        assert mine.dtype == expected.dtype
        np.testing.assert_array_equal(mine, expected)
    if code == T.TENSOR_FLOAT32:
        np.testing.assert_array_equal(np.signbit(ours[0][:, 0]), [False, False, False, True, False, False, False])


def test_hashtable_lookup_with_more_keys_than_rows_fails_as_on_the_reference(ort_device):
    """Keys whose count is known only at run time: more keys than rows of values fails the
    run on both devices (the reference checks it; Gather alone might not notice)."""
    built = _Model()
    lookup_index = built.given(OperandType(T.TENSOR_INT32, [2]), [1, 2])
    key_index = built.given(OperandType(T.TENSOR_INT32, [0]), [1, 2, 3])
    values = built.given(OperandType(T.TENSOR_FLOAT32, [2, 2]), np.ones((2, 2)))
    built.output(OperandType(T.TENSOR_FLOAT32, [2, 2]))
    built.output(OperandType(T.TENSOR_QUANT8_ASYMM, [2], 1.0, 0))
    model = built.operation(Op.HASHTABLE_LOOKUP, [lookup_index, key_index, values])
    assert model.get_supported_operations_for_devices([ort_device]) == [True]
    codes = []
    for device in (ort_device, reference_device()):
        compilation = nnapi.Compilation(model, [device])
        compilation.finish()
        execution = nnapi.Execution(compilation)
        execution.set_input(0, built.values[0])
        execution.set_input(1, built.values[1], OperandType(T.TENSOR_INT32, [3]))
        execution.set_input(2, built.values[2])
        execution.set_output(0, np.zeros((2, 2), np.float32))
        execution.set_output(1, np.zeros(2, np.uint8))
        with pytest.raises(nnapi.NnapiError) as failure:
            execution.compute()
        codes.append(failure.value.code)
    assert codes == [nnapi.ResultCode.OP_FAILED] * 2


def _unsorted_lookup() -> tuple[_Model, nnapi.Model]:
    """HASHTABLE_LOOKUP of lookups [3, 7] in keys given at run time out of order, [7, 3, 5]."""
    built = _Model()
    lookup_index = built.given(OperandType(T.TENSOR_INT32, [2]), [3, 7])
    key_index = built.given(OperandType(T.TENSOR_INT32, [3]), [7, 3, 5])
    values = built.given(OperandType(T.TENSOR_FLOAT32, [3, 1]), [[1], [2], [3]])
    built.output(OperandType(T.TENSOR_FLOAT32, [2, 1]))
    built.output(OperandType(T.TENSOR_QUANT8_ASYMM, [2], 1.0, 0))
    return built, built.operation(Op.HASHTABLE_LOOKUP, [lookup_index, key_index, values])


def test_hashtable_lookup_with_unsorted_keys_fails_on_both_devices(ort_device):
    """Keys given at run time out of order (NNAPI requires them sorted ascending): the run
    fails on both devices with OP_FAILED (the reference's binary search would miss key 3,
    an [k, n] comparison would find it: never two silent answers), the ORT device's message
    naming the rule; sorted keys with equal neighbours still run, the same on both."""
    built, model = _unsorted_lookup()
    assert model.get_supported_operations_for_devices([ort_device]) == [True]
    for device in (ort_device, reference_device()):
        compilation = nnapi.Compilation(model, [device])
        compilation.finish()
        execution = nnapi.Execution(compilation)
        for position, value in enumerate(built.values):
            execution.set_input(position, value)
        execution.set_output(0, np.zeros((2, 1), np.float32))
        execution.set_output(1, np.zeros(2, np.uint8))
        with pytest.raises(nnapi.OpFailedError, match=r"keys\) must be sorted ascending"):
            execution.compute()
    built.values[1] = np.array([3, 3, 7], np.int32)
    ours, theirs = _on_both(built, model, ort_device)
    np.testing.assert_array_equal(ours[0], [[1], [3]])
    for mine, expected in zip(ours, theirs):
        np.testing.assert_array_equal(mine, expected)


def test_a_failed_run_prints_nothing_of_its_own(ort_device, capfd):
    """A run that fails (keys out of order) reaches the caller as an NnapiError only: ORT
    logged each failed node to stderr as well ("[E:onnxruntime:, sequential_executor.cc
    ... ExecuteKernel] Non-zero status code ..."), in red, beside the error the caller
    already has."""
    built, model = _unsorted_lookup()
    capfd.readouterr()
    assert _compute(model, ort_device, built.values, built.shapes) == nnapi.ResultCode.OP_FAILED
    captured = capfd.readouterr()
    assert "onnxruntime" not in captured.err and captured.out == ""


def test_hashtable_lookup_with_large_unsorted_constant_keys_is_declined_naming_the_rule(ort_device):
    """Constant keys too large to be checked at add_operation (over 128 bytes) and out of
    order: the ORT device declines the operation naming the rule, so the runtime runs it on
    the reference, whose run fails (OP_FAILED) naming it too."""
    built = _Model()
    lookup_index = built.given(OperandType(T.TENSOR_INT32, [2]), [3, 7])
    keys = np.arange(40, dtype=np.int32)[::-1].copy()
    key_index = built.constant(OperandType(T.TENSOR_INT32, [40]), keys)
    values = built.constant(OperandType(T.TENSOR_FLOAT32, [40, 1]), np.ones((40, 1)))
    built.output(OperandType(T.TENSOR_FLOAT32, [2, 1]))
    built.output(OperandType(T.TENSOR_QUANT8_ASYMM, [2], 1.0, 0))
    model = built.operation(Op.HASHTABLE_LOOKUP, [lookup_index, key_index, values])
    assert model.get_supported_operations_for_devices([ort_device]) == [False]
    assert "sorted ascending" in _reasons(model)[0]
    compilation = nnapi.Compilation(model, [ort_device, reference_device()])
    compilation.finish()
    execution = nnapi.Execution(compilation)
    execution.set_input(0, built.values[0])
    execution.set_output(0, np.zeros((2, 1), np.float32))
    execution.set_output(1, np.zeros(2, np.uint8))
    with pytest.raises(nnapi.OpFailedError, match=r"keys\) must be sorted ascending"):
        execution.compute()


# --- requantizing selections ----------------------------------------------------------------
_REQUANTIZINGS = [  # (input 1, input 2, output) scales and zero points (int8's shifted by -128)
    ((0.5, 127), (1.0, 100), (2.0, 80)),
    ((1.0, 128), (1.0, 128), (0.5, 128)),  # the CTS's overflow case: both saturate
    ((0.37, 3), (0.05, 250), (0.2, 131)),
    ((0.5, 128), (0.25, 0), (0.5, 128)),  # the first already in the output's quantization
]


@pytest.mark.parametrize("code", [T.TENSOR_QUANT8_ASYMM, T.TENSOR_QUANT8_ASYMM_SIGNED])
@pytest.mark.parametrize("quantizations", _REQUANTIZINGS)
@pytest.mark.parametrize("operation", [Op.MAXIMUM, Op.MINIMUM, Op.SELECT])
def test_requantizing_selections_equal_the_reference_on_every_pair(ort_device, operation, quantizations, code):
    """MAXIMUM, MINIMUM and SELECT whose output quantization differs from their inputs':
    every one of the 65,536 pairs of stored values (and for SELECT, either choice) gives
    the reference's stored value bit for bit, the halves rounded away from zero as its
    requantization does."""
    shift = 128 if code == T.TENSOR_QUANT8_ASYMM_SIGNED else 0
    types = [OperandType(code, [256, 256], scale, zero_point - shift) for scale, zero_point in quantizations]
    stored = (np.arange(256) - shift).astype(dtype_of(code))
    first, second = np.repeat(stored, 256).reshape(256, 256), np.tile(stored, 256).reshape(256, 256)
    built = _Model()
    inputs = []
    if operation == Op.SELECT:
        inputs.append(built.given(OperandType(T.TENSOR_BOOL8, [256, 256]), np.arange(65536).reshape(256, 256) % 3 > 0))
    inputs += [built.given(types[0], first), built.given(types[1], second)]
    built.output(types[2])
    ours, theirs = _on_both(built, built.operation(operation, inputs), ort_device)
    np.testing.assert_array_equal(ours[0], theirs[0])
    assert len(np.unique(ours[0])) > 40


@pytest.mark.parametrize("operation", [Op.MAXIMUM, Op.MINIMUM])
def test_quantized_selections_without_a_uint8_max_kernel_compare_instead(ort_device, monkeypatch, operation):
    """onnxruntime before 1.24 has no uint8 Max / Min (1.19-1.23 refused the CTS's quantized
    MAXIMUM / MINIMUM models): there the choice is Where(Less(a, b), ...), exact on every
    pair of stored values, and before 1.21 (no uint8 Less either) the operation is declined."""
    from nnapi.drivers.ort import builder, convolutions, data_movement, elementwise, pooling

    for module in (data_movement, elementwise, pooling):  # the modules that read it
        monkeypatch.setattr(module, "has_kernel", lambda op_type, element, **attributes: op_type not in ("Max", "Min"))
    kind = OperandType(T.TENSOR_QUANT8_ASYMM, [256, 256], 0.5, 128)
    stored = np.arange(256)
    built = _Model()
    inputs = [built.given(kind, np.repeat(stored, 256).reshape(256, 256)),
              built.given(kind, np.tile(stored, 256).reshape(256, 256))]
    built.output(kind)
    model = built.operation(operation, inputs)
    assert _reasons(model) == [None]
    ours, theirs = _on_both(built, model, ort_device)
    np.testing.assert_array_equal(ours[0], theirs[0])
    assert len(np.unique(ours[0])) == 256
    for module in (builder, convolutions, elementwise):  # the modules that read it
        monkeypatch.setattr(module, "onnxruntime_at_least", lambda version: version < elementwise.UINT8_LESS_VERSION)
    (reason,) = _reasons(model)
    assert "no uint8" in reason


def test_a_requantizing_table_the_reference_does_not_confirm_is_declined(monkeypatch):
    """The tables are checked against the reference's own operation at preparation: one
    that differs (here made wrong on purpose) declines the operation, naming why."""
    from nnapi.drivers.ort import requantize

    wrong = requantize._table.__wrapped__
    monkeypatch.setattr(requantize, "_table", lambda source, output: np.roll(wrong(source, output), 1))
    monkeypatch.setattr(requantize, "_proven", requantize._proven.__wrapped__)
    built = _Model()
    a = built.given(OperandType(T.TENSOR_QUANT8_ASYMM, [4], 0.5, 127), np.zeros(4))
    b = built.given(OperandType(T.TENSOR_QUANT8_ASYMM, [4], 1.0, 100), np.zeros(4))
    built.output(OperandType(T.TENSOR_QUANT8_ASYMM, [4], 2.0, 80))
    (reason,) = _reasons(built.operation(Op.MAXIMUM, [a, b]))
    assert "requantizing" in reason


# --- shapes known only at run time ------------------------------------------------------------
def _runs_with_input_types(model, device, runs, output_code, capacity=512):
    """Each run's (input values, their types) on ``device`` alone: the one output as an
    array of its run-time shape, or the result code of the failure."""
    compilation = nnapi.Compilation(model, [device])
    compilation.finish()
    return [_output_of_run(compilation, values, types, output_code, capacity) for values, types in runs]


def test_slice_of_an_input_whose_shape_is_known_at_run_time_checks_its_bounds_then(ort_device):
    """SLICE with constant begin / size of an input declared without dimensions: the
    bounds are checked against the run's shape (a slice past the end fails the run as on
    the reference), and the values are the reference's."""
    built = _Model()
    x = built.given(OperandType(T.TENSOR_FLOAT32, [0, 0]), np.zeros((1, 1)))
    begin = built.constant(OperandType(T.TENSOR_INT32, [2]), [1, 0])
    size = built.constant(OperandType(T.TENSOR_INT32, [2]), [2, -1])
    built.output(OperandType(T.TENSOR_FLOAT32, [0, 0]))
    model = built.operation(Op.SLICE, [x, begin, size])
    assert model.get_supported_operations_for_devices([ort_device]) == [True]
    runs = []
    for shape in ((3, 4), (5, 2), (2, 4)):  # the last: rows 1..2 of 2 do not exist
        value = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
        runs.append(([value], [OperandType(T.TENSOR_FLOAT32, list(shape))]))
    ours = _runs_with_input_types(model, ort_device, runs, T.TENSOR_FLOAT32)
    theirs = _runs_with_input_types(model, reference_device(), runs, T.TENSOR_FLOAT32)
    for mine, expected, (values, _) in zip(ours[:2], theirs[:2], runs):
        np.testing.assert_array_equal(mine, values[0][1:3])
        np.testing.assert_array_equal(mine, expected)
    assert ours[2] == theirs[2] == nnapi.ResultCode.OP_FAILED


@pytest.mark.parametrize("code", [T.TENSOR_FLOAT32, T.TENSOR_QUANT8_ASYMM])
def test_resize_bilinear_of_a_batch_known_at_run_time(ort_device, code):
    """RESIZE_BILINEAR of an input whose batch is known only at run time (the height, width
    and channels declared): the output's batch is the input's, the values the reference's
    within the CTS tolerance."""
    quantized = code == T.TENSOR_QUANT8_ASYMM
    scale, zero_point = (0.5, 100) if quantized else (0.0, 0)
    built = _Model()
    x = built.given(OperandType(code, [0, 2, 3, 2], scale, zero_point), np.zeros((1, 2, 3, 2)))
    width, height = built.scalar(T.INT32, 5), built.scalar(T.INT32, 4)
    built.output(OperandType(code, [0, 4, 5, 2], scale, zero_point))
    model = built.operation(Op.RESIZE_BILINEAR, [x, width, height])
    assert model.get_supported_operations_for_devices([ort_device]) == [True]
    rng = np.random.default_rng(3)
    runs = []
    for batch in (1, 3):
        value = (rng.integers(0, 256, (batch, 2, 3, 2)) if quantized else rng.standard_normal((batch, 2, 3, 2)))
        runs.append(([value.astype(dtype_of(code))], [OperandType(code, [batch, 2, 3, 2], scale, zero_point)]))
    ours = _runs_with_input_types(model, ort_device, runs, code)
    theirs = _runs_with_input_types(model, reference_device(), runs, code)
    for mine, expected, batch in zip(ours, theirs, (1, 3)):
        assert mine.shape == expected.shape == (batch, 4, 5, 2)
        assert within_tolerance(code, expected, mine, float_tolerance(code)).all()


def test_gather_of_an_input_whose_shape_is_known_at_run_time_refuses_indices_out_of_range(ort_device):
    """GATHER of an input declared without dimensions: valid indices give the reference's
    rows; a negative index (which Gather alone would count from the end) or one past the
    run's size fails the run on both devices."""
    built = _Model()
    x = built.given(OperandType(T.TENSOR_FLOAT32, [0, 0]), np.zeros((1, 1)))
    axis = built.scalar(T.INT32, 0)
    indices = built.given(OperandType(T.TENSOR_INT32, [2]), [0, 0])
    built.output(OperandType(T.TENSOR_FLOAT32, [0, 0]))
    model = built.operation(Op.GATHER, [x, axis, indices])
    assert model.get_supported_operations_for_devices([ort_device]) == [True]
    value = np.arange(12, dtype=np.float32).reshape(4, 3)
    types = [OperandType(T.TENSOR_FLOAT32, [4, 3]), None]
    runs = [([value, np.array(chosen, np.int32)], types) for chosen in ([3, 1], [-1, 0], [0, 4])]
    ours = _runs_with_input_types(model, ort_device, runs, T.TENSOR_FLOAT32)
    theirs = _runs_with_input_types(model, reference_device(), runs, T.TENSOR_FLOAT32)
    np.testing.assert_array_equal(ours[0], value[[3, 1]])
    np.testing.assert_array_equal(ours[0], theirs[0])
    assert ours[1] == theirs[1] == ours[2] == theirs[2] == nnapi.ResultCode.OP_FAILED


def test_int32_div_is_floor_division_as_on_the_reference(ort_device) -> None:
    """DIV of TENSOR_INT32 (TFLite's FLOOR_DIV / FLOOR_MOD import as it) runs on
    nnapi-ort-cpu (it was declined) and equals the reference bit for bit: floor division
    with every sign pair, a zero divisor giving 0, INT32_MIN / -1 wrapping, broadcasting."""
    a = np.array([[7, -7, 7, -7, 0, 5, -2**31, -2**31, 2**31 - 1, 13, -13, -1]], np.int32)
    b = np.array([[2, 2, -2, -2, 3, 0, -1, 1, -1, 0, 5, 2**31 - 1]], np.int32)
    column = np.array([[3], [-4]], np.int32)
    for left, right in ((a, b), (a, column)):
        shape = np.broadcast_shapes(left.shape, right.shape)
        built = _Model()
        x = built.given(OperandType(T.TENSOR_INT32, list(left.shape)), left)
        y = built.given(OperandType(T.TENSOR_INT32, list(right.shape)), right)
        act = built.scalar(T.INT32, 0)
        built.output(OperandType(T.TENSOR_INT32, list(shape)))
        model = built.operation(Op.DIV, [x, y, act])
        got, want = _on_both(built, model, ort_device)
        np.testing.assert_array_equal(got[0], want[0])
        floor = np.floor_divide(left.astype(np.int64), np.where(right == 0, 1, right)).astype(np.int32)
        np.testing.assert_array_equal(got[0], np.where(right == 0, 0, floor))



def test_random_multinomial_is_declined_naming_the_run_time_seeds():
    """The samples follow the seeds given at run time, which ONNX's Multinomial (a seed
    attribute, its generator advancing from run to run) cannot: declined with that reason."""
    model = nnapi.Model()
    logits = model.add_operand(OperandType(T.TENSOR_FLOAT32, [1, 4]))
    count = model.add_operand(OperandType(T.INT32))
    model.set_operand_value(count, 8)
    seeds = model.add_operand(OperandType(T.TENSOR_INT32, [2]))
    out = model.add_operand(OperandType(T.TENSOR_INT32, [1, 8]))
    model.add_operation(Op.RANDOM_MULTINOMIAL, [logits, count, seeds], [out])
    model.identify_inputs_and_outputs([logits, seeds], [out])
    model.finish()
    [why] = OrtDevice().get_unsupported_reasons(build_hal_model(model)[0])
    assert why is not None and "seeds given at run time" in why and "Multinomial" in why


def _bits(array: np.ndarray) -> np.ndarray:
    return array.view(np.int32 if array.dtype == np.float32 else np.int16)


@pytest.mark.parametrize("code", [T.TENSOR_FLOAT32, T.TENSOR_FLOAT16])
@pytest.mark.parametrize("condition_from", ["input", "EQUAL", "NOT_EQUAL", "LOGICAL_NOT of NOT_EQUAL"])
@pytest.mark.parametrize("constants, constant_zeros", [
    (None, "-0"), ("first", "-0"), ("second", "-0"), ("both", "-0"),
    ("first", "+0 only"), ("second", "+0 only"), ("both", "+0 only")])
def test_float_select_keeps_the_sign_of_a_zero(ort_device, code, condition_from, constants, constant_zeros):
    """SELECT picks its values bit for bit, -0 included: ONNX Runtime's Where (1.32) gives +0
    where it picks -0 from its first value input, and its optimizer turns Where(Not(c), a, b)
    into Where(c, b, a), so a condition from NOT_EQUAL (Not(Equal)) loses -0 from the other
    input (a TFLite ONE_HOT with off_value -0 is SELECT(EQUAL(...), on, -0)). Compared with
    the reference bit for bit: values picked from either side, given at run time or constant
    (with -0s, or +0s only: exact_where's Where forms), with a condition given, from EQUAL or
    from NOT_EQUAL, or from a LOGICAL_NOT of NOT_EQUAL (two Nots: the Where of the negated
    condition must not read the inner Not's input)."""
    dtype = dtype_of(code)
    count = 64
    rng = np.random.default_rng(5)
    special = np.array([-0.0, 0.0, -1.5, 2.0, np.inf, -np.inf, np.nan, -0.0], dtype)
    first = np.where(np.arange(count) % 2 == 0, -0.0, np.resize(special, count)).astype(dtype)
    second = np.where(np.arange(count) % 3 == 0, -0.0, np.resize(special[::-1], count)).astype(dtype)
    model = nnapi.Model()
    inputs, values = [], []

    def given(operand_type, value):
        index = model.add_operand(operand_type)
        inputs.append(index)
        values.append(value)
        return index

    tensor = OperandType(code, [count])
    left = rng.integers(0, 3, count).astype(np.int32)
    right = rng.integers(0, 3, count).astype(np.int32)
    if condition_from == "input":
        condition = given(OperandType(T.TENSOR_BOOL8, [count]), left > right)
    else:
        a, b = given(OperandType(T.TENSOR_INT32, [count]), left), given(OperandType(T.TENSOR_INT32, [count]), right)
        condition = model.add_operand(OperandType(T.TENSOR_BOOL8, [count]))
        model.add_operation(Op[condition_from.split()[-1]], [a, b], [condition])
        if condition_from.startswith("LOGICAL_NOT"):
            negated, condition = condition, model.add_operand(OperandType(T.TENSOR_BOOL8, [count]))
            model.add_operation(Op.LOGICAL_NOT, [negated], [condition])
    picked = []
    for which, value in (("first", first), ("second", second)):
        if constants in (which, "both"):
            if constant_zeros == "+0 only":
                value = np.where((value == 0) & np.signbit(value), 3.0, value).astype(dtype)
            index = model.add_operand(tensor)
            model.set_operand_value(index, value)
        else:
            index = given(tensor, value)
        picked.append(index)
    output = model.add_operand(tensor)
    model.add_operation(Op.SELECT, [condition, *picked], [output])
    model.identify_inputs_and_outputs(inputs, [output])
    model.finish()
    assert model.get_supported_operations_for_devices([ort_device]) == [True] * model.operation_count
    shapes = [(tensor, (count,))]
    ours, theirs = _compute(model, ort_device, values, shapes), _compute(model, reference_device(), values, shapes)
    np.testing.assert_array_equal(_bits(ours[0]), _bits(theirs[0]))
    zeros = theirs[0] == 0
    assert np.signbit(theirs[0][zeros]).any() == ((constants, constant_zeros) != ("both", "+0 only"))
    assert not np.signbit(theirs[0][zeros]).all()


_SPECIAL = np.array([np.nan, -0.0, 0.0, 1.0, -1.0, 2.5, np.inf, -np.inf], np.float32)


@pytest.mark.parametrize("operation", [Op.MAXIMUM, Op.MINIMUM])
@pytest.mark.parametrize("form, node", [
    ("both given", "GatherElements"),   # a -0 on either side: the bits picked exactly
    ("given row over given", "GatherElements"),
    ("+0", None),                       # MAXIMUM: Relu, MINIMUM: Clip
    ("-0", "Clip"), ("2.5", "Clip"), ("NaN", "Where"),
    ("constants with +0 and NaN", "Where"), ("constants without", None),
    ("constant first", "GatherElements"),  # it holds a -0
])
def test_float_maximum_minimum_are_std_max_min_on_nan_and_signed_zeros(ort_device, operation, form, node):
    """Float MAXIMUM / MINIMUM as Android's std::max / std::min (a NaN second input gives
    the first, a NaN first NaN, of -0 and +0 the first): ONNX's Max / Min gave NaN for
    either NaN and of equal values the second (or the scalar). Every pair of special
    values, against the reference's bits; the fast forms where no NaN or tie of zeros can
    differ (Relu, Clip, Max)."""
    a_values = np.repeat(_SPECIAL, _SPECIAL.size).reshape(_SPECIAL.size, _SPECIAL.size)
    b_values = np.tile(_SPECIAL, _SPECIAL.size).reshape(_SPECIAL.size, _SPECIAL.size)
    shape = [_SPECIAL.size, _SPECIAL.size]
    built = _Model()
    kind = OperandType(T.TENSOR_FLOAT32, shape)
    row = OperandType(T.TENSOR_FLOAT32, [_SPECIAL.size])
    one = OperandType(T.TENSOR_FLOAT32, [1])
    if form == "both given":
        inputs = [built.given(kind, a_values), built.given(kind, b_values)]
    elif form == "given row over given":
        inputs = [built.given(kind, a_values), built.given(row, _SPECIAL)]
    elif form in ("+0", "-0", "2.5", "NaN"):
        inputs = [built.given(kind, a_values), built.constant(one, [float(form.lower())])]
    elif form == "constants with +0 and NaN":
        inputs = [built.given(kind, a_values), built.constant(row, np.abs(_SPECIAL))]
    elif form == "constants without":
        inputs = [built.given(kind, a_values), built.constant(row, [3.0, -1.0, 2.0, 1e-30, -7.0, 1.0, 9.0, -np.inf])]
    else:
        inputs = [built.constant(row, _SPECIAL), built.given(kind, a_values)]
    built.output(kind)
    model = built.operation(operation, inputs)
    ours, theirs = _on_both(built, model, ort_device)
    np.testing.assert_array_equal(ours[0].view(np.uint32), theirs[0].view(np.uint32))
    if form == "both given":
        want = np.where(a_values < b_values, b_values, a_values) if operation == Op.MAXIMUM else \
            np.where(b_values < a_values, b_values, a_values)
        np.testing.assert_array_equal(ours[0].view(np.uint32), want.view(np.uint32))
        assert ours[0][3, 0] == 1.0 and np.isnan(ours[0][0, 3]) and np.signbit(ours[0][1, 2])
    graph = lower_model(build_hal_model(model)[0])[0].graph
    types = {n.op_type for n in graph.node}
    if node is None:
        node = {("+0", Op.MAXIMUM): "Relu", ("+0", Op.MINIMUM): "Clip"}.get(
            (form, operation), "Max" if operation == Op.MAXIMUM else "Min")
    assert node in types, types
    assert ("Max" in types or "Min" in types) == (form == "constants without"), types
