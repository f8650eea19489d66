"""Where asynchronous executions run: a bounded pool of worker threads, and one thread
that watches the sync fences executions wait for.

One OS thread per ``start_compute`` would let a busy caller exhaust the process's threads
(and its address space); here the number of threads is fixed, the number of outstanding
executions is bounded, and running out of either is RESOURCE_EXHAUSTED_TRANSIENT.
A computation waiting for its dependencies holds no worker: it is submitted once every
dependency is signalled.
"""

from __future__ import annotations

import collections
import os
import select
import threading
from collections.abc import Callable

from nnapi.errors import ResourceExhaustedTransientError

#: Threads that run computations at once, and computations accepted but not finished.
MAX_WORKERS = min(32, 2 * (os.cpu_count() or 1) + 2)
MAX_OUTSTANDING = 4096
#: A worker with nothing to do for this long ends (a later submission starts another).
_IDLE_SECONDS = 5.0


class WorkerPool:
    """A fixed-size pool running submitted callables in order of submission."""

    def __init__(self, max_workers: int = MAX_WORKERS, max_outstanding: int = MAX_OUTSTANDING) -> None:
        self.max_workers = max_workers
        self.max_outstanding = max_outstanding
        self._lock = threading.Lock()
        self._wakeup = threading.Condition(self._lock)
        self._queue: collections.deque[Callable[[], None]] = collections.deque()
        self._workers = 0
        self._idle = 0
        self._outstanding = 0

    def reserve(self, call: str) -> None:
        """Count one more outstanding computation, making sure a worker exists to run it;
        ResourceExhaustedTransientError when too many are outstanding or no thread starts."""
        with self._lock:
            if self._outstanding >= self.max_outstanding:
                raise ResourceExhaustedTransientError(
                    f"{call}: {self._outstanding} asynchronous executions are already outstanding")
            if self._workers == 0 and not self._start_worker():
                raise ResourceExhaustedTransientError(f"{call}: cannot start a worker thread")
            self._outstanding += 1

    def cancel(self) -> None:
        """Give back a reservation whose computation will never be submitted."""
        with self._lock:
            self._outstanding -= 1

    def submit(self, task: Callable[[], None]) -> bool:
        """Queue a reserved computation (its dependencies are done); False if no worker
        exists or can be started (the caller then fails it and calls cancel)."""
        with self._lock:
            if self._idle <= len(self._queue) and self._workers < self.max_workers:
                self._start_worker()  # failing is fine while other workers exist
            if self._workers == 0:
                return False
            self._queue.append(task)
            self._wakeup.notify()
            return True

    def _start_worker(self) -> bool:
        """Start one more worker (lock held); False if the OS refuses a thread."""
        thread = threading.Thread(target=self._work, name="nnapi-worker", daemon=True)
        try:
            thread.start()
        except RuntimeError:  # can't start new thread
            return False
        self._workers += 1
        return True

    def _work(self) -> None:
        while True:
            with self._lock:
                self._idle += 1
                while not self._queue:
                    if not self._wakeup.wait(_IDLE_SECONDS) and not self._queue:
                        self._idle -= 1
                        self._workers -= 1
                        return
                self._idle -= 1
                task = self._queue.popleft()
            try:
                task()
            except BaseException:  # noqa: BLE001 - a task reports its own errors; the worker lives on
                pass
            finally:
                with self._lock:
                    self._outstanding -= 1


class FenceWatcher:
    """One thread polling every sync fence some computation waits for."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiting: dict[int, Callable[[], None]] = {}
        self._wake_fd: int | None = None
        self._thread: threading.Thread | None = None

    def watch(self, fd: int, callback: Callable[[], None], call: str) -> None:
        """Call ``callback`` (on the watcher thread) once ``fd`` is readable, then close
        ``fd``, which the watcher now owns."""
        with self._lock:
            if self._thread is None:
                self._wake_fd = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)
                thread = threading.Thread(target=self._run, name="nnapi-fences", daemon=True)
                try:
                    thread.start()
                except RuntimeError:
                    os.close(self._wake_fd)
                    self._wake_fd = None
                    raise ResourceExhaustedTransientError(f"{call}: cannot start the fence thread") from None
                self._thread = thread
            self._waiting[fd] = callback
            os.eventfd_write(self._wake_fd, 1)

    def _run(self) -> None:
        while True:
            poller = select.poll()
            with self._lock:
                assert self._wake_fd is not None
                poller.register(self._wake_fd, select.POLLIN)
                for fd in self._waiting:
                    poller.register(fd, select.POLLIN)
            ready = []
            for fd, _ in poller.poll():
                if fd == self._wake_fd:
                    try:
                        os.eventfd_read(self._wake_fd)
                    except BlockingIOError:
                        pass
                    continue
                with self._lock:
                    callback = self._waiting.pop(fd, None)
                if callback is not None:
                    os.close(fd)
                    ready.append(callback)
            for callback in ready:
                try:
                    callback()
                except BaseException:  # noqa: BLE001 - callbacks report their own errors
                    pass


POOL = WorkerPool()
FENCES = FenceWatcher()
