"""Keep the pages of a model's intermediates between executions (glibc's malloc).

nnapi-reference's kernels return fresh numpy arrays, so an execution allocates and frees
every intermediate tensor. glibc gives freed memory at the top of its heap back to the
kernel once more than ``M_TRIM_THRESHOLD`` bytes are free there (by default twice the
largest block seen, a few MB), so the next execution faults every page in again: about
2,500 page faults (~1 us each on a VM) per run of a 128x128 MediaPipe model, more time
than its kernels. Keeping those pages, as an interpreter's tensor arena keeps its memory,
is done with two ``mallopt`` settings, made once a model is prepared and only ever
raised:

- ``M_TRIM_THRESHOLD``: free memory kept at the heap's top, at least the model's
  intermediate bytes twice over (64 MiB at least, 1 GiB at most);
- ``M_MMAP_THRESHOLD``: 32 MiB, glibc's own ceiling for its dynamic threshold (setting
  either value freezes that dynamic threshold, which would leave every block above
  128 KiB to a fresh ``mmap``).

Other C libraries than glibc are left alone; ``NNAPI_KEEP_PAGES=0`` turns this off.
"""

from __future__ import annotations

import ctypes
import os
import platform
import threading

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_MMAP_THRESHOLD = 32 << 20
_MIN_TRIM = 64 << 20
_MAX_TRIM = 1 << 30

_lock = threading.Lock()
_trim_set = 0
_mallopt = None


def _load_mallopt():
    if os.environ.get("NNAPI_KEEP_PAGES", "1") == "0" or platform.libc_ver()[0] != "glibc":
        return None
    try:
        function = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_int, ctypes.c_int]
    function.restype = ctypes.c_int
    return function


def trim_threshold(intermediate_bytes: int) -> int:
    """The free bytes kept at the heap's top for a model of ``intermediate_bytes``."""
    return min(_MAX_TRIM, max(_MIN_TRIM, 2 * int(intermediate_bytes)))


def keep_pages(intermediate_bytes: int) -> int:
    """Keep at least twice ``intermediate_bytes`` of freed memory in the process (see the
    module's docstring); returns the trim threshold now in force by our setting (0 when
    nothing was set: not glibc, or turned off)."""
    global _trim_set, _mallopt
    wanted = trim_threshold(intermediate_bytes)
    with _lock:
        if _trim_set >= wanted:
            return _trim_set
        if _mallopt is None:
            _mallopt = _load_mallopt() or False
        if not _mallopt:
            return 0
        if _mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD) and _mallopt(_M_TRIM_THRESHOLD, wanted):
            _trim_set = wanted
        return _trim_set
