"""The optional compiled kernels (``pip install nnapi[fast]``: numba) and when they are used.

Prepared kernels (``_conv_fast``) ask ``kernels()`` at preparation; it returns the module
of compiled kernels (``_numba_kernels``) when numba can be imported and the environment
variable ``NNAPI_NO_NUMBA`` is unset (or "0"), else None, and they keep the numpy path.
The numpy kernels are the reference either way: tests compare the two bit for bit.

Compilation is lazy and cached: numba compiles a kernel at its first call for each
argument type and stores the machine code in its on-disk cache (``cache=True``: a
``__pycache__`` beside the module, or numba's user-wide cache directory when the
package directory is read-only; ``NUMBA_CACHE_DIR`` chooses another). The wrappers below
make that first call at preparation on tiny arrays, so the cost lands in
``Compilation.finish`` of the first model that needs a kernel in a process (compiling
once per machine, loading from the cache afterwards) and never in an execution.
"""

from __future__ import annotations

import os
from types import ModuleType

import numpy as np

from nnapi.operations.quant_math import OutputStage

#: set (to anything but "" or "0") to keep every kernel on its numpy path
DISABLE_VARIABLE = "NNAPI_NO_NUMBA"

_INT32_MAX = 2**31 - 1

_module: ModuleType | None = None
_unavailable = False


def kernels() -> ModuleType | None:
    """The compiled kernels, or None when numba is missing or ``NNAPI_NO_NUMBA`` is set.
    Read at preparation: a prepared model keeps the path it was prepared with."""
    global _module, _unavailable
    if os.environ.get(DISABLE_VARIABLE, "") not in ("", "0") or _unavailable:
        return None
    if _module is None:
        try:
            from nnapi.operations import _numba_kernels
        except ImportError:  # numba not installed, or not working with this numpy
            _unavailable = True
            return None
        _module = _numba_kernels
    return _module


class FusedOutputStage:
    """``quant_math.OutputStage`` in one compiled pass: called with accumulators and the
    output array (C-contiguous, channels last), writes the quantized results into it."""

    def __init__(self, stage: OutputStage, module: ModuleType, acc_dtype, channels: int, parts: bool = False) -> None:
        """``parts``: accumulators also come as exact float32 parts to sum (``sum_parts``)."""
        self.stage = stage
        self.kernel = module.requantize_rows
        self.parts_kernel = module.requantize_parts
        self.channels = channels
        self.params = stage_parameters(stage, channels)
        # compile (or load from the cache) now, at preparation, for these dtypes
        self.kernel(np.zeros((0, channels), acc_dtype), *self.params, np.empty((0, channels), stage.dtype))
        if parts:
            self.parts_kernel(np.zeros((1, 0, channels), np.float32), *self.params,
                              np.empty((0, channels), stage.dtype))

    def __call__(self, acc: np.ndarray, out: np.ndarray) -> np.ndarray:
        if not (acc.flags.c_contiguous and out.flags.c_contiguous and out.flags.writeable):
            return self.stage(acc, out)
        self.kernel(acc.reshape(-1, self.channels), *self.params, out.reshape(-1, self.channels))
        return out


    def sum_parts(self, parts: np.ndarray, out: np.ndarray) -> np.ndarray:
        """The outputs of accumulators that are the sums of ``parts`` (P, rows, channels),
        float32 partial sums each exact, into ``out`` (rows, channels, C-contiguous)."""
        self.parts_kernel(parts, *self.params, out)
        return out


def stage_parameters(stage: OutputStage, channels: int) -> tuple:
    """The compiled kernels' form of an output stage of ``channels`` channels: bias,
    multipliers (int32), left shifts, right shifts, 2**(right - 1) (0 where right is 0),
    one value per channel, then the zero point and the clamp range."""
    def per_channel(values, dtype=np.int64) -> np.ndarray:
        return np.ascontiguousarray(np.broadcast_to(np.asarray(values, dtype=dtype), (channels,)))

    if np.any(stage.multipliers < 0) or np.any(stage.multipliers > _INT32_MAX):
        raise ValueError("output multipliers must be Q31 values in [0, 2**31)")
    rights = np.maximum(-stage.shifts, 0)
    halves = np.where(rights > 0, np.left_shift(1, np.maximum(rights - 1, 0)), 0)
    return (per_channel(stage.bias), per_channel(stage.multipliers, np.int32), per_channel(np.maximum(stage.shifts, 0)),
            per_channel(rights), per_channel(halves), np.int64(stage.zero_point), np.int64(stage.low),
            np.int64(stage.high))
