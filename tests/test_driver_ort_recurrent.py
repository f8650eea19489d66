"""The recurrent operations on nnapi-ort-cpu (ONNX LSTM / RNN): every variant ONNX has a
form for gives the reference's values within the CTS tolerance, on the ORT device alone;
the variants it has none for are declined with the rule named."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

import nnapi  # noqa: E402
from helpers import constant, reference_device  # noqa: E402
from nnapi import OperandCode as T  # noqa: E402
from nnapi import OperandType  # noqa: E402
from nnapi import OperationCode as Op  # noqa: E402
from nnapi.conformance import float_tolerance, within_tolerance  # noqa: E402
from nnapi.drivers.ort.device import OrtDevice  # noqa: E402
from nnapi.operations.lstm_cell import (  # noqa: E402
    ACT_NONE,
    ACT_RELU,
    ACT_RELU1,
    ACT_RELU6,
    ACT_SIGMOID,
    ACT_TANH,
    WEIGHT_NAMES,
)
from nnapi.runtime.model_builder import build_hal_model  # noqa: E402

NORM_COUNT = 4


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
        return constant(self.model, code, value)

    def output(self, shape: list[int]) -> int:
        return self.model.add_operand(OperandType(self.code, shape))

    def finish(self, operation: int, inputs: list[int], outputs: list[int]) -> None:
        self.model.add_operation(operation, inputs, outputs)
        self.model.identify_inputs_and_outputs(self.inputs, outputs)
        self.model.finish()


def _lstm_direction(b: _Builder, size: int, units: int, *, cifg=False, peephole=False, projection=False,
                    projection_bias=False, given=False, out=None) -> list[int]:
    """One direction's 17 weight inputs in the spec's order (``out``: the projection's
    output size, the units' by default)."""
    out = out or units
    shapes = {"input_to": [units, size], "recurrent_to": [units, out], "cell_to": [units], "bias": [units]}
    weights = []
    for name in WEIGHT_NAMES:
        if name == "projection":
            weights.append(b.tensor([out, units], given) if projection else b.omitted())
        elif name == "projection_bias":
            weights.append(b.tensor([out], given) if projection_bias else b.omitted())
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
    reference = _run(b.model, b.values, specs, reference_device())
    tolerance = float_tolerance(b.code)
    for mine, theirs in zip(ours, reference, strict=True):
        assert np.abs(theirs).max() > 0.01
        ok = within_tolerance(b.code, theirs, mine, tolerance)
        assert ok.all(), f"max |difference| {np.abs(mine.astype(np.float64) - theirs).max()}"


def _states(b: _Builder, batch: int, units: int) -> list[int]:
    return [b.tensor([batch, units], given=True), b.tensor([batch, units], given=True)]


def _norms(b: _Builder, units: int, layer_norm: bool, cifg: bool) -> list[int]:
    """The 4 layer normalization weights (the input gate's omitted with CIFG)."""
    return [b.tensor([units], scale=1.0) if layer_norm and not (cifg and k == 0) else b.omitted()
            for k in range(NORM_COUNT)]


def _unidirectional_lstm(b: _Builder, *, time_major=False, steps=5, batch=2, size=3, units=4, activation=ACT_TANH,
                         cell_clip=0.0, proj_clip=0.0, final_states=False, layer_norm=False, scale=1.0, **variant
                         ) -> tuple[list[int], list]:
    x = b.tensor([steps, batch, size] if time_major else [batch, steps, size], given=True, scale=scale)
    out = 3 if variant.get("projection") else units
    weights = _lstm_direction(b, size, units, given=variant.pop("given", False), out=out, **variant)
    clip_code = T.FLOAT16 if b.code == T.TENSOR_FLOAT16 else T.FLOAT32
    norms = _norms(b, units, layer_norm, variant.get("cifg", False))
    inputs = [x, *weights, b.tensor([batch, out], given=True), b.tensor([batch, units], given=True),
              b.scalar(T.INT32, np.int32(activation)), b.scalar(clip_code, b.dtype(cell_clip)),
              b.scalar(clip_code, b.dtype(proj_clip)), b.scalar(T.BOOL, np.bool_(time_major)), *norms]
    shape = [steps, batch, out] if time_major else [batch, steps, out]
    shapes = [shape, [batch, out], [batch, units]] if final_states else [shape]
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


@pytest.mark.parametrize("code", [T.TENSOR_FLOAT32, T.TENSOR_FLOAT16])
@pytest.mark.parametrize("variant", [
    {"projection": True}, {"projection": True, "projection_bias": True, "proj_clip": 0.05},
    {"layer_norm": True}, {"layer_norm": True, "cifg": True, "peephole": True, "projection": True},
    {"cell_clip": 0.3, "peephole": True}, {"cell_clip": 0.3, "activation": ACT_RELU},
    {"activation": ACT_RELU6}, {"activation": ACT_RELU1, "time_major": True},
])
def test_unidirectional_lstm_explicit_steps_equal_the_reference(ort_device, code, variant):
    """What ONNX's LSTM has no form for (projection with its bias and clip, layer
    normalization, a cell clip with peephole weights or another activation than tanh,
    RELU1 / RELU6) runs as the explicit steps: on ORT alone, the reference's values."""
    b = _Builder(code, np.random.default_rng(13))
    inputs, shapes = _unidirectional_lstm(b, final_states=True, **variant)
    b.finish(Op.UNIDIRECTIONAL_SEQUENCE_LSTM, inputs, [b.output(shape) for shape in shapes])
    _assert_on_ort_as_the_reference(b, shapes, ort_device)


def test_explicit_lstm_steps_need_the_number_of_steps():
    """The explicit steps are unrolled, so a projection LSTM whose input leaves the number
    of time steps unspecified is declined with the rule named (ONNX's LSTM, which takes
    any length, still runs the plain one)."""
    def reason(projection: bool) -> str | None:
        b = _Builder(T.TENSOR_FLOAT32, np.random.default_rng(13))
        inputs, shapes = _unidirectional_lstm(b, projection=projection, steps=0)  # [2, 0, 3]: steps unspecified
        b.finish(Op.UNIDIRECTIONAL_SEQUENCE_LSTM, inputs, [b.output(shapes[0])])
        return OrtDevice().get_unsupported_reasons(build_hal_model(b.model)[0])[0]

    assert reason(False) is None
    assert "time steps must be known" in reason(True)


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
    with_clip = _run(b.model, b.values, specs, reference_device())
    without = _run(unclipped.model, unclipped.values, specs, reference_device())
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
    reference = _run(b.model, b.values, [(shapes[0], np.float32)], reference_device())[0]
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


@pytest.mark.parametrize("cross", [True, False])
@pytest.mark.parametrize("merge", [False, True])
def test_bidirectional_rnn_with_an_auxiliary_input_equals_the_reference(ort_device, cross, merge):
    """An auxiliary input with auxiliary weights (cross-linking: both directions add its
    products) or alone (parallel linking: the backward cell reads it instead of the
    input, here of another feature size): the reference's values on ORT alone."""
    b = _Builder(T.TENSOR_FLOAT32, np.random.default_rng(18))
    steps, batch, size, aux_size, units = 3, 2, 2, 3 if cross else 4, 3
    x = b.tensor([batch, steps, size], given=True, scale=1.0)
    aux = b.tensor([batch, steps, aux_size], given=True, scale=1.0)
    backward = _rnn_cell(b, size if cross else aux_size, units, batch)
    weights = [b.tensor([units, aux_size]), b.tensor([units, aux_size])] if cross else [b.omitted(), b.omitted()]
    inputs = [x, *_rnn_cell(b, size, units, batch), *backward, aux, *weights, b.scalar(T.INT32, np.int32(ACT_TANH)),
              b.scalar(T.BOOL, np.bool_(False)), b.scalar(T.BOOL, np.bool_(merge))]
    shapes = [[batch, steps, 2 * units]] if merge else [[batch, steps, units]] * 2
    shapes += [[batch, units]] * 2
    b.finish(Op.BIDIRECTIONAL_SEQUENCE_RNN, inputs, [b.output(shape) for shape in shapes])
    _assert_on_ort_as_the_reference(b, shapes, ort_device)


@pytest.mark.parametrize("aux", ["none", "cross", "parallel"])
@pytest.mark.parametrize("variant", [{}, {"projection": True, "layer_norm": True}, {"cifg": True, "peephole": True}])
def test_bidirectional_lstm_explicit_steps_equal_the_reference(ort_device, aux, variant):
    """BIDIRECTIONAL_SEQUENCE_LSTM in the explicit steps: with an auxiliary input
    (cross-linked through auxiliary weights, or parallel: the backward direction reads it),
    projection, layer normalization, a cell clip: the reference's values on ORT alone."""
    b = _Builder(T.TENSOR_FLOAT32, np.random.default_rng(19))
    steps, batch, size, aux_size, units = 4, 2, 3, 2, 5
    out = 3 if variant.get("projection") else units
    layer_norm = variant.get("layer_norm", False)
    cell = {k: v for k, v in variant.items() if k != "layer_norm"}
    x = b.tensor([batch, steps, size], given=True, scale=1.0)
    forward = _lstm_direction(b, size, units, out=out, **cell)
    backward = _lstm_direction(b, aux_size if aux == "parallel" else size, units, out=out, **cell)
    states = [b.tensor([batch, out], given=True), b.tensor([batch, units], given=True)] * 2
    aux_input = b.tensor([batch, steps, aux_size], given=True, scale=1.0) if aux != "none" else b.omitted()
    gates = 3 if variant.get("cifg") else 4
    aux_weights = [b.tensor([units, aux_size]) if aux == "cross" and (k % 4 or gates == 4) else b.omitted()
                   for k in range(8)]  # per direction: aux_to_input (none with CIFG), forget, cell, output
    inputs = [x, *forward, *backward, *states, aux_input, *aux_weights, b.scalar(T.INT32, np.int32(ACT_TANH)),
              b.scalar(T.FLOAT32, np.float32(0.8)), b.scalar(T.FLOAT32, np.float32(0)),
              b.scalar(T.BOOL, np.bool_(False)), b.scalar(T.BOOL, np.bool_(False)),
              *_norms(b, units, layer_norm, variant.get("cifg", False)),
              *_norms(b, units, layer_norm, variant.get("cifg", False))]
    shapes = [[batch, steps, out], [batch, steps, out], [batch, out], [batch, units], [batch, out], [batch, units]]
    b.finish(Op.BIDIRECTIONAL_SEQUENCE_LSTM, inputs, [b.output(shape) for shape in shapes])
    _assert_on_ort_as_the_reference(b, shapes, ort_device)


@pytest.mark.parametrize("variant", [{}, {"cifg": True}, {"peephole": True, "projection": True, "proj_clip": 0.1},
                                     {"layer_norm": True, "peephole": True}, {"cell_clip": 0.2},
                                     {"layer_norm": True, "cifg": True, "peephole": True, "projection": True}])
def test_lstm_step_equals_the_reference(ort_device, variant):
    """The single-step LSTM (23 inputs, 27 with layer normalization): its four outputs,
    the scratch buffer's gate values included, are the reference's on ORT alone."""
    b = _Builder(T.TENSOR_FLOAT32, np.random.default_rng(20))
    batch, size, units = 2, 3, 4
    out = 3 if variant.get("projection") else units
    layer_norm = variant.pop("layer_norm", False)
    cell_clip, proj_clip = variant.pop("cell_clip", 0.0), variant.pop("proj_clip", 0.0)
    x = b.tensor([batch, size], given=True, scale=1.0)
    weights = _lstm_direction(b, size, units, out=out, **variant)
    inputs = [x, *weights, b.tensor([batch, out], given=True), b.tensor([batch, units], given=True, scale=1.0),
              b.scalar(T.INT32, np.int32(ACT_TANH)), b.scalar(T.FLOAT32, np.float32(cell_clip)),
              b.scalar(T.FLOAT32, np.float32(proj_clip))]
    if layer_norm:
        inputs += _norms(b, units, True, variant.get("cifg", False))
    gates = 3 if variant.get("cifg") else 4
    shapes = [[batch, gates * units], [batch, out], [batch, units], [batch, out]]
    b.finish(Op.LSTM, inputs, [b.output(shape) for shape in shapes])
    _assert_on_ort_as_the_reference(b, shapes, ort_device)


@pytest.mark.parametrize("code", [T.TENSOR_FLOAT32, T.TENSOR_FLOAT16])
@pytest.mark.parametrize("rank, memory, activation", [(1, 4, ACT_NONE), (2, 3, ACT_RELU), (1, 1, ACT_SIGMOID)])
@pytest.mark.parametrize("bias", [False, True])
def test_svdf_equals_the_reference(ort_device, code, rank, memory, activation, bias):
    """SVDF's new state and output, ranks 1 and 2, a memory of one slot too, with and
    without the bias: the reference's values on ORT alone."""
    b = _Builder(code, np.random.default_rng(22))
    batch, size, units = 2, 3, 4
    filters = units * rank
    inputs = [b.tensor([batch, size], given=True, scale=1.0), b.tensor([filters, size]), b.tensor([filters, memory]),
              b.tensor([units]) if bias else b.omitted(), b.tensor([batch, memory * filters], given=True, scale=1.0),
              b.scalar(T.INT32, np.int32(rank)), b.scalar(T.INT32, np.int32(activation))]
    shapes = [[batch, memory * filters], [batch, units]]
    b.finish(Op.SVDF, inputs, [b.output(shape) for shape in shapes])
    if memory == 1:  # the new state is all zeros: compared apart
        ours = _run(b.model, b.values, [(shape, b.dtype) for shape in shapes], ort_device)
        reference = _run(b.model, b.values, [(shape, b.dtype) for shape in shapes], reference_device())
        assert not ours[0].any() and not reference[0].any()
        assert within_tolerance(code, reference[1], ours[1], float_tolerance(code)).all()
        assert np.abs(reference[1]).max() > 0.01
        return
    _assert_on_ort_as_the_reference(b, shapes, ort_device)


def _given_lstm(b: _Builder, batch: int, steps: int, size: int, units: int) -> tuple[list[int], list[np.ndarray]]:
    """A peephole, projection, layer normalization UNIDIRECTIONAL_SEQUENCE_LSTM whose every
    weight is a model input, the optional ones declared with unspecified dimensions (as
    the NDK allows for an input a request may omit): its inputs and their values."""
    x = b.tensor([batch, steps, size], given=True, scale=1.0)
    shapes = {"input_to": [units, size], "recurrent_to": [units, units], "cell_to": [units], "bias": [units],
              "projection": [units, units], "projection_bias": [units]}
    optional = ("input_to_input", "recurrent_to_input", "cell_to", "input_bias", "projection")
    weights = []
    for name in WEIGHT_NAMES:
        kind = next(k for k in ("projection_bias", "projection", "input_to", "recurrent_to", "cell_to", "bias")
                    if k in name)
        index = b.tensor(shapes[kind], given=True)
        if name.startswith(optional):
            b.model._operands[index] = OperandType(b.code, [0] * len(shapes[kind]))
        weights.append(index)
    norms = []
    for _ in range(NORM_COUNT):
        norms.append(b.tensor([units], given=True, scale=1.0))
        b.model._operands[norms[-1]] = OperandType(b.code, [0])
    inputs = [x, *weights, *_states(b, batch, units), b.scalar(T.INT32, np.int32(ACT_TANH)),
              b.scalar(T.FLOAT32, np.float32(0)), b.scalar(T.FLOAT32, np.float32(0)),
              b.scalar(T.BOOL, np.bool_(False)), *norms]
    return inputs, list(b.values)


#: positions among the model inputs of _given_lstm (the input first, then the 17 weights,
#: the 4 layer normalization weights, the two states)
_POSITION = {name: 1 + k for k, name in enumerate(WEIGHT_NAMES)}
_POSITION.update({name: 18 + k for k, name in enumerate(("input_norm", "forget_norm", "cell_norm", "output_norm"))})
_PATTERNS = {
    "all given": (),
    "plain": ("cell_to_input", "cell_to_forget", "cell_to_output", "projection", "projection_bias", "input_norm",
              "forget_norm", "cell_norm", "output_norm"),
    "cifg": ("input_to_input", "recurrent_to_input", "input_bias", "cell_to_input", "input_norm"),
}


def test_omitted_inputs_run_as_the_reference_runs_them(ort_device):
    """Optional weights given as model inputs and omitted at run time (set_input with no
    value, as the CTS gives its LSTMs): one compilation on ORT alone runs each pattern
    (everything given; a plain LSTM; CIFG) with the reference's values."""
    b = _Builder(T.TENSOR_FLOAT32, np.random.default_rng(23))
    batch, steps, size, units = 2, 4, 3, 4
    inputs, values = _given_lstm(b, batch, steps, size, units)
    b.finish(Op.UNIDIRECTIONAL_SEQUENCE_LSTM, inputs, [b.output([batch, steps, units])])
    hal_model, _ = build_hal_model(b.model)
    assert OrtDevice().get_unsupported_reasons(hal_model) == [None]
    compilations = {}
    for device in (ort_device, reference_device()):
        compilations[device.name] = nnapi.Compilation(b.model, [device])
        compilations[device.name].finish()
    results = {}
    for pattern, omitted in _PATTERNS.items():
        given = [None if position in {_POSITION[name] for name in omitted} else value
                 for position, value in enumerate(values)]
        for name, compilation in compilations.items():
            execution = nnapi.Execution(compilation)
            for position, value in enumerate(given):
                execution.set_input(position, value)
            out = np.zeros([batch, steps, units], np.float32)
            execution.set_output(0, out)
            execution.compute()
            results[pattern, name] = out
        ours, theirs = results[pattern, "nnapi-ort-cpu"], results[pattern, "nnapi-reference"]
        assert np.abs(theirs).max() > 0.01
        assert within_tolerance(T.TENSOR_FLOAT32, theirs, ours).all(), pattern
    assert not np.allclose(results["plain", "nnapi-reference"], results["cifg", "nnapi-reference"])


def _hal_request(values: list[np.ndarray | None], outputs: list[np.ndarray]):
    from nnapi.hal import DataLocation, Request, RequestArgument

    pools: list[np.ndarray] = []

    def argument(value: np.ndarray | None) -> RequestArgument:
        if value is None:
            return RequestArgument(has_no_value=True)
        pools.append(value)
        return RequestArgument(False, DataLocation(len(pools) - 1, 0, value.nbytes), list(value.shape))

    return Request([argument(v) for v in values], [argument(v) for v in outputs], pools)


def test_each_pattern_of_omitted_inputs_is_prepared_once(monkeypatch):
    """The prepared model lowers a pattern of omitted inputs on the first request showing
    it, and only then: a pattern seen again runs the graph made for it; an invalid pattern
    (one peephole weight omitted) fails with the rule named, a required input omitted is
    an invalid request."""
    from nnapi.hal import HalError

    b = _Builder(T.TENSOR_FLOAT32, np.random.default_rng(24))
    inputs, values = _given_lstm(b, 1, 3, 2, 3)
    b.finish(Op.UNIDIRECTIONAL_SEQUENCE_LSTM, inputs, [b.output([1, 3, 3])])
    hal_model, _ = build_hal_model(b.model)
    device = OrtDevice()
    prepared_graphs = []
    original = OrtDevice._prepare_graph

    def counting(self, model, *arguments, **keywords):
        prepared_graphs.append(len(model.main.input_indexes))
        return original(self, model, *arguments, **keywords)

    monkeypatch.setattr(OrtDevice, "_prepare_graph", counting)
    prepared = device.prepare_model(hal_model)
    assert prepared_graphs == []  # nothing until a request shows its pattern

    def run(omitted: tuple[str, ...]) -> np.ndarray:
        out = np.zeros([1, 3, 3], np.float32)
        positions = {_POSITION[name] for name in omitted}
        prepared.execute(_hal_request([None if p in positions else v for p, v in enumerate(values)], [out]))
        return out

    first = run(_PATTERNS["plain"])
    assert run(_PATTERNS["plain"]).tolist() == first.tolist()
    run(_PATTERNS["cifg"])
    run(())
    assert prepared_graphs == [len(values) - 9, len(values) - 5, len(values)]
    for _ in range(2):
        with pytest.raises(HalError, match="peephole"):
            run(("cell_to_forget",))
    assert len(prepared_graphs) == 4
    with pytest.raises(HalError, match="input 4 has no value"):
        run(("input_to_output",))


def test_a_model_with_omittable_inputs_compiles_from_the_cache(ort_device, tmp_path, monkeypatch):
    """set_caching on a model whose inputs a request may omit (one graph per pattern): the
    second compilation comes from the cache file (the HAL model and the graph of every
    pattern run so far), runs a pattern seen before without lowering anything, lowers a new
    one and adds it to the file, so that a third compilation lowers nothing; every run
    gives the first compilation's values."""
    from nnapi.drivers.ort import device as device_module

    b = _Builder(T.TENSOR_FLOAT32, np.random.default_rng(25))
    batch, steps, size, units = 2, 3, 3, 4
    inputs, values = _given_lstm(b, batch, steps, size, units)
    b.finish(Op.UNIDIRECTIONAL_SEQUENCE_LSTM, inputs, [b.output([batch, steps, units])])
    lowered = []
    original = device_module.lower_model

    def counting(model, shaped=None):
        lowered.append(len(model.main.input_indexes))
        return original(model, shaped)

    monkeypatch.setattr(device_module, "lower_model", counting)

    def compile_and_run(patterns: list[str]) -> tuple[int, list[np.ndarray]]:
        compilation = nnapi.Compilation(b.model, [ort_device])
        compilation.set_caching(str(tmp_path), bytes(range(32)))
        compilation.finish()
        outputs = []
        for pattern in patterns:
            positions = {_POSITION[name] for name in _PATTERNS[pattern]}
            execution = nnapi.Execution(compilation)
            for position, value in enumerate(values):
                execution.set_input(position, None if position in positions else value)
            out = np.zeros([batch, steps, units], np.float32)
            execution.set_output(0, out)
            execution.compute()
            outputs.append(out)
        return compilation.prepared_from_cache, outputs

    first, (plain,) = compile_and_run(["plain"])
    assert (first, len(lowered)) == (0, 1) and np.abs(plain).max() > 0.01
    second, (plain_again, cifg) = compile_and_run(["plain", "cifg"])
    assert second == 1 and len(lowered) == 2  # only the new pattern lowered
    third, (plain_third, cifg_again) = compile_and_run(["plain", "cifg"])
    assert third == 1 and len(lowered) == 2
    np.testing.assert_array_equal(plain_again, plain)
    np.testing.assert_array_equal(plain_third, plain)
    np.testing.assert_array_equal(cifg_again, cifg)
    assert not np.allclose(plain, cifg)
    (cache_file,) = tmp_path.iterdir()
    content = cache_file.read_bytes()
    cache_file.write_bytes(content[:len(content) // 2])  # truncated: prepared afresh, as if none
    fourth, (plain_fourth,) = compile_and_run(["plain"])
    assert fourth == 0 and len(lowered) == 3
    np.testing.assert_array_equal(plain_fourth, plain)


@pytest.mark.parametrize("backward", [{"units": 3}, {"peephole": True}])
def test_bidirectional_lstm_directions_unlike_equal_the_reference(ort_device, backward):
    """Directions of different sizes, or one with peephole weights and one without, which
    ONNX's bidirectional LSTM cannot hold: each direction's explicit steps, the
    reference's values on ORT alone."""
    b = _Builder(T.TENSOR_FLOAT32, np.random.default_rng(25))
    steps, batch, size, units = 3, 2, 3, 4
    bw_units = backward.get("units", units)
    x = b.tensor([batch, steps, size], given=True, scale=1.0)
    forward = _lstm_direction(b, size, units)
    back = _lstm_direction(b, size, bw_units, peephole=backward.get("peephole", False))
    states = [*_states(b, batch, units), *_states(b, batch, bw_units)]
    inputs = [x, *forward, *back, *states, *(b.omitted() for _ in range(9)), b.scalar(T.INT32, np.int32(ACT_TANH)),
              b.scalar(T.FLOAT32, np.float32(0)), b.scalar(T.FLOAT32, np.float32(0)),
              b.scalar(T.BOOL, np.bool_(True)), b.scalar(T.BOOL, np.bool_(False)),
              *(b.omitted() for _ in range(2 * NORM_COUNT))]
    shapes = [[batch, steps, units + bw_units]]
    b.finish(Op.BIDIRECTIONAL_SEQUENCE_LSTM, inputs, [b.output(shape) for shape in shapes])
    _assert_on_ort_as_the_reference(b, shapes, ort_device)


def test_an_lstm_whose_output_is_a_graph_output_and_whose_state_feeds_another_lstm(ort_device):
    """tests/data/fuzz/lstm_into_lstm.jsonl (``nnapi fuzz`` seed 1's LSTM signatures, graph
    52): the first LSTM's output is a graph output while its state feeds the second. Its
    output was an Identity into the graph output of a value other nodes read, which ORT's
    EliminateIdentity (onnxruntime 1.32) turned into an invalid graph ("Node input 'mul_22'
    is not a graph input, initializer, or output of a previous node"): preparing failed.
    The node computing the value now writes the graph output, which its readers read."""
    from pathlib import Path

    from nnapi.conformance import load_records, run_record

    (record,) = load_records(Path(__file__).parent / "data" / "fuzz" / "lstm_into_lstm.jsonl")
    assert [o["type"] for o in record["main"]["operations"]] == ["LSTM", "LSTM", "ADD"]
    devices = {d.name: d for d in nnapi.get_devices()}
    outcome = run_record(record, devices["nnapi-ort-cpu"])
    assert outcome.passed, outcome.message
    assert run_record(record, devices["nnapi-reference"]).passed
