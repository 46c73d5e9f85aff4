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
a group not in the file is train. The file is only ever extended
(:func:`extend_test_keys`, :func:`append_split_keys`): new test groups are
appended below the old lines with a ``# version: N`` line, so an old key
never moves and the version says which extension a corpus was built with.

Out-of-domain test (``test_ood``): whole source packages listed in
``data/splits/ood_packages.txt`` (:func:`load_ood_packages`) are held out of
train, dev and test by the corpus builder, whatever their group ids.
"""

from __future__ import annotations

import dataclasses
import hashlib
import pathlib
import re
import unicodedata
from typing import Mapping, Sequence

from m4moe.data import cleaning

SPLITS = ("train", "dev", "test", "test_ood")
# Splits chosen by group id; test_ood is chosen by source package.
KEYED_SPLITS = ("train", "dev", "test")
_VERSION_LINE = re.compile(r"#\s*version:\s*(\d+)\b")
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
  """Frozen dev/test group ids (everything else is train).

  Attributes:
    dev, test: group ids.
    version: the key file's version (1 for the first choice; each
      :func:`append_split_keys` extension adds one).
  """

  dev: frozenset[str]
  test: frozenset[str]
  version: int = 1

  def __post_init__(self):
    overlap = self.dev & self.test
    if overlap:
      raise ValueError(f"{len(overlap)} group ids are in both dev and test, "
                       f"e.g. {sorted(overlap)[0]}")
    if self.version < 1:
      raise ValueError(f"split key version {self.version}: use 1 or more")

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
           "# <split>\\t<first 12 hex of sha256(group_key(english))>",
           f"# version: {keys.version}"]
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
  version = 1
  for lineno, line in enumerate(
      path.read_text(encoding="utf-8").splitlines(), start=1):
    if not line.strip() or line.startswith("#"):
      match = _VERSION_LINE.match(line)
      if match:
        version = max(version, int(match.group(1)))
      continue
    name, _, gid = line.partition("\t")
    if name not in found or not re.fullmatch(r"[0-9a-f]{12}", gid):
      raise ValueError(f"{path}:{lineno}: expected 'dev|test<TAB>"
                       f"<12 hex digits>', got {line!r}")
    if gid in found[name]:
      raise ValueError(f"{path}:{lineno}: {name} group {gid} is listed "
                       "twice; delete the repeated line")
    found[name].add(gid)
  return SplitKeys(frozenset(found["dev"]), frozenset(found["test"]),
                   version)


@dataclasses.dataclass(frozen=True, kw_only=True)
class TestExtension:
  """What :func:`extend_test_keys` chose and what it costs in training data.

  Attributes:
    added: new test group ids (in the order chosen).
    test_pairs_before, test_pairs_after: test pairs per language.
    train_pairs_lost: training pairs per language that move to test.
    capped: languages that stay under the target because their held-out
      share reached ``max_held_out_fraction`` (or they ran out of groups).
  """

  added: tuple[str, ...]
  test_pairs_before: dict[str, int]
  test_pairs_after: dict[str, int]
  train_pairs_lost: dict[str, int]
  capped: tuple[str, ...]

  def to_dict(self) -> dict:
    return {"added_groups": len(self.added), **{
        k: v for k, v in dataclasses.asdict(self).items() if k != "added"}}


def extend_test_keys(keys: SplitKeys, *,
                     train_groups: Mapping[str, Mapping[str, int]],
                     test_pairs: Mapping[str, int],
                     held_out_pairs: Mapping[str, int],
                     total_pairs: Mapping[str, int],
                     target: int,
                     max_held_out_fraction: float = 0.1,
                     min_languages: int = 2
                     ) -> tuple[SplitKeys, TestExtension]:
  """Moves train groups to test until each language has ``target`` pairs.

  Deterministic and append-only: the old dev and test ids stay; candidates
  are the train groups translated in at least ``min_languages`` of the
  given languages, ranked by how many of them translate the group (most
  first, so test sets stay parallel across languages), then by group id. A
  candidate is taken when some language it has pairs in is still under
  ``target`` test pairs, and only if no language it touches would then
  hold out (dev + test) more than ``max_held_out_fraction`` of its pairs:
  small languages keep their training data and stop short of the target.

  Args:
    keys: the current keys.
    train_groups: group id -> language -> training pairs in that group
      (only the languages the test sets are for).
    test_pairs: language -> current test pairs.
    held_out_pairs: language -> current dev + test pairs.
    total_pairs: language -> train + dev + test pairs.
    target: test pairs wanted per language.
    max_held_out_fraction: cap on (dev + test) / total per language.
    min_languages: candidates need pairs in this many languages.

  Returns:
    The extended keys (version + 1; unchanged version if nothing was added)
    and what was chosen.
  """
  if target < 1:
    raise ValueError(f"target {target}: use a positive number of test pairs")
  if not 0 < max_held_out_fraction < 1:
    raise ValueError(f"max_held_out_fraction {max_held_out_fraction}: use "
                     "a fraction between 0 and 1")
  langs = sorted(total_pairs)
  test = {lang: test_pairs.get(lang, 0) for lang in langs}
  held = {lang: held_out_pairs.get(lang, 0) for lang in langs}
  cap = {lang: int(max_held_out_fraction * total_pairs[lang])
         for lang in langs}
  added, lost = _take_groups(
      _candidates(keys, train_groups, min_languages=min_languages),
      train_groups, test=test, held=held, cap=cap, target=target)
  new_keys = keys if not added else SplitKeys(
      keys.dev, keys.test | frozenset(added), keys.version + 1)
  return new_keys, TestExtension(
      added=tuple(added), test_pairs_before=dict(sorted(test_pairs.items())),
      test_pairs_after=test, train_pairs_lost=lost,
      capped=tuple(lang for lang in langs if test[lang] < target))


def _candidates(keys: SplitKeys,
                train_groups: Mapping[str, Mapping[str, int]], *,
                min_languages: int) -> list[str]:
  """Train groups not yet held out, translated in at least
  ``min_languages`` languages; most languages first (so test sets stay
  parallel across languages), then by id (so the choice is deterministic)."""
  taken = keys.dev | keys.test
  return sorted(
      (gid for gid, per_lang in train_groups.items()
       if gid not in taken and len(per_lang) >= min_languages),
      key=lambda gid: (-len(train_groups[gid]), gid))


def _take_groups(candidates: Sequence[str],
                 train_groups: Mapping[str, Mapping[str, int]], *,
                 test: dict[str, int], held: dict[str, int],
                 cap: Mapping[str, int], target: int
                 ) -> tuple[list[str], dict[str, int]]:
  """(groups taken, training pairs lost per language); updates ``test`` and
  ``held`` (pairs per language) in place.

  A group is taken when a language it has pairs in is under ``target``, and
  only if no language it touches would exceed its held-out ``cap``.
  """
  added, lost = [], {lang: 0 for lang in test}
  for gid in candidates:
    if all(test[lang] >= target for lang in test):
      break
    per_lang = train_groups[gid]
    if not any(test.get(lang, target) < target for lang in per_lang):
      continue
    if any(held[lang] + n > cap[lang] for lang, n in per_lang.items()
           if lang in cap):
      continue
    added.append(gid)
    for lang, n in per_lang.items():
      if lang in test:
        test[lang] += n
        held[lang] += n
        lost[lang] += n
  return added, lost


def append_split_keys(path: pathlib.Path, keys: SplitKeys, *,
                      comment: str) -> None:
  """Appends the test ids of ``keys`` that ``path`` lacks, below its lines.

  The old lines are kept byte for byte; the new block starts with
  ``# version: <keys.version>`` and ``comment``. Written atomically.

  Raises:
    ValueError: ``keys`` does not extend the file's keys (a dev id differs,
      an old test id is missing, or the version does not grow).
  """
  old = load_split_keys(path)
  if keys.dev != old.dev or not old.test <= keys.test:
    raise ValueError(f"{path}: the new keys do not extend the file's (dev "
                     "must be equal, every old test id kept)")
  added = sorted(keys.test - old.test)
  if not added:
    return
  if keys.version <= old.version:
    raise ValueError(f"{path}: version {keys.version} does not follow the "
                     f"file's version {old.version}")
  text = path.read_text(encoding="utf-8")
  if text and not text.endswith("\n"):
    text += "\n"
  block = [f"# version: {keys.version}", f"# {comment}".rstrip()]
  block.extend(f"test\t{gid}" for gid in added)
  tmp = path.with_name(path.name + ".tmp")
  tmp.write_text(text + "\n".join(block) + "\n", encoding="utf-8")
  tmp.replace(path)


def load_ood_packages(path: pathlib.Path) -> frozenset[str]:
  """Package names of an out-of-domain list (one a line, ``#`` comments).

  Raises:
    ValueError: a line holds more than one name; the message names file and
      line.
  """
  names = set()
  for lineno, line in enumerate(
      path.read_text(encoding="utf-8").splitlines(), start=1):
    text = line.split("#", 1)[0].strip()
    if not text:
      continue
    if len(text.split()) != 1:
      raise ValueError(f"{path}:{lineno}: expected one package name, got "
                       f"{text!r}")
    names.add(text)
  return frozenset(names)


def default_split_keys_path() -> pathlib.Path:
  """The committed split-key file shipped inside the package."""
  return pathlib.Path(__file__).parent / "splits" / "split_keys.txt"


def default_ood_packages_path() -> pathlib.Path:
  """The committed out-of-domain package list shipped inside the package."""
  return pathlib.Path(__file__).parent / "splits" / "ood_packages.txt"
