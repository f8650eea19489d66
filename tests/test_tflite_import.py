"""TensorFlow Lite import and Session: real models and one synthetic model per lowering,
checked against LiteRT when it is installed and against its stored outputs when not."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("tflite")

import nnapi  # noqa: E402
from helpers import litert_outputs  # noqa: E402
from nnapi.session import random_inputs  # noqa: E402
from tflite_cases import CASES  # noqa: E402

MODELS = Path(__file__).parent / "data" / "models"
REAL = ["hand_recrop", "face_detection_short_range", "lstm_1x20x40_128_fused", "lstm_1x20x40_128_while"]

try:
    from ai_edge_litert.interpreter import Interpreter
except ImportError:  # the stored outputs stand in for LiteRT
    Interpreter = None


def assert_agrees(got: dict[str, np.ndarray], expected: dict[str, np.ndarray], tolerance: float) -> None:
    assert set(got) == set(expected)
    for name, want in expected.items():
        have = got[name]
        assert have.shape == want.shape, name
        assert have.dtype == want.dtype, name
        if want.dtype.kind == "f":
            scale = max(float(np.abs(want).max()), 1e-30)
            assert float(np.abs(have - want).max()) / scale <= tolerance, name
        else:
            assert int(np.abs(have.astype(np.int64) - want.astype(np.int64)).max()) <= tolerance, name


# --- real models ---------------------------------------------------------------------------
@pytest.mark.parametrize("name", REAL)
def test_real_model_agrees_with_litert(name: str) -> None:
    path = MODELS / f"{name}.tflite"
    session = nnapi.Session(path, devices=["nnapi-reference"])
    feeds = random_inputs(session.inputs, seed=0)
    got = session.run(feeds)
    if Interpreter is not None:
        expected = litert_outputs(path, feeds)
    else:
        stored = np.load(MODELS / f"{name}.npz")
        expected = {key[4:]: stored[key] for key in stored.files}
    assert_agrees(got, expected, 1e-5)


def test_stored_outputs_are_litert_outputs() -> None:
    pytest.importorskip("ai_edge_litert")
    for name in REAL:
        path = MODELS / f"{name}.tflite"
        feeds = random_inputs(nnapi.Session(path).inputs, seed=0)
        stored = np.load(MODELS / f"{name}.npz")
        assert_agrees({f"out:{k}": v for k, v in litert_outputs(path, feeds).items()},
                      {k: stored[k] for k in stored.files}, 0)


def test_custom_operator_is_refused_by_index_and_name() -> None:
    from tflite_cases import custom_landmarks_to_matrix

    with pytest.raises(nnapi.BadDataError, match=r"operator 0 \(CUSTOM Landmarks2TransformMatrix\): custom "
                                                 r"operator 'Landmarks2TransformMatrix' has no NNAPI equivalent"):
        nnapi.load_tflite(custom_landmarks_to_matrix())


@pytest.mark.parametrize("options, message", [(b"\x01\x00\x00\x00", "custom options of 4 bytes"),
                                              (np.array([0, 2, 2], "<i4").tobytes(), "padding 0 is neither")])
def test_transpose_conv_bias_with_bad_options_is_refused(options: bytes, message: str) -> None:
    from tflite_builder import Operator, Subgraph, Tensor, build

    t = [Tensor("x", "float32", [1, 4, 4, 3]),
         Tensor("w", "float32", [2, 2, 2, 3], data=np.ones((2, 2, 2, 3), np.float32)),
         Tensor("b", "float32", [2], data=np.zeros(2, np.float32)), Tensor("y", "float32", [1, 8, 8, 2])]
    model = build(Subgraph(t, [Operator("CUSTOM", [0, 1, 2], [3], custom="Convolution2DTransposeBias",
                                        custom_options=options)], [0], [3]))
    with pytest.raises(nnapi.BadDataError, match=r"operator 0 \(CUSTOM Convolution2DTransposeBias\): " + message):
        nnapi.load_tflite(model)


@pytest.mark.parametrize("change, message", [
    ({"use_regular_nms": True, "max_classes_per_detection": 2}, "regular NMS with max_classes_per_detection > 1"),
    ({"max_classes_per_detection": 4}, "max_classes_per_detection 4 above num_classes 3"),
    ({"num_classes": 5}, r"class predictions \[1, 40, 4\] need num_classes \(5\)"),
    ({"nms_iou_threshold": None}, "custom option 'nms_iou_threshold' is missing"),
    (None, "custom options are not a FlexBuffer map"),
])
def test_detection_postprocess_tflite_cannot_say_in_nnapi_is_refused(change, message: str) -> None:
    from flatbuffers import flexbuffers

    from tflite_builder import Operator, Subgraph, Tensor, build

    options = {"max_detections": 6, "max_classes_per_detection": 1, "detections_per_class": 4,
               "use_regular_nms": False, "nms_score_threshold": 0.3, "nms_iou_threshold": 0.5, "num_classes": 3,
               "y_scale": 10.0, "x_scale": 10.0, "h_scale": 5.0, "w_scale": 5.0}
    if change is None:
        raw = b"\x07\x07\x07"
    else:
        options.update(change)
        raw = bytes(flexbuffers.Dumps({k: v for k, v in options.items() if v is not None}))
    t = [Tensor("boxes", "float32", [1, 40, 4]), Tensor("scores", "float32", [1, 40, 4]),
         Tensor("anchors", "float32", [40, 4], data=np.full((40, 4), 0.5, np.float32)),
         *(Tensor(f"out{i}", "float32", []) for i in range(4))]
    model = build(Subgraph(t, [Operator("CUSTOM", [0, 1, 2], [3, 4, 5, 6], custom="TFLite_Detection_PostProcess",
                                        custom_options=raw)], [0, 1], [3, 4, 5, 6]))
    with pytest.raises(nnapi.BadDataError, match=r"operator 0 \(CUSTOM TFLite_Detection_PostProcess\): " + message):
        nnapi.load_tflite(model)


def test_selfie_segmentation_runs_its_custom_transposed_convolution() -> None:
    """MediaPipe's selfie segmentation ends in its custom Convolution2DTransposeBias, now
    TRANSPOSE_CONV_2D, then a LOGISTIC: on this random image the mask is at most ~0.015,
    so relative to it the float32 spread of the logits (up to |87| on noise) is magnified.
    That spread follows numpy's BLAS, whose summation order depends on the processor (the
    kernels it picks) and on its thread count. The same code and the same LiteRT outputs
    (XNNPACK, the only LiteRT path with the operator; equal to the stored ones) gave 2.2e-5
    of the mask's maximum on the machine the bound was first set on; on an AMD EPYC
    (OpenBLAS 0.3.31, Haswell kernels) 2.7e-5 with BLAS on one thread and 3.35e-5 on two
    (as the suite runs it), where nnapi-ort-cpu is 1.1e-5 from LiteRT."""
    path = MODELS / "selfie_segmentation.tflite"
    imported = nnapi.load_tflite(path)
    assert any("Convolution2DTransposeBias as TRANSPOSE_CONV_2D" in str(entry) for entry in imported.lowerings)
    session = nnapi.Session(imported, devices=["nnapi-reference"])
    feeds = random_inputs(session.inputs, seed=0)
    got = session.run(feeds)
    if Interpreter is not None:
        expected = litert_outputs(path, feeds)
    else:
        stored = np.load(MODELS / "selfie_segmentation.npz")
        expected = {key[4:]: stored[key] for key in stored.files}
    assert float(np.abs(expected["activation_10"]).max()) > 0.01
    assert_agrees(got, expected, 5e-5)


def test_imported_model_describes_the_source() -> None:
    imported = nnapi.load_tflite(MODELS / "face_detection_short_range.tflite")
    assert imported.model.is_finished
    assert [spec.name for spec in imported.inputs] == ["input"]
    assert [spec.name for spec in imported.outputs] == ["regressors", "classificators"]
    assert imported.inputs[0].type == nnapi.OperandCode.TENSOR_FLOAT32
    assert imported.inputs[0].shape == (1, 128, 128, 3)
    assert len(imported.sources) == imported.model.operation_count
    # Every NNAPI operation names its TFLite operator; DEQUANTIZE of float16 weights was folded.
    names = {source.name for source in imported.sources}
    assert "DEQUANTIZE" not in names and "CONV_2D" in names
    folded = [lowering for lowering in imported.lowerings if lowering.source.name == "DEQUANTIZE"]
    assert len(folded) == 74 and all(lowering.operations == () for lowering in folded)
    assert "DEQUANTIZE" not in imported.operation_histogram()


def test_while_model_references_its_subgraphs() -> None:
    imported = nnapi.load_tflite(MODELS / "lstm_1x20x40_128_while.tflite", keep_loops=True)
    assert "WHILE" in imported.operation_histogram()
    assert len(imported.submodels) == 2
    body = imported.submodels[1]
    assert any("rank-0" in lowering.reason for lowering in body.lowerings)


@pytest.mark.parametrize("device", ["nnapi-reference", "nnapi-ort-cpu"])
def test_keras_lstm_loop_is_one_sequence_lstm(device: str) -> None:
    """Keras 3's LSTM layer is a WHILE of one LSTM step writing a [time, batch, units]
    buffer: imported as one UNIDIRECTIONAL_SEQUENCE_LSTM, whose outputs are the loop's
    (float32 summation order apart) on each device; keep_loops=True keeps the loop."""
    path = MODELS / "lstm_1x20x40_128_while.tflite"
    fused = nnapi.load_tflite(path)
    assert fused.operation_histogram().get("UNIDIRECTIONAL_SEQUENCE_LSTM") == 1
    assert "WHILE" not in fused.operation_histogram() and fused.submodels == []
    assert any("Keras 3's LSTM loop" in lowering.reason for lowering in fused.lowerings)
    try:
        sessions = [nnapi.Session(fused, devices=[device]),
                    nnapi.Session(nnapi.load_tflite(path, keep_loops=True), devices=[device])]
    except nnapi.BadDataError as error:
        assert "no device named" in str(error)
        pytest.skip(f"{device} is not installed")
    feeds = random_inputs(sessions[0].inputs, seed=3)
    got, loop = (next(iter(session.run(feeds).values())) for session in sessions)
    assert np.abs(loop).max() > 0.05
    np.testing.assert_allclose(got, loop, rtol=0, atol=2e-6 * np.abs(loop).max())


@pytest.mark.parametrize("sequence, bias", [(True, True), (False, True), (True, False)])
def test_keras_lstm_loop_forms_agree_with_litert_and_the_loop(sequence: bool, bias: bool) -> None:
    """Both buffer forms Keras 3 writes (every step's output, or the last), with and without
    bias: the one UNIDIRECTIONAL_SEQUENCE_LSTM gives the LSTM's values (float64 numpy),
    LiteRT's and the loop's, on each device."""
    from tflite_cases import keras_while_lstm, lstm_reference

    data, weights = keras_while_lstm(sequence=sequence, bias=bias)
    assert nnapi.load_tflite(data).operation_histogram().get("UNIDIRECTIONAL_SEQUENCE_LSTM") == 1
    assert "WHILE" in nnapi.load_tflite(data, keep_loops=True).operation_histogram()
    x = np.random.default_rng(4).uniform(-1, 1, (5, 1, 3)).astype(np.float32)
    want = lstm_reference(x, **weights)
    want = want if sequence else want[-1:]
    outputs = []
    for device in ("nnapi-reference", "nnapi-ort-cpu"):
        for keep_loops in (False, True):
            session = _session_on(nnapi.load_tflite(data, keep_loops=keep_loops), device)
            if session is not None:
                outputs.append(session.run({"x": x})["out2"])
    if Interpreter is not None:
        outputs.append(litert_outputs(data, {"x": x})["out2"])
    assert len(outputs) >= 2 and np.abs(want).max() > 0.1
    for got in outputs:
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=0, atol=2e-6)


def test_load_from_bytes_and_load_model() -> None:
    data = (MODELS / "hand_recrop.tflite").read_bytes()
    from_bytes = nnapi.load_tflite(data)
    generic = nnapi.load_model(MODELS / "hand_recrop.tflite")
    assert from_bytes.path is None and generic.path.endswith("hand_recrop.tflite")
    assert from_bytes.operation_histogram() == generic.operation_histogram()


@pytest.mark.parametrize("make, message", [
    (lambda tmp: tmp / "missing.tflite", "no such file"),
    (lambda tmp: tmp, "directory"),
    (lambda tmp: _write(tmp / "notes.txt", b"hello, this is not a model"), "not a model"),
    (lambda tmp: _write(tmp / "cut.tflite", (MODELS / "hand_recrop.tflite").read_bytes()[:4000]), "TensorFlow Lite"),
])
def test_bad_files_raise_one_bad_data_error(tmp_path: Path, make, message: str) -> None:
    with pytest.raises(nnapi.BadDataError, match=message):
        nnapi.load_model(make(tmp_path))


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


# --- synthetic lowerings --------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(CASES))
def test_lowering_agrees_with_litert(name: str) -> None:
    case = CASES[name]
    data = case.build()
    imported = nnapi.load_tflite(data)
    if case.lowering is None:
        assert imported.lowerings == []
    else:
        assert any(case.lowering in str(lowering) for lowering in imported.lowerings), imported.lowerings
    session = nnapi.Session(imported, devices=["nnapi-reference"])
    feeds = random_inputs(session.inputs, seed=0)
    got = session.run(feeds)
    if case.reference is not None:
        expected = case.reference(feeds)
    elif Interpreter is not None:
        expected = litert_outputs(data, feeds)
    else:
        stored = np.load(MODELS / "lowerings.npz")
        expected = {key.split(":", 1)[1]: stored[key] for key in stored.files if key.split(":", 1)[0] == name}
    assert_agrees(got, expected, case.tolerance)


def test_pad_folds_into_a_grouped_convolution() -> None:
    """A spatial zero PAD read by a VALID grouped CONV_2D (onnx2tf's depthwise
    convolutions) folds into GROUPED_CONV_2D's explicit padding: no padded copy; the values
    are numpy's grouped convolution of the padded input on each device."""
    from tflite_builder import Operator, Subgraph, Tensor, build

    rng = np.random.default_rng(14)
    w = rng.standard_normal((6, 3, 3, 2)).astype(np.float32)
    b = rng.standard_normal(6).astype(np.float32)
    t = [Tensor("x", "float32", [1, 5, 5, 4]),
         Tensor("pads", "int32", [4, 2], data=np.array([[0, 0], [1, 2], [2, 1], [0, 0]], np.int32)),
         Tensor("padded", "float32", [1, 8, 8, 4]), Tensor("w", "float32", [6, 3, 3, 2], data=w),
         Tensor("b", "float32", [6], data=b), Tensor("y", "float32", [1, 3, 6, 6])]
    ops = [Operator("PAD", [0, 1], [2]),
           Operator("CONV_2D", [2, 3, 4], [5], ("Conv2DOptions", {"Padding": 1, "StrideW": 1, "StrideH": 2,
                                                                  "DilationWFactor": 1, "DilationHFactor": 1}))]
    data = build(Subgraph(t, ops, [0], [5]))
    imported = nnapi.load_tflite(data)
    lowerings = [str(lowering) for lowering in imported.lowerings]
    assert any("(PAD) -> constant: spatial zero padding folded" in text for text in lowerings), lowerings
    assert any("as GROUPED_CONV_2D, reading a PAD folded" in text for text in lowerings), lowerings
    x = rng.standard_normal((1, 5, 5, 4)).astype(np.float32)
    padded = np.pad(x.astype(np.float64), [(0, 0), (1, 2), (2, 1), (0, 0)])
    want = np.zeros((1, 3, 6, 6))
    for o in range(6):
        group = o // 3
        for i in range(3):
            for j in range(6):
                window = padded[0, 2 * i:2 * i + 3, j:j + 3, 2 * group:2 * group + 2]
                want[0, i, j, o] = (window * w[o]).sum() + b[o]
    for device in ("nnapi-reference", "nnapi-ort-cpu"):
        session = _session_on(data, device)
        if session is not None:
            np.testing.assert_allclose(session.run({"x": x})["y"], want, rtol=1e-5, atol=1e-5)


def _session_on(model, device: str) -> nnapi.Session | None:
    """A session of ``model`` on ``device`` alone; None where this machine has no such
    device (nnapi-ort-cpu needs onnxruntime)."""
    try:
        return nnapi.Session(model, devices=[device])
    except nnapi.BadDataError as error:
        assert "no device named" in str(error)
        return None


def _assert_exact_on_every_engine(data: bytes, feeds: dict, expected: dict) -> None:
    """The model's outputs equal ``expected`` exactly on each nnapi device this machine has
    (nnapi-ort-cpu needs onnxruntime) and on LiteRT when it is installed."""
    for device in ("nnapi-reference", "nnapi-ort-cpu"):
        session = _session_on(data, device)
        if session is not None:
            assert_agrees(session.run(feeds), expected, 0)
    if Interpreter is not None:
        assert_agrees(litert_outputs(data, feeds), expected, 0)


def test_int32_moves_are_exact_over_the_whole_range() -> None:
    """int32 values beyond float32's 2**24 survive RESHAPE / CONCATENATION / STRIDED_SLICE /
    TRANSPOSE / SQUEEZE, which NNAPI moves as float32 halves."""
    from tflite_cases import _int32_moves_reference, int32_moves

    data = int32_moves()
    x = np.array([[2**31 - 1, -2**31, 16777217], [-16777219, 65536, -1]], np.int32)
    feeds = {"x": x, "scalar": np.array(-123456789, np.int32)}
    _assert_exact_on_every_engine(data, feeds, _int32_moves_reference(feeds))


def test_int32_concatenations_are_exact_over_the_whole_range() -> None:
    """CONCATENATION of int32 tensors computed at run time (GATHER + SELECT) moves every
    int32 value, on each device that runs the model."""
    from tflite_cases import _int32_concatenations_reference, int32_concatenations

    data = int32_concatenations()
    rng = np.random.default_rng(3)
    feeds = {"x": np.array([[2**31 - 1, -2**31, 16777217], [-16777219, 65536, -1]], np.int32),
             "y": rng.integers(-2**31, 2**31, (2, 1)).astype(np.int32), "i": np.array([-123456789], np.int32)}
    operations = [str(op) for op in nnapi.load_tflite(data).lowerings]
    assert not any("16 bits" in text for text in operations), operations
    _assert_exact_on_every_engine(data, feeds, _int32_concatenations_reference(feeds))


# --- element moves through rank 5 and 6 (Keras UpSampling2D, window shuffles) -------------
def _chain_model(kind: str, shape: list[int], steps: list[tuple], scale: float | None = None) -> bytes:
    """RESHAPE / TILE / TRANSPOSE ``steps`` of one input, each (op, new shape or
    parameter, output shape): the operators Keras writes through rank 5 and 6."""
    from tflite_builder import Operator, Subgraph, Tensor, build

    q = {"scale": scale, "zero_point": -3} if scale is not None else {}
    tensors = [Tensor("x", kind, shape, **q)]
    ops = []
    for op, param, out_shape in steps:
        source = len(tensors) - 1
        if op == "RESHAPE":
            tensors.append(Tensor(f"shape{len(tensors)}", "int32", [len(param)], data=np.array(param, np.int32)))
            tensors.append(Tensor(f"t{len(tensors)}", kind, out_shape, **q))
            ops.append(Operator("RESHAPE", [source, len(tensors) - 2], [len(tensors) - 1],
                                ("ReshapeOptions", {"NewShape": param})))
        else:
            tensors.append(Tensor(f"p{len(tensors)}", "int32", [len(param)], data=np.array(param, np.int32)))
            tensors.append(Tensor(f"t{len(tensors)}", kind, out_shape, **q))
            ops.append(Operator(op, [source, len(tensors) - 2], [len(tensors) - 1]))
    tensors[-1].name = "y"
    return build(Subgraph(tensors, ops, [0], [len(tensors) - 1]))


def _upsampling(batch: int, height: int, width: int, channels: int, sh: int, sw: int) -> list[tuple]:
    """Keras 3's UpSampling2D(nearest): two repeats, each a rank-5 RESHAPE + TILE + RESHAPE."""
    return [("RESHAPE", [batch, height, 1, width, channels], [batch, height, 1, width, channels]),
            ("TILE", [1, 1, sh, 1, 1], [batch, height, sh, width, channels]),
            ("RESHAPE", [batch, height * sh, width, 1, channels], [batch, height * sh, width, 1, channels]),
            ("TILE", [1, 1, 1, sw, 1], [batch, height * sh, width, sw, channels]),
            ("RESHAPE", [batch, height * sh, width * sw, channels], [batch, height * sh, width * sw, channels])]


@pytest.mark.parametrize("kind, batch, sh, sw, scale, emitted", [
    ("float32", 1, 2, 2, None, "RESIZE_NEAREST_NEIGHBOR"), ("int8", 2, 2, 2, 0.5, "RESIZE_NEAREST_NEIGHBOR"),
    ("float32", 2, 3, 2, None, "")])
def test_upsampling_through_rank_5_is_imported_exactly(kind: str, batch: int, sh: int, sw: int, scale, emitted: str
                                                       ) -> None:
    """Keras 3 writes UpSampling2D(nearest) as RESHAPE to rank 5, TILE, RESHAPE (twice),
    which NNAPI's rank-4 operations cannot hold: imported as what the chain does, a nearest
    upsampling (RESIZE_NEAREST_NEIGHBOR, or GATHERs where its float indexes differ)."""
    data = _chain_model(kind, [batch, 3, 5, 2], _upsampling(batch, 3, 5, 2, sh, sw), scale)
    lowerings = [str(lowering) for lowering in nnapi.load_tflite(data).lowerings]
    assert len(lowerings) == 1 and "through rank 5 only moves elements" in lowerings[0], lowerings
    assert emitted in lowerings[0]
    rng = np.random.default_rng(5)
    x = rng.integers(-128, 128, (batch, 3, 5, 2)).astype(np.int8) if kind == "int8" else \
        rng.standard_normal((batch, 3, 5, 2)).astype(np.float32)
    _assert_exact_on_every_engine(data, {"x": x}, {"y": np.repeat(np.repeat(x, sh, axis=1), sw, axis=2)})


def test_channel_tile_through_rank_5_is_a_gather() -> None:
    data = _chain_model("float32", [1, 2, 3, 4], [("RESHAPE", [1, 2, 3, 1, 4], [1, 2, 3, 1, 4]),
                                                   ("TILE", [1, 1, 1, 3, 1], [1, 2, 3, 3, 4]),
                                                   ("RESHAPE", [1, 2, 3, 12], [1, 2, 3, 12])])
    assert "GATHER along axes [3]" in str(nnapi.load_tflite(data).lowerings[0])
    x = np.random.default_rng(6).standard_normal((1, 2, 3, 4)).astype(np.float32)
    _assert_exact_on_every_engine(data, {"x": x}, {"y": np.tile(x, (1, 1, 1, 3))})


def test_window_partition_through_rank_6_is_a_rank_4_transpose() -> None:
    """A Swin-style window partition: RESHAPE to rank 6, TRANSPOSE, RESHAPE to the windows:
    one rank-4 TRANSPOSE once the size-1 batch is dropped and neighbouring axes merged."""
    steps = [("RESHAPE", [1, 2, 2, 3, 2, 3], [1, 2, 2, 3, 2, 3]),
             ("TRANSPOSE", [0, 1, 3, 2, 4, 5], [1, 2, 3, 2, 2, 3]),
             ("RESHAPE", [6, 2, 2, 3], [6, 2, 2, 3])]
    data = _chain_model("float32", [1, 4, 6, 3], steps)
    assert "TRANSPOSE [0, 2, 1, 3]" in str(nnapi.load_tflite(data).lowerings[0])
    x = np.random.default_rng(7).standard_normal((1, 4, 6, 3)).astype(np.float32)
    want = x.reshape(1, 2, 2, 3, 2, 3).transpose(0, 1, 3, 2, 4, 5).reshape(6, 2, 2, 3)
    _assert_exact_on_every_engine(data, {"x": x}, {"y": want})



def test_window_merge_with_a_projection_through_rank_6() -> None:
    """A Swin window merge as the converter writes it: RESHAPE of the windows to rank 6, the
    attention's output projection (FULLY_CONNECTED keeping the rank) there, TRANSPOSE,
    RESHAPE to the image: the projection runs on the rows, the moves after it as one
    rank-4 TRANSPOSE. Integer values: every sum exact, so every engine gives the same."""
    from tflite_builder import Operator, Subgraph, Tensor, build

    rng = np.random.default_rng(8)
    w = rng.integers(-3, 4, (5, 3)).astype(np.float32)
    b = rng.integers(-3, 4, 5).astype(np.float32)
    t = [Tensor("x", "float32", [4, 4, 3]),
         Tensor("s6", "int32", [6], data=np.array([1, 2, 2, 2, 2, 3], np.int32)),
         Tensor("r", "float32", [1, 2, 2, 2, 2, 3]), Tensor("w", "float32", [5, 3], data=w),
         Tensor("b", "float32", [5], data=b), Tensor("f", "float32", [1, 2, 2, 2, 2, 5]),
         Tensor("perm", "int32", [6], data=np.array([0, 1, 3, 2, 4, 5], np.int32)),
         Tensor("t", "float32", [1, 2, 2, 2, 2, 5]),
         Tensor("s4", "int32", [4], data=np.array([1, 4, 4, 5], np.int32)), Tensor("y", "float32", [1, 4, 4, 5])]
    ops = [Operator("RESHAPE", [0, 1], [2], ("ReshapeOptions", {"NewShape": [1, 2, 2, 2, 2, 3]})),
           Operator("FULLY_CONNECTED", [2, 3, 4], [5], ("FullyConnectedOptions", {"KeepNumDims": True})),
           Operator("TRANSPOSE", [5, 6], [7]),
           Operator("RESHAPE", [7, 8], [9], ("ReshapeOptions", {"NewShape": [1, 4, 4, 5]}))]
    data = build(Subgraph(t, ops, [0], [9]))
    assert "FULLY_CONNECTED + TRANSPOSE + RESHAPE through rank 6" in str(nnapi.load_tflite(data).lowerings[0])
    x = rng.integers(-4, 5, (4, 4, 3)).astype(np.float32)
    want = (x.reshape(1, 2, 2, 2, 2, 3) @ w.T + b).transpose(0, 1, 3, 2, 4, 5).reshape(1, 4, 4, 5)
    _assert_exact_on_every_engine(data, {"x": x}, {"y": want.astype(np.float32)})

def _split_model(kind: str, scale: float | None, branches: str) -> bytes:
    """Attention's query / key / value split through rank 5, as converters write it: x
    [1, 4, 24] RESHAPEd to [1, 4, 3, 2, 4] (tokens, q/k/v, heads, depth); ``branches``
    "torch" (ai-edge-torch: TRANSPOSE (2, 0, 3, 1, 4), three SLICEs, RESHAPEs to [1, 2, 4,
    4]), "onnx2tf" (three STRIDED_SLICEs of the q/k/v axis, one with a shrink mask, RESHAPEs to
    [4, 2, 4]) or "reversed" (one STRIDED_SLICE with stride -1: no rank-4 slice gives it)."""
    from tflite_builder import Operator, Subgraph, Tensor, build

    q = {"scale": scale, "zero_point": -3} if scale is not None else {}
    t = [Tensor("x", kind, [1, 4, 24], **q), Tensor("s5", "int32", [5], data=np.array([1, 4, 3, 2, 4], np.int32)),
         Tensor("r", kind, [1, 4, 3, 2, 4], **q)]
    ops = [Operator("RESHAPE", [0, 1], [2], ("ReshapeOptions", {"NewShape": [1, 4, 3, 2, 4]}))]

    def add(tensor) -> int:
        t.append(tensor)
        return len(t) - 1

    outputs = []
    if branches == "torch":
        perm = add(Tensor("perm", "int32", [5], data=np.array([2, 0, 3, 1, 4], np.int32)))
        moved = add(Tensor("p", kind, [3, 1, 2, 4, 4], **q))
        ops.append(Operator("TRANSPOSE", [2, perm], [moved]))
        size = add(Tensor("size", "int32", [5], data=np.array([1, 1, 2, 4, 4], np.int32)))
        shape = add(Tensor("s4", "int32", [4], data=np.array([1, 2, 4, 4], np.int32)))
        for k in range(3):
            begin = add(Tensor(f"b{k}", "int32", [5], data=np.array([k, 0, 0, 0, 0], np.int32)))
            part = add(Tensor(f"part{k}", kind, [1, 1, 2, 4, 4], **q))
            ops.append(Operator("SLICE", [moved, begin, size], [part]))
            outputs.append(add(Tensor("qkv"[k], kind, [1, 2, 4, 4], **q)))
            ops.append(Operator("RESHAPE", [part, shape], [outputs[-1]],
                                ("ReshapeOptions", {"NewShape": [1, 2, 4, 4]})))
    else:
        shape = add(Tensor("s3", "int32", [3], data=np.array([4, 2, 4], np.int32)))
        for k in range(1 if branches == "reversed" else 3):
            stop = -4 if branches == "reversed" else k + 1
            begin = add(Tensor(f"b{k}", "int32", [5], data=np.array([0, 0, k, 0, 0], np.int32)))
            end = add(Tensor(f"e{k}", "int32", [5], data=np.array([1, 4, stop, 2, 4], np.int32)))
            strides = add(Tensor(f"st{k}", "int32", [5], data=np.array(
                [1, 1, 1, 1, -1 if branches == "reversed" else 1], np.int32)))
            shrink = 4 if k == 1 else 0
            part = add(Tensor(f"part{k}", kind, [1, 4, 2, 4] if shrink else [1, 4, 1, 2, 4], **q))
            options = {"ShrinkAxisMask": shrink, "BeginMask": 16 if branches == "reversed" else 0,
                       "EndMask": 16 if branches == "reversed" else 0}
            ops.append(Operator("STRIDED_SLICE", [2, begin, end, strides], [part], ("StridedSliceOptions", options)))
            outputs.append(add(Tensor("qkv"[k], kind, [4, 2, 4], **q)))
            ops.append(Operator("RESHAPE", [part, shape], [outputs[-1]], ("ReshapeOptions", {"NewShape": [4, 2, 4]})))
    return build(Subgraph(t, ops, [0], outputs))


@pytest.mark.parametrize("branches", ["torch", "onnx2tf"])
@pytest.mark.parametrize("kind, scale", [("float32", None), ("int8", 0.25)])
def test_attention_split_through_rank_5_is_imported_exactly(branches: str, kind: str, scale) -> None:
    """The query / key / value split through rank 5 (one RESHAPE read by three branches of
    element moves) imports as one rank-4 RESHAPE / STRIDED_SLICE / TRANSPOSE / RESHAPE
    plan per branch, exact on every engine."""
    data = _split_model(kind, scale, branches)
    lowerings = [str(lowering) for lowering in nnapi.load_tflite(data).lowerings]
    assert len(lowerings) == 1 and "3 branches of element moves through rank 5" in lowerings[0], lowerings
    rng = np.random.default_rng(9)
    x = rng.integers(-128, 128, (1, 4, 24)).astype(np.int8) if kind == "int8" else \
        rng.standard_normal((1, 4, 24)).astype(np.float32)
    r = x.reshape(1, 4, 3, 2, 4)
    if branches == "torch":
        want = {name: r.transpose(2, 0, 3, 1, 4)[k].reshape(1, 2, 4, 4) for k, name in enumerate("qkv")}
    else:
        want = {name: r[0, :, k] for k, name in enumerate("qkv")}
    _assert_exact_on_every_engine(data, {"x": x}, want)


@pytest.mark.parametrize("shape, pick, found", [
    ([1, 6, 24], lambda a: a.reshape(1, 6, 3, 2, 4).transpose(2, 0, 3, 1, 4)[1].reshape(1, 2, 6, 4), True),
    ([4, 6], lambda a: a[1:3, 1:5].T, True), ([2, 6], lambda a: a[:, ::2], True),
    ([3, 8], lambda a: a[:, 1:7:3].T[None], True), ([5], lambda a: a[3:4], True),
    ([2, 3, 4], lambda a: a.transpose(2, 0, 1), True), ([4, 6], lambda a: a[:, ::-1], False),
    ([4, 6], lambda a: a[:, [0, 0, 1]], False), ([6], lambda a: a[[0, 1, 3]], False)])
def test_move_plan_gives_the_positions_or_none(shape: list[int], pick, found: bool) -> None:
    """moves.move_plan: a strided box in any order is one rank-4 plan giving exactly
    the positions; reversals, repeats and uneven picks have none."""
    from nnapi.importers.tflite.moves import move_plan

    source = np.arange(int(np.prod(shape)))
    index = pick(source.reshape(shape))
    plan = move_plan(shape, index)
    assert (plan is not None) == found
    if plan is not None:
        assert np.array_equal(plan.apply(source, list(index.shape)), index)


def test_quantized_split_through_rank_5_carries_its_quantize_and_dequantize() -> None:
    """PT2E's query / key / value split as ai-edge-torch writes it (Swin): the int8 rows
    RESHAPEd to rank 5, a requantizing QUANTIZE, the TRANSPOSE, then q SLICEd as int8 and
    k / v after a DEQUANTIZE of the whole rank-5 tensor. The QUANTIZE / DEQUANTIZE act on
    each element alone, so each branch moves the int8 source and applies them on its end;
    the scales (0.25 -> 0.125) make the requantization exact: 2 (x + 3) + 5, clamped."""
    from tflite_builder import Operator, Subgraph, Tensor, build

    q1, q2 = {"scale": 0.25, "zero_point": -3}, {"scale": 0.125, "zero_point": 5}
    t = [Tensor("x", "int8", [1, 4, 24], **q1), Tensor("s5", "int32", [5], data=np.array([1, 4, 3, 2, 4], np.int32)),
         Tensor("r", "int8", [1, 4, 3, 2, 4], **q1), Tensor("rq", "int8", [1, 4, 3, 2, 4], **q2),
         Tensor("perm", "int32", [5], data=np.array([2, 0, 3, 1, 4], np.int32)),
         Tensor("p", "int8", [3, 1, 2, 4, 4], **q2), Tensor("pf", "float32", [3, 1, 2, 4, 4]),
         Tensor("size", "int32", [5], data=np.array([1, 1, 2, 4, 4], np.int32)),
         Tensor("s4", "int32", [4], data=np.array([1, 2, 4, 4], np.int32))]
    ops = [Operator("RESHAPE", [0, 1], [2], ("ReshapeOptions", {"NewShape": [1, 4, 3, 2, 4]})),
           Operator("QUANTIZE", [2], [3]), Operator("TRANSPOSE", [3, 4], [5]), Operator("DEQUANTIZE", [5], [6])]
    outputs = []
    for k in range(3):
        source, kind, q = (5, "int8", q2) if k == 0 else (6, "float32", {})
        t.append(Tensor(f"b{k}", "int32", [5], data=np.array([k, 0, 0, 0, 0], np.int32)))
        t.append(Tensor(f"part{k}", kind, [1, 1, 2, 4, 4], **q))
        t.append(Tensor("qkv"[k], kind, [1, 2, 4, 4], **q))
        ops.append(Operator("SLICE", [source, len(t) - 3, 7], [len(t) - 2]))
        ops.append(Operator("RESHAPE", [len(t) - 2, 8], [len(t) - 1], ("ReshapeOptions", {"NewShape": [1, 2, 4, 4]})))
        outputs.append(len(t) - 1)
    data = build(Subgraph(t, ops, [0], outputs))
    lowerings = [str(lowering) for lowering in nnapi.load_tflite(data).lowerings]
    assert any("3 branches of element moves through rank 5" in text and
               "then its DEQUANTIZE / QUANTIZE on the branch's end" in text for text in lowerings), lowerings
    x = np.random.default_rng(11).integers(-128, 128, (1, 4, 24)).astype(np.int8)
    requantized = np.clip(2 * (x.astype(np.int32) + 3) + 5, -128, 127)
    moved = requantized.reshape(1, 4, 3, 2, 4).transpose(2, 0, 3, 1, 4)
    want = {"q": moved[0].reshape(1, 2, 4, 4).astype(np.int8)}
    want.update({name: ((moved[k] - 5) * 0.125).reshape(1, 2, 4, 4).astype(np.float32)
                 for k, name in ((1, "k"), (2, "v"))})
    _assert_exact_on_every_engine(data, {"x": x}, want)


def test_reversing_branch_through_rank_5_is_still_refused() -> None:
    """A branch that no rank-4 slice and transpose give (a reversal) keeps the refusal."""
    with pytest.raises(nnapi.BadDataError, match=r"operator 1 \(STRIDED_SLICE\).*rank at most 4, got 5"):
        nnapi.load_tflite(_split_model("float32", None, "reversed"))


@pytest.mark.parametrize("mask_kind", ["input", "constant"])
def test_window_mask_add_through_rank_5_is_computed_on_merged_axes(mask_kind: str) -> None:
    """Swin's shifted-window attention as ai-edge-torch writes it: the scores [windows,
    heads, n, n] RESHAPEd to [1, windows, heads, n, n], the mask [windows, n, n] to [1,
    windows, 1, n, n], ADD, RESHAPE back: the ADD runs on merged axes ([2, 3, 16] + [2, 1,
    16]), exact on every engine."""
    from tflite_builder import Operator, Subgraph, Tensor, build

    rng = np.random.default_rng(10)
    mask = rng.standard_normal((2, 4, 4)).astype(np.float32)
    t = [Tensor("x", "float32", [2, 3, 4, 4]),
         Tensor("m", "float32", [2, 4, 4], data=mask if mask_kind == "constant" else None),
         Tensor("s5x", "int32", [5], data=np.array([1, 2, 3, 4, 4], np.int32)),
         Tensor("s5m", "int32", [5], data=np.array([1, 2, 1, 4, 4], np.int32)),
         Tensor("x5", "float32", [1, 2, 3, 4, 4]), Tensor("m5", "float32", [1, 2, 1, 4, 4]),
         Tensor("sum", "float32", [1, 2, 3, 4, 4]),
         Tensor("s4", "int32", [4], data=np.array([2, 3, 4, 4], np.int32)), Tensor("y", "float32", [2, 3, 4, 4])]
    ops = [Operator("RESHAPE", [0, 2], [4], ("ReshapeOptions", {"NewShape": [1, 2, 3, 4, 4]})),
           Operator("RESHAPE", [1, 3], [5], ("ReshapeOptions", {"NewShape": [1, 2, 1, 4, 4]})),
           Operator("ADD", [4, 5], [6], ("AddOptions", {})),
           Operator("RESHAPE", [6, 7], [8], ("ReshapeOptions", {"NewShape": [2, 3, 4, 4]}))]
    data = build(Subgraph(t, ops, [0] if mask_kind == "constant" else [0, 1], [8]))
    lowerings = [str(lowering) for lowering in nnapi.load_tflite(data).lowerings]
    assert any("ADD of rank 5 on merged axes [2, 3, 16]" in text for text in lowerings), lowerings
    x = rng.standard_normal((2, 3, 4, 4)).astype(np.float32)
    feeds = {"x": x} if mask_kind == "constant" else {"x": x, "m": mask}
    _assert_exact_on_every_engine(data, feeds, {"y": x + mask[:, None]})


def _group_norm_model(quantized: bool, rank5: bool = True) -> bytes:
    """GroupNormalization as Keras 3 writes it (float: RESHAPE [1, 4, 4, 8] to [1, 4, 4, 2,
    4] groups, MEAN over h, w and each group's channels, NEG, SUB, SQUARE, MEAN, ADD eps,
    RSQRT, MUL, MUL, ADD, RESHAPE back). quantized: its int8 form (requantizing MEANs,
    SUB, MUL d * d, DEQUANTIZE, RSQRT in float, QUANTIZE, MUL d * r). rank5=False: the
    same operators on the rank-4 view [1, 16, 2, 4] (MEAN over axes 1 and 3)."""
    from tflite_builder import Operator, Subgraph, Tensor, build

    big = [1, 4, 4, 2, 4] if rank5 else [1, 16, 2, 4]
    small = [1, 1, 1, 2, 1] if rank5 else [1, 1, 2, 1]
    axes = [1, 2, 4] if rank5 else [1, 3]
    t = [Tensor("x", "int8" if quantized else "float32", [1, 4, 4, 8], scale=0.05 if quantized else None,
                zero_point=0 if quantized else None),
         Tensor("s5", "int32", [len(big)], data=np.array(big, np.int32)),
         Tensor("axes", "int32", [len(axes)], data=np.array(axes, np.int32)),
         Tensor("s4", "int32", [4], data=np.array([1, 4, 4, 8], np.int32))]

    def tensor(name: str, shape: list[int], dtype: str = "float32", **quant) -> int:
        t.append(Tensor(name, dtype, shape, **quant))
        return len(t) - 1

    def reshape(source: int, shape: int, target: int, new: list[int]) -> Operator:
        return Operator("RESHAPE", [source, shape], [target], ("ReshapeOptions", {"NewShape": new}))

    mean = ("ReducerOptions", {"KeepDims": True})
    if quantized:
        q = {"dtype": "int8"}
        x5 = tensor("x5", big, scale=0.05, zero_point=0, **q)
        m = tensor("m", small, scale=0.01, zero_point=3, **q)
        d = tensor("d", big, scale=0.05, zero_point=-2, **q)
        dd = tensor("dd", big, scale=0.04, zero_point=-128, **q)
        v = tensor("v", small, scale=0.02, zero_point=-128, **q)
        vf, rf = tensor("vf", small), tensor("rf", small)
        r = tensor("r", small, scale=0.03, zero_point=-128, **q)
        y5 = tensor("y5", big, scale=0.03, zero_point=1, **q)
        y = tensor("y", [1, 4, 4, 8], scale=0.03, zero_point=1, **q)
        ops = [reshape(0, 1, x5, big), Operator("MEAN", [x5, 2], [m], mean),
               Operator("SUB", [x5, m], [d], ("SubOptions", {})), Operator("MUL", [d, d], [dd], ("MulOptions", {})),
               Operator("MEAN", [dd, 2], [v], mean), Operator("DEQUANTIZE", [v], [vf]),
               Operator("RSQRT", [vf], [rf]), Operator("QUANTIZE", [rf], [r]),
               Operator("MUL", [d, r], [y5], ("MulOptions", {})), reshape(y5, 3, y, [1, 4, 4, 8])]
        return build(Subgraph(t, ops, [0], [y]))
    x5, m, n, d, dd, v = (tensor(name, shape) for name, shape in
                          (("x5", big), ("m", small), ("n", small), ("d", big), ("dd", big), ("v", small)))
    eps = len(t)
    t.append(Tensor("eps", "float32", [], data=np.array(1e-3, np.float32)))
    ve, r, a, b, y5, y = (tensor(name, shape) for name, shape in
                          (("ve", small), ("r", small), ("a", big), ("b", small), ("y5", big), ("y", [1, 4, 4, 8])))
    ops = [reshape(0, 1, x5, big), Operator("MEAN", [x5, 2], [m], mean), Operator("NEG", [m], [n]),
           Operator("SUB", [x5, m], [d], ("SubOptions", {})), Operator("SQUARE", [d], [dd]),
           Operator("MEAN", [dd, 2], [v], mean), Operator("ADD", [v, eps], [ve], ("AddOptions", {})),
           Operator("RSQRT", [ve], [r]), Operator("MUL", [x5, r], [a], ("MulOptions", {})),
           Operator("MUL", [n, r], [b], ("MulOptions", {})), Operator("ADD", [a, b], [y5], ("AddOptions", {})),
           reshape(y5, 3, y, [1, 4, 4, 8])]
    return build(Subgraph(t, ops, [0], [y]))


def test_group_norm_through_rank_5_reduces_on_merged_axes() -> None:
    """Keras' GroupNormalization: the MEANs of the rank-5 groups run on merged axes ([16, 2,
    4] over axes 0 and 2), NEG / SQUARE / RSQRT of rank-5 tensors on their rank-4 operands,
    the arithmetic on merged axes; no operand above rank 4. It was refused (MEAN: rank at
    most 4, got 5)."""
    data = _group_norm_model(quantized=False)
    lowerings = [str(lowering) for lowering in nnapi.load_tflite(data).lowerings]
    assert any("MEAN of rank 5 on merged axes: over axes [0, 2] of [16, 2, 4]" in text for text in lowerings), \
        lowerings
    assert any("NEG of rank 5 on the rank-3 operand holding its elements" in text for text in lowerings), lowerings
    x = np.random.default_rng(12).standard_normal((1, 4, 4, 8)).astype(np.float32)
    groups = x.astype(np.float64).reshape(1, 4, 4, 2, 4)
    mean = groups.mean(axis=(1, 2, 4), keepdims=True)
    variance = ((groups - mean) ** 2).mean(axis=(1, 2, 4), keepdims=True)
    want = {"y": ((groups - mean) / np.sqrt(variance + 1e-3)).reshape(1, 4, 4, 8).astype(np.float32)}
    for device in ("nnapi-reference", "nnapi-ort-cpu"):
        session = _session_on(data, device)
        if session is not None:
            assert_agrees(session.run({"x": x}), want, 1e-5)
    if Interpreter is not None:
        assert_agrees(litert_outputs(data, {"x": x}), want, 1e-5)


def test_int8_group_norm_through_rank_5_equals_its_rank_4_form() -> None:
    """The int8 GroupNormalization: requantizing MEANs, SUB and MUL of the rank-5 tensors,
    DEQUANTIZE / QUANTIZE around a float RSQRT, all on rank <= 4 operands; its outputs are
    those of the same operators written on the rank-4 view, and within a step of LiteRT's."""
    data = _group_norm_model(quantized=True)
    twin = _group_norm_model(quantized=True, rank5=False)
    x = np.random.default_rng(13).integers(-128, 128, (1, 4, 4, 8)).astype(np.int8)
    for device in ("nnapi-reference", "nnapi-ort-cpu"):
        session = _session_on(data, device)
        if session is not None:
            got = session.run({"x": x})
            assert_agrees(got, _session_on(twin, device).run({"x": x}), 0)
            assert len(np.unique(got["y"])) > 20  # a real normalization, not a saturated constant
            if Interpreter is not None:
                assert_agrees(got, litert_outputs(data, {"x": x}), 1)


def test_rank_5_chain_that_computes_is_still_refused() -> None:
    """A rank-5 tensor read by an operator of its axes (SOFTMAX), not element moves or
    element-wise operators, stays refused, naming the rule."""
    from tflite_builder import Operator, Subgraph, Tensor, build

    t = [Tensor("x", "float32", [1, 2, 2, 2]), Tensor("s", "int32", [5], data=np.array([1, 2, 1, 2, 2], np.int32)),
         Tensor("r", "float32", [1, 2, 1, 2, 2]), Tensor("a", "float32", [1, 2, 1, 2, 2]),
         Tensor("s4", "int32", [4], data=np.array([1, 2, 2, 2], np.int32)), Tensor("y", "float32", [1, 2, 2, 2])]
    data = build(Subgraph(t, [Operator("RESHAPE", [0, 1], [2], ("ReshapeOptions", {"NewShape": [1, 2, 1, 2, 2]})),
                              Operator("SOFTMAX", [2], [3], ("SoftmaxOptions", {"Beta": 1.0})),
                              Operator("RESHAPE", [3, 4], [5], ("ReshapeOptions", {"NewShape": [1, 2, 2, 2]}))],
                          [0], [5]))
    with pytest.raises(nnapi.BadDataError, match=r"operator 1 \(SOFTMAX\).*rank at most 4, got 5"):
        nnapi.load_tflite(data)


def test_requantizing_reduce_max_is_refused() -> None:
    # TFLite's own kernel requires one scale for input and output; so does the importer.
    from tflite_cases import reduce_max_int8_rescale

    with pytest.raises(nnapi.BadDataError, match=r"operator 0 \(REDUCE_MAX\): quantized REDUCE_MAX needs"):
        nnapi.load_tflite(reduce_max_int8_rescale())


def test_if_branches_follow_the_condition() -> None:
    session = nnapi.Session(CASES["if_branches"].build())
    a = np.full((2, 2), 3, np.float32)
    b = np.full((2, 2), 2, np.float32)
    assert session.run({"cond": np.array([True]), "a": a, "b": b})["y"].tolist() == [[5, 5], [5, 5]]
    assert session.run({"cond": np.array([False]), "a": a, "b": b})["y"].tolist() == [[6, 6], [6, 6]]


# --- Session --------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def recrop() -> nnapi.Session:
    return nnapi.Session(MODELS / "hand_recrop.tflite")


def test_session_describes_inputs_and_outputs(recrop: nnapi.Session) -> None:
    assert [(i.name, i.dtype, i.shape) for i in recrop.inputs] == [("input_1", np.dtype(np.float32),
                                                                     (1, 256, 256, 3))]
    assert [(o.name, o.dtype, o.shape) for o in recrop.outputs] == [("output_crop", np.dtype(np.float32),
                                                                      (1, 1, 1, 4))]
    assert recrop.compile_seconds > 0


@pytest.mark.parametrize("value, message", [
    (np.zeros((1, 256, 256, 3), np.float64), r"input 'input_1': expected dtype float32, got float64"),
    (np.zeros((1, 255, 256, 3), np.float32),
     r"input 'input_1': expected shape \[1, 256, 256, 3\], got \[1, 255, 256, 3\]"),
    (np.zeros((256, 256, 3), np.float32), r"expected shape \[1, 256, 256, 3\], got \[256, 256, 3\]"),
    ("pixels", r"input 'input_1': expected a numpy array, got str"),
])
def test_session_rejects_wrong_inputs_by_name(recrop: nnapi.Session, value, message: str) -> None:
    with pytest.raises(nnapi.BadDataError, match=message):
        recrop.run({"input_1": value})


def test_session_rejects_missing_and_unknown_inputs(recrop: nnapi.Session) -> None:
    with pytest.raises(nnapi.BadDataError, match="input 'input_1' is missing"):
        recrop.run({})
    with pytest.raises(nnapi.BadDataError, match="no input named 'image'"):
        recrop.run({"image": np.zeros(3, np.float32)})


def test_session_rejects_unknown_device_and_objects() -> None:
    with pytest.raises(nnapi.BadDataError, match="no device named 'tpu'"):
        nnapi.Session(MODELS / "hand_recrop.tflite", devices=["tpu"])
    with pytest.raises(nnapi.BadDataError, match="expected a model path"):
        nnapi.Session(42)


def test_session_carries_lstm_state_between_runs() -> None:
    path = MODELS / "lstm_1x20x40_128_fused.tflite"
    session = nnapi.Session(path)
    assert [state.name for state in session.states] == ["arith.constant3", "arith.constant14"]
    feeds = random_inputs(session.inputs, seed=3)
    first = session.run(feeds)
    second = session.run(feeds)
    name = session.outputs[0].name
    assert not np.array_equal(first[name], second[name])
    if Interpreter is not None:  # LiteRT keeps its variable tensors between invocations too
        interpreter = Interpreter(model_path=str(path), num_threads=1)
        interpreter.allocate_tensors()
        for expected in (first, second):
            interpreter.set_tensor(interpreter.get_input_details()[0]["index"], feeds[session.inputs[0].name])
            interpreter.invoke()
            want = interpreter.get_tensor(interpreter.get_output_details()[0]["index"])
            np.testing.assert_allclose(expected[name], want, rtol=0, atol=1e-5 * np.abs(want).max())
    session.reset_states()
    np.testing.assert_array_equal(session.run(feeds)[name], first[name])


def test_session_run_failure_names_the_tflite_operator() -> None:
    session = nnapi.Session(CASES["embedding_lookup"].build())
    with pytest.raises(nnapi.OpFailedError, match=r"lookups must be in \[0, 2\) \[from tflite operator 0 "
                                                 r"\(EMBEDDING_LOOKUP\)\]"):
        session.run({"ids": np.array([0, 5, 1], np.int32)})


def test_corrupted_models_raise_only_nnapi_errors() -> None:
    data = (MODELS / "lstm_1x20x40_128_while.tflite").read_bytes()
    rng = np.random.default_rng(11)
    for _ in range(60):
        corrupted = bytearray(data)
        for _ in range(int(rng.integers(1, 12))):
            corrupted[int(rng.integers(8, 4096))] = int(rng.integers(0, 256))
        try:
            nnapi.Session(bytes(corrupted))
        except nnapi.NnapiError:
            pass  # anything else escaping is the bug this test looks for


@pytest.mark.parametrize("static_shapes", [None, False, True])
def test_truncated_model_names_the_flatbuffer_error(static_shapes: bool | None) -> None:
    # A file cut short (a partial download) fails in the flatbuffer reader, before there is
    # an importer to retry at static shapes: the reader's own reason is the message, not an
    # error of the import's retry logic.
    data = (MODELS / "hand_recrop.tflite").read_bytes()
    with pytest.raises(nnapi.BadDataError) as info:
        nnapi.load_tflite(data[:4096], static_shapes=static_shapes)
    message = str(info.value)
    assert message.startswith("not a valid TensorFlow Lite model (error: unpack_from requires a buffer")
    assert "(actual buffer size is 4096)" in message
    assert "UnboundLocalError" not in message


def test_session_runs_a_plain_model() -> None:
    model = nnapi.Model()
    f32 = nnapi.OperandType(nnapi.OperandCode.TENSOR_FLOAT32, [0])  # any length
    a, b = model.add_operand(f32), model.add_operand(f32)
    act = model.add_operand(nnapi.OperandType(nnapi.OperandCode.INT32))
    out = model.add_operand(nnapi.OperandType(nnapi.OperandCode.TENSOR_FLOAT32, [0]))
    model.set_operand_value(act, 0)
    model.add_operation(nnapi.OperationCode.ADD, [a, b, act], [out])
    model.identify_inputs_and_outputs([a, b], [out])
    model.finish()
    session = nnapi.Session(model)
    assert [i.name for i in session.inputs] == ["input0", "input1"]
    assert session.outputs[0].shape == (-1,)
    result = session.run({"input0": np.array([1, 2], np.float32), "input1": np.array([3, 4], np.float32)})
    np.testing.assert_array_equal(result["output0"], [4, 6])
    # An output larger than the first buffer offered: the runtime reports the shape, run retries.
    x = np.arange(100_000, dtype=np.float32)
    np.testing.assert_array_equal(session.run({"input0": x, "input1": x})["output0"], 2 * x)


@pytest.mark.parametrize("masks, message", [
    ({"EllipsisMask": 5}, "more than one ellipsis"),
    ({"Offset": True, "BeginMask": 1}, "offset together with"),
])
def test_strided_slice_without_an_nnapi_meaning_is_refused(masks: dict, message: str) -> None:
    from tflite_cases import _strided_slice

    make = _strided_slice([2, 3, 4], [0, 0, 0], [1, 1, 1], [1, 1, 1], [1, 3, 4], **masks)
    with pytest.raises(nnapi.BadDataError, match=rf"operator 0 \(STRIDED_SLICE\): .*{message}"):
        nnapi.load_tflite(make())


def test_strided_slice_naming_too_many_axes_is_refused() -> None:
    from tflite_cases import _strided_slice

    make = _strided_slice([2, 3], [0, 0, 0], [1, 1, 1], [1, 1, 1], [1, 1, 1])
    with pytest.raises(nnapi.BadDataError, match=r"operator 0 \(STRIDED_SLICE\): .*more axes than the input's 2"):
        nnapi.load_tflite(make())


@pytest.mark.parametrize("make, message", [
    (lambda q: q.integer_lstm(sequence=False, cell_type="int8"),
     r"cell state 19 \(c\) is INT8 \(TFLite's 8x8_8 kernel\)"),
    (lambda q: q.integer_lstm(sequence=True, steps=2, peephole=True, output=3),
     "peephole weights with a projection to 3 of 4 units"),
    (lambda q: q.integer_lstm(sequence=False, layer_norm=True, layer_norm_spread=30.0),
     "variance guard"),
    (lambda q: q.basic_uint8_lstm(input_scale=0.01), "QUANTIZED_16BIT_LSTM"),
])
def test_integer_lstm_without_an_exact_nnapi_form_is_refused(make, message: str) -> None:
    import tflite_qlstm_cases

    with pytest.raises(nnapi.BadDataError, match=rf"operator 0 \((UNIDIRECTIONAL_SEQUENCE_)?LSTM\): .*{message}"):
        nnapi.load_tflite(make(tflite_qlstm_cases))


def test_quantized_variable_tensors_start_at_their_zero_point() -> None:
    # TFLite resets a quantized variable tensor to the raw value of real 0, its zero point.
    from tflite_qlstm_cases import OUTPUT_STATE_ZERO_POINT, integer_lstm

    assert OUTPUT_STATE_ZERO_POINT != 0
    imported = nnapi.load_tflite(integer_lstm(sequence=False))
    initial = {state.name: state.initial for state in imported.states}
    assert initial["h"].dtype == np.int8 and np.all(initial["h"] == OUTPUT_STATE_ZERO_POINT)
    assert initial["c"].dtype == np.int16 and np.all(initial["c"] == 0)


def test_integer_sequence_lstm_carries_its_states_between_runs() -> None:
    from tflite_qlstm_cases import integer_lstm

    data = integer_lstm(sequence=True, steps=3, layer_norm=True)
    session = nnapi.Session(data, devices=["nnapi-reference"])
    assert [state.name for state in session.states] == ["h", "c"]
    feeds = random_inputs(session.inputs, seed=4)
    first, second = session.run(feeds)["y"], session.run(feeds)["y"]
    assert not np.array_equal(first, second)
    if Interpreter is not None:  # LiteRT keeps its variable tensors between invocations too
        interpreter = Interpreter(model_content=data, num_threads=1)
        interpreter.allocate_tensors()
        for expected in (first, second):
            interpreter.set_tensor(interpreter.get_input_details()[0]["index"], feeds["x"])
            interpreter.invoke()
            want = interpreter.get_tensor(interpreter.get_output_details()[0]["index"])
            np.testing.assert_array_equal(expected, want)


def test_sequence_lstm_with_diagonal_recurrent_weights_is_refused() -> None:
    from tflite_builder import Operator, Subgraph, Tensor, build

    units, inputs = 2, 3
    tensors = [Tensor("x", "float32", [1, 2, inputs])]
    tensors += [Tensor(f"w{g}", "float32", [units, inputs], data=np.ones((units, inputs), np.float32)) for g in "ifco"]
    tensors += [Tensor(f"r{g}", "float32", [units], data=np.ones(units, np.float32)) for g in "ifco"]
    tensors += [Tensor(f"b{g}", "float32", [units], data=np.zeros(units, np.float32)) for g in "ifco"]
    tensors += [Tensor("h", "float32", [1, units], variable=True), Tensor("c", "float32", [1, units], variable=True),
                Tensor("y", "float32", [1, 2, units])]
    slots = [0, *range(1, 9), -1, -1, -1, *range(9, 13), -1, -1, 13, 14, -1, -1, -1, -1]
    op = Operator("UNIDIRECTIONAL_SEQUENCE_LSTM", slots, [15],
                  ("UnidirectionalSequenceLSTMOptions",
                   {"FusedActivationFunction": 4, "DiagonalRecurrentTensors": True}))
    with pytest.raises(nnapi.BadDataError, match=r"operator 0 \(UNIDIRECTIONAL_SEQUENCE_LSTM\): diagonal recurrent"):
        nnapi.load_tflite(build(Subgraph(tensors, [op], [0], [15])))


@pytest.mark.parametrize("per_channel", [True, False])
def test_fully_connected_on_a_run_time_batch(per_channel: bool) -> None:
    """A FULLY_CONNECTED whose batch is known only at run time (per-channel int8 weights,
    or float keeping the input's rank) imports with RESHAPEs to -1 (it was refused) and
    computes every row of a batch of 3 as numpy does, on each device."""
    from tflite_cases import fully_connected_dynamic_batch

    data = fully_connected_dynamic_batch(per_channel)
    lowerings = [str(lowering) for lowering in nnapi.load_tflite(data).lowerings]
    assert any(("per-channel" if per_channel else "keep_num_dims") in text for text in lowerings), lowerings
    rng = np.random.default_rng(5)
    if per_channel:
        x = rng.integers(-128, 128, (3, 10)).astype(np.int8)
    else:
        x = rng.standard_normal((3, 3, 4)).astype(np.float32)
    expected = _fully_connected_reference(data, x)
    for device in ("nnapi-reference", "nnapi-ort-cpu"):
        session = _session_on(data, device)
        if session is None:
            continue
        got = session.run({"x": x})["y"]
        assert got.shape == expected.shape
        if per_channel:
            assert np.abs(got.astype(np.int32) - expected).max() <= 1   # a rounding tie at most
        else:
            np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
        single = session.run({"x": x[:1]})["y"]
        np.testing.assert_array_equal(single, got[:1])


def test_per_channel_fully_connected_rows_are_one_image() -> None:
    """Per-channel int8 FULLY_CONNECTED is a 1x1 CONV_2D over its rows as one image's
    height ([1, rows, 1, depth]), not a batch of 1x1 images: ONNX Runtime's QLinearConv
    runs a batch image by image (a ViT's 197 tokens: 197 matrix-vector products, ~6x the
    time of one matrix product). The values stay LiteRT's (the case's own check)."""
    from nnapi.codes import OperationCode
    from nnapi.runtime.model_builder import build_hal_model
    from tflite_cases import fully_connected_per_channel

    hal_model, _ = build_hal_model(nnapi.load_tflite(fully_connected_per_channel()).model)
    main = hal_model.main
    convs = [op for op in main.operations if op.type == OperationCode.CONV_2D]
    assert len(convs) == 1
    assert list(main.operands[convs[0].inputs[0]].dimensions) == [1, 2, 1, 10]
    assert list(main.operands[convs[0].outputs[0]].dimensions) == [1, 2, 1, 6]


def _fully_connected_reference(data: bytes, x: np.ndarray) -> np.ndarray:
    """numpy's FULLY_CONNECTED of the synthetic model (weights read back from its import)."""
    from tflite_cases import _rng

    rng = _rng(11)
    if x.dtype == np.float32:
        w = rng.standard_normal((5, 4)).astype(np.float32)
        b = rng.standard_normal(5).astype(np.float32)
        return (x.astype(np.float64) @ w.T.astype(np.float64) + b).astype(np.float32)
    w = rng.uniform(-1, 1, (6, 10)).astype(np.float32)
    scales = (np.abs(w).max(axis=1) / 127).astype(np.float32)
    bias_scales = (scales * np.float32(0.04)).astype(np.float32)
    wq = np.clip(np.round(w / scales[:, None]), -127, 127)
    bq = np.round(rng.uniform(-1, 1, 6) / bias_scales)
    acc = (x.astype(np.float64) - 2) @ wq.T + bq
    y = np.round(acc * (scales.astype(np.float64) * 0.04) / np.float32(0.03)) - 4
    return np.clip(y, -128, 127).astype(np.int32)


def _resize_model(dtype: str, size: tuple[int, int, int, int], half_pixel: bool, align: bool) -> bytes:
    from tflite_builder import Tensor, single_op

    h, w, oh, ow = size
    t = [Tensor("x", dtype, [1, h, w, 3], scale=0.05, zero_point=3),
         Tensor("size", "int32", [2], data=np.array([oh, ow], np.int32)),
         Tensor("y", dtype, [1, oh, ow, 3], scale=0.05, zero_point=3)]
    return single_op("RESIZE_BILINEAR", t, [0, 1], [2],
                     ("ResizeBilinearOptions", {"HalfPixelCenters": half_pixel, "AlignCorners": align}))


def _blend64(x: np.ndarray, size: tuple[int, int, int, int], half_pixel: bool, align: bool) -> np.ndarray:
    """TFLite's bilinear resize of ``x`` (NHWC) in float64, unrounded."""
    h, w, oh, ow = size

    def taps(n_in: int, n_out: int):
        scale = (n_in - 1) / (n_out - 1) if align and n_out > 1 else n_in / n_out
        pos = (np.arange(n_out) + 0.5) * scale - 0.5 if half_pixel else np.arange(n_out) * scale
        low = np.maximum(np.floor(pos), 0).astype(int)
        high = np.minimum(np.ceil(pos), n_in - 1).astype(int)
        return low, high, pos - low
    y0, y1, fy = taps(h, oh)
    x0, x1, fx = taps(w, ow)
    v = x.astype(np.float64)
    fy, fx = fy[None, :, None, None], fx[None, None, :, None]
    top = v[:, y0][:, :, x0] * (1 - fx) + v[:, y0][:, :, x1] * fx
    bottom = v[:, y1][:, :, x0] * (1 - fx) + v[:, y1][:, :, x1] * fx
    return top * (1 - fy) + bottom * fy


@pytest.mark.parametrize("dtype", ["uint8", "int8"])
@pytest.mark.parametrize("size, half_pixel, align", [
    ((1, 1, 9, 9), True, False), ((5, 5, 17, 17), True, False), ((8, 8, 16, 16), False, False),
    ((5, 7, 9, 13), False, True), ((13, 11, 40, 31), True, False)])
def test_quantized_resize_bilinear_rounds_as_litert(dtype: str, size, half_pixel: bool, align: bool) -> None:
    """A quantized TFLite RESIZE_BILINEAR rounds its blend to nearest, as LiteRT does (NNAPI's
    quantized kernel truncates, which put uint8 resizes ~0.5 step below LiteRT on average):
    uint8 exactly C's round of the blend of the stored integers on the reference device,
    within a step (float32 blends) elsewhere and for int8, and unbiased on average."""
    data = _resize_model(dtype, size, half_pixel, align)
    assert any("RESIZE_BILINEAR" in str(lowering) for lowering in nnapi.load_tflite(data).lowerings)
    info = np.iinfo(dtype)
    x = np.random.default_rng(4).integers(info.min, info.max + 1, (1, size[0], size[1], 3)).astype(dtype)
    blend = _blend64(x, size, half_pixel, align)
    rounded = np.copysign(np.floor(np.abs(blend) + 0.5), blend)    # C's round
    for device in ("nnapi-reference", "nnapi-ort-cpu"):
        session = _session_on(data, device)
        if session is None:
            continue
        got = session.run({"x": x})["y"].astype(np.float64)
        if dtype == "uint8" and device == "nnapi-reference":
            near_tie = np.abs(blend - np.floor(blend) - 0.5) < 1e-4
            np.testing.assert_array_equal(got[~near_tie], rounded[~near_tie])
        assert np.abs(got - rounded).max() <= 1.0
        assert abs(float((got - rounded).mean())) < 0.05    # truncation: 0.1 to 0.5
    if Interpreter is not None and dtype == "uint8":
        session = nnapi.Session(data, devices=["nnapi-reference"])
        expected = litert_outputs(data, {"x": x})
        assert np.abs(session.run({"x": x})["y"].astype(int) - expected["y"].astype(int)).max() <= 1


def test_pose_decoding_imports_and_agrees() -> None:
    """ARG_MAX -> FLOOR_DIV / FLOOR_MOD -> PACK of rank-0 int32 -> GATHER_ND (run-time
    indices of depth 1 to 3, constant ones), float FLOOR_DIV: refused before (GATHER_ND,
    FLOOR_DIV, FLOOR_MOD have no NNAPI operation; PACK of rank-0 tensors gave [2, 1]); now
    equal to numpy on each device, and to LiteRT."""
    from tflite_cases import pose_decoding, pose_decoding_reference

    data = pose_decoding()
    rng = np.random.default_rng(9)
    feeds = {"heat": rng.standard_normal((6, 7)).astype(np.float32),
             "offsets": rng.standard_normal((6, 7, 4)).astype(np.float32),
             "idx": np.stack([rng.integers(0, n, 5) for n in (5, 6, 7)], 1).astype(np.int32),
             "cube": rng.standard_normal((5, 6, 7)).astype(np.float32),
             "rows": np.array([[5], [0], [3]], np.int32),
             "a": np.array([7.5, -7.5, 3.0, -0.25], np.float32), "b": np.array([2.0, 2.0, -1.5, 4.0], np.float32),
             "ia": np.array([7, -7, 7, -7, 0, 13], np.int32), "ib": np.array([2, 2, -2, -2, 3, -5], np.int32)}
    expected = pose_decoding_reference(feeds)
    for device in ("nnapi-reference", "nnapi-ort-cpu"):
        session = _session_on(data, device)
        if session is None:
            continue
        got = session.run(feeds)
        for name, want in expected.items():
            np.testing.assert_array_equal(got[name], want, err_msg=f"{device} {name}")
    if Interpreter is not None:
        litert = litert_outputs(data, feeds)
        for name, want in expected.items():
            np.testing.assert_array_equal(litert[name], want, err_msg=f"LiteRT {name}")


def test_quantized_div_within_a_step_of_litert() -> None:
    from tflite_cases import quantized_div

    data = quantized_div()
    assert any("quantized DIV" in str(lowering) for lowering in nnapi.load_tflite(data).lowerings)
    rng = np.random.default_rng(2)
    feeds = {"a": rng.integers(-128, 128, (2, 5)).astype(np.int8),
             "b": rng.integers(20, 128, (2, 5)).astype(np.int8)}    # divisors away from 0
    real = ((feeds["a"].astype(np.float64) + 3) * 0.05) / ((feeds["b"].astype(np.float64) - 10) * 0.02)
    want = np.clip(np.round(real / 0.1) + 1, -128, 127)
    for device in ("nnapi-reference", "nnapi-ort-cpu"):
        session = _session_on(data, device)
        if session is None:
            continue
        assert np.abs(session.run(feeds)["y"].astype(np.float64) - want).max() <= 1
    if Interpreter is not None:
        assert np.abs(litert_outputs(data, feeds)["y"].astype(np.float64) - want).max() <= 1


def test_constant_gather_nd_of_a_mask_through_rank_5_indices() -> None:
    """BERT's attention mask through ai-edge-torch: the int32 mask [1, n] CAST to bool,
    GATHER_ND by constant [1, 1, 1, n, 2] indices ([0, j]: every row once, in order, a
    RESHAPE), then SELECT_V2 of two scalars; refused before (GATHER_ND of TENSOR_BOOL8;
    rank-5 indices). Constant indices in another order (here reversed, of the int32 mask)
    GATHER one flat list of rows, whatever the indices' rank."""
    from tflite_builder import Operator, Subgraph, Tensor, build

    n = 8
    in_order = np.stack([np.zeros(n, np.int32), np.arange(n, dtype=np.int32)], -1).reshape(1, 1, 1, n, 2)
    reversed_ = in_order[..., ::-1, :].copy()
    t = [Tensor("mask", "int32", [1, n]), Tensor("flag", "bool", [1, n]),                      # 0, 1
         Tensor("order", "int32", [1, 1, 1, n, 2], data=in_order),                           # 2
         Tensor("picked", "bool", [1, 1, 1, n]),                                             # 3
         Tensor("one", "float32", [], data=np.array(1.5, np.float32)),                       # 4
         Tensor("low", "float32", [], data=np.array(-2.0, np.float32)),                      # 5
         Tensor("bias", "float32", [1, 1, 1, n]),                                            # 6
         Tensor("back", "int32", [1, 1, 1, n, 2], data=reversed_),                           # 7
         Tensor("flipped", "int32", [1, 1, 1, n])]                                           # 8
    ops = [Operator("CAST", [0], [1]), Operator("GATHER_ND", [1, 2], [3]), Operator("SELECT_V2", [3, 4, 5], [6]),
           Operator("GATHER_ND", [0, 7], [8])]
    data = build(Subgraph(t, ops, [0], [6, 8]))
    emitted = {lowering.source.index: lowering.operations for lowering in nnapi.load_tflite(data).lowerings}
    assert "GATHER" not in emitted[1] and "RESHAPE" in emitted[1] and "GATHER" in emitted[3], emitted
    mask = np.array([[1, 1, 0, 3, 0, 1, -4, 0]], np.int32) * 70000   # beyond float32's halves' 2**16
    want = {"bias": np.where(mask != 0, 1.5, -2.0).astype(np.float32).reshape(1, 1, 1, n),
            "flipped": mask[:, ::-1].reshape(1, 1, 1, n)}
    _assert_exact_on_every_engine(data, {"mask": mask}, want)


def test_gather_nd_of_constant_int32_params_moves_each_half() -> None:
    """GATHER_ND of constant int32 params by run-time indices (moved through float32 as
    their high and low 16 bits): each half gathers its own half, not the raw values (which
    joined as v * 65537 before)."""
    from tflite_builder import Operator, Subgraph, Tensor, build

    params = ((np.arange(12, dtype=np.int32) + 1) * 70001).reshape(4, 3)
    t = [Tensor("params", "int32", [4, 3], data=params), Tensor("rows", "int32", [2, 1]),
         Tensor("picked", "int32", [2, 3])]
    data = build(Subgraph(t, [Operator("GATHER_ND", [0, 1], [2])], [1], [2]))
    rows = np.array([[2], [0]], np.int32)
    _assert_exact_on_every_engine(data, {"rows": rows}, {"picked": params[[2, 0]]})


def test_a_mask_read_by_every_layer_is_broadcast_once() -> None:
    """Keras's masked softmax: every layer's SELECT_V2 (twice per layer) reads the same
    [1, 1, 1, n] mask and a scalar; NNAPI's SELECT does not broadcast, so the mask is
    broadcast (LOGICAL_AND with true) and the scalar expanded, once for all readers of
    that shape, not once per operator (electra-small: 24 LOGICAL_ANDs and 24 full
    constants fewer, 760 -> 737 operations, ORT 5-8% faster)."""
    from tflite_builder import Operator, Subgraph, Tensor, build

    n, heads = 6, 2
    t = [Tensor("mask", "bool", [1, 1, 1, n]), Tensor("low", "float32", [], data=np.array(-1e4, np.float32)),
         Tensor("zero", "float32", [], data=np.array(0.0, np.float32))]
    ops, outputs = [], []
    for layer in range(3):
        t.append(Tensor(f"s{layer}", "float32", [1, heads, n, n]))
        t.append(Tensor(f"m{layer}", "float32", [1, heads, n, n]))
        t.append(Tensor(f"p{layer}", "float32", [1, heads, n, n]))
        t.append(Tensor(f"y{layer}", "float32", [1, heads, n, n]))
        s, m, p, y = range(len(t) - 4, len(t))
        ops += [Operator("SELECT_V2", [0, s, 1], [m]), Operator("SOFTMAX", [m], [p], ("SoftmaxOptions", {"Beta": 1.0})),
                Operator("SELECT_V2", [0, p, 2], [y])]
        outputs.append(y)
    data = build(Subgraph(t, ops, [0, 3, 7, 11], outputs))
    imported = nnapi.load_tflite(data)
    emitted = [name for lowering in imported.lowerings for name in lowering.operations]
    assert emitted.count("LOGICAL_AND") == 1, emitted
    assert imported.model.operation_count == 9 + 1     # 3 x (SELECT, SOFTMAX, SELECT) + the one broadcast
    rng = np.random.default_rng(12)
    mask = rng.random((1, 1, 1, n)) > 0.3
    feeds = {"mask": mask, **{f"s{k}": rng.standard_normal((1, heads, n, n)).astype(np.float32) for k in range(3)}}
    for device in ("nnapi-reference", "nnapi-ort-cpu"):
        session = _session_on(data, device)
        if session is None:
            continue
        got = session.run(feeds)
        for k in range(3):
            masked = np.where(mask, feeds[f"s{k}"], np.float32(-1e4))
            assert np.array_equal(got[f"y{k}"] == 0, np.broadcast_to(~mask, (1, heads, n, n))), device
            probabilities = got[f"y{k}"][np.broadcast_to(mask, (1, heads, n, n))]
            e = np.exp(masked - masked.max(-1, keepdims=True))
            want = (e / e.sum(-1, keepdims=True))[np.broadcast_to(mask, (1, heads, n, n))]
            np.testing.assert_allclose(probabilities, want, rtol=1e-5)


@pytest.mark.parametrize("kind", ["int8", "uint8"])
def test_quantized_tanh_and_logistic_at_any_output_scale(kind: str) -> None:
    """PT2E quantizes TANH / LOGISTIC outputs at their calibrated range (BERT's pooler:
    scale 0.0056, zero point 8), not at NNAPI's fixed 1/128 / 1/256: refused before
    ("must have scale 1/128"); now DEQUANTIZE, the float operation, QUANTIZE, within a
    step of the real function on all 256 inputs on every engine (LiteRT's too); at NNAPI's
    own scales the operation stays as it is."""
    from tflite_builder import Operator, Subgraph, Tensor, build

    shift = 128 if kind == "uint8" else 0
    qx, qt, ql = ({"scale": 0.05, "zero_point": 3 + shift}, {"scale": 0.0056, "zero_point": 8 + shift},
                  {"scale": 0.004, "zero_point": -100 + shift})
    fixed = {"scale": 1 / 128, "zero_point": shift}
    t = [Tensor("x", kind, [256], **qx), Tensor("t", kind, [256], **qt), Tensor("s", kind, [256], **ql),
         Tensor("f", kind, [256], **fixed)]
    data = build(Subgraph(t, [Operator("TANH", [0], [1]), Operator("LOGISTIC", [0], [2]),
                              Operator("TANH", [0], [3])], [0], [1, 2, 3]))
    lowered = {lowering.source.index for lowering in nnapi.load_tflite(data).lowerings}
    assert lowered == {0, 1}, lowered
    info = np.iinfo(kind)
    x = np.arange(info.min, info.max + 1).astype(kind)
    real = (x.astype(np.float64) - qx["zero_point"]) * qx["scale"]
    want = {name: np.clip(np.round(f(real) / q["scale"]) + q["zero_point"], info.min, info.max)
            for name, f, q in (("t", np.tanh, qt), ("s", lambda v: 1 / (1 + np.exp(-v)), ql), ("f", np.tanh, fixed))}
    runs = [session.run({"x": x}) for device in ("nnapi-reference", "nnapi-ort-cpu")
            if (session := _session_on(data, device)) is not None]
    if Interpreter is not None:
        runs.append(litert_outputs(data, {"x": x}))
    for got in runs:
        for name, expected in want.items():
            assert np.abs(got[name].astype(np.float64) - expected).max() <= 1, name


def test_gather_nd_index_outside_its_axis_fails_the_run() -> None:
    """A GATHER_ND index outside its own axis fails the run (as LiteRT's does), also where
    its merged row would be in range ([0, 7] of a [6, 7] map is row 7 = [1, 0])."""
    from tflite_cases import pose_decoding

    rng = np.random.default_rng(1)
    feeds = {"heat": rng.standard_normal((6, 7)).astype(np.float32),
             "offsets": rng.standard_normal((6, 7, 4)).astype(np.float32),
             "idx": np.array([[0, 0, 0]] * 4 + [[0, 0, 7]], np.int32),
             "cube": rng.standard_normal((5, 6, 7)).astype(np.float32), "rows": np.array([[5], [0], [3]], np.int32),
             "a": np.ones(4, np.float32), "b": np.ones(4, np.float32),
             "ia": np.ones(6, np.int32), "ib": np.ones(6, np.int32)}
    for device in ("nnapi-reference", "nnapi-ort-cpu"):
        session = _session_on(pose_decoding(), device)
        if session is None:
            continue
        with pytest.raises(nnapi.NnapiError):
            session.run(feeds)
        for bad_rows in ([[6], [0], [0]], [[-1], [0], [0]]):
            with pytest.raises(nnapi.NnapiError):
                session.run({**feeds, "idx": np.zeros((5, 3), np.int32), "rows": np.array(bad_rows, np.int32)})


@pytest.mark.parametrize("width, n", [(12, 16), (16, 16), (20, 16)])
def test_spectrogram_rfft2d_agrees_with_numpy_and_litert(width: int, n: int) -> None:
    """RFFT2D of the last axis (zero-padded, exact or cropped to n) + COMPLEX_ABS / REAL /
    IMAG, refused before (NNAPI has no FFT or complex type), as a DFT by matrices: within
    float32 rounding of numpy's float64 FFT, and of LiteRT, on each device."""
    from tflite_cases import spectrogram

    data = spectrogram(width, n)
    _check_spectrum(data, data, width, n, litert_devices=("nnapi-reference",))


@pytest.mark.parametrize("width, n", [(256, 256), (300, 256), (400, 512), (2048, 2048)])
def test_long_rfft2d_runs_in_two_dft_stages(width: int, n: int) -> None:
    """An RFFT2D of many points (tf.signal.stft's 512 or 2048) as two DFT stages of about
    sqrt(n) points by matrices (the twiddle factors in the second's), not one DFT of n:
    a tenth of the multiply-adds at 2048. Within float32 rounding of numpy's float64 FFT
    and of LiteRT, cropped, exact or zero-padded to n, on each device."""
    from tflite_cases import spectrogram

    data = spectrogram(width, n)
    imported = nnapi.load_tflite(data)
    assert "two DFT stages" in imported.lowerings[0].reason
    _check_spectrum(data, imported, width, n, litert_devices=("nnapi-reference", "nnapi-ort-cpu"))


def _check_spectrum(data: bytes, model, width: int, n: int, litert_devices: tuple[str, ...]) -> None:
    """The spectrogram model ``data`` (imported as ``model``) on each device against numpy's
    float64 RFFT of 3 random frames of ``width`` samples at ``n`` points, and on
    ``litert_devices`` against LiteRT (where installed), each within 1e-6 of the largest
    magnitude."""
    frames = np.random.default_rng(n + width).standard_normal((3, 1, width)).astype(np.float32)
    spectrum = np.fft.rfft(frames.astype(np.float64), n=n, axis=-1)
    expected = {"magnitude": np.abs(spectrum).reshape(3, -1), "re": spectrum.real, "im": spectrum.imag}
    scale = np.abs(spectrum).max()
    litert = litert_outputs(data, {"frames": frames}) if Interpreter is not None else None
    for device in ("nnapi-reference", "nnapi-ort-cpu"):
        session = _session_on(model, device)
        if session is None:
            continue
        got = session.run({"frames": frames})
        for name, want in expected.items():
            assert got[name].shape == want.shape
            assert np.abs(got[name] - want).max() <= 1e-6 * scale, (device, name)
            if litert is not None and device in litert_devices:
                assert np.abs(got[name] - litert[name]).max() <= 1e-6 * scale, (device, name)


def test_short_rfft2d_stays_one_dft() -> None:
    """16 points: two stages would not save enough multiply-adds to pay for their steps."""
    from tflite_cases import spectrogram

    assert "two FULLY_CONNECTEDs by the DFT" in nnapi.load_tflite(spectrogram(16, 16)).lowerings[0].reason


def test_arg_max_with_int64_output_is_widened_by_session() -> None:
    """ARG_MAX with int64 output (tf.argmax's default; refused before: NNAPI outputs int32)
    imports as int32 and Session returns int64 indices equal to numpy's, on each device;
    inspect shows the output as int32 held for int64."""
    from tflite_builder import Tensor, single_op

    t = [Tensor("x", "float32", [2, 5, 7]), Tensor("axis", "int32", [1], data=np.array([2], np.int32)),
         Tensor("y", "int64", [2, 5])]
    data = single_op("ARG_MAX", t, [0, 1], [2], ("ArgMaxOptions", {"OutputType": 4}))
    imported = nnapi.load_tflite(data)
    spec = imported.outputs[0]
    assert spec.user_dtype == np.int64 and spec.dtype == np.int32 and spec.type == nnapi.OperandCode.TENSOR_INT32
    x = np.random.default_rng(0).standard_normal((2, 5, 7)).astype(np.float32)
    for device in ("nnapi-reference", "nnapi-ort-cpu"):
        session = _session_on(data, device)
        if session is None:
            continue
        assert session.outputs[0].dtype == np.int64
        got = session.run({"x": x})["y"]
        assert got.dtype == np.int64
        np.testing.assert_array_equal(got, np.argmax(x, axis=2))
    if Interpreter is not None:
        np.testing.assert_array_equal(litert_outputs(data, {"x": x})["y"], np.argmax(x, axis=2))


@pytest.mark.parametrize("axis", [1, -1])
@pytest.mark.parametrize("exclusive, reverse", [(False, False), (True, False), (False, True), (True, True)])
def test_cumsum_agrees_with_numpy(axis: int, exclusive: bool, reverse: bool) -> None:
    """CUMSUM (refused before: NNAPI has no cumulative sum) as a triangular matrix product,
    inclusive / exclusive, forward / reverse, on the middle and the last axis: within float32
    rounding of numpy's running sum, on each device and LiteRT."""
    from tflite_builder import Tensor, single_op

    t = [Tensor("x", "float32", [2, 5, 3]), Tensor("axis", "int32", [], data=np.array(axis, np.int32)),
         Tensor("y", "float32", [2, 5, 3])]
    data = single_op("CUMSUM", t, [0, 1], [2], ("CumsumOptions", {"Exclusive": exclusive, "Reverse": reverse}))
    x = np.random.default_rng(3).standard_normal((2, 5, 3)).astype(np.float32)
    flipped = np.flip(x, axis) if reverse else x
    running = np.cumsum(flipped.astype(np.float64), axis)
    if exclusive:
        running -= flipped
    want = np.flip(running, axis) if reverse else running
    for device in ("nnapi-reference", "nnapi-ort-cpu"):
        session = _session_on(data, device)
        if session is None:
            continue
        np.testing.assert_allclose(session.run({"x": x})["y"], want, rtol=1e-5, atol=1e-6)
    if Interpreter is not None:
        np.testing.assert_allclose(litert_outputs(data, {"x": x})["y"], want, rtol=1e-5, atol=1e-6)


def _quantized_mul(dtype: str, a: tuple[float, int], b: tuple[float, int], y: tuple[float, int]) -> bytes:
    """One quantized MUL of a [256, 1] by a [1, 256] tensor: every pair of stored values."""
    from tflite_builder import Tensor, single_op

    t = [Tensor("a", dtype, [256, 1], scale=a[0], zero_point=a[1]),
         Tensor("b", dtype, [1, 256], scale=b[0], zero_point=b[1]),
         Tensor("y", dtype, [256, 256], scale=y[0], zero_point=y[1])]
    return single_op("MUL", t, [0, 1], [2], ("MulOptions", {"FusedActivationFunction": 0}))


def _tflite_integer_mul(qa: np.ndarray, qb: np.ndarray, a, b, y, dtype) -> np.ndarray:
    """TFLite's quantized MUL written out: the multiplier scale_a * scale_b / scale_y in
    float32 as a Q31 mantissa and a left shift, gemmlowp's rounding doubling high multiply
    (C's truncating division of the nudged product), the zero point, saturation."""
    real = float(np.float32(np.float32(a[0]) * np.float32(b[0])) / np.float32(y[0]))
    mantissa, exponent = np.frexp(real)
    fixed = int(np.floor(mantissa * 2**31 + 0.5))
    assert fixed < 2**31 and exponent >= 1          # a multiplier >= 1: a left shift only
    product = (qa.astype(np.int64) - a[1]) * (qb.astype(np.int64) - b[1]) * 2**int(exponent) * fixed
    nudged = product + np.where(product >= 0, 2**30, 1 - 2**30)
    high = np.where(nudged >= 0, nudged // 2**31, -((-nudged) // 2**31))
    info = np.iinfo(dtype)
    return np.clip(high + y[1], info.min, info.max).astype(dtype)


@pytest.mark.parametrize("dtype, a, b, y", [
    ("int8", (0.49804210662841797, -128), (1.8666666746139526, -128), (0.49804210662841797, -128)),
    ("int8", (1.7657324075698853, -128), (5.850980281829834, -128), (1.7657324075698853, -128)),
    ("uint8", (0.047, 131), (0.91, 7), (0.031, 100)),
])
def test_quantized_mul_with_output_scale_not_above_the_input_product_is_exact(dtype, a, b, y) -> None:
    """yolov5's int8 box decoding multiplies by anchors with an output scale below the product
    of the input scales, which NNAPI's MUL refuses (refused at import before): now DEQUANTIZE,
    MUL, QUANTIZE in float32, proven at import equal to TFLite's integer MUL on all 65,536
    pairs of stored values, and so equal to it on every device."""
    data = _quantized_mul(dtype, a, b, y)
    assert any("quantized MUL whose output scale" in str(lowering) for lowering in nnapi.load_tflite(data).lowerings)
    info = np.iinfo(dtype)
    feeds = {"a": np.arange(info.min, info.max + 1).astype(dtype).reshape(256, 1),
             "b": np.arange(info.min, info.max + 1).astype(dtype).reshape(1, 256)}
    want = _tflite_integer_mul(feeds["a"], feeds["b"], a, b, y, np.dtype(dtype))
    ran = 0
    for device in ("nnapi-reference", "nnapi-ort-cpu"):
        session = _session_on(data, device)
        if session is None:
            continue
        np.testing.assert_array_equal(session.run(feeds)["y"], want, err_msg=device)
        ran += 1
    assert ran
    if Interpreter is not None:   # XNNPACK requantizes in float: within a step
        assert np.abs(litert_outputs(data, feeds)["y"].astype(np.int64) - want).max() <= 1


def test_quantized_mul_whose_float_form_differs_from_tflite_is_refused() -> None:
    """Where the float32 form rounds one pair of stored values otherwise than TFLite's integer
    MUL (these scales: one of 3,000 random draws), the import refuses the MUL by name."""
    data = _quantized_mul("int8", (0.9011374115943909, -125), (1.701359510421753, -123), (1.1747018098831177, -65))
    with pytest.raises(nnapi.BadDataError, match="MUL.*differs from TFLite's integer MUL"):
        nnapi.load_tflite(data)


def test_int32_div_truncates_toward_zero() -> None:
    """TFLite's int32 DIV truncates toward zero (-7 / 2 = -3); NNAPI's int32 DIV floors
    (-4): the import gave the floor quotient for every negative inexact quotient before
    (tools/import_vs_litert.py). Same-shape and broadcast divisors, the int32 extremes."""
    from tflite_builder import Operator, Subgraph, Tensor, build

    a = np.array([7, -7, 7, -7, 6, -6, 0, -20, 2**31 - 1, -2**31, -1, 1], np.int32)
    b = np.array([2, 2, -2, -2, 3, 3, 5, 3, -7, 3, 4, -4], np.int32)
    for divisor in (b, b[1:2]):
        t = [Tensor("a", "int32", [12]), Tensor("b", "int32", list(divisor.shape)), Tensor("q", "int32", [12])]
        data = build(Subgraph(t, [Operator("DIV", [0, 1], [2], ("DivOptions", {"FusedActivationFunction": 0}))],
                              [0, 1], [2]))
        quotient = np.abs(a.astype(np.int64)) // np.abs(divisor.astype(np.int64)) * \
            np.sign(a.astype(np.int64)) * np.sign(divisor.astype(np.int64))
        _assert_exact_on_every_engine(data, {"a": a, "b": divisor}, {"q": quotient.astype(np.int32)})


def test_rank_of_a_rank0_tensor_is_0() -> None:
    """RANK is the input's rank in the file: 0 for a scalar, which NNAPI holds as [1] (its
    RANK said 1 before; tools/import_vs_litert.py)."""
    from tflite_builder import Operator, Subgraph, Tensor, build

    t = [Tensor("s", "float32", []), Tensor("x", "float32", [2, 1, 3]), Tensor("s_rank", "int32", []),
         Tensor("x_rank", "int32", [])]
    data = build(Subgraph(t, [Operator("RANK", [0], [2]), Operator("RANK", [1], [3])], [0, 1], [2, 3]))
    feeds = {"s": np.array(1.5, np.float32), "x": np.ones([2, 1, 3], np.float32)}
    _assert_exact_on_every_engine(data, feeds, {"s_rank": np.array(0, np.int32), "x_rank": np.array(3, np.int32)})


def test_topk_lists_equal_values_lower_index_first() -> None:
    """TFLite's TOPK_V2 lists equal values lower index first, Android's higher index first:
    the import gave Android's order of ties before (tools/import_vs_litert.py)."""
    from tflite_builder import Operator, Subgraph, Tensor, build

    x = np.array([[3, 7, 3, 7, 1, 3], [5, 5, 5, 5, 5, 5], [-2, 9, 0, 9, 9, -2]], np.int8)
    t = [Tensor("x", "int8", [3, 6], scale=0.5, zero_point=1), Tensor("k", "int32", [], data=np.array(4, np.int32)),
         Tensor("values", "int8", [3, 4], scale=0.5, zero_point=1), Tensor("indices", "int32", [3, 4])]
    data = build(Subgraph(t, [Operator("TOPK_V2", [0, 1], [2, 3])], [0], [2, 3]))
    order = np.argsort(-x.astype(np.int32), axis=1, kind="stable")[:, :4].astype(np.int32)
    _assert_exact_on_every_engine(data, {"x": x}, {"values": np.take_along_axis(x, order, 1), "indices": order})


def test_topk_of_rank5_maps_indices_back() -> None:
    """TOPK_V2's indices are mapped back by a GATHER, which NNAPI takes above rank 4 (a SUB
    does not: the rank-5 TOPK_V2 that imported before was refused by the tie-order fix)."""
    from tflite_builder import Operator, Subgraph, Tensor, build

    x = np.random.default_rng(5).integers(-3, 3, [2, 1, 2, 3, 5]).astype(np.float32)
    t = [Tensor("x", "float32", [2, 1, 2, 3, 5]), Tensor("k", "int32", [], data=np.array(3, np.int32)),
         Tensor("values", "float32", [2, 1, 2, 3, 3]), Tensor("indices", "int32", [2, 1, 2, 3, 3])]
    data = build(Subgraph(t, [Operator("TOPK_V2", [0, 1], [2, 3])], [0], [2, 3]))
    order = np.argsort(-x, axis=-1, kind="stable")[..., :3].astype(np.int32)
    _assert_exact_on_every_engine(data, {"x": x}, {"values": np.take_along_axis(x, order, -1), "indices": order})


def test_select_rank1_condition_of_another_length_is_refused_cleanly() -> None:
    """A constant rank-1 condition not as long as x's first dimension (LiteRT refuses it too)
    is refused with TFLite's rule, not a ValueError inside the import."""
    from tflite_builder import Operator, Subgraph, Tensor, build

    t = [Tensor("cond", "bool", [3], data=np.array([True, False, True])), Tensor("a", "float32", [2, 3]),
         Tensor("b", "float32", [2, 3]), Tensor("y", "float32", [2, 3])]
    data = build(Subgraph(t, [Operator("SELECT", [0, 1, 2], [3])], [1, 2], [3]))
    with pytest.raises(nnapi.NnapiError, match="first dimension") as error:
        nnapi.load_tflite(data)
    assert "malformed" not in str(error.value)


def test_rank5_comparison_of_two_quantizations_is_refused_cleanly() -> None:
    """An 8-bit LESS above rank 4 whose quantizations need TFLite's fixed-point values (the
    table lowering's DEQUANTIZE is rank 4 at most) is refused naming the rule, not NNAPI's
    check of an inner operation."""
    from tflite_builder import Operator, Subgraph, Tensor, build

    t = [Tensor("a", "int8", [2, 1, 3, 1, 4], scale=0.002, zero_point=3),
         Tensor("b", "int8", [3, 2, 1], scale=0.0031, zero_point=-7), Tensor("o", "bool", [2, 1, 3, 2, 4])]
    data = build(Subgraph(t, [Operator("LESS", [0, 1], [2])], [0, 1], [2]))
    with pytest.raises(nnapi.NnapiError, match="LESS of rank 5") as error:
        nnapi.load_tflite(data)
    assert "add_operation" not in str(error.value)


def test_select_with_a_rank1_condition_picks_rows() -> None:
    """TFLite's SELECT (version 1) with a rank-1 condition of x's first dimension picks
    rows; the condition broadcast by NumPy's rule (along the last axis) raised inside the
    import before, or picked columns (tools/import_vs_litert.py). A run-time condition and
    a constant one."""
    from tflite_builder import Operator, Subgraph, Tensor, build

    cond = np.array([True, False, True])
    a = np.arange(12, dtype=np.float32).reshape(3, 2, 2)
    for constant in (False, True):
        t = [Tensor("cond", "bool", [3], data=cond if constant else None), Tensor("a", "float32", [3, 2, 2]),
             Tensor("b", "float32", [3, 2, 2]), Tensor("y", "float32", [3, 2, 2])]
        data = build(Subgraph(t, [Operator("SELECT", [0, 1, 2], [3])], [1, 2] if constant else [0, 1, 2], [3]))
        feeds = {"a": a, "b": -a} if constant else {"cond": cond, "a": a, "b": -a}
        _assert_exact_on_every_engine(data, feeds, {"y": np.where(cond[:, None, None], a, -a)})


def test_rank3_batch_to_space_with_crops_is_refused_cleanly() -> None:
    """A rank-3 BATCH_TO_SPACE_ND with crops (TFLite takes it; NNAPI's is rank 4) is refused
    with the reason, not an IndexError inside the import (tools/import_vs_litert.py)."""
    from tflite_builder import Operator, Subgraph, Tensor, build

    t = [Tensor("x", "float32", [2, 3, 1]), Tensor("block", "int32", [1], data=np.array([2], np.int32)),
         Tensor("crops", "int32", [1, 2], data=np.array([[1, 0]], np.int32)), Tensor("y", "float32", [1, 5, 1])]
    data = build(Subgraph(t, [Operator("BATCH_TO_SPACE_ND", [0, 1, 2], [3])], [0], [3]))
    with pytest.raises(nnapi.NnapiError, match="rank-3 tensor") as error:
        nnapi.load_tflite(data)
    assert "malformed" not in str(error.value)


def test_broadcast_of_an_empty_tensor_is_refused_cleanly() -> None:
    """BROADCAST_TO of an empty tensor (a SLICE of size 0) is refused with the reason, not a
    ZeroDivisionError inside the import (tools/import_vs_litert.py)."""
    from tflite_builder import Operator, Subgraph, Tensor, build

    t = [Tensor("x", "float32", [2, 4]), Tensor("begin", "int32", [2], data=np.array([0, 1], np.int32)),
         Tensor("size", "int32", [2], data=np.array([1, 0], np.int32)), Tensor("empty", "float32", [1, 0]),
         Tensor("shape", "int32", [3], data=np.array([3, 1, 0], np.int32)), Tensor("y", "float32", [3, 1, 0])]
    data = build(Subgraph(t, [Operator("SLICE", [0, 1, 2], [3]), Operator("BROADCAST_TO", [3, 4], [5])], [0], [5]))
    with pytest.raises(nnapi.NnapiError, match="empty tensor") as error:
        nnapi.load_tflite(data)
    assert "malformed" not in str(error.value)


def test_rows_of_an_unpack_read_by_another_operation_lower_on_ort() -> None:
    """UNPACK into rows (SPLIT + RESHAPE to [1, row]) each read by a TILE: the ORT device's
    search for one common FULLY_CONNECTED product of the rows indexed the reader's fourth
    input before checking it was a FULLY_CONNECTED (an IndexError that declined the SPLIT;
    tools/import_vs_litert.py)."""
    from tflite_builder import Operator, Subgraph, Tensor, build

    t = [Tensor("x", "float32", [1, 2, 3]), Tensor("r0", "float32", [1, 3]), Tensor("r1", "float32", [1, 3]),
         Tensor("m", "int32", [2], data=np.array([2, 1], np.int32)), Tensor("y0", "float32", [2, 3]),
         Tensor("y1", "float32", [2, 3])]
    data = build(Subgraph(t, [Operator("UNPACK", [0], [1, 2], ("UnpackOptions", {"Num": 2, "Axis": 1})),
                              Operator("TILE", [1, 3], [4]), Operator("TILE", [2, 3], [5])], [0], [4, 5]))
    x = np.arange(6, dtype=np.float32).reshape(1, 2, 3)
    _assert_exact_on_every_engine(data, {"x": x}, {"y0": np.tile(x[:, 0], [2, 1]), "y1": np.tile(x[:, 1], [2, 1])})


def _tflite_compared_value(q: int, scale: float, zero_point: int) -> int:
    """What TFLite's 8-bit comparisons compare for stored value ``q`` (comparisons.cc):
    ((q - zero point) << 8) times the Q31 multiplier of the scale, rounded twice (the
    doubling high multiply, the rounding right shift)."""
    import math

    mantissa, exponent = math.frexp(float(np.float32(scale)))
    multiplier = int(math.floor(abs(mantissa) * 2**31 + 0.5))
    product = (q - zero_point) * 256 * multiplier
    nudge = 2**30 if product >= 0 else 1 - 2**30
    high = abs(product + nudge) // 2**31 * (1 if product + nudge >= 0 else -1)
    shift = -exponent
    mask = (1 << shift) - 1
    threshold = (mask >> 1) + (1 if high < 0 else 0)
    return (high >> shift) + (1 if (high & mask) > threshold else 0)


def test_quantized_comparisons_compare_tflites_fixed_point_values() -> None:
    """TFLite's 8-bit comparisons compare about round(256 * real) (two roundings), not the
    real values NNAPI's compare: at scale 0.002, 1 == 2 and -5 == -6 but 100 != 101. The
    import used NNAPI's comparison, a wrong answer on 1-2% of pairs of close values
    (tools/import_vs_litert.py). Every pair of stored values; run-time and constant inputs."""
    from tflite_builder import Operator, Subgraph, Tensor, build

    assert [_tflite_compared_value(q, 0.002, 0) for q in (1, 2, -5, -6, 100, 101)] == [1, 1, -3, -3, 51, 52]
    for kind, (sa, za), (sb, zb), name, compare in (
            ("int8", (0.002, 0), (0.002, 0), "EQUAL", np.equal),
            ("int8", (0.24313540756702423, 92), (0.016018200665712357, 84), "GREATER_EQUAL", np.greater_equal),
            ("uint8", (0.0123, 130), (0.0071, 7), "LESS", np.less)):
        info = np.iinfo(kind)
        stored = np.arange(info.min, info.max + 1)
        a, b = np.repeat(stored, 256).astype(kind), np.tile(stored, 256).astype(kind)
        values_a = {int(q): _tflite_compared_value(int(q), sa, za) for q in stored}
        values_b = {int(q): _tflite_compared_value(int(q), sb, zb) for q in stored}
        want = compare(np.array([values_a[int(q)] for q in a]), np.array([values_b[int(q)] for q in b]))
        for constant in (False, True):
            t = [Tensor("a", kind, [65536], scale=sa, zero_point=za),
                 Tensor("b", kind, [65536], data=b if constant else None, scale=sb, zero_point=zb),
                 Tensor("y", "bool", [65536])]
            data = build(Subgraph(t, [Operator(name, [0, 1], [2])], [0] if constant else [0, 1], [2]))
            _assert_exact_on_every_engine(data, {"a": a} if constant else {"a": a, "b": b}, {"y": want})


def test_int8_mean_over_the_last_two_axes_of_a_rank3_tensor_lowers_on_ort() -> None:
    """An int8 MEAN over axes 1 and 2 of a rank-3 tensor: the ORT device took it for NHWC's
    height and width (the integer-sum form of a rank-4 pool) and raised unpacking three
    dimensions into four, which declined the MEAN (tools/import_vs_litert.py). Both devices
    give the mean of the real values within a step, and the same stored values."""
    from tflite_builder import Operator, Subgraph, Tensor, build

    t = [Tensor("x", "int8", [5, 1, 1], scale=0.08370251, zero_point=12),
         Tensor("axes", "int32", [2], data=np.array([2, -2], np.int32)),
         Tensor("y", "int8", [5], scale=0.03678592, zero_point=-11)]
    data = build(Subgraph(t, [Operator("MEAN", [0, 1], [2], ("ReducerOptions", {"KeepDims": False}))], [0], [2]))
    x = np.array([-100, -20, 0, 13, 50], np.int8).reshape(5, 1, 1)
    want = np.clip(((x.astype(np.float64) - 12) * 0.08370251).mean(axis=(1, 2)) / 0.03678592 - 11, -128, 127)
    results = [session.run({"x": x})["y"] for device in ("nnapi-reference", "nnapi-ort-cpu")
               if (session := _session_on(data, device)) is not None]
    assert results and all(np.array_equal(r, results[0]) for r in results)
    assert np.abs(results[0].astype(np.float64) - want).max() <= 0.5 + 1e-6


def test_quantized_sqrt_rounds_down_as_tflite() -> None:
    """TFLite's int8 SQRT is floor(sqrt(real) / output scale) + zero point; the import
    rounded to nearest (DEQUANTIZE, SQRT, QUANTIZE): a step above LiteRT on ~a third of the
    stored values (tools/import_vs_litert.py). Every stored value of the domain."""
    from tflite_builder import Operator, Subgraph, Tensor, build

    for (si, so, zo) in ((0.0371, 0.0213, -60), (0.2, 0.05, 3), (0.0093, 0.0417, -128)):
        t = [Tensor("x", "int8", [256], scale=si, zero_point=-128), Tensor("y", "int8", [256], scale=so, zero_point=zo)]
        data = build(Subgraph(t, [Operator("SQRT", [0], [1])], [0], [1]))
        x = np.arange(-128, 128).astype(np.int8)
        real = np.float32(si) * (x.astype(np.float32) + 128)
        want = np.clip(np.floor(np.sqrt(real) / np.float32(so)) + zo, -128, 127).astype(np.int8)
        _assert_exact_on_every_engine(data, {"x": x}, {"y": want})


def test_reverse_v2_of_negative_and_several_axes() -> None:
    """REVERSE_V2 over a negative axis (counted from the end) and over two axes, which
    LiteRT runs: refused before ("axis -1 is out of range", "exactly one axis";
    tools/import_vs_litert.py); now one NNAPI REVERSE per axis."""
    from tflite_builder import Operator, Subgraph, Tensor, build

    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    for axes in ([-1], [1, 2], [-2, -1]):  # LiteRT takes neighbouring axes only
        t = [Tensor("x", "float32", [2, 3, 4]), Tensor("axes", "int32", [len(axes)], data=np.array(axes, np.int32)),
             Tensor("y", "float32", [2, 3, 4])]
        data = build(Subgraph(t, [Operator("REVERSE_V2", [0, 1], [2])], [0], [2]))
        _assert_exact_on_every_engine(data, {"x": x}, {"y": np.flip(x, axis=tuple(axes))})


def test_reverse_v2_refusals_name_the_axes_given_and_the_rule() -> None:
    """An out-of-range axis is reported as the file gives it with the range, a repeated one as
    repeated (the message printed the axes after adding the rank, without the rule)."""
    from tflite_builder import Operator, Subgraph, Tensor, build

    for axes, rule in (([-5], r"\[-5\] of a rank-3 tensor: each must lie in \[-3, 3\)"), ([1, -2], "twice")):
        t = [Tensor("x", "float32", [2, 3, 4]), Tensor("axes", "int32", [len(axes)], data=np.array(axes, np.int32)),
             Tensor("y", "float32", [2, 3, 4])]
        data = build(Subgraph(t, [Operator("REVERSE_V2", [0, 1], [2])], [0], [2]))
        with pytest.raises(nnapi.NnapiError, match=rule):
            nnapi.load_tflite(data)


def test_quantized_logistic_into_float_is_refused_cleanly() -> None:
    """A LOGISTIC of a quantized input declaring a float output (a malformed file: TFLite
    keeps the type) is refused naming both types, not a KeyError inside the import."""
    from tflite_builder import Tensor, single_op

    t = [Tensor("x", "uint8", [4], scale=0.1, zero_point=128), Tensor("y", "float32", [4])]
    with pytest.raises(nnapi.NnapiError, match="LOGISTIC of TENSOR_QUANT8_ASYMM into TENSOR_FLOAT32") as error:
        nnapi.load_tflite(single_op("LOGISTIC", t, [0], [1]))
    assert "malformed" not in str(error.value)


def test_a_bool_move_above_rank_4_is_refused_cleanly() -> None:
    """A bool EXPAND_DIMS to rank 5 and a RESHAPE back (bool moves run on float32 halves,
    which the moves above rank 4 keep no operand for): refused with the reason, not a
    KeyError inside the import shown as a malformed operator (tools/import_vs_litert.py)."""
    from tflite_builder import Operator, Subgraph, Tensor, build

    t = [Tensor("a", "float32", [1, 1, 2, 1]), Tensor("b", "float32", [1, 1, 1, 1]), Tensor("ne", "bool", [1, 1, 2, 1]),
         Tensor("axis", "int32", [], data=np.array(0, np.int32)), Tensor("up", "bool", [1, 1, 1, 2, 1]),
         Tensor("shape", "int32", [2], data=np.array([1, 2], np.int32)), Tensor("y", "bool", [1, 2])]
    data = build(Subgraph(t, [Operator("NOT_EQUAL", [0, 1], [2]), Operator("EXPAND_DIMS", [2, 3], [4]),
                              Operator("RESHAPE", [4, 5], [6])], [0, 1], [6]))
    with pytest.raises(nnapi.NnapiError, match="above rank 4") as error:
        nnapi.load_tflite(data)
    assert "malformed" not in str(error.value)


@pytest.mark.parametrize("axis", [-1, 0, 1])
def test_one_hot_is_equal_and_select(axis: int) -> None:
    """ONE_HOT (no NNAPI operation; it was refused) as EQUAL of the indices to the positions
    and SELECT of on / off values, along any axis; an index outside [0, depth) is all off."""
    from tflite_builder import Tensor, single_op

    dims = [2, 3]
    out = list(dims)
    out.insert(axis % 3, 4)
    t = [Tensor("i", "int32", dims), Tensor("depth", "int32", [], data=np.array(4, np.int32)),
         Tensor("on", "float32", [], data=np.array(2.5, np.float32)),
         Tensor("off", "float32", [], data=np.array(-1.0, np.float32)), Tensor("y", "float32", out)]
    data = single_op("ONE_HOT", t, [0, 1, 2, 3], [4], ("OneHotOptions", {"Axis": axis}))
    i = np.array([[0, 3, 1], [5, -1, 2]], np.int32)
    want = np.moveaxis(np.where(i[..., None] == np.arange(4), 2.5, -1.0), -1, axis % 3).astype(np.float32)
    _assert_exact_on_every_engine(data, {"i": i}, {"y": want})


@pytest.mark.parametrize("index", [2, 4, -1])
def test_one_hot_of_a_rank_0_index(index: int) -> None:
    """ONE_HOT of a rank-0 index (LiteRT runs it; the import failed inside: EXPAND_DIMS of
    NNAPI's [1] gave [1, 1], not the [1] declared) is a [depth] vector."""
    from tflite_builder import Tensor, single_op

    t = [Tensor("i", "int32", []), Tensor("depth", "int32", [], data=np.array(4, np.int32)),
         Tensor("on", "float32", [], data=np.array(2.5, np.float32)),
         Tensor("off", "float32", [], data=np.array(-1, np.float32)), Tensor("y", "float32", [4])]
    data = single_op("ONE_HOT", t, [0, 1, 2, 3], [4], ("OneHotOptions", {"Axis": -1}))
    want = np.where(np.arange(4) == index, 2.5, -1).astype(np.float32)
    _assert_exact_on_every_engine(data, {"i": np.array(index, np.int32)}, {"y": want})


def test_quantized_one_hot_copies_the_stored_values() -> None:
    """TFLite's ONE_HOT copies on_value's / off_value's stored values into the output,
    whatever their quantization (LiteRT: 100 and -5 here); SELECT of the real values
    requantized them (-108 and -128, the output's scale 0.5 and zero point -128)."""
    from tflite_builder import Tensor, single_op

    t = [Tensor("i", "int32", [3]), Tensor("depth", "int32", [], data=np.array(4, np.int32)),
         Tensor("on", "int8", [], data=np.array(100, np.int8), scale=0.1, zero_point=0),
         Tensor("off", "int8", [], data=np.array(-5, np.int8), scale=0.3, zero_point=7),
         Tensor("y", "int8", [3, 4], scale=0.5, zero_point=-128)]
    data = single_op("ONE_HOT", t, [0, 1, 2, 3], [4], ("OneHotOptions", {"Axis": -1}))
    i = np.array([0, 2, 7], np.int32)
    _assert_exact_on_every_engine(data, {"i": i}, {"y": np.where(i[:, None] == np.arange(4), 100, -5).astype(np.int8)})
    t[2] = Tensor("on", "int8", [], scale=0.1, zero_point=0)  # computed at run time: no NNAPI form
    data = single_op("ONE_HOT", t, [0, 1, 2, 3], [4], ("OneHotOptions", {"Axis": -1}))
    with pytest.raises(nnapi.BadDataError, match="on_value is computed at run time in a quantization other than"):
        nnapi.load_tflite(data)


def test_sign_is_two_selects() -> None:
    """SIGN (no NNAPI operation; it was refused) as LiteRT computes it: either zero gives +0
    (the input times 0 gave -0 for -0), NaN stays NaN, infinities and the smallest
    subnormals give +-1, bit for bit."""
    from tflite_builder import Tensor, single_op

    data = single_op("SIGN", [Tensor("x", "float32", [2, 4]), Tensor("y", "float32", [2, 4])], [0], [1])
    x = np.array([[1.5, -2.0, 0.0, -0.0], [np.nan, np.inf, -1e-45, 1e-45]], np.float32)
    want = np.array([[1, -1, 0, 0], [np.nan, 1, -1, 1]], np.float32)  # +0 for -0: bits compared
    for device in ("nnapi-reference", "nnapi-ort-cpu"):
        session = _session_on(data, device)
        if session is not None:
            np.testing.assert_array_equal(session.run({"x": x})["y"].view(np.uint32), want.view(np.uint32))
    if Interpreter is not None:
        np.testing.assert_array_equal(litert_outputs(data, {"x": x})["y"].view(np.uint32), want.view(np.uint32))


def test_gather_with_batch_dims_is_one_gather_on_merged_rows() -> None:
    """GATHER with batch_dims 1 along axis 1 (no NNAPI form before: refused) as one GATHER
    on the params' [batch * n, ...] rows by each index plus its batch's first row; an
    index outside [0, n) fails the run as LiteRT's does, also where its merged row exists."""
    from tflite_builder import Tensor, single_op

    t = [Tensor("p", "float32", [3, 5, 2]), Tensor("i", "int32", [3, 4]), Tensor("y", "float32", [3, 4, 2])]
    data = single_op("GATHER", t, [0, 1], [2], ("GatherOptions", {"Axis": 1, "BatchDims": 1}))
    rng = np.random.default_rng(14)
    p = rng.standard_normal((3, 5, 2)).astype(np.float32)
    i = np.array([[0, 4, 4, 1], [2, 2, 0, 3], [4, 1, 0, 0]], np.int32)
    _assert_exact_on_every_engine(data, {"p": p, "i": i}, {"y": np.stack([p[b][i[b]] for b in range(3)])})
    for device in ("nnapi-reference", "nnapi-ort-cpu"):
        session = _session_on(data, device)
        if session is None:
            continue
        for bad in (5, -1):
            with pytest.raises(nnapi.NnapiError):
                session.run({"p": p, "i": np.where(np.arange(12).reshape(3, 4) == 5, bad, i).astype(np.int32)})


def test_gather_with_batch_dims_of_int32_params_is_exact() -> None:
    """GATHER with batch_dims of int32 params (refused: 'NNAPI's RESHAPE takes none') on the
    params' exact float32 halves: values over the whole int32 range, as LiteRT gives."""
    from tflite_builder import Tensor, single_op

    t = [Tensor("p", "int32", [3, 5, 2]), Tensor("i", "int32", [3, 4]), Tensor("y", "int32", [3, 4, 2])]
    data = single_op("GATHER", t, [0, 1], [2], ("GatherOptions", {"Axis": 1, "BatchDims": 1}))
    p = np.random.default_rng(15).integers(-2**31, 2**31, size=(3, 5, 2), dtype=np.int64).astype(np.int32)
    p[0, 0] = [-2**31, 2**31 - 1]
    i = np.array([[0, 4, 4, 1], [2, 2, 0, 3], [4, 1, 0, 0]], np.int32)
    _assert_exact_on_every_engine(data, {"p": p, "i": i}, {"y": np.stack([p[b][i[b]] for b in range(3)])})


def test_gather_with_a_negative_batch_dims_follows_tflites_rule() -> None:
    """A negative batch_dims counts from the indices' rank (TFLite's gather.cc): -1 of rank-2
    indices is batch 1, of rank-1 indices batch 0; of a rank-0 index it is -1, which LiteRT
    refuses (it was taken as batch 0, and the run failed): refused at import, naming the rule."""
    from tflite_builder import Tensor, single_op

    p = np.arange(15, dtype=np.float32).reshape(3, 5)
    t = [Tensor("p", "float32", [3, 5]), Tensor("i", "int32", [3, 2]), Tensor("y", "float32", [3, 2])]
    data = single_op("GATHER", t, [0, 1], [2], ("GatherOptions", {"Axis": 1, "BatchDims": -1}))
    i = np.array([[2, 0], [1, 1], [4, 3]], np.int32)
    _assert_exact_on_every_engine(data, {"p": p, "i": i}, {"y": np.take_along_axis(p, i, 1)})
    t = [Tensor("p", "float32", [3, 5]), Tensor("i", "int32", []), Tensor("y", "float32", [5])]
    data = single_op("GATHER", t, [0, 1], [2], ("GatherOptions", {"Axis": 0, "BatchDims": -1}))
    with pytest.raises(nnapi.BadDataError, match=r"GATHER with batch_dims -1 of rank-2 params and rank-0 indices "
                                                 r"\(TFLite needs 0 <= batch_dims"):
        nnapi.load_tflite(data)
    if Interpreter is not None:
        with pytest.raises(RuntimeError, match="batch_dims"):
            litert_outputs(data, {"p": p, "i": np.array(2, np.int32)})


def test_round_is_half_to_even_exactly() -> None:
    """ROUND (no NNAPI operation; it was refused) as TFLite's half-to-even rounding, exact
    on ties of both signs and parities, the largest float below a half, integers beyond
    2**23 and 2**24, infinities and NaN, and bit for bit on zeros: -0 for x in [-0.5, 0]
    on both devices (floor + 1 gave +0; ONNX Runtime's Where loses a -0 from its second
    operand)."""
    from tflite_builder import Tensor, single_op

    x = np.array([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 0.49999997, -0.49999997, 3.7, -3.7, 8388607.5, 16777215.0,
                  1e30, -0.0, np.inf, -np.inf, np.nan, -0.3, -1e-45, 0.3, 0.0], np.float32)
    data = single_op("ROUND", [Tensor("x", "float32", [x.size]), Tensor("y", "float32", [x.size])], [0], [1])
    want = np.round(x)  # NumPy rounds half to even too, and keeps the sign of a zero
    assert want[0] == 0 and want[1] == 2 and want[2] == 2 and np.signbit(want[[3, 7, 13, 17, 18]]).all()
    # bits compared: -0 for x in [-0.5, 0] (assert_array_equal takes -0 == 0)
    for device in ("nnapi-reference", "nnapi-ort-cpu"):
        session = _session_on(data, device)
        if session is not None:
            np.testing.assert_array_equal(session.run({"x": x})["y"].view(np.uint32), want.view(np.uint32), device)
    if Interpreter is not None:
        np.testing.assert_array_equal(litert_outputs(data, {"x": x})["y"].view(np.uint32), want.view(np.uint32))


def test_quantized_reduce_prod_is_refused_naming_its_rule() -> None:
    """A quantized REDUCE_PROD is refused with its own reason (it read as if equal scales
    would do, though NNAPI's REDUCE_PROD takes no quantized tensor at all)."""
    from tflite_builder import Tensor, single_op

    for out_scale in (0.5, 0.25):
        t = [Tensor("x", "int8", [2, 3], scale=0.5, zero_point=0),
             Tensor("a", "int32", [1], data=np.array([1], np.int32)),
             Tensor("y", "int8", [2], scale=out_scale, zero_point=0)]
        with pytest.raises(nnapi.BadDataError, match=r"operator 0 \(REDUCE_PROD\): quantized REDUCE_PROD: NNAPI's "
                                                     r"REDUCE_PROD takes float tensors only"):
            nnapi.load_tflite(single_op("REDUCE_PROD", t, [0, 1], [2], ("ReducerOptions", {"KeepDims": False})))


def test_quantized_mul_scale_rule_is_one_rule() -> None:
    """NNAPI's quantized MUL needs output scale > input1 scale * input2 scale in float32
    (quantized_mul_scales_allowed, the one statement of it): at an output scale equal to
    the float32 product, which exceeds the float64 one, the model is refused and the
    TFLite importer takes its float32 form; one float32 step above, both take MUL."""
    from helpers import build_single_op_model, s8
    from nnapi.operations.arithmetic import quantized_mul_scales_allowed
    from tflite_builder import Tensor, single_op

    a, b = np.float32(0.6405921), np.float32(0.27708885)
    product = a * b
    assert float(product) > float(a) * float(b)  # float64 would allow an output scale of product
    for out, allowed in ((product, False), (np.nextafter(product, np.float32(1)), True)):
        assert quantized_mul_scales_allowed(float(a), float(b), float(out)) is allowed
        inputs = [(s8([4], float(a), 0), None), (s8([4], float(b), 0), None),
                  (nnapi.OperandType(nnapi.OperandCode.INT32), 0)]
        if allowed:
            build_single_op_model(nnapi.OperationCode.MUL, inputs, [s8([4], float(out), 0)])
        else:
            with pytest.raises(nnapi.BadDataError, match="must exceed the product of the input scales"):
                build_single_op_model(nnapi.OperationCode.MUL, inputs, [s8([4], float(out), 0)])
        t = [Tensor("a", "int8", [4], scale=float(a), zero_point=0), Tensor("b", "int8", [4], scale=float(b),
                                                                            zero_point=0),
             Tensor("y", "int8", [4], scale=float(out), zero_point=0)]
        try:
            imported = nnapi.load_tflite(single_op("MUL", t, [0, 1], [2]))
        except nnapi.BadDataError as error:  # the float32 form differs from TFLite's: refused by that rule
            assert not allowed and "does not exceed the product" in str(error)
            continue
        emitted = [name for lowering in imported.lowerings for name in lowering.operations]
        assert ("DEQUANTIZE" in emitted) is not allowed, emitted
