"""The run-directory contract: what a ``--model_dir`` holds and how to read it.

This module owns the layout (the names below) and the reading of
``config.json``. ``m4moe-train`` writes a run directory
(:mod:`m4moe.training.checkpointing` writes ``config.json`` and the
checkpoints); ``m4moe-decode``, ``m4moe-eval`` and ``m4moe-export`` read it
only through this module::

  config.json          effective config, written atomically
    "model"            ModelConfig.to_dict(): rebuilds the Transformer
    "train", "data"    the trainer's and the input settings
    "languages"        training languages (e.g. ["de", "fr"])
    "language_pairs"   [[source, target], ...] the model was trained on
    "vocab"            fingerprint of the SentencePiece models used:
                       {"source": {"path", "sha256"}, "target": {...}}
    "skipped_lines"    {"<file>": count} malformed corpus lines skipped
  checkpoint           TF's state file naming the complete ckpt-<step>
  ckpt-<step>.index/.data-*   model, optimiser slots, step, input iterator
  best/ckpt-<step>.*   model weights of the best dev evaluation
                       (m4moe.training.checkpointing.best_keeper), with
                       its own state file
  averaged/ckpt-<step>.*  mean of the last k checkpoints' weights
                       (m4moe-average, m4moe.training.averaging)
  damaged/ckpt-<step>/ files of checkpoints found damaged at start-up
                       (m4moe.training.checkpointing.recover_checkpoints;
                       never deleted)
  train.lock           the one writer's lock (m4moe.run_lock)
  metrics.jsonl        the metrics log (m4moe.training.metrics)
  train/, eval/        TensorBoard event files

The vocabulary fingerprint makes a wrong ``--vocab_dir`` an error even when
its models have the same number of pieces (the ids would mean different
pieces and the model would decode garbage). Runs written before the
fingerprint existed are read with a warning. A run's language pairs decide
which ``source_lang -> target_lang`` requests are served.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import pathlib
import re
from typing import Any, Iterable, Mapping

from absl import logging

from m4moe import config as config_lib
from m4moe import jsonfile

CONFIG_FILENAME = "config.json"
STATE_FILENAME = "checkpoint"
PREFIX = "ckpt"
BEST_DIRNAME = "best"
AVERAGED_DIRNAME = "averaged"
DAMAGED_DIRNAME = "damaged"
SOURCE_MODEL, TARGET_MODEL = "source.model", "target.model"
ENGLISH = "en"


class RunDirError(ValueError):
  """A run directory or the files it refers to are unusable; says why."""


class VocabMismatchError(RunDirError):
  """The SentencePiece models differ from those the run was trained with."""


class LanguagePairError(RunDirError):
  """A translation direction the run was not trained for."""


def file_sha256(path: str | os.PathLike[str]) -> str:
  """Hex sha256 of a file's bytes."""
  digest = hashlib.sha256()
  with open(path, "rb") as f:
    for block in iter(lambda: f.read(1 << 20), b""):
      digest.update(block)
  return digest.hexdigest()


@dataclasses.dataclass(frozen=True, kw_only=True)
class VocabFingerprint:
  """The SentencePiece model files of a run: paths and sha256 digests."""

  source_path: str
  source_sha256: str
  target_path: str
  target_sha256: str

  @classmethod
  def of_files(cls, *, source: str | os.PathLike[str],
               target: str | os.PathLike[str]) -> "VocabFingerprint":
    """Fingerprints two model files (absolute paths are recorded)."""
    source, target = pathlib.Path(source), pathlib.Path(target)
    return cls(source_path=str(source.resolve()),
               source_sha256=file_sha256(source),
               target_path=str(target.resolve()),
               target_sha256=file_sha256(target))

  @classmethod
  def of_dir(cls, vocab_dir: str | os.PathLike[str]) -> "VocabFingerprint":
    """Fingerprints ``<vocab_dir>/source.model`` and ``target.model``."""
    vocab_dir = pathlib.Path(vocab_dir)
    return cls.of_files(source=vocab_dir / SOURCE_MODEL,
                        target=vocab_dir / TARGET_MODEL)

  def to_dict(self) -> dict[str, Any]:
    return {"source": {"path": self.source_path,
                       "sha256": self.source_sha256},
            "target": {"path": self.target_path,
                       "sha256": self.target_sha256}}

  @classmethod
  def from_dict(cls, value: Mapping[str, Any]) -> "VocabFingerprint":
    return cls(source_path=str(value["source"]["path"]),
               source_sha256=str(value["source"]["sha256"]),
               target_path=str(value["target"]["path"]),
               target_sha256=str(value["target"]["sha256"]))


def language_pairs(languages: Iterable[str], *, direction: str = "xx_en"
                   ) -> tuple[tuple[str, str], ...]:
  """(source, target) pairs of training ``languages`` in ``direction``."""
  if direction not in ("xx_en", "en_xx"):
    raise ValueError(f"direction={direction!r}: use xx_en or en_xx")
  return tuple(sorted((lang, ENGLISH) if direction == "xx_en"
                      else (ENGLISH, lang) for lang in set(languages)))


def run_sections(*, vocab_dir: str | os.PathLike[str],
                 languages: Iterable[str], direction: str = "xx_en",
                 skipped_lines: Mapping[str, int] | None = None
                 ) -> dict[str, Any]:
  """The ``config.json`` sections recording vocabulary and language pairs.

  Args:
    vocab_dir: the directory holding ``source.model`` and ``target.model``.
    languages: the training languages.
    direction: ``xx_en`` or ``en_xx``.
    skipped_lines: malformed corpus lines skipped, per file.
  """
  return {"vocab": VocabFingerprint.of_dir(vocab_dir).to_dict(),
          "languages": sorted(set(languages)),
          "language_pairs": [list(p) for p in
                             language_pairs(languages, direction=direction)],
          "skipped_lines": dict(skipped_lines or {})}


def read_run_config(model_dir: str | os.PathLike[str]) -> dict[str, Any]:
  """A run's whole ``config.json``.

  Raises:
    RunDirError: it is missing, not JSON, or not a JSON object.
  """
  path = pathlib.Path(model_dir) / CONFIG_FILENAME
  if not path.is_file():
    raise RunDirError(f"{path} not found: --model_dir must be a run "
                      "directory written by m4moe-train")
  try:
    return jsonfile.load(
        path, what="the run's config.json",
        fix="it is written atomically by m4moe-train, so restore it from "
        "the run's backup or retrain")
  except jsonfile.JSONFileError as e:
    raise RunDirError(str(e)) from e


def model_config_from_run(
    model_dir: str | os.PathLike[str]) -> config_lib.ModelConfig:
  """The ModelConfig a run was trained with.

  Raises:
    RunDirError: no config.json or an invalid ``"model"`` section.
  """
  run_config = read_run_config(model_dir)
  path = pathlib.Path(model_dir) / CONFIG_FILENAME
  try:
    return config_lib.config_from_dict(run_config.get("model", run_config))
  except (TypeError, ValueError, KeyError) as e:
    raise RunDirError(f"{path}: bad model config ({e})") from e


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunFiles:
  """Everything decode/eval/export need from a run directory.

  Attributes:
    model_dir: the run directory.
    config: the model config.
    checkpoint: path prefix of the checkpoint to restore (the latest, the
      best on dev or a given step: :func:`resolve_checkpoint`).
    source_vocab, target_vocab: the SentencePiece models that will be used.
    run_config: the whole ``config.json``.
    vocab: the recorded fingerprint (None: a run written before it existed).
    language_pairs: the trained (source, target) pairs (None: unknown).
  """

  model_dir: pathlib.Path
  config: config_lib.ModelConfig
  checkpoint: str
  source_vocab: pathlib.Path
  target_vocab: pathlib.Path
  run_config: Mapping[str, Any]
  vocab: VocabFingerprint | None = None
  language_pairs: frozenset[tuple[str, str]] | None = None

  def check_language_pair(self, *, source_lang: str,
                          target_lang: str) -> None:
    """Raises LanguagePairError unless the run trained this direction."""
    check_language_pair(self.language_pairs, source_lang=source_lang,
                        target_lang=target_lang, model_dir=self.model_dir)


def check_language_pair(pairs: frozenset[tuple[str, str]] | None, *,
                        source_lang: str, target_lang: str,
                        model_dir: str | os.PathLike[str] = "the model"
                        ) -> None:
  """Raises LanguagePairError unless (source, target) is in ``pairs``.

  ``pairs=None`` (an old run without the record) accepts everything.
  """
  if pairs is None or (source_lang, target_lang) in pairs:
    return
  trained = ", ".join(f"{s}->{t}" for s, t in sorted(pairs)) or "none"
  sources = sorted({s for s, t in pairs if t == target_lang})
  targets = sorted({t for _, t in pairs})
  if target_lang not in targets:
    raise LanguagePairError(
        f"{model_dir} was not trained to translate into {target_lang!r} "
        f"({source_lang}->{target_lang} requested): it translates only into "
        f"{', '.join(targets) or 'nothing'} (trained pairs: {trained}); ask "
        "for one of those target languages")
  raise LanguagePairError(
      f"{model_dir} was not trained on {source_lang}->{target_lang}: source "
      f"languages into {target_lang} are {', '.join(sources)}; give one of "
      "those source languages")


def _vocab_candidates(model_dir: pathlib.Path, run_config: Mapping[str, Any],
                      vocab_dir: str | None) -> list[pathlib.Path]:
  if vocab_dir:
    return [pathlib.Path(vocab_dir)]
  found = []
  data = run_config.get("data", {})
  if isinstance(data, dict):
    for key, value in sorted(data.items()):
      if "vocab" in key and isinstance(value, str) and value:
        path = pathlib.Path(value)
        found.append(path.parent if path.suffix == ".model" else path)
  return found + [model_dir / "vocab", model_dir]


def _recorded_vocab(run_config: Mapping[str, Any],
                    path: pathlib.Path) -> VocabFingerprint | None:
  value = run_config.get("vocab")
  if value is None:
    return None
  try:
    return VocabFingerprint.from_dict(value)
  except (KeyError, TypeError) as e:
    raise RunDirError(f"{path}: malformed \"vocab\" section ({e!r}); "
                      "expected {\"source\": {\"path\", \"sha256\"}, "
                      "\"target\": {...}}") from e


def _recorded_pairs(run_config: Mapping[str, Any], path: pathlib.Path
                    ) -> frozenset[tuple[str, str]] | None:
  value = run_config.get("language_pairs")
  if value is None:
    return None
  try:
    pairs = frozenset((str(s), str(t)) for s, t in value)
  except (TypeError, ValueError) as e:
    raise RunDirError(f"{path}: malformed \"language_pairs\" ({e}); expected "
                      "[[source, target], ...]") from e
  return pairs


def check_vocab(recorded: VocabFingerprint | None, *,
                source: pathlib.Path, target: pathlib.Path,
                model_dir: str | os.PathLike[str]) -> None:
  """Compares the models about to be used with the run's fingerprint.

  Raises:
    VocabMismatchError: naming the recorded and the given file.
  """
  if recorded is None:
    logging.warning("%s records no vocabulary fingerprint (written before "
                    "it existed): cannot check that %s and %s are the "
                    "models it was trained with", model_dir, source, target)
    return
  for side, path, want, want_path in (
      ("source", source, recorded.source_sha256, recorded.source_path),
      ("target", target, recorded.target_sha256, recorded.target_path)):
    got = file_sha256(path)
    if got == want:
      continue
    if pathlib.Path(path).resolve() == pathlib.Path(want_path):
      fix = ("the file was replaced since training (vocabulary retrained in "
             "place?): restore the original models or retrain the model")
    else:
      fix = (f"pass --vocab_dir={pathlib.Path(want_path).parent}, or a "
             "directory holding a copy of those models")
    raise VocabMismatchError(
        f"{path} is not the {side} vocabulary {model_dir} was trained with "
        f"(recorded: {want_path}, sha256 {want[:12]}...; this file: "
        f"sha256 {got[:12]}...): {fix}")


def checkpoint_steps(directory: str | os.PathLike[str]) -> list[int]:
  """Steps of the ``ckpt-<step>`` checkpoints in ``directory`` that have an
  index file, ascending (none if the directory does not exist).

  A checkpoint without its index cannot be restored, so it does not count.
  """
  directory = pathlib.Path(directory)
  if not directory.is_dir():
    return []
  index = re.compile(rf"{PREFIX}-(\d+)\.index")
  return sorted(int(match.group(1)) for entry in directory.iterdir()
                if (match := index.fullmatch(entry.name)) and entry.is_file())


CHECKPOINT_CHOICES = "latest, best, averaged or a step number"


def resolve_checkpoint(model_dir: str | os.PathLike[str],
                       which: str = "latest") -> str:
  """Path prefix of one of a run's checkpoints.

  Args:
    model_dir: the run directory.
    which: ``latest`` (the newest complete checkpoint), ``best`` (the model
      weights of the best dev evaluation, ``<model_dir>/best/``; see
      :func:`m4moe.training.checkpointing.best_keeper`), ``averaged`` (the
      mean of the last k checkpoints that m4moe-average wrote to
      ``<model_dir>/averaged/``) or a step number N (``ckpt-N`` of the run
      or of ``best/``).

  Raises:
    RunDirError: ``which`` is not one of those, or the run has no such
      checkpoint (the message lists the steps it has).
  """
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  model_dir = pathlib.Path(model_dir)
  best_dir = model_dir / BEST_DIRNAME
  kept = checkpoint_steps(model_dir)
  have = (f"its checkpoints: {', '.join(f'ckpt-{s}' for s in kept)}"
          if kept else "it has no ckpt-<step> files")
  which = str(which).strip()
  if which == "latest":
    path = tf.train.latest_checkpoint(str(model_dir))
    if path is None:
      raise RunDirError(f"{model_dir} has no checkpoint (no 'checkpoint' "
                        "index file): train first or pass the right dir")
    return path
  # The model-weights-only checkpoints kept in a subdirectory, and what to
  # do when there is none.
  kept_apart = {
      "best": (best_dir, "best-on-dev", "the run was trained without a dev "
               "set, with --nokeep_best, or before m4moe-train kept one; use "
               "--checkpoint=latest or a step"),
      "averaged": (model_dir / AVERAGED_DIRNAME, "averaged",
                   f"run m4moe-average --model_dir={model_dir} first"),
  }
  if which in kept_apart:
    directory, kind, fix = kept_apart[which]
    path = (tf.train.latest_checkpoint(str(directory))
            if directory.is_dir() else None)
    if path is None:
      raise RunDirError(f"{model_dir} has no {kind} checkpoint ({directory} "
                        f"is missing or empty): {fix} ({have})")
    return path
  if which.isdigit():
    for directory in (model_dir, best_dir):
      prefix = directory / f"{PREFIX}-{int(which)}"
      if prefix.with_name(prefix.name + ".index").is_file():
        return str(prefix)
    best = checkpoint_steps(best_dir)
    also = f"; best/: ckpt-{best[0]}" if best else ""
    raise RunDirError(f"{model_dir} has no checkpoint of step {which} "
                      f"({have}{also}); pass one of those steps, latest or "
                      "best")
  raise RunDirError(f"--checkpoint={which!r}: use {CHECKPOINT_CHOICES}")


def find_run_files(model_dir: str | os.PathLike[str], *,
                   vocab_dir: str | None = None,
                   checkpoint: str = "latest") -> RunFiles:
  """Locates config, a checkpoint and the SentencePiece models of a run.

  ``checkpoint`` picks the checkpoint (:func:`resolve_checkpoint`: latest,
  best, averaged or a step).

  The models are taken from ``vocab_dir``, else from a directory named by
  the run config's ``data`` section (any key containing ``vocab``), else
  ``<model_dir>/vocab`` or ``<model_dir>``; they must match the recorded
  fingerprint (see :func:`check_vocab`).

  Raises:
    RunDirError: naming the missing or wrong file and where it was looked.
  """
  model_dir = pathlib.Path(model_dir)
  run_config = read_run_config(model_dir)
  config = model_config_from_run(model_dir)
  config_path = model_dir / CONFIG_FILENAME
  recorded = _recorded_vocab(run_config, config_path)
  pairs = _recorded_pairs(run_config, config_path)
  checkpoint = resolve_checkpoint(model_dir, checkpoint)
  tried = _vocab_candidates(model_dir, run_config, vocab_dir)
  if not vocab_dir and recorded is not None:
    tried.insert(0, pathlib.Path(recorded.source_path).parent)
  for directory in tried:
    source, target = directory / SOURCE_MODEL, directory / TARGET_MODEL
    if source.is_file() and target.is_file():
      check_vocab(recorded, source=source, target=target,
                  model_dir=model_dir)
      return RunFiles(model_dir=model_dir, config=config,
                      checkpoint=checkpoint, source_vocab=source,
                      target_vocab=target, run_config=run_config,
                      vocab=recorded, language_pairs=pairs)
  raise RunDirError(
      f"no {SOURCE_MODEL}/{TARGET_MODEL} in {', '.join(map(str, tried))}; "
      "pass --vocab_dir (the m4moe-vocab --output_dir)")
