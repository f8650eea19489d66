"""TFLite import: WHILE, IF and the resource-variable operators.
"""

from __future__ import annotations

from nnapi.codes import OperandCode as T
from nnapi.codes import OperationCode as Op
from nnapi.importers.tflite.converter import _Converter, _converter
from nnapi.importers.tflite.reader import UnsupportedOperator, _Operator
from nnapi.importers.tflite.variables import VariableError, assign_variable, call_once, read_variable, var_handle
from nnapi.importers.tflite.while_lstm import keras_while_lstm
from nnapi.operand import OperandType


@_converter("CALL_ONCE", "VAR_HANDLE", "READ_VARIABLE", "ASSIGN_VARIABLE")
def _resource_variable(c: _Converter, op: _Operator) -> None:
    """Resource variables as the session's state tensors (variables.py)."""
    convert = {"CALL_ONCE": call_once, "VAR_HANDLE": var_handle, "READ_VARIABLE": read_variable,
               "ASSIGN_VARIABLE": assign_variable}[op.name]
    try:
        convert(c, op)
    except VariableError as error:
        raise UnsupportedOperator(str(error)) from None


@_converter("WHILE")
def _while(c: _Converter, op: _Operator) -> None:
    if not c.importer.keep_loops and keras_while_lstm(c, op):
        return
    options = op.options("WhileOptions")
    cond = c.importer.subgraph(options.CondSubgraphIndex())
    body = c.importer.subgraph(options.BodySubgraphIndex())
    cond_operand = c.add(OperandType(T.MODEL))
    c.model.set_operand_value_from_model(cond_operand, cond.model)
    body_operand = c.add(OperandType(T.MODEL))
    c.model.set_operand_value_from_model(body_operand, body.model)
    inputs = [c.input(i) for i in range(len(op.inputs))]
    outputs = [c.output(i) for i in range(len(op.outputs))]
    c.emit(Op.WHILE, [cond_operand, body_operand, *inputs], outputs)


@_converter("IF")
def _if(c: _Converter, op: _Operator) -> None:
    options = op.options("IfOptions")
    then_model = c.importer.subgraph(options.ThenSubgraphIndex())
    else_model = c.importer.subgraph(options.ElseSubgraphIndex())
    branches = []
    for branch in (then_model, else_model):
        operand = c.add(OperandType(T.MODEL))
        c.model.set_operand_value_from_model(operand, branch.model)
        branches.append(operand)
    inputs = [c.input(i) for i in range(1, len(op.inputs))]
    outputs = [c.output(i) for i in range(len(op.outputs))]
    c.emit(Op.IF, [c.input(0), *branches, *inputs], outputs)
