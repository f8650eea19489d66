"""Lowerings of the table lookups EMBEDDING_LOOKUP and HASHTABLE_LOOKUP to ONNX Gather,
exact for every value type (rows are copied, never computed).

- EMBEDDING_LOOKUP: output row i is values[lookups[i]]. NNAPI refuses a lookup outside
  [0, rows) where ONNX's Gather would count a negative one from the end: negative lookups
  are sent past any row, so that Gather refuses them too and the run fails (OP_FAILED) as
  the reference's does, never reading another row.
- HASHTABLE_LOOKUP: lookups compared with every key (an [k, n] Equal), the first key equal
  to each lookup found by ArgMax (the reference's binary search over the sorted keys
  finds the first of equal keys too), its values row gathered, and stored zeros (raw
  0 bytes, quantized ones included, as Android fills them) where no key is equal; the
  hits output is 1 / 0 as TENSOR_QUANT8_ASYMM. Keys and values of different lengths fail
  the run, as on the reference. NNAPI requires the keys sorted ascending (a binary
  search over unsorted ones may miss a key that is there, which this comparison would
  find): as on the reference, keys given at run time out of order fail the run, and
  constant ones out of order are declined naming the rule (the reference refuses them).

A QUANTIZE of an EMBEDDING_LOOKUP of a constant float32 table (``quantized_lookup``, called
by the QUANTIZE lowering) gathers rows of the table quantized once at preparation.

The device module imports this one, which registers these lowerings with ``lowering``.
"""

from __future__ import annotations

import numpy as np
from onnx import TensorProto

from nnapi.codes import OperandCode, OperationCode
from nnapi.drivers.ort.builder import (
    QUANT8,
    Declined,
    GraphBuilder,
    check_same_quantization,
    encode,
    fail_unless,
    has_kernel,
    lowers,
)
from nnapi.hal import Operand, Operation
from nnapi.operand import OperandType, dtype_of
from nnapi.operations import ExecutionContext, Tensor, get_operation
from nnapi.operations.lookup import UNSORTED_KEYS, keys_sorted

T = OperandCode
#: the value types each lookup takes (the reference's lists)
_EMBEDDING_TYPES = (T.TENSOR_FLOAT32, T.TENSOR_FLOAT16, T.TENSOR_INT32, T.TENSOR_QUANT8_ASYMM,
                    T.TENSOR_QUANT8_ASYMM_SIGNED)
_HASHTABLE_TYPES = (T.TENSOR_FLOAT32, T.TENSOR_INT32, T.TENSOR_QUANT8_ASYMM)


def _lookups(g: GraphBuilder, index: int) -> str:
    value = g.value(index)
    if value.kind != "int32" or value.rank != 1:
        raise Declined("the lookups must be a 1-D TENSOR_INT32")
    return value.name


@lowers(OperationCode.EMBEDDING_LOOKUP)
def lower_embedding_lookup(g: GraphBuilder, operation: Operation) -> None:
    lookups = _lookups(g, operation.inputs[0])
    values = g.value(operation.inputs[1])
    if g.operand(operation.inputs[1]).type not in _EMBEDDING_TYPES or values.rank < 2:
        raise Declined("EMBEDDING_LOOKUP takes values of rank 2 or more of a listed type")
    check_same_quantization(values, g.operand(operation.outputs[0]))
    # a negative lookup sent past any row: Gather refuses it as the reference does
    past = g.constant(np.array(np.iinfo(np.int32).max, np.int32))
    rows = g.one("Where", [g.one("Less", [lookups, g.constant(np.array(0, np.int32))]), past, lookups])
    g.set_output(operation.outputs[0], g.one("Gather", [values.name, rows], axis=0))


#: the largest constant table (elements) quantized at preparation for quantized_lookup
_QUANTIZED_TABLE_ELEMENTS = 1 << 24


def quantized_lookup(g: GraphBuilder, operation: Operation) -> bool:
    """Lowers QUANTIZE ``operation`` of an EMBEDDING_LOOKUP of a constant float32 table
    (through RESHAPEs: PT2E language models quantize the token embeddings first) as a
    Gather of the reference's own QUANTIZE of the whole table, computed once here: the
    rows are copied, so each value is the reference's bit for bit, where the general
    rounding took eight nodes over the gathered rows. False, with nothing emitted, where
    the QUANTIZE reads anything else (or the table is larger than 16M values)."""
    index, moves = operation.inputs[0], 0
    producer = g.producer(index)
    while producer is not None and producer.type == OperationCode.RESHAPE and moves < 4:
        index, producer, moves = producer.inputs[0], g.producer(producer.inputs[0]), moves + 1
    output = g.operand(operation.outputs[0])
    if producer is None or producer.type != OperationCode.EMBEDDING_LOOKUP or output.type not in QUANT8 or \
            not all(output.dimensions):
        return False
    table_operand = g.operand(producer.inputs[1])
    table = g.raw_constant(producer.inputs[1])
    if table_operand.type != T.TENSOR_FLOAT32 or table is None or table.size > _QUANTIZED_TABLE_ELEMENTS:
        return False
    gathered = g.value(producer.outputs[0]).name
    gather = g.node_index().by_key.get(gathered)
    if gather is None or gather.op_type != "Gather":
        return False
    quantized = reference_quantize(table.reshape(tuple(table_operand.dimensions)), output)
    rows = g.one("Gather", [g.constant(quantized, "table"), gather.input[1]], axis=0)
    g.set_output(operation.outputs[0], g.one("Reshape", [rows, g.constant(np.array(output.dimensions, np.int64))]))
    return True


def reference_quantize(table: np.ndarray, output: Operand | OperandType) -> np.ndarray:
    """The reference's QUANTIZE of float32 ``table`` into ``output``'s quantization, in its
    internal encoding (uint8)."""
    target = OperandType(output.type, list(table.shape), output.scale, output.zero_point)
    stored = get_operation(OperationCode.QUANTIZE).execute(ExecutionContext(
        OperationCode.QUANTIZE, [Tensor(T.TENSOR_FLOAT32, table.shape, 0.0, 0, None, table)], [target]))[0]
    return encode(np.asarray(stored).reshape(table.shape), output)


@lowers(OperationCode.HASHTABLE_LOOKUP)
def lower_hashtable_lookup(g: GraphBuilder, operation: Operation) -> None:
    lookups = _lookups(g, operation.inputs[0])
    keys = _lookups(g, operation.inputs[1])
    values_operand = g.operand(operation.inputs[2])
    values = g.value(operation.inputs[2])
    if values_operand.type not in _HASHTABLE_TYPES or values.rank < 2:
        raise Declined("HASHTABLE_LOOKUP takes values of rank 2 or more of a listed type")
    output, hits_operand = (g.operand(i) for i in operation.outputs)
    check_same_quantization(values, output)
    if hits_operand.type != T.TENSOR_QUANT8_ASYMM or (hits_operand.scale, hits_operand.zero_point) != (1.0, 0):
        raise Declined("the hits output must be TENSOR_QUANT8_ASYMM of scale 1 and zero point 0")
    if not has_kernel("ArgMax", TensorProto.INT32, axis=0):
        raise Declined("this onnxruntime has no ArgMax kernel for int32 values")
    constant_keys = g.raw_constant(operation.inputs[1])
    if constant_keys is not None and not keys_sorted(constant_keys):
        raise Declined(UNSORTED_KEYS)
    first = g.constant(np.array([0], np.int64))
    equal = g.one("Equal", [g.one("Unsqueeze", [lookups, g.constant(np.array([1], np.int64))]),
                            g.one("Unsqueeze", [keys, first])])
    matches = g.one("Cast", [equal], to=TensorProto.INT32)
    hit = g.one("ReduceMax", [matches], axes=[1], keepdims=0)
    row = g.one("ArgMax", [matches], axis=1, keepdims=0, select_last_index=0)  # the first equal key
    # as many keys as rows of values, or the run fails (as the reference's)
    counts = [g.one("Gather", [g.one("Shape", [name]), first], axis=0) for name in (keys, values.name)]
    valid = g.one("Squeeze", [g.one("Equal", counts)])
    rule = "input 1 (keys) must have as many entries as input 2 (values) has rows"
    if constant_keys is None:  # and keys in ascending order: no key less than the one before it
        ends = g.constant(np.array([np.iinfo(np.int64).max], np.int64))
        descents = g.one("Less", [g.one("Slice", [keys, g.constant(np.array([1], np.int64)), ends]),
                                  g.one("Slice", [keys, first, g.constant(np.array([-1], np.int64))])])
        count = g.one("ReduceSum", [g.one("Cast", [descents], to=TensorProto.INT64)], keepdims=0)
        valid = g.one("And", [valid, g.one("Equal", [count, g.constant(np.array(0, np.int64))])])
        rule = f"{rule}, and {UNSORTED_KEYS}"
    row = fail_unless(g, valid, row, rule)
    gathered = g.one("Gather", [values.name, row], axis=0)
    found = g.one("Reshape", [g.one("Cast", [hit], to=TensorProto.BOOL),
                              g.constant(np.array([-1] + [1] * (values.rank - 1), np.int64))])
    zero = g.constant(encode(np.zeros((), dtype_of(values_operand.type)), values_operand))
    g.set_output(operation.outputs[0], g.one("Where", [found, gathered, zero]))
    g.set_output(operation.outputs[1], g.one("Cast", [hit], to=TensorProto.UINT8))
