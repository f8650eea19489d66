"""The drivers' private record of the compilation cache files they wrote
(drivers/cache_record.py): a cache resealed over another valid model (its checksums
recomputed) is refused by both drivers and the model recompiled with the right outputs; a
record directory that is absent, corrupt, full, not private or not a directory only costs a
recompilation, never an error."""

from __future__ import annotations

import json
import os
import stat
import time

import numpy as np
import pytest

import nnapi
from helpers import model_of, reference_devices
from nnapi import OperationCode as Op
from nnapi.drivers import cache_format, cache_record
from nnapi.drivers.reference import ReferenceDevice
from nnapi.hal import HalError
from nnapi.runtime.model_builder import build_hal_model

TOKEN = bytes(range(32))
X = np.array([1, 2, 3, 4], np.float32)
W_A = np.array([10, 20, 30, 40], np.float32)
W_B = np.array([-1, -2, -3, -4], np.float32)


@pytest.fixture
def records(tmp_path, monkeypatch):
    """A record directory of this test's own (not created yet)."""
    path = tmp_path / "records"
    monkeypatch.setenv(cache_record.ENVIRONMENT, str(path))
    return path


def compile_and_run(model: nnapi.Model, devices, directory) -> tuple[int, np.ndarray]:
    """(prepared_from_cache, y) of a compilation cached in ``directory``."""
    compilation = nnapi.Compilation(model, devices)
    compilation.set_caching(str(directory), TOKEN)
    compilation.finish()
    execution = nnapi.Execution(compilation)
    execution.set_input(0, X)
    y = np.zeros(4, np.float32)
    execution.set_output(0, y)
    execution.compute()
    return compilation.prepared_from_cache, y


def _records_in(folder) -> list[str]:
    return sorted(name for name in os.listdir(folder) if name.endswith(".rec"))


def test_a_record_binds_device_token_and_seal(records):
    """remember/holds: the record says what the device last wrote for that token and
    nothing else; it lives in a private directory (0700, files 0600), its key is 32
    random bytes, and a record names neither the token nor the seal."""
    assert not records.exists() and not cache_record.holds("dev", TOKEN, "seal-1")
    assert cache_record.remember("dev", TOKEN, "seal-1")
    assert cache_record.holds("dev", TOKEN, "seal-1")
    assert not cache_record.holds("dev", TOKEN, "seal-2")
    assert not cache_record.holds("other-dev", TOKEN, "seal-1")
    assert not cache_record.holds("dev", bytes(32), "seal-1")
    assert stat.S_IMODE(records.stat().st_mode) == 0o700
    key = (records / "key").read_bytes()
    assert len(key) == 32 and stat.S_IMODE((records / "key").stat().st_mode) == 0o600
    (name,) = _records_in(records)
    content = (records / name).read_bytes()
    assert len(content) == 64 and all(c in b"0123456789abcdef" for c in content)
    assert TOKEN.hex() not in name and b"seal-1" not in content
    cache_record.remember("dev", TOKEN, "seal-2")  # rewritten: only the last one holds
    assert cache_record.holds("dev", TOKEN, "seal-2") and not cache_record.holds("dev", TOKEN, "seal-1")
    assert _records_in(records) == [name] and (records / "key").read_bytes() == key
    with pytest.raises(HalError, match="dev has no record of writing it"):
        cache_record.require("dev", TOKEN, "seal-1")
    cache_record.require("dev", TOKEN, "seal-2")


def test_the_record_is_bounded_least_recently_used_first(records, monkeypatch):
    """Past MAX_RECORDS the least recently written or used records are deleted, down to
    7/8 of it (a record used by a compilation from the cache counts as recent), and stale
    temporary files of a process that died mid-write with them."""
    monkeypatch.setattr(cache_record, "MAX_RECORDS", 8)
    monkeypatch.setattr(cache_record, "PRUNE_EVERY", 1)
    tokens = [bytes([n]) * 32 for n in range(9)]
    for number, token in enumerate(tokens[:8]):  # (the clock's grain is coarser than a write)
        before = set(_records_in(records)) if records.exists() else set()
        cache_record.remember("dev", token, "s")
        (name,) = set(_records_in(records)) - before
        os.utime(records / name, (time.time() - 80 + 10 * number,) * 2)  # oldest first: token 0, 1, ...
    stale = records / ".123-0123456789abcdef.tmp"  # (named as the module names its temporary files)
    foreign = records / "notes.tmp"
    for path in (stale, foreign):
        path.write_bytes(b"x")
        os.utime(path, (time.time() - 7200,) * 2)
    assert cache_record.holds("dev", tokens[0], "s")  # token 0 is used: now the newest
    cache_record.remember("dev", tokens[8], "s")
    assert len(_records_in(records)) == 7 and not stale.exists()
    assert foreign.read_bytes() == b"x"  # a name the module never writes is never deleted
    assert [cache_record.holds("dev", t, "s") for t in tokens] == [True, False, False] + [True] * 6


def _reference_cache(directory) -> tuple[str, str]:
    """(model cache path, data cache path) of the one reference cache in ``directory``."""
    names = sorted(os.listdir(directory))
    return (os.path.join(directory, next(n for n in names if ".model" in n)),
            os.path.join(directory, next(n for n in names if ".data" in n)))


def test_a_resealed_reference_cache_of_another_model_is_recompiled(records, tmp_path):
    """A reference cache replaced by a valid cache of another model (W_B's weights under
    W_A's token, every checksum right): the checksums cannot tell, and the driver prepared
    it and computed X + W_B. It has no record of writing it: refused, the runtime compiles
    afresh (X + W_A), and the next compilation comes from the rewritten cache."""
    devices = reference_devices()
    cache = tmp_path / "cache"
    cache.mkdir()
    assert compile_and_run(model_of(Op.ADD, W_A), devices, cache) == (0, pytest.approx(X + W_A))
    model_path, data_path = _reference_cache(cache)
    good = open(model_path, "rb").read()
    token = bytes.fromhex(json.loads(good[len(cache_format.MAGIC):].partition(b"\n")[0])["token"])
    other, _ = build_hal_model(model_of(Op.ADD, W_B))
    forged_model, forged_data = cache_format.pack(other, token)
    for path, data in ((model_path, forged_model), (data_path, forged_data)):
        with open(path, "wb") as handle:
            handle.write(data)
    fds = [os.open(model_path, os.O_RDONLY), os.open(data_path, os.O_RDONLY)]
    try:
        with pytest.raises(HalError, match="nnapi-reference has no record of writing it for this token"):
            ReferenceDevice().prepare_model_from_cache([fds[0]], [fds[1]], token)
    finally:
        for fd in fds:
            os.close(fd)
    from_cache, y = compile_and_run(model_of(Op.ADD, W_A), devices, cache)
    assert from_cache == 0
    np.testing.assert_array_equal(y, X + W_A)
    assert open(model_path, "rb").read() == good  # rewritten by the fresh compilation
    from_cache, y = compile_and_run(model_of(Op.ADD, W_A), devices, cache)
    assert from_cache == 1
    np.testing.assert_array_equal(y, X + W_A)
    # what the record prevents: granted one, the forged cache is prepared and computes W_B's sums
    cache_format.record("nnapi-reference", forged_model, token)
    for path, data in ((model_path, forged_model), (data_path, forged_data)):
        with open(path, "wb") as handle:
            handle.write(data)
    from_cache, y = compile_and_run(model_of(Op.ADD, W_A), devices, cache)
    assert from_cache == 1
    np.testing.assert_array_equal(y, X + W_B)


def _corrupt_key(records, monkeypatch):
    (records / "key").write_bytes(b"short")


def _corrupt_records(records, monkeypatch):
    for name in _records_in(records):
        (records / name).write_bytes(b"not a digest")


def _another_user_or_machine(records, monkeypatch):
    monkeypatch.setenv(cache_record.ENVIRONMENT, str(records.parent / "elsewhere"))


def _removed(records, monkeypatch):
    import shutil

    shutil.rmtree(records)


@pytest.mark.parametrize("damage", [_removed, _corrupt_key, _corrupt_records, _another_user_or_machine])
def test_a_record_missing_or_corrupt_costs_one_recompilation(records, tmp_path, monkeypatch, damage):
    """The record directory removed, its key or records corrupt, or the cache copied to
    another user or machine (another record): the cache is refused once (recompiled, the
    right outputs), its record written again, and the next compilation comes from it."""
    devices = reference_devices()
    model = model_of(Op.ADD, W_A)
    assert compile_and_run(model, devices, tmp_path)[0] == 0
    assert compile_and_run(model, devices, tmp_path)[0] == 1
    damage(records, monkeypatch)
    for expected in (0, 1):
        from_cache, y = compile_and_run(model, devices, tmp_path)
        assert from_cache == expected
        np.testing.assert_array_equal(y, X + W_A)


def test_a_record_directory_others_may_write_or_that_is_a_file_is_not_used(records, tmp_path, monkeypatch):
    """A record directory writable by others (anyone could forge a record there) is neither
    read nor written, nor is a path that is a file: every compilation is afresh, none
    fails."""
    devices = reference_devices()
    model = model_of(Op.ADD, W_A)
    assert compile_and_run(model, devices, tmp_path)[0] == 0
    os.chmod(records, 0o777)
    try:
        for _ in range(2):
            from_cache, y = compile_and_run(model, devices, tmp_path)
            assert from_cache == 0
            np.testing.assert_array_equal(y, X + W_A)
    finally:
        os.chmod(records, 0o700)
    assert compile_and_run(model, devices, tmp_path)[0] == 1  # (private again: the record stands)
    a_file = tmp_path / "a-file"
    a_file.write_bytes(b"x")
    monkeypatch.setenv(cache_record.ENVIRONMENT, str(a_file))
    for _ in range(2):
        from_cache, y = compile_and_run(model, devices, tmp_path)
        assert from_cache == 0
        np.testing.assert_array_equal(y, X + W_A)
    assert a_file.read_bytes() == b"x"


def test_a_full_record_drops_the_least_recently_used_cache(records, tmp_path, monkeypatch):
    """Two models cached with a record of one entry: the first one's record is dropped
    (its cache recompiled, then recorded again), the second's stands."""
    monkeypatch.setattr(cache_record, "MAX_RECORDS", 1)
    monkeypatch.setattr(cache_record, "PRUNE_EVERY", 1)
    devices = reference_devices()
    first, second = model_of(Op.ADD, W_A), model_of(Op.ADD, W_B)
    assert compile_and_run(first, devices, tmp_path)[0] == 0
    assert compile_and_run(second, devices, tmp_path)[0] == 0
    assert len(_records_in(records)) == 1
    assert compile_and_run(second, devices, tmp_path)[0] == 1
    assert compile_and_run(first, devices, tmp_path)[0] == 0
    from_cache, y = compile_and_run(first, devices, tmp_path)
    assert from_cache == 1
    np.testing.assert_array_equal(y, X + W_A)


@pytest.fixture
def ort_cpu(calibration_file, request):
    pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    return request.getfixturevalue("ort_device")


def test_a_resealed_ort_cache_of_another_graph_is_recompiled(records, tmp_path, ort_cpu):
    """nnapi-ort-cpu's cache file given another model's optimized graph (W_B's weights, the
    same inputs and outputs, so check_graph passes) under W_A's header, its checksum
    recomputed: the device has no record of writing it, refuses it, and the runtime
    compiles afresh (X + W_A); granted a record, the forgery would compute X + W_B."""
    from nnapi.drivers.ort import compilation_cache

    def split(data: bytes) -> tuple[dict, bytes]:
        start = len(compilation_cache._CACHE_MAGIC) + 4
        end = start + int.from_bytes(data[start - 4:start], "little")
        return json.loads(data[start:end]), data[end:]

    files = []
    for weights in (W_A, W_B):
        directory = tmp_path / f"cache-{weights[0]}"
        directory.mkdir()
        assert compile_and_run(model_of(Op.ADD, weights), [ort_cpu], directory)[0] == 0
        (name,) = os.listdir(directory)
        files.append(directory / name)
    good = files[0].read_bytes()
    header, _ = split(good)
    other_header, other_graph = split(files[1].read_bytes())
    assert other_header["signature"] == header["signature"]
    header["sha256"] = compilation_cache._checksum(header, other_graph)
    encoded = json.dumps(header, sort_keys=True).encode()
    forged = compilation_cache._CACHE_MAGIC + len(encoded).to_bytes(4, "little") + encoded + other_graph
    files[0].write_bytes(forged)
    token = bytes.fromhex(header["token"])
    fd = os.open(files[0], os.O_RDONLY)
    try:
        with pytest.raises(HalError, match="nnapi-ort-cpu has no record of writing it for this token"):
            ort_cpu._hal.prepare_model_from_cache([fd], [], token)
    finally:
        os.close(fd)
    from_cache, y = compile_and_run(model_of(Op.ADD, W_A), [ort_cpu], files[0].parent)
    assert from_cache == 0
    np.testing.assert_array_equal(y, X + W_A)
    assert files[0].read_bytes() == good  # rewritten by the fresh compilation
    from_cache, y = compile_and_run(model_of(Op.ADD, W_A), [ort_cpu], files[0].parent)
    assert from_cache == 1
    np.testing.assert_array_equal(y, X + W_A)
    # what the record prevents: granted one, the forged file is loaded and computes W_B's sums
    cache_record.remember("nnapi-ort-cpu", token, header["sha256"])
    files[0].write_bytes(forged)
    from_cache, y = compile_and_run(model_of(Op.ADD, W_A), [ort_cpu], files[0].parent)
    assert from_cache == 1
    np.testing.assert_array_equal(y, X + W_B)


def test_no_home_directory_means_no_record(monkeypatch):
    """No record directory named and no home directory to put one in: nothing is recorded,
    nothing held, no exception (the cache is recompiled)."""
    import pathlib

    def no_home() -> pathlib.Path:
        raise RuntimeError("Could not determine home directory.")

    monkeypatch.delenv(cache_record.ENVIRONMENT, raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setattr(pathlib.Path, "home", staticmethod(no_home))
    assert not cache_record.remember("dev", TOKEN, "s") and not cache_record.holds("dev", TOKEN, "s")
    with pytest.raises(HalError, match="no record"):
        cache_record.require("dev", TOKEN, "s")


def test_a_directory_of_other_files_or_a_link_is_never_written(tmp_path, monkeypatch):
    """The variable pointed at a folder of the user's own files (private or not), or at a
    link to a private empty folder: no record is written there, nothing there is replaced or
    deleted (found by reviewer R2: a 24-byte 'key' was replaced and an old 'notes.tmp'
    deleted)."""
    own = tmp_path / "own"
    own.mkdir(mode=0o700)
    (own / "key").write_bytes(b"the user's own 24 bytes.")
    (own / "notes.tmp").write_bytes(b"notes")
    os.utime(own / "notes.tmp", (time.time() - 7200,) * 2)
    home_like = tmp_path / "home"
    home_like.mkdir(mode=0o755)
    empty = tmp_path / "empty"
    empty.mkdir(mode=0o700)
    link = tmp_path / "link"
    link.symlink_to(empty, target_is_directory=True)
    for folder in (own, home_like, link):
        monkeypatch.setenv(cache_record.ENVIRONMENT, str(folder))
        assert not cache_record.remember("dev", TOKEN, "s")
        assert not cache_record.holds("dev", TOKEN, "s")
    assert (own / "key").read_bytes() == b"the user's own 24 bytes." and (own / "notes.tmp").exists()
    assert sorted(os.listdir(own)) == ["key", "notes.tmp"] and os.listdir(home_like) == []
    assert os.listdir(empty) == []
    monkeypatch.setenv(cache_record.ENVIRONMENT, str(empty))  # the folder itself, empty and private: used
    assert cache_record.remember("dev", TOKEN, "s") and cache_record.holds("dev", TOKEN, "s")


def test_a_directory_of_another_user_is_not_used(records, monkeypatch):
    """A record directory owned by another user (who could forge records in it) is neither
    read nor written."""
    assert cache_record.remember("dev", TOKEN, "s")
    monkeypatch.setattr(os, "getuid", lambda: os.stat(records).st_uid + 1)
    assert not cache_record.holds("dev", TOKEN, "s")
    assert not cache_record.remember("dev", bytes(32), "s")


def test_a_record_copied_under_another_tokens_name_is_not_held(records):
    """The record's value binds the token (and the device), not only its file name."""
    other = bytes([7]) * 32
    assert cache_record.remember("dev", TOKEN, "s")
    assert cache_record.remember("dev", other, "t")
    (name,) = [n for n in _records_in(records) if n == cache_record._record_name("dev", TOKEN)]
    value = (records / name).read_bytes()
    (records / cache_record._record_name("dev", other)).write_bytes(value)
    assert not cache_record.holds("dev", other, "s")
    (records / cache_record._record_name("dev2", TOKEN)).write_bytes(value)
    assert not cache_record.holds("dev2", TOKEN, "s")


def test_a_record_directory_made_before_the_marker_is_still_used(records):
    """A directory holding only what this module writes (a 32-byte key, records), made
    before directories were marked, is marked and used: its records stand."""
    assert cache_record.remember("dev", TOKEN, "s")
    (records / cache_record._MARKER_FILE).unlink()
    assert not cache_record.holds("dev", TOKEN, "s")  # (reading never marks)
    assert cache_record.remember("dev", bytes(32), "t")
    assert cache_record.holds("dev", TOKEN, "s") and cache_record.holds("dev", bytes(32), "t")
    (records / cache_record._MARKER_FILE).unlink()
    (records / "key").write_bytes(b"24 bytes, not a key ....")
    assert not cache_record.remember("dev", TOKEN, "s")
    assert (records / "key").read_bytes() == b"24 bytes, not a key ...."
