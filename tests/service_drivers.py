"""Drivers the service tests host in a separate process (``--driver service_drivers:slow``)."""

from __future__ import annotations

import time

from nnapi.drivers.sample import SampleDevice
from nnapi.hal import ErrorStatus, HalError, IPreparedModel


class _SlowPrepared(IPreparedModel):
    def __init__(self, inner: IPreparedModel) -> None:
        self._inner = inner

    def execute(self, request, measure_timing=False, deadline_ns=None, loop_timeout_ns=None):
        end = time.monotonic_ns() + 1_500_000_000
        while time.monotonic_ns() < end:
            if deadline_ns is not None and time.monotonic_ns() > deadline_ns:
                raise HalError(ErrorStatus.MISSED_DEADLINE_TRANSIENT, "slow device: deadline passed")
            time.sleep(0.01)
        return self._inner.execute(request, measure_timing, deadline_ns, loop_timeout_ns)


class SlowDevice(SampleDevice):
    """Computes like the reference driver, but each execution takes 1.5 s (honouring deadlines)."""

    def prepare_model(self, model, *args, **kwargs):
        return _SlowPrepared(super().prepare_model(model, *args, **kwargs))


def slow() -> SlowDevice:
    return SlowDevice("slow")


def pair() -> list[SampleDevice]:
    """Two devices in one service (device memory of one must never reach the other)."""
    return [SampleDevice("sample-a"), SampleDevice("sample-b")]


class SteppedDevice(SampleDevice):
    """A sample device that reports a fixed cost per plan step (Capabilities.step_cost_s)."""

    def get_capabilities(self):
        import dataclasses

        return dataclasses.replace(super().get_capabilities(), step_cost_s=3.5e-5)


def stepped() -> SteppedDevice:
    return SteppedDevice("stepped")
