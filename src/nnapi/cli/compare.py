"""``nnapi compare``: run a model in nnapi and in LiteRT on the same seeded inputs and
report how far apart the outputs are: per output the largest absolute and relative
difference (float, relative to the output's largest magnitude) or the largest difference
in quantized steps, and top-1 / top-5 agreement for classifier outputs. The Android MLTS
idea: a driver's accuracy is not worse than TFLite on CPU, for any model."""

from __future__ import annotations

import argparse

import numpy as np

from nnapi.cli._common import EXIT_FAILED, CliError, print_json
from nnapi.cli._model import litert_interpreter, litert_run, open_session, positive, read_inputs


def register(commands, common) -> None:
    parser = commands.add_parser("compare", parents=[common],
                                 help="outputs of a model in nnapi vs LiteRT on the same inputs (needs "
                                      "ai-edge-litert)")
    parser.add_argument("model", help="a .tflite model")
    parser.add_argument("--device", action="append", metavar="NAME",
                        help="device to run on (repeatable; default: let the runtime choose)")
    parser.add_argument("--input", action="append", metavar="NAME=FILE.npy",
                        help="an input array (repeatable; inputs not given are seeded random)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default 0)")
    parser.add_argument("--runs", type=positive, default=1,
                        help="compare this many runs, seeds SEED, SEED+1, ... (default 1)")
    parser.add_argument("--rtol", type=float, default=1e-5,
                        help="float tolerance relative to the output's largest magnitude (default 1e-5)")
    parser.add_argument("--steps", type=int, default=2, help="quantized tolerance in steps (default 2)")
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.set_defaults(func=cmd_compare)


def _top(values: np.ndarray, k: int) -> list[int]:
    return [int(i) for i in np.argsort(-values.astype(np.float64), kind="stable")[:k]]


def compare_outputs(ours: np.ndarray, theirs: np.ndarray, quantized: bool) -> dict:
    """The difference between one output of each engine."""
    entry: dict = {"shape": list(theirs.shape), "dtype": theirs.dtype.name}
    if ours.shape != theirs.shape:
        entry["error"] = f"shape {list(ours.shape)} vs LiteRT's {list(theirs.shape)}"
        return entry
    if theirs.dtype.kind == "f":
        difference = np.abs(ours.astype(np.float64) - theirs.astype(np.float64))
        largest = float(np.abs(theirs).max()) if theirs.size else 0.0
        entry["max_abs"] = float(difference.max()) if difference.size else 0.0
        entry["max_rel"] = entry["max_abs"] / largest if largest > 0 else entry["max_abs"]
    else:
        difference = np.abs(ours.astype(np.int64) - theirs.astype(np.int64))
        entry["max_steps" if quantized else "max_abs"] = int(difference.max()) if difference.size else 0
    if theirs.ndim >= 1 and theirs.shape[-1] >= 10 and theirs.size == theirs.shape[-1] and \
            theirs.dtype != np.bool_:
        ours_flat, theirs_flat = ours.reshape(-1), theirs.reshape(-1)
        entry["top1_equal"] = _top(ours_flat, 1) == _top(theirs_flat, 1)
        entry["top5_overlap"] = len(set(_top(ours_flat, 5)) & set(_top(theirs_flat, 5)))
    return entry


def _passes(entry: dict, rtol: float, steps: int) -> bool:
    if "error" in entry:
        return False
    ok = entry.get("max_rel", 0.0) <= rtol and entry.get("max_steps", 0) <= steps
    if "max_abs" in entry and "max_rel" not in entry:  # integer, unquantized: exact
        ok = ok and entry["max_abs"] == 0
    return ok and entry.get("top1_equal", True)


def cmd_compare(args: argparse.Namespace) -> int:
    session = open_session(args.model, args.device)
    interpreter = litert_interpreter(args.model)
    if interpreter is None:
        raise CliError("comparing needs LiteRT: pip install 'nnapi[litert]'")
    worst: dict[str, dict] = {}
    for run in range(args.runs):
        feeds, _ = read_inputs(session, args.input, args.seed + run)
        ours = session.run(feeds)
        theirs = litert_run(interpreter, feeds)
        for info in session.outputs:
            if info.name not in theirs:
                raise CliError(f"LiteRT's model has no output {info.name!r}")
            entry = compare_outputs(ours[info.name], theirs[info.name], info.scale > 0 and info.dtype.kind in "iu")
            previous = worst.get(info.name)
            if previous is None or _severity(entry) > _severity(previous):
                worst[info.name] = entry
            if previous is not None:
                worst[info.name]["top1_equal"] = previous.get("top1_equal", True) and entry.get("top1_equal", True) \
                    if "top1_equal" in entry else None
    results = {name: dict(entry, ok=_passes(entry, args.rtol, args.steps)) for name, entry in worst.items()}
    for entry in results.values():
        if entry.get("top1_equal") is None:
            entry.pop("top1_equal", None)
    all_ok = all(entry["ok"] for entry in results.values())
    if args.json:
        print_json({"model": args.model, "devices": sorted(set(session.device_names)), "runs": args.runs,
                    "rtol": args.rtol, "steps": args.steps, "outputs": results, "ok": all_ok})
        return 0 if all_ok else EXIT_FAILED
    print(f"model: {args.model}    nnapi on {', '.join(sorted(set(session.device_names)))} vs LiteRT "
          f"(1 thread), {args.runs} run{'s' if args.runs > 1 else ''} from seed {args.seed}")
    for name, entry in results.items():
        if "error" in entry:
            text = entry["error"]
        elif "max_rel" in entry:
            text = f"max abs {entry['max_abs']:.3g}  max rel {entry['max_rel']:.3g} (of the largest |value|)"
        elif "max_steps" in entry:
            text = f"max {entry['max_steps']} quantized step{'s' if entry['max_steps'] != 1 else ''}"
        else:
            text = f"max abs {entry['max_abs']}"
        if "top1_equal" in entry:
            text += f"  top-1 {'equal' if entry['top1_equal'] else 'DIFFERS'}  top-5 overlap {entry['top5_overlap']}/5"
        print(f"  {name}: {entry['dtype']}{entry['shape']}  {text}  {'ok' if entry['ok'] else 'OUTSIDE TOLERANCE'}")
    tolerance = f"float rel <= {args.rtol:g}, quantized <= {args.steps} steps, top-1 equal"
    print(f"{'agree' if all_ok else 'DISAGREE'} ({tolerance})")
    return 0 if all_ok else EXIT_FAILED


def _severity(entry: dict) -> float:
    if "error" in entry:
        return float("inf")
    return float(entry.get("max_rel", entry.get("max_steps", entry.get("max_abs", 0))))
