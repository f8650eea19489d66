"""What the model commands (run, inspect, bench, compare) share: opening a model as a
Session with one-line errors, reading ``--input NAME=FILE.npy``, the built-in model,
LiteRT as the yardstick, latency statistics."""

from __future__ import annotations

import argparse
import math
import time
import zipfile
import zlib
from importlib import resources
from typing import Any

import numpy as np

import nnapi
from nnapi._npy import read_npy_header
from nnapi.cli._common import CliError, find_device, import_model, input_shapes
from nnapi.session import Session, random_inputs

#: The model ``nnapi run`` runs when given none (see nnapi/data/models/README.md).
BUILTIN_MODEL = "hand_recrop.tflite"


def builtin_model_path() -> str:
    return str(resources.files("nnapi") / "data" / "models" / BUILTIN_MODEL)


def open_session(path: str, device_names: list[str] | None = None, keep_loops: bool = False,
                 shapes: list[str] | None = None, signature: str | None = None) -> Session:
    """Import (``shapes``: the ``--input-shape`` options, ``signature``: ``--signature``) and
    compile ``path``; file problems are one-line CliErrors."""
    devices = [find_device(name) for name in device_names] if device_names else None
    return Session(import_model(path, keep_loops, shapes, signature), devices)


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of every command that runs a model: --device, --input, --seed (read
    by ``open_session`` and ``read_inputs``)."""
    parser.add_argument("--device", action="append", metavar="NAME",
                        help="device to run on (repeatable; default: let the runtime choose)")
    parser.add_argument("--input", action="append", metavar="NAME=FILE.npy",
                        help="an input array, or FILE.npz of arrays named after inputs (repeatable; inputs not "
                             "given are seeded random)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default 0)")


def read_inputs(session: Session, specs: list[str] | None, seed: int) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """The inputs named by ``--input NAME=FILE.npy`` (or ``FILE.npy`` alone for a model
    with one input, or ``FILE.npz`` holding arrays named after inputs), the rest seeded
    random; also where each came from."""
    given: dict[str, np.ndarray] = {}
    origin: dict[str, str] = {}
    names = [info.name for info in session.inputs]
    for spec in specs or []:
        name, sep, file = spec.rpartition("=")
        if not sep and spec.endswith(".npz"):
            _read_npz(session, spec, given, origin)
            continue
        if not sep:
            if len(names) != 1:
                raise CliError(f"--input {spec}: the model has {len(names)} inputs; use NAME=FILE.npy "
                               f"(inputs: {', '.join(names)})")
            name, file = names[0], spec
        if name not in names:
            raise CliError(f"--input {spec}: the model has no input {name!r} (inputs: {', '.join(names)})")
        try:
            if problem := _overclaimed(file):
                raise ValueError(problem)
            value = np.load(file, mmap_mode="r", allow_pickle=False)
            if isinstance(value, np.ndarray):
                value = np.array(value)  # (read now, not mapped: a header claiming more was refused)
        except FileNotFoundError:
            raise CliError(f"--input {spec}: {file}: no such file") from None
        except (OSError, ValueError, EOFError, zipfile.BadZipFile, NotImplementedError, zlib.error) as error:
            raise CliError(f"--input {spec}: {file}: not a .npy array ({error})") from None
        if not isinstance(value, np.ndarray):
            value.close()
            raise CliError(f"--input {spec}: {file}: holds several arrays (.npz); give one .npy array")
        info = session.inputs[names.index(name)]
        try:
            session._check_input(info, value)
        except nnapi.BadDataError as error:
            raise CliError(f"--input {spec}: {error}") from None
        given[name] = value
        origin[name] = file
    missing = [info for info in session.inputs if info.name not in given]
    for name, value in random_inputs(missing, seed).items():
        given[name] = value
        origin[name] = f"random (seed {seed})"
    return given, origin


def _overclaimed(file: str) -> str | None:
    """Why an .npz file's entry cannot be read safely, else None: it is encrypted (zipfile
    raised a raw RuntimeError asking for a password) or its array header claims more bytes
    than the entry holds (np.load allocates what a header claims before reading: a 60-byte
    entry claiming 4 TiB raised a raw MemoryError). An .npy file needs no look: np.load's
    mmap_mode refuses a header claiming more than the file holds. A file this cannot read
    is left for np.load to judge."""
    try:
        if not zipfile.is_zipfile(file):
            return None
        with zipfile.ZipFile(file) as archive:
            for entry in archive.infolist():
                if entry.flag_bits & 1:
                    return f"{entry.filename} is encrypted"
                with archive.open(entry) as stream:
                    shape, dtype = read_npy_header(stream)
                size = math.prod(shape) * dtype.itemsize
                if size > entry.file_size:
                    return f"the header of {entry.filename} claims {size} bytes, the entry holds {entry.file_size}"
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, NotImplementedError, zlib.error):
        pass  # np.load says what is wrong, in its words
    return None


def _read_npz(session: Session, file: str, given: dict[str, np.ndarray], origin: dict[str, str]) -> None:
    """``--input FILE.npz``: every array of the file is the input of the same name."""
    names = [info.name for info in session.inputs]
    try:
        if problem := _overclaimed(file):
            raise ValueError(problem)
        with np.load(file, allow_pickle=False) as archive:
            arrays = {key: archive[key] for key in archive.files}
    except FileNotFoundError:
        raise CliError(f"--input {file}: no such file") from None
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, NotImplementedError, zlib.error) as error:
        raise CliError(f"--input {file}: not a .npz archive ({error})") from None
    for name, value in arrays.items():
        if name not in names:
            raise CliError(f"--input {file}: the model has no input {name!r} (inputs: {', '.join(names)})")
        try:
            session._check_input(session.inputs[names.index(name)], value)
        except nnapi.BadDataError as error:
            raise CliError(f"--input {file}: {error}") from None
        given[name] = value
        origin[name] = f"{file}[{name}]"


class LiteRTSignature:
    """LiteRT's SignatureRunner of one signature, fed and read by the tensor names nnapi's
    imported model uses (``names``: ImportedModel.signature_names, {tensor name: key}).
    Each call resizes the inputs to the values given and allocates (SignatureRunner's
    __call__ does both), which a timing of it includes."""

    def __init__(self, runner: Any, names: dict[str, str]) -> None:
        self.runner = runner
        self.keys = names
        self.names = {key: name for name, key in names.items()}

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        inputs = self.runner.get_input_details()
        given = {}
        for name, value in feeds.items():
            key = self.keys.get(name)
            if key not in inputs:
                raise CliError(f"LiteRT's signature has no input {name!r}")
            given[key] = value
        try:
            outputs = self.runner(**given)
        except (RuntimeError, ValueError) as error:
            raise CliError(f"LiteRT cannot run these inputs ({str(error).splitlines()[0]})") from None
        return {self.names.get(key, key): value for key, value in outputs.items()}


def litert_interpreter(path: str, builtin_kernels: bool = False, threads: int = 1,
                       shapes: list[str] | None = None, signature: str | None = None,
                       names: dict[str, str] | None = None) -> Any | None:
    """A LiteRT interpreter for ``path`` with ``threads`` threads (its default XNNPACK
    delegate, or only its builtin kernels), its inputs resized as ``--input-shape`` says
    (``shapes``), or None if LiteRT is absent. With ``signature``: a LiteRTSignature of that
    signature's runner, whose inputs and outputs are the tensors ``names`` maps to its keys
    (the imported model's signature_names)."""
    try:
        from ai_edge_litert.interpreter import Interpreter, OpResolverType
    except ImportError:
        return None
    try:
        resolver = OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES if builtin_kernels else OpResolverType.AUTO
        interpreter = Interpreter(model_path=path, num_threads=threads, experimental_op_resolver_type=resolver)
        if signature is not None:
            # (each call resizes to the values given: ``shapes`` needs no resize here) A runner
            # allocates its tensors on its first call only: one run of zeros here, so that a
            # model these kernels cannot prepare (a custom operator only the XNNPACK delegate
            # has) fails now, where compare and bench drop the builtin kernels' figures
            runner = interpreter.get_signature_runner(signature)
            runner(**{key: np.zeros(detail["shape"], detail["dtype"])
                      for key, detail in runner.get_input_details().items()})
            return LiteRTSignature(runner, names or {})
        by_name = {d["name"]: d["index"] for d in interpreter.get_input_details()}
        for name, shape in (input_shapes(shapes) or {}).items():
            if name in by_name:
                interpreter.resize_tensor_input(by_name[name], shape)
        interpreter.allocate_tensors()
    except (RuntimeError, ValueError) as error:
        raise CliError(f"{path}: LiteRT cannot load it ({str(error).splitlines()[0]})") from None
    return interpreter


def litert_run(interpreter: Any, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """LiteRT's outputs for ``feeds`` (by tensor name), from litert_interpreter's answer."""
    if isinstance(interpreter, LiteRTSignature):
        return interpreter.run(feeds)
    by_name = {d["name"]: d for d in interpreter.get_input_details()}
    for name in feeds:
        if name not in by_name:
            raise CliError(f"LiteRT's model has no input {name!r}")
    # an input of another size where the model's shape signature has -1 (a batch or a
    # sequence length given at run time): LiteRT resizes its tensors first
    resized = False
    for name, value in feeds.items():
        detail = by_name[name]
        if tuple(value.shape) != tuple(detail["shape"]):
            interpreter.resize_tensor_input(detail["index"], list(np.shape(value)))
            resized = True
    try:
        if resized:
            interpreter.allocate_tensors()
        for name, value in feeds.items():
            interpreter.set_tensor(by_name[name]["index"], value)
        interpreter.invoke()
    except (RuntimeError, ValueError) as error:
        raise CliError(f"LiteRT cannot run these inputs ({str(error).splitlines()[0]})") from None
    return {d["name"]: interpreter.get_tensor(d["index"]) for d in interpreter.get_output_details()}


def time_runs(run, iterations: int, warmup: int) -> list[float]:
    for _ in range(warmup):
        run()
    seconds = []
    for _ in range(iterations):
        start = time.perf_counter()
        run()
        seconds.append(time.perf_counter() - start)
    return seconds


def latency_stats(seconds: list[float]) -> dict[str, float]:
    ms = np.asarray(seconds) * 1e3
    return {"runs": len(ms), "mean_ms": float(ms.mean()), "median_ms": float(np.median(ms)),
            "p5_ms": float(np.percentile(ms, 5)), "p95_ms": float(np.percentile(ms, 95)), "min_ms": float(ms.min())}


def format_stats(stats: dict[str, float]) -> str:
    return (f"mean {stats['mean_ms']:.3f} ms, median {stats['median_ms']:.3f} ms, p5 {stats['p5_ms']:.3f} ms, "
            f"p95 {stats['p95_ms']:.3f} ms, min {stats['min_ms']:.3f} ms ({stats['runs']} runs)")


def positive(value: str) -> int:
    """argparse type: an int >= 1 (argparse turns the error into a usage message)."""
    return _int_at_least(value, 1, "a positive integer")


def non_negative(value: str) -> int:
    """argparse type: an int >= 0."""
    return _int_at_least(value, 0, "a non-negative integer")


def _int_at_least(value: str, low: int, what: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {what}, got {value!r}") from None
    if number < low:
        raise argparse.ArgumentTypeError(f"expected {what}, got {value}")
    return number
