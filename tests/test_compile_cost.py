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
    """Counts of the reference driver's validate_model and vet_operation calls."""
    counts = {"validate_model": 0, "vet_operation": 0}
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
    assert counted == {"validate_model": 1, "vet_operation": 2}
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


# --- the output shapes validation inferred, which the plan takes -------------------------------
def _conv_model(height: int) -> nnapi.Model:
    """CONV_2D 3x3 (same padding, 2 -> 3 channels) -> RESHAPE to rows of 3 -> SOFTMAX, float32,
    on an image of ``height`` x 4 x 2."""
    model = nnapi.Model()
    f32 = lambda dims: nnapi.OperandType(T.TENSOR_FLOAT32, dims)  # noqa: E731

    def constant(operand_type, value):
        index = model.add_operand(operand_type)
        model.set_operand_value(index, value)
        return index

    image = model.add_operand(f32([1, height, 4, 2]))
    weights = constant(f32([3, 3, 3, 2]), np.linspace(-1, 1, 54, dtype=np.float32).reshape(3, 3, 3, 2))
    bias = constant(f32([3]), np.array([0.5, -0.25, 0], np.float32))
    scalars = [constant(nnapi.OperandType(T.INT32), np.int32(v)) for v in (1, 1, 1, 0)]  # SAME, strides 1, none
    features = model.add_operand(f32([1, height, 4, 3]))
    model.add_operation(nnapi.OperationCode.CONV_2D, [image, weights, bias, *scalars], [features])
    rows = constant(nnapi.OperandType(T.TENSOR_INT32, [2]), np.array([-1, 3], np.int32))
    flat = model.add_operand(f32([height * 4, 3]))
    model.add_operation(nnapi.OperationCode.RESHAPE, [features, rows], [flat])
    beta = constant(nnapi.OperandType(T.FLOAT32), np.float32(1))
    probabilities = model.add_operand(f32([height * 4, 3]))
    model.add_operation(nnapi.OperationCode.SOFTMAX, [flat, beta], [probabilities])
    model.identify_inputs_and_outputs([image], [probabilities])
    model.finish()
    return model


@pytest.fixture
def prepares(monkeypatch):
    """Calls of CONV_2D's, RESHAPE's and SOFTMAX's ``prepare``, by operation name."""
    from nnapi.operations import get_operation

    calls = {}
    for code in (nnapi.OperationCode.CONV_2D, nnapi.OperationCode.RESHAPE, nnapi.OperationCode.SOFTMAX):
        implementation = get_operation(code)
        calls[code.name] = 0

        def counting(ctx, _original=implementation.prepare, _name=code.name):
            calls[_name] += 1
            return _original(ctx)

        monkeypatch.setattr(implementation, "prepare", counting)
    return calls


def _steps(plan) -> list[tuple]:
    return [(step.code, step.shapes, step.kernel is not None, step.prepared) for step in plan.steps]


def test_the_plan_takes_the_shapes_validation_inferred(prepares):
    """nnapi-reference's validation runs each operation's ``prepare`` on the declared
    shapes and constants; the plan of that model takes the shapes it inferred instead of
    running ``prepare`` again, and gets the same steps as a plan that prepares them itself."""
    from nnapi.operations import base

    device = reference.ReferenceDevice()
    hal_model = _conv_model(5)._hal_model()[0]
    prepares.update(dict.fromkeys(prepares, 0))  # (the NDK's own validation of the Model)
    base._ACCEPTED.clear()  # (which the driver's would otherwise reuse: see the next test)
    prepared = device.prepare_model(hal_model)
    # validation's, none by the plan (RESHAPE's own ``plan`` finds its target with ``prepare``)
    assert prepares == {"CONV_2D": 1, "RESHAPE": 2, "SOFTMAX": 1}
    assert device._vetted[id(hal_model)].shapes[0] == [[(1, 5, 4, 3)], [(20, 3)], [(20, 3)]]
    itself = reference._SubgraphPlan(hal_model, hal_model.main, False, owner=prepared)
    assert prepares == {"CONV_2D": 2, "RESHAPE": 4, "SOFTMAX": 2}
    assert _steps(prepared.plan(0)) == _steps(itself) == [
        (nnapi.OperationCode.CONV_2D, [(1, 5, 4, 3)], True, True),
        (nnapi.OperationCode.RESHAPE, [(20, 3)], True, True),
        (nnapi.OperationCode.SOFTMAX, [(20, 3)], True, True)]


def test_the_driver_reuses_the_signatures_add_operation_accepted(prepares):
    """A signature add_operation accepted (its operand types and small constants) is not
    checked again by nnapi-reference's vetting of the HAL model built from it: no
    ``prepare`` runs there, and the plan gets the shapes and steps that checking it again
    gives. A HAL operation whose signature differs (another declared output shape) is
    checked, and refused, as before (next test)."""
    from nnapi.operations import base

    model = _conv_model(5)
    hal_model = model._hal_model()[0]
    prepares.update(dict.fromkeys(prepares, 0))
    reused = reference.ReferenceDevice().prepare_model(hal_model)
    # none by the vetting; RESHAPE's own ``plan`` finds its target with ``prepare``
    assert prepares == {"CONV_2D": 0, "RESHAPE": 1, "SOFTMAX": 0}
    base._ACCEPTED.clear()
    checked_device = reference.ReferenceDevice()
    checked = checked_device.prepare_model(hal_model)
    assert prepares == {"CONV_2D": 1, "RESHAPE": 3, "SOFTMAX": 1}
    assert checked_device._vetted[id(hal_model)].shapes[0] == [[(1, 5, 4, 3)], [(20, 3)], [(20, 3)]]
    assert _steps(reused.plan(0)) == _steps(checked.plan(0))


def test_an_operation_refused_by_validation_is_refused_as_before():
    """A HAL model whose convolution declares another output shape than its inputs give:
    nnapi-reference says so through get_supported_operations, and prepare_model refuses
    it naming the operation, with the validation's own message."""
    device = reference.ReferenceDevice()
    hal_model = _conv_model(5)._hal_model()[0]
    broken = copy.copy(hal_model)
    broken.main = copy.deepcopy(hal_model.main)
    broken.main.operands[broken.main.operations[0].outputs[0]].dimensions = [1, 6, 4, 3]
    reason = reference.unsupported_reason(broken, broken.main, broken.main.operations[0])
    assert reason == "add_operation(CONV_2D): output 0 is declared [1, 6, 4, 3], but the inputs give [1, 5, 4, 3]"
    assert device.get_supported_operations(broken)[0] is False
    with pytest.raises(HalError, match=r"^main operation 0: add_operation\(CONV_2D\): output 0 is declared") as error:
        device.prepare_model(broken)
    assert str(error.value) == f"main operation 0: {reason}"
    # through the NDK, the model cannot even be built: BAD_DATA at add_operation
    with pytest.raises(nnapi.BadDataError, match="output 0 is declared"):
        model = nnapi.Model()
        image = model.add_operand(nnapi.OperandType(T.TENSOR_FLOAT32, [1, 5, 4, 2]))
        weights = model.add_operand(nnapi.OperandType(T.TENSOR_FLOAT32, [3, 3, 3, 2]))
        bias = model.add_operand(nnapi.OperandType(T.TENSOR_FLOAT32, [3]))
        scalars = []
        for value in (1, 1, 1, 0):
            scalars.append(model.add_operand(nnapi.OperandType(T.INT32)))
            model.set_operand_value(scalars[-1], np.int32(value))
        out = model.add_operand(nnapi.OperandType(T.TENSOR_FLOAT32, [1, 6, 4, 3]))
        model.add_operation(nnapi.OperationCode.CONV_2D, [image, weights, bias, *scalars], [out])


def test_the_inferred_shapes_go_with_their_model():
    """The record is the device's record of one HAL model object: a model prepared after
    another (the first one gone, its id free again) plans with its own shapes, and computes
    what a plan that prepares every operation itself computes."""
    device = reference.ReferenceDevice()
    first = _conv_model(5)
    device.prepare_model(first._hal_model()[0])
    del first
    gc.collect()
    assert not device._vetted
    hal_model = _conv_model(7)._hal_model()[0]
    prepared = device.prepare_model(hal_model)
    assert [step.shapes for step in prepared.plan(0).steps] == [[(1, 7, 4, 3)], [(28, 3)], [(28, 3)]]
    image = np.random.default_rng(7).standard_normal((1, 7, 4, 2)).astype(np.float32)
    itself = reference._SubgraphPlan(hal_model, hal_model.main, False, owner=prepared)
    got = reference._Run.program_arrays(prepared.plan(0), [image])[0]
    want = reference._Run.program_arrays(itself, [image])[0]
    assert got.shape == (28, 3)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_allclose(got.sum(axis=1), 1, rtol=1e-6)
