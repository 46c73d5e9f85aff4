"""Train and decode each system of the peer yardstick, pinned to one core.

Shared by ``run.py`` (one comparison), ``select.py`` (dev-only recipe
selection and the final comparison). Every step is a subprocess under
``taskset -c CORE`` with one intra-op thread: ``m4moe.cli.train`` /
``m4moe.cli.eval`` for our system, ``driver.py`` in the OpenNMT-tf
virtualenv for the peer. A step reads only the corpus directory and split
it is given: the selection passes a corpus that has no test split.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import sys
from typing import Any, Sequence

from m4moe.benchmarks.peer import throughput
from m4moe.benchmarks.peer import toolkit
from m4moe.data import vocab as vocab_lib
from m4moe.eval import evaluate as evaluate_lib
from m4moe.eval import examples as examples_lib
from m4moe.eval import results
from m4moe.eval import testsets as testsets_lib
from m4moe.pipeline import supervisor
from m4moe.training import metrics_log

BEAM_SIZE, ALPHA, MAX_LENGTH, DECODE_BATCH = 4, 0.6, 64, 32
PEER_NAME = "OpenNMT-tf 2.32.0"
# The environment variable naming the OpenNMT-tf virtualenv when
# --onmt_venv is not given.
ONMT_VENV_ENV = "M4MOE_ONMT_VENV"


# The driver's wall-clock budget when tokens bound the run instead.
NO_TIME_LIMIT = 1e9


@dataclasses.dataclass(frozen=True, kw_only=True)
class Budget:
  """How long a run trains: wall-clock ``seconds`` or training ``tokens``.

  ``tokens`` counts batch capacity: a run with ``B``-token batches trains
  ``tokens / B`` steps (:meth:`steps_for`), so every candidate and system
  gets the same training tokens whatever its batch size and however busy
  the machine. Seconds (``run.py`` only) compare toolkits at equal time
  but depend on the machine's load.
  """

  seconds: float = 0.0
  tokens: int = 0

  def __post_init__(self) -> None:
    if (self.seconds > 0) == (self.tokens > 0) or min(self.seconds,
                                                      self.tokens) < 0:
      raise ValueError(f"budget seconds={self.seconds}, tokens={self.tokens}"
                       ": give exactly one of them, positive "
                       "(select.py: --budget_tokens)")

  def steps_for(self, batch_tokens: int) -> int:
    """Steps of ``batch_tokens``-token batches (0 for a time budget)."""
    if not self.tokens:
      return 0
    return max(1, round(self.tokens / batch_tokens))

  def to_dict(self) -> dict[str, float]:
    return ({"budget_seconds": self.seconds} if self.seconds
            else {"budget_tokens": self.tokens})


@dataclasses.dataclass(frozen=True, kw_only=True)
class Decoding:
  """How both systems decode in the selection and the final: one config.

  A comparison whose systems decode with different output caps, source
  cuts or batch orders measures those: the cap sets how long a run-on
  hypothesis may grow (and the cost of every beam-search batch), the
  batch order which sentences share a batch. So both get exactly this.

  Attributes:
    beam_size: beam width.
    length_penalty: GNMT length-penalty alpha.
    batch_size: sentences per beam-search batch.
    max_source_pieces: sources are cut to this many SentencePiece pieces
      (the longest training source: 64 ids with the tag and EOS).
    max_output_tokens: the fixed cap on decoded target tokens, the rule
      ``2 * max_source_pieces + 16`` (twice the longest source plus 16),
      the same for every sentence and both systems.
    sort_by_length: batches are formed from the non-empty sources sorted
      by their (cut) piece count, ties in input order; outputs are put
      back in input order.
  """

  beam_size: int = BEAM_SIZE
  length_penalty: float = ALPHA
  batch_size: int = DECODE_BATCH
  max_source_pieces: int = MAX_LENGTH - 2
  max_output_tokens: int = 2 * (MAX_LENGTH - 2) + 16
  sort_by_length: bool = True

  def m4moe_flags(self) -> tuple[str, ...]:
    """m4moe-eval's flags for this config (a fixed cap: no length ratio)."""
    return (f"--beam_size={self.beam_size}",
            f"--alpha={self.length_penalty}",
            f"--batch_size={self.batch_size}",
            f"--max_input_length={self.max_source_pieces + 2}",
            "--decode_length_ratio=0",
            f"--max_decode_length={self.max_output_tokens}")

  def to_dict(self) -> dict[str, Any]:
    return {**dataclasses.asdict(self),
            "output_cap_rule": "2 * max_source_pieces + 16, fixed",
            "speed": "sentences over the seconds of decoding only (graph "
                     "tracing included; model building and checkpoint "
                     "restore or averaging excluded), same sentences"}


def sorted_order(lengths: Sequence[int]) -> list[int]:
  """Input indices of the non-empty sentences, shortest first, ties in
  input order (the order our translator batches them in)."""
  return sorted((i for i, n in enumerate(lengths) if n > 0),
                key=lambda i: (lengths[i], i))


@dataclasses.dataclass(frozen=True, kw_only=True)
class Data:
  """The corpus (``train``, ``dev`` and the decoded splits) and vocabulary."""
  corpus_dir: pathlib.Path
  vocab_dir: pathlib.Path
  language: str


@dataclasses.dataclass(frozen=True, kw_only=True)
class Decoded:
  """One system's decoding of one split, scored by ``m4moe.eval``."""
  split: str
  hypotheses: list[str]
  sentences: int
  seconds: float
  eval_path: pathlib.Path
  bleu: float
  chrf: float


def onmt_venv(flag_value: str | None) -> pathlib.Path:
  """The peer's virtualenv: the flag, else ``$M4MOE_ONMT_VENV``.

  Raises:
    toolkit.PeerError: neither is set (the message says how to set one).
  """
  value = flag_value or os.environ.get(ONMT_VENV_ENV, "")
  if not value:
    raise toolkit.PeerError(
        f"no OpenNMT-tf virtualenv: pass --onmt_venv=DIR or set "
        f"{ONMT_VENV_ENV}=DIR (built there with the pinned versions if "
        "missing; see m4moe/benchmarks/peer/README.md)")
  return pathlib.Path(value).resolve()


def _pinned_env() -> dict[str, str]:
  return {**os.environ, "TF_NUM_INTRAOP_THREADS": "1", "OMP_NUM_THREADS": "1",
          "TF_CPP_MIN_LOG_LEVEL": "1"}


def run_pinned(command: Sequence[str], *, core: str, log: pathlib.Path,
               what: str) -> None:
  """Runs ``command`` pinned to ``core``, output to ``log``.

  The child runs under :class:`supervisor.StageProcesses`, as m4moe-run's
  stages do: a SIGTERM or SIGINT to this process is forwarded to it (a
  training run saves and stops) and it gets SIGTERM if this process dies,
  so stopping a selection never leaves a candidate training on, unseen,
  beside the next one.

  Raises:
    toolkit.PeerError: the command failed or was stopped by a signal
      (names the log).
  """
  log.parent.mkdir(parents=True, exist_ok=True)
  pinned = ["taskset", "-c", core, *command]
  with open(log, "w", encoding="utf-8") as out:
    out.write("$ " + " ".join(pinned) + "\n")
    out.flush()
    with supervisor.StageProcesses() as processes:
      processes.start(pinned, env=_pinned_env(), stdout=out)
      _, returncode = processes.wait_any()
  if processes.interrupted_by is not None:
    raise toolkit.PeerError(
        f"{what} was stopped by signal {processes.interrupted_by}; see {log}."
        " Re-run the same command: finished candidates are skipped and this "
        "one starts again")
  if returncode != 0:
    raise toolkit.PeerError(f"{what} failed (exit {returncode}); see {log}")


def train_m4moe(*, data: Data, root: pathlib.Path, config: str,
                flags: Sequence[str], batch_tokens: int, budget: Budget,
                seed: int, core: str, checkpoint_every: int = 0,
                keep_checkpoints: int = 0) -> dict[str, Any]:
  """Trains ``config`` 2+2 for ``budget``; returns its summary.

  ``checkpoint_every`` and ``keep_checkpoints`` (0: the final checkpoint
  only) keep checkpoints for :func:`average_m4moe`.
  """
  model_dir = root / "model"
  steps = budget.steps_for(batch_tokens) or toolkit.NO_STEP_LIMIT
  keep = ([f"--keep_checkpoints={keep_checkpoints}"] if keep_checkpoints
          else [])
  run_pinned(
      [sys.executable, "-m", "m4moe.cli.train", f"--config={config}",
       "--num_encoder_layers=2", "--num_decoder_layers=2",
       f"--corpus_dir={data.corpus_dir}", f"--vocab_dir={data.vocab_dir}",
       f"--languages={data.language}", f"--batch_tokens={batch_tokens}",
       f"--sequence_length={MAX_LENGTH}",
       f"--train_steps={steps}", f"--max_train_seconds={budget.seconds}",
       "--eval_every=0",
       f"--checkpoint_every={checkpoint_every or toolkit.NO_STEP_LIMIT}",
       *keep, "--log_every=50",
       f"--seed={seed}", f"--model_dir={model_dir}", *flags],
      core=core, log=root / "train.log", what=f"{root.name} training")
  return toolkit.m4moe_train_summary(model_dir / metrics_log.METRICS_FILENAME,
                                     language=data.language)


def hypotheses_path(root: pathlib.Path, split: str, language: str
                    ) -> pathlib.Path:
  """Where either system's decoded ``split`` lives under its run ``root``.

  The layout is ``m4moe-eval --hypotheses_dir``'s: ``hyp_<split>/<lang>.hyp``.
  """
  return root / f"hyp_{split}" / f"{language}.hyp"


def write_hypotheses(path: pathlib.Path, hypotheses: Sequence[str]) -> None:
  """One hypothesis a line (:func:`examples_lib.read_hypotheses` reads it)."""
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text("".join(h + "\n" for h in hypotheses), encoding="utf-8")


def average_m4moe(*, root: pathlib.Path, last: int, core: str) -> None:
  """Averages the last ``last`` checkpoints of the run under ``root``."""
  run_pinned([sys.executable, "-m", "m4moe.cli.average",
              f"--model_dir={root / 'model'}", f"--last={last}"],
             core=core, log=root / "average.log",
             what=f"{root.name} averaging")


def decode_m4moe(*, data: Data, root: pathlib.Path, split: str, name: str,
                 core: str, max_sentences: int = 0,
                 decoding: Decoding | None = None,
                 averaged: bool = False) -> Decoded:
  """Decodes ``split`` of ``data.corpus_dir`` with the model under ``root``.

  ``decoding``: the shared config (None: m4moe-eval's own length rule, as
  ``run.py`` decodes); ``averaged``: decode :func:`average_m4moe`'s
  checkpoint.
  """
  eval_path = root / f"eval_{split}.json"
  hyp_dir = hypotheses_path(root, split, data.language).parent
  decode_flags = (decoding.m4moe_flags() if decoding else (
      f"--beam_size={BEAM_SIZE}", f"--alpha={ALPHA}",
      f"--batch_size={DECODE_BATCH}"))
  run_pinned(
      [sys.executable, "-m", "m4moe.cli.eval", f"--model_dir={root / 'model'}",
       *(["--checkpoint=averaged"] if averaged else []),
       f"--vocab_dir={data.vocab_dir}", f"--corpus_dir={data.corpus_dir}",
       f"--split={split}", f"--languages={data.language}",
       f"--max_sentences={max_sentences}", *decode_flags,
       f"--model_name={name}", "--kind=bilingual",
       f"--hypotheses_dir={hyp_dir}", f"--output={eval_path}"],
      core=core, log=root / f"eval_{split}.log",
      what=f"{root.name} decoding ({split})")
  stats = json.loads(eval_path.read_text(encoding="utf-8"))["metadata"][
      "decode_stats"]
  # Split on "\n" only: a hypothesis may hold other line separators.
  hyps = examples_lib.read_hypotheses(
      hypotheses_path(root, split, data.language))
  score = results.read_eval_json(eval_path).languages[data.language]
  return Decoded(split=split, hypotheses=hyps,
                 sentences=int(stats["sentences"]),
                 seconds=float(stats["seconds"]), eval_path=eval_path,
                 bleu=float(score.bleu), chrf=float(score.chrf))


def prepare_peer(*, data: Data, root: pathlib.Path,
                 recipe: toolkit.PeerRecipe, model: toolkit.PeerModel,
                 budget: Budget) -> dict[str, Any]:
  """The peer's pieces (train, dev), vocabularies, model file and config.

  Reads ``train`` and ``dev`` of ``data.corpus_dir`` only. Returns the
  counts (also written to ``root/data_counts.json``).

  Raises:
    toolkit.PeerError: a split file is missing.
  """
  source_sp = vocab_lib.load(data.vocab_dir / "source.model")
  target_sp = vocab_lib.load(data.vocab_dir / "target.model")
  pieces = root / "data"
  counts: dict[str, Any] = {}
  for split in ("train", "dev"):
    path = data.corpus_dir / split / f"{data.language}.tsv"
    if not path.is_file():
      raise toolkit.PeerError(f"{path} does not exist: is the corpus one "
                              f"with language {data.language!r}?")
    pairs = [(x, en) for en, x in testsets_lib.read_pairs(path)]
    counts[split] = dataclasses.asdict(toolkit.write_pieces(
        pairs, source_sp=source_sp, target_sp=target_sp,
        source_path=pieces / f"{split}.{data.language}",
        target_path=pieces / f"{split}.en", max_length=recipe.max_length))
  files = toolkit.PeerFiles(
      train_source=pieces / f"train.{data.language}",
      train_target=pieces / "train.en",
      dev_source=pieces / f"dev.{data.language}",
      dev_target=pieces / "dev.en",
      source_vocab=pieces / "source.vocab",
      target_vocab=pieces / "target.vocab")
  for side in ("source", "target"):
    counts[f"{side}_vocab"] = toolkit.write_vocabulary(
        data.vocab_dir / f"{side}.vocab", pieces / f"{side}.vocab")
  (root / "model.py").write_text(toolkit.model_file_text(model),
                                 encoding="utf-8")
  toolkit.write_json(root / "config.json", toolkit.run_config(
      recipe=recipe, files=files, model_dir=root / "model",
      max_step=budget.steps_for(recipe.batch_tokens) or toolkit.NO_STEP_LIMIT))
  toolkit.write_json(root / "data_counts.json", counts)
  return counts


def _driver(python: pathlib.Path, command: str, root: pathlib.Path,
            seed: int) -> list[str]:
  driver = str(pathlib.Path(__file__).with_name("driver.py"))
  return [str(python), driver, command, f"--config={root / 'config.json'}",
          f"--model_file={root / 'model.py'}", f"--seed={seed}",
          "--intra_op_threads=1"]


def train_peer(*, python: pathlib.Path, root: pathlib.Path, budget: Budget,
               seed: int, core: str) -> dict[str, Any]:
  """Trains the peer prepared (with ``budget``) under ``root``.

  Its summary gains ``throughput.summary`` of the driver's steps.jsonl
  (``target_tokens_per_sec``: the definition shared with ours).

  Raises:
    toolkit.PeerError: training failed, or its steps log is damaged.
  """
  config = json.loads((root / "config.json").read_text(encoding="utf-8"))
  steps_log = root / throughput.PEER_STEPS_FILENAME
  run_pinned([*_driver(python, "train", root, seed),
              f"--budget_seconds={budget.seconds or NO_TIME_LIMIT}",
              f"--max_step={config['train']['max_step']}",
              f"--steps_log={steps_log}",
              f"--summary={root / 'train.json'}"],
             core=core, log=root / "train.log", what=f"{root.name} training")
  summary = json.loads((root / "train.json").read_text(encoding="utf-8"))
  try:
    return {**summary,
            **throughput.summary(throughput.peer_intervals(steps_log))}
  except ValueError as e:
    raise toolkit.PeerError(f"{steps_log}: {e}") from e


def _peer_features(testset: testsets_lib.TestSet, *, source_sp: Any,
                   path: pathlib.Path, decoding: Decoding | None
                   ) -> tuple[list[int], int]:
  """Writes the peer's features; returns their input indices and cuts.

  With ``decoding`` (sorted by length) only the non-empty sources are
  written, shortest first, as our translator batches them; without it
  every source in input order (``run.py``).
  """
  max_pieces = decoding.max_source_pieces if decoding else MAX_LENGTH - 2
  if decoding is None or not decoding.sort_by_length:
    order = list(range(len(testset.sources)))
  else:
    lengths = [min(len(source_sp.encode(s, out_type=str)), max_pieces)
               if s.strip() else 0 for s in testset.sources]
    order = sorted_order(lengths)
  truncated = toolkit.write_test_pieces(
      [testset.sources[i] for i in order], source_sp=source_sp, path=path,
      max_pieces=max_pieces)
  return order, sum(truncated)


def decode_peer(*, python: pathlib.Path, data: Data, root: pathlib.Path,
                testset: testsets_lib.TestSet, split: str, name: str,
                seed: int, core: str, decoding: Decoding | None = None,
                average: int = 0) -> Decoded:
  """Decodes ``testset`` with the peer trained under ``root`` and scores it.

  ``decoding``: the shared config (the run config's cap was written from
  it by :func:`prepare_peer`); ``average``: decode the mean of the last
  N checkpoints.

  Raises:
    toolkit.PeerError: decoding failed or gave the wrong number of lines.
  """
  source_sp = vocab_lib.load(data.vocab_dir / "source.model")
  target_sp = vocab_lib.load(data.vocab_dir / "target.model")
  features = root / "data" / f"{split}.{data.language}.src"
  order, truncated = _peer_features(testset, source_sp=source_sp,
                                    path=features, decoding=decoding)
  predictions = root / f"{split}.{data.language}.en.pieces"
  summary = root / f"decode_{split}.json"
  run_pinned([*_driver(python, "infer", root, seed), f"--features={features}",
              f"--predictions={predictions}", f"--summary={summary}",
              f"--average={average}"],
             core=core, log=root / f"decode_{split}.log",
             what=f"{root.name} decoding ({split})")
  decode = json.loads(summary.read_text(encoding="utf-8"))
  lines = examples_lib.read_hypotheses(predictions)
  if len(lines) != len(order):
    raise toolkit.PeerError(f"{predictions}: {len(lines)} lines for "
                            f"{len(order)} sentences")
  hyps = [""] * len(testset.sources)
  for index, line in zip(order, lines):
    if testset.sources[index].strip():
      hyps[index] = toolkit.detokenize(line, target_sp=target_sp)
  result = evaluate_lib.evaluate(
      lambda sources, **_: hyps, [testset], model=name, kind="bilingual",
      metadata={"system": PEER_NAME, "split": split, "decode": decode,
                "decoding": (decoding.to_dict() if decoding else {
                    "beam_size": BEAM_SIZE, "length_penalty": ALPHA}),
                "sources_truncated": truncated})
  eval_path = root / f"eval_{split}.json"
  results.write_eval_json(result, eval_path)
  write_hypotheses(hypotheses_path(root, split, data.language), hyps)
  score = result.languages[data.language]
  return Decoded(split=split, hypotheses=hyps,
                 sentences=len(testset.sources),
                 seconds=float(decode["seconds"]), eval_path=eval_path,
                 bleu=float(score.bleu), chrf=float(score.chrf))
