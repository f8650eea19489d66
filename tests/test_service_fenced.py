"""Fenced executions through the driver service: with fences to wait for and memory that
crosses by descriptor, the service waits for the fences in a thread of its own and signals
a sync fence when done, while the connection goes on serving other calls."""

from __future__ import annotations

import os
import select
import time

import numpy as np
import pytest

pytest.importorskip("msgpack")

import nnapi  # noqa: E402
from helpers import add_model  # noqa: E402
from nnapi.hal import DataLocation, ErrorStatus, Request, RequestArgument  # noqa: E402
from nnapi.runtime.model_builder import build_hal_model  # noqa: E402
from test_service import remote, service  # noqa: E402,F401  (fixtures)


def _request(pools) -> Request:
    def argument(index):
        return RequestArgument(False, DataLocation(index, 0, 16), [4])

    return Request([argument(0), argument(1)], [argument(2)], pools)


def _signalled(fd: int, timeout_ms: int = 0) -> bool:
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(timeout_ms))


def _shared(values=None):
    memory = nnapi.Memory.create_shared(16)
    if values is not None:
        np.frombuffer(memory.buffer, np.float32)[:] = values
    return memory


@pytest.fixture
def prepared(remote):  # noqa: F811 (the fixtures of test_service)
    _, devices = remote("svcfence")
    device = devices["nnapi-reference@svcfence"]._hal
    return device.prepare_model(build_hal_model(add_model((4,)))[0])


def test_the_service_waits_for_the_fences_while_the_connection_serves(prepared):
    a, b, out = _shared([1, 2, 3, 4]), _shared([10, 20, 30, 40]), _shared()
    fence = os.eventfd(0, os.EFD_CLOEXEC)
    try:
        done, callback = prepared.execute_fenced(_request([a.buffer, b.buffer, out.buffer]), [fence])
        assert done is not None and not _signalled(done, 50)
        # the same connection runs a synchronous execution meanwhile
        x, y, z = np.float32([1, 1, 1, 1]), np.float32([2, 2, 2, 2]), np.zeros(4, np.float32)
        prepared.execute(_request([memoryview(x).cast("B"), memoryview(y).cast("B"), memoryview(z).cast("B")]))
        np.testing.assert_array_equal(z, [3, 3, 3, 3])
        assert not _signalled(done) and not np.frombuffer(out.buffer, np.float32).any()
        # a second fenced execution waits for the first one's fence
        out2 = _shared()
        done2, callback2 = prepared.execute_fenced(_request([out.buffer, b.buffer, out2.buffer]), [done])
        os.eventfd_write(fence, 1)
        assert _signalled(done2, 10_000) and _signalled(done)
        np.testing.assert_array_equal(np.frombuffer(out.buffer, np.float32), [11, 22, 33, 44])
        np.testing.assert_array_equal(np.frombuffer(out2.buffer, np.float32), [21, 42, 63, 84])
        assert callback.get_execution_info()[0] == ErrorStatus.NONE
        assert callback2.get_execution_info()[0] == ErrorStatus.NONE
        os.close(done)
        os.close(done2)
    finally:
        os.close(fence)


def test_a_fence_never_signalled_misses_the_deadline(prepared):
    a, b, out = _shared([1, 2, 3, 4]), _shared([1, 1, 1, 1]), _shared()
    fence = os.eventfd(0, os.EFD_CLOEXEC)
    try:
        start = time.monotonic()
        done, callback = prepared.execute_fenced(_request([a.buffer, b.buffer, out.buffer]), [fence],
                                                 deadline_ns=time.monotonic_ns() + 200_000_000)
        assert _signalled(done, 10_000) and time.monotonic() - start < 5
        assert callback.get_execution_info()[0] == ErrorStatus.MISSED_DEADLINE_TRANSIENT
        assert not np.frombuffer(out.buffer, np.float32).any()  # never ran
        os.close(done)
    finally:
        os.close(fence)


def test_plain_buffers_with_fences_are_waited_in_the_client(prepared):
    x, y, z = np.float32([1, 2, 3, 4]), np.float32([1, 1, 1, 1]), np.zeros(4, np.float32)
    fence = os.eventfd(1, os.EFD_CLOEXEC)  # already signalled
    try:
        done, callback = prepared.execute_fenced(
            _request([memoryview(x).cast("B"), memoryview(y).cast("B"), memoryview(z).cast("B")]), [fence])
        assert done is None  # run here, synchronously: the staged output had to be copied back
        np.testing.assert_array_equal(z, [2, 3, 4, 5])
        assert callback.get_execution_info()[0] == ErrorStatus.NONE
    finally:
        os.close(fence)
    with pytest.raises(nnapi.hal.HalError) as caught:
        prepared.execute_fenced(_request([_shared().buffer] * 3), [12345])
    assert caught.value.status == ErrorStatus.INVALID_ARGUMENT


def test_malformed_fenced_messages_get_errors(remote):  # noqa: F811 (the fixtures of test_service)
    import socket

    from nnapi.drivers.service import wire
    from nnapi.hal import serialize

    running, _ = remote("svcfencebad")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(20)
    s.connect(str(running.path))
    reader = wire.FrameReader(s)

    def ask(op, args, fds=()):
        wire.send_frame(s, wire.pack({"v": wire.PROTOCOL_VERSION, "id": 1, "op": op, "a": args}), list(fds))
        return wire.unpack(reader.read()[0])

    with s:
        assert ask("hello", {"v": wire.PROTOCOL_VERSION})["ok"]
        plain = serialize.model_to_plain(build_hal_model(add_model((4,)))[0])
        handle = ask("prepare", {"dev": 0, "model": plain})["r"]
        memory = _shared([1, 2, 3, 4])
        assert ask("map", {"pools": [[1, 0, True]]}, [memory._fd])["ok"]
        request = wire.pack([[[0, 1, 0, 16]] * 3, [[False, 0, 0, 16, [4]]] * 2, [[False, 2, 0, 16, [4]]]])
        fence, done = os.eventfd(1), os.eventfd(0)
        r, w = os.pipe()
        try:
            base = {"h": handle, "r": request, "w": [0], "done": 1}
            replies = [ask("execute_fenced", base, [fence, r]),  # done is a pipe
                       ask("execute_fenced", dict(base, w=[5]), [fence, done]),  # no such descriptor
                       ask("execute_fenced", dict(base, h=99), [fence, done]),
                       ask("fenced_info", {"f": 42})]
            good = ask("execute_fenced", base, [fence, done])
        finally:
            for fd in (fence, done, r, w):
                os.close(fd)
        assert all(not reply["ok"] and reply["status"] == int(ErrorStatus.INVALID_ARGUMENT) for reply in replies)
        assert "eventfd" in replies[0]["msg"] and "out of range" in replies[1]["msg"]
        assert "unknown prepared model" in replies[2]["msg"] and "unknown fenced execution" in replies[3]["msg"]
        assert good["ok"]
        for _ in range(200):  # the worker finishes; its report is there, without waiting
            info = ask("fenced_info", {"f": good["r"]})
            if info["ok"]:
                break
            time.sleep(0.01)
        assert info["ok"] and info["r"][0] == int(ErrorStatus.NONE)
        np.testing.assert_array_equal(np.frombuffer(memory.buffer, np.float32), [2, 4, 6, 8])


def test_a_fenced_execution_on_arrays_runs_in_the_client_and_is_reported(remote):  # noqa: F811
    """Arrays cannot cross by descriptor, so the client waits and executes itself: its report
    is an IFencedExecutionCallback the runtime accepts (checked_fenced), not a failure the
    runtime re-runs on the CPU."""
    _, devices = remote("svcarrays")
    compilation = nnapi.Compilation(add_model((4,)), [devices["nnapi-reference@svcarrays"]])
    compilation.finish()
    execution = nnapi.Execution(compilation)
    execution.set_input(0, np.float32([1, 2, 3, 4]))
    execution.set_input(1, np.float32([10, 20, 30, 40]))
    out = np.zeros(4, np.float32)
    execution.set_output(0, out)
    execution.start_compute_with_dependencies([]).wait()
    np.testing.assert_array_equal(out, [11, 22, 33, 44])
    assert compilation._plan.fallback_count == 0
