"""TFLite import: the recurrent operators (SVDF, RNN, LSTM in its forms, bidirectional and
sequence ones, integer LSTM) and their state tensors.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from nnapi.codes import OperandCode as T
from nnapi.codes import OperationCode as Op
from nnapi.importers.tflite.converter import _Converter, _converter
from nnapi.importers.tflite.convolutions import _weights
from nnapi.importers.tflite.reader import (
    _ACT_TANH,
    _FLOAT32,
    _INT8,
    _INT16,
    _INT32,
    _TYPE_NAMES,
    _UINT8,
    UnsupportedOperator,
    _operand_shape,
    _Operator,
)
from nnapi.operand import OperandType


def _state_in(c: _Converter, op: _Operator, position: int) -> int:
    """The operand of a state input (a variable tensor of the main graph, a model input)."""
    return c.input(position)


def _state_out(c: _Converter, op: _Operator, position: int) -> int:
    """A fresh operand holding the new value of the state input ``position``; the main
    model returns it as a hidden output so the Session can carry the state forward."""
    tensor = op.inputs[position]
    op_type = c.type_of(c.operand(tensor))
    index = c.add(op_type)
    info = op.graph.tensors[tensor]
    if c.top_level and info.is_variable:
        c.state_outputs[tensor] = index
    return index


@_converter("SVDF")
def _svdf(c: _Converter, op: _Operator) -> None:
    options = op.options("SVDFOptions")
    if options.FusedActivationFunction() not in (0, 1, 3):
        raise UnsupportedOperator("SVDF activation")
    x = c.input(0)
    wf = _weights(c, op, 1)
    wt = _weights(c, op, 2)
    units = c.type_of(wf).dimensions[0] // max(options.Rank(), 1)
    bias = c.input(3) if op.has_input(3) else c.const_operand(np.zeros(units, np.float32),
                                                               OperandType(T.TENSOR_FLOAT32, [units]))
    state = _state_in(c, op, 4)
    state_out = _state_out(c, op, 4)
    c.emit(Op.SVDF, [x, wf, wt, bias, state, c.i32(options.Rank()), c.i32(options.FusedActivationFunction())],
           [state_out, c.output()])


@_converter("RNN")
def _rnn(c: _Converter, op: _Operator) -> None:
    options = op.options("RNNOptions")
    state_out = _state_out(c, op, 4)
    c.emit(Op.RNN, [c.input(0), _weights(c, op, 1), _weights(c, op, 2), c.input(3), _state_in(c, op, 4),
                    c.i32(options.FusedActivationFunction())], [state_out, c.output()])


@_converter("UNIDIRECTIONAL_SEQUENCE_RNN")
def _sequence_rnn(c: _Converter, op: _Operator) -> None:
    options = op.options("SequenceRNNOptions")
    state_out = _state_out(c, op, 4)
    c.emit(Op.UNIDIRECTIONAL_SEQUENCE_RNN,
           [c.input(0), _weights(c, op, 1), _weights(c, op, 2), c.input(3), _state_in(c, op, 4),
            c.i32(options.FusedActivationFunction()), c.i32(int(bool(options.TimeMajor())))],
           [c.output(), state_out])


def _lstm_tensors(c: _Converter, op: _Operator, count: int) -> list[int]:
    """Inputs 0..count-1 of a TFLite LSTM, with omitted optional tensors as NO_VALUE."""
    x = c.input(0)
    x_type = c.type_of(x)
    if x_type.type != T.TENSOR_FLOAT32 and x_type.type != T.TENSOR_FLOAT16:
        raise UnsupportedOperator(f"{op.name} on {x_type.type.name} (NNAPI's LSTM is float only)")
    operands = [x]
    for position in range(1, count):
        if op.has_input(position):
            operands.append(_weights(c, op, position))  # states and inputs pass through unchanged
        else:
            operands.append(c.omitted(OperandType(x_type.type, [0])))
    return operands


@_converter("UNIDIRECTIONAL_SEQUENCE_LSTM")
def _sequence_lstm(c: _Converter, op: _Operator) -> None:
    options = op.options("UnidirectionalSequenceLSTMOptions")
    if hasattr(options, "DiagonalRecurrentTensors") and options.DiagonalRecurrentTensors():
        raise UnsupportedOperator("diagonal recurrent weights (one value per unit) have no NNAPI equivalent")
    if op.tensor(0).tfl_type == _INT8:
        _integer_sequence_lstm(c, op, options)
        return
    operands = _lstm_tensors(c, op, 24)
    x_type = c.type_of(operands[0])
    layer_norm = operands[20:24]
    state_outputs = [_state_out(c, op, 18), _state_out(c, op, 19)]
    scalar = c.f16 if x_type.type == T.TENSOR_FLOAT16 else c.f32
    c.emit(Op.UNIDIRECTIONAL_SEQUENCE_LSTM,
           [*operands[:20], c.i32(options.FusedActivationFunction()), scalar(options.CellClip()),
            scalar(options.ProjClip()), c.boolean(bool(options.TimeMajor())), *layer_norm],
           [c.output(), *state_outputs])


@_converter("BIDIRECTIONAL_SEQUENCE_LSTM")
def _bidirectional_lstm(c: _Converter, op: _Operator) -> None:
    options = op.options("BidirectionalSequenceLSTMOptions")
    operands = _lstm_tensors(c, op, 48)
    x_type = c.type_of(operands[0])
    scalar = c.f16 if x_type.type == T.TENSOR_FLOAT16 else c.f32
    layer_norm = [c.omitted(OperandType(x_type.type, [0])) for _ in range(8)]
    outputs = [c.output(i) for i in range(len(op.outputs))]
    states = [_state_out(c, op, position) for position in (35, 36, 37, 38)]
    c.emit(Op.BIDIRECTIONAL_SEQUENCE_LSTM,
           [*operands, c.i32(options.FusedActivationFunction()), scalar(options.CellClip()),
            scalar(options.ProjClip()), c.boolean(bool(options.MergeOutputs())), c.boolean(bool(options.TimeMajor())),
            *layer_norm], [*outputs, *states])


@_converter("BIDIRECTIONAL_SEQUENCE_RNN")
def _bidirectional_rnn(c: _Converter, op: _Operator) -> None:
    options = op.options("BidirectionalSequenceRNNOptions")
    x = c.input(0)
    x_type = c.type_of(x)
    operands = [x]
    for position in range(1, 12):
        if op.has_input(position):
            operands.append(_weights(c, op, position))
        else:
            operands.append(c.omitted(OperandType(x_type.type, [0])))
    outputs = [c.output(i) for i in range(len(op.outputs))]
    states = [_state_out(c, op, 4), _state_out(c, op, 8)]
    c.emit(Op.BIDIRECTIONAL_SEQUENCE_RNN,
           [*operands, c.i32(options.FusedActivationFunction()), c.boolean(bool(options.TimeMajor())),
            c.boolean(bool(options.MergeOutputs()))], [*outputs, *states])


@_converter("LSTM")
def _lstm(c: _Converter, op: _Operator) -> None:
    options = op.options("LSTMOptions")
    if options.KernelType() != 0:
        _basic_lstm(c, op, options)
        return
    if op.tensor(0).tfl_type == _INT8:
        _integer_lstm(c, op, options)
        return
    operands = _lstm_tensors(c, op, 24)
    x_type = c.type_of(operands[0])
    batch = x_type.dimensions[0]
    units = c.type_of(operands[4]).dimensions[0]
    cifg = not op.has_input(1)
    scratch = c.add(OperandType(x_type.type, [batch, units * (3 if cifg else 4)]))
    scalar = c.f16 if x_type.type == T.TENSOR_FLOAT16 else c.f32
    layer_norm = operands[20:24] if any(op.has_input(i) for i in range(20, 24)) else []
    c.emit(Op.LSTM, [*operands[:20], c.i32(options.FusedActivationFunction()), scalar(options.CellClip()),
                     scalar(options.ProjClip()), *layer_norm],
           [scratch, _state_out(c, op, 18), _state_out(c, op, 19), c.output()])


# --- TFLite's integer LSTMs -> QUANTIZED_LSTM / QUANTIZED_16BIT_LSTM ----------------------
# TFLite's full LSTM kernel and NNAPI's QUANTIZED_LSTM number inputs 0-23 alike: input,
# input-to-gate weights (i, f, c, o), recurrent weights, peepholes (i, f, o), gate biases,
# projection weights and bias, output state, cell state, layer-norm weights.
_LSTM_INPUT, _LSTM_OUTPUT_STATE, _LSTM_CELL_STATE = 0, 18, 19
_LSTM_INT8_WEIGHTS = (1, 2, 3, 4, 5, 6, 7, 8, 16)
_LSTM_INT16_WEIGHTS = (9, 10, 11, 20, 21, 22, 23)
_LSTM_BIASES = (12, 13, 14, 15, 17)
_LSTM_LAYER_NORM = (20, 21, 22, 23)
# The operator's intermediates: the four gates' matmul scales (read with layer norm) and
# the hidden state's scale and zero point.
_HIDDEN_INTERMEDIATE = 4


def _integer_lstm_operands(c: _Converter, op: _Operator, options: Any) -> list[int]:
    """QUANTIZED_LSTM's inputs 1-17 and 20-31 (0, 18 and 19 are left as None) for TFLite's
    fully-integer (8x8_16) LSTM, checking every place the two kernels could disagree."""
    cell = op.tensor(_LSTM_CELL_STATE)
    if cell.tfl_type != _INT16:
        raise UnsupportedOperator(f"cell state {_LSTM_CELL_STATE} ({cell.name}) is {cell.type_name} (TFLite's 8x8_8 "
                                  "kernel): NNAPI's QUANTIZED_LSTM keeps an int16 cell state")
    if options.FusedActivationFunction() != _ACT_TANH:
        raise UnsupportedOperator("an integer LSTM with a cell activation other than TANH")
    for position in (_LSTM_INPUT, _LSTM_OUTPUT_STATE):
        info = op.tensor(position)
        if info.tfl_type != _INT8 or info.scales is None or info.per_channel:
            raise UnsupportedOperator(f"input {position} ({info.name}) must be int8 quantized per tensor")
    operands: list[int | None] = [None] * 32
    for position in range(1, 24):
        if position in (_LSTM_OUTPUT_STATE, _LSTM_CELL_STATE):
            continue
        if position in _LSTM_INT8_WEIGHTS:
            code, tfl_type = T.TENSOR_QUANT8_SYMM, _INT8
        elif position in _LSTM_INT16_WEIGHTS:
            code, tfl_type = T.TENSOR_QUANT16_SYMM, _INT16
        else:
            code, tfl_type = T.TENSOR_INT32, _INT32
        if not op.has_input(position):
            # An omitted quantized operand still needs a valid scale to be declared.
            operands[position] = c.omitted(OperandType(code, [0], 0.0 if code == T.TENSOR_INT32 else 1.0))
            continue
        info = op.tensor(position)
        if info.data is None or info.is_variable:
            raise UnsupportedOperator(f"input {position} ({info.name}) of an integer LSTM must be a constant")
        if info.tfl_type != tfl_type or (code != T.TENSOR_INT32 and (info.scales is None or info.per_channel
                                                                      or info.zero_point != 0)):
            raise UnsupportedOperator(f"input {position} ({info.name}) is {info.type_name}"
                                      f"{' per-channel' if info.per_channel else ''}; the integer LSTM needs "
                                      f"{_TYPE_NAMES[tfl_type]}"
                                      f"{'' if code == T.TENSOR_INT32 else ' quantized symmetrically per tensor'}")
        scale = info.scale if code != T.TENSOR_INT32 or (info.scales is not None and len(info.scales) == 1) else 0.0
        operands[position] = c.const_operand(info.data, OperandType(code, _operand_shape(info.shape), scale, 0))
    units = op.tensor(2).shape[0] if len(op.tensor(2).shape) == 2 else -1
    output_size = op.tensor(_LSTM_OUTPUT_STATE).shape[-1]
    if op.has_input(10) and units != output_size:
        # TFLite's (and Android's) integer peephole walks the cell state as if it had the
        # output's width; the reference QUANTIZED_LSTM reads it per unit.
        raise UnsupportedOperator(f"peephole weights with a projection to {output_size} of {units} units: TFLite's "
                                  "integer kernel applies them over the output width, NNAPI's over the units")
    layer_norm = op.has_input(21)
    for position in _LSTM_LAYER_NORM if layer_norm else ():
        if not op.has_input(position):
            continue
        # TFLite replaces a variance below 1 by max(1, int(10000 * scale)), Android's
        # kernel (which NNAPI's QUANTIZED_LSTM follows) by min(1, ...); 0 and 1 both leave
        # the gate undivided, so they agree exactly while int(10000 * scale) < 2.
        guard = int(np.float32(10000) * np.float32(op.tensor(position).scale))
        if guard >= 2:
            raise UnsupportedOperator(f"layer-norm weights {position} ({op.tensor(position).name}) have scale "
                                      f"{op.tensor(position).scale:g}: TFLite's variance guard ({guard}) differs "
                                      "from NNAPI's (at most 1)")
    intermediates = [int(i) for i in op.raw.IntermediatesAsNumpy()] if op.raw.IntermediatesLength() else []
    needed = 5
    if len(intermediates) < needed:
        raise UnsupportedOperator(f"an integer LSTM needs {needed} intermediates (gate and hidden-state scales), "
                                  f"the operator has {len(intermediates)}")
    scales = []
    for i in range(_HIDDEN_INTERMEDIATE + 1):
        info = op.graph.tensors[intermediates[i]]
        # Without layer norm TFLite takes the gates' scales as 2**-12 and ignores those
        # intermediates (the converter leaves them unquantized); the hidden one it reads.
        if (layer_norm or i == _HIDDEN_INTERMEDIATE) and (info.scales is None or info.per_channel):
            raise UnsupportedOperator(f"intermediate {i} ({info.name}) has no per-tensor quantization")
        scales.append(info)
    gate_scales = [info.scale if layer_norm else 2.0**-12 for info in scales[:4]]
    hidden = scales[_HIDDEN_INTERMEDIATE]
    proj_clip = float(options.ProjClip())
    if proj_clip > 0 and op.has_input(16):
        # TFLite measures the projection clip in steps of the output's scale; Android's
        # kernel in steps of the projection weights' scale: pass the clip that gives
        # TFLite's integer threshold there (half a step up, as both truncate).
        threshold = int(min(max(np.float32(proj_clip) / np.float32(op.out_tensor().scale), -128.0), 127.0))
        proj_clip = (threshold + 0.5) * op.tensor(16).scale if threshold > 0 else 0.0
    # TFLite adds the hidden state's zero point after o * tanh(c); Android's kernel (so
    # QUANTIZED_LSTM) subtracts input 30 there, and its projection undoes whichever was
    # applied: the negated zero point gives TFLite's values.
    operands[24:32] = [c.f32(float(options.CellClip())), c.f32(proj_clip), *(c.f32(s) for s in gate_scales),
                       c.i32(-hidden.zero_point), c.f32(hidden.scale)]
    return operands


def _integer_lstm(c: _Converter, op: _Operator, options: Any) -> None:
    operands = _integer_lstm_operands(c, op, options)
    operands[_LSTM_INPUT] = c.input(_LSTM_INPUT)
    operands[_LSTM_OUTPUT_STATE] = _state_in(c, op, _LSTM_OUTPUT_STATE)
    operands[_LSTM_CELL_STATE] = _state_in(c, op, _LSTM_CELL_STATE)
    c.emit(Op.QUANTIZED_LSTM, operands, [_state_out(c, op, _LSTM_OUTPUT_STATE), _state_out(c, op, _LSTM_CELL_STATE),
                                         c.output()])
    c.lowered("fully-integer LSTM (int16 cell state) as QUANTIZED_LSTM with the operator's intermediate scales")


def _integer_sequence_lstm(c: _Converter, op: _Operator, options: Any) -> None:
    """TFLite's integer UNIDIRECTIONAL_SEQUENCE_LSTM unrolled over its static time axis:
    the input viewed as [time * batch, input] (time-major) or [batch, time * input]
    (batch-major) and SPLIT into the steps, one QUANTIZED_LSTM per step threading the
    states, the step outputs concatenated the same way and viewed back (TFLite copies each
    step's output state raw into the output)."""
    operands = _integer_lstm_operands(c, op, options)
    time_major = bool(options.TimeMajor())
    x_info, y_info = op.tensor(_LSTM_INPUT), op.out_tensor()
    if len(x_info.shape) != 3 or any(d < 0 for d in (*x_info.shape, *y_info.shape)):
        raise UnsupportedOperator("an integer sequence LSTM needs a static [batch, time, input] shape to unroll")
    steps, batch = (x_info.shape[0], x_info.shape[1]) if time_major else (x_info.shape[1], x_info.shape[0])
    input_size, output_size = x_info.shape[2], y_info.shape[2]
    x_type, y_type = c.nn_type(x_info), c.nn_type(y_info)
    # Row-major views in which the steps are blocks along one axis: axis 0 when time-major.
    axis = 0 if time_major else 1
    flat = [steps * batch, input_size] if time_major else [batch, steps * input_size]
    pieces = [c.temp(x_type, [batch, input_size]) for _ in range(steps)]
    if steps == 1:
        c.emit(Op.RESHAPE, [c.input(_LSTM_INPUT), c.vector([batch, input_size])], pieces)
    else:
        viewed = c.temp(x_type, flat)
        c.emit(Op.RESHAPE, [c.input(_LSTM_INPUT), c.vector(flat)], [viewed])
        c.emit(Op.SPLIT, [viewed, c.i32(axis), c.i32(steps)], pieces)
    state = _state_in(c, op, _LSTM_OUTPUT_STATE)
    cell = _state_in(c, op, _LSTM_CELL_STATE)
    state_type, cell_type = c.type_of(state), c.type_of(cell)
    outputs = []
    for step, piece in enumerate(pieces):
        last = step == steps - 1
        new_state = _state_out(c, op, _LSTM_OUTPUT_STATE) if last else c.temp(state_type)
        new_cell = _state_out(c, op, _LSTM_CELL_STATE) if last else c.temp(cell_type)
        step_output = c.temp(y_type, [batch, output_size])
        inputs = list(operands)
        inputs[_LSTM_INPUT], inputs[_LSTM_OUTPUT_STATE], inputs[_LSTM_CELL_STATE] = piece, state, cell
        c.emit(Op.QUANTIZED_LSTM, inputs, [new_state, new_cell, step_output])
        state, cell = new_state, new_cell
        outputs.append(step_output)
    joined = outputs[0]
    if steps > 1:
        joined = c.temp(y_type, [steps * batch, output_size] if time_major else [batch, steps * output_size])
        c.emit(Op.CONCATENATION, [*outputs, c.i32(axis)], [joined])
    c.emit(Op.RESHAPE, [joined, c.vector(y_info.shape)], [c.output()])
    c.lowered(f"fully-integer sequence LSTM unrolled over its {steps} time steps: RESHAPE + SPLIT into steps, "
              "QUANTIZED_LSTM per step with the operator's intermediate scales, CONCATENATION + RESHAPE")


# TFLite's basic LSTM kernel: concatenated weights [4 * units, input + units] in gate order
# input, cell, forget, output; NNAPI's LSTMs take one matrix per gate, in the order
# input, forget, cell, output.
_BASIC_INPUT, _BASIC_PREV_ACTIVATION, _BASIC_WEIGHTS, _BASIC_BIAS, _BASIC_PREV_STATE = 0, 1, 2, 3, 4
_BASIC_GATES = ("input", "cell", "forget", "output")
_NNAPI_GATE_ORDER = ("input", "forget", "cell", "output")


def _basic_lstm(c: _Converter, op: _Operator, options: Any) -> None:
    """TFLite's BASIC LSTM kernel: one weight matrix over [input, previous output] and one
    bias, gate blocks input, cell, forget, output; float32 -> LSTM, uint8 -> QUANTIZED_16BIT_LSTM."""
    if len(op.inputs) != 5:
        raise UnsupportedOperator(f"a BASIC LSTM with {len(op.inputs)} inputs (expected 5)")
    x_info = op.tensor(_BASIC_INPUT)
    if x_info.tfl_type not in (_FLOAT32, _UINT8):
        raise UnsupportedOperator(f"the BASIC LSTM kernel on {x_info.type_name} has no NNAPI equivalent (LSTM takes "
                                  "float, QUANTIZED_16BIT_LSTM uint8)")
    for position in (_BASIC_WEIGHTS, _BASIC_BIAS):
        if op.tensor(position).data is None:
            raise UnsupportedOperator(f"input {position} ({op.tensor(position).name}) of a BASIC LSTM must be a "
                                      "constant")
    weights_info, bias_info = op.tensor(_BASIC_WEIGHTS), op.tensor(_BASIC_BIAS)
    rows, columns = weights_info.shape
    units = rows // 4
    input_size = columns - units
    # The two temporaries TFLite also writes (the concatenated input and the gate
    # activations) have no NNAPI counterpart; nothing may read them.
    for position in range(2, len(op.outputs)):
        tensor = op.outputs[position]
        if tensor >= 0 and (tensor in op.graph.outputs or c.readers(tensor)):
            raise UnsupportedOperator(f"output {position} ({op.graph.tensors[tensor].name}), a kernel temporary, is "
                                      "read; NNAPI's LSTMs do not produce it")
    blocks = {gate: weights_info.data[i * units:(i + 1) * units] for i, gate in enumerate(_BASIC_GATES)}
    biases = {gate: bias_info.data[i * units:(i + 1) * units] for i, gate in enumerate(_BASIC_GATES)}
    weight_type, bias_type = c.nn_type(weights_info), c.nn_type(bias_info).with_dimensions([units])
    if x_info.tfl_type == _FLOAT32:
        if options.FusedActivationFunction() != _ACT_TANH or options.CellClip() or options.ProjClip():
            raise UnsupportedOperator("a float BASIC LSTM computes with tanh and no clipping only")
        # TFLite's kernel multiplies [input, previous output]: the first input_size columns
        # are the input weights.
        order = _NNAPI_GATE_ORDER
        x_weights = [c.const_operand(np.ascontiguousarray(blocks[g][:, :input_size]),
                                     weight_type.with_dimensions([units, input_size])) for g in order]
        h_weights = [c.const_operand(np.ascontiguousarray(blocks[g][:, input_size:]),
                                     weight_type.with_dimensions([units, units])) for g in order]
        bias_operands = [c.const_operand(biases[g], bias_type) for g in order]
        absent = [c.omitted(OperandType(T.TENSOR_FLOAT32, [0])) for _ in range(5)]  # peepholes, projection
        batch = x_info.shape[0]
        scratch = c.add(OperandType(T.TENSOR_FLOAT32, [max(batch, 0), 4 * units]))
        state_out = c.add(OperandType(T.TENSOR_FLOAT32, [max(batch, 0), units]))
        c.emit(Op.LSTM, [c.input(_BASIC_INPUT), *x_weights, *h_weights, *absent[:3], *bias_operands, *absent[3:],
                         c.input(_BASIC_PREV_ACTIVATION), c.input(_BASIC_PREV_STATE), c.i32(_ACT_TANH), c.f32(0.0),
                         c.f32(0.0)], [scratch, state_out, c.output(1), c.output(0)])
        c.lowered("float BASIC LSTM as LSTM: concatenated weights and biases split per gate")
        return
    # As TFLite's NNAPI delegate splits them: the first `units` columns are the recurrent
    # weights, the rest the input weights; QUANTIZED_16BIT_LSTM concatenates them back in
    # that order and multiplies by [input, previous output], as TFLite's kernel does.
    input_weights = [c.const_operand(np.ascontiguousarray(blocks[g][:, units:]),
                                     weight_type.with_dimensions([units, input_size])) for g in _NNAPI_GATE_ORDER]
    recurrent_weights = [c.const_operand(np.ascontiguousarray(blocks[g][:, :units]),
                                         weight_type.with_dimensions([units, units])) for g in _NNAPI_GATE_ORDER]
    bias_operands = [c.const_operand(biases[g], bias_type) for g in _NNAPI_GATE_ORDER]
    c.emit(Op.QUANTIZED_16BIT_LSTM,
           [c.input(_BASIC_INPUT), *input_weights, *recurrent_weights, *bias_operands, c.input(_BASIC_PREV_STATE),
            c.input(_BASIC_PREV_ACTIVATION)], [c.output(1), c.output(0)])
    c.lowered("uint8 BASIC LSTM as QUANTIZED_16BIT_LSTM: concatenated weights and biases split per gate")
