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
Constants may also be per channel (a batch norm PT2E leaves in float after a residual ADD
or a pool, a layer scale): broadcast along some axes of the chain's tensor, each element
is a function of its stored value(s) and its coordinates along those axes alone, so the
probe keeps those axes at the model's extent and lays the 256 stored values (65,536 pairs)
along another: every channel's every value, up to 2**20 values (_PROBE_VALUES; 0.03 s at
preparation for 11 operations over 4,096 channels). A per-channel MUL of a blocked 4-D
value, a 1x1 depthwise Conv between Transposes (builder.channel_scale), is copied into
the probe as emitted. Proofs are cached by the digests of the probe graph and of the
reference chain (quantizations, operations, constants' bytes).
A chain that the probe refutes goes to quantization.py, which takes one QuantizeLinear
after a function ORT approximates otherwise (LOGISTIC, TANH, EXP: within a step, as the
general rounding of ORT's value was). Where the probe holds every value the model can
(one or two roots, within the bound), that rounding is probed too (quantize_half_away's
nodes in place of the QuantizeLinear): where it gives the reference's result on every
value, it stays, so that only a general rounding that is not the reference's bit for bit
gives way. Chains past the bound, or over three roots, are not probed: quantization.py's
rule alone decides.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from nnapi.codes import OperandCode, OperationCode
from nnapi.drivers.ort.builder import (
    MS_DOMAIN,
    NCHW_TO_NHWC,
    NHWC_TO_NCHW,
    QUANT8,
    GraphBuilder,
    internal_zero_point,
    lowers,
    probe_form,
)
from nnapi.drivers.ort.composites import QUANTIZED_SWISH
from nnapi.drivers.ort.lookups import quantized_lookup, reference_quantize
from nnapi.drivers.ort.quantization import approximated, lower_quantize, quantize_half_away
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
    if source is None and output.type in QUANT8:
        if _chain_quantize(g, operation, output) or quantized_lookup(g, operation):
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
    return reference_quantize(_reference_dequantize(scale, zero_point),
                              OperandType(output_code, [256], output_scale, output_zero_point))


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
    outputs = probe_form([helper.make_node("DequantizeLinear", ["x", "s", "z"], ["real"]),
                          helper.make_node("QuantizeLinear", ["real", "os", "oz"], ["y"])],
                         initializers, {"x": _INTERNAL}, [("y", TensorProto.UINT8, [256])])
    if not outputs:  # a runtime that refuses the probe, or none: the general lowering
        return False
    return bool(np.array_equal(outputs[0], _reference(scale, zero_point, output_code, output_scale,
                                                      output_zero_point)))


#: the float32 operations a chain may hold (those of PT2E's SiLU and ReLU, TANH, and those of
#: the importer's GELU: ABS, EXP and the four arithmetic ones): one input, or two (each from
#: the chain or a float32 constant: of one element, or per channel, see _ChainShape) and a
#: constant fused activation
_CHAIN_UNARY = (OperationCode.LOGISTIC, OperationCode.TANH, OperationCode.RELU, OperationCode.RELU6,
                OperationCode.ABS, OperationCode.EXP)
_CHAIN_BINARY = (OperationCode.MUL, OperationCode.ADD, OperationCode.SUB, OperationCode.DIV)
#: the importer writes GELU's erf form as 21 operations (composites.py)
_CHAIN_OPERATIONS = 24
#: the ONNX operators their lowerings emit (element-wise; constants broadcast as the model's
#: do, see _ChainShape), so that the copied nodes compute the same on the probe as on the
#: model's tensor
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
#: the most values a probe holds: 256 (or 65,536 pairs) times the channels of per-channel
#: constants (4,096 channels, or 16 for two roots). Measured at preparation (load ~3), 11
#: operations per channel over 256 stored values: 0.03 s for 4,096 channels (2**20 values:
#: the reference's kernels and one ORT run over 4 MB of float32 per value), 0.24-0.49 s for
#: 8,192 (2**21, past the bound); once per chain, quantizations and constants (_PROVEN)
_PROBE_VALUES = 2 ** 20


class _ChainShape:
    """Where a chain's probe puts its values. A chain whose constants have one element each
    is probed on a vector of every stored value (every pair for two roots): ``dims`` is
    None. One whose constants broadcast along some axes of the chain's tensor (a per-channel
    MUL / ADD: a batch norm PT2E left in float, a layer scale) is, per element, a function of
    the stored value(s) and the element's coordinates along those axes alone: its probe keeps
    the tensor's rank, those axes at full length (``channels``: the model's extent there, 1
    elsewhere) and the stored values along the first other axis (``axis``), so that every
    constant broadcasts over it exactly as over the model's tensor and every element of the
    model has one in the probe with the same stored value(s) and the same constants."""

    def __init__(self, channels: list[int] | None = None, axis: int = 0) -> None:
        self.channels = channels
        self.axis = axis

    def probe_dims(self, size: int) -> list[int]:
        """The probe's dimensions for ``size`` stored values (or pairs)."""
        if self.channels is None:
            return [size]
        dims = list(self.channels)
        dims[self.axis] = size
        return dims

    def spread(self, values: np.ndarray) -> np.ndarray:
        """``values`` (one per stored value or pair) laid along the probe's stored axis and
        repeated over its channels, C-contiguous."""
        if self.channels is None:
            return values
        shape = [1] * len(self.channels)
        shape[self.axis] = values.size
        return np.ascontiguousarray(np.broadcast_to(values.reshape(shape), self.probe_dims(values.size)))

    def fits(self, dims: Sequence[int]) -> bool:
        """Whether a constant of ``dims`` broadcasts over the probe as over the model: one
        element, or (per channel) at most the chain's rank, each extent 1 or the probe's
        channel extent on that axis."""
        if int(np.prod(dims)) == 1:
            return True
        if self.channels is None or len(dims) > len(self.channels):
            return False
        return all(d == 1 or d == c for d, c in zip(dims, self.channels[len(self.channels) - len(dims):]))


def _chain_shape(dims: list[int], constants: list[list[int]]) -> _ChainShape | None:
    """The probe layout of a chain over a tensor of ``dims`` reading constants of the given
    dimensions: scalar for constants of one element; per channel where each broadcasts along
    axes of ``dims`` (right-aligned) and one axis varies in none of them; None otherwise."""
    wide = [c for c in constants if int(np.prod(c)) > 1]
    if not wide:
        return _ChainShape()
    rank = len(dims)
    if any(len(c) > rank for c in wide):
        return None
    varying = set()
    for c in wide:
        for axis, extent in zip(range(rank - len(c), rank), c):
            if extent != 1:
                if extent != dims[axis]:
                    return None
                varying.add(axis)
    free = [axis for axis in range(rank) if axis not in varying]
    if not free:
        return None
    return _ChainShape([dims[axis] if axis in varying else 1 for axis in range(rank)], free[0])


def _chain_quantize(g: GraphBuilder, operation: Operation, output: Operand) -> bool:
    """Lowers ``operation`` as one QuantizeLinear of its lowered float32 input where that
    input is a proven chain over one or two DEQUANTIZEs (see the module's docstring), or
    as the general rounding where the probe refutes that but proves the general rounding
    (which quantization.py would otherwise give up for one QuantizeLinear); True then.
    False, with nothing emitted, otherwise."""
    chain = _float_chain(g, operation.inputs[0])
    if chain is None:
        return False
    roots, operations, shape = chain
    sources = [g.dequantized[root] for root in roots]
    size = 256 ** len(roots)
    if size * int(np.prod(shape.probe_dims(1))) > _PROBE_VALUES:
        return False
    x = g.value(operation.inputs[0])
    nodes = _onnx_chain(g, x.name, {source.name for source in sources}, shape)
    if nodes is None:
        return False
    initializers = g.initializer_index().by_key
    needed = {name for node in nodes for name in node.input if name in initializers}
    scale, zero_point = np.float32(output.scale), internal_zero_point(output)
    dims = shape.probe_dims(size)
    # the chain's values that the model reads elsewhere are outputs of the probe too, so that
    # ORT fuses (or not: a QDQ fusion needs a value read once) as it does in the model
    read_elsewhere = [g.value(op.outputs[0]).name for op in operations
                      if op.outputs[0] in g.subgraph.output_indexes or
                      any(reader is not operation and reader not in operations for reader in g.readers(op.outputs[0]))]
    probe = _Probe(
        [*nodes, helper.make_node("QuantizeLinear", [x.name, "probe_scale", "probe_zero_point"], ["probe_y"])],
        [*(initializers[name] for name in sorted(needed)), numpy_helper.from_array(np.array(scale), "probe_scale"),
         numpy_helper.from_array(np.array(zero_point, np.uint8), "probe_zero_point")],
        [("probe_y", TensorProto.UINT8, dims), *((name, TensorProto.FLOAT, dims) for name in read_elsewhere)])
    names = tuple(source.name for source in sources)
    reference = _ReferenceChain(g, roots, operations, output, shape)
    if len(roots) == 1 and shape.channels is None and \
            _swish(g, operation, roots[0], operations, nodes, probe, reference):
        return True
    if not _proven(probe, names, shape, reference):
        # refuted: quantization.py takes one QuantizeLinear after a function ORT approximates
        # otherwise (within a step: the general rounding of ORT's value was only that), but
        # where the probe shows the general rounding equal to the reference on every value
        # the model can hold, the general rounding stays (computed_otherwise of the chain's
        # value: a walk back through these very operations, element-wise, to the DEQUANTIZEs)
        if approximated(operations) and _general_exact(g, probe, names, shape, reference, output):
            g.set_output(operation.outputs[0], quantize_half_away(g, x.name, output))
            return True
        return False
    g.set_output(operation.outputs[0], g.quantize(x.name, output))
    return True


def _general_exact(g: GraphBuilder, probe: _Probe, input_names: tuple[str, ...], shape: _ChainShape,
                   reference: _ReferenceChain, output: Operand) -> bool:
    """Whether the general rounding (quantization.quantize_half_away, emitted into a scratch
    builder) of ``probe``'s float value gives the reference's result on every probed value:
    the probe with its QuantizeLinear replaced by those nodes."""
    quantize = probe.nodes[-1]
    scratch = GraphBuilder(g.model, g.subgraph)
    scratch.prefix = "probe_general_"
    rounded = quantize_half_away(scratch, quantize.input[0], output)
    form = _Probe([*probe.nodes[:-1], *scratch.nodes, helper.make_node("Identity", [rounded], [quantize.output[0]])],
                  [*probe.initializers, *scratch.initializers], probe.outputs)
    return _proven(form, input_names, shape, reference)


def _swish(g: GraphBuilder, operation: Operation, root: int, operations: list[Operation],
           nodes: list[onnx.NodeProto], probe: _Probe, reference: _ReferenceChain) -> bool:
    """A SiLU chain (MUL(x, LOGISTIC(x)) lowered as DequantizeLinear, Sigmoid, Mul) whose
    LOGISTIC and MUL nobody else reads, lowered as the dequantized x's QuickGelu (one pass:
    ORT reads the dequantized x once, where the Sigmoid and the Mul each read it, and each
    a DequantizeLinear of its own that ORT's QDQ passes duplicate) then QuantizeLinear, the
    Sigmoid and Mul dropped, where that form too gives the reference's result on all 256
    values."""
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
    form = _Probe([nodes[0], swish, probe.nodes[-1]], probe.initializers, probe.outputs)
    if not _proven(form, (g.dequantized[root].name,), _ChainShape(), reference):
        return False
    dropped = {id(node) for node in nodes[1:]}
    g.nodes[:] = [node for node in g.nodes if id(node) not in dropped]
    y = g.one(QUANTIZED_SWISH, [dequantized], MS_DOMAIN, alpha=1.0)
    g.set_output(operation.outputs[0], g.quantize(y, g.operand(operation.outputs[0])))
    return True


def _float_chain(g: GraphBuilder, index: int) -> tuple[list[int], list[Operation], _ChainShape] | None:
    """(roots, operations in the subgraph's order, the probe's layout) where float32 operand
    ``index`` is written by at most _CHAIN_OPERATIONS chain operations whose only
    non-constant inputs are each other's outputs and one or two DEQUANTIZE outputs (the
    roots, in a fixed order) of 8-bit tensors, all of the same dimensions, and whose
    constants have one element or broadcast per channel (_chain_shape)."""
    operations: dict[int, Operation] = {}
    roots: set[int] = set()
    constants: list[list[int]] = []
    pending = [index]
    while pending:
        i = pending.pop()
        if i in g.dequantized:
            roots.add(i)
            continue
        producer = g.producer(i)
        if producer is None and _float_constant(g, i):
            constants.append(list(g.operand(i).dimensions))
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
    shape = _chain_shape(dims, constants)  # (a free dimension, 0, only where no constant varies)
    if shape is None:
        return None
    return ordered, sorted(operations.values(), key=g.position), shape


def _float_constant(g: GraphBuilder, index: int) -> bool:
    """Whether operand ``index`` is a float32 constant of known dimensions (a chain's
    coefficient: one element, or one per channel)."""
    operand = g.operand(index)
    return operand.type == T.TENSOR_FLOAT32 and operand.lifetime in (L.CONSTANT_COPY, L.CONSTANT_REFERENCE) and \
        all(operand.dimensions)


def _onnx_chain(g: GraphBuilder, name: str, roots: set[str], shape: _ChainShape) -> list[onnx.NodeProto] | None:
    """The nodes emitted so far that compute ``name`` from the 8-bit values ``roots`` (each
    of them) and constants that broadcast over the probe as over the model (``shape.fits``)
    alone, each one of _CHAIN_ONNX or a per-channel scale (_channel_scales), in order; None
    where there are others."""
    index = g.node_index()  # (read only here: nothing is emitted until the nodes are returned)
    producers = index.by_key
    initializers = g.initializer_index().by_key
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
            continue
        node = producers.get(n)
        if node is None or node.op_type not in (_CHAIN_MS if node.domain else _CHAIN_ONNX + _CHANNEL_SCALE) or \
                node.domain not in ("", MS_DOMAIN):
            return None
        needed[id(node)] = node
        if len(needed) > _CHAIN_NODES:
            return None
        pending.extend(i for i in node.input if i)
    if reached != roots:
        return None
    nodes = sorted(needed.values(), key=lambda node: index.position[id(node)])
    weights = _channel_scales(nodes, initializers, shape)
    if weights is None:
        return None
    if any(i in initializers and i not in weights and not shape.fits(list(initializers[i].dims))
           for node in nodes for i in node.input):
        return None
    return nodes


#: the nodes of builder.channel_scale (a float MUL by a per-channel constant of a 4-D value
#: ORT holds blocked: Transpose to NCHW, a 1x1 depthwise Conv, Transpose back), which
#: computes x * w[c] per element, one rounded product as Mul
_CHANNEL_SCALE = ("Transpose", "Conv")


def _channel_scales(nodes: list[onnx.NodeProto], initializers: dict[str, onnx.TensorProto],
                    shape: _ChainShape) -> set[str] | None:
    """The weights of the per-channel scales among ``nodes`` (an empty set where there are
    none), or None where a Transpose or Conv among them is not one: each Conv a 1x1
    depthwise one without bias (no other attribute than group and kernel_shape) whose
    [C, 1, 1, 1] weights scale the probe's last axis, C = its channel extent, reading a
    Transpose to NCHW of an NHWC value and read only by Transposes back; each Transpose
    one of those. Between the Transposes the values are NCHW and no other node reads
    them, so the other nodes' constants broadcast over NHWC values only."""
    producers = {output: node for node in nodes for output in node.output}
    readers: dict[str, list[onnx.NodeProto]] = {}
    for node in nodes:
        for i in node.input:
            readers.setdefault(i, []).append(node)
    weights: set[str] = set()
    for node in nodes:
        if node.op_type == "Conv":
            attributes = {a.name: helper.get_attribute_value(a) for a in node.attribute}
            channels = shape.channels
            if channels is None or len(channels) != 4 or shape.axis == 3 or len(node.input) != 2 or \
                    set(attributes) != {"group", "kernel_shape"} or list(attributes["kernel_shape"]) != [1, 1] or \
                    attributes["group"] != channels[3] or node.input[1] not in initializers or \
                    list(initializers[node.input[1]].dims) != [channels[3], 1, 1, 1]:
                return None
            source = producers.get(node.input[0])
            if source is None or not _transpose(source, NHWC_TO_NCHW) or \
                    not all(_transpose(reader, NCHW_TO_NHWC) for reader in readers.get(node.output[0], [])):
                return None
            weights.add(node.input[1])
        elif node.op_type == "Transpose":
            if _transpose(node, NHWC_TO_NCHW):
                if not readers.get(node.output[0]) or any(r.op_type != "Conv" for r in readers[node.output[0]]) or \
                        (node.input[0] in producers and producers[node.input[0]].op_type == "Conv"):
                    return None
            elif not _transpose(node, NCHW_TO_NHWC) or node.input[0] not in producers or \
                    producers[node.input[0]].op_type != "Conv":
                return None
    return weights


def _transpose(node: onnx.NodeProto, perm: list[int]) -> bool:
    """Whether ``node`` is a Transpose by ``perm``."""
    return node.op_type == "Transpose" and [list(helper.get_attribute_value(a)) for a in node.attribute
                                            if a.name == "perm"] == [perm]


class _ReferenceChain:
    """The reference's DEQUANTIZEs, chain operations and QUANTIZE into the output of every
    internal value of the one root's source (or every pair of two roots' values: the first
    root's value varying slowest, as _probe_feeds gives them), laid out as the probe's
    values (_ChainShape), in the output's internal encoding: its own kernels, so its values
    exactly. ``key`` digests everything they depend on; ``expected`` runs them once (None
    where one of them refuses)."""

    def __init__(self, g: GraphBuilder, roots: list[int], operations: list[Operation], output: Operand,
                 shape: _ChainShape) -> None:
        self.roots = roots
        self.operations = operations
        self.output = output
        self.shape = shape
        self.g = g
        self._expected: np.ndarray | None = None
        self._ran = False
        digest = hashlib.sha256()
        position = {root: f"r{n}" for n, root in enumerate(roots)}
        for n, op in enumerate(operations):
            position[op.outputs[0]] = f"o{n}"
        for root in roots:
            digest.update(repr((g.dequantized[root].scale, g.dequantized[root].zero_point)).encode())
        for op in operations:
            digest.update(repr((int(op.type), [position.get(i) for i in op.inputs])).encode())
            for i in op.inputs:
                if i not in position:
                    operand = g.operand(i)
                    digest.update(repr((int(operand.type), list(operand.dimensions))).encode())
                    digest.update(np.ascontiguousarray(g.raw_constant(i)).tobytes())
        digest.update(repr((int(output.type), float(output.scale), int(output.zero_point), shape.channels,
                            shape.axis)).encode())
        self.key = digest.digest()

    def expected(self) -> np.ndarray | None:
        if not self._ran:
            self._ran = True
            self._expected = self._run()
        return self._expected

    def _run(self) -> np.ndarray | None:
        g, shape = self.g, self.shape
        feeds = _probe_feeds(len(self.roots))
        size = 256 ** len(self.roots)
        dims = tuple(shape.probe_dims(size))
        values = {root: shape.spread(_reference_dequantize(g.dequantized[root].scale,
                                                           g.dequantized[root].zero_point)[feed])
                  for root, feed in zip(self.roots, feeds)}
        result = OperandType(T.TENSOR_FLOAT32, list(dims))
        try:
            for op in self.operations:
                inputs = []
                for i in op.inputs:
                    if i in values:
                        inputs.append(Tensor(T.TENSOR_FLOAT32, dims, 0.0, 0, None, values[i]))
                        continue
                    operand = g.operand(i)
                    raw = np.asarray(g.raw_constant(i)).reshape(tuple(operand.dimensions))
                    inputs.append(Tensor(operand.type, raw.shape, operand.scale, operand.zero_point, None, raw))
                code = OperationCode(op.type)
                values[op.outputs[0]] = get_operation(code).execute(ExecutionContext(code, inputs, [result]))[0]
        except Exception:  # noqa: BLE001 - a chain the reference refuses: the general lowering
            return None
        output = self.output
        return reference_quantize(np.asarray(values[self.operations[-1].outputs[0]], np.float32).reshape(-1), output)


class _Probe(NamedTuple):
    """A chain's probe as builder.probe_form takes it (its feeds aside): the nodes, the
    initializers they read, the outputs (the quantized result first, then the chain's
    values the model reads elsewhere)."""

    nodes: list[onnx.NodeProto]
    initializers: list[onnx.TensorProto]
    outputs: list[tuple[str, int, list[int]]]

    def digest(self) -> bytes:
        """A digest of everything the probe holds (_PROVEN's key, with the feeds' names and
        the reference chain's)."""
        digest = hashlib.sha256(repr(self.outputs).encode())
        for item in (*self.nodes, *self.initializers):
            serialized = item.SerializeToString()
            digest.update(len(serialized).to_bytes(8, "little") + serialized)
        return digest.digest()


@functools.cache
def _probe_feeds(roots: int) -> tuple[np.ndarray, ...]:
    """The internal values a probe of ``roots`` 8-bit inputs feeds: all 256, or every pair."""
    if roots == 1:
        return (_INTERNAL,)
    return np.repeat(_INTERNAL, 256), np.tile(_INTERNAL, 256)


#: proofs already made (the probe graph's and the reference chain's digests): a model
#: prepared again, or a chain repeated with the same quantizations and constants, probes once
_PROVEN: dict[bytes, bool] = {}
_PROVEN_LIMIT = 4096


def _proven(probe: _Probe, input_names: tuple[str, ...], shape: _ChainShape, reference: _ReferenceChain) -> bool:
    """Whether ONNX Runtime runs ``probe`` on all internal values of its one or two inputs
    (_probe_feeds, laid out by ``shape``) to the reference's result, bit for bit."""
    key = hashlib.sha256(probe.digest() + repr(input_names).encode() + reference.key).digest()
    if key in _PROVEN:
        return _PROVEN[key]
    expected = reference.expected()
    proven = False
    if expected is not None:
        feeds = {name: shape.spread(feed) for name, feed in zip(input_names, _probe_feeds(len(input_names)))}
        outputs = probe_form(probe.nodes, probe.initializers, feeds, probe.outputs)  # (None: the general lowering)
        proven = bool(outputs) and outputs[0].tobytes() == expected.tobytes()
    if len(_PROVEN) >= _PROVEN_LIMIT:
        _PROVEN.clear()
    _PROVEN[key] = proven
    return proven
