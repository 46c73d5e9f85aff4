"""Leak-free train/dev/test split keyed on the English sentence.

Every pair belongs to the *group* of its English side: the English text
case-folded, with placeholders, digits, punctuation and symbols removed and
white space collapsed (:func:`group_key`), so "Open file…", "Open File" and
"Open file %s" fall into one group. A group's id is the first 12 hex digits of
the SHA-256 of its key (:func:`group_id`). The split is a function of the
group id alone, so one English sentence (or a near-duplicate of it) is in the
same split for every language: nothing English in dev/test is in train.

Choosing dev/test (:func:`choose_split_keys`): groups are ranked by how many
languages translate them (capped at ``coverage_cap``, so the choice is not
just the very most common strings), then by group id (a fixed pseudo-random
order); the first ``dev_groups`` go to dev, the next ``test_groups`` to test.
Multi-way groups make the test sets parallel across languages.

The chosen ids are frozen in a small text file (``data/splits/``); building
with that file reproduces the split whatever else the corpus gains or loses:
a group not in the file is train.
"""

from __future__ import annotations

import dataclasses
import hashlib
import pathlib
import re
import unicodedata
from typing import Mapping

from m4moe.data import cleaning

SPLITS = ("train", "dev", "test")
_NON_WORD = re.compile(r"[\W\d_]+")


@dataclasses.dataclass(frozen=True, kw_only=True)
class SplitConfig:
  """How many English groups go to dev and test.

  Attributes:
    dev_groups: English groups in dev.
    test_groups: English groups in test.
    coverage_cap: groups translated into at least this many languages rank
      equally (then by id).
    min_languages: groups translated into fewer languages are never chosen.
  """

  dev_groups: int = 500
  test_groups: int = 1000
  coverage_cap: int = 40
  min_languages: int = 2

  def __post_init__(self):
    if self.dev_groups < 0 or self.test_groups < 0:
      raise ValueError("--dev_groups/--test_groups must be >= 0")
    if self.coverage_cap < 1 or self.min_languages < 1:
      raise ValueError("--coverage_cap and --min_languages must be >= 1")


@dataclasses.dataclass(frozen=True)
class SplitKeys:
  """Frozen dev/test group ids (everything else is train)."""

  dev: frozenset[str]
  test: frozenset[str]

  def __post_init__(self):
    overlap = self.dev & self.test
    if overlap:
      raise ValueError(f"{len(overlap)} group ids are in both dev and test, "
                       f"e.g. {sorted(overlap)[0]}")

  def split_of(self, gid: str) -> str:
    """``"dev"``, ``"test"`` or ``"train"`` for a group id."""
    if gid in self.dev:
      return "dev"
    if gid in self.test:
      return "test"
    return "train"


def group_key(english: str) -> str:
  """Near-duplicate key of an English sentence (module docstring)."""
  text = unicodedata.normalize("NFKC", english)
  text = cleaning.remove_placeholders(text).casefold()
  return " ".join(_NON_WORD.sub(" ", text).split())


def group_id(english: str) -> str:
  """12-hex-digit id of the near-duplicate group of an English sentence."""
  key = group_key(english)
  return hashlib.sha256(key.encode("utf-8")).hexdigest()[:12]


def choose_split_keys(group_languages: Mapping[str, int], *,
                      config: SplitConfig) -> SplitKeys:
  """Picks dev/test groups, preferring ones translated into many languages.

  Args:
    group_languages: group id -> number of languages with a pair in it.
    config: sizes.

  Returns:
    The chosen :class:`SplitKeys` (fewer groups when there are too few
    candidates).
  """
  candidates = sorted(
      (gid for gid, n in group_languages.items() if n >= config.min_languages),
      key=lambda gid: (-min(group_languages[gid], config.coverage_cap), gid))
  dev = candidates[:config.dev_groups]
  test = candidates[config.dev_groups:config.dev_groups + config.test_groups]
  return SplitKeys(frozenset(dev), frozenset(test))


def save_split_keys(keys: SplitKeys, path: pathlib.Path, *,
                    comment: str = "") -> None:
  """Writes ``split<TAB>group_id`` lines, sorted, atomically."""
  lines = [f"# m4moe frozen split keys. {comment}".rstrip(),
           "# <split>\\t<first 12 hex of sha256(group_key(english))>"]
  for name, ids in (("dev", keys.dev), ("test", keys.test)):
    lines.extend(f"{name}\t{gid}" for gid in sorted(ids))
  path.parent.mkdir(parents=True, exist_ok=True)
  tmp = path.with_name(path.name + ".tmp")
  tmp.write_text("\n".join(lines) + "\n", encoding="utf-8")
  tmp.replace(path)


def load_split_keys(path: pathlib.Path) -> SplitKeys:
  """Reads a file written by :func:`save_split_keys`.

  Raises:
    ValueError: a line is malformed; the message names file and line.
  """
  found = {"dev": set(), "test": set()}
  for lineno, line in enumerate(
      path.read_text(encoding="utf-8").splitlines(), start=1):
    if not line.strip() or line.startswith("#"):
      continue
    name, _, gid = line.partition("\t")
    if name not in found or not re.fullmatch(r"[0-9a-f]{12}", gid):
      raise ValueError(f"{path}:{lineno}: expected 'dev|test<TAB>"
                       f"<12 hex digits>', got {line!r}")
    found[name].add(gid)
  return SplitKeys(frozenset(found["dev"]), frozenset(found["test"]))


def default_split_keys_path() -> pathlib.Path:
  """The committed split-key file shipped inside the package."""
  return pathlib.Path(__file__).parent / "splits" / "split_keys.txt"
