"""OpenNMT-tf as the peer system: its virtualenv, inputs, model and config.

The peer trains on exactly our SentencePiece pieces: every training and dev
pair is encoded with the demo's ``source.model``/``target.model`` and
written as space-separated pieces (OpenNMT-tf then only splits on spaces,
so no tokenizer of its own is involved), and its vocabularies are our
``.vocab`` piece lists. Pairs our trainer would drop as too long (source
pieces + tag + EOS, or target pieces + EOS, over ``max_length``) are dropped
here too and counted.

The model file builds OpenNMT-tf's Transformer with the dimensions of our
2+2-layer ``tiny/dense``: d_model 128, 4 heads, FFN 512, pre-norm, separate
source/target embeddings and softmax (no sharing). Its recipe is plain Adam
(5e-4 peak, linear warmup, inverse-square-root decay), label smoothing 0.1,
4096-token batches, beam 4 with GNMT length penalty 0.6.

Nothing here imports ``opennmt``: the peer runs in its own virtualenv
(``driver.py`` is its entry point), because it pins TensorFlow 2.13.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import re
import subprocess
from typing import Any, Callable, Iterable, Mapping, Sequence

import sentencepiece as spm

from m4moe.benchmarks.peer import throughput
from m4moe.training import metrics_log

# The peer's exact pins: OpenNMT-tf 2.32 needs TF 2.13 and addons;
# installed without its own dependency resolution, as its metadata asks for
# a TensorFlow range pip cannot satisfy on Python 3.11 otherwise.
PEER_REQUIREMENTS = ("tensorflow==2.13.1", "tensorflow-addons==0.21.0",
                     "ctranslate2==3.24.0", "pyonmttok", "pyyaml", "rouge",
                     "sacrebleu")
PEER_PACKAGE = "opennmt-tf==2.32.0"

# OpenNMT-tf's own special tokens, first in its vocabulary files; our
# SentencePiece control pieces are left out (the peer adds BOS/EOS itself and
# maps unknown pieces to its OOV bucket).
ONMT_SPECIALS = ("<blank>", "<s>", "</s>")
SP_CONTROL = frozenset({"<pad>", "<s>", "</s>", "<unk>"})
# Line breaks become spaces, as in m4moe.eval.translator (not imported here:
# it loads TensorFlow, which the flag checks and tests of this module avoid).
_LINE_BREAKS = re.compile(r"[\r\n]")


class PeerError(RuntimeError):
  """A peer step failed; the message says which file or command and why."""


def venv_commands(venv: pathlib.Path, *,
                  python: str = "python3") -> list[list[str]]:
  """The commands that build the peer's virtualenv, in order."""
  pip = str(venv / "bin" / "pip")
  return [[python, "-m", "venv", str(venv)],
          [pip, "install", *PEER_REQUIREMENTS],
          [pip, "install", "--no-deps", PEER_PACKAGE]]


def venv_ready(venv: pathlib.Path, *,
               run: Callable[..., Any] = subprocess.run) -> bool:
  """Whether ``venv``'s Python imports opennmt at the pinned version."""
  python = venv / "bin" / "python"
  if not python.is_file():
    return False
  check = run([str(python), "-c",
               "import importlib.metadata as m; "
               "print(m.version('OpenNMT-tf'))"],
              capture_output=True, text=True, check=False)
  return (check.returncode == 0 and
          check.stdout.strip() == PEER_PACKAGE.split("==")[1])


def ensure_venv(venv: pathlib.Path, *, log: pathlib.Path,
                run: Callable[..., Any] = subprocess.run) -> pathlib.Path:
  """The peer's Python, building ``venv`` with the pins if it is missing.

  Raises:
    PeerError: a build command failed (names it and the log), or the venv
      exists with another OpenNMT-tf version (never overwritten).
  """
  python = venv / "bin" / "python"
  if venv_ready(venv, run=run):
    return python
  if python.exists():
    raise PeerError(f"{venv} exists but does not have {PEER_PACKAGE}; pass "
                    f"another --onmt_venv (it is created there) or install "
                    f"the pins into it: {' && '.join(map(' '.join, venv_commands(venv)))}")
  log.parent.mkdir(parents=True, exist_ok=True)
  with open(log, "a", encoding="utf-8") as out:
    for command in venv_commands(venv):
      out.write("$ " + " ".join(command) + "\n")
      out.flush()
      done = run(command, stdout=out, stderr=subprocess.STDOUT, check=False)
      if done.returncode != 0:
        raise PeerError(f"building the OpenNMT-tf virtualenv failed (exit "
                        f"{done.returncode}): {' '.join(command)}; see {log}")
  if not venv_ready(venv, run=run):
    raise PeerError(f"{venv} was built but does not import {PEER_PACKAGE}; "
                    f"see {log}")
  return python


def write_vocabulary(sp_vocab: pathlib.Path, output: pathlib.Path) -> int:
  """Writes an OpenNMT-tf vocabulary from a SentencePiece ``.vocab`` file.

  Returns:
    The number of entries written (specials included).

  Raises:
    PeerError: a line is not ``piece<TAB>score`` or a piece repeats (names
      the file and line).
  """
  pieces, seen = list(ONMT_SPECIALS), set(ONMT_SPECIALS)
  with open(sp_vocab, encoding="utf-8") as f:
    for number, line in enumerate(f, start=1):
      piece, tab, _ = line.rstrip("\n").partition("\t")
      if not tab or not piece or any(c.isspace() for c in piece):
        raise PeerError(f"{sp_vocab}:{number}: expected 'piece<TAB>score' "
                        f"with a piece without spaces, got {line!r}; is it a "
                        "SentencePiece .vocab file from m4moe-vocab?")
      if piece in SP_CONTROL:
        continue
      if piece in seen:
        raise PeerError(f"{sp_vocab}:{number}: piece {piece!r} repeats")
      seen.add(piece)
      pieces.append(piece)
  output.parent.mkdir(parents=True, exist_ok=True)
  tmp = output.with_suffix(output.suffix + ".tmp")
  tmp.write_text("".join(p + "\n" for p in pieces), encoding="utf-8")
  tmp.replace(output)
  return len(pieces)


@dataclasses.dataclass(frozen=True)
class PieceCounts:
  """What :func:`write_pieces` kept and dropped."""
  pairs: int
  written: int
  dropped_too_long: int
  dropped_empty: int


def write_pieces(pairs: Iterable[tuple[str, str]], *,
                 source_sp: spm.SentencePieceProcessor,
                 target_sp: spm.SentencePieceProcessor,
                 source_path: pathlib.Path, target_path: pathlib.Path,
                 max_length: int) -> PieceCounts:
  """Writes ``(source, target)`` pairs as space-separated pieces.

  A pair is dropped (and counted) when either side is empty or, as in our
  input pipeline, when the source pieces + tag + EOS or the target pieces +
  EOS exceed ``max_length``.
  """
  total = written = too_long = empty = 0
  source_path.parent.mkdir(parents=True, exist_ok=True)
  with open(source_path, "w", encoding="utf-8") as src, \
      open(target_path, "w", encoding="utf-8") as tgt:
    for source, target in pairs:
      total += 1
      if not source.strip() or not target.strip():
        empty += 1
        continue
      source_pieces = source_sp.encode(source, out_type=str)
      target_pieces = target_sp.encode(target, out_type=str)
      if (len(source_pieces) + 2 > max_length or
          len(target_pieces) + 1 > max_length):
        too_long += 1
        continue
      src.write(" ".join(source_pieces) + "\n")
      tgt.write(" ".join(target_pieces) + "\n")
      written += 1
  return PieceCounts(pairs=total, written=written, dropped_too_long=too_long,
                     dropped_empty=empty)


def write_test_pieces(sources: Sequence[str], *,
                      source_sp: spm.SentencePieceProcessor,
                      path: pathlib.Path, max_pieces: int) -> list[bool]:
  """Writes test sources as pieces (cut to ``max_pieces``, as our translator).

  Returns:
    Per sentence, whether it was truncated.
  """
  truncated = []
  path.parent.mkdir(parents=True, exist_ok=True)
  with open(path, "w", encoding="utf-8") as f:
    for source in sources:
      pieces = source_sp.encode(source, out_type=str)
      truncated.append(len(pieces) > max_pieces)
      f.write(" ".join(pieces[:max_pieces]) + "\n")
  return truncated


def detokenize(line: str, *, target_sp: spm.SentencePieceProcessor) -> str:
  """One line of peer output pieces -> text, as our translator decodes."""
  text = target_sp.decode_pieces(line.split())
  return _LINE_BREAKS.sub(" ", text)


@dataclasses.dataclass(frozen=True, kw_only=True)
class PeerModel:
  """The peer's Transformer; defaults are our 2+2-layer ``tiny/dense``.

  Attributes:
    d_model: embedding and hidden width.
    num_heads: attention heads.
    d_ff: inner width of every feed-forward block.
    num_encoder_layers, num_decoder_layers: stack depths.
    dropout: residual, attention and FFN dropout (0.1 in the peer's first
      recipe; the dev selection tries 0 and 0.1).
  """

  d_model: int = 128
  num_heads: int = 4
  d_ff: int = 512
  num_encoder_layers: int = 2
  num_decoder_layers: int = 2
  dropout: float = 0.1

  def __post_init__(self) -> None:
    for name in ("d_model", "num_heads", "d_ff", "num_encoder_layers",
                 "num_decoder_layers"):
      if getattr(self, name) < 1:
        raise ValueError(f"{name}={getattr(self, name)}: use a positive "
                         "integer")
    if self.d_model % self.num_heads:
      raise ValueError(f"d_model={self.d_model} is not a multiple of "
                       f"num_heads={self.num_heads}: pick a divisor")
    if not 0 <= self.dropout < 1:
      raise ValueError(f"dropout={self.dropout}: use a rate in [0, 1)")


def model_file_text(model: PeerModel) -> str:
  """An OpenNMT-tf ``--model`` file (Python defining ``model()``)."""
  return f'''"""OpenNMT-tf Transformer with the dimensions of m4moe's 2+2 tiny/dense.

Written by m4moe.benchmarks.peer.toolkit.model_file_text.
"""
import opennmt


def model():
  return opennmt.models.Transformer(
      source_inputter=opennmt.inputters.WordEmbedder(
          embedding_size={model.d_model}),
      target_inputter=opennmt.inputters.WordEmbedder(
          embedding_size={model.d_model}),
      num_layers=({model.num_encoder_layers}, {model.num_decoder_layers}),
      num_units={model.d_model},
      num_heads={model.num_heads},
      ffn_inner_dim={model.d_ff},
      dropout={model.dropout},
      attention_dropout={model.dropout},
      ffn_dropout={model.dropout},
      pre_norm=True,
      share_embeddings=opennmt.models.EmbeddingsSharingLevel.NONE)
'''


@dataclasses.dataclass(frozen=True, kw_only=True)
class PeerRecipe:
  """The peer's training and decoding settings.

  Attributes:
    learning_rate: Adam's peak rate, reached after ``warmup_steps``.
    warmup_steps: linear warmup, then the ``decay``.
    decay: ``rsqrt`` (InvSqrtDecay: lr * sqrt(warmup_steps / step)) or
      ``cosine`` (CosineAnnealing to 0 at ``planned_steps``).
    planned_steps: the run's planned steps (the cosine's end; 0 with
      ``rsqrt`` and a wall-clock budget).
    beta1, beta2: Adam's moment decay rates.
    clipnorm: Adam's per-variable gradient norm clip (0: off), the
      ``optimizer_params`` OpenNMT-tf's own ``clip_gradients`` becomes.
    checkpoint_every, keep_checkpoints: checkpoints kept for averaging
      (0: only the final one).
    label_smoothing: training label smoothing.
    batch_tokens: tokens per training batch (OpenNMT-tf token batches).
    max_length: longest training sequence on either side, in tokens.
    max_decode_length: most target tokens a decoded sentence may have.
    beam_size: beam width at test time.
    length_penalty: GNMT length-penalty alpha.
    decode_batch_size: test sentences per beam-search batch.
    report_every: training steps between throughput log lines.
  """

  learning_rate: float = 5e-4
  warmup_steps: int = 300
  decay: str = "rsqrt"
  planned_steps: int = 0
  beta1: float = 0.9
  beta2: float = 0.999
  clipnorm: float = 0.0
  checkpoint_every: int = 0
  keep_checkpoints: int = 2
  label_smoothing: float = 0.1
  batch_tokens: int = 4096
  max_length: int = 64
  max_decode_length: int = 64
  beam_size: int = 4
  length_penalty: float = 0.6
  decode_batch_size: int = 32
  report_every: int = 50

  def __post_init__(self) -> None:
    if self.learning_rate <= 0:
      raise ValueError(f"learning_rate={self.learning_rate}: use a positive "
                       "rate, e.g. 5e-4")
    for name in ("warmup_steps", "batch_tokens", "beam_size",
                 "decode_batch_size", "report_every"):
      if getattr(self, name) < 1:
        raise ValueError(f"{name}={getattr(self, name)}: use a positive "
                         "integer")
    if self.max_length < 4 or self.batch_tokens < self.max_length:
      raise ValueError(f"max_length={self.max_length}, batch_tokens="
                       f"{self.batch_tokens}: need 4 <= max_length <= "
                       "batch_tokens")
    if self.decay not in ("rsqrt", "cosine") or (
        self.decay == "cosine" and self.planned_steps <= self.warmup_steps):
      raise ValueError(f"decay={self.decay!r} with warmup_steps="
                       f"{self.warmup_steps}, planned_steps="
                       f"{self.planned_steps}: use rsqrt, or cosine with "
                       "planned_steps past the warmup")
    if min(self.clipnorm, self.checkpoint_every) < 0 or (
        self.keep_checkpoints < 1 or self.max_decode_length < 1):
      raise ValueError(f"clipnorm={self.clipnorm}, checkpoint_every="
                       f"{self.checkpoint_every}, keep_checkpoints="
                       f"{self.keep_checkpoints}, max_decode_length="
                       f"{self.max_decode_length}: use clipnorm and "
                       "checkpoint_every >= 0 (0: off), the others >= 1")
    for name in ("beta1", "beta2", "label_smoothing"):
      if not 0 <= getattr(self, name) < 1:
        raise ValueError(f"{name}={getattr(self, name)}: use a value in "
                         "[0, 1)")
    if self.length_penalty < 0:
      raise ValueError(f"length_penalty={self.length_penalty}: use >= 0")


@dataclasses.dataclass(frozen=True, kw_only=True)
class PeerFiles:
  """The peer's data files (pieces, one sentence a line) and vocabularies."""
  train_source: pathlib.Path
  train_target: pathlib.Path
  dev_source: pathlib.Path
  dev_target: pathlib.Path
  source_vocab: pathlib.Path
  target_vocab: pathlib.Path


# Larger than any run within a wall-clock budget: the driver stops on time.
NO_STEP_LIMIT = 10_000_000


def _optimizer_params(recipe: PeerRecipe) -> dict[str, float]:
  params = {"beta_1": recipe.beta1, "beta_2": recipe.beta2}
  if recipe.clipnorm:
    params["clipnorm"] = recipe.clipnorm
  return params


def _decay(recipe: PeerRecipe) -> dict[str, Any]:
  """The schedule: a linear warmup, then inverse-sqrt or cosine decay."""
  if recipe.decay == "cosine":
    return {"decay_type": "CosineAnnealing",
            "decay_params": {"warmup_steps": recipe.warmup_steps,
                             "max_step": recipe.planned_steps,
                             "eta_min": 0.0}}
  return {"decay_type": "InvSqrtDecay",
          "decay_params": {"warmup_steps": recipe.warmup_steps}}


def run_config(*, recipe: PeerRecipe, files: PeerFiles,
               model_dir: pathlib.Path,
               max_step: int = NO_STEP_LIMIT) -> dict[str, Any]:
  """OpenNMT-tf's run configuration (written as JSON, which YAML reads).

  Dev evaluations happen only when the training ends (at the driver's
  time budget or at ``max_step``), once, as for our trainer; checkpoints
  too, unless ``recipe.checkpoint_every`` keeps some for averaging.
  """
  return {
      "model_dir": str(model_dir),
      "data": {
          "train_features_file": str(files.train_source),
          "train_labels_file": str(files.train_target),
          "eval_features_file": str(files.dev_source),
          "eval_labels_file": str(files.dev_target),
          "source_vocabulary": str(files.source_vocab),
          "target_vocabulary": str(files.target_vocab),
      },
      "params": {
          "optimizer": "Adam",
          "optimizer_params": _optimizer_params(recipe),
          "learning_rate": recipe.learning_rate,
          **_decay(recipe),
          "label_smoothing": recipe.label_smoothing,
          "average_loss_in_time": True,
          "beam_width": recipe.beam_size,
          "length_penalty": recipe.length_penalty,
          "maximum_decoding_length": recipe.max_decode_length,
          "num_hypotheses": 1,
      },
      "train": {
          "batch_size": recipe.batch_tokens,
          "batch_type": "tokens",
          "effective_batch_size": None,
          "max_step": max_step,
          "save_checkpoints_steps": recipe.checkpoint_every or NO_STEP_LIMIT,
          "keep_checkpoint_max": max(2, recipe.keep_checkpoints),
          "save_summary_steps": recipe.report_every,
          "maximum_features_length": recipe.max_length,
          "maximum_labels_length": recipe.max_length,
          "length_bucket_width": 1,
          "sample_buffer_size": -1,
      },
      "eval": {
          "batch_size": 64,
          "batch_type": "examples",
          "steps": NO_STEP_LIMIT,
      },
      "infer": {
          "batch_size": recipe.decode_batch_size,
          "batch_type": "examples",
          "length_bucket_width": 0,
      },
  }


def write_json(path: pathlib.Path, value: Any) -> None:
  """Writes ``value`` as indented JSON, atomically (tmp file + rename)."""
  path.parent.mkdir(parents=True, exist_ok=True)
  tmp = path.with_suffix(path.suffix + ".tmp")
  tmp.write_text(json.dumps(value, indent=1) + "\n", encoding="utf-8")
  tmp.replace(path)


def m4moe_train_summary(metrics_path: pathlib.Path, *,
                        language: str) -> dict[str, Any]:
  """Steps, throughput and dev CE of an ``m4moe-train`` run's metrics.jsonl.

  ``tokens_per_sec`` (source + target non-padding tokens) is the mean over
  the logging intervals after the first, which holds graph tracing;
  ``target_tokens_per_sec`` is ``throughput.DEFINITION``, the one compared
  with the peer's; ``steps_per_sec`` is steps over the training loop's
  seconds.

  Raises:
    PeerError: the run did not finish (no ``end`` record), has no dev
      evaluation of ``language`` or a damaged line.
  """
  try:
    records = metrics_log.read_metrics(metrics_path, strict=True)
  except metrics_log.MetricsFormatError as e:
    raise PeerError(str(e)) from e
  end = [r for r in records if r.get("kind") == "end"]
  evals = [r for r in records if r.get("kind") == "eval"
           and language in (r.get("dev_ce") or {})]
  if not end:
    raise PeerError(f"{metrics_path}: no 'end' record: the training did not "
                    "finish; see its train.log")
  if not evals:
    raise PeerError(f"{metrics_path}: no dev evaluation of {language!r}")
  train = [r for r in records if r.get("kind") == "train"]
  rates = [r["tokens_per_sec"] for r in train[1:]] or [
      r["tokens_per_sec"] for r in train]
  seconds = float(end[-1]["train_seconds"])
  steps = int(end[-1]["step"])
  try:
    rate = throughput.summary(throughput.m4moe_intervals(records))
  except ValueError as e:
    raise PeerError(f"{metrics_path}: {e}") from e
  return {"steps": steps, "train_seconds": round(seconds, 1),
          "steps_per_sec": round(steps / max(seconds, 1e-9), 4),
          "tokens_per_sec": round(sum(rates) / max(len(rates), 1), 1),
          "dev_ce": round(float(evals[-1]["dev_ce"][language]), 4),
          "stopped_by": end[-1].get("stopped_by"), **rate}


def system_record(*, train: Mapping[str, Any], bleu: float, chrf: float,
                  decode_sentences: int, decode_seconds: float,
                  budget_seconds: float) -> dict[str, Any]:
  """One system's entry of ``peer.json``.

  ``steps_per_sec`` is steps over the budget when the budget stopped the
  run (each system stops after the first step that ends past it): the
  systems' own clocks differ in what they include (``m4moe-train``'s
  ``train_seconds`` holds the final dev evaluation, the driver's does not).
  """
  steps = train["steps"]
  steps_per_sec = (steps / budget_seconds
                   if train.get("stopped_by") == "time_budget"
                   else train["steps_per_sec"])
  return {"bleu": round(bleu, 2), "chrf": round(chrf, 2),
          "steps": steps, "tokens_per_sec": train["tokens_per_sec"],
          "steps_per_sec": round(steps_per_sec, 4),
          "train_seconds": train["train_seconds"],
          "dev_ce": train["dev_ce"],
          "decode_sentences_per_sec": round(
              decode_sentences / max(decode_seconds, 1e-9), 3)}


def examples(*, sources: Sequence[str], references: Sequence[str],
             hypotheses: Mapping[str, Sequence[str]],
             count: int) -> list[dict[str, str]]:
  """``count`` examples spread evenly over the test set, every system's."""
  n = len(sources)
  if n == 0 or count <= 0:
    return []
  picks = sorted({i * n // count for i in range(min(count, n))})
  return [{"source": sources[i],
           **{name: hyps[i] for name, hyps in hypotheses.items()},
           "reference": references[i]} for i in picks]


PEER_SECTION = "### Peer toolkit: m4moe vs OpenNMT-tf (peer_train, peer_decode)"
_SECTION_TEXT = f"""{PEER_SECTION}

Equal wall-clock training on the demo's pt->en pair, then beam-4 decoding of
the same test sentences; each system pinned to its own core. Written by
`python -m m4moe.benchmarks.peer.run` (m4moe/benchmarks/peer/README.md);
scores under `results/peer/`.

```
```

"""


def append_benchmark_lines(path: pathlib.Path,
                           lines: Sequence[Mapping[str, Any]]) -> None:
  """Appends JSON lines to the peer section's raw block of benchmarks.md.

  The section (heading, one sentence and an empty fenced block) is added
  before ``## Default dispatch per platform`` (else at the end) the first
  time; later runs append inside its block. Written atomically.

  Raises:
    PeerError: the file does not exist, or its peer section has no fenced
      block (edited by hand: fix it or pass another file).
  """
  if not path.is_file():
    raise PeerError(f"{path} does not exist; pass --benchmarks_md=PATH of "
                    "results/benchmarks.md, or '' to skip")
  text = path.read_text(encoding="utf-8")
  if PEER_SECTION not in text:
    anchor = "## Default dispatch per platform"
    at = text.find(anchor)
    text = (text[:at] + _SECTION_TEXT + text[at:] if at >= 0
            else text.rstrip("\n") + "\n\n" + _SECTION_TEXT.rstrip("\n") + "\n")
  start = text.index(PEER_SECTION)
  fence = text.find("```\n", start)
  close = text.find("```", fence + 4) if fence >= 0 else -1
  if fence < 0 or close < 0:
    raise PeerError(f"{path}: the section {PEER_SECTION!r} has no ``` block "
                    "for the raw JSON lines; restore it")
  added = "".join(json.dumps(dict(line)) + "\n" for line in lines)
  text = text[:close] + added + text[close:]
  tmp = path.with_suffix(path.suffix + ".tmp")
  tmp.write_text(text, encoding="utf-8")
  tmp.replace(path)
