"""Model importers: turn a model file from another framework into a finished nnapi.Model.

``load_model(path)`` picks the importer by the file's contents (TensorFlow Lite today);
every importer returns an ``ImportedModel``, which the Session, the command line and the
tools use to name inputs, outputs and the source operator of each NNAPI operation.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from nnapi.codes import OperandCode
from nnapi.errors import BadDataError
from nnapi.model import Model


@dataclass(frozen=True)
class TensorSpec:
    """A model input or output: the source framework's tensor name and its NNAPI type.

    ``shape`` is the source model's shape with -1 for a dimension known only at run time;
    ``operand_shape`` is what the NNAPI operand declares (0 for unknown, [1] for a
    rank-0 tensor, which NNAPI cannot express).
    """

    name: str
    type: OperandCode
    shape: tuple[int, ...]
    scale: float = 0.0
    zero_point: int = 0
    operand_shape: tuple[int, ...] = ()
    #: the source tensor's numpy dtype where it differs from the operand's: "int64" for an
    #: index output held as TENSOR_INT32 (Session widens it)
    source_dtype: str | None = None

    @property
    def dtype(self) -> np.dtype:
        from nnapi.operand import dtype_of

        return dtype_of(self.type)

    @property
    def user_dtype(self) -> np.dtype:
        """The dtype a user gives or gets (Session): the source's where it was narrowed."""
        return np.dtype(self.source_dtype) if self.source_dtype else self.dtype

    @property
    def is_quantized(self) -> bool:
        return self.scale > 0 and self.type != OperandCode.TENSOR_INT32

    def describe(self) -> str:
        dims = "[" + ",".join("?" if d < 0 else str(d) for d in self.shape) + "]"
        text = f"{self.name}: {self.type.name}{dims}"
        if self.is_quantized:
            text += f" scale={self.scale:g} zero_point={self.zero_point}"
        if self.source_dtype:
            text += f" (the source's {self.source_dtype}, widened by Session)"
        return text


@dataclass(frozen=True)
class SourceOp:
    """The source model's operator that an NNAPI operation comes from."""

    subgraph: int
    index: int
    name: str

    def __str__(self) -> str:
        where = f"subgraph {self.subgraph} " if self.subgraph else ""
        return f"{where}operator {self.index} ({self.name})"


@dataclass(frozen=True)
class Lowering:
    """A source operator that has no one-to-one NNAPI operation, and what it became."""

    source: SourceOp
    operations: tuple[str, ...]
    reason: str

    def __str__(self) -> str:
        return f"{self.source} -> {' + '.join(self.operations) or 'constant'}: {self.reason}"


@dataclass(frozen=True)
class StateSpec:
    """A variable (state) tensor: a hidden model input fed with the current state, and
    the hidden model output (if any) that carries its new value after a run."""

    name: str
    input_index: int
    output_index: int | None
    initial: np.ndarray


@dataclass
class ImportedModel:
    """The result of an importer: a finished Model and what it came from.

    ``inputs`` / ``outputs`` list the user-visible model inputs and outputs in order (the
    first ``len(inputs)`` NNAPI model inputs and first ``len(outputs)`` outputs); state
    tensors follow them. ``sources[i]`` names the source operator of NNAPI operation i.
    """

    model: Model
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    lowerings: list[Lowering]
    sources: list[SourceOp]
    states: list[StateSpec] = field(default_factory=list)
    format: str = "tflite"
    path: str | None = None
    source_operator_count: int = 0
    #: Referenced models (IF / WHILE branches) with their own sources.
    submodels: list[ImportedModel] = field(default_factory=list)
    #: NNAPI operand index -> the source tensor's name (operands the importer added have none).
    operand_names: dict[int, str] = field(default_factory=dict)
    #: Operators whose int8 / uint8 weights were dequantized to float32 constants (TFLite's
    #: dynamic-range, "hybrid" quantization): LiteRT quantizes their float inputs to int8 at
    #: every run, nnapi computes them in float32, as Android's NNAPI delegate does.
    hybrid_operators: list[SourceOp] = field(default_factory=list)
    #: Why the dimensions the file's shape signatures leave open (a dynamic batch) were
    #: fixed to its static shapes, as LiteRT allocates them (see ``load_tflite``); None
    #: where they were kept open or there were none.
    fixed_shapes: str | None = None
    #: Each TFLite_Detection_PostProcess whose four outputs are model outputs: their names
    #: (boxes, classes, scores, number of detections). Its detections come out in
    #: descending score order, equal scores in an order LiteRT and NNAPI break differently.
    detections: list[tuple[str, str, str, str]] = field(default_factory=list)
    #: {input / output tensor name: its key in the imported subgraph's SignatureDef} (a
    #: TFLite file's signature runner names them by key); empty where the file has none.
    signature_names: dict[str, str] = field(default_factory=dict)
    #: Buffers the model's constants refer to: they must live as long as the model.
    _keep_alive: list[Any] = field(default_factory=list, repr=False)

    @property
    def source_ops(self) -> list[str]:
        """``sources`` as text, one per NNAPI operation (what the tools print)."""
        return [str(source) for source in self.sources]

    def all_hybrid_operators(self) -> list[SourceOp]:
        """``hybrid_operators`` of this model and of its referenced models (IF / WHILE
        branches), each once."""
        found = list(self.hybrid_operators)
        for submodel in self.submodels:
            found += [source for source in submodel.all_hybrid_operators() if source not in found]
        return found

    def operation_histogram(self) -> dict[str, int]:
        """NNAPI operation name -> count in the main model."""
        counts: dict[str, int] = {}
        for operation in self.model._operations:
            counts[operation.code.name] = counts.get(operation.code.name, 0) + 1
        return dict(sorted(counts.items(), key=lambda item: (-item[1], item[0])))


def _sniff(data: bytes) -> str | None:
    # A TFLite flatbuffer carries the file identifier "TFL3" at bytes 4..8.
    if len(data) >= 8 and data[4:8] == b"TFL3":
        return "tflite"
    return None


def load_model(source: str | os.PathLike | bytes, *, keep_loops: bool = False,
               static_shapes: bool | None = None,
               input_shapes: dict[str, Sequence[int]] | None = None,
               signature: str | None = None) -> ImportedModel:
    """Load a model file of any supported format (TensorFlow Lite today) as an ImportedModel.

    ``keep_loops``: import a WHILE loop that is Keras 3's LSTM layer as written (see
    ``load_tflite``), not as one UNIDIRECTIONAL_SEQUENCE_LSTM. ``static_shapes``: whether
    dimensions the file leaves open (a dynamic batch) become its static shape (see
    ``load_tflite``; None: only where the model cannot be expressed with them open).
    ``input_shapes``: {input name: shape} fixes those inputs' open dimensions, as LiteRT's
    ``resize_tensor_input`` (see ``load_tflite``). ``signature``: the signature key whose
    subgraph to import, in a file with several (see ``load_tflite``).

    Raises BadDataError with a one-line message for a missing file or an unknown format.
    """
    data, path = read_source(source)
    kind = _sniff(data)
    if kind == "tflite":
        from nnapi.importers.tflite import load_tflite

        return load_tflite(data if path is None else path, keep_loops=keep_loops, static_shapes=static_shapes,
                           input_shapes=input_shapes, signature=signature)
    where = path or "the given bytes"
    raise BadDataError(f"{where}: not a model nnapi can import (expected a TensorFlow Lite .tflite flatbuffer)")


def read_source(source: str | os.PathLike | bytes | bytearray | memoryview) -> tuple[bytes, str | None]:
    """The bytes of a model given as a path or as bytes, and its path (None for bytes)."""
    if isinstance(source, bytes | bytearray | memoryview):
        return bytes(source), None
    if not isinstance(source, str | os.PathLike):
        raise BadDataError(f"expected a path or bytes, got {type(source).__name__}")
    path = os.fspath(source)
    try:
        with open(path, "rb") as file:
            return file.read(), path
    except FileNotFoundError:
        raise BadDataError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise BadDataError(f"{path}: is a directory, not a model file") from None
    except OSError as error:
        raise BadDataError(f"{path}: cannot read ({error.strerror})") from None


__all__ = ["ImportedModel", "Lowering", "SourceOp", "StateSpec", "TensorSpec", "load_model", "read_source"]
