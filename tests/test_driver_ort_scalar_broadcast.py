"""nnapi-ort-cpu's widened scalar constants (drivers/ort/scalar_broadcast.py): a broadcasting
operator's size-1 constant meeting a tensor whose last dimension is 1 is given the shape
[1, 1], which ONNX Runtime broadcasts 10-50x faster and to the same values and shape."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("onnx")
onnxruntime = pytest.importorskip("onnxruntime")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import nnapi  # noqa: E402
from helpers import reference_device, run_on  # noqa: E402
from nnapi import OperandCode as T  # noqa: E402
from nnapi import OperandType  # noqa: E402
from nnapi import OperationCode as Op  # noqa: E402
from nnapi.drivers.ort import reshape_views  # noqa: E402
from nnapi.drivers.ort.builder import onnx_model  # noqa: E402
from nnapi.drivers.ort.lowering import lower_model  # noqa: E402
from nnapi.drivers.ort.scalar_broadcast import inferred_shapes, widen_scalars  # noqa: E402
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
