"""Size-1 constants of broadcasting operators widened to two dimensions where the tensor
they meet ends in a dimension of 1 (a grayscale image, a mask, a [N, 1] score): a pass over
the lowered ONNX graph.

ONNX Runtime's CPU broadcasting (onnxruntime 1.32, one thread) runs a binary operator of a
rank-0 or rank-1 size-1 constant and a tensor whose last dimension is 1 one element per
inner loop: Add of a scalar to [1, 256, 256, 1] 378 us, to [1, 84, 84, 1] 44 us, where the
same constant shaped [1, 1] takes 7.3 and 3.9 us; Max, Min, Greater, Equal, Where and PRelu
likewise 15-25x (Pow 3x). A microcontroller model's QUANTIZE of its [?, 84, 84, 1] input
(quantize_half_away's Div and Add of scalars) cost ~90 us of its ~180. The widened constant
changes no value and no output shape: it broadcasts to the other input's rank either way,
which is at least 2 wherever it is widened.

Likewise a constant whose elements run along only the last few dimensions of the tensor it
meets (an image normalization's per-channel [1, 1, 1, 3] mean and scale, a [1, 1, 9] column
factor): ORT's broadcasting calls its kernel once per run of those few elements, so such a
constant is spread over the tensor's trailing dimensions until one run holds INNER_SPAN
elements (spread_inner_constants): [1, 96, 96, 3] minus a float [1, 1, 1, 3] 73 -> 6 us,
QLinearMul of it 182 -> 8.4 us, Add of [1, 1, 1, 8] to [1, 48, 48, 8] 18.7 -> 5.0 us, a
[1, 1, 1, 64] factor over [1, 12, 12, 64] 5.3 -> 4.5 us (onnxruntime 1.32, one thread). Every
element meets the very constant value it met before: the same values, the same shapes.
"""

from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import helper, numpy_helper, shape_inference

#: ONNX operators that broadcast their inputs against each other (multidirectionally, or
#: PRelu's slope against its input)
BROADCASTING = frozenset({"Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Mod", "PRelu", "Greater", "Less",
                          "GreaterOrEqual", "LessOrEqual", "Equal", "And", "Or", "Xor", "BitShift", "Where"})

#: initializers up to this many elements keep their values for shape inference (the shapes
#: that Reshape, Expand, Slice... read); larger ones are declared as inputs of their shape
_KEPT_ELEMENTS = 64


def widen_scalars(model: onnx.ModelProto, shapes: dict[str, list[int | None]] | None = None) -> None:
    """Rewrite ``model``'s graph in place: a broadcasting operator's rank-0 or rank-1 size-1
    initializer, where another input's inferred shape has rank >= 2 and ends in 1, is read
    as a [1, 1] copy (added once per constant). Nothing changes where shapes cannot be
    inferred. ``shapes``: ``inferred_shapes(model)`` where the caller has it already."""
    graph = model.graph
    scalars = {t.name: t for t in graph.initializer if len(t.dims) <= 1 and math.prod(t.dims) == 1}
    candidates = [node for node in graph.node
                  if node.op_type in BROADCASTING and not node.domain and any(n in scalars for n in node.input)]
    if not candidates:
        return
    shapes = inferred_shapes(model) if shapes is None else shapes
    if not shapes:
        return
    widened: dict[str, str] = {}
    taken = {t.name for t in graph.initializer} | {name for node in graph.node for name in node.output}
    for node in candidates:
        others = [shapes.get(name) for name in node.input if name and name not in scalars]
        if not any(shape is not None and len(shape) >= 2 and shape[-1] == 1 for shape in others):
            continue
        for position, name in enumerate(node.input):
            if name not in scalars:
                continue
            if name not in widened:
                new_name = f"{name}_11"
                while new_name in taken:
                    new_name += "_"
                taken.add(new_name)
                graph.initializer.append(numpy_helper.from_array(
                    numpy_helper.to_array(scalars[name]).reshape(1, 1), new_name))
                widened[name] = new_name
            node.input[position] = widened[name]


#: the run of a constant's elements along the trailing dimensions that spread_inner_constants
#: spreads a constant to (shorter runs: one ORT kernel call each)
INNER_SPAN = 256
#: the most elements a spread constant may have
_SPREAD_MAX = 1 << 16
#: operators of the com.microsoft domain whose two inputs broadcast as Add's (their positions)
_MS_BROADCASTING = {"QLinearAdd": (0, 3), "QLinearMul": (0, 3)}


def widen_constants(model: onnx.ModelProto, shapes: dict[str, list[int | None]] | None = None
                    ) -> dict[str, list[int | None]] | None:
    """widen_scalars, then spread_inner_constants, on ``model``'s graph in place, with one
    shape inference between them (``shapes`` where the caller has it). Returns the shapes
    used (None where none were needed), as the passes leave them (a spread constant's
    DequantizeLinear gives its new shape)."""
    if shapes is None and (_scalar_candidates(model.graph) or _spread_candidates(model.graph)):
        shapes = inferred_shapes(model)
    if shapes:
        widen_scalars(model, shapes)
        spread_inner_constants(model, shapes)
    return shapes


def _spread_candidates(graph: onnx.GraphProto) -> list[tuple[onnx.NodeProto, list[int]]]:
    """Broadcasting nodes with an initializer of more than one element (or the output of a
    DequantizeLinear of one) among their broadcast inputs, and those inputs' positions."""
    sized = {t.name for t in graph.initializer if math.prod(t.dims) > 1}
    dequantized = {node.output[0] for node in graph.node
                   if node.op_type == "DequantizeLinear" and not node.domain and node.input[0] in sized}
    found = []
    for node in graph.node:
        if node.op_type in BROADCASTING and not node.domain:
            positions = range(len(node.input))
        elif node.domain == "com.microsoft" and node.op_type in _MS_BROADCASTING:
            positions = _MS_BROADCASTING[node.op_type]
        else:
            continue
        chosen = [p for p in positions if p < len(node.input) and node.input[p] in sized | dequantized]
        if chosen:
            found.append((node, chosen))
    return found


def _spread_shape(dims: list[int], out: list[int | None]) -> list[int] | None:
    """The shape a constant of ``dims`` is spread to against a broadcast output of ``out``
    (None: a dimension known only at run time): the trailing dimensions it runs along
    widened to the output's until one run holds INNER_SPAN elements, known dimensions only;
    None where that changes nothing or does not apply."""
    rank = len(out)
    if len(dims) > rank:
        return None
    aligned = [1] * (rank - len(dims)) + list(dims)
    if any(d != 1 and d != o for d, o in zip(aligned, out)):
        return None
    run = 1
    for d, o in zip(reversed(aligned), reversed(out)):
        if d != o:
            break
        run *= o
    if run <= 1 or run >= INNER_SPAN or aligned == out:
        return None  # one value (widen_scalars' case), runs long enough already, or no broadcast
    spread = list(aligned)
    for axis in range(rank - 1, -1, -1):
        if out[axis] is None or math.prod(out[axis + 1:]) >= INNER_SPAN:
            break
        spread[axis] = out[axis]
    if spread == aligned or math.prod(spread) > _SPREAD_MAX:
        return None
    return spread


def spread_inner_constants(model: onnx.ModelProto, shapes: dict[str, list[int | None]] | None = None) -> None:
    """Rewrite ``model``'s graph in place: an initializer of more than one element that a
    broadcasting operator (BROADCASTING, QLinearAdd, QLinearMul) reads, directly or through
    a per-tensor DequantizeLinear read by nothing else, whose elements run along fewer than
    INNER_SPAN trailing elements of the operator's output, is read as its copy spread over
    the output's trailing dimensions (module docstring). Nothing changes where the output's
    shape is not known."""
    graph = model.graph
    candidates = _spread_candidates(graph)
    if not candidates:
        return
    shapes = inferred_shapes(model) if shapes is None else shapes
    if not shapes:
        return
    initializers = {t.name: t for t in graph.initializer}
    producers = {name: node for node in graph.node for name in node.output}
    readers: dict[str, int] = {}
    for node in graph.node:
        for name in node.input:
            readers[name] = readers.get(name, 0) + 1
    outputs = {o.name for o in graph.output}
    taken = set(initializers) | set(producers)
    # If / Loop bodies may read a DequantizeLinear's output by its outer name, unseen here
    nested = any(attribute.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
                 for node in graph.node for attribute in node.attribute)
    spread: dict[tuple[str, tuple[int, ...]], str] = {}

    def spread_copy(name: str, shape: list[int]) -> str:
        key = (name, tuple(shape))
        if key not in spread:
            array = numpy_helper.to_array(initializers[name])
            new_name = f"{name}_spread"
            while new_name in taken:
                new_name += "_"
            taken.add(new_name)
            values = np.broadcast_to(array.reshape([1] * (len(shape) - array.ndim) + list(array.shape)), shape)
            graph.initializer.append(numpy_helper.from_array(np.ascontiguousarray(values), new_name))
            spread[key] = new_name
        return spread[key]

    near_input = _near_inputs(graph, set(initializers))
    for node, positions in candidates:
        if node.domain != "com.microsoft" and not all(
                name in near_input for position, name in enumerate(node.input) if name and position not in positions):
            continue  # (see _near_inputs)
        out = shapes.get(node.output[0])
        if not out:
            continue
        for position in positions:
            name = node.input[position]
            if name in initializers:
                shape = _spread_shape(list(initializers[name].dims), out)
                if shape is not None:
                    node.input[position] = spread_copy(name, shape)
                continue
            dequantize = producers[name]
            if nested or readers.get(name) != 1 or name in outputs or any(
                    attribute.name == "axis" for attribute in dequantize.attribute) or any(
                    other not in initializers or math.prod(initializers[other].dims) != 1
                    for other in dequantize.input[1:] if other):
                continue  # read elsewhere too, or a per-axis quantization (its axis would move)
            shape = _spread_shape(list(initializers[dequantize.input[0]].dims), out)
            if shape is not None:
                dequantize.input[0] = spread_copy(dequantize.input[0], shape)
                shapes[name] = shape


#: operators through which _near_inputs follows a graph input: element-wise ones and casts
_ELEMENT_WISE = frozenset({"Cast", "Add", "Sub", "Mul", "Div", "Max", "Min", "Clip", "Where", "Equal", "Greater",
                           "Less", "Not", "Identity", "QuantizeLinear", "DequantizeLinear", "QLinearAdd",
                           "QLinearMul"})


def _near_inputs(graph: onnx.GraphProto, constants: set[str]) -> set[str]:
    """The values computed from the graph's inputs by element-wise operators alone (an
    image's normalization): spread_inner_constants spreads the constants of standard
    operators only there, as ORT fuses an Add or Mul after a convolution or product into it
    where its constant keeps its own shape (a batch norm's NHWC Sub / Add after a Conv and
    Transpose: postnorm float's outputs changed, and ran 12% slower), which would then round
    otherwise; QLinearAdd / QLinearMul it fuses with nothing."""
    near = {value.name for value in graph.input}
    for node in graph.node:
        if node.op_type in _ELEMENT_WISE and node.domain in ("", "com.microsoft") and all(
                not name or name in near or name in constants for name in node.input):
            near.update(node.output)
    return near


def _scalar_candidates(graph: onnx.GraphProto) -> bool:
    """Whether widen_scalars has a node to look at in ``graph``."""
    scalars = {t.name for t in graph.initializer if len(t.dims) <= 1 and math.prod(t.dims) == 1}
    return any(node.op_type in BROADCASTING and not node.domain and any(n in scalars for n in node.input)
               for node in graph.node)


def inferred_shapes(model: onnx.ModelProto) -> dict[str, list[int | None]]:
    """Every value's shape that ONNX shape inference finds (None for a dimension it knows
    only by name), on a copy of the graph whose large initializers are typed inputs (their
    bytes are not copied) and whose com.microsoft operators of known shape rules (which ONNX
    does not know, so that inference stopped at them) are stand-ins of those shapes."""
    graph = model.graph
    kept = [t for t in graph.initializer if math.prod(t.dims) <= _KEPT_ELEMENTS]
    declared = [helper.make_tensor_value_info(t.name, t.data_type, list(t.dims))
                for t in graph.initializer if math.prod(t.dims) > _KEPT_ELEMENTS]
    nodes = [_stand_in(node) for node in graph.node]
    light = helper.make_graph(nodes, "shapes", [*graph.input, *declared], graph.output, kept)
    copy = helper.make_model(light, opset_imports=model.opset_import)
    copy.ir_version = model.ir_version
    try:
        inferred = shape_inference.infer_shapes(copy, strict_mode=False, data_prop=True)
    except Exception:  # noqa: BLE001 - an optimization only: any failure leaves the graph as it is
        return {}
    shapes: dict[str, list[int | None]] = {}
    for info in (*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output):
        tensor = info.type.tensor_type
        if info.type.HasField("tensor_type") and tensor.HasField("shape"):
            shapes[info.name] = [d.dim_value if d.HasField("dim_value") else None for d in tensor.shape.dim]
    for t in kept:
        shapes[t.name] = list(t.dims)
    return shapes


#: com.microsoft operators whose one output has their first input's shape
_SAME_SHAPE = frozenset({"Gelu", "QuickGelu", "QLinearSigmoid", "QLinearLeakyRelu", "QLinearSoftmax"})
#: com.microsoft operators broadcasting two of their inputs as Add does (their positions)
_BROADCAST_PAIRS = {"QLinearAdd": (0, 3), "QLinearMul": (0, 3), "FastGelu": (0, 1)}


def _stand_in(node: onnx.NodeProto) -> onnx.NodeProto:
    """A standard operator of ``node``'s output shape where ``node`` is a com.microsoft one
    with a known rule (for shape inference only), else ``node``."""
    if node.domain != "com.microsoft" or len(node.output) != 1:
        return node
    if node.op_type in _SAME_SHAPE:
        return helper.make_node("Identity", [node.input[0]], list(node.output))
    pair = _BROADCAST_PAIRS.get(node.op_type)
    if pair is not None:
        inputs = [node.input[i] for i in pair if i < len(node.input) and node.input[i]]
        return helper.make_node("Add", inputs, list(node.output)) if len(inputs) == 2 else \
            helper.make_node("Identity", inputs[:1], list(node.output))
    return node
