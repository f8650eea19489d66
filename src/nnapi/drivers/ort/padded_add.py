"""A residual ADD of a channel-padded value, computed in two halves: a HAL rewrite before
lowering to ONNX.

MediaPipe's BlazeBlocks widen their skip connection with a PAD of zero channels at the end
(iris_landmark 64 -> 128, face_landmark 16 -> 32 -> 64 -> 128) and add it to a
convolution's output. ONNX Runtime has no blocked (NCHWc) Pad: the value leaves the
layout, is padded and comes back, about three passes and three operators. Here

    ADD(CONV_2D(x), PAD(m))  ->  CONCATENATION(ADD(CONV_2D_low(x), m), CONV_2D_high(x))

the convolution split by output channels (the filters and biases of the channels m covers,
then the rest), so the ADD needs no padding and the concatenation along channels stays
blocked. The padded channels' sums are the convolution's own (+ 0 dropped; the ADD's fused
activation goes onto the upper half's convolution). Only float32 NHWC values whose channel
counts are multiples of the NCHWc block, a constant PAD of zeros after the channels only,
and a convolution read by that ADD alone without a fused activation of its own.
"""

from __future__ import annotations

import numpy as np

from nnapi.codes import FuseCode, OperandCode, OperationCode
from nnapi.drivers.ort.hal_rewrite import HalRewriter
from nnapi.hal import Model, OperandLifeTime, Operation

T = OperandCode
L = OperandLifeTime
Op = OperationCode


class _Rewriter(HalRewriter):
    def channel_pad(self, index: int) -> int | None:
        """The value PAD widens into operand ``index`` with zero channels at the end."""
        position = self.producer.get(index)
        if position is None:
            return None
        pad = self.subgraph.operations[position]
        if pad.type not in (Op.PAD, Op.PAD_V2) or not self.blocked_float(pad.inputs[0]):
            return None
        paddings = self.array(pad.inputs[1])
        if paddings is None or paddings.shape != (4, 2) or paddings[:3].any() or paddings[3, 0] != 0:
            return None
        if pad.type == Op.PAD_V2 and self.array(pad.inputs[2]) != 0:
            return None
        return pad.inputs[0]

    def plain_conv(self, index: int, add_position: int) -> int | None:
        """The position of the CONV_2D writing ``index`` for this ADD alone, NHWC, no fused activation."""
        position = self.producer.get(index)
        if position is None or self.readers.get(index) != [add_position] or index in self.subgraph.output_indexes:
            return None
        conv = self.subgraph.operations[position]
        if conv.type != Op.CONV_2D or self.array(conv.inputs[1]) is None or self.array(conv.inputs[2]) is None:
            return None
        inputs = conv.inputs
        explicit = len(inputs) in (10, 11, 13) and not (len(inputs) == 10 and self.operands[inputs[7]].type == T.BOOL)
        fuse = self.array(inputs[9 if explicit else 6])
        layout = self.array(inputs[10 if explicit else 7]) if len(inputs) > (10 if explicit else 7) else False
        if fuse is None or int(fuse) != FuseCode.FUSED_NONE or layout is None or bool(layout):
            return None
        return position

    def run(self) -> Model | None:
        operations = self.subgraph.operations
        replaced: dict[int, list[Operation]] = {}  # position -> operations in its place
        for position, add in enumerate(operations):
            if add.type != Op.ADD or not self.blocked_float(add.outputs[0]):
                continue
            for side in (0, 1):
                padded, other = add.inputs[side], add.inputs[1 - side]
                source = self.channel_pad(padded)
                conv_position = self.plain_conv(other, position) if source is not None else None
                if conv_position is None or conv_position in replaced or position in replaced:
                    continue
                if self.operands[padded].dimensions != self.operands[other].dimensions:
                    continue
                self.split(add, side, source, conv_position, position, replaced)
                break
        if not replaced:
            return None
        emitted = self.replacing(replaced)
        # a PAD no longer read goes too
        read = {index for operation in emitted for index in operation.inputs} | set(self.subgraph.output_indexes)
        emitted = [op for op in emitted if op.type not in (Op.PAD, Op.PAD_V2) or op.outputs[0] in read]
        return self.rewritten(emitted)

    def split(self, add: Operation, side: int, source: int, conv_position: int, position: int,
              replaced: dict[int, list[Operation]]) -> None:
        conv = self.subgraph.operations[conv_position]
        inputs = conv.inputs
        low = self.operands[source].dimensions[3]
        channels = self.operands[add.outputs[0]].dimensions[3]
        weights, bias = self.array(inputs[1]), self.array(inputs[2])
        explicit = len(inputs) in (10, 11, 13) and not (len(inputs) == 10 and self.operands[inputs[7]].type == T.BOOL)
        fuse_position = 9 if explicit else 6
        halves = []
        for start, stop in ((0, low), (low, channels)):
            part = list(inputs)
            part[1] = self.constant(weights[start:stop], T.TENSOR_FLOAT32)
            part[2] = self.constant(bias[start:stop], T.TENSOR_FLOAT32)
            if start:  # the ADD's fused activation on the upper half (its + 0 dropped)
                part[fuse_position] = add.inputs[2]
            halves.append((part, self.temporary(add.outputs[0], stop - start)))
        (low_inputs, low_out), (high_inputs, high_out) = halves
        total = self.temporary(add.outputs[0], low)
        added_inputs = [low_out, source, add.inputs[2]] if side == 1 else [source, low_out, add.inputs[2]]
        replaced[conv_position] = [Operation(Op.CONV_2D, low_inputs, [low_out]),
                                   Operation(Op.CONV_2D, high_inputs, [high_out])]
        replaced[position] = [Operation(Op.ADD, added_inputs, [total]),
                              Operation(Op.CONCATENATION, [total, high_out, self.constant(np.array(3), T.INT32)],
                                        [add.outputs[0]])]


def split_padded_adds(model: Model) -> Model:
    """``model`` with its main subgraph's ADDs of channel-padded values split (see the
    module's text), or ``model`` itself where there are none."""
    return _Rewriter(model).run() or model
