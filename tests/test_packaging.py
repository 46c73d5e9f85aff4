"""The licence and the TensorFlow choice reach the package metadata.

The wheel is built from a copy of the source (so the build writes nothing
into the checkout); the GPU install is checked by asking pip what the
command docs/gpu.md gives would install (``--dry-run``): the project's
metadata is prepared, TensorFlow itself is not downloaded. Both run pip
without build isolation (the installed setuptools), so nothing is fetched.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import shlex
import shutil
import subprocess
import sys
import zipfile

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
_SOURCE_FILES = ("setup.py", "pyproject.toml", "README.md", "LICENSE")
_SOURCE_DIRS = ("m4moe", "data", "eval", "configs")


@pytest.fixture(name="source", scope="module")
def fixture_source(tmp_path_factory) -> pathlib.Path:
  """A copy of what setup.py packages."""
  source = tmp_path_factory.mktemp("source")
  for name in _SOURCE_FILES:
    shutil.copy2(ROOT / name, source / name)
  ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
  for name in _SOURCE_DIRS:
    shutil.copytree(ROOT / name, source / name, ignore=ignore)
  return source


def test_license_is_the_apache_2_text():
  text = (ROOT / "LICENSE").read_text(encoding="utf-8")
  assert text.lstrip().startswith("Apache License\n")
  assert "Version 2.0, January 2004" in text
  for section in ("TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND "
                  "DISTRIBUTION", "9. Accepting Warranty or Additional "
                  "Liability", "END OF TERMS AND CONDITIONS"):
    assert section in text


def test_the_wheel_declares_and_holds_the_license(source, tmp_path):
  subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q",
                  "--no-build-isolation",
                  "-w", str(tmp_path), str(source)], check=True,
                 capture_output=True, timeout=600)
  wheel, = tmp_path.glob("m4moe-*.whl")
  with zipfile.ZipFile(wheel) as zipped:
    names = zipped.namelist()
    metadata = zipped.read(next(n for n in names
                                if n.endswith(".dist-info/METADATA")))
    licence, = [n for n in names if ".dist-info/" in n
                and n.rsplit("/", 1)[-1] == "LICENSE"]
    assert zipped.read(licence) == (ROOT / "LICENSE").read_bytes()
  metadata = metadata.decode("utf-8")
  assert re.search(r"^License(-Expression)?: Apache-2\.0$", metadata, re.M)
  assert re.search(r"^License-File: LICENSE$", metadata, re.M)


def _gpu_install_command() -> list[str]:
  """The install command of docs/gpu.md, as argv after its environment."""
  page = (ROOT / "docs" / "gpu.md").read_text(encoding="utf-8")
  block = re.search(r"```sh\n(.*?)```", page, re.S).group(1)
  line = block.splitlines()[0]
  assert line.startswith("M4MOE_TENSORFLOW=gpu python3 -m pip install -e ")
  return shlex.split(line)[1:]


def _would_install(source: pathlib.Path, tmp_path: pathlib.Path,
                   env_value: str | None) -> tuple[int, dict | str]:
  """pip's dry-run report of the docs' command for ``source``."""
  argv = _gpu_install_command()
  argv[argv.index("-e") + 1] = str(source)  # '.[test]': the copy, no extra
  report = tmp_path / "report.json"
  env = {k: v for k, v in os.environ.items() if k != "M4MOE_TENSORFLOW"}
  if env_value is not None:
    env["M4MOE_TENSORFLOW"] = env_value
  proc = subprocess.run(
      [sys.executable, *argv[1:], "--dry-run", "--no-deps",
       "--no-build-isolation",
       "--ignore-installed", "--report", str(report)],
      env=env, capture_output=True, text=True, timeout=600, check=False)
  if proc.returncode:
    return proc.returncode, proc.stdout + proc.stderr
  item, = json.loads(report.read_text())["install"]
  return 0, item["metadata"]


def test_the_gpu_install_command_resolves_to_tensorflow_with_cuda(
    source, tmp_path):
  code, metadata = _would_install(source, tmp_path, "gpu")
  assert code == 0, metadata
  assert metadata["name"] == "m4moe"
  tensorflow = [r for r in metadata["requires_dist"]
                if re.match(r"tensorflow(-cpu)?[\[=;]", r)]
  assert tensorflow == ["tensorflow[and-cuda]==2.21.0"]


def test_the_default_install_keeps_the_cpu_pin(source, tmp_path):
  code, metadata = _would_install(source, tmp_path, None)
  assert code == 0, metadata
  tensorflow = sorted(r.split(";")[0].strip()
                      for r in metadata["requires_dist"]
                      if re.match(r"tensorflow(-cpu)?[=;]", r))
  assert tensorflow == ["tensorflow-cpu==2.21.0", "tensorflow==2.21.0"]


def test_an_unknown_tensorflow_choice_stops_the_install(source, tmp_path):
  code, output = _would_install(source, tmp_path, "rocm")
  assert code != 0
  assert "M4MOE_TENSORFLOW='rocm' is not a choice" in output
