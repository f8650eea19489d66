"""nnapi-reference's compilation cache format: what it writes into the runtime's cache files.

Two files, never pickled:
- model cache: ``MAGIC`` + a JSON header line (format version, nnapi version, the cache
  token, SHA-256 of the body and of the data file) + the JSON body: the validated HAL model
  as plain data (``hal.serialize``), its byte blobs replaced by references into the data file;
- data cache: an ``.npz`` archive (``np.savez``: uncompressed ``.npy`` entries) of the
  constant blob and the constant pools, read back entry by entry (``_arrays``), never
  pickled, never inflated, never larger than the file.

``unpack`` trusts nothing: a wrong magic, version or token, a checksum mismatch (a
truncated, tampered or swapped file), or a malformed body raises HalError, and the runtime
then compiles afresh. Both files are read once into memory before checking, so a file
swapped during the read cannot mix two versions. The checksums only catch damage (anyone
can recompute them): a driver reading its own cache files also asks ``cache_record`` whether
it wrote them (``record`` after writing, ``unpack(..., recorded_by=name)``), before the body
is parsed.
"""

from __future__ import annotations

import hashlib
import io
import json
import zipfile
from typing import Any

import numpy as np

from nnapi._npy import read_npy_header
from nnapi._version import __version__
from nnapi.drivers import cache_record
from nnapi.hal.serialize import model_from_plain, model_to_plain
from nnapi.hal.types import ErrorStatus, HalError, Model, pool_view

MAGIC = b"NNAPI-REFERENCE-CACHE\n"
FORMAT = 1


def _bad(message: str) -> HalError:
    return HalError(ErrorStatus.GENERAL_FAILURE, f"cache rejected: {message}")


def pack(model: Model, token: bytes) -> tuple[bytes, bytes]:
    """(model cache bytes, data cache bytes) for ``model``."""
    arrays: dict[str, np.ndarray] = {}

    def blob(data: Any) -> dict:
        name = f"b{len(arrays)}"
        arrays[name] = np.frombuffer(pool_view(data), np.uint8)
        return {"$blob": name}

    plain = model_to_plain(model, encode_pool=blob)
    plain["operand_values"] = blob(plain["operand_values"])
    body = json.dumps(_hexify(plain), separators=(",", ":"), allow_nan=False).encode()
    stream = io.BytesIO()
    np.savez(stream, **arrays)
    data = stream.getvalue()
    header = {"format": FORMAT, "nnapi": __version__, "token": bytes(token).hex(),
              "body_sha256": hashlib.sha256(body).hexdigest(), "data_sha256": hashlib.sha256(data).hexdigest()}
    return MAGIC + json.dumps(header).encode() + b"\n" + body, data


def _seal(header: dict) -> str:
    """What the private record binds: the format, version and the SHA-256 of the body and
    the data file (every byte ``unpack`` uses past the header's checked fields)."""
    return f"nnapi-reference-cache/{header.get('format')}/{header.get('nnapi')}/{header.get('body_sha256')}/" \
           f"{header.get('data_sha256')}"


def record(device: str, model_bytes: bytes, token: bytes) -> bool:
    """Record in ``device``'s private record (cache_record) that it wrote the cache whose
    model file is ``model_bytes`` (as ``pack`` made it) for ``token``; whether it was."""
    header = json.loads(model_bytes[len(MAGIC):].partition(b"\n")[0])
    return cache_record.remember(device, token, _seal(header))


def unpack(model_bytes: bytes, data_bytes: bytes, token: bytes, recorded_by: str | None = None) -> Model:
    """The model ``pack`` wrote, after checking everything; HalError otherwise.
    ``recorded_by``: a driver's name, whose private record must hold this cache for
    ``token`` (``record``); None for a cache inside a file a driver checked itself."""
    if not model_bytes.startswith(MAGIC):
        raise _bad("not an nnapi-reference cache file")
    header_line, newline, body = model_bytes[len(MAGIC):].partition(b"\n")
    if not newline:
        raise _bad("truncated header")
    try:
        header = json.loads(header_line)
    except (ValueError, RecursionError):  # (RecursionError: arrays nested past the parser's depth)
        raise _bad("unreadable header") from None
    if not isinstance(header, dict):
        raise _bad("unreadable header")
    if header.get("format") != FORMAT or header.get("nnapi") != __version__:
        raise _bad(f"written by another version ({header.get('nnapi')!r}, format {header.get('format')!r})")
    if header.get("token") != bytes(token).hex():
        raise _bad("written for another token")
    if header.get("body_sha256") != hashlib.sha256(body).hexdigest():
        raise _bad("the model cache file is damaged")
    if header.get("data_sha256") != hashlib.sha256(data_bytes).hexdigest():
        raise _bad("the data cache file is damaged or belongs to another model")
    if recorded_by is not None:
        cache_record.require(recorded_by, token, _seal(header))
    try:
        plain = _unhexify(json.loads(body))
    except (ValueError, RecursionError) as error:
        raise _bad(f"unreadable content: {type(error).__name__}: {error}") from None
    arrays = _arrays(data_bytes)

    def unblob(ref: Any) -> bytes:
        if not isinstance(ref, dict) or not isinstance(ref.get("$blob"), str) or ref["$blob"] not in arrays:
            raise _bad("a blob reference is broken")
        array = arrays[ref["$blob"]]
        if array.dtype != np.uint8 or array.ndim != 1:
            raise _bad("a blob has the wrong type")
        return array.tobytes()

    if not isinstance(plain, dict) or "operand_values" not in plain:
        raise _bad("the body is not a model")
    plain["operand_values"] = unblob(plain["operand_values"])
    return model_from_plain(plain, decode_pool=unblob)


def _arrays(data: bytes) -> dict[str, np.ndarray]:
    """The data file's arrays, read only in the form ``pack`` writes them: uncompressed
    (stored) ``.npy`` entries of 1-D uint8 whose header's size is the entry's, together no
    larger than the file. np.load allocated what an entry's header claims before reading
    it (a 1 TiB MemoryError from a 60-byte header) and inflated compressed entries (a 3 MB
    file held 3 GiB); nothing read here is larger than the file."""
    arrays: dict[str, np.ndarray] = {}
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            entries = archive.infolist()
            if sum(entry.file_size for entry in entries) > len(data):
                raise _bad("the data file's entries are larger than the file")
            for entry in entries:
                if entry.compress_type != zipfile.ZIP_STORED or not entry.filename.endswith(".npy"):
                    raise _bad(f"the data file's entry {entry.filename[:40]!r} is not a stored .npy array")
                if entry.flag_bits & 1:  # (zipfile's read raises a raw RuntimeError asking for a password)
                    raise _bad(f"the data file's entry {entry.filename[:40]!r} is encrypted; pack writes none")
                raw = archive.read(entry)
                stream = io.BytesIO(raw)
                try:
                    shape, dtype = read_npy_header(stream)
                except ValueError as error:
                    raise _bad(f"the data file's entry {entry.filename[:40]!r}: {error}") from None
                if dtype != np.uint8 or len(shape) != 1 or shape[0] != len(raw) - stream.tell():
                    raise _bad("a blob has the wrong type")
                arrays[entry.filename[:-4]] = np.frombuffer(raw, np.uint8, offset=stream.tell())
    except HalError:
        raise
    except (ValueError, KeyError, OSError, EOFError, zipfile.BadZipFile, NotImplementedError, TypeError,
            SyntaxError) as error:  # (a damaged archive or .npy header; the header is a Python literal)
        raise _bad(f"unreadable data file: {type(error).__name__}: {error}") from None
    return arrays


def _hexify(value: Any) -> Any:
    """JSON has no bytes: spell them {"$hex": "..."} (only extension data is left as bytes)."""
    if isinstance(value, bytes | bytearray):
        return {"$hex": bytes(value).hex()}
    if isinstance(value, dict):
        return {k: _hexify(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_hexify(v) for v in value]
    return value


def _unhexify(value: Any) -> Any:
    if isinstance(value, dict):
        if set(value) == {"$hex"}:
            if not isinstance(value["$hex"], str):
                raise _bad("bad hex")
            return bytes.fromhex(value["$hex"])
        return {k: _unhexify(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_unhexify(v) for v in value]
    return value
