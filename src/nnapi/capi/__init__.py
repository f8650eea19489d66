"""The C ABI: libneuralnetworks.so, exporting every ANeuralNetworks* function of feature
level 8 with the NDK's signatures, implemented on this Python package.

The library is built with cffi's embedding API (``nnapi capi build``): a C program that
calls ``ANeuralNetworksModel_create`` starts an embedded Python interpreter on its first
call, imports nnapi, and every later call goes straight to :mod:`nnapi.capi.bridge`.
``nnapi capi include`` gives the include directory with ``android/NeuralNetworks.h``
(and ``android/NeuralNetworksExtensions.h``), generated from :mod:`nnapi.codes`.
"""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

from nnapi.capi.header import write_include_dir

LIBRARY_NAME = "libneuralnetworks.so"


def cache_dir() -> Path:
    """Where ``nnapi capi`` puts the library and headers when no directory is given:
    ``$XDG_CACHE_HOME/nnapi/capi`` (``~/.cache/nnapi/capi``), one folder per Python and
    nnapi version."""
    import nnapi

    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    tag = hashlib.sha256(f"{sys.executable}|{sys.version}|{nnapi.__version__}|{nnapi.__file__}".encode())
    return base / "nnapi" / "capi" / tag.hexdigest()[:16]


def include_dir(out: str | os.PathLike | None = None) -> Path:
    """An include directory holding android/NeuralNetworks.h (generated now from nnapi's
    enums): ``out`` if given, else ``cache_dir()/include``."""
    return write_include_dir(Path(out) if out is not None else cache_dir() / "include")


def build(out: str | os.PathLike | None = None, verbose: bool = False) -> Path:
    """Build libneuralnetworks.so (and its include directory) into ``out`` (default:
    ``cache_dir()``); returns the library's path. Needs cffi and a C compiler."""
    from nnapi.capi.build import build_library

    return build_library(Path(out) if out is not None else cache_dir(), verbose=verbose)


def env_lines(lib_dir: str | os.PathLike | None = None) -> list[str]:
    """Shell ``export`` lines a program linked against the library needs at run time."""
    import shlex
    import sysconfig

    lib_dir = Path(lib_dir) if lib_dir is not None else cache_dir()
    lines = [f"export LD_LIBRARY_PATH={shlex.quote(str(lib_dir.resolve()))}${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}}"]
    # The embedded interpreter finds its standard library from its compiled-in prefix; a
    # relocated Python (prefix moved since it was built) needs PYTHONHOME.
    if os.path.realpath(sys.base_prefix) != os.path.realpath(sysconfig.get_config_var("prefix") or sys.base_prefix):
        lines.append(f"export PYTHONHOME={shlex.quote(sys.base_prefix)}")
    return lines
