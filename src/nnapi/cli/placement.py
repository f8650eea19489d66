"""``nnapi placement``: where each operation runs, which devices refused it and why."""

from __future__ import annotations

import nnapi
from nnapi.cli._common import add_signature, devices_named, load_model, print_json


def register(commands, common) -> None:
    parser = commands.add_parser("placement", parents=[common],
                                 help="each operation's device, the devices that refused it and why, partitions, "
                                      "bytes moved between devices")
    add_signature(parser)
    parser.add_argument("model", help="a .tflite model or a CTS vector file (.jsonl[.gz])")
    parser.add_argument("--device", action="append", metavar="NAME",
                        help="candidate devices (repeatable; default: every device, with CPU fallback)")
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.set_defaults(func=cmd_placement)


def cmd_placement(args) -> int:
    from nnapi.tools.placement import format_placement

    loaded = load_model(args.model, args.keep_loops, args.input_shape, args.signature)
    compilation = nnapi.Compilation(loaded.model, devices_named(args.device))
    compilation.finish()
    report = compilation.placement()
    if loaded.source_ops:
        for entry in report["operations"]:
            if entry["index"] < len(loaded.source_ops):
                entry["source"] = loaded.source_ops[entry["index"]]
    if args.json:
        print_json(report)
    else:
        print(format_placement(report, loaded.source_ops))
    return 0
