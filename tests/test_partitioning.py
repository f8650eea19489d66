"""Partitioning a model across devices by their capabilities, with CPU fallback."""

from __future__ import annotations

import numpy as np
import pytest

import nnapi
from helpers import only_devices, run_in_threads
from nnapi import OperandCode as T
from nnapi import OperandType
from nnapi import OperationCode as Op
from nnapi.drivers.sample import SampleDevice


@pytest.fixture
def sample_devices():
    """Two sample accelerators: one fast at ADD only, one slower at MUL only."""
    adder = SampleDevice("sample-add", [Op.ADD], exec_time=0.25)
    multiplier = SampleDevice("sample-mul", [Op.MUL], exec_time=0.5)
    with only_devices(adder, multiplier):  # and nnapi-reference: no plug-in joins the plan
        yield adder, multiplier


def chain_model(shape=(3,), operations=(Op.ADD, Op.MUL, Op.SUB, Op.ADD)):
    """A chain of binary operations on ``shape``, each taking the previous result and x
    (the first x and x); by default y = ((x + x) * x) - x, then + x."""
    model = nnapi.Model()
    tensor = OperandType(T.TENSOR_FLOAT32, list(shape))
    x = model.add_operand(tensor)
    act = model.add_operand(OperandType(T.INT32))
    model.set_operand_value(act, 0)
    previous = x
    for operation in operations:
        result = model.add_operand(tensor)
        model.add_operation(operation, [previous, x, act], [result])
        previous = result
    model.identify_inputs_and_outputs([x], [previous])
    model.finish()
    return model


def run(compilation, x):
    execution = nnapi.Execution(compilation)
    execution.set_input(0, x)
    y = np.zeros(3, np.float32)
    execution.set_output(0, y)
    execution.compute()
    return y


def test_each_operation_goes_to_its_best_device(sample_devices):
    adder, multiplier = sample_devices
    assert [d.name for d in nnapi.get_devices()] == ["nnapi-reference", "sample-add", "sample-mul"]
    compilation = nnapi.Compilation(chain_model())
    compilation.finish()
    # SUB is supported by no accelerator: it falls back to the reference CPU device.
    assert compilation.step_devices == ["sample-add", "sample-mul", "nnapi-reference", "sample-add"]
    assert compilation.device is None
    x = np.array([1, 2, 3], np.float32)
    np.testing.assert_array_equal(run(compilation, x), (x + x) * x - x + x)
    assert adder.executed_operations == [Op.ADD, Op.ADD] and multiplier.executed_operations == [Op.MUL]


def test_supported_operations_union(sample_devices):
    adder, multiplier = sample_devices
    model = chain_model()
    devices = {d.name: d for d in nnapi.get_devices()}
    assert model.get_supported_operations_for_devices([devices["sample-add"]]) == [True, False, False, True]
    assert model.get_supported_operations_for_devices(
        [devices["sample-add"], devices["sample-mul"]]) == [True, True, False, True]


def test_explicit_devices_without_fallback(sample_devices):
    devices = {d.name: d for d in nnapi.get_devices()}
    compilation = nnapi.Compilation(chain_model(), [devices["sample-add"], devices["sample-mul"]])
    with pytest.raises(nnapi.BadDataError) as excinfo:
        compilation.finish()
    assert "SUB" in str(excinfo.value)
    single = nnapi.Compilation(chain_model(), [devices["nnapi-reference"]])
    single.finish()
    assert single.step_devices == ["nnapi-reference"]


def _double_minus_itself_of_unknown_size() -> nnapi.Model:
    """(x + x) - x on a float32 vector of unknown size: the ADD on sample-add, the SUB on
    the reference device, so the intermediate's size is known only when the run gives it."""
    model = nnapi.Model()
    unknown = OperandType(T.TENSOR_FLOAT32, [0])
    x = model.add_operand(unknown)
    act = model.add_operand(OperandType(T.INT32))
    model.set_operand_value(act, 0)
    doubled, y = model.add_operand(unknown), model.add_operand(unknown)
    model.add_operation(Op.ADD, [x, x, act], [doubled])
    model.add_operation(Op.SUB, [doubled, x, act], [y])
    model.identify_inputs_and_outputs([x], [y])
    model.finish()
    return model


def test_dynamic_shapes_cross_steps(sample_devices):
    compilation = nnapi.Compilation(_double_minus_itself_of_unknown_size())
    compilation.finish()
    assert compilation.step_devices == ["sample-add", "nnapi-reference"]
    execution = nnapi.Execution(compilation)
    execution.set_input(0, np.arange(6, dtype=np.float32))
    small = np.zeros(2, np.float32)
    execution.set_output(0, small)
    with pytest.raises(nnapi.OutputInsufficientSizeError):
        execution.compute()
    with pytest.raises(nnapi.OutputInsufficientSizeError) as caught:
        execution.get_output_operand_dimensions(0)
    assert caught.value.dimensions == [6]
    execution = nnapi.Execution(compilation)
    execution.set_input(0, np.arange(6, dtype=np.float32))
    y = np.zeros(6, np.float32)
    execution.set_output(0, y)
    execution.compute()
    np.testing.assert_array_equal(y, np.arange(6))


def test_intermediate_buffers_are_kept_for_later_runs_one_run_each(sample_devices):
    """A split plan's intermediate values live in buffers it keeps between runs (arrays of
    the operand's dtype and shape), each run taking a set no other run has at the time:
    later runs, and runs at once, give their own inputs' results."""
    compilation = nnapi.Compilation(chain_model())
    compilation.finish()
    plan = compilation._plan
    assert len(plan.steps) == 4
    x = np.array([1, 2, 3], np.float32)
    np.testing.assert_array_equal(run(compilation, x), (x + x) * x - x + x)
    [kept] = plan._spare_temps
    buffers = {key: buffer for key, buffer in kept.items()}
    assert len(buffers) == 3 and all(b.dtype == np.float32 and b.shape == (3,) for b in buffers.values())
    x = np.array([4, 5, 6], np.float32)
    np.testing.assert_array_equal(run(compilation, x), (x + x) * x - x + x)
    assert plan._spare_temps == [kept] and all(kept[key] is buffer for key, buffer in buffers.items())
    taken = plan._spare_temps.pop()  # as a run going on now holds it
    np.testing.assert_array_equal(run(compilation, x), (x + x) * x - x + x)
    [other] = plan._spare_temps
    assert all(other[key] is not buffer for key, buffer in taken.items())
    plan._spare_temps.append(taken)
    failures = []

    def worker(seed: int) -> None:
        rng = np.random.default_rng(seed)
        for _ in range(30):
            value = rng.standard_normal(3).astype(np.float32)
            result = run(compilation, value)
            if not np.array_equal(result, (value + value) * value - value + value):
                failures.append((value, result))

    run_in_threads(worker, 4)
    assert not failures
    assert 2 <= len(plan._spare_temps) <= 4


def test_an_intermediate_of_a_size_only_the_run_tells_is_offered_the_last_runs_buffer(sample_devices):
    compilation = nnapi.Compilation(_double_minus_itself_of_unknown_size())
    compilation.finish()
    assert compilation.step_devices == ["sample-add", "nnapi-reference"]
    step = compilation._plan.steps[0].prepared
    calls = []
    original = step.execute

    def counted(*args, **kwargs):
        calls.append(args[0].outputs[0].location.length)  # the bytes offered for `doubled`
        return original(*args, **kwargs)

    step.execute = counted
    for count, offered in ((6, [0, 24]), (6, [24]), (4, [24]), (8, [24, 32]), (8, [32])):
        calls.clear()
        execution = nnapi.Execution(compilation)
        value = np.arange(count, dtype=np.float32)
        execution.set_input(0, value)
        y = np.zeros(count, np.float32)
        execution.set_output(0, y)
        execution.compute()
        np.testing.assert_array_equal(y, value)
        # the first run asks the adder for its output's size, then runs it; later runs offer
        # the last run's buffer: one run when it is large enough
        assert calls == offered


def test_burst_over_a_plan(sample_devices):
    compilation = nnapi.Compilation(chain_model())
    compilation.finish()
    burst = nnapi.Burst(compilation)
    for value in (1.0, 2.0):
        execution = nnapi.Execution(compilation)
        x = np.full(3, value, np.float32)
        execution.set_input(0, x)
        y = np.zeros(3, np.float32)
        execution.set_output(0, y)
        execution.burst_compute(burst)
        np.testing.assert_array_equal(y, (x + x) * x)


def add_sub_add_model(shape):
    """y = ((x + x) - x) + x on ``shape``: ADD, SUB, ADD."""
    return chain_model(shape, (Op.ADD, Op.SUB, Op.ADD))


@pytest.mark.parametrize("shape, steps", [
    # one ADD of 3 floats saves ~4 us on the fast device; the step it needs costs 50 us + the
    # runtime's: both islands join the reference's step
    ([3], ["nnapi-reference"]),
    # ADDs of 1M floats (12 MB touched each) save far more than a step costs: still split
    ([1024, 1024], ["sample-fast", "nnapi-reference", "sample-fast"]),
])
def test_islands_weighed_against_the_step_they_cost(register, shape, steps):
    """A device reporting a step cost (Capabilities.step_cost_s) gets an island of light
    operations only where it saves more than the steps it costs; the values are the same
    whichever plan runs."""
    fast = register(SampleDevice("sample-fast", [Op.ADD], exec_time=0.25, step_cost_s=50e-6))
    compilation = nnapi.Compilation(add_sub_add_model(shape))
    compilation.finish()
    assert compilation.step_devices == steps
    x = np.random.default_rng(2).standard_normal(shape).astype(np.float32)
    execution = nnapi.Execution(compilation)
    execution.set_input(0, x)
    y = np.zeros(shape, np.float32)
    execution.set_output(0, y)
    execution.compute()
    np.testing.assert_array_equal(y, ((x + x) - x) + x)
    assert fast.executed_operations == ([] if steps == ["nnapi-reference"] else [Op.ADD, Op.ADD])


def test_islands_of_heavy_operations_and_devices_without_a_step_cost_stay(register):
    """A convolution island is never weighed (its cost is not proportional to its bytes);
    a device that reports no step cost keeps Android's best device per operation."""
    costly = register(SampleDevice("sample-conv", [Op.CONV_2D], exec_time=0.25, step_cost_s=1.0))
    model = nnapi.Model()
    image = model.add_operand(OperandType(T.TENSOR_FLOAT32, [1, 2, 2, 1]))
    weights = model.add_operand(OperandType(T.TENSOR_FLOAT32, [1, 1, 1, 1]))
    model.set_operand_value(weights, np.full((1, 1, 1, 1), 2.0, np.float32))
    bias = model.add_operand(OperandType(T.TENSOR_FLOAT32, [1]))
    model.set_operand_value(bias, np.zeros(1, np.float32))
    scalars = []
    for value in (2, 1, 1, 0):  # VALID, strides 1, no activation
        scalars.append(model.add_operand(OperandType(T.INT32)))
        model.set_operand_value(scalars[-1], value)
    features = model.add_operand(OperandType(T.TENSOR_FLOAT32, [1, 2, 2, 1]))
    model.add_operation(Op.CONV_2D, [image, weights, bias, *scalars], [features])
    y = model.add_operand(OperandType(T.TENSOR_FLOAT32, [1, 2, 2, 1]))
    model.add_operation(Op.SUB, [features, image, scalars[-1]], [y])
    model.identify_inputs_and_outputs([image], [y])
    model.finish()
    compilation = nnapi.Compilation(model)
    compilation.finish()
    assert compilation.step_devices == ["sample-conv", "nnapi-reference"]
    execution = nnapi.Execution(compilation)
    x = np.arange(4, dtype=np.float32).reshape(1, 2, 2, 1)
    execution.set_input(0, x)
    out = np.zeros((1, 2, 2, 1), np.float32)
    execution.set_output(0, out)
    execution.compute()
    np.testing.assert_array_equal(out, x)
    assert costly.executed_operations == [Op.CONV_2D]
    # the same tiny ADD island on a device without a step cost stays split
    register(SampleDevice("sample-free", [Op.ADD], exec_time=0.25))
    plain = nnapi.Compilation(add_sub_add_model([3]))
    plain.finish()
    assert plain.step_devices == ["sample-free", "nnapi-reference", "sample-free"]


def test_a_driver_that_cannot_answer_is_named_with_its_failure(monkeypatch):
    """finish's BAD_DATA 'no device supports' gives each device's reason: a driver whose
    getSupportedOperations fails says so with its error (it read 'nnapi-reference: None'
    when the driver's failure was swallowed, seen by reviewer R2 through a broken served
    driver), and one whose second answer differs from its first reads 'declined by the
    driver', never None."""
    from helpers import add_model, reference_device
    from nnapi.drivers.reference import ReferenceDevice
    from nnapi.hal import ErrorStatus, HalError

    device = reference_device()

    def lost(self, model):
        raise HalError(ErrorStatus.DEVICE_UNAVAILABLE, "device lost")

    monkeypatch.setattr(ReferenceDevice, "get_supported_operations", lost)
    with pytest.raises(nnapi.BadDataError) as caught:
        nnapi.Compilation(add_model(), [device]).finish()
    assert ("nnapi-reference: the driver could not say which operations it supports (device lost)"
            in str(caught.value)), str(caught.value)
    answers = iter([[False], [True], [True]])
    monkeypatch.setattr(ReferenceDevice, "get_supported_operations", lambda self, model: next(answers))
    with pytest.raises(nnapi.BadDataError) as caught:
        nnapi.Compilation(add_model(), [device]).finish()
    assert str(caught.value).endswith("nnapi-reference: declined by the driver"), str(caught.value)
