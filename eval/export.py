"""SavedModel export with a ``translate`` signature (strings in, strings out).

Tokenisation inside the graph uses TensorFlow Text's
``SentencepieceTokenizer`` (the SentencePiece library as TF ops, the model
proto stored in the SavedModel). Core TensorFlow has no SentencePiece op,
and ``tf.py_function`` is not serialised into a SavedModel, so the
``tensorflow-text`` package (same minor version as TensorFlow) is required
to export *and* must be imported before ``tf.saved_model.load`` in the
loading process, to register its ops::

  import tensorflow as tf
  import tensorflow_text  # registers the SentencePiece ops
  m = tf.saved_model.load(path)
  out = m.signatures["translate"](sentences=tf.constant(["Hallo Welt"]),
                                  source_lang=tf.constant(["de"]))
  out["translations"]  # <string>[B]; out["truncated"] <bool>[B]

The graph does what :class:`m4moe.eval.translator.Translator` does: source
ids ``<2tgt> pieces[:max_input_length-2] </s>``, beam search with the
export-time settings, ids up to EOS detokenised; whitespace-only inputs give
``""``. A source language that is not among the exported ones (those the
run was trained to translate into the target, with a tag in the
vocabulary) fails with an InvalidArgumentError naming it.

A ``--route_by=language`` model routes each row by its pair's routing
language (:mod:`m4moe.moe.task_routing`): ``source_lang`` for an English target,
else the target language. Exported for one language after
:func:`m4moe.inference.extraction.extract_language` (``m4moe-export --language``),
the model holds only that language's experts and accepts only that
language (``source_languages=[language]``).
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import shutil
import tempfile
from typing import Any, Sequence

import tensorflow as tf

from m4moe.inference import beam_search as decoding
from m4moe.moe import task_routing

_TAG_PIECE = re.compile(r"^<2(.+)>$")


class ExportError(RuntimeError):
  """The export cannot be done here; says why and how to fix it."""


def require_tensorflow_text() -> Any:
  """Imports tensorflow_text or explains how to install it."""
  try:
    import tensorflow_text  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise ExportError(
        "m4moe-export needs TensorFlow Text for in-graph SentencePiece "
        f"({e}). Install the release matching TensorFlow {tf.__version__} "
        "without touching TensorFlow itself: pip install --no-deps "
        f"'tensorflow-text=={'.'.join(tf.__version__.split('.')[:2])}.*'"
    ) from e
  return tensorflow_text


def tagged_languages(source_sp) -> list[str]:
  """Languages with a ``<2xx>`` piece in the source vocabulary."""
  out = []
  for pid in range(source_sp.get_piece_size()):
    match = _TAG_PIECE.match(source_sp.id_to_piece(pid))
    if match:
      out.append(match.group(1))
  return sorted(out)


class TranslateModule(tf.Module):
  """The exported module: model weights, tokenizers, ``translate``.

  Args:
    model: the restored Transformer.
    source_proto, target_proto: serialized SentencePiece model protos.
    languages: source languages accepted (those with a tag).
    target_tag: id of the target-language tag starting every source.
    beam: beam search settings baked into the graph.
    max_input_length: most source ids (tag and EOS included).
    metadata: JSON-serialisable facts stored in the SavedModel.
    target_lang: the target language (routing language of ``en_xx`` pairs).
  """

  def __init__(self, *, model: Any, source_proto: bytes, target_proto: bytes,
               languages: Sequence[str], target_tag: int,
               beam: decoding.BeamSearchConfig, max_input_length: int,
               metadata: dict[str, Any], target_lang: str = "en"):
    super().__init__(name="m4moe_translate")
    text = require_tensorflow_text()
    self.model = model
    # Distinct names: the op's kernel-owned resource is shared by node name,
    # so two tokenizers with the default name would both get one model
    # after tf.saved_model.load.
    self.source_tokenizer = text.SentencepieceTokenizer(
        model=source_proto, out_type=tf.int32, name="m4moe_source_spm")
    self.target_tokenizer = text.SentencepieceTokenizer(
        model=target_proto, out_type=tf.int32, name="m4moe_target_spm")
    self.languages = tf.constant(list(languages), tf.string)
    self.metadata = tf.Variable(json.dumps(metadata, sort_keys=True),
                                trainable=False, dtype=tf.string)
    self._beam, self._target_tag = beam, target_tag
    self._max_input_length = max_input_length
    # Language routing: the gate rows of the accepted languages, in graph.
    self._routing = None
    if getattr(model, "routes_by_language", False):
      moe = model.config.moe
      routed = ([target_lang] if target_lang != task_routing.ENGLISH
                else list(languages))  # en_xx pairs route by the target
      try:
        self._routing = (routed, [moe.language_index(l) for l in routed])
      except ValueError as e:
        raise ExportError(str(e)) from e

  def _routing_languages(self, source_lang: tf.Tensor) -> tf.Tensor | None:
    """<int32>[B] gate rows of the rows' routing languages (None: token
    routing). Unknown languages are rejected by ``_check_languages``."""
    if self._routing is None:
      return None
    names, rows = self._routing
    if len(names) == 1:
      return tf.fill(tf.shape(source_lang), tf.constant(rows[0], tf.int32))
    match = tf.equal(source_lang[:, None], tf.constant(names)[None, :])
    position = tf.argmax(tf.cast(match, tf.int32), axis=1, output_type=tf.int32)
    return tf.gather(tf.constant(rows, tf.int32), position)

  def _check_languages(self, source_lang: tf.Tensor) -> tf.Operation:
    known = tf.reduce_any(
        tf.equal(source_lang[:, None], self.languages[None, :]), axis=1)
    unknown = tf.boolean_mask(source_lang, tf.logical_not(known))
    return tf.debugging.Assert(
        tf.reduce_all(known),
        ["unknown source_lang (no <2xx> tag in the vocabulary, or not "
         "trained into the exported target language):", unknown,
         "known:", self.languages], summarize=20)

  @tf.function(input_signature=[tf.TensorSpec([None], tf.string),
                                tf.TensorSpec([None], tf.string)],
               autograph=False)
  def translate(self, sentences: tf.Tensor,
                source_lang: tf.Tensor) -> dict[str, tf.Tensor]:
    """<string>[B] sentences, <string>[B] source languages ->
    {"translations": <string>[B], "truncated": <bool>[B]}."""
    with tf.control_dependencies([self._check_languages(source_lang)]):
      pieces = self.source_tokenizer.tokenize(sentences)
    room = self._max_input_length - 2
    truncated = pieces.row_lengths() > room
    pieces = pieces[:, :room]
    n = tf.shape(sentences)[0]
    tag = tf.fill([n, 1], tf.constant(self._target_tag, tf.int32))
    eos = tf.fill([n, 1], tf.constant(decoding.BeamSearchConfig().eos_id,
                                      tf.int32))
    inputs = tf.concat([tf.RaggedTensor.from_tensor(tag), pieces,
                        tf.RaggedTensor.from_tensor(eos)], axis=1).to_tensor(0)
    out = decoding.translate_ids(self.model, inputs, config=self._beam,
                                 languages=self._routing_languages(
                                     source_lang))
    best = out.sequences[:, 0]
    keep = out.lengths[:, 0] - tf.cast(out.finished[:, 0], tf.int32)
    ragged = tf.RaggedTensor.from_tensor(best, lengths=keep)
    texts = tf.strings.regex_replace(
        self.target_tokenizer.detokenize(ragged), r"[\r\n]", " ")
    empty = tf.equal(tf.strings.length(tf.strings.strip(sentences)), 0)
    return {"translations": tf.where(empty, tf.constant(""), texts),
            "truncated": tf.logical_and(truncated, tf.logical_not(empty))}


def export_saved_model(translator: Any, path: str | pathlib.Path, *,
                       target_lang: str = "en",
                       metadata: dict[str, Any] | None = None,
                       source_languages: Sequence[str] | None = None
                       ) -> pathlib.Path:
  """Writes a SavedModel reproducing ``translator``'s output.

  The SavedModel is written to a temporary directory next to ``path`` and
  renamed onto it when complete, so a failure leaves no partial export.
  ``path`` must not exist or be an empty directory. The accepted source
  languages are those with a tag that the run was trained to translate
  into ``target_lang`` (all tagged languages for runs without that record).

  Args:
    translator: an ``m4moe.eval.translator.Translator``.
    path: output directory.
    target_lang: target language baked in (its tag starts every source).
    metadata: extra facts stored in the module's ``metadata`` JSON.
    source_languages: accept only these of the trained source languages
      (a per-language extraction); None: all.

  Raises:
    ExportError: tensorflow-text is missing, ``path`` is not empty, no
      trained source language translates into ``target_lang``, or one of
      ``source_languages`` does not.
  """
  require_tensorflow_text()
  path = pathlib.Path(path)
  if path.exists() and (not path.is_dir() or any(path.iterdir())):
    raise ExportError(f"{path} exists and is not an empty directory; export "
                      "to a new directory (exports are never overwritten)")
  languages = _export_languages(translator, target_lang=target_lang,
                                source_languages=source_languages)
  module = TranslateModule(
      model=translator.model,
      source_proto=translator.source_sp.serialized_model_proto(),
      target_proto=translator.target_sp.serialized_model_proto(),
      languages=languages,
      target_tag=translator.tag_id(target_lang), beam=translator.beam,
      max_input_length=translator.max_input_length, target_lang=target_lang,
      metadata={"target_lang": target_lang,
                "beam_size": translator.beam.beam_size,
                "alpha": translator.beam.alpha,
                "max_decode_length": translator.beam.max_decode_length,
                "max_input_length": translator.max_input_length,
                "source_languages": languages,
                **(metadata or {})})
  _save_atomically(module, path)
  return path


def _export_languages(translator: Any, *, target_lang: str,
                      source_languages: Sequence[str] | None) -> list[str]:
  """The source languages the export accepts.

  Only tagged languages the run was trained to translate into
  ``target_lang``: any other tag would decode a direction the model never
  learnt, so the SavedModel refuses it instead.

  Raises:
    ExportError: no trained source language translates into
      ``target_lang``, or one of ``source_languages`` does not.
  """
  pairs = translator.language_pairs
  languages = [lang for lang in tagged_languages(translator.source_sp)
               if pairs is None or (lang, target_lang) in pairs]
  if not languages:
    trained = ", ".join(f"{s}->{t}" for s, t in sorted(pairs or ()))
    raise ExportError(f"no source language of the run translates into "
                      f"{target_lang!r} (trained pairs: {trained or 'none'}); "
                      "pass a --target_lang the run was trained on")
  if source_languages is not None:
    missing = sorted(set(source_languages) - set(languages))
    if missing:
      raise ExportError(
          f"source language(s) {', '.join(missing)} do not translate into "
          f"{target_lang!r} in this run (it does: {', '.join(languages)}); "
          "pick one of those")
    languages = sorted(source_languages)
  return languages


def _save_atomically(module: TranslateModule, path: pathlib.Path) -> None:
  """Saves ``module`` to ``path`` (absent or empty) all at once.

  The SavedModel is written into a temporary directory next to ``path`` and
  renamed onto it when complete, so a failure or a kill leaves no partial
  export that a server could load.
  """
  signature = module.translate.get_concrete_function()
  path.parent.mkdir(parents=True, exist_ok=True)
  tmp = pathlib.Path(tempfile.mkdtemp(dir=path.parent,
                                      prefix=f".{path.name}.", suffix=".tmp"))
  try:
    tf.saved_model.save(module, str(tmp), signatures={"translate": signature})
    if path.is_dir():
      path.rmdir()  # empty (checked by the caller); os.replace needs it gone
    os.replace(tmp, path)
  except BaseException:
    shutil.rmtree(tmp, ignore_errors=True)  # only what this call created
    raise
  os.chmod(path, 0o755)  # mkdtemp creates 0700
