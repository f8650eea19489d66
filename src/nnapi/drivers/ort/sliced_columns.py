"""Slices of one 8-bit value along its last axis, each through its own chain of
element-wise operators, joined back by a Concat along that axis, computed without the
slices: a pass over the lowered ONNX graph.

A YOLO-style head decodes its [1, N, 5 + classes] rows so (TFLite's SLICE, then LOGISTIC
of the box centres, objectness and classes and EXP of the sizes, each requantized into
the CONCATENATION's scale). ORT runs each Slice and the Concat as copies of a few bytes per
row: zoo2 yolo_tiny_int8's [1, 432, 9] head spent ~17 us in four Slices, their chains and
the Concat (~6.5 us in the Slices, ~5 in the Concat). Here each distinct chain runs once
over the whole value, and each column is taken from the chain its slice went through: a
Min with a constant mask (the type's highest value on that chain's columns, its lowest
elsewhere) per chain, and one Max of them (the lowest value loses every Max). Every
element goes through the very operators it went through before, on the same stored value
(element-wise: no operator reads another position), so the outputs are the same; a
chain's extra columns are computed and dropped.

Only where the parts are exactly the columns of one value of known shape in order
(constant starts / ends, steps of 1, every other axis whole), every chain's operator is
element-wise with constant other inputs of one element (or a per-tensor quantization),
read only by the next one, and every chain ends in a QuantizeLinear to uint8 / int8.
"""

from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import helper, numpy_helper

from nnapi.drivers.ort.builder import has_kernel
from nnapi.drivers.ort.scalar_broadcast import inferred_shapes

#: operators a chain may hold: each output element a function of the same input element
#: (their other inputs constants of one element)
_ELEMENT_WISE = frozenset({"DequantizeLinear", "QuantizeLinear", "Sigmoid", "Exp", "Tanh", "Relu", "Clip", "Neg",
                           "Abs", "Identity", "Add", "Sub", "Mul", "Div", "Softplus"})
#: com.microsoft operators of one 8-bit input whose other inputs are its quantization
_MS_ELEMENT_WISE = frozenset({"QLinearSigmoid", "QLinearLeakyRelu"})
#: the lowest and highest stored value of the 8-bit types (the masks' two values)
_BOUNDS = {onnx.TensorProto.UINT8: (np.uint8, 0, 255), onnx.TensorProto.INT8: (np.int8, -128, 127)}


def merge_sliced_columns(model: onnx.ModelProto, shapes: dict[str, list[int | None]] | None = None) -> None:
    """Rewrite ``model``'s main graph in place (module docstring); ``shapes``: the graph's
    inferred shapes where the caller has them (scalar_broadcast.inferred_shapes, run here
    only where a Concat of such chains is found)."""
    graph = model.graph
    if not any(node.op_type == "Concat" for node in graph.node):
        return
    constants = {t.name: t for t in graph.initializer}
    producers = {name: node for node in graph.node for name in node.output}
    readers: dict[str, int] = {}
    for node in graph.node:
        for name in node.input:
            readers[name] = readers.get(name, 0) + 1
    for value in graph.output:
        readers[value.name] = readers.get(value.name, 0) + 2  # never a chain's inner value
    if any(attribute.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
           for node in graph.node for attribute in node.attribute):
        return  # (a body may read a value by its outer name, unseen in ``readers``)
    concats = [node for node in graph.node if node.op_type == "Concat" and not node.domain and len(node.input) >= 2
               and all(_chain_of(name, constants, producers, readers) is not None for name in node.input)]
    if not concats:
        return
    shapes = inferred_shapes(model) if shapes is None else shapes
    rewrites = []
    for concat in concats:
        found = _parts(concat, constants, producers, readers, shapes)
        if found is not None:
            rewrites.append((concat, *found))
    if not rewrites:
        return
    taken = set(constants) | set(producers) | {value.name for value in graph.input}
    dropped: set[int] = set()
    placed: dict[int, list[onnx.NodeProto]] = {}
    for concat, source, chains, dims, elem in rewrites:
        new_nodes = _merged(graph, concat, source, chains, dims, elem, constants, taken)
        for chain in chains:
            for node in chain.nodes:
                dropped.add(id(node))
            dropped.add(id(chain.slice))
        dropped.add(id(concat))
        placed[id(concat)] = new_nodes
    nodes = []
    for node in graph.node:
        if id(node) in placed:
            nodes.extend(placed[id(node)])
        elif id(node) not in dropped:
            nodes.append(node)
    del graph.node[:]
    graph.node.extend(nodes)


class _Chain:
    """One Concat input: its Slice, the columns it takes and its operators (Slice first)."""

    def __init__(self, slice_node: onnx.NodeProto, start: int, end: int, nodes: list[onnx.NodeProto]) -> None:
        self.slice, self.start, self.end, self.nodes = slice_node, start, end, nodes

    def signature(self, constants: dict[str, onnx.TensorProto]) -> tuple:
        """What makes two chains compute the same function: operators, attributes and the
        constants' values."""
        parts = []
        for node in self.nodes:
            inputs = tuple(numpy_helper.to_array(constants[name]).tobytes() + bytes([constants[name].data_type])
                           if name in constants else None for name in node.input)
            parts.append((node.op_type, node.domain, tuple(a.SerializeToString() for a in node.attribute), inputs))
        return tuple(parts)


def _constant_ints(name: str, constants: dict[str, onnx.TensorProto]) -> list[int] | None:
    if name not in constants:
        return None
    return [int(v) for v in numpy_helper.to_array(constants[name]).reshape(-1)]


def _slice_columns(node: onnx.NodeProto, dims: list[int], constants: dict[str, onnx.TensorProto]
                   ) -> tuple[int, int] | None:
    """The [start, end) of the last axis that Slice ``node`` takes of a value of ``dims``,
    every other axis whole; None otherwise."""
    rank = len(dims)
    starts, ends = _constant_ints(node.input[1], constants), _constant_ints(node.input[2], constants)
    axes = _constant_ints(node.input[3], constants) if len(node.input) > 3 and node.input[3] else list(range(rank))
    steps = _constant_ints(node.input[4], constants) if len(node.input) > 4 and node.input[4] else None
    if starts is None or ends is None or axes is None or len(starts) != len(axes) or len(ends) != len(axes):
        return None
    if steps is not None and (len(steps) != len(axes) or any(step != 1 for step in steps)):
        return None
    span = {}
    for axis, start, end in zip(axes, starts, ends):
        axis = axis + rank if axis < 0 else axis
        if not 0 <= axis < rank or axis in span:
            return None
        size = dims[axis]
        start = max(0, min(size, start + size if start < 0 else start))
        end = max(0, min(size, end + size if end < 0 else end))
        span[axis] = (start, end)
    for axis in range(rank - 1):
        if span.get(axis, (0, dims[axis])) != (0, dims[axis]):
            return None
    start, end = span.get(rank - 1, (0, dims[-1]))
    return (start, end) if start < end else None


def _chain_of(name: str, constants, producers, readers) -> list[onnx.NodeProto] | None:
    """The element-wise operators from a Slice to ``name`` (the Slice first), or None."""
    nodes = []
    while True:
        node = producers.get(name)
        if node is None or readers.get(name) != 1:
            return None
        if node.op_type == "Slice" and not node.domain:
            nodes.append(node)
            return nodes[::-1] if len(nodes) > 1 else None
        if len(node.output) != 1:
            return None
        if node.domain == "com.microsoft" and node.op_type in _MS_ELEMENT_WISE:
            if not all(n in constants for n in node.input[1:] if n):
                return None
        elif node.domain or node.op_type not in _ELEMENT_WISE:
            return None
        elif any(a.name == "axis" for a in node.attribute) or not all(
                n in constants and math.prod(constants[n].dims) == 1 for n in node.input[1:] if n):
            return None  # a per-axis quantization, or a constant of more than one value
        nodes.append(node)
        name = node.input[0]


def _parts(concat, constants, producers, readers, shapes):
    """(the sliced value, its chains in order, its dims, the 8-bit element type) where
    ``concat`` joins such chains (module docstring), else None."""
    chains: list[_Chain] = []
    source = None
    for name in concat.input:
        nodes = _chain_of(name, constants, producers, readers)
        if nodes is None:
            return None
        if source is None:
            source = nodes[0].input[0]
        elif nodes[0].input[0] != source:
            return None
        chains.append(nodes)
    dims = shapes.get(source)
    if not dims or not all(dims):
        return None
    axis = next((a.i for a in concat.attribute if a.name == "axis"), None)
    if axis is None or (axis + len(dims) if axis < 0 else axis) != len(dims) - 1:
        return None
    last = chains[0][-1]
    zero_point = last.input[2] if len(last.input) > 2 else ""
    if zero_point not in constants:
        return None
    elem = constants[zero_point].data_type
    if elem not in _BOUNDS:
        return None
    parts = []
    expected = 0
    for nodes in chains:
        if nodes[-1].op_type != "QuantizeLinear" or nodes[-1].domain:
            return None
        point = nodes[-1].input[2] if len(nodes[-1].input) > 2 else ""
        if point not in constants or constants[point].data_type != elem:
            return None
        columns = _slice_columns(nodes[0], dims, constants)
        if columns is None or columns[0] != expected:
            return None
        expected = columns[1]
        parts.append(_Chain(nodes[0], columns[0], columns[1], nodes[1:]))
    if expected != dims[-1]:
        return None
    if len({part.signature(constants) for part in parts}) > 1 and not (has_kernel("Min", elem)
                                                                       and has_kernel("Max", elem)):
        return None  # the picks' 8-bit Min / Max: onnxruntime 1.20 and older have none
    return source, parts, list(dims), elem


def _merged(graph, concat, source, chains, dims, elem, constants, taken) -> list[onnx.NodeProto]:
    """The nodes computing ``concat``'s output from ``source`` without the slices."""

    def fresh(name: str) -> str:
        name = f"{name}_whole"
        while name in taken:
            name += "_"
        taken.add(name)
        return name

    groups: dict[tuple, list[_Chain]] = {}
    for chain in chains:
        groups.setdefault(chain.signature(constants), []).append(chain)
    nodes: list[onnx.NodeProto] = []
    results = []
    for members in groups.values():
        value = source
        for node in members[0].nodes:
            copy = onnx.NodeProto()
            copy.CopyFrom(node)
            copy.input[0] = value
            value = fresh(node.output[0])
            copy.output[0] = value
            copy.name = ""
            nodes.append(copy)
        results.append((value, members))
    if len(results) == 1:
        nodes[-1].output[0] = concat.output[0]
        return nodes
    dtype, low, high = _BOUNDS[elem]
    picked = []
    for value, members in results:
        mask = np.full(dims, low, dtype)
        for chain in members:
            mask[..., chain.start:chain.end] = high
        mask_name = fresh(f"{value}_columns")
        graph.initializer.append(numpy_helper.from_array(mask, mask_name))
        out = fresh(f"{value}_picked")
        nodes.append(helper.make_node("Min", [value, mask_name], [out]))
        picked.append(out)
    nodes.append(helper.make_node("Max", picked, list(concat.output)))
    return nodes
