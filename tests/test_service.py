"""The driver service: a driver in another process, reached over a Unix socket.

Every test starts a real service process (``python -m nnapi.drivers.service``) and uses
its devices through the public API, or attacks its socket from another process."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("msgpack")

import nnapi  # noqa: E402
from nnapi.codes import ResultCode  # noqa: E402
from nnapi.demo import build_demo_model, demo_expected, demo_input  # noqa: E402
from nnapi.drivers.service import wire  # noqa: E402
from nnapi.drivers.service.client import connect_devices  # noqa: E402
from nnapi.hal import ErrorStatus  # noqa: E402
from nnapi.runtime import manager  # noqa: E402

TESTS = Path(__file__).parent


class Service:
    """A service process on ``path`` hosting ``driver``."""

    def __init__(self, path: Path, driver: str = "reference") -> None:
        self.path, self.driver = path, driver
        self.process: subprocess.Popen | None = None

    def start(self) -> Service:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]))
        self.process = subprocess.Popen([sys.executable, "-m", "nnapi.drivers.service", "--driver", self.driver,
                                         "--socket", str(self.path)], stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, text=True, env=env)
        line = self.process.stdout.readline()
        assert line.startswith("serving"), line + self.process.stderr.read()
        return self

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(10)


@pytest.fixture
def service(tmp_path):
    started = []

    def start(name: str = "svc", driver: str = "reference") -> Service:
        running = Service(tmp_path / f"{name}.sock", driver).start()
        started.append(running)
        return running

    yield start
    for running in started:
        running.kill()


@pytest.fixture
def remote(service):
    """Start a service, register its devices here; yields (service, devices by name)."""
    registered = []

    def make(name: str, driver: str = "reference"):
        running = service(name, driver)
        devices = connect_devices(str(running.path))
        for device in devices:
            manager.register_device(device)
            registered.append(device.name)
        return running, {d.name: d for d in nnapi.get_devices()}

    yield make
    for name in registered:
        manager.unregister_device(name)


def _run_demo(compilation, x=None):
    x = demo_input(1) if x is None else x
    execution = nnapi.Execution(compilation)
    execution.set_input(0, x)
    y = np.zeros((1, 4), np.float32)
    execution.set_output(0, y)
    execution.compute()
    return x, y


def test_remote_capabilities_carry_the_step_cost(remote):
    """Capabilities.step_cost_s (what the partitioner weighs a plan step by) crosses the
    service like the rest of the capabilities."""
    from service_drivers import stepped

    _, devices = remote("svcstep", "service_drivers:stepped")
    far = devices["stepped@svcstep"]
    assert far.capabilities == stepped().get_capabilities()
    assert far._hal.get_capabilities().step_cost_s == 3.5e-5


def test_remote_device_looks_like_the_local_one(remote):
    _, devices = remote("svcinfo")
    local, far = devices["nnapi-reference"], devices["nnapi-reference@svcinfo"]
    assert (far.type, far.version, far.feature_level) == (local.type, local.version, local.feature_level)
    assert far.capabilities == local.capabilities
    compilation = nnapi.Compilation(build_demo_model(), [far])
    compilation.finish()
    x, y = _run_demo(compilation)
    np.testing.assert_allclose(y, demo_expected(x), rtol=1e-5, atol=1e-6)
    # shared memory goes by descriptor (mapped once in the service), outputs land in it
    memory_in = nnapi.Memory.create_shared(x.nbytes)
    memory_out = nnapi.Memory.create_shared(16)
    np.frombuffer(memory_in.buffer, np.float32)[:] = x.reshape(-1)
    for _ in range(2):
        execution = nnapi.Execution(compilation)
        execution.set_input_from_memory(0, memory_in, 0, x.nbytes)
        execution.set_output_from_memory(0, memory_out, 0, 16)
        execution.set_measure_timing(True)
        execution.compute()
        np.testing.assert_allclose(np.frombuffer(memory_out.buffer, np.float32), demo_expected(x).reshape(-1),
                                   rtol=1e-5, atol=1e-6)
    # burst and asynchronous execution
    burst = nnapi.Burst(compilation)
    for seed in range(3):
        x = demo_input(seed)
        execution = nnapi.Execution(compilation)
        execution.set_input(0, x)
        y = np.zeros((1, 4), np.float32)
        execution.set_output(0, y)
        execution.burst_compute(burst)
        np.testing.assert_allclose(y, demo_expected(x), rtol=1e-5, atol=1e-6)
    execution = nnapi.Execution(compilation)
    execution.set_input(0, x)
    y = np.zeros((1, 4), np.float32)
    execution.set_output(0, y)
    execution.start_compute().wait()
    np.testing.assert_allclose(y, demo_expected(x), rtol=1e-5, atol=1e-6)


def test_cts_subset_through_the_remote_device(remote):
    from nnapi.conformance import is_supported, run_conformance, select_records

    _, devices = remote("svccts")
    records = [r for r in select_records() if is_supported(r)][::15]
    report = run_conformance(devices["nnapi-reference@svccts"], records=records)
    assert report.passed == len(records), [(o.test, o.message) for o in report.failures[:5]]


def test_conformance_cli_with_the_service_in_the_environment(service):
    running = service("svccli")
    env = dict(os.environ, NNAPI_REMOTE_DEVICES=str(running.path))
    result = subprocess.run([sys.executable, "-m", "nnapi", "conformance", "--quiet", "--ops", "ADD,RELU",
                             "--device", "nnapi-reference@svccli"], capture_output=True, text=True, env=env,
                            timeout=600)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert " 0 failed" in result.stdout


def test_conformance_against_a_dead_service_reports_failures_not_declined(remote):
    """A dead remote device supports no operation (so compilations fall back to the CPU),
    but a vendor's conformance run must not read its crash as operations declined."""
    from nnapi.conformance import is_supported, run_conformance, select_records

    running, devices = remote("svcdead")
    device = devices["nnapi-reference@svcdead"]
    records = [r for r in select_records(operations=["ADD"]) if is_supported(r)][:4]
    assert run_conformance(device, records=records).passed == len(records)
    running.kill()
    report = run_conformance(device, records=records)
    assert report.failed == len(records) and report.declined == 0 and report.passed == 0
    assert all("DEAD_OBJECT" in o.message or "not running" in o.message for o in report.failures), \
        [o.message for o in report.failures]


def test_service_killed_mid_run_then_restarted(remote):
    running, devices = remote("svcslow", "service_drivers:slow")
    device = devices["slow@svcslow"]
    compilation = nnapi.Compilation(build_demo_model(), [device])
    compilation.finish()
    failure = []

    def run() -> None:
        try:
            _run_demo(compilation)
        except nnapi.NnapiError as error:
            failure.append(error)

    thread = threading.Thread(target=run)
    thread.start()
    time.sleep(0.5)
    running.kill()
    thread.join(30)
    assert failure and failure[0].code == ResultCode.DEAD_OBJECT, failure
    assert device._hal.is_dead
    # a compilation that names no device falls back to the CPU
    fallback = nnapi.Compilation(build_demo_model())
    fallback.finish()
    x, y = _run_demo(fallback)
    np.testing.assert_allclose(y, demo_expected(x), rtol=1e-5, atol=1e-6)
    with pytest.raises(nnapi.NnapiError) as caught:
        _run_demo(compilation)
    assert caught.value.code == ResultCode.DEAD_OBJECT
    # the service comes back: the device works again (models prepared before are gone)
    running.start()
    time.sleep(0.3)
    assert not device._hal.is_dead
    with pytest.raises(nnapi.NnapiError) as caught:
        _run_demo(compilation)
    assert caught.value.code == ResultCode.DEAD_OBJECT
    again = nnapi.Compilation(build_demo_model(), [device])
    again.finish()
    execution = nnapi.Execution(again)
    x = demo_input(3)
    execution.set_input(0, x)
    y = np.zeros((1, 4), np.float32)
    execution.set_output(0, y)
    execution.set_timeout(50_000_000)  # the deadline crosses the boundary: the slow driver misses it
    with pytest.raises(nnapi.NnapiError) as caught:
        execution.compute()
    assert caught.value.code in (ResultCode.MISSED_DEADLINE_TRANSIENT, ResultCode.MISSED_DEADLINE_PERSISTENT)


def test_hung_service_gives_dead_object(remote, monkeypatch):
    running, devices = remote("svchang")
    device = devices["nnapi-reference@svchang"]
    compilation = nnapi.Compilation(build_demo_model(), [device])
    compilation.finish()
    device._hal._link.timeout_s = 1.0
    os.kill(running.process.pid, signal.SIGSTOP)
    stat = Path(f"/proc/{running.process.pid}/stat")
    for _ in range(500):  # until the kernel has really stopped it
        if stat.read_text().rsplit(")", 1)[1].split()[0] == "T":
            break
        time.sleep(0.01)
    try:
        start = time.monotonic()
        with pytest.raises(nnapi.NnapiError) as caught:
            _run_demo(compilation)
        assert caught.value.code == ResultCode.DEAD_OBJECT and time.monotonic() - start < 10
    finally:
        os.kill(running.process.pid, signal.SIGCONT)


def _timed_failure(compute) -> tuple[int, float]:
    start = time.monotonic()
    with pytest.raises(nnapi.NnapiError) as caught:
        compute()
    return caught.value.code, time.monotonic() - start


def test_loop_timeout_and_deadline_hold_across_the_boundary(remote):
    from test_control_flow import infinite_loop_model

    _, devices = remote("svcloop")
    compilation = nnapi.Compilation(infinite_loop_model(), [devices["nnapi-reference@svcloop"]])
    compilation.finish()

    def execution(loop_timeout_ns=None, timeout_ns=None) -> nnapi.Execution:
        made = nnapi.Execution(compilation)
        made.set_input(0, np.array([7], np.int32))
        made.set_output(0, np.zeros(1, np.int32))
        if loop_timeout_ns is not None:
            made.set_loop_timeout(loop_timeout_ns)
        if timeout_ns is not None:
            made.set_timeout(timeout_ns)
        return made

    # The loop timeout reaches the served driver: 50 ms, not the 2 s default. A WHILE loop
    # that times out is MISSED_DEADLINE_TRANSIENT (as Android's CPU executor reports it).
    code, elapsed = _timed_failure(execution(loop_timeout_ns=50_000_000).compute)
    assert code == ResultCode.MISSED_DEADLINE_TRANSIENT and elapsed < 1.5, (code, elapsed)
    burst = nnapi.Burst(compilation)
    code, elapsed = _timed_failure(lambda: execution(loop_timeout_ns=50_000_000).burst_compute(burst))
    assert code == ResultCode.MISSED_DEADLINE_TRANSIENT and elapsed < 1.5, (code, elapsed)
    code, elapsed = _timed_failure(lambda: execution(loop_timeout_ns=50_000_000).start_compute().wait())
    assert code == ResultCode.MISSED_DEADLINE_TRANSIENT and elapsed < 1.5, (code, elapsed)
    # The execution's deadline (set_timeout) crosses too, inside the loop's 2 s default.
    code, elapsed = _timed_failure(execution(timeout_ns=100_000_000).compute)
    assert code in (ResultCode.MISSED_DEADLINE_TRANSIENT, ResultCode.MISSED_DEADLINE_PERSISTENT)
    assert elapsed < 1.5, elapsed
    # The service is fine afterwards: the default loop timeout (2 s) still ends the loop.
    code, elapsed = _timed_failure(execution().compute)
    assert code == ResultCode.MISSED_DEADLINE_TRANSIENT and 1.9 < elapsed < 30, (code, elapsed)


ATTACKER = textwrap.dedent('''
    import os, socket, struct, sys, tempfile
    import msgpack
    from nnapi.drivers.service.wire import PROTOCOL_VERSION as V
    path = sys.argv[1]
    def conn():
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(20)
        s.connect(path)
        return s
    def frame(payload, nfds=0, magic=b"NNS1", length=None):
        return struct.pack("<4sII", magic, len(payload) if length is None else length, nfds) + payload
    def ask(s, message, fds=()):
        data = frame(msgpack.packb(message), len(fds))
        if fds:
            socket.send_fds(s, [data], list(fds))
        else:
            s.sendall(data)
        header = b""
        while len(header) < 12:
            chunk = s.recv(12 - len(header))
            if not chunk:
                return None
            header += chunk
        _, length, _ = struct.unpack("<4sII", header)
        body = b""
        while len(body) < length:
            body += s.recv(length - len(body))
        return msgpack.unpackb(body, strict_map_key=False)
    def closed(s):
        try:
            return s.recv(1) == b""
        except (ConnectionResetError, TimeoutError):
            return True
    from nnapi.demo import build_demo_model
    from nnapi.hal import serialize
    from nnapi.runtime.model_builder import build_hal_model
    bad_model = serialize.model_to_plain(build_hal_model(build_demo_model())[0])
    bad_model["main"]["operations"][0][1][0] = 99  # an operand that does not exist
    bad_model["pools"] = []
    results = []
    for raw in (b"GET / HTTP/1.0\\r\\n\\r\\n", frame(b"", length=1 << 30), frame(b"\\x93\\x01", length=100),
                frame(b"", 200)):
        s = conn(); s.sendall(raw)
        if raw.startswith(b"NNS1") and b"\\x93" in raw:
            s.shutdown(socket.SHUT_WR)  # truncated frame, then end of stream
        results.append(closed(s)); s.close()
    s = conn()
    replies = [
        ask(s, [1, 2, 3]),
        ask(s, {"v": V, "id": 1, "op": "execute", "a": {"h": 1}}),
        ask(s, {"v": 7, "id": 2, "op": "hello", "a": {"v": 7}}),
        ask(s, {"v": V, "id": 3, "op": "hello", "a": {"v": V}}),
        ask(s, {"v": V, "id": 4, "op": "no_such_op", "a": {}}),
        ask(s, {"v": V, "id": 5, "op": "execute", "a": {"h": 1, "r": msgpack.packb([[[0, 1, 0, 16]], [], []])}}),
        ask(s, {"v": V, "id": 6, "op": "prepare", "a": {"dev": 0, "model": {"main": [[[1e300, "x"]], [], [], []]}}}),
        ask(s, {"v": V, "id": 7, "op": "prepare", "a": {"dev": 9, "model": {}}}),
        ask(s, {"v": V, "id": 8, "op": "copy_to", "a": {"buf": 1, "pool": [0, 1, 0, 4]}}),
        ask(s, {"v": V, "id": 9, "op": "supported", "a": {"dev": 0, "model": bad_model}}),
    ]
    r, w = os.pipe()
    replies.append(ask(s, {"v": V, "id": 10, "op": "map", "a": {"pools": [[1, 0, True]]}}, [r]))
    with tempfile.TemporaryFile() as plain:
        plain.truncate(4096)
        replies.append(ask(s, {"v": V, "id": 11, "op": "map", "a": {"pools": [[2, 0, True]]}}, [plain.fileno()]))
    replies.append(ask(s, {"v": V, "id": 12, "op": "map", "a": {"pools": [[3, 5, True]]}}))
    replies.append(ask(s, {"v": V, "id": 13, "op": "run", "a": {"x": "1"}}))
    replies.append(ask(s, {"v": V, "id": 14, "op": "run", "a": {"x": 77}}))
    replies.append(ask(s, {"v": V, "id": 15, "op": "bind", "a": {"h": 1, "r": b"garbage"}}))
    replies.append(ask(s, {"v": V, "id": 16, "op": "bind", "a": {"b": [1], "r": b""}}))
    replies.append(ask(s, {"v": V, "id": 17, "op": "prepare_cache", "a": {"dev": 0, "mc": [0], "dc": [0],
                                                                           "token": bytes(32)}}, [r]))
    print(results)
    print([None if r is None else (r.get("ok"), r.get("status"), r.get("msg", "")[:80]) for r in replies])
''')


def test_malformed_messages_from_another_process(remote):
    running, devices = remote("svcbad")
    device = devices["nnapi-reference@svcbad"]
    compilation = nnapi.Compilation(build_demo_model(), [device])
    compilation.finish()
    _run_demo(compilation)  # a well-behaved client, connected throughout
    result = subprocess.run([sys.executable, "-c", ATTACKER, str(running.path)], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    closed_line, replies_line = result.stdout.strip().splitlines()
    assert closed_line == "[True, True, True, True]"  # bad magic, oversized, truncated, missing fds: closed
    replies = eval(replies_line)  # our own subprocess's repr of plain tuples
    invalid = int(ErrorStatus.INVALID_ARGUMENT)
    assert replies[0] == (False, invalid, "a message must be a map")
    assert replies[1][:2] == (False, invalid) and "before hello" in replies[1][2]
    assert replies[2][:2] == (False, invalid) and "version" in replies[2][2]
    assert replies[3][0] is True
    assert replies[4][:2] == (False, invalid) and "unknown operation" in replies[4][2]
    for reply in replies[5:]:
        assert reply[:2] == (False, invalid), reply  # INVALID_ARGUMENT, the connection kept
    assert "unknown prepared model" in replies[5][2] or "unknown pool" in replies[5][2]
    assert "out of range" in replies[7][2]
    assert "unknown device memory" in replies[8][2]
    assert "out of range" in replies[9][2] or "does not exist" in replies[9][2], replies[9]
    assert "memfd" in replies[10][2] and "sealed" in replies[11][2]
    assert "no descriptors" in replies[12][2]
    assert "expected an integer" in replies[13][2] and "unknown execution" in replies[14][2]
    assert "unknown prepared model" in replies[15][2] and "expected an integer" in replies[16][2]
    assert "regular file" in replies[17][2]
    # the service is alive and the other client never noticed
    assert running.process.poll() is None
    x, y = _run_demo(compilation)
    np.testing.assert_allclose(y, demo_expected(x), rtol=1e-5, atol=1e-6)


SNOOPER = textwrap.dedent('''
    import socket, sys
    import msgpack
    from nnapi.drivers.service import wire
    from nnapi.hal import serialize
    from nnapi.runtime.model_builder import build_hal_model
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(sys.argv[1])
    reader = wire.FrameReader(s)
    def ask(op, args):
        wire.send_frame(s, wire.pack({"v": wire.PROTOCOL_VERSION, "id": 1, "op": op, "a": args}))
        return wire.unpack(reader.read()[0])
    ask("hello", {"v": wire.PROTOCOL_VERSION})
    # a model of our own, so that probes reach the pool and device memory tables
    import numpy as np, nnapi
    add = nnapi.Model()
    tensor = nnapi.OperandType(nnapi.OperandCode.TENSOR_FLOAT32, [1, 4])
    x, y = add.add_operand(tensor), add.add_operand(tensor)
    fuse = add.add_operand(nnapi.OperandType(nnapi.OperandCode.INT32))
    add.set_operand_value(fuse, np.int32(0))
    add.add_operation(nnapi.OperationCode.ADD, [x, x, fuse], [y])
    add.identify_inputs_and_outputs([x], [y])
    add.finish()
    model = serialize.model_to_plain(build_hal_model(add)[0], lambda pool: None)
    own = ask("prepare", {"dev": 0, "model": model})["r"]
    argument = [[False, 0, 0, 16, []]]
    found = []
    for handle in range(1, 40):
        probes = [("copy_to", {"buf": handle, "pool": [0, handle, 0, 1]}),
                  ("execute", {"h": own, "r": msgpack.packb([[[0, handle, 0, 16]], argument, argument])}),
                  ("execute", {"h": own, "r": msgpack.packb([[[1, handle]], argument, argument])})]
        if handle != own:
            probes += [("execute", {"h": handle, "r": msgpack.packb([[], [], []])}), ("burst", {"h": handle}),
                       ("bind", {"b": handle, "r": msgpack.packb([[], [], []])}),
                       ("bind", {"h": handle, "r": msgpack.packb([[], [], []])})]
        probes.append(("run", {"x": handle}))
        for op, args in probes:
            reply = ask(op, args)
            if reply.get("ok") or "unknown" not in reply.get("msg", ""):
                found.append((op, handle, reply))
    print(found)
''')


def test_a_client_cannot_reach_another_clients_memory(remote):
    running, devices = remote("svciso")
    device = devices["nnapi-reference@svciso"]
    compilation = nnapi.Compilation(build_demo_model(), [device])
    compilation.finish()
    secret = nnapi.Memory.create_shared(4096)
    np.frombuffer(secret.buffer, np.uint8)[:] = 0x5A
    x = demo_input(2)
    np.frombuffer(secret.buffer, np.float32)[: x.size] = x.reshape(-1)
    execution = nnapi.Execution(compilation)
    execution.set_input_from_memory(0, secret, 0, x.nbytes)
    execution.set_output(0, np.zeros((1, 4), np.float32))
    execution.compute()
    burst = nnapi.Burst(compilation)
    bound = nnapi.Execution(compilation)  # a request bound in the service, named by number
    bound.set_reusable(True)
    bound.set_input_from_memory(0, secret, 0, x.nbytes)
    bound.set_output(0, np.zeros((1, 4), np.float32))
    bound.burst_compute(burst)
    bound.compute()
    result = subprocess.run([sys.executable, "-c", SNOOPER, str(running.path)], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"  # every handle of the other client is unknown to this one


def test_reusable_execution_is_bound_once_in_the_service(remote):
    running, devices = remote("svcbound")
    device = devices["nnapi-reference@svcbound"]
    compilation = nnapi.Compilation(build_demo_model(), [device])
    compilation.finish()
    link = device._hal._link
    ops = []
    call = link.call

    def counting(op, *args, **kwargs):
        ops.append(op)
        return call(op, *args, **kwargs)

    link.call = counting
    x = demo_input(0).copy()
    y = np.zeros((1, 4), np.float32)
    for use_burst in (True, False):
        burst = nnapi.Burst(compilation) if use_burst else None
        execution = nnapi.Execution(compilation)
        execution.set_reusable(True)
        execution.set_input(0, x)
        execution.set_output(0, y)
        ops.clear()
        for seed in range(4):
            x[...] = demo_input(seed)  # the same buffer, new values: staged again before each run
            y[...] = 0
            execution.burst_compute(burst) if use_burst else execution.compute()
            np.testing.assert_allclose(y, demo_expected(x), rtol=1e-5, atol=1e-6)
        # the request crossed once; each computation after it is one small "run" message
        assert [op for op in ops if op not in ("map", "forget", "release")] == ["bind"] + ["run"] * 4, ops
    link.call = call
    running.kill()
    with pytest.raises(nnapi.NnapiError) as caught:
        execution.compute()
    assert caught.value.code == ResultCode.DEAD_OBJECT


def test_reply_rules_of_the_model_are_made_once_at_preparation(remote, monkeypatch):
    """What an execution's reply is checked against and depends only on the prepared model
    (its outputs' element sizes, static shapes) is made when the model is prepared: an
    execution, plain, in a burst or reusable, adds only its request's part."""
    from nnapi.drivers.service import client

    _, devices = remote("svcrules")
    compilation = nnapi.Compilation(build_demo_model(), [devices["nnapi-reference@svcrules"]])
    compilation.finish()
    looked_up = []
    element_size = client._element_size
    monkeypatch.setattr(client, "_element_size",
                        lambda model, position: looked_up.append(position) or element_size(model, position))
    burst = nnapi.Burst(compilation)
    for seed in range(3):
        x, y = _run_demo(compilation, demo_input(seed))
        np.testing.assert_allclose(y, demo_expected(x), rtol=1e-5, atol=1e-6)
        execution = nnapi.Execution(compilation)
        execution.set_input(0, x)
        execution.set_output(0, y)
        execution.burst_compute(burst)
        np.testing.assert_allclose(y, demo_expected(x), rtol=1e-5, atol=1e-6)
    reusable = nnapi.Execution(compilation)
    reusable.set_reusable(True)
    reusable.set_input(0, x)
    reusable.set_output(0, y)
    reusable.compute()
    assert looked_up == []
    # the rules still hold: a reply whose shape disagrees with the model's output is refused
    link = devices["nnapi-reference@svcrules"]._hal._link
    call = link.call

    def wrong_shape(op, args, fds=(), deadline_ns=None, generation=None, decode=None):
        if op == "execute":  # the service's reply, its shape changed before the client reads it
            check = decode
            decode = lambda value: check([[[[1, 3], True]], value[1]])  # noqa: E731
        return call(op, args, fds, deadline_ns, generation, decode)

    monkeypatch.setattr(link, "call", wrong_shape)
    with pytest.raises(nnapi.NnapiError) as caught:
        _run_demo(compilation)
    assert caught.value.code == ResultCode.OP_FAILED
    assert "output 0: shape [1, 3] does not match [1, 4]" in str(caught.value)


def _still_open(opened: dict[int, tuple[int, int]]) -> list[int]:
    """Which of ``opened`` (fd -> its file's (device, inode) then) are still that file."""
    still = []
    for fd, identity in opened.items():
        try:
            info = os.fstat(fd)
        except OSError:
            continue
        if (info.st_dev, info.st_ino) == identity:
            still.append(fd)
    return sorted(still)


def test_an_unregistered_device_is_freed_with_its_last_user(service):
    """manager.unregister_device leaves the runtime no reference to the device: the driver
    service's connection -- its socket, the shared-memory channel's doorbells, the staging
    arenas -- is closed once no Compilation uses it, and one that still does keeps working
    (as Android's compilations hold their device)."""
    import gc
    import weakref

    running = service("svcfree")
    (device,) = connect_devices(str(running.path))
    manager.register_device(device)
    name = device.name
    compilation = nnapi.Compilation(build_demo_model(), [next(d for d in nnapi.get_devices() if d.name == name)])
    compilation.finish()
    _run_demo(compilation)  # plain buffers: staged in an arena the link keeps for the next run
    link = device._link
    fds = [link._sock.fileno(), link._channel.to_peer, link._channel.from_peer, *(a.fd for a in link._arenas)]
    assert len(fds) >= 4, fds
    opened = {fd: (os.fstat(fd).st_dev, os.fstat(fd).st_ino) for fd in fds}
    link_alive = weakref.ref(link)
    del device, link
    manager.unregister_device(name)
    assert name not in [d.name for d in nnapi.get_devices()]
    gc.collect()
    assert link_alive() is not None and _still_open(opened) == sorted(opened)  # the compilation uses it
    x, y = _run_demo(compilation, demo_input(4))
    np.testing.assert_allclose(y, demo_expected(x), rtol=1e-5, atol=1e-6)
    del compilation
    gc.collect()
    assert link_alive() is None
    assert _still_open(opened) == []


def test_a_shared_memory_outliving_the_unregistered_device_does_not_keep_its_connection(service):
    """A shared Memory the link has mapped for the service outlives every Compilation of
    the unregistered device: its release callback must not hold the link (the driver
    service's socket, doorbells and arenas), which goes with the compilation; the Memory
    is freed later without error."""
    import gc
    import weakref

    running = service("svcmapped")
    (device,) = connect_devices(str(running.path))
    manager.register_device(device)
    name = device.name
    compilation = nnapi.Compilation(build_demo_model(), [next(d for d in nnapi.get_devices() if d.name == name)])
    compilation.finish()
    size = demo_input(0).nbytes
    shared_in, shared_out = nnapi.Memory.create_shared(size), nnapi.Memory.create_shared(16)
    np.frombuffer(shared_in.buffer, np.float32)[...] = demo_input(2).ravel()
    execution = nnapi.Execution(compilation)
    execution.set_input_from_memory(0, shared_in, 0, size)
    execution.set_output_from_memory(0, shared_out, 0, 16)
    execution.compute()
    np.testing.assert_allclose(np.frombuffer(shared_out.buffer, np.float32).reshape(1, 4),
                               demo_expected(demo_input(2)), rtol=1e-5, atol=1e-6)
    link = device._link
    assert link._fd_pools, "the link maps the shared memories it sends"
    link_alive = weakref.ref(link)
    del device, link, execution, compilation
    manager.unregister_device(name)
    gc.collect()
    assert link_alive() is None
    del shared_in, shared_out
    gc.collect()


def test_tensors_in_shared_memory_cross_without_copies(remote):
    _, devices = remote("svccopy")
    device = devices["nnapi-reference@svccopy"]
    link = device._hal._link
    compilation = nnapi.Compilation(build_demo_model(), [device])
    compilation.finish()
    shape = demo_input(0).shape
    size = demo_input(0).nbytes
    shared_in, shared_out = nnapi.Memory.create_shared(size), nnapi.Memory.create_shared(16)
    x_shared = np.frombuffer(shared_in.buffer, np.float32).reshape(shape)
    y_shared = np.frombuffer(shared_out.buffer, np.float32).reshape(1, 4)
    x_plain, y_plain = np.zeros(shape, np.float32), np.zeros((1, 4), np.float32)
    for reusable in (False, True):
        for shared in (True, False):
            burst = nnapi.Burst(compilation)
            execution = nnapi.Execution(compilation)
            execution.set_reusable(reusable)
            if shared:
                execution.set_input_from_memory(0, shared_in, 0, size)
                execution.set_output_from_memory(0, shared_out, 0, 16)
            else:
                execution.set_input(0, x_plain)
                execution.set_output(0, y_plain)
            x, y = (x_shared, y_shared) if shared else (x_plain, y_plain)
            for seed in range(3 if reusable else 1):
                x[...] = demo_input(seed)
                before = link.staged_bytes
                execution.burst_compute(burst)
                np.testing.assert_allclose(y, demo_expected(x), rtol=1e-5, atol=1e-6)
                # by descriptor: no byte copied; plain buffers: staged in and out once each
                assert link.staged_bytes - before == (0 if shared else size + 16), (reusable, shared, seed)


def test_compilation_cache_through_the_service(remote, tmp_path):
    running, devices = remote("svccache")
    device = devices["nnapi-reference@svccache"]
    token = bytes(range(32))
    outputs = []
    for expected_from_cache in (0, 1):
        compilation = nnapi.Compilation(build_demo_model(), [device])
        compilation.set_caching(str(tmp_path), token)
        compilation.finish()
        assert compilation.prepared_from_cache == expected_from_cache
        x, y = _run_demo(compilation, demo_input(4))
        np.testing.assert_allclose(y, demo_expected(x), rtol=1e-5, atol=1e-6)
        outputs.append(y)
        # the service validates requests to a model prepared from the cache as to any other
        execution = nnapi.Execution(compilation)
        execution.set_input(0, x)
        execution.set_output(0, np.zeros((1, 4), np.float32))
        execution.compute()
    np.testing.assert_array_equal(outputs[0], outputs[1])
    # a cache "file" that is a pipe would block the driver reading it: refused, service alive
    read_end, write_end = os.pipe()
    try:
        with pytest.raises(nnapi.hal.HalError) as caught:
            device._hal.prepare_model_from_cache([read_end], [read_end], token)
        assert caught.value.status == ErrorStatus.INVALID_ARGUMENT and "regular file" in str(caught.value)
    finally:
        os.close(read_end)
        os.close(write_end)
    assert running.process.poll() is None
    x, y = _run_demo(compilation)
    np.testing.assert_allclose(y, demo_expected(x), rtol=1e-5, atol=1e-6)


def test_the_service_keeps_freed_memory():
    # glibc's adaptive trimming made a fresh service page-fault a model's temporaries back in
    # on every execution; the service process fixes the thresholds at start
    import platform

    from nnapi.drivers.service.server import keep_freed_memory

    assert keep_freed_memory() is (platform.libc_ver()[0] == "glibc")


CLIENT = textwrap.dedent('''
    import numpy as np, nnapi
    from nnapi.demo import build_demo_model, demo_expected, demo_input
    device = next(d for d in nnapi.get_devices() if d.name.endswith("@svcmany"))
    compilation = nnapi.Compilation(build_demo_model(), [device])
    compilation.finish()
    for seed in range(20):
        x = demo_input(seed)
        execution = nnapi.Execution(compilation)
        execution.set_input(0, x)
        y = np.zeros((1, 4), np.float32)
        execution.set_output(0, y)
        execution.compute()
        assert np.allclose(y, demo_expected(x), rtol=1e-5, atol=1e-6)
    print("ok")
''')


def test_several_client_processes_at_once(service):
    running = service("svcmany")
    env = dict(os.environ, NNAPI_REMOTE_DEVICES=str(running.path))
    clients = [subprocess.Popen([sys.executable, "-c", CLIENT], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, env=env) for _ in range(3)]
    for client in clients:
        out, err = client.communicate(timeout=300)
        assert client.returncode == 0 and out.strip() == "ok", err


def test_unreachable_service_is_a_reported_load_failure(tmp_path):
    env = dict(os.environ, NNAPI_REMOTE_DEVICES=str(tmp_path / "nobody.sock"))
    result = subprocess.run([sys.executable, "-m", "nnapi", "devices"], capture_output=True, text=True, env=env,
                            timeout=120)
    assert result.returncode == 0
    assert f"FAILED to load {tmp_path / 'nobody.sock'} (NNAPI_REMOTE_DEVICES)" in result.stdout


def test_frame_reader_limits():
    left, right = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with left, right:
        wire.send_frame(left, wire.pack({"v": 1}), [left.fileno()])
        payload, fds = wire.FrameReader(right).read()
        assert wire.unpack(payload) == {"v": 1} and len(fds) == 1
        os.close(fds[0])
    with pytest.raises(wire.WireError, match="out of range"):
        wire.get_int(1 << 70, "x")
    with pytest.raises(wire.WireError, match="expected an integer"):
        wire.get_int(True, "x")
    from nnapi.hal.types import Capabilities

    encoded = wire.encode_capabilities(Capabilities(step_cost_s=2e-5))
    assert wire.decode_capabilities(encoded).step_cost_s == 2e-5
    assert wire.decode_capabilities({k: v for k, v in encoded.items() if k != "step"}).step_cost_s == 0.0
    for bad in (-1.0, float("inf"), float("nan")):
        with pytest.raises(wire.WireError, match="step cost"):
            wire.decode_capabilities(dict(encoded, step=bad))
