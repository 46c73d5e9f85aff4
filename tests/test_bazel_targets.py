"""The Bazel BUILD files cover every module, console script and test file.

Bazel itself is not needed: each BUILD file is evaluated as Python (Starlark
BUILD files are a Python subset) with stand-ins for the rules and for
``glob``, which follow Bazel's semantics (paths relative to the package,
never descending into a subdirectory that has its own BUILD file).
"""

from __future__ import annotations

import ast
import dataclasses
import pathlib
import re
from typing import Any

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
BUILD_NAMES = ("BUILD", "BUILD.bazel")
PY_RULES = ("py_library", "py_binary", "py_test")


@dataclasses.dataclass
class Target:
  package: str  # e.g. "m4moe/cli" ("" for the root package)
  rule: str
  name: str
  attrs: dict[str, Any]

  @property
  def label(self) -> str:
    return f"//{self.package}:{self.name}"


def _is_package(directory: pathlib.Path) -> bool:
  return any((directory / name).is_file() for name in BUILD_NAMES)


def _glob(package_dir: pathlib.Path, include: list[str],
          exclude: list[str] = ()) -> list[str]:
  def matches(patterns):
    found = set()
    for pattern in patterns:
      if pattern == "**" or pattern.endswith("/**"):
        pattern += "/*"  # Bazel's trailing ** matches files; pathlib's dirs.
      for path in package_dir.glob(pattern):
        if path.is_file():
          found.add(path)
    return found

  out = []
  for path in sorted(matches(include) - matches(exclude)):
    rel = path.relative_to(package_dir)
    parents = [package_dir / p for p in list(rel.parents)[:-1]]
    if any(_is_package(p) for p in parents):
      continue  # Belongs to a subpackage.
    out.append(rel.as_posix())
  return out


def _evaluate(build_file: pathlib.Path) -> list[Target]:
  package_dir = build_file.parent
  package = package_dir.relative_to(ROOT).as_posix().strip(".")
  targets: list[Target] = []

  def rule(kind):
    def define(**attrs):
      targets.append(Target(package, kind, attrs["name"], attrs))
    return define

  namespace = {
      "load": lambda *args, **kwargs: None,
      "package": lambda **kwargs: None,
      "exports_files": lambda *args, **kwargs: None,
      "glob": lambda include, exclude=(), **kw: _glob(package_dir, include,
                                                      list(exclude)),
      "__builtins__": {"len": len, "range": range, "str": str, "list": list},
  }
  for kind in (*PY_RULES, "filegroup", "subpackage_tree", "test_suite"):
    namespace[kind] = rule(kind)
  code = compile(build_file.read_text(), str(build_file), "exec")
  exec(code, namespace)  # pylint: disable=exec-used
  return targets


def _all_targets() -> dict[str, Target]:
  targets = {}
  for name in BUILD_NAMES:
    for build_file in ROOT.rglob(name):
      if any(part.startswith(("bazel-", ".")) for part in
             build_file.relative_to(ROOT).parts):
        continue
      for target in _evaluate(build_file):
        targets[target.label] = target
  return targets


def _resolve(label: str, package: str) -> str:
  if label.startswith(":"):
    return f"//{package}{label}"
  if label.startswith("//"):
    return label if ":" in label else f"{label}:{label.rsplit('/', 1)[-1]}"
  return label  # A file in the same package.


def _files(target: Target, attr: str, targets: dict[str, Target]) -> set[str]:
  """Repository-relative source files of ``attr``, through filegroups."""
  out = set()
  for item in target.attrs.get(attr, []):
    resolved = _resolve(item, target.package)
    if resolved.startswith("//"):
      assert resolved in targets, f"{target.label}: unknown label {item}"
      dep = targets[resolved]
      out |= _files(dep, "srcs", targets)
    else:
      out.add(f"{target.package}/{item}".lstrip("/"))
  return out


def _python_files(target: Target, targets: dict[str, Target]) -> set[str]:
  """Python files a py_* target makes importable (srcs + subpackage trees)."""
  files = _files(target, "srcs", targets)
  for item in target.attrs.get("data", []):
    dep = targets.get(_resolve(item, target.package))
    if dep is not None and dep.rule == "subpackage_tree":
      files |= _files(dep, "srcs", targets)
  return files


@pytest.fixture(scope="module")
def targets() -> dict[str, Target]:
  return _all_targets()


def _repo_files(pattern: str) -> list[str]:
  return sorted(p.relative_to(ROOT).as_posix() for p in ROOT.glob(pattern)
                if "__pycache__" not in p.parts)


def test_build_files_parse_and_reference_existing_files(targets):
  assert len(targets) > 10
  for target in targets.values():
    for attr in ("srcs", "data", "deps"):
      for item in target.attrs.get(attr, []):
        resolved = _resolve(item, target.package)
        if resolved.startswith("//"):
          assert resolved in targets, f"{target.label}: no target {item}"
        else:
          path = ROOT / target.package / item
          assert path.is_file(), f"{target.label}: {attr} {item} missing"


@pytest.mark.parametrize("pattern", ["m4moe/**/*.py", "data/**/*.py",
                                     "eval/**/*.py", "configs/**/*.py",
                                     "configs/**/*.flags", "tests/*.py"])
def test_every_module_is_in_a_python_target(targets, pattern):
  covered = set()
  for target in targets.values():
    if target.rule in PY_RULES:
      covered |= _python_files(target, targets)
  missing = [f for f in _repo_files(pattern) if f not in covered]
  assert not missing, f"not covered by any py_* target: {missing}"


def test_subpackage_trees_match_setup_py_package_dir(targets):
  setup = (ROOT / "setup.py").read_text()
  mapping = dict(re.findall(r'"m4moe\.(\w+)":\s*"(\w+)"', setup))
  trees = {t.attrs["dir_name"]: t.attrs["strip_prefix"]
           for t in targets.values() if t.rule == "subpackage_tree"}
  assert mapping, "setup.py has no package_dir mapping"
  for subpackage, directory in mapping.items():
    assert trees.get(subpackage) == f"{directory}/", (subpackage, trees)


def _console_scripts() -> list[str]:
  setup = (ROOT / "setup.py").read_text()
  match = re.search(r"for name in (\([^)]*\))", setup)
  assert match, "setup.py: CONSOLE_SCRIPTS name tuple not found"
  return list(ast.literal_eval(match.group(1)))


def test_setup_py_declares_the_console_scripts():
  assert {"info", "train", "decode"} <= set(_console_scripts())


@pytest.mark.parametrize("name", _console_scripts())
def test_every_console_script_has_a_py_binary(targets, name):
  assert (ROOT / "m4moe" / "cli" / f"{name}.py").is_file(), (
      f"setup.py declares m4moe-{name} but m4moe/cli/{name}.py is missing")
  target = targets.get(f"//m4moe/cli:{name}")
  assert target is not None and target.rule == "py_binary", name
  assert target.attrs["main"] == f"{name}.py"
  assert target.attrs["srcs"] == [f"{name}.py"]


def test_every_test_file_has_a_pytest_target(targets):
  tests = {t.name: t for t in targets.values()
           if t.rule == "py_test" and t.package == "tests"}
  for path in _repo_files("tests/test_*.py"):
    name = pathlib.Path(path).stem
    assert name in tests, f"{path} has no py_test"
    target = tests[name]
    # Run through pytest with the file as its argument, not as a script
    # (pytest-style files do nothing when executed directly).
    assert target.attrs["main"] == "pytest_main.py"
    assert target.attrs["args"] == [f"$(location {name}.py)"]
    srcs = set(target.attrs["srcs"])
    assert {f"{name}.py", "pytest_main.py"} <= srcs
    # Helpers and conftest.py (not other tests) ride along with every test.
    helpers = {p.name for p in (ROOT / "tests").glob("*.py")
               if not p.name.startswith("test_")}
    assert srcs == helpers | {f"{name}.py"}
    deps = {_resolve(d, "tests") for d in target.attrs["deps"]}
    assert {"//m4moe:m4moe", "//m4moe:data", "//m4moe:eval",
            "//m4moe/cli:cli"} <= deps


def test_glob_stand_in_skips_subpackages(tmp_path):
  (tmp_path / "pkg" / "sub").mkdir(parents=True)
  (tmp_path / "pkg" / "other").mkdir()
  for rel in ("pkg/a.py", "pkg/sub/b.py", "pkg/sub/BUILD", "pkg/other/c.py"):
    (tmp_path / rel).write_text("")
  assert _glob(tmp_path / "pkg", ["**/*.py"]) == ["a.py", "other/c.py"]
  assert _glob(tmp_path / "pkg", ["**/*.py"], ["other/*"]) == ["a.py"]
  assert _glob(tmp_path / "pkg", ["**"]) == ["a.py", "other/c.py"]
  assert _glob(tmp_path / "pkg", ["**"], ["other/**"]) == ["a.py"]
