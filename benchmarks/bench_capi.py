"""Per-call overhead of the C API: the same trivial model (ADD of two TENSOR_FLOAT32 [16])
run through libneuralnetworks.so from a C program and through the Python API directly.

Run:  .venv/bin/python benchmarks/bench_capi.py [--iterations 2000] [--lib DIR]
Builds the library (into a temp dir unless --lib names a `nnapi capi build --out` dir),
compiles benchmarks/bench_capi.c with the system compiler, and prints microseconds per
operation for C and Python side by side, with the difference (what the C layer adds).
LiteRT has no counterpart of this measurement (it is the cost of crossing from C into
the Python runtime), so no LiteRT column.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np

import nnapi
from nnapi import OperandCode as T
from nnapi import OperationCode as Op

HERE = Path(__file__).resolve().parent
ROUNDS = 5  # each figure is the best round (as bench_capi.c): the machine may be shared


def python_figures(iterations: int) -> dict[str, float]:
    """Microseconds per operation through the Python API, same steps as bench_capi.c."""
    model = nnapi.Model()
    tensor = nnapi.OperandType(T.TENSOR_FLOAT32, [16])
    a_index, b_index = model.add_operand(tensor), model.add_operand(tensor)
    act = model.add_operand(nnapi.OperandType(T.INT32))
    y_index = model.add_operand(tensor)
    model.set_operand_value(act, np.int32(0))
    model.add_operation(Op.ADD, [a_index, b_index, act], [y_index])
    model.identify_inputs_and_outputs([a_index, b_index], [y_index])
    model.finish()
    compilation = nnapi.Compilation(model)
    compilation.finish()
    a = np.arange(16, dtype=np.float32)
    b = a.copy()
    y = np.empty(16, np.float32)
    rounds = iterations // ROUNDS

    def best(step) -> float:
        times = []
        for _ in range(ROUNDS):
            start = time.perf_counter()
            for _ in range(rounds):
                step()
            times.append((time.perf_counter() - start) / rounds * 1e6)
        return min(times)

    def new_execution() -> None:
        execution = nnapi.Execution(compilation)
        execution.set_input(0, a)
        execution.set_input(1, b)
        execution.set_output(0, y)
        execution.compute()
        execution.free()

    reusable = nnapi.Execution(compilation)
    reusable.set_reusable(True)
    reusable.set_input(0, a)
    reusable.set_input(1, b)
    reusable.set_output(0, y)
    figures = {"call": best(nnapi.get_device_count), "execution": best(new_execution),
               "compute": best(reusable.compute)}
    assert y[3] == 6.0
    return figures


def c_figures(iterations: int, lib_dir: Path | None, work: Path) -> dict[str, float]:
    from nnapi import capi

    library = lib_dir / capi.LIBRARY_NAME if lib_dir else capi.build(work / "lib")
    compiler = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if compiler is None:
        raise SystemExit("bench_capi: no C compiler (cc / gcc)")
    program = work / "bench_capi"
    subprocess.run([compiler, "-O2", str(HERE / "bench_capi.c"), f"-I{library.parent / 'include'}",
                    f"-L{library.parent}", "-lneuralnetworks", f"-Wl,-rpath,{library.parent}", "-o", str(program)],
                   check=True)
    output = subprocess.run([str(program), str(iterations)], capture_output=True, text=True, check=True).stdout
    return {name: float(value) for name, value in (line.split() for line in output.splitlines())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=2000)
    parser.add_argument("--lib", type=Path, default=None, help="a `nnapi capi build --out` directory")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="nnapi-bench-capi-") as tmp:
        c = c_figures(args.iterations, args.lib, Path(tmp))
    py = python_figures(args.iterations)
    rows = [("call", "one trivial call (getDeviceCount)"),
            ("execution", "new execution: create, 2 inputs, output, compute, free"),
            ("compute", "reusable execution: compute only")]
    print(f"{'what (us per operation)':<58}{'C API':>10}{'Python':>10}{'C - Py':>10}{'C / Py':>8}")
    for key, label in rows:
        print(f"{label:<58}{c[key]:>10.2f}{py[key]:>10.2f}{c[key] - py[key]:>10.2f}{c[key] / py[key]:>8.2f}")


if __name__ == "__main__":
    main()
