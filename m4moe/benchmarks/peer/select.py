r"""Dev-only recipe selection for m4moe and OpenNMT-tf, then the final match.

  # Screen both systems' candidates (three rounds, one run at a time,
  # pinned to --core), resumable:
  taskset -c 1 nice -n 0 python -m m4moe.benchmarks.peer.select \
      --mode=select --corpus_dir=CORPUS --run_dir=RUN --core=1 \
      --onmt_venv=VENV --budget_tokens=4096000
  # The picks' seeds for the final (three each):
  ... --mode=select ... --candidates=M4MOE_PICK,PEER_PICK --seeds=0,1,2
  # The dev-only ranking table from the finished candidates:
  python -m m4moe.benchmarks.peer.select --mode=table --run_dir=RUN \
      --output_dir=OUT
  # The comparison on sentences no choice was made on (both systems at
  # once, one core each, the selection's token budget, seeds 0,1,2):
  python -m m4moe.benchmarks.peer.select --mode=final --corpus_dir=CORPUS \
      --run_dir=RUN --onmt_venv=VENV --output_dir=OUT

One budget for both modes: ``--budget_tokens`` training tokens per run
(a run with B-token batches trains tokens/B steps); the final takes the
budget its picks' records hold and refuses another, because a recipe
chosen at one budget and reported at another measures the budget.

What each mode reads:

* ``select``: ``CORPUS/train/*.tsv`` and ``CORPUS/dev/<lang>.tsv`` once, to
  write ``RUN/data/selection_corpus`` (train minus the dev carve; the dev
  set; no test split: see ``selection.py``), then only that copy. Trains
  ``RUN/data/vocab`` on its train split unless ``--vocab_dir`` is given.
  Each candidate (``candidates.py``) and seed trains for the budget with
  the schedule built for it, is scored on the dev set (BLEU and chrF++,
  ``systems.Decoding``; dev CE) and has its schedule checked, written to
  ``RUN/candidates/<name>_s<seed>.json``; a finished one is skipped on
  the next run, an interrupted one restarts (its directory is kept as
  ``*.abandoned-N``). The table is rewritten after each run.
* ``table``: the candidate JSONs, the selection dev set and the runs' dev
  hypotheses (for the paired bootstrap against each candidate's base);
  records of the earlier protocol are read too.
* ``final``: the candidate JSONs (the systems' picks: rank 1 on dev unless
  ``--m4moe_candidate``/``--peer_candidate``; this protocol's records
  only), the selection corpus and dev hypotheses (the dev gap), and
  ``CORPUS/test/<lang>.tsv`` past its first ``--test_skip`` lines and
  ``CORPUS/test_ood/<lang>.tsv``. Writes ``OUT/peer.json``
  (``final_runs.py``, ``final.py``).

Nothing is written into the repository unless ``--output_dir`` points there.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import pathlib
import sys
import time
from typing import Any, Mapping, Sequence

from absl import app
from absl import flags

from m4moe import jsonfile
from m4moe.benchmarks.peer import candidates as candidates_lib
from m4moe.benchmarks.peer import final
from m4moe.benchmarks.peer import final_runs
from m4moe.benchmarks.peer import runs
from m4moe.benchmarks.peer import selection
from m4moe.benchmarks.peer import systems
from m4moe.benchmarks.peer import throughput
from m4moe.benchmarks.peer import toolkit
from m4moe.eval import examples as examples_lib
from m4moe.eval import significance
from m4moe.eval import testsets as testsets_lib

DEFAULT_BUDGET_TOKENS = 1000 * 4096
DEFAULT_SEEDS = {"select": [0], "final": [0, 1, 2]}
MIN_FINAL_SEEDS = 3


def _define_flags() -> None:
  """The tool's flags, defined only when it runs as a program.

  Its flag names (``--corpus_dir``, ``--run_dir``, ...) are shared with
  other m4moe tools; defining them at import would clash in any process
  that imports this module and one of those (the test suite does).
  """
  global _MODE, _CORPUS_DIR, _RUN_DIR, _VOCAB_DIR, _LANGUAGE, _CARVE
  global _CANDIDATES, _SEEDS, _BUDGET_TOKENS, _ROUNDS
  _MODE = flags.DEFINE_enum("mode", "select", ["select", "table", "final"],
                            "select: screen candidates on dev; table: rank "
                            "them; final: the comparison on unseen test.")
  _CORPUS_DIR = flags.DEFINE_string(
      "corpus_dir", None, "Corpus built by m4moe-build-corpus (with "
      "--ood_packages=packaged for --mode=final's test_ood).")
  _RUN_DIR = flags.DEFINE_string("run_dir", None,
                                 "Selection run directory (outside the repo).")
  _VOCAB_DIR = flags.DEFINE_string(
      "vocab_dir", None, "m4moe-vocab output to use; default: train one on "
      "the selection corpus's train split (RUN/data/vocab).")
  _LANGUAGE = flags.DEFINE_string("language", "pt", "Source language (->en).")
  _CARVE = flags.DEFINE_integer(
      "carve_permille", selection.DEFAULT_CARVE_PERMILLE,
      "Train groups carved into the dev set, per thousand (selection.py).")
  _CANDIDATES = flags.DEFINE_list(
      "candidates", [], "Select: only these candidates of --rounds (default:"
      " every candidate of both systems, candidates.py).")
  _ROUNDS = flags.DEFINE_list(
      "rounds", ["1", "2", "3"], "Select: the rounds to run, in order; round"
      " 2 and 3 start from the best finished candidate of the rounds before.")
  _SEEDS = flags.DEFINE_list(
      "seeds", None, "Seeds of every candidate (select, default 0) or "
      "system (final, default 0,1,2; at least three).")
  _BUDGET_TOKENS = flags.DEFINE_integer(
      "budget_tokens", None, "Training tokens per run (batch capacity: a "
      "run with B-token batches trains tokens/B steps), for select and "
      "final alike. Select: default "
      f"{DEFAULT_BUDGET_TOKENS} (1000 batches of 4096); final: default and"
      " only allowed value: the budget the picks were selected at.")
  _define_run_flags()


def _define_run_flags() -> None:
  """Where runs go and what the final comparison reads (see _define_flags)."""
  global _CORE, _CORES, _ONMT_VENV, _OUTPUT_DIR, _TEST_SKIP, _VOCAB_LANGUAGES
  global _OOD_SENTENCES, _MIN_SEEDS, _M4MOE_PICK, _PEER_PICK
  _CORE = flags.DEFINE_string("core", "1", "CPU core of every selection run.")
  _CORES = flags.DEFINE_list("cores", ["0", "1"], "Final: the two cores, m4moe "
                             "on the first, the peer on the second.")
  _ONMT_VENV = flags.DEFINE_string(
      "onmt_venv", None, "OpenNMT-tf virtualenv (or $M4MOE_ONMT_VENV); built "
      "with the pinned versions if missing.")
  _OUTPUT_DIR = flags.DEFINE_string(
      "output_dir", None, "table/final: where selection.md/.json or peer.json "
      "go (default: --run_dir).")
  _TEST_SKIP = flags.DEFINE_integer(
      "test_skip", 1000, "Final: score the test split past its first N lines "
      "(the earlier rounds read at most the first 1000).")
  _VOCAB_LANGUAGES = flags.DEFINE_list(
      "vocab_languages", ["pt", "kk", "si", "ia"], "Languages of the trained "
      "vocabulary (the demo's), read from the selection train split.")
  _OOD_SENTENCES = flags.DEFINE_integer(
      "test_ood_sentences", 3000, "Final: score the first N test_ood lines "
      "(0: all; the pt split has about 15.7k).")
  _MIN_SEEDS = flags.DEFINE_integer(
      "min_selection_seeds", 3, "Final: refuse a pick with fewer selection "
      "seeds (run it with --mode=select --candidates=PICK --seeds=0,1,2 "
      "first); the dev gap is taken over the seeds both picks have.")
  _M4MOE_PICK = flags.DEFINE_string(
      "m4moe_candidate", None, "Final: m4moe's recipe (default: rank 1).")
  _PEER_PICK = flags.DEFINE_string(
      "peer_candidate", None, "Final: the peer's recipe (default: rank 1).")


def _sha256(path: pathlib.Path) -> str:
  return hashlib.sha256(path.read_bytes()).hexdigest()


def prepare_data(*, corpus_dir: pathlib.Path, run_dir: pathlib.Path,
                 language: str, permille: int) -> dict[str, Any]:
  """The selection corpus under ``run_dir/data`` (written once); manifest.

  Raises:
    ValueError: the run directory holds a selection corpus made with
      another language or carve.
  """
  manifest_path = run_dir / "data" / "manifest.json"
  if manifest_path.is_file():
    manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    if (manifest["language"], manifest["permille"]) != (language, permille):
      raise ValueError(f"{run_dir} holds a selection of --language="
                       f"{manifest['language']} --carve_permille="
                       f"{manifest['permille']}: use a new --run_dir")
    return manifest
  manifest = selection.write_selection_corpus(
      corpus_dir=corpus_dir, output_dir=run_dir / "data" / "selection_corpus",
      language=language, permille=permille)
  # Relative to the manifest's directory: the manifest is committed with
  # the selection's results and read on other machines.
  manifest["source_corpus"] = jsonfile.relative_path(
      corpus_dir, start=manifest_path.parent)
  toolkit.write_json(manifest_path, manifest)
  return manifest


def prepare_vocab(*, run_dir: pathlib.Path, vocab_dir: str | None,
                  core: str) -> pathlib.Path:
  """``--vocab_dir``, else a vocabulary of the selection train split."""
  if vocab_dir:
    return pathlib.Path(vocab_dir).resolve()
  out = run_dir / "data" / "vocab"
  if (out / "done.json").is_file():
    return out
  systems.run_pinned(
      [sys.executable, "-m", "m4moe.cli.vocab",
       f"--corpus_dir={run_dir / 'data' / 'selection_corpus'}",
       f"--output_dir={out}",
       f"--languages={','.join(_VOCAB_LANGUAGES.value)}",
       "--source_vocab_size=8000", "--target_vocab_size=8000",
       "--max_sentences=300000"],
      core=core, log=run_dir / "data" / "vocab.log", what="vocabulary")
  toolkit.write_json(out / "done.json",
                     {"languages": list(_VOCAB_LANGUAGES.value)})
  return out


def _expect(candidate: candidates_lib.Candidate, *, seed: int,
            budget: systems.Budget,
            manifest: dict[str, Any], vocab_dir: pathlib.Path
            ) -> dict[str, Any]:
  """What a finished record of this run must match to be reused."""
  return {"protocol": selection.PROTOCOL, "candidate": candidate.name,
          "system": candidate.system, "spec": candidate.to_dict(),
          "round": candidate.round, "base": candidate.base,
          "settings": list(candidate.settings()),
          "batch_tokens": candidate.batch_tokens, "seed": seed,
          **budget.to_dict(),
          "decoding": systems.Decoding().to_dict(),
          "dev_sha256": manifest["sha256"][f"dev/{manifest['language']}.tsv"],
          "vocab_sha256": _sha256(vocab_dir / "source.model")[:16] + ":" +
                          _sha256(vocab_dir / "target.model")[:16]}


_TRAIN_KEYS = ("steps", "tokens_per_sec", "target_tokens_per_sec",
               "target_tokens", "steps_per_sec", "train_seconds",
               "stopped_by", "logged_learning_rate",
               "logged_learning_rate_step")


def run_candidate(*, candidate: candidates_lib.Candidate, seed: int,
                  run_dir: pathlib.Path, data: systems.Data,
                  manifest: dict[str, Any], budget: systems.Budget, core: str,
                  peer_python: pathlib.Path | None) -> bool:
  """Runs one candidate and seed unless finished; True if it ran."""
  path = selection.record_path(run_dir, candidate.name, seed)
  expect = _expect(candidate, seed=seed, budget=budget, manifest=manifest,
                   vocab_dir=data.vocab_dir)
  if selection.finished(path, expect=expect):
    print(f"select: {path.name} finished earlier, skipped", flush=True)
    return False
  root = runs.fresh_dir(run_dir / "work" / f"{candidate.name}_s{seed}")
  print(f"select: {candidate.name} seed {seed}: {budget.to_dict()} on core "
        f"{core} ({root})", flush=True)
  started, commit = time.time(), runs.code_commit()  # the code that trains
  train, decoded = runs.train_and_decode(
      candidate=candidate, data=data, root=root, splits=("dev",),
      budget=budget, seed=seed, core=core, peer_python=peer_python)
  dev = decoded["dev"]
  record = {**expect, "why": candidate.why,
            "selected_on": selection.SELECTED_ON,
            "dev": {"bleu": round(dev.bleu, 2), "chrf": round(dev.chrf, 2),
                    "ce": train["dev_ce"], "sentences": dev.sentences},
            "train": {k: train.get(k) for k in _TRAIN_KEYS},
            "schedule_check": train["schedule_check"],
            "tokens_per_sec_definition": throughput.DEFINITION,
            "decode_sentences_per_sec": round(
                dev.sentences / max(dev.seconds, 1e-9), 3),
            "core": core, "wall_seconds": round(time.time() - started, 1),
            "loadavg_1m_at_end": round(os.getloadavg()[0], 2),
            "code_commit": commit}
  toolkit.write_json(path, record)
  flag = " (schedule flagged)" if train["schedule_check"]["flagged"] else ""
  print(f"select: {candidate.name} seed {seed}: dev BLEU {dev.bleu:.2f} "
        f"chrF++ {dev.chrf:.2f} CE {train['dev_ce']:.3f}, "
        f"{train['steps']} steps{flag}", flush=True)
  return True


def _budget_of(record: dict[str, Any]) -> dict[str, float]:
  return {k: record[k] for k in ("budget_seconds", "budget_steps",
                                 "budget_tokens") if k in record}


def _dev_resamples(run_dir: pathlib.Path, ranked: selection.Ranked, *,
                   references: list[str], language: str,
                   seeds: Sequence[int] | None = None
                   ) -> significance.Resamples | None:
  """The seed-mean of a candidate's dev BLEU resamples (None: no hyps).

  ``seeds``: only these of its seeds (default: all).
  """
  items = []
  for seed in (ranked.seeds if seeds is None else seeds):
    path = systems.hypotheses_path(
        run_dir / "work" / f"{ranked.candidate}_s{seed}", "dev", language)
    if not path.is_file():
      return None
    items.append(significance.resample(
        examples_lib.read_hypotheses(path), references, metric="bleu",
        target_lang="en"))
  return significance.mean_resamples(items)


def dev_differences(run_dir: pathlib.Path,
                    ranking: dict[str, list[selection.Ranked]], *,
                    language: str) -> dict[str, dict[str, Any]]:
  """Each candidate's dev BLEU minus its base's (paired bootstrap).

  The base is the candidate it changes (``Ranked.base``). Reads the
  selection dev set and the runs' dev hypotheses only.
  """
  (dev,) = testsets_lib.load_testsets(
      run_dir / "data" / "selection_corpus", split="dev", langs=[language])
  refs, out = list(dev.references), {}
  resamples = functools.cache(lambda r: _dev_resamples(
      run_dir, r, references=refs, language=language))
  for system, items in ranking.items():
    by_name = {r.candidate: r for r in items}
    for r in items:
      base = by_name.get(r.base) if r.base else None
      if base is None or base is r:
        continue
      mine, theirs = resamples(r), resamples(base)
      if mine is not None and theirs is not None:
        out[r.candidate] = {
            "base": base.candidate,
            **significance.paired_difference(mine, theirs).to_dict()}
  return out


def dev_gap(run_dir: pathlib.Path, picks: Mapping[str, selection.Ranked], *,
            language: str) -> dict[str, Any]:
  """m4moe's pick minus the peer's on dev, over the seeds both have.

  The paired bootstrap of the seed-mean dev BLEU (each seed's dev
  hypotheses resampled with the same sentence indices), the number the
  test gap is set beside.

  Raises:
    ValueError: the picks share no seed, or a dev hypothesis file is
      missing.
  """
  ours, peer = (picks[selection.SYSTEM_M4MOE], picks[selection.SYSTEM_PEER])
  seeds = sorted(set(ours.seeds) & set(peer.seeds))
  if not seeds:
    raise ValueError(f"{ours.candidate} (seeds {list(ours.seeds)}) and "
                     f"{peer.candidate} (seeds {list(peer.seeds)}) share no "
                     "selection seed: run --mode=select for both with the "
                     "same --seeds")
  (dev,) = testsets_lib.load_testsets(
      run_dir / "data" / "selection_corpus", split="dev", langs=[language])
  refs = list(dev.references)
  mine, theirs = (_dev_resamples(run_dir, r, references=refs,
                                 language=language, seeds=seeds)
                  for r in (ours, peer))
  if mine is None or theirs is None:
    raise ValueError(f"{run_dir / 'work'} lacks a dev hypothesis file of "
                     f"{ours.candidate} or {peer.candidate} (seeds {seeds})")
  return {"seeds": seeds, "metric": "bleu",
          **significance.paired_difference(mine, theirs).to_dict()}


def _picks_gap(run_dir: pathlib.Path,
               ranking: Mapping[str, Sequence[selection.Ranked]], *,
               language: str) -> dict[str, Any] | None:
  """The dev gap of the current rank-1 picks (None: not both ranked)."""
  if not all(ranking.get(s) for s in selection.SYSTEMS):
    return None
  picks = {s: ranking[s][0] for s in selection.SYSTEMS}
  try:
    gap = dev_gap(run_dir, picks, language=language)
  except ValueError as e:
    return {"m4moe": picks[selection.SYSTEM_M4MOE].candidate,
            "opennmt-tf": picks[selection.SYSTEM_PEER].candidate,
            "unavailable": str(e)}
  return {"m4moe": picks[selection.SYSTEM_M4MOE].candidate,
          "opennmt-tf": picks[selection.SYSTEM_PEER].candidate, **gap}


def write_table(run_dir: pathlib.Path, output_dir: pathlib.Path) -> None:
  """``selection.md`` and ``selection.json``: the dev-only ranking."""
  manifest = json.loads((run_dir / "data" / "manifest.json").read_text(
      encoding="utf-8"))
  records = selection.read_records(run_dir)
  budgets = sorted({json.dumps(_budget_of(r)) for r in records})
  ranking = selection.rank(records)
  differences = dev_differences(run_dir, ranking,
                                language=manifest["language"])
  gap = _picks_gap(run_dir, ranking, language=manifest["language"])
  text = selection.table_markdown(ranking, manifest=manifest,
                                  budgets=[json.loads(b) for b in budgets],
                                  differences=differences, picks_gap=gap)
  output_dir.mkdir(parents=True, exist_ok=True)
  (output_dir / "selection.md").write_text(text + "\n", encoding="utf-8")
  toolkit.write_json(output_dir / "selection.json", {
      "selected_on": selection.SELECTED_ON,
      "budgets": [json.loads(b) for b in budgets],
      "dev": manifest["dev"], "carve": manifest["rule"],
      "care": selection.care_counts(ranking),
      "planned": candidates_lib.counts(),
      "picks_dev_gap": gap,
      "ranking": {s: [r.to_dict() for r in items]
                  for s, items in ranking.items()},
      "bleu_minus_base": differences})


def _seeds() -> list[int]:
  if _SEEDS.value is None:
    return list(DEFAULT_SEEDS[_MODE.value])
  try:
    seeds = [int(s) for s in _SEEDS.value]
  except ValueError as e:
    raise app.UsageError(f"--seeds={','.join(_SEEDS.value)}: list integers"
                         ) from e
  if not seeds or len(set(seeds)) != len(seeds):
    raise app.UsageError("--seeds: give at least one seed, each once")
  return seeds


def _required(*names: str) -> None:
  for name in names:
    if not flags.FLAGS[name].value:
      raise app.UsageError(f"--{name} is required with --mode={_MODE.value}")


def _select_budget() -> systems.Budget:
  try:
    return systems.Budget(tokens=_BUDGET_TOKENS.value or DEFAULT_BUDGET_TOKENS)
  except ValueError as e:
    raise app.UsageError(f"--budget_tokens={_BUDGET_TOKENS.value}: use a "
                         "positive number of tokens") from e


def _select_plan() -> tuple[list[int], list[str]]:
  """``--rounds`` and ``--candidates``, checked before anything runs."""
  try:
    rounds = [int(r) for r in _ROUNDS.value]
  except ValueError:
    rounds = []
  if not rounds or not set(rounds) <= set(candidates_lib.ROUNDS):
    raise app.UsageError(f"--rounds={','.join(_ROUNDS.value)}: list rounds "
                         "among 1,2,3")
  known = candidates_lib.all_names()
  unknown = [n for n in _CANDIDATES.value if n not in known]
  if unknown:
    raise app.UsageError(f"--candidates: unknown {unknown}; known: "
                         f"{', '.join(known)}")
  return rounds, list(_CANDIDATES.value)


def _run_rounds(*, rounds: Sequence[int], names: Sequence[str],
                seeds: Sequence[int], run_dir: pathlib.Path,
                data: systems.Data, manifest: dict[str, Any],
                budget: systems.Budget, core: str,
                peer_python: pathlib.Path | None) -> None:
  """Every round in order, each built on the records finished before it."""
  for round_ in rounds:
    queue = selection.round_queue(selection.read_records(run_dir), round_)
    for candidate in queue:
      if names and candidate.name not in names:
        continue
      for seed in seeds:
        if run_candidate(candidate=candidate, seed=seed, run_dir=run_dir,
                         data=data, manifest=manifest, budget=budget,
                         core=core, peer_python=peer_python):
          write_table(run_dir, run_dir)


def main_select() -> None:
  _required("corpus_dir", "run_dir")
  budget = _select_budget()
  if not _CORE.value.isdigit():
    raise app.UsageError(f"--core={_CORE.value}: give one CPU number")
  seeds = _seeds()
  rounds, names = _select_plan()
  run_dir = pathlib.Path(_RUN_DIR.value).resolve()
  peer_python = None
  try:
    selection.require_protocol(selection.read_records(run_dir),
                               run_dir=run_dir)
    if not names or any(candidates_lib.all_names()[n] ==
                        selection.SYSTEM_PEER for n in names):
      venv = systems.onmt_venv(_ONMT_VENV.value)
      peer_python = toolkit.ensure_venv(venv, log=run_dir / "onmt_venv.log")
    manifest = prepare_data(
        corpus_dir=pathlib.Path(_CORPUS_DIR.value).resolve(),
        run_dir=run_dir, language=_LANGUAGE.value, permille=_CARVE.value)
    vocab = prepare_vocab(run_dir=run_dir, vocab_dir=_VOCAB_DIR.value,
                          core=_CORE.value)
    data = systems.Data(corpus_dir=run_dir / "data" / "selection_corpus",
                        vocab_dir=vocab, language=_LANGUAGE.value)
    _run_rounds(rounds=rounds, names=names, seeds=seeds, run_dir=run_dir,
                data=data, manifest=manifest, budget=budget, core=_CORE.value,
                peer_python=peer_python)
    write_table(run_dir, run_dir)
  except (toolkit.PeerError, OSError, ValueError) as e:
    sys.exit(f"select: error: {e}")
  print(f"select: queue done; table in {run_dir / 'selection.md'}",
        flush=True)


def main_table() -> None:
  _required("run_dir")
  run_dir = pathlib.Path(_RUN_DIR.value).resolve()
  output_dir = pathlib.Path(_OUTPUT_DIR.value or run_dir).resolve()
  if not (run_dir / "data" / "manifest.json").is_file():
    raise app.UsageError(f"--run_dir={run_dir} holds no selection: run "
                         "--mode=select there first")
  try:
    write_table(run_dir, output_dir)
  except (OSError, ValueError, KeyError) as e:
    sys.exit(f"select: error: {e}")
  print(f"Wrote {output_dir / 'selection.md'}", flush=True)


def main_final() -> None:
  _required("corpus_dir", "run_dir")
  seeds, cores = _seeds(), list(_CORES.value)
  if len(cores) != 2 or not all(c.isdigit() for c in cores):
    raise app.UsageError("--cores: give two CPU numbers, e.g. 0,1")
  if len(seeds) < MIN_FINAL_SEEDS:
    raise app.UsageError(f"--seeds={','.join(map(str, seeds))}: the final "
                         f"comparison needs at least {MIN_FINAL_SEEDS} "
                         "seeds, e.g. 0,1,2 (the default)")
  run_dir = pathlib.Path(_RUN_DIR.value).resolve()
  output_dir = pathlib.Path(_OUTPUT_DIR.value or run_dir / "final").resolve()
  try:
    picks, specs, budget = final_runs.picks_and_budget(
        run_dir, names={selection.SYSTEM_M4MOE: _M4MOE_PICK.value,
                        selection.SYSTEM_PEER: _PEER_PICK.value},
        min_seeds=_MIN_SEEDS.value, budget_tokens=_BUDGET_TOKENS.value)
    peer_python = toolkit.ensure_venv(systems.onmt_venv(_ONMT_VENV.value),
                                      log=run_dir / "onmt_venv.log")
    manifest = json.loads((run_dir / "data" / "manifest.json").read_text(
        encoding="utf-8"))
    splits = selection.write_final_corpus(
        selection_dir=run_dir / "data" / "selection_corpus",
        corpus_dir=pathlib.Path(_CORPUS_DIR.value).resolve(),
        output_dir=run_dir / "final" / "corpus", language=manifest["language"],
        test_skip=_TEST_SKIP.value, ood_sentences=_OOD_SENTENCES.value)
    data = systems.Data(
        corpus_dir=run_dir / "final" / "corpus",
        vocab_dir=prepare_vocab(run_dir=run_dir, vocab_dir=_VOCAB_DIR.value,
                                core=cores[0]),
        language=manifest["language"])
    done = final_runs.run_all(
        specs=specs, seeds=seeds, cores=cores, run_dir=run_dir, data=data,
        budget=budget, peer_python=peer_python)
    value = final_runs.assemble(
        picks=picks, runs=done, run_dir=run_dir, data=data, splits=splits,
        budget=budget, cores=cores, manifest=manifest,
        dev_gap=dev_gap(run_dir, picks, language=manifest["language"]))
  except (toolkit.PeerError, OSError, ValueError) as e:
    sys.exit(f"select: error: {e}")
  toolkit.write_json(output_dir / "peer.json", value)
  (output_dir / "peer.md").write_text(final.markdown(value),
                                      encoding="utf-8")
  for line in final.warnings(value):
    print(f"select: WARNING: {line}", flush=True)
  print(f"Wrote {output_dir / 'peer.json'}", flush=True)


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  modes = {"select": main_select, "table": main_table, "final": main_final}
  modes[_MODE.value]()


def run() -> None:
  _define_flags()
  app.run(main)


if __name__ == "__main__":
  run()
