"""Static shapes of temporaries declared with unknown dimensions: a HAL rewrite before
lowering to ONNX.

A model may declare its temporaries with unknown dimensions (0s: Android's dynamic output
shapes), leaving the runtime to find them at execution. ONNX graphs can carry such values,
but many lowerings need a shape while building the graph (SAME padding from the input's
size, a filter's kernel, a depth multiplier's channels). Where an operation's inputs all
have known shapes and the shape of its outputs does not depend on values computed at run
time, that shape is known before the model runs: it is what the reference's own ``prepare``
(the one place each operation's output shape is defined) computes from those shapes and
the constants. Those temporaries get their shapes here, in order, so they propagate; the
model's inputs and outputs keep their declarations (the request gives and receives them).
"""

from __future__ import annotations

import dataclasses

from nnapi.codes import OperationCode
from nnapi.hal import Model, Operand, OperandLifeTime, Subgraph
from nnapi.hal.types import constant_array
from nnapi.operand import TENSOR_TYPES
from nnapi.operations import Tensor, prepared_shapes
from nnapi.operations.base import RunTimeValue

L = OperandLifeTime


def _known(operand: Operand) -> bool:
    if operand.type not in TENSOR_TYPES:
        return True
    return bool(operand.dimensions) and all(d > 0 for d in operand.dimensions)


def _tensor(model: Model, operand: Operand, run_time: RunTimeValue) -> Tensor:
    if operand.lifetime == L.NO_VALUE:
        value = None
    elif operand.lifetime in (L.CONSTANT_COPY, L.CONSTANT_REFERENCE):
        value = constant_array(model, operand)
    else:
        value = run_time
    shape = tuple(operand.dimensions) if operand.type in TENSOR_TYPES else ()
    return Tensor(operand.type, shape, operand.scale, operand.zero_point, operand.channel_quant, value)


def _agrees(shape: tuple[int, ...], declared: list[int]) -> bool:
    if declared and len(shape) != len(declared):
        return False
    return all(d == 0 or d == s for d, s in zip(declared, shape))


def infer_temporary_shapes(model: Model) -> Model:
    """``model`` with the temporaries of its main subgraph whose shapes its reference
    ``prepare`` gives from known input shapes and constants declared with those shapes
    (a copy; the operations are the same objects). ``model`` itself where none changes."""
    subgraph = model.main
    operands = list(subgraph.operands)
    run_time = RunTimeValue()
    changed = False
    for operation in subgraph.operations:
        unknown = [i for i in operation.outputs
                   if operands[i].lifetime == L.TEMPORARY_VARIABLE and not _known(operands[i])]
        if not unknown or not all(_known(operands[i]) for i in operation.inputs
                                  if operands[i].lifetime != L.NO_VALUE):
            continue
        try:
            code = OperationCode(operation.type)
        except ValueError:
            continue
        shapes = prepared_shapes(code, [_tensor(model, operands[i], run_time) for i in operation.inputs],
                                 [operands[i].operand_type() for i in operation.outputs],
                                 model.relax_computation_float32_to_float16)
        if shapes is None or len(shapes) != len(operation.outputs):  # (None: left unknown)
            continue
        for index, shape in zip(operation.outputs, shapes):
            operand = operands[index]
            if index in unknown and shape and all(d > 0 for d in shape) and _agrees(shape, operand.dimensions):
                operands[index] = dataclasses.replace(operand, dimensions=list(shape))
                changed = True
    if not changed:
        return model
    main = Subgraph(operands, subgraph.operations, subgraph.input_indexes, subgraph.output_indexes)
    return dataclasses.replace(model, main=main)
