"""Event: completion of an asynchronous execution (ANeuralNetworksEvent_*).

Sync fences are modelled with Linux eventfds: ``get_sync_fence_fd`` returns a descriptor
that becomes readable when the execution completes, and ``Event.create_from_sync_fence_fd``
wraps any descriptor that becomes readable when its work is done.
"""

from __future__ import annotations

import os
import select
import threading
import weakref
from collections.abc import Callable

from nnapi._object import NnapiObject
from nnapi._scheduler import FENCES
from nnapi.errors import (
    BadDataError,
    BadStateError,
    NnapiError,
    NotConstructibleError,
    ResourceExhaustedTransientError,
    UnexpectedNullError,
)


class Event(NnapiObject):
    """ANeuralNetworksEvent."""

    def __init__(self) -> None:
        # The NDK has no ANeuralNetworksEvent_create: an event comes from an execution or
        # from a sync fence. One made here would never be signalled.
        raise NotConstructibleError("Event cannot be constructed directly; it comes from "
                                    "Execution.start_compute* or Event.create_from_sync_fence_fd")

    @classmethod
    def _new(cls) -> Event:
        """An event an execution will signal."""
        event = object.__new__(cls)
        event._done = threading.Event()
        event._error = None
        event._fence_fd = None
        event._waited_fd = None
        event._lock = threading.Lock()
        event._callbacks = []
        event._fenced = False  # backed by a sync fence (start_compute_with_dependencies, a fence fd)
        return event

    @classmethod
    def create_from_sync_fence_fd(cls, sync_fence_fd: int) -> Event:
        """ANeuralNetworksEvent_createFromSyncFenceFd: an event signalled when the
        descriptor becomes readable. The descriptor is duplicated."""
        if sync_fence_fd is None:
            raise UnexpectedNullError("create_from_sync_fence_fd: fd is None")
        if not isinstance(sync_fence_fd, int) or isinstance(sync_fence_fd, bool) or \
                not 0 <= sync_fence_fd < 2**31:
            raise BadDataError(f"create_from_sync_fence_fd: invalid fd {sync_fence_fd!r}")
        try:
            own = os.dup(sync_fence_fd)
        except OSError as error:
            raise BadDataError(f"create_from_sync_fence_fd: {error}") from None
        event = cls._new()
        event._waited_fd = own
        event._fenced = True
        event._close_waited = weakref.finalize(event, os.close, own)
        return event

    # --- producer side -----------------------------------------------------------------
    def _signal(self, error: NnapiError | None = None) -> None:
        with self._lock:
            self._error = error
            self._done.set()
            if self._fence_fd is not None:
                os.eventfd_write(self._fence_fd, 1)
            callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback(error)

    def _when_done(self, callback: Callable[[NnapiError | None], None], call: str) -> None:
        """Call ``callback(error)`` once the event is signalled (now, if it already is).

        Whatever the caller does with the event afterwards (free it, let its descriptor
        number be reused) does not matter: an execution's event is followed through its
        own state, a sync fence through a duplicate of its descriptor.
        """
        if self._waited_fd is not None:
            try:
                fd = os.dup(self._waited_fd)
            except OSError as error:
                raise BadDataError(f"{call}: cannot duplicate a dependency's sync fence: {error}") from None
            try:
                FENCES.watch(fd, lambda: callback(None), call)
            except BaseException:
                os.close(fd)
                raise
            return
        with self._lock:
            if not self._done.is_set():
                self._callbacks.append(callback)
                return
        callback(self._error)

    def _failure(self) -> NnapiError | None:
        """The error of an execution's event that is already signalled, else None."""
        with self._lock:
            return self._error if self._done.is_set() else None

    # --- consumer side -----------------------------------------------------------------
    def wait(self) -> None:
        """ANeuralNetworksEvent_wait: block until done; raise the execution's error."""
        self._check_alive("Event.wait")
        if self._waited_fd is not None:
            _wait_readable(self._waited_fd, None)
            return
        self._done.wait()
        if self._error is not None:
            raise self._error

    @property
    def is_done(self) -> bool:
        if self._waited_fd is not None:
            return _wait_readable(self._waited_fd, 0)
        return self._done.is_set()

    def get_sync_fence_fd(self) -> int:
        """ANeuralNetworksEvent_getSyncFenceFd: a new descriptor, readable once done.
        The caller owns (and must close) it. BAD_DATA for an event not backed by a sync
        fence (one from start_compute), as the NDK documents."""
        self._check_alive("get_sync_fence_fd")
        if not self._fenced:
            raise BadDataError("get_sync_fence_fd: the event is not backed by a sync fence (it comes from "
                               "start_compute; use start_compute_with_dependencies for a fenced execution)")
        try:
            if self._waited_fd is not None:
                return os.dup(self._waited_fd)
            with self._lock:
                if self._fence_fd is None:
                    self._fence_fd = os.eventfd(1 if self._done.is_set() else 0, os.EFD_CLOEXEC)
                    self._close_fence = weakref.finalize(self, os.close, self._fence_fd)
                return os.dup(self._fence_fd)
        except OSError as error:  # out of descriptors
            raise ResourceExhaustedTransientError(f"get_sync_fence_fd: {error}") from None

    def _release(self) -> None:
        if not self._done.is_set() and self._waited_fd is None:
            # The NDK waits for the execution before freeing its event.
            self._done.wait()
        for closer in (getattr(self, "_close_fence", None), getattr(self, "_close_waited", None)):
            if closer is not None:
                closer()
        self._fence_fd = self._waited_fd = None


def _wait_readable(fd: int, timeout_ms: int | None) -> bool:
    """poll() rather than select(): descriptors above 1023 are fine."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(timeout_ms))


def check_events(events, call: str) -> list[Event]:
    if events is None:
        raise UnexpectedNullError(f"{call}: dependencies is None")
    if isinstance(events, str | bytes) or not hasattr(events, "__iter__"):
        raise BadDataError(f"{call}: dependencies must be a sequence of Event")
    events = list(events)
    for event in events:
        if not isinstance(event, Event):
            raise BadDataError(f"{call}: dependencies must be Event objects")
        if event._freed:
            raise BadStateError(f"{call}: a dependency was freed")
    return events
