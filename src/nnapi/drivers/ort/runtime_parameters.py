"""Lowerings of parameters given at run time (the CTS's ``all_tensors_as_inputs``
vectors): STRIDED_SLICE's begin / end / strides and MEAN's axes read as tensors while the
graph runs, with NNAPI's rules computed in ONNX integer arithmetic.

ONNX's Slice and ReduceSum take these values as inputs, but clamp or count them by ONNX's
rules, not NNAPI's: begin / end are clamped here first as Android's ClampedIndex does (ONNX
would read a negative start of a backwards slice as counting from the end), and whatever
the reference refuses (a zero stride, a shrunk axis selecting other than one element, an
axis out of range, a vector of the wrong length) fails the run through
``builder.fail_unless``, as the reference's run fails (OP_FAILED), never giving another
answer. Parameters that decide the output's rank (STRIDED_SLICE's masks, MEAN's
keep_dims) must stay constants. ``lowering`` calls these (RUN_TIME_FORMS) for the
operands it finds not constant; the device module imports this one, which registers them.
"""

from __future__ import annotations

import itertools

import numpy as np
import onnx
from onnx import TensorProto, helper

from nnapi.codes import OperandCode, OperationCode
from nnapi.drivers.ort.builder import (
    KIND_ELEM,
    Declined,
    GraphBuilder,
    Value,
    all_hold,
    fail_unless,
    internal_zero_point,
    lowers_at_run_time,
)
from nnapi.drivers.ort.omitted import optional_inputs
from nnapi.drivers.ort.pooling import rounded_mean
from nnapi.hal import Operation

T = OperandCode
#: an end before any index: ONNX clamps it to "before the first element" of a backwards slice
_BEFORE_FIRST = -(2 ** 62)


def int64_vector(g: GraphBuilder, index: int, length: int, what: str, checks: list[str]) -> str:
    """1-D TENSOR_INT32 operand ``index`` as int64, a constant where it is one; given at
    run time, a check that it has ``length`` elements is added to ``checks``."""
    known = g.raw_constant(index)
    if known is not None:
        values = np.asarray(known).reshape(-1).astype(np.int64)
        if values.size != length:
            raise Declined(f"{what} must have {length} elements")
        return g.constant(values)
    value = g.one("Cast", [g.value(index).name], to=TensorProto.INT64)
    checks.append(g.one("Equal", [g.one("Shape", [value]), g.constant(np.array([length], np.int64))]))
    return value


def shape_of(g: GraphBuilder, x: Value) -> str:
    """``x``'s dimensions as an int64 vector: a constant where they are known."""
    if all(x.dims):
        return g.constant(np.array(x.dims, np.int64))
    return g.one("Shape", [x.name])


def constant_scalar(g: GraphBuilder, operation: Operation, position: int, what: str, why: str) -> int:
    """An INT32 parameter that must be a constant, named in the reason where it is not."""
    index = operation.inputs[position]
    if g.raw_constant(index) is None:
        raise Declined(f"{what} (operand {index}) is given at run time: {why}")
    return int(g.scalar(index))


@lowers_at_run_time(OperationCode.STRIDED_SLICE)
def strided_slice(g: GraphBuilder, operation: Operation, x: Value) -> str:
    """STRIDED_SLICE with begin, end or strides given at run time (the masks constant). Per
    axis, vectorized over the axes in int64: begin / end clamped as Android clamps them
    (forwards into [0, size], backwards into [-1, size - 1]), the masks' full ranges, then
    the bounds handed to Slice in a form its own clamping leaves alone (a backwards end of
    -1 as "before the first element", an empty backwards slice as [0, 0)). The run fails
    unless every stride is non-zero and each shrunk axis selects one element with a
    positive stride; shrunk axes are squeezed (all of them: shape [1])."""
    rank = x.rank
    if rank == 0:
        raise Declined("STRIDED_SLICE with parameters given at run time needs the input's rank")
    why = "it decides which axes are kept"
    begin_mask, end_mask, shrink = (constant_scalar(g, operation, position, what, why) for position, what in
                                    ((4, "STRIDED_SLICE's begin_mask"), (5, "STRIDED_SLICE's end_mask"),
                                     (6, "STRIDED_SLICE's shrink_axis_mask")))
    checks: list[str] = []
    begin, end, strides = (int64_vector(g, operation.inputs[position], rank, what, checks)
                           for position, what in ((1, "begin"), (2, "end"), (3, "strides")))
    sizes = shape_of(g, x)
    zero, one = g.constant(np.array(0, np.int64)), g.constant(np.array(1, np.int64))
    minus_one = g.constant(np.array(-1, np.int64))
    last = g.one("Sub", [sizes, one])
    forwards = g.one("Greater", [strides, zero])
    checks.append(g.one("Not", [g.one("Equal", [strides, zero])]))

    def clamped(index: str) -> str:
        """Android's ClampedIndex of each axis's ``index``."""
        negative = g.one("Less", [index, zero])
        counted = g.one("Add", [index, sizes])
        ahead = g.one("Min", [g.one("Max", [g.one("Where", [negative, counted, index]), zero]), sizes])
        behind = g.one("Max", [g.one("Where", [negative, counted, g.one("Min", [index, last])]), minus_one])
        return g.one("Where", [forwards, ahead, behind])

    def masked(mask: int, index: str, full_forwards: str, full_backwards: str) -> str:
        bits = np.array([bool(mask >> axis & 1) for axis in range(rank)])
        if not bits.any():
            return index
        full = g.one("Where", [forwards, full_forwards, full_backwards])
        return g.one("Where", [g.constant(bits), full, index])

    start = masked(begin_mask, clamped(begin), zero, last)
    stop = masked(end_mask, clamped(end), sizes, minus_one)
    shrunk = [axis for axis in range(rank) if shrink >> axis & 1]
    if shrunk:
        # a shrunk axis: a positive stride and 1 <= stop - start <= stride (one element)
        on_axis = g.constant(np.array([axis in shrunk for axis in range(rank)]))
        span = g.one("Sub", [stop, start])
        one_element = g.one("And", [forwards, g.one("And", [g.one("GreaterOrEqual", [span, one]),
                                                             g.one("LessOrEqual", [span, strides])])])
        checks.append(g.one("Or", [g.one("Not", [on_axis]), one_element]))
    # backwards: a start of -1 selects nothing (Slice would count it from the end), an end
    # of -1 is before the first element
    empty_backwards = g.one("And", [g.one("Not", [forwards]), g.one("Less", [start, zero])])
    start = g.one("Where", [empty_backwards, zero, start])
    stop = g.one("Where", [empty_backwards, zero, g.one("Where", [
        g.one("And", [g.one("Not", [forwards]), g.one("Less", [stop, zero])]),
        g.constant(np.array(_BEFORE_FIRST, np.int64)), stop])])
    start = fail_unless(g, all_hold(g, checks), start)
    y = g.one("Slice", [x.name, start, stop, g.constant(np.arange(rank, dtype=np.int64)), strides])
    if len(shrunk) == rank:
        return g.one("Reshape", [y, g.constant(np.array([1], np.int64))])
    if shrunk:
        return g.one("Squeeze", [y, g.constant(np.array(shrunk, np.int64))])
    return y


@lowers_at_run_time(OperationCode.MEAN)
def mean(g: GraphBuilder, operation: Operation, x: Value) -> str:
    """MEAN over axes given at run time (keep_dims constant), or a quantized MEAN of a
    shape known only at run time (ORT folds the nodes of constant axes). The axes (repeats
    allowed, negative ones counted from the end, each in [-rank, rank) or the run fails)
    become a mask of the reduced dimensions, whose positions are ReduceSum's axes (none:
    nothing reduced). Float: the sum divided by the count of reduced elements. Quantized
    (output in the input's quantization): the exact int64 sums, then pooling.rounded_mean
    (the reference's rounding); a group of no elements fails the run as on the reference,
    where the output has elements."""
    rank = x.rank
    if rank == 0:
        raise Declined("MEAN with axes given at run time needs the input's rank")
    keep = constant_scalar(g, operation, 2, "MEAN's keep_dims", "it decides the output's rank") > 0
    output = g.operand(operation.outputs[0])
    if x.kind == "uint8" and (output.scale, output.zero_point) != (x.scale, g.operand(operation.inputs[0]).zero_point):
        raise Declined("output quantization differs from the input's")
    if x.kind not in ("float", "uint8"):
        raise Declined(f"MEAN on {x.kind} values is not supported")
    axes = g.one("Cast", [g.value(operation.inputs[1]).name], to=TensorProto.INT64)
    count = g.constant(np.array(rank, np.int64))
    zero = g.constant(np.array(0, np.int64))
    checks = [g.one("And", [g.one("GreaterOrEqual", [axes, g.one("Neg", [count])]), g.one("Less", [axes, count])])]
    normalized = g.one("Where", [g.one("Less", [axes, zero]), g.one("Add", [axes, count]), axes])
    # [k, rank] one-hot rows summed over k (an empty list sums to zeros): which axes go
    hits = g.one("Equal", [g.one("Unsqueeze", [normalized, g.constant(np.array([1], np.int64))]),
                           g.constant(np.arange(rank, dtype=np.int64).reshape(1, rank))])
    reduced = g.one("Greater", [g.one("ReduceSum", [g.one("Cast", [hits], to=TensorProto.INT64),
                                                    g.constant(np.array([0], np.int64))], keepdims=0), zero])
    positions = g.one("Reshape", [g.one("NonZero", [reduced]), g.constant(np.array([-1], np.int64))])
    sizes = shape_of(g, x)
    one = g.constant(np.array(1, np.int64))
    elements = g.one("ReduceProd", [g.one("Where", [reduced, sizes, one])], keepdims=0)
    valid = all_hold(g, checks)
    if x.kind == "float":
        total = g.one("ReduceSum", [x.name, fail_unless(g, valid, positions)], keepdims=int(keep),
                      noop_with_empty_axes=1)
        y = g.one("Div", [total, g.one("Cast", [elements], to=TensorProto.FLOAT)])
    else:
        kept = g.one("ReduceProd", [g.one("Where", [reduced, one, sizes])], keepdims=0)
        # a group of no elements has no quantized mean (the reference fails where the output has elements)
        valid = g.one("And", [valid, g.one("Or", [g.one("Greater", [elements, zero]), g.one("Equal", [kept, zero])])])
        total = g.one("ReduceSum", [g.one("Cast", [x.name], to=TensorProto.INT64), fail_unless(g, valid, positions)],
                      keepdims=int(keep), noop_with_empty_axes=1)
        n = g.one("Max", [elements, one])  # (no division by zero where the run does not fail)
        y = rounded_mean(g, total, n, internal_zero_point(output) - output.zero_point)
    if keep:
        return y
    # every axis reduced: NNAPI gives shape [1] (ONNX a scalar)
    shape = g.one("Shape", [y])
    length = g.one("Max", [g.one("Shape", [shape]), g.constant(np.array([1], np.int64))])
    padded = g.one("Concat", [shape, g.constant(np.array([1], np.int64))], axis=0)
    return g.one("Reshape", [y, g.one("Slice", [padded, g.constant(np.array([0], np.int64)), length])])


@lowers_at_run_time(OperationCode.TRANSPOSE)
def transpose(g: GraphBuilder, operation: Operation, x: Value) -> str:
    """TRANSPOSE by a perm given at run time (ONNX's Transpose takes it as an attribute).
    The rank is known (at most 4: 24 permutations), so the graph holds one Transpose per
    permutation and picks the one the run's perm names through a binary tree of Ifs on
    its code sum_k perm[k] * rank^k: the same copy as a constant perm's, at its speed (a
    Gather of computed flat indexes, tried first, took 3x the reference's time at
    56x56x64). The run fails unless perm has rank elements, each in [0, rank) and each
    axis once, as the reference's does."""
    rank = x.rank
    checks: list[str] = []
    perm = int64_vector(g, operation.inputs[1], rank, "perm", checks)
    count = g.constant(np.array(rank, np.int64))
    zero = g.constant(np.array(0, np.int64))
    checks.append(g.one("And", [g.one("GreaterOrEqual", [perm, zero]), g.one("Less", [perm, count])]))
    # each axis exactly once: the [rank, rank] one-hot rows of perm sum to ones per column
    hits = g.one("Equal", [g.one("Unsqueeze", [perm, g.constant(np.array([1], np.int64))]),
                           g.constant(np.arange(rank, dtype=np.int64).reshape(1, rank))])
    uses = g.one("ReduceSum", [g.one("Cast", [hits], to=TensorProto.INT64), g.constant(np.array([0], np.int64))],
                 keepdims=0)
    checks.append(g.one("Equal", [uses, g.constant(np.ones(rank, np.int64))]))
    perm = fail_unless(g, all_hold(g, checks), perm, "perm must be a permutation of the input's axes")
    weights = rank ** np.arange(rank, dtype=np.int64)
    code = g.one("ReduceSum", [g.one("Mul", [perm, g.constant(weights)])], keepdims=0)
    orders = sorted(itertools.permutations(range(rank)), key=lambda order: int(np.dot(order, weights)))
    element = KIND_ELEM[x.kind]

    def pick(orders: list[tuple[int, ...]]) -> tuple[list[onnx.NodeProto], str]:
        """The nodes choosing among ``orders`` (sorted by code) and their output's name."""
        if len(orders) == 1:
            name = g.fresh("transposed")
            return [helper.make_node("Transpose", [x.name], [name], perm=list(orders[0]))], name
        middle = len(orders) // 2
        below = g.one("Less", [code, g.constant(np.array(np.dot(orders[middle], weights), np.int64))])
        branches = []
        for part in (orders[:middle], orders[middle:]):
            nodes, name = pick(part)
            branches.append(helper.make_graph(nodes, g.fresh("branch"), [],
                                              [helper.make_tensor_value_info(name, element, None)]))
        name = g.fresh("transposed")
        return [helper.make_node("If", [below], [name], then_branch=branches[0], else_branch=branches[1])], name

    nodes, name = pick(orders)
    g.nodes.extend(nodes)
    return name


# a model input feeding TRANSPOSE's perm may be omitted by a request (the reversed axes):
# that pattern is the constant form's, a present one this run-time form
optional_inputs(OperationCode.TRANSPOSE, (1,))
