"""The operation contract and registry: every NNAPI operation is one `Operation` subclass.

An operation module defines a subclass with three methods, after Android's
nn/common/operations (validate / prepare / execute), and registers it:

    INPUT = 0  # named input positions, as Android's kInputTensor

    @register(OperationCode.FLOOR)
    class Floor(Operation):
        def validate(self, ctx: ValidationContext) -> None:      # at add_operation
            ctx.check_counts(inputs=1, outputs=1)
            ctx.check_input_types([FLOAT_TENSORS])
            ctx.check_output_type(0, ctx.input_type(INPUT))
        def prepare(self, ctx: ExecutionContext) -> list[Shape]:  # shape inference
            return [ctx.input(INPUT).shape]
        def execute(self, ctx: ExecutionContext) -> list[np.ndarray]:
            return [np.floor(ctx.input(INPUT).value)]

``validate`` sees operand *types*, plus the values of constant scalars already set
(``ctx.constant``; values may be set after the operation is added, so a check that needs
one is skipped while it is unknown and made when ``finish`` validates again), and raises
BadDataError through ``ctx.fail``. ``prepare`` sees the real input tensors
at execution time (shapes and values) and returns the output shapes; value errors there
go through ``ctx.fail`` (OP_FAILED). ``execute`` returns one numpy array per output, of
the output operand's storage dtype and of the shape ``prepare`` returned.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np

from nnapi.codes import FeatureLevelCode, OperandCode, OperationCode, operand_type_introduced_in
from nnapi.codes import operation_introduced_in as introduced_in
from nnapi.errors import BadDataError, NnapiError
from nnapi.operand import OperandType, SymmPerChannelQuantParams, dtype_of

Shape = tuple[int, ...]
T = OperandCode

#: The running execution's deadline check, for kernel helpers that have no context.
_DEADLINE_CHECK: contextvars.ContextVar[Callable[[], None] | None] = contextvars.ContextVar(
    "nnapi_deadline_check", default=None)


def current_deadline_check() -> Callable[[], None] | None:
    """The check ``check_deadline`` calls now (None outside a run with a deadline)."""
    return _DEADLINE_CHECK.get()


def check_deadline() -> None:
    """Raise if the running execution's deadline passed. Long kernels call this once per
    block of work (it costs one clock read), so a deadline ends a heavy operation early."""
    check = _DEADLINE_CHECK.get()
    if check is not None:
        check()


@contextmanager
def deadline_checked(check: Callable[[], None] | None) -> Iterator[None]:
    """Make ``check`` what ``check_deadline`` calls while a driver runs an execution."""
    token = _DEADLINE_CHECK.set(check)
    try:
        yield
    finally:
        _DEADLINE_CHECK.reset(token)


class OperationFailed(NnapiError):
    """An operation could not run on the values it was given (ANEURALNETWORKS_OP_FAILED)."""


@dataclass
class Tensor:
    """An operand at execution time: its type information and its value.

    ``value`` is a numpy array of the operand's storage dtype with ``shape``; scalars are
    0-d arrays; ``value`` is None for an omitted optional operand (NO_VALUE).
    """

    type: OperandCode
    shape: Shape
    scale: float
    zero_point: int
    channel_quant: SymmPerChannelQuantParams | None
    value: Any

    @property
    def is_omitted(self) -> bool:
        return self.value is None

    @property
    def rank(self) -> int:
        return len(self.shape)

    def item(self) -> Any:
        """The Python value of a scalar operand (int, float or bool)."""
        return self.value.item()


@dataclass(frozen=True)
class SubgraphSignature:
    """The operand types of a referenced model's inputs and outputs (for IF / WHILE)."""

    inputs: tuple[OperandType, ...]
    outputs: tuple[OperandType, ...]


class ValidationContext:
    """What ``Operation.validate`` sees: the operation's operand types, at add_operation,
    and the values of the constant scalar inputs set so far."""

    def __init__(self, code: OperationCode, inputs: Sequence[OperandType], outputs: Sequence[OperandType],
                 referenced: Sequence[SubgraphSignature | None] | None = None,
                 constants: Sequence[Any] | None = None):
        self.code = code
        self.inputs = list(inputs)
        self.outputs = list(outputs)
        self._referenced = list(referenced) if referenced is not None else [None] * len(self.inputs)
        self._constants = list(constants) if constants is not None else [None] * len(self.inputs)
        #: the lowest feature level of the signature accepted so far: the operation's and
        #: its operand types' own levels, raised by ``at_least`` for newer arguments
        self.feature_level = max([introduced_in(code),
                                  *(operand_type_introduced_in(t.type) for t in (*inputs, *outputs))])
        #: the output shapes ``check_declared_shapes`` inferred from the declared shapes and
        #: constants (None: not inferred there), for a driver's plan to reuse
        self.inferred_shapes: list[Shape] | None = None

    def at_least(self, level: FeatureLevelCode) -> None:
        """The signature uses something (an optional argument, a rule) of ``level``."""
        self.feature_level = max(self.feature_level, level)

    def referenced_signature(self, index: int) -> SubgraphSignature | None:
        """For a MODEL input: the referenced model's input and output types; None while
        its value is not set yet (``finish`` validates again once it is)."""
        return self._referenced[index] if index < len(self._referenced) else None

    def constant(self, index: int) -> Any:
        """The value of input ``index`` when it is a constant already set: a scalar's (a
        layout flag, a depth multiplier, an axis) or a small tensor's array (RESHAPE's
        shape); None while it is not known (not set yet, a model input, the output of
        another operation, a tensor too large to be copied): checks that need it are then
        skipped here and made at ``finish`` / compilation, or at execution."""
        return self._constants[index] if index < len(self._constants) else None

    def dim(self, index: int, axis: int, *, output: bool = False) -> int:
        """Dimension ``axis`` of input (or output) ``index``; 0 when unknown (unspecified
        rank or dimension), so that callers compare only what is known."""
        dims = (self.outputs if output else self.inputs)[index].dimensions
        return dims[axis] if -len(dims) <= axis < len(dims) else 0

    def check_dims_agree(self, what: str, first: int, second: int) -> None:
        """BAD_DATA when two known dimensions differ (0 means unknown and passes)."""
        if first and second and first != second:
            self.fail(f"{what}: {first} != {second}")

    # --- failing -----------------------------------------------------------------
    def fail(self, message: str) -> None:
        raise BadDataError(f"add_operation({self.code.name}): {message}")

    def require(self, condition: bool, message: str) -> None:
        if not condition:
            self.fail(message)

    # --- counts and types ------------------------------------------------------------
    def check_counts(self, inputs: int | Iterable[int], outputs: int | Iterable[int]) -> None:
        """Input/output counts; each may be one number or the allowed numbers."""
        allowed_in = {inputs} if isinstance(inputs, int) else set(inputs)
        allowed_out = {outputs} if isinstance(outputs, int) else set(outputs)
        if len(self.inputs) not in allowed_in:
            self.fail(f"expected {_one_of(allowed_in)} inputs, got {len(self.inputs)}")
        if len(self.outputs) not in allowed_out:
            self.fail(f"expected {_one_of(allowed_out)} outputs, got {len(self.outputs)}")

    def check_input_type(self, index: int, allowed: OperandCode | Iterable[OperandCode]) -> None:
        self._check_type("input", index, self.inputs[index].type, allowed)

    def check_output_type(self, index: int, allowed: OperandCode | Iterable[OperandCode]) -> None:
        self._check_type("output", index, self.outputs[index].type, allowed)

    def check_input_types(self, allowed: Sequence[OperandCode | Iterable[OperandCode]], start: int = 0) -> None:
        for offset, kinds in enumerate(allowed):
            if start + offset < len(self.inputs):
                self.check_input_type(start + offset, kinds)

    def check_output_types(self, allowed: Sequence[OperandCode | Iterable[OperandCode]]) -> None:
        for index, kinds in enumerate(allowed):
            self.check_output_type(index, kinds)

    def _check_type(self, kind: str, index: int, actual: OperandCode, allowed) -> None:
        allowed_set = {allowed} if isinstance(allowed, OperandCode | int) else set(allowed)
        if actual not in allowed_set:
            names = " or ".join(sorted(OperandCode(a).name for a in allowed_set))
            self.fail(f"{kind} {index} must be {names}, got {actual.name}")

    def check_input_rank(self, index: int, allowed: int | Iterable[int]) -> None:
        """Rank of an input, when known (an unspecified rank passes)."""
        rank = self.inputs[index].rank
        allowed_set = {allowed} if isinstance(allowed, int) else set(allowed)
        if rank and rank not in allowed_set:
            self.fail(f"input {index} must have rank {_one_of(allowed_set)}, got {rank}")

    def check_input_max_rank(self, index: int, max_rank: int) -> None:
        rank = self.inputs[index].rank
        if rank > max_rank:
            self.fail(f"input {index} must have rank at most {max_rank}, got {rank}")

    def check_same_quantization(self, first: tuple[str, int], second: tuple[str, int]) -> None:
        a, b = self._get(first), self._get(second)
        if (a.scale, a.zero_point) != (b.scale, b.zero_point):
            self.fail(f"{first[0]} {first[1]} and {second[0]} {second[1]} must have the same scale and "
                      f"zero point, got ({a.scale}, {a.zero_point}) and ({b.scale}, {b.zero_point})")

    def _get(self, which: tuple[str, int]) -> OperandType:
        kind, index = which
        return (self.inputs if kind == "input" else self.outputs)[index]

    def input_type(self, index: int) -> OperandCode:
        return self.inputs[index].type


class RunTimeValue:
    """The value of an operand computed at run time: any use of it (reading an element,
    its shape, converting it) raises, so an output shape that needs it is not inferred."""

    def __getattr__(self, name: str):
        raise NeedsRunTimeValue(name)

    def __array__(self, *args, **kwargs):
        raise NeedsRunTimeValue("__array__")

    def __len__(self) -> int:
        raise NeedsRunTimeValue("__len__")

    def __iter__(self):
        raise NeedsRunTimeValue("__iter__")

    def __getitem__(self, key):
        raise NeedsRunTimeValue("__getitem__")

    def __bool__(self) -> bool:
        raise NeedsRunTimeValue("__bool__")

    def __int__(self) -> int:
        raise NeedsRunTimeValue("__int__")

    def __float__(self) -> float:
        raise NeedsRunTimeValue("__float__")

    def __index__(self) -> int:
        raise NeedsRunTimeValue("__index__")


class NeedsRunTimeValue(Exception):
    """An output shape needs a value known only at run time."""


class ExecutionContext:
    """What ``prepare`` and ``execute`` see: the input tensors and the declared outputs."""

    def __init__(
        self,
        code: OperationCode,
        inputs: Sequence[Tensor],
        outputs: Sequence[OperandType],
        relaxed: bool = False,
        run_subgraph: Callable[[Any, list[Tensor]], list[Tensor]] | None = None,
        check_deadline: Callable[[], None] | None = None,
        loop_timeout_ns: int | None = None,
    ):
        self.code = code
        self.inputs = list(inputs)
        #: the output operands as declared in the model (dimensions may hold 0s)
        self.outputs = list(outputs)
        #: the model allows float32 to be computed with float16 range and precision
        self.relaxed = relaxed
        self._run_subgraph = run_subgraph
        self._check_deadline = check_deadline
        self.loop_timeout_ns = loop_timeout_ns
        #: results ``prepare`` computed that ``execute`` reuses (for operations whose output
        #: shapes are only known by computing, e.g. NMS); one context serves one operation run
        self.scratch: dict[str, Any] = {}

    def fail(self, message: str) -> None:
        raise OperationFailed(f"{self.code.name}: {message}")

    def require(self, condition: bool, message: str) -> None:
        if not condition:
            self.fail(message)

    def input(self, index: int) -> Tensor:
        return self.inputs[index]

    def value(self, index: int) -> Any:
        return self.inputs[index].value

    def values(self) -> list[Any]:
        """Every input's value, as a plan's kernel receives them (``execute`` running its
        operation's kernel)."""
        return [tensor.value for tensor in self.inputs]

    def scalar(self, index: int) -> Any:
        """The Python value of scalar input ``index``."""
        return self.inputs[index].item()

    def is_omitted(self, index: int) -> bool:
        return index >= len(self.inputs) or self.inputs[index].is_omitted

    def output(self, index: int) -> OperandType:
        return self.outputs[index]

    def output_dtype(self, index: int) -> np.dtype:
        return dtype_of(self.outputs[index].type)

    def run_subgraph(self, subgraph: Any, inputs: list[Tensor]) -> list[Tensor]:
        """Run a referenced model (the value of a MODEL operand) for IF / WHILE."""
        if self._run_subgraph is None:
            self.fail("control flow is not available here")
        return self._run_subgraph(subgraph, inputs)  # type: ignore[misc]

    def check_deadline(self) -> None:
        """Raise if the execution's deadline passed (long operations call this, per block;
        helpers without a context call the module's ``check_deadline``)."""
        if self._check_deadline is not None:
            self._check_deadline()


class _Unknown(Exception):
    """Shape inference at validation needs something the declared model does not say."""


class _DeclaredTensor(Tensor):
    """A tensor input at validation: its declared type and (fully specified) shape, no value."""

    @property  # type: ignore[override]
    def value(self) -> Any:
        raise _Unknown

    @value.setter
    def value(self, _: Any) -> None:
        pass


class _DeclaredInputs(list):
    """The inputs at validation: known ones read as usual, unknown ones (None) stop the inference."""

    def __getitem__(self, key: Any) -> Any:
        item = super().__getitem__(key)
        if item is None or (isinstance(item, list) and None in item):
            raise _Unknown
        return item

    def __iter__(self) -> Iterator[Any]:
        return (self[i] for i in range(len(self)))


class _DeclaredContext(ExecutionContext):
    """``prepare``'s view of an operation at add_operation: tensors with their declared
    shapes, scalars and small tensors with their constant values; reading anything else
    (other tensors' values, an unknown dimension, a scalar not set yet, whether an operand
    is omitted)
    stops the inference (``_Unknown``), and the shapes are checked at execution instead."""

    def __init__(self, ctx: ValidationContext):
        inputs: list[Tensor | None] = []
        for index, t in enumerate(ctx.inputs):
            constant = ctx.constant(index)
            if not t.is_tensor:
                inputs.append(None if constant is None else Tensor(
                    t.type, (), t.scale, t.zero_point, None, np.asarray(constant, dtype_of(t.type))))
            elif isinstance(constant, np.ndarray):
                inputs.append(Tensor(t.type, constant.shape, t.scale, t.zero_point, t.channel_quant, constant))
            elif t.dimensions and 0 not in t.dimensions:
                inputs.append(_DeclaredTensor(t.type, tuple(t.dimensions), t.scale, t.zero_point, t.channel_quant,
                                              None))
            else:
                inputs.append(None)
        super().__init__(ctx.code, [], ctx.outputs)
        self.inputs = self._declared = _DeclaredInputs(inputs)
        self._validation = ctx

    def fail(self, message: str) -> None:
        self._validation.fail(message)

    def input(self, index: int) -> Tensor:
        return self._declared[index]

    def value(self, index: int) -> Any:
        return self.input(index).value

    def scalar(self, index: int) -> Any:
        return self.input(index).item()

    def is_omitted(self, index: int) -> bool:
        if index >= len(self._declared):
            return True
        known = list.__getitem__(self._declared, index)
        if known is not None and not isinstance(known, _DeclaredTensor):
            return False  # a constant scalar that is set
        raise _Unknown

    def run_subgraph(self, subgraph: Any, inputs: list[Tensor]) -> list[Tensor]:
        raise _Unknown


def check_declared_shapes(operation: Operation, ctx: ValidationContext) -> None:
    """Run ``operation.prepare`` on the declared shapes and constant scalars: what it
    refuses, and outputs declared with other dimensions than it infers, are BAD_DATA at
    add_operation (Android finds them only at execution). Skipped when ``prepare`` needs
    anything the declaration does not say."""
    try:
        declared_ctx = _DeclaredContext(ctx)
        shapes = operation.prepare(declared_ctx)
    except (_Unknown, OperationFailed):
        return
    except NnapiError:
        raise
    except Exception:  # prepare not written for declared shapes: the execution checks them
        return
    if len(shapes) != len(ctx.outputs):
        return
    for position, (shape, declared) in enumerate(zip(shapes, ctx.outputs, strict=True)):
        dims = tuple(declared.dimensions)
        if not dims:
            continue
        shape = tuple(int(d) for d in shape)
        if len(dims) != len(shape) or any(d and d != s for d, s in zip(dims, shape, strict=True)):
            ctx.fail(f"output {position} is declared {list(dims)}, but the inputs give {list(shape)}")
    # what the same prepare gives on tensors of these shapes and constants of these values
    # (not where it kept results for its execute: those depend on more than shapes)
    if not declared_ctx.scratch:
        try:
            ctx.inferred_shapes = [tuple(int(d) for d in shape) for shape in shapes]
        except (TypeError, ValueError):
            pass


class _Same:
    """An object in a signature key by identity (hashed by id, equal only to itself; the
    key holds the object, so its id stays its own): per-channel parameters, whose
    thousand scales would cost more to hash than the check they spare."""

    __slots__ = ("item",)

    def __init__(self, item: Any) -> None:
        self.item = item

    def __hash__(self) -> int:
        return id(self.item)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Same) and other.item is self.item


def operand_key(code: Any, dimensions: Sequence[int], scale: float, zero_point: int, channel_quant: Any,
                value: bytes | None) -> tuple:
    """One operand of a ``signature_key``: its type's fields as given, and the bytes of
    its value where ``ValidationContext.constant`` reads one (a small constant), else None."""
    return (code, tuple(dimensions), scale, zero_point, None if channel_quant is None else _Same(channel_quant),
            value)


#: the signatures ``check_signature`` accepted in this process (``accepted_signature``)
_ACCEPTED: dict[tuple, tuple[FeatureLevelCode, list[Shape] | None]] = {}
#: how many it keeps (then it starts afresh)
_ACCEPTED_LIMIT = 4096


def signature_key(code: Any, inputs: Sequence[tuple], outputs: Sequence[tuple]) -> tuple:
    """The key of an operation's signature: its code and each operand's ``operand_key``,
    everything ``check_signature`` reads (an operation with a MODEL input has none: its
    referenced model's signature is not in the key)."""
    return (code, tuple(inputs), tuple(outputs))


def accepted_signature(key: tuple | None) -> tuple[FeatureLevelCode, list[Shape] | None] | None:
    """(feature level, inferred output shapes) of a signature ``check_signature``
    accepted before in this process (``remember_accepted``), or None. A signature is
    checked when its operation is added to a Model, and again by nnapi-reference when it
    vets the HAL model of each compilation: the same pure function of the same operand
    types and constants, whose answer is reused. Refusals are not kept (their messages
    name the call that made them)."""
    if key is None:
        return None
    try:
        known = _ACCEPTED.get(key)
    except TypeError:  # an unhashable field (a malformed HAL operand): checked as usual
        return None
    if known is None:
        return None
    level, shapes = known
    return level, None if shapes is None else list(shapes)


def remember_accepted(key: tuple | None, ctx: ValidationContext) -> None:
    """Keep what ``check_signature`` found for an accepted signature (``accepted_signature``)."""
    if key is None:
        return
    if len(_ACCEPTED) >= _ACCEPTED_LIMIT:
        _ACCEPTED.clear()
    shapes = ctx.inferred_shapes
    try:
        _ACCEPTED[key] = (ctx.feature_level, None if shapes is None else list(shapes))
    except TypeError:
        pass


class Operation:
    """Base of every operation; subclasses implement validate, prepare and execute."""

    code: OperationCode
    #: inputs may have a zero dimension (Android's allowZeroSizedInput); set by ``register``
    zero_sized_inputs: bool = False
    #: inputs may be omitted (NO_VALUE; Android's allowOmittedOperand); set by ``register``
    omitted_operands: bool = False
    #: ``plan`` is also called when optional inputs are omitted (their values are None):
    #: for operations whose plan checks which are present (the LSTMs)
    plan_sees_omitted: bool = False

    def __init__(self, code: OperationCode) -> None:
        self.code = code

    def check_inputs(self, ctx: ExecutionContext) -> None:
        """The registration flags, which the driver enforces before ``prepare``: an omitted
        input the operation does not accept is BAD_DATA (a missing parameter, as Android's
        CPU executor reports it), a zero-sized one OP_FAILED."""
        for index, tensor in enumerate(ctx.inputs):
            if tensor.value is None:
                if not self.omitted_operands:
                    raise BadDataError(f"{self.code.name}: input {index} omitted, but the operation does not "
                                       "accept omitted inputs")
            elif not self.zero_sized_inputs and tensor.shape and 0 in tensor.shape:  # shapes only: static
                ctx.fail(f"input {index} is zero-sized (shape {list(tensor.shape)}), which {self.code.name} "
                         "does not support")

    @property
    def name(self) -> str:
        return self.code.name

    def validate(self, ctx: ValidationContext) -> None:
        raise NotImplementedError

    def check_signature(self, ctx: ValidationContext) -> FeatureLevelCode:
        """``validate``, then the minimum feature level of the signature it accepted (as
        Android's validate functions return a version)."""
        self.validate(ctx)
        check_declared_shapes(self, ctx)
        return ctx.feature_level

    def prepare(self, ctx: ExecutionContext) -> list[Shape]:
        raise NotImplementedError

    def execute(self, ctx: ExecutionContext) -> list[np.ndarray]:
        raise NotImplementedError

    def plan(self, ctx: ExecutionContext) -> Callable[[list[Any]], list[np.ndarray]] | None:
        """Optional: a kernel prepared once for this operation's static shapes and constants.

        The driver calls it at preparation, after ``prepare`` succeeded on ``ctx`` whose
        constant inputs hold their values and whose other inputs hold their (static) shapes
        but no readable value. The returned callable maps the input values (numpy arrays, in
        input order) to the output arrays, exactly as ``execute`` would, having precomputed
        everything that depends only on shapes and constants. None: use ``execute``.
        """
        return None

    def plan_dynamic(self, ctx: ExecutionContext) -> Callable[[list[Any]], list[np.ndarray]] | None:
        """Optional: a kernel for this operation where its output shapes are known only at
        execution (a loop body's SLICE at the loop's index), so that ``prepare`` and
        ``execute`` need not run per call.

        ``ctx`` holds the constant inputs' values and the other inputs' types, with their
        shapes where the preparation knows them (else as declared) and no readable value.
        The returned callable maps the input values to the output arrays as ``prepare``
        then ``execute`` would; where ``prepare`` would fail it must raise (any exception:
        the driver then runs ``prepare`` and ``execute`` on the same values, which report
        the failure as they always do). None: ``prepare`` and ``execute`` per call.
        """
        return None


_REGISTRY: dict[OperationCode, Operation] = {}


def register(*codes: OperationCode, zero_sized_inputs: bool | Iterable[OperationCode] = False,
             omitted_operands: bool | Iterable[OperationCode] = False,
             ) -> Callable[[type[Operation]], type[Operation]]:
    """Class decorator: register one instance of the class per operation code.

    ``zero_sized_inputs`` / ``omitted_operands`` (True, or the codes among ``codes`` they
    apply to) are Android's allowZeroSizedInput / allowOmittedOperand: without them the
    driver refuses an input with a zero dimension (OP_FAILED) or an omitted input
    (BAD_DATA) before ``prepare`` runs."""

    def applies(flag: bool | Iterable[OperationCode], code: OperationCode) -> bool:
        return flag if isinstance(flag, bool) else code in set(flag)

    def decorate(cls: type[Operation]) -> type[Operation]:
        for code in codes:
            if code in _REGISTRY:
                raise RuntimeError(f"operation {code.name} registered twice")
            operation = cls(OperationCode(code))
            operation.zero_sized_inputs = applies(zero_sized_inputs, code)
            operation.omitted_operands = applies(omitted_operands, code)
            _REGISTRY[OperationCode(code)] = operation
        return cls

    return decorate


def registry() -> dict[OperationCode, Operation]:
    return _REGISTRY


def _one_of(values: set[int]) -> str:
    ordered = sorted(values)
    return str(ordered[0]) if len(ordered) == 1 else " or ".join(map(str, ordered))
