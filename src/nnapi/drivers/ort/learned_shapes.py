"""Outputs of open shape (a dimension known only at run time) of OrtPreparedModel: ORT
allocates them and each run copies them into the request (_land), unless a run with the
same input shapes told their shapes: then they are bound in the request's memory at those
shapes and written in place (_learned_placement). LearnedShapes, a mixin of
OrtPreparedModel, learns the shapes and runs again with the outputs left to ORT where a
learned shape moved.

The methods read and write the state OrtPreparedModel.__init__ sets (the signature, the
learned shapes and whether they are bound) and call its _finish and _located; they were
OrtPreparedModel's own, moved here unchanged.
"""

from __future__ import annotations

import ctypes
from typing import NamedTuple

from nnapi.drivers.ort.binding import _LATE, _Binding, _bound_shape
from nnapi.drivers.ort.signature import _nbytes
from nnapi.hal import ErrorStatus, HalError, OutputShape, Request, Timing


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


class LearnedShapes:
    """The learned output shapes of OrtPreparedModel, and the landing of outputs ORT allocated."""

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
