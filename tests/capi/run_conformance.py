"""Run the CTS vectors through the C API: build libneuralnetworks.so, convert the vectors
(convert_vectors.py), compile conformance_runner.c with the system compiler and run it.

    python tests/capi/run_conformance.py                  # every shipped vector (nnapi/data/cts)
    python tests/capi/run_conformance.py --variants       # and the derived variations
    python tests/capi/run_conformance.py FILE.jsonl.gz --every 10
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from convert_vectors import convert  # noqa: E402

from nnapi import capi  # noqa: E402
from nnapi.conformance import VARIANTS, default_vector_files  # noqa: E402


def compile_runner(library: Path, out: Path) -> Path:
    compiler = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if compiler is None:
        raise SystemExit("no C compiler (cc / gcc)")
    program = out / "conformance_runner"
    subprocess.run([compiler, "-O2", "-Wall", "-Wextra", str(HERE / "conformance_runner.c"),
                    f"-I{library.parent / 'include'}", f"-L{library.parent}", "-lneuralnetworks",
                    f"-Wl,-rpath,{library.parent}", "-lm", "-o", str(program)], check=True)
    return program


def run(program: Path, vectors: Path) -> tuple[int, int, list[str]]:
    """(passed, failed, FAIL lines) of one converted file."""
    result = subprocess.run([str(program), str(vectors)], capture_output=True, text=True)
    failures = [line for line in result.stdout.splitlines() if line.startswith("FAIL")]
    summary = [line for line in result.stdout.splitlines() if line.startswith("SUMMARY")]
    if not summary:
        raise RuntimeError(f"the runner stopped early (exit {result.returncode}):\n{result.stdout[-2000:]}\n"
                           f"{result.stderr[-2000:]}")
    words = summary[-1].split()
    return int(words[2]), int(words[4]), failures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="*", type=Path)
    parser.add_argument("--every", type=int, default=1, help="keep every N-th record of each file")
    parser.add_argument("--variants", action="store_true", help="also every derived variation")
    parser.add_argument("--lib", type=Path, help="an existing build directory (default: build into a temp dir)")
    args = parser.parse_args(argv)
    files = args.files or default_vector_files()
    with tempfile.TemporaryDirectory(prefix="nnapi-capi-cts-") as tmp:
        work = Path(tmp)
        library = args.lib / capi.LIBRARY_NAME if args.lib else capi.build(work / "lib")
        program = compile_runner(library, work)
        jobs = [(path.name, [path], None) for path in files]
        if args.variants:
            jobs += [(f"variant {name}", files, name) for name in sorted(VARIANTS)]
        total_passed = total_failed = 0
        for label, sources, variant in jobs:
            vectors = work / "vectors.txt"
            convert(sources, vectors, variant, args.every)
            passed, failed, failures = run(program, vectors)
            for line in failures:
                print(f"  {line}")
            print(f"{label:<36} passed {passed:>6}  failed {failed}")
            total_passed += passed
            total_failed += failed
        print(f"{'total (through the C API)':<36} passed {total_passed:>6}  failed {total_failed}")
    return 1 if total_failed else 0


if __name__ == "__main__":
    sys.exit(main())
