"""Differential fuzzer of the TFLite importer: random small .tflite models run on LiteRT
and imported by nnapi.load_tflite, compared output by output.

Each case is a random model written by tests/tflite_builder.py (no TensorFlow needed):
one builtin operator the importer converts, or a chain of two or three, with random
types (float32, int8, uint8, int16, int32, bool; float16 constants through DEQUANTIZE;
hybrid float models with int8 weights), shapes (rank 0-5, size-1 dimensions, broadcasting
pairs), builtin options (strides, padding, dilation, negative axes, keep_dims, fused
activations, resize modes, batch dims, strided-slice masks, ...), quantization (per
tensor, per channel) and, for every input that is not the operator's parameter, a
run-time input or a constant (parameters are constants mostly, run-time inputs
sometimes). A case LiteRT itself refuses (allocate_tensors / invoke raises) is skipped
and counted. A valid case runs on LiteRT's builtin kernels single-threaded (no XNNPACK
delegate) and through ``nnapi.Session`` on each ``--device``; per device it is one of:

    agree     float outputs within ``nnapi compare``'s tolerance (1e-5 of the largest
              magnitude; 5e-2 for a hybrid model), quantized ones within 2 steps,
              integer and bool outputs equal
    DIFFER    anything else (the value, the shape, the dtype)
    refused   a clean NnapiError (the reason is counted)
    RAW       an exception that is not an NnapiError, or an NnapiError whose message is a
              Python exception's text (an importer error masked as "not a valid model")
    CRASH     the worker process died (or hung) in the case

``--vs-reference`` also holds every other device to nnapi-reference's own values (integers
and quantized values exactly, floats within the tolerance): a lowering one step off the
reference hides inside the two steps LiteRT is allowed. A device that declines where the
reference runs is then counted as "declined", with its reason.

For a DIFFER the verbose output also says whether TFLite's reference kernels
(OpResolverType.BUILTIN_REF) agree with the device, which tells LiteRT's own deviations.
Cases are seeded by (seed, case number), so ``--case N`` reproduces one.

    python tools/import_vs_litert.py --count 500                      # all operators
    python tools/import_vs_litert.py GATHER_ND GATHER --count 200 -v  # some, print failures
    python tools/import_vs_litert.py --seed 3 --case 17 -v --save /tmp/fails
    python tools/import_vs_litert.py --single --steps 0 --count 5000 -v   # one-step biases too

Cases whose LiteRT values hold a NaN are skipped (how NaN passes MAXIMUM, RELU, CAST or a
quantizing table differs between kernels), as are cases with no run-time input (NNAPI needs
one). tests/test_import_vs_litert.py runs a short version.

One line per operator and input type at the end (a chain counts for each operator in it).
Needs ai-edge-litert and tflite (``pip install -e '.[test]'``).
"""

from __future__ import annotations

import argparse
import collections
import multiprocessing
import queue
import re
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from tflite_builder import Operator, Subgraph, Tensor, build  # noqa: E402

DEVICES = ("nnapi-reference", "nnapi-ort-cpu")
REFERENCE = "nnapi-reference"
#: nnapi compare's defaults (src/nnapi/cli/compare.py)
RTOL, HYBRID_RTOL, STEPS = 1e-5, 5e-2, 2
#: an NnapiError message that is really a Python exception's text (as tools/fuzz_api.py)
_INTERNAL = re.compile(r"\b(AttributeError|TypeError|ValueError|KeyError|IndexError|ZeroDivisionError|"
                       r"OverflowError|FloatingPointError|MemoryError|RuntimeError|AssertionError|"
                       r"UnboundLocalError|NameError|StopIteration)\b|object has no attribute|'NoneType'")
QUANT = ("int8", "uint8", "int16")
ALL = ("float32", "int8", "uint8", "int16", "int32", "bool")
NUM = ("float32", "int8", "uint8", "int16", "int32")
FQ = ("float32", "int8", "uint8", "int16")
CASE_TIMEOUT_S = 60
#: operators whose first input is mostly drawn positive
POSITIVE = {"LOG", "SQRT", "RSQRT", "POW"}
#: whether cases chain two or three operators (--single: no)
CHAINS = True
#: --vs-reference: every other device held to nnapi-reference's values too
VS_REFERENCE = False


class Skip(Exception):
    """The generator cannot make this operator from the value it was given."""


class NaNValues(Exception):
    """LiteRT computes a NaN inside the model: how NaN passes MAXIMUM, RELU, CAST, a
    quantizing table... differs between kernels, C++ leaves some of it undefined."""


@dataclass
class Val:
    """A tensor of the model being built: its index, type, shape and quantization."""

    index: int
    kind: str
    shape: list[int]
    quant: tuple | None = None


@dataclass
class Graph:
    """A model under construction."""

    rng: np.random.Generator
    tensors: list[Tensor] = field(default_factory=list)
    ops: list[Operator] = field(default_factory=list)
    inputs: list[int] = field(default_factory=list)
    feeds: list[np.ndarray] = field(default_factory=list)
    labels: list[str] = field(default_factory=list)
    names: list[str] = field(default_factory=list)
    hybrid: bool = False

    # --- random choices
    def pick(self, seq):
        return seq[int(self.rng.integers(0, len(seq)))]

    def chance(self, p: float) -> bool:
        return bool(self.rng.random() < p)

    def quant(self, kind: str, near: tuple | None = None) -> tuple | None:
        """A random quantization of ``kind`` (None for float / int32 / bool); ``near``: a
        scale within a few times another one's."""
        if kind not in QUANT:
            return None
        if near is not None:
            s = float(np.float32(near[0] * 10 ** self.rng.uniform(-0.5, 0.7)))
        else:
            s = float(np.float32(10 ** self.rng.uniform(-3, 0)))
        if kind == "int16":
            return (s, 0)
        lo, hi = (-128, 127) if kind == "int8" else (0, 255)
        return (s, int(self.rng.integers(lo, hi + 1)))

    def data(self, kind: str, shape: list[int], domain: str = "") -> np.ndarray:
        """Random values of ``kind``; ``domain``: "pos" positive, "nz" nonzero."""
        rng = self.rng
        if kind in ("float32", "float16"):
            v = rng.uniform(-4, 4, size=shape)
            if domain == "pos":
                v = np.abs(v) + 0.05
            elif domain == "nz":
                v = np.where(np.abs(v) < 0.2, 0.5, v)
            return v.astype(kind)
        if kind == "bool":
            return rng.integers(0, 2, size=shape).astype(bool)
        lo, hi = {"int8": (-128, 127), "uint8": (0, 255), "int16": (-32768, 32767), "int32": (-9, 9),
                  "int64": (-9, 9)}[kind]
        v = rng.integers(lo, hi + 1, size=shape)
        if domain == "pos":
            v = np.abs(v) + 1 if kind in ("int32", "int64") else v
        elif domain == "nz" and kind in ("int32", "int64"):
            v = np.where(v == 0, 3, v)
        return v.astype(kind)

    # --- tensors
    def tensor(self, kind: str, shape: list[int], quant: tuple | None = None, data: np.ndarray | None = None,
               name: str = "t", per_channel: tuple | None = None) -> int:
        if per_channel is not None:
            scales, zps, dim = per_channel
            t = Tensor(f"{name}{len(self.tensors)}", kind, list(shape), data=data, scale=list(scales),
                       zero_point=list(zps), quantized_dimension=dim)
        else:
            t = Tensor(f"{name}{len(self.tensors)}", kind, list(shape), data=data,
                       scale=None if quant is None else quant[0], zero_point=None if quant is None else quant[1])
        self.tensors.append(t)
        return len(self.tensors) - 1

    def value(self, kind: str, shape: list[int], quant: tuple | None = None, const_p: float = 0.5,
              values: np.ndarray | None = None, domain: str = "") -> Val:
        """A run-time input or (with probability ``const_p``) a constant."""
        v = self.data(kind, shape, domain) if values is None else np.asarray(values).astype(kind).reshape(shape)
        if self.chance(const_p):
            return Val(self.tensor(kind, shape, quant, v, "c"), kind, list(shape), quant)
        index = self.tensor(kind, shape, quant, None, "in")
        self.inputs.append(index)
        self.feeds.append(v)
        return Val(index, kind, list(shape), quant)

    def param(self, values, kind: str = "int32", shape: list[int] | None = None) -> Val:
        """An operator's parameter (axes, sizes, paddings): a constant mostly, a run-time input sometimes."""
        arr = np.asarray(values).astype(kind)
        return self.value(kind, list(arr.shape) if shape is None else shape, None, 0.85, arr)

    def const(self, kind: str, values: np.ndarray, quant: tuple | None = None, per_channel=None) -> Val:
        arr = np.asarray(values).astype(kind)
        return Val(self.tensor(kind, list(arr.shape), quant, arr, "c", per_channel), kind, list(arr.shape), quant)

    def out(self, kind: str, quant: tuple | None = None) -> Val:
        """An output whose shape LiteRT tells (set_shapes)."""
        return Val(self.tensor(kind, [1], quant, None, "out"), kind, [1], quant)

    def op(self, name: str, inputs: list, outputs: list[Val], options: tuple | None = None, label: str = "") -> None:
        self.ops.append(Operator(name, [i if isinstance(i, int) else i.index for i in inputs],
                                 [o.index for o in outputs], options))
        self.labels.append(f"{name}({label})" if label else name)
        self.names.append(name)

    def model(self, outputs: list[int]) -> bytes:
        return build(Subgraph(self.tensors, self.ops, self.inputs, outputs))


# --- LiteRT ------------------------------------------------------------------------------------
def litert(data: bytes, feeds: list[np.ndarray], reference: bool = False) -> list[np.ndarray]:
    """The model's outputs on LiteRT's builtin (or reference) kernels, single-threaded."""
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    resolver = OpResolverType.BUILTIN_REF if reference else OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES
    it = Interpreter(model_content=data, experimental_op_resolver_type=resolver, num_threads=1)
    it.allocate_tensors()
    for d, v in zip(it.get_input_details(), feeds):
        it.set_tensor(d["index"], v)
    it.invoke()
    return [np.array(it.get_tensor(d["index"])) for d in it.get_output_details()]


def set_shapes(g: Graph, outs: list[Val]) -> None:
    """Give ``outs`` the shapes LiteRT computes for them (raises what LiteRT raises)."""
    results = litert(g.model([o.index for o in outs]), g.feeds)
    for o, r in zip(outs, results):
        if r.dtype.kind == "f" and np.isnan(r).any():
            raise NaNValues
        if r.dtype.name != o.kind and not (o.kind == "int64" and r.dtype == np.int64):
            raise RuntimeError(f"LiteRT gives {r.dtype} for a {o.kind} output")
        o.shape = list(r.shape)
        g.tensors[o.index].shape = list(r.shape)


# --- shapes ------------------------------------------------------------------------------------
def rand_shape(g: Graph, ranks=(0, 1, 2, 3, 4, 5), big: int = 5) -> list[int]:
    rank = g.pick(ranks)
    while True:
        shape = [int(g.rng.integers(1, big + 1)) if g.chance(0.75) else 1 for _ in range(rank)]
        if int(np.prod(shape)) <= 1500:
            return shape


def broadcast_partner(g: Graph, shape: list[int]) -> list[int]:
    """A shape that broadcasts with ``shape``: equal, size-1 dimensions, fewer or more dimensions."""
    r = g.rng.random()
    if r < 0.35:
        return list(shape)
    if r < 0.5:
        return [] if g.chance(0.5) else [1]
    other = [1 if g.chance(0.4) else d for d in shape]
    if g.chance(0.3) and other:
        other = other[int(g.rng.integers(0, len(other) + 1)):]
    elif g.chance(0.2) and len(other) < 5:
        other = [int(g.rng.integers(1, 4))] + other
    # a dimension of 1 on ours that the partner makes larger
    if other and g.chance(0.2):
        ones = [i for i, d in enumerate(shape[len(shape) - len(other):]) if d == 1] if len(other) <= len(shape) else []
        if ones:
            other[ones[0] + len(other) - len(shape) if len(other) > len(shape) else ones[0]] = 3
    return other


def axis_of(g: Graph, rank: int) -> int:
    a = int(g.rng.integers(0, rank))
    return a - rank if g.chance(0.35) else a


FUSED = {"none": 0, "relu": 1, "relu_n1_to_1": 2, "relu6": 3}


def act(g: Graph, kind: str) -> int:
    return int(g.pick([0, 0, 1, 2, 3])) if kind in ("float32",) + QUANT else 0


# --- operators ---------------------------------------------------------------------------------
#: name -> (generator, input kinds, input ranks)
OPS: dict[str, tuple[Callable[[Graph, Val], list[Val]], tuple, tuple]] = {}


def register(name: str, kinds=FQ, ranks=(0, 1, 2, 3, 4, 5)):
    def wrap(fn):
        OPS[name] = (fn, kinds, ranks)
        return fn
    return wrap


FIXED_OUT = {
    "LOGISTIC": {"int8": (1 / 256, -128), "uint8": (1 / 256, 0), "int16": (1 / 32768, 0)},
    "TANH": {"int8": (1 / 128, 0), "uint8": (1 / 128, 128), "int16": (1 / 32768, 0)},
    "SOFTMAX": {"int8": (1 / 256, -128), "uint8": (1 / 256, 0), "int16": (1 / 32768, 0)},
    "LOG_SOFTMAX": {"int8": (16 / 256, 127), "uint8": (16 / 256, 255)},
    "L2_NORMALIZATION": {"int8": (1 / 128, 0), "uint8": (1 / 128, 128)},
}


def _unary(name: str, kinds, options=None, out_rule: str = "free", ranks=(0, 1, 2, 3, 4, 5)):
    def gen(g: Graph, x: Val) -> list[Val]:
        if name in POSITIVE and x.quant is not None and x.quant[1] != {"int8": -128, "uint8": 0, "int16": 0}[x.kind]:
            raise Skip  # stored values below the zero point are outside the domain (a NaN inside the table)
        if out_rule == "same":
            q = x.quant
        elif name in FIXED_OUT and x.kind in QUANT:
            q = FIXED_OUT[name].get(x.kind)
            if q is None:
                raise Skip
        else:
            q = g.quant(x.kind, x.quant)
        y = g.out(x.kind, q)
        opts = options(g) if callable(options) else options
        g.op(name, [x], [y], opts, str(opts[1]) if opts and opts[1] else "")
        return [y]

    register(name, kinds, ranks)(gen)


for _name, _kinds in {"ABS": ("float32", "int8", "int16", "int32"), "NEG": ("float32", "int32", "int8"),
                      "SQUARE": ("float32", "int32"), "EXP": ("float32", "int8", "int16"),
                      "LOG": ("float32", "int8", "int16"), "SQRT": ("float32", "int8", "int16"),
                      "RSQRT": ("float32", "int8", "int16"), "SIN": ("float32",), "CEIL": ("float32",),
                      "FLOOR": ("float32",), "ELU": ("float32", "int8"), "HARD_SWISH": ("float32", "int8", "uint8"),
                      "LOGISTIC": FQ, "TANH": FQ, "RELU": FQ, "RELU6": FQ, "RELU_N1_TO_1": FQ,
                      "RELU_0_TO_1": FQ}.items():
    _unary(_name, _kinds)
_unary("GELU", ("float32", "int8", "uint8"), lambda g: ("GeluOptions", {"Approximate": g.chance(0.5)}))
_unary("LEAKY_RELU", FQ, lambda g: ("LeakyReluOptions", {"Alpha": float(np.float32(g.pick([0.1, 0.2, 0.01, 0.3,
                                                                                           1.5, -0.5])))}))
_unary("LOGICAL_NOT", ("bool",))
_unary("SOFTMAX", FQ, lambda g: ("SoftmaxOptions", {"Beta": float(g.pick([1.0, 0.5, 2.0, 0.1]))}),
       ranks=(1, 2, 3, 4))
_unary("LOG_SOFTMAX", ("float32", "int8", "uint8"), ranks=(1, 2, 3, 4))
_unary("L2_NORMALIZATION", ("float32", "int8", "uint8"), ranks=(1, 2, 3, 4))
_unary("LOCAL_RESPONSE_NORMALIZATION", ("float32",), lambda g: (
    "LocalResponseNormalizationOptions", {"Radius": int(g.pick([0, 1, 2, 5])), "Bias": float(g.pick([1.0, 0.5, 2.0])),
                                          "Alpha": float(g.pick([1.0, 0.1, 1e-4])),
                                          "Beta": float(g.pick([0.5, 0.75, 1.0]))}), ranks=(4,))


@register("CAST", ("float32", "int32", "bool", "int16"))
def cast(g: Graph, x: Val) -> list[Val]:
    if x.quant is not None:
        raise Skip
    to = g.pick([k for k in ("float32", "int32", "bool") if k != x.kind])
    y = g.out(to)
    g.op("CAST", [x], [y], None, f"->{to}")
    return [y]


@register("DEQUANTIZE", ("int8", "uint8", "int16", "float32"))
def dequantize(g: Graph, x: Val) -> list[Val]:
    if x.kind == "float32":
        # a float16 constant, the converter's float16 weights
        x = g.const("float16", g.data("float16", x.shape))
    y = g.out("float32")
    g.op("DEQUANTIZE", [x], [y], None, x.kind)
    return [y]


@register("QUANTIZE", ("float32", "int8", "uint8", "int16"))
def quantize(g: Graph, x: Val) -> list[Val]:
    to = g.pick(QUANT if x.kind == "float32" else ("int8", "uint8") if x.kind != "int16" else ("int16", "int8"))
    q = g.quant(to, x.quant)
    if x.kind == "float32":
        q = g.quant(to) if g.chance(0.3) else (float(np.float32(8 / (255 if to != "int16" else 32767))),
                                                q[1] if to != "int16" else 0)
    y = g.out(to, q)
    g.op("QUANTIZE", [x], [y], None, f"->{to}")
    return [y]


def _binary(name: str, kinds, options: str | None = None, out: str = "free", domain: str = "",
            same_quant: bool = False):
    def gen(g: Graph, x: Val) -> list[Val]:
        if out == "bool" and x.quant is not None and x.quant[0] >= 1:
            raise Skip  # TFLite's 8-bit comparisons need scales below 1 (QuantizeMultiplierSmallerThanOneExp)
        shape = broadcast_partner(g, x.shape)
        yq = x.quant if same_quant else g.quant(x.kind, x.quant)
        if out == "bool" and yq is not None and yq[0] >= 1:
            yq = (float(np.float32(yq[0] / 4)) if yq[0] / 4 < 1 else 0.5, yq[1])
        other = g.value(x.kind, shape, yq, domain=domain)
        a, b = (x, other) if g.chance(0.7) else (other, x)
        if out == "bool":
            o = g.out("bool")
        else:
            o = g.out(x.kind, x.quant if same_quant else g.quant(x.kind, x.quant))
        opts = None
        if options:
            fused = options in ("AddOptions", "SubOptions", "MulOptions", "DivOptions")
            fields = {"FusedActivationFunction": act(g, x.kind)} if fused else {}
            if options in ("AddOptions", "SubOptions") and x.kind == "int16":
                fields["PotScaleInt16"] = False
            opts = (options, fields)
        g.op(name, [a, b], [o], opts, f"{a.shape}x{b.shape}" + (f" act{opts[1].get('FusedActivationFunction')}"
                                                                 if opts and opts[1] else ""))
        return [o]

    register(name, kinds)(gen)


_binary("ADD", NUM, "AddOptions")
_binary("SUB", NUM, "SubOptions")
_binary("MUL", NUM, "MulOptions")
_binary("DIV", ("float32", "int32", "uint8"), "DivOptions", domain="nz")
_binary("MAXIMUM", NUM, same_quant=True)
_binary("MINIMUM", NUM, same_quant=True)
_binary("POW", ("float32", "int32"), domain="pos")
_binary("SQUARED_DIFFERENCE", ("float32", "int8", "int32"))
_binary("FLOOR_DIV", ("float32", "int32"), domain="nz")
_binary("FLOOR_MOD", ("float32", "int32"), domain="nz")
for _name in ("EQUAL", "NOT_EQUAL", "LESS", "LESS_EQUAL", "GREATER", "GREATER_EQUAL"):
    _binary(_name, NUM, out="bool")
_binary("LOGICAL_AND", ("bool",), out="bool")
_binary("LOGICAL_OR", ("bool",), out="bool")


@register("PRELU", ("float32", "int8", "uint8"))
def prelu(g: Graph, x: Val) -> list[Val]:
    shape = broadcast_partner(g, x.shape)
    if len(shape) > len(x.shape):
        shape = shape[len(shape) - len(x.shape):]
    alpha = g.value(x.kind, shape, g.quant(x.kind), const_p=0.8)
    y = g.out(x.kind, g.quant(x.kind, x.quant))
    g.op("PRELU", [x, alpha], [y], None, f"alpha{shape}")
    return [y]


@register("ADD_N", ("float32", "int32"))
def add_n(g: Graph, x: Val) -> list[Val]:
    others = [g.value(x.kind, x.shape) for _ in range(int(g.rng.integers(1, 3)))]
    y = g.out(x.kind)
    g.op("ADD_N", [x, *others], [y], None, str(len(others) + 1))
    return [y]


@register("SELECT_V2", ALL)
@register("SELECT", ALL)
def select(g: Graph, x: Val) -> list[Val]:
    v2 = g.ops is not None and g.chance(0.5)
    name = "SELECT_V2" if v2 else "SELECT"
    if v2:
        cshape = broadcast_partner(g, x.shape)
        oshape = broadcast_partner(g, x.shape)
    else:
        cshape = list(x.shape) if g.chance(0.7) or not x.shape else [x.shape[0]]
        oshape = list(x.shape)
    cond = g.value("bool", cshape)
    other = g.value(x.kind, oshape, x.quant)
    a, b = (x, other) if g.chance(0.5) else (other, x)
    y = g.out(x.kind, x.quant)
    g.op(name, [cond, a, b], [y], None, f"c{cshape} {a.shape} {b.shape}")
    return [y]


def _reduce(name: str, kinds, out: str = "free"):
    def gen(g: Graph, x: Val) -> list[Val]:
        rank = len(x.shape)
        if rank == 0:
            axes = [0] if g.chance(0.3) else []
        else:
            n = int(g.rng.integers(1, rank + 1))
            axes = [int(a) for a in g.rng.choice(rank, size=n, replace=False)]
            axes = [a - rank if g.chance(0.3) else a for a in axes]
        keep = g.chance(0.5)
        ax = g.param(np.array(axes, np.int32), shape=[len(axes)] if len(axes) != 1 or g.chance(0.5) else [])
        q = x.quant if out == "same" else g.quant(x.kind, x.quant)
        y = g.out(x.kind, q)
        g.op(name, [x, ax], [y], ("ReducerOptions", {"KeepDims": keep}), f"axes{axes} keep{int(keep)}")
        return [y]

    register(name, kinds, (0, 1, 2, 3, 4, 5))(gen)


_reduce("MEAN", NUM)
_reduce("SUM", NUM)
_reduce("REDUCE_PROD", ("float32", "int32", "int8"))
_reduce("REDUCE_MAX", NUM, "same")
_reduce("REDUCE_MIN", NUM, "same")
_reduce("REDUCE_ANY", ("bool",))
_reduce("REDUCE_ALL", ("bool",))


@register("ARG_MAX", ("float32", "int8", "uint8", "int32"), (1, 2, 3, 4, 5))
@register("ARG_MIN", ("float32", "int8", "uint8", "int32"), (1, 2, 3, 4, 5))
def arg(g: Graph, x: Val) -> list[Val]:
    name = "ARG_MAX" if g.chance(0.5) else "ARG_MIN"
    axis = axis_of(g, len(x.shape))
    out = g.pick(["int32", "int32", "int64"])
    ax = g.param(np.array([axis] if g.chance(0.5) else axis, np.int32))
    y = g.out(out)
    g.op(name, [x, ax], [y], (f"{name.title().replace('_', '')}Options", {"OutputType": 2 if out == "int32" else 4}),
         f"axis{axis} {out}")
    return [y]


@register("CUMSUM", ("float32", "int32"), (1, 2, 3, 4))
def cumsum(g: Graph, x: Val) -> list[Val]:
    axis = axis_of(g, len(x.shape))
    ax = g.param(np.array(axis, np.int32))
    y = g.out(x.kind)
    ex, rev = g.chance(0.5), g.chance(0.5)
    g.op("CUMSUM", [x, ax], [y], ("CumsumOptions", {"Exclusive": ex, "Reverse": rev}), f"axis{axis} ex{ex} rev{rev}")
    return [y]


# --- data movement
@register("RESHAPE", ALL)
def reshape(g: Graph, x: Val) -> list[Val]:
    n = int(np.prod(x.shape))
    factors = [f for f in range(2, n + 1) if n % f == 0]
    new: list[int] = []
    rest = n
    while rest > 1 and len(new) < 4:
        f = g.pick([f for f in factors if rest % f == 0])
        new.append(f)
        rest //= f
    new += [1] * int(g.rng.integers(0, 2))
    g.rng.shuffle(new)
    if new and g.chance(0.3):
        new[int(g.rng.integers(0, len(new)))] = -1
    y = g.out(x.kind, x.quant)
    how = g.pick(["tensor", "tensor", "options"])
    if how == "options":
        g.op("RESHAPE", [x], [y], ("ReshapeOptions", {"NewShape": [int(v) for v in new]}), f"opt{new}")
    else:
        shape = g.param(np.array(new, np.int32))
        g.op("RESHAPE", [x, shape], [y], None, f"{new}")
    return [y]


@register("SQUEEZE", ALL, (1, 2, 3, 4, 5))
def squeeze(g: Graph, x: Val) -> list[Val]:
    ones = [i for i, d in enumerate(x.shape) if d == 1]
    if not ones:
        raise Skip
    dims = [] if g.chance(0.3) else [int(i) for i in g.rng.choice(ones, size=int(g.rng.integers(1, len(ones) + 1)),
                                                                 replace=False)]
    dims = [d - len(x.shape) if g.chance(0.3) else d for d in dims]
    y = g.out(x.kind, x.quant)
    g.op("SQUEEZE", [x], [y], ("SqueezeOptions", {"SqueezeDims": dims}), f"{dims}")
    return [y]


@register("EXPAND_DIMS", ALL, (0, 1, 2, 3, 4))
def expand_dims(g: Graph, x: Val) -> list[Val]:
    r = len(x.shape)
    axis = int(g.rng.integers(-r - 1, r + 1))
    ax = g.param(np.array([axis] if g.chance(0.5) else axis, np.int32))
    y = g.out(x.kind, x.quant)
    g.op("EXPAND_DIMS", [x, ax], [y], None, f"axis{axis}")
    return [y]


@register("TRANSPOSE", ALL, (1, 2, 3, 4, 5))
def transpose(g: Graph, x: Val) -> list[Val]:
    perm = [int(p) for p in g.rng.permutation(len(x.shape))]
    p = g.param(np.array(perm, np.int32))
    y = g.out(x.kind, x.quant)
    g.op("TRANSPOSE", [x, p], [y], None, f"{perm}")
    return [y]


@register("CONCATENATION", ALL, (1, 2, 3, 4, 5))
def concat(g: Graph, x: Val) -> list[Val]:
    axis = axis_of(g, len(x.shape))
    parts = [x]
    for _ in range(int(g.rng.integers(1, 3))):
        shape = list(x.shape)
        shape[axis] = int(g.rng.integers(1, 4))
        parts.append(g.value(x.kind, shape, x.quant))
    g.rng.shuffle(parts)
    y = g.out(x.kind, x.quant)
    a = act(g, x.kind) if x.kind == "float32" else 0
    g.op("CONCATENATION", parts, [y], ("ConcatenationOptions", {"Axis": axis, "FusedActivationFunction": a}),
         f"axis{axis} n{len(parts)} act{a}")
    return [y]


@register("PACK", ALL, (0, 1, 2, 3, 4))
def pack(g: Graph, x: Val) -> list[Val]:
    r = len(x.shape)
    axis = int(g.rng.integers(-r - 1, r + 1))
    parts = [x] + [g.value(x.kind, x.shape, x.quant) for _ in range(int(g.rng.integers(0, 3)))]
    g.rng.shuffle(parts)
    y = g.out(x.kind, x.quant)
    g.op("PACK", parts, [y], ("PackOptions", {"ValuesCount": len(parts), "Axis": axis}), f"axis{axis} n{len(parts)}")
    return [y]


@register("UNPACK", ALL, (1, 2, 3, 4, 5))
def unpack(g: Graph, x: Val) -> list[Val]:
    axis = axis_of(g, len(x.shape))
    n = x.shape[axis]
    ys = [g.out(x.kind, x.quant) for _ in range(n)]
    g.op("UNPACK", [x], ys, ("UnpackOptions", {"Num": n, "Axis": axis}), f"axis{axis}")
    return ys


@register("SPLIT", ALL, (1, 2, 3, 4, 5))
def split(g: Graph, x: Val) -> list[Val]:
    axis = axis_of(g, len(x.shape))
    d = x.shape[axis]
    n = g.pick([k for k in range(1, d + 1) if d % k == 0])
    ax = g.param(np.array(axis, np.int32))
    ys = [g.out(x.kind, x.quant) for _ in range(n)]
    g.op("SPLIT", [ax, x], ys, ("SplitOptions", {"NumSplits": n}), f"axis{axis} n{n}")
    return ys


@register("SPLIT_V", ALL, (1, 2, 3, 4, 5))
def split_v(g: Graph, x: Val) -> list[Val]:
    axis = axis_of(g, len(x.shape))
    d = x.shape[axis]
    sizes: list[int] = []
    rest = d
    while rest > 0 and len(sizes) < 3:
        s = int(g.rng.integers(0 if g.chance(0.1) else 1, rest + 1))
        sizes.append(s)
        rest -= s
    if rest:
        sizes.append(rest)
    if g.chance(0.3):
        sizes[int(g.rng.integers(0, len(sizes)))] = -1
    sz = g.param(np.array(sizes, np.int32))
    ax = g.param(np.array(axis, np.int32))
    ys = [g.out(x.kind, x.quant) for _ in sizes]
    g.op("SPLIT_V", [x, sz, ax], ys, ("SplitVOptions", {"NumSplits": len(sizes)}), f"axis{axis} {sizes}")
    return ys


@register("SLICE", ALL, (1, 2, 3, 4, 5))
def slice_(g: Graph, x: Val) -> list[Val]:
    begin = [int(g.rng.integers(0, d)) for d in x.shape]
    size = [int(g.rng.integers(0 if g.chance(0.05) else 1, d - b + 1)) if g.chance(0.8) else -1
            for b, d in zip(begin, x.shape)]
    k = g.pick(["int32", "int32", "int64"])
    b, s = g.param(np.array(begin), k), g.param(np.array(size), k)
    y = g.out(x.kind, x.quant)
    g.op("SLICE", [x, b, s], [y], None, f"b{begin} s{size}")
    return [y]


@register("STRIDED_SLICE", ALL, (1, 2, 3, 4, 5))
def strided_slice(g: Graph, x: Val) -> list[Val]:
    r = len(x.shape)
    n = r if g.chance(0.7) else int(g.rng.integers(1, r + 1))
    begin, end, strides = [], [], []
    for i in range(n):
        d = x.shape[i] if i < r else 1
        s = int(g.pick([1, 1, 1, 2, 3, -1, -2]))
        b = int(g.rng.integers(-d, d))
        e = int(g.rng.integers(-d - 1, d + 2))
        begin.append(b)
        end.append(e)
        strides.append(s)
    bits = lambda p: sum(1 << i for i in range(n) if g.chance(p))  # noqa: E731
    opts = {"BeginMask": bits(0.2), "EndMask": bits(0.2), "ShrinkAxisMask": bits(0.1),
            "EllipsisMask": (1 << int(g.rng.integers(0, n))) if g.chance(0.1) else 0,
            "NewAxisMask": bits(0.05) if g.chance(0.2) else 0}
    for i in range(n):  # a shrunk axis takes one element: begin in range, stride positive
        if opts["ShrinkAxisMask"] >> i & 1:
            strides[i] = 1
    bt, et, st = (g.param(np.array(v, np.int32)) for v in (begin, end, strides))
    y = g.out(x.kind, x.quant)
    g.op("STRIDED_SLICE", [x, bt, et, st], [y], ("StridedSliceOptions", opts),
         f"b{begin} e{end} s{strides} {opts}")
    return [y]


@register("TILE", ALL, (1, 2, 3, 4))
def tile(g: Graph, x: Val) -> list[Val]:
    mult = [int(g.pick([1, 1, 2, 3])) for _ in x.shape]
    m = g.param(np.array(mult), g.pick(["int32", "int64"]))
    y = g.out(x.kind, x.quant)
    g.op("TILE", [x, m], [y], None, f"{mult}")
    return [y]


@register("BROADCAST_TO", ALL, (0, 1, 2, 3, 4))
def broadcast_to(g: Graph, x: Val) -> list[Val]:
    target = [d if d != 1 or g.chance(0.5) else int(g.rng.integers(1, 4)) for d in x.shape]
    target = [int(g.rng.integers(1, 3)) for _ in range(int(g.rng.integers(0, 6 - len(target) if len(target) < 5
                                                                            else 1)))] + target
    t = g.param(np.array(target), g.pick(["int32", "int64"]))
    y = g.out(x.kind, x.quant)
    g.op("BROADCAST_TO", [x, t], [y], None, f"{target}")
    return [y]


@register("PAD", ALL, (1, 2, 3, 4, 5))
@register("PADV2", ALL, (1, 2, 3, 4, 5))
@register("MIRROR_PAD", ALL, (1, 2, 3, 4, 5))
def pad(g: Graph, x: Val) -> list[Val]:
    name = g.pick(["PAD", "PADV2", "MIRROR_PAD"])
    mode = int(g.rng.integers(0, 2))
    if name == "MIRROR_PAD":
        pads = [[int(g.rng.integers(0, d - (mode == 0) + 1)) for _ in range(2)] for d in x.shape]
    else:
        pads = [[int(g.rng.integers(0, 3)) for _ in range(2)] for _ in x.shape]
    p = g.param(np.array(pads).reshape(len(x.shape), 2), g.pick(["int32", "int32", "int64"]))
    inputs = [x, p]
    opts = None
    if name == "PADV2":
        inputs.append(g.value(x.kind, [] if g.chance(0.5) else [1], x.quant, const_p=0.8))
    if name == "MIRROR_PAD":
        opts = ("MirrorPadOptions", {"Mode": mode})
    y = g.out(x.kind, x.quant)
    g.op(name, inputs, [y], opts, f"{pads}" + (f" mode{mode}" if opts else ""))
    return [y]


@register("REVERSE_V2", ALL, (1, 2, 3, 4, 5))
def reverse(g: Graph, x: Val) -> list[Val]:
    r = len(x.shape)
    axes = [axis_of(g, r)] if g.chance(0.7) else sorted({int(a) for a in g.rng.integers(0, r, size=2)})
    ax = g.param(np.array(axes, np.int32))
    y = g.out(x.kind, x.quant)
    g.op("REVERSE_V2", [x, ax], [y], None, f"{axes}")
    return [y]


@register("GATHER", ALL, (1, 2, 3, 4))
def gather(g: Graph, x: Val) -> list[Val]:
    r = len(x.shape)
    batch = int(g.rng.integers(0, r)) if g.chance(0.2) else 0
    axis = int(g.rng.integers(batch, r))
    if g.chance(0.3):
        axis -= r
    ishape = list(x.shape[:batch]) + rand_shape(g, (0, 1, 2), 4)
    idx_kind = g.pick(["int32", "int32", "int64"])
    idx = g.value(idx_kind, ishape, values=g.rng.integers(0, x.shape[axis], size=ishape), const_p=0.4)
    y = g.out(x.kind, x.quant)
    g.op("GATHER", [x, idx], [y], ("GatherOptions", {"Axis": axis, "BatchDims": batch}),
         f"axis{axis} batch{batch} idx{ishape}{'c' if idx.index not in g.inputs else ''}")
    return [y]


@register("GATHER_ND", ALL, (1, 2, 3, 4))
def gather_nd(g: Graph, x: Val) -> list[Val]:
    k = int(g.rng.integers(1, len(x.shape) + 1))
    lead = rand_shape(g, (0, 1, 2), 3)
    vals = np.stack([g.rng.integers(0, x.shape[i], size=lead) for i in range(k)], axis=-1)
    idx = g.value(g.pick(["int32", "int32", "int64"]), lead + [k], values=vals, const_p=0.4)
    y = g.out(x.kind, x.quant)
    g.op("GATHER_ND", [x, idx], [y], None, f"idx{lead + [k]}{'c' if idx.index not in g.inputs else ''}")
    return [y]


@register("EMBEDDING_LOOKUP", ("float32", "int8", "uint8", "int32"), (2, 3))
def embedding_lookup(g: Graph, x: Val) -> list[Val]:
    n = int(g.rng.integers(1, 5))
    ids = g.value("int32", [n], values=g.rng.integers(0, x.shape[0], size=n), const_p=0.4)
    y = g.out(x.kind, x.quant)
    g.op("EMBEDDING_LOOKUP", [ids, x], [y], None, f"ids{n}")
    return [y]


@register("SHAPE", ALL)
def shape_op(g: Graph, x: Val) -> list[Val]:
    out = g.pick(["int32", "int64"])
    y = g.out(out)
    g.op("SHAPE", [x], [y], ("ShapeOptions", {"OutType": 2 if out == "int32" else 4}), out)
    return [y]


@register("RANK", ALL)
def rank_op(g: Graph, x: Val) -> list[Val]:
    y = g.out("int32")
    g.op("RANK", [x], [y])
    return [y]


@register("FILL", ("float32", "int32", "bool"), (0,))
def fill(g: Graph, x: Val) -> list[Val]:
    dims = rand_shape(g, (1, 2, 3), 4)
    d = g.param(np.array(dims), g.pick(["int32", "int64"]))
    y = g.out(x.kind)
    g.op("FILL", [d, x], [y], None, f"{dims}")
    return [y]


@register("SPACE_TO_DEPTH", ("float32", "int8", "uint8", "int32"), (4,))
@register("DEPTH_TO_SPACE", ("float32", "int8", "uint8", "int32"), (4,))
def space_depth(g: Graph, x: Val) -> list[Val]:
    if g.chance(0.5):
        bs = [b for b in (2, 3) if x.shape[1] % b == 0 and x.shape[2] % b == 0]
        name, opts = "SPACE_TO_DEPTH", "SpaceToDepthOptions"
    else:
        bs = [b for b in (2, 3) if x.shape[3] % (b * b) == 0]
        name, opts = "DEPTH_TO_SPACE", "DepthToSpaceOptions"
    if not bs:
        raise Skip
    b = g.pick(bs)
    y = g.out(x.kind, x.quant)
    g.op(name, [x], [y], (opts, {"BlockSize": b}), f"b{b}")
    return [y]


@register("SPACE_TO_BATCH_ND", ("float32", "int8", "uint8"), (3, 4))
@register("BATCH_TO_SPACE_ND", ("float32", "int8", "uint8"), (3, 4))
def space_batch(g: Graph, x: Val) -> list[Val]:
    m = len(x.shape) - 2
    if g.chance(0.5):
        block = [int(g.pick([1, 2, 3])) for _ in range(m)]
        pads = []
        for i in range(m):
            lo = int(g.rng.integers(0, 3))
            hi = (-(x.shape[1 + i] + lo)) % block[i] + block[i] * int(g.rng.integers(0, 2))
            pads.append([lo, hi])
        bt, pt = g.param(np.array(block, np.int32)), g.param(np.array(pads, np.int32).reshape(m, 2))
        y = g.out(x.kind, x.quant)
        g.op("SPACE_TO_BATCH_ND", [x, bt, pt], [y], None, f"block{block} pad{pads}")
    else:
        divisors = [b for b in (1, 2, 3, 4) if x.shape[0] % b == 0]
        block = [g.pick(divisors)] + [1] * (m - 1)
        if m > 1 and g.chance(0.5):
            block = [1, block[0]]
        crops = [[int(g.rng.integers(0, 2)) if block[i] * x.shape[1 + i] > 2 else 0, 0] for i in range(m)]
        bt, ct = g.param(np.array(block, np.int32)), g.param(np.array(crops, np.int32).reshape(m, 2))
        y = g.out(x.kind, x.quant)
        g.op("BATCH_TO_SPACE_ND", [x, bt, ct], [y], None, f"block{block} crops{crops}")
    return [y]


@register("TOPK_V2", ("float32", "int8", "uint8", "int32"), (1, 2, 3))
def topk(g: Graph, x: Val) -> list[Val]:
    k = int(g.rng.integers(1, x.shape[-1] + 1))
    kt = g.param(np.array(k, np.int32))
    ys = [g.out(x.kind, x.quant), g.out("int32")]
    g.op("TOPK_V2", [x, kt], ys, None, f"k{k}")
    return ys


# --- spatial
def _weights(g: Graph, x: Val, shape: list[int], channel_dim: int, bias_n: int):
    """Weights and bias for a convolution / fully connected of ``x``: float, hybrid (int8
    weights of a float model), or quantized per tensor / per channel; (w, bias or None, out quant)."""
    cout = shape[channel_dim]
    bias = None
    if x.kind == "float32":
        if g.chance(0.2):  # dynamic-range (hybrid) weights
            g.hybrid = True
            wq = g.quant("int8")
            wq = (wq[0] * 0.01, 0)
            w = g.const("int8", g.data("int8", shape), wq)
        else:
            w = g.value("float32", shape, const_p=0.85)
        if g.chance(0.8):
            bias = g.value("float32", [bias_n], const_p=0.9)
        return w, bias, None
    in_scale = x.quant[0]
    if x.kind == "int16" or (x.kind == "int8" and g.chance(0.6)):
        scales = [float(np.float32(10 ** g.rng.uniform(-3, -1))) for _ in range(cout)]
        w = g.const("int8", g.rng.integers(-127, 128, size=shape), per_channel=(scales, [0] * cout, channel_dim))
        bscales = [float(np.float32(in_scale) * np.float32(s)) for s in scales]
        bkind = "int64" if x.kind == "int16" else "int32"
        if g.chance(0.8):
            bias = g.const(bkind, g.rng.integers(-3000, 3000, size=[bias_n]), per_channel=(bscales, [0] * cout, 0))
    else:
        ws = float(np.float32(10 ** g.rng.uniform(-3, -1)))
        wz = 0 if x.kind == "int8" else int(g.rng.integers(0, 256))
        w = g.const(x.kind, g.data(x.kind, shape), (ws, wz))
        if g.chance(0.8):
            bias = g.const("int32", g.rng.integers(-3000, 3000, size=[bias_n]),
                           (float(np.float32(in_scale) * np.float32(ws)), 0))
    return w, bias, g.quant(x.kind, (in_scale * 3,))


@register("CONV_2D", ("float32", "int8", "uint8", "int16"), (4,))
def conv2d(g: Graph, x: Val) -> list[Val]:
    cin = x.shape[3]
    groups = g.pick([d for d in (1, 2, 3) if cin % d == 0]) if g.chance(0.15) else 1
    kh, kw, cout = int(g.rng.integers(1, 4)), int(g.rng.integers(1, 4)), int(g.rng.integers(1, 5)) * groups
    w, b, q = _weights(g, x, [cout, kh, kw, cin // groups], 0, cout)
    opts = {"Padding": int(g.rng.integers(0, 2)), "StrideW": int(g.pick([1, 1, 2, 3])),
            "StrideH": int(g.pick([1, 1, 2])), "DilationWFactor": int(g.pick([1, 1, 2])),
            "DilationHFactor": int(g.pick([1, 1, 2])), "FusedActivationFunction": act(g, x.kind)}
    y = g.out(x.kind, q)
    g.op("CONV_2D", [x, w, b.index if b else -1], [y], ("Conv2DOptions", opts),
         f"w{w.shape}{w.kind} g{groups} {opts}")
    return [y]


@register("DEPTHWISE_CONV_2D", ("float32", "int8", "uint8", "int16"), (4,))
def depthwise(g: Graph, x: Val) -> list[Val]:
    cin = x.shape[3]
    mult = int(g.pick([1, 1, 2]))
    kh, kw = int(g.rng.integers(1, 4)), int(g.rng.integers(1, 4))
    w, b, q = _weights(g, x, [1, kh, kw, cin * mult], 3, cin * mult)
    opts = {"Padding": int(g.rng.integers(0, 2)), "StrideW": int(g.pick([1, 1, 2])),
            "StrideH": int(g.pick([1, 1, 2, 3])), "DilationWFactor": int(g.pick([1, 1, 2])),
            "DilationHFactor": int(g.pick([1, 1, 2])), "FusedActivationFunction": act(g, x.kind),
            "DepthMultiplier": mult}
    y = g.out(x.kind, q)
    g.op("DEPTHWISE_CONV_2D", [x, w, b.index if b else -1], [y], ("DepthwiseConv2DOptions", opts),
         f"w{w.shape}{w.kind} {opts}")
    return [y]


@register("TRANSPOSE_CONV", ("float32", "int8", "uint8", "int16"), (4,))
def transpose_conv(g: Graph, x: Val) -> list[Val]:
    n, h, w_, cin = x.shape
    kh, kw, cout = int(g.rng.integers(1, 4)), int(g.rng.integers(1, 4)), int(g.rng.integers(1, 4))
    sh, sw = int(g.pick([1, 2, 2, 3])), int(g.pick([1, 2]))
    padding = int(g.rng.integers(0, 2))
    if padding == 0:
        oh, ow = h * sh, w_ * sw
    else:
        oh, ow = (h - 1) * sh + kh, (w_ - 1) * sw + kw
    w, b, q = _weights(g, x, [cout, kh, kw, cin], 0, cout)
    if w.kind == "int8" and x.kind == "float32":
        raise Skip  # no hybrid TRANSPOSE_CONV in LiteRT
    shape = g.param(np.array([n, oh, ow, cout], np.int32))
    y = g.out(x.kind, q)
    opts = {"Padding": padding, "StrideW": sw, "StrideH": sh, "FusedActivationFunction": act(g, x.kind)}
    g.op("TRANSPOSE_CONV", [shape, w, x, b.index if b else -1], [y], ("TransposeConvOptions", opts),
         f"w{w.shape} {opts}")
    return [y]


@register("FULLY_CONNECTED", ("float32", "int8", "uint8", "int16"), (1, 2, 3, 4))
def fully_connected(g: Graph, x: Val) -> list[Val]:
    keep = len(x.shape) > 2 and g.chance(0.4)
    k = x.shape[-1] if keep or g.chance(0.7) else int(np.prod(x.shape[1:])) if len(x.shape) > 1 else x.shape[-1]
    cout = int(g.rng.integers(1, 6))
    w, b, q = _weights(g, x, [cout, k], 0, cout)
    opts = {"FusedActivationFunction": act(g, x.kind), "KeepNumDims": keep}
    if g.hybrid:
        opts["AsymmetricQuantizeInputs"] = g.chance(0.5)
    y = g.out(x.kind, q)
    g.op("FULLY_CONNECTED", [x, w, b.index if b else -1], [y], ("FullyConnectedOptions", opts),
         f"w{w.shape}{w.kind} {opts}")
    return [y]


@register("BATCH_MATMUL", ("float32", "int8", "int16"), (2, 3, 4))
def batch_matmul(g: Graph, x: Val) -> list[Val]:
    adj_x, adj_y = g.chance(0.3), g.chance(0.3)
    k = x.shape[-2] if adj_x else x.shape[-1]
    n = int(g.rng.integers(1, 5))
    batch = broadcast_partner(g, x.shape[:-2])[: 3]
    shape = batch + ([n, k] if adj_y else [k, n])
    if x.kind == "float32":
        other = g.value("float32", shape, const_p=0.4)
    else:
        q = g.quant(x.kind)
        other = g.value(x.kind, shape, (q[0], 0 if x.kind == "int16" else q[1]), const_p=0.4)
    a, b = x, other
    y = g.out(x.kind, g.quant(x.kind, (x.quant[0] * 30,)) if x.quant else None)
    g.op("BATCH_MATMUL", [a, b], [y], ("BatchMatMulOptions", {"AdjX": adj_x, "AdjY": adj_y}),
         f"{a.shape}x{b.shape} adj{int(adj_x)}{int(adj_y)}")
    return [y]


@register("AVERAGE_POOL_2D", ("float32", "int8", "uint8", "int16"), (4,))
@register("MAX_POOL_2D", ("float32", "int8", "uint8", "int16"), (4,))
@register("L2_POOL_2D", ("float32",), (4,))
def pool(g: Graph, x: Val) -> list[Val]:
    name = g.pick(["AVERAGE_POOL_2D", "MAX_POOL_2D"] + (["L2_POOL_2D"] if x.kind == "float32" else []))
    opts = {"Padding": int(g.rng.integers(0, 2)), "StrideW": int(g.pick([1, 2, 3])), "StrideH": int(g.pick([1, 2])),
            "FilterWidth": int(g.rng.integers(1, 4)), "FilterHeight": int(g.rng.integers(1, 4)),
            "FusedActivationFunction": act(g, x.kind)}
    y = g.out(x.kind, x.quant)
    g.op(name, [x], [y], ("Pool2DOptions", opts), str(opts))
    return [y]


@register("RESIZE_BILINEAR", ("float32", "int8", "uint8", "int16"), (4,))
@register("RESIZE_NEAREST_NEIGHBOR", ("float32", "int8", "uint8", "int16", "int32"), (4,))
def resize(g: Graph, x: Val) -> list[Val]:
    name = g.pick(["RESIZE_BILINEAR", "RESIZE_NEAREST_NEIGHBOR"] if x.kind != "int32" else ["RESIZE_NEAREST_NEIGHBOR"])
    size = [int(g.rng.integers(1, 9)), int(g.rng.integers(1, 9))]
    ac = g.chance(0.3)
    hp = (not ac) and g.chance(0.5)
    s = g.param(np.array(size, np.int32))
    y = g.out(x.kind, x.quant)
    opts = ("ResizeBilinearOptions" if name == "RESIZE_BILINEAR" else "ResizeNearestNeighborOptions",
            {"AlignCorners": ac, "HalfPixelCenters": hp})
    g.op(name, [x, s], [y], opts, f"{x.shape[1:3]}->{size} ac{int(ac)} hp{int(hp)}")
    return [y]


# --- one case ----------------------------------------------------------------------------------
@dataclass
class Case:
    number: int
    ops: list[str]
    kind: str
    label: str = ""
    model: bytes = b""
    feeds: list[np.ndarray] = field(default_factory=list)
    hybrid: bool = False


def make_case(seed: int, number: int, only: list[str]) -> Case | str:
    """The random model of case ``number``, or why LiteRT refused it ("litert: ...")."""
    rng = np.random.default_rng([seed, number])
    names = only or sorted(OPS)
    first = names[int(rng.integers(0, len(names)))]
    g = Graph(rng)
    fn, kinds, ranks = OPS[first]
    kind = g.pick(kinds)
    q, domain = g.quant(kind), ""
    if first in POSITIVE and g.chance(0.8):  # mostly inside the function's domain (NaN otherwise)
        domain = "pos"
        q = q if q is None else (q[0], {"int8": -128, "uint8": 0, "int16": 0}[kind])
    x = g.value(kind, rand_shape(g, ranks), q, const_p=0.15, domain=domain)
    length = 1 if g.chance(0.6) or not CHAINS else int(g.pick([2, 2, 3]))
    chain = [first]
    try:
        ys = None
        for step in range(length):
            if step:
                fits = [n for n, (_, k, r) in OPS.items() if x.kind in k and len(x.shape) in r]
                if not fits:
                    break
                chain.append(fits[int(rng.integers(0, len(fits)))])
                fn = OPS[chain[-1]][0]
            for _ in range(3):
                try:
                    ys = fn(g, x)
                    break
                except Skip:
                    continue
            else:
                chain.pop()
                break
            if not ys:  # an UNPACK / SPLIT of a size-0 axis: nothing to chain or compare
                return "skip: an operator without outputs"
            set_shapes(g, ys)
            x = ys[0]
        if ys is None:
            return "skip: no operator fits"
        if not g.inputs:
            return "no run-time input: every input a constant"
        outputs = ys
        model = g.model([o.index for o in outputs])
    except (RuntimeError, ValueError) as error:
        return f"litert: {str(error).strip().splitlines()[0][:90]}"
    except NaNValues:
        return "NaN inside LiteRT's values"
    return Case(number, g.names, kind, " > ".join(g.labels), model, g.feeds, g.hybrid)


def device_outputs(case: Case, device: str) -> tuple[str, str, list[np.ndarray] | None]:
    """(class, detail, outputs) of ``case`` run on ``device``: ("ran", "", outputs), or
    "refused" / "RAW" with the reason and None."""
    import nnapi

    try:
        session = nnapi.Session(case.model, devices=[device])
        names = [i.name for i in session.inputs]
        return "ran", "", list(session.run(dict(zip(names, case.feeds))).values())
    except nnapi.NnapiError as error:
        text = str(error)
        if _INTERNAL.search(text):
            return "RAW", f"NnapiError carrying {text[:300]}", None
        return "refused", text, None
    except Exception as error:  # noqa: BLE001 - what the fuzzer looks for
        where = traceback.format_exc().strip().splitlines()[-3][:200]
        return "RAW", f"{type(error).__name__}: {error} | {where}", None


def differences(case: Case, got: list[np.ndarray], theirs: list[np.ndarray], steps: int, whose: str) -> list[str]:
    """What makes ``got`` differ from ``theirs`` (``whose`` outputs): floats beyond the relative
    tolerance, quantized values beyond ``steps``, other integers and bools at all."""
    if len(got) != len(theirs):
        return [f"{len(got)} outputs, {whose} {len(theirs)}"]
    worst = []
    for i, (a, b) in enumerate(zip(got, theirs)):
        if a.shape != b.shape:
            return [f"output {i}: shape {list(a.shape)} vs {whose} {list(b.shape)}"]
        if a.dtype != b.dtype:
            return [f"output {i}: dtype {a.dtype} vs {whose} {b.dtype}"]
        if not b.size:
            continue
        if b.dtype.kind == "f":
            largest = float(np.abs(b).max())
            diff = float(np.abs(a.astype(np.float64) - b.astype(np.float64)).max())
            special = ~np.isfinite(b) | ~np.isfinite(a)
            if special.any():  # NaN and infinities: the same ones at the same places, the rest compared
                if not np.array_equal(a[special], b[special], equal_nan=True):
                    worst.append(f"output {i}: NaN / inf at other places ({int(np.count_nonzero(special))})")
                    continue
                a, b = a[~special], b[~special]
                largest = float(np.abs(b).max()) if b.size else 0.0
                diff = float(np.abs(a.astype(np.float64) - b.astype(np.float64)).max()) if b.size else 0.0
            rel = diff / largest if largest > 0 else diff
            tol = HYBRID_RTOL if case.hybrid else RTOL
            if not rel <= tol:
                worst.append(f"output {i}: rel {rel:.3g} (abs {diff:.3g})")
        else:
            off = int(np.abs(a.astype(np.int64) - b.astype(np.int64)).max())
            quantized = b.dtype in (np.int8, np.uint8, np.int16) and case.kind in QUANT or b.dtype in (np.uint8,)
            if off > (steps if quantized else 0):
                worst.append(f"output {i}: {off} {'steps' if quantized else 'off'} "
                             f"({int(np.count_nonzero(a != b))} of {b.size})")
    return worst


def judged(case: Case, ran: tuple[str, str, list[np.ndarray] | None], theirs: list[np.ndarray]) -> tuple[str, str]:
    """(class, detail) of a device's run of ``case`` (``device_outputs``) against LiteRT's outputs."""
    cls, detail, got = ran
    if got is None:
        return cls, detail
    worst = differences(case, got, theirs, STEPS, "LiteRT")
    return ("DIFFER", "; ".join(worst)) if worst else ("agree", "")


def classify(case: Case, theirs: list[np.ndarray], device: str) -> tuple[str, str]:
    """(class, detail) of ``case`` on ``device`` against LiteRT's outputs."""
    return judged(case, device_outputs(case, device), theirs)


def run_case(seed: int, number: int, only: list[str], devices: list[str], report) -> dict:
    """Everything about one case, as a plain dict."""
    made = make_case(seed, number, only)
    if isinstance(made, str):
        return {"number": number, "skipped": made}
    report(("stage", number, "litert"))
    try:
        theirs = litert(made.model, made.feeds)
    except (RuntimeError, ValueError) as error:
        return {"number": number, "skipped": f"litert: {str(error).strip().splitlines()[0][:90]}"}
    record = {"number": number, "ops": made.ops, "kind": made.kind, "label": made.label, "results": {}}
    ran = {}
    for device in devices:  # each device runs the case once; every comparison reads its outputs
        report(("stage", number, device))
        ran[device] = device_outputs(made, device)
    reference = ran.get(REFERENCE) if VS_REFERENCE else None
    for device in devices:
        cls, detail = judged(made, ran[device], theirs)
        if reference is not None and device != REFERENCE:
            cls, detail = _against_reference(made, ran[device][2], cls, detail, reference)
        if cls == "DIFFER" and not detail.startswith("vs nnapi-reference"):
            try:
                ref = litert(made.model, made.feeds, reference=True)
                ref_cls, _ = judged(made, ran[device], ref)
                detail += f" [BUILTIN_REF: device {'agrees' if ref_cls == 'agree' else 'differs too'}]"
            except (RuntimeError, ValueError):
                detail += " [BUILTIN_REF refuses]"
        record["results"][device] = (cls, detail)
    if any(c in ("DIFFER", "RAW") for c, _ in record["results"].values()):
        record["model"] = made.model
        record["feeds"] = made.feeds
    return record


def _against_reference(case: Case, got: list[np.ndarray] | None, cls: str, detail: str,
                       reference: tuple[str, str, list[np.ndarray] | None]) -> tuple[str, str]:
    """``--vs-reference``: a device's outputs ``got`` (judged ``cls`` against LiteRT) must be
    nnapi-reference's where it runs (integers and quantized values exactly, floats within
    the relative tolerance), whatever LiteRT says, as the devices promise each other; a
    device that declines where the reference runs is "declined" (counted with its reason,
    not a failure)."""
    if reference[2] is None or cls == "RAW":
        return cls, detail
    if cls == "refused":
        return "declined", detail
    worst = differences(case, got, reference[2], 0, REFERENCE) if got is not None else []
    if worst:
        return "DIFFER", f"vs {REFERENCE} (LiteRT: {cls}): " + "; ".join(worst)
    return cls, detail


def _worker(seed: int, numbers: list[int], only: list[str], devices: list[str], out, steps: int,
            chains: bool, vs_reference: bool) -> None:
    import faulthandler
    import warnings

    faulthandler.enable()  # a crash prints the Python stack of the call that made it
    warnings.filterwarnings("ignore")
    global STEPS, CHAINS, VS_REFERENCE
    STEPS, CHAINS, VS_REFERENCE = steps, chains, vs_reference
    for number in numbers:
        out.send(("begin", number, "generate"))
        out.send(("done", number, run_case(seed, number, only, devices, out.send)))
    out.send(("finished", None, None))


# --- the run -----------------------------------------------------------------------------------
def reason_key(text: str) -> str:
    """A refusal's reason with its numbers and names blurred, to count alike ones together."""
    text = re.sub(r"\d+", "N", text)
    text = re.sub(r"'[^']*'|\"[^\"]*\"", "'…'", text)
    return text[:110]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("ops", nargs="*", help="operators to draw the first one of each case from (default: all)")
    parser.add_argument("--count", type=int, default=200, help="cases (default 200)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--case", type=int, help="run only this case number")
    parser.add_argument("--device", action="append", help=f"device (repeatable; default {', '.join(DEVICES)})")
    parser.add_argument("-v", "--verbose", action="store_true", help="print every DIFFER / RAW / CRASH case")
    parser.add_argument("--save", type=Path, help="write the .tflite (and inputs .npz) of failing cases here")
    parser.add_argument("--refusals", action="store_true", help="print the counted refusal reasons")
    parser.add_argument("--steps", type=int, default=STEPS,
                        help=f"quantized tolerance in steps (default {STEPS}, nnapi compare's; 0 shows biases)")
    parser.add_argument("--single", action="store_true", help="one operator per case, no chains")
    parser.add_argument("--vs-reference", action="store_true",
                        help="also hold every other device to nnapi-reference's values (integers exactly) and count "
                             "what it declines where the reference runs")
    args = parser.parse_args()
    unknown = [o for o in args.ops if o not in OPS]
    if unknown:
        parser.error(f"no generator for {', '.join(unknown)} (have: {', '.join(sorted(OPS))})")
    try:
        import ai_edge_litert.interpreter  # noqa: F401
        import tflite  # noqa: F401
    except ImportError as error:
        print(f"import_vs_litert.py needs ai-edge-litert and tflite (pip install -e '.[test]'): {error}",
              file=sys.stderr)
        return 2
    import nnapi

    present = {device.name for device in nnapi.get_devices()}
    absent = [d for d in args.device or [] if d not in present]
    if absent:
        parser.error(f"no device named {', '.join(absent)} (devices: {', '.join(sorted(present))})")
    devices = args.device or [d for d in DEVICES if d in present]
    if args.vs_reference and REFERENCE not in devices:
        devices.insert(0, REFERENCE)  # the values the others are held to
    numbers = [args.case] if args.case is not None else list(range(args.count))
    if args.save:
        args.save.mkdir(parents=True, exist_ok=True)

    rows: dict[tuple[str, str], collections.Counter] = collections.defaultdict(collections.Counter)
    totals: collections.Counter = collections.Counter()
    refusals: collections.Counter = collections.Counter()
    skipped: collections.Counter = collections.Counter()
    failures: list[str] = []
    ctx = multiprocessing.get_context("spawn")
    pending = list(numbers)
    start = time.time()
    while pending:
        # a pipe, not a Queue: a Queue's feeder thread sends later, and a crash lost the last
        # messages (a LiteRT segfault while generating the next case was blamed on the
        # previous case's last stage, "in nnapi-ort-cpu"); each send here is written at once
        reader, writer = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=_worker, args=(args.seed, pending, args.ops, devices, writer, args.steps,
                                                 not args.single, args.vs_reference), daemon=True)
        proc.start()
        writer.close()  # the worker's end only: reading then sees the end when it dies
        current, stage, last = None, "", time.time()
        while True:
            try:
                if not reader.poll(1):
                    raise queue.Empty
                kind, number, payload = reader.recv()
            except (queue.Empty, EOFError):
                if not proc.is_alive() or time.time() - last > CASE_TIMEOUT_S:
                    what = "CRASH" if not proc.is_alive() else "HANG"
                    proc.kill()
                    proc.join()
                    if current is None:
                        pending = []
                        break
                    totals[what] += 1
                    line = f"case {current}: {what} (exit {proc.exitcode}) in {stage}"
                    failures.append(line)
                    print(line, flush=True)
                    pending = pending[pending.index(current) + 1:]
                    break
                continue
            last = time.time()
            if kind == "begin":
                current, stage = number, payload
            elif kind == "stage":
                stage = payload
            elif kind == "finished":
                proc.join()
                pending = []
                break
            else:
                record = payload
                if "skipped" in record:
                    skipped[record["skipped"].split(":")[0]] += 1
                    totals["litert-refused" if record["skipped"].startswith("litert") else "no-input"
                           if record["skipped"].startswith("no run-time") else "nan"
                           if record["skipped"].startswith("NaN") else "no-fit"] += 1
                    if args.verbose and args.case is not None:
                        print(f"case {number}: {record['skipped']}")
                    continue
                totals["valid"] += 1
                for device, (cls, detail) in record["results"].items():
                    totals[f"{device} {cls}"] += 1
                    for op in set(record["ops"]):
                        rows[(op, record["kind"])][f"{device} {cls}"] += 1
                    if cls in ("refused", "declined"):
                        refusals[reason_key(detail)] += 1
                    if cls in ("DIFFER", "RAW"):
                        line = f"case {number} {device} {cls}: {record['kind']} {record['label']}\n    {detail}"
                        failures.append(line)
                        if args.verbose:
                            print(line, flush=True)
                        if args.save:
                            stem = f"s{args.seed}-c{number}-{'-'.join(record['ops'])}-{record['kind']}"
                            (args.save / f"{stem}.tflite").write_bytes(record["model"])
                            np.savez(args.save / f"{stem}.npz", *record["feeds"])
                for op in set(record["ops"]):
                    rows[(op, record["kind"])]["cases"] += 1

    print(f"\n{len(numbers)} cases (seed {args.seed}) in {time.time() - start:.0f} s: {totals['valid']} valid, "
          f"{totals['litert-refused']} refused by LiteRT, {totals['no-fit']} without a fitting operator, "
          f"{totals['no-input']} without a run-time input, {totals['nan']} with a NaN inside, "
          f"{totals['CRASH']} crashes, {totals['HANG']} hangs")
    for device in devices:
        print(f"  {device:16s} " + "  ".join(f"{c} {totals[f'{device} {c}']}"
                                             for c in ("agree", "DIFFER", "refused", "RAW"))
              + (f"  declined {totals[f'{device} declined']}" if totals[f"{device} declined"] else ""))
    print(f"\n{'operator':30s} {'type':8s} {'cases':>5s}  " + "  ".join(
        f"{d.replace('nnapi-', ''):>9s} agree/DIFF/refused/RAW" for d in devices))
    for (op, kind), c in sorted(rows.items()):
        cols = "  ".join(f"{c[f'{d} agree']:>9d}/{c[f'{d} DIFFER']}/{c[f'{d} refused']}/{c[f'{d} RAW']}"
                         + " " * 12 for d in devices)
        print(f"{op:30s} {kind:8s} {c['cases']:5d}  {cols}")
    if args.refusals:
        print("\nrefusals:")
        for reason, n in refusals.most_common():
            print(f"  {n:5d}  {reason}")
    if failures and not args.verbose:
        print(f"\n{len(failures)} failing (DIFFER / RAW / CRASH / HANG); -v prints them")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
