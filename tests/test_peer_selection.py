"""Dev-only recipe selection for the peer yardstick (select.py, selection.py).

No training runs here: the training and decoding subprocesses are replaced
by fakes that write what the real ones write, so the tests check the data
plumbing (which files the selection opens), the skip-on-rerun bookkeeping,
the dev-only ranking and the final report's statistics against sacrebleu.
"""

import hashlib
import json
import math
import os
import pathlib
import signal
import subprocess
import sys
import threading
import time

import pytest
import sacrebleu

from m4moe.benchmarks.peer import final
from m4moe.benchmarks.peer import select
from m4moe.benchmarks.peer import selection
from m4moe.benchmarks.peer import systems
from m4moe.benchmarks.peer import toolkit
from m4moe.data import fixtures
from m4moe.data import split as split_lib
from m4moe.data import vocab as vocab_lib

ROOT = pathlib.Path(__file__).resolve().parent.parent

# Paths opened while _OPENED is recording (an audit hook cannot be removed,
# so one hook records into this list only between start and stop).
_OPENED: list[str] = []
_RECORDING = [False]


def _audit(event, args, recording=_RECORDING, opened=_OPENED,
           path_types=(str, bytes, pathlib.Path)):
  # Bound as defaults: the hook outlives the module's globals, which the
  # interpreter clears at exit while opening files still calls it.
  if recording[0] and event == "open" and args and isinstance(
      args[0], path_types):
    opened.append(str(args[0]))


sys.addaudithook(_audit)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
  """A built corpus with de (train 400) and fr (train 150), and a vocab."""
  root = tmp_path_factory.mktemp("select")
  fixtures.write_corpus(root / "corpus", sizes={"de": 400, "fr": 150},
                        dev=6, test=9)
  (root / "corpus" / "test_ood").mkdir()
  (root / "corpus" / "test_ood" / "de.tsv").write_text(
      "Print the page\tPrint the page (de)\n", encoding="utf-8")
  config = vocab_lib.VocabConfig(source_vocab_size=400, target_vocab_size=300,
                                 max_sentences=2000)
  vocab_lib.train_vocabularies(root / "corpus", root / "vocab", config=config)
  return root


def _englishes(path):
  return [l.split("\t", 1)[0] for l in path.read_text(
      encoding="utf-8").splitlines() if l.strip()]


def _expected_carve(english, permille):
  """The documented rule, computed independently of selection.carved."""
  key = split_lib.group_id(english)
  digest = hashlib.sha256(
      ("m4moe-peer-selection-dev:" + key).encode("utf-8")).hexdigest()
  return int(digest[:8], 16) % 1000 < permille


def test_carve_is_the_documented_hash_rule_disjoint_and_deterministic(
    corpus, tmp_path):
  src = corpus / "corpus"
  m1 = selection.write_selection_corpus(corpus_dir=src, output_dir=tmp_path /
                                        "a", language="de", permille=200)
  m2 = selection.write_selection_corpus(corpus_dir=src, output_dir=tmp_path /
                                        "b", language="de", permille=200)
  assert m1 == m2
  for name in ("train/de.tsv", "train/fr.tsv", "dev/de.tsv"):
    assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" /
                                                   name).read_bytes()
  train_de = _englishes(src / "train" / "de.tsv")
  carve = [e for e in train_de if _expected_carve(e, 200)]
  assert 0 < len(carve) < len(train_de)  # about a fifth
  dev = _englishes(tmp_path / "a" / "dev" / "de.tsv")
  assert dev == _englishes(src / "dev" / "de.tsv") + carve
  assert m1["dev"] == {"from_dev_split": 6, "from_train_carve": len(carve),
                       "sentences": 6 + len(carve)}
  dev_groups = {split_lib.group_id(e) for e in dev}
  test_groups = {split_lib.group_id(e)
                 for e in _englishes(src / "test" / "de.tsv")}
  for lang in ("de", "fr"):  # the carve leaves every language's train
    kept = _englishes(tmp_path / "a" / "train" / f"{lang}.tsv")
    assert kept == [e for e in _englishes(src / "train" / f"{lang}.tsv")
                    if not _expected_carve(e, 200)]
    assert not {split_lib.group_id(e) for e in kept} & dev_groups
  assert not dev_groups & test_groups
  assert sorted(p.name for p in (tmp_path / "a").iterdir()) == ["dev",
                                                                "train"]
  assert m1["sha256"]["dev/de.tsv"] == hashlib.sha256(
      (tmp_path / "a" / "dev" / "de.tsv").read_bytes()).hexdigest()


def test_carve_rejects_bad_permille_and_missing_language(corpus, tmp_path):
  with pytest.raises(ValueError, match="--carve_permille=0"):
    selection.write_selection_corpus(corpus_dir=corpus / "corpus",
                                     output_dir=tmp_path, language="de",
                                     permille=0)
  with pytest.raises(ValueError, match="lacks train/xx.tsv"):
    selection.write_selection_corpus(corpus_dir=corpus / "corpus",
                                     output_dir=tmp_path, language="xx",
                                     permille=10)


def test_final_corpus_skips_the_read_test_lines(corpus, tmp_path):
  selection.write_selection_corpus(corpus_dir=corpus / "corpus",
                                   output_dir=tmp_path / "sel", language="de",
                                   permille=200)
  counts = selection.write_final_corpus(
      selection_dir=tmp_path / "sel", corpus_dir=corpus / "corpus",
      output_dir=tmp_path / "fin", language="de", test_skip=4,
      ood_sentences=0)
  test = (corpus / "corpus" / "test" / "de.tsv").read_text(
      encoding="utf-8").splitlines(keepends=True)
  assert (tmp_path / "fin" / "test" / "de.tsv").read_text(
      encoding="utf-8") == "".join(test[4:])
  assert counts["test"]["sentences"] == 5 and counts["test"]["first_line"] == 5
  assert (tmp_path / "fin" / "dev" / "de.tsv").read_bytes() == (
      tmp_path / "sel" / "dev" / "de.tsv").read_bytes()
  with pytest.raises(ValueError, match="no pairs past the first 9"):
    selection.write_final_corpus(
        selection_dir=tmp_path / "sel", corpus_dir=corpus / "corpus",
        output_dir=tmp_path / "fin2", language="de", test_skip=9,
        ood_sentences=0)


def test_candidates_are_unique_valid_and_rates_keep_their_peak():
  names = [c.name for c in selection.CANDIDATES]
  assert len(names) == len(set(names))
  assert set(selection.CENTRES.values()) <= set(names)
  for c in selection.CANDIDATES:
    if c.system != selection.SYSTEM_M4MOE:
      continue
    flags = dict(s.partition("=")[::2] for s in c.settings)
    if "--learning_rate" in flags and "--multiply_by_parameter_scale" not in (
        c.settings):
      warmup = float(flags.get("--warmup_steps", 1000))
      peak = float(flags["--learning_rate"]) / math.sqrt(warmup)
      assert any(abs(peak - p) / p < 1e-3 for p in (5e-4, 1e-3, 2e-3, 4e-3, 8e-3)), c
    if "--warmup_steps" in flags and c.batch_tokens != 4096:
      # The same schedule per training token as the centre.
      assert float(flags["--warmup_steps"]) * c.batch_tokens == 1000 * 4096


def _peak(c):
  """A candidate's peak rate (m4moe: the flag over sqrt(warmup))."""
  if c.system == selection.SYSTEM_PEER:
    return c.peer_settings()["learning_rate"]
  values = dict(f.lstrip("-").split("=", 1)
                for f in (*selection.M4MOE_BASE, *c.settings) if "=" in f)
  return float(values["learning_rate"]) / math.sqrt(
      float(values["warmup_steps"]))


def test_later_rounds_change_one_thing_of_a_same_system_base():
  known = {c.name: c for c in selection.CANDIDATES}
  for c in selection.CANDIDATES:
    base = known[selection.base_of(c.name, c.system)]
    assert base.system == c.system, c
    if c.base is None:
      continue
    if c.base in ("m4moe_peak4e-3", "peer_lr2e-3"):
      # Round 2: the base is a round-1 rate, which the candidate keeps
      # unless the change is parameter scaling (a relative step instead).
      if "--multiply_by_parameter_scale" not in c.settings:
        assert _peak(c) == pytest.approx(_peak(base), rel=1e-5), c
    else:
      # Round 3: the rate again, at its base's batch size and warmup.
      assert c.batch_tokens == base.batch_tokens, c
      assert [f for f in c.settings if "warmup" in f] == [
          f for f in base.settings if "warmup" in f], c
      assert _peak(c) != pytest.approx(_peak(base), rel=1e-3), c
  assert selection.base_of("m4moe_p4_ls0", "m4moe") == "m4moe_peak4e-3"
  assert selection.base_of("not_a_candidate", "opennmt-tf") == "peer_ours"
  p4 = known["m4moe_p4_warmup300"].settings
  assert p4 == ("--learning_rate=0.069282", "--warmup_steps=300")


def test_peer_candidates_map_onto_its_recipe():
  original = selection.candidates_by_name(["peer_original"])[0]
  recipe, model = select._peer_objects(original)  # pylint: disable=protected-access
  # The peer's first recipe is toolkit's default PeerRecipe/PeerModel.
  assert recipe == toolkit.PeerRecipe()
  assert model == toolkit.PeerModel()
  ours = select._peer_objects(  # pylint: disable=protected-access
      selection.candidates_by_name(["peer_ours"])[0])
  assert (ours[0].learning_rate, ours[0].warmup_steps, ours[1].dropout) == (
      1e-3, 1000, 0.0)


@pytest.mark.parametrize("kwargs, match", [
    (dict(system="fairseq"), "system 'fairseq'"),
    (dict(system="m4moe", settings=("learning_rate=1",)), "not an m4moe-train"),
    (dict(system="opennmt-tf", settings=("beta1=0",)), "not field=value"),
    (dict(system="opennmt-tf", batch_tokens=8), "batch_tokens=8"),
])
def test_candidate_validation(kwargs, match):
  with pytest.raises(ValueError, match=match):
    selection.Candidate(name="x", why="x", **kwargs)


def test_unknown_candidate_is_named():
  with pytest.raises(ValueError, match="unknown or repeated.*nope"):
    selection.candidates_by_name(["m4moe_zoo", "nope"])


def test_budget_counts_steps_in_reference_batches():
  assert systems.Budget(steps=1000).steps_for(2048) == 2000
  assert systems.Budget(steps=1000).steps_for(8192) == 500
  assert systems.Budget(seconds=600).steps_for(4096) == 0
  for kwargs in ({}, {"seconds": 5, "steps": 5}, {"steps": -1}):
    with pytest.raises(ValueError, match="exactly one of --budget_seconds"):
      systems.Budget(**kwargs)
  files = toolkit.PeerFiles(**{f: pathlib.Path(f) for f in (
      "train_source", "train_target", "dev_source", "dev_target",
      "source_vocab", "target_vocab")})
  config = toolkit.run_config(recipe=toolkit.PeerRecipe(), files=files,
                              model_dir=pathlib.Path("m"), max_step=1234)
  assert config["train"]["max_step"] == 1234


def test_onmt_venv_needs_the_flag_or_the_environment(monkeypatch):
  monkeypatch.delenv(systems.ONMT_VENV_ENV, raising=False)
  with pytest.raises(toolkit.PeerError,
                     match="pass --onmt_venv=DIR or set M4MOE_ONMT_VENV"):
    systems.onmt_venv(None)
  monkeypatch.setenv(systems.ONMT_VENV_ENV, "/some/venv")
  assert systems.onmt_venv(None) == pathlib.Path("/some/venv")
  assert systems.onmt_venv("/other") == pathlib.Path("/other")


class _FakeSubprocesses:
  """Stands in for run_pinned: writes what training and decoding write."""

  def __init__(self):
    self.commands = []

  def __call__(self, command, *, core, log, what):
    self.commands.append(list(command))
    args = dict(a[2:].partition("=")[::2] for a in command if a.startswith("--"))
    if "train" in command:  # the peer's driver
      (pathlib.Path(args["summary"])).write_text(json.dumps(
          {"steps": 7, "train_seconds": 3.0, "steps_per_sec": 2.3,
           "tokens_per_sec": 900.0, "dev_ce": 4.5, "stopped_by": "max_step"}),
          encoding="utf-8")
    elif "infer" in command:
      n = len(pathlib.Path(args["features"]).read_text(
          encoding="utf-8").splitlines())
      # A line separator other than "\n" inside a line stays in its line.
      pathlib.Path(args["predictions"]).write_text("▁Open\u2028▁it\n" * n,
                                                   encoding="utf-8")
      pathlib.Path(args["summary"]).write_text(json.dumps(
          {"sentences": n, "seconds": 2.0}), encoding="utf-8")


def _fake_m4moe(calls):
  def train(*, data, root, config, flags, batch_tokens, budget, seed, core):
    calls.append(("train", data, flags, budget))
    return {"steps": 11, "tokens_per_sec": 1000.0, "steps_per_sec": 2.0,
            "train_seconds": 5.0, "stopped_by": "max_step", "dev_ce": 3.5}

  def decode(*, data, root, split, name, core, max_sentences=0):
    calls.append(("decode", data, split))
    return systems.Decoded(split=split, hypotheses=["a"], sentences=40,
                           seconds=2.0, eval_path=root / "e.json", bleu=12.5,
                           chrf=30.0)
  return train, decode


def _select_once(corpus, run_dir, monkeypatch, calls, fake, names):
  monkeypatch.setattr(systems, "run_pinned", fake)
  train, decode = _fake_m4moe(calls)
  monkeypatch.setattr(systems, "train_m4moe", train)
  monkeypatch.setattr(systems, "decode_m4moe", decode)
  manifest = select.prepare_data(corpus_dir=corpus / "corpus",
                                 run_dir=run_dir, language="de", permille=200)
  data = systems.Data(corpus_dir=run_dir / "data" / "selection_corpus",
                      vocab_dir=corpus / "vocab", language="de")
  ran = []
  for candidate in selection.candidates_by_name(names):
    ran.append(select.run_candidate(
        candidate=candidate, seed=0, run_dir=run_dir, data=data,
        manifest=manifest, budget=systems.Budget(steps=5), core="1",
        peer_python=pathlib.Path("/peer/python")))
  return ran


def test_selection_never_opens_a_test_file(corpus, tmp_path, monkeypatch):
  calls, fake = [], _FakeSubprocesses()
  _OPENED.clear()
  _RECORDING[0] = True
  try:
    _select_once(corpus, tmp_path / "run", monkeypatch, calls, fake,
                 ["m4moe_zoo", "peer_ours"])
  finally:
    _RECORDING[0] = False
  source_opens = [p for p in _OPENED if str(corpus / "corpus") in p]
  assert any(p.endswith("train/de.tsv") for p in source_opens)
  assert not [p for p in _OPENED if "/test" in p.replace(str(tmp_path), "")]
  assert all("/test" not in p for p in source_opens)
  selection_corpus = tmp_path / "run" / "data" / "selection_corpus"
  # Our trainer and decoder get the selection corpus and its dev split.
  assert [c[1].corpus_dir for c in calls] == [selection_corpus] * 2
  assert calls[1][2] == "dev"
  # The peer decodes the dev set's sources, in order.
  features = (tmp_path / "run" / "work" / "peer_ours_s0" / "data" /
              "dev.de.src").read_text(encoding="utf-8").splitlines()
  assert len(features) == len(_englishes(selection_corpus / "dev" / "de.tsv"))
  assert all(str(corpus / "corpus") not in " ".join(c)
             for c in fake.commands)


def test_finished_candidates_are_skipped_and_changes_refused(
    corpus, tmp_path, monkeypatch):
  calls, fake = [], _FakeSubprocesses()
  run_dir = tmp_path / "run"
  assert _select_once(corpus, run_dir, monkeypatch, calls, fake,
                      ["m4moe_zoo", "peer_ours"]) == [True, True]
  n_calls, n_commands = len(calls), len(fake.commands)
  assert _select_once(corpus, run_dir, monkeypatch, calls, fake,
                      ["m4moe_zoo", "peer_ours"]) == [False, False]
  assert (len(calls), len(fake.commands)) == (n_calls, n_commands)
  record = json.loads(selection.record_path(run_dir, "peer_ours", 0)
                      .read_text(encoding="utf-8"))
  assert record["selected_on"] == "dev" and record["budget_steps"] == 5
  assert record["train"]["steps"] == 7 and record["dev"]["ce"] == 4.5
  # An interrupted run restarts; its directory is kept aside.
  (run_dir / "work" / "m4moe_p4_batch2048_s0").mkdir(parents=True)
  _select_once(corpus, run_dir, monkeypatch, calls, fake,
               ["m4moe_p4_batch2048"])
  assert (run_dir / "work" / "m4moe_p4_batch2048_s0.abandoned-1").is_dir()
  # Another budget in the same run directory is refused, not mixed in.
  manifest = json.loads((run_dir / "data" / "manifest.json").read_text(
      encoding="utf-8"))
  with pytest.raises(ValueError, match="budget_steps.*new --run_dir"):
    select.run_candidate(
        candidate=selection.candidates_by_name(["m4moe_zoo"])[0], seed=0,
        run_dir=run_dir, data=systems.Data(
            corpus_dir=run_dir / "data" / "selection_corpus",
            vocab_dir=corpus / "vocab", language="de"),
        manifest=manifest, budget=systems.Budget(steps=6), core="1",
        peer_python=None)


def _record(name, system, seed, bleu, ce, **extra):
  return {"candidate": name, "system": system, "seed": seed, "why": name,
          "settings": [], "batch_tokens": 4096, "selected_on": "dev",
          "dev": {"bleu": bleu, "chrf": bleu + 20, "ce": ce,
                  "sentences": 100},
          "train": {"steps": 10, "tokens_per_sec": 1.0},
          "decode_sentences_per_sec": 3.0, **extra}


def test_ranking_reads_dev_scores_only():
  records = [
      _record("m4moe_zoo", "m4moe", 0, 30.0, 2.5, test={"bleu": 1.0}),
      _record("m4moe_zoo", "m4moe", 1, 28.0, 2.6, test={"bleu": 1.0}),
      _record("m4moe_ls0", "m4moe", 0, 29.5, 2.4, test={"bleu": 99.0}),
      _record("m4moe_clip1", "m4moe", 0, 28.5, 2.4),
      _record("peer_ours", "opennmt-tf", 0, 20.0, 3.0),
      _record("peer_original", "opennmt-tf", 0, 20.0, 2.9),
  ]
  ranking = selection.rank(records)
  assert [r.candidate for r in ranking["m4moe"]] == ["m4moe_ls0",
                                                     "m4moe_zoo",
                                                     "m4moe_clip1"]
  assert ranking["m4moe"][1].bleu == (30.0, 28.0)
  assert ranking["m4moe"][1].bleu_mean == 29.0
  # A tie in dev BLEU goes to the lower dev CE.
  assert selection.chosen(ranking, "opennmt-tf").candidate == "peer_original"
  assert selection.chosen(ranking, "m4moe", name="m4moe_zoo").seeds == (0, 1)
  with pytest.raises(ValueError, match="was not scored on dev"):
    selection.rank([{**records[0], "selected_on": "test"}])
  table = selection.table_markdown(
      ranking, manifest={"language": "pt", "dev": {
          "sentences": 100, "from_dev_split": 60, "from_train_carve": 40}},
      budgets=[{"budget_steps": 1000}])
  assert "| 1 | m4moe_ls0 |" in table and "+0.5" in table


def test_read_records_skips_records_not_selected_on_dev(tmp_path):
  (tmp_path / "candidates").mkdir()
  good = _record("m4moe_zoo", "m4moe", 0, 30.0, 2.5)
  bad = {**_record("m4moe_ls0", "m4moe", 0, 99.0, 1.0),
         "selected_on": "test"}
  for i, r in enumerate((good, bad)):
    (tmp_path / "candidates" / f"{i}.json").write_text(json.dumps(r),
                                                       encoding="utf-8")
  assert selection.read_records(tmp_path) == [good]


def test_final_report_schema_and_sacrebleu_scores():
  refs = {"test": ["the file is open", "close the window", "print it now",
                   "save all files"],
          "test_ood": ["a new page", "the old page", "edit the page"]}
  hyp = {"m4moe": {"test": [["the file is open", "close window",
                              "print it now", "save the files"]] * 2,
                    "test_ood": [["a new page", "old page", "edit page"]] * 2},
         "opennmt-tf": {"test": [["file open", "close the window", "print",
                                   "save all"],
                                  ["the file", "close", "print it", "save"]],
                        "test_ood": [["new page", "the page", "page"]] * 2}}
  ranked = selection.rank([
      _record("m4moe_zoo", "m4moe", s, 30.0, 2.5) for s in (0, 1)] + [
      _record("peer_ours", "opennmt-tf", s, 20.0, 3.0) for s in (0, 1)])
  picks = {s: selection.chosen(ranked, s) for s in selection.SYSTEMS}
  runs = {s: [{"seed": seed, "train": {"steps": 10 + seed,
                                       "tokens_per_sec": 100.0, "dev_ce": 2.0},
               "splits": {sp: {"sentences_per_sec": 5.0}
                          for sp in final.SPLITS}} for seed in (0, 1)]
          for s in selection.SYSTEMS}
  out = final.report(picks=picks, runs=runs, hypotheses=hyp, references=refs,
                     splits={"test": {"first_line": 1001}},
                     setup={"language": "pt"}, n_samples=50)
  assert out["selected_on"] == "dev" and out["seeds"] == [0, 1]
  for system, name in (("m4moe", "m4moe_zoo"), ("opennmt-tf", "peer_ours")):
    assert out["recipes"][system]["selected_on"] == "dev"
    assert out["recipes"][system]["candidate"] == name
  peer = out["systems"]["opennmt-tf"]["test"]["bleu"]
  expected = [sacrebleu.corpus_bleu(h, [refs["test"]]).score
              for h in hyp["opennmt-tf"]["test"]]
  assert peer["per_seed"] == [round(e, 2) for e in expected]
  assert peer["seed_spread"]["values"] == pytest.approx(expected)
  mean_m4moe = sacrebleu.corpus_bleu(hyp["m4moe"]["test"][0],
                                     [refs["test"]]).score
  diff = out["m4moe_minus_peer"]["test"]["bleu"]
  assert diff["score"] == pytest.approx(mean_m4moe - sum(expected) / 2)
  assert 0 <= diff["p_value"] <= 1
  chrf = out["systems"]["m4moe"]["test_ood"]["chrf"]["per_seed"][0]
  assert chrf == round(sacrebleu.corpus_chrf(
      hyp["m4moe"]["test_ood"][0], [refs["test_ood"]], word_order=2).score, 2)
  assert out["systems"]["m4moe"]["speed"]["steps"]["values"] == [10, 11]
  with pytest.raises(ValueError, match="different seeds"):
    final.report(picks=picks, runs={**runs, "m4moe": runs["m4moe"][:1]},
                 hypotheses=hyp, references=refs, splits={}, setup={})


@pytest.mark.parametrize("flags, match", [
    (["--mode=select"], "--corpus_dir is required with --mode=select"),
    (["--mode=select", "--corpus_dir=X", "--run_dir=Y",
      "--budget_seconds=5", "--budget_steps=5"], "exactly one of"),
    (["--mode=select", "--corpus_dir=X", "--run_dir=Y",
      "--candidates=m4moe_zoo,zzz"], "unknown or repeated"),
    (["--mode=select", "--corpus_dir=X", "--run_dir=Y", "--seeds=a"],
     "--seeds=a: list integers"),
    (["--mode=final", "--corpus_dir=X", "--run_dir=Y", "--cores=0"],
     "--cores: give two CPU numbers"),
    (["--mode=table", "--run_dir=Y"], "holds no selection: run "
     "--mode=select there first"),
    (["--mode=final", "--corpus_dir=X", "--run_dir=Y", "--seeds=0"],
     "--seeds=0: the final comparison needs at least two seeds"),
])
def test_select_flag_errors_are_usage_errors(tmp_path, flags, match):
  flags = [f.replace("=Y", f"={tmp_path / 'run'}") for f in flags]
  done = subprocess.run(
      [sys.executable, "-m", "m4moe.benchmarks.peer.select", *flags],
      capture_output=True, text=True, cwd=tmp_path, check=False)
  assert done.returncode != 0
  assert match in done.stderr and "Traceback" not in done.stderr
  assert not (tmp_path / "run").exists()


def test_select_without_a_venv_says_how_to_give_one(corpus, tmp_path):
  env = {k: v for k, v in __import__("os").environ.items()
         if k != systems.ONMT_VENV_ENV}
  done = subprocess.run(
      [sys.executable, "-m", "m4moe.benchmarks.peer.select", "--mode=select",
       f"--corpus_dir={corpus / 'corpus'}", f"--run_dir={tmp_path / 'run'}",
       "--language=de", "--candidates=peer_ours"],
      capture_output=True, text=True, cwd=tmp_path, env=env, check=False)
  assert done.returncode != 0
  assert "pass --onmt_venv=DIR or set M4MOE_ONMT_VENV=DIR" in done.stderr
  assert not (tmp_path / "run" / "candidates").exists()


def test_final_refuses_picks_with_one_selection_seed(tmp_path):
  (tmp_path / "run" / "candidates").mkdir(parents=True)
  for r in (_record("m4moe_zoo", "m4moe", 0, 30.0, 2.5),
            _record("m4moe_zoo", "m4moe", 1, 29.0, 2.5),
            _record("peer_ours", "opennmt-tf", 0, 20.0, 3.0)):
    (tmp_path / "run" / "candidates" / f"{r['candidate']}_s{r['seed']}.json"
     ).write_text(json.dumps(r), encoding="utf-8")
  done = subprocess.run(
      [sys.executable, "-m", "m4moe.benchmarks.peer.select", "--mode=final",
       f"--corpus_dir={tmp_path / 'corpus'}", f"--run_dir={tmp_path / 'run'}",
       "--budget_seconds=60", "--seeds=0,1", "--onmt_venv=/nonexistent"],
      capture_output=True, text=True, cwd=tmp_path, check=False)
  assert done.returncode != 0
  assert ("peer_ours (rank 1 of opennmt-tf on dev) has 1 selection seed(s), "
          "fewer than --min_selection_seeds=2") in done.stderr
  assert not (tmp_path / "run" / "final").exists()


def test_table_tests_each_candidate_against_its_centre_on_dev(tmp_path):
  refs = ["the file is open", "close the window", "print it now",
          "save all files", "open a new page"]
  (tmp_path / "data" / "selection_corpus" / "dev").mkdir(parents=True)
  (tmp_path / "data" / "selection_corpus" / "dev" / "pt.tsv").write_text(
      "".join(f"{r}\tx{i}\n" for i, r in enumerate(refs)), encoding="utf-8")
  (tmp_path / "data" / "manifest.json").write_text(json.dumps(
      {"language": "pt", "rule": "r", "dev": {
          "sentences": 5, "from_dev_split": 2, "from_train_carve": 3}}),
      encoding="utf-8")
  hyps = {"m4moe_zoo": ["the file open", "close window", "print it",
                        "save files", "a page"],
          "m4moe_ls0": refs}
  (tmp_path / "candidates").mkdir()
  for name, lines in hyps.items():
    systems.write_hypotheses(systems.hypotheses_path(
        tmp_path / "work" / f"{name}_s0", "dev", "pt"), lines)
    bleu = sacrebleu.corpus_bleu(lines, [refs]).score
    (tmp_path / "candidates" / f"{name}_s0.json").write_text(json.dumps(
        _record(name, "m4moe", 0, bleu, 2.0, budget_steps=5)),
        encoding="utf-8")
  select.write_table(tmp_path, tmp_path / "out")
  out = json.loads((tmp_path / "out" / "selection.json").read_text(
      encoding="utf-8"))
  diff = out["bleu_minus_base"]["m4moe_ls0"]
  assert diff["base"] == "m4moe_zoo"
  assert diff["score"] == pytest.approx(
      100.0 - sacrebleu.corpus_bleu(hyps["m4moe_zoo"], [refs]).score)
  assert list(out["bleu_minus_base"]) == ["m4moe_ls0"]
  table = (tmp_path / "out" / "selection.md").read_text(encoding="utf-8")
  assert "| 1 | m4moe_ls0 |" in table and "(p=" in table


_SLEEPER = ("import os, pathlib, sys, time\n"
            "pathlib.Path(sys.argv[1]).write_text(str(os.getpid()))\n"
            "time.sleep(60)\n")


def test_a_stopped_selection_stops_its_candidate_and_says_so(tmp_path):
  # SIGTERM to the selection reaches the pinned child (which would save and
  # stop) and the run is an error, not a finished candidate; the child is
  # gone, so no orphan trains beside the next candidate.
  pid_file = tmp_path / "child.pid"

  def stop_when_started():
    while not pid_file.exists() or not pid_file.read_text():
      time.sleep(0.05)
    os.kill(os.getpid(), signal.SIGTERM)

  threading.Thread(target=stop_when_started, daemon=True).start()
  with pytest.raises(toolkit.PeerError, match="stopped by signal 15"):
    systems.run_pinned([sys.executable, "-c", _SLEEPER, str(pid_file)],
                       core="0", log=tmp_path / "log" / "train.log",
                       what="training x")
  child = int(pid_file.read_text())
  with pytest.raises(ProcessLookupError):
    os.kill(child, 0)
  assert (tmp_path / "log" / "train.log").read_text().startswith(
      "$ taskset -c 0 ")


def test_a_failing_candidate_names_its_log(tmp_path):
  with pytest.raises(toolkit.PeerError, match=r"training x failed \(exit 3\)"
                     ".*train.log"):
    systems.run_pinned([sys.executable, "-c", "raise SystemExit(3)"],
                       core="0", log=tmp_path / "train.log", what="training x")


def test_m4moe_candidates_start_from_the_rate_the_selection_began_with(
    monkeypatch, tmp_path):
  """A candidate's settings follow the pinned base rate (the flags parser
  keeps the last value), so a candidate means the same after the zoo's
  rate changes: the zoo's centre trains 1e-3 held 1000 steps, and the
  held-300 candidate 4e-3 held 300 steps."""
  seen = {}

  def fake_train(**kwargs):
    seen["flags"] = kwargs["flags"]
    return {"steps": 0}

  monkeypatch.setattr(systems, "train_m4moe", fake_train)
  for name, rate, warmup in (("m4moe_zoo", 1e-3, 1000),
                             ("m4moe_p4_warmup300", 4e-3, 300)):
    (candidate,) = selection.candidates_by_name([name])
    select.train_and_decode(candidate=candidate, data=None, root=tmp_path,
                            splits=(), budget=None, seed=0, core="0",
                            peer_python=None)
    values = dict(f.lstrip("-").split("=", 1) for f in seen["flags"])
    assert seen["flags"][:2] == selection.M4MOE_BASE
    assert float(values["learning_rate"]) / math.sqrt(
        float(values["warmup_steps"])) == pytest.approx(rate, rel=1e-5)
    assert int(values["warmup_steps"]) == warmup
