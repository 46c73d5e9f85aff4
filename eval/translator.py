"""Text in, text out: a trained run directory + SentencePiece + beam search.

Used by ``m4moe-decode``, ``m4moe-eval`` and ``m4moe-export``.

A run directory (``--model_dir``, written by ``m4moe-train``) holds
``config.json`` (its ``"model"`` section is a ``ModelConfig.to_dict()``) and
``ckpt-<step>`` checkpoints whose ``model`` object is the Transformer. The
SentencePiece models (``source.model``, ``target.model`` from
``m4moe-vocab``) are found in ``--vocab_dir``, else in a directory named by
the run config's ``data`` section (any key containing ``vocab``), else in
``<model_dir>/vocab`` or ``<model_dir>`` itself.

Source sentences become ``<2tgt> pieces... </s>`` (the target-language tag,
as in training); the source language must be one the vocabulary has a tag
for, i.e. a language the model was trained on. Over-long inputs are cut to
``max_input_length`` ids (tag and EOS kept) and counted; empty inputs give
empty outputs without running the model.

Decode length: beam search runs on static ``[B, W, Ld]`` buffers and, with
length normalisation, can only stop early once no alive beam could still win
at length Ld, so Ld sets the cost of every batch (an untrained model
decoded with Ld = 512 runs ~13x slower than with Ld = 64 for the same
output). With ``length_ratio`` set, each batch therefore decodes at most
``min(beam.max_decode_length, round_up(length_ratio * Ls + 16, 16))``
tokens, Ls being the batch's longest source (tag and EOS included); one
compiled search is kept per distinct Ld. Hypotheses that reach their limit without EOS
are counted in :attr:`TranslationStats.length_limited`.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import re
import time
from typing import Any, Callable, Sequence

import numpy as np
import sentencepiece as spm
import tensorflow as tf

from m4moe import config as config_lib
from m4moe import decoding

PAD_ID, EOS_ID = 0, 1
SOURCE_MODEL, TARGET_MODEL = "source.model", "target.model"
LINE_BREAKS = re.compile(r"[\r\n]")


class TranslatorError(ValueError):
  """The model directory, vocabulary or input is unusable; says why."""


def language_tag(lang: str) -> str:
  return f"<2{lang}>"


@dataclasses.dataclass(frozen=True)
class RunFiles:
  """Where a run's pieces are."""

  model_dir: pathlib.Path
  config: config_lib.ModelConfig
  checkpoint: str
  source_vocab: pathlib.Path
  target_vocab: pathlib.Path
  run_config: dict[str, Any]


def _vocab_candidates(model_dir: pathlib.Path, run_config: dict,
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


def find_run_files(model_dir: str | pathlib.Path, *,
                   vocab_dir: str | None = None) -> RunFiles:
  """Locates config, latest checkpoint and SentencePiece models.

  Raises:
    TranslatorError: naming the missing file and where it was looked for.
  """
  model_dir = pathlib.Path(model_dir)
  config_path = model_dir / "config.json"
  if not config_path.is_file():
    raise TranslatorError(f"{config_path} not found: --model_dir must be a "
                          "run directory written by m4moe-train")
  run_config = json.loads(config_path.read_text(encoding="utf-8"))
  model_section = run_config.get("model", run_config)
  try:
    config = config_lib.config_from_dict(model_section)
  except (TypeError, ValueError) as e:
    raise TranslatorError(f"{config_path}: bad model config ({e})") from e
  checkpoint = tf.train.latest_checkpoint(str(model_dir))
  if checkpoint is None:
    raise TranslatorError(f"{model_dir} has no checkpoint (no 'checkpoint' "
                          "index file): train first or pass the right dir")
  tried = _vocab_candidates(model_dir, run_config, vocab_dir)
  for directory in tried:
    if (directory / SOURCE_MODEL).is_file() and (
        directory / TARGET_MODEL).is_file():
      return RunFiles(model_dir, config, checkpoint,
                      directory / SOURCE_MODEL, directory / TARGET_MODEL,
                      run_config)
  raise TranslatorError(
      f"no {SOURCE_MODEL}/{TARGET_MODEL} in {', '.join(map(str, tried))}; "
      "pass --vocab_dir (the m4moe-vocab --output_dir)")


def load_sentencepiece(path: pathlib.Path, *,
                       vocab_size: int) -> spm.SentencePieceProcessor:
  """Loads a model and checks the project's ids and the model's vocab size."""
  sp = spm.SentencePieceProcessor(model_file=str(path))
  ids = (sp.pad_id(), sp.eos_id(), sp.unk_id(), sp.bos_id())
  if ids != (0, 1, 2, -1):
    raise TranslatorError(f"{path}: special ids (pad, eos, unk, bos) are "
                          f"{ids}, expected (0, 1, 2, -1)")
  if sp.get_piece_size() > vocab_size:
    raise TranslatorError(f"{path} has {sp.get_piece_size()} pieces but the "
                          f"model's vocabulary is {vocab_size}: wrong vocab")
  return sp


def restore_model(files: RunFiles) -> Any:
  """Builds the Transformer and restores its weights from the checkpoint."""
  from m4moe import model as model_lib  # pylint: disable=g-import-not-at-top
  model = model_lib.Transformer(config=files.config)
  status = tf.train.Checkpoint(model=model).restore(files.checkpoint)
  status.expect_partial().assert_existing_objects_matched()
  return model


@dataclasses.dataclass
class TranslationStats:
  """Counters of one or more translate() calls (mutable accumulator)."""

  sentences: int = 0
  empty: int = 0
  truncated: int = 0
  length_limited: int = 0
  seconds: float = 0.0


class Translator:
  """Translates lists of sentences with a restored model.

  Args:
    model: an ``m4moe.model.Transformer``.
    source_sp, target_sp: SentencePiece processors.
    beam: beam search settings.
    max_input_length: most source ids per sentence (tag and EOS included);
      None = the model's max_length.
    batch_size: sentences per beam-search call.
    length_ratio: if set, each batch decodes at most
      ``round_up(length_ratio * longest_source + 16, 16)`` target tokens,
      capped by ``beam.max_decode_length`` (see the module docstring); None
      always decodes ``beam.max_decode_length``.
  """

  def __init__(self, *, model: Any, source_sp: spm.SentencePieceProcessor,
               target_sp: spm.SentencePieceProcessor,
               beam: decoding.BeamSearchConfig,
               max_input_length: int | None = None, batch_size: int = 32,
               length_ratio: float | None = None):
    if max_input_length is None:
      max_input_length = model.config.max_length
    if max_input_length < 3:
      raise TranslatorError(f"--max_input_length={max_input_length}: use at "
                            "least 3 (tag, one piece, EOS)")
    if batch_size < 1:
      raise TranslatorError(f"--batch_size={batch_size}: use at least 1")
    if length_ratio is not None and length_ratio <= 0:
      raise TranslatorError(f"--decode_length_ratio={length_ratio}: use a "
                            "positive ratio (e.g. 2), or 0/None to always "
                            "decode --max_decode_length tokens")
    limit = model.config.max_length
    if beam.max_decode_length > limit or max_input_length > limit:
      raise TranslatorError(
          f"--max_decode_length={beam.max_decode_length} and "
          f"--max_input_length={max_input_length} must be <= the model's "
          f"max_length={limit}")
    self.model, self.beam = model, beam
    self.source_sp, self.target_sp = source_sp, target_sp
    self.max_input_length, self.batch_size = max_input_length, batch_size
    self.length_ratio = length_ratio
    self.stats = TranslationStats()
    self._searches: dict[int, Callable[[tf.Tensor], Any]] = {}

  def decode_length(self, longest_source: int) -> int:
    """Ld for a batch whose longest source has ``longest_source`` ids."""
    cap = self.beam.max_decode_length
    if self.length_ratio is None:
      return cap
    wanted = int(np.ceil(self.length_ratio * longest_source)) + 16
    return min(cap, -(-wanted // 16) * 16)

  def _search_fn(self, length: int) -> Callable[[tf.Tensor], Any]:
    """The compiled beam search decoding at most ``length`` tokens."""
    if length not in self._searches:
      beam = dataclasses.replace(self.beam, max_decode_length=length)
      model = self.model
      self._searches[length] = tf.function(
          lambda inputs: decoding.translate_ids(model, inputs, config=beam),
          input_signature=[tf.TensorSpec([None, None], tf.int32)],
          autograph=False)
    return self._searches[length]

  def tag_id(self, lang: str) -> int:
    """Id of ``<2lang>`` in the source vocabulary.

    Raises:
      TranslatorError: the vocabulary has no such tag (untrained language).
    """
    piece = language_tag(lang)
    pid = self.source_sp.piece_to_id(piece)
    if pid == self.source_sp.unk_id() or self.source_sp.id_to_piece(
        pid) != piece:
      raise TranslatorError(f"language {lang!r}: the source vocabulary has no "
                            f"tag {piece}, so the model was not trained on it")
    return pid

  def encode(self, text: str, *, tag: int) -> tuple[list[int], bool]:
    """``[tag, pieces..., EOS]`` cut to max_input_length; (ids, truncated)."""
    pieces = self.source_sp.encode(text)
    room = self.max_input_length - 2
    return [tag, *pieces[:room], EOS_ID], len(pieces) > room

  def decode_ids(self, ids: Sequence[int]) -> str:
    """Target ids up to the first EOS -> one line of text.

    Line breaks a model may produce through byte-fallback pieces become
    spaces, so every output is exactly one line.
    """
    ids = list(ids)
    if EOS_ID in ids:
      ids = ids[:ids.index(EOS_ID)]
    text = self.target_sp.decode([i for i in ids if i != PAD_ID])
    return LINE_BREAKS.sub(" ", text)

  def search(self, rows: Sequence[Sequence[int]]) -> np.ndarray:
    """Best hypothesis ids <int32>[B, Ld] for source id rows (any lengths).

    Ld is :meth:`decode_length` of the longest row; best hypotheses without
    EOS (cut at Ld) are counted in ``stats.length_limited``.
    """
    width = max(len(r) for r in rows)
    inputs = np.zeros([len(rows), width], np.int32)
    for i, row in enumerate(rows):
      inputs[i, :len(row)] = row
    search = self._search_fn(self.decode_length(width))
    best = search(tf.constant(inputs)).sequences[:, 0].numpy()
    self.stats.length_limited += int(np.sum(~np.any(best == EOS_ID, axis=1)))
    return best

  def translate(self, sentences: Sequence[str], *, source_lang: str,
                target_lang: str = "en",
                progress: Callable[[int], None] | None = None) -> list[str]:
    """Translations in input order; '' for empty (whitespace-only) inputs.

    Batches are formed from length-sorted sentences for speed; with the
    no-drop eval capacity the result does not depend on batch companions.
    """
    start = time.time()
    self.tag_id(source_lang)  # validates the source language
    tag = self.tag_id(target_lang)
    outputs = [""] * len(sentences)
    todo = []
    for index, text in enumerate(sentences):
      if not text.strip():
        self.stats.empty += 1
        continue
      ids, cut = self.encode(text, tag=tag)
      self.stats.truncated += cut
      todo.append((len(ids), index, ids))
    if progress and len(todo) < len(sentences):
      progress(len(sentences) - len(todo))
    todo.sort()
    for begin in range(0, len(todo), self.batch_size):
      chunk = todo[begin:begin + self.batch_size]
      best = self.search([ids for _, _, ids in chunk])
      for (_, index, _), row in zip(chunk, best):
        outputs[index] = self.decode_ids(row)
      if progress:
        progress(len(chunk))
    self.stats.sentences += len(sentences)
    self.stats.seconds += time.time() - start
    return outputs


def load_translator(model_dir: str | pathlib.Path, *,
                    vocab_dir: str | None = None,
                    beam: decoding.BeamSearchConfig,
                    max_input_length: int | None = None,
                    batch_size: int = 32,
                    length_ratio: float | None = None
                    ) -> tuple[Translator, RunFiles]:
  """Finds the run's files, restores the model and builds a Translator."""
  files = find_run_files(model_dir, vocab_dir=vocab_dir)
  source_sp = load_sentencepiece(files.source_vocab,
                                 vocab_size=files.config.src_vocab_size)
  target_sp = load_sentencepiece(files.target_vocab,
                                 vocab_size=files.config.tgt_vocab_size)
  translator = Translator(model=restore_model(files), source_sp=source_sp,
                          target_sp=target_sp, beam=beam,
                          max_input_length=max_input_length,
                          batch_size=batch_size, length_ratio=length_ratio)
  return translator, files
