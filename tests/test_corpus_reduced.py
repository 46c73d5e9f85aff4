"""A corpus build that skips part of its recipe says so, and the main job
refuses to train and report on a corpus below its recipe's minimums."""

import json
import os
import pathlib
import subprocess
import sys
import zipfile

import pytest

from m4moe.data import corpus
from m4moe.data import corpus_coverage
from m4moe.data import fixtures
from m4moe.data import sources
from m4moe.eval import report as report_lib
from m4moe.eval import results
from m4moe.eval import scoring
from m4moe.pipeline import corpus_check
from m4moe.pipeline import plan as plan_lib
from m4moe.pipeline import recipes as recipes_lib
import recipe_fixtures

_ROOT = pathlib.Path(__file__).resolve().parent.parent


def _wheel(path: pathlib.Path, catalogs: dict[str, list[str]]) -> None:
  """A wheel holding one catalog per locale (``catalogs``: locale ->
  English sentences)."""
  path.parent.mkdir(parents=True, exist_ok=True)
  package = path.name.split("-")[0]
  with zipfile.ZipFile(path, "w") as zf:
    for locale, sentences in catalogs.items():
      po = fixtures.make_catalog(locale, sentences, special=False)
      zf.writestr(f"{package}/locale/{locale}/LC_MESSAGES/{package}.po",
                  str(po))
    zf.writestr(f"{package}/__init__.py", "")


def _no_apt_path(tmp_path: pathlib.Path) -> str:
  """A PATH without apt-get: a test double directory holding only a
  dpkg-deb that fails (apt-get is what the build must miss)."""
  bin_dir = tmp_path / "bin"
  bin_dir.mkdir(parents=True)
  fake = bin_dir / "dpkg-deb"
  fake.write_text("#!/bin/sh\nexit 1\n")
  fake.chmod(0o755)
  return str(bin_dir)


def _build(*args: str, path: str) -> subprocess.CompletedProcess:
  env = dict(os.environ, PATH=path)
  return subprocess.run([sys.executable, "-m", "m4moe.cli.build_corpus",
                         *args], capture_output=True, text=True,
                        check=False, timeout=300, env=env)


def test_a_build_without_apt_get_warns_per_source_kind_and_language(
    tmp_path):
  recipe, cache = tmp_path / "recipe", tmp_path / "cache"
  recipe.mkdir()
  (recipe / "recipe_debian.txt").write_text(
      "l10n-de=1.0\nl10n-fr=1.0\nl10n-ja=1.0\n")
  (recipe / "recipe_pypi.txt").write_text("locpack==1.0\n")
  (recipe / corpus_coverage.EXPECTED_PAIRS).write_text(
      "# test\nde\tdebian+pypi\t500\nfr\tdebian+pypi\t10\n"
      "de\tpypi\t40\n")
  sentences = fixtures.english_sentences(60, seed=7)
  _wheel(cache / "downloads" / "pypi" / "locpack-1.0-py3-none-any.whl",
         {"de": sentences[:40], "fr": sentences[:30]})
  out = tmp_path / "corpus"
  proc = _build(f"--recipe={recipe}", f"--cache_dir={cache}",
                f"--output_dir={out}", "--languages=de,fr", "--split_keys=",
                "--dev_groups=2", "--test_groups=2", "--workers=1",
                path=_no_apt_path(tmp_path))
  assert proc.returncode == 0, proc.stderr
  report = json.loads((out / "report.json").read_text())
  train = report["languages"]["de"]["train"]
  debian = ("skipped 3 of 3 Debian sources of the corpus recipe (apt-get/"
            "dpkg-deb not found); to include them, run the build on a "
            "Debian/Ubuntu machine")
  de = (f"de: {train:,} training pairs built (test: "
        f"{report['languages']['de']['test']} sentences); the full recipe "
        "yields 500 training pairs")
  # One line per skipped kind and per language that lost pairs (fr built
  # more than its recorded 10), on stderr and in report.json.
  assert len(report["warnings"]) == 2
  assert report["warnings"][0].startswith(debian)
  assert report["warnings"][1] == de
  for warning in report["warnings"]:
    assert f"m4moe-build-corpus: warning: {warning}" in proc.stderr
  assert report["reduced"]["reduced"] is True
  assert list(report["reduced"]["languages"]) == ["de"]
  # The PyPI half alone is a recipe of its own: nothing skipped, no word.
  proc = _build(f"--recipe={recipe}", f"--cache_dir={cache}",
                f"--output_dir={tmp_path / 'pypi'}", "--languages=de,fr",
                "--recipe_parts=pypi", "--split_keys=", "--dev_groups=2",
                "--test_groups=2", "--workers=1",
                path=_no_apt_path(tmp_path / "again"))
  assert proc.returncode == 0, proc.stderr
  report = json.loads((tmp_path / "pypi" / "report.json").read_text())
  assert report["warnings"] == [] and not report["reduced"]["reduced"]
  assert [s["pin"]["kind"] for s in report["sources"]] == ["pypi"]
  assert "warning" not in proc.stderr


def test_each_cause_of_a_skipped_half_has_its_own_way_to_get_it():
  def pins(kind, status, reason, n=1):
    return [{"pin": {"kind": kind}, "status": status, "reason": reason}
            for _ in range(n)]
  # A non-root user with empty package lists: apt-get finds no package.
  lists = "pinned: E: Unable to locate package x; current: E: Unable"
  found = corpus_coverage.skipped_sources(
      pins("debian", "skipped", lists, 2) + pins("debian", "cached", "") +
      pins("pypi", "skipped", "pinned: no network", 1) +
      pins("pypi", "downloaded", "", 3))
  assert [(s["kind"], s["skipped"], s["of"]) for s in found] == [
      ("debian", 2, 3), ("pypi", 1, 4)]
  assert "as root run `apt-get update`" in found[0]["message"]
  assert "pip can reach PyPI" in found[1]["message"]
  nouse = corpus_coverage.skipped_sources(
      pins("debian", "skipped", corpus_coverage.APT_DISABLED))
  assert "without --nouse_apt" in nouse[0]["message"]
  # The builder's reason for a missing apt-get is the one the fix keys on.
  assert corpus_coverage.APT_MISSING in (
      "apt-get/dpkg-deb not found", sources.apt_usable()[1])


def test_a_malformed_expected_pairs_line_names_file_and_line(tmp_path):
  (tmp_path / corpus_coverage.EXPECTED_PAIRS).write_text(
      "pt\tdebian+pypi\t10\nkk\tall\t5\n")
  with pytest.raises(sources.RecipeError, match=r"expected_pairs.txt:2"):
    corpus_coverage.read_expected_pairs(tmp_path, parts=("debian", "pypi"))
  # The packaged file parses, and records the demo's full-recipe counts.
  packaged = corpus_coverage.read_expected_pairs(
      sources.packaged_recipe_dir(), parts=("debian", "pypi"))
  assert packaged == {"pt": 134256, "kk": 16973, "si": 5970, "ia": 1361}


def _run(*args: str) -> subprocess.CompletedProcess:
  return subprocess.run([sys.executable, "-m", "m4moe.cli.run", *args],
                        capture_output=True, text=True, timeout=600,
                        check=False)


def test_the_main_job_stops_before_training_below_the_minimums(tmp_path,
                                                               capsys):
  # The smoke recipe's generated catalogs (de 500, fr 250, ru 120, ja 60
  # entries) with minimums only de and fr meet.
  path = tmp_path / "small.toml"
  path.write_text(recipe_fixtures.HEADER.replace(
      'name = "mini"', 'name = "mini"\nmin_train_pairs = 200\n'
      "min_eval_sentences = 0") + recipe_fixtures.MINIMAL[
          len(recipe_fixtures.HEADER):])
  run_dir = tmp_path / "run"
  stopped = _run(f"--recipe={path}", f"--run_dir={run_dir}")
  assert stopped.returncode != 0
  report = json.loads((run_dir / "corpus" / "report.json").read_text())
  built = report["languages"]
  assert built["ru"]["train"] < 200 <= built["de"]["train"]
  message = stopped.stderr.strip().splitlines()[-1]
  assert message.startswith("m4moe-run: stopped before training: ")
  assert (f"ja ({built['ja']['train']} training pairs, "
          f"{built['ja']['test']} test sentences)") in message
  assert "ru (" in message and "de (" not in message
  assert "--allow_reduced_corpus" in message
  assert (run_dir / "stages" / "corpus.json").is_file()
  assert not (run_dir / "stages" / "vocab.json").exists()
  assert not (run_dir / "models").exists()
  # Going on anyway (--allow_reduced_corpus) only warns.
  from m4moe.cli import run as run_cli  # pylint: disable=g-import-not-at-top
  job = run_cli._Job(recipe=recipes_lib.load_recipe(path), run_dir=run_dir,
                     stages=[])
  job.check_corpus(allow_reduced=True)
  assert "going on below the recipe's minimums" in capsys.readouterr().err
  with pytest.raises(SystemExit, match="stopped before training"):
    run_cli._Job(recipe=job.recipe, run_dir=run_dir,
                 stages=[]).check_corpus(allow_reduced=False)


def test_the_stop_message_names_the_skipped_half_and_the_pypi_demo():
  recipe = recipes_lib.load_recipe("demo")
  report = {
      "languages": {"pt": {"train": 21745, "test": 206},
                    "kk": {"train": 294, "test": 16}},
      "reduced": {"reduced": True, "skipped_sources": (
          corpus_coverage.skipped_sources(
              [{"pin": {"kind": "debian"}, "status": "skipped",
                "reason": corpus_coverage.APT_MISSING}] * 134))}}
  found = corpus_check.shortfalls(recipe, report)
  # si and ia were not built at all: 0 of each.
  assert [(s.language, s.train, s.eval_sentences) for s in found] == [
      ("kk", 294, 16), ("si", 0, 0), ("ia", 0, 0)]
  text = corpus_check.message(recipe, found=found, report=report,
                              corpus_dir=pathlib.Path("runs/demo/corpus"))
  assert "skipped 134 of 134 Debian sources" in text
  assert "m4moe-run --recipe=demo_pypi" in text
  assert "--restart_from=corpus" in text


def _generated_pypi_cache(cache: pathlib.Path, languages: dict[str, str]
                          ) -> None:
  """A wheel of generated catalogs for every pin of the packaged PyPI
  half, so the build finds them all cached (offline)."""
  pins = sources.read_recipe(
      sources.packaged_recipe_dir() / sources.PYPI_RECIPE, kind="pypi")
  sentences = fixtures.english_sentences(400, seed=11)
  for i, pin in enumerate(pins):
    name = pin.name.replace("-", "_")
    part = sentences[(i * 7) % 300:(i * 7) % 300 + 100]
    _wheel(cache / "downloads" / "pypi" /
           f"{name}-{pin.version}-py3-none-any.whl",
           {locale: part for locale in languages.values()})


def test_the_pypi_demo_builds_from_the_pypi_half_only(tmp_path):
  recipe = recipes_lib.load_recipe("demo_pypi")
  stages = plan_lib.plan(recipe, run_dir=tmp_path / "run",
                         cache_dir=tmp_path / "cache")
  corpus_stage = stages[0]
  flags = corpus_stage.flag_values()
  assert flags["recipe_parts"] == "pypi"
  assert flags["languages"] == "pt,zh_Hans,ru,el"
  # The demo's shape: same models, budgets and caps, by resource rank.
  demo = recipes_lib.load_recipe("demo")
  assert recipe.models == demo.models
  assert [(b.train_steps, b.max_train_seconds, b.lane, b.extra_flags)
          for b in recipe.baselines()] == [
              (b.train_steps, b.max_train_seconds, b.lane, b.extra_flags)
              for b in demo.baselines()]
  locales = {"pt": "pt", "zh_Hans": "zh_CN", "ru": "ru", "el": "el"}
  _generated_pypi_cache(tmp_path / "cache", locales)
  proc = subprocess.run(corpus_stage.command(), capture_output=True,
                        text=True, check=False, timeout=300,
                        env=dict(os.environ, PATH=_no_apt_path(tmp_path)))
  assert proc.returncode == 0, proc.stderr[-2000:]
  report = corpus.read_report(tmp_path / "run" / "corpus")
  assert sorted(report["languages"]) == sorted(recipe.languages)
  assert {s["status"] for s in report["sources"]} == {"cached"}
  assert {s["pin"]["kind"] for s in report["sources"]} == {"pypi"}
  assert report["warnings"] == [] and "warning" not in proc.stderr


def test_the_pypi_demos_languages_meet_its_minimums_in_the_pypi_half():
  recipe = recipes_lib.load_recipe("demo_pypi")
  counts = {}
  table = _ROOT / "results" / "demo_pypi" / "pypi_half_counts.tsv"
  for line in table.read_text().splitlines()[1:]:
    lang, train, _, test = line.split("\t")
    counts[lang] = (int(train), int(test))
  expected = corpus_coverage.read_expected_pairs(
      sources.packaged_recipe_dir(), parts=("pypi",))
  for lang in recipe.languages:
    train, test = counts[lang]
    assert expected[lang] == train
    assert train >= recipe.min_train_pairs
    assert test >= recipe.min_eval_sentences
  # Across the range: every other language meeting the minimums has
  # fewer training pairs than pt, and none fewer than el.
  meeting = [lang for lang, (train, test) in counts.items()
             if train >= recipe.min_train_pairs and
             test >= recipe.min_eval_sentences]
  trains = [counts[lang][0] for lang in meeting]
  assert counts["pt"][0] == max(trains) and counts["el"][0] == min(trains)


def _eval(tmp_path: pathlib.Path, name: str, hyps: list[str], *,
          refs: list[str], kind: str):
  """An eval JSON of one language (de) scoring ``hyps``; (path, result)."""
  result = results.EvalResult(
      model=name, kind=kind, metadata={}, languages={
          "de": scoring.score_language(hyps, refs, source_lang="de",
                                       target_lang="en", train_size=3)})
  path = tmp_path / "evals" / f"{name}.json"
  results.write_eval_json(result, path)
  return path, results.read_eval_json(path, kind=kind)


def test_a_report_on_a_reduced_corpus_says_so_in_its_header(tmp_path):
  corpus_dir = tmp_path / "corpus"
  (corpus_dir / "test").mkdir(parents=True)
  refs = ["Open the file", "Save all files", "Print the page"]
  (corpus_dir / "test" / "de.tsv").write_text(
      "".join(f"{en}\tx {en}\n" for en in refs))
  moe = _eval(tmp_path, "moe", ["Open file", "Save all", "x"], refs=refs,
              kind="multilingual")
  base = _eval(tmp_path, "bi-de", ["File", "All", "Page"], refs=refs,
               kind="bilingual")

  def write(out: str):
    return report_lib.write_report(
        tmp_path / out, models=[moe[1]], baselines=[base[1]],
        model_paths=[moe[0]], baseline_paths=[base[0]],
        corpus_dir=corpus_dir, bootstrap_samples=0)
  assert "Data reduced" not in write("whole").markdown.read_text()
  lines = ["skipped 134 of 134 Debian sources of the corpus recipe (x)",
           "de: 3 training pairs built (test: 3 sentences); the full "
           "recipe yields 500 training pairs"]
  (corpus_dir / "report.json").write_text(json.dumps({"reduced": {
      "reduced": True, "warnings": lines}}))
  files = write("reduced")
  md = files.markdown.read_text(encoding="utf-8")
  assert md.index("## Data reduced") < md.index("Inputs: ")
  for line in lines:
    assert f"- {line}" in md
    assert line in files.html.read_text(encoding="utf-8")
