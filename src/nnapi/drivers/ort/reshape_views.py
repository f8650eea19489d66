"""Fewer Reshapes in the lowered ONNX graph: a value that only Reshapes and shape-blind
element-wise operators pass between (a transformer's residual stream) is computed in one
shape, with a Reshape only where an operator needs another one.

A transformer block as NNAPI writes it moves its [1, T, C] activations to [T, C] and back
around every operation: FULLY_CONNECTED reads [T, C] rows (its lowering's Reshape) and
writes [T, units], which the model RESHAPEs to [1, T, units] for the residual ADD, and
again to [T, C] for the next FULLY_CONNECTED. ORT keeps most of them (onnxruntime 1.32: 28
Reshapes of a 2-block ViT's 72 nodes after its optimizer, ~0.2 us each, and each one a
node between its neighbours' fusions).

The pass groups values into classes: a Reshape's (Squeeze's, Unsqueeze's, Flatten's) input
and output, and the inputs and
output of an operator that computes each element from the elements at the same position
(Add / Mul / ... of equally shaped inputs and of constants that are one value, a last-axis
vector or of the output's full shape; unary functions, Clip, per-tensor Quantize /
DequantizeLinear, QLinearAdd / QLinearMul) or along the last axis only (LayerNormalization
and Softmax over the last axis). Every such operator computes the same values in any shape
that keeps the last axis, so each class is computed in the one shape (of those its values
have) that leaves the fewest Reshapes for the other operators reading its values, the graph
outputs and control-flow bodies, each of which still reads its value in its own shape and
under its own name. The operators compute the same elements as before, only in another
view (tests/test_driver_ort_reshape_views.py: the outputs bit for bit). A class is left as
it is unless it then has fewer Reshapes, or where any of its values has a dimension known
only at run time. Where a class's shapes tie, the first in sorted order is taken.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np
import onnx
from onnx import helper, numpy_helper

from nnapi.drivers.ort.builder import MS_DOMAIN
from nnapi.drivers.ort.scalar_broadcast import inferred_shapes

#: operators computing each element of their one output from that element of their first
#: input (any other input a one-value constant: Clip's bounds)
_UNARY = frozenset({"Relu", "Tanh", "Sigmoid", "Erf", "Exp", "Log", "Abs", "Neg", "Sqrt", "Reciprocal", "Floor",
                    "Ceil", "Round", "Sign", "Not", "IsNaN", "IsInf", "Cast", "Identity", "LeakyRelu", "Elu",
                    "Selu", "Softplus", "Softsign", "HardSigmoid", "HardSwish", "Sin", "Cos", "Clip",
                    "QuantizeLinear", "DequantizeLinear"})
#: com.microsoft element-wise operators of one input (any other input a one-value constant:
#: the quantized ones' scales and zero points)
_MS_UNARY = frozenset({"Gelu", "FastGelu", "QuickGelu", "QLinearSigmoid", "QLinearLeakyRelu"})
#: operators broadcasting their inputs element-wise (the pass takes them where no data
#: input broadcasts against another)
_BINARY = frozenset({"Add", "Sub", "Mul", "Div", "Max", "Min", "Pow", "Equal", "Greater", "Less",
                     "GreaterOrEqual", "LessOrEqual", "And", "Or", "Xor", "Where"})
#: com.microsoft quantized binary operators: their two tensors' positions (the others are
#: scales and zero points)
_MS_BINARY = {"QLinearAdd": (0, 3), "QLinearMul": (0, 3)}
#: operators that only view their input in another shape (the pass's "Reshapes")
_VIEWS = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze"})

Shape = tuple[int, ...]


def simplify_reshapes(model: onnx.ModelProto) -> dict[str, list[int | None]] | None:
    """Rewrite ``model``'s main graph in place: each class of values joined by Reshapes and
    position-wise operators (module docstring) computed in the shape needing the fewest
    Reshapes, where that is fewer than it has. Nothing changes where shapes are unknown.
    Returns ``inferred_shapes`` of the graph it leaves (for widen_scalars: shape
    inference is most of the pass's time), None where it inferred none."""
    graph = model.graph
    if sum(_is_view(node) for node in graph.node) < 2:
        return None
    inferred = inferred_shapes(model)
    if not inferred:
        return None
    nodes, initializers = [onnx.NodeProto.FromString(node.SerializeToString()) for node in graph.node], \
        len(graph.initializer)
    try:
        _Rewrite(graph, _static_shapes(model, inferred), inferred).run()
    except Exception:  # noqa: BLE001 - an optimization only: a failure leaves the graph as lowered
        graph.ClearField("node")
        graph.node.extend(nodes)
        del graph.initializer[initializers:]
        return None
    return inferred


class _Rewrite:
    """One pass over a graph: the classes, each one's best shape, the new nodes."""

    def __init__(self, graph: onnx.GraphProto, shapes: dict[str, Shape],
                 inferred: dict[str, list[int | None]]) -> None:
        self.graph = graph
        self.shapes = shapes
        self.inferred = inferred  # kept up to date with the values the rewrite makes
        self.constants = {t.name: t for t in graph.initializer}
        self.outputs = {o.name for o in graph.output}
        self.captured = _body_reads(graph.node)
        self.parent: dict[str, str] = {}
        self.role: dict[str, tuple[int, ...]] = {}  # _key(node) -> its data inputs' positions, for the class's nodes
        self.limits: dict[str, int] = {}  # _key(node) -> the last dimension it needs kept (0: none)
        self.readers: dict[str, list[onnx.NodeProto]] = {}  # value -> the nodes reading it, in order
        for node in graph.node:
            for name in dict.fromkeys(node.input):
                self.readers.setdefault(name, []).append(node)
        self.position = {_key(node): position for position, node in enumerate(graph.node)}
        self.was_read = set(self.readers) | self.captured

    def find(self, name: str) -> str:
        root = self.parent.setdefault(name, name)
        while root != self.parent[root]:
            root = self.parent[root]
        while self.parent[name] != root:
            self.parent[name], name = root, self.parent[name]
        return root

    def union(self, names: Iterable[str]) -> None:
        names = list(names)
        for name in names[1:]:
            self.parent[self.find(name)] = self.find(names[0])

    def run(self) -> None:
        for node in self.graph.node:
            data = self._positionwise(node)
            if data is None:
                continue
            self.role[_key(node)] = data
            self.union([*self._data(node), node.output[0]])
        classes: dict[str, list[onnx.NodeProto]] = {}
        for node in self.graph.node:
            if _key(node) in self.role:
                classes.setdefault(self.find(node.output[0]), []).append(node)
        changed = False
        for nodes in classes.values():
            reshapes = sum(_is_view(node) for node in nodes)
            if reshapes == 0:
                continue
            best = self._best_shape(nodes)
            if best is not None and best[1] < reshapes:
                self._apply(nodes, best[0])
                changed = True
        if changed:
            _sort_topologically(self.graph)
            self._drop_unread_constants()

    def _drop_unread_constants(self) -> None:
        """Drop the initializers the rewrite left unread (a removed Reshape's shape, a
        constant read now in another shape)."""
        read = {name for node in self.graph.node for name in node.input} | _body_reads(self.graph.node) | \
            self.outputs
        kept = [t for t in self.graph.initializer if t.name in read or t.name not in self.was_read]
        if len(kept) != len(self.graph.initializer):
            del self.graph.initializer[:]
            self.graph.initializer.extend(kept)

    # -- which nodes belong to a class -------------------------------------------------
    def _data(self, node: onnx.NodeProto) -> list[str]:
        """The class's values a node of the class reads (its data inputs less constants)."""
        return [node.input[i] for i in self.role[_key(node)] if node.input[i] not in self.constants]

    def _positionwise(self, node: onnx.NodeProto) -> tuple[int, ...] | None:
        """The positions of the data inputs of a Reshape or a position-wise operator (module
        docstring) whose shapes are all known, else None; records the last dimension it
        needs kept."""
        if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute):
            return None
        out = node.output[0] if node.output else ""
        if len(node.output) != 1 or self.shapes.get(out) is None:
            return None
        shape = self.shapes[out]
        if _is_view(node):
            source = node.input[0]
            if self.shapes.get(source) is None or source in self.constants:
                return None
            self.limits[_key(node)] = 0
            return (0,)
        if node.domain == MS_DOMAIN and node.op_type in _MS_UNARY:
            data, others = [0], node.input[1:]
        elif node.domain == MS_DOMAIN and node.op_type in _MS_BINARY:
            data = list(_MS_BINARY[node.op_type])
            others = [name for i, name in enumerate(node.input) if i not in data]
        elif node.domain:
            return None
        elif node.op_type in _UNARY:
            data, others = [0], node.input[1:]
        elif node.op_type in _BINARY:
            data, others = list(range(len(node.input))), []
        elif node.op_type in ("LayerNormalization", "Softmax"):
            axis = _attribute(node, "axis", -1)
            if axis not in (-1, len(shape) - 1) or len(shape) < 1:
                return None
            if axis != -1:  # the last axis named from the front would be another in a class shape of another rank
                node.attribute.remove(next(a for a in node.attribute if a.name == "axis"))
                node.attribute.append(helper.make_attribute("axis", -1))
            data, others = [0], node.input[1:]
            if node.op_type == "LayerNormalization" and any(
                    name not in self.constants or tuple(self.constants[name].dims) != shape[-1:] for name in others):
                return None
            others = []  # the norm's scale and bias: per-channel along the kept last axis
            self.limits[_key(node)] = shape[-1]
        else:
            return None
        if any(name and (name not in self.constants or math.prod(self.constants[name].dims) != 1) for name in others):
            return None
        tensors = 0
        for position in data:
            name = node.input[position] if position < len(node.input) else ""
            if not name:
                return None
            if name in self.constants:
                dims = tuple(self.constants[name].dims)
                if math.prod(dims) == 1 or dims == shape:
                    continue
                if len(dims) <= len(shape) and dims[-1] == shape[-1] and math.prod(dims) == dims[-1]:
                    self.limits[_key(node)] = shape[-1]  # a last-axis vector
                    continue
                return None
            if self.shapes.get(name) != shape:
                return None  # broadcasts against another input (or unknown)
            tensors += 1
        if not tensors:
            return None
        self.limits.setdefault(_key(node), 0)
        return tuple(data)

    # -- choosing a class's shape --------------------------------------------------------
    def _best_shape(self, nodes: list[onnx.NodeProto]) -> tuple[Shape, int] | None:
        """The shape of the class of ``nodes`` leaving the fewest Reshapes, and that count."""
        members = {name for node in nodes for name in (*self._data(node), node.output[0])}
        limits = {self.limits[_key(node)] for node in nodes} - {0}
        # ORT broadcasts a constant over a tensor whose last dimension is 1 one element per
        # inner loop (scalar_broadcast.py; the int8 shift of a [1, n, 1] waveform runs flat
        # for it): no class shape ending in 1 where a constant broadcasts over one that does not
        broadcast = any(self.shapes[node.output[0]][-1:] != (1,) and any(
            name in self.constants and math.prod(self.constants[name].dims) < math.prod(self.shapes[node.output[0]])
            for name in (node.input[i] for i in self.role[_key(node)])) for node in nodes if not _is_view(node))
        best = None
        for shape in sorted({self.shapes[name] for name in members}):
            if any(not shape or shape[-1] != limit for limit in limits):
                continue
            if broadcast and shape[-1:] == (1,) and math.prod(shape) > 1:
                continue
            count = len(self._plan(nodes, shape, make=False)[0])
            if best is None or count < best[1]:
                best = (shape, count)
        return best

    def _plan(self, nodes: list[onnx.NodeProto], shape: Shape,
              make: bool) -> tuple[list[tuple[str, Shape, str]], dict[str, list[str]]]:
        """The Reshapes computing the class of ``nodes`` in ``shape`` takes, as (source,
        shape, output name) triples, and each node's new input names (the refitted
        constants they read made only where ``make``)."""
        in_class = {_key(node) for node in nodes}
        computed = {node.output[0] for node in nodes if not _is_view(node)}
        reshape_of = {node.output[0]: node.input[0] for node in nodes if _is_view(node)}

        def root(name: str) -> str:
            while name in reshape_of:
                name = reshape_of[name]
            return name

        def held(name: str) -> tuple[str, Shape]:
            """Where a root's values are after the rewrite, and in which shape."""
            return (_renamed(name), shape) if name in computed and self.shapes[name] != shape else \
                (name, self.shapes[name])

        made: dict[tuple[str, Shape], str] = {}
        reshapes: list[tuple[str, Shape, str]] = []

        def view(name: str, wanted: Shape, output: str | None = None) -> str:
            source, have = held(root(name))
            if have == wanted and output is None:
                return source
            if output is None:
                if (source, wanted) in made:
                    return made[(source, wanted)]
                output = f"{source}_as_{'x'.join(map(str, wanted))}"
                made[(source, wanted)] = output
            reshapes.append((source, wanted, output))
            return output

        inputs: dict[str, list[str]] = {}
        for node in nodes:
            if _is_view(node):
                continue
            data = self.role[_key(node)]
            inputs[_key(node)] = [name if position not in data else self._fitted_constant(name, shape, make)
                                if name in self.constants else view(name, shape)
                                for position, name in enumerate(node.input)]
        members = set(computed) | set(reshape_of)
        rigid = {_key(node): node for member in members for node in self.readers.get(member, [])
                 if _key(node) not in in_class}
        for key in sorted(rigid, key=self.position.__getitem__):  # in graph order: the same graph every time
            inputs[key] = [view(name, self.shapes[name]) if name in members else name for name in rigid[key].input]
        for name in sorted(members):
            if name in self.outputs or name in self.captured:
                if name in computed and self.shapes[name] == shape:
                    continue  # computed under its own name and in its own shape
                view(name, self.shapes[name], output=name)
        return reshapes, inputs

    # -- rewriting ------------------------------------------------------------------------
    def _apply(self, nodes: list[onnx.NodeProto], shape: Shape) -> None:
        reshapes, inputs = self._plan(nodes, shape, make=True)
        graph = self.graph
        for node in nodes:
            if _is_view(node):
                graph.node.remove(node)
                continue
            node.input[:] = inputs.pop(_key(node))
            if self.shapes[node.output[0]] != shape:
                node.output[0] = _renamed(node.output[0])
                self.inferred[node.output[0]] = list(shape)
        for node in graph.node:
            if _key(node) in inputs:
                node.input[:] = inputs[_key(node)]
        for source, wanted, output in reshapes:
            target = self._constant(np.array(wanted, np.int64), f"{output}_shape")
            graph.node.append(helper.make_node("Reshape", [source, target], [output]))
            self.inferred[output] = list(wanted)

    def _fitted_constant(self, name: str, shape: Shape, make: bool) -> str:
        """A constant operand of a class's operator read in the class's shape: one value at a
        rank no higher than the shape's, a last-axis vector as [C], a full one reshaped."""
        array = numpy_helper.to_array(self.constants[name])
        if array.size == 1:
            fitted = array if array.ndim <= len(shape) else array.reshape([])
        elif array.size == array.shape[-1] and array.size != math.prod(shape):
            fitted = array.reshape(array.shape[-1])
        else:
            fitted = array.reshape(shape)
        if fitted.shape == array.shape:
            return name
        fitted_name = f"{name}_as_{'x'.join(map(str, fitted.shape)) or 'scalar'}"
        return self._constant(fitted, fitted_name) if make else fitted_name

    def _constant(self, array: np.ndarray, name: str) -> str:
        if name not in self.constants:
            tensor = numpy_helper.from_array(array, name)
            self.graph.initializer.append(tensor)
            self.constants[name] = tensor
            self.inferred[name] = list(array.shape)
        return name


def _is_view(node: onnx.NodeProto) -> bool:
    return not node.domain and node.op_type in _VIEWS


def _key(node: onnx.NodeProto) -> str:
    """A node's identity across the rewrite: its first output's name (each value has one
    producer; protobuf wrappers' ids are not stable)."""
    return node.output[0]


def _renamed(name: str) -> str:
    """The name of a class's computed value in the class's shape."""
    return f"{name}_flat"


def _attribute(node: onnx.NodeProto, name: str, default: int) -> int:
    return next((helper.get_attribute_value(a) for a in node.attribute if a.name == name), default)


def _body_reads(nodes: Iterable[onnx.NodeProto]) -> set[str]:
    """Names read inside If / Loop bodies at any depth (outer values captured by name)."""
    names: set[str] = set()
    for node in nodes:
        for attribute in node.attribute:
            for body in (*([attribute.g] if attribute.HasField("g") else []), *attribute.graphs):
                names.update(name for inner in body.node for name in inner.input)
                names |= _body_reads(body.node)
    return names


def _sort_topologically(graph: onnx.GraphProto) -> None:
    """Order the nodes so that each follows the producers of what it reads (a new Reshape
    was appended at the end); stable otherwise."""
    produced = {name for node in graph.node for name in node.output}
    ready = {i.name for i in graph.input} | {t.name for t in graph.initializer} | {""}
    ready |= _body_reads(graph.node) - produced  # outer names only a body reads
    pending = list(graph.node)
    ordered: list[onnx.NodeProto] = []
    while pending:
        rest = []
        for node in pending:
            if all(name in ready or name not in produced for name in node.input):
                ordered.append(node)
                ready.update(node.output)
            else:
                rest.append(node)
        if len(rest) == len(pending):
            raise AssertionError("reshape_views: the rewritten graph has a cycle")
        pending = rest
    graph.ClearField("node")
    graph.node.extend(ordered)


def _static_shapes(model: onnx.ModelProto, inferred: dict[str, list[int | None]]) -> dict[str, Shape]:
    """Every value's shape where all its dimensions are known: ONNX shape inference
    (``inferred``), carried past the com.microsoft operators it does not know (Gelu,
    QLinearAdd, ...) by their own rules and those of the operators after them that the
    pass needs."""
    shapes: dict[str, Shape] = {name: tuple(dims) for name, dims in inferred.items()
                                if all(isinstance(d, int) and d > 0 for d in dims) or dims == []}
    for tensor in model.graph.initializer:
        shapes[tensor.name] = tuple(tensor.dims)
    constants = {t.name: t for t in model.graph.initializer}
    for node in model.graph.node:
        if all(name in shapes for name in node.output if name):
            continue
        shape = _own_rule(node, shapes, constants)
        if shape is not None and len(node.output) >= 1:
            shapes[node.output[0]] = shape
    return shapes


def _own_rule(node: onnx.NodeProto, shapes: dict[str, Shape], constants: dict) -> Shape | None:
    """The output shape of ``node`` from its inputs' where ONNX shape inference gave none."""
    known = [shapes.get(name) for name in node.input]
    if node.domain == MS_DOMAIN and node.op_type in _MS_UNARY or node.op_type in _UNARY or \
            node.op_type in ("LayerNormalization", "Softmax"):
        return known[0] if known else None
    if node.domain == MS_DOMAIN and node.op_type in _MS_BINARY:
        first, second = known[0], known[3] if len(known) > 3 else None
        if first is None or second is None:
            return None
        return _broadcast([first, second])
    if node.op_type in _BINARY:
        return None if any(shape is None for shape in known) else _broadcast(known)
    if node.domain == MS_DOMAIN and node.op_type == "Attention" and len(known) > 2 and \
            known[0] is not None and known[2] is not None:
        return (*known[0][:-1], known[2][0] // 3)  # [B, S, features] -> [B, S, hidden]: bias [3 * hidden]
    if node.op_type == "Reshape" and known and known[0] is not None and node.input[1] in constants:
        target = [int(d) for d in numpy_helper.to_array(constants[node.input[1]])]
        if _attribute(node, "allowzero", 0) == 0:
            target = [known[0][i] if d == 0 else d for i, d in enumerate(target)]
        if target.count(-1) == 1:
            rest = math.prod(d for d in target if d != -1)
            target[target.index(-1)] = math.prod(known[0]) // rest if rest else 0
        return tuple(target) if all(d > 0 for d in target) else None
    if node.op_type == "Transpose" and known and known[0] is not None:
        perm = _attribute(node, "perm", None) or list(reversed(range(len(known[0]))))
        return tuple(known[0][p] for p in perm)
    gemm = {("", "Gemm"): 1, (MS_DOMAIN, "QGemm"): 3}.get((node.domain, node.op_type))
    if gemm and len(known) > gemm and known[0] is not None and known[gemm] is not None:
        a, b = known[0], known[gemm]
        rows = a[1] if _attribute(node, "transA", 0) else a[0]
        columns = b[0] if _attribute(node, "transB", 0) else b[1]
        return (rows, columns)
    matmul = {("", "MatMul"): 1, ("", "MatMulInteger"): 1, ("", "QLinearMatMul"): 3,
              (MS_DOMAIN, "MatMulIntegerToFloat"): 1}.get((node.domain, node.op_type))
    if matmul and len(known) > matmul and all(s is not None and len(s) >= 2 for s in (known[0], known[matmul])):
        a, b = known[0], known[matmul]
        try:
            batch = _broadcast([a[:-2], b[:-2]])
        except ValueError:
            return None
        return (*batch, a[-2], b[-1])
    return None


def _broadcast(shapes: list[Shape]) -> Shape:
    return tuple(int(d) for d in np.broadcast_shapes(*shapes))
