"""Lowerings of MIRROR_PAD and PACK (feature level 6-7 data movement) to ONNX, exact for
every value type since no value is computed.

- MIRROR_PAD: REFLECT (the edge element not repeated) is ONNX Pad's "reflect" mode;
  SYMMETRIC (the edge repeated) has no ONNX mode, so each padded axis is a Concat of the
  reversed border slices (Slice with step -1) around the tensor. Paddings must be
  constants (they fix the output shape); the reference's limits (each padding < the
  dimension for REFLECT, <= for SYMMETRIC) are checked here so that a model it refuses
  is declined rather than run differently.
- PACK: before the last axis, of tensors of known shape, one Concat of the tensors along
  the axis and a Reshape inserting it; otherwise each tensor Unsqueezed at the axis,
  then one Concat.

Audio models pad their spectrogram frames this way (Spotify's basic-pitch: 9 MIRROR_PADs
and 9 PACKs that sent 41 of its 211 operations to the reference).

The device module imports this one, which registers these lowerings with ``lowering``.
"""

from __future__ import annotations

import numpy as np

from nnapi.codes import OperationCode
from nnapi.drivers.ort.builder import Declined, GraphBuilder, check_same_quantization, i64, keep_blocked, lowers
from nnapi.hal import Operation
from nnapi.operations.common import normalize_axis
from nnapi.operations.pack import AXIS, FIRST_INPUT
from nnapi.operations.pad import MIRROR_PAD_MODE, PADDINGS

_FAR = np.iinfo(np.int64).max
#: MIRROR_PAD's modes (NNAPI's values)
_REFLECT, _SYMMETRIC = 0, 1


def _reversed_slice(g: GraphBuilder, x: str, axis: int, start: int, stop: int) -> str:
    """x[start:stop] along ``axis``, backwards (elements stop - 1 down to start)."""
    below = -_FAR if start == 0 else start - 1  # (ONNX: an end before the first element)
    return g.one("Slice", [x, i64(g, stop - 1), i64(g, below), i64(g, axis), i64(g, -1)])


@lowers(OperationCode.MIRROR_PAD)
def lower_mirror_pad(g: GraphBuilder, operation: Operation) -> None:
    x = g.value(operation.inputs[0])
    output = g.operand(operation.outputs[0])
    check_same_quantization(x, output)
    paddings = g.raw_constant(operation.inputs[PADDINGS])
    if paddings is None:
        raise Declined("MIRROR_PAD's paddings must be a constant (they fix the output's shape)")
    mode = int(g.scalar(operation.inputs[MIRROR_PAD_MODE]))
    paddings = np.asarray(paddings, np.int64).reshape(-1, 2)
    dims = np.asarray(x.dims, np.int64)
    if mode not in (_REFLECT, _SYMMETRIC) or paddings.shape[0] != x.rank or np.any(paddings < 0) or \
            np.any(dims <= 0):
        raise Declined("MIRROR_PAD needs mode 0 or 1, non-negative [rank, 2] paddings and known, non-zero "
                       "dimensions")
    limit = dims[:, None] - (1 if mode == _REFLECT else 0)
    if np.any(paddings > limit):
        raise Declined(f"paddings {paddings.tolist()} are too large for shape {dims.tolist()}")
    if mode == _REFLECT:
        y = g.one("Pad", [x.name, i64(g, *paddings[:, 0], *paddings[:, 1])], mode="reflect")
    else:
        y = x.name
        for axis, (before, after) in enumerate(paddings.tolist()):
            if before == after == 0:
                continue
            size = int(dims[axis])
            parts = ([_reversed_slice(g, y, axis, 0, before)] if before else []) + [y] + \
                ([_reversed_slice(g, y, axis, size - after, size)] if after else [])
            y = g.one("Concat", parts, axis=axis)
    g.set_output(operation.outputs[0], keep_blocked(g, operation, y))


@lowers(OperationCode.PACK)
def lower_pack(g: GraphBuilder, operation: Operation) -> None:
    parts = [g.value(i) for i in operation.inputs[FIRST_INPUT:]]
    output = g.operand(operation.outputs[0])
    for part in parts:
        check_same_quantization(part, output)
    axis = normalize_axis(int(g.scalar(operation.inputs[AXIS])), parts[0].rank + 1)
    if axis is None:
        raise Declined("PACK's axis is out of range")
    dims = parts[0].dims
    if len(parts) > 1 and axis < len(dims) and dims and all(dims) and all(part.dims == dims for part in parts):
        # the parts one after the other along ``axis`` are the packed value's memory (part
        # k's block at k along the new axis): one Concat and a Reshape (a view) where an
        # Unsqueeze per part was a node each (an unrolled GRU's 24 steps: 25 -> 2 nodes)
        joined = g.one("Concat", [part.name for part in parts], axis=axis)
        shape = g.constant(np.array([*dims[:axis], len(parts), *dims[axis:]], np.int64))
        g.set_output(operation.outputs[0], g.one("Reshape", [joined, shape]))
        return
    where = i64(g, axis)
    unsqueezed = [g.one("Unsqueeze", [part.name, where]) for part in parts]
    g.set_output(operation.outputs[0], unsqueezed[0] if len(unsqueezed) == 1 else
                 g.one("Concat", unsqueezed, axis=axis))
