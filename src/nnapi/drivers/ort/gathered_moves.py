"""A PACK or CONCATENATION of pieces cut from one small tensor by moves (RESHAPE, SQUEEZE,
EXPAND_DIMS, STRIDED_SLICE, SLICE, TRANSPOSE with constant parameters) as one Gather of
that tensor's elements: a decode head picks a keypoint's own offsets out of the [K, K, 2]
it gathered for every keypoint with K STRIDED_SLICEs and a PACK (MoveNet: 5 Slices, 5
Squeezes and a Concat, ~0.4 us a node, where one Gather reads the 10 values).

Which element of the source each output element is follows from the shapes and the
constant parameters alone: preparation runs the reference's own operations (the moves,
then the PACK / CONCATENATION) on the source's element positions (int32 0..n-1 in its
shape) and gathers by the positions that come out. Only where every piece and the output
keep the source's quantization (the moves do; a CONCATENATION into another quantization
requantizes and keeps its lowering), the source's shape is known and it has at most
MAX_ELEMENTS elements (the positions are a constant of the output's size).
"""

from __future__ import annotations

import numpy as np

from nnapi.codes import OperandCode, OperationCode
from nnapi.drivers.ort.builder import GraphBuilder
from nnapi.hal import OperandLifeTime, Operation
from nnapi.operand import OperandType
from nnapi.operations import ExecutionContext, Tensor, get_operation

Op = OperationCode

#: moves whose data input is their first, the others constant parameters
_MOVES = (Op.RESHAPE, Op.SQUEEZE, Op.EXPAND_DIMS, Op.STRIDED_SLICE, Op.SLICE, Op.TRANSPOSE)
#: the largest source whose element positions are worked out
MAX_ELEMENTS = 4096
_CONSTANT = (OperandLifeTime.CONSTANT_COPY, OperandLifeTime.CONSTANT_REFERENCE)


def gathered_moves(g: GraphBuilder, operation: Operation) -> bool:
    """``operation`` (a PACK / CONCATENATION) lowered as a Gather of its pieces' common
    source where they are all cut from it by moves (see the module's docstring), its
    output set; False where it does not apply."""
    code = operation.type
    if g.isolated or code not in (Op.PACK, Op.CONCATENATION) or len(operation.outputs) != 1:
        return False
    pieces = list(operation.inputs[1:] if code == Op.PACK else operation.inputs[:-1])
    axis_index = operation.inputs[0] if code == Op.PACK else operation.inputs[-1]
    output = g.operand(operation.outputs[0])
    if len(pieces) < 2 or g.operand(axis_index).lifetime not in _CONSTANT or not _small(output.dimensions):
        return False
    source, chains = None, []
    for piece in pieces:
        chain, current = [], piece
        while True:
            producer = g.producer(current)
            if (producer is None or producer.type not in _MOVES or len(producer.outputs) != 1
                    or any(g.operand(i).lifetime not in _CONSTANT for i in producer.inputs[1:])):
                break
            chain.append(producer)
            current = producer.inputs[0]
        if not chain or (source is not None and current != source):
            return False
        source = current
        chains.append(chain[::-1])
    assert source is not None
    origin = g.operand(source)
    if not _small(origin.dimensions):
        return False
    quantization = (origin.type, origin.scale, origin.zero_point)
    operands = [g.operand(o.outputs[0]) for chain in chains for o in chain] + [output]
    if any((o.type, o.scale, o.zero_point) != quantization or not all(o.dimensions) for o in operands):
        return False
    try:
        positions = _positions(g, operation, chains, origin.dimensions)
    except Exception:  # noqa: BLE001  (the reference refuses the moves: their lowerings say why)
        return False
    if positions is None or list(positions.shape) != list(output.dimensions):
        return False
    value = g.value(source)
    if value.dims != list(origin.dimensions):
        return False  # held in another shape (a product's rows): its element order is not asserted
    flat = g.one("Reshape", [value.name, g.constant(np.array([-1], np.int64))])
    g.set_output(operation.outputs[0],
                 g.one("Gather", [flat, g.constant(positions.astype(np.int64), "positions")], axis=0))
    return True


def _small(dims: list[int]) -> bool:
    return bool(dims) and all(dims) and int(np.prod(dims, dtype=np.int64)) <= MAX_ELEMENTS


def _positions(g: GraphBuilder, operation: Operation, chains: list[list[Operation]],
               dims: list[int]) -> np.ndarray | None:
    """The source position of each output element: the reference's moves and join run on
    the source's positions (int32 in its shape)."""
    start = np.arange(int(np.prod(dims)), dtype=np.int32).reshape(dims)
    pieces = []
    for chain in chains:
        value = start
        for move in chain:
            value = _run(g, move, {0: value})
        pieces.append(value)
    data = range(1, len(operation.inputs)) if operation.type == Op.PACK else range(len(operation.inputs) - 1)
    return _run(g, operation, dict(zip(data, pieces, strict=True)))


def _run(g: GraphBuilder, operation: Operation, given: dict[int, np.ndarray]) -> np.ndarray:
    """The reference's ``operation`` with the inputs at ``given`` positions replaced by int32
    arrays (the others its constants), its output as int32."""
    tensors = []
    for position, index in enumerate(operation.inputs):
        operand = g.operand(index)
        if position in given:
            array = given[position]
            tensors.append(Tensor(OperandCode.TENSOR_INT32, tuple(array.shape), 0.0, 0, None, array))
        else:
            array = g.raw_constant(index)
            tensors.append(Tensor(operand.type, tuple(array.shape), operand.scale, operand.zero_point,
                                  operand.channel_quant, array))
    out = OperandType(OperandCode.TENSOR_INT32, list(g.operand(operation.outputs[0]).dimensions))
    return np.asarray(get_operation(operation.type).execute(ExecutionContext(operation.type, tensors, [out]))[0])


def identity_move(g: GraphBuilder, operation: Operation) -> bool:
    """A STRIDED_SLICE / SLICE / TRANSPOSE that keeps every element where it is (the whole
    tensor, the converter's slice [0:n] of a decode head's [1, K, 1] scores: ORT runs it as a
    node) as its input itself, its output set: the reference's own operation on the
    element positions gives them back unchanged, the shape and quantization kept. False
    where it does not apply."""
    if g.isolated or operation.type not in (Op.STRIDED_SLICE, Op.SLICE, Op.TRANSPOSE) or len(operation.outputs) != 1:
        return False
    source, output = g.operand(operation.inputs[0]), g.operand(operation.outputs[0])
    if (list(source.dimensions) != list(output.dimensions) or not _small(output.dimensions)
            or (source.type, source.scale, source.zero_point) != (output.type, output.scale, output.zero_point)
            or any(g.operand(i).lifetime not in _CONSTANT for i in operation.inputs[1:])):
        return False
    value = g.value(operation.inputs[0])
    if value.dims != list(output.dimensions):
        return False
    start = np.arange(int(np.prod(output.dimensions)), dtype=np.int32).reshape(output.dimensions)
    try:
        moved = _run(g, operation, {0: start})
    except Exception:  # noqa: BLE001  (the reference refuses it: its lowering says why)
        return False
    if moved.shape != start.shape or not np.array_equal(moved, start):
        return False
    g.values[operation.outputs[0]] = value
    return True
