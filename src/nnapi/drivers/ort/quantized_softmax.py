"""A quantized SOFTMAX over two classes as the logistic of the stored values' difference,
proven equal to the reference on every input at preparation.

ONNX Runtime's Softmax over a short last axis costs ~10 ns per row (a segmentation head's
128x128x2 classes: ~280-350 us), its vectorized Sigmoid ~0.3 ns per element. For two
classes softmax(a, b) = (logistic(a - b), logistic(b - a)), and for 8-bit inputs of one
quantization a - b is scale * (q_a - q_b): the stored values as float32 (exact), their
difference and its negation by one MatMul with [[1, -1], [-1, 1]] (integers, exact), times
beta * scale (one rounding), Sigmoid, QuantizeLinear to the output's 1/256 steps. That is
not the reference's arithmetic (float64 exponentials from a table, rounding halves away
from zero), so the same nodes run once at preparation on all 65,536 pairs of stored values
(cached per quantization and beta) and are used only where every result equals the
reference's own operation's; anywhere else the general lowering applies (on this machine
every one of 240 random scale / beta pairs tried matched).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from nnapi.codes import OperandCode, OperationCode
from nnapi.drivers.ort.builder import QUANT8, GraphBuilder, internal_zero_point, lowers, probe_outputs
from nnapi.drivers.ort.normalization import lower_softmax
from nnapi.drivers.ort.requantize import quantization, stored_values
from nnapi.hal import Operand, Operation
from nnapi.operand import OperandType
from nnapi.operations import ExecutionContext, Tensor, get_operation

T = OperandCode

#: [q_a, q_b] @ this = [q_a - q_b, q_b - q_a]
_DIFFERENCES = np.array([[1, -1], [-1, 1]], np.float32)


@lowers(OperationCode.SOFTMAX)
def lower_softmax_two_classes(g: GraphBuilder, operation: Operation) -> None:
    """SOFTMAX of an 8-bit tensor over a last axis of 2 as above; otherwise (and where the
    probe differs anywhere) ``normalization.lower_softmax``."""
    x = g.value(operation.inputs[0])
    output = g.operand(operation.outputs[0])
    beta_operand = g.operand(operation.inputs[1])
    axis = int(g.optional_scalar(operation, 2, -1))
    if output.type not in QUANT8 or x.kind != "uint8" or not x.dims or not all(x.dims) \
            or axis not in (-1, x.rank - 1) or x.dims[-1] != 2 or beta_operand.type != T.FLOAT32 \
            or not float(g.scalar(operation.inputs[1])) > 0:
        lower_softmax(g, operation)
        return
    source = g.operand(operation.inputs[0])
    beta = float(np.float32(g.scalar(operation.inputs[1])))
    key = (quantization(source), beta, quantization(output))
    if not _proven(*key):
        lower_softmax(g, operation)
        return
    y = _logistic_nodes(g.one, g.constant, x.name, _factor(source.scale, beta), output)
    g.set_output(operation.outputs[0], y)


def _factor(scale: float, beta: float) -> np.float32:
    """beta * scale, the difference of stored values' factor, in float32."""
    return np.float32(np.float64(scale) * np.float64(beta))


def _logistic_nodes(one: Callable[..., str], constant: Callable[..., str], name: str, factor: np.float32,
                    output: Operand | OperandType) -> str:
    """The nodes (made by ``one`` / ``constant``, a GraphBuilder's) from uint8 ``name``
    [..., 2] to the quantized probabilities (uint8, the output's internal zero point)."""
    real = one("Cast", [name], to=TensorProto.FLOAT)
    differences = one("MatMul", [real, constant(_DIFFERENCES)])
    scaled = one("Mul", [differences, constant(np.array(factor, np.float32))])
    probabilities = one("Sigmoid", [scaled])
    return one("QuantizeLinear", [probabilities, constant(np.array(output.scale, np.float32)),
                                  constant(np.array(internal_zero_point(output), np.uint8))])


class _Nodes:
    """``GraphBuilder.one`` / ``constant`` for the probe's graph."""

    def __init__(self) -> None:
        self.nodes: list = []
        self.initializers: list = []

    def one(self, op_type: str, inputs: list[str], **attributes: Any) -> str:
        name = f"t{len(self.nodes)}"
        self.nodes.append(helper.make_node(op_type, inputs, [name], **attributes))
        return name

    def constant(self, array: np.ndarray) -> str:
        name = f"c{len(self.initializers)}"
        self.initializers.append(numpy_helper.from_array(np.asarray(array), name))
        return name


@functools.cache
def _proven(source: tuple[int, float, int], beta: float, output: tuple[int, float, int]) -> bool:
    """Whether ``_logistic_nodes`` in ONNX Runtime give the reference's SOFTMAX of every
    pair of stored values of ``source`` (65,536 rows of two)."""
    output_type = OperandType(output[0], [65536, 2], output[1], output[2])
    internal = np.arange(256, dtype=np.uint8)
    pairs = np.stack(np.meshgrid(internal, internal, indexing="ij"), -1).reshape(-1, 2)
    nodes = _Nodes()
    y = _logistic_nodes(nodes.one, nodes.constant, "x", _factor(source[1], beta), output_type)
    graph = helper.make_graph(nodes.nodes, "probe", [helper.make_tensor_value_info("x", TensorProto.UINT8, [None, 2])],
                              [helper.make_tensor_value_info(y, TensorProto.UINT8, [None, 2])], nodes.initializers)
    try:
        outputs = probe_outputs(graph, {"x": pairs})
    except ImportError:  # lowering without a runtime: the general lowering
        return False
    if outputs is None:  # a runtime that refuses the probe: the general lowering
        return False
    source_type = OperandType(source[0], [65536, 2], source[1], source[2])
    stored = stored_values(source_type)[pairs]
    context = ExecutionContext(OperationCode.SOFTMAX, [
        Tensor(source_type.type, (65536, 2), source_type.scale, source_type.zero_point, None, stored),
        Tensor(T.FLOAT32, (), 0.0, 0, None, np.array(beta, np.float32))], [output_type])
    expected = get_operation(OperationCode.SOFTMAX).execute(context)[0]
    if output_type.type == T.TENSOR_QUANT8_ASYMM_SIGNED:
        expected = expected.view(np.uint8) ^ np.uint8(0x80)  # the internal encoding
    return bool(np.array_equal(outputs[0], expected))
