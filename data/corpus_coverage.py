"""What a corpus build left out of its recipe, said where the user looks.

A build that skips part of its recipe (the Debian half where ``apt-get``
or ``dpkg-deb`` is missing, with ``--nouse_apt``, or where a non-root
user's empty package lists find no package; a PyPI pin pip cannot fetch)
still succeeds: the pairs it has are good. But a corpus that shrank
without a word makes every later number look like the recipe's (BLEU on 8
test sentences reported as the demo's). So the build turns the skipped
pins into one warning per source kind (how many, why, how to get them)
and compares each requested language's training pairs with what the
recipe yields when nothing is skipped, recorded beside the recipe in
``expected_pairs.txt``. The report's ``reduced`` section keeps both, for
``m4moe-run`` (which refuses to train on too little) and ``m4moe-report``
(whose header says the data was reduced).

``expected_pairs.txt`` has one ``language<TAB>parts<TAB>train pairs`` line
per language and way of building the recipe (``parts``: ``debian+pypi``
for the whole recipe, ``pypi`` for the PyPI half alone); ``#`` starts a
comment. The counts are those of a build with the default settings (the
packaged split keys, no held-out packages, the default cleaning).
"""

from __future__ import annotations

import collections
import pathlib
from typing import Iterable, Mapping

from m4moe.data import sources

EXPECTED_PAIRS = "expected_pairs.txt"
ALL_PARTS = ("debian", "pypi")
_KIND_NAMES = {"debian": "Debian", "pypi": "PyPI"}
APT_MISSING = "apt-get/dpkg-deb not found"
APT_DISABLED = "disabled by --nouse_apt"


def parts_key(parts: Iterable[str]) -> str:
  """``("debian", "pypi")`` -> ``"debian+pypi"`` (the file's column)."""
  return "+".join(kind for kind in ALL_PARTS if kind in set(parts))


def read_expected_pairs(recipe_dir: pathlib.Path | None, *,
                        parts: Iterable[str]) -> dict[str, int]:
  """Training pairs per language that ``parts`` of the recipe yield.

  Empty when the recipe has no ``expected_pairs.txt`` (a local recipe).

  Raises:
    sources.RecipeError: a malformed line, naming the file and line.
  """
  if recipe_dir is None or not (recipe_dir / EXPECTED_PAIRS).is_file():
    return {}
  path = recipe_dir / EXPECTED_PAIRS
  wanted = parts_key(parts)
  out = {}
  text = path.read_text(encoding="utf-8")
  for lineno, line in enumerate(text.splitlines(), start=1):
    line = line.split("#", 1)[0].strip()
    if not line:
      continue
    fields = line.split("\t")
    if len(fields) != 3 or not fields[2].isdigit() or fields[1] not in (
        "debian+pypi", "debian", "pypi"):
      raise sources.RecipeError(
          f"{path}:{lineno}: expected 'language<TAB>debian+pypi|debian|pypi"
          f"<TAB>train pairs', got {line!r}; fix the line")
    if fields[1] == wanted:
      out[fields[0]] = int(fields[2])
  return out


def _fix(kind: str, reason: str) -> str:
  """How to get the skipped sources of ``kind`` back."""
  if kind == "debian" and reason == APT_MISSING:
    return ("run the build on a Debian/Ubuntu machine (apt-get and dpkg-deb "
            "on PATH)")
  if kind == "debian" and reason == APT_DISABLED:
    return "build without --nouse_apt on a Debian/Ubuntu machine"
  if kind == "debian":
    return ("as root run `apt-get update` (empty or stale package lists "
            "find no package) and build again")
  return ("check that pip can reach PyPI (python -m pip download --no-deps "
          "NAME==VERSION) and build again")


def _instead(kind: str, reason: str) -> str:
  """What to run where the skipped sources cannot be had."""
  if kind == "debian" and reason == APT_MISSING:
    return ("; or use the PyPI-only demo, which needs only pip: m4moe-run "
            "--recipe=demo_pypi")
  return ""


def skipped_sources(fetched: Iterable[Mapping]) -> list[dict]:
  """One entry per source kind with skipped pins: how many, why, the fix
  (``what``: the first two; ``message``: the line the build prints).

  Args:
    fetched: the report's ``sources`` (one :class:`sources.FetchResult` as
      a dict per recipe pin).
  """
  total = collections.Counter()
  reasons: dict[str, collections.Counter] = collections.defaultdict(
      collections.Counter)
  for result in fetched:
    kind = result["pin"]["kind"]
    total[kind] += 1
    if result["status"] == "skipped":
      reasons[kind][result["reason"]] += 1
  out = []
  for kind in ALL_PARTS:
    if not reasons[kind]:
      continue
    skipped = sum(reasons[kind].values())
    reason, _ = reasons[kind].most_common(1)[0]
    why = reason + (f"; and {len(reasons[kind]) - 1} other reason(s), see "
                    "report.json sources" if len(reasons[kind]) > 1 else "")
    what = (f"skipped {skipped} of {total[kind]} {_KIND_NAMES[kind]} "
            f"sources of the corpus recipe ({why})")
    fix = _fix(kind, reason)
    out.append({
        "kind": kind, "skipped": skipped, "of": total[kind], "reason": why,
        "fix": fix, "what": what,
        "message": f"{what}; to include them, {fix}{_instead(kind, reason)}"})
  return out


def lost_pairs(per_lang: Mapping[str, Mapping[str, int]], *,
               expected: Mapping[str, int], requested: Iterable[str],
               parts: str) -> dict[str, dict]:
  """Requested languages with fewer training pairs than ``expected``.

  Without a selection (``requested`` empty), every language ``expected``
  names. Each entry: ``train`` and ``test`` built, ``expected_train``.
  """
  langs = list(requested) or sorted(expected)
  out = {}
  for lang in langs:
    built = per_lang.get(lang, {})
    train = built.get("train", 0)
    want = expected.get(lang)
    if want is None or train >= want:
      continue
    out[lang] = {"train": train, "test": built.get("test", 0),
                 "expected_train": want, "parts": parts}
  return out


def lost_pairs_message(lang: str, lost: Mapping) -> str:
  """One line: what the recipe yields against what was built."""
  recipe = ("the full recipe" if lost["parts"] == "debian+pypi" else
            f"the recipe's {lost['parts']} half")
  return (f"{lang}: {lost['train']:,} training pairs built (test: "
          f"{lost['test']:,} sentences); {recipe} yields "
          f"{lost['expected_train']:,} training pairs")


def reduced_section(*, fetched: Iterable[Mapping],
                    per_lang: Mapping[str, Mapping[str, int]],
                    expected: Mapping[str, int], requested: Iterable[str],
                    parts: Iterable[str]) -> dict:
  """The report's ``reduced`` section.

  ``reduced`` is true when a recipe pin was skipped; ``languages`` then
  lists the requested languages that lost training pairs, and
  ``warnings`` holds every line the build prints about it.
  """
  skipped = skipped_sources(fetched)
  lost = (lost_pairs(per_lang, expected=expected, requested=requested,
                     parts=parts_key(parts)) if skipped else {})
  warnings = [s["message"] for s in skipped] + [
      lost_pairs_message(lang, entry) for lang, entry in lost.items()]
  return {"reduced": bool(skipped), "skipped_sources": skipped,
          "languages": lost, "warnings": warnings}
