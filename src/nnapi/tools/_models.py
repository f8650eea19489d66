"""What the tools share: rebuilding a public Model from its HAL form (with extra
outputs) and choosing the devices a model under test runs on. Running a model
(output sizes, seeded inputs) is nnapi.Session's job."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np

import nnapi
from nnapi.codes import OperandCode
from nnapi.device import no_device_message
from nnapi.errors import BadDataError
from nnapi.hal import Model as HalModel
from nnapi.hal import OperandLifeTime, Operation, Subgraph
from nnapi.operand import OperandType, SymmPerChannelQuantParams
from nnapi.tools.graph_dump import _constant

L = OperandLifeTime
T = OperandCode


def _build(hal_model: HalModel, subgraph: Subgraph, extra_outputs: Sequence[int], keep: list,
           built: dict[int, nnapi.Model]) -> nnapi.Model:
    model = nnapi.Model()
    for index, operand in enumerate(subgraph.operands):
        model.add_operand(OperandType(operand.type, list(operand.dimensions), operand.scale, operand.zero_point))
        if operand.channel_quant is not None:
            model.set_operand_symm_per_channel_quant_params(
                index, SymmPerChannelQuantParams(operand.channel_quant.channel_dim, operand.channel_quant.scales))
        if operand.lifetime in (L.CONSTANT_COPY, L.CONSTANT_REFERENCE):
            value = np.array(_constant(hal_model, operand))  # a copy the new model may keep by reference
            keep.append(value)
            model.set_operand_value(index, value)
        elif operand.lifetime == L.NO_VALUE:
            model.set_operand_value(index, None)
        elif operand.lifetime == L.SUBGRAPH:
            target = operand.location.offset
            if target not in built:
                built[target] = _build(hal_model, hal_model.referenced[target], (), keep, built)
            model.set_operand_value_from_model(index, built[target])
    for operation in subgraph.operations:
        model.add_operation(operation.type, list(operation.inputs), list(operation.outputs))
    outputs = list(subgraph.output_indexes) + [i for i in extra_outputs if i not in subgraph.output_indexes]
    model.identify_inputs_and_outputs(list(subgraph.input_indexes), outputs)
    model.relax_computation_float32_to_float16(hal_model.relax_computation_float32_to_float16)
    model.finish()
    return model


def with_outputs(model: nnapi.Model, extra_outputs: Sequence[int]) -> tuple[nnapi.Model, list]:
    """A copy of finished ``model`` whose outputs are its own followed by
    ``extra_outputs`` (main-graph operand indexes). Returns the model and the objects it
    references, which the caller keeps alive as long as the model."""
    from nnapi.runtime.model_builder import build_hal_model

    hal_model, _ = build_hal_model(model)
    keep: list = []
    return _build(hal_model, hal_model.main, extra_outputs, keep, {}), keep


def operation_alone(hal_model: HalModel, position: int,
                    shapes: dict[int, Sequence[int]]) -> tuple[nnapi.Model, list[int], list]:
    """Operation ``position`` of the main graph as a model of its own: what it reads that
    the graph computes or is given (temporaries, inputs, outputs) becomes its inputs, at
    ``shapes`` (main-graph operand index -> shape), constants stay, and what it writes
    is its outputs. Returns the model, the main-graph operand indexes of its inputs in
    order, and the objects the model references."""
    main = hal_model.main
    operation = main.operations[position]
    used = list(dict.fromkeys([*operation.inputs, *operation.outputs]))
    remap = {old: new for new, old in enumerate(used)}
    given = (L.TEMPORARY_VARIABLE, L.SUBGRAPH_INPUT, L.SUBGRAPH_OUTPUT)
    operands, inputs = [], []
    for old in used:
        operand = main.operands[old]
        if old in operation.outputs:
            operand = replace(operand, lifetime=L.SUBGRAPH_OUTPUT)
        elif operand.lifetime in given:
            operand = replace(operand, lifetime=L.SUBGRAPH_INPUT, dimensions=list(shapes[old]))
            inputs.append(old)
        operands.append(operand)
    subgraph = Subgraph(operands, [Operation(operation.type, [remap[i] for i in operation.inputs],
                                             [remap[i] for i in operation.outputs])],
                        [remap[i] for i in inputs], [remap[i] for i in operation.outputs])
    keep: list = []
    return _build(hal_model, subgraph, (), keep, {}), inputs, keep


def device_and_reference(device: nnapi.Device | str, call: str) -> tuple[nnapi.Device, nnapi.Device]:
    """The device under test (a Device or its name) and ``nnapi-reference``."""
    devices = {d.name: d for d in nnapi.get_devices()}
    if isinstance(device, str):
        if device not in devices:
            raise BadDataError(f"{call}: {no_device_message(device, list(devices))}")
        device = devices[device]
    return device, devices["nnapi-reference"]


def beside_reference(device: nnapi.Device, reference: nnapi.Device) -> list[nnapi.Device]:
    """The devices a model runs on to test ``device``: it, and the reference for what it refuses."""
    return [device] if device.name == reference.name else [device, reference]
