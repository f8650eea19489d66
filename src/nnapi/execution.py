"""Execution: the NDK's ANeuralNetworksExecution_* functions.

An execution binds buffers or memories to a compiled model's inputs and outputs, runs it
on the chosen device (synchronously, asynchronously with an Event, or through a Burst)
and reports output shapes and timing.
"""

from __future__ import annotations

import os
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import numpy as np

from nnapi import tracing, vlog
from nnapi._object import NnapiObject, as_flag
from nnapi._scheduler import POOL
from nnapi.codes import DurationCode, ResultCode
from nnapi.compilation import Compilation, finished_compilation
from nnapi.device import DEFAULT_LOOP_TIMEOUT_NS, MAXIMUM_LOOP_TIMEOUT_NS
from nnapi.errors import (
    BadDataError,
    BadStateError,
    NnapiError,
    OpFailedError,
    OutOfMemoryError,
    OutputInsufficientSizeError,
    ResourceExhaustedTransientError,
    UnexpectedNullError,
    error_for,
)
from nnapi.event import Event, check_events
from nnapi.hal import DataLocation, ErrorStatus, HalError, OutputShape, Request, RequestArgument, Timing
from nnapi.hal.interfaces import wait_for_fences
from nnapi.hal.types import NO_TIMING
from nnapi.memory import Memory
from nnapi.memory_desc import check_input_memory
from nnapi.model import as_bytes_view
from nnapi.operand import OperandType, dtype_of
from nnapi.runtime.execution_plan import checked_answer, contain

#: get_duration's value when no duration is available (UINT64_MAX).
DURATION_UNAVAILABLE = NO_TIMING

_PREPARATION, _COMPUTING, _COMPLETED = "preparation", "computing", "completed"
#: Guards every execution's state against free() from another thread (the sections are a
#: few attribute reads and writes: one lock for all executions spares a lock per Execution).
_STATE_LOCK = threading.Lock()
#: The timing of a run that measured none (shared, never mutated).
_UNMEASURED = Timing()
#: ResultCode.NO_ERROR as a plain global: an IntEnum member read through its class costs a
#: lookup in the enum's metaclass (~0.2 us warm, several between two model runs)
_NO_ERROR = ResultCode.NO_ERROR


@dataclass
class _Argument:
    omitted: bool
    pool: Any = None  # a buffer object (memoryview) or a Memory
    offset: int = 0
    length: int = 0
    dimensions: tuple[int, ...] = ()
    #: a non-contiguous numpy array: read (input) or written back (output) at compute time
    array: np.ndarray | None = None


class _Table:
    """What every Execution of one compilation checks its arguments against and runs
    through, computed once (at the compilation's first Execution).

    Why it exists: an app that creates an Execution per inference (the only way before
    feature level 5) pays the per-execution Python after the model's run has filled the
    caches with weights and activations, when each interpreted step costs ~10x what a
    micro-benchmark shows. So the usual execution (every argument a contiguous array of
    its operand's dtype and declared shape, set with set_input / set_output) is checked
    against these tables in a few steps, and it runs through ``run``, which hands the
    plan a request bound once when the arrays are the ones the previous executions of
    this compilation used."""

    __slots__ = ("input_types", "output_types", "n_in", "n_total", "inputs", "outputs", "in_args", "out_args",
                 "plan", "lock", "cached", "pending", "direct", "open", "dims")

    def __init__(self, compilation: Compilation) -> None:
        self.input_types, self.output_types = compilation._io_types
        self.n_in = len(self.input_types)
        self.n_total = self.n_in + len(self.output_types)
        arrays_in, arrays_out = compilation._io_arrays
        #: per index of a fully specified operand: (dtype, accepted array shapes, dims, position)
        #: where position numbers inputs then outputs (the pool of the argument in ``run``)
        self.inputs = {i: (*spec, i) for i, spec in arrays_in.items()}
        self.outputs = {i: (*spec, self.n_in + i) for i, spec in arrays_out.items()}
        #: and per tensor operand of open shape (a dimension known only at run time, not an
        #: extension): an input's array gives its dimensions (dims None), its accepted shapes
        #: (with strides) are those set_input's general path has checked (accept); an
        #: output's array is its buffer, any shape (the declared dims, the run's shape)
        self.open = False
        for kind, types, table, base in (("input", self.input_types, self.inputs, 0),
                                         ("output", self.output_types, self.outputs, self.n_in)):
            for index, op_type in enumerate(types):
                if index not in table and op_type.is_tensor and not op_type.is_extension:
                    self.open = True
                    table[index] = ((op_type.dtype, {}, None, index) if kind == "input"
                                    else (op_type.dtype, _ANY_SHAPE, tuple(op_type.dimensions), base + index))
        specs = [self.inputs.get(i) for i in range(self.n_in)] + [
            self.outputs.get(i) for i in range(len(self.output_types))]
        types = [*self.input_types, *self.output_types]
        #: the request's arguments when every argument is such an array: argument k in pool k,
        #: all of it (None when an operand is not fully specified: made per run, request_of)
        self.in_args = self.out_args = None
        arrays_only = all(spec is not None for spec in specs)
        if arrays_only and not self.open:
            arguments = [RequestArgument(False, DataLocation(k, 0, types[k].byte_size()), list(spec[2]))
                         for k, spec in enumerate(specs)]
            self.in_args, self.out_args = arguments[:self.n_in], arguments[self.n_in:]
        #: the dims of each argument in a request of arrays (None: an input's array's shape)
        self.dims = [spec[2] if spec is not None else None for spec in specs]
        self.plan = compilation._plan
        #: the one step's array path (IPreparedModel.array_executor), or None: the arrays
        #: go to its driver as they are, which binds what moved itself
        executor = getattr(self.plan.single, "array_executor", None) if arrays_only else None
        self.direct = executor() if executor is not None else None
        self.lock = threading.Lock()
        #: (the arrays' ids, the arrays, the driver's bound execution, its request): the arrays
        #: are held so that their ids and addresses stay theirs while bound
        self.cached: tuple[tuple[int, ...], list[np.ndarray], Any, Request] | None = None
        #: (the arrays' ids, weak references to the arrays) of the last run that was not
        #: bound (bound when seen twice in a row): a new array that took a freed one's id
        #: does not pass for it (a loop freeing its input before making the next would bind
        #: every run), and the last input is freed when the app drops it, not inside the
        #: next execution (~40 us for a 600 KB array there)
        self.pending: tuple[tuple[int, ...], list[weakref.ref]] | None = None

    def run(self, deadline_ns: int | None, arrays: list[np.ndarray], loop_timeout_ns: int
            ) -> tuple[list[OutputShape], Timing]:
        """Run the execution whose arguments are ``arrays`` (inputs then outputs, each the
        whole of its operand). A one-step plan gets the request from its driver directly
        (the pools are plain buffers: nothing to stage), and the same arrays as the last two
        runs (an app's loop over buffers it keeps) go through a request its driver bound for
        them (one per compilation, replaced when the arrays change); a driver with an array
        path gets the arrays themselves (no request, nothing kept here). A failure is the
        plan's, as through ExecutionPlan.execute: maybe re-run on the CPU."""
        direct = self.direct
        plan = self.plan
        if direct is not None:
            try:
                answer = direct(arrays, deadline_ns)
                if plan.answers_checked:
                    return answer
                return checked_answer(answer, plan.output_dims, plan.steps[0].device.name, "execute")
            except Exception as error:  # noqa: BLE001 - contained, maybe retried on the CPU
                return plan._fallback(error, self.request_of(arrays), deadline_ns, loop_timeout_ns)
        if self.open:  # a request of its own (the plan's fallback inside)
            return plan.execute(self.request_of(arrays), False, deadline_ns, loop_timeout_ns)
        key = tuple(map(id, arrays))
        cached = self.cached
        if cached is not None and cached[0] == key and self.lock.acquire(False):
            try:
                answer = cached[2].execute(deadline_ns)
                if plan.answers_checked:
                    return answer
                return checked_answer(answer, plan.output_dims, plan.steps[0].device.name, "reusable execute")
            except Exception as error:  # noqa: BLE001 - contained, maybe retried on the CPU
                return plan._fallback(error, cached[3], deadline_ns, loop_timeout_ns)
            finally:
                self.lock.release()
        # the (contiguous, not empty) arrays are the pools themselves: buffer objects a
        # driver reads as bytes, or binds as arrays (the ORT driver), with nothing made per
        # array between two model runs; the arguments are the table's own lists (a driver
        # never changes a request)
        request = Request(self.in_args, self.out_args, list(arrays))
        single = plan.single
        if single is None:  # several steps: the plan runs them
            return plan.execute(request, False, deadline_ns, loop_timeout_ns)
        try:
            pending = self.pending
            if pending is not None and pending[0] == key and (cached is None or cached[0] != key) and all(
                    ref() is array for ref, array in zip(pending[1], arrays)):
                bound = single.create_reusable_execution(request, False, loop_timeout_ns)
                with self.lock:
                    self.cached = (key, list(arrays), bound, request)
                    answer = bound.execute(deadline_ns)
                if plan.answers_checked:
                    return answer
                return checked_answer(answer, plan.output_dims, plan.steps[0].device.name, "reusable execute")
            # new arrays (or the bound ones while another thread runs them): a request of their own
            self.pending = (key, list(map(weakref.ref, arrays)))
            answer = single.execute(request, False, deadline_ns, loop_timeout_ns)
            if plan.answers_checked:
                return answer
            return checked_answer(answer, plan.output_dims, plan.steps[0].device.name, "execute")
        except Exception as error:  # noqa: BLE001 - contained, maybe retried on the CPU
            return plan._fallback(error, request, deadline_ns, loop_timeout_ns)

    def request_of(self, arrays: list[np.ndarray]) -> Request:
        """The request whose argument k is the whole of array k (see run)."""
        if self.in_args is not None:
            return Request(self.in_args, self.out_args, list(arrays))
        arguments = [RequestArgument(False, DataLocation(k, 0, array.nbytes),
                                     list(array.shape if dims is None else dims))
                     for k, (array, dims) in enumerate(zip(arrays, self.dims, strict=True))]
        return Request(arguments[:self.n_in], arguments[self.n_in:], list(arrays))

    def accept(self, index: int, array: np.ndarray) -> None:
        """Let set_input's fast path take arrays of ``array``'s shape for input ``index`` of
        open shape: set_input's general path has just checked one (a C-contiguous array of
        the operand's dtype, dimensions that complete the model's, none of them 0)."""
        spec = self.inputs.get(index)
        if spec is not None and spec[2] is None and len(spec[1]) < 64 and array.ndim and 0 not in array.shape:
            spec[1][array.shape] = array.strides


class _AnyShape:
    """The array shapes an output of open shape takes on set_output's fast path: any that
    holds an element (its bytes are the buffer; an empty one takes the general path)."""

    __slots__ = ()

    def __contains__(self, shape: tuple[int, ...]) -> bool:
        return 0 not in shape


_ANY_SHAPE = _AnyShape()


def _table_of(compilation: Any, call: str) -> _Table:
    """The compilation's table after the checks of ANeuralNetworksExecution_create."""
    compilation = finished_compilation(compilation, call)
    table = compilation._execution_table
    if table is None:
        table = compilation._execution_table = _Table(compilation)
    return table


class Execution(NnapiObject):
    """ANeuralNetworksExecution."""

    # What a new Execution starts with, as class attributes: an object sets only what it changes.
    _state = _PREPARATION
    _reusable = False
    _padding = False
    _measure = False
    _timeout_ns = 0
    _loop_timeout_ns = DEFAULT_LOOP_TIMEOUT_NS
    _output_shapes: list[OutputShape] | None = None
    _timing = _UNMEASURED
    _fenced_timing: Timing | None = None
    _status = ResultCode.NO_ERROR
    _lock = _STATE_LOCK
    #: (runner, its IExecution) for a reusable execution whose request is bound (see _run)
    _bound: tuple[Any, Any] | None = None
    #: the memories a bound request maps (checked alive at each computation)
    _bound_memories: tuple[Memory, ...] = ()
    #: how many arguments are arrays held in ``_arrays`` (see set_input); the others are in
    #: ``_inputs`` / ``_outputs`` (per index, made by _arguments when one is set: an empty
    #: read-only mapping until then)
    _array_count = 0
    _inputs: Mapping[int, _Argument] = MappingProxyType({})
    _outputs: Mapping[int, _Argument] = MappingProxyType({})
    #: nothing set that takes compute off its usual path (reusable, timing, a loop timeout)
    _usual = True

    def __init__(self, compilation: Compilation) -> None:
        """ANeuralNetworksExecution_create."""
        table = compilation._execution_table if compilation.__class__ is Compilation else None
        if table is None or compilation._freed:
            table = _table_of(compilation, "Execution")
        self._compilation = compilation
        self._table = table
        #: per position (inputs, then outputs) the array set_input / set_output took as it is
        self._arrays: list[np.ndarray | None] = [None] * table.n_total

    @property
    def _input_types(self) -> tuple[OperandType, ...]:
        return self._table.input_types

    @property
    def _output_types(self) -> tuple[OperandType, ...]:
        return self._table.output_types

    def _arguments(self, kind: str) -> dict[int, _Argument]:
        """The arguments of ``kind`` set other than as arrays, created at the first (an
        Execution of arrays only never builds these dicts)."""
        name = "_inputs" if kind == "input" else "_outputs"
        arguments = self.__dict__.get(name)
        if arguments is None:
            arguments = {}
            setattr(self, name, arguments)
        return arguments

    # --- settings --------------------------------------------------------------------
    def _check_preparation(self, call: str) -> None:
        self._check_alive(call)
        if self._state != _PREPARATION:
            raise BadStateError(f"{call}: the execution has already been scheduled")

    def _update_usual(self) -> None:
        self._usual = (not self._reusable and not self._measure
                       and self._loop_timeout_ns == DEFAULT_LOOP_TIMEOUT_NS)

    def set_reusable(self, reusable: bool) -> None:
        """ANeuralNetworksExecution_setReusable."""
        self._check_preparation("set_reusable")
        self._reusable = as_flag("set_reusable", reusable)
        self._update_usual()

    def set_measure_timing(self, measure: bool) -> None:
        """ANeuralNetworksExecution_setMeasureTiming: only for a compilation created for
        exactly one device."""
        self._check_preparation("set_measure_timing")
        if not self._compilation.single_explicit_device:
            raise BadDataError("set_measure_timing: only for a compilation created for exactly one device")
        self._measure = as_flag("set_measure_timing", measure)
        self._update_usual()

    def set_timeout(self, duration_ns: int) -> None:
        """ANeuralNetworksExecution_setTimeout: 0 means none. Only for a compilation
        created for exactly one device."""
        self._check_preparation("set_timeout")
        if not self._compilation.single_explicit_device:
            raise BadDataError("set_timeout: only for a compilation created for exactly one device")
        if not isinstance(duration_ns, int) or duration_ns < 0:
            raise BadDataError(f"set_timeout: duration must be a non-negative int, got {duration_ns!r}")
        self._timeout_ns = duration_ns

    def set_loop_timeout(self, duration_ns: int) -> None:
        """ANeuralNetworksExecution_setLoopTimeout: capped at get_maximum_loop_timeout()."""
        self._check_preparation("set_loop_timeout")
        if not isinstance(duration_ns, int) or duration_ns < 0:
            raise BadDataError(f"set_loop_timeout: duration must be a non-negative int, got {duration_ns!r}")
        self._loop_timeout_ns = min(duration_ns, MAXIMUM_LOOP_TIMEOUT_NS)
        self._update_usual()

    def enable_input_and_output_padding(self, enable: bool) -> None:
        """ANeuralNetworksExecution_enableInputAndOutputPadding."""
        self._check_preparation("enable_input_and_output_padding")
        if self._inputs or self._outputs or self._array_count:
            raise BadStateError("enable_input_and_output_padding: inputs or outputs are already set")
        self._padding = as_flag("enable_input_and_output_padding", enable)

    # --- arguments -------------------------------------------------------------------
    def _argument_type(self, call: str, kind: str, index: int, op_type: OperandType | None, value: Any
                       ) -> tuple[OperandType, tuple[int, ...]]:
        types = self._input_types if kind == "input" else self._output_types
        if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < len(types):
            raise BadDataError(f"{call}: {kind} index {index!r} out of range ({len(types)} {kind}s)")
        declared = types[index]
        dims = declared.dimensions
        if op_type is not None:
            if not isinstance(op_type, OperandType):
                raise BadDataError(f"{call}: type must be an OperandType")
            if (op_type.type, op_type.scale, op_type.zero_point) != (declared.type, declared.scale,
                                                                      declared.zero_point):
                raise BadDataError(f"{call}: type {op_type.describe()} differs from the model's "
                                   f"{declared.describe()} in more than dimensions")
            if not declared.is_tensor and op_type.dimensions:
                raise BadDataError(f"{call}: a scalar has no dimensions")
            if declared.dimensions:
                if len(op_type.dimensions) != len(declared.dimensions) or any(
                        d and o != d for o, d in zip(op_type.dimensions, declared.dimensions, strict=True)):
                    raise BadDataError(f"{call}: dimensions {list(op_type.dimensions)} contradict the model's "
                                       f"{list(declared.dimensions)}")
            dims = op_type.dimensions
        elif kind == "input" and declared.is_tensor and not declared.is_fully_specified and isinstance(
                value, np.ndarray):
            # An input numpy array states its own shape: use it to complete the model's.
            shape = tuple(value.shape)
            if declared.dimensions and (len(shape) != len(declared.dimensions) or any(
                    d and s != d for s, d in zip(shape, declared.dimensions, strict=True))):
                raise BadDataError(f"{call}: array shape {list(shape)} contradicts the model's "
                                   f"{list(declared.dimensions)}")
            dims = shape
        dims = tuple(dims)
        return (declared if dims == declared.dimensions else declared.with_dimensions(dims)), dims

    def _check_length(self, call: str, kind: str, index: int, full_type: OperandType, length: int) -> None:
        if kind == "input" and not full_type.is_fully_specified:
            raise BadDataError(f"{call}: input {index} type {full_type.describe()} is not fully specified; "
                               "pass a type with its dimensions")
        if full_type.is_fully_specified:
            needed = full_type.byte_size()
            if length < needed or (length != needed and not self._padding):
                raise BadDataError(f"{call}: {kind} {index} ({full_type.describe()}) needs {needed} bytes, "
                                   f"got {length}")

    def _set(self, call: str, kind: str, index: int, buffer: Any, op_type: OperandType | None) -> None:
        self._check_preparation(call)
        full_type, dims = self._argument_type(call, kind, index, op_type, buffer)
        if buffer is None:
            argument = _Argument(omitted=True)
        elif isinstance(buffer, np.ndarray) and not buffer.flags.c_contiguous:
            # Kept as the caller's array: read at compute time like any other input, and an
            # output is written back into it after the computation.
            self._check_array(call, kind, index, full_type, buffer)
            if kind == "output" and not buffer.flags.writeable:
                raise BadDataError(f"{call}: output {index}: the array is read-only")
            self._check_length(call, kind, index, full_type, buffer.nbytes)
            argument = _Argument(False, None, 0, buffer.nbytes, dims, buffer)
        else:
            if isinstance(buffer, np.ndarray | np.generic):
                self._check_array(call, kind, index, full_type,
                                  buffer if isinstance(buffer, np.ndarray) else np.asarray(buffer))
            try:
                view = as_bytes_view(buffer, full_type)
            except BadDataError as error:
                raise BadDataError(f"{call}: {kind} {index}: {error}") from None
            if kind == "output" and view.readonly:
                raise BadDataError(f"{call}: output {index}: the buffer is read-only")
            self._check_length(call, kind, index, full_type, view.nbytes)
            argument = _Argument(False, view, 0, view.nbytes, dims)
        self._store(call, kind, index, argument)
        if kind == "input" and op_type is None and buffer.__class__ is np.ndarray and not self._padding \
                and buffer.flags.c_contiguous:
            self._table.accept(index, buffer)  # (an input of open shape: see _Table.accept)

    def _store(self, call: str, kind: str, index: int, argument: _Argument) -> None:
        """Bind a checked argument; each input and output is set once, as the NDK's
        ExecutionBuilder does (BAD_STATE "already been provided")."""
        arguments = self._inputs if kind == "input" else self._outputs
        if index in arguments or self._arrays[index if kind == "input" else self._table.n_in + index] is not None:
            raise BadStateError(f"{call}: {kind} {index} was already set for this execution")
        self._arguments(kind)[index] = argument

    def _materialize(self) -> None:
        """Turn the arrays set_input / set_output took as they are into arguments in
        ``_inputs`` / ``_outputs``, which every path but compute's usual one reads."""
        table, arrays = self._table, self._arrays
        for position, array in enumerate(arrays):
            if array is None:
                continue
            if position < table.n_in:
                arguments, index, spec = self._arguments("input"), position, table.inputs[position]
            else:
                arguments, index = self._arguments("output"), position - table.n_in
                spec = table.outputs[index]
            view = memoryview(array.reshape(-1).view(np.uint8))
            arguments[index] = _Argument(False, view, 0, view.nbytes, array.shape if spec[2] is None else spec[2])
        self._arrays = [None] * table.n_total
        self._array_count = 0

    def _check_array(self, call: str, kind: str, index: int, full_type: OperandType, array: np.ndarray) -> None:
        """A numpy argument has the operand's dtype, and its shape (or is flat with the
        operand's element count); the byte count alone would let int32 pass for float32."""
        if isinstance(array, np.ma.MaskedArray):
            raise BadDataError(f"{call}: {kind} {index}: masked arrays are not supported")
        expected = dtype_of(full_type.type)
        # An extension type's elements are opaque bytes: any dtype of their size will do.
        if array.dtype != expected and not (full_type.is_extension and array.dtype.itemsize == expected.itemsize):
            raise BadDataError(f"{call}: {kind} {index} is {full_type.type.name}, which needs dtype {expected}; "
                               f"got an array of dtype {array.dtype}")
        if not full_type.is_fully_specified or (self._padding and array.ndim == 1):
            return
        dims = tuple(full_type.dimensions)
        count = full_type.element_count() if full_type.is_tensor else 1
        if array.shape != dims and array.shape != (count,):
            raise BadDataError(f"{call}: {kind} {index} has shape {list(dims)}; got an array of shape "
                               f"{list(array.shape)}")

    def _set_from_memory(self, call: str, kind: str, index: int, memory: Memory, offset: int, length: int,
                         op_type: OperandType | None) -> None:
        self._check_preparation(call)
        if memory is None:
            raise UnexpectedNullError(f"{call}: memory is None")
        if not isinstance(memory, Memory):
            raise BadDataError(f"{call}: expected a Memory")
        memory._check_alive(call)
        full_type, dims = self._argument_type(call, kind, index, op_type, None)
        if not isinstance(offset, int) or not isinstance(length, int) or offset < 0 or length < 0:
            raise BadDataError(f"{call}: offset and length must be non-negative ints")
        if memory.is_from_desc:
            if offset or length:
                raise BadDataError(f"{call}: offset and length must be 0 for a memory from a MemoryDesc")
            memory._desc.check_role(call, self._compilation, kind, index, full_type)
            length = memory.size
            dims = dims if full_type.is_fully_specified else tuple(memory._desc.dimensions or dims)
        else:
            if offset + length > memory.size:
                raise BadDataError(f"{call}: offset {offset} + length {length} exceeds the memory's "
                                   f"{memory.size} bytes")
            if kind == "output" and not memory._writable:
                raise BadDataError(f"{call}: the memory is read-only")
            self._check_length(call, kind, index, full_type, length)
        self._store(call, kind, index, _Argument(False, memory, offset, length, dims))

    def set_input(self, index: int, buffer: Any, type: OperandType | None = None) -> None:  # noqa: A002
        """ANeuralNetworksExecution_setInput. ``buffer`` is bytes-like or numpy (None omits
        an optional input); ``type`` completes dimensions the model left unspecified (a
        numpy array's own shape does too)."""
        if type is None and buffer.__class__ is np.ndarray and index.__class__ is int:
            # The usual call: a contiguous array of the operand's dtype and shape (or flat) for
            # an operand the model fully specifies, kept as it is (_set gives the same answers
            # for it, and every message).
            # Contiguity from the strides numpy gives a contiguous array of that shape (cheaper
            # than its flags right after a model run); flags for any other (an image[None]).
            spec = self._table.inputs.get(index)
            if spec is not None and (buffer.dtype is spec[0] or buffer.dtype == spec[0]):
                strides = spec[1].get(buffer.shape)
                if (strides is not None and (buffer.strides == strides or buffer.flags.c_contiguous)
                        and self._state is _PREPARATION and not self._padding and not self._freed
                        and self._arrays[index] is None and index not in self._inputs):
                    self._arrays[index] = buffer
                    self._array_count += 1
                    return
        self._set("set_input", "input", index, buffer, type)

    def set_output(self, index: int, buffer: Any, type: OperandType | None = None) -> None:  # noqa: A002
        """ANeuralNetworksExecution_setOutput: ``buffer`` must be writable (None omits)."""
        if type is None and buffer.__class__ is np.ndarray and index.__class__ is int:
            spec = self._table.outputs.get(index)  # as set_input's, writable too
            if spec is not None and (buffer.dtype is spec[0] or buffer.dtype == spec[0]) and buffer.shape in spec[1]:
                flags = buffer.flags
                if (flags.c_contiguous and flags.writeable and self._state is _PREPARATION and not self._padding
                        and not self._freed and self._arrays[spec[3]] is None and index not in self._outputs):
                    self._arrays[spec[3]] = buffer
                    self._array_count += 1
                    return
        self._set("set_output", "output", index, buffer, type)

    def set_input_from_memory(self, index: int, memory: Memory, offset: int, length: int,
                              type: OperandType | None = None) -> None:  # noqa: A002
        """ANeuralNetworksExecution_setInputFromMemory."""
        self._set_from_memory("set_input_from_memory", "input", index, memory, offset, length, type)

    def set_output_from_memory(self, index: int, memory: Memory, offset: int, length: int,
                               type: OperandType | None = None) -> None:  # noqa: A002
        """ANeuralNetworksExecution_setOutputFromMemory."""
        self._set_from_memory("set_output_from_memory", "output", index, memory, offset, length, type)

    # --- running ---------------------------------------------------------------------
    def _begin(self, call: str) -> None:
        self._check_alive(call)
        with self._lock:
            if self._array_count:
                self._materialize()
            if self._state == _COMPUTING:
                raise BadStateError(f"{call}: the execution is running")
            if self._state == _COMPLETED and not self._reusable:
                raise BadStateError(f"{call}: the execution has completed and is not reusable")
            if len(self._inputs) != len(self._input_types) or len(self._outputs) != len(self._output_types):
                missing = [f"input {i}" for i in range(len(self._input_types)) if i not in self._inputs]
                missing += [f"output {i}" for i in range(len(self._output_types)) if i not in self._outputs]
                raise BadDataError(f"{call}: not set: {', '.join(missing)}")
            if self._bound is None:  # a bound request has no memories from a MemoryDesc
                for position, argument in self._inputs.items():
                    if isinstance(argument.pool, Memory) and argument.pool.is_from_desc:
                        check_input_memory(call, argument.pool, position, argument.dimensions)
            else:
                for memory in self._bound_memories:  # bound, but still not usable once freed
                    memory._check_alive(call)
            if self._compilation._freed:
                raise BadStateError(f"{call}: the compilation was freed")
            self._previous_state = self._state
            self._state = _COMPUTING

    def _bindable(self) -> bool:
        """A reusable execution's request can be bound to the driver once when every
        argument is a plain buffer or a mapped memory that cannot shrink (create_shared,
        a sealed from_fd): nothing to re-read, re-check or write back per compute. A
        memory read through its descriptor or from a MemoryDesc is read, checked or
        updated at every computation, so it is not bound."""
        for arguments in (self._inputs, self._outputs):
            for argument in arguments.values():
                if argument.omitted:
                    continue
                if argument.array is not None:
                    return False
                pool = argument.pool
                if isinstance(pool, Memory) and (pool._mapping is None or pool._direct or pool._desc is not None):
                    return False
        return True

    def _memories(self) -> tuple[Memory, ...]:
        """The memories among the arguments (each once)."""
        found: dict[int, Memory] = {}
        for arguments in (self._inputs, self._outputs):
            for argument in arguments.values():
                if isinstance(argument.pool, Memory):
                    found[id(argument.pool)] = argument.pool
        return tuple(found.values())

    def _request(self) -> tuple[Request, list[Callable[[], None]]]:
        """The HAL request, read from the arguments now, and what to do after a successful
        run to land outputs that could not be handed to the driver in place."""
        inputs, outputs = self._inputs, self._outputs
        n_in, n_out = len(self._input_types), len(self._output_types)
        plain = [inputs[i] for i in range(n_in)] + [outputs[i] for i in range(n_out)]
        if all(type(arg.pool) is memoryview and arg.array is None and not arg.omitted for arg in plain):
            # the usual case, buffers given by set_input / set_output: one pool each
            arguments = [RequestArgument(False, DataLocation(pool, arg.offset, arg.length), list(arg.dimensions))
                         for pool, arg in enumerate(plain)]
            return Request(arguments[:n_in], arguments[n_in:], [arg.pool for arg in plain]), []
        pools: list[Any] = []
        pool_ids: dict[int, int] = {}
        write_backs: list[Callable[[], None]] = []

        def own_pool(buffer: Any) -> int:
            pools.append(buffer)
            return len(pools) - 1

        def argument(position: int, arg: _Argument, kind: str) -> RequestArgument:
            if arg.omitted:
                return RequestArgument(has_no_value=True)
            call = f"compute: {kind} {position}"
            if arg.array is not None:
                # A non-contiguous array: its values now, or a staging buffer written back.
                if kind == "input":
                    pool = own_pool(memoryview(np.ascontiguousarray(arg.array).reshape(-1).view(np.uint8)))
                else:
                    # Start from the array's values: bytes the driver leaves alone stay as they were.
                    staging = bytearray(np.ascontiguousarray(arg.array).tobytes())
                    pool = own_pool(staging)
                    write_backs.append(lambda a=arg.array, b=staging: _write_back(a, b))
                return RequestArgument(False, DataLocation(pool, 0, arg.length), list(arg.dimensions))
            if isinstance(arg.pool, Memory) and arg.pool._direct:
                # A file that may be truncated at any time is read and written with pread /
                # pwrite, one private buffer per argument.
                memory = arg.pool
                if kind == "input":
                    pool = own_pool(bytearray(memory._read(call, arg.offset, arg.length)))
                else:
                    staging = bytearray(memory._read(call, arg.offset, arg.length))
                    pool = own_pool(staging)
                    write_backs.append(lambda m=memory, o=arg.offset, b=staging, c=call: m._write(c, o, b))
                return RequestArgument(False, DataLocation(pool, 0, arg.length), list(arg.dimensions))
            dimensions = arg.dimensions
            if isinstance(arg.pool, Memory):
                arg.pool._check_file_size(call)
                if kind == "input" and arg.pool._desc is not None:
                    dimensions = arg.pool._dims  # as last written (checked at the start)
            if id(arg.pool) not in pool_ids:
                buffer = arg.pool._pool() if isinstance(arg.pool, Memory) else arg.pool
                pool_ids[id(arg.pool)] = own_pool(buffer)
            return RequestArgument(False, DataLocation(pool_ids[id(arg.pool)], arg.offset, arg.length),
                                   list(dimensions))

        inputs = [argument(i, self._inputs[i], "input") for i in range(len(self._input_types))]
        outputs = [argument(i, self._outputs[i], "output") for i in range(len(self._output_types))]
        return Request(inputs, outputs, pools), write_backs

    @tracing.traced("execute", "execution")
    def _run(self, burst=None, deadline_ns: int | None = None, fenced: bool = False,
             duration_ns: int = 0) -> None:
        """Run on the device; record shapes, timing and status; raise on failure. A
        fenced run goes through the plan's execute_fenced, ``duration_ns`` (0: none)
        counting from when its fences are signalled."""
        if deadline_ns is None and self._timeout_ns:
            deadline_ns = time.monotonic_ns() + self._timeout_ns
        prepared = self._compilation._plan
        error: NnapiError | None = None
        try:
            if self._compilation._freed or prepared is None:
                raise BadStateError("compute: the compilation was freed")
            runner = burst._hal_burst if burst is not None else prepared
            bound = self._bound
            if bound is not None and bound[0] is runner and not fenced:
                shapes, timing = bound[1].execute(deadline_ns)
            else:
                request, write_backs = self._request()
                if fenced:
                    shapes, timing = self._run_fenced(prepared, request, deadline_ns, duration_ns)
                elif self._reusable and not write_backs and self._bindable():
                    # The arguments are fixed from now on: the request is bound once.
                    hal_execution = runner.create_reusable_execution(request, self._measure, self._loop_timeout_ns)
                    self._bound = (runner, hal_execution)
                    self._bound_memories = self._memories()
                    shapes, timing = hal_execution.execute(deadline_ns)
                else:
                    shapes, timing = runner.execute(request, self._measure, deadline_ns, self._loop_timeout_ns)
                for write_back in write_backs:
                    write_back()
            self._output_shapes, self._timing = shapes, timing
        except Exception as caught:  # noqa: BLE001 - never leak a raw exception from a driver
            error = self._failure(caught)
        if error is None and self._bound is not None:  # a bound request's success: nothing else to record
            self._status = _NO_ERROR
            with self._lock:
                self._state = _COMPLETED
                if self._freed:  # freed while it ran: drop the arguments now (see _release)
                    self._drop_arguments()
            return
        self._complete(error)

    def _failure(self, caught: Exception) -> NnapiError:
        """The error a failed run raises, with the output shapes and timing it leaves."""
        self._timing = _UNMEASURED
        self._output_shapes = None
        if isinstance(caught, HalError):
            # a status that is no failing ErrorStatus (a driver's own HalError not contained
            # on its way here, the fenced callback's status): GENERAL_FAILURE
            caught = contain("the driver", "the execution", caught)
            # An in-process driver may carry the exact result code the HAL status stands for.
            code = getattr(caught, "result_code", None) or caught.status.to_result_code()
            if caught.status == ErrorStatus.OUTPUT_INSUFFICIENT_SIZE:
                self._output_shapes = caught.output_shapes
            return error_for(code, self._insufficient_message(caught))
        if isinstance(caught, MemoryError):
            return OutOfMemoryError("compute: out of memory")
        if isinstance(caught, NnapiError):
            return caught
        return OpFailedError(f"{type(caught).__name__}: {caught}")

    def _complete(self, error: NnapiError | None) -> None:
        """Record the end of a run (its status, memories from a MemoryDesc written or not)
        and raise ``error`` if it failed."""
        self._status = error.code if error is not None else _NO_ERROR
        if self._bound is None:  # a bound request has no memories from a MemoryDesc
            for position, argument in list(self._outputs.items()):
                if isinstance(argument.pool, Memory) and argument.pool.is_from_desc:
                    argument.pool._initialized = error is None
                    if error is None and self._output_shapes is not None and position < len(self._output_shapes):
                        argument.pool._dims = tuple(self._output_shapes[position].dimensions)
        with self._lock:
            self._state = _COMPLETED
            if self._freed:  # freed while it ran: drop the arguments now (see _release)
                self._drop_arguments()
        if error is not None:
            vlog.execution.debug("execution failed: %s: %s", error.code.name, error)
            raise error

    def _run_fenced(self, plan, request: Request, deadline_ns: int | None, duration_ns: int
                    ) -> tuple[list[OutputShape], Timing]:
        fence, callback = plan.execute_fenced(request, [], self._measure, deadline_ns, self._loop_timeout_ns,
                                              duration_ns or None)
        if fence is not None:
            try:
                wait_for_fences([fence])
            finally:
                os.close(fence)
        info = callback.get_execution_info()
        if not (isinstance(info, tuple | list) and len(info) == 3 and isinstance(info[1], Timing)
                and isinstance(info[2], Timing)):  # a driver's answer: (status, timing launched, timing fenced)
            raise HalError(ErrorStatus.GENERAL_FAILURE, f"the fenced execution's callback answered {info!r:.100}, "
                                                        "not (status, timing, timing)")
        status, launched, fenced_timing = info
        if status != ErrorStatus.NONE:
            raise HalError(status, "the fenced execution failed")
        self._fenced_timing = fenced_timing
        # Outputs of a fenced execution are fully specified (checked at the call).
        shapes = [OutputShape(list(self._outputs[i].dimensions or self._output_types[i].dimensions), True)
                  for i in range(len(self._output_types))]
        return shapes, launched

    def _insufficient_message(self, hal_error: HalError) -> str:
        """For OUTPUT_INSUFFICIENT_SIZE: which outputs are too small and what they need."""
        if hal_error.status != ErrorStatus.OUTPUT_INSUFFICIENT_SIZE or not hal_error.output_shapes:
            return str(hal_error)
        if self._array_count:
            self._materialize()
        parts = []
        for position, shape in enumerate(hal_error.output_shapes):
            if shape.is_sufficient or position >= len(self._output_types):
                continue
            needed = self._output_types[position].with_dimensions(tuple(shape.dimensions))
            given = self._outputs[position].length if position in self._outputs else 0
            size = needed.byte_size() if needed.is_fully_specified else "more"
            parts.append(f"output {position} needs {size} bytes (shape {list(shape.dimensions)}), got {given}")
        return f"{hal_error}: {'; '.join(parts)}" if parts else str(hal_error)

    def compute(self) -> None:
        """ANeuralNetworksExecution_compute: run synchronously."""
        table = self._table
        if not tracing.state.enabled:
            if self._array_count == table.n_total and self._usual:
                # The usual execution (see _Table): every argument an array set as it is, run once.
                if self._run_short(_PREPARATION, table.run, self._arrays, self._loop_timeout_ns):
                    return
            elif (bound := self._bound) is not None and not self._bound_memories \
                    and bound[0] is self._compilation._plan:
                # A reusable execution whose request is bound (by an earlier compute).
                if self._run_short(_COMPLETED, bound[1].execute):
                    return
        self._begin("compute")
        self._run()

    def _run_short(self, state: object, run: Callable[..., tuple[list[OutputShape], Timing]], *args: Any) -> bool:
        """compute as _begin and _run give it, in fewer steps (what is left between two
        model runs): ``run(deadline_ns, *args)`` where the execution is in ``state`` and
        neither it nor its compilation is freed; False, having done nothing, otherwise (the
        general path then gives the answer)."""
        with _STATE_LOCK:
            ready = self._state is state and not self._freed and not self._compilation._freed
            if ready:
                self._state = _COMPUTING
        if not ready:
            return False
        deadline_ns = time.monotonic_ns() + self._timeout_ns if self._timeout_ns else None
        try:
            self._output_shapes, self._timing = run(deadline_ns, *args)
        except Exception as caught:  # noqa: BLE001 - never leak a raw exception from a driver
            self._complete(self._failure(caught))
        self._status = _NO_ERROR
        with _STATE_LOCK:
            self._state = _COMPLETED
            if self._freed:  # freed while it ran: drop the arguments now (see _release)
                self._drop_arguments()
        return True

    def burst_compute(self, burst) -> None:
        """ANeuralNetworksExecution_burstCompute: run synchronously on ``burst``."""
        from nnapi.burst import Burst

        if burst is None:
            raise UnexpectedNullError("burst_compute: burst is None")
        if not isinstance(burst, Burst):
            raise BadDataError("burst_compute: expected a Burst")
        burst._check_alive("burst_compute")
        if burst._compilation is not self._compilation:
            raise BadDataError("burst_compute: the burst belongs to another compilation")
        if not burst._busy.acquire(blocking=False):
            raise BadStateError("burst_compute: the burst is running another execution")
        try:
            self._begin("burst_compute")
            self._run(burst)
        finally:
            burst._busy.release()

    def start_compute(self) -> Event:
        """ANeuralNetworksExecution_startCompute: run asynchronously; wait on the Event."""
        return self.start_compute_with_dependencies([], 0, call="start_compute")

    def start_compute_with_dependencies(self, dependencies, duration_ns: int = 0, *,
                                        call: str = "start_compute_with_dependencies") -> Event:
        """ANeuralNetworksExecution_startComputeWithDependencies: run once every event in
        ``dependencies`` is signalled; ``duration_ns`` (0 for none) bounds the run."""
        events = check_events(dependencies, call)
        fenced = call != "start_compute"
        if not isinstance(duration_ns, int) or isinstance(duration_ns, bool) or duration_ns < 0:
            raise BadDataError(f"{call}: duration must be a non-negative int")
        if duration_ns and not self._compilation.single_explicit_device:
            raise BadDataError(f"{call}: a duration needs a compilation created for exactly one device")
        if fenced:
            self._check_fenced_call(call, events)
        # set_timeout's deadline counts from this call; the duration from the dependencies' end.
        call_deadline = time.monotonic_ns() + self._timeout_ns if self._timeout_ns else None
        self._begin(call)
        event = Event._new()
        event._fenced = fenced
        try:
            POOL.reserve(call)
        except NnapiError:
            self._state = self._previous_state
            raise
        pending = [len(events)]
        failures: list[NnapiError] = []
        lock = threading.Lock()

        def work() -> None:
            if failures:
                self._status, self._state = failures[0].code, _COMPLETED
                event._signal(OpFailedError(f"{call}: a dependency failed: {failures[0]}"))
                return
            try:
                if fenced:
                    self._run(deadline_ns=call_deadline, fenced=True, duration_ns=duration_ns)
                else:
                    self._run(deadline_ns=call_deadline)
            except NnapiError as failed:
                event._signal(failed)
                return
            event._signal(None)

        def submit() -> None:
            if not POOL.submit(work):
                POOL.cancel()
                self._status, self._state = ResultCode.RESOURCE_EXHAUSTED_TRANSIENT, _COMPLETED
                event._signal(ResourceExhaustedTransientError(f"{call}: no worker thread available"))

        def dependency_done(error: NnapiError | None) -> None:
            with lock:
                if pending[0] < 0:  # the start was called off (see below)
                    return
                if error is not None:
                    failures.append(error)
                pending[0] -= 1
                last = pending[0] == 0
            if last:
                submit()

        for dependency in events:
            # Dependencies are followed through their own state (or a duplicate of their
            # fence), so the caller may free them as soon as this returns.
            try:
                dependency._when_done(dependency_done, call)
            except NnapiError:
                # Out of descriptors or threads: call the start off and leave the execution
                # as it was; dependencies already followed report to nobody.
                with lock:
                    pending[0] = -1
                POOL.cancel()
                self._state = self._previous_state
                raise
        if not events:
            submit()
        return event

    def _check_fenced_call(self, call: str, events: list[Event]) -> None:
        """The NDK's checks at startComputeWithDependencies: every output fully specified
        (BAD_DATA), no dependency already failed (OP_FAILED)."""
        with self._lock:
            if self._array_count:
                self._materialize()
        for position in range(len(self._output_types)):
            argument = self._outputs.get(position)
            if argument is None:
                continue  # _begin reports the missing output
            declared = self._output_types[position]
            if declared.is_tensor and not declared.with_dimensions(
                    argument.dimensions or declared.dimensions).is_fully_specified:
                raise BadDataError(f"{call}: output {position} has unspecified dimensions "
                                   f"{list(argument.dimensions or declared.dimensions)}; a fenced execution "
                                   "needs fully specified outputs")
        for position, event in enumerate(events):
            failure = event._failure()
            if failure is not None:
                raise OpFailedError(f"{call}: dependency {position} already failed: {failure}")

    # --- results ---------------------------------------------------------------------
    def _check_completed(self, call: str, index: int) -> OutputShape:
        self._check_alive(call)
        if self._state != _COMPLETED:
            raise BadStateError(f"{call}: the execution has not completed")
        if not isinstance(index, int) or not 0 <= index < len(self._output_types):
            raise BadDataError(f"{call}: output index {index!r} out of range")
        if self._output_shapes is None:
            raise BadStateError(f"{call}: the last computation failed ({self._status.name})")
        return self._output_shapes[index]

    def _shape_of(self, call: str, index: int) -> OutputShape:
        shape = self._check_completed(call, index)
        if not shape.is_sufficient:
            # The NDK reports OUTPUT_INSUFFICIENT_SIZE for the output whose buffer was too
            # small; the error carries the dimensions it needs.
            error = OutputInsufficientSizeError(f"{call}: output {index} was given too small a buffer; it needs "
                                                f"dimensions {list(shape.dimensions)}")
            error.dimensions = list(shape.dimensions)
            raise error
        return shape

    def get_output_operand_rank(self, index: int) -> int:
        """ANeuralNetworksExecution_getOutputOperandRank. OUTPUT_INSUFFICIENT_SIZE (the
        error's ``dimensions`` hold the needed shape) for an output whose buffer was too small."""
        return len(self._shape_of("get_output_operand_rank", index).dimensions)

    def get_output_operand_dimensions(self, index: int) -> list[int]:
        """ANeuralNetworksExecution_getOutputOperandDimensions. OUTPUT_INSUFFICIENT_SIZE
        (the error's ``dimensions`` hold the needed shape) for an output whose buffer was
        too small; BAD_DATA for a scalar output."""
        shape = self._shape_of("get_output_operand_dimensions", index)
        if not self._output_types[index].is_tensor:
            raise BadDataError("get_output_operand_dimensions: the output is a scalar")
        return list(shape.dimensions)

    def is_output_sufficient(self, index: int) -> bool:
        return self._check_completed("is_output_sufficient", index).is_sufficient

    def get_duration(self, duration_code: int) -> int:
        """ANeuralNetworksExecution_getDuration, in nanoseconds; DURATION_UNAVAILABLE
        (UINT64_MAX) when not measured."""
        self._check_alive("get_duration")
        if self._state != _COMPLETED:
            raise BadStateError("get_duration: the execution has not completed")
        try:
            code = DurationCode(duration_code)
        except ValueError:
            raise BadDataError(f"get_duration: invalid duration code {duration_code!r}") from None
        if not self._measure or self._status != _NO_ERROR:
            return DURATION_UNAVAILABLE
        if code == DurationCode.DURATION_ON_HARDWARE:
            return self._timing.time_on_device
        if code == DurationCode.DURATION_IN_DRIVER:
            return self._timing.time_in_driver
        fenced = self._fenced_timing  # only a fenced execution has these
        if fenced is None:
            return DURATION_UNAVAILABLE
        return fenced.time_on_device if code == DurationCode.FENCED_DURATION_ON_HARDWARE else fenced.time_in_driver

    def _release(self) -> None:
        # The NDK lets an execution be freed while it runs: the computation keeps its
        # arguments and drops them when it ends.
        with self._lock:
            if self._state != _COMPUTING:
                self._drop_arguments()

    def _drop_arguments(self) -> None:
        self.__dict__.pop("_inputs", None)
        self.__dict__.pop("_outputs", None)
        self._arrays = [None] * self._table.n_total
        self._array_count = 0
        self._bound = None


def _write_back(array: np.ndarray, staging: bytearray) -> None:
    """Copy a computed output from its staging buffer into the caller's strided array."""
    array[...] = np.frombuffer(staging, dtype=array.dtype).reshape(array.shape)


