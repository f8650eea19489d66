"""Benchmark the heaviest element-wise operations on a MobileNet-sized activation
(1x112x112x32 by default) in float32, float16 and quant8, end to end through the public
API (model input -> one operation -> model output) on the reference device.

Run:  .venv/bin/python benchmarks/bench_elementwise.py [--shape 1,112,112,32] [--repeat 20]
Prints one row per (operation, type): the median and best wall time of Execution.compute
and the element throughput.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

import nnapi
from nnapi import OperandCode as T
from nnapi import OperandType
from nnapi import OperationCode as Op


def _types(kind: str, shape) -> OperandType:
    """The benchmark's input type for an element kind (quant8s = quant8 asymm signed)."""
    if kind == "float32":
        return OperandType(T.TENSOR_FLOAT32, shape)
    if kind == "float16":
        return OperandType(T.TENSOR_FLOAT16, shape)
    if kind == "quant8":
        return OperandType(T.TENSOR_QUANT8_ASYMM, shape, 0.05, 128)
    return OperandType(T.TENSOR_QUANT8_ASYMM_SIGNED, shape, 0.05, 0)


def _fixed_output(code, in_type: OperandType) -> OperandType:
    signed = in_type.type == T.TENSOR_QUANT8_ASYMM_SIGNED
    if in_type.type in (T.TENSOR_FLOAT32, T.TENSOR_FLOAT16):
        return in_type
    if code == Op.LOGISTIC:
        return OperandType(in_type.type, in_type.dimensions, 1 / 256, -128 if signed else 0)
    if code == Op.TANH:
        return OperandType(in_type.type, in_type.dimensions, 1 / 128, 0 if signed else 128)
    return OperandType(in_type.type, in_type.dimensions, 0.1, in_type.zero_point)


def _case(code, kind, shape):
    """(input types with constant values or None, output type) for one benchmark case."""
    x = _types(kind, shape)
    channels = (shape[-1],)
    if code in (Op.RELU6, Op.LOGISTIC, Op.TANH, Op.HARD_SWISH):
        out = x if code == Op.RELU6 else _fixed_output(code, x)
        return [(x, None)], out
    if code == Op.EXP:
        return [(x, None)], x
    if code == Op.ELU:
        scalar = OperandType(T.FLOAT16 if kind == "float16" else T.FLOAT32)
        return [(x, None), (scalar, 1.0)], x
    if code in (Op.ADD, Op.MUL):
        return [(x, None), (x, None), (OperandType(T.INT32), 0)], _fixed_output(code, x)
    if code == Op.PRELU:
        alpha = OperandType(x.type, channels, x.scale, x.zero_point)
        # alpha = 0.25 as a real value, in the alpha operand's own representation
        stored = 0.25 if not x.scale else round(0.25 / x.scale) + x.zero_point
        return [(x, None), (alpha, np.full(channels, stored, dtype=alpha.dtype))], _fixed_output(code, x)
    if code == Op.MAXIMUM:
        return [(x, None), (x, None)], _fixed_output(code, x)
    if code == Op.GREATER:
        return [(x, None), (x, None)], OperandType(T.TENSOR_BOOL8, shape)
    if code == Op.SELECT:
        return [(OperandType(T.TENSOR_BOOL8, shape), None), (x, None), (x, None)], x
    if code == Op.QUANTIZE:
        return [(_types("float32", shape), None)], x
    if code == Op.DEQUANTIZE:
        return [(x, None)], _types("float32", shape)
    if code == Op.CAST:
        return [(x, None)], OperandType(T.TENSOR_INT32, shape)
    raise ValueError(code)


def _random(operand_type: OperandType, rng: np.random.Generator) -> np.ndarray:
    dims = operand_type.dimensions
    if operand_type.type == T.TENSOR_BOOL8:
        return rng.random(dims) < 0.5
    if operand_type.type in (T.TENSOR_FLOAT32, T.TENSOR_FLOAT16):
        return rng.uniform(-6, 6, dims).astype(operand_type.dtype)
    info = np.iinfo(operand_type.dtype)
    return rng.integers(info.min, info.max, dims, endpoint=True).astype(operand_type.dtype)


def bench(code, kind, shape, repeat, rng):
    inputs, out_type = _case(code, kind, shape)
    model = nnapi.Model()
    indexes, feeds, keep = [], [], []
    for operand_type, value in inputs:
        index = model.add_operand(operand_type)
        if value is None:
            indexes.append(index)
            feeds.append(_random(operand_type, rng))
        else:
            array = np.asarray(value, dtype=operand_type.dtype)
            keep.append(array)
            model.set_operand_value(index, array)
    out_index = model.add_operand(out_type)
    model.add_operation(code, list(range(len(inputs))), [out_index])
    model.identify_inputs_and_outputs(indexes, [out_index])
    model.finish()
    compilation = nnapi.Compilation(model, [nnapi.get_devices()[0]])  # nnapi-reference: its kernels
    compilation.finish()
    output = np.zeros(out_type.dimensions, dtype=out_type.dtype)
    times = []
    for _ in range(repeat + 1):
        execution = nnapi.Execution(compilation)
        for position, feed in enumerate(feeds):
            execution.set_input(position, feed)
        execution.set_output(0, output)
        start = time.perf_counter()
        execution.compute()
        times.append(time.perf_counter() - start)
    times = times[1:]  # the first run warms caches
    return statistics.median(times), min(times)


CASES = [
    (Op.RELU6, ("float32", "float16", "quant8")),
    (Op.LOGISTIC, ("float32", "float16", "quant8", "quant8s")),
    (Op.TANH, ("float32", "quant8")),
    (Op.HARD_SWISH, ("float32", "quant8", "quant8s")),
    (Op.ELU, ("float32", "float16")),
    (Op.EXP, ("float32",)),
    (Op.PRELU, ("float32", "quant8")),
    (Op.ADD, ("float32", "quant8")),
    (Op.MUL, ("float32", "quant8")),
    (Op.MAXIMUM, ("float32", "quant8")),
    (Op.GREATER, ("float32", "quant8")),
    (Op.SELECT, ("float32", "quant8")),
    (Op.QUANTIZE, ("quant8",)),
    (Op.DEQUANTIZE, ("quant8",)),
    (Op.CAST, ("float32",)),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="1,112,112,32", help="tensor shape, comma separated")
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()
    shape = tuple(int(d) for d in args.shape.split(","))
    elements = int(np.prod(shape))
    rng = np.random.default_rng(0)
    print(f"shape {list(shape)} ({elements} elements), {args.repeat} runs, Execution.compute wall time")
    print(f"{'operation':12s} {'type':8s} {'median ms':>10s} {'best ms':>9s} {'Melem/s':>9s}")
    for code, kinds in CASES:
        for kind in kinds:
            median, best = bench(code, kind, shape, args.repeat, rng)
            print(f"{code.name:12s} {kind:8s} {median * 1e3:10.2f} {best * 1e3:9.2f} {elements / median / 1e6:9.1f}")


if __name__ == "__main__":
    main()
