"""``nnapi conformance``: run CTS vectors on a device and print a pass/fail table per operation."""

from __future__ import annotations

import argparse
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


def cmd_conformance(args: argparse.Namespace) -> int:
    from nnapi.conformance import VectorFileError, run_conformance, select_records

    device = find_device(args.device)
    wanted = _wanted_operations(args.ops)
    for name in args.files:
        if not Path(name).exists():
            raise CliError(f"{name} does not exist")
    try:
        records = select_records(args.files or None, wanted, args.variant)
    except VectorFileError as error:  # names the file, the line and the rule
        raise CliError(str(error)) from None
    except (OSError, ValueError, KeyError) as error:
        raise CliError(f"cannot read the vectors: {type(error).__name__}: {error}") from None
    if not records:
        raise CliError("no vectors selected")
    chosen = progress(records, len(records), "conformance") if not args.quiet else records
    report = run_conformance(device, records=chosen)
    # a vector selected by --ops may test other operations with the one asked for (a
    # CONV_2D after a LOGISTIC): the table lists only the operations asked for
    table = report.by_operation(wanted)
    others = sorted({name for o in report.outcomes for name in o.operations} - set(table)) if wanted else []
    if args.json:
        print_json({"vectors": len(report.outcomes), "passed": report.passed, "failed": report.failed,
                    "declined": report.declined, "not_implemented": report.not_implemented,
                    "operations": table, "also_tested": others,
                    "failures": [{"test": o.test, "operations": list(o.operations), "message": o.message}
                                 for o in report.failures]})
        return EXIT_FAILED if report.failed else 0
    print(f"{'operation':<32} {'passed':>7} {'failed':>7} {'declined':>8} {'not impl.':>9}")
    for name, row in table.items():
        print(f"{name:<32} {row['passed']:>7} {row['failed']:>7} {row['declined']:>8} {row['not implemented']:>9}")
    print(f"{len(report.outcomes)} vectors: {report.passed} passed, {report.failed} failed, "
          f"{report.declined} declined by the device, {report.not_implemented} not implemented")
    if others:
        mixed = sum(1 for o in report.outcomes if set(o.operations) - set(table))
        print(f"({mixed} of these vectors also test {', '.join(others)}: counted in the totals, not listed)")
    for outcome in report.failures[: args.show_failures]:
        print(f"FAIL {outcome.test}: {outcome.message}")
    return EXIT_FAILED if report.failed else 0
