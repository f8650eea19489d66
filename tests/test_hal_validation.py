"""Drivers reject malformed HAL models at prepare and malformed requests, with
INVALID_ARGUMENT (after Android's VTS validation tests) — never a raw exception."""

from __future__ import annotations

import copy

import numpy as np
import pytest

from helpers import constant_add_chain
from nnapi import OperandCode as T
from nnapi.drivers.reference import ReferenceDevice
from nnapi.hal import DataLocation, ErrorStatus, HalError, OperandLifeTime, Request, RequestArgument
from nnapi.runtime.model_builder import build_hal_model

L = OperandLifeTime


def hal_chain():
    """y = (a + b) + b with a constant b, as a HAL model."""
    return build_hal_model(constant_add_chain())[0]


def broken(mutate):
    model = hal_chain()
    model = copy.copy(model)
    model.main = copy.deepcopy(model.main)
    mutate(model)
    return model


MUTATIONS = {
    "read before written": lambda m: m.main.operations.reverse(),
    "cycle": lambda m: setattr(m.main.operations[0], "inputs", [4, 1, 2]),
    "written twice": lambda m: setattr(m.main.operations[1], "outputs", [3]),
    "constant written": lambda m: setattr(m.main.operations[0], "outputs", [1]),
    "operand out of range": lambda m: setattr(m.main.operations[0], "inputs", [0, 99, 2]),
    "input lifetime": lambda m: setattr(m.main.operands[0], "lifetime", L.TEMPORARY_VARIABLE),
    "temporary with a location": lambda m: setattr(m.main.operands[3], "location", DataLocation(0, 4, 8)),
    "constant outside the blob": lambda m: setattr(m.main.operands[1], "location", DataLocation(0, 1000, 8)),
    "constant of the wrong length": lambda m: setattr(m.main.operands[1], "location", DataLocation(0, 0, 4)),
    "pool out of range": lambda m: (setattr(m.main.operands[1], "lifetime", L.CONSTANT_REFERENCE),
                                    setattr(m.main.operands[1], "location", DataLocation(3, 0, 8))),
    "unknown operation": lambda m: setattr(m.main.operations[0], "type", 999),
    "wrong operand count": lambda m: setattr(m.main.operations[0], "inputs", [0, 1]),
    "wrong operand type": lambda m: setattr(m.main.operands[2], "type", T.FLOAT32),
    "constant of rank 65": lambda m: setattr(m.main.operands[1], "dimensions", [1] * 64 + [2]),
    "model output never written": lambda m: setattr(m.main.operations[1], "outputs", [3]) or
        m.main.operations.pop(),
}


@pytest.mark.parametrize("name", sorted(MUTATIONS))
def test_prepare_rejects_malformed_models(name):
    model = broken(MUTATIONS[name])
    with pytest.raises(HalError) as caught:
        ReferenceDevice().prepare_model(model)
    assert caught.value.status == ErrorStatus.INVALID_ARGUMENT, str(caught.value)


def good_request(out):
    data = np.ones(2, np.float32)
    return Request([RequestArgument(False, DataLocation(0, 0, 8), [])],
                   [RequestArgument(False, DataLocation(1, 0, 8), [])], [data, out])


def test_malformed_requests_are_rejected():
    prepared = ReferenceDevice().prepare_model(hal_chain())
    out = np.zeros(2, np.float32)
    prepared.execute(good_request(out))
    np.testing.assert_array_equal(out, [3, 3])
    cases = []
    r = good_request(out)
    r.inputs[0].location = DataLocation(5, 0, 8)
    cases.append(r)
    r = good_request(out)
    r.outputs[0].location = DataLocation(1, 4, 8)
    cases.append(r)
    r = good_request(out)
    r.outputs = []
    cases.append(r)
    readonly = np.zeros(2, np.float32)
    readonly.flags.writeable = False
    cases.append(good_request(readonly))
    r = good_request(out)
    r.pools[0] = object()
    cases.append(r)
    for request in cases:
        with pytest.raises(HalError) as caught:
            prepared.execute(request)
        assert caught.value.status == ErrorStatus.INVALID_ARGUMENT
