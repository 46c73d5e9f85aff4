"""Dev-only recipe selection for the peer yardstick: data, candidates, ranking.

A recipe chosen by its score on test sentences makes every later score on
those sentences optimistic, and a comparison in which only one system was
tuned measures the tuning. So both systems' recipes are chosen here on a
selection dev set only, with the same budget per candidate, and the final
comparison (``select.py --mode=final``) then scores test sentences that no
selection has read.

The selection dev set (:func:`write_selection_corpus`) is the corpus's own
dev split of the language followed by a slice carved from its train split:
every pair whose English near-duplicate group (``m4moe.data.split``'s group
id, so paraphrases of one English string fall together) hashes, salted with
:data:`CARVE_SALT`, into the lowest ``permille`` of 1000 buckets. The carve
is removed from the train split of *every* language, so no carved English
string trains a model or a vocabulary. The selection corpus has no test
directory at all: the selection reads nothing else.

Nothing here imports TensorFlow.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import pathlib
from typing import Any, Iterable, Mapping, Sequence

from m4moe.benchmarks.peer import candidates as candidates_lib
from m4moe.data import split as split_lib
from m4moe.eval import dev_ranking

SYSTEM_M4MOE = candidates_lib.SYSTEM_M4MOE
SYSTEM_PEER = candidates_lib.SYSTEM_PEER
SYSTEMS = candidates_lib.SYSTEMS
# Records of this selection protocol (equal token budget, schedules stated
# for it, equal rounds) carry it; earlier records have none.
PROTOCOL = 2
CARVE_SALT = "m4moe-peer-selection-dev"
DEFAULT_CARVE_PERMILLE = 10
SELECTED_ON = "dev"


def carved(english: str, *, permille: int) -> bool:
  """Whether the pair with this English side belongs to the dev carve."""
  key = f"{CARVE_SALT}:{split_lib.group_id(english)}".encode("utf-8")
  return int(hashlib.sha256(key).hexdigest()[:8], 16) % 1000 < permille


def _read_lines(path: pathlib.Path) -> list[str]:
  with open(path, encoding="utf-8") as f:
    return [line for line in f if line.strip()]


def _english(line: str) -> str:
  return line.split("\t", 1)[0]


def _write_lines(path: pathlib.Path, lines: Iterable[str]) -> str:
  """Writes lines atomically; returns the file's sha256."""
  path.parent.mkdir(parents=True, exist_ok=True)
  text = "".join(lines)
  tmp = path.with_suffix(path.suffix + ".tmp")
  tmp.write_text(text, encoding="utf-8")
  tmp.replace(path)
  return hashlib.sha256(text.encode("utf-8")).hexdigest()


def write_selection_corpus(*, corpus_dir: pathlib.Path,
                           output_dir: pathlib.Path, language: str,
                           permille: int) -> dict[str, Any]:
  """Writes the selection corpus: ``train/*.tsv`` minus the carve, ``dev``.

  Reads only ``corpus_dir/train/*.tsv`` and ``corpus_dir/dev/<language>.tsv``.
  ``output_dir/dev/<language>.tsv`` is the corpus dev split of ``language``
  followed by its carved train pairs (in file order).

  Returns:
    The manifest: the rule, pair counts and the written files' sha256.

  Raises:
    ValueError: ``permille`` outside 1..999, or a missing input file.
  """
  if not 0 < permille < 1000:
    raise ValueError(f"--carve_permille={permille}: use 1..999")
  dev_path = corpus_dir / "dev" / f"{language}.tsv"
  train_paths = sorted((corpus_dir / "train").glob("*.tsv"))
  if language not in {p.stem for p in train_paths} or not dev_path.is_file():
    raise ValueError(f"{corpus_dir} lacks train/{language}.tsv or "
                     f"dev/{language}.tsv: is --corpus_dir a corpus built "
                     f"with language {language!r}?")
  manifest: dict[str, Any] = {
      "rule": (f"pairs whose English group id g has int(sha256("
               f"'{CARVE_SALT}:' + g)[:8 hex], 16) % 1000 < {permille}, "
               "removed from every language's train split"),
      "permille": permille, "language": language, "train": {}, "sha256": {}}
  carve: list[str] = []
  for path in train_paths:
    lines = _read_lines(path)
    kept = [l for l in lines if not carved(_english(l), permille=permille)]
    if path.stem == language:
      carve = [l for l in lines if carved(_english(l), permille=permille)]
    manifest["train"][path.stem] = {"pairs": len(lines), "kept": len(kept),
                                    "carved": len(lines) - len(kept)}
    manifest["sha256"][f"train/{path.name}"] = _write_lines(
        output_dir / "train" / path.name, kept)
  dev_split = _read_lines(dev_path)
  manifest["dev"] = {"from_dev_split": len(dev_split),
                     "from_train_carve": len(carve),
                     "sentences": len(dev_split) + len(carve)}
  manifest["sha256"][f"dev/{language}.tsv"] = _write_lines(
      output_dir / "dev" / f"{language}.tsv", [*dev_split, *carve])
  return manifest


def write_final_corpus(*, selection_dir: pathlib.Path,
                       corpus_dir: pathlib.Path, output_dir: pathlib.Path,
                       language: str, test_skip: int,
                       ood_sentences: int) -> dict[str, Any]:
  """The final comparison's corpus: selection train/dev, unseen test.

  ``test/<language>.tsv`` holds the corpus test split past its first
  ``test_skip`` pairs (every selection this project ran read at most the
  first 1000), ``test_ood/<language>.tsv`` the first ``ood_sentences`` of
  the out-of-domain split (0: all of it).

  Raises:
    ValueError: a missing split file, or nothing left past ``test_skip``.
  """
  counts: dict[str, Any] = {"test_skip": test_skip}
  for split in ("train", "dev"):
    for path in sorted((selection_dir / split).glob("*.tsv")):
      _write_lines(output_dir / split / path.name, _read_lines(path))
  for split, skip in (("test", test_skip), ("test_ood", 0)):
    path = corpus_dir / split / f"{language}.tsv"
    if not path.is_file():
      raise ValueError(f"{path} does not exist: build the corpus with "
                       "--ood_packages=packaged for test_ood")
    lines = _read_lines(path)[skip:]
    if split == "test_ood" and ood_sentences > 0:
      lines = lines[:ood_sentences]
    if not lines:
      raise ValueError(f"{path}: no pairs past the first {skip}")
    counts[split] = {"sentences": len(lines), "first_line": skip + 1,
                     "sha256": _write_lines(output_dir / split / path.name,
                                            lines)}
  return counts


def record_path(run_dir: pathlib.Path, candidate: str, seed: int
                ) -> pathlib.Path:
  """Where one finished candidate run's JSON lives."""
  return run_dir / "candidates" / f"{candidate}_s{seed}.json"


def finished_record(path: pathlib.Path, *, expect: Mapping[str, Any]
                    ) -> dict[str, Any] | None:
  """The record at ``path`` of a finished run of exactly ``expect`` (None:
  no run there yet).

  Raises:
    ValueError: the record exists but was run with other settings, budget
      or dev set (a different selection: use another --run_dir).
  """
  if not path.is_file():
    return None
  record = json.loads(path.read_text(encoding="utf-8"))
  changed = sorted(k for k, v in expect.items() if record.get(k) != v)
  if changed:
    raise ValueError(f"{path} ran with other {', '.join(changed)}: use a "
                     "new --run_dir for a different selection or budget")
  return record


def finished(path: pathlib.Path, *, expect: Mapping[str, Any]) -> bool:
  """Whether ``path`` records a finished run of exactly ``expect``
  (:func:`finished_record`; the same error)."""
  return finished_record(path, expect=expect) is not None


def read_records(run_dir: pathlib.Path) -> list[dict[str, Any]]:
  """Every candidate record of ``run_dir`` scored on the selection dev set."""
  out = []
  for path in sorted((run_dir / "candidates").glob("*.json")):
    record = json.loads(path.read_text(encoding="utf-8"))
    if record.get("selected_on") == SELECTED_ON:
      out.append(record)
  return out


def require_protocol(records: Sequence[Mapping[str, Any]], *,
                     run_dir: pathlib.Path) -> None:
  """Refuses records of the earlier protocol for select and final.

  Raises:
    ValueError: a record lacks :data:`PROTOCOL` (names them and the fix).
  """
  old = sorted({r["candidate"] for r in records
                if r.get("protocol") != PROTOCOL})
  if old:
    raise ValueError(
        f"{run_dir / 'candidates'} holds {len(old)} candidate(s) of the "
        f"earlier protocol (a step or wall-clock budget, warmup in steps, "
        f"unequal rounds: {', '.join(old[:4])}{' ...' if len(old) > 4 else ''}"
        "); --mode=table still reads them, but --mode=select and "
        "--mode=final need this protocol's records: use a new --run_dir")


def spec_of(records: Sequence[Mapping[str, Any]], name: str
            ) -> candidates_lib.Candidate:
  """The candidate ``name`` as its record states it.

  Raises:
    ValueError: no record of ``name`` has a spec.
  """
  for record in records:
    if record["candidate"] == name and "spec" in record:
      return candidates_lib.Candidate.from_dict(record["spec"])
  raise ValueError(f"no record of candidate {name!r} with its spec: run "
                   "--mode=select for it first")


def round_queue(records: Sequence[Mapping[str, Any]], round_: int
                ) -> list[candidates_lib.Candidate]:
  """Both systems' candidates of ``round_``, built on their best so far.

  Rounds 2 and 3 change each system's rank-1 candidate on dev among the
  finished ones of the rounds before. Once a round has a finished record,
  its base stays the one that record names, so that later seeds of other
  candidates (which may reorder the earlier rounds) do not move a round
  that has started.

  Raises:
    ValueError: a system has no finished candidate of an earlier round.
  """
  out: list[candidates_lib.Candidate] = []
  ranking = rank(records, rounds=range(1, round_)) if round_ > 1 else {}
  for system in SYSTEMS:
    base = None
    if round_ > 1:
      started = [r["base"] for r in records if r["system"] == system
                 and r.get("round") == round_ and r.get("base")]
      if not started and not ranking.get(system):
        raise ValueError(f"round {round_} of {system} starts from its best "
                         f"finished candidate of rounds 1..{round_ - 1}, "
                         "and there is none: run --rounds=1 first")
      base = spec_of(records, started[0] if started
                     else ranking[system][0].candidate)
    out += candidates_lib.round_candidates(system, round_, base)
  return out


@dataclasses.dataclass(frozen=True, kw_only=True)
class Ranked:
  """One candidate's dev scores over its seeds, and its rank in its system.

  Attributes:
    rank: 1 for the system's best mean dev BLEU (ties: lower dev CE).
    round: the selection round (0: a record of the earlier protocol).
    base: the candidate it changes (None: round 1, or an earlier record).
    bleu, chrf, dev_ce: per seed, in seed order; the means are ``*_mean``.
    tokens_per_sec: the record's own ``tokens_per_sec`` (earlier records:
      source + target tokens over logged intervals).
    target_tokens_per_sec: real target tokens per second of training-step
      time (``throughput.DEFINITION``); None in earlier records.
    flagged_seeds: seeds whose schedule check failed (peak not reached or
      stopped before the planned end).
  """

  rank: int
  system: str
  candidate: str
  why: str
  settings: tuple[str, ...]
  batch_tokens: int
  seeds: tuple[int, ...]
  bleu: tuple[float, ...]
  chrf: tuple[float, ...]
  dev_ce: tuple[float, ...]
  steps: float
  tokens_per_sec: float
  decode_sentences_per_sec: float
  round: int = 0
  base: str | None = None
  target_tokens_per_sec: float | None = None
  flagged_seeds: tuple[int, ...] = ()

  @property
  def bleu_mean(self) -> float:
    return math.fsum(self.bleu) / len(self.bleu)

  @property
  def chrf_mean(self) -> float:
    return math.fsum(self.chrf) / len(self.chrf)

  @property
  def dev_ce_mean(self) -> float:
    return math.fsum(self.dev_ce) / len(self.dev_ce)

  def to_dict(self) -> dict[str, Any]:
    return {**dataclasses.asdict(self), "bleu_mean": round(self.bleu_mean, 2),
            "chrf_mean": round(self.chrf_mean, 2),
            "dev_ce_mean": round(self.dev_ce_mean, 4)}


def _mean(values: Sequence[float]) -> float:
  return math.fsum(values) / len(values)


def _ranked(system: str, name: str,
            runs: Sequence[Mapping[str, Any]]) -> Ranked:
  """One candidate's runs (seed order) as an unranked :class:`Ranked`."""
  first = runs[0]
  target_rates = [r["train"].get("target_tokens_per_sec") for r in runs]
  return Ranked(
      rank=0, system=system, candidate=name, why=first["why"],
      settings=tuple(first["settings"]), batch_tokens=first["batch_tokens"],
      seeds=tuple(r["seed"] for r in runs),
      bleu=tuple(r["dev"]["bleu"] for r in runs),
      chrf=tuple(r["dev"]["chrf"] for r in runs),
      dev_ce=tuple(r["dev"]["ce"] for r in runs),
      steps=_mean([r["train"]["steps"] for r in runs]),
      tokens_per_sec=_mean([r["train"]["tokens_per_sec"] for r in runs]),
      decode_sentences_per_sec=_mean(
          [r["decode_sentences_per_sec"] for r in runs]),
      round=int(first.get("round", 0)), base=first.get("base"),
      target_tokens_per_sec=(None if None in target_rates
                             else _mean(target_rates)),
      flagged_seeds=tuple(r["seed"] for r in runs
                          if r.get("schedule_check", {}).get("flagged")))


def rank(records: Sequence[Mapping[str, Any]], *,
         rounds: Sequence[int] | None = None) -> dict[str, list[Ranked]]:
  """Per system, its candidates best first by mean dev BLEU over seeds.

  Reads each record's ``dev`` scores and training speed only; a record
  scored on another split is refused. ``rounds``: only candidates of
  these rounds (None: all).

  Raises:
    ValueError: a record not selected on dev.
  """
  groups: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
  for record in records:
    if record.get("selected_on") != SELECTED_ON:
      raise ValueError(f"record {record.get('candidate')!r} was not scored "
                       f"on {SELECTED_ON}")
    if rounds is not None and record.get("round") not in rounds:
      continue
    groups.setdefault((record["system"], record["candidate"]), []).append(
        record)
  unranked: dict[str, list[Ranked]] = {}
  for (system, name), runs in groups.items():
    unranked.setdefault(system, []).append(
        _ranked(system, name, sorted(runs, key=lambda r: r["seed"])))
  return {system: [dataclasses.replace(r, rank=rank)
                   for rank, r in dev_ranking.best_first(
                       items, score=lambda r: (-r.bleu_mean, r.dev_ce_mean,
                                               r.candidate))]
          for system, items in unranked.items()}


def chosen(ranking: Mapping[str, Sequence[Ranked]], system: str, *,
           name: str | None = None) -> Ranked:
  """The system's pick: ``name`` if given, else its rank-1 candidate.

  Raises:
    ValueError: the system has no finished candidate, or ``name`` none.
  """
  items = list(ranking.get(system, ()))
  if name:
    items = [r for r in items if r.candidate == name]
  if not items:
    raise ValueError(f"no finished selection run of {name or system!r}: "
                     "run --mode=select for it first")
  return items[0]


def _fmt_seeds(values: Sequence[float], digits: int) -> str:
  return " / ".join(f"{v:.{digits}f}" for v in values)


def _budget_text(budgets: Sequence[Mapping[str, float]]) -> str:
  parts = []
  for budget in budgets:
    if "budget_tokens" in budget:
      parts.append(f"{budget['budget_tokens']:,.0f} training tokens (batch "
                   "capacity; steps = tokens / batch size)")
    elif "budget_steps" in budget:
      parts.append(f"{budget['budget_steps']:.0f} steps of 4096 tokens "
                   "(earlier protocol)")
    else:
      parts.append(f"{budget['budget_seconds']:.0f} s (earlier protocol)")
  return " and ".join(parts) or "no runs yet"


def _delta_text(r: Ranked, items: Sequence[Ranked],
                differences: Mapping[str, Mapping[str, Any]]) -> str:
  base = next((b for b in items if b.candidate == r.base), None)
  if base is None or r is base:
    return "–"
  d = differences.get(r.candidate)
  if d is None:
    return f"{r.bleu_mean - base.bleu_mean:+.1f} vs {base.candidate}"
  star = "*" if d["significant"] else ""
  return (f"{d['score']:+.1f}{star} ±{d['ci']:.1f} (p={d['p_value']:.3f}) "
          f"vs {base.candidate}")


def care_counts(ranking: Mapping[str, Sequence[Ranked]]
                ) -> dict[str, dict[str, int]]:
  """Per system: finished candidates per round and in all, and runs."""
  out = {}
  for system in SYSTEMS:
    items = ranking.get(system, ())
    row = {f"round_{n}": sum(1 for r in items if r.round == n)
           for n in candidates_lib.ROUNDS}
    row["candidates"] = len(items)
    row["runs"] = sum(len(r.seeds) for r in items)
    out[system] = row
  return out


def _care_lines(ranking: Mapping[str, Sequence[Ranked]]) -> list[str]:
  """The side-by-side count of what each system had tried."""
  counts = care_counts(ranking)
  planned = candidates_lib.counts()
  lines = ["### Equal care: candidates per system", "",
           "| | " + " | ".join(SYSTEMS) + " |",
           "| --- |" + " ---: |" * len(SYSTEMS)]
  for n in candidates_lib.ROUNDS:
    lines.append(f"| round {n} (finished / planned) | " + " | ".join(
        f"{counts[s][f'round_{n}']} / {planned[s][n]}" for s in SYSTEMS)
        + " |")
  for key in ("candidates", "runs"):
    lines.append(f"| {key} | " + " | ".join(str(counts[s][key])
                                            for s in SYSTEMS) + " |")
  return [*lines, ""]


def _gap_lines(gap: Mapping[str, Any] | None) -> list[str]:
  if gap is None:
    return []
  head = (f"Dev gap of the picks, {gap['m4moe']} minus {gap['opennmt-tf']}"
          " (dev BLEU, paired bootstrap over the seeds both have): ")
  if "unavailable" in gap:
    return [head + f"not available ({gap['unavailable']}).", ""]
  star = "*" if gap["significant"] else ""
  return [head + f"{gap['score']:+.1f}{star} ±{gap['ci']:.1f} "
          f"(p={gap['p_value']:.3f}), seeds "
          f"{', '.join(map(str, gap['seeds']))}.", ""]


def table_markdown(ranking: Mapping[str, Sequence[Ranked]], *,
                   manifest: Mapping[str, Any],
                   budgets: Sequence[Mapping[str, float]],
                   differences: Mapping[str, Mapping[str, Any]] | None = None,
                   picks_gap: Mapping[str, Any] | None = None) -> str:
  """The dev-only selection table: the care count, then one per system.

  ``differences``: per candidate, its dev BLEU minus its base's
  with sacrebleu's paired bootstrap over the dev sentences (``Δ ±95%``,
  ``*`` for p < 0.05); without one, the plain difference of the means.
  ``picks_gap``: the two rank-1 picks' dev gap (``select.dev_gap``), the
  number the final's test gap is set beside.
  """
  dev = manifest["dev"]
  lines = [
      f"Dev-only selection: {dev['sentences']} {manifest['language']}->en "
      f"sentences ({dev['from_dev_split']} of the dev split + "
      f"{dev['from_train_carve']} carved from train); training per run: "
      f"{_budget_text(budgets)}, on one core; beam 4. Ranked by mean dev "
      "BLEU over seeds (ties: dev CE); Δ: dev BLEU minus that of the "
      "candidate it changes (its base), with sacrebleu's paired bootstrap "
      "over the dev sentences (* p < 0.05); target tokens/s: real target "
      "tokens per second of training-step time; ⚑: seeds whose schedule "
      "check failed. No test sentence is read.", "",
      *_care_lines(ranking), *_gap_lines(picks_gap)]
  for system in SYSTEMS:
    items = ranking.get(system, ())
    if not items:
      continue
    lines += [f"### {system}", "",
              "| rank | round | candidate | change | seeds | steps | "
              "target tokens/s | dev CE | dev BLEU per seed | dev BLEU | Δ | "
              "dev chrF++ | decode sent/s |",
              "| ---: | ---: | --- | --- | --- | ---: | ---: | ---: | --- | "
              "---: | ---: | ---: | ---: |"]
    for r in items:
      delta = _delta_text(r, items, differences or {})
      rate = ("–" if r.target_tokens_per_sec is None
              else f"{r.target_tokens_per_sec:,.0f}")
      flag = f" ⚑{','.join(map(str, r.flagged_seeds))}" if (
          r.flagged_seeds) else ""
      lines.append(
          f"| {r.rank} | {r.round or '–'} | {r.candidate}{flag} | {r.why} | "
          f"{', '.join(map(str, r.seeds))} | {r.steps:.0f} | {rate} | "
          f"{r.dev_ce_mean:.3f} | {_fmt_seeds(r.bleu, 1)} | "
          f"{r.bleu_mean:.1f} | {delta} | {r.chrf_mean:.1f} | "
          f"{r.decode_sentences_per_sec:.1f} |")
    lines.append("")
  return "\n".join(lines)
