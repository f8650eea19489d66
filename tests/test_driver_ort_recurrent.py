"""The recurrent operations on nnapi-ort-cpu (ONNX LSTM / RNN): every variant ONNX has a
form for gives the reference's values within the CTS tolerance, on the ORT device alone;
the variants it has none for are declined with the rule named."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

import nnapi  # noqa: E402
from nnapi import OperandCode as T  # noqa: E402
from nnapi import OperandType  # noqa: E402
from nnapi import OperationCode as Op  # noqa: E402
from nnapi.conformance import float_tolerance, within_tolerance  # noqa: E402
from nnapi.drivers.ort.device import OrtDevice  # noqa: E402
from nnapi.operations._lstm_cell import ACT_NONE, ACT_RELU, ACT_RELU6, ACT_SIGMOID, ACT_TANH, WEIGHT_NAMES  # noqa: E402
from nnapi.runtime.model_builder import build_hal_model  # noqa: E402

NORM_COUNT = 4


def _reference() -> nnapi.Device:
    return next(d for d in nnapi.get_devices() if d.name == "nnapi-reference")


class _Builder:
    """An NNAPI model under construction with constant or input tensors."""

    def __init__(self, code: int, rng: np.random.Generator) -> None:
        self.model = nnapi.Model()
        self.code = code
        self.dtype = np.float16 if code == T.TENSOR_FLOAT16 else np.float32
        self.rng = rng
        self.inputs: list[int] = []
        self.values: list[np.ndarray] = []

    def tensor(self, shape: list[int], given: bool = False, scale: float = 0.4) -> int:
        """A tensor of random values: a constant, or a model input when ``given``."""
        index = self.model.add_operand(OperandType(self.code, shape))
        value = self.rng.uniform(-scale, scale, shape).astype(self.dtype)
        if given:
            self.inputs.append(index)
            self.values.append(value)
        else:
            self.model.set_operand_value(index, value)
        return index

    def omitted(self) -> int:
        index = self.model.add_operand(OperandType(self.code, [0]))
        self.model.set_operand_value(index, None)
        return index

    def scalar(self, code: int, value) -> int:
        index = self.model.add_operand(OperandType(code))
        self.model.set_operand_value(index, value)
        return index

    def output(self, shape: list[int]) -> int:
        return self.model.add_operand(OperandType(self.code, shape))

    def finish(self, operation: int, inputs: list[int], outputs: list[int]) -> None:
        self.model.add_operation(operation, inputs, outputs)
        self.model.identify_inputs_and_outputs(self.inputs, outputs)
        self.model.finish()


def _lstm_direction(b: _Builder, size: int, units: int, *, cifg=False, peephole=False, projection=False,
                    given=False) -> list[int]:
    """One direction's 17 weight inputs in the spec's order."""
    out = units
    shapes = {"input_to": [units, size], "recurrent_to": [units, out], "cell_to": [units], "bias": [units]}
    weights = []
    for name in WEIGHT_NAMES:
        if name == "projection":
            weights.append(b.tensor([out, units], given) if projection else b.omitted())
        elif name == "projection_bias":
            weights.append(b.omitted())
        elif name.startswith("cell_to"):
            weights.append(b.tensor(shapes["cell_to"], given) if peephole and not (cifg and name == "cell_to_input")
                           else b.omitted())
        elif cifg and name in ("input_to_input", "recurrent_to_input", "input_bias"):
            weights.append(b.omitted())
        else:
            kind = next(k for k in ("input_to", "recurrent_to", "bias") if k in name)
            weights.append(b.tensor(shapes[kind], given))
    return weights


def _run(model: nnapi.Model, values: list[np.ndarray], outputs: list[tuple[list[int], np.dtype]],
         device: nnapi.Device | None) -> list[np.ndarray]:
    """The outputs on ``device`` alone (None: every device, as the runtime chooses)."""
    compilation = nnapi.Compilation(model, [device]) if device is not None else nnapi.Compilation(model)
    compilation.finish()
    execution = nnapi.Execution(compilation)
    for position, value in enumerate(values):
        execution.set_input(position, value)
    results = [np.zeros(shape, dtype) for shape, dtype in outputs]
    for position, array in enumerate(results):
        execution.set_output(position, array)
    execution.compute()
    return results


def _assert_on_ort_as_the_reference(b: _Builder, outputs: list[list[int]], ort_device) -> None:
    """The model is claimed whole by nnapi-ort-cpu, and its outputs there are the
    reference's within the CTS tolerance (and not trivially zero)."""
    hal_model, _ = build_hal_model(b.model)
    assert OrtDevice().get_unsupported_reasons(hal_model) == [None]
    specs = [(shape, b.dtype) for shape in outputs]
    ours = _run(b.model, b.values, specs, ort_device)
    reference = _run(b.model, b.values, specs, _reference())
    tolerance = float_tolerance(b.code)
    for mine, theirs in zip(ours, reference, strict=True):
        assert np.abs(theirs).max() > 0.01
        ok = within_tolerance(b.code, theirs, mine, tolerance)
        assert ok.all(), f"max |difference| {np.abs(mine.astype(np.float64) - theirs).max()}"


def _states(b: _Builder, batch: int, units: int) -> list[int]:
    return [b.tensor([batch, units], given=True), b.tensor([batch, units], given=True)]


def _unidirectional_lstm(b: _Builder, *, time_major=False, steps=5, batch=2, size=3, units=4, activation=ACT_TANH,
                         cell_clip=0.0, final_states=False, layer_norm=False, scale=1.0, **variant
                         ) -> tuple[list[int], list]:
    x = b.tensor([steps, batch, size] if time_major else [batch, steps, size], given=True, scale=scale)
    weights = _lstm_direction(b, size, units, given=variant.pop("given", False), **variant)
    clip_code = T.FLOAT16 if b.code == T.TENSOR_FLOAT16 else T.FLOAT32
    norms = [b.tensor([units]) if layer_norm else b.omitted() for _ in range(NORM_COUNT)]
    inputs = [x, *weights, *_states(b, batch, units), b.scalar(T.INT32, np.int32(activation)),
              b.scalar(clip_code, b.dtype(cell_clip)), b.scalar(clip_code, b.dtype(0)),
              b.scalar(T.BOOL, np.bool_(time_major)), *norms]
    shape = [steps, batch, units] if time_major else [batch, steps, units]
    shapes = [shape, [batch, units], [batch, units]] if final_states else [shape]
    return inputs, shapes


@pytest.mark.parametrize("code", [T.TENSOR_FLOAT32, T.TENSOR_FLOAT16])
@pytest.mark.parametrize("time_major", [False, True])
@pytest.mark.parametrize("variant", [{}, {"cifg": True}, {"peephole": True}, {"cifg": True, "peephole": True},
                                     {"given": True}])
def test_unidirectional_lstm_equals_the_reference(ort_device, code, time_major, variant):
    """UNIDIRECTIONAL_SEQUENCE_LSTM, batch- or time-major, plain, CIFG, peephole or both,
    weights constant or given at run time, with its final states: on ORT alone, the
    reference's values."""
    b = _Builder(code, np.random.default_rng(11))
    inputs, shapes = _unidirectional_lstm(b, time_major=time_major, final_states=True, **variant)
    outputs = [b.output(shape) for shape in shapes]
    b.finish(Op.UNIDIRECTIONAL_SEQUENCE_LSTM, inputs, outputs)
    _assert_on_ort_as_the_reference(b, shapes, ort_device)


@pytest.mark.parametrize("activation", [ACT_RELU, ACT_SIGMOID, ACT_NONE])
def test_unidirectional_lstm_other_activations_equal_the_reference(ort_device, activation):
    b = _Builder(T.TENSOR_FLOAT32, np.random.default_rng(12))
    inputs, shapes = _unidirectional_lstm(b, activation=activation)
    b.finish(Op.UNIDIRECTIONAL_SEQUENCE_LSTM, inputs, [b.output(shapes[0])])
    _assert_on_ort_as_the_reference(b, shapes, ort_device)


@pytest.mark.parametrize("variant, rule", [
    ({"projection": True}, "projection"),
    ({"layer_norm": True}, "norm"),
    ({"cell_clip": 10.0, "peephole": True}, "cell clipping with peephole"),
    ({"cell_clip": 10.0, "activation": ACT_RELU}, "tanh"),
    ({"activation": ACT_RELU6}, "RELU6"),
])
def test_unidirectional_lstm_without_an_onnx_form_is_declined(ort_device, variant, rule):
    """Projection, layer normalization, cell clipping with peephole weights or another
    activation than tanh, and RELU6 have no ONNX form here: declined with the rule named,
    and the model runs on the reference with its values."""
    b = _Builder(T.TENSOR_FLOAT32, np.random.default_rng(13))
    inputs, shapes = _unidirectional_lstm(b, **variant)
    b.finish(Op.UNIDIRECTIONAL_SEQUENCE_LSTM, inputs, [b.output(shapes[0])])
    hal_model, _ = build_hal_model(b.model)
    reason = OrtDevice().get_unsupported_reasons(hal_model)[0]
    assert reason is not None and rule in reason
    compilation = nnapi.Compilation(b.model)
    compilation.finish()
    assert compilation.step_devices == ["nnapi-reference"]
    ours = _run(b.model, b.values, [(shapes[0], np.float32)], None)
    reference = _run(b.model, b.values, [(shapes[0], np.float32)], _reference())
    np.testing.assert_array_equal(ours[0], reference[0])


@pytest.mark.parametrize("clip, reached", [(10.0, False), (0.3, True)])
@pytest.mark.parametrize("variant", [{}, {"cifg": True}, {"time_major": True}])
def test_clipped_unidirectional_lstm_equals_the_reference(ort_device, clip, reached, variant):
    """A cell clipped at 10 that the values never reach (ONNX's LSTM, proven by its own
    outputs) and at 0.3, which they pass (the unrolled steps with the clip): both the
    reference's values, with the final states, on ORT alone. The clip matters in the
    second case: without it the reference's outputs differ."""
    def model(cell_clip: float) -> tuple[_Builder, list[list[int]]]:
        b = _Builder(T.TENSOR_FLOAT32, np.random.default_rng(21))
        inputs, shapes = _unidirectional_lstm(b, final_states=True, cell_clip=cell_clip, steps=8, scale=2.0,
                                              **variant)
        b.finish(Op.UNIDIRECTIONAL_SEQUENCE_LSTM, inputs, [b.output(shape) for shape in shapes])
        return b, shapes

    b, shapes = model(clip)
    _assert_on_ort_as_the_reference(b, shapes, ort_device)
    unclipped, _ = model(0.0)
    specs = [(shape, np.float32) for shape in shapes]
    with_clip = _run(b.model, b.values, specs, _reference())
    without = _run(unclipped.model, unclipped.values, specs, _reference())
    differs = max(np.abs(a - c).max() for a, c in zip(with_clip, without, strict=True))
    assert (differs > 1e-3) == reached


@pytest.mark.parametrize("clip, proven", [(10.0, True), (0.3, False)])
def test_the_clip_proof_holds_exactly_where_the_clip_is_not_reached(clip, proven):
    """The If of a clipped LSTM takes ONNX's LSTM where the outputs prove the clip never
    acted (clip 10) and the unrolled steps where it did (0.3): with the unrolled branch
    replaced by zeros, the first still gives the reference's values, the second zeros."""
    import onnxruntime as ort
    from onnx import helper

    from nnapi.drivers.ort.lowering import lower_model

    b = _Builder(T.TENSOR_FLOAT32, np.random.default_rng(21))
    inputs, shapes = _unidirectional_lstm(b, cell_clip=clip, steps=8, scale=2.0)
    b.finish(Op.UNIDIRECTIONAL_SEQUENCE_LSTM, inputs, [b.output(shapes[0])])
    onnx_model, input_names, _ = lower_model(build_hal_model(b.model)[0])
    branch = next(node for node in onnx_model.graph.node if node.op_type == "If")
    then_graph = next(a.g for a in branch.attribute if a.name == "then_branch")
    zero = helper.make_tensor("zero", 1, [], [0.0])
    zeros = helper.make_graph(
        [helper.make_node("Mul", [node.input[0], "zero"], [f"z{k}"]) for k, node in enumerate(then_graph.node)],
        "zeros", [], [helper.make_tensor_value_info(f"z{k}", 1, None) for k in range(len(then_graph.node))], [zero])
    next(a for a in branch.attribute if a.name == "else_branch").g.CopyFrom(zeros)
    session = ort.InferenceSession(onnx_model.SerializeToString(), providers=["CPUExecutionProvider"])
    ours = session.run(None, dict(zip(input_names, b.values, strict=True)))[0]
    reference = _run(b.model, b.values, [(shapes[0], np.float32)], _reference())[0]
    if proven:
        assert within_tolerance(T.TENSOR_FLOAT32, reference, ours).all()
    else:
        assert not ours.any() and np.abs(reference).max() > 0.1


@pytest.mark.parametrize("merge", [False, True])
@pytest.mark.parametrize("time_major", [False, True])
@pytest.mark.parametrize("final_states", [False, True])
def test_bidirectional_lstm_equals_the_reference(ort_device, merge, time_major, final_states):
    """BIDIRECTIONAL_SEQUENCE_LSTM with the outputs merged or apart, with or without the
    four final states: one bidirectional ONNX LSTM, the reference's values."""
    b = _Builder(T.TENSOR_FLOAT32, np.random.default_rng(14))
    steps, batch, size, units = 4, 2, 3, 5
    x = b.tensor([steps, batch, size] if time_major else [batch, steps, size], given=True, scale=1.0)
    forward = _lstm_direction(b, size, units, peephole=True)
    backward = _lstm_direction(b, size, units, peephole=True)
    states = [*_states(b, batch, units), *_states(b, batch, units)]
    aux = [b.omitted() for _ in range(9)]
    inputs = [x, *forward, *backward, *states, *aux, b.scalar(T.INT32, np.int32(ACT_TANH)),
              b.scalar(T.FLOAT32, np.float32(0)), b.scalar(T.FLOAT32, np.float32(0)),
              b.scalar(T.BOOL, np.bool_(merge)), b.scalar(T.BOOL, np.bool_(time_major)),
              *(b.omitted() for _ in range(2 * NORM_COUNT))]
    lead = [steps, batch] if time_major else [batch, steps]
    shapes = [[*lead, 2 * units]] if merge else [[*lead, units], [*lead, units]]
    if final_states:
        shapes += [[batch, units]] * 4
    b.finish(Op.BIDIRECTIONAL_SEQUENCE_LSTM, inputs, [b.output(shape) for shape in shapes])
    _assert_on_ort_as_the_reference(b, shapes, ort_device)


def _rnn_cell(b: _Builder, size: int, units: int, batch: int) -> list[int]:
    return [b.tensor([units, size]), b.tensor([units, units]), b.tensor([units]),
            b.tensor([batch, units], given=True)]


@pytest.mark.parametrize("activation", [ACT_TANH, ACT_RELU, ACT_SIGMOID])
def test_rnn_step_equals_the_reference(ort_device, activation):
    b = _Builder(T.TENSOR_FLOAT32, np.random.default_rng(15))
    batch, size, units = 3, 4, 5
    x = b.tensor([batch, size], given=True, scale=1.0)
    inputs = [x, *_rnn_cell(b, size, units, batch), b.scalar(T.INT32, np.int32(activation))]
    b.finish(Op.RNN, inputs, [b.output([batch, units]), b.output([batch, units])])
    _assert_on_ort_as_the_reference(b, [[batch, units], [batch, units]], ort_device)


@pytest.mark.parametrize("time_major", [0, 1])
@pytest.mark.parametrize("final_state", [False, True])
def test_unidirectional_rnn_equals_the_reference(ort_device, time_major, final_state):
    b = _Builder(T.TENSOR_FLOAT32, np.random.default_rng(16))
    steps, batch, size, units = 6, 2, 3, 4
    x = b.tensor([steps, batch, size] if time_major else [batch, steps, size], given=True, scale=1.0)
    inputs = [x, *_rnn_cell(b, size, units, batch), b.scalar(T.INT32, np.int32(ACT_TANH)),
              b.scalar(T.INT32, np.int32(time_major))]
    shapes = [[steps, batch, units] if time_major else [batch, steps, units]]
    if final_state:
        shapes.append([batch, units])
    b.finish(Op.UNIDIRECTIONAL_SEQUENCE_RNN, inputs, [b.output(shape) for shape in shapes])
    _assert_on_ort_as_the_reference(b, shapes, ort_device)


@pytest.mark.parametrize("merge", [False, True])
@pytest.mark.parametrize("final_states", [False, True])
def test_bidirectional_rnn_equals_the_reference(ort_device, merge, final_states):
    b = _Builder(T.TENSOR_FLOAT32, np.random.default_rng(17))
    steps, batch, size, units = 5, 2, 3, 4
    x = b.tensor([batch, steps, size], given=True, scale=1.0)
    inputs = [x, *_rnn_cell(b, size, units, batch), *_rnn_cell(b, size, units, batch),
              b.omitted(), b.omitted(), b.omitted(), b.scalar(T.INT32, np.int32(ACT_TANH)),
              b.scalar(T.BOOL, np.bool_(False)), b.scalar(T.BOOL, np.bool_(merge))]
    shapes = [[batch, steps, 2 * units]] if merge else [[batch, steps, units]] * 2
    if final_states:
        shapes += [[batch, units]] * 2
    b.finish(Op.BIDIRECTIONAL_SEQUENCE_RNN, inputs, [b.output(shape) for shape in shapes])
    _assert_on_ort_as_the_reference(b, shapes, ort_device)


def test_rnn_with_an_auxiliary_input_is_declined():
    """An auxiliary input (cross- or parallel-linked) has no ONNX RNN form."""
    b = _Builder(T.TENSOR_FLOAT32, np.random.default_rng(18))
    steps, batch, size, units = 3, 1, 2, 3
    x = b.tensor([batch, steps, size], given=True)
    aux = b.tensor([batch, steps, size], given=True)
    inputs = [x, *_rnn_cell(b, size, units, batch), *_rnn_cell(b, size, units, batch),
              aux, b.omitted(), b.omitted(), b.scalar(T.INT32, np.int32(ACT_TANH)),
              b.scalar(T.BOOL, np.bool_(False)), b.scalar(T.BOOL, np.bool_(True))]
    b.finish(Op.BIDIRECTIONAL_SEQUENCE_RNN, inputs, [b.output([batch, steps, 2 * units])])
    hal_model, _ = build_hal_model(b.model)
    assert "auxiliary input" in OrtDevice().get_unsupported_reasons(hal_model)[0]
