"""What a compilation does once, and not again: the HAL model of a finished Model is built
once, nnapi-reference validates a HAL model object and checks its operations once (the
partitioner's query and prepare_model share the answer, and so do later compilations of
the same Model), while any other HAL model object is checked afresh."""

from __future__ import annotations

import copy
import gc

import numpy as np
import pytest

import nnapi
from helpers import constant_add_chain, reference_devices
from nnapi import OperandCode as T
from nnapi.drivers import reference
from nnapi.hal import HalError


@pytest.fixture
def counted(monkeypatch):
    """Counts of the reference driver's validate_model and unsupported_reason calls."""
    counts = {"validate_model": 0, "unsupported_reason": 0}
    for name in counts:
        original = getattr(reference, name)

        def counting(*args, _original=original, _name=name, **kwargs):
            counts[_name] += 1
            return _original(*args, **kwargs)

        monkeypatch.setattr(reference, name, counting)
    return counts


def _compute(compilation: nnapi.Compilation) -> np.ndarray:
    out = np.empty(2, np.float32)
    execution = nnapi.Execution(compilation)
    execution.set_input(0, np.array([1, 2], np.float32))
    execution.set_output(0, out)
    execution.compute()
    return out


def test_a_compilation_checks_each_operation_once(counted):
    compilation = nnapi.Compilation(constant_add_chain(), reference_devices())
    compilation.finish()
    # the partitioner's get_supported_operations and prepare_model share one answer
    assert counted == {"validate_model": 1, "unsupported_reason": 2}
    np.testing.assert_array_equal(_compute(compilation), [3, 4])


def test_a_second_compilation_does_not_validate_again(counted):
    model = constant_add_chain()
    first = nnapi.Compilation(model, reference_devices())
    first.finish()
    before = dict(counted)
    second = nnapi.Compilation(model, reference_devices())
    second.finish()
    assert counted == before
    assert model._hal_model()[0] is model._hal_model()[0]
    np.testing.assert_array_equal(_compute(second), [3, 4])


def test_another_hal_model_object_is_validated():
    device = reference.ReferenceDevice()
    hal_model = constant_add_chain()._hal_model()[0]
    device.prepare_model(hal_model)
    broken = copy.copy(hal_model)
    broken.main = copy.deepcopy(hal_model.main)
    broken.main.operations.reverse()  # the second ADD reads an operand before it is written
    with pytest.raises(HalError, match="read before it is written"):
        device.prepare_model(broken)
    unsupported = copy.copy(hal_model)
    unsupported.main = copy.deepcopy(hal_model.main)
    unsupported.main.operands[2].type = T.TENSOR_FLOAT32  # ADD's activation must be INT32
    unsupported.main.operands[2].dimensions = [1]
    unsupported.operand_values = hal_model.operand_values
    assert device.get_supported_operations(unsupported) == [False, False]
    with pytest.raises(HalError, match="main operation 0"):
        device.prepare_model(unsupported)


def test_what_a_device_learned_goes_with_the_model():
    device = reference.ReferenceDevice()
    hal_model = constant_add_chain()._hal_model()[0]
    assert device.get_supported_operations(hal_model) == [True, True]
    assert len(device._vetted) == 1
    del hal_model
    gc.collect()
    assert not device._vetted
