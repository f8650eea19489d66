"""Deadlines of the ONNX Runtime devices: checked before preparation and runs, the loop
timeout's bound, and the watchdog thread that stops a run when its deadline passes.
"""

from __future__ import annotations

import os
import threading
import time

import onnxruntime as ort

from nnapi.codes import DEFAULT_LOOP_TIMEOUT_NS
from nnapi.hal import ErrorStatus, HalError


def _loop_deadline(deadline_ns: int | None, loop_timeout_ns: int | None) -> int:
    """The time a run of a graph with a loop must end by: its deadline, or sooner the loop
    timeout (ANeuralNetworksExecution_setLoopTimeout; the default where none is given)
    from now. ORT's Loop has no timeout of its own, so the watchdog stops the whole run:
    a loop running past it fails with MISSED_DEADLINE_TRANSIENT, as the NDK specifies (the
    bound is the run's, a stricter one than each loop's alone where a graph has several)."""
    timeout = DEFAULT_LOOP_TIMEOUT_NS if loop_timeout_ns is None else loop_timeout_ns
    limit = time.monotonic_ns() + timeout
    return limit if deadline_ns is None else min(deadline_ns, limit)


def _check_deadline(deadline_ns: int | None, what: str) -> None:
    if deadline_ns is not None and time.monotonic_ns() > deadline_ns:
        raise HalError(ErrorStatus.MISSED_DEADLINE_TRANSIENT, f"the deadline passed before {what}")


class _Watchdog:
    """One thread for every run with a deadline (a timer thread per run cost ~100 us to
    start): it sets a run's RunOptions.terminate when its deadline passes, and ORT stops
    before the next node. A run that ends first disarms its entry; the flag set late on
    a finished run is harmless (its RunOptions is not used again)."""

    def __init__(self) -> None:
        self._condition = threading.Condition()
        self._armed: dict[int, tuple[int, ort.RunOptions]] = {}  # id(options) -> (deadline, options)
        self._thread: threading.Thread | None = None
        #: the time the thread sleeps until (None: until notified): a deadline after it
        #: needs no wake-up (the thread looks again then), which spares a run bounded by
        #: the loop timeout the thread switch a notify costs (~60 us between model runs)
        self._waking: int | None = None
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=self._forget)  # the thread does not cross a fork

    def _forget(self) -> None:
        self._condition = threading.Condition()
        self._armed.clear()
        self._thread = None
        self._waking = None

    def arm(self, deadline_ns: int, options: ort.RunOptions) -> None:
        if deadline_ns <= time.monotonic_ns():
            options.terminate = True
            return
        with self._condition:
            self._armed[id(options)] = (deadline_ns, options)
            if self._thread is None:
                self._thread = threading.Thread(target=self._watch, name="nnapi-ort-deadlines", daemon=True)
                self._thread.start()
            if self._waking is None or deadline_ns < self._waking:
                self._waking = deadline_ns  # (the thread sets it again when it looks)
                self._condition.notify()

    def disarm(self, options: ort.RunOptions) -> None:
        with self._condition:
            self._armed.pop(id(options), None)

    def _watch(self) -> None:
        condition = self._condition
        with condition:
            while True:
                now = time.monotonic_ns()
                for key, (deadline, options) in list(self._armed.items()):
                    if deadline <= now:
                        options.terminate = True
                        del self._armed[key]
                earliest = min((deadline for deadline, _ in self._armed.values()), default=None)
                self._waking = earliest
                condition.wait(None if earliest is None else max(earliest - now, 0) / 1e9)


_WATCHDOG = _Watchdog()
