"""benchmarks/bench_ort.py's model rows: ``--input-shape`` fixes an open input dimension in
nnapi's import and in LiteRT alike (a model that imports at no static shape is compared),
and the agreement column pairs a TFLite_Detection_PostProcess's outputs as detections, as
``nnapi compare`` does (the engines order equal scores differently)."""

from __future__ import annotations

import importlib.util
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("tflite")
pytest.importorskip("onnxruntime")
pytest.importorskip("ai_edge_litert")

import nnapi  # noqa: E402
from test_tflite_input_shapes import frames_of_any_length  # noqa: E402  (a length open in the file)

_BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_ort.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_ort", _BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_an_input_shape_given_fixes_both_engines(bench, tmp_path, capsys) -> None:
    """Without --input-shape the model does not import (one sample makes no frame), nor
    with a shape for an input it lacks; with audio=20 both engines run 5 frames and agree.
    The table says which names no model took; a malformed option is a usage error."""
    path = tmp_path / "frames.tflite"
    path.write_bytes(frames_of_any_length())
    for shapes in (None, ["wave=20"]):
        with pytest.raises(nnapi.BadDataError):
            bench.bench_model(path, 2, 0, time.process_time, shapes)
    row = bench.bench_model(path, 2, 0, time.process_time, ["audio=20", "wave=7"])
    assert row["steps"] == ["nnapi-ort-cpu"] and row["input_shapes"] == ["audio"]
    measured, unit = row["agreement"].split()
    assert unit == "rel" and float(measured) <= 1e-6
    assert bench.main([str(path), "--input-shape", "audio=20", "--input-shape", "wave=7", "--runs", "2",
                       "--reference-runs", "0", "--split-model", str(tmp_path / "absent.tflite")]) == 0
    table = capsys.readouterr().out
    assert "\nframes " in table and "not compared" not in table
    assert "--input-shape wave=...: no model compared has an input 'wave'" in table
    with pytest.raises(SystemExit) as exit_status:
        bench.main([str(path), "--input-shape", "audio"])
    assert exit_status.value.code == 2


def _detections(order: list[int], boxes: np.ndarray, classes: np.ndarray, scores: np.ndarray
                ) -> list[np.ndarray]:
    """[boxes [1, d, 4], classes [1, d], scores [1, d], count [1]] with the detections in
    ``order`` (the slots past them zero)."""
    slots = len(order)
    return [boxes[order][None], classes[order][None].astype(np.float32), scores[order][None],
            np.array([slots], np.float32)]


def test_detections_are_paired_as_nnapi_compare_pairs_them(bench) -> None:
    """Two detections of equal score in the other order: slot by slot they differ by a
    whole box and class; as detections every one pairs at no difference. The top box moved by a
    tenth of the image leaves one detection unpaired on each side."""
    names = ["boxes", "classes", "scores", "count", "logits"]
    group = [("boxes", "classes", "scores", "count")]
    boxes = np.array([[0.1, 0.1, 0.4, 0.4], [0.5, 0.5, 0.9, 0.9], [0.2, 0.6, 0.3, 0.8]], np.float32)
    classes = np.array([3, 7, 1])
    scores = np.array([0.9, 0.5, 0.5], np.float32)
    logits = np.array([[1.0, -2.0, 4.0]], np.float32)
    theirs = [*_detections([0, 1, 2], boxes, classes, scores), logits]
    ours = [*_detections([0, 2, 1], boxes, classes, scores), logits + np.float32(4e-3)]
    assert bench.agreement(ours[0], theirs[0]) != "0.0e+00 rel"  # slot by slot: two boxes apart
    assert bench.agreements(names, ours, theirs, group) == (
        "detections 3 (LiteRT's), 0 unpaired, counts differ in 0 image(s); pairs' max rel box 0, score 0, "
        "1.0e-03 rel")
    moved = boxes.copy()
    moved[0, :2] += np.float32(0.1)
    ours = [*_detections([0, 2, 1], moved, classes, scores), logits]
    assert bench.agreements(names, ours, theirs, group).startswith(
        "detections 3 (LiteRT's), 1 unpaired, counts differ in 0 image(s)")
