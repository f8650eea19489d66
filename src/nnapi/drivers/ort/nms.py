"""Lowerings of the greedy non-maximum suppressions (BOX_WITH_NMS_LIMIT, GENERATE_PROPOSALS,
DETECTION_POSTPROCESSING) as explicit ONNX graphs that make the reference's selections
exactly, ties included.

ONNX Runtime's NonMaxSuppression is not NNAPI's (it suppresses at IoU > threshold where
NNAPI does at >=, never suppresses touching boxes, orders ties its own way, has no soft
NMS), so none is used. Instead the walk of ``detection_common.greedy_nms_groups`` is an
ONNX Loop over selection steps, vectorized over every (image, class) group as the
reference's is, with its working list in the same order:

- each step takes the first maximum current score of each group's list (ArgMax gives the
  first; a NaN score, which ``np.argmax`` takes first, is found before any other), swaps it
  with the list's head and drops the head;
- the IoUs with it are float32 in the reference's order (Min / Max, which propagate NaN as
  numpy's do, then (area + area) - intersection), and the suppression kernel (hard, linear)
  rescales the scores as the reference does, dropping those below the NMS score threshold;
- the survivors are compacted in Android's in-place order (holes among the first ``count``
  positions, ascending, take the survivors beyond them from the last), which decides later
  ties;
- the selections are then ordered per image by descending score (ONNX TopK breaks ties by
  position: a stable sort), cut to the maximum per image, and ordered by class, then score.

GENERATE_PROPOSALS and DETECTION_POSTPROCESSING decode their boxes through Exp, as
AXIS_ALIGNED_BBOX_TRANSFORM does: ORT's may differ from numpy's by an ulp, so those boxes
agree within the CTS tolerance (~10% of coordinates an ulp apart at an RPN's size), and a
selection could differ only where a comparison falls on that ulp.

The gaussian kernel's exp is Android's std::exp of a float, which libm rounds correctly
but for rare inputs; ORT's float32 Exp does not (nor numpy's, the reference's), so both
raise the float32 exponent in float64 and round once: they agree exactly, and a rescored
score one ulp off, which could change a selection, does not arise between them.

What stays declined, and why: class counts known only at run time; parameters given at run time; GENERATE_PROPOSALS past
``_PROPOSALS_CANDIDATES`` candidates per image, DETECTION_POSTPROCESSING past
``_POSTPROCESSING_CELLS``, where the reference is 2-9x faster.

The device module imports this one, which registers these lowerings with ``lowering``.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from onnx import TensorProto, helper

from nnapi.codes import OperationCode
from nnapi.drivers.ort.builder import (
    FLOATS,
    Declined,
    GraphBuilder,
    T,
    all_hold,
    f32,
    fail_unless,
    i64,
    internal_zero_point,
    lowers,
    scalar_i64,
)
from nnapi.drivers.ort.detection import corners_ordered, decoded_boxes, encode_real, real_values, run_time_dim
from nnapi.hal import Operand, Operation

_NEG_INF = np.float32(-np.inf)
#: (IoUs, scores) -> (new scores, dropped), as ONNX nodes: how a selection suppresses the
#: candidates it overlaps (the reference's hard or soft suppressor)
Suppressor = Callable[[GraphBuilder, str, str], tuple[str, str]]


def _range(g: GraphBuilder, length: str) -> str:
    """0 .. length - 1 (int64) for a scalar ``length``."""
    return g.one("Range", [scalar_i64(g, 0), length, scalar_i64(g, 1)])


def _int(g: GraphBuilder, name: str) -> str:
    return g.one("Cast", [name], to=TensorProto.INT64)


def _column(g: GraphBuilder, name: str, index: int) -> str:
    """Column ``index`` of the last axis of ``name``, that axis dropped."""
    return g.one("Gather", [name, scalar_i64(g, index)], axis=-1)


def _first_maximum(g: GraphBuilder, scores: str) -> str:
    """Per row of [rows, width] float32 ``scores``, the position np.argmax gives ([rows, 1]):
    the first NaN where there is one, else the first maximum."""
    nan = g.one("Cast", [g.one("IsNaN", [scores])], to=TensorProto.FLOAT)
    any_nan = g.one("Greater", [g.one("ReduceMax", [nan], axes=[1], keepdims=1), f32(g, 0.0)])
    return g.one("Where", [any_nan, g.one("ArgMax", [nan], axis=1, keepdims=1),
                          g.one("ArgMax", [scores], axis=1, keepdims=1)])


def _stable_order(g: GraphBuilder, keys: str, largest: bool) -> str:
    """The positions of 1-D ``keys`` sorted (descending where ``largest``), equal keys in
    their order: ONNX TopK breaks ties by the lower index."""
    count = g.one("Shape", [keys])
    return g.node("TopK", [keys, count], 2, axis=0, largest=int(largest), sorted=1)[1]


def _score_key(g: GraphBuilder, scores: str) -> str:
    """Scores as a sort key: a NaN (last in numpy's sorts of -score) as -inf, which no kept
    score is (a candidate's score exceeds the threshold; rescaling by at most 1 keeps it so)."""
    return g.one("Where", [g.one("IsNaN", [scores]), f32(g, _NEG_INF), scores])


def _run_starts(g: GraphBuilder, keys: str) -> tuple[str, str, str]:
    """For 1-D int64 ``keys``, runs of equal consecutive values: (run id of each element,
    the position where each element's run starts, the number of runs)."""
    count = g.one("Shape", [keys])
    previous = g.one("Concat", [g.one("Slice", [keys, i64(g, 0), i64(g, 1)]),
                                g.one("Slice", [keys, i64(g, 0), i64(g, -1)])], axis=0)
    positions = _range(g, g.one("Squeeze", [count, i64(g, 0)]))
    starts = g.one("Or", [g.one("Not", [g.one("Equal", [keys, previous])]),
                          g.one("Equal", [positions, scalar_i64(g, 0)])])
    run = g.one("Sub", [g.one("CumSum", [_int(g, starts), scalar_i64(g, 0)]), scalar_i64(g, 1)])
    start_positions = g.one("Reshape", [g.one("NonZero", [starts]), i64(g, -1)])
    run_start = g.one("Gather", [start_positions, run], axis=0)
    runs = g.one("ReduceSum", [_int(g, starts)], keepdims=0)
    return run, run_start, runs


def _suppressor(kernel: int, iou_threshold: float, sigma: float, floor: float) -> Suppressor:
    """The reference's soft_suppressor as ONNX nodes: (new scores, dropped) of the IoUs and
    scores given, in float32 in the reference's order."""
    if kernel not in (0, 1, 2):
        raise Declined(f"BOX_WITH_NMS_LIMIT's soft NMS kernel {kernel} is not 0 (hard), 1 (linear) or 2 (gaussian)")

    def suppress(g: GraphBuilder, iou: str, scores: str) -> tuple[str, str]:
        if kernel in (0, 1):
            below = g.one("Less", [iou, f32(g, iou_threshold)])
            rescale = f32(g, 0.0) if kernel == 0 else g.one("Sub", [f32(g, 1.0), iou])
            factor = g.one("Where", [below, f32(g, 1.0), rescale])
        else:
            # exp(-IoU^2 / sigma), the exponent in float32 as Android's and the reference's,
            # raised in float64 and rounded once, as the reference does: ORT's float32 Exp is
            # not correctly rounded (~5% of these inputs an ulp off), its float64 one rounded
            # to float32 is (no difference in 2,000,000 IoUs with sigma 0.5)
            exponent = g.one("Div", [g.one("Neg", [g.one("Mul", [iou, iou])]), f32(g, sigma)])
            raised = g.one("Exp", [g.one("Cast", [exponent], to=TensorProto.DOUBLE)])
            factor = g.one("Cast", [raised], to=TensorProto.FLOAT)
        rescored = g.one("Mul", [scores, factor])
        return rescored, g.one("Less", [rescored, f32(g, floor)])

    return suppress


def _greedy_loop(g: GraphBuilder, columns: list[str], ids: str, lengths: str, limit: int | None,
                 suppress: Suppressor) -> list[str]:
    """The reference's greedy_nms_groups over [groups, width] lists: ``columns`` the six
    float32 [groups, width] arrays x1, y1, x2, y2, area and current score (padding scores
    -inf), ``ids`` [groups, width] int64, ``lengths`` [groups] int64 the valid entries of
    each, every group selecting at most ``limit`` (None: no limit). Gives the scan outputs
    [steps, groups]: the id and score selected at each step, and whether the group selected
    one.

    Each step works on the lists as they are: the IoUs and rescoring of every position
    (the chosen one's own is unused), then the survivors' positions in the reference's
    list after its swap (position j + 1, or 0 where j + 1 was the chosen one's), compacted,
    and each array gathered once through flat indexes."""
    limits = lengths if limit is None else g.one("Min", [lengths, scalar_i64(g, limit)])
    # the entries left to walk: none in a group whose limit is 0
    remaining = g.one("Where", [g.one("Greater", [limits, scalar_i64(g, 0)]), lengths,
                                g.one("Mul", [lengths, scalar_i64(g, 0)])])
    b = g.nested(g.subgraph, "nms")
    prefix = b.prefix
    names = [f"{prefix}{name}" for name in ("i", "cond", "x1", "y1", "x2", "y2", "area", "score", "ids",
                                            "remaining", "picked")]
    arrays_in, ids_in, remaining_in, picked_in = names[2:8], names[8], names[9], names[10]
    x1, y1, x2, y2, area, live = arrays_in
    best = _first_maximum(b, live)                                            # [G, 1]
    c1, d1, c2, d2, chosen_area, chosen_score = (b.one("GatherElements", [array, best], axis=1)
                                                 for array in arrays_in)    # [G, 1]
    chosen_id = b.one("GatherElements", [ids_in, best], axis=1)
    selecting = b.one("Greater", [remaining_in, scalar_i64(b, 0)])
    picked = b.one("Add", [picked_in, _int(b, selecting)])
    shape = b.one("Shape", [ids_in])
    rows, width = (b.one("Gather", [shape, scalar_i64(b, k)], axis=0) for k in range(2))
    zero = f32(b, 0.0)
    overlap_w = b.one("Max", [b.one("Sub", [b.one("Min", [x2, c2]), b.one("Max", [x1, c1])]), zero])
    overlap_h = b.one("Max", [b.one("Sub", [b.one("Min", [y2, d2]), b.one("Max", [y1, d1])]), zero])
    intersection = b.one("Mul", [overlap_w, overlap_h])
    iou = b.one("Div", [intersection, b.one("Sub", [b.one("Add", [area, chosen_area]), intersection])])
    rescored, dropped = suppress(b, iou, live)
    still = b.one("And", [selecting, b.one("Less", [picked, limits])])
    slots = b.one("Unsqueeze", [_range(b, width), i64(b, 0)])              # [1, W]
    keep_at = b.one("And", [b.one("And", [b.one("Not", [dropped]), b.one("Less", [
        slots, b.one("Unsqueeze", [remaining_in, i64(b, 1)])])]), b.one("And", [
            b.one("Not", [b.one("Equal", [slots, best])]), b.one("Unsqueeze", [still, i64(b, 1)])])])
    # the reference's rest list after its swap: position j holds this step's position j + 1,
    # or 0 (the old head) where j + 1 was the chosen one's
    after = b.one("Unsqueeze", [b.one("Range", [scalar_i64(b, 1), width, scalar_i64(b, 1)]), i64(b, 0)])
    origin = b.one("Where", [b.one("Equal", [after, best]), scalar_i64(b, 0), after])   # [G, m]
    keep = b.one("GatherElements", [keep_at, origin], axis=1)
    left = b.one("ReduceSum", [_int(b, keep), i64(b, 1)], keepdims=0)
    new_width = b.one("ReduceMax", [b.one("Concat", [left, i64(b, 0)], axis=0)], keepdims=0)
    condition = b.one("Greater", [new_width, scalar_i64(b, 0)])
    # Android's compaction: the k-th hole among the first `count` positions (ascending)
    # takes the k-th survivor beyond them counted from the last
    rest_width = b.one("Sub", [width, scalar_i64(b, 1)])
    positions = b.one("Unsqueeze", [_range(b, rest_width), i64(b, 0)])     # [1, m]
    count = b.one("Unsqueeze", [left, i64(b, 1)])
    head = b.one("Less", [positions, count])
    hole = b.one("And", [head, b.one("Not", [keep])])
    beyond = b.one("And", [b.one("Not", [head]), keep])
    hole_rank = b.one("CumSum", [_int(b, hole), scalar_i64(b, 1)], exclusive=1)
    beyond_rank = b.one("CumSum", [_int(b, beyond), scalar_i64(b, 1)], exclusive=1, reverse=1)
    spare = b.one("Concat", [b.one("Unsqueeze", [rows, i64(b, 0)]), b.one("Unsqueeze", [width, i64(b, 0)])],
                  axis=0)
    identity = b.one("Expand", [slots, spare])                                # [G, m + 1]: m is a dump
    spread = b.one("Expand", [positions, b.one("Shape", [keep])])
    dump = b.one("Unsqueeze", [rest_width, i64(b, 0)])
    hole_at = b.one("ScatterElements", [identity, b.one("Where", [hole, hole_rank, dump]), spread], axis=1)
    destination = b.one("GatherElements", [hole_at, b.one("Where", [beyond, beyond_rank, dump])], axis=1)
    source = b.one("ScatterElements", [identity, b.one("Where", [beyond, destination, dump]), spread], axis=1)
    source = b.one("Slice", [source, i64(b, 0), b.one("Unsqueeze", [new_width, i64(b, 0)]), i64(b, 1)])
    source = b.one("GatherElements", [origin, source], axis=1)              # [G, new width]
    # (GatherElements per row: ORT's Gather of flat indexes took 5x as long at 90 x 236)
    gathered = [b.one("GatherElements", [array, source], axis=1) for array in (x1, y1, x2, y2, area, rescored, ids_in)]
    live_slot = b.one("Less", [b.one("Unsqueeze", [_range(b, new_width), i64(b, 0)]), count])
    gathered[5] = b.one("Where", [live_slot, gathered[5], f32(b, _NEG_INF)])
    outputs = [condition, *gathered, left, picked, b.one("Squeeze", [chosen_id, i64(b, 1)]),
               b.one("Squeeze", [chosen_score, i64(b, 1)]), selecting]
    types = [TensorProto.BOOL, *[TensorProto.FLOAT] * 6, TensorProto.INT64, TensorProto.INT64, TensorProto.INT64,
             TensorProto.INT64, TensorProto.FLOAT, TensorProto.BOOL]
    graph = helper.make_graph(
        b.nodes, f"{prefix}body",
        [helper.make_tensor_value_info(names[0], TensorProto.INT64, []),
         helper.make_tensor_value_info(names[1], TensorProto.BOOL, []),
         *(helper.make_tensor_value_info(name, TensorProto.FLOAT, None) for name in arrays_in),
         *(helper.make_tensor_value_info(name, TensorProto.INT64, None) for name in (ids_in, remaining_in,
                                                                                     picked_in))],
        [helper.make_tensor_value_info(name, element, None) for name, element in zip(outputs, types, strict=True)],
        b.initializers)
    zeros = g.one("Mul", [remaining, scalar_i64(g, 0)])
    results = g.node("Loop", ["", g.constant(np.array(True)), *columns, ids, remaining, zeros], 12, body=graph)
    return results[9:]


def _padded_walk(g: GraphBuilder, columns: list[str], ids: str, lengths: str, width: int, limit: int | None,
                 suppress: Suppressor) -> list[str]:
    """_greedy_loop over [groups, width] candidate lists with one empty group more, so that
    the walk has a row and a step even without images: its scan outputs."""
    columns = [g.one("Concat", [column, g.one("Expand", [f32(g, 0.0 if k < 5 else _NEG_INF),
                                                           i64(g, 1, width)])], axis=0)
               for k, column in enumerate(columns)]
    ids = g.one("Concat", [ids, g.one("Expand", [i64(g, 0), i64(g, 1, width)])], axis=0)
    lengths = g.one("Concat", [lengths, i64(g, 0)], axis=0)
    return _greedy_loop(g, columns, ids, lengths, limit, suppress)


def _scores(g: GraphBuilder, scores: str, operand: Operand) -> str:
    """Selected float32 scores in ``operand``'s encoding (detection._store). A NaN score (the
    linear kernel's rescoring of a zero-area box by a zero-area box: IoU 0 / 0) quantizes to
    the stored integer 0, as the reference's numpy cast of NaN gives on x86 and ARM alike."""
    stored = encode_real(g, scores, operand)
    if operand.type in FLOATS:
        return stored
    nan_stored = internal_zero_point(operand) - operand.zero_point  # stored 0 in the internal encoding
    element = np.uint16 if operand.type == T.TENSOR_QUANT16_ASYMM else np.uint8
    return g.one("Where", [g.one("IsNaN", [scores]), g.constant(np.array(nan_stored, element)), stored])


@lowers(OperationCode.BOX_WITH_NMS_LIMIT)
def lower_box_with_nms_limit(g: GraphBuilder, operation: Operation) -> None:
    """BOX_WITH_NMS_LIMIT as the reference computes it (box_with_nms_limit.py): per run of
    equal batch indexes and per foreground class, the candidates scoring above the
    threshold in roi order, the greedy walk (_greedy_loop) keeping at most max_detections
    per class, then per image by descending score cut to max_detections, ordered by class
    and descending score. A box with x1 > x2 or y1 > y2 fails the run, as the reference's."""
    scores_operand = g.operand(operation.inputs[0])
    if len(scores_operand.dimensions) != 2 or not scores_operand.dimensions[1]:
        raise Declined("BOX_WITH_NMS_LIMIT needs the class count")
    classes = scores_operand.dimensions[1]
    if classes < 2:
        raise Declined("num_classes must be greater than 1 (class 0 is the background)")
    score_threshold = np.float32(g.scalar(operation.inputs[3]))
    max_detections = int(g.scalar(operation.inputs[4]))
    kernel = int(g.scalar(operation.inputs[5]))
    suppress = _suppressor(kernel, float(np.float32(g.scalar(operation.inputs[6]))),
                           float(np.float32(g.scalar(operation.inputs[7]))),
                           float(np.float32(g.scalar(operation.inputs[8]))))
    scores = real_values(g, operation.inputs[0])                                   # [R, C]
    boxes = g.one("Reshape", [real_values(g, operation.inputs[1]), i64(g, -1, classes, 4)])   # [R, C, 4]
    raw_boxes = g.one("Reshape", [g.value(operation.inputs[1]).name, i64(g, -1, 4)])     # [R * C, 4]
    batches = g.value(operation.inputs[2]).name
    x1, y1, x2, y2 = (_column(g, boxes, k) for k in range(4))
    run, run_start, _ = _run_starts(g, fail_unless(g, all_hold(g, [corners_ordered(g, x1, y1, x2, y2)]),
                                                      _int(g, batches), "every box needs x1 <= x2 and y1 <= y2"))
    foreground = classes - 1
    candidate = g.one("Greater", [g.one("Slice", [scores, i64(g, 1), i64(g, classes), i64(g, 1)]),
                                  f32(g, score_threshold)])                 # [R, C - 1]
    counts = _int(g, candidate)
    before = g.one("CumSum", [counts, scalar_i64(g, 0)], exclusive=1)      # [R, C - 1]
    rank = g.one("Sub", [before, g.one("Gather", [before, run_start], axis=0)])
    # per group (run, class): its candidate count, from the inclusive sums at the run's last roi
    through = g.one("Add", [before, counts])
    rois = g.one("Shape", [batches])
    starts = g.one("Reshape", [g.one("NonZero", [g.one("Equal", [run_start, _range(g, g.one("Squeeze", [
        rois, i64(g, 0)]))])]), i64(g, -1)])
    # each run's last roi: the next run's start (the roi count after the last run) - 1
    ends = g.one("Sub", [g.one("Slice", [g.one("Concat", [starts, rois], axis=0), i64(g, 1),
                                         i64(g, np.iinfo(np.int64).max)]), scalar_i64(g, 1)])
    lengths = g.one("Reshape", [g.one("Sub", [g.one("Gather", [through, ends], axis=0),
                                              g.one("Gather", [before, starts], axis=0)]), i64(g, -1)])
    lengths = g.one("Concat", [lengths, i64(g, 0)], axis=0)                 # a last, empty group
    groups = g.one("Shape", [lengths])
    width = g.one("Max", [g.one("ReduceMax", [lengths], keepdims=0), scalar_i64(g, 1)])
    # the candidates in roi order, placed in their group's list
    where = g.one("NonZero", [candidate])                                     # [2, K]: roi, class - 1
    roi, column = (g.one("Squeeze", [g.one("Slice", [where, i64(g, k), i64(g, k + 1)]), i64(g, 0)])
                   for k in range(2))
    pairs = g.one("Transpose", [where], perm=[1, 0])
    group = g.one("Add", [g.one("Mul", [g.one("Gather", [run, roi], axis=0), scalar_i64(g, foreground)]), column])
    slot = g.one("Add", [g.one("Mul", [group, width]), g.one("GatherND", [rank, pairs])])
    klass = g.one("Add", [column, scalar_i64(g, 1)])
    identifier = g.one("Add", [g.one("Mul", [roi, scalar_i64(g, classes)]), klass])
    box = g.one("GatherND", [boxes, g.one("Transpose", [g.one("Concat", [
        g.one("Unsqueeze", [roi, i64(g, 0)]), g.one("Unsqueeze", [klass, i64(g, 0)])], axis=0)], perm=[1, 0])])
    bx1, by1, bx2, by2 = (_column(g, box, k) for k in range(4))
    area = g.one("Mul", [g.one("Sub", [bx2, bx1]), g.one("Sub", [by2, by1])])
    score = g.one("GatherND", [scores, g.one("Concat", [
        g.one("Unsqueeze", [roi, i64(g, 1)]), g.one("Unsqueeze", [klass, i64(g, 1)])], axis=1)])
    rows = g.one("Concat", [box, g.one("Unsqueeze", [area, i64(g, 1)]), g.one("Unsqueeze", [score, i64(g, 1)])],
                 axis=1)                                                       # [K, 6]
    cells = g.one("Mul", [groups, g.one("Unsqueeze", [width, i64(g, 0)])])
    padding = g.constant(np.array([[0, 0, 0, 0, 0, _NEG_INF]], np.float32))
    flat_state = g.one("ScatterND", [g.one("Expand", [padding, g.one("Concat", [cells, i64(g, 6)], axis=0)]),
                                     g.one("Unsqueeze", [slot, i64(g, 1)]), rows])
    flat_ids = g.one("ScatterND", [g.one("Expand", [i64(g, -1), cells]), g.one("Unsqueeze", [slot, i64(g, 1)]),
                                   identifier])
    grid = g.one("Concat", [groups, g.one("Unsqueeze", [width, i64(g, 0)])], axis=0)
    columns = [g.one("Reshape", [column, grid]) for column in g.node("Split", [flat_state, i64(g, 1, 1, 1, 1, 1, 1)],
                                                                       6, axis=1)]
    ids = g.one("Reshape", [flat_ids, grid])
    chosen_ids, chosen_scores, taken = _greedy_loop(g, columns, ids, lengths, None if max_detections < 0
                                                    else max_detections, suppress)
    # the selections in (run, class, step) order: [groups, steps] without the empty group
    real_groups = g.one("Sub", [groups, i64(g, 1)])
    taken = g.one("Slice", [g.one("Transpose", [taken], perm=[1, 0]), i64(g, 0), real_groups, i64(g, 0)])
    picks = g.one("Transpose", [g.one("NonZero", [taken])], perm=[1, 0])     # [K, 2]
    item_id = g.one("GatherND", [g.one("Transpose", [chosen_ids], perm=[1, 0]), picks])
    item_score = g.one("GatherND", [g.one("Transpose", [chosen_scores], perm=[1, 0]), picks])
    item_run = g.one("Div", [g.one("Squeeze", [g.one("Slice", [picks, i64(g, 0), i64(g, 1), i64(g, 1)]),
                                               i64(g, 1)]), scalar_i64(g, foreground)])
    item_class = g.one("Mod", [item_id, scalar_i64(g, classes)])
    # per run by descending score (stable), cut to max_detections
    by_score = _stable_order(g, _score_key(g, item_score), largest=True)
    order = g.one("Gather", [by_score, _stable_order(g, g.one("Gather", [item_run, by_score], axis=0), False)],
                  axis=0)
    if max_detections >= 0:
        _, first, _ = _run_starts(g, g.one("Gather", [item_run, order], axis=0))
        place = g.one("Sub", [_range(g, g.one("Squeeze", [g.one("Shape", [order]), i64(g, 0)])), first])
        order = g.one("Compress", [order, g.one("Less", [place, scalar_i64(g, max_detections)])], axis=0)
    # then by class (stable), then by run (stable): run, class, descending score
    order = g.one("Gather", [order, _stable_order(g, g.one("Gather", [item_class, order], axis=0), False)], axis=0)
    order = g.one("Gather", [order, _stable_order(g, g.one("Gather", [item_run, order], axis=0), False)], axis=0)
    out_id = g.one("Gather", [item_id, order], axis=0)
    out_roi = g.one("Div", [out_id, scalar_i64(g, classes)])
    g.set_output(operation.outputs[0], _scores(g, g.one("Gather", [item_score, order], axis=0),
                                               g.operand(operation.outputs[0])))
    g.set_output(operation.outputs[1], g.one("Gather", [raw_boxes, out_id], axis=0))
    g.set_output(operation.outputs[2], g.one("Cast", [g.one("Gather", [item_class, order], axis=0)],
                                             to=TensorProto.INT32))
    g.set_output(operation.outputs[3], g.one("Gather", [batches, out_roi], axis=0))


#: GENERATE_PROPOSALS is claimed up to this many NMS candidates per image (the pre-NMS
#: limit, or every anchor position): its walk keeps one group per image, so the Loop's fixed
#: cost per step (~100 nodes) is not shared as BOX_WITH_NMS_LIMIT's classes share it.
#: Measured (process_time, load ~10): 32 candidates x 2 images 1.9 vs 1.2 ms on the
#: reference, 64: 1.4 vs 1.3 ms, 128: 1.7 vs 0.8 ms, 1,000: 9.5 vs 3.5 ms, an RPN's
#: 6,000 (post-NMS 300): 89 vs 21 ms
_PROPOSALS_CANDIDATES = 64


def _hard_suppressor(iou_threshold: float) -> Suppressor:
    """The reference's hard_suppressor: scores unchanged, IoU >= threshold dropped (a NaN
    IoU drops nothing)."""

    def suppress(g: GraphBuilder, iou: str, scores: str) -> tuple[str, str]:
        return scores, g.one("GreaterOrEqual", [iou, f32(g, iou_threshold)])

    return suppress


def _real_boxes(g: GraphBuilder, index: int) -> str:
    """Box-like operand ``index`` as float32 real values: detection._real, and
    TENSOR_QUANT16_SYMM anchors (q * 0.125, exact) besides."""
    operand = g.operand(index)
    value = g.value(index)
    if value.kind == "int16":
        if operand.scale != 0.125:
            raise Declined("TENSOR_QUANT16_SYMM anchors must have scale 0.125")
        return g.one("Mul", [g.one("Cast", [value.name], to=TensorProto.FLOAT), f32(g, 0.125)])
    return real_values(g, index)


@lowers(OperationCode.GENERATE_PROPOSALS)
def lower_generate_proposals(g: GraphBuilder, operation: Operation) -> None:
    """GENERATE_PROPOSALS as the reference computes it (generate_proposals.py): every anchor
    placed at every feature-map position, moved by its deltas and clipped to its image
    (transform_boxes' float32 operations in order: ORT's Exp may differ from numpy's by an
    ulp, as in AXIS_ALIGNED_BBOX_TRANSFORM), per image the best pre-NMS-limit by stable
    descending score (or all, in position order), those too small or centred outside the
    image dropped (order kept), then the greedy hard NMS walk (_greedy_loop, one group per
    image) keeping at most the post-NMS limit. An anchor with x1 > x2 or y1 > y2 fails
    the run, as the reference's."""
    scores_operand = g.operand(operation.inputs[0])
    nchw = bool(g.scalar(operation.inputs[10]))
    dims = list(scores_operand.dimensions)
    if len(dims) != 4 or not all(dims[1:]):
        raise Declined("GENERATE_PROPOSALS needs the feature map's height, width and anchor count")
    height, width, anchors_count = (dims[2], dims[3], dims[1]) if nchw else dims[1:]
    positions = height * width * anchors_count
    pre_limit, post_limit = int(g.scalar(operation.inputs[6])), int(g.scalar(operation.inputs[7]))
    candidates_per_image = positions if pre_limit <= 0 else min(pre_limit, positions)
    if candidates_per_image > _PROPOSALS_CANDIDATES:
        raise Declined(f"{candidates_per_image} NMS candidates per image: past {_PROPOSALS_CANDIDATES}, the greedy "
                       "walk as an ONNX Loop takes 2-3x the reference's time")
    height_stride = np.float32(g.scalar(operation.inputs[4]))
    width_stride = np.float32(g.scalar(operation.inputs[5]))
    suppress = _hard_suppressor(float(np.float32(g.scalar(operation.inputs[8]))))
    min_size = np.float32(g.scalar(operation.inputs[9]))
    scores = real_values(g, operation.inputs[0])
    deltas = real_values(g, operation.inputs[1])
    if nchw:
        scores = g.one("Transpose", [scores], perm=[0, 2, 3, 1])
        deltas = g.one("Transpose", [deltas], perm=[0, 2, 3, 1])
    scores = g.one("Reshape", [scores, i64(g, 0, positions)])                       # [B, P]
    deltas = g.one("Reshape", [deltas, i64(g, 0, positions, 4)])                    # [B, P, 4]
    anchors = _real_boxes(g, operation.inputs[2])                                      # [A, 4]
    image = real_values(g, operation.inputs[3])                                              # [B, 2]
    a1, b1, a2, b2 = (_column(g, anchors, k) for k in range(4))
    anchors_ordered = all_hold(g, [corners_ordered(g, a1, b1, a2, b2)])
    # anchor a at feature position (h, w) in image coordinates, [h, w, a] flattened
    shift_y = np.arange(height, dtype=np.float32) * height_stride
    shift_x = np.arange(width, dtype=np.float32) * width_stride
    shifts = np.zeros((height, width, 1, 4), np.float32)
    shifts[..., 0::2] = shift_x[None, :, None, None]
    shifts[..., 1::2] = shift_y[:, None, None, None]
    placed = g.one("Reshape", [g.one("Add", [g.one("Reshape", [anchors, i64(g, 1, 1, anchors_count, 4)]),
                                             g.constant(shifts)]), i64(g, 1, positions, 4)])   # [1, P, 4]
    x1, y1, x2, y2 = (_column(g, placed, k) for k in range(4))                      # [1, P]
    dx, dy, dw, dh = (_column(g, deltas, k) for k in range(4))                      # [B, P]
    image_height, image_width = (g.one("Unsqueeze", [_column(g, image, k), i64(g, 1)]) for k in range(2))
    boxes = decoded_boxes(g, (x1, y1, x2, y2), (dx, dy, dw, dh), image_width, image_height)
    two = f32(g, 2.0)
    # the candidates of each image: the best pre_limit by stable descending score, or all
    if 0 < pre_limit < positions:
        nan = g.one("IsNaN", [scores])
        by_score = g.node("TopK", [_score_key(g, scores), i64(g, positions)], 2, axis=1, largest=1, sorted=1)[1]
        # NaN scores after the others (numpy's argsort of -score), each group in order
        nan_last = g.node("TopK", [_int(g, g.one("GatherElements", [nan, by_score], axis=1)), i64(g, positions)],
                          2, axis=1, largest=0, sorted=1)[1]
        candidates = g.one("Slice", [g.one("GatherElements", [by_score, nan_last], axis=1), i64(g, 0),
                                     i64(g, pre_limit), i64(g, 1)])
        count = pre_limit
    else:
        candidates = g.one("Unsqueeze", [g.constant(np.arange(positions, dtype=np.int64)), i64(g, 0)])
        candidates = g.one("Expand", [candidates, g.one("Concat", [run_time_dim(g, scores, 0), i64(g, positions)],
                                                                  axis=0)])
        count = positions
    chosen = [g.one("GatherElements", [box, candidates], axis=1) for box in boxes]
    chosen_w = g.one("Sub", [chosen[2], chosen[0]])
    chosen_h = g.one("Sub", [chosen[3], chosen[1]])
    usable = g.one("And", [g.one("And", [g.one("Greater", [chosen_w, f32(g, min_size)]),
                                         g.one("Greater", [chosen_h, f32(g, min_size)])]),
                           g.one("And", [g.one("Less", [g.one("Add", [chosen[0], g.one("Div", [chosen_w, two])]),
                                                        image_width]),
                                         g.one("Less", [g.one("Add", [chosen[1], g.one("Div", [chosen_h, two])]),
                                                        image_height])])])
    # the usable ones first, in their order (TopK keeps equal keys in order)
    first = g.node("TopK", [_int(g, usable), i64(g, count)], 2, axis=1, largest=1, sorted=1)[1]
    ids = g.one("GatherElements", [candidates, first], axis=1)                           # [B, count]
    lengths = g.one("ReduceSum", [_int(g, usable), i64(g, 1)], keepdims=0)              # [B]
    ids = fail_unless(g, anchors_ordered, ids,
                      "every anchor needs x1 <= x2 and y1 <= y2")
    columns = [g.one("GatherElements", [box, ids], axis=1) for box in boxes]
    columns.append(g.one("Mul", [g.one("Sub", [columns[2], columns[0]]), g.one("Sub", [columns[3], columns[1]])]))
    slot_valid = g.one("Less", [g.one("Unsqueeze", [g.constant(np.arange(count, dtype=np.int64)), i64(g, 0)]),
                                g.one("Unsqueeze", [lengths, i64(g, 1)])])
    columns.append(g.one("Where", [slot_valid, g.one("GatherElements", [scores, ids], axis=1), f32(g, _NEG_INF)]))
    chosen_ids, _, taken = _padded_walk(g, columns, ids, lengths, count, post_limit if post_limit > 0 else None,
                                        suppress)
    images = run_time_dim(g, scores, 0)
    taken = g.one("Slice", [g.one("Transpose", [taken], perm=[1, 0]), i64(g, 0), images, i64(g, 0)])
    picks = g.one("Transpose", [g.one("NonZero", [taken])], perm=[1, 0])               # [K, 2]: image, step
    position = g.one("GatherND", [g.one("Transpose", [chosen_ids], perm=[1, 0]), picks])
    image_of = g.one("Squeeze", [g.one("Slice", [picks, i64(g, 0), i64(g, 1), i64(g, 1)]), i64(g, 1)])
    at = g.one("Transpose", [g.one("Concat", [g.one("Unsqueeze", [image_of, i64(g, 0)]),
                                              g.one("Unsqueeze", [position, i64(g, 0)])], axis=0)], perm=[1, 0])
    out_scores = g.one("GatherND", [scores, at])
    out_boxes = g.one("Concat", [g.one("Unsqueeze", [g.one("GatherND", [g.one("Expand", [box, g.one("Shape", [
        scores])]), at]), i64(g, 1)]) for box in boxes], axis=1)
    g.set_output(operation.outputs[0], _scores(g, out_scores, g.operand(operation.outputs[0])))
    g.set_output(operation.outputs[1], encode_real(g, out_boxes, g.operand(operation.outputs[1])))
    g.set_output(operation.outputs[2], g.one("Cast", [image_of], to=TensorProto.INT32))


#: DETECTION_POSTPROCESSING is claimed up to this many NMS candidates per image (anchors x
#: foreground classes for regular NMS, anchors for fast NMS). The Loop's fixed cost per
#: step (~100 nodes, ~70 us) makes every larger size slower than the reference's walk
#: (compiled with nnapi[fast]). Measured (process_time, load ~10, float32, 100 kept):
#: 6 anchors x 3 classes (the CTS's) 0.26 vs 0.22 ms regular, 0.32 vs 0.29 fast;
#: 100 x 11 regular 7.0 vs 0.8 ms; 500 x 9 regular 15.6 vs 2.1; 1,917 x 91 fast 14.5 vs
#: 4.3; 1,917 x 11 regular 58 vs 8.8; an SSD's 1,917 x 91 regular 448 vs 76 ms. Since
#: then the reference merges the classes' walks (only the class whose next selection
#: scores highest advances) and visits fast NMS's candidates by descending score: the
#: SSD's regular NMS ~1-2 ms (numpy 6.6), fast ~0.1-0.4 ms, so the Loop (one step per
#: selection of every class) is further behind at every size past the CTS's
_POSTPROCESSING_CELLS = 64


@lowers(OperationCode.DETECTION_POSTPROCESSING)
def lower_detection_postprocessing(g: GraphBuilder, operation: Operation) -> None:
    """DETECTION_POSTPROCESSING as the reference computes it (detection_postprocessing.py):
    the anchors decoded in float32 in its order (ORT's Exp may differ from numpy's by an
    ulp, as in AXIS_ALIGNED_BBOX_TRANSFORM); regular NMS: the greedy hard walk per (image,
    foreground class) over the anchors scoring above the threshold, at most the per-class
    limit each, then per image the best max_detections by stable descending score; fast
    NMS: one walk per image over each anchor's best foreground score, each kept anchor
    reporting its best classes (stable). Unused output slots are zero."""
    scores_operand = g.operand(operation.inputs[0])
    dims = list(scores_operand.dimensions)
    if len(dims) != 3 or not all(dims[1:]):
        raise Declined("DETECTION_POSTPROCESSING needs the anchor and class counts")
    anchors_count, classes = dims[1], dims[2]
    scales = [np.float32(g.scalar(operation.inputs[k])) for k in (3, 4, 5, 6)]
    regular = bool(g.scalar(operation.inputs[7]))
    max_detections, classes_per_detection, per_class = (int(g.scalar(operation.inputs[k])) for k in (8, 9, 10))
    threshold = np.float32(g.scalar(operation.inputs[11]))
    suppress = _hard_suppressor(float(np.float32(g.scalar(operation.inputs[12]))))
    label_offset = 0 if g.scalar(operation.inputs[13]) else 1
    if classes < 2 or min(scales) <= 0 or threshold < 0 or g.scalar(operation.inputs[12]) < 0 \
            or max_detections <= 0 or (per_class if regular else classes_per_detection) <= 0:
        raise Declined("parameters the reference refuses")
    cells = anchors_count * (classes - 1) if regular else anchors_count
    if cells > _POSTPROCESSING_CELLS:
        raise Declined(f"{cells} NMS candidates per image: past {_POSTPROCESSING_CELLS}, the greedy walk as an ONNX "
                       "Loop takes many times the reference's time")
    scores = real_values(g, operation.inputs[0])                                            # [B, N, C]
    deltas = real_values(g, operation.inputs[1])                                            # [B, N, >= 4]
    anchors = real_values(g, operation.inputs[2])                                           # [N, 4]
    d0, d1, d2, d3 = (_column(g, deltas, k) for k in range(4))                      # [B, N]
    a0, a1, a2, a3 = (_column(g, anchors, k) for k in range(4))                     # [N]
    half = f32(g, 0.5)
    center_y = g.one("Add", [a0, g.one("Div", [g.one("Mul", [a2, d0]), f32(g, scales[0])])])
    center_x = g.one("Add", [a1, g.one("Div", [g.one("Mul", [a3, d1]), f32(g, scales[1])])])
    half_h = g.one("Mul", [g.one("Mul", [a2, g.one("Exp", [g.one("Div", [d2, f32(g, scales[2])])])]), half])
    half_w = g.one("Mul", [g.one("Mul", [a3, g.one("Exp", [g.one("Div", [d3, f32(g, scales[3])])])]), half])
    boxes = [g.one("Sub", [center_y, half_h]), g.one("Sub", [center_x, half_w]),
             g.one("Add", [center_y, half_h]), g.one("Add", [center_x, half_w])]  # [B, N] each
    images = run_time_dim(g, scores, 0)
    foreground = g.one("Slice", [scores, i64(g, 1), i64(g, classes), i64(g, 2)])   # [B, N, C - 1]
    if regular:
        groups_per_image, width_max = classes - 1, anchors_count
        # candidate (image, class) lists over the anchors: [B, C - 1, N]
        listed = g.one("Transpose", [foreground], perm=[0, 2, 1])
        limit = per_class
    else:
        groups_per_image, width_max, limit = 1, anchors_count, max_detections
        nan_rows = g.one("ReduceMax", [g.one("Cast", [g.one("IsNaN", [foreground])], to=TensorProto.FLOAT)],
                         axes=[2], keepdims=1)
        best = g.one("ReduceMax", [foreground], axes=[2], keepdims=1)                  # [B, N, 1]
        # a row holding a NaN has a NaN maximum in numpy, which no threshold passes
        best = g.one("Where", [g.one("Greater", [nan_rows, f32(g, 0.0)]), f32(g, float("nan")), best])
        listed = g.one("Transpose", [best], perm=[0, 2, 1])                           # [B, 1, N]
    candidate = g.one("Greater", [listed, f32(g, threshold)])
    # each group's candidates first, in anchor order (TopK keeps equal keys in order)
    order = g.node("TopK", [_int(g, candidate), i64(g, width_max)], 2, axis=2, largest=1, sorted=1)[1]
    lengths = g.one("Reshape", [g.one("ReduceSum", [_int(g, candidate), i64(g, 2)], keepdims=0), i64(g, -1)])
    flat_groups = g.one("Mul", [images, i64(g, groups_per_image)])
    grid = g.one("Concat", [flat_groups, i64(g, width_max)], axis=0)
    anchor_ids = g.one("Reshape", [order, grid])                                      # [G, N]
    group_image = g.one("Div", [_range(g, g.one("Squeeze", [flat_groups, i64(g, 0)])),
                                scalar_i64(g, groups_per_image)])                    # [G]
    columns = [g.one("GatherElements", [g.one("Gather", [box, group_image], axis=0), anchor_ids], axis=1)
               for box in boxes]                                                      # [G, N]
    columns.append(g.one("Mul", [g.one("Sub", [columns[2], columns[0]]), g.one("Sub", [columns[3], columns[1]])]))
    group_scores = g.one("GatherElements", [g.one("Reshape", [listed, grid]), anchor_ids], axis=1)
    valid = g.one("Less", [g.one("Unsqueeze", [g.constant(np.arange(width_max, dtype=np.int64)), i64(g, 0)]),
                           g.one("Unsqueeze", [lengths, i64(g, 1)])])
    columns.append(g.one("Where", [valid, group_scores, f32(g, _NEG_INF)]))
    chosen_ids, chosen_scores, taken = _padded_walk(g, columns, anchor_ids, lengths, width_max, limit, suppress)
    taken = g.one("Slice", [g.one("Transpose", [taken], perm=[1, 0]), i64(g, 0), flat_groups, i64(g, 0)])
    picks = g.one("Transpose", [g.one("NonZero", [taken])], perm=[1, 0])            # [K, 2]: group, step
    item_anchor = g.one("GatherND", [g.one("Transpose", [chosen_ids], perm=[1, 0]), picks])
    item_score = g.one("GatherND", [g.one("Transpose", [chosen_scores], perm=[1, 0]), picks])
    item_group = g.one("Squeeze", [g.one("Slice", [picks, i64(g, 0), i64(g, 1), i64(g, 1)]), i64(g, 1)])
    item_image = g.one("Div", [item_group, scalar_i64(g, groups_per_image)])
    if regular:
        item_class = g.one("Add", [g.one("Mod", [item_group, scalar_i64(g, groups_per_image)]), scalar_i64(g, 1)])
        # per image by descending score (stable over class, then selection order), cut
        by_score = _stable_order(g, _score_key(g, item_score), largest=True)
        order = g.one("Gather", [by_score, _stable_order(g, g.one("Gather", [item_image, by_score], axis=0),
                                                         False)], axis=0)
        _, first, _ = _run_starts(g, g.one("Gather", [item_image, order], axis=0))
        place = g.one("Sub", [_range(g, g.one("Squeeze", [g.one("Shape", [order]), i64(g, 0)])), first])
        keep = g.one("Less", [place, scalar_i64(g, max_detections)])
        order = g.one("Compress", [order, keep], axis=0)
        place = g.one("Compress", [place, keep], axis=0)
        out_anchor = g.one("Gather", [item_anchor, order], axis=0)
        out_class = g.one("Gather", [item_class, order], axis=0)
        out_image = g.one("Gather", [item_image, order], axis=0)
        out_score = g.one("Gather", [item_score, order], axis=0)
        slots = max_detections
    else:
        ranked_count = min(classes - 1, classes_per_detection)
        rows = g.one("GatherND", [foreground, g.one("Concat", [g.one("Unsqueeze", [item_image, i64(g, 1)]),
                                                                g.one("Unsqueeze", [item_anchor, i64(g, 1)])],
                                                       axis=1)])                     # [K, C - 1]
        ranked = g.node("TopK", [rows, i64(g, ranked_count)], 2, axis=1, largest=1, sorted=1)   # K anchors' best
        count_k = g.one("Shape", [item_anchor])
        repeat = g.one("Concat", [count_k, i64(g, ranked_count)], axis=0)
        out_anchor = g.one("Reshape", [g.one("Expand", [g.one("Unsqueeze", [item_anchor, i64(g, 1)]), repeat]),
                                       i64(g, -1)])
        out_image = g.one("Reshape", [g.one("Expand", [g.one("Unsqueeze", [item_image, i64(g, 1)]), repeat]),
                                      i64(g, -1)])
        out_class = g.one("Add", [g.one("Reshape", [ranked[1], i64(g, -1)]), scalar_i64(g, 1)])
        out_score = g.one("Reshape", [ranked[0], i64(g, -1)])
        step = g.one("Squeeze", [g.one("Slice", [picks, i64(g, 1), i64(g, 2), i64(g, 1)]), i64(g, 1)])
        place = g.one("Reshape", [g.one("Add", [g.one("Mul", [g.one("Unsqueeze", [step, i64(g, 1)]),
                                                              scalar_i64(g, ranked_count)]),
                                               g.constant(np.arange(ranked_count, dtype=np.int64).reshape(1, -1))]),
                                  i64(g, -1)])
        slots = max_detections * classes_per_detection
    # into [B, slots] outputs, zeros elsewhere
    flat_slot = g.one("Unsqueeze", [g.one("Add", [g.one("Mul", [out_image, scalar_i64(g, slots)]), place]),
                                    i64(g, 1)])
    total = g.one("Mul", [images, i64(g, slots)])
    shape2 = g.one("Concat", [images, i64(g, slots)], axis=0)
    out_boxes = g.one("Concat", [g.one("Unsqueeze", [g.one("GatherND", [box, g.one("Concat", [
        g.one("Unsqueeze", [out_image, i64(g, 1)]), g.one("Unsqueeze", [out_anchor, i64(g, 1)])], axis=1)]),
        i64(g, 1)]) for box in boxes], axis=1)                                         # [K', 4]
    score_grid = g.one("Reshape", [g.one("ScatterND", [g.one("Expand", [f32(g, 0.0), total]), flat_slot,
                                                       out_score]), shape2])
    box_grid = g.one("Reshape", [g.one("ScatterND", [g.one("Expand", [f32(g, 0.0), g.one("Concat", [
        total, i64(g, 4)], axis=0)]), flat_slot, out_boxes]), g.one("Concat", [shape2, i64(g, 4)], axis=0)])
    class_grid = g.one("Reshape", [g.one("ScatterND", [g.one("Expand", [g.constant(np.array(0, np.int32)), total]),
                                                       flat_slot, g.one("Cast", [g.one("Sub", [
                                                           out_class, scalar_i64(g, label_offset)])],
                                                           to=TensorProto.INT32)]), shape2])
    counts = g.one("ScatterElements", [g.one("Expand", [i64(g, 0), images]), out_image,
                                       g.one("Expand", [scalar_i64(g, 1), g.one("Shape", [out_image])])],
                   axis=0, reduction="add")
    g.set_output(operation.outputs[0], score_grid)
    g.set_output(operation.outputs[1], box_grid)
    g.set_output(operation.outputs[2], class_grid)
    g.set_output(operation.outputs[3], g.one("Cast", [counts], to=TensorProto.INT32))
