"""MemoryDesc: ANeuralNetworksMemoryDesc_*, and the device memories made from one.

A memory descriptor lists the roles (compilation + input/output index) a memory will
play; ``Memory.from_desc`` then allocates a driver-managed memory for them. Such memory
has no CPU mapping: data gets in and out through executions and ``Memory.copy``, and it
must have been written (as an output, or as a copy's destination) before it is read.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from nnapi.errors import BadDataError, BadStateError, OpFailedError, OutOfMemoryError, UnexpectedNullError
from nnapi.memory import MemorySource
from nnapi.operand import OperandType
from nnapi.operations.base import MAX_OPERAND_BYTES


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
        self._roles: list[tuple[object, str, int]] = []
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
        from nnapi.compilation import Compilation

        self._check_modifiable(call)
        if compilation is None:
            raise UnexpectedNullError(f"{call}: compilation is None")
        if not isinstance(compilation, Compilation):
            raise BadDataError(f"{call}: expected a Compilation")
        compilation._check_alive(call)
        if not compilation.is_finished:
            raise BadDataError(f"{call}: the compilation is not finished")
        model = compilation.model
        indexes = model.inputs if kind == "input" else model.outputs
        if not isinstance(index, int) or not 0 <= index < len(indexes):
            raise BadDataError(f"{call}: {kind} index {index!r} out of range")
        if not isinstance(frequency, int | float) or not 0.0 < frequency <= 1.0:
            raise BadDataError(f"{call}: frequency must be in (0.0, 1.0], got {frequency!r}")
        if any(c is compilation and k == kind and i == index for c, k, i in self._roles):
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
        self._roles.append((compilation, kind, index))

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
        self._check_alive("Memory.from_desc")
        if not self._finished:
            raise BadStateError("Memory.from_desc: the memory descriptor is not finished")
        assert self._type is not None
        full = self._type.with_dimensions(self._dimensions)
        if not full.is_fully_specified:
            raise OpFailedError("Memory.from_desc: nnapi-reference needs fully specified dimensions")
        size = full.byte_size()
        if size > MAX_OPERAND_BYTES:
            raise OutOfMemoryError(f"Memory.from_desc: {full.describe()} needs {size} bytes, more than "
                                   f"an operand may hold ({MAX_OPERAND_BYTES})")
        try:
            buffer = bytearray(size)
        except MemoryError:
            raise OutOfMemoryError(f"Memory.from_desc: cannot allocate {size} bytes") from None
        memory = memory_class._wrap(None, 0, size, True, None)
        memory._desc = self
        memory._device_buffer = buffer
        memory._initialized = False
        return memory

    def check_role(self, call: str, compilation, kind: str, index: int, op_type: OperandType) -> None:
        if not any(c is compilation and k == kind and i == index for c, k, i in self._roles):
            raise BadDataError(f"{call}: the memory was not described for {kind} {index} of this compilation")


def copy_device_memory(src, dst) -> None:
    """Memory.copy when either side came from a MemoryDesc."""
    if src.is_from_desc and not src._initialized:
        raise BadDataError("Memory.copy: the source memory has not been written yet")
    if src.is_from_desc and dst.is_from_desc:
        if not _compatible(src._desc.dimensions, dst._desc.dimensions):
            raise BadDataError("Memory.copy: incompatible dimensions")
    if src.size != dst.size:
        raise BadDataError(f"Memory.copy: sizes differ ({src.size} and {dst.size})")
    if not dst._writable:
        raise BadDataError("Memory.copy: destination is read-only")
    data = memoryview(src._pool()) if src.is_from_desc else src._read("Memory.copy", 0, src.size)
    if dst.is_from_desc:
        memoryview(dst._pool())[:] = data
    else:
        dst._write("Memory.copy", 0, data)
    if dst.is_from_desc:
        dst._initialized = True
