r"""m4moe-build-corpus: build the X->English localisation corpus.

Examples:

  # The packaged recipe (Debian + PyPI catalogs), frozen split keys:
  m4moe-build-corpus --output_dir=corpus --cache_dir=corpus_cache

  # The PyPI half of the recipe only (no apt needed; what --recipe=demo_pypi
  # of m4moe-run builds):
  m4moe-build-corpus --recipe_parts=pypi --languages=pt,zh_Hans,ru,el \
      --output_dir=corpus_pypi

  # Also write the corpus as the TFDS dataset m4moe_corpus (for
  # m4moe-train/-eval/-decode --tfds_name=m4moe_corpus --tfds_data_dir=tfds):
  m4moe-build-corpus --output_dir=corpus --tfds_data_dir=tfds

  # Local catalogs and TSV files only, a few languages:
  m4moe-build-corpus --norecipe --sources=po_dir,extra.tsv \
      --languages=de,fr,zh_Hans --output_dir=corpus_local

The build report (counts of every cleaning rule, skipped sources, per-language
sizes, every damaged or skipped file with the reason) is printed as a summary
and written to ``<output_dir>/report.json``. A bad catalog or TSV line never
stops the build: it is counted and listed under ``problems``. With
--ood_packages the listed source packages are held out of train/dev/test and
become the out-of-domain test split ``test_ood/<lang>.tsv``.

A build that skips part of its recipe (the Debian half without apt-get and
dpkg-deb, with --nouse_apt, or when empty package lists find no package; a
PyPI pin pip cannot fetch) still writes the corpus, but ends with one
warning per skipped source kind (how many, why, how to get them) and one
line per requested language that lost training pairs (what the recipe
yields, from the recipe's expected_pairs.txt, against what was built), on
stderr and in ``report.json``'s ``warnings`` and ``reduced`` sections;
m4moe-run refuses to train on such a corpus when it falls below the
recipe's minimums.

An empty result is an error: when no requested --languages (or, without
--languages, no language at all) gets a pair, it exits 1 naming each
requested language's reason and the languages the sources do have, leaves
--output_dir as it was and keeps the build's report in
``<output_dir>.failed-report.json``. A requested language that comes out
empty beside others that do not is a warning naming it. Both are in
``report.json``'s ``language_coverage`` section.

``--output_dir`` is replaced atomically, but only when it is missing, empty or
a corpus this tool wrote (it leaves a ``.m4moe-corpus.json`` marker); any
other directory is refused unless ``--overwrite`` is given. SIGTERM or Ctrl-C
stop the build, its worker processes and its temporary files, leaving the
previous corpus in place (exit code 1); the workers also die with a killed
builder. A second build of the same ``--output_dir`` while one runs exits 1
naming the first (an flock on ``.<name>.lock`` beside the directory).
"""

from __future__ import annotations

import contextlib
import json
import pathlib
import sys

from absl import app
from absl import flags

from m4moe import cli
from m4moe import run_lock
from m4moe.data import cleaning
from m4moe.data import corpus
from m4moe.data import sources
from m4moe.data import split

_OUTPUT_DIR = flags.DEFINE_string(
    "output_dir", None, "Where the corpus is written. Replaced atomically "
    "when missing, empty or a corpus this tool wrote; see --overwrite.")
_OVERWRITE = flags.DEFINE_boolean(
    "overwrite", False, "Replace --output_dir even when it is a non-empty "
    "directory this tool did not write (its contents are deleted). Never "
    "applies to a directory holding --sources, --cache_dir or the working "
    "directory.")
_CACHE_DIR = flags.DEFINE_string(
    "cache_dir", None, "Download/extraction cache (default: "
    "<output_dir>.cache). Re-runs reuse it.")
_RECIPE = flags.DEFINE_string(
    "recipe", "packaged", "Directory with recipe_debian.txt/recipe_pypi.txt; "
    "'packaged' uses the recipe shipped in m4moe.data; '' (or --norecipe) "
    "builds from --sources only.")
_NORECIPE = flags.DEFINE_boolean("norecipe", False, "Ignore --recipe.")
_SOURCES = flags.DEFINE_list(
    "sources", [], "Local catalog dirs/files (.po/.mo) and TSV files "
    "(lang<TAB>english<TAB>translation).")
_LANGUAGES = flags.DEFINE_list(
    "languages", [], "Keep only these normalised language codes.")
_MIN_PAIRS = flags.DEFINE_integer("min_pairs", 1,
                                  "Drop languages with fewer pairs.")
_USE_APT = flags.DEFINE_boolean(
    "use_apt", True, "Fetch the Debian half of the recipe; --nouse_apt "
    "skips it (and says so: the corpus is then reduced).")
_RECIPE_PARTS = flags.DEFINE_list(
    "recipe_parts", ["debian", "pypi"], "The halves of the recipe to build "
    "from: debian,pypi (the whole recipe) or pypi (the PyPI half, which "
    "needs only pip; its own recipe, so nothing is reported as skipped).")
_SPLIT_KEYS = flags.DEFINE_string(
    "split_keys", "packaged", "Frozen split-key file; 'packaged' uses "
    "m4moe.data's committed file, '' chooses dev/test afresh.")
_OOD_PACKAGES = flags.DEFINE_string(
    "ood_packages", "", "File of source packages (one name a line) held out "
    "of train/dev/test and written as the out-of-domain split test_ood; "
    "'packaged' uses m4moe.data's committed list (data/splits/"
    "ood_packages.txt), '' holds out nothing.")
_DEV_GROUPS = flags.DEFINE_integer("dev_groups", 500,
                                   "English groups in dev (fresh split).")
_TEST_GROUPS = flags.DEFINE_integer("test_groups", 1000,
                                    "English groups in test (fresh split).")
_MIN_WORDS = flags.DEFINE_integer("min_words", 3, "Min English words.")
_MAX_WORDS = flags.DEFINE_integer("max_words", 100, "Max English words.")
_WORKERS = flags.DEFINE_integer("workers", 2, "Catalog parsing processes.")
_TFDS_DATA_DIR = flags.DEFINE_string(
    "tfds_data_dir", None, "Also write the built corpus as the TFDS dataset "
    "m4moe_corpus into this TFDS data directory (a folder or gs:// path), "
    "offline, replacing an earlier m4moe_corpus build of the same version "
    "there; its examples are the corpus files' pairs in file order "
    "(m4moe.data.tfds_corpus).")
_PRINTED_PROBLEMS = 50  # report.json lists 200; "counts" counts them all


def _config() -> corpus.BuildConfig:
  output_dir = pathlib.Path(_OUTPUT_DIR.value)
  recipe = None
  if _RECIPE.value and not _NORECIPE.value:
    recipe = (sources.packaged_recipe_dir() if _RECIPE.value == "packaged"
              else pathlib.Path(_RECIPE.value))
  split_keys = None
  if _SPLIT_KEYS.value:
    split_keys = (split.default_split_keys_path()
                  if _SPLIT_KEYS.value == "packaged"
                  else pathlib.Path(_SPLIT_KEYS.value))
  ood_packages = None
  if _OOD_PACKAGES.value:
    ood_packages = (split.default_ood_packages_path()
                    if _OOD_PACKAGES.value == "packaged"
                    else pathlib.Path(_OOD_PACKAGES.value))
  return corpus.BuildConfig(
      output_dir=output_dir,
      cache_dir=pathlib.Path(_CACHE_DIR.value or f"{output_dir}.cache"),
      recipe_dir=recipe,
      sources=tuple(pathlib.Path(s) for s in _SOURCES.value),
      languages=tuple(_LANGUAGES.value),
      min_pairs=_MIN_PAIRS.value,
      use_apt=_USE_APT.value,
      recipe_parts=tuple(_RECIPE_PARTS.value),
      split_keys=split_keys,
      split_config=split.SplitConfig(dev_groups=_DEV_GROUPS.value,
                                     test_groups=_TEST_GROUPS.value),
      ood_packages=ood_packages,
      cleaning=cleaning.CleaningConfig(min_words=_MIN_WORDS.value,
                                       max_words=_MAX_WORDS.value),
      workers=_WORKERS.value,
      overwrite=_OVERWRITE.value)


def _write_tfds(corpus_dir: pathlib.Path) -> None:
  """--tfds_data_dir: the corpus as the TFDS dataset m4moe_corpus.

  TFDS prints its progress on stdout, which carries this tool's JSON
  summary, so it goes to stderr.
  """
  from m4moe.data import tfds_corpus  # pylint: disable=g-import-not-at-top
  try:
    with contextlib.redirect_stdout(sys.stderr):
      builder = tfds_corpus.write_corpus_dataset(corpus_dir,
                                                 _TFDS_DATA_DIR.value)
  except (tfds_corpus.TfdsError, OSError) as e:
    sys.exit(f"m4moe-build-corpus: error: the corpus at {corpus_dir} is "
             f"built, but writing it to --tfds_data_dir failed: {e}")
  splits = builder.info.splits
  print(f"m4moe-build-corpus: wrote {tfds_corpus.NAME} {builder.version} "
        f"({len(splits)} splits, {sum(s.num_examples for s in splits.values())}"
        f" examples) to {builder.data_dir}", file=sys.stderr)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  try:
    config = _config()
  except ValueError as e:
    raise app.UsageError(str(e)) from e
  try:
    with cli.exit_on_disk_full(
        tool="m4moe-build-corpus", action="building the corpus",
        path=config.output_dir.absolute().parent,
        kept=f"the previous corpus at {config.output_dir} (if any) is intact "
        "and the build's temporary directory is removed",
        needed_bytes=cli.tree_bytes(config.output_dir)):
      report = corpus.build_corpus(config)
  except (corpus.OutputDirError, corpus.SplitKeysError,
          sources.RecipeError) as e:
    raise app.UsageError(str(e)) from e
  except corpus.EmptyCorpusError as e:
    sys.exit(f"m4moe-build-corpus: error: {e}")
  except run_lock.RunLockedError as e:
    sys.exit(f"m4moe-build-corpus: refused, nothing was changed: {e}")
  except corpus.BuildInterrupted as e:
    print(f"m4moe-build-corpus: {e}", file=sys.stderr)
    sys.exit(1)
  except KeyboardInterrupt:
    print("m4moe-build-corpus: interrupted; the previous output (if any) is "
          "unchanged", file=sys.stderr)
    sys.exit(130)
  skipped = [s for s in report.get("sources", []) if s["status"] != "cached"
             and s["status"] != "downloaded"]
  problems = report["problems"]
  print(json.dumps({"summary": report["summary"],
                    "warnings": report["warnings"],
                    "counts": report["counts"],
                    "sources_not_as_pinned": skipped,
                    "problems": problems[:_PRINTED_PROBLEMS],
                    "problems_not_printed": max(
                        0, len(problems) - _PRINTED_PROBLEMS),
                    "seconds": report["seconds"]}, indent=1,
                   ensure_ascii=False))
  print(f"report: {config.output_dir / 'report.json'}")
  if _TFDS_DATA_DIR.value:
    _write_tfds(config.output_dir)
  _print_warnings(report)


def _print_warnings(report: dict) -> None:
  """The warnings once more, last on stderr: a reduced corpus must not pass
  unnoticed under a long JSON summary."""
  for warning in report["warnings"]:
    print(f"m4moe-build-corpus: warning: {warning}", file=sys.stderr)
  if report["reduced"]["reduced"]:
    print("m4moe-build-corpus: warning: this corpus is smaller than its "
          "recipe's; m4moe-run stops before training on it when a language "
          "falls below the recipe's minimums", file=sys.stderr)


def run():
  flags.mark_flag_as_required("output_dir")
  cli.run_tool(main, module=__name__)


if __name__ == "__main__":
  run()
