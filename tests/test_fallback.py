"""CPU fallback, fault containment, preferences and feature levels, with FaultyDevice."""

from __future__ import annotations

import functools
import json
import os
import threading

import numpy as np
import pytest

import nnapi
from nnapi import OperandCode as T
from nnapi import OperandType
from nnapi import OperationCode as Op
from nnapi.codes import FeatureLevelCode, PreferenceCode
from nnapi.drivers.sample import FaultyDevice
from nnapi.hal.interfaces import _DoneCallback
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


# --- a driver's broken answers (a driver is another party: nothing it says is trusted) ------
class Answering(FaultyDevice):
    """A FaultyDevice whose answers to the partitioner and to prepare_model / execute are
    replaced: ``supported(model)``, ``reasons(model)``, ``capabilities()``, ``prepare()``
    (its result is what prepare_model returns), ``execute_error`` (raised by execute)."""

    def __init__(self, name, *, supported=None, reasons=None, capabilities=None, prepare=None, execute_error=None):
        super().__init__(name)
        self.answers = {"supported": supported, "reasons": reasons, "capabilities": capabilities,
                        "prepare": prepare}
        self.execute_error = execute_error

    def get_supported_operations(self, model):
        answer = self.answers["supported"]
        return super().get_supported_operations(model) if answer is None else answer(model)

    def get_unsupported_reasons(self, model):
        answer = self.answers["reasons"]
        return super().get_unsupported_reasons(model) if answer is None else answer(model)

    def get_capabilities(self):
        answer = self.answers["capabilities"]
        return super().get_capabilities() if answer is None else answer()

    def prepare_model(self, *args, **kwargs):
        if self.answers["prepare"] is not None:
            return self.answers["prepare"]()
        prepared = super().prepare_model(*args, **kwargs)
        if self.execute_error is not None:
            error = self.execute_error

            def execute(*args, **kwargs):
                raise error

            prepared.execute = execute
        return prepared


def each(value):
    return lambda model: [value] * len(model.main.operations)


@pytest.mark.parametrize("answer, kind", [
    (each(np.array([True, False])), "ndarray"),  # its truth value raises
    (each("no"), "str"),                         # truthy
    (each(1), "int"),
    (each(None), "NoneType"),
])
def test_a_support_answer_that_is_not_bools_counts_as_supporting_nothing(register, answer, kind):
    """get_supported_operations answers a bool per operation; anything else is unusable (it
    used to raise from bool() or count as True): the CPU runs the model, and with only that
    device the failure says what the driver answered."""
    register(Answering("odd", supported=answer))
    compilation = compile_(add_mul_model())
    assert compilation.step_devices == ["nnapi-reference"]
    np.testing.assert_array_equal(run(compilation), EXPECTED)
    with pytest.raises(nnapi.BadDataError) as caught:
        compile_(add_mul_model(), [device_named("odd")])
    assert str(caught.value) == (
        "finish: no device among ['odd'] supports operation 0 (ADD); odd: the driver could not say which "
        f"operations it supports (its answer for operation 0 is a {kind}, not a bool)")


def test_a_reason_that_is_no_string_is_not_printed(register):
    register(Answering("terse", supported=each(False), reasons=each(object())))
    with pytest.raises(nnapi.BadDataError) as caught:
        compile_(add_mul_model(), [device_named("terse")])
    assert str(caught.value) == ("finish: no device among ['terse'] supports operation 0 (ADD); "
                                 "terse: declined by the driver")


@pytest.mark.parametrize("capabilities", [
    lambda: None,
    lambda: nnapi.hal.Capabilities.uniform(nnapi.hal.PerformanceInfo("fast", "low")),
    lambda: nnapi.hal.Capabilities.uniform(nnapi.hal.PerformanceInfo(float("nan"), float("nan"))),
    lambda: nnapi.hal.Capabilities.uniform(nnapi.hal.PerformanceInfo(-1.0, -1.0)),
])
def test_unreadable_capabilities_rank_the_device_last(register, capabilities):
    """A device whose performance is no number >= 0 (or whose capabilities raise) is chosen
    only where no other device can run an operation: the partitioner used to raise
    AttributeError / TypeError, or let NaN decide by the order of comparisons."""
    register(Answering("unrated", capabilities=capabilities))
    compilation = compile_(add_mul_model())
    assert compilation.step_devices == ["nnapi-reference"]
    np.testing.assert_array_equal(run(compilation), EXPECTED)
    alone = compile_(add_mul_model(), [device_named("unrated")])
    assert alone.step_devices == ["unrated"]
    np.testing.assert_array_equal(run(alone), EXPECTED)


@pytest.mark.parametrize("status", [42, None, "GENERAL_FAILURE", nnapi.hal.ErrorStatus.NONE])
def test_a_hal_error_without_the_status_of_a_failure_is_op_failed(register, status):
    """A driver's HalError whose status is no failing ErrorStatus: OP_FAILED naming the device
    and the status (it used to raise AttributeError, or NnapiError with NO_ERROR for NONE),
    at preparation and at execution; without explicit devices the CPU takes over."""
    from nnapi.hal import HalError

    register(Answering("vague-prepare", prepare=lambda: (_ for _ in ()).throw(HalError(status, "no luck"))))
    assert compile_(add_mul_model()).step_devices == ["nnapi-reference"]
    with pytest.raises(nnapi.OpFailedError) as caught:
        compile_(add_mul_model(), [device_named("vague-prepare")])
    assert str(caught.value) == (f"finish: vague-prepare: prepare_model failed with status {status!r}, not the "
                                 "ErrorStatus of a failure: no luck")
    manager.unregister_device("vague-prepare")
    register(Answering("vague-execute", execute_error=HalError(status, "no luck")))
    compilation = compile_(add_mul_model(), [device_named("vague-execute")])
    with pytest.raises(nnapi.OpFailedError) as caught:
        run(compilation)
    assert caught.value.code == nnapi.ResultCode.OP_FAILED
    assert f"vague-execute: execute failed with status {status!r}" in str(caught.value)
    fallback = compile_(add_mul_model())
    assert fallback.step_devices == ["vague-execute"]
    np.testing.assert_array_equal(run(fallback), EXPECTED)  # re-run on the CPU


def test_a_failure_names_its_device_once(register):
    register(Answering("blank", prepare=lambda: None))
    register(FaultyDevice("failing", fail_prepare=True))
    for name, expected in (("blank", "finish: blank: prepare_model returned NoneType"),
                           ("failing", "finish: failing: injected failure in prepare_model")):
        with pytest.raises(nnapi.OpFailedError) as caught:
            compile_(add_mul_model(), [device_named(name)])
        assert str(caught.value) == expected


@pytest.mark.parametrize("field, value, problem", [
    ("name", None, "a device without a name (name None)"),
    ("name", "", "a device without a name (name '')"),
    ("version_string", None, "device 'shady': version_string is a NoneType, not a str"),
    ("device_type", 99, "device 'shady': device_type 99 is no DeviceTypeCode"),
    ("feature_level", "x", "device 'shady': feature_level 'x' is no FeatureLevelCode"),
    ("feature_level", True, "device 'shady': feature_level True is no FeatureLevelCode"),
])
def test_a_device_whose_identity_does_not_validate_is_not_registered(register, field, value, problem):
    """What ANeuralNetworksDevice_getName / _getVersion / _getType / _getFeatureLevel return
    comes from the driver: a device that says it is something no NDK value is stays out (as
    Android refuses to register it), where it used to make Device.type raise ValueError or
    name a device None in every message."""
    device = FaultyDevice("shady")
    setattr(device, field, value)
    with pytest.raises(ValueError) as caught:
        register(device)
    assert str(caught.value) == f"register_device: {problem}"
    assert [d.name for d in nnapi.get_devices()] == ["nnapi-reference"]
    assert all(repr(d) for d in nnapi.get_devices())


@pytest.mark.parametrize("answer, problem", [
    (None, "returned NoneType, not (output shapes, timing)"),
    ((None, None), "returned NoneType for the output shapes of 1 outputs"),
    (([], nnapi.hal.Timing()), "returned list of 0 for the output shapes of 1 outputs"),
    (([nnapi.hal.OutputShape("abc", True)], nnapi.hal.Timing()), "output 0: dimensions 'abc' are not unsigned "
                                                                 "32-bit integers"),
    (([nnapi.hal.OutputShape([3], False)], nnapi.hal.Timing()), "output 0: is_sufficient False in a successful "
                                                                "execution"),
    (([nnapi.hal.OutputShape([3], True)], "x"), "timing 'x' is not two unsigned 64-bit durations"),
    (([nnapi.hal.OutputShape([-3], True)], nnapi.hal.Timing()), "output 0: dimensions [-3] are not unsigned "
                                                                "32-bit integers"),
    # Android's isUpdatable: a shape that is not the output's is no answer (it was reported)
    (([nnapi.hal.OutputShape([5], True)], nnapi.hal.Timing()), "output 0: dimensions [5] do not fit the output's "
                                                               "[3] (the same rank, each known dimension equal)"),
    (([nnapi.hal.OutputShape([3, 1], True)], nnapi.hal.Timing()), "output 0: dimensions [3, 1] do not fit the "
                                                                  "output's [3] (the same rank, each known "
                                                                  "dimension equal)"),
    (((nnapi.hal.OutputShape((np.uint32(4),), True),), nnapi.hal.Timing()), "output 0: dimensions [4] do not fit "
                                                                           "the output's [3] (the same rank, each "
                                                                           "known dimension equal)"),
])
@pytest.mark.parametrize("how", ["compute", "reusable", "burst"])
def test_a_malformed_answer_to_a_successful_execution_is_op_failed(register, answer, problem, how):
    """A driver's answer to a successful execution is checked before the runtime reports
    it: it used to surface as a raw TypeError / IndexError / AttributeError, as dimensions
    ['a', 'b', 'c'], or as a success whose shapes read "the last computation failed"."""
    register(Answering("garbled"))
    for explicit in (True, False):
        compilation = compile_(add_mul_model(), [device_named("garbled")] if explicit else None)
        assert compilation.step_devices == ["garbled"]
        compilation._plan.single.execute = lambda *args, **kwargs: answer
        execution = nnapi.Execution(compilation)
        execution.set_input(0, X)
        y = np.zeros(3, np.float32)
        execution.set_output(0, y)
        if how == "reusable":
            execution.set_reusable(True)
        burst = nnapi.Burst(compilation) if how == "burst" else None
        run = execution.compute if burst is None else functools.partial(execution.burst_compute, burst)
        if explicit:
            with pytest.raises(nnapi.OpFailedError) as caught:
                run()
            assert str(caught.value).endswith(f"garbled: {'burst ' if how == 'burst' else ''}"
                                              f"{'reusable ' if how == 'reusable' else ''}execute {problem}")
        else:  # re-run on the CPU
            run()
            np.testing.assert_array_equal(y, EXPECTED)
            assert execution.get_output_operand_dimensions(0) == [3]


def test_a_step_answering_a_shape_that_is_not_its_outputs_falls_back(register):
    """A step of a partitioned plan whose driver reports a shape its output cannot have
    ([5] for the ADD's [3]) failed (Android's isUpdatable), so the plan re-runs on the CPU:
    the answer was taken as it was."""
    register(FaultyDevice("lying-add", supported={Op.ADD}))
    register(FaultyDevice("good-mul", supported={Op.MUL}))
    compilation = compile_(add_mul_model())
    assert compilation.step_devices == ["lying-add", "good-mul"]
    step = compilation._plan.steps[0]
    honest = step.prepared.execute

    def lying(*args, **kwargs):
        _, timing = honest(*args, **kwargs)
        return [nnapi.hal.OutputShape([5], True)], timing

    step.prepared.execute = lying
    np.testing.assert_array_equal(run(compilation), EXPECTED)
    assert compilation._plan.fallback_count == 1
    named = compile_(add_mul_model(), [device_named("lying-add"), device_named("good-mul")])
    named._plan.steps[0].prepared.execute = lying
    with pytest.raises(nnapi.OpFailedError) as caught:
        run(named)
    assert str(caught.value).endswith("lying-add: execute output 0: dimensions [5] do not fit the output's [3] "
                                      "(the same rank, each known dimension equal)")


@pytest.mark.parametrize("shapes, problem", [
    (None, "list of 0 for the output shapes of 1 outputs"),
    ("zz", "str for the output shapes of 1 outputs"),
    ([nnapi.hal.OutputShape(["x"], False)], "output 0: dimensions ['x'] are not unsigned 32-bit integers"),
    ([nnapi.hal.OutputShape([5], False)], "output 0: dimensions [5] do not fit the output's [3] (the same rank, "
                                          "each known dimension equal)"),
    ([nnapi.hal.OutputShape([3], True)], "no output marked insufficient"),
    ([nnapi.hal.OutputShape([3], "no")], "output 0: is_sufficient 'no' is no bool"),
])
def test_a_malformed_output_insufficient_size_is_op_failed(register, shapes, problem):
    """The output shapes a driver's OUTPUT_INSUFFICIENT_SIZE carries are checked as Android's
    validateOutputShapesFromDriver does (one per output, each fitting the output, at least
    one insufficient): they used to escape as a raw AttributeError ("zz"), BadDataError from
    compute leaving the execution unfinished (["x"]), or an IndexError from
    get_output_operand_dimensions (none). With the device named it is OP_FAILED naming the
    rule; otherwise the run is re-done on the CPU."""
    register(Answering("short", execute_error=nnapi.hal.HalError(
        nnapi.hal.ErrorStatus.OUTPUT_INSUFFICIENT_SIZE, "too small", shapes)))
    for explicit in (True, False):
        compilation = compile_(add_mul_model(), [device_named("short")] if explicit else None)
        assert compilation.step_devices == ["short"]
        execution = nnapi.Execution(compilation)
        execution.set_input(0, X)
        y = np.zeros(3, np.float32)
        execution.set_output(0, y)
        if explicit:
            with pytest.raises(nnapi.OpFailedError) as caught:
                execution.compute()
            assert str(caught.value) == f"short: execute failed with OUTPUT_INSUFFICIENT_SIZE but {problem}"
            with pytest.raises(nnapi.BadStateError, match="the last computation failed"):
                execution.get_output_operand_dimensions(0)
        else:
            execution.compute()
            np.testing.assert_array_equal(y, EXPECTED)


def test_a_well_formed_output_insufficient_size_is_reported(register):
    """A driver's OUTPUT_INSUFFICIENT_SIZE whose shapes pass the rules reaches the app as
    the NDK's OUTPUT_INSUFFICIENT_SIZE with the dimensions the output needs."""
    register(Answering("short", execute_error=nnapi.hal.HalError(
        nnapi.hal.ErrorStatus.OUTPUT_INSUFFICIENT_SIZE, "too small", [nnapi.hal.OutputShape([3], np.False_)])))
    compilation = compile_(add_mul_model(), [device_named("short")])
    execution = nnapi.Execution(compilation)
    execution.set_input(0, X)
    execution.set_output(0, np.zeros(3, np.float32))
    with pytest.raises(nnapi.OutputInsufficientSizeError):
        execution.compute()
    with pytest.raises(nnapi.OutputInsufficientSizeError, match=r"it needs dimensions \[3\]"):
        execution.get_output_operand_dimensions(0)


@pytest.mark.parametrize("info, problem", [
    ((42, nnapi.hal.Timing(), nnapi.hal.Timing()), "the execution failed with status 42"),
    ((nnapi.hal.ErrorStatus.NONE, None, None), "the fenced execution's callback answered"),
    (None, "the fenced execution's callback answered None, not (status, timing, timing)"),
])
def test_a_malformed_fenced_execution_report_is_op_failed(register, info, problem):
    """What a driver's fenced execution callback reports (status, timings) is checked: a
    status of 42 used to escape as a raw AttributeError, a missing timing as a TypeError."""
    from nnapi.hal.interfaces import IFencedExecutionCallback

    class Report(IFencedExecutionCallback):
        def get_execution_info(self):
            return info

    register(Answering("fenced"))
    compilation = compile_(add_mul_model(), [device_named("fenced")])
    compilation._plan.single.execute_fenced = lambda *args, **kwargs: (None, Report())
    execution = nnapi.Execution(compilation)
    execution.set_input(0, X)
    execution.set_output(0, np.zeros(3, np.float32))
    event = execution.start_compute_with_dependencies([])
    outcome: list = []

    def wait() -> None:
        try:
            event.wait()
        except Exception as error:  # noqa: BLE001 - what the waiter gets is the outcome
            outcome.append(error)

    waiter = threading.Thread(target=wait, daemon=True)  # the raw exception used to leave it waiting forever
    waiter.start()
    waiter.join(60)
    assert not waiter.is_alive(), "the event was never signalled"
    assert len(outcome) == 1 and isinstance(outcome[0], nnapi.OpFailedError), outcome
    assert problem in str(outcome[0])


_DONE = _DoneCallback(nnapi.hal.ErrorStatus.NONE, nnapi.hal.Timing(), nnapi.hal.Timing())


def _closed_descriptor() -> int:
    read, write = os.pipe()
    os.close(read)
    os.close(write)
    return read


@pytest.mark.parametrize("answer, problem", [
    (lambda: None, "returned NoneType, not (sync fence, callback)"),
    (lambda: (None, _DONE, 3), "returned tuple, not (sync fence, callback)"),
    (lambda: (None, None), "returned NoneType for its callback, not an IFencedExecutionCallback"),
    (lambda: (None, object()), "returned object for its callback, not an IFencedExecutionCallback"),
    (lambda: ("3", _DONE), "returned the sync fence '3', not None or a file descriptor"),
    (lambda: (True, _DONE), "returned the sync fence True, not None or a file descriptor"),  # not descriptor 1
    (lambda: (-1, _DONE), "returned the sync fence -1, not None or a file descriptor"),
    (lambda: (_closed_descriptor(), _DONE), "which is no open file descriptor"),
])
def test_a_malformed_fenced_execution_answer_is_op_failed(register, answer, problem):
    """What a driver's execute_fenced returns is checked as Android's HAL adapters convert it
    (a sync fence that is none or a descriptor, a callback that is one): with the device named
    it is OP_FAILED naming the device and the rule (it was a raw TypeError or AttributeError,
    and a fence of True was waited on and closed as descriptor 1); otherwise the CPU runs it."""
    register(Answering("fenced"))
    for explicit in (True, False):
        compilation = compile_(add_mul_model(), [device_named("fenced")] if explicit else None)
        assert compilation.step_devices == ["fenced"]
        compilation._plan.single.execute_fenced = lambda *args, **kwargs: answer()
        execution = nnapi.Execution(compilation)
        execution.set_input(0, X)
        y = np.zeros(3, np.float32)
        execution.set_output(0, y)
        event = execution.start_compute_with_dependencies([])
        if explicit:
            with pytest.raises(nnapi.OpFailedError) as caught:
                event.wait()
            assert str(caught.value).startswith("fenced: execute_fenced ")
            assert problem in str(caught.value)
        else:
            event.wait()
            np.testing.assert_array_equal(y, EXPECTED)
            assert compilation._plan.fallback_count == 1


def test_the_fence_of_a_fenced_answer_with_no_callback_is_closed(register):
    """The caller owns the sync fence a driver returns: when the answer is refused for its
    callback, the fence is closed, not leaked."""
    register(Answering("fenced"))
    compilation = compile_(add_mul_model(), [device_named("fenced")])
    read, write = os.pipe()
    os.close(write)
    compilation._plan.single.execute_fenced = lambda *args, **kwargs: (read, None)
    execution = nnapi.Execution(compilation)
    execution.set_input(0, X)
    execution.set_output(0, np.zeros(3, np.float32))
    with pytest.raises(nnapi.OpFailedError, match="not an IFencedExecutionCallback"):
        execution.start_compute_with_dependencies([]).wait()
    with pytest.raises(OSError):
        os.fstat(read)


_INF = nnapi.hal.PerformanceInfo(float("inf"), float("inf"))


def _uniform(exec_time, power_usage=0.5, **fields):
    capabilities = nnapi.hal.Capabilities.uniform(nnapi.hal.PerformanceInfo(exec_time, power_usage))
    for name, value in fields.items():
        setattr(capabilities, name, value)
    return lambda: capabilities


@pytest.mark.parametrize("answer, problem", [
    (lambda: None, ": answered a NoneType, not a Capabilities"),
    (lambda: 1 / 0, " raised ZeroDivisionError: division by zero"),
    (_uniform("fast"), ": operand_performance[FLOAT32].exec_time is a str, not a number"),
    (_uniform(float("nan")), ": operand_performance[FLOAT32].exec_time is nan, not greater than 0"),
    (_uniform(0.0), ": operand_performance[FLOAT32].exec_time is 0.0, not greater than 0"),  # Android: > 0
    (_uniform(0.5, -1), ": operand_performance[FLOAT32].power_usage is -1.0, not greater than 0"),
    (_uniform(0.5, operand_performance={"x": _INF}), ": operand_performance has a key of type str, not an operand "
                                                       "type"),
    (_uniform(0.5, operand_performance={9999: _INF}), ": operand_performance has the key 9999, which is no operand "
                                                       "type"),
    (_uniform(0.5, operand_performance=[]), ": operand_performance is a list, not a dict"),
    (_uniform(0.5, if_performance=(1.0, 1.0)), ": if_performance is a tuple, not a PerformanceInfo"),
    (_uniform(0.5, step_cost_s=float("inf")), ": step_cost_s inf is not a finite number of seconds >= 0"),
    (_uniform(0.5, step_cost_s="1"), ": step_cost_s '1' is not a finite number of seconds >= 0"),
    # R1: ints beyond any float raised a raw OverflowError out of Compilation and `nnapi devices`
    (_uniform(10**400), ": operand_performance[FLOAT32].exec_time is an integer beyond any float"),
    (_uniform(0.5, step_cost_s=10**400), ": step_cost_s 1000000000000000000000000000000000000000 is not a finite "
                                         "number of seconds >= 0"),
    (_uniform(0.5, operand_performance={2**70: _INF}), f": operand_performance has the key {2**70}, which is no "
                                                       "operand type"),  # (an extension type is a uint32)
])
def test_capabilities_that_do_not_validate_are_no_performance_information(register, capsys, answer, problem):
    """A driver's capabilities are validated as Android validates getCapabilities (every
    figure > 0, the table's keys operand types) once, where the runtime reads them: one that
    does not validate is "no performance information" (every figure infinite: the device is
    chosen last), its problem shown by Device.capabilities_problem and `nnapi devices`, which
    crashed on it (AttributeError, ValueError from a str figure, the driver's exception)."""
    from nnapi.cli import main

    register(Answering("odd", capabilities=answer))
    device = device_named("odd")
    assert device.capabilities == nnapi.hal.Capabilities.uniform(_INF)
    assert device.capabilities_problem == f"odd: get_capabilities{problem}"
    assert compile_(add_mul_model()).step_devices == ["nnapi-reference"]
    alone = compile_(add_mul_model(), [device])
    np.testing.assert_array_equal(run(alone), EXPECTED)
    assert main(["devices", "-v"]) == 0
    assert f"  capabilities:  no performance information ({device.capabilities_problem})" in capsys.readouterr().out
    assert main(["devices", "--json"]) == 0
    listed = {d["name"]: d for d in json.loads(capsys.readouterr().out)["devices"]}
    assert listed["odd"]["capabilities_problem"] == device.capabilities_problem
    assert listed["nnapi-reference"]["capabilities_problem"] is None


def test_capabilities_are_read_once_and_kept_as_plain_numbers(register, capsys):
    """The runtime asks a driver for its capabilities once (as Android reads them when it
    makes the device) and keeps them validated: numpy figures become floats, an extension
    operand type is a valid key and `nnapi devices -v` names it (it raised AttributeError)."""
    from nnapi.cli import main

    calls = []
    table = {T.TENSOR_FLOAT32: nnapi.hal.PerformanceInfo(np.float32(0.25), np.int64(2)),
             (1 << 16) | 3: nnapi.hal.PerformanceInfo(0.5, 0.5)}

    def answer():
        calls.append(1)
        return nnapi.hal.Capabilities(operand_performance=table)

    register(Answering("counted", capabilities=answer))
    for _ in range(3):
        assert compile_(add_mul_model()).step_devices == ["counted"]
    device = device_named("counted")
    assert device.capabilities_problem is None
    performance = device.capabilities.operand_performance
    assert performance[T.TENSOR_FLOAT32] == nnapi.hal.PerformanceInfo(0.25, 2.0)
    assert type(performance[T.TENSOR_FLOAT32].exec_time) is float
    assert type(performance[T.TENSOR_FLOAT32].power_usage) is float
    assert main(["devices", "-v"]) == 0
    assert "extension operand type 3 (prefix 1)" in capsys.readouterr().out
    assert len(calls) == 1


def rankless_output_model():
    """y = x + x, y a tensor of unknown rank."""
    model = nnapi.Model()
    x = model.add_operand(OperandType(T.TENSOR_FLOAT32, [3]))
    act = model.add_operand(OperandType(T.INT32))
    model.set_operand_value(act, 0)
    y = model.add_operand(OperandType(T.TENSOR_FLOAT32, None))
    model.add_operation(Op.ADD, [x, x, act], [y])
    model.identify_inputs_and_outputs([x], [y])
    model.finish()
    return model


@pytest.mark.parametrize("how", ["compute", "reusable", "burst"])
def test_a_successful_answer_needs_a_known_rank_for_a_tensor_output(register, how):
    """Android's validateOutputShapesFromDriver: after a successful execution every tensor
    output's shape has a known rank. A driver answering [] for an output the model leaves
    of unknown rank failed (OP_FAILED naming the rule; the CPU re-runs it where the plan
    falls back): it was reported as a tensor of rank 0, while [3] is a success."""
    register(Answering("rankless"))
    for explicit, dims in ((True, []), (False, []), (True, [3])):
        compilation = compile_(rankless_output_model(), [device_named("rankless")] if explicit else None)
        assert compilation.step_devices == ["rankless"]
        honest = compilation._plan.single.execute

        def answer(*args, dims=dims, honest=honest, **kwargs):
            _, timing = honest(*args, **kwargs)
            return [nnapi.hal.OutputShape(list(dims), True)], timing

        compilation._plan.single.execute = answer
        execution = nnapi.Execution(compilation)
        execution.set_input(0, X)
        y = np.zeros(3, np.float32)
        execution.set_output(0, y, OperandType(T.TENSOR_FLOAT32, [3]) if how == "reusable" else None)
        if how == "reusable":
            execution.set_reusable(True)
        burst = nnapi.Burst(compilation) if how == "burst" else None
        run = execution.compute if burst is None else functools.partial(execution.burst_compute, burst)
        if explicit and not dims:
            with pytest.raises(nnapi.OpFailedError) as caught:
                run()
            assert str(caught.value).endswith("output 0: a tensor of unknown rank (dimensions []) in a successful "
                                              "execution")
            continue
        run()
        np.testing.assert_array_equal(y, X + X)
        assert execution.get_output_operand_dimensions(0) == [3]
        assert compilation._plan.fallback_count == (0 if dims else 1)


def test_a_step_answering_no_rank_for_a_temporary_falls_back(register):
    """The same rule per step of a partitioned plan: an ADD step answering [] for its
    temporary of unknown rank failed, and the plan re-runs on the CPU (with the devices
    named, the failure names the step's rule; it was the next step's, on a rank-0 input)."""
    register(FaultyDevice("rankless-add", supported={Op.ADD}))
    register(FaultyDevice("good-mul", supported={Op.MUL}))
    model = nnapi.Model()
    x = model.add_operand(OperandType(T.TENSOR_FLOAT32, [3]))
    act = model.add_operand(OperandType(T.INT32))
    model.set_operand_value(act, 0)
    doubled = model.add_operand(OperandType(T.TENSOR_FLOAT32, None))
    y = model.add_operand(OperandType(T.TENSOR_FLOAT32, [3]))
    model.add_operation(Op.ADD, [x, x, act], [doubled])
    model.add_operation(Op.MUL, [doubled, x, act], [y])
    model.identify_inputs_and_outputs([x], [y])
    model.finish()
    compilation = compile_(model)
    assert compilation.step_devices == ["rankless-add", "good-mul"]
    step = compilation._plan.steps[0]
    honest = step.prepared.execute

    def rankless(*args, **kwargs):
        _, timing = honest(*args, **kwargs)
        return [nnapi.hal.OutputShape([], True)], timing

    step.prepared.execute = rankless
    np.testing.assert_array_equal(run(compilation), EXPECTED)
    assert compilation._plan.fallback_count == 1
    named = compile_(model, [device_named("rankless-add"), device_named("good-mul")])
    honest = named._plan.steps[0].prepared.execute
    named._plan.steps[0].prepared.execute = rankless
    with pytest.raises(nnapi.OpFailedError) as caught:  # the next step's failure on a rank-0 input, before
        run(named)
    assert str(caught.value).endswith("rankless-add: execute output 0: a tensor of unknown rank (dimensions []) in "
                                      "a successful execution")
