"""8-bit values re-expressed in another quantization by table, for the selections whose
output quantization differs from their inputs' (MAXIMUM, MINIMUM, SELECT).

An 8-bit operand has 256 stored values, so the reference's requantization of each
(quant_math.requantize: the real value rounded into the output's quantization, halves away
from zero, saturated) is known at preparation: a 256-entry table, applied as one Gather
(QuantizeLinear would round halves to even). MAXIMUM / MINIMUM of the requantized values
equals the reference's requantized maximum / minimum because requantizing is monotone;
every table is checked at preparation against the reference's own operation on all 256
values of each input (all 65,536 pairs for MAXIMUM / MINIMUM), and the operation is
declined if anything differs. Tables are indexed by the internal encoding (int8 as uint8
+ 128) and give it. ``lowering``'s MAXIMUM / MINIMUM and SELECT call ``requantized``.
"""

from __future__ import annotations

import functools

import numpy as np
from onnx import TensorProto

from nnapi.codes import OperandCode, OperationCode
from nnapi.drivers.ort.lowering import Declined, GraphBuilder, Value, encode
from nnapi.hal import Operand
from nnapi.operand import OperandType, dtype_of
from nnapi.operations import ExecutionContext, Tensor, get_operation
from nnapi.operations.quant_math import requantize

T = OperandCode


def stored_values(operand: Operand | OperandType) -> np.ndarray:
    """The stored value of each internal value 0..255 of an 8-bit operand (int8: u - 128)."""
    shift = 128 if operand.type == T.TENSOR_QUANT8_ASYMM_SIGNED else 0
    return (np.arange(256) - shift).astype(dtype_of(operand.type))


def _quantization(operand: Operand) -> tuple:
    return int(operand.type), float(operand.scale), int(operand.zero_point)


def _operand(quantization: tuple) -> OperandType:
    code, scale, zero_point = quantization
    return OperandType(code, [], scale, zero_point)


@functools.cache
def _table(source: tuple, output: tuple) -> np.ndarray:
    values = requantize(stored_values(_operand(source)), source[1], source[2], output[1], output[2],
                        dtype_of(output[0]))
    return encode(values, _operand(output))


def table(source: Operand, output: Operand) -> np.ndarray:
    """uint8[256]: for each internal value of ``source``, the internal value of its
    requantization into ``output``'s quantization (the reference's)."""
    return _table(_quantization(source), _quantization(output))


def _probe(operand: OperandType, shape: tuple[int, ...]) -> Tensor:
    return Tensor(operand.type, shape, operand.scale, operand.zero_point, None,
                  stored_values(operand).reshape(shape))


@functools.cache
def _proven(code: int, first: tuple, second: tuple, output: tuple) -> bool:
    a, b, out = (_operand(quantization) for quantization in (first, second, output))
    ta, tb = table(a, out), table(b, out)
    operation = get_operation(OperationCode(code))
    if code == OperationCode.SELECT:
        # all 256 values of each input chosen by the reference: its requantization of each
        for condition, expected in ((True, ta), (False, tb)):
            flags = Tensor(T.TENSOR_BOOL8, (256,), 0.0, 0, None, np.full(256, condition))
            context = ExecutionContext(OperationCode.SELECT, [flags, _probe(a, (256,)), _probe(b, (256,))], [out])
            if not np.array_equal(encode(operation.execute(context)[0], out), expected):
                return False
        return True
    # every pair of values (a down the rows, b along the columns)
    context = ExecutionContext(OperationCode(code), [_probe(a, (256, 1)), _probe(b, (1, 256))], [out])
    combine = np.maximum if code == OperationCode.MAXIMUM else np.minimum
    return bool(np.array_equal(encode(operation.execute(context)[0], out), combine(ta[:, None], tb[None, :])))


def requantized(g: GraphBuilder, code: int, inputs: list[int], output: Operand) -> list[str]:
    """The 8-bit ``inputs`` of selection ``code`` each requantized into ``output``'s
    quantization, as Gathers from their tables (an input already in it as it is); declined
    unless the tables give the reference's results for every value."""
    a, b = (g.operand(i) for i in inputs)
    if not _proven(int(code), _quantization(a), _quantization(b), _quantization(output)):
        raise Declined("requantizing by table does not give the reference's values")
    names = []
    for index, operand in zip(inputs, (a, b)):
        value: Value = g.value(index)
        if (operand.scale, operand.zero_point) == (output.scale, output.zero_point):
            names.append(value.name)
            continue
        positions = g.one("Cast", [value.name], to=TensorProto.INT32)
        names.append(g.one("Gather", [g.constant(table(operand, output), "table"), positions], axis=0))
    return names
