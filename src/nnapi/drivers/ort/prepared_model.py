"""OrtPreparedModel and OrtExecution: binding a request, running the session, landing the
outputs whose shapes only the run tells, timing and deadlines.
"""

from __future__ import annotations

import ctypes
import threading
import time
import weakref
from collections.abc import Callable
from typing import NamedTuple

import numpy as np
import onnxruntime as ort

from nnapi.drivers.ort.binding import (
    _CPU_DEVICE,
    _address,
    _Binding,
    _bound_shape,
    _onnx_type,
    _pool_at,
    _pool_bytes,
    _whole_array,
)
from nnapi.drivers.ort.builder import check_failure
from nnapi.drivers.ort.deadlines import _WATCHDOG, _loop_deadline
from nnapi.drivers.ort.signature import IoSpec, Signature, _nbytes
from nnapi.hal import (
    DataLocation,
    ErrorStatus,
    HalError,
    IExecution,
    IPreparedModel,
    OutputShape,
    Request,
    RequestArgument,
    Timing,
)


def _run_failure(error: Exception) -> HalError:
    """A failed run as the HAL reports it: the NNAPI rule a value given at run time broke
    where a lowering's check refused it, else ORT's own message."""
    rule = check_failure(error)
    return HalError(ErrorStatus.GENERAL_FAILURE, rule if rule is not None else f"onnxruntime: {error}")


# --- execution --------------------------------------------------------------------------
#
# What an execution costs beside ORT's own work is Python run between two model runs, when
# the caches hold the model's weights and activations, not this code: every object touched
# is a cache miss, so a loop that takes 6 us back to back takes ~25 us between real runs
# (measured on MobileNetV2: the old binding loop, numpy views and ``ctypes.data`` per
# argument, cost ~40 us there). So the per-run path touches little: each argument's bytes
# are checked with integer arithmetic on sizes computed at preparation, its address read
# with ctypes (no numpy view), and it is bound again only when it moved. A reusable
# execution (create_reusable_execution) checks and binds its request once.

_LATE = object()  # an output bound for ORT to allocate (its shape known only after the run)
_REF = weakref.ref  # what an argument bound as a numpy array is remembered by (see _Binding)
_UNTIMED = Timing()  # what a run without measure_timing reports (shared, never mutated)


class _LearnedShapes(NamedTuple):
    """What a run told of a model's outputs at given input shapes (see
    OrtPreparedModel._learned_shapes)."""

    #: per output, its shape and byte count (0: empty)
    outputs: tuple[tuple[tuple[int, ...], int], ...]
    #: the OutputShapes such a run reports
    reported: list[OutputShape]


def _learned_placement(learned: _LearnedShapes | None, position: int, room: int | None
                       ) -> tuple[tuple[int, ...], int] | None:
    """Where output ``position`` of open shape is written, given ``room`` bytes for it
    (None: the request omits it): the (shape, byte count) a run with these input shapes
    gave, to bind it at in the request's memory; or None to let ORT allocate it, its bytes
    copied into the request after the run (_land). ORT allocates an output whose shape no
    run told yet (or ``learned`` is None: the model binds no learned shape), an empty one
    (no bytes to bind), an omitted one, and one whose buffer is too small (the run tells the
    shape needed: OUTPUT_INSUFFICIENT_SIZE)."""
    if learned is None or room is None:
        return None
    placement = learned.outputs[position]
    return placement if placement[1] and room >= placement[1] else None


class OrtPreparedModel(IPreparedModel):
    """An ORT session and the order of its inputs and outputs."""

    def __init__(self, session: ort.InferenceSession, signature: Signature) -> None:
        self.session = session
        self.signature = signature
        self._local = threading.local()
        #: the session runs on memory other than the host's (see _Binding.fresh_inputs)
        self.copies_inputs = session.get_providers()[:1] != ["CPUExecutionProvider"]
        # the shapes of a run whose outputs the signature fixes, built once: a dataclass made
        # right after a model run costs ~10 us (cold code). Shared: nobody mutates them (the
        # runtime copies what it hands out); a late output's shape replaces its entry.
        self._shapes = [OutputShape(spec.dimensions.copy()) for spec in signature.outputs]
        #: the specs of execute_arrays's arguments (inputs, then outputs)
        self._specs = (*signature.inputs, *signature.outputs)
        self._input_count = len(signature.inputs)
        #: the request execute_arrays's arrays make (argument k the whole of pool k), for
        #: what it does not bind itself; None when a shape is not fixed (no array path)
        self._array_arguments: tuple[list[RequestArgument], list[RequestArgument]] | None = None
        if all(spec.nbytes is not None for spec in self._specs):
            arguments = [RequestArgument(False, DataLocation(k, 0, spec.nbytes), list(spec.dimensions))
                         for k, spec in enumerate(self._specs)]
            self._array_arguments = (arguments[:self._input_count], arguments[self._input_count:])
        #: Outputs of open shape (a dimension known only at run time): ORT allocates them
        #: and each run copies them into the request (_land), unless a run with the same
        #: input shapes told their shapes: then they are bound in the request's memory at
        #: those shapes as static outputs are, and written in place (sine_float, the
        #: wake-word embedding model on a free batch: the late binding, ORT's allocation and
        #: the copy cost ~15-25 us a run). _learned_placement decides which, per output.
        #: What a run told, by the shapes of the inputs of open shape (_learn):
        self._learned_shapes: dict[tuple, _LearnedShapes] = {}
        self._has_open_outputs = any(spec.nbytes is None for spec in signature.outputs)
        #: whether outputs are bound at learned shapes: not for a provider that copies its
        #: inputs (its binding is made again before every run anyway); and no more once a
        #: shape moved at the same input shapes: an output whose shape follows from input
        #: values too (a RESHAPE to a shape given at run time, NMS). ORT refuses to run a
        #: node into a bound output of another shape, so such a run is made again with the
        #: outputs left to ORT (_run_again_allocating), and learned shapes are not trusted.
        self._binds_learned_shapes = self._has_open_outputs and not self.copies_inputs
        #: the inputs and outputs of open shape (execute_open_arrays), and per open input the
        #: array shapes checked against its declared dimensions
        self._open_inputs = tuple(k for k, spec in enumerate(signature.inputs) if spec.nbytes is None)
        self._open_outputs = tuple(k for k, spec in enumerate(signature.outputs) if spec.nbytes is None)
        self._accepted: dict[int, set[tuple[int, ...]]] = {k: set() for k in self._open_inputs}
        #: per output, its ONNX element type (what _land checks ORT's value against before copying its bytes)
        self._element_types = [_onnx_type(spec.dtype) for spec in signature.outputs]
        #: execute_open_arrays's outputs where the signature fixes every output's shape (only
        #: inputs of open shape): as if learned, at every input shape (unused otherwise)
        self._static_shapes = _LearnedShapes(tuple((spec.shape, spec.nbytes or 0) for spec in signature.outputs),
                                             self._shapes)

    def execute(self, request: Request, measure_timing: bool = False, deadline_ns: int | None = None,
                loop_timeout_ns: int | None = None) -> tuple[list[OutputShape], Timing]:
        if self.signature.loops:
            deadline_ns = _loop_deadline(deadline_ns, loop_timeout_ns)
        start = time.monotonic_ns() if measure_timing or deadline_ns is not None else 0
        if deadline_ns is not None and start > deadline_ns:
            raise HalError(ErrorStatus.MISSED_DEADLINE_TRANSIENT, "the deadline passed before execution")
        # One binding per thread, kept between executions: a request whose buffers are where
        # the last one's were (an app's loop) runs without binding anything again.
        binding = getattr(self._local, "binding", None)
        if binding is None:
            binding = self._local.binding = _Binding(self.session, self.signature, self.copies_inputs)
        late = self._bind(binding, request)
        if late or start or binding.at_learned_shape:
            return self._finish(binding, request, late, measure_timing, deadline_ns, start)
        try:  # the run and nothing else (as OrtExecution's plain one)
            binding.run(binding.native, None)
        except Exception as error:
            raise _run_failure(error) from None
        return self._shapes.copy(), _UNTIMED

    def array_executor(self) -> Callable[[list, int | None], tuple[list[OutputShape], Timing]] | None:
        """execute_arrays where the signature fixes every shape and the session reads the
        caller's memory (a provider that copies its inputs binds them before every run:
        execute does)."""
        if self.copies_inputs:
            return None
        if self._array_arguments is not None:
            return self.execute_arrays
        return self.execute_open_arrays

    def execute_open_arrays(self, arrays: list[np.ndarray], deadline_ns: int | None = None
                            ) -> tuple[list[OutputShape], Timing]:
        """execute_arrays for a model with an input or output of open shape: an input's
        array gives its dimensions, an output's array is its buffer (its shape the run's).
        Where every output array is where _learned_placement puts its output (the shape a
        run with these input shapes gave), the arrays bound on this thread's binding at
        those shapes are found by identity and the rest checked and bound, as
        execute_arrays does (the outputs written in place); anything else is the request
        the arrays make, through execute."""
        binding = getattr(self._local, "binding", None)
        specs = self._specs
        if binding is not None and deadline_ns is None and not self.signature.loops and len(arrays) == len(specs) \
                and (self._binds_learned_shapes or not self._has_open_outputs):
            input_shapes = tuple([arrays[position].shape for position in self._open_inputs])
            learned = self._learned_shapes.get(input_shapes) if self._has_open_outputs else self._static_shapes
            if learned is not None:
                count = self._input_count
                bound, array_shapes = binding.bound, binding.array_shapes
                position = 0
                for array in arrays:
                    shape = array.shape
                    if position < count:
                        spec = specs[position]
                        if shape != spec.shape and (spec.nbytes is not None or shape not in self._accepted[position]):
                            break
                    else:
                        placement = _learned_placement(learned, position - count, array.nbytes)
                        if placement is None or shape != placement[0]:
                            break  # ORT allocates it, or the array is not the output's shape: execute binds it
                    previous = bound[position]
                    if (previous.__class__ is not _REF or previous() is not array
                            or array_shapes[position] != shape) and not self._bind_open_array(binding, position, array):
                        break
                    position += 1
                else:
                    binding.at_learned_shape, binding.input_shapes, binding.late = self._open_outputs, input_shapes, []
                    try:
                        binding.run(binding.native, None)
                    except Exception as error:
                        if not self._has_open_outputs:
                            raise _run_failure(error) from None
                        # ORT refused a learned shape that moved, or the run failed: the run
                        # again, with the outputs allocated, tells which
                        return self._run_again_allocating(binding, self._open_request(arrays), [], False, None, 0)
                    return learned.reported.copy(), _UNTIMED
        return self.execute(self._open_request(arrays), False, deadline_ns)

    def _bind_open_array(self, binding: _Binding, position: int, array: np.ndarray) -> bool:
        """Bind ``array`` (its shape checked by the caller) at ``position`` as _bind_array
        does; False, having bound nothing, for one that is not a C-contiguous numpy array
        of the spec's dtype."""
        spec = self._specs[position]
        if array.__class__ is not np.ndarray or array.dtype is not spec.dtype or not array.flags.c_contiguous:
            return False
        self._bind_whole(binding, position, array, array.shape)
        binding.array_shapes[position] = array.shape
        return True

    def _open_request(self, arrays: list[np.ndarray]) -> Request:
        """The request execute_open_arrays's arrays make: argument k the whole of array k,
        an input of open shape at the array's shape, every other argument at its spec's
        dimensions."""
        count = self._input_count
        if len(arrays) != len(self._specs):
            raise HalError(ErrorStatus.INVALID_ARGUMENT, "the request's inputs or outputs do not match the model")
        arguments = []
        for position, (spec, array) in enumerate(zip(self._specs, arrays, strict=True)):
            if not isinstance(array, np.ndarray):
                raise HalError(ErrorStatus.INVALID_ARGUMENT, f"argument {position} is not a numpy array")
            dims = list(array.shape) if position < count and spec.nbytes is None else list(spec.dimensions)
            arguments.append(RequestArgument(False, DataLocation(position, 0, array.nbytes), dims))
        return Request(arguments[:count], arguments[count:], list(arrays))

    def execute_arrays(self, arrays: list[np.ndarray], deadline_ns: int | None = None
                       ) -> tuple[list[OutputShape], Timing]:
        """execute for a request whose argument k is the whole of numpy array k (inputs, then
        outputs), as the runtime's usual Execution gives it (see array_executor): the arrays
        bound at their positions on this thread's binding are found by identity, and only
        one that is not (a new input image) is checked, as _bind checks an array pool (the
        spec's dtype, shape and C strides; an output writable), and bound. Anything else
        (an array of another layout, a deadline, the thread's first run) is the request
        the arrays make, through execute.

        Why: between two model runs each step of Python costs ~10x what it does back to
        back (see the note above _LATE); _bind reads every argument's request fields and
        its pool, where an app's loop changes one array."""
        binding = getattr(self._local, "binding", None)
        if binding is not None and deadline_ns is None:
            bound = binding.bound
            if len(arrays) == len(bound):
                position = 0
                for array in arrays:
                    previous = bound[position]
                    if previous.__class__ is not _REF or previous() is not array:
                        binding = self._other(binding, arrays)
                        break
                    position += 1
                else:
                    binding.again = True
                if binding is not None:
                    if self.signature.loops:  # bounded by the (default) loop timeout
                        self._run(binding, _loop_deadline(None, None))
                        return self._shapes.copy(), _UNTIMED
                    try:
                        binding.run(binding.native, None)
                    except Exception as error:
                        raise _run_failure(error) from None
                    return self._shapes.copy(), _UNTIMED
        if self._array_arguments is None:
            raise HalError(ErrorStatus.INVALID_ARGUMENT, "the model has an output or input of unspecified shape: "
                                                         "arrays alone do not make its request")
        return self.execute(Request(*self._array_arguments, list(arrays)), False, deadline_ns)

    def _other(self, binding: _Binding, arrays: list[np.ndarray]) -> _Binding | None:
        """The binding for ``arrays``, which this thread's binding does not hold: its kept
        one (``partner``) where that holds them all; else this thread's binding bound to
        them, each array it does not hold checked and bound (see _bind_array; None, what
        was bound staying recorded, for one that is not the whole of its argument). Arrays
        that ran twice in a row on it (an app's buffers it keeps) are kept on the partner
        first, the binding taking the partner's place: a kept array run between new ones
        (or two buffers in turn) binds nothing again."""
        kept = binding.partner
        if kept is not None:
            bound = kept.bound
            for position, array in enumerate(arrays):
                previous = bound[position]
                if previous.__class__ is not _REF or previous() is not array:
                    break
            else:
                return kept
        if binding.again:
            if kept is None:
                kept = _Binding(self.session, self.signature)
            binding.partner, kept.partner = None, binding
            binding = self._local.binding = kept
        binding.again = False
        bound = binding.bound
        for position, array in enumerate(arrays):
            previous = bound[position]
            if (previous.__class__ is not _REF or previous() is not array) \
                    and not self._bind_array(binding, position, array):
                return None
        return binding

    def _bind_array(self, binding: _Binding, position: int, array: np.ndarray) -> bool:
        """Bind ``array`` at ``position`` (inputs, then outputs) of ``binding`` when it is
        the whole of that argument as _whole_array tells (an output writable too, else
        INVALID_ARGUMENT); False, having bound nothing, for any other array."""
        spec = self._specs[position]
        if array.__class__ is not np.ndarray or array.dtype is not spec.dtype or array.shape != spec.shape \
                or array.strides != spec.strides:
            return False
        self._bind_whole(binding, position, array, spec.shape)
        return True

    def _bind_whole(self, binding: _Binding, position: int, array: np.ndarray, shape: tuple[int, ...]) -> None:
        """Bind the checked ``array`` as the whole argument at ``position`` in ``shape`` (an
        output must be writable: INVALID_ARGUMENT otherwise, as any binding refused)."""
        spec = self._specs[position]
        bound = binding.bound
        bound[position] = None
        try:
            if position < self._input_count:
                binding.bind_array(spec.name, array)
            else:
                if not array.flags.writeable:
                    raise HalError(ErrorStatus.INVALID_ARGUMENT, "an output pool is read-only")
                binding.bind_output(spec.name, _CPU_DEVICE, spec.element_type, shape,
                                    ctypes.addressof(ctypes.c_char.from_buffer(array)))
        except HalError:
            raise
        except Exception as error:
            raise HalError(ErrorStatus.INVALID_ARGUMENT, f"cannot bind the request: {error}") from None
        bound[position] = _REF(array)

    def create_reusable_execution(self, request: Request, measure_timing: bool = False,
                                  loop_timeout_ns: int | None = None) -> IExecution:
        """The request checked and bound to an IOBinding of its own once; each computation
        only runs the session (see OrtExecution)."""
        binding = _Binding(self.session, self.signature, self.copies_inputs)
        late = self._bind(binding, request, keep=True)
        return OrtExecution(self, binding, request, late, measure_timing, loop_timeout_ns)

    def _bind(self, binding: _Binding, request: Request, keep: bool = False) -> list[int]:
        """Check the request against the signature and bind each argument that moved;
        return the outputs ORT allocates (copied into the request after the run).

        A pool that is a numpy array holding exactly the argument (the input's dtype, shape,
        C-contiguous, offset 0: what the runtime passes for arrays set with set_input /
        set_output) is checked in a few comparisons and bound as the array itself (held by
        the binding, so the same array again needs nothing); any other pool by address."""
        signature = self.signature
        inputs, outputs, pools = request.inputs, request.outputs, request.pools
        if len(inputs) != len(signature.inputs) or len(outputs) != len(signature.outputs):
            raise HalError(ErrorStatus.INVALID_ARGUMENT, "the request's inputs or outputs do not match the model")
        views: dict[int, tuple[memoryview, int]] = {}  # pool index -> (its bytes, their address)
        arrays: list[np.ndarray] = []  # the arrays bound as arrays, for a request bound to keep
        late = []
        at_learned_shape: list[int] = []
        binding.at_learned_shape, binding.late = at_learned_shape, late
        # the shapes of the inputs of open shape, what output shapes are learned by
        open_shapes: list[tuple[int, ...]] | None = [] if self._has_open_outputs else None
        count = len(pools)
        try:
            bound = binding.bound
            for position, argument in enumerate(inputs):
                spec = signature.inputs[position]
                location = argument.location
                index = location.pool_index
                pool = pools[index] if 0 <= index < count else None
                if _whole_array(pool, spec, location) and spec.nbytes is not None \
                        and location.length >= spec.nbytes and not argument.has_no_value \
                        and (not argument.dimensions or argument.dimensions == spec.dimensions):
                    previous = bound[position]
                    if previous.__class__ is not _REF or previous() is not pool or binding.fresh_inputs:
                        bound[position] = None
                        binding.bind_array(spec.name, pool)
                        bound[position] = _REF(pool)
                        if keep:
                            arrays.append(pool)
                    continue
                dims = argument.dimensions
                needed = spec.nbytes
                if argument.has_no_value or needed is None or (dims and dims != spec.dimensions):
                    shape, needed = self._input_shape(position, argument, spec)
                else:
                    shape = spec.shape
                if spec.nbytes is None:
                    if open_shapes is not None:
                        open_shapes.append(shape)
                    accepted = self._accepted[position]
                    if shape not in accepted and len(accepted) < 64:
                        accepted.add(shape)  # checked by _input_shape (see execute_open_arrays)
                if location.length < needed:
                    raise HalError(ErrorStatus.INVALID_ARGUMENT, f"input {position} buffer is too small")
                address = self._located(request, views, location, needed, False, f"input {position}")
                previous = bound[position]
                if previous.__class__ is not tuple or previous != (address, shape) or binding.fresh_inputs:
                    bound[position] = None
                    binding.bind_input(spec.name, _CPU_DEVICE, spec.element_type, shape, address)
                    bound[position] = (address, shape)
            first = len(inputs)  # the outputs' entries in ``bound`` follow the inputs'
            learned = None  # what an earlier run with these input shapes told of the outputs
            if open_shapes is not None:
                binding.input_shapes = input_shapes = tuple(open_shapes)
                if self._binds_learned_shapes:
                    learned = self._learned_shapes.get(input_shapes)
            for position, argument in enumerate(outputs):
                slot = first + position
                spec = signature.outputs[position]
                location = argument.location
                room = None if argument.has_no_value else location.length
                shape, needed = spec.shape, spec.nbytes
                placement = None
                if needed is None:
                    placement = _learned_placement(learned, position, room)
                    if placement is not None:
                        shape, needed = placement
                if room is None or needed is None or room < needed:
                    late.append(position)  # bound before each run (see _finish)
                    bound[slot] = _LATE
                    continue
                index = location.pool_index
                pool = pools[index] if 0 <= index < count else None
                if placement is not None:
                    at_learned_shape.append(position)
                elif _whole_array(pool, spec, location):
                    previous = bound[slot]
                    if previous.__class__ is not _REF or previous() is not pool:
                        bound[slot] = None
                        if not pool.flags.writeable:
                            raise HalError(ErrorStatus.INVALID_ARGUMENT, "an output pool is read-only")
                        address = ctypes.addressof(ctypes.c_char.from_buffer(pool))
                        binding.bind_output(spec.name, _CPU_DEVICE, spec.element_type, spec.shape, address)
                        bound[slot] = _REF(pool)
                        if keep:
                            arrays.append(pool)
                    continue
                address = self._located(request, views, location, needed, True, f"output {position}")
                previous = bound[slot]
                if previous.__class__ is not tuple or previous != (address, shape):
                    bound[slot] = None
                    binding.bind_output(spec.name, _CPU_DEVICE, spec.element_type, shape, address)
                    bound[slot] = (address, shape)
        except HalError:
            raise
        except Exception as error:
            raise HalError(ErrorStatus.INVALID_ARGUMENT, f"cannot bind the request: {error}") from None
        if keep:
            # views of their own: the caller releasing its view (the driver service when a
            # client forgets a pool) leaves the memory mapped while ORT holds its address
            binding.views = [*(memoryview(view) for view, _ in views.values()), *arrays]
        return late

    @staticmethod
    def _input_shape(position: int, argument: RequestArgument, spec: IoSpec) -> tuple[tuple[int, ...], int]:
        """The shape and byte count of an input the signature does not fix (the general case)."""
        if argument.has_no_value:
            raise HalError(ErrorStatus.INVALID_ARGUMENT, f"input {position} has no value")
        dims = list(argument.dimensions) or spec.dimensions
        # a 0 the request gives is a zero-sized tensor (ORT takes those); one left from the
        # model's declaration is an unspecified dimension
        if not dims or (0 in dims and not argument.dimensions and argument.location.length):
            raise HalError(ErrorStatus.INVALID_ARGUMENT, f"input {position} has unspecified dimensions")
        if any(not isinstance(d, int) or d < 0 for d in dims):
            raise HalError(ErrorStatus.INVALID_ARGUMENT, f"input {position} has bad dimensions {dims}")
        declared = spec.dimensions
        if declared and (len(dims) != len(declared) or any(d and d != g for d, g in zip(declared, dims))):
            # what the model fixes, a request cannot change (ORT would only fail inside the run)
            raise HalError(ErrorStatus.INVALID_ARGUMENT, f"input {position} has dimensions {list(dims)}; the model "
                                                         f"declares {declared}")
        return tuple(dims), _nbytes(spec, dims)

    @staticmethod
    def _located(request: Request, views: dict, location: DataLocation, needed: int, writable: bool, what: str) -> int:
        """The address of ``needed`` bytes at ``location``, checked to lie inside its pool."""
        index = location.pool_index
        found = views.get(index)
        if found is None:
            pools = request.pools
            pool = pools[index] if 0 <= index < len(pools) else _pool_at(request, index)
            if type(pool) is memoryview and pool.ndim == 1 and pool.format == "B" and pool.c_contiguous \
                    and not pool.readonly and pool.nbytes:
                # the runtime's own pools (set_input / set_output): their address, nothing else
                found = (pool, ctypes.addressof(ctypes.c_char.from_buffer(pool)))
            else:
                view = _pool_bytes(pool, writable)
                found = (view, _address(view))
            views[index] = found
        elif writable and found[0].readonly:
            raise HalError(ErrorStatus.INVALID_ARGUMENT, "an output pool is read-only")
        offset = location.offset
        if offset < 0 or offset + needed > found[0].nbytes:
            raise HalError(ErrorStatus.INVALID_ARGUMENT, f"{what} lies outside its pool")
        return found[1] + offset

    def _finish(self, binding: _Binding, request: Request, late: list[int], measure_timing: bool,
                deadline_ns: int | None, start: int) -> tuple[list[OutputShape], Timing]:
        """Run the bound request; land the outputs ORT allocated; shapes and timing. A run
        with outputs bound at learned shapes that ORT refuses runs again with them allocated."""
        if late:
            # An output ORT allocates is bound afresh before every run: after a run the
            # binding holds the value ORT allocated, and the next run would have to fit that
            # shape (a dynamic shape that changed failed inside ORT).
            outputs = self.signature.outputs
            try:
                for position in late:
                    binding.bind_output(outputs[position].name, _CPU_DEVICE)
            except Exception as error:
                raise HalError(ErrorStatus.GENERAL_FAILURE, f"cannot bind an output: {error}") from None
        at_learned_shape = binding.at_learned_shape
        run_start = time.monotonic_ns() if measure_timing else 0
        try:
            self._run(binding, deadline_ns)
        except HalError as error:
            if not at_learned_shape or error.status != ErrorStatus.GENERAL_FAILURE:
                raise
            return self._run_again_allocating(binding, request, late, measure_timing, deadline_ns, start)
        run_end = time.monotonic_ns() if measure_timing else 0
        if at_learned_shape:
            learned = self._learned_shapes.get(binding.input_shapes)
            shapes = (learned.reported if learned is not None else self._shapes_as_bound(binding)).copy()
        else:
            shapes = self._shapes.copy()
        if late:
            self._land(binding, request, late, shapes)
        if not measure_timing:
            return shapes, _UNTIMED
        return shapes, Timing(run_end - run_start, time.monotonic_ns() - start)

    def _shapes_as_bound(self, binding: _Binding) -> list[OutputShape]:
        """The shapes of a run at learned shapes that were forgotten since it was bound (the
        table full, or cleared by another thread's run): the shapes the outputs are bound at."""
        first = len(self.signature.inputs)
        shapes = self._shapes.copy()
        for position in binding.at_learned_shape:
            shapes[position] = OutputShape(list(_bound_shape(binding, first + position)))
        return shapes

    def _run_again_allocating(self, binding: _Binding, request: Request, late: list[int], measure_timing: bool,
                              deadline_ns: int | None, start: int) -> tuple[list[OutputShape], Timing]:
        """The run again with the outputs bound at learned shapes left to ORT, after ORT
        refused the run. Either an output's shape follows from input values too and moved
        (then no output is bound at a learned shape any more: see _binds_learned_shapes),
        or the run failed for another reason, which the run again reports."""
        at_learned_shape, first = binding.at_learned_shape, len(self.signature.inputs)
        bound_shapes = [_bound_shape(binding, first + position) for position in at_learned_shape]
        for position in at_learned_shape:
            binding.bound[first + position] = _LATE
        binding.at_learned_shape = []
        binding.late = late = sorted([*late, *at_learned_shape])

        def stop_if_moved(shapes: list[OutputShape]) -> None:
            if [tuple(shapes[position].dimensions) for position in at_learned_shape] != bound_shapes:
                self._binds_learned_shapes = False
                self._learned_shapes.clear()

        try:
            shapes, timing = self._finish(binding, request, late, measure_timing, deadline_ns, start)
        except HalError as error:
            if error.output_shapes:
                stop_if_moved(error.output_shapes)
            raise
        stop_if_moved(shapes)
        return shapes, timing

    def _land(self, binding: _Binding, request: Request, late: list[int], shapes: list[OutputShape]) -> None:
        """Copy the outputs ORT allocated into the request (one memmove each from ORT's
        memory); learn the output shapes of these input shapes (_learn)."""
        native = binding.io._iobinding if hasattr(binding.io, "_iobinding") else binding.io
        values = native.get_outputs()
        outputs, specs = request.outputs, self.signature.outputs
        landed = []
        for position in late:
            value = values[position]
            if value.element_type() != self._element_types[position]:
                raise HalError(ErrorStatus.GENERAL_FAILURE, f"onnxruntime gave output {position} as ONNX type "
                                                            f"{value.element_type()}, not the operand's")
            dims = list(value.shape())
            argument = outputs[position]
            nbytes = _nbytes(specs[position], dims)
            shapes[position] = OutputShape(dims, argument.has_no_value or argument.location.length >= nbytes)
            landed.append((position, value, nbytes))
        if self._binds_learned_shapes and binding.input_shapes is not None:
            self._learn(binding.input_shapes, shapes)
        if not all(shape.is_sufficient for shape in shapes):
            raise HalError(ErrorStatus.OUTPUT_INSUFFICIENT_SIZE, "an output buffer is too small", shapes)
        views: dict[int, tuple[memoryview, int]] = {}
        for position, value, nbytes in landed:
            argument = outputs[position]
            if argument.has_no_value or not nbytes:
                continue
            address = self._located(request, views, argument.location, nbytes, True, f"output {position}")
            ctypes.memmove(address, value.data_ptr(), nbytes)

    def _learn(self, input_shapes: tuple, shapes: list[OutputShape]) -> None:
        """Remember the output shapes a run with these input shapes gave (_learned_shapes)."""
        if input_shapes in self._learned_shapes:
            return
        if len(self._learned_shapes) >= 64:  # a model run at ever new shapes: the latest kept
            self._learned_shapes.clear()
        outputs = tuple((tuple(shape.dimensions), _nbytes(spec, shape.dimensions))
                        for spec, shape in zip(self.signature.outputs, shapes, strict=True))
        self._learned_shapes[input_shapes] = _LearnedShapes(outputs, [OutputShape(list(shape.dimensions))
                                                                      for shape in shapes])

    def _run(self, binding: _Binding, deadline_ns: int | None) -> None:
        options = None
        if deadline_ns is not None:
            # ORT checks RunOptions.terminate before each node: the watchdog sets it at the deadline
            options = ort.RunOptions()
            _WATCHDOG.arm(deadline_ns, options)
        try:
            binding.run(binding.native, options)
        except Exception as error:
            if options is not None and options.terminate:
                raise HalError(ErrorStatus.MISSED_DEADLINE_TRANSIENT,
                               "the execution's deadline (or loop timeout) passed") from None
            raise _run_failure(error) from None
        finally:
            if options is not None:
                _WATCHDOG.disarm(options)


class OrtExecution(IExecution):
    """A request bound once (IExecution): a computation runs the session and nothing else
    but landing outputs whose shape only the run tells."""

    def __init__(self, prepared: OrtPreparedModel, binding: _Binding, request: Request, late: list[int],
                 measure_timing: bool, loop_timeout_ns: int | None = None) -> None:
        self._prepared = prepared
        #: a graph with a loop: every computation is bounded by the loop timeout
        self._loops = prepared.signature.loops
        self._loop_timeout_ns = loop_timeout_ns
        self._binding = binding
        self._request = request
        self._measure = measure_timing
        #: a run that measures nothing and lands nothing (every output's shape is known) is
        #: the session's run and the shapes: nothing else between two model runs
        self._plain = not late and not binding.at_learned_shape and not measure_timing and not binding.fresh_inputs \
            and not self._loops
        #: outputs ORT allocates, to be bound in the request's memory once a run told their
        #: shapes (see execute)
        self._rebind_when_learned = bool(late) and prepared._binds_learned_shapes
        self._run, self._io = binding.run, binding.native
        self._shapes = prepared._shapes

    def execute(self, deadline_ns: int | None = None) -> tuple[list[OutputShape], Timing]:
        if deadline_ns is None and self._plain:
            try:
                self._run(self._io, None)
            except Exception as error:
                raise _run_failure(error) from None
            return self._shapes.copy(), _UNTIMED
        if self._loops:
            deadline_ns = _loop_deadline(deadline_ns, self._loop_timeout_ns)
        start = time.monotonic_ns() if self._measure or deadline_ns is not None else 0
        if deadline_ns is not None and start > deadline_ns:
            raise HalError(ErrorStatus.MISSED_DEADLINE_TRANSIENT, "the deadline passed before execution")
        binding, prepared = self._binding, self._prepared
        if binding.fresh_inputs:
            prepared._bind(binding, self._request, keep=True)
        elif self._rebind_when_learned and binding.input_shapes in prepared._learned_shapes:
            # a run told the shapes of outputs ORT allocated: written in place from now on
            self._rebind_when_learned = False
            prepared._bind(binding, self._request, keep=True)
        return prepared._finish(binding, self._request, binding.late, self._measure, deadline_ns, start)
