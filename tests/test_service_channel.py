"""The driver service's shared-memory channel: executions go through it, the socket path
still works without it, a hostile client cannot break the service through it, and an
idle service does not spin."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

pytest.importorskip("msgpack")

import nnapi  # noqa: E402
from helpers import add_model  # noqa: E402
from nnapi.demo import build_demo_model, demo_expected, demo_input  # noqa: E402
from nnapi.drivers.service import channel as fast  # noqa: E402
from nnapi.drivers.service.client import connect_devices  # noqa: E402
from nnapi.runtime import manager  # noqa: E402
from test_service import _run_demo, remote, service  # noqa: E402,F401  (fixtures)


def test_executions_go_through_the_channel(remote):  # noqa: F811 (the fixtures of test_service)
    _, devices = remote("svcchan")
    device = devices["nnapi-reference@svcchan"]
    link = device._hal._link
    assert link._channel is not None
    compilation = nnapi.Compilation(build_demo_model(), [device])
    compilation.finish()
    before = link._channel_seq
    for _ in range(3):
        x, y = _run_demo(compilation)
        np.testing.assert_allclose(y, demo_expected(x), rtol=1e-5, atol=1e-6)
    assert link._channel_seq >= before + 3  # each computation: at least one message in the channel
    burst = nnapi.Burst(compilation)
    execution = nnapi.Execution(compilation)
    execution.set_reusable(True)
    x = demo_input(2)
    y = np.zeros((1, 4), np.float32)
    execution.set_input(0, x)
    execution.set_output(0, y)
    for step in range(3):
        x[:] = demo_input(step)
        execution.burst_compute(burst)
        np.testing.assert_allclose(y, demo_expected(x), rtol=1e-5, atol=1e-6)


def test_the_socket_alone_still_serves(service, monkeypatch):  # noqa: F811 (the fixtures of test_service)
    monkeypatch.setenv("NNAPI_SERVICE_CHANNEL", "0")
    running = service("svcsock")
    (device,) = connect_devices(str(running.path))
    manager.register_device(device)
    try:
        assert device._link._channel is None
        remote_device = next(d for d in nnapi.get_devices() if d.name == "nnapi-reference@svcsock")
        compilation = nnapi.Compilation(build_demo_model(), [remote_device])
        compilation.finish()
        x, y = _run_demo(compilation)
        np.testing.assert_allclose(y, demo_expected(x), rtol=1e-5, atol=1e-6)
    finally:
        manager.unregister_device("nnapi-reference@svcsock")


HOSTILE = textwrap.dedent('''
    import fcntl, mmap, os, socket, sys, time
    import msgpack
    from nnapi.drivers.service import channel as fast, wire
    V = wire.PROTOCOL_VERSION
    def conn():
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(20)
        s.connect(sys.argv[1])
        reader = wire.FrameReader(s)
        ask(s, reader, "hello", {"v": V})
        return s, reader
    def ask(s, reader, op, args, fds=()):
        wire.send_frame(s, wire.pack({"v": V, "id": 1, "op": op, "a": args}), list(fds))
        return wire.unpack(reader.read()[0])
    def brief(reply):
        return (reply.get("ok"), reply.get("status"), reply.get("msg", "")[:80])
    def memfd(size, seal=True):
        fd = os.memfd_create("x", os.MFD_ALLOW_SEALING)
        os.ftruncate(fd, size)
        if seal:
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK)
        return fd
    def bells():
        return os.eventfd(0, os.EFD_NONBLOCK), os.eventfd(0, os.EFD_NONBLOCK)
    def closed(s):
        try:
            return s.recv(1) == b""
        except (ConnectionResetError, TimeoutError):
            return True
    cap = fast.MIN_CAPACITY
    refused = []
    s, reader = conn()
    q, p = bells()
    refused.append(brief(ask(s, reader, "channel", {"cap": cap}, [memfd(fast.size_for(cap) + 1), q, p])))
    r, w = os.pipe()
    refused.append(brief(ask(s, reader, "channel", {"cap": cap}, [memfd(fast.size_for(cap)), r, p])))
    refused.append(brief(ask(s, reader, "channel", {"cap": cap}, [memfd(fast.size_for(cap), seal=False), q, p])))
    refused.append(brief(ask(s, reader, "channel", {"cap": cap}, [memfd(fast.size_for(cap))])))
    refused.append(brief(ask(s, reader, "channel", {"cap": 1 << 40}, [memfd(fast.size_for(cap)), q, p])))
    fd = memfd(fast.size_for(cap))
    ok = ask(s, reader, "channel", {"cap": cap}, [fd, q, p])
    refused.append(brief(ask(s, reader, "channel", {"cap": cap}, [memfd(fast.size_for(cap)), q, p])))
    mapping = mmap.mmap(fd, fast.size_for(cap))
    words = memoryview(mapping)[:fast.HEADER_BYTES].cast("Q")
    request = memoryview(mapping)[fast.HEADER_BYTES:fast.HEADER_BYTES + cap]
    reply = memoryview(mapping)[fast.HEADER_BYTES + cap:]
    def through(seq, payload, length=None):
        request[:len(payload)] = payload
        words[fast.REQUEST_LEN] = len(payload) if length is None else length
        words[fast.REQUEST_SEQ] = seq
        os.eventfd_write(q, 1)
        end = time.monotonic() + 20
        while words[fast.REPLY_SEQ] != seq and time.monotonic() < end:
            time.sleep(0.001)
        length = words[fast.REPLY_LEN]
        if length == fast.ON_SOCKET:
            return "socket", brief(wire.unpack(reader.read()[0]))
        return "channel", brief(wire.unpack(bytes(reply[:length])))
    answers = [
        through(1, b"\\xc1"),  # not msgpack
        through(2, msgpack.packb({"v": V, "id": 2, "op": "run", "a": {"x": 5}})),
        through(3, msgpack.packb({"v": V, "id": 3, "op": "\\x00" * 1500, "a": {}})),  # a long reply
        through(4, msgpack.packb({"v": V, "id": 4, "op": "hello", "a": {"v": V}})),
    ]
    answers[3] = answers[3][0], answers[3][1][:2]
    # a sequence number out of order closes the connection
    request[:1] = b"\\x80"
    words[fast.REQUEST_LEN] = 1
    words[fast.REQUEST_SEQ] = 9
    os.eventfd_write(q, 1)
    broken = [closed(s)]
    # a length beyond the slot, on a fresh connection
    s, reader = conn()
    q, p = bells()
    fd = memfd(fast.size_for(cap))
    assert ask(s, reader, "channel", {"cap": cap}, [fd, q, p])["ok"]
    mapping = mmap.mmap(fd, fast.size_for(cap))
    words = memoryview(mapping)[:fast.HEADER_BYTES].cast("Q")
    words[fast.REQUEST_LEN] = cap + 1
    words[fast.REQUEST_SEQ] = 1
    os.eventfd_write(q, 1)
    broken.append(closed(s))
    print(ok["ok"])
    print(refused)
    print(answers)
    print(broken)
''')


def test_hostile_channel_messages(remote):  # noqa: F811 (the fixtures of test_service)
    running, devices = remote("svcevil")
    device = devices["nnapi-reference@svcevil"]
    compilation = nnapi.Compilation(build_demo_model(), [device])
    compilation.finish()
    _run_demo(compilation)
    result = subprocess.run([sys.executable, "-c", HOSTILE, str(running.path)], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    ok, refused, answers, broken = (eval(line) for line in result.stdout.strip().splitlines())
    assert ok is True
    invalid = 4  # ErrorStatus.INVALID_ARGUMENT
    assert all(entry[:2] == (False, invalid) for entry in refused), refused
    assert "bytes, not" in refused[0][2]
    assert "eventfds" in refused[1][2]
    assert "sealed" in refused[2][2]
    assert "3 descriptors" in refused[3][2]
    assert "out of range" in refused[4][2]
    assert "already has a channel" in refused[5][2]
    assert answers[0] == ("channel", (False, invalid, answers[0][1][2])) and "malformed" in answers[0][1][2]
    assert answers[1][0] == "channel" and "unknown execution" in answers[1][1][2]
    assert answers[2][0] == "socket" and "unknown operation" in answers[2][1][2]  # too long for the slot
    assert answers[3] == ("channel", (True, None))
    assert broken == [True, True]
    # the service lives on and its other client never noticed
    assert running.process.poll() is None
    x, y = _run_demo(compilation)
    np.testing.assert_allclose(y, demo_expected(x), rtol=1e-5, atol=1e-6)


def _cpu_seconds(pid: int) -> float:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_an_idle_service_does_not_spin(remote):  # noqa: F811 (the fixtures of test_service)
    running, devices = remote("svcidle")
    device = devices["nnapi-reference@svcidle"]
    assert device._hal._link._channel is not None and fast.spin_ns() > 0 or not fast._SPIN_OK
    compilation = nnapi.Compilation(build_demo_model(), [device])
    compilation.finish()
    _run_demo(compilation)
    time.sleep(0.2)
    before = _cpu_seconds(running.process.pid)
    time.sleep(1.0)
    assert _cpu_seconds(running.process.pid) - before < 0.1  # asleep, not spinning
    x, y = _run_demo(compilation)  # and it wakes up for the next message
    np.testing.assert_allclose(y, demo_expected(x), rtol=1e-5, atol=1e-6)


def _mapped_memories(pid: int) -> int:
    return sum("nnapi-memory" in line for line in open(f"/proc/{pid}/maps"))


def test_the_service_lets_go_of_freed_memories(remote):  # noqa: F811 (the fixtures of test_service)
    running, devices = remote("svcfree")
    device = devices["nnapi-reference@svcfree"]
    compilation = nnapi.Compilation(add_model((4,)), [device])
    compilation.finish()
    baseline = _mapped_memories(running.process.pid)
    for round_ in range(40):
        a, b, out = (nnapi.Memory.create_shared(16) for _ in range(3))
        np.frombuffer(a.buffer, np.float32)[:] = round_
        np.frombuffer(b.buffer, np.float32)[:] = [1, 2, 3, 4]
        execution = nnapi.Execution(compilation)
        execution.set_input_from_memory(0, a, 0, 16)
        execution.set_input_from_memory(1, b, 0, 16)
        execution.set_output_from_memory(0, out, 0, 16)
        execution.compute()
        np.testing.assert_array_equal(np.frombuffer(out.buffer, np.float32), np.float32([1, 2, 3, 4]) + round_)
        a.free()  # freed explicitly; the others when they are collected
        del execution, a, b, out
    x, y = _run_demo(_finished(device))  # one more call: the service is told to let go
    np.testing.assert_allclose(y, demo_expected(x), rtol=1e-5, atol=1e-6)
    assert _mapped_memories(running.process.pid) - baseline <= 3  # 120 memories were mapped there


def _finished(device):
    compilation = nnapi.Compilation(build_demo_model(), [device])
    compilation.finish()
    return compilation
