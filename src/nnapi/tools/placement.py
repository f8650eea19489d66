"""Placement report: where each operation of a compiled model runs, which devices
refused it and why, how many partitions the plan has and how many bytes cross between
devices per execution."""

from __future__ import annotations

from typing import Any

from nnapi.errors import BadStateError
from nnapi.hal import IDevice, OperandLifeTime
from nnapi.hal import Model as HalModel
from nnapi.hal.types import operation_name
from nnapi.operand import value_byte_size

#: The reason given for a device that refuses an operation without saying why.
DECLINED = "declined by the driver"


def refusal_reasons(device: IDevice, hal_model: HalModel) -> list[str | None]:
    """Per main-graph operation: None where ``device`` is given and supports it, else
    the reason (feature level, missing extension, or the driver's own)."""
    from nnapi.runtime.execution_plan import unsupported_reasons

    return unsupported_reasons(hal_model, device)


def placement(compilation: Any) -> dict[str, Any]:
    """The placement of a finished compilation (see the module docstring).

    Operations are listed by their index in the model (the order they were added)."""
    from nnapi.runtime.model_builder import build_hal_model

    compilation._check_alive("placement")
    if not compilation.is_finished:
        raise BadStateError("placement: the compilation is not finished")
    hal_model, order = build_hal_model(compilation.model)
    main = hal_model.main
    steps = compilation._steps
    device_of_hal_op: dict[int, str] = {}
    for step in steps:
        for op_index in step.operations:
            device_of_hal_op[op_index] = step.device.name
    candidates = [device._hal for device in compilation._devices]
    refused_by = {device.name: refusal_reasons(device, hal_model) for device in candidates}
    for name, error, positions in getattr(compilation, "_prepare_failures", []):
        for position in positions:
            refused_by.setdefault(name, [None] * len(main.operations))[position] = f"failed to prepare: {error}"
    operations = [None] * len(main.operations)
    for position, operation in enumerate(main.operations):
        refusals = {name: reasons[position] for name, reasons in refused_by.items() if reasons[position]}
        operations[order[position]] = {"index": order[position], "type": operation_name(operation.type, hal_model),
                                       "device": device_of_hal_op[position], "refused": refusals}
    crossing = 0
    unknown = False
    producer: dict[int, int] = {}
    for number, step in enumerate(steps):
        for op_index in step.operations:
            for operand in main.operations[op_index].outputs:
                producer[operand] = number
    for number, step in enumerate(steps):
        read = {i for op_index in step.operations for i in main.operations[op_index].inputs}
        for operand_index in sorted(read):
            operand = main.operands[operand_index]
            if operand.lifetime == OperandLifeTime.SUBGRAPH_INPUT or producer.get(operand_index, number) == number:
                continue
            if 0 in operand.dimensions:
                unknown = True
            else:
                crossing += value_byte_size(operand.type, operand.dimensions)
    return {
        "devices": [device.name for device in candidates],
        "partitions": len(steps),
        "steps": [{"device": step.device.name, "operations": sorted(order[i] for i in step.operations)}
                  for step in steps],
        "operations": operations,
        "bytes_between_devices": None if unknown else crossing,
    }


def format_placement(report: dict[str, Any], source_ops: list | None = None) -> str:
    """The report as text for a terminal."""
    moved = report["bytes_between_devices"]
    lines = [f"devices: {', '.join(report['devices'])}",
             f"partitions: {report['partitions']}    bytes between devices per execution: "
             f"{'unknown (dynamic shapes)' if moved is None else moved}"]
    width = max((len(entry["type"]) for entry in report["operations"]), default=10)
    for entry in report["operations"]:
        source = f"  [{source_ops[entry['index']]}]" if source_ops and entry["index"] < len(source_ops) else ""
        lines.append(f"  #{entry['index']:<4} {entry['type']:<{width}}  -> {entry['device']}{source}")
        for name, reason in entry["refused"].items():
            lines.append(f"          refused by {name}: {reason}")
    return "\n".join(lines)
