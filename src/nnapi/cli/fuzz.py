"""``nnapi fuzz``: random-graph differential testing of a device against the reference."""

from __future__ import annotations

import sys
from collections import Counter

from nnapi.cli._common import EXIT_FAILED, CliError, find_device, print_json, progress


def register(commands, common) -> None:
    parser = commands.add_parser("fuzz", parents=[common],
                                 help="run random valid graphs on DEVICE and on nnapi-reference and compare them; "
                                      "a difference is traced to the operation that fails alone (exit 1 when "
                                      "any does)")
    parser.add_argument("--device", required=True, metavar="NAME", help="the device under test")
    parser.add_argument("--graphs", type=int, default=100, metavar="N", help="graphs to try (default 100)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    parser.add_argument("--max-operations", type=int, default=5, metavar="K",
                        help="operations per graph, at most (default 5)")
    parser.add_argument("--constants", type=float, default=0.0, metavar="P",
                        help="make about this share (0-1) of the graphs' run-time data inputs constants, to "
                             "reach the lowerings a device specializes on constant operands (default 0)")
    parser.add_argument("--out", metavar="DIR", help="write each failing graph here as a replayable CTS vector")
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.set_defaults(func=cmd_fuzz)


def cmd_fuzz(args) -> int:
    from nnapi.tools.fuzz import fuzz

    if args.graphs < 1 or args.max_operations < 1:
        raise CliError("--graphs and --max-operations must be at least 1")
    if not 0.0 <= args.constants <= 1.0:
        raise CliError("--constants must be between 0 and 1")
    device = find_device(args.device)
    outcomes = []
    for outcome in progress(fuzz(device, args.graphs, args.seed, args.out, args.max_operations,
                                 constants=args.constants), args.graphs,
                            f"fuzz {device.name}"):
        outcomes.append(outcome)
        if outcome.status in ("failed", "ill-conditioned") and not args.json:
            where = f" -> {outcome.path}" if outcome.path else ""
            label = "FAIL" if outcome.status == "failed" else "ILL-CONDITIONED"
            print(f"{label} {outcome.graph} [{' '.join(outcome.operations)}]: {outcome.message}{where}")
            sys.stdout.flush()
    counts = Counter(outcome.status for outcome in outcomes)
    if args.json:
        print_json({"device": device.name, "seed": args.seed, "graphs": len(outcomes), **counts,
                    "failures": [vars(o) for o in outcomes if o.status == "failed"],
                    "ill_conditioned": [vars(o) for o in outcomes if o.status == "ill-conditioned"]})
    else:
        print(f"{device.name}: {len(outcomes)} graphs, {counts['passed']} passed, {counts['failed']} failed, "
              f"{counts['ill-conditioned']} ill-conditioned (each operation passes alone; one-step roundings move "
              f"the reference as far), {counts['invalid']} rejected by the reference (seed {args.seed})")
        if counts["failed"] and args.out:
            print(f"replay one with: nnapi conformance {args.out}/<graph>.jsonl (with {device.name} loaded, "
                  "as here, and no --device: operations it refuses run on nnapi-reference); <graph>_op<K>.jsonl "
                  "is operation K alone on the reference's inputs")
    return EXIT_FAILED if counts["failed"] else 0
