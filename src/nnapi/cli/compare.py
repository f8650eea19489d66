"""``nnapi compare``: run a model in nnapi and in LiteRT on the same seeded inputs and
report how far apart the outputs are: per output the largest absolute and relative
difference (float, relative to the output's largest magnitude) or the largest difference
in quantized steps, and top-1 / top-5 agreement for classifier-shaped outputs.

The Android MLTS idea (a driver is not less accurate than TFLite on the CPU), for any
model. LiteRT is run twice, with its default XNNPACK delegate and with its builtin
kernels only; their own disagreement is part of the yardstick: an output agrees when its
difference from the closer of the two is within the tolerance or within LiteRT's own
disagreement, and top-1 is equal.

A dynamic-range ("hybrid") quantized model is the exception: LiteRT quantizes the float
inputs of its int8-weight operators to int8 at every run, while nnapi (as Android's NNAPI
delegate) computes them in float32 from the dequantized weights, so the two differ by the
error of LiteRT's on-the-fly quantization (1e-3 to 2e-2 of the output's largest
magnitude on typical models), not by nnapi's. Its float outputs are judged against
``--hybrid-rtol`` instead, and the report says so.
"""

from __future__ import annotations

import argparse

import numpy as np

from nnapi.cli._common import EXIT_FAILED, CliError, print_json
from nnapi.cli._model import add_run_arguments, litert_interpreter, litert_run, open_session, positive, read_inputs


def register(commands, common) -> None:
    parser = commands.add_parser("compare", parents=[common],
                                 help="outputs of a model in nnapi vs LiteRT on the same inputs (needs "
                                      "ai-edge-litert)")
    parser.add_argument("model", help="a .tflite model")
    add_run_arguments(parser)
    parser.add_argument("--runs", type=positive, default=1,
                        help="compare this many runs, seeds SEED, SEED+1, ... (default 1)")
    parser.add_argument("--rtol", type=float, default=1e-5,
                        help="float tolerance relative to the output's largest magnitude (default 1e-5)")
    parser.add_argument("--steps", type=int, default=2, help="quantized tolerance in steps (default 2)")
    parser.add_argument("--hybrid-rtol", type=float, default=5e-2,
                        help="float tolerance for a dynamic-range (hybrid) quantized model, whose int8-weight "
                             "operators LiteRT runs on int8-quantized activations (default 5e-2)")
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.set_defaults(func=cmd_compare)


def _top(values: np.ndarray, k: int) -> list[int]:
    return [int(i) for i in np.argsort(-values.astype(np.float64), kind="stable")[:k]]


def is_classifier(shape: tuple[int, ...]) -> bool:
    """Scores of one example over 10 or more classes: [N] or [1, N]."""
    return len(shape) in (1, 2) and shape[-1] >= 10 and int(np.prod(shape)) == shape[-1]


def difference(ours: np.ndarray, theirs: np.ndarray) -> float:
    """Largest difference: relative to ``theirs``' largest magnitude for floats, in
    integer steps otherwise; inf when the shapes differ."""
    if ours.shape != theirs.shape:
        return float("inf")
    if not theirs.size:
        return 0.0
    if theirs.dtype.kind == "f":
        largest = float(np.abs(theirs).max())
        absolute = float(np.abs(ours.astype(np.float64) - theirs.astype(np.float64)).max())
        return absolute / largest if largest > 0 else absolute
    return float(np.abs(ours.astype(np.int64) - theirs.astype(np.int64)).max())


def compare_outputs(ours: np.ndarray, theirs: np.ndarray, quantized: bool) -> dict:
    """The difference between one output of each engine."""
    entry: dict = {"shape": list(theirs.shape), "dtype": theirs.dtype.name}
    if ours.shape != theirs.shape:
        entry["error"] = f"shape {list(ours.shape)} vs LiteRT's {list(theirs.shape)}"
        return entry
    if theirs.dtype.kind == "f":
        entry["max_abs"] = float(np.abs(ours.astype(np.float64) - theirs.astype(np.float64)).max()) \
            if theirs.size else 0.0
        entry["max_rel"] = difference(ours, theirs)
    else:
        entry["max_steps" if quantized else "max_abs"] = int(difference(ours, theirs))
    if is_classifier(theirs.shape) and theirs.dtype != np.bool_:
        ours_flat, theirs_flat = ours.reshape(-1), theirs.reshape(-1)
        entry["top1_equal"] = _top(ours_flat, 1) == _top(theirs_flat, 1)
        entry["top5_overlap"] = len(set(_top(ours_flat, 5)) & set(_top(theirs_flat, 5)))
    return entry


def _merge(worst: dict | None, entry: dict) -> dict:
    """The worst of two runs' entries for one output."""
    if worst is None:
        return dict(entry)
    if "error" in worst or "error" in entry:
        return worst if "error" in worst else dict(entry)
    merged = dict(worst)
    for key in ("max_abs", "max_rel", "max_steps", "builtin_difference", "litert_own_difference"):
        if key in entry:
            merged[key] = max(worst.get(key, 0), entry[key])
    if "top1_equal" in entry:
        merged["top1_equal"] = worst["top1_equal"] and entry["top1_equal"]
        merged["top5_overlap"] = min(worst["top5_overlap"], entry["top5_overlap"])
    return merged


def _verdict(entry: dict, float_output: bool, rtol: float, steps: int) -> bool:
    """Whether one output agrees: within ``rtol`` (float) or ``steps`` (quantized), or
    within LiteRT's own disagreement, of the closer LiteRT result; top-1 equal."""
    if "error" in entry:
        return False
    tolerance = rtol if float_output else steps
    tolerance = max(tolerance, entry.get("litert_own_difference", 0.0))
    measured = entry.get("max_rel", entry.get("max_steps", entry.get("max_abs", 0.0)))
    closest = min(measured, entry.get("builtin_difference", measured))
    return closest <= tolerance and entry.get("top1_equal", True)


def _judge(entry: dict, float_output: bool, rtol: float, steps: int, hybrid_rtol: float | None) -> None:
    """Set ``entry["ok"]``: ``_verdict`` at ``rtol`` / ``steps``, and for a float output of
    a hybrid model (``hybrid_rtol`` given) at ``hybrid_rtol`` where ``rtol`` is not met
    (then ``entry["hybrid_tolerance"]`` says which tolerance admitted it)."""
    entry["ok"] = _verdict(entry, float_output, rtol, steps)
    if not entry["ok"] and float_output and hybrid_rtol is not None:
        entry["ok"] = entry["hybrid_tolerance"] = _verdict(entry, True, hybrid_rtol, steps)


def cmd_compare(args: argparse.Namespace) -> int:
    session = open_session(args.model, args.device, args.keep_loops)
    interpreter = litert_interpreter(args.model)
    if interpreter is None:
        raise CliError("comparing needs LiteRT: pip install 'nnapi[litert]'")
    try:
        builtin = litert_interpreter(args.model, builtin_kernels=True)
    except CliError:
        builtin = None  # a model only the XNNPACK delegate can run
    worst: dict[str, dict] = {}
    for run in range(args.runs):
        feeds, _ = read_inputs(session, args.input, args.seed + run)
        ours = session.run(feeds)
        theirs = litert_run(interpreter, feeds)
        reference = litert_run(builtin, feeds) if builtin is not None else None
        for info in session.outputs:
            if info.name not in theirs:
                raise CliError(f"LiteRT's model has no output {info.name!r}")
            quantized = info.scale > 0 and info.dtype.kind in "iu"
            entry = compare_outputs(ours[info.name], theirs[info.name], quantized)
            if reference is not None and "error" not in entry:
                entry["builtin_difference"] = difference(ours[info.name], reference[info.name])
                entry["litert_own_difference"] = difference(theirs[info.name], reference[info.name])
            worst[info.name] = _merge(worst.get(info.name), entry)
    hybrid = session.imported.all_hybrid_operators()
    results = {}
    for info in session.outputs:
        entry = worst[info.name]
        _judge(entry, info.dtype.kind == "f", args.rtol, args.steps, args.hybrid_rtol if hybrid else None)
        results[info.name] = entry
    all_ok = all(entry["ok"] for entry in results.values())
    if args.json:
        print_json({"model": args.model, "devices": sorted(set(session.device_names)), "runs": args.runs,
                    "rtol": args.rtol, "steps": args.steps, "hybrid_rtol": args.hybrid_rtol,
                    "hybrid_operators": [str(source) for source in hybrid], "outputs": results, "ok": all_ok})
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
        if "builtin_difference" in entry:
            text += (f"  [vs LiteRT builtin kernels {entry['builtin_difference']:.3g}; LiteRT's own XNNPACK-vs-builtin "
                     f"{entry['litert_own_difference']:.3g}]")
        if "top1_equal" in entry:
            text += f"  top-1 {'equal' if entry['top1_equal'] else 'DIFFERS'}  top-5 overlap {entry['top5_overlap']}/5"
        verdict = "ok" if entry["ok"] else "OUTSIDE TOLERANCE"
        if entry.get("hybrid_tolerance"):
            verdict = f"ok within the hybrid tolerance ({args.hybrid_rtol:g})"
        print(f"  {name}: {entry['dtype']}{entry['shape']}  {text}  {verdict}")
    tolerance = (f"float rel <= {args.rtol:g}, quantized <= {args.steps} steps, or within LiteRT's own "
                 "disagreement; top-1 equal")
    if hybrid:
        tolerance += f"; hybrid model's float outputs rel <= {args.hybrid_rtol:g}"
        print(f"note: dynamic-range (hybrid) quantized model: {len(hybrid)} operator"
              f"{'s' if len(hybrid) != 1 else ''} ({hybrid[0]}{', ...' if len(hybrid) > 1 else ''}) "
              f"{'hold' if len(hybrid) != 1 else 'holds'} int8 "
              "weights that LiteRT applies to int8-quantized activations at every run; nnapi computes them in "
              "float32 from the dequantized weights, as Android's NNAPI delegate does. Their float outputs are "
              f"judged at rel <= {args.hybrid_rtol:g} (--hybrid-rtol), the scale of LiteRT's on-the-fly "
              "quantization error.")
    print(f"{'agree' if all_ok else 'DISAGREE'} ({tolerance})")
    return 0 if all_ok else EXIT_FAILED
