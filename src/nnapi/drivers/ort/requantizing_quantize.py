"""A QUANTIZE of a DEQUANTIZEd 8-bit tensor (the importer's requantizing QUANTIZE) in two
nodes at most, proven equal to the reference at preparation.

The TFLite importer writes a requantizing QUANTIZE (8-bit in, 8-bit out) as DEQUANTIZE +
QUANTIZE: a model's uint8 input or output around an int8 graph (yolov5's TF export,
MobileNet's uint8 I/O), or the alignment of CONCATENATION inputs to one quantization
(YOLOv8's class scores, 1/256 after their LOGISTIC, into the detections' scale). The general
lowering rounds the float values halves away from zero as the reference does (Div, Abs,
Floor, Sign or Clip, Mul, QuantizeLinear): ~0.3 ms over a 320x320x3 image, ~0.5 ms over
yolov5's [1, 6300, 85] detections, ~0.15 ms over YOLOv8's [1, 80, 2100] scores. Here:

- one scale on both sides: the reference computes round((q - z) * s / s) + z' in float32,
  which is (q - z) + z' exactly (the two roundings move (q - z) by at most 255 * 2**-23
  relative, far from the next half). Where the internal zero points agree too (int8 <->
  uint8 of zero points 128 apart: this driver holds int8 as uint8 + 128) ``lower_quantize``
  itself passes the stored values on; otherwise a DequantizeLinear / QuantizeLinear pair
  of scale 1 (integers, exact, saturated);
- other scales: DequantizeLinear / QuantizeLinear of the two quantizations, where ONNX
  Runtime's QuantizeLinear (halves to even) gives the reference's result on all 256 stored
  values: it differs only on an exact half, which most scale pairs never produce (none of
  206 random pairs did; a ratio of 0.5 does).

The reference's own DEQUANTIZE and QUANTIZE run once on all 256 stored values per
quantization pair (cached), the second form in ONNX Runtime beside them; anything that
differs keeps the general lowering.

A QUANTIZE of a short float32 element-wise chain over one DEQUANTIZEd 8-bit tensor (PT2E
models converted by ai-edge-torch leave each activation in float between a DEQUANTIZE and a
QUANTIZE: SiLU as MUL(x, LOGISTIC(x)) of the dequantized x) is, per element, a function of
that tensor's stored value alone. Its float value is already lowered (DequantizeLinear,
Sigmoid, Mul as the chain's own lowerings emit them); the QUANTIZE becomes one QuantizeLinear
of it where that ONNX form (the very nodes emitted, copied into a probe) followed by
QuantizeLinear gives, on all 256 stored values in ONNX Runtime, what the reference's own
DEQUANTIZE, chain operations and QUANTIZE give, bit for bit. Otherwise (an exact half the
two round differently, a form that is not element-wise) the general lowering. The chain's
float values may have other readers: they keep their own lowering; only the QUANTIZE changes
(torchvision efficientnet_b0 quantized with PT2E: 49 of its 56 QUANTIZEs, each ~8 nodes).
A SiLU whose LOGISTIC and MUL nobody else reads becomes DequantizeLinear, com.microsoft
QuickGelu (one pass instead of Sigmoid and Mul, each of which ORT gave a DequantizeLinear of
its own) and QuantizeLinear, the Sigmoid and Mul dropped, where that form too is proven equal
(efficientnet_b0 PT2E: 1.7x -> 1.23x LiteRT).
A chain over two DEQUANTIZEd 8-bit tensors of the same shape (a residual ADD, a MUL by a
gate) is proven the same way on all 65,536 pairs of their stored values. The probe holds the
chain's values that the model reads elsewhere as outputs of its own, so that ORT's QDQ fusion
(DequantizeLinear, Add, QuantizeLinear into QLinearAdd, whose arithmetic differs: 68 pairs of
65,536 for one uint8 residual) happens in the probe exactly where it happens in the model.
The chain may read float32 constants of one element and run to the 21 operations of the
importer's quantized GELU (composites.py lowers them as one com.microsoft Gelu): a PT2E
transformer's MLP is then DequantizeLinear, Gelu and one QuantizeLinear where proven, in
place of the general rounding's eight nodes over [197, 768] values (tinyvit PT2E: 3.13 ->
2.69 ms in ORT, ~3 ms of probes at preparation for its four GELUs).
"""

from __future__ import annotations

import functools

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from nnapi.codes import OperandCode, OperationCode
from nnapi.drivers.ort.builder import MS_DOMAIN, QUANT8, GraphBuilder, internal_zero_point, lowers, probe_outputs
from nnapi.drivers.ort.composites import QUANTIZED_SWISH
from nnapi.drivers.ort.lookups import quantized_lookup
from nnapi.drivers.ort.quantization import lower_quantize
from nnapi.hal import Operand, OperandLifeTime, Operation
from nnapi.operand import OperandType
from nnapi.operations import ExecutionContext, Tensor, get_operation

T = OperandCode
L = OperandLifeTime


@lowers(OperationCode.QUANTIZE)
def lower_requantizing_quantize(g: GraphBuilder, operation: Operation) -> None:
    """QUANTIZE of a float32 DEQUANTIZE of an 8-bit tensor as above; otherwise
    ``quantization.lower_quantize``."""
    source = g.dequantized.get(operation.inputs[0])
    output = g.operand(operation.outputs[0])
    if source is None and output.type in QUANT8 and (_chain_quantize(g, operation, output) or
                                                     quantized_lookup(g, operation)):
        return
    same_scale = source is not None and np.float32(source.scale) == np.float32(output.scale)
    if source is None or output.type not in QUANT8 or (same_scale and source.zero_point == internal_zero_point(output)):
        lower_quantize(g, operation)  # one quantization: it passes the stored values on
        return
    key = (float(source.scale), int(source.zero_point), int(output.type), float(output.scale),
           int(output.zero_point))
    zero_from, zero_to = int(source.zero_point), internal_zero_point(output)
    if same_scale and _shift_proven(*key, zero_to):
        scale_from = scale_to = 1.0
    elif _pair_proven(*key, zero_to):
        scale_from, scale_to = source.scale, output.scale
    else:
        lower_quantize(g, operation)
        return
    real = g.one("DequantizeLinear", [source.name, g.constant(np.array(scale_from, np.float32)),
                                      g.constant(np.array(zero_from, np.uint8))])
    g.set_output(operation.outputs[0], g.one("QuantizeLinear", [
        real, g.constant(np.array(scale_to, np.float32)), g.constant(np.array(zero_to, np.uint8))]))


_INTERNAL = np.arange(256, dtype=np.uint8)
_FLOAT = OperandType(T.TENSOR_FLOAT32, [256])


def _reference_dequantize(scale: float, zero_point: int) -> np.ndarray:
    """The reference's DEQUANTIZE (float32) of every internal value of a source of ``scale``
    and internal ``zero_point`` (as uint8: the same real values as its int8 form)."""
    source = Tensor(T.TENSOR_QUANT8_ASYMM, (256,), scale, zero_point, None, _INTERNAL)
    return get_operation(OperationCode.DEQUANTIZE).execute(
        ExecutionContext(OperationCode.DEQUANTIZE, [source], [_FLOAT]))[0]


@functools.cache
def _reference(scale: float, zero_point: int, output_code: int, output_scale: float,
               output_zero_point: int) -> np.ndarray:
    """The reference's DEQUANTIZE then QUANTIZE of every internal value, in the output's
    internal encoding."""
    return _reference_quantize(_reference_dequantize(scale, zero_point), output_code, output_scale,
                               output_zero_point)


def _reference_quantize(real: np.ndarray, output_code: int, output_scale: float,
                        output_zero_point: int) -> np.ndarray:
    """The reference's QUANTIZE of float32 values (a vector), in the output's internal encoding."""
    output = OperandType(output_code, [real.size], output_scale, output_zero_point)
    stored = get_operation(OperationCode.QUANTIZE).execute(ExecutionContext(
        OperationCode.QUANTIZE, [Tensor(T.TENSOR_FLOAT32, (real.size,), 0.0, 0, None, real)], [output]))[0]
    if output_code == T.TENSOR_QUANT8_ASYMM_SIGNED:
        return stored.view(np.uint8) ^ np.uint8(0x80)
    return stored.view(np.uint8)


@functools.cache
def _shift_proven(scale: float, zero_point: int, output_code: int, output_scale: float,
                  output_zero_point: int, internal_output_zero_point: int) -> bool:
    """Whether the reference's result is the shift u - zero_point + the output's internal
    zero point, saturated, on every internal value."""
    shifted = np.clip(_INTERNAL.astype(np.int64) - zero_point + internal_output_zero_point, 0, 255)
    return bool(np.array_equal(_reference(scale, zero_point, output_code, output_scale, output_zero_point), shifted))


@functools.cache
def _pair_proven(scale: float, zero_point: int, output_code: int, output_scale: float,
                 output_zero_point: int, internal_output_zero_point: int) -> bool:
    """Whether ONNX Runtime's DequantizeLinear / QuantizeLinear of the two quantizations
    gives the reference's result on every internal value."""
    initializers = [numpy_helper.from_array(np.array(scale, np.float32), "s"),
                    numpy_helper.from_array(np.array(zero_point, np.uint8), "z"),
                    numpy_helper.from_array(np.array(output_scale, np.float32), "os"),
                    numpy_helper.from_array(np.array(internal_output_zero_point, np.uint8), "oz")]
    graph = helper.make_graph(
        [helper.make_node("DequantizeLinear", ["x", "s", "z"], ["real"]),
         helper.make_node("QuantizeLinear", ["real", "os", "oz"], ["y"])], "probe",
        [helper.make_tensor_value_info("x", TensorProto.UINT8, [256])],
        [helper.make_tensor_value_info("y", TensorProto.UINT8, [256])], initializers)
    try:
        outputs = probe_outputs(graph, {"x": _INTERNAL})
    except ImportError:  # lowering without a runtime: the general lowering
        return False
    if not outputs:  # a runtime that refuses the probe: the general lowering
        return False
    return bool(np.array_equal(outputs[0], _reference(scale, zero_point, output_code, output_scale,
                                                      output_zero_point)))


#: the float32 operations a chain may hold (those of PT2E's SiLU and ReLU, TANH, and those of
#: the importer's GELU: ABS, EXP and the four arithmetic ones): one input, or two (each from
#: the chain or a float32 constant of one element) and a constant fused activation
_CHAIN_UNARY = (OperationCode.LOGISTIC, OperationCode.TANH, OperationCode.RELU, OperationCode.RELU6,
                OperationCode.ABS, OperationCode.EXP)
_CHAIN_BINARY = (OperationCode.MUL, OperationCode.ADD, OperationCode.SUB, OperationCode.DIV)
#: the importer writes GELU's erf form as 21 operations (composites.py)
_CHAIN_OPERATIONS = 24
#: the ONNX operators their lowerings emit (element-wise, scalar constants only), so that the
#: copied nodes compute the same on a probe of 256 values as on the model's tensor
_CHAIN_ONNX = ("DequantizeLinear", "Sigmoid", "Tanh", "Relu", "Clip", "Mul", "Add", "Sub", "Div", "Abs", "Exp",
               "Neg", "Reciprocal")
#: com.microsoft operators the composites emit for a whole chain (composites.py: the GELU
#: as Gelu, a SiLU as QuickGelu); ORT computes each element alone, the same wherever it
#: lies in a tensor (checked: 100,003 values, every shift 1-39 and lengths 1-17, bit for
#: bit), so that 256 values in a probe stand for any tensor
_CHAIN_MS = ("Gelu", "QuickGelu")
_CHAIN_NODES = 16
#: DEQUANTIZEd tensors a chain may read: with two, the probe holds every pair of stored
#: values (65,536), a residual ADD's of two 8-bit tensors
_CHAIN_ROOTS = 2


def _chain_quantize(g: GraphBuilder, operation: Operation, output: Operand) -> bool:
    """Lowers ``operation`` as one QuantizeLinear of its lowered float32 input where that
    input is a proven chain over one or two DEQUANTIZEs (see the module's docstring); False,
    with nothing emitted, otherwise."""
    chain = _float_chain(g, operation.inputs[0])
    if chain is None:
        return False
    roots, operations = chain
    sources = [g.dequantized[root] for root in roots]
    x = g.value(operation.inputs[0])
    nodes = _onnx_chain(g, x.name, {source.name for source in sources})
    if nodes is None:
        return False
    initializers = {t.name: t for t in g.initializers}
    needed = {name for node in nodes for name in node.input if name in initializers}
    scale, zero_point = np.float32(output.scale), internal_zero_point(output)
    size = 256 ** len(roots)
    # the chain's values that the model reads elsewhere are outputs of the probe too, so that
    # ORT fuses (or not: a QDQ fusion needs a value read once) as it does in the model
    read_elsewhere = [g.value(op.outputs[0]).name for op in operations
                      if op.outputs[0] in g.subgraph.output_indexes or
                      any(reader is not operation and reader not in operations for reader in g.readers(op.outputs[0]))]
    probe = helper.make_graph(
        [*nodes, helper.make_node("QuantizeLinear", [x.name, "probe_scale", "probe_zero_point"], ["probe_y"])],
        "probe", [helper.make_tensor_value_info(source.name, TensorProto.UINT8, [size]) for source in sources],
        [helper.make_tensor_value_info("probe_y", TensorProto.UINT8, [size]),
         *(helper.make_tensor_value_info(name, TensorProto.FLOAT, [size]) for name in read_elsewhere)],
        [*(initializers[name] for name in sorted(needed)), numpy_helper.from_array(np.array(scale), "probe_scale"),
         numpy_helper.from_array(np.array(zero_point, np.uint8), "probe_zero_point")])
    expected = _reference_chain(g, roots, operations, output)
    if expected is None:
        return False
    names = tuple(source.name for source in sources)
    if len(roots) == 1 and _swish(g, operation, roots[0], operations, nodes, probe, expected):
        return True
    if not _probe_equals(probe.SerializeToString(), names, expected.tobytes()):
        return False
    g.set_output(operation.outputs[0], g.quantize(x.name, output))
    return True


def _swish(g: GraphBuilder, operation: Operation, root: int, operations: list[Operation],
           nodes: list[onnx.NodeProto], probe: onnx.GraphProto, expected: np.ndarray) -> bool:
    """A SiLU chain (MUL(x, LOGISTIC(x)) lowered as DequantizeLinear, Sigmoid, Mul) whose
    LOGISTIC and MUL nobody else reads, lowered as the dequantized x's QuickGelu (one pass:
    ORT reads the dequantized x once, where the Sigmoid and the Mul each read it, and each
    a DequantizeLinear of its own that ORT's QDQ passes duplicate) then QuantizeLinear, the
    Sigmoid and Mul dropped, where that form too gives ``expected`` on all 256 values."""
    if [node.op_type for node in nodes] != ["DequantizeLinear", "Sigmoid", "Mul"] or \
            [OperationCode(op.type) for op in operations] != [OperationCode.LOGISTIC, OperationCode.MUL]:
        return False
    logistic, mul = operations
    outputs = set(g.subgraph.output_indexes)
    if logistic.inputs[0] != root or sorted(mul.inputs[:2]) != sorted([root, logistic.outputs[0]]) or \
            g.readers(logistic.outputs[0]) != [mul] or g.readers(mul.outputs[0]) != [operation] or \
            outputs & {logistic.outputs[0], mul.outputs[0]}:
        return False
    dequantized = nodes[0].output[0]
    swish = helper.make_node("QuickGelu", [dequantized], [nodes[2].output[0]], domain=MS_DOMAIN, alpha=1.0)
    form = onnx.GraphProto()
    form.CopyFrom(probe)
    del form.node[:]
    form.node.extend([nodes[0], swish, probe.node[-1]])
    if not _probe_equals(form.SerializeToString(), (g.dequantized[root].name,), expected.tobytes()):
        return False
    dropped = {id(node) for node in nodes[1:]}
    g.nodes[:] = [node for node in g.nodes if id(node) not in dropped]
    y = g.one(QUANTIZED_SWISH, [dequantized], MS_DOMAIN, alpha=1.0)
    g.set_output(operation.outputs[0], g.quantize(y, g.operand(operation.outputs[0])))
    return True


def _float_chain(g: GraphBuilder, index: int) -> tuple[list[int], list[Operation]] | None:
    """(roots, operations in the subgraph's order) where float32 operand ``index`` is written
    by at most _CHAIN_OPERATIONS chain operations whose only non-constant inputs are each
    other's outputs and one or two DEQUANTIZE outputs (the roots, in a fixed order) of
    8-bit tensors, all of the same dimensions."""
    operations: dict[int, Operation] = {}
    roots: set[int] = set()
    pending = [index]
    while pending:
        i = pending.pop()
        if i in g.dequantized:
            roots.add(i)
            continue
        producer = g.producer(i)
        if producer is None and _scalar_constant(g, i):
            continue
        if producer is None or g.operand(i).type != T.TENSOR_FLOAT32:
            return None
        if id(producer) in operations:
            continue
        if producer.type in _CHAIN_UNARY and len(producer.inputs) == 1:
            pending.append(producer.inputs[0])
        elif producer.type in _CHAIN_BINARY and len(producer.inputs) == 3 and \
                g.operand(producer.inputs[2]).lifetime in (L.CONSTANT_COPY, L.CONSTANT_REFERENCE):
            pending.extend(producer.inputs[:2])
        else:
            return None
        operations[id(producer)] = producer
        if len(operations) > _CHAIN_OPERATIONS:
            return None
    if not 1 <= len(roots) <= _CHAIN_ROOTS or not operations:
        return None
    ordered = sorted(roots)
    dims = list(g.operand(ordered[0]).dimensions)
    if any(g.operand(root).type != T.TENSOR_FLOAT32 or g.dequantized[root].kind != "uint8" or
           list(g.operand(root).dimensions) != dims for root in ordered) or \
            any(list(g.operand(op.outputs[0]).dimensions) != dims for op in operations.values()):
        return None
    return ordered, [op for op in g.subgraph.operations if id(op) in operations]


def _scalar_constant(g: GraphBuilder, index: int) -> bool:
    """Whether operand ``index`` is a float32 constant of one element (a chain's coefficient)."""
    operand = g.operand(index)
    return operand.type == T.TENSOR_FLOAT32 and operand.lifetime in (L.CONSTANT_COPY, L.CONSTANT_REFERENCE) and \
        int(np.prod(operand.dimensions)) == 1


def _onnx_chain(g: GraphBuilder, name: str, roots: set[str]) -> list[onnx.NodeProto] | None:
    """The nodes emitted so far that compute ``name`` from the 8-bit values ``roots`` (each
    of them) and scalar constants alone, each one of _CHAIN_ONNX, in order; None where there
    are others."""
    producers = {output: node for node in g.nodes for output in node.output}
    initializers = {t.name: t for t in g.initializers}
    needed: dict[int, onnx.NodeProto] = {}
    pending, seen, reached = [name], set(), set()
    while pending:
        n = pending.pop()
        if n in seen:
            continue
        seen.add(n)
        if n in roots:
            reached.add(n)
            continue
        if n in initializers:
            if int(np.prod(initializers[n].dims)) != 1:
                return None
            continue
        node = producers.get(n)
        if node is None or node.op_type not in (_CHAIN_MS if node.domain else _CHAIN_ONNX) or \
                node.domain not in ("", MS_DOMAIN):
            return None
        needed[id(node)] = node
        if len(needed) > _CHAIN_NODES:
            return None
        pending.extend(i for i in node.input if i)
    if reached != roots:
        return None
    return [node for node in g.nodes if id(node) in needed]


def _reference_chain(g: GraphBuilder, roots: list[int], operations: list[Operation],
                     output: Operand) -> np.ndarray | None:
    """The reference's DEQUANTIZEs, chain ``operations`` and QUANTIZE into ``output`` of every
    internal value of the one root's source (or every pair of two roots' values: the first
    root's value varying slowest, as _probe_feeds gives them), in the output's internal
    encoding: its own kernels, so its values exactly (None where one of them refuses)."""
    feeds = _probe_feeds(len(roots))
    values = {root: _reference_dequantize(g.dequantized[root].scale, g.dequantized[root].zero_point)[feed]
              for root, feed in zip(roots, feeds)}
    size = 256 ** len(roots)
    result = OperandType(T.TENSOR_FLOAT32, [size])
    try:
        for op in operations:
            inputs = []
            for i in op.inputs:
                if i in values:
                    inputs.append(Tensor(T.TENSOR_FLOAT32, (size,), 0.0, 0, None, values[i]))
                    continue
                operand = g.operand(i)
                raw = np.asarray(g.raw_constant(i)).reshape(tuple(operand.dimensions))
                inputs.append(Tensor(operand.type, raw.shape, operand.scale, operand.zero_point, None, raw))
            code = OperationCode(op.type)
            values[op.outputs[0]] = get_operation(code).execute(ExecutionContext(code, inputs, [result]))[0]
    except Exception:  # noqa: BLE001 - a chain the reference refuses: the general lowering
        return None
    return _reference_quantize(values[operations[-1].outputs[0]], output.type, output.scale, output.zero_point)


@functools.cache
def _probe_feeds(roots: int) -> tuple[np.ndarray, ...]:
    """The internal values a probe of ``roots`` 8-bit inputs feeds: all 256, or every pair."""
    if roots == 1:
        return (_INTERNAL,)
    return np.repeat(_INTERNAL, 256), np.tile(_INTERNAL, 256)


@functools.lru_cache(maxsize=256)
def _probe_equals(graph: bytes, input_names: tuple[str, ...], expected: bytes) -> bool:
    """Whether ONNX Runtime runs the serialized probe ``graph`` on all internal values of
    its one or two inputs (_probe_feeds) to ``expected``."""
    probe = onnx.GraphProto()
    probe.ParseFromString(graph)
    try:
        outputs = probe_outputs(probe, dict(zip(input_names, _probe_feeds(len(input_names)))))
    except ImportError:  # lowering without a runtime: the general lowering
        return False
    return bool(outputs) and outputs[0].tobytes() == expected
