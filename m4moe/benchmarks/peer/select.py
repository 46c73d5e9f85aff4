r"""Dev-only recipe selection for m4moe and OpenNMT-tf, then the final match.

  # Screen candidates (one at a time, pinned to --core), resumable:
  taskset -c 1 nice -n 0 python -m m4moe.benchmarks.peer.select \
      --mode=select --corpus_dir=CORPUS --run_dir=RUN --core=1 \
      --onmt_venv=VENV --budget_steps=1000 [--candidates=a,b] [--seeds=0]
  # The dev-only ranking table from the finished candidates:
  python -m m4moe.benchmarks.peer.select --mode=table --run_dir=RUN \
      --output_dir=OUT
  # The comparison on sentences no selection read (both systems at once,
  # one core each, equal wall-clock, every seed):
  python -m m4moe.benchmarks.peer.select --mode=final --corpus_dir=CORPUS \
      --run_dir=RUN --onmt_venv=VENV --budget_seconds=800 --seeds=0,1 \
      --output_dir=OUT

What each mode reads:

* ``select``: ``CORPUS/train/*.tsv`` and ``CORPUS/dev/<lang>.tsv`` once, to
  write ``RUN/data/selection_corpus`` (train minus the dev carve; the dev
  set; no test split: see ``selection.py``), then only that copy. Trains
  ``RUN/data/vocab`` on its train split unless ``--vocab_dir`` is given.
  Each candidate and seed trains for ``--budget_steps`` (batches of 4096
  tokens; other batch sizes train as many tokens) or ``--budget_seconds``
  and is scored on the dev set (BLEU and chrF++ with beam 4, dev CE),
  written to ``RUN/candidates/<name>_s<seed>.json``; a finished one is
  skipped on the next run, an interrupted one restarts (its directory is
  kept as ``*.abandoned-N``). The table is rewritten after each candidate.
* ``table``: the candidate JSONs, the selection dev set and the runs' dev
  hypotheses (for the paired bootstrap against each system's centre).
* ``final``: the candidate JSONs (the systems' picks: rank 1 on dev unless
  ``--m4moe_candidate``/``--peer_candidate``), the selection corpus, and
  ``CORPUS/test/<lang>.tsv`` past its first ``--test_skip`` lines and
  ``CORPUS/test_ood/<lang>.tsv``. Writes ``OUT/peer.json``.

Nothing is written into the repository unless ``--output_dir`` points there.
"""

from __future__ import annotations

import concurrent.futures
import functools
import hashlib
import json
import os
import pathlib
import subprocess
import sys
import time
from typing import Any, Sequence

from absl import app
from absl import flags

from m4moe import jsonfile
from m4moe.benchmarks.peer import final
from m4moe.benchmarks.peer import selection
from m4moe.benchmarks.peer import systems
from m4moe.benchmarks.peer import toolkit
from m4moe.eval import examples as examples_lib
from m4moe.eval import significance
from m4moe.eval import testsets as testsets_lib

def _define_flags() -> None:
  """The tool's flags, defined only when it runs as a program.

  Its flag names (``--corpus_dir``, ``--run_dir``, ...) are shared with
  other m4moe tools; defining them at import would clash in any process
  that imports this module and one of those (the test suite does).
  """
  global _MODE, _CORPUS_DIR, _RUN_DIR, _VOCAB_DIR, _LANGUAGE, _CARVE
  global _CANDIDATES, _SEEDS, _BUDGET, _BUDGET_STEPS
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
      "candidates", [], "Candidates to run, in order (default: the whole "
      "queue of selection.CANDIDATES).")
  _SEEDS = flags.DEFINE_list("seeds", ["0"], "Seeds of every candidate "
                             "(select) or system (final: at least two).")
  _BUDGET = flags.DEFINE_float(
      "budget_seconds", None, "Training wall-clock per run (final: required "
      "unless the selection ran on seconds; select: instead of "
      "--budget_steps).")
  _BUDGET_STEPS = flags.DEFINE_integer(
      "budget_steps", None, "Select: training steps per run, in batches of "
      "4096 tokens (default 1000 unless --budget_seconds).")
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
      "min_selection_seeds", 2, "Final: refuse a pick with fewer selection "
      "seeds (run it with --mode=select --seeds=0,1 first).")
  _M4MOE_PICK = flags.DEFINE_string(
      "m4moe_candidate", None, "Final: m4moe's recipe (default: rank 1).")
  _PEER_PICK = flags.DEFINE_string(
      "peer_candidate", None, "Final: the peer's recipe (default: rank 1).")


DEFAULT_SELECT_STEPS = 1000


def _sha256(path: pathlib.Path) -> str:
  return hashlib.sha256(path.read_bytes()).hexdigest()


def _code_commit() -> str | None:
  done = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True,
                        text=True, check=False,
                        cwd=pathlib.Path(__file__).resolve().parent)
  return done.stdout.strip() or None


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


def _fresh_dir(path: pathlib.Path) -> pathlib.Path:
  """``path``, after moving an interrupted earlier attempt aside."""
  if path.exists():
    n = 1
    while path.with_name(f"{path.name}.abandoned-{n}").exists():
      n += 1
    path.rename(path.with_name(f"{path.name}.abandoned-{n}"))
  path.mkdir(parents=True)
  return path


def _peer_objects(candidate: selection.Candidate
                  ) -> tuple[toolkit.PeerRecipe, toolkit.PeerModel]:
  values = candidate.peer_settings()
  recipe = toolkit.PeerRecipe(
      learning_rate=values["learning_rate"],
      warmup_steps=int(values["warmup_steps"]),
      label_smoothing=values["label_smoothing"],
      batch_tokens=candidate.batch_tokens, max_length=systems.MAX_LENGTH,
      beam_size=systems.BEAM_SIZE, length_penalty=systems.ALPHA,
      decode_batch_size=systems.DECODE_BATCH)
  return recipe, toolkit.PeerModel(dropout=values["dropout"])


def train_and_decode(*, candidate: selection.Candidate, data: systems.Data,
                     root: pathlib.Path, splits: Sequence[str],
                     budget: systems.Budget, seed: int, core: str,
                     peer_python: pathlib.Path | None
                     ) -> tuple[dict[str, Any], dict[str, systems.Decoded]]:
  """Trains one candidate and decodes each of ``splits`` of ``data``."""
  decoded = {}
  if candidate.system == selection.SYSTEM_M4MOE:
    train = systems.train_m4moe(
        data=data, root=root, config="tiny/dense",
        flags=(*selection.M4MOE_BASE, *candidate.settings),
        batch_tokens=candidate.batch_tokens, budget=budget,
        seed=seed, core=core)
    for split in splits:
      decoded[split] = systems.decode_m4moe(data=data, root=root, split=split,
                                            name=candidate.name, core=core)
    return train, decoded
  if peer_python is None:
    raise toolkit.PeerError("the peer needs --onmt_venv")
  recipe, model = _peer_objects(candidate)
  systems.prepare_peer(data=data, root=root, recipe=recipe, model=model,
                       budget=budget)
  train = systems.train_peer(python=peer_python, root=root,
                             budget=budget, seed=seed,
                             core=core)
  for split in splits:
    (testset,) = testsets_lib.load_testsets(data.corpus_dir, split=split,
                                            langs=[data.language])
    decoded[split] = systems.decode_peer(
        python=peer_python, data=data, root=root, testset=testset,
        split=split, name=candidate.name, seed=seed, core=core)
  return train, decoded


def _expect(candidate: selection.Candidate, *, seed: int,
            budget: systems.Budget,
            manifest: dict[str, Any], vocab_dir: pathlib.Path
            ) -> dict[str, Any]:
  """What a finished record of this run must match to be reused."""
  return {"candidate": candidate.name, "system": candidate.system,
          "settings": list(candidate.settings),
          "batch_tokens": candidate.batch_tokens, "seed": seed,
          **budget.to_dict(),
          "dev_sha256": manifest["sha256"][f"dev/{manifest['language']}.tsv"],
          "vocab_sha256": _sha256(vocab_dir / "source.model")[:16] + ":" +
                          _sha256(vocab_dir / "target.model")[:16]}


def run_candidate(*, candidate: selection.Candidate, seed: int,
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
  root = _fresh_dir(run_dir / "work" / f"{candidate.name}_s{seed}")
  print(f"select: {candidate.name} seed {seed}: {budget.to_dict()} on core "
        f"{core} ({root})", flush=True)
  started, commit = time.time(), _code_commit()  # the code that trains
  train, decoded = train_and_decode(
      candidate=candidate, data=data, root=root, splits=("dev",),
      budget=budget, seed=seed, core=core, peer_python=peer_python)
  dev = decoded["dev"]
  record = {**expect, "why": candidate.why,
            "selected_on": selection.SELECTED_ON,
            "dev": {"bleu": round(dev.bleu, 2), "chrf": round(dev.chrf, 2),
                    "ce": train["dev_ce"], "sentences": dev.sentences},
            "train": {k: train[k] for k in ("steps", "tokens_per_sec",
                                            "steps_per_sec", "train_seconds",
                                            "stopped_by")},
            "decode_sentences_per_sec": round(
                dev.sentences / max(dev.seconds, 1e-9), 3),
            "core": core, "wall_seconds": round(time.time() - started, 1),
            "loadavg_1m_at_end": round(os.getloadavg()[0], 2),
            "code_commit": commit}
  toolkit.write_json(path, record)
  print(f"select: {candidate.name} seed {seed}: dev BLEU {dev.bleu:.2f} "
        f"chrF++ {dev.chrf:.2f} CE {train['dev_ce']:.3f}, "
        f"{train['steps']} steps", flush=True)
  return True


def _budget_of(record: dict[str, Any]) -> dict[str, float]:
  return {k: record[k] for k in ("budget_seconds", "budget_steps")
          if k in record}


def _dev_resamples(run_dir: pathlib.Path, ranked: selection.Ranked, *,
                   references: list[str], language: str
                   ) -> significance.Resamples | None:
  """The seed-mean of a candidate's dev BLEU resamples (None: no hyps)."""
  items = []
  for seed in ranked.seeds:
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

  The base is the candidate it changes (``selection.base_of``). Reads the
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
      base = by_name.get(selection.base_of(r.candidate, system))
      if base is None or base is r:
        continue
      mine, theirs = resamples(r), resamples(base)
      if mine is not None and theirs is not None:
        out[r.candidate] = {
            "base": base.candidate,
            **significance.paired_difference(mine, theirs).to_dict()}
  return out


def write_table(run_dir: pathlib.Path, output_dir: pathlib.Path) -> None:
  """``selection.md`` and ``selection.json``: the dev-only ranking."""
  manifest = json.loads((run_dir / "data" / "manifest.json").read_text(
      encoding="utf-8"))
  records = selection.read_records(run_dir)
  budgets = sorted({json.dumps(_budget_of(r)) for r in records})
  ranking = selection.rank(records)
  differences = dev_differences(run_dir, ranking,
                                language=manifest["language"])
  text = selection.table_markdown(ranking, manifest=manifest,
                                  budgets=[json.loads(b) for b in budgets],
                                  differences=differences)
  output_dir.mkdir(parents=True, exist_ok=True)
  (output_dir / "selection.md").write_text(text + "\n", encoding="utf-8")
  toolkit.write_json(output_dir / "selection.json", {
      "selected_on": selection.SELECTED_ON,
      "budgets": [json.loads(b) for b in budgets],
      "dev": manifest["dev"], "carve": manifest["rule"],
      "ranking": {s: [r.to_dict() for r in items]
                  for s, items in ranking.items()},
      "bleu_minus_base": differences})


def _seeds() -> list[int]:
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


def main_select() -> None:
  _required("corpus_dir", "run_dir")
  try:
    budget = systems.Budget(
        seconds=_BUDGET.value or 0.0,
        steps=_BUDGET_STEPS.value or (0 if _BUDGET.value else
                                      DEFAULT_SELECT_STEPS))
  except ValueError as e:
    raise app.UsageError(str(e)) from e
  if not _CORE.value.isdigit():
    raise app.UsageError(f"--core={_CORE.value}: give one CPU number")
  seeds = _seeds()
  try:
    queue = selection.candidates_by_name(_CANDIDATES.value)
  except ValueError as e:
    raise app.UsageError(str(e)) from e
  run_dir = pathlib.Path(_RUN_DIR.value).resolve()
  peer_python = None
  try:
    if any(c.system == selection.SYSTEM_PEER for c in queue):
      venv = systems.onmt_venv(_ONMT_VENV.value)
      peer_python = toolkit.ensure_venv(venv, log=run_dir / "onmt_venv.log")
    manifest = prepare_data(
        corpus_dir=pathlib.Path(_CORPUS_DIR.value).resolve(),
        run_dir=run_dir, language=_LANGUAGE.value, permille=_CARVE.value)
    vocab = prepare_vocab(run_dir=run_dir, vocab_dir=_VOCAB_DIR.value,
                          core=_CORE.value)
    data = systems.Data(corpus_dir=run_dir / "data" / "selection_corpus",
                        vocab_dir=vocab, language=_LANGUAGE.value)
    for candidate in queue:
      for seed in seeds:
        if run_candidate(candidate=candidate, seed=seed, run_dir=run_dir,
                         data=data, manifest=manifest, budget=budget,
                         core=_CORE.value, peer_python=peer_python):
          write_table(run_dir, run_dir)
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


def final_run(*, candidate: selection.Candidate, seed: int,
              run_dir: pathlib.Path, data: systems.Data, budget: float,
              core: str, peer_python: pathlib.Path | None) -> dict[str, Any]:
  """One system and seed of the final comparison (reused when finished)."""
  path = run_dir / "final" / "runs" / f"{candidate.system}_s{seed}.json"
  if path.is_file():
    record = json.loads(path.read_text(encoding="utf-8"))
    if (record["candidate"], record["budget_seconds"]) == (candidate.name,
                                                           budget):
      return record
    raise ValueError(f"{path} ran {record['candidate']} for "
                     f"{record['budget_seconds']} s: use a new --run_dir")
  root = _fresh_dir(run_dir / "final" / "work" / f"{candidate.system}_s{seed}")
  train, decoded = train_and_decode(
      candidate=candidate, data=data, root=root, splits=final.SPLITS,
      budget=systems.Budget(seconds=budget), seed=seed, core=core,
      peer_python=peer_python)
  splits = {}
  for split, d in decoded.items():
    hyp_path = path.with_name(f"{path.stem}.{split}.hyp")
    hyp_path.parent.mkdir(parents=True, exist_ok=True)
    hyp_path.write_text("".join(h + "\n" for h in d.hypotheses),
                        encoding="utf-8")
    splits[split] = {"bleu": round(d.bleu, 2), "chrf": round(d.chrf, 2),
                     "sentences": d.sentences, "hypotheses": hyp_path.name,
                     "sentences_per_sec": round(d.sentences /
                                                max(d.seconds, 1e-9), 3)}
  record = {"system": candidate.system, "candidate": candidate.name,
            "seed": seed, "budget_seconds": budget, "core": core,
            "train": train, "splits": splits,
            "loadavg_1m_at_end": round(os.getloadavg()[0], 2),
            "code_commit": _code_commit()}
  toolkit.write_json(path, record)
  return record


def _final_setup(run_dir: pathlib.Path
                 ) -> tuple[dict[str, selection.Ranked], float]:
  """The systems' picks (rank 1 on dev unless named) and the budget."""
  ranking = selection.rank(selection.read_records(run_dir))
  picks = {selection.SYSTEM_M4MOE: selection.chosen(
               ranking, selection.SYSTEM_M4MOE, name=_M4MOE_PICK.value),
           selection.SYSTEM_PEER: selection.chosen(
               ranking, selection.SYSTEM_PEER, name=_PEER_PICK.value)}
  for pick in picks.values():
    if len(pick.seeds) < _MIN_SEEDS.value:
      raise ValueError(
          f"{pick.candidate} (rank {pick.rank} of {pick.system} on dev) has "
          f"{len(pick.seeds)} selection seed(s), fewer than "
          f"--min_selection_seeds={_MIN_SEEDS.value}: run --mode=select "
          f"--candidates={pick.candidate} --seeds=0,1 first")
  budgets = {r.get("budget_seconds") for r in selection.read_records(run_dir)
             if r["candidate"] in {p.candidate for p in picks.values()}}
  budget = _BUDGET.value or (budgets.pop() if len(budgets) == 1 else None)
  if not budget or budget <= 0:
    raise app.UsageError("--budget_seconds: give the comparison's positive "
                         "wall-clock (the selection ran on steps)")
  return picks, budget


def main_final() -> None:
  _required("corpus_dir", "run_dir")
  seeds, cores = _seeds(), list(_CORES.value)
  if len(cores) != 2 or not all(c.isdigit() for c in cores):
    raise app.UsageError("--cores: give two CPU numbers, e.g. 0,1")
  if len(seeds) < 2:
    raise app.UsageError(f"--seeds={','.join(map(str, seeds))}: the final "
                         "comparison needs at least two seeds, e.g. 0,1")
  run_dir = pathlib.Path(_RUN_DIR.value).resolve()
  output_dir = pathlib.Path(_OUTPUT_DIR.value or run_dir / "final").resolve()
  try:
    picks, budget = _final_setup(run_dir)
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
    runs = _final_runs(picks=picks, seeds=seeds, cores=cores, run_dir=run_dir,
                       data=data, budget=budget, peer_python=peer_python)
    value = _final_report(picks=picks, runs=runs, run_dir=run_dir, data=data,
                          splits=splits, budget=budget, cores=cores,
                          manifest=manifest)
  except (toolkit.PeerError, OSError, ValueError) as e:
    sys.exit(f"select: error: {e}")
  toolkit.write_json(output_dir / "peer.json", value)
  print(f"Wrote {output_dir / 'peer.json'}", flush=True)


def _final_runs(*, picks: dict[str, selection.Ranked], seeds: list[int],
                cores: list[str], run_dir: pathlib.Path, data: systems.Data,
                budget: float, peer_python: pathlib.Path
                ) -> dict[str, list[dict[str, Any]]]:
  """Every seed: both systems at once, m4moe on cores[0], the peer on [1]."""
  runs: dict[str, list[dict[str, Any]]] = {s: [] for s in picks}
  for seed in seeds:
    print(f"select: final seed {seed}: {budget:.0f} s each on cores "
          f"{', '.join(cores)}", flush=True)
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
      futures = {
          system: pool.submit(
              final_run, candidate=selection.candidates_by_name(
                  [pick.candidate])[0], seed=seed, run_dir=run_dir, data=data,
              budget=budget, core=core, peer_python=peer_python)
          for (system, pick), core in zip(picks.items(), cores)}
      for system, future in futures.items():
        runs[system].append(future.result())
  return runs


def _final_report(*, picks: dict[str, selection.Ranked],
                  runs: dict[str, list[dict[str, Any]]],
                  run_dir: pathlib.Path, data: systems.Data,
                  splits: dict[str, Any], budget: float, cores: list[str],
                  manifest: dict[str, Any]) -> dict[str, Any]:
  references = {
      split: list(testsets_lib.load_testsets(
          data.corpus_dir, split=split, langs=[data.language])[0].references)
      for split in final.SPLITS}
  hypotheses = {
      system: {split: [examples_lib.read_hypotheses(
          run_dir / "final" / "runs" / r["splits"][split]["hypotheses"])
                       for r in items]
               for split in final.SPLITS}
      for system, items in runs.items()}
  setup = {"language": data.language, "budget_seconds": budget,
           "cores": {s: c for s, c in zip(picks, cores)},
           "selection": {"dev": manifest["dev"], "carve": manifest["rule"]}}
  return final.report(picks=picks, runs=runs, hypotheses=hypotheses,
                      references=references, splits=splits, setup=setup)


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
