"""IF and WHILE (feature level 4): operations that run referenced models.

IF: input 0 is a TENSOR_BOOL8 [1] condition, inputs 1 and 2 the models run when it is
true / false, inputs 3.. are passed to the chosen model, whose outputs become the
operation's. WHILE: input 0 is the condition model, input 1 the body; the remaining inputs
are m input-output values, k state values and n input-only values. While the condition
(one TENSOR_BOOL8 [1] output) is true, the body maps (m + k + n) values to the next m + k;
the final m input-output values are the outputs. A loop still running after the
execution's loop timeout aborts with MISSED_DEADLINE_TRANSIENT.

Referenced models must agree with the operation: same counts, types, scales, zero points,
and ranks / dimensions wherever both sides specify them. Their outputs may have dynamic
shapes: both operations run the referenced models in ``prepare``, so the real shapes are
known before ``execute`` hands over the values. That is the reference path (and a traced
or timed run's); a driver's prepared plan may run the referenced models' own plans on bare
arrays instead (nnapi-reference does), with the same ``truth`` and loop (``run_loop``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import numpy as np

from nnapi.codes import DEFAULT_LOOP_TIMEOUT_NS, OperandCode, OperationCode
from nnapi.errors import MissedDeadlineTransientError
from nnapi.operand import OperandType
from nnapi.operations.base import ExecutionContext, Operation, Shape, Tensor, ValidationContext, register

T = OperandCode

# Named input positions (Android's IfOperation.h / WhileOperation.h kCondBoolOperand, ...).
IF_CONDITION = 0
IF_THEN_MODEL = 1
IF_ELSE_MODEL = 2
IF_FIRST_INPUT = 3  # the values passed to the chosen branch
WHILE_CONDITION_MODEL = 0
WHILE_BODY_MODEL = 1
WHILE_FIRST_VALUE = 2  # the m input-output, k state and n input-only values


def _compatible(a: OperandType, b: OperandType) -> str | None:
    """None when ``a`` and ``b`` agree as the spec requires; otherwise how they differ."""
    if a.type != b.type:
        return f"type {a.type.name} vs {b.type.name}"
    if (a.scale, a.zero_point) != (b.scale, b.zero_point):
        return f"quantization ({a.scale}, {a.zero_point}) vs ({b.scale}, {b.zero_point})"
    if a.channel_quant != b.channel_quant:
        return "per-channel quantization parameters differ"
    if a.dimensions and b.dimensions:
        if len(a.dimensions) != len(b.dimensions):
            return f"rank {len(a.dimensions)} vs {len(b.dimensions)}"
        if any(x and y and x != y for x, y in zip(a.dimensions, b.dimensions, strict=True)):
            return f"dimensions {list(a.dimensions)} vs {list(b.dimensions)}"
    return None


def _check_agree(ctx: ValidationContext, what: str, ours: Sequence[OperandType], theirs: Sequence[OperandType],
                 names: Sequence[str]) -> None:
    for position, (mine, other) in enumerate(zip(ours, theirs, strict=True)):
        problem = _compatible(mine, other)
        if problem:
            ctx.fail(f"{names[position]} does not match {what} {position}: {problem}")


def _check_condition_operand(ctx: ValidationContext, operand: OperandType, where: str) -> None:
    if operand.type != T.TENSOR_BOOL8 or tuple(operand.dimensions) != (1,):
        ctx.fail(f"{where} must be TENSOR_BOOL8 of shape [1], got {operand.describe()}")


def truth(value: np.ndarray) -> bool:
    """The value of a condition (a TENSOR_BOOL8 of one element); ValueError otherwise."""
    value = np.asarray(value)
    if value.size != 1:
        raise ValueError(f"a condition must hold one value, got shape {list(value.shape)}")
    return bool(value.reshape(-1)[0])


def _truth(tensor: Tensor) -> bool:
    return truth(tensor.value)


def loop_timed_out(iterations: int, elapsed_ns: int, timeout_ns: int) -> MissedDeadlineTransientError:
    """The error of a WHILE whose condition still held after the loop timeout."""
    return MissedDeadlineTransientError(
        f"WHILE: the condition still held after {iterations} iterations and {elapsed_ns / 1e6:.0f} ms "
        f"(loop timeout {timeout_ns / 1e6:.0f} ms)")


def run_loop(holds: Callable[[list], bool], body: Callable[[list], Sequence], values: list,
             timeout_ns: int | None, check_deadline: Callable[[], None]) -> list:
    """WHILE's loop, for ``While.prepare`` and a driver's plan alike: while ``holds(values)``,
    the body's m + k results replace the first m + k values; a loop still running after
    ``timeout_ns`` (None: the default loop timeout) raises ``loop_timed_out``, and the
    deadline is checked before each iteration. Returns the final values."""
    timeout_ns = DEFAULT_LOOP_TIMEOUT_NS if timeout_ns is None else timeout_ns
    start = time.monotonic_ns()
    iterations = 0
    while holds(values):
        elapsed = time.monotonic_ns() - start
        if elapsed > timeout_ns:
            raise loop_timed_out(iterations, elapsed, timeout_ns)
        check_deadline()
        carried = body(values)
        values = list(carried) + values[len(carried):]
        iterations += 1
    return values


@register(OperationCode.IF)
class If(Operation):
    def validate(self, ctx: ValidationContext) -> None:
        if len(ctx.inputs) < IF_FIRST_INPUT:
            ctx.fail(f"expected at least {IF_FIRST_INPUT} inputs (condition, then model, else model), "
                     f"got {len(ctx.inputs)}")
        if not ctx.outputs:
            ctx.fail("expected at least 1 output")
        _check_condition_operand(ctx, ctx.inputs[IF_CONDITION], f"input {IF_CONDITION} (condition)")
        ctx.check_input_type(IF_THEN_MODEL, T.MODEL)
        ctx.check_input_type(IF_ELSE_MODEL, T.MODEL)
        branch_inputs = ctx.inputs[IF_FIRST_INPUT:]
        input_names = [f"input {i + IF_FIRST_INPUT}" for i in range(len(branch_inputs))]
        output_names = [f"output {i}" for i in range(len(ctx.outputs))]
        for index, branch in ((IF_THEN_MODEL, "then"), (IF_ELSE_MODEL, "else")):
            signature = ctx.referenced_signature(index)
            if signature is None:
                continue  # checked again at finish, once the model is set
            if len(signature.inputs) != len(branch_inputs) or len(signature.outputs) != len(ctx.outputs):
                ctx.fail(f"the {branch} model has {len(signature.inputs)} inputs and {len(signature.outputs)} "
                         f"outputs; the operation passes {len(branch_inputs)} and expects {len(ctx.outputs)}")
            _check_agree(ctx, f"{branch} model input", branch_inputs, signature.inputs, input_names)
            _check_agree(ctx, f"{branch} model output", ctx.outputs, signature.outputs, output_names)

    def prepare(self, ctx: ExecutionContext) -> list[Shape]:
        try:
            condition = _truth(ctx.input(IF_CONDITION))
        except ValueError as error:
            ctx.fail(str(error))
        branch = ctx.value(IF_THEN_MODEL) if condition else ctx.value(IF_ELSE_MODEL)
        results = ctx.run_subgraph(branch, list(ctx.inputs[IF_FIRST_INPUT:]))
        ctx.require(len(results) == len(ctx.outputs),
                    f"the branch produced {len(results)} outputs, expected {len(ctx.outputs)}")
        ctx.scratch["results"] = results
        return [tuple(result.shape) for result in results]

    def execute(self, ctx: ExecutionContext) -> list[np.ndarray]:
        return [np.asarray(result.value) for result in ctx.scratch["results"]]


@register(OperationCode.WHILE)
class While(Operation):
    def validate(self, ctx: ValidationContext) -> None:
        if len(ctx.inputs) < WHILE_FIRST_VALUE + 1:
            ctx.fail(f"expected at least {WHILE_FIRST_VALUE + 1} inputs (condition model, body model, values), "
                     f"got {len(ctx.inputs)}")
        outputs = len(ctx.outputs)
        if outputs < 1:
            ctx.fail("expected at least 1 output")
        ctx.check_input_type(WHILE_CONDITION_MODEL, T.MODEL)
        ctx.check_input_type(WHILE_BODY_MODEL, T.MODEL)
        values = ctx.inputs[WHILE_FIRST_VALUE:]
        if len(values) < outputs:
            ctx.fail(f"{outputs} outputs need at least {outputs} loop values, got {len(values)}")
        value_names = [f"input {i + WHILE_FIRST_VALUE}" for i in range(len(values))]
        condition = ctx.referenced_signature(WHILE_CONDITION_MODEL)
        if condition is not None:
            if len(condition.inputs) != len(values):
                ctx.fail(f"the condition model has {len(condition.inputs)} inputs, the operation passes "
                         f"{len(values)}")
            _check_agree(ctx, "condition model input", values, condition.inputs, value_names)
            if len(condition.outputs) != 1:
                ctx.fail(f"the condition model must have exactly 1 output, got {len(condition.outputs)}")
            _check_condition_operand(ctx, condition.outputs[0], "the condition model's output")
        body = ctx.referenced_signature(WHILE_BODY_MODEL)
        if body is not None:
            if len(body.inputs) != len(values):
                ctx.fail(f"the body model has {len(body.inputs)} inputs, the operation passes {len(values)}")
            carried = len(body.outputs)   # m + k
            if not outputs <= carried <= len(values):
                ctx.fail(f"the body model has {carried} outputs; it needs between {outputs} (the operation's "
                         f"outputs) and {len(values)} (its inputs)")
            _check_agree(ctx, "body model input", values, body.inputs, value_names)
            # Body outputs feed the next iteration and, for the first m, the operation's outputs.
            _check_agree(ctx, "body model output", values[:carried], body.outputs, value_names[:carried])
            _check_agree(ctx, "body model output", ctx.outputs, body.outputs[:outputs],
                         [f"output {i}" for i in range(outputs)])

    def prepare(self, ctx: ExecutionContext) -> list[Shape]:
        condition_model, body_model = ctx.value(WHILE_CONDITION_MODEL), ctx.value(WHILE_BODY_MODEL)

        def holds(values: list[Tensor]) -> bool:
            verdict = ctx.run_subgraph(condition_model, values)
            try:
                return _truth(verdict[0])
            except ValueError as error:
                ctx.fail(f"condition model: {error}")

        values = run_loop(holds, lambda values: ctx.run_subgraph(body_model, values),
                          list(ctx.inputs[WHILE_FIRST_VALUE:]), ctx.loop_timeout_ns, ctx.check_deadline)
        results = values[:len(ctx.outputs)]
        ctx.scratch["results"] = results
        return [tuple(result.shape) for result in results]

    def execute(self, ctx: ExecutionContext) -> list[np.ndarray]:
        return [np.asarray(result.value) for result in ctx.scratch["results"]]
