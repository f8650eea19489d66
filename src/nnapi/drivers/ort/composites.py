"""Element-wise composites that stand for one operator NNAPI lacks, recognised in a HAL
subgraph so that the ONNX lowering emits ONNX Runtime's one operator for the whole.

GELU: NNAPI has no ERF, so the TFLite importer writes GELU's erf form as 21 float32
operations (ABS, MUL, ADD, DIV, EXP, RELU, SUB around Abramowitz & Stegun's erfc with its
1.5e-7 bound) and its tanh form as 8 (TensorFlow's own tanh form, with POW(x, 3) for the
cube, arrives as 7). ORT runs each as a pass over the tensor (a tiny
BERT's 128x512 GELU: ~250 us as 21 operators, 39 us as com.microsoft Gelu). Both results
are GELU to float32's precision: the composite is within |x| * 7.5e-8 (A&S's bound, times
|x| / 2) plus a few roundings of GELU itself, ORT's Gelu / FastGelu within a rounding or
two, so they agree far inside the CTS float32 tolerance (1e-5 absolute plus 1e-5 relative;
for |x| > 6 both are below 2e-9 in size). Recognised by structure and by the very
constants the importer writes (operations.common), every intermediate float32, each read
only inside the composite, no fused activation.

Layer normalization over the last axis (Keras' as TFLite writes it; torch's as ai-edge-torch
does: MEANs without their dimensions kept, each per-row value RESHAPEd to [1, rows, 1] where
it meets x, beta a scalar) as ORT's LayerNormalization, the RESHAPEs seen through as views
where every per-row value lines up with x's rows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from nnapi.codes import FuseCode, OperandCode, OperationCode
from nnapi.hal import Model, Operand, OperandLifeTime, Operation, Subgraph
from nnapi.hal.types import constant_array
from nnapi.operand import dtype_of
from nnapi.operations import ExecutionContext, Tensor, get_operation
from nnapi.operations.common import ERFC_A, ERFC_P, GELU_TANH_CUBIC, activation_bounds_quantized
from nnapi.operations.elementwise import all_stored_values
from nnapi.operations.quant_math import dequantize

Op = OperationCode
L = OperandLifeTime
_COMMUTATIVE = (Op.ADD, Op.MUL)
_BINARY = (Op.ADD, Op.MUL, Op.SUB, Op.DIV)
_QUANT8 = (OperandCode.TENSOR_QUANT8_ASYMM, OperandCode.TENSOR_QUANT8_ASYMM_SIGNED)
#: the ONNX operator of a quantized swish (in the com.microsoft domain, attribute alpha 1)
QUANTIZED_SWISH = "QuickGelu"
#: the ONNX (standard domain) operator of a layer normalization; its root's entry holds
#: (gamma, beta, epsilon): float32 arrays of the last axis' length, and a float
LAYER_NORM = "LayerNormalization"

# A pattern is "x" (the composite's input, one operand throughout), a float (a float32
# constant of one element holding that value in float32), or (operation code, pattern...).


def _gelu_erf() -> tuple:
    magnitude = (Op.ABS, "x")
    t = (Op.DIV, 1.0, (Op.ADD, (Op.MUL, magnitude, ERFC_P / np.sqrt(2)), 1.0))
    poly: tuple = (Op.MUL, t, ERFC_A[4])
    for coefficient in reversed(ERFC_A[:4]):
        poly = (Op.MUL, (Op.ADD, poly, coefficient), t)
    erfc = (Op.MUL, poly, (Op.EXP, (Op.MUL, (Op.MUL, "x", "x"), -0.5)))
    return (Op.SUB, (Op.RELU, "x"), (Op.MUL, (Op.MUL, magnitude, erfc), 0.5))


def _gelu_tanh(cube: tuple) -> tuple:
    inner = (Op.MUL, (Op.ADD, (Op.MUL, cube, GELU_TANH_CUBIC), "x"), float(np.sqrt(2 / np.pi)))
    return (Op.MUL, (Op.MUL, "x", 0.5), (Op.ADD, (Op.TANH, inner), 1.0))


#: root operation code -> (ONNX operator in the com.microsoft domain, pattern); the tanh form's
#: cube as the importer writes it (x * x * x) or as TensorFlow's own approximate GELU does
#: (POW(x, 3): transformers' exported encoders)
_COMPOSITES = ((Op.SUB, "Gelu", _gelu_erf()),
               (Op.MUL, "FastGelu", _gelu_tanh((Op.MUL, (Op.MUL, "x", "x"), "x"))),
               (Op.MUL, "FastGelu", _gelu_tanh((Op.POW, "x", 3.0))))


@dataclass
class Composites:
    """What ``find_composites`` found: per root operation (by identity) the ONNX operator
    and its input operand (QUANTIZED_SWISH: computed on the dequantized input, quantized
    into the root's output with its fused activation); the other operations of each,
    which lower to nothing."""

    roots: dict[int, tuple[str, int, tuple]] = field(default_factory=dict)
    inner: set[int] = field(default_factory=set)


class _Matcher:
    def __init__(self, model: Model, subgraph: Subgraph, producers: dict[int, Operation]) -> None:
        self.model = model
        self.subgraph = subgraph
        self.producers = producers
        self.x: int | None = None
        self.matched: dict[int, Operation] = {}

    def float32(self, index: int) -> bool:
        return self.subgraph.operands[index].type == OperandCode.TENSOR_FLOAT32

    def constant(self, index: int, value: float) -> bool:
        operand = self.subgraph.operands[index]
        if operand.lifetime not in (L.CONSTANT_COPY, L.CONSTANT_REFERENCE) or not self.float32(index):
            return False
        array = constant_array(self.model, operand)
        return array.size == 1 and array.reshape(-1)[0] == np.float32(value)

    def match(self, index: int, pattern: str | float | tuple) -> bool:
        if isinstance(pattern, str):
            if self.x is None:
                self.x = index
            return index == self.x and self.float32(index)
        if isinstance(pattern, float):
            return self.constant(index, pattern)
        operation = self.producers.get(index)
        if operation is None or operation.type != pattern[0] or not self.float32(index):
            return False
        code, operands = pattern[0], pattern[1:]
        inputs = list(operation.inputs)
        if code in _BINARY:
            fuse = self.subgraph.operands[inputs[2]]
            if fuse.lifetime not in (L.CONSTANT_COPY, L.CONSTANT_REFERENCE) or \
                    int(constant_array(self.model, fuse).reshape(-1)[0]) != FuseCode.FUSED_NONE:
                return False
            inputs = inputs[:2]
        if len(inputs) != len(operands):
            return False
        orders = [inputs, inputs[::-1]] if code in _COMMUTATIVE else [inputs]
        for order in orders:
            saved_x, saved = self.x, dict(self.matched)
            if all(self.match(i, p) for i, p in zip(order, operands)):
                self.matched[id(operation)] = operation
                return True
            self.x, self.matched = saved_x, saved
        return False


def _reference_swish(model: Model, subgraph: Subgraph, mul: Operation, x: int, gate: int) -> np.ndarray:
    """The reference's MUL(x, LOGISTIC(x)) of every stored value of ``x`` (256 of them,
    ordered by bit pattern): its own operations, so its values exactly."""
    operands = subgraph.operands
    source = operands[x]
    values = all_stored_values(dtype_of(source.type))
    probe = Tensor(source.type, values.shape, source.scale, source.zero_point, None, values)
    logistic = get_operation(Op.LOGISTIC).execute(ExecutionContext(Op.LOGISTIC, [probe], [operands[gate]]))[0]
    sigmoid = Tensor(operands[gate].type, values.shape, operands[gate].scale, operands[gate].zero_point, None,
                     logistic)
    fuse = Tensor(OperandCode.INT32, (), 0.0, 0, None, np.asarray(_fuse_code(model, subgraph, mul), np.int32))
    inputs = [probe, sigmoid] if mul.inputs[0] == x else [sigmoid, probe]
    return get_operation(Op.MUL).execute(ExecutionContext(Op.MUL, [*inputs, fuse], [operands[mul.outputs[0]]]))[0]


def _fuse_code(model: Model, subgraph: Subgraph, operation: Operation) -> int | None:
    """A binary operation's fused activation, None where it is not a constant."""
    fuse = subgraph.operands[operation.inputs[2]]
    if fuse.lifetime not in (L.CONSTANT_COPY, L.CONSTANT_REFERENCE):
        return None
    return int(constant_array(model, fuse).reshape(-1)[0])


def swish_within_a_step(source: Operand, output: Operand, fuse: int, reference: np.ndarray) -> bool:
    """Whether DequantizeLinear, QuickGelu and QuantizeLinear (then the fused clamp) give
    every stored value of ``source`` a result within one step of ``reference`` (the
    pair's, per stored value ordered by bit pattern). ORT computes in float32: the
    dequantized x (one rounding), its logistic (MLAS: within ~2e-7 absolute), the product
    and the division by the scale (a rounding each); the float64 result, widened by 1e-6 of
    |x| and 1e-5 of itself in steps plus 1e-3 of a step, bounds what it can give, and
    rounding is monotone, so checking both ends covers every value in between."""
    stored = all_stored_values(dtype_of(source.type))
    real = dequantize(stored, source.scale, source.zero_point)
    with np.errstate(over="ignore"):
        steps = real / (1.0 + np.exp(-real)) / output.scale
    margin = 1e-3 + 1e-5 * np.abs(steps) + 1e-6 * np.abs(real) / output.scale
    low, high = activation_bounds_quantized(fuse, output)
    expected = reference.astype(np.int64)
    return all(np.all(np.abs(np.clip(np.rint(end) + output.zero_point, low, high) - expected) <= 1)
               for end in (steps - margin, steps + margin))


def _quantized_swish(model: Model, subgraph: Subgraph, mul: Operation, producers: dict[int, Operation],
                     readers: dict[int, list[int]], outputs: set[int]) -> tuple[int, Operation] | None:
    """(x, the LOGISTIC) where ``mul`` is MUL(x, LOGISTIC(x)) on 8-bit values, the
    logistic read by nothing else, whose composite stays within a step of the pair."""
    if mul.type != Op.MUL or len(mul.inputs) != 3:
        return None
    operands = subgraph.operands
    for x, gate in (mul.inputs[:2], mul.inputs[1::-1]):
        logistic = producers.get(gate)
        if logistic is None or logistic.type != Op.LOGISTIC or list(logistic.inputs) != [x] or x == gate:
            continue
        if gate in outputs or readers.get(gate) != [id(mul)]:
            return None
        if any(operands[i].type not in _QUANT8 for i in (x, gate, mul.outputs[0])) or \
                list(operands[x].dimensions) != list(operands[mul.outputs[0]].dimensions):
            return None
        fuse = _fuse_code(model, subgraph, mul)
        if fuse not in (FuseCode.FUSED_NONE, FuseCode.FUSED_RELU, FuseCode.FUSED_RELU1, FuseCode.FUSED_RELU6):
            return None
        reference = _reference_swish(model, subgraph, mul, x, gate)
        if not swish_within_a_step(operands[x], operands[mul.outputs[0]], fuse, reference):
            return None
        return x, logistic
    return None


class _LayerNorm:
    """Matches a layer normalization over the last axis ending at an ADD (see the module's
    docstring): the input, (gamma, beta, epsilon) and the operations."""

    def __init__(self, model: Model, subgraph: Subgraph, producers: dict[int, Operation]) -> None:
        self.model, self.subgraph, self.producers = model, subgraph, producers
        self.matched: list[Operation] = []

    def view(self, index: int) -> int:
        """The operand that ``index`` is a float32 RESHAPE of (through any number of them,
        each recorded as matched), or ``index`` itself: ai-edge-torch's layer norm reduces to
        [rows] (MEAN without its dimensions kept) and RESHAPEs each per-row value to [1,
        rows, 1] where it meets x."""
        while True:
            operation = self.producers.get(index)
            if operation is None or operation.type != Op.RESHAPE or \
                    self.subgraph.operands[index].type != OperandCode.TENSOR_FLOAT32:
                return index
            self.matched.append(operation)
            index = operation.inputs[0]

    def op(self, index: int, code: int) -> Operation | None:
        """The float32 operation ``code`` writing ``index`` (a binary one without a fused
        activation; through RESHAPEs, see ``view``), recorded as matched."""
        index = self.view(index)
        operation = self.producers.get(index)
        if operation is None or operation.type != code or \
                self.subgraph.operands[index].type != OperandCode.TENSOR_FLOAT32:
            return None
        if code in _BINARY and _fuse_code(self.model, self.subgraph, operation) != FuseCode.FUSED_NONE:
            return None
        self.matched.append(operation)
        return operation

    def constant(self, index: int) -> np.ndarray | None:
        operand = self.subgraph.operands[index]
        if operand.lifetime not in (L.CONSTANT_COPY, L.CONSTANT_REFERENCE) or \
                operand.type != OperandCode.TENSOR_FLOAT32:
            return None
        return constant_array(self.model, operand)

    def channel_constant(self, index: int, channels: int) -> np.ndarray | None:
        """A float32 constant of one value or one per channel of the last axis."""
        array = self.constant(index)
        if array is None or array.size not in (1, channels) or any(d != 1 for d in array.shape[:-1]):
            return None
        return np.broadcast_to(array.reshape(-1), (channels,)).astype(np.float32)

    def mean(self, index: int, rank: int) -> int | None:
        """x where ``index`` is MEAN(x) over the last of ``rank`` axes (and axes of size 1),
        dimensions kept or not (_consistent checks where the per-row values meet x)."""
        operation = self.op(index, Op.MEAN)
        if operation is None:
            return None
        axes, keep = (self.subgraph.operands[i] for i in operation.inputs[1:3])
        if any(o.lifetime not in (L.CONSTANT_COPY, L.CONSTANT_REFERENCE) for o in (axes, keep)):
            return None
        dims = self.subgraph.operands[operation.inputs[0]].dimensions
        axes_value = {int(a) % rank for a in constant_array(self.model, axes).reshape(-1)} if rank else set()
        if len(dims) != rank or {a for a in axes_value if dims[a] != 1} != {rank - 1}:
            return None
        return operation.inputs[0]

    def scale(self, index: int, x: int, channels: int) -> tuple[int, np.ndarray, float] | None:
        """(mean, gamma, epsilon) where ``index`` is gamma * RSQRT(MEAN((x - mean)^2) + epsilon)
        (gamma may be absent: ones), mean the MEAN of ``x`` over its last axis."""
        gamma = np.ones(channels, np.float32)
        multiply = self.producers.get(index)
        if multiply is not None and multiply.type == Op.MUL:
            if self.op(index, Op.MUL) is None:
                return None
            for r, g in (multiply.inputs[:2], multiply.inputs[1::-1]):
                found = self.channel_constant(g, channels)
                if found is not None:
                    gamma, index = found, r
                    break
            else:
                return None
        rsqrt = self.op(index, Op.RSQRT)
        add = rsqrt and self.op(rsqrt.inputs[0], Op.ADD)
        if add is None:
            return None
        for position in (0, 1):
            epsilon = self.constant(add.inputs[1 - position])
            if epsilon is not None and epsilon.size == 1:
                variance = add.inputs[position]
                break
        else:
            return None
        squared = self.mean(variance, len(self.subgraph.operands[x].dimensions))
        square = self.op(squared, Op.MUL) if squared is not None else None
        if square is None or square.inputs[0] != square.inputs[1]:
            return None
        difference = self.op(square.inputs[0], Op.SUB)
        rank = len(self.subgraph.operands[x].dimensions)
        if difference is None or difference.inputs[0] != x or self.mean(difference.inputs[1], rank) != x:
            return None
        return self.view(difference.inputs[1]), gamma, float(epsilon.reshape(-1)[0])

    def match(self, root: Operation) -> tuple[int, tuple, list[Operation]] | None:
        operands = self.subgraph.operands
        if root.type != Op.ADD or len(root.outputs) != 1:
            return None
        for product, shift in (root.inputs[:2], root.inputs[1::-1]):
            self.matched = []
            if self.op(root.outputs[0], Op.ADD) is None:
                return None
            multiply = self.op(product, Op.MUL)
            if multiply is None:
                continue
            for x, m in (multiply.inputs[:2], multiply.inputs[1::-1]):
                dims = list(operands[x].dimensions)
                if not dims or not all(dims) or dims != list(operands[root.outputs[0]].dimensions):
                    continue
                saved = list(self.matched)
                found = self.scale(m, x, dims[-1])
                if found is not None:
                    mean, gamma, epsilon = found
                    beta = self.shift(shift, mean, m, dims[-1])
                    if beta is not None and self.consistent(x):
                        return x, (gamma, beta, epsilon), self.matched
                self.matched = saved
        return None

    def consistent(self, x: int) -> bool:
        """Whether every matched value is x-shaped or per-row (rows = x's elements over its
        last axis), each per-row value meeting x shaped as x without its last axis (size 1
        there, leading 1s aside), and per-row values meeting each other of equal shapes or
        as a constant of one element: the rows then line up as LayerNormalization's do,
        however the RESHAPEs between them (``view``) shape them."""
        dims = list(self.subgraph.operands[x].dimensions)
        rows = math.prod(dims[:-1])
        row_shape = [*dims[:-1], 1]
        for operation in self.matched:
            out = list(self.subgraph.operands[operation.outputs[0]].dimensions)
            if operation.type in (Op.MEAN, Op.RESHAPE):
                continue  # MEAN: its axes checked; RESHAPE: its elements in order
            inputs = [list(self.subgraph.operands[i].dimensions) for i in operation.inputs[:2]
                      if self.subgraph.operands[i].lifetime not in (L.CONSTANT_COPY, L.CONSTANT_REFERENCE)]
            if out == dims:
                if any(d != dims and [1] * (len(dims) - len(d)) + d != row_shape for d in inputs):
                    return False
            elif math.prod(out) != rows or any(d != out for d in inputs):
                return False
        return True

    def shift(self, index: int, mean: int, m: int, channels: int) -> np.ndarray | None:
        """beta where ``index`` is NEG(mean) * m (beta zero) or beta - mean * m."""
        index = self.view(index)
        subtract = self.producers.get(index)
        if subtract is not None and subtract.type == Op.SUB:
            if self.op(index, Op.SUB) is None:
                return None
            beta = self.channel_constant(subtract.inputs[0], channels)
            product = self.op(subtract.inputs[1], Op.MUL)
            if beta is None or product is None or \
                    sorted(self.view(i) for i in product.inputs[:2]) != sorted([mean, self.view(m)]):
                return None
            return beta
        product = self.op(index, Op.MUL)
        if product is None:
            return None
        for negated, other in (product.inputs[:2], product.inputs[1::-1]):
            negation = self.producers.get(negated)
            if other == m and negation is not None and negation.type == Op.NEG and negation.inputs[0] == mean:
                self.op(negated, Op.NEG)
                return np.zeros(channels, np.float32)
        return None


def find_composites(model: Model, subgraph: Subgraph) -> Composites:
    """The GELU and quantized swish composites in ``subgraph`` whose inner values nothing
    else reads."""
    producers = {index: operation for operation in subgraph.operations for index in operation.outputs}
    readers: dict[int, list[int]] = {}
    for operation in subgraph.operations:
        for index in operation.inputs:
            readers.setdefault(index, []).append(id(operation))
    outputs = set(subgraph.output_indexes)
    found = Composites()
    for operation in subgraph.operations:
        if id(operation) in found.inner or len(operation.outputs) != 1:
            continue
        swish = _quantized_swish(model, subgraph, operation, producers, readers, outputs)
        if swish is not None:
            found.roots[id(operation)] = (QUANTIZED_SWISH, swish[0], ())
            found.inner.add(id(swish[1]))
            continue
        norm = _LayerNorm(model, subgraph, producers).match(operation)
        if norm is not None:
            x, parameters, matched = norm
            inner = {id(op) for op in matched if op is not operation}
            if not any(index in outputs or any(reader not in inner | {id(operation)} for reader in readers[index])
                       for op in matched if op is not operation for index in op.outputs) and \
                    not inner & found.inner:
                found.roots[id(operation)] = (LAYER_NORM, x, parameters)
                found.inner.update(inner)
                continue
        for code, onnx_op, pattern in _COMPOSITES:
            if operation.type != code:
                continue
            matcher = _Matcher(model, subgraph, producers)
            if not matcher.match(operation.outputs[0], pattern):
                continue
            inner = {key: op for key, op in matcher.matched.items() if key != id(operation)}
            if any(index in outputs or any(reader not in matcher.matched for reader in readers.get(index, []))
                   for op in inner.values() for index in op.outputs) or inner.keys() & found.inner:
                continue
            found.roots[id(operation)] = (onnx_op, matcher.x, ())
            found.inner.update(inner)
            break
    return found
