"""The installed package works without the source tree.

The wheel is built from a copy of the tracked files (so the build writes
nothing into the checkout), installed into a scratch directory, and run
from another directory: ``m4moe-info`` must find the zoo's flagfiles and
``m4moe-run --recipe=smoke --stop_after=corpus`` the packaged recipe and
split keys, all from the wheel.
"""

import os
import pathlib
import subprocess
import sys
import zipfile

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent


@pytest.fixture(name="installed", scope="module")
def fixture_installed(tmp_path_factory):
  """(site dir, scripts dir) of the wheel installed into a scratch dir."""
  scratch = tmp_path_factory.mktemp("wheel")
  source = scratch / "source"
  tracked = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, check=True,
                           capture_output=True).stdout.decode().split("\0")
  for name in filter(None, tracked):
    if (ROOT / name).is_file() and not name.startswith("results/"):
      (source / name).parent.mkdir(parents=True, exist_ok=True)
      (source / name).write_bytes((ROOT / name).read_bytes())
  subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps",
                  "-q", "-w", str(scratch / "dist"),
                  str(source)], check=True, capture_output=True, timeout=600)
  wheel, = (scratch / "dist").glob("m4moe-*.whl")
  names = zipfile.ZipFile(wheel).namelist()
  for packaged in ("m4moe/configs/tiny/moe.flags",
                   "m4moe/configs/recipes/smoke.toml",
                   "m4moe/data/splits/split_keys.txt"):
    assert packaged in names, f"{packaged} missing from the wheel"
  site = scratch / "site"
  subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q",
                  "--target", str(site), str(wheel)], check=True,
                 capture_output=True, timeout=600)
  return site, site / "bin"


def _run(installed, tmp_path, *command):
  site, scripts = installed
  env = {**os.environ, "PYTHONPATH": str(site)}
  return subprocess.run([sys.executable, str(scripts / command[0]),
                         *command[1:]], cwd=tmp_path, env=env,
                        capture_output=True, text=True, timeout=600,
                        check=False)


def test_the_wheel_holds_the_package_and_its_files(installed):
  site, _ = installed
  probe = subprocess.run(
      [sys.executable, "-c", "import m4moe.config; print(m4moe.__file__)"],
      cwd=site.parent, env={**os.environ, "PYTHONPATH": str(site)},
      capture_output=True, text=True, check=True)
  assert probe.stdout.strip().startswith(str(site))


def test_info_runs_from_the_wheel(installed, tmp_path):
  proc = _run(installed, tmp_path, "m4moe-info", "--config=tiny/moe")
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert "num_experts" in proc.stdout or "experts" in proc.stdout


def test_smoke_corpus_stage_runs_from_the_wheel(installed, tmp_path):
  proc = _run(installed, tmp_path, "m4moe-run", "--recipe=smoke",
              "--run_dir=runs/smoke", "--stop_after=corpus")
  assert proc.returncode == 0, proc.stderr[-3000:]
  corpus = tmp_path / "runs" / "smoke" / "corpus"
  assert (corpus / "report.json").is_file()
  assert list((corpus / "train").glob("*.tsv"))
