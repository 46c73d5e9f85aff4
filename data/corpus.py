"""Building the X->English corpus: fetch, parse, clean, dedup, split, write.

Output layout (``output_dir``)::

  train/<lang>.tsv  dev/<lang>.tsv  test/<lang>.tsv   # "english<TAB>x" lines
                   # (all three exist for every language, possibly empty;
                   # train rows in a fixed pseudo-random order)
  report.json      # every counter, per-language counts, sources, timing
  split_keys.txt   # the dev/test group ids used (copy or freshly chosen)

Sources are read in a fixed order (recipe pins, then local ``sources`` in the
order given) and the first occurrence of a (lang, english, x) triple is the
one kept, so the output is a pure function of the inputs. Everything is
written under a temporary directory next to ``output_dir`` and renamed into
place at the end: a killed build leaves the previous output (or nothing).
A killed build's temporary directory is deleted by the next build.
Unreadable catalogs, unknown locales and bad TSV lines are skipped and listed
with their file (and line) in the report; nothing is dropped without a count.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import functools
import hashlib
import json
import os
import pathlib
import random
import shutil
import tempfile
import time
import zlib
from typing import Iterable, Iterator, Sequence

from m4moe.data import catalogs
from m4moe.data import cleaning
from m4moe.data import languages
from m4moe.data import sources
from m4moe.data import split

_MAX_LISTED_PROBLEMS = 200
_CHUNKSIZE = 8


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
    split_keys: frozen split-key file; None (or a missing file) chooses
      dev/test afresh with ``split_config``.
    split_config: dev/test sizes when choosing afresh.
    cleaning: cleaning thresholds.
    workers: processes parsing catalogs (1 = in-process).
  """

  output_dir: pathlib.Path
  cache_dir: pathlib.Path
  recipe_dir: pathlib.Path | None = None
  sources: tuple[pathlib.Path, ...] = ()
  languages: tuple[str, ...] = ()
  min_pairs: int = 1
  use_apt: bool = True
  split_keys: pathlib.Path | None = None
  split_config: split.SplitConfig = split.SplitConfig()
  cleaning: cleaning.CleaningConfig = cleaning.CleaningConfig()
  workers: int = 2

  def __post_init__(self):
    if self.recipe_dir is None and not self.sources:
      raise ValueError("give --recipe and/or --sources: nothing to build from")
    for src in self.sources:
      if not src.exists():
        raise ValueError(f"--sources: {src} does not exist")
    if self.min_pairs < 1 or self.workers < 1:
      raise ValueError("--min_pairs and --workers must be >= 1")


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
      continue
    counts["pair:raw"] += 1
    result = cleaning.clean_pair(lang, fields[1], fields[2],
                                 config=config.cleaning)
    counts.update(result.edits)
    if result.dropped_by:
      counts[result.dropped_by] += 1
    else:
      yield lang, result.source, result.target


def _fetch_recipe(config: BuildConfig, problems: _Problems,
                  report: dict) -> list[pathlib.Path]:
  """Downloads/extracts the recipe; returns the catalog directories."""
  pins = sources.read_recipe_dir(config.recipe_dir)
  apt_ok, apt_reason = sources.apt_usable()
  apt_ok = apt_ok and config.use_apt
  apt_reason = apt_reason or ("disabled by --nouse_apt" if not apt_ok else "")
  dirs, fetched = [], []
  for pin in pins:
    usable = apt_ok if pin.kind == "debian" else True
    result = sources.fetch(pin, cache_dir=config.cache_dir,
                           tool_available=usable)
    if result.status == "skipped" and pin.kind == "debian" and not usable:
      result = dataclasses.replace(result, reason=apt_reason)
    fetched.append(dataclasses.asdict(result))
    if result.status == "skipped":
      problems.add("source:skipped", pin.origin, result.reason)
      continue
    try:
      dirs.append(sources.extract_catalogs(pathlib.Path(result.archive),
                                           cache_dir=config.cache_dir))
    except Exception as e:  # pylint: disable=broad-except
      problems.add("source:unextractable", result.archive, repr(e))
  report["sources"] = fetched
  return dirs


def _parallel_map(fn, items: Sequence, workers: int) -> Iterable:
  if workers == 1 or len(items) < 2:
    return map(fn, items)
  pool = concurrent.futures.ProcessPoolExecutor(max_workers=workers)
  return _closing_map(pool, fn, items)


def _closing_map(pool, fn, items) -> Iterator:
  with pool:
    yield from pool.map(fn, items, chunksize=_CHUNKSIZE)


def _cleaned_pairs(config: BuildConfig, problems: _Problems,
                   report: dict) -> Iterator[tuple[str, str, str]]:
  """All cleaned pairs in a fixed source order (before dedup)."""
  roots = _fetch_recipe(config, problems, report) if config.recipe_dir else []
  local = [s for s in config.sources if s.suffix != ".tsv"]
  tsvs = [s for s in config.sources if s.suffix == ".tsv"]
  walk = sources.SourceWalk()
  files = [f for root in roots for f in walk.find_catalogs(root)]
  files += sources.iter_source_files(local, walk=walk)
  for problem in walk.problems:
    problems.add(problem.kind, problem.where, problem.reason)
  problems.counts["catalog:files"] += len(files)
  selected = frozenset(config.languages)
  jobs = [(f, config.cleaning, selected) for f in files]
  for pairs, counts, found in _parallel_map(_process_catalog, jobs,
                                            config.workers):
    problems.counts.update(counts)  # (includes the problems' own counts)
    problems.extend(found)
    yield from pairs
  for tsv in tsvs:
    yield from _read_tsv(tsv, config, problems)


def _pair_hash(lang: str, source: str, target: str) -> int:
  digest = hashlib.blake2b(f"{lang}\t{source}\t{target}".encode("utf-8"),
                           digest_size=8).digest()
  return int.from_bytes(digest, "little")


def _stage(pairs: Iterable[tuple[str, str, str]], staging: pathlib.Path,
           counts: collections.Counter) -> dict[str, int]:
  """Dedups pairs into ``staging/<lang>.tsv`` ("gid<TAB>en<TAB>x" lines).

  Returns:
    group id -> number of languages with a pair in that group.
  """
  staging.mkdir(parents=True)
  seen, seen_group_lang = set(), set()
  group_languages = collections.Counter()
  handles = {}
  gid_of = functools.lru_cache(maxsize=1 << 18)(split.group_id)
  try:
    for lang, source, target in pairs:
      key = _pair_hash(lang, source, target)
      if key in seen:
        counts["duplicate"] += 1
        continue
      seen.add(key)
      gid = gid_of(source)
      if (gid, lang) not in seen_group_lang:
        seen_group_lang.add((gid, lang))
        group_languages[gid] += 1
      if lang not in handles:
        handles[lang] = open(staging / f"{lang}.tsv", "w", encoding="utf-8")
      handles[lang].write(f"{gid}\t{source}\t{target}\n")
  finally:
    for handle in handles.values():
      handle.close()
  return dict(group_languages)


def _split_keys(config: BuildConfig, group_languages: dict[str, int],
                report: dict) -> split.SplitKeys:
  path = config.split_keys
  if path is not None and path.exists():
    report["split_keys"] = {"frozen_file": str(path)}
    return split.load_split_keys(path)
  report["split_keys"] = {"chosen_fresh": dataclasses.asdict(
      config.split_config)}
  return split.choose_split_keys(group_languages, config=config.split_config)


def _write_splits(staging: pathlib.Path, out: pathlib.Path,
                  keys: split.SplitKeys, config: BuildConfig,
                  counts: collections.Counter) -> dict[str, dict[str, int]]:
  """Routes staged pairs to ``out/<split>/<lang>.tsv``; per-language counts."""
  per_lang = {}
  for name in split.SPLITS:
    (out / name).mkdir(parents=True)
  for path in sorted(staging.glob("*.tsv")):
    lang = path.stem
    lines = path.read_text(encoding="utf-8").splitlines()
    if len(lines) < config.min_pairs:
      counts["language_below_min_pairs"] += 1
      counts["pairs_of_languages_below_min_pairs"] += len(lines)
      continue
    routed = {name: [] for name in split.SPLITS}
    for line in lines:
      gid, _, pair = line.partition("\t")
      routed[keys.split_of(gid)].append(pair)
    # Catalog order clusters strings by application: shuffle the training
    # rows (deterministically) so a small shuffle buffer suffices later.
    random.Random(zlib.crc32(lang.encode("utf-8"))).shuffle(routed["train"])
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
  }


def _replace_dir(tmp: pathlib.Path, final: pathlib.Path) -> None:
  """Renames ``tmp`` to ``final``, replacing an existing ``final``."""
  old = None
  if final.exists():
    old = final.with_name(f".{final.name}.old-{os.getpid()}")
    final.rename(old)
  tmp.rename(final)
  if old is not None:
    shutil.rmtree(old, ignore_errors=True)


def _remove_stale_temporaries(output_dir: pathlib.Path) -> None:
  """Deletes temporaries of earlier builds that were killed (SIGKILL/TERM
  skip cleanup). Two builds into one output_dir at once are not supported."""
  for stale in output_dir.parent.glob(f".{output_dir.name}.tmp-*"):
    shutil.rmtree(stale, ignore_errors=True)
  for stale in output_dir.parent.glob(f".{output_dir.name}.old-*"):
    shutil.rmtree(stale, ignore_errors=True)


def build_corpus(config: BuildConfig) -> dict:
  """Builds the corpus described by ``config``; returns the build report.

  The report (also written to ``output_dir/report.json``) has ``summary``,
  ``counts`` (every rule and problem counter), ``problems`` (the first files
  / lines skipped, with reasons), ``languages`` (per-language split sizes),
  ``sources`` (each recipe pin: status, version used, archive) and
  ``seconds``.
  """
  start = time.time()
  output_dir = config.output_dir.resolve()
  output_dir.parent.mkdir(parents=True, exist_ok=True)
  _remove_stale_temporaries(output_dir)
  counts = cleaning.new_counter()
  problems = _Problems(counts)
  report: dict = {"config": {k: str(v) for k, v in
                             dataclasses.asdict(config).items()}}
  tmp = pathlib.Path(tempfile.mkdtemp(dir=output_dir.parent,
                                      prefix=f".{output_dir.name}.tmp-"))
  try:
    staging = tmp / "_staging"
    group_languages = _stage(_cleaned_pairs(config, problems, report),
                             staging, counts)
    keys = _split_keys(config, group_languages, report)
    split.save_split_keys(keys, tmp / "split_keys.txt")
    per_lang = _write_splits(staging, tmp, keys, config, counts)
    shutil.rmtree(staging)
    report.update(summary=_summary(per_lang), counts=dict(sorted(
        counts.items())), problems=problems.listed, languages=per_lang,
                  seconds=round(time.time() - start, 1))
    (tmp / "report.json").write_text(
        json.dumps(report, indent=1, ensure_ascii=False), encoding="utf-8")
    _replace_dir(tmp, output_dir)
  finally:
    if tmp.exists():
      shutil.rmtree(tmp, ignore_errors=True)
  return report


def read_report(corpus_dir: pathlib.Path) -> dict:
  """The ``report.json`` of a built corpus."""
  return json.loads((corpus_dir / "report.json").read_text(encoding="utf-8"))
