"""Model inputs a request may omit (ANeuralNetworksExecution_setInput with no buffer): one
ONNX graph per pattern of omitted inputs, lowered when a request first shows the pattern.

The NDK lets a request omit a model input that feeds an optional operand (an LSTM's
projection or peephole weights, a bidirectional RNN's auxiliary input, SVDF's bias), and
such an input need not even have a fully specified type. An ONNX graph fixes its inputs
and the variant of every operation (an omitted projection is no product at all, an
omitted input gate weight is CIFG), so a prepared model whose inputs may be omitted keeps
one prepared graph per pattern: the HAL model with the omitted inputs made NO_VALUE
operands (and a present one's unspecified dimensions completed from the request) is
lowered and opened as a session of its own on the first request with that pattern
(the CTS gives its LSTM weights this way). Models without such inputs are prepared once,
as before. With compilation caching, the cache file holds the HAL model and the graph of
each pattern prepared so far (compilation_cache.py's ``_PatternCache``).

The lowerings that take omitted operands register their optional input positions here
(``optional_inputs``), and answer a support query (an isolated GraphBuilder) for an input
the request may omit (``presence`` None) only when they lower every valid pattern.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from nnapi.codes import OperationCode
from nnapi.hal import (
    ErrorStatus,
    HalError,
    IExecution,
    IPreparedModel,
    Model,
    OperandLifeTime,
    OutputShape,
    Request,
    Timing,
)

if TYPE_CHECKING:  # (for annotations only: the lowering imports no module of the device's)
    from nnapi.drivers.ort.builder import GraphBuilder

L = OperandLifeTime

#: a pattern of omitted inputs: the omitted input positions, and (position, dimensions) of
#: each present input whose dimensions the model leaves unspecified, as a request gives them
PatternKey = tuple[frozenset[int], tuple[tuple[int, tuple[int, ...]], ...]]

#: per operation type, the input positions that may hold an omitted operand
OPTIONAL_INPUTS: dict[OperationCode, frozenset[int]] = {}


def optional_inputs(code: OperationCode, positions: Iterable[int]) -> None:
    """Register the optional input positions of operation type ``code``."""
    OPTIONAL_INPUTS[code] = frozenset(positions)


def presence(g: GraphBuilder, index: int) -> bool | None:
    """Whether operand ``index`` (at an optional position) has a value: False for an
    omitted operand (NO_VALUE), None for a model input that a request may omit, asked in
    a support query (which must then hold for every pattern), else True."""
    lifetime = g.operand(index).lifetime
    if lifetime == L.NO_VALUE:
        return False
    if g.isolated and lifetime == L.SUBGRAPH_INPUT:
        return None
    return True


def omittable_inputs(model: Model) -> frozenset[int]:
    """The positions of the main model's inputs read only at registered optional positions
    (and not model outputs): those a request may omit."""
    main = model.main
    optional: dict[int, bool] = {}
    for operation in main.operations:
        positions = OPTIONAL_INPUTS.get(operation.type, frozenset())
        for position, index in enumerate(operation.inputs):
            optional[index] = optional.get(index, True) and position in positions
    outputs = set(main.output_indexes)
    return frozenset(position for position, index in enumerate(main.input_indexes)
                     if optional.get(index) and index not in outputs)


def without_inputs(model: Model, omitted: frozenset[int], dimensions: dict[int, list[int]]) -> Model:
    """``model`` with the main inputs at positions ``omitted`` made omitted operands
    (NO_VALUE, no longer inputs) and the inputs in ``dimensions`` given those dimensions
    (the HAL model given is left untouched)."""
    main = model.main
    operands = list(main.operands)
    for position in omitted:
        index = main.input_indexes[position]
        operands[index] = dataclasses.replace(operands[index], lifetime=L.NO_VALUE, dimensions=[])
    for position, dims in dimensions.items():
        index = main.input_indexes[position]
        operands[index] = dataclasses.replace(operands[index], dimensions=list(dims))
    inputs = [index for position, index in enumerate(main.input_indexes) if position not in omitted]
    subgraph = dataclasses.replace(main, operands=operands, input_indexes=inputs)
    return dataclasses.replace(model, main=subgraph)


class PatternPreparedModel(IPreparedModel):
    """A model whose inputs at ``omittable`` a request may omit: per pattern (the omitted
    positions, and the dimensions a request gives for a present one the model leaves
    unspecified) a prepared model of its own, made by ``prepare`` on the first request
    showing it (``prepare(model of the pattern, its key)``); the request goes to it without
    the omitted arguments. A pattern that does not lower (an invalid combination of omitted
    operands) fails every request showing it with the reason (GENERAL_FAILURE: the runtime
    may run the model elsewhere)."""

    answers_checked = True  # its variants are the ORT driver's (see IPreparedModel.answers_checked)

    def __init__(self, model: Model, omittable: frozenset[int],
                 prepare: Callable[[Model, PatternKey], IPreparedModel]) -> None:
        self._model = model
        self._omittable = omittable
        self._prepare = prepare
        main = model.main
        #: the omittable positions whose operand the model does not fully specify
        self._unspecified = frozenset(
            position for position in omittable
            if not main.operands[main.input_indexes[position]].dimensions
            or 0 in main.operands[main.input_indexes[position]].dimensions)
        self._count = len(main.input_indexes)
        self._variants: dict[tuple, IPreparedModel | HalError] = {}
        self._lock = threading.Lock()

    def _variant(self, request: Request) -> tuple[IPreparedModel, Request]:
        inputs = request.inputs
        if len(inputs) != self._count:
            raise HalError(ErrorStatus.INVALID_ARGUMENT, "the request's inputs do not match the model")
        omitted = frozenset(position for position, argument in enumerate(inputs) if argument.has_no_value)
        if not omitted <= self._omittable:
            position = min(omitted - self._omittable)
            raise HalError(ErrorStatus.INVALID_ARGUMENT, f"input {position} has no value (it is not optional)")
        dimensions = {position: list(inputs[position].dimensions) for position in sorted(self._unspecified - omitted)
                      if inputs[position].dimensions}
        key: PatternKey = (omitted, tuple((position, tuple(dims)) for position, dims in dimensions.items()))
        variant = self._variants.get(key)
        if variant is None:
            with self._lock:
                variant = self._variants.get(key)
                if variant is None:
                    try:
                        variant = self._prepare(without_inputs(self._model, omitted, dimensions), key)
                    except HalError as error:
                        variant = HalError(ErrorStatus.GENERAL_FAILURE,
                                           f"with inputs {sorted(omitted)} omitted: {error}")
                    self._variants[key] = variant
        if isinstance(variant, HalError):
            raise variant
        if omitted:
            request = Request([argument for position, argument in enumerate(inputs) if position not in omitted],
                              request.outputs, request.pools)
        return variant, request

    def execute(self, request: Request, measure_timing: bool = False, deadline_ns: int | None = None,
                loop_timeout_ns: int | None = None) -> tuple[list[OutputShape], Timing]:
        variant, request = self._variant(request)
        return variant.execute(request, measure_timing, deadline_ns, loop_timeout_ns)

    def create_reusable_execution(self, request: Request, measure_timing: bool = False,
                                  loop_timeout_ns: int | None = None) -> IExecution:
        variant, request = self._variant(request)
        return variant.create_reusable_execution(request, measure_timing, loop_timeout_ns)
