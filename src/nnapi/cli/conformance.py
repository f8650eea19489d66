"""``nnapi conformance``: run CTS vectors on a device and print a pass/fail table per operation."""

from __future__ import annotations

import argparse
from collections import Counter, defaultdict
from pathlib import Path

from nnapi.cli._common import EXIT_FAILED, CliError, find_device, print_json, progress


def register(commands, common) -> None:
    parser = commands.add_parser("conformance", parents=[common], help="run CTS vectors and print a pass/fail table")
    parser.add_argument("files", nargs="*", help="vector files (*.jsonl.gz); default: the shipped ones")
    parser.add_argument("--device", help="run on this device only")
    parser.add_argument("--ops", help="comma-separated operation names to select (e.g. CONV_2D,ADD)")
    parser.add_argument("--variant", choices=["dynamic_outputs", "shared_memory_constants", "quant8_signed"],
                        help="run each vector in this variation instead (as Android's generator derives them)")
    parser.add_argument("--show-failures", type=int, default=20, metavar="N",
                        help="print the first N failures (default 20)")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.set_defaults(func=cmd_conformance)


def _wanted_operations(ops: str | None) -> set[str] | None:
    """The operation names of ``--ops``; a name that is no operation is a usage error."""
    if not ops:
        return None
    from nnapi.codes import OperationCode

    wanted = {name.strip().upper() for name in ops.split(",") if name.strip()}
    unknown = sorted(wanted - set(OperationCode.__members__))
    if unknown or not wanted:
        raise CliError(f"--ops: unknown operation {', '.join(unknown) or '(none given)'} "
                       "(names as in OperationCode, e.g. CONV_2D,ADD)")
    return wanted


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

    device = find_device(args.device)
    files = [Path(f) for f in args.files] or default_vector_files()
    if not files:
        raise CliError("give vector files (*.jsonl.gz)")
    wanted = _wanted_operations(args.ops)
    records = []
    for path in files:
        if not path.exists():
            raise CliError(f"{path} does not exist")
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
    for record in progress(records, len(records), "conformance") if not args.quiet else records:
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
    passed = sum(1 for r in records if is_supported(r)) - failed
    skipped = sum(1 for r in records if not is_supported(r))
    if args.json:
        print_json({"vectors": len(records), "passed": passed, "failed": failed, "not_implemented": skipped,
                    "operations": {name: dict(row) for name, row in sorted(table.items())},
                    "failures": [{"test": o.test, "operations": list(o.operations), "message": o.message}
                                 for o in failures]})
        return EXIT_FAILED if failed else 0
    print(f"{'operation':<32} {'passed':>7} {'failed':>7} {'not impl.':>9}")
    totals: Counter = Counter()
    for name in sorted(table):
        row = table[name]
        totals.update(row)
        print(f"{name:<32} {row['passed']:>7} {row['failed']:>7} {row['not implemented']:>9}")
    print(f"{len(records)} vectors: {passed} passed, {failed} failed, {skipped} not implemented")
    for outcome in failures[: args.show_failures]:
        print(f"FAIL {outcome.test}: {outcome.message}")
    return EXIT_FAILED if failed else 0
