"""The ONNX Runtime devices' compilation cache files: their layout (magic, JSON header,
checksum, payload), writing and reading them, and the file of a model prepared per pattern
of omitted inputs.
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


def _cache_refused(why: str) -> HalError:
    return HalError(ErrorStatus.GENERAL_FAILURE, f"cache refused: {why}")


_Decoded = TypeVar("_Decoded")


def _decoded(decode: Callable[[], _Decoded]) -> _Decoded:
    """``decode()``, a malformed cache header refused as a HalError (never a raw exception)."""
    try:
        return decode()
    except HalError:
        raise
    except (ValueError, KeyError, TypeError, IndexError, UnicodeDecodeError) as error:
        raise _cache_refused(f"bad header: {error}") from None


def _read_cache(fd: int, token: bytes, device: OrtDevice) -> tuple[dict, bytes]:
    """(header, payload) of a cache file written for this device, version and token, its
    payload's checksum checked; HalError otherwise."""
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

    return _decoded(header_of), data[start + length:]


def _cached_session_options() -> ort.SessionOptions:
    """A cached graph is already optimized for this machine: loaded as it is."""
    options = session_options()
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
        graphs[key] = (signature, payload[offset:offset + size])
        offset += size
    return model, graphs
