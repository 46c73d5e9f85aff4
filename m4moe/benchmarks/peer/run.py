r"""Peer comparison: m4moe vs OpenNMT-tf at equal wall-clock on one pair.

  python -m m4moe.benchmarks.peer.run \
      --corpus_dir=runs/demo/corpus --vocab_dir=runs/demo/vocab \
      --work_dir=runs/peer --onmt_venv=VENV \
      --budget_seconds=480

Both systems train on the demo corpus's ``--language``->en pair with the
same SentencePiece pieces, the same model dimensions (our 2+2-layer
``tiny/dense``), 4096-token batches and label smoothing 0.1, for the same
wall-clock budget; then each decodes the same first ``--test_sentences``
test sentences with beam 4 (length penalty 0.6) and both are scored by
``m4moe.eval`` (sacrebleu BLEU and chrF++). Systems run two at a time, each
pinned to its own core with ``taskset`` and one intra-op thread, so other
load on the machine hits both alike. With a third system
(``--systems=m4moe,opennmt-tf,m4moe-moe``) the third runs in a second round.

Writes ``peer.json`` (scores, steps, tokens/s, dev CE, decode speed and
example translations) and ``benchmark_lines.jsonl`` (``peer_train`` /
``peer_decode`` JSON lines) into ``--output_dir`` (default: ``--work_dir``),
and appends the lines to ``--benchmarks_md`` only when it is given.
Everything else goes under ``--work_dir``, which must not hold an earlier
comparison. The OpenNMT-tf virtualenv (``--onmt_venv`` or
``$M4MOE_ONMT_VENV``) is built with the pinned versions if missing.

This scores the first ``--test_sentences`` of the test split with the
systems' fixed recipes; ``select.py`` chooses the recipes on dev and scores
sentences no selection has read.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import os
import pathlib
import platform
import sys
import time
from typing import Any, Sequence

from absl import app
from absl import flags

from m4moe.benchmarks.peer import systems as systems_lib
from m4moe.benchmarks.peer import toolkit
from m4moe.eval import results
from m4moe.eval import testsets as testsets_lib

_CORPUS_DIR = flags.DEFINE_string("corpus_dir", None,
                                  "Corpus built by m4moe-build-corpus.")
_VOCAB_DIR = flags.DEFINE_string(
    "vocab_dir", None, "m4moe-vocab output (source/target .model, .vocab).")
_WORK_DIR = flags.DEFINE_string(
    "work_dir", None, "New directory for models, logs and hypotheses.")
_LANGUAGE = flags.DEFINE_string("language", "pt", "Source language (->en).")
_BUDGET = flags.DEFINE_float("budget_seconds", 480.0,
                             "Training wall-clock per system, in seconds.")
_TEST_SENTENCES = flags.DEFINE_integer(
    "test_sentences", 200, "Decode and score the first N test sentences.")
_SYSTEMS = flags.DEFINE_list(
    "systems", ["m4moe", "opennmt-tf"],
    "Systems to compare (two run at a time): m4moe (2+2 tiny/dense), "
    "opennmt-tf (the peer), m4moe-moe (2+2 tiny/moe), m4moe-factored (2+2 "
    "tiny/dense with the paper's optimiser memory: --factored --beta1=0).")
_CORES = flags.DEFINE_list("cores", ["0", "1"],
                           "CPU cores, one per concurrently running system.")
_ONMT_VENV = flags.DEFINE_string(
    "onmt_venv", None, "OpenNMT-tf virtualenv (default: $M4MOE_ONMT_VENV; "
    "one of them is required with opennmt-tf); built with the pinned "
    "versions if missing.")
_OUTPUT_DIR = flags.DEFINE_string(
    "output_dir", None, "Where peer.json and benchmark_lines.jsonl go "
    "(default: --work_dir).")
_BENCHMARKS_MD = flags.DEFINE_string(
    "benchmarks_md", "", "Also append the peer_train/peer_decode JSON lines "
    "to this benchmarks.md (default: not).")
_EXAMPLES = flags.DEFINE_integer("examples", 5,
                                 "Example translations in peer.json.")
_SEED = flags.DEFINE_integer("seed", 0, "Seed of both systems.")

# name -> (zoo config, extra m4moe-train flags), all at 2+2 layers.
M4MOE_SYSTEMS = {
    "m4moe": ("tiny/dense",),
    "m4moe-moe": ("tiny/moe",),
    # The paper's optimiser memory: factored second moments and no first
    # moment (O(n + m) state per n x m matrix instead of 2nm), the rest of
    # the small-model recipe unchanged.
    "m4moe-factored": ("tiny/dense", "--factored", "--beta1=0.0"),
}
PEER = "opennmt-tf"
SYSTEMS = (*M4MOE_SYSTEMS, PEER)
BEAM_SIZE, ALPHA, MAX_LENGTH, DECODE_BATCH = (
    systems_lib.BEAM_SIZE, systems_lib.ALPHA, systems_lib.MAX_LENGTH, systems_lib.DECODE_BATCH)
BATCH_TOKENS = 4096


@dataclasses.dataclass(frozen=True, kw_only=True)
class Setup:
  """What every system shares."""
  corpus_dir: pathlib.Path
  vocab_dir: pathlib.Path
  work_dir: pathlib.Path
  language: str
  budget_seconds: float
  testset: testsets_lib.TestSet
  seed: int


@dataclasses.dataclass(frozen=True, kw_only=True)
class Outcome:
  """One system's training summary, eval JSON and decode timing."""
  name: str
  train: dict[str, Any]
  eval_path: pathlib.Path
  hypotheses: list[str]
  decode_sentences: int
  decode_seconds: float
  core: str


def _run_m4moe(name: str, setup: Setup, core: str) -> Outcome:
  config, *extra_flags = M4MOE_SYSTEMS[name]
  root = setup.work_dir / name
  data = systems_lib.Data(corpus_dir=setup.corpus_dir, vocab_dir=setup.vocab_dir,
                      language=setup.language)
  train = systems_lib.train_m4moe(
      data=data, root=root, config=config, flags=extra_flags,
      batch_tokens=BATCH_TOKENS,
      budget=systems_lib.Budget(seconds=setup.budget_seconds), seed=setup.seed,
      core=core)
  decoded = systems_lib.decode_m4moe(data=data, root=root, split="test",
                                 name=name, core=core,
                                 max_sentences=len(setup.testset.sources))
  return Outcome(name=name, train=train, eval_path=decoded.eval_path,
                 hypotheses=decoded.hypotheses,
                 decode_sentences=decoded.sentences,
                 decode_seconds=decoded.seconds, core=core)


def _run_peer(setup: Setup, core: str, python: pathlib.Path) -> Outcome:
  root = setup.work_dir / PEER
  data = systems_lib.Data(corpus_dir=setup.corpus_dir, vocab_dir=setup.vocab_dir,
                      language=setup.language)
  budget = systems_lib.Budget(seconds=setup.budget_seconds)
  systems_lib.prepare_peer(
      data=data, root=root, budget=budget, model=toolkit.PeerModel(),
      recipe=toolkit.PeerRecipe(batch_tokens=BATCH_TOKENS,
                                max_length=MAX_LENGTH, beam_size=BEAM_SIZE,
                                length_penalty=ALPHA,
                                decode_batch_size=DECODE_BATCH))
  train = systems_lib.train_peer(python=python, root=root, budget=budget,
                             seed=setup.seed, core=core)
  decoded = systems_lib.decode_peer(python=python, data=data, root=root,
                                testset=setup.testset, split="test",
                                name=PEER, seed=setup.seed, core=core)
  return Outcome(name=PEER, train=train, eval_path=decoded.eval_path,
                 hypotheses=decoded.hypotheses,
                 decode_sentences=decoded.sentences,
                 decode_seconds=decoded.seconds, core=core)


def _score(outcome: Outcome, language: str) -> tuple[float, float]:
  result = results.read_eval_json(outcome.eval_path)
  score = result.languages[language]
  return float(score.bleu), float(score.chrf)


def _validate(systems: Sequence[str], cores: Sequence[str]) -> None:
  unknown = sorted(set(systems) - set(SYSTEMS))
  if unknown or not systems or len(set(systems)) != len(systems):
    raise app.UsageError(f"--systems={','.join(systems)}: name each of "
                         f"{', '.join(SYSTEMS)} at most once")
  if len(cores) < 1 or not all(c.isdigit() for c in cores):
    raise app.UsageError(f"--cores={','.join(cores)}: list CPU numbers, e.g. "
                         "0,1")
  if _BUDGET.value <= 0:
    raise app.UsageError(f"--budget_seconds={_BUDGET.value}: use a positive "
                         "number of seconds")
  if _TEST_SENTENCES.value < 1:
    raise app.UsageError(f"--test_sentences={_TEST_SENTENCES.value}: use at "
                         "least 1")


def _setup_from_flags() -> tuple[list[str], list[str], Setup]:
  """The systems, cores and shared setup; usage errors name the flag."""
  for name, flag in (("--corpus_dir", _CORPUS_DIR), ("--vocab_dir",
                     _VOCAB_DIR), ("--work_dir", _WORK_DIR)):
    if not flag.value:
      raise app.UsageError(f"{name} is required")
  names, cores = list(_SYSTEMS.value), list(_CORES.value)
  _validate(names, cores)
  work_dir = pathlib.Path(_WORK_DIR.value).resolve()
  for name in names:
    if (work_dir / name).exists():
      raise app.UsageError(f"{work_dir / name} exists (an earlier "
                           "comparison): pass a new --work_dir")
  vocab_dir = pathlib.Path(_VOCAB_DIR.value).resolve()
  for side in ("source", "target"):
    for ext in ("model", "vocab"):
      if not (vocab_dir / f"{side}.{ext}").is_file():
        raise app.UsageError(f"{vocab_dir / f'{side}.{ext}'} does not "
                             "exist: is --vocab_dir an m4moe-vocab output?")
  corpus_dir = pathlib.Path(_CORPUS_DIR.value).resolve()
  for split in ("train", "dev"):
    path = corpus_dir / split / f"{_LANGUAGE.value}.tsv"
    if not path.is_file():
      raise app.UsageError(f"{path} does not exist: is --corpus_dir a corpus "
                           f"built with --language={_LANGUAGE.value}?")
  try:
    (testset,) = testsets_lib.load_testsets(
        _CORPUS_DIR.value, split="test", langs=[_LANGUAGE.value])
  except ValueError as e:
    raise app.UsageError(str(e)) from e
  n = _TEST_SENTENCES.value
  if len(testset.sources) < n:
    raise app.UsageError(f"{testset.path} has {len(testset.sources)} test "
                         f"sentences, fewer than --test_sentences={n}")
  testset = dataclasses.replace(testset, sources=testset.sources[:n],
                                references=testset.references[:n])
  return names, cores, Setup(
      corpus_dir=corpus_dir, vocab_dir=vocab_dir, work_dir=work_dir,
      language=_LANGUAGE.value, budget_seconds=_BUDGET.value,
      testset=testset, seed=_SEED.value)


def _train_all(setup: Setup, names: Sequence[str], cores: Sequence[str],
               peer_python: pathlib.Path | None) -> dict[str, Outcome]:
  """Every system, len(cores) at a time, each pinned to its own core."""
  outcomes: dict[str, Outcome] = {}
  for begin in range(0, len(names), len(cores)):
    round_systems = names[begin:begin + len(cores)]
    print(f"peer: training {', '.join(round_systems)} for "
          f"{setup.budget_seconds:.0f} s each (cores "
          f"{', '.join(cores[:len(round_systems)])})", flush=True)
    with concurrent.futures.ThreadPoolExecutor(len(round_systems)) as pool:
      futures = {
          name: pool.submit(_run_peer, setup, core, peer_python)
          if name == PEER else pool.submit(_run_m4moe, name, setup, core)
          for name, core in zip(round_systems, cores)}
      for name, future in futures.items():
        outcomes[name] = future.result()
  return outcomes


def _report(setup: Setup, names: Sequence[str],
            outcomes: dict[str, Outcome], wall_seconds: float
            ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
  """peer.json's content and the peer_train/peer_decode lines."""
  load = os.getloadavg()[0]
  report = {"language": setup.language, "budget_seconds": setup.budget_seconds,
            "test_sentences": len(setup.testset.sources),
            "beam_size": BEAM_SIZE, "alpha": ALPHA,
            "batch_tokens": BATCH_TOKENS, "wall_seconds": round(wall_seconds, 1),
            "loadavg_1m_at_end": round(load, 2), "systems": {}}
  lines = []
  for name in names:
    outcome = outcomes[name]
    bleu, chrf = _score(outcome, setup.language)
    record = toolkit.system_record(
        train=outcome.train, bleu=bleu, chrf=chrf,
        decode_sentences=outcome.decode_sentences,
        decode_seconds=outcome.decode_seconds,
        budget_seconds=setup.budget_seconds)
    report["systems"][name] = {**record, "core": outcome.core}
    common = {"system": name, "language": setup.language,
              "budget_seconds": setup.budget_seconds, "core": outcome.core,
              "nproc": os.cpu_count(), "loadavg_1m": round(load, 2),
              "python": platform.python_version()}
    lines.append({"benchmark": "peer_train", **common,
                  "tokens_per_sec": record["tokens_per_sec"],
                  "steps_per_sec": record["steps_per_sec"],
                  "steps": record["steps"]})
    lines.append({"benchmark": "peer_decode", **common,
                  "beam_size": BEAM_SIZE, "sentences": outcome.decode_sentences,
                  "sentences_per_sec": record["decode_sentences_per_sec"]})
    print(f"{name}: BLEU {bleu:.2f} chrF++ {chrf:.2f}, {record['steps']} "
          f"steps, {record['tokens_per_sec']:.0f} tokens/s, dev CE "
          f"{record['dev_ce']:.3f}, decode "
          f"{record['decode_sentences_per_sec']:.2f} sentences/s", flush=True)
  report["examples"] = toolkit.examples(
      sources=setup.testset.sources, references=setup.testset.references,
      hypotheses={name: outcomes[name].hypotheses for name in names},
      count=_EXAMPLES.value)
  return report, lines


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  names, cores, setup = _setup_from_flags()
  output_dir = pathlib.Path(_OUTPUT_DIR.value or setup.work_dir).resolve()
  try:
    peer_python = (toolkit.ensure_venv(
        systems_lib.onmt_venv(_ONMT_VENV.value),
        log=setup.work_dir / "onmt_venv.log") if PEER in names else None)
    started = time.time()
    outcomes = _train_all(setup, names, cores, peer_python)
    report, lines = _report(setup, names, outcomes, time.time() - started)
    toolkit.write_json(output_dir / "peer.json", report)
    (output_dir / "benchmark_lines.jsonl").write_text(
        "".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    if _BENCHMARKS_MD.value:
      toolkit.append_benchmark_lines(pathlib.Path(_BENCHMARKS_MD.value), lines)
  except (toolkit.PeerError, OSError, ValueError) as e:
    sys.exit(f"peer: error: {e}")
  print(f"Wrote {output_dir / 'peer.json'}", flush=True)


def run() -> None:
  app.run(main)


if __name__ == "__main__":
  run()
