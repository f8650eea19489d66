"""An int32 tensor the TFLite importer reshapes through float32 halves, lowered as one int32
Reshape.

NNAPI's RESHAPE (SQUEEZE, EXPAND_DIMS) takes no TENSOR_INT32, so the importer moves an int32
tensor t as two float32 tensors, exactly (importers/tflite/float_moves.py, _through_float32 and
_float_half): high = MINIMUM(FLOOR(CAST(t) * 2**-16), 2**15 - 1), low = CAST(t - CAST(high)
* 2**16), each moved, then joined as CAST(high') * 2**16 + CAST(low'). That is t moved, for
every int32 (high may be one off floor(t / 2**16) where float32 rounds t, low then absorbs
it; the clamp keeps high * 2**16 inside int32), in 14 operations, which ORT ran as ~33 nodes
(each float-to-int32 CAST saturates and maps NaN: six nodes): ~50 us of sdpa PT2E's
~470 (its token ids, [1, 64] -> [64], before the EMBEDDING_LOOKUP). Recognised at the
joining ADD by the operations and constants the importer writes, the two moves the same
operation with the same parameters (a reshape, or a STRIDED_SLICE of the whole tensor); the
halves' own nodes, read by nothing else then, are dropped with the graph's unread nodes
(lowering.py).
"""

from __future__ import annotations

import numpy as np

from nnapi.codes import FuseCode, OperandCode, OperationCode
from nnapi.drivers.ort.builder import GraphBuilder
from nnapi.hal import OperandLifeTime, Operation

T = OperandCode
Op = OperationCode
L = OperandLifeTime
_HALF = 1 << 16
#: the moves recognised: each of them a reshape of the static input into the static output
_MOVES = (Op.RESHAPE, Op.SQUEEZE, Op.EXPAND_DIMS)


def rejoined_move(g: GraphBuilder, operation: Operation) -> bool:
    """Lowers ADD ``operation`` as one Reshape of the int32 tensor where it joins the halves
    of one moved as above; False, with nothing emitted, otherwise."""
    output = g.operand(operation.outputs[0])
    if operation.type != Op.ADD or output.type != T.TENSOR_INT32 or not all(output.dimensions) or \
            not _no_activation(g, operation):
        return False
    for scaled, low in (operation.inputs[:2], operation.inputs[1::-1]):
        high = _times_half(g, scaled, T.TENSOR_INT32)
        high_move, low_move = (_producer(g, i, Op.CAST) for i in (high, low))
        if high_move is None or low_move is None:
            continue
        moves = [_producer(g, cast.inputs[0], *_MOVES, Op.STRIDED_SLICE) for cast in (high_move, low_move)]
        if None in moves or not _same_move(g, *moves) or not all(map(_reshapes, [g] * 2, moves)):
            continue
        source = _split(g, moves[0].inputs[0], moves[1].inputs[0])
        if source is None or list(g.operand(source).dimensions) == [] or not all(g.operand(source).dimensions):
            continue
        shape = g.constant(np.array(output.dimensions, np.int64))
        g.set_output(operation.outputs[0], g.one("Reshape", [g.value(source).name, shape]))
        return True
    return False


def _reshapes(g: GraphBuilder, move: Operation) -> bool:
    """Whether ``move`` moves every element in order: a reshape (_MOVES), or a
    STRIDED_SLICE of stride 1 that keeps every dimension (BERT-like models slice their
    [1, 1, T] mask whole), whose output is then its input as it is."""
    if move.type != Op.STRIDED_SLICE:
        return True
    strides = g.raw_constant(move.inputs[3])
    shrink = g.raw_constant(move.inputs[6]) if len(move.inputs) > 6 else np.zeros(1, np.int32)
    return strides is not None and shrink is not None and bool(np.all(strides == 1)) and \
        not int(shrink.reshape(-1)[0]) and \
        list(g.operand(move.inputs[0]).dimensions) == list(g.operand(move.outputs[0]).dimensions)


def _producer(g: GraphBuilder, index: int | None, *codes: int) -> Operation | None:
    """The operation of one of ``codes`` writing ``index``, read by nothing else."""
    if index is None:
        return None
    operation = g.producer(index)
    if operation is None or operation.type not in codes or index in g.subgraph.output_indexes:
        return None
    return operation


def _no_activation(g: GraphBuilder, operation: Operation) -> bool:
    fuse = g.raw_constant(operation.inputs[2]) if len(operation.inputs) > 2 else None
    return fuse is not None and int(fuse.reshape(-1)[0]) == FuseCode.FUSED_NONE


def _constant(g: GraphBuilder, index: int, code: int, value: float) -> bool:
    """Whether ``index`` is a constant of ``code`` holding the one value ``value``."""
    operand = g.operand(index)
    if operand.type != code or operand.lifetime not in (L.CONSTANT_COPY, L.CONSTANT_REFERENCE):
        return False
    array = g.raw_constant(index)
    return array is not None and array.size == 1 and float(array.reshape(-1)[0]) == value


def _times_half(g: GraphBuilder, index: int, code: int) -> int | None:
    """x where ``index`` is MUL(x, 2**16) of type ``code`` (either order, no activation)."""
    multiply = _producer(g, index, Op.MUL)
    if multiply is None or not _no_activation(g, multiply) or g.operand(index).type != code:
        return None
    for x, factor in (multiply.inputs[:2], multiply.inputs[1::-1]):
        if _constant(g, factor, T.TENSOR_INT32 if code == T.TENSOR_INT32 else T.TENSOR_FLOAT32, float(_HALF)):
            return x
    return None


def _same_move(g: GraphBuilder, a: Operation, b: Operation) -> bool:
    """Whether moves ``a`` and ``b`` are one operation with equal constant parameters and
    equal static shapes."""
    if a.type != b.type or len(a.inputs) != len(b.inputs):
        return False
    for i, j in zip(a.inputs[1:], b.inputs[1:]):
        x, y = g.raw_constant(i), g.raw_constant(j)
        if x is None or y is None or not np.array_equal(x, y):
            return False
    return all(list(g.operand(x.inputs[0]).dimensions) == list(g.operand(a.inputs[0]).dimensions) and
               list(g.operand(x.outputs[0]).dimensions) == list(g.operand(a.outputs[0]).dimensions)
               for x in (b,))


def _split(g: GraphBuilder, high: int, low: int) -> int | None:
    """t where float32 ``high`` and ``low`` are the importer's halves of int32 t."""
    minimum = _producer(g, high, Op.MINIMUM)
    if minimum is None or g.operand(high).type != T.TENSOR_FLOAT32:
        return None
    floored = next((x for x, bound in (minimum.inputs[:2], minimum.inputs[1::-1])
                    if _constant(g, bound, T.TENSOR_FLOAT32, float(_HALF // 2 - 1))), None)
    floor = _producer(g, floored, Op.FLOOR)
    multiply = _producer(g, floor.inputs[0], Op.MUL) if floor is not None else None
    if multiply is None or not _no_activation(g, multiply):
        return None
    rounded = next((x for x, factor in (multiply.inputs[:2], multiply.inputs[1::-1])
                    if _constant(g, factor, T.TENSOR_FLOAT32, 1.0 / _HALF)), None)
    cast = _producer(g, rounded, Op.CAST)
    if cast is None or g.operand(cast.inputs[0]).type != T.TENSOR_INT32:
        return None
    source = cast.inputs[0]
    # low = CAST(SUB(t, MUL(CAST(high), 2**16)))
    low_cast = _producer(g, low, Op.CAST)
    subtract = _producer(g, low_cast.inputs[0], Op.SUB) if low_cast is not None else None
    if subtract is None or not _no_activation(g, subtract) or subtract.inputs[0] != source:
        return None
    high_int = _times_half(g, subtract.inputs[1], T.TENSOR_INT32)
    high_cast = _producer(g, high_int, Op.CAST)
    if high_cast is None or high_cast.inputs[0] != high:
        return None
    return source
