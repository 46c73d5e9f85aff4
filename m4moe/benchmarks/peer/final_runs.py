"""The final comparison's runs: both picks, every seed, the selection's budget.

A recipe selected at one budget and reported at another measures the
budget (a schedule cut inside its warmup, a decay never reached), so the
final trains each pick at exactly the token budget its selection records
recorded, with the schedule built for it, and refuses any other
(:func:`picks_and_budget`). Both systems run at once, m4moe on the first
core and the peer on the second, once per seed (:func:`run_all`); each run
is decoded with the one decoding config of both
(``systems.Decoding``) and its schedule is checked (``schedules.check``).
:func:`assemble` hands everything to ``final.report`` for ``peer.json``.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import pathlib
import shutil
from typing import Any, Mapping, Sequence

from m4moe.benchmarks.peer import candidates as candidates_lib
from m4moe.benchmarks.peer import final
from m4moe.benchmarks.peer import runs as runs_lib
from m4moe.benchmarks.peer import selection
from m4moe.benchmarks.peer import systems
from m4moe.benchmarks.peer import throughput
from m4moe.benchmarks.peer import toolkit
from m4moe.eval import examples as examples_lib
from m4moe.eval import significance
from m4moe.eval import testsets as testsets_lib
from m4moe.training import metrics_log

Picks = dict[str, selection.Ranked]
Specs = dict[str, candidates_lib.Candidate]


def _recorded_budget(records: Sequence[Mapping[str, Any]], picks: Picks,
                     run_dir: pathlib.Path) -> int:
  """The one token budget the picks' selection records name."""
  names = {p.candidate for p in picks.values()}
  budgets = {r.get("budget_tokens") for r in records
             if r["candidate"] in names}
  if len(budgets) != 1 or None in budgets:
    raise ValueError(f"the picks {sorted(names)} were selected at budgets "
                     f"{sorted(map(str, budgets))} ({run_dir / 'candidates'})"
                     ": select them again at one --budget_tokens")
  return int(budgets.pop())


def picks_and_budget(run_dir: pathlib.Path, *,
                     names: Mapping[str, str | None], min_seeds: int,
                     budget_tokens: int | None
                     ) -> tuple[Picks, Specs, systems.Budget]:
  """Each system's pick (rank 1 on dev unless named), spec and the budget.

  Raises:
    ValueError: records of the earlier protocol; a pick with fewer than
      ``min_seeds`` selection seeds; ``budget_tokens`` given and not the
      budget the picks were selected at (names the flag and the fix).
  """
  records = selection.read_records(run_dir)
  selection.require_protocol(records, run_dir=run_dir)
  ranking = selection.rank(records)
  picks = {s: selection.chosen(ranking, s, name=names.get(s))
           for s in selection.SYSTEMS}
  for pick in picks.values():
    if len(pick.seeds) < min_seeds:
      raise ValueError(
          f"{pick.candidate} (rank {pick.rank} of {pick.system} on dev) has "
          f"{len(pick.seeds)} selection seed(s), fewer than "
          f"--min_selection_seeds={min_seeds}: run --mode=select "
          f"--candidates={pick.candidate} --seeds=0,1,2 first")
  recorded = _recorded_budget(records, picks, run_dir)
  if budget_tokens is not None and budget_tokens != recorded:
    raise ValueError(
        f"--budget_tokens={budget_tokens} is not the budget the picks were "
        f"selected at ({recorded} tokens, recorded in "
        f"{run_dir / 'candidates'}): a recipe chosen at one budget and "
        f"reported at another measures the budget. Drop --budget_tokens "
        f"(the final takes the selection's), or select again with "
        f"--budget_tokens={budget_tokens} in a new --run_dir")
  specs = {s: selection.spec_of(records, p.candidate)
           for s, p in picks.items()}
  return picks, specs, systems.Budget(tokens=recorded)


def _expect(candidate: candidates_lib.Candidate, *, seed: int,
            budget: systems.Budget) -> dict[str, Any]:
  return {"system": candidate.system, "candidate": candidate.name,
          "spec": candidate.to_dict(), "seed": seed, **budget.to_dict(),
          "decoding": systems.Decoding().to_dict()}


# Each system's own training logs, kept beside its final run record so that
# a divergent or degenerate seed can be examined from the results alone.
_LOGS = ("train.log", f"model/{metrics_log.METRICS_FILENAME}",
         throughput.PEER_STEPS_FILENAME)


def keep_logs(root: pathlib.Path, record_path: pathlib.Path
              ) -> dict[str, str]:
  """Copies the run's training logs next to its record; their names."""
  kept = {}
  for name in _LOGS:
    source = root / name
    if source.is_file():
      target = record_path.with_name(
          f"{record_path.stem}.{pathlib.Path(name).name}")
      shutil.copyfile(source, target)
      kept[pathlib.Path(name).name] = target.name
  return kept


def final_run(*, candidate: candidates_lib.Candidate, seed: int,
              run_dir: pathlib.Path, data: systems.Data,
              budget: systems.Budget, core: str,
              peer_python: pathlib.Path | None) -> dict[str, Any]:
  """One system and seed of the final comparison (reused when finished)."""
  path = run_dir / "final" / "runs" / f"{candidate.system}_s{seed}.json"
  expect = _expect(candidate, seed=seed, budget=budget)
  record = selection.finished_record(path, expect=expect)
  if record is not None:
    return record
  root = runs_lib.fresh_dir(
      run_dir / "final" / "work" / f"{candidate.system}_s{seed}")
  train, decoded = runs_lib.train_and_decode(
      candidate=candidate, data=data, root=root, splits=final.SPLITS,
      budget=budget, seed=seed, core=core, peer_python=peer_python)
  splits = {}
  for split, d in decoded.items():
    hyp_path = path.with_name(f"{path.stem}.{split}.hyp")
    systems.write_hypotheses(hyp_path, d.hypotheses)
    splits[split] = {"bleu": round(d.bleu, 2), "chrf": round(d.chrf, 2),
                     "sentences": d.sentences, "hypotheses": hyp_path.name,
                     "sentences_per_sec": round(d.sentences /
                                                max(d.seconds, 1e-9), 3)}
  record = {**expect, "core": core, "train": train,
            "schedule_check": train["schedule_check"], "splits": splits,
            "logs": keep_logs(root, path),
            "tokens_per_sec_definition": throughput.DEFINITION,
            "loadavg_1m_at_end": round(os.getloadavg()[0], 2),
            "code_commit": runs_lib.code_commit()}
  toolkit.write_json(path, record)
  return record


def run_all(*, specs: Specs, seeds: Sequence[int], cores: Sequence[str],
            run_dir: pathlib.Path, data: systems.Data,
            budget: systems.Budget, peer_python: pathlib.Path | None
            ) -> dict[str, list[dict[str, Any]]]:
  """Every seed: both systems at once, m4moe on cores[0], the peer on [1]."""
  out: dict[str, list[dict[str, Any]]] = {s: [] for s in specs}
  for seed in seeds:
    print(f"select: final seed {seed}: {budget.to_dict()} each on cores "
          f"{', '.join(cores)}", flush=True)
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
      futures = {
          system: pool.submit(
              final_run, candidate=spec, seed=seed, run_dir=run_dir,
              data=data, budget=budget, core=core, peer_python=peer_python)
          for (system, spec), core in zip(specs.items(), cores)}
      for system, future in futures.items():
        out[system].append(future.result())
  return out


def assemble(*, picks: Picks, runs: Mapping[str, Sequence[Mapping[str, Any]]],
             run_dir: pathlib.Path, data: systems.Data,
             splits: Mapping[str, Any], budget: systems.Budget,
             cores: Sequence[str], manifest: Mapping[str, Any],
             dev_gap: Mapping[str, Any],
             n_samples: int = significance.DEFAULT_SAMPLES) -> dict[str, Any]:
  """``peer.json`` from the finished runs (``final.report``)."""
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
  setup = {"language": data.language, "budget": budget.to_dict(),
           "cores": dict(zip(picks, cores)),
           "decoding": {s: items[0]["decoding"] for s, items in runs.items()},
           "tokens_per_sec_definition": throughput.DEFINITION,
           "selection": {"dev": manifest["dev"], "carve": manifest["rule"],
                         "care": selection.care_counts(selection.rank(
                             selection.read_records(run_dir))),
                         "planned": candidates_lib.counts()}}
  return final.report(picks=picks, runs=runs, hypotheses=hypotheses,
                      references=references, splits=splits, setup=setup,
                      dev_gap=dev_gap, n_samples=n_samples)
