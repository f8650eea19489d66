"""IF and WHILE through the public API: results, nesting, shared and dynamic-shape models,
the loop timeout, and signature validation of referenced models."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import nnapi
from helpers import needed_dimensions
from nnapi import OperandCode as T
from nnapi import OperandType
from nnapi import OperationCode as Op


def i32(dims=(1,)) -> OperandType:
    return OperandType(T.TENSOR_INT32, dims)


def f32(dims=(1,)) -> OperandType:
    return OperandType(T.TENSOR_FLOAT32, dims)


def q8(dims=(1,)) -> OperandType:
    return OperandType(T.TENSOR_QUANT8_ASYMM, dims, 0.5, 10)


BOOL = OperandType(T.TENSOR_BOOL8, [1])
MODEL = OperandType(T.MODEL)
INT = OperandType(T.INT32)


class Builder:
    """A terse way to build a model: operands, constants, operations, then finish."""

    def __init__(self) -> None:
        self.model = nnapi.Model()
        self.keep: list[Any] = []

    def operand(self, op_type: OperandType, value: Any = None) -> int:
        index = self.model.add_operand(op_type)
        if isinstance(value, nnapi.Model):
            self.model.set_operand_value_from_model(index, value)
        elif value is not None:
            array = np.asarray(value, dtype=op_type.dtype)
            self.keep.append(array)
            self.model.set_operand_value(index, array)
        return index

    def add(self, a: int, b: int, out_type: OperandType) -> int:
        out = self.operand(out_type)
        self.model.add_operation(Op.ADD, [a, b, self.operand(INT, 0)], [out])
        return out

    def op(self, code: Op, inputs: list[int], out_types: list[OperandType]) -> list[int]:
        outs = [self.operand(t) for t in out_types]
        self.model.add_operation(code, inputs, outs)
        return outs

    def finish(self, inputs: list[int], outputs: list[int]) -> nnapi.Model:
        self.model.identify_inputs_and_outputs(inputs, outputs)
        self.model.finish()
        return self.model


def run(model: nnapi.Model, feeds: list[np.ndarray], out_types: list[OperandType],
        loop_timeout_ns: int | None = None) -> list[np.ndarray]:
    compilation = nnapi.Compilation(model)
    compilation.finish()
    buffers = [np.zeros(t.dimensions if t.is_fully_specified else (0,), dtype=t.dtype) for t in out_types]
    for _attempt in range(2):
        execution = nnapi.Execution(compilation)
        if loop_timeout_ns is not None:
            execution.set_loop_timeout(loop_timeout_ns)
        for position, feed in enumerate(feeds):
            execution.set_input(position, feed)
        for position, buffer in enumerate(buffers):
            execution.set_output(position, buffer)
        try:
            execution.compute()
        except nnapi.OutputInsufficientSizeError:
            buffers = [np.zeros(needed_dimensions(execution, i), dtype=t.dtype)
                       for i, t in enumerate(out_types)]
            continue
        return [b.reshape(execution.get_output_operand_dimensions(i)) for i, b in enumerate(buffers)]
    raise AssertionError("output sizes kept changing")


# --- WHILE -----------------------------------------------------------------------------
def fibonacci_models() -> tuple[nnapi.Model, nnapi.Model]:
    """cond(a, b, i, n) = i < n; body(a, b, i, n) = (b, a + b, i + 1)."""
    cond = Builder()
    a, b, i, n = (cond.operand(i32()) for _ in range(4))
    (less,) = cond.op(Op.LESS, [i, n], [BOOL])
    condition = cond.finish([a, b, i, n], [less])

    body = Builder()
    a, b, i, n = (body.operand(i32()) for _ in range(4))
    zero, one = body.operand(i32(), [0]), body.operand(i32(), [1])
    next_a = body.add(b, zero, i32())
    next_b = body.add(a, b, i32())
    next_i = body.add(i, one, i32())
    return condition, body.finish([a, b, i, n], [next_a, next_b, next_i])


def fibonacci_model() -> nnapi.Model:
    condition, body = fibonacci_models()
    main = Builder()
    n = main.operand(i32())
    a0, b0, i0 = main.operand(i32(), [0]), main.operand(i32(), [1]), main.operand(i32(), [0])
    outs = main.op(Op.WHILE, [main.operand(MODEL, condition), main.operand(MODEL, body), a0, b0, i0, n],
                   [i32(), i32()])
    return main.finish([n], outs)


def test_while_fibonacci():
    model = fibonacci_model()
    expected = [0, 1, 1, 2, 3, 5, 8, 13, 21, 34, 55]
    for n, fib in enumerate(expected):
        a, b = run(model, [np.array([n], np.int32)], [i32(), i32()])
        assert a.tolist() == [fib], n
        assert b.tolist() == [expected[n + 1] if n + 1 < len(expected) else 89]


def power_sum_model(value_type: OperandType) -> nnapi.Model:
    """sum_{i=0..n} x^i with a nested WHILE computing x^i inside the outer body."""
    # inner: cond(xi, j, x, i) = j < i; body = (xi * x, j + 1)
    inner_cond = Builder()
    xi, j, x, i = inner_cond.operand(value_type), inner_cond.operand(i32()), inner_cond.operand(value_type), \
        inner_cond.operand(i32())
    (less,) = inner_cond.op(Op.LESS, [j, i], [BOOL])
    inner_condition = inner_cond.finish([xi, j, x, i], [less])
    inner = Builder()
    xi, j, x, i = inner.operand(value_type), inner.operand(i32()), inner.operand(value_type), inner.operand(i32())
    (product,) = inner.op(Op.MUL, [xi, x, inner.operand(INT, 0)], [value_type])
    next_j = inner.add(j, inner.operand(i32(), [1]), i32())
    inner_body = inner.finish([xi, j, x, i], [product, next_j])

    # outer: cond(total, i, x, n) = i <= n; body = (total + x^i, i + 1)
    outer_cond = Builder()
    total, i, x, n = outer_cond.operand(value_type), outer_cond.operand(i32()), outer_cond.operand(value_type), \
        outer_cond.operand(i32())
    (at_most,) = outer_cond.op(Op.LESS_EQUAL, [i, n], [BOOL])
    outer_condition = outer_cond.finish([total, i, x, n], [at_most])
    outer = Builder()
    total, i, x, n = outer.operand(value_type), outer.operand(i32()), outer.operand(value_type), outer.operand(i32())
    one_value = 1.0 if value_type.type == T.TENSOR_FLOAT32 else 1.0 / value_type.scale + value_type.zero_point
    power, _ = outer.op(Op.WHILE, [outer.operand(MODEL, inner_condition), outer.operand(MODEL, inner_body),
                                   outer.operand(value_type, [one_value]), outer.operand(i32(), [0]), x, i],
                        [value_type, i32()])
    next_total = outer.add(total, power, value_type)
    next_i = outer.add(i, outer.operand(i32(), [1]), i32())
    outer_body = outer.finish([total, i, x, n], [next_total, next_i])

    main = Builder()
    x, n = main.operand(value_type), main.operand(i32())
    zero_value = 0.0 if value_type.type == T.TENSOR_FLOAT32 else value_type.zero_point
    (result,) = main.op(Op.WHILE, [main.operand(MODEL, outer_condition), main.operand(MODEL, outer_body),
                                   main.operand(value_type, [zero_value]), main.operand(i32(), [0]), x, n],
                        [value_type])
    return main.finish([x, n], [result])


def test_while_sum_of_powers_float32():
    model = power_sum_model(f32())
    for x, n in ((2.0, 0), (2.0, 3), (0.5, 4), (3.0, 2)):
        (result,) = run(model, [np.array([x], np.float32), np.array([n], np.int32)], [f32()])
        assert result[0] == pytest.approx(sum(x**k for k in range(n + 1)))


def test_while_sum_of_powers_quant8():
    value_type = q8()
    model = power_sum_model(value_type)
    for x, n in ((2.0, 4), (1.0, 5), (3.0, 2), (0.5, 1)):
        fed = np.array([round(x / 0.5) + 10], np.uint8)
        (result,) = run(model, [fed, np.array([n], np.int32)], [value_type])
        assert (int(result[0]) - 10) * 0.5 == pytest.approx(sum(x**k for k in range(n + 1)))


def test_while_zero_iterations_returns_initial_values():
    model = fibonacci_model()
    a, b = run(model, [np.array([-3], np.int32)], [i32(), i32()])
    assert (a.tolist(), b.tolist()) == ([0], [1])


def test_while_body_output_of_growing_shape():
    """The loop value doubles in length each iteration: shapes are dynamic."""
    (result,) = run(_growing_model(), [np.array([1.5, -2.0], np.float32), np.array([3], np.int32)], [f32((0,))])
    assert result.shape == (16,)
    assert result.tolist() == [1.5, -2.0] * 8


def infinite_loop_model() -> nnapi.Model:
    cond = Builder()
    x = cond.operand(i32())
    (always,) = cond.op(Op.GREATER_EQUAL, [x, x], [BOOL])
    condition = cond.finish([x], [always])
    body = Builder()
    x = body.operand(i32())
    zero = body.operand(i32(), [0])
    same = body.add(x, zero, i32())
    body_model = body.finish([x], [same])
    main = Builder()
    x = main.operand(i32())
    (out,) = main.op(Op.WHILE, [main.operand(MODEL, condition), main.operand(MODEL, body_model), x], [i32()])
    return main.finish([x], [out])


def test_while_infinite_loop_times_out():
    model = infinite_loop_model()
    with pytest.raises((nnapi.MissedDeadlineTransientError, nnapi.MissedDeadlinePersistentError)):
        run(model, [np.array([7], np.int32)], [i32()], loop_timeout_ns=50_000_000)


def test_while_timeout_is_capped_and_reported_on_execution():
    model = infinite_loop_model()
    compilation = nnapi.Compilation(model)
    compilation.finish()
    execution = nnapi.Execution(compilation)
    execution.set_loop_timeout(1_000_000)
    execution.set_input(0, np.array([1], np.int32))
    execution.set_output(0, np.zeros(1, np.int32))
    with pytest.raises(nnapi.NnapiError) as caught:
        execution.compute()
    assert caught.value.code in (nnapi.ResultCode.MISSED_DEADLINE_TRANSIENT,
                                 nnapi.ResultCode.MISSED_DEADLINE_PERSISTENT)


def test_while_rejects_condition_with_wrong_output():
    cond = Builder()
    x = cond.operand(i32())
    not_bool = cond.add(x, cond.operand(i32(), [0]), i32())
    bad_condition = cond.finish([x], [not_bool])
    _, body = fibonacci_models()
    main = Builder()
    values = [main.operand(i32()) for _ in range(4)]
    outs = [main.operand(i32()), main.operand(i32())]
    with pytest.raises(nnapi.BadDataError, match="condition"):
        main.model.add_operation(Op.WHILE, [main.operand(MODEL, bad_condition), main.operand(MODEL, body),
                                            *values], outs)


def test_while_rejects_body_with_wrong_types():
    condition, body = fibonacci_models()
    main = Builder()
    values = [main.operand(f32()) for _ in range(4)]     # the models take TENSOR_INT32
    outs = [main.operand(f32()), main.operand(f32())]
    with pytest.raises(nnapi.BadDataError):
        main.model.add_operation(Op.WHILE, [main.operand(MODEL, condition), main.operand(MODEL, body), *values],
                                 outs)


def test_while_rejects_too_few_values():
    condition, body = fibonacci_models()
    main = Builder()
    values = [main.operand(i32()) for _ in range(3)]
    outs = [main.operand(i32()), main.operand(i32())]
    with pytest.raises(nnapi.BadDataError):
        main.model.add_operation(Op.WHILE, [main.operand(MODEL, condition), main.operand(MODEL, body), *values],
                                 outs)


# --- IF ----------------------------------------------------------------------------------
def binary_model(code: Op, value_type: OperandType) -> nnapi.Model:
    builder = Builder()
    a, b = builder.operand(value_type), builder.operand(value_type)
    (out,) = builder.op(code, [a, b, builder.operand(INT, 0)], [value_type])
    return builder.finish([a, b], [out])


def if_model(then_model: nnapi.Model, else_model: nnapi.Model, condition: bool | None,
             value_type: OperandType) -> nnapi.Model:
    main = Builder()
    cond = main.operand(BOOL, None if condition is None else [condition])
    a, b = main.operand(value_type), main.operand(value_type)
    (out,) = main.op(Op.IF, [cond, main.operand(MODEL, then_model), main.operand(MODEL, else_model), a, b],
                     [value_type])
    return main.finish(([cond] if condition is None else []) + [a, b], [out])


def test_if_with_constant_condition():
    add, sub = binary_model(Op.ADD, f32((2,))), binary_model(Op.SUB, f32((2,)))
    a, b = np.array([5.0, 1.5], np.float32), np.array([2.0, 4.0], np.float32)
    (taken,) = run(if_model(add, sub, True, f32((2,))), [a, b], [f32((2,))])
    assert taken.tolist() == [7.0, 5.5]
    (taken,) = run(if_model(add, sub, False, f32((2,))), [a, b], [f32((2,))])
    assert taken.tolist() == [3.0, -2.5]


def test_if_with_condition_input_quant8():
    value_type = q8((3,))
    add, sub = binary_model(Op.ADD, value_type), binary_model(Op.SUB, value_type)
    model = if_model(add, sub, None, value_type)
    a = np.array([30, 40, 12], np.uint8)     # reals 10, 15, 1
    b = np.array([14, 20, 10], np.uint8)     # reals 2, 5, 0
    (then_result,) = run(model, [np.array([True]), a, b], [value_type])
    assert ((then_result.astype(int) - 10) * 0.5).tolist() == [12.0, 20.0, 1.0]
    (else_result,) = run(model, [np.array([False]), a, b], [value_type])
    assert ((else_result.astype(int) - 10) * 0.5).tolist() == [8.0, 10.0, 1.0]


def test_if_branches_are_the_same_model_and_model_shared_by_operations():
    shared = binary_model(Op.MUL, f32())
    main = Builder()
    cond = main.operand(BOOL)
    a, b = main.operand(f32()), main.operand(f32())
    branch = main.operand(MODEL, shared)
    (first,) = main.op(Op.IF, [cond, branch, branch, a, b], [f32()])
    # A second IF referencing the same model through another operand, fed the first's result.
    (second,) = main.op(Op.IF, [cond, main.operand(MODEL, shared), branch, first, b], [f32()])
    model = main.finish([cond, a, b], [first, second])
    for flag in (True, False):
        out_first, out_second = run(model, [np.array([flag]), np.array([3.0], np.float32),
                                            np.array([-2.0], np.float32)], [f32(), f32()])
        assert out_first.tolist() == [-6.0]
        assert out_second.tolist() == [12.0]


def alternating_sum_model() -> nnapi.Model:
    """Nested control flow: the body picks ADD or SUB by a condition computed per iteration."""
    add, sub = binary_model(Op.ADD, i32()), binary_model(Op.SUB, i32())
    body = Builder()
    total, i, n = body.operand(i32()), body.operand(i32()), body.operand(i32())
    two = body.operand(i32(), [2])
    half = body.op(Op.DIV, [i, two, body.operand(INT, 0)], [i32()])[0]
    twice_half = body.op(Op.MUL, [half, two, body.operand(INT, 0)], [i32()])[0]
    (even,) = body.op(Op.EQUAL, [twice_half, i], [BOOL])
    (changed,) = body.op(Op.IF, [even, body.operand(MODEL, add), body.operand(MODEL, sub), total, i], [i32()])
    next_i = body.add(i, body.operand(i32(), [1]), i32())
    body_model = body.finish([total, i, n], [changed, next_i])
    cond = Builder()
    total, i, n = cond.operand(i32()), cond.operand(i32()), cond.operand(i32())
    (less,) = cond.op(Op.LESS, [i, n], [BOOL])
    condition = cond.finish([total, i, n], [less])
    main = Builder()
    n = main.operand(i32())
    (out,) = main.op(Op.WHILE, [main.operand(MODEL, condition), main.operand(MODEL, body_model),
                                main.operand(i32(), [0]), main.operand(i32(), [0]), n], [i32()])
    return main.finish([n], [out])


def test_if_inside_while_body():
    (result,) = run(alternating_sum_model(), [np.array([6], np.int32)], [i32()])
    assert result.tolist() == [0 - 1 + 2 - 3 + 4 - 5]


def test_if_output_with_unspecified_dimensions():
    add, sub = binary_model(Op.ADD, f32((3,))), binary_model(Op.SUB, f32((3,)))
    main = Builder()
    cond = main.operand(BOOL, [True])
    a, b = main.operand(f32((3,))), main.operand(f32((3,)))
    (out,) = main.op(Op.IF, [cond, main.operand(MODEL, add), main.operand(MODEL, sub), a, b], [f32((0,))])
    model = main.finish([a, b], [out])
    (result,) = run(model, [np.ones(3, np.float32), np.full(3, 2.0, np.float32)], [f32((0,))])
    assert result.tolist() == [3.0, 3.0, 3.0]


def test_if_rejects_mismatched_branch():
    add_f32, add_i32 = binary_model(Op.ADD, f32()), binary_model(Op.ADD, i32())
    main = Builder()
    cond, a, b = main.operand(BOOL), main.operand(f32()), main.operand(f32())
    out = main.operand(f32())
    with pytest.raises(nnapi.BadDataError, match="else model"):
        main.model.add_operation(Op.IF, [cond, main.operand(MODEL, add_f32), main.operand(MODEL, add_i32), a, b],
                                 [out])


def test_if_rejects_wrong_input_count_and_condition_type():
    add = binary_model(Op.ADD, f32())
    main = Builder()
    cond, a = main.operand(BOOL), main.operand(f32())
    out = main.operand(f32())
    with pytest.raises(nnapi.BadDataError):
        main.model.add_operation(Op.IF, [cond, main.operand(MODEL, add), main.operand(MODEL, add), a], [out])
    not_bool = main.operand(i32())
    b = main.operand(f32())
    with pytest.raises(nnapi.BadDataError, match="condition"):
        main.model.add_operation(Op.IF, [not_bool, main.operand(MODEL, add), main.operand(MODEL, add), a, b],
                                 [out])


def test_if_checks_model_set_after_add_operation_at_finish():
    add_i32 = binary_model(Op.ADD, i32())
    main = Builder()
    cond, a, b = main.operand(BOOL), main.operand(f32()), main.operand(f32())
    then_operand, else_operand = main.operand(MODEL), main.operand(MODEL)
    out = main.operand(f32())
    main.model.add_operation(Op.IF, [cond, then_operand, else_operand, a, b], [out])
    main.model.set_operand_value_from_model(then_operand, add_i32)
    main.model.set_operand_value_from_model(else_operand, add_i32)
    main.model.identify_inputs_and_outputs([cond, a, b], [out])
    with pytest.raises(nnapi.BadDataError):
        main.model.finish()


# --- loops in prepared plans (nnapi-reference) ------------------------------------------------


def row_writer_model() -> nnapi.Model:
    """A loop writing row i of a [4, 3] buffer at each step, as Keras's TensorList writes
    a sequence: the rows before and after i are SLICEs whose begin / size are computed
    from i (shapes only known at execution), joined around the new row."""
    cond = Builder()
    buffer, i, n, x = cond.operand(f32((4, 3))), cond.operand(i32()), cond.operand(i32()), cond.operand(f32((1, 3)))
    (less,) = cond.op(Op.LESS, [i, n], [BOOL])
    condition = cond.finish([buffer, i, n, x], [less])
    body = Builder()
    buffer, i, n, x = body.operand(f32((4, 3))), body.operand(i32()), body.operand(i32()), body.operand(f32((1, 3)))
    (row,) = body.op(Op.MUL, [x, body.op(Op.CAST, [i], [f32()])[0], body.operand(INT, 0)], [f32((1, 3))])
    (begin_before,) = body.op(Op.MUL, [i, body.operand(i32((2,)), [0, 0]), body.operand(INT, 0)], [i32((2,))])
    (size_before,) = body.op(Op.ADD, [body.op(Op.MUL, [i, body.operand(i32((2,)), [1, 0]), body.operand(INT, 0)],
                                              [i32((2,))])[0], body.operand(i32((2,)), [0, 3]), body.operand(INT, 0)],
                             [i32((2,))])
    next_i = body.add(i, body.operand(i32(), [1]), i32())
    (begin_after,) = body.op(Op.MUL, [next_i, body.operand(i32((2,)), [1, 0]), body.operand(INT, 0)], [i32((2,))])
    (before,) = body.op(Op.SLICE, [buffer, begin_before, size_before], [f32((0, 3))])
    (after,) = body.op(Op.SLICE, [buffer, begin_after, body.operand(i32((2,)), [-1, -1])], [f32((0, 3))])
    (written,) = body.op(Op.CONCATENATION, [before, row, after, body.operand(INT, 0)], [f32((4, 3))])
    body_model = body.finish([buffer, i, n, x], [written, next_i])
    main = Builder()
    n, x = main.operand(i32()), main.operand(f32((1, 3)))
    (out,) = main.op(Op.WHILE, [main.operand(MODEL, condition), main.operand(MODEL, body_model),
                                main.operand(f32((4, 3)), np.zeros((4, 3))), main.operand(i32(), [0]), n, x],
                     [f32((4, 3))])
    return main.finish([n, x], [out])


def _main_plan(model: nnapi.Model):
    from nnapi.drivers.reference import ReferenceDevice
    from nnapi.runtime.model_builder import build_hal_model

    return ReferenceDevice().prepare_model(build_hal_model(model)[0])._plans[0]


def _cases() -> list[tuple[str, nnapi.Model, list[np.ndarray], list[OperandType], bool]]:
    """(name, model, feeds, output types, whether the loop's output shapes are static)."""
    x = np.array([[1.5, -2.0, 0.25]], np.float32)
    return [
        ("fibonacci", fibonacci_model(), [np.array([9], np.int32)], [i32(), i32()], True),
        ("nested", power_sum_model(f32()), [np.array([1.5], np.float32), np.array([4], np.int32)], [f32()], True),
        ("if inside", alternating_sum_model(), [np.array([7], np.int32)], [i32()], True),
        ("rows", row_writer_model(), [np.array([3], np.int32), x], [f32((4, 3))], True),
        ("growing", _growing_model(), [np.array([1.5, -2.0], np.float32), np.array([3], np.int32)], [f32((0,))], False),
    ]


def _growing_model() -> nnapi.Model:
    """A WHILE loop whose float32 value (of unknown length) doubles in length at each of
    ``limit`` iterations, from ``start``."""
    cond = Builder()
    values, count, limit = cond.operand(f32((0,))), cond.operand(i32()), cond.operand(i32())
    (less,) = cond.op(Op.LESS, [count, limit], [BOOL])
    condition = cond.finish([values, count, limit], [less])
    body = Builder()
    values, count, limit = body.operand(f32((0,))), body.operand(i32()), body.operand(i32())
    (doubled,) = body.op(Op.CONCATENATION, [values, values, body.operand(INT, 0)], [f32((0,))])
    next_count = body.add(count, body.operand(i32(), [1]), i32())
    body_model = body.finish([values, count, limit], [doubled, next_count])
    main = Builder()
    start, limit = main.operand(f32((2,))), main.operand(i32())
    (grown,) = main.op(Op.WHILE, [main.operand(MODEL, condition), main.operand(MODEL, body_model), start,
                                  main.operand(i32(), [0]), limit], [f32((0,))])
    return main.finish([start, limit], [grown])


@pytest.mark.parametrize("case", range(5))
def test_loops_run_as_programs_and_agree_with_the_step_by_step_run(case):
    """WHILE (nested, with an IF, with SLICEs of computed bounds, growing) runs in the
    reference's prepared program (its models' plans on bare arrays); a traced run goes
    operation by operation through While.prepare and gives the same values."""
    from nnapi import tracing

    name, model, feeds, out_types, static = _cases()[case]
    plan = _main_plan(model)
    assert plan.program is not None, name
    (loop,) = [step for step in plan.steps if step.code == Op.WHILE]
    assert (loop.shapes is not None) == static, name
    fast = run(model, feeds, out_types)
    tracing.start()
    try:
        slow = run(model, feeds, out_types)
    finally:
        events = tracing.stop()
    assert any(event["name"] == "WHILE" for event in events)
    assert sum(event["cat"] == "operation" for event in events) > 10  # the bodies' operations
    for a, b in zip(fast, slow, strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(a, b)
    if name == "rows":
        expected = np.zeros((4, 3), np.float32)
        expected[:3] = np.arange(3, dtype=np.float32)[:, None] * feeds[1]
        np.testing.assert_array_equal(fast[0], expected)


def test_loop_body_slices_of_computed_bounds_run_their_dynamic_kernels():
    """The row writer's SLICEs (bounds computed from the loop index) and CONCATENATION
    (of their run-time shapes) run ``plan_dynamic`` kernels, not ``prepare`` + ``execute``
    per call; a bound out of range fails the execution with the message ``prepare`` gives,
    in the program and in a traced (step by step) run alike, and so does a concatenation of
    inputs that disagree off the axis (the growing loop's values with another length)."""
    from nnapi import tracing
    from nnapi.drivers.reference import ReferenceDevice
    from nnapi.runtime.model_builder import build_hal_model

    prepared = ReferenceDevice().prepare_model(build_hal_model(row_writer_model())[0])
    body = next(plan for plan in prepared._plans[1:] if any(step.code == Op.SLICE for step in plan.steps))
    body = body.for_inputs(((((4, 3)), False), ((1,), False), ((1,), False), ((1, 3), False)))
    kinds = {step.code: step.kernel.__qualname__ for step in body.steps if step.code in (Op.SLICE, Op.CONCATENATION)}
    assert kinds == {Op.SLICE: "_dynamic_kernel.<locals>.kernel", Op.CONCATENATION: "_dynamic_kernel.<locals>.kernel"}
    x = np.array([[1.0, 2.0, 3.0]], np.float32)
    for traced in (False, True):
        if traced:
            tracing.start()
        try:
            with pytest.raises(nnapi.OpFailedError, match=r"SLICE: begin \[5, 0\] is out of range"):
                run(row_writer_model(), [np.array([5], np.int32), x], [f32((4, 3))])
        finally:
            if traced:
                tracing.stop()


def test_reusable_execution_runs_the_loop_program_under_its_loop_timeout():
    """A reusable execution computes a loop program again and again, each time under the
    execution's own loop timeout (an endless loop fails every time, promptly)."""
    model = fibonacci_model()
    compilation = nnapi.Compilation(model)
    compilation.finish()
    execution = nnapi.Execution(compilation)
    execution.set_reusable(True)
    n, a, b = np.array([10], np.int32), np.zeros(1, np.int32), np.zeros(1, np.int32)
    execution.set_input(0, n)
    execution.set_output(0, a)
    execution.set_output(1, b)
    for count, expected in ((10, 55), (5, 5), (10, 55)):
        n[0] = count
        execution.compute()
        assert a.tolist() == [expected]
    endless = nnapi.Compilation(infinite_loop_model())
    endless.finish()
    execution = nnapi.Execution(endless)
    execution.set_reusable(True)
    execution.set_loop_timeout(20_000_000)
    execution.set_input(0, np.array([1], np.int32))
    execution.set_output(0, np.zeros(1, np.int32))
    for _ in range(2):
        with pytest.raises((nnapi.MissedDeadlineTransientError, nnapi.MissedDeadlinePersistentError)):
            execution.compute()
