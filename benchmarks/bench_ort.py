"""Benchmark: real models on nnapi-ort-cpu through the full nnapi runtime, beside LiteRT
(XNNPACK), ONNX Runtime's own run of the same lowered graph and the reference device.

Everything single-threaded, same inputs, one run: engines take turns each round so that
a busy machine slows them alike; figures are the best of the rounds. By default a run is
timed in CPU time of this process (every engine computes on the calling thread here, so
that is its compute time, and it stays meaningful on a machine shared with other work);
``--wall`` times wall-clock instead. Prints per model:

- LiteRT, nnapi-ort-cpu (Compilation + Execution per run, as an app does), ORT's own
  ``run`` on the lowered graph, and the reference device, in milliseconds;
- ``ort/litert``: the ratio that the targets are about (<= 1.0 goal, <= 1.3 at worst);
- ``overhead``: nnapi's per-execution cost over ORT's own run, in microseconds: a new
  Execution per run (create, set_input, set_output, compute) minus ORT's own
  ``session.run`` on the very session the compilation holds (same optimized graph, same
  session options, same input arrays, its outputs in new arrays as a user's ``run``),
  the two timed one right after the other in each round; see OVERHEAD_NOTE for how the
  rounds are combined. ``new in``: the same with a new input array every run (a
  preprocessed image; the copy is made before the pair, untimed). ``reusable``: the same
  for one reusable Execution. Below each model, each overhead split in two: the Python
  outside ORT's C++ run (nnapi's minus ORT's own ``run``'s) and the difference inside
  it, with the standard error of the overhead;
- compile time, cold and from the compilation cache (second compilation);
- agreement with LiteRT: max |difference| (float: relative to the output's largest
  magnitude; quantized: in quantized steps); the four outputs of a
  TFLite_Detection_PostProcess as detections, paired as ``nnapi compare`` pairs them (the
  engines order equal scores differently): LiteRT's count, those unpaired, images whose
  counts differ, the pairs' largest relative box and score differences;
- the plan's steps when it is split (a model with an operation the device declines);
- the cost of a partition boundary: one model timed as one ORT step and split around every
  operation of one type (a copy of nnapi-ort-cpu declining it, so the reference runs those),
  ``(split - whole) / boundaries`` per boundary. That includes the declined operations' own
  time on the reference, so the default is MobileNetV2's residual ADDs, cheap in numpy.

    python benchmarks/bench_ort.py                     # every model in ../shared/models
    python benchmarks/bench_ort.py path/to/model.tflite --runs 30 --reference-runs 0
    python benchmarks/bench_ort.py stft_yamnet_like_dyn.tflite --input-shape wave=15600   # an open length fixed
    python benchmarks/bench_ort.py --split-only --split-model mobilenet_v2_1.0_224_float --split-op ADD
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import nnapi
from nnapi.cli._common import CliError, input_shapes
from nnapi.cli._model import litert_interpreter
from nnapi.cli.compare import compare_detections, detections_summary, difference
from nnapi.runtime import manager

DEFAULT_MODELS = [
    "mobilenet_v1_1.0_224_float", "mobilenet_v1_1.0_224_int8", "mobilenet_v1_1.0_224_quant_uint8",
    "mobilenet_v2_1.0_224_float", "mobilenet_v2_1.0_224_int8", "mobilenet_v2_1.0_224_quant_uint8",
    "face_detection_short_range", "face_landmark", "hand_landmark_lite", "hand_recrop", "iris_landmark",
    "selfie_segmentation", "lstm_1x20x40_128_fused", "lstm_1x20x40_128_while",
]
SHARED_MODELS = Path(__file__).resolve().parents[2] / "shared" / "models"


OVERHEAD_NOTE = """\
ort ms: a new Execution per run (Execution(compilation), set_input, set_output, compute, as
code written before feature level 5 runs every inference), best of the rounds.
ORT own: the same InferenceSession (same optimized graph and session options) called as a
user calls it, session.run(None, {name: array}) on the same input arrays, its outputs in new
arrays; best of the rounds.
overhead = nnapi (new Execution) - ORT own, per round: each round runs LiteRT, then a new
Execution and ORT's own run one right after the other, then a reusable Execution and ORT's
own run one right after the other, each pair in alternating order (the first of a pair
finds the caches as the previous engine left them). The column is the mean of two medians:
over the rounds where nnapi ran first, and over those where ORT ran first, which cancels
what the order costs (whichever runs first after LiteRT finds ORT's weights out of the
caches: ~50-150 us more inside ORT's run, by the machine's load). new in: a new Execution
with a new input array at every run (the copy made before the pair; ORT's own run gets the
same array: its anchor is session.run on a fresh array, which wraps the array's bytes in an
OrtValue inside its C++ run, no copy; nnapi binds the new array in place before the run, the
same work outside ORT's C++ run, so it shows in "python" and the "in ORT" part is lower).
reusable: the same for one reusable Execution (set_reusable, its arguments set
once, compute per run). The detail lines split each overhead: "python" is the time outside
ORT's C++ run (nnapi's whole Python path minus ORT's own run's Python wrapper, its C++
input and output conversion being inside), "in ORT" the difference of the C++ calls
themselves (each timed by a thin wrapper around the session's C++ object, the same for
both), "+-" the overhead's standard error (from the spread of the rounds' differences:
more --runs narrow it on a busy machine), and in brackets each order's median (the pair-order
effect: the first of a pair pays for the caches LiteRT left)."""


def ort_device() -> nnapi.Device:
    found = [d for d in nnapi.get_devices() if d.name == "nnapi-ort-cpu"]
    if found:
        return found[0]
    from nnapi.drivers.ort import devices

    manager.register_device(devices()[0])
    return [d for d in nnapi.get_devices() if d.name == "nnapi-ort-cpu"][0]


def random_inputs(details: list[dict], seed: int = 0) -> list[np.ndarray]:
    """Seeded inputs as nnapi.session.random_inputs makes them: floats in [-1, 1), 8-bit
    (quantized) values over their whole range, wider integers in {0, 1} (token ids and
    indices: a text model's embedding lookup refuses ids past its vocabulary)."""
    rng = np.random.default_rng(seed)
    arrays = []
    for detail in details:
        dtype, shape = np.dtype(detail["dtype"]), detail["shape"]
        if dtype.kind == "f":
            arrays.append(rng.uniform(-1, 1, shape).astype(dtype))
        elif dtype == np.bool_:
            arrays.append(rng.integers(0, 2, shape).astype(dtype))
        elif dtype.itemsize == 1:
            info = np.iinfo(dtype)
            arrays.append(rng.integers(info.min, info.max, shape, endpoint=True).astype(dtype))
        else:
            arrays.append(rng.integers(0, 2, shape).astype(dtype))
    return arrays


class NnapiRunner:
    """One compilation; each call is one Execution (set inputs, outputs, compute)."""

    def __init__(self, model: nnapi.Model, devices: list[nnapi.Device], outputs: list[np.ndarray],
                 cache_dir: str | None = None, hidden: list[np.ndarray] | None = None) -> None:
        start = time.perf_counter()
        self.compilation = nnapi.Compilation(model, devices)
        if cache_dir is not None:
            self.compilation.set_caching(cache_dir, b"bench-ort-token-0123456789abcdef")
        self.compilation.finish()
        self.compile_s = time.perf_counter() - start
        self.outputs = outputs
        self.hidden = hidden or []

    def __call__(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        execution = nnapi.Execution(self.compilation)
        for position, array in enumerate([*inputs, *self.hidden]):
            execution.set_input(position, array)
        for position, array in enumerate(self.outputs):
            execution.set_output(position, array)
        execution.compute()
        return self.outputs


class ReusableRunner:
    """One reusable Execution (ANeuralNetworksExecution_setReusable), its inputs and outputs
    set once: each call is one compute, as an app's loop over new values in the same
    buffers does."""

    def __init__(self, compilation: nnapi.Compilation, inputs: list[np.ndarray], outputs: list[np.ndarray],
                 hidden: list[np.ndarray] | None = None) -> None:
        self.inputs, self.outputs = inputs, outputs
        self.execution = nnapi.Execution(compilation)
        self.execution.set_reusable(True)
        for position, array in enumerate([*inputs, *(hidden or [])]):
            self.execution.set_input(position, array)
        for position, array in enumerate(outputs):
            self.execution.set_output(position, array)

    def __call__(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        assert all(a is b for a, b in zip(inputs, self.inputs, strict=True)), "bound to other inputs"
        self.execution.compute()
        return self.outputs


def ort_own_runner(model: nnapi.Model, compilation: nnapi.Compilation | None = None):
    """ORT's own InferenceSession.run on the graph the driver lowers the model to: the
    very session the compilation's ORT step holds when it can be reached (two sessions of
    one graph can differ by a few percent from where their buffers landed), else a new one."""
    import onnxruntime as ort

    prepared = getattr(getattr(compilation, "_plan", None), "single", None)
    session = getattr(prepared, "session", None)
    if session is not None:
        names = [spec.name for spec in prepared.signature.inputs]
        return lambda inputs: session.run(None, dict(zip(names, inputs, strict=True)))

    from nnapi.drivers.ort.lowering import lower_model
    from nnapi.drivers.ort.session import session_options
    from nnapi.runtime.model_builder import build_hal_model

    hal_model, _ = build_hal_model(model)
    onnx_model, input_names, _ = lower_model(hal_model)
    session = ort.InferenceSession(onnx_model.SerializeToString(), session_options(),
                                   providers=["CPUExecutionProvider"])
    return lambda inputs: session.run(None, dict(zip(input_names, inputs, strict=True)))


class _ClockedSession:
    """Stands for an InferenceSession's C++ object (``session._sess``) and times each run
    through it: ORT's own ``run`` and the driver's run on its IOBinding both pass here, so
    the time inside ORT's C++ call is known for either (the wrapper's cost is the same)."""

    def __init__(self, native, clock) -> None:
        self._native, self._clock = native, clock
        self.last = 0.0

    def run(self, *args):
        start = self._clock()
        try:
            return self._native.run(*args)
        finally:
            self.last = self._clock() - start

    def run_with_iobinding(self, *args):
        start = self._clock()
        try:
            return self._native.run_with_iobinding(*args)
        finally:
            self.last = self._clock() - start

    def __getattr__(self, name):
        return getattr(self._native, name)


def clock_ort(compilation: nnapi.Compilation, clock) -> _ClockedSession | None:
    """Time the C++ runs of the compilation's ORT session (before its first execution: the
    driver takes the session's run when it first binds), or None where it cannot."""
    session = getattr(getattr(getattr(compilation, "_plan", None), "single", None), "session", None)
    native = getattr(session, "_sess", None)
    if native is None:
        return None
    clocked = _ClockedSession(native, clock)
    session._sess = clocked
    return clocked


def _overhead(pairs: tuple[list, list]) -> dict | None:
    """The overhead figures from the rounds of either order, each pair (nnapi, its time in
    ORT, ORT own, its time in ORT): the mean of the two orders' medians of the total, of the
    Python outside ORT and of the time inside, and the total's standard error."""
    if not pairs[0] or not pairs[1]:
        return None
    figures = {"total": [], "python": [], "in_ort": [], "se": []}
    for rounds in pairs:
        ours, ours_in, own, own_in = np.array(rounds).T
        total = ours - own
        figures["total"].append(float(np.median(total)))
        figures["python"].append(float(np.median((ours - ours_in) - (own - own_in))))
        figures["in_ort"].append(float(np.median(ours_in - own_in)))
        # the standard error of a median of n samples: ~1.2533 sd / sqrt(n)
        figures["se"].append(1.2533 * float(np.std(total)) / max(len(total), 1) ** 0.5)
    return {"total": sum(figures["total"]) / 2, "python": sum(figures["python"]) / 2,
            "in_ort": sum(figures["in_ort"]) / 2, "se": 0.5 * (figures["se"][0] ** 2 + figures["se"][1] ** 2) ** 0.5,
            "orders": tuple(figures["total"])}


def agreement(ours: np.ndarray, theirs: np.ndarray) -> str:
    """One output's largest difference from LiteRT's, as ``nnapi compare`` measures it:
    float relative to LiteRT's largest magnitude, else in (quantized) steps."""
    measured = difference(ours, theirs)
    return f"{measured:.1e} rel" if theirs.dtype.kind == "f" else f"{measured:.0f} steps"


def agreements(names: list[str], ours: list[np.ndarray], theirs: list[np.ndarray],
               detections: list[tuple[str, str, str, str]]) -> str:
    """The agreement column, in output order: each output's ``agreement``, except that the
    four outputs of each group in ``detections`` (a TFLite_Detection_PostProcess: boxes,
    classes, scores, count, by name) are compared as detections, as ``nnapi compare`` does:
    the engines order equal scores differently, so slot by slot they differ where the
    detections are the same."""
    mine, other = dict(zip(names, ours, strict=True)), dict(zip(names, theirs, strict=True))
    parts = []
    for name in names:
        group = next((group for group in detections if name in group), None)
        if group is None:
            parts.append(agreement(mine[name], other[name]))
        elif name == next(n for n in names if n in group):  # the group's first output says it
            parts.append(f"detections {detections_summary(compare_detections(mine, other, group))}")
    return ", ".join(parts)


def bench_model(path: Path, runs: int, reference_runs: int, clock, shapes: list[str] | None = None) -> dict:
    """One model's row; ``shapes``: ``--input-shape NAME=D1,D2,...`` options, those naming an
    input of the model fixing its open dimensions in the import (load_model's
    ``input_shapes``) and in LiteRT (its ``resize_tensor_input``), as ``nnapi run`` /
    ``compare`` do (``row["input_shapes"]``: the names it took)."""
    interpreter = litert_interpreter(str(path), threads=1, shapes=shapes)
    if interpreter is None:
        raise SystemExit("bench_ort needs LiteRT: pip install 'nnapi[litert]'")
    input_details, output_details = interpreter.get_input_details(), interpreter.get_output_details()
    inputs = random_inputs(input_details)

    def litert(arrays):
        for detail, array in zip(input_details, arrays, strict=True):
            interpreter.set_tensor(detail["index"], array)
        interpreter.invoke()
        return [interpreter.get_tensor(d["index"]) for d in output_details]

    names = {detail["name"] for detail in input_details}
    given = {name: shape for name, shape in (input_shapes(shapes) or {}).items() if name in names}
    imported = nnapi.load_model(path, input_shapes=given or None)
    model = imported.model
    # TFLite variable tensors are hidden NNAPI inputs (their state) and outputs
    states = {state.input_index: state.initial for state in imported.states}
    hidden = [states.get(position, None) for position in range(len(input_details), len(model.inputs))]
    if any(value is None for value in hidden):
        raise SystemExit(f"{path}: model inputs beyond LiteRT's that are not state")
    # LiteRT's outputs at these inputs: a shape that follows from the inputs' (an input
    # resized) is known after its run only; the operand's dtype (an int64 index output is
    # held as TENSOR_INT32)
    expected = [a.copy() for a in litert(inputs)]
    outputs = [np.zeros(a.shape, model.operand_type(index).dtype) for a, index in zip(expected, model.outputs)]
    for index in model.outputs[len(output_details):]:
        operand = model.operand_type(index)
        outputs.append(np.zeros(operand.dimensions, operand.dtype))
    device = ort_device()
    reference = [d for d in nnapi.get_devices() if d.name == "nnapi-reference"][0]
    with tempfile.TemporaryDirectory() as cache_dir:
        ours = NnapiRunner(model, [device, reference], outputs, cache_dir, hidden)
        cached = NnapiRunner(model, [device, reference], outputs, cache_dir, hidden)
    steps = ours.compilation.step_devices
    own = ort_own_runner(model, ours.compilation) if steps == ["nnapi-ort-cpu"] and not hidden else None
    clocked = clock_ort(ours.compilation, clock) if own is not None else None
    reusable_outputs = [np.zeros_like(a) for a in outputs]
    reusable = ReusableRunner(ours.compilation, inputs, reusable_outputs, hidden)
    result = [a.copy() for a in ours(inputs)]
    reusable(inputs)
    if any(not np.array_equal(a, b) for a, b in zip(reusable_outputs, result, strict=True)):
        raise SystemExit(f"{path}: the reusable execution's outputs differ from the execution's")
    if ours.compilation._plan.fallback_count:
        raise SystemExit(f"{path}: the ORT step failed and ran on the CPU")
    times: dict[str, list[float]] = {"litert": [], "ort": [], "new": [], "reusable": [], "own": []}
    # per nnapi engine and order (nnapi first: 0, ORT first: 1), the rounds' pairs
    # (nnapi, its time inside ORT's C++ run, ORT own, its time inside)
    pairs: dict[str, tuple[list, list]] = {name: ([], []) for name in ("ort", "new", "reusable")}

    def timed(runner, arrays) -> tuple[float, float]:
        start = clock()
        runner(arrays)
        return clock() - start, clocked.last if clocked is not None else 0.0

    for round_number in range(runs):
        times["litert"].append(timed(litert, inputs)[0])
        order = round_number % 2
        for name, runner in (("ort", ours), ("new", ours), ("reusable", reusable)):
            arrays = inputs if name != "new" else [a.copy() for a in inputs]
            if own is None:
                if name != "new":
                    times[name].append(timed(runner, arrays)[0])
                continue
            if order == 0:
                (ours_s, ours_in), (own_s, own_in) = timed(runner, arrays), timed(own, arrays)
            else:
                (own_s, own_in), (ours_s, ours_in) = timed(own, arrays), timed(runner, arrays)
            times[name].append(ours_s)
            times["own"].append(own_s)
            pairs[name][order].append((ours_s, ours_in, own_s, own_in))
    if ours.compilation._plan.fallback_count:
        raise SystemExit(f"{path}: the ORT step failed and ran on the CPU")
    row = {"model": path.stem, "input_shapes": sorted(given), "steps": steps, "compile_s": ours.compile_s,
           "cached_s": cached.compile_s,
           "agreement": agreements([d["name"] for d in output_details], result[:len(expected)], expected,
                                   imported.detections)}
    for name, samples in times.items():
        row[name] = min(samples) if samples else None
    # the order's cost cancelled: the mean of the medians of either order (a median of the
    # round's own difference moves much less with the machine's load than two minima do)
    for name, either in pairs.items():
        figures = _overhead(either)
        row[f"{name}_overhead"] = figures["total"] if figures else None
        row[f"{name}_detail"] = figures
        if figures and clocked is None:
            figures["python"] = figures["in_ort"] = float("nan")
    row["reference"] = None
    if reference_runs:
        alone = NnapiRunner(model, [reference], [np.zeros_like(a) for a in outputs], hidden=hidden)
        alone(inputs)
        samples = []
        for _ in range(reference_runs):
            start = clock()
            alone(inputs)
            samples.append(clock() - start)
        row["reference"] = min(samples)
    return row


def declining_ort_device(declined: set[int]) -> nnapi.Device:
    """A second nnapi-ort-cpu that declines the operation types ``declined`` (its capabilities
    are the real device's), so a plan splits there and the reference runs them."""
    from nnapi.drivers.ort.device import OrtDevice

    real = ort_device()._hal

    class DecliningOrt(OrtDevice):
        def get_capabilities(self):
            return real.get_capabilities()

        def get_unsupported_reasons(self, model):
            reasons = super().get_unsupported_reasons(model)
            return [reason if operation.type not in declined else "declined for the boundary benchmark"
                    for operation, reason in zip(model.main.operations, reasons, strict=True)]

    name = "nnapi-ort-cpu-split"
    if not [d for d in nnapi.get_devices() if d.name == name]:
        manager.register_device(DecliningOrt(name=name))
    return [d for d in nnapi.get_devices() if d.name == name][0]


def boundary_cost(path: Path, operation: str, runs: int, clock) -> dict:
    """The same model as one ORT step and split around every ``operation``: the best time of
    each (taking turns), the number of boundaries and the cost of one."""
    imported = nnapi.load_tflite(path)
    model = imported.model
    if imported.states:
        raise SystemExit(f"{path}: a model with state is not supported by the boundary benchmark")
    inputs = [np.asarray(random_inputs([{"dtype": model.operand_type(i).dtype,
                                         "shape": model.operand_type(i).dimensions}], seed=n)[0])
              for n, i in enumerate(model.inputs)]
    outputs = [np.zeros(model.operand_type(i).dimensions, model.operand_type(i).dtype) for i in model.outputs]
    reference = [d for d in nnapi.get_devices() if d.name == "nnapi-reference"][0]
    whole = NnapiRunner(model, [ort_device(), reference], outputs)
    split_outputs = [np.zeros_like(a) for a in outputs]
    split = NnapiRunner(model, [declining_ort_device({nnapi.OperationCode[operation]}), reference], split_outputs)
    boundaries = len(split.compilation.step_devices) - 1
    # the time inside each step's driver, per device kind, summed over a run
    inside = {"ort": 0.0, "reference": 0.0}
    for step in split.compilation._plan.steps:
        kind = "reference" if step.device.name == "nnapi-reference" else "ort"
        step.prepared.execute = _clocked_call(step.prepared.execute, inside, kind, clock)
    whole(inputs)
    split(inputs)
    agreement_text = ", ".join(agreement(a, b) for a, b in zip(split_outputs, outputs, strict=True))
    times: dict[str, list[float]] = {"whole": [], "split": [], "ort": [], "reference": []}
    for round_number in range(runs):
        order = [("whole", whole), ("split", split)]
        for name, runner in order if round_number % 2 == 0 else order[::-1]:
            inside["ort"] = inside["reference"] = 0.0
            start = clock()
            runner(inputs)
            times[name].append(clock() - start)
            if name == "split":
                times["ort"].append(inside["ort"])
                times["reference"].append(inside["reference"])
    best = {name: min(samples) for name, samples in times.items() if name in ("whole", "split")}
    median = {name: float(np.median(samples)) for name, samples in times.items()}
    parts = None
    if boundaries:
        # per boundary: the ORT steps' time beyond the whole model's (one more session run,
        # the graph cut there), the declined operations on the reference (its driver
        # included), and the rest: the runtime's own work per step
        parts = {"ort": (median["ort"] - median["whole"]) / boundaries,
                 "reference": median["reference"] / boundaries,
                 "runtime": (median["split"] - median["ort"] - median["reference"]) / boundaries}
    return {"model": path.stem, "operation": operation, "whole_steps": whole.compilation.step_devices,
            "boundaries": boundaries, "agreement": agreement_text, **best, "parts": parts,
            "per_boundary": (best["split"] - best["whole"]) / boundaries if boundaries else None}


def _clocked_call(call, totals: dict, key: str, clock):
    def clocked(*args, **kwargs):
        start = clock()
        try:
            return call(*args, **kwargs)
        finally:
            totals[key] += clock() - start
    return clocked


def overhead_probe(rounds: int = 3000) -> tuple[float, float, float, float]:
    """Per-execution cost on a model whose compute is negligible (one ADD of 8 floats):
    (ORT's own run, the driver's execute, a full Execution through the runtime, a reusable
    Execution's compute), in
    microseconds, best of ``rounds`` -- the runtime's and driver's overhead without the
    noise of a real model's run time."""
    from nnapi.hal import DataLocation, Request, RequestArgument

    model = nnapi.Model()
    vector = nnapi.OperandType(nnapi.OperandCode.TENSOR_FLOAT32, [1, 8])
    a, b = model.add_operand(vector), model.add_operand(vector)
    fuse = model.add_operand(nnapi.OperandType(nnapi.OperandCode.INT32))
    model.set_operand_value(fuse, 0)
    y = model.add_operand(vector)
    model.add_operation(nnapi.OperationCode.ADD, [a, b, fuse], [y])
    model.identify_inputs_and_outputs([a, b], [y])
    model.finish()
    x, out = np.ones((1, 8), np.float32), np.zeros((1, 8), np.float32)
    runner = NnapiRunner(model, [ort_device()], [out])
    own = ort_own_runner(model, runner.compilation)
    from nnapi.runtime.model_builder import build_hal_model

    prepared = ort_device()._hal.prepare_model(build_hal_model(model)[0])
    request = Request([RequestArgument(False, DataLocation(0, 0, 32)), RequestArgument(False, DataLocation(1, 0, 32))],
                      [RequestArgument(False, DataLocation(2, 0, 32))], [x, x, out])
    reusable = ReusableRunner(runner.compilation, [x, x], [np.zeros_like(out)])
    calls = {"own": lambda: own([x, x]), "driver": lambda: prepared.execute(request), "runtime": lambda: runner([x, x]),
             "reusable": lambda: reusable([x, x])}
    best = dict.fromkeys(calls, float("inf"))
    for _ in range(rounds):
        for name, call in calls.items():
            start = time.perf_counter()
            call()
            best[name] = min(best[name], time.perf_counter() - start)
    return best["own"] * 1e6, best["driver"] * 1e6, best["runtime"] * 1e6, best["reusable"] * 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("models", nargs="*", help="tflite files (default: the shared models by name)")
    parser.add_argument("--models-dir", type=Path, default=SHARED_MODELS,
                        help=f"where the default models are (default {SHARED_MODELS})")
    parser.add_argument("--runs", type=int, default=40, help="rounds (default 40; at least 2 for overheads)")
    parser.add_argument("--reference-runs", type=int, default=1, help="timed reference runs (0: skip it)")
    parser.add_argument("--wall", action="store_true", help="time wall-clock instead of process CPU time")
    parser.add_argument("--input-shape", action="append", metavar="NAME=D1,D2,...",
                        help="fix an input's open dimensions to this shape in nnapi's import and in LiteRT (its "
                             "resize_tensor_input), as nnapi run does; each model takes those naming one of its "
                             "inputs (repeatable)")
    parser.add_argument("--split-model", default="mobilenet_v2_1.0_224_float",
                        help="the model of the partition-boundary benchmark (a name in --models-dir or a path)")
    parser.add_argument("--split-op", default="ADD", help="operation type declined there (default ADD)")
    parser.add_argument("--split-only", action="store_true", help="only the partition-boundary benchmark")
    args = parser.parse_args(argv)
    try:
        input_shapes(args.input_shape)
    except CliError as error:
        parser.error(str(error))
    clock = time.perf_counter if args.wall else time.process_time
    if not args.split_only:
        print_table(args, clock)
    split_path = Path(args.split_model)
    if not split_path.exists():
        split_path = args.models_dir / f"{args.split_model}.tflite"
    if not split_path.exists():
        print(f"partition boundaries: (missing: {split_path}; give --split-model or --models-dir)")
        return 0
    row = boundary_cost(split_path, args.split_op, args.runs, clock)
    print(f"partition boundaries: {row['model']}, every {row['operation']} on nnapi-reference: "
          f"whole ({' > '.join(row['whole_steps'])}) {row['whole'] * 1e3:.2f} ms, split in "
          f"{row['boundaries'] + 1} steps {row['split'] * 1e3:.2f} ms -> "
          + (f"{row['per_boundary'] * 1e6:.0f} us per boundary" if row["boundaries"] else "no boundary")
          + f" (the {row['operation']}s' own reference time included); split vs whole {row['agreement']}")
    if row["parts"]:
        parts = row["parts"]
        print(f"    per boundary (medians of the rounds): ORT {parts['ort'] * 1e6:.0f} us (its steps' time beyond "
              f"the whole model's: a session run more, the graph cut there), the {row['operation']} on "
              f"nnapi-reference {parts['reference'] * 1e6:.0f} us (its driver included), the runtime's own "
              f"{parts['runtime'] * 1e6:.0f} us (requests and buffers of the steps)")
    return 0


def print_table(args, clock) -> None:
    paths = [Path(p) for p in args.models] or [args.models_dir / f"{name}.tflite" for name in DEFAULT_MODELS]
    header = (f"{'model':<34} {'LiteRT ms':>9} {'ort ms':>8} {'ort/LiteRT':>10} {'ORT own':>8} {'overhead':>9} "
              f"{'new in':>9} {'reusable':>9} {'reference':>10} {'compile':>8} {'cached':>7}  agreement / plan")
    print(OVERHEAD_NOTE)
    print(header)
    taken: set[str] = set()  # the --input-shape names some model took
    for path in paths:
        if not path.exists():
            print(f"{path.stem:<34} (missing: {path})")
            continue
        try:
            row = bench_model(path, args.runs, args.reference_runs, clock, args.input_shape)
        except (nnapi.NnapiError, CliError, RuntimeError, ValueError) as error:
            # a model one of the engines cannot run (LiteRT: a custom operator it lacks; nnapi:
            # an import it refuses) gets a line saying so; the other models still run
            first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            print(f"{path.stem:<34} (not compared: {type(error).__name__}: {first_line[:160]})")
            continue
        taken.update(row["input_shapes"])
        own = f"{row['own'] * 1e3:8.2f}" if row["own"] else f"{'-':>8}"
        overhead = f"{row['ort_overhead'] * 1e6:7.0f}us" if row["own"] else f"{'-':>9}"
        new_in = f"{row['new_overhead'] * 1e6:7.0f}us" if row["own"] else f"{'-':>9}"
        reusable = f"{row['reusable_overhead'] * 1e6:7.0f}us" if row["own"] else f"{'-':>9}"
        reference = f"{row['reference'] * 1e3:8.0f}ms" if row["reference"] else f"{'-':>10}"
        plan = "" if row["steps"] == ["nnapi-ort-cpu"] else f"; plan {' > '.join(row['steps'])}"
        print(f"{row['model']:<34} {row['litert'] * 1e3:9.2f} {row['ort'] * 1e3:8.2f} "
              f"{row['ort'] / row['litert']:9.2f}x {own} {overhead} {new_in} {reusable} {reference} "
              f"{row['compile_s']:7.2f}s {row['cached_s']:6.2f}s  {row['agreement']}{plan}")
        if row["own"]:
            parts = []
            for name, label in (("ort", "overhead"), ("new", "new in"), ("reusable", "reusable")):
                detail = row[f"{name}_detail"]
                first, second = detail["orders"]
                parts.append(f"{label} {detail['total'] * 1e6:.0f} +-{detail['se'] * 1e6:.0f} us = python "
                             f"{detail['python'] * 1e6:.0f} + in ORT {detail['in_ort'] * 1e6:.0f} (nnapi first "
                             f"{first * 1e6:.0f}, ORT first {second * 1e6:.0f})")
            print(f"{'':<4}{'; '.join(parts)}")
        sys.stdout.flush()
    for name in sorted(set(input_shapes(args.input_shape) or {}) - taken):
        print(f"--input-shape {name}=...: no model compared has an input {name!r}")
    own, driver, runtime, reusable = overhead_probe()
    print(f"per-execution overhead (one ADD of 8 floats, best of 3000): ORT's own run {own:.1f}us, "
          f"driver execute {driver:.1f}us, full Execution {runtime:.1f}us -> nnapi adds {runtime - own:.1f}us; "
          f"reusable Execution {reusable:.1f}us -> {reusable - own:.1f}us")


if __name__ == "__main__":
    sys.exit(main())
