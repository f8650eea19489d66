"""Build libneuralnetworks.so with cffi's embedding API.

Every NDK function becomes a small C entry point (generated from the signature table)
that checks the embedded interpreter started and forwards its arguments, unchanged, to
an ``extern "Python"`` function ``nnapi_py_<name>`` implemented in nnapi.capi.bridge.
The generated header is included by the library's own source, so the compiler checks
that what the header declares is exactly what the library defines.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

from nnapi.capi.header import write_include_dir
from nnapi.capi.signatures import FUNCTIONS, OPAQUE_TYPES, STRUCTS

MODULE_NAME = "_nnapi_capi"
LIBRARY_FILE = "libneuralnetworks.so"


def _cdef() -> str:
    lines = ["typedef struct AHardwareBuffer AHardwareBuffer;"]
    lines += [f"typedef struct {name} {name};" for name in OPAQUE_TYPES]
    lines += [STRUCTS, "typedef int32_t ANeuralNetworksOperationType;"]
    return "\n".join(lines)


def _python_declarations() -> str:
    lines = [f"{f.result} nnapi_py_{f.name}({f.parameter_list});" for f in FUNCTIONS]
    lines += ["const char* nnapi_py_nnapi_capi_last_error(void);", "int nnapi_py_ready(void);"]
    return "\n".join(lines)


def _failure_value(result: str) -> str:
    return {"int": "ANEURALNETWORKS_OP_FAILED", "void": ""}.get(result, "0")


def _c_source() -> str:
    """The exported entry points: start Python once, then forward."""
    lines = ["#include <android/NeuralNetworks.h>", "#include <android/NeuralNetworksExtensions.h>",
             "#include <nnapi/capi.h>", "",
             _python_declarations(), "",
             "/* 1 once the embedded interpreter has run nnapi's init code, -1 if that failed",
             "   (cffi prints why); entry points then fail with OP_FAILED instead of",
             "   returning values that were never written. */",
             "static volatile int nnapi_state = 0;",
             "static int nnapi_ready(void) {",
             "    if (nnapi_state == 0) nnapi_state = nnapi_py_ready() == 1 ? 1 : -1;",
             "    return nnapi_state == 1;",
             "}", ""]
    for function in FUNCTIONS:
        failure = _failure_value(function.result)
        call = f"nnapi_py_{function.name}({function.argument_list})"
        lines.append(f"{function.prototype} {{")
        lines.append(f"    if (!nnapi_ready()) return {failure};".replace("return ;", "return;"))
        lines.append(f"    {'' if function.result == 'void' else 'return '}{call};")
        lines.append("}")
    lines += ["const char* nnapi_capi_last_error(void) {",
              '    if (!nnapi_ready()) return "nnapi: the embedded Python failed to start (see stderr)";',
              "    return nnapi_py_nnapi_capi_last_error();", "}"]
    return "\n".join(lines) + "\n"


def _python_paths() -> list[str]:
    """Directories the embedded interpreter needs beyond its standard library: where
    nnapi, numpy and cffi's backend are installed here."""
    import _cffi_backend
    import numpy

    import nnapi

    paths: list[str] = []
    for module_file in (nnapi.__file__, numpy.__file__):
        directory = str(Path(module_file).resolve().parent.parent)
        if directory not in paths:
            paths.append(directory)
    backend_dir = str(Path(_cffi_backend.__file__).resolve().parent)
    if backend_dir not in paths:
        paths.append(backend_dir)
    return paths


def _init_code() -> str:
    return f"""\
import sys
# Where nnapi was installed when the library was built; PYTHONPATH entries come first.
for _path in {_python_paths()!r}:
    if _path not in sys.path:
        sys.path.append(_path)
from {MODULE_NAME} import ffi
from nnapi.capi import bridge
bridge.install(ffi)
"""


def build_library(out: Path, verbose: bool = False) -> Path:
    """Build ``out/libneuralnetworks.so`` and ``out/include``; returns the library path."""
    try:
        import cffi
    except ImportError:
        raise RuntimeError("building the C API needs cffi: pip install 'nnapi[capi]'") from None
    out = out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    include = write_include_dir(out / "include")
    builder = cffi.FFI()
    builder.cdef(_cdef())
    builder.embedding_api(_python_declarations())
    builder.set_source(MODULE_NAME, _c_source(), include_dirs=[str(include)], extra_compile_args=["-O2"])
    builder.embedding_init_code(_init_code())
    with tempfile.TemporaryDirectory(prefix="nnapi-capi-") as tmp:
        built = builder.compile(tmpdir=tmp, target="libneuralnetworks.*", verbose=verbose)
        # Replace atomically: a running program may have the previous library mapped.
        staged = out / f".{LIBRARY_FILE}.{os.getpid()}"
        shutil.copyfile(built, staged)
        os.chmod(staged, 0o755)
        os.replace(staged, out / LIBRARY_FILE)
    return out / LIBRARY_FILE


if __name__ == "__main__":
    print(build_library(Path(sys.argv[1] if len(sys.argv) > 1 else ".")))
