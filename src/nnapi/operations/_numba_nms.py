"""Compiled greedy hard NMS (the optional ``nnapi[fast]`` extra) for DETECTION_POSTPROCESSING.

Imported by ``detection_postprocessing`` only when ``_jit.kernels()`` says numba is in use.
``detection_common.greedy_nms`` is the reference: the selection loop is sequential, and
numpy pays a dozen passes and gathers per selected box, which for regular NMS over an SSD's
1,917 anchors x 90 classes at a score threshold near 0 is seconds. This kernel runs the same
walk in one compiled loop and agrees with it exactly (tests compare the selections, ties
included):

- the best candidate is the first maximum score in the current order (``np.argmax``), and
  is swapped with the first position;
- the IoU with it is computed in float32 in numpy's order (``min`` / ``max`` propagating
  NaN, ``(area + area) - intersection``); a NaN IoU drops nothing;
- dropped candidates are replaced by the last unexamined one, as Android's in-place
  compaction does (``detection_common._compaction_order``).
"""

from __future__ import annotations

import numpy as np

from nnapi.operations._numba_cache import kernel

_jit = kernel(nogil=True, fastmath=False, boundscheck=False, error_model="numpy")


@_jit
def _first_maximum(order, m, scores):
    """The position in ``order[:m]`` (m > 0) of the first maximum of ``scores[order[i]]``."""
    best = 0
    best_score = scores[order[0]]
    for i in range(1, m):
        score = scores[order[i]]
        if score > best_score:
            best = i
            best_score = score
    return best


@_jit
def _least(a, b):
    """np.minimum of two float32 (NaN where either is) as a select, which vectorizes."""
    return a if (a < b or a != a) else b


@_jit
def _greatest(a, b):
    """np.maximum of two float32 (NaN where either is) as a select, which vectorizes."""
    return a if (a > b or a != a) else b


@_jit
def _overlap(k0, k1, k2, k3, c0, c1, c2, c3, threshold):
    """Whether box (k0, k1, k2, k3) overlaps the selected box (c0, c1, c2, c3) by IoU >=
    ``threshold``, the IoU in float32 in numpy's order (``greedy_nms``: min / max
    propagating NaN, ``(area + area) - intersection``); a NaN IoU overlaps nothing."""
    zero = np.float32(0)
    width = _greatest(_least(k2, c2) - _greatest(k0, c0), zero)
    height = _greatest(_least(k3, c3) - _greatest(k1, c1), zero)
    intersection = width * height
    return intersection / ((k2 - k0) * (k3 - k1) + (c2 - c0) * (c3 - c1) - intersection) >= threshold


@_jit
def _overlaps(boxes, chosen, k, threshold):
    """``_overlap`` of boxes ``k`` and ``chosen`` (rows of ``boxes``)."""
    return _overlap(boxes[k, 0], boxes[k, 1], boxes[k, 2], boxes[k, 3], boxes[chosen, 0], boxes[chosen, 1],
                    boxes[chosen, 2], boxes[chosen, 3], threshold)


@_jit
def _select(order, m, best, boxes, threshold):
    """Select ``order[best]``: swap it with the head, drop the candidates of ``order[1:m]``
    overlapping it (``_overlaps``; each replaced by the last unexamined one), and move the
    survivors to ``order[:rest]``. Returns ``rest``."""
    chosen = order[best]
    order[best] = order[0]
    order[0] = chosen
    if m == 1:
        return 0
    rest = m - 1
    i = 0
    while i < rest:
        if _overlaps(boxes, chosen, order[1 + i], threshold):
            order[1 + i] = order[rest]
            rest -= 1
        else:
            i += 1
    for j in range(rest):
        order[j] = order[1 + j]
    return rest


@_jit
def _drop_mask(x0, x1, x2, x3, start, stop, c0, c1, c2, c3, threshold, drop):
    """``drop[i]`` = ``_overlap`` of candidate i in [start, stop) with the selected box,
    for all of them in one pass without branches (the compiler vectorizes it)."""
    for i in range(start, stop):
        drop[i] = _overlap(x0[i], x1[i], x2[i], x3[i], c0, c1, c2, c3, threshold)


@_jit
def greedy_nms_hard(order, boxes, scores, threshold, limit, selected, work, drop):
    """Greedy hard NMS over the candidates ``order`` (int64 indexes into ``boxes`` [n, 4]
    float32 and ``scores`` float32; overwritten as the working list). Writes
    the selected indexes, in selection order, to ``selected`` and returns how many (at
    most ``limit``). A candidate overlapping a selected box by IoU >= ``threshold``
    (float32) is dropped.

    Each candidate's score and corners travel with it in the rows of ``work`` (float32
    [5, len(order)]), so every step reads them in order; the overlaps of a step are found
    in one vectorized pass (``_drop_mask`` into ``drop``, bool [len(order)]), then the
    list is compacted as ``_select`` does, its head moving forward instead of the list
    shifting back."""
    m = order.shape[0]
    live, x0, x1, x2, x3 = work[0], work[1], work[2], work[3], work[4]
    for i in range(m):
        k = order[i]
        live[i], x0[i], x1[i], x2[i], x3[i] = scores[k], boxes[k, 0], boxes[k, 1], boxes[k, 2], boxes[k, 3]
    start = 0
    count = 0
    while m > 0 and count < limit:
        best = start
        best_score = live[start]
        for i in range(start + 1, start + m):
            if live[i] > best_score:
                best = i
                best_score = live[i]
        order[best], order[start] = order[start], order[best]
        for row in (live, x0, x1, x2, x3):
            row[best], row[start] = row[start], row[best]
        selected[count] = order[start]
        count += 1
        _drop_mask(x0, x1, x2, x3, start + 1, start + m, x0[start], x1[start], x2[start], x3[start], threshold,
                   drop)
        rest = m - 1
        i = 0
        while i < rest:
            p = start + 1 + i
            if drop[p]:
                q = start + rest
                order[p], drop[p] = order[q], drop[q]
                for row in (live, x0, x1, x2, x3):
                    row[p] = row[q]
                rest -= 1
            else:
                i += 1
        start += 1
        m = rest
    return count


@_jit
def _sift_down(heap, size, position, scores):
    """Restore the max-heap order (by ``scores``) of ``heap[:size]`` below ``position``."""
    item = heap[position]
    score = scores[item]
    while True:
        child = 2 * position + 1
        if child >= size:
            break
        if child + 1 < size and scores[heap[child + 1]] > scores[heap[child]]:
            child += 1
        if scores[heap[child]] > score:
            heap[position] = heap[child]
            position = child
        else:
            break
    heap[position] = item


@_jit
def _suppressed(boxes, selected, count, k, threshold):
    """Whether one of the first ``count`` selected boxes overlaps candidate ``k``."""
    for j in range(count):
        if _overlaps(boxes, selected[j], k, threshold):
            return True
    return False


@_jit
def greedy_nms_hard_by_score(heap, boxes, scores, threshold, limit, selected):
    """``greedy_nms_hard``'s selections found without its walk over every candidate at each
    step, or -1 where they cannot be. Without equal scores, the walk selects the highest
    scoring candidate that no earlier selection overlaps, so the candidates are visited
    by descending score (``heap``: the candidates, made a max-heap here, popped lazily)
    and each is checked against the selections so far only: ~(visited x selected) IoUs
    instead of (candidates x selected), and no sort of the candidates the walk never
    reaches. Where two candidates that no earlier selection overlaps have the same score,
    the walk's list order decides which comes first: the caller runs ``greedy_nms_hard``
    (returns -1). Writes the selections to ``selected``; returns how many."""
    size = heap.shape[0]
    for position in range(size // 2 - 1, -1, -1):
        _sift_down(heap, size, position, scores)
    count = 0
    while size > 0 and count < limit:
        top = heap[0]
        size -= 1
        heap[0] = heap[size]
        _sift_down(heap, size, 0, scores)
        if _suppressed(boxes, selected, count, top, threshold):
            continue
        score = scores[top]
        while size > 0 and scores[heap[0]] == score:
            if not _suppressed(boxes, selected, count, heap[0], threshold):
                return -1
            size -= 1
            heap[0] = heap[size]
            _sift_down(heap, size, 0, scores)
        selected[count] = top
        count += 1
    return count


@_jit
def per_class_nms_merged(scores, boxes, score_threshold, threshold, per_class, limit, order, length, best,
                         heads, active, picked, out_anchor, out_label):
    """Regular NMS of DETECTION_POSTPROCESSING: the greedy hard NMS of every foreground
    class (columns 1.. of ``scores`` [n, c] float32; candidates scoring above
    ``score_threshold``, in anchor order; at most ``per_class`` each), merged into the
    first ``limit`` selections by descending score, equal scores by class, then selection
    order (the stable sort of the classes' selections concatenated). Each class's walk
    selects in non-increasing score order, so the merge advances only the class whose
    next selection scores highest, and stops after ``limit`` selections instead of
    running every class's walk to its end. Scratch: ``order`` [c, n] int64 (a class's
    list, built at its first selection), ``length`` / ``best`` / ``picked`` [c] int64,
    ``heads`` [c] float32 (the next selection's score), ``active`` [c] bool. Writes
    anchors and labels to ``out_anchor`` / ``out_label``; returns how many."""
    n, c = scores.shape
    for label in range(c):
        active[label] = False
        length[label] = -1
        picked[label] = 0
    if per_class > 0:
        for a in range(n):
            for label in range(1, c):
                score = scores[a, label]
                if score > score_threshold and (not active[label] or score > heads[label]):
                    heads[label] = score
                    active[label] = True
    count = 0
    while count < limit:
        g = -1
        for label in range(1, c):
            if active[label] and (g < 0 or heads[label] > heads[g]):
                g = label
        if g < 0:
            break
        column = scores[:, g]
        row = order[g]
        m = length[g]
        if m < 0:
            m = 0
            for a in range(n):
                if column[a] > score_threshold:
                    row[m] = a
                    m += 1
            best[g] = _first_maximum(row, m, column)
        out_anchor[count] = row[best[g]]
        out_label[count] = g
        count += 1
        m = _select(row, m, best[g], boxes, threshold)
        length[g] = m
        picked[g] += 1
        if m == 0 or picked[g] >= per_class:
            active[g] = False
        else:
            best[g] = _first_maximum(row, m, column)
            heads[g] = column[row[best[g]]]
    return count


@_jit
def row_maxima(scores, first, out):
    """``scores[:, first:].max(axis=1)`` (float32 [n, c]) as numpy gives it: NaN where a
    row holds one."""
    n, c = scores.shape
    for a in range(n):
        m = scores[a, first]
        for label in range(first + 1, c):
            value = scores[a, label]
            if value != value:
                m = value
                break
            if value > m:
                m = value
        out[a] = m
