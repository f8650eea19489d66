"""8-bit values re-expressed in another quantization by table, for the selections whose
output quantization differs from their inputs' (MAXIMUM, MINIMUM, SELECT).

An 8-bit operand has 256 stored values, so the reference's requantization of each
(quant_math.requantize: the real value rounded into the output's quantization, halves away
from zero, saturated) is known at preparation: a 256-entry table, which ``lowering``
applies as one Gather (QuantizeLinear would round halves to even). MAXIMUM / MINIMUM of the
requantized values equals the reference's requantized maximum / minimum because
requantizing is monotone; ``proven`` checks the tables against the reference's own
operation on all 256 values of each input (all 65,536 pairs for MAXIMUM / MINIMUM), and
``lowering`` declines the operation if anything differs. Tables are indexed by the
internal encoding (int8 as uint8 + 128) and hold the output's stored values.
"""

from __future__ import annotations

import functools

import numpy as np

from nnapi.codes import OperandCode, OperationCode
from nnapi.hal import Operand
from nnapi.operand import OperandType, dtype_of
from nnapi.operations import ExecutionContext, Tensor, get_operation
from nnapi.operations.quant_math import requantize

T = OperandCode


def stored_values(operand: Operand | OperandType) -> np.ndarray:
    """The stored value of each internal value 0..255 of an 8-bit operand (int8: u - 128)."""
    shift = 128 if operand.type == T.TENSOR_QUANT8_ASYMM_SIGNED else 0
    return (np.arange(256) - shift).astype(dtype_of(operand.type))


def quantization(operand: Operand | OperandType) -> tuple[int, float, int]:
    """(type, scale, zero point): what the tables and their proofs are cached by."""
    return int(operand.type), float(operand.scale), int(operand.zero_point)


def _operand(quantization: tuple) -> OperandType:
    code, scale, zero_point = quantization
    return OperandType(code, [], scale, zero_point)


@functools.cache
def _table(source: tuple, output: tuple) -> np.ndarray:
    return requantize(stored_values(_operand(source)), source[1], source[2], output[1], output[2],
                      dtype_of(output[0]))


def table(source: Operand, output: Operand) -> np.ndarray:
    """For each internal value of ``source``, the stored value (``output``'s dtype) of its
    requantization into ``output``'s quantization, as the reference computes it."""
    return _table(quantization(source), quantization(output))


def _probe(operand: OperandType, shape: tuple[int, ...]) -> Tensor:
    return Tensor(operand.type, shape, operand.scale, operand.zero_point, None,
                  stored_values(operand).reshape(shape))


def proven(code: int, first: Operand, second: Operand, output: Operand) -> bool:
    """Whether selection ``code`` of ``first`` and ``second`` requantized by their tables
    gives the reference's result for every stored value (cached per quantization)."""
    return _proven(int(code), quantization(first), quantization(second), quantization(output))


@functools.cache
def _proven(code: int, first: tuple, second: tuple, output: tuple) -> bool:
    a, b, out = (_operand(quantization) for quantization in (first, second, output))
    ta, tb = _table(first, output), _table(second, output)
    operation = get_operation(OperationCode(code))
    if code == OperationCode.SELECT:
        # all 256 values of each input chosen by the reference: its requantization of each
        for condition, expected in ((True, ta), (False, tb)):
            flags = Tensor(T.TENSOR_BOOL8, (256,), 0.0, 0, None, np.full(256, condition))
            context = ExecutionContext(OperationCode.SELECT, [flags, _probe(a, (256,)), _probe(b, (256,))], [out])
            if not np.array_equal(operation.execute(context)[0], expected):
                return False
        return True
    # every pair of values (a down the rows, b along the columns); the stored values'
    # order is the real values' (one quantization)
    context = ExecutionContext(OperationCode(code), [_probe(a, (256, 1)), _probe(b, (1, 256))], [out])
    combine = np.maximum if code == OperationCode.MAXIMUM else np.minimum
    return bool(np.array_equal(operation.execute(context)[0], combine(ta[:, None], tb[None, :])))
