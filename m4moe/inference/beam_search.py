"""Beam search with GNMT length normalisation over a generic step function.

The search is written once against a *step function*

  ``step_fn(token_ids, cache, step, live) -> (logits, cache)``

  token_ids: <int32>[B*W]   the previous token of every beam (batch-major:
                             row ``b * W + k`` is beam k of sentence b).
  cache:     any tf.nest structure whose tensor leaves of rank >= 1 have the
             beam-flattened batch axis B*W first (rank-0 leaves, e.g. a step
             counter, are carried unchanged).
  step:      <int32>[]      0 for the first target position.
  live:      <bool>[B*W]    False for dead beams (no hypothesis: beams 1..W-1
                             at step 0, or any beam whose log-probability is
                             <= NEG_INF / 2); their logits are never used
                             for a real hypothesis, so the model may treat
                             them as padding (no MoE capacity).
  logits:    <float32>[B*W, V] scores of the next token.

so it serves the Transformer's incremental decoder (see
:func:`transformer_step_fn`) and hand-made step functions in tests alike.

Scoring follows GNMT (Wu et al. 2016): a hypothesis Y is ranked by
``log P(Y) / lp(Y)`` with ``lp(Y) = ((5 + |Y|) / 6) ** alpha``, where |Y|
counts the generated tokens including the final EOS. Finished hypotheses are
kept in a separate top-W list; the loop stops early once no alive beam can
still beat the worst of W finished hypotheses (log-probabilities only fall
and ``lp`` only grows, so ``alive_log_prob / lp(max_length)`` bounds every
continuation). With ``beam_size=1`` and ``alpha=0`` this is exactly greedy
decoding (:func:`greedy_search`); with ``alpha > 0`` a single beam may keep
extending past the greedy EOS when a longer hypothesis can still win.

Everything is a ``tf.while_loop`` over tensors with static shapes
(``[B, W, max_length + 1]`` sequence buffers), so it runs eagerly and inside
``tf.function`` unchanged.

Batch invariance: the search itself treats sentences independently, so a
sentence's hypotheses depend on the batch only through the step function.
The Transformer's (:func:`translate_ids`, :func:`translate_ids_uncached`)
routes its MoE layers per sentence and per target token (see "Decode
routing" in :mod:`m4moe.model.transformer`): with any eval capacity, a sentence gets the
same hypotheses and scores alone, beside others or repeated, and the cached
and uncached searches agree. Finished hypotheses are never decoded further
(they leave the alive beams), and dead beams are passed as ``live=False``.

Dimensions (letters of the glossary in :mod:`m4moe`):

  B: sentences; W: beams; V: target vocabulary size;
  Ld: max_decode_length, tokens generated at most.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, NamedTuple

import tensorflow as tf

from m4moe.model import interfaces
# A large finite negative score (-inf would turn 0 * -inf into NaN).
from m4moe.model.numerics import NEG_INF

StepFn = Callable[[tf.Tensor, Any, tf.Tensor, tf.Tensor],
                  tuple[tf.Tensor, Any]]


@dataclasses.dataclass(frozen=True, kw_only=True)
class BeamSearchConfig:
  """Beam search settings.

  Attributes:
    beam_size: W, hypotheses kept per sentence; 1 with alpha=0 is greedy.
    alpha: GNMT length-normalisation exponent (0 = raw log-probability).
    max_decode_length: Ld, most target tokens generated (EOS included).
    eos_id: end-of-sentence id (the project's convention: 1).
    start_id: decoder start token (0, T5-style shift-right).
    forbidden_ids: ids never generated (padding 0 by default).
  """

  beam_size: int = 4
  alpha: float = 0.6
  max_decode_length: int = 128
  eos_id: int = 1
  start_id: int = 0
  forbidden_ids: tuple[int, ...] = (0,)

  def __post_init__(self) -> None:
    if self.beam_size < 1:
      raise ValueError(f"--beam_size={self.beam_size} is invalid: use 1 "
                       "(greedy) or more beams")
    if self.alpha < 0:
      raise ValueError(f"--alpha={self.alpha} is invalid: the GNMT length "
                       "penalty exponent must be >= 0 (0.6 is usual)")
    if self.max_decode_length < 1:
      raise ValueError(f"--max_decode_length={self.max_decode_length} is "
                       "invalid: use a positive number of target tokens")
    if self.eos_id in self.forbidden_ids:
      raise ValueError(f"eos_id={self.eos_id} cannot be a forbidden id")


@dataclasses.dataclass(frozen=True)
class BeamSearchOutput:
  """Hypotheses per sentence, best first.

  Attributes:
    sequences: <int32>[B, W, Ld] generated ids (no start token), EOS included,
      zeros after it.
    scores: <float32>[B, W] length-normalised scores log P / lp.
    log_probs: <float32>[B, W] summed token log-probabilities.
    lengths: <int32>[B, W] tokens generated, EOS included.
    finished: <bool>[B, W] whether the hypothesis ended with EOS (False for
      a beam truncated at max_decode_length).
  """

  sequences: tf.Tensor
  scores: tf.Tensor
  log_probs: tf.Tensor
  lengths: tf.Tensor
  finished: tf.Tensor

  # tf.nest protocol, so tf.function can return this dataclass.
  def __tf_flatten__(self):
    return (), tuple(getattr(self, f.name) for f in dataclasses.fields(self))

  @classmethod
  def __tf_unflatten__(cls, metadata, components):
    del metadata
    return cls(*components)


class _State(NamedTuple):
  step: tf.Tensor               # <int32>[]
  alive_seqs: tf.Tensor         # <int32>[B, W, Ld+1]
  alive_log_probs: tf.Tensor    # <float32>[B, W]
  finished_seqs: tf.Tensor      # <int32>[B, W, Ld+1]
  finished_scores: tf.Tensor    # <float32>[B, W]
  finished_log_probs: tf.Tensor  # <float32>[B, W]
  finished_flags: tf.Tensor     # <bool>[B, W]
  cache: Any


def length_penalty(length: tf.Tensor, alpha: float) -> tf.Tensor:
  """GNMT lp = ((5 + |Y|) / 6) ** alpha; <float32> of ``length``'s shape."""
  return tf.pow((5.0 + tf.cast(length, tf.float32)) / 6.0, alpha)


def tile_beams(tree: Any, beam_size: int) -> Any:
  """Repeats every leaf of rank >= 1 W times on axis 0: [B, ...] -> [B*W, ...].

  Row ``b * W + k`` is a copy of row b, the layout the step function sees.
  """
  def tile(t):
    t = tf.convert_to_tensor(t)
    return t if t.shape.rank == 0 else tf.repeat(t, beam_size, axis=0)
  return tf.nest.map_structure(tile, tree)


def gather_beams(tree: Any, beam_indices: tf.Tensor, *,
                 beam_size: int) -> Any:
  """Selects beams of a beam-flattened structure.

  Args:
    tree: leaves <any>[B*W, ...] (rank-0 leaves pass through).
    beam_indices: <int32>[B, W'] source beam in [0, W) for every new beam.
    beam_size: W, beams per sentence in ``tree``.

  Returns:
    The structure with leaves <any>[B*W', ...].
  """
  batch = tf.shape(beam_indices)[0]
  offsets = tf.range(batch, dtype=tf.int32)[:, None] * beam_size
  flat = tf.reshape(offsets + beam_indices, [-1])
  def gather(t):
    return t if t.shape.rank == 0 else tf.gather(t, flat, axis=0)
  return tf.nest.map_structure(gather, tree)


def _initial_state(*, batch_size: int, cache: Any,
                   config: BeamSearchConfig) -> _State:
  k, t = config.beam_size, config.max_decode_length
  seqs = tf.fill([batch_size, k, t + 1], tf.constant(config.start_id, tf.int32))
  seqs = tf.concat([seqs[:, :, :1], tf.zeros_like(seqs[:, :, 1:])], axis=2)
  # Only beam 0 is alive at first, so the W beams do not duplicate it.
  alive = tf.tile(tf.constant([[0.0] + [NEG_INF] * (k - 1)]), [batch_size, 1])
  return _State(
      step=tf.constant(0, tf.int32),
      alive_seqs=seqs,
      alive_log_probs=alive,
      finished_seqs=tf.zeros_like(seqs),
      finished_scores=tf.fill([batch_size, k], NEG_INF),
      finished_log_probs=tf.fill([batch_size, k], NEG_INF),
      finished_flags=tf.zeros([batch_size, k], tf.bool),
      cache=cache)


def _top_candidates(state: _State, log_probs: tf.Tensor, *, k: int):
  """Top 2W continuations of the alive beams.

  Args:
    state: the loop state.
    log_probs: <float32>[B, W, V] next-token log-probabilities.
    k: W.

  Returns:
    (log_probs <float32>[B, 2W], source beam <int32>[B, 2W],
     token <int32>[B, 2W], sequences <int32>[B, 2W, Ld+1]).
  """
  vocab = tf.shape(log_probs)[2]
  total = state.alive_log_probs[:, :, None] + log_probs
  flat = tf.reshape(total, [tf.shape(total)[0], -1])
  top_lp, top_idx = tf.math.top_k(flat, k=2 * k)
  top_beam = top_idx // vocab
  top_tok = top_idx % vocab
  seqs = tf.gather(state.alive_seqs, top_beam, batch_dims=1)
  position = tf.one_hot(state.step + 1, tf.shape(seqs)[2], dtype=tf.int32)
  seqs = seqs * (1 - position) + top_tok[:, :, None] * position
  return top_lp, top_beam, top_tok, seqs


def _merge_finished(state: _State, *, top_lp, top_seqs, is_eos,
                    config: BeamSearchConfig):
  """Keeps the W best finished hypotheses among old ones and new EOS ends.

  Only an EOS candidate ranked within the top W of the 2W candidates ends a
  hypothesis (one that would survive pruning), so one beam is greedy.
  """
  in_beam = tf.range(2 * config.beam_size) < config.beam_size
  valid = is_eos & in_beam[None, :] & (top_lp > 0.5 * NEG_INF)
  new_scores = top_lp / length_penalty(state.step + 1, config.alpha)
  new_scores = tf.where(valid, new_scores, NEG_INF)
  scores = tf.concat([state.finished_scores, new_scores], axis=1)
  _, idx = tf.math.top_k(scores, k=config.beam_size)
  def pick(old, new):
    return tf.gather(tf.concat([old, new], axis=1), idx, batch_dims=1)
  return (pick(state.finished_seqs, top_seqs),
          pick(state.finished_scores, new_scores),
          pick(state.finished_log_probs, top_lp),
          pick(state.finished_flags, valid))


def _make_body(step_fn: StepFn, config: BeamSearchConfig):
  """The while-loop body: one decoding step for all beams."""
  k = config.beam_size

  def body(state: _State) -> tuple[_State]:
    batch = tf.shape(state.alive_seqs)[0]
    tokens = tf.reshape(state.alive_seqs[:, :, state.step], [-1])
    live = tf.reshape(state.alive_log_probs > 0.5 * NEG_INF, [-1])
    logits, cache = step_fn(tokens, state.cache, state.step, live)
    logits = tf.cast(logits, tf.float32)
    vocab = tf.shape(logits)[-1]
    # Scores are the model's own log-probabilities; forbidden ids are
    # excluded afterwards (not renormalised away).
    log_probs = tf.nn.log_softmax(logits)
    if config.forbidden_ids:
      banned = tf.reduce_sum(tf.one_hot(list(config.forbidden_ids), vocab), 0)
      log_probs += banned * NEG_INF
    log_probs = tf.reshape(log_probs, [batch, k, vocab])
    top_lp, top_beam, top_tok, top_seqs = _top_candidates(state, log_probs, k=k)
    is_eos = tf.equal(top_tok, config.eos_id)
    alive_lp, alive_idx = tf.math.top_k(
        tf.where(is_eos, NEG_INF + top_lp, top_lp), k=k)
    source_beam = tf.gather(top_beam, alive_idx, batch_dims=1)
    finished = _merge_finished(state, top_lp=top_lp, top_seqs=top_seqs,
                               is_eos=is_eos, config=config)
    return (_State(
        step=state.step + 1,
        alive_seqs=tf.gather(top_seqs, alive_idx, batch_dims=1),
        alive_log_probs=alive_lp,
        finished_seqs=finished[0], finished_scores=finished[1],
        finished_log_probs=finished[2], finished_flags=finished[3],
        cache=gather_beams(cache, source_beam, beam_size=k)),)
  return body


def _make_cond(config: BeamSearchConfig):
  """Continue while under max length and some alive beam can still win."""
  max_lp = length_penalty(config.max_decode_length, config.alpha)

  def cond(state: _State) -> tf.Tensor:
    best_alive = state.alive_log_probs[:, 0] / max_lp
    worst_finished = tf.reduce_min(
        tf.where(state.finished_flags, state.finished_scores, 2.0 * NEG_INF),
        axis=1)
    settled = tf.reduce_all(worst_finished > best_alive)
    return tf.logical_and(state.step < config.max_decode_length,
                          tf.logical_not(settled))
  return cond


def _lengths(seqs: tf.Tensor, *, eos_id: int) -> tf.Tensor:
  """<int32>[B, W] tokens up to and including the first EOS (else Ld)."""
  is_eos = tf.cast(tf.equal(seqs, eos_id), tf.int32)
  seen_before = tf.cumsum(is_eos, axis=2, exclusive=True)
  return tf.reduce_sum(tf.cast(seen_before == 0, tf.int32), axis=2)


def beam_search(step_fn: StepFn, *, initial_cache: Any, batch_size: int,
                config: BeamSearchConfig) -> BeamSearchOutput:
  """Runs beam search.

  Args:
    step_fn: ``(token_ids <int32>[B*W], cache, step <int32>[],
      live <bool>[B*W]) -> (logits <float32>[B*W, V], cache)``; see the
      module docstring.
    initial_cache: cache for B*W rows (use :func:`tile_beams` on a [B, ...]
      cache, or build it directly with batch B*W).
    batch_size: B (a Python int or a <int32>[] tensor).
    config: beam size, alpha, max length and special ids.

  Returns:
    A :class:`BeamSearchOutput` with W hypotheses per sentence, best first.
    When the search runs to max_decode_length, the alive (unfinished) beams
    compete with the finished ones, scored with lp(max_decode_length) and
    marked ``finished=False``; slots with no hypothesis at all (tiny
    vocabularies) have scores <= NEG_INF.
  """
  state = _initial_state(batch_size=batch_size, cache=initial_cache,
                         config=config)
  (state,) = tf.while_loop(
      _make_cond(config), _make_body(step_fn, config), (state,),
      maximum_iterations=config.max_decode_length)
  return _final_hypotheses(state, config=config)


def _final_hypotheses(state: _State, *,
                      config: BeamSearchConfig) -> BeamSearchOutput:
  """Best W of the finished hypotheses and, if max length was reached, of
  the alive (truncated) beams scored with lp(max_decode_length)."""
  reached_max = state.step >= config.max_decode_length
  alive_scores = tf.where(
      reached_max & (state.alive_log_probs > 0.5 * NEG_INF),
      state.alive_log_probs / length_penalty(config.max_decode_length,
                                             config.alpha),
      2.0 * NEG_INF)
  finished_scores = tf.where(state.finished_flags, state.finished_scores,
                             3.0 * NEG_INF)
  scores = tf.concat([finished_scores, alive_scores], axis=1)
  scores, idx = tf.math.top_k(scores, k=config.beam_size)
  def pick(finished, alive):
    return tf.gather(tf.concat([finished, alive], axis=1), idx, batch_dims=1)
  seqs = pick(state.finished_seqs, state.alive_seqs)[:, :, 1:]
  return BeamSearchOutput(
      sequences=seqs,
      scores=scores,
      log_probs=pick(state.finished_log_probs, state.alive_log_probs),
      lengths=_lengths(seqs, eos_id=config.eos_id),
      finished=pick(state.finished_flags,
                    tf.zeros_like(state.finished_flags)))


def greedy_search(step_fn: StepFn, *, initial_cache: Any, batch_size: int,
                  max_decode_length: int, eos_id: int = 1,
                  start_id: int = 0) -> BeamSearchOutput:
  """Greedy decoding: beam search with one beam and no length penalty."""
  config = BeamSearchConfig(beam_size=1, alpha=0.0,
                            max_decode_length=max_decode_length,
                            eos_id=eos_id, start_id=start_id)
  return beam_search(step_fn, initial_cache=initial_cache,
                     batch_size=batch_size, config=config)


def transformer_step_fn(model: interfaces.TranslationModel,
                        encoder_output: interfaces.Nest) -> StepFn:
  """Adapts ``Transformer.decode_step`` to the step-function signature.

  Args:
    model: an ``m4moe.model.transformer.Transformer`` (any
      :class:`~m4moe.model.interfaces.TranslationModel`).
    encoder_output: its EncoderOutput, already tiled to B*W rows.
  """
  def step_fn(token_ids, cache, step, live):
    return model.decode_step(encoder_output=encoder_output,
                             token_ids=token_ids, cache=cache, step=step,
                             live=live)
  return step_fn


def translate_ids(model: interfaces.TranslationModel, inputs: tf.Tensor, *,
                  config: BeamSearchConfig,
                  languages: tf.Tensor | None = None) -> BeamSearchOutput:
  """Encodes a source batch once and beam-searches the targets.

  The encoder output (including the cross-attention keys/values) is computed
  once per sentence and tiled to the W beams; the decoder runs one token per
  step against its self-attention cache, so the prefix is never recomputed.

  Args:
    model: an ``m4moe.model.transformer.Transformer``.
    inputs: <int32>[B, Ls] source ids (``<2xx> ... </s>``, 0 = padding).
    config: beam settings; ``max_decode_length`` must not exceed the
      model's ``max_length``.
    languages: <int32>[B] the rows' routing languages, for a
      ``--route_by=language`` model (:mod:`m4moe.moe.task_routing`); None
      for token routing.

  Returns:
    BeamSearchOutput with <int32>[B, W, Ld] sequences.
  """
  inputs = tf.convert_to_tensor(inputs, tf.int32)
  batch = tf.shape(inputs)[0]
  encoded = (model.encode(inputs) if languages is None else
             model.encode(inputs, languages=languages))
  encoder_output = tile_beams(encoded, config.beam_size)
  cache = model.init_cache(batch_size=batch * config.beam_size,
                           max_length=config.max_decode_length)
  return beam_search(transformer_step_fn(model, encoder_output),
                     initial_cache=cache, batch_size=batch, config=config)


def teacher_forced_log_probs(model: interfaces.TranslationModel,
                             inputs: tf.Tensor,
                             targets: tf.Tensor) -> tf.Tensor:
  """Summed log P(targets | inputs) from the uncached forward pass.

  Routes the MoE layers as decoding does (``per_sentence_routing``), so
  these equal the searches' ``log_probs``.

  Args:
    model: an ``m4moe.model.transformer.Transformer``.
    inputs: <int32>[B, Ls] source ids, 0 = padding.
    targets: <int32>[B, Lt] target ids ending with EOS, 0 = padding.

  Returns:
    <float32>[B] sum over non-pad target tokens of log-softmax scores.
  """
  targets = tf.convert_to_tensor(targets, tf.int32)
  logits = model({"inputs": inputs, "targets": targets}, training=False,
                 per_sentence_routing=True).logits
  log_probs = tf.nn.log_softmax(tf.cast(logits, tf.float32))
  picked = tf.gather(log_probs, targets, batch_dims=2)
  return tf.reduce_sum(picked * tf.cast(targets > 0, tf.float32), axis=1)


def uncached_step_fn(model: interfaces.TranslationModel,
                     inputs: tf.Tensor) -> StepFn:
  """Reference step function that recomputes everything at every step.

  Runs the full teacher-forced forward pass (encoder and decoder over all Ld
  target positions, static shapes, MoE layers routed as in decoding:
  ``per_sentence_routing``) and reads the logits at ``step``; the
  "cache" is only the decoded prefix, ``{"targets": <int32>[B*W, Ld]}``
  (start it with zeros). Used as the oracle for the incremental decoder and
  as the slow baseline in speed measurements.

  Args:
    model: an ``m4moe.model.transformer.Transformer``.
    inputs: <int32>[B*W, Ls] source ids, already tiled to the beams.
  """
  def step_fn(token_ids, cache, step, live):
    # Dead beams' rows are computed like live ones; with one routing group
    # per token they take no capacity from any other row.
    del live
    targets = cache["targets"]
    position = tf.range(tf.shape(targets)[1])[None, :]
    targets = tf.where(position == step - 1, token_ids[:, None], targets)
    # A non-pad placeholder at ``step`` keeps that position a real token;
    # causality makes its value irrelevant to the logits at ``step``.
    forced = tf.where(position == step, 1, targets)
    logits = model({"inputs": inputs, "targets": forced},
                   training=False, per_sentence_routing=True).logits
    return tf.gather(logits, step, axis=1), {"targets": targets}
  return step_fn


def translate_ids_uncached(model: interfaces.TranslationModel,
                           inputs: tf.Tensor, *,
                           config: BeamSearchConfig) -> BeamSearchOutput:
  """:func:`translate_ids` without any cache (see :func:`uncached_step_fn`)."""
  inputs = tf.convert_to_tensor(inputs, tf.int32)
  batch = tf.shape(inputs)[0]
  tiled = tile_beams(inputs, config.beam_size)
  cache = {"targets": tf.zeros([batch * config.beam_size,
                                config.max_decode_length], tf.int32)}
  return beam_search(uncached_step_fn(model, tiled), initial_cache=cache,
                     batch_size=batch, config=config)
