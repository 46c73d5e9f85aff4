"""One shape glossary: every module's cheat sheet and shape annotations use
the letters defined in ``m4moe/__init__.py``'s docstring."""

import pathlib
import re

import pytest

import m4moe
import m4moe.data
import m4moe.eval

_ROOT = pathlib.Path(m4moe.__file__).parent
# The package, and m4moe.data / m4moe.eval (their own directories in the
# source tree, subpackages once installed).
_PACKAGES = {"m4moe": _ROOT,
             "data": pathlib.Path(m4moe.data.__file__).parent,
             "eval": pathlib.Path(m4moe.eval.__file__).parent}
_MODULES = sorted({(name, p.relative_to(root))
                   for name, root in _PACKAGES.items()
                   for p in root.rglob("*.py")
                   if p.name != "__init__.py" and
                   (name == "m4moe" or root != _ROOT)})
# A shape: <dtype>[dims] (dims may be empty, numbers, letters, expressions).
_DTYPE = (r"(?:int32|int64|float32|float64|bfloat16|bool|string|dtype|any|"
          r"any float|activation dtype|float32 or bfloat16|int64 or float32)")
_SHAPE = re.compile(r"<" + _DTYPE + r">\[([^\]\n]*)\]")
_SYMBOL = re.compile(r"(?<![\w.])([A-Z][a-z]?)(?![\w(])")


def _glossary() -> dict[str, str]:
  doc = m4moe.__doc__
  block = doc[doc.index("Shape letters"):]
  entries = re.findall(r"^  ([A-Z][a-z]?) +(\S.*)$", block, re.MULTILINE)
  return dict(entries)


GLOSSARY = _glossary()


def _cheat_sheet(text: str) -> list[str] | None:
  """Symbols of a module docstring's "Dimensions (...):" block, or None."""
  match = re.search(r'^Dimensions[^\n]*:\n\n((?:  .*\n)+)', text,
                    re.MULTILINE)
  if match is None:
    return None
  entries = match.group(1).replace("\n", " ").rstrip(" .").split(";")
  return [e.split(":")[0].split("=")[0].strip() for e in entries]


def test_glossary_defines_each_letter_once_with_gshard_letters():
  doc = m4moe.__doc__
  block = doc[doc.index("Shape letters"):]
  symbols = re.findall(r"^  ([A-Z][a-z]?) +\S", block, re.MULTILINE)
  assert len(symbols) == len(set(symbols)) == len(GLOSSARY) > 20
  # GShard Algorithm 2's letters keep the paper's meaning.
  for letter, meaning in {"G": "groups", "S": "group size", "E": "experts",
                          "C": "capacity", "M": "model width",
                          "H": "expert hidden", "N": "tokens"}.items():
    assert meaning in GLOSSARY[letter], letter


def test_every_cheat_sheet_uses_glossary_letters():
  sheets = {}
  for name, module in _MODULES:
    text = (_PACKAGES[name] / module).read_text(encoding="utf-8")
    doc = text.split('"""')[1] if text.count('"""') >= 2 else ""
    if re.search(r"^Dimensions", doc, re.MULTILINE):
      sheets[f"{name}/{module}"] = _cheat_sheet(doc + "\n")
  assert len(sheets) >= 8
  for module, symbols in sheets.items():
    assert symbols, f"{module}: cheat sheet not in the 'X: meaning; ...' form"
    unknown = [s for s in symbols if s not in GLOSSARY]
    assert not unknown, f"{module}: letters {unknown} not in the glossary"


@pytest.mark.parametrize("name, module", _MODULES,
                         ids=[f"{n}/{m}" for n, m in _MODULES])
def test_shape_annotations_use_glossary_letters(name, module):
  text = (_PACKAGES[name] / module).read_text(encoding="utf-8")
  unknown = set()
  for dims in _SHAPE.findall(text):
    unknown.update(s for s in _SYMBOL.findall(dims) if s not in GLOSSARY)
  assert not unknown, f"letters {sorted(unknown)} not in the glossary"


def test_the_checks_catch_a_stray_letter():
  assert _cheat_sheet("Dimensions:\n\n  B: rows; Z: zeds.\n") == ["B", "Z"]
  assert "Z" not in GLOSSARY
  assert _SYMBOL.findall("B, 1 or A, Q*Z, Ls") == ["B", "A", "Q", "Z", "Ls"]
  assert _SHAPE.findall("x <float32>[B, Z] and (?P<lang>[A-Za-z])") == ["B, Z"]


@pytest.mark.parametrize("name", sorted(_PACKAGES))
def test_package_map_names_every_module(name):
  root = _PACKAGES[name]
  doc = (root / "__init__.py").read_text(encoding="utf-8").split('"""')[1]
  named = set(re.findall(r"``(\w+)``", doc))
  modules = {p.stem for p in root.glob("*.py") if p.stem != "__init__"}
  modules |= {p.name for p in root.iterdir()
              if (p / "__init__.py").exists() and p.name in
              ("training", "benchmarks", "cli")}
  assert not modules - named, f"{name}/__init__.py does not map these"
