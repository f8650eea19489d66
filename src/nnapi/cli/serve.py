"""``nnapi serve --driver DRIVER --socket PATH``: host a driver in this process, reachable by
other processes through a Unix socket (the driver service, ``nnapi.drivers.service``)."""

from __future__ import annotations

import argparse

from nnapi.cli._common import CliError


def register(commands, common) -> None:
    parser = commands.add_parser("serve", parents=[common],
                                 help="host a driver in its own process, served on a Unix socket "
                                      "(--driver: pkg.module:factory or reference, sample, faulty, ort, fibonacci)")
    parser.add_argument("--socket", required=True, metavar="PATH", help="the Unix socket to listen on")
    # --driver names the driver to host here, not a plug-in for this process to use.
    parser.set_defaults(func=cmd_serve, load_driver_plugins=False)


def cmd_serve(args: argparse.Namespace) -> int:
    from nnapi.drivers.service.__main__ import run

    if len(args.driver) > 1:
        raise CliError("serve hosts one driver: give one --driver")
    return run(args.driver[0] if args.driver else "reference", args.socket)
