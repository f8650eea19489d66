"""Driver-allocated device memory: IDevice.allocate / IBuffer in nnapi-reference and the
sample drivers, Memory.from_desc asking the roles' device (and falling back to runtime
memory as Android does), Memory.copy, executions reading and writing device memory, and
device memory kept on its own device (staging through copy_to / copy_from) when another
device or the CPU fallback runs a step."""

from __future__ import annotations

import gc

import numpy as np
import pytest

import nnapi
from helpers import add_model, only_devices
from nnapi import OperandCode as T
from nnapi import OperandType
from nnapi import OperationCode as Op
from nnapi.drivers.reference import ReferenceDevice
from nnapi.drivers.sample import FaultyDevice, SampleDevice
from nnapi.hal import (
    BufferDesc,
    BufferRole,
    BufferToken,
    DataLocation,
    ErrorStatus,
    HalError,
    Request,
    RequestArgument,
)
from nnapi.runtime.model_builder import build_hal_model


@pytest.fixture(autouse=True)
def _reference_and_registered_only():
    """These tests check which device allocates and how memory is staged among known devices:
    plug-ins discovered on this machine (nnapi-ort-cpu) must not take the operations."""
    with only_devices():
        yield


def compile_model(model, devices=None) -> nnapi.Compilation:
    compilation = nnapi.Compilation(model, devices)
    compilation.finish()
    return compilation


def device(name: str) -> nnapi.Device:
    return next(d for d in nnapi.get_devices() if d.name == name)


def device_memory(roles, dimensions=None) -> nnapi.Memory:
    """roles: (compilation, "input" | "output", index) triples."""
    desc = nnapi.MemoryDesc()
    for compilation, kind, index in roles:
        (desc.add_input_role if kind == "input" else desc.add_output_role)(compilation, index)
    if dimensions is not None:
        desc.set_dimensions(dimensions)
    desc.finish()
    return nnapi.Memory.from_desc(desc)


def shared(values) -> nnapi.Memory:
    values = np.asarray(values, np.float32)
    memory = nnapi.Memory.create_shared(values.nbytes)
    np.frombuffer(memory.buffer, np.float32)[:] = values
    return memory


def read(memory: nnapi.Memory) -> np.ndarray:
    """A device memory's values, through Memory.copy into shared memory."""
    host = nnapi.Memory.create_shared(memory.size)
    nnapi.Memory.copy(memory, host)
    return np.frombuffer(host.buffer, np.float32).copy()


def run_add(compilation, a, b, out=None):
    """Execute a + b; each of a, b, out is an array or a Memory (bound whole)."""
    execution = nnapi.Execution(compilation)
    for index, value in enumerate((a, b)):
        if isinstance(value, nnapi.Memory):
            execution.set_input_from_memory(index, value, 0, 0)
        else:
            execution.set_input(index, np.asarray(value, np.float32))
    result = np.zeros(2, np.float32) if out is None else out
    if isinstance(result, nnapi.Memory):
        execution.set_output_from_memory(0, result, 0, 0)
    else:
        execution.set_output(0, result)
    execution.compute()
    return result


# --- the driver: IDevice.allocate and IBuffer ---------------------------------------------
def prepared_add(driver):
    hal_model, _ = build_hal_model(add_model())
    return driver.prepare_model(hal_model)


def test_reference_allocate_and_buffer_copies():
    driver = ReferenceDevice()
    prepared = prepared_add(driver)
    buffer, token = driver.allocate(BufferDesc([]), [prepared], [BufferRole(0, 0)], [BufferRole(0, 0)])
    assert token > 0
    destination = bytearray(8)
    with pytest.raises(HalError) as excinfo:
        buffer.copy_to(destination)  # never written
    assert excinfo.value.status == ErrorStatus.GENERAL_FAILURE
    with pytest.raises(HalError) as excinfo:
        buffer.copy_from(bytearray(12), [])  # wrong size
    assert excinfo.value.status == ErrorStatus.INVALID_ARGUMENT
    with pytest.raises(HalError) as excinfo:
        buffer.copy_from(bytearray(8), [3])  # contradicts [2]
    assert excinfo.value.status == ErrorStatus.INVALID_ARGUMENT
    buffer.copy_from(np.array([1.5, -2], np.float32).tobytes(), [2])
    with pytest.raises(HalError) as excinfo:
        buffer.copy_to(bytes(8))  # read-only destination
    assert excinfo.value.status == ErrorStatus.INVALID_ARGUMENT
    with pytest.raises(HalError):
        buffer.copy_to(bytearray(4))
    buffer.copy_to(destination)
    np.testing.assert_array_equal(np.frombuffer(destination, np.float32), [1.5, -2])
    second, second_token = driver.allocate(BufferDesc([2]), [prepared], [BufferRole(0, 1)], [])
    assert second_token != token


@pytest.mark.parametrize("arguments, status", [
    (lambda p, o: (BufferDesc([]), [], [BufferRole(0, 0)], []), ErrorStatus.INVALID_ARGUMENT),
    (lambda p, o: (BufferDesc([]), [p], [], []), ErrorStatus.INVALID_ARGUMENT),
    (lambda p, o: (BufferDesc([]), [o], [BufferRole(0, 0)], []), ErrorStatus.INVALID_ARGUMENT),
    (lambda p, o: (BufferDesc([]), [p], [BufferRole(1, 0)], []), ErrorStatus.INVALID_ARGUMENT),
    (lambda p, o: (BufferDesc([]), [p], [BufferRole(0, 2)], []), ErrorStatus.INVALID_ARGUMENT),
    (lambda p, o: (BufferDesc([]), [p], [], [BufferRole(0, 1)]), ErrorStatus.INVALID_ARGUMENT),
    (lambda p, o: (BufferDesc([]), [p], [BufferRole(0, 0, 0.0)], []), ErrorStatus.INVALID_ARGUMENT),
    (lambda p, o: (BufferDesc([]), [p], [BufferRole(0, 0), BufferRole(0, 0)], []), ErrorStatus.INVALID_ARGUMENT),
    (lambda p, o: (BufferDesc([3]), [p], [BufferRole(0, 0)], []), ErrorStatus.INVALID_ARGUMENT),
    (lambda p, o: (BufferDesc([2, 1]), [p], [BufferRole(0, 0)], []), ErrorStatus.INVALID_ARGUMENT),
    (lambda p, o: (BufferDesc(["x"]), [p], [BufferRole(0, 0)], []), ErrorStatus.INVALID_ARGUMENT),
])
def test_reference_allocate_refuses_bad_roles(arguments, status):
    driver = ReferenceDevice()
    prepared = prepared_add(driver)
    other = prepared_add(ReferenceDevice())  # another device's prepared model
    with pytest.raises(HalError) as excinfo:
        driver.allocate(*arguments(prepared, other))
    assert excinfo.value.status == status


def test_reference_allocate_needs_known_dimensions():
    driver = ReferenceDevice()
    hal_model, _ = build_hal_model(add_model((0,)))
    prepared = driver.prepare_model(hal_model)
    with pytest.raises(HalError) as excinfo:
        driver.allocate(BufferDesc([]), [prepared], [], [BufferRole(0, 0)])
    assert excinfo.value.status == ErrorStatus.GENERAL_FAILURE
    buffer, _ = driver.allocate(BufferDesc([4]), [prepared], [], [BufferRole(0, 0)])  # completed by the desc
    buffer.copy_from(bytearray(16), [])


def _request(pools, a=None, b=None, out=None):
    """An ADD request: each argument is a pool index (whole pool of 8 bytes)."""
    def argument(pool):
        return RequestArgument(False, DataLocation(pool, 0, 8), [])
    return Request([argument(a), argument(b)], [argument(out)], pools)


def test_reference_executes_with_tokens_and_checks_them():
    driver = ReferenceDevice()
    prepared = prepared_add(driver)
    in_buffer, in_token = driver.allocate(BufferDesc([]), [prepared], [BufferRole(0, 0)], [BufferRole(0, 0)])
    out_buffer, out_token = driver.allocate(BufferDesc([]), [prepared], [], [BufferRole(0, 0)])
    one = np.array([1, 2], np.float32).tobytes()

    def status_of(request):
        with pytest.raises(HalError) as excinfo:
            prepared.execute(request)
        return excinfo.value.status

    assert status_of(_request([BufferToken(in_token), one, bytearray(8)], 0, 1, 2)) == ErrorStatus.GENERAL_FAILURE
    in_buffer.copy_from(np.array([10, 20], np.float32).tobytes(), [])
    # a token this device never issued; a role the memory was not allocated for; one
    # memory as input and output; an offset into device memory
    assert status_of(_request([BufferToken(999), one, bytearray(8)], 0, 1, 2)) == ErrorStatus.INVALID_ARGUMENT
    assert status_of(_request([one, BufferToken(in_token), bytearray(8)], 0, 1, 2)) == ErrorStatus.INVALID_ARGUMENT
    assert status_of(_request([BufferToken(in_token), one], 0, 1, 0)) == ErrorStatus.INVALID_ARGUMENT
    bad_offset = _request([BufferToken(in_token), one, bytearray(8)], 0, 1, 2)
    bad_offset.inputs[0].location = DataLocation(0, 4, 4)
    assert status_of(bad_offset) == ErrorStatus.INVALID_ARGUMENT
    shapes, _ = prepared.execute(_request([BufferToken(in_token), one, BufferToken(out_token)], 0, 1, 2))
    assert shapes[0].dimensions == [2]
    result = bytearray(8)
    out_buffer.copy_to(result)
    np.testing.assert_array_equal(np.frombuffer(result, np.float32), [11, 22])
    # a token is only valid while its IBuffer lives
    del in_buffer
    gc.collect()
    assert status_of(_request([BufferToken(in_token), one, bytearray(8)], 0, 1, 2)) == ErrorStatus.INVALID_ARGUMENT


def test_sample_and_faulty_devices_allocate():
    for driver in (SampleDevice("sample-mem"), FaultyDevice("faulty-mem")):
        prepared = prepared_add(driver)
        buffer, token = driver.allocate(BufferDesc([]), [prepared], [BufferRole(0, 0)], [])
        buffer.copy_from(np.array([5, 6], np.float32).tobytes(), [])
        out = bytearray(8)
        prepared.execute(_request([BufferToken(token), np.ones(2, np.float32).tobytes(), out], 0, 1, 2))
        np.testing.assert_array_equal(np.frombuffer(out, np.float32), [6, 7])
        with pytest.raises(HalError):  # the reference's prepared model is not theirs
            driver.allocate(BufferDesc([]), [prepared_add(ReferenceDevice())], [BufferRole(0, 0)], [])
    with pytest.raises(HalError) as excinfo:
        failing = FaultyDevice("faulty-noalloc", fail_allocate=True)
        failing.allocate(BufferDesc([]), [prepared_add(failing)], [BufferRole(0, 0)], [])
    assert excinfo.value.status == ErrorStatus.GENERAL_FAILURE


# --- the runtime: Memory.from_desc, executions, Memory.copy --------------------------------
def test_from_desc_is_allocated_by_the_roles_device():
    compilation = compile_model(add_model())
    memory = device_memory([(compilation, "output", 0), (compilation, "input", 0)])
    assert memory.device_name == "nnapi-reference" and memory.size == 8 and memory.is_from_desc
    with pytest.raises(nnapi.BadStateError):
        memory.buffer  # noqa: B018 - the bytes are the driver's


def test_execution_chain_through_device_memory():
    compilation = compile_model(add_model())
    memory = device_memory([(compilation, "output", 0), (compilation, "input", 0)])
    with pytest.raises(nnapi.OpFailedError):
        run_add(compilation, memory, [1, 1])  # never written
    run_add(compilation, [1, 2], [10, 20], memory)
    for _ in range(3):  # out = memory + 1, written back into a second memory, then copied back
        out = run_add(compilation, memory, [1, 1])
        nnapi.Memory.copy(shared(out), memory)
    np.testing.assert_array_equal(read(memory), [14, 25])


def test_copy_round_trips():
    compilation = compile_model(add_model())
    first = device_memory([(compilation, "input", 0)])
    second = device_memory([(compilation, "input", 1)])
    nnapi.Memory.copy(shared([3, 4]), first)          # shared -> device (copy_from)
    nnapi.Memory.copy(first, second)                  # device -> device (copy_to, copy_from)
    nnapi.Memory.copy(first, first)                   # itself: nothing to do
    np.testing.assert_array_equal(read(second), [3, 4])  # device -> shared (copy_to)
    np.testing.assert_array_equal(run_add(compilation, first, second), [6, 8])


def test_copy_misuse_has_ndk_codes():
    compilation = compile_model(add_model())
    three = compile_model(add_model((3,)))
    memory = device_memory([(compilation, "input", 0)])
    fresh = device_memory([(compilation, "input", 1)])
    wide = device_memory([(three, "input", 0)])
    with pytest.raises(nnapi.BadDataError):
        nnapi.Memory.copy(fresh, memory)  # uninitialized source
    with pytest.raises(nnapi.BadDataError):
        nnapi.Memory.copy(shared([1, 2, 3]), memory)  # 12 bytes into 8
    nnapi.Memory.copy(shared([1, 2, 3]), wide)
    with pytest.raises(nnapi.BadDataError):
        nnapi.Memory.copy(wide, memory)  # incompatible dimensions [3] and [2]
    readonly_file = nnapi.Memory.create_shared(8)
    readonly = nnapi.Memory.from_fd(8, nnapi.memory.PROT_READ, readonly_file._fd)
    nnapi.Memory.copy(shared([7, 8]), memory)
    with pytest.raises(nnapi.BadDataError):
        nnapi.Memory.copy(memory, readonly)
    with pytest.raises(nnapi.UnexpectedNullError):
        nnapi.Memory.copy(memory, None)
    # a failed copy leaves its destination uninitialized, as the NDK says
    with pytest.raises(nnapi.BadDataError):
        nnapi.Memory.copy(shared([1, 2, 3]), memory)
    with pytest.raises(nnapi.BadDataError):
        nnapi.Memory.copy(memory, shared([0, 0]))
    with pytest.raises(nnapi.OpFailedError):
        run_add(compilation, memory, [1, 1])


def test_set_from_memory_misuse_has_ndk_codes():
    compilation = compile_model(add_model())
    other = compile_model(add_model())
    memory = device_memory([(compilation, "input", 0)])
    execution = nnapi.Execution(compilation)
    with pytest.raises(nnapi.BadDataError):
        execution.set_input_from_memory(0, memory, 0, 8)  # offset and length must be 0
    with pytest.raises(nnapi.BadDataError):
        execution.set_input_from_memory(1, memory, 0, 0)  # not a described role
    with pytest.raises(nnapi.BadDataError):
        execution.set_output_from_memory(0, memory, 0, 0)  # only an input role
    with pytest.raises(nnapi.BadDataError):
        nnapi.Execution(other).set_input_from_memory(0, memory, 0, 0)  # another compilation
    with pytest.raises(nnapi.BadDataError):
        execution.set_input_from_memory(0, memory, 0, 0, OperandType(T.TENSOR_FLOAT32, [3]))
    execution.set_input_from_memory(0, memory, 0, 0, OperandType(T.TENSOR_FLOAT32, [2]))


def test_failed_execution_leaves_output_memory_uninitialized(register):
    faulty = register(FaultyDevice("faulty-mem-fail", fail_execute=True))
    compilation = compile_model(add_model(), [device(faulty.name)])
    memory = device_memory([(compilation, "output", 0), (compilation, "input", 0)])
    assert memory.device_name == faulty.name
    nnapi.Memory.copy(shared([1, 1]), memory)
    with pytest.raises(nnapi.OpFailedError):
        run_add(compilation, [1, 2], [3, 4], memory)
    with pytest.raises(nnapi.OpFailedError):
        run_add(compilation, memory, [1, 1])  # uninitialized again
    with pytest.raises(nnapi.BadDataError):
        read(memory)


def test_fallback_to_runtime_memory_when_the_device_cannot_allocate(register):
    faulty = register(FaultyDevice("faulty-mem-noalloc", fail_allocate=True))
    compilation = compile_model(add_model())
    assert compilation.device.name == faulty.name
    memory = device_memory([(compilation, "output", 0), (compilation, "input", 0)])
    assert faulty.allocate_count == 1 and memory.device_name is None  # the runtime holds it
    with pytest.raises(nnapi.OpFailedError):
        run_add(compilation, memory, [1, 1])
    run_add(compilation, [1, 2], [3, 4], memory)
    np.testing.assert_array_equal(run_add(compilation, memory, [1, 1]), [5, 7])
    np.testing.assert_array_equal(read(memory), [4, 6])
    # With explicit devices there is no fallback: the device's failure is the result.
    explicit = compile_model(add_model(), [device(faulty.name)])
    desc = nnapi.MemoryDesc()
    desc.add_input_role(explicit, 0)
    desc.finish()
    with pytest.raises(nnapi.OpFailedError):
        nnapi.Memory.from_desc(desc)


def test_roles_on_several_devices_with_explicit_devices_fail(register):
    faulty = register(FaultyDevice("faulty-mem-other"))
    on_faulty = compile_model(add_model(), [device(faulty.name)])
    on_reference = compile_model(add_model(), [device("nnapi-reference")])
    desc = nnapi.MemoryDesc()
    desc.add_output_role(on_faulty, 0)
    desc.add_input_role(on_reference, 0)
    desc.finish()
    with pytest.raises(nnapi.OpFailedError):  # no single device, and no fallback for explicit devices
        nnapi.Memory.from_desc(desc)
    assert faulty.allocate_count == 0


def partition_model():
    """d = x + x (output 0, also read by the MUL), y = d * x (output 1)."""
    model = nnapi.Model()
    tensor = OperandType(T.TENSOR_FLOAT32, [2])
    x = model.add_operand(tensor)
    act = model.add_operand(OperandType(T.INT32))
    model.set_operand_value(act, 0)
    d, y = model.add_operand(tensor), model.add_operand(tensor)
    model.add_operation(Op.ADD, [x, x, act], [d])
    model.add_operation(Op.MUL, [d, x, act], [y])
    model.identify_inputs_and_outputs([x], [d, y])
    model.finish()
    return model


def test_partitioned_plan_stages_device_memory_for_the_other_device(register):
    faulty = register(FaultyDevice("faulty-mem-add", supported={Op.ADD}))
    compilation = compile_model(partition_model())
    assert [step.device.name for step in compilation._plan.steps] == [faulty.name, "nnapi-reference"]
    doubled = device_memory([(compilation, "output", 0)])
    assert doubled.device_name == faulty.name  # the one step writing output 0
    x = np.array([1.5, -2], np.float32)
    execution = nnapi.Execution(compilation)
    execution.set_input(0, x)
    execution.set_output_from_memory(0, doubled, 0, 0)
    y = np.zeros(2, np.float32)
    execution.set_output(1, y)
    execution.compute()  # the reference's MUL reads d through copy_to staging
    np.testing.assert_array_equal(y, (x + x) * x)
    np.testing.assert_array_equal(read(doubled), x + x)
    # x is read by both steps' devices: no single device, so runtime memory
    assert device_memory([(compilation, "input", 0)]).device_name is None


def test_cpu_fallback_stages_device_memory(register):
    faulty = register(FaultyDevice("faulty-mem-exec", fail_execute=True))
    compilation = compile_model(add_model())
    assert compilation.device.name == faulty.name
    a = device_memory([(compilation, "input", 0)])
    out = device_memory([(compilation, "output", 0)])
    assert a.device_name == out.device_name == faulty.name
    nnapi.Memory.copy(shared([2, 3]), a)
    run_add(compilation, a, [10, 10], out)  # fails on the device, re-run on the CPU through staging
    assert compilation._plan.fallback_count == 1
    np.testing.assert_array_equal(read(out), [12, 13])


def test_device_memory_in_burst_and_fenced_executions():
    compilation = compile_model(add_model())
    memory = device_memory([(compilation, "output", 0), (compilation, "input", 0)])
    nnapi.Memory.copy(shared([1, 2]), memory)
    burst = nnapi.Burst(compilation)
    out = np.zeros(2, np.float32)
    execution = nnapi.Execution(compilation)
    execution.set_input_from_memory(0, memory, 0, 0)
    execution.set_input(1, np.array([1, 1], np.float32))
    execution.set_output(0, out)
    execution.burst_compute(burst)
    np.testing.assert_array_equal(out, [2, 3])
    fenced = nnapi.Execution(compilation)
    fenced.set_input(0, np.array([5, 5], np.float32))
    fenced.set_input(1, np.array([1, 2], np.float32))
    fenced.set_output_from_memory(0, memory, 0, 0)
    fenced.start_compute_with_dependencies([]).wait()
    np.testing.assert_array_equal(read(memory), [6, 7])


def test_model_constants_cannot_come_from_device_memory():
    compilation = compile_model(add_model())
    memory = device_memory([(compilation, "input", 0)])
    model = nnapi.Model()
    model.add_operand(OperandType(T.TENSOR_FLOAT32, [2]))
    with pytest.raises(nnapi.BadDataError):
        model.set_operand_value_from_memory(0, memory, 0, 8)
