"""``nnapi inspect``: what a model file holds and how nnapi sees it: inputs, outputs,
the NNAPI operation histogram, the lowerings the importer applied, and which device
each operation would run on."""

from __future__ import annotations

import argparse
from collections import Counter

import nnapi
from nnapi.cli._common import add_signature, print_json
from nnapi.cli._model import open_session


def register(commands, common) -> None:
    parser = commands.add_parser("inspect", parents=[common],
                                 help="a model's inputs, outputs, operation histogram, lowerings and the device "
                                      "each operation would run on")
    add_signature(parser)
    parser.add_argument("model", help="a .tflite model")
    parser.add_argument("--device", action="append", metavar="NAME",
                        help="candidate devices (repeatable; default: every device)")
    parser.add_argument("--operations", action="store_true", help="list every operation with its source and device")
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.set_defaults(func=cmd_inspect)


def _spec(spec) -> dict:
    entry = {"name": spec.name, "type": spec.type.name, "dtype": spec.dtype.name, "shape": list(spec.shape)}
    if spec.is_quantized:
        entry.update(scale=spec.scale, zero_point=spec.zero_point)
    return entry


def _placement(session: nnapi.Session) -> list[str]:
    """The device of each operation of the main model."""
    compilation = session.compilation
    placement = getattr(compilation, "placement", None)
    if placement is not None:
        return [entry["device"] for entry in placement()["operations"]]
    devices = list(session.device_names)
    return devices * session.model.operation_count if len(devices) == 1 else ["?"] * session.model.operation_count


def cmd_inspect(args: argparse.Namespace) -> int:
    session = open_session(args.model, args.device, args.keep_loops, args.input_shape, args.signature)
    imported = session.imported
    devices = _placement(session)
    histogram = imported.operation_histogram()
    grouped: dict[str, list] = {}
    for lowering in imported.lowerings:
        key = f"{lowering.source.name} -> {' + '.join(lowering.operations) or 'constant'}: {lowering.reason}"
        grouped.setdefault(key, []).append(lowering.source.index)
    for sub in imported.submodels:
        for lowering in sub.lowerings:
            key = (f"{lowering.source.name} -> {' + '.join(lowering.operations) or 'constant'}: {lowering.reason}"
                   f" (subgraph {lowering.source.subgraph})")
            grouped.setdefault(key, []).append(lowering.source.index)
    report = {
        "model": args.model,
        "format": imported.format,
        "inputs": [_spec(spec) for spec in imported.inputs],
        "outputs": [_spec(spec) for spec in imported.outputs],
        "states": [state.name for state in imported.states],
        "fixed_shapes": imported.fixed_shapes,
        "source_operators": imported.source_operator_count,
        "subgraphs": 1 + len(imported.submodels),
        "operations": sum(histogram.values()),
        "histogram": histogram,
        "lowerings": [{"what": key, "operators": indexes} for key, indexes in grouped.items()],
        "devices": dict(Counter(devices)),
    }
    if args.operations or args.json:
        report["placement"] = [{"index": i, "type": op.code.name, "source": str(imported.sources[i]),
                                "device": devices[i]} for i, op in enumerate(imported.model._operations)]
    if args.json:
        print_json(report)
        return 0
    print(f"model: {args.model} ({imported.format}, {report['source_operators']} operators in "
          f"{report['subgraphs']} subgraph{'s' if report['subgraphs'] > 1 else ''} -> "
          f"{report['operations']} NNAPI operations)")
    for kind, specs in (("input", imported.inputs), ("output", imported.outputs)):
        for spec in specs:
            print(f"{kind:<6} {spec.describe()}")
    if imported.fixed_shapes:
        print(f"shapes the file's static shapes (its open dimensions fixed, as LiteRT allocates them): "
              f"{imported.fixed_shapes}")
    if imported.states:
        print(f"state  {', '.join(report['states'])} (carried between runs by a Session)")
    print("operations:")
    width = max((len(name) for name in histogram), default=4)
    for name, count in histogram.items():
        print(f"  {name:<{width}}  {count}")
    if grouped:
        print("lowerings:")
        for key, indexes in grouped.items():
            shown = ", ".join(str(i) for i in indexes[:8]) + (", ..." if len(indexes) > 8 else "")
            print(f"  {len(indexes)} x {key}  [operator {shown}]")
    else:
        print("lowerings: none (every operator maps to one NNAPI operation)")
    print("devices: " + ", ".join(f"{name}: {count} operations" for name, count in report["devices"].items()))
    if args.operations:
        for entry in report["placement"]:
            print(f"  #{entry['index']:<4} {entry['type']:<24} -> {entry['device']:<18} [{entry['source']}]")
    return 0
