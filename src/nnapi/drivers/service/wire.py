"""The driver service's wire format: framing over a Unix socket, and the versioned message
schema (msgpack) with strict decoding of every field.

A frame is a 12-byte header — magic ``b"NNS1"``, payload length (u32, little endian),
number of file descriptors (u32) — then a msgpack payload. The descriptors travel beside
the bytes as SCM_RIGHTS ancillary data of the same ``sendmsg``; the receiver queues the
descriptors it gets and hands each frame the number its header announces (a frame
announcing more than arrived is a protocol error). Memory pools cross as descriptors and
are mapped on both sides; tensor bytes never go through the socket.

Models travel in ``nnapi.hal.serialize``'s plain form (shared with the compilation
cache), their pools replaced by references. A request is ``{"v": 1, "id": N, "op": NAME,
"a": {arguments}}``; a reply is ``{"v": 1, "id": N, "ok": True, "r": result}`` or
``{"v": 1, "id": N, "ok": False, "status": ErrorStatus, "msg": text, "shapes": [[dims, ok], ...]}``.
Every decoder here checks
types, ranges and lengths and raises ``WireError`` (INVALID_ARGUMENT) on anything else, so
the service never trusts a byte it did not check; nothing is ever unpickled.
"""

from __future__ import annotations

import array
import os
import socket
import struct
from typing import Any

import msgpack

from nnapi.codes import BYTE_SIZE_OF_CACHE_TOKEN, OperandCode
from nnapi.hal.types import (
    Capabilities,
    DataLocation,
    ErrorStatus,
    HalError,
    OutputShape,
    PerformanceInfo,
    Request,
    RequestArgument,
    Timing,
    is_extension_type,
)

#: Version of the message schema; a peer speaking another one is refused at ``hello``.
#: 2: an execution's request travels as one packed ``[pools, inputs, outputs]`` blob, so the
#: service can reuse the request it decoded and validated last time when the bytes repeat.
#: 3: the ``channel`` message: payloads may also travel through shared memory (``channel``).
PROTOCOL_VERSION = 3
MAGIC = b"NNS1"
HEADER = struct.Struct("<4sII")
#: Largest payload accepted (big values go by descriptor, not in messages).
MAX_PAYLOAD = 64 << 20
#: Most descriptors in one frame (the kernel's SCM_MAX_FD).
MAX_FDS = 253
#: Most values (list entries, map keys and values) one payload may decode into: a byte
#: of msgpack can become a 56-byte empty list, so a frame of MAX_PAYLOAD bytes could
#: otherwise take gigabytes (a model of 10,000 operands is about 200,000 values).
MAX_VALUES = 1 << 21
#: Payloads up to this size are decoded without counting (they cannot grow past a few MiB).
_COUNTED_FROM = 64 << 10
_ANCILLARY_SPACE = socket.CMSG_SPACE(MAX_FDS * 4)
_U64 = (1 << 64) - 1
_I64 = 1 << 63


class WireError(HalError):
    """A message that does not follow the schema: INVALID_ARGUMENT."""

    def __init__(self, message: str) -> None:
        super().__init__(ErrorStatus.INVALID_ARGUMENT, message)


class ProtocolError(Exception):
    """A broken stream (bad magic, oversized or truncated frame, missing descriptors): the
    connection is closed."""


# --- framing -------------------------------------------------------------------------------
def send_frame(sock: socket.socket, payload: bytes, fds: list[int] = ()) -> None:
    """Send one frame; ``fds`` go as SCM_RIGHTS with its first bytes."""
    data = HEADER.pack(MAGIC, len(payload), len(fds)) + payload
    if fds:
        sent = socket.send_fds(sock, [data], list(fds))
        if sent < len(data):
            sock.sendall(data[sent:])
    else:
        sock.sendall(data)


class FrameReader:
    """Reads frames from a socket, with the descriptors they carry."""

    def __init__(self, sock: socket.socket, descriptors: bool = True) -> None:
        """``descriptors=False``: a peer that never sends any (the service's replies); the
        kernel closes any it sends anyway, and each receive goes into one reused buffer."""
        self._sock = sock
        self._buffer = bytearray()
        self._fds: list[int] = []
        self._descriptors = descriptors
        #: one receive buffer, reused (no 64 KiB allocation per message)
        self._chunk = bytearray(1 << 16)

    def _receive(self) -> bytes:
        """One recvmsg: its bytes; the descriptors that came with them are queued."""
        chunk = self._chunk
        if not self._descriptors:
            count = self._sock.recv_into(chunk)
            if not count:
                raise EOFError("connection closed")
            return chunk[:count]
        count, ancillary, flags, _ = self._sock.recvmsg_into([chunk], _ANCILLARY_SPACE)
        data = chunk[:count]
        for level, kind, cdata in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds = array.array("i")
                fds.frombytes(cdata[: len(cdata) - len(cdata) % fds.itemsize])
                self._fds.extend(fds)
        if flags & socket.MSG_CTRUNC:
            raise ProtocolError("descriptors truncated")
        if len(self._fds) > 4 * MAX_FDS:
            raise ProtocolError("too many descriptors queued")
        if not data:
            raise EOFError("connection closed")
        return data

    @property
    def buffered(self) -> bool:
        """Bytes or descriptors received and not yet handed out (a frame may be waiting
        that poll() would not announce)."""
        return bool(self._buffer or self._fds)

    def _fill(self) -> None:
        self._buffer += self._receive()

    def read(self) -> tuple[bytes, list[int]]:
        """The next frame's payload and descriptors (the caller owns and closes them).
        EOFError at a clean end of stream; ProtocolError for a broken one."""
        if not self._buffer and not self._fds:
            # The usual case: one receive brings exactly one whole frame and its descriptors.
            data = self._receive()
            if len(data) >= HEADER.size:
                magic, length, count = HEADER.unpack_from(data)
                if magic == MAGIC and len(data) == HEADER.size + length and count == len(self._fds):
                    fds, self._fds = self._fds, []
                    return data[HEADER.size:], fds
            self._buffer += data
        while len(self._buffer) < HEADER.size:
            if self._buffer:
                try:
                    self._fill()
                except EOFError:
                    raise ProtocolError("truncated frame header") from None
            else:
                self._fill()
        magic, length, count = HEADER.unpack_from(self._buffer)
        if magic != MAGIC:
            raise ProtocolError("bad frame magic")
        if length > MAX_PAYLOAD:
            raise ProtocolError(f"frame of {length} bytes exceeds the {MAX_PAYLOAD}-byte limit")
        if count > MAX_FDS:
            raise ProtocolError(f"frame announces {count} descriptors")
        while len(self._buffer) < HEADER.size + length:
            try:
                self._fill()
            except EOFError:
                raise ProtocolError("truncated frame") from None
        if len(self._fds) < count:
            raise ProtocolError(f"frame announces {count} descriptors, {len(self._fds)} arrived")
        payload = bytes(self._buffer[HEADER.size: HEADER.size + length])
        del self._buffer[: HEADER.size + length]
        fds, self._fds = self._fds[:count], self._fds[count:]
        return payload, fds

    def close(self) -> None:
        for fd in self._fds:
            _close_quietly(fd)
        self._fds = []


def _close_quietly(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass


def pack(message: Any) -> bytes:
    return msgpack.packb(message, use_bin_type=True)


def _unpack_failure(error: Exception) -> str:
    """What is wrong with a payload msgpack refused, in the schema's words (msgpack's own
    exceptions are several Python types whose names say nothing to the peer)."""
    text = str(error)
    if isinstance(error, msgpack.ExtraData):
        return "extra bytes after the packed value"
    if isinstance(error, msgpack.StackError):
        return "nested too deep"
    if isinstance(error, UnicodeDecodeError):
        return "a string that is not valid UTF-8"
    if isinstance(error, TypeError) and "unhashable" in text:
        return "a map key that is a list or a map"
    if "incomplete input" in text:
        return "truncated (the packed value ends past the payload)"
    if "exceeds max_" in text:
        return f"a length past the end of the payload, or a list or map of more than {MAX_VALUES} entries"
    if isinstance(error, _TooManyValues):
        return f"more than {MAX_VALUES} values"
    return "not valid msgpack"


class _TooManyValues(Exception):
    pass


def _unpack_counted(payload: bytes) -> Any:
    """msgpack.unpackb with at most MAX_VALUES values in all: each list and map is counted
    as it is made, and none may be longer than the whole budget."""
    left = [MAX_VALUES]

    def spend(count: int) -> None:
        left[0] -= count + 1
        if left[0] < 0:
            raise _TooManyValues

    def array(items: list) -> list:
        spend(len(items))
        return items

    def mapping(pairs: list) -> dict:
        spend(2 * len(pairs))
        return dict(pairs)

    return msgpack.unpackb(payload, raw=False, strict_map_key=False, list_hook=array, object_pairs_hook=mapping,
                           max_array_len=MAX_VALUES, max_map_len=MAX_VALUES // 2)


def unpack(payload: bytes, kind: type = dict) -> Any:
    """Decode a payload into a map (or ``kind``); WireError for anything else."""
    try:
        if len(payload) < _COUNTED_FROM:
            message = msgpack.unpackb(payload, raw=False, strict_map_key=False)
        else:
            message = _unpack_counted(payload)
    except Exception as error:  # msgpack raises several types for malformed input
        raise WireError(f"malformed message: {_unpack_failure(error)}") from None
    if not isinstance(message, kind):
        raise WireError("a message must be a map" if kind is dict else f"expected a packed {kind.__name__}")
    return message


# --- field checks --------------------------------------------------------------------------
def get_int(value: Any, what: str, low: int = -_I64, high: int = _U64) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise WireError(f"{what}: expected an integer, got {type(value).__name__}")
    if not low <= value <= high:
        raise WireError(f"{what}: {value} out of range [{low}, {high}]")
    return value


def get_opt_int(value: Any, what: str, low: int = -_I64, high: int = _U64) -> int | None:
    return None if value is None else get_int(value, what, low, high)


def get_float(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise WireError(f"{what}: expected a number, got {type(value).__name__}")
    return float(value)


def get_bool(value: Any, what: str) -> bool:
    if not isinstance(value, bool):
        raise WireError(f"{what}: expected a boolean, got {type(value).__name__}")
    return value


def get_str(value: Any, what: str, limit: int = 4096) -> str:
    if not isinstance(value, str) or len(value) > limit:
        raise WireError(f"{what}: expected a string of at most {limit} characters")
    return value


def get_bytes(value: Any, what: str, allow_none: bool = False) -> bytes | None:
    if value is None and allow_none:
        return None
    if not isinstance(value, bytes):
        raise WireError(f"{what}: expected bytes, got {type(value).__name__}")
    return value


def get_token(value: Any, what: str, allow_none: bool = False) -> bytes | None:
    """A compilation cache token: exactly BYTE_SIZE_OF_CACHE_TOKEN bytes."""
    token = get_bytes(value, what, allow_none)
    if token is not None and len(token) != BYTE_SIZE_OF_CACHE_TOKEN:
        raise WireError(f"{what}: must be {BYTE_SIZE_OF_CACHE_TOKEN} bytes, got {len(token)}")
    return token


def get_list(value: Any, what: str, length: int | None = None, limit: int = 1 << 24) -> list:
    if not isinstance(value, (list, tuple)):
        raise WireError(f"{what}: expected a list, got {type(value).__name__}")
    if length is not None and len(value) != length:
        raise WireError(f"{what}: expected {length} entries, got {len(value)}")
    if len(value) > limit:
        raise WireError(f"{what}: {len(value)} entries exceed the limit of {limit}")
    return list(value)


def get_ints(value: Any, what: str, low: int = -_I64, high: int = _U64) -> list[int]:
    return [get_int(v, f"{what}[{i}]", low, high) for i, v in enumerate(get_list(value, what))]


def get_map(value: Any, what: str) -> dict:
    if not isinstance(value, dict):
        raise WireError(f"{what}: expected a map, got {type(value).__name__}")
    return value


def _enum(kind, value: Any, what: str, extension_ok: bool = False):
    number = get_int(value, what, 0, (1 << 32) - 1)
    try:
        return kind(number)
    except ValueError:
        if extension_ok and is_extension_type(number):
            return number  # an extension type: prefix << 16 | type
        raise WireError(f"{what}: {number} is not a valid {kind.__name__}") from None


# --- HAL objects ---------------------------------------------------------------------------
def encode_request_arguments(arguments: list[RequestArgument]) -> list:
    return [[bool(a.has_no_value), int(a.location.pool_index), int(a.location.offset), int(a.location.length),
             [int(d) for d in a.dimensions]] for a in arguments]


def encode_request(pool_refs: list, request: Request) -> bytes:
    """An execution's request as one blob: ``[pool references, inputs, outputs]``. The same
    request (a reusable execution, a burst, staged buffers at the same arena offsets) packs
    to the same bytes, which the service uses as the key of what it decoded last time."""
    return pack([pool_refs, encode_request_arguments(request.inputs), encode_request_arguments(request.outputs)])


def decode_request(inputs_v: Any, outputs_v: Any, pools: list) -> Request:
    def arguments(value: Any, what: str) -> list[RequestArgument]:
        result = []
        for index, entry in enumerate(get_list(value, what, limit=1 << 16)):
            where = f"{what} {index}"
            none_v, pool_v, offset_v, length_v, dims_v = get_list(entry, where, 5)
            result.append(RequestArgument(get_bool(none_v, f"{where} has_no_value"),
                                          DataLocation(get_int(pool_v, f"{where} pool", 0, MAX_FDS),
                                                       get_int(offset_v, f"{where} offset", 0, _U64),
                                                       get_int(length_v, f"{where} length", 0, _U64)),
                                          get_ints(dims_v, f"{where} dimensions", 0, (1 << 32) - 1)))
        return result

    return Request(arguments(inputs_v, "input"), arguments(outputs_v, "output"), pools)


def encode_shapes(shapes: list[OutputShape]) -> list:
    return [[[int(d) for d in s.dimensions], bool(s.is_sufficient)] for s in shapes or []]


def decode_shapes(value: Any) -> list[OutputShape]:
    return [OutputShape(get_ints(dims, "output shape", 0, (1 << 32) - 1), get_bool(ok, "sufficient"))
            for dims, ok in (get_list(v, "output shape", 2) for v in get_list(value, "output shapes", limit=1 << 16))]


def encode_timing(timing: Timing) -> list:
    return [int(timing.time_on_device), int(timing.time_in_driver)]


def decode_timing(value: Any) -> Timing:
    """Nanoseconds, UINT64_MAX where not measured (the HAL's Timing)."""
    on_device, in_driver = get_list(value, "timing", 2)
    return Timing(get_int(on_device, "time on device", 0), get_int(in_driver, "time in driver", 0))


def encode_capabilities(c: Capabilities) -> dict:
    def perf(p: PerformanceInfo) -> list:
        return [float(p.exec_time), float(p.power_usage)]

    return {"rs": perf(c.relaxed_float32_to_float16_scalar), "rt": perf(c.relaxed_float32_to_float16_tensor),
            "ops": [[int(code), *perf(p)] for code, p in c.operand_performance.items()],
            "if": perf(c.if_performance), "while": perf(c.while_performance), "step": float(c.step_cost_s)}


def decode_capabilities(value: Any) -> Capabilities:
    fields = get_map(value, "capabilities")

    def perf(v: Any, what: str) -> PerformanceInfo:
        exec_time, power = get_list(v, "performance", 2)
        info = PerformanceInfo(get_float(exec_time, "exec time"), get_float(power, "power usage"))
        # Android's validateCapabilities: every figure greater than 0 (infinity: no
        # information); a 0 taken here would leave the whole device without performance
        # information in the runtime's check (capabilities.validated, whose field names the
        # message uses). NaN fails too.
        for figure, number in (("exec_time", info.exec_time), ("power_usage", info.power_usage)):
            if not number > 0:
                raise WireError(f"{what}.{figure}: must be a number > 0, got {number}")
        return info

    operand_performance = {}
    for entry in get_list(fields.get("ops"), "operand performance"):
        code, exec_time, power = get_list(entry, "operand performance", 3)
        key = _enum(OperandCode, code, "operand type", extension_ok=True)
        operand_performance[key] = perf([exec_time, power], f"operand_performance[{getattr(key, 'name', key)}]")
    step_cost = get_float(fields.get("step", 0.0), "step cost")  # absent from older services
    if not 0.0 <= step_cost < float("inf"):
        raise WireError(f"step cost: must be a finite number of seconds >= 0, got {step_cost}")
    return Capabilities(perf(fields.get("rs"), "relaxed_float32_to_float16_scalar"),
                        perf(fields.get("rt"), "relaxed_float32_to_float16_tensor"), operand_performance,
                        perf(fields.get("if"), "if_performance"), perf(fields.get("while"), "while_performance"),
                        step_cost)


def decode_hello(value: Any) -> list[dict]:
    """The service's answer to ``hello``: per device its name, version string, type,
    feature level, capabilities, cache file counts and extensions, each checked."""
    from nnapi.codes import DeviceTypeCode, FeatureLevelCode
    from nnapi.hal import serialize

    devices = []
    for index, entry in enumerate(get_list(get_map(value, "hello").get("devices"), "devices", limit=256)):
        where = f"device {index}"
        info = get_map(entry, where)
        cache = get_ints(info.get("cache", [0, 0]), f"{where} cache files", 0, 32)
        if len(cache) != 2:
            raise WireError(f"{where} cache files: expected 2 counts, got {len(cache)}")
        try:
            extensions = serialize.extensions_from_plain(info.get("ext", []))
        except HalError as error:
            raise WireError(f"{where} extensions: {error}") from None
        name = get_str(info.get("name"), f"{where} name", 256)
        if not name:
            raise WireError(f"{where} name: must not be empty")
        devices.append({"name": name,
                        "version": get_str(info.get("version"), f"{where} version"),
                        "type": _enum(DeviceTypeCode, info.get("type"), f"{where} type"),
                        "level": _enum(FeatureLevelCode, info.get("level"), f"{where} feature level"),
                        "caps": decode_capabilities(info.get("caps")),
                        "cache": (cache[0], cache[1]), "ext": extensions})
    if not devices:
        raise WireError("devices: the service serves none")
    return devices
