"""TFLite import: the WHILE loop Keras 3 writes for an LSTM layer, as one UNIDIRECTIONAL_SEQUENCE_LSTM.

Keras 3 (TensorFlow 2.16 and later) no longer converts ``keras.layers.LSTM`` to TFLite's
fused sequence LSTM: the layer becomes a WHILE whose body computes one step from the
operators of its cell (two FULLY_CONNECTED, ADDs, a SPLIT into the four gates, LOGISTIC /
TANH, MULs) and writes the new output into a [time, batch, units] buffer by SLICE +
CONCATENATION at the step's index. The body computes exactly the LSTM step NNAPI's
UNIDIRECTIONAL_SEQUENCE_LSTM defines (gates i, f, c, o in Keras's order; no peephole,
projection, layer norm or clipping), so when every piece of the pattern is there, the
loop covers the whole time axis and nothing reads the loop's other results, the WHILE
is imported as that one operation: the devices' sequence LSTMs (ONNX LSTM on
nnapi-ort-cpu) instead of a loop of ~25 small operations per step. Anything else keeps
the plain WHILE.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from nnapi.codes import OperandCode as T
from nnapi.codes import OperationCode as Op
from nnapi.operand import OperandType

if TYPE_CHECKING:  # (the importer imports this module: no import at run time)
    from nnapi.importers.tflite.converter import _Converter
    from nnapi.importers.tflite.reader import _Operator


class _NoMatch(Exception):
    """The loop is not the Keras LSTM pattern (the plain WHILE is imported)."""


def _need(condition: bool) -> None:
    if not condition:
        raise _NoMatch


class _Body:
    """A subgraph's operators indexed by the tensors they write (its converter, a
    converter of the importer module like the WHILE's own, knows their readers)."""

    def __init__(self, c: _Converter, index: int) -> None:
        self.c = type(c)(c.importer, index, top_level=False)  # for its constants and readers only
        self.graph = self.c.graph
        self.ops = self.c.operators()
        self.writer = {out: op for op in self.ops for out in op.outputs}

    def readers(self, tensor: int) -> list[_Operator]:
        return [op for op, _ in self.c.readers(tensor)]

    def made_by(self, tensor: int, name: str) -> _Operator:
        op = self.writer.get(tensor)
        _need(op is not None and op.name == name and op.custom is None)
        return op

    def const(self, tensor: int) -> np.ndarray:
        """A constant's values (float16 / int8 weights behind a DEQUANTIZE, or hybrid int8
        weights, dequantized as the importer does)."""
        op = self.writer.get(tensor)
        if op is not None:
            _need(op.name == "DEQUANTIZE")
            tensor = op.inputs[0]
        const = self.c.const_of(tensor)
        _need(const is not None)
        return self.c.float_values(tensor, const)

    def is_const(self, tensor: int) -> bool:
        op = self.writer.get(tensor)
        if op is not None and op.name == "DEQUANTIZE":
            tensor = op.inputs[0]
        return tensor not in self.writer and self.c.const_of(tensor) is not None

    def int_const(self, tensor: int) -> list[int]:
        const = self.c.const_of(tensor)
        _need(const is not None)
        return [int(v) for v in const.data.reshape(-1)]

    def plain(self, op: _Operator, options: str) -> None:
        """No fused activation on ``op``."""
        opts = op.options(options)
        _need(opts is None or opts.FusedActivationFunction() == 0)


def _product(body: _Body, tensor: int, used: list[_Operator]) -> tuple[_Operator, int]:
    """FULLY_CONNECTED (weights, no bias) behind ``tensor`` (a RESHAPE of it allowed): the
    operator and the tensor it reads."""
    op = body.writer.get(tensor)
    _need(op is not None)
    if op.name == "RESHAPE":
        used.append(op)
        op = body.made_by(op.inputs[0], "FULLY_CONNECTED")
    _need(op.name == "FULLY_CONNECTED")
    body.plain(op, "FullyConnectedOptions")
    _need(not op.has_input(2))
    used.append(op)
    weights = body.writer.get(op.inputs[1])
    if weights is not None:
        used.append(weights)  # a DEQUANTIZE (body.const checks it)
    return op, op.inputs[0]


def _match(c: _Converter, op: _Operator) -> dict[str, Any]:
    options = op.options("WhileOptions")
    body = _Body(c, options.BodySubgraphIndex())
    cond = _Body(c, options.CondSubgraphIndex())
    g = body.graph
    n = len(op.inputs)
    _need(n == len(op.outputs) == len(g.inputs) == len(g.outputs) == len(cond.graph.inputs))
    splits = [o for o in body.ops if o.name == "SPLIT" and len(o.outputs) == 4]
    _need(len(splits) == 1)
    split = splits[0]
    gates = split.inputs[1]
    _need(body.int_const(split.inputs[0]) in ([1], [-1]))
    # gates = x_t W^T + h R^T (+ bias)
    used = [split]
    add = body.made_by(gates, "ADD")
    body.plain(add, "AddOptions")
    used.append(add)
    bias = None
    if any(body.is_const(i) for i in add.inputs):
        bias_tensor = next(i for i in add.inputs if body.is_const(i))
        bias = body.const(bias_tensor).reshape(-1)
        if bias_tensor in body.writer:
            used.append(body.writer[bias_tensor])
        add = body.made_by(next(i for i in add.inputs if i != bias_tensor), "ADD")
        body.plain(add, "AddOptions")
        used.append(add)
    (fc_a, read_a), (fc_b, read_b) = (_product(body, i, used) for i in add.inputs)
    gather = body.writer.get(read_a)
    if gather is None or gather.name != "GATHER":
        fc_a, read_a, fc_b, read_b = fc_b, read_b, fc_a, read_a
        gather = body.made_by(read_a, "GATHER")
    used.append(gather)
    _need(gather.inputs[0] in g.inputs and gather.inputs[1] in g.inputs)
    x_pos, step_pos, h_pos = (g.inputs.index(i) for i in (gather.inputs[0], gather.inputs[1], read_b))
    w, r = body.const(fc_a.inputs[1]), body.const(fc_b.inputs[1])
    units = r.shape[1]
    _need(w.shape[0] == r.shape[0] == 4 * units and (bias is None or bias.shape == (4 * units,)))
    # the gates: i, f, c, o in Keras's order
    i_g, f_g, c_g, o_g = (body.readers(s) for s in split.outputs)
    _need(all(len(r_) == 1 for r_ in (i_g, f_g, c_g, o_g)))
    _need([i_g[0].name, f_g[0].name, c_g[0].name, o_g[0].name] == ["LOGISTIC", "LOGISTIC", "TANH", "LOGISTIC"])
    i_t, f_t, g_t, o_t = (r_[0].outputs[0] for r_ in (i_g, f_g, c_g, o_g))
    # c' = f * c + i * g ; h' = o * tanh(c')
    h_new = g.outputs[h_pos]
    mul_h = body.made_by(h_new, "MUL")
    body.plain(mul_h, "MulOptions")
    _need(o_t in mul_h.inputs)
    tanh_c = body.made_by(next(i for i in mul_h.inputs if i != o_t), "TANH")
    c_new = tanh_c.inputs[0]
    _need(c_new in g.outputs)
    c_pos = g.outputs.index(c_new)
    add_c = body.made_by(c_new, "ADD")
    body.plain(add_c, "AddOptions")
    products = {frozenset(body.made_by(i, "MUL").inputs) for i in add_c.inputs}
    _need(products == {frozenset((f_t, g.inputs[c_pos])), frozenset((i_t, g_t))})
    for i in add_c.inputs:
        body.plain(body.writer[i], "MulOptions")
    # the buffer: CONCATENATION(buffer[:t], h', buffer[t+1:]) on axis 0, or (a layer giving
    # its last output only) h' as [1, batch, units]
    buffer_out = [k for k in range(n) if k not in (x_pos, step_pos, h_pos, c_pos)
                  and body.writer.get(g.outputs[k]) is not None
                  and body.writer[g.outputs[k]].name in ("CONCATENATION", "RESHAPE")]
    _need(len(buffer_out) == 1)
    buf_pos = buffer_out[0]
    concat = body.writer[g.outputs[buf_pos]]
    last_only = concat.name == "RESHAPE"
    if last_only:
        _need(concat.inputs[0] == h_new)
        used.append(concat)
        step_next = g.outputs[step_pos]
    else:
        _need(len(concat.inputs) == 3 and concat.options("ConcatenationOptions").Axis() == 0)
        body.plain(concat, "ConcatenationOptions")
        head, middle, tail = concat.inputs
        _need(body.made_by(middle, "RESHAPE").inputs[0] == h_new)
        head_slice, tail_slice = body.made_by(head, "SLICE"), body.made_by(tail, "SLICE")
        _need(head_slice.inputs[0] == tail_slice.inputs[0] == g.inputs[buf_pos])
        _need(body.int_const(head_slice.inputs[1]) == [0, 0, 0] and
              body.int_const(tail_slice.inputs[2]) == [-1, -1, -1])
        head_size = body.made_by(head_slice.inputs[2], "CONCATENATION")
        _need(body.made_by(head_size.inputs[0], "RESHAPE").inputs[0] == g.inputs[step_pos] and
              body.int_const(head_size.inputs[1]) == [-1, -1])
        tail_begin = body.made_by(tail_slice.inputs[1], "CONCATENATION")
        _need(body.int_const(tail_begin.inputs[1]) == [0, 0])
        step_next = body.made_by(tail_begin.inputs[0], "RESHAPE").inputs[0]
        used += [concat, head_slice, tail_slice, head_size, tail_begin, body.writer[middle],
                 body.writer[head_size.inputs[0]], body.writer[tail_begin.inputs[0]]]
    # counters: every other loop value is a counter stepping by 1 (the step index among them)
    # or passes through unchanged (the input sequence)
    counters = [k for k in range(n) if k not in (x_pos, h_pos, c_pos, buf_pos)]
    _need(step_pos in counters and g.outputs[x_pos] == g.inputs[x_pos])
    for k in counters:
        inc = body.made_by(g.outputs[k], "ADD")
        body.plain(inc, "AddOptions")
        _need(inc.inputs[0] == g.inputs[k] and body.int_const(inc.inputs[1]) == [1])
        _need(op.tensor(k).type_name == "INT32" and c.const_of(op.inputs[k]) is not None and
              c.const_values(k, "counter").reshape(-1).tolist() == [0])
    _need(step_next == g.outputs[step_pos])
    # every operator of the body belongs to the pattern
    used += [*i_g, *f_g, *c_g, *o_g, mul_h, tanh_c, add_c]
    used += [body.writer[i] for i in add_c.inputs] + [body.writer[g.outputs[k]] for k in counters]
    _need(len({o.index for o in used}) == len(body.ops))
    # the condition: every counter below the sequence length
    x_shape = list(op.tensor(x_pos).shape)
    _need(len(x_shape) == 3 and min(x_shape) > 0)
    steps, batch = x_shape[0], x_shape[1]
    _need(w.shape[1] == x_shape[2] and list(op.tensor(buf_pos).shape) == [1 if last_only else steps, batch, units])
    _need(list(op.tensor(h_pos).shape) == list(op.tensor(c_pos).shape) == [batch, units])
    limits = set()
    for cop in cond.ops:
        if cop.name == "LESS":
            _need(cop.inputs[0] in cond.graph.inputs and
                  cond.graph.inputs.index(cop.inputs[0]) in counters)
            limits.add((cond.graph.inputs.index(cop.inputs[0]), tuple(cond.int_const(cop.inputs[1]))))
        else:
            _need(cop.name == "LOGICAL_AND")
    _need({k for k, _ in limits} == set(counters) and {v for _, v in limits} == {(steps,)})
    # nothing reads the loop's results but its buffer
    for k in range(n):
        if k != buf_pos:
            _need(not c.readers(op.outputs[k]) and op.outputs[k] not in c.graph.outputs)
    _need(op.tensor(x_pos).type_name == "FLOAT32")
    hybrid = [o.source for o in (fc_a, fc_b) if g.tensors[o.inputs[1]].type_name in ("INT8", "UINT8")]
    return {"x": x_pos, "h": h_pos, "c": c_pos, "buffer": buf_pos, "w": w, "r": r,
            "bias": np.zeros(4 * units, np.float32) if bias is None else bias, "units": units, "hybrid": hybrid,
            "steps": steps, "batch": batch, "last_only": last_only}


def keras_while_lstm(c: _Converter, op: _Operator) -> bool:
    """Import WHILE ``op`` (of the importer's converter ``c``: its operators, readers,
    constants and tensors are all this module reads, so it never imports the importer)
    as one UNIDIRECTIONAL_SEQUENCE_LSTM when it is the loop of a Keras 3 LSTM layer (see
    the module docstring); False (nothing emitted) otherwise."""
    try:
        found = _match(c, op)
    except _NoMatch:
        return False
    except Exception:  # noqa: BLE001  (a malformed body is for the plain WHILE to report)
        return False
    units, f32 = found["units"], T.TENSOR_FLOAT32

    def const(values: np.ndarray) -> int:
        values = np.ascontiguousarray(values, np.float32)
        return c.const_operand(values, OperandType(f32, list(values.shape)))

    w, r, bias = found["w"], found["r"], found["bias"]
    gates = [slice(k * units, (k + 1) * units) for k in range(4)]  # i, f, c, o
    omitted = [c.omitted(OperandType(f32, [0])) for _ in range(9)]
    inputs = [c.input(found["x"]), *(const(w[s]) for s in gates), *(const(r[s]) for s in gates),
              *omitted[:3], *(const(bias[s]) for s in gates), *omitted[3:5],
              c.input(found["h"]), c.input(found["c"]), c.i32(4), c.f32(0.0), c.f32(0.0), c.boolean(True),
              *omitted[5:9]]
    if found["last_only"]:  # the layer's last output only: the sequence's last step
        sequence = c.add(OperandType(f32, [found["steps"], found["batch"], units]))
        c.emit(Op.UNIDIRECTIONAL_SEQUENCE_LSTM, inputs, [sequence])
        c.emit(Op.SLICE, [sequence, c.vector([found["steps"] - 1, 0, 0]), c.vector([1, found["batch"], units])],
               [c.output(found["buffer"])])
    else:
        c.emit(Op.UNIDIRECTIONAL_SEQUENCE_LSTM, inputs, [c.output(found["buffer"])])
    c.hybrid_operators.extend(s for s in found["hybrid"] if s not in c.hybrid_operators)
    c.lowered("Keras 3's LSTM loop (WHILE of one LSTM step writing a [time, batch, units] buffer) as "
              "UNIDIRECTIONAL_SEQUENCE_LSTM over the whole sequence")
    return True
