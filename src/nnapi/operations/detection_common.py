"""Helpers shared by the detection operations (bounding-box transforms, NMS, ROI pooling).

Boxes are [x1, y1, x2, y2] rows. Android's kernels compute every detection operation in
float32 whatever the operand type (float16 and quantized values are converted first),
so these helpers do the same: that keeps thresholds, ties and IoU comparisons identical.
Quantized boxes are TENSOR_QUANT16_ASYMM with the fixed scale 0.125 and zero point 0.

Not an operation module (the package loader skips it: ``_HELPER_MODULES``); the ONNX
Runtime driver's detection lowerings (drivers/ort/detection.py) share its box encoding.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from nnapi.codes import OperandCode
from nnapi.operand import OperandType, dtype_of
from nnapi.operations.base import ExecutionContext, Shape, Tensor, ValidationContext
from nnapi.operations.common import FLOAT_TENSORS as FLOAT_TENSORS  # re-exported
from nnapi.operations.common import QUANT8_TENSORS as QUANT8_TENSORS  # re-exported
from nnapi.operations.common import integer_range
from nnapi.operations.quant_math import dequantize, quantize

T = OperandCode

#: the fixed quantization of TENSOR_QUANT16_ASYMM boxes
BOX_SCALE = 0.125
BOX_ZERO_POINT = 0
#: the scalar type of float parameters: FLOAT16 for float16 models, FLOAT32 otherwise
FLOAT_SCALAR_FOR = {T.TENSOR_FLOAT16: T.FLOAT16}


def float_scalar(tensor_type: OperandCode) -> OperandCode:
    return FLOAT_SCALAR_FOR.get(tensor_type, T.FLOAT32)


# --- signature validation ---------------------------------------------------------------
def check_signature(ctx: ValidationContext, inputs: Sequence[OperandCode], outputs: Sequence[OperandCode],
                    input_ranks: dict[int, int] | None = None,
                    output_ranks: dict[int, int] | None = None) -> None:
    """Exact input/output counts and types, and ranks where the operand's rank is known."""
    ctx.check_counts(inputs=len(inputs), outputs=len(outputs))
    for index, code in enumerate(inputs):
        ctx.check_input_type(index, code)
    for index, code in enumerate(outputs):
        ctx.check_output_type(index, code)
    for index, rank in (input_ranks or {}).items():
        ctx.check_input_rank(index, rank)
    for index, rank in (output_ranks or {}).items():
        actual = ctx.outputs[index].rank
        if actual and actual != rank:
            ctx.fail(f"output {index} must have rank {rank}, got {actual}")


def check_box_quantization(ctx: ValidationContext, kind: str, index: int) -> None:
    """A TENSOR_QUANT16_ASYMM box operand must use scale 0.125 and zero point 0."""
    operand = ctx.inputs[index] if kind == "input" else ctx.outputs[index]
    if operand.type == T.TENSOR_QUANT16_ASYMM and (operand.scale, operand.zero_point) != (BOX_SCALE,
                                                                                          BOX_ZERO_POINT):
        ctx.fail(f"{kind} {index} (boxes) must have scale 0.125 and zero point 0, got "
                 f"({operand.scale}, {operand.zero_point})")


# --- value conversion -----------------------------------------------------------------------
def to_float32(tensor: Tensor) -> np.ndarray:
    """The real values of a float or quantized tensor, as float32 (as Android converts them)."""
    value = np.asarray(tensor.value)
    if tensor.type in (T.TENSOR_FLOAT32, T.TENSOR_FLOAT16, T.FLOAT32, T.FLOAT16):
        return value.astype(np.float32)
    return dequantize(value, tensor.scale, tensor.zero_point, np.float32)


def from_float32(values: np.ndarray, output: OperandType) -> np.ndarray:
    """float32 results in ``output``'s storage type: a cast for floats, otherwise
    round(x / scale + zero_point) saturated, computed in float32 as Android does."""
    values = np.asarray(values, dtype=np.float32)
    if output.type in (T.TENSOR_FLOAT32, T.TENSOR_FLOAT16):
        return values.astype(dtype_of(output.type))
    low, high = integer_range(output.type)
    with np.errstate(invalid="ignore", over="ignore"):
        scaled = quantize(values, output.scale, output.zero_point, np.float32, round_last=True)
    return np.clip(scaled, low, high).astype(dtype_of(output.type))


# --- box geometry ---------------------------------------------------------------------------
def transform_boxes(boxes: np.ndarray, deltas: np.ndarray, image_height: np.ndarray,
                    image_width: np.ndarray) -> np.ndarray:
    """Apply [dx, dy, dw, dh] deltas to [x1, y1, x2, y2] boxes and clip to the image.

    ``boxes`` [N, 4], ``deltas`` [N, C, 4], image sizes broadcastable to [N, 1]; float32.
    """
    width = (boxes[:, 2] - boxes[:, 0])[:, None]
    height = (boxes[:, 3] - boxes[:, 1])[:, None]
    center_x = ((boxes[:, 0] + boxes[:, 2]) / np.float32(2))[:, None]
    center_y = ((boxes[:, 1] + boxes[:, 3]) / np.float32(2))[:, None]
    with np.errstate(over="ignore"):
        new_width = np.exp(deltas[..., 2]) * width
        new_height = np.exp(deltas[..., 3]) * height
    new_x = center_x + deltas[..., 0] * width
    new_y = center_y + deltas[..., 1] * height
    half_w, half_h = new_width / np.float32(2), new_height / np.float32(2)
    zero = np.float32(0)
    out = np.stack([
        np.minimum(np.maximum(new_x - half_w, zero), image_width),
        np.minimum(np.maximum(new_y - half_h, zero), image_height),
        np.minimum(np.maximum(new_x + half_w, zero), image_width),
        np.minimum(np.maximum(new_y + half_h, zero), image_height),
    ], axis=-1)
    return out.astype(np.float32, copy=False)


def batch_runs(batch_ids: np.ndarray) -> list[tuple[int, int]]:
    """(start, stop) of each run of consecutive equal batch indexes: boxes of one image
    are grouped together, and each group is processed on its own."""
    if batch_ids.size == 0:
        return []
    starts = np.flatnonzero(np.concatenate(([True], batch_ids[1:] != batch_ids[:-1])))
    stops = np.append(starts[1:], batch_ids.size)
    return list(zip(starts.tolist(), stops.tolist(), strict=True))


# --- greedy non-maximum suppression -----------------------------------------------------
#: given the IoUs of the remaining candidates with the box just selected and their
#: scores, return (their new scores, which of them are dropped)
Suppressor = Callable[[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]


def hard_suppressor(iou_threshold: float) -> Suppressor:
    """Drop every candidate overlapping the selected box by IoU >= threshold."""
    threshold = np.float32(iou_threshold)

    def suppress(iou: np.ndarray, scores: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return scores, iou >= threshold

    return suppress


def soft_suppressor(kernel: int, iou_threshold: float, sigma: float, drop_below: float) -> Suppressor:
    """BOX_WITH_NMS_LIMIT's kernels: scale the scores (hard: by 0, linear: by 1 - IoU,
    both when IoU >= threshold; gaussian: by exp(-IoU^2 / sigma)), then drop the
    candidates whose score fell below ``drop_below``."""
    threshold, sigma32, floor = np.float32(iou_threshold), np.float32(sigma), np.float32(drop_below)
    one = np.float32(1)

    def factor(iou: np.ndarray) -> np.ndarray:
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            if kernel == 0:
                return np.where(iou < threshold, one, np.float32(0))
            if kernel == 1:
                return np.where(iou < threshold, one, one - iou)
            # Android's kernel is std::exp of a float (libm's expf: correctly rounded but
            # for ~0.07% of these inputs); numpy's float32 exp is not (it differs from the
            # correctly rounded value in ~42% of them), so the exponent, computed in
            # float32 as Android's, is raised in float64 and rounded once to float32
            exponent = -(iou * iou) / sigma32
            return np.exp(exponent.astype(np.float64)).astype(np.float32)

    def suppress(iou: np.ndarray, scores: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        new_scores = (scores * factor(iou)).astype(np.float32)
        return new_scores, new_scores < floor

    return suppress


def _compaction_order(keep: np.ndarray) -> np.ndarray:
    """Positions of the surviving candidates, in the order Android's in-place compaction
    leaves them.

    Android walks the candidates and swaps each dropped one with the last unexamined
    candidate. The result: survivors among the first ``count`` positions stay where they
    are, and the holes fill with the survivors from beyond, taken from the end. Score ties
    are broken by this order, so it is reproduced rather than a stable filter.
    """
    count = int(np.count_nonzero(keep))
    order = np.arange(count)
    holes = ~keep[:count]
    if holes.any():
        order[holes] = (np.flatnonzero(keep[count:]) + count)[::-1]
    return order


class GreedyWalk:
    """``greedy_nms``'s working list over one candidate list, one selection at a time:
    ``best_score()`` is the score the next ``take()`` selects (the first maximum of the
    current scores, as ``np.argmax`` and std::max_element find it), ``take()`` selects it,
    swaps it with the list's head, rescores or drops the others by their IoU with it and
    compacts the survivors in Android's order. The candidates' coordinates, areas and
    scores travel with them in contiguous arrays, so no step gathers from the full box list.
    """

    def __init__(self, scores: np.ndarray, boxes: np.ndarray, candidates: np.ndarray, suppress: Suppressor) -> None:
        order = np.array(candidates, dtype=np.int64)
        chosen_boxes = np.asarray(boxes, dtype=np.float32)[order]
        x1, y1, x2, y2 = (np.ascontiguousarray(chosen_boxes[:, k]) for k in range(4))
        areas = (x2 - x1) * (y2 - y1)
        live = np.asarray(scores, dtype=np.float32)[order]
        self._columns = [order, x1, y1, x2, y2, areas, live]
        self._suppress = suppress
        self._best = -1

    @property
    def size(self) -> int:
        """Candidates left."""
        return self._columns[0].size

    def best_score(self) -> np.float32:
        """The current score of the candidate the next ``take()`` selects (list not empty)."""
        if self._best < 0:
            self._best = int(np.argmax(self._columns[6]))
        return self._columns[6][self._best]

    def take(self) -> tuple[int, np.float32]:
        """Select the best candidate: its index and its score at selection."""
        self.best_score()
        best, self._best = self._best, -1
        columns = self._columns
        if best:
            for column in columns:
                column[0], column[best] = column[best], column[0]
        order, x1, y1, x2, y2, areas, live = columns
        index, score = int(order[0]), live[0]
        if order.size == 1:
            self._columns = [column[1:] for column in columns]
            return index, score
        zero = np.float32(0)
        width = np.maximum(np.minimum(x2[1:], x2[0]) - np.maximum(x1[1:], x1[0]), zero)
        height = np.maximum(np.minimum(y2[1:], y2[0]) - np.maximum(y1[1:], y1[0]), zero)
        intersection = width * height
        with np.errstate(divide="ignore", invalid="ignore"):
            iou = intersection / (areas[1:] + areas[0] - intersection)
        new_scores, dropped = self._suppress(iou, live[1:])
        survivors = _compaction_order(~dropped) + 1
        self._columns = [column[survivors] for column in columns[:-1]] + [np.asarray(new_scores)[survivors - 1]]
        return index, score


def greedy_nms(scores: np.ndarray, boxes: np.ndarray, candidates: np.ndarray, suppress: Suppressor,
               max_keep: int) -> np.ndarray:
    """Select boxes greedily by score: take the best remaining candidate, rescore or drop
    the others by their IoU with it, repeat. ``max_keep`` < 0 means no limit. Returns the
    selected indexes (into ``scores`` / ``boxes``) in selection order, and writes each
    selected box's score at the time it was selected back into ``scores`` (float32).

    The loop over selections is inherently sequential (``GreedyWalk``: each step is
    vectorized over the remaining candidates).
    """
    order = np.array(candidates, dtype=np.int64)
    limit = order.size if max_keep < 0 else min(max_keep, order.size)
    if limit == 0:
        return np.zeros(0, dtype=np.int64)
    walk = GreedyWalk(scores, boxes, order, suppress)
    selected: list[int] = []
    selected_scores: list[np.float32] = []
    while walk.size and len(selected) < limit:
        index, score = walk.take()
        selected.append(index)
        selected_scores.append(score)
    picked = np.asarray(selected, dtype=np.int64)
    scores[picked] = np.asarray(selected_scores, dtype=np.float32)
    return picked


def _compaction_order_rows(keep: np.ndarray) -> np.ndarray:
    """``_compaction_order`` for every row of ``keep`` [groups, m] at once. Entries past a
    row's survivor count are meaningless. Per row, the holes among the first ``count``
    positions (ascending) pair with the survivors beyond them taken from the end."""
    count = keep.sum(axis=1)
    columns = np.arange(keep.shape[1])
    order = np.broadcast_to(columns, keep.shape).copy()
    head = columns < count[:, None]
    hole_rows, hole_cols = np.nonzero(head & ~keep)
    _, mirrored = np.nonzero((~head & keep)[:, ::-1])     # per row: beyond-survivors, last first
    order[hole_rows, hole_cols] = keep.shape[1] - 1 - mirrored
    return order


def greedy_nms_groups(scores: np.ndarray, boxes: np.ndarray, candidate_groups: Sequence[np.ndarray],
                      suppress: Suppressor, max_keep: int) -> list[np.ndarray]:
    """``greedy_nms`` on several independent candidate lists (classes) at once.

    The groups share ``scores`` and ``boxes`` but no candidate. Every step selects one box
    in each group that still has candidates, so the number of Python-level steps is the
    largest selection count of one group rather than their sum. Each group sees exactly
    the selections, score updates and tie-breaking order ``greedy_nms`` gives it.
    """
    groups = len(candidate_groups)
    if groups == 0:
        return []
    lengths = np.array([len(c) for c in candidate_groups], dtype=np.int64)
    limits = lengths if max_keep < 0 else np.minimum(lengths, max_keep)
    width = int(lengths.max())
    valid = np.arange(width) < lengths[:, None]
    order = np.zeros((groups, width), dtype=np.int64)
    order[valid] = np.concatenate([np.asarray(c, dtype=np.int64) for c in candidate_groups])
    # Per candidate, travelling together: x1, y1, x2, y2, area, current score.
    state = np.empty((groups, width, 6), dtype=np.float32)
    state[..., :4] = np.asarray(boxes, dtype=np.float32)[order]
    state[..., 4] = (state[..., 2] - state[..., 0]) * (state[..., 3] - state[..., 1])
    state[..., 5] = np.where(valid, np.asarray(scores, dtype=np.float32)[order], np.float32(-np.inf))
    remaining = np.where(limits > 0, lengths, 0)
    picked = np.zeros(groups, dtype=np.int64)
    steps: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    rows = np.arange(groups)
    zero = np.float32(0)
    while remaining.any():
        selecting = remaining > 0
        # np.argmax returns the first maximum per row, like std::max_element.
        best = np.argmax(state[..., 5], axis=1)
        for array in (order, state):
            first = array[rows, 0].copy()
            array[rows, 0] = array[rows, best]
            array[rows, best] = first
        steps.append((order[:, 0].copy(), state[:, 0, 5].copy(), selecting))
        picked += selecting
        chosen, rest = state[:, :1, :], state[:, 1:, :]
        overlap_w = np.maximum(np.minimum(rest[..., 2], chosen[..., 2]) - np.maximum(rest[..., 0], chosen[..., 0]),
                               zero)
        overlap_h = np.maximum(np.minimum(rest[..., 3], chosen[..., 3]) - np.maximum(rest[..., 1], chosen[..., 1]),
                               zero)
        intersection = overlap_w * overlap_h
        with np.errstate(divide="ignore", invalid="ignore"):   # degenerate boxes; -inf padding scores
            iou = intersection / (rest[..., 4] + chosen[..., 4] - intersection)
            new_scores, dropped = suppress(iou, rest[..., 5])
        still_selecting = selecting & (picked < limits)
        keep = ~dropped & (np.arange(width - 1) < (remaining - 1)[:, None]) & still_selecting[:, None]
        remaining = keep.sum(axis=1)
        new_width = int(remaining.max())
        if new_width == 0:
            break
        # Gather the survivors of every group through flat indexes (one copy per array).
        survivors = _compaction_order_rows(keep)[:, :new_width] + (rows * (width - 1))[:, None]
        rest_state = np.ascontiguousarray(rest)
        rest_state[..., 5] = new_scores
        state = rest_state.reshape(-1, 6)[survivors]
        order = np.ascontiguousarray(order[:, 1:]).reshape(-1)[survivors]
        width = new_width
        state[np.arange(width) >= remaining[:, None], 5] = -np.inf
    if not steps:
        return [np.zeros(0, dtype=np.int64) for _ in range(groups)]
    indexes = np.stack([step[0] for step in steps])          # [step, group]
    values = np.stack([step[1] for step in steps])
    taken = np.stack([step[2] for step in steps])
    scores[indexes[taken]] = values[taken]
    return [indexes[taken[:, g], g] for g in range(groups)]


def sort_by_score(indexes: np.ndarray, scores: np.ndarray) -> np.ndarray:
    """``indexes`` ordered by descending score (ties keep their order)."""
    return indexes[np.argsort(-scores[indexes], kind="stable")]


# --- regions of interest (ROI_ALIGN, ROI_POOLING) -----------------------------------------
# Both operations share inputs 0-6: feature map, regions, batch index of each region,
# output height / width, and the height / width ratio of the image to the feature map.
ROI_INPUT_TENSOR = 0
ROI_REGIONS_TENSOR = 1
ROI_BATCH_SPLIT_TENSOR = 2
ROI_OUTPUT_HEIGHT_SCALAR = 3
ROI_OUTPUT_WIDTH_SCALAR = 4
ROI_HEIGHT_STRIDE_SCALAR = 5
ROI_WIDTH_STRIDE_SCALAR = 6


def roi_output_shape(ctx: ExecutionContext, nchw: bool) -> Shape:
    """The pooled output's shape, [num_rois, out_h, out_w, depth] (NCHW: depth first),
    after checking the region and batch-index shapes and the positive sizes and ratios."""
    feature, rois = ctx.input(ROI_INPUT_TENSOR), ctx.input(ROI_REGIONS_TENSOR)
    batches = ctx.input(ROI_BATCH_SPLIT_TENSOR)
    ctx.require(feature.rank == 4 and rois.rank == 2 and batches.rank == 1, "inputs must have ranks 4, 2, 1")
    depth = feature.shape[1] if nchw else feature.shape[3]
    num_rois = rois.shape[0]
    ctx.require(rois.shape[1] == 4, f"regions must be [num_rois, 4], got {list(rois.shape)}")
    ctx.require(batches.shape[0] == num_rois, f"batch indexes must be [{num_rois}]")
    out_h, out_w = ctx.scalar(ROI_OUTPUT_HEIGHT_SCALAR), ctx.scalar(ROI_OUTPUT_WIDTH_SCALAR)
    ctx.require(out_h > 0 and out_w > 0, "output height and width must be positive")
    ctx.require(ctx.scalar(ROI_HEIGHT_STRIDE_SCALAR) > 0 and ctx.scalar(ROI_WIDTH_STRIDE_SCALAR) > 0,
                "height and width ratios must be positive")
    return (num_rois, depth, out_h, out_w) if nchw else (num_rois, out_h, out_w, depth)


def roi_corners(ctx: ExecutionContext, batch: int, height: int, width: int) -> tuple[np.ndarray, np.ndarray]:
    """Each region's batch index (int64) and its corners in feature-map coordinates
    (float32 [num_rois, 4]: the region's real value times 1 / ratio), after checking that
    every index names a batch and every region is ordered and lies inside the map."""
    batch_ids = np.asarray(ctx.value(ROI_BATCH_SPLIT_TENSOR)).astype(np.int64)
    ctx.require(bool(np.all((batch_ids >= 0) & (batch_ids < batch))), "batch index out of range")
    rois = to_float32(ctx.input(ROI_REGIONS_TENSOR))
    ctx.require(bool(np.all(rois >= 0)), "regions must not have negative coordinates")
    height_scale = np.float32(1) / np.float32(ctx.scalar(ROI_HEIGHT_STRIDE_SCALAR))
    width_scale = np.float32(1) / np.float32(ctx.scalar(ROI_WIDTH_STRIDE_SCALAR))
    corners = rois * np.array([width_scale, height_scale, width_scale, height_scale], dtype=np.float32)
    ctx.require(bool(np.all((corners[:, 0] <= width) & (corners[:, 2] <= width) & (corners[:, 1] <= height)
                            & (corners[:, 3] <= height))), "regions must lie inside the feature map")
    ctx.require(bool(np.all((corners[:, 0] <= corners[:, 2]) & (corners[:, 1] <= corners[:, 3]))),
                "every region needs x1 <= x2 and y1 <= y2")
    return batch_ids, corners
