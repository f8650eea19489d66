"""The ONNX Runtime driver's execution path: IO binding (bound once per reusable execution,
again per execution only for an argument that moved), request checks, deadlines honoured
mid-run, timing reported, and the CUDA execution provider's device with the provider list
mocked (no GPU here: what is checked is the device code path, not a GPU run)."""

from __future__ import annotations

import gc
import time
import weakref

import numpy as np
import pytest

pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

import nnapi  # noqa: E402
from helpers import add_model, run_in_threads  # noqa: E402
from nnapi import OperandCode as T  # noqa: E402
from nnapi import OperandType  # noqa: E402
from nnapi import OperationCode as Op  # noqa: E402
from nnapi.drivers.ort import array_execution as ort_array_module  # noqa: E402
from nnapi.drivers.ort import binding as ort_binding_module  # noqa: E402
from nnapi.drivers.ort import calibration, devices  # noqa: E402
from nnapi.drivers.ort import prepared_model as ort_prepared_module  # noqa: E402
from nnapi.drivers.ort.binding import _Binding  # noqa: E402
from nnapi.drivers.ort.device import OrtDevice  # noqa: E402
from nnapi.drivers.reference import ReferenceDevice  # noqa: E402
from nnapi.hal import DataLocation, ErrorStatus, HalError, Request, RequestArgument  # noqa: E402
from nnapi.runtime import manager  # noqa: E402

pytestmark = pytest.mark.usefixtures("calibration_file")


@pytest.fixture
def bind_calls(monkeypatch):
    """Every bind_input / bind_output ORT is asked for, by tensor name (the driver's
    binding calls ORT's through the two it holds)."""
    calls: list[str] = []
    original_init = _Binding.__init__

    def init(self, *args, **kwargs):
        original_init(self, *args, **kwargs)
        for method in ("bind_input", "bind_output", "bind_array"):
            original = getattr(self, method)

            def counted(name, *more, _original=original):
                calls.append(name)
                return _original(name, *more)

            setattr(self, method, counted)

    monkeypatch.setattr(_Binding, "__init__", init)
    return calls


def _float_block():
    model, request = calibration.calibration_model(T.TENSOR_FLOAT32, T.TENSOR_FLOAT32)
    size = request.outputs[0].location.length
    source, target = np.zeros(size // 4, np.float32), np.zeros(size // 4, np.float32)
    return model, Request(request.inputs, request.outputs, [source, target]), source, target


def _expected(model, request: Request, values: np.ndarray) -> np.ndarray:
    out = np.zeros_like(values)
    ReferenceDevice().prepare_model(model).execute(Request(request.inputs, request.outputs, [values.copy(), out]))
    return out


def test_an_execution_binds_only_what_moved(bind_calls):
    model, request, source, target = _float_block()
    prepared = OrtDevice().prepare_model(model)
    rng = np.random.default_rng(1)
    source[:] = rng.standard_normal(source.size)
    prepared.execute(request)
    assert len(bind_calls) == 2  # the input and the output, once
    np.testing.assert_allclose(target, _expected(model, request, source), rtol=1e-5, atol=1e-5)
    source[:] = rng.standard_normal(source.size)  # new values, same buffers: nothing bound again
    prepared.execute(Request(request.inputs, request.outputs, [memoryview(source), memoryview(target)]))
    assert len(bind_calls) == 2
    np.testing.assert_allclose(target, _expected(model, request, source), rtol=1e-5, atol=1e-5)
    moved = rng.standard_normal(source.size).astype(np.float32)  # a new input buffer: the input only
    prepared.execute(Request(request.inputs, request.outputs, [moved, target]))
    assert len(bind_calls) == 3 and bind_calls[-1] == bind_calls[0]
    np.testing.assert_allclose(target, _expected(model, request, moved), rtol=1e-5, atol=1e-5)


def test_an_array_holding_exactly_an_argument_is_bound_as_itself(bind_calls):
    """A pool that is a numpy array of the argument's dtype and shape (what the runtime
    passes for set_input / set_output arrays) is bound as the array: a new array at every
    run is bound each time and gives its own results; the same array changed in place
    gives the new values with nothing bound again; a new array in a dropped one's place
    (maybe at its address, with its id) is bound, never taken for it."""
    model, request, _, _ = _float_block()
    prepared = OrtDevice().prepare_model(model)
    shape = (1, 28, 28, 16)
    rng = np.random.default_rng(11)
    target = np.zeros(shape, np.float32)

    def run(source):
        prepared.execute(Request(request.inputs, request.outputs, [source, target]))
        np.testing.assert_allclose(target.reshape(-1), _expected(model, request, source.reshape(-1)),
                                   rtol=1e-5, atol=1e-5)

    sources = [rng.standard_normal(shape).astype(np.float32) for _ in range(3)]
    for source in sources:
        run(source)
    assert len(bind_calls) == 4  # each input, the output once
    source = sources[-1]
    source[...] = rng.standard_normal(shape)
    run(source)
    assert len(bind_calls) == 4
    del sources
    for _ in range(3):
        del source
        source = rng.standard_normal(shape).astype(np.float32)
        run(source)
    assert len(bind_calls) == 7
    # a flat array, a non-native byte order: bound by address (the pool's bytes, as any pool's)
    flat = rng.standard_normal(int(np.prod(shape))).astype(np.float32)
    run(flat)
    prepared.execute(Request(request.inputs, request.outputs, [source.view(">f4"), target]))
    np.testing.assert_allclose(target.reshape(-1), _expected(model, request, source.reshape(-1)),
                               rtol=1e-5, atol=1e-5)
    assert len(bind_calls) == 9


def test_an_array_bound_as_itself_is_checked():
    """An output array that is read-only, an array of another dtype or shape or not
    contiguous: the same answers as for any other pool."""
    model, request, source, target = _float_block()
    prepared = OrtDevice().prepare_model(model)
    shape = (1, 28, 28, 16)
    read_only = np.zeros(shape, np.float32)
    read_only.flags.writeable = False
    wrong_type = np.zeros(shape, np.int32)  # its bytes: as many as the output needs
    strided = np.zeros((1, 28, 28, 32), np.float32)[..., ::2]
    for pools in ([source.reshape(shape), read_only], [strided, target], [source, strided[..., :8]]):
        with pytest.raises(HalError) as error:
            prepared.execute(Request(request.inputs, request.outputs, pools))
        assert error.value.status == ErrorStatus.INVALID_ARGUMENT
    prepared.execute(Request(request.inputs, request.outputs, [source.reshape(shape), wrong_type]))
    np.testing.assert_allclose(wrong_type.view(np.float32).reshape(-1), _expected(model, request, source),
                               rtol=1e-5, atol=1e-5)


def test_a_session_that_copies_its_inputs_binds_them_before_every_run(bind_calls):
    """A provider that reads its inputs from its own memory (CUDA) gets a copy of each
    input when it is bound: such a session's inputs are bound again before every run, so
    an input changed in place runs with its new values (here a CPU session told so: the
    path, not a GPU, is what is checked)."""
    model, request, source, target = _float_block()
    prepared = OrtDevice().prepare_model(model)
    assert not prepared.copies_inputs  # the CPU provider reads the caller's bytes
    prepared.copies_inputs = True
    shape = (1, 28, 28, 16)
    image, out = np.zeros(shape, np.float32), np.zeros(shape, np.float32)
    rng = np.random.default_rng(13)
    arrays = Request(request.inputs, request.outputs, [image, out])
    flat = Request(request.inputs, request.outputs, [source, target])
    reusable = prepared.create_reusable_execution(arrays)
    for _ in range(3):
        image[...] = rng.standard_normal(shape)
        source[:] = image.reshape(-1)
        for run, result in ((lambda: prepared.execute(arrays), out), (lambda: prepared.execute(flat), target),
                            (reusable.execute, out)):
            out[...] = 0
            target[:] = 0
            run()
            np.testing.assert_allclose(result.reshape(-1), _expected(model, request, source), rtol=1e-5, atol=1e-5)
    inputs_bound = [name for name in bind_calls if name == bind_calls[0]]
    assert len(inputs_bound) == 1 + 3 * 3  # the reusable execution's binding, then every run's


def test_arrays_given_as_themselves_bind_only_the_one_that_moved(bind_calls):
    """execute_arrays (IPreparedModel.array_executor: the runtime's usual Execution hands
    the driver its arrays): the thread's first run and any array of another layout go
    through execute; after that the arrays bound are found by identity (nothing bound, new
    values in place followed), a new input array is bound alone, checked as _bind checks
    it, and held weakly (dropped by the caller, it is freed; a new array in its place is
    bound, never taken for it); arrays that ran twice in a row are kept on the thread's
    second binding, so run between new ones they bind nothing again."""
    model, request, _, _ = _float_block()
    prepared = OrtDevice().prepare_model(model)
    run_arrays = prepared.array_executor()
    assert run_arrays is not None
    shape = (1, 28, 28, 16)
    rng = np.random.default_rng(21)
    out = np.zeros(shape, np.float32)

    def run(image):
        out[...] = 0
        shapes, _ = run_arrays([image, out], None)
        assert [s.dimensions for s in shapes] == [list(shape)] and shapes[0].is_sufficient
        np.testing.assert_allclose(out.reshape(-1), _expected(model, request, image.reshape(-1)),
                                   rtol=1e-5, atol=1e-5)

    image = rng.standard_normal(shape).astype(np.float32)
    run(image)
    assert len(bind_calls) == 2  # the first run: the input and the output, through execute
    image[...] = rng.standard_normal(shape)
    run(image)
    assert len(bind_calls) == 2
    kept = image
    image = rng.standard_normal(shape).astype(np.float32)
    run(image)  # the arrays that ran twice are kept on a second binding: this one binds both
    assert len(bind_calls) == 4
    for count in range(3):
        previous = weakref.ref(image)
        del image
        assert previous() is None  # nothing kept it: freed when the caller dropped it
        image = rng.standard_normal(shape).astype(np.float32)  # maybe at the same address
        run(image)
        assert len(bind_calls) == 5 + count and bind_calls[-1] == bind_calls[0]
        run(kept)  # the kept array between new ones: found on the second binding
        assert len(bind_calls) == 5 + count
    # a flat input, a Fortran-ordered output: not bound as arrays, the request's answers
    run(image.reshape(-1))
    with pytest.raises(HalError) as error:
        run_arrays([image, np.asfortranarray(out)], None)
    assert error.value.status == ErrorStatus.INVALID_ARGUMENT
    # a new read-only output: refused before anything runs
    read_only = np.zeros(shape, np.float32)
    read_only.flags.writeable = False
    with pytest.raises(HalError) as error:
        run_arrays([image, read_only], None)
    assert error.value.status == ErrorStatus.INVALID_ARGUMENT
    run(image)
    # a deadline goes through execute: one passed is missed
    with pytest.raises(HalError) as error:
        run_arrays([image, out], time.monotonic_ns() - 1)
    assert error.value.status == ErrorStatus.MISSED_DEADLINE_TRANSIENT
    # a session that copies its inputs (CUDA) has no array path
    prepared.copies_inputs = True
    assert prepared.array_executor() is None


def test_arrays_of_each_thread_are_its_own():
    """Threads running one prepared model on arrays of their own through execute_arrays
    at once (each thread its own binding): each gets its own results, run after run."""
    model, request, _, _ = _float_block()
    prepared = OrtDevice().prepare_model(model)
    run_arrays = prepared.array_executor()
    shape = (1, 28, 28, 16)
    failures: list[str] = []

    def worker(seed: int) -> None:
        rng = np.random.default_rng(seed)
        out = np.zeros(shape, np.float32)
        for step in range(20):
            image = rng.standard_normal(shape).astype(np.float32)
            run_arrays([image, out], None)
            if not np.allclose(out.reshape(-1), _expected(model, request, image.reshape(-1)), rtol=1e-5, atol=1e-5):
                failures.append(f"thread {seed} step {step}")

    run_in_threads(worker, 3)
    assert not failures


def test_a_failure_on_the_array_path_is_the_plans(ort_device):
    """An Execution per run whose driver fails on the array path: OP_FAILED with the
    device named (no fallback), and re-run on the CPU where the plan has a fallback
    device, as for a request (the table gives the plan the arrays' request)."""
    compilation = nnapi.Compilation(add_model((2, 3)), [ort_device])
    compilation.finish()
    a, b, out = np.full((2, 3), 2, np.float32), np.full((2, 3), 3, np.float32), np.zeros((2, 3), np.float32)

    def run():
        out[...] = 0
        execution = nnapi.Execution(compilation)
        execution.set_input(0, a)
        execution.set_input(1, b)
        execution.set_output(0, out)
        execution.compute()

    run()
    np.testing.assert_array_equal(out, 5)
    assert compilation._execution_table.direct is not None
    binding = compilation._plan.single._local.binding

    def failing(*_):
        raise RuntimeError("injected failure")

    binding.run = failing
    with pytest.raises(nnapi.OpFailedError, match="injected failure"):
        run()
    compilation._plan.fallback_device = ReferenceDevice()  # as a compilation on no named device has
    run()
    np.testing.assert_array_equal(out, 5)
    assert compilation._plan.fallback_count == 1


def test_a_reusable_execution_keeps_the_arrays_it_bound():
    model, request, _, _ = _float_block()
    shape = (1, 28, 28, 16)
    source, target = np.random.default_rng(12).standard_normal(shape).astype(np.float32), np.zeros(shape, np.float32)
    expected = _expected(model, request, source.reshape(-1))
    execution = OrtDevice().prepare_model(model).create_reusable_execution(
        Request(request.inputs, request.outputs, [source, target]))
    kept = weakref.ref(source), weakref.ref(target)
    del source, target
    gc.collect()
    execution.execute()
    assert all(ref() is not None for ref in kept)
    np.testing.assert_allclose(kept[1]().reshape(-1), expected, rtol=1e-5, atol=1e-5)


def test_onnxruntimes_public_methods_where_its_classes_hold_no_native_ones(monkeypatch):
    """The driver binds and runs through the C++ objects onnxruntime's Python classes hold;
    without them (another onnxruntime) it uses the public methods, with the same results."""
    monkeypatch.setattr(ort_binding_module, "_CPU_DEVICE", None)
    monkeypatch.setattr(ort_prepared_module, "_CPU_DEVICE", None)
    monkeypatch.setattr(ort_array_module, "_CPU_DEVICE", None)
    public_runs = []

    def public(session, io):
        public_runs.append(io)
        return session.run_with_iobinding, io

    monkeypatch.setattr(ort_binding_module, "_run_with_iobinding", public)
    public_binds = []
    original_bind = ort.IOBinding.bind_input

    def bind_input(self, name, *args):
        public_binds.append(name)
        return original_bind(self, name, *args)

    monkeypatch.setattr(ort.IOBinding, "bind_input", bind_input)
    model, request, source, target = _float_block()
    prepared = OrtDevice().prepare_model(model)
    rng = np.random.default_rng(4)
    source[:] = rng.standard_normal(source.size)
    prepared.execute(request)
    np.testing.assert_allclose(target, _expected(model, request, source), rtol=1e-5, atol=1e-5)
    moved = rng.standard_normal(source.size).astype(np.float32)  # bound again, publicly
    prepared.execute(Request(request.inputs, request.outputs, [moved, target]))
    np.testing.assert_allclose(target, _expected(model, request, moved), rtol=1e-5, atol=1e-5)
    execution = prepared.create_reusable_execution(Request(request.inputs, request.outputs, [source, target]))
    target[:] = 0
    execution.execute()
    np.testing.assert_allclose(target, _expected(model, request, source), rtol=1e-5, atol=1e-5)
    assert len(public_runs) == 2 and all(isinstance(io, ort.IOBinding) for io in public_runs)
    assert len(public_binds) == 3  # the input, the moved input, the reusable execution's


def test_a_reusable_execution_binds_once_and_keeps_its_pools(bind_calls):
    model, request, source, target = _float_block()
    output = bytearray(target.nbytes)
    bound = Request(request.inputs, request.outputs, [source, output])
    prepared = OrtDevice().prepare_model(model)
    execution = prepared.create_reusable_execution(bound, measure_timing=True)
    assert len(bind_calls) == 2
    rng = np.random.default_rng(2)
    for _ in range(3):
        source[:] = rng.standard_normal(source.size)
        shapes, timing = execution.execute()
        assert shapes[0].dimensions == [1, 28, 28, 16] and shapes[0].is_sufficient
        assert 0 < timing.time_on_device <= timing.time_in_driver
        np.testing.assert_allclose(np.frombuffer(output, np.float32), _expected(model, request, source),
                                   rtol=1e-5, atol=1e-5)
    assert len(bind_calls) == 2
    # the bound output cannot be moved under the execution (ORT writes to its address)
    with pytest.raises(BufferError):
        output.extend(b"\0")
    del execution
    output.extend(b"\0")


def test_a_reusable_execution_through_the_runtime(ort_device, bind_calls):
    model = nnapi.Model()
    shape = OperandType(T.TENSOR_FLOAT32, [2, 3])
    a, b = model.add_operand(shape), model.add_operand(shape)
    fuse = model.add_operand(OperandType(T.INT32))
    model.set_operand_value(fuse, 0)
    out = model.add_operand(shape)
    model.add_operation(Op.MUL, [a, b, fuse], [out])
    model.identify_inputs_and_outputs([a, b], [out])
    model.finish()
    compilation = nnapi.Compilation(model, [ort_device])
    compilation.finish()
    bind_calls.clear()  # the device's calibration ran executions of its own
    x, y, result = np.zeros((2, 3), np.float32), np.zeros((2, 3), np.float32), np.zeros((2, 3), np.float32)
    execution = nnapi.Execution(compilation)
    execution.set_reusable(True)
    execution.set_measure_timing(True)
    execution.set_input(0, x)
    execution.set_input(1, y)
    execution.set_output(0, result)
    rng = np.random.default_rng(3)
    for _ in range(3):
        x[:], y[:] = rng.standard_normal((2, 3)), rng.standard_normal((2, 3))
        execution.compute()
        np.testing.assert_array_equal(result, x * y)
        on_hardware = execution.get_duration(nnapi.DurationCode.DURATION_ON_HARDWARE)
        assert 0 < on_hardware <= execution.get_duration(nnapi.DurationCode.DURATION_IN_DRIVER)
    assert len(bind_calls) == 3


@pytest.mark.parametrize("pools, outputs, status", [
    # a pool that is not contiguous memory
    (lambda s, t: [s.reshape(-1, 2)[:, 0], t], None, ErrorStatus.INVALID_ARGUMENT),
    # an input whose bytes run past its pool's end
    (lambda s, t: [s[:-1], t], None, ErrorStatus.INVALID_ARGUMENT),
    # an output in read-only memory
    (lambda s, t: [s, bytes(t.nbytes)], None, ErrorStatus.INVALID_ARGUMENT),
    # a pool index that does not exist
    (lambda s, t: [s], None, ErrorStatus.INVALID_ARGUMENT),
    # an output at a negative offset
    (lambda s, t: [s, t], lambda n: [RequestArgument(False, DataLocation(1, -4, n))], ErrorStatus.INVALID_ARGUMENT),
    # an input whose dimensions contradict the model's
    (lambda s, t: [s, t], "dims", ErrorStatus.INVALID_ARGUMENT),
    # an output buffer too small: the shape it needs comes back
    (lambda s, t: [s, t], lambda n: [RequestArgument(False, DataLocation(1, 0, n - 4))],
     ErrorStatus.OUTPUT_INSUFFICIENT_SIZE),
])
def test_bad_requests_are_hal_errors(pools, outputs, status):
    model, request, source, target = _float_block()
    prepared = OrtDevice().prepare_model(model)
    size = request.outputs[0].location.length
    inputs = request.inputs
    if outputs == "dims":
        outputs = None
        inputs = [RequestArgument(False, request.inputs[0].location, [1, 28, 28, 8])]
    bad = Request(inputs, outputs(size) if outputs else request.outputs, pools(source, target))
    for attempt in (lambda: prepared.execute(bad), lambda: prepared.create_reusable_execution(bad).execute()):
        with pytest.raises(HalError) as error:
            attempt()
        assert error.value.status == status
        if status == ErrorStatus.OUTPUT_INSUFFICIENT_SIZE:
            assert error.value.output_shapes[0].dimensions == [1, 28, 28, 16]
    prepared.execute(request)  # the device is still usable


def _conv_chain(count: int, size: int = 48, channels: int = 32) -> tuple[nnapi.Model, list[np.ndarray]]:
    """``count`` 3x3 CONV_2Ds in a row (a model ORT runs node by node for a while), and
    the weights it refers to."""
    model = nnapi.Model()
    shape = OperandType(T.TENSOR_FLOAT32, [1, size, size, channels])
    rng = np.random.default_rng(4)
    current = first = model.add_operand(shape)
    keep = []
    for _ in range(count):
        weights = model.add_operand(OperandType(T.TENSOR_FLOAT32, [channels, 3, 3, channels]))
        bias = model.add_operand(OperandType(T.TENSOR_FLOAT32, [channels]))
        keep += [(rng.standard_normal((channels, 3, 3, channels)) * 0.05).astype(np.float32),
                 np.zeros(channels, np.float32)]
        model.set_operand_value(weights, keep[-2])
        model.set_operand_value(bias, keep[-1])
        scalars = []
        for value in (1, 1, 1, 1):  # SAME padding, strides 1, RELU
            index = model.add_operand(OperandType(T.INT32))
            model.set_operand_value(index, value)
            scalars.append(index)
        output = model.add_operand(shape)
        model.add_operation(Op.CONV_2D, [current, weights, bias, *scalars], [output])
        current = output
    model.identify_inputs_and_outputs([first], [current])
    model.finish()
    return model, keep


def test_a_deadline_stops_a_run_midway(ort_device):
    """A deadline that passes while ORT runs stops the run before its next node
    (MISSED_DEADLINE_TRANSIENT, well before a whole run's time); the next execution
    without a deadline runs to the end; the reusable path honours it too. The run is long
    (~70 ms) so that a watchdog woken late on a loaded machine still stops it midway."""
    model, _weights = _conv_chain(60, size=96)
    compilation = nnapi.Compilation(model, [ort_device])
    compilation.finish()
    image = np.random.default_rng(5).standard_normal((1, 96, 96, 32)).astype(np.float32)
    result = np.zeros_like(image)

    def run(timeout_ns: int | None, reusable: nnapi.Execution | None = None) -> float:
        execution = reusable or nnapi.Execution(compilation)
        if reusable is None:
            execution.set_input(0, image)
            execution.set_output(0, result)
        if timeout_ns is not None:
            execution.set_timeout(timeout_ns)
        start = time.perf_counter()
        try:
            execution.compute()
        finally:
            elapsed = time.perf_counter() - start
        return elapsed

    whole = min(run(None) for _ in range(3))
    assert np.abs(result).max() > 0
    for reusable in (None, _reusable(compilation, image, result)):
        # A run that ignored the deadline takes a whole run's time on every attempt; one
        # that stops midway can still be slowed past 0.7 of it by a burst of load from
        # other processes, so a stop well before the end is asked for on one of three.
        # A run may also end within the deadline when the load that slowed the measured whole
        # run has gone (seen once under load ~13): if it ended before half a whole run, the
        # whole run is measured again and the attempt does not count; a run that ended later
        # without the error ignored its deadline.
        timings = []
        for _attempt in range(5):
            result[:] = np.nan
            start = time.perf_counter()
            try:
                run(int(whole * 1e9 / 6), reusable)
            except nnapi.NnapiError as error:
                timings.append(time.perf_counter() - start)
                assert error.code == nnapi.ResultCode.MISSED_DEADLINE_TRANSIENT
                assert np.isnan(result).all()  # the last node never ran
                if timings[-1] < whole * 0.7:
                    break
                continue
            finished = time.perf_counter() - start
            assert finished < whole * 0.5, f"a run of {finished:.3f} s ignored a deadline of {whole / 6:.3f} s"
            whole = min(run(None) for _ in range(3))
        assert timings and min(timings) < whole * 0.7, (timings, whole)
    run(None)
    assert not np.isnan(result).any()


def _reusable(compilation, image, result) -> nnapi.Execution:
    execution = nnapi.Execution(compilation)
    execution.set_reusable(True)
    execution.set_input(0, image)
    execution.set_output(0, result)
    return execution


def test_deadlines_passed_before_the_run_on_both_paths():
    model, request, source, target = _float_block()
    prepared = OrtDevice().prepare_model(model)
    past = time.monotonic_ns() - 1
    for attempt in (lambda: prepared.execute(request, deadline_ns=past),
                    lambda: prepared.create_reusable_execution(request).execute(past)):
        with pytest.raises(HalError) as error:
            attempt()
        assert error.value.status == ErrorStatus.MISSED_DEADLINE_TRANSIENT
    # a deadline far ahead changes nothing
    shapes, _ = prepared.execute(request, deadline_ns=time.monotonic_ns() + 10**10)
    assert shapes[0].dimensions == [1, 28, 28, 16]


def test_timing_is_reported_through_the_runtime(ort_device):
    """measure_timing: the time ORT ran (on hardware) and the driver's whole execute (in
    driver), for an Execution per run; unavailable without measure_timing."""
    model, _weights = _conv_chain(4, size=16, channels=8)
    compilation = nnapi.Compilation(model, [ort_device])
    compilation.finish()
    image = np.ones((1, 16, 16, 8), np.float32)
    for measure in (True, False):
        execution = nnapi.Execution(compilation)
        execution.set_measure_timing(measure)
        execution.set_input(0, image)
        execution.set_output(0, np.zeros_like(image))
        start = time.monotonic_ns()
        execution.compute()
        elapsed = time.monotonic_ns() - start
        on_hardware = execution.get_duration(nnapi.DurationCode.DURATION_ON_HARDWARE)
        in_driver = execution.get_duration(nnapi.DurationCode.DURATION_IN_DRIVER)
        if measure:
            assert 0 < on_hardware <= in_driver <= elapsed
        else:
            assert on_hardware == in_driver == nnapi.DURATION_UNAVAILABLE


def _real_cuda() -> bool:
    import nnapi.drivers.ort as ort_driver

    return "CUDAExecutionProvider" in ort.get_available_providers() and ort_driver.gpu_present()


@pytest.fixture
def mocked_cuda(monkeypatch):
    """The provider list of onnxruntime-gpu on a machine with a GPU, mocked at the seam
    the factory reads (onnxruntime's available providers, the GPU check). Nothing here runs
    on a GPU: onnxruntime is the CPU build, so a session asked for CUDA lands on the CPU."""
    import nnapi.drivers.ort as ort_driver

    if _real_cuda():
        pytest.skip("a real CUDA provider and GPU are here: test_cuda_device_runs_on_a_real_gpu covers them")
    real = ort.get_available_providers()
    monkeypatch.setattr(ort, "get_available_providers", lambda: ["CUDAExecutionProvider", *real])
    monkeypatch.setattr(ort_driver, "gpu_present", lambda: True)
    return ort_driver


def test_the_cuda_provider_is_a_gpu_device_where_a_gpu_is_present(mocked_cuda, monkeypatch):
    from nnapi.codes import DeviceTypeCode

    found = {device.name: device for device in devices()}
    assert set(found) == {"nnapi-ort-cpu", "nnapi-ort-cuda"}
    cuda = found["nnapi-ort-cuda"]
    assert cuda.device_type == DeviceTypeCode.DEVICE_GPU and cuda.provider == "CUDAExecutionProvider"
    assert found["nnapi-ort-cpu"].device_type == DeviceTypeCode.DEVICE_CPU
    monkeypatch.setattr(mocked_cuda, "gpu_present", lambda: False)  # onnxruntime-gpu, no GPU: not listed
    assert [device.name for device in devices()] == ["nnapi-ort-cpu"]


def test_a_cuda_device_that_cannot_start_its_provider_refuses_and_is_never_chosen(mocked_cuda):
    """Where onnxruntime cannot start CUDA it runs the session on the CPU (a warning only):
    the GPU device refuses such a session instead of running on the CPU under its name,
    reports infinite figures (the partitioner never picks it) and a compilation without
    devices named runs on the others with the right results."""
    cuda = next(device for device in devices() if device.name == "nnapi-ort-cuda")
    model, request, source, target = _float_block()
    with pytest.warns(UserWarning), pytest.raises(HalError) as error:
        cuda.prepare_model(model)
    assert error.value.status == ErrorStatus.GENERAL_FAILURE
    assert "did not start CUDAExecutionProvider" in str(error.value)
    with pytest.warns(UserWarning):
        capabilities = cuda.get_capabilities()
    assert capabilities.performance_for(T.TENSOR_FLOAT32).exec_time == float("inf")
    assert capabilities.step_cost_s == 0.0
    manager.register_device(cuda)
    try:
        assert "nnapi-ort-cuda" in [device.name for device in nnapi.get_devices()]
        compilation = nnapi.Compilation(add_model((4,)))
        compilation.finish()
        assert "nnapi-ort-cuda" not in compilation.step_devices
        x = np.arange(4, dtype=np.float32)
        result = np.zeros(4, np.float32)
        execution = nnapi.Execution(compilation)
        execution.set_input(0, x)
        execution.set_input(1, x)
        execution.set_output(0, result)
        execution.compute()
        np.testing.assert_array_equal(result, 2 * x)
    finally:
        manager.unregister_device("nnapi-ort-cuda")


def test_cuda_device_runs_on_a_real_gpu():
    """Only where onnxruntime-gpu and a GPU are present: the calibration block on
    nnapi-ort-cuda agrees with the reference and its capabilities are measured."""
    if not _real_cuda():
        pytest.skip("no CUDA provider and GPU here (onnxruntime-gpu on a machine with an NVIDIA GPU)")
    cuda = next(device for device in devices() if device.name == "nnapi-ort-cuda")
    model, request, source, target = _float_block()
    source[:] = np.random.default_rng(8).standard_normal(source.size)
    cuda.prepare_model(model).execute(request)
    np.testing.assert_allclose(target, _expected(model, request, source), rtol=1e-3, atol=1e-3)
    assert 0 < cuda.get_capabilities().performance_for(T.TENSOR_FLOAT32).exec_time < float("inf")


def test_a_reusable_execution_keeps_a_mapped_pool_mapped():
    """The driver service releases its view of a pool a client forgets and closes the
    mapping: a reusable execution bound to it must keep it mapped (closing refuses) so
    ORT never writes to unmapped memory; the execution still computes."""
    import mmap

    model, request, source, target = _float_block()
    mapping = mmap.mmap(-1, target.nbytes)
    view = memoryview(mapping)
    execution = OrtDevice().prepare_model(model).create_reusable_execution(
        Request(request.inputs, request.outputs, [source, view]))
    view.release()
    with pytest.raises(BufferError):
        mapping.close()
    source[:] = np.random.default_rng(9).standard_normal(source.size)
    execution.execute()
    np.testing.assert_allclose(np.frombuffer(mapping, np.float32), _expected(model, request, source),
                               rtol=1e-5, atol=1e-5)
    del execution
    mapping.close()


def test_watchdog_fires_every_deadline_whatever_the_order_armed():
    """The deadline watchdog wakes for a deadline earlier than the one it sleeps until, and
    one armed later than that without waking it still fires (the thread looks again at its
    wake-up): no run bounded by a deadline or the loop timeout is left unstopped."""
    import time

    from nnapi.drivers.ort.deadlines import _Watchdog

    watchdog = _Watchdog()
    now = time.monotonic_ns()
    far, soon, later = (ort.RunOptions() for _ in range(3))
    watchdog.arm(now + 10_000_000_000, far)  # the thread sleeps 10 s
    watchdog.arm(now + 30_000_000, soon)  # earlier: wakes it
    watchdog.arm(now + 60_000_000, later)  # later than 30 ms: no wake-up needed
    time.sleep(0.5)
    assert soon.terminate and later.terminate and not far.terminate
    watchdog.disarm(far)
