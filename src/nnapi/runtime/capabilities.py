"""A device's capabilities as the runtime reads them: asked of the driver once, validated as
Android validates IDevice::getCapabilities' answer, and kept.

A driver is another party: what it answers (a Capabilities of PerformanceInfo figures, a
per-operand-type table, nnapi's step cost) is checked before the partitioner, the
ANeuralNetworksDevice calls or a tool reads it. Android's rules: every figure greater than
0 (FLT_MAX, here also infinity, meaning "no performance information"), each table entry an
operand type. Android refuses a device whose capabilities do not validate; here such a
device keeps running what only it can run, with no performance information -- every
figure infinite, so it is chosen last -- and the problem is kept for tools to show.
"""

from __future__ import annotations

import math
import threading
import weakref

import numpy as np

from nnapi import vlog
from nnapi.codes import OperandCode
from nnapi.hal import Capabilities, IDevice, PerformanceInfo
from nnapi.hal.types import is_extension_type

#: What a device with no usable capabilities reports: no performance information.
_NONE = PerformanceInfo(math.inf, math.inf)

_lock = threading.Lock()
#: per device: (its validated capabilities, what was wrong with its answer or None)
_read: weakref.WeakKeyDictionary[IDevice, tuple[Capabilities, str | None]] = weakref.WeakKeyDictionary()


def _real(value: object) -> float | None:
    """``value`` as a float where it is a real number (not a bool), else None; OverflowError
    for an int beyond any float."""
    if isinstance(value, bool) or not isinstance(value, int | float | np.integer | np.floating):
        return None
    return float(value)


def _figure(value: object, what: str) -> float:
    """A performance figure as a float; ValueError naming ``what`` unless a number > 0."""
    try:
        number = _real(value)
    except OverflowError:
        raise ValueError(f"{what} is an integer beyond any float") from None
    if number is None:
        raise ValueError(f"{what} is a {type(value).__name__}, not a number")
    if not number > 0.0:  # NaN fails too
        raise ValueError(f"{what} is {number!r}, not greater than 0")
    return number


def _performance(info: object, what: str) -> PerformanceInfo:
    if not isinstance(info, PerformanceInfo):
        raise ValueError(f"{what} is a {type(info).__name__}, not a PerformanceInfo")
    return PerformanceInfo(_figure(info.exec_time, f"{what}.exec_time"),
                           _figure(info.power_usage, f"{what}.power_usage"))


def _operand_type(code: object) -> int:
    if isinstance(code, bool) or not isinstance(code, int | np.integer):
        raise ValueError(f"operand_performance has a key of type {type(code).__name__}, not an operand type")
    try:
        return OperandCode(int(code))
    except ValueError:
        if is_extension_type(int(code)) and int(code) < 1 << 32:  # a uint32, as in the NDK
            return int(code)
        raise ValueError(f"operand_performance has the key {int(code)}, which is no operand type") from None


def validated(capabilities: object) -> Capabilities:
    """``capabilities`` as a driver answered them, checked (Android's validateCapabilities:
    every PerformanceInfo's figures > 0, the table's keys operand types; here also nnapi's
    step cost a finite number of seconds >= 0) and copied with plain floats and OperandCode
    keys; ValueError naming the field and the rule otherwise."""
    if not isinstance(capabilities, Capabilities):
        raise ValueError(f"answered a {type(capabilities).__name__}, not a Capabilities")
    table = capabilities.operand_performance
    if not isinstance(table, dict):
        raise ValueError(f"operand_performance is a {type(table).__name__}, not a dict")
    operand_performance: dict = {}
    for code, info in table.items():
        key = _operand_type(code)
        operand_performance[key] = _performance(info, f"operand_performance[{getattr(key, 'name', key)}]")
    step = capabilities.step_cost_s
    try:
        seconds = _real(step)
    except OverflowError:
        seconds = None
    if seconds is None or not 0.0 <= seconds < math.inf:
        raise ValueError(f"step_cost_s {step!r:.40} is not a finite number of seconds >= 0")
    return Capabilities(
        _performance(capabilities.relaxed_float32_to_float16_scalar, "relaxed_float32_to_float16_scalar"),
        _performance(capabilities.relaxed_float32_to_float16_tensor, "relaxed_float32_to_float16_tensor"),
        operand_performance,
        _performance(capabilities.if_performance, "if_performance"),
        _performance(capabilities.while_performance, "while_performance"),
        seconds)


def _read_once(device: IDevice) -> tuple[Capabilities, str | None]:
    name = getattr(device, "name", "?")
    try:
        answer = device.get_capabilities()
    except Exception as error:  # noqa: BLE001 - a driver's failure
        problem = f"{name}: get_capabilities raised {type(error).__name__}: {error}"
    else:
        try:
            return validated(answer), None
        except ValueError as error:
            problem = f"{name}: get_capabilities: {error}"
    vlog.manager.debug("%s; the device has no performance information", problem)
    return Capabilities.uniform(_NONE), problem


def read(device: IDevice) -> tuple[Capabilities, str | None]:
    """``device``'s capabilities as the runtime uses them, read from its driver the first
    time and kept, and what was wrong with the driver's answer (None when nothing was:
    otherwise the capabilities are "no performance information")."""
    try:
        with _lock:
            known = _read.get(device)
    except TypeError:  # a device that cannot be weakly referenced or hashed: read every time
        return _read_once(device)
    if known is None:
        known = _read_once(device)  # outside the lock: a driver may take its time (ORT calibrates)
        with _lock:
            known = _read.setdefault(device, known)
    return known


def of(device: IDevice) -> Capabilities:
    """``device``'s validated capabilities (see ``read``)."""
    return read(device)[0]
