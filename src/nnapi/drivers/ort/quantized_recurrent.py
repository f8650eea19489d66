"""QUANTIZED_16BIT_LSTM lowered to exact integer ONNX operators: the reference's
(operations/quantized_lstm.py, Android's kernel) int32 / int16 fixed-point arithmetic
step by step, on int64 values, so every output is the reference's bit for bit.

- The fully connected part: MatMulInteger of [input, previous output] (zero point 128)
  with each gate's [recurrent | input] weight rows (Android's pairing, kept), plus the
  int32 biases; rescaled to Q3.12 by MultiplyByQuantizedMultiplier (fixed_point.py's,
  the one spelling of the ORT lowerings).
- gemmlowp's fixed-point logistic and tanh: every int16 input's result computed once at
  lowering by the reference's own definition, and gathered (a table of 65,536 entries).
- The cell update and the output: SaturatingRoundingDoublingHighMul on int16 values and
  rounding shifts (fixed_point.py's), saturations (Min / Max), as the reference computes
  them.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from onnx import TensorProto

from nnapi.codes import OperandCode, OperationCode
from nnapi.drivers.ort.builder import Declined, GraphBuilder, lowers, scalar_i64
from nnapi.drivers.ort.fixed_point import (
    doubling_high_multiply,
    multiply_by_quantized_multiplier,
    powers,
    rounding_divide_by_pot,
)
from nnapi.hal import Operation
from nnapi.operations import quantized_lstm as q

T = OperandCode
_I64 = TensorProto.INT64


def _clamp(g: GraphBuilder, x: str, low: int, high: int) -> str:
    return g.one("Max", [g.one("Min", [x, scalar_i64(g, high)]), scalar_i64(g, low)])


def _srdhm16(g: GraphBuilder, a: str, b: str) -> str:
    """SaturatingRoundingDoublingHighMul on int16 values (quantized_lstm._srdhm16)."""
    return doubling_high_multiply(g, a, b, 16)


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
    gates = _clamp(g, multiply_by_quantized_multiplier(g, accumulator, multiplier, *powers(shift)), -32768, 32767)
    blocks = g.node("Split", [gates, g.constant(np.array([units] * 4, np.int64))], 4, axis=1)
    input_gate, forget_gate, output_gate = (_table(g, q.fixed_logistic, blocks[k]) for k in (0, 2, 3))
    modulation = _table(g, q.fixed_tanh, blocks[1])
    cell = _int64(g, inputs[q.Q16_CELL_IN], "the cell state", "int16", [batch, units])
    new_cell = _clamp(g, g.one("Add", [rounding_divide_by_pot(g, _srdhm16(g, input_gate, modulation), 1 << 4),
                                        _srdhm16(g, forget_gate, cell)]), -32768, 32767)
    doubled = _clamp(g, g.one("Mul", [new_cell, scalar_i64(g, 2)]), -32768, 32767)  # SaturatingRoundingMultiplyByPOT<1>
    hidden = _srdhm16(g, output_gate, _table(g, q.fixed_tanh, doubled))
    output = g.one("Add", [_clamp(g, rounding_divide_by_pot(g, hidden, 1 << 8), -128, 127), scalar_i64(g, 128)])
    g.set_output(operation.outputs[0], g.one("Cast", [new_cell], to=TensorProto.INT16))
    g.set_output(operation.outputs[1], g.one("Cast", [output], to=TensorProto.UINT8))
