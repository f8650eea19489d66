"""TFLite import: ``load_tflite``, the entry, and the importer of a whole file (its subgraphs,
open or static shapes).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from nnapi.errors import BadDataError, NnapiError
from nnapi.importers import ImportedModel, read_source
from nnapi.importers.tflite.converter import _Converter
from nnapi.importers.tflite.reader import UnsupportedOperator, _Reader, _require_tflite


class _Importer:
    def __init__(self, data: bytes, keep_loops: bool = False, static_shapes: bool = False,
                 propagate: bool = False, input_shapes: dict[str, tuple[int, ...]] | None = None,
                 signature: str | None = None) -> None:
        self.reader = _Reader(data)
        #: the subgraph imported as the model: 0, or the one ``signature`` names
        self.top = _signature_subgraph(self.reader, signature)
        self.signature = signature
        self.keep_loops = keep_loops
        self.static_shapes = static_shapes
        self.propagate = propagate
        self.input_shapes = input_shapes
        self.subgraph_models: dict[int, ImportedModel] = {}
        self.in_progress: set[int] = set()

    def subgraph(self, index: int) -> ImportedModel:
        """The finished Model of a referenced subgraph (IF / WHILE), converted once."""
        if not 0 <= index < self.reader.subgraph_count or index == self.top:
            raise UnsupportedOperator(f"references subgraph {index}, which does not exist" if index != self.top else
                                      f"references subgraph {index}, the model's own")
        if index in self.subgraph_models:
            return self.subgraph_models[index]
        if index in self.in_progress:
            raise UnsupportedOperator(f"subgraph {index} references itself")
        self.in_progress.add(index)
        converted = _Converter(self, index, top_level=False).convert()
        self.in_progress.discard(index)
        self.subgraph_models[index] = converted
        return converted


def load_tflite(source: str | os.PathLike | bytes, *, keep_loops: bool = False,
                static_shapes: bool | None = None,
                input_shapes: dict[str, Sequence[int]] | None = None,
                signature: str | None = None) -> ImportedModel:
    """Import a TensorFlow Lite model (a path or the flatbuffer's bytes) as an ImportedModel.

    A WHILE loop that is Keras 3's LSTM layer becomes one UNIDIRECTIONAL_SEQUENCE_LSTM
    (while_lstm.py) unless ``keep_loops`` is true, which imports it as written.

    ``static_shapes``: a tensor's dimension that the file's shape signature leaves open
    (-1, a dynamic batch) stays an unknown NNAPI dimension, set per execution, when
    ``static_shapes`` is False; is the file's static shape (what LiteRT allocates without
    ``resize_tensor_input``, 1 for a dynamic batch) when True. None (the default): open
    dimensions stay open unless the model cannot be expressed so (an operator needing a
    static shape, such as SHAPE, which NNAPI lacks), then static as with True; the
    ImportedModel's ``fixed_shapes`` then says why.

    ``input_shapes``: {input name: shape} fixes those inputs' open dimensions (the file's
    static ones must match), as LiteRT's ``resize_tensor_input`` before it allocates: every
    shape after the inputs is then derived from them (a raw-audio model whose file declares
    one sample, a batch of 8). ``static_shapes`` does not apply then.

    ``signature``: the signature (its key, e.g. 'decode') whose subgraph to import, in a
    file with several (a SavedModel converted with several signature_keys); None imports
    subgraph 0, as LiteRT's Interpreter runs by default. Inputs and outputs keep their
    tensors' names (``ImportedModel.signature_names`` maps them to the signature's keys).

    Raises BadDataError naming the TFLite operator (index and name) and the reason when
    the model uses something NNAPI cannot express (a custom operator, an unsupported type).
    """
    _require_tflite()
    data, path = read_source(source)
    if len(data) < 8 or data[4:8] != b"TFL3":
        raise BadDataError(f"{path or 'the given bytes'}: not a TensorFlow Lite model (no TFL3 identifier)")
    try:
        if input_shapes:
            given = _input_shapes(input_shapes)
            importer = _Importer(data, keep_loops, static_shapes=True, propagate=True, input_shapes=given,
                                 signature=signature)
            converter = _Converter(importer, importer.top, top_level=True)
            names = [converter.graph.tensors[t].name for t in converter.graph.inputs]
            if set(given) - set(names):
                raise BadDataError(f"input_shapes names {sorted(set(given) - set(names))}, which the model's "
                                   f"inputs ({', '.join(names)}) are not")
            imported = converter.convert()
            fixed_reason = "input shapes given (" + ", ".join(f"{name} {list(shape)}" for name, shape in
                                                               given.items()) + "); the shapes after them derived"
        elif static_shapes:
            imported, importer, derived = _import_static(data, keep_loops, signature)
            fixed_reason = f"static shapes asked for{derived}" if _has_open_dimensions(importer.reader) else None
        else:
            importer = None
            try:
                importer = _Importer(data, keep_loops, signature=signature)
                imported = _Converter(importer, importer.top, top_level=True).convert()
                fixed_reason = None
            except (UnsupportedOperator, BadDataError) as error:
                # importer is None where the file itself could not be read (a truncated or
                # corrupt flatbuffer): that error is the answer, there are no shapes to retry at
                if static_shapes is not None or importer is None or not _has_open_dimensions(importer.reader):
                    raise
                # LiteRT itself runs such a model at its static shape until it is resized
                try:
                    imported, importer, derived = _import_static(data, keep_loops, signature)
                except (UnsupportedOperator, BadDataError) as static_error:
                    raise BadDataError(f"{_message(error)}; nor at the file's static shapes (which it declares for "
                                       f"its open dimensions): {_message(static_error)}") from None
                fixed_reason = f"with its open dimensions the model cannot be expressed ({error}){derived}"
        # inside the try: a corrupt SignatureDef fails as a bad file, not a raw struct.error
        signature_names = _signature_names(importer.reader, signature)
    except NnapiError:
        raise
    except UnsupportedOperator as error:
        raise BadDataError(f"tflite: {error}") from None
    except Exception as error:  # a malformed flatbuffer surfaces as index / struct errors
        raise BadDataError(f"{path or 'the given bytes'}: not a valid TensorFlow Lite model "
                           f"({type(error).__name__}: {error})") from None
    imported.path = path
    imported.fixed_shapes = fixed_reason
    imported.submodels = [importer.subgraph_models[i] for i in sorted(importer.subgraph_models)]
    imported.signature_names = signature_names
    imported._keep_alive.append(data)
    for sub in imported.submodels:
        imported._keep_alive.extend(sub._keep_alive)
    return imported


def _import_static(data: bytes, keep_loops: bool, signature: str | None = None
                   ) -> tuple[ImportedModel, _Importer, str]:
    """The model at the file's static shapes, with the importer and what else was done
    (empty, or why the shapes were derived). Where an operation computes another shape
    than the file declares (placeholders the converter wrote for open dimensions, as
    BirdNET's analyzer has: [1, 1] for a slice of [1, 144000]), at the inputs' static shapes
    with every open dimension after them derived from the operation writing it, as LiteRT
    does when it allocates tensors."""
    importer = _Importer(data, keep_loops, static_shapes=True, signature=signature)
    try:
        return _Converter(importer, importer.top, top_level=True).convert(), importer, ""
    except (UnsupportedOperator, BadDataError) as error:
        if not _has_open_dimensions(importer.reader):
            raise
        derived = _Importer(data, keep_loops, static_shapes=True, propagate=True, signature=signature)
        try:
            imported = _Converter(derived, derived.top, top_level=True).convert()
        except (UnsupportedOperator, BadDataError) as derived_error:
            if _message(derived_error) == _message(error):
                raise error from None
            raise BadDataError(f"{_message(error)}; nor with its other shapes derived from its inputs' static "
                               f"shapes: {_message(derived_error)}") from None
        return imported, derived, (f"; the shapes after its inputs derived from them (the file's static shapes "
                                   f"disagree with its operations: {_message(error)})")


def _signatures(reader: _Reader) -> list[Any]:
    """The file's SignatureDefs (none in files without them)."""
    model = reader.model
    count = model.SignatureDefsLength() if hasattr(model, "SignatureDefsLength") else 0
    return [model.SignatureDefs(i) for i in range(count)]


def _signature_subgraph(reader: _Reader, signature: str | None) -> int:
    """The subgraph ``signature`` names (0 without one); BadDataError naming the file's
    signatures when it has no such one."""
    if signature is None:
        return 0
    defs = _signatures(reader)
    keys = [d.SignatureKey().decode() if d.SignatureKey() is not None else "" for d in defs]
    if signature not in keys:
        raise BadDataError(f"tflite: no signature {signature!r} (the file's: "
                           f"{', '.join(repr(k) for k in keys) if keys else 'none'})")
    index = int(defs[keys.index(signature)].SubgraphIndex())
    if not 0 <= index < reader.subgraph_count:
        raise BadDataError(f"tflite: signature {signature!r} names subgraph {index}, which does not exist")
    return index


def _signature_names(reader: _Reader, signature: str | None) -> dict[str, str]:
    """{tensor name: signature key} of the imported subgraph's signature inputs and
    outputs (the first signature of subgraph 0 when none was asked for); empty without."""
    top = _signature_subgraph(reader, signature)
    for definition in _signatures(reader):
        key = definition.SignatureKey().decode() if definition.SignatureKey() is not None else ""
        if int(definition.SubgraphIndex()) != top or (signature is not None and key != signature):
            continue
        subgraph = reader.model.Subgraphs(top)
        names = {}
        for count, get in ((definition.InputsLength(), definition.Inputs),
                           (definition.OutputsLength(), definition.Outputs)):
            for i in range(count):
                entry = get(i)
                tensor = subgraph.Tensors(int(entry.TensorIndex()))
                names[tensor.Name().decode()] = entry.Name().decode()
        return names
    return {}


def _input_shapes(given: Any) -> dict[str, tuple[int, ...]]:
    """load_tflite's ``input_shapes`` checked: names to tuples of positive ints."""
    if not isinstance(given, dict):
        raise BadDataError(f"input_shapes must be a dict of input name to shape, got {type(given).__name__}")
    shapes = {}
    for name, shape in given.items():
        try:
            dims = tuple(int(d) for d in shape)
            bad = any(isinstance(d, bool) or int(d) != d for d in shape) or any(d < 1 for d in dims)
        except (TypeError, ValueError):
            bad = True
        if not isinstance(name, str) or bad:
            raise BadDataError(f"input_shapes: {name!r}: {shape!r} is not a shape of positive ints")
        shapes[name] = dims
    return shapes


def _message(error: Exception) -> str:
    """An import failure's text as load_tflite reports it."""
    return str(error) if isinstance(error, BadDataError) else f"tflite: {error}"


def _has_open_dimensions(reader: _Reader) -> bool:
    """Whether any tensor's shape signature leaves a dimension open (-1)."""
    for index in range(reader.subgraph_count):
        subgraph = reader.model.Subgraphs(index)
        for t in range(subgraph.TensorsLength()):
            raw = subgraph.Tensors(t)
            if raw.ShapeSignatureLength() and (raw.ShapeSignatureAsNumpy() < 0).any():
                return True
    return False
