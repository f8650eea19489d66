"""The HAL contract's default methods: what a driver that implements only the HAL 1.0
core (capabilities, supported operations, prepare, execute) gets for free."""

from __future__ import annotations

import os

import numpy as np
import pytest

from nnapi.codes import OperationCode
from nnapi.drivers.reference import ReferenceDevice
from nnapi.hal import BufferDesc, ErrorStatus, FdPool, HalError, IDevice
from nnapi.hal.interfaces import read_fd, wait_for_fences, write_fd
from nnapi.hal.types import is_extension_type, pool_view


def test_defaults_of_a_minimal_device():
    device = ReferenceDevice()
    assert device.get_number_of_cache_files_needed() in ((0, 0), (1, 1))
    assert isinstance(device.get_supported_extensions(), list)
    with pytest.raises(HalError) as caught:
        IDevice.allocate(device, BufferDesc([1]), [], [], [])
    assert caught.value.status == ErrorStatus.GENERAL_FAILURE


def test_wait_for_fences_returns_once_signalled_and_times_out_otherwise():
    import time

    signalled = os.eventfd(1, os.EFD_CLOEXEC)
    pending = os.eventfd(0, os.EFD_CLOEXEC)
    try:
        wait_for_fences([signalled])
        with pytest.raises(HalError) as caught:
            wait_for_fences([pending], deadline_ns=time.monotonic_ns() + 10_000_000)
        assert caught.value.status == ErrorStatus.MISSED_DEADLINE_TRANSIENT
    finally:
        os.close(signalled)
        os.close(pending)
    with pytest.raises(HalError) as caught:
        wait_for_fences([10_000_000])
    assert caught.value.status == ErrorStatus.INVALID_ARGUMENT


def test_fd_helpers_and_pool_views(tmp_path):
    fd = os.open(tmp_path / "f", os.O_RDWR | os.O_CREAT)
    try:
        write_fd(fd, b"0123456789")
        write_fd(fd, b"abc")
        assert read_fd(fd) == b"abc"
    finally:
        os.close(fd)
    data = np.arange(4, dtype=np.float32)
    assert pool_view(FdPool(-1, 0, 16, False, data)).nbytes == 16
    with pytest.raises(HalError):
        pool_view(object())
    assert is_extension_type(1 << 16) and not is_extension_type(int(OperationCode.ADD))
