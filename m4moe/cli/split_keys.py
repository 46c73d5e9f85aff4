r"""m4moe-split-keys: extend the frozen test keys to bigger test sets.

Example (the study's test sets, on a corpus built with the current keys):

  m4moe-split-keys --corpus_dir=runs/study/corpus \
      --languages=pt,de,ru,ja --min_test_pairs=500 --dry_run

Moves English groups from train to test until every given language has
--min_test_pairs test pairs, preferring groups translated in the most of the
given languages, and never letting a language hold out (dev + test) more
than --max_held_out_fraction of its pairs: small languages stop short of the
target and are listed as capped. Old dev/test keys never move; the new test
ids are appended to --split_keys below a ``# version: N`` line
(m4moe.data.split.extend_test_keys / append_split_keys). It prints, per
language, the test pairs before and after and the training pairs each loses.

The corpus must have been built with --split_keys (its split_keys.txt must
hold the same keys): the choice reads its train/<lang>.tsv files. Nothing is
written with --dry_run; otherwise only --split_keys (atomically) and, with
--report, that JSON file.
"""

from __future__ import annotations

import collections
import datetime
import json
import pathlib
import sys

from absl import app
from absl import flags

from m4moe import cli
from m4moe import jsonfile
from m4moe.data import split
from m4moe.data import vocab

_CORPUS_DIR = flags.DEFINE_string(
    "corpus_dir", None, "A corpus built by m4moe-build-corpus with "
    "--split_keys.")
_SPLIT_KEYS = flags.DEFINE_string(
    "split_keys", "packaged", "The key file to extend; 'packaged' is "
    "m4moe.data's committed data/splits/split_keys.txt.")
_LANGUAGES = flags.DEFINE_list(
    "languages", [], "Languages whose test sets to grow (default: every "
    "language of the corpus).")
_MIN_TEST_PAIRS = flags.DEFINE_integer(
    "min_test_pairs", 500, "Test pairs wanted per language.")
_MAX_HELD_OUT_FRACTION = flags.DEFINE_float(
    "max_held_out_fraction", 0.1, "A language never holds out more than "
    "this share of its pairs in dev + test.")
_MIN_LANGUAGES = flags.DEFINE_integer(
    "min_languages", 2, "New test groups are translated in at least this "
    "many of --languages.")
_REPORT = flags.DEFINE_string(
    "report", "", "Also write the extension's report to this JSON file.")
_DRY_RUN = flags.DEFINE_boolean(
    "dry_run", False, "Print what would be appended; write nothing.")


def train_groups(corpus_dir: pathlib.Path, langs: list[str]
                 ) -> dict[str, dict[str, int]]:
  """group id -> language -> training pairs, over ``langs``."""
  groups: dict[str, collections.Counter] = collections.defaultdict(
      collections.Counter)
  for lang in langs:
    for english, _ in vocab.read_split_pairs(corpus_dir, "train", lang):
      groups[split.group_id(english)][lang] += 1
  return {gid: dict(c) for gid, c in groups.items()}


def _keys_path() -> pathlib.Path:
  if _SPLIT_KEYS.value == "packaged":
    return split.default_split_keys_path()
  return pathlib.Path(_SPLIT_KEYS.value)


def _check_flags() -> None:
  """Refuses flag values that cannot describe an extension, before the
  corpus is read."""
  if _MIN_TEST_PAIRS.value < 1:
    raise app.UsageError(f"--min_test_pairs={_MIN_TEST_PAIRS.value}: use a "
                         "positive number of test pairs")
  if not 0 < _MAX_HELD_OUT_FRACTION.value < 1:
    raise app.UsageError(
        f"--max_held_out_fraction={_MAX_HELD_OUT_FRACTION.value}: use a "
        "fraction between 0 and 1 (0.1 holds out at most a tenth)")
  if _MIN_LANGUAGES.value < 1:
    raise app.UsageError(f"--min_languages={_MIN_LANGUAGES.value}: use 1 "
                         "or more")


def _load_inputs(corpus_dir: pathlib.Path, keys_path: pathlib.Path):
  """(split keys, {language: split counts}, chosen languages).

  The corpus must have been built with these very keys: the groups to move
  are read from its train/ files, which other keys would have split
  differently.
  """
  try:
    keys = split.load_split_keys(keys_path)
  except (ValueError, OSError) as e:
    raise app.UsageError(f"--split_keys: {e}") from e
  report_path = corpus_dir / "report.json"
  try:
    languages = jsonfile.load(
        report_path, what="the corpus build report",
        fix="rebuild the corpus with m4moe-build-corpus")["languages"]
    built_keys = split.load_split_keys(corpus_dir / "split_keys.txt")
  except (OSError, ValueError, KeyError) as e:
    raise app.UsageError(
        f"--corpus_dir={corpus_dir}: not a corpus built by "
        f"m4moe-build-corpus ({e}); build it first") from e
  if (built_keys.dev, built_keys.test) != (keys.dev, keys.test):
    raise app.UsageError(
        f"--corpus_dir={corpus_dir} was built with other split keys than "
        f"{keys_path}; rebuild it with --split_keys={keys_path}")
  langs = _LANGUAGES.value or sorted(languages)
  missing = sorted(set(langs) - set(languages))
  if missing:
    raise app.UsageError(f"--languages: {', '.join(missing)} not in "
                         f"{report_path}; pick languages the corpus has")
  return keys, {lang: languages[lang] for lang in langs}, langs


def _extend(keys, counts, corpus_dir: pathlib.Path, langs: list[str]):
  """(new keys, extension) of :func:`m4moe.data.split.extend_test_keys`."""
  try:
    return split.extend_test_keys(
        keys, train_groups=train_groups(corpus_dir, langs),
        test_pairs={lang: c["test"] for lang, c in counts.items()},
        held_out_pairs={lang: c["dev"] + c["test"]
                        for lang, c in counts.items()},
        total_pairs={lang: c["train"] + c["dev"] + c["test"]
                     for lang, c in counts.items()},
        target=_MIN_TEST_PAIRS.value,
        max_held_out_fraction=_MAX_HELD_OUT_FRACTION.value,
        min_languages=_MIN_LANGUAGES.value)
  except ValueError as e:
    raise app.UsageError(str(e)) from e


def _write(keys_path: pathlib.Path, new_keys, extension, langs: list[str],
           text: str) -> None:
  """Appends the new test ids (with the command that chose them, so the key
  file says how each version came about) and writes --report."""
  if extension.added:
    today = datetime.datetime.now(datetime.timezone.utc).date().isoformat()
    split.append_split_keys(
        keys_path, new_keys,
        comment=(f"{today}: {len(extension.added)} test groups moved from "
                 f"train by m4moe-split-keys (--min_test_pairs="
                 f"{_MIN_TEST_PAIRS.value} --max_held_out_fraction="
                 f"{_MAX_HELD_OUT_FRACTION.value} --languages="
                 f"{','.join(langs)})"))
  if _REPORT.value:
    out = pathlib.Path(_REPORT.value)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(text + "\n", encoding="utf-8")
    tmp.replace(out)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  _check_flags()
  corpus_dir = pathlib.Path(_CORPUS_DIR.value)
  keys_path = _keys_path()
  keys, counts, langs = _load_inputs(corpus_dir, keys_path)
  new_keys, extension = _extend(keys, counts, corpus_dir, langs)
  summary = {
      "split_keys": str(keys_path), "version_before": keys.version,
      "version_after": new_keys.version, "languages": langs,
      "min_test_pairs": _MIN_TEST_PAIRS.value,
      "max_held_out_fraction": _MAX_HELD_OUT_FRACTION.value,
      "languages_at_target": sum(
          n >= _MIN_TEST_PAIRS.value
          for n in extension.test_pairs_after.values()),
      **extension.to_dict()}
  text = json.dumps(summary, indent=1)
  print(text)
  if _DRY_RUN.value:
    print("dry run: nothing written", file=sys.stderr)
    return
  _write(keys_path, new_keys, extension, langs, text)


def run():
  flags.mark_flag_as_required("corpus_dir")
  cli.run_tool(main, module=__name__)


if __name__ == "__main__":
  run()
