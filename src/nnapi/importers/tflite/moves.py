"""TFLite import: element moves through tensors above NNAPI's rank 4 re-expressed as one
rank-4 STRIDED_SLICE and TRANSPOSE between RESHAPEs.

Converters write attention's query / key / value split through rank 5: PyTorch's
``qkv.reshape(b, n, 3, heads, d).permute(2, 0, 3, 1, 4)`` then ``q, k, v = qkv[0], qkv[1],
qkv[2]`` (ai-edge-torch: RESHAPE, TRANSPOSE, three SLICEs, RESHAPEs), PaddleOCR's SVTR
through onnx2tf (RESHAPE, three STRIDED_SLICEs, RESHAPEs). Each branch only moves
elements, so the importer traces, on the static shapes, which input position every
output element holds (``index``) and asks here for a rank-4 form of that map:

    index = reshape(transpose(reshape(strided_slice(reshape(source, M)), D), order), F)

found from ``index`` alone: its positions, sorted, must be a strided box of the flat
source (nested arithmetic runs), which gives M and the slice; where each sorted position
lands in the output must be a transpose of nested runs, which gives D and the order. The
plan is checked by running it on ``arange`` before it is used; None when there is none.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

#: NNAPI's tensors have rank 4 at most
MAX_RANK = 4


@dataclass(frozen=True)
class MovePlan:
    """RESHAPE the source to ``sliced_from``, STRIDED_SLICE ``begin`` / ``end`` /
    ``strides`` (None: nothing sliced), RESHAPE to ``moved_from``, TRANSPOSE ``order``
    (None: the identity), RESHAPE to the output's shape."""

    sliced_from: list[int]
    begin: list[int] | None
    end: list[int] | None
    strides: list[int] | None
    moved_from: list[int]
    order: list[int] | None

    def apply(self, source: np.ndarray, out_shape: list[int]) -> np.ndarray:
        """What the plan's operations do to ``source`` (numpy, for the check)."""
        x = source.reshape(self.sliced_from)
        if self.begin is not None:
            x = x[tuple(slice(b, e, s) for b, e, s in zip(self.begin, self.end, self.strides))]
        x = x.reshape(self.moved_from)
        if self.order is not None:
            x = x.transpose(self.order)
        return x.reshape(out_shape)


def nested_runs(values: np.ndarray) -> list[tuple[int, int]] | None:
    """``values`` (1-D, at least one) as ``values[0] + sum_k j_k * stride_k`` over the
    row-major enumeration of counts: [(count, stride)], outermost first; [] for one value;
    None when they are no such enumeration (each level is the longest arithmetic run that
    repeats, with the same step, from every run's start)."""
    levels: list[tuple[int, int]] = []
    current = np.asarray(values, np.int64).reshape(-1)
    while current.size > 1:
        step = int(current[1] - current[0])
        if step == 0:
            return None
        off = np.flatnonzero(np.diff(current) != step)
        run = int(off[0]) + 1 if off.size else current.size
        for count in range(run, 1, -1):  # the longest run that tiles the values
            if current.size % count:
                continue
            rows = current.reshape(-1, count)
            if np.array_equal(rows - rows[:, :1], np.broadcast_to(np.arange(count) * step, rows.shape)):
                break
        else:
            return None
        levels.append((count, step))
        current = rows[:, 0]
    levels.reverse()
    return levels


def _slice_of(size: int, positions: np.ndarray) -> tuple[list[int], list[int], list[int], list[int]] | None:
    """(M, begin, end, strides): a STRIDED_SLICE of the flat ``size`` source reshaped to M
    whose row-major result is ``positions`` (sorted, unique); None when there is none."""
    levels = nested_runs(positions)
    if levels is None:
        return None
    offset = int(positions[0])
    if not levels:
        return [size], [offset], [offset + 1], [1]
    counts = [c for c, _ in levels]
    steps = [w for _, w in levels]
    # The innermost axis carries its own step over unit strides; every outer level is an
    # axis of stride 1 whose row length is its step in the flat source.
    pitch = steps[:-1] + [1]            # elements per unit of each axis of M
    strides = [1] * (len(levels) - 1) + [steps[-1]]
    if size % pitch[0] or any(pitch[k] % pitch[k + 1] for k in range(len(pitch) - 1)):
        return None
    dims = [size // pitch[0]] + [pitch[k] // pitch[k + 1] for k in range(len(pitch) - 1)]
    begin = [int(v) for v in np.unravel_index(offset, dims)]
    end = [b + (n - 1) * s + 1 for b, n, s in zip(begin, counts, strides)]
    if any(e > d for e, d in zip(end, dims)):
        return None
    return dims, begin, end, strides


def _transpose_of(flat: np.ndarray) -> tuple[list[int], list[int]] | None:
    """(D, order): ``arange(n).reshape(D).transpose(order).ravel() == flat``; None if none."""
    levels = nested_runs(flat)
    if levels is None or (flat.size and int(flat[0]) != 0):
        return None
    if not levels:
        return [int(flat.size)], [0]
    by_stride = sorted(range(len(levels)), key=lambda k: -levels[k][1])
    dims = [levels[k][0] for k in by_stride]
    order = [by_stride.index(k) for k in range(len(levels))]
    return dims, order


def move_plan(source_shape: list[int], index: np.ndarray) -> MovePlan | None:
    """A rank-4 plan giving ``index`` (the source position each output element holds, of
    the output's shape) from a ``source_shape`` tensor, or None (duplicated positions, a
    non-strided pick, or a form above rank 4)."""
    size = int(np.prod(source_shape))
    flat = index.reshape(-1).astype(np.int64)
    if flat.size == 0 or size == 0:
        return None
    positions = np.sort(flat)
    if np.any(np.diff(positions) == 0):
        return None
    sliced = _slice_of(size, positions)
    moved = _transpose_of(np.searchsorted(positions, flat))
    if sliced is None or moved is None:
        return None
    dims, begin, end, strides = sliced
    whole = begin == [0] * len(dims) and end == dims and strides == [1] * len(dims)
    moved_from, order = moved
    if len(dims) > MAX_RANK or len(moved_from) > MAX_RANK:
        return None
    plan = MovePlan(list(source_shape) if whole else dims, None if whole else begin, None if whole else end,
                    None if whole else strides, moved_from, None if order == sorted(order) else order)
    if not np.array_equal(plan.apply(np.arange(size), list(index.shape)), index):
        return None
    return plan
