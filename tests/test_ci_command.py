"""CI runs exactly the README's test command, and that command uses every
core and prints the slowest tests."""

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _readme_test_command() -> str:
  text = (ROOT / "README.md").read_text(encoding="utf-8")
  after = text.split("Run the test suite", 1)[1]
  return re.search(r"```sh\n(.+?)\n```", after, re.S).group(1).strip()


def test_ci_runs_the_readme_test_command():
  ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
  command = _readme_test_command()
  assert ci[-1].strip() == command, (
      ".ci/run's last line must be the README's test command")
  assert " -n auto " in command and "--durations=25" in command
  assert "-m 'not slow'" in command
