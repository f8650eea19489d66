"""The ORT device's capabilities, measured rather than invented.

The calibration run: for each operand type family the device computes in (float32,
float16, quant8 asymm, quant8 asymm signed) one small convolutional block -- a 3x3
CONV_2D, a 3x3 DEPTHWISE_CONV_2D and an ADD on a 1x28x28x16 tensor -- runs on the
reference device and on this device; a family's ``exec_time`` is the best ORT time over
the best reference time (the reference is 1.0 by definition; lower is better). Power is
not measurable here, so ``power_usage`` takes the same figure (time spent on one core).

The control flow figures (``if_performance``, ``while_performance``) come the same way
from two small blocks (``control_flow_models``): a WHILE of 8 iterations of a 64-wide
FULLY_CONNECTED and TANH, and an IF choosing between a TANH and a LOGISTIC.

``step_cost_s`` is the best time of the driver's execute on a model of one ADD of eight
floats: the fixed cost of a plan step on this device, which the runtime's partitioner
weighs against what small islands of operations save here.

It takes a fraction of a second, once per machine: the result is kept in
``$NNAPI_ORT_CALIBRATION`` or ``~/.cache/nnapi/ort-calibration.json``, keyed by the nnapi
and onnxruntime versions and the execution provider, and measured lazily on the first
``get_capabilities`` (device discovery itself measures nothing).
"""

from __future__ import annotations

import json
import math
import os
import platform
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from nnapi._version import __version__
from nnapi.codes import OperandCode, OperationCode
from nnapi.hal import (
    Capabilities,
    DataLocation,
    IPreparedModel,
    Model,
    Operand,
    OperandLifeTime,
    Operation,
    PerformanceInfo,
    Request,
    RequestArgument,
    Subgraph,
)
from nnapi.operand import SymmPerChannelQuantParams

if TYPE_CHECKING:
    from nnapi.drivers.ort.device import OrtDevice

T = OperandCode
L = OperandLifeTime
FAMILIES = {
    "float32": (T.TENSOR_FLOAT32,),
    "float16": (T.TENSOR_FLOAT16,),
    "quant8_asymm": (T.TENSOR_QUANT8_ASYMM,),
    "quant8_asymm_signed": (T.TENSOR_QUANT8_ASYMM_SIGNED, T.TENSOR_QUANT8_SYMM_PER_CHANNEL),
}
#: the calibration entry holding the fixed cost of an execution (seconds), beside the ratios
STEP_COST = "step_cost_s"
#: the calibration entries of the control flow blocks (control_flow_models), ratios too
CONTROL_FLOW = ("if", "while")
#: families that run on the device's int32 / bool tensors: shape and index operations
_OTHER_TYPES = (T.TENSOR_INT32, T.TENSOR_BOOL8, T.INT32, T.FLOAT32, T.FLOAT16, T.BOOL)


def cache_path() -> Path:
    configured = os.environ.get("NNAPI_ORT_CALIBRATION")
    if configured:
        return Path(configured)
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "nnapi" / "ort-calibration.json"


def _key(device: OrtDevice) -> str:
    import onnxruntime

    return f"{__version__}|{onnxruntime.__version__}|{device.provider}|{platform.machine()}|{platform.node()}"


def capabilities(device: OrtDevice) -> Capabilities:
    """The device's Capabilities from the cached calibration, measuring it if needed."""
    ratios = _load(device)
    if ratios is None:
        with np.errstate(all="ignore"):  # the caller's numpy error state is not the calibration's
            ratios = measure(device)
        _store(device, ratios)
    performance = {}
    for family, codes in FAMILIES.items():
        for code in codes:
            performance[code] = PerformanceInfo(ratios[family], ratios[family])
    for code in _OTHER_TYPES:
        performance[code] = PerformanceInfo(ratios["float32"], ratios["float32"])
    relaxed = PerformanceInfo(ratios["float32"], ratios["float32"])
    if_performance, while_performance = (PerformanceInfo(ratios[name], ratios[name]) for name in CONTROL_FLOW)
    return Capabilities(relaxed_float32_to_float16_scalar=relaxed, relaxed_float32_to_float16_tensor=relaxed,
                        operand_performance=performance, if_performance=if_performance,
                        while_performance=while_performance, step_cost_s=ratios[STEP_COST])


def _load(device: OrtDevice) -> dict[str, float] | None:
    try:
        stored = json.loads(cache_path().read_text())
        ratios = stored[_key(device)]
        if set(ratios) == {*FAMILIES, *CONTROL_FLOW, STEP_COST} and all(
                isinstance(v, float) and 0 < v < math.inf for v in ratios.values()):
            return ratios
    except (OSError, ValueError, KeyError, TypeError, RecursionError):  # JSON nested past the parser's depth
        pass
    return None


def _store(device: OrtDevice, ratios: dict[str, float]) -> None:
    path = cache_path()
    try:
        try:
            stored = json.loads(path.read_text())
            if not isinstance(stored, dict):
                stored = {}
        except (OSError, ValueError, RecursionError):
            stored = {}
        stored[_key(device)] = ratios
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_suffix(f".{os.getpid()}.tmp")
        temporary.write_text(json.dumps(stored, indent=1))
        os.replace(temporary, path)
    except OSError:
        pass  # a read-only home: measure again next time


def measure(device: OrtDevice) -> dict[str, float]:
    """ORT time / reference time of the calibration block, per type family."""
    from nnapi.drivers.reference import ReferenceDevice

    reference = ReferenceDevice()
    ratios = {}
    for family, codes in FAMILIES.items():
        model, request = calibration_model(codes[0], codes[-1])
        ours = _best_time(device.prepare_model(model), request, 20)
        theirs = _best_time(reference.prepare_model(model), request, 3)
        ratios[family] = float(max(ours / theirs, 1e-4))
    for name, (model, request) in control_flow_models().items():
        ours = _best_time(device.prepare_model(model), request, 20)
        theirs = _best_time(reference.prepare_model(model), request, 5)
        ratios[name] = float(max(ours / theirs, 1e-4))
    model, request = one_add_model()
    ratios[STEP_COST] = float(max(_best_time(device.prepare_model(model), request, 200), 1e-7))
    return ratios


def _best_time(prepared: IPreparedModel, request: Request, runs: int) -> float:
    prepared.execute(request)
    best = float("inf")
    for _ in range(runs):
        start = time.perf_counter()
        prepared.execute(request)
        best = min(best, time.perf_counter() - start)
    return best


class _Graph:
    """Operands and operations of one HAL subgraph under construction; constants go into
    the model's shared blob."""

    def __init__(self, blob: bytearray) -> None:
        self.blob = blob
        self.operands: list[Operand] = []
        self.operations: list[Operation] = []

    def operand(self, code: OperandCode, dims: list[int], lifetime: OperandLifeTime,
                data: np.ndarray | None = None, scale: float = 0.0, zero_point: int = 0,
                channel_quant: SymmPerChannelQuantParams | None = None,
                location: DataLocation | None = None) -> int:
        """An operand; ``data`` (a constant's value) goes into the blob, 8-byte aligned."""
        if data is not None:
            self.blob.extend(b"\0" * (-len(self.blob) % 8))
            raw = np.ascontiguousarray(data).tobytes()
            location = DataLocation(0, len(self.blob), len(raw))
            self.blob.extend(raw)
        self.operands.append(Operand(code, list(dims), scale, zero_point, lifetime, location or DataLocation(),
                                     channel_quant))
        return len(self.operands) - 1

    def operation(self, code: OperationCode, inputs: list[int], outputs: list[int]) -> None:
        self.operations.append(Operation(code, inputs, outputs))
        for index in inputs:  # HAL validation checks the counts
            self.operands[index].number_of_consumers += 1

    def subgraph(self, inputs: list[int], outputs: list[int]) -> Subgraph:
        return Subgraph(self.operands, self.operations, inputs, outputs)


def one_add_model() -> tuple[Model, Request]:
    """ADD of two [1, 8] float32 inputs, and a request for it: a model whose compute is
    negligible, so its execution time is the device's fixed cost."""
    vector = [1, 8]
    operands = [Operand(T.TENSOR_FLOAT32, vector, 0.0, 0, L.SUBGRAPH_INPUT, number_of_consumers=1),
                Operand(T.TENSOR_FLOAT32, vector, 0.0, 0, L.SUBGRAPH_INPUT, number_of_consumers=1),
                Operand(T.INT32, [], 0.0, 0, L.CONSTANT_COPY, DataLocation(0, 0, 4), number_of_consumers=1),
                Operand(T.TENSOR_FLOAT32, vector, 0.0, 0, L.SUBGRAPH_OUTPUT)]
    add = Operation(OperationCode.ADD, [0, 1, 2], [3])
    model = Model(Subgraph(operands, [add], [0, 1], [3]), [], np.zeros(1, np.int32).tobytes(), [])
    data = np.ones(8, np.float32).tobytes()
    request = Request([RequestArgument(False, DataLocation(0, 0, 32)), RequestArgument(False, DataLocation(1, 0, 32))],
                      [RequestArgument(False, DataLocation(2, 0, 32))], [data, data, bytearray(32)])
    return model, request


def calibration_model(code: OperandCode, filter_code: OperandCode) -> tuple[Model, Request]:
    """The calibration block in ``code`` (filters in ``filter_code``) and a request for it."""
    rng = np.random.default_rng(7)
    channels, size = 16, 28
    blob = bytearray()
    graph = _Graph(blob)
    add = graph.operand
    quantized = code in (T.TENSOR_QUANT8_ASYMM, T.TENSOR_QUANT8_ASYMM_SIGNED)
    zero = 128 if code == T.TENSOR_QUANT8_ASYMM else 0

    def scalar(value: int) -> int:
        return add(T.INT32, [], L.CONSTANT_COPY, np.array(value, np.int32))

    def weights(dims: list[int]) -> int:
        if not quantized:
            return add(code, dims, L.CONSTANT_COPY, (rng.standard_normal(dims) * 0.1).astype(_float(code)))
        if filter_code == T.TENSOR_QUANT8_SYMM_PER_CHANNEL:
            axis = 0 if dims[0] != 1 else 3
            params = SymmPerChannelQuantParams(axis, [0.01] * dims[axis])
            return add(filter_code, dims, L.CONSTANT_COPY, rng.integers(-127, 128, dims, dtype=np.int8),
                       channel_quant=params)
        return add(code, dims, L.CONSTANT_COPY, rng.integers(0, 255, dims).astype(_storage(code)), 0.01, zero)

    def bias() -> int:
        if quantized:
            return add(T.TENSOR_INT32, [channels], L.CONSTANT_COPY, rng.integers(-100, 100, channels,
                                                                                dtype=np.int32), 0.05 * 0.01)
        return add(code, [channels], L.CONSTANT_COPY, rng.standard_normal(channels).astype(_float(code)))

    shape = [1, size, size, channels]
    act: dict[str, Any] = {"scale": 0.05, "zero_point": zero} if quantized else {}
    source = add(code, shape, L.SUBGRAPH_INPUT, **act)
    conv_out = add(code, shape, L.TEMPORARY_VARIABLE, **act)
    depth_out = add(code, shape, L.TEMPORARY_VARIABLE, **act)
    result = add(code, shape, L.SUBGRAPH_OUTPUT, **act)
    graph.operation(OperationCode.CONV_2D, [source, weights([channels, 3, 3, channels]), bias(), scalar(1),
                                            scalar(1), scalar(1), scalar(1)], [conv_out])
    graph.operation(OperationCode.DEPTHWISE_CONV_2D, [conv_out, weights([1, 3, 3, channels]), bias(),
                                                      scalar(1), scalar(1), scalar(1), scalar(1), scalar(1)],
                    [depth_out])
    graph.operation(OperationCode.ADD, [depth_out, source, scalar(0)], [result])
    model = Model(graph.subgraph([source], [result]), [], bytes(blob), [])
    element = np.dtype(_storage(code)) if quantized else np.dtype(_float(code))
    nbytes = int(np.prod(shape)) * element.itemsize
    data = (rng.integers(0, 255, shape).astype(element) if quantized
            else rng.standard_normal(shape).astype(element))
    request = Request([RequestArgument(False, DataLocation(0, 0, nbytes))],
                      [RequestArgument(False, DataLocation(1, 0, nbytes))],
                      [data.tobytes(), bytearray(nbytes)])
    return model, request


def _float(code: OperandCode) -> type[np.floating]:
    return np.float16 if code == T.TENSOR_FLOAT16 else np.float32


def _storage(code: OperandCode) -> type[np.integer]:
    return np.int8 if code == T.TENSOR_QUANT8_ASYMM_SIGNED else np.uint8


#: the loop's state: a [1, 64] float32 vector, through a 64 x 64 FULLY_CONNECTED and TANH per iteration
_LOOP_WIDTH = 64
_LOOP_ITERATIONS = 8


def control_flow_models() -> dict[str, tuple[Model, Request]]:
    """The control flow calibration blocks and their requests: ``while``, a WHILE of
    _LOOP_ITERATIONS iterations whose body is a FULLY_CONNECTED, a TANH and a counter's
    ADD, its condition a LESS; ``if``, an IF choosing between a TANH and a LOGISTIC."""
    rng = np.random.default_rng(7)
    blob = bytearray()
    vector = [1, _LOOP_WIDTH]
    models = {}

    def values(graph: _Graph, lifetime: OperandLifeTime) -> tuple[int, int, int]:
        """A loop model's inputs: counter, state, limit."""
        return (graph.operand(T.TENSOR_INT32, [1], lifetime), graph.operand(T.TENSOR_FLOAT32, vector, lifetime),
                graph.operand(T.TENSOR_INT32, [1], lifetime))

    condition = _Graph(blob)
    counter, state, limit = values(condition, L.SUBGRAPH_INPUT)
    going = condition.operand(T.TENSOR_BOOL8, [1], L.SUBGRAPH_OUTPUT)
    condition.operation(OperationCode.LESS, [counter, limit], [going])
    body = _Graph(blob)
    counter, state, limit = values(body, L.SUBGRAPH_INPUT)
    one = body.operand(T.TENSOR_INT32, [1], L.CONSTANT_COPY, np.ones(1, np.int32))
    none = body.operand(T.INT32, [], L.CONSTANT_COPY, np.zeros(1, np.int32))
    weights = body.operand(T.TENSOR_FLOAT32, [_LOOP_WIDTH] * 2, L.CONSTANT_COPY,
                           (rng.standard_normal([_LOOP_WIDTH] * 2) * 0.2).astype(np.float32))
    bias = body.operand(T.TENSOR_FLOAT32, [_LOOP_WIDTH], L.CONSTANT_COPY, np.zeros(_LOOP_WIDTH, np.float32))
    product = body.operand(T.TENSOR_FLOAT32, vector, L.TEMPORARY_VARIABLE)
    next_counter = body.operand(T.TENSOR_INT32, [1], L.SUBGRAPH_OUTPUT)
    next_state = body.operand(T.TENSOR_FLOAT32, vector, L.SUBGRAPH_OUTPUT)
    body.operation(OperationCode.ADD, [counter, one, none], [next_counter])
    body.operation(OperationCode.FULLY_CONNECTED, [state, weights, bias, none], [product])
    body.operation(OperationCode.TANH, [product], [next_state])
    main = _Graph(blob)
    start = main.operand(T.TENSOR_INT32, [1], L.CONSTANT_COPY, np.zeros(1, np.int32))
    source = main.operand(T.TENSOR_FLOAT32, vector, L.SUBGRAPH_INPUT)
    end = main.operand(T.TENSOR_INT32, [1], L.CONSTANT_COPY, np.full(1, _LOOP_ITERATIONS, np.int32))
    models_in = [main.operand(T.MODEL, [], L.SUBGRAPH, location=DataLocation(0, k, 0)) for k in (0, 1)]
    finals = [main.operand(T.TENSOR_INT32, [1], L.SUBGRAPH_OUTPUT), main.operand(T.TENSOR_FLOAT32, vector,
                                                                                  L.SUBGRAPH_OUTPUT)]
    main.operation(OperationCode.WHILE, [*models_in, start, source, end], finals)
    referenced = [condition.subgraph([0, 1, 2], [going]), body.subgraph([0, 1, 2], [next_counter, next_state])]
    state_bytes = _LOOP_WIDTH * 4
    data = rng.standard_normal(vector).astype(np.float32).tobytes()
    models["while"] = (
        Model(main.subgraph([source], finals), referenced, bytes(blob), []),
        Request([RequestArgument(False, DataLocation(0, 0, state_bytes))],
                [RequestArgument(False, DataLocation(1, 0, 4)),
                 RequestArgument(False, DataLocation(2, 0, state_bytes))],
                [data, bytearray(4), bytearray(state_bytes)]))

    blob = bytearray()
    branches = []
    for code in (OperationCode.TANH, OperationCode.LOGISTIC):
        branch = _Graph(blob)
        x = branch.operand(T.TENSOR_FLOAT32, vector, L.SUBGRAPH_INPUT)
        y = branch.operand(T.TENSOR_FLOAT32, vector, L.SUBGRAPH_OUTPUT)
        branch.operation(code, [x], [y])
        branches.append(branch.subgraph([x], [y]))
    main = _Graph(blob)
    chosen = main.operand(T.TENSOR_BOOL8, [1], L.SUBGRAPH_INPUT)
    source = main.operand(T.TENSOR_FLOAT32, vector, L.SUBGRAPH_INPUT)
    models_in = [main.operand(T.MODEL, [], L.SUBGRAPH, location=DataLocation(0, k, 0)) for k in (0, 1)]
    result = main.operand(T.TENSOR_FLOAT32, vector, L.SUBGRAPH_OUTPUT)
    main.operation(OperationCode.IF, [chosen, *models_in, source], [result])
    models["if"] = (
        Model(main.subgraph([chosen, source], [result]), branches, bytes(blob), []),
        Request([RequestArgument(False, DataLocation(0, 0, 1)),
                 RequestArgument(False, DataLocation(1, 0, state_bytes))],
                [RequestArgument(False, DataLocation(2, 0, state_bytes))],
                [np.ones(1, np.bool_).tobytes(), data, bytearray(state_bytes)]))
    return models
