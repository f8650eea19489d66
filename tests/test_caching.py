"""Compilation caching (after Android's CompilationCachingTest / CompilationCachingSecurityTest):
a second compilation prepares from the cache; a cache for another model, token or version,
or a truncated, tampered or swapped file, is detected and the model recompiled — never a
wrong prepared model, never a crash."""

from __future__ import annotations

import os
import random

import numpy as np
import pytest

import nnapi
from helpers import model_of, reference_devices
from nnapi import OperationCode as Op
from nnapi.drivers import cache_format
from nnapi.drivers.reference import ReferenceDevice
from nnapi.hal import HalError
from nnapi.runtime.model_builder import build_hal_model

TOKEN = bytes(range(32))


X = np.array([1, 2, 3, 4], np.float32)
W_A = np.array([10, 20, 30, 40], np.float32)  # > 128 bytes of constants is not needed: the blob is cached too
W_B = np.array([-1, -2, -3, -4], np.float32)


def compile_cached(model, directory, token=TOKEN):
    compilation = nnapi.Compilation(model, reference_devices())  # nnapi-reference's cache files
    compilation.set_caching(directory, token)
    compilation.finish()
    return compilation


def run(compilation):
    execution = nnapi.Execution(compilation)
    execution.set_input(0, X)
    y = np.zeros(4, np.float32)
    execution.set_output(0, y)
    execution.compute()
    return y


def cache_files(directory):
    return sorted(os.path.join(directory, name) for name in os.listdir(directory))


def test_second_compilation_prepares_from_cache(tmp_path):
    first = compile_cached(model_of(Op.ADD, W_A), tmp_path)
    assert first.prepared_from_cache == 0
    files = cache_files(tmp_path)
    assert [os.path.basename(f).split(".")[1] for f in files] == ["data0", "model0"]
    assert all(os.path.getsize(f) > 0 for f in files)
    second = compile_cached(model_of(Op.ADD, W_A), tmp_path)
    assert second.prepared_from_cache == 1
    np.testing.assert_array_equal(run(second), X + W_A)


def test_another_model_or_token_uses_other_files(tmp_path):
    compile_cached(model_of(Op.ADD, W_A), tmp_path)
    other_weights = compile_cached(model_of(Op.ADD, W_B), tmp_path)
    other_op = compile_cached(model_of(Op.MUL, W_A), tmp_path)
    other_token = compile_cached(model_of(Op.ADD, W_A), tmp_path, token=bytes(32))
    assert [c.prepared_from_cache for c in (other_weights, other_op, other_token)] == [0, 0, 0]
    assert len(cache_files(tmp_path)) == 8
    np.testing.assert_array_equal(run(other_weights), X + W_B)
    np.testing.assert_array_equal(run(other_op), X * W_A)


def _recompiles_correctly(tmp_path, expected=X + W_A):
    compilation = compile_cached(model_of(Op.ADD, W_A), tmp_path)
    assert compilation.prepared_from_cache == 0
    np.testing.assert_array_equal(run(compilation), expected)
    # ... and the fresh compilation rewrote a good cache
    assert compile_cached(model_of(Op.ADD, W_A), tmp_path).prepared_from_cache == 1


@pytest.mark.parametrize("which", ["model0", "data0"])
def test_truncated_files_are_detected(tmp_path, which):
    compile_cached(model_of(Op.ADD, W_A), tmp_path)
    path = next(f for f in cache_files(tmp_path) if f.endswith(which))
    for size in (1, os.path.getsize(path) // 2, os.path.getsize(path) - 1):
        with open(path, "r+b") as handle:
            handle.truncate(size)
        _recompiles_correctly(tmp_path)


@pytest.mark.parametrize("which", ["model0", "data0"])
def test_tampered_bytes_are_detected(tmp_path, which):
    compile_cached(model_of(Op.ADD, W_A), tmp_path)
    path = next(f for f in cache_files(tmp_path) if f.endswith(which))
    rng = random.Random(7)
    for _ in range(12):
        data = bytearray(open(path, "rb").read())
        data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        open(path, "wb").write(bytes(data))
        _recompiles_correctly(tmp_path)


def test_files_swapped_from_another_model_are_detected(tmp_path):
    a_dir, b_dir = tmp_path / "a", tmp_path / "b"
    a_dir.mkdir()
    b_dir.mkdir()
    compile_cached(model_of(Op.ADD, W_A), a_dir)
    compile_cached(model_of(Op.ADD, W_B), b_dir)
    a_files, b_files = cache_files(a_dir), cache_files(b_dir)
    # B's content under A's names: the same token would be reused by an attacker's copy
    for a_path, b_path in zip(a_files, b_files, strict=True):
        open(a_path, "wb").write(open(b_path, "rb").read())
    _recompiles_correctly(a_dir)
    # only the data file swapped
    compile_cached(model_of(Op.ADD, W_A), a_dir)
    open(a_files[0], "wb").write(open(b_files[0], "rb").read())
    _recompiles_correctly(a_dir)


def test_other_version_and_garbage_are_detected(tmp_path):
    compile_cached(model_of(Op.ADD, W_A), tmp_path)
    model_path = next(f for f in cache_files(tmp_path) if f.endswith("model0"))
    content = open(model_path, "rb").read()
    version = nnapi.__version__.encode()
    open(model_path, "wb").write(content.replace(b'"nnapi": "' + version, b'"nnapi": "0.0.0-other', 1))
    _recompiles_correctly(tmp_path)
    for garbage in (b"\0" * 100, cache_format.MAGIC + b"{}\n", cache_format.MAGIC + b"[1,2]\nxx", b"x"):
        open(model_path, "wb").write(garbage)
        _recompiles_correctly(tmp_path)


def test_driver_checks_the_token_and_never_raises_raw(tmp_path):
    hal_model, _ = build_hal_model(model_of(Op.ADD, W_A))
    model_bytes, data_bytes = cache_format.pack(hal_model, TOKEN)
    assert cache_format.unpack(model_bytes, data_bytes, TOKEN).main.operations[0].type == Op.ADD
    with pytest.raises(HalError, match="another token"):
        cache_format.unpack(model_bytes, data_bytes, bytes(32))
    rng = random.Random(3)
    for _ in range(200):
        damaged = bytearray(model_bytes if rng.random() < 0.5 else data_bytes)
        damaged[rng.randrange(len(damaged))] = rng.randrange(256)
        is_model = damaged.startswith(cache_format.MAGIC)
        try:
            cache_format.unpack(bytes(damaged) if is_model else model_bytes,
                                data_bytes if is_model else bytes(damaged), TOKEN)
        except HalError:
            pass
    device = ReferenceDevice()
    fds = [os.open(tmp_path / name, os.O_RDWR | os.O_CREAT) for name in ("m", "d")]
    try:
        with pytest.raises(HalError):
            device.prepare_model_from_cache([fds[0]], [fds[1]], TOKEN)
        device.prepare_model(hal_model, model_cache=[fds[0]], data_cache=[fds[1]], token=TOKEN)
        prepared = device.prepare_model_from_cache([fds[0]], [fds[1]], TOKEN)
        assert prepared is not None
        with pytest.raises(HalError):
            device.prepare_model_from_cache([fds[0]], [fds[1]], bytes(32))
        with pytest.raises(HalError):
            device.prepare_model_from_cache([9999], [fds[1]], TOKEN)
    finally:
        for fd in fds:
            os.close(fd)


def test_unusable_cache_directory_is_ignored(tmp_path):
    compilation = compile_cached(model_of(Op.ADD, W_A), tmp_path / "missing")
    np.testing.assert_array_equal(run(compilation), X + W_A)


def test_a_cache_directory_no_file_can_be_named_in_is_bad_data(tmp_path):
    """A cache directory with a NUL character (no file system path holds one) is BAD_DATA
    at set_caching, as is a path-like object whose path is not text; finish raised a raw
    ValueError ('embedded null byte') and a TypeError. A bytes path-like object naming a
    directory works as its text does."""
    model = model_of(Op.ADD, W_A)

    class BytesPath:
        def __init__(self, path: bytes) -> None:
            self.path = path

        def __fspath__(self) -> bytes:
            return self.path

    for directory in (f"{tmp_path}\0x", BytesPath(os.fsencode(tmp_path) + b"\0"), BytesPath(3)):  # type: ignore[arg-type]
        compilation = nnapi.Compilation(model, reference_devices())
        with pytest.raises(nnapi.BadDataError, match="set_caching: cache_dir"):
            compilation.set_caching(directory, TOKEN)
    np.testing.assert_array_equal(run(compile_cached(model, BytesPath(os.fsencode(tmp_path)))), X + W_A)
    assert compile_cached(model, str(tmp_path)).prepared_from_cache == 1


def test_a_cached_constant_without_dimensions_is_refused(tmp_path):
    """A cache whose constant operand lost its dimensions (the checksums rewritten to match,
    as another writer or an attacker would): validate_model refuses a constant of
    unspecified dimensions (set_operand_value does), where the reference raised a raw
    ValueError ('cannot reshape array of size 16 into shape ()') across the HAL. The driver
    now refuses such a file before reading its body (it has no record of writing it,
    drivers/cache_record.py); the validation still stands behind that."""
    import dataclasses
    import hashlib
    import json

    from nnapi.hal.validation import validate_model

    hal_model, _ = build_hal_model(model_of(Op.ADD, W_A))
    model_bytes, data_bytes = cache_format.pack(hal_model, TOKEN)
    header_line, _, body = model_bytes[len(cache_format.MAGIC):].partition(b"\n")
    plain = json.loads(body)
    weights = next(o for o in plain["main"]["operands"] if o["lifetime"] == 3 and o["dimensions"] == [4])
    for dims in ([], [0]):
        weights["dimensions"] = dims
        body = json.dumps(plain).encode()
        header = {**json.loads(header_line), "body_sha256": hashlib.sha256(body).hexdigest()}
        tampered = cache_format.MAGIC + json.dumps(header).encode() + b"\n" + body
        with pytest.raises(HalError, match="operand 1: constant of TENSOR_FLOAT32.* unspecified dimensions"):
            validate_model(cache_format.unpack(tampered, data_bytes, TOKEN))
        fds = [os.memfd_create(name) for name in ("m", "d")]
        try:
            os.write(fds[0], tampered)
            os.write(fds[1], data_bytes)
            with pytest.raises(HalError, match="nnapi-reference has no record of writing it"):
                ReferenceDevice().prepare_model_from_cache([fds[0]], [fds[1]], TOKEN)
        finally:
            for fd in fds:
                os.close(fd)
    # the same through a HAL model built directly
    main = hal_model.main
    operands = [dataclasses.replace(o, dimensions=[]) if o.dimensions == [4] and o.lifetime == 3 else o
                for o in main.operands]
    with pytest.raises(HalError, match="unspecified dimensions"):
        validate_model(dataclasses.replace(hal_model, main=dataclasses.replace(main, operands=operands)))


def _resealed(model_bytes: bytes, data_bytes: bytes, header_line: bytes | None = None) -> bytes:
    """The model cache file over ``data_bytes``, its checksums rewritten to match (what
    another writer, or an attacker, produces): only what the driver checks beyond the
    checksums stands between the file and the prepared model."""
    import hashlib
    import json

    line, _, body = model_bytes[len(cache_format.MAGIC):].partition(b"\n")
    header = {**json.loads(line), "body_sha256": hashlib.sha256(body).hexdigest(),
              "data_sha256": hashlib.sha256(data_bytes).hexdigest()}
    return cache_format.MAGIC + (header_line or json.dumps(header).encode()) + b"\n" + body


def _npz(entries: dict[str, bytes], compression: int = 0) -> bytes:
    import io
    import zipfile

    stream = io.BytesIO()
    with zipfile.ZipFile(stream, "w", compression=compression) as archive:
        for name, data in entries.items():
            archive.writestr(name, data)
    return stream.getvalue()


def _npy(array: np.ndarray) -> bytes:
    import io

    stream = io.BytesIO()
    np.save(stream, array)
    return stream.getvalue()


def test_data_file_entries_overlapping_past_its_size_are_refused():
    """Stored entries nested one in the next (each a valid uint8 .npy; zipfile reads each):
    40 entries of an 8.8 KB file held 136 KB, growing with the square of the file's size;
    only the sum of the entries' sizes against the file's refuses them."""
    import io
    import zipfile

    from file_fuzz import nested_npz

    data = nested_npz(40)
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        held = sum(len(archive.read(entry)) for entry in archive.infolist())
    assert held > 10 * len(data)
    with pytest.raises(HalError, match="^cache rejected: the data file's entries are larger than the file$"):
        cache_format._arrays(data)
    assert set(cache_format._arrays(nested_npz(1))) == {"b0"}


def test_a_data_file_is_read_no_larger_than_it_is():
    """The data file is read only as pack writes it (stored .npy entries of 1-D uint8 whose
    headers say their size): an entry whose 60-byte header claims 2**40 elements raised a
    raw MemoryError across the HAL (np.load allocates what the header says), and a deflated
    entry was inflated (a 3 MB file became 3 GiB); a JSON header nested past the parser's
    depth raised a raw RecursionError."""
    import io
    import zipfile

    hal_model, _ = build_hal_model(model_of(Op.ADD, W_A))
    model_bytes, data_bytes = cache_format.pack(hal_model, TOKEN)
    assert cache_format.unpack(_resealed(model_bytes, data_bytes), data_bytes, TOKEN).main.operations
    blob = np.load(io.BytesIO(data_bytes))["b0"]
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": "|u1", "fortran_order": False, "shape": (2**40,)})
    zeros = np.zeros(1 << 20, np.uint8)  # deflated to ~1 KiB
    broken = {
        "claims a terabyte": _npz({"b0.npy": header.getvalue() + bytes(16)}),
        "deflated": _npz({"b0.npy": _npy(blob)}, zipfile.ZIP_DEFLATED),
        "a bomb": _npz({"b0.npy": _npy(zeros)}, zipfile.ZIP_DEFLATED),
        "not .npy": _npz({"b0": _npy(blob)}),
        "int8": _npz({"b0.npy": _npy(blob.view(np.int8))}),
        "2-D": _npz({"b0.npy": _npy(blob.reshape(2, -1))}),
        "longer than its header": _npz({"b0.npy": _npy(blob) + b"\0"}),
        "an object array": _npz({"b0.npy": _npy(np.array([b"a", 1], dtype=object))}),
        "not a zip": b"PK\x03\x04" + bytes(40),
    }
    for data in broken.values():
        with pytest.raises(HalError, match="cache rejected"):
            cache_format.unpack(_resealed(model_bytes, data), data, TOKEN)
    with pytest.raises(HalError, match="unreadable header"):
        cache_format.unpack(_resealed(model_bytes, data_bytes, b"[" * 100_000), data_bytes, TOKEN)
