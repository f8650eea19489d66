"""Helpers shared by the operation modules: type groups, quantization math, fused
activations, broadcasting, padding and layouts.

Quantized values follow the spec: real = (q - zero_point) * scale; converting back
rounds to nearest (halves away from zero, as C's round does) and saturates to the
type's range.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from nnapi.codes import FuseCode, OperandCode, PaddingCode
from nnapi.operand import OperandType, dtype_of
from nnapi.operations import quant_math
from nnapi.operations.base import Tensor
from nnapi.operations.quant_math import dequantize, dequantize_per_channel, round_half_away

T = OperandCode

# --- type groups ----------------------------------------------------------------------
FLOAT_TENSORS = (T.TENSOR_FLOAT32, T.TENSOR_FLOAT16)
QUANT8_TENSORS = (T.TENSOR_QUANT8_ASYMM, T.TENSOR_QUANT8_ASYMM_SIGNED)
#: the four types most operations take since feature level 4
FLOAT_AND_QUANT8_TENSORS = (T.TENSOR_FLOAT32, T.TENSOR_FLOAT16, T.TENSOR_QUANT8_ASYMM, T.TENSOR_QUANT8_ASYMM_SIGNED)
#: tensor types whose elements are quantized with a single scale and zero point
ASYMM_QUANT_TYPES = (T.TENSOR_QUANT8_ASYMM, T.TENSOR_QUANT8_ASYMM_SIGNED, T.TENSOR_QUANT16_ASYMM,
                     T.TENSOR_QUANT8_SYMM, T.TENSOR_QUANT16_SYMM)
SCALAR_FOR_TENSOR = {
    T.TENSOR_FLOAT32: T.FLOAT32,
    T.TENSOR_FLOAT16: T.FLOAT16,
    T.TENSOR_INT32: T.INT32,
}

_INTEGER_RANGES = {
    np.dtype(np.uint8): (0, 255),
    np.dtype(np.int8): (-128, 127),
    np.dtype(np.uint16): (0, 65535),
    np.dtype(np.int16): (-32768, 32767),
    np.dtype(np.int32): (-(2**31), 2**31 - 1),
}


def integer_range(code_or_dtype: OperandCode | np.dtype) -> tuple[int, int]:
    dtype = dtype_of(code_or_dtype) if isinstance(code_or_dtype, OperandCode | int) and not isinstance(
        code_or_dtype, np.dtype) else np.dtype(code_or_dtype)
    return _INTEGER_RANGES[dtype]


# --- rounding and (de)quantization (the arithmetic itself: quant_math) ----------------
def saturate_cast(values: np.ndarray, code: OperandCode) -> np.ndarray:
    """Round (if real) and clamp ``values`` to the range of ``code``, in its dtype."""
    dtype = dtype_of(code)
    values = np.asarray(values)
    if values.dtype.kind == "f":
        values = round_half_away(values)
    low, high = _INTEGER_RANGES[dtype]
    return np.clip(values, low, high).astype(dtype)


def dequantize_tensor(tensor: Tensor, dtype=np.float32) -> np.ndarray:
    """Real values of a quantized tensor (per-channel aware), computed exactly in float64
    and rounded once to ``dtype``; float tensors pass through as ``dtype``."""
    value = tensor.value
    if tensor.type == T.TENSOR_QUANT8_SYMM_PER_CHANNEL:
        params = tensor.channel_quant
        assert params is not None
        return dequantize_per_channel(value, params.scales, params.channel_dim, np.float64).astype(dtype)
    if tensor.type in (T.TENSOR_FLOAT32, T.TENSOR_FLOAT16, T.FLOAT32, T.FLOAT16):
        return np.asarray(value, dtype=dtype)
    return dequantize(value, tensor.scale, tensor.zero_point, np.float64).astype(dtype)


def quantize(real: np.ndarray, output: OperandType | Tensor) -> np.ndarray:
    """Quantize real values to ``output``'s type, scale and zero point: round(real / scale
    + zero_point), saturated (Android's convertFloat32ToQuant)."""
    code = output.type
    if code in (T.TENSOR_FLOAT32, T.TENSOR_FLOAT16):
        return np.asarray(real).astype(dtype_of(code))
    rounded = quant_math.quantize(real, output.scale, output.zero_point, round_last=True)
    low, high = _INTEGER_RANGES[dtype_of(code)]  # saturate_cast without rounding the integers again
    if isinstance(rounded, np.ndarray):
        np.clip(rounded, low, high, out=rounded)
        return rounded.astype(dtype_of(code))
    return np.clip(rounded, low, high).astype(dtype_of(code))


# --- fused activations ----------------------------------------------------------------
def activation_bounds_float(fuse: int) -> tuple[float, float]:
    if fuse == FuseCode.FUSED_RELU:
        return 0.0, np.inf
    if fuse == FuseCode.FUSED_RELU1:
        return -1.0, 1.0
    if fuse == FuseCode.FUSED_RELU6:
        return 0.0, 6.0
    return -np.inf, np.inf


def activation_bounds_quantized(fuse: int, output: OperandType | Tensor) -> tuple[int, int]:
    """The clamp range, in quantized units, of a fused activation on ``output``."""
    qmin, qmax = integer_range(output.type)
    low, high = activation_bounds_float(fuse)

    def to_q(x: float) -> int:
        return int(quant_math.quantize_scalar(x, output.scale, output.zero_point))

    if np.isfinite(low):
        qmin = max(qmin, to_q(low))
    if np.isfinite(high):
        qmax = min(qmax, to_q(high))
    return qmin, qmax


def apply_activation_float(x: np.ndarray, fuse: int) -> np.ndarray:
    low, high = activation_bounds_float(fuse)
    if fuse == FuseCode.FUSED_NONE:
        return x
    return np.clip(x, low, high).astype(x.dtype, copy=False)


def quantize_with_activation(real: np.ndarray, output: OperandType | Tensor, fuse: int) -> np.ndarray:
    """Quantize real results to ``output`` and clamp to the fused activation's range."""
    if output.type in (T.TENSOR_FLOAT32, T.TENSOR_FLOAT16):
        return apply_activation_float(np.asarray(real).astype(dtype_of(output.type)), fuse)
    qmin, qmax = activation_bounds_quantized(fuse, output)
    scaled = quant_math.quantize(real, output.scale, output.zero_point)
    return np.clip(scaled, qmin, qmax).astype(dtype_of(output.type))


def is_valid_fuse_code(value: int) -> bool:
    return value in tuple(FuseCode)


# --- shapes ---------------------------------------------------------------------------
def broadcast_shapes(a: Sequence[int], b: Sequence[int]) -> tuple[int, ...] | None:
    """NNAPI broadcasting (trailing dimensions equal or 1); None if incompatible."""
    rank = max(len(a), len(b))
    a = (1,) * (rank - len(a)) + tuple(a)
    b = (1,) * (rank - len(b)) + tuple(b)
    out = []
    for x, y in zip(a, b, strict=True):
        if x == y or y == 1:
            out.append(x)
        elif x == 1:
            out.append(y)
        else:
            return None
    return tuple(out)


def normalize_axis(axis: int, rank: int) -> int | None:
    """``axis`` in [-rank, rank) as a non-negative axis; None when out of range."""
    if -rank <= axis < rank:
        return axis % rank if rank else 0
    return None


# --- padding and spatial layouts ------------------------------------------------------
def implicit_padding(in_size: int, stride: int, filter_size: int, dilation: int,
                     padding: int) -> tuple[int, int]:
    """(head, tail) padding for PADDING_SAME / PADDING_VALID, as the NDK defines them."""
    effective = (filter_size - 1) * dilation + 1
    if padding == PaddingCode.PADDING_SAME:
        out_size = (in_size + stride - 1) // stride
        total = max((out_size - 1) * stride + effective - in_size, 0)
        return total // 2, total - total // 2
    return 0, 0


def transpose_conv_padding(out_size: int, stride: int, filter_size: int, padding: int) -> tuple[int, int]:
    """(head, tail) implicit padding of TRANSPOSE_CONV_2D, computed on its output size: the
    tail fits the last stride exactly and so may be negative."""
    if padding != PaddingCode.PADDING_SAME:
        return 0, 0
    steps = (out_size + stride - 1) // stride
    total = (steps - 1) * stride + filter_size - out_size
    head = total // 2 if total > 0 else 0
    return head, total - head


def resize_scale(in_size: int, out_size: int, align_corners: bool) -> np.float32:
    """The input step per output pixel of RESIZE_BILINEAR / RESIZE_NEAREST_NEIGHBOR, in
    float32 as Android computes it."""
    if align_corners and out_size > 1:
        return np.float32(in_size - 1) / np.float32(out_size - 1)
    return np.float32(in_size) / np.float32(out_size)


def nearest_indexes(in_size: int, out_size: int, align_corners: bool, half_pixel: bool) -> np.ndarray:
    """The input index RESIZE_NEAREST_NEIGHBOR reads for each output position along one axis."""
    scale = resize_scale(in_size, out_size, align_corners)
    position = np.arange(out_size, dtype=np.float32)
    if half_pixel:
        position = position + np.float32(0.5)
    scaled = position * scale
    # roundf rounds halves away from zero; positions are non-negative
    index = np.floor(scaled + np.float32(0.5)) if align_corners else np.floor(scaled)
    index = np.minimum(index.astype(np.int64), in_size - 1)
    return np.maximum(index, 0) if half_pixel else index


def conv_output_size(in_size: int, filter_size: int, stride: int, dilation: int, pad_head: int,
                     pad_tail: int) -> int:
    effective = (filter_size - 1) * dilation + 1
    return (in_size - effective + pad_head + pad_tail + stride) // stride


def to_nhwc(x: np.ndarray, nchw: bool) -> np.ndarray:
    return np.transpose(x, (0, 2, 3, 1)) if nchw else x


def from_nhwc(x: np.ndarray, nchw: bool) -> np.ndarray:
    return np.ascontiguousarray(np.transpose(x, (0, 3, 1, 2))) if nchw else x


def nhwc_shape(shape: Sequence[int], nchw: bool) -> tuple[int, ...]:
    return (shape[0], shape[2], shape[3], shape[1]) if nchw else tuple(shape)


def layout_shape(nhwc: Sequence[int], nchw: bool) -> tuple[int, ...]:
    return (nhwc[0], nhwc[3], nhwc[1], nhwc[2]) if nchw else tuple(nhwc)


# --- GELU as element-wise operations ----------------------------------------------------
#: Abramowitz & Stegun 7.1.26: erfc(z) ~ (a1 t + ... + a5 t^5) exp(-z^2), t = 1 / (1 + p z),
#: z >= 0, absolute error <= 1.5e-7 (float32's own rounding of values near 1 is 6e-8). The
#: TFLite importer writes GELU's erf form with it (NNAPI has no ERF); nnapi-ort-cpu knows
#: the same composite by these constants (drivers/ort/composites.py).
ERFC_P = 0.3275911
ERFC_A = (0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429)
#: GELU's tanh form: x / 2 * (1 + tanh(sqrt(2 / pi) (x + GELU_TANH_CUBIC x^3)))
GELU_TANH_CUBIC = 0.044715
