"""TFLite import: operators that move elements (TRANSPOSE, SLICE, STRIDED_SLICE, GATHER,
SPLIT, PACK, CONCATENATION, TILE, ...) and the lookups (EMBEDDING_LOOKUP, ...).
"""

from __future__ import annotations

import numpy as np

from nnapi.codes import OperandCode as T
from nnapi.codes import OperationCode as Op
from nnapi.importers.tflite.converter import _Converter, _converter
from nnapi.importers.tflite.float_moves import _through_float32
from nnapi.importers.tflite.reader import (
    _FLOAT_TYPES,
    _QUANT8,
    _RESHAPE_TYPES,
    UnsupportedOperator,
    _operand_shape,
    _Operator,
    _static_shape,
)
from nnapi.operand import OperandType


@_converter("CONCATENATION")
def _concatenation(c: _Converter, op: _Operator) -> None:
    options = op.options("ConcatenationOptions")
    operands = [c.input(i) for i in range(len(op.inputs))]
    axis = options.Axis()
    if axis < 0:  # TFLite counts a negative axis from the end; NNAPI's axis is in [0, rank)
        axis += c.type_of(operands[0]).rank
    activation = options.FusedActivationFunction()
    if activation == 0:
        c.emit(Op.CONCATENATION, [*operands, c.i32(axis)], [c.output()])
        return
    temp = c.temp(c.nn_type(op.out_tensor()))
    c.emit(Op.CONCATENATION, [*operands, c.i32(axis)], [temp])
    c.activation_after(activation, temp)


def _int_vector_input(c: _Converter, position: int) -> int:
    const = c.const_of(c.current.inputs[position])
    if const is not None:
        return c.vector(const.data)
    return c.input(position)


@_converter("TRANSPOSE")
def _transpose(c: _Converter, op: _Operator) -> None:
    c.emit(Op.TRANSPOSE, [c.input(0), _int_vector_input(c, 1)], [c.output()])


@_converter("SLICE")
def _slice(c: _Converter, op: _Operator) -> None:
    c.emit(Op.SLICE, [c.input(0), _int_vector_input(c, 1), _int_vector_input(c, 2)], [c.output()])


@_converter("TILE")
def _tile(c: _Converter, op: _Operator) -> None:
    c.emit(Op.TILE, [c.input(0), _int_vector_input(c, 1)], [c.output()])


@_converter("REVERSE_V2")
def _reverse(c: _Converter, op: _Operator) -> None:
    """TFLite's axes may be negative (counted from the end) and several; NNAPI's REVERSE takes
    one axis in [0, rank): one REVERSE per axis, each counted from the start."""
    rank = len(op.tensor(0).shape)
    given = [int(a) for a in c.const_values(1, "axis").reshape(-1)]
    if not given:
        raise UnsupportedOperator("REVERSE_V2 with no axes")
    if any(not -rank <= a < rank for a in given):
        raise UnsupportedOperator(f"REVERSE_V2 axes {given} of a rank-{rank} tensor: each must lie in "
                                  f"[{-rank}, {rank})")
    axes = [a + rank if a < 0 else a for a in given]
    if len(set(axes)) != len(axes):
        raise UnsupportedOperator(f"REVERSE_V2 axes {given} of a rank-{rank} tensor name an axis twice")
    x = c.input(0)
    x_type, out_type = c.type_of(x), c.nn_type(op.out_tensor())
    for axis in axes[:-1]:
        step = c.temp(x_type)
        c.emit(Op.REVERSE, [x, c.vector([axis])], [step])
        x = step
    if x_type.type in _QUANT8 and (x_type.scale, x_type.zero_point) != (out_type.scale, out_type.zero_point):
        # TFLite's kernel copies the stored values whatever the two quantizations say (the
        # converter writes such a pair in a bidirectional LSTM); NNAPI's REVERSE keeps the
        # quantization, and CAST, which ignores it, carries the stored values over.
        reversed_ = c.temp(x_type)
        c.emit(Op.REVERSE, [x, c.vector(axes[-1:])], [reversed_])
        c.emit(Op.CAST, [reversed_], [c.output()])
        c.lowered("REVERSE_V2 between two quantizations: REVERSE + CAST of the stored values, as TFLite's kernel")
        return
    c.emit(Op.REVERSE, [x, c.vector(axes[-1:])], [c.output()])


def _dense_slice_spec(rank: int, begin: np.ndarray, end: np.ndarray, strides: np.ndarray, begin_mask: int,
                      end_mask: int, shrink: int, ellipsis: int, new_axis: int
                      ) -> tuple[list[list[int]], int, int, int, list[bool]]:
    """TensorFlow's sparse slice spec (an ellipsis, new axes, fewer entries than the
    rank) made dense: one (begin, end, stride) and mask bit per input axis, and for each
    output axis whether it is a new size-1 axis (True) or comes from the input (False)."""
    count = len(begin)
    if not ellipsis & ((1 << count) - 1):
        ellipsis |= 1 << count  # a spec shorter than the rank ends in an implicit ellipsis
        count += 1
    elif bin(ellipsis & ((1 << count) - 1)).count("1") > 1:
        raise UnsupportedOperator("STRIDED_SLICE with more than one ellipsis")
    spec: list[list[int]] = []
    dense_begin_mask = dense_end_mask = dense_shrink = 0
    out_axes: list[bool] = []
    for i in range(count):
        bit = 1 << i
        if ellipsis & bit:
            # The ellipsis covers every input axis the entries after it do not name.
            named_after = sum(1 for j in range(i + 1, count) if not new_axis >> j & 1)
            covered = rank - len(spec) - named_after
            if covered < 0:
                raise UnsupportedOperator(f"STRIDED_SLICE names more axes than the input's {rank}")
            for _ in range(covered):
                dense_begin_mask |= 1 << len(spec)
                dense_end_mask |= 1 << len(spec)
                spec.append([0, 0, 1])
                out_axes.append(False)
        elif new_axis & bit:
            out_axes.append(True)  # TensorFlow ignores begin, end, stride and shrink here
        else:
            if len(spec) >= rank:
                raise UnsupportedOperator(f"STRIDED_SLICE names more axes than the input's {rank}")
            axis = len(spec)
            dense_begin_mask |= (begin_mask >> i & 1) << axis
            dense_end_mask |= (end_mask >> i & 1) << axis
            dense_shrink |= (shrink >> i & 1) << axis
            spec.append([int(begin[i]), int(end[i]), int(strides[i])])
            if not shrink >> i & 1:
                out_axes.append(False)
    if len(spec) != rank:
        raise UnsupportedOperator(f"STRIDED_SLICE names {len(spec)} of the input's {rank} axes")
    return spec, dense_begin_mask, dense_end_mask, dense_shrink, out_axes


@_converter("STRIDED_SLICE")
def _strided_slice(c: _Converter, op: _Operator) -> None:
    options = op.options("StridedSliceOptions")
    x = c.input(0)
    in_shape = op.tensor(0).shape
    begin = c.const_values(1, "begin").astype(np.int64).reshape(-1)
    end = c.const_values(2, "end").astype(np.int64).reshape(-1)
    strides = (c.const_values(3, "strides").astype(np.int64).reshape(-1) if op.has_input(3)
               else np.ones_like(begin))
    if not len(begin) == len(end) == len(strides):
        raise UnsupportedOperator(f"STRIDED_SLICE with {len(begin)} begin, {len(end)} end and {len(strides)} "
                                  "stride values")
    ellipsis, new_axis = options.EllipsisMask(), options.NewAxisMask()
    offset = bool(options.Offset()) if hasattr(options, "Offset") else False
    notes = []
    if offset:
        # offset: each end counts from its (unresolved) begin; measured against LiteRT,
        # a negative begin is not wrapped first. Added here once the indices are known.
        if ellipsis or new_axis or options.BeginMask():
            raise UnsupportedOperator("STRIDED_SLICE with offset together with ellipsis, new-axis or begin masks")
        end = begin + end
        notes.append("offset: end = begin + end computed at import")
    rank = len(in_shape)
    # Entries naming an input axis; fewer than the rank means an ellipsis somewhere.
    named = len(begin) - bin(new_axis & ((1 << len(begin)) - 1)).count("1")
    spec, begin_mask, end_mask, shrink, out_axes = _dense_slice_spec(
        rank, begin, end, strides, options.BeginMask(), options.EndMask(), options.ShrinkAxisMask(), ellipsis,
        new_axis)
    begin = np.array([s[0] for s in spec], np.int64)
    end = np.array([s[1] for s in spec], np.int64)
    strides = np.array([s[2] for s in spec], np.int64)
    reasons = []
    for axis in range(rank):
        if shrink >> axis & 1:
            # TFLite ignores end (and stride) on a shrunk axis and takes begin alone;
            # NNAPI reads them, so make the slice [begin, begin + 1) explicitly.
            size = in_shape[axis]
            start = begin[axis] if not begin_mask >> axis & 1 else 0
            if start < 0:
                if size < 0:
                    raise UnsupportedOperator("shrinking an axis of unknown size from a negative index")
                start += size
            if end[axis] != start + 1 or strides[axis] != 1 or begin_mask >> axis & 1 or end_mask >> axis & 1:
                reasons.append(axis)
            begin[axis] = start
            end[axis] = start + 1
            strides[axis] = 1
            begin_mask &= ~(1 << axis)
            end_mask &= ~(1 << axis)
    slice_inputs = [x, c.vector(begin), c.vector(end), c.vector(strides), c.i32(begin_mask), c.i32(end_mask),
                    c.i32(shrink)]
    if reasons:
        notes.append(f"shrink axes {reasons}: TFLite ignores their end, NNAPI needs end = begin + 1; rewritten")
    if ellipsis or named < rank:
        notes.append("ellipsis (or fewer indices than the rank) expanded to full ranges of the axes it covers")
    if any(out_axes):
        out_info = op.out_tensor()
        out_shape = list(out_info.shape)
        if len(out_shape) != len(out_axes) or any(out_shape[i] not in (1, -1) for i, new in
                                                  enumerate(out_axes) if new):
            raise UnsupportedOperator(f"STRIDED_SLICE output shape {out_shape} does not match its new axes")
        out_type = c.nn_type(out_info)
        kept = [d for d, new in zip(out_type.dimensions, out_axes) if not new]
        sliced = c.temp(out_type, kept or [1])
        c.emit(Op.STRIDED_SLICE, slice_inputs, [sliced])
        target = [-1 if d < 0 else 1 if new else d for d, new in zip(out_shape, out_axes)]
        if target.count(-1) > 1:
            raise UnsupportedOperator("new_axis_mask on an output with more than one unknown dimension")
        c.emit(Op.RESHAPE, [sliced, c.vector(target)], [c.output()])
        notes.append(f"new_axis_mask: STRIDED_SLICE + RESHAPE inserting size-1 axes at output positions "
                     f"{[i for i, new in enumerate(out_axes) if new]}")
    else:
        c.emit(Op.STRIDED_SLICE, slice_inputs, [c.output()])
    if notes:
        c.lowered("; ".join(notes))


@_converter("GATHER")
def _gather(c: _Converter, op: _Operator) -> None:
    options = op.options("GatherOptions")
    axis = options.Axis() if options is not None else 0
    if options is not None and options.BatchDims():
        _gather_batched(c, op, axis, options.BatchDims())
        return
    x = c.input(0)
    indices_info = op.tensor(1)
    indices = c.input(1)
    if c.type_of(indices).type != T.TENSOR_INT32:
        raise UnsupportedOperator("GATHER indices must be int32 for NNAPI")
    if len(indices_info.shape) > 0:
        c.emit(Op.GATHER, [x, c.i32(axis), indices], [c.output()])
        return
    # A rank-0 index removes the axis; NNAPI's [1] index keeps it with size 1.
    in_shape = list(_operand_shape(op.tensor(0).shape))
    axis_n = axis % len(in_shape)
    kept = [*in_shape[:axis_n], 1, *in_shape[axis_n + 1:]]
    # the output operand's type, not the tensor's: a bool / int32 GATHER moved through
    # float32 (_through_float32) gathers float32 (a masked RNN's per-step mask)
    out = c.output()
    out_type = c.type_of(out)
    if out_type.type not in _FLOAT_TYPES + _QUANT8:
        raise UnsupportedOperator(f"rank-0 GATHER index on {out_type.type.name} (no NNAPI RESHAPE for it)")
    temp = c.temp(out_type, kept)
    c.emit(Op.GATHER, [x, c.i32(axis), indices], [temp])
    c.emit(Op.RESHAPE, [temp, c.vector(out_type.dimensions)], [out])
    c.lowered("rank-0 index: GATHER with a [1] index keeps the axis, so GATHER + RESHAPE drops it")


def _gather_batched(c: _Converter, op: _Operator, axis: int, batch_dims: int) -> None:
    """GATHER with batch_dims b gathering along axis b (the first axis after the batch):
    one GATHER on the params with their batch axes and the gathered one merged, [B * n,
    ...], by the indices plus each batch's first row (b * n, a constant broadcast over the
    indices; -1 where an index is outside [0, n), so that the run fails as LiteRT's does).
    The output, [B..., indices..., rest...], is TFLite's."""
    x, indices = c.input(0), c.input(1)
    x_type, i_type = c.type_of(x), c.type_of(indices)
    params, index_dims = _static_shape(c, op.tensor(0)), _static_shape(c, op.tensor(1))
    if i_type.type != T.TENSOR_INT32 or params is None or index_dims is None:
        raise UnsupportedOperator("GATHER with batch_dims needs int32 indices and static shapes")
    # TFLite's rule (gather.cc): a negative batch_dims counts from the indices' rank, and
    # then 0 <= batch_dims < the params' rank, batch_dims <= the indices' rank (a rank-0
    # index, NNAPI's [1], has none: batch_dims -1 is refused, not batch 0)
    index_rank, params_rank = len(op.tensor(1).shape), len(op.tensor(0).shape)
    batch = batch_dims + index_rank if batch_dims < 0 else batch_dims
    if not 0 <= batch < params_rank or batch > index_rank:
        raise UnsupportedOperator(f"GATHER with batch_dims {batch_dims} of rank-{params_rank} params and rank-"
                                  f"{index_rank} indices (TFLite needs 0 <= batch_dims, after adding the indices' "
                                  "rank to a negative one, < the params' rank and <= the indices' rank)")
    if axis % len(params) != batch or params[:batch] != index_dims[:batch]:
        raise UnsupportedOperator(f"GATHER with batch_dims {batch_dims} along axis {axis} (only the axis right "
                                  "after the batch axes has an NNAPI form here)")
    if x_type.type in (T.TENSOR_INT32, T.TENSOR_BOOL8):
        # NNAPI's RESHAPE takes neither: the same GATHER on the params' exact float32 halves
        _through_float32(c, op, (0,), lambda c, op: _gather_batched(c, op, axis, batch_dims))
        return
    if x_type.type not in _RESHAPE_TYPES:
        raise UnsupportedOperator(f"GATHER with batch_dims of {x_type.type.name} params (NNAPI's RESHAPE takes none)")
    count, rows = int(np.prod(params[:batch])), params[batch]
    merged = [count * rows, *params[batch + 1:]]
    flat = c.temp(x_type, merged)
    c.emit(Op.RESHAPE, [x, c.vector(merged)], [flat])
    starts_shape = index_dims[:batch] + [1] * (len(index_dims) - batch)
    starts = c.const_operand((np.arange(count, dtype=np.int32) * rows).reshape(starts_shape),
                             OperandType(T.TENSOR_INT32, starts_shape))
    flags = OperandType(T.TENSOR_BOOL8, index_dims)
    low, high, inside, shifted, checked = c.temp(flags), c.temp(flags), c.temp(flags), c.temp(i_type), c.temp(i_type)

    def scalar(value: int) -> int:
        return c.const_operand(np.array([value], np.int32), OperandType(T.TENSOR_INT32, [1]))

    c.emit(Op.GREATER_EQUAL, [indices, scalar(0)], [low])
    c.emit(Op.LESS, [indices, scalar(rows)], [high])
    c.emit(Op.LOGICAL_AND, [low, high], [inside])
    c.emit(Op.ADD, [indices, starts, c.i32(0)], [shifted])
    c.emit(Op.SELECT, [inside, shifted, c.const_operand(np.full(index_dims, -1, np.int32), i_type)], [checked])
    c.emit(Op.GATHER, [flat, c.i32(0), checked], [c.output()])
    c.lowered(f"GATHER with batch_dims {batch} as one GATHER on the params' merged batch and gathered axes "
              f"{merged} by the indices plus each batch's first row (-1 outside the axis)")


@_converter("GATHER_ND")
def _gather_nd(c: _Converter, op: _Operator) -> None:
    """GATHER_ND as GATHER on the params with their first k axes merged: the row index
    sum(index_j * stride_j) from the [..., k] indices (folded at import when constant;
    else SLICE per column, MUL by the stride, ADD, in int32; -1 where any index is outside
    its axis, so that the run fails as LiteRT's does), then RESHAPE to TFLite's output
    shape."""
    params_shape = list(_operand_shape(op.tensor(0).shape))
    indices_shape = list(_operand_shape(op.tensor(1).shape))
    out_type = c.nn_type(op.out_tensor())
    if not indices_shape or 0 in indices_shape or 0 in params_shape or not out_type.is_fully_specified:
        raise UnsupportedOperator("GATHER_ND needs static params and indices shapes")
    k = indices_shape[-1]
    if k > len(params_shape):
        raise UnsupportedOperator(f"GATHER_ND index depth {k} above the params' rank {len(params_shape)}")
    rows = int(np.prod(params_shape[:k]))
    flat_shape = [rows, *params_shape[k:]]
    strides = [int(np.prod(params_shape[j + 1:k])) for j in range(k)]
    # constant params are read as data only while no operand stands for them: an int32 /
    # bool tensor moved as float32 (_through_float32) stands as each of its halves, which
    # the raw data is not
    params_const = None if op.inputs[0] in c.operands else c.const_of(op.inputs[0])
    x_type = c.nn_type(op.tensor(0)) if params_const is not None else c.type_of(c.input(0))
    if x_type.type not in _FLOAT_TYPES + _QUANT8:
        raise UnsupportedOperator(f"GATHER_ND of {x_type.type.name} (no NNAPI RESHAPE for it)")
    if params_const is not None:
        flat = c.const_operand(np.asarray(params_const.data).reshape(flat_shape), x_type.with_dimensions(flat_shape))
    elif flat_shape != params_shape:
        flat = c.temp(x_type, flat_shape)
        c.emit(Op.RESHAPE, [c.input(0), c.vector(flat_shape)], [flat])
    else:
        flat = c.input(0)
    column_shape = [*indices_shape[:-1], 1]
    indices_const = c.const_of(op.inputs[1])
    if indices_const is not None:
        values = np.asarray(indices_const.data).astype(np.int64).reshape(-1, k)
        if (values < 0).any() or (values >= np.array(params_shape[:k])).any():
            raise UnsupportedOperator("GATHER_ND constant index out of the params' range")
        rows_picked = values @ np.array(strides, np.int64)
        if np.array_equal(rows_picked, np.arange(rows)):
            # every row once, in order (BERT's attention mask through ai-edge-torch: [1, n]
            # picked by [1, 1, 1, n, 2] indices): the params' elements as they are
            c.emit(Op.RESHAPE, [flat, c.vector(list(out_type.dimensions) or [1])], [c.output()])
            c.lowered("GATHER_ND whose constant indices pick every row once, in order, as RESHAPE")
            return
        # constant indices: one flat list of rows (the indices' own rank does not matter)
        column_shape = [len(rows_picked)]
        linear = c.const_operand(rows_picked.astype(np.int32), OperandType(T.TENSOR_INT32, column_shape))
    else:
        indices = c.input(1)
        if c.type_of(indices).type != T.TENSOR_INT32:
            raise UnsupportedOperator("GATHER_ND indices must be int32 for NNAPI")
        linear = None
        outside = None   # an index outside its axis (LiteRT fails the run): the row index -1 fails GATHER
        int_type, bool_type = OperandType(T.TENSOR_INT32, column_shape), OperandType(T.TENSOR_BOOL8, column_shape)
        for j in range(k):
            if k == 1:
                column = indices
            else:
                column = c.temp(int_type)
                c.emit(Op.SLICE, [indices, c.vector([0] * (len(indices_shape) - 1) + [j]), c.vector(column_shape)],
                       [column])
            below, beyond, either = c.temp(bool_type), c.temp(bool_type), c.temp(bool_type)
            c.emit(Op.LESS, [column, c.const_operand(np.array([0], np.int32), OperandType(T.TENSOR_INT32, [1]))],
                   [below])
            c.emit(Op.GREATER_EQUAL, [column, c.const_operand(np.array([params_shape[j]], np.int32),
                                                              OperandType(T.TENSOR_INT32, [1]))], [beyond])
            c.emit(Op.LOGICAL_OR, [below, beyond], [either])
            if outside is not None:
                joined = c.temp(bool_type)
                c.emit(Op.LOGICAL_OR, [outside, either], [joined])
                either = joined
            outside = either
            if strides[j] != 1:
                scaled = c.temp(OperandType(T.TENSOR_INT32, column_shape))
                c.emit(Op.MUL, [column, c.const_operand(np.array([strides[j]], np.int32),
                                                        OperandType(T.TENSOR_INT32, [1])), c.i32(0)], [scaled])
                column = scaled
            if linear is None:
                linear = column
            else:
                total = c.temp(OperandType(T.TENSOR_INT32, column_shape))
                c.emit(Op.ADD, [linear, column, c.i32(0)], [total])
                linear = total
        checked = c.temp(int_type)
        c.emit(Op.SELECT, [outside, c.const_operand(np.full(column_shape, -1, np.int32), int_type), linear], [checked])
        linear = checked
    gathered_shape = [*column_shape, *params_shape[k:]]
    gathered = c.temp(x_type, gathered_shape)
    c.emit(Op.GATHER, [flat, c.i32(0), linear], [gathered])
    c.emit(Op.RESHAPE, [gathered, c.vector(list(out_type.dimensions) or [1])], [c.output()])
    c.lowered(f"GATHER_ND (index depth {k}) as GATHER of the params with their first {k} axes merged, "
              "the row index sum(index_j * stride_j) in int32 (SLICE, MUL, ADD; folded when constant; -1, failing "
              "the run as LiteRT's, where an index is outside its axis), RESHAPE")


def _accumulate_rows(c: _Converter, data: int, data_type: OperandType, count: int, width: int,
                     targets: list[int], rows: int, initial: np.ndarray, combine: Op,
                     quantized_repeats: bool = True) -> tuple[int, int]:
    """``rows`` output rows of ``width`` elements, each ``initial`` combined (ADD, MAXIMUM,
    MINIMUM, MUL) with the data rows sent to it (``targets[i]``: data row i's output row, or
    -1: dropped) in their order, as TFLite's scatter / segment kernels loop: the data as
    [count, width] rows with ``initial`` as one more row (RESHAPE, CONCATENATION), GATHERed
    once per depth of repetition (a row's first data row, or ``initial``; then its second
    ...), each combined into the running rows. The first level is combined with
    ``initial`` too where that changes a value: float ADD of zeros (-0 + 0 is TFLite's +0),
    MAXIMUM / MINIMUM as TFLite's std::max / std::min: SELECT(LESS(total, x), x, total) /
    SELECT(LESS(x, total), x, total), which skips a NaN and keeps the lowest float over
    -inf as they do (NNAPI's MAXIMUM propagates NaN). MUL by 1 is x itself; 8-bit ADD's
    initial row is the stored 0 of rows that receive nothing. Returns the [rows, width]
    operand and the depth. Repeated targets of 8-bit data are refused unless
    ``quantized_repeats``."""
    occurrences: list[list[int]] = [[] for _ in range(rows)]
    for position, row in enumerate(targets):
        if row >= 0:
            occurrences[row].append(position)
    depth = max(1, max(len(found) for found in occurrences))
    if depth > 1 and data_type.type in _QUANT8 and not quantized_repeats:
        raise UnsupportedOperator("repeated indices of 8-bit values (TFLite combines the stored values)")
    as_rows = c.temp(data_type, [count, width])
    c.emit(Op.RESHAPE, [data, c.vector([count, width])], [as_rows])
    extra = c.const_operand(np.asarray(initial, data_type.dtype).reshape(1, width),
                            data_type.with_dimensions([1, width]))
    table = c.temp(data_type, [count + 1, width])
    c.emit(Op.CONCATENATION, [as_rows, extra, c.i32(0)], [table])
    total = None
    for level in range(depth):
        picks = np.array([found[level] if len(found) > level else count for found in occurrences], np.int32)
        picked = c.temp(data_type, [rows, width])
        c.emit(Op.GATHER, [table, c.i32(0), c.const_operand(picks, OperandType(T.TENSOR_INT32, [rows]))], [picked])
        if combine in (Op.MAXIMUM, Op.MINIMUM):
            current = total if total is not None else c.const_operand(
                np.broadcast_to(np.asarray(initial, data_type.dtype).reshape(1, width), (rows, width)).copy(),
                data_type.with_dimensions([rows, width]))
            take = c.temp(OperandType(T.TENSOR_BOOL8, [rows, width]))
            c.emit(Op.LESS, [current, picked] if combine == Op.MAXIMUM else [picked, current], [take])
            combined = c.temp(data_type, [rows, width])
            c.emit(Op.SELECT, [take, picked, current], [combined])
            picked = combined
        elif total is not None:
            combined = c.temp(data_type, [rows, width])
            c.emit(combine, [total, picked, c.i32(0)], [combined])
            picked = combined
        elif combine == Op.ADD and data_type.type in _FLOAT_TYPES:
            combined = c.temp(data_type, [rows, width])
            c.emit(Op.ADD, [picked, extra, c.i32(0)], [combined])
            picked = combined
        total = picked
    assert total is not None
    return total, depth


_SEGMENT_COMBINE = {"SEGMENT_SUM": Op.ADD, "UNSORTED_SEGMENT_SUM": Op.ADD, "UNSORTED_SEGMENT_PROD": Op.MUL,
                    "UNSORTED_SEGMENT_MAX": Op.MAXIMUM, "UNSORTED_SEGMENT_MIN": Op.MINIMUM}


@_converter(*_SEGMENT_COMBINE)
def _segment(c: _Converter, op: _Operator) -> None:
    """SEGMENT_SUM / UNSORTED_SEGMENT_SUM / _PROD / _MAX / _MIN of float32 data with constant
    segment ids (and number of segments) as TFLite loops: each output row starts at 0 / 1 /
    the lowest / the highest float32 and is combined with its data rows in their order
    (_accumulate_rows); a negative id drops its row (TFLite's unsorted kernels skip it)."""
    ids_const = c.const_of(op.inputs[1])
    data = c.input(0)
    d_type = c.type_of(data)
    dims = list(d_type.dimensions)
    if ids_const is None or not dims or not all(d > 0 for d in dims):
        raise UnsupportedOperator(f"{op.name} with segment ids given at run time or an open shape")
    if d_type.type != T.TENSOR_FLOAT32:
        raise UnsupportedOperator(f"{op.name} of {d_type.type.name} (float32 only here)")
    ids = np.asarray(ids_const.data).astype(np.int64)
    k = max(ids.ndim, 1)
    ids = ids.reshape(-1)
    if list(np.asarray(ids_const.data).shape or [1]) != dims[:k]:
        raise UnsupportedOperator(f"{op.name} segment ids of shape {list(np.asarray(ids_const.data).shape)} for data "
                                  f"of shape {dims}")
    if op.name == "SEGMENT_SUM":
        if ids[0] != 0 or not np.isin(np.diff(ids), (0, 1)).all():
            # LiteRT's kernel fails the run on other ids (segment_sum.cc: the first 0, each
            # next equal to the one before or one more)
            raise UnsupportedOperator("SEGMENT_SUM segment ids must start at 0, each equal to the one before or one "
                                      "more (LiteRT fails the run)")
        segments = int(ids.max()) + 1
    else:
        segments = int(c.const_values(2, "num_segments").reshape(-1)[0])
        if segments <= 0:
            # LiteRT returns an empty [0, ...] output for 0; an NNAPI operand holds no zero-sized axis
            raise UnsupportedOperator(f"{op.name} with num_segments {segments} (an empty output: NNAPI operands "
                                      "have no zero-sized axis)")
        if (ids >= segments).any():
            raise UnsupportedOperator(f"{op.name} segment id at or above num_segments {segments}")
    width = int(np.prod(dims[k:]))
    initial = {Op.ADD: 0.0, Op.MUL: 1.0, Op.MAXIMUM: float(np.finfo(np.float32).min),
               Op.MINIMUM: float(np.finfo(np.float32).max)}[_SEGMENT_COMBINE[op.name]]
    total, depth = _accumulate_rows(c, data, d_type, int(np.prod(dims[:k])), width, ids.tolist(), segments,
                                    np.full(width, initial, np.float32), _SEGMENT_COMBINE[op.name])
    c.emit(Op.RESHAPE, [total, c.vector([segments, *dims[k:]])], [c.output()])
    c.lowered(f"{op.name} with constant segment ids as RESHAPE of the data to rows, CONCATENATION of the initial "
              f"row, GATHER of each segment's rows ({depth} deep, combined in TFLite's order), RESHAPE")


def _diagonal_mask(dims: list[int]) -> np.ndarray:
    """True on the diagonal of the last two axes of ``dims``."""
    rows, cols = dims[-2], dims[-1]
    return np.broadcast_to(np.eye(rows, cols, dtype=np.bool_), dims).copy()


@_converter("MATRIX_DIAG")
def _matrix_diag(c: _Converter, op: _Operator) -> None:
    """MATRIX_DIAG ([..., n] -> [..., n, n], the values on the diagonal, 0 elsewhere; an
    8-bit output's stored 0, as TFLite writes T(0)): RESHAPE to [..., 1, n], TILE to
    [..., n, n], SELECT by the constant diagonal against zeros; CAST into an 8-bit output of
    another quantization (TFLite copies the stored values)."""
    x = c.input(0)
    x_type = c.type_of(x)
    dims = list(x_type.dimensions)
    out_type = c.nn_type(op.out_tensor())
    if not dims or not all(d > 0 for d in dims) or len(dims) + 1 > 4 or x_type.type not in _FLOAT_TYPES + _QUANT8:
        raise UnsupportedOperator(f"MATRIX_DIAG of {x_type.type.name} {dims} (static, rank 3 at most, float or 8-bit)")
    if out_type.type != x_type.type:
        raise UnsupportedOperator(f"MATRIX_DIAG of {x_type.type.name} into {out_type.type.name}")
    n = dims[-1]
    full = [*dims, n]
    row = c.temp(x_type, [*dims[:-1], 1, n])
    c.emit(Op.RESHAPE, [x, c.vector([*dims[:-1], 1, n])], [row])
    tiled = c.temp(x_type, full)
    c.emit(Op.TILE, [row, c.vector([1] * (len(dims) - 1) + [n, 1])], [tiled])
    zeros = c.const_operand(np.zeros(full, x_type.dtype), x_type.with_dimensions(full))
    mask = c.const_operand(_diagonal_mask(full), OperandType(T.TENSOR_BOOL8, full))
    if (out_type.scale, out_type.zero_point) != (x_type.scale, x_type.zero_point):
        # TFLite copies the stored values (and writes a stored 0) whatever the output's
        # quantization: CAST between 8-bit operands carries the stored values, as MATRIX_SET_DIAG
        selected = c.temp(x_type, full)
        c.emit(Op.SELECT, [mask, tiled, zeros], [selected])
        c.emit(Op.CAST, [selected], [c.output()])
    else:
        c.emit(Op.SELECT, [mask, tiled, zeros], [c.output()])
    c.lowered("MATRIX_DIAG as RESHAPE + TILE of the values and SELECT by the constant diagonal against zeros")


@_converter("MATRIX_SET_DIAG")
def _matrix_set_diag(c: _Converter, op: _Operator) -> None:
    """MATRIX_SET_DIAG ([..., m, n] with the diagonal [..., min(m, n)] replaced): the
    diagonal PADded to m, RESHAPEd to [..., m, 1], TILEd to [..., m, n], SELECTed by the
    constant diagonal mask over the input. 8-bit tensors of other quantizations: TFLite
    copies the stored values, so the diagonal is CAST (which carries stored values over)
    to the input's quantization first and the result to the output's."""
    x, diagonal = c.input(0), c.input(1)
    x_type, d_type = c.type_of(x), c.type_of(diagonal)
    dims = list(x_type.dimensions)
    out_type = c.nn_type(op.out_tensor())
    if len(dims) < 2 or not all(d > 0 for d in dims) or x_type.type not in _FLOAT_TYPES + _QUANT8:
        raise UnsupportedOperator(f"MATRIX_SET_DIAG of {x_type.type.name} {dims} (static, rank 2 to 4, float or "
                                  "8-bit)")
    if d_type.type != x_type.type or out_type.type != x_type.type:
        raise UnsupportedOperator(f"MATRIX_SET_DIAG of {x_type.type.name}, {d_type.type.name} into "
                                  f"{out_type.type.name}")
    requantized = x_type.type in _QUANT8 and len({(t.scale, t.zero_point) for t in (x_type, d_type, out_type)}) > 1
    if requantized and (d_type.scale, d_type.zero_point) != (x_type.scale, x_type.zero_point):
        stored = c.temp(x_type, list(d_type.dimensions))
        c.emit(Op.CAST, [diagonal], [stored])
        diagonal, d_type = stored, c.type_of(stored)
    m, n = dims[-2], dims[-1]
    k = min(m, n)
    if list(d_type.dimensions) != [*dims[:-2], k]:
        raise UnsupportedOperator(f"MATRIX_SET_DIAG diagonal of shape {list(d_type.dimensions)} for {dims}")
    source = diagonal
    if m > k:
        padded = c.temp(d_type, [*dims[:-2], m])
        pads = np.zeros((len(dims) - 1, 2), np.int32)
        pads[-1, 1] = m - k
        c.emit(Op.PAD, [diagonal, c.const_operand(pads, OperandType(T.TENSOR_INT32, list(pads.shape)))], [padded])
        source = padded
    column = c.temp(d_type, [*dims[:-2], m, 1])
    c.emit(Op.RESHAPE, [source, c.vector([*dims[:-2], m, 1])], [column])
    tiled = c.temp(x_type, dims)
    c.emit(Op.TILE, [column, c.vector([1] * (len(dims) - 1) + [n])], [tiled])
    mask = c.const_operand(_diagonal_mask(dims), OperandType(T.TENSOR_BOOL8, dims))
    if requantized and (out_type.scale, out_type.zero_point) != (x_type.scale, x_type.zero_point):
        selected = c.temp(x_type)
        c.emit(Op.SELECT, [mask, tiled, x], [selected])
        c.emit(Op.CAST, [selected], [c.output()])
    else:
        c.emit(Op.SELECT, [mask, tiled, x], [c.output()])
    c.lowered("MATRIX_SET_DIAG as the diagonal (PAD), RESHAPE + TILE along the rows, SELECT by the constant diagonal "
              "over the input")


@_converter("SCATTER_ND")
def _scatter_nd(c: _Converter, op: _Operator) -> None:
    """SCATTER_ND with constant indices and shape, as TFLite computes it: an output of zeros
    (its bytes: a quantized output's stored 0, not its zero point) to which each update is
    added in index order. The updates as [n, slice] rows and one row of zeros
    (CONCATENATION), GATHERed once per occurrence depth: the first update of each output
    row (or the zeros), then ADD of the second (or zeros), ...: TFLite's sums in its order.
    Repeated indices of 8-bit updates (TFLite adds their stored values) are refused; an
    8-bit output of another quantization gets the stored values (CAST), as TFLite copies them."""
    indices_const, shape_const = c.const_of(op.inputs[0]), c.const_of(op.inputs[2])
    if 0 in op.tensor(0).shape:
        # an empty constant has no buffer, so const_of sees none
        raise UnsupportedOperator(f"SCATTER_ND with no indices (indices of shape {list(op.tensor(0).shape)}: an "
                                  "output of zeros only, no NNAPI form here)")
    if indices_const is None or shape_const is None:
        raise UnsupportedOperator("SCATTER_ND with indices or shape given at run time (no NNAPI form)")
    shape = [int(d) for d in np.asarray(shape_const.data).reshape(-1)]
    indices = np.asarray(indices_const.data).astype(np.int64)
    indices_shape = list(indices.shape)
    k = indices.shape[-1] if indices.ndim else 0
    if not shape or not 1 <= k <= len(shape) or 0 in shape or indices.size == 0:
        raise UnsupportedOperator(f"SCATTER_ND of index depth {k} into shape {shape}")
    indices = indices.reshape(-1, k)
    if (indices < 0).any() or (indices >= np.array(shape[:k])).any():
        # LiteRT fails the run ("Invalid indices")
        raise UnsupportedOperator("SCATTER_ND constant index outside the output's shape")
    updates = c.input(1)
    u_type = c.type_of(updates)
    if u_type.type not in _FLOAT_TYPES + _QUANT8:
        raise UnsupportedOperator(f"SCATTER_ND of {u_type.type.name} updates")
    count, rows, width = len(indices), int(np.prod(shape[:k])), int(np.prod(shape[k:]))
    if list(u_type.dimensions) != [*indices_shape[:-1], *shape[k:]]:
        # LiteRT's kernel checks the updates' dimensions, not only their count
        raise UnsupportedOperator(f"SCATTER_ND updates of shape {list(u_type.dimensions)} for indices of shape "
                                  f"{indices_shape} into {shape} (must be {[*indices_shape[:-1], *shape[k:]]}, "
                                  "as LiteRT checks)")
    if len(u_type.dimensions) > 4:
        raise UnsupportedOperator(f"SCATTER_ND of rank-{len(u_type.dimensions)} updates (they are RESHAPEd to "
                                  "rows, and NNAPI's RESHAPE takes rank at most 4)")
    flat = np.ravel_multi_index(tuple(indices.T), shape[:k])
    out_type = c.nn_type(op.out_tensor())
    if out_type.type != u_type.type:
        raise UnsupportedOperator(f"SCATTER_ND of {u_type.type.name} updates into {out_type.type.name}")
    total, depth = _accumulate_rows(c, updates, u_type, count, width, flat.tolist(), rows,
                                    np.zeros(width, u_type.dtype), Op.ADD, quantized_repeats=False)
    if u_type.type in _QUANT8 and (out_type.scale, out_type.zero_point) != (u_type.scale, u_type.zero_point):
        # TFLite copies the stored values (no repeats here: no sum) into the output's
        # quantization; CAST between 8-bit operands carries the stored values over
        moved = c.temp(u_type, shape)
        c.emit(Op.RESHAPE, [total, c.vector(shape)], [moved])
        c.emit(Op.CAST, [moved], [c.output()])
    else:
        c.emit(Op.RESHAPE, [total, c.vector(shape)], [c.output()])
    c.lowered(f"SCATTER_ND with constant indices as RESHAPE of the updates to rows, CONCATENATION of a row of "
              f"zeros, GATHER of each output row's update ({depth} deep: ADD in TFLite's order), RESHAPE")


@_converter("REVERSE_SEQUENCE")
def _reverse_sequence(c: _Converter, op: _Operator) -> None:
    """REVERSE_SEQUENCE with constant lengths: per batch entry, a GATHER along the sequence
    axis by the constant order (the first length[b] elements reversed, the rest in place);
    several batch entries are SPLIT apart along the batch axis and joined again."""
    options = op.options("ReverseSequenceOptions")
    lengths_const = c.const_of(op.inputs[1])
    x = c.input(0)
    x_type = c.type_of(x)
    dims = list(x_type.dimensions)
    if lengths_const is None or not dims or not all(d > 0 for d in dims):
        raise UnsupportedOperator("REVERSE_SEQUENCE with lengths given at run time or an open shape")
    if x_type.type not in (T.TENSOR_FLOAT32, T.TENSOR_QUANT8_ASYMM, T.TENSOR_INT32):
        # LiteRT's kernel takes float32, uint8, int16, int32 and int64 (not int8, float16)
        raise UnsupportedOperator(f"REVERSE_SEQUENCE of {x_type.type.name} (LiteRT's kernel refuses int8 and float16; "
                                  "int16 / int64 have no NNAPI operand type here)")
    rank = len(dims)
    seq_axis = options.SeqDim() if options is not None else 0
    batch_axis = options.BatchDim() if options is not None else 0
    if not (0 <= seq_axis < rank and 0 <= batch_axis < rank):
        # LiteRT's kernel checks seq_dim >= 0 and batch_dim >= 0 (no negative axes) below the rank
        raise UnsupportedOperator(f"REVERSE_SEQUENCE seq_dim {seq_axis} / batch_dim {batch_axis} must be in "
                                  f"[0, {rank}) (LiteRT fails the run on negative axes)")
    lengths = np.asarray(lengths_const.data).astype(np.int64).reshape(-1)
    if seq_axis == batch_axis or len(lengths) != dims[batch_axis] or (lengths < 0).any() or \
            (lengths > dims[seq_axis]).any():
        # TFLite's kernel checks the same (its run fails)
        raise UnsupportedOperator(f"REVERSE_SEQUENCE lengths {lengths.tolist()} for sequence axis {seq_axis} of "
                                  f"{dims} and batch axis {batch_axis}")

    def order(length: int) -> np.ndarray:
        return np.concatenate([np.arange(length)[::-1], np.arange(length, dims[seq_axis])]).astype(np.int32)

    def gather(source: int, length: int, target: int) -> None:
        c.emit(Op.GATHER, [source, c.i32(seq_axis), c.const_operand(order(int(length)), OperandType(
            T.TENSOR_INT32, [dims[seq_axis]]))], [target])

    if len(set(lengths.tolist())) == 1:
        gather(x, int(lengths[0]), c.output())
    elif x_type.type == T.TENSOR_INT32:
        raise UnsupportedOperator("REVERSE_SEQUENCE of TENSOR_INT32 with lengths that differ by batch entry (their "
                                  "parts are joined by CONCATENATION, which takes no int32; one length for all is "
                                  "one GATHER)")
    elif rank > 4:
        raise UnsupportedOperator(f"REVERSE_SEQUENCE of rank {rank} with lengths that differ by batch entry (their "
                                  "parts are joined by CONCATENATION, which takes rank at most 4; one length for "
                                  "all is one GATHER)")
    else:
        part = [d if a != batch_axis else 1 for a, d in enumerate(dims)]
        parts = [c.temp(x_type, part) for _ in lengths]
        c.emit(Op.SPLIT, [x, c.i32(batch_axis), c.i32(len(lengths))], parts)
        done = []
        for source, length in zip(parts, lengths, strict=True):
            target = c.temp(x_type, part)
            gather(source, int(length), target)
            done.append(target)
        c.emit(Op.CONCATENATION, [*done, c.i32(batch_axis)], [c.output()])
    c.lowered("REVERSE_SEQUENCE with constant lengths as GATHER along the sequence axis by the constant order "
              "(per batch entry: SPLIT, GATHER, CONCATENATION)")


@_converter("SPLIT")
def _split(c: _Converter, op: _Operator) -> None:
    axis = int(c.const_values(0, "axis").reshape(-1)[0])
    x = c.operand(op.inputs[1])
    outputs = [c.output(i) for i in range(len(op.outputs))]
    c.emit(Op.SPLIT, [x, c.i32(axis), c.i32(len(outputs))], outputs)


@_converter("SPLIT_V")
def _split_v(c: _Converter, op: _Operator) -> None:
    x = c.input(0)
    sizes = c.const_values(1, "size_splits").astype(np.int64).reshape(-1)
    axis = int(c.const_values(2, "axis").reshape(-1)[0])
    shape = list(_operand_shape(op.tensor(0).shape))
    axis %= len(shape)
    if -1 in sizes:
        sizes[list(sizes).index(-1)] = shape[axis] - (sizes.sum() + 1)
    start = 0
    for i, size in enumerate(sizes):
        begin = [0] * len(shape)
        begin[axis] = start
        size_vector = [-1] * len(shape)
        size_vector[axis] = int(size)
        c.emit(Op.SLICE, [x, c.vector(begin), c.vector(size_vector)], [c.output(i)])
        start += int(size)
    c.lowered(f"SPLIT_V into {len(sizes)} parts as {len(sizes)} SLICE")


@_converter("PACK")
def _pack(c: _Converter, op: _Operator) -> None:
    options = op.options("PackOptions")
    operands = [c.input(i) for i in range(len(op.inputs))]
    if all(len(op.tensor(i).shape) == 0 for i in range(len(op.inputs))):
        # Rank-0 inputs are NNAPI [1] tensors: PACK would give [n, 1], TFLite's output is [n].
        out = c.output()
        out_type = c.type_of(out)
        if out_type.type != T.TENSOR_INT32:
            c.emit(Op.CONCATENATION, [*operands, c.i32(0)], [out])
            c.lowered("PACK of rank-0 tensors (NNAPI [1] tensors) as CONCATENATION")
            return
        # int32 (index arithmetic: [row, column] for GATHER_ND): NNAPI's CONCATENATION takes
        # no int32; each scalar times a constant one-hot vector, summed, is exact.
        total = None
        for i, x in enumerate(operands):
            one_hot = np.zeros(len(operands), np.int32)
            one_hot[i] = 1
            term = out if len(operands) == 1 else c.temp(out_type)
            c.emit(Op.MUL, [x, c.const_operand(one_hot, out_type), c.i32(0)], [term])
            if total is None:
                total = term
                continue
            target = out if i == len(operands) - 1 else c.temp(out_type)
            c.emit(Op.ADD, [total, term, c.i32(0)], [target])
            total = target
        c.lowered("PACK of rank-0 int32 tensors as each times a one-hot vector (MUL), summed (ADD): NNAPI's "
                  "CONCATENATION takes no int32")
        return
    c.emit(Op.PACK, [c.i32(options.Axis()), *operands], [c.output()])


@_converter("UNPACK")
def _unpack(c: _Converter, op: _Operator) -> None:
    options = op.options("UnpackOptions")
    x = c.input(0)
    shape = list(_operand_shape(op.tensor(0).shape))
    axis = options.Axis() % len(shape)
    count = len(op.outputs)
    x_type = c.type_of(x)
    pieces_shape = [*shape[:axis], 1, *shape[axis + 1:]]
    pieces = [c.temp(x_type, pieces_shape) for _ in range(count)]
    c.emit(Op.SPLIT, [x, c.i32(axis), c.i32(count)], pieces)
    for i, piece in enumerate(pieces):
        out_shape = list(_operand_shape(op.out_tensor(i).shape))
        c.emit(Op.RESHAPE, [piece, c.vector(out_shape)], [c.output(i)])
    c.lowered(f"UNPACK as SPLIT into {count} + RESHAPE each (drops the axis)")


@_converter("FILL")
def _fill(c: _Converter, op: _Operator) -> None:
    value = c.const_values(1, "value").reshape(-1)[0]
    out_type = c.nn_type(op.out_tensor())
    scalar = {T.TENSOR_FLOAT32: c.f32, T.TENSOR_FLOAT16: c.f16, T.TENSOR_INT32: c.i32}.get(out_type.type)
    if scalar is None:
        raise UnsupportedOperator(f"FILL of {out_type.type.name}")
    c.emit(Op.FILL, [_int_vector_input(c, 0), scalar(value)], [c.output()])


@_converter("EMBEDDING_LOOKUP")
def _embedding_lookup(c: _Converter, op: _Operator) -> None:
    c.emit(Op.EMBEDDING_LOOKUP, [c.input(0), c.input(1)], [c.output()])


@_converter("HASHTABLE_LOOKUP")
def _hashtable_lookup(c: _Converter, op: _Operator) -> None:
    c.emit(Op.HASHTABLE_LOOKUP, [c.input(0), c.input(1), c.input(2)], [c.output(0), c.output(1)])


@_converter("LSH_PROJECTION")
def _lsh(c: _Converter, op: _Operator) -> None:
    kind = op.options("LSHProjectionOptions").Type()
    weight = c.input(2) if op.has_input(2) else c.omitted(OperandType(T.TENSOR_FLOAT32, [0]))
    c.emit(Op.LSH_PROJECTION, [c.input(0), c.input(1), weight, c.i32(kind)], [c.output()])
