"""nnapi-ort-cpu on models with a dimension known only at run time: outputs whose shape a
run with the same input shapes told are written in place (no copy from memory ORT
allocates), across input shapes changing from one execution to the next on one
compilation, burst and reusable execution; a shape that follows from input values (a
RESHAPE to a shape given at run time) is refused by ORT and run again; the NDK's checks of
an argument still raise on the runtime's fast path for arrays of open shape."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

import nnapi  # noqa: E402
from helpers import reference_device  # noqa: E402
from nnapi import OperandCode as T  # noqa: E402
from nnapi import OperandType  # noqa: E402
from nnapi import OperationCode as Op  # noqa: E402
from nnapi.drivers.ort.device import OrtPreparedModel  # noqa: E402

pytestmark = pytest.mark.usefixtures("calibration_file")


def _counted_binds(monkeypatch) -> list[int]:
    """[calls of the driver's general request path (OrtPreparedModel._bind) from now on]."""
    binds = [0]
    original = OrtPreparedModel._bind

    def counted(self, *args, **kwargs):
        binds[0] += 1
        return original(self, *args, **kwargs)

    monkeypatch.setattr(OrtPreparedModel, "_bind", counted)
    return binds


def _two_outputs(declared: list[int]) -> nnapi.Model:
    """x -> (x + x, x * x), every operand of the ``declared`` (open) dimensions."""
    model = nnapi.Model()
    x = model.add_operand(OperandType(T.TENSOR_FLOAT32, declared))
    fuse = model.add_operand(OperandType(T.INT32))
    model.set_operand_value(fuse, np.int32(0))
    total = model.add_operand(OperandType(T.TENSOR_FLOAT32, [0] * len(declared)))
    square = model.add_operand(OperandType(T.TENSOR_FLOAT32, [0] * len(declared)))
    model.add_operation(Op.ADD, [x, x, fuse], [total])
    model.add_operation(Op.MUL, [x, x, fuse], [square])
    model.identify_inputs_and_outputs([x], [total, square])
    model.finish()
    return model


def _compiled(model: nnapi.Model, device: nnapi.Device) -> nnapi.Compilation:
    compilation = nnapi.Compilation(model, [device])
    compilation.finish()
    return compilation


@pytest.fixture
def landed(monkeypatch):
    """How many outputs were copied from memory ORT allocated (OrtPreparedModel._land)."""
    count = [0]
    original = OrtPreparedModel._land

    def counted(self, binding, request, late, shapes):
        count[0] += len(late)
        return original(self, binding, request, late, shapes)

    monkeypatch.setattr(OrtPreparedModel, "_land", counted)
    return count


def _run(compilation, value, outputs, *, burst=None, execution=None):
    execution = execution or nnapi.Execution(compilation)
    execution.set_input(0, value)
    for position, array in enumerate(outputs):
        execution.set_output(position, array)
    if burst is None:
        execution.compute()
    else:
        execution.burst_compute(burst)
    return execution


@pytest.mark.parametrize("how", ["compute", "burst"])
def test_outputs_of_open_shape_follow_the_input_shapes_in_place(ort_device, landed, how):
    """Batches 2, 5, 2, 5, 3 in a row on one compilation (one burst): every output equals
    the reference's and numpy's and reports its shape; only the first run at each batch
    copies its outputs from ORT's memory, later ones are written in place."""
    model = _two_outputs([0, 3])
    ours, theirs = _compiled(model, ort_device), _compiled(model, reference_device())
    bursts = (nnapi.Burst(ours), nnapi.Burst(theirs)) if how == "burst" else (None, None)
    rng = np.random.default_rng(0)
    copies = []
    for batch in (2, 5, 2, 5, 3):
        value = rng.uniform(-2, 2, (batch, 3)).astype(np.float32)
        results = []
        for compilation, burst in zip((ours, theirs), bursts, strict=True):
            outputs = [np.full((batch, 3), np.nan, np.float32) for _ in range(2)]
            execution = _run(compilation, value, outputs, burst=burst)
            assert execution.get_output_operand_dimensions(0) == [batch, 3]
            assert execution.get_output_operand_dimensions(1) == [batch, 3]
            results.append(outputs)
        np.testing.assert_array_equal(results[0][0], value + value)
        np.testing.assert_array_equal(results[0][1], value * value)
        for ort_output, reference_output in zip(*results, strict=True):
            np.testing.assert_array_equal(ort_output, reference_output)
        copies.append(landed[0])
    # two outputs copied at the first run of batches 2, 5 and 3; none at the repeats
    assert copies == [2, 4, 4, 4, 6]


def test_an_input_reshaped_in_place_and_larger_or_flat_output_buffers(ort_device, landed):
    """The same input array reshaped in place between executions runs at its new shape; an
    output buffer larger than the output (flat) gets the output's bytes first and the rest
    untouched, in place once the shape is known."""
    model = _two_outputs([0, 0])
    compilation = _compiled(model, ort_device)
    value = np.arange(12, dtype=np.float32)
    for shape in [(4, 3), (4, 3), (2, 6), (2, 6), (6, 2)]:
        value.shape = shape
        outputs = [np.zeros(shape, np.float32), np.full(20, -7, np.float32)]
        execution = _run(compilation, value, outputs)
        np.testing.assert_array_equal(outputs[0], value + value)
        np.testing.assert_array_equal(outputs[1][:12], (value * value).reshape(-1))
        np.testing.assert_array_equal(outputs[1][12:], -7)
        assert execution.get_output_operand_dimensions(1) == list(shape)
    assert landed[0] == 2 + 2 + 2  # the first run at each of the three shapes


def test_a_buffer_too_small_for_a_learned_shape(ort_device):
    """A batch whose outputs' shapes are known, given too small a buffer, is
    OUTPUT_INSUFFICIENT_SIZE with the shape needed; with a large enough one it runs."""
    model = _two_outputs([0, 3])
    compilation = _compiled(model, ort_device)
    small = np.ones((2, 3), np.float32)
    large = np.arange(15, dtype=np.float32).reshape(5, 3)
    for value in (small, large, small):
        _run(compilation, value, [np.zeros(value.shape, np.float32) for _ in range(2)])
    execution = nnapi.Execution(compilation)
    execution.set_input(0, large)
    execution.set_output(0, np.zeros((5, 3), np.float32))
    execution.set_output(1, np.zeros((2, 3), np.float32))
    with pytest.raises(nnapi.OutputInsufficientSizeError):
        execution.compute()
    with pytest.raises(nnapi.OutputInsufficientSizeError) as error:
        execution.get_output_operand_dimensions(1)
    assert error.value.dimensions == [5, 3]
    outputs = [np.zeros((5, 3), np.float32) for _ in range(2)]
    _run(compilation, large, outputs)
    np.testing.assert_array_equal(outputs[1], large * large)


def _reshape_at_run_time() -> nnapi.Model:
    """RESHAPE of a [12] input to a shape given as a model input: the output's shape
    follows from that input's values, not only from the input shapes."""
    model = nnapi.Model()
    x = model.add_operand(OperandType(T.TENSOR_FLOAT32, [12]))
    shape = model.add_operand(OperandType(T.TENSOR_INT32, [2]))
    y = model.add_operand(OperandType(T.TENSOR_FLOAT32, [0, 0]))
    model.add_operation(Op.RESHAPE, [x, shape], [y])
    model.identify_inputs_and_outputs([x, shape], [y])
    model.finish()
    return model


def test_a_shape_that_follows_from_input_values(ort_device):
    """Same input shapes, output shapes 2x6, 3x4, 6x2, 3x4 from the values of the shape
    input: each run's output equals the reshaped input (the run at a guessed shape that
    ORT refuses runs again), on new executions and on one reusable execution whose shape
    input changes in place."""
    model = _reshape_at_run_time()
    assert model.get_supported_operations_for_devices([ort_device]) == [True]
    compilation = _compiled(model, ort_device)
    value = np.arange(12, dtype=np.float32)
    for rows in (2, 3, 6, 3):
        execution = nnapi.Execution(compilation)
        execution.set_input(0, value)
        execution.set_input(1, np.array([rows, 12 // rows], np.int32))
        out = np.zeros((rows, 12 // rows), np.float32)
        execution.set_output(0, out)
        execution.compute()
        np.testing.assert_array_equal(out, value.reshape(rows, -1))
        assert execution.get_output_operand_dimensions(0) == [rows, 12 // rows]

    # a fresh compilation: its first run learns 2x6, the reusable execution binds the
    # output in place at that shape, then the shape input changes in place
    compilation = _compiled(model, ort_device)
    shape = np.array([2, 6], np.int32)
    out = np.zeros(12, np.float32)
    for reusable in (False, True):
        execution = nnapi.Execution(compilation)
        execution.set_reusable(reusable)
        execution.set_input(0, value)
        execution.set_input(1, shape)
        execution.set_output(0, out)
        execution.compute()
    for rows in (2, 4, 4, 2, 3):
        shape[:] = (rows, 12 // rows)
        out[:] = -1
        execution.compute()
        np.testing.assert_array_equal(out, value)
        assert execution.get_output_operand_dimensions(0) == [rows, 12 // rows]


def test_a_reusable_execution_made_before_its_shapes_were_known(ort_device, landed):
    """A reusable execution of a model of open shape created at its model's first run
    copies its outputs from ORT's memory once, then writes them in place."""
    model = _two_outputs([0, 3])
    compilation = _compiled(model, ort_device)
    value = np.arange(9, dtype=np.float32).reshape(3, 3)
    outputs = [np.zeros((3, 3), np.float32) for _ in range(2)]
    execution = nnapi.Execution(compilation)
    execution.set_reusable(True)
    execution.set_input(0, value)
    for position, array in enumerate(outputs):
        execution.set_output(position, array)
    for step in range(4):
        value[...] = step
        execution.compute()
        np.testing.assert_array_equal(outputs[0], value + value)
        np.testing.assert_array_equal(outputs[1], value * value)
    assert landed[0] == 2


def test_argument_checks_on_the_fast_path_for_open_shapes(ort_device):
    """Once a shape has run (set_input's fast path takes it), every NDK check of an
    argument still raises: another dtype, rank or fixed dimension, an empty input, an
    argument set twice, a read-only or mistyped output; a strided input is read as it is."""
    model = _two_outputs([0, 3])
    compilation = _compiled(model, ort_device)
    value = np.ones((2, 3), np.float32)
    for _ in range(2):
        _run(compilation, value, [np.zeros((2, 3), np.float32) for _ in range(2)])

    def execution():
        return nnapi.Execution(compilation)

    for bad in (np.ones((2, 3), np.float64), np.ones((2, 3, 1), np.float32), np.ones((2, 4), np.float32),
                np.ones(6, np.float32), np.ones((0, 3), np.float32)):
        with pytest.raises(nnapi.BadDataError):
            execution().set_input(0, bad)
    twice = execution()
    twice.set_input(0, value)
    with pytest.raises(nnapi.BadStateError):
        twice.set_input(0, value)
    read_only = np.zeros((2, 3), np.float32)
    read_only.flags.writeable = False
    with pytest.raises(nnapi.BadDataError):
        execution().set_output(0, read_only)
    with pytest.raises(nnapi.BadDataError):
        execution().set_output(0, np.zeros((2, 3), np.int32))
    missing = execution()
    missing.set_input(0, value)
    missing.set_output(0, np.zeros((2, 3), np.float32))
    with pytest.raises(nnapi.BadDataError):
        missing.compute()
    strided = np.arange(12, dtype=np.float32).reshape(2, 6)[:, ::2]
    outputs = [np.zeros((2, 3), np.float32) for _ in range(2)]
    _run(compilation, strided, outputs)
    np.testing.assert_array_equal(outputs[1], strided * strided)


def test_an_input_of_open_shape_and_outputs_of_fixed_shape(ort_device, monkeypatch):
    """REDUCE_MAX over a free batch: a new input array at a batch already run binds it
    and runs, without the general request path (OrtPreparedModel._bind: once per batch)."""
    model = nnapi.Model()
    x = model.add_operand(OperandType(T.TENSOR_FLOAT32, [0, 3]))
    axes = model.add_operand(OperandType(T.TENSOR_INT32, [1]))
    model.set_operand_value(axes, np.array([0], np.int32))
    keep = model.add_operand(OperandType(T.BOOL))
    model.set_operand_value(keep, np.bool_(False))
    y = model.add_operand(OperandType(T.TENSOR_FLOAT32, [3]))
    model.add_operation(Op.REDUCE_MAX, [x, axes, keep], [y])
    model.identify_inputs_and_outputs([x], [y])
    model.finish()
    assert model.get_supported_operations_for_devices([ort_device]) == [True]
    compilation = _compiled(model, ort_device)
    binds = _counted_binds(monkeypatch)
    rng = np.random.default_rng(1)
    for batch in (2, 5, 2, 5, 2):
        value = rng.uniform(-5, 5, (batch, 3)).astype(np.float32)  # a new array each time
        out = np.zeros(3, np.float32)
        _run(compilation, value, [out])
        np.testing.assert_array_equal(out, value.max(axis=0))
    assert binds[0] == 2


def test_a_session_on_open_shapes_allocates_the_shapes_a_run_gave(ort_device, monkeypatch):
    """nnapi.Session on a model of open shape: batches 2, 5, 2, 5 give the numpy values;
    from the second run at a batch its outputs are allocated at their shape, so the run
    takes the runtime's array path (the driver's general request path, _bind, once per
    batch); RESHAPE to a shape given at run time still gives each run's own shape."""
    session = nnapi.Session(_two_outputs([0, 3]), [ort_device])
    binds = _counted_binds(monkeypatch)
    rng = np.random.default_rng(2)
    for batch in (2, 5, 2, 5, 2):
        value = rng.uniform(-2, 2, (batch, 3)).astype(np.float32)
        results = session.run({"input0": value})
        np.testing.assert_array_equal(results["output0"], value + value)
        np.testing.assert_array_equal(results["output1"], value * value)
    assert binds[0] == 2

    session = nnapi.Session(_reshape_at_run_time(), [ort_device])
    value = np.arange(12, dtype=np.float32)
    for rows in (2, 3, 3, 6, 2, 12):
        result = session.run({"input0": value, "input1": np.array([rows, 12 // rows], np.int32)})["output0"]
        np.testing.assert_array_equal(result, value.reshape(rows, -1))
