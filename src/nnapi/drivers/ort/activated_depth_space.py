"""A float32 activation read from a DEPTH_TO_SPACE of a convolution's output, run before the
DEPTH_TO_SPACE: a HAL rewrite before lowering to ONNX.

    ACT(DEPTH_TO_SPACE(CONV_2D(x)))  ->  DEPTH_TO_SPACE(ACT(CONV_2D(x)))

DEPTH_TO_SPACE only moves values, and RELU / RELU1 / RELU6 and a PRELU of one constant
alpha compute each value from itself alone, so both orders give the same values bit for
bit. Run first, the activation is one ORT fuses into the convolution (its blocked NCHWc
FusedConv), where after the move it is a pass of its own over the enlarged image: a
super-resolution network's sub-pixel upsampling (CONV_2D to 4C channels, DEPTH_TO_SPACE 2,
LEAKY_RELU; ESRGAN's two: 37 us of a 1.3 ms ORT run). Only where the convolution's output is
read by the DEPTH_TO_SPACE alone (else ORT does not fuse) and the DEPTH_TO_SPACE's by the
activation alone (neither is a model output), of float32 values, and for PRELU an alpha of
one finite value (uniform_prelu's LeakyRelu; a per-channel alpha would not fuse).
"""

from __future__ import annotations

import numpy as np

from nnapi.codes import OperandCode, OperationCode
from nnapi.drivers.ort.hal_rewrite import HalRewriter
from nnapi.hal import Model, Operand, OperandLifeTime, Operation

T = OperandCode
Op = OperationCode
_ACTIVATIONS = (Op.RELU, Op.RELU1, Op.RELU6, Op.PRELU)
_CONVOLUTIONS = (Op.CONV_2D, Op.DEPTHWISE_CONV_2D, Op.GROUPED_CONV_2D)


class _Rewriter(HalRewriter):
    def only_reader(self, index: int) -> int | None:
        """The position of the one operation reading ``index`` once, where it is not a
        model output."""
        readers = self.readers.get(index, [])
        if len(readers) != 1 or index in self.subgraph.output_indexes:
            return None
        if list(self.subgraph.operations[readers[0]].inputs).count(index) != 1:
            return None
        return readers[0]

    def movable(self, activation: Operation) -> bool:
        """Whether ``activation`` computes each float32 value from itself alone: a RELU
        family operation, or a PRELU of one finite constant alpha (written as a new alpha
        of shape [1], which broadcasts to any shape)."""
        if self.operands[activation.inputs[0]].type != T.TENSOR_FLOAT32:
            return False
        if activation.type != Op.PRELU:
            return True
        alpha = self.array(activation.inputs[1])
        if alpha is None or alpha.size == 0 or self.operands[activation.inputs[1]].type != T.TENSOR_FLOAT32:
            return False
        flat = alpha.reshape(-1)
        return bool(np.isfinite(flat[0]) and np.all(flat == flat[0]))

    def run(self) -> Model | None:
        operations = self.subgraph.operations
        replaced: dict[int, list[Operation]] = {}  # position -> operations in its place
        for position, move in enumerate(operations):
            if move.type != Op.DEPTH_TO_SPACE:
                continue
            source, moved = move.inputs[0], move.outputs[0]
            producer = self.producer.get(source)
            if (producer is None or operations[producer].type not in _CONVOLUTIONS
                    or self.only_reader(source) != position):
                continue
            act_position = self.only_reader(moved)
            if act_position is None:
                continue
            activation = operations[act_position]
            if activation.type not in _ACTIVATIONS or activation.inputs[0] != moved or not self.movable(activation):
                continue
            x = self.operands[source]
            if not x.dimensions or not all(x.dimensions):
                continue
            self.operands.append(Operand(x.type, list(x.dimensions), x.scale, x.zero_point,
                                         OperandLifeTime.TEMPORARY_VARIABLE, number_of_consumers=1))
            activated = len(self.operands) - 1
            parameters = list(activation.inputs[1:])
            if activation.type == Op.PRELU:
                parameters = [self.constant(self.array(activation.inputs[1]).reshape(-1)[:1], T.TENSOR_FLOAT32)]
            replaced[position] = [Operation(activation.type, [source, *parameters], [activated]),
                                  Operation(Op.DEPTH_TO_SPACE, [activated, *move.inputs[1:]], list(activation.outputs))]
            replaced[act_position] = []
        if not replaced:
            return None
        return self.rewritten(self.replacing(replaced))


def activate_before_depth_to_space(model: Model) -> Model:
    """``model`` with each float32 activation of a convolution's DEPTH_TO_SPACE run before the
    DEPTH_TO_SPACE (see the module's text), or ``model`` itself where there is none."""
    return _Rewriter(model).run() or model
