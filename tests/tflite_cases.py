"""Small synthetic TFLite models, one per importer lowering (and per quantized mapping the
shipped test models lack), for tests/test_tflite_import.py.

Each case: ``CASES[name] = Case(build, lowering, quantized)`` where ``build()`` returns
the .tflite bytes, ``lowering`` is a word the recorded lowering's text must contain (None
when the operator maps one to one), and ``tolerance`` bounds the disagreement with LiteRT
(relative to the largest output magnitude for float, quantized steps otherwise).
tests/data/models/make_expected.py stores LiteRT's outputs for them in lowerings.npz.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from tflite_builder import Operator, Subgraph, Tensor, build, single_op
from tflite_qlstm_cases import basic_float_lstm, basic_uint8_lstm, integer_lstm


@dataclass
class Case:
    build: Callable[[], bytes]
    lowering: str | None
    tolerance: float = 1e-5
    #: numpy reference for cases where LiteRT computes something else (see the case):
    #: inputs by name -> outputs by name
    reference: Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]] | None = None


def _rng(seed: int = 7) -> np.random.Generator:
    return np.random.default_rng(seed)


def _q(values: np.ndarray, scale, zero_point, dtype, axis: int | None = None) -> np.ndarray:
    if axis is not None:
        shape = [1] * values.ndim
        shape[axis] = -1
        scale = np.asarray(scale).reshape(shape)
    info = np.iinfo(dtype)
    return np.clip(np.round(values / scale) + zero_point, info.min, info.max).astype(dtype)


def mean_int8_rescale() -> bytes:
    t = [Tensor("x", "int8", [1, 5, 5, 8], scale=0.05, zero_point=-3),
         Tensor("axes", "int32", [2], data=np.array([1, 2], np.int32)),
         Tensor("y", "int8", [1, 8], scale=0.013, zero_point=5)]
    return single_op("MEAN", t, [0, 1], [2], ("ReducerOptions", {"KeepDims": False}))


def mean_uint8_rescale() -> bytes:
    t = [Tensor("x", "uint8", [1, 4, 6, 3], scale=0.1, zero_point=128),
         Tensor("axes", "int32", [2], data=np.array([1, 2], np.int32)),
         Tensor("y", "uint8", [1, 1, 1, 3], scale=0.02, zero_point=120)]
    return single_op("MEAN", t, [0, 1], [2], ("ReducerOptions", {"KeepDims": True}))


def fully_connected_per_channel() -> bytes:
    rng = _rng()
    w = rng.uniform(-1, 1, (6, 10)).astype(np.float32)
    scales = (np.abs(w).max(axis=1) / 127).astype(np.float32)
    wq = _q(w, scales, 0, np.int8, axis=0)
    x_scale = 0.04
    bias = rng.uniform(-1, 1, 6)
    bias_scales = (scales * x_scale).astype(np.float32)
    bq = np.round(bias / bias_scales).astype(np.int32)
    t = [Tensor("x", "int8", [2, 10], scale=x_scale, zero_point=2),
         Tensor("w", "int8", [6, 10], data=wq, scale=[float(s) for s in scales], zero_point=[0] * 6),
         Tensor("b", "int32", [6], data=bq, scale=[float(s) for s in bias_scales], zero_point=[0] * 6),
         Tensor("y", "int8", [2, 6], scale=0.03, zero_point=-4)]
    return single_op("FULLY_CONNECTED", t, [0, 1, 2], [3], ("FullyConnectedOptions", {"FusedActivationFunction": 1}))


def fully_connected_keep_dims() -> bytes:
    rng = _rng()
    t = [Tensor("x", "float32", [2, 3, 4]),
         Tensor("w", "float32", [5, 4], data=rng.standard_normal((5, 4)).astype(np.float32)),
         Tensor("b", "float32", [5], data=rng.standard_normal(5).astype(np.float32)),
         Tensor("y", "float32", [2, 3, 5])]
    return single_op("FULLY_CONNECTED", t, [0, 1, 2], [3], ("FullyConnectedOptions", {"KeepNumDims": True}))


def quantize_requantize() -> bytes:
    t = [Tensor("x", "int8", [3, 7], scale=0.05, zero_point=3),
         Tensor("y", "int8", [3, 7], scale=0.031, zero_point=-10)]
    return single_op("QUANTIZE", t, [0], [1])


def quantize_uint8_to_int8() -> bytes:
    t = [Tensor("x", "uint8", [2, 9], scale=0.07, zero_point=130),
         Tensor("y", "int8", [2, 9], scale=0.07, zero_point=2)]
    return single_op("QUANTIZE", t, [0], [1])


def strided_slice_shrink() -> bytes:
    # Axis 1 is shrunk from a negative begin with an end TFLite ignores (0).
    t = [Tensor("x", "float32", [2, 5, 6]),
         Tensor("begin", "int32", [3], data=np.array([0, -2, 1], np.int32)),
         Tensor("end", "int32", [3], data=np.array([2, 0, 6], np.int32)),
         Tensor("strides", "int32", [3], data=np.array([1, 1, 2], np.int32)),
         Tensor("y", "float32", [2, 3])]
    return single_op("STRIDED_SLICE", t, [0, 1, 2, 3], [4], ("StridedSliceOptions", {"ShrinkAxisMask": 2}))


def _strided_slice(shape, begin, end, strides, out_shape, type_="float32", **masks) -> Callable[[], bytes]:
    def make() -> bytes:
        quant = {"scale": 0.1, "zero_point": 3} if type_ != "float32" else {}
        t = [Tensor("x", type_, list(shape), **quant),
             Tensor("begin", "int32", [len(begin)], data=np.array(begin, np.int32)),
             Tensor("end", "int32", [len(end)], data=np.array(end, np.int32)),
             Tensor("strides", "int32", [len(strides)], data=np.array(strides, np.int32)),
             Tensor("y", type_, list(out_shape), **quant)]
        return single_op("STRIDED_SLICE", t, [0, 1, 2, 3], [4], ("StridedSliceOptions", masks))
    return make


# x[1:2, ..., 1:4:2] on [2, 3, 4, 5]
strided_slice_ellipsis = _strided_slice([2, 3, 4, 5], [1, 0, 1], [2, 0, 4], [1, 1, 2], [1, 3, 4, 2],
                                        EllipsisMask=2)
# x[1, None, -3:] on [2, 3, 4]: shrink, a new axis, and an implicit trailing ellipsis
strided_slice_new_axis = _strided_slice([2, 3, 4], [1, 0, -3], [0, 0, 0], [1, 1, 1], [1, 3, 4], "int8",
                                        NewAxisMask=2, ShrinkAxisMask=1, EndMask=4)
# x[..., None, ::-2, None] on [2, 3, 5]
strided_slice_ellipsis_new_axes = _strided_slice([2, 3, 5], [0, 0, 0, 0], [0, 0, 0, 0], [1, 1, -2, 1],
                                                 [2, 3, 1, 3, 1], "uint8", EllipsisMask=1, NewAxisMask=10,
                                                 BeginMask=4, EndMask=4)


# x[1:1+2, 5:5-4:-1] with end relative to begin (offset); the shrunk axis ignores its end
strided_slice_offset = _strided_slice([4, 6], [1, 5], [2, -4], [1, -1], [2, 4], Offset=True)
strided_slice_offset_shrink = _strided_slice([4, 6, 3], [-3, 1, 0], [2, 3, 0], [1, 2, 1], [2, 2],
                                             Offset=True, ShrinkAxisMask=4)


def rank() -> bytes:
    t = [Tensor("x", "float32", [2, 3, 4]), Tensor("r", "int32", [])]
    return single_op("RANK", t, [0], [1])


def gather_scalar_index() -> bytes:
    t = [Tensor("x", "float32", [4, 3, 2]),
         Tensor("i", "int32", [], data=np.array(2, np.int32)),
         Tensor("y", "float32", [4, 2])]
    return single_op("GATHER", t, [0, 1], [2], ("GatherOptions", {"Axis": 1}))


def concatenation_relu6() -> bytes:
    t = [Tensor("a", "float32", [1, 2, 3]), Tensor("b", "float32", [1, 2, 2]), Tensor("y", "float32", [1, 2, 5])]
    return single_op("CONCATENATION", t, [0, 1], [2],
                     ("ConcatenationOptions", {"Axis": 2, "FusedActivationFunction": 3}))


def leaky_relu_float() -> bytes:
    t = [Tensor("x", "float32", [3, 4]), Tensor("y", "float32", [3, 4])]
    return single_op("LEAKY_RELU", t, [0], [1], ("LeakyReluOptions", {"Alpha": 0.2}))


def squared_difference() -> bytes:
    t = [Tensor("a", "float32", [2, 3]), Tensor("b", "float32", [3]), Tensor("y", "float32", [2, 3])]
    return single_op("SQUARED_DIFFERENCE", t, [0, 1], [2])


def split_v() -> bytes:
    t = [Tensor("x", "float32", [2, 7]),
         Tensor("sizes", "int32", [3], data=np.array([2, -1, 1], np.int32)),
         Tensor("axis", "int32", [], data=np.array(1, np.int32)),
         Tensor("y0", "float32", [2, 2]), Tensor("y1", "float32", [2, 4]), Tensor("y2", "float32", [2, 1])]
    return single_op("SPLIT_V", t, [0, 1, 2], [3, 4, 5], ("SplitVOptions", {"NumSplits": 3}))


def unpack() -> bytes:
    t = [Tensor("x", "float32", [2, 3, 4]), Tensor("y0", "float32", [2, 4]), Tensor("y1", "float32", [2, 4]),
         Tensor("y2", "float32", [2, 4])]
    return single_op("UNPACK", t, [0], [1, 2, 3], ("UnpackOptions", {"Num": 3, "Axis": 1}))


def batch_to_space_crops() -> bytes:
    t = [Tensor("x", "float32", [4, 3, 3, 2]),
         Tensor("block", "int32", [2], data=np.array([2, 2], np.int32)),
         Tensor("crops", "int32", [2, 2], data=np.array([[1, 0], [0, 2]], np.int32)),
         Tensor("y", "float32", [1, 5, 4, 2])]
    return single_op("BATCH_TO_SPACE_ND", t, [0, 1, 2], [3])


def conv_int8_per_channel() -> bytes:
    rng = _rng()
    w = rng.uniform(-1, 1, (4, 3, 3, 3)).astype(np.float32)
    scales = (np.abs(w).reshape(4, -1).max(axis=1) / 127).astype(np.float32)
    x_scale = 0.02
    t = [Tensor("x", "int8", [1, 6, 6, 3], scale=x_scale, zero_point=-1),
         Tensor("w", "int8", [4, 3, 3, 3], data=_q(w, scales, 0, np.int8, axis=0), scale=[float(s) for s in scales],
                zero_point=[0] * 4),
         Tensor("b", "int32", [4], data=np.array([100, -50, 0, 7], np.int32),
                scale=[float(s * x_scale) for s in scales], zero_point=[0] * 4),
         Tensor("y", "int8", [1, 3, 3, 4], scale=0.05, zero_point=3)]
    return single_op("CONV_2D", t, [0, 1, 2], [3],
                     ("Conv2DOptions", {"Padding": 0, "StrideW": 2, "StrideH": 2, "FusedActivationFunction": 3,
                                        "DilationWFactor": 1, "DilationHFactor": 1}))


def depthwise_int8_per_channel() -> bytes:
    rng = _rng()
    w = rng.uniform(-1, 1, (1, 3, 3, 4)).astype(np.float32)
    scales = (np.abs(w).reshape(-1, 4).max(axis=0) / 127).astype(np.float32)
    x_scale = 0.03
    t = [Tensor("x", "int8", [1, 5, 5, 2], scale=x_scale, zero_point=4),
         Tensor("w", "int8", [1, 3, 3, 4], data=_q(w, scales, 0, np.int8, axis=3), scale=[float(s) for s in scales],
                zero_point=[0] * 4, quantized_dimension=3),
         Tensor("b", "int32", [4], data=np.array([10, -20, 30, 0], np.int32),
                scale=[float(s * x_scale) for s in scales], zero_point=[0] * 4),
         Tensor("y", "int8", [1, 5, 5, 4], scale=0.04, zero_point=-2)]
    return single_op("DEPTHWISE_CONV_2D", t, [0, 1, 2], [3],
                     ("DepthwiseConv2DOptions", {"Padding": 0, "StrideW": 1, "StrideH": 1, "DepthMultiplier": 2,
                                                 "DilationWFactor": 1, "DilationHFactor": 1}))


def conv_uint8_valid() -> bytes:
    rng = _rng()
    t = [Tensor("x", "uint8", [1, 5, 5, 2], scale=0.02, zero_point=128),
         Tensor("w", "uint8", [3, 2, 2, 2], data=rng.integers(0, 256, (3, 2, 2, 2)).astype(np.uint8), scale=0.01,
                zero_point=120),
         Tensor("b", "int32", [3], data=np.array([5, -5, 50], np.int32), scale=0.0002),
         Tensor("y", "uint8", [1, 4, 4, 3], scale=0.03, zero_point=100)]
    return single_op("CONV_2D", t, [0, 1, 2], [3],
                     ("Conv2DOptions", {"Padding": 1, "StrideW": 1, "StrideH": 1, "FusedActivationFunction": 1,
                                        "DilationWFactor": 1, "DilationHFactor": 1}))


def hybrid_fully_connected() -> bytes:
    rng = _rng()
    w = rng.uniform(-1, 1, (5, 8)).astype(np.float32)
    scale = float(np.abs(w).max() / 127)
    t = [Tensor("x", "float32", [2, 8]),
         Tensor("w", "int8", [5, 8], data=_q(w, scale, 0, np.int8), scale=scale, zero_point=0),
         Tensor("b", "float32", [5], data=rng.standard_normal(5).astype(np.float32)),
         Tensor("y", "float32", [2, 5])]
    return single_op("FULLY_CONNECTED", t, [0, 1, 2], [3], ("FullyConnectedOptions", {}))


def densify_fully_connected() -> bytes:
    # A 4x6 weight matrix stored as CSR (dim 0 dense, dim 1 sparse) behind DENSIFY.
    dense = np.array([[0, 1.5, 0, 0, -2, 0], [0, 0, 0, 0, 0, 0], [3, 0, 0, 0.5, 0, 1], [0, 0, -1, 0, 0, 0]],
                     np.float32)
    segments, indices, values = [0], [], []
    for row in dense:
        nz = np.nonzero(row)[0]
        indices.extend(int(i) for i in nz)
        values.extend(float(row[i]) for i in nz)
        segments.append(len(indices))
    sparsity = ([0, 1], [], [(0, 4, None, None), (1, 6, segments, indices)])
    t = [Tensor("x", "float32", [3, 6]),
         Tensor("w_sparse", "float32", [4, 6], data=np.array(values, np.float32), sparsity=sparsity),
         Tensor("w", "float32", [4, 6]),
         Tensor("y", "float32", [3, 4])]
    ops = [Operator("DENSIFY", [1], [2]), Operator("FULLY_CONNECTED", [0, 2, -1], [3], ("FullyConnectedOptions", {}))]
    return build(Subgraph(t, ops, [0], [3]))


def if_branches() -> bytes:
    main = Subgraph([Tensor("cond", "bool", [1]), Tensor("a", "float32", [2, 2]), Tensor("b", "float32", [2, 2]),
                     Tensor("y", "float32", [2, 2])],
                    [Operator("IF", [0, 1, 2], [3], ("IfOptions", {"ThenSubgraphIndex": 1, "ElseSubgraphIndex": 2}))],
                    [0, 1, 2], [3])
    then = Subgraph([Tensor("a", "float32", [2, 2]), Tensor("b", "float32", [2, 2]), Tensor("s", "float32", [2, 2])],
                    [Operator("ADD", [0, 1], [2], ("AddOptions", {}))], [0, 1], [2], name="then")
    other = Subgraph([Tensor("a", "float32", [2, 2]), Tensor("b", "float32", [2, 2]), Tensor("p", "float32", [2, 2])],
                     [Operator("MUL", [0, 1], [2], ("MulOptions", {}))], [0, 1], [2], name="else")
    return build(main, then, other)


def softmax_int8() -> bytes:
    t = [Tensor("x", "int8", [2, 10], scale=0.1, zero_point=0), Tensor("y", "int8", [2, 10], scale=1 / 256,
                                                                       zero_point=-128)]
    return single_op("SOFTMAX", t, [0], [1], ("SoftmaxOptions", {"Beta": 1.0}))


def add_uint8_rescale() -> bytes:
    t = [Tensor("a", "uint8", [2, 6], scale=0.05, zero_point=120), Tensor("b", "uint8", [6], scale=0.02,
                                                                          zero_point=10),
         Tensor("y", "uint8", [2, 6], scale=0.06, zero_point=100)]
    return single_op("ADD", t, [0, 1], [2], ("AddOptions", {"FusedActivationFunction": 0}))


def pad_resize_transpose() -> bytes:
    t = [Tensor("x", "float32", [1, 3, 4, 2]),
         Tensor("pads", "int32", [4, 2], data=np.array([[0, 0], [1, 1], [0, 2], [0, 0]], np.int32)),
         Tensor("p", "float32", [1, 5, 6, 2]),
         Tensor("size", "int32", [2], data=np.array([7, 9], np.int32)),
         Tensor("r", "float32", [1, 7, 9, 2]),
         Tensor("perm", "int32", [4], data=np.array([0, 3, 1, 2], np.int32)),
         Tensor("y", "float32", [1, 2, 7, 9])]
    ops = [Operator("PAD", [0, 1], [2]),
           Operator("RESIZE_BILINEAR", [2, 3], [4], ("ResizeBilinearOptions", {"HalfPixelCenters": True})),
           Operator("TRANSPOSE", [4, 5], [6])]
    return build(Subgraph(t, ops, [0], [6]))


def pad_into_convolutions() -> bytes:
    """A spatial PAD (uneven, as the converter writes for SAME with stride 2) read by a
    VALID depthwise convolution (dilation 2) and a VALID convolution (stride 2): folded
    into both convolutions' explicit padding."""
    rng = _rng()
    t = [Tensor("x", "float32", [1, 7, 6, 3]),
         Tensor("pads", "int32", [4, 2], data=np.array([[0, 0], [1, 2], [2, 1], [0, 0]], np.int32)),
         Tensor("p", "float32", [1, 10, 9, 3]),
         Tensor("dw", "float32", [1, 3, 3, 6], data=rng.standard_normal((1, 3, 3, 6)).astype(np.float32)),
         Tensor("db", "float32", [6], data=rng.standard_normal(6).astype(np.float32)),
         Tensor("d", "float32", [1, 6, 5, 6]),
         Tensor("cw", "float32", [4, 3, 3, 3], data=rng.standard_normal((4, 3, 3, 3)).astype(np.float32)),
         Tensor("cb", "float32", [4], data=rng.standard_normal(4).astype(np.float32)),
         Tensor("c", "float32", [1, 4, 4, 4])]
    ops = [Operator("PAD", [0, 1], [2]),
           Operator("DEPTHWISE_CONV_2D", [2, 3, 4], [5],
                    ("DepthwiseConv2DOptions", {"Padding": 1, "StrideW": 1, "StrideH": 1, "DepthMultiplier": 2,
                                                "FusedActivationFunction": 1, "DilationWFactor": 2,
                                                "DilationHFactor": 2})),
           Operator("CONV_2D", [2, 6, 7], [8],
                    ("Conv2DOptions", {"Padding": 1, "StrideW": 2, "StrideH": 2, "FusedActivationFunction": 0,
                                       "DilationWFactor": 1, "DilationHFactor": 1}))]
    return build(Subgraph(t, ops, [0], [5, 8]))


def padv2_into_conv_int8() -> bytes:
    """An int8 PADV2 whose constant is the zero point (real 0) before a VALID per-channel
    convolution: folded; the convolution pads with the zero point too."""
    rng = _rng()
    w = rng.uniform(-1, 1, (4, 3, 3, 3)).astype(np.float32)
    scales = (np.abs(w).reshape(4, -1).max(axis=1) / 127).astype(np.float32)
    x_scale = 0.02
    t = [Tensor("x", "int8", [1, 6, 6, 3], scale=x_scale, zero_point=-5),
         Tensor("pads", "int32", [4, 2], data=np.array([[0, 0], [1, 1], [1, 1], [0, 0]], np.int32)),
         Tensor("value", "int8", [], data=np.array(-5, np.int8), scale=x_scale, zero_point=-5),
         Tensor("p", "int8", [1, 8, 8, 3], scale=x_scale, zero_point=-5),
         Tensor("w", "int8", [4, 3, 3, 3], data=_q(w, scales, 0, np.int8, axis=0), scale=[float(s) for s in scales],
                zero_point=[0] * 4),
         Tensor("b", "int32", [4], data=np.array([100, -50, 0, 7], np.int32),
                scale=[float(s * x_scale) for s in scales], zero_point=[0] * 4),
         Tensor("y", "int8", [1, 6, 6, 4], scale=0.05, zero_point=3)]
    ops = [Operator("PADV2", [0, 1, 2], [3]),
           Operator("CONV_2D", [3, 4, 5], [6],
                    ("Conv2DOptions", {"Padding": 1, "StrideW": 1, "StrideH": 1, "FusedActivationFunction": 0,
                                       "DilationWFactor": 1, "DilationHFactor": 1}))]
    return build(Subgraph(t, ops, [0], [6]))


def pad_kept_for_other_readers() -> bytes:
    """A spatial PAD read by a VALID convolution and by a MAX_POOL_2D, and a PADV2 with a
    non-zero constant before a convolution: neither is folded (the pool needs the padded
    tensor; the constant is not the convolution's zero padding)."""
    rng = _rng()
    t = [Tensor("x", "float32", [1, 5, 5, 2]),
         Tensor("pads", "int32", [4, 2], data=np.array([[0, 0], [1, 1], [1, 1], [0, 0]], np.int32)),
         Tensor("p", "float32", [1, 7, 7, 2]),
         Tensor("w", "float32", [3, 3, 3, 2], data=rng.standard_normal((3, 3, 3, 2)).astype(np.float32)),
         Tensor("b", "float32", [3], data=np.zeros(3, np.float32)),
         Tensor("c", "float32", [1, 5, 5, 3]),
         Tensor("m", "float32", [1, 3, 3, 2]),
         Tensor("one", "float32", [], data=np.array(1.5, np.float32)),
         Tensor("q", "float32", [1, 7, 7, 2]),
         Tensor("e", "float32", [1, 5, 5, 3])]
    conv = ("Conv2DOptions", {"Padding": 1, "StrideW": 1, "StrideH": 1, "FusedActivationFunction": 0,
                              "DilationWFactor": 1, "DilationHFactor": 1})
    ops = [Operator("PAD", [0, 1], [2]),
           Operator("CONV_2D", [2, 3, 4], [5], conv),
           Operator("MAX_POOL_2D", [2], [6], ("Pool2DOptions", {"Padding": 1, "StrideW": 2, "StrideH": 2,
                                                                "FilterWidth": 3, "FilterHeight": 3})),
           Operator("PADV2", [0, 1, 7], [8]),
           Operator("CONV_2D", [8, 3, 4], [9], conv)]
    return build(Subgraph(t, ops, [0], [5, 6, 9]))


def transpose_conv_bias(padding: int, stride: int, kernel: int, size: int, out: int,
                        signature: str | None = None) -> Callable[[], bytes]:
    """MediaPipe's custom Convolution2DTransposeBias (custom options: the raw C struct
    TfLiteTransposeConvParams: padding 1 SAME / 2 VALID, stride_w, stride_h). LiteRT runs
    it through its default XNNPACK delegate. ``signature``: the subgraph is also that
    signature (keys 'image' and 'mask')."""
    def make() -> bytes:
        rng = _rng()
        t = [Tensor("x", "float32", [1, size, size, 3]),
             Tensor("w", "float32", [2, kernel, kernel, 3],
                    data=rng.standard_normal((2, kernel, kernel, 3)).astype(np.float32)),
             Tensor("b", "float32", [2], data=np.array([0.5, -1.25], np.float32)),
             Tensor("y", "float32", [1, out, out, 2])]
        options = np.array([padding, stride, stride], "<i4").tobytes()
        ops = [Operator("CUSTOM", [0, 1, 2], [3], custom="Convolution2DTransposeBias", custom_options=options)]
        if signature is None:
            return build(Subgraph(t, ops, [0], [3]))
        return build(Subgraph(t, ops, [0], [3], name=signature), signatures=[(signature, 0, {"image": 0}, {"mask": 3})])
    return make


def custom_landmarks_to_matrix() -> bytes:
    """A MediaPipe custom operator with no NNAPI meaning (face_landmark_with_attention's
    Landmarks2TransformMatrix): the import refuses it by index and name."""
    t = [Tensor("landmarks", "float32", [1, 468, 3]), Tensor("matrix", "float32", [1, 4, 4])]
    ops = [Operator("CUSTOM", [0], [1], custom="Landmarks2TransformMatrix", custom_options=b"\x00" * 8)]
    return build(Subgraph(t, ops, [0], [1]))


def detection_postprocess(regular: bool = False, per_detection: int = 1, background: bool = True,
                          quantized: bool = False, shapes: bool = True) -> Callable[[], bytes]:
    """SSD's custom TFLite_Detection_PostProcess (FlexBuffer options) on 40 anchors and 3
    classes: model inputs feed the box encodings and class predictions, the anchors are a
    constant. ``quantized``: uint8 encodings, predictions and anchors (the quantized SSD
    models'); ``shapes`` False leaves the outputs' shapes empty, as converters write them."""
    from flatbuffers import flexbuffers

    def make() -> bytes:
        rng = _rng(11)
        anchors_count, classes = 40, 3
        columns = classes + 1 if background else classes
        centers = rng.uniform(0.1, 0.9, (anchors_count, 2))
        sizes = rng.uniform(0.1, 0.4, (anchors_count, 2))
        anchors = np.concatenate([centers, sizes], axis=1).astype(np.float32)
        options = flexbuffers.Dumps({
            "max_detections": 6, "max_classes_per_detection": per_detection, "detections_per_class": 4,
            "use_regular_nms": regular, "nms_score_threshold": 0.3, "nms_iou_threshold": 0.5,
            "num_classes": classes, "y_scale": 10.0, "x_scale": 10.0, "h_scale": 5.0, "w_scale": 5.0})
        slots = 6 * per_detection
        out = [[1, slots, 4], [1, slots], [1, slots], [1]] if shapes else [[], [], [], []]
        if quantized:
            t = [Tensor("boxes", "uint8", [1, anchors_count, 4], scale=0.08, zero_point=128),
                 Tensor("scores", "uint8", [1, anchors_count, columns], scale=1 / 255, zero_point=0),
                 Tensor("anchors", "uint8", [anchors_count, 4], data=_q(anchors, 0.004, 0, np.uint8), scale=0.004,
                        zero_point=0)]
        else:
            t = [Tensor("boxes", "float32", [1, anchors_count, 4]),
                 Tensor("scores", "float32", [1, anchors_count, columns]),
                 Tensor("anchors", "float32", [anchors_count, 4], data=anchors)]
        t += [Tensor(name, "float32", shape) for name, shape in
              zip(["detection_boxes", "detection_classes", "detection_scores", "num_detections"], out, strict=True)]
        ops = [Operator("CUSTOM", [0, 1, 2], [3, 4, 5, 6], custom="TFLite_Detection_PostProcess",
                        custom_options=bytes(options))]
        return build(Subgraph(t, ops, [0, 1], [3, 4, 5, 6]))
    return make


def ssd_head() -> bytes:
    """A tiny SSD: two 1x1 convolutions over an 8x8 feature map give box encodings and
    class scores (LOGISTIC) for 64 anchors, reshaped, then TFLite_Detection_PostProcess.
    nnapi-ort-cpu takes the convolutions, the reference the post-processing."""
    from flatbuffers import flexbuffers

    rng = _rng(5)
    grid = (np.stack(np.meshgrid(np.arange(8), np.arange(8), indexing="ij"), -1).reshape(-1, 2) + 0.5) / 8
    anchors = np.concatenate([grid, np.full((64, 2), 0.2)], axis=1).astype(np.float32)
    options = flexbuffers.Dumps({
        "max_detections": 5, "max_classes_per_detection": 1, "detections_per_class": 5, "use_regular_nms": False,
        "nms_score_threshold": 0.2, "nms_iou_threshold": 0.5, "num_classes": 3, "y_scale": 10.0, "x_scale": 10.0,
        "h_scale": 5.0, "w_scale": 5.0})
    conv = ("Conv2DOptions", {"Padding": 1, "StrideW": 1, "StrideH": 1, "FusedActivationFunction": 0,
                              "DilationWFactor": 1, "DilationHFactor": 1})
    t = [Tensor("image", "float32", [1, 8, 8, 16]),
         Tensor("wb", "float32", [4, 1, 1, 16], data=(rng.standard_normal((4, 1, 1, 16)) * 0.3).astype(np.float32)),
         Tensor("bb", "float32", [4], data=np.zeros(4, np.float32)),
         Tensor("b4", "float32", [1, 8, 8, 4]),
         Tensor("shape", "int32", [3], data=np.array([1, 64, 4], np.int32)),
         Tensor("boxes", "float32", [1, 64, 4]),
         Tensor("wc", "float32", [4, 1, 1, 16], data=rng.standard_normal((4, 1, 1, 16)).astype(np.float32)),
         Tensor("bc", "float32", [4], data=np.array([0.0, -1.0, -1.0, -1.0], np.float32)),
         Tensor("c4", "float32", [1, 8, 8, 4]),
         Tensor("logits", "float32", [1, 64, 4]),
         Tensor("scores", "float32", [1, 64, 4]),
         Tensor("anchors", "float32", [64, 4], data=anchors),
         Tensor("detection_boxes", "float32", [1, 5, 4]), Tensor("detection_classes", "float32", [1, 5]),
         Tensor("detection_scores", "float32", [1, 5]), Tensor("num_detections", "float32", [1])]
    ops = [Operator("CONV_2D", [0, 1, 2], [3], conv), Operator("RESHAPE", [3, 4], [5]),
           Operator("CONV_2D", [0, 6, 7], [8], conv), Operator("RESHAPE", [8, 4], [9]),
           Operator("LOGISTIC", [9], [10]),
           Operator("CUSTOM", [5, 10, 11], [12, 13, 14, 15], custom="TFLite_Detection_PostProcess",
                    custom_options=bytes(options))]
    return build(Subgraph(t, ops, [0], [12, 13, 14, 15]))


def _unary(op: str, type_: str = "float32", shape=(2, 5), options=None, out_scale=None, out_zp=None,
           in_scale=None, in_zp=None) -> Callable[[], bytes]:
    def make() -> bytes:
        t = [Tensor("x", type_, list(shape), scale=in_scale, zero_point=in_zp),
             Tensor("y", type_, list(shape), scale=out_scale, zero_point=out_zp)]
        return single_op(op, t, [0], [1], options)
    return make


def add_n() -> bytes:
    t = [Tensor("a", "float32", [2, 3]), Tensor("b", "float32", [2, 3]), Tensor("c", "float32", [2, 3]),
         Tensor("y", "float32", [2, 3])]
    return single_op("ADD_N", t, [0, 1, 2], [3])


def square() -> bytes:
    return _unary("SQUARE")()


def leaky_relu_int8() -> bytes:
    return _unary("LEAKY_RELU", "int8", (3, 4), ("LeakyReluOptions", {"Alpha": 0.25}), 0.02, -20, 0.03, 5)()


def reduce_max_int8_rescale() -> bytes:
    t = [Tensor("x", "int8", [2, 6, 3], scale=0.05, zero_point=0),
         Tensor("axes", "int32", [1], data=np.array([1], np.int32)),
         Tensor("y", "int8", [2, 3], scale=0.08, zero_point=-7)]
    return single_op("REDUCE_MAX", t, [0, 1], [2], ("ReducerOptions", {"KeepDims": False}))


def grouped_conv() -> bytes:
    rng = _rng()
    t = [Tensor("x", "float32", [1, 5, 5, 4]),
         Tensor("w", "float32", [6, 3, 3, 2], data=rng.standard_normal((6, 3, 3, 2)).astype(np.float32)),
         Tensor("b", "float32", [6], data=rng.standard_normal(6).astype(np.float32)),
         Tensor("y", "float32", [1, 5, 5, 6])]
    return single_op("CONV_2D", t, [0, 1, 2], [3],
                     ("Conv2DOptions", {"Padding": 0, "StrideW": 1, "StrideH": 1, "DilationWFactor": 1,
                                        "DilationHFactor": 1}))


def dynamic_batch_add() -> bytes:
    t = [Tensor("a", "float32", [1, 3], shape_signature=[-1, 3]),
         Tensor("b", "float32", [3], data=np.array([1, 2, 3], np.float32)),
         Tensor("y", "float32", [1, 3], shape_signature=[-1, 3])]
    return single_op("ADD", t, [0, 1], [2], ("AddOptions", {}))


def two_signatures() -> bytes:
    """'scale' (subgraph 0): y = x * 3; 'shift' (subgraph 1): z = w + 1.5 (each signature's
    keys other than its tensors' names)."""
    g0 = Subgraph([Tensor("scale_x", "float32", [2, 3]), Tensor("k", "float32", [1], data=np.array([3], np.float32)),
                   Tensor("scale_y", "float32", [2, 3])], [Operator("MUL", [0, 1], [2])], [0], [2], name="scale")
    g1 = Subgraph([Tensor("shift_w", "float32", [4]), Tensor("b", "float32", [1], data=np.array([1.5], np.float32)),
                   Tensor("shift_z", "float32", [4])], [Operator("ADD", [0, 1], [2])], [0], [2], name="shift")
    return build(g0, g1, signatures=[("scale", 0, {"x": 0}, {"y": 2}), ("shift", 1, {"w": 0}, {"z": 2})])


def fully_connected_dynamic_batch(per_channel: bool) -> bytes:
    """FULLY_CONNECTED on a batch known at run time (shape signature -1): per-channel int8
    weights (a 1x1 CONV_2D between RESHAPEs), or float keeping the input's rank."""
    rng = _rng(11)
    if not per_channel:
        t = [Tensor("x", "float32", [1, 3, 4], shape_signature=[-1, 3, 4]),
             Tensor("w", "float32", [5, 4], data=rng.standard_normal((5, 4)).astype(np.float32)),
             Tensor("b", "float32", [5], data=rng.standard_normal(5).astype(np.float32)),
             Tensor("y", "float32", [1, 3, 5], shape_signature=[-1, 3, 5])]
        return single_op("FULLY_CONNECTED", t, [0, 1, 2], [3], ("FullyConnectedOptions", {"KeepNumDims": True}))
    w = rng.uniform(-1, 1, (6, 10)).astype(np.float32)
    scales = (np.abs(w).max(axis=1) / 127).astype(np.float32)
    bias_scales = (scales * np.float32(0.04)).astype(np.float32)
    t = [Tensor("x", "int8", [1, 10], scale=0.04, zero_point=2, shape_signature=[-1, 10]),
         Tensor("w", "int8", [6, 10], data=_q(w, scales, 0, np.int8, axis=0), scale=[float(v) for v in scales],
                zero_point=[0] * 6),
         Tensor("b", "int32", [6], data=np.round(rng.uniform(-1, 1, 6) / bias_scales).astype(np.int32),
                scale=[float(v) for v in bias_scales], zero_point=[0] * 6),
         Tensor("y", "int8", [1, 6], scale=0.03, zero_point=-4, shape_signature=[-1, 6])]
    return single_op("FULLY_CONNECTED", t, [0, 1, 2], [3], ("FullyConnectedOptions", {}))


def mirror_pad_padv2() -> bytes:
    t = [Tensor("x", "float32", [1, 3, 4, 1]),
         Tensor("pads", "int32", [4, 2], data=np.array([[0, 0], [1, 2], [2, 1], [0, 0]], np.int32)),
         Tensor("m", "float32", [1, 6, 7, 1]),
         Tensor("pads2", "int32", [4, 2], data=np.array([[0, 0], [1, 0], [0, 1], [0, 0]], np.int32)),
         Tensor("value", "float32", [], data=np.array(-3.5, np.float32)),
         Tensor("y", "float32", [1, 7, 8, 1])]
    ops = [Operator("MIRROR_PAD", [0, 1], [2], ("MirrorPadOptions", {"Mode": 1})),
           Operator("PADV2", [2, 3, 4], [5])]
    return build(Subgraph(t, ops, [0], [5]))


def shape_ops() -> bytes:
    t = [Tensor("x", "float32", [4, 4, 2]),
         Tensor("axis", "int32", [], data=np.array(0, np.int32)),
         Tensor("e", "float32", [1, 4, 4, 2]),
         Tensor("s", "float32", [4, 4, 2]),
         Tensor("d", "float32", [1, 4, 4, 2]),
         Tensor("z", "float32", [1, 2, 2, 8]),
         Tensor("y", "float32", [1, 4, 4, 2])]
    ops = [Operator("EXPAND_DIMS", [0, 1], [2]),
           Operator("SQUEEZE", [2], [3], ("SqueezeOptions", {"SqueezeDims": [0]})),
           Operator("RESHAPE", [3], [4], ("ReshapeOptions", {"NewShape": [1, 4, 4, 2]})),
           Operator("SPACE_TO_DEPTH", [4], [5], ("SpaceToDepthOptions", {"BlockSize": 2})),
           Operator("DEPTH_TO_SPACE", [5], [6], ("DepthToSpaceOptions", {"BlockSize": 2}))]
    return build(Subgraph(t, ops, [0], [6]))


def split_pack_arg() -> bytes:
    t = [Tensor("axis", "int32", [], data=np.array(1, np.int32)),
         Tensor("x", "float32", [3, 4]),
         Tensor("a", "float32", [3, 2]), Tensor("b", "float32", [3, 2]),
         Tensor("p", "float32", [2, 3, 2]),
         Tensor("argaxis", "int32", [1], data=np.array([2], np.int32)),
         Tensor("i", "int32", [2, 3]),
         Tensor("k", "int32", [], data=np.array(2, np.int32)),
         Tensor("tv", "float32", [3, 2]), Tensor("ti", "int32", [3, 2])]
    ops = [Operator("SPLIT", [0, 1], [2, 3], ("SplitOptions", {"NumSplits": 2})),
           Operator("PACK", [2, 3], [4], ("PackOptions", {"ValuesCount": 2, "Axis": 0})),
           Operator("ARG_MAX", [4, 5], [6], ("ArgMaxOptions", {"OutputType": 2})),
           Operator("TOPK_V2", [1, 7], [8, 9])]
    return build(Subgraph(t, ops, [1], [6, 8, 9]))


def quantized_activations_uint8() -> bytes:
    t = [Tensor("x", "uint8", [2, 8], scale=0.05, zero_point=128),
         Tensor("s", "uint8", [2, 8], scale=1 / 256, zero_point=0),
         Tensor("t", "uint8", [2, 8], scale=1 / 128, zero_point=128),
         Tensor("r", "uint8", [2, 8], scale=0.05, zero_point=128)]
    ops = [Operator("LOGISTIC", [0], [1]), Operator("TANH", [0], [2]), Operator("RELU6", [0], [3])]
    return build(Subgraph(t, ops, [0], [1, 2, 3]))


def float_activations() -> bytes:
    t = [Tensor("x", "float32", [2, 8]), Tensor("h", "float32", [2, 8]), Tensor("e", "float32", [2, 8]),
         Tensor("l", "float32", [2, 8]), Tensor("n", "float32", [2, 8]), Tensor("q", "float32", [2, 8])]
    ops = [Operator("HARD_SWISH", [0], [1]), Operator("ELU", [0], [2]), Operator("LOG_SOFTMAX", [0], [3]),
           Operator("L2_NORMALIZATION", [0], [4], ("L2NormOptions", {})), Operator("RELU_N1_TO_1", [1], [5])]
    return build(Subgraph(t, ops, [0], [2, 3, 4, 5]))


def transpose_conv() -> bytes:
    rng = _rng()
    t = [Tensor("shape", "int32", [4], data=np.array([1, 8, 8, 3], np.int32)),
         Tensor("w", "float32", [3, 3, 3, 2], data=rng.standard_normal((3, 3, 3, 2)).astype(np.float32)),
         Tensor("x", "float32", [1, 4, 4, 2]),
         Tensor("y", "float32", [1, 8, 8, 3])]
    return single_op("TRANSPOSE_CONV", t, [0, 1, 2], [3], ("TransposeConvOptions", {"Padding": 0, "StrideW": 2,
                                                                                     "StrideH": 2}),
                     model_inputs=[2])


def comparisons_select() -> bytes:
    t = [Tensor("a", "float32", [2, 4]), Tensor("b", "float32", [2, 4]), Tensor("c", "bool", [2, 4]),
         Tensor("y", "float32", [2, 4]), Tensor("m", "float32", [2, 4])]
    ops = [Operator("GREATER", [0, 1], [2]), Operator("SELECT_V2", [2, 0, 1], [3]),
           Operator("MAXIMUM", [0, 1], [4])]
    return build(Subgraph(t, ops, [0, 1], [3, 4]))


def resize_nearest_uint8() -> bytes:
    t = [Tensor("x", "uint8", [1, 3, 3, 2], scale=0.1, zero_point=3),
         Tensor("size", "int32", [2], data=np.array([5, 7], np.int32)),
         Tensor("y", "uint8", [1, 5, 7, 2], scale=0.1, zero_point=3)]
    return single_op("RESIZE_NEAREST_NEIGHBOR", t, [0, 1], [2], ("ResizeNearestNeighborOptions", {}))


def float16_weights_conv() -> bytes:
    rng = _rng()
    t = [Tensor("x", "float32", [1, 4, 4, 3]),
         Tensor("w16", "float16", [2, 1, 1, 3], data=rng.standard_normal((2, 1, 1, 3)).astype(np.float16)),
         Tensor("w", "float32", [2, 1, 1, 3]),
         Tensor("y", "float32", [1, 4, 4, 2]),
         Tensor("b", "float32", [2], data=np.array([0.5, -0.25], np.float32))]
    ops = [Operator("DEQUANTIZE", [1], [2]),
           Operator("CONV_2D", [0, 2, 4], [3], ("Conv2DOptions", {"Padding": 1, "StrideW": 1, "StrideH": 1,
                                                                   "FusedActivationFunction": 2,
                                                                   "DilationWFactor": 1, "DilationHFactor": 1}))]
    return build(Subgraph(t, ops, [0], [3]))


def _lstm_weights(rng, prefix: str, units: int, inputs: int, start: int) -> list[Tensor]:
    """input-to-gate (4), recurrent-to-gate (4) weights, no peepholes, 4 biases."""
    tensors = [Tensor(f"{prefix}_w{g}", "float32", [units, inputs],
                      data=(0.3 * rng.standard_normal((units, inputs))).astype(np.float32)) for g in "ifco"]
    tensors += [Tensor(f"{prefix}_r{g}", "float32", [units, units],
                       data=(0.3 * rng.standard_normal((units, units))).astype(np.float32)) for g in "ifco"]
    tensors += [Tensor(f"{prefix}_b{g}", "float32", [units], data=(0.1 * rng.standard_normal(units)).astype(np.float32))
                for g in "ifco"]
    return tensors


def bidirectional_lstm() -> bytes:
    rng = _rng()
    batch, steps, inputs, units = 1, 5, 3, 4
    t = [Tensor("x", "float32", [batch, steps, inputs])]
    fw = _lstm_weights(rng, "fw", units, inputs, 1)
    bw = _lstm_weights(rng, "bw", units, inputs, 1)
    t += fw + bw
    n = len(t)  # 25
    t += [Tensor("fw_h", "float32", [batch, units], variable=True), Tensor("fw_c", "float32", [batch, units],
                                                                           variable=True),
          Tensor("bw_h", "float32", [batch, units], variable=True), Tensor("bw_c", "float32", [batch, units],
                                                                           variable=True),
          Tensor("y_fw", "float32", [batch, steps, units]), Tensor("y_bw", "float32", [batch, steps, units])]

    def direction(base: int) -> list[int]:
        # 4 input weights, 4 recurrent weights, 3 peepholes (absent), 4 biases, projection (absent)
        return [base + i for i in range(8)] + [-1, -1, -1] + [base + 8 + i for i in range(4)] + [-1, -1]

    inputs_list = [0, *direction(1), *direction(13), n, n + 1, n + 2, n + 3, -1, -1, -1, -1, -1, -1, -1, -1, -1]
    ops = [Operator("BIDIRECTIONAL_SEQUENCE_LSTM", inputs_list, [n + 4, n + 5],
                    ("BidirectionalSequenceLSTMOptions", {"FusedActivationFunction": 4, "MergeOutputs": False,
                                                          "TimeMajor": False}))]
    return build(Subgraph(t, ops, [0], [n + 4, n + 5]))


def bidirectional_rnn() -> bytes:
    rng = _rng()
    batch, steps, inputs, units = 2, 4, 3, 5
    t = [Tensor("x", "float32", [batch, steps, inputs])]
    for prefix in ("fw", "bw"):
        t += [Tensor(f"{prefix}_w", "float32", [units, inputs],
                     data=(0.5 * rng.standard_normal((units, inputs))).astype(np.float32)),
              Tensor(f"{prefix}_r", "float32", [units, units],
                     data=(0.5 * rng.standard_normal((units, units))).astype(np.float32)),
              Tensor(f"{prefix}_b", "float32", [units], data=(0.1 * rng.standard_normal(units)).astype(np.float32)),
              Tensor(f"{prefix}_h", "float32", [batch, units], variable=True)]
    t += [Tensor("y", "float32", [batch, steps, 2 * units])]
    ops = [Operator("BIDIRECTIONAL_SEQUENCE_RNN", [0, 1, 2, 3, 4, 5, 6, 7, 8, -1, -1, -1], [9],
                    ("BidirectionalSequenceRNNOptions", {"FusedActivationFunction": 4, "MergeOutputs": True,
                                                         "TimeMajor": False}))]
    return build(Subgraph(t, ops, [0], [9]))


def sequence_rnn() -> bytes:
    rng = _rng()
    batch, steps, inputs, units = 2, 3, 4, 3
    t = [Tensor("x", "float32", [batch, steps, inputs]),
         Tensor("w", "float32", [units, inputs], data=(0.5 * rng.standard_normal((units, inputs))).astype(np.float32)),
         Tensor("r", "float32", [units, units], data=(0.5 * rng.standard_normal((units, units))).astype(np.float32)),
         Tensor("b", "float32", [units], data=(0.1 * rng.standard_normal(units)).astype(np.float32)),
         Tensor("h", "float32", [batch, units], variable=True),
         Tensor("y", "float32", [batch, steps, units])]
    return single_op("UNIDIRECTIONAL_SEQUENCE_RNN", t, [0, 1, 2, 3, 4], [5],
                     ("SequenceRNNOptions", {"FusedActivationFunction": 1, "TimeMajor": False}), model_inputs=[0])


def misc_float() -> bytes:
    """A chain of one-to-one float operators: SUB / DIV / MUL with fused activations,
    elementwise math, pools, LRN, SLICE, TILE, REVERSE_V2, BATCH_MATMUL, CAST."""
    rng = _rng()
    t = [Tensor("x", "float32", [1, 4, 4, 2]),                                          # 0
         Tensor("c", "float32", [2], data=np.array([0.5, 2.0], np.float32)),            # 1
         Tensor("sub", "float32", [1, 4, 4, 2]),                                         # 2
         Tensor("div", "float32", [1, 4, 4, 2]),                                         # 3
         Tensor("mul", "float32", [1, 4, 4, 2]),                                         # 4
         Tensor("exp", "float32", [1, 4, 4, 2]),                                         # 5
         Tensor("log", "float32", [1, 4, 4, 2]),                                         # 6
         Tensor("avg", "float32", [1, 2, 2, 2]),                                         # 7
         Tensor("l2", "float32", [1, 3, 3, 2]),                                          # 8
         Tensor("lrn", "float32", [1, 4, 4, 2]),                                         # 9
         Tensor("begin", "int32", [4], data=np.array([0, 1, 0, 0], np.int32)),          # 10
         Tensor("size", "int32", [4], data=np.array([1, 2, -1, 2], np.int32)),          # 11
         Tensor("slice", "float32", [1, 2, 4, 2]),                                       # 12
         Tensor("mult", "int32", [4], data=np.array([1, 1, 2, 1], np.int32)),           # 13
         Tensor("tile", "float32", [1, 2, 8, 2]),                                        # 14
         Tensor("raxis", "int32", [1], data=np.array([2], np.int32)),                   # 15
         Tensor("rev", "float32", [1, 2, 8, 2]),                                         # 16
         Tensor("m", "float32", [2, 3], data=rng.standard_normal((2, 3)).astype(np.float32)),  # 17
         Tensor("mm", "float32", [1, 2, 8, 3]),                                          # 18
         Tensor("abs", "float32", [1, 4, 4, 2]),                                         # 19
         Tensor("sqrt", "float32", [1, 4, 4, 2]),                                        # 20
         Tensor("rsqrt", "float32", [1, 4, 4, 2]),                                       # 21
         Tensor("neg", "float32", [1, 4, 4, 2]),                                         # 22
         Tensor("sin", "float32", [1, 4, 4, 2]),                                         # 23
         Tensor("floor", "float32", [1, 4, 4, 2]),                                       # 24
         Tensor("pow", "float32", [1, 4, 4, 2]),                                         # 25
         Tensor("min", "float32", [1, 4, 4, 2]),                                         # 26
         Tensor("cast", "int32", [1, 4, 4, 2]),                                          # 27
         Tensor("mean", "float32", [1, 1, 1, 2]),                                        # 28
         Tensor("axes", "int32", [2], data=np.array([1, 2], np.int32)),                 # 29
         Tensor("sum", "float32", [1, 2]),                                               # 30
         ]
    pool = {"Padding": 1, "StrideW": 2, "StrideH": 2, "FilterWidth": 2, "FilterHeight": 2}
    ops = [Operator("SUB", [0, 1], [2], ("SubOptions", {"FusedActivationFunction": 1})),
           Operator("DIV", [0, 1], [3], ("DivOptions", {"FusedActivationFunction": 2})),
           Operator("MUL", [0, 1], [4], ("MulOptions", {"FusedActivationFunction": 3})),
           Operator("EXP", [0], [5]), Operator("LOG", [5], [6]),
           Operator("AVERAGE_POOL_2D", [0], [7], ("Pool2DOptions", pool)),
           Operator("L2_POOL_2D", [0], [8], ("Pool2DOptions", dict(pool, StrideW=1, StrideH=1))),
           Operator("LOCAL_RESPONSE_NORMALIZATION", [0], [9], ("LocalResponseNormalizationOptions",
                                                                 {"Radius": 1, "Bias": 1.0, "Alpha": 0.5,
                                                                  "Beta": 0.75})),
           Operator("SLICE", [0, 10, 11], [12]), Operator("TILE", [12, 13], [14]),
           Operator("REVERSE_V2", [14, 15], [16]),
           Operator("BATCH_MATMUL", [16, 17], [18], ("BatchMatMulOptions", {})),
           Operator("ABS", [0], [19]), Operator("SQRT", [19], [20]), Operator("RSQRT", [5], [21]),
           Operator("NEG", [0], [22]), Operator("SIN", [0], [23]), Operator("FLOOR", [4], [24]),
           Operator("POW", [19, 1], [25]), Operator("MINIMUM", [0, 22], [26]), Operator("CAST", [4], [27]),
           Operator("MEAN", [0, 29], [28], ("ReducerOptions", {"KeepDims": True})),
           Operator("SUM", [0, 29], [30], ("ReducerOptions", {"KeepDims": False}))]
    outputs = [2, 3, 6, 7, 8, 9, 18, 20, 21, 23, 24, 25, 26, 27, 28, 30]
    return build(Subgraph(t, ops, [0], outputs))


def quantize_dequantize_int8() -> bytes:
    t = [Tensor("x", "float32", [2, 6]), Tensor("q", "int8", [2, 6], scale=0.01, zero_point=4),
         Tensor("y", "float32", [2, 6])]
    return build(Subgraph(t, [Operator("QUANTIZE", [0], [1]), Operator("DEQUANTIZE", [1], [2])], [0], [1, 2]))


def embedding_lookup() -> bytes:
    rng = _rng()
    t = [Tensor("ids", "int32", [3]),
         Tensor("table", "float32", [2, 4], data=rng.standard_normal((2, 4)).astype(np.float32)),
         Tensor("y", "float32", [3, 4])]
    return single_op("EMBEDDING_LOOKUP", t, [0, 1], [2])


def svdf() -> bytes:
    rng = _rng()
    batch, inputs, units, rank, memory = 2, 3, 4, 1, 5
    t = [Tensor("x", "float32", [batch, inputs]),
         Tensor("wf", "float32", [units * rank, inputs], data=rng.standard_normal((units * rank, inputs)).astype(
             np.float32)),
         Tensor("wt", "float32", [units * rank, memory], data=rng.standard_normal((units * rank, memory)).astype(
             np.float32)),
         Tensor("b", "float32", [units], data=rng.standard_normal(units).astype(np.float32)),
         Tensor("state", "float32", [batch, memory * units * rank], variable=True),
         Tensor("y", "float32", [batch, units])]
    return single_op("SVDF", t, [0, 1, 2, 3, 4], [5], ("SVDFOptions", {"Rank": rank, "FusedActivationFunction": 1}),
                     model_inputs=[0])


def rnn_cell() -> bytes:
    rng = _rng()
    batch, inputs, units = 2, 3, 4
    t = [Tensor("x", "float32", [batch, inputs]),
         Tensor("w", "float32", [units, inputs], data=(0.5 * rng.standard_normal((units, inputs))).astype(np.float32)),
         Tensor("r", "float32", [units, units], data=(0.5 * rng.standard_normal((units, units))).astype(np.float32)),
         Tensor("b", "float32", [units], data=(0.1 * rng.standard_normal(units)).astype(np.float32)),
         Tensor("h", "float32", [batch, units], variable=True),
         Tensor("y", "float32", [batch, units])]
    return single_op("RNN", t, [0, 1, 2, 3, 4], [5], ("RNNOptions", {"FusedActivationFunction": 4}),
                     model_inputs=[0])


def lstm_cell() -> bytes:
    rng = _rng()
    batch, inputs, units = 1, 3, 4
    t = [Tensor("x", "float32", [batch, inputs])] + _lstm_weights(rng, "c", units, inputs, 1)
    n = len(t)  # 13
    t += [Tensor("h", "float32", [batch, units], variable=True), Tensor("c", "float32", [batch, units], variable=True),
          Tensor("y", "float32", [batch, units])]
    inputs_list = [0, *range(1, 9), -1, -1, -1, *range(9, 13), -1, -1, n, n + 1, -1, -1, -1, -1]
    return single_op("LSTM", t, inputs_list, [n + 2], ("LSTMOptions", {"FusedActivationFunction": 4,
                                                                       "CellClip": 0.0, "ProjClip": 0.0}),
                     model_inputs=[0])


def add_fused_tanh() -> bytes:
    t = [Tensor("a", "float32", [2, 3]), Tensor("b", "float32", [2, 3]), Tensor("y", "float32", [2, 3])]
    return single_op("ADD", t, [0, 1], [2], ("AddOptions", {"FusedActivationFunction": 4}))


def dequantize_float16_input() -> bytes:
    t = [Tensor("x", "float16", [2, 3]), Tensor("y", "float32", [2, 3])]
    return single_op("DEQUANTIZE", t, [0], [1])


def _hybrid_reference(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    rng = _rng()
    w = rng.uniform(-1, 1, (5, 8)).astype(np.float32)
    scale = float(np.abs(w).max() / 127)
    bias = rng.standard_normal(5).astype(np.float32)
    dequantized = _q(w, scale, 0, np.int8).astype(np.float64) * scale
    return {"y": (feeds["x"].astype(np.float64) @ dequantized.T + bias).astype(np.float32)}


def concatenation_negative_axis() -> bytes:
    """The converter writes axis -1 for a channel concatenation; NNAPI's axis is >= 0."""
    t = [Tensor("a", "float32", [1, 3, 3, 2]), Tensor("b", "float32", [1, 3, 3, 4]),
         Tensor("y", "float32", [1, 3, 3, 6])]
    return single_op("CONCATENATION", t, [0, 1], [2], ("ConcatenationOptions", {"Axis": -1}))


def int32_moves() -> bytes:
    """int32 values moved by operators whose NNAPI operation takes no TENSOR_INT32:
    RESHAPE (to the same NNAPI shape, inserting a size-1 axis, and a real reshape),
    CONCATENATION with a constant, STRIDED_SLICE, TRANSPOSE, SQUEEZE."""
    t = [Tensor("x", "int32", [2, 3]),
         Tensor("flat", "int32", [6]),
         Tensor("c", "int32", [2, 2], data=np.array([[2**31 - 1, -2**31], [70000, -70001]], np.int32)),
         Tensor("cat", "int32", [2, 5]),
         Tensor("begin", "int32", [2], data=np.array([0, 1], np.int32)),
         Tensor("end", "int32", [2], data=np.array([2, 5], np.int32)),
         Tensor("strides", "int32", [2], data=np.array([1, 2], np.int32)),
         Tensor("sliced", "int32", [2, 2]),
         Tensor("perm", "int32", [2], data=np.array([1, 0], np.int32)),
         Tensor("transposed", "int32", [3, 2]),
         Tensor("expanded", "int32", [1, 3, 1, 2]),
         Tensor("squeezed", "int32", [3, 2]),
         Tensor("scalar", "int32", []), Tensor("one", "int32", [1]),
         Tensor("shape1", "int32", [1], data=np.array([1], np.int32))]
    ops = [Operator("RESHAPE", [0], [1], ("ReshapeOptions", {"NewShape": [6]})),
           Operator("CONCATENATION", [0, 2], [3], ("ConcatenationOptions", {"Axis": -1})),
           Operator("STRIDED_SLICE", [3, 4, 5, 6], [7], ("StridedSliceOptions", {})),
           Operator("TRANSPOSE", [0, 8], [9]),
           Operator("RESHAPE", [9], [10], ("ReshapeOptions", {"NewShape": [1, 3, 1, 2]})),
           Operator("SQUEEZE", [10], [11], ("SqueezeOptions", {"SqueezeDims": [0, 2]})),
           Operator("RESHAPE", [12], [13], ("ReshapeOptions", {"NewShape": [1]}))]
    return build(Subgraph(t, ops, [0, 12], [1, 7, 11, 10, 13]))


def _int32_moves_reference(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    x = feeds["x"]
    cat = np.concatenate([x, np.array([[2**31 - 1, -2**31], [70000, -70001]], np.int32)], axis=1)
    return {"flat": x.reshape(6), "sliced": cat[0:2, 1:5:2], "squeezed": x.T, "expanded": x.T.reshape(1, 3, 1, 2),
            "one": feeds["scalar"].reshape(1)}


def int32_concatenations() -> bytes:
    """CONCATENATION of int32 tensors computed at run time with and without constants:
    [x, c, y] on the last axis, [y, y] on the first, and a loop counter's [i] before a
    constant [0, 0] (a SLICE's begin in a Keras loop body)."""
    t = [Tensor("x", "int32", [2, 3]), Tensor("y", "int32", [2, 1]), Tensor("i", "int32", [1]),
         Tensor("c", "int32", [2, 2], data=np.array([[2**31 - 1, -2**31], [70000, -70001]], np.int32)),
         Tensor("zeros", "int32", [2], data=np.array([0, -5], np.int32)),
         Tensor("wide", "int32", [2, 6]), Tensor("tall", "int32", [4, 1]), Tensor("begin", "int32", [3])]
    ops = [Operator("CONCATENATION", [0, 3, 1], [5], ("ConcatenationOptions", {"Axis": -1})),
           Operator("CONCATENATION", [1, 1], [6], ("ConcatenationOptions", {"Axis": 0})),
           Operator("CONCATENATION", [2, 4], [7], ("ConcatenationOptions", {"Axis": 0}))]
    return build(Subgraph(t, ops, [0, 1, 2], [5, 6, 7]))


def _int32_concatenations_reference(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    x, y, i = feeds["x"], feeds["y"], feeds["i"]
    c = np.array([[2**31 - 1, -2**31], [70000, -70001]], np.int32)
    return {"wide": np.concatenate([x, c, y], axis=1), "tall": np.concatenate([y, y]),
            "begin": np.concatenate([i, np.array([0, -5], np.int32)])}


def bool_moves() -> bytes:
    """bool values: CAST to and from bool, RESHAPE and EXPAND_DIMS of a bool tensor."""
    t = [Tensor("x", "int32", [2, 3]), Tensor("b", "bool", [2, 3]), Tensor("r", "bool", [3, 2]),
         Tensor("axis", "int32", [], data=np.array(1, np.int32)), Tensor("e", "bool", [3, 1, 2]),
         Tensor("f", "float32", [3, 1, 2])]
    ops = [Operator("CAST", [0], [1]), Operator("RESHAPE", [1], [2], ("ReshapeOptions", {"NewShape": [3, 2]})),
           Operator("EXPAND_DIMS", [2, 3], [4]), Operator("CAST", [4], [5])]
    return build(Subgraph(t, ops, [0], [2, 5]))


def select_v2_broadcast() -> bytes:
    """SELECT_V2 broadcasting a [2, 1, 4] condition, a [3, 1] tensor and a scalar
    constant to [2, 3, 4] (NNAPI's SELECT takes three tensors of one shape)."""
    t = [Tensor("a", "float32", [2, 1, 4]), Tensor("zero", "float32", [], data=np.array(0, np.float32)),
         Tensor("cond", "bool", [2, 1, 4]), Tensor("v", "float32", [3, 1]),
         Tensor("big", "float32", [], data=np.array(-1e9, np.float32)), Tensor("w", "float32", [2, 3, 4]),
         Tensor("y", "float32", [2, 3, 4]), Tensor("z", "float32", [2, 3, 4])]
    ops = [Operator("GREATER", [0, 1], [2]), Operator("SELECT_V2", [2, 3, 4], [6]),
           Operator("SELECT_V2", [2, 5, 3], [7])]
    return build(Subgraph(t, ops, [0, 3, 5], [6, 7]))


def squared_difference_int8() -> bytes:
    t = [Tensor("a", "int8", [2, 3, 4], scale=0.05, zero_point=3),
         Tensor("b", "int8", [2, 3, 1], scale=0.04, zero_point=-2),
         Tensor("y", "int8", [2, 3, 4], scale=0.1, zero_point=-128)]
    return single_op("SQUARED_DIFFERENCE", t, [0, 1], [2])


def shape_broadcast_to() -> bytes:
    """SHAPE of a static tensor (folded to a constant) read by BROADCAST_TO of a runtime
    [3] tensor, and BROADCAST_TO of a constant, to [2, 3]."""
    t = [Tensor("x", "float32", [2, 3]), Tensor("shape", "int32", [2]), Tensor("v", "float32", [3]),
         Tensor("b", "float32", [2, 3]), Tensor("k", "float32", [1], data=np.array([0.5], np.float32)),
         Tensor("kb", "float32", [2, 3]), Tensor("y", "float32", [2, 3])]
    ops = [Operator("SHAPE", [0], [1], ("ShapeOptions", {"OutType": 2})), Operator("BROADCAST_TO", [2, 1], [3]),
           Operator("BROADCAST_TO", [4, 1], [5]), Operator("ADD", [3, 5], [6], ("AddOptions", {}))]
    return build(Subgraph(t, ops, [0, 2], [6]))


def _scaled_unary(op: str, low: float, high: float, type_: str = "float32", options=None) -> Callable[[], bytes]:
    """A unary operator on [2, 4, 8] values spread over [low, high]: a MUL by a constant
    scales random_inputs' [-1, 1) floats (or the quantized input's range) first."""
    def make() -> bytes:
        mid, half = (high + low) / 2, (high - low) / 2
        if type_ == "float32":
            t = [Tensor("x", "float32", [2, 4, 8]), Tensor("k", "float32", [1], data=np.array([half], np.float32)),
                 Tensor("m", "float32", [1], data=np.array([mid], np.float32)), Tensor("s", "float32", [2, 4, 8]),
                 Tensor("a", "float32", [2, 4, 8]), Tensor("y", "float32", [2, 4, 8])]
            ops = [Operator("MUL", [0, 1], [3], ("MulOptions", {})), Operator("ADD", [3, 2], [4], ("AddOptions", {})),
                   Operator(op, [4], [5], options)]
            return build(Subgraph(t, ops, [0], [5]))
        scale = (high - low) / 255
        t = [Tensor("x", type_, [2, 4, 8], scale=scale, zero_point=max(-128, int(round(-128 - low / scale)))),
             Tensor("y", type_, [2, 4, 8], scale=0.02 if op != "RSQRT" else 0.05, zero_point=-20)]
        return single_op(op, t, [0], [1], options)
    return make


def relu_int8_requantize() -> bytes:
    """int8 RELU and RELU6 whose outputs have another scale than the input (NASNet's, as
    the converter writes them); NNAPI's RELU keeps the scale."""
    t = [Tensor("x", "int8", [2, 4, 8], scale=0.05, zero_point=3),
         Tensor("r", "int8", [2, 4, 8], scale=0.034, zero_point=-128),
         Tensor("r6", "int8", [2, 4, 8], scale=6 / 255, zero_point=-128)]
    return build(Subgraph(t, [Operator("RELU", [0], [1]), Operator("RELU6", [0], [2])], [0], [1, 2]))


def reverse_int8_requantize() -> bytes:
    """int8 REVERSE_V2 whose output has another quantization than its input (the converter
    writes it so in a bidirectional LSTM): LiteRT copies the stored values."""
    t = [Tensor("x", "int8", [2, 5, 3], scale=0.05, zero_point=1),
         Tensor("axis", "int32", [1], data=np.array([1], np.int32)),
         Tensor("y", "int8", [2, 5, 3], scale=0.1, zero_point=-4)]
    return single_op("REVERSE_V2", t, [0, 1], [2])


CASES: dict[str, Case] = {
    "mean_int8_rescale": Case(mean_int8_rescale, "MEAN", 1),
    "mean_uint8_rescale": Case(mean_uint8_rescale, "MEAN", 1),
    "fully_connected_per_channel": Case(fully_connected_per_channel, "per-channel", 1),
    "fully_connected_keep_dims": Case(fully_connected_keep_dims, "keep_num_dims"),
    "quantize_requantize": Case(quantize_requantize, "requantizing", 1),
    "quantize_uint8_to_int8": Case(quantize_uint8_to_int8, "requantizing", 0),
    "strided_slice_shrink": Case(strided_slice_shrink, "shrink"),
    "strided_slice_ellipsis": Case(strided_slice_ellipsis, "ellipsis"),
    "strided_slice_new_axis": Case(strided_slice_new_axis, "new_axis_mask", 0),
    "strided_slice_ellipsis_new_axes": Case(strided_slice_ellipsis_new_axes, "new_axis_mask", 0),
    "rank": Case(rank, "RANK folded", 0),
    "strided_slice_offset": Case(strided_slice_offset, "offset"),
    "strided_slice_offset_shrink": Case(strided_slice_offset_shrink, "offset"),
    "gather_scalar_index": Case(gather_scalar_index, "rank-0"),
    # The schema's fused RELU6 applies; LiteRT's builtin kernel refuses the model and its
    # XNNPACK delegate ignores the activation, so the reference is numpy.
    "concatenation_relu6": Case(concatenation_relu6, "RELU6", reference=lambda f: {
        "y": np.clip(np.concatenate([f["a"], f["b"]], axis=2), 0, 6)}),
    "leaky_relu_float": Case(leaky_relu_float, "PRELU"),
    "squared_difference": Case(squared_difference, "SUB + MUL"),
    "squared_difference_int8": Case(squared_difference_int8, "DEQUANTIZE", 1),
    "concatenation_negative_axis": Case(concatenation_negative_axis, None),
    # random_inputs gives int32 in {0, 1}: tests/test_tflite_import.py feeds the full range too
    "int32_moves": Case(int32_moves, "high and low 16 bits", 0, reference=_int32_moves_reference),
    "int32_concatenations": Case(int32_concatenations, "GATHERed into the output's shape", 0,
                                 reference=_int32_concatenations_reference),
    "bool_moves": Case(bool_moves, "TENSOR_BOOL8", 0),
    "select_v2_broadcast": Case(select_v2_broadcast, "SELECT_V2 broadcasting"),
    "reverse_int8_requantize": Case(reverse_int8_requantize, "stored values", 0),
    "relu_int8_requantize": Case(relu_int8_requantize, "requantizing RELU", 1),
    "shape_broadcast_to": Case(shape_broadcast_to, "SHAPE of a static shape folded"),
    "gelu": Case(_scaled_unary("GELU", -6, 6, options=("GeluOptions", {"Approximate": False})), "erf form", 1e-6),
    "gelu_approximate": Case(_scaled_unary("GELU", -6, 6, options=("GeluOptions", {"Approximate": True})),
                             "tanh form", 1e-6),
    "gelu_int8": Case(_scaled_unary("GELU", -4, 4, "int8", ("GeluOptions", {"Approximate": False})), "quantized GELU",
                      1),
    # the int8 input's zero point is its lowest value: rsqrt(0) saturates, as in LiteRT
    "rsqrt_int8": Case(_scaled_unary("RSQRT", 0.0, 4, "int8"), "quantized RSQRT", 1),
    "ceil": Case(_scaled_unary("CEIL", -3, 3), "CEIL as NEG, FLOOR, NEG", 0),
    "relu_0_to_1": Case(_scaled_unary("RELU_0_TO_1", -2, 2), "RELU_0_TO_1", 0),
    "relu_0_to_1_int8": Case(_scaled_unary("RELU_0_TO_1", -2, 2, "int8"), "RELU_0_TO_1", 0),
    "split_v": Case(split_v, "SLICE"),
    "unpack": Case(unpack, "SPLIT"),
    "batch_to_space_crops": Case(batch_to_space_crops, "crops"),
    "conv_int8_per_channel": Case(conv_int8_per_channel, None, 1),
    "depthwise_int8_per_channel": Case(depthwise_int8_per_channel, None, 1),
    "conv_uint8_valid": Case(conv_uint8_valid, None, 1),
    # LiteRT's hybrid kernel quantizes the input on the fly; nnapi (like TFLite's NNAPI
    # delegate) dequantizes the weights once and computes in float: compared with numpy.
    "hybrid_fully_connected": Case(hybrid_fully_connected, "hybrid", reference=_hybrid_reference),
    "densify_fully_connected": Case(densify_fully_connected, "densified"),
    "if_branches": Case(if_branches, None),
    "softmax_int8": Case(softmax_int8, None, 1),
    "add_uint8_rescale": Case(add_uint8_rescale, None, 1),
    "pad_resize_transpose": Case(pad_resize_transpose, None),
    "pad_into_convolutions": Case(pad_into_convolutions, "folded into the explicit padding"),
    "padv2_into_conv_int8": Case(padv2_into_conv_int8, "folded into the explicit padding", 1),
    "pad_kept_for_other_readers": Case(pad_kept_for_other_readers, None),
    "ssd_head": Case(ssd_head, "DETECTION_POSTPROCESSING"),
    "detection_postprocess_fast": Case(detection_postprocess(), "DETECTION_POSTPROCESSING"),
    "detection_postprocess_fast_two_classes_no_shapes": Case(
        detection_postprocess(per_detection=2, shapes=False), "DETECTION_POSTPROCESSING"),
    "detection_postprocess_regular": Case(detection_postprocess(regular=True), "DETECTION_POSTPROCESSING"),
    "detection_postprocess_no_background": Case(detection_postprocess(background=False), "background column"),
    "detection_postprocess_uint8": Case(detection_postprocess(quantized=True), "DETECTION_POSTPROCESSING"),
    "transpose_conv_bias_same": Case(transpose_conv_bias(1, 2, 3, 5, 10), "Convolution2DTransposeBias"),
    "transpose_conv_bias_valid": Case(transpose_conv_bias(2, 2, 3, 4, 9), "Convolution2DTransposeBias"),
    "transpose_conv_bias_same_stride_3": Case(transpose_conv_bias(1, 3, 4, 4, 12), "Convolution2DTransposeBias"),
    "add_n": Case(add_n, "ADD_N"),
    "square": Case(square, "SQUARE"),
    "leaky_relu_int8": Case(leaky_relu_int8, "PRELU", 1),
    "grouped_conv": Case(grouped_conv, "GROUPED_CONV_2D"),
    "dynamic_batch_add": Case(dynamic_batch_add, None),
    "mirror_pad_padv2": Case(mirror_pad_padv2, None),
    "shape_ops": Case(shape_ops, None),
    "split_pack_arg": Case(split_pack_arg, "TOPK_V2 of the row reversed"),
    "quantized_activations_uint8": Case(quantized_activations_uint8, None, 1),
    "float_activations": Case(float_activations, None),
    "transpose_conv": Case(transpose_conv, None),
    "comparisons_select": Case(comparisons_select, None),
    "resize_nearest_uint8": Case(resize_nearest_uint8, None, 0),
    "float16_weights_conv": Case(float16_weights_conv, "dequantized at import"),
    "bidirectional_lstm": Case(bidirectional_lstm, None),
    "bidirectional_rnn": Case(bidirectional_rnn, None),
    "sequence_rnn": Case(sequence_rnn, None),
    "misc_float": Case(misc_float, "broadcast to the batch shape", 1e-5),
    "quantize_dequantize_int8": Case(quantize_dequantize_int8, None, 1),
    "embedding_lookup": Case(embedding_lookup, None),
    "svdf": Case(svdf, None),
    "rnn_cell": Case(rnn_cell, None),
    "lstm_cell": Case(lstm_cell, None),
    # LiteRT's ADD kernel has no fused TANH; the schema's meaning is tanh(a + b).
    "add_fused_tanh": Case(add_fused_tanh, "TANH", reference=lambda f: {"y": np.tanh(f["a"] + f["b"])}),
    # TFLite's integer LSTMs: LiteRT's outputs exactly (0 steps), every configuration.
    "lstm_int8": Case(lambda: integer_lstm(sequence=False), "QUANTIZED_LSTM", 0),
    "lstm_int8_projection_hidden_zero_point": Case(
        lambda: integer_lstm(sequence=False, output=5, projection_bias=False, hidden_zero_point=-3),
        "QUANTIZED_LSTM", 0),
    "lstm_int8_peephole_layer_norm": Case(lambda: integer_lstm(sequence=False, peephole=True, layer_norm=True),
                                          "QUANTIZED_LSTM", 0),
    "sequence_lstm_int8": Case(lambda: integer_lstm(sequence=True, steps=4), "unrolled over its 4", 0),
    "sequence_lstm_int8_cifg_layer_norm_projection_clips": Case(
        lambda: integer_lstm(sequence=True, steps=3, layer_norm=True, cifg=True, output=3, cell_clip=3.0,
                             proj_clip=0.5), "unrolled", 0),
    "sequence_lstm_int8_time_major_peephole": Case(
        lambda: integer_lstm(sequence=True, steps=5, time_major=True, layer_norm=True, peephole=True,
                             hidden_zero_point=2), "unrolled", 0),
    "sequence_lstm_int8_unquantized_gate_intermediates": Case(
        lambda: integer_lstm(sequence=True, steps=3, quantized_gates=False), "unrolled", 0),
    "sequence_lstm_int8_one_step": Case(lambda: integer_lstm(sequence=True, steps=1, cifg=True), "unrolled", 0),
    "basic_lstm_uint8": Case(basic_uint8_lstm, "QUANTIZED_16BIT_LSTM", 0),
    "basic_lstm_uint8_wide_input": Case(lambda: basic_uint8_lstm(inputs=6, units=4), "QUANTIZED_16BIT_LSTM", 0),
    "basic_lstm_float": Case(basic_float_lstm, "float BASIC LSTM as LSTM"),
    "basic_lstm_float_wide_input": Case(lambda: basic_float_lstm(inputs=7, units=3, batch=1), "as LSTM"),
    "dequantize_float16_input": Case(dequantize_float16_input, "CAST",
                                     reference=lambda f: {"y": f["x"].astype(np.float32)}),
}


def keras_while_lstm(steps: int = 5, inputs: int = 3, units: int = 4, sequence: bool = True, bias: bool = True,
                     seed: int = 9) -> tuple[bytes, dict[str, np.ndarray]]:
    """Keras 3's LSTM layer as the TFLite converter writes it (batch 1): a WHILE over two
    counters whose body computes one step from FULLY_CONNECTED / ADD / SPLIT / LOGISTIC /
    TANH / MUL and writes h into a [time, 1, units] buffer by SLICE + CONCATENATION at the
    step's index (``sequence``), or keeps the last h as [1, 1, units]. Returns the model
    and its weights (w [4u, in], r [4u, u], b [4u]; gates i, f, c, o)."""
    rng = np.random.default_rng(seed)
    w = rng.uniform(-0.6, 0.6, (4 * units, inputs)).astype(np.float32)
    r = rng.uniform(-0.6, 0.6, (4 * units, units)).astype(np.float32)
    b = rng.uniform(-0.3, 0.3, 4 * units).astype(np.float32) if bias else np.zeros(4 * units, np.float32)
    kept = steps if sequence else 1

    def i32(name: str, values) -> Tensor:
        values = np.asarray(values, np.int32)
        return Tensor(name, "int32", list(values.shape), data=values)

    loop_tensors = [Tensor("t0", "int32", []), Tensor("t1", "int32", []), Tensor("buf", "float32", [kept, 1, units]),
                    Tensor("h", "float32", [1, units]), Tensor("c", "float32", [1, units]),
                    Tensor("x", "float32", [steps, 1, inputs])]
    main = Subgraph([Tensor("x", "float32", [steps, 1, inputs]), i32("zero", 0),
                     Tensor("buf0", "float32", [kept, 1, units], data=np.zeros((kept, 1, units), np.float32)),
                     Tensor("state0", "float32", [1, units], data=np.zeros((1, units), np.float32)),
                     *(Tensor(f"out{k}", v.type, v.shape) for k, v in enumerate(loop_tensors))],
                    [Operator("WHILE", [1, 1, 2, 3, 3, 0], [4, 5, 6, 7, 8, 9],
                              ("WhileOptions", {"CondSubgraphIndex": 1, "BodySubgraphIndex": 2}))], [0], [6])
    cond = Subgraph([*loop_tensors, i32("n", steps), Tensor("a", "bool", []), Tensor("b", "bool", []),
                     Tensor("go", "bool", [])],
                    [Operator("LESS", [0, 6], [7]), Operator("LESS", [1, 6], [8]),
                     Operator("LOGICAL_AND", [7, 8], [9])], [0, 1, 2, 3, 4, 5], [9], name="cond")
    t = [*loop_tensors]

    def add(tensor: Tensor) -> int:
        t.append(tensor)
        return len(t) - 1

    one = add(i32("one", 1))
    f = "float32"
    ops = []

    def op(name: str, ins: list[int], out: Tensor | list[Tensor], options=None) -> int | list[int]:
        outs = [add(o) for o in (out if isinstance(out, list) else [out])]
        ops.append(Operator(name, ins, outs, options))
        return outs if isinstance(out, list) else outs[0]

    t0n = op("ADD", [0, one], Tensor("t0n", "int32", []), ("AddOptions", {}))
    t1n = op("ADD", [1, one], Tensor("t1n", "int32", []), ("AddOptions", {}))
    hr = op("FULLY_CONNECTED", [3, add(Tensor("r", f, [4 * units, units], data=r)), -1],
            Tensor("hr", f, [1, 4 * units]), ("FullyConnectedOptions", {}))
    hr = op("RESHAPE", [hr, add(i32("s", [4 * units]))], Tensor("hr1", f, [4 * units]))
    xt = op("GATHER", [5, 1], Tensor("xt", f, [1, inputs]), ("GatherOptions", {}))
    xw = op("FULLY_CONNECTED", [xt, add(Tensor("w", f, [4 * units, inputs], data=w)), -1],
            Tensor("xw", f, [1, 4 * units]), ("FullyConnectedOptions", {}))
    z = op("ADD", [xw, hr], Tensor("z", f, [1, 4 * units]), ("AddOptions", {}))
    if bias:
        z = op("ADD", [z, add(Tensor("bias", f, [4 * units], data=b))], Tensor("zb", f, [1, 4 * units]),
               ("AddOptions", {}))
    gi, gf, gc, go = op("SPLIT", [one, z], [Tensor(f"g{k}", f, [1, units]) for k in range(4)],
                        ("SplitOptions", {"NumSplits": 4}))
    i_ = op("LOGISTIC", [gi], Tensor("i", f, [1, units]))
    f_ = op("LOGISTIC", [gf], Tensor("f", f, [1, units]))
    fc = op("MUL", [f_, 4], Tensor("fc", f, [1, units]), ("MulOptions", {}))
    o_ = op("LOGISTIC", [go], Tensor("o", f, [1, units]))
    g_ = op("TANH", [gc], Tensor("g", f, [1, units]))
    ig = op("MUL", [i_, g_], Tensor("ig", f, [1, units]), ("MulOptions", {}))
    c_new = op("ADD", [fc, ig], Tensor("c_new", f, [1, units]), ("AddOptions", {}))
    tc = op("TANH", [c_new], Tensor("tc", f, [1, units]))
    h_new = op("MUL", [o_, tc], Tensor("h_new", f, [1, units]), ("MulOptions", {}))
    if sequence:
        one_shape = add(i32("one_shape", [1]))
        size = op("CONCATENATION", [op("RESHAPE", [1, one_shape], Tensor("t1r", "int32", [1])),
                                    add(i32("minus", [-1, -1]))], Tensor("size", "int32", [3]),
                  ("ConcatenationOptions", {"Axis": 0}))
        head = op("SLICE", [2, add(i32("zeros", [0, 0, 0])), size],
                  Tensor("head", f, [1, 1, units], shape_signature=[-1, 1, units]))
        begin = op("CONCATENATION", [op("RESHAPE", [t1n, one_shape], Tensor("t1nr", "int32", [1])),
                                     add(i32("zz", [0, 0]))], Tensor("begin", "int32", [3]),
                   ("ConcatenationOptions", {"Axis": 0}))
        tail = op("SLICE", [2, begin, add(i32("all", [-1, -1, -1]))],
                  Tensor("tail", f, [1, 1, units], shape_signature=[-1, 1, units]))
        h3 = op("RESHAPE", [h_new, add(i32("s3", [1, 1, units]))], Tensor("h3", f, [1, 1, units]))
        buf = op("CONCATENATION", [head, h3, tail], Tensor("buf_new", f, [steps, 1, units]),
                 ("ConcatenationOptions", {"Axis": 0}))
    else:
        buf = op("RESHAPE", [h_new, add(i32("s3", [1, 1, units]))], Tensor("buf_new", f, [1, 1, units]))
    body = Subgraph(t, ops, [0, 1, 2, 3, 4, 5], [t0n, t1n, buf, h_new, c_new, 5], name="body")
    return build(main, cond, body), {"w": w, "r": r, "b": b}


def lstm_reference(x: np.ndarray, w: np.ndarray, r: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Keras's LSTM over a [time, 1, in] sequence in float64: every step's h, [time, 1, units]."""
    units = r.shape[1]
    h, c, out = np.zeros(units), np.zeros(units), []
    for step in x[:, 0].astype(np.float64):
        z = w @ step + r @ h + b
        i, f, g, o = (z[k * units:(k + 1) * units] for k in range(4))
        sig = lambda v: 1 / (1 + np.exp(-v))  # noqa: E731
        c = sig(f) * c + sig(i) * np.tanh(g)
        h = sig(o) * np.tanh(c)
        out.append(h)
    return np.array(out)[:, None, :]


def pose_decoding() -> bytes:
    """A pose head's decoding (MoveNet's): ARG_MAX over a flattened map, the row and column
    by FLOOR_DIV / FLOOR_MOD, PACKed (rank 0 -> [2]) into a GATHER_ND index; GATHER_ND with
    run-time indices of depth 1, 2 and 3 and with constant ones; float FLOOR_DIV."""
    t = [Tensor("heat", "float32", [6, 7]),                                           # 0
         Tensor("flat_shape", "int32", [1], data=np.array([42], np.int32)),           # 1
         Tensor("flat", "float32", [42]),                                              # 2
         Tensor("axis", "int32", [], data=np.array(0, np.int32)),                      # 3
         Tensor("best", "int32", []),                                                  # 4
         Tensor("width", "int32", [], data=np.array(7, np.int32)),                     # 5
         Tensor("row", "int32", []),                                                   # 6
         Tensor("col", "int32", []),                                                   # 7
         Tensor("at", "int32", [2]),                                                   # 8
         Tensor("offsets", "float32", [6, 7, 4]),                                      # 9
         Tensor("at2", "int32", [1, 2]),                                               # 10
         Tensor("offset", "float32", [1, 4]),                                          # 11
         Tensor("idx", "int32", [5, 3]),                                               # 12
         Tensor("cube", "float32", [5, 6, 7]),                                         # 13
         Tensor("picked", "float32", [5]),                                             # 14
         Tensor("rows", "int32", [3, 1]),                                              # 15
         Tensor("picked_rows", "float32", [3, 7]),                                     # 16
         Tensor("const_idx", "int32", [2, 2], data=np.array([[5, 6], [0, 3]], np.int32)),  # 17
         Tensor("const_picked", "float32", [2, 4]),                                    # 18
         Tensor("to_2d", "int32", [2], data=np.array([1, 2], np.int32)),               # 19
         Tensor("a", "float32", [4]),                                                  # 20
         Tensor("b", "float32", [4]),                                                  # 21
         Tensor("fdiv", "float32", [4]),                                               # 22
         Tensor("ia", "int32", [6]),                                                   # 23
         Tensor("ib", "int32", [6]),                                                   # 24
         Tensor("imod", "int32", [6]),                                                 # 25
         Tensor("idiv", "int32", [6])]                                                 # 26
    ops = [Operator("RESHAPE", [0, 1], [2]),
           Operator("ARG_MAX", [2, 3], [4], ("ArgMaxOptions", {"OutputType": 2})),
           Operator("FLOOR_DIV", [4, 5], [6]),
           Operator("FLOOR_MOD", [4, 5], [7]),
           Operator("PACK", [6, 7], [8], ("PackOptions", {"ValuesCount": 2, "Axis": 0})),
           Operator("RESHAPE", [8, 19], [10]),
           Operator("GATHER_ND", [9, 10], [11]),
           Operator("GATHER_ND", [13, 12], [14]),
           Operator("GATHER_ND", [0, 15], [16]),
           Operator("GATHER_ND", [9, 17], [18]),
           Operator("FLOOR_DIV", [20, 21], [22]),
           Operator("FLOOR_MOD", [23, 24], [25]),
           Operator("FLOOR_DIV", [23, 24], [26])]
    return build(Subgraph(t, ops, [0, 9, 12, 13, 15, 20, 21, 23, 24], [6, 7, 8, 11, 14, 16, 18, 22, 25, 26]))


def pose_decoding_reference(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    best = int(np.argmax(feeds["heat"].reshape(-1)))
    row, col = best // 7, best % 7
    idx, rows = feeds["idx"], feeds["rows"]
    return {"row": np.array(row, np.int32), "col": np.array(col, np.int32), "at": np.array([row, col], np.int32),
            "offset": feeds["offsets"][row, col][None],
            "picked": feeds["cube"][idx[:, 0], idx[:, 1], idx[:, 2]],
            "picked_rows": feeds["heat"][rows[:, 0]],
            "const_picked": feeds["offsets"][[5, 0], [6, 3]],
            "fdiv": np.floor(feeds["a"] / feeds["b"]).astype(np.float32),
            "imod": np.mod(feeds["ia"], feeds["ib"]).astype(np.int32),
            "idiv": np.floor_divide(feeds["ia"], feeds["ib"]).astype(np.int32)}


def quantized_div() -> bytes:
    t = [Tensor("a", "int8", [2, 5], scale=0.05, zero_point=-3),
         Tensor("b", "int8", [2, 5], scale=0.02, zero_point=10),
         Tensor("y", "int8", [2, 5], scale=0.1, zero_point=1)]
    return single_op("DIV", t, [0, 1], [2], ("DivOptions", {"FusedActivationFunction": 0}))


def spectrogram(width: int = 12, n: int = 16) -> bytes:
    """tf.signal.stft's spectrum: RFFT2D (fft_length [1, n]) of [frames, 1, width] frames,
    RESHAPE of the complex result, COMPLEX_ABS; REAL and IMAG beside it."""
    bins = n // 2 + 1
    t = [Tensor("frames", "float32", [3, 1, width]),                                  # 0
         Tensor("fft_length", "int32", [2], data=np.array([1, n], np.int32)),         # 1
         Tensor("spectrum", "complex64", [3, 1, bins]),                                # 2
         Tensor("to_2d", "int32", [2], data=np.array([3, bins], np.int32)),            # 3
         Tensor("flat", "complex64", [3, bins]),                                       # 4
         Tensor("magnitude", "float32", [3, bins]),                                    # 5
         Tensor("re", "float32", [3, 1, bins]),                                        # 6
         Tensor("im", "float32", [3, 1, bins])]                                        # 7
    ops = [Operator("RFFT2D", [0, 1], [2]),
           Operator("RESHAPE", [2, 3], [4]),
           Operator("COMPLEX_ABS", [4], [5]),
           Operator("REAL", [2], [6]),
           Operator("IMAG", [2], [7])]
    return build(Subgraph(t, ops, [0], [5, 6, 7]))
