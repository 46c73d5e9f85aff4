"""Beam search on hand-made step functions with known optima."""

import itertools

import numpy as np
import pytest
import tensorflow as tf

from m4moe.inference import beam_search as decoding

PAD, EOS, A, B = 0, 1, 2, 3


def _table_step_fn(probs: np.ndarray):
  """Step function whose next-token distribution depends on the last token.

  probs: [V, V], row = previous token (the start token is 0).
  """
  logits_table = tf.constant(np.log(np.maximum(probs, 1e-20)), tf.float32)

  def step_fn(token_ids, cache, step, live):
    del step, live
    return tf.gather(logits_table, token_ids), cache
  return step_fn


# Greedy takes A (0.55) then EOS (0.4): P = 0.22. The best sequence is
# B EOS: P = 0.4 * 0.95 = 0.38.
_TRAP = np.array([
    [0.0, 0.05, 0.55, 0.40],   # after start
    [0.0, 1.0, 0.0, 0.0],      # after EOS (never used)
    [0.0, 0.40, 0.30, 0.30],   # after A
    [0.0, 0.95, 0.025, 0.025],  # after B
])


def _run(step_fn, cache, config, batch_size=1):
  return decoding.beam_search(step_fn, initial_cache=cache,
                              batch_size=batch_size, config=config)


def _dummy_cache(batch_size, beam_size):
  return decoding.tile_beams({"unused": tf.zeros([batch_size, 3])}, beam_size)


def test_beam_beats_greedy_on_trap_table():
  step_fn = _table_step_fn(_TRAP)
  greedy = decoding.greedy_search(step_fn, initial_cache=_dummy_cache(1, 1),
                                  batch_size=1, max_decode_length=5)
  np.testing.assert_array_equal(greedy.sequences[0, 0], [A, EOS, 0, 0, 0])
  np.testing.assert_allclose(greedy.log_probs[0, 0], np.log(0.55 * 0.4),
                             rtol=1e-5)
  config = decoding.BeamSearchConfig(beam_size=2, alpha=0.0,
                                     max_decode_length=5)
  beam = _run(step_fn, _dummy_cache(1, 2), config)
  np.testing.assert_array_equal(beam.sequences[0, 0], [B, EOS, 0, 0, 0])
  np.testing.assert_array_equal(beam.sequences[0, 1], [A, EOS, 0, 0, 0])
  np.testing.assert_allclose(beam.scores[0], np.log([0.38, 0.22]), rtol=1e-5)
  np.testing.assert_array_equal(beam.lengths[0], [2, 2])
  assert bool(tf.reduce_all(beam.finished))


def test_beam_one_equals_numpy_greedy_loop():
  rng = np.random.default_rng(0)
  probs = rng.dirichlet(np.ones(6) * 0.5, size=6)
  step_fn = _table_step_fn(probs)
  out = decoding.greedy_search(step_fn, initial_cache=_dummy_cache(1, 1),
                               batch_size=1, max_decode_length=8)
  masked = probs.copy()
  masked[:, PAD] = 0
  token, expected = 0, []
  for _ in range(8):
    token = int(np.argmax(masked[token]))
    expected.append(token)
    if token == EOS:
      break
  got = out.sequences[0, 0].numpy()[:len(expected)].tolist()
  assert got == expected
  assert int(out.lengths[0, 0]) == len(expected)
  # The same through the general entry point with beam_size=1.
  beam1 = _run(step_fn, _dummy_cache(1, 1), decoding.BeamSearchConfig(
      beam_size=1, alpha=0.0, max_decode_length=8))
  np.testing.assert_array_equal(beam1.sequences, out.sequences)


def _prefix_hash_step_fn(table: np.ndarray, modulus: int):
  """Logits depend on the whole prefix through a hashed state in the cache.

  cache: {"state": <int32>[B*K], "sentence": <int32>[B*K]}; a wrong beam
  gather of the cache changes the scores.
  """
  logits_table = tf.constant(table, tf.float32)

  def step_fn(token_ids, cache, step, live):
    del step, live
    state = (cache["state"] * 7 + token_ids + 1) % modulus
    logits = tf.gather_nd(logits_table,
                          tf.stack([cache["sentence"], state], axis=1))
    return logits, {"state": state, "sentence": cache["sentence"]}
  return step_fn


def _brute_force(table, modulus, sentence, max_len, alpha):
  """All hypotheses as (tokens, score, finished), best first, by enumeration.

  Finished ones end with EOS; truncated ones have max_len non-EOS tokens.
  """
  def log_softmax(x):
    x = x.astype(np.float64) - x.max()
    return x - np.log(np.exp(x).sum())
  def score(seq):
    state, prev, total = 0, 0, 0.0
    for tok in seq:
      state = (state * 7 + prev + 1) % modulus
      total += log_softmax(table[sentence, state])[tok]
      prev = tok
    return total / ((5.0 + len(seq)) / 6.0) ** alpha
  vocab = table.shape[2]
  results = []
  for length in range(1, max_len + 1):
    for body in itertools.product(range(2, vocab), repeat=length - 1):
      seq = tuple(body) + (EOS,)
      results.append((seq, score(seq), True))
  for seq in itertools.product(range(2, vocab), repeat=max_len):
    results.append((seq, score(seq), False))
  return sorted(results, key=lambda r: -r[1])


@pytest.mark.parametrize("alpha", [0.0, 0.6, 2.0])
def test_exhaustive_beam_matches_enumeration(alpha):
  modulus, vocab, max_len, batch = 97, 4, 5, 3
  table = np.random.default_rng(1).normal(
      scale=2.0, size=(batch, modulus, vocab)).astype(np.float32)
  step_fn = _prefix_hash_step_fn(table, modulus)
  # K >= 3 * 2**(T-1) candidates: nothing is ever pruned.
  config = decoding.BeamSearchConfig(beam_size=48, alpha=alpha,
                                     max_decode_length=max_len)
  cache = decoding.tile_beams(
      {"state": tf.zeros([batch], tf.int32),
       "sentence": tf.range(batch, dtype=tf.int32)}, 48)
  out = _run(step_fn, cache, config, batch_size=batch)
  for s in range(batch):
    expected = _brute_force(table, modulus, s, max_len, alpha)[:48]
    np.testing.assert_allclose(out.scores[s].numpy(), [e[1] for e in expected],
                               rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(out.finished[s].numpy(),
                                  [e[2] for e in expected])
    best = out.sequences[s, 0].numpy()[:out.lengths[s, 0].numpy()]
    assert tuple(best) == expected[0][0]


def test_small_beam_finds_enumeration_best_and_is_deterministic():
  modulus, vocab, max_len, batch = 97, 5, 6, 4
  table = np.random.default_rng(2).normal(
      scale=3.0, size=(batch, modulus, vocab)).astype(np.float32)
  step_fn = _prefix_hash_step_fn(table, modulus)
  config = decoding.BeamSearchConfig(beam_size=4, alpha=0.6,
                                     max_decode_length=max_len)
  cache = decoding.tile_beams(
      {"state": tf.zeros([batch], tf.int32),
       "sentence": tf.range(batch, dtype=tf.int32)}, 4)
  eager = _run(step_fn, cache, config, batch_size=batch)
  compiled = tf.function(lambda c: _run(step_fn, c, config, batch_size=batch))
  graph = compiled(cache)
  again = compiled(cache)
  # Deterministic: the same program gives bitwise-identical results, and
  # eager and graph execution agree (scores to float32 rounding).
  np.testing.assert_array_equal(graph.sequences, again.sequences)
  np.testing.assert_array_equal(graph.scores, again.scores)
  np.testing.assert_array_equal(eager.sequences, graph.sequences)
  np.testing.assert_allclose(eager.scores, graph.scores, rtol=1e-6)
  # Scores are sorted and consistent with log_probs and lengths.
  scores = eager.scores.numpy()
  assert np.all(np.diff(scores, axis=1) <= 1e-6)
  np.testing.assert_allclose(
      scores, eager.log_probs.numpy() /
      ((5.0 + eager.lengths.numpy()) / 6.0) ** 0.6, rtol=1e-5)
  # Every returned hypothesis's score equals its enumerated score, and no
  # enumerated hypothesis beats what beam 4 returned by more than search
  # error allows; with strong tables K=4 finds the optimum here.
  for s in range(batch):
    expected = {e[0]: e[1] for e in _brute_force(table, modulus, s, max_len,
                                                 0.6)}
    for k in range(4):
      seq = tuple(eager.sequences[s, k].numpy()[:eager.lengths[s, k]])
      np.testing.assert_allclose(scores[s, k], expected[seq], rtol=1e-4)
    assert scores[s, 0] == pytest.approx(max(expected.values()), rel=1e-4)


def test_no_eos_within_max_length_returns_alive_beams():
  probs = np.array([[0.0, 1e-6, 0.5, 0.5]] * 4)
  config = decoding.BeamSearchConfig(beam_size=2, alpha=0.6,
                                     max_decode_length=3)
  out = _run(_table_step_fn(probs), _dummy_cache(1, 2), config)
  assert not bool(tf.reduce_any(out.finished))
  np.testing.assert_array_equal(out.lengths, [[3, 3]])
  assert not np.any(out.sequences.numpy() == EOS)


def test_early_stop_keeps_results_of_full_search():
  # Once EOS dominates, stopping early must not change the result.
  step_fn = _table_step_fn(_TRAP)
  short = _run(step_fn, _dummy_cache(1, 2),
               decoding.BeamSearchConfig(beam_size=2, alpha=0.6,
                                         max_decode_length=4))
  long = _run(step_fn, _dummy_cache(1, 2),
              decoding.BeamSearchConfig(beam_size=2, alpha=0.6,
                                        max_decode_length=40))
  np.testing.assert_array_equal(short.sequences[:, :, :4],
                                long.sequences[:, :, :4])
  np.testing.assert_allclose(short.log_probs, long.log_probs, rtol=1e-6)


@pytest.mark.parametrize("kwargs,flag", [
    ({"beam_size": 0}, "--beam_size"), ({"alpha": -1.0}, "--alpha"),
    ({"max_decode_length": 0}, "--max_decode_length")])
def test_config_validation_names_flag(kwargs, flag):
  with pytest.raises(ValueError, match=flag):
    decoding.BeamSearchConfig(**kwargs)


# ---------------------------------------------------------------------------
# The real Transformer (tiny, random init with a wide init so the
# distributions are far from uniform).

# Zoo entries at tiny dimensions: "moe" is tiny/moe (no-drop eval capacity,
# sorted dispatch); "moe_capacity" the same with --eval_capacity_factor=1.0;
# "gshard" is gshard/moe_128e_12l (eval capacity factor 1.0, einsum
# dispatch) with 8 experts, so eval capacity drops tokens.
_ZOO_KINDS = {
    "dense": ("tiny/dense", {}),
    "moe": ("tiny/moe", {"expert_hidden_dim": 32, "num_experts": 4,
                         "group_size": 64}),
    "moe_capacity": ("tiny/moe", {"expert_hidden_dim": 32, "num_experts": 4,
                                  "group_size": 64,
                                  "eval_capacity_factor": 1.0}),
    "gshard": ("gshard/moe_128e_12l", {"expert_hidden_dim": 32,
                                       "num_experts": 8, "group_size": 64}),
}


def _tiny_model(kind: str):
  from m4moe import config as config_lib  # pylint: disable=g-import-not-at-top
  from m4moe.model import transformer as model_lib  # pylint: disable=g-import-not-at-top
  name, moe_overrides = _ZOO_KINDS[kind]
  cfg = config_lib.load_model_config(
      name, src_vocab_size=48, tgt_vocab_size=40, d_model=32,
      num_heads=2, d_kv=16, d_ff=64, num_encoder_layers=2,
      num_decoder_layers=2, dropout_rate=0.0, attention_dropout_rate=0.0,
      init_scale=4.0, max_length=32, **moe_overrides)
  tf.random.set_seed(1234)
  model = model_lib.Transformer(config=cfg)
  # Make EOS a near-copy of a token greedy decoding often emits, so
  # hypotheses end at varied lengths (random weights alone never pick EOS).
  greedy = decoding.translate_ids(model, _sources(8, seed=7), config=(
      decoding.BeamSearchConfig(beam_size=1, alpha=0.0, max_decode_length=8)))
  tokens, counts = np.unique(greedy.sequences.numpy()[:, 0, 1:],
                             return_counts=True)
  kernel = model.output_projection.kernel.numpy()
  kernel[:, EOS] = kernel[:, tokens[np.argsort(counts)[-2]]] * 1.1
  model.output_projection.kernel.assign(kernel)
  return model


def _sources(count: int, seed: int) -> np.ndarray:
  """<int32>[count, 12] source rows of varied lengths, tag-like first id."""
  rng = np.random.default_rng(seed)
  rows = np.zeros([count, 12], np.int32)
  for i in range(count):
    n = rng.integers(2, 11)
    rows[i, :n] = rng.integers(3, 48, size=n)
    rows[i, n] = EOS
  return rows


@pytest.mark.parametrize("kind", ["dense", "moe", "gshard"])
def test_cached_scores_equal_teacher_forced(kind):
  model = _tiny_model(kind)
  config = decoding.BeamSearchConfig(beam_size=3, alpha=0.6,
                                     max_decode_length=12)
  sources = _sources(4, seed=0)
  out = decoding.translate_ids(model, sources, config=config)
  assert 0 < int(tf.reduce_sum(tf.cast(out.finished, tf.int32))) < 12
  for k in range(3):
    targets = out.sequences[:, k]
    forced = decoding.teacher_forced_log_probs(model, sources, targets)
    np.testing.assert_allclose(out.log_probs[:, k], forced, rtol=1e-4,
                               atol=1e-4)


@pytest.mark.parametrize("kind", ["dense", "moe", "moe_capacity", "gshard"])
def test_incremental_search_equals_uncached_search(kind):
  model = _tiny_model(kind)
  config = decoding.BeamSearchConfig(beam_size=3, alpha=0.6,
                                     max_decode_length=10)
  sources = _sources(3, seed=5)
  cached = decoding.translate_ids(model, sources, config=config)
  uncached = decoding.translate_ids_uncached(model, sources, config=config)
  np.testing.assert_array_equal(cached.sequences, uncached.sequences)
  np.testing.assert_allclose(cached.scores, uncached.scores, rtol=1e-4,
                             atol=1e-4)
  # The random model is far from uniform: real, varied hypotheses.
  assert len({tuple(s) for s in cached.sequences[:, 0].numpy()}) == 3


@pytest.mark.parametrize("kind", ["dense", "moe", "moe_capacity", "gshard"])
def test_sentence_decodes_the_same_alone_and_in_a_batch_of_64(kind):
  model = _tiny_model(kind)
  config = decoding.BeamSearchConfig(beam_size=2, alpha=0.6,
                                     max_decode_length=10)
  batch = _sources(65, seed=1)
  alone = _sources(1, seed=1)[:1, :int(np.sum(batch[0] > 0))]
  def run(x):
    return decoding.translate_ids(model, x, config=config)
  together = run(batch)
  single = run(alone)
  np.testing.assert_array_equal(single.sequences[0], together.sequences[0])
  np.testing.assert_allclose(single.scores[0], together.scores[0], rtol=1e-5)
  # Deterministic: the same batch again gives bitwise-identical results.
  again = run(batch)
  np.testing.assert_array_equal(again.sequences, together.sequences)
  np.testing.assert_array_equal(again.scores, together.scores)


@pytest.mark.parametrize("kind", ["moe_capacity", "gshard"])
def test_sentence_alone_beside_others_and_repeated_decodes_the_same(kind):
  model = _tiny_model(kind)
  config = decoding.BeamSearchConfig(beam_size=3, alpha=0.6,
                                     max_decode_length=10)
  others = _sources(5, seed=11)
  sentence = others[2:3]
  def run(x):
    return decoding.translate_ids(model, x, config=config)
  alone = run(sentence[:, :int(np.sum(sentence > 0))])  # no padding at all
  beside = run(others)
  repeated = run(np.repeat(sentence, 4, axis=0))
  for out, row in [(beside, 2)] + [(repeated, r) for r in range(4)]:
    np.testing.assert_array_equal(out.sequences[row], alone.sequences[0])
    np.testing.assert_allclose(out.scores[row], alone.scores[0], rtol=1e-5)
  # The four copies in one batch: the same tokens (checked above) and scores
  # to float32 rounding (an expert's matmul sees the copies at different
  # rows, which may round differently).
  for r in range(1, 4):
    np.testing.assert_allclose(repeated.scores[r], repeated.scores[0],
                               rtol=1e-6)
  # The eval capacity really binds (else this would hold trivially): the
  # sentences' own encoder groups drop tokens.
  stats = model({"inputs": others, "targets": beside.sequences[:, 0]},
                training=False, per_sentence_routing=True).moe_stats
  dropped = [float(v.dropped_first + v.dropped_second)
             for k, v in stats.items() if k.startswith("encoder/")]
  assert max(dropped) > 0


def test_dead_beams_are_passed_as_not_live():
  seen = []
  probs = np.array([[0.0, 0.1, 0.45, 0.45]] * 4)
  inner = _table_step_fn(probs)

  def step_fn(token_ids, cache, step, live):
    seen.append(live.numpy().reshape(2, 3))
    return inner(token_ids, cache, step, live)

  _run(step_fn, _dummy_cache(2, 3), decoding.BeamSearchConfig(
      beam_size=3, alpha=0.6, max_decode_length=4), batch_size=2)
  assert len(seen) == 4
  # Step 0: only beam 0 of each sentence holds a hypothesis.
  np.testing.assert_array_equal(seen[0], [[True, False, False]] * 2)
  # Step 1: one beam has only two non-EOS continuations (A, B) for 3 beams.
  np.testing.assert_array_equal(seen[1], [[True, True, False]] * 2)
  # Then 2 * 2 continuations fill all 3 beams.
  np.testing.assert_array_equal(seen[2], np.ones([2, 3], bool))


def test_incremental_decoding_never_recomputes_the_prefix():
  model = _tiny_model("dense")
  config = decoding.BeamSearchConfig(beam_size=2, alpha=0.6,
                                     max_decode_length=8)
  sources = _sources(2, seed=2)
  encoder_output = decoding.tile_beams(model.encode(sources), 2)
  inner = decoding.transformer_step_fn(model, encoder_output)
  seen = []

  def step_fn(token_ids, cache, step, live):
    logits, new_cache = inner(token_ids, cache, step, live)
    seen.append((int(step), token_ids.shape, cache, new_cache))
    return logits, new_cache

  cache = model.init_cache(batch_size=4, max_length=8)
  decoding.beam_search(step_fn, initial_cache=cache, batch_size=2,
                       config=config)
  assert [s for s, *_ in seen] == list(range(len(seen)))
  for step, token_shape, before, after in seen:
    assert token_shape == (4,)  # one token per beam, never the prefix
    for old, new in zip(before.keys + before.values,
                        after.keys + after.values):
      old, new = old.numpy(), new.numpy()
      np.testing.assert_array_equal(new[:, :step], old[:, :step])
      assert np.any(new[:, step] != 0)
      assert not np.any(new[:, step + 1:])
