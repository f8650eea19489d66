"""Fuzz the driver service's wire protocol in both directions; print a count per outcome.

To the service: a scripted workload of the real client (every operation the service
serves: hello, supported, reasons, prepare with float, quantized, control-flow, pool-
constant and large-constant models, compilation caching, execute, burst, bind / run,
fenced, device memory, map / forget / release, wait) is recorded through a proxy; each
case replays the recording on a connection of its own session and sends one of its
messages mutated (fields dropped, added, renamed, of the wrong type, out of range, huge,
the packed request blob mutated inside, the payload's bytes flipped) by socket or through
the shared-memory channel, or sends raw frame garbage on a throwaway connection. The
service must answer a malformed message with an error whose text names the field, never
with a Python exception's text, never die, hang or balloon, and a well-behaved client of
the same service must keep getting right answers.

To the client: a man-in-the-middle between the runtime's client and a real service
mutates one reply of a public-API scenario (discovery, Compilation.finish, compute with
arrays or shared memory, burst, reusable execution, start_compute_with_dependencies,
device memory, caching, HAL execute_fenced): wrong types, missing fields, wrong ids,
shapes and timings that disagree with the request, truncated frames, a close mid-reply,
silence. Every call must raise NnapiError (HalError across the HAL) with OP_FAILED or
DEAD_OBJECT (or the status a well-formed error reply carried), never a raw exception,
never hang past the client's timeout, never return wrong values or write past an output.

    python tools/fuzz_service.py --cases 20000 --seed 1       # the long run
    python tools/fuzz_service.py --cases 300 --direction to-service -v

The test suite runs a short version (tests/test_service_fuzz.py).
"""

from __future__ import annotations

import argparse
import collections
import copy
import fcntl
import gc
import math
import mmap
import os
import random
import re
import select
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from nnapi.tools.plain_tree import get, paths, replace

#: A reply text that is really a Python exception's (a bug: the field and rule must be named).
INTERNAL = re.compile(r"\b(AttributeError|TypeError|ValueError|KeyError|IndexError|ZeroDivisionError|"
                      r"OverflowError|FloatingPointError|MemoryError|RuntimeError|AssertionError|"
                      r"RecursionError|UnicodeDecodeError|UnicodeEncodeError|StopIteration|NameError|"
                      r"UnboundLocalError|BufferError|OSError|struct\.error)\b|object has no attribute|"
                      r"'NoneType'|object is not|unhashable type|not subscriptable|unsupported operand|"
                      r"values to unpack|index out of range|invalid literal|must be real number|"
                      r"object cannot be interpreted")
#: Seconds a message may take before the service counts as hung.
REPLY_TIMEOUT_S = 20.0
#: Growth of the service's peak memory (VmHWM) past its size after the warm-up that
#: counts as an allocation taken from a claimed length.
MEMORY_LIMIT = 384 << 20
#: The client's timeout in to-client cases (a silent service must be DEAD_OBJECT after it).
CLIENT_TIMEOUT_S = 1.0

_SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL


def _wire():
    from nnapi.drivers.service import wire

    return wire


# --- the service process ---------------------------------------------------------------------
class ServiceProcess:
    """``python -m nnapi.drivers.service`` on ``path``."""

    def __init__(self, path: str, driver: str = "reference") -> None:
        self.path = path
        env = dict(os.environ, OPENBLAS_NUM_THREADS="1")
        self.process = subprocess.Popen([sys.executable, "-m", "nnapi.drivers.service", "--driver", driver,
                                         "--socket", path], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                        text=True, env=env)
        line = self.process.stdout.readline()
        if not line.startswith("serving"):
            raise RuntimeError(f"the service did not start: {line}{self.process.stderr.read()}")

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def memory(self) -> tuple[int, int]:
        """(resident, peak resident) bytes."""
        values = {}
        try:
            for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
                key, _, rest = line.partition(":")
                if key in ("VmRSS", "VmHWM"):
                    values[key] = int(rest.split()[0]) * 1024
        except OSError:
            return 0, 0
        return values.get("VmRSS", 0), values.get("VmHWM", 0)

    def stop(self) -> None:
        if self.alive:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        for stream in (self.process.stdout, self.process.stderr):
            stream.close()


# --- models for the workload -------------------------------------------------------------------
def _models() -> dict[str, Any]:
    """Small finished models of several kinds, with inputs and expected outputs:
    name -> (model, [inputs], [expected outputs], keep-alive objects)."""
    import nnapi
    from nnapi import OperandCode as T
    from nnapi import OperandType
    from nnapi import OperationCode as Op
    from nnapi.demo import build_demo_model, demo_expected, demo_input

    models: dict[str, Any] = {}
    x = demo_input(3)
    models["demo"] = (build_demo_model(), [x], [demo_expected(x).astype(np.float32)], [])

    def add_model(code, dims, scale=0.0, zero=0, value=None, memory=None):
        model = nnapi.Model()
        tensor = OperandType(code, dims, scale, zero)
        a = model.add_operand(tensor)
        b = model.add_operand(tensor)
        fuse = model.add_operand(OperandType(T.INT32))
        out = model.add_operand(tensor)
        model.set_operand_value(fuse, np.int32(0))
        if memory is not None:
            model.set_operand_value_from_memory(b, *memory)
        elif value is not None:
            model.set_operand_value(b, value)
        model.add_operation(Op.ADD, [a, b, fuse], [out])
        model.identify_inputs_and_outputs([a] if memory is not None or value is not None else [a, b], [out])
        model.finish()
        return model

    # quantized: (q - 10) * 0.5 each; the sum requantized to the same scale
    qa = np.array([[12, 14, 16, 200]], np.uint8)
    qb = np.array([[10, 11, 30, 40]], np.uint8)
    expected = np.clip(qa.astype(np.int32) + qb - 10, 0, 255).astype(np.uint8)
    models["quant8"] = (add_model(T.TENSOR_QUANT8_ASYMM, [1, 4], 0.5, 10), [qa, qb], [expected], [])
    sa = np.array([[-3, 5, 7, 9]], np.int8)
    sb = np.array([[1, 2, -3, 4]], np.int8)
    models["quant8_signed"] = (add_model(T.TENSOR_QUANT8_ASYMM_SIGNED, [1, 4], 0.25, 0), [sa, sb],
                               [(sa + sb).astype(np.int8)], [])
    # a constant in a memory pool
    pool = nnapi.Memory.create_shared(64)
    np.frombuffer(pool.buffer, np.float32)[4:8] = [1, 2, 3, 4]
    fa = np.array([10, 20, 30, 40], np.float32)
    models["pool_constant"] = (add_model(T.TENSOR_FLOAT32, [4], memory=(pool, 16, 16)), [fa],
                               [fa + np.float32([1, 2, 3, 4])], [pool])
    # a constant larger than the inline limit: it crosses by descriptor
    big = np.arange(40_000, dtype=np.float32) / 1000
    fb = np.ones(40_000, np.float32)
    models["large_constant"] = (add_model(T.TENSOR_FLOAT32, [40_000], value=big), [fb], [fb + big], [big])
    # IF: x + 1 when the condition holds, x - 1 otherwise
    def branch(code):
        model = nnapi.Model()
        tensor = OperandType(T.TENSOR_FLOAT32, [2])
        a = model.add_operand(tensor)
        one = model.add_operand(tensor)
        fuse = model.add_operand(OperandType(T.INT32))
        out = model.add_operand(tensor)
        model.set_operand_value(one, np.ones(2, np.float32))
        model.set_operand_value(fuse, np.int32(0))
        model.add_operation(code, [a, one, fuse], [out])
        model.identify_inputs_and_outputs([a], [out])
        model.finish()
        return model

    then_model, else_model = branch(Op.ADD), branch(Op.SUB)
    model = nnapi.Model()
    cond = model.add_operand(OperandType(T.TENSOR_BOOL8, [1]))
    value = model.add_operand(OperandType(T.TENSOR_FLOAT32, [2]))
    then_operand = model.add_operand(OperandType(T.MODEL))
    else_operand = model.add_operand(OperandType(T.MODEL))
    out = model.add_operand(OperandType(T.TENSOR_FLOAT32, [2]))
    model.set_operand_value_from_model(then_operand, then_model)
    model.set_operand_value_from_model(else_operand, else_model)
    model.add_operation(Op.IF, [cond, then_operand, else_operand, value], [out])
    model.identify_inputs_and_outputs([cond, value], [out])
    model.finish()
    fc = np.array([5, 7], np.float32)
    models["if"] = (model, [np.array([True]), fc], [fc + 1], [then_model, else_model])
    return models


def _execution(compilation, inputs, outputs_like):
    """An Execution of ``compilation`` with ``inputs`` set and a zeroed output like each of
    ``outputs_like`` set: (the execution, its outputs)."""
    import nnapi

    execution = nnapi.Execution(compilation)
    for index, value in enumerate(inputs):
        execution.set_input(index, value)
    outputs = [np.zeros_like(o) for o in outputs_like]
    for index, value in enumerate(outputs):
        execution.set_output(index, value)
    return execution, outputs


def _compute(compilation, inputs, outputs_like, **options):
    execution, outputs = _execution(compilation, inputs, outputs_like)
    if options.get("timing"):
        execution.set_measure_timing(True)
    execution.compute()
    return outputs


def _close(expected, got) -> bool:
    return all(e.shape == g.shape and np.allclose(e.astype(np.float64), g.astype(np.float64), rtol=1e-5, atol=1e-5)
               for e, g in zip(expected, got, strict=True))


# --- a proxy between a client and the service ----------------------------------------------------
class Proxy:
    """Listens on ``path`` and forwards every connection to ``upstream``, frame by frame.
    ``on_request(payload, fds)`` sees each request; ``on_reply(request, reply)`` (the
    decoded request, the reply's payload) may return what to do instead of passing the
    reply on: ("payload", bytes) to send, ("close", None), ("silence", seconds) then
    close, ("raw", bytes) for the socket as they are, ("truncated", bytes) then close, or
    ("channel-raw", (sequence delta, length word, bytes)) for a request that came through
    the channel. The ``channel`` message is answered here (the channel ends at the proxy),
    and requests through the channel go upstream by socket."""

    def __init__(self, path: str, upstream: str, on_request=None, on_reply=None) -> None:
        self.path, self.upstream = path, upstream
        self.on_request, self.on_reply = on_request, on_reply
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(path)
        self.listener.listen(16)
        self.stopping = False
        self.connections: set[socket.socket] = set()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.stopping:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            self.connections.add(client)
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def stop(self) -> None:
        self.stopping = True
        try:
            self.listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.listener.close()
        for connection in list(self.connections):
            try:
                connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        try:
            os.unlink(self.path)
        except OSError:
            pass

    def _serve(self, client: socket.socket) -> None:
        wire = _wire()
        from nnapi.drivers.service import channel as fast

        up = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        up.settimeout(REPLY_TIMEOUT_S)
        up.connect(self.upstream)
        up_reader = wire.FrameReader(up)
        reader = wire.FrameReader(client)
        state = {"channel": None, "seq": 0}
        try:
            while True:
                ch = state["channel"]
                if ch is not None and not reader.buffered:
                    poller = select.poll()
                    poller.register(client.fileno(), select.POLLIN)
                    poller.register(ch.from_peer, select.POLLIN)
                    ready = {fd for fd, _ in poller.poll()}
                    if ch.from_peer in ready:
                        ch.drain()
                    if ch.words[fast.REQUEST_SEQ] != state["seq"]:
                        seq = ch.words[fast.REQUEST_SEQ]
                        length = ch.words[fast.REQUEST_LEN]
                        state["seq"] = seq
                        payload = bytes(ch.request_slot[:min(length, ch.capacity)])
                        if not self._exchange(client, up, up_reader, payload, [], (ch, seq)):
                            return
                        continue
                    if client.fileno() not in ready:
                        continue
                payload, fds = reader.read()
                try:
                    message = wire.unpack(payload)
                except wire.WireError:
                    message = {}
                if message.get("op") == "channel" and len(fds) == 3:
                    # the channel ends here: the client's requests through it go upstream by socket
                    capacity = message.get("a", {}).get("cap", 0)
                    memory, request_bell, reply_bell = fds
                    mapping = mmap.mmap(memory, fast.size_for(capacity))
                    os.close(memory)
                    if self.on_request is not None:
                        self.on_request(payload, [])
                    reply = wire.pack({"v": wire.PROTOCOL_VERSION, "id": message.get("id"), "ok": True, "r": None})
                    new = fast.Channel(mapping, capacity, reply_bell, request_bell)
                    try:
                        answered = self._answer(client, message, reply, None)
                    except BaseException:
                        new.close()
                        raise
                    if not answered:
                        new.close()
                        return
                    state["channel"], state["seq"] = new, 0
                    continue
                try:
                    if not self._exchange(client, up, up_reader, payload, fds, None):
                        return
                finally:
                    for fd in fds:
                        os.close(fd)
        except (OSError, EOFError, wire.ProtocolError, ValueError):
            return
        finally:
            if state["channel"] is not None:
                state["channel"].close()
            reader.close()  # descriptors of a frame never handed out
            up_reader.close()
            up.close()
            client.close()
            self.connections.discard(client)

    def _exchange(self, client, up, up_reader, payload: bytes, fds: list[int], through) -> bool:
        wire = _wire()
        if self.on_request is not None:
            self.on_request(payload, fds)
        wire.send_frame(up, payload, fds)
        reply, _ = up_reader.read()
        try:
            message = wire.unpack(payload)
        except wire.WireError:
            message = {}
        return self._answer(client, message, reply, through)

    def _answer(self, client, request: dict, reply: bytes, through) -> bool:
        """Send ``reply`` (or what on_reply makes of it) to the client; False to drop it."""
        wire = _wire()
        from nnapi.drivers.service import channel as fast

        action = self.on_reply(request, reply) if self.on_reply is not None else None
        if action is not None:
            kind, data = action
            if kind == "close":
                return False
            if kind == "silence":
                time.sleep(data)
                return False
            if kind == "raw":  # bytes for the socket as they are, then go on
                client.sendall(data)
                return through is None and data != b""
            if kind == "truncated":
                client.sendall(data)
                return False
            if kind == "channel-raw" and through is not None:  # (sequence delta, length, payload)
                ch, seq = through
                delta, length, body = data
                ch.reply_slot[:len(body)] = body
                ch.words[fast.REPLY_LEN] = length
                ch.words[fast.REPLY_SEQ] = seq + delta
                ch.ring()
                return True
            if kind == "payload":
                reply = data
        if through is not None:
            ch, seq = through
            if len(reply) <= ch.capacity:
                ch.reply_slot[:len(reply)] = reply
                ch.words[fast.REPLY_LEN] = len(reply)
            else:
                wire.send_frame(client, reply)
                ch.words[fast.REPLY_LEN] = fast.ON_SOCKET
            ch.words[fast.REPLY_SEQ] = seq
            ch.ring()
            return True
        wire.send_frame(client, reply)
        return True


# --- the structure-aware mutator -----------------------------------------------------------------
_OPS = ["hello", "supported", "reasons", "prepare", "prepare_cache", "execute", "burst", "burst_execute", "release",
        "map", "forget", "allocate", "copy_to", "copy_from", "wait", "bind", "run", "channel", "execute_fenced",
        "fenced_info", "no_such_op", ""]


def _junk(rng: random.Random, depth: int = 0) -> Any:
    choice = rng.randrange(24)
    if choice == 0:
        return None
    if choice == 1:
        return rng.choice([True, False])
    if choice == 2:
        return rng.choice([-1, 0, 1, 2, 3, 7, 255, 256])
    if choice == 3:
        return rng.choice([2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**40, 2**62, 2**63 - 1, 2**64 - 1])
    if choice == 4:
        return rng.choice([-(2**31), -(2**32), -(2**63)])
    if choice == 5:
        return rng.choice([0.0, -0.5, 1.5, 1e300, -1e300, float("nan"), float("inf"), float("-inf")])
    if choice == 6:
        return rng.choice(["", "x", "0", "1", "\x00", "é" * 3, "a" * 5000])
    if choice == 7:
        return rng.choice(_OPS)
    if choice == 8:
        return bytes(rng.randrange(256) for _ in range(rng.choice([0, 1, 3, 16, 33])))
    if choice == 9:
        return b"\x00" * rng.choice([0, 4, 64, 4096])
    if choice == 10:
        return []
    if choice == 11:
        return {}
    if choice == 12 and depth < 3:
        return [_junk(rng, depth + 1) for _ in range(rng.randrange(1, 6))]
    if choice == 13 and depth < 3:
        keys = ["a", "h", "r", "dev", "x", 1, b"k"]
        return {rng.choice(keys): _junk(rng, depth + 1) for _ in range(rng.randrange(1, 4))}
    if choice == 14:
        nested: Any = 0
        for _ in range(rng.choice([10, 100, 400])):
            nested = [nested]
        return nested
    if choice == 15:
        return [rng.choice([0, 1, -1, 2**32 - 1, 2**31]) for _ in range(rng.choice([1, 4, 8, 64]))]
    if choice == 16:
        return [[0, 1, 0, 16]] * rng.choice([1, 2, 300])
    if choice == 17:
        return [2**31 - 1] * rng.choice([1, 4, 6])
    return rng.choice([0, 1, 2, 5, 100, 1000, 65535, 65536])


def _packed(value: Any) -> Any:
    """A msgpack blob's decoded list (the packed request of an execution), or None."""
    if not isinstance(value, bytes) or len(value) < 2 or value[0] not in (0x93, 0x92, 0x94, 0xdc):
        return None
    try:
        import msgpack

        decoded = msgpack.unpackb(value, raw=False, strict_map_key=False)
    except Exception:  # noqa: BLE001 - not a packed blob
        return None
    return decoded if isinstance(decoded, list) else None


def mutate_tree(rng: random.Random, tree: Any, notes: list[str], depth: int = 0) -> Any:
    """One structural mutation of ``tree`` (a deep copy is mutated and returned)."""
    import msgpack

    tree = copy.deepcopy(tree)
    nodes = paths(tree)
    # leaves and small containers first: most of the schema is there
    path = rng.choice(nodes if rng.random() < 0.3 else [p for p in nodes if p] or nodes)
    node = get(tree, path)
    where = "/".join(str(p) for p in path) or "<root>"
    inner = _packed(node)
    if inner is not None and depth < 2 and rng.random() < 0.8:
        notes.append(f"{where}: inside the packed blob")
        return replace(tree, path, msgpack.packb(mutate_tree(rng, inner, notes, depth + 1), use_bin_type=True))
    kind = rng.randrange(10)
    if isinstance(node, bool) or kind == 0:
        value = _junk(rng)
        notes.append(f"{where} = {_short(value)}")
        return replace(tree, path, value)
    if isinstance(node, int):
        value = rng.choice([node + 1, node - 1, -node - 1, node * 2**rng.randrange(1, 40), 0, -1, 2**32 - 1,
                            2**63 - 1, 2**64 - 1, node + rng.randrange(1, 1 << 20), float(node), str(node)])
        notes.append(f"{where}: {node} -> {_short(value)}")
        return replace(tree, path, value)
    if isinstance(node, float):
        value = rng.choice([float("nan"), float("inf"), -node, int(node) if math.isfinite(node) else 0, 1e308, -1.0])
        notes.append(f"{where}: {node} -> {value}")
        return replace(tree, path, value)
    if isinstance(node, list) and node:
        action = rng.randrange(6)
        index = rng.randrange(len(node))
        if action == 0:
            del node[index]
            notes.append(f"{where}: dropped [{index}]")
        elif action == 1:
            node.insert(index, copy.deepcopy(node[index]))
            notes.append(f"{where}: duplicated [{index}]")
        elif action == 2:
            node.append(_junk(rng))
            notes.append(f"{where}: appended junk")
        elif action == 3:
            node.clear()
            notes.append(f"{where}: emptied")
        elif action == 4:
            node[:] = node * rng.choice([2, 50, 2000]) if len(str(node)) < 2000 else node * 2
            notes.append(f"{where}: repeated")
        else:
            node.reverse()
            notes.append(f"{where}: reversed")
        return tree
    if isinstance(node, dict) and node:
        key = rng.choice(list(node))
        action = rng.randrange(4)
        if action == 0:
            del node[key]
            notes.append(f"{where}: dropped {key!r}")
        elif action == 1:
            node[rng.choice(["zz", "a", "r", "h", 7, b"b", ""])] = _junk(rng)
            notes.append(f"{where}: added a key")
        elif action == 2:
            node[str(key) + "_"] = node.pop(key)
            notes.append(f"{where}: renamed {key!r}")
        else:
            node[key] = _junk(rng)
            notes.append(f"{where}/{key} = junk")
        return tree
    if isinstance(node, bytes):
        data = bytearray(node)
        action = rng.randrange(4)
        if action == 0 and data:
            del data[rng.randrange(len(data)):]
            notes.append(f"{where}: bytes truncated")
        elif action == 1:
            data += bytes(rng.randrange(256) for _ in range(rng.choice([1, 7, 64])))
            notes.append(f"{where}: bytes extended")
        elif data:
            for _ in range(rng.randrange(1, 4)):
                data[rng.randrange(len(data))] = rng.randrange(256)
            notes.append(f"{where}: bytes flipped")
        return replace(tree, path, bytes(data))
    value = _junk(rng)
    notes.append(f"{where} = {_short(value)}")
    return replace(tree, path, value)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) < 60 else text[:57] + "..."


# --- to the service ------------------------------------------------------------------------------
class Recording:
    """The requests of a workload of the real client, with their descriptors (kept open)."""

    def __init__(self) -> None:
        self.messages: list[tuple[bytes, list[int]]] = []
        #: the recorded workload's objects: alive, so the replayed session's stay valid
        self.keep: list = []

    def add(self, payload: bytes, fds: list[int]) -> None:
        self.messages.append((payload, [os.dup(fd) for fd in fds]))


def record_workload(service_path: str, work: str) -> Recording:
    """Run the workload through a recording proxy (socket only: no channel)."""
    import nnapi
    from nnapi.drivers.service.client import connect_devices
    from nnapi.hal import FdPool, RequestArgument
    from nnapi.hal.types import DataLocation, Request
    from nnapi.runtime import manager
    from nnapi.runtime.model_builder import build_hal_model

    recording = Recording()
    proxy = Proxy(os.path.join(work, "record.sock"), service_path, recording.add)
    saved = os.environ.get("NNAPI_SERVICE_CHANNEL")
    os.environ["NNAPI_SERVICE_CHANNEL"] = "0"
    registered = []
    # Objects in reference cycles are released when the collector runs: only at the end,
    # so that the same seed records the same messages
    collecting = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        hal_devices = connect_devices(proxy.path)
        for hal in hal_devices:
            manager.register_device(hal)
            registered.append(hal.name)
        device = next(d for d in nnapi.get_devices() if d.name == hal_devices[0].name)
        hal = device._hal
        keep = []
        for name, (model, inputs, expected, _) in _models().items():
            compilation = nnapi.Compilation(model, [device])
            compilation.finish()
            got = _compute(compilation, inputs, expected, timing=True)
            if not _close(expected, got):
                raise RuntimeError(f"recording: {name} computed wrong values")
            keep.append(compilation)
            if name == "demo":
                # shared memory, a burst, a reusable execution, an asynchronous one
                x = inputs[0]
                memory_in = nnapi.Memory.create_shared(x.nbytes)
                memory_out = nnapi.Memory.create_shared(16)
                np.frombuffer(memory_in.buffer, np.float32)[:] = x.reshape(-1)
                execution = nnapi.Execution(compilation)
                execution.set_input_from_memory(0, memory_in, 0, x.nbytes)
                execution.set_output_from_memory(0, memory_out, 0, 16)
                execution.compute()
                burst = nnapi.Burst(compilation)
                execution = nnapi.Execution(compilation)
                execution.set_input(0, x)
                execution.set_output(0, np.zeros((1, 4), np.float32))
                execution.burst_compute(burst)
                execution = nnapi.Execution(compilation)
                execution.set_reusable(True)
                execution.set_input(0, x)
                execution.set_output(0, np.zeros((1, 4), np.float32))
                execution.compute()
                execution.compute()
                keep.append(execution)  # bound in the service: run names it
                execution = nnapi.Execution(compilation)
                execution.set_input(0, x)
                execution.set_output(0, np.zeros((1, 4), np.float32))
                execution.start_compute_with_dependencies([]).wait()
                keep += [memory_in, memory_out, burst]
        # device memory: allocate, copy_from, execute naming it, copy_to
        add = _models()["pool_constant"]
        compilation = nnapi.Compilation(add[0], [device])
        compilation.finish()
        desc = nnapi.MemoryDesc()
        desc.add_input_role(compilation, 0)
        desc.add_output_role(compilation, 0)
        desc.finish()
        memory = nnapi.Memory.from_desc(desc)
        source = nnapi.Memory.create_shared(16)
        np.frombuffer(source.buffer, np.float32)[:] = [1, 2, 3, 4]
        nnapi.Memory.copy(source, memory)
        execution = nnapi.Execution(compilation)
        execution.set_input_from_memory(0, memory, 0, 0)
        execution.set_output(0, np.zeros(4, np.float32))
        execution.compute()
        nnapi.Memory.copy(memory, source)
        keep += [compilation, memory, source]
        # compilation caching: prepare with cache files, then from them
        cache_dir = os.path.join(work, "cache")
        os.makedirs(cache_dir, exist_ok=True)
        for _ in range(2):
            cached = nnapi.Compilation(_models()["quant8"][0], [device])
            cached.set_caching(cache_dir, b"\x07" * 32)
            cached.finish()
            keep.append(cached)
        # HAL: reasons, a fenced execution waiting for a fence in the service, wait
        hal_model = build_hal_model(_models()["quant8"][0])[0]
        hal.get_unsupported_reasons(hal_model)
        prepared = hal.prepare_model(hal_model)
        pools = []
        for values in ([12, 14, 16, 200], [10, 11, 30, 40], [0, 0, 0, 0]):
            fd = os.memfd_create("fuzz-pool", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
            os.ftruncate(fd, 4096)
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, _SEALS)
            os.pwrite(fd, bytes(values), 0)
            pools.append(FdPool(fd, 0, 4096, True))
        request = Request([RequestArgument(False, DataLocation(0, 0, 4), []),
                           RequestArgument(False, DataLocation(1, 0, 4), [])],
                          [RequestArgument(False, DataLocation(2, 0, 4), [])], pools)
        fence = os.eventfd(1, os.EFD_CLOEXEC)
        done, callback = prepared.execute_fenced(request, [fence], True)
        if done is not None:
            poller = select.poll()
            poller.register(done, select.POLLIN)
            poller.poll(REPLY_TIMEOUT_S * 1000)
            os.close(done)
        callback.get_execution_info()
        os.close(fence)
        keep += [prepared, callback, pools]
        hal._link.call("wait", {"dev": 0})
        # what the replay names stays alive (the recording keeps it); throwaway objects are
        # released, so that the recording holds release and forget messages too
        recording.keep = keep
        del execution, burst
        throwaway = nnapi.Compilation(_models()["quant8"][0], [device])
        throwaway.finish()
        execution = nnapi.Execution(throwaway)
        execution.set_reusable(True)
        for index, value in enumerate(_models()["quant8"][1]):
            execution.set_input(index, value)
        execution.set_output(0, np.zeros((1, 4), np.uint8))
        execution.burst_compute(nnapi.Burst(throwaway))
        execution.compute()
        del throwaway, execution
        gc.collect()
        hal._link.call("wait", {"dev": 0})  # carries the releases of what was collected
    finally:
        if collecting:
            gc.enable()
        for name in registered:
            manager.unregister_device(name)
        if saved is None:
            os.environ.pop("NNAPI_SERVICE_CHANNEL", None)
        else:
            os.environ["NNAPI_SERVICE_CHANNEL"] = saved
        proxy.stop()
    return recording


class FuzzConnection:
    """A connection to the service replaying the recording, then taking mutated messages."""

    def __init__(self, path: str, recording: Recording, replay: bool = True) -> None:
        wire = _wire()
        from nnapi.drivers.service import channel as fast

        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(REPLY_TIMEOUT_S)
        self.sock.connect(path)
        self.reader = wire.FrameReader(self.sock, descriptors=False)
        self.channel = None
        self.seq = 0
        self.next_id = 1000
        self.replay_failures = 0
        self.replay_notes: list[str] = []
        if replay:
            for payload, fds in recording.messages:
                reply = self.ask(payload, fds)
                for _ in range(200):  # the fenced execution runs in a thread of the service
                    if reply is None or reply.get("ok") or "has not finished" not in str(reply.get("msg")):
                        break
                    time.sleep(0.005)
                    reply = self.ask(payload, fds)
                if reply is None or reply.get("ok") is not True:
                    self.replay_failures += 1
                    self.replay_notes.append(f"{wire.unpack(payload).get('op')}: "
                                             f"{None if reply is None else reply.get('msg')}")
            # a channel beside the socket, for cases sent through it
            channel, memory = fast.Channel.create(fast.MIN_CAPACITY * 4)
            try:
                reply = self.ask(wire.pack({"v": wire.PROTOCOL_VERSION, "id": 999, "op": "channel",
                                            "a": {"cap": channel.capacity}}),
                                 [memory, channel.to_peer, channel.from_peer])
            finally:
                os.close(memory)
            if reply is not None and reply.get("ok"):
                channel.watch(self.sock.fileno())
                self.channel = channel
            else:
                channel.close()

    def ask(self, payload: bytes, fds=()) -> dict | None:
        """Send by socket; the reply, or None when the connection closed. TimeoutError when
        the service does not answer."""
        wire = _wire()
        try:
            wire.send_frame(self.sock, payload, list(fds))
            data, _ = self.reader.read()
        except (EOFError, wire.ProtocolError, ConnectionError, BrokenPipeError):
            return None
        return wire.unpack(data)

    def ask_channel(self, payload: bytes) -> dict | None:
        """Send through the shared-memory channel."""
        wire = _wire()
        from nnapi.drivers.service import channel as fast

        channel = self.channel
        self.seq += 1
        channel.request_slot[:len(payload)] = payload
        channel.words[fast.REQUEST_LEN] = len(payload)
        channel.words[fast.REQUEST_SEQ] = self.seq
        channel.ring()
        end = time.monotonic() + REPLY_TIMEOUT_S
        while channel.words[fast.REPLY_SEQ] != self.seq:
            if time.monotonic() > end:
                raise TimeoutError("no reply through the channel")
            _, ready = channel.sleep(50)
            if ready and channel.words[fast.REPLY_SEQ] != self.seq:
                try:
                    data, _ = self.reader.read()
                except (EOFError, wire.ProtocolError, ConnectionError):
                    return None
                return wire.unpack(data)  # a reply too large for the slot
        length = channel.words[fast.REPLY_LEN]
        if length == fast.ON_SOCKET:
            data, _ = self.reader.read()
            return wire.unpack(data)
        return wire.unpack(bytes(channel.reply_slot[:length]))

    def close(self) -> None:
        if self.channel is not None:
            self.channel.close()
        self.reader.close()
        self.sock.close()


class Bystander:
    """A well-behaved client of the same service: its answers must stay right."""

    def __init__(self, service_path: str) -> None:
        import nnapi
        from nnapi.drivers.service.client import connect_devices
        from nnapi.runtime import manager

        self.hal = connect_devices(service_path)[0]
        self.name = self.hal.name
        manager.register_device(self.hal)
        device = next(d for d in nnapi.get_devices() if d.name == self.name)
        self.cases = []
        for name in ("demo", "quant8", "if"):
            model, inputs, expected, keep = _models()[name]
            compilation = nnapi.Compilation(model, [device])
            compilation.finish()
            self.cases.append((compilation, inputs, expected, keep))

    def check(self) -> str | None:
        """None when every model computes right, else what went wrong."""
        import nnapi

        for compilation, inputs, expected, _ in self.cases:
            try:
                got = _compute(compilation, inputs, expected)
            except nnapi.NnapiError as error:
                return f"{error.code.name}: {error}"
            if not _close(expected, got):
                return f"wrong values {got} (expected {expected})"
        return None

    def close(self) -> None:
        from nnapi.runtime import manager

        manager.unregister_device(self.name)


def classify_reply(reply: dict | None) -> tuple[str, bool]:
    """(outcome class, is a bug) of the service's reply to a mutated message."""
    from nnapi.hal import ErrorStatus

    if reply is None:
        return "closed", True
    if reply.get("ok") is True:
        return "accepted", False
    message = reply.get("msg")
    status = reply.get("status")
    if not isinstance(message, str) or not message.strip():
        return "error without a message", True
    if INTERNAL.search(message):
        return "python exception text", True
    try:
        name = ErrorStatus(status).name
    except ValueError:
        return f"bad status {status!r}", True
    return f"refused {name}", False


#: the release kind of the object each operation names, and the argument naming it
_NAMED = {"execute": ("prepared", "h"), "burst": ("prepared", "h"), "bind": ("prepared", "h"),
          "execute_fenced": ("prepared", "h"), "burst_execute": ("burst", "b"), "run": ("execution", "x"),
          "copy_to": ("buffer", "buf"), "copy_from": ("buffer", "buf"), "fenced_info": ("fenced", "f")}


def _free_first(rng: random.Random, message: dict) -> tuple[str, dict] | None:
    """The message that frees what ``message`` uses (its object, the pools of its
    request, or every pool), or None."""
    args = message.get("a", {})
    named = _NAMED.get(message.get("op"))
    choice = rng.randrange(3)
    if choice == 0 and named is not None and isinstance(args.get(named[1]), int):
        return "release", {"kind": named[0], "h": args[named[1]]}
    request = _packed(args.get("r"))
    if choice == 1 and request and isinstance(request[0], list):
        pools = [ref[1] for ref in request[0] if isinstance(ref, list) and len(ref) == 4 and ref[0] == 0]
        if pools:
            return "forget", {"pools": pools}
    if choice == 2 and message.get("op") not in ("hello", "map", "forget", "release"):
        return "forget", {"pools": list(range(1, 64))}  # a bound execution's pools too
    return None


def _raw_frame_case(rng: random.Random, path: str, payload: bytes) -> str:
    """Garbage framing on a throwaway connection: the service may close it or wait for
    the rest; the outcome is noted, the service's health is checked by the caller."""
    wire = _wire()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(2.0)
    try:
        sock.connect(path)
        kind = rng.randrange(6)
        if kind == 0:
            data = struct.pack("<4sII", b"NNS2", len(payload), 0) + payload
        elif kind == 1:
            data = struct.pack("<4sII", b"NNS1", rng.choice([wire.MAX_PAYLOAD + 1, 2**32 - 1]), 0) + payload
        elif kind == 2:
            data = struct.pack("<4sII", b"NNS1", len(payload), rng.choice([1, 3, 254, 2**32 - 1])) + payload
        elif kind == 3:
            data = (struct.pack("<4sII", b"NNS1", len(payload), 0) + payload)[:rng.randrange(1, 12 + len(payload))]
        elif kind == 4:
            data = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 64)))
        else:
            data = struct.pack("<4sII", b"NNS1", len(payload) + rng.randrange(1, 100), 0) + payload
        sock.sendall(data)
        sock.shutdown(socket.SHUT_WR)
        try:
            answer = sock.recv(1)
        except (TimeoutError, ConnectionError):
            answer = b""
        return "frame: closed" if answer == b"" else "frame: answered"
    except OSError:
        return "frame: closed"
    finally:
        sock.close()


def fuzz_to_service(cases: int, seed: int, work: str, verbose: bool = False, driver: str = "reference",
                    log=print) -> tuple[collections.Counter, list[str]]:
    """``cases`` mutated messages to a fresh service; (count per outcome, bug reports)."""
    wire = _wire()
    rng = random.Random(seed)
    service = ServiceProcess(os.path.join(work, "fuzz.sock"), driver)
    counts: collections.Counter[str] = collections.Counter()
    bugs: list[str] = []
    bystander = None
    connection = None
    try:
        recording = record_workload(service.path, work)
        templates = [(wire.unpack(payload), fds) for payload, fds in recording.messages]
        ops = collections.Counter(t[0].get("op") for t in templates)
        log(f"recorded {len(templates)} messages: {dict(ops)}")
        bystander = Bystander(service.path)
        baseline = None
        fresh_every = 40
        for case in range(cases):
            if connection is None or case % fresh_every == 0:
                if connection is not None:
                    connection.close()
                replay = rng.random() > 0.05  # a few cases on a bare connection: wrong order
                connection = FuzzConnection(service.path, recording, replay)
                if replay and connection.replay_failures:
                    counts["replay mismatch"] += connection.replay_failures
                    if verbose:
                        log(f"replay mismatch: {connection.replay_notes}")
                if not replay and rng.random() < 0.5:
                    connection.ask(wire.pack({"v": wire.PROTOCOL_VERSION, "id": 1, "op": "hello",
                                              "a": {"v": wire.PROTOCOL_VERSION}}))
                if baseline is None:
                    baseline = service.memory()[1]
            message, fds = rng.choice(templates)
            notes: list[str] = []
            message = dict(message, id=connection.next_id)
            connection.next_id += 1
            mutated = message
            freed = _free_first(rng, message)
            if freed is not None and rng.random() < 0.1:
                # use after free: the object the message names is released first (or its
                # pools forgotten), and the message is sent as it was
                connection.ask(wire.pack({"v": wire.PROTOCOL_VERSION, "id": 1, "op": freed[0], "a": freed[1]}))
                notes.append(f"after {freed[0]} {freed[1]}")
            else:
                for _ in range(rng.choice([1, 1, 1, 2, 3])):
                    mutated = mutate_tree(rng, mutated, notes)
            what = f"case {case}: {message.get('op')} {'; '.join(notes)}"
            try:
                payload = wire.pack(mutated)
            except (ValueError, TypeError, OverflowError):
                counts["unpackable (skipped)"] += 1
                continue
            reply = None
            if rng.random() < 0.04:
                outcome, bug = _raw_frame_case(rng, service.path, payload), False
            else:
                if rng.random() < 0.05 and len(payload) > 4:
                    data = bytearray(payload)
                    for _ in range(rng.randrange(1, 4)):
                        data[rng.randrange(len(data))] = rng.randrange(256)
                    payload = bytes(data)
                    what += "; payload bytes flipped"
                use_channel = connection.channel is not None and not fds and rng.random() < 0.3 \
                    and len(payload) <= connection.channel.capacity
                try:
                    if use_channel:
                        reply = connection.ask_channel(payload)
                    else:
                        send_fds = fds if rng.random() > 0.1 else []
                        reply = connection.ask(payload, send_fds)
                except TimeoutError:
                    reply, outcome, bug = None, "no reply (hung)", True
                    connection.close()
                    connection = None
                else:
                    outcome, bug = classify_reply(reply)
                    if reply is None:
                        connection.close()
                        connection = None
            counts[outcome] += 1
            if bug:
                detail = "" if reply is None else f" -> status {reply.get('status')}: {str(reply.get('msg'))[:300]}"
                bugs.append(f"{outcome}: {what}{detail}")
                if verbose:
                    log(f"BUG {bugs[-1]}")
            elif verbose:
                detail = "" if reply is None else str(reply.get("msg", ""))[:120]
                log(f"{outcome}: {what} {detail}")
            if not service.alive:
                bugs.append(f"the service died at {what}: {service.process.stderr.read()[-2000:]}")
                counts["service died"] += 1
                break
            if case % 25 == 24 or case == cases - 1:
                peak = service.memory()[1]
                if baseline is not None and peak - baseline > MEMORY_LIMIT:
                    counts["memory"] += 1
                    bugs.append(f"the service's peak memory grew {(peak - baseline) >> 20} MiB by {what}")
                    baseline = peak
                wrong = bystander.check()
                if wrong is not None:
                    counts["bystander wrong"] += 1
                    bugs.append(f"the well-behaved client failed after {what}: {wrong}")
        if service.alive:
            wrong = bystander.check()
            if wrong is not None:
                bugs.append(f"the well-behaved client failed at the end: {wrong}")
    finally:
        if connection is not None:
            connection.close()
        if bystander is not None:
            bystander.close()
        service.stop()
    return counts, bugs


# --- to the client ------------------------------------------------------------------------------
class ReplyMutator:
    """Mutates the ``target``-th reply of a connection's life (the proxy's on_reply)."""

    def __init__(self) -> None:
        self.rng = random.Random(0)
        self.target = -1
        self.count = 0
        self.ops: list[str] = []
        self.notes: list[str] = []
        #: the mutated reply is a well-formed failure with this status (the client must report it)
        self.status: int | None = None
        #: the mutated reply names an object by another well-formed number than the one made:
        #: the service refuses it when it is used (INVALID_ARGUMENT), a status passed on as any
        self.other_handle = False
        self.silence_s = CLIENT_TIMEOUT_S + 1.0

    def arm(self, rng: random.Random, target: int) -> None:
        self.rng, self.target, self.count, self.ops, self.notes, self.status = rng, target, 0, [], [], None
        self.other_handle = False

    def __call__(self, request: dict, reply: bytes):
        wire = _wire()
        from nnapi.drivers.service import channel as fast
        from nnapi.hal import ErrorStatus

        index = self.count
        self.count += 1
        op = request.get("op") if isinstance(request, dict) else None
        self.ops.append(str(op))
        if index != self.target:
            return None
        rng = self.rng
        decoded = wire.unpack(reply)
        kind = rng.randrange(20)
        if kind == 0:
            self.notes.append(f"{op}: closed instead of answering")
            return "close", None
        if kind == 1:
            self.notes.append(f"{op}: frame cut short")
            data = struct.pack("<4sII", b"NNS1", len(reply), 0) + reply
            return "truncated", data[:rng.randrange(1, len(data))]
        if kind == 2 and rng.random() < 0.3:
            self.notes.append(f"{op}: silence")
            return "silence", self.silence_s
        if kind == 3:
            self.notes.append(f"{op}: garbage bytes")
            return "raw", rng.choice([b"HTTP/1.0 200 OK\r\n\r\n", struct.pack("<4sII", b"NNS1", 2**31, 0),
                                      struct.pack("<4sII", b"NNS1", 3, 4) + b"\x93\x01\x02"])
        if kind == 4:
            self.notes.append(f"{op}: answered twice")
            frame = struct.pack("<4sII", b"NNS1", len(reply), 0) + reply
            return "raw", frame + frame
        if kind == 5:
            self.notes.append(f"{op}: through the channel out of order / past the slot")
            return "channel-raw", rng.choice([(1, len(reply), reply), (0, 1 << 40, reply), (0, fast.ON_SOCKET, b""),
                                              (2, 0, b""), (0, 3, b"\x93\x01\x02")])
        if kind == 6:
            status = rng.choice([0, 1, 2, 3, 4, 5, 6, 7, 8, 10000, 9, -1, 2**40, "x", None, 1.5])
            failure = {"v": decoded.get("v"), "id": decoded.get("id"), "ok": False, "status": status,
                       "msg": rng.choice(["driver failure", "", None, 7, "x" * 10000]),
                       "shapes": rng.choice([[], [[[1, 4], False]], "x", [[[-1], True]], [[[2**40], 1]]])}
            self.notes.append(f"{op}: a failure with status {status!r}, msg {_short(failure['msg'])}, "
                              f"shapes {failure['shapes']!r}")
            try:
                if status != 0 and ErrorStatus(status) is not None and isinstance(failure["shapes"], list) \
                        and failure["shapes"] in ([], [[[1, 4], False]]):
                    self.status = status
            except (ValueError, TypeError):
                pass
            return "payload", wire.pack(failure)
        if kind == 7:
            decoded["id"] = rng.choice([decoded.get("id", 0) + 1, 0, -1, "1", None, 2**64 - 1])
            self.notes.append(f"{op}: id -> {decoded['id']!r}")
            return "payload", wire.pack(decoded)
        if kind == 8 and isinstance(decoded.get("r"), list) and len(decoded["r"]) == 2 \
                and isinstance(decoded["r"][0], list):
            # an execution's result: shapes and timing that disagree with the request
            shapes, timing = decoded["r"]
            choice = rng.randrange(6)
            if choice == 0 and shapes:
                shapes[0][0] = [d + rng.choice([1, -1, 1000]) if d > 0 else 7 for d in shapes[0][0]]
            elif choice == 1 and shapes:
                shapes[0][0] = shapes[0][0][:-1] if rng.random() < 0.5 else shapes[0][0] + [1]
            elif choice == 2 and shapes:
                shapes[0][1] = False
            elif choice == 3:
                decoded["r"][0] = shapes + shapes if shapes and rng.random() < 0.5 else []
            elif choice == 4:
                decoded["r"][1] = [rng.choice([-1, -(2**63), 2**64 - 1, 1.5, "1", None, 2**65]),
                                   rng.choice([-5, 2**64 - 1, 0, "x"])]
            else:
                decoded["r"][1] = rng.choice([[1], [1, 2, 3], None, "x", {}])
            self.notes.append(f"{op}: result -> {_short(decoded['r'])}")
            try:
                return "payload", wire.pack(decoded)
            except (OverflowError, ValueError, TypeError):
                return None
        notes: list[str] = []
        original = decoded.get("r")
        for _ in range(rng.choice([1, 1, 2])):
            decoded = mutate_tree(rng, decoded, notes)
        self.notes.append(f"{op}: {'; '.join(notes)}")
        handle = decoded.get("r") if isinstance(decoded, dict) else None
        if isinstance(original, int) and not isinstance(original, bool) and isinstance(handle, int) \
                and not isinstance(handle, bool) and handle != original and handle >= 1:
            self.other_handle = True
        if op == "fenced_info" and isinstance(handle, list) and handle and type(handle[0]) is int \
                and 0 < handle[0] and handle[0] in set(ErrorStatus):
            self.status = handle[0]  # a well-formed status of the fenced execution: passed on
        try:
            return "payload", wire.pack(decoded)
        except (OverflowError, ValueError, TypeError):
            return None


class ClientFailure(Exception):
    """A property of the client broken: (class, detail)."""


def _scenarios() -> dict[str, Any]:
    """Public-API (and HAL) scenarios against the device ``device`` (an nnapi.Device):
    each returns normally when its answers were right, raises NnapiError / HalError as the
    runtime reports a failure, or ClientFailure when the answer was wrong."""
    import nnapi
    from nnapi.hal import FdPool, RequestArgument
    from nnapi.hal.types import DataLocation, Request
    from nnapi.runtime.model_builder import build_hal_model

    models = _models()

    def compiled(device, name="demo"):
        compilation = nnapi.Compilation(models[name][0], [device])
        compilation.finish()
        return compilation

    def check(expected, got, what):
        if not _close(expected, got):
            raise ClientFailure("wrong result", f"{what}: {got} (expected {expected})")

    def check_shapes(execution, expected, what):
        for index, value in enumerate(expected):
            dims = execution.get_output_operand_dimensions(index)
            if list(dims) != list(value.shape):
                raise ClientFailure("wrong result", f"{what}: output {index} dimensions {dims}, expected "
                                                    f"{list(value.shape)}")

    def compile_only(device, work):
        compiled(device, "quant8")

    def compute(device, work, name="demo"):
        _, inputs, expected, _ = models[name]
        compilation = compiled(device, name)
        execution, outputs = _execution(compilation, inputs, expected)
        execution.set_measure_timing(True)
        execution.compute()
        check(expected, outputs, f"{name} compute")
        check_shapes(execution, expected, f"{name} compute")
        for code in range(4):
            duration = execution.get_duration(code)
            if not isinstance(duration, int) or not 0 <= duration <= 2**64 - 1:
                raise ClientFailure("wrong result", f"get_duration({code}) = {duration!r}")

    def compute_quant(device, work):
        compute(device, work, "quant8")

    def compute_if(device, work):
        compute(device, work, "if")

    def shared(device, work):
        _, inputs, expected, _ = models["demo"]
        compilation = compiled(device)
        x = inputs[0]
        memory_in = nnapi.Memory.create_shared(x.nbytes)
        memory_out = nnapi.Memory.create_shared(64)
        np.frombuffer(memory_in.buffer, np.float32)[:] = x.reshape(-1)
        np.frombuffer(memory_out.buffer, np.uint8)[:] = 0xAB
        execution = nnapi.Execution(compilation)
        execution.set_input_from_memory(0, memory_in, 0, x.nbytes)
        execution.set_output_from_memory(0, memory_out, 0, 16)
        execution.compute()
        out = np.frombuffer(memory_out.buffer, np.uint8)
        if (out[16:] != 0xAB).any():
            raise ClientFailure("wrote past an output", f"bytes {np.flatnonzero(out[16:] != 0xAB)[:8] + 16}")
        check(expected, [np.frombuffer(memory_out.buffer, np.float32)[:4].reshape(1, 4)], "shared memory")

    def burst(device, work):
        _, inputs, expected, _ = models["demo"]
        compilation = compiled(device)
        burst = nnapi.Burst(compilation)
        for _ in range(2):
            execution, (y,) = _execution(compilation, inputs, expected)
            execution.burst_compute(burst)
            check(expected, [y], "burst")
            check_shapes(execution, expected, "burst")

    def reusable(device, work):
        _, inputs, expected, _ = models["demo"]
        compilation = compiled(device)
        execution, (y,) = _execution(compilation, inputs, expected)
        execution.set_reusable(True)
        for _ in range(3):
            y[:] = 0
            execution.compute()
            check(expected, [y], "reusable")
            check_shapes(execution, expected, "reusable")

    def asynchronous(device, work):
        _, inputs, expected, _ = models["demo"]
        compilation = compiled(device)
        for fenced in (False, True):
            execution, (y,) = _execution(compilation, inputs, expected)
            event = execution.start_compute_with_dependencies([]) if fenced else execution.start_compute()
            event.wait()
            check(expected, [y], "asynchronous")

    def device_memory(device, work):
        _, inputs, expected, _ = models["pool_constant"]
        compilation = compiled(device, "pool_constant")
        desc = nnapi.MemoryDesc()
        desc.add_input_role(compilation, 0)
        desc.add_output_role(compilation, 0)
        desc.finish()
        memory = nnapi.Memory.from_desc(desc)
        source = nnapi.Memory.create_shared(16)
        np.frombuffer(source.buffer, np.float32)[:] = inputs[0]
        nnapi.Memory.copy(source, memory)
        execution = nnapi.Execution(compilation)
        execution.set_input_from_memory(0, memory, 0, 0)
        y = np.zeros(4, np.float32)
        execution.set_output(0, y)
        execution.compute()
        check(expected, [y], "device memory")
        back = nnapi.Memory.create_shared(16)
        nnapi.Memory.copy(memory, back)
        check([inputs[0]], [np.frombuffer(back.buffer, np.float32).copy()], "device memory copied back")

    def caching(device, work):
        _, inputs, expected, _ = models["quant8"]
        cache = tempfile.mkdtemp(dir=work)
        for _ in range(2):
            compilation = nnapi.Compilation(models["quant8"][0], [device])
            compilation.set_caching(cache, b"\x05" * 32)
            compilation.finish()
            check(expected, _compute(compilation, inputs, expected), "cached compilation")

    def hal_fenced(device, work):
        from nnapi.hal import ErrorStatus, HalError

        hal = device._hal
        prepared = hal.prepare_model(build_hal_model(models["quant8"][0])[0])
        pools, fds = [], []
        for values in ([12, 14, 16, 200], [10, 11, 30, 40], [0, 0, 0, 0]):
            fd = os.memfd_create("fuzz-pool", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
            os.ftruncate(fd, 4096)
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, _SEALS)
            os.pwrite(fd, bytes(values), 0)
            pools.append(FdPool(fd, 0, 4096, True))
            fds.append(fd)
        fence = os.eventfd(1, os.EFD_CLOEXEC)
        try:
            request = Request([RequestArgument(False, DataLocation(0, 0, 4), []),
                               RequestArgument(False, DataLocation(1, 0, 4), [])],
                              [RequestArgument(False, DataLocation(2, 0, 4), [])], pools)
            done, callback = prepared.execute_fenced(request, [fence], True)
            if done is not None:
                fds.append(done)  # ours to close
                poller = select.poll()
                poller.register(done, select.POLLIN)
                poller.poll(REPLY_TIMEOUT_S * 1000)
            status, launched, fenced = callback.get_execution_info()
            if not isinstance(status, ErrorStatus):
                raise ClientFailure("wrong result", f"get_execution_info status {status!r}")
            if status != ErrorStatus.NONE:
                raise HalError(status, "the fenced execution failed")
            got = np.frombuffer(os.pread(fds[2], 4, 0), np.uint8)
            check([models["quant8"][2][0].reshape(-1)], [got], "HAL fenced")
        finally:
            for fd in (*fds, fence):
                os.close(fd)

    return {"compile": compile_only, "compute": compute, "compute quant8": compute_quant, "compute IF": compute_if,
            "shared memory": shared, "burst": burst, "reusable": reusable, "asynchronous": asynchronous,
            "device memory": device_memory, "caching": caching, "HAL fenced": hal_fenced}


def _run_client_case(path: str, scenario, work: str) -> tuple[str, str]:
    """Connect to the proxy, run ``scenario``: (outcome class, detail)."""
    import nnapi
    from nnapi.drivers.service.client import connect_devices
    from nnapi.hal import HalError
    from nnapi.runtime import manager

    try:
        hal_devices = connect_devices(path)
    except HalError as error:
        if INTERNAL.search(str(error)):
            return "python exception text", f"connect: {error}"
        return f"discovery refused: {error.status.name}", str(error)
    except Exception as error:  # noqa: BLE001 - what this fuzzer looks for
        return f"raw {type(error).__name__}", f"connect: {error}"
    if not hal_devices:
        return "discovery found no devices", ""
    names = []
    try:
        hal_devices[0]._link.timeout_s = CLIENT_TIMEOUT_S
        manager.register_device(hal_devices[0])  # (a mutated hello may name a device twice)
        names.append(hal_devices[0].name)
        device = next(d for d in nnapi.get_devices() if d.name == hal_devices[0].name)
        try:
            scenario(device, work)
        except ClientFailure as failure:
            return failure.args[0], failure.args[1]
        except nnapi.NnapiError as error:
            if INTERNAL.search(str(error)):
                return "python exception text", f"{error.code.name}: {error}"
            return f"error {error.code.name}", str(error)
        except HalError as error:
            if INTERNAL.search(str(error)):
                return "python exception text", f"HAL {error.status.name}: {error}"
            return f"HAL error {error.status.name}", str(error)
        except Exception as error:  # noqa: BLE001 - what this fuzzer looks for
            import traceback

            return f"raw {type(error).__name__}", f"{error}\n{traceback.format_exc()[-1500:]}"
        return "ok", ""
    finally:
        for name in names:
            manager.unregister_device(name)
        for hal in hal_devices:
            hal._link._drop()
        # nnapi.device keeps a Device for every HAL device it has seen, registered or not,
        # so a link made per case lives on: let go of its free staging arenas here
        link = hal_devices[0]._link
        while link._arenas:
            link._arenas.pop().close()


def _descriptor_kinds() -> dict[str, int]:
    kinds: collections.Counter[str] = collections.Counter()
    for fd in os.listdir("/proc/self/fd"):
        try:
            kinds[os.readlink(f"/proc/self/fd/{fd}").split(":")[0].split("[")[0]] += 1
        except OSError:
            pass
    return dict(kinds)


def fuzz_to_client(cases: int, seed: int, work: str, verbose: bool = False, driver: str = "reference",
                   log=print) -> tuple[collections.Counter, list[str]]:
    """``cases`` scenarios each with one mutated reply; (count per outcome, bug reports)."""
    from nnapi.hal import ErrorStatus

    rng = random.Random(seed)
    service = ServiceProcess(os.path.join(work, "upstream.sock"), driver)
    mutator = ReplyMutator()
    proxy = Proxy(os.path.join(work, "mitm.sock"), service.path, on_reply=mutator)
    counts: collections.Counter[str] = collections.Counter()
    bugs: list[str] = []
    scenarios = _scenarios()
    try:
        # each scenario once unmutated: how many replies it takes, and that it is right
        lengths = {}
        for name, scenario in scenarios.items():
            mutator.arm(rng, -1)
            outcome, detail = _run_client_case(proxy.path, scenario, work)
            if outcome != "ok":
                raise RuntimeError(f"scenario {name} fails unmutated: {outcome}: {detail}")
            lengths[name] = mutator.count
        log(f"scenarios (replies each): {lengths}")
        gc.collect()
        descriptors = len(os.listdir("/proc/self/fd"))
        for case in range(cases):
            name = rng.choice(sorted(scenarios))
            mutator.arm(random.Random(rng.random()), rng.randrange(lengths[name]))
            start = time.monotonic()
            outcome, detail = _run_client_case(proxy.path, scenarios[name], work)
            elapsed = time.monotonic() - start
            what = f"case {case}: {name}, reply {mutator.target} ({'; '.join(mutator.notes) or 'not reached'})"
            bug = outcome.startswith(("raw", "wrong", "python", "wrote"))
            if outcome.startswith("discovery refused: ") and mutator.notes:
                status = outcome.split()[2]
                allowed = {"GENERAL_FAILURE", "DEAD_OBJECT"}
                if mutator.status is not None:
                    allowed.add(ErrorStatus(mutator.status).name)
                if status not in allowed:
                    outcome, bug = f"wrong status {status}", True
            if outcome.startswith("error ") and mutator.notes:
                code = outcome.split()[1]
                allowed = {"OP_FAILED", "DEAD_OBJECT"}
                if mutator.status is not None:
                    allowed.add(ErrorStatus(mutator.status).to_result_code().name)
                if code == "BAD_DATA" and "supports operation" in detail:
                    # a device that cannot say what it supports supports nothing (the runtime's
                    # rule, as Android's): with the device named explicitly, finish is BAD_DATA
                    allowed.add(code)
                if mutator.other_handle:
                    allowed.add("BAD_DATA")
                if code not in allowed:
                    outcome, bug = f"wrong code {code}", True
            elif outcome.startswith("HAL error ") and mutator.notes:
                status = outcome.split()[2]
                allowed = {"GENERAL_FAILURE", "DEAD_OBJECT"}
                if mutator.status is not None:
                    allowed.add(ErrorStatus(mutator.status).name)
                if mutator.other_handle:
                    allowed.add("INVALID_ARGUMENT")
                if status not in allowed:
                    outcome, bug = f"wrong status {status}", True
            if outcome.startswith("error ") and not mutator.notes:
                if "stopped answering" in detail:  # a busy machine, before anything was mutated
                    outcome = "timed out before the mutation"
                else:
                    outcome, bug = f"failed unmutated ({outcome})", True
            if elapsed > CLIENT_TIMEOUT_S * 3 + 6:
                counts["slow"] += 1
                bugs.append(f"slow ({elapsed:.1f} s): {what}")
            counts[outcome] += 1
            if bug:
                bugs.append(f"{outcome}: {what}: {detail[:1500]}")
                if verbose:
                    log(f"BUG {bugs[-1]}")
            elif verbose:
                log(f"{outcome}: {what} {detail[:150]}")
            if not service.alive:
                bugs.append(f"the upstream service died at {what}")
                break
            if case % 50 == 49:
                gc.collect()
                now = len(os.listdir("/proc/self/fd"))
                if now > descriptors + 100:
                    counts["descriptor leak"] += 1
                    bugs.append(f"descriptor leak: {now - descriptors} more open after {what}: {_descriptor_kinds()}, "
                                f"{threading.active_count()} threads")
                    descriptors = now
    finally:
        proxy.stop()
        service.stop()
    return counts, bugs


# --- the command line ------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=1000, help="mutations per direction (default 1000)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--direction", choices=["both", "to-service", "to-client"], default="both")
    parser.add_argument("--driver", default="reference", help="the driver the service hosts (default reference)")
    parser.add_argument("--show", type=int, default=20, help="bug reports printed per direction (default 20)")
    parser.add_argument("-v", "--verbose", action="store_true", help="print every case")
    args = parser.parse_args(argv)
    try:
        import msgpack  # noqa: F401
    except ImportError as error:
        print(f"fuzz_service.py needs nnapi[service] (pip install -e '.[service]'): {error}", file=sys.stderr)
        return 2
    failed = False
    with tempfile.TemporaryDirectory(prefix="nnapi-fuzz-service-") as work:
        directions = ["to-service", "to-client"] if args.direction == "both" else [args.direction]
        for direction in directions:
            start = time.monotonic()
            run = fuzz_to_service if direction == "to-service" else fuzz_to_client
            counts, bugs = run(args.cases, args.seed, work, args.verbose, args.driver)
            print(f"{direction}: {sum(counts.values())} cases in {time.monotonic() - start:.1f} s, "
                  f"{len(bugs)} bugs")
            for outcome, count in sorted(counts.items(), key=lambda item: (-item[1], item[0])):
                print(f"  {count:7d}  {outcome}")
            for report in bugs[:args.show]:
                print(f"  BUG {report}")
            failed = failed or bool(bugs)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
