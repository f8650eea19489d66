"""What the tools share: rebuilding a public Model from its HAL form (with extra
outputs), seeded random inputs, and running a compilation whatever its output shapes."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

import nnapi
from nnapi.codes import OperandCode
from nnapi.errors import OutputInsufficientSizeError
from nnapi.hal import Model as HalModel
from nnapi.hal import OperandLifeTime, Subgraph
from nnapi.operand import OperandType, SymmPerChannelQuantParams, dtype_of
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


def random_input(op_type: OperandType, rng: np.random.Generator) -> np.ndarray:
    """A seeded random value for an input: floats in [-1, 1), quantized values over the
    type's whole range, small non-negative integers, random booleans."""
    dims = [d if d else 1 for d in op_type.dimensions]
    dtype = dtype_of(op_type.type)
    if np.issubdtype(dtype, np.floating):
        return rng.uniform(-1, 1, dims).astype(dtype)
    if dtype == np.bool_:
        return rng.integers(0, 2, dims).astype(np.bool_)
    if op_type.type in (T.TENSOR_INT32, T.INT32, T.UINT32):
        return rng.integers(0, 4, dims).astype(dtype)
    info = np.iinfo(dtype)
    return rng.integers(info.min, int(info.max) + 1, dims).astype(dtype)


def _needed_dimensions(execution: nnapi.Execution, index: int) -> list[int]:
    """An output's full shape after OUTPUT_INSUFFICIENT_SIZE (the NDK reports it through
    the error; the dimensions ride on it)."""
    try:
        return list(execution.get_output_operand_dimensions(index))
    except OutputInsufficientSizeError as error:
        return list(getattr(error, "dimensions", None) or [])


def run(compilation: nnapi.Compilation, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Execute ``compilation`` once; outputs sized from the declared shapes, or from the
    shapes the driver reports when those are unknown or too small."""
    model = compilation.model
    types = [model.operand_type(i) for i in model.outputs]
    sizes = [t.element_count() if t.is_fully_specified else 1 for t in types]
    for _attempt in range(3):
        execution = nnapi.Execution(compilation)
        for position, value in enumerate(inputs):
            execution.set_input(position, value)
        buffers = [np.zeros(max(size, 1), dtype_of(t.type)) for size, t in zip(sizes, types)]
        for position, buffer in enumerate(buffers):
            execution.set_output(position, buffer)
        try:
            execution.compute()
        except OutputInsufficientSizeError:
            sizes = [int(np.prod(_needed_dimensions(execution, i))) for i in range(len(types))]
            continue
        results = []
        for position, buffer in enumerate(buffers):
            dims = execution.get_output_operand_dimensions(position)
            results.append(buffer[:int(np.prod(dims))].reshape(dims))
        return results
    raise nnapi.OpFailedError("output shapes kept changing between executions")
