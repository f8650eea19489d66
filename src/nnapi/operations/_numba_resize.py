"""Compiled RESIZE_BILINEAR for the prepared path (the optional ``nnapi[fast]`` extra).

Imported by ``resize.py`` only when ``_jit.kernels()`` says numba is in use. One pass over
the output doing the float32 arithmetic of the numpy kernel in the same order
(``a * wy0 * wx0 + b * wy1 * wx0 + c * wy0 * wx1 + d * wy1 * wx1``, left to right, no
fused multiply-add), so the two agree bit for bit; tests compare them.
"""

from __future__ import annotations

import numpy as np

from nnapi.operations._numba_cache import kernel


@kernel(nogil=True, fastmath=False, boundscheck=False)
def bilinear_nhwc(x, y0, y1, wy0, wy1, x0, x1, wx0, wx1, truncate, out):
    """``out[b, i, j, k]``: the bilinear blend of ``x`` (NHWC, C-contiguous) at rows
    y0[i] / y1[i] and columns x0[j] / x1[j] with float32 weights; truncated toward zero
    before the store when ``truncate`` (the quantized kernels' cast)."""
    batches, _, _, channels = x.shape
    for b in range(batches):
        for i in range(y0.size):
            top, bottom = x[b, y0[i]], x[b, y1[i]]
            w_top, w_bottom = wy0[i], wy1[i]
            for j in range(x0.size):
                left, right = x0[j], x1[j]
                w_left, w_right = wx0[j], wx1[j]
                row = out[b, i, j]
                for k in range(channels):
                    value = (np.float32(top[left, k]) * w_top * w_left
                             + np.float32(bottom[left, k]) * w_bottom * w_left
                             + np.float32(top[right, k]) * w_top * w_right
                             + np.float32(bottom[right, k]) * w_bottom * w_right)
                    row[k] = np.trunc(value) if truncate else value
