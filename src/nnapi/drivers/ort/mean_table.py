"""The TFLite importer's quantized MEAN as a table (importers/tflite/reductions.py,
``_mean_as_table``: LiteRT's general MEAN kernel into another quantization) lowered to ONNX
Runtime from the exact integer sum.

The importer writes the integer sum S of the stored values' q - zero point through float32,
then a GATHER from the table of every possible sum's output:

    early (few values): DEQUANTIZE, REDUCE_SUM, MUL by 1 / scale, ADD 0.5, FLOOR,
                        ADD -min(S), CAST to int32, GATHER
    late:               DEQUANTIZE, MUL by 1 / scale, ADD 0.5, FLOOR, REDUCE_SUM,
                        ADD -min(S), CAST to int32, GATHER

Lowered operation by operation that is ~15 ONNX nodes (the CAST's saturation and NaN
handling, the GATHER's range check), where ORT's cost is per node: a Conv1D audio
classifier's global pool was half its graph. Here the GATHER reads
ReduceSum(Cast(q, int32)) + (c - count * zero point) instead: 4 nodes (over the middle axes,
a global pool, the sums of the stored values as one MatMulInteger with a row of ones, which
reads the 8-bit values once, indexing the table's slice from c - count * zero point on: 3).

That is the float chain's value wherever the chain gives S exactly, which holds for every
input when (checked here from the model, not assumed from the importer): the MUL's constant
is float32(1) / float32(scale) and the ADD's 0.5, the scale is a normal float32 whose
products stay finite; early: count * (count + 2) * 255 < 2**22 (DEQUANTIZE rounds each
value once, 2**-24 relative; the float32 sum of count of them in any order is within
(count + 1) * 2**-24 of the sum of magnitudes, at most count * 255 * scale; times the
rounded 1 / scale the error stays below 0.375 < 1/2, so the floor of u + 1/2 is S); late:
each value's floor(q' * k + 1/2) is its q - zero point (an error below 255 * 3 * 2**-24)
and count * 255 < 2**24 keeps the float32 sum of integers exact. The ADD's constant c is an
integer with |c| + count * 255 < 2**24 (exact), and every sum the stored values' range
allows indexes the table: the GATHER never fails, as the reference's does not.
"""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, numpy_helper

from nnapi.codes import FuseCode, OperandCode, OperationCode
from nnapi.drivers.ort.builder import (
    QUANT8,
    GraphBuilder,
    internal_kind,
    internal_zero_point,
    middle_axes_sums,
    read_counts,
)
from nnapi.hal import Operation

T = OperandCode
Op = OperationCode


def _constant_scalar(g: GraphBuilder, index: int) -> float | None:
    """A float32 constant of one element (shape [] or [1])."""
    raw = g.raw_constant(index)
    if raw is None or raw.size != 1 or g.operand(index).type != T.TENSOR_FLOAT32:
        return None
    return float(np.asarray(raw, np.float32).reshape(-1)[0])


def _step(g: GraphBuilder, index: int, code: int, constant: float | None = None) -> int | None:
    """The non-constant input of the operation of ``code`` writing float32 ``index``: for
    MUL / ADD, without a fused activation and with the other operand a one-element
    constant equal to ``constant`` when given (else any); None otherwise."""
    producer = g.producer(index)
    if producer is None or producer.type != code or g.operand(index).type != T.TENSOR_FLOAT32:
        return None
    if code == Op.FLOOR:
        return producer.inputs[0]
    if code not in (Op.MUL, Op.ADD) or g.raw_constant(producer.inputs[2]) is None \
            or int(g.scalar(producer.inputs[2])) != FuseCode.FUSED_NONE:
        return None
    for position in (0, 1):
        value, other = producer.inputs[position], producer.inputs[1 - position]
        found = _constant_scalar(g, other)
        if found is not None and g.raw_constant(value) is None and (constant is None or found == constant):
            if g.operand(value).dimensions != g.operand(index).dimensions:
                return None
            return value
    return None


def _reduce_sum(g: GraphBuilder, index: int) -> tuple[int, list[int], bool] | None:
    """(input, sorted axes, keep_dims) of the REDUCE_SUM writing ``index``."""
    producer = g.producer(index)
    if producer is None or producer.type != Op.REDUCE_SUM or any(g.raw_constant(i) is None
                                                                  for i in producer.inputs[1:]):
        return None
    source = producer.inputs[0]
    rank = len(g.operand(source).dimensions)
    axes = sorted({int(a) % rank for a in np.atleast_1d(np.asarray(g.scalar(producer.inputs[1])))} if rank else set())
    return (source, axes, bool(g.scalar(producer.inputs[2]))) if axes else None


def _dequantized(g: GraphBuilder, index: int) -> int | None:
    """The 8-bit input of the DEQUANTIZE writing float32 ``index``."""
    producer = g.producer(index)
    if producer is None or producer.type != Op.DEQUANTIZE or g.operand(index).type != T.TENSOR_FLOAT32:
        return None
    source = producer.inputs[0]
    return source if g.operand(source).type in QUANT8 else None


def lower_table_mean(g: GraphBuilder, operation: Operation) -> bool:
    """GATHER ``operation`` as the table lookup of the exact integer sum (see the module's
    text); False where the chain is not there or not proven exact (the GATHER lowers as
    one)."""
    if g.isolated or len(operation.inputs) != 3 or g.raw_constant(operation.inputs[0]) is None:
        return False
    table, index = g.operand(operation.inputs[0]), operation.inputs[2]
    if len(table.dimensions) != 1 or g.raw_constant(operation.inputs[1]) is None \
            or int(g.scalar(operation.inputs[1])) != 0:
        return False
    cast = g.producer(index)
    if cast is None or cast.type != Op.CAST or g.operand(index).type != T.TENSOR_INT32:
        return False
    shifted = cast.inputs[0]
    offset_producer = g.producer(shifted)
    whole = _step(g, shifted, Op.ADD)
    if whole is None or offset_producer is None:
        return False
    offset = next(v for v in (_constant_scalar(g, i) for i in offset_producer.inputs[:2]) if v is not None)
    reduced = _reduce_sum(g, whole)
    if reduced is not None:  # late: the sum of each value's recovered integer
        source, axes, keep = reduced
        halves = _step(g, source, Op.FLOOR)
        scaled = None if halves is None else _step(g, halves, Op.ADD, 0.5)
        real = None if scaled is None else _step(g, scaled, Op.MUL)
        early = False
    else:  # early: the recovered integer of the float sum
        halves = _step(g, whole, Op.FLOOR)
        scaled = None if halves is None else _step(g, halves, Op.ADD, 0.5)
        summed = None if scaled is None else _step(g, scaled, Op.MUL)
        reduced = None if summed is None else _reduce_sum(g, summed)
        if reduced is None:
            return False
        real, axes, keep = reduced
        early = True
    stored = None if real is None else _dequantized(g, real)
    if stored is None:
        return False
    quantized = g.operand(stored)
    dims = quantized.dimensions
    multiply = g.producer(scaled)
    factor = next(v for v in (_constant_scalar(g, i) for i in multiply.inputs[:2]) if v is not None)
    scale = np.float32(quantized.scale)
    if not dims or not all(dims) or not np.isfinite(scale) or scale < np.finfo(np.float32).tiny \
            or np.float32(factor) != np.float32(1.0) / scale:
        return False
    count = int(np.prod([dims[a] for a in axes]))
    with np.errstate(over="ignore"):
        if not np.isfinite(np.float32(255 * count) * scale * np.float32(2) * np.float32(factor)):
            return False
    if (early and count * (count + 2) * 255 >= 1 << 22) or count * 255 >= 1 << 24:
        return False
    if offset != int(offset) or abs(offset) + count * 255 >= 1 << 24:
        return False
    info = np.iinfo(np.uint8 if quantized.type == T.TENSOR_QUANT8_ASYMM else np.int8)
    low, high = count * (int(info.min) - quantized.zero_point), count * (int(info.max) - quantized.zero_point)
    if low + int(offset) < 0 or high + int(offset) >= table.dimensions[0]:
        return False
    values, output = g.value(operation.inputs[0]), g.operand(operation.outputs[0])
    x = g.value(stored)
    if x.kind != "uint8" or list(g.operand(index).dimensions) != list(g.operand(whole).dimensions) \
            or (output.type in QUANT8 and (values.scale, values.zero_point)
                != (output.scale, internal_zero_point(output))) or internal_kind(output.type) != values.kind:
        return False
    if len(dims) >= 3 and axes == list(range(1, len(dims) - 1)):
        # a global pool (the middle axes: time, or height and width): the sums of q - zero
        # point in one MatMulInteger that reads the 8-bit values once (mobilenet_v2 int8's
        # 7x7x1280: 41 us as Cast + int32 ReduceSum)
        # The sums of the internal values themselves (0 .. count * 255) index the table's
        # slice from the shift on where nothing else reads the table: no Add per run (a
        # Conv1D audio classifier: one of its 16 ORT nodes)
        shift = int(offset) - count * x.zero_point
        table = g.initializer_index().by_key.get(values.name)
        sliced = table is not None and read_counts(g.nodes).get(values.name, 0) == 0 \
            and 0 <= shift and shift + count * 255 < table.dims[0]
        sums = g.one("Reshape", [middle_axes_sums(g, x.name, dims, 0 if sliced else x.zero_point),
                                 g.constant(np.array(g.operand(index).dimensions, np.int64))])
        if sliced:
            table.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(table)[shift:shift + count * 255 + 1],
                                                   values.name))
            shift = 0
        else:
            shift = int(offset)
    else:
        sums = g.one("ReduceSum", [g.one("Cast", [x.name], to=TensorProto.INT32),
                                   g.constant(np.array(axes, np.int64))], keepdims=int(keep))
        if not keep and len(axes) == len(dims):
            sums = g.one("Reshape", [sums, g.constant(np.array([1], np.int64))])  # NNAPI's [1]
        # x's internal values are q - zero point + x.zero_point
        shift = int(offset) - count * x.zero_point
    indices = g.one("Add", [sums, g.constant(np.array(shift, np.int32))]) if shift else sums
    g.set_output(operation.outputs[0], g.one("Gather", [values.name, indices], axis=0))
    return True
