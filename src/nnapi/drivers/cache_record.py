"""The drivers' private record of the compilation cache files they wrote, and the check that
prepareModelFromCache uses only those.

A cache file's own checksums can be recomputed by whoever writes the file: a file resealed
over another valid model (another scale, constant or graph) passes them. The HAL asks a
driver to check the model cache before preparing from it (IDevice::getNumberOfCacheFilesNeeded:
the model cache is security-sensitive), and Android's drivers keep a hash of each cache in
their own storage. Here: when a driver writes a cache for a token it records an HMAC-SHA256
(a per-user random key) of its name, the token and the *seal* of what it wrote (the SHA-256
digests its file format computes over every byte it later uses); preparing from a cache
requires that record. A cache written on another machine, by another user, or changed since
has none and is recompiled, which the NDK allows.

The record lives where the cache's client does not hand it over: ``$NNAPI_CACHE_RECORDS``,
else ``$XDG_CACHE_HOME/nnapi/cache-records``, else ``~/.cache/nnapi/cache-records``; a
directory (not a link) of mode 0700, marked by a ``nnapi-cache-records`` file written when it
was made, or holding only names it writes (a folder holding other files is never used:
nothing of the user's is replaced or deleted), holding ``key`` (32 random bytes) and one ``<name>.rec`` file per
(driver, token) of 64 hex digits, written atomically (a temporary file renamed), never
unpickled, at most ``MAX_RECORDS`` of them (past that the least recently used are dropped). A
directory that is missing, unusable, not the user's, or writable by others, a key or record
that is unreadable or corrupt: no record (the cache is recompiled), never an exception.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
import re
import secrets
import stat
import time
from pathlib import Path

from nnapi import vlog
from nnapi.hal.types import ErrorStatus, HalError

#: the environment variable naming the record directory
ENVIRONMENT = "NNAPI_CACHE_RECORDS"
#: records kept; past this the least recently written or used are deleted (down to 7/8 of it)
MAX_RECORDS = 4096
_KEY_FILE = "key"
#: the file that marks a directory as this module's (only such a directory is written to)
_MARKER_FILE = "nnapi-cache-records"
_MARKER = b"nnapi cache records 1\n"
#: the only names this module writes, and so the only ones its pruning deletes
_RECORD_NAME = re.compile(r"[0-9a-f]{40}\.rec")
_TEMPORARY_NAME = re.compile(r"\.[0-9]+-[0-9a-f]{16}\.tmp")
_KEY_BYTES = 32
_SUFFIX = ".rec"
_DIGEST_CHARS = 64
#: a process looks for records to drop at its first write and then every PRUNE_EVERY
#: writes (listing 4,096 records took 1.6 ms, a write without it 0.1 ms)
PRUNE_EVERY = 32
#: a temporary file left by a process that died between writing and renaming it
_STALE_TEMPORARY_S = 3600.0
_writes = 0


def directory() -> Path:
    """The private record directory (not created here; RuntimeError when no environment
    variable names it and the user has no home directory)."""
    configured = os.environ.get(ENVIRONMENT)
    if configured:
        return Path(configured)
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "nnapi" / "cache-records"


def _encoded(*parts: bytes) -> bytes:
    # length-prefixed, so no two different part lists encode alike
    return b"".join(b"%d:" % len(part) + part for part in parts)


def _record_name(device: str, token: bytes) -> str:
    return hashlib.sha256(_encoded(b"nnapi-cache-record-name-1", device.encode(), bytes(token))).hexdigest()[:40] \
        + _SUFFIX


def _record_value(key: bytes, device: str, token: bytes, seal: str) -> bytes:
    message = _encoded(b"nnapi-cache-record-1", device.encode(), bytes(token), seal.encode())
    return hmac.new(key, message, hashlib.sha256).hexdigest().encode()


def _usable(path: Path, create: bool) -> bool:
    """Whether ``path`` is a record directory: a directory itself (not a link to one) that
    this user owns, only this user may read or write (mode 0700), and that holds this
    module's marker. ``create`` makes it (or marks an empty private one); a directory of other
    files (a home, a folder the variable was pointed at by mistake) is never used, so that
    nothing there is replaced or deleted."""
    try:
        if create:
            with contextlib.suppress(FileExistsError):
                path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
                os.mkdir(path, 0o700)
        status = os.lstat(path)
    except (OSError, ValueError):  # (ValueError: a path with a NUL character)
        return False
    if not stat.S_ISDIR(status.st_mode) or status.st_mode & 0o077:
        return False
    if hasattr(os, "getuid") and status.st_uid != os.getuid():
        return False
    if _read_small(path / _MARKER_FILE, len(_MARKER)) == _MARKER:
        return True
    if not create:
        return False
    try:
        # empty, or made before the marker existed: nothing in it but what this module writes
        names = os.listdir(path)
        if not all(name == _KEY_FILE or _RECORD_NAME.fullmatch(name) or _TEMPORARY_NAME.fullmatch(name)
                   for name in names):
            return False
        if _KEY_FILE in names and _read_small(path / _KEY_FILE, _KEY_BYTES) is None:
            return False  # a 'key' of another size is not one this module made
        temporary = _temporary(path, _MARKER)
        os.replace(temporary, path / _MARKER_FILE)
    except OSError:
        return False
    return _read_small(path / _MARKER_FILE, len(_MARKER)) == _MARKER


def _read_small(path: Path, size: int) -> bytes | None:
    """The file's bytes when it holds exactly ``size`` of them (no link followed)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return None
    try:
        data = os.read(fd, size + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    return data if len(data) == size else None


def _temporary(folder: Path, data: bytes) -> Path:
    """``data`` in a new temporary file of ``folder`` (mode 0600)."""
    path = folder / f".{os.getpid()}-{secrets.token_hex(8)}.tmp"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    except OSError:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(path)
        raise
    os.close(fd)
    return path


def _key(folder: Path, create: bool) -> bytes | None:
    """The per-user key; a missing or corrupt one is replaced when ``create`` (which makes
    every earlier record unusable: their caches are recompiled)."""
    path = folder / _KEY_FILE
    key = _read_small(path, _KEY_BYTES)
    if key is not None or not create:
        return key
    try:
        temporary = _temporary(folder, secrets.token_bytes(_KEY_BYTES))
    except OSError:
        return None
    try:
        try:
            os.link(temporary, path)  # (atomic, and never over a key another process just made)
        except FileExistsError:
            key = _read_small(path, _KEY_BYTES)
            if key is not None:
                return key
            os.replace(temporary, path)  # the existing one is corrupt
    except OSError:
        return None
    finally:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
    return _read_small(path, _KEY_BYTES)


def remember(device: str, token: bytes, seal: str) -> bool:
    """Record that ``device`` wrote, for ``token``, the cache whose content ``seal`` names
    (the SHA-256 digests its format computed over everything it wrote); whether it was
    recorded. (The write side of the HAL's prepareModel with cache handles.) A failure only
    means the cache will be recompiled: logged, never raised."""
    try:
        folder = directory()
    except (RuntimeError, KeyError, OSError):  # (Path.home() without HOME nor a password entry)
        return False
    if not _usable(folder, create=True):
        vlog.driver.info("%s: the cache is not recorded (%s is not a private directory of this user)",
                         device, folder)
        return False
    key = _key(folder, create=True)
    if key is None:
        vlog.driver.info("%s: the cache is not recorded (no key in %s)", device, folder)
        return False
    try:
        name = _record_name(device, token)
        temporary = _temporary(folder, _record_value(key, device, token, seal))
        try:
            os.replace(temporary, folder / name)
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(temporary)
            raise
    except OSError as error:
        vlog.driver.info("%s: the cache is not recorded: %s", device, error)
        return False
    global _writes
    if _writes % PRUNE_EVERY == 0:
        _prune(folder, name)
    _writes += 1
    return True


def holds(device: str, token: bytes, seal: str) -> bool:
    """Whether the record holds ``seal`` as what ``device`` last wrote for ``token``
    (the record is then marked as used, for the pruning)."""
    try:
        folder = directory()
    except (RuntimeError, KeyError, OSError):
        return False
    if not _usable(folder, create=False):
        return False
    key = _key(folder, create=False)
    if key is None:
        return False
    path = folder / _record_name(device, token)
    stored = _read_small(path, _DIGEST_CHARS)
    if stored is None or not hmac.compare_digest(stored, _record_value(key, device, token, seal)):
        return False
    with contextlib.suppress(OSError):
        os.utime(path)
    return True


def require(device: str, token: bytes, seal: str) -> None:
    """HalError(GENERAL_FAILURE) unless the record holds ``seal`` for ``device`` and
    ``token`` (prepareModelFromCache's check of the model cache; the runtime then compiles
    afresh)."""
    if not holds(device, token, seal):
        # (the record's path is left out: a served driver's errors go to its clients)
        raise HalError(ErrorStatus.GENERAL_FAILURE,
                       f"cache refused: {device} has no record of writing it for this token (written by another "
                       f"user or machine, or changed since)")


def _prune(folder: Path, written: str) -> None:
    """Past MAX_RECORDS, delete the least recently used records down to 7/8 of it (the
    ages are read only then: reading 4,096 of them took 11 ms), never ``written`` (the
    record just written: file times are as coarse as the kernel's tick, and it could tie
    with an older one), and stale temporary files of a process that died mid-write."""
    try:
        names = os.listdir(folder)
    except OSError:
        return
    now = time.time()
    for name in names:
        if _TEMPORARY_NAME.fullmatch(name):
            with contextlib.suppress(OSError):
                if now - os.lstat(folder / name).st_mtime > _STALE_TEMPORARY_S:
                    os.unlink(folder / name)
    names = [name for name in names if _RECORD_NAME.fullmatch(name)]
    if len(names) <= MAX_RECORDS:
        return
    records: list[tuple[float, str]] = []
    for name in names:
        if name != written:
            with contextlib.suppress(OSError):
                records.append((os.lstat(folder / name).st_mtime, name))
    records.sort()
    # (the written record is one of those kept)
    for _, name in records[:len(records) + 1 - max(1, MAX_RECORDS * 7 // 8)]:
        with contextlib.suppress(OSError):
            os.unlink(folder / name)
