"""Checks every driver applies to the HAL objects it receives, after Android's ValidateHal
(what VTS's ValidateModel / ValidateRequest mutate and expect rejected): operand types,
lifetimes and locations, pools and offsets in range, every operand written once before it
is read (so no cycles), consistent input/output lists, no subgraph reference cycles, and
requests that fit the model. Every failure is HalError(INVALID_ARGUMENT) naming the
subgraph, operand, operation or argument — never a raw exception."""

from __future__ import annotations

from numbers import Integral

from nnapi.codes import OperandCode, OperationCode
from nnapi.errors import NnapiError
from nnapi.hal.types import (
    BufferToken,
    DataLocation,
    ErrorStatus,
    FdPool,
    HalError,
    Model,
    Operand,
    OperandLifeTime,
    Request,
    Subgraph,
    is_extension_type,
    pool_view,
)
from nnapi.operand import TENSOR_TYPES, OperandType, validate_channel_quant, validate_operand_type

L = OperandLifeTime
_UINT32_MAX = 0xFFFFFFFF
#: Lifetimes whose value is not stored anywhere: their location must be all zeros.
_NO_LOCATION = (L.TEMPORARY_VARIABLE, L.SUBGRAPH_INPUT, L.SUBGRAPH_OUTPUT, L.NO_VALUE)
#: Operands an operation may read without another operation writing them first.
_READABLE = (L.SUBGRAPH_INPUT, L.CONSTANT_COPY, L.CONSTANT_REFERENCE, L.NO_VALUE, L.SUBGRAPH)


def _invalid(message: str) -> HalError:
    return HalError(ErrorStatus.INVALID_ARGUMENT, message)


def _pool_size(pool, where: str) -> int:
    try:
        return pool_view(pool).nbytes
    except HalError as error:
        raise _invalid(f"{where}: {error}") from None


def _is_index(value) -> bool:
    if isinstance(value, int):  # ints and their enums first: the abstract Integral check costs more
        return value.__class__ is not bool
    return isinstance(value, Integral)


def _valid_location(location: DataLocation) -> bool:
    return _u32(location.pool_index) and _u32(location.offset) and _u32(location.length)


#: the codes and lifetimes by value: a dict lookup where the enums' own call costs ~1 us,
#: for each of a model's operands
_OPERAND_CODES = {int(code): code for code in OperandCode}
_LIFETIMES = {int(lifetime): lifetime for lifetime in L}


def validate_model(model: Model) -> None:
    """Raise HalError(INVALID_ARGUMENT) if ``model`` is malformed (Android's validateModel)."""
    try:
        prefixes = {entry.prefix for entry in model.extension_name_to_prefix}
        pool_sizes = [_pool_size(pool, f"model pool {i}") for i, pool in enumerate(model.pools)]
        subgraphs = [("main", model.main)] + [(f"referenced[{i}]", s) for i, s in enumerate(model.referenced)]
        for name, subgraph in subgraphs:
            _validate_subgraph(name, subgraph, model, pool_sizes, prefixes)
        _check_reference_cycles(model)
    except (TypeError, ValueError, AttributeError, IndexError, KeyError, OverflowError) as error:
        # a field of the wrong kind that the checks above did not anticipate
        raise _invalid(f"malformed model: {type(error).__name__}: {error}") from None


def _checked_type(where: str, operand: Operand, code: OperandCode, checked: dict) -> OperandType:
    """The operand's OperandType, checked by the NDK's rules (and its per-channel
    parameters by theirs): once per distinct type in a subgraph (``checked``, by its
    fields; most of a model's operands are a few kinds of scalars)."""
    try:
        key = (operand.type, tuple(operand.dimensions), operand.scale, operand.zero_point, id(operand.channel_quant))
        known = checked.get(key)
    except TypeError:  # a field of the wrong kind: the checks below say which
        key = known = None
    if known is not None:
        return known
    try:
        op_type = operand.operand_type()
        validate_operand_type(op_type, where)  # the NDK's rules, its size within uint32 among them
        if code == OperandCode.TENSOR_QUANT8_SYMM_PER_CHANNEL:
            if operand.channel_quant is None:
                raise _invalid(f"{where}: TENSOR_QUANT8_SYMM_PER_CHANNEL without per-channel parameters")
            validate_channel_quant(op_type, operand.channel_quant, where)
    except NnapiError as error:
        raise _invalid(str(error)) from None
    except (TypeError, ValueError) as error:
        raise _invalid(f"{where}: malformed operand ({error})") from None
    if key is not None:
        checked[key] = op_type
    return op_type


def _validate_operand(where: str, operand: Operand, model: Model, pool_sizes: list[int],
                      prefixes: set[int], checked: dict | None = None) -> None:
    if not (_u32(operand.type) and _u32(operand.lifetime) and _u32(operand.number_of_consumers)):
        for field_name in ("type", "lifetime", "number_of_consumers"):
            value = getattr(operand, field_name)
            if not _is_index(value) or not 0 <= value <= _UINT32_MAX:
                raise _invalid(f"{where}: {field_name} {value!r} is not an unsigned 32-bit integer")
    extension = is_extension_type(operand.type)
    if extension:
        if operand.type >> 16 not in prefixes:
            raise _invalid(f"{where}: extension operand type {operand.type:#x} has an unknown prefix")
    else:
        code = _OPERAND_CODES.get(operand.type)
        if code is None:
            raise _invalid(f"{where}: unknown operand type {operand.type}")
        op_type = _checked_type(where, operand, code, {} if checked is None else checked)
    lifetime, location = operand.lifetime, operand.location
    if (known := _LIFETIMES.get(lifetime)) is None:
        raise _invalid(f"{where}: unknown lifetime {lifetime}")
    lifetime = known
    if not _valid_location(location):
        raise _invalid(f"{where}: location {location} is not three unsigned 32-bit values")
    if lifetime in _NO_LOCATION:
        if (location.pool_index, location.offset, location.length) != (0, 0, 0):
            raise _invalid(f"{where}: a {lifetime.name} operand must have an empty location, got {location}")
    elif lifetime in (L.CONSTANT_COPY, L.CONSTANT_REFERENCE):
        if lifetime == L.CONSTANT_COPY:
            if location.pool_index != 0:
                raise _invalid(f"{where}: CONSTANT_COPY with pool index {location.pool_index} (must be 0)")
            if location.offset + location.length > len(model.operand_values):
                raise _invalid(f"{where}: CONSTANT_COPY value at {location.offset}+{location.length} is outside "
                               f"operand_values ({len(model.operand_values)} bytes)")
        else:
            if location.pool_index >= len(pool_sizes):
                raise _invalid(f"{where}: CONSTANT_REFERENCE pool {location.pool_index} does not exist "
                               f"({len(pool_sizes)} pools)")
            if location.offset + location.length > pool_sizes[location.pool_index]:
                raise _invalid(f"{where}: CONSTANT_REFERENCE value at {location.offset}+{location.length} is "
                               f"outside pool {location.pool_index} ({pool_sizes[location.pool_index]} bytes)")
        if not extension:
            if op_type is None:  # not reached: a non-extension operand's type was made above
                op_type = operand.operand_type()
            if op_type.type == OperandCode.MODEL:
                raise _invalid(f"{where}: a MODEL operand must have lifetime SUBGRAPH")
            # A constant's location holds exactly its value, whose dimensions are known
            # (set_operand_value refuses unspecified ones; a driver shapes the bytes by them).
            if not op_type.is_fully_specified:
                raise _invalid(f"{where}: constant of {op_type.describe()} has unspecified dimensions")
            if location.length != op_type.byte_size():
                raise _invalid(f"{where}: constant length {location.length} is not the {op_type.byte_size()} "
                               f"bytes of {op_type.describe()}")
    elif lifetime == L.SUBGRAPH:
        if operand.type != OperandCode.MODEL:
            raise _invalid(f"{where}: a SUBGRAPH operand must be of type MODEL")
        if location.pool_index != 0 or location.length != 0:
            raise _invalid(f"{where}: a SUBGRAPH operand's location must be (0, index, 0), got {location}")
        if location.offset >= len(model.referenced):
            raise _invalid(f"{where}: referenced subgraph {location.offset} does not exist "
                           f"({len(model.referenced)} referenced)")
    else:  # a lifetime the HAL does not carry across (Android's POINTER)
        raise _invalid(f"{where}: lifetime {lifetime.name} is not allowed in a HAL model")
    if operand.type == OperandCode.MODEL and lifetime != L.SUBGRAPH:
        raise _invalid(f"{where}: a MODEL operand must have lifetime SUBGRAPH, not {lifetime.name}")


def _validate_subgraph(name: str, subgraph: Subgraph, model: Model, pool_sizes: list[int],
                       prefixes: set[int]) -> None:
    operands = subgraph.operands
    count = len(operands)
    checked: dict = {}
    for index, operand in enumerate(operands):
        _validate_operand(f"{name} operand {index}", operand, model, pool_sizes, prefixes, checked)

    consumers = [0] * count
    written = [False] * count
    for position, operation in enumerate(subgraph.operations):
        if not _is_index(operation.type) or not 0 <= operation.type <= _UINT32_MAX:
            raise _invalid(f"{name} operation {position}: type {operation.type!r} is not an unsigned 32-bit integer")
        try:
            what = f"{name} operation {position} ({OperationCode(operation.type).name})"
        except ValueError:
            if not is_extension_type(operation.type):
                raise _invalid(f"{name} operation {position}: unknown operation type {operation.type}") from None
            if operation.type >> 16 not in prefixes:
                raise _invalid(f"{name} operation {position}: extension operation type {operation.type:#x} "
                               f"has an unknown prefix") from None
            what = f"{name} operation {position} (extension {operation.type:#x})"
        for index in list(operation.inputs) + list(operation.outputs):
            if not _is_index(index) or not 0 <= index < count:
                raise _invalid(f"{what}: operand {index} out of range ({count} operands)")
        for index in operation.inputs:
            consumers[index] += 1
            if operands[index].lifetime not in _READABLE and not written[index]:
                raise _invalid(f"{what}: operand {index} is read before it is written "
                               f"(operations out of order or in a cycle)")
        for index in operation.outputs:
            lifetime = operands[index].lifetime
            if lifetime not in (L.TEMPORARY_VARIABLE, L.SUBGRAPH_OUTPUT):
                raise _invalid(f"{what}: output operand {index} has lifetime {L(lifetime).name}; only "
                               f"TEMPORARY_VARIABLE or SUBGRAPH_OUTPUT operands can be written")
            if written[index]:
                raise _invalid(f"{what}: operand {index} is written by more than one operation")
            written[index] = True
    for index, operand in enumerate(operands):
        if operand.lifetime in (L.TEMPORARY_VARIABLE, L.SUBGRAPH_OUTPUT) and not written[index]:
            raise _invalid(f"{name} operand {index}: {L(operand.lifetime).name} operand is never written")
        if operand.number_of_consumers != consumers[index]:
            raise _invalid(f"{name} operand {index}: number_of_consumers {operand.number_of_consumers} but "
                           f"{consumers[index]} operations read it")

    for kind, indexes, lifetime in (("input", subgraph.input_indexes, L.SUBGRAPH_INPUT),
                                    ("output", subgraph.output_indexes, L.SUBGRAPH_OUTPUT)):
        for position, index in enumerate(indexes):
            if not _is_index(index) or not 0 <= index < count:
                raise _invalid(f"{name} {kind} {position}: operand {index} out of range ({count} operands)")
            if operands[index].lifetime != lifetime:
                raise _invalid(f"{name} {kind} {position}: operand {index} has lifetime "
                               f"{L(operands[index].lifetime).name}, not {lifetime.name}")
        if len(set(indexes)) != len(indexes):
            raise _invalid(f"{name}: an operand is listed twice among the {kind}s {list(indexes)}")
        listed = set(indexes)
        for index, operand in enumerate(operands):
            if operand.lifetime == lifetime and index not in listed:
                raise _invalid(f"{name} operand {index}: a {lifetime.name} operand missing from the {kind}s")


def _check_reference_cycles(model: Model) -> None:
    """A subgraph may not (transitively) reference itself: IF/WHILE would never end."""
    edges = [sorted({o.location.offset for o in s.operands if o.lifetime == L.SUBGRAPH})
             for s in model.referenced]
    main_refs = sorted({o.location.offset for o in model.main.operands if o.lifetime == L.SUBGRAPH})
    state = [0] * len(model.referenced)  # 0 unvisited, 1 on the path, 2 done

    def visit(index: int) -> None:
        if state[index] == 1:
            raise _invalid(f"referenced[{index}] references itself through its subgraph operands (a cycle)")
        if state[index] == 2:
            return
        state[index] = 1
        for target in edges[index]:
            visit(target)
        state[index] = 2

    for index in main_refs + list(range(len(model.referenced))):
        visit(index)


def validate_request(request: Request, model: Model) -> None:
    """Raise HalError(INVALID_ARGUMENT) if ``request`` does not fit ``model`` (Android's
    validateRequest): argument counts, pool indexes, offsets and lengths inside their pool,
    dimensions consistent with the model, no-value arguments with an empty location, and
    output pools writable."""
    try:
        _validate_request(request, model)
    except (TypeError, ValueError, AttributeError, IndexError, KeyError, OverflowError) as error:
        raise _invalid(f"malformed request: {type(error).__name__}: {error}") from None


#: the classes of the values most fields hold (the HAL's own enums are ints)
_PLAIN_INTS = frozenset({int, OperandCode, OperationCode, L})


def _u32(value) -> bool:
    """An unsigned 32-bit integer (plain ints and the HAL's enums first: this runs for
    every argument)."""
    if type(value) in _PLAIN_INTS:
        return 0 <= value <= _UINT32_MAX
    return _is_index(value) and 0 <= value <= _UINT32_MAX


def _where(kind: str, indexes):
    """Names an argument in a message (built only for a failure)."""
    return lambda position: f"{kind} {position} (operand {indexes[position]})"


def _validate_request(request: Request, model: Model) -> None:
    # Runs on every execution: the common case costs a few attribute reads per argument,
    # and messages are only built for a failure.
    main = model.main
    if len(request.inputs) != len(main.input_indexes):
        raise _invalid(f"request has {len(request.inputs)} inputs, the model {len(main.input_indexes)}")
    if len(request.outputs) != len(main.output_indexes):
        raise _invalid(f"request has {len(request.outputs)} outputs, the model {len(main.output_indexes)}")
    pools = request.pools
    # per pool: (size, writable); None for device memory (its device checks the location)
    facts: list[tuple[int, bool] | None] = []
    for index, pool in enumerate(pools):
        if isinstance(pool, BufferToken):
            facts.append(None)
            continue
        try:
            view = pool_view(pool)
        except HalError as error:
            raise _invalid(f"request pool {index}: {error}") from None
        facts.append((view.nbytes, pool.writable if isinstance(pool, FdPool) else not view.readonly))
    operands = main.operands
    for kind, arguments, indexes in (("input", request.inputs, main.input_indexes),
                                     ("output", request.outputs, main.output_indexes)):
        at = _where(kind, indexes)
        for position, argument in enumerate(arguments):
            location = argument.location
            pool_index, offset, length = location.pool_index, location.offset, location.length

            if not (_u32(pool_index) and _u32(offset) and _u32(length)):
                raise _invalid(f"{at(position)}: location {location} is not three unsigned 32-bit values")
            dimensions = argument.dimensions
            if dimensions:
                if not all(_u32(d) for d in dimensions):
                    raise _invalid(f"{at(position)}: dimensions {dimensions!r} must be unsigned 32-bit integers")
            if argument.has_no_value:
                if pool_index or offset or length or dimensions:
                    raise _invalid(f"{at(position)}: an argument with no value must have an empty location and "
                                   f"no dimensions")
                continue
            if pool_index >= len(pools):
                raise _invalid(f"{at(position)}: pool {pool_index} does not exist ({len(pools)} pools)")
            fact = facts[pool_index]
            if fact is not None:
                if offset + length > fact[0]:
                    raise _invalid(f"{at(position)}: {offset}+{length} bytes are outside pool {pool_index} "
                                   f"({fact[0]} bytes)")
                if kind == "output" and not fact[1]:
                    raise _invalid(f"{at(position)}: pool {pool_index} is read-only")
            if dimensions:
                operand = operands[indexes[position]]
                declared = operand.dimensions
                if operand.type not in TENSOR_TYPES and not is_extension_type(operand.type):
                    raise _invalid(f"{at(position)}: a scalar takes no dimensions, got {list(dimensions)}")
                if declared and dimensions != declared and (len(dimensions) != len(declared) or any(
                        d and a != d for a, d in zip(dimensions, declared, strict=True))):
                    raise _invalid(f"{at(position)}: dimensions {list(dimensions)} contradict the model's "
                                   f"{list(declared)}")
