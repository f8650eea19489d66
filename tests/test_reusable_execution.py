"""Reusable executions and bursts bind their request to the driver once
(IPreparedModel / IBurst ``create_reusable_execution``): every computation still reads the
inputs' current values, reports the shapes of that computation, falls back to the CPU and
refuses a bad request as the one-shot path does."""

from __future__ import annotations

import numpy as np
import pytest

import nnapi
from helpers import add_model
from nnapi import OperandCode as T
from nnapi import OperandType
from nnapi import OperationCode as Op
from nnapi.drivers.reference import ReferenceDevice
from nnapi.drivers.sample import FaultyDevice
from nnapi.hal import DataLocation, ErrorStatus, HalError, Request, RequestArgument
from nnapi.runtime.model_builder import build_hal_model


def tile_model():
    """out = TILE(x, multiples): the output's shape follows the values of an input."""
    model = nnapi.Model()
    x = model.add_operand(OperandType(T.TENSOR_FLOAT32, [2]))
    multiples = model.add_operand(OperandType(T.TENSOR_INT32, [1]))
    out = model.add_operand(OperandType(T.TENSOR_FLOAT32, [0]))
    model.add_operation(Op.TILE, [x, multiples], [out])
    model.identify_inputs_and_outputs([x, multiples], [out])
    model.finish()
    return model


def compiled(model, devices=None):
    compilation = nnapi.Compilation(model, devices)
    compilation.finish()
    return compilation


def reusable(compilation, a, b, out):
    execution = nnapi.Execution(compilation)
    execution.set_reusable(True)
    execution.set_input(0, a)
    execution.set_input(1, b)
    execution.set_output(0, out)
    return execution


@pytest.mark.parametrize("through", ["compute", "burst", "both"])
def test_every_computation_reads_the_inputs_again(through):
    compilation = compiled(add_model((3,)))
    a, b, out = np.array([1, 2, 3], np.float32), np.array([10, 20, 30], np.float32), np.zeros(3, np.float32)
    execution = reusable(compilation, a, b, out)
    burst = nnapi.Burst(compilation)
    rng = np.random.default_rng(1)
    for round_ in range(6):
        a[:] = rng.uniform(-5, 5, 3)
        b[:] = rng.uniform(-5, 5, 3)
        use_burst = through == "burst" or (through == "both" and round_ % 2)
        if use_burst:
            execution.burst_compute(burst)
        else:
            execution.compute()
        np.testing.assert_array_equal(out, a + b)
        assert execution.get_output_operand_dimensions(0) == [3]
        assert execution._bound is not None  # the request was bound, not rebuilt


def test_output_shapes_follow_each_computation():
    compilation = compiled(tile_model())
    x, multiples, out = np.array([1, 2], np.float32), np.array([2], np.int32), np.full(6, -1, np.float32)
    execution = reusable(compilation, x, multiples, out)
    execution.compute()
    assert execution.get_output_operand_dimensions(0) == [4]
    np.testing.assert_array_equal(out[:4], [1, 2, 1, 2])
    multiples[0] = 3
    execution.compute()
    assert execution.get_output_operand_dimensions(0) == [6]
    np.testing.assert_array_equal(out, [1, 2, 1, 2, 1, 2])
    multiples[0] = 4  # 8 values into a buffer of 6
    with pytest.raises(nnapi.OutputInsufficientSizeError):
        execution.compute()
    with pytest.raises(nnapi.OutputInsufficientSizeError) as caught:
        execution.get_output_operand_dimensions(0)
    assert caught.value.dimensions == [8]
    multiples[0], x[:] = 1, [7, 8]
    execution.compute()
    assert execution.get_output_operand_dimensions(0) == [2]
    np.testing.assert_array_equal(out[:2], [7, 8])


def test_a_deadline_is_checked_on_every_computation():
    compilation = compiled(add_model((3,)), [d for d in nnapi.get_devices() if d.name == "nnapi-reference"])
    a, b, out = np.ones(3, np.float32), np.ones(3, np.float32), np.zeros(3, np.float32)
    execution = nnapi.Execution(compilation)
    execution.set_reusable(True)
    execution.set_timeout(1)  # 1 ns: passed before the first operation runs
    execution.set_input(0, a)
    execution.set_input(1, b)
    execution.set_output(0, out)
    for _ in range(2):
        with pytest.raises(nnapi.MissedDeadlineTransientError):
            execution.compute()


def test_memories_and_strided_arrays_stay_on_the_per_computation_path():
    compilation = compiled(add_model(dims=(2,)))
    memory = nnapi.Memory.create_shared(8)
    np.frombuffer(memory.buffer, np.float32)[:] = [1, 2]
    strided = np.zeros((2, 2), np.float32)[:, 0]  # not contiguous: written back after each run
    execution = nnapi.Execution(compilation)
    execution.set_reusable(True)
    execution.set_input_from_memory(0, memory, 0, 8)
    execution.set_input(1, np.array([10, 20], np.float32))
    execution.set_output(0, strided)
    execution.compute()
    np.testing.assert_array_equal(strided, [11, 22])
    np.frombuffer(memory.buffer, np.float32)[:] = [3, 4]
    execution.compute()
    np.testing.assert_array_equal(strided, [13, 24])
    assert execution._bound is None


@pytest.mark.parametrize("use_burst", [False, True])
def test_mapped_memories_are_bound_and_read_at_every_computation(use_burst):
    compilation = compiled(add_model(dims=(2,)))
    a, out = nnapi.Memory.create_shared(8), nnapi.Memory.create_shared(8)
    b = np.array([10, 20], np.float32)
    execution = nnapi.Execution(compilation)
    execution.set_reusable(True)
    execution.set_input_from_memory(0, a, 0, 8)
    execution.set_input(1, b)
    execution.set_output_from_memory(0, out, 0, 8)
    burst = nnapi.Burst(compilation)
    for values in ([1, 2], [3, 4], [-5, 0.5]):
        np.frombuffer(a.buffer, np.float32)[:] = values
        execution.burst_compute(burst) if use_burst else execution.compute()
        np.testing.assert_array_equal(np.frombuffer(out.buffer, np.float32), np.float32(values) + b)
    assert execution._bound is not None and set(map(id, execution._bound_memories)) == {id(a), id(out)}
    a.free()  # bound, yet a freed memory is still refused
    with pytest.raises(nnapi.BadStateError, match="freed"):
        execution.burst_compute(burst) if use_burst else execution.compute()


def test_a_memory_read_through_its_descriptor_is_not_bound(tmp_path):
    compilation = compiled(add_model(dims=(2,)))
    with open(tmp_path / "a.bin", "w+b") as file:  # a regular file: pread at every computation
        file.write(np.float32([1, 2]).tobytes())
        file.flush()
        memory = nnapi.Memory.from_fd(8, nnapi.PROT_READ | nnapi.PROT_WRITE, file.fileno(), 0)
        out = np.zeros(2, np.float32)
        execution = nnapi.Execution(compilation)
        execution.set_reusable(True)
        execution.set_input_from_memory(0, memory, 0, 8)
        execution.set_input(1, np.ones(2, np.float32))
        execution.set_output(0, out)
        execution.compute()
        np.testing.assert_array_equal(out, [2, 3])
        file.seek(0)
        file.write(np.float32([5, 6]).tobytes())
        file.flush()
        execution.compute()
        np.testing.assert_array_equal(out, [6, 7])
        assert execution._bound is None


@pytest.mark.parametrize("use_burst", [False, True])
def test_a_failing_driver_falls_back_on_every_computation(register, use_burst):
    faulty = register(FaultyDevice("faulty-reusable", fail_execute=True))
    compilation = compiled(add_model((3,)))
    assert compilation.step_devices == ["faulty-reusable"]
    a, b, out = np.array([1, 2, 3], np.float32), np.ones(3, np.float32), np.zeros(3, np.float32)
    execution = reusable(compilation, a, b, out)
    burst = nnapi.Burst(compilation)
    for value in (1.0, 2.0, 3.0):
        b[:] = value
        if use_burst:
            execution.burst_compute(burst)
        else:
            execution.compute()
        np.testing.assert_array_equal(out, a + value)
    assert faulty.execute_count == 3
    assert compilation._plan.fallback_count == 3


def hal_request(a, b, out):
    """A HAL request for the one-ADD model with a, b and out in pools 0, 1 and 2."""
    return Request([RequestArgument(False, DataLocation(0, 0, a.nbytes)),
                    RequestArgument(False, DataLocation(1, 0, b.nbytes))],
                   [RequestArgument(False, DataLocation(2, 0, out.nbytes))],
                   [memoryview(a).cast("B"), memoryview(b).cast("B"), memoryview(out).cast("B")])


def test_the_reference_driver_validates_a_bound_request_once():
    prepared = ReferenceDevice().prepare_model(build_hal_model(add_model((3,)))[0])
    a, b, out = np.array([1, 2, 3], np.float32), np.array([4, 5, 6], np.float32), np.zeros(3, np.float32)
    bound = prepared.create_reusable_execution(hal_request(a, b, out))
    for _ in range(2):
        shapes, _ = bound.execute()
        assert [shape.dimensions for shape in shapes] == [[3]]
        np.testing.assert_array_equal(out, a + b)
        a += 1
    small = np.zeros(2, np.float32)
    request = hal_request(a, b, small)
    request.outputs[0].location.length = out.nbytes  # outside its pool
    with pytest.raises(HalError) as caught:
        prepared.create_reusable_execution(request)
    assert caught.value.status == ErrorStatus.INVALID_ARGUMENT
    readonly = hal_request(a, b, out)
    readonly.pools[2] = bytes(out.nbytes)
    with pytest.raises(HalError) as caught:
        prepared.configure_burst().create_reusable_execution(readonly)
    assert caught.value.status == ErrorStatus.INVALID_ARGUMENT


def test_a_bound_request_with_device_memory_is_resolved_at_every_computation():
    from nnapi.hal import BufferDesc, BufferRole, BufferToken

    driver = ReferenceDevice()
    prepared = driver.prepare_model(build_hal_model(add_model((3,)))[0])
    buffer, token = driver.allocate(BufferDesc([]), [prepared], [BufferRole(0, 0)], [])
    b, out = np.array([1, 2, 3], np.float32), np.zeros(3, np.float32)
    request = hal_request(np.zeros(3, np.float32), b, out)
    request.pools[0] = BufferToken(token)
    bound = prepared.create_reusable_execution(request)
    with pytest.raises(HalError) as caught:  # never written: refused, as execute refuses it
        bound.execute()
    assert caught.value.status == ErrorStatus.GENERAL_FAILURE
    for value in (10.0, 20.0):
        buffer.copy_from(np.full(3, value, np.float32).tobytes(), [])
        bound.execute()
        np.testing.assert_array_equal(out, b + value)


def test_bound_computations_keep_their_own_numpy_error_state():
    """The lean path of a bound request (input views to output views) still runs kernels
    under their own error state: a caller's np.seterr(all="raise") does not turn an
    overflow into a failure, on any computation."""
    model = nnapi.Model()
    tensor = OperandType(T.TENSOR_FLOAT32, [2])
    a, b = model.add_operand(tensor), model.add_operand(tensor)
    act = model.add_operand(OperandType(T.INT32))
    out = model.add_operand(tensor)
    model.set_operand_value(act, 0)
    model.add_operation(Op.MUL, [a, b, act], [out])
    model.identify_inputs_and_outputs([a, b], [out])
    model.finish()
    x, y, result = np.array([3e38, 2.0], np.float32), np.array([10.0, 3.0], np.float32), np.zeros(2, np.float32)
    execution = reusable(compiled(model), x, y, result)
    burst = nnapi.Burst(execution._compilation)
    with np.errstate(all="raise"):
        for round_ in range(3):
            x[1] = round_
            if round_ == 2:
                execution.burst_compute(burst)
            else:
                execution.compute()
            np.testing.assert_array_equal(result, [np.inf, 3.0 * round_])


def test_a_bound_execution_keeps_the_ndk_rules_on_every_computation():
    """Computations after the first run the bound request in fewer steps; the NDK's answers
    stay: results and shapes of each, a deadline passed, a freed compilation or execution."""
    compilation = compiled(add_model((3,)), [d for d in nnapi.get_devices() if d.name == "nnapi-reference"])
    a, b, out = np.ones(3, np.float32), np.full(3, 2, np.float32), np.zeros(3, np.float32)
    execution = reusable(compilation, a, b, out)
    for step in range(3):
        a[:] = step
        execution.compute()
        np.testing.assert_array_equal(out, a + b)
        assert execution.get_output_operand_dimensions(0) == [3]
    assert execution._bound is not None
    compilation.free()
    with pytest.raises(nnapi.BadStateError):
        execution.compute()
    other = reusable(compiled(add_model((3,))), a, b, out)
    other.compute()
    other.free()
    with pytest.raises(nnapi.BadStateError):
        other.compute()
    timed = nnapi.Execution(compiled(add_model((3,)), [d for d in nnapi.get_devices()
                                                         if d.name == "nnapi-reference"]))
    timed.set_reusable(True)
    timed.set_input(0, a)
    timed.set_input(1, b)
    timed.set_output(0, out)
    timed.compute()
    timed._timeout_ns = 1  # as set_timeout(1) before the first computation: passed at once
    with pytest.raises(nnapi.NnapiError) as error:
        timed.compute()
    assert error.value.code in (nnapi.ResultCode.MISSED_DEADLINE_TRANSIENT, nnapi.ResultCode.MISSED_DEADLINE_PERSISTENT)
    timed._timeout_ns = 0
    a[:] = 7
    timed.compute()  # the failure left it ready to compute again
    np.testing.assert_array_equal(out, a + b)
