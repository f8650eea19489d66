"""Count the 8-bit values on which nnapi-reference (or another device) differs from LiteRT.

Each case is a one-operator .tflite model written by tests/tflite_builder.py (no
TensorFlow needed) with a random quantization: element-wise operators get all 256 stored
values, the others random tensors. The model runs on LiteRT's builtin kernels without
the XNNPACK delegate (BUILTIN_WITHOUT_DEFAULT_DELEGATES), on TFLite's reference kernels
(BUILTIN_REF), and imported by nnapi.load_tflite on the device; one line per operator and
type gives the configurations run and the values that differ between each pair.

    python tools/quant_vs_litert.py                          # every operator, 20 each
    python tools/quant_vs_litert.py PRELU MEAN --count 200   # some, more configurations
    python tools/quant_vs_litert.py RELU --device nnapi-ort-cpu -v

Needs ai-edge-litert and tflite (``pip install -e '.[test]'``).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
from ai_edge_litert.interpreter import Interpreter, OpResolverType

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
import nnapi  # noqa: E402
from tflite_builder import Operator, Subgraph, Tensor, build  # noqa: E402

KINDS = {"uint8": (0, 255), "int8": (-128, 127)}


def litert(data: bytes, feeds: list[np.ndarray], resolver: OpResolverType) -> np.ndarray:
    """The model's first output on LiteRT with ``resolver``'s kernels, single-threaded."""
    it = Interpreter(model_content=data, experimental_op_resolver_type=resolver, num_threads=1)
    it.allocate_tensors()
    for d, v in zip(it.get_input_details(), feeds):
        it.set_tensor(d["index"], v)
    it.invoke()
    return it.get_tensor(it.get_output_details()[0]["index"])


def ours(data: bytes, feeds: list[np.ndarray], device: str = "nnapi-reference") -> np.ndarray:
    """The model's first output imported by nnapi.load_tflite and run on ``device``."""
    s = nnapi.Session(data, devices=[device])
    names = [i.name for i in s.inputs]
    return next(iter(s.run(dict(zip(names, feeds))).values()))


def scale(rng: np.random.Generator, lo: float = -3, hi: float = 0) -> float:
    """A random float32 scale, log-uniform in [10**lo, 10**hi)."""
    return float(np.float32(10 ** rng.uniform(lo, hi)))


def zp(rng: np.random.Generator, kind: str) -> int:
    """A random zero point of the type."""
    lo, hi = KINDS[kind]
    return int(rng.integers(lo, hi + 1))


def all_values(kind: str) -> np.ndarray:
    """Every stored value of the type, ascending."""
    lo, hi = KINDS[kind]
    return np.arange(lo, hi + 1).astype(kind)


def rand_tensor(rng: np.random.Generator, kind: str, shape: list[int]) -> np.ndarray:
    """Uniformly random stored values."""
    lo, hi = KINDS[kind]
    return rng.integers(lo, hi + 1, size=shape).astype(kind)


#: a case: (rng, type) -> (model bytes, model inputs, a label for verbose output)
Case = Callable[[np.random.Generator, str], tuple[bytes, list[np.ndarray], str]]


def unary(name: str, out_fixed: dict | None = None, options=None, out_same: bool = False) -> Case:
    """An element-wise operator on all 256 stored values; the output's quantization fixed
    per type (``out_fixed``), the input's (``out_same``) or random."""

    def make(rng: np.random.Generator, kind: str) -> tuple[bytes, list[np.ndarray], str]:
        s_in, z_in = scale(rng, -3, -0.5), zp(rng, kind)
        if out_fixed:
            s_out, z_out = out_fixed[kind]
        elif out_same:
            s_out, z_out = s_in, z_in
        else:
            s_out, z_out = scale(rng, -3, -0.5), zp(rng, kind)
        t = [
            Tensor("x", kind, [256], scale=s_in, zero_point=z_in),
            Tensor("y", kind, [256], scale=s_out, zero_point=z_out),
        ]
        opts = options(rng) if callable(options) else options
        return (
            build(Subgraph(t, [Operator(name, [0], [1], opts)], [0], [1])),
            [all_values(kind)],
            f"{s_in:.4g}/{z_in}->{s_out:.4g}/{z_out} {opts}",
        )

    return make


def prelu(rng: np.random.Generator, kind: str) -> tuple[bytes, list[np.ndarray], str]:
    """PRELU of every stored value against each of 4 random constant alphas."""
    s_in, z_in = scale(rng, -3, -0.5), zp(rng, kind)
    s_a, z_a = scale(rng, -3, -1), zp(rng, kind)
    s_out, z_out = scale(rng, -3, -0.5), zp(rng, kind)
    alpha = rand_tensor(rng, kind, [4])
    x = all_values(kind)[rng.permutation(1024) % 256].reshape(1, 16, 16, 4)
    t = [
        Tensor("x", kind, [1, 16, 16, 4], scale=s_in, zero_point=z_in),
        Tensor("a", kind, [4], data=alpha, scale=s_a, zero_point=z_a),
        Tensor("y", kind, [1, 16, 16, 4], scale=s_out, zero_point=z_out),
    ]
    return (
        build(Subgraph(t, [Operator("PRELU", [0, 1], [2])], [0], [2])),
        [x],
        f"{s_in:.4g}/{z_in} a{s_a:.4g}/{z_a} ->{s_out:.4g}/{z_out}",
    )


def softmax(rng: np.random.Generator, kind: str) -> tuple[bytes, list[np.ndarray], str]:
    """SOFTMAX of 16 random rows, a random beta and row length."""
    s_in, z_in = scale(rng, -2, 0), zp(rng, kind)
    n = int(rng.choice([2, 5, 10, 33, 100, 1000]))
    beta = float(rng.choice([1.0, 0.5, 2.0, 0.1, 1.7]))
    out = (1 / 256, 0) if kind == "uint8" else (1 / 256, -128)
    t = [
        Tensor("x", kind, [16, n], scale=s_in, zero_point=z_in),
        Tensor("y", kind, [16, n], scale=out[0], zero_point=out[1]),
    ]
    return (
        build(Subgraph(t, [Operator("SOFTMAX", [0], [1], ("SoftmaxOptions", {"Beta": beta}))], [0], [1])),
        [rand_tensor(rng, kind, [16, n])],
        f"{s_in:.4g}/{z_in} n={n} beta={beta}",
    )


def l2norm(rng: np.random.Generator, kind: str) -> tuple[bytes, list[np.ndarray], str]:
    """L2_NORMALIZATION of 64 random rows of a random length."""
    s_in, z_in = scale(rng, -3, 0), zp(rng, kind)
    n = int(rng.choice([1, 2, 3, 8, 64, 300]))
    out = (1 / 128, 128) if kind == "uint8" else (1 / 128, 0)
    t = [
        Tensor("x", kind, [64, n], scale=s_in, zero_point=z_in),
        Tensor("y", kind, [64, n], scale=out[0], zero_point=out[1]),
    ]
    return (
        build(Subgraph(t, [Operator("L2_NORMALIZATION", [0], [1])], [0], [1])),
        [rand_tensor(rng, kind, [64, n])],
        f"{s_in:.4g}/{z_in} n={n}",
    )


def resize(rng: np.random.Generator, kind: str) -> tuple[bytes, list[np.ndarray], str]:
    """RESIZE_BILINEAR up or down, random align_corners / half_pixel_centers."""
    s_in, z_in = scale(rng), zp(rng, kind)
    h, w = int(rng.integers(2, 9)), int(rng.integers(2, 9))
    oh, ow = int(rng.integers(1, 17)), int(rng.integers(1, 17))
    ac = bool(rng.integers(0, 2))
    hp = (not ac) and bool(rng.integers(0, 2))
    size = np.array([oh, ow], np.int32)
    t = [
        Tensor("x", kind, [1, h, w, 3], scale=s_in, zero_point=z_in),
        Tensor("size", "int32", [2], data=size),
        Tensor("y", kind, [1, oh, ow, 3], scale=s_in, zero_point=z_in),
    ]
    op = Operator(
        "RESIZE_BILINEAR", [0, 1], [2], ("ResizeBilinearOptions", {"AlignCorners": ac, "HalfPixelCenters": hp})
    )
    return (
        build(Subgraph(t, [op], [0], [2])),
        [rand_tensor(rng, kind, [1, h, w, 3])],
        f"{h}x{w}->{oh}x{ow} ac={ac} hp={hp}",
    )


def pool(name: str) -> Case:
    """AVERAGE_POOL_2D / MAX_POOL_2D, random window, stride, padding and fused activation."""

    def make(rng: np.random.Generator, kind: str) -> tuple[bytes, list[np.ndarray], str]:
        s_in, z_in = scale(rng), zp(rng, kind)
        k, st = int(rng.integers(1, 4)), int(rng.integers(1, 3))
        pad = int(rng.integers(0, 2))
        act = int(rng.choice([0, 1, 3]))
        h = 9
        oh = (h - k) // st + 1 if pad == 1 else -(-h // st)
        t = [
            Tensor("x", kind, [1, h, h, 4], scale=s_in, zero_point=z_in),
            Tensor("y", kind, [1, oh, oh, 4], scale=s_in, zero_point=z_in),
        ]
        opts = (
            "Pool2DOptions",
            {
                "Padding": pad,
                "StrideW": st,
                "StrideH": st,
                "FilterWidth": k,
                "FilterHeight": k,
                "FusedActivationFunction": act,
            },
        )
        return (
            build(Subgraph(t, [Operator(name, [0], [1], opts)], [0], [1])),
            [rand_tensor(rng, kind, [1, h, h, 4])],
            f"k{k} s{st} pad{pad} act{act}",
        )

    return make


def conv(name: str) -> Case:
    """CONV_2D / DEPTHWISE_CONV_2D / FULLY_CONNECTED with random weights and bias (int8:
    per-channel weights half the time) and a random fused activation."""

    def make(rng: np.random.Generator, kind: str) -> tuple[bytes, list[np.ndarray], str]:
        s_in, z_in = scale(rng, -2, 0), zp(rng, kind)
        s_out, z_out = scale(rng, -2, 0.5), zp(rng, kind)
        cin, cout, k = 4, 6, 3
        per_channel = kind == "int8" and bool(rng.integers(0, 2))
        if name == "DEPTHWISE_CONV_2D":
            wshape, qdim = [1, k, k, cin * 2], 3
            cout = cin * 2
        elif name == "CONV_2D":
            wshape, qdim = [cout, k, k, cin], 0
        else:
            wshape, qdim = [cout, 9 * cin], 0
        if per_channel:
            ws = [float(np.float32(10 ** rng.uniform(-3, -1))) for _ in range(cout)]
            wz = [0] * cout
            wdata = rng.integers(-127, 128, size=wshape).astype(np.int8)
            bscale = [float(np.float32(s_in) * np.float32(w)) for w in ws]
        else:
            ws, wz = float(np.float32(10 ** rng.uniform(-3, -1))), (0 if kind == "int8" else zp(rng, kind))
            wdata = rand_tensor(rng, kind, wshape)
            bscale = float(np.float32(s_in) * np.float32(ws))
        bias = rng.integers(-3000, 3000, size=[cout]).astype(np.int32)
        act = int(rng.choice([0, 1, 3]))
        if name == "FULLY_CONNECTED":
            xshape, yshape = [5, 9 * cin], [5, cout]
            opts = ("FullyConnectedOptions", {"FusedActivationFunction": act})
        else:
            xshape, yshape = [1, 7, 7, cin], [1, 5, 5, cout]
            if name == "CONV_2D":
                opts = ("Conv2DOptions", {"Padding": 1, "StrideW": 1, "StrideH": 1, "FusedActivationFunction": act})
            else:
                opts = (
                    "DepthwiseConv2DOptions",
                    {"Padding": 1, "StrideW": 1, "StrideH": 1, "DepthMultiplier": 2, "FusedActivationFunction": act},
                )
        t = [
            Tensor("x", kind, xshape, scale=s_in, zero_point=z_in),
            Tensor(
                "w",
                "int8" if per_channel else kind,
                wshape,
                data=wdata,
                scale=ws,
                zero_point=wz,
                quantized_dimension=qdim,
            ),
            Tensor(
                "b",
                "int32",
                [cout],
                data=bias,
                scale=bscale,
                zero_point=[0] * cout if per_channel else 0,
                quantized_dimension=0,
            ),
            Tensor("y", kind, yshape, scale=s_out, zero_point=z_out),
        ]
        return (
            build(Subgraph(t, [Operator(name, [0, 1, 2], [3], opts)], [0], [3])),
            [rand_tensor(rng, kind, xshape)],
            f"{name} pc={per_channel} act={act}",
        )

    return make


def mean(rng: np.random.Generator, kind: str) -> tuple[bytes, list[np.ndarray], str]:
    """MEAN over some axes into another quantization (the importer's FULLY_CONNECTED form)."""
    si, zi, so, zo = scale(rng, -2, 0), zp(rng, kind), scale(rng, -2, 0), zp(rng, kind)
    shape, axes = [
        ([1, 7, 5, 8], [1, 2]),
        ([4, 33], [1]),
        ([2, 6, 6, 3], [1, 2]),
        ([3, 4, 5], [0, 2]),
        ([1, 9, 9, 16], [1, 2]),
    ][int(rng.integers(0, 5))]
    out_shape = [d for i, d in enumerate(shape) if i not in axes]
    t = [
        Tensor("x", kind, shape, scale=si, zero_point=zi),
        Tensor("axes", "int32", [len(axes)], data=np.array(axes, np.int32)),
        Tensor("y", kind, out_shape, scale=so, zero_point=zo),
    ]
    return (
        build(Subgraph(t, [Operator("MEAN", [0, 1], [2], ("ReducerOptions", {"KeepDims": False}))], [0], [2])),
        [rand_tensor(rng, kind, shape)],
        f"{shape} {axes}",
    )


CASES = {
    "CONV_2D": conv("CONV_2D"),
    "DEPTHWISE_CONV_2D": conv("DEPTHWISE_CONV_2D"),
    "FULLY_CONNECTED": conv("FULLY_CONNECTED"),
    "MEAN": mean,
    "LOGISTIC": unary("LOGISTIC", {"uint8": (1 / 256, 0), "int8": (1 / 256, -128)}),
    "TANH": unary("TANH", {"uint8": (1 / 128, 128), "int8": (1 / 128, 0)}),
    "HARD_SWISH": unary("HARD_SWISH"),
    "RELU": unary("RELU"),
    "RELU6": unary("RELU6"),
    "RELU_N1_TO_1": unary("RELU_N1_TO_1"),
    "LEAKY_RELU": unary(
        "LEAKY_RELU",
        options=lambda rng: ("LeakyReluOptions", {"Alpha": float(np.float32(rng.choice([0.1, 0.2, 0.01, 0.3, 0.05])))}),
    ),
    "PRELU": prelu,
    "SOFTMAX": softmax,
    "L2_NORMALIZATION": l2norm,
    "RESIZE_BILINEAR": resize,
    "AVERAGE_POOL_2D": pool("AVERAGE_POOL_2D"),
    "MAX_POOL_2D": pool("MAX_POOL_2D"),
}


def measure(name: str, count: int, seed: int, verbose: bool, device: str) -> None:
    """Print, per 8-bit type, how many values of ``count`` random configurations of
    operator ``name`` differ: the device against LiteRT's builtin kernels and against
    TFLite's reference kernels, and those two against each other."""
    rng = np.random.default_rng(seed)
    for kind in ("uint8", "int8"):
        configs = values = attempts = 0
        differing = {"builtin": [0, 0], "reference": [0, 0], "between": [0, 0]}
        while configs < count and attempts < 10 * count:
            attempts += 1
            data, feeds, label = CASES[name](rng, kind)
            try:
                builtin = litert(data, feeds, OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES)
                reference = litert(data, feeds, OpResolverType.BUILTIN_REF)
            except (RuntimeError, ValueError) as error:  # LiteRT refuses the quantization
                if verbose:
                    print(f"  LiteRT refused {label}: {str(error)[:80]}")
                continue
            try:
                got = ours(data, feeds, device)
            except nnapi.NnapiError as error:
                print(f"  nnapi refused {label}: {str(error)[:120]}")
                continue
            configs += 1
            values += builtin.size
            for key, (first, second) in {
                "builtin": (got, builtin),
                "reference": (got, reference),
                "between": (builtin, reference),
            }.items():
                count_here = int(np.count_nonzero(first != second))
                differing[key][0] += count_here
                differing[key][1] += count_here > 0
            if verbose and np.any(got != builtin):
                print(f"  {label}: {int(np.count_nonzero(got != builtin))} differ from the builtin kernel")
        print(
            f"{name:18s} {kind:5s} configurations {configs:3d} values {values:7d}  "
            f"device != builtin {differing['builtin'][0]:6d} ({differing['builtin'][1]} configurations)  "
            f"device != BUILTIN_REF {differing['reference'][0]:6d} ({differing['reference'][1]})  "
            f"builtin != BUILTIN_REF {differing['between'][0]:6d}",
            flush=True,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("ops", nargs="*", help=f"operators (default: all of {', '.join(CASES)})")
    parser.add_argument("--count", type=int, default=20, help="random configurations per operator and type")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="nnapi-reference")
    parser.add_argument("-v", "--verbose", action="store_true", help="print each differing configuration")
    args = parser.parse_args()
    for name in args.ops or CASES:
        if name not in CASES:
            parser.error(f"no case for {name}")
        measure(name, args.count, args.seed, args.verbose, args.device)


if __name__ == "__main__":
    main()
