"""Every package's docstring lists exactly the modules it holds.

A newcomer finds their way by these lists (``m4moe/__init__.py`` and each
subpackage's ``__init__.py``: one bullet ``* ``name``: what it is`` per
module or subpackage), so a module added, moved or removed must change
the list too: a name listed without its file, or a file without its
line, fails here.
"""

from __future__ import annotations

import ast
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
# The installed package m4moe.<name> for the repository's top-level
# directories (setup.py's package_dir).
INSTALLED_AS = {"data": "m4moe.data", "eval": "m4moe.eval",
                "configs": "m4moe.configs"}
_BULLET = re.compile(r"^\* ``(\w+)``", re.MULTILINE)


def _packages() -> list[pathlib.Path]:
  found = sorted(p.parent for p in (ROOT / "m4moe").rglob("__init__.py"))
  return found + [ROOT / "data", ROOT / "eval"]


def _name(package: pathlib.Path) -> str:
  relative = package.relative_to(ROOT)
  return INSTALLED_AS.get(str(relative), ".".join(relative.parts))


def _listed(package: pathlib.Path) -> list[str]:
  docstring = ast.get_docstring(ast.parse(
      (package / "__init__.py").read_text(encoding="utf-8"))) or ""
  return _BULLET.findall(docstring)


def _held(package: pathlib.Path) -> set[str]:
  names = {p.stem for p in package.glob("*.py") if p.stem != "__init__"}
  names |= {p.name for p in package.iterdir()
            if (p / "__init__.py").is_file()}
  if package == ROOT / "m4moe":
    names |= set(INSTALLED_AS)
  return names


@pytest.mark.parametrize("package", _packages(), ids=_name)
def test_package_docstring_lists_its_modules(package):
  listed = _listed(package)
  init = package.relative_to(ROOT) / "__init__.py"
  twice = sorted({n for n in listed if listed.count(n) > 1})
  assert not twice, f"{init} lists {twice} more than once"
  held = _held(package)
  assert not set(listed) - held, (
      f"{init} lists {sorted(set(listed) - held)}, which {package.name}/ "
      "does not hold: remove them from its docstring")
  assert not held - set(listed), (
      f"{package.name}/ holds {sorted(held - set(listed))}, which {init} "
      "does not list: add a line '* ``name``: what it is' for each")


def test_the_check_sees_a_missing_and_an_extra_module(tmp_path):
  package = tmp_path / "pkg"
  package.mkdir()
  (package / "__init__.py").write_text(
      '"""Pkg.\n\n* ``a``: one.\n* ``gone``: was here.\n"""\n')
  (package / "a.py").write_text("")
  (package / "b.py").write_text("")
  assert _listed(package) == ["a", "gone"]
  assert _held(package) == {"a", "b"}
