"""The ONNX Runtime devices (``nnapi-ort-cpu``, ``nnapi-ort-cuda``): OrtDevice, and an overview.

Preparation lowers the HAL model to one ONNX graph (lowering.py) and opens an ORT session
on it; execution binds the request's pools to the session's inputs and outputs (zero
copy on the CPU provider: ORT reads the caller's input bytes and writes straight into the
output buffers when their shapes are known; the CUDA provider copies an input to the GPU
when it is bound, so its inputs are bound again before every run, and the outputs back
after the run) and runs it.

This module holds OrtDevice (capabilities, support, preparation, from the cache too);
beside it: compilation_cache.py (the cache files), signature.py (what a graph binds),
binding.py (a request's memory bound to an IOBinding), prepared_model.py
(OrtPreparedModel, OrtExecution; its array paths in array_execution.py, its outputs of
open shape in learned_shapes.py) and deadlines.py (the deadline watchdog).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import threading
from collections.abc import Sequence

import onnx
import onnxruntime as ort

from nnapi import vlog
from nnapi._version import __version__
from nnapi.codes import DeviceTypeCode, FeatureLevelCode, OperationCode
from nnapi.drivers.ort import calibration
from nnapi.drivers.ort.builder import Declined
from nnapi.drivers.ort.compilation_cache import (
    CACHE_VERSION,  # noqa: F401  (importable from here as before)
    _cache_refused,
    _cached_session_options,
    _decode_patterns,
    _decoded,
    _PatternCache,
    _read_cache,
    _write_cache,
)
from nnapi.drivers.ort.deadlines import _check_deadline
from nnapi.drivers.ort.lowering import lower_model, operation_support
from nnapi.drivers.ort.omitted import PatternKey, PatternPreparedModel, omittable_inputs
from nnapi.drivers.ort.prepared_model import (
    OrtExecution,  # noqa: F401  (importable from here as before)
    OrtPreparedModel,
)
from nnapi.drivers.ort.session import ORT_LOG_SEVERITY, disabled_optimizers, plans_memory, session_options
from nnapi.drivers.ort.shapes import infer_temporary_shapes
from nnapi.drivers.ort.signature import Signature
from nnapi.drivers.reference import supports_operation
from nnapi.hal import (
    Capabilities,
    ErrorStatus,
    ExecutionPreference,
    HalError,
    IDevice,
    IPreparedModel,
    Model,
    PerformanceInfo,
    Priority,
)
from nnapi.hal.validation import validate_model

ort.set_default_logger_severity(ORT_LOG_SEVERITY)


class OrtDevice(IDevice):
    """One ONNX Runtime execution provider as an NNAPI device."""

    feature_level = FeatureLevelCode.FEATURE_LEVEL_8

    def __init__(self, provider: str = "CPUExecutionProvider", name: str = "nnapi-ort-cpu",
                 device_type: DeviceTypeCode = DeviceTypeCode.DEVICE_CPU) -> None:
        self.name = name
        self.provider = provider
        self.device_type = device_type
        self.version_string = f"{__version__} (onnxruntime {ort.__version__})"
        self._capabilities: Capabilities | None = None
        self._lock = threading.Lock()

    # --- queries -------------------------------------------------------------------------
    def get_capabilities(self) -> Capabilities:
        """Measured once per machine against the reference (see calibration.py). A provider
        that cannot run here (onnxruntime-gpu without its CUDA libraries: every session
        lands on the CPU) measures nothing: its figures are infinite, so the partitioner
        never picks it, and preparing on it fails with the reason."""
        with self._lock:
            if self._capabilities is None:
                try:
                    self._capabilities = calibration.capabilities(self)
                except HalError:
                    never = PerformanceInfo(float("inf"), float("inf"))
                    self._capabilities = Capabilities.uniform(never)
            return self._capabilities

    def get_unsupported_reasons(self, model: Model) -> list[str | None]:
        return self._unsupported_reasons(model, infer_temporary_shapes(model))

    @staticmethod
    def _unsupported_reasons(model: Model, shaped: Model) -> list[str | None]:
        """Why each operation of ``model`` is declined (None: supported), judged on
        ``shaped`` = infer_temporary_shapes(model), as lower_model lowers it (the same
        operations)."""
        reasons: list[str | None] = []
        for operation in model.main.operations:
            if not supports_operation(model, model.main, operation):
                reasons.append("not a valid operation (the reference's validation rejects it)")
            else:
                reasons.append(operation_support(shaped, operation))
        return reasons

    def get_supported_operations(self, model: Model) -> list[bool]:
        return [reason is None for reason in self.get_unsupported_reasons(model)]

    def get_number_of_cache_files_needed(self) -> tuple[int, int]:
        return (1, 0)

    # --- preparation -------------------------------------------------------------------
    def _check_supported(self, model: Model) -> Model:
        """INVALID_ARGUMENT naming the first operation this device declines, and why;
        else infer_temporary_shapes(model), which the check needed, for lower_model."""
        shaped = infer_temporary_shapes(model)
        reasons = self._unsupported_reasons(model, shaped)
        for operation, reason in zip(model.main.operations, reasons):
            if reason is not None:
                raise HalError(ErrorStatus.INVALID_ARGUMENT,
                               f"{self.name} does not support {OperationCode(operation.type).name}: {reason}")
        return shaped

    def prepare_model(self, model: Model, preference: ExecutionPreference = ExecutionPreference.FAST_SINGLE_ANSWER,
                      priority: Priority = Priority.MEDIUM, deadline_ns: int | None = None,
                      model_cache: Sequence[int] = (), data_cache: Sequence[int] = (),
                      token: bytes | None = None) -> IPreparedModel:
        validate_model(model)
        _check_deadline(deadline_ns, "preparation")
        shaped = self._check_supported(model)
        omittable = omittable_inputs(model)
        if omittable:
            # a graph per pattern of omitted inputs, when a request shows it (omitted.py)
            return self._prepare_patterns(model, omittable, model_cache, token)
        return self._prepare_graph(model, model_cache, token, shaped=shaped)

    def _prepare_graph(self, model: Model, model_cache: Sequence[int] = (), token: bytes | None = None,
                       optimized: list[bytes] | None = None, shaped: Model | None = None) -> OrtPreparedModel:
        """``model`` lowered to one ONNX graph and opened as a session (written to the
        cache when asked; its optimized bytes appended to ``optimized`` when given;
        ``shaped``: infer_temporary_shapes(model) when the caller has it)."""
        try:
            onnx_model, input_names, output_names = lower_model(model, shaped=shaped)
        except Declined as reason:
            raise HalError(ErrorStatus.INVALID_ARGUMENT, f"{self.name}: {reason}") from None
        signature = Signature.of(model, input_names, output_names, onnx_model.graph)
        # (the shaped model: a temporary declared of unknown size that the shapes fix
        # counts as the size it has)
        mem_pattern = plans_memory(shaped if shaped is not None else model)
        options = session_options(mem_pattern=mem_pattern)
        optimized_path = None
        if (model_cache and token is not None) or optimized is not None:
            # (the HAL: an error saving to the cache must not fail the preparation, here
            # nor below: the model is then prepared and not cached)
            try:
                handle, optimized_path = tempfile.mkstemp(suffix=".onnx", prefix="nnapi-ort-")
                os.close(handle)
                options.optimized_model_filepath = optimized_path
            except OSError as error:
                vlog.driver.info("%s: not cached (no temporary file for the optimized model: %s)", self.name, error)
        try:
            session = self._session(onnx_model.SerializeToString(), options, onnx_model.graph)
            if optimized_path is not None:
                try:
                    with open(optimized_path, "rb") as handle:
                        payload = handle.read()
                    if optimized is not None:
                        optimized.append(payload)
                    if model_cache and token is not None:
                        _write_cache(model_cache[0], token, self, payload,
                                     {"signature": signature.to_json(), "mem_pattern": mem_pattern})
                except (OSError, HalError) as error:
                    vlog.driver.info("%s: the cache file was not written: %s", self.name, error)
        finally:
            if optimized_path is not None:
                with contextlib.suppress(OSError):
                    os.unlink(optimized_path)
        return OrtPreparedModel(session, signature)

    def _prepare_patterns(self, model: Model, omittable: frozenset[int], model_cache: Sequence[int] = (),
                          token: bytes | None = None, cached: dict[PatternKey, tuple[Signature, bytes]] | None = None
                          ) -> PatternPreparedModel:
        """A prepared model of a graph per pattern of omitted inputs. With a cache file, the
        file holds the HAL model and every pattern's optimized graph prepared so far (the
        file's descriptor duplicated, as the HAL allows, and written again as each new
        pattern is prepared): a compilation from it opens the patterns seen before from
        their optimized graphs (``cached``) and lowers only new ones."""
        saver = None
        if model_cache and token is not None:
            try:
                saver = _PatternCache(self, model, model_cache[0], token, cached)
            except (HalError, OSError, ValueError, TypeError) as error:  # not cached: still prepared
                vlog.driver.info("%s: the cache file was not written: %s", self.name, error)
        cached = dict(cached or {})

        def prepare(variant: Model, key: PatternKey) -> IPreparedModel:
            if key in cached:
                signature, payload = cached.pop(key)
                try:
                    return OrtPreparedModel(self._session(payload, _cached_session_options()), signature)
                except HalError:
                    pass  # lowered afresh below
            sink: list[bytes] | None = [] if saver is not None else None
            prepared = self._prepare_graph(variant, optimized=sink)
            if saver is not None and sink:
                saver.add(key, prepared.signature, sink[0])
            return prepared

        return PatternPreparedModel(model, omittable, prepare)

    def prepare_model_from_cache(self, model_cache: Sequence[int], data_cache: Sequence[int], token: bytes,
                                 deadline_ns: int | None = None) -> IPreparedModel:
        _check_deadline(deadline_ns, "preparation")
        if len(model_cache) != 1:
            raise HalError(ErrorStatus.INVALID_ARGUMENT, f"expected 1 model cache file, got {len(model_cache)}")
        header, payload = _read_cache(model_cache[0], token, self)
        if header.get("kind", "graph") == "patterns":
            model, graphs = _decode_patterns(header, payload, token)
            validate_model(model)
            self._check_supported(model)
            omittable = omittable_inputs(model)
            if not omittable:
                raise _cache_refused("the cached model has no input a request may omit")
            return self._prepare_patterns(model, omittable, model_cache, token, graphs)
        signature = _decoded(lambda: Signature.from_json(header["signature"]))
        options = _cached_session_options(mem_pattern=header.get("mem_pattern") is True)
        return OrtPreparedModel(self._session(payload, options), signature)

    def _session(self, model_bytes: bytes, options: ort.SessionOptions,
                 graph: onnx.GraphProto | None = None) -> ort.InferenceSession:
        """A session of ``model_bytes`` (``graph``: its graph, which decides the optimizers
        disabled; None for a cached graph, already optimized and loaded as it is)."""
        try:
            session = ort.InferenceSession(model_bytes, options, providers=[self.provider],
                                           disabled_optimizers=disabled_optimizers(graph))
        except Exception as error:  # ORT's own exception types carry no status
            raise HalError(ErrorStatus.GENERAL_FAILURE, f"{self.name}: onnxruntime refused the model: "
                                                        f"{error}") from None
        started = session.get_providers()
        if not started or started[0] != self.provider:
            # onnxruntime falls back to the CPU (with a warning) when a provider cannot start:
            # a GPU device must not run on the CPU and say otherwise
            raise HalError(ErrorStatus.GENERAL_FAILURE, f"{self.name}: onnxruntime did not start {self.provider} "
                                                        f"here (the session runs on {', '.join(started)})")
        return session
