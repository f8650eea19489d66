"""Turn a finished public Model (and every model it references) into a HAL Model."""

from __future__ import annotations

from typing import TYPE_CHECKING

from nnapi import hal
from nnapi.hal.types import DataLocation, ExtensionNameAndPrefix, OperandLifeTime, extension_prefix, is_extension_type
from nnapi.runtime import type_manager
from nnapi.runtime.operand_values import CopiedValue, MemoryValue, ModelValue, NoValue, ReferencedValue

if TYPE_CHECKING:
    from nnapi.model import Model


class _Builder:
    def __init__(self) -> None:
        self.blob = bytearray()
        self.pools: list = []
        self._pool_ids: dict[int, int] = {}
        self.referenced: list[hal.Subgraph | None] = []
        self._referenced_ids: dict[int, int] = {}
        self.extension_prefixes: set[int] = set()  # of the extension types the model uses

    def pool_index(self, key: object, buffer) -> int:
        if id(key) not in self._pool_ids:
            self._pool_ids[id(key)] = len(self.pools)
            self.pools.append(buffer)
        return self._pool_ids[id(key)]

    def referenced_index(self, model: Model) -> int:
        if id(model) not in self._referenced_ids:
            self._referenced_ids[id(model)] = len(self.referenced)
            self.referenced.append(None)  # reserve the slot, then fill it
            self.referenced[self._referenced_ids[id(model)]] = self.subgraph(model)[0]
        return self._referenced_ids[id(model)]

    def subgraph(self, model: Model) -> tuple[hal.Subgraph, list[int]]:
        inputs, outputs = set(model._inputs), set(model._outputs)
        consumers = [0] * len(model._operands)
        for operation in model._operations:
            for index in operation.inputs:
                consumers[index] += 1
        operands: list[hal.Operand] = []
        for index, op_type in enumerate(model._operands):
            value = model._values.get(index)
            location = DataLocation()
            if index in inputs:
                lifetime = OperandLifeTime.SUBGRAPH_INPUT
            elif index in outputs:
                lifetime = OperandLifeTime.SUBGRAPH_OUTPUT
            elif isinstance(value, NoValue):
                lifetime = OperandLifeTime.NO_VALUE
            elif isinstance(value, CopiedValue):
                lifetime = OperandLifeTime.CONSTANT_COPY
                # Keep every value aligned for the element types that need it.
                self.blob.extend(b"\0" * (-len(self.blob) % 8))
                location = DataLocation(0, len(self.blob), len(value.data))
                self.blob.extend(value.data)
            elif isinstance(value, ReferencedValue):
                lifetime = OperandLifeTime.CONSTANT_REFERENCE
                location = DataLocation(self.pool_index(value.view, value.view), 0, value.view.nbytes)
            elif isinstance(value, MemoryValue):
                lifetime = OperandLifeTime.CONSTANT_REFERENCE
                location = DataLocation(self.pool_index(value.memory, value.memory._pool()), value.offset,
                                        value.length)
            elif isinstance(value, ModelValue):
                lifetime = OperandLifeTime.SUBGRAPH
                location = DataLocation(0, self.referenced_index(value.model), 0)
            else:
                lifetime = OperandLifeTime.TEMPORARY_VARIABLE
            code = op_type.type
            if op_type.is_extension:
                code = int(code)
                self.extension_prefixes.add(extension_prefix(code))
            operands.append(hal.Operand(
                type=code, dimensions=list(op_type.dimensions), scale=op_type.scale,
                zero_point=op_type.zero_point, lifetime=lifetime, location=location,
                channel_quant=op_type.channel_quant, number_of_consumers=consumers[index],
                extension_data=model._extension_data.get(index)))
        order = list(model._run_order)
        operations = []
        for i in order:
            record = model._operations[i]
            code = record.code
            if is_extension_type(code):
                code = int(code)
                self.extension_prefixes.add(extension_prefix(code))
            operations.append(hal.Operation(code, list(record.inputs), list(record.outputs)))
        return hal.Subgraph(operands, operations, list(model._inputs), list(model._outputs)), order


def build_hal_model(model: Model) -> tuple[hal.Model, list[int]]:
    """The HAL model of ``model``, and for each HAL operation of the main subgraph the
    index of the public operation it came from (the HAL lists them in run order)."""
    builder = _Builder()
    main, order = builder.subgraph(model)
    referenced = [subgraph for subgraph in builder.referenced if subgraph is not None]
    # The runtime's prefixes (type_manager) are the model's: list the extensions it uses.
    extensions = []
    for prefix in sorted(builder.extension_prefixes):
        extension = type_manager.extension_with_prefix(prefix)
        if extension is not None:  # always known: add_operand / add_operation checked it
            extensions.append(ExtensionNameAndPrefix(extension.name, prefix))
    hal_model = hal.Model(main=main, referenced=referenced, operand_values=bytes(builder.blob),
                          pools=builder.pools, relax_computation_float32_to_float16=model._relaxed,
                          extension_name_to_prefix=extensions)
    return hal_model, order
