"""Build and run small models through the public API, for operation tests."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

import nnapi
from nnapi import OperandType
from nnapi.runtime import manager

REFERENCE = "nnapi-reference"


def reference_devices() -> list[nnapi.Device]:
    """[nnapi-reference]: tests of the reference's own kernels compile for it explicitly, so a
    discovered plug-in (nnapi-ort-cpu) never takes their operations."""
    return [device for device in nnapi.get_devices() if device.name == REFERENCE]


def reference_device() -> nnapi.Device:
    """nnapi-reference, the device an optimized path's results are compared with."""
    return reference_devices()[0]


def run_on(model: nnapi.Model, device: nnapi.Device, inputs: Sequence[np.ndarray],
           outputs: Sequence[np.ndarray], typed: bool = False) -> list[np.ndarray]:
    """Compile ``model`` for ``device`` alone and run it once on ``inputs``, writing
    ``outputs`` (returned). ``typed``: each float32 argument given its own shape as the
    operand type, for a model whose operands leave dimensions open (a free batch)."""
    compilation = nnapi.Compilation(model, [device])
    compilation.finish()
    execution = nnapi.Execution(compilation)
    for position, value in enumerate(inputs):
        execution.set_input(position, value, OperandType(nnapi.OperandCode.TENSOR_FLOAT32, list(value.shape))
                            if typed else None)
    for position, array in enumerate(outputs):
        execution.set_output(position, array, OperandType(nnapi.OperandCode.TENSOR_FLOAT32, list(array.shape))
                             if typed else None)
    execution.compute()
    return list(outputs)


def constant(model: nnapi.Model, code: nnapi.OperandCode, value, shape: Sequence[int] | None = None) -> int:
    """An operand of ``code`` (and ``shape``: None for a scalar) added to ``model`` and set to
    ``value``; its index."""
    index = model.add_operand(OperandType(code, shape) if shape is not None else OperandType(code))
    model.set_operand_value(index, value)
    return index


def operand_adder(model: nnapi.Model, inputs: list[int] | None = None,
                  values: list[np.ndarray] | None = None) -> Callable[..., int]:
    """``operand(code, shape, value=None, scale=0.0, zero_point=0, given=False)``, which adds
    an operand of ``code`` and ``shape`` to ``model`` and returns its index: a constant
    holding ``value`` when one is given, except with ``given``, where it is a model input
    (appended to ``inputs``, ``value`` to ``values``: what a run gives it); else a
    temporary or output."""
    def operand(code: nnapi.OperandCode, shape: Sequence[int] | None, value=None, scale: float = 0.0,
                zero_point: int = 0, given: bool = False) -> int:
        index = model.add_operand(OperandType(code, shape, scale, zero_point))
        if given:
            assert inputs is not None and values is not None, "given operands need the inputs and values lists"
            inputs.append(index)
            values.append(value)
        elif value is not None:
            model.set_operand_value(index, value)
        return index
    return operand


def lowered_graph(model: nnapi.Model):
    """The ONNX graph (onnx.GraphProto) that nnapi-ort-cpu's lowering writes for the whole
    of ``model``, with every lowering module registered (needs onnxruntime and onnx)."""
    from nnapi.drivers.ort.device import OrtDevice  # noqa: F401  (registers every lowering)
    from nnapi.drivers.ort.lowering import lower_model
    from nnapi.runtime.model_builder import build_hal_model

    return lower_model(build_hal_model(model)[0])[0].graph


def lowered_node_types(model: nnapi.Model) -> list[str]:
    """The operator of each node of ``lowered_graph(model)``, in order."""
    return [node.op_type for node in lowered_graph(model).node]


@contextmanager
def only_devices(*devices) -> Iterator[None]:
    """Register ``devices`` and let the runtime see only them and nnapi-reference until the
    block ends: runtime tests (partitioning, fallback, preferences) check the choice among a
    known set of devices, which the plug-ins discovered on this machine must not join."""
    with manager._lock:
        manager.hal_devices()  # discover now, so the plug-ins are not added during the block
        saved = list(manager._devices)
        manager._devices[:] = [manager.reference_device()]
    try:
        for device in devices:
            manager.register_device(device)
        yield
    finally:
        with manager._lock:
            manager._devices[:] = saved


def build_single_op_model(code: nnapi.OperationCode, inputs: Sequence[tuple[OperandType, Any]],
                          outputs: Sequence[OperandType], constant_memory: bool = False):
    """A finished model with one operation. Each input is (type, value): value None makes
    it a model input, nnapi-style 'omitted' is spelled as the string "omitted", anything
    else is a constant (through shared memory when ``constant_memory`` and it is large).
    Returns (model, indexes of model inputs in order, keep-alive list)."""
    model = nnapi.Model()
    keep: list[Any] = []
    model_inputs = []
    input_indexes = []
    for op_type, value in inputs:
        index = model.add_operand(op_type.with_channel_quant(None))
        if op_type.channel_quant is not None:
            model.set_operand_symm_per_channel_quant_params(index, op_type.channel_quant)
        input_indexes.append(index)
        if value is None:
            model_inputs.append(index)
        elif isinstance(value, str) and value == "omitted":
            model.set_operand_value(index, None)
        else:
            array = np.asarray(value, dtype=op_type.dtype)
            keep.append(array)
            if constant_memory and array.nbytes > 0:
                memory = nnapi.Memory.create_shared(array.nbytes)
                np.frombuffer(memory.buffer, dtype=array.dtype)[:] = array.reshape(-1)
                keep.append(memory)
                model.set_operand_value_from_memory(index, memory, 0, array.nbytes)
            else:
                model.set_operand_value(index, array)
    output_indexes = [model.add_operand(t.with_channel_quant(None)) for t in outputs]
    model.add_operation(code, input_indexes, output_indexes)
    if not model_inputs:
        # The NDK wants at least one model input: an operation whose inputs are all
        # constants gets an extra, unused one (run_single_op feeds it DUMMY_FEED).
        model_inputs.append(model.add_operand(OperandType(nnapi.OperandCode.TENSOR_FLOAT32, [1])))
    model.identify_inputs_and_outputs(model_inputs, output_indexes)
    model.finish()
    return model, model_inputs, keep


#: The value run_single_op feeds to the extra input of an all-constant model.
DUMMY_FEED = np.zeros(1, np.float32)


def needed_dimensions(execution: nnapi.Execution, index: int) -> list[int]:
    """An output's dimensions, also after OUTPUT_INSUFFICIENT_SIZE (when the NDK reports
    that code and the needed dimensions with it)."""
    try:
        return execution.get_output_operand_dimensions(index)
    except nnapi.OutputInsufficientSizeError as error:
        return error.dimensions


def run_single_op(code: nnapi.OperationCode, inputs: Sequence[tuple[OperandType, Any]],
                  outputs: Sequence[OperandType], feeds: Sequence[np.ndarray] = (),
                  constant_memory: bool = False, devices: Sequence[nnapi.Device] | None = None) -> list[np.ndarray]:
    """Run a one-operation model on nnapi-reference (or ``devices``); ``feeds`` are the values of
    the model inputs (the inputs given with value None), in order. Outputs with unspecified
    dimensions are sized by a first run that reports OUTPUT_INSUFFICIENT_SIZE, as an NDK app would."""
    model, model_inputs, keep = build_single_op_model(code, inputs, outputs, constant_memory)
    if len(model_inputs) > len(feeds):
        feeds = [*feeds, DUMMY_FEED]
    compilation = nnapi.Compilation(model, reference_devices() if devices is None else devices)
    compilation.finish()
    buffers = [np.zeros(t.dimensions if t.is_fully_specified else (0,), dtype=t.dtype) for t in outputs]
    for _attempt in range(2):
        execution = nnapi.Execution(compilation)
        for position, feed in enumerate(feeds):
            execution.set_input(position, feed)
        for position, buffer in enumerate(buffers):
            execution.set_output(position, buffer)
        try:
            execution.compute()
        except nnapi.OutputInsufficientSizeError:
            buffers = [np.zeros(needed_dimensions(execution, i) if outputs[i].is_tensor else (),
                                dtype=outputs[i].dtype) for i in range(len(outputs))]
            continue
        return [buffer.reshape(execution.get_output_operand_dimensions(i)) if outputs[i].is_tensor else buffer
                for i, buffer in enumerate(buffers)]
    raise AssertionError("output sizes kept changing")


def add_model(dims: Sequence[int] = (2,), *, fuse: int = 0, finish: bool = True) -> nnapi.Model:
    """The one-ADD model many API tests need: out = a + b (float32, ``dims``), fused activation ``fuse``."""
    model = nnapi.Model()
    tensor = OperandType(nnapi.OperandCode.TENSOR_FLOAT32, list(dims))
    a, b = model.add_operand(tensor), model.add_operand(tensor)
    act = model.add_operand(OperandType(nnapi.OperandCode.INT32))
    out = model.add_operand(tensor)
    model.set_operand_value(act, fuse)
    model.add_operation(nnapi.OperationCode.ADD, [a, b, act], [out])
    model.identify_inputs_and_outputs([a, b], [out])
    if finish:
        model.finish()
    return model


def constant_add_chain() -> nnapi.Model:
    """Two operations on a constant: y = (a + b) + b, b = [1, 1] (float32)."""
    model = nnapi.Model()
    tensor = OperandType(nnapi.OperandCode.TENSOR_FLOAT32, [2])
    a, b = model.add_operand(tensor), model.add_operand(tensor)
    model.set_operand_value(b, np.ones(2, np.float32))
    act = model.add_operand(OperandType(nnapi.OperandCode.INT32))
    model.set_operand_value(act, 0)
    t, y = model.add_operand(tensor), model.add_operand(tensor)
    model.add_operation(nnapi.OperationCode.ADD, [a, b, act], [t])
    model.add_operation(nnapi.OperationCode.ADD, [t, b, act], [y])
    model.identify_inputs_and_outputs([a], [y])
    model.finish()
    return model


# --- operand types by element type, for operation tests --------------------------------
def f32(dims) -> OperandType:
    return OperandType(nnapi.OperandCode.TENSOR_FLOAT32, dims)


def f16(dims) -> OperandType:
    return OperandType(nnapi.OperandCode.TENSOR_FLOAT16, dims)


def i32(dims) -> OperandType:
    return OperandType(nnapi.OperandCode.TENSOR_INT32, dims)


def b8(dims) -> OperandType:
    return OperandType(nnapi.OperandCode.TENSOR_BOOL8, dims)


def q8(dims, scale, zero_point) -> OperandType:
    return OperandType(nnapi.OperandCode.TENSOR_QUANT8_ASYMM, dims, scale, zero_point)


def s8(dims, scale, zero_point) -> OperandType:
    return OperandType(nnapi.OperandCode.TENSOR_QUANT8_ASYMM_SIGNED, dims, scale, zero_point)


def scalar(code: nnapi.OperandCode, value) -> tuple[OperandType, Any]:
    """A constant scalar input for ``build_single_op_model`` / ``run_single_op``."""
    return (OperandType(code), value)


def litert_outputs(model: bytes | Path, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """LiteRT's outputs (single-threaded, its default delegate) for ``model``, a file or
    the flatbuffer's bytes, fed ``feeds`` by input name; ai_edge_litert must be installed."""
    from ai_edge_litert.interpreter import Interpreter

    if isinstance(model, Path):
        interpreter = Interpreter(model_path=str(model), num_threads=1)
    else:
        interpreter = Interpreter(model_content=model, num_threads=1)
    interpreter.allocate_tensors()
    by_name = {d["name"]: d for d in interpreter.get_input_details()}
    for name, value in feeds.items():
        interpreter.set_tensor(by_name[name]["index"], value)
    interpreter.invoke()
    return {d["name"]: interpreter.get_tensor(d["index"]) for d in interpreter.get_output_details()}


def litert_builtin_output(model: bytes, feed: np.ndarray) -> np.ndarray:
    """The output of a one-input, one-output .tflite model on LiteRT's builtin kernels
    without its default delegate (BUILTIN_WITHOUT_DEFAULT_DELEGATES: TFLite's own integer
    kernels, not XNNPACK's), single-threaded; ai_edge_litert must be installed."""
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    interpreter = Interpreter(model_content=model, num_threads=1,
                              experimental_op_resolver_type=OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES)
    interpreter.allocate_tensors()
    interpreter.set_tensor(interpreter.get_input_details()[0]["index"], feed)
    interpreter.invoke()
    return interpreter.get_tensor(interpreter.get_output_details()[0]["index"])


def imported_output(model: bytes, feed: np.ndarray, device: str = "nnapi-reference") -> np.ndarray:
    """The output of a one-input, one-output .tflite model imported by nnapi.load_tflite and
    run on ``device``."""
    session = nnapi.Session(model, devices=[device])
    return next(iter(session.run({session.inputs[0].name: feed}).values()))


def run_in_threads(worker: Callable[[int], None], count: int) -> None:
    """``worker(seed)`` for seeds 0 .. count - 1, each in its own thread, all at once;
    returns when every one has ended (workers record their failures themselves)."""
    threads = [threading.Thread(target=worker, args=(seed,)) for seed in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def model_of(op: nnapi.OperationCode, weights: np.ndarray) -> nnapi.Model:
    """y = op(x, weights) of four floats, weights a constant (the caching tests' model)."""
    model = nnapi.Model()
    tensor = OperandType(nnapi.OperandCode.TENSOR_FLOAT32, [4])
    x, w = model.add_operand(tensor), model.add_operand(tensor)
    act, y = model.add_operand(OperandType(nnapi.OperandCode.INT32)), model.add_operand(tensor)
    model.set_operand_value(w, weights)
    model.set_operand_value(act, 0)
    model.add_operation(op, [x, w, act], [y])
    model.identify_inputs_and_outputs([x], [y])
    model.finish()
    return model
