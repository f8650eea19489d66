"""``nnapi dump``: a model's graph as Graphviz DOT, SVG or JSON, coloured by device."""

from __future__ import annotations

import json
import sys

import nnapi
from nnapi.cli._common import CliError, add_signature, devices_named, load_model


def register(commands, common) -> None:
    parser = commands.add_parser("dump", parents=[common],
                                 help="the model's graph (operands, operations, subgraphs, devices) as DOT, SVG "
                                      "or JSON")
    add_signature(parser)
    parser.add_argument("model", help="a .tflite model or a CTS vector file (.jsonl[.gz])")
    parser.add_argument("--format", choices=["dot", "svg", "json"], default="dot", help="output format (default dot)")
    parser.add_argument("-o", "--out", help="write to this file instead of standard output")
    parser.add_argument("--device", action="append", metavar="NAME",
                        help="compile for these devices (repeatable; default: every device)")
    parser.add_argument("--no-compile", action="store_true", help="the model alone, without devices")
    parser.set_defaults(func=cmd_dump)


def cmd_dump(args) -> int:
    from nnapi.tools.graph_dump import graph_dump, render_svg, to_dot

    loaded = load_model(args.model, args.keep_loops, args.input_shape, args.signature)
    compilation = None
    if not args.no_compile:
        compilation = nnapi.Compilation(loaded.model, devices_named(args.device))
        try:
            compilation.finish()
        except nnapi.NnapiError as error:
            print(f"nnapi dump: not compiled ({type(error).__name__}: {error}); drawing without devices",
                  file=sys.stderr)
            compilation = None
    graph = graph_dump(loaded.model, compilation, names=loaded.operand_names)
    if args.format == "json":
        text = json.dumps(graph, indent=1) + "\n"
    elif args.format == "dot":
        text = to_dot(graph)
    else:
        try:
            text = render_svg(to_dot(graph))
        except (FileNotFoundError, RuntimeError) as error:
            raise CliError(str(error)) from None
    if args.out:
        try:
            with open(args.out, "w") as handle:
                handle.write(text)
        except OSError as error:
            raise CliError(f"cannot write {args.out}: {error.strerror}") from None
    else:
        sys.stdout.write(text)
    return 0
