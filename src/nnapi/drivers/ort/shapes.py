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

Where an output's size depends on values (the boxes a BOX_WITH_NMS_LIMIT keeps) or on an
input whose size does, its other dimensions may still be fixed by the operation's
definition: the 4 of a box, ROI_ALIGN's output height, width and depth, a
FULLY_CONNECTED's units. ``_PARTIAL`` gives those for the few operations that pass such
sizes on (a dynamic_outputs model's NMS -> ROI_ALIGN -> RESIZE needs the RESIZE input's
height and width); the size only a run gives stays 0, as a model that declared it so.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from nnapi.codes import OperationCode
from nnapi.hal import Model, Operand, OperandLifeTime, Operation, Subgraph
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


def _merged(declared: list[int], shape: list[int]) -> list[int] | None:
    """``declared`` with its unknown dimensions taken from ``shape`` (0s where that is
    unknown too); None where the two disagree (rank, or a dimension both know)."""
    if not declared:
        return list(shape)
    if len(declared) != len(shape) or any(d and s and d != s for d, s in zip(declared, shape)):
        return None
    return [d or s for d, s in zip(declared, shape)]


def _scalar(model: Model, operand: Operand) -> int | None:
    """A constant int32 / bool scalar's value, None where it is given at run time."""
    if operand.lifetime not in (L.CONSTANT_COPY, L.CONSTANT_REFERENCE):
        return None
    return int(constant_array(model, operand).reshape(-1)[0])


def _dim(operand: Operand, axis: int) -> int:
    """Dimension ``axis`` of ``operand``: 0 where unknown (its rank too)."""
    dims = operand.dimensions
    return dims[axis] if len(dims) > axis else 0


def _nms_outputs(model: Model, inputs: list[Operand]) -> list[list[int]]:
    # BOX_WITH_NMS_LIMIT: scores [n], boxes [n, 4], classes [n], batch indexes [n]
    return [[0], [0, 4], [0], [0]]


def _proposals_outputs(model: Model, inputs: list[Operand]) -> list[list[int]]:
    # GENERATE_PROPOSALS: scores [n], boxes [n, 4], batch indexes [n]
    return [[0], [0, 4], [0]]


def _roi_outputs(layout_input: int) -> Callable[[Model, list[Operand]], list[list[int]] | None]:
    """ROI_ALIGN / ROI_POOLING: [rois, height, width, depth] (NCHW: [rois, depth, height,
    width]), height and width the constants at inputs 3 and 4, depth the feature map's."""
    def outputs(model: Model, inputs: list[Operand]) -> list[list[int]] | None:
        if len(inputs) <= layout_input:
            return None
        height, width, nchw = (_scalar(model, inputs[i]) for i in (3, 4, layout_input))
        if height is None or width is None or nchw is None or height <= 0 or width <= 0:
            return None
        rois, depth = _dim(inputs[1], 0), _dim(inputs[0], 1 if nchw else 3)
        return [[rois, depth, height, width] if nchw else [rois, height, width, depth]]
    return outputs


def _fully_connected_outputs(model: Model, inputs: list[Operand]) -> list[list[int]] | None:
    # [batch, units]: the units are the weights' rows; the batch is the input's size over
    # the weights' columns, unknown with the input's
    units = _dim(inputs[1], 0)
    return [[0, units]] if units else None


def _bbox_transform_outputs(model: Model, inputs: list[Operand]) -> list[list[int]] | None:
    # AXIS_ALIGNED_BBOX_TRANSFORM: the deltas' shape [rois, classes * 4]
    return [list(inputs[1].dimensions)] if len(inputs[1].dimensions) == 2 else None


#: per operation: from the model and the input operands (some of unknown size), each
#: output's dimensions that do not depend on those sizes (0 for those that do); None
#: where the inputs do not fix them
_PARTIAL: dict[OperationCode, Callable[[Model, list[Operand]], list[list[int]] | None]] = {
    OperationCode.BOX_WITH_NMS_LIMIT: _nms_outputs,
    OperationCode.GENERATE_PROPOSALS: _proposals_outputs,
    OperationCode.ROI_ALIGN: _roi_outputs(9),
    OperationCode.ROI_POOLING: _roi_outputs(7),
    OperationCode.FULLY_CONNECTED: _fully_connected_outputs,
    OperationCode.AXIS_ALIGNED_BBOX_TRANSFORM: _bbox_transform_outputs,
}


def _fill_partially(model: Model, operands: list[Operand], operation: Operation, code: OperationCode,
                    unknown: list[int]) -> bool:
    """Give the ``unknown`` outputs of ``operation`` the dimensions _PARTIAL fixes (in
    ``operands``); whether any changed."""
    partial = _PARTIAL.get(code)
    dims = partial(model, [operands[i] for i in operation.inputs]) if partial is not None else None
    if dims is None or len(dims) != len(operation.outputs):
        return False
    changed = False
    for index, shape in zip(operation.outputs, dims):
        merged = _merged(operands[index].dimensions, shape)
        if index in unknown and merged is not None and merged != operands[index].dimensions:
            operands[index] = dataclasses.replace(operands[index], dimensions=merged)
            changed = True
    return changed


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
        if not unknown:
            continue
        try:
            code = OperationCode(operation.type)
        except ValueError:
            continue
        shapes = None
        if all(_known(operands[i]) for i in operation.inputs if operands[i].lifetime != L.NO_VALUE):
            shapes = prepared_shapes(code, [_tensor(model, operands[i], run_time) for i in operation.inputs],
                                     [operands[i].operand_type() for i in operation.outputs],
                                     model.relax_computation_float32_to_float16)
        if shapes is None or len(shapes) != len(operation.outputs):
            # a size only a run gives (None: left unknown), the others where _PARTIAL has them
            changed |= _fill_partially(model, operands, operation, code, unknown)
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
