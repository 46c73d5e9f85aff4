"""m4moe-report: examples, source reliance, intervals, seeds.

Hand-made corpora, hypotheses, eval JSONs and training logs; every eval
JSON's scores are what m4moe.eval.scoring gives for its hypotheses, so the
report's rescoring check passes unless a test breaks it on purpose.
"""

import json
import math

import numpy as np
import pytest
from sacrebleu.metrics import BLEU
from sacrebleu.significance import PairedTest
from scipy import stats as scipy_stats

from m4moe.eval import report
from m4moe.eval import results
from m4moe.eval import scoring
from m4moe.eval import seeds
from m4moe.eval import significance
from m4moe.eval import training_logs
from m4moe.training import metrics_log

SAMPLES = 200  # bootstrap resamples: enough for the assertions, fast

# de test set: english<TAB>german. xx->en: source = German, reference =
# English. The "|" and "<b>" check Markdown and HTML escaping.
DE_TEST = [("Open the file", "Datei öffnen"),
           ("Save all | close", "Alle speichern | schließen"),
           ("Print <b>page</b>", "Seite <b>drucken</b>")]


def _write_corpus(root, tests, split="test"):
  for lang, pairs in tests.items():
    (root / split).mkdir(parents=True, exist_ok=True)
    (root / split / f"{lang}.tsv").write_text(
        "".join(f"{en}\t{x}\n" for en, x in pairs), encoding="utf-8")
  return root


def _eval_json(tmp_path, name, hyps, *, corpus, kind="multilingual",
               hyp_dir="metadata", metadata=None, train_size=100,
               file_name=None, split="test"):
  """Writes hypotheses and a matching eval JSON; returns (path, result).

  hyp_dir: "metadata" (recorded), "fallback" (<json dir>/<name>/) or None.
  """
  json_dir = tmp_path / "evals"
  file_name = file_name or name
  metadata = dict(metadata or {})
  if split != "test":
    metadata["split"] = split
  langs = {}
  for lang, lines in hyps.items():
    pairs = [l.split("\t") for l in (corpus / split / f"{lang}.tsv")
             .read_text(encoding="utf-8").splitlines()]
    refs = [en for en, _ in pairs][:len(lines)]
    langs[lang] = scoring.score_language(lines, refs, source_lang=lang,
                                         target_lang="en",
                                         train_size=train_size)
  if hyp_dir is not None:
    where = (tmp_path / "hyps" / file_name if hyp_dir == "metadata"
             else json_dir / name)
    where.mkdir(parents=True, exist_ok=True)
    for lang, lines in hyps.items():
      (where / f"{lang}.hyp").write_text("".join(l + "\n" for l in lines),
                                         encoding="utf-8")
    if hyp_dir == "metadata":
      metadata["hypotheses_dir"] = str(where)
  result = results.EvalResult(model=name, kind=kind, metadata=metadata,
                              languages=langs)
  path = json_dir / f"{file_name}.json"
  results.write_eval_json(result, path)
  return path, results.read_eval_json(path, kind=kind)


def _write(tmp_path, out, models, baselines, **kwargs):
  return report.write_report(
      tmp_path / out, models=[r for _, r in models],
      baselines=[r for _, r in baselines],
      model_paths=[p for p, _ in models],
      baseline_paths=[p for p, _ in baselines],
      bootstrap_samples=kwargs.pop("bootstrap_samples", SAMPLES), **kwargs)


def _strict_load(path):
  def reject(constant):
    raise ValueError(f"non-strict JSON constant {constant}")
  return json.loads(path.read_text(encoding="utf-8"), parse_constant=reject)


def test_examples_table_per_language(tmp_path):
  corpus = _write_corpus(tmp_path / "corpus", {"de": DE_TEST})
  moe = _eval_json(tmp_path, "moe", {"de": [
      "Open file", "Save all | close", "Print <b>page</b>"]}, corpus=corpus)
  # Hypotheses next to the eval JSON (older JSONs without the metadata).
  dense = _eval_json(tmp_path, "dense", {"de": ["Open", "Save", "Print"]},
                     corpus=corpus, hyp_dir="fallback")
  nohyp = _eval_json(tmp_path, "nohyp", {"de": ["a", "b", "c"]},
                     corpus=corpus, hyp_dir=None)
  base = _eval_json(tmp_path, "bi-de", {"de": ["File", "All", "Page"]},
                    corpus=corpus, kind="bilingual")
  files = _write(tmp_path, "out", [moe, dense, nohyp], [base],
                 corpus_dir=corpus, examples=2)
  md = files.markdown.read_text(encoding="utf-8")
  assert ("| # | source | reference | moe | dense | nohyp | "
          "bilingual baselines |") in md
  assert ("| 1 | Datei öffnen | Open the file | Open file | Open | – | "
          "File |") in md
  assert ("| 2 | Alle speichern \\| schließen | Save all \\| close | "
          "Save all \\| close | Save | – | All |") in md
  assert "| 3 |" not in md  # --examples=2
  assert "- nohyp: no metadata.hypotheses_dir" in md
  html = files.html.read_text(encoding="utf-8")
  assert "<td>Alle speichern | schließen</td>" in html
  summary = _strict_load(files.summary)
  assert summary["examples"]["de"][0] == {
      "source": "Datei öffnen", "reference": "Open the file",
      "hypotheses": {"moe": "Open file", "dense": "Open", "nohyp": None,
                     "bilingual baselines": "File"}}
  assert len(summary["examples"]["de"]) == 2
  assert summary["hypotheses"]["dense"]["languages"] == ["de"]
  # All three sentences with escaping, and no examples with --examples=0.
  files = _write(tmp_path, "all", [moe], [base], corpus_dir=corpus,
                 examples=3, bootstrap_samples=0)
  html = files.html.read_text(encoding="utf-8")
  assert "<td>Print &lt;b&gt;page&lt;/b&gt;</td>" in html
  assert "<b>page" not in html
  assert _strict_load(files.summary)["intervals"] is None
  files = _write(tmp_path, "none", [moe], [base], corpus_dir=corpus,
                 examples=0)
  assert "## Examples" not in files.markdown.read_text(encoding="utf-8")
  assert _strict_load(files.summary)["examples"] == {}


def test_hypotheses_that_do_not_match_the_eval_are_listed(tmp_path):
  corpus = _write_corpus(tmp_path / "corpus", {"de": DE_TEST})
  moe = _eval_json(tmp_path, "moe", {"de": ["Open file", "Save", "Print"]},
                   corpus=corpus)
  hyp_dir = moe[1].metadata["hypotheses_dir"]
  (tmp_path / "hyps" / "moe" / "de.hyp").write_text("Open file\nSave\n")
  changed = _eval_json(tmp_path, "changed", {"de": ["Open", "Save", "x"]},
                       corpus=corpus)
  (tmp_path / "hyps" / "changed" / "de.hyp").write_text(
      "Open the file\nSave all | close\nPrint <b>page</b>\n")
  files = _write(tmp_path, "out", [moe, changed], [], corpus_dir=corpus)
  md = files.markdown.read_text(encoding="utf-8")
  assert (f"- moe, de: {hyp_dir}/de.hyp has 2 lines but the eval JSON "
          "scored 3 segments") in md
  assert "- changed, de: rescoring" in md
  assert "the corpus or the hypotheses changed since m4moe-eval" in md
  assert "No run has usable hypotheses." in md
  assert "- moe: no usable hypotheses on de (see Examples)" in md


def _reliance_log(model_dir, records):
  model_dir.mkdir(parents=True)
  (model_dir / "metrics.jsonl").write_text(
      "\n".join(json.dumps(r) for r in records) + "\n")
  return {"model_dir": str(model_dir)}


def test_source_reliance_section(tmp_path):
  corpus = _write_corpus(tmp_path / "corpus", {"de": DE_TEST,
                                               "fr": DE_TEST})
  moe_meta = _reliance_log(tmp_path / "moe", [
      {"kind": "eval", "step": 10, "dev_ce": {"de": 5.0, "fr": 5.0},
       "source_reliance": {"de": 0.1, "fr": 0.2}},
      {"kind": "train", "step": 20, "train_ce": 1.0},
      {"kind": "eval", "step": 20, "dev_ce": {"de": 4.0, "fr": 4.5},
       "source_reliance": {"de": 2.5}}])
  old_meta = _reliance_log(tmp_path / "old", [
      {"kind": "eval", "step": 20, "dev_ce": {"de": 4.0, "fr": 4.5}}])
  base_meta = _reliance_log(tmp_path / "bi-de", [
      {"kind": "eval", "step": 5, "dev_ce": {"de": 4.2},
       "source_reliance": {"de": 0.05}}])
  hyps = {"de": ["a", "b", "c"], "fr": ["a", "b", "c"]}
  moe = _eval_json(tmp_path, "moe", hyps, corpus=corpus, metadata=moe_meta)
  old = _eval_json(tmp_path, "old", hyps, corpus=corpus, metadata=old_meta)
  base = _eval_json(tmp_path, "bi-de", {"de": ["a", "b", "c"]},
                    corpus=corpus, kind="bilingual", metadata=base_meta)
  files = _write(tmp_path, "out", [moe, old], [base], corpus_dir=corpus,
                 bootstrap_samples=0)
  md = files.markdown.read_text(encoding="utf-8")
  section = md[md.index("## Source reliance"):]
  assert "one that ignores its input" in section
  assert "| language | bucket | baseline | moe | old |" in section
  assert "| de | high | 0.05 | 2.50 | – |" in section
  assert "| fr | high | – | – | – |" in section  # not in the last eval
  assert ("- old: " + str(tmp_path / "old" / "metrics.jsonl")
          + ": its last dev evaluation has no source_reliance") in section
  summary = _strict_load(files.summary)["source_reliance"]
  assert summary["models"] == {"moe": {"de": 2.5, "fr": None},
                               "old": {"de": None, "fr": None}}
  assert summary["bilingual baselines"] == {"de": 0.05, "fr": None}
  assert summary["steps"] == {"moe": 20, "bi-de": 5}
  # The reader: the same evaluation as final_dev_ce.
  records = metrics_log.read_metrics(tmp_path / "moe" / "metrics.jsonl")
  reliance = training_logs.final_source_reliance(records)
  assert (reliance.step, reliance.values, reliance.logged) == (
      20, {"de": 2.5}, True)


def _noisy_system(n, *, quality, seed):
  """n references and hypotheses keeping about ``quality`` of the words."""
  rng = np.random.default_rng(seed)
  words = "open save close file folder window page text font size".split()
  refs, hyps = [], []
  for _ in range(n):
    ref = list(rng.choice(words, size=6))
    hyp = [w if rng.random() < quality else "zz" for w in ref]
    refs.append(" ".join(ref))
    hyps.append(" ".join(hyp))
  return hyps, refs


def test_bootstrap_interval_contains_score_and_shrinks_with_more_sentences():
  hyps, refs = _noisy_system(40, quality=0.7, seed=0)
  one = significance.interval(significance.resample(
      hyps, refs, metric="bleu", target_lang="en", n_samples=SAMPLES))
  four = significance.interval(significance.resample(
      hyps * 4, refs * 4, metric="bleu", target_lang="en",
      n_samples=SAMPLES))
  assert one.score == pytest.approx(four.score)
  for iv in (one, four):
    assert iv.low <= iv.score <= iv.high and iv.ci > 0
  # Four times the sentences: about half the width.
  assert 0.3 * one.ci < four.ci < 0.7 * one.ci
  chrf = significance.interval(significance.resample(
      hyps, refs, metric="chrf", target_lang="en", n_samples=SAMPLES))
  assert chrf.low <= chrf.score <= chrf.high


def test_paired_test_matches_sacrebleu_and_separates_systems():
  hyps_a, refs = _noisy_system(60, quality=0.5, seed=1)
  hyps_b, _ = _noisy_system(60, quality=0.5, seed=1)
  better = [r if i % 4 else h for i, (h, r) in enumerate(zip(hyps_a, refs))]
  def rs(hyps):
    return significance.resample(hyps, refs, metric="bleu",
                                 target_lang="en", n_samples=SAMPLES,
                                 seed=99)
  a, same, good = rs(hyps_a), rs(hyps_b), rs(better)
  assert hyps_a == hyps_b
  identical = significance.paired_difference(same, a)
  assert identical.p_value == 1.0 and not identical.significant
  assert identical.interval.score == 0.0
  much_better = significance.paired_difference(good, a)
  assert much_better.significant and much_better.p_value < 0.01
  assert much_better.interval.low > 0
  # Same numbers as sacrebleu's own paired bootstrap test.
  with significance.sacrebleu_seed(99):
    _, scores = PairedTest([("a", hyps_a), ("good", better)],
                           {"BLEU": BLEU()}, [refs], test_type="bs",
                           n_samples=SAMPLES)()
  base, system = scores["BLEU"]
  assert significance.interval(a).ci == pytest.approx(base.ci)
  assert significance.interval(good).mean == pytest.approx(system.mean)
  assert significance.interval(good).ci == pytest.approx(system.ci)
  assert much_better.p_value == pytest.approx(system.p_value)


def test_seed_spread_on_hand_made_numbers():
  s = seeds.spread([10.0, 12.0, 14.0])
  assert (s.mean, s.min, s.max, s.std) == (12.0, 10.0, 14.0, 2.0)
  half = 4.302652729911275 * 2.0 / math.sqrt(3)  # t(0.975, 2)
  assert (s.t_low, s.t_high) == (pytest.approx(12 - half),
                                 pytest.approx(12 + half))
  one = seeds.spread([5.0])
  assert one.std is None and one.t_low is None and one.mean == 5.0
  with pytest.raises(ValueError):
    seeds.spread([])


def test_welch_difference_on_hand_made_numbers_and_against_scipy():
  # A = 1, 2, 3 (var 1), B = 0, 0, 0: se^2 = 1/3, df = 2, t = 2 / sqrt(1/3).
  d = seeds.welch_difference(seeds.spread([1.0, 2.0, 3.0]),
                             seeds.spread([0.0, 0.0, 0.0]))
  assert d.mean == 2.0 and d.df == pytest.approx(2.0)
  half = 4.302652729911275 / math.sqrt(3)  # t(0.975, 2) * se
  assert (d.t_low, d.t_high) == (pytest.approx(2 - half),
                                 pytest.approx(2 + half))
  assert d.p_value == pytest.approx(0.07417990022744847)
  assert not d.significant
  # Unequal variances and sizes: scipy's Welch test and interval.
  a, b = [22.77, 22.26, 22.47, 22.9], [23.08, 22.73, 22.88]
  d = seeds.welch_difference(seeds.spread(a), seeds.spread(b))
  ref = scipy_stats.ttest_ind(a, b, equal_var=False)
  ci = ref.confidence_interval(0.95)
  assert d.mean == pytest.approx(np.mean(a) - np.mean(b))
  assert d.p_value == pytest.approx(ref.pvalue)
  assert d.df == pytest.approx(ref.df)
  assert (d.t_low, d.t_high) == (pytest.approx(ci.low), pytest.approx(ci.high))
  # Far apart with little noise: significant; identical constants: p = 1.
  assert seeds.welch_difference(seeds.spread([10.0, 10.1, 9.9]),
                                seeds.spread([5.0, 5.1, 4.9])).significant
  same = seeds.welch_difference(seeds.spread([3.0, 3.0]),
                                seeds.spread([3.0, 3.0]))
  assert same.p_value == 1.0 and same.t_low == same.t_high == 0.0
  with pytest.raises(ValueError, match=">= 2 seeds per model"):
    seeds.welch_difference(seeds.spread([1.0]), seeds.spread([1.0, 2.0]))
  with pytest.raises(ValueError, match="alpha=1.5"):
    seeds.welch_difference(seeds.spread([1.0, 2.0]),
                           seeds.spread([1.0, 2.0]), alpha=1.5)


def test_model_pairs_are_compared_over_seeds_as_well(tmp_path):
  hyps_ok, refs = _noisy_system(30, quality=0.6, seed=3)
  src = [f"x{i}" for i in range(30)]
  corpus = _write_corpus(tmp_path / "corpus", {"de": list(zip(refs, src)),
                                               "fr": list(zip(refs, src))})
  runs = {"moe": [], "dense": []}
  for model, qualities in [("moe", (0.8, 0.85, 0.9)),
                           ("dense", (0.5, 0.55, 0.6))]:
    for seed, quality in enumerate(qualities, start=1):
      hyps, _ = _noisy_system(30, quality=quality, seed=10 + seed)
      runs[model].append(_eval_json(
          tmp_path, model, {"de": hyps, "fr": hyps[::-1]}, corpus=corpus,
          metadata={"seed": seed, "num_experts": 8 if model == "moe" else 0},
          file_name=f"{model}{seed}"))
  files = _write(tmp_path, "out", [*runs["moe"], *runs["dense"]], [],
                 corpus_dir=corpus)
  iv = _strict_load(files.summary)["intervals"]
  per_seed = {m: {l: [r.languages[l].bleu for _, r in runs[m]]
                  for l in ("de", "fr")} for m in runs}
  want = seeds.welch_difference(seeds.spread(per_seed["moe"]["de"]),
                                seeds.spread(per_seed["dense"]["de"]))
  got = iv["pair_seed_deltas"]["de"]["bleu"]["moe − dense"]
  assert got["mean"] == pytest.approx(want.mean)
  assert got["p_value"] == pytest.approx(want.p_value)
  assert got["t_low"] == pytest.approx(want.t_low)
  # The bucket: Welch over each seed's mean of its languages.
  bucket_means = {m: [np.mean(v) for v in zip(per_seed[m]["de"],
                                              per_seed[m]["fr"])]
                  for m in runs}
  want = seeds.welch_difference(seeds.spread(bucket_means["moe"]),
                                seeds.spread(bucket_means["dense"]))
  got = iv["bucket_pair_seeds"]["all"]["bleu"]["moe − dense"]
  assert got["mean"] == pytest.approx(want.mean)
  assert got["t_high"] == pytest.approx(want.t_high)
  md = files.markdown.read_text(encoding="utf-8")
  assert "| language | difference | ΔBLEU | ΔBLEU seeds | ΔchrF++ |" in md
  mean = iv["bucket_pair_seeds"]["all"]["bleu"]["moe − dense"]["mean"]
  assert f"| all (mean) | moe − dense | " in md and f"{mean:+.1f}, t " in md


def test_report_aggregates_seeds_with_intervals_and_pairs(tmp_path):
  hyps_ok, refs = _noisy_system(30, quality=0.6, seed=3)
  src = [f"x{i}" for i in range(30)]
  corpus = _write_corpus(tmp_path / "corpus",
                         {"de": list(zip(refs, src)),
                          "fr": list(zip(refs, src))})
  moe_runs = []
  for seed, quality in [(1, 0.8), (2, 0.85), (3, 0.9)]:
    hyps, _ = _noisy_system(30, quality=quality, seed=3)
    hyps = [r if i % 3 == 0 else h for i, (h, r) in
            enumerate(zip(hyps, refs))]
    moe_runs.append(_eval_json(
        tmp_path, "moe", {"de": hyps, "fr": hyps}, corpus=corpus,
        metadata={"seed": seed, "num_experts": 8}, file_name=f"moe{seed}"))
  dense = _eval_json(tmp_path, "dense", {"de": hyps_ok, "fr": hyps_ok},
                     corpus=corpus, metadata={"num_experts": 0})
  bases = [_eval_json(tmp_path, f"bi-{l}", {l: hyps_ok}, corpus=corpus,
                      kind="bilingual") for l in ("de", "fr")]
  files = _write(tmp_path, "out", [*moe_runs, dense], bases,
                 corpus_dir=corpus)
  summary = _strict_load(files.summary)
  assert summary["num_seeds"] == {"moe": 3, "dense": 1}
  assert summary["seeds"]["moe"] == [1, 2, 3]
  per_seed = [r.languages["de"].bleu for _, r in moe_runs]
  assert files.comparison.bleu["moe"]["de"] == pytest.approx(
      np.mean(per_seed))
  iv = summary["intervals"]
  cell = iv["languages"]["de"]["bleu"]["moe"]
  assert cell["seeds"]["num_seeds"] == 3
  assert cell["seeds"]["values"] == pytest.approx(per_seed)
  assert cell["seeds"]["min"] == pytest.approx(min(per_seed))
  assert cell["interval"]["score"] == pytest.approx(np.mean(per_seed))
  assert cell["interval"]["low"] <= cell["interval"]["score"] <= (
      cell["interval"]["high"])
  assert cell["delta"]["significant"] is True
  base_de = bases[0][1].languages["de"].bleu
  assert cell["delta_seeds"]["values"] == pytest.approx(
      [v - base_de for v in per_seed])
  # dense = the baselines' outputs: no difference.
  dense_cell = iv["languages"]["de"]["bleu"]["dense"]
  assert dense_cell["delta"]["score"] == 0.0
  assert dense_cell["delta"]["significant"] is False
  assert dense_cell["seeds"] is None
  # MoE − dense, per language and per bucket; bucket mean of two languages.
  assert iv["pairs"] == ["moe − dense"]
  assert iv["pair_deltas"]["fr"]["chrf"]["moe − dense"]["significant"]
  # One dense run: no comparison over seeds.
  assert iv["pair_seed_deltas"]["fr"]["chrf"]["moe − dense"] is None
  bucket = iv["buckets"]["moe"]["all"]["bleu"]
  assert bucket["interval"]["score"] == pytest.approx(np.mean(per_seed))
  assert bucket["seeds"]["num_seeds"] == 3
  assert iv["bucket_languages"]["all"] == ["de", "fr"]
  md = files.markdown.read_text(encoding="utf-8")
  assert "moe BLEU (mean of 3 seeds)" in md
  assert "## Confidence intervals and significance" in md
  assert "| de | moe − dense |" in md
  assert "| all (mean) | moe − dense |" in md
  assert "| moe | all | 2 |" in md and "### Buckets" in md
  # Examples show the first seed's outputs.
  assert summary["examples"]["de"][0]["hypotheses"]["moe (seed 1)"] == (
      refs[0])
  # The same seed twice is an error naming the files.
  with pytest.raises(ValueError, match="moe has two eval JSONs with the "
                     "same seed"):
    _write(tmp_path, "dup", [moe_runs[0], moe_runs[0]], bases,
           corpus_dir=corpus)


def test_summary_is_strict_json(tmp_path):
  corpus = _write_corpus(tmp_path / "corpus", {"de": DE_TEST})
  meta = _reliance_log(tmp_path / "moe", [])
  # A log with a NaN (Python's json writes and reads it by default).
  (tmp_path / "moe" / "metrics.jsonl").write_text(
      '{"kind": "eval", "step": 1, "dev_ce": {"de": 3.0}, '
      '"source_reliance": {"de": NaN}}\n')
  moe = _eval_json(tmp_path, "moe", {"de": ["a", "b", "c"]}, corpus=corpus,
                   metadata=meta)
  files = _write(tmp_path, "out", [moe], [], corpus_dir=corpus)
  summary = _strict_load(files.summary)
  assert summary["source_reliance"]["models"]["moe"]["de"] is None
  assert report.strict_json({"a": [float("nan"), np.float32(1.5),
                                   float("inf")]}) == {"a": [None, 1.5,
                                                             None]}


def test_cli_flags(tmp_path):
  import subprocess  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  corpus = _write_corpus(tmp_path / "corpus", {"de": DE_TEST})
  moe, _ = _eval_json(tmp_path, "moe", {"de": ["Open file", "Save", "x"]},
                      corpus=corpus, hyp_dir=None)
  (tmp_path / "elsewhere").mkdir()
  (tmp_path / "elsewhere" / "de.hyp").write_text("Open file\nSave\nx\n")
  base, _ = _eval_json(tmp_path, "bi-de", {"de": ["File", "All", "Page"]},
                       corpus=corpus, kind="bilingual")
  def run(*flags, out="out"):
    return subprocess.run(
        [sys.executable, "-m", "m4moe.cli.report", f"--models={moe}",
         f"--baselines={base}", f"--output_dir={tmp_path / out}",
         f"--corpus_dir={corpus}", *flags], capture_output=True, text=True,
        check=False)
  done = run("--examples=1", "--bootstrap_samples=50",
             f"--hypotheses_dirs=moe={tmp_path / 'elsewhere'}")
  assert done.returncode == 0, done.stderr
  summary = _strict_load(tmp_path / "out" / "summary.json")
  assert summary["examples"]["de"] == [{
      "source": "Datei öffnen", "reference": "Open the file",
      "hypotheses": {"moe": "Open file", "bilingual baselines": "File"}}]
  assert summary["intervals"]["n_samples"] == 50
  bad = run("--hypotheses_dirs=nobody=/tmp", out="refused")
  assert bad.returncode != 0
  assert "--hypotheses_dirs names unknown runs: ['nobody']" in bad.stderr
  # Refused input is found before the output directory is made.
  assert not (tmp_path / "refused").exists()
  bad = run("--training_logs=moe=a.jsonl,moe=b.jsonl", out="refused")
  assert "gives 2 log(s) for model moe, which has 1 run(s)" in bad.stderr
  assert not (tmp_path / "refused").exists()


def test_out_of_domain_report_reads_test_ood_and_refuses_mixed_splits(
    tmp_path):
  hyps_ok, refs = _noisy_system(30, quality=0.6, seed=5)
  src = [f"x{i}" for i in range(30)]
  # The in-domain test holds other sentences: examples and the rescoring
  # check must read test_ood, or every run would be unusable.
  corpus = _write_corpus(tmp_path / "corpus",
                         {"de": [("other", "andere")] * 30})
  _write_corpus(corpus, {"de": list(zip(refs, src))}, split="test_ood")
  runs = []
  for seed, quality in [(1, 0.8), (2, 0.85), (3, 0.9)]:
    hyps, _ = _noisy_system(30, quality=quality, seed=5)
    runs.append(_eval_json(tmp_path, "moe", {"de": hyps}, corpus=corpus,
                           metadata={"seed": seed, "num_experts": 8},
                           file_name=f"moe{seed}", split="test_ood"))
  base = _eval_json(tmp_path, "bi-de", {"de": hyps_ok}, corpus=corpus,
                    kind="bilingual", split="test_ood")
  files = _write(tmp_path, "ood", runs, [base], corpus_dir=corpus)
  summary = _strict_load(files.summary)
  assert summary["split"] == "test_ood"
  assert summary["hypotheses"]["moe (seed 1)"]["problems"] == {}
  assert summary["examples"]["de"][0]["reference"] == refs[0]
  cell = summary["intervals"]["languages"]["de"]["bleu"]["moe"]
  assert cell["seeds"]["num_seeds"] == 3
  assert cell["delta"]["significant"] in (True, False)
  assert "Scored split: test_ood (out-of-domain" in (
      files.markdown.read_text(encoding="utf-8"))
  # An in-domain baseline next to out-of-domain models is refused.
  _write_corpus(corpus, {"de": list(zip(refs, src))})
  in_domain = _eval_json(tmp_path, "bi-de", {"de": hyps_ok}, corpus=corpus,
                         kind="bilingual", file_name="bi-de-test")
  with pytest.raises(ValueError, match=r"different splits \(bi-de: test, "
                     r"moe: test_ood\)"):
    _write(tmp_path, "mixed", runs, [in_domain], corpus_dir=corpus)


def _seed_log(model_dir, *, seed, dev_ce, cpu):
  """A run's metrics.jsonl: two train records and a dev evaluation."""
  model_dir.mkdir(parents=True)
  records = [
      {"kind": "train", "step": 10, "train_ce": 5.0, "tokens_seen": 100,
       "time": 0.0, "step_cpu_sec": cpu},
      {"kind": "train", "step": 20, "train_ce": 3.0, "tokens_seen": 200,
       "time": 10.0, "step_cpu_sec": cpu},
      {"kind": "eval", "step": 20, "dev_ce": dev_ce}]
  (model_dir / "metrics.jsonl").write_text(
      "\n".join(json.dumps(r) for r in records) + "\n")
  return {"model_dir": str(model_dir), "seed": seed, "num_experts": 8}


def _seeded_inputs(tmp_path):
  corpus = _write_corpus(tmp_path / "corpus", {"de": DE_TEST,
                                               "fr": DE_TEST})
  hyps = {"de": ["a", "b", "c"], "fr": ["a", "b", "c"]}
  # Seed 2 has no fr dev CE: the seed mean keeps only de.
  seeds_ce = {1: ({"de": 4.0, "fr": 5.0}, 0.5), 2: ({"de": 3.0}, 0.7)}
  moe = [_eval_json(tmp_path, "moe", hyps, corpus=corpus,
                    file_name=f"moe{seed}",
                    metadata=_seed_log(tmp_path / f"moe{seed}", seed=seed,
                                       dev_ce=ce, cpu=cpu))
         for seed, (ce, cpu) in seeds_ce.items()]
  base_meta = _reliance_log(tmp_path / "bi-de", [
      {"kind": "eval", "step": 5, "dev_ce": {"de": 4.5}}])
  base = _eval_json(tmp_path, "bi-de", {"de": ["a", "b", "c"]},
                    corpus=corpus, kind="bilingual", metadata=base_meta)
  return corpus, moe, base


def test_seeds_dev_ce_is_their_mean_and_cost_has_a_row_per_seed(tmp_path):
  corpus, moe, base = _seeded_inputs(tmp_path)
  files = _write(tmp_path, "out", moe, [base], corpus_dir=corpus,
                 bootstrap_samples=0)
  dev = _strict_load(files.summary)["dev_ce"]["models"]["moe"]
  assert dev["ce"] == {"de": pytest.approx(3.5), "fr": None}
  assert dev["delta"]["de"] == pytest.approx(1.0)  # 4.5 - mean(4.0, 3.0)
  md = files.markdown.read_text(encoding="utf-8")
  cost = md[md.index("## Training cost"):]
  assert "| moe (seed 1) | – | 1 | 0.5 |" in cost
  assert "| moe (seed 2) | – | 1 | 0.7 |" in cost
  stopping = md[md.index("## How each model"):md.index("## Training cost")]
  assert stopping.count("| moe (seed ") == 2 and "| bi-de | de |" in stopping


def test_explicit_logs_are_one_per_seed(tmp_path):
  corpus, moe, base = _seeded_inputs(tmp_path)
  first = str(tmp_path / "moe1" / "metrics.jsonl")
  second = str(tmp_path / "moe2" / "metrics.jsonl")
  with pytest.raises(ValueError, match="1 log.*moe, which has 2 run"):
    _write(tmp_path, "a", moe, [base], corpus_dir=corpus,
           bootstrap_samples=0, training_log_paths={"moe": first})
  # Given in reverse order, seed 1's row reads seed 2's log.
  files = _write(tmp_path, "b", moe, [base], corpus_dir=corpus,
                 bootstrap_samples=0,
                 training_log_paths={"moe": [second, first]})
  md = files.markdown.read_text(encoding="utf-8")
  assert "| moe (seed 1) | – | 1 | 0.7 |" in md


def test_hypotheses_beside_a_landed_eval_json_are_found(tmp_path):
  from m4moe.eval import examples  # pylint: disable=g-import-not-at-top
  corpus = _write_corpus(tmp_path / "corpus", {"de": DE_TEST})
  path, result = _eval_json(tmp_path, "moe", {"de": ["a", "b", "c"]},
                            corpus=corpus, file_name="moe_s1")
  # Landed results keep eval/<run>.json beside eval/<run>/, while the
  # recorded metadata.hypotheses_dir names the machine that decoded them.
  landed = path.parent / "moe_s1"
  (tmp_path / "hyps" / "moe_s1").rename(landed)
  run = examples.load_run_outputs(result, label="moe", eval_path=path,
                                  corpus_dir=corpus)
  assert run.hypotheses_dir == landed and set(run.languages) == {"de"}
  landed.rename(tmp_path / "elsewhere")
  found, why = examples.find_hypotheses_dir(result, eval_path=path)
  assert found is None
  assert f"metadata.hypotheses_dir {tmp_path / 'hyps' / 'moe_s1'} does " \
         "not exist" in why
  assert f"no {landed}/ or {path.parent / 'moe'}/" in why
