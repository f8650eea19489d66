"""``python -m nnapi.drivers.service --driver DRIVER --socket PATH``: host a driver's devices."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m nnapi.drivers.service",
                                     description="Host a driver's devices in this process, served on a Unix socket.")
    parser.add_argument("--driver", required=True, metavar="DRIVER",
                        help="pkg.module:factory or a shipped driver: reference, sample, faulty, ort, fibonacci")
    parser.add_argument("--socket", required=True, metavar="PATH", help="the Unix socket to listen on")
    args = parser.parse_args(argv)
    return run(args.driver, args.socket)


def run(driver: str, path: str) -> int:
    """Serve until SIGTERM / SIGINT; 2 when the driver cannot load or the socket is taken."""
    from nnapi.runtime.manager import DriverLoadError, make_devices

    try:
        from nnapi.drivers.service.server import serve
    except ImportError as error:
        print(f"nnapi serve: {error} (pip install 'nnapi[service]')", file=sys.stderr)
        return 2
    try:
        devices = make_devices(driver)
    except DriverLoadError as error:
        print(f"nnapi serve: --driver {error}", file=sys.stderr)
        return 2
    if not devices:
        print(f"nnapi serve: --driver {driver}: the driver made no devices to serve", file=sys.stderr)
        return 2

    def ready() -> None:
        names = ", ".join(d.name for d in devices)
        print(f"serving {names} on {path}", flush=True)

    try:
        serve(devices, path, ready)
    except OSError as error:
        print(f"nnapi serve: {path}: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
