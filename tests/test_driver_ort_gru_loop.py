"""Keras 3's GRU loop on nnapi-ort-cpu: a WHILE whose body is exactly one GRU step over the
whole sequence runs as one ONNX GRU node (gru_loop.py) with the reference's values (CTS
float32 tolerance) and the Loop lowering's; a body that differs from a GRU step in any
one place (the near misses) keeps the Loop, still with the reference's values."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

import nnapi  # noqa: E402
from helpers import reference_device  # noqa: E402
from nnapi import OperandCode as T  # noqa: E402
from nnapi import OperandType  # noqa: E402
from nnapi import OperationCode as Op  # noqa: E402
from nnapi.conformance import within_tolerance  # noqa: E402
from nnapi.drivers.ort import control_flow  # noqa: E402
from nnapi.drivers.ort.device import OrtDevice  # noqa: E402
from nnapi.drivers.ort.lowering import lower_model  # noqa: E402
from nnapi.runtime.model_builder import build_hal_model  # noqa: E402


class _Net:
    """An nnapi.Model with shorthand for operands, constants and operations."""

    def __init__(self) -> None:
        self.model = nnapi.Model()

    def tensor(self, code: int, dims: list[int]) -> int:
        return self.model.add_operand(OperandType(code, dims))

    def floats(self, dims: list[int]) -> int:
        return self.tensor(T.TENSOR_FLOAT32, dims)

    def const(self, value: np.ndarray, code: int | None = None) -> int:
        value = np.asarray(value)
        if code is None:
            code = {np.dtype(np.float32): T.TENSOR_FLOAT32, np.dtype(np.int32): T.TENSOR_INT32,
                    np.dtype(np.bool_): T.TENSOR_BOOL8}[value.dtype]
        index = self.tensor(code, list(value.shape))
        self.model.set_operand_value(index, value)
        return index

    def scalar(self, value: int) -> int:
        index = self.model.add_operand(OperandType(T.INT32))
        self.model.set_operand_value(index, np.int32(value))
        return index

    def op(self, code: int, inputs: list[int], dims: list[int], kind: int = T.TENSOR_FLOAT32) -> int:
        out = self.tensor(kind, dims)
        self.model.add_operation(code, inputs, [out])
        return out

    def binary(self, code: int, a: int, b: int, dims: list[int], fuse: int = 0, kind: int = T.TENSOR_FLOAT32) -> int:
        return self.op(code, [a, b, self.scalar(fuse)], dims, kind)

    def split(self, x: int, count: int, dims: list[int]) -> list[int]:
        outs = [self.floats(dims) for _ in range(count)]
        self.model.add_operation(Op.SPLIT, [x, self.scalar(-1), self.scalar(count)], outs)
        return outs

    def column_block(self, x: int, start: int, stop: int, width: int, dims: list[int]) -> int:
        """STRIDED_SLICE of columns start:stop (stop == width as an end mask), as TFLite writes it."""
        end_mask = 3 if stop == width else 1
        begin_mask = 3 if start == 0 else 1
        inputs = [x, self.const(np.array([0, start], np.int32)), self.const(np.array([0, stop % width], np.int32)),
                  self.const(np.array([1, 1], np.int32)), self.scalar(begin_mask), self.scalar(end_mask),
                  self.scalar(0)]
        return self.op(Op.STRIDED_SLICE, inputs, dims)


STEPS, BATCH, FEATURES, UNITS = 9, 2, 5, 6


def _weights(reset_after: bool) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(11)
    u, f = UNITS, FEATURES
    recurrent_rows = 3 * u if reset_after else 2 * u

    def w(*shape):
        return (rng.standard_normal(shape) / np.sqrt(shape[-1])).astype(np.float32)

    weights = {"W": w(3 * u, f), "bx": w(3 * u) * 0.5, "R": w(recurrent_rows, u), "bh": w(recurrent_rows) * 0.5}
    if not reset_after:
        weights["Rc"], weights["bc"] = w(u, u), w(u) * 0.5
    return weights


def _body(miss: str | None, reset_after: bool, last_only: bool, slices: bool, hard: bool, relu: bool) -> nnapi.Model:
    """One Keras 3 GRU step as the TFLite importer writes it (or with ``miss``: one change);
    ``hard``: the gates' hard sigmoid relu6(x + 3) / 6; ``relu``: the candidate's RELU."""
    n = _Net()
    b, u, f, steps = BATCH, UNITS, FEATURES, STEPS
    ws = _weights(reset_after)
    counter_dims = [1]
    c0, c1 = n.tensor(T.TENSOR_INT32, counter_dims), n.tensor(T.TENSOR_INT32, counter_dims)
    buffer = n.floats([1 if last_only else steps, b, u])
    h, x = n.floats([b, u]), n.floats([steps, b, f])
    one = n.const(np.array([1], np.int32))
    step_0 = n.const(np.array([2], np.int32)) if miss == "counter_step_2" else one
    c0_next = n.binary(Op.ADD, c0, step_0, counter_dims, kind=T.TENSOR_INT32)
    c1_next = n.binary(Op.ADD, c1, one, counter_dims, kind=T.TENSOR_INT32)
    # the step's input x[i] and the products
    row = n.const(np.zeros(1, np.int32)) if miss == "first_row_each_step" else c1
    x_step = n.op(Op.RESHAPE, [n.op(Op.GATHER, [x, n.scalar(0), row], [1, b, f]),
                               n.const(np.array([b, f], np.int32))], [b, f])
    recurrent = n.floats([ws["R"].shape[0], u]) if miss == "weights_at_run_time" else n.const(ws["R"])
    h_product = n.op(Op.FULLY_CONNECTED, [h, recurrent, n.const(ws["bh"]), n.scalar(0)], [b, ws["R"].shape[0]])
    x_product = n.op(Op.FULLY_CONNECTED, [x_step, n.const(ws["W"]), n.const(ws["bx"]), n.scalar(0)], [b, 3 * u])
    x_z, x_r, x_c = n.split(x_product, 3, [b, u])
    width = ws["R"].shape[0]
    if slices:
        h_blocks = [n.column_block(h_product, k * u, (k + 1) * u, width, [b, u]) for k in range(width // u)]
    else:
        h_blocks = n.split(h_product, width // u, [b, u])

    def gate(pre: int, hard_sigmoid: bool) -> int:
        if hard_sigmoid:
            sixth = 0.2 if miss == "hard_sigmoid_by_fifth" else 1 / 6
            clip = 0 if miss == "hard_sigmoid_unclipped" else 3  # RELU6
            shifted = n.binary(Op.ADD, pre, n.const(np.array([3.0], np.float32)), [b, u], fuse=clip)
            return n.binary(Op.MUL, shifted, n.const(np.array([sixth], np.float32)), [b, u])
        return n.op(Op.TANH if miss == "tanh_gate" else Op.LOGISTIC, [pre], [b, u])
    z = gate(n.binary(Op.ADD, x_z, h_blocks[0], [b, u]), hard)
    r = gate(n.binary(Op.ADD, x_r, h_blocks[1], [b, u]), hard != (miss == "mixed_gates"))
    fuse = (3 if miss == "relu6_candidate" else 1) if relu else 0
    if reset_after:
        if miss == "reset_on_input":  # tanh(r * x_c + h_c): the reset gate on the wrong product
            pre = n.binary(Op.ADD, n.binary(Op.MUL, r, x_c, [b, u]), h_blocks[2], [b, u], fuse)
        else:
            pre = n.binary(Op.ADD, x_c, n.binary(Op.MUL, r, h_blocks[2], [b, u]), [b, u], fuse)
    else:
        scaled = n.binary(Op.MUL, r, h, [b, u])
        pre = n.binary(Op.ADD, x_c, n.op(Op.FULLY_CONNECTED, [scaled, n.const(ws["Rc"]), n.const(ws["bc"]),
                                                             n.scalar(0)], [b, u]), [b, u], fuse)
    if relu:  # the pre-activation's ADD with its fused RELU is the candidate
        candidate = pre
    else:
        candidate = n.op(Op.LOGISTIC if miss == "sigmoid_candidate" else Op.TANH, [pre], [b, u])
    kept = n.binary(Op.MUL, r if miss == "reset_keeps_state" else z, h, [b, u])
    ones = n.const(np.array([0.5 if miss == "complement_of_half" else 1.0], np.float32))
    blended = n.binary(Op.MUL, n.binary(Op.SUB, ones, z, [b, u]), candidate, [b, u])
    h_next = n.binary(Op.ADD, kept, blended, [b, u], fuse=1 if miss == "relu_state" else 0)
    if miss == "extra_operation":
        n.op(Op.TANH, [h_next], [b, u])  # read by nothing
    # the buffer
    if last_only:
        buffer_next = n.op(Op.RESHAPE, [h_next, n.const(np.array([1, b, u], np.int32))], [1, b, u])
    else:
        def index_vector(counter: int, rest: list[int]) -> int:
            spread = n.op(Op.GATHER, [counter, n.scalar(0), n.const(np.zeros(3, np.int32))], [3], T.TENSOR_INT32)
            return n.op(Op.SELECT, [n.const(np.array([True, False, False])), spread,
                                    n.const(np.array(rest, np.int32))], [3], T.TENSOR_INT32)
        head = n.op(Op.SLICE, [buffer, n.const(np.zeros(3, np.int32)), index_vector(c1, [0, -1, -1])], [0, 0, 0])
        tail = n.op(Op.SLICE, [buffer, index_vector(c1_next, [0, 0, 0]), n.const(np.full(3, -1, np.int32))],
                    [0, 0, 0])
        written = candidate if miss == "buffer_of_candidate" else h_next
        middle = n.op(Op.RESHAPE, [written, n.const(np.array([1, b, u], np.int32))], [1, b, u])
        buffer_next = n.op(Op.CONCATENATION, [head, middle, tail, n.scalar(0)], [steps, b, u])
    x_next = n.op(Op.RESHAPE, [x, n.const(np.array([steps, b, f], np.int32))], [steps, b, f])
    inputs = [c0, c1, buffer, h, x] + ([recurrent] if miss == "weights_at_run_time" else [])
    n.model.identify_inputs_and_outputs(inputs, [c0_next, c1_next, buffer_next, h_next, x_next])
    n.model.finish()
    return n.model


def _condition(bound: int, both: bool, last_only: bool, extra_input: bool) -> nnapi.Model:
    n = _Net()
    c0, c1 = n.tensor(T.TENSOR_INT32, [1]), n.tensor(T.TENSOR_INT32, [1])
    others = [n.floats([1 if last_only else STEPS, BATCH, UNITS]), n.floats([BATCH, UNITS]),
              n.floats([STEPS, BATCH, FEATURES])]
    if extra_input:
        others.append(n.floats([3 * UNITS, UNITS]))
    limit = n.const(np.array([bound], np.int32))
    going = n.op(Op.LESS, [c1, limit], [1], T.TENSOR_BOOL8)
    if both:
        going = n.op(Op.LOGICAL_AND, [n.op(Op.LESS, [c0, limit], [1], T.TENSOR_BOOL8), going], [1], T.TENSOR_BOOL8)
    n.model.identify_inputs_and_outputs([c0, c1, *others], [going])
    n.model.finish()
    return n.model


def _gru_loop(miss: str | None = None, reset_after: bool = True, last_only: bool = False, slices: bool = True,
              both_bounded: bool = True, hard: bool = False, relu: bool = False,
              open_outputs: bool = False) -> tuple[nnapi.Model, list]:
    """A model running a Keras 3 GRU's WHILE over an input sequence [STEPS, BATCH, FEATURES]
    from an input state, every loop result a model output (of unknown dimensions with
    ``open_outputs``)."""
    run_time_weights = miss == "weights_at_run_time"
    body = _body(miss, reset_after, last_only, slices, hard, relu)
    bound = STEPS - 1 if miss == "shorter_trip" else STEPS
    condition = _condition(bound, both_bounded, last_only, run_time_weights)
    n = _Net()
    x, h = n.floats([STEPS, BATCH, FEATURES]), n.floats([BATCH, UNITS])
    start = n.const(np.array([1 if miss == "counter_from_one" else 0], np.int32))
    other_start = n.const(np.zeros(1, np.int32))
    buffer = n.const(np.zeros([1 if last_only else STEPS, BATCH, UNITS], np.float32))
    references = [n.model.add_operand(OperandType(T.MODEL)) for _ in range(2)]
    n.model.set_operand_value_from_model(references[0], condition)
    n.model.set_operand_value_from_model(references[1], body)
    extra = [n.const(_weights(reset_after)["R"])] if run_time_weights else []
    shapes = [[1], [1], [1 if last_only else STEPS, BATCH, UNITS], [BATCH, UNITS], [STEPS, BATCH, FEATURES]]
    if open_outputs:
        shapes = [[0] * len(shape) for shape in shapes]
    finals = [n.tensor(T.TENSOR_INT32, shapes[0]), n.tensor(T.TENSOR_INT32, shapes[1]),
              *(n.floats(shape) for shape in shapes[2:])]
    n.model.add_operation(Op.WHILE, [*references, other_start, start, buffer, h, x, *extra], finals)
    n.model.identify_inputs_and_outputs([x, h], finals)
    n.model.finish()
    return n.model, [body, condition]


def _run(model: nnapi.Model, device: nnapi.Device, last_only: bool) -> list[np.ndarray]:
    rng = np.random.default_rng(4)
    compilation = nnapi.Compilation(model, [device])
    compilation.finish()
    execution = nnapi.Execution(compilation)
    execution.set_input(0, rng.uniform(-2, 2, (STEPS, BATCH, FEATURES)).astype(np.float32))
    execution.set_input(1, rng.uniform(-1, 1, (BATCH, UNITS)).astype(np.float32))
    outputs = [np.zeros(1, np.int32), np.zeros(1, np.int32),
               np.zeros((1 if last_only else STEPS, BATCH, UNITS), np.float32), np.zeros((BATCH, UNITS), np.float32),
               np.zeros((STEPS, BATCH, FEATURES), np.float32)]
    for position, array in enumerate(outputs):
        execution.set_output(position, array)
    execution.compute()
    return outputs


def _node_types(model: nnapi.Model) -> list[str]:
    return [node.op_type for node in lower_model(build_hal_model(model)[0])[0].graph.node]


def _agree(ours: list[np.ndarray], reference: list[np.ndarray]) -> None:
    for mine, theirs in zip(ours, reference, strict=True):
        if mine.dtype == np.int32:
            np.testing.assert_array_equal(mine, theirs)
        else:
            assert within_tolerance(T.TENSOR_FLOAT32, theirs, mine).all(), float(np.abs(mine - theirs).max())


@pytest.mark.parametrize("reset_after, last_only, slices, both_bounded, hard, relu", [
    (True, False, True, True, False, False), (True, True, False, True, False, False),
    (True, False, False, False, False, False), (False, False, True, True, False, False),
    (False, True, True, False, False, False), (True, False, True, True, True, False),
    (True, False, True, True, False, True), (False, True, False, True, True, True)])
def test_a_gru_loop_runs_as_one_gru_with_the_reference_values(ort_device, monkeypatch, reset_after, last_only,
                                                               slices, both_bounded, hard, relu):
    """Keras 3's GRU step (reset after or before the recurrent product; the whole sequence or
    the last step; gates cut by STRIDED_SLICE or SPLIT; one or both counters bounded; the
    gates' sigmoid or hard sigmoid, the candidate's tanh or relu), batch 2: one ONNX GRU, no
    Loop; every result (counters, buffer, state, the input passed through) within the CTS
    float32 tolerance of the reference and of the Loop lowering."""
    model, _keep = _gru_loop(reset_after=reset_after, last_only=last_only, slices=slices, both_bounded=both_bounded,
                             hard=hard, relu=relu)
    assert OrtDevice().get_unsupported_reasons(build_hal_model(model)[0]) == [None]
    types = _node_types(model)
    assert types.count("GRU") == 1 and "Loop" not in types
    fused = _run(model, ort_device, last_only)
    reference = _run(model, reference_device(), last_only)
    assert fused[0][0] == fused[1][0] == STEPS
    np.testing.assert_array_equal(fused[4], reference[4])
    _agree(fused, reference)
    monkeypatch.setattr(control_flow, "WHILE_FORMS", [])
    assert "GRU" not in _node_types(model)
    _agree(fused, _run(model, ort_device, last_only))
    assert np.abs(reference[3]).max() > 0.1  # a state that moved: the comparison means something


@pytest.mark.parametrize("miss", [
    "sigmoid_candidate", "tanh_gate", "reset_on_input", "reset_keeps_state", "complement_of_half", "relu_state",
    "extra_operation", "shorter_trip", "counter_from_one", "first_row_each_step", "counter_step_2",
    "buffer_of_candidate", "weights_at_run_time", "hard_sigmoid_by_fifth", "hard_sigmoid_unclipped",
    "mixed_gates", "relu6_candidate"])
def test_a_near_miss_keeps_the_loop(ort_device, miss):
    """A body one change away from a GRU step over the whole sequence (another activation,
    the reset gate elsewhere, a fused activation, an extra operation, a shorter trip, the
    step's counter starting at 1, x[0] read at every step, the other counter stepping by 2 (ending the loop early),
    the candidate written to the buffer instead of the state, recurrent weights given at
    run time; a hard sigmoid scaled by 1/5 or not clipped, the gates' functions mixed, a
    RELU6 candidate):
    not a GRU node but the Loop, with the reference's values."""
    model, _keep = _gru_loop(miss, hard=miss.startswith("hard") or miss == "mixed_gates",
                             relu=miss == "relu6_candidate")
    types = _node_types(model)
    assert "GRU" not in types and "Loop" in types
    _agree(_run(model, ort_device, False), _run(model, reference_device(), False))


def test_a_gru_loop_with_open_output_shapes(ort_device):
    """The WHILE's results declared with unknown dimensions (as a model with dynamic output
    shapes declares them): still one GRU, each result in the shape the body gives it, with
    the reference's values."""
    model, _keep = _gru_loop(open_outputs=True)
    assert _node_types(model).count("GRU") == 1
    fused = _run(model, ort_device, False)
    assert fused[0][0] == fused[1][0] == STEPS
    _agree(fused, _run(model, reference_device(), False))
