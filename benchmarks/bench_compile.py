"""Benchmark compilation as a user meets it: each model in a fresh Python process.

For every ``.tflite`` model (default: the MobileNets of ``../shared/models``) a new
interpreter imports nnapi, imports the model (``nnapi.load_tflite``), discovers the
devices (``get_devices``: each driver starts, nnapi-reference importing numba and
loading the compiled kernels of quantized convolution models when ``nnapi[fast]`` is
installed, the ORT driver importing onnxruntime) and times
``Compilation.finish()`` on nnapi-reference: the first compilation in the process (what a
script or ``nnapi run`` pays, each compiled kernel's loading included), a second
compilation of the same model, and the first execution after them (so that no cost moved
out of ``finish`` into it goes unseen). Wall and CPU milliseconds,
the best of ``--repeat`` processes (a shared machine adds noise, never removes it).

Modes: ``numba`` (the compiled kernels, their on-disk cache as it is: warm after the
first ever run), ``numba-cold`` (a fresh, empty ``NUMBA_CACHE_DIR``: the first use on a
machine) and ``numpy`` (``NNAPI_NO_NUMBA=1``). Modes needing numba are skipped without it.

Run:  .venv/bin/python benchmarks/bench_compile.py [--models DIR] [--only NAME] [--mode numba] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

DEFAULT_MODELS = Path(__file__).resolve().parents[2] / "shared" / "models"
MODES = ("numba", "numba-cold", "numpy")

#: what one fresh process runs: prints a JSON object of milliseconds
_CHILD = r"""
import json, sys, time
clock, cpu = time.perf_counter, time.process_time
def since(start):
    return [(clock() - start[0]) * 1e3, (cpu() - start[1]) * 1e3]
start = (clock(), cpu())
import nnapi
out = {"import_nnapi": since(start)}
start = (clock(), cpu())
imported = nnapi.load_tflite(sys.argv[1])
out["load_model"] = since(start)
start = (clock(), cpu())
devices = [d for d in nnapi.get_devices() if d.name == "nnapi-reference"]
out["get_devices"] = since(start)
start = (clock(), cpu())
compilation = nnapi.Compilation(imported.model, devices)
compilation.finish()
out["first_finish"] = since(start)
start = (clock(), cpu())
again = nnapi.Compilation(imported.model, devices)
again.finish()
out["second_finish"] = since(start)
import numpy as np
execution = nnapi.Execution(compilation)
for i, spec in enumerate(imported.inputs):
    execution.set_input(i, np.zeros(spec.shape, spec.dtype))
outputs = [np.empty(spec.shape, spec.dtype) for spec in imported.outputs]
for i, array in enumerate(outputs):
    execution.set_output(i, array)
start = (clock(), cpu())
execution.compute()
out["first_execution"] = since(start)
execution = nnapi.Execution(compilation)
for i, spec in enumerate(imported.inputs):
    execution.set_input(i, np.zeros(spec.shape, spec.dtype))
for i, array in enumerate(outputs):
    execution.set_output(i, array)
start = (clock(), cpu())
execution.compute()
out["second_execution"] = since(start)
out["numba_loaded"] = "numba" in sys.modules
print(json.dumps(out))
"""

COLUMNS = ("import_nnapi", "load_model", "get_devices", "first_finish", "second_finish", "first_execution",
           "second_execution")


def numba_installed() -> bool:
    try:
        import numba  # noqa: F401
    except ImportError:
        return False
    return True


def measure(path: Path, mode: str) -> dict:
    """One fresh process compiling ``path`` in ``mode``: {column: [wall ms, cpu ms]}."""
    env = dict(os.environ)
    env.pop("NNAPI_NO_NUMBA", None)
    for variable in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env[variable] = "1"
    with tempfile.TemporaryDirectory(prefix="nnapi-numba-cache-") as cache:
        if mode == "numpy":
            env["NNAPI_NO_NUMBA"] = "1"
        elif mode == "numba-cold":
            env["NUMBA_CACHE_DIR"] = cache
        result = subprocess.run([sys.executable, "-c", _CHILD, str(path)], env=env, capture_output=True, text=True,
                                check=False)
    if result.returncode != 0:
        raise RuntimeError(result.stderr.strip().splitlines()[-1] if result.stderr.strip() else "child failed")
    return json.loads(result.stdout.strip().splitlines()[-1])


def best_of(path: Path, mode: str, repeat: int) -> dict:
    """Per column the run with the smallest wall time among ``repeat`` fresh processes."""
    runs = [measure(path, mode) for _ in range(repeat)]
    best = {column: min((run[column] for run in runs), key=lambda pair: pair[0]) for column in COLUMNS}
    best["numba_loaded"] = runs[0]["numba_loaded"]
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", type=Path, default=DEFAULT_MODELS)
    parser.add_argument("--only", action="append", help="model name (stem); repeatable (default: the MobileNets)")
    parser.add_argument("--all", action="store_true", help="every model of the directory, not only the MobileNets")
    parser.add_argument("--mode", action="append", choices=MODES, help="repeatable (default: numba and numpy)")
    parser.add_argument("--repeat", type=int, default=3, help="fresh processes per model and mode (best kept)")
    args = parser.parse_args()
    paths = sorted(args.models.glob("*.tflite"))
    if args.only:
        paths = [p for p in paths if p.stem in args.only]
    elif not args.all:
        paths = [p for p in paths if p.stem.startswith("mobilenet")]
    modes = args.mode or ["numba", "numpy"]
    if not numba_installed():
        skipped = [mode for mode in modes if mode != "numpy"]
        if skipped:
            print(f"numba is not installed: skipping {', '.join(skipped)}")
        modes = [mode for mode in modes if mode == "numpy"]
    print("milliseconds, wall (cpu), best of", args.repeat, "fresh processes per row")
    header = f"{'model':40} {'mode':11}" + "".join(f"{name:>18}" for name in COLUMNS)
    print(header)
    print("-" * len(header))
    for path in paths:
        for mode in modes:
            try:
                row = best_of(path, mode, args.repeat)
            except (RuntimeError, ValueError) as error:
                print(f"{path.stem:40} {mode:11} failed: {error}")
                continue
            cells = "".join(f"{row[c][0]:>9.1f} ({row[c][1]:>5.1f})" for c in COLUMNS)
            print(f"{path.stem:40} {mode:11}{cells}", flush=True)


if __name__ == "__main__":
    main()
