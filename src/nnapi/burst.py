"""Burst: ANeuralNetworksBurst, a channel for a rapid sequence of executions."""

from __future__ import annotations

import threading

from nnapi._object import NnapiObject


class Burst(NnapiObject):
    """ANeuralNetworksBurst (ANeuralNetworksBurst_create / _free)."""

    def __init__(self, compilation) -> None:
        from nnapi.compilation import finished_compilation

        self._compilation = finished_compilation(compilation, "Burst")
        self._hal_burst = compilation._plan.configure_burst()
        self._busy = threading.Lock()

    def _release(self) -> None:
        self._hal_burst = None
