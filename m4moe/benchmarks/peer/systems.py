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


# Training steps are counted in batches of this many tokens: a run with
# other batches gets the steps that give it the same training tokens.
REFERENCE_BATCH_TOKENS = 4096
# The driver's wall-clock budget when steps bound the run instead.
NO_TIME_LIMIT = 1e9


@dataclasses.dataclass(frozen=True, kw_only=True)
class Budget:
  """How long a run trains: wall-clock ``seconds`` or ``steps``, not both.

  ``steps`` are batches of :data:`REFERENCE_BATCH_TOKENS` tokens; a run with
  other batches trains the same number of tokens (:meth:`steps_for`).
  Seconds compare toolkits at equal time but depend on the machine's load;
  steps give every candidate the same training however busy the machine.
  """

  seconds: float = 0.0
  steps: int = 0

  def __post_init__(self) -> None:
    if (self.seconds > 0) == (self.steps > 0) or min(self.seconds,
                                                     self.steps) < 0:
      raise ValueError(f"budget seconds={self.seconds}, steps={self.steps}: "
                       "give exactly one of --budget_seconds and "
                       "--budget_steps, positive")

  def steps_for(self, batch_tokens: int) -> int:
    """Steps of ``batch_tokens``-token batches (0 for a time budget)."""
    return round(self.steps * REFERENCE_BATCH_TOKENS / batch_tokens)

  def to_dict(self) -> dict[str, float]:
    return ({"budget_seconds": self.seconds} if self.seconds
            else {"budget_steps": self.steps})


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
                seed: int, core: str) -> dict[str, Any]:
  """Trains ``config`` 2+2 for ``budget``; returns its summary."""
  model_dir = root / "model"
  steps = budget.steps_for(batch_tokens) or toolkit.NO_STEP_LIMIT
  run_pinned(
      [sys.executable, "-m", "m4moe.cli.train", f"--config={config}",
       "--num_encoder_layers=2", "--num_decoder_layers=2",
       f"--corpus_dir={data.corpus_dir}", f"--vocab_dir={data.vocab_dir}",
       f"--languages={data.language}", f"--batch_tokens={batch_tokens}",
       f"--sequence_length={MAX_LENGTH}",
       f"--train_steps={steps}", f"--max_train_seconds={budget.seconds}",
       "--eval_every=0",
       f"--checkpoint_every={toolkit.NO_STEP_LIMIT}", "--log_every=50",
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


def decode_m4moe(*, data: Data, root: pathlib.Path, split: str, name: str,
                 core: str, max_sentences: int = 0) -> Decoded:
  """Decodes ``split`` of ``data.corpus_dir`` with the model under ``root``."""
  eval_path = root / f"eval_{split}.json"
  hyp_dir = hypotheses_path(root, split, data.language).parent
  run_pinned(
      [sys.executable, "-m", "m4moe.cli.eval", f"--model_dir={root / 'model'}",
       f"--vocab_dir={data.vocab_dir}", f"--corpus_dir={data.corpus_dir}",
       f"--split={split}", f"--languages={data.language}",
       f"--max_sentences={max_sentences}", f"--beam_size={BEAM_SIZE}",
       f"--alpha={ALPHA}", f"--batch_size={DECODE_BATCH}",
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
  """Trains the peer prepared (with ``budget``) under ``root``."""
  run_pinned([*_driver(python, "train", root, seed),
              f"--budget_seconds={budget.seconds or NO_TIME_LIMIT}",
              f"--summary={root / 'train.json'}"],
             core=core, log=root / "train.log", what=f"{root.name} training")
  return json.loads((root / "train.json").read_text(encoding="utf-8"))


def decode_peer(*, python: pathlib.Path, data: Data, root: pathlib.Path,
                testset: testsets_lib.TestSet, split: str, name: str,
                seed: int, core: str) -> Decoded:
  """Decodes ``testset`` with the peer trained under ``root`` and scores it.

  Raises:
    toolkit.PeerError: decoding failed or gave the wrong number of lines.
  """
  source_sp = vocab_lib.load(data.vocab_dir / "source.model")
  target_sp = vocab_lib.load(data.vocab_dir / "target.model")
  features = root / "data" / f"{split}.{data.language}.src"
  # Our translator keeps tag + pieces + EOS within MAX_LENGTH.
  truncated = toolkit.write_test_pieces(testset.sources, source_sp=source_sp,
                                        path=features,
                                        max_pieces=MAX_LENGTH - 2)
  predictions = root / f"{split}.{data.language}.en.pieces"
  summary = root / f"decode_{split}.json"
  run_pinned([*_driver(python, "infer", root, seed), f"--features={features}",
              f"--predictions={predictions}", f"--summary={summary}"],
             core=core, log=root / f"decode_{split}.log",
             what=f"{root.name} decoding ({split})")
  decode = json.loads(summary.read_text(encoding="utf-8"))
  lines = examples_lib.read_hypotheses(predictions)
  if len(lines) != len(testset.sources):
    raise toolkit.PeerError(f"{predictions}: {len(lines)} lines for "
                            f"{len(testset.sources)} sentences")
  hyps = [toolkit.detokenize(line, target_sp=target_sp) if src.strip()
          else "" for line, src in zip(lines, testset.sources)]
  result = evaluate_lib.evaluate(
      lambda sources, **_: hyps, [testset], model=name, kind="bilingual",
      metadata={"system": PEER_NAME, "beam_size": BEAM_SIZE,
                "length_penalty": ALPHA, "split": split, "decode": decode,
                "sources_truncated": sum(truncated)})
  eval_path = root / f"eval_{split}.json"
  results.write_eval_json(result, eval_path)
  write_hypotheses(hypotheses_path(root, split, data.language), hyps)
  score = result.languages[data.language]
  return Decoded(split=split, hypotheses=hyps,
                 sentences=int(decode["sentences"]),
                 seconds=float(decode["seconds"]), eval_path=eval_path,
                 bleu=float(score.bleu), chrf=float(score.chrf))
