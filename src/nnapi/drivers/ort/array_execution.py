"""OrtPreparedModel's array paths (ArrayExecution, a mixin of it): execute_arrays and
execute_open_arrays, a request whose argument k is the whole of numpy array k (as the
runtime's usual Execution gives it), the arrays bound on the thread's binding found by
identity and only the others checked and bound; anything else goes through execute.

The methods read and write the state OrtPreparedModel.__init__ sets (the session, the
signature and its specs, the thread's binding, the learned shapes) and call its execute
and _run; they were OrtPreparedModel's own, moved here unchanged.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable

import numpy as np

from nnapi.drivers.ort.binding import _CPU_DEVICE, _REF, _UNTIMED, _Binding, _run_failure
from nnapi.drivers.ort.deadlines import _loop_deadline
from nnapi.drivers.ort.learned_shapes import _learned_placement
from nnapi.hal import DataLocation, ErrorStatus, HalError, OutputShape, Request, RequestArgument, Timing


class ArrayExecution:
    """execute_arrays, execute_open_arrays and array_executor of OrtPreparedModel."""

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
