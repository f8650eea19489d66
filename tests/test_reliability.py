"""Regressions from the reliability run (issue #18): no crash, no hang, no silent wrong
answer and no raw exception from hostile descriptors, strided arrays, freed objects,
global numpy state and exhausted resources."""

from __future__ import annotations

import math
import os
import socket
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

import nnapi
from helpers import add_model, reference_devices
from nnapi import OperandCode as T
from nnapi import OperandType
from nnapi import OperationCode as Op


def compiled(model=None, devices=None) -> nnapi.Compilation:
    compilation = nnapi.Compilation(model or add_model((8,)), devices)
    compilation.finish()
    return compilation


def run_isolated(code: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter: a crash there (SIGBUS) fails the test, not pytest."""
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=timeout)


# --- 1. SIGBUS through Memory.from_fd ------------------------------------------------------
class TestHostileDescriptors:
    def test_truncated_memfd_copy_is_an_error_not_sigbus(self):
        result = run_isolated("""
            import os, nnapi
            fd = os.memfd_create("x"); os.ftruncate(fd, 4096)
            src = nnapi.Memory.from_fd(4096, nnapi.PROT_READ, fd); os.ftruncate(fd, 0)
            try:
                nnapi.Memory.copy(src, nnapi.Memory.create_shared(4096))
            except nnapi.BadDataError as error:
                print("BAD_DATA", error)
        """)
        assert result.returncode == 0, result.stderr
        assert "BAD_DATA" in result.stdout and "shrank" in result.stdout

    def test_truncated_file_through_compute(self, tmp_path):
        result = run_isolated(f"""
            import os, numpy as np, nnapi
            from nnapi import OperandType, OperandCode as T, OperationCode as Op
            model = nnapi.Model()
            for _ in range(2):
                model.add_operand(OperandType(T.TENSOR_FLOAT32, [4]))
            act = model.add_operand(OperandType(T.INT32)); out = model.add_operand(OperandType(T.TENSOR_FLOAT32, [4]))
            const_fd = os.open({str(tmp_path / "c")!r}, os.O_RDWR | os.O_CREAT); os.ftruncate(const_fd, 16)
            const = nnapi.Memory.from_fd(16, nnapi.PROT_READ, const_fd)
            model.set_operand_value_from_memory(1, const, 0, 16)
            model.set_operand_value(act, 0)
            model.add_operation(Op.ADD, [0, 1, act], [out]); model.identify_inputs_and_outputs([0], [out])
            model.finish()
            compilation = nnapi.Compilation(model); compilation.finish()
            os.ftruncate(const_fd, 0)  # the constant was read when the compilation finished
            fd = os.open({str(tmp_path / "io")!r}, os.O_RDWR | os.O_CREAT); os.ftruncate(fd, 32)
            os.pwrite(fd, np.arange(4, dtype=np.float32).tobytes(), 0)
            memory = nnapi.Memory.from_fd(32, nnapi.PROT_READ | nnapi.PROT_WRITE, fd)
            execution = nnapi.Execution(compilation); execution.set_reusable(True)
            execution.set_input_from_memory(0, memory, 0, 16)
            execution.set_output_from_memory(0, memory, 16, 16)
            execution.compute()
            print("first", np.frombuffer(os.pread(fd, 16, 16), np.float32).tolist())
            os.ftruncate(fd, 8)
            try:
                execution.compute()
            except nnapi.BadDataError as error:
                print("BAD_DATA", error)
        """)
        assert result.returncode == 0, result.stderr
        assert "first [0.0, 1.0, 2.0, 3.0]" in result.stdout
        assert "BAD_DATA" in result.stdout

    def test_sealable_memfd_is_sealed_and_mapped(self):
        fd = os.memfd_create("sealable", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.ftruncate(fd, 4096)
            memory = nnapi.Memory.from_fd(4096, nnapi.PROT_READ | nnapi.PROT_WRITE, fd)
            with pytest.raises(PermissionError):
                os.ftruncate(fd, 0)  # F_SEAL_SHRINK
            memory.buffer[:4] = b"abcd"  # a real mapping: writes land in the file
            assert os.pread(fd, 4, 0) == b"abcd"
        finally:
            os.close(fd)

    def test_create_shared_is_sealed(self):
        memory = nnapi.Memory.create_shared(64)
        with pytest.raises(PermissionError):
            os.ftruncate(memory._fd, 0)

    def test_unsealable_file_reads_at_use(self):
        fd = os.memfd_create("plain")  # no MFD_ALLOW_SEALING: read and written with pread / pwrite
        try:
            os.ftruncate(fd, 8)
            memory = nnapi.Memory.from_fd(8, nnapi.PROT_READ | nnapi.PROT_WRITE, fd)
            os.pwrite(fd, b"12345678", 0)
            assert bytes(memory.buffer) == b"12345678"
            assert memory.buffer.readonly
            source = nnapi.Memory.create_shared(8)
            source.buffer[:] = b"abcdefgh"
            nnapi.Memory.copy(source, memory)
            assert os.pread(fd, 8, 0) == b"abcdefgh"
        finally:
            os.close(fd)

    def test_only_regular_files(self):
        left, right = socket.socketpair()
        read_end, write_end = os.pipe()
        try:
            for fd in (left.fileno(), read_end):
                with pytest.raises(nnapi.UnmappableError, match="socket|pipe"):
                    nnapi.Memory.from_fd(16, nnapi.PROT_READ, fd)
        finally:
            left.close(), right.close(), os.close(read_end), os.close(write_end)

    def test_file_smaller_than_the_memory(self, tmp_path):
        path = tmp_path / "small"
        path.write_bytes(b"x" * 10)
        with open(path, "rb") as handle:
            with pytest.raises(nnapi.BadDataError, match="10 bytes"):
                nnapi.Memory.from_fd(16, nnapi.PROT_READ, handle.fileno())
            with pytest.raises(nnapi.UnmappableError, match="access mode"):
                nnapi.Memory.from_fd(8, nnapi.PROT_READ | nnapi.PROT_WRITE, handle.fileno())

    @pytest.mark.parametrize("call", [
        lambda: nnapi.Memory.create_shared(2**63),
        lambda: nnapi.Memory.create_shared(True),
        lambda: nnapi.Memory.from_fd(2**64, nnapi.PROT_READ, 0),
        lambda: nnapi.Memory.from_fd(16, nnapi.PROT_READ, 2**31),
        lambda: nnapi.Memory.from_fd(16, nnapi.PROT_READ, 0, 2**63),
        lambda: nnapi.Memory.copy(3, nnapi.Memory.create_shared(4)),
        lambda: nnapi.Event.create_from_sync_fence_fd(2**31),
    ])
    def test_out_of_range_arguments(self, call):
        with pytest.raises(nnapi.NnapiError):
            call()


# --- 2 and 3. strided numpy arguments; dtype and shape checks ----------------------------
def strided_views():
    yield "step", lambda: np.zeros(16, np.float32)[::2]
    yield "reversed", lambda: np.zeros(8, np.float32)[::-1]
    yield "column", lambda: np.zeros((8, 3), np.float32)[:, 1]
    yield "transposed", lambda: np.zeros((2, 4), np.float32).T
    yield "fortran", lambda: np.asfortranarray(np.zeros((2, 4), np.float32))


class TestStridedArrays:
    @pytest.mark.parametrize("name,make", list(strided_views()))
    def test_strided_output_is_written_through(self, name, make):
        dims = (8,) if name in ("step", "reversed", "column") else (4, 2) if name == "transposed" else (2, 4)
        execution = nnapi.Execution(compiled(add_model(dims)))
        a = np.arange(8, dtype=np.float32).reshape(dims)
        execution.set_input(0, a)
        execution.set_input(1, np.ones(dims, np.float32))
        out = make()
        execution.set_output(0, out)
        execution.compute()
        np.testing.assert_array_equal(out, a + 1)

    def test_strided_input_read_at_compute_time(self):
        execution = nnapi.Execution(compiled())
        execution.set_reusable(True)
        base = np.zeros(16, np.float32)
        strided = base[::2]
        contiguous = np.zeros(8, np.float32)
        out = np.zeros(8, np.float32)
        execution.set_input(0, strided)
        execution.set_input(1, contiguous)
        execution.set_output(0, out)
        execution.compute()
        np.testing.assert_array_equal(out, 0)
        strided[:] = 5
        contiguous[:] = 1
        execution.compute()
        np.testing.assert_array_equal(out, 6)

    def test_dtype_must_match(self):
        execution = nnapi.Execution(compiled())
        with pytest.raises(nnapi.BadDataError, match=r"input 1 .*float32.*int32"):
            execution.set_input(1, np.zeros(8, np.int32))  # same byte count, wrong meaning
        with pytest.raises(nnapi.BadDataError, match=r"output 0 .*float32.*float64"):
            execution.set_output(0, np.zeros(4, np.float64))
        with pytest.raises(nnapi.BadDataError, match="input 0"):
            execution.set_input(0, np.zeros(8, np.dtype(">f4")))
        with pytest.raises(nnapi.BadDataError):
            execution.set_input(0, np.array([1] * 8, dtype=object))
        with pytest.raises(nnapi.BadDataError, match="masked"):
            execution.set_input(0, np.ma.masked_array(np.zeros(8, np.float32), [0, 1] * 4))

    def test_shape_must_match(self):
        execution = nnapi.Execution(compiled(add_model((2, 4))))
        with pytest.raises(nnapi.BadDataError, match=r"input 0 has shape \[2, 4\]; got an array of shape \[4, 2\]"):
            execution.set_input(0, np.zeros((4, 2), np.float32))
        with pytest.raises(nnapi.BadDataError, match=r"output 0 has shape \[2, 4\]"):
            execution.set_output(0, np.zeros((1, 8), np.float32))
        execution.set_input(0, np.zeros(8, np.float32))  # a flat buffer with the right count is fine
        execution.set_input(1, np.zeros((2, 4), np.float32))

    def test_too_small_output_names_the_output_and_size(self):
        model = nnapi.Model()
        a = model.add_operand(OperandType(T.TENSOR_FLOAT32, [3]))
        act = model.add_operand(OperandType(T.INT32))
        out = model.add_operand(OperandType(T.TENSOR_FLOAT32, [0]))
        model.set_operand_value(act, 0)
        model.add_operation(Op.ADD, [a, a, act], [out])
        model.identify_inputs_and_outputs([a], [out])
        model.finish()
        execution = nnapi.Execution(compiled(model))
        execution.set_input(0, np.ones(3, np.float32))
        execution.set_output(0, np.zeros(2, np.float32))
        with pytest.raises(nnapi.OutputInsufficientSizeError, match=r"output 0 needs 12 bytes .*got 8"):
            execution.compute()
        with pytest.raises(nnapi.BadDataError, match=r"output 0 .*needs 32 bytes, got 16"):
            nnapi.Execution(compiled()).set_output(0, bytearray(16))


# --- 4 and 5. Event lifetimes --------------------------------------------------------------
class TestEvents:
    def test_not_constructible(self):
        with pytest.raises(nnapi.BadDataError):
            nnapi.Event()
        with pytest.raises(TypeError):  # also what Python code expects
            nnapi.Event()
        with pytest.raises(nnapi.UnexpectedNullError):
            nnapi.Device(None)
        with pytest.raises(nnapi.BadDataError):
            nnapi.Device(5)
        with pytest.raises(nnapi.BadDataError):
            nnapi.Memory()

    def test_freed_fence_dependency_does_not_hang(self):
        read_end, write_end = os.pipe()
        dependency = nnapi.Event.create_from_sync_fence_fd(read_end)
        os.close(read_end)
        execution = nnapi.Execution(compiled())
        execution.set_input(0, np.ones(8, np.float32))
        execution.set_input(1, np.ones(8, np.float32))
        out = np.zeros(8, np.float32)
        execution.set_output(0, out)
        event = execution.start_compute_with_dependencies([dependency])
        dependency.free()
        # Reuse the freed number for a descriptor that never becomes readable.
        blockers = [os.pipe() for _ in range(4)]
        assert not event.is_done
        os.write(write_end, b"x")  # signal the real fence
        finished = threading.Event()

        def wait() -> None:
            event.wait()
            event.free()
            finished.set()

        threading.Thread(target=wait, daemon=True).start()
        assert finished.wait(10), "the execution waited on a reused descriptor"
        np.testing.assert_array_equal(out, 2)
        for r, w in blockers:
            os.close(r), os.close(w)
        os.close(write_end)

    def test_freed_execution_dependency(self):
        first = nnapi.Execution(compiled())
        out1 = np.zeros(8, np.float32)
        for i in range(2):
            first.set_input(i, np.ones(8, np.float32))
        first.set_output(0, out1)
        event1 = first.start_compute()
        second = nnapi.Execution(compiled())
        out2 = np.zeros(8, np.float32)
        second.set_input(0, out1)
        second.set_input(1, np.ones(8, np.float32))
        second.set_output(0, out2)
        event2 = second.start_compute_with_dependencies([event1])
        event1.free()
        event2.wait()
        np.testing.assert_array_equal(out2, 3)


def test_free_while_running():
    """ANeuralNetworksExecution_free on a running execution: the computation finishes."""
    read_end, write_end = os.pipe()
    gate = nnapi.Event.create_from_sync_fence_fd(read_end)
    execution = nnapi.Execution(compiled())
    execution.set_input(0, np.ones(8, np.float32))
    execution.set_input(1, np.ones(8, np.float32))
    out = np.zeros(8, np.float32)
    execution.set_output(0, out)
    event = execution.start_compute_with_dependencies([gate])
    execution.free()
    os.write(write_end, b"x")
    event.wait()
    np.testing.assert_array_equal(out, 2)
    os.close(read_end), os.close(write_end)


# --- 6. bounded worker pool ----------------------------------------------------------------
class TestWorkerPool:
    def test_many_outstanding_executions_use_few_threads(self):
        compilation = compiled()
        read_end, write_end = os.pipe()
        gate = nnapi.Event.create_from_sync_fence_fd(read_end)
        before = threading.active_count()
        events, outputs = [], []
        for _ in range(200):
            execution = nnapi.Execution(compilation)
            execution.set_input(0, np.ones(8, np.float32))
            execution.set_input(1, np.ones(8, np.float32))
            out = np.zeros(8, np.float32)
            execution.set_output(0, out)
            events.append(execution.start_compute_with_dependencies([gate]))
            outputs.append(out)
        assert threading.active_count() - before <= 2  # waiting holds no worker
        os.write(write_end, b"x")
        for event in events:
            event.wait()
        assert threading.active_count() - before <= nnapi._scheduler.MAX_WORKERS + 1
        assert all((out == 2).all() for out in outputs)
        os.close(read_end), os.close(write_end)

    def test_exhausted_pool_is_transient_and_execution_stays_usable(self, monkeypatch):
        from nnapi import _scheduler

        pool = _scheduler.WorkerPool(max_workers=1, max_outstanding=1)
        monkeypatch.setattr(_scheduler, "POOL", pool)
        monkeypatch.setattr("nnapi.execution.POOL", pool)
        read_end, write_end = os.pipe()
        gate = nnapi.Event.create_from_sync_fence_fd(read_end)
        compilation = compiled()

        def execution():
            e = nnapi.Execution(compilation)
            for i in range(2):
                e.set_input(i, np.ones(8, np.float32))
            e.set_output(0, np.zeros(8, np.float32))
            return e

        first = execution().start_compute_with_dependencies([gate])
        second = execution()
        with pytest.raises(nnapi.ResourceExhaustedTransientError):
            second.start_compute()
        os.write(write_end, b"x")
        first.wait()
        second.compute()  # back in a usable state
        os.close(read_end), os.close(write_end)

    def test_fence_watch_failure_leaves_the_execution_usable(self, monkeypatch):
        from nnapi import _scheduler

        def refuse(fd, callback, call):
            raise nnapi.ResourceExhaustedTransientError(f"{call}: no fence thread")

        read_end, write_end = os.pipe()
        fence = nnapi.Event.create_from_sync_fence_fd(read_end)
        execution = nnapi.Execution(compiled())
        for i in range(2):
            execution.set_input(i, np.ones(8, np.float32))
        out = np.zeros(8, np.float32)
        execution.set_output(0, out)
        monkeypatch.setattr(_scheduler.FENCES, "watch", refuse)
        with pytest.raises(nnapi.ResourceExhaustedTransientError):
            execution.start_compute_with_dependencies([fence])
        monkeypatch.undo()
        execution.compute()  # still in preparation: usable
        np.testing.assert_array_equal(out, 2)
        os.close(read_end), os.close(write_end)

    def test_thread_start_failure(self, monkeypatch):
        from nnapi import _scheduler

        pool = _scheduler.WorkerPool()
        monkeypatch.setattr("nnapi.execution.POOL", pool)

        def refuse(self):
            raise RuntimeError("can't start new thread")

        monkeypatch.setattr(threading.Thread, "start", refuse)
        execution = nnapi.Execution(compiled())
        for i in range(2):
            execution.set_input(i, np.ones(8, np.float32))
        execution.set_output(0, np.zeros(8, np.float32))
        with pytest.raises(nnapi.ResourceExhaustedTransientError):
            execution.start_compute()
        monkeypatch.undo()
        execution.compute()


# --- 7. numpy error state --------------------------------------------------------------------
def test_kernels_ignore_the_callers_numpy_error_state():
    model = nnapi.Model()
    x = model.add_operand(OperandType(T.TENSOR_FLOAT32, [4]))
    y = model.add_operand(OperandType(T.TENSOR_FLOAT32, [4]))
    model.add_operation(Op.LOGISTIC, [x], [y])
    model.identify_inputs_and_outputs([x], [y])
    model.finish()
    compilation = compiled(model)
    out = np.zeros(4, np.float32)
    with np.errstate(all="raise"):
        execution = nnapi.Execution(compilation)
        execution.set_input(0, np.array([-1000, -100, 0, 1000], np.float32))
        execution.set_output(0, out)
        execution.compute()
    np.testing.assert_allclose(out, [0, 0, 0.5, 1], atol=1e-30)


# --- raw exceptions --------------------------------------------------------------------------
def small_execution():
    execution = nnapi.Execution(compiled())
    return execution


@pytest.mark.parametrize("call", [
    lambda: nnapi.Compilation(add_model((8,)), 5),
    lambda: nnapi.Compilation(add_model((8,)), nnapi.get_devices()[0]),
    lambda: nnapi.Compilation(add_model((8,))).set_caching("/tmp", -1),
    lambda: nnapi.Compilation(add_model((8,))).set_caching("/tmp", 2**40),
    lambda: nnapi.Compilation(add_model((8,))).set_caching("/tmp", [300] * 32),
    lambda: nnapi.MemoryDesc().set_dimensions(5),
    lambda: nnapi.MemoryDesc().set_dimensions([math.nan]),
    lambda: nnapi.MemoryDesc().set_dimensions([2**40]),
    lambda: small_execution().set_reusable(np.array([1, 2])),
    lambda: small_execution().enable_input_and_output_padding(np.array([1, 2])),
    lambda: nnapi.Execution(compiled(devices=nnapi.get_devices()[:1])).set_measure_timing(np.array([1, 2])),
    lambda: nnapi.Model().relax_computation_float32_to_float16(np.array([1, 2])),
    lambda: add_model((8,)).get_supported_operations_for_devices(np.array(1)),
])
def test_bad_arguments_are_nnapi_errors(call):
    with pytest.raises(nnapi.NnapiError):
        call()


def test_memory_desc_rank_mismatch():
    compilation = compiled()
    desc = nnapi.MemoryDesc()
    desc.set_dimensions([2, 2])
    with pytest.raises(nnapi.BadDataError):
        desc.add_input_role(compilation, 0)


# --- also wrong ------------------------------------------------------------------------------
def test_compute_after_compilation_freed_is_bad_state():
    compilation = compiled()
    execution = nnapi.Execution(compilation)
    for i in range(2):
        execution.set_input(i, np.ones(8, np.float32))
    execution.set_output(0, np.zeros(8, np.float32))
    compilation.free()
    with pytest.raises(nnapi.BadStateError, match="compilation was freed"):
        execution.compute()
    with pytest.raises(nnapi.BadStateError):
        execution.start_compute()


def test_finish_after_model_freed_is_bad_state():
    model = add_model((8,))
    compilation = nnapi.Compilation(model)
    model.free()
    with pytest.raises(nnapi.BadStateError):
        compilation.finish()


@pytest.mark.parametrize("code,value", [(T.INT32, 1.7), (T.INT32, 2**40), (T.UINT32, -1), (T.BOOL, 5),
                                        (T.FLOAT16, 1e10), (T.INT32, math.inf)])
def test_scalars_that_would_change_value(code, value):
    model = nnapi.Model()
    index = model.add_operand(OperandType(code))
    with pytest.raises(nnapi.BadDataError, match="operand 0"):
        model.set_operand_value(index, value)


@pytest.mark.parametrize("value", [np.zeros(2, object), np.ma.masked_array(np.zeros(2, np.float32), [0, 1])])
def test_constants_of_objects_or_masked_are_bad_data(value):
    model = nnapi.Model()
    index = model.add_operand(OperandType(T.TENSOR_FLOAT32, [2]))
    with pytest.raises(nnapi.BadDataError, match="operand 0"):
        model.set_operand_value(index, value)


def test_scalars_that_keep_their_value():
    model = nnapi.Model()
    index = model.add_operand(OperandType(T.INT32))
    model.set_operand_value(index, 2.0)
    model.set_operand_value(index, True)


def test_device_memory_copies_through_pread_pwrite():
    compilation = compiled()
    desc = nnapi.MemoryDesc()
    desc.add_output_role(compilation, 0)
    desc.finish()
    device = nnapi.Memory.from_desc(desc)
    execution = nnapi.Execution(compilation)
    execution.set_input(0, np.arange(8, dtype=np.float32))
    execution.set_input(1, np.ones(8, np.float32))
    execution.set_output_from_memory(0, device, 0, 0)
    execution.compute()
    fd = os.memfd_create("plain")  # unsealable: read and written with pread / pwrite
    try:
        os.ftruncate(fd, 32)
        host = nnapi.Memory.from_fd(32, nnapi.PROT_READ | nnapi.PROT_WRITE, fd)
        nnapi.Memory.copy(device, host)
        np.testing.assert_array_equal(np.frombuffer(os.pread(fd, 32, 0), np.float32), np.arange(8) + 1)
    finally:
        os.close(fd)


# --- enormous shapes and deadlines inside one operation ---------------------------------------
def test_enormous_output_is_out_of_memory_before_allocating():
    model = nnapi.Model()
    dims = model.add_operand(OperandType(T.TENSOR_INT32, [2]))
    value = model.add_operand(OperandType(T.FLOAT32))
    out = model.add_operand(OperandType(T.TENSOR_FLOAT32, [0, 0]))
    model.set_operand_value(value, 1.0)
    model.add_operation(Op.FILL, [dims, value], [out])
    model.identify_inputs_and_outputs([dims], [out])
    model.finish()
    execution = nnapi.Execution(compiled(model))
    execution.set_input(0, np.array([2**16, 2**15], np.int32))  # 2**31 elements, 8 GiB
    execution.set_output(0, np.zeros(4, np.float32))
    with pytest.raises(nnapi.OutOfMemoryError, match=r"FILL: output 0 of shape \[65536, 32768\]"):
        execution.compute()


def conv_model(size: int, channels: int) -> nnapi.Model:
    model = nnapi.Model()
    x = model.add_operand(OperandType(T.TENSOR_FLOAT32, [1, size, size, channels]))
    w = model.add_operand(OperandType(T.TENSOR_FLOAT32, [channels, 3, 3, channels]))
    b = model.add_operand(OperandType(T.TENSOR_FLOAT32, [channels]))
    scalars = [model.add_operand(OperandType(T.INT32)) for _ in range(4)]
    y = model.add_operand(OperandType(T.TENSOR_FLOAT32, [1, size, size, channels]))
    model.set_operand_value(w, np.ones((channels, 3, 3, channels), np.float32))
    model.set_operand_value(b, np.zeros(channels, np.float32))
    for index, value in zip(scalars, [1, 1, 1, 0], strict=True):  # SAME padding, stride 1, no activation
        model.set_operand_value(index, value)
    model.add_operation(Op.CONV_2D, [x, w, b, *scalars], [y])
    model.identify_inputs_and_outputs([x], [y])
    model.finish()
    return model


def test_deadline_ends_one_long_operation():
    """One CONV_2D and a deadline far shorter than it: the deadline used to be checked only
    between operations, so the execution ran to the end and succeeded."""
    compilation = compiled(conv_model(64, 64), nnapi.get_devices()[:1])
    execution = nnapi.Execution(compilation)
    execution.set_timeout(1_000_000)  # 1 ms
    execution.set_input(0, np.ones((1, 64, 64, 64), np.float32))
    execution.set_output(0, np.zeros((1, 64, 64, 64), np.float32))
    with pytest.raises(nnapi.MissedDeadlineTransientError):
        execution.compute()


def test_convolution_checks_the_deadline_per_block():
    from nnapi.operations._conv_common import IM2COL_BLOCK_BYTES, Spatial, conv_accumulate
    from nnapi.operations.base import deadline_checked

    calls = []

    def check() -> None:
        calls.append(1)
        if len(calls) == 2:
            raise nnapi.MissedDeadlineTransientError("deadline")

    rows = 4 * IM2COL_BLOCK_BYTES // (32 * 9 * 8 * 4)  # a few blocks of output rows
    x = np.ones((1, rows, 32, 8), np.float32)
    sp = Spatial(0, 0, 0, 0, 1, 1, 1, 1, 0, False, {})
    with deadline_checked(check), pytest.raises(nnapi.MissedDeadlineTransientError):
        conv_accumulate(x, np.ones((8, 3, 3, 8), np.float32), 1, sp, (rows - 2, 30))
    assert len(calls) == 2


def test_omitting_a_required_input_is_bad_data():
    model = nnapi.Model()
    x = model.add_operand(OperandType(T.TENSOR_FLOAT32, [4]))
    y = model.add_operand(OperandType(T.TENSOR_FLOAT32, [4]))
    model.add_operation(Op.LOGISTIC, [x], [y])
    model.identify_inputs_and_outputs([x], [y])
    model.finish()
    execution = nnapi.Execution(compiled(model))
    execution.set_input(0, None)
    execution.set_output(0, np.zeros(4, np.float32))
    with pytest.raises(nnapi.BadDataError, match="LOGISTIC: input 0 omitted"):
        execution.compute()


@pytest.mark.parametrize("code", [Op.AVERAGE_POOL_2D, Op.MAX_POOL_2D, Op.L2_POOL_2D])
def test_pooling_checks_the_deadline_inside_the_kernel(code, monkeypatch):
    from nnapi.drivers import reference

    model = nnapi.Model()
    x = model.add_operand(OperandType(T.TENSOR_FLOAT32, [1, 8, 8, 2]))
    scalars = [model.add_operand(OperandType(T.INT32)) for _ in range(6)]
    y = model.add_operand(OperandType(T.TENSOR_FLOAT32, [1, 1, 1, 2]))
    for index, value in zip(scalars, [2, 1, 1, 8, 8, 0], strict=True):  # VALID, stride 1, 8x8 window
        model.set_operand_value(index, value)
    model.add_operation(code, [x, *scalars], [y])
    model.identify_inputs_and_outputs([x], [y])
    model.finish()
    calls = []
    monkeypatch.setattr(reference._Run, "check_deadline", lambda self: calls.append(1))
    execution = nnapi.Execution(compiled(model, reference_devices()))  # the reference's kernel
    execution.set_timeout(60 * 10**9)  # a deadline for the kernel to check (none: nothing to check)
    execution.set_input(0, np.ones((1, 8, 8, 2), np.float32))
    out = np.zeros((1, 1, 1, 2), np.float32)
    execution.set_output(0, out)
    execution.compute()
    np.testing.assert_allclose(out, 1)
    assert len(calls) > 1  # once before the operation, then once per row of window taps
