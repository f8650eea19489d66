"""The ONNX Runtime devices' compilation cache files: their layout (magic, JSON header,
checksum, payload), writing and reading them, and the file of a model prepared per pattern
of omitted inputs.

The checksum catches damage; that the device wrote the file (a file resealed over another
valid graph passes a checksum anyone can recompute) is the private record's to say
(drivers/cache_record.py): each file written is recorded by its checksum, and a file read
must be recorded before its graph or HAL model is parsed.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

import onnxruntime as ort

from nnapi import vlog
from nnapi._version import __version__
from nnapi.drivers import cache_record
from nnapi.drivers.ort.omitted import PatternKey
from nnapi.drivers.ort.session import session_options
from nnapi.drivers.ort.signature import Signature
from nnapi.hal import ErrorStatus, HalError, Model

if TYPE_CHECKING:  # (that module imports this one)
    from nnapi.drivers.ort.device import OrtDevice


#: Cache file layout version; a cache written by another version is refused.
CACHE_VERSION = 3  # 2: the checksum covers the header too; 3: graphs optimized without DoubleQDQPairsRemover
_CACHE_MAGIC = b"NNAPI-ORT\0"


# --- cache files ------------------------------------------------------------------------
def _cache_identity(device: OrtDevice) -> dict:
    return {"version": CACHE_VERSION, "nnapi": __version__, "onnxruntime": ort.__version__,
            "provider": device.provider}


def _checksum(header: dict, payload: bytes) -> str:
    """SHA-256 of the header's other fields (canonical JSON) and the payload: a file changed
    anywhere after writing, what execution binds included, is refused when read."""
    fields = {key: value for key, value in header.items() if key != "sha256"}
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode() + b"\0" + payload).hexdigest()


def _write_cache(fd: int, token: bytes, device: OrtDevice, payload: bytes, fields: dict) -> None:
    """The cache file: magic, header length, a JSON header (identity, token, ``fields``: a
    graph's signature, or what a patterns file holds; the checksum of all of it and the
    payload) and the payload."""
    header = {**_cache_identity(device), "token": bytes(token).hex(), **fields}
    header["sha256"] = _checksum(header, payload)
    encoded = json.dumps(header, sort_keys=True).encode()
    data = _CACHE_MAGIC + len(encoded).to_bytes(4, "little") + encoded + payload
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        os.ftruncate(fd, 0)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    except OSError as error:
        raise HalError(ErrorStatus.GENERAL_FAILURE, f"cannot write the cache file: {error}") from None
    # the checksum covers the header and the payload: the record binds all of the file
    cache_record.remember(device.name, token, header["sha256"])


def _cache_refused(why: str) -> HalError:
    return HalError(ErrorStatus.GENERAL_FAILURE, f"cache refused: {why}")


_Decoded = TypeVar("_Decoded")


def _decoded(decode: Callable[[], _Decoded]) -> _Decoded:
    """``decode()``, a malformed cache header refused as a HalError (never a raw exception)."""
    try:
        return decode()
    except HalError:
        raise
    except (ValueError, KeyError, TypeError, IndexError, AttributeError, OverflowError, RecursionError) as error:
        # (UnicodeDecodeError is a ValueError; AttributeError: a field of another JSON kind,
        # a signature that is a list or a number; RecursionError: JSON nested past the
        # parser's depth)
        raise _cache_refused(f"bad header: {type(error).__name__}: {error}") from None


def _read_cache(fd: int, token: bytes, device: OrtDevice) -> tuple[dict, bytes]:
    """(header, payload) of a cache file written for this device, version and token, its
    payload's checksum checked, the file in the device's private record of what it wrote
    (cache_record) and a graph's inputs and outputs its signature's (``check_graph``);
    HalError otherwise."""
    try:
        size = os.fstat(fd).st_size
        os.lseek(fd, 0, os.SEEK_SET)
        chunks = []
        remaining = size
        while remaining > 0:
            chunk = os.read(fd, remaining)
            if not chunk:
                break
            chunks.append(chunk)
            remaining -= len(chunk)
        data = b"".join(chunks)
    except (OSError, TypeError, ValueError) as error:
        raise _cache_refused(f"cannot read it: {error}") from None
    if not data.startswith(_CACHE_MAGIC) or len(data) < len(_CACHE_MAGIC) + 4:
        raise _cache_refused("not an nnapi-ort cache file")
    start = len(_CACHE_MAGIC) + 4
    length = int.from_bytes(data[len(_CACHE_MAGIC):start], "little")

    def header_of() -> dict:
        header = json.loads(data[start:start + length])
        if not isinstance(header, dict):
            raise ValueError("header is not an object")
        for key, expected in _cache_identity(device).items():
            if header.get(key) != expected:
                raise _cache_refused(f"{key} is {header.get(key)!r}, expected {expected!r}")
        if header.get("token") != bytes(token).hex():
            raise _cache_refused("token mismatch")
        if header.get("sha256") != _checksum(header, data[start + length:]):
            raise _cache_refused("checksum mismatch")
        return header

    header, payload = _decoded(header_of), data[start + length:]
    cache_record.require(device.name, token, header["sha256"])
    if header.get("kind", "graph") == "graph":
        check_graph(_decoded(lambda: Signature.from_json(header["signature"])), payload)
    return header, payload


def check_graph(signature: Signature, graph: bytes) -> None:
    """Refuse a cached graph that does not bind as its signature says: every input and
    output the signature names is the graph's, of that element type, of those dimensions
    where both know them, and the graph has no input the signature does not feed. (A graph
    replaced by another valid ONNX model, or a signature changed, with the checksum
    rewritten: it was loaded, and every execution failed where the runtime could have
    compiled afresh.)"""
    from onnx import ModelProto, TensorProto, helper

    try:
        graph_proto = ModelProto.FromString(graph).graph
    except Exception as error:  # noqa: BLE001 - protobuf's DecodeError and whatever else it raises
        raise _cache_refused(f"the cached graph is not an ONNX model ({type(error).__name__})") from None

    def declared(values) -> dict[str, tuple[int, list[int | None] | None]]:
        found = {}
        for value in values:
            tensor = value.type.tensor_type
            shape = ([d.dim_value if d.HasField("dim_value") else None for d in tensor.shape.dim]
                     if tensor.HasField("shape") else None)
            found[value.name] = (tensor.elem_type, shape)
        return found

    if not signature.outputs:
        raise _cache_refused("the cached signature has no output")
    for side, specs in (("input", signature.inputs), ("output", signature.outputs)):
        names = [spec.name for spec in specs]
        if len(set(names)) != len(names):
            raise _cache_refused(f"the cached signature names an {side} twice")
    initializers = {tensor.name for tensor in graph_proto.initializer}
    inputs = {name: spec for name, spec in declared(graph_proto.input).items() if name not in initializers}
    outputs = declared(graph_proto.output)
    for side, specs, graph_side in (("input", signature.inputs, inputs), ("output", signature.outputs, outputs)):
        for spec in specs:
            if spec.name not in graph_side:
                raise _cache_refused(f"the cached graph has no {side} {spec.name!r}")
            elem_type, shape = graph_side[spec.name]
            try:
                expected = helper.np_dtype_to_tensor_dtype(spec.dtype)
            except (KeyError, ValueError, TypeError):
                expected = TensorProto.UNDEFINED
            if elem_type != expected:
                raise _cache_refused(f"the cached graph's {side} {spec.name!r} is of ONNX type {elem_type}, "
                                     f"its signature says {spec.dtype}")
            if shape is not None and spec.dimensions:
                if len(shape) != len(spec.dimensions) or any(
                        known and wanted and known != wanted for known, wanted in zip(shape, spec.dimensions)):
                    raise _cache_refused(f"the cached graph's {side} {spec.name!r} has shape {shape}, its "
                                         f"signature says {spec.dimensions}")
    unfed = sorted(set(inputs) - {spec.name for spec in signature.inputs})
    if unfed:
        raise _cache_refused(f"the cached graph has inputs its signature does not feed: {unfed[:4]}")


def _cached_session_options(mem_pattern: bool = False) -> ort.SessionOptions:
    """A cached graph is already optimized for this machine: loaded as it is (with ORT's
    memory pattern where its header says the model's was planned: session.plans_memory;
    a pattern file's graphs run without it)."""
    options = session_options(mem_pattern=mem_pattern)
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return options


class _PatternCache:
    """The cache file of a model whose inputs a request may omit: the HAL model (as the
    reference's cache holds one, ``cache_format``: nothing pickled) and, per pattern of
    omitted inputs prepared so far, its key, signature and optimized graph. Written when
    the model is prepared and again as each new pattern is (through a duplicate of the
    runtime's descriptor); a failed write leaves the cache as it was (a later compilation
    then prepares what it lacks), never the preparation or the run."""

    def __init__(self, device: OrtDevice, model: Model, fd: int, token: bytes,
                 graphs: dict[PatternKey, tuple[Signature, bytes]] | None) -> None:
        from nnapi.drivers.cache_format import pack

        self._device = device
        self._token = bytes(token)
        self._graphs = dict(graphs or {})
        self._lock = threading.Lock()
        self._model_bytes, self._data_bytes = pack(model, self._token)
        try:
            self._fd: int | None = os.dup(fd)
        except OSError:
            self._fd = None
            return
        weakref.finalize(self, os.close, self._fd)
        if graphs is None:  # a new cache: the model now, its patterns as they come
            self._write()

    def add(self, key: PatternKey, signature: Signature, graph: bytes) -> None:
        with self._lock:
            self._graphs[key] = (signature, graph)
            self._write()

    def _write(self) -> None:
        if self._fd is None:
            return
        patterns = [{"omitted": sorted(key[0]), "dimensions": [[p, list(d)] for p, d in key[1]],
                     "signature": signature.to_json(), "bytes": len(graph)}
                    for key, (signature, graph) in self._graphs.items()]
        payload = b"".join([self._model_bytes, self._data_bytes, *(graph for _, graph in self._graphs.values())])
        fields = {"kind": "patterns", "model_bytes": len(self._model_bytes), "data_bytes": len(self._data_bytes),
                  "patterns": patterns}
        try:
            _write_cache(self._fd, self._token, self._device, payload, fields)
        except HalError as error:
            vlog.driver.info("%s: the cache file was not written: %s", self._device.name, error)


def _decode_patterns(header: dict, payload: bytes, token: bytes
                     ) -> tuple[Model, dict[PatternKey, tuple[Signature, bytes]]]:
    """The HAL model and the patterns' graphs of a patterns cache file, every field checked."""
    from nnapi.drivers.cache_format import unpack

    def count(value: object) -> int:
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ValueError(f"bad size {value!r}")
        return value

    def decode() -> tuple[int, int, list[tuple[PatternKey, Signature, int]]]:
        patterns = []
        for entry in header["patterns"]:
            omitted = frozenset(count(p) for p in entry["omitted"])
            dimensions = tuple((count(p), tuple(count(d) for d in dims)) for p, dims in entry["dimensions"])
            patterns.append(((omitted, dimensions), Signature.from_json(entry["signature"]), count(entry["bytes"])))
        return count(header["model_bytes"]), count(header["data_bytes"]), patterns

    model_size, data_size, patterns = _decoded(decode)
    if model_size + data_size + sum(size for _, _, size in patterns) != len(payload):
        raise _cache_refused("the sizes in the header do not add up to the file's")
    model = unpack(payload[:model_size], payload[model_size:model_size + data_size], token)
    graphs = {}
    offset = model_size + data_size
    for key, signature, size in patterns:
        graph = payload[offset:offset + size]
        offset += size
        try:
            check_graph(signature, graph)
        except HalError as error:  # that pattern is lowered afresh, the others still come from the file
            vlog.driver.info("a cached pattern's graph is left out: %s", error)
            continue
        graphs[key] = (signature, graph)
    return model, graphs
