"""TFLite import: tensors above NNAPI's rank 4: chains and trees of element moves traced
and re-expressed at rank <= 4, RESHAPEs up lifted, arithmetic on merged axes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from nnapi.codes import OperationCode
from nnapi.codes import OperationCode as Op
from nnapi.importers.tflite.converter import _FIRST_CONVERTERS, _Converter
from nnapi.importers.tflite.convolutions import _fully_connected
from nnapi.importers.tflite.data_movement import _dense_slice_spec
from nnapi.importers.tflite.moves import move_plan
from nnapi.importers.tflite.quantization import _dequantize_operand, _quantize_operand
from nnapi.importers.tflite.reader import (
    _FLOAT16,
    _FLOAT32,
    _FLOAT_TYPES,
    _QUANT8,
    _RESHAPE_TYPES,
    UnsupportedOperator,
    _Operator,
    _static_shape,
)
from nnapi.operand import OperandType
from nnapi.operations.arithmetic import quantized_mul_scales_allowed
from nnapi.operations.common import nearest_indexes

#: NNAPI's tensors have rank 4 at most (RESHAPE, TILE, TRANSPOSE, ...)
_MAX_RANK = 4
#: the largest tensor whose element positions _high_rank_chain traces (int64 each)
_CHAIN_ELEMENTS = 1 << 24


def _chain_step(c: _Converter, op: _Operator, index: np.ndarray) -> np.ndarray | None:
    """``index`` (the input positions a tensor holds) moved by RESHAPE / EXPAND_DIMS / TILE /
    BROADCAST_TO / TRANSPOSE ``op`` with constant parameters; None for any other operator."""
    out, source = op.out_tensor(), op.tensor(0)
    dims = _static_shape(c, out)
    if op.custom is not None or len(op.outputs) != 1 or dims is None or len(out.shape) == 0 or \
            (out.tfl_type, out.scales, out.zero_points) != (source.tfl_type, source.scales, source.zero_points):
        return None
    if op.name in ("RESHAPE", "EXPAND_DIMS") and int(np.prod(dims)) == index.size:
        return index.reshape(dims)
    param = c.const_of(op.inputs[1]) if op.has_input(1) else None
    if param is None:
        return None
    values = param.data.reshape(-1).astype(np.int64)
    if op.name == "TILE" and len(values) == index.ndim and values.min() >= 1 and \
            int(np.prod(dims)) <= _CHAIN_ELEMENTS:
        moved = np.tile(index, values)
    elif op.name == "BROADCAST_TO" and int(np.prod(dims)) <= _CHAIN_ELEMENTS:
        try:
            moved = np.broadcast_to(index, dims)
        except ValueError:
            return None
    elif op.name == "TRANSPOSE" and sorted(values.tolist()) == list(range(index.ndim)):
        moved = index.transpose(values)
    else:
        return None
    return moved if list(moved.shape) == dims else None


def _merged_transpose(dims: Sequence[int], perm: Sequence[int]) -> tuple[list[int], list[int]]:
    """The smallest (dims, perm) moving elements as TRANSPOSE ``perm`` of a ``dims`` tensor:
    size-1 axes dropped, runs of axes that stay neighbours merged into one."""
    kept = [axis for axis in range(len(dims)) if dims[axis] != 1]
    renumber = {axis: k for k, axis in enumerate(kept)}
    order = [renumber[axis] for axis in perm if dims[axis] != 1]
    groups: list[list[int]] = []  # runs of input axes, in output order
    for axis in order:
        if groups and groups[-1][-1] + 1 == axis:
            groups[-1].append(axis)
        else:
            groups.append([axis])
    by_input = sorted(range(len(groups)), key=lambda g: groups[g][0])
    merged = [int(np.prod([dims[kept[a]] for a in groups[g]])) for g in by_input]
    return merged, [by_input.index(g) for g in range(len(groups))]


def _lifted_shape(c: _Converter, op: _Operator) -> list[int] | None:
    """The static shape of ``op``'s input where ``op`` lifts a computed (or already
    converted) tensor of rank 1-4 above NNAPI's rank 4 and it is small enough to trace
    element by element; None otherwise."""
    source, out = op.tensor(0), op.out_tensor()
    shape = _static_shape(c, source)
    if len(out.shape) <= _MAX_RANK or shape is None or len(source.shape) == 0 or \
            len(source.shape) > _MAX_RANK or int(np.prod(shape)) > _CHAIN_ELEMENTS or \
            (c.const_of(op.inputs[0]) is not None and op.inputs[0] not in c.operands):
        return None
    return shape


def _high_rank_chain(c: _Converter, op: _Operator) -> bool:
    """Convert ``op`` and the operators after it when ``op`` lifts a tensor of rank <= 4
    above NNAPI's rank 4 and a chain of single readers (RESHAPE, EXPAND_DIMS, TILE,
    BROADCAST_TO, TRANSPOSE with constant parameters) brings it back, as Keras writes
    UpSampling2D (repeat: rank-5 RESHAPE + TILE) and window or pixel shuffles (rank-6
    TRANSPOSE). Such a chain only moves elements: the input position of each output
    element, traced here on the static shapes, is matched to an exact rank-4 form: per-axis
    GATHERs (RESIZE_NEAREST_NEIGHBOR where they are its indexes) or RESHAPE + TRANSPOSE +
    RESHAPE. One FULLY_CONNECTED keeping its input's rank may sit in the chain before any
    element moved (a Swin window merge: the attention's output projection on the rank-6
    windows): it acts on each row of the last axis alone, so it runs on the rows as they
    are, [rows, depth], and the moves after it follow. False (nothing emitted) when there
    is no such chain or form."""
    shape = _lifted_shape(c, op)
    if shape is None:
        return False
    # the operand type, before the trace (up to _CHAIN_ELEMENTS positions through every step)
    known = c.operands.get(op.inputs[0])
    if known is not None and c.type_of(known).type not in _RESHAPE_TYPES:
        return False
    index = _chain_step(c, op, np.arange(int(np.prod(shape)), dtype=np.int64).reshape(shape))
    chain, transposes, rows = [op], [], None
    while index is not None and index.ndim > _MAX_RANK:
        tensor = chain[-1].outputs[0]
        readers = c.readers(tensor)
        if tensor in c.graph.outputs or len(readers) != 1 or readers[0][1] != 0:
            return False
        reader = readers[0][0]
        chain.append(reader)
        if reader.name == "FULLY_CONNECTED":
            rows = _rows_before(c, reader, index, rows)
            if rows is None:
                return False
            index = np.arange(int(np.prod(rows[1]))).reshape(rows[1])
            continue
        if reader.name == "TRANSPOSE":
            perm = c.const_of(reader.inputs[1])
            if perm is None:
                return False
            transposes.append((list(index.shape), perm.data.reshape(-1).tolist()))
        index = _chain_step(c, reader, index)
    if index is None:
        return False
    x = c.input(0)  # (``known``, checked above: a tensor no operator wrote yet raises here)
    if rows is not None:
        shape = [int(np.prod(rows[1][:-1])), rows[1][-1]]
    picks = _gather_plan(shape, index)
    moves = _transpose_plan(index, *transposes[0]) if picks is None and len(transposes) == 1 else None
    if picks is None and moves is None:
        return False
    last = chain[-1]
    if rows is not None:
        x = _rows_fully_connected(c, rows[0], x)
    emitted = _emit_gathers(c, last, x, shape, index, picks) if picks is not None else \
        _emit_transpose(c, last, x, shape, index, *moves)
    c.absorbed.update(reader.index for reader in chain[1:])
    names = " + ".join(step.name for step in chain)
    c.lowered(f"{names} through rank {max(len(step.out_tensor().shape) for step in chain)} only moves "
              f"elements: {emitted}")
    return True


def _tree_step(c: _Converter, op: _Operator, index: np.ndarray) -> np.ndarray | None:
    """``index`` moved by ``op`` as _chain_step does, and also by SQUEEZE, SLICE and
    STRIDED_SLICE with constant parameters; None for any other operator."""
    if op.name not in ("SQUEEZE", "SLICE", "STRIDED_SLICE"):
        return _chain_step(c, op, index)
    out, source = op.out_tensor(), op.tensor(0)
    dims = _static_shape(c, out)
    if op.custom is not None or len(op.outputs) != 1 or dims is None or \
            (out.tfl_type, out.scales, out.zero_points) != (source.tfl_type, source.scales, source.zero_points):
        return None
    if op.name == "SQUEEZE":
        return index.reshape(dims) if int(np.prod(dims)) == index.size else None
    params = [c.const_of(op.inputs[k]) if op.has_input(k) else None for k in range(1, len(op.inputs))]
    if any(p is None for p in params):
        return None
    values = [p.data.reshape(-1).astype(np.int64) for p in params]
    if op.name == "SLICE":
        begin, size = values
        if len(begin) != index.ndim or len(size) != index.ndim or begin.min(initial=0) < 0:
            return None
        moved = index[tuple(slice(b, None if n < 0 else b + n) for b, n in zip(begin, size))]
    else:
        options = op.options("StridedSliceOptions")
        if options is None or (hasattr(options, "Offset") and options.Offset()):
            return None
        begin, end = values[0], values[1]
        strides = values[2] if len(values) > 2 else np.ones_like(begin)
        try:
            spec, begin_mask, end_mask, shrink, out_axes = _dense_slice_spec(
                index.ndim, begin, end, strides, options.BeginMask(), options.EndMask(), options.ShrinkAxisMask(),
                options.EllipsisMask(), options.NewAxisMask())
        except UnsupportedOperator:
            return None
        picks: list[Any] = []
        for axis, (b, e, s) in enumerate(spec):
            if s == 0:
                return None
            if shrink >> axis & 1:
                if begin_mask >> axis & 1 or not -index.shape[axis] <= b < index.shape[axis]:
                    return None
                picks.append(int(b))
            else:
                picks.append(slice(None if begin_mask >> axis & 1 else b, None if end_mask >> axis & 1 else e, s))
        moved = index[tuple(picks)]
        moved = moved.reshape([1 if new else d for new, d in zip(out_axes, dims)]) if \
            len(out_axes) == len(dims) and int(np.prod(dims)) == moved.size else moved
    return moved if list(moved.shape) == dims else None


#: per-tensor element-wise operators a branch of element moves may carry (_high_rank_tree):
#: they commute with the moves, so each runs on the branch's end (operand, target) instead
_TREE_ELEMENTWISE: dict[str, Callable[[_Converter, int, int], None]] = {
    "QUANTIZE": _quantize_operand, "DEQUANTIZE": _dequantize_operand}


def _elementwise_step(c: _Converter, op: _Operator, index: np.ndarray) -> bool:
    """Whether ``op`` is a QUANTIZE / DEQUANTIZE of the branch's tensor (``index``'s
    shape) that acts on each element alone: per-tensor scales, static shape kept."""
    if op.name not in _TREE_ELEMENTWISE or op.custom is not None or len(op.outputs) != 1 or \
            _static_shape(c, op.out_tensor()) != list(index.shape):
        return False
    return not op.tensor(0).per_channel and not op.out_tensor().per_channel


def _high_rank_tree(c: _Converter, op: _Operator) -> bool:
    """Convert ``op`` and every operator after it when ``op`` lifts a tensor of rank <= 4
    above NNAPI's rank 4 and the operators reading it (several, each a branch of element
    moves: RESHAPE, TRANSPOSE, SLICE, STRIDED_SLICE, SQUEEZE, ... with constant parameters)
    bring every branch back to rank <= 4, as attention's query / key / value split is
    written (moves.py). Each branch's end is computed from ``op``'s input by one
    RESHAPE / STRIDED_SLICE / TRANSPOSE / RESHAPE plan. False (nothing emitted) when a
    branch does anything else or has no such plan."""
    shape = _lifted_shape(c, op)
    if shape is None:
        return False
    known = c.operands.get(op.inputs[0])
    if known is not None and c.type_of(known).type not in (*_FLOAT_TYPES, *_QUANT8):
        return False
    first = _chain_step(c, op, np.arange(int(np.prod(shape)), dtype=np.int64).reshape(shape))
    if first is None:
        return False
    pending: list[tuple[_Operator, np.ndarray, tuple[_Operator, ...]]] = [(op, first, ())]
    inner, leaves = [op], []
    while pending:
        step, index, elementwise = pending.pop()
        if index.ndim <= _MAX_RANK:
            leaves.append((step, index, elementwise))
            continue
        tensor = step.outputs[0]
        readers = c.readers(tensor)
        if tensor in c.graph.outputs or not readers or any(slot != 0 for _, slot in readers):
            return False
        for reader, _ in readers:
            if _elementwise_step(c, reader, index):
                inner.append(reader)
                pending.append((reader, index, (*elementwise, reader)))
                continue
            moved = _tree_step(c, reader, index)
            if moved is None:
                return False
            inner.append(reader)
            pending.append((reader, moved, elementwise))
    plans = [(leaf, index, move_plan(shape, index), elementwise) for leaf, index, elementwise in leaves]
    if any(plan is None for _, _, plan, _ in plans):
        return False
    x = c.input(0)
    like = c.type_of(x)
    for leaf, index, plan, elementwise in sorted(plans, key=lambda item: item[0].index):
        final = list(index.shape)
        steps: list[tuple[Any, ...]] = []
        if plan.sliced_from != shape:
            steps.append((Op.RESHAPE, [c.vector(plan.sliced_from)], plan.sliced_from))
        if plan.begin is not None:
            kept = [len(range(b, e, s)) for b, e, s in zip(plan.begin, plan.end, plan.strides)]
            steps.append((Op.STRIDED_SLICE, [c.vector(plan.begin), c.vector(plan.end), c.vector(plan.strides),
                                             c.i32(0), c.i32(0), c.i32(0)], kept))
        if plan.order is not None:
            if (steps[-1][2] if steps else shape) != plan.moved_from:
                steps.append((Op.RESHAPE, [c.vector(plan.moved_from)], plan.moved_from))
            steps.append((Op.TRANSPOSE, [c.vector(plan.order)], [plan.moved_from[k] for k in plan.order]))
        if (steps[-1][2] if steps else shape) != final:
            steps.append((Op.RESHAPE, [c.vector(final)], final))
        # the moves on the source's elements, then the branch's element-wise operators in
        # order on its end (the last one writing the leaf's output)
        current = x
        for k, (code, params, dims) in enumerate(steps):
            last = k == len(steps) - 1 and not elementwise
            target = _chain_output(c, leaf) if last else c.temp(like, dims)
            c.emit(code, [current, *params], [target])
            current = target
        if not steps and not elementwise:
            c.identity(x, _chain_output(c, leaf))
        for k, step in enumerate(elementwise):
            target = _chain_output(c, leaf) if k == len(elementwise) - 1 else \
                c.add(c.nn_type(step.out_tensor(), final))
            _TREE_ELEMENTWISE[step.name](c, current, target)
            current = target
    c.absorbed.update(step.index for step in inner[1:])
    carried = sorted({step.name for step in inner if step.name in _TREE_ELEMENTWISE})
    c.lowered(f"{len(leaves)} branches of element moves through rank "
              f"{max(len(step.out_tensor().shape) for step in inner)} (operators "
              f"{sorted(step.index for step in inner)}): each a rank-4 RESHAPE / STRIDED_SLICE / TRANSPOSE / RESHAPE"
              + (f", then its {' / '.join(carried)} on the branch's end" if carried else ""))
    return True


def _lift(c: _Converter, op: _Operator, static: list[int] | None) -> bool:
    """RESHAPE ``op`` to above rank 4 (that no chain or tree of moves brings back) kept as
    its input's operand (c.lifted) for readers that need no rank-5 operand: a RESHAPE back
    down, arithmetic on merged axes. A RESHAPE of a lifted tensor is one RESHAPE of its
    operand, or stays lifted. False where the RESHAPE is emitted as written."""
    tensor = op.inputs[0]
    if static is None or c.graph.propagate:
        return False
    if tensor in c.lifted and tensor not in c.operands:
        source = c.lifted[tensor][0]
        if len(static) > _MAX_RANK:
            c.lifted[op.outputs[0]] = (source, static)
        else:
            c.emit(Op.RESHAPE, [source, c.vector(static)], [c.output()])
        c.lowered("a RESHAPE of a tensor above rank 4, from the rank <= 4 operand holding its elements")
        return True
    if len(static) <= _MAX_RANK or tensor not in c.operands or \
            c.type_of(c.operands[tensor]).type not in _RESHAPE_TYPES or \
            len(c.type_of(c.operands[tensor]).dimensions) > _MAX_RANK:
        return False
    c.lifted[op.outputs[0]] = (c.operands[tensor], static)
    return True


def _merged_broadcast(shapes: list[list[int]], out: list[int]) -> list[list[int]] | None:
    """Each input's shape, and the output's (last), with the output's size-1 axes dropped
    and neighbouring axes merged where every input is either whole or broadcast on both;
    None when an input's axis is neither the output's nor 1."""
    aligned = [[1] * (len(out) - len(shape)) + list(shape) for shape in shapes]
    groups: list[tuple[tuple[bool, ...], list[int]]] = []
    for axis, size in enumerate(out):
        if size == 1:
            continue
        if any(shape[axis] not in (1, size) for shape in aligned):
            return None
        pattern = tuple(shape[axis] == size for shape in aligned)
        if groups and groups[-1][0] == pattern:
            groups[-1][1].append(axis)
        else:
            groups.append((pattern, [axis]))
    merged = [[int(np.prod([out[a] for a in axes])) if pattern[k] else 1 for pattern, axes in groups]
              for k in range(len(shapes))]
    return [shape or [1] for shape in merged] + [[int(np.prod([out[a] for a in axes])) for _, axes in groups]
                                                 or [1]]


def _lifted_arithmetic(c: _Converter, op: _Operator, code: OperationCode, activation: int) -> bool:
    """Float ADD / SUB / MUL / DIV above rank 4 whose inputs are lifted tensors, constants or
    operands of static shape: computed on merged axes (_merged_broadcast, rank <= 4) and
    kept lifted, as attention adds its mask per window (Swin, through ai-edge-torch: two
    RESHAPEs to rank 5, ADD, RESHAPE back); quantized ADD / SUB, and MUL whose scales meet
    NNAPI's condition, likewise (an int8 GroupNormalization's statistics). False (nothing
    emitted) otherwise."""
    out = _static_shape(c, op.out_tensor())
    if out is None or c.graph.propagate:
        return False
    out_type = c.nn_type(op.out_tensor())
    if out_type.type in _QUANT8:
        # quantized ADD / SUB are NNAPI's as written; MUL where NNAPI's own condition on the
        # scales holds (else _arithmetic's float32 form, which needs the operand at rank 5)
        a_type, b_type = c.nn_type(op.tensor(0)), c.nn_type(op.tensor(1))
        if code not in (Op.ADD, Op.SUB, Op.MUL) or code == Op.MUL and \
                not quantized_mul_scales_allowed(a_type.scale, b_type.scale, out_type.scale):
            return False
    elif op.out_tensor().tfl_type not in (_FLOAT32, _FLOAT16):
        return False
    sources, shapes = [], []
    for position in (0, 1):
        tensor = op.inputs[position]
        info = op.tensor(position)
        if tensor in c.lifted and tensor not in c.operands:
            sources.append(c.lifted[tensor][0])
        elif tensor in c.operands or c.const_of(tensor) is not None:
            sources.append(None)
        else:
            return False
        shape = _static_shape(c, info)
        if shape is None:
            return False
        shapes.append(shape)
    merged = _merged_broadcast(shapes, out)
    if merged is None or any(len(shape) > _MAX_RANK for shape in merged):
        return False
    operands = []
    for position, (source, shape) in enumerate(zip(sources, merged[:2])):
        tensor = op.inputs[position]
        const = c.const_of(tensor)
        if source is None and const is not None and tensor not in c.operands:
            data = const.data.reshape(shape)
            operands.append(c.const_operand(data, OperandType(const.code, shape, const.scale, const.zero_point)))
            continue
        source = c.operand(tensor) if source is None else source
        if list(c.type_of(source).dimensions) == shape:
            operands.append(source)
            continue
        reshaped = c.temp(c.type_of(source), shape)
        c.emit(Op.RESHAPE, [source, c.vector(shape)], [reshaped])
        operands.append(reshaped)
    result = c.add(out_type.with_dimensions(merged[2]))
    c.with_activation(activation, lambda act, target: c.emit(code, [*operands, act], [target]), result)
    c.lifted[op.outputs[0]] = (result, out)
    c.lowered(f"{op.name} of rank {len(out)} on merged axes {merged[2]} (inputs {merged[0]} and {merged[1]})")
    return True


def _rows_before(c: _Converter, fc: _Operator, index: np.ndarray, rows) -> tuple[_Operator, list[int]] | None:
    """(``fc``, its output's shape) when FULLY_CONNECTED ``fc`` keeps its input's rank
    (acting on each row of the last axis) and reads the chain's rows unmoved; else None."""
    options = fc.options("FullyConnectedOptions")
    dims = _static_shape(c, fc.out_tensor())
    if rows is not None or options is None or not options.KeepNumDims() or len(fc.outputs) != 1 or \
            dims is None or not np.array_equal(index.reshape(-1), np.arange(index.size)):
        return None
    return fc, dims


def _rows_fully_connected(c: _Converter, fc: _Operator, x: int) -> int:
    """FULLY_CONNECTED ``fc`` on the rows of ``x`` (as [rows, depth]): a [rows, units] operand."""
    x_type = c.type_of(x)
    depth = fc.tensor(0).shape[-1]
    flat = x
    if list(x_type.dimensions)[1:] != [depth] or len(x_type.dimensions) != 2:
        flat = c.temp(x_type, [int(np.prod(x_type.dimensions)) // depth, depth])
        c.emit(Op.RESHAPE, [x, c.vector(c.type_of(flat).dimensions)], [flat])
    dims = _static_shape(c, fc.out_tensor())
    target = c.add(c.nn_type(fc.out_tensor(), [c.type_of(flat).dimensions[0], dims[-1]]))
    current = c.current
    c.current = fc
    c.operands[fc.inputs[0]] = flat  # its only reader is fc: the rank-6 tensor as its rows
    try:
        _fully_connected(c, fc, target)
    finally:
        c.current = current
        del c.operands[fc.inputs[0]]
    return target


def _chain_output(c: _Converter, last: _Operator) -> int:
    """The operand of the chain's last output (created as its own operator would)."""
    current = c.current
    c.current = last
    try:
        return c.output()
    finally:
        c.current = current


def _gather_plan(shape: list[int], index: np.ndarray) -> list[np.ndarray] | None:
    """The per-axis indexes whose gathers of a ``shape`` tensor give ``index`` (input
    positions, of the output's shape), or None when it is no such gather."""
    if index.ndim != len(shape):
        return None
    coords = np.unravel_index(index, shape)
    picks = []
    for axis, along in enumerate(coords):
        pick = along[tuple(slice(None) if k == axis else 0 for k in range(index.ndim))]
        if not np.array_equal(along, np.broadcast_to(
                pick.reshape([-1 if k == axis else 1 for k in range(index.ndim)]), index.shape)):
            return None
        picks.append(pick)
    return picks


def _emit_gathers(c: _Converter, last: _Operator, x: int, shape: list[int], index: np.ndarray,
                  picks: list[np.ndarray]) -> str:
    """Per-axis gathers ``picks``: RESIZE_NEAREST_NEIGHBOR where they are its indexes, else GATHERs."""
    moved = [axis for axis in range(len(shape)) if not np.array_equal(picks[axis], np.arange(shape[axis]))]
    if len(shape) == 4 and set(moved) <= {1, 2}:
        height, width = index.shape[1], index.shape[2]
        for half_pixel in (False, True):
            if np.array_equal(picks[1], nearest_indexes(shape[1], height, False, half_pixel)) and \
                    np.array_equal(picks[2], nearest_indexes(shape[2], width, False, half_pixel)):
                c.emit(Op.RESIZE_NEAREST_NEIGHBOR, [x, c.i32(width), c.i32(height), c.boolean(False),
                                                    c.boolean(False), c.boolean(half_pixel)],
                       [_chain_output(c, last)])
                return f"RESIZE_NEAREST_NEIGHBOR to {height}x{width}"
    current, current_dims = x, list(shape)
    for step, axis in enumerate(moved):
        current_dims[axis] = index.shape[axis]
        target = _chain_output(c, last) if step == len(moved) - 1 else \
            c.temp(c.type_of(x), current_dims)
        c.emit(Op.GATHER, [current, c.i32(axis), c.vector(picks[axis])], [target])
        current = target
    if not moved:
        c.identity(x, _chain_output(c, last))
    return f"GATHER along axes {moved}" if moved else "the input unchanged"


def _transpose_plan(index: np.ndarray, dims: list[int], perm: list[int]) -> tuple[list[int], list[int]] | None:
    """(dims, perm) of a rank-4 TRANSPOSE whose RESHAPE before and after give ``index``,
    from the chain's one TRANSPOSE (of a ``dims`` tensor by ``perm``) once its size-1
    axes are dropped and its neighbouring axes merged; None when there is none."""
    merged, order = _merged_transpose(dims, perm)
    if not merged or len(merged) > _MAX_RANK or not np.array_equal(
            np.arange(index.size).reshape(merged).transpose(order).reshape(index.shape), index):
        return None
    return merged, order


def _emit_transpose(c: _Converter, last: _Operator, x: int, shape: list[int], index: np.ndarray,
                    merged: list[int], order: list[int]) -> str:
    current = x
    if merged != shape:
        current = c.temp(c.type_of(x), merged)
        c.emit(Op.RESHAPE, [x, c.vector(merged)], [current])
    final = list(index.shape)
    moved = [merged[axis] for axis in order]
    target = _chain_output(c, last) if moved == final else c.temp(c.type_of(x), moved)
    c.emit(Op.TRANSPOSE, [current, c.vector(order)], [target])
    if moved != final:
        c.emit(Op.RESHAPE, [target, c.vector(final)], [_chain_output(c, last)])
    return f"RESHAPE to {merged}, TRANSPOSE {order}, RESHAPE to {final}"


def _merged_reduction(dims: Sequence[int], axes: Sequence[int]) -> tuple[list[int], list[int]] | None:
    """``dims`` with its size-1 axes dropped and neighbouring axes merged where all are
    reduced or all kept, and the merged shape's reduced axes: a reduction over ``axes``
    of ``dims`` is the reduction over those of the merged shape, on the same elements in
    the same order. None where the merged shape is above rank 4 or nothing is reduced."""
    groups: list[list[Any]] = []
    for axis, size in enumerate(dims):
        if size == 1:
            continue
        reduced = axis in axes
        if groups and groups[-1][0] == reduced:
            groups[-1][1] *= size
        else:
            groups.append([reduced, size])
    merged_axes = [k for k, (reduced, _) in enumerate(groups) if reduced]
    if len(groups) > _MAX_RANK or not merged_axes:
        return None
    return [size for _, size in groups], merged_axes


def _lifted_reduction(c: _Converter, op: _Operator) -> tuple[int, list[int], int] | None:
    """For a reduction (MEAN, SUM, REDUCE_*) with constant axes over a lifted tensor above
    rank 4 (GroupNormalization: RESHAPE to [n, h, w, groups, channels per group], MEAN over
    h, w and the channels of each group): (the lifted operand reshaped to the merged shape
    of _merged_reduction, the merged axes, a new operand for the result with those axes
    kept as 1). The result holds the output's elements in order; _finish_lifted gives it
    to the output. None (nothing emitted) otherwise."""
    tensor = op.inputs[0]
    axes_const = c.const_of(op.inputs[1])
    dims = _static_shape(c, op.tensor(0))
    if tensor not in c.lifted or tensor in c.operands or axes_const is None or dims is None or \
            c.graph.propagate or _static_shape(c, op.out_tensor()) is None:
        return None
    rank = len(dims)
    axes = {int(a) % rank for a in np.asarray(axes_const.data).reshape(-1)}
    plan = _merged_reduction(dims, sorted(axes))
    if plan is None:
        return None
    merged, merged_axes = plan
    source = c.lifted[tensor][0]
    if list(c.type_of(source).dimensions) != merged:
        reshaped = c.temp(c.type_of(source), merged)
        c.emit(Op.RESHAPE, [source, c.vector(merged)], [reshaped])
        source = reshaped
    kept = [1 if k in merged_axes else size for k, size in enumerate(merged)]
    return source, merged_axes, c.add(c.nn_type(op.out_tensor()).with_dimensions(kept))


def _finish_lifted(c: _Converter, op: _Operator, result: int) -> None:
    """Give ``result`` (the output's elements, in order, at rank <= 4) to ``op``'s output:
    kept lifted where the output is above rank 4, else RESHAPEd to it."""
    out = _static_shape(c, op.out_tensor())
    assert out is not None
    if len(out) > _MAX_RANK:
        c.lifted[op.outputs[0]] = (result, out)
    else:
        c.emit(Op.RESHAPE, [result, c.vector(out or [1])], [c.output()])


#: element-wise operators of one input whose converters see only operand types: on a lifted
#: tensor they run on its rank <= 4 operand and the output stays lifted (_lifted_unary)
_LIFTABLE_UNARY = frozenset({
    "ABS", "EXP", "FLOOR", "LOG", "NEG", "RSQRT", "SIN", "COS", "SQRT", "SQUARE", "LOGISTIC", "TANH", "RELU",
    "RELU6", "RELU_N1_TO_1", "HARD_SWISH", "GELU", "LEAKY_RELU", "ELU", "QUANTIZE", "DEQUANTIZE",
})


def _lifted_unary(c: _Converter, op: _Operator, convert: Callable[[_Converter, _Operator], None]) -> bool:
    """Convert element-wise ``op`` (_LIFTABLE_UNARY) of a lifted tensor above rank 4 on the
    rank <= 4 operand holding its elements (GroupNormalization's NEG, SQUARE and RSQRT of
    its rank-5 statistics): the same elements in the same order; the output stays lifted.
    False (nothing done) where the input is not lifted."""
    if op.name not in _LIFTABLE_UNARY or len(op.inputs) != 1 or len(op.outputs) != 1:
        return False
    tensor = op.inputs[0]
    if tensor not in c.lifted or tensor in c.operands or c.graph.propagate:
        return False
    source, shape = c.lifted[tensor]
    out_info, in_info = op.out_tensor(), op.tensor(0)
    if _static_shape(c, out_info) != shape:
        return False
    dims = tuple(c.type_of(source).dimensions)
    saved = in_info.shape, out_info.shape
    # the converter sees the rank <= 4 operand, and writes an output of its shape
    c.operands[tensor] = source
    in_info.shape, out_info.shape = dims, dims
    try:
        convert(c, op)
    finally:
        del c.operands[tensor]
        in_info.shape, out_info.shape = saved
    c.lifted[op.outputs[0]] = (c.operands.pop(op.outputs[0]), shape)
    if c._lowering_reason is None:
        c.lowered(f"{op.name} of rank {len(shape)} on the rank-{len(dims)} operand holding its elements")
    return True


_FIRST_CONVERTERS.append(_lifted_unary)
