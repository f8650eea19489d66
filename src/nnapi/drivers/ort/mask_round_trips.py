"""Boolean masks that a graph turns into numbers and back, read as the booleans themselves.

Keras passes a padding / causal mask between layers as numbers: the TFLite file holds
SELECT(m, ones, zeros) (a cast of the bool mask to float), RESHAPEs of that, and
NOT_EQUAL(..., 0) where a layer wants the bool again (a causal MultiHeadAttention decoder
does so three times: ~14 of the ~30 nodes ORT runs, ~0.3-0.5 us each on [1, 16] masks).
NOT_EQUAL(v, 0) of such a v is m itself wherever SELECT's "true" constant holds no zero
(NaN is not equal to 0 either) and its "false" constant only zeros (+0 and -0 both equal
0), so the NOT_EQUAL lowers to a Reshape of m to its own shape (EQUAL(v, 0) to its Not;
SELECT(m, zeros, nonzeros) the other way round). The SELECT's value must have m's shape
(no constant broadcasting it), the views between be RESHAPEs or STRIDED_SLICEs of stride 1
keeping every dimension (the whole tensor), the compared constant zeros of a shape that
broadcasts into v's. Found on the HAL graph at preparation; the SELECT and the views stay
where anything else reads them, else they go unread and are dropped.
"""

from __future__ import annotations

import numpy as np

from nnapi.codes import OperandCode, OperationCode
from nnapi.hal import Model, OperandLifeTime, Operation, Subgraph
from nnapi.hal.types import constant_array

Op = OperationCode
L = OperandLifeTime
_NUMBERS = (OperandCode.TENSOR_FLOAT32, OperandCode.TENSOR_INT32)


def find_mask_round_trips(model: Model, subgraph: Subgraph) -> dict[int, tuple[int, bool]]:
    """Per EQUAL / NOT_EQUAL operation (by identity) that compares a boolean mask's numbers
    with 0: (the mask operand, whether the comparison's value is the mask itself rather
    than its negation)."""
    operands = subgraph.operands
    producers = {index: op for op in subgraph.operations for index in op.outputs}

    def constant(index: int, numbers: bool = True) -> np.ndarray | None:
        """A constant's value (``numbers``: only a float32 / int32 tensor's)."""
        operand = operands[index]
        if operand.lifetime not in (L.CONSTANT_COPY, L.CONSTANT_REFERENCE) or numbers and operand.type not in _NUMBERS:
            return None
        return constant_array(model, operand)

    def dims(index: int) -> tuple[int, ...]:
        return tuple(operands[index].dimensions)

    def whole(op: Operation) -> bool:
        """A STRIDED_SLICE of stride 1 that keeps every dimension (so the whole tensor)."""
        strides = constant(op.inputs[3], numbers=False)
        shrink = constant(op.inputs[6], numbers=False) if len(op.inputs) > 6 else np.zeros(1)
        # every size known: two open shapes compare equal whatever the run-time begin cuts
        return strides is not None and shrink is not None and bool(np.all(strides == 1)) and \
            not int(shrink.reshape(-1)[0]) and dims(op.inputs[0]) == dims(op.outputs[0]) and \
            all(dims(op.inputs[0]))

    found: dict[int, tuple[int, bool]] = {}
    for op in subgraph.operations:
        if op.type not in (Op.EQUAL, Op.NOT_EQUAL) or operands[op.outputs[0]].type != OperandCode.TENSOR_BOOL8:
            continue
        for value, zero in (op.inputs[:2], op.inputs[1::-1]):
            zeros = constant(zero)
            shape = dims(value)
            if zeros is None or zeros.any() or not shape or not all(shape) or dims(op.outputs[0]) != shape or \
                    operands[value].type not in _NUMBERS:
                continue
            index = value
            while (view := producers.get(index)) is not None and (
                    view.type == Op.RESHAPE or view.type == Op.STRIDED_SLICE and whole(view)):
                index = view.inputs[0]
            select = producers.get(index)
            if select is None or select.type != Op.SELECT or \
                    operands[select.inputs[0]].type != OperandCode.TENSOR_BOOL8:
                continue
            mask, when_true, when_false = select.inputs
            true_values, false_values = constant(when_true), constant(when_false)
            if true_values is None or false_values is None or dims(mask) != dims(index) or \
                    operands[index].type not in _NUMBERS or not all(dims(mask)):
                continue
            if np.all(true_values != 0) and not false_values.any():
                same = True
            elif np.all(false_values != 0) and not true_values.any():
                same = False
            else:
                continue
            # NOT_EQUAL(v, 0) is the mask where the true side is the non-zero one
            found[id(op)] = (mask, same == (op.type == Op.NOT_EQUAL))
            break
    return found
