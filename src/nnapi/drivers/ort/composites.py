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
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from nnapi.codes import FuseCode, OperandCode, OperationCode
from nnapi.hal import Model, OperandLifeTime, Operation, Subgraph
from nnapi.hal.types import constant_array
from nnapi.operations.common import ERFC_A, ERFC_P, GELU_TANH_CUBIC

Op = OperationCode
L = OperandLifeTime
_COMMUTATIVE = (Op.ADD, Op.MUL)
_BINARY = (Op.ADD, Op.MUL, Op.SUB, Op.DIV)

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
    and its input operand; the other operations of each, which lower to nothing."""

    roots: dict[int, tuple[str, int]] = field(default_factory=dict)
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

    def match(self, index: int, pattern) -> bool:
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


def find_composites(model: Model, subgraph: Subgraph) -> Composites:
    """The GELU composites in ``subgraph`` whose inner values nothing else reads."""
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
            found.roots[id(operation)] = (onnx_op, matcher.x)
            found.inner.update(inner)
            break
    return found
