"""Compiled kernels of the prepared path (the optional ``nnapi[fast]`` extra, on numba).

Imported only through ``nnapi.operations._jit``, and only when numba is installed and not
disabled: this module imports numba at its top. Each kernel is a single pass over its data
doing what numpy needs several passes (and int64 temporaries) for:

- ``requantize_rows``: the quantized output stage of convolutions and matrix products
  (``quant_math.OutputStage``): int32 accumulators (or floats holding exact integers)
  plus bias, TFLite's MultiplyByQuantizedMultiplier per channel, zero point, clamp,
  narrowed to the output type.
- ``requantize_parts``: the same after summing exact float32 partial products (a
  product whose float32 sums would not be exact, split along the summed axis).
- ``softmax_quantized``: quantized SOFTMAX along the last axis in one pass per row, with
  numpy's float64 arithmetic step for step (its pairwise sum included).
- ``mean_float``: float32 MEAN over adjacent axes with more axes after them (a global
  average over height and width), in one pass with numpy's float64 sums.
- ``gemv_quantized``: a quantized product of few rows (classifier layers) in exact int32
  sums of 16-bit products, with the output stage.
- ``conv_taps_quantized``: a stride-1 quantized CONV_2D of few output channels from one
  product of the padded input with every tap's filter side by side (no im2col copy):
  each output sums its taps' products, then the output stage.
- ``dequantized``: 8-bit values less their zero point, times a scale, in float32
  (DEQUANTIZE; with scale 1 the input of an unpadded quantized product, 1x1 convolutions).
- ``depthwise_quantized``: DEPTHWISE_CONV_2D on stored 8-bit inputs, summed exactly in
  int32 straight from the unpadded input (padding taps hold the zero point, so they add
  nothing and are skipped), followed by the same output stage per output pixel; a 3x3
  filter's interior pixels sum their nine taps in one vectorized pass over the channels.
- ``depthwise_float``: the float32 DEPTHWISE_CONV_2D with bias and the activation clamp.
- ``depthwise_rows_quantized`` / ``depthwise_rows_float``: the same for few channels,
  stride 1 along rows and multiplier 1, over whole rows (pixels x channels as one run,
  the filter and output stage tiled along a row at preparation): loops over few channels
  per pixel cost more than their arithmetic.
- ``average_pool_quantized``: quantized AVERAGE_POOL_2D in one pass over each output
  pixel's window, exact int32 sums (numpy makes one float32 pass over the output per
  tap, then five more for the quotient, rounding and clamp).
- ``prelu_float``: the float32 PRELU in one pass (numpy needs a multiply and a maximum).
- ``max_pool``: MAX_POOL_2D in one pass over each output pixel's window (numpy makes one
  pass over the whole output per tap), with the activation's clamp.
- ``lstm_add`` / ``lstm_gates``: the arithmetic of a prepared LSTM time step between
  numpy's exponentials and activations (which stay numpy's, so the values stay
  ``run_lstm``'s bit for bit): five to eight numpy calls per step in two.
- ``lstm_sequence``: a prepared LSTM's whole time loop in one call, calling numpy's own
  float32 exp / tanh loops and its BLAS product (``_native_loops``: their addresses, so
  the values stay numpy's bit for bit) around the compiled gate arithmetic.
- ``logistic``: the float32 LOGISTIC in one call around numpy's own exp loop (numpy's
  four calls: negation, exp, addition, division).
- ``lookup_pairs``: an element-wise function of two 8-bit tensors of one shape (or one
  broadcast along leading axes: a per-channel constant) through the table of every pair
  of stored values, in one pass (numpy builds the index in three, broadcasting).

Scratch arrays come from the caller: a kernel calling ``np.empty`` makes numba import its
array implementation (``numba.np.arrayobj`` and a dozen modules, ~20 ms) when it loads the
kernel from the cache in a new process.

The numpy kernels remain the reference; tests compare these with them bit for bit
(quantized) and within float32 rounding (float). Functions compile lazily at their first
call for each argument type and are cached on disk (``cache=True``), so a process pays
the compilation once per machine, later ones only load it.
"""

from __future__ import annotations

import numba
import numpy as np
from llvmlite import ir
from numba.core import cgutils
from numba.core import types as nbtypes
from numba.extending import intrinsic

from nnapi.operations._numba_cache import kernel
from nnapi.operations.quant_math import HALF_BELOW_FLOAT32, HALF_BELOW_FLOAT64

_INT32_MIN = -(2**31)
_INT32_MAX = 2**31 - 1

_jit = kernel(nogil=True, fastmath=False, boundscheck=False)
# IEEE division (x / 0 is inf or NaN, as numpy's): no zero test per element, so loops of
# divisions vectorize
_jit_ieee = kernel(nogil=True, fastmath=False, boundscheck=False, error_model="numpy")
# helpers inlined into their callers (no per-call reference counting of array arguments)
_inline = numba.njit(cache=True, nogil=True, boundscheck=False, inline="always")


#: ``_jit.stage_parameters``' forms of the output stage (its last value)
SATURATING, FOLDED, CLAMPED, UNIFORM = 0, 1, 2, 3


@_inline
def _finish(acc, params, out):
    """The output stage of one output pixel: ``acc`` (one value per channel) into ``out``;
    ``params`` from ``_jit.stage_parameters``.

    TFLite's MultiplyByQuantizedMultiplier (see quant_math) without branches, so that the
    loop over channels vectorizes: x = acc + bias shifted left and saturated to int32;
    the rounding doubling high multiply trunc((x * m + nudge) / 2**31), nudge 2**30 or
    1 - 2**30 by the product's sign, equals floor((x * m + 2**30) / 2**31) for every
    product (m >= 0 from QuantizeMultiplier; the INT32_MIN * INT32_MIN case cannot occur);
    the right shift by r rounding halves away from zero is
    floor((h + 2**(r - 1) - [h < 0 and r > 0]) / 2**r), and adding the zero point
    shifted left by r inside that floor adds it to the result.

    The forms (``mode``, fixed at preparation; each a loop of its own, the fewer
    operations per element the faster):
    - FOLDED (no left shifts, and |acc| + |bias| < 2**31 so that x needs no saturation):
      x * m + 2**30 = acc * m + (bias * m + 2**30), the second term one constant per
      channel; acc fits in int32, so the product is a 32 x 32 -> 64-bit one.
    - CLAMPED: FOLDED where the clamp's low end is at or above the zero point (a fused
      ReLU / ReLU6): the negative-tie correction only moves results below h = 0, which
      are at most the zero point and clamp to the low end either way, so it is dropped;
      what remains, floor((floor((x * m + 2**30) / 2**31) + offset) / 2**r), is one floor
      floor((x * m + 2**30 + offset * 2**31) / 2**(31 + r)) (nested floors of divisions
      by powers of two compose), the offset folded into the constant too
      (``stage_parameters`` takes this form only where that sum fits in int64): one add
      and one shift per element fewer (~0.75x the time of the two-step form).
    - UNIFORM: CLAMPED with one multiplier and one shift for every channel (per-tensor
      filters): those are scalars in the loop.
    """
    bias, multipliers, lefts, rights, offsets, negatives, constants, low, high, mode = params
    if mode == UNIFORM:
        multiplier, total = np.int64(multipliers[0]), rights[0] + 31
        for c in range(acc.shape[0]):
            value = (np.int64(np.int32(acc[c])) * multiplier + constants[c]) >> total
            out[c] = min(max(value, low), high)
    elif mode == CLAMPED:
        for c in range(acc.shape[0]):
            value = (np.int64(np.int32(acc[c])) * np.int64(multipliers[c]) + constants[c]) >> (rights[c] + 31)
            out[c] = min(max(value, low), high)
    elif mode == FOLDED:
        for c in range(acc.shape[0]):
            h = _folded_high_mul(acc[c], c, multipliers, constants)
            out[c] = _round_shift_clamp(h, c, rights, offsets, negatives, low, high)
    else:
        for c in range(acc.shape[0]):
            h = _saturated_high_mul(acc[c], c, bias, lefts, multipliers)
            out[c] = _round_shift_clamp(h, c, rights, offsets, negatives, low, high)


@_inline
def _folded_high_mul(a, c, multipliers, constants):
    """floor((x * m + 2**30) / 2**31) with bias and rounding folded into ``constants``;
    |a| < 2**31 (the folded forms' bound): a 32 x 32-bit product."""
    return (np.int64(np.int32(a)) * np.int64(multipliers[c]) + constants[c]) >> 31


@_inline
def _saturated_high_mul(a, c, bias, lefts, multipliers):
    """x = (a + bias) shifted left and saturated to int32, then floor((x * m + 2**30) / 2**31)."""
    x = (np.int64(a) + bias[c]) << lefts[c]
    x32 = np.int32(min(max(x, _INT32_MIN), _INT32_MAX))
    return (np.int64(x32) * np.int64(multipliers[c]) + (1 << 30)) >> 31


@_inline
def _round_shift_clamp(h, c, rights, offsets, negatives, low, high):
    """The right shift rounding halves away from zero, the zero point added, the clamp."""
    value = (h + offsets[c] + ((h >> 63) & negatives[c])) >> rights[c]
    return min(max(value, low), high)


@_jit
def requantize_rows(acc, params, out):
    """Output stage of a (rows, channels) block of accumulators into ``out`` (same shape)."""
    for r in range(acc.shape[0]):
        _finish(acc[r], params, out[r])


@_jit
def requantize_parts(parts, params, out, acc):
    """Output stage of accumulators given as ``parts`` (P, rows, channels) to be summed
    (float32 partial products of slices of the summed axis, each exact): the exact sum of
    the parts in int64 (in ``acc``, int64 scratch of one row), then as ``requantize_rows``."""
    count, rows, channels = parts.shape
    for r in range(rows):
        for c in range(channels):
            acc[c] = np.int64(parts[0, r, c])
        for p in range(1, count):
            for c in range(channels):
                acc[c] += np.int64(parts[p, r, c])
        _finish(acc, params, out[r])


@_jit
def conv_taps_quantized(products, width, kernel, dilations, params, out, acc):
    """The outputs of a stride-1 quantized CONV_2D from its per-tap products: ``products``
    ((rows + (KH - 1) * dh) * width, KH * KW * N) float32, row p * width + q holding the
    padded input pixel (p, q) times each tap's filter (columns (i * KW + j) * N + n), exact
    integers; output pixel (y, x) sums tap (i, j)'s product at pixel (y + i * dh, x + j *
    dw) in int32 (the caller bounds the sums below 2**31), then the output stage into
    ``out`` (rows, OW, N) (a uint8 view). ``acc``: int32 scratch (N,)."""
    rows, ow, n = out.shape
    kh, kw = kernel[0], kernel[1]
    for y in range(rows):
        for x in range(ow):
            for c in range(n):
                acc[c] = 0
            for i in range(kh):
                base = (y + i * dilations[0]) * width + x
                for j in range(kw):
                    tap = (i * kw + j) * n
                    source = products[base + j * dilations[1], tap:tap + n]
                    for c in range(n):
                        acc[c] += np.int32(source[c])
            _finish(acc, params, out[y, x])


@_jit
def dequantized(stored, flip, offset, scale, out):
    """Stored 8-bit values less their zero point, times ``scale``, in float32: ``stored``
    a flat uint8 view of int8 or uint8 values, ``out[i] = ((stored[i] ^ flip) - offset) *
    scale`` (int8 bits: flip 128, offset 128 + zero point; uint8: 0 and the zero point):
    DEQUANTIZE, and with scale 1 (exact) the input of an unpadded quantized product. One
    vectorized pass in 32-bit lanes, where numpy's subtract with a cast and its multiply
    take two passes, each ~2x slower; the same float32 operations, so the same bits."""
    for i in range(stored.shape[0]):
        out[i] = np.float32(np.int32((np.int32(stored[i]) ^ flip) - offset)) * scale


@_jit
def gemv_quantized(stored, flip, offset, weights, params, out, row, acc):
    """Quantized rows times a matrix, for few rows (a classifier's FULLY_CONNECTED, a 1x1
    convolution of a 1x1 image): ``stored`` (M, K) a uint8 view of the 8-bit inputs,
    (q ^ flip) - offset their values less the zero point (as ``dequantized``);
    ``weights`` (N, K) int8 or int16 with their zero point subtracted; each output the
    exact int32 sum of K products (the caller bounds it below 2**31), then the output
    stage into ``out`` (M, N), a uint8 view. The product reads the 8-bit (or 16-bit)
    filter once, a quarter (or half) of the float32 one a BLAS product streams, and its
    16-bit multiplies pair into vpmaddwd. ``row``: int16 scratch (K,); ``acc``: int32 (N,)."""
    m, k = stored.shape
    n = weights.shape[0]
    for r in range(m):
        for i in range(k):
            row[i] = np.int16((np.int32(stored[r, i]) ^ flip) - offset)
        for j in range(n):
            w = weights[j]
            total = np.int32(0)
            for i in range(k):  # int32 arithmetic (numba widens to int64 unless narrowed)
                total = np.int32(total + np.int32(row[i]) * np.int32(w[i]))
            acc[j] = total
        _finish(acc, params, out[r])


@_jit
def mean_float(x, count, out, acc):
    """Float32 MEAN over the middle axis of ``x`` (outer, reduced, inner): each output the
    float64 sum of its column taken in order from 0, divided by ``count`` (float64) and rounded
    to float32, into ``out`` (outer, inner); vectorized along the inner axis. numpy's
    float64 sum over outer axes adds row after row in that order, so the bits are
    numpy's. ``acc``: float64 scratch (inner,)."""
    outer, reduced, inner = x.shape
    for b in range(outer):
        for a in range(inner):
            acc[a] = 0.0  # numpy starts from its identity: -0 + 0 is +0
        for r in range(reduced):
            row = x[b, r]
            for a in range(inner):
                acc[a] += np.float64(row[a])
        target = out[b]
        for a in range(inner):
            target[a] = np.float32(acc[a] / count)


@_jit
def softmax_quantized(stored, flip, table, scale, zero_point, low, high, out, exps, stack):
    """Quantized SOFTMAX along the last axis of ``stored`` (rows, n), a uint8 view of
    8-bit values ((q ^ flip) orders them as their values do: flip 128 for int8 bits):
    exps[i] = table[max q - q], divided by their float64 sum taken in numpy's pairwise
    order (``_pairwise``), then quantized as ``common.quantize`` does: round(p / scale +
    zero_point) halves away from zero, clamped to [``low``, ``high``], stored through
    the uint8 view ``out``; every step the float64 operation numpy performs, so numpy's
    bits. ``exps``: float64 scratch (n + 64,); ``stack``: int64 scratch (192,)."""
    rows, n = stored.shape
    for r in range(rows):
        source = stored[r]
        top = np.int32(0)
        for i in range(n):
            top = max(top, np.int32(source[i]) ^ flip)
        for i in range(n):
            exps[i] = table[top - (np.int32(source[i]) ^ flip)]
        total = 0.0 + _pairwise(exps, n, stack)  # numpy's sum starts from its identity
        target = out[r]
        for i in range(n):
            scaled = exps[i] / total / scale + zero_point
            magnitude = np.trunc(np.abs(scaled) + HALF_BELOW_FLOAT64)
            value = min(max(magnitude if scaled >= 0 else -magnitude, low), high)
            target[i] = np.uint8(np.int64(value) & 0xFF)


@_inline
def _pairwise(a, n, stack):
    """numpy's pairwise sum of float64 ``a[:n]`` (its add reduction along a contiguous
    axis): a block of at most 128 values is summed by ``_pairwise_block``; a longer one
    is split in two, the first part a multiple of 8 long, the halves summed apart and
    added. The recursion runs on an explicit stack (numba links no recursive call into
    these kernels): ``stack`` int64 (192,) holds each pending block's start, length and
    state, and ``a[n:n + 64]`` the sums of finished first halves."""
    starts, counts, states = stack[0:64], stack[64:128], stack[128:192]
    halves = a[n:n + 64]
    depth = 0
    starts[0], counts[0], states[0] = 0, n, 0
    value = 0.0
    while depth >= 0:
        count = counts[depth]
        if states[depth] == 0 and count > 128:  # split: the first half next
            half = count // 2
            half -= half % 8
            states[depth] = 1
            starts[depth + 1], counts[depth + 1], states[depth + 1] = starts[depth], half, 0
            depth += 1
            continue
        if states[depth] == 0:  # a block: its sum goes to the block that split it
            value = _pairwise_block(a, starts[depth], count)
        elif states[depth] == 1:  # the first half summed: the second next
            halves[depth] = value
            half = count // 2
            half -= half % 8
            states[depth] = 2
            starts[depth + 1], counts[depth + 1], states[depth + 1] = starts[depth] + half, count - half, 0
            depth += 1
            continue
        else:  # both halves summed
            value = halves[depth] + value
        depth -= 1
    return value


@_inline
def _pairwise_block(a, start, n):
    """numpy's sum of at most 128 values: below 8 in order from 0; else eight interleaved
    running sums combined as ((0 + 1) + (2 + 3)) + ((4 + 5) + (6 + 7)), the rest in order."""
    if n < 8:
        result = 0.0
        for i in range(start, start + n):
            result += a[i]
        return result
    r0, r1, r2, r3 = a[start], a[start + 1], a[start + 2], a[start + 3]
    r4, r5, r6, r7 = a[start + 4], a[start + 5], a[start + 6], a[start + 7]
    i = start + 8
    stop = start + n - n % 8
    while i < stop:
        r0 += a[i]
        r1 += a[i + 1]
        r2 += a[i + 2]
        r3 += a[i + 3]
        r4 += a[i + 4]
        r5 += a[i + 5]
        r6 += a[i + 6]
        r7 += a[i + 7]
        i += 8
    result = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
    while i < start + n:
        result += a[i]
        i += 1
    return result


@_jit
def depthwise_quantized(x, input_zero_point, weights, zero_point_sums, multiplier, strides, dilations, pads, params,
                        out, acc):
    """Quantized DEPTHWISE_CONV_2D: ``x`` (N, H, W, C) stored 8-bit values, ``weights``
    (KH, KW, C * multiplier) int32 with their zero point subtracted, ``zero_point_sums``
    the input zero point times each channel's filter sum (int32), ``strides`` /
    ``dilations`` (h, w), ``pads`` (top, left); writes ``out`` (N, OH, OW, C * multiplier).
    Elements are indexed directly (no array views in the loops: each view would count a
    reference). A 3x3 filter's output pixels whose window lies inside the input (all but
    the border) sum their nine taps in one pass over the channels (``_inner_3x3``);
    every other pixel accumulates tap by tap over its row (``_taps``). ``acc``: int32
    scratch of one output row, (OW, C * multiplier)."""
    n, height, width, channels = x.shape
    kh, kw, depth = weights.shape
    _, oh, ow, _ = out.shape
    three = kh == 3 and kw == 3 and multiplier == 1
    lo, hi = _inner_columns(width, ow, kw, strides[1], dilations[1], pads[1])
    for b in range(n):
        for oy in range(oh):
            top = oy * strides[0] - pads[0]
            if three and lo < hi and top >= 0 and top + 2 * dilations[0] < height:
                _inner_3x3(x, b, top, weights, zero_point_sums, strides[1], dilations, pads[1], lo, hi, acc)
                _taps(x, b, top, input_zero_point, weights, multiplier, strides[1], dilations, pads[1], 0, lo, acc)
                _taps(x, b, top, input_zero_point, weights, multiplier, strides[1], dilations, pads[1], hi, ow, acc)
            else:
                _taps(x, b, top, input_zero_point, weights, multiplier, strides[1], dilations, pads[1], 0, ow, acc)
            _requantize_block(acc, params, out, b, oy)


@_inline
def _inner_columns(width, ow, kw, stride, dilation, pad):
    """[lo, hi): the output columns whose every tap lies inside the input row."""
    lo = min(ow, (pad + stride - 1) // stride)
    reach = width - 1 - (kw - 1) * dilation + pad  # the last window start inside the row
    hi = min(ow, reach // stride + 1) if reach >= 0 else 0
    return lo, max(lo, hi)


@_inline
def _inner_3x3(x, b, top, weights, zero_point_sums, stride, dilations, pad, lo, hi, acc):
    """Output columns [lo, hi) of one row of a 3x3 filter, every tap inside the input:
    sum (x - zp) * w = sum x * w - zp * sum w (``zero_point_sums``), nine products per
    channel in one pass (exact: the int32 result is the same integer however it is summed)."""
    channels = x.shape[3]
    dh, dw = dilations[0], dilations[1]
    y1, y2 = top + dh, top + 2 * dh
    for ox in range(lo, hi):
        x0 = ox * stride - pad
        x1, x2 = x0 + dw, x0 + 2 * dw
        for c in range(channels):
            acc[ox, c] = (np.int32(x[b, top, x0, c]) * weights[0, 0, c] + np.int32(x[b, top, x1, c]) * weights[0, 1, c]
                          + np.int32(x[b, top, x2, c]) * weights[0, 2, c]
                          + np.int32(x[b, y1, x0, c]) * weights[1, 0, c] + np.int32(x[b, y1, x1, c]) * weights[1, 1, c]
                          + np.int32(x[b, y1, x2, c]) * weights[1, 2, c]
                          + np.int32(x[b, y2, x0, c]) * weights[2, 0, c] + np.int32(x[b, y2, x1, c]) * weights[2, 1, c]
                          + np.int32(x[b, y2, x2, c]) * weights[2, 2, c] - zero_point_sums[c])


@_inline
def _taps(x, b, top, input_zero_point, weights, multiplier, stride, dilations, pad, start, stop, acc):
    """Output columns [start, stop) of one row, accumulated tap by tap over the columns
    each tap reaches (no bounds test per pixel; taps outside the input add nothing)."""
    height, width, channels = x.shape[1], x.shape[2], x.shape[3]
    kh, kw = weights.shape[0], weights.shape[1]
    acc[start:stop] = 0
    for i in range(kh):
        y = top + i * dilations[0]
        if y < 0 or y >= height:
            continue
        for j in range(kw):
            # the output columns whose tap j falls inside the input row
            offset = j * dilations[1] - pad
            first = max(start, (-offset + stride - 1) // stride)
            last = min(stop, (width - 1 - offset) // stride + 1)
            for ox in range(first, last):
                xx = ox * stride + offset
                if multiplier == 1:
                    for c in range(channels):
                        acc[ox, c] += (np.int32(x[b, y, xx, c]) - input_zero_point) * weights[i, j, c]
                else:
                    for c in range(channels):
                        value = np.int32(x[b, y, xx, c]) - input_zero_point
                        for q in range(multiplier):
                            acc[ox, c * multiplier + q] += value * weights[i, j, c * multiplier + q]


@_jit
def depthwise_rows_quantized(x, input_zero_point, weights, channels, strides, dilations, pads, params, out, acc):
    """Quantized DEPTHWISE_CONV_2D over whole rows: ``x`` (N, H, W * C) stored 8-bit
    values, ``weights`` (KH, KW, OW * C) int32 (zero point subtracted) tiled along an
    output row, ``params`` the output stage tiled likewise, ``out`` (N, OH, OW * C);
    stride 1 along rows (``strides[0]`` down), multiplier 1. Each tap adds one run of
    pixels x channels: the output columns it reaches, shifted by its offset; taps in the
    padding add nothing. ``acc``: int32 scratch of one output row (OW * C)."""
    n, height, row = x.shape
    kh, kw, span = weights.shape
    oh = out.shape[1]
    width, ow = row // channels, span // channels
    for b in range(n):
        for oy in range(oh):
            acc[:] = 0
            top = oy * strides[0] - pads[0]
            for i in range(kh):
                y = top + i * dilations[0]
                if y < 0 or y >= height:
                    continue
                for j in range(kw):
                    offset = j * dilations[1] - pads[1]
                    first, last = max(0, -offset) * channels, min(ow, width - offset) * channels
                    if first >= last:
                        continue
                    # views of the run (indexes that are the loop's own vectorize; one
                    # computed from it is tested for negative values at every element)
                    source = x[b, y, first + offset * channels:last + offset * channels]
                    taps, sums = weights[i, j, first:last], acc[first:last]
                    for k in range(last - first):
                        sums[k] += (np.int32(source[k]) - input_zero_point) * taps[k]
            _finish(acc, params, out[b, oy])


@_jit
def depthwise_rows_float(x, weights, channels, strides, dilations, pads, bias, low, high, out, acc):
    """``depthwise_rows_quantized`` in float32: ``bias`` tiled along a row, results
    clamped to [``low``, ``high``] (NaN kept); taps summed in the filter's order; ``acc``:
    float32 scratch of one output row (OW * C)."""
    n, height, row = x.shape
    kh, kw, span = weights.shape
    oh = out.shape[1]
    width, ow = row // channels, span // channels
    for b in range(n):
        for oy in range(oh):
            acc[:] = 0
            top = oy * strides[0] - pads[0]
            for i in range(kh):
                y = top + i * dilations[0]
                if y < 0 or y >= height:
                    continue
                for j in range(kw):
                    offset = j * dilations[1] - pads[1]
                    first, last = max(0, -offset) * channels, min(ow, width - offset) * channels
                    if first >= last:
                        continue
                    source = x[b, y, first + offset * channels:last + offset * channels]
                    taps, sums = weights[i, j, first:last], acc[first:last]
                    for k in range(last - first):
                        sums[k] += source[k] * taps[k]
            for k in range(span):
                out[b, oy, k] = _clamp(acc[k] + bias[k], low, high)


@_inline
def _requantize_block(acc, params, out, b, oy):
    """The output stage of one output row ``acc`` (OW, depth) into ``out[b, oy]``."""
    for ox in range(acc.shape[0]):
        _finish(acc[ox], params, out[b, oy, ox])


@_jit
def depthwise_float(x, weights, multiplier, strides, dilations, pads, bias, low, high, out, acc):
    """Float32 DEPTHWISE_CONV_2D: ``x`` (N, H, W, C), ``weights`` (KH, KW, C * multiplier),
    ``bias`` per output channel, results clamped to [``low``, ``high``] into ``out``;
    the interior of a 3x3 filter in one pass of nine products per channel, as
    ``depthwise_quantized`` (the taps added in the same order as the other pixels);
    ``acc``: float32 scratch of one output row, (OW, C * multiplier)."""
    n, height, width, channels = x.shape
    kh, kw, depth = weights.shape
    _, oh, ow, _ = out.shape
    three = kh == 3 and kw == 3 and multiplier == 1
    lo, hi = _inner_columns(width, ow, kw, strides[1], dilations[1], pads[1])
    for b in range(n):
        for oy in range(oh):
            top = oy * strides[0] - pads[0]
            if three and lo < hi and top >= 0 and top + 2 * dilations[0] < height:
                _inner_3x3_float(x, b, top, weights, strides[1], dilations, pads[1], lo, hi, acc)
                _taps_float(x, b, top, weights, multiplier, strides[1], dilations, pads[1], 0, lo, acc)
                _taps_float(x, b, top, weights, multiplier, strides[1], dilations, pads[1], hi, ow, acc)
            else:
                _taps_float(x, b, top, weights, multiplier, strides[1], dilations, pads[1], 0, ow, acc)
            for ox in range(ow):
                for c in range(depth):
                    value = acc[ox, c] + bias[c]
                    if value < low:  # NaN stays NaN, as with np.clip
                        value = low
                    elif value > high:
                        value = high
                    out[b, oy, ox, c] = value


@_inline
def _inner_3x3_float(x, b, top, weights, stride, dilations, pad, lo, hi, acc):
    """``_inner_3x3`` in float32: the nine products summed in the taps' order."""
    channels = x.shape[3]
    dh, dw = dilations[0], dilations[1]
    y1, y2 = top + dh, top + 2 * dh
    for ox in range(lo, hi):
        x0 = ox * stride - pad
        x1, x2 = x0 + dw, x0 + 2 * dw
        for c in range(channels):
            acc[ox, c] = (x[b, top, x0, c] * weights[0, 0, c] + x[b, top, x1, c] * weights[0, 1, c]
                          + x[b, top, x2, c] * weights[0, 2, c]
                          + x[b, y1, x0, c] * weights[1, 0, c] + x[b, y1, x1, c] * weights[1, 1, c]
                          + x[b, y1, x2, c] * weights[1, 2, c]
                          + x[b, y2, x0, c] * weights[2, 0, c] + x[b, y2, x1, c] * weights[2, 1, c]
                          + x[b, y2, x2, c] * weights[2, 2, c])


@_inline
def _taps_float(x, b, top, weights, multiplier, stride, dilations, pad, start, stop, acc):
    """``_taps`` in float32."""
    height, width, channels = x.shape[1], x.shape[2], x.shape[3]
    kh, kw = weights.shape[0], weights.shape[1]
    acc[start:stop] = 0
    for i in range(kh):
        y = top + i * dilations[0]
        if y < 0 or y >= height:
            continue
        for j in range(kw):
            offset = j * dilations[1] - pad
            first = max(start, (-offset + stride - 1) // stride)
            last = min(stop, (width - 1 - offset) // stride + 1)
            for ox in range(first, last):
                xx = ox * stride + offset
                if multiplier == 1:
                    for c in range(channels):
                        acc[ox, c] += x[b, y, xx, c] * weights[i, j, c]
                else:
                    for c in range(channels):
                        for q in range(multiplier):
                            acc[ox, c * multiplier + q] += x[b, y, xx, c] * weights[i, j, c * multiplier + q]


@_jit
def prelu_float(x, alpha, out):
    """Float32 PRELU, x >= 0 ? x : x * alpha, in one pass: ``x`` and ``out`` flat, the
    slopes ``alpha`` flat of a length that divides x's (they repeat with that period:
    the slopes of the input's trailing axes). NaN is not >= 0: NaN * alpha, as numpy's.
    The product is formed for every element and then selected: with no load or multiply
    left inside a branch the loop vectorizes (compare, multiply, blend; ~5x faster than
    the branch per element, and faster than numpy's two-pass maximum form)."""
    period = alpha.shape[0]
    for start in range(0, x.shape[0], period):
        # views of one period (indexes that are the loop's own vectorize)
        source, target = x[start:start + period], out[start:start + period]
        for i in range(period):
            value = source[i]
            scaled = value * alpha[i]
            target[i] = value if value >= 0 else scaled


@_jit
def lookup_pairs(first, second, table, out):
    """``out[i] = table[first[i] * 256 + second[i % P]]``: flat uint8 views of two 8-bit
    tensors, the 65536-entry table and the output (8-bit results); ``second`` holds P
    values, P dividing first's length: the same shape (P = all), or a tensor broadcast
    along leading axes only, repeated with period P (a per-channel constant: P = C)."""
    period = max(second.shape[0], 1)  # empty arrays (the warm-up): no period
    if period == 1:  # a scalar
        value = np.int64(second[0]) if second.shape[0] else np.int64(0)
        for i in range(first.shape[0]):
            out[i] = table[(np.int64(first[i]) << 8) | value]
    elif period < 64:  # short periods: a running index (two views per few elements cost more)
        j = 0
        for i in range(first.shape[0]):
            out[i] = table[(np.int64(first[i]) << 8) | np.int64(second[j])]
            j += 1
            if j == period:
                j = 0
    else:
        for start in range(0, first.shape[0], period):
            # views of one period (indexes that are the loop's own)
            source, target = first[start:start + period], out[start:start + period]
            for i in range(period):
                target[i] = table[(np.int64(source[i]) << 8) | np.int64(second[i])]


@_jit
def max_pool(x, kernel, strides, pads, fill, low, high, out):
    """MAX_POOL_2D of ``x`` (N, H, W, C) into ``out`` (N, OH, OW, C): ``kernel`` /
    ``strides`` (h, w), ``pads`` (top, left); taps in the padding are skipped (they hold
    ``fill``, the type's lowest value, which never wins), a window wholly in the padding
    gives ``fill``. The maximum is numpy's: NaN wins, and a later tap wins a tie (as
    np.maximum(result, tap) does). Results clamped to [``low``, ``high``] (NaN kept).
    The output columns of a 2x2 window inside the input take their four taps in one pass
    over the channels (a loop over few channels per tap costs more than the taps)."""
    n, height, width, channels = x.shape
    _, oh, ow, _ = out.shape
    two = kernel[0] == 2 and kernel[1] == 2
    lo, hi = _inner_columns(width, ow, kernel[1], strides[1], 1, pads[1])
    for b in range(n):
        for oy in range(oh):
            top = oy * strides[0] - pads[0]
            if two and lo < hi and top >= 0 and top + 1 < height:
                _max_2x2(x, b, top, strides[1], pads[1], lo, hi, low, high, out, oy)
                _max_taps(x, b, top, kernel, strides[1], pads[1], 0, lo, fill, low, high, out, oy)
                _max_taps(x, b, top, kernel, strides[1], pads[1], hi, ow, fill, low, high, out, oy)
            else:
                _max_taps(x, b, top, kernel, strides[1], pads[1], 0, ow, fill, low, high, out, oy)


@_jit
def average_pool_quantized(x, kernel, strides, pads, low, high, out, acc):
    """Quantized AVERAGE_POOL_2D of ``x`` (N, H, W, C) 8-bit values into ``out`` (N, OH,
    OW, C): each window's stored values summed exactly in int32 over its taps inside the
    input (the padding is not counted), divided in float32 by that count, rounded halves
    away from zero and clamped to [``low``, ``high``] (float32): the numpy pooling's
    float32 operations (its float32 sums are exact integers), so the same values.
    ``acc``: int32 scratch (C,). Every window must hold a tap of the input."""
    n, height, width, channels = x.shape
    _, oh, ow, _ = out.shape
    half = HALF_BELOW_FLOAT32  # C's round exactly (quant_math.half_below)
    for b in range(n):
        for oy in range(oh):
            top = oy * strides[0] - pads[0]
            first_i, last_i = max(0, -top), min(kernel[0], height - top)
            for ox in range(ow):
                left = ox * strides[1] - pads[1]
                first_j, last_j = max(0, -left), min(kernel[1], width - left)
                for c in range(channels):
                    acc[c] = 0
                for i in range(first_i, last_i):
                    for j in range(first_j, last_j):
                        row = x[b, top + i, left + j]
                        for c in range(channels):
                            acc[c] += np.int32(row[c])
                count = np.float32((last_i - first_i) * (last_j - first_j))
                target = out[b, oy, ox]
                for c in range(channels):
                    value = np.float32(acc[c]) / count
                    magnitude = np.float32(np.trunc(np.float32(abs(value) + half)))
                    value = magnitude if value >= 0 else -magnitude
                    target[c] = min(max(value, low), high)


@_inline
def _max_2x2(x, b, top, stride, pad, lo, hi, low, high, out, oy):
    """Output columns [lo, hi) of row ``oy`` of a 2x2 window inside the input."""
    for ox in range(lo, hi):
        left = ox * stride - pad
        for c in range(x.shape[3]):
            best = _later_max(_later_max(_later_max(x[b, top, left, c], x[b, top, left + 1, c]),
                                         x[b, top + 1, left, c]), x[b, top + 1, left + 1, c])
            out[b, oy, ox, c] = _clamp(best, low, high)


@_inline
def _max_taps(x, b, top, kernel, stride, pad, start, stop, fill, low, high, out, oy):
    """Output columns [start, stop) of row ``oy``, any window, tap by tap."""
    height, width, channels = x.shape[1], x.shape[2], x.shape[3]
    first_i, last_i = max(0, -top), min(kernel[0], height - top)
    for ox in range(start, stop):
        left = ox * stride - pad
        first_j, last_j = max(0, -left), min(kernel[1], width - left)
        for c in range(channels):
            out[b, oy, ox, c] = fill
        for i in range(first_i, last_i):
            for j in range(first_j, last_j):
                for c in range(channels):
                    out[b, oy, ox, c] = _later_max(out[b, oy, ox, c], x[b, top + i, left + j, c])
        for c in range(channels):
            out[b, oy, ox, c] = _clamp(out[b, oy, ox, c], low, high)


@_inline
def _later_max(best, value):
    """np.maximum(best, value): NaN wins, ``value`` wins a tie."""
    return value if value >= best or value != value else best


@_inline
def _clamp(value, low, high):
    """``value`` clamped to [low, high], NaN kept (np.clip's result)."""
    if value < low:
        return low
    if value > high:
        return high
    return value


@_jit
def lstm_add(z, pre):
    """``z += pre`` for (batch, columns) float32 arrays (a time step's input products)."""
    for b in range(z.shape[0]):
        for j in range(z.shape[1]):
            z[b, j] = pre[b, j] + z[b, j]


@_jit_ieee
def lstm_gates(z, c, candidate, forget, input_gate, output, units, clip):
    """One LSTM step after ``z`` holds exp(-pre-activation) in the gates' columns (from
    ``forget``, ``input_gate`` (-1: CIFG, i = 1 - f) and ``output``, ``units`` each) and
    ``candidate`` the activated cell columns: the gates' sigmoids 1 / (1 + z), written
    back into ``z``; c = f * c + i * candidate (clipped to [-clip, clip] when clip > 0,
    NaN kept), in place. The float32 operations of ``PreparedLstm``'s numpy step, in its
    order (no fused multiply-add: numba does not contract without fastmath)."""
    one = np.float32(1.0)
    low, high = np.float32(-clip), np.float32(clip)
    for b in range(z.shape[0]):
        for j in range(units):
            f = one / (one + z[b, forget + j])
            z[b, forget + j] = f
            if input_gate < 0:
                i = one - f
            else:
                i = one / (one + z[b, input_gate + j])
                z[b, input_gate + j] = i
            z[b, output + j] = one / (one + z[b, output + j])
            value = f * c[b, j] + i * candidate[b, j]
            if clip > 0:
                if value < low:
                    value = low
                elif value > high:
                    value = high
            c[b, j] = value


# --- numpy's own machine code, called from compiled loops (``_native_loops``) ----------------
_BYTES = ir.IntType(8).as_pointer()
_I32, _I64, _F32 = ir.IntType(32), ir.IntType(64), ir.FloatType()


def _address(context, builder, value_type, value):
    """An integer argument as an i64."""
    return context.cast(builder, value, value_type, nbtypes.int64)


def _element(context, builder, array_type, array, index_type, index):
    """The address of flat element ``index`` of a C-contiguous array, as ``char *``."""
    data = context.make_array(array_type)(context, builder, array).data
    return builder.bitcast(builder.gep(data, [_address(context, builder, index_type, index)]), _BYTES)


def _function(builder, address, return_type, argument_types):
    return builder.inttoptr(address, ir.FunctionType(return_type, argument_types).as_pointer())


@intrinsic
def _unary_loop(typingctx, function, data, source, source_at, target, target_at, count):
    """Call numpy's unary float32 ufunc loop at address ``function`` (with its ``data``)
    over ``count`` contiguous elements of ``source`` from flat index ``source_at`` into
    ``target`` from ``target_at`` (may be the same elements: numpy's in-place call)."""
    signature = nbtypes.void(function, data, source, source_at, target, target_at, count)

    def codegen(context, builder, sig, args):
        types = sig.args
        argv = cgutils.alloca_once(builder, _BYTES, size=2)
        builder.store(_element(context, builder, types[2], args[2], types[3], args[3]), argv)
        builder.store(_element(context, builder, types[4], args[4], types[5], args[5]),
                      builder.gep(argv, [ir.Constant(_I64, 1)]))
        dimensions = cgutils.alloca_once_value(builder, _address(context, builder, types[6], args[6]))
        steps = cgutils.alloca_once(builder, _I64, size=2)
        builder.store(ir.Constant(_I64, 4), steps)
        builder.store(ir.Constant(_I64, 4), builder.gep(steps, [ir.Constant(_I64, 1)]))
        loop = _function(builder, _address(context, builder, types[0], args[0]), ir.VoidType(), [_BYTES] * 4)
        builder.call(loop, [builder.bitcast(argv, _BYTES), builder.bitcast(dimensions, _BYTES),
                            builder.bitcast(steps, _BYTES),
                            builder.inttoptr(_address(context, builder, types[1], args[1]), _BYTES)])
        return context.get_dummy_value()

    return signature, codegen


@intrinsic
def _vector_matrix(typingctx, function, vector, vector_at, matrix, out):
    """``out[0] = vector[at: at + size] @ matrix`` ([size, columns] C-contiguous) as
    ``np.matmul`` computes one row times a matrix: BLAS sgemv at address ``function``, row
    major, transposed, unit increments, alpha 1, beta 0."""
    signature = nbtypes.void(function, vector, vector_at, matrix, out)

    def codegen(context, builder, sig, args):
        types = sig.args
        shape = cgutils.unpack_tuple(builder, context.make_array(types[3])(context, builder, args[3]).shape, 2)
        size, columns = shape
        one, zero, unit = ir.Constant(_F32, 1.0), ir.Constant(_F32, 0.0), ir.Constant(_I64, 1)
        gemv = _function(builder, _address(context, builder, types[0], args[0]), ir.VoidType(),
                         [_I32, _I32, _I64, _I64, _F32, _BYTES, _I64, _BYTES, _I64, _F32, _BYTES, _I64])
        builder.call(gemv, [ir.Constant(_I32, 101), ir.Constant(_I32, 112), size, columns, one,
                            _element(context, builder, types[3], args[3], nbtypes.int64, ir.Constant(_I64, 0)),
                            columns, _element(context, builder, types[1], args[1], types[2], args[2]), unit, zero,
                            _element(context, builder, types[4], args[4], nbtypes.int64, ir.Constant(_I64, 0)),
                            unit])
        return context.get_dummy_value()

    return signature, codegen


@intrinsic
def _matrix_matrix(typingctx, function, rows, left, left_at, matrix, out):
    """``out = left[at: at + rows * size] (as [rows, size]) @ matrix`` ([size, columns],
    C-contiguous) as ``np.matmul`` computes contiguous matrices: BLAS sgemm at address
    ``function``, row major, no transposes, alpha 1, beta 0."""
    signature = nbtypes.void(function, rows, left, left_at, matrix, out)

    def codegen(context, builder, sig, args):
        types = sig.args
        size, columns = cgutils.unpack_tuple(builder, context.make_array(types[4])(context, builder, args[4]).shape, 2)
        gemm = _function(builder, _address(context, builder, types[0], args[0]), ir.VoidType(),
                         [_I32, _I32, _I32, _I64, _I64, _I64, _F32, _BYTES, _I64, _BYTES, _I64, _F32, _BYTES, _I64])
        builder.call(gemm, [ir.Constant(_I32, 101), ir.Constant(_I32, 111), ir.Constant(_I32, 111),
                            _address(context, builder, types[1], args[1]), columns, size, ir.Constant(_F32, 1.0),
                            _element(context, builder, types[2], args[2], types[3], args[3]), size,
                            _element(context, builder, types[4], args[4], nbtypes.int64, ir.Constant(_I64, 0)),
                            columns, ir.Constant(_F32, 0.0),
                            _element(context, builder, types[5], args[5], nbtypes.int64, ir.Constant(_I64, 0)),
                            columns])
        return context.get_dummy_value()

    return signature, codegen


@_jit
def lstm_sequence(natives, pre, recurrent, h0, outputs, c, z, candidate, cell_out, start, stop, forget, input_gate,
                  output, cell, units, clip):
    """Time steps ``start`` to ``stop`` of ``PreparedLstm``'s loop (tanh activation, no
    projection) in one call: z = h @ recurrent (numpy's BLAS call; h is ``h0`` at step 0,
    else the previous step's outputs), z += pre[t], candidate = tanh(cell columns), z =
    exp(z), the gates and cell update (``lstm_gates``), outputs[t] = o * tanh(c). The
    exponential and tanh are numpy's own loops (``natives``: ``_native_loops.Natives.
    as_array``), so every value is the numpy step's bit for bit."""
    exp, exp_data, tanh, tanh_data, gemv, gemm = natives[0], natives[1], natives[2], natives[3], natives[4], natives[5]
    batch, columns = z.shape
    width = h0.shape[0] * h0.shape[1]
    for t in range(start, stop):
        if batch == 1:
            if t == 0:
                _vector_matrix(gemv, h0, 0, recurrent, z)
            else:
                _vector_matrix(gemv, outputs, (t - 1) * width, recurrent, z)
        elif t == 0:
            _matrix_matrix(gemm, batch, h0, 0, recurrent, z)
        else:
            _matrix_matrix(gemm, batch, outputs, (t - 1) * width, recurrent, z)
        for b in range(batch):
            for j in range(columns):
                z[b, j] = pre[t, b, j] + z[b, j]
        for b in range(batch):
            _unary_loop(tanh, tanh_data, z, b * columns + cell, candidate, b * units, units)
        _unary_loop(exp, exp_data, z, 0, z, 0, batch * columns)
        lstm_gates(z, c, candidate, forget, input_gate, output, units, clip)
        _unary_loop(tanh, tanh_data, c, 0, cell_out, 0, batch * units)
        for b in range(batch):
            for j in range(units):
                outputs[t, b, j] = z[b, output + j] * cell_out[b, j]


@_jit_ieee
def logistic(x, out, natives):
    """The float32 LOGISTIC 1 / (1 + exp(-x)) of a flat array into ``out`` in one call:
    the negation, numpy's own exp loop (``natives``, as in ``lstm_sequence``) in place,
    then 1 / (1 + e): ``activations._logistic_in_place``'s operations, so its values."""
    count = x.shape[0]
    for i in range(count):
        out[i] = -x[i]
    _unary_loop(natives[0], natives[1], out, 0, out, 0, count)
    one = np.float32(1.0)
    for i in range(count):
        out[i] = one / (one + out[i])
