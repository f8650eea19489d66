"""Benchmark the recurrent operations at speech-model sizes, end to end through the public
API (weights are constants, the sequence and states model inputs, one Execution.compute
per run):

- UNIDIRECTIONAL_SEQUENCE_LSTM: 100 steps x batch 8, input 128, 256 units projected to
  128 (peephole + projection), float32 and float16, time-major;
- BIDIRECTIONAL_SEQUENCE_LSTM: the same cell in both directions, merged outputs;
- UNIDIRECTIONAL_SEQUENCE_RNN: 100 steps x batch 8, input 128, 256 units;
- SVDF: batch 8, input 128, 256 filters (rank 2), memory 32;
- QUANTIZED_LSTM / QUANTIZED_16BIT_LSTM: one step, batch 8, 256 units.

Run:  .venv/bin/python benchmarks/bench_recurrent.py [--repeat 5]
Prints one row per case: median and best milliseconds, and time per step where it applies.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

import nnapi
from nnapi import OperandCode as T
from nnapi import OperandType as OT
from nnapi import OperationCode as Op

STEPS, BATCH, INPUT, UNITS, OUTPUT = 100, 8, 128, 256, 128
RNG = np.random.default_rng(0)


def _build(code, inputs, outputs):
    """A compiled one-operation model; inputs are (type, value) with None for model inputs."""
    model = nnapi.Model()
    keep, feeds, model_inputs, indexes = [], [], [], []
    for op_type, value in inputs:
        index = model.add_operand(op_type)
        indexes.append(index)
        if isinstance(value, str):
            model.set_operand_value(index, None)
        elif isinstance(value, tuple):  # ("input", array): a model input fed at run time
            model_inputs.append(index)
            feeds.append(value[1])
        else:
            array = np.asarray(value, dtype=op_type.dtype)
            keep.append(array)
            model.set_operand_value(index, array)
    output_indexes = [model.add_operand(t) for t in outputs]
    model.add_operation(code, indexes, output_indexes)
    model.identify_inputs_and_outputs(model_inputs, output_indexes)
    model.finish()
    compilation = nnapi.Compilation(model, [nnapi.get_devices()[0]])  # nnapi-reference: its kernels
    compilation.finish()
    buffers = [np.zeros(t.dimensions, dtype=t.dtype) for t in outputs]
    return compilation, feeds, buffers, keep


def _run(compilation, feeds, buffers):
    execution = nnapi.Execution(compilation)
    for position, feed in enumerate(feeds):
        execution.set_input(position, feed)
    for position, buffer in enumerate(buffers):
        execution.set_output(position, buffer)
    execution.compute()


def _lstm_inputs(dtype, x_shape=(STEPS, BATCH, INPUT)):
    def tensor(shape, scale=0.1):
        value = (RNG.standard_normal(shape) * scale).astype(dtype)
        return (OT(T.TENSOR_FLOAT32 if dtype == np.float32 else T.TENSOR_FLOAT16, shape), value)

    code = T.TENSOR_FLOAT32 if dtype == np.float32 else T.TENSOR_FLOAT16
    x_type, x_value = tensor(x_shape, 1.0)
    weights = [tensor((UNITS, INPUT)) for _ in range(4)] + [tensor((UNITS, OUTPUT)) for _ in range(4)]
    weights += [tensor((UNITS,)) for _ in range(7)] + [tensor((OUTPUT, UNITS)), (OT(code, (0,)), "omitted")]
    states = [(OT(code, (BATCH, OUTPUT)), ("input", np.zeros((BATCH, OUTPUT), dtype))),
              (OT(code, (BATCH, UNITS)), ("input", np.zeros((BATCH, UNITS), dtype)))]
    return (x_type, ("input", x_value)), weights, states, code


def case_unidirectional_lstm(dtype):
    x, weights, states, code = _lstm_inputs(dtype)
    clip = OT(T.FLOAT32 if dtype == np.float32 else T.FLOAT16)
    inputs = [x, *weights, *states, (OT(T.INT32), 4), (clip, 0.0), (clip, 0.0), (OT(T.BOOL), True)]
    inputs += [(OT(code, (0,)), "omitted")] * 4
    return _build(Op.UNIDIRECTIONAL_SEQUENCE_LSTM, inputs, [OT(code, (STEPS, BATCH, OUTPUT))])


def case_bidirectional_lstm():
    x, fw, fw_states, code = _lstm_inputs(np.float32)
    _, bw, bw_states, _ = _lstm_inputs(np.float32)
    omitted = (OT(code, (0,)), "omitted")
    inputs = [x, *fw, *bw, *fw_states, *bw_states, omitted, *[omitted] * 8, (OT(T.INT32), 4),
              (OT(T.FLOAT32), 0.0), (OT(T.FLOAT32), 0.0), (OT(T.BOOL), True), (OT(T.BOOL), True), *[omitted] * 8]
    return _build(Op.BIDIRECTIONAL_SEQUENCE_LSTM, inputs, [OT(code, (STEPS, BATCH, 2 * OUTPUT))])


def case_unidirectional_rnn():
    f32 = T.TENSOR_FLOAT32
    inputs = [(OT(f32, (STEPS, BATCH, INPUT)), ("input", RNG.standard_normal((STEPS, BATCH, INPUT), np.float32))),
              (OT(f32, (UNITS, INPUT)), RNG.standard_normal((UNITS, INPUT)) * 0.05),
              (OT(f32, (UNITS, UNITS)), RNG.standard_normal((UNITS, UNITS)) * 0.05),
              (OT(f32, (UNITS,)), np.zeros(UNITS)),
              (OT(f32, (BATCH, UNITS)), ("input", np.zeros((BATCH, UNITS), np.float32))),
              (OT(T.INT32), 1), (OT(T.INT32), 1)]
    return _build(Op.UNIDIRECTIONAL_SEQUENCE_RNN, inputs, [OT(f32, (STEPS, BATCH, UNITS))])


def case_svdf():
    f32 = T.TENSOR_FLOAT32
    filters, memory, rank = 256, 32, 2
    inputs = [(OT(f32, (BATCH, INPUT)), ("input", RNG.standard_normal((BATCH, INPUT), np.float32))),
              (OT(f32, (filters, INPUT)), RNG.standard_normal((filters, INPUT))),
              (OT(f32, (filters, memory)), RNG.standard_normal((filters, memory))),
              (OT(f32, (filters // rank,)), np.zeros(filters // rank)),
              (OT(f32, (BATCH, filters * memory)), ("input", np.zeros((BATCH, filters * memory), np.float32))),
              (OT(T.INT32), rank), (OT(T.INT32), 1)]
    return _build(Op.SVDF, inputs, [OT(f32, (BATCH, filters * memory)), OT(f32, (BATCH, filters // rank))])


def case_quantized_lstm():
    q8s, q8, q16, i32 = T.TENSOR_QUANT8_ASYMM_SIGNED, T.TENSOR_QUANT8_SYMM, T.TENSOR_QUANT16_SYMM, T.TENSOR_INT32

    def weights(shape):
        return (OT(q8, shape, 0.01), RNG.integers(-127, 128, shape))

    omitted16 = (OT(q16, (0,), 1.0), "omitted")
    inputs = [(OT(q8s, (BATCH, INPUT), 1 / 64, 0), ("input", RNG.integers(-128, 128, (BATCH, INPUT), np.int8)))]
    inputs += [weights((UNITS, INPUT)) for _ in range(4)] + [weights((UNITS, UNITS)) for _ in range(4)]
    inputs += [omitted16] * 3 + [(OT(i32, (UNITS,)), np.zeros(UNITS)) for _ in range(4)]
    inputs += [(OT(q8, (0,), 1.0), "omitted"), (OT(i32, (0,)), "omitted")]
    inputs += [(OT(q8s, (BATCH, UNITS), 1 / 128, 0), ("input", np.zeros((BATCH, UNITS), np.int8))),
               (OT(q16, (BATCH, UNITS), 2.0**-11), ("input", np.zeros((BATCH, UNITS), np.int16)))]
    inputs += [(OT(q16, (UNITS,), 1 / 1024), np.full(UNITS, 1024)) for _ in range(4)]
    inputs += [(OT(T.FLOAT32), 0.0)] * 2 + [(OT(T.FLOAT32), 2.0**-10)] * 4 + [(OT(T.INT32), 0),
                                                                               (OT(T.FLOAT32), 1 / 128)]
    outputs = [OT(q8s, (BATCH, UNITS), 1 / 128, 0), OT(q16, (BATCH, UNITS), 2.0**-11), OT(q8s, (BATCH, UNITS), 1 / 128)]
    return _build(Op.QUANTIZED_LSTM, inputs, outputs)


def case_quantized_16bit_lstm():
    q8, q16 = T.TENSOR_QUANT8_ASYMM, T.TENSOR_QUANT16_SYMM
    inputs = [(OT(q8, (BATCH, INPUT), 1 / 128, 128), ("input", RNG.integers(0, 256, (BATCH, INPUT), np.uint8)))]
    inputs += [(OT(q8, (UNITS, INPUT), 0.01, 128), RNG.integers(0, 256, (UNITS, INPUT))) for _ in range(4)]
    inputs += [(OT(q8, (UNITS, UNITS), 0.01, 128), RNG.integers(0, 256, (UNITS, UNITS))) for _ in range(4)]
    inputs += [(OT(T.TENSOR_INT32, (UNITS,), 0.01 / 128), np.zeros(UNITS)) for _ in range(4)]
    inputs += [(OT(q16, (BATCH, UNITS), 2.0**-11), ("input", np.zeros((BATCH, UNITS), np.int16))),
               (OT(q8, (BATCH, UNITS), 1 / 128, 128), ("input", np.full((BATCH, UNITS), 128, np.uint8)))]
    return _build(Op.QUANTIZED_16BIT_LSTM, inputs, [OT(q16, (BATCH, UNITS), 2.0**-11),
                                                    OT(q8, (BATCH, UNITS), 1 / 128, 128)])


CASES = [
    ("UNIDIRECTIONAL_SEQUENCE_LSTM float32", lambda: case_unidirectional_lstm(np.float32), STEPS),
    ("UNIDIRECTIONAL_SEQUENCE_LSTM float16", lambda: case_unidirectional_lstm(np.float16), STEPS),
    ("BIDIRECTIONAL_SEQUENCE_LSTM float32 merged", case_bidirectional_lstm, 2 * STEPS),
    ("UNIDIRECTIONAL_SEQUENCE_RNN float32", case_unidirectional_rnn, STEPS),
    ("SVDF float32 rank 2", case_svdf, 1),
    ("QUANTIZED_LSTM layer norm", case_quantized_lstm, 1),
    ("QUANTIZED_16BIT_LSTM", case_quantized_16bit_lstm, 1),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    print(f"{'case':46} {'median ms':>10} {'best ms':>9} {'ms/step':>8}")
    for name, make, steps in CASES:
        compilation, feeds, buffers, _keep = make()
        _run(compilation, feeds, buffers)  # warm-up
        times = []
        for _ in range(args.repeat):
            start = time.perf_counter()
            _run(compilation, feeds, buffers)
            times.append((time.perf_counter() - start) * 1e3)
        median = statistics.median(times)
        print(f"{name:46} {median:10.2f} {min(times):9.2f} {median / steps:8.3f}")


if __name__ == "__main__":
    main()
