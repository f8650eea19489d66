"""TFLite import: resource variables (VAR_HANDLE, READ_VARIABLE, ASSIGN_VARIABLE, CALL_ONCE)
as the session's state tensors.

TensorFlow's streaming layers (microWakeWord's ring buffers, Keras ``stateful`` layers
converted with resource variables) keep their state in resource variables: a CALL_ONCE
runs an initialization subgraph that assigns each variable a constant, and every
invocation reads the variables (READ_VARIABLE) and assigns their new values
(ASSIGN_VARIABLE), which the next invocation reads. NNAPI has no variables; as for
TFLite's variable tensors, each variable becomes a hidden model input holding its value
at the start of a run and, when the run assigns it, a hidden model output holding its
last assigned value, which ``Session`` feeds back at the next run (``StateSpec``). The
value is carried as raw elements, as TFLite copies a variable's bytes whatever the
quantization of the tensor that reads them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from nnapi.importers import StateSpec

if TYPE_CHECKING:  # (the importer imports this module: no import at run time)
    from nnapi.importers.tflite.converter import _Converter
    from nnapi.importers.tflite.reader import _Operator


class VariableError(Exception):
    """A use of resource variables this import does not express (the importer reports it
    as the operator's UnsupportedOperator)."""


@dataclass
class _Variable:
    name: str
    input_position: int  # among the model's inputs
    input_operand: int
    current: int  # the operand holding its value at this point of the run
    initial: np.ndarray


def _key(op: _Operator) -> tuple[str, str]:
    options = op.options("VarHandleOptions")
    if options is None:
        return "", ""
    return (options.Container() or b"").decode("utf-8", "replace"), \
        (options.SharedName() or b"").decode("utf-8", "replace")


def call_once(c: _Converter, op: _Operator) -> None:
    """CALL_ONCE of the initialization subgraph: its ASSIGN_VARIABLEs of constants are the
    variables' initial values (nothing runs in the model)."""
    if not c.top_level:
        raise VariableError("CALL_ONCE inside a control-flow subgraph")
    options = op.options("CallOnceOptions")
    index = options.InitSubgraphIndex() if options is not None else -1
    reader = c.importer.reader
    if not 0 < index < reader.subgraph_count:
        raise VariableError(f"CALL_ONCE of subgraph {index}, which does not exist")
    graph = type(c.graph)(reader, index)  # (the importer's classes: this module cannot import it)
    handles: dict[int, tuple[str, str]] = {}
    for position, raw in enumerate(graph.operators):
        step = type(op)(graph, position, raw)
        if step.name == "VAR_HANDLE":
            handles[step.outputs[0]] = _key(step)
        elif step.name == "ASSIGN_VARIABLE" and step.inputs[0] in handles:
            value = graph.tensors[step.inputs[1]]
            if value.data is None or value.sparsity is not None:
                raise VariableError("CALL_ONCE's subgraph assigns a computed value (only constants are "
                                    "taken as initial values)")
            c.variable_initials[handles[step.inputs[0]]] = value.data
        else:
            raise VariableError(f"CALL_ONCE's subgraph runs {step.name} (only VAR_HANDLE and ASSIGN_VARIABLE "
                                "of constants are taken as initial values)")
    c.lowered(f"CALL_ONCE of subgraph {index}: the constants it assigns are the variables' initial values")


def var_handle(c: _Converter, op: _Operator) -> None:
    c.variable_handles[op.outputs[0]] = _key(op)
    c.lowered("VAR_HANDLE: names a variable (the session's state)")


def _variable(c: _Converter, handle: int, like: int | None, info) -> _Variable:
    """The variable ``handle`` names, made a hidden model input of ``info``'s type at its
    first use."""
    key = c.variable_handles.get(handle)
    if key is None:
        raise VariableError("the resource is not a VAR_HANDLE of this subgraph")
    variable = c.variables.get(key)
    if variable is not None:
        return variable
    if not c.top_level:
        raise VariableError("a variable used inside a control-flow subgraph")
    op_type = c.nn_type(info) if like is None else c.type_of(like)
    if not op_type.is_fully_specified:
        raise VariableError(f"variable {key[1]!r} has unknown dimensions {list(op_type.dimensions)}")
    index = c.add(op_type, None if like is not None else c.channel_params(info))
    position = len(c.model_inputs)
    c.model_inputs.append(index)
    initial = c.variable_initials.get(key)
    shape = list(op_type.dimensions)
    if initial is None:  # TFLite starts an unassigned variable at zeros (raw 0, as its allocation does)
        initial = np.zeros(shape, op_type.dtype)
    elif initial.size != int(np.prod(shape)) or initial.dtype != op_type.dtype:
        raise VariableError(f"variable {key[1]!r}'s initial value ({initial.dtype}{list(initial.shape)}) does "
                            f"not fit its use ({op_type.describe()})")
    variable = _Variable(key[1] or key[0] or f"variable_{len(c.variables)}", position, index, index,
                         np.array(initial).reshape(shape))
    c.variables[key] = variable
    return variable


def read_variable(c: _Converter, op: _Operator) -> None:
    """The variable's value at this point of the run: its state input, or the value last
    assigned to it (the same elements: TFLite reads the bytes)."""
    info = op.out_tensor()
    variable = _variable(c, op.inputs[0], None, info)
    current = c.type_of(variable.current)
    wanted = c.nn_type(info)
    if (current.type, tuple(current.dimensions), current.scale, current.zero_point) != \
            (wanted.type, tuple(wanted.dimensions), wanted.scale, wanted.zero_point):
        raise VariableError(f"READ_VARIABLE as {wanted.describe()} of variable {variable.name!r} holding "
                            f"{current.describe()}")
    c.operands[op.outputs[0]] = variable.current
    c.lowered("READ_VARIABLE: the variable's value (the session's state)")


def assign_variable(c: _Converter, op: _Operator) -> None:
    value = c.input(1)
    variable = _variable(c, op.inputs[0], value, op.tensor(1))
    held = c.type_of(variable.input_operand)
    given = c.type_of(value)
    if held.type != given.type or tuple(held.dimensions) != tuple(given.dimensions):
        raise VariableError(f"ASSIGN_VARIABLE of {given.describe()} to variable {variable.name!r} of "
                            f"{held.describe()}")
    variable.current = value
    c.lowered("ASSIGN_VARIABLE: the variable's new value (the session's state after the run)")


def variable_states(c: _Converter, inputs: list[int], outputs: list[int]) -> list[StateSpec]:
    """Each variable's StateSpec; appends the hidden outputs of those the run assigns."""
    specs = []
    for variable in c.variables.values():
        out_index = None
        if variable.current != variable.input_operand:
            value = variable.current
            if value in inputs or value in outputs:  # NNAPI: an operand is one output, never an input too
                copy = c.add(c.type_of(value))
                c.identity(value, copy)
                value = copy
            out_index = len(outputs)
            outputs.append(value)
        specs.append(StateSpec(variable.name, variable.input_position, out_index, variable.initial))
    return specs
