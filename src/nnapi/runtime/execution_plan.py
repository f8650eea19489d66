"""Partitioning: split a HAL model into steps, each run by one device, and run them.

Each operation goes to the device that supports it and reports the best performance
for it (the reference CPU device supports everything it implements, so it is the
fallback). Consecutive operations on one device form a step; each step is a HAL model of
its own, prepared by its device. An ExecutionPlan runs the steps in order and carries
intermediate values between them in runtime-owned buffers: the runtime moves bytes, the
devices compute.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from nnapi.codes import OperationCode
from nnapi.errors import BadDataError
from nnapi.hal import (
    DataLocation,
    ErrorStatus,
    HalError,
    IDevice,
    IPreparedModel,
    Model,
    Operand,
    OperandLifeTime,
    Operation,
    OutputShape,
    Request,
    RequestArgument,
    Subgraph,
    Timing,
)
from nnapi.hal.types import NO_TIMING
from nnapi.operand import dtype_of

L = OperandLifeTime


@dataclass
class Step:
    device: IDevice
    operations: list[int]  # indexes into the main subgraph's operations (run order)
    inputs: list[int] = field(default_factory=list)  # main-subgraph operands the step reads
    outputs: list[int] = field(default_factory=list)  # main-subgraph operands it produces for others
    model: Model | None = None
    prepared: IPreparedModel | None = None


def _operation_cost(device: IDevice, model: Model, operation: Operation) -> float:
    capabilities = device.get_capabilities()
    if operation.type == OperationCode.IF:
        return capabilities.if_performance.exec_time
    if operation.type == OperationCode.WHILE:
        return capabilities.while_performance.exec_time
    operand = model.main.operands[operation.inputs[0]] if operation.inputs else None
    if operand is None:
        return 1.0
    if model.relax_computation_float32_to_float16 and operand.type in (3, 0):
        return capabilities.relaxed_float32_to_float16_tensor.exec_time
    return capabilities.performance_for(operand.type).exec_time


def assign_devices(model: Model, devices: list[IDevice]) -> list[IDevice]:
    """The device of each main-subgraph operation; BAD_DATA if one has none."""
    support = [device.get_supported_operations(model) for device in devices]
    chosen: list[IDevice] = []
    for index, operation in enumerate(model.main.operations):
        able = [d for d, flags in zip(devices, support, strict=True) if flags[index]]
        if not able:
            names = [d.name for d in devices]
            raise BadDataError(f"finish: no device among {names} supports operation {index} "
                               f"({OperationCode(operation.type).name})")
        # min() keeps the first of equals: the order devices were given breaks ties.
        chosen.append(min(able, key=lambda d: _operation_cost(d, model, operation)))
    return chosen


def partition(model: Model, devices: list[IDevice]) -> list[Step]:
    """Steps of consecutive operations that share a device, with their HAL models."""
    assignment = assign_devices(model, devices)
    steps: list[Step] = []
    for index, device in enumerate(assignment):
        if steps and steps[-1].device is device:
            steps[-1].operations.append(index)
        else:
            steps.append(Step(device, [index]))
    if len(steps) > 1:
        _cut(model, steps)
    return steps


def _cut(model: Model, steps: list[Step]) -> None:
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
        step.model = _step_model(model, step)


def _step_model(model: Model, step: Step) -> Model:
    main = model.main
    used = sorted({i for op in step.operations for i in main.operations[op].inputs + main.operations[op].outputs})
    new_index = {old: new for new, old in enumerate(used)}
    inputs, outputs = set(step.inputs), set(step.outputs)
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
                                lifetime, operand.location, operand.channel_quant, operand.number_of_consumers))
    operations = [Operation(main.operations[op].type, [new_index[i] for i in main.operations[op].inputs],
                            [new_index[i] for i in main.operations[op].outputs]) for op in step.operations]
    subgraph = Subgraph(operands, operations, [new_index[i] for i in step.inputs],
                        [new_index[i] for i in step.outputs])
    return Model(subgraph, model.referenced, model.operand_values, model.pools,
                 model.relax_computation_float32_to_float16)


def _byte_size(operand: Operand, dims: list[int]) -> int:
    return math.prod(dims) * dtype_of(operand.type).itemsize if dims else dtype_of(operand.type).itemsize


class ExecutionPlan(IPreparedModel):
    """A model prepared as several steps on several devices; runs like one prepared model."""

    def __init__(self, model: Model, steps: list[Step]) -> None:
        self.model = model
        self.steps = steps

    def execute(self, request: Request, measure_timing: bool = False, deadline_ns: int | None = None,
                loop_timeout_ns: int | None = None) -> tuple[list[OutputShape], Timing]:
        main = self.model.main
        # operand index -> (bytes, dimensions); None for an omitted optional input
        values: dict[int, tuple[np.ndarray, list[int]] | None] = {}
        for argument, index in zip(request.inputs, main.input_indexes, strict=True):
            if argument.has_no_value:
                values[index] = None
                continue
            location = argument.location
            data = np.frombuffer(request.pools[location.pool_index], np.uint8, location.length, location.offset)
            values[index] = (data, list(argument.dimensions or main.operands[index].dimensions))
        on_device = in_driver = 0
        for step in self.steps:
            timing = self._run_step(step, values, measure_timing, deadline_ns, loop_timeout_ns)
            if measure_timing and timing.time_on_device != NO_TIMING:
                on_device += timing.time_on_device
                in_driver += timing.time_in_driver
        shapes = []
        for argument, index in zip(request.outputs, main.output_indexes, strict=True):
            data, dims = values[index]  # type: ignore[misc]
            shapes.append(OutputShape(dims, argument.has_no_value or argument.location.length >= data.nbytes))
        if not all(shape.is_sufficient for shape in shapes):
            raise HalError(ErrorStatus.OUTPUT_INSUFFICIENT_SIZE, "an output buffer is too small", shapes)
        for argument, index in zip(request.outputs, main.output_indexes, strict=True):
            if argument.has_no_value:
                continue
            data, _ = values[index]  # type: ignore[misc]
            target = np.frombuffer(request.pools[argument.location.pool_index], np.uint8, data.nbytes,
                                   argument.location.offset)
            target[:] = data
        return shapes, Timing(on_device, in_driver) if measure_timing else Timing()

    def _run_step(self, step: Step, values, measure_timing, deadline_ns, loop_timeout_ns) -> Timing:
        main = self.model.main
        pools: list = []
        inputs = []
        for index in step.inputs:
            value = values[index]
            if value is None:
                inputs.append(RequestArgument(has_no_value=True))
                continue
            data, dims = value
            pools.append(data)
            inputs.append(RequestArgument(False, DataLocation(len(pools) - 1, 0, data.nbytes), list(dims)))
        sizes = [_byte_size(main.operands[i], main.operands[i].dimensions)
                 if all(main.operands[i].dimensions) else 0 for i in step.outputs]
        for _attempt in range(3):
            buffers = [np.zeros(size, np.uint8) for size in sizes]
            outputs = [RequestArgument(False, DataLocation(len(pools) + k, 0, size), [])
                       for k, size in enumerate(sizes)]
            try:
                assert step.prepared is not None
                shapes, timing = step.prepared.execute(Request(inputs, outputs, pools + buffers), measure_timing,
                                                       deadline_ns, loop_timeout_ns)
            except HalError as error:
                if error.status != ErrorStatus.OUTPUT_INSUFFICIENT_SIZE or not error.output_shapes:
                    raise
                sizes = [_byte_size(main.operands[i], shape.dimensions)
                         for i, shape in zip(step.outputs, error.output_shapes, strict=True)]
                continue
            for index, buffer, shape in zip(step.outputs, buffers, shapes, strict=True):
                needed = _byte_size(main.operands[index], shape.dimensions)
                values[index] = (buffer[:needed], list(shape.dimensions))
            return timing
        raise HalError(ErrorStatus.GENERAL_FAILURE, "a step's output sizes kept changing")
