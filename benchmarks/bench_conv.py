"""Benchmark CONV_2D and DEPTHWISE_CONV_2D at MobileNet sizes (input 1x112x112x32,
3x3 filters, stride 1, SAME padding, RELU6): a 32->64 convolution, a 1x1 32->64
pointwise convolution and a 32-channel depthwise convolution, in float32 and quant8
(per-tensor) and quant8 signed with a per-channel filter.

Each case is timed two ways: end to end through the public API (constant filter and
bias, the input a model input, one Execution.compute per run) and the kernel alone
(the registered operation's prepare + execute on ready tensors, no runtime).

Run:  .venv/bin/python benchmarks/bench_conv.py [--repeat 10]
Prints one row per case: median and best milliseconds, and GFLOP/s (2 flops per MAC).
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
from nnapi.operand import SymmPerChannelQuantParams
from nnapi.operations import get_operation
from nnapi.operations.base import ExecutionContext, Tensor

SIZE, CHANNELS = 112, 32


def _case(op, kind: str, kernel: int, out_channels: int):
    """(input operand types with values, output type, MAC count) for one case."""
    rng = np.random.default_rng(0)
    shape = [1, SIZE, SIZE, CHANNELS]
    depthwise = op == Op.DEPTHWISE_CONV_2D
    filter_shape = [1, kernel, kernel, CHANNELS] if depthwise else [out_channels, kernel, kernel, CHANNELS]
    channels = CHANNELS if depthwise else out_channels
    if kind == "float32":
        x = OperandType(T.TENSOR_FLOAT32, shape)
        w = OperandType(T.TENSOR_FLOAT32, filter_shape)
        b = OperandType(T.TENSOR_FLOAT32, [channels])
        y = OperandType(T.TENSOR_FLOAT32, [1, SIZE, SIZE, channels])
        w_value = rng.standard_normal(filter_shape).astype(np.float32)
        b_value = rng.standard_normal(channels).astype(np.float32)
        x_value = rng.standard_normal(shape).astype(np.float32)
    elif kind == "quant8":
        x = OperandType(T.TENSOR_QUANT8_ASYMM, shape, 0.02, 128)
        w = OperandType(T.TENSOR_QUANT8_ASYMM, filter_shape, 0.01, 120)
        b = OperandType(T.TENSOR_INT32, [channels], float(np.float32(0.02) * np.float32(0.01)))
        y = OperandType(T.TENSOR_QUANT8_ASYMM, [1, SIZE, SIZE, channels], 0.05, 0)
        w_value = rng.integers(0, 256, filter_shape).astype(np.uint8)
        b_value = rng.integers(-5000, 5000, channels).astype(np.int32)
        x_value = rng.integers(0, 256, shape).astype(np.uint8)
    else:  # quant8 signed, per-channel filter
        x = OperandType(T.TENSOR_QUANT8_ASYMM_SIGNED, shape, 0.02, -3)
        scales = tuple(float(s) for s in rng.uniform(0.005, 0.02, channels))
        params = SymmPerChannelQuantParams(3 if depthwise else 0, scales)
        w = OperandType(T.TENSOR_QUANT8_SYMM_PER_CHANNEL, filter_shape, 0.0, 0, params)
        b = OperandType(T.TENSOR_INT32, [channels])
        y = OperandType(T.TENSOR_QUANT8_ASYMM_SIGNED, [1, SIZE, SIZE, channels], 0.05, -128)
        w_value = rng.integers(-127, 128, filter_shape).astype(np.int8)
        b_value = rng.integers(-5000, 5000, channels).astype(np.int32)
        x_value = rng.integers(-128, 128, shape).astype(np.int8)
    scalars = [(OperandType(T.INT32), nnapi.PaddingCode.PADDING_SAME), (OperandType(T.INT32), 1),
               (OperandType(T.INT32), 1)]
    if depthwise:
        scalars.append((OperandType(T.INT32), 1))
    scalars.append((OperandType(T.INT32), nnapi.FuseCode.FUSED_RELU6))
    inputs = [(x, x_value), (w, w_value), (b, b_value), *scalars]
    macs = SIZE * SIZE * channels * kernel * kernel * (1 if depthwise else CHANNELS)
    return inputs, y, macs


def _time(run, repeat: int, warmup: int = 5) -> list[float]:
    # Warm up: the first calls are slower while the allocator settles on reusing
    # large blocks instead of mapping fresh pages.
    for _ in range(warmup):
        run()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return times


def _public_api(op, inputs, output: OperandType):
    model = nnapi.Model()
    keep = []
    for index, (op_type, value) in enumerate(inputs):
        model.add_operand(op_type.with_channel_quant(None))
        if op_type.channel_quant is not None:
            model.set_operand_symm_per_channel_quant_params(index, op_type.channel_quant)
        if index > 0:
            array = np.asarray(value, dtype=op_type.dtype)
            keep.append(array)
            model.set_operand_value(index, array)
    out_index = model.add_operand(output)
    model.add_operation(op, list(range(len(inputs))), [out_index])
    model.identify_inputs_and_outputs([0], [out_index])
    model.finish()
    compilation = nnapi.Compilation(model, [nnapi.get_devices()[0]])  # nnapi-reference: its kernels
    compilation.finish()
    result = np.zeros(output.dimensions, dtype=output.dtype)

    def run():
        execution = nnapi.Execution(compilation)
        execution.set_input(0, inputs[0][1])
        execution.set_output(0, result)
        execution.compute()

    return run, keep


def _kernel(op, inputs, output: OperandType):
    tensors = [Tensor(t.type, tuple(np.shape(v)), t.scale, t.zero_point, t.channel_quant, np.asarray(v, t.dtype))
               for t, v in inputs]
    implementation = get_operation(op)

    def run():
        context = ExecutionContext(op, tensors, [output])
        implementation.prepare(context)
        implementation.execute(context)

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=10)
    args = parser.parse_args()
    cases = [
        ("CONV_2D 3x3 32->64", Op.CONV_2D, 3, 64),
        ("CONV_2D 1x1 32->64", Op.CONV_2D, 1, 64),
        ("DEPTHWISE 3x3 x32", Op.DEPTHWISE_CONV_2D, 3, CHANNELS),
    ]
    print(f"input 1x{SIZE}x{SIZE}x{CHANNELS}, SAME padding, stride 1, RELU6; {args.repeat} runs each")
    print(f"{'case':<22} {'type':<16} {'path':<8} {'median ms':>10} {'best ms':>9} {'GFLOP/s':>8}")
    for label, op, kernel, out_channels in cases:
        for kind in ("float32", "quant8", "quant8s-perchan"):
            inputs, output, macs = _case(op, kind, kernel, out_channels)
            run_api, _keep = _public_api(op, inputs, output)
            for path, run in (("api", run_api), ("kernel", _kernel(op, inputs, output))):
                times = _time(run, args.repeat)
                median, best = statistics.median(times), min(times)
                print(f"{label:<22} {kind:<16} {path:<8} {median * 1e3:>10.2f} {best * 1e3:>9.2f} "
                      f"{2 * macs / median / 1e9:>8.2f}")


if __name__ == "__main__":
    main()
