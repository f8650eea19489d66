"""HAL objects <-> plain data (dicts, lists, str, int, float, bool, bytes, None), with a
validating decoder. No I/O here: a transport (msgpack over a socket) or a cache file
format (JSON + .npz) wraps this.

Everything decoded is untrusted: the decoder checks every field's type and range and
raises HalError(INVALID_ARGUMENT) on anything malformed, never a raw exception. Structure
(operand indexes, pools in range, run order) is then ``validation.validate_model``'s job.

Pools (in models and requests) are encoded by a caller-supplied function, so a transport
can send a descriptor (FdPool) or the bytes; the default encodes a pool as its bytes.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable
from typing import Any

from nnapi.codes import OperandCode, OperationCode
from nnapi.hal.types import (
    Capabilities,
    DataLocation,
    ErrorStatus,
    Extension,
    ExtensionNameAndPrefix,
    ExtensionOperandTypeInformation,
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
    is_extension_type,
    pool_view,
)
from nnapi.operand import SymmPerChannelQuantParams

#: Bumped whenever the plain layout changes.
FORMAT_VERSION = 1

_MAX_U32 = 0xFFFFFFFF
_MAX_U64 = 0xFFFFFFFFFFFFFFFF
_OPERAND_CODES = frozenset(int(c) for c in OperandCode)
_OPERATION_CODES = frozenset(int(c) for c in OperationCode)
_LIFETIMES = frozenset(int(c) for c in OperandLifeTime)


def _bad(message: str) -> HalError:
    return HalError(ErrorStatus.INVALID_ARGUMENT, f"malformed HAL data: {message}")


def default_pool_encoder(pool: Any) -> bytes:
    return bytes(pool_view(pool))


def default_pool_decoder(plain: Any) -> Any:
    if not isinstance(plain, bytes | bytearray):
        raise _bad("a pool must be bytes")
    return bytes(plain)


# --- encoding ---------------------------------------------------------------------------
def _operand_to_plain(operand: Operand) -> dict:
    quant = operand.channel_quant
    return {
        "type": int(operand.type),
        "dimensions": [int(d) for d in operand.dimensions],
        "scale": float(operand.scale),
        "zero_point": int(operand.zero_point),
        "lifetime": int(operand.lifetime),
        "location": [int(operand.location.pool_index), int(operand.location.offset), int(operand.location.length)],
        "channel_quant": None if quant is None else [int(quant.channel_dim), [float(s) for s in quant.scales]],
        "number_of_consumers": int(operand.number_of_consumers),
        "extension_data": None if operand.extension_data is None else bytes(operand.extension_data),
    }


def _subgraph_to_plain(subgraph: Subgraph) -> dict:
    return {
        "operands": [_operand_to_plain(o) for o in subgraph.operands],
        "operations": [[int(o.type), [int(i) for i in o.inputs], [int(i) for i in o.outputs]]
                       for o in subgraph.operations],
        "inputs": [int(i) for i in subgraph.input_indexes],
        "outputs": [int(i) for i in subgraph.output_indexes],
    }


def model_to_plain(model: Model, encode_pool: Callable[[Any], Any] = default_pool_encoder) -> dict:
    """A HAL Model as plain data."""
    return {
        "version": FORMAT_VERSION,
        "main": _subgraph_to_plain(model.main),
        "referenced": [_subgraph_to_plain(s) for s in model.referenced],
        "operand_values": bytes(model.operand_values),
        "pools": [encode_pool(p) for p in model.pools],
        "relaxed": bool(model.relax_computation_float32_to_float16),
        "extensions": [[e.name, int(e.prefix)] for e in model.extension_name_to_prefix],
    }


def request_to_plain(request: Request, encode_pool: Callable[[Any], Any] = default_pool_encoder) -> dict:
    def argument(a: RequestArgument) -> list:
        loc = a.location
        return [bool(a.has_no_value), [int(loc.pool_index), int(loc.offset), int(loc.length)],
                [int(d) for d in a.dimensions]]

    return {"inputs": [argument(a) for a in request.inputs], "outputs": [argument(a) for a in request.outputs],
            "pools": [encode_pool(p) for p in request.pools]}


def output_shapes_to_plain(shapes: list[OutputShape]) -> list:
    return [[[int(d) for d in s.dimensions], bool(s.is_sufficient)] for s in shapes]


def timing_to_plain(timing: Timing) -> list:
    return [int(timing.time_on_device), int(timing.time_in_driver)]


def _performance_to_plain(info: PerformanceInfo) -> list:
    return [float(info.exec_time), float(info.power_usage)]


def capabilities_to_plain(capabilities: Capabilities) -> dict:
    return {
        "relaxed_scalar": _performance_to_plain(capabilities.relaxed_float32_to_float16_scalar),
        "relaxed_tensor": _performance_to_plain(capabilities.relaxed_float32_to_float16_tensor),
        "operands": [[int(code), *_performance_to_plain(info)]
                     for code, info in capabilities.operand_performance.items()],
        "if": _performance_to_plain(capabilities.if_performance),
        "while": _performance_to_plain(capabilities.while_performance),
        "step_cost_s": float(capabilities.step_cost_s),
    }


def extensions_to_plain(extensions: list[Extension]) -> list:
    return [[e.name, [[int(t.type), bool(t.is_tensor), int(t.byte_size)] for t in e.operand_types]]
            for e in extensions]


# --- decoding ---------------------------------------------------------------------------
def _int(value: Any, what: str, low: int = 0, high: int = _MAX_U32) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise _bad(f"{what} must be an int in [{low}, {high}], got {value!r}"[:200])
    return value


def _float(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise _bad(f"{what} must be a finite number, got {value!r}"[:200])
    return float(value)


def _bool(value: Any, what: str) -> bool:
    if not isinstance(value, bool):
        raise _bad(f"{what} must be a bool")
    return value


def _list(value: Any, what: str, length: int | None = None) -> list:
    if not isinstance(value, list | tuple) or (length is not None and len(value) != length):
        raise _bad(f"{what} must be a list" + (f" of {length}" if length is not None else ""))
    return list(value)


def _dict(value: Any, what: str, keys: tuple[str, ...]) -> dict:
    if not isinstance(value, dict) or any(k not in value for k in keys):
        raise _bad(f"{what} must be a dict with {', '.join(keys)}")
    return value


def _ints(value: Any, what: str) -> list[int]:
    return [_int(v, what) for v in _list(value, what)]


def _location(value: Any, what: str) -> DataLocation:
    pool, offset, length = _list(value, what, 3)
    return DataLocation(_int(pool, f"{what} pool"), _int(offset, f"{what} offset", high=_MAX_U64),
                        _int(length, f"{what} length", high=_MAX_U64))


def _operand_from_plain(value: Any, what: str) -> Operand:
    d = _dict(value, what, ("type", "dimensions", "scale", "zero_point", "lifetime", "location",
                            "channel_quant", "number_of_consumers", "extension_data"))
    code = _int(d["type"], f"{what} type")
    if code not in _OPERAND_CODES and not is_extension_type(code):
        raise _bad(f"{what} has unknown type {code}")
    lifetime = _int(d["lifetime"], f"{what} lifetime")
    if lifetime not in _LIFETIMES:
        raise _bad(f"{what} has unknown lifetime {lifetime}")
    quant = None
    if d["channel_quant"] is not None:
        channel_dim, scales = _list(d["channel_quant"], f"{what} channel_quant", 2)
        quant = SymmPerChannelQuantParams(_int(channel_dim, f"{what} channel_dim"),
                                          [_float(s, f"{what} scale") for s in _list(scales, f"{what} scales")])
    extension_data = d["extension_data"]
    if extension_data is not None and not isinstance(extension_data, bytes | bytearray):
        raise _bad(f"{what} extension_data must be bytes")
    return Operand(OperandCode(code) if code in _OPERAND_CODES else code,  # type: ignore[arg-type]
                   _ints(d["dimensions"], f"{what} dimensions"), _float(d["scale"], f"{what} scale"),
                   _int(d["zero_point"], f"{what} zero_point", -(1 << 31), _MAX_U32),
                   OperandLifeTime(lifetime), _location(d["location"], f"{what} location"), quant,
                   _int(d["number_of_consumers"], f"{what} number_of_consumers"),
                   None if extension_data is None else bytes(extension_data))


def _subgraph_from_plain(value: Any, what: str) -> Subgraph:
    d = _dict(value, what, ("operands", "operations", "inputs", "outputs"))
    operands = [_operand_from_plain(o, f"{what} operand {i}") for i, o in enumerate(_list(d["operands"], what))]
    operations = []
    for i, plain in enumerate(_list(d["operations"], f"{what} operations")):
        code, inputs, outputs = _list(plain, f"{what} operation {i}", 3)
        code = _int(code, f"{what} operation {i} type")
        if code not in _OPERATION_CODES and not is_extension_type(code):
            raise _bad(f"{what} operation {i} has unknown type {code}")
        operations.append(Operation(OperationCode(code) if code in _OPERATION_CODES else code,  # type: ignore[arg-type]
                                    _ints(inputs, f"{what} operation {i} inputs"),
                                    _ints(outputs, f"{what} operation {i} outputs")))
    return Subgraph(operands, operations, _ints(d["inputs"], f"{what} inputs"), _ints(d["outputs"], f"{what} outputs"))


def model_from_plain(value: Any, decode_pool: Callable[[Any], Any] = default_pool_decoder) -> Model:
    """Decode (and type-check) a plain model; HalError(INVALID_ARGUMENT) if malformed."""
    d = _dict(value, "model", ("version", "main", "referenced", "operand_values", "pools", "relaxed", "extensions"))
    if d["version"] != FORMAT_VERSION:
        raise _bad(f"format version {d['version']!r}, expected {FORMAT_VERSION}")
    values = d["operand_values"]
    if not isinstance(values, bytes | bytearray):
        raise _bad("operand_values must be bytes")
    extensions = []
    for i, plain in enumerate(_list(d["extensions"], "extensions")):
        name, prefix = _list(plain, f"extension {i}", 2)
        if not isinstance(name, str):
            raise _bad(f"extension {i} name must be a str")
        extensions.append(ExtensionNameAndPrefix(name, _int(prefix, f"extension {i} prefix", high=0xFFFF)))
    return Model(_subgraph_from_plain(d["main"], "main"),
                 [_subgraph_from_plain(s, f"referenced {i}") for i, s in enumerate(_list(d["referenced"], "ref"))],
                 bytes(values), [decode_pool(p) for p in _list(d["pools"], "pools")],
                 _bool(d["relaxed"], "relaxed"), extensions)


def request_from_plain(value: Any, decode_pool: Callable[[Any], Any] = default_pool_decoder) -> Request:
    d = _dict(value, "request", ("inputs", "outputs", "pools"))

    def argument(plain: Any, what: str) -> RequestArgument:
        no_value, location, dims = _list(plain, what, 3)
        return RequestArgument(_bool(no_value, f"{what} has_no_value"), _location(location, f"{what} location"),
                               _ints(dims, f"{what} dimensions"))

    return Request([argument(a, f"input {i}") for i, a in enumerate(_list(d["inputs"], "inputs"))],
                   [argument(a, f"output {i}") for i, a in enumerate(_list(d["outputs"], "outputs"))],
                   [decode_pool(p) for p in _list(d["pools"], "pools")])


def output_shapes_from_plain(value: Any) -> list[OutputShape]:
    shapes = []
    for i, plain in enumerate(_list(value, "output shapes")):
        dims, sufficient = _list(plain, f"output shape {i}", 2)
        shapes.append(OutputShape(_ints(dims, f"output shape {i}"), _bool(sufficient, f"output shape {i}")))
    return shapes


def timing_from_plain(value: Any) -> Timing:
    on_device, in_driver = _list(value, "timing", 2)
    return Timing(_int(on_device, "time_on_device", high=_MAX_U64), _int(in_driver, "time_in_driver", high=_MAX_U64))


def _performance_from_plain(value: Any, what: str) -> PerformanceInfo:
    exec_time, power = _list(value, what, 2)
    return PerformanceInfo(_float(exec_time, what), _float(power, what))


def capabilities_from_plain(value: Any) -> Capabilities:
    d = _dict(value, "capabilities", ("relaxed_scalar", "relaxed_tensor", "operands", "if", "while"))
    operands = {}
    for i, plain in enumerate(_list(d["operands"], "operand performance")):
        code, exec_time, power = _list(plain, f"operand performance {i}", 3)
        code = _int(code, f"operand performance {i} type")
        if code not in _OPERAND_CODES:
            raise _bad(f"operand performance {i}: unknown type {code}")
        operands[OperandCode(code)] = PerformanceInfo(_float(exec_time, "exec_time"), _float(power, "power_usage"))
    step_cost = _float(d.get("step_cost_s", 0.0), "step_cost_s")  # absent in older writers' data
    if step_cost < 0:
        raise _bad(f"step_cost_s must not be negative, got {step_cost}")
    return Capabilities(_performance_from_plain(d["relaxed_scalar"], "relaxed scalar"),
                        _performance_from_plain(d["relaxed_tensor"], "relaxed tensor"), operands,
                        _performance_from_plain(d["if"], "if"), _performance_from_plain(d["while"], "while"),
                        step_cost)


def extensions_from_plain(value: Any) -> list[Extension]:
    extensions = []
    for i, plain in enumerate(_list(value, "extensions")):
        name, types = _list(plain, f"extension {i}", 2)
        if not isinstance(name, str):
            raise _bad(f"extension {i} name must be a str")
        infos = []
        for j, info in enumerate(_list(types, f"extension {i} types")):
            code, is_tensor, size = _list(info, f"extension {i} type {j}", 3)
            infos.append(ExtensionOperandTypeInformation(_int(code, "type", high=0xFFFF), _bool(is_tensor, "is_tensor"),
                                                         _int(size, "byte_size")))
        extensions.append(Extension(name, infos))
    return extensions


# --- digests ----------------------------------------------------------------------------
def model_digest(model: Model) -> bytes:
    """A SHA-256 of everything that defines ``model`` (structure, constants, pool bytes)."""
    h = hashlib.sha256()

    def feed(value: Any) -> None:
        # A self-delimiting walk: type tag + length/content, so different values never collide.
        if isinstance(value, dict):
            h.update(b"d%d:" % len(value))
            for key in sorted(value):
                feed(key)
                feed(value[key])
        elif isinstance(value, list | tuple):
            h.update(b"l%d:" % len(value))
            for item in value:
                feed(item)
        elif isinstance(value, bytes | bytearray | memoryview):
            h.update(b"b%d:" % len(value))
            h.update(value)
        elif isinstance(value, str):
            encoded = value.encode()
            h.update(b"s%d:" % len(encoded))
            h.update(encoded)
        else:
            h.update(b"v" + repr(value).encode() + b";")

    feed(model_to_plain(model, encode_pool=pool_view))
    return h.digest()
