"""The runtime's side of the driver service: HAL proxies (IDevice, IPreparedModel, IBurst,
IBuffer) that forward every call over the service's Unix socket.

Devices appear as ``DEVICE@SERVICE`` (SERVICE: the socket file's stem). Memory crosses as
descriptors: an fd-backed pool (a sealed memfd, what ``Memory.create_shared`` makes) is
mapped by the service once and then named by number; any other buffer (a numpy array
given to ``set_input``) is staged in a shared arena the service has mapped. When the
service dies or stops answering, calls in flight fail with DEAD_OBJECT, the device is
marked dead (it then supports no operation, so compilations fall back to the CPU), and the
next call after the service is back reconnects; models prepared before must be prepared again.
"""

from __future__ import annotations

import fcntl
import functools
import itertools
import math
import mmap
import os
import socket
import struct
import threading
import time
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from nnapi.drivers.service import channel as fast
from nnapi.drivers.service import wire
from nnapi.hal import (
    ErrorStatus,
    ExecutionPreference,
    HalError,
    IBurst,
    IDevice,
    IExecution,
    IFencedExecutionCallback,
    IPreparedModel,
    Priority,
    serialize,
)
from nnapi.hal import types as hal_types
from nnapi.hal.interfaces import wait_for_fences
from nnapi.memory import memory_of, when_released
from nnapi.operand import dtype_of, is_tensor

#: Seconds a call without a deadline may wait for the service before it counts as hung
#: (NNAPI_SERVICE_TIMEOUT overrides).
DEFAULT_TIMEOUT_S = 60.0
#: Extra seconds past a deadline before a silent service counts as hung.
DEADLINE_GRACE_S = 2.0
#: Constant blobs larger than this go by descriptor instead of inside the message.
_INLINE_VALUES_LIMIT = 64 << 10
_RECONNECT_INTERVAL_S = 0.2
_SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL


def _dead(message: str) -> HalError:
    return HalError(ErrorStatus.DEAD_OBJECT, message)


def _bad_reply(path: str, op: str, problem: str) -> HalError:
    """A reply that breaks the schema or disagrees with its request: the driver failed
    (GENERAL_FAILURE), never the caller's INVALID_ARGUMENT."""
    return HalError(ErrorStatus.GENERAL_FAILURE, f"the driver service {path} sent a bad reply to {op}: {problem}")


def _byte_view(pool: Any) -> memoryview:
    view = memoryview(pool)
    return view if view.format == "B" and view.ndim == 1 and view.contiguous else view.cast("B")


class _Arena:
    """A sealed memfd mapped here and (once registered) in the service."""

    def __init__(self, size: int) -> None:
        self.fd = os.memfd_create("nnapi-service-arena", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        os.ftruncate(self.fd, size)
        fcntl.fcntl(self.fd, fcntl.F_ADD_SEALS, _SEALS)
        self.size = size
        self.mapping = mmap.mmap(self.fd, size)
        self.view = memoryview(self.mapping)
        self.pool_id: int | None = None
        self.generation = -1
        #: the memfd is closed by close(), or when the arena is collected unclosed (a free
        #: arena of a link nobody holds any more)
        self._close_fd = weakref.finalize(self, os.close, self.fd)

    def close(self) -> None:
        self.view.release()
        try:
            self.mapping.close()
        except BufferError:
            pass  # views of it are still referenced; the mapping goes with the last
        self._close_fd()


class ServiceLink:
    """One connection to a service, shared by its devices; reconnects after a death."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.service_name = Path(path).stem
        self._lock = threading.RLock()
        self._sock: socket.socket | None = None
        self._reader: wire.FrameReader | None = None
        self._ids = itertools.count(1)
        self._pool_ids = itertools.count(1)
        self.generation = 0
        self.dead = True
        self.devices_info: list[dict] = []
        self._last_attempt = 0.0
        self._applied_timeout: float | None = None
        self._fd_pools: dict[tuple, int] = {}  # (dev, ino, writable) -> pool id, per connection
        self._arenas: list[_Arena] = []  # free arenas
        self._garbage: list[tuple[str, int, int]] = []  # (kind, handle, generation) to release
        #: the shared-memory channel of this connection (None: every message by socket)
        self._channel: fast.Channel | None = None
        #: what closes this connection's socket, reader and channel (finalizers: they also
        #: run when the link is collected without being dropped)
        self._closing: list[weakref.finalize] = []
        self._channel_seq = 0
        self.timeout_s = float(os.environ.get("NNAPI_SERVICE_TIMEOUT", DEFAULT_TIMEOUT_S))
        #: tensor bytes copied between callers' buffers and staging arenas (plain buffers
        #: given to set_input / set_output); memory that crosses by descriptor adds nothing
        self.staged_bytes = 0

    # --- connection ------------------------------------------------------------------------
    def connect(self) -> None:
        """Connect and greet; raises OSError / HalError when the service is not there."""
        with self._lock:
            self._drop()
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(self.timeout_s)
            try:
                sock.connect(self.path)
            except OSError:
                sock.close()
                raise
            # Blocking, with the kernel's SO_RCVTIMEO / SO_SNDTIMEO as the hang detector: a
            # Python-level timeout would add a poll() before every send and receive.
            sock.settimeout(None)
            self._applied_timeout = None
            self._sock, self._reader = sock, wire.FrameReader(sock, descriptors=False)
            # the connection is closed by _drop, or when the link is collected (unregistered
            # and no longer used): nothing of it outlives the link
            self._closing.append(weakref.finalize(self, _close_connection, sock, self._reader))
            self.generation += 1
            self.dead = False
            self._fd_pools.clear()
            try:
                devices = self._call_locked("hello", {"v": wire.PROTOCOL_VERSION}, (), None, wire.decode_hello)
            except HalError:
                self._drop()
                raise
            if self.devices_info and [d["name"] for d in devices] != [d["name"] for d in self.devices_info]:
                self._drop()
                raise _dead("the service came back with other devices")
            self.devices_info = devices
            self._open_channel()

    def _open_channel(self) -> None:
        """Set up the shared-memory channel (``channel`` module) unless
        NNAPI_SERVICE_CHANNEL=0; a service that refuses it is spoken to by socket only."""
        if os.environ.get("NNAPI_SERVICE_CHANNEL", "1") == "0":
            return
        channel, memory = fast.Channel.create()
        try:
            self._call_locked("channel", {"cap": channel.capacity}, (memory, channel.to_peer, channel.from_peer),
                              None)
        except HalError:
            channel.close()
            if self.dead:
                raise
            return
        finally:
            os.close(memory)
        assert self._sock is not None
        channel.watch(self._sock.fileno())
        self._channel, self._channel_seq = channel, 0
        self._closing.append(weakref.finalize(self, channel.close))

    def _drop(self) -> None:
        self.dead = True
        closing, self._closing = self._closing, []
        for close in closing:  # the socket, its reader, the channel
            close()
        self._sock = self._reader = None
        self._channel = None
        self._fd_pools.clear()
        self._garbage.clear()

    def ensure(self, retry_now: bool = False) -> bool:
        """True when connected, reconnecting (at most every 0.2 s) when not."""
        with self._lock:
            if not self.dead:
                return True
            now = time.monotonic()
            if not retry_now and now - self._last_attempt < _RECONNECT_INTERVAL_S:
                return False
            self._last_attempt = now
            try:
                self.connect()
            except (OSError, HalError):
                self._drop()
                return False
            return True

    # --- calls -----------------------------------------------------------------------------
    def call(self, op: str, args: dict, fds: Sequence[int] = (), deadline_ns: int | None = None,
             generation: int | None = None, decode: Any = None) -> Any:
        """Send one request and wait for its reply: its result, through ``decode`` when
        given (which checks it: a WireError there is a bad reply, GENERAL_FAILURE).
        HalError with the driver's status, or DEAD_OBJECT when the service is gone, hung,
        or restarted since ``generation``."""
        with self._lock:
            if self.dead and not self.ensure():
                raise _dead(f"the driver service {self.path} is not running")
            if generation is not None and generation != self.generation:
                raise _dead(f"the driver service {self.path} restarted; prepare the model again")
            if self._garbage:
                self._flush_garbage()
            return self._call_locked(op, args, fds, deadline_ns, decode)

    def _call_locked(self, op: str, args: dict, fds: Sequence[int], deadline_ns: int | None,
                     decode: Any = None) -> Any:
        message_id = next(self._ids)
        assert self._sock is not None and self._reader is not None
        timeout = self.timeout_s
        if deadline_ns is not None:
            timeout = max(0.0, (deadline_ns - time.monotonic_ns()) / 1e9) + DEADLINE_GRACE_S
        try:
            payload = wire.pack({"v": wire.PROTOCOL_VERSION, "id": message_id, "op": op, "a": args})
            channel = self._channel
            if channel is not None and not fds and len(payload) <= channel.capacity:
                payload = self._through_channel(channel, payload, timeout)
                got_fds = ()
            else:
                if timeout != self._applied_timeout:
                    self._set_timeout(timeout)
                wire.send_frame(self._sock, payload, list(fds))
                payload, got_fds = self._reader.read()
        except (OSError, EOFError, wire.ProtocolError) as error:
            self._drop()
            reason = "stopped answering" if isinstance(error, (TimeoutError, BlockingIOError)) else "died"
            raise _dead(f"the driver service {self.path} {reason} during {op}: {error}") from None
        for fd in got_fds:
            wire._close_quietly(fd)
        try:
            reply = wire.unpack(payload)
            if reply.get("id") != message_id:
                raise wire.WireError("reply to another request")
        except wire.WireError as error:
            self._drop()
            raise _dead(f"the driver service {self.path} sent a bad reply: {error}") from None
        ok = reply.get("ok")
        if ok is True:
            if decode is None:
                return reply.get("r")
            try:
                return decode(reply.get("r"))
            except wire.WireError as error:
                raise _bad_reply(self.path, op, str(error)) from None
        # A failure: the status the driver reported (never NONE, which is no failure) and,
        # for OUTPUT_INSUFFICIENT_SIZE, the shapes it needs.
        status = reply.get("status")
        message = reply.get("msg")
        try:
            if ok is not False:
                raise wire.WireError(f"ok: expected a boolean, got {type(ok).__name__}")
            status = ErrorStatus(wire.get_int(status, "status", 1, int(ErrorStatus.DEAD_OBJECT)))
            shapes = wire.decode_shapes(reply.get("shapes", []))
            message = wire.get_str(message, "msg", 1 << 16)
        except (wire.WireError, ValueError) as error:
            problem = str(error) if isinstance(error, wire.WireError) else f"status: {status!r} is no ErrorStatus"
            raise _bad_reply(self.path, op, problem) from None
        raise HalError(status, message, shapes)

    def _through_channel(self, channel: fast.Channel, payload: bytes, timeout: float) -> bytes:
        """One request and its reply through the shared-memory channel: the reply's bytes.
        Spins briefly for the reply, then sleeps on the doorbell and the socket; TimeoutError
        past ``timeout`` seconds, EOFError / ProtocolError when the service is gone or breaks
        the channel's rules."""
        words = channel.words
        seq = self._channel_seq + 1
        channel.request_slot[:len(payload)] = payload
        words[fast.REQUEST_LEN] = len(payload)
        words[fast.REQUEST_SEQ] = seq
        self._channel_seq = seq
        channel.ring()
        if not channel.spin(fast.REPLY_SEQ, seq - 1):
            end = time.monotonic() + timeout
            while words[fast.REPLY_SEQ] == seq - 1:
                remaining = end - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(f"no reply in {timeout:g} s")
                _, ready = channel.sleep(max(1, math.ceil(remaining * 1000)))
                if ready and words[fast.REPLY_SEQ] == seq - 1:
                    assert self._reader is not None
                    self._reader.read()  # EOFError: the service is gone
                    raise wire.ProtocolError("a frame while a reply was due in the channel")
        if words[fast.REPLY_SEQ] != seq:
            raise wire.ProtocolError("a reply in the channel out of sequence")
        length = words[fast.REPLY_LEN]
        if length == fast.ON_SOCKET:
            assert self._reader is not None
            if timeout != self._applied_timeout:
                self._set_timeout(timeout)
            return self._reader.read()[0]
        if length > channel.capacity:
            raise wire.ProtocolError("a reply longer than the channel's slot")
        return bytes(channel.reply_slot[:length])

    def _set_timeout(self, seconds: float) -> None:
        assert self._sock is not None
        seconds = max(seconds, 0.001)  # a zero timeval would mean no timeout at all
        value = struct.pack("ll", int(seconds), int(seconds % 1 * 1e6))
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, value)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, value)
        self._applied_timeout = seconds

    def release_later(self, kind: str, handle: int, generation: int) -> None:
        """Queue a remote object for release with the next call (safe from finalizers)."""
        self._garbage.append((kind, handle, generation))

    def _flush_garbage(self) -> None:
        garbage, self._garbage = self._garbage, []
        pools = [handle for kind, handle, generation in garbage if kind == "pools" and generation == self.generation]
        calls = [("forget", {"pools": pools})] if pools else []  # one message for all the pools
        calls += [("release", {"kind": kind, "h": handle}) for kind, handle, generation in garbage
                  if kind != "pools" and generation == self.generation]
        for op, args in calls:
            if self.dead:
                return
            try:
                self._call_locked(op, args, (), None)
            except HalError:
                pass

    # --- pools -----------------------------------------------------------------------------
    def fd_pool_ref(self, pool: Any, writable: bool, fds: list[int], new: list) -> list | None:
        """A reference to an fd-backed pool the service can map (sealed memfd), registering
        it in this call's ``new`` list the first time; None when it cannot go by fd. The
        pool is an FdPool, or a Memory's mapped bytes (``nnapi.memory.memory_of``)."""
        found = _descriptor_of(pool, writable)
        if found is None:
            return None
        fd, offset, size, writable, key = found
        pool_id = self._fd_pools.get(key)
        if pool_id is None:
            pool_id = next(self._pool_ids)
            new.append([pool_id, len(fds), writable])
            fds.append(fd)
            self._fd_pools[key] = pool_id
            # The service lets go of its mapping when the Memory is freed (its mapping
            # keeps the memory's pages alive); the oldest goes past 1,024 in any case.
            # (A weak reference: a Memory outliving every user of this link must not keep
            # the link, its connection and arenas, alive.)
            when_released(pool, functools.partial(_forget_pool, weakref.ref(self), key, pool_id, self.generation))
            if len(self._fd_pools) > 1024:
                old_key = next(iter(self._fd_pools))
                self._garbage.append(("pools", self._fd_pools.pop(old_key), self.generation))
        return [0, pool_id, offset, size]

    def _forget_pool(self, key: tuple, pool_id: int, generation: int) -> None:
        """A mapped pool's memory is gone: the service unmaps it with the next call (safe
        from finalizers: no lock, no I/O)."""
        if self._fd_pools.get(key) == pool_id:
            self._fd_pools.pop(key, None)
            self._garbage.append(("pools", pool_id, generation))

    def take_arena(self, size: int) -> _Arena:
        with self._lock:
            for index, arena in enumerate(self._arenas):
                if arena.size >= size:
                    return self._arenas.pop(index)
        return _Arena(max(1 << 16, 1 << max(size - 1, 1).bit_length()))

    def give_arena(self, arena: _Arena) -> None:
        with self._lock:
            if len(self._arenas) < 8:
                self._arenas.append(arena)
                return
        arena.close()

    def register_arena(self, arena: _Arena, fds: list[int], new: list) -> int:
        if arena.generation != self.generation or arena.pool_id is None:
            arena.pool_id = next(self._pool_ids)
            arena.generation = self.generation
            new.append([arena.pool_id, len(fds), True])
            fds.append(arena.fd)
        return arena.pool_id


def _close_connection(sock: socket.socket, reader: wire.FrameReader) -> None:
    try:
        sock.close()
    except OSError:
        pass
    reader.close()


def _forget_pool(link_ref: weakref.ref, key: tuple, pool_id: int, generation: int) -> None:
    link = link_ref()
    if link is not None:
        link._forget_pool(key, pool_id, generation)


def _descriptor_of(pool: Any, writable: bool) -> tuple[int, int, int, bool, tuple] | None:
    """(fd, offset, size, writable, identity) of a pool that can cross by descriptor (a
    sealed memfd: an FdPool, or a Memory's mapped bytes); None for any other."""
    fd = getattr(pool, "fd", None)
    if isinstance(fd, int):
        offset, size = int(getattr(pool, "offset", 0)), int(pool.size)
    else:
        shared = memory_of(pool)
        if shared is None:
            return None
        fd, offset, size, mapped_writable = shared
        writable = writable and mapped_writable
    try:
        info = os.fstat(fd)
        seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
    except OSError:
        return None
    if not seals & fcntl.F_SEAL_SHRINK:
        return None
    return fd, offset, size, writable, (info.st_dev, info.st_ino, writable)


def _all_by_descriptor(pools: Sequence[Any]) -> bool:
    """True when no pool of a request would be staged (each is device memory or crosses by
    descriptor)."""
    token = getattr(hal_types, "BufferToken", None)
    return all((token is not None and isinstance(pool, token)) or _descriptor_of(pool, True) is not None
               for pool in pools)


class _Staging:
    """The pools of one call as references: fd pools by descriptor, other buffers copied
    into an arena (and outputs copied back after a successful run)."""

    def __init__(self, link: ServiceLink) -> None:
        self.link = link
        self.fds: list[int] = []
        self.new: list = []
        self.arena: _Arena | None = None
        #: pool index -> (the caller's bytes, their offset in the arena)
        self._copies: dict[int, tuple[memoryview, int]] = {}

    def refs(self, pools: Sequence[Any], writable: bool = True, copy_in: set[int] | None = None) -> list:
        """References for ``pools``: by descriptor where they can go so, else staged in an
        arena (their bytes copied in, or only those of the pools in ``copy_in``)."""
        buffer_token = getattr(hal_types, "BufferToken", None)
        refs: list = []
        staged: list[tuple[int, memoryview]] = []
        for pool in pools:
            if buffer_token is not None and isinstance(pool, buffer_token):
                refs.append([1, int(pool.token)])
                continue
            ref = self.link.fd_pool_ref(pool, writable, self.fds, self.new)
            if ref is not None:
                refs.append(ref)
                continue
            if hasattr(pool, "fd") and getattr(pool, "buffer", None) is not None:
                pool = pool.buffer  # an fd pool that cannot be mapped remotely: stage its bytes
            staged.append((len(refs), _byte_view(pool)))
            refs.append(None)
        if staged:
            total = sum((view.nbytes + 63) & ~63 for _, view in staged)
            self.arena = self.link.take_arena(total)
            pool_id = self.link.register_arena(self.arena, self.fds, self.new)
            offset = 0
            for index, view in staged:
                if copy_in is None or index in copy_in:
                    self.arena.view[offset: offset + view.nbytes] = view
                    self.link.staged_bytes += view.nbytes
                refs[index] = [0, pool_id, offset, view.nbytes]
                self._copies[index] = (view, offset)
                offset += (view.nbytes + 63) & ~63
        return refs

    def copy_back(self, request, shapes: list | None = None, sizes: list | None = None) -> None:
        """Land the outputs staged in the arena in the caller's buffers (``refs`` was given
        ``request.pools``, so pool indexes match): with the outputs' ``shapes`` and element
        ``sizes``, only the bytes of each result."""
        if self.arena is None:
            return
        for position, argument in enumerate(request.outputs):
            staged = None if argument.has_no_value else self._copies.get(argument.location.pool_index)
            if staged is None:
                continue
            view, base = staged
            start, length = argument.location.offset, argument.location.length
            if sizes is not None and shapes is not None and position < len(shapes):
                length = min(length, sizes[position] * math.prod(shapes[position].dimensions))
            if not view.readonly:
                view[start: start + length] = self.arena.view[base + start: base + start + length]
                self.link.staged_bytes += length

    def done(self) -> None:
        if self.arena is not None:
            self.link.give_arena(self.arena)
            self.arena = None

    def map_args(self) -> dict:
        return {"pools": self.new}

    def argument_copies(self, request) -> tuple[list, list]:
        """For a bound request: the (destination, source) views to copy before each run
        (staged inputs into the arena) and after it (staged outputs back), each only the
        argument's bytes."""
        def copies(arguments, inbound: bool) -> list:
            result = []
            for position, argument in enumerate(arguments):
                staged = None if argument.has_no_value else self._copies.get(argument.location.pool_index)
                if staged is None:
                    continue
                view, base = staged
                start, length = argument.location.offset, argument.location.length
                arena = self.arena.view[base + start: base + start + length]
                mine = view[start: start + length]
                if inbound:
                    result.append((arena, mine))
                elif not mine.readonly:
                    result.append((position, mine, arena))
            return result

        if self.arena is None:
            return [], []
        return copies(request.inputs, True), copies(request.outputs, False)


def _call_with_pools(link: ServiceLink, staging: _Staging, op: str, args: dict, deadline_ns: int | None = None,
                     generation: int | None = None, extra_fds: Sequence[int] = (), decode: Any = None) -> Any:
    """Register new pools (in the same round trip when there are none to map) and call."""
    with link._lock:
        if staging.new:
            link.call("map", staging.map_args(), staging.fds, None, generation)
        fds = list(extra_fds)
        return link.call(op, args, fds, deadline_ns, generation, decode)


# --- what a reply may hold -------------------------------------------------------------------
# Each decoder checks a reply's result (the service is another process: untrusted) and
# raises WireError on anything else, which ServiceLink.call turns into GENERAL_FAILURE.
def _handle(value: Any) -> int:
    """A number the service gave an object it made (prepared model, burst, execution...)."""
    return wire.get_int(value, "handle", 1)


def _buffer_token(value: Any) -> int:
    return wire.get_int(value, "buffer token", 1, (1 << 32) - 1)


def _flags(count: int, value: Any) -> list[bool]:
    flags = [wire.get_bool(v, "supported") for v in wire.get_list(value, "supported")]
    if len(flags) != count:
        raise wire.WireError(f"supported: {len(flags)} answers for {count} operations")
    return flags


def _reasons(count: int, value: Any) -> list[str | None]:
    reasons = [None if r is None else wire.get_str(r, "reason") for r in wire.get_list(value, "reasons")]
    if len(reasons) != count:
        raise wire.WireError(f"reasons: {len(reasons)} answers for {count} operations")
    return reasons


def _fenced_info(value: Any) -> tuple:
    status_v, launched_v, fenced_v = wire.get_list(value, "fenced info", 3)
    try:
        status = ErrorStatus(wire.get_int(status_v, "fenced status", 0, int(ErrorStatus.DEAD_OBJECT)))
    except ValueError:
        raise wire.WireError(f"fenced status: {status_v} is no ErrorStatus") from None
    return status, wire.decode_timing(launched_v), wire.decode_timing(fenced_v)


_NOTHING = object()


#: The dimensions of a tensor output of unknown rank: a successful result must give it
#: some rank (Android's validateOutputShapesFromDriver); compared by identity.
_SOME_RANK: list[int] = []


class _OutputFacts:
    """What a prepared model says of its outputs, for checking every execution's result
    (built once, when the model is prepared): per output, the dimensions a result must
    match (0 = any; _SOME_RANK: a tensor of unknown rank; None: nothing known, an
    extension type) and its element size (None: unknown). Nothing is known of a model
    prepared from a cache (``model`` None)."""

    __slots__ = ("static", "sizes")

    def __init__(self, model) -> None:
        static: list[tuple[list[int] | None, int | None]] = []
        if model is not None:
            main = model.main
            for position, index in enumerate(main.output_indexes):
                operand = main.operands[index]
                dims = None
                if operand.dimensions or not (hal_types.is_extension_type(int(operand.type))
                                              or is_tensor(operand.type)):
                    dims = list(operand.dimensions)
                elif is_tensor(operand.type):
                    dims = _SOME_RANK
                static.append((dims, _element_size(model, position)))
        self.static = tuple(static)
        #: bytes per element of each output; None unless every one is known
        sizes = [size for _, size in static]
        self.sizes: list[int] | None = sizes if model is not None and None not in sizes else None


_UNKNOWN_OUTPUT = (None, None)


class _Results:
    """Checks an execution's result against its request: one shape per output, each
    sufficient, of the rank and dimensions the request (or else the model) specifies,
    and no larger than the output's buffer; a success that says otherwise would have the
    runtime report shapes the outputs do not hold, or copy back bytes never written. The
    model's part of the rules (``outputs``) is made once per prepared model; only the
    request's (its dimensions, buffer lengths) per execution."""

    def __init__(self, outputs: _OutputFacts, request) -> None:
        static = outputs.static
        known = len(static)
        pools = request.pools
        #: per output: (dimensions to match, 0 = any; None: nothing known), element
        #: size (None: unknown), bytes of its buffer (None: omitted, or device memory,
        #: which its device sizes)
        self.rules: list[tuple[list[int] | None, int | None, int | None]] = []
        for position, argument in enumerate(request.outputs):
            dims, size = static[position] if position < known else _UNKNOWN_OUTPUT
            if argument.dimensions:
                dims = list(argument.dimensions)
            location = argument.location
            omitted = argument.has_no_value or _is_device_pool(pools, location.pool_index)
            self.rules.append((dims, size, None if omitted else int(location.length)))
        #: the last result as received and as checked: a bound request's repeat is not
        #: decoded again
        self._last: tuple[Any, Any] = (_NOTHING, None)

    def __call__(self, value: Any) -> tuple[list, Any]:
        raw, decoded = self._last
        if raw is not _NOTHING and value == raw:
            return decoded
        decoded = self._check(value)
        self._last = value, decoded
        return decoded

    def _check(self, value: Any) -> tuple[list, Any]:
        shapes_v, timing_v = wire.get_list(value, "execution result", 2)
        shapes = wire.decode_shapes(shapes_v)
        if len(shapes) != len(self.rules):
            raise wire.WireError(f"output shapes: {len(shapes)} for {len(self.rules)} outputs")
        for position, (shape, (dims, size, length)) in enumerate(zip(shapes, self.rules, strict=True)):
            got = list(shape.dimensions)
            if not shape.is_sufficient:
                raise wire.WireError(f"output {position}: insufficient in a successful execution")
            if dims is _SOME_RANK:
                if not got:
                    raise wire.WireError(f"output {position}: a tensor of unknown rank (dimensions []) in a "
                                         "successful execution")
            elif dims is not None and (len(got) != len(dims) or any(d and d != g for d, g in zip(dims, got,
                                                                                                 strict=True))):
                raise wire.WireError(f"output {position}: shape {got} does not match {dims}")
            if size is not None and length is not None and size * math.prod(got) > length:
                raise wire.WireError(f"output {position}: shape {got} needs {size * math.prod(got)} bytes, "
                                     f"its buffer has {length}")
        return shapes, wire.decode_timing(timing_v)


_BUFFER_TOKEN = getattr(hal_types, "BufferToken", None)


def _is_device_pool(pools, index: int) -> bool:
    return _BUFFER_TOKEN is not None and 0 <= index < len(pools) and isinstance(pools[index], _BUFFER_TOKEN)


class RemoteDevice(IDevice):
    """A device of a driver service, as the runtime sees it."""

    def __init__(self, link: ServiceLink, index: int) -> None:
        info = link.devices_info[index]  # checked by wire.decode_hello
        self._link = link
        self._index = index
        self.name = f"{info['name']}@{link.service_name}"
        self.version_string = info["version"]
        self.device_type = info["type"]
        self.feature_level = info["level"]
        self._capabilities = info["caps"]
        self._cache_files = info["cache"]
        self._extensions = info["ext"]

    @property
    def is_dead(self) -> bool:
        """True while the service is unreachable (DEAD_OBJECT)."""
        return not self._link.ensure()

    def get_capabilities(self):
        return self._capabilities

    def get_supported_extensions(self) -> list:
        return list(self._extensions)

    def get_number_of_cache_files_needed(self) -> tuple[int, int]:
        return self._cache_files

    def _model_args(self, model, staging: _Staging) -> dict:
        """The model in hal.serialize's plain form, its pools as references (descriptors or
        the arena) and a large constant blob staged too instead of inside the message."""
        values = model.operand_values
        large = memoryview(values).nbytes > _INLINE_VALUES_LIMIT
        refs = staging.refs([*model.pools, values] if large else list(model.pools), writable=False)
        pool_refs = iter(refs)
        plain = serialize.model_to_plain(model, lambda pool: next(pool_refs))
        if large:
            plain["operand_values"] = refs[-1]
        return {"dev": self._index, "model": plain}

    def _model_call(self, op: str, model, decode, extra: dict | None = None, deadline_ns: int | None = None,
                    fds: Sequence[int] = (), keep_arena: bool = False):
        staging = _Staging(self._link)
        kept = False
        try:
            with self._link._lock:
                if not self._link.ensure():
                    raise _dead(f"the driver service {self._link.path} is not running")
                generation = self._link.generation
                args = self._model_args(model, staging)
                if extra:
                    args.update(extra)
                result = _call_with_pools(self._link, staging, op, args, deadline_ns, generation, fds, decode)
                kept = keep_arena
                return result, generation, staging
        finally:
            if not kept:
                staging.done()

    def get_supported_operations(self, model) -> list[bool]:
        try:
            flags, _, _ = self._model_call("supported", model, functools.partial(
                _flags, len(model.main.operations)))
        except HalError as error:
            if error.status == ErrorStatus.DEAD_OBJECT:
                return [False] * len(model.main.operations)  # a dead device runs nothing: CPU fallback
            raise
        return flags

    def get_unsupported_reasons(self, model) -> list[str | None]:
        try:
            reasons, _, _ = self._model_call("reasons", model, functools.partial(
                _reasons, len(model.main.operations)))
        except HalError as error:
            if error.status == ErrorStatus.DEAD_OBJECT:
                return [f"the driver service is dead: {error}"] * len(model.main.operations)
            raise
        return reasons

    def prepare_model(self, model, preference=ExecutionPreference.FAST_SINGLE_ANSWER, priority=Priority.MEDIUM,
                      deadline_ns=None, model_cache: Sequence[int] = (), data_cache: Sequence[int] = (),
                      token: bytes | None = None) -> IPreparedModel:
        fds = [*model_cache, *data_cache]
        extra = {"pref": int(preference), "prio": int(priority), "deadline": deadline_ns,
                 "mc": list(range(len(model_cache))), "dc": list(range(len(model_cache), len(fds))),
                 "token": None if token is None else bytes(token)}
        # The staged model pools stay mapped in the service as long as the prepared model.
        handle, generation, staging = self._model_call("prepare", model, _handle, extra, deadline_ns, fds,
                                                       keep_arena=True)
        return RemotePreparedModel(self._link, handle, generation, model, staging)

    def prepare_model_from_cache(self, model_cache: Sequence[int], data_cache: Sequence[int], token: bytes,
                                 deadline_ns: int | None = None) -> IPreparedModel:
        fds = [*model_cache, *data_cache]
        generation = self._link.generation
        handle = self._link.call("prepare_cache", {
            "dev": self._index, "mc": list(range(len(model_cache))),
            "dc": list(range(len(model_cache), len(fds))), "token": bytes(token), "deadline": deadline_ns},
            fds, deadline_ns, decode=_handle)
        return RemotePreparedModel(self._link, handle, generation, None, _Staging(self._link))

    def allocate(self, desc, prepared_models, input_roles, output_roles):
        handles = []
        for prepared in prepared_models:
            if not isinstance(prepared, RemotePreparedModel) or prepared._link is not self._link:
                raise HalError(ErrorStatus.INVALID_ARGUMENT, "allocate: a prepared model of another device")
            handles.append(prepared._handle)
        generation = self._link.generation
        token = self._link.call("allocate", {
            "dev": self._index, "dims": [int(d) for d in desc.dimensions], "prepared": handles,
            "in": [[r.model_index, r.io_index, float(r.probability)] for r in input_roles],
            "out": [[r.model_index, r.io_index, float(r.probability)] for r in output_roles]},
            generation=generation, decode=_buffer_token)
        return RemoteBuffer(self._link, token, generation), token

    def wait(self) -> None:
        """ANeuralNetworksDevice_wait: block until the service answers again."""
        while not self._link.ensure(retry_now=True):
            time.sleep(_RECONNECT_INTERVAL_S)


class RemotePreparedModel(IPreparedModel):
    answers_checked = True  # every reply is checked here (_Results), as strictly

    def __init__(self, link: ServiceLink, handle: int, generation: int, model, staging: _Staging) -> None:
        self._link = link
        self._handle = handle
        self._generation = generation
        self._model = model
        self._model_staging = staging  # keeps the staged model pools' arena until released
        #: what every execution's result is checked against, as far as the model says
        self._outputs = _OutputFacts(model)
        #: bytes per element of each output (None: not known, e.g. prepared from a cache)
        self._output_sizes = self._outputs.sizes
        weakref.finalize(self, _release, link, "prepared", handle, generation, staging)

    def _run(self, op: str, key: str, handle: int, request, measure_timing, deadline_ns, loop_timeout_ns):
        staging = _Staging(self._link)
        # Output-only buffers are not copied in when each result's size is known (then
        # only the result's bytes come back); else their bytes must survive the run.
        sizes = self._output_sizes
        copy_in = None
        if sizes is not None:
            copy_in = {a.location.pool_index for a in request.inputs if not a.has_no_value}
        try:
            with self._link._lock:
                if self._generation != self._link.generation:
                    raise _dead("the driver service restarted; prepare the model again")
                refs = staging.refs(request.pools, copy_in=copy_in)
                args = {key: handle, "r": wire.encode_request(refs, request),
                        "timing": bool(measure_timing), "deadline": deadline_ns, "loop": loop_timeout_ns}
                shapes, timing = _call_with_pools(self._link, staging, op, args, deadline_ns, self._generation,
                                                  decode=_Results(self._outputs, request))
            staging.copy_back(request, shapes, sizes)
            return shapes, timing
        finally:
            staging.done()

    def execute(self, request, measure_timing=False, deadline_ns=None, loop_timeout_ns=None):
        return self._run("execute", "h", self._handle, request, measure_timing, deadline_ns, loop_timeout_ns)

    def execute_fenced(self, request, wait_for, measure_timing=False, deadline_ns=None, loop_timeout_ns=None,
                       timeout_after_fence_ns=None):
        """IPreparedModel::executeFenced. With fences to wait for and every pool crossing by
        descriptor (shared or device memory), the service waits for the fences and runs
        in a thread of its own, and this returns at once with a sync fence the service
        signals when done; the connection serves other calls meanwhile. Plain buffers are
        staged and must be copied back after the run, so then the fences are waited here
        and the run is synchronous, as with no fences at all."""
        if wait_for:
            started = self._start_fenced(request, wait_for, measure_timing, deadline_ns, loop_timeout_ns,
                                         timeout_after_fence_ns)
            if started is not None:
                return started
        wait_for_fences(wait_for, deadline_ns)
        if timeout_after_fence_ns is not None:
            after = time.monotonic_ns() + timeout_after_fence_ns
            deadline_ns = after if deadline_ns is None else min(deadline_ns, after)
        _, timing = self.execute(request, measure_timing, deadline_ns, loop_timeout_ns)
        return None, _FencedDone(timing)

    def _start_fenced(self, request, wait_for, measure_timing, deadline_ns, loop_timeout_ns,
                      timeout_after_fence_ns) -> tuple[int, IFencedExecutionCallback] | None:
        """Hand a fenced execution to the service (``execute_fenced`` there); None when a
        pool would have to be staged."""
        for fd in wait_for:
            try:
                os.fstat(fd)
            except (OSError, TypeError, ValueError) as error:
                raise HalError(ErrorStatus.INVALID_ARGUMENT, f"bad sync fence {fd!r}: {error}") from None
        if not _all_by_descriptor(request.pools):
            return None
        link = self._link
        staging = _Staging(link)
        done = os.eventfd(0, os.EFD_CLOEXEC)
        try:
            with link._lock:
                if self._generation != link.generation:
                    raise _dead("the driver service restarted; prepare the model again")
                refs = staging.refs(request.pools)
                args = {"h": self._handle, "r": wire.encode_request(refs, request), "timing": bool(measure_timing),
                        "deadline": deadline_ns, "loop": loop_timeout_ns, "after": timeout_after_fence_ns,
                        "w": list(range(len(wait_for))), "done": len(wait_for)}
                handle = _call_with_pools(link, staging, "execute_fenced", args, None, self._generation,
                                          [*wait_for, done], _handle)
            callback = _RemoteFencedCallback(link, handle, self._generation, os.dup(done))
        except BaseException:
            os.close(done)
            raise
        finally:
            staging.done()
        return done, callback

    def configure_burst(self) -> IBurst:
        return RemoteBurst(self, self._link.call("burst", {"h": self._handle}, generation=self._generation,
                                                 decode=_handle))

    def create_reusable_execution(self, request, measure_timing=False, loop_timeout_ns=None) -> IExecution:
        return RemoteExecution(self, "h", self._handle, request, measure_timing, loop_timeout_ns)


class RemoteBurst(IBurst):
    def __init__(self, prepared: RemotePreparedModel, handle: int) -> None:
        self._prepared = prepared
        self._handle = handle
        weakref.finalize(self, _release, prepared._link, "burst", handle, prepared._generation, None)

    def execute(self, request, measure_timing=False, deadline_ns=None, loop_timeout_ns=None):
        return self._prepared._run("burst_execute", "b", self._handle, request, measure_timing, deadline_ns,
                                   loop_timeout_ns)

    def create_reusable_execution(self, request, measure_timing=False, loop_timeout_ns=None) -> IExecution:
        return RemoteExecution(self._prepared, "b", self._handle, request, measure_timing, loop_timeout_ns)


class RemoteExecution(IExecution):
    """A request bound in the service (createReusableExecution of a prepared model or a
    burst), as Android's burst caches its memory pools: the pools are registered and the
    request is sent, validated and bound by the driver once; each computation sends only
    the execution's number and deadline. Plain buffers are staged in an arena this
    execution keeps: its inputs are copied in before each run and its outputs back after."""

    def __init__(self, prepared: RemotePreparedModel, key: str, handle: int, request, measure_timing: bool,
                 loop_timeout_ns: int | None) -> None:
        link = self._link = prepared._link
        self._generation = prepared._generation
        staging = _Staging(link)
        try:
            with link._lock:
                if self._generation != link.generation:
                    raise _dead("the driver service restarted; prepare the model again")
                # inputs are copied in before each run; outputs need no copy in when each
                # result's size is known (only its bytes come back)
                copy_in = set() if prepared._output_sizes is not None else None
                refs = staging.refs(request.pools, copy_in=copy_in)
                args = {key: handle, "r": wire.encode_request(refs, request),
                        "timing": bool(measure_timing), "loop": loop_timeout_ns}
                self._handle = _call_with_pools(link, staging, "bind", args, None, self._generation,
                                                decode=_handle)
        except BaseException:
            staging.done()
            raise
        self._copy_in, copy_out = staging.argument_copies(request)
        # an output's bytes past its result (a dynamic shape) stay the caller's: copy the
        # result's size when the model says how big an element is
        static = prepared._outputs.static
        self._copy_out = [(position, mine, arena, static[position][1] if position < len(static) else None)
                          for position, mine, arena in copy_out]
        self._run_args = {"x": self._handle, "deadline": None}
        self._results = _Results(prepared._outputs, request)
        weakref.finalize(self, _release, link, "execution", self._handle, self._generation, staging)

    def execute(self, deadline_ns: int | None = None):
        link = self._link
        with link._lock:
            if self._generation != link.generation:
                raise _dead("the driver service restarted; prepare the model again")
            for arena, mine in self._copy_in:
                arena[:] = mine
                link.staged_bytes += len(mine)
            args = self._run_args
            args["deadline"] = deadline_ns
            shapes, timing = link.call("run", args, (), deadline_ns, self._generation, self._results)
        for position, mine, arena, size in self._copy_out:
            count = len(mine)
            if size is not None and position < len(shapes):
                count = min(count, size * math.prod(shapes[position].dimensions))
            mine[:count] = arena[:count]
            link.staged_bytes += count
        return [hal_types.OutputShape(list(shape.dimensions), shape.is_sufficient) for shape in shapes], timing


class RemoteBuffer:
    """Device memory living in the service (IBuffer)."""

    def __init__(self, link: ServiceLink, token: int, generation: int) -> None:
        self._link = link
        self._token = token
        self._generation = generation
        weakref.finalize(self, _release, link, "buffer", token, generation, None)

    def _copy(self, op: str, pool, dims: list[int] | None) -> None:
        staging = _Staging(self._link)
        try:
            with self._link._lock:
                (ref,) = staging.refs([pool])
                args = {"buf": self._token, "pool": ref}
                if dims is not None:
                    args["dims"] = [int(d) for d in dims]
                _call_with_pools(self._link, staging, op, args, None, self._generation)
            if op == "copy_to" and staging.arena is not None:
                view = _byte_view(getattr(pool, "buffer", pool) if hasattr(pool, "fd") else pool)
                view[:] = staging.arena.view[ref[2]: ref[2] + view.nbytes]
                self._link.staged_bytes += view.nbytes
        finally:
            staging.done()

    def copy_to(self, dst) -> None:
        self._copy("copy_to", dst, None)

    def copy_from(self, src, dimensions: list[int]) -> None:
        self._copy("copy_from", src, dimensions)


def _element_size(model, position: int) -> int | None:
    """Bytes per element of the model's output ``position`` (None: unknown)."""
    if model is None:
        return None
    try:
        code = model.main.operands[model.main.output_indexes[position]].type
        return None if hal_types.is_extension_type(int(code)) else int(dtype_of(code).itemsize)
    except (IndexError, KeyError, TypeError, ValueError):
        return None


class _FencedDone(IFencedExecutionCallback):
    """The report of a fenced execution the client ran itself (waited, then executed)."""

    def __init__(self, timing) -> None:
        self._timing = timing

    def get_execution_info(self):
        return ErrorStatus.NONE, self._timing, self._timing


class _RemoteFencedCallback(IFencedExecutionCallback):
    """The service's report of a fenced execution it runs: asked for once its sync fence
    is signalled (waited here first, so the service never waits on our behalf)."""

    def __init__(self, link: ServiceLink, handle: int, generation: int, done: int) -> None:
        self._link, self._handle, self._generation, self._done = link, handle, generation, done
        self._info: tuple | None = None
        weakref.finalize(self, _release, link, "fenced", handle, generation, None)
        weakref.finalize(self, os.close, done)

    def get_execution_info(self):
        if self._info is None:
            deadline = time.monotonic_ns() + int(self._link.timeout_s * 1e9)
            try:
                wait_for_fences([self._done], deadline)
            except HalError:
                return ErrorStatus.DEAD_OBJECT, hal_types.Timing(), hal_types.Timing()
            try:
                self._info = self._link.call("fenced_info", {"f": self._handle}, generation=self._generation,
                                             decode=_fenced_info)
            except HalError as error:
                return error.status, hal_types.Timing(), hal_types.Timing()
        return self._info


def _release(link: ServiceLink, kind: str, handle: int, generation: int, staging: _Staging | None) -> None:
    link.release_later(kind, handle, generation)
    if staging is not None and staging.arena is not None:
        arena = staging.arena
        staging.arena = None
        if arena.pool_id is not None:
            link.release_later("pools", arena.pool_id, arena.generation)
        arena.close()


def connect_devices(path: str) -> list[IDevice]:
    """Connect to the service at ``path`` and return proxies of its devices."""
    link = ServiceLink(path)
    link.connect()
    return [RemoteDevice(link, index) for index in range(len(link.devices_info))]
