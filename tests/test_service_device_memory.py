"""Device memory through the driver service: a served device allocates it (IDevice.allocate
as a message), the runtime names it by token in requests, Memory.copy reaches it through
copy_to / copy_from messages, and no other client can name it."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("msgpack")

import nnapi  # noqa: E402
from nnapi import OperandCode as T  # noqa: E402
from nnapi import OperandType  # noqa: E402
from nnapi.drivers.service.client import connect_devices  # noqa: E402
from nnapi.hal import BufferDesc, BufferRole, ErrorStatus, HalError  # noqa: E402
from nnapi.runtime import manager  # noqa: E402
from test_device_memory import add_model, compile_model, device_memory, read, run_add, shared  # noqa: E402
from test_service import SNOOPER, Service  # noqa: E402


@pytest.fixture
def remote(tmp_path):
    """Start a service process hosting ``driver``; its devices are registered here."""
    started, registered = [], []

    def make(name: str, driver: str = "reference"):
        running = Service(tmp_path / f"{name}.sock", driver).start()
        started.append(running)
        for hal_device in connect_devices(str(running.path)):
            manager.register_device(hal_device)
            registered.append(hal_device.name)
        return running, {d.name: d for d in nnapi.get_devices()}

    yield make
    for name in registered:
        manager.unregister_device(name)
    for running in started:
        running.kill()


def test_served_device_allocates_and_runs_with_device_memory(remote):
    _, devices = remote("svcmem")
    far = devices["nnapi-reference@svcmem"]
    compilation = compile_model(add_model(), [far])
    memory = device_memory([(compilation, "output", 0), (compilation, "input", 0)])
    result = device_memory([(compilation, "output", 0)])
    assert memory.device_name == result.device_name == "nnapi-reference@svcmem"
    with pytest.raises(nnapi.OpFailedError):
        run_add(compilation, memory, [1, 1])  # never written
    with pytest.raises(nnapi.BadDataError):
        read(memory)
    nnapi.Memory.copy(shared([1, 2]), memory)           # copy_from message
    run_add(compilation, memory, [10, 20], result)      # tokens in the request, both ways
    np.testing.assert_array_equal(read(result), [11, 22])  # copy_to message
    nnapi.Memory.copy(result, memory)                   # device -> device through the runtime
    np.testing.assert_array_equal(run_add(compilation, memory, [1, 1]), [12, 23])
    burst = nnapi.Burst(compilation)
    execution = nnapi.Execution(compilation)
    execution.set_input_from_memory(0, memory, 0, 0)
    execution.set_input(1, np.array([0, 1], np.float32))
    execution.set_output_from_memory(0, result, 0, 0)
    execution.burst_compute(burst)
    np.testing.assert_array_equal(read(result), [11, 23])


def test_served_buffer_checks_travel_back(remote):
    _, devices = remote("svcmemhal")
    far = devices["nnapi-reference@svcmemhal"]
    compilation = compile_model(add_model(), [far])
    hal_device = far._hal
    prepared = compilation._plan.single
    with pytest.raises(HalError) as excinfo:
        hal_device.allocate(BufferDesc([]), [prepared], [BufferRole(0, 5)], [])
    assert excinfo.value.status == ErrorStatus.INVALID_ARGUMENT
    buffer, token = hal_device.allocate(BufferDesc([]), [prepared], [BufferRole(0, 0)], [])
    assert token > 0
    with pytest.raises(HalError) as excinfo:
        buffer.copy_to(bytearray(8))  # never written
    assert excinfo.value.status == ErrorStatus.GENERAL_FAILURE
    with pytest.raises(HalError) as excinfo:
        buffer.copy_from(bytearray(12), [])
    assert excinfo.value.status == ErrorStatus.INVALID_ARGUMENT
    buffer.copy_from(np.array([4, 5], np.float32).tobytes(), [2])
    out = bytearray(8)
    buffer.copy_to(out)
    np.testing.assert_array_equal(np.frombuffer(out, np.float32), [4, 5])


def test_another_client_cannot_reach_device_memory(remote):
    running, devices = remote("svcmemiso")
    far = devices["nnapi-reference@svcmemiso"]
    compilation = compile_model(add_model(), [far])
    memories = [device_memory([(compilation, "input", 0)]) for _ in range(3)]
    for memory in memories:
        nnapi.Memory.copy(shared([7, 7]), memory)
    result = subprocess.run([sys.executable, "-c", SNOOPER, str(running.path)], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"  # no buffer (copy_to, or a [1, token] pool) of ours is named
    np.testing.assert_array_equal(run_add(compilation, memories[2], [1, 1]), [8, 8])


def test_scalar_roles_and_type_mismatch_over_the_service(remote):
    _, devices = remote("svcmemtype")
    far = devices["nnapi-reference@svcmemtype"]
    compilation = compile_model(add_model(), [far])
    memory = device_memory([(compilation, "input", 0)])
    execution = nnapi.Execution(compilation)
    with pytest.raises(nnapi.BadDataError):
        execution.set_input_from_memory(0, memory, 0, 0, OperandType(T.TENSOR_FLOAT32, [3]))


def test_device_memory_never_reaches_another_device_of_the_service(remote):
    _, devices = remote("svcpair", "service_drivers:pair")
    first, second = devices["sample-a@svcpair"], devices["sample-b@svcpair"]
    on_first = compile_model(add_model(), [first])
    on_second = compile_model(add_model(), [second])
    memory = device_memory([(on_first, "input", 0)])
    assert memory.device_name == first.name
    nnapi.Memory.copy(shared([1, 2]), memory)
    # The service refuses a token in a request to another device of its own, whatever
    # number the other device's tokens have.
    request_to_second = on_second._plan.single
    from nnapi.hal import DataLocation, Request, RequestArgument

    def argument(pool):
        return RequestArgument(False, DataLocation(pool, 0, 8), [])

    request = Request([argument(0), argument(1)], [argument(2)],
                      [memory._hal_pool, np.ones(2, np.float32).tobytes(), bytearray(8)])
    device_memory([(on_second, "input", 0)])  # the second device has a buffer of the same token number
    with pytest.raises(HalError) as excinfo:
        request_to_second.execute(request)
    assert excinfo.value.status == ErrorStatus.INVALID_ARGUMENT
    assert "belongs to another device" in str(excinfo.value)
    for create in (request_to_second.create_reusable_execution,  # bound once: the same rule
                   request_to_second.configure_burst().create_reusable_execution):
        with pytest.raises(HalError) as excinfo:
            create(request).execute()
        assert excinfo.value.status == ErrorStatus.INVALID_ARGUMENT
        assert "belongs to another device" in str(excinfo.value)
    own = Request(request.inputs, request.outputs, [memory._hal_pool, np.ones(2, np.float32).tobytes(),
                                                    bytearray(8)])
    for create in (on_first._plan.single.create_reusable_execution,  # its own device takes it
                   on_first._plan.single.configure_burst().create_reusable_execution):
        create(own).execute()
        np.testing.assert_array_equal(np.frombuffer(own.pools[2], np.float32), [2, 3])
        own.pools[2][:] = bytes(8)
    with pytest.raises(HalError) as excinfo:  # allocate on one device for the other's prepared model
        first._hal.allocate(BufferDesc([]), [request_to_second], [BufferRole(0, 0)], [])
    assert excinfo.value.status == ErrorStatus.INVALID_ARGUMENT and "another device" in str(excinfo.value)
    np.testing.assert_array_equal(run_add(on_first, memory, [1, 1]), [2, 3])


def test_device_memory_of_an_unregistered_device_keeps_working_until_freed(tmp_path):
    """A device Memory holds its served device like a Compilation does: after
    manager.unregister_device it still copies in and out, and the driver service's
    connection goes only when the Memory goes too."""
    import gc
    import weakref

    running = Service(tmp_path / "svcgone.sock").start()
    try:
        (hal_device,) = connect_devices(str(running.path))
        manager.register_device(hal_device)
        name = hal_device.name
        compilation = compile_model(add_model(), [next(d for d in nnapi.get_devices() if d.name == name)])
        memory = device_memory([(compilation, "input", 0)])
        link_alive = weakref.ref(hal_device._link)
        del hal_device, compilation
        manager.unregister_device(name)
        gc.collect()
        assert link_alive() is not None
        nnapi.Memory.copy(shared([3, 4]), memory)
        np.testing.assert_array_equal(read(memory), [3, 4])
        del memory
        gc.collect()
        assert link_alive() is None
    finally:
        running.kill()
