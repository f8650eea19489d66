"""OrtPreparedModel and OrtExecution: binding a request, running the session, timing and
deadlines.

Beside it, as mixins of OrtPreparedModel (its methods, moved unchanged, on the state its
__init__ sets): array_execution.py (execute_arrays and execute_open_arrays, the runtime's
usual Execution's arrays found bound by identity) and learned_shapes.py (outputs whose
shapes only the run tells: landed from ORT's memory, their shapes learned per input shape
and bound in place from then on). binding.py holds the IOBinding and what a run reports;
deadlines.py the watchdog and the loop timeout.
"""

from __future__ import annotations

import ctypes
import threading
import time

import numpy as np
import onnxruntime as ort

from nnapi.drivers.ort.array_execution import ArrayExecution
from nnapi.drivers.ort.binding import (
    _CPU_DEVICE,
    _LATE,
    _REF,
    _UNTIMED,
    _address,
    _Binding,
    _onnx_type,
    _pool_at,
    _pool_bytes,
    _run_failure,
    _whole_array,
)
from nnapi.drivers.ort.deadlines import _WATCHDOG, _loop_deadline
from nnapi.drivers.ort.learned_shapes import LearnedShapes, _learned_placement, _LearnedShapes
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


class OrtPreparedModel(ArrayExecution, LearnedShapes, IPreparedModel):
    """An ORT session and the order of its inputs and outputs."""

    answers_checked = True  # the runtime's own driver (see IPreparedModel.answers_checked)

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
