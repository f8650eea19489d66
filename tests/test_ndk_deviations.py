"""NDK behaviours found missing when the API was tried against the documentation
(issue #13's list), and fenced execution as startComputeWithDependencies documents it."""

from __future__ import annotations

import mmap
import os

import numpy as np
import pytest

import nnapi
from nnapi import OperandCode as T
from nnapi import OperandType
from nnapi import OperationCode as Op
from nnapi.codes import DurationCode
from nnapi.execution import DURATION_UNAVAILABLE


def add_model(dims=(2,), out_dims=None):
    model = nnapi.Model()
    a = model.add_operand(OperandType(T.TENSOR_FLOAT32, list(dims)))
    b = model.add_operand(OperandType(T.TENSOR_FLOAT32, list(dims)))
    act = model.add_operand(OperandType(T.INT32))
    model.set_operand_value(act, 0)
    y = model.add_operand(OperandType(T.TENSOR_FLOAT32, list(out_dims if out_dims is not None else dims)))
    model.add_operation(Op.ADD, [a, b, act], [y])
    return model, a, b, y


def finished_add(dims=(2,), out_dims=None):
    model, a, b, y = add_model(dims, out_dims)
    model.identify_inputs_and_outputs([a, b], [y])
    model.finish()
    return model


def reference():
    return [d for d in nnapi.get_devices() if d.name == "nnapi-reference"]


def execution_for(model, x=(1.0, 2.0), y=(10.0, 20.0), out=None, devices=None):
    compilation = nnapi.Compilation(model, devices)
    compilation.finish()
    execution = nnapi.Execution(compilation)
    execution.set_input(0, np.array(x, np.float32))
    execution.set_input(1, np.array(y, np.float32))
    out = np.zeros(2, np.float32) if out is None else out
    execution.set_output(0, out)
    return execution, out


def test_identify_inputs_and_outputs_twice_is_bad_data():
    model, a, b, y = add_model()
    model.identify_inputs_and_outputs([a, b], [y])
    with pytest.raises(nnapi.BadDataError, match="already a model input or output"):
        model.identify_inputs_and_outputs([a, b], [y])
    model.finish()  # the first identification stands


def test_a_model_without_inputs_is_rejected():
    model = nnapi.Model()
    tensor = OperandType(T.TENSOR_FLOAT32, [2])
    a, b = model.add_operand(tensor), model.add_operand(tensor)
    model.set_operand_value(a, np.ones(2, np.float32))
    model.set_operand_value(b, np.ones(2, np.float32))
    act = model.add_operand(OperandType(T.INT32))
    model.set_operand_value(act, 0)
    y = model.add_operand(tensor)
    model.add_operation(Op.ADD, [a, b, act], [y])
    model.identify_inputs_and_outputs([], [y])
    with pytest.raises(nnapi.BadDataError, match="at least one input"):
        model.finish()


def test_output_queries_after_an_insufficient_buffer():
    model = finished_add(dims=(0,), out_dims=(0,))
    compilation = nnapi.Compilation(model)
    compilation.finish()
    execution = nnapi.Execution(compilation)
    execution.set_input(0, np.arange(3, dtype=np.float32))
    execution.set_input(1, np.ones(3, np.float32))
    execution.set_output(0, np.zeros(1, np.float32))
    with pytest.raises(nnapi.OutputInsufficientSizeError):
        execution.compute()
    for query in (execution.get_output_operand_rank, execution.get_output_operand_dimensions):
        with pytest.raises(nnapi.OutputInsufficientSizeError) as caught:
            query(0)
        assert caught.value.dimensions == [3]


def test_sync_fence_of_a_non_fenced_event_is_bad_data():
    execution, _ = execution_for(finished_add())
    event = execution.start_compute()
    event.wait()
    with pytest.raises(nnapi.BadDataError, match="not backed by a sync fence"):
        event.get_sync_fence_fd()


@pytest.mark.parametrize("prot", [0, mmap.PROT_WRITE, mmap.PROT_READ, mmap.PROT_READ | mmap.PROT_WRITE])
def test_from_fd_takes_every_protection(prot):
    fd = os.memfd_create("nnapi-test", os.MFD_CLOEXEC)
    try:
        os.ftruncate(fd, 8192)
        memory = nnapi.Memory.from_fd(100, prot, fd, 4097)  # an offset that is not page aligned
        assert memory.size == 100
        assert memory._writable == bool(prot & mmap.PROT_WRITE)
        memory.free()
    finally:
        os.close(fd)
    with pytest.raises(nnapi.BadDataError):
        nnapi.Memory.from_fd(100, 8, 0, 0)


def test_get_devices_returns_the_same_objects():
    first, second = nnapi.get_devices(), nnapi.get_devices()
    assert all(a is b for a, b in zip(first, second, strict=True))
    assert nnapi.get_device(0) is first[0]
    compilation = nnapi.Compilation(finished_add(), first[:1])
    compilation.finish()
    assert compilation.device is first[0]


needs_flags = pytest.mark.skipif(not hasattr(__import__("nnapi.operations.base").operations.base.Operation,
                                                 "omitted_operands"),
                                 reason="needs the operations' omitted_operands registration flag")


@needs_flags
def test_an_omitted_constant_fails_at_compilation():
    model, a, b, y = add_model()
    model.set_operand_value(b, None)
    model.identify_inputs_and_outputs([a], [y])
    model.finish()
    with pytest.raises(nnapi.BadDataError) as caught:
        nnapi.Compilation(model).finish()
    # the message says why, device by device
    assert "nnapi-reference: ADD: an input is omitted, which the operation does not allow" in str(caught.value)


@needs_flags
def test_an_omitted_required_input_fails_the_execution():
    execution, out = execution_for(finished_add())
    execution2 = nnapi.Execution(execution._compilation)
    execution2.set_input(0, np.ones(2, np.float32))
    execution2.set_input(1, None)
    execution2.set_output(0, out)
    with pytest.raises(nnapi.NnapiError) as caught:
        execution2.compute()
    assert caught.value.code in (nnapi.ResultCode.BAD_DATA, nnapi.ResultCode.OP_FAILED)


# --- fenced execution -------------------------------------------------------------------
def test_fenced_execution_runs_and_has_a_fence():
    execution, out = execution_for(finished_add())
    event = execution.start_compute_with_dependencies([])
    fd = event.get_sync_fence_fd()
    try:
        event.wait()
        np.testing.assert_array_equal(out, [11, 22])
    finally:
        os.close(fd)


def test_fenced_execution_needs_fully_specified_outputs():
    model = finished_add(dims=(0,), out_dims=(0,))
    compilation = nnapi.Compilation(model)
    compilation.finish()
    execution = nnapi.Execution(compilation)
    execution.set_input(0, np.ones(2, np.float32))
    execution.set_input(1, np.ones(2, np.float32))
    execution.set_output(0, np.zeros(2, np.float32))
    with pytest.raises(nnapi.BadDataError, match="unspecified dimensions"):
        execution.start_compute_with_dependencies([])
    # with the output's shape given, it runs
    execution = nnapi.Execution(compilation)
    execution.set_input(0, np.ones(2, np.float32))
    execution.set_input(1, np.ones(2, np.float32))
    out = np.zeros(2, np.float32)
    execution.set_output(0, out, OperandType(T.TENSOR_FLOAT32, [2]))
    execution.start_compute_with_dependencies([]).wait()
    np.testing.assert_array_equal(out, [2, 2])


def test_an_already_failed_dependency_is_an_error_at_the_call():
    from nnapi.drivers.sample import FaultyDevice
    from nnapi.runtime import manager

    manager.register_device(FaultyDevice("always-fails", fail_execute=True))
    try:
        broken = [d for d in nnapi.get_devices() if d.name == "always-fails"]
        bad, _ = execution_for(finished_add(), devices=broken)
        failed_event = bad.start_compute_with_dependencies([])
        with pytest.raises(nnapi.OpFailedError):
            failed_event.wait()
        execution, out = execution_for(finished_add())
        with pytest.raises(nnapi.OpFailedError, match="already failed"):
            execution.start_compute_with_dependencies([failed_event])
        # the execution was not scheduled: it can still run
        execution.compute()
        np.testing.assert_array_equal(out, [11, 22])
    finally:
        manager.unregister_device("always-fails")


def test_timeout_with_duration_and_fenced_durations():
    execution, out = execution_for(finished_add(), devices=reference())
    execution.set_measure_timing(True)
    execution.set_timeout(10_000_000_000)
    event = execution.start_compute_with_dependencies([], 5_000_000_000)
    event.wait()
    np.testing.assert_array_equal(out, [11, 22])
    for code in DurationCode:
        value = execution.get_duration(code)
        assert value != DURATION_UNAVAILABLE and value > 0, code.name
    plain, _ = execution_for(finished_add(), devices=reference())
    plain.set_measure_timing(True)
    plain.compute()
    assert plain.get_duration(DurationCode.FENCED_DURATION_ON_HARDWARE) == DURATION_UNAVAILABLE
    assert plain.get_duration(DurationCode.DURATION_ON_HARDWARE) > 0
