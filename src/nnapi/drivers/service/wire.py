"""The driver service's wire format: framing over a Unix socket, and the versioned message
schema (msgpack) with strict decoding of every field.

A frame is a 12-byte header — magic ``b"NNS1"``, payload length (u32, little endian),
number of file descriptors (u32) — then a msgpack payload. The descriptors travel beside
the bytes as SCM_RIGHTS ancillary data of the same ``sendmsg``; the receiver queues the
descriptors it gets and hands each frame the number its header announces (a frame
announcing more than arrived is a protocol error). Memory pools cross as descriptors and
are mapped on both sides; tensor bytes never go through the socket.

A request is ``{"v": 1, "id": N, "op": NAME, "a": {arguments}}``; a reply is ``{"v": 1,
"id": N, "ok": True, "r": result}`` or ``{"v": 1, "id": N, "ok": False, "status":
ErrorStatus, "msg": text, "shapes": [[dims, sufficient], ...]}``. Every decoder here checks
types, ranges and lengths and raises ``WireError`` (INVALID_ARGUMENT) on anything else, so
the service never trusts a byte it did not check; nothing is ever unpickled.
"""

from __future__ import annotations

import os
import socket
import struct
from typing import Any

import msgpack

from nnapi.codes import OperandCode, OperationCode
from nnapi.hal.types import (
    Capabilities,
    DataLocation,
    ErrorStatus,
    HalError,
    Model,
    Operand,
    OperandLifeTime,
    Operation,
    OutputShape,
    PerformanceInfo,
    Request,
    RequestArgument,
    Subgraph,
    Timing,
)
from nnapi.operand import SymmPerChannelQuantParams

#: Version of the message schema; a peer speaking another one is refused at ``hello``.
PROTOCOL_VERSION = 1
MAGIC = b"NNS1"
HEADER = struct.Struct("<4sII")
#: Largest payload accepted (big values go by descriptor, not in messages).
MAX_PAYLOAD = 64 << 20
#: Most descriptors in one frame (the kernel's SCM_MAX_FD).
MAX_FDS = 253
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

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._buffer = bytearray()
        self._fds: list[int] = []

    def _fill(self) -> None:
        data, fds, flags, _ = socket.recv_fds(self._sock, 1 << 16, MAX_FDS)
        self._fds.extend(fds)
        if flags & socket.MSG_CTRUNC:
            raise ProtocolError("descriptors truncated")
        if not data:
            raise EOFError("connection closed")
        self._buffer += data
        if len(self._fds) > 4 * MAX_FDS:
            raise ProtocolError("too many descriptors queued")

    def read(self) -> tuple[bytes, list[int]]:
        """The next frame's payload and descriptors (the caller owns and closes them).
        EOFError at a clean end of stream; ProtocolError for a broken one."""
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


def pack(message: dict) -> bytes:
    return msgpack.packb(message, use_bin_type=True)


def unpack(payload: bytes) -> dict:
    """Decode a payload into a map; WireError for anything that is not a msgpack map."""
    try:
        message = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except Exception as error:  # msgpack raises several types for malformed input
        raise WireError(f"malformed message: {type(error).__name__}: {error}") from None
    if not isinstance(message, dict):
        raise WireError("a message must be a map")
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
        if extension_ok and number >= 1 << 16:
            return number  # an extension type: prefix << 16 | type
        raise WireError(f"{what}: {number} is not a valid {kind.__name__}") from None


# --- HAL objects ---------------------------------------------------------------------------
def encode_model(model: Model, pool_refs: list[Any], values_ref: Any) -> dict:
    """A HAL model as plain data; ``pool_refs`` replace its pools, ``values_ref`` its
    constant blob (bytes, or a pool reference when large)."""
    return {
        "main": _encode_subgraph(model.main),
        "ref": [_encode_subgraph(s) for s in model.referenced],
        "values": values_ref,
        "pools": pool_refs,
        "relaxed": bool(model.relax_computation_float32_to_float16),
        "ext": [[e.name, int(e.prefix)] for e in getattr(model, "extension_name_to_prefix", [])],
    }


def _encode_subgraph(subgraph: Subgraph) -> list:
    operands = []
    for o in subgraph.operands:
        quant = None
        if o.channel_quant is not None:
            quant = [int(o.channel_quant.channel_dim), [float(s) for s in o.channel_quant.scales]]
        operands.append([int(o.type), [int(d) for d in o.dimensions], float(o.scale), int(o.zero_point),
                         int(o.lifetime), [int(o.location.pool_index), int(o.location.offset),
                                           int(o.location.length)], quant, int(o.number_of_consumers)])
    operations = [[int(op.type), [int(i) for i in op.inputs], [int(i) for i in op.outputs]]
                  for op in subgraph.operations]
    return [operands, operations, [int(i) for i in subgraph.input_indexes],
            [int(i) for i in subgraph.output_indexes]]


def decode_subgraph(value: Any, what: str) -> Subgraph:
    operands_v, operations_v, inputs_v, outputs_v = get_list(value, what, 4)
    operands = []
    for index, entry in enumerate(get_list(operands_v, f"{what} operands")):
        where = f"{what} operand {index}"
        type_v, dims_v, scale_v, zero_v, lifetime_v, location_v, quant_v, consumers_v = get_list(entry, where, 8)
        pool, offset, length = get_ints(get_list(location_v, f"{where} location", 3), f"{where} location", 0, _U64)
        quant = None
        if quant_v is not None:
            channel_dim_v, scales_v = get_list(quant_v, f"{where} channel quant", 2)
            quant = SymmPerChannelQuantParams(get_int(channel_dim_v, f"{where} channel dim", 0, 1 << 16),
                                              [get_float(s, f"{where} scale") for s in get_list(scales_v, where)])
        operands.append(Operand(
            type=_enum(OperandCode, type_v, f"{where} type", extension_ok=True),
            dimensions=get_ints(dims_v, f"{where} dimensions", 0, (1 << 32) - 1),
            scale=get_float(scale_v, f"{where} scale"),
            zero_point=get_int(zero_v, f"{where} zero point", -(1 << 31), (1 << 31) - 1),
            lifetime=_enum(OperandLifeTime, lifetime_v, f"{where} lifetime"),
            location=DataLocation(pool, offset, length),
            channel_quant=quant,
            number_of_consumers=get_int(consumers_v, f"{where} consumers", 0, 1 << 32),
        ))
    operations = []
    for index, entry in enumerate(get_list(operations_v, f"{what} operations")):
        where = f"{what} operation {index}"
        type_v, in_v, out_v = get_list(entry, where, 3)
        operations.append(Operation(_enum(OperationCode, type_v, f"{where} type", extension_ok=True),
                                    get_ints(in_v, f"{where} inputs", 0, 1 << 32),
                                    get_ints(out_v, f"{where} outputs", 0, 1 << 32)))
    return Subgraph(operands, operations, get_ints(inputs_v, f"{what} inputs", 0, 1 << 32),
                    get_ints(outputs_v, f"{what} outputs", 0, 1 << 32))


def decode_model(value: Any, resolve_pool, resolve_values) -> Model:
    """The HAL model of a message; ``resolve_pool(ref)`` / ``resolve_values(ref)`` turn
    pool references into buffers (raising WireError for unknown ones)."""
    fields = get_map(value, "model")
    model = Model(
        main=decode_subgraph(fields.get("main"), "main"),
        referenced=[decode_subgraph(s, f"referenced[{i}]")
                    for i, s in enumerate(get_list(fields.get("ref"), "referenced", limit=1 << 16))],
        operand_values=resolve_values(fields.get("values")),
        pools=[resolve_pool(p) for p in get_list(fields.get("pools"), "model pools", limit=MAX_FDS)],
        relax_computation_float32_to_float16=get_bool(fields.get("relaxed"), "relaxed"),
    )
    extensions = get_list(fields.get("ext", []), "extensions", limit=1 << 16)
    if extensions:
        from nnapi.hal import types

        pair = getattr(types, "ExtensionNameAndPrefix", None)
        if pair is None:
            raise WireError("this service does not support extensions")
        model.extension_name_to_prefix = [
            pair(get_str(n, "extension name"), get_int(p, "extension prefix", 0, 0xFFFF))
            for n, p in (get_list(e, "extension", 2) for e in extensions)]
    return model


def encode_request_arguments(arguments: list[RequestArgument]) -> list:
    return [[bool(a.has_no_value), int(a.location.pool_index), int(a.location.offset), int(a.location.length),
             [int(d) for d in a.dimensions]] for a in arguments]


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
            for dims, ok in (get_list(v, "output shape", 2) for v in get_list(value, "output shapes"))]


def encode_timing(timing: Timing) -> list:
    return [int(timing.time_on_device), int(timing.time_in_driver)]


def decode_timing(value: Any) -> Timing:
    on_device, in_driver = get_list(value, "timing", 2)
    return Timing(get_int(on_device, "time on device"), get_int(in_driver, "time in driver"))


def encode_capabilities(c: Capabilities) -> dict:
    def perf(p: PerformanceInfo) -> list:
        return [float(p.exec_time), float(p.power_usage)]

    return {"rs": perf(c.relaxed_float32_to_float16_scalar), "rt": perf(c.relaxed_float32_to_float16_tensor),
            "ops": [[int(code), *perf(p)] for code, p in c.operand_performance.items()],
            "if": perf(c.if_performance), "while": perf(c.while_performance)}


def decode_capabilities(value: Any) -> Capabilities:
    fields = get_map(value, "capabilities")

    def perf(v: Any) -> PerformanceInfo:
        exec_time, power = get_list(v, "performance", 2)
        return PerformanceInfo(get_float(exec_time, "exec time"), get_float(power, "power usage"))

    operand_performance = {}
    for entry in get_list(fields.get("ops"), "operand performance"):
        code, exec_time, power = get_list(entry, "operand performance", 3)
        operand_performance[_enum(OperandCode, code, "operand type", extension_ok=True)] = perf([exec_time, power])
    return Capabilities(perf(fields.get("rs")), perf(fields.get("rt")), operand_performance,
                        perf(fields.get("if")), perf(fields.get("while")))
