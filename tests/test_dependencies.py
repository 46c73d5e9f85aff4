"""Every third-party module the package imports is declared in setup.py.

The README's first command installs with ``pip install -e .`` on a fresh
machine, so a module found only because the developer's interpreter
happens to have it (scipy did, once: the demo's report stage failed on a
fresh virtualenv) must be caught here rather than by a user. The TPU
recipe in docs/tpu.md repeats the list for ``pip install --no-deps``; it is
checked against setup.py too.
"""

from __future__ import annotations

import ast
import importlib.metadata
import pathlib
import re
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
# The directories installed as m4moe, m4moe.data, m4moe.eval, m4moe.configs.
PACKAGE_DIRS = ("m4moe", "data", "eval", "configs")

# Imported but deliberately not in install_requires, each with the reason.
NOT_DECLARED = {
    # Installed by tensorflow-datasets (epath) and tensorflow (protobuf).
    "etils": "tensorflow-datasets",
    "google": "tensorflow",
    # Optional: m4moe-export imports it lazily and says how to install it.
    "tensorflow_text": "optional",
    # The peer toolkit runs in its own virtualenv (m4moe.benchmarks.peer).
    "opennmt": "peer virtualenv",
}


def _normalise(name: str) -> str:
  return re.sub(r"[-_.]+", "-", name).lower()


def _requirement_name(requirement: str) -> str:
  return _normalise(re.split(r"[<>=!~;\[ ]", requirement, maxsplit=1)[0])


def _install_requires() -> list[str]:
  tree = ast.parse((ROOT / "setup.py").read_text(encoding="utf-8"))
  for node in ast.walk(tree):
    if isinstance(node, ast.keyword) and node.arg == "install_requires":
      return [ast.literal_eval(element) for element in node.value.elts]
  raise AssertionError("setup.py has no install_requires list")


def _third_party_imports() -> dict[str, set[str]]:
  """Top-level module name -> the files that import it."""
  found: dict[str, set[str]] = {}
  for directory in PACKAGE_DIRS:
    for path in sorted((ROOT / directory).rglob("*.py")):
      if "results" in path.relative_to(ROOT).parts:
        continue  # committed result scripts are not installed code
      tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
      for node in ast.walk(tree):
        if isinstance(node, ast.Import):
          names = [alias.name for alias in node.names]
        elif (isinstance(node, ast.ImportFrom) and node.level == 0
              and node.module):
          names = [node.module]
        else:
          continue
        for name in names:
          top = name.split(".")[0]
          if top in sys.stdlib_module_names or top == "m4moe":
            continue
          found.setdefault(top, set()).add(str(path.relative_to(ROOT)))
  return found


def _distributions(module: str) -> set[str]:
  """Distribution names that provide ``module`` (its own name if none)."""
  mapping = importlib.metadata.packages_distributions()
  return {_normalise(d) for d in mapping.get(module, [module])}


def test_requirement_name_parsing():
  assert _requirement_name("tensorboard==2.21.*") == "tensorboard"
  assert _requirement_name("absl-py>=2.1") == "absl-py"
  assert _requirement_name(
      "tensorflow-cpu==2.21.0; platform_machine=='x86_64'") == "tensorflow-cpu"
  assert _requirement_name("sacrebleu[ja,ko]") == "sacrebleu"


def test_the_scan_sees_known_imports():
  # Guards the scan itself: if it found nothing, the next test would pass
  # vacuously.
  imports = _third_party_imports()
  assert {"tensorflow", "absl", "numpy", "sacrebleu", "scipy"} <= set(imports)
  assert "eval/seeds.py" in imports["scipy"]


def test_every_third_party_import_is_declared():
  declared = {_requirement_name(r) for r in _install_requires()}
  # tensorflow is declared per platform (tensorflow-cpu on x86-64).
  declared |= {"tensorflow"} if declared & {"tensorflow-cpu"} else set()
  missing = {}
  for module, files in sorted(_third_party_imports().items()):
    if module in NOT_DECLARED:
      continue
    if not _distributions(module) & declared:
      missing[module] = sorted(files)
  assert not missing, (
      f"imported but not in setup.py install_requires: {missing}; add each "
      "to install_requires (and to docs/tpu.md's TPU pip list), or to "
      "NOT_DECLARED in this test with the reason")


@pytest.mark.parametrize("module", sorted(NOT_DECLARED))
def test_undeclared_modules_are_still_imported(module):
  # Keeps NOT_DECLARED from outliving the imports it excuses.
  assert module in _third_party_imports()


def test_tpu_recipe_pip_list_matches_setup():
  readme = (ROOT / "docs" / "tpu.md").read_text(encoding="utf-8")
  match = re.search(r"pip install --no-deps -e ~/m4moe\npip install (.*?)\n"
                    r"(?!    )", readme, flags=re.DOTALL)
  assert match, "docs/tpu.md: `pip install` after `--no-deps` not found"
  listed = re.findall(r"'([^']+)'", match.group(1))
  # Everything but TensorFlow itself, which the VM gets as tensorflow-tpu.
  declared = [r for r in _install_requires()
              if _requirement_name(r) not in ("tensorflow", "tensorflow-cpu")]
  assert sorted(listed) == sorted(declared)
