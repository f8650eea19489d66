"""What the command modules share: exit codes, errors, device lookup, driver plug-ins,
JSON output."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import nnapi

EXIT_OK = 0
EXIT_FAILED = 1  # a test or comparison failed
EXIT_USAGE = 2  # bad arguments, missing or unreadable files
EXIT_NNAPI_ERROR = 3
EXIT_INTERRUPTED = 130


class CliError(Exception):
    """A one-line error for the user; ``main`` prints it and exits with ``exit_code``."""

    def __init__(self, message: str, exit_code: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def common_parser() -> argparse.ArgumentParser:
    """The options every command takes (pass as ``parents=[common]``)."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--driver", action="append", default=[], metavar="PKG.MODULE:FACTORY",
                        help="load a driver plug-in before running (repeatable)")
    return common


def load_drivers(specs: list[str]) -> None:
    """Register the devices of the ``--driver`` plug-ins."""
    if not specs:
        return
    from nnapi.runtime.manager import load_driver_spec

    for spec in specs:
        try:
            load_driver_spec(spec)
        except nnapi.NnapiError:
            raise
        except Exception as error:  # a plug-in's own failure: name it, never a traceback
            raise CliError(f"--driver {spec}: {type(error).__name__}: {error}") from None


def find_device(name: str | None) -> nnapi.Device | None:
    """The device called ``name`` (None: let the runtime choose)."""
    if name is None:
        return None
    devices = nnapi.get_devices()
    for device in devices:
        if device.name == name:
            return device
    raise CliError(f"no device named {name!r} (devices: {', '.join(d.name for d in devices)})")


def print_json(value: Any) -> None:
    json.dump(value, sys.stdout, indent=2, default=str)
    sys.stdout.write("\n")
