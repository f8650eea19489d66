"""TFLite import: reductions (MEAN, SUM, REDUCE_*), ARG_MAX / ARG_MIN, TOPK_V2 and CUMSUM.
"""

from __future__ import annotations

import numpy as np

from nnapi.codes import OperandCode as T
from nnapi.codes import OperationCode as Op
from nnapi.importers.tflite.converter import _Converter, _converter
from nnapi.importers.tflite.high_rank import _MAX_RANK, _finish_lifted, _lifted_reduction
from nnapi.importers.tflite.quantization import _check_stored_values_recovered
from nnapi.importers.tflite.reader import _INT32, _INT64, _QUANT8, UnsupportedOperator, _operand_shape, _Operator
from nnapi.operand import OperandType
from nnapi.operations.quant_math import mean_multiplier, multiply_by_quantized_multiplier, rescale_multipliers

_REDUCERS = {"MEAN": Op.MEAN, "SUM": Op.REDUCE_SUM, "REDUCE_MAX": Op.REDUCE_MAX, "REDUCE_MIN": Op.REDUCE_MIN,
             "REDUCE_PROD": Op.REDUCE_PROD, "REDUCE_ANY": Op.REDUCE_ANY, "REDUCE_ALL": Op.REDUCE_ALL}


def _reduce(c: _Converter, op: _Operator) -> None:
    code = _REDUCERS[op.name]
    options = op.options("ReducerOptions")
    keep = bool(options.KeepDims()) if options is not None else False
    lifted = _lifted_reduction(c, op) if len(op.tensor(0).shape) > _MAX_RANK else None
    if lifted is not None:
        # above rank 4: on merged axes, the axes kept as 1 (the result's elements are the
        # output's, in order)
        x, axes_values, out = lifted
        keep = True
        axes = c.vector(axes_values)
    else:
        x = c.input(0)
        axes_const = c.const_of(op.inputs[1])
        axes_values = None if axes_const is None else np.asarray(axes_const.data).reshape(-1).tolist()
        axes = c.vector(axes_values) if axes_values is not None else c.input(1)
        out = None
    keep_operand = c.i32(int(keep)) if code == Op.MEAN else c.boolean(keep)
    x_type = c.type_of(x)
    out_type = c.nn_type(op.out_tensor())
    requantize = x_type.type in _QUANT8 and (x_type.scale, x_type.zero_point) != (out_type.scale,
                                                                                   out_type.zero_point)
    if code == Op.REDUCE_PROD and x_type.type in _QUANT8:
        raise UnsupportedOperator("quantized REDUCE_PROD: NNAPI's REDUCE_PROD takes float tensors only, and "
                                  "TFLite's integer product rescales after every multiplication, which no "
                                  "NNAPI sequence reproduces")
    if requantize and code == Op.REDUCE_SUM:
        out = c.output() if out is None else out
        if not _mean_as_table(c, x, x_type, out_type, axes_values, keep, out, as_sum=True):
            raise UnsupportedOperator("quantized SUM with another output quantization than the input's needs "
                                      "constant axes, a static shape and at most "
                                      f"{_MEAN_TABLE_MAX} possible sums (TFLite's rescale is looked up in a table)")
        if lifted is not None:
            _finish_lifted(c, op, out)
        return
    if requantize and code != Op.MEAN:
        # TFLite's own kernel refuses this too (its XNNPACK delegate copies the integers).
        raise UnsupportedOperator(f"quantized {op.name} needs the output's scale and zero point equal to the "
                                  "input's")
    out = c.output() if out is None else out
    if not requantize:
        c.emit(code, [x, axes, keep_operand], [out])
    elif not (not _tflite_mean_4d(c, op) and (
            _mean_as_fully_connected(c, x, x_type, out_type, axes_values, keep, out, exact=True) or
            _mean_as_table(c, x, x_type, out_type, axes_values, keep, out)) or
              _mean_as_fully_connected(c, x, x_type, out_type, axes_values, keep, out)):
        # NNAPI's quantized MEAN keeps the input's scale; TFLite rescales the sum to the
        # output's. The float path computes the exact mean and rounds it once.
        real = c.temp(OperandType(T.TENSOR_FLOAT32, x_type.dimensions))
        c.emit(Op.DEQUANTIZE, [x], [real])
        mean = c.temp(OperandType(T.TENSOR_FLOAT32, c.type_of(out).dimensions))
        c.emit(Op.MEAN, [real, axes, keep_operand], [mean])
        c.emit(Op.QUANTIZE, [mean], [out])
        c.lowered("quantized MEAN with an output scale other than the input's: DEQUANTIZE + float MEAN + "
                  "QUANTIZE (one rounding, as TFLite)")
    if lifted is not None:
        _finish_lifted(c, op, out)
        c.lowered(f"{op.name} of rank {len(op.tensor(0).shape)} on merged axes: over axes {axes_values} of "
                  f"{list(x_type.dimensions)}" + (f"; {c._lowering_reason}" if c._lowering_reason else ""))


def _tflite_mean_4d(c: _Converter, op: _Operator) -> bool:
    """Whether LiteRT runs quantized MEAN ``op`` with its 4-D kernel (keep_dims, rank 4, axes
    exactly 1 and 2: a global average pool), which rounds otherwise than its general one.
    Such a MEAN keeps the FULLY_CONNECTED lowering: its results are those of LiteRT's
    default XNNPACK delegate on the shared int8 MobileNets (0 steps; within one step of
    the builtin 4-D kernel), which a table of the builtin kernel's would move a step away."""
    options = op.options("ReducerOptions")
    axes = c.const_of(op.inputs[1])
    return options is not None and bool(options.KeepDims()) and len(op.tensor(0).shape) == 4 and \
        axes is not None and sorted(np.asarray(axes.data).reshape(-1).tolist()) == [1, 2]


#: the most entries _mean_as_table's table of outputs holds (one per possible integer sum)
_MEAN_TABLE_MAX = 1 << 20


def _tflite_sum_rescale(sums: np.ndarray, count: int, x_type: OperandType, out_type: OperandType) -> np.ndarray:
    """LiteRT's 8-bit SUM with another output quantization than the input's (its builtin
    kernel: QuantizedMeanOrSum with compute_sum), from the integer sums S of (q - input zero
    point): in float32, S_raw * (input scale / output scale) + bias with S_raw = S + count *
    zero point (the stored values' sum) and bias = -zero point * scale * count, rounded half
    away from zero, plus the output zero point, saturated to the 8-bit range (measured on
    LiteRT 2.21's builtin kernel: 0 of 768 sums off, ties included; its XNNPACK delegate
    rounds ties otherwise, 46 of them)."""
    scale = np.float32(np.float32(x_type.scale) / np.float32(out_type.scale))
    bias = np.float32(np.float32(np.float32(-x_type.zero_point) * scale) * np.float32(count))
    raw = (sums + count * x_type.zero_point).astype(np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        value = (raw * scale + bias).astype(np.float64)
    rounded = np.sign(value) * np.floor(np.abs(value) + 0.5) + out_type.zero_point
    info = np.iinfo(out_type.dtype)
    return np.clip(np.nan_to_num(rounded), info.min, info.max).astype(out_type.dtype)


def _mean_as_table(c: _Converter, x: int, x_type: OperandType, out_type: OperandType,
                   axes_values: list[int] | None, keep: bool, out: int, as_sum: bool = False) -> bool:
    """A quantized MEAN whose output quantization differs from its input's, with constant
    axes and a static shape, exactly as LiteRT's general kernel computes it (every MEAN but
    _tflite_mean_4d's). Its output is a function of the integer sum S of (q - input zero
    point) alone, MultiplyByQuantizedMultiplier(S, m, e) + output zero point with TFLite's
    multiplier (``quant_math.mean_multiplier``: its mantissa is not renormalized, so no
    NNAPI requantization reproduces it), so the outputs of every possible S are a table
    made here, and the operations compute S and GATHER from it. S comes exactly from
    float32: DEQUANTIZE gives (q - zero point) * scale within 2**-24 relative; for up to
    127 values REDUCE_SUM of those (in any order: within (count + 1) * 2**-24 of the sum of
    magnitudes), MUL by 1 / scale, ADD 0.5 and FLOOR give S (the error stays below 0.25:
    count * (count + 2) * 255 < 2**22), one pass over the input besides DEQUANTIZE; for more,
    MUL by 1 / scale, ADD 0.5 and FLOOR give each integer q - zero point back (|q - zero
    point| <= 255: the error stays below 1e-4) and REDUCE_SUM adds integers exactly (|S| <
    2**24 for tables up to _MEAN_TABLE_MAX). ADD of -min(S) and CAST to int32 give the
    table's index. False
    (nothing emitted) for open shapes, axes given at run time or a table above
    _MEAN_TABLE_MAX entries. ``as_sum``: a quantized SUM instead, the table
    _tflite_sum_rescale's."""
    dims = list(x_type.dimensions)
    if axes_values is None or not dims or not all(d > 0 for d in dims) or \
            not all(d > 0 for d in c.type_of(out).dimensions):
        return False
    rank = len(dims)
    axes = sorted({int(a) % rank for a in axes_values})
    count = int(np.prod([dims[a] for a in axes]))
    info = np.iinfo(x_type.dtype)
    low, high = count * (int(info.min) - x_type.zero_point), count * (int(info.max) - x_type.zero_point)
    if not axes or high - low + 1 > _MEAN_TABLE_MAX:
        return False
    what = "SUM" if as_sum else "MEAN"
    _check_stored_values_recovered(x_type, 0, f"quantized {what} with an output scale other than the input's")
    sums = np.arange(low, high + 1, dtype=np.int64)
    if as_sum:
        table = _tflite_sum_rescale(sums, count, x_type, out_type)
    else:
        fixed, exponent = mean_multiplier(x_type.scale, out_type.scale, count)
        outputs = multiply_by_quantized_multiplier(sums, fixed, exponent) + out_type.zero_point
        out_info = np.iinfo(out_type.dtype)
        table = np.clip(outputs, out_info.min, out_info.max)
    out_dims = list(c.type_of(out).dimensions)
    real = c.temp(OperandType(T.TENSOR_FLOAT32, dims))
    c.emit(Op.DEQUANTIZE, [x], [real])
    scale = np.float32(x_type.scale)
    with np.errstate(over="ignore"):
        largest = np.float32(max(-low, high)) * scale * np.float32(2)
        # the error bound of summing first holds for normal float32 values whose sum stays
        # finite (and its product by 1 / scale): else each value is recovered first
        early = count * (count + 2) * 255 < 1 << 22 and scale >= np.finfo(np.float32).tiny and \
            bool(np.isfinite(largest * (np.float32(1.0) / scale)))
    # sum first where its float32 error stays below 0.25 of a unit (_mean_as_table)
    summed_dims = out_dims if early else dims
    scaled, halves, whole = (c.temp(OperandType(T.TENSOR_FLOAT32, summed_dims)) for _ in range(3))
    total, shifted = (c.temp(OperandType(T.TENSOR_FLOAT32, out_dims)) for _ in range(2))
    if early:
        c.emit(Op.REDUCE_SUM, [real, c.vector(axes), c.boolean(keep)], [total])
    c.emit(Op.MUL, [total if early else real, c.const_operand(np.float32(1.0) / np.float32(x_type.scale),
                                                              OperandType(T.TENSOR_FLOAT32, [1])), c.i32(0)], [scaled])
    c.emit(Op.ADD, [scaled, c.const_operand(np.float32(0.5), OperandType(T.TENSOR_FLOAT32, [1])), c.i32(0)],
           [halves])
    c.emit(Op.FLOOR, [halves], [whole])
    if not early:
        c.emit(Op.REDUCE_SUM, [whole, c.vector(axes), c.boolean(keep)], [total])
    c.emit(Op.ADD, [whole if early else total, c.const_operand(np.float32(-low), OperandType(T.TENSOR_FLOAT32, [1])),
                    c.i32(0)], [shifted])
    index = c.temp(OperandType(T.TENSOR_INT32, out_dims))
    c.emit(Op.CAST, [shifted], [index])
    values = c.const_operand(table, OperandType(out_type.type, [table.size], out_type.scale, out_type.zero_point))
    c.emit(Op.GATHER, [values, c.i32(0), index], [out])
    steps = "REDUCE_SUM, MUL by 1 / scale, ADD 0.5, FLOOR" if early else "MUL by 1 / scale, ADD 0.5, FLOOR, REDUCE_SUM"
    c.lowered(f"quantized {what} with an output scale other than the input's as LiteRT's "
              f"{'kernel' if as_sum else 'general kernel'} computes it: the integer sum of the {count} values "
              f"(DEQUANTIZE, {steps}), its output looked up in a table of the {table.size} possible sums (GATHER)")
    return True


#: how many float32 neighbours of the ideal weight scale _mean_as_fully_connected tries
_WEIGHT_SCALE_SEARCH = 64


def _mean_as_fully_connected(c: _Converter, x: int, x_type: OperandType, out_type: OperandType,
                             axes_values: list[int] | None, keep: bool, out: int, exact: bool = False) -> bool:
    """A quantized MEAN whose output quantization differs from its input's, with constant
    axes and a static shape, as TFLite's kernel computes it up to its multiplier: the
    reduced axes moved last (TRANSPOSE), a FULLY_CONNECTED by one unit of weights all 1
    (zero point 0), whose int32 accumulator is TFLite's sum of q - zero point, its output
    stage the rescale, then RESHAPE to ``out``'s shape. TFLite's multiplier
    (``quant_math.mean_multiplier``) is matched as closely as the weight scale allows:
    NNAPI derives FULLY_CONNECTED's from float32(input scale * weight scale) / output
    scale, so the float32 weight scales next to the ideal one are tried and the nearest
    multiplier kept; TFLite's own is not renormalized (its mantissa may lie below 2**30),
    which no NNAPI multiplier reproduces. Measured against LiteRT's builtin Mean on 400
    random quantizations: 7 of 3,098 values a step off (the float path: 38). ``exact``: only
    with a weight scale whose multiplier gives TFLite's output on every possible sum
    (_exact_weight_scale: a ViT's LayerNormalization variances, not its means), which
    costs ORT a third of _mean_as_table's nodes. False (nothing emitted) for open shapes,
    axes given at run time, a multiplier of 1 or more, or (``exact``) no such scale."""
    dims = list(x_type.dimensions)
    if axes_values is None or not dims or not all(d > 0 for d in dims):
        return False
    rank = len(dims)
    axes = sorted({int(a) % rank for a in axes_values})
    count = int(np.prod([dims[a] for a in axes]))
    fixed, exponent = mean_multiplier(x_type.scale, out_type.scale, count)
    target = fixed * 2.0 ** (exponent - 31)
    if not axes or not 0 < target < 1:
        return False
    found = _exact_weight_scale(x_type, out_type, count, fixed, exponent, target) if exact else \
        _nearest_weight_scale(x_type.scale, out_type.scale, target)
    if found is None:
        return False
    weight_scale = found
    kept = [a for a in range(rank) if a not in axes]
    source = x
    if kept + axes != list(range(rank)):
        source = c.temp(x_type, [dims[a] for a in kept + axes])
        c.emit(Op.TRANSPOSE, [x, c.vector(kept + axes)], [source])
    rows = int(np.prod([dims[a] for a in kept]))
    weights = c.const_operand(np.ones((1, count), x_type.dtype), OperandType(x_type.type, [1, count], weight_scale, 0))
    bias_scale = float(np.float32(x_type.scale) * np.float32(weight_scale))
    bias = c.const_operand(np.zeros(1, np.int32), OperandType(T.TENSOR_INT32, [1], bias_scale, 0))
    summed = c.temp(out_type, [rows, 1])
    c.emit(Op.FULLY_CONNECTED, [source, weights, bias, c.i32(0)], [summed])
    shape = [1 if a in axes else d for a, d in enumerate(dims)] if keep else [dims[a] for a in kept]
    c.emit(Op.RESHAPE, [summed, c.vector(shape or [1])], [out])
    c.lowered("quantized MEAN with an output scale other than the input's as FULLY_CONNECTED by ones (the "
              "reduced axes moved last): TFLite's int32 sum rescaled once, " +
              ("by a multiplier giving TFLite's output on every possible sum (checked at import)" if exact else
               "its multiplier matched to the nearest NNAPI one"))
    return True


#: how many sums _exact_weight_scale rescales in all (candidates checked times possible sums)
_EXACT_CHECK_BUDGET = 4_000_000


def _exact_weight_scale(x_type: OperandType, out_type: OperandType, count: int, fixed: int, exponent: int,
                        target: float) -> float | None:
    """A float32 weight scale among _nearest_weight_scale's candidates (nearest first) whose
    NNAPI multiplier gives TFLite's general kernel's output (``fixed``, ``exponent``: its
    mean multiplier) on every possible sum of ``count`` values; None where none does within
    the checks allowed (_EXACT_CHECK_BUDGET sums in all: a few tens of ms per MEAN)."""
    info, out_info = np.iinfo(x_type.dtype), np.iinfo(out_type.dtype)
    low, high = count * (int(info.min) - x_type.zero_point), count * (int(info.max) - x_type.zero_point)
    if high - low + 1 > _MEAN_TABLE_MAX:
        return None
    sums = np.arange(low, high + 1, dtype=np.int64)
    want = np.clip(multiply_by_quantized_multiplier(sums, fixed, exponent) + out_type.zero_point,
                   out_info.min, out_info.max)
    s_in, s_out = np.float32(x_type.scale), np.float32(out_type.scale)
    ideal = np.float32(target * float(s_out) / float(s_in))
    steps = np.arange(-_WEIGHT_SCALE_SEARCH, _WEIGHT_SCALE_SEARCH + 1)
    candidates = (np.int64(ideal.view(np.int32)) + steps).astype(np.int32).view(np.float32)
    multipliers, exponents = rescale_multipliers(s_in, candidates, s_out)
    errors = np.abs(multipliers * np.exp2(exponents.astype(np.float64) - 31) - target)
    checks = max(1, _EXACT_CHECK_BUDGET // sums.size)
    for k in np.argsort(errors, kind="stable")[:checks]:
        got = np.clip(multiply_by_quantized_multiplier(sums, int(multipliers[k]), int(exponents[k])) +
                      out_type.zero_point, out_info.min, out_info.max)
        if np.array_equal(got, want):
            return float(candidates[k])
    return None


def _nearest_weight_scale(input_scale: float, output_scale: float, target: float) -> float:
    """The float32 weight scale w whose NNAPI multiplier QuantizeMultiplier(float32(
    input scale * w) / output scale) is nearest ``target`` (ties: the first found)."""
    s_in, s_out = np.float32(input_scale), np.float32(output_scale)
    ideal = np.float32(target * float(s_out) / float(s_in))
    steps = np.arange(-_WEIGHT_SCALE_SEARCH, _WEIGHT_SCALE_SEARCH + 1)
    # float32 neighbours by their bit patterns (positive finite scales: consecutive integers)
    candidates = (np.int64(ideal.view(np.int32)) + steps).astype(np.int32).view(np.float32)
    fixed, exponent = rescale_multipliers(s_in, candidates, s_out)
    errors = np.abs(fixed * np.exp2(exponent.astype(np.float64) - 31) - target)
    return float(candidates[int(np.argmin(errors))])


for _name in _REDUCERS:
    _converter(_name)(_reduce)


#: the longest axis CUMSUM becomes a matrix for (its [n, n] weights: 4 MiB of float32)
_CUMSUM_MAX = 1024


@_converter("CUMSUM")
def _cumsum(c: _Converter, op: _Operator) -> None:
    """Float CUMSUM along a constant axis of a static shape as FULLY_CONNECTED by a
    triangular 0 / 1 matrix (exclusive: strictly triangular; reverse: the other triangle),
    the axis moved last by TRANSPOSE and back. Every product is exact; the sums round in
    another order than a running sum's. NNAPI has no cumulative sum."""
    options = op.options("CumsumOptions")
    axis = int(c.const_values(1, "axis").reshape(-1)[0])
    shape = list(_operand_shape(op.tensor(0).shape))
    x = c.input(0)
    x_type = c.type_of(x)
    if x_type.type != T.TENSOR_FLOAT32 or 0 in shape or not x_type.is_fully_specified:
        raise UnsupportedOperator("CUMSUM other than of float32 of a static shape has no NNAPI sequence")
    rank = len(shape)
    axis %= rank
    n = shape[axis]
    if n > _CUMSUM_MAX:
        raise UnsupportedOperator(f"CUMSUM along {n} elements (at most {_CUMSUM_MAX} as a matrix)")
    exclusive = bool(options.Exclusive()) if options is not None else False
    reverse = bool(options.Reverse()) if options is not None else False
    out_index, in_index = np.indices((n, n))
    # output j sums inputs i <= j (reverse: i >= j); exclusive leaves out i == j
    weights = (in_index >= out_index) if reverse else (in_index <= out_index)
    if exclusive:
        weights &= in_index != out_index
    perm = [d for d in range(rank) if d != axis] + [axis]
    moved_shape = [shape[d] for d in perm]
    source = x
    if perm != list(range(rank)):
        source = c.temp(x_type, moved_shape)
        c.emit(Op.TRANSPOSE, [x, c.vector(perm)], [source])
    rows = int(np.prod(moved_shape[:-1]))
    flat = c.temp(x_type, [rows, n])
    c.emit(Op.RESHAPE, [source, c.vector([rows, n])], [flat])
    summed = c.temp(x_type, [rows, n])
    matrix = c.const_operand(weights.astype(np.float32), OperandType(T.TENSOR_FLOAT32, [n, n]))
    no_bias = c.const_operand(np.zeros(n, np.float32), OperandType(T.TENSOR_FLOAT32, [n]))
    c.emit(Op.FULLY_CONNECTED, [flat, matrix, no_bias, c.i32(0)], [summed])
    if perm == list(range(rank)):
        c.emit(Op.RESHAPE, [summed, c.vector(shape)], [c.output()])
    else:
        moved = c.temp(x_type, moved_shape)
        c.emit(Op.RESHAPE, [summed, c.vector(moved_shape)], [moved])
        c.emit(Op.TRANSPOSE, [moved, c.vector(list(np.argsort(perm)))], [c.output()])
    c.lowered("CUMSUM as FULLY_CONNECTED by a triangular 0 / 1 matrix (the axis moved last by TRANSPOSE): "
              "NNAPI has no cumulative sum")


@_converter("ARG_MAX", "ARG_MIN")
def _arg(c: _Converter, op: _Operator) -> None:
    axis = int(c.const_values(1, "axis").reshape(-1)[0])
    if op.out_tensor().tfl_type not in (_INT32, _INT64):
        raise UnsupportedOperator(f"{op.name} with {op.out_tensor().type_name} output (NNAPI outputs int32)")
    code = Op.ARGMAX if op.name == "ARG_MAX" else Op.ARGMIN
    if op.out_tensor().tfl_type == _INT64:
        # tf.argmax's default: an index always fits int32, which NNAPI outputs; the tensor
        # stays int32 (readers take it as such; a model output is widened by Session)
        tensor = op.outputs[0]
        out = c.add(OperandType(T.TENSOR_INT32, _operand_shape(op.out_tensor().shape)))
        c.operands[tensor] = out
        c.narrowed.add(tensor)
        c.emit(code, [c.input(0), c.i32(axis)], [out])
        c.lowered(f"{op.name} with int64 output as int32 (an index fits; NNAPI outputs int32)")
        return
    c.emit(code, [c.input(0), c.i32(axis)], [c.output()])


@_converter("TOPK_V2")
def _topk(c: _Converter, op: _Operator) -> None:
    """Of equal values TFLite's TOPK_V2 lists the lower index first (topk_v2.cc); Android's
    the higher one (TopK_V2.cpp sorts (value, index) pairs and reverses them). TOPK_V2 of the
    row reversed (a GATHER of the indices n-1 .. 0) lists the lower original index first;
    a GATHER from n-1 .. 0 maps its indices back (n - 1 - index)."""
    k = int(c.const_values(1, "k").reshape(-1)[0])
    x = c.input(0)
    x_type = c.type_of(x)
    n = op.tensor(0).shape[-1] if len(op.tensor(0).shape) else -1
    if n < 0:
        raise UnsupportedOperator("TOPK_V2 of rows of unknown length (TFLite's order of equal values, lower "
                                  "index first, is reproduced by reversing the row, which needs its length)")
    if n == 1:
        c.emit(Op.TOPK_V2, [x, c.i32(k)], [c.output(0), c.output(1)])
        return
    reversed_x = c.temp(x_type)
    c.emit(Op.GATHER, [x, c.i32(x_type.rank - 1), c.vector(np.arange(n - 1, -1, -1))], [reversed_x])
    indices = c.output(1)
    reversed_indices = c.temp(c.type_of(indices))
    c.emit(Op.TOPK_V2, [reversed_x, c.i32(k)], [c.output(0), reversed_indices])
    # n - 1 - index as a GATHER from [n - 1 .. 0]: SUB is limited to rank 4, GATHER is not
    original = c.const_operand(np.arange(n - 1, -1, -1, dtype=np.int32), OperandType(T.TENSOR_INT32, [n]))
    c.emit(Op.GATHER, [original, c.i32(0), reversed_indices], [indices])
    c.lowered("TOPK_V2 of the row reversed (GATHER), its indices mapped back: equal values lower index first, "
              "as TFLite (Android's TOPK_V2 lists the higher index first)")
