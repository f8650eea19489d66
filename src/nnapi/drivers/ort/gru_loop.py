"""The WHILE loop Keras 3 writes for a GRU layer, lowered to one ONNX GRU node instead of a Loop.

Keras 3 (TensorFlow 2.16 on) converts ``keras.layers.GRU`` to a TFLite WHILE whose body
computes one step from its cell's operators, and NNAPI has no GRU operation, so the loop
stays a WHILE: as an ONNX Loop that costs ~46 ORT nodes per time step (a 124-step audio
model ran ~5x LiteRT). When a WHILE computes exactly a GRU over the whole sequence, it is
one ONNX ``GRU`` node (ORT's fused kernel: the input products of every step in one GEMM).

What is matched is what the body computes, read operation by operation, not its layout:

- the step's input x_t = GATHER(x, axis 0, i) (then RESHAPE to [batch, features] or not)
  of a [time, batch, features] float32 value x, at the iteration's index i;
- blocks of FULLY_CONNECTED products (constant float32 weights and bias, no activation)
  of x_t and of the state h, cut by SPLIT or STRIDED_SLICE of their last axis: each block
  contributes its weight rows and bias to ONNX's W / R and Wb / Rb, wherever it sits;
- z = f(x_z + h_z), r = f(x_r + h_r), and the candidate c = g(x_c + r * h_c) (Keras's
  reset_after=True: ONNX's ``linear_before_reset=1``) or c = g(x_c + FULLY_CONNECTED(r * h))
  (reset_after=False: ONNX's default form); f LOGISTIC or Keras 3's hard sigmoid (ADD of 3
  with a fused RELU6, MUL by 1/6: ONNX's HardSigmoid), g TANH or the ADD's fused RELU;
- h' = z * h + (1 - z) * c, the next state;
- the output buffer: h' written at row i of a [time, batch, units] value (SLICE of the rows
  before i, RESHAPE of h', SLICE of the rows after it, CONCATENATION on axis 0), or (a
  layer giving its last output only) RESHAPE of h' to [1, batch, units];
- every other carried value a counter (TENSOR_INT32 [1] plus 1 each iteration, its initial
  value a constant) or x passed through; the indices the body computes from counters
  (GATHER / SELECT / ADD / RESHAPE of int32 vectors, as the TFLite importer writes
  TFLite's CONCATENATION of indices) evaluated symbolically as i + constant;
- the condition model counters compared with constants (LESS, joined by LOGICAL_AND),
  which with the counters' initial values gives the trip count: it must be the
  sequence's length, so that step i reads x[i] for i = 0 .. time - 1 and fills the buffer.

Every operation of the body must belong to the pattern and every carried value be one
of the above; anything else (another activation, a clip, a peephole, a fused activation,
float16, weights computed at run time, a partial sequence) keeps the Loop. The loop's
results all come from the node: the buffer from Y (or Y_h), the state from Y_h, counters
as the constants they end at, x as itself. The values are the Loop's up to float32
summation order (ORT's kernel sums the products in its own order).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

import numpy as np

from nnapi.codes import FuseCode
from nnapi.codes import OperandCode as T
from nnapi.codes import OperationCode as Op
from nnapi.drivers.ort import control_flow
from nnapi.drivers.ort.builder import Declined, GraphBuilder, L
from nnapi.drivers.ort.data_movement import sliced_block
from nnapi.drivers.ort.recurrent import activation_attributes
from nnapi.hal import Operation, Subgraph
from nnapi.operations.control_flow import WHILE_BODY_MODEL, WHILE_CONDITION_MODEL, WHILE_FIRST_VALUE


class _NoMatch(Exception):
    """The loop is not a GRU over its sequence (the Loop lowering runs)."""


def _need(condition: bool) -> None:
    if not condition:
        raise _NoMatch


#: a symbolic int32 element: an int, or ("i", k) for the iteration's index plus k
Symbol = int | tuple[str, int]


@dataclass
class _Piece:
    """Rows ``start:stop`` of a FULLY_CONNECTED's product of ``source``."""

    source: int
    weights: np.ndarray
    bias: np.ndarray
    ops: list[Operation]


@dataclass
class _Found:
    x: int  # positions among the WHILE's values
    h: int
    buffer: int
    counters: dict[int, int]  # position -> initial value
    trip: int
    dims: tuple[int, int, int, int] = (0, 0, 0, 0)  # steps, batch, features, units
    w: list[np.ndarray] = field(default_factory=list)  # z, r, c rows of the input product
    r: list[np.ndarray] = field(default_factory=list)
    wb: list[np.ndarray] = field(default_factory=list)
    rb: list[np.ndarray] = field(default_factory=list)
    reset_after: bool = True
    last_only: bool = False
    functions: list[tuple] = field(default_factory=lambda: [SIGMOID, TANH])  # ONNX's f (gates) and g


class _Body:
    """A referenced model's operations and constants (through a GraphBuilder used only to
    read them), and the operations a match has claimed."""

    def __init__(self, g: GraphBuilder, subgraph: Subgraph) -> None:
        self.b = GraphBuilder(g.model, subgraph, isolated=True)
        self.subgraph = subgraph
        self.position = {index: k for k, index in enumerate(subgraph.input_indexes)}

    def op(self, index: int, code: Op, fused: bool = False) -> Operation:
        """The operation of type ``code`` writing ``index`` (with no fused activation when
        ``fused``: its last input, a constant 0)."""
        operation = self.b.producer(index)
        _need(operation is not None and operation.type == code)
        if fused:
            _need(self.const(operation.inputs[-1]) is not None and int(self.b.scalar(operation.inputs[-1])) == 0)
        return operation

    def const(self, index: int) -> np.ndarray | None:
        operand = self.b.operand(index)
        if operand.lifetime not in (L.CONSTANT_COPY, L.CONSTANT_REFERENCE):
            return None
        return self.b.raw_constant(index)

    def dims(self, index: int) -> list[int]:
        return list(self.b.operand(index).dimensions)

    def floats(self, index: int, dims: list[int]) -> None:
        operand = self.b.operand(index)
        _need(operand.type == T.TENSOR_FLOAT32 and list(operand.dimensions) == dims)


_Matched = TypeVar("_Matched")


def _either(pair: Sequence[int], match: Callable[[int, int], _Matched]) -> _Matched:
    """``match(a, b)`` for the two inputs of a commutative operation, in either order."""
    a, b = pair
    try:
        return match(a, b)
    except _NoMatch:
        return match(b, a)


def _ints(body: _Body, index: int, counters: dict[int, int], used: list[Operation]) -> list[Symbol]:
    """The TENSOR_INT32 vector ``index`` element by element: constants, or the iteration's
    index plus a constant where a counter (initial value ``counters[position]``) gives it."""
    operand = body.b.operand(index)
    _need(operand.type == T.TENSOR_INT32 and len(operand.dimensions) == 1)
    constant = body.const(index)
    if constant is not None:
        return [int(v) for v in constant.reshape(-1)]
    if index in body.position:
        _need(body.position[index] in counters and list(operand.dimensions) == [1])
        return [("i", counters[body.position[index]])]
    operation = body.b.producer(index)
    _need(operation is not None)
    used.append(operation)
    if operation.type == Op.ADD:
        _need(int(body.b.scalar(operation.inputs[2])) == 0)
        a, b = (_ints(body, i, counters, used) for i in operation.inputs[:2])
        _need(len(a) == len(b) == 1 and [isinstance(v, int) for v in (a[0], b[0])].count(True) >= 1)
        if isinstance(a[0], int) and isinstance(b[0], int):
            return [a[0] + b[0]]
        symbol, offset = (a[0], b[0]) if isinstance(b[0], int) else (b[0], a[0])
        return [("i", symbol[1] + offset)]
    if operation.type == Op.GATHER:
        _need(int(body.b.scalar(operation.inputs[1])) == 0 and body.const(operation.inputs[2]) is not None)
        source = _ints(body, operation.inputs[0], counters, used)
        picks = [int(v) for v in body.const(operation.inputs[2]).reshape(-1)]
        _need(all(0 <= k < len(source) for k in picks))
        return [source[k] for k in picks]
    if operation.type == Op.SELECT:
        mask = body.const(operation.inputs[0])
        _need(mask is not None)
        a, b = (_ints(body, i, counters, used) for i in operation.inputs[1:3])
        flags = [bool(v) for v in mask.reshape(-1)]
        _need(len(a) == len(b) == len(flags))
        return [x if flag else y for flag, x, y in zip(flags, a, b)]
    if operation.type == Op.RESHAPE:
        return _ints(body, operation.inputs[0], counters, used)
    raise _NoMatch


def _piece(body: _Body, index: int, units: int) -> _Piece:
    """The block of a FULLY_CONNECTED product that operand ``index`` is: a SPLIT output or
    a STRIDED_SLICE of the last axis of its [batch, n] product (or the whole product)."""
    ops: list[Operation] = []
    operation = body.b.producer(index)
    _need(operation is not None)
    product = index
    start, stop = 0, None
    if operation.type == Op.SPLIT:
        product = operation.inputs[0]
        dims = body.dims(product)
        _need(len(dims) == 2 and int(body.b.scalar(operation.inputs[1])) in (1, -1))
        count = int(body.b.scalar(operation.inputs[2]))
        _need(count == len(operation.outputs) and count > 0 and dims[1] % count == 0)
        width = dims[1] // count
        start = operation.outputs.index(index) * width
        stop = start + width
        ops.append(operation)
    elif operation.type == Op.STRIDED_SLICE:
        product = operation.inputs[0]
        dims = body.dims(product)
        _need(len(dims) == 2 and all(dims))
        block = sliced_block(body.b, operation, dims)
        _need(block is not None and block[0] == 1)
        _, start, stop = block
        ops.append(operation)
    fc = body.op(product, Op.FULLY_CONNECTED, fused=True)
    ops.append(fc)
    weights, bias = body.const(fc.inputs[1]), body.const(fc.inputs[2])
    _need(weights is not None and bias is not None)
    _need(body.b.operand(fc.inputs[1]).type == body.b.operand(fc.inputs[2]).type == T.TENSOR_FLOAT32)
    _need(weights.ndim == 2 and bias.shape == (weights.shape[0],) and body.dims(product)[-1] == weights.shape[0])
    stop = weights.shape[0] if stop is None else stop
    _need(stop - start == units)
    return _Piece(fc.inputs[0], weights[start:stop], bias[start:stop], ops)


#: ONNX's activation functions (name, alpha, beta) for the gates' and the candidate's forms
SIGMOID = ("Sigmoid", None, None)
HARD_SIGMOID = ("HardSigmoid", float(np.float32(1 / 6)), 0.5)  # clip(x / 6 + 0.5, 0, 1)
TANH = ("Tanh", None, None)
RELU = ("Relu", None, None)


def _constant_is(body: _Body, index: int, value: float) -> bool:
    """Whether ``index`` is a float32 constant of one element equal to ``value`` (as float32)."""
    constant = body.const(index)
    return constant is not None and body.b.operand(index).type == T.TENSOR_FLOAT32 and constant.size == 1 and \
        float(constant.reshape(-1)[0]) == float(np.float32(value))


def _gate(body: _Body, index: int, units: int) -> tuple[_Piece, _Piece, list[Operation], tuple]:
    """``index`` = f(a + b) of two product blocks, f LOGISTIC or Keras 3's hard sigmoid
    relu6(x + 3) * (1 / 6) (ONNX's HardSigmoid: the same up to float32 rounding, x / 6 + 0.5
    against (x + 3) / 6): (the blocks, the operations, f as ONNX names it)."""
    operation = body.b.producer(index)
    _need(operation is not None)
    if operation.type == Op.LOGISTIC:
        ops, pre, function = [operation], operation.inputs[0], SIGMOID
    else:
        scale = body.op(index, Op.MUL, fused=True)

        def sixth(shifted: int, factor: int) -> tuple[int, Operation]:
            _need(_constant_is(body, factor, 1 / 6))
            add = body.op(shifted, Op.ADD)
            _need(int(body.b.scalar(add.inputs[2])) == FuseCode.FUSED_RELU6)

            def plus_three(x: int, three: int) -> int:
                _need(_constant_is(body, three, 3.0))
                return x
            return _either(add.inputs[:2], plus_three), add
        pre, shift = _either(scale.inputs[:2], sixth)
        ops, function = [scale, shift], HARD_SIGMOID
    add = body.op(pre, Op.ADD, fused=True)
    a, b = (_piece(body, i, units) for i in add.inputs[:2])
    return a, b, [*ops, add], function


def _by_source(pieces: tuple[_Piece, _Piece], x_step: int, h: int) -> tuple[_Piece, _Piece]:
    """(the input's block, the state's block) of a gate's two blocks."""
    a, b = pieces
    if a.source == h and b.source == x_step:
        a, b = b, a
    _need(a.source == x_step and b.source == h)
    return a, b


def _match(g: GraphBuilder, operation: Operation) -> _Found:
    condition_model = control_flow.referenced_model(g, operation.inputs[WHILE_CONDITION_MODEL])
    body_model = control_flow.referenced_model(g, operation.inputs[WHILE_BODY_MODEL])
    values = operation.inputs[WHILE_FIRST_VALUE:]
    n, carried = len(values), len(body_model.output_indexes)
    _need(len(body_model.input_indexes) == len(condition_model.input_indexes) == n)
    _need(len(operation.outputs) <= carried <= n)
    body = _Body(g, body_model)
    inputs, outputs = body_model.input_indexes, body_model.output_indexes
    used: list[Operation] = []

    # counters: TENSOR_INT32 [1] starting at a constant, plus 1 each iteration
    counters: dict[int, int] = {}
    for k in range(carried):
        operand = body.b.operand(inputs[k])
        if operand.type != T.TENSOR_INT32:
            continue
        _need(list(operand.dimensions) == [1])
        add = body.op(outputs[k], Op.ADD, fused=True)
        _need(add.inputs[0] == inputs[k] and body.const(add.inputs[1]) is not None)
        _need(body.const(add.inputs[1]).reshape(-1).tolist() == [1])
        start = g.raw_constant(values[k])
        _need(start is not None and g.operand(values[k]).type == T.TENSOR_INT32 and start.size == 1)
        counters[k] = int(start.reshape(-1)[0])
        used.append(add)
    _need(bool(counters))

    # the next state h' = z * h + (1 - z) * c, at the carried position of h
    cells = []
    for k in range(carried):
        if k in counters or body.b.operand(inputs[k]).type != T.TENSOR_FLOAT32:
            continue
        try:
            cells.append((k, _cell(body, outputs[k], inputs[k])))
        except _NoMatch:
            continue
    _need(len(cells) == 1)
    h_pos, (cell_ops, z_pieces, r_pieces, c_x, c_h, reset_after, x_step, functions) = cells[0]
    used += cell_ops
    batch, units = body.dims(inputs[h_pos])
    h_new = outputs[h_pos]

    # the step's input: GATHER(x, 0, i) (through a RESHAPE to [batch, features] or not)
    step_op = body.b.producer(x_step)
    _need(step_op is not None)
    if step_op.type == Op.RESHAPE:
        used.append(step_op)
        body.floats(x_step, [batch, body.dims(step_op.inputs[0])[-1]])
        step_op = body.op(step_op.inputs[0], Op.GATHER)
    _need(step_op.type == Op.GATHER and int(body.b.scalar(step_op.inputs[1])) == 0)
    used.append(step_op)
    _need(step_op.inputs[0] in body.position)
    x_pos = body.position[step_op.inputs[0]]
    x_dims = body.dims(inputs[x_pos])
    _need(len(x_dims) == 3 and x_dims[1] == batch and all(x_dims))
    steps, features = x_dims[0], x_dims[2]
    body.floats(inputs[x_pos], x_dims)
    body.floats(step_op.outputs[0], [1, batch, features])
    _need(_ints(body, step_op.inputs[2], counters, used) == [("i", 0)])
    for piece in (*z_pieces, *r_pieces, c_x, c_h):
        _need(piece.weights.shape[1] == (features if piece.source == x_step else units))
    if x_pos < carried:  # passed through unchanged: a RESHAPE to its own shape
        through = body.op(outputs[x_pos], Op.RESHAPE)
        _need(through.inputs[0] == inputs[x_pos] and body.dims(outputs[x_pos]) == x_dims)
        used.append(through)

    # the buffer: h' written at row i, or h' alone as [1, batch, units]
    rest = [k for k in range(carried) if k not in counters and k not in (h_pos, x_pos)]
    _need(len(rest) == 1)
    buffer_pos = rest[0]
    buffer_dims = body.dims(inputs[buffer_pos])
    body.floats(outputs[buffer_pos], buffer_dims)
    write = body.b.producer(outputs[buffer_pos])
    _need(write is not None)
    used.append(write)
    last_only = write.type == Op.RESHAPE
    if last_only:
        _need(write.inputs[0] == h_new and buffer_dims == [1, batch, units])
    else:
        _need(write.type == Op.CONCATENATION and len(write.inputs) == 4 and int(body.b.scalar(write.inputs[3])) == 0)
        _need(buffer_dims == [steps, batch, units])
        head, middle, tail = (body.b.producer(i) for i in write.inputs[:3])
        _need(all(op is not None and op.type == t for op, t in ((head, Op.SLICE), (middle, Op.RESHAPE),
                                                                (tail, Op.SLICE))))
        _need(middle.inputs[0] == h_new and body.dims(middle.outputs[0]) == [1, batch, units])
        _need(head.inputs[0] == tail.inputs[0] == inputs[buffer_pos])
        whole = (-1, batch, units)  # SLICE size -1: to the end
        head_begin, head_size, tail_begin, tail_size = (
            _ints(body, i, counters, used) for i in (head.inputs[1], head.inputs[2], tail.inputs[1], tail.inputs[2]))
        _need(head_begin == [0, 0, 0] and head_size[0] == ("i", 0) and tail_begin == [("i", 1), 0, 0])
        _need(all(s in (-1, whole[a]) for a, s in enumerate(head_size) if a) and tail_size[0] == -1 and
              all(s in (-1, whole[a]) for a, s in enumerate(tail_size) if a))
        used += [head, middle, tail]

    # the trip count: while every bounded counter is below its bound
    trip = _trip(g, condition_model, counters)
    _need(trip == steps and steps > 0)
    _need({id(op) for op in used} == {id(op) for op in body_model.operations})
    found = _Found(x_pos, h_pos, buffer_pos, counters, trip, (steps, batch, features, units),
                   reset_after=reset_after, last_only=last_only, functions=functions)
    found.w = [z_pieces[0].weights, r_pieces[0].weights, c_x.weights]
    found.wb = [z_pieces[0].bias, r_pieces[0].bias, c_x.bias]
    found.r = [z_pieces[1].weights, r_pieces[1].weights, c_h.weights]
    found.rb = [z_pieces[1].bias, r_pieces[1].bias, c_h.bias]
    return found


def _cell(body: _Body, h_new: int, h: int) -> tuple[list[Operation], tuple[_Piece, _Piece], tuple[_Piece, _Piece],
                                                 _Piece, _Piece, bool, int, list]:
    """h_new = z * h + (1 - z) * c: the cell's operations, the gates' (input, state)
    blocks, the candidate's, whether the reset gate scales the state's product (Keras's
    reset_after) or the state, and the step's input operand."""
    dims = body.dims(h)
    _need(len(dims) == 2 and all(dims))
    body.floats(h, dims)
    body.floats(h_new, dims)
    units = dims[1]
    add = body.op(h_new, Op.ADD, fused=True)

    def halves(kept: int, blended: int) -> tuple[list[Operation], int, int]:
        keep = body.op(kept, Op.MUL, fused=True)
        _need(h in keep.inputs[:2])
        z = keep.inputs[1] if keep.inputs[0] == h else keep.inputs[0]
        blend = body.op(blended, Op.MUL, fused=True)

        def complement(one_minus: int, candidate: int) -> tuple[Operation, int]:
            sub = body.op(one_minus, Op.SUB, fused=True)
            ones = body.const(sub.inputs[0])
            _need(sub.inputs[1] == z and ones is not None and ones.size > 0 and np.all(ones == 1.0))
            _need(body.b.operand(sub.inputs[0]).type == T.TENSOR_FLOAT32 and ones.size in (1, units, units * dims[0]))
            return sub, candidate
        sub, candidate = _either(blend.inputs[:2], complement)
        return [keep, blend, sub], z, candidate

    ops, z, candidate = _either(add.inputs[:2], halves)
    ops.append(add)
    z_x, z_h, z_ops, gates = _gate(body, z, units)
    activation = body.b.producer(candidate)
    _need(activation is not None)
    if activation.type == Op.TANH:
        inner = body.op(activation.inputs[0], Op.ADD, fused=True)
        ops += [activation]
        function = TANH
    else:  # relu(x_c + ...): the ADD's fused RELU (Keras's activation="relu")
        inner = body.op(candidate, Op.ADD)
        _need(int(body.b.scalar(inner.inputs[2])) == FuseCode.FUSED_RELU)
        function = RELU
    ops += [*z_ops, inner]

    def candidate_form(x_block: int, recurrent: int) -> tuple[_Piece, int, _Piece, list[Operation], bool]:
        c_x = _piece(body, x_block, units)
        operation = body.b.producer(recurrent)
        _need(operation is not None)
        if operation.type == Op.MUL:  # r * (h R_c + b): the reset gate after the product
            _need(int(body.b.scalar(operation.inputs[2])) == 0)
            r, c_h = _either(operation.inputs[:2], lambda r, block: (r, _piece(body, block, units)))
            return c_x, r, c_h, [operation], True
        product = _piece(body, recurrent, units)  # (r * h) R_c + b: the reset gate before it
        _need(len(product.ops) == 1)  # the whole product, not a block of it
        scaled = body.op(product.source, Op.MUL, fused=True)
        _need(h in scaled.inputs[:2])
        r = scaled.inputs[1] if scaled.inputs[0] == h else scaled.inputs[0]
        return c_x, r, _Piece(h, product.weights, product.bias, product.ops), [scaled], False

    c_x, r, c_h, c_ops, reset_after = _either(inner.inputs[:2], candidate_form)
    ops += c_ops + c_x.ops + c_h.ops
    r_x, r_h, r_ops, r_gate = _gate(body, r, units)
    _need(r_gate == gates)  # ONNX's f is both gates'
    ops += r_ops
    x_step = c_x.source
    _need(x_step != h)
    z_pieces = _by_source((z_x, z_h), x_step, h)
    r_pieces = _by_source((r_x, r_h), x_step, h)
    if reset_after:
        _need(c_h.source == h)
    for piece in (*z_pieces, *r_pieces):
        ops += piece.ops
    return ops, z_pieces, r_pieces, c_x, c_h, reset_after, x_step, [gates, function]


def _trip(g: GraphBuilder, condition_model: Subgraph, counters: dict[int, int]) -> int:
    """The iterations the condition model allows: counters below constant bounds (LESS),
    joined by LOGICAL_AND, every operation of the model part of it."""
    cond = _Body(g, condition_model)
    _need(len(condition_model.output_indexes) == 1)
    bounds: list[tuple[int, int]] = []
    used: list[Operation] = []

    def visit(index: int) -> None:
        operation = cond.b.producer(index)
        _need(operation is not None)
        used.append(operation)
        if operation.type == Op.LOGICAL_AND:
            for i in operation.inputs[:2]:
                visit(i)
            return
        _need(operation.type == Op.LESS and operation.inputs[0] in cond.position)
        k = cond.position[operation.inputs[0]]
        bound = cond.const(operation.inputs[1])
        _need(k in counters and bound is not None and bound.size == 1)
        _need(cond.b.operand(operation.inputs[1]).type == T.TENSOR_INT32)
        bounds.append((k, int(bound.reshape(-1)[0])))

    visit(condition_model.output_indexes[0])
    _need(bool(bounds) and {id(op) for op in used} == {id(op) for op in condition_model.operations})
    return min(max(0, bound - counters[k]) for k, bound in bounds)


def _emit(g: GraphBuilder, operation: Operation, found: _Found) -> None:
    """The GRU node and the loop's results (in the shapes the body gives them: an output
    operand of the WHILE may leave its dimensions open)."""
    values = operation.inputs[WHILE_FIRST_VALUE:]
    x, h = g.value(values[found.x]), g.value(values[found.h])
    steps, batch, _, units = found.dims

    def stacked(parts: list[np.ndarray]) -> str:
        return g.constant(np.concatenate(parts).astype(np.float32)[None], "w")

    h0 = g.one("Unsqueeze", [h.name, g.constant(np.array([0], np.int64))])
    y, y_h = g.node("GRU", [x.name, stacked(found.w), stacked(found.r), stacked(found.wb + found.rb), "", h0], 2,
                    hidden_size=units, linear_before_reset=1 if found.reset_after else 0,
                    **activation_attributes(found.functions))
    for k, index in enumerate(operation.outputs):
        if k in found.counters:
            g.set_output(index, g.constant(np.full([1], found.counters[k] + found.trip, np.int32)))
        elif k == found.x:
            g.set_output(index, x.name)
        elif k == found.h:
            g.set_output(index, g.one("Reshape", [y_h, g.constant(np.array([batch, units], np.int64))]))
        elif found.last_only:
            g.set_output(index, y_h)  # [1, batch, units]
        else:
            g.set_output(index, g.one("Reshape", [y, g.constant(np.array([steps, batch, units], np.int64))]))


def fused_gru(g: GraphBuilder, operation: Operation) -> bool:
    """Lower WHILE ``operation`` as one ONNX GRU when it is a GRU over its whole sequence
    (see the module docstring); False (nothing emitted) otherwise."""
    try:
        found = _match(g, operation)
    except (_NoMatch, Declined):
        return False
    except (ValueError, TypeError, IndexError, KeyError):  # a malformed body: the Loop lowering reports it
        return False
    values = operation.inputs[WHILE_FIRST_VALUE:]
    x, h = g.value(values[found.x]), g.value(values[found.h])
    steps, batch, features, units = found.dims
    if x.kind != "float" or h.kind != "float" or x.dims != [steps, batch, features] or h.dims != [batch, units]:
        return False  # the values the loop starts from are not the body's (the Loop lowering says why)
    _emit(g, operation, found)
    return True


control_flow.WHILE_FORMS.append(fused_gru)
