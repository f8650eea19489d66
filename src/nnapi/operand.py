"""Operand types: ANeuralNetworksOperandType and ANeuralNetworksSymmPerChannelQuantParams.

Also the facts about each OperandCode that every layer needs: the numpy dtype of its
elements, whether it is a tensor, and the NDK's rules for a valid operand type.

An operand type may also be a vendor extension's (``prefix << 16 | type``, from
``Model.get_extension_operand_type``): whether it is a tensor and its element size come
from the extension's declaration (nnapi.runtime.type_manager); its elements are opaque
bytes (numpy dtype ``V<byte_size>``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from nnapi.codes import OperandCode
from nnapi.errors import BadDataError
from nnapi.runtime import type_manager
from nnapi.runtime.type_manager import ExtensionOperandCode

T = OperandCode

#: The numpy dtype that stores one element of each operand type.
DTYPES: dict[OperandCode, np.dtype] = {
    T.FLOAT32: np.dtype(np.float32),
    T.INT32: np.dtype(np.int32),
    T.UINT32: np.dtype(np.uint32),
    T.TENSOR_FLOAT32: np.dtype(np.float32),
    T.TENSOR_INT32: np.dtype(np.int32),
    T.TENSOR_QUANT8_ASYMM: np.dtype(np.uint8),
    T.BOOL: np.dtype(np.bool_),
    T.TENSOR_QUANT16_SYMM: np.dtype(np.int16),
    T.TENSOR_FLOAT16: np.dtype(np.float16),
    T.TENSOR_BOOL8: np.dtype(np.bool_),
    T.FLOAT16: np.dtype(np.float16),
    T.TENSOR_QUANT8_SYMM_PER_CHANNEL: np.dtype(np.int8),
    T.TENSOR_QUANT16_ASYMM: np.dtype(np.uint16),
    T.TENSOR_QUANT8_SYMM: np.dtype(np.int8),
    T.TENSOR_QUANT8_ASYMM_SIGNED: np.dtype(np.int8),
}

SCALAR_TYPES = frozenset({T.FLOAT32, T.INT32, T.UINT32, T.BOOL, T.FLOAT16})
TENSOR_TYPES = frozenset(t for t in OperandCode if t.name.startswith("TENSOR_"))

#: Quantized types with a scale and a zero point, and the range of their zero point.
ZERO_POINT_RANGES: dict[OperandCode, tuple[int, int]] = {
    T.TENSOR_QUANT8_ASYMM: (0, 255),
    T.TENSOR_QUANT8_ASYMM_SIGNED: (-128, 127),
    T.TENSOR_QUANT16_ASYMM: (0, 65535),
    T.TENSOR_QUANT8_SYMM: (0, 0),
    T.TENSOR_QUANT16_SYMM: (0, 0),
}
QUANTIZED_TYPES = frozenset(ZERO_POINT_RANGES) | {T.TENSOR_QUANT8_SYMM_PER_CHANNEL}


def is_tensor(code: OperandCode | int) -> bool:
    if code in TENSOR_TYPES:
        return True
    if code < type_manager.EXTENSION_TYPE_BASE:
        return False
    info = type_manager.operand_type_info(code)
    return info is not None and info.is_tensor


def is_extension(code: OperandCode | int) -> bool:
    """True for a vendor extension's operand type."""
    return code >= type_manager.EXTENSION_TYPE_BASE


def dtype_of(code: OperandCode | int) -> np.dtype:
    """The numpy dtype of one element of ``code`` (opaque bytes, ``V<n>``, for an extension
    type); BAD_DATA for MODEL, which has none, and for an unknown extension type."""
    try:
        return DTYPES[code]
    except KeyError:
        pass
    if is_extension(code):
        info = type_manager.operand_type_info(code)
        if info is not None:
            return np.dtype((np.void, info.byte_size))
    name = code.name if hasattr(code, "name") else str(code)
    raise BadDataError(f"operand type {name} has no element data type") from None


def value_byte_size(code: OperandCode | int, dimensions: Sequence[int]) -> int:
    """Bytes of a value of type ``code`` with ``dimensions`` (a scalar when there are none)."""
    return math.prod(dimensions) * dtype_of(code).itemsize


def scalar_value(code: OperandCode, data: bytes | memoryview) -> int | float | bool | None:
    """The Python value of a scalar operand stored as ``data``; None when ``code`` is a
    tensor type or ``data`` is not exactly one element (the caller checks sizes)."""
    if code in TENSOR_TYPES or code not in DTYPES:
        return None
    dtype = DTYPES[code]
    if len(data) != dtype.itemsize:
        return None
    return np.frombuffer(data, dtype=dtype)[0].item()


def constant_value(op_type: OperandType, data: bytes | memoryview) -> int | float | bool | np.ndarray | None:
    """The value of a constant operand stored as ``data``: a scalar's Python value, or a
    fully specified tensor's read-only array; None when ``data`` does not hold exactly
    that (the caller checks sizes)."""
    if op_type.type not in TENSOR_TYPES:
        return scalar_value(op_type.type, data)
    if op_type.type not in DTYPES or not op_type.is_fully_specified or len(data) != op_type.byte_size():
        return None
    array = np.frombuffer(data, dtype=DTYPES[op_type.type]).reshape(op_type.dimensions)
    array.flags.writeable = False
    return array


@dataclass(frozen=True)
class SymmPerChannelQuantParams:
    """ANeuralNetworksSymmPerChannelQuantParams: one scale per slice along ``channel_dim``."""

    channel_dim: int
    scales: tuple[float, ...]

    def __init__(self, channel_dim: int, scales: Sequence[float]) -> None:
        try:
            object.__setattr__(self, "channel_dim", int(channel_dim))
            object.__setattr__(self, "scales", tuple(float(s) for s in scales))
        except (TypeError, ValueError, OverflowError):
            raise BadDataError(f"per-channel params need an int channel_dim and float scales, got "
                               f"{channel_dim!r}, {scales!r}") from None


class _cached:  # noqa: N801 - used as a decorator, like functools.cached_property
    """``functools.cached_property`` without its lock: Python 3.11's takes an RLock at the
    first read of every instance (~5 us), which a compilation pays for each of its many
    fresh OperandTypes; these values are pure functions of a frozen type, so two threads
    computing one at once store equal values."""

    def __init__(self, function) -> None:
        self.function = function
        self.name = function.__name__
        self.__doc__ = function.__doc__

    def __set_name__(self, owner, name: str) -> None:
        self.name = name

    def __get__(self, instance, owner=None):
        if instance is None:
            return self
        value = instance.__dict__[self.name] = self.function(instance)
        return value


@dataclass(frozen=True)
class OperandType:
    """ANeuralNetworksOperandType: an operand's type code, dimensions and quantization.

    ``dimensions`` uses 0 for an unspecified dimension; an empty tuple for a tensor means
    its rank is unspecified (feature level 3 and later), and is required for scalars.
    """

    type: OperandCode | ExtensionOperandCode
    dimensions: tuple[int, ...] = ()
    scale: float = 0.0
    zero_point: int = 0
    channel_quant: SymmPerChannelQuantParams | None = field(default=None, compare=True)

    def __init__(
        self,
        type: int,  # noqa: A002 - the NDK field is called type
        dimensions: Sequence[int] | None = None,
        scale: float = 0.0,
        zero_point: int = 0,
        channel_quant: SymmPerChannelQuantParams | None = None,
    ) -> None:
        code: OperandCode | ExtensionOperandCode
        if type.__class__ is OperandCode:  # the common case, without the enum's lookup
            code = type
        else:
            try:
                code = OperandCode(int(type))
            except (ValueError, TypeError, OverflowError):
                code = _extension_code(type)
        try:
            dims = tuple(map(int, dimensions)) if dimensions is not None else ()
        except (TypeError, ValueError, OverflowError):
            raise BadDataError(f"dimensions must be a sequence of ints, got {dimensions!r}") from None
        try:
            scale = float(scale)
            zero_point = int(zero_point)
        except (TypeError, ValueError, OverflowError):
            raise BadDataError("scale must be a float and zero_point an int") from None
        object.__setattr__(self, "type", code)
        object.__setattr__(self, "dimensions", dims)
        object.__setattr__(self, "scale", scale)
        object.__setattr__(self, "zero_point", zero_point)
        object.__setattr__(self, "channel_quant", channel_quant)

    # --- derived facts -------------------------------------------------------------
    @property
    def is_tensor(self) -> bool:
        code = self.type
        return code in TENSOR_TYPES or (code >= type_manager.EXTENSION_TYPE_BASE and is_tensor(code))

    @property
    def is_extension(self) -> bool:
        """True for a vendor extension's operand type."""
        return is_extension(self.type)

    @property
    def rank(self) -> int:
        return len(self.dimensions)

    @property
    def dtype(self) -> np.dtype:
        return dtype_of(self.type)

    @_cached  # asked at every set_input; the type never changes
    def is_fully_specified(self) -> bool:
        """True when the shape is known: scalars always, tensors with a rank and no 0."""
        if not self.is_tensor:
            return True
        return len(self.dimensions) > 0 and all(d > 0 for d in self.dimensions)

    def element_count(self) -> int:
        return self._sizes[0]

    def byte_size(self) -> int:
        """Bytes of a value of this type (0 for MODEL)."""
        return self._sizes[1]

    @_cached
    def _sizes(self) -> tuple[int, int]:
        """(element count, byte size), computed once per type."""
        count = math.prod(self.dimensions) if self.is_tensor else 1
        return count, 0 if self.type == T.MODEL else count * self.dtype.itemsize

    def with_dimensions(self, dimensions: Sequence[int]) -> OperandType:
        return OperandType(self.type, dimensions, self.scale, self.zero_point, self.channel_quant)

    def with_channel_quant(self, params: SymmPerChannelQuantParams | None) -> OperandType:
        return OperandType(self.type, self.dimensions, self.scale, self.zero_point, params)

    def describe(self) -> str:
        text = self.type.name
        if self.is_tensor:
            text += "[" + ",".join(str(d) if d else "?" for d in self.dimensions) + "]"
        if self.type in ZERO_POINT_RANGES:
            text += f"(scale={self.scale:g}, zero_point={self.zero_point})"
        return text


def _extension_code(value: object) -> ExtensionOperandCode:
    """``value`` as an extension operand type, or BAD_DATA "unknown operand type"."""
    if isinstance(value, int | np.integer) and not isinstance(value, bool) and (
            type_manager.EXTENSION_TYPE_BASE <= int(value) <= type_manager.MAX_EXTENSION_TYPE):
        return ExtensionOperandCode(int(value))
    raise BadDataError(f"unknown operand type {value!r}")


def _numpy_max_rank() -> int:
    try:
        np.empty((1,) * 64)
    except ValueError:
        return 32  # numpy 1.x
    return 64


#: The most bytes an operand may hold: Android's sizes of data are uint32 (the HAL's
#: DataLocation.length, ANeuralNetworksMemoryDesc's byte size).
MAX_OPERAND_BYTES = 0xFFFFFFFF


def size_overflows_uint32(op_type: OperandType) -> bool:
    """Android's rule for an operand type's size (validateTensorDimensions, which
    ANeuralNetworksModel_addOperand and the HAL's model validation both apply): a tensor's
    element size times its specified dimensions -- an unspecified one (0) counts as 1 --
    must fit in uint32. Multiplied only until the limit is passed: thousands of dimensions
    from another process would otherwise make a number too long to print and slow to make."""
    if not op_type.is_tensor or not op_type.dimensions:
        return False
    try:
        size = op_type.dtype.itemsize
    except BadDataError:  # an extension type no extension declares (refused before this is asked)
        return False
    for dim in op_type.dimensions:
        if dim:
            size *= dim
            if size > MAX_OPERAND_BYTES:
                return True
    return False


def _size_message(op_type: OperandType, where: str) -> str:
    dims = op_type.dimensions
    shown = "[" + ", ".join(str(d) for d in dims[:8]) + (", ...]" if len(dims) > 8 else "]")
    return (f"{where}: {op_type.type.name} of {len(dims)} dimensions {shown} is larger than 4 GiB (its size "
            f"overflows uint32: {op_type.dtype.itemsize}-byte elements times the specified dimensions must be at "
            f"most {MAX_OPERAND_BYTES} bytes)")


#: The largest rank an operand may have: the NDK sets none, numpy's arrays stop here (64 in
#: numpy 2, 32 before; a constant of more dimensions could not even be read for validation).
MAX_RANK = _numpy_max_rank()


def _as_float32(value: float) -> float:
    """``value`` as the NDK's ``float`` field holds it (past FLT_MAX it is inf, below the smallest
    subnormal 0): a scale is valid only as that value."""
    with np.errstate(over="ignore", under="ignore"):
        return float(np.float32(value))


def _finite_as_float32(value: float) -> bool:
    return math.isfinite(_as_float32(value))


def _positive_as_float32(value: float) -> bool:
    return 0 < _as_float32(value) < math.inf


def validate_operand_type(op_type: OperandType, where: str, allow_unspecified: bool = True) -> None:
    """The NDK's rules for a valid ANeuralNetworksOperandType; raises BadDataError."""
    code = op_type.type
    dims = op_type.dimensions  # ints (OperandType made them so): two C loops, not generators
    if dims and (min(dims) < 0 or max(dims) > 0xFFFFFFFF):
        raise BadDataError(f"{where}: dimensions must be non-negative 32-bit values, got {list(op_type.dimensions)}")
    if len(dims) > MAX_RANK:
        raise BadDataError(f"{where}: rank {len(dims)} is above {MAX_RANK}, the most nnapi holds (numpy's limit on "
                           "an array's dimensions)")
    if is_extension(code):
        _validate_extension_type(op_type, where, allow_unspecified)
        return
    if not is_tensor(code):
        if op_type.dimensions:
            raise BadDataError(f"{where}: scalar type {code.name} must have no dimensions")
    elif not allow_unspecified and not op_type.is_fully_specified:
        raise BadDataError(f"{where}: {code.name} must be fully specified")
    elif size_overflows_uint32(op_type):
        raise BadDataError(_size_message(op_type, where))
    scale, zero_point = op_type.scale, op_type.zero_point
    if not _finite_as_float32(scale) or scale < 0:
        raise BadDataError(f"{where}: scale must be finite and non-negative as a float32 (the NDK's type), "
                           f"got {scale}")
    if code in ZERO_POINT_RANGES:
        low, high = ZERO_POINT_RANGES[code]
        if not _positive_as_float32(scale):
            raise BadDataError(f"{where}: {code.name} needs a positive scale (as a float32, the NDK's type), "
                               f"got {scale}")
        if not low <= zero_point <= high:
            raise BadDataError(f"{where}: {code.name} zero_point must be in [{low}, {high}], got {zero_point}")
    elif code == T.TENSOR_INT32:
        # TENSOR_INT32 may carry a scale (biases of quantized layers) but no zero point.
        if zero_point != 0:
            raise BadDataError(f"{where}: TENSOR_INT32 zero_point must be 0, got {zero_point}")
    else:
        if scale != 0 or zero_point != 0:
            raise BadDataError(f"{where}: {code.name} must have scale 0 and zero_point 0")
    if op_type.channel_quant is not None and code != T.TENSOR_QUANT8_SYMM_PER_CHANNEL:
        raise BadDataError(f"{where}: per-channel quantization is only for TENSOR_QUANT8_SYMM_PER_CHANNEL")


def _validate_extension_type(op_type: OperandType, where: str, allow_unspecified: bool) -> None:
    """Android's rules for an extension operand type: declared by the extension its prefix
    names, tensor or scalar dimensions as declared, no quantization parameters."""
    code = op_type.type
    prefix, within = type_manager.split(code)
    extension = type_manager.extension_with_prefix(prefix)
    if extension is None:
        raise BadDataError(f"{where}: operand type {int(code):#x} has extension prefix {prefix}, which no "
                           "extension has (use Model.get_extension_operand_type)")
    info = extension.operand_types.get(within)
    if info is None:
        raise BadDataError(f"{where}: extension {extension.name} declares no operand type {within}")
    name = code.name
    if not info.is_tensor and op_type.dimensions:
        raise BadDataError(f"{where}: {name} is a scalar type and must have no dimensions")
    if info.is_tensor and not allow_unspecified and not op_type.is_fully_specified:
        raise BadDataError(f"{where}: {name} must be fully specified")
    if op_type.scale != 0 or op_type.zero_point != 0:
        raise BadDataError(f"{where}: {name} is an extension type and must have scale 0 and zero_point 0 "
                           "(its parameters go in set_operand_extension_data)")
    if op_type.channel_quant is not None:
        raise BadDataError(f"{where}: per-channel quantization is only for TENSOR_QUANT8_SYMM_PER_CHANNEL")
    if info.is_tensor and size_overflows_uint32(op_type):
        raise BadDataError(_size_message(op_type, where))


def validate_channel_quant(op_type: OperandType, params: SymmPerChannelQuantParams, where: str) -> None:
    """Rules of ANeuralNetworksModel_setOperandSymmPerChannelQuantParams."""
    if op_type.type != T.TENSOR_QUANT8_SYMM_PER_CHANNEL:
        raise BadDataError(f"{where}: operand is {op_type.type.name}, not TENSOR_QUANT8_SYMM_PER_CHANNEL")
    rank = op_type.rank
    if not 0 <= params.channel_dim < max(rank, 1) or (rank and params.channel_dim >= rank):
        raise BadDataError(f"{where}: channel_dim {params.channel_dim} out of range for rank {rank}")
    if rank and op_type.dimensions[params.channel_dim] not in (0, len(params.scales)):
        raise BadDataError(
            f"{where}: {len(params.scales)} scales for a channel dimension of size "
            f"{op_type.dimensions[params.channel_dim]}"
        )
    scales = params.scales
    if len(scales) > 16:  # a filter of a thousand channels: one vectorized test, not a Python loop
        with np.errstate(over="ignore", under="ignore"):
            array = np.asarray(scales, dtype=np.float64).astype(np.float32)
        valid = bool(np.all((array > 0) & (array < np.inf)))  # NaN fails both
    else:
        valid = all(_positive_as_float32(s) for s in scales)
    if not valid:
        raise BadDataError(f"{where}: per-channel scales must be positive and finite as float32 (the NDK's type)")
