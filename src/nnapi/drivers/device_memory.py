"""Driver-allocated device memory for the drivers that compute with the reference kernels
(nnapi-reference, the sample and fault-injecting devices): IDevice.allocate, the IBuffer it
returns, and how a request naming such memory by BufferToken is checked and run.

After Android's sample driver and its BufferTracker / ManagedBuffer: a buffer knows the
operand it holds (type, scale, zero point), its dimensions as allocated and as last
written, the roles (prepared model, input or output, index) it was allocated for, and
whether it has been written. A token is valid exactly as long as its IBuffer lives, and
only for the device that allocated it.
"""

from __future__ import annotations

import itertools
import math
import threading
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from nnapi.codes import OperandCode
from nnapi.hal.interfaces import IBuffer, IPreparedModel
from nnapi.hal.types import (
    BufferDesc,
    BufferRole,
    BufferToken,
    DataLocation,
    ErrorStatus,
    FdPool,
    HalError,
    OutputShape,
    Request,
    RequestArgument,
    is_extension_type,
    pool_view,
)
from nnapi.operand import MAX_OPERAND_BYTES, dtype_of, is_tensor

#: largest token a buffer gets (the HAL's token is a uint32)
_MAX_TOKEN = (1 << 32) - 1


def _invalid(message: str) -> HalError:
    return HalError(ErrorStatus.INVALID_ARGUMENT, message)


def combine_dimensions(a: Sequence[int], b: Sequence[int]) -> list[int] | None:
    """Two shapes merged (0 = unknown axis, [] = unknown rank); None when they contradict."""
    if not a:
        return list(b)
    if not b:
        return list(a)
    if len(a) != len(b):
        return None
    merged = []
    for x, y in zip(a, b, strict=True):
        if x and y and x != y:
            return None
        merged.append(x or y)
    return merged


@dataclass(frozen=True)
class _Role:
    prepared: IPreparedModel
    kind: str  # "input" or "output"
    index: int


class ManagedBuffer:
    """The bytes of one allocation and what the driver knows about them."""

    def __init__(self, code: OperandCode, scale: float, zero_point: int, dimensions: list[int], size: int,
                 roles: frozenset[_Role]) -> None:
        self.code = code
        self.scale = scale
        self.zero_point = zero_point
        self.initial_dimensions = list(dimensions)
        self.dimensions = list(dimensions)  # as last written
        self.size = size
        self.roles = roles
        self.data = bytearray(size)
        self.initialized = False
        self.lock = threading.Lock()

    def validate_copy_from(self, dimensions: list[int], size: int) -> list[int]:
        """The dimensions after a copy_from of ``size`` bytes with ``dimensions``."""
        if size != self.size:
            raise _invalid(f"copy_from: the source has {size} bytes, the buffer {self.size}")
        if not is_tensor(self.code):
            if dimensions:
                raise _invalid(f"copy_from: dimensions {dimensions} for a scalar buffer")
            return []
        if not dimensions:
            if not self.initial_dimensions or 0 in self.initial_dimensions:
                raise _invalid(f"copy_from: the buffer's dimensions {self.initial_dimensions} are not fully "
                               "specified and the copy gives none")
        elif 0 in dimensions:
            raise _invalid(f"copy_from: dimensions {dimensions} are not fully specified")
        combined = combine_dimensions(self.initial_dimensions, dimensions)
        if combined is None:
            raise _invalid(f"copy_from: dimensions {dimensions} are incompatible with the buffer's "
                           f"{self.initial_dimensions}")
        return combined


class BufferTracker:
    """One device's live buffers by token (Android's BufferTracker)."""

    def __init__(self) -> None:
        self._buffers: weakref.WeakValueDictionary[int, ReferenceBuffer] = weakref.WeakValueDictionary()
        self._tokens = itertools.count(1)
        self._lock = threading.Lock()

    def add(self, managed: ManagedBuffer) -> ReferenceBuffer:
        with self._lock:
            token = next(self._tokens)
            if token > _MAX_TOKEN:
                raise HalError(ErrorStatus.RESOURCE_EXHAUSTED_PERSISTENT, "allocate: out of buffer tokens")
            buffer = ReferenceBuffer(managed, token)
            self._buffers[token] = buffer
        return buffer

    def get(self, token: object) -> ManagedBuffer | None:
        if not isinstance(token, int) or isinstance(token, bool):
            return None
        buffer = self._buffers.get(token)
        return None if buffer is None else buffer.managed


class ReferenceBuffer(IBuffer):
    """IBuffer of the reference-kernel drivers: the runtime reaches the bytes only
    through copy_to / copy_from (and executions naming the token)."""

    def __init__(self, managed: ManagedBuffer, token: int) -> None:
        self.managed = managed
        self.token = token

    def copy_to(self, dst) -> None:
        """IBuffer::copyTo: the whole buffer into ``dst`` (a writable pool of its size)."""
        managed = self.managed
        view = _writable_view(dst, "copy_to: the destination")
        if view.nbytes != managed.size:
            raise _invalid(f"copy_to: the destination has {view.nbytes} bytes, the buffer {managed.size}")
        with managed.lock:
            if not managed.initialized:
                raise HalError(ErrorStatus.GENERAL_FAILURE, "copy_to: the buffer has never been written")
            view[:] = managed.data

    def copy_from(self, src, dimensions: list[int]) -> None:
        """IBuffer::copyFrom: set the buffer from ``src``; ``dimensions`` complete its shape."""
        managed = self.managed
        dims = _dimension_list(dimensions, "copy_from")
        view = pool_view(src)
        combined = managed.validate_copy_from(dims, view.nbytes)
        with managed.lock:
            managed.data[:] = view
            managed.dimensions = combined
            managed.initialized = True


def _dimension_list(dimensions, call: str) -> list[int]:
    try:
        dims = [int(d) for d in dimensions]
    except (TypeError, ValueError):
        raise _invalid(f"{call}: dimensions {dimensions!r} are not integers") from None
    if any(not 0 <= d <= _MAX_TOKEN for d in dims):
        raise _invalid(f"{call}: dimensions {dims} must be unsigned 32-bit values")
    return dims


def _writable_view(pool, what: str) -> memoryview:
    if isinstance(pool, FdPool) and not pool.writable:
        raise _invalid(f"{what} is read-only")
    view = pool_view(pool)
    if view.readonly:
        raise _invalid(f"{what} is read-only")
    return view


def allocate(tracker: BufferTracker, owns: Callable[[IPreparedModel], object], desc: BufferDesc,
             prepared_models: Sequence[IPreparedModel], input_roles: Sequence[BufferRole],
             output_roles: Sequence[BufferRole]) -> tuple[ReferenceBuffer, int]:
    """IDevice::allocate for a driver whose prepared models ``owns`` maps to their HAL
    model (None for another driver's): checks the roles as Android's validateMemoryDesc
    does (INVALID_ARGUMENT), then allocates when the size is known (GENERAL_FAILURE for
    unknown dimensions or an extension type, as Android's sample driver)."""
    try:
        prepared_models = list(prepared_models)
        dims = _dimension_list(desc.dimensions, "allocate")
        if not prepared_models:
            raise _invalid("allocate: no prepared models")
        if not input_roles and not output_roles:
            raise _invalid("allocate: no roles")
        models = []
        for position, prepared in enumerate(prepared_models):
            model = owns(prepared)
            if model is None:
                raise _invalid(f"allocate: prepared model {position} is not one of this device's")
            models.append(model)
        roles: set[_Role] = set()
        operands = []
        for kind, role_list in (("input", input_roles), ("output", output_roles)):
            for role in role_list:
                model_index, io_index, probability = role.model_index, role.io_index, role.probability
                if not isinstance(model_index, int) or not 0 <= model_index < len(models):
                    raise _invalid(f"allocate: {kind} role names prepared model {model_index!r} of "
                                   f"{len(models)}")
                main = models[model_index].main
                indexes = main.input_indexes if kind == "input" else main.output_indexes
                if not isinstance(io_index, int) or not 0 <= io_index < len(indexes):
                    raise _invalid(f"allocate: {kind} role index {io_index!r} out of range ({len(indexes)} "
                                   f"{kind}s)")
                if not isinstance(probability, int | float) or not 0.0 < probability <= 1.0:
                    raise _invalid(f"allocate: role probability {probability!r} is not in (0, 1]")
                entry = _Role(prepared_models[model_index], kind, io_index)
                if entry in roles:
                    raise _invalid(f"allocate: {kind} {io_index} of prepared model {model_index} is given twice")
                roles.add(entry)
                operands.append(main.operands[indexes[io_index]])
        first = operands[0]
        for operand in operands:
            if (operand.type, operand.scale, operand.zero_point) != (first.type, first.scale, first.zero_point):
                raise _invalid("allocate: the roles' operands differ in type, scale or zero point")
            if operand.channel_quant != first.channel_quant:
                raise _invalid("allocate: the roles' operands differ in per-channel quantization")
            combined = combine_dimensions(dims, operand.dimensions)
            if combined is None:
                raise _invalid(f"allocate: dimensions {dims} are incompatible with a role's {operand.dimensions}")
            dims = combined
    except HalError:
        raise
    except (TypeError, ValueError, AttributeError, IndexError) as error:
        raise _invalid(f"allocate: malformed arguments: {type(error).__name__}: {error}") from None
    if is_extension_type(first.type):
        raise HalError(ErrorStatus.GENERAL_FAILURE, "allocate: extension operand types are not supported")
    code = OperandCode(first.type)
    tensor = is_tensor(code)
    if not tensor and dims:
        raise _invalid(f"allocate: dimensions {dims} for a scalar operand")
    if tensor and (not dims or 0 in dims):
        raise HalError(ErrorStatus.GENERAL_FAILURE,
                       f"allocate: dimensions {dims} are not fully specified (unknown sizes are not supported)")
    size = dtype_of(code).itemsize * (math.prod(dims) if tensor else 1)
    if size > MAX_OPERAND_BYTES:
        raise HalError(ErrorStatus.RESOURCE_EXHAUSTED_PERSISTENT,
                       f"allocate: {size} bytes, more than an operand may hold ({MAX_OPERAND_BYTES})")
    try:
        managed = ManagedBuffer(code, first.scale, first.zero_point, dims, size, frozenset(roles))
    except MemoryError:
        raise HalError(ErrorStatus.RESOURCE_EXHAUSTED_TRANSIENT, f"allocate: cannot allocate {size} bytes") from None
    buffer = tracker.add(managed)
    return buffer, buffer.token


def has_tokens(request: Request) -> bool:
    """True when a request pool names device memory."""
    return any(isinstance(pool, BufferToken) for pool in request.pools)


class ResolvedRequest:
    """A request whose BufferToken pools were checked against ``prepared``'s roles (as
    Android's ManagedBuffer::validateRequest) and replaced by the buffers' bytes."""

    def __init__(self, tracker: BufferTracker | None, prepared: IPreparedModel, request: Request) -> None:
        pools = list(request.pools)
        self.outputs: list[tuple[int, ManagedBuffer]] = []  # (output position, buffer)
        buffers: dict[int, ManagedBuffer] = {}
        for index, pool in enumerate(pools):
            if not isinstance(pool, BufferToken):
                continue
            managed = tracker.get(pool.token) if tracker is not None else None
            if managed is None:
                raise _invalid(f"request pool {index}: token {pool.token!r} names no buffer of this device")
            buffers[index] = managed
            pools[index] = managed.data
        used: set[int] = set()
        inputs = list(request.inputs)
        for position, argument in enumerate(inputs):
            managed = self._buffer_of(argument, buffers)
            if managed is None:
                continue
            if _Role(prepared, "input", position) not in managed.roles:
                raise _invalid(f"input {position}: the device memory was not allocated for this input")
            if not managed.initialized:
                raise HalError(ErrorStatus.GENERAL_FAILURE,
                               f"input {position}: the device memory has never been written")
            if combine_dimensions(managed.dimensions, argument.dimensions) is None:
                raise _invalid(f"input {position}: dimensions {list(argument.dimensions)} differ from the device "
                               f"memory's {managed.dimensions}")
            inputs[position] = self._whole(argument, managed, managed.dimensions)
            used.add(id(managed))
        outputs = list(request.outputs)
        for position, argument in enumerate(outputs):
            managed = self._buffer_of(argument, buffers)
            if managed is None:
                continue
            if id(managed) in used:
                raise _invalid(f"output {position}: the same device memory is used as an input or another output")
            if _Role(prepared, "output", position) not in managed.roles:
                raise _invalid(f"output {position}: the device memory was not allocated for this output")
            if combine_dimensions(managed.initial_dimensions, argument.dimensions) is None:
                raise _invalid(f"output {position}: dimensions {list(argument.dimensions)} are incompatible with "
                               f"the device memory's {managed.initial_dimensions}")
            outputs[position] = self._whole(argument, managed, argument.dimensions)
            used.add(id(managed))
            self.outputs.append((position, managed))
        self.request = Request(inputs, outputs, pools)

    @staticmethod
    def _buffer_of(argument: RequestArgument, buffers: dict[int, ManagedBuffer]) -> ManagedBuffer | None:
        if argument.has_no_value:
            return None
        return buffers.get(argument.location.pool_index)

    @staticmethod
    def _whole(argument: RequestArgument, managed: ManagedBuffer, dimensions) -> RequestArgument:
        """The argument covering the whole buffer; a device memory's location is offset 0
        and either length 0 (the whole memory) or exactly its size."""
        location = argument.location
        if location.offset != 0 or location.length not in (0, managed.size):
            raise _invalid(f"a device memory argument must cover the whole memory (offset 0, length 0 or "
                           f"{managed.size}), got offset {location.offset} length {location.length}")
        return RequestArgument(False, DataLocation(location.pool_index, 0, managed.size), list(dimensions))

    def failed(self, error: HalError) -> HalError:
        """After a failed execution: written device memories are uninitialized again, and
        an output device memory too small for its result is the caller's dimensions'
        fault (GENERAL_FAILURE, as Android's sample driver reports it)."""
        for _, managed in self.outputs:
            with managed.lock:
                managed.initialized = False
        if error.status == ErrorStatus.OUTPUT_INSUFFICIENT_SIZE:
            for position, _ in self.outputs:
                if position < len(error.output_shapes) and not error.output_shapes[position].is_sufficient:
                    return HalError(ErrorStatus.GENERAL_FAILURE,
                                    f"output {position}: the device memory's dimensions cannot hold the result "
                                    f"{error.output_shapes[position].dimensions}")
        return error

    def succeeded(self, shapes: list[OutputShape]) -> None:
        """After a successful execution: output device memories hold their results."""
        for position, managed in self.outputs:
            dims = list(shapes[position].dimensions) if position < len(shapes) else []
            combined = combine_dimensions(managed.initial_dimensions, dims)
            with managed.lock:
                managed.dimensions = combined if combined is not None else dims
                managed.initialized = True
