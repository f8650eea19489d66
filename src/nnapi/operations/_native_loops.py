"""numpy's own float32 machine code, as C function addresses for compiled kernels that
must compute numpy's values bit for bit: the inner loops of ``np.exp`` and ``np.tanh``
and the BLAS ``sgemv`` / ``sgemm`` that ``np.matmul`` calls (``nnapi[fast]``).

numba computes exp and tanh with its own (LLVM / libm) functions, which differ from
numpy's SIMD ones in the last bits, and its products do not call numpy's BLAS at all. A
compiled loop that calls these addresses instead (``_numba_kernels``' intrinsics) does
the same float32 operations as numpy's step, only without a Python round trip per call.

Where the addresses come from:
- a ufunc's loops are the public ``PyUFuncObject`` fields ``functions`` / ``data`` /
  ``types`` (numpy's ``ufuncobject.h``: after the object header, four ints, then those
  pointers); the float32 loop is the one among the ``f -> f`` entries whose results equal
  the ufunc's own on a check vector (special values, every binade, lengths that are no
  multiple of a SIMD width), so a loop numpy does not use is never taken;
- BLAS is numpy's bundled OpenBLAS (``scipy_cblas_*64_``, 64-bit integers), found through
  the dynamic symbols of numpy's extension module; ``np.matmul`` calls ``sgemv`` (row
  major, transposed) for one row times a matrix and ``sgemm`` (row major, no transposes)
  for contiguous matrices of more rows, both checked against ``np.matmul`` here.

``natives()`` is None where any of this does not hold (another numpy layout or BLAS, a
free-threaded build): the callers keep their numpy path. Checked once per process.
"""

from __future__ import annotations

import ctypes
import sys
from typing import NamedTuple

import numpy as np


class Natives(NamedTuple):
    """Addresses (ints) of numpy's float32 machine code; ``*_data`` is the loop's data
    argument (0 for numpy's own float loops)."""

    exp: int
    exp_data: int
    tanh: int
    tanh_data: int
    sgemv: int
    sgemm: int

    def as_array(self) -> np.ndarray:
        """The addresses as an int64 array (the compiled kernels' argument)."""
        return np.array(self, dtype=np.int64)


_LOOP = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)
_BLAS_INT, _FLOAT, _ENUM, _POINTER = ctypes.c_int64, ctypes.c_float, ctypes.c_int, ctypes.c_void_p
_GEMV = ctypes.CFUNCTYPE(None, _ENUM, _ENUM, _BLAS_INT, _BLAS_INT, _FLOAT, _POINTER, _BLAS_INT, _POINTER,
                         _BLAS_INT, _FLOAT, _POINTER, _BLAS_INT)
_GEMM = ctypes.CFUNCTYPE(None, _ENUM, _ENUM, _ENUM, _BLAS_INT, _BLAS_INT, _BLAS_INT, _FLOAT, _POINTER, _BLAS_INT,
                         _POINTER, _BLAS_INT, _FLOAT, _POINTER, _BLAS_INT)
#: CBLAS enumerations
ROW_MAJOR, NO_TRANS, TRANS = 101, 111, 112
#: the BLAS symbol prefixes tried, numpy's wheels first (64-bit integer interface only)
_BLAS_NAMES = ("scipy_cblas_{}64_", "cblas_{}64_")

_checked = False
_natives: Natives | None = None


def natives() -> Natives | None:
    """numpy's float32 exp / tanh loops and sgemv / sgemm, each checked against numpy, or
    None when one cannot be found or does not reproduce numpy."""
    global _checked, _natives
    if not _checked:
        _checked = True
        try:
            _natives = _find()
        except (OSError, AttributeError, ValueError, TypeError):
            _natives = None
    return _natives


def _check_values() -> np.ndarray:
    """float32 values for comparing loops: special values, the edges of exp's range, and
    normal values of every scale; an odd count, so SIMD loops run their tails too."""
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 88.72, -88.72, 89.0, -87.3, -103.9, -104.0, 1e-40,
                        -1e-40, 9.0, -9.0, 1e-4, -1e-4, 0.5, -0.5], np.float32)
    rng = np.random.default_rng(0)
    scales = np.logspace(-8, 2.3, 2001).astype(np.float32)
    values = (rng.uniform(-1, 1, scales.size).astype(np.float32) * scales).astype(np.float32)
    return np.concatenate([special, values])


def _float_loop(ufunc: np.ufunc) -> tuple[int, int] | None:
    """(function, data) of the unary float32 loop of ``ufunc`` that reproduces it."""
    if getattr(sys.flags, "gil", 1) == 0 or object.__basicsize__ != 2 * ctypes.sizeof(ctypes.c_void_p):
        return None  # a free-threaded object header: another layout
    base, head, word = id(ufunc), object.__basicsize__, ctypes.sizeof(ctypes.c_void_p)

    def integer(offset: int) -> int:
        return ctypes.c_int.from_address(base + offset).value

    def pointer(address: int) -> int:
        return ctypes.c_void_p.from_address(address).value or 0

    nin, nout, nargs = integer(head), integer(head + 4), integer(head + 8)
    if (nin, nout, nargs) != (1, 1, 2):
        return None
    functions, data = pointer(base + head + 16), pointer(base + head + 16 + word)
    count = integer(head + 16 + 2 * word)
    name, types = pointer(base + head + 24 + 2 * word), pointer(base + head + 24 + 3 * word)
    if not (functions and name and types) or not 0 < count < 64 or ctypes.string_at(name) != ufunc.__name__.encode():
        return None
    signatures = ctypes.string_at(types, count * nargs)
    float32 = np.dtype(np.float32).num
    values = _check_values()
    with np.errstate(all="ignore"):
        want = ufunc(values)
    for index in range(count):
        if signatures[index * nargs:(index + 1) * nargs] != bytes([float32, float32]):
            continue
        function = pointer(functions + index * word)
        extra = pointer(data + index * word) if data else 0
        if function and _same(want, _run_loop(function, extra, values)):
            return function, extra
    return None


def _run_loop(function: int, data: int, values: np.ndarray) -> np.ndarray:
    out = np.empty_like(values)
    args = (ctypes.c_void_p * 2)(values.ctypes.data, out.ctypes.data)
    dimensions = (ctypes.c_ssize_t * 1)(values.size)
    steps = (ctypes.c_ssize_t * 2)(values.itemsize, out.itemsize)
    with np.errstate(all="ignore"):
        _LOOP(function)(ctypes.cast(args, ctypes.c_void_p), ctypes.cast(dimensions, ctypes.c_void_p),
                        ctypes.cast(steps, ctypes.c_void_p), data or None)
    return out


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and bool(np.array_equal(a.view(np.uint32), b.view(np.uint32)))


def _blas(name: str) -> int:
    core = getattr(np, "_core", None) or np.core  # numpy 1.x: np.core
    library = ctypes.CDLL(core._multiarray_umath.__file__)
    for pattern in _BLAS_NAMES:
        symbol = getattr(library, pattern.format(name), None)
        if symbol is not None:
            return ctypes.cast(symbol, ctypes.c_void_p).value or 0
    return 0


def _products_match(sgemv: int, sgemm: int) -> bool:
    """Whether the two BLAS functions, called as ``np.matmul`` calls them, give its values."""
    rng = np.random.default_rng(1)
    gemv, gemm = _GEMV(sgemv), _GEMM(sgemm)
    # small shapes (each path of the kernels, tails included), below BLAS's threading
    # thresholds: a first multi-threaded call starts OpenBLAS's threads (tens of ms);
    # a prepared loop checks its own shapes too (``PreparedLstm._reproduces``)
    for rows, size, columns in ((1, 2, 4), (1, 31, 12), (1, 64, 68), (3, 17, 20), (4, 33, 40)):
        h = rng.standard_normal((rows, size)).astype(np.float32)
        matrix = rng.standard_normal((size, columns)).astype(np.float32)
        want, got = np.matmul(h, matrix), np.empty((rows, columns), np.float32)
        if rows == 1:
            gemv(ROW_MAJOR, TRANS, size, columns, 1.0, matrix.ctypes.data, columns, h.ctypes.data, 1, 0.0,
                 got.ctypes.data, 1)
        else:
            gemm(ROW_MAJOR, NO_TRANS, NO_TRANS, rows, columns, size, 1.0, h.ctypes.data, size, matrix.ctypes.data,
                 columns, 0.0, got.ctypes.data, columns)
        if not _same(want, got):
            return False
    return True


def _find() -> Natives | None:
    exp, tanh = _float_loop(np.exp), _float_loop(np.tanh)
    sgemv, sgemm = _blas("sgemv"), _blas("sgemm")
    if exp is None or tanh is None or not sgemv or not sgemm or not _products_match(sgemv, sgemm):
        return None
    return Natives(exp[0], exp[1], tanh[0], tanh[1], sgemv, sgemm)
