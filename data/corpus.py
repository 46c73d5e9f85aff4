"""Building the X->English corpus: fetch, parse, clean, dedup, split, write.

Output layout (``output_dir``)::

  train/<lang>.tsv  dev/<lang>.tsv  test/<lang>.tsv   # "english<TAB>x" lines
  test_ood/<lang>.tsv  # out-of-domain test: the held-out packages' pairs
                   # (all four exist for every language, possibly empty;
                   # train and test_ood rows in a fixed pseudo-random order)
  report.json      # every counter, per-language counts, sources, timing
  split_keys.txt   # the dev/test group ids used (copy or freshly chosen)
  .m4moe-corpus.json  # marker: this directory is a corpus this builder wrote,
                   # with the list of its files

Out-of-domain packages (``ood_packages``, a file of package names; see
``m4moe.data.split``): every pair of a listed source package (a recipe pin's
package name; for ``sources``, the name of the directory or file given, a
file without its suffix) is held out of train, dev and test whatever its
group id, deduplicated apart, and written to ``test_ood`` unless its English
group also occurs in the in-domain corpus (any built language): such pairs
are dropped and counted (``ood:english_in_domain``), so nothing English in
``test_ood`` was seen in training. The report's ``ood_packages`` section
lists the packages, the pairs each gave and the listed packages not found.

With ``languages``, a catalog under ``<locale>/LC_MESSAGES/`` of a known
language outside them is skipped without being parsed (that directory
decides its language) and counted as ``catalog:language_not_selected``;
other catalogs are parsed and their other-language pairs counted as
``pair:language_not_selected``.

Sources are read in a fixed order (recipe pins, then local ``sources`` in the
order given) and the first occurrence of a (lang, english, x) triple is the
one kept, so the output is a pure function of the inputs. Everything is
written under a temporary directory next to ``output_dir`` and renamed into
place at the end: a killed build leaves the previous output (or nothing).
A build holds an flock on ``.<name>.lock`` beside ``output_dir``
(:mod:`m4moe.run_lock`) from before it cleans up until the rename,
so a second build of the same directory is refused, naming the first.
A killed build's temporary directory (recognised by the marker written into
it first, or empty) is deleted by the next build.

``output_dir`` is only replaced when it is missing, empty, or a corpus this
builder wrote: it has the marker and no file the marker does not list (or,
for corpora built before the marker existed, nothing but ``report.json``,
``split_keys.txt`` and ``{train,dev,test}/*.tsv``). Anything else (``.``,
a sources directory, a directory with other files) is refused with
:class:`OutputDirError` unless ``overwrite`` is set; a directory that holds
a source, the cache, the recipe, the split keys or the working directory is
refused even then.

Unreadable catalogs, unknown locales, damaged catalogs (see
``catalogs.py``), catalogs whose parsing raised anything
(``catalog:parser_error``) or killed the worker process
(``catalog:worker_crashed``, see ``worker_pool.py``), symlink loops and bad
TSV lines are skipped and listed with their file (and line) in the report;
nothing is dropped without a count, and no single bad file stops a build.
Worker processes die with the builder, even on ``kill -9``; SIGTERM stops the
build in order (:class:`BuildInterrupted`).
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
import hashlib
import json
import os
import pathlib
import random
import shutil
import signal
import tempfile
import threading
import time
import zlib
from typing import Callable, Container, Iterable, Iterator

from absl import logging

from m4moe import jsonfile
from m4moe import run_lock
from m4moe.data import catalogs
from m4moe.data import cleaning
from m4moe.data import corpus_coverage
from m4moe.data import languages
from m4moe.data import sources
from m4moe.data import split
from m4moe.data import worker_pool

_MAX_LISTED_PROBLEMS = 200
_CHUNKSIZE = 8
MARKER = ".m4moe-corpus.json"
_MARKER_FORMAT = "m4moe-corpus"
_LEGACY_FILES = ("report.json", "split_keys.txt")
# Per-language counters, carried through the workers' Counters and moved
# out of "counts" into the report's "language_coverage" section.
_UNSELECTED_PAIRS = "language_not_selected_pairs:"
_UNSELECTED_CATALOGS = "language_not_selected_catalogs:"
_BELOW_MIN_PAIRS = "below_min_pairs:"


class OutputDirError(ValueError):
  """``output_dir`` is not safe to replace; the message says what to do."""


class SplitKeysError(ValueError):
  """The frozen split-key file is malformed; the message names file, line."""


class EmptyCorpusError(ValueError):
  """No requested language (or, without a selection, no language at all)
  got a pair; nothing was replaced. The message names the languages the
  sources have and where the build's report was kept."""


class BuildInterrupted(BaseException):
  """SIGTERM stopped the build (a BaseException, like KeyboardInterrupt, so
  no ``except Exception`` swallows it); the previous output is unchanged."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class BuildConfig:
  """Everything a corpus build depends on.

  Attributes:
    output_dir: where the corpus is written (replaced atomically).
    cache_dir: download/extraction cache, reused across builds.
    recipe_dir: directory with ``recipe_debian.txt``/``recipe_pypi.txt``;
      None builds from ``sources`` only.
    sources: local catalog directories, catalog files and ``.tsv`` files.
    languages: keep only these normalised codes (empty: all).
    min_pairs: languages with fewer deduplicated pairs are left out.
    use_apt: False skips the Debian half of the recipe (reported).
    recipe_parts: the halves of the recipe this build is made of
      (``debian``, ``pypi``); a half left out is not part of the recipe
      built, so it is neither fetched nor reported as skipped.
    split_keys: frozen split-key file; None (or a missing file) chooses
      dev/test afresh with ``split_config``.
    split_config: dev/test sizes when choosing afresh.
    ood_packages: file of source packages held out as ``test_ood`` (module
      docstring); None holds out nothing.
    cleaning: cleaning thresholds.
    workers: processes parsing catalogs (1 = in-process).
    overwrite: replace ``output_dir`` even when it is not a corpus this
      builder wrote (module docstring).
  """

  output_dir: pathlib.Path
  cache_dir: pathlib.Path
  recipe_dir: pathlib.Path | None = None
  sources: tuple[pathlib.Path, ...] = ()
  languages: tuple[str, ...] = ()
  min_pairs: int = 1
  use_apt: bool = True
  recipe_parts: tuple[str, ...] = corpus_coverage.ALL_PARTS
  split_keys: pathlib.Path | None = None
  split_config: split.SplitConfig = split.SplitConfig()
  ood_packages: pathlib.Path | None = None
  cleaning: cleaning.CleaningConfig = cleaning.CleaningConfig()
  workers: int = 2
  overwrite: bool = False

  def __post_init__(self):
    if self.recipe_dir is None and not self.sources:
      raise ValueError("give --recipe and/or --sources: nothing to build from")
    for src in self.sources:
      if not src.exists():
        raise ValueError(f"--sources: {src} does not exist")
    unknown = set(self.recipe_parts) - set(corpus_coverage.ALL_PARTS)
    if unknown or not self.recipe_parts:
      raise ValueError(f"--recipe_parts={','.join(self.recipe_parts)}: give "
                       "one or both of debian,pypi")
    if self.min_pairs < 1 or self.workers < 1:
      raise ValueError("--min_pairs and --workers must be >= 1")
    if self.ood_packages is not None and not self.ood_packages.is_file():
      raise ValueError(f"--ood_packages: {self.ood_packages} is not a file; "
                       "give a file of package names, or --ood_packages= to "
                       "hold out nothing")


class _Problems:
  """Per-file problems for the report (first few listed, all counted)."""

  def __init__(self, counts: collections.Counter):
    self.counts = counts
    self.listed: list[dict[str, str]] = []

  def add(self, kind: str, where: str, reason: str) -> None:
    self.counts[kind] += 1
    self._list(kind, where, reason)

  def extend(self, found: Iterable[catalogs.Problem]) -> None:
    """Lists problems already counted (by the worker that found them)."""
    for problem in found:
      self._list(problem.kind, problem.where, problem.reason)

  def _list(self, kind: str, where: str, reason: str) -> None:
    if len(self.listed) < _MAX_LISTED_PROBLEMS:
      self.listed.append({"kind": kind, "where": where, "reason": reason})


def _process_catalog(args) -> tuple[list[tuple[str, str, str]],
                                    collections.Counter,
                                    list[catalogs.Problem]]:
  """Worker: parse + clean one catalog.

  Returns:
    (pairs, counts, problems): problems are already counted in ``counts``.
    Any exception is a problem of the file; one bad catalog never stops the
    build.
  """
  path, config, selected = args
  counts = collections.Counter()
  problems: list[catalogs.Problem] = []
  pairs = []

  def failed(kind: str, reason: str):
    counts[kind] += 1
    return [], counts, problems + [catalogs.Problem(kind, str(path), reason)]

  try:
    for raw in catalogs.read_catalog(path, counts=counts, problems=problems):
      if selected and raw.lang not in selected:
        counts["pair:language_not_selected"] += 1
        counts[f"{_UNSELECTED_PAIRS}{raw.lang}"] += 1
        continue
      counts["pair:raw"] += 1
      result = cleaning.clean_pair(raw.lang, raw.source, raw.target,
                                   config=config)
      counts.update(result.edits)
      if result.dropped_by:
        counts[result.dropped_by] += 1
      else:
        pairs.append((raw.lang, result.source, result.target))
  except languages.UnknownLanguageError as e:
    return failed("catalog:unknown_language", str(e))
  except (catalogs.CatalogError, UnicodeError, OSError, ValueError) as e:
    return failed("catalog:unreadable", f"{type(e).__name__}: {e}")
  except Exception as e:  # pylint: disable=broad-except
    # A parser bug or a file polib was not made for: this catalog only.
    return failed("catalog:parser_error", f"{type(e).__name__}: {e}")
  return pairs, counts, problems


def _read_tsv(path: pathlib.Path, config: BuildConfig,
              problems: _Problems) -> Iterator[tuple[str, str, str]]:
  """Yields cleaned pairs of a ``lang<TAB>english<TAB>x`` file.

  Lines are decoded one by one: an undecodable line is counted
  (``tsv:undecodable_line``, with ``file:line``) and the others kept.
  """
  counts = problems.counts
  try:
    with open(path, "rb") as f:
      raw_lines = f.read().split(b"\n")
  except OSError as e:
    problems.add("tsv:unreadable_file", str(path), str(e))
    return
  if raw_lines and not raw_lines[-1]:
    raw_lines.pop()  # the newline ending the last line
  for lineno, raw in enumerate(raw_lines, start=1):
    try:
      line = raw.decode("utf-8").rstrip("\r")
    except UnicodeDecodeError as e:
      problems.add("tsv:undecodable_line", f"{path}:{lineno}",
                   f"not UTF-8 ({e.reason} at byte {e.start}); line skipped")
      continue
    if not line.strip() or line.startswith("#"):
      continue
    fields = line.split("\t")
    if len(fields) != 3:
      problems.add("tsv:bad_line", f"{path}:{lineno}",
                   f"expected 3 tab-separated fields, got {len(fields)}")
      continue
    try:
      lang = languages.normalize_language(fields[0])
    except languages.UnknownLanguageError as e:
      problems.add("tsv:unknown_language", f"{path}:{lineno}", str(e))
      continue
    if lang is None or (config.languages and lang not in config.languages):
      counts["pair:language_not_selected"] += 1
      if lang is not None:
        counts[f"{_UNSELECTED_PAIRS}{lang}"] += 1
      continue
    counts["pair:raw"] += 1
    result = cleaning.clean_pair(lang, fields[1], fields[2],
                                 config=config.cleaning)
    counts.update(result.edits)
    if result.dropped_by:
      counts[result.dropped_by] += 1
    else:
      yield lang, result.source, result.target, path.stem


def _fetch_recipe(config: BuildConfig, problems: _Problems,
                  report: dict) -> list[tuple[str, pathlib.Path]]:
  """Downloads/extracts the recipe; returns (package name, catalog
  directory) per usable pin."""
  pins = [pin for pin in sources.read_recipe_dir(config.recipe_dir)
          if pin.kind in config.recipe_parts]
  apt_ok, apt_reason = sources.apt_usable()
  apt_ok = apt_ok and config.use_apt
  apt_reason = apt_reason or (corpus_coverage.APT_DISABLED if not apt_ok
                              else "")
  dirs, fetched = [], []
  refreshed = False
  for pin in pins:
    usable = apt_ok if pin.kind == "debian" else True
    result = sources.fetch(pin, cache_dir=config.cache_dir,
                           tool_available=usable)
    if result.status == "fallback" and pin.kind == "debian" and usable \
        and not refreshed:
      # Stale package lists make pinned versions look gone: refresh once.
      refreshed = True
      report["apt_lists_refreshed"] = sources.refresh_apt_lists()
      if report["apt_lists_refreshed"]:
        result = sources.fetch(pin, cache_dir=config.cache_dir,
                               tool_available=usable)
    if result.status == "skipped" and pin.kind == "debian" and not usable:
      result = dataclasses.replace(result, reason=apt_reason)
    fetched.append(dataclasses.asdict(result))
    if result.status == "skipped":
      problems.add("source:skipped", pin.origin, result.reason)
      continue
    try:
      dirs.append((pin.name, sources.extract_catalogs(
          pathlib.Path(result.archive), cache_dir=config.cache_dir)))
    except Exception as e:  # pylint: disable=broad-except
      problems.add("source:unextractable", result.archive, repr(e))
  report["sources"] = fetched
  return dirs


@contextlib.contextmanager
def _sigterm_interrupts() -> Iterator[None]:
  """Turns SIGTERM into :class:`BuildInterrupted` in the main thread, so the
  build stops its workers and deletes its temporary directory."""
  if threading.current_thread() is not threading.main_thread():
    yield
    return

  def handle(signum, frame):
    del frame
    raise BuildInterrupted(f"stopped by {signal.Signals(signum).name}; the "
                           "previous output (if any) is unchanged")
  previous = signal.signal(signal.SIGTERM, handle)
  try:
    yield
  finally:
    signal.signal(signal.SIGTERM, previous)


def _catalog_crashed(job, reason: str):
  """Stands in for :func:`_process_catalog` of a catalog that killed its
  worker process twice."""
  path = job[0]
  counts = collections.Counter({"catalog:worker_crashed": 1})
  return [], counts, [catalogs.Problem("catalog:worker_crashed", str(path),
                                       reason)]


@contextlib.contextmanager
def _catalog_mapper(workers: int) -> Iterator[Callable[[list], Iterable]]:
  """A function mapping :func:`_process_catalog` over jobs, in order: in
  this process for one worker, else in a :class:`worker_pool.WorkerPool`
  that ends with the build."""
  if workers == 1:
    yield lambda jobs: map(_process_catalog, jobs)
    return
  with worker_pool.WorkerPool(workers=workers, chunksize=_CHUNKSIZE) as pool:
    yield lambda jobs: pool.map(_process_catalog, jobs,
                                on_crash=_catalog_crashed)


def _cleaned_pairs(config: BuildConfig, problems: _Problems, report: dict,
                   map_catalogs: Callable[[list], Iterable]
                   ) -> Iterator[tuple[str, str, str, str]]:
  """All cleaned pairs in a fixed source order (before dedup), each as
  (lang, english, x, source package)."""
  roots = _fetch_recipe(config, problems, report) if config.recipe_dir else []
  local = [s for s in config.sources if s.suffix != ".tsv"]
  tsvs = [s for s in config.sources if s.suffix == ".tsv"]
  walk = sources.SourceWalk()
  files, packages = [], []
  for package, root in roots:
    found = walk.find_catalogs(root)
    files += found
    packages += [package] * len(found)
  for src in local:
    found = sources.iter_source_files([src], walk=walk)
    files += found
    packages += [src.name if src.is_dir() else src.stem] * len(found)
  for problem in walk.problems:
    problems.add(problem.kind, problem.where, problem.reason)
  problems.counts["catalog:files"] += len(files)
  selected = frozenset(config.languages)
  if selected:
    files, packages = _selected_catalogs(files, packages, selected,
                                         problems.counts)
  jobs = [(f, config.cleaning, selected) for f in files]
  for (pairs, counts, found), package in zip(map_catalogs(jobs), packages):
    problems.counts.update(counts)  # (includes the problems' own counts)
    problems.extend(found)
    for lang, source, target in pairs:
      yield lang, source, target, package
  for tsv in tsvs:
    yield from _read_tsv(tsv, config, problems)


def _selected_catalogs(files: list[pathlib.Path], packages: list[str],
                       selected: frozenset[str],
                       counts: collections.Counter
                       ) -> tuple[list[pathlib.Path], list[str]]:
  """Drops catalogs whose ``<locale>/LC_MESSAGES`` directory names a known
  language outside ``selected`` (that directory decides a catalog's
  language, so every pair would be dropped as not selected) without parsing
  them; counted as ``catalog:language_not_selected``. Catalogs in other
  layouts, or with an unknown locale, are parsed as usual."""
  kept_files, kept_packages = [], []
  for path, package in zip(files, packages):
    lang = None
    if "LC_MESSAGES" in path.parts:
      try:
        lang = languages.normalize_language(catalogs.catalog_locale(path, None))
      except languages.UnknownLanguageError:
        lang = None
    if lang is not None and lang not in selected:
      counts["catalog:language_not_selected"] += 1
      counts[f"{_UNSELECTED_CATALOGS}{lang}"] += 1
      continue
    kept_files.append(path)
    kept_packages.append(package)
  return kept_files, kept_packages


def _pair_hash(lang: str, source: str, target: str) -> int:
  digest = hashlib.blake2b(f"{lang}\t{source}\t{target}".encode("utf-8"),
                           digest_size=8).digest()
  return int.from_bytes(digest, "little")


def _stage(pairs: Iterable[tuple[str, str, str, str]], staging: pathlib.Path,
           counts: collections.Counter, *, ood_packages: frozenset[str],
           ood_found: collections.Counter) -> dict[str, int]:
  """Dedups pairs into ``staging/<lang>.tsv`` ("gid<TAB>en<TAB>x" lines);
  pairs of ``ood_packages`` go to ``staging/ood/<lang>.tsv``, deduplicated
  apart (``ood_found`` counts them per package).

  Returns:
    group id -> number of languages with an in-domain pair in that group.
  """
  (staging / "ood").mkdir(parents=True)
  seen, seen_ood, seen_group_lang = set(), set(), set()
  group_languages = collections.Counter()
  handles = {}
  gid_of = functools.lru_cache(maxsize=1 << 18)(split.group_id)
  try:
    for lang, source, target, package in pairs:
      ood = package in ood_packages
      key = _pair_hash(lang, source, target)
      if key in (seen_ood if ood else seen):
        counts["duplicate"] += 1
        continue
      (seen_ood if ood else seen).add(key)
      gid = gid_of(source)
      if ood:
        ood_found[package] += 1
      elif (gid, lang) not in seen_group_lang:
        seen_group_lang.add((gid, lang))
        group_languages[gid] += 1
      name = f"ood/{lang}" if ood else lang
      if name not in handles:
        handles[name] = open(staging / f"{name}.tsv", "w", encoding="utf-8")
      handles[name].write(f"{gid}\t{source}\t{target}\n")
  finally:
    for handle in handles.values():
      handle.close()
  return dict(group_languages)


def _ood_packages(config: BuildConfig) -> frozenset[str]:
  """The ``ood_packages`` file's names, read before the build starts.

  Raises:
    SplitKeysError: the file is malformed or unreadable.
  """
  if config.ood_packages is None:
    return frozenset()
  try:
    return split.load_ood_packages(config.ood_packages)
  except (ValueError, OSError) as e:
    raise SplitKeysError(f"--ood_packages: {e}; fix the file, or pass "
                         "--ood_packages= to hold out nothing") from e


def _frozen_split_keys(config: BuildConfig) -> split.SplitKeys | None:
  """The ``split_keys`` file's keys (None: choose afresh), read before the
  build starts so a bad file fails fast.

  Raises:
    SplitKeysError: the file is malformed or unreadable.
  """
  path = config.split_keys
  if path is None or not path.exists():
    return None
  try:
    return split.load_split_keys(path)
  except (ValueError, OSError) as e:
    raise SplitKeysError(f"--split_keys: {e}; fix the file, or pass "
                         "--split_keys= to choose dev/test afresh") from e


def _split_keys(config: BuildConfig, frozen: split.SplitKeys | None,
                group_languages: dict[str, int],
                report: dict) -> split.SplitKeys:
  if frozen is not None:
    report["split_keys"] = {"frozen_file": str(config.split_keys),
                            "version": frozen.version}
    return frozen
  report["split_keys"] = {"chosen_fresh": dataclasses.asdict(
      config.split_config)}
  return split.choose_split_keys(group_languages, config=config.split_config)


def _staged_lines(path: pathlib.Path) -> list[str]:
  return (path.read_text(encoding="utf-8").splitlines() if path.is_file()
          else [])


def _write_splits(staging: pathlib.Path, out: pathlib.Path,
                  keys: split.SplitKeys, config: BuildConfig,
                  counts: collections.Counter,
                  in_domain_groups: Container[str]
                  ) -> dict[str, dict[str, int]]:
  """Routes staged pairs to ``out/<split>/<lang>.tsv``; per-language counts.

  In-domain pairs go by group id (``keys``); held-out packages' pairs to
  ``test_ood`` unless their group is in ``in_domain_groups``.
  """
  per_lang = {}
  for name in split.SPLITS:
    (out / name).mkdir(parents=True)
  langs = sorted({p.stem for p in staging.glob("*.tsv")} |
                 {p.stem for p in (staging / "ood").glob("*.tsv")})
  for lang in langs:
    lines = _staged_lines(staging / f"{lang}.tsv")
    ood_lines = _staged_lines(staging / "ood" / f"{lang}.tsv")
    if len(lines) < config.min_pairs:
      counts[f"{_BELOW_MIN_PAIRS}{lang}"] += len(lines)
      counts["language_below_min_pairs"] += 1
      counts["pairs_of_languages_below_min_pairs"] += len(lines)
      counts["ood:pairs_of_languages_below_min_pairs"] += len(ood_lines)
      continue
    routed = {name: [] for name in split.SPLITS}
    for line in lines:
      gid, _, pair = line.partition("\t")
      routed[keys.split_of(gid)].append(pair)
    for line in ood_lines:
      gid, _, pair = line.partition("\t")
      if gid in in_domain_groups:
        counts["ood:english_in_domain"] += 1
      else:
        routed["test_ood"].append(pair)
    # Catalog order clusters strings by application: shuffle the training
    # rows (deterministically) so a small shuffle buffer suffices later, and
    # the out-of-domain rows so their first N mix the held-out packages.
    for name in ("train", "test_ood"):
      random.Random(zlib.crc32(lang.encode("utf-8"))).shuffle(routed[name])
    per_lang[lang] = {name: len(rows) for name, rows in routed.items()}
    for name, rows in routed.items():  # empty files too: every split of
      (out / name / f"{lang}.tsv").write_text(  # every language exists.
          "".join(f"{row}\n" for row in rows), encoding="utf-8")
  return per_lang


def _summary(per_lang: dict[str, dict[str, int]]) -> dict:
  totals = {lang: sum(c.values()) for lang, c in per_lang.items()}
  return {
      "languages": len(per_lang),
      "pairs": sum(totals.values()),
      **{f"pairs_{name}": sum(c[name] for c in per_lang.values())
         for name in split.SPLITS},
      "languages_with_at_least_20k": sum(n >= 20000 for n in totals.values()),
      "languages_with_at_least_1k": sum(n >= 1000 for n in totals.values()),
      "languages_with_dev_and_test": sum(
          c["dev"] > 0 and c["test"] > 0 for c in per_lang.values()),
      "languages_with_test_ood": sum(
          c["test_ood"] > 0 for c in per_lang.values()),
  }


def _tree_files(root: pathlib.Path) -> list[str]:
  """Relative paths of the files (and links) under ``root``, no link
  followed."""
  out = []
  for dirpath, dirnames, filenames in os.walk(root):
    rel = pathlib.Path(dirpath).relative_to(root)
    out.extend(str(rel / name) for name in filenames)
    out.extend(str(rel / name) for name in dirnames
               if os.path.islink(os.path.join(dirpath, name)))
  return sorted(out)


def _unexpected_files(output_dir: pathlib.Path) -> list[str] | None:
  """Files of ``output_dir`` a rebuild must not delete; None when it is not
  a corpus this builder wrote at all."""
  files = _tree_files(output_dir)
  marker = output_dir / MARKER
  if marker.is_file():
    try:
      manifest = jsonfile.load(marker, what="the corpus marker",
                               fix="rebuild the corpus")
      listed = set(manifest["files"]) | {MARKER}
      if manifest.get("format") != _MARKER_FORMAT:
        return None
    except (ValueError, KeyError, TypeError, OSError):
      return None
    return [f for f in files if f not in listed]
  if "report.json" not in files:
    return None
  def ours(name: str) -> bool:
    return name in _LEGACY_FILES or (
        name.endswith(".tsv") and name.count("/") == 1 and
        name.split("/")[0] in split.SPLITS)
  return [f for f in files if not ours(f)]


def _is_within(path: pathlib.Path, directory: pathlib.Path) -> bool:
  return path == directory or directory in path.parents


def check_output_dir(config: BuildConfig) -> None:
  """Refuses an ``output_dir`` that must not be replaced (module docstring).

  Raises:
    OutputDirError: naming the directory, the reason and what to do.
  """
  out = config.output_dir.resolve()
  flag = f"--output_dir={config.output_dir}"
  if not out.exists():
    return
  if not out.is_dir():
    raise OutputDirError(f"{flag} exists and is not a directory: choose a "
                         "new directory for the corpus")
  inputs = [("--sources", s) for s in config.sources] + [
      ("--cache_dir", config.cache_dir), ("--recipe", config.recipe_dir),
      ("--split_keys", config.split_keys), ("the working directory",
                                            pathlib.Path.cwd())]
  for name, path in inputs:
    if path is not None and _is_within(path.resolve(), out):
      shown = "" if name == "the working directory" else f"={path}"
      raise OutputDirError(
          f"{flag} holds {name}{shown}; building there would delete it. "
          "Choose a new directory for the corpus (--overwrite does not "
          "apply to inputs).")
  if not any(out.iterdir()) or config.overwrite:
    return
  unexpected = _unexpected_files(out)
  if unexpected is None:
    raise OutputDirError(
        f"{flag} is not empty and is not a corpus this builder wrote (no "
        f"{MARKER}); building would replace everything in it. Choose a new "
        "or empty directory, or pass --overwrite to replace it.")
  if unexpected:
    shown = ", ".join(unexpected[:5]) + (", ..." if len(unexpected) > 5
                                         else "")
    raise OutputDirError(
        f"{flag} is a corpus this builder wrote but also holds files it did "
        f"not write ({len(unexpected)}: {shown}); move them out, or pass "
        "--overwrite to replace the directory with them.")


def _write_marker(directory: pathlib.Path) -> None:
  """Writes (or rewrites) the marker listing ``directory``'s files."""
  files = [f for f in _tree_files(directory) if f != MARKER]
  (directory / MARKER).write_text(json.dumps(
      {"format": _MARKER_FORMAT, "files": files}, indent=1) + "\n",
                                  encoding="utf-8")


def _replace_dir(tmp: pathlib.Path, final: pathlib.Path) -> None:
  """Renames ``tmp`` to ``final``, replacing an existing ``final``.

  SIGTERM is held off between the two renames; a SIGKILL there leaves the
  previous output as ``.<name>.old-<pid>``, which the next build restores.
  """
  old = None
  main = threading.current_thread() is threading.main_thread()
  if main:
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
  try:
    if final.exists():
      old = final.with_name(f".{final.name}.old-{os.getpid()}")
      final.rename(old)
    tmp.rename(final)
  finally:
    if main:
      signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
  if old is not None:
    shutil.rmtree(old, ignore_errors=True)


def _remove_stale_temporaries(output_dir: pathlib.Path) -> None:
  """Cleans up after builds killed by SIGKILL: deletes temporaries holding
  the marker (or empty: killed before writing it) and replaced outputs
  (``.old-``, renamed only once approved for replacement), or renames a
  replaced output back when the build died before its new one was in place.
  Only called under the output directory's lock: no other build runs."""
  for stale in output_dir.parent.glob(f".{output_dir.name}.tmp-*"):
    if stale.is_dir() and not stale.is_symlink() and (
        (stale / MARKER).is_file() or not any(stale.iterdir())):
      shutil.rmtree(stale, ignore_errors=True)
  for stale in sorted(output_dir.parent.glob(f".{output_dir.name}.old-*")):
    if stale.is_dir() and not stale.is_symlink():
      if not output_dir.exists():  # killed between the two renames
        stale.rename(output_dir)
      else:
        shutil.rmtree(stale, ignore_errors=True)


def build_corpus(config: BuildConfig) -> dict:
  """Builds the corpus described by ``config``; returns the build report.

  The report (also written to ``output_dir/report.json``, with every path
  in it relative to ``output_dir``) has ``summary``,
  ``counts`` (every rule and problem counter), ``problems`` (the first files
  / lines skipped, with reasons), ``languages`` (per-language split sizes),
  ``sources`` (each recipe pin: status, version used, archive),
  ``reduced`` (the skipped sources and the languages that lost pairs by
  it, :mod:`m4moe.data.corpus_coverage`), ``warnings`` (every warning the
  build prints) and ``seconds``.

  Raises:
    OutputDirError: ``output_dir`` must not be replaced (see
      :func:`check_output_dir`); raised before anything is read or written.
    SplitKeysError: the ``split_keys`` file is malformed (before anything
      is read or written, too).
    sources.RecipeError: the recipe's ``expected_pairs.txt`` is malformed
      (before anything is read or written, too).
    run_lock.RunLockedError: another build of ``output_dir`` is running
      (its lock ``.<name>.lock`` is beside ``output_dir``).
    BuildInterrupted: SIGTERM (main thread only); workers and the temporary
      directory are gone, the previous output is unchanged.
  """
  start = time.time()
  check_output_dir(config)
  frozen = _frozen_split_keys(config)
  ood_packages = _ood_packages(config)
  corpus_coverage.read_expected_pairs(  # a bad file fails before the build
      config.recipe_dir, parts=config.recipe_parts)
  output_dir = config.output_dir.resolve()
  output_dir.parent.mkdir(parents=True, exist_ok=True)
  # Beside output_dir, which is replaced by renaming; held for the build,
  # since a second build would delete this one's temporary as stale.
  with run_lock.RunLock(output_dir.parent, role=run_lock.CORPUS,
                        filename=f".{output_dir.name}.lock",
                        subject=config.output_dir):
    return _locked_build(config, frozen, ood_packages, output_dir, start)


def _locked_build(config: BuildConfig, frozen: split.SplitKeys | None,
                  ood_packages: frozenset[str], output_dir: pathlib.Path,
                  start: float) -> dict:
  """:func:`build_corpus` once it holds the output directory's lock."""
  _remove_stale_temporaries(output_dir)
  counts = cleaning.new_counter()
  problems = _Problems(counts)
  report: dict = {"config": {k: str(v) for k, v in
                             dataclasses.asdict(config).items()}}
  with _sigterm_interrupts():
    tmp = pathlib.Path(tempfile.mkdtemp(dir=output_dir.parent,
                                        prefix=f".{output_dir.name}.tmp-"))
    try:
      _build_into(tmp, config, frozen, ood_packages, problems, report, start)
      _refuse_empty(report, tmp, output_dir)
      _replace_dir(tmp, output_dir)
      failed_report_path(output_dir).unlink(missing_ok=True)
    finally:
      if tmp.exists():
        shutil.rmtree(tmp, ignore_errors=True)
  return report


def _build_into(tmp: pathlib.Path, config: BuildConfig,
                frozen: split.SplitKeys | None, ood_packages: frozenset[str],
                problems: _Problems, report: dict, start: float) -> None:
  """Writes the whole corpus into the temporary directory ``tmp``."""
  counts = problems.counts
  _write_marker(tmp)  # first: a killed build's temporary is recognisable
  staging = tmp / "_staging"
  ood_found = collections.Counter()
  with _catalog_mapper(config.workers) as map_catalogs:
    group_languages = _stage(
        _cleaned_pairs(config, problems, report, map_catalogs), staging,
        counts, ood_packages=ood_packages, ood_found=ood_found)
  keys = _split_keys(config, frozen, group_languages, report)
  split.save_split_keys(keys, tmp / "split_keys.txt")
  per_lang = _write_splits(staging, tmp, keys, config, counts,
                           group_languages)
  report["ood_packages"] = {
      "file": str(config.ood_packages) if config.ood_packages else None,
      "packages": sorted(ood_packages),
      "pairs": dict(sorted(ood_found.items())),
      "not_found": sorted(ood_packages - set(ood_found))}
  shutil.rmtree(staging)
  report["language_coverage"] = _language_coverage(config, per_lang, counts)
  report["reduced"] = corpus_coverage.reduced_section(
      fetched=report.get("sources", []), per_lang=per_lang,
      expected=corpus_coverage.read_expected_pairs(
          config.recipe_dir, parts=config.recipe_parts),
      requested=config.languages, parts=config.recipe_parts)
  report["warnings"] = (report["reduced"]["warnings"] +
                        report["language_coverage"]["warnings"])
  report.update(summary=_summary(per_lang), counts=dict(sorted(
      counts.items())), problems=problems.listed, languages=per_lang,
                seconds=round(time.time() - start, 1))
  # Paths relative to the corpus directory: the report is copied into
  # results/ and read on other machines.
  (tmp / "report.json").write_text(json.dumps(
      jsonfile.relative_paths_in(report, start=config.output_dir),
      indent=1, ensure_ascii=False), encoding="utf-8")
  _write_marker(tmp)


def _language_coverage(config: BuildConfig, per_lang: dict[str, dict],
                       counts: collections.Counter) -> dict:
  """Which languages were asked for, which came out empty, which the
  sources have besides; warns of each empty requested language.

  Pops the per-language counters out of ``counts``.
  """
  def pop(prefix: str) -> dict[str, int]:
    found = {k[len(prefix):]: counts.pop(k) for k in list(counts)
             if k.startswith(prefix)}
    return dict(sorted(found.items()))

  unselected, catalogs_skipped = pop(_UNSELECTED_PAIRS), pop(
      _UNSELECTED_CATALOGS)
  below = pop(_BELOW_MIN_PAIRS)
  empty = {}
  for lang in config.languages:
    if lang in per_lang:
      continue
    empty[lang] = (f"{below[lang]} pair(s), fewer than --min_pairs="
                   f"{config.min_pairs}" if lang in below
                   else "no pairs in the sources")
  others = {lang: {"pairs": unselected.get(lang, 0),
                   "catalogs_not_parsed": catalogs_skipped.get(lang, 0)}
            for lang in sorted({*unselected, *catalogs_skipped})}
  warnings = [f"requested language {lang} has no pairs: {why}"
              for lang, why in empty.items()]
  if empty and per_lang:
    for warning in warnings:
      logging.warning("m4moe-build-corpus: %s", warning)
  return {"requested": list(config.languages), "empty": empty,
          "built": sorted(per_lang), "below_min_pairs": below,
          "sources_also_have": others, "warnings": warnings}


def _describe_available(coverage: dict) -> str:
  others = coverage["sources_also_have"]
  if not others:
    return "the sources have no pairs in any language"
  shown = ", ".join(
      f"{lang} ({c['pairs']} pairs" + (
          f", {c['catalogs_not_parsed']} catalogs" if c["catalogs_not_parsed"]
          else "") + ")" for lang, c in others.items())
  return f"the sources have: {shown}"


def failed_report_path(output_dir: pathlib.Path) -> pathlib.Path:
  """Where an empty build keeps its report (``output_dir`` is untouched)."""
  return output_dir.with_name(f"{output_dir.name}.failed-report.json")


def _refuse_empty(report: dict, tmp: pathlib.Path,
                  output_dir: pathlib.Path) -> None:
  """Raises EmptyCorpusError for a build without a single language.

  The report goes beside ``output_dir`` (see :func:`failed_report_path`),
  since the previous corpus, if any, stays in place.
  """
  if report["languages"]:
    return
  coverage = report["language_coverage"]
  failed = failed_report_path(output_dir)
  shutil.copyfile(tmp / "report.json", failed)
  if coverage["empty"]:
    what = "no requested language has pairs (" + "; ".join(
        f"{lang}: {why}" for lang, why in coverage["empty"].items()) + ")"
    fix = ("choose --languages among those, or add sources that have "
           "them")
  elif coverage["below_min_pairs"]:
    what = ("every language has fewer pairs than --min_pairs (" + ", ".join(
        f"{lang}: {n}" for lang, n in coverage["below_min_pairs"].items())
            + ")")
    fix = "lower --min_pairs or add sources"
  else:
    what = "the build produced no pairs in any language"
    fix = "check --sources/--recipe and the report's problems and counts"
  raise EmptyCorpusError(
      f"{what}; {_describe_available(coverage)}. Nothing was replaced; {fix}. "
      f"The build's report: {failed}")


def read_report(corpus_dir: pathlib.Path) -> dict:
  """The ``report.json`` of a built corpus."""
  return jsonfile.load(corpus_dir / "report.json",
                       what="the corpus build report",
                       fix="rebuild the corpus with m4moe-build-corpus")
