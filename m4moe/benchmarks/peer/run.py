r"""Peer comparison: m4moe vs OpenNMT-tf at equal wall-clock on one pair.

  python -m m4moe.benchmarks.peer.run \
      --corpus_dir=/work/runs/demo/corpus --vocab_dir=/work/runs/demo/vocab \
      --work_dir=/work/runs/peer --budget_seconds=480

Both systems train on the demo corpus's ``--language``->en pair with the
same SentencePiece pieces, the same model dimensions (our 2+2-layer
``tiny/dense``), 4096-token batches and label smoothing 0.1, for the same
wall-clock budget; then each decodes the same first ``--test_sentences``
test sentences with beam 4 (length penalty 0.6) and both are scored by
``m4moe.eval`` (sacrebleu BLEU and chrF++). Systems run two at a time, each
pinned to its own core with ``taskset`` and one intra-op thread, so other
load on the machine hits both alike. With a third system
(``--systems=m4moe,opennmt-tf,m4moe-moe``) the third runs in a second round.

Writes ``--output`` (peer.json: scores, steps, tokens/s, dev CE, decode
speed and example translations) and appends ``peer_train``/``peer_decode``
JSON lines to ``--benchmarks_md``. Everything else goes under
``--work_dir``, which must not hold an earlier comparison. The OpenNMT-tf
virtualenv ``--onmt_venv`` is built with the pinned versions if missing.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import os
import pathlib
import platform
import subprocess
import sys
import time
from typing import Any, Sequence

from absl import app
from absl import flags

from m4moe.benchmarks.peer import toolkit
from m4moe.data import vocab as vocab_lib
from m4moe.eval import evaluate as evaluate_lib
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
    "onmt_venv", "/work/venv/onmt",
    "OpenNMT-tf virtualenv (built with the pinned versions if missing).")
_OUTPUT = flags.DEFINE_string("output", "results/peer/peer.json",
                              "Result JSON to write.")
_BENCHMARKS_MD = flags.DEFINE_string(
    "benchmarks_md", "results/benchmarks.md",
    "Append peer_train/peer_decode JSON lines here ('' to skip).")
_EXAMPLES = flags.DEFINE_integer("examples", 5,
                                 "Example translations in --output.")
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
BEAM_SIZE, ALPHA, BATCH_TOKENS, MAX_LENGTH, DECODE_BATCH = 4, 0.6, 4096, 64, 32


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


def _pinned_env() -> dict[str, str]:
  return {**os.environ, "TF_NUM_INTRAOP_THREADS": "1", "OMP_NUM_THREADS": "1",
          "TF_CPP_MIN_LOG_LEVEL": "1"}


def _run(command: Sequence[str], *, core: str, log: pathlib.Path,
         what: str) -> None:
  """Runs ``command`` pinned to ``core``, output to ``log``."""
  log.parent.mkdir(parents=True, exist_ok=True)
  with open(log, "w", encoding="utf-8") as out:
    out.write("$ taskset -c " + core + " " + " ".join(command) + "\n")
    out.flush()
    done = subprocess.run(["taskset", "-c", core, *command], stdout=out,
                          stderr=subprocess.STDOUT, env=_pinned_env(),
                          check=False)
  if done.returncode != 0:
    raise toolkit.PeerError(f"{what} failed (exit {done.returncode}); see "
                            f"{log}")


def _run_m4moe(name: str, setup: Setup, core: str) -> Outcome:
  config, *extra_flags = M4MOE_SYSTEMS[name]
  root = setup.work_dir / name
  model_dir = root / "model"
  python = sys.executable
  _run([python, "-m", "m4moe.cli.train", f"--config={config}",
        "--num_encoder_layers=2", "--num_decoder_layers=2",
        f"--corpus_dir={setup.corpus_dir}", f"--vocab_dir={setup.vocab_dir}",
        f"--languages={setup.language}", f"--batch_tokens={BATCH_TOKENS}",
        f"--sequence_length={MAX_LENGTH}",
        f"--train_steps={toolkit.NO_STEP_LIMIT}",
        f"--max_train_seconds={setup.budget_seconds}", "--eval_every=0",
        f"--checkpoint_every={toolkit.NO_STEP_LIMIT}", "--log_every=50",
        f"--seed={setup.seed}", f"--model_dir={model_dir}", *extra_flags],
       core=core, log=root / "train.log", what=f"{name} training")
  train = toolkit.m4moe_train_summary(model_dir / "metrics.jsonl",
                                      language=setup.language)
  eval_path = root / "eval.json"
  _run([python, "-m", "m4moe.cli.eval", f"--model_dir={model_dir}",
        f"--vocab_dir={setup.vocab_dir}", f"--corpus_dir={setup.corpus_dir}",
        f"--languages={setup.language}",
        f"--max_sentences={len(setup.testset.sources)}",
        f"--beam_size={BEAM_SIZE}", f"--alpha={ALPHA}",
        f"--batch_size={DECODE_BATCH}", f"--model_name={name}",
        "--kind=bilingual", f"--hypotheses_dir={root / 'hyp'}",
        f"--output={eval_path}"],
       core=core, log=root / "eval.log", what=f"{name} decoding")
  stats = json.loads(eval_path.read_text(encoding="utf-8"))["metadata"][
      "decode_stats"]
  hyps = (root / "hyp" / f"{setup.language}.hyp").read_text(
      encoding="utf-8").splitlines()
  return Outcome(name=name, train=train, eval_path=eval_path,
                 hypotheses=hyps, decode_sentences=int(stats["sentences"]),
                 decode_seconds=float(stats["seconds"]), core=core)


def _prepare_peer(setup: Setup, root: pathlib.Path) -> dict[str, Any]:
  """Pieces, vocabularies, model file and config; returns the counts."""
  source_sp = vocab_lib.load(setup.vocab_dir / "source.model")
  target_sp = vocab_lib.load(setup.vocab_dir / "target.model")
  data = root / "data"
  counts = {}
  for split in ("train", "dev"):
    path = setup.corpus_dir / split / f"{setup.language}.tsv"
    if not path.is_file():
      raise toolkit.PeerError(f"{path} does not exist: is --corpus_dir a "
                              f"corpus with language {setup.language!r}?")
    pairs = [(x, en) for en, x in testsets_lib.read_pairs(path)]
    counts[split] = dataclasses.asdict(toolkit.write_pieces(
        pairs, source_sp=source_sp, target_sp=target_sp,
        source_path=data / f"{split}.{setup.language}",
        target_path=data / f"{split}.en", max_length=MAX_LENGTH))
  files = toolkit.PeerFiles(
      train_source=data / f"train.{setup.language}",
      train_target=data / "train.en",
      dev_source=data / f"dev.{setup.language}", dev_target=data / "dev.en",
      source_vocab=data / "source.vocab", target_vocab=data / "target.vocab")
  for side in ("source", "target"):
    counts[f"{side}_vocab"] = toolkit.write_vocabulary(
        setup.vocab_dir / f"{side}.vocab", data / f"{side}.vocab")
  # Our translator keeps tag + pieces + EOS within max_length.
  truncated = toolkit.write_test_pieces(
      setup.testset.sources, source_sp=source_sp,
      path=data / f"test.{setup.language}", max_pieces=MAX_LENGTH - 2)
  counts["test_truncated"] = sum(truncated)
  (root / "model.py").write_text(
      toolkit.model_file_text(toolkit.PeerModel()), encoding="utf-8")
  toolkit.write_json(root / "config.json", toolkit.run_config(
      recipe=toolkit.PeerRecipe(batch_tokens=BATCH_TOKENS,
                                max_length=MAX_LENGTH, beam_size=BEAM_SIZE,
                                length_penalty=ALPHA,
                                decode_batch_size=DECODE_BATCH),
      files=files, model_dir=root / "model"))
  toolkit.write_json(root / "data_counts.json", counts)
  return counts


def _run_peer(setup: Setup, core: str, python: pathlib.Path) -> Outcome:
  root = setup.work_dir / PEER
  _prepare_peer(setup, root)
  driver = str(pathlib.Path(__file__).with_name("driver.py"))
  common = [f"--config={root / 'config.json'}",
            f"--model_file={root / 'model.py'}", f"--seed={setup.seed}",
            "--intra_op_threads=1"]
  _run([str(python), driver, "train", *common,
        f"--budget_seconds={setup.budget_seconds}",
        f"--summary={root / 'train.json'}"],
       core=core, log=root / "train.log", what=f"{PEER} training")
  train = json.loads((root / "train.json").read_text(encoding="utf-8"))
  predictions = root / f"test.{setup.language}.en.pieces"
  _run([str(python), driver, "infer", *common,
        f"--features={root / 'data' / f'test.{setup.language}'}",
        f"--predictions={predictions}", f"--summary={root / 'decode.json'}"],
       core=core, log=root / "decode.log", what=f"{PEER} decoding")
  decode = json.loads((root / "decode.json").read_text(encoding="utf-8"))
  target_sp = vocab_lib.load(setup.vocab_dir / "target.model")
  lines = predictions.read_text(encoding="utf-8").splitlines()
  if len(lines) != len(setup.testset.sources):
    raise toolkit.PeerError(f"{predictions}: {len(lines)} lines for "
                            f"{len(setup.testset.sources)} test sentences")
  hyps = [toolkit.detokenize(line, target_sp=target_sp) if src.strip()
          else "" for line, src in zip(lines, setup.testset.sources)]
  result = evaluate_lib.evaluate(
      lambda sources, **_: hyps, [setup.testset], model=PEER,
      kind="bilingual",
      metadata={"system": "OpenNMT-tf 2.32.0", "beam_size": BEAM_SIZE,
                "length_penalty": ALPHA, "train": train, "decode": decode})
  eval_path = root / "eval.json"
  results.write_eval_json(result, eval_path)
  return Outcome(name=PEER, train=train, eval_path=eval_path,
                 hypotheses=hyps, decode_sentences=int(decode["sentences"]),
                 decode_seconds=float(decode["seconds"]), core=core)


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


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  for name, flag in (("--corpus_dir", _CORPUS_DIR), ("--vocab_dir",
                     _VOCAB_DIR), ("--work_dir", _WORK_DIR)):
    if not flag.value:
      raise app.UsageError(f"{name} is required")
  systems, cores = list(_SYSTEMS.value), list(_CORES.value)
  _validate(systems, cores)
  work_dir = pathlib.Path(_WORK_DIR.value).resolve()
  for name in systems:
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
  setup = Setup(corpus_dir=corpus_dir,
                vocab_dir=vocab_dir, work_dir=work_dir,
                language=_LANGUAGE.value, budget_seconds=_BUDGET.value,
                testset=testset, seed=_SEED.value)
  try:
    peer_python = (toolkit.ensure_venv(
        pathlib.Path(_ONMT_VENV.value), log=work_dir / "onmt_venv.log")
                   if PEER in systems else None)
    outcomes: dict[str, Outcome] = {}
    started = time.time()
    for begin in range(0, len(systems), len(cores)):
      round_systems = systems[begin:begin + len(cores)]
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
  except (toolkit.PeerError, OSError, ValueError) as e:
    sys.exit(f"peer: error: {e}")
  load = os.getloadavg()[0]
  report = {"language": setup.language, "budget_seconds": setup.budget_seconds,
            "test_sentences": n, "beam_size": BEAM_SIZE, "alpha": ALPHA,
            "batch_tokens": BATCH_TOKENS, "wall_seconds": round(
                time.time() - started, 1),
            "loadavg_1m_at_end": round(load, 2), "systems": {}}
  lines = []
  for name in systems:
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
      sources=testset.sources, references=testset.references,
      hypotheses={name: outcomes[name].hypotheses for name in systems},
      count=_EXAMPLES.value)
  toolkit.write_json(pathlib.Path(_OUTPUT.value), report)
  if _BENCHMARKS_MD.value:
    try:
      toolkit.append_benchmark_lines(pathlib.Path(_BENCHMARKS_MD.value), lines)
    except toolkit.PeerError as e:
      sys.exit(f"peer: error: {e}")
  print(f"Wrote {_OUTPUT.value}", flush=True)


def run() -> None:
  app.run(main)


if __name__ == "__main__":
  run()
