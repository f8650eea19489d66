"""CPU fallback, fault containment, preferences and feature levels, with FaultyDevice."""

from __future__ import annotations

import numpy as np
import pytest

import nnapi
from nnapi import OperandCode as T
from nnapi import OperandType
from nnapi import OperationCode as Op
from nnapi.codes import FeatureLevelCode, PreferenceCode
from nnapi.drivers.sample import FaultyDevice
from nnapi.runtime import manager


def add_mul_model(dtype=T.TENSOR_FLOAT32, relaxed=False):
    """y = (x + x) * x."""
    model = nnapi.Model()
    tensor = OperandType(dtype, [3])
    x = model.add_operand(tensor)
    act = model.add_operand(OperandType(T.INT32))
    model.set_operand_value(act, 0)
    doubled, y = model.add_operand(tensor), model.add_operand(tensor)
    model.add_operation(Op.ADD, [x, x, act], [doubled])
    model.add_operation(Op.MUL, [doubled, x, act], [y])
    model.identify_inputs_and_outputs([x], [y])
    if relaxed:
        model.relax_computation_float32_to_float16(True)
    model.finish()
    return model


X = np.array([1.0, 2.0, -3.0], np.float32)
EXPECTED = (X + X) * X


def run(compilation, x=X, burst=None):
    execution = nnapi.Execution(compilation)
    execution.set_input(0, x)
    y = np.zeros(3, x.dtype)
    execution.set_output(0, y)
    if burst is not None:
        execution.burst_compute(burst)
    else:
        execution.compute()
    return y


def compile_(model, devices=None, preference=None):
    compilation = nnapi.Compilation(model, devices)
    if preference is not None:
        compilation.set_preference(preference)
    compilation.finish()
    return compilation


def device_named(name):
    return next(d for d in nnapi.get_devices() if d.name == name)


def test_a_healthy_faulty_device_runs_the_model(register):
    faulty = register(FaultyDevice("faulty"))
    compilation = compile_(add_mul_model())
    assert compilation.step_devices == ["faulty"]
    np.testing.assert_array_equal(run(compilation), EXPECTED)
    assert faulty.execute_count == 1


def test_failed_prepare_falls_back_to_the_cpu(register):
    faulty = register(FaultyDevice("faulty", fail_prepare=True))
    compilation = compile_(add_mul_model())
    assert faulty.prepare_count == 1
    assert compilation.step_devices == ["nnapi-reference"]
    np.testing.assert_array_equal(run(compilation), EXPECTED)


def test_partial_fallback_moves_only_the_failed_step(register):
    register(FaultyDevice("faulty-add", supported={Op.ADD}, fail_prepare=True))
    register(FaultyDevice("good-mul", supported={Op.MUL}))
    compilation = compile_(add_mul_model())
    assert compilation.step_devices == ["nnapi-reference", "good-mul"]
    np.testing.assert_array_equal(run(compilation), EXPECTED)


@pytest.mark.parametrize("raise_exception", [False, True])
def test_failed_execution_is_retried_on_the_cpu(register, raise_exception):
    faulty = register(FaultyDevice("faulty", fail_execute=True, raise_exception=raise_exception))
    compilation = compile_(add_mul_model())
    assert compilation.step_devices == ["faulty"]
    np.testing.assert_array_equal(run(compilation), EXPECTED)
    assert faulty.execute_count == 1
    assert compilation._plan.fallback_count == 1
    burst = nnapi.Burst(compilation)
    np.testing.assert_array_equal(run(compilation, burst=burst), EXPECTED)
    execution = nnapi.Execution(compilation)
    execution.set_input(0, X)
    y = np.zeros(3, np.float32)
    execution.set_output(0, y)
    execution.start_compute().wait()
    np.testing.assert_array_equal(y, EXPECTED)


@pytest.mark.parametrize("raise_exception", [False, True])
def test_executions_per_run_on_the_same_arrays_are_retried_on_the_cpu(register, raise_exception):
    """An Execution per run on the same arrays: a request of its own, then one the driver
    binds, then the bound one (execution._Table): each failure on the device is re-run on
    the CPU; with the device named, each is the result."""
    faulty = register(FaultyDevice("faulty", fail_execute=True, raise_exception=raise_exception))
    compilation = compile_(add_mul_model())
    assert compilation.step_devices == ["faulty"]
    x, y = X.copy(), np.zeros(3, np.float32)
    for step in range(4):
        x[...] = X * (step + 1)
        y[...] = 0
        execution = nnapi.Execution(compilation)
        execution.set_input(0, x)
        execution.set_output(0, y)
        execution.compute()
        np.testing.assert_array_equal(y, (x + x) * x)
    assert compilation._execution_table.cached is not None
    assert compilation._plan.fallback_count == 4
    assert faulty.execute_count == 4  # each run reached the device first
    named = compile_(add_mul_model(), [device_named("faulty")])
    for _ in range(4):
        execution = nnapi.Execution(named)
        execution.set_input(0, x)
        execution.set_output(0, y)
        with pytest.raises(nnapi.OpFailedError, match="crash" if raise_exception else "injected failure"):
            execution.compute()
        with pytest.raises(nnapi.BadStateError):
            execution.get_output_operand_rank(0)


def test_failed_step_of_a_partitioned_plan_falls_back(register):
    register(FaultyDevice("faulty-add", supported={Op.ADD}, fail_execute=True))
    register(FaultyDevice("good-mul", supported={Op.MUL}))
    compilation = compile_(add_mul_model())
    assert compilation.step_devices == ["faulty-add", "good-mul"]
    np.testing.assert_array_equal(run(compilation), EXPECTED)


def test_no_fallback_with_explicit_devices(register):
    register(FaultyDevice("bad-prepare", fail_prepare=True))
    register(FaultyDevice("bad-execute", fail_execute=True))
    register(FaultyDevice("crash", raise_exception=True))
    with pytest.raises(nnapi.OpFailedError, match="injected failure in prepare_model"):
        compile_(add_mul_model(), [device_named("bad-prepare")])
    compilation = compile_(add_mul_model(), [device_named("bad-execute")])
    with pytest.raises(nnapi.OpFailedError, match="injected failure in execute"):
        run(compilation)
    compilation = compile_(add_mul_model(), [device_named("crash")])
    with pytest.raises(nnapi.OpFailedError, match="RuntimeError: crash: injected crash"):
        run(compilation)


def test_a_crash_in_prepare_is_contained(register):
    register(FaultyDevice("crash", fail_prepare=True, raise_exception=True))
    with pytest.raises(nnapi.OpFailedError, match="RuntimeError"):
        compile_(add_mul_model(), [device_named("crash")])
    assert compile_(add_mul_model()).step_devices == ["nnapi-reference"]


def test_wrong_results_are_wrong_and_not_retried(register):
    register(FaultyDevice("liar", wrong_results=True))
    compilation = compile_(add_mul_model())
    np.testing.assert_array_equal(run(compilation), EXPECTED + 1)


def test_deadline_errors_are_not_retried(register):
    register(FaultyDevice("slow", delay_s=0.05))
    compilation = nnapi.Compilation(add_mul_model(), [device_named("slow")])
    compilation.finish()
    execution = nnapi.Execution(compilation)
    execution.set_input(0, X)
    execution.set_output(0, np.zeros(3, np.float32))
    execution.set_timeout(1_000_000)
    with pytest.raises(nnapi.MissedDeadlineTransientError):
        execution.compute()


def test_preference_picks_the_matching_figure(register):
    register(FaultyDevice("fast", exec_time=0.1, power_usage=0.9))
    register(FaultyDevice("frugal", exec_time=0.9, power_usage=0.1))
    assert compile_(add_mul_model()).step_devices == ["fast"]
    assert compile_(add_mul_model(), preference=PreferenceCode.PREFER_SUSTAINED_SPEED).step_devices == ["fast"]
    assert compile_(add_mul_model(), preference=PreferenceCode.PREFER_LOW_POWER).step_devices == ["frugal"]


def test_feature_level_bounds_what_a_device_is_given(register):
    old = register(FaultyDevice("old", feature_level=FeatureLevelCode.FEATURE_LEVEL_1))
    # float32 ADD/MUL are feature level 1: the old device takes them.
    assert compile_(add_mul_model()).step_devices == ["old"]
    # TENSOR_FLOAT16 operands (level 3) and relaxed float32 (level 2) are not sent to it.
    f16 = compile_(add_mul_model(T.TENSOR_FLOAT16))
    assert f16.step_devices == ["nnapi-reference"]
    np.testing.assert_array_equal(run(f16, X.astype(np.float16)), EXPECTED.astype(np.float16))
    assert compile_(add_mul_model(relaxed=True)).step_devices == ["nnapi-reference"]
    assert old.prepare_count == 1
    # an explicit compilation for it alone: nothing it can run
    with pytest.raises(nnapi.BadDataError, match="no device"):
        compile_(add_mul_model(T.TENSOR_FLOAT16), [device_named("old")])


def test_unregistered_device_disappears(register):
    register(FaultyDevice("gone"))
    manager.unregister_device("gone")
    assert "gone" not in [d.name for d in nnapi.get_devices()]
