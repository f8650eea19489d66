"""AVERAGE_POOL_2D, MAX_POOL_2D, L2_POOL_2D: 2-D pooling with explicit or implicit
padding, strides, a filter size, a fused activation and the optional NCHW layout.

Padded positions never count: averages divide by the number of real input pixels in
each window (as Android's kernels do). Each pooling is a loop over the filter taps, each
a vectorized reduction step over the whole output. ``plan`` prepares the same
computation once for static shapes (``_PreparedPool``): windows that tile the input
(filter = stride, no padding, more than 16 taps: global averages) reduce a reshaped view
in one call, others pad once; window counts and clamps are computed once. Quantized outputs
share the input's scale and zero point, so averages stay integers: the window sum divided
by the count, rounded half away from zero (TFLite's integer average pool).
"""

from __future__ import annotations

import numpy as np

from nnapi.codes import FuseCode, OperandCode, OperationCode
from nnapi.operand import dtype_of
from nnapi.operations import _jit
from nnapi.operations._conv_common import INPUT, SpatialArgs, padded, spatial_dims, tap
from nnapi.operations.base import (
    ExecutionContext,
    Operation,
    Shape,
    ValidationContext,
    check_deadline,
    register,
)
from nnapi.operations.common import (
    activation_bounds_float,
    activation_bounds_quantized,
    apply_activation_float,
    conv_output_size,
    from_nhwc,
    integer_range,
    layout_shape,
    round_half_away,
)

T = OperandCode
_ARGS = SpatialArgs(first=1, extras=("filter_w", "filter_h"))
_FLOAT = (T.TENSOR_FLOAT32, T.TENSOR_FLOAT16)
_TYPES = {
    OperationCode.AVERAGE_POOL_2D: _FLOAT + (T.TENSOR_QUANT8_ASYMM, T.TENSOR_QUANT8_ASYMM_SIGNED),
    OperationCode.MAX_POOL_2D: _FLOAT + (T.TENSOR_QUANT8_ASYMM, T.TENSOR_QUANT8_ASYMM_SIGNED),
    OperationCode.L2_POOL_2D: _FLOAT,
}


def _window_counts(size: int, out_size: int, stride: int, kernel: int, pad_head: int) -> np.ndarray:
    """How many real (unpadded) input positions each output position's window covers."""
    start = np.arange(out_size) * stride - pad_head
    return np.minimum(start + kernel, size) - np.maximum(start, 0)


@register(OperationCode.AVERAGE_POOL_2D, OperationCode.MAX_POOL_2D, OperationCode.L2_POOL_2D, zero_sized_inputs=True,
          omitted_operands=True)
class Pooling2D(Operation):
    def validate(self, ctx: ValidationContext) -> None:
        ctx.require(len(ctx.outputs) == 1, f"expected 1 output, got {len(ctx.outputs)}")
        ctx.require(len(ctx.inputs) >= 1, f"expected 7, 8, 10 or 11 inputs, got {len(ctx.inputs)}")
        _ARGS.validate(ctx)
        ctx.check_input_type(INPUT, _TYPES[self.code])
        ctx.check_output_type(0, ctx.input_type(INPUT))
        ctx.check_input_rank(INPUT, 4)
        if ctx.input_type(INPUT) not in _FLOAT:
            ctx.check_same_quantization(("input", 0), ("output", 0))

    def _read(self, ctx: ExecutionContext):
        data = ctx.input(INPUT)
        ctx.require(data.rank == 4, f"input 0 must have rank 4, got {data.rank}")
        sp = _ARGS.read(ctx, data.shape, None)
        batches, height, width, channels = spatial_dims(data.shape, sp.nchw)
        fh, fw = sp.extras["filter_h"], sp.extras["filter_w"]
        ctx.require(fh > 0 and fw > 0, f"filter size must be positive, got {fw}x{fh}")
        ctx.require(height > 0 and width > 0 and channels > 0, "only the batch dimension may be zero")
        # A window wholly inside the padding would average nothing (Android refuses it too).
        ctx.require(max(sp.pad_left, sp.pad_right) < fw and max(sp.pad_top, sp.pad_bottom) < fh,
                    "padding must be smaller than the filter")
        padded_h, padded_w = height + sp.pad_top + sp.pad_bottom, width + sp.pad_left + sp.pad_right
        ctx.require(fh <= padded_h and fw <= padded_w,
                    f"filter {fw}x{fh} is larger than the padded input {padded_w}x{padded_h}")
        out_h = conv_output_size(height, fh, sp.stride_h, 1, sp.pad_top, sp.pad_bottom)
        out_w = conv_output_size(width, fw, sp.stride_w, 1, sp.pad_left, sp.pad_right)
        ctx.require(out_h > 0 and out_w > 0, f"output would be {out_h}x{out_w}")
        return sp, (out_h, out_w), layout_shape((batches, out_h, out_w, channels), sp.nchw)

    def prepare(self, ctx: ExecutionContext) -> list[Shape]:
        return [self._read(ctx)[2]]

    def plan(self, ctx: ExecutionContext) -> _PreparedPool:
        sp, out_hw, _ = self._read(ctx)
        return _PreparedPool(self.code, ctx, sp, out_hw)

    def execute(self, ctx: ExecutionContext) -> list[np.ndarray]:
        sp, out_hw, _ = self._read(ctx)
        data, output = ctx.input(INPUT), ctx.output(0)
        x = np.transpose(data.value, (0, 2, 3, 1)) if sp.nchw else data.value
        n, height, width, channels = x.shape
        if n == 0:
            return [from_nhwc(np.zeros((0, *out_hw, channels), dtype=data.value.dtype), sp.nchw)]
        kernel = (sp.extras["filter_h"], sp.extras["filter_w"])
        strides, dilations = (sp.stride_h, sp.stride_w), (1, 1)
        is_float = data.type in _FLOAT
        if self.code == OperationCode.MAX_POOL_2D:
            lowest = -np.inf if is_float else integer_range(data.type)[0]
            xp = padded(x, sp.pad_top, sp.pad_bottom, sp.pad_left, sp.pad_right, lowest)
            result = tap(xp, 0, 0, out_hw, strides, dilations).copy()
            for i in range(kernel[0]):
                check_deadline()  # once per row of taps: a global pool may have thousands
                for j in range(kernel[1]):
                    np.maximum(result, tap(xp, i, j, out_hw, strides, dilations), out=result)
        else:
            # Quantized windows of up to 4096 taps: sums of 8-bit values are exact in float32
            # and a quotient sum / count that is not a half lies at least 1 / (2 * count)
            # from one, far beyond float32's rounding error; larger windows use float64.
            work = np.float32 if is_float or kernel[0] * kernel[1] <= 4096 else np.float64
            values = np.asarray(x, dtype=work)
            if self.code == OperationCode.L2_POOL_2D:
                values = values * values
            xp = padded(values, sp.pad_top, sp.pad_bottom, sp.pad_left, sp.pad_right)
            result = np.zeros((n, *out_hw, channels), dtype=work)
            for i in range(kernel[0]):
                check_deadline()
                for j in range(kernel[1]):
                    result += tap(xp, i, j, out_hw, strides, dilations)
            counts = np.outer(_window_counts(height, out_hw[0], sp.stride_h, kernel[0], sp.pad_top),
                              _window_counts(width, out_hw[1], sp.stride_w, kernel[1], sp.pad_left))
            result /= counts[None, :, :, None].astype(work)
            if self.code == OperationCode.L2_POOL_2D:
                np.sqrt(result, out=result)
            if not is_float:
                # TFLite's integer average rounds halves away from zero
                result = round_half_away(result)
        if is_float:
            result = apply_activation_float(result.astype(np.float32), sp.fuse).astype(data.value.dtype)
        else:
            low, high = activation_bounds_quantized(sp.fuse, output)
            result = np.clip(result, low, high).astype(data.value.dtype)
        return [from_nhwc(result, sp.nchw)]


class _PreparedPool:
    """A pooling with static shapes: what ``Pooling2D.execute`` computes, its constants
    prepared once (the reference path stays ``execute``; tests compare the two)."""

    def __init__(self, code: OperationCode, ctx: ExecutionContext, sp, out_hw: tuple[int, int]) -> None:
        data = ctx.input(INPUT)
        self.code, self.sp, self.out_hw = code, sp, out_hw
        self.dtype = dtype_of(data.type)
        self.kernel = (sp.extras["filter_h"], sp.extras["filter_w"])
        _, height, width, _ = spatial_dims(data.shape, sp.nchw)
        self.is_float = data.type in _FLOAT
        self.pads = (sp.pad_top, sp.pad_bottom, sp.pad_left, sp.pad_right)
        # large windows that tile the input (global pools): one reduction over a
        # (n, oh, fh, ow, fw, c) view; small ones (2x2) are faster as a few whole-array
        # maximum / add passes over strided views than as that 6-D reduction
        self.tiled = (not any(self.pads) and self.kernel == (sp.stride_h, sp.stride_w)
                      and self.kernel[0] * self.kernel[1] > 16)
        # one window over the whole image (a global pool, whatever the strides say)
        self.whole = not any(self.pads) and out_hw == (1, 1) and self.kernel == (height, width)
        if code == OperationCode.MAX_POOL_2D:
            self.work = self.dtype
            self.fill = -np.inf if self.is_float else integer_range(data.type)[0]
        else:
            self.work = np.float32 if self.is_float or self.kernel[0] * self.kernel[1] <= 4096 else np.float64
            self.fill = 0
            counts = np.outer(_window_counts(height, out_hw[0], sp.stride_h, self.kernel[0], sp.pad_top),
                              _window_counts(width, out_hw[1], sp.stride_w, self.kernel[1], sp.pad_left))
            self.counts = counts[None, :, :, None].astype(self.work)
            self._ones = np.ones(self.kernel[0] * self.kernel[1], self.work)
        if self.is_float:
            bounds = activation_bounds_float(sp.fuse)
            self.clamp = None if sp.fuse == FuseCode.FUSED_NONE else bounds
        else:
            self.clamp = activation_bounds_quantized(sp.fuse, ctx.output(0))
        self.compiled = self._compiled_max() if code == OperationCode.MAX_POOL_2D else None
        if code == OperationCode.AVERAGE_POOL_2D and not self.is_float and self.work == np.float32 \
                and self.counts.size and self.counts.min() > 0:
            self.compiled = self._compiled_average()

    def _compiled_max(self):
        """The compiled MAX_POOL_2D (``nnapi[fast]``) bound to this pooling's geometry, as a
        function of the NHWC input and the output; None for float16 or without numba."""
        compiled = _jit.kernels()
        if compiled is None or self.dtype not in (np.float32, np.uint8, np.int8):
            return None
        sp, dtype = self.sp, self.dtype
        geometry = (np.array(self.kernel, np.int64), np.array([sp.stride_h, sp.stride_w], np.int64),
                    np.array([sp.pad_top, sp.pad_left], np.int64))
        low, high = (-np.inf, np.inf) if self.clamp is None else self.clamp
        bounds = (dtype.type(self.fill), dtype.type(max(low, self.fill)),
                  dtype.type(min(high, np.inf if self.is_float else np.iinfo(dtype).max)))
        kernel = compiled.max_pool

        def run(x: np.ndarray, out: np.ndarray) -> None:
            kernel(x, *geometry, *bounds, out)

        if not _jit.warm_up(run, np.zeros((0, 1, 1, 1), dtype), np.empty((0, 1, 1, 1), dtype)):
            return None
        return run

    def _compiled_average(self):
        """The compiled quantized AVERAGE_POOL_2D (``nnapi[fast]``) bound to this pooling's
        geometry, as ``_compiled_max``; None without numba. Only where every window holds
        a tap of the input and the float32 sums are exact (windows of up to 4096 taps)."""
        compiled = _jit.kernels()
        if compiled is None:
            return None
        sp = self.sp
        geometry = (np.array(self.kernel, np.int64), np.array([sp.stride_h, sp.stride_w], np.int64),
                    np.array([sp.pad_top, sp.pad_left], np.int64))
        low, high = (np.float32(bound) for bound in self.clamp)
        kernel = compiled.average_pool_quantized

        def run(x: np.ndarray, out: np.ndarray) -> None:
            kernel(x, *geometry, low, high, out, _jit.scratch((x.shape[3],), np.int32))

        if not _jit.warm_up(run, np.zeros((0, 1, 1, 1), self.dtype), np.empty((0, 1, 1, 1), self.dtype)):
            return None
        return run

    def _padded(self, x: np.ndarray) -> np.ndarray:
        top, bottom, left, right = self.pads
        if not (top or bottom or left or right):
            return x
        n, h, w, c = x.shape
        xp = np.full((n, h + top + bottom, w + left + right, c), self.fill, dtype=x.dtype)
        xp[:, top:top + h, left:left + w] = x
        return xp

    def __call__(self, inputs: list) -> list[np.ndarray]:
        sp = self.sp
        x = np.transpose(inputs[INPUT], (0, 2, 3, 1)) if sp.nchw else inputs[INPUT]
        n, _, _, channels = x.shape
        oh, ow = self.out_hw
        fh, fw = self.kernel
        if n == 0:
            return [from_nhwc(np.zeros((0, oh, ow, channels), dtype=self.dtype), sp.nchw)]
        maximum = self.code == OperationCode.MAX_POOL_2D
        if self.compiled is not None:  # one pass over the input: the deadline checked once, before it
            check_deadline()
            out = np.empty((n, oh, ow, channels), self.dtype)
            self.compiled(_jit.kernel_input(x), out)
            return [from_nhwc(out, sp.nchw)]
        if not maximum:
            x = x.astype(self.work, copy=False)
            if self.code == OperationCode.L2_POOL_2D:
                x = x * x
        if self.whole and not maximum:
            # one window over the whole image: a product with ones (BLAS) sums it; exact for
            # quantized inputs (integers below 2**24 in float32, in any order), to float32
            # rounding for float ones; one pass: the deadline checked once, before it
            check_deadline()
            result = np.matmul(self._ones, x.reshape(n, fh * fw, channels)).reshape(n, 1, 1, channels)
        elif self.tiled:
            windows = x[:, :oh * fh, :ow * fw].reshape(n, oh, fh, ow, fw, channels)
            result = windows.max(axis=(2, 4)) if maximum else windows.sum(axis=(2, 4), dtype=self.work)
        else:
            xp = self._padded(x)
            strides, dilations = (sp.stride_h, sp.stride_w), (1, 1)
            result = tap(xp, 0, 0, self.out_hw, strides, dilations).copy()
            reduce = np.maximum if maximum else np.add
            for i in range(fh):
                check_deadline()
                for j in range(fw):
                    if i or j:
                        reduce(result, tap(xp, i, j, self.out_hw, strides, dilations), out=result)
        if not maximum:
            result /= self.counts
            if self.code == OperationCode.L2_POOL_2D:
                np.sqrt(result, out=result)
            if not self.is_float:
                result = round_half_away(result)
        if self.clamp is not None:
            result = np.clip(result, *self.clamp)
        return [from_nhwc(result.astype(self.dtype, copy=False), sp.nchw)]
