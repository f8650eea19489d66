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
