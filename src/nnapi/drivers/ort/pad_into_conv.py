"""A PAD of zeros before a convolution folded into the convolution's own padding: a HAL
rewrite before lowering to ONNX.

Keras writes spatial padding as its own operation where a convolution's SAME padding does
not fit: a causal Conv1D (PAD of kernel - 1 steps in front, then RESHAPE to [N, 1, T, C] and
a VALID CONV_2D), ZeroPadding2D before a stride-2 layer (ResNet's stem, MobileNetV2's and
EfficientNet's downsampling depthwise layers). ONNX Runtime runs each Pad as a node of its
own, and a float one outside its blocked (NCHWc) layout: the value leaves the layout, is
padded and comes back (a ReorderOutput, the Pad and a ReorderInput per layer on a float
audio Conv1D stack). Here

    CONV_2D(PAD(x))                 ->  CONV_2D(x) with the PAD's sides added to its pads
    CONV_2D(RESHAPE(PAD(x)))        ->  CONV_2D(RESHAPE(x)), likewise (a Conv1D's [N, T, C]
                                        padded along T, reshaped to [N, 1, T', C])

(also DEPTHWISE_CONV_2D). The same products are summed: a convolution's padding reads as
what this PAD writes, zero in float, the zero point (no contribution: q - zero point) in a
quantized one. Only NHWC layers, a PAD of constant non-negative paddings on the height /
width (time) axes alone, of zero (PAD_V2: a value of exactly +0.0 in float, the zero point
when quantized, with the input's quantization), every value read by the next step alone,
explicit or VALID padding on the convolution, and a float filter of finite values (a
padded zero times an infinite weight is NaN in both forms, but the rewrite does not lean on
it).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from nnapi.codes import OperandCode, OperationCode
from nnapi.drivers.ort.hal_rewrite import CONSTANTS, HalRewriter
from nnapi.hal import Model, OperandLifeTime, Operation

T = OperandCode
L = OperandLifeTime
Op = OperationCode

_QUANT8 = (T.TENSOR_QUANT8_ASYMM, T.TENSOR_QUANT8_ASYMM_SIGNED)
_TYPES = (T.TENSOR_FLOAT32, *_QUANT8)
#: the scheme code of VALID implicit padding
_VALID = 2


class _Rewriter(HalRewriter):
    def scalar(self, index: int) -> int | float | None:
        value = self.array(index)
        return None if value is None or value.size != 1 else value.reshape(-1)[0].item()

    def only_reader(self, index: int, position: int) -> bool:
        """Operand ``index`` is a temporary read by the operation at ``position`` alone."""
        return (self.readers.get(index) == [position] and index not in self.subgraph.output_indexes
                and self.operands[index].lifetime == L.TEMPORARY_VARIABLE)

    def conv_pads(self, conv: Operation) -> tuple[list[int], bool] | None:
        """The convolution's [left, right, top, bottom] and whether they are explicit
        inputs (else VALID); None for SAME, NCHW or a parameter given at run time."""
        inputs = conv.inputs
        shift = 1 if conv.type == Op.DEPTHWISE_CONV_2D else 0
        explicit_lengths = (11, 12, 14) if shift else (10, 11, 13)
        n = len(inputs)
        explicit = n in explicit_lengths and not (n == explicit_lengths[0]
                                                  and self.operands[inputs[7 + shift]].type == T.BOOL)
        layout_at = (10 if explicit else 7) + shift
        scalars = [self.scalar(i) for i in inputs[3:]]
        if any(value is None for value in scalars) or (n > layout_at and bool(scalars[layout_at - 3])):
            return None
        if explicit:
            return [int(v) for v in scalars[:4]], True
        return ([0, 0, 0, 0], False) if int(scalars[0]) == _VALID else None

    def zero_pad(self, pad: Operation, source: int) -> bool:
        """``pad`` writes zeros: float +0.0, the zero point of a quantized value of the
        input's quantization."""
        operand, output = self.operands[source], self.operands[pad.outputs[0]]
        if operand.type not in _TYPES or output.type != operand.type:
            return False
        quantized = operand.type in _QUANT8
        if quantized and (operand.scale, operand.zero_point) != (output.scale, output.zero_point):
            return False
        if pad.type == Op.PAD:
            return True
        if pad.type != Op.PAD_V2 or len(pad.inputs) != 3:
            return False
        value = self.scalar(pad.inputs[2])
        if value is None:
            return False
        return value == operand.zero_point if quantized else (value == 0 and not np.signbit(value))

    def padded_source(self, conv_position: int) -> tuple[int, int, list[int], list[int]] | None:
        """(the PAD's input, the PAD's position, its [left, right, top, bottom] in the
        convolution's axes, the RESHAPE's output dimensions or []) for the convolution at
        ``conv_position``; None where the pattern does not hold."""
        x = self.subgraph.operations[conv_position].inputs[0]
        if not self.only_reader(x, conv_position) or x not in self.producer:
            return None
        step = self.subgraph.operations[self.producer[x]]
        reshaped: list[int] = []
        if step.type == Op.RESHAPE:
            before, after = self.operands[step.inputs[0]].dimensions, self.operands[x].dimensions
            if (len(before) != 3 or len(after) != 4 or not all(before) or after != [before[0], 1, *before[1:]]
                    or not self.only_reader(step.inputs[0], self.producer[x]) or step.inputs[0] not in self.producer):
                return None
            reshaped = after
            x = step.inputs[0]
            step = self.subgraph.operations[self.producer[x]]
        if step.type not in (Op.PAD, Op.PAD_V2):
            return None
        source = step.inputs[0]
        dims = self.operands[source].dimensions
        paddings = self.array(step.inputs[1])
        rank = 3 if reshaped else 4
        if (paddings is None or paddings.shape != (rank, 2) or len(dims) != rank or not all(dims)
                or self.operands[source].lifetime in CONSTANTS or (paddings < 0).any()
                or paddings[0].any() or paddings[rank - 1].any() or not self.zero_pad(step, source)):
            return None
        if reshaped:
            sides = [int(paddings[1, 0]), int(paddings[1, 1]), 0, 0]
            reshaped = [dims[0], 1, *dims[1:]]
        else:
            sides = [int(paddings[2, 0]), int(paddings[2, 1]), int(paddings[1, 0]), int(paddings[1, 1])]
        return source, self.producer[x], sides, reshaped

    def run(self) -> Model | None:
        operations = self.subgraph.operations
        replaced: dict[int, list[Operation]] = {}
        dropped: set[int] = set()
        for position, conv in enumerate(operations):
            if conv.type not in (Op.CONV_2D, Op.DEPTHWISE_CONV_2D) or len(conv.inputs) < 7:
                continue
            pads = self.conv_pads(conv)
            found = self.padded_source(position) if pads is not None else None
            if found is None:
                continue
            if self.operands[conv.inputs[0]].type == T.TENSOR_FLOAT32:
                weights = self.array(conv.inputs[1])
                if weights is None or not np.isfinite(weights).all():
                    continue
            (own, explicit), (source, pad_position, sides, reshaped) = pads, found
            inputs = list(conv.inputs)
            emitted = []
            if reshaped:
                original = self.operands[inputs[0]]
                self.operands.append(dataclasses.replace(original, dimensions=reshaped, number_of_consumers=1))
                unpadded = len(self.operands) - 1
                shape = self.constant(np.array(reshaped, np.int32), T.TENSOR_INT32)
                emitted.append(Operation(Op.RESHAPE, [source, shape], [unpadded]))
                source = unpadded
            total = [self.constant(np.array(a + b), T.INT32) for a, b in zip(own, sides, strict=True)]
            inputs = [source, *inputs[1:3], *total, *inputs[(7 if explicit else 4):]]
            emitted.append(Operation(conv.type, inputs, list(conv.outputs)))
            replaced[position] = emitted
            dropped.add(pad_position)
            if reshaped:
                dropped.add(self.producer[conv.inputs[0]])
        if not replaced:
            return None
        return self.rewritten(self.replacing({**replaced, **{position: [] for position in dropped}}))


def fold_pads_into_convs(model: Model) -> Model:
    """``model`` with its main subgraph's zero PADs before convolutions folded into their
    padding (see the module's text), or ``model`` itself where there are none."""
    return _Rewriter(model).run() or model
