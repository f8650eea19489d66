"""Lifetime shared by the public objects: free(), context managers, use after free."""

from __future__ import annotations

from typing import Any

import numpy as np

from nnapi.errors import BadDataError, BadStateError


def as_flag(call: str, value: Any) -> bool:
    """A bool argument of the NDK: True/False, or an integer (a numpy one included)."""
    if isinstance(value, bool | int | np.bool_ | np.integer):
        return bool(value)
    raise BadDataError(f"{call}: expected a bool, got {type(value).__name__}")


class NnapiObject:
    """Base of Model, Compilation, Execution, Memory, Burst, Event, MemoryDesc."""

    _freed: bool = False

    def free(self) -> None:
        """Release the object (the NDK's *_free). Freeing twice is harmless."""
        if not self._freed:
            self._release()
        self._freed = True

    def _release(self) -> None:
        """Subclasses drop what they hold."""

    def _check_alive(self, call: str) -> None:
        if self._freed:
            raise BadStateError(f"{call}: the {type(self).__name__} was freed")

    def __enter__(self):
        return self

    def __exit__(self, *exc_info) -> None:
        self.free()
