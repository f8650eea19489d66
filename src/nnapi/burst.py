"""Burst: ANeuralNetworksBurst, a channel for a rapid sequence of executions."""

from __future__ import annotations

import threading

from nnapi._object import NnapiObject
from nnapi.errors import BadDataError, BadStateError, UnexpectedNullError


class Burst(NnapiObject):
    """ANeuralNetworksBurst (ANeuralNetworksBurst_create / _free)."""

    def __init__(self, compilation) -> None:
        from nnapi.compilation import Compilation

        if compilation is None:
            raise UnexpectedNullError("Burst: compilation is None")
        if not isinstance(compilation, Compilation):
            raise BadDataError("Burst: expected a Compilation")
        compilation._check_alive("Burst")
        if not compilation.is_finished:
            raise BadStateError("Burst: the compilation is not finished")
        self._compilation = compilation
        self._hal_burst = compilation._plan.configure_burst()
        self._busy = threading.Lock()

    def _release(self) -> None:
        self._hal_burst = None
