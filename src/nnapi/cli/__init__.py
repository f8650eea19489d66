"""The ``nnapi`` command line.

Each command is a module of this package (``devices.py``, ``run.py``, ...) found at
start-up: adding a command means adding a module with ``register(commands, common)``,
which adds its sub-parser (with ``parents=[common]`` for the options every command
shares) and sets ``func`` to a function taking the parsed arguments and returning the
exit code. Modules whose names start with ``_`` are helpers, not commands.

Exit codes: 0 success, 1 a test or comparison failed, 2 usage error (bad arguments,
missing or unreadable files), 3 an NNAPI error, 130 interrupted.
"""

from __future__ import annotations

import argparse
import importlib
import os
import pkgutil
import sys

import nnapi
from nnapi import tracing
from nnapi.cli._common import EXIT_INTERRUPTED, EXIT_NNAPI_ERROR, CliError, common_parser, load_drivers


def _command_modules() -> list:
    names = sorted(info.name for info in pkgutil.iter_modules(__path__) if not info.name.startswith("_"))
    return [importlib.import_module(f"{__name__}.{name}") for name in names]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="nnapi", description="The Android Neural Networks API on Linux.")
    parser.add_argument("--version", action="version", version=f"nnapi {nnapi.__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    common = common_parser()
    for module in _command_modules():
        module.register(commands, common)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the exit code."""
    args = build_parser().parse_args(argv)
    trace = getattr(args, "trace", None)
    if trace:
        tracing.start(trace)
    try:
        if getattr(args, "load_driver_plugins", True):
            load_drivers(getattr(args, "driver", None) or [])
        return args.func(args)
    except CliError as error:
        print(f"nnapi {args.command}: {error}", file=sys.stderr)
        return error.exit_code
    except nnapi.NnapiError as error:
        print(f"nnapi {args.command}: {type(error).__name__}: {error}", file=sys.stderr)
        return EXIT_NNAPI_ERROR
    except KeyboardInterrupt:
        print(f"nnapi {args.command}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # The reader went away (`nnapi ... | head`): stop quietly, and keep Python from
        # complaining again when it flushes stdout at exit.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1
    finally:
        if trace:
            try:
                tracing.stop()
            except OSError as error:
                print(f"nnapi {args.command}: cannot write the trace {trace}: {error.strerror}", file=sys.stderr)


def entry_point() -> None:
    """The console script ``nnapi``."""
    sys.exit(main())
