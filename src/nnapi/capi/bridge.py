"""The Python side of libneuralnetworks.so: one function per ANeuralNetworks* entry point.

The C layer only marshals. Each function here turns C arguments into Python objects
(handles into Model, Compilation, ...; caller buffers into memoryviews over the caller's
memory, without copying), calls the public API and turns the outcome into a result code.
An NnapiError becomes its code; anything else becomes OP_FAILED: nothing escapes to C.

Handles are not pointers to Python objects: each is a serial number (with a tag naming
its type) into a table, so a freed, foreign or mistyped handle is recognized and reported
(BAD_STATE after free, BAD_DATA for anything else) instead of crashing the process.
"""

from __future__ import annotations

import functools
import itertools
import logging
import os
import threading
from typing import Any

import nnapi
from nnapi.codes import ResultCode
from nnapi.errors import BadDataError, BadStateError, NnapiError, UnexpectedNullError
from nnapi.operand import OperandType, SymmPerChannelQuantParams

log = logging.getLogger("nnapi.capi")

ffi: Any = None  # the cffi FFI of the built library, set by install()

_TAG_BITS = 4
_TAGS = {"Model": 1, "Compilation": 2, "Execution": 3, "Memory": 4, "Event": 5, "Burst": 6,
         "MemoryDesc": 7, "Device": 8}
_CLASSES = {"Model": nnapi.Model, "Compilation": nnapi.Compilation, "Execution": nnapi.Execution,
            "Memory": nnapi.Memory, "Event": nnapi.Event, "Burst": nnapi.Burst,
            "MemoryDesc": nnapi.MemoryDesc, "Device": nnapi.Device}
_OK = int(ResultCode.NO_ERROR)


class HandleTable:
    """Opaque handles: ``base + serial << 4 | tag``; serials are never reused."""

    def __init__(self, base: int) -> None:
        self._base = base
        self._live: dict[int, Any] = {}
        self._serials = itertools.count(1)
        self._issued = 0
        self._lock = threading.Lock()
        self._devices: dict[int, int] = {}

    def add(self, kind: str, obj: Any) -> int:
        with self._lock:
            serial = next(self._serials)
            self._issued = serial
        handle = self._base + (serial << _TAG_BITS | _TAGS[kind])
        self._live[handle] = obj
        return handle

    def device(self, device: nnapi.Device) -> int:
        """Devices live as long as the process: one handle per device, always the same."""
        key = id(device._hal)
        with self._lock:
            handle = self._devices.get(key)
        if handle is None:
            handle = self.add("Device", device)
            with self._lock:
                handle = self._devices.setdefault(key, handle)
        return handle

    def get(self, pointer: Any, kind: str, call: str, arg: str) -> Any:
        value = int(ffi.cast("uintptr_t", pointer))
        if value == 0:
            raise UnexpectedNullError(f"{call}: {arg} is NULL")
        obj = self._live.get(value)
        if obj is not None and value & ((1 << _TAG_BITS) - 1) == _TAGS[kind]:
            return obj
        self._raise_invalid(value, kind, call, arg)

    def _raise_invalid(self, value: int, kind: str, call: str, arg: str) -> None:
        offset = value - self._base
        tag = offset & ((1 << _TAG_BITS) - 1) if offset > 0 else 0
        serial = offset >> _TAG_BITS if offset > 0 else 0
        if value not in self._live and tag == _TAGS[kind] and 0 < serial <= self._issued:
            raise BadStateError(f"{call}: {arg} is an ANeuralNetworks{kind} that was already freed")
        actual = next((name for name, t in _TAGS.items() if t == tag), None)
        if value in self._live and actual is not None:
            raise BadDataError(f"{call}: {arg} is an ANeuralNetworks{actual}, not an ANeuralNetworks{kind}")
        raise BadDataError(f"{call}: {arg} is not an ANeuralNetworks{kind} handle of this library")

    def remove(self, pointer: Any, kind: str, call: str) -> Any | None:
        """The object of a handle being freed, or None (NULL, or not a live handle)."""
        value = int(ffi.cast("uintptr_t", pointer))
        if value == 0:
            return None
        obj = self._live.get(value)
        if obj is None or value & ((1 << _TAG_BITS) - 1) != _TAGS[kind]:
            try:
                self._raise_invalid(value, kind, call, "the handle")
            except NnapiError as error:  # a *_free has no result code: report, never crash
                _report(call, error)
            return None
        del self._live[value]
        return obj

    @property
    def live_count(self) -> int:
        return len(self._live)


handles: HandleTable | None = None
_last_error = threading.local()
_verbose = os.environ.get("NNAPI_CAPI_VERBOSE", "") not in ("", "0")


def _report(call: str, error: NnapiError) -> None:
    text = str(error)
    text = text[len(call) + 2:] if text.startswith(f"{call}: ") else text
    message = f"{call}: {error.code.name}: {text}"
    _last_error.message = ffi.new("char[]", message.encode("utf-8", "replace"))
    log.info("%s", message)
    if _verbose:
        os.write(2, f"nnapi: {message}\n".encode("utf-8", "replace"))


def _result(fn):
    """Run an int-returning entry point: NnapiError -> its code; any other -> OP_FAILED."""
    name = fn.__name__

    @functools.wraps(fn)
    def entry(*args):
        try:
            fn(*args)
            return _OK
        except NnapiError as error:
            _report(name, error)
            return int(error.code)
        except Exception as error:  # a bug of ours must not take the caller's process down
            log.exception("%s: unexpected error", name)
            _report(name, nnapi.OpFailedError(f"internal error: {type(error).__name__}: {error}"))
            return int(ResultCode.OP_FAILED)

    return entry


def _void(fn):
    """A *_free: no result code to return; failures are reported and swallowed."""
    name = fn.__name__

    @functools.wraps(fn)
    def entry(*args):
        try:
            fn(*args)
        except NnapiError as error:
            _report(name, error)
        except Exception as error:
            log.exception("%s: unexpected error", name)
            _report(name, nnapi.OpFailedError(f"internal error: {type(error).__name__}: {error}"))

    return entry


# --- marshalling helpers ---------------------------------------------------------------
def _is_null(pointer: Any) -> bool:
    return pointer == ffi.NULL


def _require(call: str, **pointers: Any) -> None:
    for name, pointer in pointers.items():
        if _is_null(pointer):
            raise UnexpectedNullError(f"{call}: {name} is NULL")


def _out(call: str, name: str, pointer: Any) -> None:
    """Check an out-pointer and clear what it points to (the NDK sets it to NULL on failure)."""
    if _is_null(pointer):
        raise UnexpectedNullError(f"{call}: {name} is NULL")
    pointer[0] = ffi.NULL


def _store(kind: str, obj: Any, out: Any, ctype: str) -> None:
    out[0] = ffi.cast(ctype, handles.add(kind, obj))


def _uint32_list(call: str, name: str, count: int, pointer: Any) -> list[int]:
    if count and _is_null(pointer):
        raise UnexpectedNullError(f"{call}: {name} is NULL but its count is {count}")
    return list(ffi.unpack(ffi.cast("uint32_t*", pointer), count)) if count else []


def _operand_type(call: str, pointer: Any) -> OperandType | None:
    if _is_null(pointer):
        return None
    count = pointer.dimensionCount
    if count and _is_null(pointer.dimensions):
        raise BadDataError(f"{call}: type.dimensions is NULL but type.dimensionCount is {count}")
    dims = list(ffi.unpack(pointer.dimensions, count)) if count else []
    return OperandType(pointer.type, dims, pointer.scale, pointer.zeroPoint)


def _caller_buffer(pointer: Any, length: int, writable: bool) -> memoryview:
    """The caller's ``length`` bytes at ``pointer``, in place (no copy)."""
    view = memoryview(ffi.buffer(ffi.cast("char*", pointer), length))
    return view if writable else view.toreadonly()


def _model(p, call, arg="model") -> nnapi.Model:
    return handles.get(p, "Model", call, arg)


def _compilation(p, call, arg="compilation") -> nnapi.Compilation:
    return handles.get(p, "Compilation", call, arg)


def _execution(p, call, arg="execution") -> nnapi.Execution:
    return handles.get(p, "Execution", call, arg)


def _memory(p, call, arg="memory") -> nnapi.Memory:
    return handles.get(p, "Memory", call, arg)


def _event(p, call, arg="event") -> nnapi.Event:
    return handles.get(p, "Event", call, arg)


def _device(p, call, arg="device") -> nnapi.Device:
    return handles.get(p, "Device", call, arg)


def _devices(call: str, devices: Any, count: int) -> list[nnapi.Device]:
    _require(call, devices=devices)
    if count == 0:
        raise BadDataError(f"{call}: numDevices is 0")
    return [_device(devices[i], call, f"devices[{i}]") for i in range(count)]


# --- devices ------------------------------------------------------------------------------
@_result
def ANeuralNetworks_getDeviceCount(numDevices):
    _require("ANeuralNetworks_getDeviceCount", numDevices=numDevices)
    numDevices[0] = nnapi.get_device_count()


@_result
def ANeuralNetworks_getDevice(devIndex, device):
    call = "ANeuralNetworks_getDevice"
    _out(call, "device", device)
    device[0] = ffi.cast("ANeuralNetworksDevice*", handles.device(nnapi.get_device(int(devIndex))))


_strings: dict[tuple[int, str], Any] = {}  # device strings handed to C: alive forever


def _device_string(handle: Any, what: str, value: str) -> Any:
    key = (int(ffi.cast("uintptr_t", handle)), what)
    if key not in _strings:
        _strings[key] = ffi.new("char[]", value.encode())
    return _strings[key]


@_result
def ANeuralNetworksDevice_getName(device, name):
    call = "ANeuralNetworksDevice_getName"
    _require(call, name=name)
    name[0] = _device_string(device, "name", _device(device, call).name)


@_result
def ANeuralNetworksDevice_getVersion(device, version):
    call = "ANeuralNetworksDevice_getVersion"
    _require(call, version=version)
    version[0] = _device_string(device, "version", _device(device, call).version)


@_result
def ANeuralNetworksDevice_getType(device, type_):
    call = "ANeuralNetworksDevice_getType"
    _require(call, type=type_)
    type_[0] = int(_device(device, call).type)


@_result
def ANeuralNetworksDevice_getFeatureLevel(device, featureLevel):
    call = "ANeuralNetworksDevice_getFeatureLevel"
    _require(call, featureLevel=featureLevel)
    featureLevel[0] = int(_device(device, call).feature_level)


@_result
def ANeuralNetworksDevice_wait(device):
    _device(device, "ANeuralNetworksDevice_wait").wait()


def _extension_name(call: str, pointer: Any) -> str:
    """A C string naming an extension (UTF-8)."""
    _require(call, extensionName=pointer)
    raw = ffi.string(ffi.cast("const char*", pointer))
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise BadDataError(f"{call}: extensionName is not UTF-8: {raw!r}") from None


@_result
def ANeuralNetworksDevice_getExtensionSupport(device, extensionName, isExtensionSupported):
    call = "ANeuralNetworksDevice_getExtensionSupport"
    obj = _device(device, call)
    name = _extension_name(call, extensionName)
    _require(call, isExtensionSupported=isExtensionSupported)
    isExtensionSupported[0] = obj.get_extension_support(name)


def ANeuralNetworks_getDefaultLoopTimeout():
    return nnapi.get_default_loop_timeout()


def ANeuralNetworks_getMaximumLoopTimeout():
    return nnapi.get_maximum_loop_timeout()


def ANeuralNetworks_getRuntimeFeatureLevel():
    return int(nnapi.get_runtime_feature_level())


# --- model --------------------------------------------------------------------------------
@_result
def ANeuralNetworksModel_create(model):
    _out("ANeuralNetworksModel_create", "model", model)
    _store("Model", nnapi.Model(), model, "ANeuralNetworksModel*")


@_void
def ANeuralNetworksModel_free(model):
    obj = handles.remove(model, "Model", "ANeuralNetworksModel_free")
    if obj is not None:
        obj.free()


@_result
def ANeuralNetworksModel_finish(model):
    _model(model, "ANeuralNetworksModel_finish").finish()


@_result
def ANeuralNetworksModel_addOperand(model, type_):
    call = "ANeuralNetworksModel_addOperand"
    obj = _model(model, call)
    _require(call, type=type_)
    obj.add_operand(_operand_type(call, type_))


@_result
def ANeuralNetworksModel_setOperandValue(model, index, buffer, length):
    call = "ANeuralNetworksModel_setOperandValue"
    obj = _model(model, call)
    if _is_null(buffer):
        if length:
            raise UnexpectedNullError(f"{call}: buffer is NULL but length is {length}")
        obj.set_operand_value(index, None)  # an omitted optional operand
    elif length <= nnapi.MAX_SIZE_OF_IMMEDIATELY_COPIED_VALUES:
        obj.set_operand_value(index, ffi.buffer(ffi.cast("char*", buffer), length)[:])
    else:
        # Larger values stay in the caller's memory, as the NDK says.
        obj.set_operand_value(index, _caller_buffer(buffer, length, writable=False))


@_result
def ANeuralNetworksModel_getExtensionOperandType(model, extensionName, operandCodeWithinExtension, type_):
    call = "ANeuralNetworksModel_getExtensionOperandType"
    obj = _model(model, call)
    name = _extension_name(call, extensionName)
    _require(call, type=type_)
    type_[0] = int(obj.get_extension_operand_type(name, int(operandCodeWithinExtension)))


@_result
def ANeuralNetworksModel_getExtensionOperationType(model, extensionName, operationCodeWithinExtension, type_):
    call = "ANeuralNetworksModel_getExtensionOperationType"
    obj = _model(model, call)
    name = _extension_name(call, extensionName)
    _require(call, type=type_)
    type_[0] = int(obj.get_extension_operation_type(name, int(operationCodeWithinExtension)))


@_result
def ANeuralNetworksModel_setOperandExtensionData(model, index, data, length):
    call = "ANeuralNetworksModel_setOperandExtensionData"
    obj = _model(model, call)
    if _is_null(data):
        if length:
            raise UnexpectedNullError(f"{call}: data is NULL but length is {length}")
        obj.set_operand_extension_data(index, None)  # NULL, 0: the data is removed
    else:
        obj.set_operand_extension_data(index, ffi.buffer(ffi.cast("char*", data), length)[:])


@_result
def ANeuralNetworksModel_setOperandSymmPerChannelQuantParams(model, index, channelQuant):
    call = "ANeuralNetworksModel_setOperandSymmPerChannelQuantParams"
    obj = _model(model, call)
    _require(call, channelQuant=channelQuant)
    count = channelQuant.scaleCount
    if count and _is_null(channelQuant.scales):
        raise BadDataError(f"{call}: channelQuant.scales is NULL but scaleCount is {count}")
    scales = list(ffi.unpack(channelQuant.scales, count)) if count else []
    obj.set_operand_symm_per_channel_quant_params(index, SymmPerChannelQuantParams(channelQuant.channelDim, scales))


@_result
def ANeuralNetworksModel_setOperandValueFromMemory(model, index, memory, offset, length):
    call = "ANeuralNetworksModel_setOperandValueFromMemory"
    obj = _model(model, call)
    obj.set_operand_value_from_memory(index, _memory(memory, call), int(offset), int(length))


@_result
def ANeuralNetworksModel_setOperandValueFromModel(model, index, value):
    call = "ANeuralNetworksModel_setOperandValueFromModel"
    obj = _model(model, call)
    obj.set_operand_value_from_model(index, _model(value, call, "value"))


@_result
def ANeuralNetworksModel_addOperation(model, type_, inputCount, inputs, outputCount, outputs):
    call = "ANeuralNetworksModel_addOperation"
    obj = _model(model, call)
    _require(call, inputs=inputs, outputs=outputs)  # the NDK checks them even for a count of 0
    obj.add_operation(type_, _uint32_list(call, "inputs", inputCount, inputs),
                      _uint32_list(call, "outputs", outputCount, outputs))


@_result
def ANeuralNetworksModel_identifyInputsAndOutputs(model, inputCount, inputs, outputCount, outputs):
    call = "ANeuralNetworksModel_identifyInputsAndOutputs"
    obj = _model(model, call)
    _require(call, inputs=inputs, outputs=outputs)
    obj.identify_inputs_and_outputs(_uint32_list(call, "inputs", inputCount, inputs),
                                    _uint32_list(call, "outputs", outputCount, outputs))


@_result
def ANeuralNetworksModel_relaxComputationFloat32toFloat16(model, allow):
    _model(model, "ANeuralNetworksModel_relaxComputationFloat32toFloat16").relax_computation_float32_to_float16(
        bool(allow))


@_result
def ANeuralNetworksModel_getSupportedOperationsForDevices(model, devices, numDevices, supportedOps):
    call = "ANeuralNetworksModel_getSupportedOperationsForDevices"
    obj = _model(model, call)
    _require(call, supportedOps=supportedOps)
    flags = obj.get_supported_operations_for_devices(_devices(call, devices, numDevices))
    for i, flag in enumerate(flags):
        supportedOps[i] = bool(flag)


# --- compilation ----------------------------------------------------------------------------
@_result
def ANeuralNetworksCompilation_create(model, compilation):
    call = "ANeuralNetworksCompilation_create"
    _out(call, "compilation", compilation)
    _store("Compilation", nnapi.Compilation(_model(model, call)), compilation, "ANeuralNetworksCompilation*")


@_result
def ANeuralNetworksCompilation_createForDevices(model, devices, numDevices, compilation):
    call = "ANeuralNetworksCompilation_createForDevices"
    _out(call, "compilation", compilation)
    obj = _model(model, call)
    _store("Compilation", nnapi.Compilation(obj, _devices(call, devices, numDevices)), compilation,
           "ANeuralNetworksCompilation*")


@_void
def ANeuralNetworksCompilation_free(compilation):
    obj = handles.remove(compilation, "Compilation", "ANeuralNetworksCompilation_free")
    if obj is not None:
        obj.free()


@_result
def ANeuralNetworksCompilation_setPreference(compilation, preference):
    _compilation(compilation, "ANeuralNetworksCompilation_setPreference").set_preference(preference)


@_result
def ANeuralNetworksCompilation_setPriority(compilation, priority):
    _compilation(compilation, "ANeuralNetworksCompilation_setPriority").set_priority(priority)


@_result
def ANeuralNetworksCompilation_setTimeout(compilation, duration):
    _compilation(compilation, "ANeuralNetworksCompilation_setTimeout").set_timeout(int(duration))


@_result
def ANeuralNetworksCompilation_setCaching(compilation, cacheDir, token):
    call = "ANeuralNetworksCompilation_setCaching"
    obj = _compilation(compilation, call)
    _require(call, cacheDir=cacheDir, token=token)
    obj.set_caching(os.fsdecode(ffi.string(cacheDir)),
                    ffi.buffer(token, nnapi.BYTE_SIZE_OF_CACHE_TOKEN)[:])


@_result
def ANeuralNetworksCompilation_finish(compilation):
    _compilation(compilation, "ANeuralNetworksCompilation_finish").finish()


def _preferred(call: str, compilation, index, out, method: str) -> None:
    obj = _compilation(compilation, call)
    _require(call, **{"out": out})
    out[0] = getattr(obj, method)(int(index))


@_result
def ANeuralNetworksCompilation_getPreferredMemoryAlignmentForInput(compilation, index, alignment):
    _preferred("ANeuralNetworksCompilation_getPreferredMemoryAlignmentForInput", compilation, index, alignment,
               "get_preferred_memory_alignment_for_input")


@_result
def ANeuralNetworksCompilation_getPreferredMemoryPaddingForInput(compilation, index, padding):
    _preferred("ANeuralNetworksCompilation_getPreferredMemoryPaddingForInput", compilation, index, padding,
               "get_preferred_memory_padding_for_input")


@_result
def ANeuralNetworksCompilation_getPreferredMemoryAlignmentForOutput(compilation, index, alignment):
    _preferred("ANeuralNetworksCompilation_getPreferredMemoryAlignmentForOutput", compilation, index, alignment,
               "get_preferred_memory_alignment_for_output")


@_result
def ANeuralNetworksCompilation_getPreferredMemoryPaddingForOutput(compilation, index, padding):
    _preferred("ANeuralNetworksCompilation_getPreferredMemoryPaddingForOutput", compilation, index, padding,
               "get_preferred_memory_padding_for_output")


# --- burst ------------------------------------------------------------------------------------
@_result
def ANeuralNetworksBurst_create(compilation, burst):
    call = "ANeuralNetworksBurst_create"
    _out(call, "burst", burst)
    _store("Burst", nnapi.Burst(_compilation(compilation, call)), burst, "ANeuralNetworksBurst*")


@_void
def ANeuralNetworksBurst_free(burst):
    obj = handles.remove(burst, "Burst", "ANeuralNetworksBurst_free")
    if obj is not None:
        obj.free()


# --- execution --------------------------------------------------------------------------------
@_result
def ANeuralNetworksExecution_create(compilation, execution):
    call = "ANeuralNetworksExecution_create"
    _out(call, "execution", execution)
    _store("Execution", nnapi.Execution(_compilation(compilation, call)), execution, "ANeuralNetworksExecution*")


@_void
def ANeuralNetworksExecution_free(execution):
    obj = handles.remove(execution, "Execution", "ANeuralNetworksExecution_free")
    # A running execution is only dropped from the table: its worker holds it until done
    # (the NDK frees it once the computation completes).
    if obj is not None and obj._state != "computing":
        obj.free()


@_result
def ANeuralNetworksExecution_setInput(execution, index, type_, buffer, length):
    call = "ANeuralNetworksExecution_setInput"
    obj = _execution(execution, call)
    if _is_null(buffer) and length:
        raise UnexpectedNullError(f"{call}: buffer is NULL but length is {length}")
    value = None if _is_null(buffer) else _caller_buffer(buffer, length, writable=False)
    obj.set_input(index, value, _operand_type(call, type_))


@_result
def ANeuralNetworksExecution_setOutput(execution, index, type_, buffer, length):
    call = "ANeuralNetworksExecution_setOutput"
    obj = _execution(execution, call)
    if _is_null(buffer) and length:
        raise UnexpectedNullError(f"{call}: buffer is NULL but length is {length}")
    value = None if _is_null(buffer) else _caller_buffer(buffer, length, writable=True)
    obj.set_output(index, value, _operand_type(call, type_))


@_result
def ANeuralNetworksExecution_setInputFromMemory(execution, index, type_, memory, offset, length):
    call = "ANeuralNetworksExecution_setInputFromMemory"
    obj = _execution(execution, call)
    obj.set_input_from_memory(index, _memory(memory, call), int(offset), int(length), _operand_type(call, type_))


@_result
def ANeuralNetworksExecution_setOutputFromMemory(execution, index, type_, memory, offset, length):
    call = "ANeuralNetworksExecution_setOutputFromMemory"
    obj = _execution(execution, call)
    obj.set_output_from_memory(index, _memory(memory, call), int(offset), int(length), _operand_type(call, type_))


@_result
def ANeuralNetworksExecution_compute(execution):
    _execution(execution, "ANeuralNetworksExecution_compute").compute()


@_result
def ANeuralNetworksExecution_burstCompute(execution, burst):
    call = "ANeuralNetworksExecution_burstCompute"
    obj = _execution(execution, call)
    obj.burst_compute(handles.get(burst, "Burst", call, "burst"))


@_result
def ANeuralNetworksExecution_startCompute(execution, event):
    call = "ANeuralNetworksExecution_startCompute"
    _out(call, "event", event)
    _store("Event", _execution(execution, call).start_compute(), event, "ANeuralNetworksEvent*")


@_result
def ANeuralNetworksExecution_startComputeWithDependencies(execution, dependencies, num_dependencies, duration,
                                                          event):
    call = "ANeuralNetworksExecution_startComputeWithDependencies"
    _out(call, "event", event)
    obj = _execution(execution, call)
    if num_dependencies and _is_null(dependencies):
        raise UnexpectedNullError(f"{call}: dependencies is NULL but num_dependencies is {num_dependencies}")
    events = [_event(dependencies[i], call, f"dependencies[{i}]") for i in range(num_dependencies)]
    _store("Event", obj.start_compute_with_dependencies(events, int(duration)), event, "ANeuralNetworksEvent*")


@_result
def ANeuralNetworksExecution_setMeasureTiming(execution, measure):
    _execution(execution, "ANeuralNetworksExecution_setMeasureTiming").set_measure_timing(bool(measure))


@_result
def ANeuralNetworksExecution_setTimeout(execution, duration):
    _execution(execution, "ANeuralNetworksExecution_setTimeout").set_timeout(int(duration))


@_result
def ANeuralNetworksExecution_setLoopTimeout(execution, duration):
    _execution(execution, "ANeuralNetworksExecution_setLoopTimeout").set_loop_timeout(int(duration))


@_result
def ANeuralNetworksExecution_setReusable(execution, reusable):
    _execution(execution, "ANeuralNetworksExecution_setReusable").set_reusable(bool(reusable))


@_result
def ANeuralNetworksExecution_enableInputAndOutputPadding(execution, enable):
    _execution(execution, "ANeuralNetworksExecution_enableInputAndOutputPadding").enable_input_and_output_padding(
        bool(enable))


@_result
def ANeuralNetworksExecution_getDuration(execution, durationCode, duration):
    call = "ANeuralNetworksExecution_getDuration"
    obj = _execution(execution, call)
    _require(call, duration=duration)
    duration[0] = obj.get_duration(durationCode)


@_result
def ANeuralNetworksExecution_getOutputOperandRank(execution, index, rank):
    call = "ANeuralNetworksExecution_getOutputOperandRank"
    obj = _execution(execution, call)
    _require(call, rank=rank)
    try:
        rank[0] = obj.get_output_operand_rank(index)
    except nnapi.OutputInsufficientSizeError as error:
        rank[0] = len(error.dimensions)  # Android writes the needed shape, then returns the code
        raise


@_result
def ANeuralNetworksExecution_getOutputOperandDimensions(execution, index, dimensions):
    call = "ANeuralNetworksExecution_getOutputOperandDimensions"
    obj = _execution(execution, call)
    _require(call, dimensions=dimensions)
    try:
        sizes = obj.get_output_operand_dimensions(index)
    except nnapi.OutputInsufficientSizeError as error:
        for i, size in enumerate(error.dimensions):  # the needed shape, then the code
            dimensions[i] = size
        raise
    for i, size in enumerate(sizes):
        dimensions[i] = size


# --- memory -----------------------------------------------------------------------------------
@_result
def ANeuralNetworksMemory_createFromFd(size, protect, fd, offset, memory):
    _out("ANeuralNetworksMemory_createFromFd", "memory", memory)
    _store("Memory", nnapi.Memory.from_fd(int(size), protect, fd, int(offset)), memory, "ANeuralNetworksMemory*")


@_result
def ANeuralNetworksMemory_createFromAHardwareBuffer(ahwb, memory):
    call = "ANeuralNetworksMemory_createFromAHardwareBuffer"
    _out(call, "memory", memory)
    _require(call, ahwb=ahwb)
    raise BadDataError(f"{call}: AHardwareBuffer does not exist on Linux; use ANeuralNetworksMemory_createFromFd")


@_result
def ANeuralNetworksMemory_createFromDesc(desc, memory):
    call = "ANeuralNetworksMemory_createFromDesc"
    _out(call, "memory", memory)
    obj = handles.get(desc, "MemoryDesc", call, "desc")
    _store("Memory", nnapi.Memory.from_desc(obj), memory, "ANeuralNetworksMemory*")


@_result
def ANeuralNetworksMemory_copy(src, dst):
    call = "ANeuralNetworksMemory_copy"
    nnapi.Memory.copy(_memory(src, call, "src"), _memory(dst, call, "dst"))


@_void
def ANeuralNetworksMemory_free(memory):
    obj = handles.remove(memory, "Memory", "ANeuralNetworksMemory_free")
    if obj is not None:
        obj.free()


@_result
def ANeuralNetworksMemoryDesc_create(desc):
    _out("ANeuralNetworksMemoryDesc_create", "desc", desc)
    _store("MemoryDesc", nnapi.MemoryDesc(), desc, "ANeuralNetworksMemoryDesc*")


@_void
def ANeuralNetworksMemoryDesc_free(desc):
    obj = handles.remove(desc, "MemoryDesc", "ANeuralNetworksMemoryDesc_free")
    if obj is not None:
        obj.free()


@_result
def ANeuralNetworksMemoryDesc_addInputRole(desc, compilation, index, frequency):
    call = "ANeuralNetworksMemoryDesc_addInputRole"
    obj = handles.get(desc, "MemoryDesc", call, "desc")
    obj.add_input_role(_compilation(compilation, call), int(index), float(frequency))


@_result
def ANeuralNetworksMemoryDesc_addOutputRole(desc, compilation, index, frequency):
    call = "ANeuralNetworksMemoryDesc_addOutputRole"
    obj = handles.get(desc, "MemoryDesc", call, "desc")
    obj.add_output_role(_compilation(compilation, call), int(index), float(frequency))


@_result
def ANeuralNetworksMemoryDesc_setDimensions(desc, rank, dimensions):
    call = "ANeuralNetworksMemoryDesc_setDimensions"
    obj = handles.get(desc, "MemoryDesc", call, "desc")
    obj.set_dimensions(_uint32_list(call, "dimensions", rank, dimensions))


@_result
def ANeuralNetworksMemoryDesc_finish(desc):
    handles.get(desc, "MemoryDesc", "ANeuralNetworksMemoryDesc_finish", "desc").finish()


# --- events -----------------------------------------------------------------------------------
@_result
def ANeuralNetworksEvent_wait(event):
    _event(event, "ANeuralNetworksEvent_wait").wait()


@_void
def ANeuralNetworksEvent_free(event):
    obj = handles.remove(event, "Event", "ANeuralNetworksEvent_free")
    if obj is not None:
        obj.free()  # waits for the execution, as the NDK does


@_result
def ANeuralNetworksEvent_createFromSyncFenceFd(sync_fence_fd, event):
    call = "ANeuralNetworksEvent_createFromSyncFenceFd"
    _out(call, "event", event)
    if sync_fence_fd <= 0:
        raise BadDataError(f"{call}: invalid sync fence fd {sync_fence_fd}")
    _store("Event", nnapi.Event.create_from_sync_fence_fd(sync_fence_fd), event, "ANeuralNetworksEvent*")


@_result
def ANeuralNetworksEvent_getSyncFenceFd(event, sync_fence_fd):
    call = "ANeuralNetworksEvent_getSyncFenceFd"
    _require(call, sync_fence_fd=sync_fence_fd)
    sync_fence_fd[0] = -1
    sync_fence_fd[0] = _event(event, call).get_sync_fence_fd()


# --- nnapi's own extension ----------------------------------------------------------------------
def nnapi_capi_last_error():
    message = getattr(_last_error, "message", None)
    return message if message is not None else _EMPTY


_EMPTY: Any = None


def install(ffi_: Any) -> None:
    """Bind every entry point to the library's cffi FFI (called by its init code)."""
    global ffi, handles, _EMPTY
    ffi = ffi_
    handles = HandleTable(0x4E4E_0000_0000 if ffi.sizeof("void*") == 8 else 0x4E00_0000)
    _EMPTY = ffi.new("char[]", b"")
    from nnapi.capi.signatures import FUNCTIONS

    namespace = globals()
    for function in FUNCTIONS:
        python = namespace[function.name]
        error = int(ResultCode.OP_FAILED) if function.result == "int" else 0
        if function.result == "void":
            ffi.def_extern(name=f"nnapi_py_{function.name}")(python)
        else:
            ffi.def_extern(name=f"nnapi_py_{function.name}", error=error)(python)
    ffi.def_extern(name="nnapi_py_nnapi_capi_last_error")(nnapi_capi_last_error)
    ffi.def_extern(name="nnapi_py_ready")(lambda: 1)
