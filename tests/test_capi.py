"""The C API (libneuralnetworks.so): C and C++ programs under tests/capi, compiled with
the system compiler against the generated header, build and run models through the C
functions only. The library is built once per test session."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

pytest.importorskip("cffi", reason="the C API is built with cffi (pip install 'nnapi[capi]')")

from nnapi import codes  # noqa: E402
from nnapi.capi.header import constants  # noqa: E402
from nnapi.capi.signatures import FUNCTIONS  # noqa: E402

SOURCES = Path(__file__).parent / "capi"
CC = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
CXX = shutil.which(os.environ.get("CXX", "c++")) or shutil.which("g++")

if CC is None:
    pytest.skip("no C compiler (cc / gcc) on this machine: the C API tests need one", allow_module_level=True)


class Toolchain:
    def __init__(self, root: Path) -> None:
        from nnapi.cli import main

        self.root = root
        # Built the documented way: `nnapi capi build --out DIR`.
        assert main(["capi", "build", "--out", str(root / "lib")]) == 0
        self.library = root / "lib" / "libneuralnetworks.so"
        self.include = root / "lib" / "include"

    def compile(self, *sources: str, cpp: bool = False, extra: tuple[str, ...] = ()) -> Path:
        compiler = CXX if cpp else CC
        if compiler is None:
            pytest.skip("no C++ compiler (c++ / g++) on this machine")
        output = self.root / Path(sources[0]).stem
        command = [compiler, "-Wall", "-Wextra", "-Werror", "-O1", *(str(SOURCES / s) for s in sources),
                   f"-I{self.include}", f"-L{self.library.parent}", "-lneuralnetworks",
                   f"-Wl,-rpath,{self.library.parent}", "-lm", "-lpthread", "-o", str(output), *extra]
        result = subprocess.run(command, capture_output=True, text=True)
        assert result.returncode == 0, f"{' '.join(command)}\n{result.stderr}"
        return output

    def run(self, program: Path, *args: str, timeout: float = 120, env: dict[str, str] | None = None) -> str:
        result = subprocess.run([str(program), *args], capture_output=True, text=True, timeout=timeout,
                                env=None if env is None else {**os.environ, **env})
        assert result.returncode == 0, f"{program.name} exited {result.returncode}\n{result.stdout}\n{result.stderr}"
        return result.stdout


@pytest.fixture(scope="session")
def toolchain(tmp_path_factory) -> Toolchain:
    return Toolchain(tmp_path_factory.mktemp("capi"))


def test_library_exports_every_feature_level_8_function(toolchain):
    result = subprocess.run(["nm", "-D", "--defined-only", str(toolchain.library)], capture_output=True, text=True)
    if result.returncode != 0:
        pytest.skip("nm is not available")
    exported = set(re.findall(r" T (ANeuralNetworks\w+)", result.stdout))
    assert exported == {f.name for f in FUNCTIONS}
    assert len(exported) == 69 + 4  # NeuralNetworks.h and NeuralNetworksExtensions.h


def test_header_values_match_the_python_enums(toolchain, tmp_path):
    """A C program prints every constant as the compiler sees it in the generated header."""
    names = sorted(constants())
    source = tmp_path / "values.c"
    source.write_text("#include <android/NeuralNetworks.h>\n#include <stdio.h>\nint main(void) {\n" +
                      "".join(f'    printf("%s %lld\\n", "{n}", (long long){n});\n' for n in names) +
                      "    return 0;\n}\n")
    program = tmp_path / "values"
    subprocess.run([CC, str(source), f"-I{toolchain.include}", "-o", str(program)], check=True)
    printed = dict(line.split() for line in subprocess.run([str(program)], capture_output=True, text=True,
                                                           check=True).stdout.splitlines())
    assert {name: int(value) for name, value in printed.items()} == constants()
    assert printed["ANEURALNETWORKS_TENSOR_QUANT8_ASYMM_SIGNED"] == "14" == str(int(codes.OperandCode(14)))
    assert printed["ANEURALNETWORKS_PRIORITY_DEFAULT"] == "100"
    assert printed["ANEURALNETWORKS_FEATURE_LEVEL_8"] == "1000008"


@pytest.mark.parametrize("program", ["cnn", "control_flow", "dynamic_shape", "memory", "events", "threads", "misuse"])
def test_c_program(toolchain, program):
    output = toolchain.run(toolchain.compile(f"{program}.c"))
    assert f"PASS {program}" in output


def test_extensions_c_program(toolchain):
    """NeuralNetworksExtensions.h: a C program builds and runs a model of the example
    driver's com.example.fibonacci extension, and misuses the four functions."""
    output = toolchain.run(toolchain.compile("extensions.c"),
                           env={"NNAPI_DRIVERS": "nnapi.drivers.catalog:fibonacci"})
    assert "PASS extensions" in output


def test_extensions_header_declares_the_four_functions(toolchain):
    header = (toolchain.include / "android" / "NeuralNetworksExtensions.h").read_text()
    declared = re.findall(r"^int (ANeuralNetworks\w+)\(", header, re.MULTILINE)
    assert declared == ["ANeuralNetworksDevice_getExtensionSupport", "ANeuralNetworksModel_getExtensionOperandType",
                        "ANeuralNetworksModel_getExtensionOperationType",
                        "ANeuralNetworksModel_setOperandExtensionData"]
    assert "uint16_t operandCodeWithinExtension, int32_t* type" in header
    assert "Extension" not in (toolchain.include / "android" / "NeuralNetworks.h").read_text()


def test_cpp_program(toolchain):
    output = toolchain.run(toolchain.compile("cpp_api.cpp", cpp=True, extra=("-std=c++17",)))
    assert "PASS cpp_api" in output


def test_cli_capi_commands(toolchain, tmp_path, capsys):
    from nnapi.cli import main

    assert main(["capi", "include", "--out", str(tmp_path / "inc")]) == 0
    include = Path(capsys.readouterr().out.strip())
    header = (include / "android" / "NeuralNetworks.h").read_text()
    assert header.count("__INTRODUCED_IN(") == 69 + 1  # 69 declarations + the fallback macro
    assert main(["capi", "env", "--lib", str(toolchain.library.parent)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(f"export LD_LIBRARY_PATH={toolchain.library.parent}")


def test_library_runs_from_a_plain_shell_environment(toolchain):
    """No PYTHONPATH needed: the library knows where nnapi was installed when it was built."""
    program = toolchain.compile("cnn.c")
    env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "PYTHONHOME")}
    result = subprocess.run([str(program)], capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


def test_cts_vectors_through_the_c_api(toolchain):
    """Every V1_0 vector and every 5th of the others, built and run by a C program; the
    whole set (and its variations): tests/capi/run_conformance.py [--variants]."""
    import sys

    sys.path.insert(0, str(SOURCES))
    from convert_vectors import convert
    from run_conformance import run

    from nnapi.conformance import default_vector_files

    program = toolchain.compile("conformance_runner.c")
    total = 0
    for path in default_vector_files():
        vectors = toolchain.root / f"{path.stem}.txt"
        count = convert([path], vectors, every=1 if path.name.startswith("V1_0") else 5)
        passed, failed, failures = run(program, vectors)
        assert (passed, failed) == (count, 0), "\n".join(failures[:20])
        total += passed
    assert total > 1000
