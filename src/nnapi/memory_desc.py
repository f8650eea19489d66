"""MemoryDesc: ANeuralNetworksMemoryDesc_*, and the device memories made from one.

A memory descriptor lists the roles (compilation + input/output index) a memory will
play; ``Memory.from_desc`` then allocates a driver-managed memory for them. Such memory
has no CPU mapping: data gets in and out through executions and ``Memory.copy``, and it
must have been written (as an output, or as a copy's destination) before it is read.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from nnapi import vlog
from nnapi.errors import (
    BadDataError,
    BadStateError,
    NnapiError,
    OpFailedError,
    OutOfMemoryError,
    UnexpectedNullError,
    error_for,
)
from nnapi.hal import BufferDesc, BufferRole, ErrorStatus, HalError, IDevice, IPreparedModel
from nnapi.memory import MemorySource
from nnapi.operand import MAX_OPERAND_BYTES, OperandType
from nnapi.runtime.device_memory import DeviceMemoryPool
from nnapi.runtime.execution_plan import contain


def _compatible(a: Sequence[int], b: Sequence[int]) -> bool:
    """The NDK's rule: incompatible when both ranks are known and differ, or an axis is
    known in both with different sizes."""
    if not a or not b:
        return True
    return len(a) == len(b) and all(x == 0 or y == 0 or x == y for x, y in zip(a, b, strict=True))


def _combine(a: Sequence[int], b: Sequence[int]) -> tuple[int, ...]:
    if not a:
        return tuple(b)
    if not b:
        return tuple(a)
    return tuple(x or y for x, y in zip(a, b, strict=True))


class MemoryDesc(MemorySource):
    """ANeuralNetworksMemoryDesc (ANeuralNetworksMemoryDesc_create)."""

    def __init__(self) -> None:
        self._roles: list[tuple[object, str, int, float]] = []  # (compilation, kind, index, frequency)
        self._type: OperandType | None = None
        self._dimensions: tuple[int, ...] = ()
        self._finished = False

    def _check_modifiable(self, call: str) -> None:
        self._check_alive(call)
        if self._finished:
            raise BadStateError(f"{call}: the memory descriptor is finished")

    @property
    def dimensions(self) -> tuple[int, ...]:
        return self._dimensions

    def _add_role(self, call: str, compilation, kind: str, index: int, frequency: float) -> None:
        from nnapi.compilation import finished_compilation

        self._check_modifiable(call)
        compilation = finished_compilation(compilation, call, unfinished=BadDataError)
        model = compilation.model
        indexes = model.inputs if kind == "input" else model.outputs
        if not isinstance(index, int) or not 0 <= index < len(indexes):
            raise BadDataError(f"{call}: {kind} index {index!r} out of range")
        if not isinstance(frequency, int | float) or not 0.0 < frequency <= 1.0:
            raise BadDataError(f"{call}: frequency must be in (0.0, 1.0], got {frequency!r}")
        if any(c is compilation and k == kind and i == index for c, k, i, _ in self._roles):
            raise BadDataError(f"{call}: this {kind} role was already added")
        op_type = model.operand_type(indexes[index])
        if self._type is not None:
            if (op_type.type, op_type.scale, op_type.zero_point, op_type.channel_quant) != (
                    self._type.type, self._type.scale, self._type.zero_point, self._type.channel_quant):
                raise BadDataError(f"{call}: operand type {op_type.describe()} differs from the other roles' "
                                   f"{self._type.describe()}")
        if not _compatible(self._dimensions, op_type.dimensions):
            raise BadDataError(f"{call}: dimensions {list(op_type.dimensions)} are incompatible with "
                               f"{list(self._dimensions)}")
        if not op_type.is_tensor and self._dimensions:
            raise BadDataError(f"{call}: a scalar role, but dimensions {list(self._dimensions)} were set")
        self._type = op_type if self._type is None else self._type
        self._dimensions = _combine(self._dimensions, op_type.dimensions)
        self._roles.append((compilation, kind, index, float(frequency)))

    def add_input_role(self, compilation, index: int, frequency: float = 1.0) -> None:
        """ANeuralNetworksMemoryDesc_addInputRole."""
        self._add_role("add_input_role", compilation, "input", index, frequency)

    def add_output_role(self, compilation, index: int, frequency: float = 1.0) -> None:
        """ANeuralNetworksMemoryDesc_addOutputRole."""
        self._add_role("add_output_role", compilation, "output", index, frequency)

    def set_dimensions(self, dimensions: Sequence[int]) -> None:
        """ANeuralNetworksMemoryDesc_setDimensions (0 = unknown axis; [] for scalars)."""
        self._check_modifiable("set_dimensions")
        if dimensions is None:
            raise UnexpectedNullError("set_dimensions: dimensions is None")
        if isinstance(dimensions, str | bytes) or not hasattr(dimensions, "__iter__"):
            raise BadDataError(f"set_dimensions: expected a sequence of ints, got {dimensions!r}")
        dims = tuple(dimensions)
        if not all(isinstance(d, int | np.integer) and not isinstance(d, bool) for d in dims):
            raise BadDataError(f"set_dimensions: dimensions must be ints, got {list(dims)!r}")
        dims = tuple(int(d) for d in dims)
        if any(not 0 <= d < 2**32 for d in dims):
            raise BadDataError(f"set_dimensions: dimensions must be in [0, 2**32), got {list(dims)}")
        if self._type is not None and not self._type.is_tensor and dims:
            raise BadDataError("set_dimensions: a scalar has rank 0")
        if not _compatible(self._dimensions, dims):
            raise BadDataError(f"set_dimensions: {list(dims)} incompatible with {list(self._dimensions)}")
        self._dimensions = _combine(self._dimensions, dims)

    def finish(self) -> None:
        """ANeuralNetworksMemoryDesc_finish."""
        self._check_modifiable("finish")
        if not self._roles:
            raise BadDataError("finish: add at least one input or output role first")
        self._finished = True

    # --- used by Memory and Execution ----------------------------------------------
    def _copy_device_memory(self, src, dst) -> None:
        copy_device_memory(src, dst)

    def _allocate(self, memory_class):
        """ANeuralNetworksMemory_createFromDesc, as Android's MemoryBuilder::allocate: when
        every role's compilation step runs on one device, that device allocates; if it
        cannot (or the roles span devices) the runtime holds the memory itself, unless a
        role's compilation named its devices or the size is unknown (then the failure is
        the result: OP_FAILED, or the driver's error)."""
        self._check_alive("Memory.from_desc")
        if not self._finished:
            raise BadStateError("Memory.from_desc: the memory descriptor is not finished")
        assert self._type is not None
        full = self._type.with_dimensions(self._dimensions)
        size = full.byte_size() if full.is_fully_specified else 0
        if size > MAX_OPERAND_BYTES:
            raise OutOfMemoryError(f"Memory.from_desc: {full.describe()} needs {size} bytes, more than "
                                   f"an operand may hold ({MAX_OPERAND_BYTES})")
        failure: NnapiError | None = None
        allocator, prepared, input_roles, output_roles = self._device_roles()
        if allocator is not None:
            try:
                buffer, token = allocator.allocate(BufferDesc(list(self._dimensions)), prepared, input_roles,
                                                   output_roles)
                if buffer is None or not isinstance(token, int) or isinstance(token, bool) or token <= 0:
                    raise HalError(ErrorStatus.GENERAL_FAILURE, f"returned an unusable buffer or token {token!r}")
            except Exception as error:  # noqa: BLE001 - a driver's failure is contained, maybe fallen back from
                hal_error = contain(allocator.name, "allocate", error)
                failure = error_for(getattr(hal_error, "result_code", None) or hal_error.status.to_result_code(),
                                    f"Memory.from_desc: {allocator.name} could not allocate: {hal_error}")
                vlog.execution.debug("%s", failure)
            else:
                memory = self._new_memory(memory_class, size)
                memory._ibuffer = buffer
                memory._allocator = allocator
                memory._hal_pool = DeviceMemoryPool(token, allocator, buffer, size)
                return memory
        if any(compilation._explicit_devices for compilation, _, _, _ in self._roles):
            raise failure or OpFailedError("Memory.from_desc: the roles' compilations run on more than one device, "
                                           "and a compilation created for explicit devices allows no fallback")
        if not size:
            raise failure or OpFailedError(f"Memory.from_desc: {full.describe()} has unknown dimensions, which "
                                           "only a device could allocate")
        memory = self._new_memory(memory_class, size)
        try:
            memory._device_buffer = bytearray(size)
        except MemoryError:
            raise OutOfMemoryError(f"Memory.from_desc: cannot allocate {size} bytes") from None
        return memory

    def _new_memory(self, memory_class, size: int):
        memory = memory_class._wrap(None, 0, size, True, None)
        memory._desc = self
        memory._initialized = False
        memory._dims = self._dimensions
        return memory

    def _device_roles(self) -> tuple[IDevice | None, list[IPreparedModel], list[BufferRole], list[BufferRole]]:
        """The HAL view of the roles (Android's forEachStepRoleOfInput / Output): each
        role becomes the roles of the plan steps that read that input or write that output,
        with the step's own input / output position; plus the device all those steps run
        on (None when they run on several, or on none)."""
        prepared: list[IPreparedModel] = []
        input_roles: list[BufferRole] = []
        output_roles: list[BufferRole] = []
        devices: list[IDevice] = []
        for compilation, kind, index, frequency in self._roles:
            plan = compilation._plan
            if plan is None:  # freed since the role was added
                return None, [], [], []
            main = plan.model.main
            operand = (main.input_indexes if kind == "input" else main.output_indexes)[index]
            for step in plan.steps:
                positions = step.inputs if kind == "input" else step.outputs
                if operand not in positions or step.prepared is None:
                    continue
                model_index = next((i for i, p in enumerate(prepared) if p is step.prepared), None)
                if model_index is None:
                    model_index = len(prepared)
                    prepared.append(step.prepared)
                if not any(d is step.device for d in devices):
                    devices.append(step.device)
                role = BufferRole(model_index, positions.index(operand), float(frequency))
                (input_roles if kind == "input" else output_roles).append(role)
        allocator = devices[0] if len(devices) == 1 else None
        return allocator, prepared, input_roles, output_roles

    def check_role(self, call: str, compilation, kind: str, index: int, op_type: OperandType) -> None:
        """setInputFromMemory / setOutputFromMemory with this descriptor's memory: only in
        a described role, with dimensions compatible with the descriptor's (BAD_DATA)."""
        if not any(c is compilation and k == kind and i == index for c, k, i, _ in self._roles):
            raise BadDataError(f"{call}: the memory was not described for {kind} {index} of this compilation")
        if not _compatible(op_type.dimensions, self._dimensions):
            raise BadDataError(f"{call}: dimensions {list(op_type.dimensions)} are incompatible with the memory's "
                               f"{list(self._dimensions)}")


def check_input_memory(call: str, memory, position: int, dims: tuple[int, ...]) -> None:
    """At compute, a device memory read as an input must have been written, with the
    dimensions the input is given (Android: OP_FAILED)."""
    if not memory._initialized:
        raise OpFailedError(f"{call}: input {position} reads a device memory that was never written (use it as an "
                            "output of a successful execution or as the destination of Memory.copy first)")
    if not _compatible(dims, memory._dims):
        raise OpFailedError(f"{call}: input {position} has dimensions {list(dims)}, but its device memory holds "
                            f"{list(memory._dims)}")


def _logical(memory) -> tuple[int, tuple[int, ...], OperandType | None]:
    """Android's memory metadata: the size in use, dimensions and operand type (a memory
    from a descriptor), or only the size (any other memory)."""
    if not memory.is_from_desc:
        return memory.size, (), None
    full = memory._desc._type.with_dimensions(memory._dims)
    return (full.byte_size() if full.is_fully_specified else 0), tuple(memory._dims), memory._desc._type


def copy_device_memory(src, dst) -> None:
    """ANeuralNetworksMemory_copy when either side came from a MemoryDesc (Android's
    copyInternal): the destination is written, or uninitialized again if the copy fails."""
    try:
        _copy(src, dst)
    except BaseException:
        if dst.is_from_desc:
            dst._initialized = False
        raise
    if dst.is_from_desc:
        dst._initialized = True


def _copy(src, dst) -> None:
    call = "Memory.copy"
    if src.is_from_desc and not src._initialized:
        raise BadDataError(f"{call}: the source memory has never been written")
    size, dims, op_type = _logical(src)
    new_dims = dims
    if dst.is_from_desc:
        dst_type = dst._desc._type
        if op_type is not None and (op_type.type, op_type.scale, op_type.zero_point, op_type.channel_quant) != (
                dst_type.type, dst_type.scale, dst_type.zero_point, dst_type.channel_quant):
            raise BadDataError(f"{call}: the memories hold different operand types ({op_type.describe()} and "
                               f"{dst_type.describe()})")
        if dims and not dst_type.is_tensor:
            raise BadDataError(f"{call}: dimensions {list(dims)} for a scalar memory")
        if not _compatible(dims, dst._desc.dimensions):
            raise BadDataError(f"{call}: incompatible dimensions {list(dims)} and {list(dst._desc.dimensions)}")
        new_dims = _combine(dims, dst._desc.dimensions)
        full = dst_type.with_dimensions(new_dims)
        if size and size != (full.byte_size() if full.is_fully_specified else 0):
            raise BadDataError(f"{call}: sizes differ ({size} bytes and {full.describe()})")
    else:
        if size != dst.size:
            raise BadDataError(f"{call}: sizes differ ({size} and {dst.size} bytes)")
        if not dst._writable:
            raise BadDataError(f"{call}: destination is read-only")
    try:
        _transfer(call, src, dst, size, list(dims))
    except HalError as error:
        raise error_for(getattr(error, "result_code", None) or error.status.to_result_code(),
                        f"{call}: {error}") from None
    except NnapiError:
        raise
    except MemoryError:
        raise OutOfMemoryError(f"{call}: out of memory") from None
    except Exception as error:  # a driver's raw exception never escapes
        raise OpFailedError(f"{call}: {type(error).__name__}: {error}") from None
    if dst.is_from_desc:
        dst._dims = tuple(new_dims)


def _transfer(call: str, src, dst, size: int, dims: list[int]) -> None:
    """Move the bytes: a driver's memory only through its IBuffer's copy_to / copy_from."""
    if src._ibuffer is not None:
        if dst._ibuffer is None and not dst._direct:
            src._ibuffer.copy_to(dst._pool())  # straight into the destination's bytes
            return
        staging = bytearray(size)
        src._ibuffer.copy_to(staging)
        data = staging
    elif src.is_from_desc:
        data = src._device_buffer
    else:
        data = src._read(call, 0, src.size)
    if dst._ibuffer is not None:
        dst._ibuffer.copy_from(data, dims)
    elif dst.is_from_desc:
        memoryview(dst._device_buffer)[:] = data
    else:
        dst._write(call, 0, data)
