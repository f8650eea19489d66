"""Compiled one-pass kernels for quantized element-wise work (the optional ``nnapi[fast]`` extra).

Imported by the operation modules only when ``_jit.kernels()`` says numba is in use. Each
does, per element, the operations of the numpy kernel it replaces in the same order and
precision, so the two agree bit for bit (tests compare them); numpy needs several passes
and temporaries (or ``np.take``, ~0.8 ns per element) for what these do in one:

- ``lookup``: ``out[i] = table[x[i]]`` over flat uint8 views: an 8-bit function of one
  8-bit tensor through its 256-entry table (quantized activations).
- ``quantize_float32``: QUANTIZE of float32 values, ``clamp(round(x / scale)) + zero
  point`` as ``Quantize.plan`` computes it (the clamp first, halves away from zero).
- ``argmax_rows``: the first index of the largest value of each row of a float32 matrix
  (as Android's ARGMAX scans: a NaN first stays, a later one is never taken); a short
  innermost axis costs numpy ~60 ns per row.

One machine-code version each (the argument types are fixed by the callers: uint8 views,
float32 / int16 / int32 arrays), compiled on first use and cached on disk by numba.
"""

from __future__ import annotations

import numpy as np

from nnapi.operations._numba_cache import kernel
from nnapi.operations.quant_math import HALF_BELOW_FLOAT32

_jit = kernel(nogil=True, fastmath=False, boundscheck=False)


@_jit
def lookup(x, table, out):
    """``out[i] = table[x[i]]`` for flat uint8 arrays (the table has 256 entries)."""
    for i in range(x.shape[0]):
        out[i] = table[x[i]]


@_jit
def quantize_float32(x, scale, bottom, top, zero_point, out):
    """``out[i] = round_half_away(clamp(x[i] / scale, bottom, top)) + zero_point`` over
    flat float32 ``x`` into int16 ``out``; NaN clamps to ``top`` (as np.fmin does)."""
    half = HALF_BELOW_FLOAT32  # C's round exactly (quant_math.half_below)
    for i in range(x.shape[0]):
        value = x[i] / scale
        if not value < top:
            value = top
        elif value < bottom:
            value = bottom
        magnitude = np.int16(abs(value) + half)  # truncates: |value| + half <= 256.5
        out[i] = (-magnitude if value < 0 else magnitude) + zero_point


@_jit
def argmax_rows(x, out):
    """``out[r]``: the index of the first largest value of each row of a C-contiguous float32
    matrix, into int32, as Android's ARGMAX scans (value > best from the first value on: a
    NaN first stays, a later NaN is never taken). The scan selects without branching (a
    branch per element mispredicts on random rows: 4x slower)."""
    rows, columns = x.shape
    for r in range(rows):
        best = x[r, 0]
        index = 0
        for c in range(1, columns):
            value = x[r, c]
            better = value > best
            best = value if better else best
            index = c if better else index
        out[r] = index
