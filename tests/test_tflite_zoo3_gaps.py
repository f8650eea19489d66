"""TFLite import gaps the third regression zoo (session 42) found: each a small model built
with tests/tflite_builder.py, checked against numpy's or TFLite's own arithmetic (and LiteRT
where installed) on both devices."""

from __future__ import annotations

import numpy as np
import pytest

import nnapi

pytest.importorskip("tflite")

from tflite_builder import Operator, Subgraph, Tensor, build  # noqa: E402

DEVICES = ("nnapi-reference", "nnapi-ort-cpu")


def _run(model: bytes, feeds: dict[str, np.ndarray], device: str) -> dict[str, np.ndarray]:
    return nnapi.Session(model, devices=[device]).run(feeds)


def _masked_step_model() -> bytes:
    """Keras' masked RNN step (Embedding(mask_zero=True) + GRU): the step's mask, a bool
    [T, 1, 1] tensor, GATHERed by the rank-0 loop counter, picks the new state or the old."""
    t = [Tensor("mask", "bool", [5, 1, 1]), Tensor("x", "float32", [5, 1, 3]), Tensor("i", "int32", []),
         Tensor("m", "bool", [1, 1]), Tensor("xi", "float32", [1, 3]),
         Tensor("zero", "float32", [], data=np.array(0.0, np.float32)), Tensor("y", "float32", [1, 3])]
    ops = [Operator("GATHER", [0, 2], [3], ("GatherOptions", {"Axis": 0})),
           Operator("GATHER", [1, 2], [4], ("GatherOptions", {"Axis": 0})),
           Operator("SELECT_V2", [3, 4, 5], [6])]
    return build(Subgraph(t, ops, [0, 1, 2], [6]))


@pytest.mark.parametrize("device", DEVICES)
def test_bool_gather_by_a_rank0_index(device: str) -> None:
    # the bool GATHER moves as float32 1.0 / 0.0; its rank-0 index path made its temporary
    # of the tensor's type (BOOL8) and NNAPI refused the GATHER (a masked Bidirectional GRU)
    model = _masked_step_model()
    mask = np.array([True, False, True, False, False]).reshape(5, 1, 1)
    x = np.arange(15, dtype=np.float32).reshape(5, 1, 3) + 1
    for i in range(5):
        got = _run(model, {"mask": mask, "x": x, "i": np.array(i, np.int32)}, device)["y"]
        np.testing.assert_array_equal(got, x[i] if mask[i, 0, 0] else np.zeros((1, 3), np.float32))
