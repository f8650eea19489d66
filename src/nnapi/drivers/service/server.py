"""The driver service: hosts a driver's devices in this process and serves clients over a
Unix socket (``nnapi serve --driver DRIVER --socket PATH``).

One thread per client connection; everything a client creates (mapped pools, prepared
models, bursts, device buffers) lives in that connection's session and is named by
numbers local to it, so no client can reach another's memory or models. Every message is
decoded with the strict checks of ``wire`` and HAL validation before a driver sees it; a
message that breaks the schema gets an INVALID_ARGUMENT reply, a broken stream (bad magic,
oversized, truncated, missing descriptors) closes that connection only. A driver's own
exception becomes GENERAL_FAILURE; nothing a client sends can stop the service.
"""

from __future__ import annotations

import ctypes
import fcntl
import mmap
import os
import select
import signal
import socket
import stat
import threading
import time
from collections.abc import Callable
from typing import Any

from nnapi.drivers.service import channel as fast
from nnapi.drivers.service import wire
from nnapi.drivers.service.wire import WireError, get_bool, get_int, get_list, get_map, get_opt_int
from nnapi.hal import ErrorStatus, ExecutionPreference, HalError, IDevice, Priority, Timing, serialize
from nnapi.hal import Model as HalModel
from nnapi.hal.validation import validate_model, validate_request
from nnapi.runtime import capabilities

_MAX_HANDLES = 1 << 16
#: Decoded, validated requests a session keeps, keyed by their packed bytes.
_MAX_CACHED_REQUESTS = 256
#: Largest packed request blob (its descriptors and arguments, not tensor data).
_MAX_REQUEST_BYTES = 1 << 20
#: Fenced executions of one client waiting for their fences at once (a thread each).
_MAX_PENDING_FENCED = 64


class _Session:
    """One client's objects."""

    def __init__(self) -> None:
        self.pools: dict[int, tuple[mmap.mmap, memoryview]] = {}
        self.prepared: dict[int, tuple[Any, Any]] = {}  # handle -> (IPreparedModel, HAL model)
        self.bursts: dict[int, Any] = {}
        self.buffers: dict[int, tuple[Any, int, int]] = {}  # client token -> (IBuffer, driver token, device)
        #: handle -> the driver's IExecution: a request bound once (``bind``), run by ``run``
        self.executions: dict[int, Any] = {}
        #: (id of the model validated against, its device, packed request) -> the decoded, validated
        #: Request; emptied whenever a pool, buffer or model it could name goes away.
        self.requests: dict[tuple[int, int | None, bytes], Any] = {}
        #: prepared model / burst handle -> its device's index: device memory is only ever
        #: named in requests to the device that allocated it
        self.device_of: dict[int, int] = {}
        #: the shared-memory channel (``channel`` message) and the last request number seen on it
        self.channel: fast.Channel | None = None
        self.channel_seq = 0
        #: fenced executions run by worker threads: handle -> None while running, then
        #: [status, launched timing, fenced timing]
        self.fenced: dict[int, list | None] = {}
        #: set when the client is gone: workers still waiting for fences give up
        self.closed = threading.Event()
        self._next = 1

    def add(self, table: dict, value: Any) -> int:
        if len(table) >= _MAX_HANDLES:
            raise HalError(ErrorStatus.RESOURCE_EXHAUSTED_PERSISTENT, "too many objects in this session")
        handle = self._next
        self._next += 1
        table[handle] = value
        return handle

    def close(self) -> None:
        self.closed.set()
        for mapping, view in self.pools.values():
            view.release()
            try:
                mapping.close()
            except BufferError:
                pass  # a driver still holds a view; the mapping goes with it
        self.pools.clear()
        self.prepared.clear()
        self.bursts.clear()
        self.buffers.clear()
        self.executions.clear()
        self.requests.clear()
        self.device_of.clear()
        self.fenced.clear()
        if self.channel is not None:
            self.channel.close()
            self.channel = None


def _map_pool(fd: int, writable: bool) -> tuple[mmap.mmap, memoryview]:
    """Map a client's memfd. It must be sealed against shrinking (F_SEAL_SHRINK), or the
    client could truncate it under our mapping and crash us with SIGBUS."""
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise WireError("a pool must be a memfd")
        seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
    except OSError as error:
        raise WireError(f"a pool must be a sealed memfd ({error.strerror})") from None
    if not seals & fcntl.F_SEAL_SHRINK:
        raise WireError("a pool's memfd must be sealed with F_SEAL_SHRINK")
    if info.st_size <= 0:
        raise WireError("an empty pool")
    if writable and seals & fcntl.F_SEAL_WRITE:
        raise WireError("a writable pool is sealed against writing")
    prot = mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0)
    try:
        mapping = mmap.mmap(fd, info.st_size, mmap.MAP_SHARED, prot)
    except (OSError, ValueError) as error:
        raise WireError(f"cannot map the pool: {error}") from None
    return mapping, memoryview(mapping)


class Service:
    """Serves ``devices`` on the Unix socket ``path``."""

    def __init__(self, devices: list[IDevice], path: str) -> None:
        if not devices:
            raise ValueError("no devices to serve")
        self.devices = devices
        self.path = path
        self._listener: socket.socket | None = None
        self._stopping = threading.Event()
        self._connections: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._handlers: dict[str, Callable] = {
            "hello": self._hello, "supported": self._supported, "reasons": self._reasons,
            "prepare": self._prepare, "prepare_cache": self._prepare_from_cache, "execute": self._execute,
            "burst": self._burst, "burst_execute": self._burst_execute, "release": self._release,
            "map": self._map, "forget": self._forget, "allocate": self._allocate, "copy_to": self._copy_to,
            "copy_from": self._copy_from, "wait": self._wait,
            "bind": self._bind, "run": self._run, "channel": self._channel,
            "execute_fenced": self._execute_fenced, "fenced_info": self._fenced_info,
        }

    # --- lifecycle -------------------------------------------------------------------------
    def bind(self) -> None:
        if os.path.exists(self.path):
            # A socket left by a service that died; refuse to clobber anything else.
            if not stat.S_ISSOCK(os.stat(self.path).st_mode):
                raise OSError(f"{self.path} exists and is not a socket")
            probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                probe.connect(self.path)
            except OSError:
                os.unlink(self.path)
            else:
                probe.close()
                raise OSError(f"a service is already listening on {self.path}")
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(self.path)
        os.chmod(self.path, 0o600)  # only this user's processes may connect
        listener.listen(64)
        self._listener = listener

    def serve_forever(self) -> None:
        if self._listener is None:
            self.bind()
        assert self._listener is not None
        try:
            while not self._stopping.is_set():
                try:
                    connection, _ = self._listener.accept()
                except OSError:
                    if self._stopping.is_set():
                        break
                    raise
                thread = threading.Thread(target=self._serve_connection, args=(connection,), daemon=True)
                thread.start()
        finally:
            self.close()

    def stop(self) -> None:
        self._stopping.set()
        if self._listener is not None:
            try:
                self._listener.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self._listener.close()

    def close(self) -> None:
        self._stopping.set()
        if self._listener is not None:
            self._listener.close()
            try:
                os.unlink(self.path)
            except OSError:
                pass
            self._listener = None
        with self._lock:
            for connection in list(self._connections):
                try:
                    connection.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    # --- one client ------------------------------------------------------------------------
    def _serve_connection(self, connection: socket.socket) -> None:
        with self._lock:
            self._connections.add(connection)
        reader = wire.FrameReader(connection)
        session = _Session()
        greeted = False
        try:
            while True:
                channel = session.channel
                if channel is not None and not reader.buffered:
                    if channel.poller is None:
                        channel.watch(connection.fileno())
                    if self._next_on_channel(channel, session):
                        if not self._channel_message(channel, session, connection):
                            return  # a broken channel: drop this client only
                        continue
                try:
                    payload, fds = reader.read()
                except (EOFError, wire.ProtocolError, OSError):
                    return  # closed, or a broken stream: drop this client only
                try:
                    reply, keep_going = self._handle(payload, fds, session, greeted)
                finally:
                    for fd in fds:
                        wire._close_quietly(fd)
                if reply.get("ok") and reply.get("op") == "hello":
                    greeted = True
                reply.pop("op", None)
                try:
                    wire.send_frame(connection, wire.pack(reply))
                except OSError:
                    return
                if not keep_going:
                    return
        finally:
            reader.close()
            session.close()
            with self._lock:
                self._connections.discard(connection)
            connection.close()

    @staticmethod
    def _next_on_channel(channel: fast.Channel, session: _Session) -> bool:
        """Wait for the next message: True when one is in the channel, False when the
        socket has something (a frame, or the client gone). Spins briefly, then sleeps."""
        seen = session.channel_seq
        if channel.spin(fast.REQUEST_SEQ, seen):
            return True
        while True:
            _, ready = channel.sleep(None)
            if channel.words[fast.REQUEST_SEQ] != seen:
                return True
            if ready:
                return False

    def _channel_message(self, channel: fast.Channel, session: _Session, connection: socket.socket) -> bool:
        """Handle the request in the channel and put the reply there (or, too large for
        the slot, on the socket); False when the channel is broken (a sequence number
        other than the next, a length beyond the slot)."""
        words = channel.words
        seq = words[fast.REQUEST_SEQ]
        length = words[fast.REQUEST_LEN]
        if seq != session.channel_seq + 1 or length > channel.capacity:
            return False
        session.channel_seq = seq
        # copied out first: the client may change the slot while we look at it
        payload = bytes(channel.request_slot[:length])
        reply, keep_going = self._handle(payload, (), session, True)
        reply.pop("op", None)
        data = wire.pack(reply)
        if len(data) <= channel.capacity:
            channel.reply_slot[:len(data)] = data
            words[fast.REPLY_LEN] = len(data)
        else:
            try:
                wire.send_frame(connection, data)
            except OSError:
                return False
            words[fast.REPLY_LEN] = fast.ON_SOCKET
        words[fast.REPLY_SEQ] = seq
        channel.ring()
        return keep_going

    def _handle(self, payload: bytes, fds: list[int], session: _Session, greeted: bool) -> tuple[dict, bool]:
        message_id = 0
        try:
            message = wire.unpack(payload)
            message_id = get_int(message.get("id", 0), "id", 0, (1 << 63) - 1)
            version = get_int(message.get("v"), "version")
            op = message.get("op")
            if version != wire.PROTOCOL_VERSION:
                raise WireError(f"protocol version {version} is not {wire.PROTOCOL_VERSION}")
            handler = self._handlers.get(op) if isinstance(op, str) else None
            if handler is None:
                raise WireError(f"unknown operation {op!r}")
            if not greeted and op != "hello":
                raise WireError(f"{op} before hello")
            result = handler(get_map(message.get("a", {}), "arguments"), fds, session)
            return {"v": wire.PROTOCOL_VERSION, "id": message_id, "ok": True, "r": result, "op": op}, True
        except HalError as error:
            return {"v": wire.PROTOCOL_VERSION, "id": message_id, "ok": False, "status": int(error.status),
                    "msg": str(error), "shapes": wire.encode_shapes(error.output_shapes)}, True
        except Exception as error:  # a driver's own failure, contained
            return {"v": wire.PROTOCOL_VERSION, "id": message_id, "ok": False,
                    "status": int(ErrorStatus.GENERAL_FAILURE), "msg": f"{type(error).__name__}: {error}",
                    "shapes": []}, True

    # --- helpers ---------------------------------------------------------------------------
    def _device(self, args: dict) -> IDevice:
        return self.devices[self._device_index(args)]

    def _device_index(self, args: dict) -> int:
        return get_int(args.get("dev"), "dev", 0, len(self.devices) - 1)

    @staticmethod
    def _fd(fds: list[int], value: Any, what: str) -> int:
        return fds[get_int(value, what, 0, len(fds) - 1)] if fds else _no_fd(what)

    @staticmethod
    def _pool(session: _Session, ref: Any, device: int | None = None) -> Any:
        """A pool reference: [0, pool id, offset, size] (mapped memory) or [1, token] (device
        memory, only for a request to ``device``, the one that allocated it)."""
        entry = get_list(ref, "pool")
        kind = get_int(entry[0] if entry else None, "pool kind", 0, 1)
        if kind == 1:
            token = get_int(entry[1] if len(entry) > 1 else None, "buffer token", 1, (1 << 32) - 1)
            if token not in session.buffers:
                raise WireError(f"unknown device memory {token}")
            from nnapi.hal.types import BufferToken

            _, driver_token, owner = session.buffers[token]
            if device is None or owner != device:
                raise HalError(ErrorStatus.INVALID_ARGUMENT, f"device memory {token} belongs to another device")
            return BufferToken(driver_token)
        _, pool_id, offset, size = get_list(entry, "pool", 4)
        pool_id = get_int(pool_id, "pool id", 0)
        if pool_id not in session.pools:
            raise WireError(f"unknown pool {pool_id}")
        view = session.pools[pool_id][1]
        offset, size = get_int(offset, "pool offset", 0), get_int(size, "pool size", 0)
        if offset + size > len(view):
            raise WireError(f"pool {pool_id}: [{offset}, {offset + size}) outside its {len(view)} bytes")
        return view[offset: offset + size]

    def _model(self, args: dict, session: _Session):
        """The model of a message, decoded by hal.serialize (the plain-data form every
        transport shares); a large constant blob comes as mapped memory, not bytes."""
        plain = get_map(args.get("model"), "model")
        values = plain.get("operand_values")
        mapped = None
        if not isinstance(values, bytes):
            mapped = self._pool(session, values)
            if not isinstance(mapped, memoryview):
                raise WireError("constant values must be bytes or mapped memory")
            plain = dict(plain, operand_values=b"")
        model = serialize.model_from_plain(plain, lambda ref: self._pool(session, ref))
        if mapped is not None:
            model.operand_values = mapped
        validate_model(model)
        return model

    def _prepared(self, session: _Session, value: Any) -> tuple[Any, Any]:
        handle = get_int(value, "prepared model", 0)
        if handle not in session.prepared:
            raise WireError(f"unknown prepared model {handle}")
        return session.prepared[handle]

    def _request(self, args: dict, session: _Session, model, device: int | None):
        """The request of an execution message: decoded and validated the first time its
        packed bytes are seen in this session, then reused (a burst's or a reusable
        execution's request repeats byte for byte)."""
        raw = wire.get_bytes(args.get("r"), "request")
        key = (id(model), device, raw)
        request = session.requests.get(key)
        if request is not None:
            return request
        if len(raw) > _MAX_REQUEST_BYTES:
            raise WireError(f"a request of {len(raw)} bytes exceeds {_MAX_REQUEST_BYTES}")
        pools_v, inputs_v, outputs_v = get_list(wire.unpack(raw, list), "request", 3)
        pools = [self._pool(session, p, device) for p in get_list(pools_v, "request pools", limit=wire.MAX_FDS)]
        request = wire.decode_request(inputs_v, outputs_v, pools)
        if model is not None:
            validate_request(request, model)
        if len(session.requests) >= _MAX_CACHED_REQUESTS:
            session.requests.clear()
        session.requests[key] = request
        return request

    @staticmethod
    def _timing_args(args: dict) -> tuple[bool, int | None, int | None]:
        return (get_bool(args.get("timing", False), "timing"),
                get_opt_int(args.get("deadline"), "deadline", 0),
                get_opt_int(args.get("loop"), "loop timeout", 0))

    # --- operations ------------------------------------------------------------------------
    def _hello(self, args: dict, fds: list[int], session: _Session) -> dict:
        version = get_int(args.get("v"), "client version")
        if version != wire.PROTOCOL_VERSION:
            raise WireError(f"client speaks protocol {version}, this service {wire.PROTOCOL_VERSION}")
        devices = []
        for device in self.devices:
            # capabilities as the runtime validated them: a hosted driver's malformed
            # answer is "no performance information", not a hello the client refuses
            cache = device.get_number_of_cache_files_needed() if hasattr(
                device, "get_number_of_cache_files_needed") else (0, 0)
            extensions = device.get_supported_extensions() if hasattr(device, "get_supported_extensions") else []
            devices.append({
                "name": device.name, "version": device.version_string, "type": int(device.device_type),
                "level": int(device.feature_level), "caps": wire.encode_capabilities(capabilities.of(device)),
                "cache": [int(cache[0]), int(cache[1])],
                "ext": [[e.name, [[int(t.type), bool(t.is_tensor), int(t.byte_size)] for t in e.operand_types]]
                        for e in extensions],
            })
        return {"devices": devices, "pid": os.getpid()}

    def _supported(self, args: dict, fds: list[int], session: _Session) -> list[bool]:
        model = self._model(args, session)
        return [bool(flag) for flag in self._device(args).get_supported_operations(model)]

    def _reasons(self, args: dict, fds: list[int], session: _Session) -> list:
        device = self._device(args)
        model = self._model(args, session)
        if hasattr(device, "get_unsupported_reasons"):
            return [None if r is None else str(r) for r in device.get_unsupported_reasons(model)]
        return [None if ok else "declined by the driver" for ok in device.get_supported_operations(model)]

    def _cache_fds(self, args: dict, fds: list[int]) -> tuple[list[int], list[int]]:
        """The cache files of a message: regular files only (a pipe or socket would block
        the driver reading it, a device file is no cache)."""
        model_cache = [self._fd(fds, i, "model cache") for i in get_list(args.get("mc", []), "model cache", limit=64)]
        data_cache = [self._fd(fds, i, "data cache") for i in get_list(args.get("dc", []), "data cache", limit=64)]
        for fd in (*model_cache, *data_cache):
            try:
                regular = stat.S_ISREG(os.fstat(fd).st_mode)
            except OSError:
                regular = False
            if not regular:
                raise WireError("a cache file must be a regular file")
        return model_cache, data_cache

    def _prepare(self, args: dict, fds: list[int], session: _Session) -> int:
        device = self._device(args)
        model = self._model(args, session)
        preference = ExecutionPreference(get_int(args.get("pref", 1), "preference", 0, 2))
        priority = Priority(get_int(args.get("prio", 1), "priority", 0, 2))
        deadline = get_opt_int(args.get("deadline"), "deadline", 0)
        model_cache, data_cache = self._cache_fds(args, fds)
        token = wire.get_token(args.get("token"), "token", allow_none=True)
        if model_cache or data_cache or token is not None:
            prepared = device.prepare_model(model, preference, priority, deadline, model_cache=model_cache,
                                            data_cache=data_cache, token=token)
        else:
            prepared = device.prepare_model(model, preference, priority, deadline)
        handle = session.add(session.prepared, (prepared, model))
        session.device_of[handle] = self._device_index(args)
        return handle

    def _prepare_from_cache(self, args: dict, fds: list[int], session: _Session) -> int:
        device = self._device(args)
        model_cache, data_cache = self._cache_fds(args, fds)
        token = wire.get_token(args.get("token"), "token")
        deadline = get_opt_int(args.get("deadline"), "deadline", 0)
        if not hasattr(device, "prepare_model_from_cache"):
            raise HalError(ErrorStatus.GENERAL_FAILURE, "compilation caching not supported")
        prepared = device.prepare_model_from_cache(model_cache, data_cache, token, deadline)
        # The cache came from the client: the model the driver rebuilt from it (where the
        # driver shows it) is validated as a prepared one is, and requests are checked
        # against it; a driver that keeps none validates requests alone (as it must anyway).
        model = getattr(prepared, "model", None)
        if isinstance(model, HalModel):
            try:
                validate_model(model)
            except HalError as error:
                raise HalError(ErrorStatus.GENERAL_FAILURE, f"the model in the cache is invalid: {error}") from None
        else:
            model = None
        handle = session.add(session.prepared, (prepared, model))
        session.device_of[handle] = self._device_index(args)
        return handle

    def _execute(self, args: dict, fds: list[int], session: _Session) -> list:
        prepared, model = self._prepared(session, args.get("h"))
        request = self._request(args, session, model, session.device_of.get(get_int(args.get("h"), "handle", 0)))
        timing, deadline, loop = self._timing_args(args)
        if deadline is not None and time.monotonic_ns() > deadline:
            raise HalError(ErrorStatus.MISSED_DEADLINE_TRANSIENT, "deadline passed before the service got the request")
        shapes, measured = prepared.execute(request, timing, deadline, loop)
        return [wire.encode_shapes(shapes), wire.encode_timing(measured)]

    def _burst(self, args: dict, fds: list[int], session: _Session) -> int:
        prepared, model = self._prepared(session, args.get("h"))
        handle = session.add(session.bursts, (prepared.configure_burst(), model))
        session.device_of[handle] = session.device_of.get(get_int(args.get("h"), "handle", 0), -1)
        return handle

    def _burst_execute(self, args: dict, fds: list[int], session: _Session) -> list:
        handle = get_int(args.get("b"), "burst", 0)
        if handle not in session.bursts:
            raise WireError(f"unknown burst {handle}")
        burst, model = session.bursts[handle]
        request = self._request(args, session, model, session.device_of.get(handle))
        timing, deadline, loop = self._timing_args(args)
        shapes, measured = burst.execute(request, timing, deadline, loop)
        return [wire.encode_shapes(shapes), wire.encode_timing(measured)]

    def _execute_fenced(self, args: dict, fds: list[int], session: _Session) -> int:
        """IPreparedModel::executeFenced with fences to wait for: {"h", "r", "timing",
        "deadline", "loop", "after": timeout after the fences, "w": fence descriptor
        indexes, "done": the eventfd to signal when finished}. The request is checked now
        (an error is this message's reply); a worker thread waits for the fences and runs
        it, so this connection goes on serving (the fences may be signalled by work the
        client sends next). Returns the handle ``fenced_info`` reports on."""
        handle_v = get_int(args.get("h"), "handle", 0)
        prepared, model = self._prepared(session, handle_v)
        request = self._request(args, session, model, session.device_of.get(handle_v))
        timing, deadline, loop = self._timing_args(args)
        after = get_opt_int(args.get("after"), "timeout after fences", 0)
        waits = [self._fd(fds, i, "sync fence") for i in get_list(args.get("w"), "sync fences", limit=64)]
        done = self._fd(fds, args.get("done"), "done fence")
        if not fast.is_eventfd(done):
            raise WireError("the done fence must be an eventfd")
        if sum(1 for result in session.fenced.values() if result is None) >= _MAX_PENDING_FENCED:
            raise HalError(ErrorStatus.RESOURCE_EXHAUSTED_TRANSIENT, "too many fenced executions waiting")
        handle = session.add(session.fenced, None)
        owned: list[int] = []  # our copies: the message's descriptors are closed after it
        try:
            for fd in (*waits, done):
                owned.append(os.dup(fd))
            os.set_blocking(owned[-1], False)
            threading.Thread(target=_run_fenced, daemon=True, name=f"fenced-{handle}",
                             args=(session, handle, prepared, request, timing, deadline, loop, after, owned[:-1],
                                   owned[-1])).start()
        except (OSError, RuntimeError) as error:
            session.fenced.pop(handle, None)
            for fd in owned:
                wire._close_quietly(fd)
            raise HalError(ErrorStatus.RESOURCE_EXHAUSTED_TRANSIENT,
                           f"cannot start the fenced execution: {error}") from None
        return handle

    def _fenced_info(self, args: dict, fds: list[int], session: _Session) -> list:
        """IFencedExecutionCallback::getExecutionInfo: [status, launched timing, fenced
        timing]. Never waits: the client asks once the done fence is signalled."""
        handle = get_int(args.get("f"), "fenced execution", 0)
        if handle not in session.fenced:
            raise WireError(f"unknown fenced execution {handle}")
        result = session.fenced[handle]
        if result is None:
            raise HalError(ErrorStatus.GENERAL_FAILURE, "the fenced execution has not finished")
        return result

    def _bind(self, args: dict, fds: list[int], session: _Session) -> int:
        """IPreparedModel / IBurst createReusableExecution: the request is decoded and
        validated once and handed to the driver to bind; ``run`` then names it by number.
        Arguments: {"h": prepared model} or {"b": burst}, "r", "timing", "loop"."""
        if args.get("b") is not None:
            handle = get_int(args.get("b"), "burst", 0)
            if handle not in session.bursts:
                raise WireError(f"unknown burst {handle}")
            source, model = session.bursts[handle]
        else:
            handle = get_int(args.get("h"), "handle", 0)
            source, model = self._prepared(session, handle)
        request = self._request(args, session, model, session.device_of.get(handle))
        timing = get_bool(args.get("timing", False), "timing")
        loop = get_opt_int(args.get("loop"), "loop timeout", 0)
        create = getattr(source, "create_reusable_execution", None)
        execution = (create(request, timing, loop) if create is not None
                     else _Bound(source.execute, request, timing, loop))
        return session.add(session.executions, execution)

    def _run(self, args: dict, fds: list[int], session: _Session) -> list:
        """IExecution::executeSynchronously of a bound request: {"x": handle, "deadline"}."""
        handle = get_int(args.get("x"), "execution", 0)
        execution = session.executions.get(handle)
        if execution is None:
            raise WireError(f"unknown execution {handle}")
        deadline = get_opt_int(args.get("deadline"), "deadline", 0)
        if deadline is not None and time.monotonic_ns() > deadline:
            raise HalError(ErrorStatus.MISSED_DEADLINE_TRANSIENT, "deadline passed before the service got the request")
        shapes, measured = execution.execute(deadline)
        return [wire.encode_shapes(shapes), wire.encode_timing(measured)]

    def _release(self, args: dict, fds: list[int], session: _Session) -> None:
        tables = {"prepared": session.prepared, "burst": session.bursts, "buffer": session.buffers,
                  "execution": session.executions, "fenced": session.fenced}
        kind = wire.get_str(args.get("kind"), "release kind", 16)
        if kind not in tables:
            raise WireError(f"release kind: {kind!r} is not one of {', '.join(tables)}")
        handle = get_int(args.get("h"), "handle", 0)
        tables[kind].pop(handle, None)
        if kind not in ("buffer", "fenced"):
            session.device_of.pop(handle, None)
        session.requests.clear()

    def _map(self, args: dict, fds: list[int], session: _Session) -> None:
        """Register pools: [[pool id, descriptor index, writable], ...]."""
        session.requests.clear()
        for entry in get_list(args.get("pools"), "pools", limit=wire.MAX_FDS):
            pool_id, index, writable = get_list(entry, "pool", 3)
            pool_id = get_int(pool_id, "pool id", 0)
            if pool_id in session.pools:
                raise WireError(f"pool {pool_id} is already mapped")
            if len(session.pools) >= _MAX_HANDLES:
                raise HalError(ErrorStatus.RESOURCE_EXHAUSTED_PERSISTENT, "too many pools")
            session.pools[pool_id] = _map_pool(self._fd(fds, index, "pool"), get_bool(writable, "writable"))

    def _forget(self, args: dict, fds: list[int], session: _Session) -> None:
        session.requests.clear()  # their views would keep the mappings alive
        for pool_id in wire.get_ints(args.get("pools"), "pools", 0):
            entry = session.pools.pop(pool_id, None)
            if entry is not None:
                entry[1].release()
                try:
                    entry[0].close()
                except BufferError:
                    pass

    def _allocate(self, args: dict, fds: list[int], session: _Session) -> int:
        from nnapi.hal.types import BufferDesc, BufferRole

        device_index = self._device_index(args)
        device = self.devices[device_index]
        handles = get_list(args.get("prepared"), "prepared models", limit=_MAX_HANDLES)
        prepared = [self._prepared(session, h)[0] for h in handles]
        if any(session.device_of.get(h) != device_index for h in handles):
            raise HalError(ErrorStatus.INVALID_ARGUMENT, "allocate: a prepared model of another device")

        def roles(value: Any, what: str) -> list:
            result = []
            for entry in get_list(value, what):
                model_index, io_index, probability = get_list(entry, what, 3)
                result.append(BufferRole(get_int(model_index, f"{what} model", 0, len(prepared) - 1),
                                         get_int(io_index, f"{what} index", 0, 1 << 32),
                                         wire.get_float(probability, f"{what} probability")))
            return result

        desc = BufferDesc(wire.get_ints(args.get("dims"), "dimensions", 0, (1 << 32) - 1))
        buffer, token = device.allocate(desc, prepared, roles(args.get("in"), "input role"),
                                        roles(args.get("out"), "output role"))
        return session.add(session.buffers, (buffer, int(token), device_index))

    def _buffer(self, args: dict, session: _Session):
        handle = get_int(args.get("buf"), "buffer", 0)
        if handle not in session.buffers:
            raise WireError(f"unknown device memory {handle}")
        return session.buffers[handle][0]

    def _copy_to(self, args: dict, fds: list[int], session: _Session) -> None:
        self._buffer(args, session).copy_to(self._pool(session, args.get("pool")))

    def _copy_from(self, args: dict, fds: list[int], session: _Session) -> None:
        dims = wire.get_ints(args.get("dims"), "dimensions", 0, (1 << 32) - 1)
        self._buffer(args, session).copy_from(self._pool(session, args.get("pool")), dims)

    def _wait(self, args: dict, fds: list[int], session: _Session) -> None:
        self._device(args).wait()

    def _channel(self, args: dict, fds: list[int], session: _Session) -> None:
        """Set up the shared-memory channel (``channel`` module): {"cap": slot bytes} with
        descriptors [sealed memfd of the channel's size, request doorbell, reply doorbell]
        (eventfds). Later messages may come through it instead of the socket."""
        if session.channel is not None:
            raise WireError("this connection already has a channel")
        capacity = get_int(args.get("cap"), "channel capacity", fast.MIN_CAPACITY, fast.MAX_CAPACITY)
        if len(fds) != 3:
            raise WireError("a channel comes with 3 descriptors: its memory and two eventfds")
        memory, request_bell, reply_bell = fds
        if not (fast.is_eventfd(request_bell) and fast.is_eventfd(reply_bell)):
            raise WireError("a channel's doorbells must be eventfds")
        try:
            size = os.fstat(memory).st_size
        except OSError as error:
            raise WireError(f"a channel's memory: {error.strerror}") from None
        if size != fast.size_for(capacity):
            raise WireError(f"a channel of {capacity}-byte slots is {fast.size_for(capacity)} bytes, not {size}")
        mapping, view = _map_pool(memory, True)  # a memfd sealed against shrinking
        view.release()
        to_client, from_client = os.dup(reply_bell), os.dup(request_bell)
        for fd in (to_client, from_client):
            os.set_blocking(fd, False)  # a full counter must not block us
        session.channel = fast.Channel(mapping, capacity, to_client, from_client)
        session.channel_seq = 0  # the client's first request through it is number 1


def _run_fenced(session: _Session, handle: int, prepared: Any, request: Any, timing: bool, deadline: int | None,
                loop: int | None, after: int | None, waits: list[int], done: int) -> None:
    """A fenced execution's worker: wait for the fences (giving up when the deadline
    passes or the client goes away), run, record the result, signal ``done``."""
    no_timing = wire.encode_timing(Timing())
    result = [int(ErrorStatus.GENERAL_FAILURE), no_timing, no_timing]
    try:
        poller = select.poll()
        for fd in waits:
            poller.register(fd, select.POLLIN)
        pending = set(waits)
        while pending and not session.closed.is_set():
            slice_ms = 100
            if deadline is not None:
                slice_ms = max(0, min(slice_ms, (deadline - time.monotonic_ns()) // 1_000_000))
            for fd, events in poller.poll(slice_ms):
                if events & (select.POLLERR | select.POLLNVAL):
                    raise HalError(ErrorStatus.INVALID_ARGUMENT, f"sync fence {fd} is in error")
                pending.discard(fd)
                poller.unregister(fd)
            if pending and deadline is not None and time.monotonic_ns() >= deadline:
                raise HalError(ErrorStatus.MISSED_DEADLINE_TRANSIENT, "deadline passed waiting for fences")
        if pending:
            return  # the client is gone
        signalled = time.monotonic_ns()
        if after is not None:
            deadline = signalled + after if deadline is None else min(deadline, signalled + after)
        _, measured = prepared.execute(request, timing, deadline, loop)
        encoded = wire.encode_timing(measured)
        result = [int(ErrorStatus.NONE), encoded, encoded]
    except HalError as error:
        result[0] = int(error.status)
    except Exception:  # a driver's own failure, contained
        pass
    finally:
        if handle in session.fenced:
            session.fenced[handle] = result
        try:
            os.eventfd_write(done, 1)
        except OSError:
            pass
        for fd in (*waits, done):
            wire._close_quietly(fd)


class _Bound:
    """A bound request for a driver object without create_reusable_execution."""

    def __init__(self, execute: Callable, request: Any, timing: bool, loop: int | None) -> None:
        self._execute, self._request, self._timing, self._loop = execute, request, timing, loop

    def execute(self, deadline_ns: int | None = None):
        return self._execute(self._request, self._timing, deadline_ns, self._loop)


def _no_fd(what: str) -> int:
    raise WireError(f"{what}: the message carries no descriptors")


#: glibc mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3


def keep_freed_memory() -> bool:
    """Let this process keep the memory a driver frees instead of handing it back to the
    kernel. With glibc's adaptive defaults a fresh service process returned a MobileNet
    execution's temporaries after every run and page-faulted them back in on the next
    (about 5,000 minor faults, +25% CPU per execution against the same driver in the
    client's process). Blocks up to 32 MiB come from the heap and the heap is trimmed
    only past 1 GiB free. False where there is no glibc (nothing changes)."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    return bool(mallopt(_M_MMAP_THRESHOLD, 32 << 20)) and bool(mallopt(_M_TRIM_THRESHOLD, 1 << 30))


def serve(devices: list[IDevice], path: str, ready: Callable[[], None] | None = None) -> None:
    """Serve ``devices`` on ``path`` until SIGTERM / SIGINT."""
    keep_freed_memory()
    service = Service(devices, path)
    service.bind()

    def stop(signum, frame) -> None:
        service.stop()

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
    if ready is not None:
        ready()
    service.serve_forever()
