"""Twin branches run side by side: a HAL rewrite before lowering to ONNX.

Multi-head models (MediaPipe's iris_landmark: the iris and the eye-contour heads) end in
two branches of the same operations on the same shapes with different weights. At their
small sizes (8x8 down to 2x2) ONNX Runtime spends most of each operator's time on the
operator itself, not on the arithmetic, so two branches cost twice one. Here each pair of
twin operations becomes one operation on the two values side by side along the channels
(a *merged* value: the first branch's channels, then the second's):

- the first two CONV_2Ds that read one value with filters of one shape: one CONV_2D with
  the filters (and biases) one after the other;
- CONV_2D on merged values: GROUPED_CONV_2D with two groups;
- DEPTHWISE_CONV_2D, PRELU: the filters / biases / alphas one after the other;
- ADD of merged values (a value both read is put side by side with itself: CONCATENATION);
- MAX_POOL_2D / AVERAGE_POOL_2D: the same parameters.

Every output channel is computed from the same inputs and weights as before (a group
sees only its own branch), so the values are the unmerged ones (to the order of a
convolution's sums). Wherever a branch's value is read by anything not merged (or is a
model output), a SPLIT gives it back. Only float32 NHWC values with channel counts that
are multiples of the NCHWc block are merged (the form ORT keeps blocked), and only where
at least MIN_MERGED operations merge with few SPLITs back (MAX_SPLITS_PER_PAIR).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from nnapi.codes import OperandCode, OperationCode
from nnapi.drivers.ort.hal_rewrite import CONSTANTS, HalRewriter
from nnapi.hal import Model, OperandLifeTime, Operation

T = OperandCode
L = OperandLifeTime
Op = OperationCode
#: fewer merged operations than this are not worth the SPLITs back
MIN_MERGED = 8
#: more SPLITs back than this per merged pair: the branches hardly run side by side
MAX_SPLITS_PER_PAIR = 0.25
#: per operation type: the positions of data inputs; the others are weights or parameters
_DATA_POSITIONS = {Op.CONV_2D: (0,), Op.DEPTHWISE_CONV_2D: (0,), Op.PRELU: (0,), Op.ADD: (0, 1),
                   Op.MAX_POOL_2D: (0,), Op.AVERAGE_POOL_2D: (0,)}


@dataclass
class _Merged:
    """A merged value: operand ``index`` holding ``halves`` side by side along channels."""

    index: int
    halves: tuple[int, int]


class _Rewriter(HalRewriter):
    def __init__(self, model: Model) -> None:
        super().__init__(model)
        self.merged: dict[int, _Merged] = {}  # by either half's index

    # --- pairing -----------------------------------------------------------------------
    def pair_kind(self, first: Operation, second: Operation) -> str | None:
        """How two operations merge: "shared" (CONV_2Ds reading one value), "merged" (all
        data inputs halves of merged values or one value both read), or None."""
        code = first.type
        if code != second.type or code not in _DATA_POSITIONS or len(first.inputs) != len(second.inputs):
            return None
        if len(first.outputs) != 1 or len(second.outputs) != 1:
            return None
        out_a, out_b = (self.operands[o] for o in (first.outputs[0], second.outputs[0]))
        if out_a.dimensions != out_b.dimensions or not self.blocked_float(first.outputs[0]):
            return None
        data = _DATA_POSITIONS[code]
        kinds = []
        for position, (a, b) in enumerate(zip(first.inputs, second.inputs, strict=True)):
            operand_a, operand_b = self.operands[a], self.operands[b]
            if position in data:
                if not self.blocked_float(a) or operand_a.dimensions != operand_b.dimensions:
                    return None
                pair = self.merged.get(a)
                if pair is not None and pair.halves == (a, b):
                    kinds.append("merged")
                elif a == b:
                    kinds.append("shared")
                else:
                    return None
                continue
            if operand_a.type != operand_b.type or operand_a.dimensions != operand_b.dimensions:
                return None
            if operand_a.lifetime not in CONSTANTS or operand_b.lifetime not in CONSTANTS:
                return None
            if not operand_a.dimensions and not np.array_equal(self.array(a), self.array(b)):
                return None  # a parameter: the same value
        if not self.params_allow(first):
            return None
        if "merged" in kinds:
            return "merged"
        if code == Op.CONV_2D and kinds == ["shared"]:
            return "shared"
        return None

    def params_allow(self, operation: Operation) -> bool:
        """NHWC, no dilation, depth multiplier 1, alpha per channel (or one for all)."""
        code, inputs = operation.type, operation.inputs
        scalars = [self.array(i) for i in inputs[3:]] if code in (Op.CONV_2D, Op.DEPTHWISE_CONV_2D) else []
        if code == Op.CONV_2D:
            explicit = self.explicit_conv(inputs)
            tail = scalars[7:] if explicit else scalars[4:]  # layout, dilations
            return all(s is not None for s in scalars) and (not tail or not bool(tail[0])) and all(
                int(s) == 1 for s in tail[1:])
        if code == Op.DEPTHWISE_CONV_2D:
            explicit = len(inputs) in (11, 12, 14) and not (len(inputs) == 11 and self.is_bool(inputs[8]))
            multiplier = scalars[6] if explicit else scalars[3]
            tail = scalars[8:] if explicit else scalars[5:]
            return all(s is not None for s in scalars) and int(multiplier) == 1 and (
                not tail or not bool(tail[0])) and all(int(s) == 1 for s in tail[1:])
        if code == Op.PRELU:
            alpha = self.array(inputs[1])
            channels = self.operands[inputs[0]].dimensions[3]
            return (alpha is not None and all(d == 1 for d in alpha.shape[:-1])
                    and alpha.shape[-1:] in ((), (1,), (channels,)))
        if code in (Op.MAX_POOL_2D, Op.AVERAGE_POOL_2D):
            layout = 10 if len(inputs) in (10, 11) else 7
            return len(inputs) <= layout or not bool(self.array(inputs[layout]))
        return True  # ADD (same shapes: checked with the data inputs)

    def is_bool(self, index: int) -> bool:
        return self.operands[index].type == T.BOOL

    def explicit_conv(self, inputs: list[int]) -> bool:
        """CONV_2D's explicit-padding form (as the lowering's conv_params tells them apart)."""
        return len(inputs) in (10, 11, 13) and not (len(inputs) == 10 and self.is_bool(inputs[7]))

    # --- merged operations -------------------------------------------------------------
    def side_by_side(self, first: int, second: int, axis: int) -> int:
        arrays = [self.array(first), self.array(second)]
        return self.constant(np.concatenate(arrays, axis=axis), self.operands[first].type)

    def merged_input(self, a: int, b: int, emitted: list[Operation]) -> int:
        pair = self.merged.get(a)
        if pair is not None and pair.halves == (a, b):
            return pair.index
        # a value both read: itself twice, side by side
        channels = self.operands[a].dimensions[3]
        index = self.temporary(a, 2 * channels)
        emitted.append(Operation(Op.CONCATENATION, [a, a, self.constant(np.array(3), T.INT32)], [index]))
        return index

    def merge(self, first: Operation, second: Operation, kind: str, emitted: list[Operation]) -> int:
        code, a, b = first.type, first.inputs, second.inputs
        out = first.outputs[0]
        channels = self.operands[out].dimensions[3]
        merged_out = self.temporary(out, 2 * channels)
        if code == Op.CONV_2D:
            weights = self.side_by_side(a[1], b[1], 0)
            bias = self.side_by_side(a[2], b[2], 0)
            if kind == "shared":
                inputs = [a[0], weights, bias, *a[3:]]
                emitted.append(Operation(Op.CONV_2D, inputs, [merged_out]))
            else:
                explicit = self.explicit_conv(a)
                padding = a[3:9] if explicit else a[3:6]
                fuse = a[9] if explicit else a[6]
                source = self.merged_input(a[0], b[0], emitted)
                inputs = [source, weights, bias, *padding, self.constant(np.array(2), T.INT32), fuse,
                          self.constant(np.array(False), T.BOOL)]
                emitted.append(Operation(Op.GROUPED_CONV_2D, inputs, [merged_out]))
        elif code == Op.DEPTHWISE_CONV_2D:
            source = self.merged_input(a[0], b[0], emitted)
            inputs = [source, self.side_by_side(a[1], b[1], 3), self.side_by_side(a[2], b[2], 0), *a[3:]]
            emitted.append(Operation(code, inputs, [merged_out]))
        elif code == Op.PRELU:
            source = self.merged_input(a[0], b[0], emitted)
            alphas = [np.broadcast_to(self.array(i).reshape(-1), (channels,)) for i in (a[1], b[1])]
            alpha = self.constant(np.concatenate(alphas).reshape(1, 1, 2 * channels), T.TENSOR_FLOAT32)
            emitted.append(Operation(code, [source, alpha], [merged_out]))
        elif code == Op.ADD:
            left = self.merged_input(a[0], b[0], emitted)
            right = self.merged_input(a[1], b[1], emitted)
            emitted.append(Operation(code, [left, right, a[2]], [merged_out]))
        else:  # pooling
            emitted.append(Operation(code, [self.merged_input(a[0], b[0], emitted), *a[1:]], [merged_out]))
        pair = _Merged(merged_out, (first.outputs[0], second.outputs[0]))
        self.merged[first.outputs[0]] = self.merged[second.outputs[0]] = pair
        return merged_out

    def run(self) -> Model | None:
        operations = self.subgraph.operations
        partner: dict[int, int] = {}  # first operation's position -> its twin's
        taken: set[int] = set()
        kinds: dict[int, str] = {}
        # pairing, in order: a twin reads the other halves of the values its first reads
        for position, operation in enumerate(operations):
            if position in taken or operation.type not in _DATA_POSITIONS:
                continue
            candidates: list[int] = []
            for data in _DATA_POSITIONS[operation.type]:
                if data >= len(operation.inputs):
                    continue
                index = operation.inputs[data]
                pair = self.merged.get(index)
                other = pair.halves[1] if pair is not None and pair.halves[0] == index else index
                candidates += [c for c in self.readers.get(other, []) if c > position and c not in taken]
            for candidate in sorted(set(candidates)):
                kind = self.pair_kind(operation, operations[candidate])
                if kind is not None:
                    partner[position], kinds[position] = candidate, kind
                    taken.update((position, candidate))
                    # record the merged value now so that later pairs can read it
                    self.merged[operation.outputs[0]] = self.merged[operations[candidate].outputs[0]] = _Merged(
                        -1, (operation.outputs[0], operations[candidate].outputs[0]))
                    break
        merged_ops = {p for pair in partner.items() for p in pair}
        splits = sum(any(self.read_outside(out, merged_ops) for out in (operations[p].outputs[0],
                                                                          operations[q].outputs[0]))
                     for p, q in partner.items())
        if 2 * len(partner) < MIN_MERGED or MAX_SPLITS_PER_PAIR * len(partner) < splits:
            return None
        self.merged.clear()
        emitted: list[Operation] = []
        for position, operation in enumerate(operations):
            if position in partner:
                twin = operations[partner[position]]
                merged_out = self.merge(operation, twin, kinds[position], emitted)
                halves = (operation.outputs[0], twin.outputs[0])
                if any(self.read_outside(half, merged_ops) for half in halves):
                    emitted.append(Operation(Op.SPLIT, [merged_out, self.constant(np.array(3), T.INT32),
                                                        self.constant(np.array(2), T.INT32)], list(halves)))
            elif position not in merged_ops:
                emitted.append(operation)
        return self.rewritten(emitted)

    def read_outside(self, index: int, merged_ops: set[int]) -> bool:
        return index in self.subgraph.output_indexes or any(
            c not in merged_ops for c in self.readers.get(index, []))


def merge_twin_branches(model: Model) -> Model:
    """``model`` with its main subgraph's twin branches merged (see the module's text), or
    ``model`` itself where there are none worth merging."""
    return _Rewriter(model).run() or model
