"""Text in, text out: a trained run directory + SentencePiece + beam search.

Used by ``m4moe-decode``, ``m4moe-eval`` and ``m4moe-export``.

The run directory (``--model_dir``, written by ``m4moe-train``) is read
through :mod:`m4moe.training.rundir`: the model config, the latest checkpoint, the
SentencePiece models (``--vocab_dir``, else where the run recorded them;
they must match the run's vocabulary fingerprint) and the language pairs
the run was trained on.

Source sentences become ``<2tgt> pieces... </s>`` (the target-language tag,
as in training); the (source, target) pair must be one the run was trained
on (runs without that record: the source vocabulary must have a tag for
both languages). Over-long inputs are cut to
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
import pathlib
import re
import time
from typing import Any, Callable, Sequence

import numpy as np
import sentencepiece as spm
import tensorflow as tf

from m4moe.inference import beam_search as decoding
from m4moe.training import rundir
from m4moe.moe import task_routing
from m4moe.data import vocab as vocab_lib

PAD_ID, EOS_ID = 0, 1
LINE_BREAKS = re.compile(r"[\r\n]")


class TranslatorError(ValueError):
  """The model directory, vocabulary or input is unusable; says why."""


def language_tag(lang: str) -> str:
  return f"<2{lang}>"


def load_sentencepiece(path: pathlib.Path, *,
                       vocab_size: int) -> spm.SentencePieceProcessor:
  """Loads a model (:func:`m4moe.data.vocab.load`) and checks its size.

  Raises:
    TranslatorError: unreadable model, wrong special ids, or more pieces
      than the model's vocabulary.
  """
  try:
    sp = vocab_lib.load(path)
  except ValueError as e:
    raise TranslatorError(str(e)) from e
  if sp.get_piece_size() > vocab_size:
    raise TranslatorError(f"{path} has {sp.get_piece_size()} pieces but the "
                          f"model's vocabulary is {vocab_size}: wrong vocab")
  return sp


def restore_model(files: rundir.RunFiles) -> Any:
  """Builds the Transformer and restores its weights from the checkpoint.

  Raises:
    TranslatorError: the checkpoint is unreadable (truncated, damaged) or
      does not match the run's model config.
  """
  from m4moe.model import transformer as model_lib  # pylint: disable=g-import-not-at-top
  model = model_lib.Transformer(config=files.config)
  try:
    status = tf.train.Checkpoint(model=model).restore(files.checkpoint)
    status.expect_partial().assert_existing_objects_matched()
  except (tf.errors.OpError, AssertionError, IndexError, ValueError,
          OSError) as e:
    detail = (str(e).strip().splitlines() or [""])[0][:300]
    raise TranslatorError(
        f"{files.checkpoint}: cannot restore the model ({type(e).__name__}: "
        f"{detail}); the checkpoint is damaged or not of this run's model "
        f"config: restore it, or make the 'checkpoint' file in "
        f"{files.model_dir} name an earlier complete ckpt-<step>") from e
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
    model: an ``m4moe.model.transformer.Transformer``.
    source_sp, target_sp: SentencePiece processors.
    beam: beam search settings.
    max_input_length: most source ids per sentence (tag and EOS included);
      None = the model's max_length.
    batch_size: sentences per beam-search call.
    length_ratio: if set, each batch decodes at most
      ``round_up(length_ratio * longest_source + 16, 16)`` target tokens,
      capped by ``beam.max_decode_length`` (see the module docstring); None
      always decodes ``beam.max_decode_length``.
    language_pairs: the (source, target) pairs the model was trained on;
      other requests are refused (None: any pair with tags is accepted).
    model_name: how error messages name the model (e.g. its run dir).
  """

  def __init__(self, *, model: Any, source_sp: spm.SentencePieceProcessor,
               target_sp: spm.SentencePieceProcessor,
               beam: decoding.BeamSearchConfig,
               max_input_length: int | None = None, batch_size: int = 32,
               length_ratio: float | None = None,
               language_pairs: frozenset[tuple[str, str]] | None = None,
               model_name: str = "the model"):
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
    self.language_pairs, self.model_name = language_pairs, model_name
    self.stats = TranslationStats()
    self._searches: dict[int, Callable[[tf.Tensor], Any]] = {}

  def decode_length(self, longest_source: int) -> int:
    """Ld for a batch whose longest source has ``longest_source`` ids."""
    cap = self.beam.max_decode_length
    if self.length_ratio is None:
      return cap
    wanted = int(np.ceil(self.length_ratio * longest_source)) + 16
    return min(cap, -(-wanted // 16) * 16)

  @property
  def routes_by_language(self) -> bool:
    """True for a model whose MoE layers route by language."""
    return bool(getattr(self.model, "routes_by_language", False))

  def routing_index(self, *, source_lang: str,
                    target_lang: str) -> int | None:
    """The pair's row in the per-language gate (None: token routing).

    Raises:
      TranslatorError: the model has no gate row for the pair's language.
    """
    if not self.routes_by_language:
      return None
    try:
      language = task_routing.routing_language(source_lang=source_lang,
                                               target_lang=target_lang)
      return self.model.config.moe.language_index(language)
    except ValueError as e:
      raise TranslatorError(f"{self.model_name}: {e}") from e

  def _search_fn(self, length: int
                 ) -> Callable[[tf.Tensor, tf.Tensor], Any]:
    """The compiled beam search decoding at most ``length`` tokens."""
    if length not in self._searches:
      beam = dataclasses.replace(self.beam, max_decode_length=length)
      model = self.model
      by_language = self.routes_by_language
      self._searches[length] = tf.function(
          lambda inputs, languages: decoding.translate_ids(
              model, inputs, config=beam,
              languages=languages if by_language else None),
          input_signature=[tf.TensorSpec([None, None], tf.int32),
                           tf.TensorSpec([None], tf.int32)],
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

  def check_language_pair(self, *, source_lang: str,
                          target_lang: str) -> None:
    """Raises TranslatorError unless the model was trained on this pair."""
    try:
      rundir.check_language_pair(self.language_pairs, source_lang=source_lang,
                                 target_lang=target_lang,
                                 model_dir=self.model_name)
    except rundir.LanguagePairError as e:
      raise TranslatorError(str(e)) from e

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

  def search(self, rows: Sequence[Sequence[int]], *,
             language: int | None = None) -> np.ndarray:
    """Best hypothesis ids <int32>[B, Ld] for source id rows (any lengths).

    Ld is :meth:`decode_length` of the longest row; best hypotheses without
    EOS (cut at Ld) are counted in ``stats.length_limited``. ``language``:
    the rows' routing-language index (:meth:`routing_index`), required by
    a language-routed model.
    """
    if self.routes_by_language and language is None:
      raise TranslatorError(f"{self.model_name} routes by language: pass "
                            "search(..., language=routing_index(...))")
    width = max(len(r) for r in rows)
    inputs = np.zeros([len(rows), width], np.int32)
    for i, row in enumerate(rows):
      inputs[i, :len(row)] = row
    languages = np.full([len(rows)], language or 0, np.int32)
    search = self._search_fn(self.decode_length(width))
    best = search(tf.constant(inputs),
                  tf.constant(languages)).sequences[:, 0].numpy()
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
    self.check_language_pair(source_lang=source_lang, target_lang=target_lang)
    language = self.routing_index(source_lang=source_lang,
                                  target_lang=target_lang)
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
      best = self.search([ids for _, _, ids in chunk], language=language)
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
                    length_ratio: float | None = None,
                    checkpoint: str = "latest"
                    ) -> tuple[Translator, rundir.RunFiles]:
  """Finds the run's files, restores the model and builds a Translator.

  ``checkpoint``: latest, best, averaged or a step
  (:func:`m4moe.training.rundir.resolve_checkpoint`).

  Raises:
    rundir.RunDirError: unusable run directory or a vocabulary other than
      the run's.
    TranslatorError: unusable SentencePiece model or settings.
  """
  files = rundir.find_run_files(model_dir, vocab_dir=vocab_dir,
                               checkpoint=checkpoint)
  source_sp = load_sentencepiece(files.source_vocab,
                                 vocab_size=files.config.src_vocab_size)
  target_sp = load_sentencepiece(files.target_vocab,
                                 vocab_size=files.config.tgt_vocab_size)
  translator = Translator(model=restore_model(files), source_sp=source_sp,
                          target_sp=target_sp, beam=beam,
                          max_input_length=max_input_length,
                          batch_size=batch_size, length_ratio=length_ratio,
                          language_pairs=files.language_pairs,
                          model_name=str(files.model_dir))
  return translator, files
