"""TFLite import gaps the third regression zoo (session 42) found: each a small model built
with tests/tflite_builder.py, checked against numpy's or TFLite's own arithmetic (and LiteRT
where installed) on both devices."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

import nnapi

pytest.importorskip("tflite")

from tflite_builder import Operator, Subgraph, Tensor, build  # noqa: E402
from tflite_cases import two_signatures  # noqa: E402

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


def _sum_model(kind: str, rows: int, quant: tuple[float, int, float, int], keep: bool = False) -> bytes:
    in_scale, in_zero, out_scale, out_zero = quant
    t = [Tensor("x", kind, [rows, 2, 3], scale=in_scale, zero_point=in_zero),
         Tensor("axes", "int32", [2], data=np.array([1, -1], np.int32)),
         Tensor("y", kind, [rows, 1, 1] if keep else [rows], scale=out_scale, zero_point=out_zero)]
    return build(Subgraph(t, [Operator("SUM", [0, 1], [2], ("ReducerOptions", {"KeepDims": keep}))], [0], [2]))


def _pairs(kind: str, rows: int) -> np.ndarray:
    low = -128 if kind == "int8" else 0
    q = np.zeros((rows, 2, 3), np.int64)
    q[:, 0, 0] = np.arange(rows) % 256 + low
    q[:, 1, 2] = (np.arange(rows) * 37) % 256 + low
    q[:, 0, 1] = (np.arange(rows) * 11) % 256 + low
    return q.astype(kind)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("quant", [(0.05, 3, 0.02, -10), (0.05, 3, 0.2, -10), (0.05, 3, 0.4, 7)])
def test_requantizing_int8_sum_is_tflites_rescale(device: str, quant) -> None:
    # LiteRT's 8-bit SUM into another quantization: round(sum of q * (in scale / out
    # scale) - zero point * 6 * that), half away from zero, + output zero point, saturated.
    # Refused before ("needs the output's scale and zero point equal to the input's").
    model = _sum_model("int8", 256, quant)
    x = _pairs("int8", 256)
    got = _run(model, {"x": x}, device)["y"]
    assert got.dtype == np.int8 and got.shape == (256,)
    raw = x.astype(np.int64).sum(axis=(1, 2))
    def at(total: int) -> int:
        return int(got[raw == total][0])

    if quant == (0.05, 3, 0.02, -10):
        # hand-computed: 2.5 * sum - 45 - 10, saturated
        assert (at(2), at(20), at(-63), at(132)) == (-50, -5, -128, 127)
    if quant == (0.05, 3, 0.2, -10):
        # ties of 0.25 * sum - 4.5 round half away from zero: 2.5 -> 3, -5.5 -> -6
        assert (at(28), at(-4), at(-2)) == (3 - 10, -6 - 10, -5 - 10)
    want = _litert_builtin_or_none(model, x)
    if want is not None:
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("device", DEVICES)
def test_requantizing_uint8_sum_keep_dims(device: str) -> None:
    model = _sum_model("uint8", 256, (0.01, 128, 0.03, 120), keep=True)
    x = _pairs("uint8", 256)
    got = _run(model, {"x": x}, device)["y"]
    assert got.shape == (256, 1, 1) and got.dtype == np.uint8
    raw = x.astype(np.int64).sum(axis=(1, 2))
    value = (raw - 128 * 6) / 3
    # away from ties float64 gives TFLite's float32 result
    clear = np.abs(np.abs(value) % 1 - 0.5) > 1e-3
    want = np.clip(np.sign(value) * np.floor(np.abs(value) + 0.5) + 120, 0, 255)
    np.testing.assert_array_equal(got.reshape(-1)[clear], want[clear])
    want = _litert_builtin_or_none(model, x)
    if want is not None:
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("device", DEVICES)
def test_cos(device: str) -> None:
    # rotary position embeddings and sin / cos features compute COS at run time; it was
    # refused ("this builtin operator has no NNAPI equivalent")
    t = [Tensor("x", "float32", [4, 256]), Tensor("y", "float32", [4, 256])]
    model = build(Subgraph(t, [Operator("COS", [0], [1])], [0], [1]))
    rng = np.random.default_rng(3)
    x = np.concatenate([rng.uniform(-4, 4, 256), rng.uniform(-1e3, 1e3, 256), np.linspace(-1e-3, 1e-3, 256),
                        np.arange(256) * np.float32(np.pi / 8)]).astype(np.float32).reshape(4, 256)
    got = _run(model, {"x": x}, device)["y"]
    want = np.cos(x.astype(np.float64))
    # a few units of float32's last place of 1, however large x is
    assert float(np.abs(got - want).max()) < 1e-6
    imported = nnapi.load_tflite(model)
    assert any("COS as 1 - 2 SIN(x / 2)^2" in str(lowering) for lowering in imported.lowerings)


def _scatter_model(kind: str, indices: np.ndarray, shape: list[int], updates_shape: list[int]) -> bytes:
    quant = {"scale": 0.1, "zero_point": 5} if kind == "int8" else {}
    t = [Tensor("indices", "int32", list(indices.shape), data=indices.astype(np.int32)),
         Tensor("u", kind, updates_shape, **quant),
         Tensor("shape", "int32", [len(shape)], data=np.array(shape, np.int32)),
         Tensor("y", kind, shape, **quant)]
    return build(Subgraph(t, [Operator("SCATTER_ND", [0, 1, 2], [3])], [1], [3]))


def _numpy_scatter(indices: np.ndarray, updates: np.ndarray, shape: list[int]) -> np.ndarray:
    out = np.zeros(shape, updates.dtype)
    k = indices.shape[-1]
    for index, update in zip(indices.reshape(-1, k), updates.reshape(-1, *shape[k:]), strict=True):
        out[tuple(index)] += update
    return out


@pytest.mark.parametrize("device", DEVICES)
def test_scatter_nd_constant_indices_sums_repeats_in_order(device: str) -> None:
    # (2, 1) three times, (0, 2) twice: TFLite adds them into zeros in index order
    indices = np.array([[2, 1], [0, 2], [2, 1], [3, 0], [0, 2], [2, 1]])
    model = _scatter_model("float32", indices, [4, 3, 2], [6, 2])
    u = np.random.default_rng(4).standard_normal((6, 2)).astype(np.float32) * 100
    got = _run(model, {"u": u}, device)["y"]
    np.testing.assert_array_equal(got, _numpy_scatter(indices, u, [4, 3, 2]))
    assert (got[1] == 0).all() and got[2, 1, 0] == np.float32(np.float32(u[0, 0] + u[2, 0]) + u[5, 0])


@pytest.mark.parametrize("device", DEVICES)
def test_scatter_nd_int8_leaves_stored_zeros(device: str) -> None:
    # TFLite's output starts as zero bytes: stored 0, real (0 - 5) * 0.1, not the zero point
    indices = np.array([[3], [0]])
    model = _scatter_model("int8", indices, [5, 2, 2], [2, 2, 2])
    u = np.arange(-4, 4, dtype=np.int8).reshape(2, 2, 2) * 30
    got = _run(model, {"u": u}, device)["y"]
    np.testing.assert_array_equal(got, _numpy_scatter(indices, u, [5, 2, 2]))


def test_scatter_nd_refusals() -> None:
    with pytest.raises(nnapi.BadDataError, match=r"\(SCATTER_ND\): repeated indices of 8-bit values"):
        nnapi.load_tflite(_scatter_model("int8", np.array([[1], [1]]), [3, 2], [2, 2]))
    with pytest.raises(nnapi.BadDataError, match="constant index outside the output's shape"):
        nnapi.load_tflite(_scatter_model("float32", np.array([[1], [3]]), [3, 2], [2, 2]))


def _reverse_sequence_model(kind: str, shape: list[int], lengths: list[int], seq: int, batch: int) -> bytes:
    quant = {"scale": 0.1, "zero_point": 5} if kind == "uint8" or kind == "int8" else {}
    t = [Tensor("x", kind, shape, **quant), Tensor("lengths", "int32", [len(lengths)],
                                                   data=np.array(lengths, np.int32)),
         Tensor("y", kind, shape, **quant)]
    return build(Subgraph(t, [Operator("REVERSE_SEQUENCE", [0, 1], [2],
                                       ("ReverseSequenceOptions", {"SeqDim": seq, "BatchDim": batch}))], [0], [2]))


def _numpy_reverse_sequence(x: np.ndarray, lengths: list[int], seq: int, batch: int) -> np.ndarray:
    out = x.copy()
    for b, length in enumerate(lengths):
        index = [slice(None)] * x.ndim
        index[batch] = b
        index[seq] = slice(0, length)
        source = x[tuple(index)]
        out[tuple(index)] = np.flip(source, axis=seq - (1 if batch < seq else 0))
    return out


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind, shape, lengths, seq, batch", [
    ("float32", [1, 7, 3], [5], 1, 0),              # Keras' masked backward RNN: one sequence
    ("float32", [3, 6, 2], [6, 0, 3], 1, 0),        # lengths per batch entry (0: unchanged)
    ("uint8", [5, 2, 3], [4, 2], 0, 1),             # batch after the sequence axis
])
def test_reverse_sequence_constant_lengths(device: str, kind, shape, lengths, seq, batch) -> None:
    model = _reverse_sequence_model(kind, shape, lengths, seq, batch)
    x = np.arange(int(np.prod(shape))).reshape(shape).astype(kind)
    got = _run(model, {"x": x}, device)["y"]
    np.testing.assert_array_equal(got, _numpy_reverse_sequence(x, lengths, seq, batch))
    want = _litert_or_none(model, {"x": x})
    if want is not None:
        np.testing.assert_array_equal(got, want["y"])


def test_reverse_sequence_int8_is_refused_as_litert_refuses_it() -> None:
    with pytest.raises(nnapi.BadDataError, match="REVERSE_SEQUENCE of TENSOR_QUANT8_ASYMM_SIGNED"):
        nnapi.load_tflite(_reverse_sequence_model("int8", [1, 4, 2], [3], 1, 0))


@pytest.mark.parametrize("device", DEVICES)
def test_int64_argmax_indices_reshaped_and_gathered(device: str) -> None:
    # tf.argmax's int64 indices read by moves (argmax(...)[0], reshape): they fit int32 as
    # ARG_MAX's own output does; the RESHAPE / GATHER of them were refused ("type INT64")
    t = [Tensor("x", "float32", [2, 5, 3]), Tensor("axis", "int32", [1], data=np.array([2], np.int32)),
         Tensor("idx", "int64", [2, 5]), Tensor("shape", "int32", [1], data=np.array([10], np.int32)),
         Tensor("flat", "int64", [10]), Tensor("pick", "int32", [3], data=np.array([9, 0, 4], np.int32)),
         Tensor("picked", "int64", [3])]
    ops = [Operator("ARG_MAX", [0, 1], [2], ("ArgMaxOptions", {"OutputType": 4})),
           Operator("RESHAPE", [2, 3], [4]),
           Operator("GATHER", [4, 5], [6], ("GatherOptions", {"Axis": 0}))]
    model = build(Subgraph(t, ops, [0], [4, 6]))
    x = np.random.default_rng(6).standard_normal((2, 5, 3)).astype(np.float32)
    got = _run(model, {"x": x}, device)
    flat = np.argmax(x, axis=2).reshape(10)
    assert got["flat"].dtype == np.int64 and got["picked"].dtype == np.int64
    np.testing.assert_array_equal(got["flat"], flat)
    np.testing.assert_array_equal(got["picked"], flat[[9, 0, 4]])


def _numpy_segments(name: str, data: np.ndarray, ids: np.ndarray, segments: int) -> np.ndarray:
    """TFLite's loops: out = 0 / 1 / lowest / highest, then out += x, out *= x,
    std::max(out, x) (x where out < x: a NaN skipped), std::min(out, x) (x where x < out)."""
    init = {"SUM": 0.0, "PROD": 1.0, "MAX": np.finfo(np.float32).min, "MIN": np.finfo(np.float32).max}
    combine = {"SUM": np.add, "PROD": np.multiply, "MAX": lambda out, x: np.where(out < x, x, out),
               "MIN": lambda out, x: np.where(x < out, x, out)}
    kind = name.rsplit("_", 1)[1]
    out = np.full((segments, *data.shape[1:]), init[kind], np.float32)
    for row, segment in zip(data, ids, strict=True):
        if segment >= 0:
            out[segment] = combine[kind](out[segment], row)
    return out


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ["SEGMENT_SUM", "UNSORTED_SEGMENT_SUM", "UNSORTED_SEGMENT_PROD",
                                  "UNSORTED_SEGMENT_MAX", "UNSORTED_SEGMENT_MIN"])
def test_segment_reductions_with_constant_ids(device: str, name: str) -> None:
    # were refused ("no NNAPI equivalent"); ids repeat up to 3 times (in any order when
    # unsorted: segments 1, 3 and 5 are empty and keep their initial value; -1 drops a row)
    if name == "SEGMENT_SUM":
        ids, segments = np.array([0, 0, 1, 2, 2, 2, 3]), 4
    else:
        ids, segments = np.array([2, 0, -1, 2, 4, 0, 2]), 6
    t = [Tensor("data", "float32", [7, 2, 3]), Tensor("ids", "int32", [7], data=ids.astype(np.int32))]
    inputs = [0, 1]
    if name != "SEGMENT_SUM":
        t.append(Tensor("n", "int32", [], data=np.array(segments, np.int32)))
        inputs.append(2)
    t.append(Tensor("y", "float32", [segments, 2, 3]))
    model = build(Subgraph(t, [Operator(name, inputs, [len(t) - 1])], [0], [len(t) - 1]))
    data = np.random.default_rng(8).standard_normal((7, 2, 3)).astype(np.float32) * 10
    got = _run(model, {"data": data}, device)["y"]
    np.testing.assert_array_equal(got, _numpy_segments(name, data, ids, segments))
    want = _litert_or_none(model, {"data": data})
    if want is not None:
        np.testing.assert_array_equal(got, want["y"])


def test_segment_sum_ids_litert_cannot_run_are_refused() -> None:
    t = [Tensor("data", "float32", [3, 2]), Tensor("ids", "int32", [3], data=np.array([0, 2, 2], np.int32)),
         Tensor("y", "float32", [3, 2])]
    with pytest.raises(nnapi.BadDataError, match=r"\(SEGMENT_SUM\): SEGMENT_SUM segment ids must start at 0"):
        nnapi.load_tflite(build(Subgraph(t, [Operator("SEGMENT_SUM", [0, 1], [2])], [0], [2])))


def test_flex_operator_is_refused_as_a_tensorflow_operator() -> None:
    # the converter's SELECT_TF_OPS writes TensorFlow operators as custom 'Flex<name>'
    t = [Tensor("x", "float32", [2, 3]), Tensor("y", "float32", [2, 3])]
    model = build(Subgraph(t, [Operator("CUSTOM", [0], [1], custom="FlexCumprod", custom_options=b"\x00")], [0], [1]))
    with pytest.raises(nnapi.BadDataError, match=r"operator 0 \(CUSTOM FlexCumprod\): TensorFlow operator 'Cumprod' "
                                                 r"\(a Flex / SELECT_TF_OPS operator"):
        nnapi.load_tflite(model)


@pytest.mark.parametrize("device", DEVICES)
def test_a_signature_picks_its_subgraph(device: str) -> None:
    # a file with several signatures: only subgraph 0 could be imported before
    model = two_signatures()
    shift = nnapi.load_tflite(model, signature="shift")
    assert shift.signature_names == {"shift_w": "w", "shift_z": "z"}
    got = nnapi.Session(shift, devices=[device]).run({"shift_w": np.arange(4, dtype=np.float32)})
    np.testing.assert_array_equal(got["shift_z"], np.arange(4, dtype=np.float32) + 1.5)
    scale = nnapi.load_tflite(model)          # no signature: subgraph 0, as LiteRT's Interpreter
    assert scale.signature_names == {"scale_x": "x", "scale_y": "y"}
    got = nnapi.Session(scale, devices=[device]).run({"scale_x": np.ones((2, 3), np.float32)})
    np.testing.assert_array_equal(got["scale_y"], np.full((2, 3), 3, np.float32))
    with pytest.raises(nnapi.BadDataError, match=r"no signature 'nope' \(the file's: 'scale', 'shift'\)"):
        nnapi.load_tflite(model, signature="nope")
    try:
        from ai_edge_litert.interpreter import Interpreter
    except ImportError:
        return
    runner = Interpreter(model_content=model).get_signature_runner("shift")
    np.testing.assert_array_equal(runner(w=np.arange(4, dtype=np.float32))["z"], np.arange(4, dtype=np.float32) + 1.5)


def _litert_builtin_or_none(model: bytes, x: np.ndarray) -> np.ndarray | None:
    """LiteRT's builtin kernels' output for ``x`` (helpers.litert_builtin_output), None
    where LiteRT is not installed."""
    try:
        from helpers import litert_builtin_output
        return litert_builtin_output(model, x)
    except ImportError:
        return None


def _litert_or_none(model: bytes, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray] | None:
    try:
        from helpers import litert_outputs
        return litert_outputs(model, feeds)
    except ImportError:
        return None


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", ["float32", "int8"])
def test_matrix_diag(device: str, kind: str) -> None:
    # were refused ("no NNAPI equivalent"); an int8 output's off-diagonal is stored 0
    quant = {"scale": 0.05, "zero_point": 7} if kind == "int8" else {}
    t = [Tensor("x", kind, [2, 3, 4], **quant), Tensor("y", kind, [2, 3, 4, 4], **quant)]
    model = build(Subgraph(t, [Operator("MATRIX_DIAG", [0], [1])], [0], [1]))
    x = (np.arange(24).reshape(2, 3, 4) * 5 - 60).astype(kind)
    got = _run(model, {"x": x}, device)["y"]
    want = np.zeros((2, 3, 4, 4), kind)
    for i in range(4):
        want[..., i, i] = x[..., i]
    np.testing.assert_array_equal(got, want)
    litert = _litert_or_none(model, {"x": x})
    if litert is not None:
        np.testing.assert_array_equal(got, litert["y"])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind, shape", [("float32", [2, 5, 3]), ("float32", [3, 4]), ("int8", [2, 3, 4])])
def test_matrix_set_diag(device: str, kind: str, shape: list[int]) -> None:
    # int8: three quantizations, TFLite copies the stored values
    q = [{"scale": s, "zero_point": z} if kind == "int8" else {} for s, z in ((0.05, 7), (0.1, -3), (0.02, 0))]
    k = min(shape[-2:])
    t = [Tensor("x", kind, shape, **q[0]), Tensor("d", kind, [*shape[:-2], k], **q[1]),
         Tensor("y", kind, shape, **q[2])]
    model = build(Subgraph(t, [Operator("MATRIX_SET_DIAG", [0, 1], [2])], [0, 1], [2]))
    x = (np.arange(int(np.prod(shape))).reshape(shape) % 97 - 40).astype(kind)
    d = (-np.arange(int(np.prod(shape[:-2])) * k).reshape(*shape[:-2], k) - 1).astype(kind)
    got = _run(model, {"x": x, "d": d}, device)["y"]
    want = x.copy()
    for i in range(k):
        want[..., i, i] = d[..., i]
    np.testing.assert_array_equal(got, want)
    litert = _litert_or_none(model, {"x": x, "d": d})
    if litert is not None:
        np.testing.assert_array_equal(got, litert["y"])


@pytest.mark.parametrize("device", DEVICES)
def test_bucketize(device: str) -> None:
    # was refused ("no NNAPI equivalent"): the count of boundaries at or below each value
    boundaries = [-1.0, 0.0, 0.5, 2.0]
    t = [Tensor("x", "float32", [2, 6]), Tensor("y", "int32", [2, 6])]
    options = ("BucketizeOptions", {"Boundaries": np.array(boundaries, np.float32)})
    model = build(Subgraph(t, [Operator("BUCKETIZE", [0], [1], options)], [0], [1]))
    x = np.array([[-3, -1, -0.5, 0, 0.25, 0.5], [0.75, 2, 3, -1e-7, 1e-7, 1.999]], np.float32)
    got = _run(model, {"x": x}, device)["y"]
    np.testing.assert_array_equal(got, np.searchsorted(boundaries, x, side="right").astype(np.int32))
    np.testing.assert_array_equal(got, [[0, 1, 1, 2, 2, 3], [3, 4, 4, 1, 2, 3]])
    litert = _litert_or_none(model, {"x": x})
    if litert is not None:
        np.testing.assert_array_equal(got, litert["y"])


@pytest.mark.parametrize("device", DEVICES)
def test_bucketize_of_nan_and_infinities_is_upper_bound(device: str) -> None:
    # std::upper_bound counts a boundary b unless x < b: NaN counts every boundary (LiteRT 3
    # of 3), where GREATER_EQUAL(NaN, b) counted none
    boundaries = np.array([-1.0, 0.0, 2.0], np.float32)
    t = [Tensor("x", "float32", [6]), Tensor("y", "int32", [6])]
    model = build(Subgraph(t, [Operator("BUCKETIZE", [0], [1], ("BucketizeOptions", {"Boundaries": boundaries}))],
                           [0], [1]))
    x = np.array([np.nan, -np.inf, np.inf, -0.0, 0.0, -np.nan], np.float32)
    got = _run(model, {"x": x}, device)["y"]
    with np.errstate(invalid="ignore"):
        want = (~(x[:, None] < boundaries[None, :])).sum(axis=1).astype(np.int32)
    np.testing.assert_array_equal(want, [3, 0, 3, 2, 2, 3])
    np.testing.assert_array_equal(got, want)
    litert = _litert_or_none(model, {"x": x})
    if litert is not None:
        np.testing.assert_array_equal(got, litert["y"])


def _same_bits_or_both_nan(got: np.ndarray, want: np.ndarray) -> None:
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    keep = ~np.isnan(want)
    np.testing.assert_array_equal(got[keep].view(np.int32), want[keep].view(np.int32))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ["SEGMENT_SUM", "UNSORTED_SEGMENT_SUM", "UNSORTED_SEGMENT_PROD",
                                  "UNSORTED_SEGMENT_MAX", "UNSORTED_SEGMENT_MIN"])
def test_segment_reductions_of_nan_infinities_and_signed_zeros(device: str, name: str) -> None:
    # TFLite combines each row into its initial value: std::max(lowest, -inf) is the lowest
    # float and std::max skips a NaN (MAXIMUM of the raw first row gave -inf / NaN); a single
    # -0 summed into 0 is +0 (the raw first row gave -0)
    inf, nan = np.inf, np.nan
    data = np.array([[-inf, nan, -0.0, inf, 1.0], [-inf, 1.0, -0.0, inf, nan], [5.0, nan, 3.0, -inf, -0.0],
                     [-0.0, -0.0, inf, -inf, 2.0]], np.float32)
    ids, segments = np.array([0, 0, 1, 2]), 3
    t = [Tensor("data", "float32", [4, 5]), Tensor("ids", "int32", [4], data=ids.astype(np.int32))]
    inputs = [0, 1]
    if name != "SEGMENT_SUM":
        t.append(Tensor("n", "int32", [], data=np.array(segments, np.int32)))
        inputs.append(2)
    t.append(Tensor("y", "float32", [segments, 5]))
    model = build(Subgraph(t, [Operator(name, inputs, [len(t) - 1])], [0], [len(t) - 1]))
    got = _run(model, {"data": data}, device)["y"]
    with np.errstate(invalid="ignore"):
        want = _numpy_segments(name, data, ids, segments)
    _same_bits_or_both_nan(got, want)
    litert = _litert_or_none(model, {"data": data})
    if litert is not None:
        _same_bits_or_both_nan(got, litert["y"])


@pytest.mark.parametrize("device", DEVICES)
def test_scatter_nd_single_negative_zero_is_added_into_zeros(device: str) -> None:
    # TFLite adds each update into zeros: a row's one -0 update is +0
    indices = np.array([[1], [0], [3], [3]])
    model = _scatter_model("float32", indices, [4, 2], [4, 2])
    u = np.array([[-0.0, 2.0], [-0.0, -0.0], [-0.0, 1.0], [-0.0, -1.0]], np.float32)
    got = _run(model, {"u": u}, device)["y"]
    want = _numpy_scatter(indices, u, [4, 2])
    assert not np.signbit(want).any()
    np.testing.assert_array_equal(got.view(np.int32), want.view(np.int32))
    litert = _litert_or_none(model, {"u": u})
    if litert is not None:
        np.testing.assert_array_equal(got.view(np.int32), litert["y"].view(np.int32))
    # slices of one value: the zeros row is one element, which ORT's NoopElimination dropped
    model = _scatter_model("float32", np.array([[1], [0]]), [3], [2])
    u = np.array([-0.0, 2.0], np.float32)
    got = _run(model, {"u": u}, device)["y"]
    np.testing.assert_array_equal(got.view(np.int32), np.array([2.0, 0.0, 0.0], np.float32).view(np.int32))


def _litert_fails(model: bytes, feeds: dict[str, np.ndarray]) -> None:
    """LiteRT (where installed) refuses ``model`` too."""
    if importlib.util.find_spec("ai_edge_litert") is None:
        return  # (helpers imports LiteRT only when called: its absence would pass as a refusal)
    from helpers import litert_outputs

    with pytest.raises(Exception):  # noqa: B017 (LiteRT raises RuntimeError / ValueError by version)
        litert_outputs(model, feeds)


@pytest.mark.parametrize("seq, batch", [(-1, 0), (1, -2)])
def test_reverse_sequence_negative_axes_are_refused_as_litert_refuses_them(seq: int, batch: int) -> None:
    # they were taken modulo the rank and imported; LiteRT fails 'seq_dim >= 0'
    model = _reverse_sequence_model("float32", [2, 4], [3, 4], seq, batch)
    with pytest.raises(nnapi.BadDataError, match=r"\(REVERSE_SEQUENCE\): REVERSE_SEQUENCE seq_dim .* must be in "
                                                 r"\[0, 2\) \(LiteRT fails the run on negative axes\)"):
        nnapi.load_tflite(model)
    _litert_fails(model, {"x": np.zeros((2, 4), np.float32)})


def test_scatter_nd_updates_of_another_shape_are_refused_as_litert_refuses_them() -> None:
    # updates [4] for indices [2, 1] into [2, 2] hold 2 x 2 values but are not [2, 2]: LiteRT
    # fails 'indices.Dims(i) != updates.Dims(i)'; they were imported by their element count
    model = _scatter_model("float32", np.array([[0], [1]]), [2, 2], [4])
    with pytest.raises(nnapi.BadDataError, match=r"\(SCATTER_ND\): SCATTER_ND updates of shape \[4\] for indices of "
                                                 r"shape \[2, 1\] into \[2, 2\] \(must be \[2, 2\]"):
        nnapi.load_tflite(model)
    _litert_fails(model, {"u": np.zeros(4, np.float32)})


def test_empty_segment_and_scatter_outputs_are_refused_naming_why() -> None:
    # num_segments 0 raised "malformed operator (ValueError: max() arg is an empty sequence)";
    # empty constant SCATTER_ND indices were called "given at run time"
    t = [Tensor("data", "float32", [2, 3]), Tensor("ids", "int32", [2], data=np.array([-1, -1], np.int32)),
         Tensor("n", "int32", [], data=np.array(0, np.int32)), Tensor("y", "float32", [0, 3])]
    with pytest.raises(nnapi.BadDataError, match=r"\(UNSORTED_SEGMENT_MAX\): UNSORTED_SEGMENT_MAX with num_segments 0 "
                                                 r"\(an empty output"):
        nnapi.load_tflite(build(Subgraph(t, [Operator("UNSORTED_SEGMENT_MAX", [0, 1, 2], [3])], [0], [3])))
    with pytest.raises(nnapi.BadDataError, match=r"\(SCATTER_ND\): SCATTER_ND with no indices \(indices of shape "
                                                 r"\[0, 1\]"):
        nnapi.load_tflite(_scatter_model("float32", np.zeros((0, 1), np.int32), [3], [0]))


@pytest.mark.parametrize("device", DEVICES)
def test_reverse_sequence_int32_of_one_length_is_one_gather(device: str) -> None:
    # refused as int32 ("no NNAPI GATHER + SPLIT form"): one length for every batch entry
    # needs only GATHER, which takes int32; differing lengths need CONCATENATION, which does not
    model = _reverse_sequence_model("int32", [2, 5, 3], [4, 4], 1, 0)
    x = (np.arange(30, dtype=np.int32).reshape(2, 5, 3) - 15) * 100_000_007
    got = _run(model, {"x": x}, device)["y"]
    np.testing.assert_array_equal(got, _numpy_reverse_sequence(x, [4, 4], 1, 0))
    litert = _litert_or_none(model, {"x": x})
    if litert is not None:
        np.testing.assert_array_equal(got, litert["y"])
    with pytest.raises(nnapi.BadDataError, match="REVERSE_SEQUENCE of TENSOR_INT32 with lengths that differ by "
                                                 r"batch entry \(their parts are joined by CONCATENATION, which "
                                                 "takes no int32"):
        nnapi.load_tflite(_reverse_sequence_model("int32", [2, 5, 3], [4, 2], 1, 0))


@pytest.mark.parametrize("device", DEVICES)
def test_8bit_matrix_diag_and_scatter_nd_copy_stored_values_into_another_quantization(device: str) -> None:
    # TFLite copies the stored values whatever the output's quantization (its zeros stored 0):
    # MATRIX_DIAG was refused and SCATTER_ND failed inside on a RESHAPE between quantizations
    t = [Tensor("x", "int8", [2, 3], scale=0.1, zero_point=2), Tensor("y", "int8", [2, 3, 3], scale=0.2,
                                                                      zero_point=-1)]
    model = build(Subgraph(t, [Operator("MATRIX_DIAG", [0], [1])], [0], [1]))
    x = np.array([[-128, 5, 127], [0, -7, 2]], np.int8)
    got = _run(model, {"x": x}, device)["y"]
    want = np.zeros((2, 3, 3), np.int8)
    for i in range(3):
        want[:, i, i] = x[:, i]
    np.testing.assert_array_equal(got, want)
    litert = _litert_or_none(model, {"x": x})
    if litert is not None:
        np.testing.assert_array_equal(got, litert["y"])
    t = [Tensor("indices", "int32", [2, 1], data=np.array([[2], [0]], np.int32)),
         Tensor("u", "int8", [2, 2], scale=0.1, zero_point=5),
         Tensor("shape", "int32", [2], data=np.array([4, 2], np.int32)),
         Tensor("y", "int8", [4, 2], scale=0.2, zero_point=-3)]
    model = build(Subgraph(t, [Operator("SCATTER_ND", [0, 1, 2], [3])], [1], [3]))
    u = np.array([[10, -128], [127, -3]], np.int8)
    got = _run(model, {"u": u}, device)["y"]
    np.testing.assert_array_equal(got, [[127, -3], [0, 0], [10, -128], [0, 0]])
    litert = _litert_or_none(model, {"u": u})
    if litert is not None:
        np.testing.assert_array_equal(got, litert["y"])


def test_rank5_reverse_sequence_and_scatter_nd_are_refused_naming_the_rule() -> None:
    # both failed inside the importer on an internal 'input 0 must have rank at most 4'
    # (CONCATENATION's, RESHAPE's); one length for every batch entry stays one GATHER
    with pytest.raises(nnapi.BadDataError, match=r"\(REVERSE_SEQUENCE\): REVERSE_SEQUENCE of rank 5 with lengths "
                                                 r"that differ by batch entry \(their parts are joined by "
                                                 "CONCATENATION, which takes rank at most 4"):
        nnapi.load_tflite(_reverse_sequence_model("float32", [2, 3, 2, 2, 2], [3, 1], 1, 0))
    with pytest.raises(nnapi.BadDataError, match=r"\(SCATTER_ND\): SCATTER_ND of rank-5 updates \(they are RESHAPEd "
                                                 "to rows, and NNAPI's RESHAPE takes rank at most 4\\)"):
        nnapi.load_tflite(_scatter_model("float32", np.array([[0], [1]]), [2, 2, 2, 2, 2], [2, 2, 2, 2, 2]))
    x = np.arange(48, dtype=np.float32).reshape(2, 3, 2, 2, 2)
    got = _run(_reverse_sequence_model("float32", [2, 3, 2, 2, 2], [3, 3], 1, 0), {"x": x}, "nnapi-reference")["y"]
    np.testing.assert_array_equal(got, _numpy_reverse_sequence(x, [3, 3], 1, 0))
