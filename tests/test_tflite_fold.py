"""Operators whose inputs are all constants are folded at import (importers/tflite/fold.py), with
TensorFlow's meaning: each case's folded value is checked against LiteRT computing the
same operator at run time, and the NNAPI model keeps only the operation reading the
model's input."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("tflite")
pytest.importorskip("ai_edge_litert")

import nnapi  # noqa: E402
from helpers import litert_outputs  # noqa: E402
from tflite_builder import Operator, Subgraph, Tensor, build  # noqa: E402

_TYPE = {np.dtype(np.float32): "float32", np.dtype(np.int32): "int32"}
F = np.arange(-12, 12, dtype=np.float32).reshape(2, 3, 4) * 0.75
N = np.arange(-12, 12, dtype=np.int32).reshape(2, 3, 4)


def _i32(*values) -> np.ndarray:
    return np.array(values, np.int32)


#: (id, operator, constant inputs, options, output shape, output dtype)
CASES = [
    ("floor_div_int", "FLOOR_DIV", [N, _i32(5)], None, (2, 3, 4), np.int32),
    ("floor_div_float", "FLOOR_DIV", [F, np.float32(-1.5)], None, (2, 3, 4), np.float32),
    ("floor_mod_int", "FLOOR_MOD", [N, _i32(-5)], None, (2, 3, 4), np.int32),
    ("floor_mod_float", "FLOOR_MOD", [F, np.float32(2.5)], None, (2, 3, 4), np.float32),
    ("mul_int", "MUL", [N, _i32(3)], ("MulOptions", {}), (2, 3, 4), np.int32),
    ("div_int_truncates", "DIV", [N, _i32(-5)], ("DivOptions", {}), (2, 3, 4), np.int32),
    ("div_int_broadcast", "DIV", [_i32(-7, 7, -2**31 + 1), N[:1, :, :1] * 2 + 1], ("DivOptions", {}), (1, 3, 3),
     np.int32),
    ("sub_float", "SUB", [F, F[:1]], ("SubOptions", {}), (2, 3, 4), np.float32),
    ("maximum", "MAXIMUM", [N, _i32(2)], None, (2, 3, 4), np.int32),
    ("pack_axis1", "PACK", [F[0], F[1]], ("PackOptions", {"ValuesCount": 2, "Axis": 1}), (3, 2, 4), np.float32),
    ("concat_axis2", "CONCATENATION", [N, N[:, :, :1]], ("ConcatenationOptions", {"Axis": 2}), (2, 3, 5),
     np.int32),
    ("gather_axis1", "GATHER", [F, _i32(2, 0, 2)], ("GatherOptions", {"Axis": 1}), (2, 3, 4), np.float32),
    ("range", "RANGE", [np.array(3, np.int32), np.array(-9, np.int32), np.array(-4, np.int32)], None, (3,),
     np.int32),
    ("reduce_prod_keep", "REDUCE_PROD", [N[:, :2, :2] + 13, _i32(1)], ("ReducerOptions", {"KeepDims": True}),
     (2, 1, 2), np.int32),
    ("sum", "SUM", [F, _i32(0, 2)], ("ReducerOptions", {"KeepDims": False}), (3,), np.float32),
    ("strided_slice_masks", "STRIDED_SLICE", [F, _i32(1, -1, 3), _i32(0, 0, 0), _i32(1, -2, -2)],
     ("StridedSliceOptions", {"BeginMask": 2, "EndMask": 1, "ShrinkAxisMask": 0}), (1, 1, 2), np.float32),
    ("strided_slice_shrink", "STRIDED_SLICE", [N, _i32(-1, 1), _i32(0, 3), _i32(1, 1)],
     ("StridedSliceOptions", {"ShrinkAxisMask": 1}), (2, 4), np.int32),
    ("slice", "SLICE", [F, _i32(1, 0, 1), _i32(-1, 2, 3)], None, (1, 2, 3), np.float32),
    ("transpose", "TRANSPOSE", [N, _i32(2, 0, 1)], None, (4, 2, 3), np.int32),
    ("tile", "TILE", [F[:, :1, :], _i32(1, 2, 1)], None, (2, 2, 4), np.float32),
    ("fill", "FILL", [_i32(2, 3), np.float32(-2.5)], None, (2, 3), np.float32),
    ("cast_float_to_int", "CAST", [F], None, (2, 3, 4), np.int32),
]


def _model(op: str, constants: list[np.ndarray], options, shape: tuple, dtype) -> bytes:
    """y = ADD(x, op(constants)): x the model's input of the folded value's shape."""
    tensors = [Tensor(f"c{i}", _TYPE[np.asarray(c).dtype], list(np.shape(c)), data=np.asarray(c))
               for i, c in enumerate(constants)]
    n = len(tensors)
    kind = _TYPE[np.dtype(dtype)]
    tensors += [Tensor("folded", kind, list(shape)), Tensor("x", kind, list(shape)), Tensor("y", kind, list(shape))]
    ops = [Operator(op, list(range(n)), [n], options), Operator("ADD", [n + 1, n], [n + 2], ("AddOptions", {}))]
    return build(Subgraph(tensors, ops, [n + 1], [n + 2]))


@pytest.mark.parametrize("case", CASES, ids=[case[0] for case in CASES])
def test_folded_constant_equals_litert(case) -> None:
    _, op, constants, options, shape, dtype = case
    data = _model(op, constants, options, shape, dtype)
    imported = nnapi.load_model(data)
    assert [o.code.name for o in imported.model._operations] == ["ADD"]
    assert any("folded at import" in lowering.reason for lowering in imported.lowerings)
    x = (np.arange(int(np.prod(shape))).reshape(shape) % 7).astype(dtype)
    got = nnapi.Session(imported, "nnapi-reference").run({"x": x})["y"]
    np.testing.assert_array_equal(got, litert_outputs(data, {"x": x})["y"])


def test_shape_arithmetic_folds_to_a_reshape() -> None:
    """RESHAPE(x, PACK(SHAPE(x)[0], REDUCE_PROD(SHAPE(x)) // SHAPE(x)[0])): TensorFlow's
    flatten; FLOOR_DIV and PACK of scalars have no NNAPI operation."""
    t = [Tensor("x", "float32", [2, 3, 4]), Tensor("shape", "int32", [3]),
         Tensor("begin", "int32", [1], data=_i32(0)), Tensor("end", "int32", [1], data=_i32(1)),
         Tensor("stride", "int32", [1], data=_i32(1)), Tensor("batch", "int32", []),
         Tensor("axes", "int32", [1], data=_i32(0)), Tensor("count", "int32", []),
         Tensor("rest", "int32", []), Tensor("new_shape", "int32", [2]), Tensor("y", "float32", [2, 12])]
    ops = [Operator("SHAPE", [0], [1], ("ShapeOptions", {"OutType": 2})),
           Operator("STRIDED_SLICE", [1, 2, 3, 4], [5], ("StridedSliceOptions", {"ShrinkAxisMask": 1})),
           Operator("REDUCE_PROD", [1, 6], [7], ("ReducerOptions", {"KeepDims": False})),
           Operator("FLOOR_DIV", [7, 5], [8]),
           Operator("PACK", [5, 8], [9], ("PackOptions", {"ValuesCount": 2, "Axis": 0})),
           Operator("RESHAPE", [0, 9], [10])]
    data = build(Subgraph(t, ops, [0], [10]))
    imported = nnapi.load_model(data)
    assert [o.code.name for o in imported.model._operations] == ["RESHAPE"]
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    got = nnapi.Session(imported, "nnapi-reference").run({"x": x})["y"]
    np.testing.assert_array_equal(got, litert_outputs(data, {"x": x})["y"])


def test_a_folded_value_of_another_shape_than_declared_is_refused() -> None:
    t = [Tensor("a", "int32", [3], data=_i32(1, 2, 3)), Tensor("b", "int32", [], data=_i32(2)),
         Tensor("folded", "int32", [2]), Tensor("x", "int32", [2]), Tensor("y", "int32", [2])]
    ops = [Operator("FLOOR_DIV", [0, 1], [2]), Operator("ADD", [3, 2], [4], ("AddOptions", {}))]
    with pytest.raises(nnapi.NnapiError, match=r"operator 0 \(FLOOR_DIV\).*gives shape \[3\], the file declares \[2\]"):
        nnapi.load_model(build(Subgraph(t, ops, [3], [4])))
