"""The header of a .npy array, read without numpy allocating what it claims: nnapi-reference's
cache reader (drivers/cache_format.py) and the CLI's ``--input FILE.npz`` reader compare the
claim with the bytes an archive entry holds before reading the array (np.load allocated the
claim first: a 60-byte header claiming 4 TiB raised a MemoryError)."""

from __future__ import annotations

from typing import IO

import numpy as np


def read_npy_header(stream: IO[bytes]) -> tuple[tuple[int, ...], np.dtype]:
    """(shape, dtype) of the .npy header at ``stream``, which is left at the array's first
    byte; ValueError for a damaged header or a format version numpy does not define."""
    version = np.lib.format.read_magic(stream)
    if version == (1, 0):
        shape, _, dtype = np.lib.format.read_array_header_1_0(stream)
    elif version in ((2, 0), (3, 0)):
        # 3.0 is 2.0's layout with a UTF-8 header (for field names): read as latin-1, the
        # names may differ but the shape and the item size do not (numpy has no public 3.0 reader)
        shape, _, dtype = np.lib.format.read_array_header_2_0(stream)
    else:
        raise ValueError(f".npy format version {version[0]}.{version[1]}, which numpy does not define")
    return shape, dtype
