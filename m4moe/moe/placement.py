"""Capacity: which buffer position each chosen expert gives a token.

Dimensions (letters of the glossary in :mod:`m4moe`):

  G: groups; S: group size; E: experts; C: expert capacity;
  K: expert choices per token.

A token-choice router (:mod:`m4moe.moe.routing`) decides which experts a
token wants; this module decides which of those requests fit (GShard's
Algorithm 1 capacity rule generalised to K choices: all first choices of a
group take positions, in token order or in a given priority order, before
any second choice, and so on), optionally re-routes overflowed choices to
free experts (No-Token-Left-Behind), and turns the per-token view
(``[G, S, K]`` experts and positions) into the per-slot view (``[G, E, C]``
tokens and weights). On one device and without re-routing the positions
come from one sort per group (:func:`place_sorted`); otherwise from K
passes of per-expert counters, which partition over a mesh.
"""

from __future__ import annotations

import tensorflow as tf

from m4moe.model.numerics import NEG_INF as _NEG_INF


def capacity_limit(capacity: int,
                    group_capacity: tf.Tensor | None) -> int | tf.Tensor:
  """C, or the per-group caps as <int32>[G, 1] (broadcasts against [G, S])."""
  if group_capacity is None:
    return capacity
  return tf.expand_dims(tf.minimum(tf.cast(group_capacity, tf.int32),
                                   capacity), 1)


def reroute_candidates(reroute_key: tf.Tensor,
                        choices: tf.Tensor) -> tf.Tensor:
  """<int32>[G, S, E-K] experts a token did not choose, most preferred first."""
  num_experts, k = reroute_key.shape[-1], choices.shape[-1]
  chosen = tf.reduce_sum(tf.one_hot(choices, num_experts), axis=2) > 0
  key = tf.where(chosen, _NEG_INF, reroute_key)
  order = tf.argsort(key, axis=-1, direction="DESCENDING", stable=True)
  return tf.cast(tf.gather(order, tf.range(num_experts - k), axis=2),
                 tf.int32)


def request(expert: tf.Tensor, requesting: tf.Tensor, counts: tf.Tensor):
  """Hands out buffer positions in token order.

  Args:
    expert: <int32>[G, S] requested expert per token.
    requesting: <bool>[G, S] which tokens request.
    counts: <int32>[G, E] positions handed out so far.

  Returns:
    (position <int32>[G, S] (0 where not requesting), new counts).
  """
  one_hot = (tf.one_hot(expert, counts.shape[-1], dtype=tf.int32)
             * tf.expand_dims(tf.cast(requesting, tf.int32), -1))  # [G, S, E]
  before = (tf.cumsum(one_hot, axis=1, exclusive=True)
            + tf.expand_dims(counts, 1))
  return (tf.reduce_sum(before * one_hot, axis=-1),
          counts + tf.reduce_sum(one_hot, axis=1))


def no_token_left_behind(expert, position, kept, pending, counts, *,
                          taken, candidates, capacity: int | tf.Tensor):
  """Re-routes one choice's overflowed tokens to their next-best free expert.

  Round t offers every pending token its t-th candidate expert (skipping one
  the token already uses); requests take positions in token order after
  everything already placed and succeed below C. Rounds repeat until nothing
  is pending or the candidates run out.

  Args:
    expert, position: <int32>[G, S] this choice; kept, pending: <bool>[G, S].
    counts: <int32>[G, E] positions handed out so far.
    taken: <int32>[G, S, j+1] experts of the token's choices 0..j (this
      choice j's own expert is full).
    candidates: <int32>[G, S, E-K] from :func:`reroute_candidates`.
    capacity: C, or <int32>[G, 1] per-group caps.

  Returns:
    Updated (expert, position, kept, counts).
  """
  def body(t, expert, position, kept, pending, counts):
    candidate = tf.gather(candidates, t, axis=2)  # [G, S]
    requesting = pending & ~tf.reduce_any(
        taken == tf.expand_dims(candidate, -1), axis=-1)
    offered, counts = request(candidate, requesting, counts)
    moved = requesting & (offered < capacity)
    return (t + 1, tf.where(moved, candidate, expert),
            tf.where(moved, offered, position), kept | moved,
            pending & ~moved, counts)

  def cond(t, expert, position, kept, pending, counts):
    del expert, position, kept, counts
    return tf.logical_and(t < candidates.shape[-1], tf.reduce_any(pending))

  _, expert, position, kept, _, counts = tf.while_loop(
      cond, body, (tf.constant(0), expert, position, kept, pending, counts))
  return expert, position, kept, counts


def place_sorted(choices: tf.Tensor, requested: tf.Tensor,
                  attempted: tf.Tensor, *, num_experts: int,
                  capacity: int | tf.Tensor) -> tuple[tf.Tensor, ...]:
  """:func:`place` without re-routing, all K choices at once by sorting.

  The queue of a group is its requests in placement order (all 1st choices
  in token order, then all 2nd, ...); a request's position is the number of
  earlier requests for the same expert, i.e. its rank within its expert's
  run after a stable sort of the queue by expert. That is one sort per
  group instead of K passes over one-hot ``<[G, S, E]>`` counters with a
  cumulative sum each, which cost ~4x more at E = 64, K = 8 (the
  fine-grained MoE's router). The positions are the same integers.
  One device only: DTensor has no expansion for ``searchsorted``, and the
  inverse permutation indexes the flattened groups across shards.

  Args:
    choices, requested, attempted: as for :func:`place`.
    num_experts: E.
    capacity: C, or <int32>[G, 1] per-group caps.

  Returns:
    (choices, positions, kept) as :func:`place` returns them without
    re-routing (positions of the requests that are not kept may differ:
    callers read positions only where kept).
  """
  group_size, num_k = choices.shape[1], choices.shape[2]
  queue_length = group_size * num_k
  def queue(t):  # [G, S, K] -> [G, K*S], choice j of token s at j*S + s
    return tf.reshape(tf.transpose(t, [0, 2, 1]), [-1, queue_length])
  key = tf.where(queue(requested), queue(choices), num_experts)
  order = tf.argsort(key, axis=-1, stable=True)
  sorted_key = tf.gather(key, order, batch_dims=1)
  rank = tf.range(queue_length)[tf.newaxis, :] - tf.searchsorted(
      sorted_key, sorted_key, side="left")
  # Back to queue order: the inverse of the groups' permutations, as one
  # permutation of the flattened [G * K*S] queue entries.
  offsets = tf.range(tf.shape(order)[0])[:, tf.newaxis] * queue_length
  inverse = tf.math.invert_permutation(tf.reshape(order + offsets, [-1]))
  position = tf.reshape(tf.gather(tf.reshape(rank, [-1]), inverse),
                        tf.shape(order))
  kept = queue(attempted) & (position < capacity)
  def unqueue(t):  # [G, K*S] -> [G, S, K]
    return tf.transpose(tf.reshape(t, [-1, num_k, group_size]), [0, 2, 1])
  return choices, unqueue(position), unqueue(kept)


def place(choices: tf.Tensor, requested: tf.Tensor, attempted: tf.Tensor, *,
           num_experts: int, capacity: int | tf.Tensor,
           candidates: tf.Tensor | None,
           one_device: bool = False) -> tuple[tf.Tensor, ...]:
  """Capacity: all 1st choices of a group (in token order), then all 2nd, ...

  Args:
    choices: <int32>[G, S, K] chosen experts.
    requested: <bool>[G, S, K] choices that take a buffer position (real
      tokens; Algorithm 1 counts a 2nd choice even if the policy skips it).
    attempted: <bool>[G, S, K] requested choices the policy dispatches.
    num_experts: E.
    capacity: C, or <int32>[G, 1] per-group caps (:func:`capacity_limit`).
    candidates: <int32>[G, S, R] No-Token-Left-Behind re-routing order, or
      None to drop overflowed choices. Overflowed j-th choices are re-routed
      before any (j+1)-th choice is placed.
    one_device: not on a mesh; without ``candidates`` the positions are
      then computed by :func:`place_sorted` (the same kept choices and
      positions, faster).

  Returns:
    (choices, positions, kept): final <int32>[G, S, K] experts, positions and
    <bool>[G, S, K] dispatched flags.
  """
  if one_device and candidates is None:
    return place_sorted(choices, requested, attempted,
                         num_experts=num_experts, capacity=capacity)
  # tf.unstack rather than [:, :, j] slices: DTensor partitions it cleanly.
  choice_list = tf.unstack(choices, axis=-1)
  requested_list = tf.unstack(requested, axis=-1)
  attempted_list = tf.unstack(attempted, axis=-1)
  counts = tf.reduce_sum(  # zeros <int32>[G, E] laid out like the inputs
      tf.one_hot(choice_list[0], num_experts, dtype=tf.int32) * 0, axis=1)
  experts, positions, kepts = [], [], []
  for j, expert in enumerate(choice_list):
    position, counts = request(expert, requested_list[j], counts)
    kept = attempted_list[j] & (position < capacity)
    if candidates is not None:
      taken = tf.stack(experts + [expert], -1)  # its own expert is full
      expert, position, kept, counts = no_token_left_behind(
          expert, position, kept, attempted_list[j] & ~kept, counts,
          taken=taken, candidates=candidates, capacity=capacity)
    experts.append(expert)
    positions.append(position)
    kepts.append(kept)
  return (tf.stack(experts, -1), tf.stack(positions, -1),
          tf.stack(kepts, -1))


def slot_view(choices: tf.Tensor, positions: tf.Tensor, weights: tf.Tensor,
               *, num_experts: int,
               capacity: int) -> tuple[tf.Tensor, tf.Tensor]:
  """Scatters the per-token view <[G, S, K]> into buffer slots <[G, E, C]>.

  Args:
    choices: <int32>[G, S, K] experts; positions: <int32>[G, S, K] buffer
      positions, -1 if not dispatched; weights: <float32>[G, S, K].
    num_experts: E.
    capacity: C.

  Returns:
    (slot_token <int32>[G, E, C] (S if empty), slot_weight <float32>[G, E, C]).
  """
  num_groups = tf.shape(choices)[0]
  group_size = choices.shape[1]
  num_slots = num_groups * num_experts * capacity
  group = tf.range(num_groups)[:, tf.newaxis, tf.newaxis]
  kept = positions >= 0
  slot = tf.where(kept, (group * num_experts + choices) * capacity + positions,
                  num_slots)  # trash segment for choices not dispatched
  token = tf.broadcast_to(
      tf.range(1, group_size + 1)[tf.newaxis, :, tf.newaxis],
      tf.shape(choices))
  slot = tf.reshape(slot, [-1])
  shape = tf.stack([num_groups, num_experts, capacity])
  slot_token = tf.math.unsorted_segment_sum(
      tf.reshape(tf.where(kept, token, 0), [-1]), slot, num_slots + 1)
  slot_token = tf.reshape(slot_token[:-1], shape) - 1
  slot_token = tf.where(slot_token < 0, group_size, slot_token)
  slot_weight = tf.math.unsorted_segment_sum(
      tf.reshape(weights, [-1]), slot, num_slots + 1)
  return slot_token, tf.reshape(slot_weight[:-1], shape)


def priority_order(scores: tf.Tensor, mask: tf.Tensor) -> tf.Tensor:
  """Batch-prioritized routing's token order within each group (V-MoE).

  Args:
    scores: <float32>[G, S, E] the unbiased router probabilities.
    mask: <float32>[G, S] 1 for real tokens.

  Returns:
    <int32>[G, S] tokens by descending largest probability, ties in token
    order; padding (which requests nothing) last.
  """
  priority = tf.where(mask > 0, tf.reduce_max(scores, axis=-1), -1.0)
  return tf.argsort(-priority, axis=1, stable=True)


def place_in_order(order: tf.Tensor | None, choices: tf.Tensor,
                    requested: tf.Tensor, attempted: tf.Tensor, *,
                    num_experts: int, capacity: int | tf.Tensor,
                    candidates: tf.Tensor | None,
                    one_device: bool = False) -> tuple[tf.Tensor, ...]:
  """:func:`place` with the tokens of each group taken in ``order``.

  Args:
    order: <int32>[G, S] the order tokens request positions in (a
      permutation per group), or None for token order.
    choices, requested, attempted, candidates, num_experts, capacity,
      one_device: as for :func:`place` (every per-token tensor
      <[G, S, ...]>).

  Returns:
    (choices, positions, kept) of :func:`place`, in token order.
  """
  if order is None:
    return place(choices, requested, attempted, num_experts=num_experts,
                  capacity=capacity, candidates=candidates,
                  one_device=one_device)
  def permute(t, index):
    return None if t is None else tf.gather(t, index, batch_dims=1)
  placed = place(permute(choices, order), permute(requested, order),
                  permute(attempted, order), num_experts=num_experts,
                  capacity=capacity, candidates=permute(candidates, order),
                  one_device=one_device)
  inverse = tf.argsort(order, axis=1, stable=True)
  return tuple(permute(t, inverse) for t in placed)
