"""Checks every driver applies to the HAL objects it receives (after Android's
ValidateHal): indexes in range, lifetimes and locations consistent, requests well formed."""

from __future__ import annotations

from nnapi.hal.types import ErrorStatus, HalError, Model, OperandLifeTime, Request, Subgraph, pool_view

L = OperandLifeTime


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
    for index, operand in enumerate(subgraph.operands):
        where = f"{name} operand {index}"
        location = operand.location
        if operand.lifetime == L.CONSTANT_COPY:
            if location.offset + location.length > len(model.operand_values):
                raise _invalid(f"{where}: value outside the constant blob")
        elif operand.lifetime == L.CONSTANT_REFERENCE:
            if not 0 <= location.pool_index < len(model.pools):
                raise _invalid(f"{where}: pool {location.pool_index} does not exist")
            if location.offset + location.length > _pool_size(model.pools[location.pool_index]):
                raise _invalid(f"{where}: value outside its pool")
        elif operand.lifetime == L.SUBGRAPH:
            if not 0 <= location.offset < len(model.referenced):
                raise _invalid(f"{where}: referenced subgraph {location.offset} does not exist")
    for position, operation in enumerate(subgraph.operations):
        for index in list(operation.inputs) + list(operation.outputs):
            if not 0 <= index < count:
                raise _invalid(f"{name} operation {position}: operand {index} out of range")
    for index in list(subgraph.input_indexes) + list(subgraph.output_indexes):
        if not 0 <= index < count:
            raise _invalid(f"{name}: model input/output {index} out of range")


def validate_request(request: Request, model: Model) -> None:
    """Raise HalError(INVALID_ARGUMENT) if ``request`` does not fit ``model``."""
    main = model.main
    if len(request.inputs) != len(main.input_indexes) or len(request.outputs) != len(main.output_indexes):
        raise _invalid("request has the wrong number of inputs or outputs")
    for kind, arguments, indexes in (("input", request.inputs, main.input_indexes),
                                     ("output", request.outputs, main.output_indexes)):
        for position, (argument, operand_index) in enumerate(zip(arguments, indexes, strict=True)):
            if argument.has_no_value:
                continue
            location = argument.location
            if not 0 <= location.pool_index < len(request.pools):
                raise _invalid(f"{kind} {position}: pool {location.pool_index} does not exist")
            if location.offset + location.length > _pool_size(request.pools[location.pool_index]):
                raise _invalid(f"{kind} {position}: argument outside its pool")
            declared = main.operands[operand_index].dimensions
            if argument.dimensions and declared:
                if len(argument.dimensions) != len(declared) or any(
                        d and a != d for a, d in zip(argument.dimensions, declared, strict=True)):
                    raise _invalid(f"{kind} {position}: dimensions {argument.dimensions} contradict the "
                                   f"model's {declared}")
