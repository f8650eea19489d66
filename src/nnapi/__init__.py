"""nnapi: the Android Neural Networks API (NNAPI, feature level 8) in Python for Linux.

The public API mirrors the NDK one to one, in snake_case: Model, Compilation, Execution,
Burst, Memory, MemoryDesc, Event and Device, the enums of NeuralNetworksTypes.h, and
NnapiError (one subclass per result code). On top of it: ``load_tflite`` / ``load_model``
import model files, and ``Session`` runs one by tensor name in one call.
"""

from nnapi._version import __version__  # noqa: F401
from nnapi.burst import Burst  # noqa: E402
from nnapi.codes import (  # noqa: E402
    BYTE_SIZE_OF_CACHE_TOKEN,
    MAX_SIZE_OF_IMMEDIATELY_COPIED_VALUES,
    DeviceTypeCode,
    DurationCode,
    FeatureLevelCode,
    FuseCode,
    OperandCode,
    OperationCode,
    PaddingCode,
    PreferenceCode,
    PriorityCode,
    ResultCode,
)
from nnapi.compilation import Compilation  # noqa: E402
from nnapi.device import (  # noqa: E402
    Device,
    get_default_loop_timeout,
    get_device,
    get_device_count,
    get_devices,
    get_maximum_loop_timeout,
    get_runtime_feature_level,
)
from nnapi.errors import (  # noqa: E402
    BadDataError,
    BadStateError,
    DeadObjectError,
    IncompleteError,
    MissedDeadlinePersistentError,
    MissedDeadlineTransientError,
    NnapiError,
    OpFailedError,
    OutOfMemoryError,
    OutputInsufficientSizeError,
    ResourceExhaustedPersistentError,
    ResourceExhaustedTransientError,
    UnavailableDeviceError,
    UnexpectedNullError,
    UnmappableError,
)
from nnapi.event import Event  # noqa: E402
from nnapi.execution import DURATION_UNAVAILABLE, Execution  # noqa: E402
from nnapi.importers import ImportedModel, load_model  # noqa: E402
from nnapi.importers.tflite import load_tflite  # noqa: E402
from nnapi.memory import PROT_READ, PROT_WRITE, Memory  # noqa: E402
from nnapi.memory_desc import MemoryDesc  # noqa: E402
from nnapi.model import Model  # noqa: E402
from nnapi.operand import OperandType, SymmPerChannelQuantParams  # noqa: E402
from nnapi.session import Session, TensorInfo  # noqa: E402

__all__ = [
    "BYTE_SIZE_OF_CACHE_TOKEN",
    "DURATION_UNAVAILABLE",
    "MAX_SIZE_OF_IMMEDIATELY_COPIED_VALUES",
    "PROT_READ",
    "PROT_WRITE",
    "BadDataError",
    "BadStateError",
    "Burst",
    "Compilation",
    "DeadObjectError",
    "Device",
    "DeviceTypeCode",
    "DurationCode",
    "Event",
    "Execution",
    "FeatureLevelCode",
    "FuseCode",
    "ImportedModel",
    "IncompleteError",
    "Memory",
    "MemoryDesc",
    "MissedDeadlinePersistentError",
    "MissedDeadlineTransientError",
    "Model",
    "NnapiError",
    "OpFailedError",
    "OperandCode",
    "OperandType",
    "OperationCode",
    "OutOfMemoryError",
    "OutputInsufficientSizeError",
    "PaddingCode",
    "PreferenceCode",
    "PriorityCode",
    "ResourceExhaustedPersistentError",
    "ResourceExhaustedTransientError",
    "ResultCode",
    "Session",
    "SymmPerChannelQuantParams",
    "TensorInfo",
    "UnavailableDeviceError",
    "UnexpectedNullError",
    "UnmappableError",
    "get_default_loop_timeout",
    "get_device",
    "get_device_count",
    "get_devices",
    "get_maximum_loop_timeout",
    "get_runtime_feature_level",
    "load_model",
    "load_tflite",
]

# NNAPI_VLOG and NNAPI_TRACE take effect when the package is imported.
from nnapi import tracing as _tracing  # noqa: E402,F401
from nnapi import vlog as _vlog  # noqa: E402

_vlog.enable_from_environment()
