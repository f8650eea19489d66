"""A request's memory bound to an ORT IOBinding: pools as bytes and addresses, the binding
and what is bound to it, onnxruntime's native binding and run methods where it has them,
and what a run reports (its failure, no timing).
"""

from __future__ import annotations

import ctypes
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import onnxruntime as ort
from onnx import helper

from nnapi.drivers.ort.builder import check_failure
from nnapi.drivers.ort.signature import IoSpec, Signature
from nnapi.hal import DataLocation, ErrorStatus, HalError, Request, Timing


def _run_failure(error: Exception) -> HalError:
    """A failed run as the HAL reports it: the NNAPI rule a value given at run time broke
    where a lowering's check refused it, else ORT's own message."""
    rule = check_failure(error)
    return HalError(ErrorStatus.GENERAL_FAILURE, rule if rule is not None else f"onnxruntime: {error}")


_LATE = object()  # an output bound for ORT to allocate (its shape known only after the run)
_REF = weakref.ref  # what an argument bound as a numpy array is remembered by (see _Binding)
_UNTIMED = Timing()  # what a run without measure_timing reports (shared, never mutated)


def _pool_bytes(pool: object, writable: bool) -> memoryview:
    buffer: Any = getattr(pool, "buffer", pool)  # a Memory's bytes, or the pool itself
    try:
        view = memoryview(buffer)
    except TypeError:
        raise HalError(ErrorStatus.INVALID_ARGUMENT, f"pool of type {type(pool).__name__} is not memory of "
                                                     "this device") from None
    if writable and view.readonly:
        raise HalError(ErrorStatus.INVALID_ARGUMENT, "an output pool is read-only")
    if view.format == "B" and view.ndim == 1 and view.c_contiguous:
        return view
    if not view.c_contiguous:
        raise HalError(ErrorStatus.INVALID_ARGUMENT, "a pool is not contiguous memory")
    return view.cast("B")


def _address(view: memoryview) -> int:
    """The address of a pool's first byte: ctypes reads it without building an array
    (a writable buffer); numpy for a read-only or empty one."""
    if not view.readonly and view.nbytes:
        return ctypes.addressof(ctypes.c_char.from_buffer(view))
    return np.frombuffer(view, np.uint8).ctypes.data


class _Binding:
    """An IOBinding and what is bound to it: per input, then per output, the (address, shape)
    bound, a weak reference to the numpy array bound as an array (while it is alive its
    bytes stay where they were bound: the same array needs nothing; one freed is never
    run, a new array being bound first; weak, so that a loop's previous input is freed
    when the loop drops it, not inside the next execution), ``None`` for nothing yet or
    ``_LATE`` (bound for ORT to allocate, at each run); ``views`` keeps the pools of a
    bound request alive and exported (a bytearray cannot be resized under a reusable
    execution)."""

    __slots__ = ("io", "bound", "views", "run", "native", "bind_input", "bind_output", "bind_array", "fresh_inputs",
                 "again", "partner", "at_learned_shape", "input_shapes", "array_shapes", "late")

    def __init__(self, session: ort.InferenceSession, signature: Signature, fresh_inputs: bool = False) -> None:
        self.io = io = session.io_binding()
        #: every input bound again before every run: ORT copies an input the session's
        #: provider reads from other memory (the CUDA provider, host memory) when it is
        #: bound, so an input changed in place since would run with its old values
        self.fresh_inputs = fresh_inputs
        #: ``run(native, run_options)`` runs the session on this binding
        self.run, self.native = _run_with_iobinding(session, io)
        #: ``bind_input(name, device, element_type, shape, address)`` and bind_output alike
        #: (``bind_output(name, device)``: for ORT to allocate):
        #: the C++ binding's own methods where onnxruntime's IOBinding holds one (its Python
        #: methods build an OrtDevice per call: ~30 us per argument bound between two model
        #: runs), with the CPU device made once; else the public methods
        #: ``bind_array(name, array)``: an input bound as a contiguous numpy array of the
        #: input's dtype and shape, its bytes in place, as ORT's own ``run`` takes an input
        #: (ORT reads type and address in C++: between two model runs that costs ~half of
        #: reading the address in Python first). The native method holds no reference to
        #: the array (the weak one in ``bound`` tells whether it is still the one bound);
        #: onnxruntime's public bind_cpu_input, where its IOBinding holds no native method,
        #: keeps the array until the next is bound in its place.
        native = getattr(io, "_iobinding", None)
        if _CPU_DEVICE is not None and callable(getattr(native, "bind_input", None)) \
                and callable(getattr(native, "bind_output", None)):
            self.bind_input, self.bind_output = native.bind_input, native.bind_output
            self.bind_array = native.bind_input
        else:
            self.bind_input = lambda name, _device, *typed: io.bind_input(name, "cpu", 0, *typed)
            self.bind_output = lambda name, _device, *typed: io.bind_output(name, "cpu", 0, *typed)
            self.bind_array = io.bind_cpu_input
        # every output bound once, in position order: ORT lists the outputs (get_outputs) in
        # the order their names were first bound, a later binding of a name taking its place,
        # and _land reads the outputs ORT allocates by position (a model whose outputs of
        # unknown shape come before one bound to the request's memory read another output)
        for spec in signature.outputs:
            self.bind_output(spec.name, _CPU_DEVICE)
        #: per input, then per output: what is bound there (see the class docstring)
        self.bound: list = [None] * (len(signature.inputs) + len(signature.outputs))
        self.views: list = []
        #: (execute_arrays) the arrays bound ran again with nothing bound, and the
        #: thread's second binding, holding the arrays kept from before (see _other)
        self.again = False
        self.partner: _Binding | None = None
        #: the outputs of open shape bound in the request's memory at the shape an earlier
        #: run with the same input shapes gave (see OrtPreparedModel._learned_shapes)
        self.at_learned_shape: Sequence[int] = ()
        #: the shapes of the bound inputs of open shape: what the output shapes are learned
        #: by (None until a request of a model with an output of open shape is bound)
        self.input_shapes: tuple | None = None
        #: the outputs ORT allocates at each run (see _bind)
        self.late: list[int] = []
        #: (execute_open_arrays) per input, then output: the shape an array was bound at
        self.array_shapes: list = [None] * len(self.bound)


def _cpu_device() -> object | None:
    """onnxruntime's C++ OrtDevice for host memory (what IOBinding.bind_input makes of
    "cpu", 0), or None where its Python classes do not offer one."""
    try:
        return ort.OrtDevice.make("cpu", 0)._get_c_device()
    except Exception:  # noqa: BLE001 - another onnxruntime: the public methods are used
        return None


_CPU_DEVICE = _cpu_device()


def _run_with_iobinding(session: ort.InferenceSession, io: ort.IOBinding) -> tuple[Callable, object]:
    """(run, binding) such that ``run(binding, None)`` runs the session on ``io``: the
    C++ session's own method where onnxruntime's Python classes hold one as they do
    (InferenceSession.run_with_iobinding only forwards to it: a Python frame fewer between
    two model runs, ~3 us there), else the public method."""
    native, native_io = getattr(session, "_sess", None), getattr(io, "_iobinding", None)
    run = getattr(native, "run_with_iobinding", None)
    if callable(run) and native_io is not None:
        return run, native_io
    return session.run_with_iobinding, io


def _onnx_type(dtype: np.dtype) -> int | None:
    try:
        return helper.np_dtype_to_tensor_dtype(dtype)
    except (ValueError, KeyError, TypeError):
        return None


def _bound_shape(binding: _Binding, slot: int) -> tuple[int, ...]:
    """The shape an output is bound at: by address (_bind) or as an array (execute_open_arrays)."""
    entry = binding.bound[slot]
    return entry[1] if entry.__class__ is tuple else binding.array_shapes[slot]


def _pool_at(request: Request, index: int) -> object:
    if not 0 <= index < len(request.pools):
        raise HalError(ErrorStatus.INVALID_ARGUMENT, f"pool {index} does not exist")
    return request.pools[index]


def _whole_array(pool: object, spec: IoSpec, location: DataLocation) -> bool:
    """Whether ``pool`` is a numpy array that is exactly the argument at ``location``: the
    spec's dtype, shape and C-contiguous strides, from its first byte."""
    return pool.__class__ is np.ndarray and pool.dtype is spec.dtype and pool.shape == spec.shape \
        and pool.strides == spec.strides and not location.offset
