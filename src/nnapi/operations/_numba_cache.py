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

A cached function is stored as its machine code (an object file) and its LLVM bitcode,
kept only so that another function's compilation can link it in. numba parses that
bitcode at every load (~1.2 ms a kernel) to list the symbols the object defines (~0.4
ms more); ``LeanCache`` stores that list beside the entry when it saves one and parses
the bitcode only if a compilation links the function (``_CachedLibrary``): a load is
the object's own loading, 1.5-2 ms a kernel less. Entries saved by numba's own cache
carry no list: the index key says which form an entry has.
"""

from __future__ import annotations

from collections.abc import Callable

import llvmlite.binding as ll
import numba
from numba.core import compiler
from numba.core.caching import FunctionCache
from numba.core.codegen import JITCodeLibrary
from numba.core.runtime import rtsys

#: the form of an entry ``LeanCache`` saves: (this tag, numba's payload, defined symbols)
_FORM = "nnapi-lean-1"


class _CachedLibrary(JITCodeLibrary):
    """A code library rebuilt from cached machine code whose LLVM bitcode is parsed only
    when a compilation links it into another function (numba parses it at every load)."""

    _bitcode = b""

    def _get_module_for_linking(self):
        if self._shared_module is None:
            self._shared_module = ll.parse_bitcode(self._bitcode)
        return self._shared_module


def _defined_symbols(module) -> tuple[str, ...]:
    """The names ``module`` defines (numba's ``JitEngine._load_defined_symbols``' set)."""
    return tuple(sorted({value.name for values in (module.functions, module.global_variables) for value in values
                         if not value.is_declaration}))


def _rebuild(target_context, payload, symbols):
    """numba's ``CompileResult._rebuild`` of a cached ``payload`` without parsing its bitcode:
    the machine code is loaded and its ``symbols`` recorded as numba's own loading does."""
    libdata, fndesc, env, signature, objectmode, lifted, typeann, reload_init, referenced_envs = payload
    name, kind, (object_code, bitcode) = libdata
    for function in reload_init or ():
        function()
    codegen = target_context.codegen()
    library = _CachedLibrary(codegen, name)
    library.enable_object_caching()
    library._set_compiled_object(object_code)
    library._bitcode = bitcode
    library._finalize_final_module()
    codegen._engine._defined_symbols.update(symbols)
    entry = target_context.get_executable(library, fndesc, env)
    result = compiler.CompileResult(
        target_context=target_context, typing_context=target_context.typing_context, library=library,
        environment=env, entry_point=entry, fndesc=fndesc, type_annotation=typeann, signature=signature,
        objectmode=objectmode, lifted=lifted, typing_error=None, call_helper=None, metadata=None,
        reload_init=reload_init, referenced_envs=referenced_envs)
    for environment in referenced_envs:
        codegen.set_env(environment.env_name, environment)
    return result


class LeanCache(FunctionCache):
    """numba's cache of one function, loading without the target context's full refresh
    (and without numba's runtime for a function compiled without it)."""

    def __init__(self, py_func, runtime: bool = True) -> None:
        super().__init__(py_func)
        self._runtime = runtime

    def _index_key(self, sig, codegen):
        return (*super()._index_key(sig, codegen), "nrt" if self._runtime else "no-nrt", _FORM)

    def load_overload(self, sig, target_context):
        if self._runtime:
            rtsys.initialize(target_context)  # the runtime the rebuilt machine code calls
        with self._guard_against_spurious_io_errors():
            return self._load_overload(sig, target_context)

    def _load_overload(self, sig, target_context):
        if not self._enabled:
            return None
        data = self._cache_file.load(self._index_key(sig, target_context.codegen()))
        if data is None:
            return None
        form, payload, symbols = data
        if form != _FORM:
            return None  # not an entry of ours: compiled again
        if payload[0][1] != "object" or getattr(target_context.codegen(), "_library_class", None) is not JITCodeLibrary:
            return self._impl.rebuild(target_context, payload)  # numba's own loading
        return _rebuild(target_context, payload, symbols)

    def _save_overload(self, sig, data):
        if not self._enabled or not self._impl.check_cachable(data):
            return
        self._impl.locator.ensure_cache_path()
        key = self._index_key(sig, data.codegen)
        payload = self._impl.reduce(data)  # object code and the bitcode for linking (parsed below)
        self._cache_file.save(key, (_FORM, payload, _defined_symbols(data.library._get_module_for_linking())))


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
