"""Partitioning and the execution plan every compilation produces.

Each operation goes to the device that supports it and reports the best performance
for it under the compilation's preference (the reference CPU device supports everything
it implements). Consecutive operations on one device form a step. A plan with one step
covering the whole model hands requests straight to that step's prepared model (Android's
``becomeSingleStep``); a plan with several steps runs them in order, binding model inputs
and outputs to the caller's buffers and intermediate values to runtime-owned buffers —
the runtime moves bytes, the devices compute, and each driver checks its own outputs'
sizes (so output sufficiency is decided in one place: the driver).

A device that reports what a step on it costs (``Capabilities.step_cost_s``, measured by
its driver) has its small islands weighed: a run of light operations between steps of
another device that supports them moves there when the steps saved cost more than the
operations lose (keep_islands_with_neighbours).

A device is only given what its feature level covers (Android's ``compliantWithV1_*``):
operations, operand types and HAL features newer than the device are not sent to it.

CPU fallback (only for a compilation that did not name its devices): a step whose device
fails to prepare moves to ``nnapi-reference``; an execution that fails on another device
with anything but a deadline or output-size error is re-run on ``nnapi-reference``.
"""

from __future__ import annotations

import contextlib
import math
import os
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from nnapi import tracing, vlog
from nnapi.codes import (
    FeatureLevelCode,
    OperandCode,
    OperationCode,
    operand_type_introduced_in,
    operation_introduced_in,
)
from nnapi.errors import BadDataError
from nnapi.hal import (
    DataLocation,
    ErrorStatus,
    ExecutionPreference,
    HalError,
    IBurst,
    IDevice,
    IExecution,
    IPreparedModel,
    Model,
    Operand,
    OperandLifeTime,
    Operation,
    OutputShape,
    PerformanceInfo,
    Priority,
    Request,
    RequestArgument,
    Subgraph,
    Timing,
)
from nnapi.hal.interfaces import IFencedExecutionCallback, _DoneCallback, wait_for_fences
from nnapi.hal.types import NO_TIMING, extension_prefix, is_extension_type, operation_name
from nnapi.operand import TENSOR_TYPES, dtype_of, is_tensor, value_byte_size
from nnapi.runtime.capabilities import of as device_capabilities
from nnapi.runtime.device_memory import DeviceMemoryPool, execute_on, needs_staging, staged

L = OperandLifeTime
_UNTRACED = contextlib.nullcontext()  # what a step runs in when tracing is off (reusable)
F = FeatureLevelCode

#: Errors an execution is not retried on the CPU for: the caller must act on them.
_NO_FALLBACK = frozenset({ErrorStatus.OUTPUT_INSUFFICIENT_SIZE, ErrorStatus.MISSED_DEADLINE_TRANSIENT,
                          ErrorStatus.MISSED_DEADLINE_PERSISTENT})
#: How often a step is run again with the temporary output sizes its driver reported
#: (OUTPUT_INSUFFICIENT_SIZE) before the plan gives up: a driver whose reported sizes keep
#: changing would otherwise loop forever.
_STEP_OUTPUT_SIZE_ATTEMPTS = 3
#: The performance of an operation without inputs (no operand type to rate it by): equal
#: on every device, so the device order decides.
_SAME_FOR_EVERY_DEVICE = 1.0


# --- feature levels ---------------------------------------------------------------------
def _operand_level(operand: Operand) -> F:
    code = operand.type
    if is_extension_type(code):
        return F.FEATURE_LEVEL_3
    level = operand_type_introduced_in(code)
    # Unknown dimensions of a model input or output, or an unknown rank anywhere, arrived
    # with HAL 1.2 (dynamic output shapes).
    if is_tensor(code) and operand.lifetime in (L.SUBGRAPH_INPUT, L.SUBGRAPH_OUTPUT, L.TEMPORARY_VARIABLE):
        if not operand.dimensions or (operand.lifetime != L.TEMPORARY_VARIABLE and 0 in operand.dimensions):
            level = max(level, F.FEATURE_LEVEL_3)
    return level


def operation_feature_level(model: Model, subgraph: Subgraph, operation: Operation) -> F:
    """The lowest feature level a device needs to be given ``operation``."""
    if is_extension_type(operation.type):
        level = F.FEATURE_LEVEL_3
    else:
        level = operation_introduced_in(operation.type)
    for index in list(operation.inputs) + list(operation.outputs):
        if 0 <= index < len(subgraph.operands):
            operand = subgraph.operands[index]
            level = max(level, _operand_level(operand))
            if model.relax_computation_float32_to_float16 and operand.type in (
                    OperandCode.TENSOR_FLOAT32, OperandCode.FLOAT32):
                level = max(level, F.FEATURE_LEVEL_2)
    return level


def _level_of(device: IDevice) -> int:
    try:
        return int(device.feature_level)
    except Exception:  # a driver's broken attribute: treat it as the oldest level
        return int(F.FEATURE_LEVEL_1)


def _extension_names(device: IDevice) -> set[str]:
    try:
        return {extension.name for extension in device.get_supported_extensions()}
    except Exception:
        return set()


def _missing_extension(model: Model, operation: Operation, subgraph: Subgraph, names: set[str]) -> str | None:
    """The name of an extension ``operation`` uses (its type or an operand's) that is not
    among ``names``; None when it needs none missing."""
    prefixes = {entry.prefix: entry.name for entry in model.extension_name_to_prefix}
    types = [operation.type] + [subgraph.operands[i].type for i in list(operation.inputs) + list(operation.outputs)
                                if 0 <= i < len(subgraph.operands)]
    for t in types:
        if is_extension_type(t):
            name = prefixes.get(extension_prefix(t))
            if name not in names:
                return name or f"with prefix {extension_prefix(t)}"
    return None


def uses_extension_operation(model: Model) -> bool:
    """True when a subgraph of ``model`` has a vendor extension operation (no CPU fallback
    can run it)."""
    return any(is_extension_type(operation.type) for subgraph in [model.main, *model.referenced]
               for operation in subgraph.operations)


# --- support queries --------------------------------------------------------------------
def _level_name(level: int) -> str:
    try:
        return F(level).name
    except ValueError:
        return f"feature level {level}"


def _ineligibility(model: Model, device: IDevice) -> list[str | None]:
    """Per main-subgraph operation, why the runtime does not even ask ``device`` about it
    (beyond its feature level, or an extension it lacks); None where it asks."""
    main = model.main
    level = _level_of(device)
    names = _extension_names(device)
    reasons: list[str | None] = []
    for operation in main.operations:
        needed = operation_feature_level(model, main, operation)
        if needed > level:
            reasons.append(f"needs {_level_name(needed)}; the device has {_level_name(level)}")
        elif (missing := _missing_extension(model, operation, main, names)) is not None:
            reasons.append(f"uses vendor extension {missing}, which the device does not support")
        else:
            reasons.append(None)
    return reasons


def _is_flag(answer: object) -> bool:
    return isinstance(answer, bool | np.bool_)


def _is_reason(answer: object) -> bool:
    return answer is None or isinstance(answer, str)


def _ask(model: Model, device: IDevice, query, failures: list[str] | None = None, valid=_is_flag,
         kind: str = "a bool") -> list:
    """``query(device, model_slice)`` for the operations ``device`` is given (see
    supported_operations), spread back over every operation; None where not asked or
    where the driver's answer is unusable -- it raised, covers another number of
    operations, or one of its answers is not ``valid`` (``kind`` names what it must be) --
    why, appended to ``failures`` when given. A driver is another party: its answer is
    checked before anything reads it (a numpy array's truth value raises, a string would
    count as "supported")."""
    main = model.main
    ineligible = _ineligibility(model, device)
    positions = [i for i, reason in enumerate(ineligible) if reason is None]
    answers: list = [None] * len(main.operations)
    if not positions:
        return answers
    sliced = model if len(positions) == len(main.operations) else slice_model(model, positions)
    try:
        flags = list(query(device, _for_level(sliced, _level_of(device))))
    except Exception as error:  # noqa: BLE001 - a driver's failure: it supports nothing
        if failures is not None:
            failures.append(str(error) or type(error).__name__)
        return answers
    if len(flags) != len(positions):
        if failures is not None:
            failures.append(f"its answer covers {len(flags)} operations, not {len(positions)}")
        return answers
    for number, flag in enumerate(flags):
        if not valid(flag):
            if failures is not None:
                failures.append(f"its answer for operation {positions[number]} is a {type(flag).__name__}, not "
                                f"{kind}")
            return answers
    for position, flag in zip(positions, flags, strict=True):
        answers[position] = flag
    return answers


def supported_operations(model: Model, device: IDevice) -> list[bool]:
    """Which main-subgraph operations ``device`` is given and supports. Operations beyond
    its feature level or using extensions it lacks are not sent: it is asked about a
    slice of the model holding only the rest. A driver's exception or malformed answer
    counts as "supports nothing"."""
    return [bool(flag) for flag in _ask(model, device, lambda d, m: d.get_supported_operations(m))]


def unsupported_reasons(model: Model, device: IDevice) -> list[str | None]:
    """Per main-subgraph operation: None where ``device`` is given it and supports it,
    else why not (the runtime's reason, or the driver's own from get_unsupported_reasons)."""
    ineligible = _ineligibility(model, device)
    asked = _ask(model, device, lambda d, m: d.get_unsupported_reasons(m), valid=_is_reason,
                 kind="a str or None")
    failures: list[str] = []
    supported = [bool(flag) for flag in _ask(model, device, lambda d, m: d.get_supported_operations(m), failures)]
    reasons: list[str | None] = []
    for position, ok in enumerate(supported):
        if ok:
            reasons.append(None)
        elif ineligible[position]:
            reasons.append(ineligible[position])
        elif failures:
            reasons.append(f"the driver could not say which operations it supports ({failures[0]})")
        else:
            reasons.append(asked[position] or "declined by the driver")
    return reasons


def _for_level(model: Model, level: int) -> Model:
    """Drop HAL features a device of ``level`` does not know."""
    if level < F.FEATURE_LEVEL_2 and model.relax_computation_float32_to_float16:
        return Model(model.main, model.referenced, model.operand_values, model.pools, False,
                     model.extension_name_to_prefix)
    return model


def _performance(device: IDevice, model: Model, operation: Operation, preference: ExecutionPreference) -> float:
    """The device's reported cost of ``operation`` (lower is better), from its capabilities
    as the runtime validated them (runtime.capabilities: every figure a number > 0;
    infinite -- the device is chosen last -- where its driver's answer did not validate)."""
    capabilities = device_capabilities(device)

    def pick(info: PerformanceInfo) -> float:
        return info.power_usage if preference == ExecutionPreference.LOW_POWER else info.exec_time

    if operation.type == OperationCode.IF:
        return pick(capabilities.if_performance)
    if operation.type == OperationCode.WHILE:
        return pick(capabilities.while_performance)
    if not operation.inputs:
        return _SAME_FOR_EVERY_DEVICE
    operand = model.main.operands[operation.inputs[0]]
    if model.relax_computation_float32_to_float16:
        if operand.type == OperandCode.TENSOR_FLOAT32:
            return pick(capabilities.relaxed_float32_to_float16_tensor)
        if operand.type == OperandCode.FLOAT32:
            return pick(capabilities.relaxed_float32_to_float16_scalar)
    return pick(capabilities.performance_for(operand.type))


def assign_devices(model: Model, devices: Sequence[IDevice],
                   preference: ExecutionPreference = ExecutionPreference.FAST_SINGLE_ANSWER) -> list[IDevice]:
    """The device of each main-subgraph operation; BAD_DATA if one has none."""
    support = [supported_operations(model, device) for device in devices]
    chosen: list[IDevice] = []
    for index, operation in enumerate(model.main.operations):
        able = [d for d, flags in zip(devices, support, strict=True) if flags[index]]
        if not able:
            names = [d.name for d in devices]
            name = operation_name(operation.type, model)
            missing = _missing_extension(model, operation, model.main, set())
            if missing is not None:
                hint = f"; none of them supports vendor extension {missing}"
            else:  # each device's reason (asked only now: this is the failure path)
                # (a driver whose second answer differs from its first gives no reason now)
                hint = "; " + "; ".join(f"{d.name}: {unsupported_reasons(model, d)[index] or 'declined by the driver'}"
                                        for d in devices)
            raise BadDataError(f"finish: no device among {names} supports operation {index} ({name}){hint}")
        # min() keeps the first of equals: the order devices were given breaks ties.
        chosen.append(min(able, key=lambda d: _performance(d, model, operation, preference)))
    supports = {id(device): flags for device, flags in zip(devices, support, strict=True)}
    return keep_islands_with_neighbours(model, chosen, supports, preference)


# --- weighing plan steps -----------------------------------------------------------------
#: The runtime's own cost of one more step (its request, the runtime-owned buffers of the
#: values crossing, one more driver call), in seconds: on the 2-core VM this was written on,
#: an ADD on nnapi-ort-cpu then a LOG on the reference takes 72-77 us as two steps against
#: 36-40 us as one reference step, of which the ORT driver's own execution is ~15 us.
RUNTIME_STEP_COST_S = 20e-6
#: Operations whose time is proportional to the bytes they touch (element-wise, data
#: movement, reductions): only islands of these are weighed, with the reference's time
#: estimated as a fixed part plus a part per byte (numpy's element-wise passes). Anything
#: else (convolutions, recurrent layers, ...) is always worth its device.
LIGHT_OPERATION_S = 5e-6
LIGHT_BYTE_S = 0.05e-9
LIGHT_OPERATIONS = frozenset(OperationCode[name] for name in (
    "ADD", "SUB", "MUL", "DIV", "MAXIMUM", "MINIMUM", "POW", "ABS", "NEG", "EXP", "LOG", "SQRT", "RSQRT", "SIN",
    "FLOOR", "RELU", "RELU1", "RELU6", "LOGISTIC", "TANH", "HARD_SWISH", "ELU", "PRELU", "CAST", "QUANTIZE",
    "DEQUANTIZE", "RESHAPE", "SQUEEZE", "EXPAND_DIMS", "TRANSPOSE", "CONCATENATION", "SPLIT", "SLICE",
    "STRIDED_SLICE", "PAD", "PAD_V2", "GATHER", "TILE", "SELECT", "EQUAL", "NOT_EQUAL", "LESS", "LESS_EQUAL",
    "GREATER", "GREATER_EQUAL", "LOGICAL_AND", "LOGICAL_OR", "LOGICAL_NOT", "ARGMAX", "ARGMIN", "MEAN",
    "REDUCE_SUM", "REDUCE_MAX", "REDUCE_MIN", "REDUCE_PROD", "REDUCE_ANY", "REDUCE_ALL", "SOFTMAX",
    "L2_NORMALIZATION", "DEPTH_TO_SPACE", "SPACE_TO_DEPTH", "CHANNEL_SHUFFLE", "FILL", "RANK", "REVERSE"))


def _step_cost(device: IDevice) -> float:
    return device_capabilities(device).step_cost_s  # validated: finite, >= 0


def _light_time(model: Model, operation: Operation) -> float | None:
    """The reference's estimated time for a light operation; None for any other (or one
    whose tensors' sizes are not all known)."""
    if operation.type not in LIGHT_OPERATIONS:
        return None
    touched = 0
    for index in (*operation.inputs, *operation.outputs):
        operand = model.main.operands[index]
        if not is_tensor(operand.type) or operand.lifetime == L.NO_VALUE:
            continue
        if not operand.dimensions or not all(operand.dimensions):
            return None
        touched += value_byte_size(operand.type, operand.dimensions)
    return LIGHT_OPERATION_S + touched * LIGHT_BYTE_S


def keep_islands_with_neighbours(model: Model, chosen: list[IDevice], supports: dict[int, list[bool]],
                                 preference: ExecutionPreference) -> list[IDevice]:
    """Move an island -- a run of consecutive operations on a device that reports a step cost
    (Capabilities.step_cost_s) -- to a neighbouring step's device where the steps that saves
    cost more than the island's operations lose there (the fused LSTM's one STRIDED_SLICE on
    nnapi-ort-cpu after the reference's LSTM: 0.55 ms split, 0.42 ms on the reference alone).
    Only islands of light operations are weighed; devices that report no step cost keep
    Android's choice of the best device per operation."""
    chosen = list(chosen)
    operations = model.main.operations
    moved = True
    while moved:
        moved = False
        runs: list[tuple[IDevice, int, int]] = []  # (device, first, end) of each step-to-be
        for index, device in enumerate(chosen):
            if runs and runs[-1][0] is device:
                runs[-1] = (device, runs[-1][1], index + 1)
            else:
                runs.append((device, index, index + 1))
        for number, (device, first, end) in enumerate(runs):
            own = _step_cost(device)
            if own == 0.0:
                continue
            times = [_light_time(model, operations[i]) for i in range(first, end)]
            if any(t is None for t in times):
                continue
            sides = [runs[n][0] for n in (number - 1, number + 1) if 0 <= n < len(runs)]
            best: tuple[float, IDevice] | None = None
            for target in dict.fromkeys(sides):  # each neighbouring device once, in order
                flags = supports.get(id(target))
                if flags is None or not all(flags[i] for i in range(first, end)):
                    continue
                merged = sides.count(target) == 2  # the steps either side become one
                saved = own + RUNTIME_STEP_COST_S + (_step_cost(target) + RUNTIME_STEP_COST_S if merged else 0.0)
                lost = sum(t * (_performance(target, model, operations[i], preference)
                                - _performance(device, model, operations[i], preference))
                           for t, i in zip(times, range(first, end), strict=True))
                if lost < saved and (best is None or saved - lost > best[0]):
                    best = (saved - lost, target)
            if best is not None:
                chosen[first:end] = [best[1]] * (end - first)
                moved = True
                break
    return chosen


# --- steps ------------------------------------------------------------------------------
#: Per output of a model or step: its dimensions as the model knows them (output_dims).
OutputDims = tuple[tuple[int, ...] | None, ...]


@dataclass
class Step:
    device: IDevice
    operations: list[int]  # indexes into the main subgraph's operations (run order)
    inputs: list[int] = field(default_factory=list)  # main-subgraph operands the step reads
    outputs: list[int] = field(default_factory=list)  # main-subgraph operands it produces for others
    model: Model | None = None
    prepared: IPreparedModel | None = None
    #: its outputs' known dimensions (output_dims), what its driver's answers must fit: set
    #: by the ExecutionPlan
    output_dims: OutputDims = ()


def partition(model: Model, devices: Sequence[IDevice],
              preference: ExecutionPreference = ExecutionPreference.FAST_SINGLE_ANSWER) -> list[Step]:
    """Steps of consecutive operations that share a device, with their HAL models. A
    single step covers the whole model and its HAL model is ``model`` itself."""
    assignment = assign_devices(model, devices, preference)
    steps: list[Step] = []
    for index, device in enumerate(assignment):
        if steps and steps[-1].device is device:
            steps[-1].operations.append(index)
        else:
            steps.append(Step(device, [index]))
    if not steps:
        return steps
    if len(steps) == 1:
        steps[0].model = _for_level(model, _level_of(steps[0].device))
        steps[0].inputs = list(model.main.input_indexes)
        steps[0].outputs = list(model.main.output_indexes)
    else:
        cut(model, steps)
    return steps


def cut(model: Model, steps: list[Step]) -> None:
    """Fill in each step's inputs, outputs and HAL model."""
    main = model.main
    producer_step: dict[int, int] = {}
    for number, step in enumerate(steps):
        for op_index in step.operations:
            for operand in main.operations[op_index].outputs:
                producer_step[operand] = number
    model_outputs = set(main.output_indexes)
    for number, step in enumerate(steps):
        reads = [i for op in step.operations for i in main.operations[op].inputs]
        writes = [i for op in step.operations for i in main.operations[op].outputs]
        later_reads = {i for other in steps[number + 1:] for op in other.operations
                       for i in main.operations[op].inputs}
        step.inputs = list(dict.fromkeys(
            i for i in reads
            if main.operands[i].lifetime == L.SUBGRAPH_INPUT or producer_step.get(i, number) != number))
        step.outputs = list(dict.fromkeys(i for i in writes if i in model_outputs or i in later_reads))
        step.model = _for_level(_step_model(model, step.operations, step.inputs, step.outputs),
                                _level_of(step.device))


def slice_model(model: Model, positions: list[int]) -> Model:
    """A model of only the main-subgraph operations at ``positions``: what they read and
    nobody among them writes becomes an input, what they write becomes an output."""
    main = model.main
    written = {i for p in positions for i in main.operations[p].outputs}
    reads = [i for p in positions for i in main.operations[p].inputs]
    inputs = list(dict.fromkeys(i for i in reads if i not in written and main.operands[i].lifetime in (
        L.SUBGRAPH_INPUT, L.SUBGRAPH_OUTPUT, L.TEMPORARY_VARIABLE)))
    outputs = list(dict.fromkeys(i for p in positions for i in main.operations[p].outputs))
    return _step_model(model, positions, inputs, outputs)


def _step_model(model: Model, operations: list[int], step_inputs: list[int], step_outputs: list[int]) -> Model:
    main = model.main
    used = sorted({i for op in operations for i in main.operations[op].inputs + main.operations[op].outputs})
    new_index = {old: new for new, old in enumerate(used)}
    inputs, outputs = set(step_inputs), set(step_outputs)
    consumers = dict.fromkeys(used, 0)
    for op in operations:
        for i in main.operations[op].inputs:
            consumers[i] += 1
    operands = []
    for old in used:
        operand = main.operands[old]
        lifetime = operand.lifetime
        if old in inputs:
            lifetime = L.SUBGRAPH_INPUT
        elif old in outputs:
            lifetime = L.SUBGRAPH_OUTPUT
        elif lifetime in (L.SUBGRAPH_INPUT, L.SUBGRAPH_OUTPUT):
            lifetime = L.TEMPORARY_VARIABLE
        operands.append(Operand(operand.type, list(operand.dimensions), operand.scale, operand.zero_point,
                                lifetime, operand.location, operand.channel_quant, consumers[old],
                                operand.extension_data))
    new_operations = [Operation(main.operations[op].type, [new_index[i] for i in main.operations[op].inputs],
                                [new_index[i] for i in main.operations[op].outputs]) for op in operations]
    subgraph = Subgraph(operands, new_operations, [new_index[i] for i in step_inputs],
                        [new_index[i] for i in step_outputs])
    return Model(subgraph, model.referenced, model.operand_values, model.pools,
                 model.relax_computation_float32_to_float16, model.extension_name_to_prefix)


# --- preparing --------------------------------------------------------------------------
def contain(device_name: str, call: str, error: Exception) -> HalError:
    """A driver's failure as a HalError: a HalError with the ErrorStatus of a failure as
    it is; anything else -- a raw Python exception escaping the driver, a HalError whose
    status is NONE (no failure) or no ErrorStatus at all -- as GENERAL_FAILURE naming the
    device."""
    if isinstance(error, HalError):
        status = error.status
        if status.__class__ is not ErrorStatus and isinstance(status, int) and not isinstance(status, bool):
            try:
                status = ErrorStatus(status)
            except ValueError:
                pass
        if isinstance(status, ErrorStatus) and status != ErrorStatus.NONE:
            if status is error.status:
                return error
            return HalError(status, str(error), error.output_shapes)
        return HalError(ErrorStatus.GENERAL_FAILURE, f"{device_name}: {call} failed with status {status!r}, "
                                                     f"not the ErrorStatus of a failure: {error}")
    return HalError(ErrorStatus.GENERAL_FAILURE, f"{device_name}: {call} raised {type(error).__name__}: {error}")


_UINT64_MAX = 2**64 - 1


def _is_count(value: object, high: int) -> bool:
    return (value.__class__ is int or (isinstance(value, int | np.integer) and not isinstance(value, bool))) and \
        0 <= value <= high


def _fits(dims: Sequence[int], expected: tuple[int, ...] | None) -> bool:
    """Whether a reported shape can be the value of an output whose known dimensions are
    ``expected`` (Android's isUpdatable: no rank known, or the same rank and every known
    dimension equal; None: not a tensor)."""
    if not expected:
        return True
    if len(dims) != len(expected):
        return False
    for known, reported in zip(expected, dims):
        if known and known != reported:
            return False
    return True


def _shapes_problem(shapes: object, expected: OutputDims, succeeded: bool, count_lead: str = "") -> str | None:
    """What is wrong with the output shapes a driver answers -- one per output, each of
    uint32 dimensions that fit the output's known ones (``expected``; Android's isUpdatable)
    and marked sufficient (``succeeded``: every one, and each tensor's of a known rank, as
    Android's validateOutputShapesFromDriver asks; else each a bool) -- or None when
    nothing is. ``count_lead`` starts the message of a wrong count."""
    if not isinstance(shapes, list | tuple) or len(shapes) != len(expected):
        length = f" of {len(shapes)}" if isinstance(shapes, list | tuple) else ""
        return f"{count_lead}{type(shapes).__name__}{length} for the output shapes of {len(expected)} outputs"
    for position, shape in enumerate(shapes):
        if not isinstance(shape, OutputShape):
            return f"output {position}: a {type(shape).__name__}, not an OutputShape"
        dims = shape.dimensions
        if not isinstance(dims, list | tuple) or not all(_is_count(d, 0xFFFFFFFF) for d in dims):
            return f"output {position}: dimensions {dims!r:.100} are not unsigned 32-bit integers"
        if not _fits(dims, expected[position]):
            return (f"output {position}: dimensions {[int(d) for d in dims][:8]} do not fit the output's "
                    f"{list(expected[position])[:8]} (the same rank, each known dimension equal)")
        if succeeded:
            if shape.is_sufficient is not True and shape.is_sufficient is not np.True_:
                return f"output {position}: is_sufficient {shape.is_sufficient!r:.40} in a successful execution"
            if not dims and expected[position] is not None:
                return f"output {position}: a tensor of unknown rank (dimensions []) in a successful execution"
        elif not isinstance(shape.is_sufficient, bool | np.bool_):
            return f"output {position}: is_sufficient {shape.is_sufficient!r:.40} is no bool"
    return None


def _answer_problem(answer: object, expected: OutputDims) -> str | None:
    """What is wrong with a driver's answer to a successful execution -- it must be
    (output shapes, Timing): the shapes as ``_shapes_problem`` asks, each sufficient, the
    timing two durations in uint64 -- or None when nothing is."""
    if not isinstance(answer, tuple | list) or len(answer) != 2:
        return f"returned {type(answer).__name__}, not (output shapes, timing)"
    shapes, timing = answer
    if (problem := _shapes_problem(shapes, expected, True, "returned ")) is not None:
        return problem
    if not isinstance(timing, Timing) or not (_is_count(timing.time_on_device, _UINT64_MAX)
                                              and _is_count(timing.time_in_driver, _UINT64_MAX)):
        return f"timing {timing!r:.100} is not two unsigned 64-bit durations"
    return None


def _insufficient_problem(shapes: object, expected: OutputDims) -> str | None:
    """What is wrong with the output shapes a driver's OUTPUT_INSUFFICIENT_SIZE carries --
    Android's validateOutputShapesFromDriver: the shapes as ``_shapes_problem`` asks, at
    least one not sufficient -- or None when nothing is."""
    if (problem := _shapes_problem(shapes, expected, False)) is not None:
        return problem
    if all(shape.is_sufficient for shape in shapes):
        return "no output marked insufficient"
    return None


def checked_insufficient(error: HalError, expected: OutputDims, device_name: str) -> HalError:
    """A driver's OUTPUT_INSUFFICIENT_SIZE, its output shapes checked (``_insufficient_problem``)
    before the runtime reports them (they become get_output_operand_dimensions' answer and
    the error's message): the error with its shapes as plain lists and bools, or
    HalError(GENERAL_FAILURE) naming the device and the rule. A driver's malformed shapes
    used to escape as a raw AttributeError, IndexError or BadDataError."""
    problem = _insufficient_problem(error.output_shapes, expected)
    if problem is not None:
        return HalError(ErrorStatus.GENERAL_FAILURE, f"{device_name}: execute failed with OUTPUT_INSUFFICIENT_SIZE "
                                                     f"but {problem}")
    shapes = [OutputShape([int(d) for d in s.dimensions], bool(s.is_sufficient)) for s in error.output_shapes]
    return HalError(ErrorStatus.OUTPUT_INSUFFICIENT_SIZE, str(error), shapes)


def checked_answer(answer, expected: OutputDims, device_name: str, call: str) -> tuple[list[OutputShape], Timing]:
    """A driver's answer to a successful execution, checked (``_answer_problem``) before the
    runtime reports it: a driver is another party, and its malformed answer used to surface
    as a raw TypeError, as dimensions ['a', 'b'] or as NO_ERROR from a failed run, and a
    shape that is not the output's (a [5] for a [3]) was reported as it was, and a tensor
    of unknown rank as one of rank 0. ``expected``: output_dims.
    HalError(GENERAL_FAILURE) naming the device and the rule otherwise (a failed execution:
    retried on the CPU where the plan may fall back)."""
    if answer.__class__ is tuple and len(answer) == 2:  # the common case, checked inline (~0.5 us)
        shapes, timing = answer
        if shapes.__class__ is list and len(shapes) == len(expected) and timing.__class__ is Timing and \
                timing.time_on_device.__class__ is int and timing.time_in_driver.__class__ is int and \
                0 <= timing.time_on_device <= _UINT64_MAX and 0 <= timing.time_in_driver <= _UINT64_MAX:
            for shape, known in zip(shapes, expected):
                if shape.__class__ is not OutputShape or shape.is_sufficient is not True or \
                        shape.dimensions.__class__ is not list:
                    break
                for d in shape.dimensions:
                    if d.__class__ is not int or not 0 <= d <= 0xFFFFFFFF:
                        break
                else:
                    if known == ():  # a tensor of unknown rank: any shape of a known rank
                        if shape.dimensions:
                            continue
                    elif known is None or _fits(shape.dimensions, known):
                        continue
                break
            else:
                return answer
    problem = _answer_problem(answer, expected)
    if problem is None:  # well formed, of other sequence and integer classes
        shapes, timing = answer
        return [OutputShape([int(d) for d in s.dimensions], True) for s in shapes], \
            Timing(int(timing.time_on_device), int(timing.time_in_driver))
    raise HalError(ErrorStatus.GENERAL_FAILURE, f"{device_name}: {call} {problem}")


def checked_fenced(answer: object, device_name: str) -> tuple[int | None, IFencedExecutionCallback]:
    """A driver's answer to execute_fenced, checked before the runtime waits on it: (a sync
    fence -- None or an open file descriptor -- , an IFencedExecutionCallback), as Android's
    HAL adapters convert it (an unconvertible fence or a null callback is GENERAL_FAILURE).
    HalError(GENERAL_FAILURE) naming the device and the rule otherwise, the fence closed
    when it is one (the caller owns it); a malformed pair used to escape as a raw TypeError
    or AttributeError, and a fence of True was waited on and closed as descriptor 1."""
    if not isinstance(answer, tuple | list) or len(answer) != 2:
        problem = f"returned {type(answer).__name__}, not (sync fence, callback)"
    else:
        fence, callback = answer
        problem = None
        if fence is not None:
            if isinstance(fence, bool) or not isinstance(fence, int | np.integer) or fence < 0:
                problem = f"returned the sync fence {fence!r:.60}, not None or a file descriptor"
            else:
                try:
                    os.fstat(int(fence))
                except OSError as error:
                    problem = f"returned the sync fence {int(fence)}, which is no open file descriptor ({error})"
        if problem is None and not isinstance(callback, IFencedExecutionCallback):
            problem = f"returned {type(callback).__name__} for its callback, not an IFencedExecutionCallback"
            if fence is not None:
                os.close(int(fence))
        if problem is None:
            return (None if fence is None else int(fence)), callback
    raise HalError(ErrorStatus.GENERAL_FAILURE, f"{device_name}: execute_fenced {problem}")


def output_dims(model: Model, indexes: Sequence[int]) -> OutputDims:
    """The known dimensions of the main subgraph's operands ``indexes`` (what a driver's
    output shapes must fit: checked_answer): per operand its dimensions (0: unknown; ():
    a tensor of unknown rank), None where it is not a tensor."""
    operands = model.main.operands
    return tuple(tuple(operands[i].dimensions) if is_tensor(operands[i].type) else None for i in indexes)


# --- the plan ---------------------------------------------------------------------------
class ExecutionPlan:
    """What a finished compilation runs: one step (the whole model on one device) or many.

    ``execute`` / ``execute_fenced`` / ``configure_burst`` mirror IPreparedModel, so the
    public Execution and Burst talk only to the plan.
    """

    def __init__(self, model: Model, steps: list[Step], fallback_device: IDevice | None = None,
                 preference: ExecutionPreference = ExecutionPreference.FAST_SINGLE_ANSWER,
                 priority: Priority = Priority.MEDIUM) -> None:
        self.model = model
        self.steps = steps
        self.single = steps[0].prepared if len(steps) == 1 else None
        #: the model's outputs' known dimensions: what the output shapes of a successful
        #: execution must fit (one per output)
        self.output_dims = output_dims(model, model.main.output_indexes)
        for step in steps:  # what each step's answers must fit
            step.output_dims = output_dims(model, step.outputs)
        #: whether the single step's driver's answers are well formed by construction
        #: (IPreparedModel.answers_checked): else each is checked (checked_answer)
        self.answers_checked = self.single is not None and getattr(self.single, "answers_checked", False) is True
        # Falling back is pointless when everything already runs on the fallback device.
        self.fallback_device = fallback_device if any(s.device is not fallback_device for s in steps) else None
        self._preference = preference
        self._priority = priority
        self._cpu: IPreparedModel | None = None
        self._cpu_lock = threading.Lock()
        self._layout = _StepLayout(model, steps) if len(steps) > 1 else None
        #: the intermediate buffers of runs that ended, for the next runs to take (a run
        #: takes one set, so that runs at once never share one): the same buffers run
        #: after run let a driver find its arguments where it bound them (ORT: nothing to
        #: bind again, ~40 us per argument) and spare fresh pages their faults
        self._spare_temps: list[dict[tuple[int, int], np.ndarray]] = []
        #: How many executions were re-run on the fallback device (for tests and tools).
        self.fallback_count = 0

    @property
    def devices(self) -> list[IDevice]:
        return [step.device for step in self.steps]

    # --- execution -----------------------------------------------------------------
    def execute(self, request: Request, measure_timing: bool = False, deadline_ns: int | None = None,
                loop_timeout_ns: int | None = None) -> tuple[list[OutputShape], Timing]:
        try:
            if self.single is not None:
                device = self.steps[0].device
                staging = staged(request, device) if request.pools else None
                if staging is not None:  # device memory of another device (see device_memory)
                    answer = staging.run(self.single.execute, measure_timing, deadline_ns, loop_timeout_ns)
                elif tracing.state.enabled:
                    with tracing.span(f"{device.name}: execute", "driver"):
                        answer = self.single.execute(request, measure_timing, deadline_ns, loop_timeout_ns)
                else:
                    answer = self.single.execute(request, measure_timing, deadline_ns, loop_timeout_ns)
                if self.answers_checked:
                    return answer
                return checked_answer(answer, self.output_dims, device.name, "execute")
            return self._execute_steps(request, measure_timing, deadline_ns, loop_timeout_ns)
        except Exception as error:  # noqa: BLE001 - contained, maybe retried on the CPU
            return self._fallback(error, request, deadline_ns, loop_timeout_ns)

    def _fallback(self, error: Exception, request: Request, deadline_ns, loop_timeout_ns
                  ) -> tuple[list[OutputShape], Timing]:
        name = self.steps[0].device.name if self.single is not None else "plan"
        hal_error = contain(name, "execute", error)
        if hal_error.status == ErrorStatus.OUTPUT_INSUFFICIENT_SIZE:
            hal_error = checked_insufficient(hal_error, self.output_dims, name)
        if self.fallback_device is None or hal_error.status in _NO_FALLBACK:
            raise hal_error from None
        cpu = self._cpu_model()
        self.fallback_count += 1
        vlog.execution.debug("execution failed (%s); re-running on %s", hal_error, self.fallback_device.name)
        try:
            # No allocation named the CPU model: every device memory goes through staging.
            return execute_on(None, cpu.execute, request, False, deadline_ns, loop_timeout_ns)
        except Exception as cpu_error:  # noqa: BLE001
            raise contain(self.fallback_device.name, "execute", cpu_error) from None

    def _cpu_model(self) -> IPreparedModel:
        with self._cpu_lock:
            if self._cpu is None:
                device = self.fallback_device
                assert device is not None
                try:
                    self._cpu = device.prepare_model(self.model, self._preference, self._priority)
                except Exception as error:  # noqa: BLE001
                    raise contain(device.name, "prepare_model", error) from None
            return self._cpu

    def _execute_steps(self, request: Request, measure_timing: bool, deadline_ns, loop_timeout_ns
                       ) -> tuple[list[OutputShape], Timing]:
        layout = self._layout
        assert layout is not None
        main = self.model.main
        # where each operand's value lives for this run: (pool, offset, length, dims), None if omitted
        where: dict[int, tuple | None] = {}
        for argument, index in zip(request.inputs, main.input_indexes, strict=True):
            if argument.has_no_value:
                where[index] = None
            else:
                location = argument.location
                where[index] = (request.pools[location.pool_index], location.offset, location.length,
                                list(argument.dimensions or main.operands[index].dimensions))
        shapes = [OutputShape(list(argument.dimensions or main.operands[index].dimensions), True)
                  for argument, index in zip(request.outputs, main.output_indexes, strict=True)]
        caller_output = {index: argument for argument, index in zip(request.outputs, main.output_indexes,
                                                                    strict=True) if not argument.has_no_value}
        on_device = in_driver = 0
        try:
            kept = self._spare_temps.pop()
        except IndexError:  # the first run, or every set taken by runs going on now
            kept = {}
        try:
            for number, step in enumerate(self.steps):
                timing = self._run_step(number, step, request, where, caller_output, shapes, measure_timing,
                                        deadline_ns, loop_timeout_ns, kept)
                if measure_timing and timing.time_on_device != NO_TIMING:
                    on_device += timing.time_on_device
                    in_driver += timing.time_in_driver
        finally:
            self._spare_temps.append(kept)
        return shapes, Timing(on_device, in_driver) if measure_timing else Timing()

    def _run_step(self, number: int, step: Step, request: Request, where: dict, caller_output: dict,
                  shapes: list[OutputShape], measure_timing, deadline_ns, loop_timeout_ns,
                  kept: dict[tuple[int, int], np.ndarray]) -> Timing:
        """Run one step: its inputs from where they are now, its outputs into the caller's
        buffers or intermediate ones from ``kept`` (per (step, output), made when missing
        or of another size: an array of the operand's dtype and shape where the model gives
        it, bytes where only the run tells)."""
        layout = self._layout
        assert layout is not None and step.prepared is not None
        main = self.model.main
        pools: list = []
        pool_ids: dict[int, int] = {}

        def pool_index(pool) -> int:
            key = id(pool)
            if key not in pool_ids:
                pool_ids[key] = len(pools)
                pools.append(pool)
            return pool_ids[key]

        inputs = []
        for index in step.inputs:
            value = where.get(index)
            if value is None:
                inputs.append(RequestArgument(has_no_value=True))
                continue
            pool, offset, length, dims = value
            if type(pool) is DeviceMemoryPool and index not in layout.model_inputs:
                # a model output an earlier step wrote into device memory: allocated for that
                # step's role only, so every later reader gets its bytes through copy_to
                staging = bytearray(pool.size)
                pool.buffer.copy_to(staging)
                pool = staging
            inputs.append(RequestArgument(False, DataLocation(pool_index(pool), offset, length), list(dims)))
        sizes = list(layout.temp_sizes[number])
        for _attempt in range(_STEP_OUTPUT_SIZE_ATTEMPTS):
            temps: dict[int, np.ndarray] = {}
            outputs = []
            for k, index in enumerate(step.outputs):
                argument = caller_output.get(index)
                if argument is not None:
                    location = argument.location
                    outputs.append(RequestArgument(False, DataLocation(
                        pool_index(request.pools[location.pool_index]), location.offset, location.length),
                        list(argument.dimensions)))
                else:
                    buffer = kept.get((number, k))
                    if buffer is not None and not sizes[k]:
                        sizes[k] = buffer.nbytes  # a size only the run tells: offer the last run's
                    if buffer is None or buffer.nbytes != sizes[k]:
                        buffer = kept[(number, k)] = layout.temp_array(number, k, sizes[k])
                    temps[index] = buffer
                    outputs.append(RequestArgument(False, DataLocation(pool_index(buffer), 0, sizes[k]), []))
            try:
                # no span made per step untraced (a generator and its name, ~5 us between two steps)
                with tracing.span(f"step {number}: {step.device.name}: execute", "driver") \
                        if tracing.state.enabled else _UNTRACED:
                    answer = execute_on(step.device, step.prepared.execute, Request(inputs, outputs, pools),
                                        measure_timing, deadline_ns, loop_timeout_ns)
                    if getattr(step.prepared, "answers_checked", False) is not True:
                        answer = checked_answer(answer, step.output_dims, step.device.name,
                                                "execute")
                    step_shapes, timing = answer
            except HalError as error:
                if error.status != ErrorStatus.OUTPUT_INSUFFICIENT_SIZE:
                    raise
                error = checked_insufficient(error, step.output_dims, step.device.name)
                if error.status != ErrorStatus.OUTPUT_INSUFFICIENT_SIZE:
                    raise error from None
                caller_short = False
                for k, (index, shape) in enumerate(zip(step.outputs, error.output_shapes, strict=True)):
                    if index in layout.output_position:
                        shapes[layout.output_position[index]] = OutputShape(list(shape.dimensions),
                                                                            shape.is_sufficient)
                    if index in caller_output:
                        caller_short |= not shape.is_sufficient
                    elif not shape.is_sufficient:
                        sizes[k] = value_byte_size(main.operands[index].type, shape.dimensions)
                if caller_short:
                    raise HalError(ErrorStatus.OUTPUT_INSUFFICIENT_SIZE, "an output buffer is too small",
                                   shapes) from None
                continue
            if len(step_shapes) != len(step.outputs):
                raise HalError(ErrorStatus.GENERAL_FAILURE,
                               f"{step.device.name}: returned {len(step_shapes)} output shapes for "
                               f"{len(step.outputs)} outputs")
            fixed = layout.fixed_outputs[number]
            for k, (index, shape) in enumerate(zip(step.outputs, step_shapes, strict=True)):
                dims = list(shape.dimensions)
                declared = fixed[k]
                needed = declared[1] if declared is not None and dims == declared[0] else value_byte_size(
                    main.operands[index].type, dims)
                if index in caller_output:
                    location = caller_output[index].location
                    where[index] = (request.pools[location.pool_index], location.offset, needed, dims)
                else:
                    where[index] = (temps[index], 0, needed, dims)
                if index in layout.output_position:
                    shapes[layout.output_position[index]] = OutputShape(dims, True)
            return timing
        raise HalError(ErrorStatus.GENERAL_FAILURE, f"{step.device.name}: a step's output sizes kept changing")

    def execute_fenced(self, request: Request, wait_for: Sequence[int], measure_timing: bool = False,
                       deadline_ns: int | None = None, loop_timeout_ns: int | None = None,
                       timeout_after_fence_ns: int | None = None) -> tuple[int | None, IFencedExecutionCallback]:
        """IPreparedModel.execute_fenced for the plan: a single step hands it to its
        driver (its answer checked: checked_fenced); otherwise the plan waits for the
        fences and runs synchronously, and so does a driver's failure that may fall back,
        on the fallback device (Android's CPU fallback of a fenced execution)."""
        failed: HalError | None = None
        if self.single is not None and not needs_staging(request, self.steps[0].device):
            name = self.steps[0].device.name
            try:
                return checked_fenced(self.single.execute_fenced(request, wait_for, measure_timing, deadline_ns,
                                                                 loop_timeout_ns, timeout_after_fence_ns), name)
            except Exception as error:  # noqa: BLE001
                failed = contain(name, "execute_fenced", error)
                if self.fallback_device is None or failed.status in _NO_FALLBACK:
                    raise failed from None
        wait_for_fences(wait_for, deadline_ns)
        if timeout_after_fence_ns is not None:
            after = time.monotonic_ns() + timeout_after_fence_ns
            deadline_ns = after if deadline_ns is None else min(deadline_ns, after)
        if failed is not None:
            _, timing = self._fallback(failed, request, deadline_ns, loop_timeout_ns)
        else:
            _, timing = self.execute(request, measure_timing, deadline_ns, loop_timeout_ns)
        return None, _DoneCallback(ErrorStatus.NONE, timing, timing)

    def configure_burst(self) -> IBurst:
        return _PlanBurst(self)

    def create_reusable_execution(self, request: Request, measure_timing: bool = False,
                                  loop_timeout_ns: int | None = None) -> IExecution:
        """IPreparedModel.create_reusable_execution for the plan: a single step's driver
        binds the request once (see ``_PlanExecution``)."""
        return _PlanExecution(self, self.single, request, measure_timing, loop_timeout_ns)


def _fixed_type(operand: Operand) -> tuple[np.dtype, tuple[int, ...]] | None:
    if operand.type not in TENSOR_TYPES or not operand.dimensions or not all(operand.dimensions):
        return None
    return dtype_of(operand.type), tuple(operand.dimensions)


class _StepLayout:
    """Per-compilation facts of a multi-step plan, computed once."""

    def __init__(self, model: Model, steps: list[Step]) -> None:
        main = model.main
        self.output_position = {index: position for position, index in enumerate(main.output_indexes)}
        self.model_inputs = frozenset(main.input_indexes)
        self.temp_sizes = [[value_byte_size(main.operands[i].type, main.operands[i].dimensions)
                            if all(main.operands[i].dimensions) else 0 for i in step.outputs] for step in steps]
        #: per step and output: (dtype, shape) of the operand where the model fixes them
        #: (a tensor of a built-in type), else None
        self.temp_types = [[_fixed_type(main.operands[i]) for i in step.outputs] for step in steps]
        #: per step and output: (its dimensions, its byte count) where the model fixes them
        self.fixed_outputs = [[None if fixed is None else (list(fixed[1]), size) for fixed, size in zip(
            types, sizes, strict=True)] for types, sizes in zip(self.temp_types, self.temp_sizes, strict=True)]

    def temp_array(self, number: int, k: int, size: int) -> np.ndarray:
        """A buffer of ``size`` bytes for output ``k`` of step ``number``: an array of the
        operand's dtype and shape when it has that many bytes (a driver may bind it as it
        is), else bytes."""
        typed = self.temp_types[number][k]
        if typed is not None and math.prod(typed[1]) * typed[0].itemsize == size:
            return np.zeros(typed[1], typed[0])
        return np.zeros(size, np.uint8)


class _PlanBurst(IBurst):
    """A burst of a plan: the single step's own burst, with the plan's CPU fallback."""

    def __init__(self, plan: ExecutionPlan) -> None:
        self._plan = plan
        self._burst: IBurst | None = None
        if plan.single is not None:
            try:
                self._burst = plan.single.configure_burst()
            except Exception as error:  # noqa: BLE001
                raise contain(plan.steps[0].device.name, "configure_burst", error) from None

    def execute(self, request, measure_timing=False, deadline_ns=None, loop_timeout_ns=None):
        if self._burst is None:
            return self._plan.execute(request, measure_timing, deadline_ns, loop_timeout_ns)
        plan = self._plan
        device = plan.steps[0].device
        try:
            answer = execute_on(device, self._burst.execute, request, measure_timing, deadline_ns, loop_timeout_ns)
            if plan.answers_checked:
                return answer
            return checked_answer(answer, plan.output_dims, device.name, "burst execute")
        except Exception as error:  # noqa: BLE001
            return self._plan._fallback(error, request, deadline_ns, loop_timeout_ns)

    def create_reusable_execution(self, request, measure_timing=False, loop_timeout_ns=None):
        return _PlanExecution(self._plan, self._burst, request, measure_timing, loop_timeout_ns)


class _PlanExecution(IExecution):
    """A request bound to a plan. A single step's driver binds it (through its prepared
    model or burst, ``source``) at the first computation, so a failure to bind is
    contained and falls back exactly as a failed ``execute`` does; a multi-step plan
    runs the request through ``execute`` each time."""

    def __init__(self, plan: ExecutionPlan, source: IPreparedModel | IBurst | None, request: Request,
                 measure_timing: bool, loop_timeout_ns: int | None) -> None:
        self._plan = plan
        self._source = source
        self._request = request
        self._measure = measure_timing
        self._loop_timeout_ns = loop_timeout_ns
        self._bound: IExecution | None = None

    def execute(self, deadline_ns: int | None = None) -> tuple[list[OutputShape], Timing]:
        plan = self._plan
        if self._source is None:
            return plan.execute(self._request, self._measure, deadline_ns, self._loop_timeout_ns)
        try:
            bound = self._bound
            if bound is None:
                bound = self._bound = self._source.create_reusable_execution(self._request, self._measure,
                                                                             self._loop_timeout_ns)
            name = plan.steps[0].device.name
            if tracing.state.enabled:
                with tracing.span(f"{name}: execute", "driver"):
                    answer = bound.execute(deadline_ns)
            else:
                answer = bound.execute(deadline_ns)
            if plan.answers_checked:
                return answer
            return checked_answer(answer, plan.output_dims, name, "reusable execute")
        except Exception as error:  # noqa: BLE001 - contained, maybe retried on the CPU
            return plan._fallback(error, self._request, deadline_ns, self._loop_timeout_ns)
