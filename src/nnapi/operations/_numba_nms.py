"""Compiled greedy hard NMS (the optional ``nnapi[fast]`` extra) for DETECTION_POSTPROCESSING.

Imported by ``detection_postprocessing`` only when ``_jit.kernels()`` says numba is in use.
``_detection_common.greedy_nms`` is the reference: the selection loop is sequential, and
numpy pays a dozen passes and gathers per selected box, which for regular NMS over an SSD's
1,917 anchors x 90 classes at a score threshold near 0 is seconds. This kernel runs the same
walk in one compiled loop and agrees with it exactly (tests compare the selections, ties
included):

- the best candidate is the first maximum score in the current order (``np.argmax``), and
  is swapped with the first position;
- the IoU with it is computed in float32 in numpy's order (``min`` / ``max`` propagating
  NaN, ``(area + area) - intersection``); a NaN IoU drops nothing;
- dropped candidates are replaced by the last unexamined one, as Android's in-place
  compaction does (``_detection_common._compaction_order``).
"""

from __future__ import annotations

import numpy as np

from nnapi.operations._numba_cache import kernel

_jit = kernel(nogil=True, fastmath=False, boundscheck=False, error_model="numpy")


@_jit
def greedy_nms_hard(order, boxes, scores, threshold, limit, selected):
    """Greedy hard NMS over the candidates ``order`` (int64 indexes into ``boxes`` [n, 4]
    float32 and ``scores`` float32; overwritten as the working list). Writes the selected
    indexes, in selection order, to ``selected`` and returns how many (at most ``limit``).
    A candidate overlapping a selected box by IoU >= ``threshold`` (float32) is dropped."""
    zero = np.float32(0)
    m = order.shape[0]
    count = 0
    while m > 0 and count < limit:
        best = 0
        best_score = scores[order[0]]
        for i in range(1, m):
            score = scores[order[i]]
            if score > best_score:
                best = i
                best_score = score
        chosen = order[best]
        order[best] = order[0]
        order[0] = chosen
        selected[count] = chosen
        count += 1
        if m == 1:
            break
        c1, c0, c3, c2 = boxes[chosen, 1], boxes[chosen, 0], boxes[chosen, 3], boxes[chosen, 2]
        chosen_area = (c2 - c0) * (c3 - c1)
        rest = m - 1
        i = 0
        while i < rest:
            k = order[1 + i]
            k0, k1, k2, k3 = boxes[k, 0], boxes[k, 1], boxes[k, 2], boxes[k, 3]
            width = np.maximum(np.minimum(k2, c2) - np.maximum(k0, c0), zero)
            height = np.maximum(np.minimum(k3, c3) - np.maximum(k1, c1), zero)
            intersection = width * height
            iou = intersection / ((k2 - k0) * (k3 - k1) + chosen_area - intersection)
            if iou >= threshold:
                order[1 + i] = order[rest]
                rest -= 1
            else:
                i += 1
        for j in range(rest):
            order[j] = order[1 + j]
        m = rest
    return count
