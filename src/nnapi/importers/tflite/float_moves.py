"""TFLite import: int32 / bool tensors moved through float32 by operators whose NNAPI
versions take no such tensors (exact halves of 16 bits), and int32 CONCATENATION.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from nnapi.codes import OperandCode as T
from nnapi.codes import OperationCode as Op
from nnapi.importers.tflite.reader import _BOOL, _INT32, UnsupportedOperator, _operand_shape, _Operator, _static_shape
from nnapi.operand import OperandType

if TYPE_CHECKING:  # (that module imports this one)
    from nnapi.importers.tflite.converter import _Converter


#: operators that only move values, with the input positions holding them (None: all):
#: NNAPI's versions take no TENSOR_INT32 / TENSOR_BOOL8, so those are moved as float32
_MOVES_DATA: dict[str, tuple[int, ...] | None] = {
    "STRIDED_SLICE": (0,), "CONCATENATION": None, "TRANSPOSE": (0,), "SQUEEZE": (0,),
    "SPACE_TO_DEPTH": (0,), "DEPTH_TO_SPACE": (0,), "SPLIT": (1,), "SPLIT_V": (0,), "GATHER_ND": (0,)}
#: the same for operators whose NNAPI operation takes TENSOR_INT32 but not TENSOR_BOOL8
_MOVES_BOOL: dict[str, tuple[int, ...] | None] = {
    "EXPAND_DIMS": (0,), "GATHER": (0,), "SLICE": (0,), "TILE": (0,), "PACK": None, "REVERSE_V2": (0,),
    "PAD": (0,), "PADV2": (0,)}
_HALF = 1 << 16


def _float_half(c: _Converter, tensor: int, half: int) -> int:
    """float32 operand holding, exactly, the high (``half`` 0) or low (1) 16 bits of an
    int32 tensor, or a bool tensor as 1 / 0 (``half`` 0)."""
    key = (tensor, half)
    if key in c.float_halves:
        return c.float_halves[key]
    info = c.graph.tensors[tensor]
    const = c.const_of(tensor)
    dims = list(_operand_shape(info.shape))
    float_type = OperandType(T.TENSOR_FLOAT32, dims)
    if const is not None:
        data = const.data.astype(np.int64)
        if info.tfl_type == _INT32:
            data = data // _HALF if half == 0 else data % _HALF
        index = c.const_operand(data.astype(np.float32).reshape(dims), float_type)
    elif info.tfl_type == _BOOL:
        index = c.temp(float_type)
        _select_one_zero(c, c.operand(tensor), float_type, index)
    else:
        # high = min(floor(float(x) / 2**16), 2**15 - 1): float(x) may round, so high may be
        # one off floor(x / 2**16), but low = x - high * 2**16 is then still small and exact
        # in float32, and the clamp keeps high * 2**16 inside int32. (No int32 DIV: not
        # every device has one.)
        x = c.operand(tensor)
        x_type = c.type_of(x)
        rounded, scaled, floored, high = (c.temp(float_type) for _ in range(4))
        c.emit(Op.CAST, [x], [rounded])
        one = OperandType(T.TENSOR_FLOAT32, [1])
        c.emit(Op.MUL, [rounded, c.const_operand(np.array([1 / _HALF], np.float32), one), c.i32(0)], [scaled])
        c.emit(Op.FLOOR, [scaled], [floored])
        c.emit(Op.MINIMUM, [floored, c.const_operand(np.array([_HALF // 2 - 1], np.float32), one)], [high])
        high_int, high_scaled, low_int, low = c.temp(x_type), c.temp(x_type), c.temp(x_type), c.temp(float_type)
        c.emit(Op.CAST, [high], [high_int])
        c.emit(Op.MUL, [high_int, c.const_operand(np.array([_HALF], np.int32), OperandType(T.TENSOR_INT32, [1])),
                        c.i32(0)], [high_scaled])
        c.emit(Op.SUB, [x, high_scaled, c.i32(0)], [low_int])
        c.emit(Op.CAST, [low_int], [low])
        c.float_halves[(tensor, 0)], c.float_halves[(tensor, 1)] = high, low
        return c.float_halves[key]
    c.float_halves[key] = index
    return index


def _int32_concatenation(c: _Converter, op: _Operator) -> bool:
    """CONCATENATION of int32 tensors of static shapes, exactly and in few operations
    (NNAPI's CONCATENATION takes no TENSOR_INT32; GATHER and SELECT do): each input
    computed at run time is GATHERed along the axis into the output's shape (its own
    positions, index 0 elsewhere) and SELECTed into place by a constant mask; constant
    inputs are joined here. A loop body building a SLICE's begin from its counter ([i, 0,
    0]) is then one GATHER and one SELECT instead of fourteen operations on float32
    halves. False where it does not apply (unknown or zero-sized shapes, a fused
    activation, nothing computed at run time): ``_through_float32`` then moves it."""
    options = op.options("ConcatenationOptions")
    out_shape = _static_shape(c, op.out_tensor())
    shapes = [_static_shape(c, c.graph.tensors[t]) for t in op.inputs]
    if options.FusedActivationFunction() != 0 or out_shape is None or None in shapes or not out_shape:
        return False
    rank = len(out_shape)
    axis = options.Axis() + (rank if options.Axis() < 0 else 0)
    if not 0 <= axis < rank or any(len(shape) != rank or 0 in shape for shape in shapes) \
            or sum(shape[axis] for shape in shapes) != out_shape[axis]:
        return False
    constants = [c.const_of(t) for t in op.inputs]
    if all(const is not None for const in constants):
        return False
    total = out_shape[axis]
    joined = np.zeros(out_shape, np.int32)  # the constant inputs in their places
    picks: list[tuple[int, slice]] = []  # (position of a run-time input, its range on the axis)
    start = 0
    for position, (shape, const) in enumerate(zip(shapes, constants, strict=True)):
        span = slice(start, start + shape[axis])
        where = (slice(None),) * axis + (span,)
        if const is None:
            picks.append((position, span))
        else:
            joined[where] = const.data.reshape(shape)
        start = span.stop
    out_type = OperandType(T.TENSOR_INT32, out_shape)
    current = c.const_operand(joined, out_type) if len(picks) < len(op.inputs) else None
    for number, (position, span) in enumerate(picks):
        indices = np.zeros(total, np.int32)
        indices[span] = np.arange(span.stop - span.start, dtype=np.int32)
        last = number == len(picks) - 1
        gathered = c.output() if last and current is None else c.temp(out_type)
        c.emit(Op.GATHER, [c.input(position), c.i32(axis),
                           c.const_operand(indices, OperandType(T.TENSOR_INT32, [total]))], [gathered])
        if current is None:
            current = gathered
            continue
        mask = np.zeros(out_shape, np.bool_)
        mask[(slice(None),) * axis + (span,)] = True
        target = c.output() if last else c.temp(out_type)
        c.emit(Op.SELECT, [c.const_operand(mask, OperandType(T.TENSOR_BOOL8, out_shape)), gathered, current],
               [target])
        current = target
    c.lowered("CONCATENATION of TENSOR_INT32, which NNAPI's operation does not take: each input computed at run "
              "time GATHERed into the output's shape and SELECTed into place, constant inputs joined at import")
    return True


def _select_one_zero(c: _Converter, condition: int, value_type: OperandType, target: int) -> None:
    """``target`` (of ``value_type``, static) = 1 where the bool tensor ``condition`` is
    true, else 0: NNAPI's CAST takes no TENSOR_BOOL8."""
    dims = list(value_type.dimensions)
    c.emit(Op.SELECT, [condition, c.const_operand(np.ones(dims, value_type.dtype), value_type),
                       c.const_operand(np.zeros(dims, value_type.dtype), value_type)], [target])


def _through_float32(c: _Converter, op: _Operator, positions: tuple[int, ...] | None,
                     convert: Callable[[_Converter, _Operator], None]) -> None:
    """Convert an operator that only moves values of an int32 / bool tensor, which its
    NNAPI operation does not take, on float32 instead, exactly: a bool as 1.0 / 0.0; an
    int32 as its high and low 16 bits (each exact in float32), moved apart and joined."""
    out_info = op.out_tensor()
    is_bool = out_info.tfl_type == _BOOL
    positions = range(len(op.inputs)) if positions is None else positions
    moved = [op.inputs[p] for p in positions if p < len(op.inputs) and op.inputs[p] >= 0]
    if any(c.graph.tensors[t].tfl_type != out_info.tfl_type for t in moved):
        raise UnsupportedOperator("its inputs and output differ in type")
    if any(len(c.graph.tensors[t].shape) > 4 for t in op.outputs):
        # the moves above rank 4 (high_rank.py) keep no operand for such an output
        raise UnsupportedOperator(f"{op.name} of {out_info.type_name} to above rank 4 (NNAPI's data moves take "
                                  "no int32 / bool; they run on float32 halves, which the moves above rank 4 "
                                  "do not)")
    results: list[list[int]] = []
    for half in (0,) if is_bool else (0, 1):
        saved = {t: c.operands[t] for t in moved if t in c.operands}
        for tensor in moved:
            c.operands[tensor] = _float_half(c, tensor, half)
        c.float_outputs = True
        try:
            convert(c, op)
        finally:
            c.float_outputs = False
            for tensor in moved:
                c.operands.pop(tensor, None)
            c.operands.update(saved)
        results.append([c.operands.pop(t) for t in op.outputs])
    for position in range(len(op.outputs)):
        target = c.output(position)
        target_type = c.type_of(target)
        if is_bool:
            zero = c.const_operand(np.zeros(1, np.float32), OperandType(T.TENSOR_FLOAT32, [1]))
            c.emit(Op.NOT_EQUAL, [results[0][position], zero], [target])
            continue
        high, low, scaled = c.temp(target_type), c.temp(target_type), c.temp(target_type)
        c.emit(Op.CAST, [results[0][position]], [high])
        c.emit(Op.CAST, [results[1][position]], [low])
        base = c.const_operand(np.array([_HALF], np.int32), OperandType(T.TENSOR_INT32, [1]))
        c.emit(Op.MUL, [high, base, c.i32(0)], [scaled])
        c.emit(Op.ADD, [scaled, low, c.i32(0)], [target])
    c.lowered(f"{op.name} of {'TENSOR_BOOL8' if is_bool else 'TENSOR_INT32'}, which NNAPI's "
              + ("operation does not take, moved as float32 1.0 / 0.0 and compared with 0" if is_bool else
                 "operation does not take, moved exactly as float32 high and low 16 bits and joined again"))


def _inserted_ones(source: Sequence[int], target: Sequence[int]) -> list[int] | None:
    """The positions in ``target`` of size-1 dimensions inserted into ``source``, or
    None when ``target`` is not ``source`` with size-1 dimensions inserted."""
    inserted, position = [], 0
    for index, size in enumerate(target):
        if position < len(source) and size == source[position]:
            position += 1
        elif size == 1:
            inserted.append(index)
        else:
            return None
    return inserted if position == len(source) else None


def _reshape_other_type(c: _Converter, op: _Operator, x: int, dims: list[int] | None) -> None:
    """RESHAPE of a TENSOR_INT32 / TENSOR_BOOL8 tensor, which NNAPI's RESHAPE does not
    take: nothing when the NNAPI shapes are equal (a rank-0 tensor is [1]), EXPAND_DIMS
    when it only inserts size-1 dimensions, else an exact round trip through float32."""
    x_type = c.type_of(x)
    if dims is None or not x_type.is_fully_specified:
        raise UnsupportedOperator(f"RESHAPE of a {x_type.type.name} tensor needs static shapes (NNAPI's "
                                  f"RESHAPE takes no {x_type.type.name})")
    source = list(x_type.dimensions)
    if source == dims:
        c.operands[op.outputs[0]] = x
        c.lowered(f"RESHAPE of {x_type.type.name} to the same NNAPI shape {dims}: the output is the input")
        return
    inserted = _inserted_ones(source, dims) if x_type.type == T.TENSOR_INT32 else None
    if inserted is not None:  # NNAPI's EXPAND_DIMS takes TENSOR_INT32
        current = x
        for step, axis in enumerate(inserted):
            # the later insertions lie further right, so the earlier axes are all in place
            later = set(inserted[step + 1:])
            target = c.output() if step == len(inserted) - 1 else \
                c.temp(x_type, [d for i, d in enumerate(dims) if i not in later])
            c.emit(Op.EXPAND_DIMS, [current, c.i32(axis)], [target])
            current = target
        c.lowered(f"RESHAPE of {x_type.type.name} that inserts size-1 dimensions as EXPAND_DIMS")
        return
    if x_type.type not in (T.TENSOR_INT32, T.TENSOR_BOOL8):
        raise UnsupportedOperator(f"RESHAPE of a {x_type.type.name} tensor has no NNAPI equivalent")
    _through_float32(c, op, (0,), lambda c, op: c.emit(Op.RESHAPE, [c.input(0), c.vector(dims)], [c.output()]))
