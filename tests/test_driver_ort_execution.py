"""The ONNX Runtime driver's execution path: IO binding (bound once per reusable execution,
again per execution only for an argument that moved), request checks, deadlines honoured
mid-run, timing reported, and the CUDA execution provider's device with the provider list
mocked (no GPU here: what is checked is the device code path, not a GPU run)."""

from __future__ import annotations

import os
import tempfile

import numpy as np
import pytest

pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

import nnapi  # noqa: E402
from nnapi import OperandCode as T  # noqa: E402
from nnapi import OperandType  # noqa: E402
from nnapi import OperationCode as Op  # noqa: E402
from nnapi.drivers.ort import calibration, devices  # noqa: E402
from nnapi.drivers.ort.device import OrtDevice  # noqa: E402
from nnapi.drivers.reference import ReferenceDevice  # noqa: E402
from nnapi.hal import DataLocation, ErrorStatus, HalError, Request, RequestArgument  # noqa: E402
from nnapi.runtime import manager  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def calibration_file():
    with tempfile.TemporaryDirectory() as directory:
        previous = os.environ.get("NNAPI_ORT_CALIBRATION")
        os.environ["NNAPI_ORT_CALIBRATION"] = os.path.join(directory, "calibration.json")
        yield
        if previous is None:
            del os.environ["NNAPI_ORT_CALIBRATION"]
        else:
            os.environ["NNAPI_ORT_CALIBRATION"] = previous


@pytest.fixture(scope="module")
def ort_device():
    registered = [d for d in manager.hal_devices() if d.name == "nnapi-ort-cpu"]
    if registered:
        yield nnapi.Device(registered[0])
        return
    device = devices()[0]
    manager.register_device(device)
    yield nnapi.Device(device)
    manager.unregister_device("nnapi-ort-cpu")


@pytest.fixture
def bind_calls(monkeypatch):
    """Every bind_input / bind_output ORT is asked for, by tensor name."""
    calls: list[str] = []
    for method in ("bind_input", "bind_output"):
        original = getattr(ort.IOBinding, method)

        def counted(self, name, *args, _original=original, **kwargs):
            calls.append(name)
            return _original(self, name, *args, **kwargs)

        monkeypatch.setattr(ort.IOBinding, method, counted)
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
    # an output buffer too small: the shape it needs comes back
    (lambda s, t: [s, t], lambda n: [RequestArgument(False, DataLocation(1, 0, n - 4))],
     ErrorStatus.OUTPUT_INSUFFICIENT_SIZE),
])
def test_bad_requests_are_hal_errors(pools, outputs, status):
    model, request, source, target = _float_block()
    prepared = OrtDevice().prepare_model(model)
    size = request.outputs[0].location.length
    bad = Request(request.inputs, outputs(size) if outputs else request.outputs, pools(source, target))
    for attempt in (lambda: prepared.execute(bad), lambda: prepared.create_reusable_execution(bad).execute()):
        with pytest.raises(HalError) as error:
            attempt()
        assert error.value.status == status
        if status == ErrorStatus.OUTPUT_INSUFFICIENT_SIZE:
            assert error.value.output_shapes[0].dimensions == [1, 28, 28, 16]
    prepared.execute(request)  # the device is still usable
