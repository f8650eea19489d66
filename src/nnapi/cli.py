"""The ``nnapi`` command line: devices, run, conformance."""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np

import nnapi


def _find_device(name: str | None) -> nnapi.Device | None:
    if name is None:
        return None
    for device in nnapi.get_devices():
        if device.name == name:
            return device
    names = ", ".join(d.name for d in nnapi.get_devices())
    raise SystemExit(f"nnapi: no device named {name!r} (devices: {names})")


def cmd_devices(args: argparse.Namespace) -> int:
    print(f"runtime feature level: {nnapi.get_runtime_feature_level().name}")
    for device in nnapi.get_devices():
        print(f"{device.name}")
        print(f"  type:          {device.type.name}")
        print(f"  version:       {device.version}")
        print(f"  feature level: {device.feature_level.name} ({int(device.feature_level)})")
        capabilities = device.capabilities
        print(f"  relaxed float32 tensor perf: exec_time={capabilities.relaxed_float32_to_float16_tensor.exec_time:g} "
              f"power_usage={capabilities.relaxed_float32_to_float16_tensor.power_usage:g}")
        if args.verbose:
            for code, info in sorted(capabilities.operand_performance.items()):
                print(f"    {code.name:<34} exec_time={info.exec_time:g} power_usage={info.power_usage:g}")
        from nnapi.operations import implemented_operations

        if device.name == "nnapi-reference":
            print(f"  operations:    {len(implemented_operations())} of {len(nnapi.OperationCode)} implemented")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    from nnapi.demo import build_demo_model, demo_expected, demo_input

    device = _find_device(args.device)
    model = build_demo_model()
    compilation = nnapi.Compilation(model, [device] if device else None)
    compilation.finish()
    x = demo_input(args.seed)
    y = np.empty((1, 4), np.float32)
    latencies = []
    for _ in range(max(args.iterations, 1)):
        execution = nnapi.Execution(compilation)
        execution.set_input(0, x)
        execution.set_output(0, y)
        start = time.perf_counter()
        execution.compute()
        latencies.append(time.perf_counter() - start)
    chosen = compilation.device.name if compilation.device else "?"
    print("model: built-in demo CNN (CONV_2D, MAX_POOL_2D, CONV_2D, AVERAGE_POOL_2D, RESHAPE, "
          f"FULLY_CONNECTED, SOFTMAX) on {chosen}")
    print(f"input  0: float32{list(x.shape)}")
    print(f"output 0: float32{execution.get_output_operand_dimensions(0)} (class scores)")
    with np.printoptions(precision=5, suppress=True):
        print(f"  {y[0]}  -> class {int(np.argmax(y[0]))}")
    matches = np.allclose(y, demo_expected(x), rtol=1e-4, atol=1e-6)
    print(f"matches numpy: {'yes' if matches else 'NO'}")
    ms = np.array(latencies) * 1e3
    print(f"latency over {len(ms)} runs: mean {ms.mean():.3f} ms, median {np.median(ms):.3f} ms, "
          f"min {ms.min():.3f} ms")
    return 0 if matches else 1


def _progress(done: int, total: int, failed: int, stream) -> None:
    width = 30
    filled = int(width * done / total) if total else width
    bar = "#" * filled + "-" * (width - filled)
    end = "\n" if done == total else ""
    if stream.isatty() or done == total or done % max(total // 10, 1) == 0:
        prefix = "\r" if stream.isatty() else ""
        stream.write(f"{prefix}[{bar}] {done}/{total} ({failed} failed){end if stream.isatty() else chr(10)}")
        stream.flush()


def _family(record: dict) -> list[str]:
    """The operations a record tests; ADD added by the generator to make inputs internal
    does not count."""
    from nnapi.conformance import operations_of

    names = sorted(operations_of(record))
    if len(names) > 1 and "ADD" in names and "as_internal" in record["test"]:
        names.remove("ADD")
    return names


def cmd_conformance(args: argparse.Namespace) -> int:
    from nnapi.conformance import VARIANTS, default_vector_files, is_supported, load_records, run_record

    device = _find_device(args.device)
    files = [Path(f) for f in args.files] or default_vector_files()
    if not files:
        raise SystemExit("nnapi conformance: give vector files (*.jsonl.gz)")
    wanted = {name.strip().upper() for name in args.ops.split(",")} if args.ops else None
    records = []
    for path in files:
        if not path.exists():
            raise SystemExit(f"nnapi conformance: {path} does not exist")
        for record in load_records(path):
            if args.variant:
                record = VARIANTS[args.variant](record)
                if record is None:
                    continue
            if wanted is None or wanted & set(_family(record)):
                records.append(record)
    table: dict[str, Counter] = defaultdict(Counter)
    failures = []
    failed = 0
    for done, record in enumerate(records, 1):
        families = _family(record)
        if not is_supported(record):
            for name in families:
                table[name]["not implemented"] += 1
        else:
            outcome = run_record(record, device)
            verdict = "passed" if outcome.passed else "failed"
            for name in families:
                table[name][verdict] += 1
            if not outcome.passed:
                failed += 1
                failures.append(outcome)
        if not args.quiet:
            _progress(done, len(records), failed, sys.stderr)
    print(f"{'operation':<32} {'passed':>7} {'failed':>7} {'not impl.':>9}")
    totals: Counter = Counter()
    for name in sorted(table):
        row = table[name]
        totals.update(row)
        print(f"{name:<32} {row['passed']:>7} {row['failed']:>7} {row['not implemented']:>9}")
    passed = sum(1 for r in records if is_supported(r)) - failed
    skipped = sum(1 for r in records if not is_supported(r))
    print(f"{len(records)} vectors: {passed} passed, {failed} failed, {skipped} not implemented")
    for outcome in failures[: args.show_failures]:
        print(f"FAIL {outcome.test}: {outcome.message}")
    return 1 if failed else 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="nnapi", description="The Android Neural Networks API on Linux.")
    parser.add_argument("--version", action="version", version=f"nnapi {nnapi.__version__}")
    commands = parser.add_subparsers(dest="command", required=True)

    devices = commands.add_parser("devices", help="list devices with type, version, feature level, capabilities")
    devices.add_argument("-v", "--verbose", action="store_true", help="per-operand-type performance too")
    devices.set_defaults(func=cmd_devices)

    run = commands.add_parser("run", help="compile and run the built-in demo model, print outputs and latency")
    run.add_argument("--device", help="device name (default: let the runtime choose)")
    run.add_argument("--iterations", type=int, default=20, help="executions to time (default 20)")
    run.add_argument("--seed", type=int, default=0, help="seed of the random input")
    run.set_defaults(func=cmd_run)

    conformance = commands.add_parser("conformance", help="run CTS vectors and print a pass/fail table")
    conformance.add_argument("files", nargs="*", help="vector files (*.jsonl.gz); default: the shipped ones")
    conformance.add_argument("--device", help="run on this device only")
    conformance.add_argument("--ops", help="comma-separated operation names to select (e.g. CONV_2D,ADD)")
    conformance.add_argument("--variant", choices=["dynamic_outputs", "shared_memory_constants", "quant8_signed"],
                             help="run each vector in this variation instead (as Android's generator derives "
                                  "them)")
    conformance.add_argument("--show-failures", type=int, default=20, metavar="N",
                             help="print the first N failures (default 20)")
    conformance.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    conformance.set_defaults(func=cmd_conformance)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except nnapi.NnapiError as error:
        print(f"nnapi: {type(error).__name__}: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
