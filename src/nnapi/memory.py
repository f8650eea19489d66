"""Memory: shared memory for operand values and execution arguments.

Mirrors ANeuralNetworksMemory_createFromFd, _createFromDesc, _copy and _free, plus
``Memory.create_shared(size)``, the usual way to get a fresh shared region (memfd +
mmap) on Linux, where Android would use ASharedMemory.
"""

from __future__ import annotations

import mmap
import os
import weakref

from nnapi._object import NnapiObject
from nnapi.errors import BadDataError, BadStateError, UnexpectedNullError, UnmappableError

PROT_READ = mmap.PROT_READ
PROT_WRITE = mmap.PROT_WRITE


class Memory(NnapiObject):
    """ANeuralNetworksMemory. ``buffer`` is a memoryview of the mapped bytes."""

    def __init__(self) -> None:
        raise TypeError("use Memory.create_shared, Memory.from_fd or Memory.from_desc")

    @classmethod
    def _wrap(cls, mapping: mmap.mmap | None, offset: int, size: int, writable: bool, fd: int | None) -> Memory:
        memory = object.__new__(cls)
        memory._mapping = mapping
        memory._offset = offset
        memory._size = size
        memory._writable = writable
        memory._fd = fd
        # Close the descriptor when the Memory is collected, even if free() never ran; the
        # mapping itself lives as long as any view of it.
        memory._close_fd = weakref.finalize(memory, os.close, fd) if fd is not None else None
        memory._desc = None
        memory._device_buffer = None
        return memory

    @classmethod
    def create_shared(cls, size: int) -> Memory:
        """A new zero-filled shared memory region of ``size`` bytes (memfd + mmap)."""
        if not isinstance(size, int) or size <= 0:
            raise BadDataError(f"Memory.create_shared: size must be a positive int, got {size!r}")
        fd = os.memfd_create("nnapi-memory", os.MFD_CLOEXEC)
        try:
            os.ftruncate(fd, size)
            mapping = mmap.mmap(fd, size, mmap.MAP_SHARED, PROT_READ | PROT_WRITE)
        except OSError as error:
            os.close(fd)
            raise UnmappableError(f"Memory.create_shared: {error}") from None
        return cls._wrap(mapping, 0, size, True, fd)

    @classmethod
    def from_fd(cls, size: int, prot: int, fd: int, offset: int = 0) -> Memory:
        """ANeuralNetworksMemory_createFromFd: map ``size`` bytes of ``fd`` at ``offset``.

        ``prot`` is PROT_READ, optionally with PROT_WRITE. The descriptor is duplicated,
        so the caller may close its own.
        """
        if fd is None:
            raise UnexpectedNullError("Memory.from_fd: fd is None")
        if not isinstance(size, int) or size <= 0:
            raise BadDataError(f"Memory.from_fd: size must be positive, got {size!r}")
        if not isinstance(offset, int) or offset < 0:
            raise BadDataError(f"Memory.from_fd: offset must be non-negative, got {offset!r}")
        if prot not in (PROT_READ, PROT_READ | PROT_WRITE):
            raise BadDataError(f"Memory.from_fd: prot must be PROT_READ or PROT_READ|PROT_WRITE, got {prot!r}")
        try:
            own_fd = os.dup(fd)
        except (OSError, TypeError) as error:
            raise BadDataError(f"Memory.from_fd: bad file descriptor {fd!r}: {error}") from None
        # mmap offsets must be page aligned; map from the page below and remember the rest.
        page_offset = offset - offset % mmap.ALLOCATIONGRANULARITY
        try:
            mapping = mmap.mmap(own_fd, size + offset - page_offset, mmap.MAP_SHARED, prot,
                                offset=page_offset)
        except (OSError, ValueError) as error:
            os.close(own_fd)
            raise UnmappableError(f"Memory.from_fd: cannot map {size} bytes at {offset}: {error}") from None
        return cls._wrap(mapping, offset - page_offset, size, bool(prot & PROT_WRITE), own_fd)

    @classmethod
    def from_desc(cls, desc) -> Memory:
        """ANeuralNetworksMemory_createFromDesc: a driver-managed memory for the roles of
        a finished MemoryDesc."""
        from nnapi.memory_desc import MemoryDesc

        if desc is None:
            raise UnexpectedNullError("Memory.from_desc: desc is None")
        if not isinstance(desc, MemoryDesc):
            raise BadDataError("Memory.from_desc: desc must be a MemoryDesc")
        return desc._allocate(cls)

    # --- properties ------------------------------------------------------------------
    @property
    def size(self) -> int:
        self._check_alive("Memory.size")
        return self._size

    @property
    def buffer(self) -> memoryview:
        """The mapped bytes (read-only when mapped without PROT_WRITE)."""
        self._check_alive("Memory.buffer")
        if self._mapping is None:
            raise BadStateError("Memory.buffer: a memory created from a MemoryDesc has no CPU mapping")
        view = memoryview(self._mapping)[self._offset:self._offset + self._size]
        return view if self._writable else view.toreadonly()

    @property
    def is_from_desc(self) -> bool:
        return self._desc is not None

    def _pool(self):
        """The buffer the HAL sees for this memory."""
        self._check_alive("Memory")
        return self.buffer if self._mapping is not None else self._device_buffer

    @staticmethod
    def copy(src: Memory, dst: Memory) -> None:
        """ANeuralNetworksMemory_copy: copy the whole of ``src`` into ``dst``."""
        if src is None or dst is None:
            raise UnexpectedNullError("Memory.copy: src and dst are required")
        src._check_alive("Memory.copy")
        dst._check_alive("Memory.copy")
        if src.is_from_desc or dst.is_from_desc:
            from nnapi.memory_desc import copy_device_memory

            copy_device_memory(src, dst)
            return
        if src.size != dst.size:
            raise BadDataError(f"Memory.copy: sizes differ ({src.size} and {dst.size})")
        if not dst._writable:
            raise BadDataError("Memory.copy: destination is read-only")
        dst.buffer[:] = src.buffer

    def _release(self) -> None:
        if self._mapping is not None:
            try:
                self._mapping.close()
            except BufferError:
                # Still exported (a numpy view of .buffer is alive): leave it to the GC.
                pass
        if self._close_fd is not None:
            self._close_fd()
        self._mapping = None
        self._fd = None
