"""A structure-aware fuzzer of the files nnapi reads back: nnapi-reference's compilation
cache (cache_format: JSON header + JSON body of hal.serialize plain data + .npz data file),
nnapi-ort-cpu's cache file (compilation_cache: header + optimized ONNX graph) and CTS vector
files (conformance.load_records).

Byte flips only reach the checksums, so the mutations here decode a good file, change its
content (operand types, dimensions, scales, locations, operation codes and indexes, pools,
subgraph references, extensions, npz entries, the ONNX graph) and write it back with valid
checksums and token: what a bug in another writer, or an attacker, produces. The properties:
a driver's prepare_model_from_cache raises HalError or returns a prepared model (never a raw
exception), even for a file its private record says it wrote (the fuzzer grants each mutated
file a record in a directory of its own, so the checks behind the record are reached); a
compilation through the public API comes from the cache only when the file is the one the
driver wrote (a changed file, even one resealed over another *valid* model, is refused by
the driver's private record, drivers/cache_record.py) and otherwise recompiles afresh, both
computing exactly the fresh compilation's outputs; a vector file is read or refused with one
VectorFileError naming the file and line, and a record read runs to an outcome (never a RAW
exception).

``python tests/file_fuzz.py --cases N --seed S`` runs a long fuzz and prints the counts;
test_file_fuzz.py runs a bounded, seeded one.
"""

from __future__ import annotations

import copy
import gzip
import hashlib
import io
import json
import math
import os
import random
import sys
import tempfile
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

import nnapi
from nnapi import OperandCode as T
from nnapi import OperandType
from nnapi import OperationCode as Op
from nnapi.drivers import cache_format, cache_record
from nnapi.hal import HalError
from nnapi.hal.interfaces import IPreparedModel
from nnapi.hal.serialize import model_digest
from nnapi.tools.plain_tree import get, paths, replace

TOKEN = bytes(range(32))
_INTS = [0, 1, 2, 3, -1, -2, 4, 7, 255, 256, 2**15, 2**16, 2**31 - 1, 2**31, -(2**31), -(2**31) - 1,
         2**32 - 1, 2**32, 2**40, 2**63, 2**64, 10**30]
_FLOATS = [0.0, -0.0, 1.0, -1.0, 0.5, 1e-45, 1e-38, 3.4e38, 1e39, 1e308, float("nan"), float("inf"),
           float("-inf")]


# --- models whose caches are fuzzed -------------------------------------------------------
class Case:
    """A model, its inputs, and the outputs a fresh compilation computes."""

    def __init__(self, name: str, build: Callable[[list], tuple[nnapi.Model, list[np.ndarray], list[np.ndarray]]]):
        self.name = name
        self.keep: list = []
        self.model, self.inputs, self.outputs = build(self.keep)


def _operand(model: nnapi.Model, keep: list, op_type: OperandType, value: Any = None) -> int:
    index = model.add_operand(op_type)
    if isinstance(value, nnapi.Model):
        model.set_operand_value_from_model(index, value)
    elif value is not None:
        array = np.asarray(value, dtype=op_type.dtype)
        keep.append(array)
        model.set_operand_value(index, array)
    return index


def _add_mul(keep: list):
    """(x + w_small) * w_big: a constant copied into the blob and one (> 128 bytes) in a pool."""
    model = nnapi.Model()
    t = OperandType(T.TENSOR_FLOAT32, [40])
    x = _operand(model, keep, t)
    small = _operand(model, keep, OperandType(T.TENSOR_FLOAT32, [1]), [0.5])
    big = _operand(model, keep, t, np.linspace(-2, 2, 40, dtype=np.float32))
    act = _operand(model, keep, OperandType(T.INT32), 0)
    mid, y = _operand(model, keep, t), _operand(model, keep, t)
    model.add_operation(Op.ADD, [x, small, act], [mid])
    model.add_operation(Op.MUL, [mid, big, act], [y])
    model.identify_inputs_and_outputs([x], [y])
    model.finish()
    return model, [np.arange(40, dtype=np.float32) / 7], [np.zeros(40, np.float32)]


def _per_channel_conv(keep: list):
    """A quantized CONV_2D with per-channel weights (channel_quant in the cache)."""
    model = nnapi.Model()
    x = _operand(model, keep, OperandType(T.TENSOR_QUANT8_ASYMM, [1, 3, 3, 2], 0.5, 3))
    wtype = OperandType(T.TENSOR_QUANT8_SYMM_PER_CHANNEL, [2, 1, 1, 2])
    w = model.add_operand(wtype)
    model.set_operand_symm_per_channel_quant_params(w, nnapi.SymmPerChannelQuantParams(0, [0.25, 0.125]))
    weights = np.array([1, -2, 3, 4], np.int8).reshape(2, 1, 1, 2)
    keep.append(weights)
    model.set_operand_value(w, weights)
    b = _operand(model, keep, OperandType(T.TENSOR_INT32, [2]), [3, -5])
    ints = [_operand(model, keep, OperandType(T.INT32), v) for v in (0, 0, 0, 0, 1, 1, 0)]
    y = _operand(model, keep, OperandType(T.TENSOR_QUANT8_ASYMM, [1, 3, 3, 2], 1.0, 5))
    model.add_operation(Op.CONV_2D, [x, w, b, *ints], [y])
    model.identify_inputs_and_outputs([x], [y])
    model.finish()
    return model, [np.arange(18, dtype=np.uint8).reshape(1, 3, 3, 2)], [np.zeros((1, 3, 3, 2), np.uint8)]


def _while_loop(keep: list):
    """WHILE (i < 3): x = x + x, i = i + 1: two referenced subgraphs."""
    f32, i32, b8 = (OperandType(T.TENSOR_FLOAT32, [2]), OperandType(T.TENSOR_INT32, [1]),
                    OperandType(T.TENSOR_BOOL8, [1]))
    integer = OperandType(T.INT32)
    cond = nnapi.Model()
    cx, ci = _operand(cond, keep, f32), _operand(cond, keep, i32)
    limit, out = _operand(cond, keep, i32, [3]), _operand(cond, keep, b8)
    cond.add_operation(Op.LESS, [ci, limit], [out])
    cond.identify_inputs_and_outputs([cx, ci], [out])
    cond.finish()
    body = nnapi.Model()
    bx, bi = _operand(body, keep, f32), _operand(body, keep, i32)
    one, act = _operand(body, keep, i32, [1]), _operand(body, keep, integer, 0)
    ox, oi = _operand(body, keep, f32), _operand(body, keep, i32)
    body.add_operation(Op.ADD, [bx, bx, act], [ox])
    body.add_operation(Op.ADD, [bi, one, act], [oi])
    body.identify_inputs_and_outputs([bx, bi], [ox, oi])
    body.finish()
    model = nnapi.Model()
    model_type = OperandType(T.MODEL)
    c, b = _operand(model, keep, model_type, cond), _operand(model, keep, model_type, body)
    x, i = _operand(model, keep, f32), _operand(model, keep, i32, [0])
    y = _operand(model, keep, f32)
    model.add_operation(Op.WHILE, [c, b, x, i], [y])
    model.identify_inputs_and_outputs([x], [y])
    model.finish()
    return model, [np.array([1.5, -2.0], np.float32)], [np.zeros(2, np.float32)]


BUILDERS = {"add_mul": _add_mul, "per_channel_conv": _per_channel_conv, "while_loop": _while_loop}


def compile_and_run(case: Case, devices: list[nnapi.Device], directory: str | None = None
                    ) -> tuple[int, list[np.ndarray]]:
    """(prepared_from_cache, outputs) of a compilation of ``case`` (cached in ``directory``)."""
    compilation = nnapi.Compilation(case.model, devices)
    if directory is not None:
        compilation.set_caching(directory, TOKEN)
    compilation.finish()
    execution = nnapi.Execution(compilation)
    for position, value in enumerate(case.inputs):
        execution.set_input(position, value)
    outputs = [np.zeros_like(o) for o in case.outputs]
    for position, buffer in enumerate(outputs):
        execution.set_output(position, buffer)
    execution.compute()
    return compilation.prepared_from_cache, outputs


@contextmanager
def granted(directory: str, device: str, token: bytes, seal: str | None) -> Iterator[None]:
    """Meanwhile the drivers' private record is ``directory``, where ``device`` is recorded
    as having written the cache ``seal`` names for ``token`` (when there is one): the
    driver's checks behind the record are fuzzed too, and the record the public API uses
    is left as the driver wrote it."""
    previous = os.environ.get(cache_record.ENVIRONMENT)
    os.environ[cache_record.ENVIRONMENT] = directory
    try:
        if seal is not None:
            assert cache_record.remember(device, token, seal)
        yield
    finally:
        if previous is None:
            del os.environ[cache_record.ENVIRONMENT]
        else:
            os.environ[cache_record.ENVIRONMENT] = previous


# --- mutations of plain data ------------------------------------------------------------
def _mutated_value(rng: random.Random, value: Any, tree: Any) -> Any:
    """Another value for a node: of its own kind mostly, sometimes of another."""
    if rng.random() < 0.12:  # another kind altogether
        return rng.choice([None, 0, -1, 2**40, 1.5, float("nan"), "", "x", True, [], {}, [0, 0, 0], {"$hex": "zz"},
                           {"$blob": "b9"}, copy.deepcopy(rng.choice(_nodes_values(tree)))])
    if isinstance(value, bool):
        return rng.choice([not value, 0, 1, None])
    if isinstance(value, int):
        return rng.choice([*_INTS, value + 1, value - 1, value * 2, rng.randrange(-3, 300), float(value), str(value)])
    if isinstance(value, float):
        return rng.choice([*_FLOATS, value * 2, -value, int(value) if math.isfinite(value) else 0])
    if isinstance(value, str):
        return rng.choice(["", value + "x", value[:-1], "b0", "b1", "00", "zz", value.upper(), "\0"])
    if isinstance(value, list):
        value = list(value)
        choice = rng.randrange(7)
        if choice == 0 and value:
            del value[rng.randrange(len(value))]
        elif choice == 1 and value:
            value.insert(rng.randrange(len(value) + 1), copy.deepcopy(rng.choice(value)))
        elif choice == 2:
            rng.shuffle(value)
        elif choice == 3:
            value = []
        elif choice == 4:
            value.append(rng.choice(_INTS))
        elif choice == 5 and value:
            value = value * rng.choice([2, 50])
        else:
            value = [value]
        return value
    if isinstance(value, dict):
        value = dict(value)
        if value and rng.random() < 0.5:
            del value[rng.choice(list(value))]
        else:
            value[rng.choice(["extra", "$hex", "$blob", "type"])] = rng.choice([0, "b0", "00", None])
        return value
    return rng.choice([0, [], {}, "x", [0, [1.0]], False])


def _nodes_values(tree: Any) -> list:
    return [get(tree, path) for path in paths(tree)[:200]]


def _as_list(value: Any) -> list:
    return value if isinstance(value, list) else []


def _subgraphs(body: dict) -> list[dict]:
    found = [body.get("main")] + _as_list(body.get("referenced"))
    return [s for s in found if isinstance(s, dict) and isinstance(s.get("operands"), list)]


def _semantic(rng: random.Random, body: dict) -> None:
    """A mutation aimed at a field's meaning (a valid-looking value that breaks a rule)."""
    subgraphs = _subgraphs(body)
    if not subgraphs:
        return
    subgraph = rng.choice(subgraphs)
    operands = [o for o in subgraph["operands"] if isinstance(o, dict)]
    listed = subgraph.get("operations")
    operations = [o for o in listed if isinstance(o, list) and len(o) == 3] if isinstance(listed, list) else []
    count = len(subgraph["operands"])
    kind = rng.randrange(16)
    if kind == 0 and operands:
        rng.choice(operands)["type"] = rng.choice([int(c) for c in T] + [0x10000, 0x10001, 0xFFFF0001, 99])
    elif kind == 1 and operands:
        rng.choice(operands)["dimensions"] = rng.choice([[], [0], [1], [2, 2], [2**31], [2**16, 2**16],
                                                         [40, 1], [1, 3, 3, 2], [0xFFFFFFFF]])
    elif kind == 2 and operands:
        operand = rng.choice(operands)
        operand["scale"], operand["zero_point"] = rng.choice(_FLOATS[:10]), rng.choice([0, 3, 255, 256, -129, 2**31])
    elif kind == 3 and operands:
        operand = rng.choice(operands)
        location = operand.get("location")
        if isinstance(location, list) and len(location) == 3:
            location[rng.randrange(3)] = rng.choice([0, 1, 2, 3, 4, 8, 160, 2**31, 2**32 - 1, 2**63])
    elif kind == 4 and operands:
        rng.choice(operands)["lifetime"] = rng.randrange(7)
    elif kind == 5 and operations:
        rng.choice(operations)[0] = rng.choice([int(c) for c in Op] + [0x10000, 0x10005, 200])
    elif kind == 6 and operations:
        side = rng.choice(operations)[rng.choice([1, 2])]
        if isinstance(side, list) and side:
            side[rng.randrange(len(side))] = rng.choice([count, count - 1, 0, 2**31, rng.randrange(max(count, 1))])
    elif kind == 7:
        key = rng.choice(["inputs", "outputs"])
        if isinstance(subgraph.get(key), list):
            subgraph[key] = rng.choice([[], subgraph[key] * 2, [count], list(range(min(count, 4))), [0]])
    elif kind == 8 and operands:  # a subgraph reference: self, a cycle, out of range
        references = [o for o in operands if o.get("lifetime") == 6]
        target = rng.choice(references or operands)
        target["lifetime"], target["type"] = 6, int(T.MODEL)
        target["location"] = [0, rng.choice([0, 1, 2, 3, 2**31]), 0]
    elif kind == 9:
        body["extensions"] = rng.choice([[["com.example.x", 1]], [["", 0]], [["a", 70000]], [[1, 1]],
                                         [["com.a", 1], ["com.a", 1]]])
    elif kind == 10 and operands:
        rng.choice(operands)["channel_quant"] = rng.choice([[0, [0.5]], [3, [1.0, 1.0]], [0, []], [0, [0.0, 1.0]],
                                                            [2**31, [1.0]], [0, [1.0] * 2]])
    elif kind == 11 and operands:
        rng.choice(operands)["extension_data"] = rng.choice([{"$hex": "00ff"}, {"$hex": ""}, "ab", 3])
    elif kind == 12 and operands:
        rng.choice(operands)["number_of_consumers"] = rng.choice([0, 1, 5, 2**32 - 1])
    elif kind == 13:
        body["pools"] = rng.choice([[], [{"$blob": "b0"}], _as_list(body.get("pools")) * 2, [{"$blob": "missing"}],
                                    [{"$hex": "00" * 16}]])
    elif kind == 14:
        body["relaxed"] = not body.get("relaxed")
    elif kind == 15 and isinstance(body.get("referenced"), list):
        if body["referenced"] and rng.random() < 0.5:
            body["referenced"].reverse()
        else:
            body["referenced"].append(copy.deepcopy(body.get("main")))


def _mutate_tree(rng: random.Random, tree: Any, semantic: Callable[[random.Random, Any], None],
                 semantic_share: float) -> Any:
    """1 to 3 mutations of a copy of ``tree``: ``semantic`` ones (a rule's field aimed at)
    ``semantic_share`` of the time, else any node but the root given another value."""
    tree = copy.deepcopy(tree)
    for _ in range(rng.randrange(1, 4)):
        if rng.random() < semantic_share:
            try:
                semantic(rng, tree)
            except (TypeError, KeyError, AttributeError, IndexError, ValueError):
                pass  # a tree an earlier mutation left without the field aimed at
        else:
            nodes = paths(tree)
            path = rng.choice(nodes[1:] if len(nodes) > 1 else nodes)
            tree = replace(tree, path, _mutated_value(rng, get(tree, path), tree))
    return tree


def mutate_body(rng: random.Random, body: dict) -> dict:
    """1 to 3 mutations of a cache body (the JSON tree as written: $hex / $blob included)."""
    return _mutate_tree(rng, body, _semantic, 0.55)


def mutate_arrays(rng: random.Random, arrays: dict[str, np.ndarray]) -> dict[str, Any]:
    """An npz entry with the wrong dtype / shape / length, missing, or an extra one."""
    arrays = dict(arrays)
    names = sorted(arrays)
    kind = rng.randrange(8)
    name = rng.choice(names) if names else "b0"
    base = arrays.get(name, np.zeros(4, np.uint8))
    if kind == 0:
        arrays.pop(name, None)
    elif kind == 1:
        arrays[f"b{len(names) + rng.randrange(3)}"] = np.arange(rng.choice([0, 1, 64]), dtype=np.uint8)
    elif kind == 2:
        arrays[name] = base.view(np.int8) if rng.random() < 0.5 else base.astype(np.float32)
    elif kind == 3 and base.size % 2 == 0:
        arrays[name] = base.reshape(2, -1)
    elif kind == 4:
        arrays[name] = base[: rng.randrange(base.size + 1)]
    elif kind == 5:
        arrays[name] = np.concatenate([base, np.zeros(rng.choice([1, 4, 4096]), np.uint8)])
    elif kind == 6:
        arrays[name] = np.array([b"ab", b"c"], dtype=object)
    else:
        arrays[name] = np.zeros((), np.uint8)
    return arrays


def mutate_zip_headers(rng: random.Random, data: bytes) -> bytes:
    """The archive ``data`` with one zip header field of one entry changed: its general
    purpose flags (bit 0 "encrypted" made zipfile raise a raw RuntimeError), its sizes, in
    the central directory or the local header, or its extra field (rewritten through
    zipfile, or its length alone changed)."""
    import struct
    import zipfile
    import zlib

    central = [i for i in range(len(data)) if data.startswith(b"PK\x01\x02", i)]
    local = [i for i in range(len(data)) if data.startswith(b"PK\x03\x04", i)]
    if not central or not local:
        return data
    out = bytearray(data)
    kind = rng.randrange(4)
    if kind == 0:  # flags: encrypted, data descriptor, patched data, strong encryption, UTF-8 names
        at = rng.choice(central) + 8 if rng.random() < 0.7 else rng.choice(local) + 6
        flags = struct.unpack_from("<H", out, at)[0] | rng.choice([1, 8, 0x20, 0x40, 0x800, 0x2000])
        struct.pack_into("<H", out, at, flags)
    elif kind == 1:  # compressed or uncompressed size
        if rng.random() < 0.7:
            at = rng.choice(central) + rng.choice([20, 24])
        else:
            at = rng.choice(local) + rng.choice([18, 22])
        size = struct.unpack_from("<I", out, at)[0]
        new_size = rng.choice([0, 1, max(size - 1, 0), size + 1, size * 2, 0xFFFFFFFF])
        struct.pack_into("<I", out, at, new_size & 0xFFFFFFFF)
    elif kind == 2:  # an extra field: a ZIP64 record, short or claiming huge sizes, or noise
        extra = rng.choice([b"\x01\x00\x08\x00" + b"\xff" * 8, b"\x01\x00\x02\x00ab", b"\x01\x00",
                            bytes(rng.randrange(256) for _ in range(rng.randrange(1, 12)))])
        stream = io.BytesIO()
        try:
            with zipfile.ZipFile(io.BytesIO(data)) as source, zipfile.ZipFile(stream, "w") as archive:
                victim = rng.randrange(len(source.infolist()))
                for number, entry in enumerate(source.infolist()):
                    info = zipfile.ZipInfo(entry.filename, entry.date_time)
                    if number == victim:
                        info.extra = extra
                    archive.writestr(info, source.read(entry))
        except (RuntimeError, ValueError, OSError, EOFError, zipfile.BadZipFile, NotImplementedError, zlib.error):
            return data  # (an archive already mutated that zipfile cannot rewrite)
        return stream.getvalue()
    else:  # the extra field's length alone
        at = rng.choice(central) + 30 if rng.random() < 0.7 else rng.choice(local) + 28
        struct.pack_into("<H", out, at, rng.choice([1, 4, 20, 0xFFFF]))
    return bytes(out)


# --- nnapi-reference's cache files --------------------------------------------------------
def split_reference_cache(model_bytes: bytes, data_bytes: bytes) -> tuple[dict, Any, dict[str, np.ndarray]]:
    """(header, body JSON tree, npz arrays) of good reference cache files."""
    header_line, _, body = model_bytes[len(cache_format.MAGIC):].partition(b"\n")
    with np.load(io.BytesIO(data_bytes), allow_pickle=False) as archive:
        arrays = {name: archive[name] for name in archive.files}
    return json.loads(header_line), json.loads(body), arrays


def npz_bytes(arrays: dict[str, Any]) -> bytes:
    stream = io.BytesIO()
    np.savez(stream, **arrays)
    return stream.getvalue()


def _compressed(arrays: dict[str, np.ndarray]) -> bytes:
    stream = io.BytesIO()
    np.savez_compressed(stream, **arrays)
    return stream.getvalue()


def _claiming(arrays: dict[str, np.ndarray], size: int) -> bytes:
    """An archive whose first entry's .npy header claims ``size`` elements (np.load
    allocates that before reading)."""
    import zipfile

    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": "|u1", "fortran_order": False, "shape": (size,)})
    stream = io.BytesIO()
    with zipfile.ZipFile(stream, "w") as archive:
        for number, name in enumerate(sorted(arrays)):
            archive.writestr(f"{name}.npy", header.getvalue() + bytes(8) if number == 0 else _npy(arrays[name]))
    return stream.getvalue()


def nested_npz(depth: int, inner: int = 64) -> bytes:
    """An archive of stored uint8 .npy entries nested one in the next: each entry's array
    body holds the next entry's local header and data, so ``depth`` entries of a file of n
    bytes add up to about depth * n / 2 (zipfile, Python 3.11.7, reads overlapping entries)."""
    import struct
    import zlib

    def npy_header(count: int) -> bytes:
        stream = io.BytesIO()
        np.lib.format.write_array_header_1_0(stream, {"descr": "|u1", "fortran_order": False, "shape": (count,)})
        return stream.getvalue()

    def local_header(name: bytes, data: bytes) -> bytes:
        return struct.pack("<4sHHHHHIIIHH", b"PK\x03\x04", 20, 0, 0, 0, 0x21, zlib.crc32(data), len(data),
                           len(data), len(name), 0) + name

    names = [f"b{i}.npy".encode() for i in range(depth)]
    datas = [b""] * depth
    datas[-1] = npy_header(inner) + bytes(inner)
    for i in range(depth - 1, 0, -1):
        body = local_header(names[i], datas[i]) + datas[i]
        datas[i - 1] = npy_header(len(body)) + body
    offsets = [0]  # entry i + 1's local header lies in entry i's data, after its .npy header
    for i in range(depth - 1):
        offsets.append(offsets[-1] + 30 + len(names[i]) + len(datas[i]) - 30 - len(names[i + 1]) - len(datas[i + 1]))
    files = local_header(names[0], datas[0]) + datas[0]
    central = b"".join(struct.pack("<4sHHHHHHIIIHHHHHII", b"PK\x01\x02", 20, 20, 0, 0, 0, 0x21, zlib.crc32(data),
                                   len(data), len(data), len(name), 0, 0, 0, 0, 0, offset) + name
                       for name, data, offset in zip(names, datas, offsets, strict=True))
    return files + central + struct.pack("<4sHHHHIIH", b"PK\x05\x06", 0, 0, depth, depth, len(central), len(files), 0)


def _npy(array: np.ndarray) -> bytes:
    stream = io.BytesIO()
    np.save(stream, array)
    return stream.getvalue()


def pack_reference_cache(header: dict, body: Any, data: bytes) -> bytes:
    """Model cache bytes for ``body`` (and a data file ``data``) with valid checksums."""
    encoded = json.dumps(body, separators=(",", ":")).encode()  # NaN allowed: another writer might
    header = {**header, "body_sha256": hashlib.sha256(encoded).hexdigest(),
              "data_sha256": hashlib.sha256(data).hexdigest()}
    return cache_format.MAGIC + json.dumps(header).encode() + b"\n" + encoded


def _write(path: str, data: bytes) -> None:
    with open(path, "wb") as handle:
        handle.write(data)


def fuzz_reference_cache(seed: int, cases: int, directory: str, log: Callable[[str], None] | None = None) -> Counter:
    """``cases`` mutated reference caches over BUILDERS' models; the counts of each outcome.
    Raises AssertionError on a property broken (a raw exception at the HAL or the public API,
    a changed cache used, outputs other than a fresh compilation's)."""
    from nnapi.drivers.reference import ReferenceDevice

    rng = random.Random(seed)
    devices = [d for d in nnapi.get_devices() if d.name == "nnapi-reference"]
    driver = ReferenceDevice()
    counts: Counter = Counter()
    prepared_cases = []
    for name, build in BUILDERS.items():
        case = Case(name, build)
        cache_dir = os.path.join(directory, f"ref-{name}")
        os.makedirs(cache_dir, exist_ok=True)
        from_cache, case.outputs = compile_and_run(case, devices, cache_dir)
        assert from_cache == 0
        model_path, data_path = (os.path.join(cache_dir, n) for n in sorted(os.listdir(cache_dir))[::-1])
        good_model, good_data = Path(model_path).read_bytes(), Path(data_path).read_bytes()
        token = bytes.fromhex(json.loads(good_model[len(cache_format.MAGIC):].partition(b"\n")[0])["token"])
        digest = model_digest(cache_format.unpack(good_model, good_data, token))
        prepared_cases.append((case, cache_dir, model_path, data_path, good_model, good_data, token, digest))
    for number in range(cases):
        case, cache_dir, model_path, data_path, good_model, good_data, token, digest = rng.choice(prepared_cases)
        header, body, arrays = split_reference_cache(good_model, good_data)
        what = rng.random()
        data = good_data
        if what < 0.6:
            body = mutate_body(rng, body)
        elif what < 0.7:
            data = npz_bytes(mutate_arrays(rng, arrays))
        elif what < 0.8:
            data = mutate_zip_headers(rng, npz_bytes(mutate_arrays(rng, arrays)) if rng.random() < 0.3 else good_data)
        elif what < 0.9:
            body = mutate_body(rng, body)
            data = npz_bytes(mutate_arrays(rng, arrays))
        else:
            data = rng.choice([b"", b"PK\x03\x04" + bytes(20), good_data[: rng.randrange(len(good_data))],
                               npz_bytes({"b0": np.zeros(3, np.uint8)}), npz_bytes({}), _compressed(arrays),
                               _claiming(arrays, rng.choice([2**20, 2**40])), good_data + good_data[-22:],
                               nested_npz(rng.choice([2, 3, 40]))])
        model_bytes = pack_reference_cache(header, body, data)
        changed = model_bytes != good_model or data != good_data
        # the driver, the file granted a record: HalError or a prepared model, never a raw exception
        seal = cache_format._seal(json.loads(model_bytes[len(cache_format.MAGIC):].partition(b"\n")[0]))
        with granted(os.path.join(directory, "granted"), driver.name, token, seal):
            outcome = _driver_outcome(driver, model_bytes, data, token)
            if outcome == "prepared" and model_digest(cache_format.unpack(model_bytes, data, token)) != digest:
                counts["prepared another model (record granted)"] += 1
        counts[outcome] += 1
        # the public API: uses the cache only as the driver wrote it, else recompiles afresh
        _write(model_path, model_bytes)
        _write(data_path, data)
        counts[_public_api_outcome(case, devices, cache_dir, changed, f"seed {seed} case {number}", "cache")] += 1
        if log is not None and number % 200 == 0:
            log(f"{number} {dict(counts)}")
    return counts


def _public_api_outcome(case: Case, devices: list[nnapi.Device], cache_dir: str, changed: bool, where: str,
                        what: str) -> str:
    """Compile ``case`` with the cache in ``cache_dir`` and run it: the property every target
    holds to is that a changed ``what`` is never used and the outputs are a fresh
    compilation's. Returns the outcome's count name; raises AssertionError on a break."""
    try:
        from_cache, outputs = compile_and_run(case, devices, cache_dir)
    except Exception as error:
        raise AssertionError(f"{where} ({case.name}): {error!r} at the public API") from error
    same = all(np.array_equal(a, b, equal_nan=True) for a, b in zip(outputs, case.outputs, strict=True))
    if from_cache and changed:
        raise AssertionError(f"{where} ({case.name}): a changed {what} was used "
                             f"(outputs {'the same' if same else 'different'})")
    if not same:
        raise AssertionError(f"{where} ({case.name}): outputs differ from a fresh compilation "
                             f"(from cache: {from_cache})")
    return "same outputs" + (" from cache" if from_cache else " recompiled")


def _driver_outcome(driver: Any, model_bytes: bytes, data: bytes, token: bytes) -> str:
    fds = [os.memfd_create("m"), os.memfd_create("d")]
    try:
        os.write(fds[0], model_bytes)
        os.write(fds[1], data)
        try:
            prepared = driver.prepare_model_from_cache([fds[0]], [fds[1]], token)
        except HalError as error:
            return f"rejected: {error.status.name}"
        except Exception as error:
            raise AssertionError(f"raw {type(error).__name__} across the HAL: {error}") from error
        assert isinstance(prepared, IPreparedModel)
        return "prepared"
    finally:
        for fd in fds:
            os.close(fd)


def _transpose_omittable(keep: list):
    """TRANSPOSE whose permutation is a model input a request may omit: nnapi-ort-cpu's
    cache file of patterns (the HAL model, the reference's cache format inside, and each
    pattern's graph)."""
    model = nnapi.Model()
    x = _operand(model, keep, OperandType(T.TENSOR_FLOAT32, [2, 3]))
    perm = _operand(model, keep, OperandType(T.TENSOR_INT32, [2]))
    y = _operand(model, keep, OperandType(T.TENSOR_FLOAT32, [3, 2]))
    model.add_operation(Op.TRANSPOSE, [x, perm], [y])
    model.identify_inputs_and_outputs([x, perm], [y])
    model.finish()
    return model, [np.arange(6, dtype=np.float32).reshape(2, 3), None], [np.zeros((3, 2), np.float32)]


ORT_BUILDERS = {"add_mul": _add_mul, "per_channel_conv": _per_channel_conv, "transpose_omittable": _transpose_omittable}


def split_ort_cache(data: bytes) -> tuple[dict, bytes]:
    from nnapi.drivers.ort import compilation_cache

    start = len(compilation_cache._CACHE_MAGIC) + 4
    length = int.from_bytes(data[start - 4:start], "little")
    return json.loads(data[start:start + length]), data[start + length:]


def pack_ort_cache(header: Any, payload: bytes) -> bytes:
    """An ORT cache file of ``header`` and ``payload`` with a valid checksum."""
    from nnapi.drivers.ort import compilation_cache

    if isinstance(header, dict):
        header = dict(header)
        header["sha256"] = compilation_cache._checksum(header, payload)
    encoded = json.dumps(header, sort_keys=True).encode()
    return compilation_cache._CACHE_MAGIC + len(encoded).to_bytes(4, "little") + encoded + payload


def _onnx_mutations(rng: random.Random, payload: bytes, others: list[bytes]) -> bytes:
    kind = rng.randrange(5)
    if kind == 0:
        return rng.choice(others)  # another valid ONNX model (another case's graph)
    if kind == 1:
        return payload[: rng.randrange(len(payload))]
    if kind == 2:
        damaged = bytearray(payload)
        for _ in range(rng.randrange(1, 8)):
            damaged[rng.randrange(len(damaged))] = rng.randrange(256)
        return bytes(damaged)
    if kind == 3:
        return b""
    return payload + payload[: rng.randrange(64)]


def fuzz_ort_cache(seed: int, cases: int, directory: str, log: Callable[[str], None] | None = None) -> Counter:
    """``cases`` mutated nnapi-ort-cpu cache files (header fields, the graph replaced by
    another valid ONNX model or a damaged one, the patterns file's HAL model and
    sizes); the counts of each outcome. Raises AssertionError on a property broken (a raw
    exception at the HAL or the public API, a changed file used, outputs other than a fresh
    compilation's)."""
    from nnapi.drivers.ort.device import OrtDevice
    from nnapi.runtime import manager

    rng = random.Random(seed)
    driver = next((d for d in manager.hal_devices() if d.name == "nnapi-ort-cpu"), None)
    if driver is None:
        driver = OrtDevice()
        manager.register_device(driver)
    devices = [d for d in nnapi.get_devices() if d.name == "nnapi-ort-cpu"]
    counts: Counter = Counter()
    prepared_cases = []
    for name, build in ORT_BUILDERS.items():
        case = Case(name, build)
        cache_dir = os.path.join(directory, f"ort-{name}")
        os.makedirs(cache_dir, exist_ok=True)
        from_cache, case.outputs = compile_and_run(case, devices, cache_dir)
        assert from_cache == 0
        (path,) = (os.path.join(cache_dir, n) for n in os.listdir(cache_dir))
        good = Path(path).read_bytes()
        header, payload = split_ort_cache(good)
        assert compile_and_run(case, devices, cache_dir)[0] == 1
        prepared_cases.append((case, cache_dir, path, good, header, payload))
    graphs = [payload for _, _, _, _, header, payload in prepared_cases if header.get("kind") != "patterns"]
    for number in range(cases):
        case, cache_dir, path, good, header, payload = rng.choice(prepared_cases)
        token = bytes.fromhex(header["token"])
        header, new_payload = copy.deepcopy(header), payload
        patterns = header.get("kind") == "patterns"
        what = rng.random()
        if patterns and what < 0.5:  # the HAL model inside: the reference cache fuzz's mutations
            model_size, data_size = header["model_bytes"], header["data_bytes"]
            ref_header, body, arrays = split_reference_cache(payload[:model_size],
                                                             payload[model_size:model_size + data_size])
            data = payload[model_size:model_size + data_size]
            if rng.random() < 0.75:
                body = mutate_body(rng, body)
            else:
                data = npz_bytes(mutate_arrays(rng, arrays))
            model_bytes = pack_reference_cache(ref_header, body, data)
            new_payload = model_bytes + data + payload[model_size + data_size:]
            header["model_bytes"], header["data_bytes"] = len(model_bytes), len(data)
        elif what < 0.75:
            header = mutate_body(rng, header)
            if rng.random() < 0.3:
                new_payload = _onnx_mutations(rng, payload, graphs)
        else:
            new_payload = _onnx_mutations(rng, payload, graphs)
            if patterns and new_payload is not payload:
                # a pattern's graph replaced: the sizes kept consistent, so the graph is what is read
                offset = header["model_bytes"] + header["data_bytes"]
                header["patterns"][0]["bytes"] = len(new_payload)
                new_payload = payload[:offset] + new_payload
        file_bytes = pack_ort_cache(header, new_payload)
        changed = file_bytes != good
        fd = os.memfd_create("ort-cache")
        written = split_ort_cache(file_bytes)[0]  # (the header as pack_ort_cache sealed it)
        seal = written.get("sha256") if isinstance(written, dict) and isinstance(written.get("sha256"), str) else None
        try:
            os.write(fd, file_bytes)
            # the driver, the file granted a record: HalError or a prepared model, never a raw exception
            with granted(os.path.join(directory, "granted"), driver.name, token, seal):
                try:
                    driver.prepare_model_from_cache([fd], [], token)
                    outcome = "prepared"
                    if changed:
                        counts["prepared a changed file (record granted)"] += 1
                except HalError as error:
                    outcome = f"rejected: {error.status.name}"
                except Exception as error:
                    raise AssertionError(f"seed {seed} case {number} ({case.name}): raw {type(error).__name__} "
                                         f"across the HAL: {error}") from error
        finally:
            os.close(fd)
        counts[outcome] += 1
        # the public API: uses the file only as the driver wrote it, else recompiles afresh
        _write(path, file_bytes)
        counts[_public_api_outcome(case, devices, cache_dir, changed, f"seed {seed} case {number}", "cache file")] += 1
        if log is not None and number % 200 == 0:
            log(f"{number} {dict(counts)}")
    return counts


# --- CTS vector files ------------------------------------------------------------------------
VECTOR_TESTS = ("add", "add_relaxed", "squeeze_b155238914", "conv2d_per_channel",
                "depthwise_conv2d_invalid_filter_dims_nhwc", "random_multinomial", "lstm")
_OPERAND_NAMES = [c.name for c in T]
_LIFETIME_NAMES = ["TEMPORARY_VARIABLE", "SUBGRAPH_INPUT", "SUBGRAPH_OUTPUT", "CONSTANT_COPY", "CONSTANT_REFERENCE",
                   "NO_VALUE", "SUBGRAPH", "POINTER"]


def vector_records() -> list[dict]:
    """Shipped records of several kinds (relaxed, omitted operand, per-channel, expected to
    fail, multinomial, unknown dimensions)."""
    from nnapi.conformance import default_vector_files, load_records

    found = {}
    for path in default_vector_files():
        for record in load_records(path):
            if record["test"] in VECTOR_TESTS and record["test"] not in found:
                found[record["test"]] = record
    return [found[name] for name in VECTOR_TESTS]


def _record_semantic(rng: random.Random, record: dict) -> None:
    subgraphs = [record.get("main"), *_as_list(record.get("referenced"))]
    subgraph = rng.choice([s for s in subgraphs if isinstance(s, dict)] or [{}])
    operands = [o for o in _as_list(subgraph.get("operands")) if isinstance(o, dict)]
    operations = [o for o in _as_list(subgraph.get("operations")) if isinstance(o, dict)]
    count = len(_as_list(subgraph.get("operands")))
    kind = rng.randrange(11)
    if kind == 0 and operands:
        rng.choice(operands)["type"] = rng.choice([*_OPERAND_NAMES, "FOO", "tensor_float32"])
    elif kind == 1 and operands:
        rng.choice(operands)["lifetime"] = rng.choice(_LIFETIME_NAMES)
    elif kind == 2 and operands:
        operand = rng.choice(operands)
        data = _as_list(operand.get("data"))
        operand["data"] = rng.choice([[], data[:-1], data + data[:1], [300] * len(data), [1.5] * len(data),
                                      ["nan"] * len(data), ["x"] * len(data), [True] * len(data), [[1, 2]], None])
    elif kind == 3 and operands:
        rng.choice(operands)["dimensions"] = rng.choice([[], [0], [1], [2**32], [-1], [2**16, 2**16], [1.5]])
    elif kind == 4 and operations:
        operation = rng.choice(operations)
        side = rng.choice(["inputs", "outputs"])
        indexes = _as_list(operation.get(side))
        if indexes:
            indexes[rng.randrange(len(indexes))] = rng.choice([count, -1, 0, count - 1, 2**40])
    elif kind == 5 and operations:
        rng.choice(operations)["type"] = rng.choice([c.name for c in Op] + ["NOPE", ""])
    elif kind == 6:  # a referenced subgraph: a copy of main, reached from main or from itself
        referenced = record.setdefault("referenced", [])
        if isinstance(referenced, list):
            referenced.append(copy.deepcopy(record.get("main")))
            target = rng.choice([operands, _as_list((referenced[-1] or {}).get("operands"))])
            target = [o for o in target if isinstance(o, dict)]
            if target:
                operand = rng.choice(target)
                operand.update(lifetime="SUBGRAPH", type="MODEL", dimensions=[],
                               data=[rng.choice([len(referenced) - 1, 0, len(referenced), -1])])
    elif kind == 7 and operands:
        rng.choice(operands)["channelQuant"] = rng.choice([{"channelDim": 0, "scales": [0.5]},
                                                           {"channelDim": 9, "scales": [1.0, 1.0]},
                                                           {"channelDim": 0}, {"channelDim": 0, "scales": [0.0, -1.0]},
                                                           [], 3])
    elif kind == 8:
        key = rng.choice(["inputIndexes", "outputIndexes"])
        subgraph[key] = rng.choice([[], [count], _as_list(subgraph.get(key)) * 2, [0], list(range(count))])
    elif kind == 9:
        record[rng.choice(["isRelaxed", "expectFailure", "multinomialTolerance"])] = rng.choice(
            [True, False, 0.5, -1.0, float("nan"), 1e300, "yes", None])
    elif kind == 10 and operands:
        operand = rng.choice(operands)
        operand["scale"], operand["zeroPoint"] = rng.choice([(0.0, 0), (-1.0, 0), (float("nan"), 0), (1.0, 1.5),
                                                             (1e39, 2**40), ("x", 0), (0.5, 300)])


def mutate_record(rng: random.Random, record: dict) -> Any:
    """1 to 3 mutations of a vector file's record."""
    return _mutate_tree(rng, record, _record_semantic, 0.6)


def _vector_file(rng: random.Random, path: str, records: list[Any]) -> str:
    lines = [json.dumps(r) for r in records]
    if rng.random() < 0.05:
        lines.insert(rng.randrange(len(lines) + 1), rng.choice(["{", "[1,", "nul", "\x00", '"text"']))
    data = ("\n".join(lines) + "\n").encode()
    if rng.random() < 0.3:
        path += ".gz"
        data = gzip.compress(data)
        if rng.random() < 0.1:
            data = data[: rng.randrange(len(data))]
    elif rng.random() < 0.03:
        data = data.replace(b"a", b"\xff", 1)  # not UTF-8
    _write(path, data)
    return path


def fuzz_vector_files(seed: int, cases: int, directory: str, log: Callable[[str], None] | None = None,
                      run_every: int = 1) -> Counter:
    """``cases`` vector files of mutated shipped records: each is refused with one
    VectorFileError naming the file and line, or its records are built, run on
    nnapi-reference and judged (a vector failing is fine; a RAW exception is not), as are
    Android's variations of them; the counts of each outcome."""
    from nnapi.conformance import (
        VARIANTS,
        VectorFileError,
        declined_by,
        is_supported,
        load_records,
        run_record,
        tested_operations,
    )

    rng = random.Random(seed)
    originals = vector_records()
    device = next(d for d in nnapi.get_devices() if d.name == "nnapi-reference")
    counts: Counter = Counter()
    for number in range(cases):
        chosen = [mutate_record(rng, rng.choice(originals)) for _ in range(rng.choice([1, 1, 1, 2]))]
        if rng.random() < 0.3:
            chosen.insert(0, rng.choice(originals))  # a good line before: the bad one's number is named
        path = _vector_file(rng, os.path.join(directory, f"case{number % 8}.jsonl"), chosen)
        try:
            records = list(load_records(path))
        except VectorFileError as error:
            if not str(error).startswith(f"{path}:") or "\n" in str(error):
                raise AssertionError(f"seed {seed} case {number}: the error names no file and line: {error}") \
                    from None
            counts["refused"] += 1
            continue
        except Exception as error:
            raise AssertionError(f"seed {seed} case {number}: raw {type(error).__name__} from load_records: "
                                 f"{error}") from error
        for record in records:
            try:
                supported = is_supported(record)
                tested_operations(record)
                variants = [fn(record) for fn in VARIANTS.values()]
            except Exception as error:
                raise AssertionError(f"seed {seed} case {number}: raw {type(error).__name__} from a checked "
                                     f"record: {error}") from error
            if not supported:
                counts["not implemented"] += 1
                continue
            if number % run_every:
                counts["read"] += 1
                continue
            for candidate in [record, *(v for v in variants if v is not None and rng.random() < 0.2)]:
                outcome = run_record(candidate, device)
                if outcome.message.startswith("RAW"):
                    raise AssertionError(f"seed {seed} case {number}: {outcome.message}")
                declined_by(candidate, device)
                counts["passed" if outcome.passed else "failed cleanly"] += 1
        if log is not None and number % 200 == 0:
            log(f"{number} {dict(counts)}")
    return counts


def main(argv: list[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cases", type=int, default=1000)
    parser.add_argument("--target", choices=["reference", "ort", "vectors"], default="reference")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as directory:
        if args.target == "reference":
            counts = fuzz_reference_cache(args.seed, args.cases, directory, log=print)
        elif args.target == "vectors":
            counts = fuzz_vector_files(args.seed, args.cases, directory, log=print)
        elif args.target == "ort":
            counts = fuzz_ort_cache(args.seed, args.cases, directory, log=print)
        print(f"{args.target}: {args.cases} cases, seed {args.seed}: {dict(counts)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
