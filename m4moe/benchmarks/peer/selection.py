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

from m4moe.data import split as split_lib
from m4moe.eval import dev_ranking

SYSTEM_M4MOE = "m4moe"
SYSTEM_PEER = "opennmt-tf"
SYSTEMS = (SYSTEM_M4MOE, SYSTEM_PEER)
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


@dataclasses.dataclass(frozen=True, kw_only=True)
class Candidate:
  """One recipe to screen.

  Attributes:
    name: unique id (file names, tables).
    system: ``m4moe`` or ``opennmt-tf``.
    why: what the candidate changes, for the table.
    settings: for ``m4moe``, m4moe-train flags over the zoo's 2+2
      ``tiny/dense`` (``--flag=value``); for the peer, ``field=value`` over
      :data:`PEER_CENTER` (fields of ``toolkit.PeerRecipe`` and ``dropout``).
    batch_tokens: training batch size in tokens.
    base: the candidate this one changes, whose dev BLEU the table
      subtracts (None: the system's centre, :data:`CENTRES`).
  """

  name: str
  system: str
  why: str
  settings: tuple[str, ...] = ()
  batch_tokens: int = 4096
  base: str | None = None

  def __post_init__(self) -> None:
    if self.system not in SYSTEMS:
      raise ValueError(f"candidate {self.name}: system {self.system!r} is "
                       f"not one of {', '.join(SYSTEMS)}")
    for setting in self.settings:
      key, eq, _ = setting.partition("=")
      ok = (key.startswith("--") if self.system == SYSTEM_M4MOE
            else eq and key in PEER_FIELDS)
      if not ok:
        raise ValueError(
            f"candidate {self.name}: setting {setting!r} is not an "
            "m4moe-train flag (--flag[=value])" if self.system == SYSTEM_M4MOE
            else f"candidate {self.name}: setting {setting!r} is not "
            f"field=value with a field of {', '.join(PEER_FIELDS)}")
    if self.batch_tokens < 64:
      raise ValueError(f"candidate {self.name}: batch_tokens="
                       f"{self.batch_tokens}: use >= 64")

  def peer_settings(self) -> dict[str, float]:
    """The peer's fields: :data:`PEER_CENTER` updated by ``settings``."""
    values = dict(PEER_CENTER)
    for setting in self.settings:
      key, _, value = setting.partition("=")
      values[key] = float(value)
    return values


# The peer's fields a candidate may set, and the centre of its screening:
# our recipe's values (Adam peak 1e-3, 1000 warmup steps, no
# dropout); its original recipe (5e-4, 300, 0.1) is a candidate too.
PEER_FIELDS = ("learning_rate", "warmup_steps", "dropout", "label_smoothing")
PEER_CENTER = {"learning_rate": 1e-3, "warmup_steps": 1000.0, "dropout": 0.0,
               "label_smoothing": 0.1}

# m4moe's rate flag is peak * sqrt(warmup) (rsqrt decay after a constant
# warmup): 1e-3 held 1000 steps is 0.031623.
# Every m4moe candidate starts from ``tiny/dense`` with the rate it had
# when the selection began (1e-3 held 1000 steps), then its settings: the
# candidates keep their meaning after the selection changes the zoo's rate.
M4MOE_BASE = ("--learning_rate=0.031623", "--warmup_steps=1000")
_M = SYSTEM_M4MOE
_P = SYSTEM_PEER


def _dropout(rate: str) -> tuple[str, str]:
  return (f"--dropout_rate={rate}", f"--attention_dropout_rate={rate}")


def _m4moe_rate(peak: float, *, warmup: int = 1000) -> str:
  """m4moe-train's ``--learning_rate`` for ``peak`` held ``warmup`` steps."""
  return f"--learning_rate={peak * math.sqrt(warmup):.6f}"


# Round 1: each system's centre, dropout and the peak learning rate.
_ROUND1: tuple[Candidate, ...] = (
    Candidate(name="m4moe_zoo", system=_M, why="the zoo's recipe (centre)"),
    Candidate(name="peer_ours", system=_P,
              why="our values: Adam 1e-3, warmup 1000, dropout 0 (centre)"),
    Candidate(name="m4moe_dropout0.1", system=_M, why="dropout 0.1",
              settings=_dropout("0.1")),
    Candidate(name="peer_dropout0.1", system=_P, why="dropout 0.1",
              settings=("dropout=0.1",)),
    *(Candidate(name=f"m4moe_peak{p}", system=_M, why=f"peak {p}",
                settings=(_m4moe_rate(float(p)),))
      for p in ("2e-3", "4e-3", "8e-3")),
    *(Candidate(name=f"peer_lr{p}", system=_P, why=f"peak {p}",
                settings=(f"learning_rate={float(p)}",))
      for p in ("2e-3", "4e-3", "8e-3")),
    Candidate(name="peer_original", system=_P,
              why="its first recipe: 5e-4, warmup 300, dropout 0.1",
              settings=("learning_rate=0.0005", "warmup_steps=300",
                        "dropout=0.1")),
)

# Round 2: one change at a time from each system's best peak on dev
# (m4moe 4e-3, the peer 2e-3). Other batch sizes train on the same tokens
# with the same warmup in tokens and the same peak rate.
_M4 = "m4moe_peak4e-3"
_P2 = "peer_lr2e-3"
_M4_RATE = 4e-3
_P2_RATE = ("learning_rate=0.002",)


def _m4(name: str, why: str, *settings: str, warmup: int = 1000,
        batch_tokens: int = 4096) -> Candidate:
  """A change to ``m4moe_peak4e-3``: the peak stays 4e-3 unless
  ``settings`` give their own ``--learning_rate``."""
  rate_flags = () if any(f.startswith("--learning_rate=") for f in settings
                         ) else (_m4moe_rate(_M4_RATE, warmup=warmup),)
  warmup_flags = (f"--warmup_steps={warmup}",) if warmup != 1000 else ()
  return Candidate(name=f"m4moe_p4_{name}", system=_M,
                   why=f"peak 4e-3, {why}", base=_M4,
                   settings=(*rate_flags, *warmup_flags, *settings),
                   batch_tokens=batch_tokens)


def _p2(name: str, why: str, *settings: str,
        batch_tokens: int = 4096) -> Candidate:
  return Candidate(name=f"peer_lr2e-3_{name}", system=_P,
                   why=f"peak 2e-3, {why}", base=_P2,
                   settings=(*_P2_RATE, *settings), batch_tokens=batch_tokens)


_ROUND2: tuple[Candidate, ...] = (
    _m4("warmup300", "held 300 steps", warmup=300),
    _p2("warmup300", "warmup 300", "warmup_steps=300"),
    _m4("batch8192", "8192-token batches (warmup 500)", warmup=500,
        batch_tokens=8192),
    _p2("batch8192", "8192-token batches (warmup 500)", "warmup_steps=500",
        batch_tokens=8192),
    _m4("ls0", "label smoothing 0", "--label_smoothing=0"),
    _p2("ls0", "label smoothing 0", "label_smoothing=0"),
    _m4("beta1_0", "no momentum (beta1 0)", "--beta1=0"),
    _m4("factored", "factored second moments", "--factored"),
    _m4("clip1", "update clipping 1.0", "--clipping_threshold=1.0"),
    _m4("paramscale", "parameter scaling (relative step 4e-2)",
        "--multiply_by_parameter_scale", _m4moe_rate(4e-2)),
    _m4("batch2048", "2048-token batches (warmup 2000)", warmup=2000,
        batch_tokens=2048),
    _p2("batch2048", "2048-token batches (warmup 2000)", "warmup_steps=2000",
        batch_tokens=2048),
)

# Round 3: the peak rate again beside each system's round-2 winner on dev:
# the peer's 2048-token batches at half its peak (smaller batches may want
# a lower one), our peak held 300 steps at twice its peak (the rate decays
# from step 300 instead of 1000).
_ROUND3: tuple[Candidate, ...] = (
    Candidate(name="peer_b2048_lr1e-3", system=_P,
              why="peak 1e-3, 2048-token batches (warmup 2000)",
              base="peer_lr2e-3_batch2048",
              settings=("learning_rate=0.001", "warmup_steps=2000"),
              batch_tokens=2048),
    Candidate(name="m4moe_w300_p8e-3", system=_M,
              why="peak 8e-3 held 300 steps", base="m4moe_p4_warmup300",
              settings=(_m4moe_rate(8e-3, warmup=300), "--warmup_steps=300")),
)

# In screening order: round 1 (ran first), round 2, round 3.
CANDIDATES: tuple[Candidate, ...] = (*_ROUND1, *_ROUND2, *_ROUND3)
CENTRES = {_M: "m4moe_zoo", _P: "peer_ours"}


def base_of(name: str, system: str) -> str:
  """The candidate ``name``'s dev BLEU is compared with in the table."""
  known = {c.name: c for c in CANDIDATES}
  base = known[name].base if name in known else None
  return base or CENTRES[system]


def candidates_by_name(names: Sequence[str] = ()) -> list[Candidate]:
  """The named candidates in the given order (all, in queue order, if none).

  Raises:
    ValueError: an unknown or repeated name.
  """
  known = {c.name: c for c in CANDIDATES}
  if not names:
    return list(CANDIDATES)
  unknown = [n for n in names if n not in known]
  if unknown or len(set(names)) != len(names):
    raise ValueError(f"--candidates: unknown or repeated {unknown or names}; "
                     f"known: {', '.join(known)}")
  return [known[n] for n in names]


def record_path(run_dir: pathlib.Path, candidate: str, seed: int
                ) -> pathlib.Path:
  """Where one finished candidate run's JSON lives."""
  return run_dir / "candidates" / f"{candidate}_s{seed}.json"


def finished(path: pathlib.Path, *, expect: Mapping[str, Any]) -> bool:
  """Whether ``path`` records a finished run of exactly ``expect``.

  Raises:
    ValueError: the record exists but was run with other settings, budget
      or dev set (a different selection: use another --run_dir).
  """
  if not path.is_file():
    return False
  record = json.loads(path.read_text(encoding="utf-8"))
  changed = sorted(k for k, v in expect.items() if record.get(k) != v)
  if changed:
    raise ValueError(f"{path} was run with other {', '.join(changed)}; use "
                     "a new --run_dir for a different selection")
  return True


def read_records(run_dir: pathlib.Path) -> list[dict[str, Any]]:
  """Every candidate record of ``run_dir`` scored on the selection dev set."""
  out = []
  for path in sorted((run_dir / "candidates").glob("*.json")):
    record = json.loads(path.read_text(encoding="utf-8"))
    if record.get("selected_on") == SELECTED_ON:
      out.append(record)
  return out


@dataclasses.dataclass(frozen=True, kw_only=True)
class Ranked:
  """One candidate's dev scores over its seeds, and its rank in its system.

  Attributes:
    rank: 1 for the system's best mean dev BLEU (ties: lower dev CE).
    bleu, chrf, dev_ce: per seed, in seed order; the means are ``*_mean``.
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


def rank(records: Sequence[Mapping[str, Any]]) -> dict[str, list[Ranked]]:
  """Per system, its candidates best first by mean dev BLEU over seeds.

  Reads each record's ``dev`` scores and training speed only; a record
  scored on another split is refused.

  Raises:
    ValueError: a record not selected on dev.
  """
  groups: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
  for record in records:
    if record.get("selected_on") != SELECTED_ON:
      raise ValueError(f"record {record.get('candidate')!r} was not scored "
                       f"on {SELECTED_ON}")
    groups.setdefault((record["system"], record["candidate"]), []).append(
        record)
  unranked: dict[str, list[Ranked]] = {}
  for (system, name), runs in groups.items():
    runs = sorted(runs, key=lambda r: r["seed"])
    first = runs[0]
    unranked.setdefault(system, []).append(Ranked(
        rank=0, system=system, candidate=name, why=first["why"],
        settings=tuple(first["settings"]), batch_tokens=first["batch_tokens"],
        seeds=tuple(r["seed"] for r in runs),
        bleu=tuple(r["dev"]["bleu"] for r in runs),
        chrf=tuple(r["dev"]["chrf"] for r in runs),
        dev_ce=tuple(r["dev"]["ce"] for r in runs),
        steps=_mean([r["train"]["steps"] for r in runs]),
        tokens_per_sec=_mean([r["train"]["tokens_per_sec"] for r in runs]),
        decode_sentences_per_sec=_mean(
            [r["decode_sentences_per_sec"] for r in runs])))
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
    if "budget_steps" in budget:
      parts.append(f"{budget['budget_steps']:.0f} steps of 4096 tokens (other "
                   "batch sizes: the same tokens)")
    else:
      parts.append(f"{budget['budget_seconds']:.0f} s")
  return " and ".join(parts) or "no runs yet"


def _delta_text(r: Ranked, items: Sequence[Ranked],
                differences: Mapping[str, Mapping[str, Any]]) -> str:
  base_name = base_of(r.candidate, r.system)
  base = next((b for b in items if b.candidate == base_name), None)
  if base is None or r is base:
    return "–"
  d = differences.get(r.candidate)
  if d is None:
    return f"{r.bleu_mean - base.bleu_mean:+.1f} vs {base_name}"
  star = "*" if d["significant"] else ""
  return (f"{d['score']:+.1f}{star} ±{d['ci']:.1f} (p={d['p_value']:.3f}) "
          f"vs {base_name}")


def table_markdown(ranking: Mapping[str, Sequence[Ranked]], *,
                   manifest: Mapping[str, Any],
                   budgets: Sequence[Mapping[str, float]],
                   differences: Mapping[str, Mapping[str, Any]] | None = None
                   ) -> str:
  """The dev-only selection table, one section per system.

  ``differences``: per candidate, its dev BLEU minus its base's
  with sacrebleu's paired bootstrap over the dev sentences (``Δ ±95%``,
  ``*`` for p < 0.05); without one, the plain difference of the means.
  """
  dev = manifest["dev"]
  lines = [
      f"Dev-only selection: {dev['sentences']} {manifest['language']}->en "
      f"sentences ({dev['from_dev_split']} of the dev split + "
      f"{dev['from_train_carve']} carved from train); training per run: "
      f"{_budget_text(budgets)}, on one core; beam 4. Ranked by mean dev "
      "BLEU over seeds (ties: dev CE); Δ: dev BLEU minus that of the "
      "candidate it changes (round 1: the system's centre; round 2: the "
      "system's best round-1 peak rate), with sacrebleu's paired bootstrap "
      "over the dev sentences (* p < 0.05). No test sentence is read.", ""]
  for system in SYSTEMS:
    items = ranking.get(system, ())
    if not items:
      continue
    lines += [f"### {system}", "",
              "| rank | candidate | change | seeds | steps | tokens/s | "
              "dev CE | dev BLEU per seed | dev BLEU | Δ | "
              "dev chrF++ | decode sent/s |",
              "| ---: | --- | --- | --- | ---: | ---: | ---: | --- | ---: | "
              "---: | ---: | ---: |"]
    for r in items:
      delta = _delta_text(r, items, differences or {})
      lines.append(
          f"| {r.rank} | {r.candidate} | {r.why} | "
          f"{', '.join(map(str, r.seeds))} | {r.steps:.0f} | "
          f"{r.tokens_per_sec:,.0f} | {r.dev_ce_mean:.3f} | "
          f"{_fmt_seeds(r.bleu, 1)} | {r.bleu_mean:.1f} | {delta} | "
          f"{r.chrf_mean:.1f} | {r.decode_sentences_per_sec:.1f} |")
    lines.append("")
  return "\n".join(lines)
