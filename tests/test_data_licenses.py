"""docs/data_licenses.md is the page the packaged corpus recipe gives, and
the generator states only what it read."""

from __future__ import annotations

import email.message
import pathlib
import zipfile

from m4moe.data import licenses
from m4moe.data import sources

ROOT = pathlib.Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "data_licenses.md"


def test_the_committed_page_is_the_generators_output():
  assert PAGE.read_text(encoding="utf-8") == licenses.render(), (
      "docs/data_licenses.md is stale; regenerate it with `python -m "
      "m4moe.data.licenses --output=docs/data_licenses.md`")


def test_every_pin_of_the_recipe_is_listed_once():
  page = PAGE.read_text(encoding="utf-8")
  pins = sources.read_recipe_dir(sources.packaged_recipe_dir())
  assert len(pins) > 100
  for pin in pins:
    assert page.count(f"| `{pin.name}` | `{pin.version}` |") == 1, pin


def _recipe(tmp_path: pathlib.Path, debian: str, pypi: str) -> pathlib.Path:
  (tmp_path / sources.DEBIAN_RECIPE).write_text(debian, encoding="utf-8")
  (tmp_path / sources.PYPI_RECIPE).write_text(pypi, encoding="utf-8")
  return tmp_path


def test_a_licence_read_from_another_version_is_marked(tmp_path):
  page = licenses.render(_recipe(
      tmp_path, "git=1:2.39.5-0+deb12u3\nsomepkg=1.0\n",
      "django==9.9\nunknown-pkg==1.0\n"))
  assert "| `git` | `1:2.39.5-0+deb12u3` | GPL-2 (read from copyright) |" \
      in page
  assert ("| `django` | `9.9` | BSD-3-Clause (read from License-Expression"
          " of version 5.2.19, not the pinned one) |") in page
  assert "| `somepkg` | `1.0` | its own (see above) |" in page
  assert "| `unknown-pkg` | `1.0` | its own (see above) |" in page
  assert "2 pins, 1 with a licence read offline." in page


def _wheel(path: pathlib.Path, headers: list[tuple[str, str]]) -> pathlib.Path:
  meta = email.message.Message()
  for key, value in headers:
    meta[key] = value
  with zipfile.ZipFile(path, "w") as wheel:
    wheel.writestr("x-1.dist-info/METADATA", meta.as_string())
  return path


def test_wheel_licence_prefers_the_expression_then_a_short_field(tmp_path):
  expression = _wheel(tmp_path / "a.whl", [
      ("Name", "a"), ("Version", "1"), ("License-Expression", "MIT"),
      ("License", "long text")])
  assert licenses.wheel_license(expression) == ("a", "1", "MIT")
  classifier = _wheel(tmp_path / "b.whl", [
      ("Name", "b"), ("Version", "2"),
      ("License", "Copyright (c) someone\n   All rights reserved."),
      ("Classifier", "License :: OSI Approved :: BSD License"),
      ("Classifier", "Programming Language :: Python")])
  assert licenses.wheel_license(classifier) == ("b", "2", "BSD License")


def test_check_wheels_names_a_wheel_the_table_does_not_describe(tmp_path):
  _wheel(tmp_path / "django-9.9-py3-none-any.whl", [
      ("Name", "Django"), ("Version", "9.9"),
      ("License-Expression", "BSD-3-Clause")])
  _wheel(tmp_path / "sphinx-9.0.4-py3-none-any.whl", [
      ("Name", "sphinx"), ("Version", "9.0.4"),
      ("License-Expression", "BSD-2-Clause")])
  problems = licenses.check_wheels(tmp_path)
  assert len(problems) == 1
  assert problems[0].startswith("django-9.9-py3-none-any.whl: states "
                                "'BSD-3-Clause' at 9.9")
