"""``nnapi run``: run a model (a .tflite file, or the built-in one) on given or seeded
random inputs; print its outputs and latency."""

from __future__ import annotations

import argparse

import numpy as np

from nnapi.cli._common import add_signature, print_json
from nnapi.cli._model import (
    add_run_arguments,
    builtin_model_path,
    latency_stats,
    open_session,
    positive,
    read_inputs,
    time_runs,
)
from nnapi.importers import TensorSpec


def register(commands, common) -> None:
    parser = commands.add_parser("run", parents=[common],
                                 help="run a model (default: the built-in MediaPipe hand re-crop model) and print "
                                      "its outputs and latency")
    add_signature(parser)
    parser.add_argument("model", nargs="?", help="a .tflite model (default: the built-in one)")
    add_run_arguments(parser)
    parser.add_argument("--iterations", type=positive, default=1, help="executions to time (default 1)")
    parser.add_argument("--save", metavar="FILE.npz", help="also write the outputs to FILE.npz")
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.set_defaults(func=cmd_run)


#: a vector shorter than this gets no top-5 (every entry is printed among its first 8 anyway)
_FEWEST_CLASSES = 10


def class_scores(value: np.ndarray, info: TensorSpec) -> bool:
    """Whether output ``value`` reads as one vector of class scores, where a top-5 means
    something: [N] or [1, N] (N >= 10) probabilities, a float vector of values in [0, 1]
    summing to about 1 (a softmax; one computed in 8 bits and dequantized loses a few
    percent to rounding: MobileNet v2 int8's sum ~0.93), or an 8-bit one with the
    quantization TFLite fixes for SOFTMAX and LOGISTIC outputs (scale 1/256, zero point
    the type's lowest value). Landmarks, boxes, masks, embeddings and states of shape
    [1, N] are not."""
    if value.ndim not in (1, 2) or (value.ndim == 2 and value.shape[0] != 1) or value.size < _FEWEST_CLASSES:
        return False
    if value.dtype in (np.uint8, np.int8):
        return info.scale == 1 / 256 and info.zero_point == np.iinfo(value.dtype).min
    if value.dtype.kind != "f":
        return False
    wide = value.astype(np.float64)
    return bool(wide.min() >= 0 and wide.max() <= 1 and 0.5 <= wide.sum() <= 1 + 1e-2)


def _summary(value: np.ndarray, info: TensorSpec) -> dict:
    flat = value.reshape(-1)
    summary = {"dtype": value.dtype.name, "shape": list(value.shape)}
    if flat.size:
        summary.update(min=flat.min().item(), max=flat.max().item(), mean=float(flat.astype(np.float64).mean()),
                       first=[v.item() for v in flat[:8]])
        if class_scores(value, info):
            top = np.argsort(-flat.astype(np.float64), kind="stable")[:5]
            summary["top5"] = [int(i) for i in top]
    return summary


def cmd_run(args: argparse.Namespace) -> int:
    path = args.model or builtin_model_path()
    session = open_session(path, args.device, args.keep_loops, args.input_shape, args.signature)
    feeds, origin = read_inputs(session, args.input, args.seed)
    results: dict = {}

    def run() -> None:
        results.update(session.run(feeds))

    seconds = time_runs(run, args.iterations, 0)
    stats = latency_stats(seconds)
    devices = sorted(set(session.device_names))
    if args.save:
        try:
            np.savez(args.save, **results)
        except OSError as error:
            from nnapi.cli._common import CliError

            raise CliError(f"--save {args.save}: {error.strerror}") from None
    if args.json:
        print_json({"model": path, "builtin": args.model is None, "devices": devices,
                    "inputs": {info.name: {"dtype": info.dtype.name, "shape": list(feeds[info.name].shape),
                                           "from": origin[info.name]} for info in session.inputs},
                    "outputs": {info.name: _summary(results[info.name], info) for info in session.outputs},
                    "latency": stats})
        return 0
    title = "built-in model: MediaPipe hand re-crop" if args.model is None else "model"
    print(f"{title} ({path})")
    print(f"device: {', '.join(devices)}    compile: {session.compile_seconds * 1e3:.1f} ms")
    for info in session.inputs:
        print(f"input  {info.describe()}  <- {origin[info.name]}")
    with np.printoptions(precision=5, suppress=True, threshold=8, edgeitems=3):
        for info in session.outputs:
            value = results[info.name]
            summary = _summary(value, info)
            print(f"output {info.name}: {value.dtype.name}{list(value.shape)}")
            if value.size:
                print(f"  min {summary['min']:.6g}  max {summary['max']:.6g}  mean {summary['mean']:.6g}")
                print(f"  {value.reshape(-1)[:8]}{' ...' if value.size > 8 else ''}")
            if "top5" in summary:
                print(f"  top-5 classes: {summary['top5']}")
    print(f"latency: {', '.join(_short(stats))}")
    return 0


def _short(stats: dict) -> list[str]:
    if stats["runs"] == 1:
        return [f"{stats['mean_ms']:.3f} ms (1 run; --iterations N for more)"]
    return [f"mean {stats['mean_ms']:.3f} ms", f"median {stats['median_ms']:.3f} ms", f"min {stats['min_ms']:.3f} ms",
            f"{stats['runs']} runs"]
