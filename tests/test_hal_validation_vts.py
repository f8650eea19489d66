"""HAL validation as VTS expects (ValidateModel / ValidateRequest): malformed HAL models and
requests, built directly, are rejected by the drivers with INVALID_ARGUMENT naming what is
wrong — at prepare for a model, at execute before anything runs for a request."""

from __future__ import annotations

import copy

import numpy as np
import pytest

from nnapi.codes import OperandCode, OperationCode
from nnapi.drivers.reference import ReferenceDevice
from nnapi.drivers.sample import FaultyDevice
from nnapi.hal import ErrorStatus, HalError
from nnapi.hal.types import (
    DataLocation,
    FdPool,
    Model,
    Operand,
    OperandLifeTime,
    Operation,
    Request,
    RequestArgument,
    Subgraph,
)

L = OperandLifeTime
T = OperandCode
F32 = T.TENSOR_FLOAT32


def _model() -> Model:
    """out = (in + c) + c, with c = [1, 2] and a NONE activation (a valid model)."""
    values = np.array([1.0, 2.0], np.float32).tobytes() + np.array([0], np.int32).tobytes()
    operands = [
        Operand(F32, [2], 0.0, 0, L.SUBGRAPH_INPUT, number_of_consumers=1),
        Operand(F32, [2], 0.0, 0, L.CONSTANT_COPY, DataLocation(0, 0, 8), number_of_consumers=2),
        Operand(T.INT32, [], 0.0, 0, L.CONSTANT_COPY, DataLocation(0, 8, 4), number_of_consumers=2),
        Operand(F32, [2], 0.0, 0, L.TEMPORARY_VARIABLE, number_of_consumers=1),
        Operand(F32, [2], 0.0, 0, L.SUBGRAPH_OUTPUT),
    ]
    operations = [Operation(OperationCode.ADD, [0, 1, 2], [3]), Operation(OperationCode.ADD, [3, 1, 2], [4])]
    return Model(Subgraph(operands, operations, [0], [4]), [], values, [])


def _request() -> Request:
    pool_in = bytearray(np.array([10.0, 20.0], np.float32).tobytes())
    return Request([RequestArgument(location=DataLocation(0, 0, 8))],
                   [RequestArgument(location=DataLocation(1, 0, 8))], [pool_in, bytearray(8)])


def _reject_prepare(device, model: Model, *fragments: str) -> None:
    with pytest.raises(HalError) as caught:
        device.prepare_model(model)
    assert caught.value.status == ErrorStatus.INVALID_ARGUMENT, caught.value
    for fragment in fragments:
        assert fragment in str(caught.value), (fragment, str(caught.value))


def test_the_valid_model_prepares_and_runs():
    request = _request()
    prepared = ReferenceDevice().prepare_model(_model())
    shapes, _ = prepared.execute(request)
    assert shapes[0].dimensions == [2]
    np.testing.assert_array_equal(np.frombuffer(request.pools[1], np.float32), [12.0, 24.0])


def _set(path: str, value):
    """A mutator setting an attribute reached by a dotted path from the model."""
    def mutate(model: Model) -> None:
        *parents, last = path.split(".")
        target = model
        for part in parents:
            target = target[int(part)] if part.isdigit() else getattr(target, part)
        if last.isdigit():
            target[int(last)] = value
        else:
            setattr(target, last, value)
    return mutate


def _swap_operations(model: Model) -> None:
    model.main.operations.reverse()


def _cycle(model: Model) -> None:
    # operation 0 reads what operation 1 writes, and operation 1 reads what 0 writes
    model.main.operations[0].inputs[0] = 4
    model.main.operations[1].inputs[0] = 3
    model.main.operands[0].number_of_consumers = 0
    model.main.operands[4].number_of_consumers = 1


def _write_twice(model: Model) -> None:
    model.main.operations[1].outputs[0] = 3
    model.main.operands[3].number_of_consumers = 1


def _never_written(model: Model) -> None:
    model.main.operands.append(Operand(F32, [2], 0.0, 0, L.TEMPORARY_VARIABLE))


def _output_missing_from_list(model: Model) -> None:
    model.main.output_indexes.clear()


def _input_listed_twice(model: Model) -> None:
    model.main.input_indexes.append(0)


def _wrong_input_count(model: Model) -> None:
    model.main.operations[0].inputs.pop()
    model.main.operands[2].number_of_consumers = 1


def _wrong_input_type(model: Model) -> None:
    model.main.operands[2] = Operand(T.FLOAT32, [], 0.0, 0, L.CONSTANT_COPY, DataLocation(0, 8, 4),
                                     number_of_consumers=2)


def _subgraph_cycle(model: Model) -> None:
    inner = _model().main
    inner.operands.append(Operand(T.MODEL, [], 0.0, 0, L.SUBGRAPH, DataLocation(0, 0, 0)))
    model.referenced.append(inner)


MODEL_CASES = [
    ("unknown operand type", _set("main.operands.0.type", 999), ["main operand 0", "unknown operand type"]),
    ("scalar with dimensions", _set("main.operands.2.dimensions", [1]), ["main operand 2", "no dimensions"]),
    ("quant8 without scale", _set("main.operands.0.type", T.TENSOR_QUANT8_ASYMM), ["main operand 0", "scale"]),
    ("bad lifetime", _set("main.operands.3.lifetime", 42), ["main operand 3", "lifetime"]),
    ("temporary with a location", _set("main.operands.3.location", DataLocation(0, 4, 8)),
     ["main operand 3", "empty location"]),
    ("input with a location", _set("main.operands.0.location", DataLocation(1, 0, 0)), ["main operand 0"]),
    ("constant outside operand_values", _set("main.operands.1.location", DataLocation(0, 8, 8)),
     ["main operand 1", "outside operand_values"]),
    ("constant copy with a pool index", _set("main.operands.1.location", DataLocation(1, 0, 8)),
     ["main operand 1", "pool index"]),
    ("constant length mismatch", _set("main.operands.1.location", DataLocation(0, 0, 4)),
     ["main operand 1", "length 4"]),
    ("constant of unspecified dimensions", _set("main.operands.1.dimensions", [0]),
     ["main operand 1", "has unspecified dimensions"]),
    ("size overflowing uint32", _set("main.operands.0.dimensions", [65536, 32768]),
     ["main operand 0", "larger than 4 GiB (its size overflows uint32:"]),
    ("size overflowing uint32 beside an unspecified dimension", _set("main.operands.0.dimensions", [65536, 0, 16384]),
     ["main operand 0", "TENSOR_FLOAT32 of 3 dimensions [65536, 0, 16384] is larger than 4 GiB"]),
    ("negative offset", _set("main.operands.1.location", DataLocation(0, -4, 8)), ["main operand 1"]),
    ("reference to a missing pool", _set("main.operands.1.lifetime", L.CONSTANT_REFERENCE),
     ["main operand 1", "pool 0 does not exist"]),
    ("subgraph operand out of range", _set("main.operands.2", Operand(T.MODEL, [], 0.0, 0, L.SUBGRAPH,
                                                                       DataLocation(0, 3, 0), number_of_consumers=2)),
     ["main operand 2", "referenced subgraph 3"]),
    ("operand index out of range", _set("main.operations.0.inputs", [0, 1, 7]),
     ["main operation 0 (ADD)", "operand 7 out of range"]),
    ("read before written", _swap_operations, ["main operation 0 (ADD)", "operand 3", "before it is written"]),
    ("cycle", _cycle, ["main operation 0 (ADD)", "before it is written"]),
    ("written twice", _write_twice, ["operation 1 (ADD)", "more than one operation"]),
    ("writes a constant", _set("main.operations.1.outputs", [1]), ["operation 1 (ADD)", "CONSTANT_COPY"]),
    ("never written", _never_written, ["main operand 5", "never written"]),
    ("consumer count", _set("main.operands.0.number_of_consumers", 3), ["main operand 0", "number_of_consumers"]),
    ("output missing from the list", _output_missing_from_list, ["main operand 4", "missing from the outputs"]),
    ("input listed twice", _input_listed_twice, ["listed twice"]),
    ("input list names a temporary", _set("main.input_indexes", [3]), ["main input 0", "TEMPORARY_VARIABLE"]),
    ("model output out of range", _set("main.output_indexes", [9]), ["main output 0", "out of range"]),
    ("unknown operation type", _set("main.operations.0.type", 5000), ["main operation 0", "unknown operation"]),
    ("extension operation without prefix", _set("main.operations.0.type", (7 << 16) | 1),
     ["main operation 0", "unknown prefix"]),
    ("wrong operand count for ADD", _wrong_input_count, ["main operation 0", "ADD"]),
    ("wrong operand type for ADD", _wrong_input_type, ["main operation 0", "ADD"]),
    ("subgraph reference cycle", _subgraph_cycle, ["referenced[0]", "cycle"]),
]


@pytest.mark.parametrize(("mutate", "fragments"), [c[1:] for c in MODEL_CASES], ids=[c[0] for c in MODEL_CASES])
@pytest.mark.parametrize("device_kind", ["reference", "faulty"])
def test_malformed_model_is_rejected_at_prepare(mutate, fragments, device_kind):
    model = _model()
    mutate(model)
    device = ReferenceDevice() if device_kind == "reference" else FaultyDevice("validation-faulty")
    _reject_prepare(device, copy.deepcopy(model), *fragments)
    if device_kind == "faulty":
        assert device.prepare_count == 1


def _arg(pool: int, offset: int, length: int, dims=()) -> RequestArgument:
    return RequestArgument(location=DataLocation(pool, offset, length), dimensions=list(dims))


REQUEST_CASES = [
    ("too few inputs", lambda r: r.inputs.clear(), ["0 inputs", "1"]),
    ("too many outputs", lambda r: r.outputs.append(_arg(1, 0, 8)), ["2 outputs"]),
    ("input pool index", lambda r: r.inputs.__setitem__(0, _arg(5, 0, 8)), ["input 0", "pool 5 does not exist"]),
    ("output pool index", lambda r: r.outputs.__setitem__(0, _arg(2, 0, 8)), ["output 0", "pool 2"]),
    ("offset past the pool", lambda r: r.inputs.__setitem__(0, _arg(0, 4, 8)), ["input 0", "outside pool 0"]),
    ("length past the pool", lambda r: r.outputs.__setitem__(0, _arg(1, 0, 64)), ["output 0", "outside pool 1"]),
    ("negative offset", lambda r: r.inputs.__setitem__(0, _arg(0, -8, 8)), ["input 0", "unsigned"]),
    ("read-only output pool", lambda r: r.pools.__setitem__(1, bytes(8)), ["output 0", "read-only"]),
    ("read-only output fd pool", lambda r: r.pools.__setitem__(1, FdPool(-1, 0, 8, False, bytearray(8))),
     ["output 0", "read-only"]),
    ("wrong rank", lambda r: r.inputs.__setitem__(0, _arg(0, 0, 8, [2, 1])), ["input 0", "contradict"]),
    ("wrong dimension", lambda r: r.outputs.__setitem__(0, _arg(1, 0, 8, [3])), ["output 0", "contradict"]),
    ("no value with a location", lambda r: r.inputs.__setitem__(0, RequestArgument(True, DataLocation(0, 0, 8))),
     ["input 0", "no value"]),
    ("pool that is no memory", lambda r: r.pools.__setitem__(0, object()), ["request pool 0"]),
]


@pytest.mark.parametrize(("mutate", "fragments"), [c[1:] for c in REQUEST_CASES], ids=[c[0] for c in REQUEST_CASES])
@pytest.mark.parametrize("device_kind", ["reference", "faulty"])
def test_malformed_request_is_rejected_before_running(mutate, fragments, device_kind):
    device = ReferenceDevice() if device_kind == "reference" else FaultyDevice("validation-faulty")
    prepared = device.prepare_model(_model())
    request = _request()
    mutate(request)
    with pytest.raises(HalError) as caught:
        prepared.execute(request)
    assert caught.value.status == ErrorStatus.INVALID_ARGUMENT, caught.value
    for fragment in fragments:
        assert fragment in str(caught.value), (fragment, str(caught.value))
    # nothing was written to the caller's output
    if len(request.pools) > 1 and isinstance(request.pools[1], bytearray):
        assert bytes(request.pools[1][:8]) == bytes(8)


def test_validated_prepare_never_raises_a_raw_exception_for_junk_fields():
    junk = [None, "x", 1.5, -1, 2**40]
    for field_name in ("type", "lifetime", "number_of_consumers"):
        for value in junk:
            model = _model()
            setattr(model.main.operands[1], field_name, value)
            with pytest.raises(HalError) as caught:
                ReferenceDevice().prepare_model(model)
            assert caught.value.status == ErrorStatus.INVALID_ARGUMENT
