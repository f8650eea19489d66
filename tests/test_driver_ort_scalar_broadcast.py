"""nnapi-ort-cpu's widened scalar constants (drivers/ort/scalar_broadcast.py): a broadcasting
operator's size-1 constant meeting a tensor whose last dimension is 1 is given the shape
[1, 1], which ONNX Runtime broadcasts 10-50x faster and to the same values and shape."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("onnx")
onnxruntime = pytest.importorskip("onnxruntime")

import onnx  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import nnapi  # noqa: E402
from helpers import reference_device, run_on  # noqa: E402
from nnapi import OperandCode as T  # noqa: E402
from nnapi import OperandType  # noqa: E402
from nnapi import OperationCode as Op  # noqa: E402
from nnapi.drivers.ort import lowering, reshape_views  # noqa: E402
from nnapi.drivers.ort.builder import onnx_model  # noqa: E402
from nnapi.drivers.ort.lowering import lower_model  # noqa: E402
from nnapi.drivers.ort.scalar_broadcast import inferred_shapes, widen_constants, widen_scalars  # noqa: E402
from nnapi.drivers.ort.session import disabled_optimizers, session_options  # noqa: E402
from nnapi.runtime.model_builder import build_hal_model  # noqa: E402


def _scalar_shapes(model) -> dict[str, list[list[int]]]:
    """Per operator type, the shapes of the size-1 initializers its nodes read."""
    initializers = {t.name: list(t.dims) for t in model.graph.initializer if int(np.prod(t.dims)) == 1}
    shapes: dict[str, list[list[int]]] = {}
    for node in model.graph.node:
        for name in node.input:
            if name in initializers:
                shapes.setdefault(node.op_type, []).append(initializers[name])
    return shapes


@pytest.mark.parametrize("shape, widened", [
    (["n", 5, 1], True), ([2, 5, 1], True), (["n", 5, 3], False), ([7], False), ([2, 1, 5], False)])
def test_scalars_meeting_a_last_dimension_of_one_are_widened(shape, widened):
    """Add, Mul, Max, Where and PRelu of a rank-0 or rank-1 scalar constant and a value of
    rank >= 2 ending in 1 read a [1, 1] copy of the constant (one copy, shared); elsewhere
    the graph is unchanged; the outputs are the same values of the same shape either way."""
    nodes = [helper.make_node("Add", ["x", "half"], ["a"]), helper.make_node("Mul", ["a", "two"], ["b"]),
             helper.make_node("Max", ["b", "half"], ["c"]), helper.make_node("Greater", ["c", "zero"], ["p"]),
             helper.make_node("Where", ["p", "c", "two"], ["d"]), helper.make_node("PRelu", ["d", "slope"], ["y"])]
    initializers = [numpy_helper.from_array(np.array(0.5, np.float32), "half"),
                    numpy_helper.from_array(np.array([2.0], np.float32), "two"),
                    numpy_helper.from_array(np.array(0.0, np.float32), "zero"),
                    numpy_helper.from_array(np.array([0.25], np.float32), "slope")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], initializers)
    model = onnx_model(graph)
    before = model.SerializeToString()
    widen_scalars(model)
    shapes = _scalar_shapes(model)
    if widened:
        assert all(dims == [1, 1] for reads in shapes.values() for dims in reads), shapes
        assert len(model.graph.initializer) == 8  # one [1, 1] copy per constant
    else:
        assert model.SerializeToString() == before
    concrete = [d if isinstance(d, int) else 3 for d in shape]
    x = np.random.default_rng(0).uniform(-2, 2, concrete).astype(np.float32)
    results = [onnxruntime.InferenceSession(m, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
               for m in (before, model.SerializeToString())]
    assert results[0].shape == results[1].shape == tuple(concrete)
    np.testing.assert_array_equal(results[0], results[1])


def test_quantize_of_a_one_channel_image_reads_widened_scalars(ort_device):
    """QUANTIZE of a [?, 12, 10, 1] float image (a grayscale microcontroller model's input,
    lowered as a Div and Add of scalars before QuantizeLinear) reads [1, 1] constants, and
    gives the reference's values exactly."""
    model = nnapi.Model()
    x = model.add_operand(OperandType(T.TENSOR_FLOAT32, [0, 12, 10, 1]))
    y = model.add_operand(OperandType(T.TENSOR_QUANT8_ASYMM_SIGNED, [0, 12, 10, 1], scale=1 / 255, zero_point=-128))
    model.add_operation(Op.QUANTIZE, [x], [y])
    model.identify_inputs_and_outputs([x], [y])
    model.finish()
    lowered, _, _ = lower_model(build_hal_model(model)[0])
    shapes = _scalar_shapes(lowered)
    assert shapes.get("Div") == [[1, 1]] and shapes.get("Add") == [[1, 1]], shapes
    image = np.random.default_rng(1).uniform(-0.2, 1.2, (2, 12, 10, 1)).astype(np.float32)
    image[0, 0, :4, 0] = [0.5 / 255, 1.5 / 255, -0.5 / 255, 254.5 / 255]  # halves
    results = [run_on(model, device, [image], [np.zeros((2, 12, 10, 1), np.int8)])[0]
               for device in (ort_device, reference_device())]
    np.testing.assert_array_equal(results[0], results[1])
    assert len(np.unique(results[0])) > 100


@pytest.mark.parametrize("code", [Op.MUL, Op.ADD, Op.SUB, Op.MINIMUM])
def test_quantized_product_with_a_one_channel_map_reads_a_full_rank_constant(ort_device, code):
    """A quantized MUL / ADD / SUB (a QLinearAdd of the negated scale) / MINIMUM of a [1, 16,
    16, 1] map (a super-resolution output, a mask) and a [1] constant: the QLinearMul /
    QLinearAdd / Min reads the constant as [1, 1, 1, 1], which
    ONNX Runtime broadcasts 35x faster (ESPCN int8: 0.31 -> 0.15 ms); shape inference does
    not reach QLinear operators, so widen_scalars could not. Or, where reshape_views runs
    the product on the flat [256] of the int8 shifts around it, reads it as one value over
    a tensor not ending in 1 (as fast: 14.0 against 13.6 us over 65,536 values, 1,257 for
    [1] over [1, 256, 256, 1]). The reference's values."""
    selection = code == Op.MINIMUM  # (in the inputs' quantization: no requantizing table)
    model = nnapi.Model()
    x = model.add_operand(OperandType(T.TENSOR_QUANT8_ASYMM_SIGNED, [1, 16, 16, 1], scale=0.02, zero_point=-3))
    factor = model.add_operand(OperandType(T.TENSOR_QUANT8_ASYMM_SIGNED, [1], scale=0.02 if selection else 0.01,
                                           zero_point=-3 if selection else 0))
    model.set_operand_value(factor, np.array([77], np.int8))
    inputs = [x, factor]
    if not selection:
        fuse = model.add_operand(OperandType(T.INT32))
        model.set_operand_value(fuse, np.int32(0))
        inputs.append(fuse)
    y = model.add_operand(OperandType(T.TENSOR_QUANT8_ASYMM_SIGNED, [1, 16, 16, 1], scale=0.02 if selection else 0.015,
                                      zero_point=-3 if selection else 2))
    model.add_operation(code, inputs, [y])
    model.identify_inputs_and_outputs([x], [y])
    model.finish()
    lowered, _, _ = lower_model(build_hal_model(model)[0])
    initializers = {t.name: list(t.dims) for t in lowered.graph.initializer}
    nodes = [node for node in lowered.graph.node if node.op_type in ("QLinearMul", "QLinearAdd", "Min")]
    position = 1 if selection else 3
    shapes = reshape_views._static_shapes(lowered, inferred_shapes(lowered))
    [node] = nodes
    tensor = shapes[node.input[0]]
    assert initializers.get(node.input[position]) == [1, 1, 1, 1] or (
        len(initializers.get(node.input[position])) <= 1 and tensor[-1] != 1), (node, tensor)
    image = np.random.default_rng(2).integers(-128, 128, (1, 16, 16, 1)).astype(np.int8)
    results = [run_on(model, device, [image], [np.zeros((1, 16, 16, 1), np.int8)])[0]
               for device in (ort_device, reference_device())]
    np.testing.assert_array_equal(results[0], results[1])
    assert len(np.unique(results[0])) > 50


def _spread_graph(shape, constant_shape, dequantized=False):
    """Sub / Mul / Add of float constants, QLinearMul / QLinearAdd of a uint8 constant (of
    ``constant_shape``) and a uint8 input of ``shape``; the float Sub's constant dequantized
    from a uint8 initializer where ``dequantized``."""
    rng = np.random.default_rng(3)
    size = int(np.prod(constant_shape))
    floats = rng.uniform(0.2, 0.8, (3, size)).astype(np.float32).reshape(3, *constant_shape)
    stored = rng.integers(0, 256, constant_shape).astype(np.uint8)
    nodes = [helper.make_node("DequantizeLinear", ["x", "s", "z"], ["xf"])]
    initializers = [numpy_helper.from_array(np.array(0.05, np.float32), "s"),
                    numpy_helper.from_array(np.array(7, np.uint8), "z"),
                    numpy_helper.from_array(np.array(0.004, np.float32), "sq"),
                    numpy_helper.from_array(floats[1], "mul"), numpy_helper.from_array(floats[2], "add"),
                    numpy_helper.from_array(stored, "q")]
    if dequantized:
        nodes.append(helper.make_node("DequantizeLinear", ["q", "sq", "z"], ["sub"]))
    else:
        initializers.append(numpy_helper.from_array(floats[0], "sub"))
    nodes += [helper.make_node("Sub", ["xf", "sub"], ["a"]), helper.make_node("Mul", ["a", "mul"], ["b"]),
              helper.make_node("Add", ["add", "b"], ["c"]), helper.make_node("QuantizeLinear", ["c", "s", "z"], ["u"]),
              helper.make_node("QLinearMul", ["u", "s", "z", "q", "sq", "z", "s", "z"], ["v"], domain="com.microsoft"),
              helper.make_node("QLinearAdd", ["q", "sq", "z", "v", "s", "z", "s", "z"], ["y"], domain="com.microsoft")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.UINT8, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.UINT8, None)], initializers)
    return onnx_model(graph, True)


@pytest.mark.parametrize("shape, constant_shape, spread", [
    ([1, 24, 96, 3], [1, 1, 1, 3], [1, 1, 96, 3]),  # per channel of an image: runs of 3 -> 288
    ([1, 24, 24, 3], [3], [1, 24, 24, 3]),  # of lower rank, through the height (24 x 3 < 256)
    ([2, 5, 4, 9], [1, 1, 9], [2, 5, 4, 9]),  # columns of rows: 180 elements in all, the whole tensor
    ([1, 6, 6, 16], [1, 6, 1, 16], [1, 6, 6, 16]),  # a run of 16 widened through the width
    (["n", 24, 24, 3], [1, 1, 1, 3], [1, 24, 24, 3]),  # an open batch: the spread stays in known dims
    ([1, "h", 4, 3], [1, 1, 1, 3], [1, 1, 4, 3]),  # as far as the dimensions are known
    ([1, 8, 8, 256], [1, 1, 1, 256], None),  # runs of INNER_SPAN already
    ([1, 24, 24, 3], [1, 24, 24, 3], None),  # no broadcast
    ([1, 24, 24, 1], [1, 1, 1, 1], None),  # one value (widen_scalars' case)
])
@pytest.mark.parametrize("dequantized", [False, True])
def test_short_constant_runs_are_spread(shape, constant_shape, spread, dequantized):
    """spread_inner_constants: a broadcasting operator's constant whose elements run along
    fewer than INNER_SPAN trailing elements (ORT then calls its kernel once per run) reads a
    copy spread over the output's trailing dimensions (one copy per constant and shape),
    through a per-tensor DequantizeLinear too; elsewhere the graph is unchanged. ORT's
    outputs are the same bytes either way, on every stored value of the input."""
    model = _spread_graph(shape, constant_shape, dequantized)
    before = model.SerializeToString()
    widen_constants(model)
    initializers = {t.name: list(t.dims) for t in model.graph.initializer}
    producers = {name: node for node in model.graph.node for name in node.output}
    read = {}
    for node in model.graph.node:
        if node.op_type in ("Sub", "Mul", "Add", "QLinearMul", "QLinearAdd"):
            for name in node.input:
                if name in producers and producers[name].op_type == "DequantizeLinear" and name != "xf":
                    name = producers[name].input[0]
                if name in initializers and int(np.prod(initializers[name])) > 1:
                    read[(node.op_type, name)] = initializers[name]
    if spread is None:
        assert model.SerializeToString() == before
    else:
        assert read and all(dims == spread for dims in read.values()), read
        # one spread copy of each constant: q read by the QLinear pair (and the Sub's DequantizeLinear)
        assert len(model.graph.initializer) == len(onnx.ModelProto.FromString(before).graph.initializer) + (
            3 if dequantized else 4)
    concrete = [d if isinstance(d, int) else 2 for d in shape]
    x = (np.arange(int(np.prod(concrete))) % 256).astype(np.uint8).reshape(concrete)
    results = [onnxruntime.InferenceSession(m, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
               for m in (before, model.SerializeToString())]
    assert results[0].shape == results[1].shape
    assert results[0].tobytes() == results[1].tobytes()
    assert len(np.unique(results[0])) > min(20, x.size // 4)


def test_per_axis_or_shared_dequantized_constants_stay():
    """A DequantizeLinear whose output something else reads too, or of a per-axis
    quantization (its axis would move with a new shape), is left as it is."""
    model = _spread_graph([1, 24, 24, 3], [1, 1, 1, 3], dequantized=True)
    graph = model.graph
    graph.node.append(helper.make_node("Identity", ["sub"], ["sub_copy"]))
    graph.output.append(helper.make_tensor_value_info("sub_copy", TensorProto.FLOAT, None))
    widen_constants(model)
    [dequantize] = [node for node in graph.node if node.output[0] == "sub"]
    assert dequantize.input[0] == "q"
    model = _spread_graph([1, 24, 24, 3], [1, 1, 1, 3], dequantized=True)
    [dequantize] = [node for node in model.graph.node if node.output[0] == "sub"]
    dequantize.attribute.append(helper.make_attribute("axis", 3))
    widen_constants(model)
    assert dequantize.input[0] == "q"


def _normalization_model(signed: bool) -> nnapi.Model:
    """An 8-bit [1, 8, 96, 3] image's per-channel normalization as TFLite writes Keras'
    Normalization layer (MUL by a [1] factor, SUB of a [1, 1, 1, 3] mean, MUL by a [1, 1, 1, 3]
    scale), and a float image's (SUB, MUL, ADD of [3] constants)."""
    qtype = T.TENSOR_QUANT8_ASYMM_SIGNED if signed else T.TENSOR_QUANT8_ASYMM
    shift = -128 if signed else 0
    dtype = np.int8 if signed else np.uint8
    model = nnapi.Model()

    def q(dims, scale, zero_point):
        return model.add_operand(OperandType(qtype, dims, scale=scale, zero_point=zero_point + shift))

    def const(index, values):
        model.set_operand_value(index, np.asarray(values, dtype))
        return index

    def fused():
        index = model.add_operand(OperandType(T.INT32))
        model.set_operand_value(index, np.int32(0))
        return index

    dims = [1, 8, 96, 3]
    x = q(dims, 1.0, 0)
    scaled, centered, y = q(dims, 0.0039, 0), q(dims, 0.0058, 83), q(dims, 0.0187, 114)
    model.add_operation(Op.MUL, [x, const(q([1], 1.5e-5, 0), [255 + shift]), fused()], [scaled])
    model.add_operation(Op.SUB, [scaled, const(q([1, 1, 1, 3], 0.0019, 0), np.array([255, 240, 213]) + shift), fused()],
                        [centered])
    model.add_operation(Op.MUL, [centered, const(q([1, 1, 1, 3], 0.0175, 0), np.array([249, 255, 254]) + shift),
                                 fused()], [y])
    f = model.add_operand(OperandType(T.TENSOR_FLOAT32, dims))
    g1, g2, fy = (model.add_operand(OperandType(T.TENSOR_FLOAT32, dims)) for _ in range(3))
    constants = []
    for values in ([0.485, 0.456, 0.406], [1 / 0.229, 1 / 0.224, 1 / 0.225], [0.1, -0.2, 0.3]):
        index = model.add_operand(OperandType(T.TENSOR_FLOAT32, [3]))
        model.set_operand_value(index, np.array(values, np.float32))
        constants.append(index)
    model.add_operation(Op.SUB, [f, constants[0], fused()], [g1])
    model.add_operation(Op.MUL, [g1, constants[1], fused()], [g2])
    model.add_operation(Op.ADD, [g2, constants[2], fused()], [fy])
    model.identify_inputs_and_outputs([x, f], [y, fy])
    model.finish()
    return model


@pytest.mark.parametrize("signed", [False, True])
def test_image_normalization_reads_spread_constants(ort_device, signed, monkeypatch):
    """An image normalization's lowered operators read its per-channel constants spread
    over [1, 1, 96, 3] (EfficientNetV2B1 int8: 270 of its 1,630 us were two such broadcasts
    on its 96x96x3 input); ORT's outputs are those of the graph without the spread bit for
    bit, on every stored value of every channel, and the device's are the reference's (the
    float chain exactly; the 8-bit chain within the step of the float rescales
    before it)."""
    model = _normalization_model(signed)
    dims, dtype = [1, 8, 96, 3], np.int8 if signed else np.uint8
    lowered, _, _ = lower_model(build_hal_model(model)[0])
    initializers = {t.name: list(t.dims) for t in lowered.graph.initializer}
    producers = {name: node for node in lowered.graph.node for name in node.output}
    constant_reads = []
    for node in lowered.graph.node:
        if node.op_type in ("Sub", "Mul", "Add", "QLinearMul", "QLinearAdd"):
            for name in node.input:
                if name in producers and producers[name].op_type == "DequantizeLinear":
                    name = producers[name].input[0]
                if name in initializers and int(np.prod(initializers[name])) == 96 * 3:
                    constant_reads.append((node.op_type, initializers[name]))
    assert len(constant_reads) >= 5 and all(dims == [1, 1, 96, 3] for _, dims in constant_reads), constant_reads
    assert not [name for name, dims in initializers.items() if dims in ([1, 1, 1, 3], [3]) and any(
        name in node.input for node in lowered.graph.node)]
    image = (np.arange(8 * 96 * 3) % 256 - (128 if signed else 0)).astype(dtype).reshape(dims)
    floats = np.random.default_rng(4).uniform(-1, 2, dims).astype(np.float32)
    monkeypatch.setattr(lowering, "widen_constants", lambda graph, shapes=None: widen_scalars(graph, shapes))
    unspread, _, _ = lower_model(build_hal_model(model)[0])
    monkeypatch.undo()
    sessions = [onnxruntime.InferenceSession(m.SerializeToString(), session_options(1),
                                             providers=["CPUExecutionProvider"],
                                             disabled_optimizers=disabled_optimizers(m.graph))
                for m in (lowered, unspread)]
    feeds = dict(zip([i.name for i in sessions[0].get_inputs()], (image, floats)))
    spread_out, unspread_out = (session.run(None, feeds) for session in sessions)
    assert all(a.tobytes() == b.tobytes() for a, b in zip(spread_out, unspread_out))
    results = [run_on(model, device, [image, floats], [np.zeros(dims, dtype), np.zeros(dims, np.float32)])
               for device in (ort_device, reference_device())]
    assert np.abs(results[0][0].astype(np.int32) - results[1][0]).max() <= 1
    np.testing.assert_array_equal(results[0][1], results[1][1])
    assert len(np.unique(results[0][0])) > 100
