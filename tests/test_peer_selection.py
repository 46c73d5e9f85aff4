"""Dev-only recipe selection for the peer yardstick (select.py, selection.py).

No training runs here: the training and decoding subprocesses are replaced
by fakes that write what the real ones write, so the tests check the data
plumbing (which files the selection opens), the skip-on-rerun bookkeeping,
the dev-only ranking and the final report's statistics against sacrebleu.
"""

import dataclasses
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

from m4moe.benchmarks.peer import candidates as candidates_lib
from m4moe.benchmarks.peer import final
from m4moe.benchmarks.peer import final_runs
from m4moe.benchmarks.peer import runs
from m4moe.benchmarks.peer import schedules
from m4moe.benchmarks.peer import select
from m4moe.benchmarks.peer import selection
from m4moe.benchmarks.peer import systems
from m4moe.benchmarks.peer import throughput
from m4moe.benchmarks.peer import toolkit
from m4moe.data import fixtures
from m4moe.data import split as split_lib
from m4moe.data import vocab as vocab_lib
from m4moe.eval import testsets as testsets_lib

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


def _knobs(c):
  """A candidate's knobs (everything but its identity)."""
  d = c.to_dict()
  return {k: v for k, v in d.items()
          if k not in ("name", "why", "round", "base")}


def test_both_systems_get_equal_rounds_over_their_own_knobs():
  counts = candidates_lib.counts()
  assert counts["m4moe"] == counts["opennmt-tf"] == {1: 4, 2: 9, 3: 2}
  names = list(candidates_lib.all_names())
  assert len(names) == len(set(names)) == 30
  # Round 1: the same rates for both, at the same warmup fraction.
  assert [c.peak for c in candidates_lib.ROUND1["m4moe"]] == [
      c.peak for c in candidates_lib.ROUND1["opennmt-tf"]]
  changed = {s: {k for ch in candidates_lib.ROUND2[s] for k, _ in ch.values}
             for s in candidates_lib.SYSTEMS}
  shared = {"warmup", "batch_tokens", "label_smoothing", "clipping",
            "average"}
  assert changed["m4moe"] == shared | {"beta1", "factored"}
  assert changed["opennmt-tf"] == shared | {"decay", "beta2"}
  for system in candidates_lib.SYSTEMS:
    assert {c.rate_factor for c in candidates_lib.ROUND3[system]} == {0.7,
                                                                      1.4}


def _round_records(system, results):
  """Finished round records: (candidate, dev BLEU) for ``system``."""
  out = []
  for c in [*candidates_lib.ROUND1[system]]:
    if c.name in results:
      out.append(_record(c.name, system, 0, results[c.name], 2.0,
                         round=c.round, base=c.base, spec=c.to_dict()))
  return out


def test_round_queue_builds_on_the_best_so_far():
  with pytest.raises(ValueError, match="run --rounds=1 first"):
    selection.round_queue([], 2)
  records = (_round_records("m4moe", {"m4moe_r1_lr1e-3": 20.0,
                                      "m4moe_r1_lr4e-3": 30.0})
             + _round_records("opennmt-tf", {"peer_r1_lr2e-3": 25.0,
                                             "peer_r1_lr8e-3": 10.0}))
  queue = selection.round_queue(records, 2)
  assert len(queue) == 18
  bases = {c.system: c.base for c in queue}
  assert bases == {"m4moe": "m4moe_r1_lr4e-3", "opennmt-tf": "peer_r1_lr2e-3"}
  known = {c.name: c for s in candidates_lib.SYSTEMS
           for c in candidates_lib.ROUND1[s]}
  for c in queue:
    base = known[c.base]
    diff = {k for k in _knobs(c) if _knobs(c)[k] != _knobs(base)[k]}
    assert len(diff) == 1 and c.round == 2, (c, diff)
  # Round 3: the rate x0.7 and x1.4 around the best of rounds 1-2.
  r2 = next(c for c in queue if c.name == "peer_r2_cosine")
  records.append(_record(r2.name, "opennmt-tf", 0, 40.0, 2.0, round=2,
                         base=r2.base, spec=r2.to_dict()))
  third = [c for c in selection.round_queue(records, 3)
           if c.system == "opennmt-tf"]
  assert [(c.base, c.decay, c.peak) for c in third] == [
      ("peer_r2_cosine", "cosine", 0.0014), ("peer_r2_cosine", "cosine",
                                             0.0028)]
  # A round that has started keeps its base, even if later seeds reorder
  # the rounds before it.
  records.append(_record("peer_r1_lr8e-3", "opennmt-tf", 1, 90.0, 2.0,
                         round=1, spec=known["peer_r1_lr8e-3"].to_dict()))
  assert {c.base for c in selection.round_queue(records, 2)
          if c.system == "opennmt-tf"} == {"peer_r1_lr2e-3"}


def test_schedules_fit_the_budget_at_every_batch_size():
  budget = systems.Budget(tokens=1000 * 4096)
  base = candidates_lib.ROUND1["opennmt-tf"][1]  # peak 2e-3, warmup 0.25
  for change in candidates_lib.ROUND2["opennmt-tf"]:
    c = candidates_lib.resolve(change, base=base, round_=2)
    planned = budget.steps_for(c.batch_tokens)
    schedule = c.schedule(planned_steps=planned)
    assert planned * c.batch_tokens == budget.tokens
    assert schedule.warmup_steps == round(c.warmup * planned) < planned
    w = schedule.warmup_steps
    if c.decay == "cosine":
      # OpenNMT-tf's cosine anneals over the whole run, warmup included:
      # the rise stops one step short of the peak, the rate ends at 0.
      assert schedule.rate_at(w - 1) == pytest.approx(c.peak * (w - 1) / w)
      assert schedule.rate_at(w) == pytest.approx(
          c.peak * (1 + math.cos(math.pi * w / planned)) / 2)
      assert schedule.rate_at(planned) == pytest.approx(0.0, abs=1e-12)
    else:
      assert schedule.rate_at(w) == pytest.approx(c.peak)
  assert base.schedule(planned_steps=3).warmup_steps == 1
  with pytest.raises(ValueError, match="does not fit inside the 3 planned"):
    dataclasses.replace(base, warmup=0.9).schedule(planned_steps=3)


def test_peer_candidates_map_onto_its_recipe(tmp_path):
  base = candidates_lib.ROUND1["opennmt-tf"][1]
  cosine = candidates_lib.resolve(candidates_lib.ROUND2["opennmt-tf"][7],
                                  base=base, round_=2)
  assert cosine.decay == "cosine"
  clipped = dataclasses.replace(cosine, clipping=1.0, beta2=0.98, average=5)
  recipe, model = runs.peer_objects(clipped, planned_steps=1000,
                                    decoding=systems.Decoding())
  assert (recipe.learning_rate, recipe.warmup_steps, recipe.decay,
          recipe.planned_steps, recipe.clipnorm, recipe.beta2) == (
              0.002, 250, "cosine", 1000, 1.0, 0.98)
  assert (recipe.checkpoint_every, recipe.keep_checkpoints) == (50, 5)
  assert recipe.max_decode_length == 140 and model.dropout == 0.0
  files = toolkit.PeerFiles(**{f: tmp_path / f for f in (
      "train_source", "train_target", "dev_source", "dev_target",
      "source_vocab", "target_vocab")})
  config = toolkit.run_config(recipe=recipe, files=files,
                              model_dir=tmp_path, max_step=1000)
  assert config["params"]["decay_type"] == "CosineAnnealing"
  assert config["params"]["decay_params"] == {
      "warmup_steps": 250, "max_step": 1000, "eta_min": 0.0}
  assert config["params"]["optimizer_params"]["clipnorm"] == 1.0
  assert config["train"]["save_checkpoints_steps"] == 50
  assert config["train"]["keep_checkpoint_max"] == 5
  assert config["params"]["maximum_decoding_length"] == 140
  # Ours: every knob explicit, the rate flag peak * sqrt(warmup).
  ours = candidates_lib.resolve(candidates_lib.ROUND2["m4moe"][2],
                                base=candidates_lib.ROUND1["m4moe"][2],
                                round_=2)  # 2048-token batches at 4e-3
  flags = dict(f.lstrip("-").partition("=")[::2] for f in ours.m4moe_flags(
      planned_steps=systems.Budget(tokens=4096000).steps_for(2048)))
  assert int(flags["warmup_steps"]) == 500
  assert float(flags["learning_rate"]) / math.sqrt(500) == pytest.approx(
      4e-3, rel=1e-5)
  assert {"nofactored", "nomultiply_by_parameter_scale"} <= set(flags)
  assert (flags["beta1"], flags["clipping_threshold"],
          flags["label_smoothing"]) == ("0.9", "0", "0.1")


@pytest.mark.parametrize("kwargs, match", [
    (dict(system="fairseq"), "system 'fairseq'"),
    (dict(system="m4moe", beta2=0.98), "beta2=0.98 is a knob of opennmt-tf"),
    (dict(system="opennmt-tf", factored=True), "factored=True is a knob of"),
    (dict(system="m4moe", decay="cosine"), "decay='cosine' is a knob of"),
    (dict(system="opennmt-tf", warmup=1.0), "warmup=1.0: give a fraction"),
    (dict(system="opennmt-tf", average=1), "average=1: use 0"),
    (dict(system="opennmt-tf", batch_tokens=8), "batch_tokens=8"),
])
def test_candidate_validation(kwargs, match):
  with pytest.raises(ValueError, match=match):
    candidates_lib.Candidate(name="x", why="x", **kwargs)


def test_candidate_spec_round_trips_and_unknown_fields_are_named():
  c = candidates_lib.ROUND1["m4moe"][0]
  assert candidates_lib.Candidate.from_dict(c.to_dict()) == c
  with pytest.raises(ValueError, match=r"unknown fields \['dropout'\]"):
    candidates_lib.Candidate.from_dict({**c.to_dict(), "dropout": 0.1})


def test_budget_counts_tokens_of_batch_capacity():
  assert systems.Budget(tokens=4096000).steps_for(2048) == 2000
  assert systems.Budget(tokens=4096000).steps_for(8192) == 500
  assert systems.Budget(seconds=600).steps_for(4096) == 0
  for kwargs in ({}, {"seconds": 5, "tokens": 5}, {"tokens": -1}):
    with pytest.raises(ValueError, match="exactly one of them"):
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


M_FIRST, P_FIRST = "m4moe_r1_lr1e-3", "peer_r1_lr1e-3"


class _FakeSubprocesses:
  """Stands in for run_pinned: writes what training and decoding write."""

  def __init__(self, steps=7):
    self.commands, self.steps = [], steps

  def __call__(self, command, *, core, log, what):
    self.commands.append(list(command))
    args = dict(a[2:].partition("=")[::2] for a in command if a.startswith("--"))
    if "train" in command:  # the peer's driver
      (pathlib.Path(args["summary"])).write_text(json.dumps(
          {"steps": self.steps, "train_seconds": 3.0, "steps_per_sec": 2.3,
           "tokens_per_sec": 900.0, "dev_ce": 4.5, "stopped_by": "max_step"}),
          encoding="utf-8")
      pathlib.Path(args["steps_log"]).write_text("".join(
          json.dumps({"step": n, "steps": 1, "target_tokens": 100 * n,
                      "step_seconds": 0.5, "learning_rate": 1e-3}) + "\n"
          for n in range(1, self.steps + 1)), encoding="utf-8")
    elif "infer" in command:
      n = len(pathlib.Path(args["features"]).read_text(
          encoding="utf-8").splitlines())
      # A line separator other than "\n" inside a line stays in its line.
      pathlib.Path(args["predictions"]).write_text("▁Open\u2028▁it\n" * n,
                                                   encoding="utf-8")
      pathlib.Path(args["summary"]).write_text(json.dumps(
          {"sentences": n, "seconds": 2.0}), encoding="utf-8")


def _fake_m4moe(calls, steps=11):
  def train(*, data, root, config, flags, batch_tokens, budget, seed, core,
            checkpoint_every=0, keep_checkpoints=0):
    calls.append(("train", data, flags, budget))
    return {"steps": steps, "tokens_per_sec": 1000.0, "steps_per_sec": 2.0,
            "train_seconds": 5.0, "stopped_by": "max_step", "dev_ce": 3.5,
            "target_tokens_per_sec": 400.0, "target_tokens": 2000,
            "logged_learning_rate": 1e-3, "logged_learning_rate_step": steps}

  def decode(*, data, root, split, name, core, max_sentences=0,
             decoding=None, averaged=False):
    calls.append(("decode", data, split, decoding))
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
  for candidate in _by_name(names):
    ran.append(select.run_candidate(
        candidate=candidate, seed=0, run_dir=run_dir, data=data,
        manifest=manifest, budget=systems.Budget(tokens=5 * 4096), core="1",
        peer_python=pathlib.Path("/peer/python")))
  return ran


def _by_name(names):
  """Round-1 candidates, and round-2 ones made on the first rate."""
  known = {}
  for system in candidates_lib.SYSTEMS:
    first = candidates_lib.ROUND1[system][0]
    known.update({c.name: c for c in (
        *candidates_lib.ROUND1[system],
        *candidates_lib.round_candidates(system, 2, first))})
  return [known[n] for n in names]


def test_selection_never_opens_a_test_file(corpus, tmp_path, monkeypatch):
  calls, fake = [], _FakeSubprocesses()
  _OPENED.clear()
  _RECORDING[0] = True
  try:
    _select_once(corpus, tmp_path / "run", monkeypatch, calls, fake,
                 [M_FIRST, P_FIRST])
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
  features = (tmp_path / "run" / "work" / f"{P_FIRST}_s0" / "data" /
              "dev.de.src").read_text(encoding="utf-8").splitlines()
  assert len(features) == len(_englishes(selection_corpus / "dev" / "de.tsv"))
  # Both decode with the one shared config.
  assert calls[1][3] == systems.Decoding()
  assert all(str(corpus / "corpus") not in " ".join(c)
             for c in fake.commands)


def test_finished_candidates_are_skipped_and_changes_refused(
    corpus, tmp_path, monkeypatch):
  calls, fake = [], _FakeSubprocesses()
  run_dir = tmp_path / "run"
  assert _select_once(corpus, run_dir, monkeypatch, calls, fake,
                      [M_FIRST, P_FIRST]) == [True, True]
  n_calls, n_commands = len(calls), len(fake.commands)
  assert _select_once(corpus, run_dir, monkeypatch, calls, fake,
                      [M_FIRST, P_FIRST]) == [False, False]
  assert (len(calls), len(fake.commands)) == (n_calls, n_commands)
  record = json.loads(selection.record_path(run_dir, P_FIRST, 0)
                      .read_text(encoding="utf-8"))
  assert record["selected_on"] == "dev" and record["budget_tokens"] == 20480
  assert record["protocol"] == selection.PROTOCOL
  assert record["train"]["steps"] == 7 and record["dev"]["ce"] == 4.5
  # The peer's tokens/s is the driver's steps log by the shared definition
  # (the first interval left out): 100 * (2 + ... + 7) / (6 * 0.5).
  assert record["train"]["target_tokens_per_sec"] == round(
      100 * sum(range(2, 8)) / 3.0, 1)
  assert record["tokens_per_sec_definition"] == throughput.DEFINITION
  assert record["schedule_check"]["schedule_complete"] is True
  assert record["decoding"] == systems.Decoding().to_dict()
  # An interrupted run restarts; its directory is kept aside.
  (run_dir / "work" / "m4moe_r2_batch2048_s0").mkdir(parents=True)
  _select_once(corpus, run_dir, monkeypatch, calls, fake,
               ["m4moe_r2_batch2048"])
  assert (run_dir / "work" / "m4moe_r2_batch2048_s0.abandoned-1").is_dir()
  # Another budget in the same run directory is refused, not mixed in.
  manifest = json.loads((run_dir / "data" / "manifest.json").read_text(
      encoding="utf-8"))
  with pytest.raises(ValueError, match="budget_tokens.*new --run_dir"):
    select.run_candidate(
        candidate=_by_name([M_FIRST])[0], seed=0,
        run_dir=run_dir, data=systems.Data(
            corpus_dir=run_dir / "data" / "selection_corpus",
            vocab_dir=corpus / "vocab", language="de"),
        manifest=manifest, budget=systems.Budget(tokens=6 * 4096), core="1",
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
      _record("m4moe_ls0", "m4moe", 0, 29.5, 2.4, test={"bleu": 99.0},
              round=2, base="m4moe_zoo"),
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
      budgets=[{"budget_tokens": 4096000}])
  assert "| 1 | 2 | m4moe_ls0 |" in table and "+0.5 vs m4moe_zoo" in table
  # The care count sits before the systems' tables, side by side.
  assert "| round 2 (finished / planned) | 1 / 9 | 0 / 9 |" in table
  assert "| candidates | 3 | 2 |" in table
  assert "4,096,000 training tokens" in table


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
  schedule = schedules.Schedule(shape="linear_rsqrt", peak=2e-3,
                                warmup_steps=10, planned_steps=20)
  runs = {s: [{"seed": seed, "train": {"steps": 10 + seed,
                                       "target_tokens_per_sec": 100.0,
                                       "dev_ce": 2.0},
               "schedule_check": schedules.check(
                   schedule, steps=20 if s == "m4moe" or seed else 9),
               "splits": {sp: {"sentences_per_sec": 5.0}
                          for sp in final.SPLITS}} for seed in (0, 1)]
          for s in selection.SYSTEMS}
  dev_gap = {"score": -30.0, "ci": 1.0, "p_value": 0.001,
             "significant": True, "seeds": [0, 1]}
  out = final.report(picks=picks, runs=runs, hypotheses=hyp, references=refs,
                     splits={"test": {"first_line": 1001}},
                     setup={"language": "pt"}, dev_gap=dev_gap, n_samples=50)
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
  # The peer's seed 0 stopped inside its warmup: flagged, and warned of.
  peer_schedule = out["systems"]["opennmt-tf"]["schedule"]
  assert peer_schedule["flagged_seeds"] == [0]
  assert peer_schedule["per_seed"][0]["peak_reached"] is False
  assert peer_schedule["per_seed"][0]["final_learning_rate"] == (
      pytest.approx(2e-3 * 9 / 10))
  assert out["systems"]["m4moe"]["schedule"]["flagged_seeds"] == []
  # The dev gap sits beside the test gap; here they disagree.
  assert out["m4moe_minus_peer"]["dev"]["bleu"] == dev_gap
  check = out["dev_vs_test"]
  assert check["dev"] == -30.0 and check["test"] == diff["score"]
  assert check["disagree"] is True
  warned = final.warnings(out)
  assert any("opennmt-tf seed(s) [0]" in w for w in warned)
  assert any("disagree by more than their intervals" in w for w in warned)
  assert out["systems"]["m4moe"]["test"]["repeating_outputs_per_seed"] == [
      0, 0]
  assert final.repeats_three_times("Download Download Download now")
  assert final.repeats_three_times("a b a b a b")
  assert not final.repeats_three_times("a b a b c a b")
  out["recipes"] = {s: final.recipe_entry(p) for s, p in picks.items()}
  out["budget"], out["seeds"] = {"budget_tokens": 4096000}, [0, 1]
  table = final.markdown(out)
  assert "| opennmt-tf: `peer_ours` | 9/20, 20/20 | flagged seeds [0] |" in (
      table)
  assert "| m4moe: `m4moe_zoo` | 20/20, 20/20 | complete |" in table
  assert f"| seed mean | -30.0* ±1.0 (p=0.001) | {diff['score']:+.1f}" in (
      table)
  assert table.count("Warning: ") == 2
  with pytest.raises(ValueError, match="different seeds"):
    final.report(picks=picks, runs={**runs, "m4moe": runs["m4moe"][:1]},
                 hypotheses=hyp, references=refs, splits={}, setup={})


@pytest.mark.parametrize("flags, match", [
    (["--mode=select"], "--corpus_dir is required with --mode=select"),
    (["--mode=select", "--corpus_dir=X", "--run_dir=Y",
      "--budget_tokens=-5"], "--budget_tokens=-5: use a positive"),
    (["--mode=select", "--corpus_dir=X", "--run_dir=Y",
      "--candidates=m4moe_r1_lr1e-3,zzz"], "unknown ['zzz']"),
    (["--mode=select", "--corpus_dir=X", "--run_dir=Y", "--rounds=1,4"],
     "--rounds=1,4: list rounds among 1,2,3"),
    (["--mode=select", "--corpus_dir=X", "--run_dir=Y", "--seeds=a"],
     "--seeds=a: list integers"),
    (["--mode=final", "--corpus_dir=X", "--run_dir=Y", "--cores=0"],
     "--cores: give two CPU numbers"),
    (["--mode=table", "--run_dir=Y"], "holds no selection: run "
     "--mode=select there first"),
    (["--mode=final", "--corpus_dir=X", "--run_dir=Y", "--seeds=0,1"],
     "--seeds=0,1: the final comparison needs at least 3 seeds"),
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
       "--language=de", "--candidates=peer_r1_lr1e-3"],
      capture_output=True, text=True, cwd=tmp_path, env=env, check=False)
  assert done.returncode != 0
  assert "pass --onmt_venv=DIR or set M4MOE_ONMT_VENV=DIR" in done.stderr
  assert not (tmp_path / "run" / "candidates").exists()


def _final(tmp_path, records, *flags):
  """Runs --mode=final on ``records``; it must stop before training."""
  (tmp_path / "run" / "candidates").mkdir(parents=True, exist_ok=True)
  for r in records:
    (tmp_path / "run" / "candidates" / f"{r['candidate']}_s{r['seed']}.json"
     ).write_text(json.dumps(r), encoding="utf-8")
  done = subprocess.run(
      [sys.executable, "-m", "m4moe.benchmarks.peer.select", "--mode=final",
       f"--corpus_dir={tmp_path / 'corpus'}", f"--run_dir={tmp_path / 'run'}",
       "--onmt_venv=/nonexistent", *flags],
      capture_output=True, text=True, cwd=tmp_path, check=False)
  assert done.returncode != 0 and "Traceback" not in done.stderr
  assert not (tmp_path / "run" / "final").exists()
  return done.stderr


def _new(name, system, seed, bleu, budget_tokens=4096000):
  spec = _by_name([name])[0].to_dict()
  return _record(name, system, seed, bleu, 2.5, protocol=selection.PROTOCOL,
                 spec=spec, round=spec["round"], budget_tokens=budget_tokens)


def test_final_refuses_picks_with_too_few_selection_seeds(tmp_path):
  records = [_new(M_FIRST, "m4moe", s, 30.0) for s in (0, 1, 2)] + [
      _new(P_FIRST, "opennmt-tf", s, 20.0) for s in (0, 1)]
  err = _final(tmp_path, records)
  assert (f"{P_FIRST} (rank 1 of opennmt-tf on dev) has 2 selection "
          "seed(s), fewer than --min_selection_seeds=3") in err


def test_final_refuses_a_budget_other_than_the_selections(tmp_path):
  records = [_new(M_FIRST, "m4moe", s, 30.0) for s in (0, 1, 2)] + [
      _new(P_FIRST, "opennmt-tf", s, 20.0) for s in (0, 1, 2)]
  err = _final(tmp_path, records, "--budget_tokens=8192000")
  assert ("--budget_tokens=8192000 is not the budget the picks were selected "
          "at (4096000 tokens") in err
  assert "Drop --budget_tokens" in err
  # Picks selected at two budgets cannot be compared at either.
  records[-1] = _new(P_FIRST, "opennmt-tf", 2, 20.0, budget_tokens=2048000)
  err = _final(tmp_path, records)
  assert "were selected at budgets" in err


def test_final_refuses_the_earlier_protocols_records(tmp_path):
  records = [_record("m4moe_zoo", "m4moe", s, 30.0, 2.5, budget_steps=1000)
             for s in (0, 1, 2)] + [
                 _record("peer_ours", "opennmt-tf", s, 20.0, 3.0,
                         budget_steps=1000) for s in (0, 1, 2)]
  err = _final(tmp_path, records)
  assert "holds 2 candidate(s) of the earlier protocol" in err
  assert "m4moe_zoo, peer_ours" in err and "use a new --run_dir" in err


def _write_dev_set(run_dir):
  """Five English dev references in the selection corpus; returns them."""
  refs = ["the file is open", "close the window", "print it now",
          "save all files", "open a new page"]
  (run_dir / "data" / "selection_corpus" / "dev").mkdir(parents=True)
  (run_dir / "data" / "selection_corpus" / "dev" / "pt.tsv").write_text(
      "".join(f"{r}\tx{i}\n" for i, r in enumerate(refs)), encoding="utf-8")
  return refs


def test_table_tests_each_candidate_against_its_centre_on_dev(tmp_path):
  refs = _write_dev_set(tmp_path)
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
    extra = {"base": "m4moe_zoo", "round": 2} if name == "m4moe_ls0" else {}
    (tmp_path / "candidates" / f"{name}_s0.json").write_text(json.dumps(
        _record(name, "m4moe", 0, bleu, 2.0, budget_tokens=5, **extra)),
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
  assert "| 1 | 2 | m4moe_ls0 |" in table and "(p=" in table
  # Only ours ranked: no dev gap of the picks yet.
  assert out["picks_dev_gap"] is None and "Dev gap of the picks" not in table


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


def _train_with(monkeypatch, tmp_path, candidate, steps):
  """runs.train_and_decode with a fake trainer that stops after ``steps``."""
  seen = {}
  train, _ = _fake_m4moe([], steps=steps)

  def fake_train(**kwargs):
    seen.update(kwargs)
    return train(**kwargs)

  monkeypatch.setattr(systems, "train_m4moe", fake_train)
  out, _ = runs.train_and_decode(
      candidate=candidate, data=None, root=tmp_path, splits=(),
      budget=systems.Budget(tokens=4096000), seed=0, core="0",
      peer_python=None)
  return out, seen


def test_m4moe_flags_carry_the_schedule_made_for_the_budget(
    monkeypatch, tmp_path):
  candidate = candidates_lib.ROUND1["m4moe"][2]  # 4e-3, warmup 0.25
  out, seen = _train_with(monkeypatch, tmp_path, candidate, steps=1000)
  values = dict(f.lstrip("-").partition("=")[::2] for f in seen["flags"])
  assert int(values["warmup_steps"]) == 250
  assert float(values["learning_rate"]) / math.sqrt(250) == pytest.approx(
      4e-3, rel=1e-5)
  check = out["schedule_check"]
  assert (check["peak_reached"], check["schedule_complete"],
          check["flagged"]) == (True, True, False)
  assert check["final_learning_rate"] == pytest.approx(4e-3 * math.sqrt(
      250 / 1000))


def test_a_run_stopped_before_its_planned_end_is_flagged(
    monkeypatch, tmp_path):
  out, _ = _train_with(monkeypatch, tmp_path,
                       candidates_lib.ROUND1["m4moe"][0], steps=900)
  check = out["schedule_check"]
  assert (check["steps"], check["planned_steps"]) == (900, 1000)
  assert check["schedule_complete"] is False and check["flagged"] is True


def test_both_systems_decode_with_one_config(tmp_path):
  decoding = systems.Decoding()
  # The rule: sources cut to 62 pieces, a fixed cap of 2 * 62 + 16 output
  # tokens, beam 4, alpha 0.6, 32 sentences a batch, sorted by length.
  assert (decoding.max_source_pieces, decoding.max_output_tokens) == (62, 140)
  flags = dict(f.lstrip("-").partition("=")[::2]
               for f in decoding.m4moe_flags())
  assert flags == {"beam_size": "4", "alpha": "0.6", "batch_size": "32",
                   "max_input_length": "64", "decode_length_ratio": "0",
                   "max_decode_length": "140"}
  recipe, _ = runs.peer_objects(candidates_lib.ROUND1["opennmt-tf"][0],
                                planned_steps=100, decoding=decoding)
  files = toolkit.PeerFiles(**{f: tmp_path / f for f in (
      "train_source", "train_target", "dev_source", "dev_target",
      "source_vocab", "target_vocab")})
  config = toolkit.run_config(recipe=recipe, files=files, model_dir=tmp_path)
  assert (config["params"]["beam_width"], config["params"]["length_penalty"],
          config["params"]["maximum_decoding_length"],
          config["infer"]["batch_size"],
          config["infer"]["length_bucket_width"]) == (
              int(flags["beam_size"]), float(flags["alpha"]),
              int(flags["max_decode_length"]), int(flags["batch_size"]), 0)


class _EchoDecoder:
  """Stands in for the peer's infer: each prediction is its feature line."""

  def __init__(self):
    self.features = []

  def __call__(self, command, *, core, log, what):
    args = dict(a[2:].partition("=")[::2] for a in command
                if a.startswith("--"))
    lines = pathlib.Path(args["features"]).read_text(
        encoding="utf-8").splitlines()
    self.features = lines
    pathlib.Path(args["predictions"]).write_text(
        "".join(l + "\n" for l in lines), encoding="utf-8")
    pathlib.Path(args["summary"]).write_text(json.dumps(
        {"sentences": len(lines), "seconds": 1.0}), encoding="utf-8")


def test_the_peer_decodes_in_our_length_sorted_order(corpus, tmp_path,
                                                     monkeypatch):
  sources = ["a long sentence with many many words in it", "", "short one",
             "mid length sentence here", "short two"]
  testset = testsets_lib.TestSet(
      language="de", source_lang="de", target_lang="en",
      sources=tuple(sources), references=("x",) * len(sources))
  echo = _EchoDecoder()
  monkeypatch.setattr(systems, "run_pinned", echo)
  monkeypatch.setattr(systems.evaluate_lib, "evaluate",
                      lambda fn, sets, **kw: _Scored(fn(None)))
  monkeypatch.setattr(systems.results, "write_eval_json", lambda *a: None)
  data = systems.Data(corpus_dir=tmp_path, vocab_dir=corpus / "vocab",
                      language="de")
  decoded = systems.decode_peer(
      python=pathlib.Path("/peer/python"), data=data, root=tmp_path,
      testset=testset, split="test", name="p", seed=0, core="0",
      decoding=systems.Decoding())
  source_sp = vocab_lib.load(corpus / "vocab" / "source.model")
  target_sp = vocab_lib.load(corpus / "vocab" / "target.model")
  pieces = [source_sp.encode(s, out_type=str) if s else [] for s in sources]
  # Our translator's order: (ids, input index), empty sources left out.
  expected = sorted((len(p), i) for i, p in enumerate(pieces) if p)
  assert echo.features == [" ".join(pieces[i]) for _, i in expected]
  assert systems.sorted_order([len(p) for p in pieces]) == [
      i for _, i in expected]
  # Back in input order; the empty source gets an empty output.
  assert decoded.hypotheses == [
      toolkit.detokenize(" ".join(p), target_sp=target_sp) if p else ""
      for p in pieces]
  assert decoded.sentences == len(sources)


class _Scored:
  def __init__(self, hyps):
    self.hyps = hyps
    self.languages = {"de": type("S", (), {"bleu": 1.0, "chrf": 2.0})()}


def test_dev_gap_of_the_picks_is_over_the_seeds_both_have(tmp_path):
  refs = _write_dev_set(tmp_path)
  hyps = {("m4moe_a", 0): refs, ("m4moe_a", 1): refs,
          ("peer_b", 0): ["the file", "close", "print it", "save", "a page"],
          ("peer_b", 1): ["file open", "close window", "print it now",
                          "save files", "new page"],
          ("peer_b", 2): ["x"] * 5}
  for (name, seed), lines in hyps.items():
    systems.write_hypotheses(systems.hypotheses_path(
        tmp_path / "work" / f"{name}_s{seed}", "dev", "pt"), lines)
  ranking = selection.rank(
      [_record("m4moe_a", "m4moe", s, 1.0, 2.0) for s in (0, 1)] +
      [_record("peer_b", "opennmt-tf", s, 1.0, 2.0) for s in (0, 1, 2)])
  picks = {s: selection.chosen(ranking, s) for s in selection.SYSTEMS}
  gap = select.dev_gap(tmp_path, picks, language="pt")
  assert gap["seeds"] == [0, 1]  # not the peer's seed 2
  peer = [sacrebleu.corpus_bleu(hyps[("peer_b", s)], [refs]).score
          for s in (0, 1)]
  assert gap["score"] == pytest.approx(100.0 - sum(peer) / 2)
  assert gap["ci"] >= 0 and 0 <= gap["p_value"] <= 1
  text = selection.table_markdown(
      ranking, manifest={"language": "pt", "dev": {
          "sentences": 5, "from_dev_split": 2, "from_train_carve": 3}},
      budgets=[], picks_gap={"m4moe": "m4moe_a", "opennmt-tf": "peer_b",
                             **gap})
  assert ("Dev gap of the picks, m4moe_a minus peer_b (dev BLEU, paired "
          f"bootstrap over the seeds both have): {gap['score']:+.1f}") in text
  lonely = selection.rank([_record("m4moe_a", "m4moe", 3, 1.0, 2.0),
                           _record("peer_b", "opennmt-tf", 2, 1.0, 2.0)])
  with pytest.raises(ValueError, match="share no selection seed"):
    select.dev_gap(tmp_path, {s: selection.chosen(lonely, s)
                              for s in selection.SYSTEMS}, language="pt")


_PARSE = """
import sys
from absl import flags
import {module}
flags.FLAGS(["x", *sys.argv[1:]])
print("parsed")
"""


@pytest.mark.parametrize("module", ["m4moe.cli.train", "m4moe.cli.eval"])
def test_our_candidates_and_decoding_flags_parse(module):
  """Every knob of our candidates and the shared decoding is a real flag
  of m4moe-train / m4moe-eval (a typo would fail only hours into a run)."""
  if module == "m4moe.cli.train":
    argv = [f for s in candidates_lib.SYSTEMS[:1]
            for c in (*candidates_lib.ROUND1[s],
                      *candidates_lib.round_candidates(
                          s, 2, candidates_lib.ROUND1[s][0]))
            for f in c.m4moe_flags(planned_steps=1000)]
    argv += ["--checkpoint_every=50", "--keep_checkpoints=5"]
  else:
    argv = ["--checkpoint=averaged", *systems.Decoding().m4moe_flags()]
  done = subprocess.run([sys.executable, "-c", _PARSE.format(module=module),
                         *argv], capture_output=True, text=True, check=False,
                        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
  assert done.returncode == 0, done.stderr[-2000:]
  assert "parsed" in done.stdout


def test_a_final_run_keeps_its_logs_and_is_reused_only_unchanged(
    tmp_path, monkeypatch):
  trained = []

  def fake_train_and_decode(*, candidate, data, root, splits, budget, seed,
                            core, peer_python):
    trained.append(candidate.name)
    (root / "train.log").write_text("step 1\n", encoding="utf-8")
    (root / throughput.PEER_STEPS_FILENAME).write_text("{}\n",
                                                       encoding="utf-8")
    schedule = candidate.schedule(
        planned_steps=budget.steps_for(candidate.batch_tokens))
    train = {"steps": 3, "target_tokens_per_sec": 1.0,
             "schedule_check": schedules.check(schedule, steps=3)}
    return train, {s: systems.Decoded(
        split=s, hypotheses=["a", "b"], sentences=2, seconds=1.0,
        eval_path=root / "e.json", bleu=1.0, chrf=2.0) for s in splits}

  monkeypatch.setattr(runs, "train_and_decode", fake_train_and_decode)
  peer = candidates_lib.ROUND1["opennmt-tf"][0]
  budget = systems.Budget(tokens=4096 * 10)
  kwargs = dict(seed=1, run_dir=tmp_path, data=None, budget=budget,
                core="1", peer_python=None)
  record = final_runs.final_run(candidate=peer, **kwargs)
  runs_dir = tmp_path / "final" / "runs"
  assert record["logs"] == {"train.log": "opennmt-tf_s1.train.log",
                            "steps.jsonl": "opennmt-tf_s1.steps.jsonl"}
  assert (runs_dir / "opennmt-tf_s1.train.log").read_text() == "step 1\n"
  assert (runs_dir / "opennmt-tf_s1.test.hyp").read_text() == "a\nb\n"
  # 3 of 10 planned steps: flagged in the record.
  assert record["schedule_check"]["schedule_complete"] is False
  assert record["decoding"] == systems.Decoding().to_dict()
  assert final_runs.final_run(candidate=peer, **kwargs) == record
  assert trained == [peer.name]
  with pytest.raises(ValueError, match="ran with other budget_tokens"):
    final_runs.final_run(candidate=peer, **{
        **kwargs, "budget": systems.Budget(tokens=4096 * 20)})


def _fake_decoded(*, data, root, split, name, seed):
  """Hypotheses that keep a name-dependent share of each reference (the
  same for every seed, so that the picks' seeds keep them rank 1)."""
  del seed
  (testset,) = testsets_lib.load_testsets(data.corpus_dir, split=split,
                                          langs=[data.language])
  keep = 1 + int(hashlib.sha256(name.encode()).hexdigest(), 16) % 4
  hyps = [" ".join(r.split()[:keep]) for r in testset.references]
  systems.write_hypotheses(systems.hypotheses_path(root, split,
                                                   data.language), hyps)
  return systems.Decoded(
      split=split, hypotheses=hyps, sentences=len(hyps), seconds=1.0,
      eval_path=root / "e.json", bleu=sacrebleu.corpus_bleu(
          hyps, [list(testset.references)]).score, chrf=1.0)


def _train_summary(steps):
  return {"steps": steps, "dev_ce": 3.0, "tokens_per_sec": 10.0,
          "target_tokens_per_sec": 5.0, "target_tokens": 100,
          "steps_per_sec": 1.0, "train_seconds": 1.0, "stopped_by": None,
          "logged_learning_rate": 1e-3, "logged_learning_rate_step": steps}


def _fake_both_systems(monkeypatch):
  """Every training and decoding step, faked; runs train their plan."""
  seeds = {}

  def train_m4moe(*, data, root, config, flags, batch_tokens, budget, seed,
                  core, checkpoint_every=0, keep_checkpoints=0):
    seeds[root] = seed
    return _train_summary(budget.steps_for(batch_tokens))

  def prepare_peer(*, data, root, recipe, model, budget):
    (root / "planned").write_text(str(budget.steps_for(recipe.batch_tokens)))

  def train_peer(*, python, root, budget, seed, core):
    seeds[root] = seed
    return _train_summary(int((root / "planned").read_text()))

  monkeypatch.setattr(systems, "train_m4moe", train_m4moe)
  monkeypatch.setattr(systems, "prepare_peer", prepare_peer)
  monkeypatch.setattr(systems, "train_peer", train_peer)
  monkeypatch.setattr(systems, "average_m4moe", lambda **_: None)
  monkeypatch.setattr(systems, "decode_m4moe", lambda *, data, root, split,
                      name, core, decoding, averaged: _fake_decoded(
                          data=data, root=root, split=split, name=name,
                          seed=seeds[root]))
  monkeypatch.setattr(systems, "decode_peer", lambda *, python, data, root,
                      testset, split, name, seed, core, decoding, average:
                      _fake_decoded(data=data, root=root, split=split,
                                    name=name, seed=seed))


def test_select_then_final_end_to_end_with_fake_toolkits(
    corpus, tmp_path, monkeypatch):
  """The selection's three rounds, the picks' seeds and the final, as the
  two commands run them, with every toolkit step faked."""
  _fake_both_systems(monkeypatch)
  run_dir, budget = tmp_path / "run", systems.Budget(tokens=40 * 4096)
  manifest = select.prepare_data(corpus_dir=corpus / "corpus",
                                 run_dir=run_dir, language="de", permille=200)
  data = systems.Data(corpus_dir=run_dir / "data" / "selection_corpus",
                      vocab_dir=corpus / "vocab", language="de")
  common = dict(run_dir=run_dir, data=data, manifest=manifest,
                budget=budget, core="1", peer_python=pathlib.Path("/p"))
  select._run_rounds(rounds=[1, 2, 3], names=[], seeds=[0], **common)  # pylint: disable=protected-access
  ranking = selection.rank(selection.read_records(run_dir))
  picks = [ranking[s][0].candidate for s in selection.SYSTEMS]
  select._run_rounds(rounds=[1, 2, 3], names=picks, seeds=[0, 1, 2],  # pylint: disable=protected-access
                     **common)
  select.write_table(run_dir, run_dir)
  table = json.loads((run_dir / "selection.json").read_text())
  assert table["care"]["m4moe"] == table["care"]["opennmt-tf"] == {
      "round_1": 4, "round_2": 9, "round_3": 2, "candidates": 15,
      "runs": 17}
  assert table["picks_dev_gap"]["seeds"] == [0, 1, 2]
  chosen, specs, final_budget = final_runs.picks_and_budget(
      run_dir, names={}, min_seeds=3, budget_tokens=None)
  assert final_budget == budget
  assert [chosen[s].candidate for s in selection.SYSTEMS] == picks
  splits = selection.write_final_corpus(
      selection_dir=run_dir / "data" / "selection_corpus",
      corpus_dir=corpus / "corpus", output_dir=run_dir / "final" / "corpus",
      language="de", test_skip=4, ood_sentences=0)
  final_data = systems.Data(corpus_dir=run_dir / "final" / "corpus",
                            vocab_dir=corpus / "vocab", language="de")
  done = final_runs.run_all(specs=specs, seeds=[0, 1, 2], cores=["0", "1"],
                            run_dir=run_dir, data=final_data,
                            budget=final_budget, peer_python=pathlib.Path("/p"))
  value = final_runs.assemble(
      picks=chosen, runs=done, run_dir=run_dir, data=final_data,
      splits=splits, budget=final_budget, cores=["0", "1"],
      manifest=manifest, n_samples=20,
      dev_gap=select.dev_gap(run_dir, chosen, language="de"))
  assert value["budget"] == {"budget_tokens": 40 * 4096}
  assert value["decoding"]["m4moe"] == value["decoding"]["opennmt-tf"] == (
      systems.Decoding().to_dict())
  assert value["tokens_per_sec_definition"] == throughput.DEFINITION
  assert value["seeds"] == [0, 1, 2]
  for system in selection.SYSTEMS:
    schedule = value["systems"][system]["schedule"]
    assert schedule["flagged_seeds"] == [] and len(schedule["per_seed"]) == 3
    assert value["systems"][system]["speed"]["target_tokens"] == [100] * 3
  assert value["m4moe_minus_peer"]["dev"]["bleu"]["seeds"] == [0, 1, 2]
  assert set(value["dev_vs_test"]) >= {"dev", "test", "disagree"}
  assert "| m4moe: `" in final.markdown(value)


def test_select_refuses_a_run_dir_of_the_earlier_protocol(corpus, tmp_path):
  (tmp_path / "run" / "candidates").mkdir(parents=True)
  (tmp_path / "run" / "candidates" / "m4moe_zoo_s0.json").write_text(
      json.dumps(_record("m4moe_zoo", "m4moe", 0, 30.0, 2.5,
                         budget_steps=1000)), encoding="utf-8")
  done = subprocess.run(
      [sys.executable, "-m", "m4moe.benchmarks.peer.select", "--mode=select",
       f"--corpus_dir={corpus / 'corpus'}", f"--run_dir={tmp_path / 'run'}",
       "--language=de", "--onmt_venv=/nonexistent"],
      capture_output=True, text=True, cwd=tmp_path, check=False)
  assert done.returncode != 0 and "Traceback" not in done.stderr
  assert "holds 1 candidate(s) of the earlier protocol" in done.stderr
  assert not (tmp_path / "run" / "data").exists()
