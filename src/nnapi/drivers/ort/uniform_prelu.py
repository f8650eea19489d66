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

A quantized PRELU of one alpha (an int8 / uint8 LEAKY_RELU) is first one or two
com.microsoft QLinearLeakyRelu tables whose float parameters leaky_tables.py searched to give
the reference's fixed point (Android's two quantized multipliers, which round twice where a
multiplier's exponent is negative: YOLO's LEAKY_RELU 0.1), with at most _CORRECTIONS values
set right by a Where, where a probe of all 256 stored values in ONNX Runtime proves them
(yolo_tiny_int8 through bench_ort, load ~7: 0.60 -> 0.25 ms, 4.05x -> 2.03x LiteRT). Elsewhere (an alpha <=
0, or of many steps) DequantizeLinear, LeakyRelu, QuantizeLinear at the model's scales,
which ORT fuses into QLinearLeakyRelu, a table of the float values rounded once (generated
ESRGAN int8, 11 LEAKY_RELU: 6.34 -> 5.34 ms in an interleaved A/B, load ~7), where that
probe shows it equals the reference; as for the other functions of one stored value,
elementwise.proven_or_table decides: where the form misses on a few values, each is set
right by a Where (4 of them after the LeakyRelu: 351 us per [1, 112, 112, 16] uint8 run
against 529 for the Gather, one thread, load ~1.7); elsewhere a Gather from the reference's
table.

A float32 LEAKY_RELU read only by a MAXIMUM (as its first input) with a negative constant c (openWakeWord's
embedding model floors each at -0.4) is lowered with it, where some t has alpha * t rounding
to exactly c, as relu(x) + (-alpha) * clip(-x, 0, -t) (_lower_clamped): three passes in the
blocked layout in place of the fused LeakyRelu, a ReorderOutput, a Slice of the padded
channels, the Max and a ReorderInput (embedding_model 0.826 -> 0.733 ms in an interleaved
A/B, load ~7, outputs identical).
"""

from __future__ import annotations

import numpy as np

from nnapi.codes import OperandCode, OperationCode
from nnapi.drivers.ort.builder import (
    FLOATS,
    QUANT8,
    GraphBuilder,
    Value,
    channel_scale,
    from_nchw,
    internal_zero_point,
    lowers,
    to_nchw,
)
from nnapi.drivers.ort.channel_padding import set_channels
from nnapi.drivers.ort.elementwise import (
    _CORRECTIONS,
    _MISSING,
    _corrected,
    _probe,
    _reference_table,
    _remember,
    lower_prelu,
    proven_or_table,
)
from nnapi.drivers.ort.leaky_tables import Table, emit_tables, leaky_tables
from nnapi.hal import Operation

T = OperandCode


def uniform_alpha(g: GraphBuilder, operation: Operation) -> float | None:
    """The one finite real value of PRELU ``operation``'s constant alpha (float, or 8-bit
    quantized: (q - zero point) * scale in float32, as DequantizeLinear computes it), where
    its shape broadcasts to the input's without changing it; None otherwise."""
    output = g.operand(operation.outputs[0]).type
    if output not in FLOATS and output not in QUANT8:
        return None
    alpha = g.raw_constant(operation.inputs[1])
    if alpha is None or alpha.size == 0:
        return None
    stored = alpha.reshape(-1)
    if not np.all(stored == stored[0]):
        return None
    operand = g.operand(operation.inputs[1])
    if output in QUANT8:
        value = np.float32(int(stored[0]) - operand.zero_point) * np.float32(operand.scale)
    else:
        value = np.float32(stored[0])
    if not np.isfinite(value):
        return None
    x_dims = list(g.operand(operation.inputs[0]).dimensions)
    a_dims = list(operand.dimensions)
    if len(a_dims) > len(x_dims) or any(a != 1 and a != d for a, d in zip(a_dims[::-1], x_dims[::-1])):
        return None  # (d == 0, known only at run time: only an alpha dimension of 1 passes)
    return float(value)


@lowers(OperationCode.PRELU)
def lower_uniform_prelu(g: GraphBuilder, operation: Operation) -> None:
    """PRELU as LeakyRelu where ``uniform_alpha`` allows, elementwise.py's lower_prelu otherwise."""
    alpha = uniform_alpha(g, operation)
    if alpha is None:
        lower_prelu(g, operation)
        return
    clamped = _clamping_maximum(g, operation, alpha)
    if clamped is not None:
        _lower_clamped(g, operation, clamped[0], alpha, clamped[1])
        return
    source = operation.inputs[0]
    output = g.operand(operation.outputs[0])
    if output.type in QUANT8:
        x = g.value(source)
        if x.kind != "uint8":
            lower_prelu(g, operation)  # declined
            return
        tables = _proven_tables(g, operation, x)
        if tables is not None:
            g.set_output(operation.outputs[0], tables)
            return
        start = len(g.nodes)
        leaky = g.quantize(g.one("LeakyRelu", [g.dequantize(x)], alpha=alpha), output)
        g.set_output(operation.outputs[0], proven_or_table(g, operation, source, start, leaky))
        return
    if source in g.padded:  # every reader of it takes the padded form, this one too
        x = g.blocked_value(source)
        set_channels(g, operation.outputs[0], g.one("LeakyRelu", [x.name], alpha=alpha), x.dims[3])
        return
    g.set_output(operation.outputs[0], g.one("LeakyRelu", [g.value(source).name], alpha=alpha))


#: the tables (leaky_tables.py) proven for a quantized PRELU (by elementwise's reference
#: table key), with the values they correct, or None where none were: a model prepared again,
#: or an operation repeated with the same quantizations, searches and probes once
_TABLES_PROVEN: dict[bytes, tuple[list[Table], np.ndarray] | None] = {}


def _proven_tables(g: GraphBuilder, operation: Operation, x: Value) -> str | None:
    """Quantized PRELU ``operation`` of one alpha as leaky_tables.py's QLinearLeakyRelu
    tables (with Where corrections of at most _CORRECTIONS values) where they give the
    reference's values on all 256 stored values in ONNX Runtime; None otherwise, nothing
    emitted (and for a support query, ``g.isolated``: the other forms answer it the same)."""
    if g.isolated:
        return None
    key, table = _reference_table(g, operation, operation.inputs[0])
    if table is None:
        return None
    found = _TABLES_PROVEN.get(key, _MISSING)  # one read: another thread may empty the cache
    start = len(g.nodes)
    if found is not _MISSING:
        if found is None:
            return None
        return _corrected(g, x.name, emit_tables(g, x.name, found[0]), found[1], table)
    source, alpha, output = (g.operand(i) for i in (operation.inputs[0], operation.inputs[1], operation.outputs[0]))
    step = int(g.raw_constant(operation.inputs[1]).reshape(-1)[0]) - alpha.zero_point
    found = leaky_tables(table, internal_zero_point(source), internal_zero_point(output), step,
                         source.scale, alpha.scale, output.scale, _CORRECTIONS)
    y = None
    if found is not None:
        y = _corrected(g, x.name, emit_tables(g, x.name, found[0]), found[1], table)
        probed = _probe(g, x.name, start, y)
        if probed is None or not np.array_equal(probed, table):
            del g.nodes[start:]
            found, y = None, None
    _remember(_TABLES_PROVEN, key, found)
    return y


def _clamping_maximum(g: GraphBuilder, operation: Operation, alpha: float) -> tuple[Operation, float] | None:
    """The MAXIMUM that alone reads PRELU ``operation``'s output, as its first input, with a
    constant c < 0 (a LEAKY_RELU whose output is floored at c: openWakeWord's embedding
    model, 0.2 and -0.4),
    and the input t below which alpha * x rounds to c or less: t = c / alpha where that
    product rounds to exactly c, so max(alpha * x, c) is alpha * max(x, t) for every x < 0
    (rounding is monotone). None where there is no such pair."""
    index = operation.outputs[0]
    readers = g.readers(index)
    dims = list(g.operand(index).dimensions)
    if g.operand(index).type != T.TENSOR_FLOAT32 or len(dims) != 4 or not dims[3]:
        return None  # (float16 rounds alpha * x to half precision: another threshold)
    if g.isolated or alpha <= 0 or len(readers) != 1 or index in g.subgraph.output_indexes:
        return None
    maximum = readers[0]
    if maximum.type != OperationCode.MAXIMUM or list(maximum.inputs).count(index) != 1 or maximum.inputs[0] != index:
        return None  # MAXIMUM(c, NaN) is c (Android's std::max keeps its first input), not NaN
    other = maximum.inputs[1]
    known = g.raw_constant(other)
    output = g.operand(maximum.outputs[0])
    if (known is None or known.size != 1 or output.type != g.operand(index).type
            or list(output.dimensions) != list(g.operand(index).dimensions)):
        return None
    c = np.float32(known.reshape(-1)[0])
    if not np.isfinite(c) or c >= 0:
        return None
    slope = np.float32(alpha)
    with np.errstate(over="ignore", under="ignore"):
        t = c / slope
        if not np.isfinite(t) or slope * t != c:
            return None
    return maximum, float(t)


def _lower_clamped(g: GraphBuilder, operation: Operation, maximum: Operation, alpha: float, t: float) -> None:
    """MAXIMUM(PRELU(x, alpha), c) as relu(x) + (-alpha) * clip(-x, 0, -t): the three passes of
    the general per-channel form, all in ORT's blocked layout (the clip fused into the
    negation's 1x1 depthwise convolution), in place of LeakyRelu and a Max that leaves it (a
    reorder pair, and a Slice where the channels are padded). Where x >= 0 the second term
    is zero and x is PRELU's value, above c; below, -alpha * min(-x, -t) is alpha * max(x, t)
    rounded once: alpha * x where that is above c, else alpha * t = c."""
    source = operation.inputs[0]
    x = g.blocked_value(source)
    channels = x.dims[3]
    nchw = to_nchw(g, x.name, False)
    negated = channel_scale(g, nchw, -np.ones(channels, np.float32))
    low, high = (g.constant(np.array(v, np.float32)) for v in (0.0, -t))
    floored = g.one("Clip", [negated, low, high])
    y = g.one("Add", [channel_scale(g, floored, np.full(channels, -alpha, np.float32)), g.one("Relu", [nchw])])
    y = from_nchw(g, y, False)
    if source in g.padded:
        set_channels(g, maximum.outputs[0], y, channels)
    else:
        g.set_output(maximum.outputs[0], y)
    g.covered.add(id(maximum))
