"""Benchmark the heaviest shape-manipulation and reduction operations on realistic sizes.

Each case is a one-operation model whose data tensor is a model input and whose
parameters are constants. Two figures per case: "kernel" times the operation's
prepare + execute alone (the numpy work), "api" times a whole Execution.compute
through the public API (request validation, input reads, output copy included).
Run: .venv/bin/python benchmarks/bench_shape.py [--repeat N] [--filter NAME]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import numpy as np

import nnapi
from nnapi import OperandCode as T
from nnapi import OperandType
from nnapi import OperationCode as Op
from nnapi.operations import ExecutionContext, Tensor, get_operation

RNG = np.random.default_rng(0)
INT = OperandType(T.INT32)
BOOL = OperandType(T.BOOL)


def f32(*dims):
    return OperandType(T.TENSOR_FLOAT32, dims)


def q8(*dims, scale=0.05, zero_point=128):
    return OperandType(T.TENSOR_QUANT8_ASYMM, dims, scale, zero_point)


def i32(*dims):
    return OperandType(T.TENSOR_INT32, dims)


def random_value(op_type: OperandType) -> np.ndarray:
    if op_type.type == T.TENSOR_FLOAT32:
        return RNG.standard_normal(op_type.dimensions, dtype=np.float32)
    return RNG.integers(0, 256, op_type.dimensions).astype(op_type.dtype)


class Case:
    """One operation with its inputs: (type, value) where value None is a model input
    filled with random data; the output types may leave dimensions unspecified."""

    def __init__(self, name: str, code: Op, inputs: list, outputs: list[OperandType]):
        self.name, self.code, self.inputs, self.outputs = name, code, inputs, outputs
        self.feeds = [random_value(t) for t, v in inputs if v is None]
        self.values = []
        feeds = iter(self.feeds)
        for op_type, value in inputs:
            self.values.append(next(feeds) if value is None else np.asarray(value, dtype=op_type.dtype))

    @property
    def bytes_moved(self) -> int:
        return sum(v.nbytes for v in self.values)

    def kernel(self) -> Callable[[], None]:
        operation = get_operation(self.code)
        tensors = [Tensor(t.type, tuple(v.shape), t.scale, t.zero_point, None, v)
                   for (t, _), v in zip(self.inputs, self.values, strict=True)]
        context = ExecutionContext(self.code, tensors, self.outputs)

        def run() -> None:
            operation.prepare(context)
            operation.execute(context)

        return run

    def api(self) -> Callable[[], None]:
        model = nnapi.Model()
        model_inputs = []
        self._keep = []
        for op_type, value in self.inputs:
            index = model.add_operand(op_type)
            if value is None:
                model_inputs.append(index)
            else:
                array = np.asarray(value, dtype=op_type.dtype)
                self._keep.append(array)
                model.set_operand_value(index, array)
        outputs = [model.add_operand(t) for t in self.outputs]
        model.add_operation(self.code, list(range(len(self.inputs))), outputs)
        model.identify_inputs_and_outputs(model_inputs, outputs)
        model.finish()
        compilation = nnapi.Compilation(model, [nnapi.get_devices()[0]])  # nnapi-reference: its kernels
        compilation.finish()
        # Size the output buffers once from the kernel's own shape inference.
        shapes = get_operation(self.code).prepare(ExecutionContext(
            self.code, [Tensor(t.type, tuple(v.shape), t.scale, t.zero_point, None, v)
                        for (t, _), v in zip(self.inputs, self.values, strict=True)], self.outputs))
        buffers = [np.empty(shape, dtype=t.dtype) for shape, t in zip(shapes, self.outputs, strict=True)]

        def run() -> None:
            execution = nnapi.Execution(compilation)
            for position, feed in enumerate(self.feeds):
                execution.set_input(position, feed)
            for position, buffer in enumerate(buffers):
                execution.set_output(position, buffer)
            execution.compute()

        return run


def cases() -> list[Case]:
    nchw = f32(8, 64, 64, 64)
    image = f32(8, 112, 112, 32)
    features = f32(8, 56, 56, 256)
    return [
        Case("TRANSPOSE f32 [8,64,64,64] NCHW->NHWC", Op.TRANSPOSE,
             [(nchw, None), (i32(4), [0, 2, 3, 1])], [f32()]),
        Case("CONCATENATION f32 4x[8,64,64,16] axis 3", Op.CONCATENATION,
             [(f32(8, 64, 64, 16), None)] * 4 + [(INT, 3)], [f32()]),
        Case("CONCATENATION q8 4x[8,64,64,16] rescaled", Op.CONCATENATION,
             [(q8(8, 64, 64, 16, scale=0.05 * (i + 1)), None) for i in range(4)] + [(INT, 3)], [q8()]),
        Case("REDUCE_SUM f32 [8,56,56,256] axes 1,2", Op.REDUCE_SUM,
             [(features, None), (i32(2), [1, 2]), (BOOL, False)], [f32()]),
        Case("MEAN f32 [8,56,56,256] axes 1,2", Op.MEAN,
             [(features, None), (i32(2), [1, 2]), (INT, 1)], [f32()]),
        Case("MEAN q8 [8,56,56,256] axes 1,2", Op.MEAN,
             [(q8(8, 56, 56, 256), None), (i32(2), [1, 2]), (INT, 0)], [q8()]),
        Case("REDUCE_MAX f32 [8,56,56,256] axis 3", Op.REDUCE_MAX,
             [(features, None), (i32(1), [3]), (BOOL, False)], [f32()]),
        Case("GATHER f32 [50000,256] x 4096 rows", Op.GATHER,
             [(f32(50000, 256), None), (INT, 0), (i32(4096), RNG.integers(0, 50000, 4096))], [f32()]),
        Case("EMBEDDING_LOOKUP f32 [50000,256] x 4096", Op.EMBEDDING_LOOKUP,
             [(i32(4096), RNG.integers(0, 50000, 4096)), (f32(50000, 256), None)], [f32()]),
        Case("PAD f32 [8,112,112,32] +1 spatial", Op.PAD,
             [(image, None), (i32(4, 2), [[0, 0], [1, 1], [1, 1], [0, 0]])], [f32()]),
        Case("PAD_V2 q8 [8,112,112,32] +1 spatial", Op.PAD_V2,
             [(q8(8, 112, 112, 32), None), (i32(4, 2), [[0, 0], [1, 1], [1, 1], [0, 0]]), (INT, 3)], [q8()]),
        Case("MIRROR_PAD f32 [8,112,112,32] reflect 3", Op.MIRROR_PAD,
             [(image, None), (i32(4, 2), [[0, 0], [3, 3], [3, 3], [0, 0]]), (INT, 0)], [f32()]),
        Case("STRIDED_SLICE f32 [8,112,112,32] ::2", Op.STRIDED_SLICE,
             [(image, None), (i32(4), [0, 0, 0, 0]), (i32(4), [8, 112, 112, 32]), (i32(4), [1, 2, 2, 1]),
              (INT, 0), (INT, 0), (INT, 0)], [f32()]),
        Case("SPACE_TO_BATCH_ND f32 [8,112,112,32] 2x2", Op.SPACE_TO_BATCH_ND,
             [(image, None), (i32(2), [2, 2]), (i32(2, 2), [[1, 1], [1, 1]])], [f32()]),
        Case("DEPTH_TO_SPACE f32 [8,64,64,64] block 2", Op.DEPTH_TO_SPACE,
             [(nchw, None), (INT, 2)], [f32()]),
        Case("TILE f32 [8,56,56,32] x[1,1,1,4]", Op.TILE,
             [(f32(8, 56, 56, 32), None), (i32(4), [1, 1, 1, 4])], [f32()]),
        Case("ARGMAX f32 [8,56,56,256] axis 3", Op.ARGMAX,
             [(features, None), (INT, 3)], [i32()]),
        Case("TOPK_V2 f32 [64,10000] k=5", Op.TOPK_V2,
             [(f32(64, 10000), None), (INT, 5)], [f32(), i32()]),
    ]


def measure(function: Callable[[], None], repeat: int) -> float:
    """The median wall time of ``function`` in milliseconds, after one warm-up call."""
    function()
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        function()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--filter", default="", help="only cases whose name contains this")
    args = parser.parse_args()
    print(f"{'case':44s} {'input MB':>8s} {'kernel ms':>10s} {'api ms':>9s} {'input GB/s':>12s}")
    for case in cases():
        if args.filter.lower() not in case.name.lower():
            continue
        kernel_ms = measure(case.kernel(), args.repeat)
        api_ms = measure(case.api(), args.repeat)
        megabytes = case.bytes_moved / 1e6
        print(f"{case.name:44s} {megabytes:8.1f} {kernel_ms:10.2f} {api_ms:9.2f} "
              f"{megabytes / kernel_ms:12.2f}")


if __name__ == "__main__":
    main()
