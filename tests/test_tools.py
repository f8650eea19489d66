"""The tools: graph dump, placement report, bisect, random-graph fuzzing, their commands,
logging and tracing."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import nnapi
from helpers import only_devices
from nnapi import OperationCode as Op
from nnapi.cli import main
from nnapi.demo import build_demo_model
from nnapi.drivers.sample import SampleDevice
from nnapi.hal import IPreparedModel
from nnapi.runtime.manager import register_device, unregister_device
from nnapi.tools import graph_dump
from nnapi.tools.bisect import bisect, format_result
from nnapi.tools.fuzz import fuzz, load_signatures
from nnapi.tools.graph_dump import to_dot
from nnapi.tools.placement import format_placement

MODELS = os.path.join(os.path.dirname(__file__), "data", "models")


class _Perturbing(IPreparedModel):
    """Adds 0.25 to every float32 output of the prepared model it wraps: a planted bug."""

    def __init__(self, inner: IPreparedModel, model) -> None:
        self.inner, self.model = inner, model

    def execute(self, request, measure_timing=False, deadline_ns=None, loop_timeout_ns=None):
        shapes, timing = self.inner.execute(request, measure_timing, deadline_ns, loop_timeout_ns)
        for argument, index in zip(request.outputs, self.model.main.output_indexes):
            if self.model.main.operands[index].type == nnapi.OperandCode.TENSOR_FLOAT32:
                location = argument.location
                values = np.frombuffer(request.pools[location.pool_index], np.float32, location.length // 4,
                                       location.offset)
                values += np.float32(0.25)
        return shapes, timing


class WrongDevice(SampleDevice):
    def prepare_model(self, model, *args, **kwargs):
        return _Perturbing(super().prepare_model(model, *args, **kwargs), model)


@pytest.fixture
def conv_device():
    with only_devices(SampleDevice("sample-conv", [Op.CONV_2D])):  # beside nnapi-reference alone
        yield "sample-conv"


@pytest.fixture
def wrong_conv_device():
    with only_devices(WrongDevice("wrong-conv", [Op.CONV_2D])):
        yield "wrong-conv"


@pytest.fixture
def reference_only():
    """The runtime sees nnapi-reference alone (no discovered plug-in) during the test."""
    with only_devices():
        yield


def _finished(model, names=None):
    devices = [d for d in nnapi.get_devices() if names is None or d.name in names]
    compilation = nnapi.Compilation(model, devices)
    compilation.finish()
    return compilation


# --- graph dump ---------------------------------------------------------------------------
def test_graph_dump_lists_operands_and_operations_with_parameters():
    graph = graph_dump(build_demo_model())
    (main_graph,) = graph["subgraphs"]
    types = [operation["type"] for operation in main_graph["operations"]]
    assert types == ["CONV_2D", "MAX_POOL_2D", "CONV_2D", "AVERAGE_POOL_2D", "RESHAPE", "FULLY_CONNECTED",
                     "SOFTMAX"]
    first = main_graph["operands"][0]
    assert first == {"index": 0, "type": "TENSOR_FLOAT32", "dimensions": [1, 16, 16, 3],
                     "lifetime": "SUBGRAPH_INPUT"}
    conv = main_graph["operations"][0]
    # CONV_2D's implicit padding, strides and activation are scalar constants at inputs 3..6
    assert set(conv["params"]) == {"3", "4", "5", "6"}
    weights = main_graph["operands"][conv["inputs"][1]]
    assert weights["lifetime"] == "CONSTANT_REFERENCE" and weights["value"].startswith("<216 values")
    assert "device" not in conv


def test_graph_dump_after_compilation_colours_by_device(conv_device):
    model = build_demo_model()
    compilation = _finished(model)
    graph = graph_dump(model, compilation)
    devices = [operation["device"] for operation in graph["subgraphs"][0]["operations"]]
    assert devices == ["sample-conv", "nnapi-reference", "sample-conv"] + ["nnapi-reference"] * 4
    dot = to_dot(graph)
    assert dot.startswith("digraph nnapi {") and dot.rstrip().endswith("}")
    assert dot.count('fillcolor="#8dd3c7"') == 2  # the two convolutions share sample-conv's colour
    assert "on sample-conv" in dot and "devices:" in dot


def test_graph_dump_draws_referenced_subgraphs_as_clusters():
    from test_control_flow import fibonacci_model

    graph = graph_dump(fibonacci_model())
    assert [subgraph["name"] for subgraph in graph["subgraphs"]] == ["main", "subgraph 1", "subgraph 2"]
    model_operands = [o for o in graph["subgraphs"][0]["operands"] if o["type"] == "MODEL"]
    assert sorted(o["subgraph"] for o in model_operands) == [1, 2]
    dot = to_dot(graph)
    assert "subgraph cluster_1 {" in dot and "subgraph cluster_2 {" in dot
    assert "WHILE (#0)" in dot and "LESS (#0)" in dot


def test_graph_dump_rejects_unfinished_models():
    with pytest.raises(nnapi.BadStateError, match="not finished"):
        graph_dump(nnapi.Model())
    with pytest.raises(nnapi.BadDataError, match="expected a Model"):
        graph_dump("model.tflite")
    with pytest.raises(nnapi.BadDataError, match="format"):
        graph_dump(build_demo_model(), format="png")


# --- placement ----------------------------------------------------------------------------
def test_placement_names_devices_refusals_partitions_and_bytes(conv_device):
    report = _finished(build_demo_model()).placement()
    assert report["partitions"] == 4
    assert [step["device"] for step in report["steps"]] == ["sample-conv", "nnapi-reference", "sample-conv",
                                                            "nnapi-reference"]
    pool = report["operations"][1]
    assert pool["type"] == "MAX_POOL_2D" and pool["device"] == "nnapi-reference"
    assert pool["refused"] == {"sample-conv": "declined by the driver"}
    assert report["operations"][0]["refused"] == {}
    # conv -> pool: 1x16x16x8 float32 crosses; pool -> conv: 1x8x8x8; conv -> avg pool: 1x8x8x16
    assert report["bytes_between_devices"] == 4 * (16 * 16 * 8 + 8 * 8 * 8 + 8 * 8 * 16)
    text = format_placement(report)
    assert "refused by sample-conv: declined by the driver" in text and "partitions: 4" in text


def test_placement_needs_a_finished_compilation():
    compilation = nnapi.Compilation(build_demo_model())
    with pytest.raises(nnapi.BadStateError, match="not finished"):
        compilation.placement()


# --- bisect -------------------------------------------------------------------------------
def test_bisect_finds_the_operation_a_device_gets_wrong(wrong_conv_device):
    result = bisect(build_demo_model(), wrong_conv_device)
    assert result.first is not None
    assert (result.first.operation, result.first.operation_type, result.first.device) == (0, "CONV_2D",
                                                                                          "wrong-conv")
    assert result.first.dimensions == [1, 16, 16, 8]
    assert result.first.mismatched == 16 * 16 * 8 and abs(result.first.max_abs_difference - 0.25) < 1e-6
    assert result.later  # everything downstream differs too
    assert result.first.inherited_difference == 0.0
    assert "first difference at operation #0 CONV_2D (ran on wrong-conv)" in format_result(result)
    # alone, on the reference's input, the convolution is still 0.25 off
    assert result.first.fails_alone is True and result.culprit is result.first
    assert "it still differs: the difference is made here" in format_result(result)


def test_bisect_reports_agreement(conv_device):
    result = bisect(build_demo_model(), conv_device)
    assert result.first is None and result.compared == 7
    assert "all 7 operation outputs agree" in format_result(result)


def test_bisect_says_when_a_difference_grew_from_earlier_operations(wrong_conv_device):
    result = bisect(build_demo_model(), wrong_conv_device, tolerance=(1.0, 0.0))
    # the convolutions' 0.25 errors pass a 1.0 tolerance; the fully connected layer,
    # run by the reference, amplifies them past it
    assert (result.first.operation_type, result.first.device) == ("FULLY_CONNECTED", "nnapi-reference")
    assert result.first.inherited_difference > 0.25
    assert "may have grown from earlier operations" in format_result(result)
    # alone, on the reference's values of its inputs, the fully connected layer agrees; no
    # operation differs alone by more than the 1.0 tolerance
    assert result.first.fails_alone is False and result.culprit is None
    assert "no operation differs alone" in format_result(result)
    assert bisect(build_demo_model(), wrong_conv_device, tolerance=(10.0, 0.0)).first is None


# --- fuzz ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def signatures():
    return load_signatures()


def test_fuzz_signatures_cover_most_operations(signatures):
    assert len(signatures) > 85
    assert all(len(record["main"]["operations"]) == 1 for records in signatures.values() for record in records)


def test_fuzz_keeps_the_omitted_inputs_of_an_lstm_signature_omitted(signatures):
    """The CTS LSTM vectors omit optional inputs as model inputs of no value, some of a
    zero-sized shape: they are signatures (they were skipped as zero-sized), and their
    graphs omit the same inputs (NO_VALUE), so the reference runs every one (an LSTM whose
    omitted input weights were filled in beside an omitted zero-sized cell_to_input was
    invalid)."""
    from nnapi.tools.fuzz import generate, judge

    assert len(signatures["LSTM"]) >= 20 and len(signatures["UNIDIRECTIONAL_SEQUENCE_LSTM"]) >= 8
    lstms = {"LSTM": signatures["LSTM"], "UNIDIRECTIONAL_SEQUENCE_LSTM": signatures["UNIDIRECTIONAL_SEQUENCE_LSTM"]}
    reference = next(d for d in nnapi.get_devices() if d.name == "nnapi-reference")
    rng = np.random.default_rng(1)
    omitted = 0
    for number in range(12):
        record = generate(lstms, rng, 2, name=f"lstm{number}")
        omitted += sum(o["lifetime"] == "NO_VALUE" for o in record["main"]["operands"])
        outcome = judge(record, reference, reference, np.random.default_rng(number))
        assert outcome.status == "passed", outcome.message
    assert omitted > 0


def test_fuzz_reference_against_itself_passes(signatures):
    outcomes = list(fuzz("nnapi-reference", graphs=30, seed=3, signatures=signatures))
    assert len(outcomes) == 30
    assert [o for o in outcomes if o.status == "failed"] == []
    assert sum(o.status == "passed" for o in outcomes) >= 27
    assert max(len(o.operations) for o in outcomes) > 1


def test_fuzz_finds_a_planted_bug_and_writes_a_replayable_vector(tmp_path, signatures, wrong_conv_device):
    from nnapi.conformance import load_records, run_record

    conv_only = {"CONV_2D": signatures["CONV_2D"], "RELU": signatures["RELU"]}
    failed = [o for o in fuzz(wrong_conv_device, graphs=6, seed=1, out_dir=tmp_path, signatures=conv_only)
              if o.status == "failed"]
    float_convs = [o for o in failed if o.path]
    assert float_convs, "the perturbed float CONV_2D outputs went unnoticed"
    (record,) = load_records(float_convs[0].path)
    devices = {d.name: d for d in nnapi.get_devices()}
    assert run_record(record, devices["nnapi-reference"]).passed
    assert not run_record(record, devices[wrong_conv_device]).passed


def _chain(types: list[str], operand_type: str, values: list[float], name: str) -> dict:
    """A fuzz record: x -> types[0] -> types[1] -> ... on one tensor of ``values``."""
    def operand(label, lifetime, data=None):
        return {"name": label, "type": operand_type, "dimensions": [len(values)], "scale": 0.0, "zeroPoint": 0,
                "lifetime": lifetime, "channelQuant": None, "isIgnored": False, "data": data}

    operands = [operand("x", "SUBGRAPH_INPUT", values)]
    operations = []
    for position, operation_type in enumerate(types):
        last = position == len(types) - 1
        operands.append(operand(f"op{position}_output0", "SUBGRAPH_OUTPUT" if last else "TEMPORARY_VARIABLE"))
        operations.append({"type": operation_type, "inputs": [len(operands) - 2], "outputs": [len(operands) - 1]})
    return {"spec": "fuzz", "version": "fuzz", "test": name,
            "main": {"name": None, "operands": operands, "operations": operations, "inputIndexes": [0],
                     "outputIndexes": [len(operands) - 1]},
            "referenced": [], "isRelaxed": False, "expectFailure": False, "multinomialTolerance": 0.0,
            "minSupportedVersion": "V1_0"}


class _Rounding(IPreparedModel):
    """Moves every float output one unit in the last place up (a device that rounds
    differently, well within the CTS tolerance); with ``together``, adds 0.25 instead to
    the outputs of models of two operations or more (a planted bug of a fused lowering)."""

    def __init__(self, inner: IPreparedModel, model, together: bool) -> None:
        self.inner, self.model, self.together = inner, model, together

    def execute(self, request, measure_timing=False, deadline_ns=None, loop_timeout_ns=None):
        shapes, timing = self.inner.execute(request, measure_timing, deadline_ns, loop_timeout_ns)
        for argument, index in zip(request.outputs, self.model.main.output_indexes):
            dtype = {nnapi.OperandCode.TENSOR_FLOAT32: np.float32,
                     nnapi.OperandCode.TENSOR_FLOAT16: np.float16}.get(self.model.main.operands[index].type)
            if dtype is not None:
                location = argument.location
                values = np.frombuffer(request.pools[location.pool_index], dtype,
                                       location.length // np.dtype(dtype).itemsize, location.offset)
                if not self.together:
                    values[:] = np.nextafter(values, dtype(np.inf))
                elif len(self.model.main.operations) > 1:
                    values += dtype(0.25)
        return shapes, timing


class RoundingDevice(SampleDevice):
    def __init__(self, name, operations, together=False):
        super().__init__(name, operations)
        self.together = together

    def prepare_model(self, model, *args, **kwargs):
        return _Rounding(super().prepare_model(model, *args, **kwargs), model, self.together)


def test_fuzz_traces_a_difference_to_the_operation_that_fails_alone(tmp_path):
    from nnapi.conformance import load_records, run_record
    from nnapi.tools.fuzz import judge

    devices = {d.name: d for d in nnapi.get_devices()}
    record = _chain(["RELU", "RELU"], "TENSOR_FLOAT32", [-1.0, 0.5, 2.0], "relu_relu")
    outcome = judge(record, devices["nnapi-reference"], devices["nnapi-reference"], np.random.default_rng(0))
    assert outcome.status == "passed"
    with only_devices(WrongDevice("wrong-relu", [Op.RELU])):
        devices = {d.name: d for d in nnapi.get_devices()}
        outcome = judge(record, devices["wrong-relu"], devices["nnapi-reference"], np.random.default_rng(0),
                        tmp_path)
        assert outcome.status == "failed"
        # each RELU alone is 0.25 off (the second given the reference's [0, 0.5, 2])
        assert "operation #0 RELU alone" in outcome.message and "operation #1 RELU alone" in outcome.message
        assert outcome.path == str(tmp_path / "relu_relu_op0.jsonl")
        assert sorted(p.name for p in tmp_path.iterdir()) == ["relu_relu.jsonl", "relu_relu_op0.jsonl",
                                                               "relu_relu_op1.jsonl"]
        (single,) = load_records(outcome.path)
        assert [o["type"] for o in single["main"]["operations"]] == ["RELU"]
        assert run_record(single, devices["nnapi-reference"]).passed
        assert not run_record(single, devices["wrong-relu"]).passed
        (second,) = load_records(tmp_path / "relu_relu_op1.jsonl")
        assert second["main"]["operands"][0]["data"] == [0.0, 0.5, 2.0]  # the reference's first RELU


def test_fuzz_tells_an_ill_conditioned_graph_from_a_failure():
    from nnapi.tools.fuzz import judge

    # EXP of ~7 in float16 is ~1100, where one ulp is 0.5 radians of SIN: a device rounding
    # each output one ulp away moves SIN's results far past the tolerance, and so does the
    # reference's own chain when its floats move by one ulp
    steep = _chain(["EXP", "SIN"], "TENSOR_FLOAT16", [6.9, 7.0, 7.05, 7.1, 7.2, 7.25], "exp_sin")
    gentle = _chain(["EXP", "SIN"], "TENSOR_FLOAT16", [-2.0, -1.0, -0.5, 0.0, 0.25, 0.5], "exp_sin_gentle")
    with only_devices(RoundingDevice("rounding", [Op.EXP])):  # EXP's output leaves the device, rounded
        devices = {d.name: d for d in nnapi.get_devices()}
        outcome = judge(copy.deepcopy(steep), devices["rounding"], devices["nnapi-reference"],
                        np.random.default_rng(0))
        assert outcome.status == "ill-conditioned", outcome.message
        assert "every operation passes alone" in outcome.message and outcome.path is None
        outcome = judge(gentle, devices["rounding"], devices["nnapi-reference"], np.random.default_rng(0))
        assert outcome.status == "passed", outcome.message
    # a bug that shows only when the operations run together is a failure, never
    # ill-conditioned: the reference's own chain stays within tolerance for one-ulp moves
    sure = _chain(["RELU", "RELU"], "TENSOR_FLOAT32", [-1.0, 0.5, 2.0], "relu_relu_fused")
    with only_devices(RoundingDevice("fused-bug", [Op.RELU], together=True)):
        devices = {d.name: d for d in nnapi.get_devices()}
        outcome = judge(sure, devices["fused-bug"], devices["nnapi-reference"], np.random.default_rng(0))
        assert outcome.status == "failed"
        assert "every operation passes alone: they differ only together" in outcome.message


class ConstantAddDevice(WrongDevice):
    """Runs ADD only where its second operand is a constant, and gets it 0.25 wrong (a bug
    of a lowering specialized on constants)."""

    def _supports(self, model, subgraph, operation) -> bool:
        second = subgraph.operands[operation.inputs[1]]
        return (operation.type == Op.ADD and second.lifetime.name.startswith("CONSTANT")
                and super()._supports(model, subgraph, operation))


def test_fuzz_with_constants_reaches_a_lowering_of_constant_operands(tmp_path, signatures):
    """The CTS signatures' data inputs are run-time ones: a bug only in an ADD by a constant
    is out of reach until ``constants`` makes some of them constants; the operation that
    fails alone is then written with its constant, and still fails when replayed."""
    from nnapi.conformance import load_records, run_record

    adds = {"ADD": [r for r in signatures["ADD"] if r["main"]["operands"][0]["type"] == "TENSOR_FLOAT32"]}
    with only_devices(ConstantAddDevice("constant-add", [Op.ADD])):
        plain = list(fuzz("constant-add", graphs=12, seed=2, signatures=adds))
        assert [o.status for o in plain] == ["passed"] * 12
        outcomes = list(fuzz("constant-add", graphs=12, seed=2, signatures=adds, constants=0.5, out_dir=tmp_path))
        failed = [o for o in outcomes if o.status == "failed" and "alone" in o.message]
        assert failed, [o.message for o in outcomes]
        # the same graphs, some inputs constants: the graph of each number is the seed's own
        assert [o.operations for o in outcomes] == [o.operations for o in plain]
        (single,) = load_records(failed[0].path)
        operands = single["main"]["operands"]
        (add,) = single["main"]["operations"]
        assert operands[add["inputs"][1]]["lifetime"] == "CONSTANT_COPY"
        devices = {d.name: d for d in nnapi.get_devices()}
        assert not run_record(single, devices["constant-add"]).passed
        assert run_record(single, devices["nnapi-reference"]).passed


def test_fuzz_alone_keeps_an_input_when_every_input_is_a_constant():
    """An operation whose inputs all became constants is checked alone with its first data
    input given at run time (a model needs an input)."""
    from nnapi.tools.fuzz import alone

    record = _chain(["RELU", "EXP"], "TENSOR_FLOAT32", [-1.0, 0.5, 2.0], "relu_exp")
    record["main"]["operands"][0]["lifetime"] = "CONSTANT_COPY"
    record["main"]["inputIndexes"] = []
    single = alone(record, 0, {})
    assert single["main"]["inputIndexes"] == [0]
    assert single["main"]["operands"][0]["lifetime"] == "SUBGRAPH_INPUT"
    assert single["main"]["operands"][0]["data"] == [-1.0, 0.5, 2.0]


def _beside(first: dict, second: dict, name: str) -> dict:
    """Two fuzz records as one graph of two independent branches."""
    shift = len(first["main"]["operands"])
    moved = [{"type": op["type"], "inputs": [i + shift for i in op["inputs"]],
              "outputs": [i + shift for i in op["outputs"]]} for op in second["main"]["operations"]]
    main = {"name": None, "operands": first["main"]["operands"] + copy.deepcopy(second["main"]["operands"]),
            "operations": first["main"]["operations"] + moved,
            "inputIndexes": first["main"]["inputIndexes"] + [i + shift for i in second["main"]["inputIndexes"]],
            "outputIndexes": first["main"]["outputIndexes"] + [i + shift for i in second["main"]["outputIndexes"]]}
    return {**first, "test": name, "main": main}


def test_fuzz_judges_the_conditioning_of_the_outputs_that_differ_only():
    """A fused bug in a float branch stays a failure beside a quantized branch the device
    computes right: that branch's outputs move two steps when the reference's values move
    by one (its input, then its copy), which says nothing of the float difference (found
    triaging seed 5125 graph 371, whose float16 SIN was judged by a TRANSPOSE_CONV_2D's
    uint8 output)."""
    from nnapi.tools.fuzz import judge

    floats = _chain(["RELU", "RELU"], "TENSOR_FLOAT32", [-1.0, 0.5, 2.0], "floats")
    quantized = _chain(["RELU", "RELU"], "TENSOR_QUANT8_ASYMM", list(range(100, 140)), "quantized")
    for operand in quantized["main"]["operands"]:
        operand["scale"] = 0.5
    record = _beside(floats, quantized, "relu_relu_beside_quantized")
    with only_devices(RoundingDevice("fused-bug", [Op.RELU], together=True)):
        devices = {d.name: d for d in nnapi.get_devices()}
        outcome = judge(record, devices["fused-bug"], devices["nnapi-reference"], np.random.default_rng(0))
    assert outcome.status == "failed", outcome.message
    assert "op1_output0: 3/3 values differ" in outcome.message
    assert "every operation passes alone: they differ only together" in outcome.message


def test_fuzz_finds_the_near_tie_a_keypoint_flips_on():
    """tests/data/fuzz/heatmap_near_tie.jsonl (seed 5417 graph 9, on nnapi-ort-cpu): a
    float16 SIN into HEATMAP_MAX_KEYPOINT, whose maximum is a near tie that the device's
    roundings, each within tolerance, flip (keypoint 7 for 5). Three random one-step moves
    of the reference's values missed the flip and the graph was called a failure of
    operations together; the reference's own keypoint moves as far within the moves drawn."""
    from pathlib import Path

    from nnapi.conformance import load_records
    from nnapi.tools.fuzz import _ill_conditioned

    (record,) = load_records(Path(__file__).parent / "data" / "fuzz" / "heatmap_near_tie.jsonl")
    main = record["main"]
    (keypoint,) = [i for i in main["outputIndexes"] if main["operands"][i]["name"] == "op7_keypoint2"]
    reference = next(d for d in nnapi.get_devices() if d.name == "nnapi-reference")
    spread = _ill_conditioned(record, reference, np.random.default_rng([5417, 9]), [keypoint])
    assert spread is not None and spread.startswith("op7_keypoint2")


def test_fuzz_finds_no_failure_on_the_onnx_runtime_device(signatures):
    """Random chains of CTS signatures on nnapi-ort-cpu: every difference from the
    reference is ill-conditioned, never an operation or a fused lowering that fails
    (the graphs of these seeds include quantized SUBs into finer scales and float16
    EXP into SIN, which are)."""
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnx")
    from nnapi.drivers.ort import devices

    (device,) = [d for d in devices() if d.name == "nnapi-ort-cpu"]
    with only_devices(device):
        outcomes = [o for seed in (3601, 3607) for o in fuzz("nnapi-ort-cpu", graphs=150, seed=seed,
                                                              max_operations=6, signatures=signatures)]
    assert [o.message for o in outcomes if o.status == "failed"] == []
    assert sum(o.status == "passed" for o in outcomes) >= 290
    assert any(o.status == "ill-conditioned" for o in outcomes)


# --- commands -----------------------------------------------------------------------------
@pytest.fixture
def vector_file(tmp_path, signatures):
    """A float CONV_2D as a CTS vector file (how the tools read models without an importer)."""
    from nnapi.tools.fuzz import generate

    record = generate({"CONV_2D": [r for r in signatures["CONV_2D"]
                                   if r["main"]["operands"][0]["type"] == "TENSOR_FLOAT32"][:3]},
                      np.random.default_rng(0), max_operations=1, name="conv")
    main_graph = record["main"]
    for index in main_graph["outputIndexes"]:
        main_graph["operands"][index]["data"] = []
    path = tmp_path / "conv.jsonl"
    path.write_text(json.dumps(record) + "\n")
    return str(path)


def test_cli_dump_formats(vector_file, capsys, monkeypatch, reference_only):
    assert main(["dump", vector_file, "--format", "json"]) == 0
    graph = json.loads(capsys.readouterr().out)
    assert graph["subgraphs"][0]["operations"][0]["type"] == "CONV_2D"
    assert graph["subgraphs"][0]["operations"][0]["device"] == "nnapi-reference"
    assert main(["dump", vector_file]) == 0
    assert capsys.readouterr().out.startswith("digraph nnapi {")
    monkeypatch.setattr("shutil.which", lambda name: None)
    assert main(["dump", vector_file, "--format", "svg"]) == 2
    assert "needs Graphviz's `dot` program" in capsys.readouterr().err


def test_cli_placement_json(vector_file, capsys, conv_device):
    assert main(["placement", vector_file, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["operations"][0]["device"] in ("sample-conv", "nnapi-reference")
    assert report["partitions"] == 1


def test_cli_bisect_exit_codes(vector_file, capsys, wrong_conv_device):
    assert main(["bisect", vector_file, "--device", "nnapi-reference"]) == 0
    assert "agree with nnapi-reference" in capsys.readouterr().out
    assert main(["bisect", vector_file, "--device", wrong_conv_device, "--json"]) == 1
    result = json.loads(capsys.readouterr().out)
    assert result["first"]["operation_type"] == "CONV_2D"
    assert main(["bisect", vector_file, "--device", wrong_conv_device, "--tolerance", "x"]) == 2
    assert "--tolerance" in capsys.readouterr().err


def test_cli_fuzz_exit_codes(capsys, wrong_conv_device):
    assert main(["fuzz", "--device", "nnapi-reference", "--graphs", "5", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["passed"] >= 4
    assert main(["fuzz", "--device", "nope"]) == 2
    assert "no device named 'nope'" in capsys.readouterr().err
    assert main(["fuzz", "--device", "nnapi-reference", "--graphs", "0"]) == 2
    assert main(["fuzz", "--device", "nnapi-reference", "--constants", "1.5"]) == 2
    assert "--constants must be between 0 and 1" in capsys.readouterr().err
    assert main(["fuzz", "--device", "nnapi-reference", "--graphs", "5", "--constants", "0.5", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["passed"] >= 4


def test_cli_bad_model_files_give_one_line_errors(tmp_path, capsys):
    assert main(["placement", str(tmp_path / "missing.tflite")]) == 2
    assert capsys.readouterr().err.strip() == f"nnapi placement: {tmp_path / 'missing.tflite'}: no such file"
    bad = tmp_path / "bad.jsonl"
    bad.write_text("this is not json\n")
    assert main(["dump", str(bad)]) == 2
    assert capsys.readouterr().err.startswith(f"nnapi dump: {bad}:1: not a JSON record")


def _nnapi(*args, env=None, **kwargs):
    return subprocess.run([sys.executable, "-m", "nnapi", *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=120, **kwargs)


def test_python_dash_m_and_broken_pipe():
    pytest.importorskip("tflite")
    model = os.path.join(MODELS, "face_detection_short_range.tflite")  # a dump far larger than a pipe holds
    result = subprocess.run(f"set -o pipefail; {sys.executable} -m nnapi dump {model} --format json | head -c 1",
                            shell=True, executable="/bin/bash", capture_output=True, text=True, timeout=120)
    assert result.stdout == "{" and "Traceback" not in result.stderr and "Broken pipe" not in result.stderr
    usage = _nnapi("dump")
    assert usage.returncode == 2 and "usage: nnapi dump" in usage.stderr


# --- logging and tracing ------------------------------------------------------------------
def test_vlog_tags_parse_like_android():
    from nnapi.vlog import TAGS, parse_tags

    assert parse_tags("all") == list(TAGS) and parse_tags("1") == list(TAGS)
    assert parse_tags("compilation,execution bogus") == ["compilation", "execution"]
    assert parse_tags("") == []


def test_trace_records_nested_spans(tmp_path):
    from nnapi import tracing

    path = tmp_path / "trace.json"
    tracing.start(str(path))
    with tracing.span("outer", "test", step=1):
        with tracing.span("inner", "test"):
            pass
    events = tracing.stop()
    assert [event["name"] for event in events] == ["inner", "outer"]
    inner, outer = events
    assert outer["ts"] <= inner["ts"] and inner["ts"] + inner["dur"] <= outer["ts"] + outer["dur"]
    assert outer["args"] == {"step": 1} and outer["ph"] == "X"
    assert json.loads(path.read_text())["traceEvents"] == events
    with tracing.span("after", "test"):
        pass
    assert tracing.stop() == []  # nothing is recorded while tracing is off


def test_cli_json_reports_and_ops_validation(capsys):
    assert main(["devices", "--json"]) == 0
    devices = json.loads(capsys.readouterr().out)
    assert devices["devices"][0]["name"] == "nnapi-reference" and devices["runtime_feature_level"] >= 8
    assert main(["conformance", "--quiet", "--ops", "FLOOR", "--json"]) == 0
    table = json.loads(capsys.readouterr().out)
    assert table["failed"] == 0 and table["passed"] == table["operations"]["FLOOR"]["passed"] > 0
    assert main(["conformance", "--ops", "CONV2D,ADD"]) == 2
    assert "--ops: unknown operation CONV2D" in capsys.readouterr().err


def test_conformance_ops_lists_only_the_operations_asked_for(capsys):
    """--ops LOGISTIC selects vectors testing LOGISTIC, some of them with other operations
    (a LOGISTIC feeding a CONV_2D, ROI_ALIGN's ...): the table and the JSON list LOGISTIC
    alone, and a note names the others, which the totals count."""
    from nnapi.conformance import select_records, tested_operations

    records = select_records(operations=["LOGISTIC"])
    others = sorted({name for r in records for name in tested_operations(r)} - {"LOGISTIC"})
    mixed = sum(1 for r in records if set(tested_operations(r)) != {"LOGISTIC"})
    assert others and mixed  # what this test is about: vectors testing more than the one operation
    assert main(["conformance", "--quiet", "--ops", "LOGISTIC", "--device", "nnapi-reference"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[0] == "operation" and lines[1].split()[:2] == ["LOGISTIC", str(len(records))]
    assert lines[2].startswith(f"{len(records)} vectors: {len(records)} passed")
    assert lines[3] == f"({mixed} of these vectors also test {', '.join(others)}: counted in the totals, not listed)"
    assert len(lines) == 4
    assert main(["conformance", "--quiet", "--ops", "logistic", "--device", "nnapi-reference", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert list(report["operations"]) == ["LOGISTIC"] and report["also_tested"] == others
    assert report["operations"]["LOGISTIC"]["passed"] == report["vectors"] == len(records)


def test_reference_gives_its_validation_message_as_the_reason():
    from nnapi.drivers.reference import ReferenceDevice
    from nnapi.runtime.model_builder import build_hal_model

    hal_model, _ = build_hal_model(build_demo_model())
    conv = hal_model.main.operations[0]
    hal_model.main.operands[conv.inputs[2]].type = nnapi.OperandCode.TENSOR_INT32  # a float conv's bias
    reasons = ReferenceDevice().get_unsupported_reasons(hal_model)
    assert reasons[1:] == [None] * 6
    assert "CONV_2D" in reasons[0] and "TENSOR_INT32" in reasons[0]


# --- on real models (tests/data/models) ---------------------------------------------------


def test_tools_on_an_imported_model(capsys, conv_device):
    pytest.importorskip("tflite")
    path = os.path.join(MODELS, "lstm_1x20x40_128_while.tflite")
    assert main(["dump", path, "--format", "json"]) == 0
    graph = json.loads(capsys.readouterr().out)
    assert [s["name"] for s in graph["subgraphs"]] == ["main"]  # its Keras LSTM loop: one sequence LSTM
    names = [o.get("name") for o in graph["subgraphs"][0]["operands"] if o["lifetime"] == "SUBGRAPH_INPUT"]
    assert any(name and "serving_default" in name for name in names)  # the TFLite tensor names
    assert main(["placement", os.path.join(MODELS, "face_detection_short_range.tflite"), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    convs = [entry for entry in report["operations"] if entry["type"] == "CONV_2D"]
    assert convs and {entry["device"] for entry in convs} == {"sample-conv"}
    assert all(entry["source"].startswith("operator ") for entry in report["operations"])
    assert report["partitions"] > 1 and report["bytes_between_devices"] > 0
    refused = next(entry for entry in report["operations"] if entry["type"] != "CONV_2D")
    assert refused["refused"] == {"sample-conv": "declined by the driver"}


def test_bisect_on_an_imported_model(wrong_conv_device):
    pytest.importorskip("tflite")
    from nnapi.cli._common import load_model

    loaded = load_model(os.path.join(MODELS, "face_detection_short_range.tflite"))
    result = bisect(loaded.model, wrong_conv_device)
    assert result.first.operation_type == "CONV_2D" and result.first.device == "wrong-conv"
    assert result.first.inherited_difference == 0.0
    assert loaded.source_ops[result.first.operation].endswith("(CONV_2D)")


def test_svg_through_graphviz(tmp_path):
    import shutil

    if shutil.which("dot") is None:
        pytest.skip("Graphviz's dot is not installed")
    out = tmp_path / "demo.svg"
    from nnapi.tools.graph_dump import render_svg

    out.write_text(render_svg(graph_dump(build_demo_model(), format="dot")))
    assert out.read_text().lstrip().startswith(("<?xml", "<svg")) and "CONV_2D" in out.read_text()


def test_placement_gives_feature_level_and_prepare_failure_reasons(signatures):
    from nnapi.codes import FeatureLevelCode
    from nnapi.conformance import build_model
    from nnapi.drivers.sample import FaultyDevice

    record = next(r for r in signatures["CONV_2D"]
                  if r["main"]["operands"][r["main"]["inputIndexes"][0]]["type"] == "TENSOR_FLOAT16")
    keep: list = []
    model = build_model(record, keep=keep)
    old = FaultyDevice("old-device", supported={Op.CONV_2D}, feature_level=FeatureLevelCode.FEATURE_LEVEL_2)
    with only_devices(old, FaultyDevice("broken-device", supported={Op.CONV_2D}, fail_prepare=True)):
        compilation = nnapi.Compilation(model)  # no explicit devices: CPU fallback applies
        compilation.finish()
        report = compilation.placement()
    (conv,) = report["operations"]
    assert conv["device"] == "nnapi-reference"  # the CPU fallback took the failed step
    assert conv["refused"]["old-device"] == "needs FEATURE_LEVEL_3; the device has FEATURE_LEVEL_2"
    assert conv["refused"]["broken-device"].startswith("failed to prepare: ")


FAULTY_PLUGIN = '''
from nnapi import OperationCode
from nnapi.drivers.sample import FaultyDevice

def faulty():  # faster than any other device (nnapi-ort-cpu included), so it takes CONV_2D and ADD
    return FaultyDevice("faulty", supported={OperationCode.CONV_2D, OperationCode.ADD}, wrong_results=True,
                        exec_time=1e-6)
'''


def test_a_faulty_driver_loaded_with_driver_is_caught_by_placement_bisect_and_fuzz(tmp_path):
    pytest.importorskip("tflite")
    (tmp_path / "faulty_plugin.py").write_text(FAULTY_PLUGIN)
    env = {"PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    model = os.path.join(MODELS, "face_detection_short_range.tflite")
    placed = _nnapi("placement", model, "--driver", "faulty_plugin:faulty", "--json", env=env)
    assert placed.returncode == 0, placed.stderr
    report = json.loads(placed.stdout)
    assert {e["device"] for e in report["operations"] if e["type"] in ("CONV_2D", "ADD")} == {"faulty"}
    found = _nnapi("bisect", model, "--driver", "faulty_plugin:faulty", "--device", "faulty", env=env)
    assert found.returncode == 1, found.stderr
    assert "first difference at operation #0 CONV_2D (ran on faulty)" in found.stdout
    fuzzed = _nnapi("fuzz", "--driver", "faulty_plugin:faulty", "--device", "faulty", "--graphs", "40",
                    "--out", str(tmp_path / "failures"), env=env)
    assert fuzzed.returncode == 1, fuzzed.stderr
    written = sorted((tmp_path / "failures").glob("*.jsonl"))
    assert written
    # replayed as it ran: the faulty device beside the reference (which takes what it refuses)
    replay = _nnapi("conformance", str(written[0]), "--driver", "faulty_plugin:faulty", "--quiet", env=env)
    assert replay.returncode == 1 and "1 failed" in replay.stdout, replay.stdout


def test_nnapi_vlog_and_trace_from_the_environment(tmp_path, vector_file):
    trace = tmp_path / "trace.json"
    result = _nnapi("bisect", vector_file, "--device", "nnapi-reference",
                    env={"NNAPI_VLOG": "compilation,model", "NNAPI_TRACE": str(trace)})
    assert result.returncode == 0, result.stderr
    assert "nnapi.compilation: partitioned 1 operations into 1 steps: nnapi-reference[0]" in result.stderr
    assert "nnapi.model: finished:" in result.stderr and "nnapi.execution" not in result.stderr
    events = json.loads(trace.read_text())["traceEvents"]
    categories = {event["cat"] for event in events}
    assert {"compilation", "driver", "execution"} <= categories
    assert all(event["ph"] == "X" and event["dur"] >= 0 for event in events)


def test_trace_option_on_a_command(tmp_path, vector_file, capsys):
    trace = tmp_path / "run.json"
    assert main(["placement", vector_file, "--trace", str(trace)]) == 0
    names = [event["name"] for event in json.loads(trace.read_text())["traceEvents"]]
    assert "finish" in names and "prepare" in names


def test_per_operation_profile_and_bench_per_op(capsys):
    pytest.importorskip("tflite")
    from nnapi.tools.profile import profile

    session = nnapi.Session(os.path.join(MODELS, "hand_recrop.tflite"), "nnapi-reference")  # records operations
    feeds = {spec.name: np.zeros(spec.shape, spec.dtype) for spec in session.inputs}
    rows = profile(lambda: session.run(feeds), iterations=3)
    imported = nnapi.load_tflite(os.path.join(MODELS, "hand_recrop.tflite"))
    histogram = imported.operation_histogram()
    assert sum(row["calls"] for row in rows) == 3 * sum(histogram.values())  # every operation, every run
    assert {row["operation"] for row in rows} == set(histogram)
    assert abs(sum(row["share"] for row in rows) - 1.0) < 1e-9
    assert rows == sorted(rows, key=lambda row: -row["total_us"])
    assert main(["bench", os.path.join(MODELS, "hand_recrop.tflite"), "--iterations", "2", "--warmup", "0",
                 "--no-litert", "--per-op", "--device", "nnapi-reference"]) == 0
    printed = capsys.readouterr().out
    assert "per operation (slowest" in printed and "CONV_2D" in printed


def test_extension_operation_types_are_named_not_crashed_on():
    from nnapi.drivers.reference import ReferenceDevice
    from nnapi.runtime.model_builder import build_hal_model

    hal_model, _ = build_hal_model(build_demo_model())
    hal_model.main.operations[1].type = (3 << 16) | 7  # an extension operation with prefix 3
    reasons = ReferenceDevice().get_unsupported_reasons(hal_model)
    assert "supports no extensions" in reasons[1] and reasons[0] is None
    with pytest.raises(nnapi.hal.HalError) as raised:
        ReferenceDevice().prepare_model(hal_model)
    assert raised.value.status == nnapi.hal.ErrorStatus.INVALID_ARGUMENT
    graph = graph_dump(build_demo_model())
    assert graph["subgraphs"][0]["operations"][1]["type"] == "MAX_POOL_2D"
    from nnapi.hal.types import operand_type_name, operation_name

    assert operation_name((3 << 16) | 7) == "extension operation 7 (prefix 3)"
    assert operand_type_name(999) == "unknown operand type 999" and operation_name(0) == "ADD"


def test_conformance_reports_declined_vectors_not_failures(capsys):
    from nnapi.conformance import run_conformance, select_records

    register_device(SampleDevice("conv-only", [Op.CONV_2D]))
    try:
        device = next(d for d in nnapi.get_devices() if d.name == "conv-only")
        records = [r for r in select_records(operations=["CONV_2D"]) if len(r["main"]["operations"]) == 1][:5]
        records += [r for r in select_records(operations=["FLOOR"]) if len(r["main"]["operations"]) == 1][:5]
        report = run_conformance(device, records=records)
        floors = [o for o in report.outcomes if o.operations == ("FLOOR",)]
        assert floors and all(o.declined and "declined" in o.message for o in floors)
        assert report.failed == 0 and report.declined == len(floors) and report.passed == len(records) - len(floors)
        assert main(["conformance", "--quiet", "--ops", "FLOOR", "--device", "conv-only"]) == 0
        printed = capsys.readouterr().out
        floor_row = next(line for line in printed.splitlines() if line.startswith("FLOOR "))
        assert floor_row.split()[1:4] == ["0", "0", floor_row.split()[3]] and int(floor_row.split()[3]) > 0
    finally:
        unregister_device("conv-only")
