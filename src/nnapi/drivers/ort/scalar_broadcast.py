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
"""

from __future__ import annotations

import math

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
