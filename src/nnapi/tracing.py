"""Tracing of compilations and executions as Chrome trace events (Perfetto opens them).

Off by default, and then a span costs one attribute read. ``NNAPI_TRACE=out.json`` in
the environment, ``nnapi ... --trace out.json`` or :func:`start` turn it on; the events
are written when :func:`stop` is called or at interpreter exit. Spans nest by time on
each thread: the runtime (``compilation``, ``execution``, plan steps), the driver calls
(``driver``) and each operation in the reference driver (``operation``).
"""

from __future__ import annotations

import atexit
import json
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

_lock = threading.Lock()


class _State:
    enabled = False
    path: str | None = None
    events: list[dict] = []


state = _State()
_PID = os.getpid()


def start(path: str | None = None) -> None:
    """Begin recording; ``path`` (if given) is where :func:`stop` writes the trace."""
    with _lock:
        state.events = []
        state.path = path
        state.enabled = True


def stop() -> list[dict]:
    """Stop recording, write the trace file if a path was given, return the events."""
    with _lock:
        state.enabled = False
        events, state.events = state.events, []
        path, state.path = state.path, None
    if path:
        write(path, events)
    return events


def write(path: str, events: list[dict]) -> None:
    with open(path, "w") as handle:
        json.dump({"traceEvents": events, "displayTimeUnit": "ms"}, handle)


def _now_us() -> float:
    return time.perf_counter_ns() / 1000.0


def record(name: str, category: str, start_us: float, duration_us: float, args: dict[str, Any] | None = None
           ) -> None:
    """Add one complete event ("ph": "X") measured by the caller."""
    event = {"name": name, "cat": category, "ph": "X", "ts": start_us, "dur": duration_us,
             "pid": _PID, "tid": threading.get_ident()}
    if args:
        event["args"] = args
    with _lock:
        if state.enabled:
            state.events.append(event)


@contextmanager
def span(name: str, category: str, **args: Any) -> Iterator[None]:
    """Time the enclosed block as one event when tracing is on."""
    if not state.enabled:
        yield
        return
    begin = _now_us()
    try:
        yield
    finally:
        record(name, category, begin, _now_us() - begin, args or None)


def now_us() -> float:
    """A timestamp for :func:`record` (microseconds, the trace's clock)."""
    return _now_us()


def _start_from_environment() -> None:
    path = os.environ.get("NNAPI_TRACE")
    if path:
        start(path)
        atexit.register(stop)


_start_from_environment()


def traced(name: str, category: str):
    """Decorate a function so each call is one event when tracing is on (one attribute
    read when it is off)."""
    import functools

    def decorate(function):
        @functools.wraps(function)
        def wrapper(*args, **kwargs):
            if not state.enabled:
                return function(*args, **kwargs)
            begin = _now_us()
            try:
                return function(*args, **kwargs)
            finally:
                record(name, category, begin, _now_us() - begin)

        return wrapper

    return decorate
