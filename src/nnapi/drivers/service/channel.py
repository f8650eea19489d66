"""The driver service's fast path: a shared-memory request/reply channel beside the socket.

A round trip over the Unix socket costs two wake-ups of a sleeping process; on an idle
virtual machine each takes tens of microseconds (a bare socketpair ping-pong measured
61-66 us there), more than the whole burst budget. So once a client has greeted the
service it sets up a channel (the ``channel`` message, over the socket): a sealed memfd
holding one request slot and one reply slot, and two eventfds as doorbells, all passed
by SCM_RIGHTS. A message without descriptors that fits a slot then goes through the
channel; the rest (pools to map, cache files, large models) still go by socket frame.

The slots carry exactly the bytes a frame's payload would (the same versioned msgpack
schema, decoded by the same strict code). The writer fills the slot, stores its length,
then stores the new sequence number, then rings the doorbell (an eventfd write: a
syscall, so a full barrier, and a wake-up for a reader asleep in poll). The reader spins
on the sequence word for a bounded time, yielding the CPU (``sched_yield``, which also
releases the GIL) between looks, then sleeps in poll on the doorbell (and the socket, so
a dead peer or a frame is noticed). An idle service therefore costs no CPU, and a client
that computes back to back never waits for a wake-up. Spinning relies on x86's ordered
stores (a reader that sees the sequence number sees the bytes written before it); on
other processors the reader does not spin and only trusts what the doorbell's syscall
ordered.

Layout (little endian): request sequence (u64) and length (u64) at 0, reply sequence
and length at 64, the request slot at 128 and the reply slot after it, ``capacity``
bytes each. Requests are numbered 1, 2, 3, ...; the reply to request N carries N. The
service copies a request out of the shared memory before it looks at it (the client may
scribble on the slot at any time), checks the sequence number is exactly the next one
and the length within the slot, else it closes the connection, as for a broken frame.
"""

from __future__ import annotations

import fcntl
import mmap
import os
import platform
import select
import time

#: Header bytes before the slots.
HEADER_BYTES = 128
#: Default bytes per slot; a message that does not fit goes by socket.
DEFAULT_CAPACITY = 64 << 10
MIN_CAPACITY, MAX_CAPACITY = 4 << 10, 1 << 20
#: A reply length meaning "the reply is too large for the slot: read it from the socket".
ON_SOCKET = (1 << 64) - 1
#: word indexes (u64) in the header
REQUEST_SEQ, REQUEST_LEN, REPLY_SEQ, REPLY_LEN = 0, 1, 8, 9
#: Microseconds a waiting side spins before it sleeps (NNAPI_SERVICE_SPIN_US overrides;
#: 0: never spin).
DEFAULT_SPIN_US = 250
#: A yield that takes longer than this ends a spin (other work had the CPU: the machine
#: is busy, and a sleeping process is woken quickly).
_LATE_YIELD_NS = 50_000
_SPIN_OK = platform.machine().lower() in ("x86_64", "amd64", "i386", "i686", "x86")
_SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL


def spin_ns() -> int:
    """Nanoseconds to spin before sleeping (0 where stores may be seen out of order)."""
    if not _SPIN_OK:
        return 0
    try:
        return max(0, int(float(os.environ.get("NNAPI_SERVICE_SPIN_US", DEFAULT_SPIN_US)) * 1000))
    except ValueError:
        return DEFAULT_SPIN_US * 1000


def size_for(capacity: int) -> int:
    return HEADER_BYTES + 2 * capacity


class Channel:
    """One side's view of a channel: the mapping, its words, the slots, the doorbells."""

    def __init__(self, mapping: mmap.mmap, capacity: int, to_peer: int, from_peer: int) -> None:
        self.mapping = mapping
        self.capacity = capacity
        self.view = memoryview(mapping)
        self.words = self.view[:HEADER_BYTES].cast("Q")
        self.request_slot = self.view[HEADER_BYTES: HEADER_BYTES + capacity]
        self.reply_slot = self.view[HEADER_BYTES + capacity: HEADER_BYTES + 2 * capacity]
        #: doorbell rung after writing (the peer sleeps on it) and the one we sleep on
        self.to_peer, self.from_peer = to_peer, from_peer
        self.spin_ns = spin_ns()
        self.poller: select.poll | None = None
        self.socket_fd = -1

    def watch(self, socket_fd: int) -> None:
        """Sleep on the peer's doorbell and on the socket ``socket_fd`` (a frame, or the
        peer gone)."""
        self.socket_fd = socket_fd
        self.poller = select.poll()
        for fd in (self.from_peer, socket_fd):
            self.poller.register(fd, select.POLLIN | select.POLLERR | select.POLLHUP)

    def sleep(self, timeout_ms: int | None) -> tuple[bool, bool]:
        """Sleep until the doorbell rings or the socket has something (or ``timeout_ms``
        passes): (doorbell rung, socket ready). The doorbell is drained."""
        assert self.poller is not None
        rung = ready = False
        for fd, _ in self.poller.poll(timeout_ms):
            if fd == self.from_peer:
                rung = True
            else:
                ready = True
        if rung:
            self.drain()
        return rung, ready

    @classmethod
    def create(cls, capacity: int = DEFAULT_CAPACITY) -> tuple[Channel, int]:
        """A new channel (the client's side) and the memfd to send; the memfd is sealed, so
        neither side can shrink it under the other's mapping."""
        fd = os.memfd_create("nnapi-service-channel", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.ftruncate(fd, size_for(capacity))
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, _SEALS)
            mapping = mmap.mmap(fd, size_for(capacity))
            to_peer = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)
            from_peer = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)
        except BaseException:
            os.close(fd)
            raise
        return cls(mapping, capacity, to_peer, from_peer), fd

    def ring(self) -> None:
        """Wake the peer if it sleeps (a full counter means it is awake anyway)."""
        try:
            os.eventfd_write(self.to_peer, 1)
        except BlockingIOError:
            pass

    def drain(self) -> None:
        try:
            os.eventfd_read(self.from_peer)
        except BlockingIOError:
            pass

    def spin(self, index: int, value: int) -> bool:
        """Spin (bounded) until word ``index`` is no longer ``value``; True when it changed.

        Between looks ``sched_yield``, so that on a busy core the peer (or anyone) runs
        first: a busy spin without yielding measured 3-7x slower on the loaded 2-core
        machine, where the peer waits for the CPU we hold. A yield that comes back late
        means other work had the CPU, where a sleep in poll is woken quickly anyway: the
        spin ends there."""
        words = self.words
        if words[index] != value:
            return True
        if not self.spin_ns:
            return False
        clock = time.perf_counter_ns
        end = clock() + self.spin_ns
        while words[index] == value:
            now = clock()
            if now > end:
                return False
            os.sched_yield()
            if clock() - now > _LATE_YIELD_NS:
                return words[index] != value
        return True

    def close(self) -> None:
        for view in (self.request_slot, self.reply_slot, self.words, self.view):
            view.release()
        try:
            self.mapping.close()
        except BufferError:
            pass
        for fd in (self.to_peer, self.from_peer):
            try:
                os.close(fd)
            except OSError:
                pass


def is_eventfd(fd: int) -> bool:
    try:
        return os.readlink(f"/proc/self/fd/{fd}") == "anon_inode:[eventfd]"
    except OSError:
        return False

