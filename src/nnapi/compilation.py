"""Compilation: the NDK's ANeuralNetworksCompilation_* functions.

``finish`` turns the model into a HAL model, partitions it into steps across the
candidate devices (each operation on the best device that supports it) and asks each
step's device to prepare its part.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Sequence

import numpy as np

from nnapi import tracing, vlog
from nnapi._object import NnapiObject
from nnapi._version import __version__
from nnapi.codes import BYTE_SIZE_OF_CACHE_TOKEN, PreferenceCode, PriorityCode
from nnapi.device import Device, get_devices, wrap
from nnapi.errors import BadDataError, BadStateError, NnapiError, UnexpectedNullError, error_for
from nnapi.hal import ErrorStatus, ExecutionPreference, HalError, IDevice, IPreparedModel, Priority
from nnapi.hal import Model as HalModel
from nnapi.hal.serialize import model_digest
from nnapi.model import Model
from nnapi.runtime import manager
from nnapi.runtime.execution_plan import ExecutionPlan, Step, contain, partition, uses_extension_operation

#: Alignment and padding, in bytes, that let kernels read whole cache lines.
PREFERRED_ALIGNMENT = 64
PREFERRED_PADDING = 64

_PRIORITY_TO_HAL = {
    PriorityCode.PRIORITY_LOW: Priority.LOW,
    PriorityCode.PRIORITY_MEDIUM: Priority.MEDIUM,
    PriorityCode.PRIORITY_HIGH: Priority.HIGH,
}


class Compilation(NnapiObject):
    """ANeuralNetworksCompilation."""

    #: what its Executions check arguments against and run through (execution._Table),
    #: built at the first Execution
    _execution_table = None

    def __init__(self, model: Model, devices: Sequence[Device] | None = None) -> None:
        """ANeuralNetworksCompilation_create, or _createForDevices when ``devices`` is given."""
        self._freed = False
        if model is None:
            raise UnexpectedNullError("Compilation: model is None")
        if not isinstance(model, Model):
            raise BadDataError(f"Compilation: expected a Model, got {type(model).__name__}")
        model._check_alive("Compilation")
        if not model.is_finished:
            raise BadStateError("Compilation: the model is not finished")
        self._explicit_devices = devices is not None
        if devices is not None:
            if not isinstance(devices, list | tuple):
                raise BadDataError(f"Compilation: devices must be a list of Device, got {type(devices).__name__}")
            devices = list(devices)
            if not devices:
                raise BadDataError("Compilation: devices must not be empty")
            if not all(isinstance(d, Device) for d in devices):
                raise BadDataError("Compilation: devices must be Device objects")
            if len(set(devices)) != len(devices):
                raise BadDataError("Compilation: devices must not repeat")
        self._model = model
        self._devices: list[Device] = devices if devices is not None else get_devices()
        self._preference = PreferenceCode.PREFER_FAST_SINGLE_ANSWER
        self._priority = PriorityCode.PRIORITY_DEFAULT
        self._timeout_ns = 0
        self._cache: tuple[str, bytes] | None = None
        #: How many steps finish() prepared from the compilation cache.
        self.prepared_from_cache = 0
        self._finished = False
        self._plan: ExecutionPlan | None = None
        self._device: IDevice | None = None

    def _check_modifiable(self, call: str) -> None:
        self._check_alive(call)
        if self._finished:
            raise BadStateError(f"{call}: the compilation is finished")

    @property
    def model(self) -> Model:
        return self._model

    @property
    def is_finished(self) -> bool:
        return self._finished

    @property
    def device(self) -> Device | None:
        """The device chosen to run the model (after finish)."""
        return wrap(self._device) if self._device is not None else None

    @property
    def single_explicit_device(self) -> bool:
        """Created for exactly one device: timing and timeouts are then allowed."""
        return self._explicit_devices and len(self._devices) == 1

    # --- settings --------------------------------------------------------------------
    def set_preference(self, preference: int) -> None:
        """ANeuralNetworksCompilation_setPreference."""
        self._check_modifiable("set_preference")
        try:
            self._preference = PreferenceCode(preference)
        except (ValueError, TypeError):
            raise BadDataError(f"set_preference: invalid preference {preference!r}") from None

    def set_priority(self, priority: int) -> None:
        """ANeuralNetworksCompilation_setPriority."""
        self._check_modifiable("set_priority")
        if not isinstance(priority, int) or priority not in _PRIORITY_TO_HAL:
            raise BadDataError(f"set_priority: invalid priority {priority!r}")
        self._priority = PriorityCode(priority)

    def set_timeout(self, duration_ns: int) -> None:
        """ANeuralNetworksCompilation_setTimeout: 0 means no timeout. Only for a
        compilation created for exactly one device."""
        self._check_modifiable("set_timeout")
        if not self.single_explicit_device:
            raise BadDataError("set_timeout: only for a compilation created for exactly one device")
        if not isinstance(duration_ns, int) or duration_ns < 0:
            raise BadDataError(f"set_timeout: duration must be a non-negative int, got {duration_ns!r}")
        self._timeout_ns = duration_ns

    def set_caching(self, cache_dir: str | os.PathLike, token: bytes) -> None:
        """ANeuralNetworksCompilation_setCaching: a cache directory and a 32-byte token."""
        self._check_modifiable("set_caching")
        if cache_dir is None or token is None:
            raise UnexpectedNullError("set_caching: cache_dir and token are required")
        if not isinstance(cache_dir, str | os.PathLike):
            raise BadDataError("set_caching: cache_dir must be a path")
        try:
            directory = os.fsdecode(os.fspath(cache_dir))  # a bytes path as the file system reads it
        except TypeError:
            raise BadDataError("set_caching: cache_dir's path must be text or bytes") from None
        if "\0" in directory:
            raise BadDataError("set_caching: cache_dir contains a NUL character (no path holds one)")
        # bytes(int) would allocate that many zero bytes: only a bytes-like token is a token.
        if not isinstance(token, bytes | bytearray | memoryview | np.ndarray):
            raise BadDataError(f"set_caching: token must be {BYTE_SIZE_OF_CACHE_TOKEN} bytes, got "
                               f"{type(token).__name__}")
        try:
            token = bytes(memoryview(token).cast("B"))
        except (TypeError, ValueError):
            raise BadDataError("set_caching: token must be a flat bytes-like object") from None
        if len(token) != BYTE_SIZE_OF_CACHE_TOKEN:
            raise BadDataError(f"set_caching: token must be {BYTE_SIZE_OF_CACHE_TOKEN} bytes, got {len(token)}")
        self._cache = (directory, token)

    # --- finish ----------------------------------------------------------------------
    @tracing.traced("finish", "compilation")
    def finish(self) -> None:
        """ANeuralNetworksCompilation_finish: partition the model into a plan and have
        each step's device prepare its part.

        Without explicit devices, a step whose device fails to prepare moves to
        nnapi-reference, and if that cannot be done the whole model runs there (the driver
        guide's CPU fallback). With explicit devices a failure is the result."""
        self._check_modifiable("finish")
        self._model._check_alive("finish")
        hal_model, _ = self._model._hal_model()
        deadline = time.monotonic_ns() + self._timeout_ns if self._timeout_ns else None
        preference = ExecutionPreference(int(self._preference))
        priority = _PRIORITY_TO_HAL[self._priority]
        candidates = [d._hal for d in self._devices]
        # No CPU fallback for explicit devices (the NDK's rule) nor for a model with an
        # extension operation, which only its extension's devices can run (as Android).
        fallback = None if self._explicit_devices or uses_extension_operation(hal_model) else \
            manager.reference_device()
        steps = partition(hal_model, candidates, preference)
        vlog.compilation.debug("partitioned %d operations into %d steps: %s", len(hal_model.main.operations),
                               len(steps), ", ".join(f"{s.device.name}{s.operations}" for s in steps))
        self._prepare_failures: list[tuple[str, str, list[int]]] = []  # device, error, its operations
        for step in steps:
            try:
                step.prepared = self._prepare(step.device, step.model, preference, priority, deadline)
            except HalError as error:
                if fallback is None or step.device is fallback:
                    raise error_for(error.status.to_result_code(),
                                    f"finish: {_named(step.device.name, error)}") from None
                self._prepare_failures.append((step.device.name, str(error), list(step.operations)))
                vlog.compilation.debug("%s failed to prepare operations %s (%s); falling back to %s",
                                       step.device.name, step.operations, error, fallback.name)
                try:  # partial fallback: this step on the CPU
                    step.prepared = self._prepare(fallback, step.model, preference, priority, deadline)
                    step.device = fallback
                except HalError:
                    steps = [Step(fallback, list(range(len(hal_model.main.operations))),
                                  list(hal_model.main.input_indexes), list(hal_model.main.output_indexes),
                                  hal_model)]
                    try:  # full fallback: the whole model on the CPU
                        steps[0].prepared = self._prepare(fallback, hal_model, preference, priority, deadline)
                    except HalError as cpu_error:
                        raise error_for(cpu_error.status.to_result_code(),
                                        f"finish: {_named(fallback.name, cpu_error)}") from None
                    break
        self._plan = ExecutionPlan(hal_model, steps, fallback, preference, priority)
        #: the model's input and output types, which every Execution checks its arguments against
        self._io_types = (tuple(self._model.operand_type(i) for i in self._model.inputs),
                          tuple(self._model.operand_type(i) for i in self._model.outputs))
        #: per input and output index whose type is fully specified (extensions aside): the
        #: dtype, the array shapes accepted (its dimensions, or flat) and the dimensions; the
        #: fast path of Execution.set_input / set_output
        self._io_arrays = tuple(_array_arguments(types) for types in self._io_types)
        self._steps = steps
        self._device = steps[0].device if len(steps) == 1 else None
        self._finished = True

    @tracing.traced("prepare", "driver")
    def _prepare(self, device: IDevice, model: HalModel | None, preference: ExecutionPreference,
                 priority: Priority, deadline: int | None) -> IPreparedModel:
        """One device prepares one step's model (from its compilation cache when
        set_caching was called and the cache is good); any failure comes back as HalError."""
        assert model is not None
        files = self._open_cache_files(device, model, preference) if self._cache is not None else None
        try:
            if files is not None:
                model_fds, data_fds, token, complete = files
                if complete:
                    try:
                        prepared = device.prepare_model_from_cache(model_fds, data_fds, token, deadline)
                        if isinstance(prepared, IPreparedModel):
                            self.prepared_from_cache += 1
                            return prepared
                    except Exception:  # noqa: BLE001, S110 - a bad cache is only a miss: compile afresh
                        pass
                prepared = self._call_prepare(device, model, preference, priority, deadline, model_fds, data_fds,
                                              token)
            else:
                prepared = self._call_prepare(device, model, preference, priority, deadline, (), (), None)
        finally:
            if files is not None:
                for fd in [*files[0], *files[1]]:
                    os.close(fd)
        return prepared

    @staticmethod
    def _call_prepare(device: IDevice, model: HalModel, preference, priority, deadline, model_fds, data_fds,
                      token) -> IPreparedModel:
        try:
            prepared = device.prepare_model(model, preference, priority, deadline, model_fds, data_fds, token)
        except Exception as error:  # noqa: BLE001 - a raw exception in a driver is contained
            raise contain(device.name, "prepare_model", error) from None
        if not isinstance(prepared, IPreparedModel):
            raise HalError(ErrorStatus.GENERAL_FAILURE,
                           f"{device.name}: prepare_model returned {type(prepared).__name__}")
        return prepared

    def _open_cache_files(self, device: IDevice, model: HalModel, preference: ExecutionPreference
                          ) -> tuple[list[int], list[int], bytes, bool] | None:
        """The device's cache files in the caching directory, opened read-write, named from
        the token and a digest of the model, device and nnapi version; None when the device
        caches nothing or the files cannot be opened (caching is then skipped, silently)."""
        try:
            counts = device.get_number_of_cache_files_needed()
            n_model, n_data = (int(counts[0]), int(counts[1]))
        except Exception:  # noqa: BLE001
            return None
        if not (0 <= n_model <= 32 and 0 <= n_data <= 32) or n_model + n_data == 0:
            return None
        assert self._cache is not None
        directory, user_token = self._cache
        key = hashlib.sha256()
        for part in (b"nnapi-compilation-cache-1", user_token, model_digest(model), str(device.name).encode(),
                     str(device.version_string).encode(), __version__.encode(), b"%d" % int(preference)):
            key.update(b"%d:" % len(part) + part)
        token = key.digest()[:BYTE_SIZE_OF_CACHE_TOKEN]
        opened: list[int] = []
        try:
            for kind, count in (("model", n_model), ("data", n_data)):
                for i in range(count):
                    path = os.path.join(directory, f"{token.hex()}.{kind}{i}")
                    opened.append(os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600))
            complete = all(os.fstat(fd).st_size > 0 for fd in opened)
        except OSError:
            for fd in opened:
                os.close(fd)
            return None
        return opened[:n_model], opened[n_model:], token, complete

    @property
    def step_devices(self) -> list[str]:
        """After finish: the device name of each step of the plan, in run order."""
        self._check_alive("step_devices")
        if not self._finished:
            raise BadStateError("step_devices: the compilation is not finished")
        return [step.device.name for step in self._steps]

    def placement(self) -> dict:
        """After finish: each operation's device, the devices that refused it and why, the
        number of partitions and the bytes crossing devices per execution (no NDK
        counterpart; see nnapi.tools.placement)."""
        from nnapi.tools.placement import placement

        return placement(self)

    # --- queries ---------------------------------------------------------------------
    def _check_finished_index(self, call: str, index: int, count: int) -> None:
        self._check_alive(call)
        if not self._finished:
            raise BadStateError(f"{call}: the compilation is not finished")
        if not isinstance(index, int) or not 0 <= index < count:
            raise BadDataError(f"{call}: index {index!r} out of range ({count})")

    def get_preferred_memory_alignment_for_input(self, index: int) -> int:
        """ANeuralNetworksCompilation_getPreferredMemoryAlignmentForInput."""
        self._check_finished_index("get_preferred_memory_alignment_for_input", index, len(self._model.inputs))
        return PREFERRED_ALIGNMENT

    def get_preferred_memory_alignment_for_output(self, index: int) -> int:
        """ANeuralNetworksCompilation_getPreferredMemoryAlignmentForOutput."""
        self._check_finished_index("get_preferred_memory_alignment_for_output", index, len(self._model.outputs))
        return PREFERRED_ALIGNMENT

    def get_preferred_memory_padding_for_input(self, index: int) -> int:
        """ANeuralNetworksCompilation_getPreferredMemoryPaddingForInput."""
        self._check_finished_index("get_preferred_memory_padding_for_input", index, len(self._model.inputs))
        return PREFERRED_PADDING

    def get_preferred_memory_padding_for_output(self, index: int) -> int:
        """ANeuralNetworksCompilation_getPreferredMemoryPaddingForOutput."""
        self._check_finished_index("get_preferred_memory_padding_for_output", index, len(self._model.outputs))
        return PREFERRED_PADDING

    def _release(self) -> None:
        self._plan = None
        self._execution_table = None  # and the arrays its bound request holds


def _named(device_name: str, error: HalError) -> str:
    """A driver's failure with its device's name in front, once (contain() and
    _call_prepare name it already)."""
    text = str(error)
    return text if text.startswith(f"{device_name}: ") else f"{device_name}: {text}"


def _array_arguments(types) -> dict[int, tuple[np.dtype, dict[tuple[int, ...], tuple[int, ...]], tuple[int, ...]]]:
    """For each fully specified, non-extension operand type: (dtype, the array shapes an
    argument may have -- its dimensions or flat -- each with the strides of a C-contiguous
    array of that shape as numpy makes one, its dimensions)."""
    arguments = {}
    for index, op_type in enumerate(types):
        if op_type.is_fully_specified and not op_type.is_extension:
            dims = tuple(op_type.dimensions)
            count = op_type.element_count() if op_type.is_tensor else 1
            dtype = op_type.dtype
            shapes = {shape: np.empty(shape, dtype).strides for shape in (dims, (count,))}
            arguments[index] = (dtype, shapes, dims)
    return arguments


def finished_compilation(compilation: object, call: str,
                         unfinished: type[NnapiError] = BadStateError) -> Compilation:
    """``compilation`` checked as ANeuralNetworksExecution_create and
    ANeuralNetworksBurst_create check theirs: UNEXPECTED_NULL for None, BAD_DATA for
    another type, BAD_STATE when it is freed or not finished (``unfinished``: the memory
    descriptor's roles answer BAD_DATA, as Android's runtime does)."""
    if compilation is None:
        raise UnexpectedNullError(f"{call}: compilation is None")
    if not isinstance(compilation, Compilation):
        raise BadDataError(f"{call}: expected a Compilation, got {type(compilation).__name__}")
    compilation._check_alive(call)
    if not compilation.is_finished:
        raise unfinished(f"{call}: the compilation is not finished")
    return compilation
