"""Bisect: the first operation whose output differs between a device and
``nnapi-reference`` beyond the CTS tolerance.

Every intermediate tensor of the main graph is exposed as an extra model output, the
model runs once on the device under test (beside the reference, so operations the
device refuses still run) and once on the reference alone with the same seeded inputs,
and the outputs are compared operation by operation in run order. Each operation that
differs then runs alone on the device, on the reference's values of its inputs: one that
still differs makes the difference; one that agrees alone only passed on a difference
grown from earlier operations' roundings, each within tolerance.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

import nnapi
from nnapi.codes import OperandCode
from nnapi.conformance import float_tolerance, within_tolerance
from nnapi.errors import BadDataError
from nnapi.hal import OperandLifeTime
from nnapi.hal.types import operation_name
from nnapi.operand import TENSOR_TYPES
from nnapi.session import Session, random_inputs
from nnapi.tools._models import beside_reference, device_and_reference, operation_alone, with_outputs

QUANTIZED = (OperandCode.TENSOR_QUANT8_ASYMM, OperandCode.TENSOR_QUANT8_ASYMM_SIGNED,
             OperandCode.TENSOR_QUANT8_SYMM, OperandCode.TENSOR_QUANT16_ASYMM, OperandCode.TENSOR_QUANT16_SYMM)


@dataclass
class Difference:
    """How one operand differs between the device and the reference."""

    operation: int  # index in the model
    operation_type: str
    device: str  # where the operation ran in the device's plan
    operand: int
    operand_type: str
    dimensions: list[int]
    mismatched: int  # elements beyond tolerance
    elements: int
    max_abs_difference: float
    max_quantized_steps: int | None = None  # quantized operands
    #: The largest difference among the operation's inputs (intermediates only): non-zero
    #: means earlier operations' differences, each within tolerance, reached it.
    inherited_difference: float = 0.0
    #: Whether the operation, run alone on the device on the reference's values of its
    #: inputs, still differs (None: not tried, or no verdict).
    fails_alone: bool | None = None


@dataclass
class BisectResult:
    device: str
    compared: int  # operands compared
    first: Difference | None
    later: list[Difference] = field(default_factory=list)  # other differing operations, run order
    #: The first operation that differs alone (see ``Difference.fails_alone``).
    culprit: Difference | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def bisect(model: Any, device: nnapi.Device | str, *, seed: int = 0, inputs: list[np.ndarray] | None = None,
           tolerance: tuple[float, float] | None = None, quant_limit: int = 1) -> BisectResult:
    """Compare every intermediate of ``model`` on ``device`` against the reference.

    ``tolerance`` (atol, rtol) overrides the CTS float tolerance; ``quant_limit`` is the
    quantized steps allowed."""
    from nnapi.runtime.model_builder import build_hal_model

    public = getattr(model, "model", model)
    if not isinstance(public, nnapi.Model):
        raise BadDataError(f"bisect: expected a Model, got {type(model).__name__}")
    device, reference = device_and_reference(device, "bisect")
    hal_model, order = build_hal_model(public)
    main = hal_model.main
    intermediates = [i for op in main.operations for i in op.outputs
                     if main.operands[i].lifetime == OperandLifeTime.TEMPORARY_VARIABLE
                     and main.operands[i].type in TENSOR_TYPES]
    exposed, keep = with_outputs(public, intermediates)
    outputs = list(public.outputs) + [i for i in intermediates if i not in public.outputs]
    under_test = Session(exposed, beside_reference(device, reference))
    expected_session = Session(exposed, [reference])
    feeds = random_inputs(under_test.inputs, seed) if inputs is None else \
        {info.name: value for info, value in zip(under_test.inputs, inputs, strict=True)}
    placement = under_test.compilation.placement()
    actual = dict(zip(outputs, under_test.run(feeds).values()))
    expected = dict(zip(outputs, expected_session.run(feeds).values()))
    differences: list[Difference] = []
    compared = 0
    seen: dict[int, float] = {}  # operand -> max |difference|, within tolerance or not
    for position, operation in enumerate(main.operations):
        index = order[position]
        inherited = max((seen.get(i, 0.0) for i in operation.inputs), default=0.0)
        for operand_index in operation.outputs:
            if operand_index not in actual:
                continue
            compared += 1
            operand = main.operands[operand_index]
            code = OperandCode(operand.type)
            got, want = actual[operand_index], expected[operand_index]
            if got.shape != want.shape:
                differences.append(Difference(index, operation_name(operation.type),
                                              placement["operations"][index]["device"], operand_index, code.name,
                                              list(want.shape), want.size, want.size, float("inf")))
                break
            limit = tolerance or float_tolerance(code, hal_model.relax_computation_float32_to_float16)
            ok = within_tolerance(code, want.reshape(-1), got.reshape(-1), limit, quant_limit)
            delta = np.abs(got.astype(np.float64) - want.astype(np.float64))
            finite = delta[np.isfinite(delta)]
            seen[operand_index] = float(finite.max()) if finite.size else 0.0
            if ok.all():
                continue
            steps = int(finite.max()) if code in QUANTIZED and finite.size else None
            differences.append(Difference(
                index, operation_name(operation.type), placement["operations"][index]["device"], operand_index,
                code.name, list(want.shape), int((~ok).sum()), int(want.size),
                float(finite.max()) if finite.size else float("nan"), steps, inherited))
    values = {index: feeds[info.name] for index, info in zip(main.input_indexes, under_test.inputs)} | expected
    devices = beside_reference(device, reference)
    positions = {index: position for position, index in enumerate(order)}  # public index -> run order
    culprit = None
    for difference in differences[:MAX_ALONE]:
        position = positions[difference.operation]
        difference.fails_alone = _fails_alone(hal_model, position, values, devices, tolerance, quant_limit)
        if difference.fails_alone and culprit is None:
            culprit = difference
    del keep
    return BisectResult(device.name, compared, differences[0] if differences else None, differences[1:], culprit)


#: Differing operations run alone, at most (each is a compilation on the device).
MAX_ALONE = 20


def _fails_alone(hal_model: Any, position: int, values: dict[int, np.ndarray], devices: list[nnapi.Device],
                 tolerance: tuple[float, float] | None, quant_limit: int) -> bool | None:
    """Whether main-graph operation ``position``, alone on ``devices`` with the reference's
    ``values`` of its inputs, differs from the reference's ``values`` of its outputs."""
    operation = hal_model.main.operations[position]
    if any(i not in values for i in operation.outputs):
        return None
    try:
        model, inputs, keep = operation_alone(hal_model, position, {i: v.shape for i, v in values.items()})
        session = Session(model, devices)
        got = session.run({info.name: values[i] for info, i in zip(session.inputs, inputs, strict=True)})
    except (KeyError, nnapi.NnapiError):  # an input the comparison did not keep, or no run: no verdict
        return None
    del keep
    for index, actual in zip(operation.outputs, got.values(), strict=True):
        code = OperandCode(hal_model.main.operands[index].type)
        want = values[index]
        if actual.shape != want.shape:
            return True
        limit = tolerance or float_tolerance(code, hal_model.relax_computation_float32_to_float16)
        if not within_tolerance(code, want.reshape(-1), actual.reshape(-1), limit, quant_limit).all():
            return True
    return False


def format_result(result: BisectResult, operand_names: dict[int, str] | None = None) -> str:
    if result.first is None:
        return (f"{result.device}: all {result.compared} operation outputs agree with nnapi-reference "
                "within the CTS tolerance")
    first = result.first
    name = f" ({operand_names[first.operand]})" if operand_names and first.operand in operand_names else ""
    lines = [f"{result.device}: first difference at operation #{first.operation} {first.operation_type} "
             f"(ran on {first.device})",
             f"  output operand #{first.operand}{name}: {first.operand_type} {first.dimensions}",
             f"  {first.mismatched} of {first.elements} elements beyond tolerance; max |difference| "
             f"{first.max_abs_difference:.6g}" + (f" ({first.max_quantized_steps} quantized steps)"
                                                   if first.max_quantized_steps is not None else "")]
    if first.inherited_difference:
        lines.append(f"  its inputs already differed by up to {first.inherited_difference:.6g} (within tolerance): "
                     "the difference may have grown from earlier operations")
    if first.fails_alone:
        lines.append("  alone, on the reference's values of its inputs, it still differs: the difference is made here")
    elif first.fails_alone is False:
        lines.append("  alone, on the reference's values of its inputs, it agrees: the difference grew from "
                     "earlier operations' roundings, each within tolerance")
        culprit = result.culprit
        lines.append(f"  the first operation that differs alone: #{culprit.operation} {culprit.operation_type} "
                     f"(ran on {culprit.device})" if culprit else
                     "  no operation differs alone: the model amplifies roundings each within tolerance")
    if result.later:
        lines.append(f"  {len(result.later)} later operations differ too (downstream of it or independent)")
    return "\n".join(lines)
