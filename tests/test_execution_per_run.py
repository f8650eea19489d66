"""An Execution per run (the NDK's usual code before feature level 5): set_input /
set_output take a contiguous array of the operand's dtype and shape as it is, and compute
runs it through the compilation's table (execution._Table), which binds a request once for
the arrays the previous executions used. What is checked: results follow the arrays'
values and land in the arrays given (not in those bound before), the binding is replaced
when the arrays change, every other kind of argument and setting takes the general path
with the same results, and every NDK rule still holds, on nnapi-reference and nnapi-ort-cpu."""

from __future__ import annotations

import weakref

import numpy as np
import pytest

import nnapi
from helpers import add_model, reference_devices, run_in_threads
from nnapi import OperandCode as T
from nnapi import OperandType


@pytest.fixture(params=["nnapi-reference", "nnapi-ort-cpu"])
def device(request) -> nnapi.Device:
    if request.param == "nnapi-reference":
        return reference_devices()[0]
    pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    request.getfixturevalue("calibration_file")
    return request.getfixturevalue("ort_device")


def compiled(device: nnapi.Device, dims=(2, 3)) -> nnapi.Compilation:
    compilation = nnapi.Compilation(add_model(dims), [device])
    compilation.finish()
    assert compilation.step_devices == [device.name]
    return compilation


def bound_arrays(compilation: nnapi.Compilation) -> list[np.ndarray] | None:
    """The arrays the compilation's runs are bound to on this thread: the table's bound
    request's, or, for a driver that takes the arrays themselves (nnapi-ort-cpu's
    array_executor: the table keeps nothing), those its binding on this thread holds."""
    table = compilation._execution_table
    if table.direct is None:
        return None if table.cached is None else table.cached[1]
    assert table.cached is None and table.pending is None
    binding = getattr(table.plan.single._local, "binding", None)
    return None if binding is None else [ref() if isinstance(ref, weakref.ref) else None for ref in binding.bound]


def run(compilation: nnapi.Compilation, a: np.ndarray, b: np.ndarray, out: np.ndarray) -> nnapi.Execution:
    execution = nnapi.Execution(compilation)
    execution.set_input(0, a)
    execution.set_input(1, b)
    execution.set_output(0, out)
    execution.compute()
    return execution


def test_the_same_arrays_run_after_run_follow_their_values(device):
    compilation = compiled(device)
    a, b, out = np.zeros((2, 3), np.float32), np.ones((2, 3), np.float32), np.zeros((2, 3), np.float32)
    for step in range(5):
        a[...] = np.arange(6, dtype=np.float32).reshape(2, 3) * step
        execution = run(compilation, a, b, out)
        np.testing.assert_array_equal(out, a + b)
        assert execution.get_output_operand_dimensions(0) == [2, 3]
    held = bound_arrays(compilation)  # bound once seen twice in a row (in the driver: at the first)
    assert held is not None and held[0] is a and held[2] is out


def test_other_arrays_get_the_results_not_the_bound_ones(device):
    compilation = compiled(device)
    first = [np.full((2, 3), 1, np.float32), np.full((2, 3), 2, np.float32), np.zeros((2, 3), np.float32)]
    for _ in range(3):
        run(compilation, *first)
    np.testing.assert_array_equal(first[2], 3)
    bound = compilation._execution_table.cached
    second = [np.full((2, 3), 10, np.float32), np.full((2, 3), 20, np.float32), np.zeros((2, 3), np.float32)]
    first[2][...] = -1
    run(compilation, *second)
    np.testing.assert_array_equal(second[2], 30)
    np.testing.assert_array_equal(first[2], -1)  # the request bound to the first arrays did not run
    assert compilation._execution_table.cached is bound  # one miss does not rebind
    run(compilation, *second)
    np.testing.assert_array_equal(second[2], 30)
    assert bound_arrays(compilation)[2] is second[2]  # the second time in a row does
    # one array changed (the output), the others kept: a miss again
    third_out = np.zeros((2, 3), np.float32)
    run(compilation, second[0], second[1], third_out)
    np.testing.assert_array_equal(third_out, 30)
    second[2][...] = 0
    run(compilation, *first)
    np.testing.assert_array_equal(first[2], 3)
    np.testing.assert_array_equal(second[2], 0)


def test_new_arrays_every_run(device):
    compilation = compiled(device)
    rng = np.random.default_rng(3)
    for _ in range(4):
        a, b = rng.standard_normal((2, 3)).astype(np.float32), rng.standard_normal((2, 3)).astype(np.float32)
        out = np.zeros((2, 3), np.float32)
        run(compilation, a, b, out)
        np.testing.assert_array_equal(out, a + b)


def test_a_new_input_array_every_run_into_the_same_output(device):
    """A preprocessed image per run (a new input array, the previous one dropped), the
    same other input and output: each run gives the new array's results; the array
    changed in place and run again gives the new values."""
    compilation = compiled(device)
    rng = np.random.default_rng(5)
    b, out = rng.standard_normal((2, 3)).astype(np.float32), np.zeros((2, 3), np.float32)
    for _ in range(4):
        a = rng.standard_normal((2, 3)).astype(np.float32)
        run(compilation, a, b, out)
        np.testing.assert_array_equal(out, a + b)
        a += 1
        run(compilation, a, b, out)
        np.testing.assert_array_equal(out, a + b)
        del a


def test_a_new_array_in_a_freed_ones_place_is_not_taken_for_it(device):
    """A loop that frees its input before making the next gets arrays at the same address
    (the same id) run after run: they are new arrays, so nothing is bound for them (binding
    each would cost more than it saves, and drop the binding of the arrays kept)."""
    compilation = compiled(device)
    b, out = np.ones((2, 3), np.float32), np.zeros((2, 3), np.float32)
    run(compilation, b, b, out)
    run(compilation, b, b, out)  # the arrays kept: bound
    table = compilation._execution_table
    bound = table.cached
    assert bound_arrays(compilation) is not None
    for step in range(4):
        a = np.full((2, 3), step, np.float32)
        run(compilation, a, b, out).free()
        np.testing.assert_array_equal(out, a + b)
        if table.direct is not None:  # the driver binds the new array (by identity, weakly)
            held = bound_arrays(compilation)
            assert held[0] is a
            del held
        del a
        assert table.cached is bound
        if table.direct is not None:
            assert bound_arrays(compilation)[0] is None  # freed with the loop's array
    run(compilation, b, b, out)  # the kept arrays again: still bound
    np.testing.assert_array_equal(out, b + b)
    assert table.cached is bound
    if table.direct is not None:  # kept on the thread's second binding, bound once
        kept = compilation._plan.single._local.binding.partner
        assert all(
            ref() is array for ref, array in zip(kept.bound, (b, b, out), strict=True))


def test_flat_and_read_only_arrays(device):
    compilation = compiled(device)
    a = np.arange(6, dtype=np.float32)
    a.flags.writeable = False
    b = np.frombuffer(np.full(6, 0.5, np.float32).tobytes(), np.float32)  # read-only
    out = np.zeros(6, np.float32)
    for _ in range(3):
        run(compilation, a, b, out)
        np.testing.assert_array_equal(out, a + 0.5)


def test_other_arguments_take_the_general_path_with_the_same_results(device):
    compilation = compiled(device)
    a, b = np.arange(6, dtype=np.float32).reshape(2, 3), np.full((2, 3), 2, np.float32)
    for _ in range(2):
        run(compilation, a, b, np.zeros((2, 3), np.float32))
    # bytes, a strided array, a typed call, a Memory: each beside the arrays
    memory = nnapi.Memory.create_shared(24)
    memory.buffer[:] = np.full(6, 2, np.float32).tobytes()
    strided = np.zeros((2, 6), np.float32)[:, ::2]
    cases = [
        lambda e: (e.set_input(0, a.tobytes()), e.set_input(1, b), e.set_output(0, out)),
        lambda e: (e.set_input(0, a), e.set_input(1, b), e.set_output(0, strided)),
        lambda e: (e.set_input(0, a, OperandType(T.TENSOR_FLOAT32, [2, 3])), e.set_input(1, b),
                   e.set_output(0, out)),
        lambda e: (e.set_input(0, a), e.set_input_from_memory(1, memory, 0, 24), e.set_output(0, out)),
    ]
    for case in cases:
        out = np.zeros((2, 3), np.float32)
        strided[...] = 0
        execution = nnapi.Execution(compilation)
        case(execution)
        execution.compute()
        result = strided if execution._outputs.get(0) is not None and execution._outputs[0].array is not None else out
        np.testing.assert_array_equal(result, a + 2)


def test_settings_take_the_general_path(device):
    compilation = compiled(device)
    a, b, out = np.ones((2, 3), np.float32), np.ones((2, 3), np.float32), np.zeros((2, 3), np.float32)
    for _ in range(3):
        run(compilation, a, b, out)
    execution = nnapi.Execution(compilation)
    execution.set_measure_timing(True)
    execution.set_timeout(10**10)
    execution.set_loop_timeout(10**9)
    execution.set_input(0, a)
    execution.set_input(1, b)
    execution.set_output(0, out)
    out[...] = 0
    execution.compute()
    np.testing.assert_array_equal(out, 2)
    assert execution.get_duration(nnapi.DurationCode.DURATION_IN_DRIVER) != nnapi.execution.DURATION_UNAVAILABLE
    # a timeout alone runs through the binding, its deadline honoured
    execution = nnapi.Execution(compilation)
    execution.set_timeout(10**10)
    out[...] = 0
    for position, array in enumerate((a, b)):
        execution.set_input(position, array)
    execution.set_output(0, out)
    execution.compute()
    np.testing.assert_array_equal(out, 2)
    assert execution.get_duration(nnapi.DurationCode.DURATION_IN_DRIVER) == nnapi.execution.DURATION_UNAVAILABLE


def test_a_deadline_that_passed_is_missed_on_the_bound_request(device):
    compilation = compiled(device)
    a, b, out = np.ones((2, 3), np.float32), np.ones((2, 3), np.float32), np.zeros((2, 3), np.float32)
    for _ in range(3):
        run(compilation, a, b, out)
    execution = nnapi.Execution(compilation)
    execution.set_timeout(1)  # 1 ns after compute starts: over before the driver looks at it
    for position, array in enumerate((a, b)):
        execution.set_input(position, array)
    execution.set_output(0, out)
    with pytest.raises(nnapi.NnapiError) as caught:
        execution.compute()
    assert caught.value.code == nnapi.ResultCode.MISSED_DEADLINE_TRANSIENT
    with pytest.raises(nnapi.BadStateError):
        execution.get_output_operand_dimensions(0)
    with pytest.raises(nnapi.BadStateError):
        execution.compute()  # completed, not reusable


def test_ndk_rules_hold_for_arrays_taken_as_they_are(device):
    compilation = compiled(device)
    a, out = np.ones((2, 3), np.float32), np.zeros((2, 3), np.float32)
    execution = nnapi.Execution(compilation)
    execution.set_input(0, a)
    with pytest.raises(nnapi.BadStateError):
        execution.set_input(0, a)  # set twice
    with pytest.raises(nnapi.BadStateError):
        execution.set_input(0, a, OperandType(T.TENSOR_FLOAT32, [2, 3]))
    with pytest.raises(nnapi.BadStateError):
        execution.enable_input_and_output_padding(True)
    with pytest.raises(nnapi.BadDataError):
        execution.set_input(True, a)  # a bool is no index
    with pytest.raises(nnapi.BadDataError):
        execution.set_input(1, a.astype(np.int32))
    with pytest.raises(nnapi.BadDataError):
        execution.set_input(1, np.ones((3, 2), np.float32))
    with pytest.raises(nnapi.BadDataError):
        execution.set_input(2, a)
    read_only = np.zeros((2, 3), np.float32)
    read_only.flags.writeable = False
    with pytest.raises(nnapi.BadDataError):
        execution.set_output(0, read_only)
    with pytest.raises(nnapi.BadDataError):
        execution.compute()  # input 1 not set
    execution.set_input(1, a)
    execution.set_output(0, out)
    with pytest.raises(nnapi.BadStateError):
        execution.set_output(0, out)
    execution.compute()
    np.testing.assert_array_equal(out, 2)
    with pytest.raises(nnapi.BadStateError):
        execution.compute()
    with pytest.raises(nnapi.BadStateError):
        execution.set_input(0, a)
    # slow first, then the array: still set twice
    execution = nnapi.Execution(compilation)
    execution.set_input(0, a.tobytes())
    with pytest.raises(nnapi.BadStateError):
        execution.set_input(0, a)


def test_freed_objects(device):
    compilation = compiled(device)
    a, out = np.ones((2, 3), np.float32), np.zeros((2, 3), np.float32)
    for _ in range(3):
        run(compilation, a, a, out)
    execution = nnapi.Execution(compilation)
    execution.set_input(0, a)
    execution.set_input(1, a)
    execution.set_output(0, out)
    execution.free()
    with pytest.raises(nnapi.BadStateError):
        execution.compute()
    with pytest.raises(nnapi.BadStateError):
        execution.set_input(0, a)
    execution = nnapi.Execution(compilation)
    execution.set_input(0, a)
    execution.set_input(1, a)
    execution.set_output(0, out)
    compilation.free()
    assert compilation._execution_table is None  # the arrays it bound are let go
    with pytest.raises(nnapi.BadStateError):
        execution.compute()
    with pytest.raises(nnapi.BadStateError):
        nnapi.Execution(compilation)


def test_threads_with_arrays_of_their_own(device):
    compilation = compiled(device, (64,))
    failures: list[str] = []

    def worker(seed: int) -> None:
        a, b, out = np.full(64, seed, np.float32), np.full(64, 1, np.float32), np.zeros(64, np.float32)
        for step in range(40):
            a[...] = seed * 100 + step
            run(compilation, a, b, out)
            if not np.array_equal(out, a + 1):
                failures.append(f"thread {seed} step {step}: {out[:3]}")

    run_in_threads(worker, 3)
    assert not failures


def test_a_split_plan(request):
    """A plan of two steps (CONV_2D on nnapi-ort-cpu, a STRIDED_SLICE whose shrink mask is
    given at run time declined there: the reference runs it): executions per run through the table give
    the reference's results."""
    pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    request.getfixturevalue("calibration_file")
    ort_device = request.getfixturevalue("ort_device")
    from test_driver_ort import _SHRINK, _conv_then_declined_model, _reference_alone, _run

    model, _keep = _conv_then_declined_model()
    split = nnapi.Compilation(model, [ort_device, *reference_devices()])
    split.finish()
    assert split.step_devices == ["nnapi-ort-cpu", "nnapi-reference"]
    rng = np.random.default_rng(4)
    image = np.zeros((1, 6, 6, 3), np.float32)
    for _ in range(4):  # the same image array, new values each run; new output arrays (_run)
        image[...] = rng.standard_normal((1, 6, 6, 3))
        features, best = _run(split, image)
        expected_features, expected_best = _reference_alone(model, image)
        np.testing.assert_allclose(features, expected_features, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(best, expected_best, rtol=1e-5, atol=1e-5)
    features, best = np.zeros((1, 6, 6, 4), np.float32), np.zeros((1, 6, 6, 4), np.float32)
    for _ in range(3):  # the same arrays throughout (a plan of several steps binds nothing)
        image[...] = rng.standard_normal((1, 6, 6, 3))
        execution = nnapi.Execution(split)
        execution.set_input(0, image)
        execution.set_input(1, _SHRINK)
        execution.set_output(0, features)
        execution.set_output(1, best)
        execution.compute()
        expected_features, expected_best = _reference_alone(model, image)
        np.testing.assert_allclose(features, expected_features, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(best, expected_best, rtol=1e-5, atol=1e-5)
    assert split._execution_table.cached is None


def test_unspecified_dimensions_take_the_general_path(device):
    """A model whose dimensions are left to the execution: each run's arrays say them, and
    the results have each run's shape (no binding of another shape is reused)."""
    compilation = nnapi.Compilation(add_model((0, 3)), [device])
    compilation.finish()
    for rows in (2, 2, 2, 5, 1, 5):
        x = np.arange(rows * 3, dtype=np.float32).reshape(rows, 3)
        result = np.zeros((rows, 3), np.float32)
        execution = nnapi.Execution(compilation)
        execution.set_input(0, x)
        execution.set_input(1, x)
        execution.set_output(0, result)
        execution.compute()
        np.testing.assert_array_equal(result, 2 * x)
        assert execution.get_output_operand_dimensions(0) == [rows, 3]
    assert compilation._execution_table.cached is None
