"""A float PRELU whose alpha is one constant value (TensorFlow Lite's LEAKY_RELU, which the
importer writes as PRELU with a constant slope), lowered to ONNX Runtime as LeakyRelu.

LeakyRelu gives PRELU's values exactly: x where x >= 0 (-0 and +inf included), alpha * x
rounded once below, NaN for NaN (onnxruntime 1.32 computes it as a select on x >= 0, fused
or not). It is one of the activations ORT fuses into the convolution before it (a FusedConv,
kept in its blocked NCHWc layout), where the general per-channel form costs three passes of
its own (relu(x) and two 1x1 depthwise scalings) and the Max / Mul form leaves the blocked
layout. Interleaved A/B of the two lowerings in ORT (median per run, one thread, load ~7):
openWakeWord's embedding_model (19 LEAKY_RELU of slope 0.2 after convolutions of 24 to 96
channels; the MAXIMUM after each still leaves the layout) 0.761 -> 0.717 ms, a darknet-style
stack at 256x256 (YOLO's conv + LEAKY_RELU 0.1 blocks) 4.38 -> 4.14 ms, a generated ESRGAN
10.80 -> 10.50 ms; outputs identical.

Only a finite alpha of known shape that broadcasts to the input without changing its shape
(each of its dimensions 1 or the input's, and 1 where the input's is known only at run
time, so no run can fail PRELU's broadcast); anything else keeps elementwise.py's forms. A
value computed with its channels padded to the NCHWc block (wants_padding) stays
padded: LeakyRelu keeps the padding zeros zero.
"""

from __future__ import annotations

import numpy as np

from nnapi.codes import OperationCode
from nnapi.drivers.ort.builder import (
    FLOATS,
    GraphBuilder,
    lowers,
)
from nnapi.drivers.ort.elementwise import lower_prelu
from nnapi.hal import Operation


def uniform_alpha(g: GraphBuilder, operation: Operation) -> float | None:
    """The one finite value of float PRELU ``operation``'s constant alpha, where its shape
    broadcasts to the input's without changing it; None otherwise."""
    if g.operand(operation.outputs[0]).type not in FLOATS:
        return None
    alpha = g.raw_constant(operation.inputs[1])
    if alpha is None or alpha.size == 0:
        return None
    values = alpha.astype(np.float32).reshape(-1)
    if not np.isfinite(values[0]) or not np.all(values == values[0]):
        return None
    x_dims = list(g.operand(operation.inputs[0]).dimensions)
    a_dims = list(g.operand(operation.inputs[1]).dimensions)
    if len(a_dims) > len(x_dims) or any(a != 1 and a != d for a, d in zip(a_dims[::-1], x_dims[::-1])):
        return None  # (d == 0, known only at run time: only an alpha dimension of 1 passes)
    return float(values[0])


@lowers(OperationCode.PRELU)
def lower_uniform_prelu(g: GraphBuilder, operation: Operation) -> None:
    """PRELU as LeakyRelu where ``uniform_alpha`` allows, elementwise.py's lower_prelu otherwise."""
    alpha = uniform_alpha(g, operation)
    if alpha is None:
        lower_prelu(g, operation)
        return
    source = operation.inputs[0]
    if source in g.padded:  # every reader of it takes the padded form, this one too
        x = g.blocked_value(source)
        g.set_channels(operation.outputs[0], g.one("LeakyRelu", [x.name], alpha=alpha), x.dims[3])
        return
    g.set_output(operation.outputs[0], g.one("LeakyRelu", [g.value(source).name], alpha=alpha))
