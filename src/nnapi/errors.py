"""NnapiError and one subclass per NDK result code.

Every public call reports failure by raising the subclass for the result code the NDK
documents; ``error.code`` holds the ResultCode.
"""

from __future__ import annotations

from nnapi.codes import ResultCode


class NnapiError(Exception):
    """A failed NNAPI call; ``code`` is the ResultCode the NDK function would return."""

    code: ResultCode = ResultCode.OP_FAILED

    def __init__(self, message: str = "", code: ResultCode | None = None) -> None:
        if code is not None:
            self.code = ResultCode(code)
        super().__init__(message or self.code.name)

    def __new__(cls, message: str = "", code: ResultCode | None = None):
        # NnapiError("...", ResultCode.BAD_DATA) builds the matching subclass, so that
        # `except nnapi.BadDataError` works whoever raised it.
        if cls is NnapiError and code is not None:
            cls = _BY_CODE.get(ResultCode(code), NnapiError)
        return super().__new__(cls)


class OutOfMemoryError(NnapiError):
    code = ResultCode.OUT_OF_MEMORY


class IncompleteError(NnapiError):
    code = ResultCode.INCOMPLETE


class UnexpectedNullError(NnapiError):
    code = ResultCode.UNEXPECTED_NULL


class BadDataError(NnapiError):
    code = ResultCode.BAD_DATA


class OpFailedError(NnapiError):
    code = ResultCode.OP_FAILED


class BadStateError(NnapiError):
    code = ResultCode.BAD_STATE


class UnmappableError(NnapiError):
    code = ResultCode.UNMAPPABLE


class OutputInsufficientSizeError(NnapiError):
    code = ResultCode.OUTPUT_INSUFFICIENT_SIZE


class UnavailableDeviceError(NnapiError):
    code = ResultCode.UNAVAILABLE_DEVICE


class MissedDeadlineTransientError(NnapiError):
    code = ResultCode.MISSED_DEADLINE_TRANSIENT


class MissedDeadlinePersistentError(NnapiError):
    code = ResultCode.MISSED_DEADLINE_PERSISTENT


class ResourceExhaustedTransientError(NnapiError):
    code = ResultCode.RESOURCE_EXHAUSTED_TRANSIENT


class ResourceExhaustedPersistentError(NnapiError):
    code = ResultCode.RESOURCE_EXHAUSTED_PERSISTENT


class DeadObjectError(NnapiError):
    code = ResultCode.DEAD_OBJECT


_BY_CODE: dict[ResultCode, type[NnapiError]] = {
    sub.code: sub for sub in NnapiError.__subclasses__()
}


class NotConstructibleError(BadDataError, TypeError):
    """A public class without an NDK constructor (Memory, Event, Device) was called
    directly. BAD_DATA, and also a TypeError, as Python raises for a wrong call."""


def error_for(code: ResultCode, message: str) -> NnapiError:
    """The NnapiError subclass instance for ``code``."""
    return _BY_CODE.get(ResultCode(code), NnapiError)(message, code)
