"""TFLite resource variables (CALL_ONCE, VAR_HANDLE, READ_VARIABLE, ASSIGN_VARIABLE): the
state of TensorFlow's streaming layers (microWakeWord's), imported as the session's state
tensors and carried from run to run as LiteRT carries them."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("tflite")

import nnapi  # noqa: E402
from tflite_builder import Operator, Subgraph, Tensor, build  # noqa: E402

try:
    from ai_edge_litert.interpreter import Interpreter
except ImportError:  # LiteRT is optional: the expected values are written out too
    Interpreter = None


def _init_subgraph(values: dict[str, np.ndarray], kind: str, scale: float | None = None,
                   zero_point: int | None = None) -> Subgraph:
    """CALL_ONCE's subgraph: VAR_HANDLE + ASSIGN_VARIABLE of a constant per variable."""
    tensors, ops = [], []
    for name, value in values.items():
        tensors += [Tensor(f"{name}_handle", "resource", []),
                    Tensor(f"{name}_initial", kind, list(value.shape), data=value, scale=scale, zero_point=zero_point)]
        handle = len(tensors) - 2
        ops += [Operator("VAR_HANDLE", [], [handle], ("VarHandleOptions", {"SharedName": name})),
                Operator("ASSIGN_VARIABLE", [handle, handle + 1], [])]
    return Subgraph(tensors, ops, [], [], name="init")


def _accumulator() -> bytes:
    """y = acc + x, then acc = y: acc starts at [1, 2, 3, 4] (CALL_ONCE)."""
    t = [Tensor("x", "float32", [1, 4]),            # 0
         Tensor("acc_handle", "resource", []),       # 1
         Tensor("acc", "float32", [1, 4]),           # 2
         Tensor("y", "float32", [1, 4])]             # 3
    ops = [Operator("CALL_ONCE", [], [], ("CallOnceOptions", {"InitSubgraphIndex": 1})),
           Operator("VAR_HANDLE", [], [1], ("VarHandleOptions", {"SharedName": "acc"})),
           Operator("READ_VARIABLE", [1], [2]),
           Operator("ADD", [2, 0], [3], ("AddOptions", {})),
           Operator("ASSIGN_VARIABLE", [1, 3], [])]
    init = _init_subgraph({"acc": np.array([[1, 2, 3, 4]], np.float32)}, "float32")
    return build(Subgraph(t, ops, [0], [3]), init)


def _ring_buffer(scale: float = 0.5, zero_point: int = -3) -> bytes:
    """microWakeWord's stream layer in small, int8: window = CONCATENATION(state [1, 2, 4],
    x [1, 1, 4]), the output; state = the window's last two frames (STRIDED_SLICE)."""
    q = {"scale": scale, "zero_point": zero_point}
    i32 = lambda v: np.array(v, np.int32)  # noqa: E731
    t = [Tensor("x", "int8", [1, 1, 4], **q),                    # 0
         Tensor("state_handle", "resource", []),                 # 1
         Tensor("state", "int8", [1, 2, 4], **q),                # 2
         Tensor("window", "int8", [1, 3, 4], **q),               # 3
         Tensor("begin", "int32", [3], data=i32([0, 1, 0])),    # 4
         Tensor("end", "int32", [3], data=i32([1, 3, 4])),      # 5
         Tensor("strides", "int32", [3], data=i32([1, 1, 1])),  # 6
         Tensor("kept", "int8", [1, 2, 4], **q)]                 # 7
    ops = [Operator("CALL_ONCE", [], [], ("CallOnceOptions", {"InitSubgraphIndex": 1})),
           Operator("VAR_HANDLE", [], [1], ("VarHandleOptions", {"SharedName": "stream/states"})),
           Operator("READ_VARIABLE", [1], [2]),
           Operator("CONCATENATION", [2, 0], [3], ("ConcatenationOptions", {"Axis": 1})),
           Operator("STRIDED_SLICE", [3, 4, 5, 6], [7], ("StridedSliceOptions", {})),
           Operator("ASSIGN_VARIABLE", [1, 7], [])]
    initial = np.full((1, 2, 4), zero_point, np.int8)
    init = _init_subgraph({"stream/states": initial}, "int8", scale, zero_point)
    return build(Subgraph(t, ops, [0], [3]), init)


def _litert_runs(data: bytes, name: str, inputs: list[np.ndarray]) -> list[np.ndarray]:
    interpreter = Interpreter(model_content=data, num_threads=1)
    interpreter.allocate_tensors()
    index = {d["name"]: d["index"] for d in interpreter.get_input_details()}[name]
    results = []
    for x in inputs:
        interpreter.set_tensor(index, x)
        interpreter.invoke()
        results.append(interpreter.get_tensor(interpreter.get_output_details()[0]["index"]).copy())
    return results


def _devices() -> list[str]:
    return [name for name in ("nnapi-reference", "nnapi-ort-cpu") if name in [d.name for d in nnapi.get_devices()]]


def test_variable_carried_from_run_to_run() -> None:
    """Refused before (CALL_ONCE has no NNAPI equivalent). The variable is a state input
    that starts at CALL_ONCE's constant and a state output of its assigned value: run t gives
    [1, 2, 3, 4] + x_1 + ... + x_t, as LiteRT; reset_states starts over."""
    data = _accumulator()
    imported = nnapi.load_tflite(data)
    assert [(s.name, s.input_index, s.output_index) for s in imported.states] == [("acc", 1, 1)]
    np.testing.assert_array_equal(imported.states[0].initial, [[1, 2, 3, 4]])
    assert [i.name for i in imported.inputs] == ["x"] and [o.name for o in imported.outputs] == ["y"]
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal((1, 4)).astype(np.float32) for _ in range(4)]
    expected, acc = [], np.float32([[1, 2, 3, 4]])
    for x in xs:
        acc = acc + x
        expected.append(acc)
    if Interpreter is not None:
        for want, got in zip(expected, _litert_runs(data, "x", xs), strict=True):
            np.testing.assert_array_equal(got, want)
    for device in _devices():
        session = nnapi.Session(imported, device)
        for want, x in zip(expected, xs, strict=True):
            np.testing.assert_array_equal(session.run({"x": x})["y"], want)
        session.reset_states()
        np.testing.assert_array_equal(session.run({"x": xs[0]})["y"], expected[0])


def test_int8_ring_buffer_streams_frames_as_litert() -> None:
    """microWakeWord's stream state: the last two frames, int8, kept across runs. The window
    of run t holds frames t-2, t-1, t (the initial zeros first), bit for bit as LiteRT."""
    data = _ring_buffer()
    imported = nnapi.load_tflite(data)
    assert [s.name for s in imported.states] == ["stream/states"]
    frames = [np.full((1, 1, 4), v, np.int8) + np.arange(4, dtype=np.int8) for v in (10, 20, 30, 40)]
    zero = np.full((1, 1, 4), -3, np.int8)
    history = [zero, zero, *frames]
    expected = [np.concatenate(history[t:t + 3], axis=1) for t in range(len(frames))]
    if Interpreter is not None:
        for want, got in zip(expected, _litert_runs(data, "x", frames), strict=True):
            np.testing.assert_array_equal(got, want)
    for device in _devices():
        session = nnapi.Session(imported, device)
        for want, x in zip(expected, frames, strict=True):
            np.testing.assert_array_equal(session.run({"x": x})["window"], want)


def test_init_subgraph_computing_its_value_is_refused() -> None:
    """CALL_ONCE's subgraph must assign constants: a computed initial value is refused by name."""
    t = [Tensor("x", "float32", [1, 4]), Tensor("h", "resource", []), Tensor("v", "float32", [1, 4]),
         Tensor("y", "float32", [1, 4])]
    ops = [Operator("CALL_ONCE", [], [], ("CallOnceOptions", {"InitSubgraphIndex": 1})),
           Operator("VAR_HANDLE", [], [1], ("VarHandleOptions", {"SharedName": "v"})),
           Operator("READ_VARIABLE", [1], [2]),
           Operator("ADD", [2, 0], [3], ("AddOptions", {}))]
    init = Subgraph([Tensor("h", "resource", []), Tensor("one", "float32", [1, 4], data=np.ones((1, 4), np.float32)),
                     Tensor("two", "float32", [1, 4])],
                    [Operator("VAR_HANDLE", [], [0], ("VarHandleOptions", {"SharedName": "v"})),
                     Operator("ADD", [1, 1], [2], ("AddOptions", {})),
                     Operator("ASSIGN_VARIABLE", [0, 2], [])], [], [], name="init")
    with pytest.raises(nnapi.BadDataError, match=r"operator 0 \(CALL_ONCE\).*runs ADD"):
        nnapi.load_tflite(build(Subgraph(t, ops, [0], [3]), init))


def test_read_after_assign_of_another_quantization_is_refused() -> None:
    """TFLite reads a variable's bytes whatever the reading tensor's quantization; after an
    assignment of another scale in the same run that would need a reinterpretation NNAPI
    has no operation for: refused, naming both types."""
    t = [Tensor("x", "int8", [1, 4], scale=0.5, zero_point=0), Tensor("h", "resource", []),
         Tensor("again", "int8", [1, 4], scale=0.25, zero_point=0), Tensor("y", "int8", [1, 4], scale=0.25,
                                                                            zero_point=0)]
    ops = [Operator("VAR_HANDLE", [], [1], ("VarHandleOptions", {"SharedName": "v"})),
           Operator("ASSIGN_VARIABLE", [1, 0], []),
           Operator("READ_VARIABLE", [1], [2]),
           Operator("ADD", [2, 2], [3], ("AddOptions", {}))]
    with pytest.raises(nnapi.BadDataError, match=r"operator 2 \(READ_VARIABLE\).*scale=0.25.*scale=0.5"):
        nnapi.load_tflite(build(Subgraph(t, ops, [0], [3])))
