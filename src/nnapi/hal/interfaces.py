"""The driver interfaces of the NN HAL: IDevice, IPreparedModel, IBurst."""

from __future__ import annotations

from abc import ABC, abstractmethod

from nnapi.codes import DeviceTypeCode, FeatureLevelCode
from nnapi.hal.types import (
    Capabilities,
    ExecutionPreference,
    Model,
    OutputShape,
    Priority,
    Request,
    Timing,
)


class IPreparedModel(ABC):
    """A model prepared (compiled) for one device."""

    @abstractmethod
    def execute(
        self,
        request: Request,
        measure_timing: bool = False,
        deadline_ns: int | None = None,
        loop_timeout_ns: int | None = None,
    ) -> tuple[list[OutputShape], Timing]:
        """Run the model; raise HalError on failure (with output shapes when too small)."""

    def configure_burst(self) -> IBurst:
        return _SimpleBurst(self)


class IBurst(ABC):
    """A burst: a channel for many executions of one prepared model."""

    @abstractmethod
    def execute(
        self,
        request: Request,
        measure_timing: bool = False,
        deadline_ns: int | None = None,
        loop_timeout_ns: int | None = None,
    ) -> tuple[list[OutputShape], Timing]: ...


class _SimpleBurst(IBurst):
    def __init__(self, prepared: IPreparedModel) -> None:
        self._prepared = prepared

    def execute(self, request, measure_timing=False, deadline_ns=None, loop_timeout_ns=None):
        return self._prepared.execute(request, measure_timing, deadline_ns, loop_timeout_ns)


class IDevice(ABC):
    """A driver's device."""

    name: str
    version_string: str
    device_type: DeviceTypeCode
    feature_level: FeatureLevelCode

    @abstractmethod
    def get_capabilities(self) -> Capabilities: ...

    @abstractmethod
    def get_supported_operations(self, model: Model) -> list[bool]:
        """One flag per operation of ``model.main``, in order."""

    @abstractmethod
    def prepare_model(
        self,
        model: Model,
        preference: ExecutionPreference = ExecutionPreference.FAST_SINGLE_ANSWER,
        priority: Priority = Priority.MEDIUM,
        deadline_ns: int | None = None,
    ) -> IPreparedModel:
        """Compile ``model``; raise HalError on failure."""

    def wait(self) -> None:
        """Block until the device is available (ANeuralNetworksDevice_wait); an in-process
        device is always available, so the default returns at once."""
        return None
