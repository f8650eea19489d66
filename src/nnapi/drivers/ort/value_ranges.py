"""Bounds of the int32, float32 and boolean values a subgraph computes from the few facts
preparation knows: its constants and the indices ARGMAX / ARGMIN give (0 to the reduced
axis's size - 1). A keypoint or detection model's decode head (a heatmap's ARGMAX, its row
and column as index // width and index - row * width, scaled, floored, clamped, cast back,
bounds-checked before a GATHER: TensorFlow's gather_nd writes the checks LESS /
GREATER_EQUAL / LOGICAL_OR / SELECT into the model) lowers through these: a comparison the
bounds decide is a constant, a LOGICAL_AND / OR / NOT of decided values too, a SELECT of a
decided condition its picked input, a CAST of a float whose bounds lie inside int32 one
Cast (no saturation or NaN guard), an int32 DIV of a non-negative value by a positive one
one truncating Div (floor division then truncates). MoveNet's head is ~160 ONNX nodes of
a few values each, ~0.4 us apiece.

Bounds are per element for tensors of known shape up to SMALL elements (a decode head
packs a constant batch index beside a row and a column: each column keeps its own), one
pair for the whole tensor otherwise. They are sound for every input: each operation's
bounds are computed in its own arithmetic from its inputs' (float32 rounding is monotone,
so the rounded results at the corners bound the rounded results inside; an int32 result
that could leave int32, a float one that could overflow or divide by a range holding 0,
and every other operation are unknown); the moves (RESHAPE, SLICE, PACK, ...) are the
reference's own operations run on the low and the high bounds; x - (x // c) * c, the floor
remainder TensorFlow's FLOOR_MOD imports as, is within [0, c - 1] for a positive constant
c. A float bound never holds NaN: only values bounded from constants without NaN and from
integers are known.
"""

from __future__ import annotations

import numpy as np

from nnapi.codes import FuseCode, OperandCode, OperationCode
from nnapi.hal import Model, Operand, OperandLifeTime, Operation, Subgraph
from nnapi.hal.types import constant_array
from nnapi.operations import ExecutionContext, Tensor, get_operation

Op = OperationCode
T = OperandCode

#: bounds (low, high), inclusive, numpy arrays broadcastable to the operand's shape: int64
#: for int32 and booleans (0 / 1), float32 for float32
Bounds = tuple[np.ndarray, np.ndarray]

#: tensors of up to this many elements (of known shape) keep bounds per element
SMALL = 1024

_INT32 = (-(2 ** 31), 2 ** 31 - 1)
_CONSTANT = (OperandLifeTime.CONSTANT_COPY, OperandLifeTime.CONSTANT_REFERENCE)
_FLOAT_TYPES = (T.TENSOR_FLOAT32, T.FLOAT32)
_INTEGER_TYPES = (T.TENSOR_INT32, T.INT32, T.TENSOR_BOOL8, T.BOOL)
_BOUNDED_TYPES = (*_FLOAT_TYPES, *_INTEGER_TYPES)
#: moves: their data inputs (positions; None: all but the last), run on the bounds by the
#: reference's own operation, the other inputs constant parameters
_MOVES = {Op.RESHAPE: (0,), Op.SQUEEZE: (0,), Op.EXPAND_DIMS: (0,), Op.STRIDED_SLICE: (0,), Op.SLICE: (0,),
          Op.TRANSPOSE: (0,), Op.TILE: (0,), Op.REDUCE_MAX: (0,), Op.REDUCE_MIN: (0,), Op.GATHER: (0,),
          Op.CONCATENATION: None, Op.PACK: ()}
_COMPARISONS = (Op.LESS, Op.LESS_EQUAL, Op.GREATER, Op.GREATER_EQUAL, Op.EQUAL, Op.NOT_EQUAL)
_ARITHMETIC = {Op.ADD: np.add, Op.SUB: np.subtract, Op.MUL: np.multiply}


def operand_ranges(model: Model, subgraph: Subgraph) -> dict[int, Bounds]:
    """The bounds of each operand of ``subgraph`` that follow from its constants and
    ARGMAX / ARGMIN (operands without known bounds are absent)."""
    return _Ranges(model, subgraph).bounds


def decided(bounds: Bounds | None) -> np.ndarray | None:
    """The one value every element of a boolean operand takes, as a bool array
    broadcastable to its shape, or None where the bounds leave any element open."""
    if bounds is None or not np.array_equal(bounds[0], bounds[1]):
        return None
    return bounds[0].astype(bool)


def _small(operand: Operand) -> bool:
    return all(operand.dimensions) and int(np.prod(operand.dimensions, dtype=np.int64)) <= SMALL


class _Ranges:
    def __init__(self, model: Model, subgraph: Subgraph) -> None:
        self.model, self.subgraph, self.operands = model, subgraph, subgraph.operands
        self.bounds: dict[int, Bounds] = {}
        self.producers: dict[int, Operation] = {}
        for index, operand in enumerate(self.operands):
            if operand.type in _BOUNDED_TYPES and operand.lifetime in _CONSTANT:
                array = constant_array(model, operand)
                if array.size and (operand.type in _INTEGER_TYPES or np.all(np.isfinite(array))):
                    value = self._typed(array, operand.type)
                    self.bounds[index] = (value, value)
        for operation in subgraph.operations:
            for output in operation.outputs:
                self.producers[output] = operation
            if operation.type == Op.TOPK_V2 and len(operation.outputs) == 2:
                # its indices: positions along the input's last axis
                dims = self.operands[operation.inputs[0]].dimensions
                if dims and dims[-1]:
                    self.bounds[operation.outputs[1]] = self._fitted((np.asarray(0), np.asarray(dims[-1] - 1)),
                                                                     self.operands[operation.outputs[1]])
            if len(operation.outputs) != 1 or self.operands[operation.outputs[0]].type not in _BOUNDED_TYPES:
                continue
            try:
                known = self._operation(operation)
            except Exception:  # noqa: BLE001  (a malformed operation: its lowering or validation says so)
                known = None
            if known is not None:
                self.bounds[operation.outputs[0]] = self._fitted(known, self.operands[operation.outputs[0]])

    @staticmethod
    def _typed(array: np.ndarray, code: int) -> np.ndarray:
        return np.asarray(array, np.int64 if code in _INTEGER_TYPES else np.float32)

    @staticmethod
    def _fitted(known: Bounds, operand: Operand) -> Bounds:
        """Per element for a small operand; else one pair (the loosest) for the whole."""
        low, high = known
        if _small(operand):
            try:
                return np.broadcast_to(low, operand.dimensions).copy(), np.broadcast_to(high, operand.dimensions).copy()
            except ValueError:
                pass
        return np.asarray(low.min()), np.asarray(high.max())

    def _constant(self, index: int) -> np.ndarray | None:
        operand = self.operands[index]
        return constant_array(self.model, operand) if operand.lifetime in _CONSTANT else None

    def _operation(self, operation: Operation) -> Bounds | None:
        code, inputs = operation.type, operation.inputs
        output = self.operands[operation.outputs[0]]
        integer = output.type in _INTEGER_TYPES
        known = [self.bounds.get(i) for i in inputs]
        if code in (Op.ARGMAX, Op.ARGMIN):
            dims, axis = self.operands[inputs[0]].dimensions, self._constant(inputs[1])
            if axis is None or axis.size != 1 or not dims or not dims[int(axis.reshape(-1)[0]) % len(dims)]:
                return None
            return np.asarray(0), np.asarray(dims[int(axis.reshape(-1)[0]) % len(dims)] - 1)
        if code in _MOVES:
            return self._move(operation, known)
        if code == Op.CAST:
            return self._cast(known[0], self.operands[inputs[0]].type, output.type)
        if any(self.operands[i].type not in _BOUNDED_TYPES for i in inputs[:2]):
            return None
        if code == Op.SELECT:
            condition, first, second = known[:3]
            if condition is None or first is None or second is None:
                return None
            open_ = condition[0] != condition[1]
            pick_low = np.where(condition[0].astype(bool), first[0], second[0])
            pick_high = np.where(condition[0].astype(bool), first[1], second[1])
            return (np.where(open_, np.minimum(first[0], second[0]), pick_low),
                    np.where(open_, np.maximum(first[1], second[1]), pick_high))
        if code in (Op.FLOOR, Op.NEG, Op.ABS) and not integer and known[0] is not None:
            low, high = known[0]
            if code == Op.FLOOR:
                return np.floor(low), np.floor(high)
            if code == Op.NEG:
                return -high, -low
            return (np.where((low <= 0) & (high >= 0), np.float32(0), np.minimum(abs(low), abs(high))),
                    np.maximum(abs(low), abs(high)))
        if code in (Op.MINIMUM, Op.MAXIMUM) and known[0] is not None and known[1] is not None:
            pick = np.minimum if code == Op.MINIMUM else np.maximum
            return pick(known[0][0], known[1][0]), pick(known[0][1], known[1][1])
        if code in (*_ARITHMETIC, Op.DIV):
            return self._arithmetic(operation, known[0], known[1], integer)
        if code in _COMPARISONS:
            if known[0] is None or known[1] is None or (self.operands[inputs[0]].type in _INTEGER_TYPES) != (
                    self.operands[inputs[1]].type in _INTEGER_TYPES):
                return None
            return _compare(code, known[0], known[1])
        if code in (Op.LOGICAL_AND, Op.LOGICAL_OR, Op.LOGICAL_NOT) and all(b is not None for b in known):
            if code == Op.LOGICAL_NOT:
                return 1 - known[0][1], 1 - known[0][0]
            pick = np.minimum if code == Op.LOGICAL_AND else np.maximum  # AND / OR of 0 / 1 bounds
            return pick(known[0][0], known[1][0]), pick(known[0][1], known[1][1])
        return None

    def _move(self, operation: Operation, known: list[Bounds | None]) -> Bounds | None:
        """A move's bounds: the reference's operation on each bound where every data input's
        bounds are per element; else the data inputs' union (every output value is one of
        theirs). None where a parameter is given at run time (GATHER's indices, SLICE's
        begin): the move may fail there (an index out of range, OP_FAILED), and bounds that
        fix its output would fold the failing operation away; unless their bounds show that
        it cannot fail (_within)."""
        code, inputs = operation.type, operation.inputs
        positions = _MOVES[code]
        data = list(range(len(inputs) - 1)) if positions is None else (
            list(range(1, len(inputs))) if code == Op.PACK else list(positions))
        if any(known[p] is None for p in data):
            return None
        if any(self.operands[index].lifetime not in (*_CONSTANT, OperandLifeTime.NO_VALUE)
               and not self._within(operation, position, known)
               for position, index in enumerate(inputs) if position not in data):
            return None
        output = self.operands[operation.outputs[0]]
        per_element = _small(output) and all(
            known[p][0].shape == tuple(self.operands[inputs[p]].dimensions) for p in data)
        if per_element:
            results = []
            for side in (0, 1):
                tensors = []
                for position, index in enumerate(inputs):
                    operand = self.operands[index]
                    if position in data:
                        value = known[position][side].astype(self._storage(operand.type))
                    else:
                        value = self._constant(index)
                        if value is None:  # an omitted optional parameter
                            return self._union(known, data)
                    tensors.append(Tensor(operand.type, tuple(value.shape), operand.scale, operand.zero_point,
                                          operand.channel_quant, value))
                context = ExecutionContext(code, tensors, [output.operand_type()])
                results.append(self._typed(get_operation(code).execute(context)[0], output.type))
            return results[0], results[1]
        return self._union(known, data)

    def _within(self, operation: Operation, position: int, known: list[Bounds | None]) -> bool:
        """Whether a parameter given at run time cannot make the move fail: a GATHER's
        indices whose bounds lie in [0, the axis's dimension) (TOPK_V2's, YOLO's picks)."""
        inputs = operation.inputs
        if operation.type != Op.GATHER or position != 2 or known[2] is None:
            return False
        dims, axis = self.operands[inputs[0]].dimensions, self._constant(inputs[1])
        if axis is None or axis.size != 1 or not dims:
            return False
        size = dims[int(axis.reshape(-1)[0]) % len(dims)]
        return bool(size and known[2][0].min() >= 0 and known[2][1].max() < size)

    @staticmethod
    def _union(known: list[Bounds | None], data: list[int]) -> Bounds:
        return (np.asarray(min(known[p][0].min() for p in data)),  # type: ignore[index]
                np.asarray(max(known[p][1].max() for p in data)))  # type: ignore[index]

    @staticmethod
    def _storage(code: int) -> type:
        return {T.TENSOR_INT32: np.int32, T.INT32: np.int32, T.TENSOR_BOOL8: np.bool_, T.BOOL: np.bool_}.get(
            code, np.float32)

    @staticmethod
    def _cast(known: Bounds | None, source: int, target: int) -> Bounds | None:
        """CAST between int32 and float32 (static_cast: truncation, saturated, as the reference)."""
        if known is None:
            return None
        if target in _FLOAT_TYPES:
            if source in (T.TENSOR_INT32, T.INT32):
                return known[0].astype(np.float32), known[1].astype(np.float32)
            return known if source in _FLOAT_TYPES else None
        if target in (T.TENSOR_INT32, T.INT32):
            if source in (T.TENSOR_INT32, T.INT32):
                return known
            if source in _FLOAT_TYPES:
                return tuple(np.clip(np.trunc(side.astype(np.float64)), *_INT32).astype(np.int64)  # type: ignore
                             for side in known)
        return None

    def _arithmetic(self, operation: Operation, a: Bounds | None, b: Bounds | None, integer: bool) -> Bounds | None:
        """ADD / SUB / MUL / DIV bounds from the four corners in the operation's own
        arithmetic (int32: exact integers, DIV flooring; float32: each corner rounded to
        float32), then its fused activation's clamp."""
        if a is None or b is None or len(operation.inputs) < 3:
            return None
        fuse = self._constant(operation.inputs[2])
        if fuse is None or fuse.size != 1:
            return None
        fuse = int(fuse.reshape(-1)[0])
        code = operation.type
        if integer and fuse != FuseCode.FUSED_NONE:
            return None
        if code == Op.DIV and np.any((b[0] <= 0) & (b[1] >= 0)):
            return None  # a divisor that may be 0 (the reference gives 0 for int32, inf / NaN for float)
        if integer:
            combine = np.floor_divide if code == Op.DIV else _ARITHMETIC[code]
            corners = [combine(x, y) for x in a for y in b]
            low, high = np.minimum.reduce(corners), np.maximum.reduce(corners)
            if code == Op.SUB:
                low, high = self._remainder(operation, low, high)
            if np.any(low < _INT32[0]) or np.any(high > _INT32[1]):
                return None
            return low, high
        combine = np.divide if code == Op.DIV else _ARITHMETIC[code]
        with np.errstate(all="ignore"):
            corners = [combine(x.astype(np.float32), y.astype(np.float32)) for x in a for y in b]
        if not all(np.all(np.isfinite(c)) for c in corners):
            return None
        low, high = np.minimum.reduce(corners), np.maximum.reduce(corners)
        clamp = {FuseCode.FUSED_NONE: (-np.inf, np.inf), FuseCode.FUSED_RELU: (0.0, np.inf),
                 FuseCode.FUSED_RELU1: (-1.0, 1.0), FuseCode.FUSED_RELU6: (0.0, 6.0)}.get(fuse)
        if clamp is None:
            return None
        return (np.clip(low, *clamp).astype(np.float32), np.clip(high, *clamp).astype(np.float32))

    def _remainder(self, operation: Operation, low: np.ndarray, high: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """An int32 SUB x - q * c where q = x // c (DIV of the same x by the same positive
        constant c, int32, no activation): the floor remainder, within [0, c - 1]."""
        x, product = operation.inputs[0], self.producers.get(operation.inputs[1])
        if product is None or product.type != Op.MUL or len(product.inputs) < 3:
            return low, high
        for quotient_index, factor_index in (product.inputs[:2], product.inputs[1::-1]):
            factor, quotient = self._constant(factor_index), self.producers.get(quotient_index)
            if factor is None or factor.size != 1 or quotient is None or quotient.type != Op.DIV:
                continue
            divisor = self._constant(quotient.inputs[1])
            fuses = [self._constant(o.inputs[2]) for o in (product, quotient)]
            if (quotient.inputs[0] != x or divisor is None or divisor.size != 1
                    or int(divisor.reshape(-1)[0]) != int(factor.reshape(-1)[0]) or int(factor.reshape(-1)[0]) <= 0
                    or any(f is None or f.size != 1 or int(f.reshape(-1)[0]) != 0 for f in fuses)):
                continue
            c = int(factor.reshape(-1)[0])
            return np.maximum(low, 0), np.minimum(high, c - 1)
        return low, high


def _compare(code: int, a: Bounds, b: Bounds) -> Bounds:
    """A comparison's bounds (0 / 1 per element: decided where every pair of values within
    ``a`` and ``b`` gives one result)."""
    if code == Op.GREATER:
        code, a, b = Op.LESS, b, a
    elif code == Op.GREATER_EQUAL:
        code, a, b = Op.LESS_EQUAL, b, a
    if code == Op.LESS:
        true, false = a[1] < b[0], a[0] >= b[1]
    elif code == Op.LESS_EQUAL:
        true, false = a[1] <= b[0], a[0] > b[1]
    else:
        true = (a[0] == a[1]) & (b[0] == b[1]) & (a[0] == b[0])
        false = (a[1] < b[0]) | (b[1] < a[0])
        if code == Op.NOT_EQUAL:
            true, false = false, true
    return np.where(true, 1, 0).astype(np.int64), np.where(false, 0, 1).astype(np.int64)
