"""How the compiled kernels (``nnapi[fast]``) come out of numba's on-disk cache cheaply.

Imported only by the kernel modules (``_numba_kernels``), which ``_jit.kernels()`` imports
when numba is in use. ``kernel(...)`` is ``numba.njit(cache=True, ...)`` with one change:
a function found in the cache is loaded without first setting up numba's whole compiler.

numba's ``FunctionCache.load_overload`` calls ``target_context.refresh()`` before reading
the cache: that imports and installs every implementation registry numba has (arrays,
linear algebra, which imports scipy.linalg when scipy is installed, random generators,
typed containers, ...), 100-300 ms of a process's first compilation, for what only a
compilation needs. A function rebuilt from the cache needs the code generator (made with
the target context) and numba's runtime (NRT: the reference counting and allocation its
machine code calls), and nothing of those registries. ``LeanCache`` initializes the
runtime and reads the cache; on a miss numba compiles as usual (its compiler refreshes
the context itself). Where numba's internals differ from what this expects, the kernels
keep numba's own cache.

The kernels are compiled without numba's runtime (``_nrt=False``): they allocate nothing
(scratch comes from the caller) and keep no references, so their machine code calls none
of it, and loading them needs no runtime either: ``rtsys.initialize`` compiles NRT's LLVM
module, ~20 ms of a process's first compilation. numba's cache key does not say whether
a function was compiled with the runtime, so ``LeanCache`` adds that to the key: an entry
compiled with it (an older cache) is never loaded where the runtime was not set up.
"""

from __future__ import annotations

from collections.abc import Callable

import numba
from numba.core.caching import FunctionCache
from numba.core.runtime import rtsys


class LeanCache(FunctionCache):
    """numba's cache of one function, loading without the target context's full refresh
    (and without numba's runtime for a function compiled without it)."""

    def __init__(self, py_func, runtime: bool = True) -> None:
        super().__init__(py_func)
        self._runtime = runtime

    def _index_key(self, sig, codegen):
        return (*super()._index_key(sig, codegen), "nrt" if self._runtime else "no-nrt")

    def load_overload(self, sig, target_context):
        if self._runtime:
            rtsys.initialize(target_context)  # the runtime the rebuilt machine code calls
        with self._guard_against_spurious_io_errors():
            return self._load_overload(sig, target_context)


def _lean(dispatcher):
    """``dispatcher`` with its cache loading through ``LeanCache`` (unchanged where its
    cache is not numba's FunctionCache or cannot be replaced)."""
    cache = getattr(dispatcher, "_cache", None)
    if type(cache) is FunctionCache and hasattr(cache, "_load_overload") and hasattr(cache, "_index_key"):
        try:
            runtime = dispatcher.targetoptions.get("_nrt", True) is not False
            dispatcher._cache = LeanCache(dispatcher.py_func, runtime)
        except Exception:  # noqa: BLE001, S110 - numba's own cache still works
            pass
    return dispatcher


def kernel(**options) -> Callable:
    """A decorator: ``numba.njit(cache=True, **options)`` without numba's runtime (the
    function must not allocate), loading from the cache lean."""
    jit = numba.njit(cache=True, _nrt=False, **options)
    return lambda function: _lean(jit(function))
