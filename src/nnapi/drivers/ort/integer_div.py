"""DIV of TENSOR_INT32 on ONNX Runtime: NNAPI's integer division rounds toward negative
infinity (floor division; TFLite's FLOOR_DIV and FLOOR_MOD import as it, e.g. a pose
model's row = index // width), ONNX's integer Div truncates toward zero.

In int64: the floor remainder (ONNX Mod with fmod=0 takes the divisor's sign, as floor
division's remainder does) subtracted first makes the truncating Div exact, so
``(a - mod(a, b)) / b`` is floor(a / b). A divisor of 0 gives 0, as the reference device
(and Android) does, without dividing by it; int64 keeps INT32_MIN / -1 from trapping, and
the Cast back to int32 wraps it to INT32_MIN as C's int32 arithmetic does. A non-negative
value by a positive one (bounds value_ranges.py proves) is one int32 Div: truncation is
the floor there. Other types keep the element-wise lowering.
"""

from __future__ import annotations

import numpy as np
from onnx import TensorProto

from nnapi.codes import OperandCode, OperationCode
from nnapi.drivers.ort.builder import GraphBuilder, lowers
from nnapi.drivers.ort.elementwise import lower_binary
from nnapi.hal import Operation


@lowers(OperationCode.DIV)
def lower_div(g: GraphBuilder, operation: Operation) -> None:
    if g.operand(operation.outputs[0]).type != OperandCode.TENSOR_INT32:
        lower_binary(g, operation)
        return
    numerator, divisor = (g.ranges.get(i) for i in operation.inputs[:2])
    if numerator is not None and divisor is not None and numerator[0].min() >= 0 and divisor[0].min() > 0 \
            and int(g.scalar(operation.inputs[2])) == 0:
        # bounds value_ranges.py proves (a decode head's index // width): a non-negative
        # value by a positive one, where truncation is the floor, in int32, one node
        g.set_output(operation.outputs[0], g.one("Div", [g.value(i).name for i in operation.inputs[:2]]))
        return
    a, b = (g.one("Cast", [g.value(i).name], to=TensorProto.INT64) for i in operation.inputs[:2])
    zero = g.constant(np.array(0, np.int64))
    is_zero = g.one("Equal", [b, zero])
    divisor = g.one("Where", [is_zero, g.constant(np.array(1, np.int64)), b])
    remainder = g.one("Mod", [a, divisor], fmod=0)
    quotient = g.one("Div", [g.one("Sub", [a, remainder]), divisor])
    result = g.one("Where", [is_zero, zero, quotient])
    g.set_output(operation.outputs[0], g.one("Cast", [result], to=TensorProto.INT32))
