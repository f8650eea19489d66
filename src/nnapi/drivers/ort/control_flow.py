"""Lowerings of control flow (IF, WHILE) to ONNX's If and Loop, whose branches and body
are ONNX subgraphs lowered from the referenced NNAPI models by the same lowerings.

A referenced model is lowered by a nested ``GraphBuilder`` whose inputs are bound to
values of the enclosing graph: an If branch reads them from the outer scope; a Loop body
takes the loop-carried values (WHILE's m input-output and k state values) as its inputs
and reads the n input-only values from the outer scope. Values keep their internal
encoding across the boundary (the spec makes a referenced model's operands agree with the
operation's in type and quantization), so nothing is converted per iteration.

WHILE evaluates its condition model before every iteration, the first included; ONNX's
Loop takes the first condition as an input and the next one from its body. So the
condition model is lowered twice: once in the enclosing graph on the initial values, and
once at the end of the body on the values the body computed. A loop-carried value must
keep its shape from one iteration to the next (ONNX lowerings need static shapes), and
the loop timeout is the driver's (its watchdog stops the run).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx
from onnx import TensorProto, helper

from nnapi.codes import OperationCode
from nnapi.drivers.ort.builder import (
    KIND_ELEM,
    Declined,
    GraphBuilder,
    L,
    Value,
    internal_kind,
    lower_operation,
    lowers,
)
from nnapi.hal import Operation, Subgraph
from nnapi.operations.control_flow import (
    IF_CONDITION,
    IF_ELSE_MODEL,
    IF_FIRST_INPUT,
    IF_THEN_MODEL,
    WHILE_BODY_MODEL,
    WHILE_CONDITION_MODEL,
    WHILE_FIRST_VALUE,
)

#: lowerings of particular WHILE loops as something other than a Loop (gru_loop.py), each
#: returning whether it lowered the operation: tried in order before the Loop
WHILE_FORMS: list[Callable[[GraphBuilder, Operation], bool]] = []


def referenced_model(g: GraphBuilder, index: int) -> Subgraph:
    """The referenced model operand ``index`` names (an IF's branch, a WHILE's condition or
    body); Declined for any other operand."""
    operand = g.operand(index)
    if operand.lifetime != L.SUBGRAPH:
        raise Declined(f"operand {index} is not a referenced model")
    position = operand.location.offset
    if not 0 <= position < len(g.model.referenced):
        raise Declined(f"operand {index} names no referenced model")
    return g.model.referenced[position]


def _nested(g: GraphBuilder, subgraph: Subgraph, inputs: list[Value], hint: str) -> GraphBuilder:
    """A builder for ``subgraph`` whose inputs are ``inputs`` (values of an enclosing scope
    or of the subgraph's own inputs), its names prefixed so no scope reuses a name."""
    if len(inputs) != len(subgraph.input_indexes):
        raise Declined(f"the referenced model has {len(subgraph.input_indexes)} inputs, the operation "
                       f"passes {len(inputs)}")
    child = g.nested(subgraph, hint)
    for index, value in zip(subgraph.input_indexes, inputs, strict=True):
        operand = subgraph.operands[index]
        dims = list(operand.dimensions) if operand.dimensions and all(operand.dimensions) else value.dims
        child.values[index] = Value(value.name, value.kind, dims, value.scale, value.zero_point, value.const)
    for operation in subgraph.operations:
        lower_operation(child, operation)
    if child.uses_ms_domain:
        g.uses_ms_domain = True
    return child


def _outputs(child: GraphBuilder) -> list[Value]:
    """The nested graph's outputs, each written by a node of its own graph (an ONNX
    subgraph's outputs must be): one that is an input, an outer value or a constant, or
    is listed twice, is copied by an Identity; the others are their nodes' own (no node
    more per iteration of a Loop)."""
    written = {name for node in child.nodes for name in node.output}
    outputs, listed = [], set()
    for index in child.subgraph.output_indexes:
        value = child.value(index)
        name = value.name
        if name not in written or name in listed:
            name = child.one("Identity", [name])
        listed.add(name)
        outputs.append(Value(name, value.kind, value.dims, value.scale, value.zero_point))
    return outputs


def _info(value: Value) -> onnx.ValueInfoProto:
    dims = value.dims if value.dims and all(value.dims) else None
    return helper.make_tensor_value_info(value.name, KIND_ELEM[value.kind], dims)


def _truth(g: GraphBuilder, value: Value) -> str:
    """A TENSOR_BOOL8 [1] condition as the scalar bool ONNX's If and Loop take."""
    if value.kind != "bool" or value.dims not in ([1], [0]):
        raise Declined("the condition must be a TENSOR_BOOL8 of one element")
    return g.one("Reshape", [value.name, g.constant(np.array([], np.int64))])


@lowers(OperationCode.IF)
def lower_if(g: GraphBuilder, operation: Operation) -> None:
    """ONNX If: both branches read the operation's inputs from the enclosing scope."""
    condition = _truth(g, g.value(operation.inputs[IF_CONDITION]))
    inputs = [g.value(index) for index in operation.inputs[IF_FIRST_INPUT:]]
    branches = []
    for position, hint in ((IF_THEN_MODEL, "then"), (IF_ELSE_MODEL, "else")):
        child = _nested(g, referenced_model(g, operation.inputs[position]), inputs, hint)
        outputs = _outputs(child)
        if len(outputs) != len(operation.outputs):
            raise Declined(f"the {hint} model has {len(outputs)} outputs, the operation {len(operation.outputs)}")
        for value, index in zip(outputs, operation.outputs, strict=True):
            if value.kind != internal_kind(g.operand(index).type):
                raise Declined(f"the {hint} model's outputs do not match the operation's")
        branches.append(helper.make_graph(child.nodes, f"{child.prefix}graph", [],
                                          [_info(value) for value in outputs], child.initializers))
    results = g.node("If", [condition], len(operation.outputs), then_branch=branches[0], else_branch=branches[1])
    for index, name in zip(operation.outputs, results, strict=True):
        g.set_output(index, name)


@lowers(OperationCode.WHILE)
def lower_while(g: GraphBuilder, operation: Operation) -> None:
    """ONNX Loop without a trip count: the condition model on the initial values starts
    it, the body model then the condition model on the body's results make each iteration
    (unless one of WHILE_FORMS lowers the loop otherwise)."""
    for form in WHILE_FORMS:
        if form(g, operation):
            return
    condition_model = referenced_model(g, operation.inputs[WHILE_CONDITION_MODEL])
    body_model = referenced_model(g, operation.inputs[WHILE_BODY_MODEL])
    values = [g.value(index) for index in operation.inputs[WHILE_FIRST_VALUE:]]
    carried = len(body_model.output_indexes)  # m input-output and k state values
    if not len(operation.outputs) <= carried <= len(values):
        raise Declined("the body's outputs do not fit the operation's values")
    for value in values[:carried]:
        if not value.dims or not all(value.dims):
            raise Declined("a loop-carried value's shape must be known")
    first = _condition(g, condition_model, values)
    prefix = g.fresh("loop")
    iteration, condition_in = f"{prefix}_i", f"{prefix}_cond"
    loop_inputs = [Value(f"{prefix}_v{k}", value.kind, value.dims, value.scale, value.zero_point)
                   for k, value in enumerate(values[:carried])]
    body = _nested(g, body_model, [*loop_inputs, *values[carried:]], "body")
    results = _outputs(body)
    for result, value in zip(results, loop_inputs, strict=True):
        if result.kind != value.kind or result.dims != value.dims:
            raise Declined("a loop-carried value changes its type or shape from one iteration to the next")
    condition_out = _condition(body, condition_model, [*results, *values[carried:]])  # a Reshape's
    graph = helper.make_graph(
        body.nodes, f"{prefix}_body",
        [helper.make_tensor_value_info(iteration, TensorProto.INT64, []),
         helper.make_tensor_value_info(condition_in, TensorProto.BOOL, []),
         *(_info(value) for value in loop_inputs)],
        [helper.make_tensor_value_info(condition_out, TensorProto.BOOL, []), *(_info(value) for value in results)],
        body.initializers)
    finals = g.node("Loop", ["", first, *(value.name for value in values[:carried])], carried, body=graph)
    for index, name in zip(operation.outputs, finals, strict=True):
        g.set_output(index, name)


def _condition(g: GraphBuilder, condition_model: Subgraph, values: list[Value]) -> str:
    """The condition model on ``values``, lowered into ``g``'s graph: a scalar bool."""
    child = _nested(g, condition_model, values, "cond")
    if len(condition_model.output_indexes) != 1:
        raise Declined("the condition model must have one output")
    g.nodes.extend(child.nodes)
    g.initializers.extend(child.initializers)
    return _truth(g, child.value(condition_model.output_indexes[0]))
