"""``nnapi compare``: run a model in nnapi and in LiteRT on the same seeded inputs and
report how far apart the outputs are: per output the largest absolute and relative
difference (float, relative to the output's largest magnitude) or the largest difference
in quantized steps, and top-1 / top-5 agreement for classifier-shaped outputs.

The Android MLTS idea (a driver is not less accurate than TFLite on the CPU), for any
model. LiteRT is run twice, with its default XNNPACK delegate and with its builtin
kernels only; their own disagreement is part of the yardstick: an output agrees when its
difference from the closer of the two is within the tolerance or within LiteRT's own
disagreement, and its top-1 equals the top-1 of one of the two (in every run): where
LiteRT's two results rank a near tie differently, either ranking is LiteRT's.

Detections (the four outputs of TFLite's ``TFLite_Detection_PostProcess``: boxes, classes,
scores, count) are compared as detections, not slot by slot: both engines list them by
descending score, but break equal scores (common with quantized scores) in different
orders (NNAPI's DETECTION_POSTPROCESSING in its greedy walk's list order, LiteRT in its
sort's), so each of LiteRT's valid detections is paired with nnapi's nearest detection of
the same class; they agree when the counts are equal, every detection is paired, and the
paired boxes and scores are within the float tolerance (or LiteRT's own disagreement
measured the same way). Where the two first part at a score several detections share,
each keeping another detection of that score (the equal-score order again, which changes
the suppressions below it), the unpaired detections from there on are counted apart and
reported.

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

from nnapi.cli._common import EXIT_FAILED, CliError, add_signature, print_json
from nnapi.cli._model import add_run_arguments, litert_interpreter, litert_run, open_session, positive, read_inputs


def register(commands, common) -> None:
    parser = commands.add_parser("compare", parents=[common],
                                 help="outputs of a model in nnapi vs LiteRT on the same inputs (needs "
                                      "ai-edge-litert)")
    add_signature(parser)
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


#: the largest relative difference of box coordinates or scores for which two detections
#: are taken for the same one (far above float rounding; neighbouring anchors of an SSD's
#: coarsest grid are ~5% of the image apart)
_PAIRING = 1e-2


def compare_detections(ours: dict[str, np.ndarray], theirs: dict[str, np.ndarray],
                       names: tuple[str, str, str, str]) -> dict:
    """Two engines' detections (outputs ``names``: boxes [B, d, 4], classes [B, d], scores
    [B, d], count [B]) as sets: per image, each of ``theirs``' valid detections paired with
    the nearest unpaired one of ``ours`` of the same class (nearest: the largest of the
    score and box coordinate differences, each relative to ``theirs``' largest magnitude
    of that output; at most ``_PAIRING``). Gives the number of detections, those left unpaired on either side,
    images whose counts differ, and the largest relative box and score differences of the
    pairs."""
    boxes, classes, scores, count = names
    box_scale = float(np.abs(theirs[boxes]).max()) if theirs[boxes].size else 0.0
    score_scale = float(np.abs(theirs[scores]).max()) if theirs[scores].size else 0.0
    box_scale, score_scale = box_scale or 1.0, score_scale or 1.0
    result = {"detections": 0, "unpaired": 0, "after_equal_scores": 0, "counts_differ": 0, "max_rel_box": 0.0,
              "max_rel_score": 0.0}
    for image in range(theirs[count].shape[0]):
        theirs_count, ours_count = int(theirs[count][image]), int(ours[count][image])
        result["counts_differ"] += theirs_count != ours_count
        result["detections"] += theirs_count
        ours_count = max(0, min(ours_count, ours[scores].shape[1]))
        free = list(range(ours_count))
        left = []   # LiteRT's unpaired detections
        for k in range(max(0, min(theirs_count, theirs[scores].shape[1]))):
            best, best_distance = None, (np.inf, np.inf, np.inf)
            for j in free:
                if ours[classes][image, j] != theirs[classes][image, k]:
                    continue
                box = float(np.abs(ours[boxes][image, j].astype(np.float64) - theirs[boxes][image, k]).max())
                box /= box_scale
                score = abs(float(ours[scores][image, j]) - float(theirs[scores][image, k])) / score_scale
                if max(box, score) < best_distance[0]:
                    best, best_distance = j, (max(box, score), box, score)
            if best is None or best_distance[0] > _PAIRING:
                left.append(float(theirs[scores][image, k]))
                continue
            free.remove(best)
            result["max_rel_box"] = max(result["max_rel_box"], best_distance[1])
            result["max_rel_score"] = max(result["max_rel_score"], best_distance[2])
        right = [float(ours[scores][image, j]) for j in free]
        top = max(left) if left and right and max(left) == max(right) else None
        if top is not None and max(np.count_nonzero(theirs[scores][image, :theirs_count] == top),
                                   np.count_nonzero(ours[scores][image, :ours_count] == top)) > 1:
            # both engines first part at a score that several detections share: each kept
            # another detection of that score (the walk and the sort order equal scores
            # differently); below it the two sets of suppressions differ
            result["after_equal_scores"] += max(len(left), len(right))
        else:
            result["unpaired"] += max(len(left), len(right))
    return result


def detections_summary(found: dict) -> str:
    """``compare_detections``' figures in words: LiteRT's detections, those unpaired (and
    those past where the engines kept different detections of equal score), the images
    whose counts differ, the pairs' largest relative box and score differences."""
    tie = (f" (+{found['after_equal_scores']} from where the engines kept different detections of "
           "equal score)") if found["after_equal_scores"] else ""
    return (f"{found['detections']} (LiteRT's), {found['unpaired']} unpaired{tie}, counts differ in "
            f"{found['counts_differ']} image(s); pairs' max rel box {found['max_rel_box']:.3g}, score "
            f"{found['max_rel_score']:.3g}")


def _worst_detections(worst: dict | None, entry: dict) -> dict:
    if worst is None:
        return dict(entry)
    return {key: max(worst[key], value) if key != "detections" else worst[key] + value for key, value in entry.items()}


def _detections_verdict(found: dict, rtol: float) -> bool:
    """Detections agree: every one paired, counts equal, the pairs' differences within
    ``rtol`` or within LiteRT's own (XNNPACK vs builtin) differences, of the closer
    LiteRT result."""
    own = found.get("litert_own", {})

    def within(entry: dict) -> bool:
        return (entry["unpaired"] == 0 and entry["counts_differ"] == 0
                and entry["max_rel_box"] <= max(rtol, own.get("max_rel_box", 0.0))
                and entry["max_rel_score"] <= max(rtol, own.get("max_rel_score", 0.0)))

    return within(found["xnnpack"]) or ("builtin" in found and within(found["builtin"]))


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
    for key in ("top1_equal", "builtin_top1_equal", "top1_either"):
        if key in entry:
            merged[key] = worst.get(key, True) and entry[key]
    if "top1_equal" in entry:
        merged["top5_overlap"] = min(worst["top5_overlap"], entry["top5_overlap"])
    return merged


def _verdict(entry: dict, float_output: bool, rtol: float, steps: int) -> bool:
    """Whether one output agrees: within ``rtol`` (float) or ``steps`` (quantized), or
    within LiteRT's own disagreement, of the closer LiteRT result; top-1 equal to one of
    LiteRT's two results' in every run (``top1_either``; XNNPACK's alone where the builtin
    kernels did not run)."""
    if "error" in entry:
        return False
    tolerance = rtol if float_output else steps
    tolerance = max(tolerance, entry.get("litert_own_difference", 0.0))
    measured = entry.get("max_rel", entry.get("max_steps", entry.get("max_abs", 0.0)))
    closest = min(measured, entry.get("builtin_difference", measured))
    return closest <= tolerance and entry.get("top1_either", entry.get("top1_equal", True))


def _judge(entry: dict, float_output: bool, rtol: float, steps: int, hybrid_rtol: float | None) -> None:
    """Set ``entry["ok"]``: ``_verdict`` at ``rtol`` / ``steps``, and for a float output of
    a hybrid model (``hybrid_rtol`` given) at ``hybrid_rtol`` where ``rtol`` is not met
    (then ``entry["hybrid_tolerance"]`` says which tolerance admitted it)."""
    entry["ok"] = _verdict(entry, float_output, rtol, steps)
    if not entry["ok"] and float_output and hybrid_rtol is not None:
        entry["ok"] = entry["hybrid_tolerance"] = _verdict(entry, True, hybrid_rtol, steps)


def cmd_compare(args: argparse.Namespace) -> int:
    session = open_session(args.model, args.device, args.keep_loops, args.input_shape, args.signature)
    # with --signature, LiteRT runs that signature's runner, fed and read by the same tensors
    signature = {"signature": args.signature, "names": session.imported.signature_names}
    interpreter = litert_interpreter(args.model, shapes=args.input_shape, **signature)
    if interpreter is None:
        raise CliError("comparing needs LiteRT: pip install 'nnapi[litert]'")
    try:
        builtin = litert_interpreter(args.model, builtin_kernels=True, shapes=args.input_shape, **signature)
    except CliError:
        builtin = None  # a model only the XNNPACK delegate can run
    worst: dict[str, dict] = {}
    detections: dict[tuple[str, str, str, str], dict] = {}
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
                if "top1_equal" in entry:
                    entry["builtin_top1_equal"] = \
                        _top(ours[info.name].reshape(-1), 1) == _top(reference[info.name].reshape(-1), 1)
            if "top1_equal" in entry:
                entry["top1_either"] = entry["top1_equal"] or entry.get("builtin_top1_equal", False)
            worst[info.name] = _merge(worst.get(info.name), entry)
        for group in session.imported.detections:
            found = detections.setdefault(group, {})
            pairs = [("xnnpack", ours, theirs)]
            if reference is not None:
                pairs += [("builtin", ours, reference), ("litert_own", theirs, reference)]
            for key, mine, other in pairs:
                found[key] = _worst_detections(found.get(key), compare_detections(mine, other, group))
    hybrid = session.imported.all_hybrid_operators()
    results = {}
    for info in session.outputs:
        entry = worst[info.name]
        _judge(entry, info.dtype.kind == "f", args.rtol, args.steps, args.hybrid_rtol if hybrid else None)
        results[info.name] = entry
    for group, found in detections.items():
        agree = _detections_verdict(found, args.rtol)
        for name in group:
            results[name]["detections"] = found
            results[name]["ok"] = agree
    all_ok = all(entry["ok"] for entry in results.values())
    if args.json:
        print_json({"model": args.model, "devices": sorted(set(session.device_names)), "runs": args.runs,
                    "rtol": args.rtol, "steps": args.steps, "hybrid_rtol": args.hybrid_rtol,
                    "hybrid_operators": [str(source) for source in hybrid], "outputs": results, "ok": all_ok})
        return 0 if all_ok else EXIT_FAILED
    print(f"model: {args.model}    nnapi on {', '.join(sorted(set(session.device_names)))} vs LiteRT "
          f"(1 thread), {args.runs} run{'s' if args.runs > 1 else ''} from seed {args.seed}")
    described: set[tuple[str, ...]] = set()
    for name, entry in results.items():
        group = next((group for group in detections if name in group), None)
        if group is not None:
            if group not in described:
                described.add(group)
                print(f"  detections {', '.join(group)}: {detections_summary(detections[group]['xnnpack'])}  "
                      f"{'ok' if entry['ok'] else 'OUTSIDE TOLERANCE'} (compared as detections: equal scores come "
                      "out in each engine's own order)")
            continue
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
            if entry["top1_equal"]:
                top1 = "equal"
            elif entry.get("top1_either"):
                top1 = "equal to LiteRT builtin kernels' (XNNPACK's differs)"
            else:
                top1 = "DIFFERS"
            text += f"  top-1 {top1}  top-5 overlap {entry['top5_overlap']}/5"
        verdict = "ok" if entry["ok"] else "OUTSIDE TOLERANCE"
        if entry.get("hybrid_tolerance"):
            verdict = f"ok within the hybrid tolerance ({args.hybrid_rtol:g})"
        print(f"  {name}: {entry['dtype']}{entry['shape']}  {text}  {verdict}")
    tolerance = (f"float rel <= {args.rtol:g}, quantized <= {args.steps} steps, or within LiteRT's own "
                 "disagreement; top-1 equal to one of LiteRT's")
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
