"""QUANTIZED_16BIT_LSTM lowered to exact integer ONNX operators: the reference's
(operations/quantized_lstm.py, Android's kernel) int32 / int16 fixed-point arithmetic
step by step, on int64 values, so every output is the reference's bit for bit.

- The fully connected part: MatMulInteger of [input, previous output] (zero point 128)
  with each gate's [recurrent | input] weight rows (Android's pairing, kept), plus the
  int32 biases; rescaled to Q3.12 by MultiplyByQuantizedMultiplier (the rounding
  doubling high multiply as an int64 product, its nudge and a truncating Div; the
  rounding right shift as Mod, an exact Div and the comparison with the half).
- gemmlowp's fixed-point logistic and tanh: every int16 input's result computed once at
  lowering by the reference's own definition, and gathered (a table of 65,536 entries).
- The cell update and the output: SaturatingRoundingDoublingHighMul on int16 values
  (int64 product, nudge, truncating Div by 2^15), rounding shifts, saturations (Min /
  Max), as the reference computes them.

ONNX Runtime's integer Div truncates toward zero (C's division) and its Mod with fmod=0
takes the divisor's sign; both are what these steps need (checked by the tests, which
compare with the reference bit for bit).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from onnx import TensorProto

from nnapi.codes import OperandCode, OperationCode
from nnapi.drivers.ort.builder import Declined, GraphBuilder, lowers, scalar_i64
from nnapi.hal import Operation
from nnapi.operations import quantized_lstm as q

T = OperandCode
_I64 = TensorProto.INT64


def _truncating_divide(g: GraphBuilder, x: str, divisor: int) -> str:
    """x / divisor rounded toward zero (C's integer division: ONNX Runtime's int64 Div)."""
    return g.one("Div", [x, scalar_i64(g, divisor)])


def _rounding_divide_by_pot(g: GraphBuilder, x: str, exponent: int) -> str:
    """gemmlowp's RoundingDivideByPOT (quant_math.rounding_divide_by_pot): the floor of
    x / 2^e plus one where the remainder passes half (more than half for a negative x)."""
    if exponent == 0:
        return x
    power = scalar_i64(g, 1 << exponent)
    remainder = g.one("Mod", [x, power], fmod=0)  # x mod 2^e in [0, 2^e): x & mask
    floor = g.one("Div", [g.one("Sub", [x, remainder]), power])  # exact
    negative = g.one("Cast", [g.one("Less", [x, scalar_i64(g, 0)])], to=_I64)
    threshold = g.one("Add", [scalar_i64(g, ((1 << exponent) - 1) >> 1), negative])
    return g.one("Add", [floor, g.one("Cast", [g.one("Greater", [remainder, threshold])], to=_I64)])


def _clamp(g: GraphBuilder, x: str, low: int, high: int) -> str:
    return g.one("Max", [g.one("Min", [x, scalar_i64(g, high)]), scalar_i64(g, low)])


def _multiply_by_quantized_multiplier(g: GraphBuilder, x: str, multiplier: int, shift: int) -> str:
    """quant_math.multiply_by_quantized_multiplier for one (multiplier, shift)."""
    if shift > 0:
        x = g.one("Mul", [x, scalar_i64(g, 1 << shift)])
    x = _clamp(g, x, -(1 << 31), (1 << 31) - 1)
    product = g.one("Mul", [x, scalar_i64(g, multiplier)])
    nudge = g.one("Where", [g.one("GreaterOrEqual", [product, scalar_i64(g, 0)]), scalar_i64(g, 1 << 30),
                            scalar_i64(g, 1 - (1 << 30))])
    high = _truncating_divide(g, g.one("Add", [product, nudge]), 1 << 31)
    if multiplier == -(1 << 31):  # INT32_MIN * INT32_MIN saturates
        both = g.one("Equal", [x, scalar_i64(g, -(1 << 31))])
        high = g.one("Where", [both, scalar_i64(g, (1 << 31) - 1), high])
    return _rounding_divide_by_pot(g, high, max(-shift, 0))


def _srdhm16(g: GraphBuilder, a: str, b: str) -> str:
    """SaturatingRoundingDoublingHighMul on int16 values (quantized_lstm._srdhm16)."""
    product = g.one("Mul", [a, b])
    nudge = g.one("Where", [g.one("GreaterOrEqual", [product, scalar_i64(g, 0)]), scalar_i64(g, 1 << 14),
                            scalar_i64(g, 1 - (1 << 14))])
    high = _truncating_divide(g, g.one("Add", [product, nudge]), 1 << 15)
    lowest = scalar_i64(g, -32768)
    both = g.one("And", [g.one("Equal", [a, lowest]), g.one("Equal", [b, lowest])])
    return g.one("Where", [both, scalar_i64(g, 32767), high])


def _table(g: GraphBuilder, function: Callable[[np.ndarray, int], np.ndarray], x: str) -> str:
    """function(x, 3) of int16 values x by the reference's table of every int16 input."""
    table = np.asarray(q.table16(function, 3), dtype=np.int64)
    return g.one("Gather", [g.constant(table, "table"), g.one("Add", [x, scalar_i64(g, 32768)])], axis=0)


def _int64(g: GraphBuilder, index: int, what: str, kind: str, dims: list[int]) -> str:
    value = g.value(index)
    if value.kind != kind or value.dims != dims:
        raise Declined(f"{what} must be a {kind} tensor of shape {dims}")
    return g.one("Cast", [value.name], to=_I64)


@lowers(OperationCode.QUANTIZED_16BIT_LSTM)
def lower_quantized_16bit_lstm(g: GraphBuilder, operation: Operation) -> None:
    """One step of Quantized16BitLstm.execute (operations/quantized_lstm.py) in int64
    ONNX arithmetic; the outputs cast back to int16 and uint8 (their values in range)."""
    inputs = operation.inputs
    if len(inputs) != 15 or len(operation.outputs) != 2:
        raise Declined("expected 15 inputs and 2 outputs")
    x = g.value(inputs[q.Q16_INPUT])
    previous = g.value(inputs[q.Q16_OUTPUT_IN])
    if x.kind != "uint8" or x.rank != 2 or not all(x.dims) or previous.kind != "uint8" or previous.rank != 2 \
            or not all(previous.dims):
        raise Declined("the input and previous output must be 2-D QUANT8_ASYMM tensors of known shape")
    if x.zero_point != 128 or previous.zero_point != 128:
        raise Declined("the input and previous output must have zero point 128")
    batch, size = x.dims
    units = previous.dims[1]
    if previous.dims[0] != batch:
        raise Declined("the previous output's batch differs from the input's")
    order = [(q.Q16_INPUT_WEIGHTS + gate, q.Q16_RECURRENT_WEIGHTS + gate, q.Q16_BIASES + gate)
             for gate in (q.Q16_INPUT_GATE, q.Q16_CELL_GATE, q.Q16_FORGET_GATE, q.Q16_OUTPUT_GATE)]
    weights_zero = g.operand(inputs[q.Q16_INPUT_WEIGHTS]).zero_point
    rows = []
    for wx, wh, _ in order:
        parts = []
        for position, columns in ((wh, units), (wx, size)):
            value = g.value(inputs[position])
            if value.kind != "uint8" or value.dims != [units, columns] or value.zero_point != weights_zero:
                raise Declined(f"input {position} must be QUANT8_ASYMM [{units}, {columns}] with zero point "
                               f"{weights_zero}")
            parts.append(value.name)
        rows.append(g.one("Concat", parts, axis=1))
    stacked = g.one("Transpose", [g.one("Concat", rows, axis=0)])  # [size + units, 4 * units]
    activations = g.one("Concat", [x.name, previous.name], axis=1)
    accumulator = g.one("MatMulInteger", [activations, stacked, g.constant(np.array(128, np.uint8)),
                                          g.constant(np.array(weights_zero, np.uint8))])
    biases = g.one("Concat", [_int64(g, inputs[b], f"input {b}", "int32", [units]) for _, _, b in order], axis=0)
    accumulator = g.one("Add", [g.one("Cast", [accumulator], to=_I64), biases])
    multiplier, shift = q.float32_multiplier(4096 * float(np.float32(g.operand(inputs[q.Q16_BIASES]).scale)))
    gates = _clamp(g, _multiply_by_quantized_multiplier(g, accumulator, multiplier, shift), -32768, 32767)
    blocks = g.node("Split", [gates, g.constant(np.array([units] * 4, np.int64))], 4, axis=1)
    input_gate, forget_gate, output_gate = (_table(g, q.fixed_logistic, blocks[k]) for k in (0, 2, 3))
    modulation = _table(g, q.fixed_tanh, blocks[1])
    cell = _int64(g, inputs[q.Q16_CELL_IN], "the cell state", "int16", [batch, units])
    new_cell = _clamp(g, g.one("Add", [_rounding_divide_by_pot(g, _srdhm16(g, input_gate, modulation), 4),
                                        _srdhm16(g, forget_gate, cell)]), -32768, 32767)
    doubled = _clamp(g, g.one("Mul", [new_cell, scalar_i64(g, 2)]), -32768, 32767)  # SaturatingRoundingMultiplyByPOT<1>
    hidden = _srdhm16(g, output_gate, _table(g, q.fixed_tanh, doubled))
    output = g.one("Add", [_clamp(g, _rounding_divide_by_pot(g, hidden, 8), -128, 127), scalar_i64(g, 128)])
    g.set_output(operation.outputs[0], g.one("Cast", [new_cell], to=TensorProto.INT16))
    g.set_output(operation.outputs[1], g.one("Cast", [output], to=TensorProto.UINT8))
