"""hal.serialize: HAL objects round-trip through plain data, and the decoder rejects
malformed data with HalError(INVALID_ARGUMENT), never a raw exception."""

from __future__ import annotations

import random

import msgpack
import numpy as np
import pytest

import nnapi
from nnapi import OperandCode as T
from nnapi import OperandType
from nnapi import OperationCode as Op
from nnapi.hal import (
    Capabilities,
    DataLocation,
    ErrorStatus,
    Extension,
    ExtensionNameAndPrefix,
    ExtensionOperandTypeInformation,
    HalError,
    OutputShape,
    PerformanceInfo,
    Request,
    RequestArgument,
    Timing,
)
from nnapi.hal import serialize as S
from nnapi.runtime.model_builder import build_hal_model


def sample_hal_model():
    model = nnapi.Model()
    weights_type = OperandType(T.TENSOR_QUANT8_SYMM_PER_CHANNEL, [2, 1, 1, 1])
    x = model.add_operand(OperandType(T.TENSOR_FLOAT32, [2]))
    w = model.add_operand(weights_type)
    model.set_operand_symm_per_channel_quant_params(w, nnapi.SymmPerChannelQuantParams(0, [0.5, 0.25]))
    model.set_operand_value(w, np.array([1, 2], np.int8))
    act = model.add_operand(OperandType(T.INT32))
    model.set_operand_value(act, 0)
    big = model.add_operand(OperandType(T.TENSOR_FLOAT32, [2]))
    memory = nnapi.Memory.create_shared(8)
    np.frombuffer(memory.buffer, np.float32)[:] = [3, 4]
    model.set_operand_value_from_memory(big, memory, 0, 8)
    y = model.add_operand(OperandType(T.TENSOR_FLOAT32, [2]))
    model.add_operation(Op.ADD, [x, big, act], [y])
    model.identify_inputs_and_outputs([x], [y])
    model.finish()
    hal_model, _ = build_hal_model(model)
    hal_model.extension_name_to_prefix = [ExtensionNameAndPrefix("com.example.fib", 1)]
    hal_model.main.operands[0].extension_data = b"\x01\x02"
    return hal_model, memory


def test_model_round_trips_through_msgpack():
    hal_model, _memory = sample_hal_model()
    plain = S.model_to_plain(hal_model)
    decoded = S.model_from_plain(msgpack.unpackb(msgpack.packb(plain), strict_map_key=True))
    assert S.model_to_plain(decoded) == plain
    assert decoded.main.operands[1].channel_quant.scales == (0.5, 0.25)
    assert decoded.main.operands[0].extension_data == b"\x01\x02"
    assert bytes(decoded.pools[0]) == np.array([3, 4], np.float32).tobytes()
    assert S.model_digest(decoded) == S.model_digest(hal_model)


def test_digest_sees_every_change():
    hal_model, _memory = sample_hal_model()
    digest = S.model_digest(hal_model)
    hal_model.main.operands[0].scale = 0.1
    assert S.model_digest(hal_model) != digest
    hal_model.main.operands[0].scale = 0.0
    assert S.model_digest(hal_model) == digest
    hal_model.pools = [b"\0" * 8]
    assert S.model_digest(hal_model) != digest


def test_other_objects_round_trip():
    request = Request([RequestArgument(False, DataLocation(0, 4, 8), [2])], [RequestArgument(True)], [b"x" * 12])
    decoded = S.request_from_plain(S.request_to_plain(request))
    assert decoded == request
    shapes = [OutputShape([1, 2], False)]
    assert S.output_shapes_from_plain(S.output_shapes_to_plain(shapes)) == shapes
    assert S.timing_from_plain(S.timing_to_plain(Timing(5, 6))) == Timing(5, 6)
    caps = Capabilities(PerformanceInfo(0.5, 0.25), operand_performance={T.TENSOR_FLOAT32: PerformanceInfo(0.1, 2)},
                        step_cost_s=12e-6)
    assert S.capabilities_from_plain(S.capabilities_to_plain(caps)) == caps
    older = S.capabilities_to_plain(caps)
    del older["step_cost_s"]  # written before the field existed: not weighed
    assert S.capabilities_from_plain(older).step_cost_s == 0.0
    with pytest.raises(HalError, match="step_cost_s"):
        S.capabilities_from_plain({**older, "step_cost_s": -1.0})
    extensions = [Extension("com.example.fib", [ExtensionOperandTypeInformation(0, False, 8)])]
    assert S.extensions_from_plain(S.extensions_to_plain(extensions)) == extensions


@pytest.mark.parametrize("path, value", [
    (("version",), 99),
    (("main", "operands", 0, "type"), 12345),
    (("main", "operands", 0, "type"), True),
    (("main", "operands", 0, "lifetime"), 42),
    (("main", "operands", 0, "dimensions"), [-1]),
    (("main", "operands", 0, "scale"), float("nan")),
    (("main", "operands", 0, "location"), [0, 0]),
    (("main", "operands", 0, "extension_data"), "text"),
    (("main", "operations", 0, 0), 999),
    (("main", "operations", 0, 1), "abc"),
    (("main", "inputs"), None),
    (("operand_values",), [1, 2]),
    (("extensions", 0, 1), 1 << 20),
    (("relaxed",), 1),
])
def test_malformed_models_are_rejected(path, value):
    hal_model, _memory = sample_hal_model()
    plain = S.model_to_plain(hal_model)
    target = plain
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    with pytest.raises(HalError) as caught:
        S.model_from_plain(plain)
    assert caught.value.status == ErrorStatus.INVALID_ARGUMENT


def test_random_mutations_never_raise_raw():
    hal_model, _memory = sample_hal_model()
    packed = msgpack.packb(S.model_to_plain(hal_model))
    rng = random.Random(11)
    for _ in range(300):
        damaged = bytearray(packed)
        damaged[rng.randrange(len(damaged))] = rng.randrange(256)
        try:
            plain = msgpack.unpackb(bytes(damaged), strict_map_key=False)
        except Exception:  # noqa: BLE001 - msgpack's own rejection is the transport's business
            continue
        try:
            S.model_from_plain(plain)
        except HalError:
            pass
