"""The model commands: nnapi run / inspect / bench / compare, through nnapi.cli.main."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("tflite")

import nnapi  # noqa: E402
from helpers import only_devices  # noqa: E402
from nnapi.cli import main  # noqa: E402

MODELS = Path(__file__).parent / "data" / "models"
LSTM = str(MODELS / "lstm_1x20x40_128_fused.tflite")
LSTM_INPUT = "serving_default_input_1:0"


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def assert_one_line_error(code: int, err: str, message: str) -> None:
    assert code != 0
    lines = [line for line in err.splitlines() if line.strip() and not line.startswith("INFO:")]
    assert len(lines) == 1, err
    assert message in lines[0]
    assert "Traceback" not in err
    assert "Error: " not in lines[0], "an exception's class name instead of a user message"


def test_run_without_a_model_runs_the_builtin_one(capsys) -> None:
    code, out, _ = run_cli(capsys, "run")
    assert code == 0
    assert "built-in model: MediaPipe hand re-crop" in out
    assert "input  input_1: float32[1,256,256,3]  <- random (seed 0)" in out
    assert "output output_crop: float32[1, 1, 1, 4]" in out


def test_builtin_model_is_the_tested_one() -> None:
    from nnapi.cli._model import builtin_model_path

    assert Path(builtin_model_path()).read_bytes() == (MODELS / "hand_recrop.tflite").read_bytes()


def test_run_with_an_input_file_matches_the_session(tmp_path: Path, capsys) -> None:
    x = np.random.default_rng(5).standard_normal((1, 20, 40)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    code, out, _ = run_cli(capsys, "run", LSTM, "--input", f"{LSTM_INPUT}={tmp_path / 'x.npy'}", "--json",
                           "--save", str(tmp_path / "y.npz"))
    assert code == 0
    report = json.loads(out)
    assert report["inputs"][LSTM_INPUT]["from"] == str(tmp_path / "x.npy")
    session = nnapi.Session(LSTM)
    expected = session.run({LSTM_INPUT: x})
    saved = np.load(tmp_path / "y.npz")
    for name, value in expected.items():
        np.testing.assert_array_equal(saved[name], value)
        assert report["outputs"][name]["shape"] == list(value.shape)
        assert report["outputs"][name]["max"] == pytest.approx(float(value.max()))


def test_run_takes_inputs_from_an_npz_by_name(tmp_path: Path, capsys) -> None:
    x = np.random.default_rng(6).standard_normal((1, 20, 40)).astype(np.float32)
    np.savez(tmp_path / "inputs.npz", **{LSTM_INPUT: x})
    code, out, _ = run_cli(capsys, "run", LSTM, "--input", str(tmp_path / "inputs.npz"), "--json")
    assert code == 0
    report = json.loads(out)
    assert report["inputs"][LSTM_INPUT]["from"] == f"{tmp_path / 'inputs.npz'}[{LSTM_INPUT}]"
    expected = nnapi.Session(LSTM).run({LSTM_INPUT: x})
    for name, value in expected.items():
        assert report["outputs"][name]["max"] == pytest.approx(float(value.max()))
    np.savez(tmp_path / "wrong.npz", image=x)
    code, _, err = run_cli(capsys, "run", LSTM, "--input", str(tmp_path / "wrong.npz"))
    assert_one_line_error(code, err, "the model has no input 'image'")


@pytest.mark.parametrize("array, message", [
    (np.zeros((1, 20, 40), np.float64), "expected dtype float32, got float64"),
    (np.zeros((1, 20, 41), np.float32), "expected shape [1, 20, 40], got [1, 20, 41]"),
])
def test_run_rejects_a_wrong_input_file(tmp_path: Path, capsys, array: np.ndarray, message: str) -> None:
    np.save(tmp_path / "x.npy", array)
    code, _, err = run_cli(capsys, "run", LSTM, "--input", f"{LSTM_INPUT}={tmp_path / 'x.npy'}")
    assert_one_line_error(code, err, message)


@pytest.mark.parametrize("argv, message", [
    (["run", "/nonexistent/model.tflite"], "/nonexistent/model.tflite: no such file"),
    (["inspect", "/nonexistent/model.tflite"], "no such file"),
    (["bench", "/nonexistent/model.tflite"], "no such file"),
    (["compare", "/nonexistent/model.tflite"], "no such file"),
    (["run", str(MODELS)], "not a file"),
    (["run", str(MODELS / "README.md")], "not a model nnapi can import"),
    (["dump", str(MODELS / "README.md")], "not a model nnapi can import"),
    (["placement", str(MODELS / "README.md")], "not a model nnapi can import"),
    (["dump", "/nonexistent/model.tflite"], "/nonexistent/model.tflite: no such file"),
    (["run", LSTM, "--input", "nope=x.npy"], "the model has no input 'nope'"),
    (["run", LSTM, "--input", f"{LSTM_INPUT}=/nonexistent.npy"], "/nonexistent.npy: no such file"),
    (["run", LSTM, "--input", f"{LSTM_INPUT}={MODELS / 'README.md'}"], "not a .npy array"),
])
def test_bad_arguments_give_one_line_errors(capsys, argv: list[str], message: str) -> None:
    code, _, err = run_cli(capsys, *argv)
    assert_one_line_error(code, err, message)


def test_a_custom_operator_without_nnapi_meaning_is_a_one_line_error(capsys, tmp_path: Path) -> None:
    from tflite_cases import custom_landmarks_to_matrix

    path = tmp_path / "landmarks.tflite"
    path.write_bytes(custom_landmarks_to_matrix())
    code, _, err = run_cli(capsys, "run", str(path))
    assert_one_line_error(code, err, "operator 0 (CUSTOM Landmarks2TransformMatrix): custom operator")


def test_inspect_lists_histogram_lowerings_and_devices(capsys) -> None:
    with only_devices():  # nnapi-reference alone (test_driver_ort checks the listing with nnapi-ort-cpu)
        code, out, _ = run_cli(capsys, "inspect", str(MODELS / "face_detection_short_range.tflite"))
    assert code == 0
    assert "164 operators in 1 subgraph -> 90 NNAPI operations" in out
    assert "output classificators: TENSOR_FLOAT32[1,896,1]" in out
    assert "CONV_2D            21" in out
    assert "74 x DEQUANTIZE -> constant" in out
    assert "nnapi-reference: 90 operations" in out


def test_inspect_json_names_each_operation_source(capsys) -> None:
    code, out, _ = run_cli(capsys, "inspect", str(MODELS / "lstm_1x20x40_128_while.tflite"), "--json")
    assert code == 0
    report = json.loads(out)
    assert report["subgraphs"] == 1  # the Keras LSTM's WHILE is one UNIDIRECTIONAL_SEQUENCE_LSTM
    assert [entry["type"] for entry in report["placement"]] == [
        "RESHAPE", "UNIDIRECTIONAL_SEQUENCE_LSTM", "SLICE", "STRIDED_SLICE"]
    assert report["placement"][1]["source"] == "operator 1 (WHILE)"
    assert any("Keras 3's LSTM loop" in lowering["what"] for lowering in report["lowerings"])


def test_keep_loops_imports_the_keras_lstm_loop_as_written(capsys) -> None:
    """--keep-loops (every command that loads a model): the WHILE with its condition and
    body models, as the file has it, and the same outputs as the fused import's."""
    path = str(MODELS / "lstm_1x20x40_128_while.tflite")
    code, out, _ = run_cli(capsys, "inspect", path, "--json", "--keep-loops")
    assert code == 0
    report = json.loads(out)
    assert report["subgraphs"] == 3
    assert [entry["type"] for entry in report["placement"]] == ["RESHAPE", "WHILE", "STRIDED_SLICE"]
    looped = nnapi.load_model(path, keep_loops=True)
    fused = nnapi.load_model(path)
    reference = [device for device in nnapi.get_devices() if device.name == "nnapi-reference"]
    a, b = nnapi.Session(looped, reference), nnapi.Session(fused, reference)
    inputs = {info.name: np.random.default_rng(3).standard_normal(info.shape).astype(info.dtype) for info in a.inputs}
    got, expected = a.run(inputs), b.run(inputs)
    assert got.keys() == expected.keys()
    for name, value in got.items():
        np.testing.assert_allclose(value, expected[name], rtol=1e-5, atol=1e-6)


def test_bench_reports_statistics_and_litert(capsys) -> None:
    code, out, _ = run_cli(capsys, "bench", LSTM, "--iterations", "3", "--warmup", "1", "--json")
    assert code == 0
    report = json.loads(out)
    stats = report["nnapi"]
    assert stats["runs"] == 3
    assert stats["min_ms"] <= stats["p5_ms"] <= stats["median_ms"] <= stats["p95_ms"]
    assert report["compile_ms"] > 0
    try:
        import ai_edge_litert  # noqa: F401
    except ImportError:
        assert report["litert"] is None
    else:
        assert report["litert"]["runs"] == 3
        assert report["ratio_mean"] == pytest.approx(stats["mean_ms"] / report["litert"]["mean_ms"])


def test_bench_each_device_times_every_device_alone_and_says_why_one_cannot(capsys) -> None:
    from nnapi.drivers.sample import FaultyDevice

    # A device that supports only ADD cannot run the LSTM model alone: its row names the reason.
    add_only = FaultyDevice("add-only", supported={nnapi.OperationCode.ADD})
    with only_devices(add_only):
        code, out, _ = run_cli(capsys, "bench", LSTM, "--iterations", "2", "--warmup", "0",
                               "--each-device", "--no-litert", "--json")
    assert code == 0
    report = json.loads(out)
    assert set(report["per_device"]) == {"nnapi-reference", "add-only"}
    reference = report["per_device"]["nnapi-reference"]
    assert reference["runs"] == 2 and reference["min_ms"] <= reference["median_ms"]
    assert "cannot run the whole model" in report["per_device"]["add-only"]["error"]
    assert "UNIDIRECTIONAL_SEQUENCE_LSTM" in report["per_device"]["add-only"]["error"]
    assert report["litert_builtin"] is None

    with only_devices(add_only):
        code, out, _ = run_cli(capsys, "bench", LSTM, "--iterations", "2", "--warmup", "0",
                               "--each-device", "--device", "nnapi-reference")
    assert code == 0
    rows = out.split("each device alone")[1].splitlines()
    assert any(row.strip().startswith("nnapi-reference") and "ms" in row for row in rows)
    assert not any("add-only" in row for row in rows)


def test_bench_of_a_model_only_litert_xnnpack_runs_says_so_for_the_builtin_kernels(capsys) -> None:
    """selfie_segmentation's custom operator is in LiteRT's XNNPACK delegate only: bench
    times XNNPACK and reports why the builtin kernels have no figure (it used to stop)."""
    pytest.importorskip("ai_edge_litert")
    with only_devices():
        code, out, _ = run_cli(capsys, "bench", str(MODELS / "selfie_segmentation.tflite"), "--iterations", "1",
                               "--warmup", "0", "--each-device", "--json")
    assert code == 0
    report = json.loads(out)
    assert report["litert"]["runs"] == 1 and report["litert_builtin"] is None
    assert "Convolution2DTransposeBias" in report["litert_builtin_error"]
    assert report["per_device"]["nnapi-reference"]["runs"] == 1


def test_bench_pins_blas_to_litert_thread_count_for_the_command_only(capsys) -> None:
    threadpoolctl = pytest.importorskip("threadpoolctl")
    before = [entry["num_threads"] for entry in threadpoolctl.threadpool_info() if entry["user_api"] == "blas"]
    code, out, _ = run_cli(capsys, "bench", LSTM, "--iterations", "1", "--warmup", "0", "--no-litert",
                           "--threads", "1", "--json")
    assert code == 0
    report = json.loads(out)
    assert report["threads"] == 1 and report["blas"] == "1 thread (threadpoolctl)"
    after = [entry["num_threads"] for entry in threadpoolctl.threadpool_info() if entry["user_api"] == "blas"]
    assert after == before  # restored: the limit is the command's, not the process's


def test_bench_says_when_blas_is_not_pinned(capsys, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "threadpoolctl", None)  # as if it were not installed
    for variable in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "BLIS_NUM_THREADS"):
        monkeypatch.delenv(variable, raising=False)
    code, out, _ = run_cli(capsys, "bench", LSTM, "--iterations", "1", "--warmup", "0", "--no-litert")
    assert code == 0
    assert "BLAS (numpy, under nnapi-reference): not pinned to 1 thread: install threadpoolctl" in out
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "2")
    code, out, _ = run_cli(capsys, "bench", LSTM, "--iterations", "1", "--warmup", "0", "--no-litert",
                           "--threads", "2", "--json")
    assert json.loads(out)["blas"] == "2 threads (OPENBLAS_NUM_THREADS)"


def test_bench_says_how_quantized_products_run(capsys, monkeypatch) -> None:
    """The report names nnapi-reference's quantized product path: the integer multiply-add
    where nnapi[fast] has a kernel for this processor, else BLAS's float products and why."""
    from nnapi.operations import _jit

    form = _jit.integer_products()
    expected = (f"int32 sums on the processor's 16-bit multiply-add (nnapi[fast], {form.name})" if form is not None
                else "float products through numpy's BLAS")
    code, out, _ = run_cli(capsys, "bench", LSTM, "--iterations", "1", "--warmup", "0", "--no-litert")
    assert code == 0 and f"quantized products (nnapi-reference): {expected}" in out
    monkeypatch.setenv(_jit.DISABLE_VARIABLE, "1")
    code, out, _ = run_cli(capsys, "bench", LSTM, "--iterations", "1", "--warmup", "0", "--no-litert", "--json")
    assert json.loads(out)["quantized_products"] == \
        "float products through numpy's BLAS (exact integers; nnapi[fast] not in use)"


def test_bench_rejects_bad_counts(capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", LSTM, "--iterations", "0"])
    assert exit_info.value.code == 2
    assert "expected a positive integer" in capsys.readouterr().err


def test_compare_agrees_with_litert(capsys) -> None:
    pytest.importorskip("ai_edge_litert")
    code, out, _ = run_cli(capsys, "compare", str(MODELS / "hand_recrop.tflite"), "--json")
    assert code == 0
    report = json.loads(out)
    entry = report["outputs"]["output_crop"]
    assert entry["ok"] and entry["max_rel"] <= 1e-5
    code, out, _ = run_cli(capsys, "compare", LSTM, "--runs", "2")
    assert code == 0 and "agree" in out


def test_compare_names_a_hybrid_model_and_why_it_differs(capsys, tmp_path) -> None:
    """A dynamic-range FULLY_CONNECTED: LiteRT quantizes its input on the fly, nnapi computes
    in float32; the report names the hybrid operator and says why the outputs differ."""
    pytest.importorskip("ai_edge_litert")
    from tflite_cases import conv_uint8_valid, hybrid_fully_connected

    path = tmp_path / "hybrid.tflite"
    path.write_bytes(hybrid_fully_connected())
    code, out, _ = run_cli(capsys, "compare", str(path), "--json")
    report = json.loads(out)
    assert code == 0 and report["ok"]
    assert report["hybrid_operators"] == ["operator 0 (FULLY_CONNECTED)"]
    assert report["outputs"]["y"]["max_rel"] > 1e-5, "LiteRT's on-the-fly int8 input should differ from float32"
    code, out, _ = run_cli(capsys, "compare", str(path))
    assert code == 0 and "1 operator (operator 0 (FULLY_CONNECTED)) holds int8 weights" in out
    path.write_bytes(conv_uint8_valid())  # fully quantized: not hybrid
    code, out, _ = run_cli(capsys, "compare", str(path), "--json")
    assert json.loads(out)["hybrid_operators"] == [] and "dynamic-range" not in out


def test_compare_judges_hybrid_float_outputs_by_the_hybrid_tolerance() -> None:
    from nnapi.cli.compare import _judge

    # 1e-2 from both LiteRT runs, which agree with each other (a hybrid LSTM XNNPACK leaves
    # to the builtin kernels): outside 1e-5, inside a hybrid tolerance of 5e-2 only.
    entry = {"max_rel": 1e-2, "max_abs": 1e-2, "builtin_difference": 1e-2, "litert_own_difference": 1e-7}
    _judge(entry, True, 1e-5, 2, None)
    assert not entry["ok"] and "hybrid_tolerance" not in entry
    _judge(entry, True, 1e-5, 2, 5e-2)
    assert entry["ok"] and entry["hybrid_tolerance"]
    entry = dict(entry, hybrid_tolerance=False)
    _judge(entry, True, 1e-5, 2, 5e-3)
    assert not entry["ok"]
    within = {"max_rel": 1e-6, "max_abs": 1e-6}
    _judge(within, True, 1e-5, 2, 5e-2)  # within the float tolerance: not the hybrid one
    assert within["ok"] and "hybrid_tolerance" not in within
    steps = {"max_steps": 5, "builtin_difference": 5.0, "litert_own_difference": 0.0}
    _judge(steps, False, 1e-5, 2, 5e-2)  # a quantized output keeps the steps
    assert not steps["ok"]


def test_compare_without_litert_says_how_to_get_it(capsys, monkeypatch) -> None:
    import nnapi.cli.compare as compare

    monkeypatch.setattr(compare, "litert_interpreter", lambda path, **options: None)
    code, _, err = run_cli(capsys, "compare", LSTM)
    assert_one_line_error(code, err, "pip install 'nnapi[litert]'")


def test_compare_outputs_measures_steps_and_top1() -> None:
    from nnapi.cli.compare import compare_outputs

    theirs = np.zeros((1, 12), np.int8)
    theirs[0, 3] = 50
    ours = theirs.copy()
    ours[0, 5] = 2
    entry = compare_outputs(ours, theirs, quantized=True)
    assert entry["max_steps"] == 2 and entry["top1_equal"] and entry["top5_overlap"] <= 5
    ours[0, 7] = 60
    assert not compare_outputs(ours, theirs, quantized=True)["top1_equal"]
    floats = compare_outputs(np.array([1.0, 2.0], np.float32), np.array([1.0, 4.0], np.float32), quantized=False)
    assert floats["max_abs"] == 2.0 and floats["max_rel"] == 0.5


def test_compare_verdict_uses_litert_own_disagreement() -> None:
    from nnapi.cli.compare import _merge, _verdict

    # 3 steps from XNNPACK, 1 from the builtin kernels, which are 3 apart themselves: agree.
    entry = {"max_steps": 3, "builtin_difference": 1.0, "litert_own_difference": 3.0, "top1_equal": True,
             "top5_overlap": 5}
    assert _verdict(entry, False, 1e-5, 2)
    # 3 steps from both, LiteRT agreeing with itself: outside the tolerance.
    assert not _verdict(dict(entry, builtin_difference=3.0, litert_own_difference=0.0), False, 1e-5, 2)
    # top-1 must agree whatever the steps; the worst run decides.
    merged = _merge(entry, dict(entry, max_steps=0, top1_equal=False, top5_overlap=4))
    assert merged["max_steps"] == 3 and merged["top5_overlap"] == 4 and not _verdict(merged, False, 1e-5, 2)
    assert _verdict({"max_rel": 2e-6, "max_abs": 1e-4}, True, 1e-5, 2)
    assert not _verdict({"error": "shape [2] vs LiteRT's [3]"}, True, 1e-5, 2)


def test_compare_top1_may_equal_either_litert_result() -> None:
    """Where LiteRT's XNNPACK and builtin kernels rank a near tie differently, a top-1
    equal to the builtin kernels' agrees (mobilebert int8: ours and builtin 68, XNNPACK
    119); one differing from both does not, and every run must match one of them."""
    from nnapi.cli.compare import _merge, _verdict

    split = {"max_steps": 9, "builtin_difference": 9.0, "litert_own_difference": 9.0, "top1_equal": False,
             "builtin_top1_equal": True, "top1_either": True, "top5_overlap": 5}
    assert _verdict(split, False, 1e-5, 2)
    assert not _verdict(dict(split, builtin_top1_equal=False, top1_either=False), False, 1e-5, 2)
    # an entry from before the builtin kernels ran (no top1_either) keeps XNNPACK's alone
    assert not _verdict({k: v for k, v in split.items() if k not in ("builtin_top1_equal", "top1_either")},
                        False, 1e-5, 2)
    merged = _merge(split, dict(split, top1_equal=True, builtin_top1_equal=False, top1_either=True))
    assert merged["top1_either"] and not merged["top1_equal"] and not merged["builtin_top1_equal"]
    assert _verdict(merged, False, 1e-5, 2)
    assert not _verdict(_merge(split, dict(split, builtin_top1_equal=False, top1_either=False)), False, 1e-5, 2)


def test_compare_detections_pairs_equal_scores_in_any_order() -> None:
    """Detections compared as sets: equal scores listed in another order pair up; a moved
    box or a missing detection does not; engines parting at one score (each kept another
    detection of it) are counted apart."""
    from nnapi.cli.compare import _detections_verdict, compare_detections

    names = ("boxes", "classes", "scores", "count")
    boxes = np.array([[[0, 0, 1, 1], [2, 2, 3, 3], [4, 4, 5, 5], [0, 0, 0, 0]]], np.float32)
    theirs = {"boxes": boxes, "classes": np.array([[1, 2, 1, 0]], np.float32),
              "scores": np.array([[0.9, 0.5, 0.5, 0]], np.float32), "count": np.array([3], np.float32)}
    swapped = {key: value.copy() for key, value in theirs.items()}
    for key in ("boxes", "classes", "scores"):
        swapped[key][0, [1, 2]] = theirs[key][0, [2, 1]]
    found = compare_detections(swapped, theirs, names)
    assert found == {"detections": 3, "unpaired": 0, "after_equal_scores": 0, "counts_differ": 0,
                     "max_rel_box": 0.0, "max_rel_score": 0.0}
    assert _detections_verdict({"xnnpack": found}, 1e-5)
    moved = {key: value.copy() for key, value in theirs.items()}
    moved["boxes"][0, 0] += 0.01
    found = compare_detections(moved, theirs, names)
    assert found["unpaired"] == 0 and found["max_rel_box"] == pytest.approx(0.002)
    assert not _detections_verdict({"xnnpack": found}, 1e-5)
    moved["boxes"][0, 0] += 0.5
    found = compare_detections(moved, theirs, names)
    assert found["unpaired"] == 1 and not _detections_verdict({"xnnpack": found}, 1e-5)
    short = dict(theirs, count=np.array([2], np.float32))
    found = compare_detections(short, theirs, names)
    assert found["counts_differ"] == 1 and found["unpaired"] == 1 and not _detections_verdict({"xnnpack": found}, 1e-5)
    other = {key: value.copy() for key, value in theirs.items()}
    other["boxes"][0, 2] = [6, 6, 7, 7]  # another detection of the shared score 0.5 kept instead
    found = compare_detections(other, theirs, names)
    assert found["unpaired"] == 0 and found["after_equal_scores"] == 1 and _detections_verdict({"xnnpack": found}, 1e-5)
    other["scores"][0, 2] = 0.4  # parting at 0.5 on LiteRT's side only: not the equal-score order
    found = compare_detections(other, theirs, names)
    assert found["unpaired"] == 1 and not _detections_verdict({"xnnpack": found}, 1e-5)


@pytest.mark.parametrize("quantized", [False, True])
def test_compare_judges_a_detection_models_outputs_as_detections(capsys, tmp_path, quantized) -> None:
    """TFLite_Detection_PostProcess's four outputs are judged together as detections."""
    pytest.importorskip("ai_edge_litert")
    from tflite_cases import detection_postprocess

    path = tmp_path / "ssd.tflite"
    path.write_bytes(detection_postprocess(quantized=quantized)())
    assert nnapi.load_tflite(str(path)).detections == [
        ("detection_boxes", "detection_classes", "detection_scores", "num_detections")]
    code, out, _ = run_cli(capsys, "compare", str(path), "--runs", "3", "--json")
    report = json.loads(out)
    assert code == 0 and report["ok"]
    found = report["outputs"]["detection_scores"]["detections"]["xnnpack"]
    assert found["detections"] >= 6 and found["unpaired"] == 0 and found["counts_differ"] == 0
    code, out, _ = run_cli(capsys, "compare", str(path))
    assert code == 0 and "detections detection_boxes, detection_classes, detection_scores, num_detections:" in out


def test_every_way_to_name_a_device_says_the_same_when_none_has_the_name(capsys, monkeypatch) -> None:
    """nnapi run --device, Session(devices=...) and the tools (compare's device) name the
    missing device, list the devices there are, and, for an ONNX Runtime device whose
    dependency is missing, say what to install: one message, built in one place."""
    from nnapi.drivers import ort
    from nnapi.tools._models import device_and_reference

    if any(d.name == "nnapi-ort-cuda" for d in nnapi.get_devices()):
        pytest.skip("this machine has the device")
    monkeypatch.setattr(ort, "missing_dependency", lambda: "the ONNX Runtime devices need onnxruntime (pip ...)")
    names = ", ".join(d.name for d in nnapi.get_devices())
    expected = f"no device named 'nnapi-ort-cuda' (devices: {names}); the ONNX Runtime devices need onnxruntime"
    code, _, err = run_cli(capsys, "run", LSTM, "--device", "nnapi-ort-cuda")
    assert_one_line_error(code, err, expected)
    with pytest.raises(nnapi.BadDataError) as session_error:
        nnapi.Session(LSTM, devices="nnapi-ort-cuda")
    with pytest.raises(nnapi.BadDataError) as tool_error:
        device_and_reference("nnapi-ort-cuda", "compare")
    assert str(session_error.value).startswith(f"Session: {expected}")
    assert str(tool_error.value).startswith(f"compare: {expected}")
    # a name that is no ONNX Runtime device: no note
    with pytest.raises(nnapi.BadDataError, match=r"no device named 'tpu' \(devices: [^)]*\)$"):
        nnapi.Session(LSTM, devices="tpu")


def _scores_and_offsets(path: Path, kind: str) -> None:
    """A [1, 12] model of two outputs: class scores (SOFTMAX of the input) and the input
    plus 3 (a [1, 12] vector that is no scores); ``kind`` float32 or uint8 (the scores
    with TFLite's fixed 1/256 quantization, the other output with its own)."""
    from tflite_builder import Operator, Subgraph, Tensor, build

    def q(scale: float) -> dict:
        return {"scale": scale, "zero_point": 0} if kind == "uint8" else {}

    three = np.array([[30]], np.uint8) if kind == "uint8" else np.array([[3.0]], np.float32)
    tensors = [Tensor("x", kind, [1, 12], **q(0.1)), Tensor("scores", kind, [1, 12], **q(1 / 256)),
               Tensor("three", kind, [1, 1], data=three, **q(0.1)), Tensor("offsets", kind, [1, 12], **q(0.1))]
    operators = [Operator("SOFTMAX", [0], [1], ("SoftmaxOptions", {"Beta": 1.0})),
                 Operator("ADD", [0, 2], [3], ("AddOptions", {}))]
    path.write_bytes(build(Subgraph(tensors, operators, [0], [1, 3])))


@pytest.mark.parametrize("kind", ["float32", "uint8"])
def test_run_prints_top5_for_class_scores_only(tmp_path: Path, capsys, kind: str) -> None:
    """nnapi run gives a top-5 for a vector of class scores (a softmax's, float or with
    the 1/256 quantization), not for other [1, N] outputs (here the input plus 3; in real
    models landmarks, embeddings, LSTM states), which keep their shape / min / max / mean."""
    from nnapi.cli._model import read_inputs

    model = tmp_path / f"scores_{kind}.tflite"
    _scores_and_offsets(model, kind)
    session = nnapi.Session(str(model))
    scores = session.run(read_inputs(session, None, 3)[0])["scores"].reshape(-1)
    expected = [int(i) for i in np.argsort(-scores.astype(np.float64), kind="stable")[:5]]
    assert len(set(scores.tolist())) > 5  # distinct enough for the order to mean something
    code, out, _ = run_cli(capsys, "run", str(model), "--seed", "3")
    assert code == 0
    blocks = out.split("\noutput ")
    scores_block = next(b for b in blocks if b.startswith("scores:"))
    offsets_block = next(b for b in blocks if b.startswith("offsets:"))
    assert f"  top-5 classes: {expected}" in scores_block
    assert "top-5" not in offsets_block and "  min " in offsets_block and " mean " in offsets_block
    code, out, _ = run_cli(capsys, "run", str(model), "--seed", "3", "--json")
    outputs = json.loads(out)["outputs"]
    assert code == 0 and outputs["scores"]["top5"] == expected and "top5" not in outputs["offsets"]
    assert outputs["offsets"]["shape"] == [1, 12] and outputs["offsets"]["max"] > 1


def test_run_prints_no_top5_for_an_lstm_state(capsys) -> None:
    """The LSTM model's [1, 128] output is the layer's last state (tanh values in -1..1),
    not class scores: no top-5, in the text or the JSON."""
    code, out, _ = run_cli(capsys, "run", LSTM)
    assert code == 0 and "float32[1, 128]" in out and "top-5" not in out and "  min " in out
    code, out, _ = run_cli(capsys, "run", LSTM, "--json")
    [summary] = json.loads(out)["outputs"].values()
    assert code == 0 and summary["shape"] == [1, 128] and "top5" not in summary and summary["min"] < 0


def test_compare_resizes_litert_for_an_input_of_another_run_time_size(capsys, tmp_path) -> None:
    """--input with a size where the model's shape signature has -1 (a batch of 3): LiteRT
    is resized to it (before, a raw ValueError traceback) and both agree."""
    pytest.importorskip("ai_edge_litert")
    from tflite_cases import dynamic_batch_add

    path = tmp_path / "dynamic.tflite"
    path.write_bytes(dynamic_batch_add())
    feeds = tmp_path / "a.npy"
    np.save(feeds, np.arange(9, dtype=np.float32).reshape(3, 3))
    code, out, _ = run_cli(capsys, "compare", str(path), "--input", f"a={feeds}", "--json")
    assert code == 0
    report = json.loads(out)
    assert report["ok"] and report["outputs"]["y"]["max_abs"] == 0


def test_an_input_file_claiming_more_than_it_holds_is_one_line(tmp_path: Path, capsys) -> None:
    """An .npy file (or .npz entry) whose header claims 4 TiB: np.load allocated that
    before reading and the command ended in a MemoryError traceback."""
    import io
    import zipfile

    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": "<f4", "fortran_order": False, "shape": (2**40,)})
    (tmp_path / "x.npy").write_bytes(header.getvalue() + bytes(16))
    with zipfile.ZipFile(tmp_path / "x.npz", "w") as archive:
        archive.writestr(f"{LSTM_INPUT}.npy", header.getvalue() + bytes(16))
    code, _, err = run_cli(capsys, "run", LSTM, "--input", f"{LSTM_INPUT}={tmp_path / 'x.npy'}")
    assert_one_line_error(code, err, "not a .npy array (mmap length is greater than file size)")
    code, _, err = run_cli(capsys, "run", LSTM, "--input", str(tmp_path / "x.npz"))
    assert_one_line_error(code, err, f"the header of {LSTM_INPUT}.npy claims 4398046511104 bytes, the entry holds")
    # format 3.0 (2.0's layout, a UTF-8 header) was not looked at: the claim was allocated
    header = io.BytesIO()
    np.lib.format.write_array_header_2_0(header, {"descr": "<f4", "fortran_order": False, "shape": (2**40,)})
    v3 = b"\x93NUMPY\x03\x00" + header.getvalue()[8:] + bytes(16)
    (tmp_path / "v3.npy").write_bytes(v3)
    code, _, err = run_cli(capsys, "run", LSTM, "--input", f"{LSTM_INPUT}={tmp_path / 'v3.npy'}")
    assert_one_line_error(code, err, "not a .npy array (mmap length is greater than file size)")
    with zipfile.ZipFile(tmp_path / "v3.npz", "w") as archive:
        archive.writestr(f"{LSTM_INPUT}.npy", v3)
    code, _, err = run_cli(capsys, "run", LSTM, "--input", str(tmp_path / "v3.npz"))
    assert_one_line_error(code, err, f"the header of {LSTM_INPUT}.npy claims 4398046511104 bytes, the entry holds")


def test_an_encrypted_npz_entry_is_one_line(tmp_path: Path, capsys) -> None:
    """An .npz entry flagged encrypted (zip flag bit 0): zipfile raised a raw RuntimeError
    ('password required') out of `nnapi run --input`."""
    path = tmp_path / "x.npz"
    np.savez(path, **{LSTM_INPUT: np.zeros((1, 20, 40), np.float32)})
    data = bytearray(path.read_bytes())
    data[data.rfind(b"PK\x01\x02") + 8] |= 1  # the central directory's flags, which zipfile reads
    path.write_bytes(bytes(data))
    code, _, err = run_cli(capsys, "run", LSTM, "--input", str(path))
    assert_one_line_error(code, err, f"not a .npz archive ({LSTM_INPUT}.npy is encrypted)")
    code, _, err = run_cli(capsys, "run", LSTM, "--input", f"{LSTM_INPUT}={path}")
    assert_one_line_error(code, err, f"not a .npy array ({LSTM_INPUT}.npy is encrypted)")


def test_a_damaged_compressed_npz_entry_is_one_line(tmp_path: Path, capsys) -> None:
    """A compressed .npz entry whose local header's extra-field length is wrong: zlib read
    the wrong bytes and its raw zlib.error ('invalid stored block lengths') ended
    `nnapi run --input` (found by mutating zip headers, tests/file_fuzz.py)."""
    path = tmp_path / "x.npz"
    np.savez_compressed(path, **{LSTM_INPUT: np.arange(1 * 20 * 40, dtype=np.float32).reshape(1, 20, 40)})
    data = bytearray(path.read_bytes())
    assert data[:4] == b"PK\x03\x04" and data[28] == 20  # the local header's ZIP64 extra field
    data[28] = 4
    path.write_bytes(bytes(data))
    code, _, err = run_cli(capsys, "run", LSTM, "--input", str(path))
    assert_one_line_error(code, err, "not a .npz archive (Error -3 while decompressing data")


def test_signature_picks_the_subgraph_each_model_command_loads(capsys, tmp_path) -> None:
    """--signature KEY imports that signature's subgraph (load_tflite's ``signature``), in
    every command that loads a .tflite: without it, subgraph 0 as LiteRT's Interpreter."""
    from tflite_cases import two_signatures

    path = tmp_path / "two.tflite"
    path.write_bytes(two_signatures())
    w = tmp_path / "w.npy"
    np.save(w, np.arange(4, dtype=np.float32))
    code, out, _ = run_cli(capsys, "run", str(path), "--signature", "shift", "--input", f"shift_w={w}",
                           "--save", str(tmp_path / "z.npz"))
    assert code == 0 and "output shift_z: float32[4]" in out, out
    np.testing.assert_array_equal(np.load(tmp_path / "z.npz")["shift_z"], np.arange(4, dtype=np.float32) + 1.5)
    code, out, _ = run_cli(capsys, "run", str(path))
    assert code == 0 and "output scale_y: float32[2, 3]" in out, out
    code, out, _ = run_cli(capsys, "dump", str(path), "--signature", "shift")
    assert code == 0 and "ADD" in out and "MUL" not in out, out
    code, out, _ = run_cli(capsys, "inspect", str(path), "--signature", "shift")
    assert code == 0 and "shift_w" in out and "scale_x" not in out, out
    code, out, _ = run_cli(capsys, "bench", str(path), "--signature", "shift", "--iterations", "2", "--warmup", "1",
                           "--no-litert", "--json")
    assert code == 0 and json.loads(out)["nnapi"]["runs"] == 2
    code, _, err = run_cli(capsys, "run", str(path), "--signature", "nope")
    assert_one_line_error(code, err, "no signature 'nope' (the file's: 'scale', 'shift')")


@pytest.mark.parametrize("argv", [["conformance"], ["fuzz", "--device", "nnapi-reference"], ["devices"],
                                  ["capi", "--signature=shift", "include"], ["serve", "--socket", "/none/s.sock"]])
def test_commands_that_load_no_tflite_refuse_signature(capsys, argv) -> None:
    """--signature belongs to the commands that load a .tflite model (run, compare, bench,
    inspect, dump, placement, bisect); the others refuse it as an unknown option (they took
    it and ignored it). Parsing only: nothing runs."""
    from nnapi.cli import build_parser

    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(argv if "--signature=shift" in argv else [*argv, "--signature=shift"])
    assert exit_info.value.code == 2
    assert "unrecognized arguments: --signature=shift" in capsys.readouterr().err
    for command in (["run"], ["compare", "m.tflite"], ["bench", "m.tflite"], ["inspect", "m.tflite"],
                    ["dump", "m.tflite"], ["placement", "m.tflite"], ["bisect", "m.tflite", "--device", "d"]):
        assert build_parser().parse_args([*command, "--signature=shift"]).signature == "shift"


def test_compare_runs_litert_through_the_same_signature(capsys, tmp_path) -> None:
    """compare --signature KEY: LiteRT runs get_signature_runner(KEY), fed and read by the
    tensors the imported signature names (its keys differ from them)."""
    pytest.importorskip("ai_edge_litert")
    from tflite_cases import two_signatures

    path = tmp_path / "two.tflite"
    path.write_bytes(two_signatures())
    code, out, _ = run_cli(capsys, "compare", str(path), "--signature", "shift", "--json")
    report = json.loads(out)
    assert code == 0 and report["ok"] and list(report["outputs"]) == ["shift_z"]
    assert report["outputs"]["shift_z"]["max_abs"] == 0
    code, out, _ = run_cli(capsys, "bench", str(path), "--signature", "shift", "--iterations", "2", "--warmup", "1",
                           "--json")
    assert code == 0 and json.loads(out)["litert"]["runs"] == 2
    code, out, _ = run_cli(capsys, "compare", str(path), "--json")
    assert code == 0 and list(json.loads(out)["outputs"]) == ["scale_y"]


def test_a_signature_only_litert_xnnpack_runs_drops_the_builtin_kernels(capsys, tmp_path) -> None:
    """With --signature, a model whose custom operator only LiteRT's XNNPACK delegate has
    (MediaPipe's Convolution2DTransposeBias): compare and bench drop the builtin kernels'
    runner, as without a signature (the runner, allocated on its first call only, made both
    stop at their first run: 'LiteRT cannot run these inputs')."""
    pytest.importorskip("ai_edge_litert")
    from tflite_cases import transpose_conv_bias

    path = tmp_path / "up.tflite"
    path.write_bytes(transpose_conv_bias(1, 2, 3, 4, 8, signature="up")())
    with only_devices():
        code, out, _ = run_cli(capsys, "compare", str(path), "--signature", "up", "--json")
        assert code == 0, out
        report = json.loads(out)
        assert report["ok"] and list(report["outputs"]) == ["y"]
        assert "builtin_difference" not in report["outputs"]["y"]
        code, out, _ = run_cli(capsys, "bench", str(path), "--signature", "up", "--iterations", "1", "--warmup", "0",
                               "--each-device", "--json")
    assert code == 0, out
    report = json.loads(out)
    assert report["litert"]["runs"] == 1 and report["litert_builtin"] is None
    assert "Convolution2DTransposeBias" in report["litert_builtin_error"]
