"""``nnapi bench``: latency of a model in nnapi (warm-up, then mean, median, p5 / p95,
min; compile time) and, when ai-edge-litert is installed, of the same model in LiteRT
(single-threaded) on the same inputs in the same run, with the ratio. ``--each-device``
also times the model on every device alone (a device that cannot run all of it says why)
beside the runtime's own choice and LiteRT's XNNPACK and builtin kernels.

Every engine gets the same number of threads (``--threads``, default 1): LiteRT's
interpreter, and numpy's BLAS under nnapi-reference, which otherwise runs one thread per
core and on a busy machine makes small models several times slower. BLAS is pinned with
threadpoolctl (``nnapi[litert]``); without it the report says whether the environment
(OPENBLAS_NUM_THREADS, ...) pinned it. nnapi-ort-cpu keeps its own setting
(NNAPI_ORT_THREADS, default 1)."""

from __future__ import annotations

import argparse
import contextlib
import os
import time

import nnapi
from nnapi.cli._common import CliError, add_signature, print_json
from nnapi.cli._model import (
    add_run_arguments,
    format_stats,
    latency_stats,
    litert_interpreter,
    litert_run,
    non_negative,
    open_session,
    positive,
    read_inputs,
    time_runs,
)


def register(commands, common) -> None:
    parser = commands.add_parser("bench", parents=[common],
                                 help="latency statistics of a model, side by side with LiteRT (single-threaded)")
    add_signature(parser)
    parser.add_argument("model", help="a .tflite model")
    parser.add_argument("--iterations", type=positive, default=10, help="timed executions (default 10)")
    parser.add_argument("--warmup", type=non_negative, default=2, help="untimed executions first (default 2)")
    add_run_arguments(parser)
    parser.add_argument("--threads", type=positive, default=1,
                        help="threads of LiteRT and of numpy's BLAS under nnapi-reference (default 1)")
    parser.add_argument("--no-litert", action="store_true", help="do not time LiteRT")
    parser.add_argument("--per-op", action="store_true",
                        help="also time each operation (nnapi-reference records them), slowest first")
    parser.add_argument("--each-device", action="store_true",
                        help="also time the model on each device alone (the --device ones, or every device), "
                             "side by side with LiteRT's XNNPACK and builtin kernels")
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.set_defaults(func=cmd_bench)


def _each_device(args: argparse.Namespace, feeds: dict) -> dict[str, dict]:
    """Latency of the model on each device alone, or why that device cannot run all of it."""
    names = args.device or [device.name for device in nnapi.get_devices()]
    results: dict[str, dict] = {}
    for name in names:
        try:
            session = open_session(args.model, [name], args.keep_loops, args.input_shape, args.signature)
        except nnapi.NnapiError as error:
            results[name] = {"error": f"cannot run the whole model: {error}"}
            continue
        results[name] = latency_stats(time_runs(lambda session=session: session.run(feeds), args.iterations,
                                                args.warmup))
    return results


def _ratios(stats: dict, anchors: dict[str, dict | None]) -> str:
    return "  ".join(f"{stats['median_ms'] / anchor['median_ms']:.2f}x {label}"
                     for label, anchor in anchors.items() if anchor is not None)


_BLAS_VARIABLES = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "BLIS_NUM_THREADS")


def _threads(count: int) -> str:
    return f"{count} thread{'s' * (count > 1)}"


def _pinned_blas(threads: int, stack: contextlib.ExitStack) -> str:
    """Limit numpy's BLAS to ``threads`` for the rest of the command (restored on exit of
    ``stack``); says how, or why it could not."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        pinned = [name for name in _BLAS_VARIABLES if os.environ.get(name) == str(threads)]
        if pinned:
            return f"{_threads(threads)} ({pinned[0]})"
        return (f"not pinned to {_threads(threads)}: install threadpoolctl "
                f"(pip install 'nnapi[litert]') or set OPENBLAS_NUM_THREADS={threads}")
    stack.enter_context(threadpool_limits(limits=threads, user_api="blas"))
    return f"{_threads(threads)} (threadpoolctl)"


def quantized_products() -> str:
    """How nnapi-reference multiplies quantized CONV_2D / FULLY_CONNECTED operands here:
    the integer multiply-add of ``nnapi[fast]`` where the processor has it (naming the
    form: avx512 or avx2), else exact integer-valued float products through numpy's BLAS
    (and why)."""
    from nnapi.operations import _jit

    if _jit.kernels() is None:
        return "float products through numpy's BLAS (exact integers; nnapi[fast] not in use)"
    form = _jit.integer_products()
    if form is None:
        return "float products through numpy's BLAS (exact integers; no 16-bit multiply-add kernel for this processor)"
    return f"int32 sums on the processor's 16-bit multiply-add (nnapi[fast], {form.name})"


def cmd_bench(args: argparse.Namespace) -> int:
    with contextlib.ExitStack() as stack:
        blas = _pinned_blas(args.threads, stack)
        return _bench(args, blas)


def _bench(args: argparse.Namespace, blas: str) -> int:
    start = time.perf_counter()
    session = open_session(args.model, args.device, args.keep_loops, args.input_shape, args.signature)
    load_and_compile = time.perf_counter() - start
    feeds, _ = read_inputs(session, args.input, args.seed)
    nnapi_stats = latency_stats(time_runs(lambda: session.run(feeds), args.iterations, args.warmup))
    report = {"model": args.model, "devices": sorted(set(session.device_names)),
              "iterations": args.iterations, "warmup": args.warmup, "threads": args.threads, "blas": blas,
              "import_and_compile_ms": load_and_compile * 1e3, "compile_ms": session.compile_seconds * 1e3,
              "quantized_products": quantized_products(), "nnapi": nnapi_stats, "litert": None}
    signature = {"signature": args.signature, "names": session.imported.signature_names}
    interpreter = None if args.no_litert else litert_interpreter(args.model, threads=args.threads,
                                                                 shapes=args.input_shape, **signature)
    if interpreter is not None:
        litert_stats = latency_stats(time_runs(lambda: litert_run(interpreter, feeds), args.iterations,
                                               args.warmup))
        report["litert"] = litert_stats
        report["ratio_mean"] = nnapi_stats["mean_ms"] / litert_stats["mean_ms"]
        report["ratio_median"] = nnapi_stats["median_ms"] / litert_stats["median_ms"]
    if args.each_device:
        report["per_device"] = _each_device(args, feeds)
        try:
            builtin = None if args.no_litert else litert_interpreter(args.model, builtin_kernels=True,
                                                                      threads=args.threads, shapes=args.input_shape,
                                                                      **signature)
        except CliError as error:  # a model only the XNNPACK delegate runs (a custom operator of its own)
            builtin = None
            report["litert_builtin_error"] = str(error).split(": ", 1)[-1]
        report["litert_builtin"] = None if builtin is None else latency_stats(
            time_runs(lambda: litert_run(builtin, feeds), args.iterations, args.warmup))
    if args.per_op:
        from nnapi.tools.profile import format_profile, profile

        try:
            report["per_operation"] = profile(lambda: session.run(feeds), args.iterations)
        except RuntimeError as error:
            raise CliError(str(error)) from None
    if args.json:
        print_json(report)
        return 0
    threads_note = f"[{_threads(args.threads)}]"
    print(f"model: {args.model}")
    print(f"device: {', '.join(report['devices'])}    import + compile: {report['import_and_compile_ms']:.1f} ms "
          f"(compile {report['compile_ms']:.1f} ms)    warm-up: {args.warmup} runs")
    print(f"BLAS (numpy, under nnapi-reference): {blas}")
    print(f"quantized products (nnapi-reference): {report['quantized_products']}")
    print(f"nnapi:  {format_stats(nnapi_stats)}")
    if report["litert"] is not None:
        print(f"LiteRT: {format_stats(report['litert'])}  {threads_note}")
        print(f"ratio nnapi / LiteRT: mean {report['ratio_mean']:.2f}x, median {report['ratio_median']:.2f}x")
    elif not args.no_litert:
        print("LiteRT: not installed (pip install 'nnapi[litert]' to compare)")
    if args.each_device:
        anchors = {"LiteRT XNNPACK": report["litert"], "LiteRT builtin": report["litert_builtin"]}
        if report["litert_builtin"] is not None:
            print(f"LiteRT builtin kernels: {format_stats(report['litert_builtin'])}  {threads_note}")
        elif "litert_builtin_error" in report:
            print(f"LiteRT builtin kernels: {report['litert_builtin_error']}")
        print("each device alone (median; ratio to LiteRT's median):")
        rows = {f"runtime's choice ({', '.join(report['devices'])})": nnapi_stats, **report["per_device"]}
        width = max(len(label) for label in rows)
        for label, stats in rows.items():
            if "error" in stats:
                print(f"  {label:<{width}}  {stats['error']}")
            else:
                print(f"  {label:<{width}}  {stats['median_ms']:9.3f} ms  {_ratios(stats, anchors)}".rstrip())
    if args.per_op:
        print(format_profile(report["per_operation"]))
    return 0
