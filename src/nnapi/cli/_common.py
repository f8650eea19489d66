"""What the command modules share: exit codes, errors, device lookup, driver plug-ins,
JSON output."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nnapi
from nnapi.device import no_device_message

EXIT_OK = 0
EXIT_FAILED = 1  # a test or comparison failed
EXIT_USAGE = 2  # bad arguments, missing or unreadable files
EXIT_NNAPI_ERROR = 3
EXIT_INTERRUPTED = 130


class CliError(Exception):
    """A one-line error for the user; ``main`` prints it and exits with ``exit_code``."""

    def __init__(self, message: str, exit_code: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def common_parser() -> argparse.ArgumentParser:
    """The options every command takes (pass as ``parents=[common]``)."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--driver", action="append", default=[], metavar="PKG.MODULE:FACTORY",
                        help="load a driver plug-in before running: pkg.module:factory or a shipped driver "
                             "(reference, sample, faulty, ort, fibonacci); repeatable. Plug-ins also come from the "
                             "nnapi.drivers entry points and NNAPI_DRIVERS")
    common.add_argument("--trace", metavar="FILE.json",
                        help="write a Chrome trace of compilations, executions and operations (Perfetto opens it)")
    common.add_argument("--keep-loops", action="store_true",
                        help="import a WHILE loop that is Keras 3's LSTM layer as written (WHILE with its condition "
                             "and body models), not as one UNIDIRECTIONAL_SEQUENCE_LSTM")
    common.add_argument("--input-shape", action="append", metavar="NAME=D1,D2,...",
                        help="fix an input's open dimensions to this shape, as LiteRT's resize_tensor_input (a raw-"
                             "audio model's length, a batch); every shape after it is derived (repeatable)")
    return common


def add_signature(parser: argparse.ArgumentParser) -> None:
    """``--signature KEY``, for the commands that load a .tflite model (the others would
    take it and ignore it)."""
    parser.add_argument("--signature", metavar="KEY",
                        help="in a .tflite file with several signatures, import the subgraph of this one (LiteRT's "
                             "get_signature_runner(KEY)); default: subgraph 0, as LiteRT's Interpreter runs")


def load_drivers(specs: list[str]) -> None:
    """Register the devices of the ``--driver`` plug-ins; one that fails is a usage error
    naming it and the cause (the user asked for it explicitly)."""
    if not specs:
        return
    from nnapi.runtime.manager import DriverLoadError, load_driver_spec

    for spec in specs:
        try:
            load_driver_spec(spec)
        except DriverLoadError as error:
            raise CliError(f"--driver {error}") from None
        except Exception as error:  # a plug-in's own failure: name it, never a traceback
            raise CliError(f"--driver {spec}: {type(error).__name__}: {error}") from None


def find_device(name: str | None) -> nnapi.Device | None:
    """The device called ``name`` (None: let the runtime choose)."""
    if name is None:
        return None
    devices = nnapi.get_devices()
    for device in devices:
        if device.name == name:
            return device
    raise CliError(no_device_message(name, [d.name for d in devices]))


def print_json(value: Any) -> None:
    json.dump(value, sys.stdout, indent=2, default=str)
    sys.stdout.write("\n")


@dataclass
class LoadedModel:
    """A model read from a file for a command: the Model, its operand names and the
    source operation of each NNAPI operation when the file format has them, and the
    objects the model references (kept alive with it)."""

    model: nnapi.Model
    path: str
    operand_names: dict[int, str] | None = None
    source_ops: list[str] | None = None
    keep: Any = None


def check_model_file(path: str) -> Path:
    """``path`` as a Path when it names a readable regular file; a one-line CliError otherwise."""
    file = Path(path)
    if not file.exists():
        raise CliError(f"{path}: no such file")
    if not file.is_file():
        raise CliError(f"{path}: not a file")
    return file


def input_shapes(specs: list[str] | None) -> dict[str, list[int]] | None:
    """``--input-shape NAME=D1,D2,...`` options as load_model's ``input_shapes``."""
    if not specs:
        return None
    shapes = {}
    for spec in specs:
        name, sep, dims = spec.rpartition("=")
        try:
            shape = [int(d) for d in dims.split(",")]
        except ValueError:
            shape = []
        if not sep or not name or not shape or min(shape) < 1:
            raise CliError(f"--input-shape {spec}: expected NAME=D1,D2,... (positive sizes)")
        shapes[name] = shape
    return shapes


def import_model(path: str, keep_loops: bool = False, shapes: list[str] | None = None,
                 signature: str | None = None) -> nnapi.ImportedModel:
    """``nnapi.load_model(path, keep_loops=..., input_shapes=..., signature=...)``
    (``shapes``: the ``--input-shape`` options, ``signature``: ``--signature``) with its
    failures (missing file, LiteRT's schema not installed, a file that is not a model, no
    such signature) as one-line CliErrors naming the file."""
    check_model_file(path)
    try:
        return nnapi.load_model(path, keep_loops=keep_loops, input_shapes=input_shapes(shapes), signature=signature)
    except ImportError as error:
        raise CliError(f"{path}: {error} (pip install 'nnapi[tflite]')") from None
    except nnapi.BadDataError as error:
        message = str(error)
        raise CliError(message if message.startswith(path) else f"{path}: {message}") from None


def load_model(path: str, keep_loops: bool = False, shapes: list[str] | None = None,
               signature: str | None = None) -> LoadedModel:
    """A ``.tflite`` model (imported; its Keras LSTM loops as written with ``keep_loops``,
    the subgraph of ``signature`` where given), or a CTS vector file (``.jsonl`` /
    ``.jsonl.gz``, its first record: how ``nnapi fuzz`` writes failing graphs)."""
    file = check_model_file(path)
    if file.name.endswith((".jsonl", ".jsonl.gz")):
        if signature is not None:
            raise CliError(f"{path}: --signature applies to .tflite models, not CTS vector files")
        from nnapi.conformance import VectorFileError, build_model, load_records

        try:
            record = next(iter(load_records(file)))
        except StopIteration:
            raise CliError(f"{path}: no vector in the file") from None
        except VectorFileError as error:  # names the file, the line and the rule
            raise CliError(str(error)) from None
        except (OSError, ValueError) as error:
            raise CliError(f"{path}: not a CTS vector file ({error})") from None
        keep: list = []
        model = build_model(record, keep=keep)
        names = {i: operand["name"] for i, operand in enumerate(record["main"]["operands"]) if operand.get("name")}
        return LoadedModel(model, path, names, None, keep)
    imported = import_model(path, keep_loops, shapes, signature)
    model = imported.model
    names = {model.inputs[k]: spec.name for k, spec in enumerate(imported.inputs)}
    names.update({model.outputs[k]: spec.name for k, spec in enumerate(imported.outputs)})
    return LoadedModel(model, path, names, [str(source) for source in imported.sources], imported)


def progress(iterable: Iterable, total: int, description: str) -> Iterable:
    """``iterable`` with a progress bar (rate and ETA, from tqdm) when stderr is a
    terminal and tqdm is installed; plain otherwise."""
    if not sys.stderr.isatty():
        return iterable
    try:
        from tqdm import tqdm
    except ImportError:
        return iterable
    return tqdm(iterable, total=total, desc=description, unit="it", leave=False, file=sys.stderr)


def devices_named(names: list[str] | None) -> list[nnapi.Device] | None:
    """The devices called ``names`` in that order (None: let the runtime choose)."""
    if not names:
        return None
    return [find_device(name) for name in names]
