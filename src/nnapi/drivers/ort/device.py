"""The ONNX Runtime devices (``nnapi-ort-cpu``, ``nnapi-ort-cuda``) and their prepared models.

Preparation lowers the HAL model to one ONNX graph (lowering.py) and opens an ORT session
on it; execution binds the request's pools to the session's inputs and outputs (zero
copy on the CPU provider: ORT reads the caller's input bytes and writes straight into the
output buffers when their shapes are known; the CUDA provider copies an input to the GPU
when it is bound, so its inputs are bound again before every run, and the outputs back
after the run) and runs it.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import json
import math
import os
import tempfile
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, TypeVar

import numpy as np
import onnxruntime as ort
from onnx import helper

from nnapi import vlog
from nnapi._version import __version__
from nnapi.codes import DEFAULT_LOOP_TIMEOUT_NS, DeviceTypeCode, FeatureLevelCode, OperationCode
from nnapi.drivers.ort import (
    calibration,
    control_flow,  # noqa: F401  (importing it registers its lowerings)
    detection,  # noqa: F401  (importing it registers its lowerings)
    gru_loop,  # noqa: F401  (importing it registers its lowerings)
    integer_div,  # noqa: F401  (importing it registers its lowerings)
    lookups,  # noqa: F401  (importing it registers its lowerings)
    mirror_pad_pack,  # noqa: F401  (importing it registers its lowerings)
    nms,  # noqa: F401  (importing it registers its lowerings)
    padded_depthwise,  # noqa: F401  (importing it registers its lowerings)
    quantized_recurrent,  # noqa: F401  (importing it registers its lowerings)
    quantized_resize,  # noqa: F401  (importing it registers its lowerings)
    quantized_softmax,  # noqa: F401  (importing it registers its lowerings)
    recurrent,  # noqa: F401  (importing it registers its lowerings)
    requantizing_quantize,  # noqa: F401  (importing it registers its lowerings)
    resize_pointwise,  # noqa: F401  (importing it registers its lowerings)
    runtime_parameters,  # noqa: F401  (importing it registers its lowerings)
    small_graphs,  # noqa: F401  (importing it registers its lowerings)
    transposed_dense,  # noqa: F401  (importing it registers its lowerings)
    uniform_prelu,  # noqa: F401  (importing it registers its lowerings)
)
from nnapi.drivers.ort.builder import Declined, check_failure
from nnapi.drivers.ort.lowering import lower_model, operation_support
from nnapi.drivers.ort.omitted import PatternKey, PatternPreparedModel, omittable_inputs
from nnapi.drivers.ort.session import ORT_LOG_SEVERITY, disabled_optimizers, session_options
from nnapi.drivers.ort.shapes import infer_temporary_shapes
from nnapi.drivers.ort.versions import onnxruntime_at_least
from nnapi.drivers.reference import supports_operation
from nnapi.hal import (
    Capabilities,
    DataLocation,
    ErrorStatus,
    ExecutionPreference,
    HalError,
    IDevice,
    IExecution,
    IPreparedModel,
    Model,
    OutputShape,
    PerformanceInfo,
    Priority,
    Request,
    RequestArgument,
    Timing,
)
from nnapi.hal.validation import validate_model
from nnapi.operand import dtype_of

ort.set_default_logger_severity(ORT_LOG_SEVERITY)

#: Cache file layout version; a cache written by another version is refused.
CACHE_VERSION = 2  # 2: the checksum covers the header too
_CACHE_MAGIC = b"NNAPI-ORT\0"


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
        signature = Signature.of(model, input_names, output_names)
        options = session_options()
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
            session = self._session(onnx_model.SerializeToString(), options)
            if optimized_path is not None:
                try:
                    with open(optimized_path, "rb") as handle:
                        payload = handle.read()
                    if optimized is not None:
                        optimized.append(payload)
                    if model_cache and token is not None:
                        _write_cache(model_cache[0], token, self, payload, {"signature": signature.to_json()})
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
        return OrtPreparedModel(self._session(payload, _cached_session_options()), signature)

    def _session(self, model_bytes: bytes, options: ort.SessionOptions) -> ort.InferenceSession:
        try:
            session = ort.InferenceSession(model_bytes, options, providers=[self.provider],
                                           disabled_optimizers=disabled_optimizers())
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


def _run_failure(error: Exception) -> HalError:
    """A failed run as the HAL reports it: the NNAPI rule a value given at run time broke
    where a lowering's check refused it, else ORT's own message."""
    rule = check_failure(error)
    return HalError(ErrorStatus.GENERAL_FAILURE, rule if rule is not None else f"onnxruntime: {error}")


def _loop_deadline(deadline_ns: int | None, loop_timeout_ns: int | None) -> int:
    """The time a run of a graph with a loop must end by: its deadline, or sooner the loop
    timeout (ANeuralNetworksExecution_setLoopTimeout; the default where none is given)
    from now. ORT's Loop has no timeout of its own, so the watchdog stops the whole run:
    a loop running past it fails with MISSED_DEADLINE_TRANSIENT, as the NDK specifies (the
    bound is the run's, a stricter one than each loop's alone where a graph has several)."""
    timeout = DEFAULT_LOOP_TIMEOUT_NS if loop_timeout_ns is None else loop_timeout_ns
    limit = time.monotonic_ns() + timeout
    return limit if deadline_ns is None else min(deadline_ns, limit)


def _check_deadline(deadline_ns: int | None, what: str) -> None:
    if deadline_ns is not None and time.monotonic_ns() > deadline_ns:
        raise HalError(ErrorStatus.MISSED_DEADLINE_TRANSIENT, f"the deadline passed before {what}")


#: the first onnxruntime whose IOBinding takes a bound buffer's element type as an ONNX
#: type number; before it only as a numpy dtype (else every bind failed: "Not a valid
#: numpy type", all of an execution on the 1.16-1.19 that pyproject accepts)
ONNX_TYPES_BIND_VERSION = (1, 20)
BINDS_ONNX_TYPES = onnxruntime_at_least(ONNX_TYPES_BIND_VERSION)


@dataclass
class IoSpec:
    name: str
    dtype: np.dtype
    dimensions: list[int]

    def __post_init__(self) -> None:
        #: what execution binds when a request names no other shape: the shape and its
        #: byte count, None when the model leaves a dimension (or the rank) unspecified
        self.shape = tuple(self.dimensions)
        self.nbytes = _nbytes(self, self.dimensions) if self.dimensions and all(self.dimensions) else None
        #: the strides of a C-contiguous array of that shape: a numpy array pool with this
        #: dtype, shape and strides is bound as the array itself (see _Binding)
        self.strides = _c_strides(self.shape, self.dtype.itemsize)
        #: the ONNX element type, as IOBinding takes it without looking the dtype up (the
        #: dtype itself, which it takes too, for one ONNX has no type for: binding fails),
        #: where onnxruntime takes one (BINDS_ONNX_TYPES); else the dtype
        self.element_type = self.dtype
        if BINDS_ONNX_TYPES:
            try:
                self.element_type = helper.np_dtype_to_tensor_dtype(self.dtype)
            except (ValueError, KeyError, TypeError):
                pass


@dataclass
class Signature:
    """The graph's inputs and outputs, in HAL order: what execution binds."""

    inputs: list[IoSpec]
    outputs: list[IoSpec]
    #: the graph has a loop (a WHILE): every run is bounded by the loop timeout
    loops: bool = False

    @classmethod
    def of(cls, model: Model, input_names: list[str], output_names: list[str]) -> Signature:
        main = model.main

        def specs(indexes: Sequence[int], names: list[str]) -> list[IoSpec]:
            return [IoSpec(name, dtype_of(main.operands[i].type), list(main.operands[i].dimensions))
                    for i, name in zip(indexes, names, strict=True)]
        loops = any(operation.type == OperationCode.WHILE
                    for subgraph in (main, *model.referenced) for operation in subgraph.operations)
        return cls(specs(main.input_indexes, input_names), specs(main.output_indexes, output_names), loops)

    def to_json(self) -> dict:
        def encode(specs: list[IoSpec]) -> list[list]:
            return [[s.name, s.dtype.str, s.dimensions] for s in specs]
        return {"inputs": encode(self.inputs), "outputs": encode(self.outputs), "loops": self.loops}

    @classmethod
    def from_json(cls, data: dict) -> Signature:
        def decode(items: list) -> list[IoSpec]:
            specs = []
            for name, dtype, dims in items:
                if not isinstance(name, str) or not all(isinstance(d, int) and d >= 0 for d in dims):
                    raise ValueError("bad signature entry")
                if not isinstance(dtype, str) or np.dtype(dtype).kind not in "biuf":
                    raise ValueError(f"bad signature entry: element type {dtype!r}")
                specs.append(IoSpec(name, np.dtype(dtype), list(dims)))
            return specs
        loops = data.get("loops", False)
        if not isinstance(loops, bool):
            raise ValueError("bad signature entry")
        return cls(decode(data["inputs"]), decode(data["outputs"]), loops)


# --- cache files ------------------------------------------------------------------------
def _cache_identity(device: OrtDevice) -> dict:
    return {"version": CACHE_VERSION, "nnapi": __version__, "onnxruntime": ort.__version__,
            "provider": device.provider}


def _checksum(header: dict, payload: bytes) -> str:
    """SHA-256 of the header's other fields (canonical JSON) and the payload: a file changed
    anywhere after writing, what execution binds included, is refused when read."""
    fields = {key: value for key, value in header.items() if key != "sha256"}
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode() + b"\0" + payload).hexdigest()


def _write_cache(fd: int, token: bytes, device: OrtDevice, payload: bytes, fields: dict) -> None:
    """The cache file: magic, header length, a JSON header (identity, token, ``fields``: a
    graph's signature, or what a patterns file holds; the checksum of all of it and the
    payload) and the payload."""
    header = {**_cache_identity(device), "token": bytes(token).hex(), **fields}
    header["sha256"] = _checksum(header, payload)
    encoded = json.dumps(header, sort_keys=True).encode()
    data = _CACHE_MAGIC + len(encoded).to_bytes(4, "little") + encoded + payload
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        os.ftruncate(fd, 0)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    except OSError as error:
        raise HalError(ErrorStatus.GENERAL_FAILURE, f"cannot write the cache file: {error}") from None


def _cache_refused(why: str) -> HalError:
    return HalError(ErrorStatus.GENERAL_FAILURE, f"cache refused: {why}")


_Decoded = TypeVar("_Decoded")


def _decoded(decode: Callable[[], _Decoded]) -> _Decoded:
    """``decode()``, a malformed cache header refused as a HalError (never a raw exception)."""
    try:
        return decode()
    except HalError:
        raise
    except (ValueError, KeyError, TypeError, IndexError, UnicodeDecodeError) as error:
        raise _cache_refused(f"bad header: {error}") from None


def _read_cache(fd: int, token: bytes, device: OrtDevice) -> tuple[dict, bytes]:
    """(header, payload) of a cache file written for this device, version and token, its
    payload's checksum checked; HalError otherwise."""
    try:
        size = os.fstat(fd).st_size
        os.lseek(fd, 0, os.SEEK_SET)
        chunks = []
        remaining = size
        while remaining > 0:
            chunk = os.read(fd, remaining)
            if not chunk:
                break
            chunks.append(chunk)
            remaining -= len(chunk)
        data = b"".join(chunks)
    except (OSError, TypeError, ValueError) as error:
        raise _cache_refused(f"cannot read it: {error}") from None
    if not data.startswith(_CACHE_MAGIC) or len(data) < len(_CACHE_MAGIC) + 4:
        raise _cache_refused("not an nnapi-ort cache file")
    start = len(_CACHE_MAGIC) + 4
    length = int.from_bytes(data[len(_CACHE_MAGIC):start], "little")

    def header_of() -> dict:
        header = json.loads(data[start:start + length])
        if not isinstance(header, dict):
            raise ValueError("header is not an object")
        for key, expected in _cache_identity(device).items():
            if header.get(key) != expected:
                raise _cache_refused(f"{key} is {header.get(key)!r}, expected {expected!r}")
        if header.get("token") != bytes(token).hex():
            raise _cache_refused("token mismatch")
        if header.get("sha256") != _checksum(header, data[start + length:]):
            raise _cache_refused("checksum mismatch")
        return header

    return _decoded(header_of), data[start + length:]


def _cached_session_options() -> ort.SessionOptions:
    """A cached graph is already optimized for this machine: loaded as it is."""
    options = session_options()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return options


class _PatternCache:
    """The cache file of a model whose inputs a request may omit: the HAL model (as the
    reference's cache holds one, ``cache_format``: nothing pickled) and, per pattern of
    omitted inputs prepared so far, its key, signature and optimized graph. Written when
    the model is prepared and again as each new pattern is (through a duplicate of the
    runtime's descriptor); a failed write leaves the cache as it was (a later compilation
    then prepares what it lacks), never the preparation or the run."""

    def __init__(self, device: OrtDevice, model: Model, fd: int, token: bytes,
                 graphs: dict[PatternKey, tuple[Signature, bytes]] | None) -> None:
        from nnapi.drivers.cache_format import pack

        self._device = device
        self._token = bytes(token)
        self._graphs = dict(graphs or {})
        self._lock = threading.Lock()
        self._model_bytes, self._data_bytes = pack(model, self._token)
        try:
            self._fd: int | None = os.dup(fd)
        except OSError:
            self._fd = None
            return
        weakref.finalize(self, os.close, self._fd)
        if graphs is None:  # a new cache: the model now, its patterns as they come
            self._write()

    def add(self, key: PatternKey, signature: Signature, graph: bytes) -> None:
        with self._lock:
            self._graphs[key] = (signature, graph)
            self._write()

    def _write(self) -> None:
        if self._fd is None:
            return
        patterns = [{"omitted": sorted(key[0]), "dimensions": [[p, list(d)] for p, d in key[1]],
                     "signature": signature.to_json(), "bytes": len(graph)}
                    for key, (signature, graph) in self._graphs.items()]
        payload = b"".join([self._model_bytes, self._data_bytes, *(graph for _, graph in self._graphs.values())])
        fields = {"kind": "patterns", "model_bytes": len(self._model_bytes), "data_bytes": len(self._data_bytes),
                  "patterns": patterns}
        try:
            _write_cache(self._fd, self._token, self._device, payload, fields)
        except HalError as error:
            vlog.driver.info("%s: the cache file was not written: %s", self._device.name, error)


def _decode_patterns(header: dict, payload: bytes, token: bytes
                     ) -> tuple[Model, dict[PatternKey, tuple[Signature, bytes]]]:
    """The HAL model and the patterns' graphs of a patterns cache file, every field checked."""
    from nnapi.drivers.cache_format import unpack

    def count(value: object) -> int:
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ValueError(f"bad size {value!r}")
        return value

    def decode() -> tuple[int, int, list[tuple[PatternKey, Signature, int]]]:
        patterns = []
        for entry in header["patterns"]:
            omitted = frozenset(count(p) for p in entry["omitted"])
            dimensions = tuple((count(p), tuple(count(d) for d in dims)) for p, dims in entry["dimensions"])
            patterns.append(((omitted, dimensions), Signature.from_json(entry["signature"]), count(entry["bytes"])))
        return count(header["model_bytes"]), count(header["data_bytes"]), patterns

    model_size, data_size, patterns = _decoded(decode)
    if model_size + data_size + sum(size for _, _, size in patterns) != len(payload):
        raise _cache_refused("the sizes in the header do not add up to the file's")
    model = unpack(payload[:model_size], payload[model_size:model_size + data_size], token)
    graphs = {}
    offset = model_size + data_size
    for key, signature, size in patterns:
        graphs[key] = (signature, payload[offset:offset + size])
        offset += size
    return model, graphs


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


class _Watchdog:
    """One thread for every run with a deadline (a timer thread per run cost ~100 us to
    start): it sets a run's RunOptions.terminate when its deadline passes, and ORT stops
    before the next node. A run that ends first disarms its entry; the flag set late on
    a finished run is harmless (its RunOptions is not used again)."""

    def __init__(self) -> None:
        self._condition = threading.Condition()
        self._armed: dict[int, tuple[int, ort.RunOptions]] = {}  # id(options) -> (deadline, options)
        self._thread: threading.Thread | None = None
        #: the time the thread sleeps until (None: until notified): a deadline after it
        #: needs no wake-up (the thread looks again then), which spares a run bounded by
        #: the loop timeout the thread switch a notify costs (~60 us between model runs)
        self._waking: int | None = None
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=self._forget)  # the thread does not cross a fork

    def _forget(self) -> None:
        self._condition = threading.Condition()
        self._armed.clear()
        self._thread = None
        self._waking = None

    def arm(self, deadline_ns: int, options: ort.RunOptions) -> None:
        if deadline_ns <= time.monotonic_ns():
            options.terminate = True
            return
        with self._condition:
            self._armed[id(options)] = (deadline_ns, options)
            if self._thread is None:
                self._thread = threading.Thread(target=self._watch, name="nnapi-ort-deadlines", daemon=True)
                self._thread.start()
            if self._waking is None or deadline_ns < self._waking:
                self._waking = deadline_ns  # (the thread sets it again when it looks)
                self._condition.notify()

    def disarm(self, options: ort.RunOptions) -> None:
        with self._condition:
            self._armed.pop(id(options), None)

    def _watch(self) -> None:
        condition = self._condition
        with condition:
            while True:
                now = time.monotonic_ns()
                for key, (deadline, options) in list(self._armed.items()):
                    if deadline <= now:
                        options.terminate = True
                        del self._armed[key]
                earliest = min((deadline for deadline, _ in self._armed.values()), default=None)
                self._waking = earliest
                condition.wait(None if earliest is None else max(earliest - now, 0) / 1e9)


_WATCHDOG = _Watchdog()


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


def _nbytes(spec: IoSpec, dims: list[int]) -> int:
    return math.prod(dims) * spec.dtype.itemsize


def _whole_array(pool: object, spec: IoSpec, location: DataLocation) -> bool:
    """Whether ``pool`` is a numpy array that is exactly the argument at ``location``: the
    spec's dtype, shape and C-contiguous strides, from its first byte."""
    return pool.__class__ is np.ndarray and pool.dtype is spec.dtype and pool.shape == spec.shape \
        and pool.strides == spec.strides and not location.offset


def _c_strides(shape: tuple[int, ...], itemsize: int) -> tuple[int, ...]:
    strides = []
    step = itemsize
    for dim in reversed(shape):
        strides.append(step)
        step *= max(dim, 1)
    return tuple(reversed(strides))
