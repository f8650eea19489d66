"""load_model(..., input_shapes=...) / --input-shape: an input's open dimensions fixed by
the caller, as LiteRT's resize_tensor_input before it allocates, every shape after the
inputs derived (raw-audio models whose files declare one sample: openWakeWord's
melspectrogram, tf.signal.stft front ends of any length)."""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("tflite")

import nnapi  # noqa: E402
from tflite_builder import Operator, Subgraph, Tensor, build  # noqa: E402


def frames_of_any_length() -> bytes:
    """audio [-1] (the file's static shape: one sample) cut into frames of 4 by RESHAPE to
    [SHAPE(audio) / 4, 4] (FLOOR_DIV, PACK), then frames @ W: as tf.signal.frame's models,
    no shape of it holds at the file's one sample."""
    i32 = lambda v: np.array(v, np.int32)  # noqa: E731
    weights = np.arange(12, dtype=np.float32).reshape(3, 4) / 10
    t = [Tensor("audio", "float32", [1], shape_signature=[-1]),                 # 0
         Tensor("shape", "int32", [1]),                                        # 1
         Tensor("zero", "int32", [], data=i32(0)),                             # 2
         Tensor("length", "int32", [1]),                                       # 3
         Tensor("four", "int32", [1], data=i32([4])),                          # 4
         Tensor("count", "int32", [1]),                                        # 5
         Tensor("frame_shape", "int32", [2]),                                  # 6
         Tensor("frames", "float32", [1, 4], shape_signature=[-1, 4]),         # 7
         Tensor("weights", "float32", [3, 4], data=weights),                   # 8
         Tensor("features", "float32", [1, 3], shape_signature=[-1, 3])]       # 9
    ops = [Operator("SHAPE", [0], [1], ("ShapeOptions", {"OutType": 2})),
           Operator("GATHER", [1, 2], [3], ("GatherOptions", {"Axis": 0})),
           Operator("FLOOR_DIV", [3, 4], [5]),
           Operator("CONCATENATION", [5, 4], [6], ("ConcatenationOptions", {"Axis": 0})),
           Operator("RESHAPE", [0, 6], [7]),
           Operator("FULLY_CONNECTED", [7, 8, -1], [9], ("FullyConnectedOptions", {}))]
    return build(Subgraph(t, ops, [0], [9]))


def test_input_shapes_fix_an_open_length_as_litert_resizes_it() -> None:
    data = frames_of_any_length()
    with pytest.raises(nnapi.BadDataError):  # one sample makes no frame of 4
        nnapi.load_model(data)
    weights = np.arange(12, dtype=np.float64).reshape(3, 4) / 10
    for length in (8, 20):
        imported = nnapi.load_model(data, input_shapes={"audio": [length]})
        assert imported.inputs[0].shape == (length,) and imported.outputs[0].shape == (length // 4, 3)
        assert imported.fixed_shapes.startswith(f"input shapes given (audio [{length}])")
        audio = np.random.default_rng(length).standard_normal(length).astype(np.float32)
        expected = audio.astype(np.float64).reshape(-1, 4) @ weights.T
        litert = litert_outputs_resized(data, {"audio": audio})["features"]
        np.testing.assert_allclose(litert, expected, rtol=1e-6, atol=1e-6)
        for device in ("nnapi-reference", "nnapi-ort-cpu"):
            if device not in [d.name for d in nnapi.get_devices()]:
                continue
            got = nnapi.Session(imported, device).run({"audio": audio})["features"]
            np.testing.assert_allclose(got, litert, rtol=1e-6, atol=1e-6)


def litert_outputs_resized(data: bytes, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """LiteRT's outputs with its inputs resized to the feeds' shapes first."""
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_content=data, num_threads=1)
    by_name = {d["name"]: d["index"] for d in interpreter.get_input_details()}
    for name, value in feeds.items():
        interpreter.resize_tensor_input(by_name[name], list(value.shape))
    interpreter.allocate_tensors()
    for name, value in feeds.items():
        interpreter.set_tensor(by_name[name], value)
    interpreter.invoke()
    return {d["name"]: interpreter.get_tensor(d["index"]) for d in interpreter.get_output_details()}


@pytest.mark.parametrize("given, message", [
    ({"nope": [8]}, r"input_shapes names \['nope'\], which the model's inputs \(audio\) are not"),
    ({"audio": [2, 4]}, r"input 'audio' is \[-1\] \(-1 open\); input_shapes gives \[2, 4\]"),
    ({"audio": [0]}, r"input_shapes: 'audio': \[0\] is not a shape of positive ints"),
    ({"audio": "8"}, r"is not a shape of positive ints"),
    ([8], r"input_shapes must be a dict"),
])
def test_input_shapes_checked(given, message) -> None:
    with pytest.raises(nnapi.BadDataError, match=message):
        nnapi.load_model(frames_of_any_length(), input_shapes=given)


def test_a_fixed_dimension_must_match() -> None:
    t = [Tensor("x", "float32", [1, 6], shape_signature=[-1, 6]), Tensor("y", "float32", [1, 6],
                                                                          shape_signature=[-1, 6])]
    data = build(Subgraph(t, [Operator("RELU", [0], [1])], [0], [1]))
    with pytest.raises(nnapi.BadDataError, match=r"input 'x' is \[-1, 6\].*gives \[3, 5\]"):
        nnapi.load_model(data, input_shapes={"x": [3, 5]})
    assert nnapi.load_model(data, input_shapes={"x": [3, 6]}).outputs[0].shape == (3, 6)


def test_command_line_input_shape(tmp_path, capsys) -> None:
    """--input-shape NAME=D1,... on run / compare (LiteRT resized the same way)."""
    from nnapi.cli import main

    path = tmp_path / "frames.tflite"
    path.write_bytes(frames_of_any_length())
    assert main(["run", str(path), "--input-shape", "audio=12", "--device", "nnapi-reference", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["outputs"]["features"]["shape"] == [3, 3]
    assert main(["compare", str(path), "--input-shape", "audio=16", "--device", "nnapi-reference"]) == 0
    assert "agree" in capsys.readouterr().out
    assert main(["run", str(path), "--input-shape", "audio=x"]) == 2
    assert "expected NAME=D1,D2,..." in capsys.readouterr().err


def token_wrap_of_any_length() -> bytes:
    """ids [1, -1] (the file's static shape: one token) wrapped as Keras writes an
    embedding's negative ids (textcls_dynseq: LESS, ADD, SELECT_V2 of three [1, -1]
    tensors), clipped by a SELECT_V2 with a scalar (GREATER, a broadcast 9), then GATHERed
    from a [10, 3] table: every SELECT_V2's output shape is open in the file."""
    i32 = lambda v: np.array(v, np.int32)  # noqa: E731
    table = np.arange(30, dtype=np.float32).reshape(10, 3) / 4
    open_ids = {"shape_signature": [1, -1]}
    t = [Tensor("ids", "int32", [1, 1], **open_ids),                               # 0
         Tensor("zero", "int32", [], data=i32(0)),                                 # 1
         Tensor("ten", "int32", [], data=i32(10)),                                 # 2
         Tensor("nine", "int32", [], data=i32(9)),                                 # 3
         Tensor("negative", "bool", [1, 1], **open_ids),                           # 4
         Tensor("shifted", "int32", [1, 1], **open_ids),                           # 5
         Tensor("wrapped", "int32", [1, 1], **open_ids),                           # 6
         Tensor("above", "bool", [1, 1], **open_ids),                              # 7
         Tensor("clipped", "int32", [1, 1], **open_ids),                           # 8
         Tensor("table", "float32", [10, 3], data=table),                          # 9
         Tensor("rows", "float32", [1, 1, 3], shape_signature=[1, -1, 3])]         # 10
    ops = [Operator("LESS", [0, 1], [4]), Operator("ADD", [0, 2], [5], ("AddOptions", {})),
           Operator("SELECT_V2", [4, 5, 0], [6]), Operator("GREATER", [6, 3], [7]),
           Operator("SELECT_V2", [7, 3, 6], [8]), Operator("GATHER", [9, 8], [10], ("GatherOptions", {"Axis": 0}))]
    return build(Subgraph(t, ops, [0], [10]))


def test_input_shapes_reach_select_v2_through_broadcasting_operators() -> None:
    """The shapes after an input given a length are derived through element-wise
    operators too (each output is its inputs' broadcast shape), so a SELECT_V2 of three
    [1, -1] tensors, or of a scalar, sees its static shape: it imported only with --input
    before (textcls_dynseq: "the output's shape is not static")."""
    data = token_wrap_of_any_length()
    table = np.arange(30, dtype=np.float32).reshape(10, 3) / 4
    for length in (5, 37):
        imported = nnapi.load_model(data, input_shapes={"ids": [1, length]})
        assert imported.outputs[0].shape == (1, length, 3)
        ids = np.random.default_rng(length).integers(-10, 14, (1, length)).astype(np.int32)
        expected = table[np.minimum(np.where(ids < 0, ids + 10, ids), 9)]
        np.testing.assert_array_equal(litert_outputs_resized(data, {"ids": ids})["rows"], expected)
        for device in ("nnapi-reference", "nnapi-ort-cpu"):
            if device not in [d.name for d in nnapi.get_devices()]:
                continue
            got = nnapi.Session(imported, device).run({"ids": ids})["rows"]
            np.testing.assert_array_equal(got, expected)
