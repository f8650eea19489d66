"""Benchmark real models: nnapi-reference against LiteRT, single-threaded, in one run.

Times every ``.tflite`` model of a directory (default ``../shared/models`` next to the
repository) on nnapi-reference (imported with ``nnapi.load_tflite``, run through a
Session) and, when ``ai-edge-litert`` is installed, on LiteRT with its default XNNPACK
delegate and with its builtin kernels (``BUILTIN_WITHOUT_DEFAULT_DELEGATES``;
``--reference-kernels`` adds ``BUILTIN_REF``; ``-`` where LiteRT cannot run the model
that way, as selfie_segmentation's custom operator without XNNPACK), all with one thread
and the same random inputs. BLAS is pinned to one thread (environment variables set
before numpy loads; threadpoolctl too when installed).
Prints per model the median milliseconds of each engine and the ratios nnapi / LiteRT,
the compilation (finish) time twice: ``1st compile`` is the first Compilation.finish of a
fresh Python process that only imported nnapi and the model (``bench_compile.py``: what a
script or ``nnapi run`` pays, numba's own start-up included when ``nnapi[fast]`` is in
use), ``compile`` is a later one in this process (numba already loaded by an earlier
model); and the per-execution overhead of a trivial one-ADD model through the public API
(created execution, reusable execution, burst).

Run:  .venv/bin/python benchmarks/bench_models.py [--models DIR] [--repeat 20] [--only NAME]
Compare ratios, not absolute times, on a shared machine.
"""

from __future__ import annotations

import os

for _variable in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "BLIS_NUM_THREADS",
                  "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS"):
    os.environ[_variable] = "1"

import argparse  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
from bench_compile import measure as fresh_process_compile  # noqa: E402

import nnapi  # noqa: E402
from nnapi import OperandCode as T  # noqa: E402
from nnapi import OperandType  # noqa: E402
from nnapi import OperationCode as Op  # noqa: E402

try:  # BLAS libraries that ignore the environment
    from threadpoolctl import threadpool_limits

    threadpool_limits(1)
except ImportError:
    pass

DEFAULT_MODELS = Path(__file__).resolve().parents[2] / "shared" / "models"


def _median_ms(run, repeat: int, warmup: int = 2) -> float:
    for _ in range(warmup):
        run()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def _random_input(dtype: np.dtype, shape, rng) -> np.ndarray:
    dtype = np.dtype(dtype)
    if dtype.kind == "f":
        return rng.uniform(-1, 1, shape).astype(dtype)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return rng.integers(max(info.min, -128), min(info.max, 255) + 1, shape).astype(dtype)
    return rng.integers(0, 2, shape).astype(dtype)


def _litert(path: Path, inputs: list[np.ndarray], resolver, repeat: int) -> float | None:
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_path=str(path), num_threads=1, experimental_op_resolver_type=resolver)
    try:
        interpreter.allocate_tensors()
    except RuntimeError:  # an operator this resolver lacks (a custom one only XNNPACK has): no figure
        return None
    for detail, value in zip(interpreter.get_input_details(), inputs, strict=True):
        interpreter.set_tensor(detail["index"], value)
    return _median_ms(interpreter.invoke, repeat)


def _litert_inputs(path: Path, rng) -> list[np.ndarray] | None:
    try:
        from ai_edge_litert.interpreter import Interpreter
    except ImportError:
        return None
    interpreter = Interpreter(model_path=str(path), num_threads=1)
    return [_random_input(d["dtype"], d["shape"], rng) for d in interpreter.get_input_details()]


def bench_model(path: Path, repeat: int, reference_kernels: bool) -> dict:
    rng = np.random.default_rng(0)
    row: dict = {"model": path.stem}
    start = time.perf_counter()
    imported = nnapi.load_tflite(str(path))
    row["import_ms"] = (time.perf_counter() - start) * 1e3
    reference = [d for d in nnapi.get_devices() if d.name == "nnapi-reference"]
    start = time.perf_counter()
    compilation = nnapi.Compilation(imported.model, reference)
    compilation.finish()
    row["compile_ms"] = (time.perf_counter() - start) * 1e3
    mode = "numpy" if os.environ.get("NNAPI_NO_NUMBA", "") not in ("", "0") else "numba"
    try:
        row["first_compile_ms"] = fresh_process_compile(path, mode)["first_finish"][0]
    except (RuntimeError, ValueError):
        row["first_compile_ms"] = None
    session = nnapi.Session(imported, devices="nnapi-reference")
    inputs = _litert_inputs(path, rng)
    if inputs is None:
        inputs = [_random_input(spec.dtype, spec.shape, rng) for spec in session.inputs]
    feed = {spec.name: value for spec, value in zip(session.inputs, inputs, strict=True)}
    row["nnapi"] = _median_ms(lambda: session.run(feed), repeat)
    try:
        from ai_edge_litert.interpreter import OpResolverType
    except ImportError:
        return row
    row["xnnpack"] = _litert(path, inputs, OpResolverType.AUTO, repeat)
    row["builtin"] = _litert(path, inputs, OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES, repeat)
    if reference_kernels:
        row["builtin_ref"] = _litert(path, inputs, OpResolverType.BUILTIN_REF, max(3, repeat // 4))
    return row


def trivial_overheads(count: int = 3000) -> dict[str, float]:
    """Microseconds per execution of a one-ADD model ([1, 4] float32) through the public API."""
    model = nnapi.Model()
    tensor = OperandType(T.TENSOR_FLOAT32, [1, 4])
    a, b = model.add_operand(tensor), model.add_operand(tensor)
    fuse = model.add_operand(OperandType(T.INT32, []))
    c = model.add_operand(tensor)
    model.set_operand_value(fuse, np.int32(0))
    model.add_operation(Op.ADD, [a, b, fuse], [c])
    model.identify_inputs_and_outputs([a, b], [c])
    model.finish()
    compilation = nnapi.Compilation(model, [nnapi.get_devices()[0]])  # nnapi-reference: its kernels
    compilation.finish()
    x, y, out = np.ones((1, 4), np.float32), np.ones((1, 4), np.float32), np.empty((1, 4), np.float32)

    def create() -> None:
        execution = nnapi.Execution(compilation)
        execution.set_input(0, x)
        execution.set_input(1, y)
        execution.set_output(0, out)
        execution.compute()

    def reusable() -> nnapi.Execution:
        execution = nnapi.Execution(compilation)
        execution.set_reusable(True)
        execution.set_input(0, x)
        execution.set_input(1, y)
        execution.set_output(0, out)
        return execution

    again, bursting, burst = reusable(), reusable(), nnapi.Burst(compilation)

    def per_call_us(run) -> float:
        for _ in range(200):
            run()
        best = float("inf")
        for _ in range(5):
            start = time.perf_counter()
            for _ in range(count):
                run()
            best = min(best, (time.perf_counter() - start) / count)
        return best * 1e6

    return {"create + compute": per_call_us(create), "reusable compute": per_call_us(again.compute),
            "burst compute": per_call_us(lambda: bursting.burst_compute(burst)),
            "numpy add": per_call_us(lambda: np.add(x, y, out=out))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", type=Path, default=DEFAULT_MODELS)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--only", action="append", help="model name (stem); repeatable")
    parser.add_argument("--reference-kernels", action="store_true", help="also time LiteRT BUILTIN_REF")
    parser.add_argument("--no-trivial", action="store_true", help="skip the trivial-model overheads")
    args = parser.parse_args()
    paths = sorted(args.models.glob("*.tflite"))
    if args.only:
        paths = [p for p in paths if p.stem in args.only]
    header = (f"{'model':36} {'nnapi ms':>9} {'builtin':>9} {'xnnpack':>9} {'/builtin':>9} {'/xnnpack':>9}"
              f"{'/ref':>7} {'1st compile':>12} {'compile':>8}")
    print(header)
    print("-" * len(header))
    for path in paths:
        try:
            row = bench_model(path, args.repeat, args.reference_kernels)
        except Exception as error:  # report and go on with the next model
            print(f"{path.stem:36} failed: {type(error).__name__}: {error}")
            continue
        builtin, xnnpack, ref = row.get("builtin"), row.get("xnnpack"), row.get("builtin_ref")

        def cell(value, width=9, digits=2):
            return f"{value:>{width}.{digits}f}" if value else f"{'-':>{width}}"

        print(f"{row['model']:36} {cell(row['nnapi'])} {cell(builtin)} {cell(xnnpack)} "
              f"{cell(builtin and row['nnapi'] / builtin)} {cell(xnnpack and row['nnapi'] / xnnpack)}"
              f"{cell(ref and row['nnapi'] / ref, 7)} {cell(row['first_compile_ms'], 12, 1)} "
              f"{cell(row['compile_ms'], 8, 1)}", flush=True)
    if not args.no_trivial:
        print("\ntrivial one-ADD model, microseconds per execution:")
        for name, value in trivial_overheads().items():
            print(f"  {name:20} {value:8.1f}")


if __name__ == "__main__":
    main()
