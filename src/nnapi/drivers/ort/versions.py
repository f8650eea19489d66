"""Which ONNX Runtime release is installed: the lowering and the device adapt to what
older releases lack or compute differently (each version constant names what it gates).
Imports no onnxruntime at module level: lowering alone works without it.
"""

from __future__ import annotations

import functools


def release(version: str) -> tuple[int, int]:
    """(major, minor) of a version string such as "1.20.1" or "1.22.0.dev20250101"."""
    parts = [int("".join(c for c in part if c.isdigit()) or 0) for part in version.split(".")[:2]]
    return (parts + [0, 0])[0], (parts + [0, 0])[1]


@functools.cache
def onnxruntime_at_least(version: tuple[int, int]) -> bool:
    """Whether the installed ONNX Runtime is release ``version`` or later (True without one:
    lowering alone, nothing will load the graph here)."""
    try:
        import onnxruntime
    except ImportError:
        return True
    return release(onnxruntime.__version__) >= version
