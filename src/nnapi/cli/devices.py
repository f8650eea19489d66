"""``nnapi devices``: the devices with type, version, feature level and capabilities, and the
driver plug-ins / services that failed to load."""

from __future__ import annotations

import argparse

import nnapi
from nnapi.cli._common import print_json
from nnapi.hal.types import operand_type_name


def register(commands, common) -> None:
    parser = commands.add_parser("devices", parents=[common],
                                 help="list devices with type, version, feature level, capabilities")
    parser.add_argument("-v", "--verbose", action="store_true", help="per-operand-type performance too")
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.set_defaults(func=cmd_devices)


def _extensions(device: nnapi.Device) -> list[str]:
    """The names of the vendor extensions the device's driver reports."""
    try:
        return [str(extension.name) for extension in device._hal.get_supported_extensions()]
    except Exception:  # noqa: BLE001 - a broken driver reports none
        return []


def _as_json(device: nnapi.Device) -> dict:
    capabilities = device.capabilities
    return {"name": device.name, "type": device.type.name, "version": device.version,
            "feature_level": int(device.feature_level), "extensions": _extensions(device),
            "capabilities_problem": device.capabilities_problem,
            "relaxed_float32_to_float16_tensor": vars(capabilities.relaxed_float32_to_float16_tensor),
            "operand_performance": {operand_type_name(code): vars(info)
                                    for code, info in sorted(capabilities.operand_performance.items())}}


def cmd_devices(args: argparse.Namespace) -> int:
    from nnapi.runtime.manager import load_failures

    if args.json:
        print_json({"runtime_feature_level": int(nnapi.get_runtime_feature_level()),
                    "devices": [_as_json(device) for device in nnapi.get_devices()],
                    "load_failures": [vars(failure) for failure in load_failures()]})
        return 0
    print(f"runtime feature level: {nnapi.get_runtime_feature_level().name}")
    for device in nnapi.get_devices():
        print(f"{device.name}")
        print(f"  type:          {device.type.name}")
        print(f"  version:       {device.version}")
        print(f"  feature level: {device.feature_level.name} ({int(device.feature_level)})")
        if _extensions(device):
            print(f"  extensions:    {', '.join(_extensions(device))}")
        capabilities = device.capabilities
        if device.capabilities_problem is not None:
            print(f"  capabilities:  no performance information ({device.capabilities_problem})")
        print(f"  relaxed float32 tensor perf: exec_time={capabilities.relaxed_float32_to_float16_tensor.exec_time:g} "
              f"power_usage={capabilities.relaxed_float32_to_float16_tensor.power_usage:g}")
        if args.verbose:
            for code, info in sorted(capabilities.operand_performance.items()):
                print(f"    {operand_type_name(code):<34} exec_time={info.exec_time:g} "
                      f"power_usage={info.power_usage:g}")
        from nnapi.operations import implemented_operations

        if device.name == "nnapi-reference":
            print(f"  operations:    {len(implemented_operations())} of {len(nnapi.OperationCode)} implemented")
    for failure in load_failures():
        print(f"FAILED to load {failure.name} ({failure.source}): {failure.error}")
    return 0
