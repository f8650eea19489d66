"""Random-graph differential testing, after Android's CTS RandomGraph tests.

Graphs are grown from operation signatures taken from the CTS vectors: every
single-operation vector is a valid signature of its operation (operand types, shapes,
quantization and parameters the specification allows). A graph chains several of them,
feeding an earlier operation's output into a later operation's input of the same type
and shape, with fresh seeded random values for every float or quantized input. It runs
on the device under test (beside the reference, which takes the operations the device
refuses) and on ``nnapi-reference`` alone; the CTS criteria judge the difference. A
failing graph is written as a CTS vector (the reference's outputs as expected values),
so ``nnapi conformance FILE`` with the device loaded replays it (no ``--device``: as in
the fuzz run, the operations the device refuses go to the reference). With ``constants``
some data inputs become constants of their random values (``with_constants``), which
reaches the lowerings a device specializes on constant operands.

A graph whose outputs differ is then explained. Each operation runs alone on the device,
on the inputs the reference computed for it: one that fails there is the culprit, and its
single-operation vector is written beside the graph. When every operation passes alone,
the reference runs the graph again operation by operation with every value it reads or
writes moved by one step (a float's last place, a quantized step: roundings a device may
make differently): if its own outputs then move past the CTS tolerance, the graph is
ill-conditioned (EXP into SIN, ties of a saturated TANH, a quantized SUB into a scale ten
times finer, ...) and the device's difference,
grown from roundings each within tolerance, is reported as such rather than as a failure.
Otherwise the operations fail only together (a fused lowering, say): a failure.
"""

from __future__ import annotations

import copy
import functools
import json
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

import nnapi
from nnapi.conformance import _array, build_model, compare, default_vector_files, load_records
from nnapi.errors import BadDataError
from nnapi.operand import DTYPES
from nnapi.tools._models import beside_reference, device_and_reference

#: Input types whose values are data (not indices, sizes or flags): randomized and chainable.
DATA_TYPES = ("TENSOR_FLOAT32", "TENSOR_FLOAT16", "TENSOR_QUANT8_ASYMM", "TENSOR_QUANT8_ASYMM_SIGNED",
              "TENSOR_QUANT16_ASYMM", "TENSOR_QUANT16_SYMM", "TENSOR_QUANT8_SYMM")
#: Operations whose inputs past the first are boxes, anchors or regions with ordering rules
#: (x1 <= x2, ...): those keep the signature's own values and are never fed from elsewhere.
BOX_OPERATIONS = {"ROI_ALIGN", "ROI_POOLING", "HEATMAP_MAX_KEYPOINT"}
#: Operations whose every input is boxes, or whose output sizes depend on the input values:
#: they keep all of the signature's values.
FIXED_OPERATIONS = {"AXIS_ALIGNED_BBOX_TRANSFORM", "BOX_WITH_NMS_LIMIT", "GENERATE_PROPOSALS",
                    "DETECTION_POSTPROCESSING"}
#: Operations whose outputs are random by definition.
RANDOM_OPERATIONS = {"RANDOM_MULTINOMIAL"}


def load_signatures(files: list[Path] | None = None) -> dict[str, list[dict]]:
    """Single-operation CTS records, grouped by operation name, usable as signatures
    (read once per set of files; callers get their own dict)."""
    return dict(_signatures(tuple(files or default_vector_files())))


@functools.lru_cache(maxsize=4)
def _signatures(files: tuple[Path, ...]) -> dict[str, list[dict]]:
    signatures: dict[str, list[dict]] = {}
    for path in files:
        for record in load_records(path):
            main = record["main"]
            if (record.get("expectFailure") or record.get("referenced") or record.get("isRelaxed")
                    or len(main["operations"]) != 1 or main["operations"][0]["type"] in RANDOM_OPERATIONS
                    or any(0 in o["dimensions"] for i, o in enumerate(main["operands"])
                           if i not in _omitted(main))):
                continue
            signatures.setdefault(main["operations"][0]["type"], []).append(record)
    return signatures


def _omitted(main: dict) -> set[int]:
    """The optional inputs a single-operation CTS vector omits (model inputs of no value,
    given as null at execution), where one has a zero in its shape (an LSTM's CIFG or
    peephole weights): all of them, so that the graphs keep the vector's variant (an LSTM
    whose input weights were filled in but not its zero-sized cell_to_input is invalid),
    as NO_VALUE operands, their meaning. Elsewhere none: an omitted input of a full shape
    takes random values like any other (the variant that has it; a bidirectional LSTM's)."""
    empty = {i for i, operand in enumerate(main["operands"])
             if operand["lifetime"] == "SUBGRAPH_INPUT" and not operand["data"]}
    return empty if any(0 in main["operands"][i]["dimensions"] for i in empty) else set()


def _key(operand: dict) -> tuple:
    return (operand["type"], tuple(operand["dimensions"]), operand.get("scale", 0.0), operand.get("zeroPoint", 0))


def _random_values(operand: dict, rng: np.random.Generator) -> list:
    dtype = DTYPES[nnapi.OperandCode[operand["type"]]]
    count = math.prod(operand["dimensions"]) if operand["dimensions"] else 1
    if np.issubdtype(dtype, np.floating):
        original = _array(operand["data"], nnapi.OperandCode[operand["type"]]).astype(np.float64)
        spread = float(np.abs(original).max()) if original.size and np.isfinite(original).all() else 1.0
        with np.errstate(under="ignore"):  # values near zero become float16 subnormals or zero
            return rng.uniform(-spread or -1.0, spread or 1.0, count).astype(dtype).astype(float).tolist()
    info = np.iinfo(dtype)
    return rng.integers(info.min, int(info.max) + 1, count).tolist()


def _free_inputs(main: dict) -> set[int]:
    """The inputs of a single-operation graph that take random values or earlier outputs."""
    operation = main["operations"][0]
    if operation["type"] in FIXED_OPERATIONS:
        return set()
    inputs = operation["inputs"][:1] if operation["type"] in BOX_OPERATIONS else operation["inputs"]
    omitted = _omitted(main)
    return {i for i in inputs if main["operands"][i]["lifetime"] == "SUBGRAPH_INPUT"
            and main["operands"][i]["type"] in DATA_TYPES and i not in omitted}


def generate(signatures: dict[str, list[dict]], rng: np.random.Generator, max_operations: int = 5,
             name: str = "fuzz") -> dict:
    """One random graph as a CTS record (inputs filled in; expected outputs not yet)."""
    names = sorted(signatures)
    operands: list[dict] = []
    operations: list[dict] = []
    produced: dict[tuple, list[int]] = {}
    wanted = int(rng.integers(1, max_operations + 1))
    for _ in range(wanted):
        choice = None
        for attempt in range(20):
            candidates = signatures[names[int(rng.integers(len(names)))]]
            record = candidates[int(rng.integers(len(candidates)))]
            main = record["main"]
            free = _free_inputs(main)
            links = {i: produced[_key(main["operands"][i])] for i in free if _key(main["operands"][i]) in produced}
            if links or not operations or attempt == 19:
                choice = (record, links)
                break
        record, links = choice  # type: ignore[misc]
        main = record["main"]
        free = _free_inputs(main)
        omitted = _omitted(main)
        remap: dict[int, int] = {}
        for old, operand in enumerate(main["operands"]):
            if old in links and rng.random() < 0.9:
                options = links[old]
                remap[old] = options[int(rng.integers(len(options)))]
                continue
            fresh = copy.deepcopy(operand)
            if old in omitted:
                fresh.update(lifetime="NO_VALUE", data=None)
            if old in free:
                fresh["data"] = _random_values(fresh, rng)
            if fresh["lifetime"] == "SUBGRAPH_OUTPUT":
                fresh["lifetime"] = "TEMPORARY_VARIABLE"
                fresh["data"] = None
            fresh["name"] = f"op{len(operations)}_{operand['name']}"
            remap[old] = len(operands)
            operands.append(fresh)
        operation = main["operations"][0]
        operations.append({"type": operation["type"], "inputs": [remap[i] for i in operation["inputs"]],
                           "outputs": [remap[i] for i in operation["outputs"]]})
        for i in operation["outputs"]:
            produced.setdefault(_key(operands[remap[i]]), []).append(remap[i])
    consumed = {i for op in operations for i in op["inputs"]}
    outputs = [i for op in operations for i in op["outputs"] if i not in consumed]
    for i in outputs:
        operands[i]["lifetime"] = "SUBGRAPH_OUTPUT"
    inputs = [i for i, operand in enumerate(operands) if operand["lifetime"] == "SUBGRAPH_INPUT"]
    return {"spec": "fuzz", "version": "fuzz", "test": name,
            "main": {"name": None, "operands": operands, "operations": operations,
                     "inputIndexes": inputs, "outputIndexes": outputs},
            "referenced": [], "isRelaxed": False, "expectFailure": False, "multinomialTolerance": 0.0,
            "minSupportedVersion": "V1_0"}


def with_constants(record: dict, rng: np.random.Generator, share: float) -> dict:
    """``record`` with about ``share`` of its run-time data inputs made constants of the same
    values (one input stays): the lowerings a device specializes on a constant operand (a
    quantized ADD / MUL by a constant, a PRELU's constant alpha, ...) are then tried, which
    the CTS signatures, whose data inputs are mostly run-time ones, rarely reach."""
    record = copy.deepcopy(record)
    main = record["main"]
    chosen = [i for i in main["inputIndexes"]
              if main["operands"][i]["type"] in DATA_TYPES and rng.random() < share]
    if len(chosen) == len(main["inputIndexes"]):
        chosen = chosen[1:]
    for index in chosen:
        main["operands"][index]["lifetime"] = "CONSTANT_COPY"
    main["inputIndexes"] = [i for i in main["inputIndexes"] if i not in chosen]
    return record


def _json_value(value: float | int | bool) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # the vector format's spelling of nan / inf
    return value


def _run(record: dict, devices: list[nnapi.Device]) -> list[np.ndarray]:
    from nnapi.session import Session

    keep: list = []
    session = Session(build_model(record, keep=keep), devices)
    main = record["main"]
    feeds = {}
    for info, index in zip(session.inputs, main["inputIndexes"], strict=True):
        operand = main["operands"][index]
        value = _array(operand["data"], nnapi.OperandCode[operand["type"]])
        feeds[info.name] = value.reshape(operand["dimensions"]) if operand["dimensions"] else value.reshape(())
    return list(session.run(feeds).values())


#: Perturbed reference runs that look for an ill-conditioned graph (a near tie that a
#: device's roundings flip needs the moves that flip it: 3 missed seed 5417 graph 9's).
PERTURBATIONS = 20


def _with_values(operand: dict, value: np.ndarray, lifetime: str) -> dict:
    operand = copy.deepcopy(operand)
    operand.update(lifetime=lifetime, dimensions=list(value.shape),
                   data=[_json_value(v) for v in value.reshape(-1).tolist()])
    return operand


def _intermediates(record: dict, reference: nnapi.Device) -> dict[int, np.ndarray]:
    """Every operation output of ``record``'s graph as the reference computes it."""
    exposed = copy.deepcopy(record)
    main = exposed["main"]
    outputs = [i for operation in main["operations"] for i in operation["outputs"]]
    for index in outputs:
        main["operands"][index]["lifetime"] = "SUBGRAPH_OUTPUT"
    main["outputIndexes"] = outputs
    return dict(zip(outputs, _run(exposed, [reference]), strict=True))


def alone(record: dict, position: int, values: dict[int, np.ndarray]) -> dict:
    """Operation ``position`` of ``record`` as a single-operation CTS record: the inputs
    earlier operations computed take ``values`` (the reference's), and so do its expected
    outputs where ``values`` has them."""
    main = record["main"]
    operation = main["operations"][position]
    operands: list[dict] = []
    remap: dict[int, int] = {}
    for old in operation["inputs"] + operation["outputs"]:
        if old in remap:
            continue
        operand = main["operands"][old]
        if old in operation["outputs"]:
            operand = _with_values(operand, values[old], "SUBGRAPH_OUTPUT") if old in values else \
                {**operand, "lifetime": "SUBGRAPH_OUTPUT"}
        elif old in values:
            operand = _with_values(operand, values[old], "SUBGRAPH_INPUT")
        remap[old] = len(operands)
        operands.append(operand)
    inputs = [i for i, operand in enumerate(operands) if operand["lifetime"] == "SUBGRAPH_INPUT"]
    if not inputs:  # every input a constant (with_constants): a model needs one, its first data input
        first = next((i for i, operand in enumerate(operands) if operand["type"] in DATA_TYPES
                      and operand["lifetime"] == "CONSTANT_COPY"), None)
        if first is not None:
            operands[first] = {**operands[first], "lifetime": "SUBGRAPH_INPUT"}
            inputs = [first]
    return {**record, "test": f"{record['test']}_op{position}",
            "main": {"name": None, "operands": operands,
                     "operations": [{"type": operation["type"], "inputs": [remap[i] for i in operation["inputs"]],
                                     "outputs": [remap[i] for i in operation["outputs"]]}],
                     "inputIndexes": inputs, "outputIndexes": [remap[i] for i in operation["outputs"]]}}


def _check(record: dict, devices: list[nnapi.Device]) -> dict[int | None, str]:
    """What differs when ``record`` runs on ``devices`` (the reference's outputs stored in
    it), by output operand index; under None when the run itself failed."""
    main = record["main"]
    try:
        actual = _run(record, devices)
    except nnapi.NnapiError as error:
        return {None: f"{devices[0].name}: {type(error).__name__}: {error}"}
    return {index: problem for index, value in zip(main["outputIndexes"], actual)
            if (problem := compare(record, main["operands"][index], value))}


def _moved(value: np.ndarray, operand_type: str, rng: np.random.Generator) -> np.ndarray:
    """``value`` with each element one step up or down: a unit in the last place of a float,
    a quantized step (the CTS tolerance of a quantized value) of a quantized type."""
    up = rng.random(value.shape) < 0.5
    if operand_type in ("TENSOR_FLOAT32", "TENSOR_FLOAT16"):
        # (a zero moves to the smallest subnormal: numpy calls that an underflow)
        with np.errstate(over="ignore", under="ignore"):
            moved = np.nextafter(value, np.where(up, np.inf, -np.inf).astype(value.dtype))
            # the largest finite value moves toward zero, never to an infinity
            return np.where(np.isinf(moved) & np.isfinite(value), np.nextafter(value, value.dtype.type(0)), moved)
    if operand_type in DATA_TYPES:  # the quantized ones
        info = np.iinfo(value.dtype)
        return np.clip(value.astype(np.int64) + np.where(up, 1, -1), info.min, info.max).astype(value.dtype)
    return value


def _ill_conditioned(record: dict, reference: nnapi.Device, rng: np.random.Generator,
                     differing: list[int]) -> str | None:
    """How far the reference's own ``differing`` outputs (those the device got wrong)
    move past the CTS tolerance when every value it reads or writes moves by one step (a
    float's last place, a quantized step) — the graph's inputs, then each operation's
    outputs: roundings a device may make differently; None when they stay within it.
    Only those outputs count: another output moving (a quantized copy moves two steps)
    says nothing of the difference."""
    main = record["main"]
    # boxes, anchors and regions keep their values: a moved box may break its ordering rules
    kept = {i for operation in main["operations"] if operation["type"] in FIXED_OPERATIONS
            for i in operation["inputs"]}
    kept |= {i for operation in main["operations"] if operation["type"] in BOX_OPERATIONS
             for i in operation["inputs"][1:]}
    for _ in range(PERTURBATIONS):
        moved = copy.deepcopy(record)
        for index in set(main["inputIndexes"]) - kept:
            operand = moved["main"]["operands"][index]
            value = _moved(_array(operand["data"], nnapi.OperandCode[operand["type"]]), operand["type"], rng)
            operand["data"] = [_json_value(v) for v in value.tolist()]
        values: dict[int, np.ndarray] = {}
        try:
            for position, operation in enumerate(main["operations"]):
                outputs = _run(alone(moved, position, values), [reference])
                values.update((index, value if index in kept else _moved(value, main["operands"][index]["type"], rng))
                              for index, value in zip(operation["outputs"], outputs))
        except nnapi.NnapiError:  # a value moved out of an operation's domain: no verdict
            continue
        problems = [problem for index in differing
                    if (problem := compare(record, main["operands"][index], values[index]))]
        if problems:
            return problems[0]
    return None


@dataclass
class FuzzOutcome:
    graph: str
    operations: list[str]
    #: "passed", "failed", "ill-conditioned" (differs, but every operation passes alone and the
    #: reference's own outputs move past the tolerance when its values move by one step) or
    #: "invalid" (the reference rejected the random graph)
    status: str
    message: str = ""
    path: str | None = None  # the culprit operation's vector, else the graph's


@dataclass
class FuzzReport:
    device: str
    seed: int
    outcomes: list[FuzzOutcome] = field(default_factory=list)

    def count(self, status: str) -> int:
        return sum(1 for outcome in self.outcomes if outcome.status == status)


def judge(record: dict, device: nnapi.Device, reference: nnapi.Device, rng: np.random.Generator,
          out_dir: str | Path | None = None) -> FuzzOutcome:
    """Run one graph (a CTS record whose inputs are filled in) on ``device`` beside the
    reference and on the reference alone; a difference is traced to the operations that
    fail alone, or judged ill-conditioned (``rng`` draws the one-ulp moves). A failing
    graph and its culprits' single-operation vectors are written to ``out_dir``."""
    names = [operation["type"] for operation in record["main"]["operations"]]
    try:
        expected = _run(record, [reference])
    except nnapi.NnapiError as error:
        return FuzzOutcome(record["test"], names, "invalid", f"reference: {type(error).__name__}: {error}")
    main = record["main"]
    for index, value in zip(main["outputIndexes"], expected):
        main["operands"][index]["data"] = [_json_value(v) for v in value.reshape(-1).tolist()]
    devices = beside_reference(device, reference)
    problems = _check(record, devices)
    if not problems:
        return FuzzOutcome(record["test"], names, "passed")
    status, message, culprits = "failed", "; ".join(problems.values()), []
    if None not in problems:
        values = _intermediates(record, reference)
        for position, operation in enumerate(main["operations"]):
            single = alone(record, position, values)
            if alone_problems := _check(single, devices):
                culprits.append(single)
                message += f"; operation #{position} {operation['type']} alone: {next(iter(alone_problems.values()))}"
        if not culprits:
            if spread := _ill_conditioned(record, reference, rng, list(problems)):
                status = "ill-conditioned"
                message += (f"; every operation passes alone, and the reference itself moves past the "
                            f"tolerance when its values move by one step ({spread})")
            else:
                message += "; every operation passes alone: they differ only together"
    path = None
    if out_dir is not None and status == "failed":
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        paths = []
        for written in [record, *culprits]:
            paths.append(str(Path(out_dir) / f"{written['test']}.jsonl"))
            with open(paths[-1], "w") as handle:
                handle.write(json.dumps(written) + "\n")
        path = paths[1] if culprits else paths[0]
    return FuzzOutcome(record["test"], names, status, message, path)


def fuzz(device: nnapi.Device | str, graphs: int = 100, seed: int = 0, out_dir: str | Path | None = None,
         max_operations: int = 5, signatures: dict[str, list[dict]] | None = None,
         constants: float = 0.0) -> Iterator[FuzzOutcome]:
    """Generate and check ``graphs`` random graphs on ``device``; yields one outcome per graph
    (see ``judge``) and writes each failing graph, and the operations that fail alone, to
    ``out_dir`` as ``<name>.jsonl`` / ``<name>_op<K>.jsonl``. ``constants``: the share of
    run-time data inputs made constants (``with_constants``); the graphs are otherwise
    the seed's own."""
    device, reference = device_and_reference(device, "fuzz")
    signatures = signatures if signatures is not None else load_signatures()
    if not signatures:
        raise BadDataError("fuzz: no CTS vectors to take operation signatures from")
    rng = np.random.default_rng(seed)
    for number in range(graphs):
        record = generate(signatures, rng, max_operations, name=f"fuzz_seed{seed}_graph{number}")
        if constants:
            record = with_constants(record, np.random.default_rng([seed, number, 1]), constants)
        # the one-ulp moves draw from their own generator: the graphs a seed makes never
        # depend on how the device did
        yield judge(record, device, reference, np.random.default_rng([seed, number]), out_dir)
