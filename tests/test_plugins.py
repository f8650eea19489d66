"""Driver plug-ins: entry points of an installed distribution, NNAPI_DRIVERS, --driver;
a broken plug-in is reported by name and the others still work."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from nnapi.cli import main
from nnapi.runtime import manager

PLUGIN_SOURCE = textwrap.dedent('''
    """A vendor's driver package, as a plug-in."""
    from nnapi.codes import OperationCode
    from nnapi.drivers.sample import SampleDevice


    def devices():
        return [SampleDevice("acme-npu", operations=[OperationCode.ADD], exec_time=0.1, power_usage=0.1)]


    def second():
        return SampleDevice("acme-dsp", operations=[OperationCode.MUL])


    def pair():
        return [SampleDevice("acme-left", operations=[OperationCode.ADD]),
                SampleDevice("acme-right", operations=[OperationCode.MUL])]


    def broken():
        raise RuntimeError("firmware not found")


    def not_a_device():
        return 42
''')


def _write_plugin(root: Path, package: str = "acme_nnapi") -> None:
    (root / package).mkdir(parents=True)
    (root / package / "__init__.py").write_text("")
    (root / package / "driver.py").write_text(PLUGIN_SOURCE)


def _install_dist_info(root: Path, entry_points: dict[str, str]) -> None:
    """Install the plug-in the way pip leaves a distribution: package + .dist-info with
    METADATA and entry_points.txt, on a sys.path entry."""
    _write_plugin(root)
    info = root / "acme_nnapi-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: acme-nnapi\nVersion: 1.0\n")
    lines = "".join(f"{name} = {value}\n" for name, value in entry_points.items())
    (info / "entry_points.txt").write_text(f"[nnapi.drivers]\n{lines}")
    (info / "RECORD").write_text("")


def _nnapi(args: list[str], env_extra: dict[str, str], path: Path | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env.pop("NNAPI_DRIVERS", None)
    env.pop("NNAPI_REMOTE_DEVICES", None)
    env.update(env_extra)
    if path is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(path), env.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, "-m", "nnapi", *args], capture_output=True, text=True, env=env,
                          timeout=300)


def test_entry_point_plugins_load_and_a_broken_one_is_reported(tmp_path):
    _install_dist_info(tmp_path, {"acme": "acme_nnapi.driver:devices", "acme-broken": "acme_nnapi.driver:broken",
                                  "acme-missing": "acme_nnapi.nowhere:devices"})
    result = _nnapi(["devices"], {}, tmp_path)
    assert result.returncode == 0, result.stderr
    assert "\nacme-npu\n" in result.stdout
    assert "FAILED to load acme-broken = acme_nnapi.driver:broken (entry point): RuntimeError: firmware not found" \
        in result.stdout
    assert "FAILED to load acme-missing = acme_nnapi.nowhere:devices (entry point)" in result.stdout
    assert "No module named 'acme_nnapi.nowhere'" in result.stdout
    # the plug-in's device really runs models: the ADD vectors pass on it
    result = _nnapi(["conformance", "--quiet", "--device", "acme-npu", "--ops", "ADD",
                     str(Path(__file__).parents[1] / "src/nnapi/data/cts/V1_0.jsonl.gz")], {}, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert " 0 failed" in result.stdout and "ADD" in result.stdout


def _build_wheel(directory: Path) -> Path:
    """A wheel of the plug-in package (a wheel is a zip: the package, METADATA, WHEEL,
    entry_points.txt and RECORD), built by hand so the test needs no build backend."""
    import base64
    import hashlib
    import zipfile

    files = {
        "acme_nnapi/__init__.py": "",
        "acme_nnapi/driver.py": PLUGIN_SOURCE,
        "acme_nnapi-1.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: acme-nnapi\nVersion: 1.0\n",
        "acme_nnapi-1.0.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                                          "Tag: py3-none-any\n",
        "acme_nnapi-1.0.dist-info/entry_points.txt": "[nnapi.drivers]\nacme = acme_nnapi.driver:devices\n",
    }
    record = []
    for name, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(text.encode())}")
    record.append("acme_nnapi-1.0.dist-info/RECORD,,")
    files["acme_nnapi-1.0.dist-info/RECORD"] = "\n".join(record) + "\n"
    wheel = directory / "acme_nnapi-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for name, text in files.items():
            archive.writestr(name, text)
    return wheel


def test_plugin_wheel_installed_by_pip(tmp_path):
    """A real distribution installed by pip: its entry point makes its device appear."""
    target = tmp_path / "site"
    install = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index",
                              "--target", str(target), str(_build_wheel(tmp_path))],
                             capture_output=True, text=True, timeout=300)
    assert install.returncode == 0, install.stderr
    assert (target / "acme_nnapi-1.0.dist-info" / "entry_points.txt").exists()
    result = _nnapi(["devices"], {}, target)
    assert result.returncode == 0, result.stderr
    assert "\nacme-npu\n" in result.stdout and "FAILED" not in result.stdout


def test_nnapi_drivers_environment(tmp_path):
    _write_plugin(tmp_path)
    result = _nnapi(["devices"], {"NNAPI_DRIVERS": "acme_nnapi.driver:devices, acme_nnapi.driver:not_a_device,"
                                                   "acme_nnapi.driver:second"}, tmp_path)
    assert result.returncode == 0, result.stderr
    assert "\nacme-npu\n" in result.stdout and "\nacme-dsp\n" in result.stdout
    assert "FAILED to load acme_nnapi.driver:not_a_device (NNAPI_DRIVERS): acme_nnapi.driver:not_a_device " \
           "returned int, not an IDevice or an iterable of them" in result.stdout


def test_driver_option_on_every_command(tmp_path):
    _write_plugin(tmp_path)
    result = _nnapi(["run", "--driver", "acme_nnapi.driver:second", "--device", "acme-dsp", "--iterations", "1"],
                    {}, tmp_path)
    # the demo model needs CONV_2D, which acme-dsp declines: a clean NNAPI error, not a traceback
    assert "Traceback" not in result.stderr
    result = _nnapi(["devices", "--driver", "acme_nnapi.driver:broken"], {}, tmp_path)
    assert result.returncode == 2
    assert "--driver acme_nnapi.driver:broken: the factory failed: RuntimeError: firmware not found" in result.stderr
    from nnapi.cli import build_parser

    parser = build_parser()
    subparsers = next(a for a in parser._actions if a.dest == "command")
    for name, command in subparsers.choices.items():
        assert any("--driver" in action.option_strings for action in command._actions), name


def test_driver_option_in_process(tmp_path, monkeypatch, capsys):
    _write_plugin(tmp_path, "acme_inproc")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        assert main(["devices", "--driver", "acme_inproc.driver:second"]) == 0
        assert "\nacme-dsp\n" in capsys.readouterr().out
        # loading the same spec again (a second command in one process) is harmless
        assert main(["devices", "--driver", "acme_inproc.driver:second"]) == 0
        assert main(["devices", "--driver", "acme_inproc.driver:nothing"]) == 2
        assert "has no attribute 'nothing'" in capsys.readouterr().err
        assert main(["devices", "--driver", "no-colon"]) == 2
        assert "expected pkg.module:factory or a shipped driver" in capsys.readouterr().err
    finally:
        manager.unregister_device("acme-dsp")
        manager._loaded_specs.pop("acme_inproc.driver:second", None)


def test_a_plugin_loads_again_after_one_of_its_devices_is_unregistered(tmp_path, monkeypatch):
    """unregister_device of one of a plug-in's devices, then loading the plug-in again:
    the unregistered one is made and registered again, its sibling still registered is
    kept. (The reload raised 'a device named acme-right is already registered'; before
    that, it returned the unregistered device without registering it.)"""
    _write_plugin(tmp_path, "acme_pair")
    monkeypatch.syspath_prepend(str(tmp_path))
    spec = "acme_pair.driver:pair"
    try:
        left, right = manager.load_driver_spec(spec)
        manager.unregister_device("acme-left")
        assert "acme-left" not in [d.name for d in manager.hal_devices()]
        again_left, again_right = manager.load_driver_spec(spec)
        assert again_right is right and again_left is not left and again_left.name == "acme-left"
        names = [d.name for d in manager.hal_devices()]
        assert names.count("acme-left") == 1 and names.count("acme-right") == 1
        assert manager.load_driver_spec(spec) == [again_left, right]
    finally:
        for name in ("acme-left", "acme-right"):
            manager.unregister_device(name)
        manager._loaded_specs.pop(spec, None)


def test_shipped_short_names():
    from nnapi.drivers.sample import SampleDevice

    (device,) = manager.make_devices("sample")
    assert isinstance(device, SampleDevice) and device.name == "nnapi-sample"
    (device,) = manager.make_devices("reference")
    assert device.name == "nnapi-reference"
    with pytest.raises(manager.DriverLoadError, match="nope"):
        manager.make_devices("nope")


_WITHOUT_ONNXRUNTIME = '''
import sys


class _Absent:
    """onnxruntime not installed: every import of it fails as a missing module does."""

    def find_spec(self, name, path=None, target=None):
        if name == "onnxruntime" or name.startswith("onnxruntime."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, _Absent())
'''


def test_without_onnxruntime_the_ort_device_says_what_to_install(tmp_path):
    """A new user without onnxruntime (simulated: its import fails) who asks for the ORT
    device: --device nnapi-ort-cpu, --driver ort and nnapi serve --driver ort each exit 2
    with one line naming the extra to install, never a traceback (serve raised
    ValueError "no devices to serve"; --driver ort ran silently on the reference)."""
    (tmp_path / "sitecustomize.py").write_text(_WITHOUT_ONNXRUNTIME)
    commands = [["conformance", "--device", "nnapi-ort-cpu", "--ops", "ADD", "--quiet"],
                ["devices", "--driver", "ort"],
                ["serve", "--driver", "ort", "--socket", str(tmp_path / "ort.sock")]]
    for args in commands:
        result = _nnapi(args, {}, tmp_path)
        assert result.returncode == 2, (args, result.stderr)
        assert "Traceback" not in result.stderr, args
        assert "pip install 'nnapi[onnxruntime]'" in result.stderr, (args, result.stderr)
    result = _nnapi(["conformance", "--device", "nnapi-reference", "--ops", "ADD", "--quiet"], {}, tmp_path)
    assert result.returncode == 0, result.stderr  # the reference alone still works
    script = ("import nnapi\n"
              "from nnapi import OperandCode as T, OperandType\n"
              "model = nnapi.Model()\n"
              "x, y = (model.add_operand(OperandType(T.TENSOR_FLOAT32, [2])) for _ in range(2))\n"
              "model.add_operation(nnapi.OperationCode.FLOOR, [x], [y])\n"
              "model.identify_inputs_and_outputs([x], [y])\n"
              "model.finish()\n"
              "try:\n"
              "    nnapi.Session(model, 'nnapi-ort-cpu')\n"
              "except nnapi.BadDataError as error:\n"
              "    print(error)\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    env.pop("NNAPI_DRIVERS", None)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert "pip install 'nnapi[onnxruntime]'" in result.stdout, (result.stdout, result.stderr)
