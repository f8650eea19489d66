"""Compilation, Execution, Burst, Event and Memory: NDK behaviour and result codes."""

from __future__ import annotations

import copy
import os
import select

import numpy as np
import pytest

import nnapi
from nnapi import DurationCode, OperandType, ResultCode
from nnapi import OperandCode as T
from nnapi import OperationCode as Op


def f32(*dims):
    return OperandType(T.TENSOR_FLOAT32, dims)


def binary_model(code=Op.ADD, in_dims=(2,), out_dims=(2,), operand=T.TENSOR_FLOAT32, fuse=0):
    model = nnapi.Model()
    a = model.add_operand(OperandType(operand, in_dims))
    b = model.add_operand(OperandType(operand, in_dims))
    act = model.add_operand(OperandType(T.INT32))
    out = model.add_operand(OperandType(operand, out_dims))
    model.set_operand_value(act, fuse)
    model.add_operation(code, [a, b, act], [out])
    model.identify_inputs_and_outputs([a, b], [out])
    model.finish()
    return model


def compiled(model=None, devices=None):
    compilation = nnapi.Compilation(model or binary_model(), devices)
    compilation.finish()
    return compilation


def ready_execution(compilation=None, a=(1.0, 2.0), b=(3.0, 4.0)):
    execution = nnapi.Execution(compilation or compiled())
    execution.set_input(0, np.array(a, np.float32))
    execution.set_input(1, np.array(b, np.float32))
    out = np.zeros(2, np.float32)
    execution.set_output(0, out)
    return execution, out


class TestCompilation:
    def test_requires_finished_model(self):
        model = nnapi.Model()
        with pytest.raises(nnapi.BadStateError):
            nnapi.Compilation(model)
        with pytest.raises(nnapi.UnexpectedNullError):
            nnapi.Compilation(None)

    def test_devices_must_be_non_empty_and_distinct(self):
        device = nnapi.get_devices()[0]
        with pytest.raises(nnapi.BadDataError):
            nnapi.Compilation(binary_model(), [])
        with pytest.raises(nnapi.BadDataError):
            nnapi.Compilation(binary_model(), [device, device])

    def test_settings_are_checked(self):
        compilation = nnapi.Compilation(binary_model())
        with pytest.raises(nnapi.BadDataError):
            compilation.set_preference(7)
        with pytest.raises(nnapi.BadDataError):
            compilation.set_priority(42)
        with pytest.raises(nnapi.BadDataError):
            compilation.set_timeout(1000)  # not created for exactly one device
        with pytest.raises(nnapi.BadDataError):
            compilation.set_caching("/tmp", b"short")
        with pytest.raises(nnapi.UnexpectedNullError):
            compilation.set_caching(None, bytes(32))
        compilation.set_caching("/tmp", bytes(32))
        compilation.set_priority(nnapi.PriorityCode.PRIORITY_HIGH)
        compilation.set_preference(nnapi.PreferenceCode.PREFER_LOW_POWER)
        compilation.finish()
        with pytest.raises(nnapi.BadStateError):
            compilation.set_preference(nnapi.PreferenceCode.PREFER_LOW_POWER)
        with pytest.raises(nnapi.BadStateError):
            compilation.finish()

    def test_timeout_for_a_single_device(self):
        compilation = nnapi.Compilation(binary_model(), [nnapi.get_devices()[0]])
        compilation.set_timeout(10**9)
        compilation.finish()
        assert compilation.device.name == "nnapi-reference"

    def test_preferred_alignment_and_padding(self):
        compilation = nnapi.Compilation(binary_model())
        with pytest.raises(nnapi.BadStateError):
            compilation.get_preferred_memory_alignment_for_input(0)
        compilation.finish()
        assert compilation.get_preferred_memory_alignment_for_input(1) == 64
        assert compilation.get_preferred_memory_padding_for_output(0) == 64
        with pytest.raises(nnapi.BadDataError):
            compilation.get_preferred_memory_alignment_for_input(2)
        with pytest.raises(nnapi.BadDataError):
            compilation.get_preferred_memory_padding_for_output(1)

    def test_use_after_free(self):
        compilation = compiled()
        compilation.free()
        with pytest.raises(nnapi.BadStateError):
            nnapi.Execution(compilation)


class TestExecutionArguments:
    def test_requires_finished_compilation(self):
        with pytest.raises(nnapi.BadStateError):
            nnapi.Execution(nnapi.Compilation(binary_model()))

    def test_wrong_lengths_and_indexes(self):
        execution = nnapi.Execution(compiled())
        with pytest.raises(nnapi.BadDataError):
            execution.set_input(0, np.zeros(3, np.float32))
        with pytest.raises(nnapi.BadDataError):
            execution.set_input(2, np.zeros(2, np.float32))
        with pytest.raises(nnapi.BadDataError):
            execution.set_input(-1, np.zeros(2, np.float32))
        with pytest.raises(nnapi.BadDataError):
            execution.set_output(0, np.zeros(3, np.float32))
        with pytest.raises(nnapi.BadDataError):
            execution.set_output(0, b"\0" * 8)  # read-only buffer

    def test_type_may_only_complete_dimensions(self):
        execution = nnapi.Execution(compiled())
        with pytest.raises(nnapi.BadDataError):
            execution.set_input(0, np.zeros(2, np.int32), OperandType(T.TENSOR_INT32, [2]))
        with pytest.raises(nnapi.BadDataError):
            execution.set_input(0, np.zeros(3, np.float32), f32(3))
        execution.set_input(0, np.zeros(2, np.float32), f32(2))

    def test_missing_arguments_are_bad_data(self):
        execution = nnapi.Execution(compiled())
        execution.set_input(0, np.zeros(2, np.float32))
        with pytest.raises(nnapi.BadDataError) as excinfo:
            execution.compute()
        assert "input 1" in str(excinfo.value) and "output 0" in str(excinfo.value)

    def test_zero_sized_array_is_bad_data(self):
        model = binary_model(in_dims=(0, 3), out_dims=(0, 3))
        execution = nnapi.Execution(compiled(model))
        with pytest.raises(nnapi.BadDataError):
            execution.set_input(0, np.zeros((0, 3), np.float32))  # 0 means "unspecified" to the NDK

    def test_padding(self):
        execution = nnapi.Execution(compiled())
        execution.enable_input_and_output_padding(True)
        execution.set_input(0, np.array([1, 2, 99, 99], np.float32))
        execution.set_input(1, np.array([3, 4, 99, 99], np.float32))
        out = np.zeros(4, np.float32)
        execution.set_output(0, out)
        execution.compute()
        np.testing.assert_array_equal(out, [4, 6, 0, 0])
        other = nnapi.Execution(compiled())
        other.set_input(0, np.zeros(2, np.float32))
        with pytest.raises(nnapi.BadStateError):
            other.enable_input_and_output_padding(True)


class TestCompute:
    def test_compute_once_unless_reusable(self):
        execution, out = ready_execution()
        execution.compute()
        np.testing.assert_array_equal(out, [4, 6])
        with pytest.raises(nnapi.BadStateError):
            execution.compute()
        with pytest.raises(nnapi.BadStateError):
            execution.set_input(0, np.zeros(2, np.float32))

    def test_reusable(self):
        execution = nnapi.Execution(compiled())
        execution.set_reusable(True)
        a = np.array([1, 2], np.float32)
        execution.set_input(0, a)
        execution.set_input(1, np.array([10, 20], np.float32))
        out = np.zeros(2, np.float32)
        execution.set_output(0, out)
        execution.compute()
        np.testing.assert_array_equal(out, [11, 22])
        a[:] = [5, 6]  # the buffer is read again on the next computation
        execution.compute()
        np.testing.assert_array_equal(out, [15, 26])

    def test_dynamic_output_and_insufficient_size(self):
        model = binary_model(in_dims=(0,), out_dims=(0,))
        execution = nnapi.Execution(compiled(model))
        execution.set_input(0, np.arange(5, dtype=np.float32))
        execution.set_input(1, np.ones(5, np.float32))
        small = np.zeros(2, np.float32)
        execution.set_output(0, small)
        with pytest.raises(nnapi.OutputInsufficientSizeError):
            execution.compute()
        # The NDK: OUTPUT_INSUFFICIENT_SIZE for that output, with the dimensions it needs.
        with pytest.raises(nnapi.OutputInsufficientSizeError) as caught:
            execution.get_output_operand_dimensions(0)
        assert caught.value.dimensions == [5]
        with pytest.raises(nnapi.OutputInsufficientSizeError) as caught:
            execution.get_output_operand_rank(0)
        assert caught.value.dimensions == [5]
        assert execution.is_output_sufficient(0) is False
        retry = nnapi.Execution(compiled(model))
        retry.set_input(0, np.arange(5, dtype=np.float32))
        retry.set_input(1, np.ones(5, np.float32))
        big = np.zeros(5, np.float32)
        retry.set_output(0, big)
        retry.compute()
        assert retry.get_output_operand_rank(0) == 1
        np.testing.assert_array_equal(big, [1, 2, 3, 4, 5])

    def test_input_with_unspecified_dimensions(self):
        model = binary_model(in_dims=(0, 0), out_dims=(0, 0))
        execution = nnapi.Execution(compiled(model))
        with pytest.raises(nnapi.BadDataError):
            execution.set_input(0, b"\0" * 16)  # raw bytes do not say their shape
        execution.set_input(0, b"\0" * 16, f32(2, 2))
        execution.set_input(1, np.ones((2, 2), np.float32))  # numpy states its own shape
        with pytest.raises(nnapi.BadDataError):
            execution.set_input(1, np.ones((2, 2, 1), np.float32))  # rank contradicts the model
        out = np.zeros(4, np.float32)
        execution.set_output(0, out)
        execution.compute()
        assert execution.get_output_operand_dimensions(0) == [2, 2]
        np.testing.assert_array_equal(out, [1, 1, 1, 1])

    def test_incompatible_runtime_shapes_fail(self):
        model = binary_model(in_dims=(0,), out_dims=(0,))
        execution = nnapi.Execution(compiled(model))
        execution.set_input(0, np.zeros(3, np.float32))
        execution.set_input(1, np.zeros(4, np.float32))
        execution.set_output(0, np.zeros(4, np.float32))
        with pytest.raises(nnapi.OpFailedError):
            execution.compute()
        with pytest.raises(nnapi.BadStateError):
            execution.get_output_operand_dimensions(0)

    def test_integer_division_by_zero_writes_zero(self):
        # Undefined in NNAPI, but CTS expects the execution to succeed; Android writes 0.
        model = binary_model(Op.DIV, operand=T.TENSOR_INT32)
        execution = nnapi.Execution(compiled(model))
        execution.set_input(0, np.array([-7, 2], np.int32))
        execution.set_input(1, np.array([2, 0], np.int32))
        out = np.full(2, 99, np.int32)
        execution.set_output(0, out)
        execution.compute()
        np.testing.assert_array_equal(out, [-4, 0])

    def test_queries_before_completion_are_bad_state(self):
        execution, _ = ready_execution()
        with pytest.raises(nnapi.BadStateError):
            execution.get_output_operand_dimensions(0)
        with pytest.raises(nnapi.BadStateError):
            execution.get_duration(DurationCode.DURATION_ON_HARDWARE)
        execution.compute()
        with pytest.raises(nnapi.BadDataError):
            execution.get_output_operand_rank(1)
        with pytest.raises(nnapi.BadDataError):
            execution.get_duration(9)

    def test_scalar_output_dimensions_are_bad_data(self):
        # A model whose output is a scalar is not expressible with ADD; check the rule
        # through the private table the query reads.
        execution, _ = ready_execution()
        execution.compute()
        table = copy.copy(execution._table)  # the compilation's, shared: this execution's own copy
        table.output_types = (OperandType(T.FLOAT32),)
        execution._table = table
        with pytest.raises(nnapi.BadDataError):
            execution.get_output_operand_dimensions(0)

    def test_use_after_free(self):
        execution, _ = ready_execution()
        execution.free()
        with pytest.raises(nnapi.BadStateError):
            execution.compute()


class TestTimingAndDeadlines:
    def test_timing_needs_a_single_explicit_device(self):
        execution, _ = ready_execution()
        with pytest.raises(nnapi.BadDataError):
            execution.set_measure_timing(True)
        with pytest.raises(nnapi.BadDataError):
            execution.set_timeout(10)

    def test_measured_durations(self):
        compilation = compiled(devices=[nnapi.get_devices()[0]])
        execution, _ = ready_execution(compilation)
        execution.set_measure_timing(True)
        execution.compute()
        on_hardware = execution.get_duration(DurationCode.DURATION_ON_HARDWARE)
        in_driver = execution.get_duration(DurationCode.DURATION_IN_DRIVER)
        assert 0 < on_hardware <= in_driver < nnapi.DURATION_UNAVAILABLE
        assert execution.get_duration(DurationCode.FENCED_DURATION_ON_HARDWARE) == nnapi.DURATION_UNAVAILABLE

    def test_unmeasured_duration_is_unavailable(self):
        execution, _ = ready_execution()
        execution.compute()
        assert execution.get_duration(DurationCode.DURATION_IN_DRIVER) == nnapi.DURATION_UNAVAILABLE

    def test_deadline_missed(self):
        compilation = compiled(devices=[nnapi.get_devices()[0]])
        execution, _ = ready_execution(compilation)
        execution.set_timeout(1)  # one nanosecond: gone before the first operation
        with pytest.raises(nnapi.MissedDeadlineTransientError) as excinfo:
            execution.compute()
        assert excinfo.value.code == ResultCode.MISSED_DEADLINE_TRANSIENT

    def test_loop_timeout_is_capped(self):
        execution, _ = ready_execution()
        execution.set_loop_timeout(10**12)
        assert execution._loop_timeout_ns == nnapi.get_maximum_loop_timeout()


class TestAsyncBurstAndEvents:
    def test_start_compute(self):
        execution, out = ready_execution()
        event = execution.start_compute()
        event.wait()
        np.testing.assert_array_equal(out, [4, 6])
        event.free()

    def test_errors_arrive_through_wait(self):
        model = binary_model(in_dims=(0,), out_dims=(0,))
        execution = nnapi.Execution(compiled(model))
        execution.set_input(0, np.zeros(3, np.float32))
        execution.set_input(1, np.zeros(4, np.float32))  # does not broadcast with 3
        execution.set_output(0, np.zeros(4, np.float32))
        event = execution.start_compute()
        with pytest.raises(nnapi.OpFailedError):
            event.wait()

    def test_dependencies_and_sync_fences(self):
        first, out1 = ready_execution()
        event1 = first.start_compute_with_dependencies([])  # a fenced event: it has a sync fence
        fence = event1.get_sync_fence_fd()
        second, out2 = ready_execution(a=(10, 20))
        event2 = second.start_compute_with_dependencies([event1])
        event2.wait()
        poller = select.poll()
        poller.register(fence, select.POLLIN)
        assert poller.poll(5000)
        os.close(fence)
        np.testing.assert_array_equal(out1, [4, 6])
        np.testing.assert_array_equal(out2, [13, 24])
        with pytest.raises(nnapi.BadDataError):
            ready_execution()[0].start_compute_with_dependencies([event1], 1000)  # no single device

    def test_event_from_sync_fence_fd(self):
        read_end, write_end = os.pipe()
        event = nnapi.Event.create_from_sync_fence_fd(read_end)
        assert not event.is_done
        os.write(write_end, b"x")
        event.wait()
        assert event.is_done
        event.free()
        for fd in (read_end, write_end):
            os.close(fd)
        with pytest.raises(nnapi.BadDataError):
            nnapi.Event.create_from_sync_fence_fd(-1)

    def test_burst(self):
        compilation = compiled()
        burst = nnapi.Burst(compilation)
        for a in ((1, 1), (2, 2)):
            execution, out = ready_execution(compilation, a=a)
            execution.burst_compute(burst)
            np.testing.assert_array_equal(out, np.add(a, (3, 4)))
        execution, _ = ready_execution()
        with pytest.raises(nnapi.BadDataError):
            execution.burst_compute(burst)  # another compilation
        with pytest.raises(nnapi.BadStateError):
            nnapi.Burst(nnapi.Compilation(binary_model()))
        burst.free()
        with pytest.raises(nnapi.BadStateError):
            ready_execution(compilation)[0].burst_compute(burst)


class TestMemory:
    def test_create_shared(self):
        memory = nnapi.Memory.create_shared(64)
        assert memory.size == 64 and len(memory.buffer) == 64 and not memory.buffer.readonly
        memory.buffer[:4] = b"abcd"
        assert bytes(memory.buffer[:4]) == b"abcd"
        for bad in (0, -1, 1.5):
            with pytest.raises(nnapi.BadDataError):
                nnapi.Memory.create_shared(bad)

    def test_from_fd(self, tmp_path):
        path = tmp_path / "data.bin"
        path.write_bytes(bytes(range(256)) * 32)
        with open(path, "r+b") as handle:
            memory = nnapi.Memory.from_fd(16, nnapi.PROT_READ, handle.fileno(), 100)
            assert bytes(memory.buffer) == bytes(range(100, 116))
            assert memory.buffer.readonly
            with pytest.raises(nnapi.BadDataError):
                nnapi.Memory.from_fd(16, 0x40, handle.fileno(), 0)
            with pytest.raises(nnapi.BadDataError):
                nnapi.Memory.from_fd(0, nnapi.PROT_READ, handle.fileno(), 0)
        with pytest.raises(nnapi.BadDataError):
            nnapi.Memory.from_fd(16, nnapi.PROT_READ, 987654, 0)

    def test_copy(self):
        src, dst = nnapi.Memory.create_shared(8), nnapi.Memory.create_shared(8)
        src.buffer[:] = b"12345678"
        nnapi.Memory.copy(src, dst)
        assert bytes(dst.buffer) == b"12345678"
        with pytest.raises(nnapi.BadDataError):
            nnapi.Memory.copy(src, nnapi.Memory.create_shared(4))

    def test_arguments_from_memory(self):
        memory = nnapi.Memory.create_shared(32)
        values = np.frombuffer(memory.buffer, np.float32)
        values[:] = [1, 2, 3, 4, 0, 0, 0, 0]
        execution = nnapi.Execution(compiled())
        execution.set_input_from_memory(0, memory, 0, 8)
        execution.set_input_from_memory(1, memory, 8, 8)
        execution.set_output_from_memory(0, memory, 16, 8)
        with pytest.raises(nnapi.BadDataError):
            execution.set_input_from_memory(0, memory, 28, 8)  # past the end
        with pytest.raises(nnapi.BadDataError):
            execution.set_input_from_memory(0, memory, 0, 12)  # wrong length
        execution.compute()
        np.testing.assert_array_equal(values[4:6], [4, 6])

    def test_descriptor_closed_when_collected(self):
        import gc

        memory = nnapi.Memory.create_shared(8)
        fd = memory._fd
        os.fstat(fd)
        del memory
        gc.collect()
        with pytest.raises(OSError):
            os.fstat(fd)

    def test_freed_memory(self):
        memory = nnapi.Memory.create_shared(8)
        memory.free()
        with pytest.raises(nnapi.BadStateError):
            memory.buffer  # noqa: B018
        execution = nnapi.Execution(compiled())
        with pytest.raises(nnapi.BadStateError):
            execution.set_input_from_memory(0, memory, 0, 8)


class TestDevices:
    def test_reference_device(self):
        devices = nnapi.get_devices()
        reference = devices[0]
        assert reference.name == "nnapi-reference"
        assert reference.type == nnapi.DeviceTypeCode.DEVICE_CPU
        assert reference.feature_level == nnapi.FeatureLevelCode.FEATURE_LEVEL_8
        assert reference.version == nnapi.__version__
        reference.wait()
        assert nnapi.get_device_count() == len(devices)
        assert nnapi.get_device(0) == reference
        with pytest.raises(nnapi.BadDataError):
            nnapi.get_device(len(devices))

    def test_runtime_constants(self):
        assert nnapi.get_runtime_feature_level() == nnapi.FeatureLevelCode.FEATURE_LEVEL_8
        assert nnapi.get_default_loop_timeout() == 2_000_000_000
        assert nnapi.get_maximum_loop_timeout() == 15_000_000_000
        assert nnapi.MAX_SIZE_OF_IMMEDIATELY_COPIED_VALUES == 128
        assert nnapi.BYTE_SIZE_OF_CACHE_TOKEN == 32
        assert len(nnapi.OperationCode) == 106
        assert nnapi.OperationCode.REVERSE == 105 and nnapi.OperandCode.MODEL == 15
        assert nnapi.PriorityCode.PRIORITY_DEFAULT == nnapi.PriorityCode.PRIORITY_MEDIUM


def test_each_input_and_output_is_set_once():
    """As Android's ExecutionBuilder: a second setInput / setOutput for the same index is
    BAD_STATE (CTS ValidationTestExecution.SetInput, "cannot do this twice")."""
    model = nnapi.Model()
    t = nnapi.OperandType(nnapi.OperandCode.TENSOR_FLOAT32, [2])
    a, b = model.add_operand(t), model.add_operand(t)
    act = model.add_operand(nnapi.OperandType(nnapi.OperandCode.INT32))
    out = model.add_operand(t)
    model.set_operand_value(act, 0)
    model.add_operation(nnapi.OperationCode.ADD, [a, b, act], [out])
    model.identify_inputs_and_outputs([a, b], [out])
    model.finish()
    compilation = nnapi.Compilation(model)
    compilation.finish()
    execution = nnapi.Execution(compilation)
    x, y = np.ones(2, np.float32), np.zeros(2, np.float32)
    execution.set_input(0, x)
    with pytest.raises(nnapi.BadStateError, match="input 0 was already set"):
        execution.set_input(0, x)
    memory = nnapi.Memory.create_shared(8)
    with pytest.raises(nnapi.BadStateError, match="input 0 was already set"):
        execution.set_input_from_memory(0, memory, 0, 8)
    execution.set_input(1, x)
    execution.set_output(0, y)
    with pytest.raises(nnapi.BadStateError, match="output 0 was already set"):
        execution.set_output(0, y)
    execution.compute()
    assert list(y) == [2.0, 2.0]
