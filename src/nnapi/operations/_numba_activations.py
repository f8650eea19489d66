"""Compiled float32 activations for the prepared path (the optional ``nnapi[fast]`` extra).

Imported by ``activations.py`` only when ``_jit.kernels()`` says numba is in use. One pass
doing the numpy kernel's float32 operations in its order, so the two agree bit for bit;
tests compare them. (Functions built on exp / tanh stay on numpy: its SIMD exp and libm's
may round differently.)
"""

from __future__ import annotations

import numpy as np

from nnapi.operations._numba_cache import kernel


@kernel(nogil=True, fastmath=False, boundscheck=False)
def hard_swish(x, out):
    """``out = x * clip(x + 3, 0, 6) / 6`` over flat float32 arrays; NaN stays NaN, as
    with np.clip."""
    three, six, zero = np.float32(3), np.float32(6), np.float32(0)
    for i in range(x.size):
        value = x[i]
        ramp = value + three
        if ramp < zero:
            ramp = zero
        elif ramp > six:
            ramp = six
        out[i] = value * ramp / six
