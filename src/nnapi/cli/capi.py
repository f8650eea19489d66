"""``nnapi capi``: build the C library libneuralnetworks.so, find its header, set up a
shell to run programs linked against it."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from nnapi.cli._common import CliError


def register(commands, common) -> None:
    parser = commands.add_parser("capi", parents=[common],
                                 help="the C API: build libneuralnetworks.so, print its include dir or env")
    actions = parser.add_subparsers(dest="capi_command", required=True, metavar="ACTION")
    build = actions.add_parser("build", help="build libneuralnetworks.so (+ include/) for this installation")
    build.add_argument("--out", type=Path, default=None,
                       help="directory for the library (default: a per-installation cache directory)")
    build.add_argument("-v", "--verbose", action="store_true", help="show the compiler's commands")
    build.set_defaults(func=cmd_build)
    include = actions.add_parser("include", help="print an include directory holding android/NeuralNetworks.h")
    include.add_argument("--out", type=Path, default=None, help="write the headers there (default: the cache)")
    include.set_defaults(func=cmd_include)
    env = actions.add_parser("env", help="print the shell export lines a program using the library needs")
    env.add_argument("--lib", type=Path, default=None, help="the directory given to `build --out` "
                                                            "(default: the cache)")
    env.set_defaults(func=cmd_env)


def cmd_build(args: argparse.Namespace) -> int:
    from nnapi import capi

    try:
        library = capi.build(args.out, verbose=args.verbose)
    except Exception as error:  # cffi missing, no compiler, compiler error: one line, no traceback
        raise CliError(f"build failed: {type(error).__name__}: {error}") from None
    print(library)
    print(f"compile with: cc prog.c -I{library.parent / 'include'} -L{library.parent} -lneuralnetworks "
          f"-Wl,-rpath,{library.parent}", file=sys.stderr)
    return 0


def cmd_include(args: argparse.Namespace) -> int:
    from nnapi import capi

    print(capi.include_dir(args.out))
    return 0


def cmd_env(args: argparse.Namespace) -> int:
    from nnapi import capi

    lib_dir = args.lib if args.lib is not None else capi.cache_dir()
    if not (lib_dir / capi.LIBRARY_NAME).exists():
        print(f"nnapi capi env: no {capi.LIBRARY_NAME} in {lib_dir} yet; run `nnapi capi build"
              f"{'' if args.lib is None else f' --out {args.lib}'}`", file=sys.stderr)
    for line in capi.env_lines(lib_dir):
        print(line)
    return 0
