"""Dimensions a TFLite file's shape signatures leave open (a dynamic batch): kept open
where NNAPI can express the model so, fixed to the file's static shape (what LiteRT
allocates without resize_tensor_input) where it cannot, or when asked."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("tflite")

import nnapi  # noqa: E402
from helpers import litert_outputs  # noqa: E402
from tflite_builder import Operator, Subgraph, Tensor, build  # noqa: E402
from tflite_cases import dynamic_batch_add  # noqa: E402


def _reshape_to_own_shape() -> bytes:
    """y = RESHAPE(x * 2, SHAPE(x)) with x [-1, 6]: SHAPE of an open dimension, which NNAPI
    (no SHAPE operation) cannot express."""
    t = [Tensor("x", "float32", [1, 6], shape_signature=[-1, 6]),
         Tensor("two", "float32", [], data=np.array(2, np.float32)),
         Tensor("doubled", "float32", [1, 6], shape_signature=[-1, 6]),
         Tensor("shape", "int32", [2]),
         Tensor("y", "float32", [1, 6], shape_signature=[-1, 6])]
    ops = [Operator("MUL", [0, 1], [2], ("MulOptions", {})),
           Operator("SHAPE", [0], [3], ("ShapeOptions", {"OutType": 2})),
           Operator("RESHAPE", [2, 3], [4])]
    return build(Subgraph(t, ops, [0], [4]))


def _placeholder_shapes() -> bytes:
    """BirdNET's framing and spectrum in small, as TensorFlow wrote BirdNET's analyzer: x
    [-1, 12]; where shape signatures leave dimensions open, the static shapes declared are
    placeholders (1s) that no operation computes. y = RESHAPE(x * 2, SHAPE(x));
    re = CAST(SQUEEZE(RFFT2D(EXPAND_DIMS(RESHAPE(x * 2, [-1, 3, 4]), 2), [1, 4]), [2])),
    the real part of each frame's spectrum."""
    t = [Tensor("x", "float32", [1, 12], shape_signature=[-1, 12]),                                  # 0
         Tensor("two", "float32", [], data=np.array(2, np.float32)),                                   # 1
         Tensor("doubled", "float32", [1, 1], shape_signature=[-1, -1]),                               # 2
         Tensor("shape", "int32", [2]),                                                                # 3
         Tensor("y", "float32", [1, 1], shape_signature=[-1, -1]),                                     # 4
         Tensor("frame_shape", "int32", [3], data=np.array([-1, 3, 4], np.int32)),                    # 5
         Tensor("frames", "float32", [1, 1, 1], shape_signature=[-1, -1, -1]),                         # 6
         Tensor("axis", "int32", [], data=np.array(2, np.int32)),                                      # 7
         Tensor("expanded", "float32", [1, 1, 1, 1], shape_signature=[-1, -1, -1, -1]),                # 8
         Tensor("fft_length", "int32", [2], data=np.array([1, 4], np.int32)),                          # 9
         Tensor("spectrum", "complex64", [1, 1, 1, 1], shape_signature=[-1, -1, -1, -1]),              # 10
         Tensor("squeezed", "complex64", [1, 1, 1], shape_signature=[-1, -1, -1]),                     # 11
         Tensor("re", "float32", [1, 1, 1], shape_signature=[-1, -1, -1])]                             # 12
    ops = [Operator("MUL", [0, 1], [2], ("MulOptions", {})),
           Operator("SHAPE", [0], [3], ("ShapeOptions", {"OutType": 2})),
           Operator("RESHAPE", [2, 3], [4]),
           Operator("RESHAPE", [2, 5], [6]),
           Operator("EXPAND_DIMS", [6, 7], [8]),
           Operator("RFFT2D", [8, 9], [10]),
           Operator("SQUEEZE", [10], [11], ("SqueezeOptions", {"SqueezeDims": [2]})),
           Operator("CAST", [11], [12])]
    return build(Subgraph(t, ops, [0], [4, 12]))


def test_placeholder_static_shapes_are_derived_from_the_inputs() -> None:
    """A file whose declared static shapes disagree with what its operations compute (BirdNET's
    analyzer: refused before, "output 0 is declared [1, 1], but the inputs give [1, 144000]")
    imports at its inputs' static shapes with every other open dimension taken from the
    operation writing it, as LiteRT allocates it; the same values as numpy and LiteRT."""
    data = _placeholder_shapes()
    with pytest.raises(nnapi.NnapiError, match="SHAPE"):
        nnapi.load_model(data, static_shapes=False)
    for static_shapes in (None, True):
        imported = nnapi.load_model(data, static_shapes=static_shapes)
        assert imported.inputs[0].shape == (1, 12)
        assert [o.shape for o in imported.outputs] == [(1, 12), (1, 3, 3)]
        # why: the file's own static shapes refused, naming the placeholder
        assert "derived" in imported.fixed_shapes
        assert "declared [1, 1], but the inputs give [1, 12]" in imported.fixed_shapes
    x = (np.arange(12, dtype=np.float32).reshape(1, 12) - 5.5) / 3
    want_re = np.fft.rfft(2 * x.astype(np.float64).reshape(1, 3, 4), n=4, axis=-1).real
    for device in ("nnapi-reference", "nnapi-ort-cpu"):
        try:
            session = nnapi.Session(imported, devices=[device])
        except nnapi.BadDataError as error:  # nnapi-ort-cpu needs onnxruntime
            assert "no device named" in str(error)
            continue
        got = session.run({"x": x})
        np.testing.assert_array_equal(got["y"], x * 2)
        np.testing.assert_allclose(got["re"], want_re, rtol=0, atol=1e-5)
    litert = litert_outputs(data, {"x": x})
    np.testing.assert_array_equal(litert["y"], x * 2)
    np.testing.assert_allclose(litert["re"], want_re, rtol=0, atol=1e-5)


def test_open_dimensions_stay_open_where_nnapi_expresses_them() -> None:
    imported = nnapi.load_model(dynamic_batch_add())
    assert imported.fixed_shapes is None
    assert imported.inputs[0].shape == (-1, 3)


def test_shape_of_an_open_dimension_imports_at_the_static_shape() -> None:
    data = _reshape_to_own_shape()
    with pytest.raises(nnapi.NnapiError, match="SHAPE") as refused:
        nnapi.load_model(data, static_shapes=False)
    assert refused.value.code == nnapi.ResultCode.BAD_DATA
    imported = nnapi.load_model(data)
    assert imported.inputs[0].shape == (1, 6)
    assert "SHAPE" in imported.fixed_shapes
    x = np.arange(6, dtype=np.float32).reshape(1, 6) - 2.5
    session = nnapi.Session(imported, "nnapi-reference")
    got = session.run({"x": x})["y"]
    np.testing.assert_array_equal(got, x * 2)
    np.testing.assert_array_equal(got, litert_outputs(data, {"x": x})["y"])


def test_static_shapes_asked_for() -> None:
    imported = nnapi.load_model(dynamic_batch_add(), static_shapes=True)
    assert imported.inputs[0].shape == (1, 3)
    assert imported.fixed_shapes == "static shapes asked for"


def test_inspect_says_the_shapes_were_fixed(tmp_path, capsys) -> None:
    from nnapi.cli import main

    path = tmp_path / "own_shape.tflite"
    path.write_bytes(_reshape_to_own_shape())
    assert main(["inspect", str(path)]) == 0
    out = capsys.readouterr().out
    assert "input  x: TENSOR_FLOAT32[1,6]" in out
    assert "open dimensions fixed" in out and "SHAPE" in out


@pytest.mark.parametrize("x_shape, adj_y", [((-1, 6), False), ((-1, 4, 6), False), ((-1, 1, 4, 6), True),
                                            ((1, -1, 6), False)])
def test_matmul_by_a_constant_matrix_over_open_dimensions(x_shape, adj_y) -> None:
    """BATCH_MATMUL(x, W) with x's leading dimensions open and W a constant matrix: NNAPI's
    BATCH_MATMUL needs W broadcast to x's batch, which a constant of unknown size cannot
    be; it imports as FULLY_CONNECTED or a 1x1 CONV_2D, and keeps the dimensions open."""
    rng = np.random.default_rng(len(x_shape))
    matrix = rng.standard_normal((6, 5)).astype(np.float32)
    stored = matrix.T.copy() if adj_y else matrix
    out_signature = list(x_shape[:-1]) + [5]
    t = [Tensor("x", "float32", [1 if d < 0 else d for d in x_shape], shape_signature=list(x_shape)),
         Tensor("w", "float32", list(stored.shape), data=stored),
         Tensor("y", "float32", [1 if d < 0 else d for d in out_signature], shape_signature=out_signature)]
    data = build(Subgraph(t, [Operator("BATCH_MATMUL", [0, 1], [2], ("BatchMatMulOptions", {"AdjY": adj_y}))],
                          [0], [2]))
    imported = nnapi.load_model(data)
    assert imported.fixed_shapes is None and imported.inputs[0].shape == x_shape
    assert "BATCH_MATMUL by a constant matrix" in imported.lowerings[0].reason
    for size in (1, 3):
        x = rng.standard_normal([size if d < 0 else d for d in x_shape]).astype(np.float32)
        expected = x @ matrix
        for device in ("nnapi-reference", None):
            session = nnapi.Session(imported, device) if device else nnapi.Session(imported)
            got = session.run({"x": x})["y"]
            assert got.shape == expected.shape
            np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_a_model_refused_every_way_names_each_reason() -> None:
    """The file's static shapes of open dimensions are only what its converter wrote: when
    neither the open form, nor those shapes, nor shapes derived from the inputs' hold, the
    error says why each failed (here: SHAPE of an open dimension; a placeholder [1, 1]; an
    RFFT2D over two axes, which NNAPI cannot express at any shape)."""
    t = [Tensor("x", "float32", [1, 6], shape_signature=[-1, 6]),
         Tensor("two", "float32", [], data=np.array(2, np.float32)),
         Tensor("doubled", "float32", [1, 6], shape_signature=[-1, 6]),
         Tensor("shape", "int32", [2]),
         Tensor("y", "float32", [1, 1], shape_signature=[-1, -1]),  # a placeholder shape
         Tensor("fft_length", "int32", [2], data=np.array([2, 6], np.int32)),
         Tensor("spectrum", "complex64", [1, 4], shape_signature=[-1, 4])]
    ops = [Operator("MUL", [0, 1], [2], ("MulOptions", {})),
           Operator("SHAPE", [0], [3], ("ShapeOptions", {"OutType": 2})),
           Operator("RESHAPE", [2, 3], [4]),
           Operator("RFFT2D", [4, 5], [6])]
    with pytest.raises(nnapi.NnapiError, match=r"operator 1 \(SHAPE\).*; nor at the file's static shapes.*"
                                               r"operator 2 \(RESHAPE\).*; nor with its other shapes derived from "
                                               r"its inputs' static shapes.*operator 3 \(RFFT2D\)") as refused:
        nnapi.load_model(build(Subgraph(t, ops, [0], [6])))
    assert refused.value.code == nnapi.ResultCode.BAD_DATA


def _framed_spectrum(samples: int = 24, frame: int = 8) -> bytes:
    """BirdNET's and word-activation-recognition's front end in small: audio [-1, samples]
    cut into frames by a shape computed from SHAPE (STRIDED_SLICE, FLOOR_DIV, PACK),
    windowed, RFFT2D, SQUEEZE, then COMPLEX_ABS and a CAST of the complex spectrum to
    float32 (its real part). Every tensor after the input declares the placeholder shapes
    such files hold: open dimensions as 1, and the spectrum's bins as the frame's samples."""
    window = (0.5 - 0.5 * np.cos(2 * np.pi * np.arange(frame) / frame)).astype(np.float32)
    i32 = lambda v: np.array(v, np.int32)  # noqa: E731
    t = [Tensor("audio", "float32", [1, samples], shape_signature=[-1, samples]),        # 0
         Tensor("shape", "int32", [2]),                                                   # 1
         Tensor("begin", "int32", [1], data=i32([1])),                                    # 2
         Tensor("end", "int32", [1], data=i32([2])),                                      # 3
         Tensor("stride", "int32", [1], data=i32([1])),                                   # 4
         Tensor("length", "int32", []),                                                   # 5
         Tensor("frame", "int32", [], data=i32(frame)),                                   # 6
         Tensor("frames", "int32", []),                                                   # 7
         Tensor("one", "int32", [], data=i32(1)),                                         # 8
         Tensor("framed_shape", "int32", [3]),                                            # 9
         Tensor("framed", "float32", [1, 1, frame], shape_signature=[-1, -1, frame]),     # 10
         Tensor("window", "float32", [frame], data=window),                               # 11
         Tensor("windowed", "float32", [1, 1, frame], shape_signature=[-1, -1, frame]),   # 12
         Tensor("fft_length", "int32", [2], data=i32([1, frame])),                        # 13
         Tensor("spectrum4", "complex64", [1, 1, 1, frame], shape_signature=[-1, -1, 1, frame]),  # 14
         Tensor("spectrum", "complex64", [1, frame], shape_signature=[-1, frame]),        # 15
         Tensor("magnitude", "float32", [1, frame], shape_signature=[-1, frame]),         # 16
         Tensor("real", "float32", [1, frame], shape_signature=[-1, frame]),              # 17
         Tensor("axis", "int32", [], data=i32(2)),                                        # 18
         Tensor("windowed4", "float32", [1, 1, 1, frame], shape_signature=[-1, -1, 1, frame])]  # 19
    ops = [Operator("SHAPE", [0], [1], ("ShapeOptions", {"OutType": 2})),
           Operator("STRIDED_SLICE", [1, 2, 3, 4], [5], ("StridedSliceOptions", {"ShrinkAxisMask": 1})),
           Operator("FLOOR_DIV", [5, 6], [7]),
           Operator("PACK", [7, 8, 6], [9], ("PackOptions", {"ValuesCount": 3, "Axis": 0})),
           Operator("RESHAPE", [0, 9], [10]),
           Operator("MUL", [10, 11], [12], ("MulOptions", {})),
           Operator("EXPAND_DIMS", [12, 18], [19]),
           Operator("RFFT2D", [19, 13], [14]),
           Operator("SQUEEZE", [14], [15], ("SqueezeOptions", {"SqueezeDims": [1, 2]})),
           Operator("COMPLEX_ABS", [15], [16]),
           Operator("CAST", [15], [17])]
    return build(Subgraph(t, ops, [0], [16, 17]))


def test_framed_spectrum_with_placeholder_shapes_agrees_with_numpy_and_litert() -> None:
    """Refused before: the file's signature fixes the RFFT2D's last dimension at 8 (the
    frame's samples, a placeholder: 5 bins follow), so no open dimension was left for the
    derived shapes to fill. Every dimension after the inputs is derived now: 3 frames of
    5 bins, as LiteRT computes them; the values
    agree with numpy's float64 FFT within float32 rounding, and with LiteRT, on each device."""
    data = _framed_spectrum()
    imported = nnapi.load_model(data)
    assert [o.shape for o in imported.outputs] == [(3, 5), (3, 5)]
    audio = np.random.default_rng(3).standard_normal((1, 24)).astype(np.float32)
    window = 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(8) / 8)
    spectrum = np.fft.rfft(audio.astype(np.float64).reshape(3, 8) * window, axis=-1)
    scale = np.abs(spectrum).max()
    litert = litert_outputs(data, {"audio": audio})
    assert litert["magnitude"].shape == (3, 5)
    for device in ("nnapi-reference", "nnapi-ort-cpu"):
        if device not in [d.name for d in nnapi.get_devices()]:
            continue
        got = nnapi.Session(imported, device).run({"audio": audio})
        for name, want in (("magnitude", np.abs(spectrum)), ("real", spectrum.real)):
            assert got[name].shape == (3, 5)
            assert np.abs(got[name] - want).max() <= 1e-6 * scale, (device, name)
            assert np.abs(got[name] - litert[name]).max() <= 1e-6 * scale, (device, name)


def test_reshapes_of_constants_with_placeholder_shapes_fold_by_their_own_arguments() -> None:
    """SHAPE(x) through EXPAND_DIMS, RESHAPE and SQUEEZE whose outputs the file declares
    as placeholders folds at import by each operator's axis, shape input or squeezed
    dimensions (not the declared shape), and y = RESHAPE(x * 2, that) runs as LiteRT runs it."""
    i32 = lambda v: np.array(v, np.int32)  # noqa: E731
    t = [Tensor("x", "float32", [2, 6], shape_signature=[-1, 6]),              # 0
         Tensor("shape", "int32", [2]),                                       # 1
         Tensor("axis", "int32", [], data=i32(0)),                            # 2
         Tensor("expanded", "int32", [1, 1], shape_signature=[-1, -1]),       # 3
         Tensor("new_shape", "int32", [3], data=i32([1, 2, 1])),              # 4
         Tensor("reshaped", "int32", [1, 1, 1], shape_signature=[-1, -1, -1]),  # 5
         Tensor("squeezed", "int32", [1], shape_signature=[-1]),              # 6
         Tensor("two", "float32", [], data=np.array(2, np.float32)),          # 7
         Tensor("doubled", "float32", [1, 1], shape_signature=[-1, -1]),      # 8
         Tensor("y", "float32", [1, 1], shape_signature=[-1, -1])]            # 9
    ops = [Operator("SHAPE", [0], [1], ("ShapeOptions", {"OutType": 2})),
           Operator("EXPAND_DIMS", [1, 2], [3]),
           Operator("RESHAPE", [3, 4], [5]),
           Operator("SQUEEZE", [5], [6], ("SqueezeOptions", {"SqueezeDims": [0, 2]})),
           Operator("MUL", [0, 7], [8], ("MulOptions", {})),
           Operator("RESHAPE", [8, 6], [9])]
    data = build(Subgraph(t, ops, [0], [9]))
    imported = nnapi.load_model(data)
    assert imported.outputs[0].shape == (2, 6)
    folded = [lowering.source.name for lowering in imported.lowerings if "folded" in lowering.reason]
    assert folded == ["SHAPE", "EXPAND_DIMS", "RESHAPE", "SQUEEZE"]
    x = np.arange(12, dtype=np.float32).reshape(2, 6)
    got = nnapi.Session(imported, "nnapi-reference").run({"x": x})["y"]
    np.testing.assert_array_equal(got, x * 2)
    np.testing.assert_array_equal(litert_outputs(data, {"x": x})["y"], x * 2)
