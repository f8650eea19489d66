"""Shared machinery of the convolution and pooling family (CONV_2D, DEPTHWISE_CONV_2D,
GROUPED_CONV_2D, TRANSPOSE_CONV_2D, the 2-D poolings, FULLY_CONNECTED).

- ``SpatialArgs`` reads the scalar arguments these operations share (explicit or
  implicit padding, strides, an operation-specific block such as the depth multiplier,
  the fused activation, the optional NCHW flag and dilation) for validation and
  execution alike.
- ``padded`` / ``window_view`` / ``conv_accumulate`` / ``depthwise_accumulate`` compute
  convolutions through im2col-style strided views and BLAS matrix products.
- ``output_stage`` / ``requantize_accumulators`` reproduce Android's integer output
  stage (int32 accumulators, a fixed-point multiplier and a rounding shift; the
  arithmetic, the multipliers' derivation included, lives in ``quant_math``) so that
  quantized results match its kernels bit for bit.
- This is the reference path, run when shapes are only known at execution;
  ``_conv_fast`` holds the kernels prepared once for static shapes and constant weights.
- ``validate_conv_tensors`` checks the input / filter / bias / output type
  configurations that the convolutions share; ``convolve`` runs one convolution end to
  end (layout, float or quantized arithmetic, bias, fused activation).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from nnapi.codes import FuseCode, OperandCode, OperationCode, PaddingCode
from nnapi.operand import dtype_of
from nnapi.operations.base import ExecutionContext, Tensor, ValidationContext, check_deadline
from nnapi.operations.common import FLOAT_AND_QUANT8_TENSORS as CONV_INPUT_TYPES
from nnapi.operations.common import (
    FLOAT_TENSORS,
    QUANT8_TENSORS,
    activation_bounds_float,
    activation_bounds_quantized,
    from_nhwc,
    implicit_padding,
    is_valid_fuse_code,
)
from nnapi.operations.quant_math import OutputStage, rescale_multipliers

T = OperandCode

# Named input positions shared by the convolutions (Android's conv2d.cpp kInputTensor,
# kFilterTensor, kBiasTensor); their SpatialArgs start at FIRST_ARGUMENT.
INPUT = 0
FILTER = 1
BIAS = 2
FIRST_ARGUMENT = 3

#: float32 sums of integers are exact below this magnitude (24-bit significand)
_FLOAT32_EXACT_LIMIT = 2**24


# --- scalar arguments -----------------------------------------------------------------
@dataclass
class Spatial:
    """The decoded scalar arguments of one convolution or pooling."""

    pad_top: int
    pad_bottom: int
    pad_left: int
    pad_right: int
    stride_h: int
    stride_w: int
    dilation_h: int
    dilation_w: int
    fuse: int
    nchw: bool
    extras: dict[str, int]


class SpatialArgs:
    """The argument list after the tensor inputs: explicit padding (4 ints) or an
    implicit padding code, the strides (width, height), ``extras`` (named ints that
    precede the fused activation), the FuseCode, then the NCHW flag and the dilation
    factors (width, height) where the operation has them.

    ``layout_required``: the NCHW flag is a mandatory input (GROUPED_CONV_2D).
    ``dilation``: the operation accepts the two optional dilation factors.
    """

    def __init__(self, first: int, extras: Sequence[str] = (), layout_required: bool = False,
                 dilation: bool = False):
        self.first = first
        self.extras = tuple(extras)
        self.layout_required = layout_required
        self.dilation = dilation
        self.explicit_base = first + 4 + 2 + len(self.extras) + 1
        self.implicit_base = first + 1 + 2 + len(self.extras) + 1

    def _counts(self, base: int) -> list[int]:
        counts = [] if self.layout_required else [base]
        counts.append(base + 1)
        if self.dilation:
            counts.append(base + 3)
        return counts

    def allowed_counts(self) -> set[int]:
        return set(self._counts(self.explicit_base)) | set(self._counts(self.implicit_base))

    def is_explicit(self, count: int, type_at) -> bool | None:
        """Which form ``count`` inputs are; None when neither. ``type_at(i)`` gives the
        operand type of input i (to tell implicit+dilation from explicit padding)."""
        explicit = count in self._counts(self.explicit_base)
        implicit = count in self._counts(self.implicit_base)
        if explicit and implicit:
            # The input after the implicit form's FuseCode is its layout flag (BOOL);
            # in the explicit form the same position holds an INT32.
            return type_at(self.implicit_base) != T.BOOL
        if explicit:
            return True
        if implicit:
            return False
        return None

    def validate(self, ctx: ValidationContext) -> None:
        count = len(ctx.inputs)
        explicit = self.is_explicit(count, lambda i: ctx.inputs[i].type)
        if explicit is None:
            ctx.fail(f"expected {' or '.join(map(str, sorted(self.allowed_counts())))} inputs, got {count}")
        base = self.explicit_base if explicit else self.implicit_base
        for index in range(self.first, base):
            ctx.check_input_type(index, T.INT32)
        if count > base:
            ctx.check_input_type(base, T.BOOL)
        for index in range(base + 1, count):
            ctx.check_input_type(index, T.INT32)

    def _base(self, ctx: ValidationContext) -> int | None:
        explicit = self.is_explicit(len(ctx.inputs), lambda i: ctx.inputs[i].type)
        return None if explicit is None else self.explicit_base if explicit else self.implicit_base

    def layout(self, ctx: ValidationContext) -> bool | None:
        """At validation: True for NCHW, False for NHWC (or no flag given), None while the
        flag's constant value is not known."""
        base = self._base(ctx)
        if base is None:
            return None
        if len(ctx.inputs) <= base:
            return False
        value = ctx.constant(base)
        return None if value is None else bool(value)

    def extra(self, ctx: ValidationContext, name: str) -> int | None:
        """At validation: the constant value of extra argument ``name`` (the depth
        multiplier, the number of groups), None while it is not known."""
        base = self._base(ctx)
        if base is None:
            return None
        value = ctx.constant(base - 1 - len(self.extras) + self.extras.index(name))
        return None if value is None else int(value)

    def read(self, ctx: ExecutionContext, in_shape: Sequence[int], filter_hw: tuple[int, int] | None) -> Spatial:
        """Decode the arguments; implicit padding needs the input's shape (4-D, in the
        layout the NCHW flag gives) and the filter size (``filter_hw`` None: the filter
        size is the extras' filter_h / filter_w)."""
        count = len(ctx.inputs)
        explicit = self.is_explicit(count, lambda i: ctx.input(i).type)
        base = self.explicit_base if explicit else self.implicit_base
        values = [int(ctx.scalar(i)) for i in range(self.first, base)]
        nchw = bool(ctx.scalar(base)) if count > base and not ctx.is_omitted(base) else False
        in_hw = (in_shape[2], in_shape[3]) if nchw else (in_shape[1], in_shape[2])
        dilation_w = dilation_h = 1
        if count > base + 1:
            ctx.require(not ctx.is_omitted(base + 1) and not ctx.is_omitted(base + 2),
                        "both dilation factors must be given")
            dilation_w, dilation_h = int(ctx.scalar(base + 1)), int(ctx.scalar(base + 2))
        position = 4 if explicit else 1
        stride_w, stride_h = values[position], values[position + 1]
        extras = dict(zip(self.extras, values[position + 2: position + 2 + len(self.extras)], strict=True))
        fuse = values[-1]
        ctx.require(stride_w > 0 and stride_h > 0, f"strides must be positive, got {stride_w}, {stride_h}")
        ctx.require(dilation_w > 0 and dilation_h > 0,
                    f"dilation factors must be positive, got {dilation_w}, {dilation_h}")
        ctx.require(is_valid_fuse_code(fuse), f"invalid fuse code {fuse}")
        if filter_hw is None:
            filter_hw = (extras["filter_h"], extras["filter_w"])
        if explicit:
            left, right, top, bottom = values[:4]
            ctx.require(min(left, right, top, bottom) >= 0,
                        f"padding must be non-negative, got {[left, right, top, bottom]}")
        else:
            scheme = values[0]
            ctx.require(scheme in (PaddingCode.PADDING_SAME, PaddingCode.PADDING_VALID),
                        f"invalid padding scheme {scheme}")
            top, bottom = implicit_padding(in_hw[0], stride_h, filter_hw[0], dilation_h, scheme)
            left, right = implicit_padding(in_hw[1], stride_w, filter_hw[1], dilation_w, scheme)
        return Spatial(top, bottom, left, right, stride_h, stride_w, dilation_h, dilation_w, fuse, nchw, extras)


def spatial_dims(shape: Sequence[int], nchw: bool) -> tuple[int, int, int, int]:
    """(batches, height, width, channels) of a 4-D shape in either layout."""
    if nchw:
        return shape[0], shape[2], shape[3], shape[1]
    return shape[0], shape[1], shape[2], shape[3]


# --- type configurations --------------------------------------------------------------
def validate_conv_tensors(ctx: ValidationContext, channel_dim: int) -> None:
    """Inputs 0 (input), 1 (filter), 2 (bias) and output 0 of a convolution: float32 /
    float16 throughout, or quant8 (signed) input and output with a same-typed or
    per-channel filter and an int32 bias of scale input_scale * filter_scale."""
    ctx.check_input_type(INPUT, CONV_INPUT_TYPES)
    code = ctx.input_type(INPUT)
    if code in FLOAT_TENSORS:
        ctx.check_input_types([code, code], start=FILTER)
    else:
        ctx.check_input_type(FILTER, (code, T.TENSOR_QUANT8_SYMM_PER_CHANNEL))
        ctx.check_input_type(BIAS, T.TENSOR_INT32)
    ctx.check_output_type(0, code)
    ctx.check_input_rank(INPUT, 4)
    ctx.check_input_rank(FILTER, 4)
    ctx.check_input_rank(BIAS, 1)
    if code in QUANT8_TENSORS:
        validate_quantized_weights(ctx, channel_dim)


def check_conv_shapes(ctx: ValidationContext, nchw: bool | None, *, groups: int | None = 1,
                      multiplier: int | None = None) -> None:
    """The declared shapes of a convolution agree: filter depth (x groups) with the input's
    channels, the bias with the filter count, the output's batch and channels with the
    input and the filters. Filters are [count, h, w, depth], or for a depthwise
    convolution (``multiplier`` given) [1, h, w, channels x multiplier]. Unknown
    dimensions (0), an unknown layout or an unknown groups / multiplier skip what they
    need; the check is then made at finish or at execution."""
    if ctx.inputs[INPUT].rank != 4 or ctx.inputs[FILTER].rank != 4:
        return
    channel_axis = None if nchw is None else 1 if nchw else 3
    depthwise = multiplier is not None or ctx.code == OperationCode.DEPTHWISE_CONV_2D
    filters = ctx.dim(FILTER, 3 if depthwise else 0)
    ctx.check_dims_agree("input 2 (bias) size must equal the number of filters", ctx.dim(BIAS, 0), filters)
    ctx.check_dims_agree("output 0 batch must equal input 0 batch", ctx.dim(0, 0, output=True), ctx.dim(INPUT, 0))
    if depthwise and ctx.dim(FILTER, 0) not in (0, 1):
        ctx.fail(f"input 1 (depthwise filter) must have shape [1, height, width, depth_out], "
                 f"got {list(ctx.inputs[FILTER].dimensions)}")
    if groups is not None and groups > 0 and filters and not depthwise and filters % groups:
        ctx.fail(f"{filters} filters do not divide into {groups} groups")
    if channel_axis is None:
        return
    channels = ctx.dim(INPUT, channel_axis)
    if depthwise:
        if multiplier is not None and channels:
            ctx.check_dims_agree(f"input 1 (filter) depth must be input depth {channels} x depth multiplier "
                                 f"{multiplier}", filters, channels * multiplier)
    elif groups is not None and ctx.dim(FILTER, 3):
        ctx.check_dims_agree(f"input 0 depth must equal filter depth {ctx.dim(FILTER, 3)} x {groups} group(s)",
                             channels, ctx.dim(FILTER, 3) * groups)
    if ctx.outputs[0].rank == 4:
        ctx.check_dims_agree("output 0 depth must equal the number of filters",
                             ctx.dim(0, channel_axis, output=True), filters)


def validate_quantized_weights(ctx: ValidationContext, channel_dim: int) -> None:
    """Per-channel filter parameters, or the bias scale of a per-tensor quantized filter."""
    data, weights, bias = ctx.inputs[INPUT], ctx.inputs[FILTER], ctx.inputs[BIAS]
    if weights.type == T.TENSOR_QUANT8_SYMM_PER_CHANNEL:
        params = weights.channel_quant
        if params is None:
            return  # set later; Model.finish validates again
        if params.channel_dim != channel_dim:
            ctx.fail(f"input 1 (per-channel filter) must have channelDim {channel_dim}, got {params.channel_dim}")
        if weights.rank > channel_dim and weights.dimensions[channel_dim] and \
                len(params.scales) != weights.dimensions[channel_dim]:
            ctx.fail(f"input 1 has {weights.dimensions[channel_dim]} channels but {len(params.scales)} scales")
        return
    product = float(np.float32(data.scale) * np.float32(weights.scale))
    # Android's check (GetQuantizedConvolutionMultipler): equal to a relative 1e-6.
    if abs(product - bias.scale) > 1e-6 * min(product, bias.scale):
        ctx.fail(f"input 2 (bias) scale must be input scale * filter scale = {product:g}, got {bias.scale:g}")


# --- strided views --------------------------------------------------------------------
def padded(x: np.ndarray, top: int, bottom: int, left: int, right: int, value=0) -> np.ndarray:
    """``x`` (N, H, W, C) with rows and columns of ``value`` added around H and W."""
    if not (top or bottom or left or right):
        return x
    return np.pad(x, ((0, 0), (top, bottom), (left, right), (0, 0)), constant_values=value)


def window_view(xp: np.ndarray, out_hw: tuple[int, int], kernel_hw: tuple[int, int], strides: tuple[int, int],
                dilations: tuple[int, int]) -> np.ndarray:
    """Read-only (N, OH, OW, KH, KW, C) view of the windows of padded ``xp``."""
    n, _, _, c = xp.shape
    sn, sh, sw, sc = xp.strides
    shape = (n, out_hw[0], out_hw[1], kernel_hw[0], kernel_hw[1], c)
    strides_view = (sn, sh * strides[0], sw * strides[1], sh * dilations[0], sw * dilations[1], sc)
    return np.lib.stride_tricks.as_strided(xp, shape, strides_view, writeable=False)


def tap(xp: np.ndarray, i: int, j: int, out_hw: tuple[int, int], strides: tuple[int, int],
        dilations: tuple[int, int]) -> np.ndarray:
    """The (N, OH, OW, C) slice of padded ``xp`` that kernel tap (i, j) meets."""
    top, left = i * dilations[0], j * dilations[1]
    return xp[:, top: top + strides[0] * (out_hw[0] - 1) + 1: strides[0],
              left: left + strides[1] * (out_hw[1] - 1) + 1: strides[1], :]


#: im2col copies are made a block of output rows at a time, at most this many bytes,
#: so that large images do not need an image-sized column matrix (and blocks stay in cache)
IM2COL_BLOCK_BYTES = 4 << 20


def conv_accumulate(x: np.ndarray, filt: np.ndarray, groups: int, sp: Spatial,
                    out_hw: tuple[int, int]) -> np.ndarray:
    """Sum of products of a (grouped) convolution, in ``x``'s dtype: x (N, H, W, C)
    and filt (OC, KH, KW, C / groups) already zero-point-shifted; the result is
    (N, OH, OW, OC). An im2col copy of the windows and a BLAS product per group, by
    blocks of output rows (a 1x1 stride-1 unpadded convolution needs no copy)."""
    n = x.shape[0]
    oc, kh, kw, cg = filt.shape
    oh, ow = out_hw
    depth = kh * kw * cg
    simple = (kh == kw == 1 and sp.stride_h == sp.stride_w == 1
              and not (sp.pad_top or sp.pad_bottom or sp.pad_left or sp.pad_right))
    if simple and groups == 1:
        return (x.reshape(-1, depth) @ filt.reshape(oc, depth).T).reshape(n, oh, ow, oc)
    if simple:
        windows = x.reshape(n, oh, ow, 1, 1, x.shape[3])
    else:
        xp = padded(x, sp.pad_top, sp.pad_bottom, sp.pad_left, sp.pad_right)
        windows = window_view(xp, out_hw, (kh, kw), (sp.stride_h, sp.stride_w), (sp.dilation_h, sp.dilation_w))
    per_group = oc // groups
    # weights[g]: (depth, per_group), the filters of group g as columns
    weights = np.ascontiguousarray(filt.reshape(groups, per_group, depth).transpose(0, 2, 1))
    out = np.empty((n, oh, ow, oc), dtype=np.result_type(x.dtype, filt.dtype))
    block = max(1, IM2COL_BLOCK_BYTES // max(1, ow * depth * groups * x.itemsize))
    for batch in range(n):
        for top in range(0, oh, block):
            check_deadline()
            bottom = min(top + block, oh)
            rows = (bottom - top) * ow
            if groups == 1:
                cols = windows[batch, top:bottom].reshape(rows, depth)
                np.matmul(cols, weights[0], out=out[batch, top:bottom].reshape(rows, oc))
                continue
            split = windows[batch, top:bottom].reshape(bottom - top, ow, kh, kw, groups, cg)
            cols = np.ascontiguousarray(split.transpose(4, 0, 1, 2, 3, 5)).reshape(groups, rows, depth)
            products = np.matmul(cols, weights)  # (groups, rows, per_group)
            out[batch, top:bottom] = products.transpose(1, 0, 2).reshape(bottom - top, ow, oc)
    return out


def depthwise_accumulate(x: np.ndarray, filt: np.ndarray, multiplier: int, sp: Spatial,
                         out_hw: tuple[int, int]) -> np.ndarray:
    """Sum of products of a depthwise convolution: x (N, H, W, C), filt (KH, KW, C * m),
    both zero-point-shifted, result (N, OH, OW, C * m) in ``x``'s dtype. A loop over the
    kernel taps, each a vectorized multiply-add over the whole output."""
    n, _, _, c = x.shape
    kh, kw, _ = filt.shape
    xp = padded(x, sp.pad_top, sp.pad_bottom, sp.pad_left, sp.pad_right)
    acc = np.zeros((n, out_hw[0], out_hw[1], c, multiplier), dtype=x.dtype)
    product = np.empty_like(acc)
    weights = filt.reshape(kh, kw, c, multiplier)
    for i in range(kh):
        for j in range(kw):
            check_deadline()
            window = tap(xp, i, j, out_hw, (sp.stride_h, sp.stride_w), (sp.dilation_h, sp.dilation_w))
            np.multiply(window[..., None], weights[i, j], out=product)
            acc += product
    return acc.reshape(n, out_hw[0], out_hw[1], c * multiplier)


# --- quantized arithmetic -------------------------------------------------------------
def shifted(tensor: Tensor, dtype) -> np.ndarray:
    """``q - zero_point`` of a quantized tensor (per-channel filters have zero point 0)."""
    values = tensor.value.astype(dtype)
    if tensor.zero_point:
        values -= dtype(tensor.zero_point)
    return values


def exact_float_dtype(bound: float):
    """float32 when every partial sum of integers below ``bound`` is exact in it,
    else float64 (exact up to 2**53): integer convolutions through float BLAS."""
    return np.float32 if bound < _FLOAT32_EXACT_LIMIT else np.float64


def max_abs_shifted(tensor: Tensor) -> int:
    """max |q - zero_point| over a quantized tensor (0 when empty)."""
    if tensor.value.size == 0:
        return 0
    low, high = int(tensor.value.min()), int(tensor.value.max())
    return max(abs(low - tensor.zero_point), abs(high - tensor.zero_point))


def filter_scales(weights: Tensor, channels: int) -> np.ndarray:
    """One float32 scale per output channel: the per-channel scales or the tensor's."""
    if weights.type == T.TENSOR_QUANT8_SYMM_PER_CHANNEL:
        assert weights.channel_quant is not None
        return np.asarray(weights.channel_quant.scales, dtype=np.float32)
    return np.full(channels, weights.scale, dtype=np.float32)


def output_stage(multipliers: np.ndarray, shifts: np.ndarray, output, fuse: int,
                 bias: np.ndarray | None) -> OutputStage:
    """The quantized output stage into ``output`` (its zero point, dtype and the fused
    activation's clamp range)."""
    low, high = activation_bounds_quantized(fuse, output)
    return OutputStage(multipliers, shifts, bias, output.zero_point, low, high, dtype_of(output.type))


def requantize_accumulators(acc: np.ndarray, multipliers: np.ndarray, shifts: np.ndarray, output,
                            fuse: int, bias: np.ndarray | None = None) -> np.ndarray:
    """Android's quantized output stage (``quant_math.OutputStage``) applied once: int32
    accumulators ``acc`` (integers, or floats holding exact integers; channels last) plus
    ``bias``, per-channel ``multipliers`` / ``shifts``, the output zero point and the
    fused activation's clamp, as ``output``'s dtype."""
    return output_stage(multipliers, shifts, output, fuse, bias)(acc)


def quantized_conv_dtype(data: Tensor, weights: Tensor, taps: int):
    """The float dtype in which a quantized convolution's integer sums are exact."""
    bound = taps * max_abs_shifted(data) * max(max_abs_shifted(weights), 1)
    return exact_float_dtype(bound)


# --- the whole convolution ----------------------------------------------------------------
def convolve(ctx: ExecutionContext, sp: Spatial, out_hw: tuple[int, int], accumulate) -> np.ndarray:
    """Run a convolution whose sums of products ``accumulate(x, filt)`` computes from
    the zero-point-shifted NHWC input and filter (both of one float dtype), adding the
    bias, the fused activation and, for quantized outputs, Android's requantization.
    Returns the output in the operation's layout."""
    data, weights, bias = ctx.input(INPUT), ctx.input(FILTER), ctx.input(BIAS)
    output = ctx.output(0)
    channels = bias.shape[0]
    x = np.transpose(data.value, (0, 2, 3, 1)) if sp.nchw else data.value
    if x.shape[0] == 0:
        return from_nhwc(np.zeros((0, out_hw[0], out_hw[1], channels), dtype=dtype_of(output.type)), sp.nchw)
    if data.type in FLOAT_TENSORS:
        # float16 is computed in float32 and rounded once, as Android's kernels do
        acc = accumulate(np.asarray(x, dtype=np.float32), np.asarray(weights.value, dtype=np.float32))
        acc += np.asarray(bias.value, dtype=np.float32)
        if sp.fuse != FuseCode.FUSED_NONE:
            np.clip(acc, *activation_bounds_float(sp.fuse), out=acc)  # in place: the output is large
        return from_nhwc(acc.astype(dtype_of(output.type), copy=False), sp.nchw)
    taps = weights.value.size // max(channels, 1)
    work = quantized_conv_dtype(data, weights, taps)
    shifted_input = x.astype(work)
    if data.zero_point:
        shifted_input -= work(data.zero_point)
    # the float sums are exact integers (see quantized_conv_dtype)
    acc = accumulate(shifted_input, shifted(weights, work))
    multipliers, shifts = rescale_multipliers(data.scale, filter_scales(weights, channels), output.scale)
    return from_nhwc(requantize_accumulators(acc, multipliers, shifts, output, sp.fuse, bias.value), sp.nchw)
