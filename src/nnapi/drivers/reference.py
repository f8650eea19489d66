"""The reference CPU driver, ``nnapi-reference``: runs every operation of a HAL model with
the operation registry's numpy kernels, exactly as the specification defines them."""

from __future__ import annotations

import contextvars
import math
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from nnapi import tracing
from nnapi._version import __version__
from nnapi.codes import DeviceTypeCode, FeatureLevelCode, OperationCode, ResultCode
from nnapi.drivers import device_memory
from nnapi.drivers._pages import keep_pages
from nnapi.errors import NnapiError
from nnapi.hal import (
    BufferToken,
    Capabilities,
    ErrorStatus,
    ExecutionPreference,
    HalError,
    IDevice,
    IExecution,
    IPreparedModel,
    Model,
    OperandLifeTime,
    OutputShape,
    PerformanceInfo,
    Priority,
    Request,
    Subgraph,
    Timing,
)
from nnapi.hal.types import constant_array, is_extension_type, operation_name
from nnapi.hal.validation import validate_model, validate_request
from nnapi.operand import MAX_OPERAND_BYTES, TENSOR_TYPES, constant_value, dtype_of
from nnapi.operations import ExecutionContext, OperationFailed, Tensor, ValidationContext, _jit, get_operation
from nnapi.operations.base import (
    Operation,
    Shape,
    SubgraphSignature,
    accepted_signature,
    check_deadline,
    current_deadline_check,
    deadline_checked,
    operand_key,
    remember_accepted,
    signature_key,
)
from nnapi.operations.control_flow import (
    IF_CONDITION,
    IF_ELSE_MODEL,
    IF_FIRST_INPUT,
    IF_THEN_MODEL,
    WHILE_BODY_MODEL,
    WHILE_CONDITION_MODEL,
    WHILE_FIRST_VALUE,
    run_loop,
    truth,
)

L = OperandLifeTime
#: the running execution's loop timeout (None: the default), for the WHILE kernels of a
#: program, which run on bare arrays without the execution's context
_LOOP_TIMEOUT_NS: contextvars.ContextVar[int | None] = contextvars.ContextVar("nnapi_loop_timeout_ns",
                                                                               default=None)
_RESULT_TO_STATUS = {
    # result codes an operation or the driver may raise, as the HAL status that carries them
    ResultCode.BAD_DATA: ErrorStatus.INVALID_ARGUMENT,
    ResultCode.OUTPUT_INSUFFICIENT_SIZE: ErrorStatus.OUTPUT_INSUFFICIENT_SIZE,
    ResultCode.MISSED_DEADLINE_TRANSIENT: ErrorStatus.MISSED_DEADLINE_TRANSIENT,
    ResultCode.MISSED_DEADLINE_PERSISTENT: ErrorStatus.MISSED_DEADLINE_PERSISTENT,
    ResultCode.RESOURCE_EXHAUSTED_TRANSIENT: ErrorStatus.RESOURCE_EXHAUSTED_TRANSIENT,
    ResultCode.RESOURCE_EXHAUSTED_PERSISTENT: ErrorStatus.RESOURCE_EXHAUSTED_PERSISTENT,
}


@dataclass(frozen=True)
class SubgraphRef:
    """The value of a MODEL operand: which referenced subgraph it names."""

    index: int


def supports_operation(model: Model, subgraph: Subgraph, operation) -> bool:
    """True if the registry implements ``operation`` with these operand types."""
    return unsupported_reason(model, subgraph, operation) is None


def unsupported_reason(model: Model, subgraph: Subgraph, operation) -> str | None:
    """None if the registry implements ``operation`` with these operand types, else the
    validation message that says why not."""
    return vet_operation(model, subgraph, operation)[0]


def vet_operation(model: Model, subgraph: Subgraph, operation) -> tuple[str | None, list[Shape] | None]:
    """``unsupported_reason`` of ``operation``, and the output shapes its validation
    inferred from the declared shapes and constants (``check_declared_shapes``; None where
    it inferred none), which the plan of this model takes instead of preparing again."""
    if is_extension_type(operation.type):
        return f"extension operation {int(operation.type):#x}: nnapi-reference supports no extensions", None
    implementation = get_operation(operation.type)
    if implementation is None:
        return f"{operation_name(operation.type)} is not implemented", None
    # A constant set to no value where the operation needs one: refused at compilation.
    if not getattr(implementation, "omitted_operands", True) and any(
            subgraph.operands[i].lifetime == L.NO_VALUE for i in operation.inputs):
        return f"{operation_name(operation.type)}: an input is omitted, which the operation does not allow", None

    # the same signature accepted before in this process (at add_operation, or in another
    # compilation): its answer, without building the context again
    key = _signature_key(model, subgraph, operation)
    known = accepted_signature(key)
    if known is not None:
        return None, known[1]

    def signature(index: int) -> SubgraphSignature | None:
        operand = subgraph.operands[index]
        if operand.lifetime != L.SUBGRAPH:
            return None
        target = model.referenced[operand.location.offset]
        return SubgraphSignature(tuple(target.operands[i].operand_type() for i in target.input_indexes),
                                 tuple(target.operands[i].operand_type() for i in target.output_indexes))

    def constant(index: int) -> int | float | bool | None:
        operand = subgraph.operands[index]
        if operand.lifetime != L.CONSTANT_COPY:
            return None
        start = operand.location.offset
        return constant_value(operand.operand_type(), model.operand_values[start: start + operand.location.length])

    context = ValidationContext(OperationCode(operation.type),
                                [subgraph.operands[i].operand_type() for i in operation.inputs],
                                [subgraph.operands[i].operand_type() for i in operation.outputs],
                                [signature(i) for i in operation.inputs],
                                [constant(i) for i in operation.inputs])
    try:
        implementation.check_signature(context)
    except NnapiError as error:
        return str(error), None
    except Exception as error:  # a validator's own bug must not break the query
        return f"validation failed: {type(error).__name__}: {error}", None
    remember_accepted(key, context)
    return None, context.inferred_shapes


def _signature_key(model: Model, subgraph: Subgraph, operation) -> tuple | None:
    """``signature_key`` of a HAL operation (None where it has a MODEL input, or a field
    the key cannot hold: then it is checked as usual)."""
    operands, values = subgraph.operands, model.operand_values

    def key(index: int) -> tuple:
        operand = operands[index]
        lifetime = operand.lifetime
        if lifetime == L.SUBGRAPH:
            raise LookupError
        value = None
        if lifetime == L.CONSTANT_COPY:
            location = operand.location
            value = values[location.offset: location.offset + location.length]
        return operand_key(operand.type, operand.dimensions, operand.scale, operand.zero_point,
                           operand.channel_quant, value)

    try:
        return signature_key(operation.type, [key(i) for i in operation.inputs], [key(i) for i in operation.outputs])
    except Exception:  # noqa: BLE001 - a malformed operand: the usual checks report it
        return None


class _Vetted:
    """What this device learned of one HAL model object: whether it passed validate_model,
    and per subgraph (0 = main) each operation's unsupported_reason and the output shapes
    its validation inferred (``vet_operation``)."""

    __slots__ = ("reasons", "shapes", "valid")

    def __init__(self) -> None:
        self.valid = False
        self.reasons: dict[int, list[str | None]] = {}
        self.shapes: dict[int, list[list[Shape] | None]] = {}


class ReferenceDevice(IDevice):
    """The always-present CPU device."""

    name = "nnapi-reference"
    version_string = __version__
    device_type = DeviceTypeCode.DEVICE_CPU
    feature_level = FeatureLevelCode.FEATURE_LEVEL_8

    def __init__(self) -> None:
        #: this device's live device memories (IDevice.allocate), by token
        self._buffers = device_memory.BufferTracker()
        #: by id of a live HAL model object: what was learned of it (``_vetted``)
        self._vetted: dict[int, _Vetted] = {}
        # The compiled kernels (nnapi[fast]: numba, ~130 ms to import) are this driver's
        # library: loaded when the device starts, as a driver service loads its libraries,
        # so that no preparation pays numba's start-up, nor the loading of the kernels of
        # quantized convolution models (``_jit.load_library``); other kernels load at the
        # first preparation that binds them.
        _jit.load_library()

    def _vetting(self, model: Model) -> _Vetted:
        """This device's record of ``model`` (the object: the runtime asks which operations
        are supported, then prepares, with the one HAL model it built for a finished Model
        and never changes, and a later compilation of that Model hands over the same
        object), so that neither validation nor the per-operation checks run twice. A
        HAL model from elsewhere (a copy, a service's decoded one) is a new object."""
        key = id(model)
        vetted = self._vetted.get(key)
        if vetted is None:
            vetted = _Vetted()
            try:
                weakref.finalize(model, self._vetted.pop, key, None)
            except TypeError:  # an object that cannot be referenced weakly: not remembered
                return vetted
            self._vetted[key] = vetted
        return vetted

    def _reasons(self, model: Model, number: int, vetted: _Vetted | None = None) -> list[str | None]:
        """unsupported_reason of every operation of subgraph ``number`` (0 = main), kept
        in ``vetted`` (by default this device's record of ``model``) with the shapes."""
        if vetted is None:
            vetted = self._vetting(model)
        reasons = vetted.reasons.get(number)
        if reasons is None:
            subgraph = model.main if number == 0 else model.referenced[number - 1]
            answers = [vet_operation(model, subgraph, operation) for operation in subgraph.operations]
            vetted.shapes[number] = [shapes for _, shapes in answers]
            reasons = vetted.reasons[number] = [reason for reason, _ in answers]
        return reasons

    def get_capabilities(self) -> Capabilities:
        # The reference is the unit the other devices' figures are relative to.
        return Capabilities.uniform(PerformanceInfo(1.0, 1.0))

    def get_supported_operations(self, model: Model) -> list[bool]:
        return [reason is None for reason in self._reasons(model, 0)]

    def get_unsupported_reasons(self, model: Model) -> list[str | None]:
        return list(self._reasons(model, 0))

    def prepare_model(self, model: Model, preference=ExecutionPreference.FAST_SINGLE_ANSWER,
                      priority=Priority.MEDIUM, deadline_ns=None, model_cache=(), data_cache=(),
                      token=None) -> IPreparedModel:
        vetted = self._vetting(model)
        if not vetted.valid:
            validate_model(model)
            vetted.valid = True
        if deadline_ns is not None and time.monotonic_ns() > deadline_ns:
            raise HalError(ErrorStatus.MISSED_DEADLINE_TRANSIENT, "deadline passed before preparation")
        for number in range(1 + len(model.referenced)):
            for position, reason in enumerate(self._reasons(model, number, vetted)):
                if reason is not None:  # named: which operation, and the validation's reason
                    name = "main" if number == 0 else f"referenced[{number - 1}]"
                    raise HalError(ErrorStatus.INVALID_ARGUMENT, f"{name} operation {position}: {reason}")
        with np.errstate(all="ignore"):  # tables and layouts computed at preparation
            prepared = ReferencePreparedModel(model, self._buffers, vetted.shapes)
        if token is not None and len(model_cache) == 1 and len(data_cache) == 1:
            self._write_cache(model, model_cache[0], data_cache[0], token)
        return prepared

    # --- compilation caching: the validated model, checksummed and recorded (see cache_format) ---
    def get_number_of_cache_files_needed(self) -> tuple[int, int]:
        return (1, 1)

    def _write_cache(self, model: Model, model_fd: int, data_fd: int, token: bytes) -> None:
        from nnapi.drivers.cache_format import pack, record
        from nnapi.hal.interfaces import write_fd

        model_bytes, data_bytes = pack(model, token)
        try:
            write_fd(data_fd, data_bytes)
            write_fd(model_fd, model_bytes)
        except OSError:
            return  # a cache that cannot be written is no cache; the preparation stands
        record(self.name, model_bytes, token)  # what prepare_model_from_cache will require

    def prepare_model_from_cache(self, model_cache, data_cache, token, deadline_ns=None) -> IPreparedModel:
        from nnapi.drivers.cache_format import unpack
        from nnapi.hal.interfaces import read_fd

        if len(model_cache) != 1 or len(data_cache) != 1 or token is None:
            raise HalError(ErrorStatus.INVALID_ARGUMENT, "expected one model and one data cache file and a token")
        try:
            model_bytes, data_bytes = read_fd(model_cache[0]), read_fd(data_cache[0])
        except (OSError, TypeError, ValueError) as error:
            raise HalError(ErrorStatus.GENERAL_FAILURE, f"cannot read the cache: {error}") from None
        model = unpack(model_bytes, data_bytes, token, recorded_by=self.name)
        return self.prepare_model(model, deadline_ns=deadline_ns)

    def allocate(self, desc, prepared_models, input_roles, output_roles):
        """IDevice::allocate: device memory for roles of this device's prepared models
        (fully specified dimensions only); see drivers.device_memory."""
        return device_memory.allocate(self._buffers, self._model_of, desc, prepared_models, input_roles,
                                      output_roles)

    def _model_of(self, prepared) -> Model | None:
        if isinstance(prepared, ReferencePreparedModel) and prepared._buffers is self._buffers:
            return prepared.model
        return None


class ReferencePreparedModel(IPreparedModel):
    """A model prepared as one execution plan per subgraph (see ``_SubgraphPlan``)."""

    answers_checked = True  # the runtime's own driver (see IPreparedModel.answers_checked)

    def __init__(self, model: Model, buffers: device_memory.BufferTracker | None = None,
                 inferred: dict[int, list[list[Shape] | None]] | None = None) -> None:
        """``inferred``: per subgraph number, each operation's output shapes as the
        device's validation of this same ``model`` inferred them (``vet_operation``),
        which the plans take instead of running ``prepare`` again."""
        self.model = model
        #: the device memories requests may name by token (None: the device allocates none)
        self._buffers = buffers
        self._relaxed = model.relax_computation_float32_to_float16
        self._inferred = inferred or {}
        # a plan prepares the plans of the subgraphs its IF / WHILE run first (``plan``)
        self._plans: list[_SubgraphPlan | None] = [None] * (1 + len(model.referenced))
        self._plans = [self.plan(number) for number in range(len(self._plans))]
        # the intermediates' pages stay in the process between executions (_pages)
        keep_pages(sum(plan.intermediate_bytes() for plan in self._plans))
        main = model.main
        # per model input: (operand, dtype, declared dims, whether the declared dims are complete)
        self._input_info = []
        for index in main.input_indexes:
            operand = main.operands[index]
            dims = tuple(operand.dimensions)
            self._input_info.append((operand, dtype_of(operand.type), dims,
                                     operand.type not in TENSOR_TYPES or (bool(dims) and 0 not in dims)))

    def plan(self, number: int) -> _SubgraphPlan:
        """The plan of subgraph ``number`` (0 = main, k = referenced[k-1]), prepared on
        first use (referenced subgraphs form no cycle: validate_model refuses them)."""
        plan = self._plans[number]
        if plan is None:
            subgraph = self.model.main if number == 0 else self.model.referenced[number - 1]
            plan = self._plans[number] = _SubgraphPlan(self.model, subgraph, self._relaxed, owner=self,
                                                       inferred=self._inferred.get(number))
        return plan

    def execute(self, request: Request, measure_timing: bool = False, deadline_ns: int | None = None,
                loop_timeout_ns: int | None = None) -> tuple[list[OutputShape], Timing]:
        for pool in request.pools:
            if isinstance(pool, BufferToken):
                return self._execute_device_memory(request, measure_timing, deadline_ns, loop_timeout_ns)
        start = time.monotonic_ns()
        validate_request(request, self.model)
        return self._compute(request, None, measure_timing, deadline_ns, loop_timeout_ns, start)

    def create_reusable_execution(self, request: Request, measure_timing: bool = False,
                                  loop_timeout_ns: int | None = None) -> IExecution:
        if any(isinstance(pool, BufferToken) for pool in request.pools):
            # device memory is resolved (and its state checked) at every computation
            return super().create_reusable_execution(request, measure_timing, loop_timeout_ns)
        return _ReusableExecution(self, request, measure_timing, loop_timeout_ns)

    def _compute(self, request: Request, inputs: list[Tensor] | None, measure_timing: bool,
                 deadline_ns: int | None, loop_timeout_ns: int | None, start: int,
                 bound: _ReusableExecution | None = None) -> tuple[list[OutputShape], Timing]:
        """Run a validated request (its inputs read from the pools unless given; its
        outputs written by ``bound`` when the request is bound)."""
        run = _Run(self, deadline_ns, loop_timeout_ns)

        def compute() -> list[Tensor]:
            nonlocal inputs
            if inputs is None:
                inputs = [self._read_input(request, position) for position in range(len(self._input_info))]
            if deadline_ns is None and current_deadline_check() is None:
                return run.subgraph(0, inputs)  # nothing for kernels to check
            with deadline_checked(run.check_deadline):
                return run.subgraph(0, inputs)

        outputs = _contained(compute)
        shapes = self._write_outputs(request, outputs) if bound is None else bound.write_outputs(outputs)
        if not measure_timing:
            return shapes, Timing()
        elapsed = time.monotonic_ns() - start
        return shapes, Timing(elapsed, elapsed)

    def _execute_device_memory(self, request: Request, measure_timing: bool, deadline_ns: int | None,
                               loop_timeout_ns: int | None) -> tuple[list[OutputShape], Timing]:
        """A request naming device memory by token: checked against the buffers' roles and
        state, run on their bytes, and the output buffers marked written (or not)."""
        resolved = device_memory.ResolvedRequest(self._buffers, self, request)
        try:
            shapes, timing = self.execute(resolved.request, measure_timing, deadline_ns, loop_timeout_ns)
        except HalError as error:
            raise resolved.failed(error) from None
        resolved.succeeded(shapes)
        return shapes, timing

    def _read_input(self, request: Request, position: int) -> Tensor:
        operand, dtype, declared, complete = self._input_info[position]
        argument = request.inputs[position]
        if argument.has_no_value:
            return _tensor(operand, declared, None)
        if complete:
            dims = declared
        else:
            dims = tuple(argument.dimensions or declared)
            # a 0 the request gives is a zero-sized tensor (a step of a split plan passes
            # those on); one left from the model's declaration is an unspecified dimension
            if operand.type in TENSOR_TYPES and (not dims or (0 in dims and not argument.dimensions)):
                raise HalError(ErrorStatus.INVALID_ARGUMENT, f"input {position} has unspecified dimensions")
        count = math.prod(dims)
        location = argument.location
        if location.length < count * dtype.itemsize:
            raise HalError(ErrorStatus.INVALID_ARGUMENT, f"input {position} buffer is too small")
        array = np.frombuffer(request.pools[location.pool_index], dtype=dtype, count=count,
                              offset=location.offset).reshape(dims)
        return _tensor(operand, dims, array)

    def _write_outputs(self, request: Request, outputs: list[Tensor]) -> list[OutputShape]:
        shapes: list[OutputShape] = []
        for position, tensor in enumerate(outputs):
            argument = request.outputs[position]
            needed = tensor.value.nbytes if tensor.value is not None else 0
            sufficient = argument.has_no_value or argument.location.length >= needed
            shapes.append(OutputShape(list(tensor.shape), sufficient))
        if not all(shape.is_sufficient for shape in shapes):
            raise HalError(ErrorStatus.OUTPUT_INSUFFICIENT_SIZE, "an output buffer is too small", shapes)
        for position, tensor in enumerate(outputs):
            argument = request.outputs[position]
            value = tensor.value
            if argument.has_no_value or value is None or value.size == 0:
                continue
            target = np.frombuffer(request.pools[argument.location.pool_index], dtype=value.dtype,
                                   count=value.size, offset=argument.location.offset)
            target.reshape(value.shape)[...] = value
        return shapes


class _ReusableExecution(IExecution):
    """A request bound to a prepared model: validated once, its inputs read as views of
    the caller's pools (which stay alive and fixed in size while it is used), so each
    computation only runs the plan and writes the outputs."""

    def __init__(self, prepared: ReferencePreparedModel, request: Request, measure_timing: bool,
                 loop_timeout_ns: int | None) -> None:
        validate_request(request, prepared.model)
        self._prepared = prepared
        self._request = request
        self._measure = measure_timing
        self._loop_timeout_ns = loop_timeout_ns
        self._inputs = [prepared._read_input(request, position) for position in range(len(prepared._input_info))]
        #: the main plan for these inputs when it runs as a program: computations without a
        #: deadline or trace go from the input views straight to the output views
        plan = prepared._plans[0].for_inputs(tuple([(tensor.shape, tensor.value is None) for tensor in self._inputs]))
        self._program = plan if plan is not None and plan.program is not None else None
        self._values = [tensor.value for tensor in self._inputs]
        #: per output, a view of its buffer and the shape reported, once an output of that
        #: shape was written there (then later results of the same shape are copied in)
        self._targets: list[tuple[np.ndarray, OutputShape] | None] | None = None

    def execute(self, deadline_ns: int | None = None) -> tuple[list[OutputShape], Timing]:
        start = time.monotonic_ns()
        plan, targets = self._program, self._targets
        if (plan is not None and targets is not None and deadline_ns is None and not tracing.state.enabled
                and current_deadline_check() is None):
            if plan.control_flow and self._loop_timeout_ns is not None:
                values = _contained(lambda: _looping(self._loop_timeout_ns, _Run.program_arrays, plan, self._values))
            else:
                values = _contained(lambda: _Run.program_arrays(plan, self._values))
            shapes = self._copy_out(values, targets)
            if shapes is not None:
                if not self._measure:
                    return shapes, Timing()
                elapsed = time.monotonic_ns() - start
                return shapes, Timing(elapsed, elapsed)
            outputs = [plan.constants[index] if value is None else _make(
                plan.templates[index], value.shape, value) for index, value in zip(
                plan.subgraph.output_indexes, values, strict=True)]
            shapes = self.write_outputs(outputs)
            if not self._measure:
                return shapes, Timing()
            elapsed = time.monotonic_ns() - start
            return shapes, Timing(elapsed, elapsed)
        return self._prepared._compute(self._request, self._inputs, self._measure, deadline_ns,
                                       self._loop_timeout_ns, start, self)

    @staticmethod
    def _copy_out(values: list, targets: list) -> list[OutputShape] | None:
        """Copy results into the output views kept from an earlier computation; None when
        one differs in shape from what was written there (then outputs are checked again)."""
        shapes = []
        for value, target in zip(values, targets, strict=True):
            if target is None or value is None or value.shape != target[0].shape:
                return None
            np.copyto(target[0], value)
            shapes.append(target[1])
        return shapes

    def write_outputs(self, outputs: list[Tensor]) -> list[OutputShape]:
        if self._targets is not None:
            shapes = self._copy_out([tensor.value for tensor in outputs], self._targets)
            if shapes is not None:
                return shapes
        shapes = self._prepared._write_outputs(self._request, outputs)
        self._targets = [self._target(position, tensor, shape)
                         for position, (tensor, shape) in enumerate(zip(outputs, shapes, strict=True))]
        return list(shapes)

    def _target(self, position: int, tensor: Tensor, shape: OutputShape) -> tuple[np.ndarray, OutputShape] | None:
        argument = self._request.outputs[position]
        value = tensor.value
        if argument.has_no_value or value is None or value.size == 0:
            return None
        target = np.frombuffer(self._request.pools[argument.location.pool_index], dtype=value.dtype,
                               count=value.size, offset=argument.location.offset).reshape(value.shape)
        return target, shape


#: operations never run at preparation even on constant inputs (random, or running models)
_NOT_FOLDED = frozenset({OperationCode.RANDOM_MULTINOMIAL, OperationCode.IF, OperationCode.WHILE})


_CONTROL_FLOW = frozenset({OperationCode.IF, OperationCode.WHILE})


def _executing_kernel(step: _Step, context: ExecutionContext, relaxed: bool) -> Callable[[list[Any]], list]:
    """The kernel of an operation with static shapes but no ``plan`` of its own: its
    ``execute`` on the values of a call, with the output shapes already known (so a plan
    whose operations all have one runs as a program on bare arrays). Long kernels still
    see the running execution's deadline through the module-wide check."""
    implementation, code, declared = step.implementation, step.code, step.declared
    templates = [(tensor.type, tensor.shape, tensor.scale, tensor.zero_point, tensor.channel_quant)
                 for tensor in context.inputs]

    def kernel(values: list[Any]) -> list:
        tensors = [Tensor(*template, value) for template, value in zip(templates, values, strict=True)]
        return _guarded(code, ExecutionContext(code, tensors, declared, relaxed, check_deadline=check_deadline),
                        implementation.execute)

    return kernel


def _inferring_kernel(step: _Step, plan: _SubgraphPlan) -> Callable[[list[Any]], list]:
    """The kernel of an operation whose output shapes are only known at execution (a SLICE
    whose begin is computed, say): its ``prepare`` and ``execute`` on the values of each
    call, with the checks of a step-by-step run, so that the plan still runs as a program
    on bare arrays (a loop body that writes one row of a buffer at the loop's index)."""
    code, implementation, declared, relaxed = step.code, step.implementation, step.declared, plan.relaxed
    operands = plan.subgraph.operands
    slots = [(plan.constants.get(index), plan.templates[index], tuple(operands[index].dimensions))
             for index in step.inputs]

    def kernel(values: list[Any]) -> list:
        arguments = [constant if constant is not None else _make(template, dims if value is None else value.shape,
                                                                 value)
                     for (constant, template, dims), value in zip(slots, values, strict=True)]
        context = ExecutionContext(code, arguments, declared, relaxed, check_deadline=check_deadline)
        shapes = _infer_shapes(step, context)
        return _checked_results(step, _guarded(code, context, implementation.execute), shapes)

    return kernel


def _dynamic_kernel(step: _Step, implementation: Operation, run: Callable[[list[Any]], list],
                    inferring: Callable[[list[Any]], list]) -> Callable[[list[Any]], list]:
    """The kernel of an operation whose output shapes are known only at execution and that
    has a ``plan_dynamic`` kernel (``run``): that kernel, its results checked as the
    inferring kernel checks them. Values the registration flags refuse (an omitted or
    zero-sized input), and any failure of ``run``, go to ``inferring`` (``prepare`` and
    ``execute`` on the same values), which reports them as it always did."""
    refuses_empty = not implementation.zero_sized_inputs

    def kernel(values: list[Any]) -> list:
        if any(value is None or (refuses_empty and not value.size) for value in values):
            return inferring(values)
        try:
            results = run(values)
        except Exception:  # noqa: BLE001 - the general path says what went wrong
            return inferring(values)
        return _checked_results(step, results, None)

    return kernel


class _Callee:
    """A referenced model run by an IF / WHILE kernel on bare arrays: the program of its
    plan for the arrays' shapes (remembered for the next call: a loop's values keep their
    shapes), or step by step where it has none."""

    __slots__ = ("owner", "number", "plan", "last")

    def __init__(self, owner: ReferencePreparedModel, number: int) -> None:
        self.owner, self.number = owner, number
        self.plan = owner.plan(number)
        #: (the input shapes of the last call, their plan when it runs as a program): one
        #: attribute, so that calls in other threads read a consistent pair
        self.last: tuple[tuple | None, _SubgraphPlan | None] = (None, None)

    def __call__(self, arrays: list[Any]) -> list[Any]:
        try:
            key = tuple([(array.shape, False) for array in arrays])
        except AttributeError:  # an omitted value
            key = None
        last_key, plan = self.last
        if key != last_key:
            plan = self.plan.for_inputs(key) if key is not None else None
            if plan is not None and plan.program is None:
                plan = None
            self.last = (key, plan)
        if plan is not None:
            return _Run.program_arrays(plan, arrays)
        subgraph, templates = self.plan.subgraph, self.plan.templates
        tensors = [_make(templates[index], tuple(subgraph.operands[index].dimensions) if array is None
                         else array.shape, array) for index, array in zip(subgraph.input_indexes, arrays, strict=True)]
        run = _Run(self.owner, None, _LOOP_TIMEOUT_NS.get())
        return [tensor.value for tensor in run.subgraph(self.number, tensors)]


def _plan_control_flow(owner: ReferencePreparedModel, step: _Step, inputs: list[Tensor]) -> list[Shape] | None:
    """IF / WHILE in a plan: ``step.kernel`` runs the referenced models through their own
    plans on bare arrays (``_Callee``), as ``control_flow`` defines the operations (the
    same condition test, loop timeout and deadline check). Returns the output shapes when
    the input shapes decide them (a loop whose body gives its values back in their
    shapes; two branches whose outputs have the same known shapes); None when each run
    checks them against the declaration. No kernel (the run uses ``execute``) for an
    omitted value or a model that is not a constant reference."""
    first = WHILE_FIRST_VALUE if step.code == OperationCode.WHILE else IF_FIRST_INPUT
    values = inputs[first:]
    models = [inputs[WHILE_CONDITION_MODEL], inputs[WHILE_BODY_MODEL]] if step.code == OperationCode.WHILE else [
        inputs[IF_THEN_MODEL], inputs[IF_ELSE_MODEL]]
    if any(tensor.value is None for tensor in values) or not all(isinstance(model.value, SubgraphRef)
                                                                 for model in models):
        return None
    key = tuple([(tensor.shape, False) for tensor in values])
    first_callee, second_callee = (_Callee(owner, model.value.index + 1) for model in models)
    count = len(step.outputs)
    if step.code == OperationCode.WHILE:
        body = second_callee.plan.for_inputs(key)
        carried = None if body is None else body.output_shapes()
        static = carried is not None and all(shape == tensor.shape for shape, tensor in zip(carried, values))
        shapes = [tensor.shape for tensor in values[:count]] if static else None
        step.kernel = _while_kernel(step, first_callee, second_callee, shapes is None)
    else:
        branches = [callee.plan.for_inputs(key) for callee in (first_callee, second_callee)]
        outputs = [None if plan is None else plan.output_shapes() for plan in branches]
        static = outputs[0] is not None and outputs[0] == outputs[1] and None not in outputs[0]
        shapes = list(outputs[0]) if static else None
        step.kernel = _if_kernel(step, first_callee, second_callee, shapes is None)
    if shapes is not None and not all(_agrees(shape, declared.dimensions) and _fits(shape, declared)
                                      for shape, declared in zip(shapes, step.declared, strict=True)):
        shapes = None  # let the run report it as it happens
        step.kernel = None
    return shapes


def _looping(timeout_ns: int, run: Callable[..., Any], *arguments: Any) -> Any:
    """``run(*arguments)`` (a program with IF / WHILE) under the execution's loop timeout."""
    token = _LOOP_TIMEOUT_NS.set(timeout_ns)
    try:
        return run(*arguments)
    finally:
        _LOOP_TIMEOUT_NS.reset(token)


def _condition(code: OperationCode, verdict: Any) -> bool:
    try:
        return truth(verdict)
    except ValueError as error:
        what = "condition model" if code == OperationCode.WHILE else "condition"
        raise OperationFailed(f"{code.name}: {what}: {error}") from None


def _while_kernel(step: _Step, condition: _Callee, body: _Callee, check: bool) -> Callable[[list[Any]], list]:
    """WHILE on bare arrays: While.prepare's loop with the models' programs."""
    count = len(step.outputs)

    def holds(values: list[Any]) -> bool:
        return _condition(OperationCode.WHILE, condition(values)[0])

    def kernel(arrays: list[Any]) -> list:
        values = run_loop(holds, body, arrays[WHILE_FIRST_VALUE:], _LOOP_TIMEOUT_NS.get(), check_deadline)
        results = values[:count]
        return _checked_results(step, results, None) if check else results

    return kernel


def _if_kernel(step: _Step, then: _Callee, otherwise: _Callee, check: bool) -> Callable[[list[Any]], list]:
    """IF on bare arrays: the chosen branch's program."""

    def kernel(arrays: list[Any]) -> list:
        branch = then if _condition(OperationCode.IF, arrays[IF_CONDITION]) else otherwise
        results = branch(arrays[IF_FIRST_INPUT:])
        return _checked_results(step, results, None) if check else results

    return kernel


class _DynamicValue(Exception):
    """Raised at preparation when an operation's shape inference reads a value that is only
    known at execution: that operation's shapes are then inferred per execution."""


class _Unknown:
    """The value of a non-constant operand while the plan is built: any use raises."""

    def __getattr__(self, name: str):
        raise _DynamicValue(name)

    def _raise(self, *args, **kwargs):
        raise _DynamicValue("value")

    __array__ = __bool__ = __int__ = __float__ = __index__ = __len__ = __iter__ = __getitem__ = _raise


_UNKNOWN = _Unknown()


class _Step:
    """One operation of a plan: its kernel, operands and, when static, output shapes."""

    __slots__ = ("code", "implementation", "inputs", "outputs", "declared", "dtypes", "shapes", "kernel", "folded",
                 "position", "prepared")

    def __init__(self, subgraph: Subgraph, operation, position: int) -> None:
        self.position = position  # the operation's index in its subgraph (traces name it)
        self.code = OperationCode(operation.type)
        self.implementation = get_operation(self.code)
        self.inputs = list(operation.inputs)
        self.outputs = list(operation.outputs)
        self.declared = [subgraph.operands[i].operand_type() for i in operation.outputs]
        self.dtypes = [dtype_of(subgraph.operands[i].type) for i in operation.outputs]
        #: output shapes inferred at preparation (None: inferred at every execution)
        self.shapes: list[Shape] | None = None
        #: the operation's prepared kernel: input values -> output arrays (None: ``execute``)
        self.kernel: Callable[[list[Any]], list[np.ndarray]] | None = None
        #: computed at preparation from constants (its outputs are constants of the plan)
        self.folded = False
        #: a kernel prepared for static output shapes, which runs whenever the shapes are
        #: the plan's (not an IF / WHILE, which run their models step by step outside programs)
        self.prepared = False


class _SubgraphPlan:
    """A subgraph prepared once: constants decoded, each operation resolved to its kernel,
    output shapes inferred wherever they follow from static shapes and constants, and
    each operation's ``plan`` given the chance to precompute what depends only on them."""

    #: how many plans specialized to the input shapes of a call one subgraph keeps
    MAX_SPECIALIZED = 8

    def __init__(self, model: Model, subgraph: Subgraph, relaxed: bool,
                 inputs: tuple[tuple[Shape, bool], ...] | None = None, constants: dict[int, Tensor] | None = None,
                 owner: ReferencePreparedModel | None = None,
                 inferred: list[list[Shape] | None] | None = None) -> None:
        """``inferred``: per operation, its output shapes inferred by validation from the
        declared shapes and constants (``vet_operation``): for the plan of the declared
        input shapes only (``inputs`` None), where they are the shapes ``prepare`` sees."""
        self.model = model
        #: the prepared model whose plans this one's IF / WHILE run (None: they run ``execute``)
        self.owner = owner
        self.subgraph = subgraph
        self.relaxed = relaxed
        self.constants = _decode_constants(model, subgraph) if constants is None else constants
        self.templates = [(o.type, o.scale, o.zero_point, o.channel_quant) for o in subgraph.operands]
        self.steps = [_Step(subgraph, operation, position) for position, operation in enumerate(subgraph.operations)]
        #: the input shapes the static shapes assume (None where not fully specified), and
        #: which inputs they assume omitted
        if inputs is None:
            self.input_shapes = [_static_shape(subgraph.operands[i]) for i in subgraph.input_indexes]
            self.input_omitted = [False] * len(self.input_shapes)
        else:
            self.input_shapes = [shape for shape, _ in inputs]
            self.input_omitted = [omitted for _, omitted in inputs]
        self.input_key = tuple(zip(self.input_shapes, self.input_omitted, strict=True))
        self._specialized: dict[tuple, _SubgraphPlan] = {}
        #: the shape of every operand known at preparation (constants, inputs, outputs
        #: inferred or declared), by operand index
        self.known_shapes: dict[int, Shape] = {}
        self._plan_static(inferred if inputs is None and inferred is not None
                          and len(inferred) == len(self.steps) else None)
        #: IF / WHILE among the operations (a program then carries the loop timeout)
        self.control_flow = any(step.code in _CONTROL_FLOW for step in self.steps)
        #: when every operation has a kernel (prepared, or inferring its shapes per call):
        #: (kernel, inputs, outputs, shapes, dtypes, step) per operation, run on bare arrays
        #: (``_Run.program``); shapes is None where the kernel checks its own results. Most
        #: operations have one output of a static shape: then its operand index, shape and
        #: dtype come last (else -1, None, None), and its check takes no loop
        self.program: list[tuple] | None = None
        if all(step.kernel is not None for step in self.steps):
            self.program = [
                (step.kernel, step.inputs, step.outputs, step.shapes, step.dtypes, step,
                 *((step.outputs[0], step.shapes[0], step.dtypes[0]) if step.shapes is not None
                   and len(step.outputs) == 1 else (-1, None, None)))
                for step in self.steps]
        self.constant_values = {index: tensor.value for index, tensor in self.constants.items()}
        #: every operand's slot of a program run, the constants' values filled in (a list
        #: copies faster than a dict: a loop body's run starts from it at every iteration)
        self.slots: list[Any] = [None] * len(subgraph.operands)
        for index, value in self.constant_values.items():
            self.slots[index] = value

    def intermediate_bytes(self) -> int:
        """The bytes of every operation output whose shape is known at preparation."""
        return sum(math.prod(shape) * dtype.itemsize for step in self.steps if step.shapes is not None
                   for shape, dtype in zip(step.shapes, step.dtypes, strict=True))

    def for_inputs(self, inputs: tuple[tuple[Shape, bool], ...]) -> _SubgraphPlan | None:
        """The plan for inputs of these shapes: this one when they are the shapes it
        assumed, else one specialized to them (prepared on first use and kept, so a loop
        body or a model with dynamic input shapes also runs prepared); None when too many
        different shapes were seen (then the run infers shapes per execution)."""
        if inputs == self.input_key:
            return self
        plan = self._specialized.get(inputs)
        if plan is None and len(self._specialized) < self.MAX_SPECIALIZED:
            plan = _SubgraphPlan(self.model, self.subgraph, self.relaxed, inputs, self.constants, self.owner)
            self._specialized[inputs] = plan
        return plan

    def _plan_static(self, inferred: list[list[Shape] | None] | None) -> None:
        operands = self.subgraph.operands
        known: dict[int, Tensor] = {}
        for index, tensor in self.constants.items():
            known[index] = tensor
        for index, shape, omitted in zip(self.subgraph.input_indexes, self.input_shapes, self.input_omitted,
                                         strict=True):
            if shape is not None:
                known[index] = _tensor(operands[index], shape, None if omitted else _UNKNOWN)
        for step in self.steps:
            implementation = step.implementation
            shapes = None
            if (implementation is not None and step.code in _CONTROL_FLOW and self.owner is not None
                    and all(i in known for i in step.inputs)):
                shapes = _plan_control_flow(self.owner, step, [known[i] for i in step.inputs])
                if shapes is not None:
                    step.shapes = shapes
                    for index, shape in zip(step.outputs, shapes, strict=True):
                        known[index] = _tensor(operands[index], shape, _UNKNOWN)
            elif implementation is not None and all(i in known for i in step.inputs):
                context = ExecutionContext(step.code, [known[i] for i in step.inputs], step.declared, self.relaxed)
                # Validation ran ``prepare`` on the declared shapes and constants: where it
                # inferred the outputs, these inputs are those (a tensor's declared shape is
                # complete wherever prepare read it, and is then the shape planned here).
                recorded = inferred[step.position] if inferred is not None else None
                try:
                    implementation.check_inputs(context)  # refused: the execution reports it
                    if recorded is not None:
                        shapes = list(recorded)
                    else:
                        shapes = [tuple(int(d) for d in s) for s in implementation.prepare(context)]
                except Exception:  # noqa: BLE001 - reads a runtime value, or fails: infer at execution
                    shapes = None
                if shapes is not None and (context.scratch or len(shapes) != len(step.outputs) or not all(
                        _agrees(shape, declared.dimensions) and _fits(shape, declared)
                        for shape, declared in zip(shapes, step.declared, strict=True))):
                    shapes = None  # let the execution report the problem as it happens
                if shapes is not None and self._fold(step, context, shapes, known):
                    continue
                if shapes is not None:
                    step.shapes = shapes
                    for index, shape in zip(step.outputs, shapes, strict=True):
                        known[index] = _tensor(operands[index], shape, _UNKNOWN)
                    # Omitted inputs go through ``execute``, which reports a missing
                    # required value as BAD_DATA (``_guarded``), unless the plan handles them.
                    if implementation.plan_sees_omitted or all(tensor.value is not None for tensor in context.inputs):
                        try:
                            step.kernel = implementation.plan(context)
                        except Exception:  # noqa: BLE001 - no prepared kernel: ``execute`` still works
                            step.kernel = None
                        if step.kernel is None and step.code not in _CONTROL_FLOW:
                            step.kernel = _executing_kernel(step, context, self.relaxed)
            if shapes is None:
                for index in step.outputs:
                    shape = _static_shape(operands[index])
                    if shape is not None:  # the run checks results against declared shapes
                        known[index] = _tensor(operands[index], shape, _UNKNOWN)
                if step.kernel is None and implementation is not None and step.code not in _CONTROL_FLOW:
                    step.kernel = _inferring_kernel(step, self)
                    context = ExecutionContext(
                        step.code, [known[i] if i in known else _tensor(operands[i], tuple(operands[i].dimensions),
                                                                        _UNKNOWN) for i in step.inputs],
                        step.declared, self.relaxed)
                    try:
                        dynamic = implementation.plan_dynamic(context)
                    except Exception:  # noqa: BLE001 - reads a runtime value, or fails: infer per call
                        dynamic = None
                    if dynamic is not None:
                        step.kernel = _dynamic_kernel(step, implementation, dynamic, step.kernel)
        self.steps = [step for step in self.steps if not step.folded]
        self.known_shapes = {index: tensor.shape for index, tensor in known.items()}
        for step in self.steps:
            step.prepared = step.kernel is not None and step.shapes is not None and step.code not in _CONTROL_FLOW

    def output_shapes(self) -> list[Shape | None]:
        """The shape of each subgraph output known at preparation (None: only the run tells)."""
        return [self.known_shapes.get(index) for index in self.subgraph.output_indexes]

    def _fold(self, step: _Step, context: ExecutionContext, shapes: list[Shape], known: dict[int, Tensor]) -> bool:
        """Constant folding: an operation whose inputs are all constants (a DEQUANTIZE of
        float16 weights, say) runs once here and its outputs become constants, so the
        operations that read them are prepared with constant weights too."""
        if step.code in _NOT_FOLDED or not all(i in self.constants for i in step.inputs):
            return False
        if all(i in self.constants for i in step.outputs):  # folded by the plan this one specializes
            known.update((i, self.constants[i]) for i in step.outputs)
            step.folded = True
            return True
        try:
            results = step.implementation.execute(context)
        except Exception:  # noqa: BLE001 - let the execution report it as it happens
            return False
        if len(results) != len(step.outputs):
            return False
        for result, shape, dtype in zip(results, shapes, step.dtypes, strict=True):
            if not isinstance(result, np.ndarray) or result.dtype != dtype or result.shape != shape:
                return False
        for index, result, shape in zip(step.outputs, results, shapes, strict=True):
            result.flags.writeable = False  # shared by every execution
            self.constants[index] = known[index] = _tensor(self.subgraph.operands[index], shape, result)
        step.folded = True
        return True


class _Run:
    """One execution: runs subgraph plans, checks the deadline, enforces kernel contracts."""

    def __init__(self, prepared: ReferencePreparedModel, deadline_ns: int | None, loop_timeout_ns: int | None):
        self.prepared = prepared
        self.deadline_ns = deadline_ns
        self.loop_timeout_ns = loop_timeout_ns

    def check_deadline(self) -> None:
        if self.deadline_ns is not None and time.monotonic_ns() > self.deadline_ns:
            raise HalError(ErrorStatus.MISSED_DEADLINE_TRANSIENT, "the execution's deadline passed")

    def run_reference(self, ref: SubgraphRef, inputs: list[Tensor]) -> list[Tensor]:
        return self.subgraph(ref.index + 1, inputs)

    def subgraph(self, number: int, inputs: list[Tensor]) -> list[Tensor]:
        """Run subgraph ``number`` (0 = main, k = referenced[k-1]) on ``inputs``."""
        plan = self.prepared._plans[number]
        subgraph = plan.subgraph
        templates = plan.templates
        if len(inputs) != len(subgraph.input_indexes):
            raise OperationFailed(f"subgraph expects {len(subgraph.input_indexes)} inputs, got {len(inputs)}")
        # the prepared shapes hold for inputs of the shapes the plan assumed
        specialized = plan.for_inputs(tuple([(tensor.shape, tensor.value is None) for tensor in inputs]))
        static = specialized is not None
        timed = self.deadline_ns is not None
        traced = tracing.state.enabled  # one event per operation, for profiles and traces
        if static:
            plan = specialized
            if plan.program is not None and not timed and not traced:
                if plan.control_flow and self.loop_timeout_ns is not None:
                    return _looping(self.loop_timeout_ns, self.program, plan, inputs)
                return self.program(plan, inputs)
        values: dict[int, Tensor] = dict(plan.constants)
        for operand_index, tensor in zip(subgraph.input_indexes, inputs, strict=True):
            values[operand_index] = _make(templates[operand_index], tensor.shape, tensor.value)
        for step in plan.steps:
            if timed:
                self.check_deadline()
            if traced:
                begin = tracing.now_us()
            try:
                if static and step.prepared:
                    shapes = step.shapes
                    results = step.kernel([values[i].value for i in step.inputs])
                else:  # IF / WHILE here run their models step by step (traced, timed)
                    arguments = [values[i] for i in step.inputs]
                    results, shapes = self._execute(step, arguments, step.shapes if static and step.code not in
                                                    _CONTROL_FLOW else None)
            except KeyError:
                if all(i in values for i in step.inputs):
                    raise
                missing = [i for i in step.inputs if i not in values]
                raise OperationFailed(f"{step.code.name}: operands {missing} have no value") from None
            if len(results) != len(step.outputs):
                raise OperationFailed(f"{step.code.name}: produced {len(results)} outputs, expected "
                                      f"{len(step.outputs)}")
            for position, result in enumerate(results):
                shape, dtype = shapes[position], step.dtypes[position]
                if type(result) is not np.ndarray:
                    result = np.asarray(result)
                # the kernel contract; ``is`` first: dtype equality is slow to test
                if (result.dtype is not dtype and result.dtype != dtype) or result.shape != shape:
                    raise OperationFailed(f"{step.code.name}: output {position} is {result.dtype}"
                                          f"{list(result.shape)}, expected {dtype}{list(shape)} (kernel contract)")
                operand_index = step.outputs[position]
                code, scale, zero_point, channel_quant = templates[operand_index]
                values[operand_index] = Tensor(code, shape, scale, zero_point, channel_quant, result)
            if traced:
                tracing.record(step.code.name, "operation", begin, tracing.now_us() - begin,
                               {"subgraph": number, "position": step.position})
        outputs = []
        for operand_index in subgraph.output_indexes:
            if operand_index not in values:
                raise OperationFailed(f"subgraph output {operand_index} was never computed")
            outputs.append(values[operand_index])
        return outputs

    @staticmethod
    def program(plan: _SubgraphPlan, inputs: list[Tensor]) -> list[Tensor]:
        """``subgraph`` for a plan whose every operation has a prepared kernel and static
        shapes: the same steps and kernel contract on bare arrays (no deadline, no trace)."""
        templates = plan.templates
        outputs = []
        for operand_index, value in zip(plan.subgraph.output_indexes,
                                        _Run.program_arrays(plan, [tensor.value for tensor in inputs]), strict=True):
            if value is None:  # an omitted constant
                outputs.append(plan.constants[operand_index])
                continue
            code, scale, zero_point, channel_quant = templates[operand_index]
            outputs.append(Tensor(code, value.shape, scale, zero_point, channel_quant, value))
        return outputs

    @staticmethod
    def program_arrays(plan: _SubgraphPlan, values: list[Any]) -> list[np.ndarray]:
        """``program`` from input arrays to output arrays (None for an omitted constant)."""
        arrays = plan.slots.copy()  # operands are written before they are read (validate_model)
        for operand_index, value in zip(plan.subgraph.input_indexes, values, strict=True):
            arrays[operand_index] = value
        read = arrays.__getitem__  # map(read, ...): no comprehension frame per operation
        for kernel, input_indexes, output_indexes, shapes, dtypes, step, single, shape, dtype in plan.program:
            results = kernel(list(map(read, input_indexes)))
            if single >= 0:  # the usual case: one output of a static shape
                if len(results) != 1:
                    raise OperationFailed(f"{step.code.name}: produced {len(results)} outputs, expected 1")
                result = results[0]
                if type(result) is not np.ndarray:
                    result = np.asarray(result)
                if (result.dtype is not dtype and result.dtype != dtype) or result.shape != shape:
                    raise OperationFailed(f"{step.code.name}: output 0 is {result.dtype}{list(result.shape)}, "
                                          f"expected {dtype}{list(shape)} (kernel contract)")
                arrays[single] = result
                continue
            if shapes is None:  # a kernel that infers its shapes checked its results itself
                for position, result in enumerate(results):
                    arrays[output_indexes[position]] = result
                continue
            if len(results) != len(output_indexes):
                raise OperationFailed(f"{step.code.name}: produced {len(results)} outputs, expected "
                                      f"{len(output_indexes)}")
            for position, result in enumerate(results):
                shape, dtype = shapes[position], dtypes[position]
                if type(result) is not np.ndarray:
                    result = np.asarray(result)
                if (result.dtype is not dtype and result.dtype != dtype) or result.shape != shape:
                    raise OperationFailed(f"{step.code.name}: output {position} is {result.dtype}"
                                          f"{list(result.shape)}, expected {dtype}{list(shape)} (kernel contract)")
                arrays[output_indexes[position]] = result
        outputs = []
        for operand_index in plan.subgraph.output_indexes:
            value = arrays[operand_index]
            if value is None and operand_index not in plan.constants:
                raise OperationFailed(f"subgraph output {operand_index} was never computed")
            outputs.append(value)
        return outputs

    def _execute(self, step: _Step, arguments: list[Tensor], shapes: list[Shape] | None):
        """Run an operation through its ``prepare`` (unless its shapes are known) and ``execute``."""
        implementation = step.implementation
        if implementation is None:
            raise OperationFailed(f"{step.code.name} is not implemented")
        context = ExecutionContext(step.code, arguments, step.declared, self.prepared._relaxed,
                                   run_subgraph=self.run_reference, check_deadline=self.check_deadline,
                                   loop_timeout_ns=self.loop_timeout_ns)
        if shapes is None:
            shapes = _infer_shapes(step, context)
        return _guarded(step.code, context, implementation.execute), shapes


def _contained(compute: Callable[[], Any]) -> Any:
    """Run ``compute`` (a whole execution's kernels) under its own numpy error state,
    whatever the caller set, with every failure reported as the HAL status it stands for
    (a kernel bug included: never leaked)."""
    try:
        with np.errstate(all="ignore"):
            return compute()
    except HalError:
        raise
    except MemoryError as error:
        raise _out_of_memory(ErrorStatus.RESOURCE_EXHAUSTED_TRANSIENT, "out of memory") from error
    except OperationFailed as error:
        raise HalError(ErrorStatus.GENERAL_FAILURE, str(error)) from error
    except NnapiError as error:
        raise HalError(_RESULT_TO_STATUS.get(error.code, ErrorStatus.GENERAL_FAILURE), str(error)) from error
    except Exception as error:
        raise HalError(ErrorStatus.GENERAL_FAILURE, f"{type(error).__name__}: {error}") from error


def _infer_shapes(step: _Step, context: ExecutionContext) -> list[Shape]:
    """An operation's output shapes at execution (its ``prepare``), checked against the
    declared dimensions and the largest operand before any kernel allocates them."""
    implementation = step.implementation
    implementation.check_inputs(context)  # the registration flags
    shapes = [tuple(int(d) for d in s) for s in _guarded(step.code, context, implementation.prepare)]
    if len(shapes) != len(step.outputs):
        raise OperationFailed(f"{step.code.name}: prepare gave {len(shapes)} shapes for {len(step.outputs)} outputs")
    _check_declared(step, shapes)
    return shapes


def _check_declared(step: _Step, shapes: list[Shape]) -> None:
    for position, (shape, output_type) in enumerate(zip(shapes, step.declared, strict=True)):
        _check_output_size(step.code, position, shape, output_type)
    for position, (shape, output_type) in enumerate(zip(shapes, step.declared, strict=True)):
        if not _agrees(shape, output_type.dimensions):
            raise OperationFailed(f"{step.code.name}: output {position} has shape {list(shape)} but the "
                                  f"model declares {list(output_type.dimensions)}")


def _checked_results(step: _Step, results: list, shapes: list[Shape] | None) -> list[np.ndarray]:
    """The kernel contract on one operation's results: one array per output, of the
    output's dtype and of ``shapes`` (None: of any shape the declaration allows)."""
    if len(results) != len(step.outputs):
        raise OperationFailed(f"{step.code.name}: produced {len(results)} outputs, expected {len(step.outputs)}")
    arrays = [result if type(result) is np.ndarray else np.asarray(result) for result in results]
    if shapes is None:
        _check_declared(step, [array.shape for array in arrays])
        shapes = [array.shape for array in arrays]
    for position, (array, shape, dtype) in enumerate(zip(arrays, shapes, step.dtypes, strict=True)):
        if (array.dtype is not dtype and array.dtype != dtype) or array.shape != shape:
            raise OperationFailed(f"{step.code.name}: output {position} is {array.dtype}{list(array.shape)}, "
                                  f"expected {dtype}{list(shape)} (kernel contract)")
    return arrays


def _agrees(shape: Shape, declared) -> bool:
    """A computed shape fits the declared dimensions (0 or an empty list: unspecified)."""
    if not declared:
        return True
    return len(declared) == len(shape) and all(not d or d == s for d, s in zip(declared, shape, strict=True))


def _fits(shape: Shape, output_type) -> bool:
    """An output of ``shape`` is no larger than an operand may be."""
    return math.prod(shape) * dtype_of(output_type.type).itemsize <= MAX_OPERAND_BYTES


def _static_shape(operand) -> Shape | None:
    """The shape every value of ``operand`` has, when its declaration fixes it."""
    if operand.type not in TENSOR_TYPES:
        return ()
    dims = tuple(operand.dimensions)
    return dims if dims and 0 not in dims else None


def _decode_constants(model: Model, subgraph: Subgraph) -> dict[int, Tensor]:
    constants: dict[int, Tensor] = {}
    for index, operand in enumerate(subgraph.operands):
        lifetime = operand.lifetime
        if lifetime in (L.CONSTANT_COPY, L.CONSTANT_REFERENCE):
            constants[index] = _tensor(operand, tuple(operand.dimensions), constant_array(model, operand))
        elif lifetime == L.NO_VALUE:
            constants[index] = _tensor(operand, tuple(operand.dimensions), None)
        elif lifetime == L.SUBGRAPH:
            constants[index] = _tensor(operand, (), SubgraphRef(operand.location.offset))
    return constants


def _make(template: tuple, shape: Shape, value) -> Tensor:
    code, scale, zero_point, channel_quant = template
    return Tensor(code, shape, scale, zero_point, channel_quant, value)


def _guarded(code: OperationCode, context: ExecutionContext, step):
    """Run ``prepare`` or ``execute``. A kernel that trips over an omitted input (None
    where a required value should be) was given bad data: BAD_DATA, as Android's CPU
    executor reports a missing parameter, not a kernel failure."""
    try:
        return step(context)
    except NnapiError:
        raise
    except (AttributeError, TypeError) as error:
        omitted = [position for position, tensor in enumerate(context.inputs) if tensor.value is None]
        if not omitted:
            raise
        raise HalError(ErrorStatus.INVALID_ARGUMENT,
                       f"{code.name}: input {', '.join(map(str, omitted))} omitted, but the operation needs a "
                       "value there") from error


def _check_output_size(code: OperationCode, position: int, shape: tuple[int, ...], output_type) -> None:
    """Refuse an output larger than an operand may be before any kernel allocates it (a
    FILL or TILE to 2**31 elements would otherwise die of MemoryError half way)."""
    size = dtype_of(output_type.type).itemsize
    for dim in shape:
        size *= dim
    if size > MAX_OPERAND_BYTES:
        raise _out_of_memory(ErrorStatus.RESOURCE_EXHAUSTED_PERSISTENT,
                             f"{code.name}: output {position} of shape {list(shape)} needs {size} bytes, more "
                             f"than an operand may hold ({MAX_OPERAND_BYTES})")


def _out_of_memory(status: ErrorStatus, message: str) -> HalError:
    """OUT_OF_MEMORY crosses the HAL as RESOURCE_EXHAUSTED_* (hal/Types.h); in process the
    runtime reports the exact code, which the error carries."""
    error = HalError(status, message)
    error.result_code = ResultCode.OUT_OF_MEMORY
    return error


def _tensor(operand, shape: tuple[int, ...], value) -> Tensor:
    return Tensor(operand.type, shape, operand.scale, operand.zero_point, operand.channel_quant, value)
