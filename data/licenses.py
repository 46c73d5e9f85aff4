"""The licences of the corpus's source packages, as a page generated from
the packaged corpus recipe (``docs/data_licenses.md``).

Every pair of the localisation corpus comes from a gettext catalog of a
third-party package pinned in ``data/recipes/``, and every such text keeps
the licence of its package, whatever the licence of m4moe's code. The
recipe records names and versions, not licences, so the licences known here
(:data:`KNOWN_LICENSES`) were read offline from the package metadata at the
pinned version: a wheel's ``METADATA`` (``License-Expression``, else a short
``License`` field, else its licence classifier) and, for Debian packages,
the ``Files: *`` stanza of a machine-readable ``copyright`` file of the
same version. Packages without a recorded licence are listed with where
to read theirs; a recorded licence read from another version than the
recipe pins is marked as such, so the page never states more than was read.

  python -m m4moe.data.licenses --output=docs/data_licenses.md
  python -m m4moe.data.licenses --check_wheels=CACHE_DIR/downloads/pypi

``--check_wheels`` compares the table with the ``METADATA`` of downloaded
wheels (e.g. ``m4moe-build-corpus``'s cache) and exits 1 on a difference.
"""

from __future__ import annotations

import dataclasses
import email
import pathlib
import sys
import zipfile
from typing import Sequence

from absl import app
from absl import flags

from m4moe.data import sources

# (kind, name) -> (licence, version it was read from, what it was read from).
KNOWN_LICENSES: dict[tuple[str, str], tuple[str, str, str]] = {
    ("debian", "git"): ("GPL-2", "1:2.39.5-0+deb12u3", "copyright"),
    ("debian", "gnupg-l10n"): ("GPL-3+", "2.2.40-1.1+deb12u2", "copyright"),
    ("debian", "vim-runtime"): ("Vim", "2:9.0.1378-2+deb12u2", "copyright"),
    ("pypi", "Trac"): ("BSD", "1.6", "License"),
    ("pypi", "ckan"): ("AGPL-3.0-or-later", "2.12.0", "Classifier"),
    ("pypi", "deluge"): ("GPL-3.0-or-later", "2.2.0", "Classifier"),
    ("pypi", "django"): ("BSD-3-Clause", "5.2.19", "License-Expression"),
    ("pypi", "indico"): ("MIT", "3.2.9", "License"),
    ("pypi", "kolibri"): ("MIT", "0.19.5", "License"),
    ("pypi", "plone-app-locales"): ("GPL-2.0", "7.0.4", "Classifier"),
    ("pypi", "pretix"): ("AGPL-3.0 with additional terms under its section 7",
                         "2026.8.0", "License"),
    ("pypi", "sphinx"): ("BSD-2-Clause", "9.0.4", "License-Expression"),
    ("pypi", "translate-toolkit"): ("GPL-3.0-or-later", "3.20.4",
                                    "License-Expression"),
    ("pypi", "tryton"): ("GPL-3.0-or-later", "8.2.0", "License-Expression"),
    ("pypi", "wagtail"): ("BSD-3-Clause", "8.0.1", "License-Expression"),
    ("pypi", "weblate"): ("GPL-3.0-or-later", "5.14.3", "License-Expression"),
}
# Every JupyterLab language pack: BSD-3-Clause text in License, BSD
# classifier.
_JUPYTERLAB_PACK = ("jupyterlab-language-pack-", "BSD-3-Clause",
                    "4.5.post3", "License")
# The Debian release the pins come from (``+deb12``): its package pages.
DEBIAN_SUITE = "bookworm"

_HEADER = """\
# Licences of the corpus's source texts

<!-- Generated from data/recipes/ by `python -m m4moe.data.licenses
--output=docs/data_licenses.md`; tests/test_data_licenses.py checks that
this page is what the recipe gives. Do not edit by hand. -->

m4moe's code is under the Apache License 2.0 ([LICENSE](../LICENSE)). The
corpus it builds is not m4moe's: every sentence pair comes from a
localisation catalog of a package pinned in `data/recipes/`, and keeps the
licence of that package. A corpus built from the recipe, and anything
derived from it, should be redistributed only as those licences allow;
this page lists them so that can be checked, and is not legal advice.

The recipe records package names and versions, not licences. A licence
given below was read offline from the package at the version shown (a
wheel's `METADATA`: `License-Expression`, else a short `License` field,
else its licence classifier; a Debian package's machine-readable
`copyright` file, its `Files: *` stanza, which covers most but not always
all of the package). Where none is given, the package keeps its own
licence: read it in its `copyright` file, which `m4moe-build-corpus`
downloads with the package
(`dpkg-deb --fsys-tarfile CACHE_DIR/downloads/debian/NAME_*.deb | tar -xO
./usr/share/doc/NAME/copyright`), or on its page
`https://packages.debian.org/{suite}/NAME` ("Copyright File").

"""


@dataclasses.dataclass(frozen=True)
class Row:
  """One pinned package and what is known of its licence."""

  pin: sources.Pin
  license: str  # "" when none was recorded
  read_from: str  # e.g. "License-Expression", "copyright"
  read_version: str


def known_license(pin: sources.Pin) -> Row:
  """The :class:`Row` of ``pin`` from :data:`KNOWN_LICENSES`."""
  key = (pin.kind, pin.name)
  if key in KNOWN_LICENSES:
    license_, version, field = KNOWN_LICENSES[key]
    return Row(pin, license_, field, version)
  prefix, license_, version, field = _JUPYTERLAB_PACK
  if pin.kind == "pypi" and pin.name.startswith(prefix):
    return Row(pin, license_, field, version)
  return Row(pin, "", "", "")


def _cell(row: Row) -> str:
  if not row.license:
    return "its own (see above)"
  note = f" (read from {row.read_from}"
  if row.read_version != row.pin.version:
    note += f" of version {row.read_version}, not the pinned one"
  return row.license + note + ")"


def _table(rows: list[Row]) -> list[str]:
  out = ["| package | pinned version | licence |", "| --- | --- | --- |"]
  out += [f"| `{r.pin.name}` | `{r.pin.version}` | {_cell(r)} |"
          for r in rows]
  return out


def _recipe_uses() -> list[str]:
  """Which run recipe (configs/recipes) builds its corpus from what."""
  from m4moe.pipeline import recipes  # pylint: disable=g-import-not-at-top
  out = ["| run recipe | corpus |", "| --- | --- |"]
  for name in recipes.packaged_names():
    recipe = recipes.load_recipe(name)
    if not recipe.use_packaged_corpus_recipe:
      what = "generated catalogs (no third-party text)"
    else:
      langs = ", ".join(recipe.languages) or "every language"
      what = f"the packaged recipe below, languages {langs}"
    out.append(f"| `{name}` | {what} |")
  return out


def render(recipe_dir: pathlib.Path | None = None) -> str:
  """The page for the corpus recipe in ``recipe_dir`` (default: the
  packaged one, ``data/recipes/``)."""
  recipe_dir = recipe_dir or sources.packaged_recipe_dir()
  rows = [known_license(p) for p in sources.read_recipe_dir(recipe_dir)]
  lines = [_HEADER.format(suite=DEBIAN_SUITE).rstrip("\n"), "",
           "## Which run recipes use it", "", *_recipe_uses()]
  for kind, fname, title in (
      ("debian", sources.DEBIAN_RECIPE, "Debian packages"),
      ("pypi", sources.PYPI_RECIPE, "PyPI packages")):
    part = [r for r in rows if r.pin.kind == kind]
    known = sum(1 for r in part if r.license)
    lines += ["", f"## {title} (`data/recipes/{fname}`)", "",
              f"{len(part)} pins, {known} with a licence read offline.", "",
              *_table(part)]
  return "\n".join(lines) + "\n"


def _normalise(name: str) -> str:
  return name.lower().replace("_", "-").replace(".", "-")


def wheel_license(path: pathlib.Path) -> tuple[str, str, str]:
  """(name, version, licence as METADATA states it) of a wheel: its
  ``License-Expression``, else a one-line ``License`` field, else its
  licence classifiers joined by "; " ("" when it states none).

  Raises:
    ValueError: ``path`` is not a wheel with a ``.dist-info/METADATA``.
  """
  try:
    with zipfile.ZipFile(path) as wheel:
      names = [n for n in wheel.namelist()
               if n.endswith(".dist-info/METADATA") and n.count("/") == 1]
      if not names:
        raise ValueError(f"{path}: no .dist-info/METADATA; is it a wheel?")
      meta = email.message_from_bytes(wheel.read(names[0]))
  except zipfile.BadZipFile as e:
    raise ValueError(f"{path}: not a wheel (zip) file: {e}") from e
  license_ = (meta.get("License-Expression") or "").strip()
  field = (meta.get("License") or "").strip()
  if not license_ and field and "\n" not in field and len(field) < 40:
    license_ = field
  if not license_:
    license_ = "; ".join(c.split("::")[-1].strip()
                         for c in meta.get_all("Classifier") or []
                         if c.startswith("License ::"))
  return meta.get("Name", ""), meta.get("Version", ""), license_


def check_wheels(wheel_dir: pathlib.Path) -> list[str]:
  """Each downloaded wheel of a pinned PyPI package whose version or
  stated licence differs from :data:`KNOWN_LICENSES`, as a message."""
  pins = {_normalise(p.name): p for p in
          sources.read_recipe_dir(sources.packaged_recipe_dir())
          if p.kind == "pypi"}
  problems = []
  for path in sorted(wheel_dir.glob("*.whl")):
    name, version, stated = wheel_license(path)
    pin = pins.get(_normalise(name))
    if pin is None:
      continue
    row = known_license(pin)
    if not row.license or row.read_version != version:
      problems.append(f"{path.name}: states {stated!r} at {version}; the "
                      f"table has {row.license!r} at {row.read_version!r}: "
                      "update KNOWN_LICENSES")
  return problems


_OUTPUT = flags.DEFINE_string(
    "output", None, "Write the page here (docs/data_licenses.md); without "
    "it (and without --check_wheels) the page is printed.")
_CHECK_WHEELS = flags.DEFINE_string(
    "check_wheels", None, "A directory of downloaded wheels (e.g. "
    "CACHE_DIR/downloads/pypi): report pins whose recorded licence or "
    "version differs from the wheel's, exit 1 if any.")


def main(argv: Sequence[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  if _CHECK_WHEELS.value:
    wheel_dir = pathlib.Path(_CHECK_WHEELS.value)
    if not wheel_dir.is_dir():
      raise app.UsageError(f"--check_wheels={wheel_dir} is not a directory")
    problems = check_wheels(wheel_dir)
    print("\n".join(problems) or "every downloaded pinned wheel agrees")
    sys.exit(1 if problems else 0)
  page = render()
  if _OUTPUT.value:
    pathlib.Path(_OUTPUT.value).write_text(page, encoding="utf-8")
  else:
    print(page, end="")


if __name__ == "__main__":
  app.run(main)
