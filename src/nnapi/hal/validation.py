"""Checks every driver applies to the HAL objects it receives (after Android's
ValidateHal): indexes in range, lifetimes and locations consistent, requests well formed."""

from __future__ import annotations

import math

from nnapi.codes import OperandCode, OperationCode
from nnapi.hal.types import (
    BufferToken,
    ErrorStatus,
    HalError,
    Model,
    OperandLifeTime,
    Request,
    Subgraph,
    is_extension_type,
    pool_view,
)
from nnapi.operand import dtype_of, is_tensor

L = OperandLifeTime
_OPERAND_CODES = frozenset(int(c) for c in OperandCode)
_OPERATION_CODES = frozenset(int(c) for c in OperationCode)


def _invalid(message: str) -> HalError:
    return HalError(ErrorStatus.INVALID_ARGUMENT, message)


def _pool_size(pool) -> int:
    return pool_view(pool).nbytes


def validate_model(model: Model) -> None:
    """Raise HalError(INVALID_ARGUMENT) if ``model`` is malformed."""
    for name, subgraph in [("main", model.main)] + [(f"referenced[{i}]", s) for i, s in enumerate(model.referenced)]:
        _validate_subgraph(name, subgraph, model)


def _validate_subgraph(name: str, subgraph: Subgraph, model: Model) -> None:
    count = len(subgraph.operands)
    inputs, outputs = list(subgraph.input_indexes), list(subgraph.output_indexes)
    for index in inputs + outputs:
        if not isinstance(index, int) or not 0 <= index < count:
            raise _invalid(f"{name}: model input/output {index} out of range")
    if len(set(inputs)) != len(inputs) or len(set(outputs)) != len(outputs):
        raise _invalid(f"{name}: an operand is listed twice among the inputs or outputs")
    input_set, output_set = set(inputs), set(outputs)
    for index, operand in enumerate(subgraph.operands):
        where = f"{name} operand {index}"
        location = operand.location
        lifetime = operand.lifetime
        if not is_extension_type(operand.type) and int(operand.type) not in _OPERAND_CODES:
            raise _invalid(f"{where}: unknown operand type {operand.type}")
        if any(not isinstance(d, int) or d < 0 for d in operand.dimensions):
            raise _invalid(f"{where}: bad dimensions {operand.dimensions}")
        if (lifetime == L.SUBGRAPH_INPUT) != (index in input_set):
            raise _invalid(f"{where}: lifetime {lifetime.name} disagrees with the subgraph's input list")
        if (lifetime == L.SUBGRAPH_OUTPUT) != (index in output_set):
            raise _invalid(f"{where}: lifetime {lifetime.name} disagrees with the subgraph's output list")
        if lifetime == L.CONSTANT_COPY:
            if location.pool_index != 0 or location.offset + location.length > len(model.operand_values):
                raise _invalid(f"{where}: value outside the constant blob")
            _check_length(where, operand)
        elif lifetime == L.CONSTANT_REFERENCE:
            if not 0 <= location.pool_index < len(model.pools):
                raise _invalid(f"{where}: pool {location.pool_index} does not exist")
            if location.offset + location.length > _pool_size(model.pools[location.pool_index]):
                raise _invalid(f"{where}: value outside its pool")
            _check_length(where, operand)
        elif lifetime == L.SUBGRAPH:
            if not 0 <= location.offset < len(model.referenced):
                raise _invalid(f"{where}: referenced subgraph {location.offset} does not exist")
        elif (location.pool_index, location.offset, location.length) != (0, 0, 0):
            raise _invalid(f"{where}: a {lifetime.name} operand must have no location")
    # Every operand an operation reads must exist by then (this also rules out cycles);
    # every operand is written once, and only temporaries and outputs are written.
    known = {i for i, o in enumerate(subgraph.operands) if o.lifetime not in (L.TEMPORARY_VARIABLE,
                                                                               L.SUBGRAPH_OUTPUT)}
    written: set[int] = set()
    for position, operation in enumerate(subgraph.operations):
        where = f"{name} operation {position}"
        if not is_extension_type(operation.type) and int(operation.type) not in _OPERATION_CODES:
            raise _invalid(f"{where}: unknown operation type {operation.type}")
        for index in list(operation.inputs) + list(operation.outputs):
            if not isinstance(index, int) or not 0 <= index < count:
                raise _invalid(f"{where}: operand {index} out of range")
        for index in operation.inputs:
            if index not in known:
                raise _invalid(f"{where}: operand {index} is read before it is written")
        for index in operation.outputs:
            if subgraph.operands[index].lifetime not in (L.TEMPORARY_VARIABLE, L.SUBGRAPH_OUTPUT):
                raise _invalid(f"{where}: output operand {index} is a "
                               f"{subgraph.operands[index].lifetime.name}, not a temporary or output")
            if index in written:
                raise _invalid(f"{where}: operand {index} is written twice")
            written.add(index)
            known.add(index)
    for index, operand in enumerate(subgraph.operands):
        if operand.lifetime in (L.TEMPORARY_VARIABLE, L.SUBGRAPH_OUTPUT) and index not in written:
            raise _invalid(f"{name} operand {index}: a {operand.lifetime.name} no operation writes")


def _check_length(where: str, operand) -> None:
    """A constant's location holds exactly its value (when its size is known)."""
    if is_extension_type(operand.type) or (operand.dimensions and 0 in operand.dimensions):
        return
    code = OperandCode(operand.type)
    if code == OperandCode.MODEL:
        return
    if is_tensor(code) and not operand.dimensions:
        return
    size = dtype_of(code).itemsize * (math.prod(operand.dimensions) if operand.dimensions else 1)
    if operand.location.length != size:
        raise _invalid(f"{where}: constant of {size} bytes has a location of {operand.location.length}")


def validate_request(request: Request, model: Model) -> None:
    """Raise HalError(INVALID_ARGUMENT) if ``request`` does not fit ``model``."""
    main = model.main
    if len(request.inputs) != len(main.input_indexes) or len(request.outputs) != len(main.output_indexes):
        raise _invalid("request has the wrong number of inputs or outputs")
    pools = request.pools
    views: dict[int, memoryview] = {}  # each pool viewed once
    for kind, arguments, indexes in (("input", request.inputs, main.input_indexes),
                                     ("output", request.outputs, main.output_indexes)):
        for position, (argument, operand_index) in enumerate(zip(arguments, indexes, strict=True)):
            if argument.has_no_value:
                continue
            location = argument.location
            pool_index = location.pool_index
            if not 0 <= pool_index < len(pools):
                raise _invalid(f"{kind} {position}: pool {pool_index} does not exist")
            pool = pools[pool_index]
            if not isinstance(pool, BufferToken):  # device memory: its device checks the location
                view = views.get(pool_index)
                if view is None:
                    view = views[pool_index] = pool_view(pool)
                if location.offset + location.length > view.nbytes:
                    raise _invalid(f"{kind} {position}: argument outside its pool")
                if kind == "output" and view.readonly:
                    raise _invalid(f"output {position}: its pool is read-only")
            dimensions = argument.dimensions
            if dimensions:
                declared = main.operands[operand_index].dimensions
                if declared and dimensions != declared and (len(dimensions) != len(declared) or any(
                        d and a != d for a, d in zip(dimensions, declared, strict=True))):
                    raise _invalid(f"{kind} {position}: dimensions {dimensions} contradict the "
                                   f"model's {declared}")
