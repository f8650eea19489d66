"""Memory: shared memory for operand values and execution arguments.

Mirrors ANeuralNetworksMemory_createFromFd, _createFromDesc, _copy and _free, plus
``Memory.create_shared(size)``, the usual way to get a fresh shared region (memfd +
mmap) on Linux, where Android would use ASharedMemory.
"""

from __future__ import annotations

import fcntl
import mmap
import os
import stat
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np

from nnapi._object import NnapiObject
from nnapi.errors import (
    BadDataError,
    BadStateError,
    NotConstructibleError,
    OutOfMemoryError,
    ResourceExhaustedTransientError,
    UnexpectedNullError,
    UnmappableError,
)

PROT_READ = mmap.PROT_READ
PROT_WRITE = mmap.PROT_WRITE


class MemorySource(NnapiObject):
    """What ``Memory.from_desc`` accepts: ``nnapi.memory_desc.MemoryDesc`` derives from it,
    so this module does not import the descriptor (which imports the compilation, which
    imports the model, which imports this module)."""

    def _allocate(self, memory_class: type[Memory]) -> Memory:
        raise NotImplementedError

    def _copy_device_memory(self, src: Memory, dst: Memory) -> None:
        """Memory.copy when ``src`` or ``dst`` came from this kind of descriptor."""
        raise NotImplementedError


class Memory(NnapiObject):
    """ANeuralNetworksMemory. ``buffer`` is a memoryview of the mapped bytes.

    A descriptor is only ever mapped when nobody can shrink the file under the mapping
    (a memfd sealed with F_SEAL_SHRINK): touching a mapping past the end of a truncated
    file kills the process with SIGBUS. Any other regular file is read and written with
    pread / pwrite at the moment of use, so a truncation becomes a BAD_DATA error.
    """

    def __init__(self) -> None:
        raise NotConstructibleError("Memory cannot be constructed directly; use Memory.create_shared, "
                                    "Memory.from_fd or Memory.from_desc")

    @classmethod
    def _wrap(cls, mapping: mmap.mmap | None, offset: int, size: int, writable: bool, fd: int | None,
              file_offset: int = 0) -> Memory:
        memory = object.__new__(cls)
        memory._mapping = mapping
        memory._offset = offset
        memory._size = size
        memory._writable = writable
        memory._fd = fd
        #: where the memory starts in the file (for the size check and pread / pwrite)
        memory._file_offset = file_offset
        #: read and written through the descriptor (pread / pwrite), never mapped
        memory._direct = mapping is None and fd is not None
        # Close the descriptor when the Memory is collected, even if free() never ran; the
        # mapping itself lives as long as any view of it.
        memory._close_fd = weakref.finalize(memory, os.close, fd) if fd is not None else None
        if mapping is not None and fd is not None:
            _MAPPED[mapping] = weakref.ref(memory)
        #: run once when the memory is freed or collected (see ``when_released``)
        memory._release_callbacks = []
        memory._desc = None
        #: a MemoryDesc memory the runtime holds itself (no device could allocate it)
        memory._device_buffer = None
        #: a MemoryDesc memory a driver allocated: its IBuffer, its device, and the pool
        #: requests name it by (runtime.device_memory.DeviceMemoryPool)
        memory._ibuffer = None
        memory._allocator = None
        memory._hal_pool = None
        #: a MemoryDesc memory: written yet (by an execution or a copy), and its dimensions
        #: as last written
        memory._initialized = False
        memory._dims = ()
        return memory

    @classmethod
    def create_shared(cls, size: int) -> Memory:
        """A new zero-filled shared memory region of ``size`` bytes (memfd + mmap), sealed
        against shrinking and growing so that its mapping can never fault."""
        if not _is_int(size) or size <= 0:
            raise BadDataError(f"Memory.create_shared: size must be a positive int, got {size!r}")
        if size > _MAX_SIZE:
            raise OutOfMemoryError(f"Memory.create_shared: {size} bytes exceeds this machine's memory")
        try:
            fd = os.memfd_create("nnapi-memory", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        except OSError as error:
            raise ResourceExhaustedTransientError(f"Memory.create_shared: {error}") from None
        try:
            os.ftruncate(fd, size)
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)
            mapping = mmap.mmap(fd, size, mmap.MAP_SHARED, PROT_READ | PROT_WRITE)
        except OSError as error:
            os.close(fd)
            raise UnmappableError(f"Memory.create_shared: {error}") from None
        return cls._wrap(mapping, 0, size, True, fd)

    @classmethod
    def from_fd(cls, size: int, prot: int, fd: int, offset: int = 0) -> Memory:
        """ANeuralNetworksMemory_createFromFd: ``size`` bytes of ``fd`` at ``offset``.

        ``prot`` is PROT_NONE, PROT_READ, PROT_WRITE or both; the memory is writable with
        PROT_WRITE (on Linux a shared mapping is always readable). The descriptor is duplicated,
        so the caller may close its own. Only regular files (memfds included) are
        accepted, and the file must hold ``offset + size`` bytes. A memfd that allows
        sealing is sealed against shrinking (F_SEAL_SHRINK) and mapped; any other file is
        read and written with pread / pwrite when the memory is used.
        """
        call = "Memory.from_fd"
        if fd is None:
            raise UnexpectedNullError(f"{call}: fd is None")
        if not _is_int(size) or size <= 0 or size > _MAX_FILE_OFFSET:
            raise BadDataError(f"{call}: size must be a positive int, got {size!r}")
        if not _is_int(offset) or offset < 0 or offset + size > _MAX_FILE_OFFSET:
            raise BadDataError(f"{call}: offset must be a non-negative int, got {offset!r}")
        # The NDK takes any combination of PROT_READ and PROT_WRITE, PROT_NONE included.
        if not _is_int(prot) or prot & ~(PROT_READ | PROT_WRITE):
            raise BadDataError(f"{call}: prot must combine PROT_READ and PROT_WRITE (or be PROT_NONE), "
                               f"got {prot!r}")
        if not _is_int(fd) or not 0 <= fd < 2**31:
            raise BadDataError(f"{call}: bad file descriptor {fd!r}")
        try:
            own_fd = os.dup(fd)
        except OSError as error:
            raise BadDataError(f"{call}: bad file descriptor {fd!r}: {error}") from None
        try:
            mapping, page_delta = _open_fd(call, own_fd, size, prot, offset)
        except BaseException:
            os.close(own_fd)
            raise
        return cls._wrap(mapping, page_delta, size, bool(prot & PROT_WRITE), own_fd, offset)

    @classmethod
    def from_desc(cls, desc) -> Memory:
        """ANeuralNetworksMemory_createFromDesc: a driver-managed memory for the roles of
        a finished MemoryDesc."""
        if desc is None:
            raise UnexpectedNullError("Memory.from_desc: desc is None")
        if not isinstance(desc, MemorySource):
            raise BadDataError("Memory.from_desc: desc must be a MemoryDesc")
        return desc._allocate(cls)

    # --- properties ------------------------------------------------------------------
    @property
    def size(self) -> int:
        self._check_alive("Memory.size")
        return self._size

    @property
    def buffer(self) -> memoryview:
        """The mapped bytes (read-only when mapped without PROT_WRITE). For a file read
        through its descriptor (see the class docstring) a read-only copy of the bytes
        as they are now: write such a memory through your own descriptor."""
        self._check_alive("Memory.buffer")
        if self._mapping is None and not self._direct:
            raise BadStateError("Memory.buffer: a memory created from a MemoryDesc has no CPU mapping")
        if self._direct:
            return memoryview(self._read("Memory.buffer", 0, self._size)).toreadonly()
        view = memoryview(self._mapping)[self._offset:self._offset + self._size]
        return view if self._writable else view.toreadonly()

    @property
    def is_from_desc(self) -> bool:
        return self._desc is not None

    @property
    def device_name(self) -> str | None:
        """For a memory from a MemoryDesc, the device that allocated it (None when the
        runtime holds it itself, because the roles' devices could not allocate it)."""
        self._check_alive("Memory.device_name")
        return self._allocator.name if self._allocator is not None else None

    def _check_file_size(self, call: str) -> None:
        """The file still holds the whole memory (it cannot shrink under a sealed mapping;
        a pread / pwrite memory's file can, and then the call fails cleanly)."""
        if self._fd is None:
            return
        try:
            file_size = os.fstat(self._fd).st_size
        except OSError as error:
            raise BadDataError(f"{call}: the memory's file is unusable: {error}") from None
        if file_size < self._file_offset + self._size:
            raise BadDataError(f"{call}: the memory's file shrank to {file_size} bytes; the memory needs "
                               f"{self._file_offset + self._size}")

    def _read(self, call: str, offset: int, length: int) -> bytes | memoryview:
        """``length`` bytes at ``offset``: a view of the mapping, or a pread copy."""
        self._check_alive(call)
        if not self._direct:
            return self._pool()[offset:offset + length]
        self._check_file_size(call)
        try:
            data = os.pread(self._fd, length, self._file_offset + offset)
        except OSError as error:
            raise BadDataError(f"{call}: cannot read the memory's file: {error}") from None
        if len(data) != length:
            raise BadDataError(f"{call}: the memory's file shrank while it was read")
        return data

    def _write(self, call: str, offset: int, data) -> None:
        """Store ``data`` at ``offset`` (through the mapping or with pwrite)."""
        self._check_alive(call)
        if not self._direct:
            memoryview(self._pool())[offset:offset + len(data)] = data
            return
        self._check_file_size(call)
        try:
            written = os.pwrite(self._fd, data, self._file_offset + offset)
        except OSError as error:
            raise BadDataError(f"{call}: cannot write the memory's file: {error}") from None
        if written != len(data):
            raise BadDataError(f"{call}: wrote {written} of {len(data)} bytes to the memory's file")

    def _pool(self):
        """The buffer the HAL sees for this memory: the mapping, the device buffer, or for
        a pread / pwrite memory a copy of its bytes read now."""
        self._check_alive("Memory")
        if self._direct:
            return bytearray(self._read("Memory", 0, self._size))
        if self._mapping is not None:
            return self.buffer
        return self._hal_pool if self._hal_pool is not None else self._device_buffer

    @staticmethod
    def copy(src: Memory, dst: Memory) -> None:
        """ANeuralNetworksMemory_copy: copy the whole of ``src`` into ``dst``."""
        if src is None or dst is None:
            raise UnexpectedNullError("Memory.copy: src and dst are required")
        if not isinstance(src, Memory) or not isinstance(dst, Memory):
            raise BadDataError(f"Memory.copy: expected two Memory objects, got {type(src).__name__} and "
                               f"{type(dst).__name__}")
        src._check_alive("Memory.copy")
        dst._check_alive("Memory.copy")
        if src is dst:
            return  # as Android's copy: nothing to do
        if src.is_from_desc or dst.is_from_desc:
            (src if src.is_from_desc else dst)._desc._copy_device_memory(src, dst)
            return
        if src.size != dst.size:
            raise BadDataError(f"Memory.copy: sizes differ ({src.size} and {dst.size})")
        if not dst._writable:
            raise BadDataError("Memory.copy: destination is read-only")
        dst._write("Memory.copy", 0, src._read("Memory.copy", 0, src.size))

    def _release(self) -> None:
        callbacks, self._release_callbacks = getattr(self, "_release_callbacks", []), []
        for callback in callbacks:
            callback()
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
        self._direct = False
        # Device memory goes back to its driver once no execution holds it.
        self._ibuffer = None
        self._hal_pool = None
        self._device_buffer = None


#: mapping -> the Memory it belongs to (see ``memory_of``)
_MAPPED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _mapped_memory(buffer: Any) -> Memory | None:
    """The Memory whose whole mapped bytes ``buffer`` is, or None."""
    if not isinstance(buffer, memoryview):
        return None
    reference = _MAPPED.get(buffer.obj) if isinstance(buffer.obj, mmap.mmap) else None
    memory = reference() if reference is not None else None
    if memory is None or memory._fd is None or memory._mapping is None or buffer.nbytes != memory._size:
        return None
    start = np.frombuffer(memory._mapping, np.uint8).__array_interface__["data"][0] + memory._offset
    if np.frombuffer(buffer, np.uint8).__array_interface__["data"][0] != start:
        return None  # another part of the mapping
    return memory


def memory_of(buffer: Any) -> tuple[int, int, int, bool] | None:
    """For a request pool that is a whole Memory's mapped bytes (what the runtime hands
    drivers for a memory from ``create_shared`` / ``from_fd``): its descriptor, where it
    starts in the file, its size and whether it is writable; None for anything else. A
    transport that passes descriptors (the driver service) sends the memory itself instead
    of copying its bytes."""
    memory = _mapped_memory(buffer)
    if memory is None:
        return None
    return memory._fd, memory._file_offset, memory._size, memory._writable


def when_released(buffer: Any, callback: Callable[[], None]) -> bool:
    """Call ``callback`` (once, from any thread; it must not raise) when the Memory whose
    mapped bytes ``buffer`` is gets freed or collected; False (and nothing happens) when
    ``buffer`` is no such memory. A transport that mapped the memory elsewhere (the driver
    service) lets go of that mapping then."""
    memory = _mapped_memory(buffer)
    if memory is None:
        return False
    done = [False]

    def once() -> None:
        if not done[0]:
            done[0] = True
            callback()

    memory._release_callbacks.append(once)
    weakref.finalize(memory, once)
    return True


#: Largest size a file offset can express (off_t).
_MAX_FILE_OFFSET = 2**63 - 1
#: No shared memory can be larger than the machine's memory.
_MAX_SIZE = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def _is_int(value: object) -> bool:
    return isinstance(value, int | np.integer) and not isinstance(value, bool)


def _open_fd(call: str, fd: int, size: int, prot: int, offset: int) -> tuple[mmap.mmap | None, int]:
    """Check ``fd`` for Memory.from_fd; map it when that is safe.

    Returns the mapping (None for a pread / pwrite memory) and where the memory starts in it.
    """
    try:
        status = os.fstat(fd)
        access = fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE
    except OSError as error:
        raise BadDataError(f"{call}: bad file descriptor: {error}") from None
    if not stat.S_ISREG(status.st_mode):
        raise UnmappableError(f"{call}: only regular files and memfds can back a memory, not a "
                              f"{_file_kind(status.st_mode)}")
    if access == os.O_WRONLY or (prot & PROT_WRITE and access == os.O_RDONLY):
        raise UnmappableError(f"{call}: the descriptor's access mode does not allow "
                              f"{'PROT_READ|PROT_WRITE' if prot & PROT_WRITE else 'PROT_READ'}")
    if status.st_size < offset + size:
        raise BadDataError(f"{call}: the file holds {status.st_size} bytes, fewer than offset {offset} + "
                           f"size {size}")
    if not _seal_against_shrinking(fd):
        return None, 0
    # mmap offsets must be page aligned; map from the page below and remember the rest.
    page_offset = offset - offset % mmap.ALLOCATIONGRANULARITY
    try:
        mapping = mmap.mmap(fd, size + offset - page_offset, mmap.MAP_SHARED, prot | PROT_READ, offset=page_offset)
    except (OSError, ValueError, OverflowError) as error:
        raise UnmappableError(f"{call}: cannot map {size} bytes at {offset}: {error}") from None
    return mapping, offset - page_offset


def _seal_against_shrinking(fd: int) -> bool:
    """True once the file cannot shrink: a memfd that is (or now gets) F_SEAL_SHRINK."""
    try:
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK)
    except OSError:
        pass  # not a memfd, created without MFD_ALLOW_SEALING, or already F_SEAL_SEAL
    try:
        return bool(fcntl.fcntl(fd, fcntl.F_GET_SEALS) & fcntl.F_SEAL_SHRINK)
    except OSError:
        return False


def _file_kind(mode: int) -> str:
    for test, name in ((stat.S_ISSOCK, "socket"), (stat.S_ISFIFO, "pipe"), (stat.S_ISCHR, "character device"),
                       (stat.S_ISBLK, "block device"), (stat.S_ISDIR, "directory")):
        if test(mode):
            return name
    return "special file"
