"""Prepared kernels of CONV_2D, DEPTHWISE_CONV_2D and FULLY_CONNECTED: the optimized path.

An operation's ``plan`` builds one of these once, at preparation, when its shapes are
static and its filter and bias are constants. Everything that depends only on them is
computed there: the filter laid out for the product (zero point subtracted, in the
float dtype in which the integer sums are exact), the bias, the fused activation's
clamp, the per-channel fixed-point output stage (``quant_math.OutputStage``), the
padding and the block size. A call then only pads the input, multiplies and runs the
output stage, block by block of output rows so the temporaries stay in cache.

Quantized CONV_2D and FULLY_CONNECTED run as exact int32 sums of 16-bit products on the
processor's multiply-add where it has AVX2 or AVX-512 BW and ``nnapi[fast]`` is installed
(``_IntegerConv``, ``_numba_igemm``); elsewhere as exact integer-valued float products
through numpy's BLAS.

The reference path (``_conv_common.convolve``) computes the same results from scratch at
every execution; tests compare the two.
"""

from __future__ import annotations

import math
import threading
from typing import TYPE_CHECKING

import numpy as np

from nnapi.codes import FuseCode
from nnapi.codes import OperandCode as T
from nnapi.operand import dtype_of
from nnapi.operations import _jit
from nnapi.operations._conv_common import (
    BIAS,
    FILTER,
    INPUT,
    Spatial,
    exact_float_dtype,
    filter_scales,
    output_stage,
    spatial_dims,
    window_view,
)
from nnapi.operations.base import ExecutionContext, Tensor, check_deadline
from nnapi.operations.common import FLOAT_TENSORS, activation_bounds_float, integer_range
from nnapi.operations.quant_math import rescale_multipliers

if TYPE_CHECKING:
    from nnapi.operations._numba_igemm import Form

#: target size of one block's accumulators (bytes): a block's temporaries stay in cache
_BLOCK_BYTES = 256 << 10
#: the largest im2col block (bytes)
_IM2COL_BYTES = 8 << 20
#: convolutions over at most this many input channels gather their columns transposed
_PLANAR_MAX_CHANNELS = 4
#: the fewest output pixels of one block of a product (when the im2col block allows)
_MIN_BLOCK_PIXELS = 1024
#: the most float32 products one quantized product is split into (else it runs in float64)
_MAX_PARTS = 8
#: depthwise convolutions over fewer channels than this (stride 1 along rows, multiplier
#: 1) run whole rows as one run of pixels x channels (``depthwise_rows_*``): a MobileNet's
#: 112x112x32 3x3 layer in ~0.5x the time of the per-pixel kernel, whose fixed cost per
#: pixel dominates at 32 channels; from 128 channels on the per-pixel kernel is faster
_ROW_CHANNELS = 64
#: the scale of ``_Padder``'s compiled shift (q - zero point, times 1: exact)
_ONE = np.float32(1)


def _input_bound(tensor: Tensor) -> int:
    """max |q - zero_point| over every value the input's type can hold."""
    low, high = integer_range(tensor.type)
    return max(tensor.zero_point - low, high - tensor.zero_point)


class _Epilogue:
    """Bias, fused activation and (quantized) output stage of one output block."""

    def __init__(self, ctx: ExecutionContext, fuse: int, channels: int, work, row: int = 1,
                 parts: bool = False, fused: bool = True) -> None:
        """``row``: the output pixels of one row of a block (blocks are whole rows), over
        which the float bias is tiled once so that adding it runs one numpy loop per row
        rather than one per pixel (``tile_trailing``). ``parts``: accumulators come as
        float32 parts to sum (``finish_parts``; compiled kernels only). ``fused``: the
        compiled output stage where it applies (False: for a compiled kernel that runs
        the stage itself and reads only ``stage``)."""
        data, weights, bias = ctx.input(INPUT), ctx.input(FILTER), ctx.input(BIAS)
        output = ctx.output(0)
        self.dtype = dtype_of(output.type)
        self.quantized = data.type not in FLOAT_TENSORS
        if self.quantized:
            multipliers, shifts = rescale_multipliers(data.scale, filter_scales(weights, channels), output.scale)
            stage = self.stage = output_stage(multipliers, shifts, output, fuse, bias.value)
            compiled = _jit.kernels()
            if fused and compiled is not None and _jit.compilable(stage):
                # float32 products are exact below 2**24 (``_work_dtype``), each part of a split one too
                bound = None if work == np.float64 else 2**24 * (_MAX_PARTS if parts else 1)
                compiled_stage = _jit.FusedOutputStage(stage, compiled, work, channels, parts, bound)
                if compiled_stage.ready:
                    self.stage = compiled_stage
            if fused and self.stage is stage:  # numpy runs it at every call
                stage.prepare()
        else:
            self.bias = np.asarray(bias.value, dtype=np.float32)
            self.bias_row = np.tile(self.bias, row)
            self.clip = activation_bounds_float(fuse) if fuse != FuseCode.FUSED_NONE else None

    def finish_parts(self, parts: np.ndarray, out: np.ndarray) -> None:
        """Write the results of accumulators summed from exact ``parts`` into ``out``."""
        self.stage.sum_parts(parts, out)

    def finish(self, acc: np.ndarray, out: np.ndarray) -> None:
        """Write the results of accumulators ``acc`` into ``out`` (same shape)."""
        if self.quantized:
            self.stage(acc, out)
            return
        if acc.flags.c_contiguous and acc.size % self.bias_row.size == 0:
            rows = acc.reshape(-1, self.bias_row.size)  # a view
            rows += self.bias_row
        else:
            acc += self.bias
        if self.clip is not None:
            np.clip(acc, *self.clip, out=acc)
        if out is not acc:
            out[...] = acc


def _work_dtype(data: Tensor, weights: np.ndarray, channel_axes: tuple[int, ...], zero_point: int = 0):
    """The float dtype of the products: float32 for float tensors; for quantized ones the
    dtype in which every partial sum of (q - zero_point) products is exact. Any partial
    sum of one output's products, in whatever order BLAS adds them, is at most
    max|x - zero_point| times the sum of that output's |filter| values, so the bound is
    taken per output channel (``channel_axes``: the filter axes that index it), much
    tighter than taps * max|w| for real filters. ``weights``: the filter's integers, less
    ``zero_point`` (its stored values and zero point, or values already shifted)."""
    if data.type in FLOAT_TENSORS:
        return np.float32
    if not weights.size:
        return np.float32
    summed = tuple(axis for axis in range(weights.ndim) if axis not in channel_axes)
    taps = math.prod(weights.shape[axis] for axis in summed)
    # taps * max|w| bounds every channel's sum: where that is small enough, no sums are needed
    # (two reductions without a copy; most 1x1 and depthwise filters)
    largest_weight = max(int(weights.max()) - zero_point, zero_point - int(weights.min()))
    if exact_float_dtype(_input_bound(data) * max(taps * largest_weight, 1)) == np.float32:
        return np.float32
    return exact_float_dtype(_sum_bound(data, weights, zero_point, summed))


def _sum_bound(data: Tensor, weights: np.ndarray, zero_point: int, summed: tuple[int, ...]) -> int:
    """A bound on |every partial sum| of a quantized product: max|x - zero_point| times
    the largest sum of one output channel's |w - ``zero_point``| over the ``summed`` axes."""
    taps = math.prod(weights.shape[axis] for axis in summed)
    # magnitudes (at most 2**9) summed in int32 where no sum can overflow it (no wider copy
    # of the filter: fresh pages cost more than the sum)
    sums = _magnitudes(weights, zero_point).sum(axis=summed, dtype=np.int32 if taps < 2**22 else np.int64)
    return _input_bound(data) * max(int(sums.max(initial=0)), 1)


def _magnitudes(weights: np.ndarray, zero_point: int) -> np.ndarray:
    """|w - zero_point| of a filter's integers, exactly, in the narrowest array: int8
    values less 0 as the uint8 bits of their absolute values (|-128| = 128 wraps to the
    bits of 128), unsigned ones as they are, else int16."""
    if not zero_point:
        if weights.dtype == np.int8:
            return np.abs(weights).view(np.uint8)
        if weights.dtype.kind == "u":
            return weights
        return np.abs(weights)
    shifted = np.subtract(weights, zero_point, dtype=np.int16)
    return np.abs(shifted, out=shifted)


def _float_filter(weights: Tensor, work) -> np.ndarray:
    """A filter's (q - zero_point) values in the float dtype ``work`` (float filters as
    they are where already of it): one new array, with no int16 copy on the way (exact:
    |q - zero_point| < 2**9)."""
    if weights.type in FLOAT_TENSORS:
        return np.asarray(weights.value).astype(work, copy=False)
    values = weights.value.astype(work)
    if weights.zero_point:
        values -= work(weights.zero_point)
    return values


def _float32_parts(data: Tensor, columns: np.ndarray) -> list[tuple[int, int]] | None:
    """Where a quantized product too large for exact float32 sums can be split along its
    summed axis into float32 products that are each exact (summed afterwards in int64 by
    the compiled output stage): the [start, stop) ranges of the summed axis, greedy, from
    the bound max|x - zero_point| * (sum of |w| over the range) < 2**24 for every output
    channel; None when that takes more than _MAX_PARTS products or numba is not in use.
    ``columns``: the (q - zero_point) filter, (outputs, summed)."""
    if data.type in FLOAT_TENSORS or _jit.kernels() is None or not columns.size:
        return None
    limit = (2**24 - 1) // _input_bound(data)
    magnitudes = np.abs(columns)  # int16: |w| <= 2**9
    prefix = _block_prefix_sums(magnitudes)
    ranges, start = [], 0
    while start < magnitudes.shape[1]:
        stop = _range_end(magnitudes, prefix, start, limit)
        if stop == start or len(ranges) == _MAX_PARTS:
            return None
        ranges.append((start, stop))
        start = stop
    return ranges if len(ranges) > 1 else None


#: columns per block of ``_block_prefix_sums``
_PREFIX_BLOCK = 64


def _block_prefix_sums(magnitudes: np.ndarray) -> np.ndarray:
    """Each row's sums of ``magnitudes`` (rows, n) before every block boundary 0,
    _PREFIX_BLOCK, 2 * _PREFIX_BLOCK, ..., n, int64 (rows, boundaries): what the greedy
    split needs without a running sum of every element (a full cumsum and its comparisons
    cost several ms and fresh pages for a 1280x1001 filter)."""
    rows, n = magnitudes.shape
    full = n - n % _PREFIX_BLOCK
    blocks = magnitudes[:, :full].reshape(rows, -1, _PREFIX_BLOCK).sum(axis=2, dtype=np.int64)
    if full < n:
        blocks = np.concatenate([blocks, magnitudes[:, full:].sum(axis=1, dtype=np.int64)[:, None]], axis=1)
    prefix = np.zeros((rows, blocks.shape[1] + 1), np.int64)
    np.cumsum(blocks, axis=1, out=prefix[:, 1:])
    return prefix


def _range_end(magnitudes: np.ndarray, prefix: np.ndarray, start: int, limit: int) -> int:
    """The greedy part from column ``start``: the largest stop such that every row's sum of
    ``magnitudes`` over [start, stop) is at most ``limit`` (``start`` when not even one
    column fits). Per row, the last block boundary within the limit bounds its stop to one
    block; the rows whose boundary comes first hold the minimum, found in that block."""
    n = magnitudes.shape[1]
    first = start // _PREFIX_BLOCK
    base = prefix[:, first] + magnitudes[:, first * _PREFIX_BLOCK:start].sum(axis=1, dtype=np.int64)
    ceiling = base + limit
    # prefix sums never decrease along a row: count those within the ceiling
    last = np.count_nonzero(prefix <= ceiling[:, None], axis=1) - 1
    block = int(last.min())
    low = block * _PREFIX_BLOCK
    if low >= n:
        return n
    rows = np.flatnonzero(last == block)
    if low < start:  # the start lies inside that block
        low, below = start, base[rows]
    else:
        below = prefix[rows, block]
    high = min(low - low % _PREFIX_BLOCK + _PREFIX_BLOCK, n)
    sums = below[:, None] + np.cumsum(magnitudes[rows, low:high], axis=1, dtype=np.int64)
    return low + int(np.count_nonzero(sums <= ceiling[rows, None], axis=1).min())


#: ``_exact_matmul``: products of at most this many rows, by a filter of at least this
#: many values, run transposed
_FEW_ROWS, _FEW_ROWS_MIN_WEIGHTS = 64, 1 << 17


def _exact_matmul(cols: np.ndarray, weights: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """``cols @ weights`` for a quantized product, whose sums are exact integers (so any
    order of summation gives the same values), into ``out`` when given. ``weights`` is
    the transposed view of the C-contiguous (outputs, summed) filter. BLAS repacks its
    right operand at every call, and from a transposed one slowly: with few rows (a 7x7
    image's 49 pixels) that repacking is most of the product. Those products run as
    ``weights.T @ cols.T``, the filter being the left operand read as it lies, and the
    (outputs, rows) result is copied transposed: (49, 1024) x (1024, 1024) in 0.70x the
    time, (49, 160) x (160, 960) 0.90x (OPENBLAS_CORETYPE=Cooperlake, one thread; more
    rows or smaller filters gain nothing, so they keep the direct product)."""
    if cols.shape[0] <= _FEW_ROWS and weights.size >= _FEW_ROWS_MIN_WEIGHTS and weights.strides[0] == weights.itemsize:
        transposed = np.matmul(weights.T, cols.T)
        if out is None:
            return np.ascontiguousarray(transposed.T)
        np.copyto(out, transposed.T)
        return out
    return np.matmul(cols, weights) if out is None else np.matmul(cols, weights, out=out)


def _product(cols: np.ndarray, weights: np.ndarray, parts: list[tuple[int, int]] | None, epilogue: _Epilogue,
             target: np.ndarray) -> None:
    """The quantized outputs of ``cols @ weights`` into ``target``: one product, or the
    exact float32 products of the ``parts`` of the summed axis, summed by the output stage."""
    if parts is None:
        epilogue.finish(_exact_matmul(cols, weights), target)
        return
    partial = np.empty((len(parts), cols.shape[0], weights.shape[1]), np.float32)
    for index, (start, stop) in enumerate(parts):
        _exact_matmul(cols[:, start:stop], weights[start:stop], out=partial[index])
    epilogue.finish_parts(partial, target)


def _shifted_weights(weights: Tensor) -> np.ndarray:
    """The filter's (q - zero_point) values (float filters as they are), int16."""
    if weights.type in FLOAT_TENSORS:
        return np.asarray(weights.value)
    shifted = weights.value.astype(np.int16)
    if weights.zero_point:
        shifted -= np.int16(weights.zero_point)
    return shifted


class _Padder:
    """Copies an NHWC input into a padded buffer of the work dtype, zero point subtracted."""

    def __init__(self, data: Tensor, sp: Spatial, work, compiled: bool = False) -> None:
        """``compiled``: unpadded 8-bit inputs go through the compiled kernel (nnapi[fast])."""
        self.pads = (sp.pad_top, sp.pad_bottom, sp.pad_left, sp.pad_right)
        self.work = work
        self.zero = None if data.type in FLOAT_TENSORS else work(data.zero_point)
        self._local = threading.local()
        #: unpadded 8-bit inputs into float32: the compiled one-pass kernel (``_shift``)
        self.shift = None
        if compiled and self.zero is not None and work == np.float32 and not any(self.pads):
            kernel = _jit.dequantize_kernel(data)
            if kernel is not None:
                self.shift, self.flip, self.offset = kernel

    def _shift(self, x: np.ndarray) -> np.ndarray:
        """``x`` less its zero point in float32, in this thread's kept buffer."""
        buffer = getattr(self._local, "buffer", None)
        if buffer is None or buffer.shape != x.shape:
            buffer = self._local.buffer = np.empty(x.shape, np.float32)
        self.shift(_jit.kernel_input(x).reshape(-1).view(np.uint8), self.flip, self.offset, _ONE, buffer.reshape(-1))
        return buffer

    def __call__(self, x: np.ndarray) -> np.ndarray:
        top, bottom, left, right = self.pads
        n, h, w, c = x.shape
        if self.shift is not None and x.size:
            return self._shift(x)
        if not (top or bottom or left or right) and self.zero is None:
            return x if x.dtype == self.work else x.astype(self.work)
        # The padded buffer is kept from call to call (one per thread): its zero border is
        # written once and the interior overwritten, with no fresh pages to fault in.
        shape = (n, h + top + bottom, w + left + right, c)
        xp = getattr(self._local, "buffer", None)
        if xp is None or xp.shape != shape:
            xp = self._local.buffer = np.zeros(shape, dtype=self.work)
        inner = xp[:, top:top + h, left:left + w]
        if self.zero is None:
            np.copyto(inner, x, casting="unsafe")
        else:
            np.subtract(x, self.zero, out=inner, dtype=self.work)
        return xp


class _DeferredProduct:
    """A quantized product prepared for static shapes (PreparedConv's 1x1 convolution,
    PreparedFullyConnected): a classifier's few rows run the compiled few-row product
    (gemv), and the BLAS path (its float filter: 5 MB of fresh pages for a 1280 x 1001
    classifier, with its exactness bounds) is laid out, by ``_lay_out_locked``, only if a
    call has more rows than the gemv takes, which the plan's static shapes never give."""

    gemv: _CompiledGemv | None

    def _prepare_product(self, ctx: ExecutionContext, gemv: bool, rows: int, fuse: int, units: int) -> None:
        """The compiled gemv (where ``gemv``: the operation can take it, its filter read as
        (units, depth) rows) for ``rows`` rows, else the BLAS path laid out now."""
        self.gemv = None
        self._lock = threading.Lock()
        #: what ``_lay_out`` needs while the BLAS path is not laid out (None once it is)
        self._pending: ExecutionContext | None = ctx
        data = ctx.input(INPUT)
        if gemv and 0 < rows <= _GEMV_ROWS and data.type not in FLOAT_TENSORS:
            # (the gemv runs the stage itself: no compiled stage of its own)
            epilogue = _Epilogue(ctx, fuse, units, np.float32, fused=False)
            self.gemv = compiled_gemv(data, ctx.input(FILTER), epilogue, rows)
            if self.gemv is not None:
                self.epilogue = epilogue  # the output dtype (the product runs the stage itself)
                return
        self._lay_out()

    def _lay_out(self) -> None:
        with self._lock:
            if self._pending is None:
                return
            self._lay_out_locked(self._pending)
            self._pending = None

    def _lay_out_locked(self, ctx: ExecutionContext) -> None:
        raise NotImplementedError


class PreparedConv(_DeferredProduct):
    """CONV_2D (one group) with static shapes and a constant filter and bias."""

    def __init__(self, ctx: ExecutionContext, sp: Spatial, out_hw: tuple[int, int]) -> None:
        data, weights = ctx.input(INPUT), ctx.input(FILTER)
        oc, kh, kw, depth = weights.shape
        self.integer: _IntegerConv | None = None
        self.sp, self.out_hw, self.kernel_hw = sp, out_hw, (kh, kw)
        self.depth, self.channels = kh * kw * depth, oc
        self.pointwise = kh == kw == 1 and sp.stride_h == sp.stride_w == 1
        # a classifier's 1x1 convolution of a 1x1 image (few output pixels, no padding)
        unpadded = not (sp.pad_top or sp.pad_bottom or sp.pad_left or sp.pad_right)
        pixels = data.shape[0] * out_hw[0] * out_hw[1]
        self._prepare_product(ctx, self.pointwise and unpadded, pixels, sp.fuse, oc)

    def _lay_out_locked(self, ctx: ExecutionContext) -> None:
        """The im2col path: the filter as float columns, padding, blocks, output stage."""
        data, weights, sp, out_hw = ctx.input(INPUT), ctx.input(FILTER), self.sp, self.out_hw
        oc, kh, kw, depth = weights.shape
        self.integer = _IntegerConv.build(ctx, weights, sp.fuse, (
            kh, kw, sp.stride_h, sp.stride_w, sp.dilation_h, sp.dilation_w, sp.pad_top, sp.pad_left, *out_hw, depth))
        if self.integer is not None:
            self.epilogue = self.integer.epilogue
            return
        quantized = weights.type not in FLOAT_TENSORS
        work = _work_dtype(data, weights.value, (0,), weights.zero_point if quantized else 0)
        # float32 products twice as fast as float64 ones: split where the sums need it
        parts = _float32_parts(data, _shifted_weights(weights).reshape(oc, -1)) if work == np.float64 else None
        if parts is not None:
            work = np.float32
        self.work, self.parts = work, parts
        # (depth, oc): the filters as columns, in the im2col order (kh, kw, c); a transposed
        # view of the (oc, depth) rows, which BLAS reads as they are (no copy at preparation)
        self.weights = _float_filter(weights, work).reshape(oc, -1).T
        self.pad = _Padder(data, sp, work, compiled=True)
        # (replacing the compiled product's, whose results it gives: that product keeps its own stage)
        self.epilogue = _Epilogue(ctx, sp.fuse, oc, work, row=out_hw[1], parts=parts is not None)
        itemsize = np.dtype(work).itemsize
        # Each product repacks the filter inside BLAS: blocks of at least _MIN_BLOCK_PIXELS
        # rows keep that cost small next to the product's (below it, 512x512 filters cost
        # half again their product time), at the price of temporaries outside the cache.
        pixels = max(_MIN_BLOCK_PIXELS, _BLOCK_BYTES // (oc * 8))
        pixels = max(1, min(pixels, _IM2COL_BYTES // (self.depth * itemsize)))
        self.block_rows = max(1, pixels // out_hw[1])
        # Few input channels (an RGB image's first layer): im2col rows are copied in runs
        # of kw * C values (9 for 3x3 RGB), one numpy loop each; the columns are gathered
        # transposed instead, one run per output row of each (tap, channel)
        # (``_planar_columns``), and multiplied as a transposed operand.
        self.planar = not self.pointwise and depth <= _PLANAR_MAX_CHANNELS
        self.taps = _TapProducts.build(self, weights, data)

    def _planar_columns(self, xp: np.ndarray, batch: int, top: int, bottom: int) -> np.ndarray:
        """The (depth, pixels) columns of output rows [top, bottom), im2col order (kh, kw, c)."""
        sp, (kh, kw), ow = self.sp, self.kernel_hw, self.out_hw[1]
        _, sh, sw, sc = xp.strides
        channels = xp.shape[3]
        view = np.lib.stride_tricks.as_strided(
            xp[batch, top * sp.stride_h:], (kh, kw, channels, bottom - top, ow),
            (sh * sp.dilation_h, sw * sp.dilation_w, sc, sh * sp.stride_h, sw * sp.stride_w), writeable=False)
        columns = np.empty((self.depth, (bottom - top) * ow), dtype=xp.dtype)
        np.copyto(columns.reshape(view.shape), view)
        return columns

    def __call__(self, values: list) -> list[np.ndarray]:
        sp = self.sp
        x = np.transpose(values[INPUT], (0, 2, 3, 1)) if sp.nchw else values[INPUT]
        n = x.shape[0]
        oh, ow = self.out_hw
        out = np.empty((n, oh, ow, self.channels), dtype=self.epilogue.dtype)
        if self.gemv is not None and n * oh * ow <= _GEMV_ROWS:
            if n:
                self.gemv(x.reshape(-1, self.depth), out.reshape(-1, self.channels))
            return [np.ascontiguousarray(np.transpose(out, (0, 3, 1, 2))) if sp.nchw else out]
        if self._pending is not None:
            self._lay_out()
        if n and self.integer is not None:
            self.integer(x, out)
        elif n and self.taps is not None:
            xp = self.pad(x)
            for batch in range(n):
                self.taps(xp[batch], out[batch])
        elif n:
            xp = self.pad(x)
            windows = None if self.pointwise or self.planar else window_view(
                xp, self.out_hw, self.kernel_hw, (sp.stride_h, sp.stride_w), (sp.dilation_h, sp.dilation_w))
            if self.pointwise:
                # one (pixels, depth) matrix across the batch: blocks of pixels, not of one
                # image's rows (a batch of 1x1 images, FULLY_CONNECTED lowered to CONV_2D,
                # would otherwise run one product per image)
                pixels, step = n * oh * ow, self.block_rows * ow
                cols, target = xp.reshape(pixels, self.depth), out.reshape(pixels, self.channels)
                for start in range(0, pixels, step):
                    check_deadline()
                    self._block(cols[start:start + step], target[start:start + step])
            else:
                for batch in range(n):
                    for top in range(0, oh, self.block_rows):
                        check_deadline()
                        bottom = min(top + self.block_rows, oh)
                        rows = (bottom - top) * ow
                        if self.planar:
                            cols = self._planar_columns(xp, batch, top, bottom).T
                        else:
                            cols = windows[batch, top:bottom].reshape(rows, self.depth)
                        self._block(cols, out[batch, top:bottom].reshape(rows, self.channels))
        return [np.ascontiguousarray(np.transpose(out, (0, 3, 1, 2))) if sp.nchw else out]

    def _block(self, cols: np.ndarray, target: np.ndarray) -> None:
        """The outputs of one block of im2col rows ``cols`` into ``target`` (rows, channels)."""
        if not self.epilogue.quantized and target.dtype == self.work:  # float32 sums land in the output
            np.matmul(cols, self.weights, out=target)
            self.epilogue.finish(target, target)
        else:
            _product(cols, self.weights, self.parts, self.epilogue, target)


class _IntegerConv:
    """A quantized CONV_2D on the processor's 16-bit multiply-add (``_numba_igemm``, the
    form ``_jit.integer_products`` offers: AVX-512 or AVX2): im2col rows gathered from the stored 8-bit input
    tile by tile, exact int32 sums, the output stage; no float copy of input or filter.
    Taken where every sum fits int32 (max |x - zero point| times the largest sum of one
    output channel's |filter| values below 2**31) and the stage compiles."""

    def __init__(self, form: Form, data: Tensor, geometry: np.ndarray, packed: np.ndarray, params: tuple,
                 epilogue: _Epilogue, block: int) -> None:
        self.run = form.conv_quantized
        self.flip, self.offset = _jit.uint8_reading(data)
        self.geometry, self.packed, self.params, self.epilogue = geometry, packed, params, epilogue
        self.tile_rows = form.tile_rows
        #: output pixels of one call (the deadline is checked between calls)
        self.block = block

    @classmethod
    def build(cls, ctx: ExecutionContext, weights: Tensor, fuse: int,
              geometry: tuple[int, ...] | None = None) -> _IntegerConv | None:
        """For the (channels, ...) filter ``weights``; ``geometry``: (KH, KW, stride h,
        stride w, dilation h, dilation w, pad top, pad left, OH, OW, C), by default
        FULLY_CONNECTED's (its rows as a batch of 1x1 images)."""
        if geometry is None:
            geometry = (1, 1, 1, 1, 1, 1, 0, 0, 1, 1, weights.shape[-1])
        form = _jit.integer_products()
        data = ctx.input(INPUT)
        if form is None or data.type not in (T.TENSOR_QUANT8_ASYMM, T.TENSOR_QUANT8_ASYMM_SIGNED):
            return None
        bound = _sum_bound(data, weights.value, weights.zero_point, tuple(range(1, len(weights.shape))))
        if bound >= 2**31:
            return None
        channels = weights.shape[0]
        columns = _shifted_weights(weights).reshape(channels, -1)  # (int16, packed below)
        epilogue = _Epilogue(ctx, fuse, channels, np.int32, fused=False)
        if not _jit.compilable(epilogue.stage):
            return None
        params = _jit.stage_parameters(epilogue.stage, channels, bound)
        packed = form.pack_filter(columns)
        block = max(form.tile_rows, _MIN_BLOCK_PIXELS // form.tile_rows * form.tile_rows)
        conv = cls(form, data, np.array(geometry, np.int64), packed, params, epilogue, block)
        probe = np.zeros((1, 1, geometry[10]), np.uint8)
        if not _jit.warm_up(conv.run, probe, conv.flip, conv.offset, conv.geometry, packed, params,
                            np.empty((0, channels), np.uint8), 0, 0, *conv._scratch()):
            return None
        return conv

    def _scratch(self) -> tuple[np.ndarray, np.ndarray]:
        """One call's int16 im2col rows and int32 sums (a tile of each)."""
        panels, pairs = self.packed.shape[0], self.packed.shape[1]
        return (np.empty((self.tile_rows, 2 * pairs), np.int16),
                np.empty((self.tile_rows, panels * self.packed.shape[2]), np.int32))

    def __call__(self, x: np.ndarray, out: np.ndarray) -> None:
        """``out`` (N, OH, OW, channels) from the NHWC 8-bit input ``x``."""
        stored = _jit.kernel_input(x).view(np.uint8)
        stored = stored.reshape(stored.shape[0], stored.shape[1], -1)  # (N, H, W * C): rows of taps
        target = out.reshape(-1, out.shape[3]).view(np.uint8)
        rows, sums = self._scratch()
        pixels = target.shape[0]
        for start in range(0, pixels, self.block):
            check_deadline()
            self.run(stored, self.flip, self.offset, self.geometry, self.packed, self.params, target, start,
                     min(start + self.block, pixels), rows, sums)


#: ``_TapProducts``: convolutions of at most this many output channels, from this many
#: input channels, whose padded input is at most this much larger than the output
_TAPS_MAX_CHANNELS, _TAPS_MIN_DEPTH, _TAPS_MAX_GROWTH = 48, 64, 1.25
#: ``_TapProducts``: the bytes of one block's products (they stay in cache for their sums)
_TAPS_BLOCK_BYTES = 1 << 20


class _TapProducts:
    """A stride-1 quantized CONV_2D of few output channels over many input channels (a
    DenseNet's 3x3 128 -> 32) without im2col: the padded input, as (pixels, C) rows, times
    the filter of every tap side by side (C, KH * KW * N) in one product (N columns are
    too few for BLAS to run well; KH * KW * N are not), then each output sums its taps'
    products at the shifted pixels in int32 and runs the output stage in one compiled
    pass (``_numba_kernels.conv_taps_quantized``). Each product is a sum over one tap's
    channels, exact in float32 where max|x - zero point| times every tap's sum of |w| is
    below 2**24 (a bound per tap, so also where the whole sum needs float64 or parts in
    the im2col product), and the int32 sums are exact below 2**31: the im2col path's
    values bit for bit. Built by ``build`` where it applies."""

    def __init__(self, conv: PreparedConv, shifted: np.ndarray, width: int, module, params: tuple) -> None:
        oc, kh, kw, depth = shifted.shape
        # (C, KH * KW * N): column (i * KW + j) * N + n is tap (i, j) of filter n
        self.weights = _jit.constant(shifted.transpose(3, 1, 2, 0).reshape(depth, -1), np.float32)
        self.kernel = np.array([kh, kw], np.int64)
        self.dilations = np.array([conv.sp.dilation_h, conv.sp.dilation_w], np.int64)
        self.halo = (kh - 1) * conv.sp.dilation_h  # input rows below a block's last output row
        self.channels, self.params = oc, params
        self.run = module.conv_taps_quantized
        self.block_rows = max(1, _TAPS_BLOCK_BYTES // (width * self.weights.shape[1] * 4) - self.halo)
        self._local = threading.local()

    @classmethod
    def build(cls, conv: PreparedConv, weights: Tensor, data: Tensor) -> _TapProducts | None:
        module, sp = _jit.kernels(), conv.sp
        oc, kh, kw, depth = weights.shape
        if module is None or not conv.epilogue.quantized or not isinstance(conv.epilogue.stage, _jit.FusedOutputStage) \
                or conv.planar or kh * kw == 1 or sp.stride_h != 1 or sp.stride_w != 1 \
                or oc > _TAPS_MAX_CHANNELS or depth < _TAPS_MIN_DEPTH:
            return None
        _, height, width, _ = spatial_dims(data.shape, sp.nchw)
        padded = (height + sp.pad_top + sp.pad_bottom, width + sp.pad_left + sp.pad_right)
        oh, ow = conv.out_hw
        if padded[0] * padded[1] > _TAPS_MAX_GROWTH * oh * ow:
            return None
        # the padded input is float32 (the im2col path's work dtype, or its float32 parts)
        if conv.work != np.float32:
            return None
        shifted = _shifted_weights(weights)
        magnitudes = np.abs(shifted).sum(axis=3, dtype=np.int64)  # (N, KH, KW): each tap's sum of |w|
        largest = _input_bound(data)
        if largest * int(magnitudes.max(initial=0)) >= 2**24:
            return None
        total = largest * int(magnitudes.sum(axis=(1, 2)).max(initial=0))
        if total >= 2**31:
            return None
        params = _jit.stage_parameters(conv.epilogue.stage.stage, oc, total)
        taps = cls(conv, shifted, padded[1], module, params)
        probe = np.zeros((taps.halo + 1, padded[1], depth), np.float32)
        if not _jit.warm_up(taps, probe, np.empty((1, ow, oc), conv.epilogue.dtype)):
            return None
        return taps

    def __call__(self, xp: np.ndarray, out: np.ndarray) -> None:
        """One image: ``xp`` (HP, WP, C) padded, zero point subtracted, float32, into ``out``
        (OH, OW, N) (C-contiguous)."""
        rows_in, width, depth = xp.shape
        flat = xp.reshape(rows_in * width, depth)
        count = min(self.block_rows, out.shape[0])
        shape = ((count + self.halo) * width, self.weights.shape[1])
        products = getattr(self._local, "products", None)
        if products is None or products.shape != shape:
            products = self._local.products = np.empty(shape, np.float32)
        acc = _jit.scratch((self.channels,), np.int32)
        stored = out.view(np.uint8)
        for top in range(0, out.shape[0], count):
            check_deadline()
            bottom = min(top + count, out.shape[0])
            block = products[:(bottom - top + self.halo) * width]
            np.matmul(flat[top * width:(bottom + self.halo) * width], self.weights, out=block)
            self.run(block, width, self.kernel, self.dilations, self.params, stored[top:bottom], acc)


class PreparedDepthwise:
    """DEPTHWISE_CONV_2D with static shapes and a constant filter and bias: per block of
    output rows, one ``einsum`` over the (rows, ow, kh, kw, c) window view: a single pass
    of sums of products with no temporaries (several times faster than a multiply-add
    per kernel tap)."""

    def __init__(self, ctx: ExecutionContext, sp: Spatial, out_hw: tuple[int, int], multiplier: int) -> None:
        data, weights = ctx.input(INPUT), ctx.input(FILTER)
        _, kh, kw, channels = weights.shape
        self.sp, self.out_hw, self.multiplier, self.kernel_hw = sp, out_hw, multiplier, (kh, kw)
        shifted = _shifted_weights(weights)[0]
        self.work = _work_dtype(data, shifted, (2,))
        self.channels = channels
        # the compiled kernel runs its own output stage: the epilogue gives it the stage
        epilogue = _Epilogue(ctx, sp.fuse, channels, self.work, fused=False)
        self.compiled = _compiled_depthwise(ctx, sp, shifted, multiplier, epilogue, out_hw)
        if self.compiled is not None:  # it runs every call: nothing of the numpy path is needed
            self.epilogue = epilogue  # (the output dtype)
            return
        if multiplier == 1:
            self.weights = shifted.astype(self.work)  # (kh, kw, c)
            self.subscripts = "hwijc,ijc->hwc"
        else:
            self.weights = shifted.reshape(kh, kw, channels // multiplier, multiplier).astype(self.work)
            self.subscripts = "hwijc,ijcm->hwcm"
        self.pad = _Padder(data, sp, self.work)
        if _jit.kernels() is None:  # the same stage, which numpy now runs at every call
            if epilogue.quantized:
                epilogue.stage.prepare()
            self.epilogue = epilogue
        else:  # (its compiled output stage, where that applies)
            self.epilogue = _Epilogue(ctx, sp.fuse, channels, self.work)
        self.block_rows = max(1, _BLOCK_BYTES // (out_hw[1] * channels * 8))

    def __call__(self, values: list) -> list[np.ndarray]:
        if self.compiled is None:
            return self._numpy(values)
        x = values[INPUT]
        if self.sp.nchw:
            x = np.ascontiguousarray(np.transpose(x, (0, 2, 3, 1)))
        out = np.empty((x.shape[0], *self.out_hw, self.channels), dtype=self.epilogue.dtype)
        check_deadline()
        self.compiled(_jit.kernel_input(x), out)
        return [np.ascontiguousarray(np.transpose(out, (0, 3, 1, 2))) if self.sp.nchw else out]

    def _numpy(self, values: list) -> list[np.ndarray]:
        sp = self.sp
        x = np.transpose(values[INPUT], (0, 2, 3, 1)) if sp.nchw else values[INPUT]
        n = x.shape[0]
        oh, ow = self.out_hw
        m = self.multiplier
        out = np.empty((n, oh, ow, self.channels), dtype=self.epilogue.dtype)
        if n:
            xp = self.pad(x)
            windows = window_view(xp, self.out_hw, self.kernel_hw, (sp.stride_h, sp.stride_w),
                                  (sp.dilation_h, sp.dilation_w))
            c = x.shape[3]
            acc_full = np.empty((self.block_rows, ow, c, m) if m > 1 else (self.block_rows, ow, c), self.work)
            # float32 results are summed into the output itself
            direct = not self.epilogue.quantized and out.dtype == self.work
            for batch in range(n):
                for top in range(0, oh, self.block_rows):
                    check_deadline()
                    bottom = min(top + self.block_rows, oh)
                    rows = bottom - top
                    target = out[batch, top:bottom]
                    acc = target.reshape(acc_full[:rows].shape) if direct else acc_full[:rows]
                    np.einsum(self.subscripts, windows[batch, top:bottom], self.weights, out=acc)
                    self.epilogue.finish(target if direct else acc.reshape(rows, ow, self.channels), target)
        return [np.ascontiguousarray(np.transpose(out, (0, 3, 1, 2))) if sp.nchw else out]


def _compiled_depthwise(ctx: ExecutionContext, sp: Spatial, shifted: np.ndarray, multiplier: int,
                        epilogue: _Epilogue, out_hw: tuple[int, int]):
    """The compiled depthwise kernel (``_jit``) bound to this operation's constants, as a
    function of the NHWC input and the output array; None where it does not apply (numba
    absent or disabled, float16, int32 sums that could overflow). Few channels at stride 1
    along rows run by whole rows, their filter (and bias or output stage) tiled along an
    output row here."""
    compiled = _jit.kernels()
    data, output = ctx.input(INPUT), ctx.output(0)
    depth = shifted.shape[2]
    if compiled is None or output.type == T.TENSOR_FLOAT16:
        return None
    geometry = (multiplier, np.array([sp.stride_h, sp.stride_w], np.int64),
                np.array([sp.dilation_h, sp.dilation_w], np.int64), np.array([sp.pad_top, sp.pad_left], np.int64))
    rows = multiplier == 1 and sp.stride_w == 1 and depth < _ROW_CHANNELS
    ow = out_hw[1]

    def tiled(values: np.ndarray, dtype) -> np.ndarray:  # per-channel values repeated along an output row
        return _jit.constant(np.tile(np.asarray(values, dtype=dtype), (1,) * (values.ndim - 1) + (ow,)), dtype)

    def flat_rows(array: np.ndarray) -> np.ndarray:  # (N, H, W, C) -> (N, H, W * C), a view
        n, h, w, c = array.shape
        return array.reshape(n, h, w * c)

    if not epilogue.quantized:
        weights = _jit.constant(shifted, np.float32)
        bias = _jit.constant(epilogue.bias, np.float32)
        low, high = epilogue.clip if epilogue.clip is not None else (-np.inf, np.inf)
        low, high = np.float32(low), np.float32(high)
        if rows:
            row_weights, row_bias = tiled(weights, np.float32), tiled(bias, np.float32)

            def run_float_rows(x: np.ndarray, out: np.ndarray) -> None:
                compiled.depthwise_rows_float(flat_rows(x), row_weights, depth, *geometry[1:], row_bias, low, high,
                                              flat_rows(out), _jit.scratch((row_bias.size,), np.float32))
            run = run_float_rows
        else:
            def run_float(x: np.ndarray, out: np.ndarray) -> None:
                compiled.depthwise_float(x, weights, *geometry, bias, low, high, out,
                                         _jit.scratch((out.shape[2], depth), np.float32))
            run = run_float
    else:
        # the int32 sums are exact: no partial sum can exceed max|x - zp| * sum|w|
        bound = _sum_bound(data, shifted, 0, (0, 1))
        if bound >= 2**31 or not _jit.compilable(epilogue.stage):
            return None
        weights = _jit.constant(shifted, np.int32)
        zero_point = np.int32(data.zero_point)
        # what the zero point takes from a window lying wholly inside the input, per channel
        # (|zero point| <= the input bound: fits in int32 as the sums do)
        zero_point_sums = _jit.constant(data.zero_point * weights.sum(axis=(0, 1), dtype=np.int64), np.int32)
        params = _jit.stage_parameters(epilogue.stage, depth, bound)
        if rows:
            row_weights = tiled(weights, np.int32)
            row_params = tuple(tiled(value, value.dtype) if isinstance(value, np.ndarray) else value
                               for value in params)

            def run_quantized_rows(x: np.ndarray, out: np.ndarray) -> None:
                compiled.depthwise_rows_quantized(flat_rows(x), zero_point, row_weights, depth, *geometry[1:],
                                                  row_params, flat_rows(out),
                                                  _jit.scratch((row_weights.shape[2],), np.int32))
            run = run_quantized_rows
        else:
            def run_quantized(x: np.ndarray, out: np.ndarray) -> None:
                compiled.depthwise_quantized(x, zero_point, weights, zero_point_sums, *geometry, params, out,
                                             _jit.scratch((out.shape[2], depth), np.int32))
            run = run_quantized
    if not _jit.warm_up(run, np.zeros((0, 1, 1, depth // multiplier), dtype_of(data.type)),
                        np.empty((0, 1, 1, depth), dtype_of(output.type))):
        return None
    return run


#: quantized products of at most this many rows run ``_numba_kernels.gemv_quantized``
_GEMV_ROWS = 4


class _CompiledGemv:
    """A quantized product of few rows (``_GEMV_ROWS``) through the compiled
    ``gemv_quantized``: the filter kept as 8-bit (or 16-bit) integers, the sums exact in
    int32, the output stage fused. Built by ``compiled_gemv``."""

    def __init__(self, kernel, data: Tensor, weights: np.ndarray, params: tuple, units: int) -> None:
        self.kernel, self.weights, self.params, self.units = kernel, weights, params, units
        self.flip, self.offset = _jit.uint8_reading(data)

    def __call__(self, rows: np.ndarray, out: np.ndarray) -> None:
        """``rows`` (M, K) stored 8-bit inputs into ``out`` (M, units), C-contiguous."""
        self.kernel(_jit.kernel_input(rows).view(np.uint8), self.flip, self.offset, self.weights, self.params,
                    out.view(np.uint8), _jit.scratch((rows.shape[1],), np.int16),
                    _jit.scratch((self.units,), np.int32))


def compiled_gemv(data: Tensor, weights: Tensor, epilogue: _Epilogue, rows: int) -> _CompiledGemv | None:
    """``_CompiledGemv`` for the quantized filter ``weights`` read as (units, K), where
    it applies: quantized, at most ``_GEMV_ROWS`` rows, an output stage the compiled
    kernels hold (``_jit.compilable``; ``epilogue`` made with ``fused=False``: the product
    runs the stage itself) and every sum within int32 (max|x - zero point| times each
    unit's sum of |w|)."""
    module = _jit.kernels()
    if module is None or not epilogue.quantized or not 0 < rows <= _GEMV_ROWS or not weights.value.size \
            or not _jit.compilable(epilogue.stage):
        return None
    units = weights.shape[0]
    stored, zero_point = weights.value.reshape(units, -1), weights.zero_point
    if stored.dtype == np.int8 and not zero_point:  # the stored values are the int8 filter
        shifted = stored
    elif int(stored.min()) - zero_point >= -128 and int(stored.max()) - zero_point <= 127:
        # q - zero point fits int8 (a uint8 filter at 128): computed modulo 256 in the
        # stored bytes and read as int8, the exact values, with no int16 copy
        shifted = np.subtract(stored.view(np.uint8), np.uint8(zero_point & 0xFF), dtype=np.uint8).view(np.int8)
    else:
        shifted = np.subtract(stored, zero_point, dtype=np.int16)
    bound = _sum_bound(data, shifted, 0, (1,))
    if bound >= 2**31:
        return None
    if shifted.dtype == np.int8:  # (a new array already, unless the stored values)
        rows_of_filter = _jit.constant(shifted, np.int8) if shifted is stored else shifted
    else:
        narrow = int(shifted.max()) <= 127 and int(shifted.min()) >= -128
        rows_of_filter = _jit.constant(shifted, np.int8 if narrow else np.int16)
    params = _jit.stage_parameters(epilogue.stage, units, bound)
    gemv = _CompiledGemv(module.gemv_quantized, data, rows_of_filter, params, units)
    probe = np.zeros((0, stored.shape[1]), dtype_of(data.type))
    if not _jit.warm_up(gemv, probe, np.empty((0, units), epilogue.dtype)):
        return None
    return gemv


class PreparedFullyConnected(_DeferredProduct):
    """FULLY_CONNECTED with static shapes and constant weights and bias: one product."""

    def __init__(self, ctx: ExecutionContext, fuse: int) -> None:
        data, weights = ctx.input(INPUT), ctx.input(FILTER)
        units, input_size = weights.shape
        self.input_size, self.units, self.fuse = input_size, units, fuse
        self.integer: _IntegerConv | None = None
        # float32 in and out: the product is the output (bias and clamp added in place; the
        # BLAS product is then always laid out: the compiled few-row one is quantized only)
        self.float32 = data.type == T.TENSOR_FLOAT32 and dtype_of(ctx.output(0).type) == np.float32
        rows = math.prod(data.shape) // input_size
        self._prepare_product(ctx, True, rows, fuse, units)

    def _lay_out_locked(self, ctx: ExecutionContext) -> None:
        """The integer product where it applies, else the BLAS product: the filter as float
        columns and its output stage."""
        data, weights = ctx.input(INPUT), ctx.input(FILTER)
        self.integer = None if self.float32 else _IntegerConv.build(ctx, weights, self.fuse)
        if self.integer is not None:
            self.epilogue = self.integer.epilogue
            return
        quantized = weights.type not in FLOAT_TENSORS
        work = _work_dtype(data, weights.value, (0,), weights.zero_point if quantized else 0)
        parts = _float32_parts(data, _shifted_weights(weights)) if work == np.float64 else None
        if parts is not None:
            work = np.float32
        self.work, self.parts = work, parts
        self.weights = _float_filter(weights, work).T  # (input_size, units), a view
        self.zero = None if data.type in FLOAT_TENSORS else work(data.zero_point)
        # (replacing the compiled product's, whose results it gives: that product keeps its own stage)
        self.epilogue = _Epilogue(ctx, self.fuse, self.units, work, parts=parts is not None)

    def __call__(self, values: list) -> list[np.ndarray]:
        x = values[INPUT].reshape(-1, self.input_size)
        if self.float32 and x.flags.c_contiguous:
            # what the general path computes (its astype is a copy of the same C-ordered
            # values, its finish adds the bias row by row and copies into ``out``), in
            # three numpy calls: a loop body's matrix-vector products are mostly overhead
            acc = np.matmul(x, self.weights)
            acc += self.epilogue.bias
            if self.epilogue.clip is not None:
                np.clip(acc, *self.epilogue.clip, out=acc)
            return [acc]
        out = np.empty((x.shape[0], self.units), dtype=self.epilogue.dtype)
        if self.gemv is not None and x.shape[0] <= _GEMV_ROWS:
            if x.shape[0]:
                self.gemv(x, out)
            return [out]
        if self._pending is not None:
            self._lay_out()
        if x.shape[0] and self.integer is not None:
            self.integer(x.reshape(-1, 1, 1, self.input_size), out.reshape(-1, 1, 1, self.units))
        elif x.shape[0]:
            rows = x.astype(self.work) if self.zero is None else np.subtract(x, self.zero, dtype=self.work)
            if self.epilogue.quantized:
                _product(rows, self.weights, self.parts, self.epilogue, out)
            else:
                self.epilogue.finish(rows @ self.weights, out)
        return [out]


class PreparedTransposeConv:
    """TRANSPOSE_CONV_2D with static shapes and a constant filter and bias: the reference's
    product of every input pixel with every tap, scatter-added tap by tap into the strided
    output grid in the same order (the same float sums), with the filter laid out and
    shifted, the bias and the output stage made once."""

    def __init__(self, ctx: ExecutionContext, sp: Spatial, out_hw: tuple[int, int]) -> None:
        data, weights = ctx.input(INPUT), ctx.input(FILTER)
        oc, kh, kw, depth = weights.shape
        self.sp, self.out_hw, self.kernel_hw, self.channels = sp, out_hw, (kh, kw), oc
        shifted = _shifted_weights(weights)
        # every output sums a subset of one filter's products: CONV_2D's per-channel bound holds
        self.work = _work_dtype(data, shifted, (0,))
        # (depth, kh * kw * oc): input channels against (tap, output channel) columns
        self.weights = np.ascontiguousarray(shifted.transpose(1, 2, 0, 3).reshape(-1, depth).T, dtype=self.work)
        self.zero = None if data.type in FLOAT_TENSORS else self.work(data.zero_point)
        self.epilogue = _Epilogue(ctx, sp.fuse, oc, self.work)

    def __call__(self, values: list) -> list[np.ndarray]:
        sp, (kh, kw), oc = self.sp, self.kernel_hw, self.channels
        x = np.transpose(values[INPUT], (0, 2, 3, 1)) if sp.nchw else values[INPUT]
        n, h, w, depth = x.shape
        oh, ow = self.out_hw
        out = np.empty((n, oh, ow, oc), dtype=self.epilogue.dtype)
        if n:
            rows = x.reshape(-1, depth)
            rows = rows.astype(self.work) if self.zero is None else np.subtract(rows, self.zero, dtype=self.work)
            contributions = (rows @ self.weights).reshape(n, h, w, kh, kw, oc)
            full = np.zeros((n, max((h - 1) * sp.stride_h + kh, sp.pad_top + oh),
                             max((w - 1) * sp.stride_w + kw, sp.pad_left + ow), oc), dtype=self.work)
            for i in range(kh):
                check_deadline()
                for j in range(kw):
                    full[:, i: i + sp.stride_h * (h - 1) + 1: sp.stride_h,
                         j: j + sp.stride_w * (w - 1) + 1: sp.stride_w] += contributions[:, :, :, i, j]
            acc = np.ascontiguousarray(full[:, sp.pad_top: sp.pad_top + oh, sp.pad_left: sp.pad_left + ow])
            self.epilogue.finish(acc, out)
        return [np.ascontiguousarray(np.transpose(out, (0, 3, 1, 2))) if sp.nchw else out]
