"""Benchmark single operations at real-model sizes: nnapi-reference against LiteRT.

The models of ``../shared/models`` show how a few architectures run; a model we do not
have may lean on an operation they barely use. This script builds one-operator TFLite
models (with the test suite's flatbuffer writer, ``tests/tflite_builder.py``) at the
activation sizes of MobileNet and MediaPipe models, in float32 and int8 (int8 activations,
per-channel int8 weights, as the TFLite converter writes them), and times each like
``bench_models.py`` does: imported with ``nnapi.load_tflite``, run through a Session on
nnapi-reference, and on LiteRT (XNNPACK and builtin kernels), one thread, same inputs.

Run:  .venv/bin/python benchmarks/bench_ops.py [--repeat 20] [--only CONV_2D] [--types float32,int8]
Prints a row per case with the ratios nnapi / LiteRT; compare ratios, not absolute times.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import argparse  # noqa: E402
import tempfile  # noqa: E402
from collections.abc import Callable  # noqa: E402

import bench_models  # noqa: E402  (pins BLAS to one thread before numpy loads)
import numpy as np  # noqa: E402

from tflite_builder import Tensor, single_op  # noqa: E402

#: the activation quantization of the int8 cases: real range about [-4, 4)
_SCALE, _ZERO = 1 / 32, 0
_RNG = np.random.default_rng(7)


def _activation(name: str, shape: list[int], kind: str) -> Tensor:
    if kind == "float32":
        return Tensor(name, "float32", shape)
    return Tensor(name, "int8", shape, scale=_SCALE, zero_point=_ZERO)


def _weights(name: str, shape: list[int], kind: str, channel_axis: int) -> Tensor:
    values = _RNG.normal(0, 0.1, shape).astype(np.float32)
    if kind == "float32":
        return Tensor(name, "float32", shape, values)
    scales = np.abs(values).max(axis=tuple(i for i in range(len(shape)) if i != channel_axis)) / 127
    scales = np.maximum(scales, 1e-6)
    broadcast = [1] * len(shape)
    broadcast[channel_axis] = -1
    quantized = np.clip(np.round(values / scales.reshape(broadcast)), -127, 127).astype(np.int8)
    return Tensor(name, "int8", shape, quantized, scale=scales.tolist(), zero_point=[0] * len(scales),
                  quantized_dimension=channel_axis)


def _bias(name: str, weights: Tensor, kind: str) -> Tensor:
    channels = weights.shape[weights.quantized_dimension] if kind != "float32" else None
    if kind == "float32":
        count = weights.shape[0] if len(weights.shape) != 4 or weights.shape[0] != 1 else weights.shape[3]
        return Tensor(name, "float32", [count], _RNG.normal(0, 0.1, count).astype(np.float32))
    scales = [_SCALE * s for s in weights.scale]
    values = np.round(_RNG.normal(0, 0.1, channels) / np.array(scales)).astype(np.int32)
    return Tensor(name, "int32", [channels], values, scale=scales, zero_point=[0] * channels)


def _int32(name: str, values) -> Tensor:
    array = np.asarray(values, np.int32)
    return Tensor(name, "int32", list(array.shape), array)


def conv(size: int, channels: int, filters: int, kernel: int, stride: int) -> Callable[[str], bytes]:
    def build(kind: str) -> bytes:
        out = size // stride
        tensors = [_activation("x", [1, size, size, channels], kind),
                   _weights("w", [filters, kernel, kernel, channels], kind, 0)]
        tensors += [_bias("b", tensors[1], kind), _activation("y", [1, out, out, filters], kind)]
        return single_op("CONV_2D", tensors, [0, 1, 2], [3],
                         ("Conv2DOptions", {"Padding": 0, "StrideW": stride, "StrideH": stride,
                                            "FusedActivationFunction": 3}))
    return build


def depthwise(size: int, channels: int, stride: int) -> Callable[[str], bytes]:
    def build(kind: str) -> bytes:
        out = size // stride
        tensors = [_activation("x", [1, size, size, channels], kind),
                   _weights("w", [1, 3, 3, channels], kind, 3)]
        tensors += [_bias("b", tensors[1], kind), _activation("y", [1, out, out, channels], kind)]
        return single_op("DEPTHWISE_CONV_2D", tensors, [0, 1, 2], [3],
                         ("DepthwiseConv2DOptions", {"Padding": 0, "StrideW": stride, "StrideH": stride,
                                                     "DepthMultiplier": 1, "FusedActivationFunction": 3}))
    return build


def fully_connected(inputs: int, outputs: int) -> Callable[[str], bytes]:
    def build(kind: str) -> bytes:
        tensors = [_activation("x", [1, inputs], kind), _weights("w", [outputs, inputs], kind, 0)]
        tensors += [_bias("b", tensors[1], kind), _activation("y", [1, outputs], kind)]
        return single_op("FULLY_CONNECTED", tensors, [0, 1, 2], [3], ("FullyConnectedOptions", {}))
    return build


def transpose_conv(size: int, channels: int, filters: int) -> Callable[[str], bytes]:
    def build(kind: str) -> bytes:
        out = 2 * size
        tensors = [_int32("shape", [1, out, out, filters]), _weights("w", [filters, 3, 3, channels], kind, 0),
                   _activation("x", [1, size, size, channels], kind), _activation("y", [1, out, out, filters], kind)]
        return single_op("TRANSPOSE_CONV", tensors, [0, 1, 2], [3],
                         ("TransposeConvOptions", {"Padding": 0, "StrideW": 2, "StrideH": 2}))
    return build


def pool(op: str, size: int, channels: int, window: int, stride: int) -> Callable[[str], bytes]:
    def build(kind: str) -> bytes:
        out = (size - window) // stride + 1
        tensors = [_activation("x", [1, size, size, channels], kind), _activation("y", [1, out, out, channels], kind)]
        return single_op(op, tensors, [0], [1], ("Pool2DOptions", {"Padding": 1, "StrideW": stride, "StrideH": stride,
                                                                   "FilterWidth": window, "FilterHeight": window}))
    return build


def binary(op: str, shape: list[int], options: str) -> Callable[[str], bytes]:
    def build(kind: str) -> bytes:
        tensors = [_activation("a", shape, kind), _activation("b", shape, kind), _activation("y", shape, kind)]
        return single_op(op, tensors, [0, 1], [2], (options, {}))
    return build


def unary(op: str, shape: list[int], options: tuple | None = None, out_scale: float | None = None,
          out_zero: int = 0) -> Callable[[str], bytes]:
    def build(kind: str) -> bytes:
        output = _activation("y", shape, kind)
        if kind == "int8" and out_scale is not None:  # the output quantization the converter requires
            output = Tensor("y", "int8", shape, scale=out_scale, zero_point=out_zero)
        return single_op(op, [_activation("x", shape, kind), output], [0], [1], options)
    return build


def with_constant(op: str, shape: list[int], constant: Tensor, out_shape: list[int],
                  options: tuple | None = None) -> Callable[[str], bytes]:
    def build(kind: str) -> bytes:
        tensors = [_activation("x", shape, kind), constant, _activation("y", out_shape, kind)]
        return single_op(op, tensors, [0, 1], [2], options)
    return build


def dilated_conv(size: int, channels: int, rate: int) -> Callable[[str], bytes]:
    def build(kind: str) -> bytes:
        tensors = [_activation("x", [1, size, size, channels], kind),
                   _weights("w", [channels, 3, 3, channels], kind, 0)]
        tensors += [_bias("b", tensors[1], kind), _activation("y", [1, size, size, channels], kind)]
        return single_op("CONV_2D", tensors, [0, 1, 2], [3],
                         ("Conv2DOptions", {"Padding": 0, "StrideW": 1, "StrideH": 1, "DilationWFactor": rate,
                                            "DilationHFactor": rate}))
    return build


def block_op(op: str, shape: list[int], out_shape: list[int]) -> Callable[[str], bytes]:
    options = "DepthToSpaceOptions" if op == "DEPTH_TO_SPACE" else "SpaceToDepthOptions"

    def build(kind: str) -> bytes:
        tensors = [_activation("x", shape, kind), _activation("y", out_shape, kind)]
        return single_op(op, tensors, [0], [1], (options, {"BlockSize": 2}))
    return build


def strided_slice(shape: list[int], begin, end, strides, out_shape: list[int]) -> Callable[[str], bytes]:
    def build(kind: str) -> bytes:
        tensors = [_activation("x", shape, kind), _int32("begin", begin), _int32("end", end),
                   _int32("strides", strides), _activation("y", out_shape, kind)]
        return single_op("STRIDED_SLICE", tensors, [0, 1, 2, 3], [4], ("StridedSliceOptions", {}))
    return build


def prelu(shape: list[int]) -> Callable[[str], bytes]:
    def build(kind: str) -> bytes:
        alpha = _RNG.uniform(0.05, 0.3, shape[-1:]).astype(np.float32)
        if kind == "float32":
            alpha_tensor = Tensor("alpha", "float32", [shape[-1]], alpha)
        else:
            alpha_tensor = Tensor("alpha", "int8", [shape[-1]], np.round(alpha / (0.3 / 127)).astype(np.int8),
                                  scale=0.3 / 127, zero_point=0)
        tensors = [_activation("x", shape, kind), alpha_tensor, _activation("y", shape, kind)]
        return single_op("PRELU", tensors, [0, 1], [2])
    return build


def concatenation(shape: list[int]) -> Callable[[str], bytes]:
    def build(kind: str) -> bytes:
        out = [*shape[:-1], 2 * shape[-1]]
        tensors = [_activation("a", shape, kind), _activation("b", shape, kind), _activation("y", out, kind)]
        return single_op("CONCATENATION", tensors, [0, 1], [2], ("ConcatenationOptions", {"Axis": 3}))
    return build


def converting(op: str, shape: list[int]) -> Callable[[str], bytes]:
    """QUANTIZE (float32 in, ``kind`` out) or DEQUANTIZE (``kind`` in, float32 out)."""
    def build(kind: str) -> bytes:
        real, stored = Tensor("real", "float32", shape), _activation("stored", shape, kind)
        tensors = [real, stored] if op == "QUANTIZE" else [stored, real]
        return single_op(op, tensors, [0], [1])
    return build


def reduce(op: str, shape: list[int], axes: list[int], keep: bool) -> Callable[[str], bytes]:
    out = [1 if axis in axes else size for axis, size in enumerate(shape)] if keep else [
        size for axis, size in enumerate(shape) if axis not in axes]
    return with_constant(op, shape, _int32("axes", axes), out, ("ReducerOptions", {"KeepDims": keep}))


def arg_max(shape: list[int]) -> Callable[[str], bytes]:
    def build(kind: str) -> bytes:
        tensors = [_activation("x", shape, kind), _int32("axis", [len(shape) - 1]),
                   Tensor("y", "int32", shape[:-1])]
        return single_op("ARG_MAX", tensors, [0, 1], [2], ("ArgMaxOptions", {"OutputType": 2}))
    return build


def batch_matmul(batches: int, rows: int, depth: int, columns: int) -> Callable[[str], bytes]:
    def build(kind: str) -> bytes:
        tensors = [_activation("a", [1, batches, rows, depth], kind),
                   _activation("b", [1, batches, depth, columns], kind),
                   _activation("y", [1, batches, rows, columns], kind)]
        return single_op("BATCH_MATMUL", tensors, [0, 1], [2], ("BatchMatMulOptions", {}))
    return build


def gather_rows(rows: int, width: int, count: int) -> Callable[[str], bytes]:
    def build(kind: str) -> bytes:
        indices = _int32("indices", _RNG.integers(0, rows, count))
        tensors = [_activation("x", [rows, width], kind), indices, _activation("y", [count, width], kind)]
        return single_op("GATHER", tensors, [0, 1], [2], ("GatherOptions", {"Axis": 0}))
    return build


#: name -> (builder, element kinds); sizes are those of MobileNet / MediaPipe layers
CASES: dict[str, tuple[Callable[[str], bytes], tuple[str, ...]]] = {
    "CONV_2D 3x3 112x112x32->32": (conv(112, 32, 32, 3, 1), ("float32", "int8")),
    "CONV_2D 1x1 56x56x64->128": (conv(56, 64, 128, 1, 1), ("float32", "int8")),
    "CONV_2D 3x3/2 224x224x3->32": (conv(224, 3, 32, 3, 2), ("float32", "int8")),
    "DEPTHWISE 3x3 112x112x32": (depthwise(112, 32, 1), ("float32", "int8")),
    "DEPTHWISE 3x3/2 112x112x64": (depthwise(112, 64, 2), ("float32", "int8")),
    "FULLY_CONNECTED 1024->1000": (fully_connected(1024, 1000), ("float32", "int8")),
    "TRANSPOSE_CONV 3x3/2 28x28x64->32": (transpose_conv(28, 64, 32), ("float32", "int8")),
    "AVERAGE_POOL 7x7 7x7x1024": (pool("AVERAGE_POOL_2D", 7, 1024, 7, 1), ("float32", "int8")),
    "MAX_POOL 2x2/2 112x112x32": (pool("MAX_POOL_2D", 112, 32, 2, 2), ("float32", "int8")),
    "ADD 56x56x64": (binary("ADD", [1, 56, 56, 64], "AddOptions"), ("float32", "int8")),
    "MUL 56x56x64": (binary("MUL", [1, 56, 56, 64], "MulOptions"), ("float32", "int8")),
    "CONCATENATION 2x 28x28x64": (concatenation([1, 28, 28, 64]), ("float32", "int8")),
    "RESIZE_BILINEAR 28x28x64->56x56": (with_constant("RESIZE_BILINEAR", [1, 28, 28, 64], _int32("size", [56, 56]),
                                                      [1, 56, 56, 64], ("ResizeBilinearOptions", {})),
                                        ("float32", "int8")),
    "PAD 56x56x64 +1": (with_constant("PAD", [1, 56, 56, 64], _int32("pad", [[0, 0], [1, 1], [1, 1], [0, 0]]),
                                      [1, 58, 58, 64]), ("float32", "int8")),
    "MEAN HxW 7x7x1280": (with_constant("MEAN", [1, 7, 7, 1280], _int32("axes", [1, 2]), [1, 1280],
                                        ("ReducerOptions", {"KeepDims": False})), ("float32", "int8")),
    "LOGISTIC 56x56x64": (unary("LOGISTIC", [1, 56, 56, 64], out_scale=1 / 256, out_zero=-128),
                          ("float32", "int8")),
    "TANH 56x56x64": (unary("TANH", [1, 56, 56, 64], out_scale=1 / 128, out_zero=0), ("float32", "int8")),
    "HARD_SWISH 56x56x64": (unary("HARD_SWISH", [1, 56, 56, 64]), ("float32", "int8")),
    "LEAKY_RELU 56x56x64": (unary("LEAKY_RELU", [1, 56, 56, 64], ("LeakyReluOptions", {"Alpha": 0.2})),
                            ("float32", "int8")),
    "PRELU 56x56x64": (prelu([1, 56, 56, 64]), ("float32", "int8")),
    "CONV_2D 3x3 dilation 4 33x33x64": (dilated_conv(33, 64, 4), ("float32", "int8")),
    "AVERAGE_POOL 3x3 SAME 28x28x192": (pool("AVERAGE_POOL_2D", 28, 192, 3, 1), ("float32", "int8")),
    "SUB 56x56x64": (binary("SUB", [1, 56, 56, 64], "SubOptions"), ("float32", "int8")),
    "DIV 56x56x64": (binary("DIV", [1, 56, 56, 64], "DivOptions"), ("float32",)),
    "MAXIMUM 56x56x64": (binary("MAXIMUM", [1, 56, 56, 64], "MaximumMinimumOptions"), ("float32", "int8")),
    "SQUARED_DIFFERENCE 56x56x64": (binary("SQUARED_DIFFERENCE", [1, 56, 56, 64], "SquaredDifferenceOptions"),
                                    ("float32",)),
    "DEPTH_TO_SPACE 28x28x256": (block_op("DEPTH_TO_SPACE", [1, 28, 28, 256], [1, 56, 56, 64]),
                                 ("float32", "int8")),
    "SPACE_TO_DEPTH 56x56x64": (block_op("SPACE_TO_DEPTH", [1, 56, 56, 64], [1, 28, 28, 256]),
                                ("float32", "int8")),
    "STRIDED_SLICE 56x56x128 half": (strided_slice([1, 56, 56, 128], [0, 0, 0, 0], [1, 56, 56, 64], [1, 1, 1, 1],
                                                   [1, 56, 56, 64]), ("float32", "int8")),
    "TRANSPOSE 56x56x64 NCHW": (with_constant("TRANSPOSE", [1, 56, 56, 64], _int32("perm", [0, 3, 1, 2]),
                                              [1, 64, 56, 56]), ("float32", "int8")),
    "EXP 56x56x64": (unary("EXP", [1, 56, 56, 64]), ("float32",)),
    "RSQRT 56x56x64": (unary("RSQRT", [1, 56, 56, 64]), ("float32",)),
    "L2_NORMALIZATION 56x56x64": (unary("L2_NORMALIZATION", [1, 56, 56, 64], ("L2NormOptions", {}),
                                        out_scale=1 / 128, out_zero=0), ("float32", "int8")),
    "SOFTMAX 1x1001": (unary("SOFTMAX", [1, 1001], ("SoftmaxOptions", {"Beta": 1.0}), out_scale=1 / 256,
                             out_zero=-128), ("float32", "int8")),
    "SOFTMAX 8x64x64 (attention)": (unary("SOFTMAX", [1, 8, 64, 64], ("SoftmaxOptions", {"Beta": 1.0}),
                                          out_scale=1 / 256, out_zero=-128), ("float32", "int8")),
    "QUANTIZE 224x224x3": (converting("QUANTIZE", [1, 224, 224, 3]), ("int8",)),
    "DEQUANTIZE 56x56x64": (converting("DEQUANTIZE", [1, 56, 56, 64]), ("int8",)),
    "MEAN C 56x56x64 keep": (reduce("MEAN", [1, 56, 56, 64], [3], True), ("float32", "int8")),
    "REDUCE_MAX HxW 7x7x1280": (reduce("REDUCE_MAX", [1, 7, 7, 1280], [1, 2], False), ("float32", "int8")),
    "SUM C 56x56x64 keep": (reduce("SUM", [1, 56, 56, 64], [3], True), ("float32",)),
    "ARGMAX 128x128x21": (arg_max([1, 128, 128, 21]), ("float32", "int8")),
    "BATCH_MATMUL 8x64x64 @ 64x64": (batch_matmul(8, 64, 64, 64), ("float32", "int8")),
    "GATHER 64 rows of 1000x256": (gather_rows(1000, 256, 64), ("float32", "int8")),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--only", action="append", help="a case name's start (e.g. CONV_2D); repeatable")
    parser.add_argument("--types", default="float32,int8", help="comma-separated element kinds")
    args = parser.parse_args()
    kinds = args.types.split(",")
    header = f"{'case':40} {'type':8} {'nnapi ms':>9} {'builtin':>9} {'xnnpack':>9} {'/builtin':>9} {'/xnnpack':>9}"
    print(header)
    print("-" * len(header))
    with tempfile.TemporaryDirectory() as folder:
        for name, (build, supported) in CASES.items():
            if args.only and not any(name.startswith(prefix) for prefix in args.only):
                continue
            for kind in (k for k in kinds if k in supported):
                path = Path(folder) / f"{name.split()[0].lower()}_{kind}.tflite"
                path.write_bytes(build(kind))
                try:
                    row = bench_models.bench_model(path, args.repeat, reference_kernels=False)
                except Exception as error:  # report and go on with the next case
                    print(f"{name:40} {kind:8} failed: {type(error).__name__}: {error}", flush=True)
                    continue
                builtin, xnnpack = row.get("builtin"), row.get("xnnpack")

                def cell(value):
                    return f"{value:>9.3f}" if value else f"{'-':>9}"

                print(f"{name:40} {kind:8} {cell(row['nnapi'])} {cell(builtin)} {cell(xnnpack)} "
                      f"{cell(builtin and row['nnapi'] / builtin)} {cell(xnnpack and row['nnapi'] / xnnpack)}",
                      flush=True)


if __name__ == "__main__":
    main()
