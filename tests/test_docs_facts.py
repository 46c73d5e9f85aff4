"""Statements of the docs that name parts of the code still name them right.

Lists the docs give of the code's own sets (the recipes ``--recipe``
takes, the router classes) must be complete, and a class the docs say is
defined in a module must be defined there: these went stale before.
"""

from __future__ import annotations

import pathlib
import re

import pytest

from m4moe.pipeline import recipes

ROOT = pathlib.Path(__file__).resolve().parent.parent
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])


def _paragraphs(page: pathlib.Path) -> list[str]:
  text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"),
                flags=re.S)
  return [" ".join(p.split()) for p in re.split(r"\n\s*\n", text)]


def test_cli_md_names_every_packaged_recipe():
  page = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
  tool_row, = [line for line in page.splitlines()
               if line.startswith("| `m4moe-run` |")]
  accepted, = [p for p in _paragraphs(ROOT / "docs" / "cli.md")
               if "`--recipe` is" in p]
  for name in recipes.packaged_names():
    assert f"`{name}`" in tool_row, f"cli.md's tool table omits {name}"
    assert f"`{name}`" in accepted, f"cli.md's --recipe list omits {name}"
    assert f"- **`{name}`**" in page, f"cli.md describes no recipe {name}"


def test_routing_md_names_every_router_class():
  layer = (ROOT / "m4moe" / "moe" / "layer.py").read_text(encoding="utf-8")
  classes = dict(re.findall(r'"(\w+)": routing\.(\w+Router)\b', layer))
  assert len(classes) >= 5
  page = (ROOT / "docs" / "design" / "routing.md").read_text(
      encoding="utf-8")
  for router, cls in classes.items():
    assert f"`{cls}` for `{router}`" in " ".join(page.split()), (
        f"design/routing.md does not name {cls} (--router={router})")


_ATTRIBUTION = re.compile(
    r"((?:`[A-Z]\w+`(?:,? and |, | or )?)+) in `([\w/]+\.py)`")


def _attributions() -> list[tuple[str, str, str]]:
  """(page, class, module path) for "`A`, `B` in `path.py`" phrases."""
  out = []
  for page in PAGES:
    for paragraph in _paragraphs(page):
      for names, path in _ATTRIBUTION.findall(paragraph):
        out += [(str(page.relative_to(ROOT)), name, path)
                for name in re.findall(r"`([A-Z]\w+)`", names)]
  return out


def test_the_docs_attribute_classes():
  found = {name for _, name, _ in _attributions()}
  assert {"ModelConfig", "AdafactorConfig", "TrainConfig",
          "DataConfig"} <= found


@pytest.mark.parametrize("page,name,path", _attributions())
def test_a_name_is_defined_where_the_docs_say(page, name, path):
  module = ROOT / path
  assert module.is_file(), f"{page}: {path} does not exist"
  defined = rf"^(class {name}\b|def {name}\b|{name}\s*[:=])"
  assert re.search(defined, module.read_text(encoding="utf-8"), re.M), (
      f"{page}: {name} is not defined in {path}")
