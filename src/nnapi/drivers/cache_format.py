"""nnapi-reference's compilation cache format: what it writes into the runtime's cache files.

Two files, never pickled:
- model cache: ``MAGIC`` + a JSON header line (format version, nnapi version, the cache
  token, SHA-256 of the body and of the data file) + the JSON body: the validated HAL model
  as plain data (``hal.serialize``), its byte blobs replaced by references into the data file;
- data cache: an ``.npz`` archive (numpy, ``allow_pickle=False``) of the constant blob and
  the constant pools.

``unpack`` trusts nothing: a wrong magic, version or token, a checksum mismatch (a
truncated, tampered or swapped file), or a malformed body raises HalError, and the runtime
then compiles afresh. Both files are read once into memory before checking, so a file
swapped during the read cannot mix two versions.
"""

from __future__ import annotations

import hashlib
import io
import json
import zipfile
from typing import Any

import numpy as np

from nnapi._version import __version__
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


def unpack(model_bytes: bytes, data_bytes: bytes, token: bytes) -> Model:
    """The model ``pack`` wrote, after checking everything; HalError otherwise."""
    if not model_bytes.startswith(MAGIC):
        raise _bad("not an nnapi-reference cache file")
    header_line, newline, body = model_bytes[len(MAGIC):].partition(b"\n")
    if not newline:
        raise _bad("truncated header")
    try:
        header = json.loads(header_line)
    except (ValueError, UnicodeDecodeError):
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
    try:
        plain = _unhexify(json.loads(body))
        with np.load(io.BytesIO(data_bytes), allow_pickle=False) as archive:
            arrays = {name: archive[name] for name in archive.files}
    except (ValueError, UnicodeDecodeError, KeyError, OSError, zipfile.BadZipFile, EOFError) as error:
        raise _bad(f"unreadable content: {error}") from None

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
