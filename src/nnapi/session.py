"""Session: run a model in one call, by tensor name, with numpy arrays.

``Session(model_or_path)`` imports the model (a .tflite path or bytes, an
ImportedModel, or a finished nnapi.Model), compiles it once for the chosen devices, and
``run({name: array})`` returns ``{name: array}``: it checks each input's dtype and shape
against the model (naming the input, the expected and the given), allocates the outputs,
asks the runtime for outputs whose shape is only known at execution time, and carries
state (TFLite variable tensors) from one run to the next.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from nnapi.codes import OperandCode, OperationCode
from nnapi.compilation import Compilation
from nnapi.device import Device, get_devices, no_device_message
from nnapi.errors import BadDataError, NnapiError, OutputInsufficientSizeError
from nnapi.execution import Execution
from nnapi.importers import ImportedModel, StateSpec, TensorSpec, load_model
from nnapi.model import Model
from nnapi.operand import OperandType

#: Bytes first offered to an output whose shape is unknown until execution; the runtime
#: reports the real shape when that is not enough and the run is repeated once.
_UNKNOWN_OUTPUT_GUESS = 1 << 16


@dataclass(frozen=True)
class TensorInfo:
    """A Session input or output: its name, numpy dtype and shape (-1: known at run time)."""

    name: str
    dtype: np.dtype
    shape: tuple[int, ...]
    type: OperandCode
    scale: float = 0.0
    zero_point: int = 0

    def describe(self) -> str:
        dims = "[" + ",".join("?" if d < 0 else str(d) for d in self.shape) + "]"
        text = f"{self.name}: {self.dtype.name}{dims}"
        if self.scale > 0 and self.type != OperandCode.TENSOR_INT32:
            text += f" ({self.type.name} scale={self.scale:g} zero_point={self.zero_point})"
        return text


def _generic_specs(model: Model, indexes: Sequence[int], prefix: str) -> list[TensorSpec]:
    specs = []
    for position, index in enumerate(indexes):
        op_type = model.operand_type(index)
        shape = tuple(d if d > 0 else -1 for d in op_type.dimensions)
        specs.append(TensorSpec(f"{prefix}{position}", op_type.type, shape, op_type.scale, op_type.zero_point,
                                op_type.dimensions))
    return specs


def _resolve_devices(devices: Any) -> list[Device] | None:
    if devices is None:
        return None
    if isinstance(devices, str | Device):
        devices = [devices]
    resolved = []
    available = get_devices()
    for device in devices:
        if isinstance(device, Device):
            resolved.append(device)
            continue
        if not isinstance(device, str):
            raise BadDataError(f"Session: devices must be Device objects or device names, got {device!r}")
        match = [d for d in available if d.name == device]
        if not match:
            raise BadDataError(f"Session: {no_device_message(device, [d.name for d in available])}")
        resolved.append(match[0])
    return resolved


class Session:
    """A compiled model run by tensor name: the one-call way to use nnapi.

    ``model_or_path``: a path to a model file (TensorFlow Lite), its bytes, an
    ImportedModel, or a finished nnapi.Model (inputs and outputs are then named
    ``input0``, ``output0``, ...). ``devices``: None for the runtime's choice, or Device
    objects / device names, as Compilation takes them. ``preference`` is an
    ANeuralNetworksCompilation_setPreference value.
    """

    def __init__(self, model_or_path: str | os.PathLike | bytes | ImportedModel | Model,
                 devices: Sequence[Device | str] | Device | str | None = None, *,
                 preference: int | None = None) -> None:
        if isinstance(model_or_path, ImportedModel):
            imported = model_or_path
        elif isinstance(model_or_path, Model):
            if not model_or_path.is_finished:
                raise BadDataError("Session: the model must be finished")
            imported = ImportedModel(model_or_path, _generic_specs(model_or_path, model_or_path.inputs, "input"),
                                     _generic_specs(model_or_path, model_or_path.outputs, "output"), [], [],
                                     format="nnapi")
        elif isinstance(model_or_path, str | os.PathLike | bytes | bytearray | memoryview):
            imported = load_model(model_or_path)
        else:
            raise BadDataError(f"Session: expected a model path, bytes, ImportedModel or Model, got "
                               f"{type(model_or_path).__name__}")
        self.imported = imported
        self.model = imported.model
        start = time.perf_counter()
        self.compilation = Compilation(self.model, _resolve_devices(devices))
        if preference is not None:
            self.compilation.set_preference(preference)
        self.compilation.finish()
        self.compile_seconds = time.perf_counter() - start
        self._input_types = [self.model.operand_type(i) for i in self.model.inputs]
        self._output_types = [self.model.operand_type(i) for i in self.model.outputs]
        self.inputs = [self._info(spec) for spec in imported.inputs]
        self.outputs = [self._info(spec) for spec in imported.outputs]
        self._input_positions = {spec.name: i for i, spec in enumerate(imported.inputs)}
        #: per input shapes, the shapes of the outputs of open shape a run gave: the next run
        #: with those input shapes allocates them exactly (the runtime's fast path for arrays,
        #: and a driver that learned them writes in place), not a guessed buffer to slice;
        #: dropped for good once a run at known input shapes gives other shapes (shapes that
        #: follow from input values)
        self._open_outputs = [i for i, t in enumerate(self._output_types) if not t.is_fully_specified]
        self._output_dims: dict[tuple, list[list[int]]] | None = {} if self._open_outputs else None
        self._states: dict[int, np.ndarray] = {}
        self.reset_states()

    @staticmethod
    def _info(spec: TensorSpec) -> TensorInfo:
        return TensorInfo(spec.name, spec.user_dtype, tuple(spec.shape), spec.type, spec.scale, spec.zero_point)

    @property
    def states(self) -> list[StateSpec]:
        return self.imported.states

    def reset_states(self) -> None:
        """Set every state tensor back to its initial value (zeros for TFLite variables)."""
        self._states = {spec.input_index: np.array(spec.initial, copy=True) for spec in self.imported.states}

    @property
    def device_names(self) -> list[str]:
        """The device that runs each step of the compiled plan."""
        return list(self.compilation.step_devices)

    def _check_input(self, info: TensorInfo, value: Any) -> np.ndarray:
        if not isinstance(value, np.ndarray):
            if isinstance(value, np.generic | int | float | bool | list | tuple):
                value = np.asarray(value, dtype=info.dtype)
            else:
                raise BadDataError(f"input {info.name!r}: expected a numpy array, got {type(value).__name__}")
        if value.dtype != info.dtype:
            raise BadDataError(f"input {info.name!r}: expected dtype {info.dtype.name}, got {value.dtype.name}")
        shape = tuple(value.shape)
        expected = info.shape
        if len(shape) != len(expected) or any(e >= 0 and s != e for s, e in zip(shape, expected)):
            dims = "[" + ", ".join("?" if d < 0 else str(d) for d in expected) + "]"
            raise BadDataError(f"input {info.name!r}: expected shape {dims}, got {list(shape)}")
        return np.ascontiguousarray(value)

    def run(self, inputs: Mapping[str, Any] | None = None) -> dict[str, np.ndarray]:
        """Run the model once: ``{input name: array}`` -> ``{output name: array}``.

        Every input must be given, with the model's dtype and shape (a dimension the model
        leaves open may take any size). Raises BadDataError naming the input otherwise.
        """
        inputs = {} if inputs is None else inputs
        if not isinstance(inputs, Mapping):
            raise BadDataError(f"run: inputs must be a mapping of input name to array, got {type(inputs).__name__}")
        unknown = [name for name in inputs if name not in self._input_positions]
        if unknown:
            names = ", ".join(repr(info.name) for info in self.inputs)
            raise BadDataError(f"run: no input named {unknown[0]!r} (inputs: {names})")
        missing = [info.name for info in self.inputs if info.name not in inputs]
        if missing:
            raise BadDataError(f"run: input {missing[0]!r} is missing")
        arrays: list[np.ndarray] = []
        for info, op_type in zip(self.inputs, self._input_types[:len(self.inputs)]):
            array = self._check_input(info, inputs[info.name])
            dims = self._operand_dims(op_type, array)
            arrays.append(array if array.shape == dims else array.reshape(dims))  # (the caller's array itself)
        for spec in self.imported.states:
            arrays.append(self._states[spec.input_index])
        results = self._execute(arrays)
        outputs = {}
        for info, spec, result in zip(self.outputs, self.imported.outputs, results):
            if len(spec.shape) == 0 and result.size == 1:
                result = result.reshape(())
            if result.dtype != info.dtype:   # an int64 index output held as int32
                result = result.astype(info.dtype)
            outputs[info.name] = result
        for spec in self.imported.states:
            if spec.output_index is not None:
                self._states[spec.input_index] = results[spec.output_index]
        return outputs

    def _needed_dimensions(self, execution: Execution, index: int) -> list[int] | None:
        """The shape output ``index`` needs after OUTPUT_INSUFFICIENT_SIZE (the NDK reports
        it through the error for the outputs that were too small)."""
        if not self._output_types[index].is_tensor:
            return None
        try:
            return execution.get_output_operand_dimensions(index)
        except OutputInsufficientSizeError as error:
            return list(error.dimensions)

    def _naming_source(self, error: NnapiError) -> NnapiError:
        """``error`` with the source model's operator(s) behind the failing NNAPI
        operation appended, when the message names the operation type."""
        text = str(error)
        name = text.split(":", 1)[0].strip()
        if name not in OperationCode.__members__ or not self.imported.sources:
            return error
        sources = []
        for operation, source in zip(self.model._operations, self.imported.sources):
            if operation.code.name == name and str(source) not in sources:
                sources.append(str(source))
        if not sources:
            return error
        if len(sources) == 1:
            where = f"from {self.imported.format} {sources[0]}"
        else:
            shown = ", ".join(sources[:5]) + (", ..." if len(sources) > 5 else "")
            where = f"from one of {self.imported.format} {shown}"
        return type(error)(f"{text} [{where}]", error.code)

    @staticmethod
    def _operand_dims(op_type: OperandType, array: np.ndarray) -> tuple[int, ...]:
        # A rank-0 source tensor is a [1] NNAPI operand.
        if array.ndim == 0 and op_type.rank == 1:
            return (1,)
        return array.shape

    def _output_buffer(self, op_type: OperandType, dims: Sequence[int] | None) -> np.ndarray:
        if dims is None and op_type.is_fully_specified:
            dims = op_type.dimensions
        if dims is None:
            return np.empty(max(_UNKNOWN_OUTPUT_GUESS // op_type.dtype.itemsize, 1), op_type.dtype)
        return np.empty(tuple(dims), op_type.dtype)

    def _execute(self, arrays: list[np.ndarray]) -> list[np.ndarray]:
        known: list[Sequence[int] | None] = [None] * len(self._output_types)
        learned = self._output_dims
        key = previous = None
        if learned is not None:
            key = tuple([array.shape for array in arrays])
            previous = learned.get(key)
            if previous is not None:
                for position, dims in zip(self._open_outputs, previous, strict=True):
                    known[position] = dims
        typed = False  # (the second attempt: the outputs' types given with the shapes needed)
        for _attempt in range(2):
            execution = Execution(self.compilation)
            for position, array in enumerate(arrays):
                execution.set_input(position, array)
            buffers = [self._output_buffer(t, known[i]) for i, t in enumerate(self._output_types)]
            for position, buffer in enumerate(buffers):
                # a fully specified output's buffer has the model's dimensions: no type to
                # pass (the Execution's quick path for plain arrays), nor to read back
                if known[position] is None or not typed:
                    execution.set_output(position, buffer)
                else:
                    execution.set_output(position, buffer,
                                         self._output_types[position].with_dimensions(buffer.shape))
            try:
                execution.compute()
            except OutputInsufficientSizeError:
                known = [self._needed_dimensions(execution, i) for i in range(len(buffers))]
                typed = True
                if previous is not None:  # a shape moved at input shapes run before
                    self._output_dims = learned = None
                continue
            except NnapiError as error:
                raise self._naming_source(error) from None
            found = [execution.get_output_operand_dimensions(i) if self._output_types[i].is_tensor else []
                     for i in self._open_outputs]
            if learned is not None:
                if previous is None:
                    if len(learned) >= 64:
                        learned.clear()
                    learned[key] = found
                elif found != previous:
                    self._output_dims = None
            results = buffers
            for position, dims in zip(self._open_outputs, found, strict=True):
                buffer = buffers[position]
                if buffer.shape != tuple(dims):
                    count = math.prod(dims)
                    buffers[position] = buffer.reshape(-1)[:count].reshape(dims)
            return results
        raise OutputInsufficientSizeError("run: output shapes changed between attempts")


def random_inputs(infos: Sequence[TensorInfo], seed: int = 0, dynamic_size: int = 1) -> dict[str, np.ndarray]:
    """Seeded inputs for ``infos`` (a Session's ``inputs``): floats uniform in [-1, 1),
    quantized tensors over their whole integer range, int32 in {0, 1}, random booleans.
    A dimension known only at run time takes ``dynamic_size``."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for info in infos:
        shape = tuple(dynamic_size if d < 0 else d for d in info.shape)
        if info.dtype.kind == "f":
            value = rng.uniform(-1.0, 1.0, shape).astype(info.dtype)
        elif info.dtype == np.bool_:
            value = rng.integers(0, 2, shape).astype(np.bool_)
        elif info.scale > 0 and info.type != OperandCode.TENSOR_INT32:
            limits = np.iinfo(info.dtype)
            value = rng.integers(limits.min, int(limits.max) + 1, shape, dtype=info.dtype)
        else:
            value = rng.integers(0, 2, shape).astype(info.dtype)
        feeds[info.name] = value
    return feeds


__all__ = ["Session", "TensorInfo", "random_inputs"]
