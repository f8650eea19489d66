"""nnapi-ort-cpu's Reshape classes (drivers/ort/reshape_views.py): values joined by Reshapes and
position-wise operators are computed in one shape, with a Reshape only where another
operator, a graph output or a control-flow body needs its own; the values are the graph's
before, bit for bit."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("onnx")
onnxruntime = pytest.importorskip("onnxruntime")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import nnapi  # noqa: E402
from helpers import operand_adder, reference_device, run_on  # noqa: E402
from nnapi import OperandCode as T  # noqa: E402
from nnapi import OperationCode as Op  # noqa: E402
from nnapi.conformance import within_tolerance  # noqa: E402
from nnapi.drivers.ort import lowering, reshape_views, session  # noqa: E402
from nnapi.drivers.ort.builder import MS_DOMAIN, onnx_model  # noqa: E402
from nnapi.drivers.ort.device import OrtDevice  # noqa: E402, F401  (registers every lowering)
from nnapi.runtime.model_builder import build_hal_model  # noqa: E402

T_, C, UNITS = 5, 8, 12  # tokens, channels, hidden units


def _run(model, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    options = session.session_options(threads=1)
    return onnxruntime.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"],
                                        disabled_optimizers=session.disabled_optimizers()).run(None, feeds)


def _reshapes(model) -> int:
    return sum(node.op_type == "Reshape" for node in model.graph.node)


def _constant(name: str, array) -> object:
    return numpy_helper.from_array(np.asarray(array), name)


def _shape(name: str, dims) -> object:
    return _constant(name, np.array(dims, np.int64))


def _residual_graph(output_shape=(1, T_, C), captured=False):
    """A pre-norm block's skeleton as the lowering writes it: x [1, T, C] -> Reshape [T, C] ->
    LayerNormalization -> Reshape [1, T, C] -> Reshape [T, C] -> Gemm -> Reshape [1, T, C] ->
    Add x -> Mul by a last-axis vector -> Gelu -> Add 0.5 -> Reshape to ``output_shape`` (the
    graph output); the Add's sum is a second output in its own shape. ``captured``: an If
    whose branches read the Gelu's value by its outer name."""
    rng = np.random.default_rng(1)
    nodes = [helper.make_node("Reshape", ["x", "rows"], ["r0"]),
             helper.make_node("LayerNormalization", ["r0", "gamma", "beta"], ["n"], axis=-1, epsilon=1e-5),
             helper.make_node("Reshape", ["n", "block"], ["r1"]),
             helper.make_node("Reshape", ["r1", "rows"], ["r2"]),
             helper.make_node("Gemm", ["r2", "w", "b"], ["g"], transB=1),
             helper.make_node("Reshape", ["g", "block"], ["r3"]),
             helper.make_node("Add", ["x", "r3"], ["sum"]),
             helper.make_node("Mul", ["sum", "vector"], ["m"]),
             helper.make_node("Gelu", ["m"], ["e"], domain=MS_DOMAIN),
             helper.make_node("Add", ["e", "half"], ["a"]),
             helper.make_node("Reshape", ["a", "out_shape"], ["y"])]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(output_shape)),
               helper.make_tensor_value_info("sum", TensorProto.FLOAT, [1, T_, C])]
    if captured:
        branch = helper.make_graph([helper.make_node("Neg", ["e"], ["neg"])], "then", [],
                                   [helper.make_tensor_value_info("neg", TensorProto.FLOAT, None)])
        other = helper.make_graph([helper.make_node("Abs", ["e"], ["abs"])], "else", [],
                                  [helper.make_tensor_value_info("abs", TensorProto.FLOAT, None)])
        nodes.append(helper.make_node("If", ["flag"], ["z"], then_branch=branch, else_branch=other))
        outputs.append(helper.make_tensor_value_info("z", TensorProto.FLOAT, None))
    initializers = [_shape("rows", [T_, C]), _shape("block", [1, T_, C]), _shape("out_shape", list(output_shape)),
                    _constant("gamma", rng.uniform(0.5, 2, C).astype(np.float32)),
                    _constant("beta", rng.uniform(-1, 1, C).astype(np.float32)),
                    _constant("w", rng.standard_normal((C, C)).astype(np.float32)),
                    _constant("b", rng.standard_normal(C).astype(np.float32)),
                    _constant("vector", rng.uniform(-2, 2, (1, 1, C)).astype(np.float32)),
                    _constant("half", np.array([0.5], np.float32))]
    if captured:
        initializers.append(_constant("flag", np.array(True)))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, T_, C])],
                              outputs, initializers)
    return onnx_model(graph, ms_domain=True)


@pytest.mark.parametrize("output_shape, captured", [((1, T_, C), False), ((T_, C), False), ((1, T_ * C), False),
                                                    ((1, T_, C), True)])
def test_a_residual_stream_is_computed_in_one_shape_with_the_same_values(output_shape, captured):
    """The block's class (x's Reshapes, the norm, the Gemm's output and the Add / Mul / Gelu /
    Add after it) is computed in one shape, [1, T, C] or [T, C]: the five Reshapes become
    three (in [1, T, C]: the norm's rows for the Gemm, the Gemm's rows back, and the output
    under its name, which [T, C] needs too, with x to rows and the sum, an output, in its
    own shape; with an If reading the Gelu's value, [T, C] would need a fourth), the
    last-axis vector is read as [C]; every output (and the If body's read of an outer
    value) is the graph's before, bit for bit, in its own shape."""
    model = _residual_graph(output_shape, captured)
    before = model.SerializeToString()
    reshape_views.simplify_reshapes(model)
    x = np.random.default_rng(2).standard_normal((1, T_, C)).astype(np.float32)
    old = onnxruntime.InferenceSession(before, providers=["CPUExecutionProvider"]).run(None, {"x": x})
    new = _run(model, {"x": x})
    for a, b in zip(old, new):
        assert a.shape == b.shape
        np.testing.assert_array_equal(a, b)
    assert _reshapes(model) == 3, [n.op_type for n in model.graph.node]
    outputs = {node.output[0] for node in model.graph.node}
    assert {"y", "sum", "e"} <= outputs
    vector = next(t for t in model.graph.initializer if t.name in next(n for n in model.graph.node
                                                                       if n.op_type == "Mul").input)
    assert list(vector.dims) == [C]


def test_a_class_is_left_where_it_would_not_lose_reshapes():
    """One Reshape between two rigid operators (a Gemm's output read by a Transpose) stays:
    there is nothing to save; the graph is unchanged."""
    nodes = [helper.make_node("Gemm", ["x", "w"], ["g"]),
             helper.make_node("Reshape", ["g", "heads"], ["h"]),
             helper.make_node("Transpose", ["h"], ["y"], perm=[1, 0, 2]),
             helper.make_node("Relu", ["y"], ["r"]),
             helper.make_node("Reshape", ["r", "flat"], ["z"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [T_, C])],
                              [helper.make_tensor_value_info("z", TensorProto.FLOAT, None)],
                              [_constant("w", np.ones((C, C), np.float32)), _shape("heads", [T_, 2, C // 2]),
                               _shape("flat", [-1])])
    model = onnx_model(graph)
    before = model.SerializeToString()
    reshape_views.simplify_reshapes(model)
    assert model.SerializeToString() == before


def test_softmax_keeps_its_last_axis_and_broadcasting_operators_their_shapes():
    """A Softmax over [2, 6] and a Reshape of its input from [3, 4]: the class may not take
    [3, 4] (the last axis would change), so it keeps [2, 6]; an Add broadcasting a [1, 6]
    tensor (not a constant) is no member: its inputs are read in their own shapes. Values
    bit for bit."""
    nodes = [helper.make_node("Relu", ["x"], ["a"]),
             helper.make_node("Reshape", ["a", "wide"], ["b"]),
             helper.make_node("Softmax", ["b"], ["s"], axis=-1),
             helper.make_node("Reshape", ["s", "narrow"], ["c"]),
             helper.make_node("Reshape", ["c", "wide"], ["d"]),
             helper.make_node("Add", ["d", "row"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 4]),
                                           helper.make_tensor_value_info("row", TensorProto.FLOAT, [1, 6])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [_shape("wide", [2, 6]), _shape("narrow", [3, 4])])
    model = onnx_model(graph)
    before = model.SerializeToString()
    reshape_views.simplify_reshapes(model)
    kinds = [node.op_type for node in model.graph.node]
    assert kinds.count("Reshape") == 1 and kinds[-1] == "Add", kinds
    reshape = next(node for node in model.graph.node if node.op_type == "Reshape")
    assert reshape.input[0] == "x"  # the Relu runs in [2, 6] after one Reshape of x
    rng = np.random.default_rng(3)
    feeds = {"x": rng.standard_normal((3, 4)).astype(np.float32), "row": rng.standard_normal((1, 6)).astype(np.float32)}
    old = onnxruntime.InferenceSession(before, providers=["CPUExecutionProvider"]).run(None, feeds)
    np.testing.assert_array_equal(old[0], _run(model, feeds)[0])


def test_values_of_open_shape_are_left_as_they_are():
    """A class with a dimension known only at run time keeps every Reshape."""
    nodes = [helper.make_node("Reshape", ["x", "rows"], ["a"]), helper.make_node("Relu", ["a"], ["b"]),
             helper.make_node("Reshape", ["b", "back"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4, C])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [_shape("rows", [-1, C]), _shape("back", [-1, 4, C])])
    model = onnx_model(graph)
    before = model.SerializeToString()
    reshape_views.simplify_reshapes(model)
    assert model.SerializeToString() == before


def _block_model(quantized: bool = False):
    """NNAPI: x [1, T, C] -> FULLY_CONNECTED (rows of C) -> RESHAPE [1, T, U] -> TANH ->
    RESHAPE [T, U] -> FULLY_CONNECTED -> RESHAPE [1, T, C] -> ADD x -> MUL by a [C] vector
    -> output [1, T, C]: a transformer's feed-forward block as the TFLite importer writes it
    (float32; ``quantized``: int8 with the same structure)."""
    model, inputs, values = nnapi.Model(), [], []
    operand = operand_adder(model, inputs, values)
    rng = np.random.default_rng(5)
    if quantized:
        def tensor(shape, value=None, scale=0.05, zero_point=3, given=False):
            return operand(T.TENSOR_QUANT8_ASYMM_SIGNED, shape, value, scale, zero_point, given)

        def weights(shape):
            return tensor(shape, rng.integers(-100, 100, shape).astype(np.int8), scale=0.01, zero_point=0)

        def bias(units, input_scale):
            return operand(T.TENSOR_INT32, [units], rng.integers(-500, 500, units).astype(np.int32),
                           scale=input_scale * 0.01)
        x = tensor([1, T_, C], rng.integers(-128, 127, (1, T_, C)).astype(np.int8), given=True)
    else:
        def tensor(shape, value=None, given=False):
            return operand(T.TENSOR_FLOAT32, shape, value, given=given)

        def weights(shape):
            return tensor(shape, rng.standard_normal(shape).astype(np.float32))

        def bias(units, input_scale):
            return tensor([units], rng.standard_normal(units).astype(np.float32))
        x = tensor([1, T_, C], rng.standard_normal((1, T_, C)).astype(np.float32), given=True)
    none = operand(T.INT32, None, np.int32(0))

    def op(code, args, shape, **quantization):
        out = tensor(shape, **quantization)
        model.add_operation(code, args, [out])
        return out

    def shape_of(dims):
        return operand(T.TENSOR_INT32, [len(dims)], np.array(dims, np.int32))

    hidden = op(Op.FULLY_CONNECTED, [x, weights([UNITS, C]), bias(UNITS, 0.05), none], [T_, UNITS])
    hidden = op(Op.RESHAPE, [hidden, shape_of([1, T_, UNITS])], [1, T_, UNITS])
    tanh = {"scale": 1 / 128, "zero_point": 0} if quantized else {}
    hidden = op(Op.TANH, [hidden], [1, T_, UNITS], **tanh)
    hidden = op(Op.RESHAPE, [hidden, shape_of([T_, UNITS])], [T_, UNITS], **tanh)
    back = op(Op.FULLY_CONNECTED, [hidden, weights([C, UNITS]), bias(C, 1 / 128), none], [T_, C])
    back = op(Op.RESHAPE, [back, shape_of([1, T_, C])], [1, T_, C])
    total = op(Op.ADD, [x, back, none], [1, T_, C])
    vector = tensor([C], rng.integers(-100, 100, C).astype(np.int8) if quantized
                    else rng.uniform(-2, 2, C).astype(np.float32))
    y = op(Op.MUL, [total, vector, none], [1, T_, C])
    model.identify_inputs_and_outputs(inputs, [y])
    model.finish()
    return model, values


@pytest.mark.parametrize("quantized", [False, True])
def test_a_feed_forward_block_loses_its_reshapes_and_keeps_its_values(ort_device, monkeypatch, quantized):
    """The block (above) lowers with fewer Reshapes than without the pass, and nnapi-ort-cpu
    gives the same values as without it, bit for bit, and the reference's within the CTS
    tolerance (quantized: the values the lowering was proven for, unchanged)."""
    model, values = _block_model(quantized)
    hal = build_hal_model(model)[0]
    with_pass = lowering.lower_model(hal)[0]
    expected = [np.zeros((1, T_, C), np.int8 if quantized else np.float32)]
    ours = run_on(model, ort_device, values, [np.zeros_like(e) for e in expected])
    with monkeypatch.context() as patch:
        patch.setattr(lowering, "simplify_reshapes", lambda model: None)
        without = lowering.lower_model(hal)[0]
        plain = run_on(model, ort_device, values, [np.zeros_like(e) for e in expected])
    assert _reshapes(with_pass) < _reshapes(without), (_reshapes(with_pass), _reshapes(without))
    np.testing.assert_array_equal(ours[0], plain[0])
    theirs = run_on(model, reference_device(), values, [np.zeros_like(e) for e in expected])
    if quantized:
        assert np.abs(ours[0].astype(np.int32) - theirs[0]).max() <= 1
    else:
        assert within_tolerance(T.TENSOR_FLOAT32, theirs[0], ours[0]).all()



@pytest.mark.parametrize("axis", [-1, 1])
def test_a_softmax_naming_its_last_axis_from_the_front_keeps_it_in_the_class_shape(ort_device, axis):
    """x [1, T, C] -> RESHAPE [T, C] -> SOFTMAX(axis) -> RESHAPE [1, T, C] -> ADD x: the class
    is computed in [1, T, C], where SOFTMAX's axis 1 (the last of [T, C]) would be T's (R2:
    it normalised over the tokens, 0.48 off the reference); it is written as -1."""
    model = nnapi.Model()
    inputs: list[int] = []
    values: list[np.ndarray] = []
    operand = operand_adder(model, inputs, values)
    x = operand(T.TENSOR_FLOAT32, [1, T_, C], np.random.default_rng(4).standard_normal((1, T_, C)).astype(np.float32),
                given=True)
    rows, soft, back, y = (operand(T.TENSOR_FLOAT32, shape) for shape in ([T_, C], [T_, C], [1, T_, C], [1, T_, C]))
    model.add_operation(Op.RESHAPE, [x, operand(T.TENSOR_INT32, [2], np.array([T_, C], np.int32))], [rows])
    model.add_operation(Op.SOFTMAX, [rows, operand(T.FLOAT32, None, np.float32(1.0)),
                                     operand(T.INT32, None, np.int32(axis))], [soft])
    model.add_operation(Op.RESHAPE, [soft, operand(T.TENSOR_INT32, [3], np.array([1, T_, C], np.int32))], [back])
    model.add_operation(Op.ADD, [back, x, operand(T.INT32, None, np.int32(0))], [y])
    model.identify_inputs_and_outputs(inputs, [y])
    model.finish()
    lowered = lowering.lower_model(build_hal_model(model)[0])[0]
    assert _reshapes(lowered) == 0, [node.op_type for node in lowered.graph.node]  # the class took [1, T, C]
    ours = run_on(model, ort_device, values, [np.zeros((1, T_, C), np.float32)])[0]
    theirs = run_on(model, reference_device(), values, [np.zeros((1, T_, C), np.float32)])[0]
    assert within_tolerance(T.TENSOR_FLOAT32, theirs, ours).all(), np.abs(ours - theirs).max()

def test_sessions_run_without_the_skip_layer_norm_fusion():
    """An Add before a LayerNormalization of the same shape stays two nodes in the device's
    sessions (ORT's SkipLayerNormalization is slower on CPU)."""
    import os
    import tempfile

    nodes = [helper.make_node("Add", ["x", "x"], ["s"]),
             helper.make_node("LayerNormalization", ["s", "gamma", "beta"], ["y"], axis=-1, epsilon=1e-5)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, T_, C])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [_constant("gamma", np.ones(C, np.float32)), _constant("beta", np.zeros(C, np.float32))])
    assert session.SKIP_LAYER_NORM_FUSION in session.disabled_optimizers()
    options = session.session_options(threads=1)
    options.optimized_model_filepath = os.path.join(tempfile.mkdtemp(), "optimized.onnx")
    onnxruntime.InferenceSession(onnx_model(graph).SerializeToString(), options, providers=["CPUExecutionProvider"],
                                 disabled_optimizers=session.disabled_optimizers())
    import onnx

    kinds = [node.op_type for node in onnx.load(options.optimized_model_filepath).graph.node]
    assert "SkipLayerNormalization" not in kinds and "LayerNormalization" in kinds, kinds


def test_shapes_are_known_past_com_microsoft_operators():
    """A Conv1D stack as PyTorch exports lower it (wav2vec2's feature encoder): Conv ->
    Reshape to [1, C, T] -> Gelu -> Reshape back -> Conv. ONNX shape inference stops at the
    com.microsoft Gelu; read through as a stand-in of its input's shape, the second Conv's
    output is known, so its Gelu runs in the Conv's own shape and the Reshapes between the
    Convs go; values bit for bit."""
    rng = np.random.default_rng(6)
    nodes = [helper.make_node("Gelu", ["x"], ["a"], domain=MS_DOMAIN),
             helper.make_node("Conv", ["a", "w1"], ["c1"], kernel_shape=[1, 3]),
             helper.make_node("Reshape", ["c1", "flat"], ["r1"]),
             helper.make_node("Gelu", ["r1"], ["g1"], domain=MS_DOMAIN),
             helper.make_node("Reshape", ["g1", "image"], ["r2"]),
             helper.make_node("Conv", ["r2", "w2"], ["c2"], kernel_shape=[1, 3]),
             helper.make_node("Reshape", ["c2", "flat2"], ["r3"]),
             helper.make_node("Gelu", ["r3"], ["g2"], domain=MS_DOMAIN),
             helper.make_node("Reshape", ["g2", "image2"], ["r4"]),
             helper.make_node("Conv", ["r4", "w3"], ["y"], kernel_shape=[1, 1])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 1, 12])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [_constant("w1", rng.standard_normal((6, 4, 1, 3)).astype(np.float32)),
                               _constant("w2", rng.standard_normal((6, 6, 1, 3)).astype(np.float32)),
                               _constant("w3", rng.standard_normal((2, 6, 1, 1)).astype(np.float32)),
                               _shape("flat", [1, 6, 10]), _shape("image", [1, 6, 1, 10]),
                               _shape("flat2", [1, 6, 8]), _shape("image2", [1, 6, 1, 8])])
    model = onnx_model(graph, ms_domain=True)
    before = model.SerializeToString()
    reshape_views.simplify_reshapes(model)
    assert _reshapes(model) == 0, [node.op_type for node in model.graph.node]
    x = rng.standard_normal((1, 4, 1, 12)).astype(np.float32)
    old = onnxruntime.InferenceSession(before, providers=["CPUExecutionProvider"]).run(None, {"x": x})
    np.testing.assert_array_equal(old[0], _run(model, {"x": x})[0])


def test_a_failing_rewrite_leaves_the_graph_as_lowered(monkeypatch):
    """The pass is an optimization: should a rewrite fail halfway (here after dropping a
    node and adding an initializer), the graph is restored as it was and no shapes are
    returned; lowering goes on with it."""
    model = _residual_graph()
    before = model.SerializeToString()

    def broken(self):
        del self.graph.node[0]
        self._constant(np.zeros(3, np.float32), "left_behind")
        raise KeyError("a bug")

    monkeypatch.setattr(reshape_views._Rewrite, "run", broken)
    assert reshape_views.simplify_reshapes(model) is None
    assert model.SerializeToString() == before
