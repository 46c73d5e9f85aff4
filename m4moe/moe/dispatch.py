"""Dispatch tokens to expert buffers and combine the expert outputs.

Dimensions (letters of the glossary in :mod:`m4moe`):

  G: groups; S: group size; E: experts; C: expert capacity; M: model width;
  H: expert hidden width; K: expert choices per token; T = G*S*K: choices;
  X: expert-homogeneous blocks; R: rows per block; P: rows of a gathered
  table (E*G*C buffer rows, or T sorted rows).

Five dispatch paths with identical outputs and gradients, registered by name
in :data:`DISPATCH_PATHS` with one signature (:class:`DispatchPath`:
``path(x, routing, experts, *, training, seed)``). ``--dispatch`` exposes
three of them, ``einsum``, ``index`` and ``sorted``
(:data:`m4moe.config.DISPATCH_IMPLEMENTATIONS`); the other two are chosen
for a call, never requested: ``grouped_index`` on a mesh and ``block`` for
few tokens with a large capacity. :func:`resolve_dispatch` decides, in one
place, which path a layer call runs (backend x router x training x config x
static sizes); ``docs/design/dispatch.md`` tables the same vocabulary:

* :func:`einsum_dispatch_combine` (``einsum``) -- GShard Algorithm 2 as
  written: one-hot ``dispatch_mask`` and ``combine_weights``
  ``<[G, S, E, C]>`` and the einsums ``GSEC,GSM->EGCM`` (dispatch),
  ``EGCM,EMH->EGCH`` and ``EGCH,EHM->GECM`` (the experts) and
  ``GSEC,GECM->GSM`` (combine). Memory O(G*S*E*C*M) intermediates; the form
  the paper's sharding annotations are written for.

* :func:`index_dispatch_combine` (``index``) -- row gathers driven by the
  two views of the routing, slot -> token (``RoutingResult.slots()``,
  ``[G, E, C]``) and token -> slots (``expert_index``/``buffer_position``,
  ``[G, S, K]``): the dispatch gathers token rows into the buffers and the
  combine gathers each token's K expert-output rows; custom gradients use
  the inverse map, so the backward pass is gathers too, never a scatter. No
  ``[G, S, E, C]`` tensor is built; memory is O(G*E*C*M) =
  O(capacity_factor * K * G*S*M). Static shapes and int32 indices only, so
  it compiles under XLA (``jit_compile=True``).

* :func:`grouped_index_dispatch_combine` (``grouped_index``, chosen on a
  mesh for ``index`` and ``sorted``) -- the index path's gathers batched
  over G with in-group indices (the slot view from a per-group sort, not a
  scatter into the flattened slots), so each device gathers within its own
  groups; autodiff gradients. Token-choice routers only.

* :func:`sorted_dispatch_combine` (``sorted``) -- no capacity padding in
  the expert matmuls: the T = G*S*K choices of all groups are sorted by
  expert into one ``[T, M]`` table (the dispatched choices first, expert by
  expert, then the dropped ones), and each expert multiplies only its own
  rows, whose count is known only at run time (a :class:`RowsFn`). The
  gathers are those of the index path with the sorted table in place of the
  buffers, so the backward pass is gathers too. Same capacity and drops as
  the buffers (the router decides them); useful rows only, so the expert
  FLOPs are the dense FFN's. Dynamic shapes: for graph/eager execution, not
  ``jit_compile`` (XLA needs static shapes; use ``index`` there).

* :func:`block_dispatch_combine` (``block``) -- for a small token count with
  a large capacity (the no-drop eval capacity C = S makes the buffers E*S
  rows per group, E/K times the useful rows; decoding's one-token groups
  have C = 1, E buffer rows for K choices). The
  T = G*S*K choices are sorted by expert into rows padded per expert to a
  multiple of a block size R; each of the X blocks of R rows belongs to one
  expert, whose weights are gathered per block (a :class:`BlockFn`). Rows:
  at most T + E*(R-1), so the cost grows with S*K, not E*C. Same outputs as
  the buffer paths (each row meets the same weights). Static shapes, int32
  only; no expert dropout.

The first two call an :class:`ExpertFn` on the dispatched buffers
``<activation dtype>[E, G, C, M]``, ``sorted`` a :class:`RowsFn` and
``block`` a :class:`BlockFn`: the three entry points of :class:`Experts`.
Empty slots hold zero rows; experts without biases map them to zero, and
they are never combined anyway.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Protocol

import tensorflow as tf

from m4moe.config import DISPATCH_IMPLEMENTATIONS
from m4moe.moe.routing import RoutingResult


class ExpertFn(Protocol):
  """The experts: ``[E, G, C, M]`` buffers in, outputs in ``output_layout``."""

  def __call__(self, dispatched: tf.Tensor, *, output_layout: str) -> tf.Tensor:
    """Runs expert e on ``dispatched[e]``.

    Args:
      dispatched: <dtype>[E, G, C, M] expert input buffers.
      output_layout: "EGCM" or "GECM", the axis order of the result.

    Returns:
      <dtype>[E, G, C, M] or <dtype>[G, E, C, M] expert outputs.
    """


def einsum_dispatch_combine(x: tf.Tensor, routing: RoutingResult,
                            expert_fn: ExpertFn) -> tf.Tensor:
  """Algorithm 2 with one-hot einsums.

  Args:
    x: <dtype>[G, S, M] tokens (dtype = activation dtype).
    routing: the router's result for these groups.
    expert_fn: the experts.

  Returns:
    <dtype>[G, S, M] combined expert outputs (0 for tokens with no slot).
  """
  dispatch_mask = tf.cast(routing.dispatch_mask(), x.dtype)
  combine_weights = tf.cast(routing.combine_array(), x.dtype)
  dispatched = tf.einsum("GSEC,GSM->EGCM", dispatch_mask, x)
  expert_outputs = expert_fn(dispatched, output_layout="GECM")
  return tf.einsum("GSEC,GECM->GSM", combine_weights, expert_outputs)


def _buffer_rows(routing: RoutingResult, *, num_groups: tf.Tensor,
                 group_size: int) -> tuple[tf.Tensor, tf.Tensor]:
  """Slot -> token and slot weight, in the flattened EGC buffer order.

  Returns:
    (rows <int32>[E, G, C]: row of ``[x; 0] <[G*S + 1, M]>`` each slot reads,
     G*S for an empty slot;
     weight <float32>[E, G, C]: the combine weight of the slot's token).
  """
  slot_token, slot_weight = routing.slots()
  slot_token = tf.transpose(slot_token, [1, 0, 2])  # [E, G, C]
  group = tf.range(num_groups)[tf.newaxis, :, tf.newaxis]
  rows = tf.where(slot_token < group_size, group * group_size + slot_token,
                  num_groups * group_size)
  return rows, tf.transpose(slot_weight, [1, 0, 2])


def _token_slots(routing: RoutingResult, *,
                 num_groups: tf.Tensor) -> tf.Tensor:
  """Token -> its K slots: <int32>[G*S, K] rows of the flattened EGC buffers.

  Row ``(e * G + g) * C + c`` for a choice dispatched to expert e at buffer
  position c; E*G*C (one past the last row) for a dropped choice.
  """
  num_experts, capacity = routing.num_experts, routing.capacity
  group = tf.range(num_groups)[:, tf.newaxis, tf.newaxis]
  kept = routing.buffer_position >= 0
  slots = tf.where(
      kept, (routing.expert_index * num_groups + group) * capacity +
      routing.buffer_position, num_experts * num_groups * capacity)
  return tf.reshape(slots, [-1, routing.expert_index.shape[-1]])


def _with_zero_row(rows: tf.Tensor) -> tf.Tensor:
  """<dtype>[P + 1, M]: ``rows`` <dtype>[P, M] and a zero row at index P."""
  return tf.concat([rows, tf.zeros_like(rows[:1])], axis=0)


def _table(rows: tf.Tensor, *, zero_row: bool) -> tf.Tensor:
  """``rows`` <dtype>[P, M], with a zero row at index P if ``zero_row``."""
  return _with_zero_row(rows) if zero_row else rows


def _make_gather_dispatch(*, zero_row: bool):
  """The dispatch gather; ``zero_row``: indices P and N read a zero row.

  Without the zero rows every index must be a real row: the sorted path,
  whose rows are a permutation of all T choices (a dropped choice's row is
  one the experts map to zero), so the two [P + 1, M] copies per layer are
  not needed.
  """
  @tf.custom_gradient
  def gather_dispatch(tokens: tf.Tensor, slot_rows: tf.Tensor,
                      token_slots: tf.Tensor):
    """Buffer rows from token rows; the gradient is a gather too.

    Args:
      tokens: <dtype>[N, M] token rows (N = G*S).
      slot_rows: <int32>[P] token row each buffer row reads (N: zero row).
      token_slots: <int32>[N, K] buffer rows of each token (P: dropped), the
        inverse map.

    Returns:
      <dtype>[P, M] buffer rows.
    """
    def grad(d_rows):
      # Each token receives the gradients of its (at most K) buffer rows.
      d_tokens = tf.reduce_sum(
          tf.gather(_table(d_rows, zero_row=zero_row), token_slots), axis=1)
      return d_tokens, None, None
    return tf.gather(_table(tokens, zero_row=zero_row), slot_rows), grad
  return gather_dispatch


def _make_gather_combine(*, zero_row: bool):
  """The combine gather; ``zero_row`` as for :func:`_make_gather_dispatch`."""
  @tf.custom_gradient
  def gather_combine(expert_rows: tf.Tensor, weights: tf.Tensor,
                     token_slots: tf.Tensor, slot_rows: tf.Tensor,
                     slot_weights: tf.Tensor):
    """Weighted sum of each token's K expert-output rows; gather-only grad.

    Args:
      expert_rows: <dtype>[P, M] flattened expert outputs.
      weights: <dtype>[N, K] combine weights (differentiable: router grads).
      token_slots: <int32>[N, K] buffer row of each choice (P: dropped).
      slot_rows: <int32>[P] token of each buffer row (N: empty), the inverse.
      slot_weights: <dtype>[P] ``weights`` of each buffer row's choice (0 for
        empty rows); a constant view of ``weights`` used by the gradient.

    Returns:
      <dtype>[N, M] combined outputs.
    """
    picked = tf.gather(_table(expert_rows, zero_row=zero_row),
                       token_slots)  # [N, K, M]
    # The weighted sums over K as batched [1, K] x [K, M] products (and
    # [K, M] x [M, 1] in the gradient): one op each instead of a product
    # and a reduction over the [N, K, M] rows (~20% less time for both
    # passes at K = 8; the sums' order may differ: float rounding).
    combined = tf.squeeze(
        tf.matmul(tf.expand_dims(weights, 1), picked), axis=1)

    def grad(d_combined):
      d_weights = tf.squeeze(
          tf.matmul(picked, tf.expand_dims(d_combined, -1)), axis=-1)
      d_rows = (tf.gather(_table(d_combined, zero_row=zero_row), slot_rows) *
                tf.expand_dims(slot_weights, -1))
      return d_rows, d_weights, None, None, None
    return combined, grad
  return gather_combine


_gather_dispatch = _make_gather_dispatch(zero_row=True)
_gather_combine = _make_gather_combine(zero_row=True)
# Every index a real row (the sorted path's permutation of the T choices).
_permuted_dispatch = _make_gather_dispatch(zero_row=False)
_permuted_combine = _make_gather_combine(zero_row=False)


def index_dispatch_combine(x: tf.Tensor, routing: RoutingResult,
                           expert_fn: ExpertFn) -> tf.Tensor:
  """Gathers into the buffers and back; same result as the einsums.

  With the per-token routing view (token-choice routers) every step, forward
  and backward, is a row gather: the dispatch reads ``[x; 0]`` at each
  slot's token and its gradient reads the buffer gradients at each token's
  K slots; the combine reads each token's K expert-output rows and its
  gradient reads the output gradient at each slot's token (XLA:CPU runs
  scatters, what plain autodiff of a gather gives, serially). Without it
  (expert choice: only the slot view) the combine is a scatter-add.

  Args:
    x: <dtype>[G, S, M] tokens (dtype = activation dtype).
    routing: the router's result for these groups.
    expert_fn: the experts.

  Returns:
    <dtype>[G, S, M] combined expert outputs (0 for tokens with no slot).
  """
  num_groups = tf.shape(x)[0]
  group_size, model_dim = x.shape[1], x.shape[2]
  num_tokens = num_groups * group_size
  rows, slot_weight = _buffer_rows(routing, num_groups=num_groups,
                                   group_size=group_size)
  tokens = tf.reshape(x, [-1, model_dim])
  flat_rows = tf.reshape(rows, [-1])
  slot_weight = tf.cast(tf.reshape(slot_weight, [-1]), x.dtype)
  if routing.expert_index is not None:
    token_slots = _token_slots(routing, num_groups=num_groups)
    dispatched = tf.reshape(_gather_dispatch(tokens, flat_rows, token_slots),
                            tf.concat([tf.shape(rows), [model_dim]], 0))
    expert_outputs = expert_fn(dispatched, output_layout="EGCM")
    weights = tf.cast(tf.reshape(routing.combine_weights,
                                 tf.shape(token_slots)), x.dtype)
    combined = _gather_combine(
        tf.reshape(expert_outputs, [-1, model_dim]), weights, token_slots,
        flat_rows, tf.stop_gradient(slot_weight))
    return tf.reshape(combined, tf.shape(x))
  dispatched = tf.gather(_with_zero_row(tokens), rows)  # [E, G, C, M]
  expert_outputs = expert_fn(dispatched, output_layout="EGCM")
  weighted = tf.reshape(expert_outputs, [-1, model_dim]) * tf.expand_dims(
      slot_weight, -1)
  # scatter_nd adds rows sharing an index; the last row collects the empty
  # slots. Faster than unsorted_segment_sum on CPU.
  combined = tf.scatter_nd(tf.reshape(flat_rows, [-1, 1]), weighted,
                           tf.stack([num_tokens + 1, model_dim]))
  return tf.reshape(combined[:-1], tf.shape(x))


def _group_slot_tokens(routing: RoutingResult) -> tuple[tf.Tensor, tf.Tensor]:
  """The slot -> token view of each group, computed within the group.

  Every op is batched over G with in-group indices (a stable sort of the
  group's choice keys and slot ids, its inverse, batched gathers), so a
  G-split tensor stays G-split: no index reaches into another group, unlike
  :func:`_buffer_rows` and the router's slot view, which index the flattened
  ``[G*E*C]`` slots. A choice's key is ``e * C + c``; in the sorted
  concatenation of ``2 * key`` (choices) and ``2 * j + 1`` (slot j) the
  choice that fills slot j, if any, sits just before it.

  Args:
    routing: a token-choice result (``expert_index`` <int32>[G, S, K],
      ``buffer_position`` <int32>[G, S, K], -1 if dropped).

  Returns:
    (slot_token <int32>[G, E*C]: the in-group token of each slot, S if empty;
     choice_slot <int32>[G, S*K]: the slot of each choice, E*C if dropped).
  """
  num_slots = routing.num_experts * routing.capacity
  group_size, num_selected = routing.expert_index.shape[1:]
  choices = group_size * num_selected
  choice_slot = tf.reshape(
      tf.where(routing.buffer_position >= 0,
               routing.expert_index * routing.capacity +
               routing.buffer_position, num_slots), [-1, choices])
  # Slot ids <[G, E*C]> made from a G-shaped tensor, so that under DTensor
  # they carry its layout (a plain tf.range is not auto-broadcast eagerly).
  slots = tf.cumsum(tf.tile(tf.ones_like(choice_slot[:, :1]), [1, num_slots]),
                    axis=1, exclusive=True)
  keys = tf.concat([2 * choice_slot, 2 * slots + 1], axis=1)
  order = tf.argsort(keys, axis=-1, stable=True)
  rank = tf.argsort(order, axis=-1, stable=True)  # Inverse permutation.
  slot_rank = rank[:, choices:]
  before = tf.gather(order, tf.maximum(slot_rank - 1, 0), batch_dims=1)
  filled = (slot_rank > 0) & tf.equal(tf.gather(keys, before, batch_dims=1),
                                      2 * slots)
  return tf.where(filled, before // num_selected, group_size), choice_slot


def grouped_index_dispatch_combine(x: tf.Tensor, routing: RoutingResult,
                                   expert_fn: ExpertFn) -> tf.Tensor:
  """The index path's gathers, batched per group (GShard §3.2's Gather form).

  Same values and gradients as :func:`index_dispatch_combine`, but every
  gather is batched over G with in-group indices
  (:func:`_group_slot_tokens`): the dispatch reads each group's
  ``[x_g; 0]`` at its slots' tokens, the combine each group's ``[out_g; 0]``
  at its tokens' K slots; autodiff's gradients are batched over G too. So
  with G split over the batch axis of a mesh, each device gathers only its
  own groups' rows and the only communication is the buffers' relayout to
  the E split and back (an AllToAll on ``expert:D``). Memory O(G*E*C*M) and
  O(G*S*K*M), no ``[G, S, E, C]`` tensor. Token-choice routers only (the
  per-token view).

  Args:
    x: <dtype>[G, S, M] tokens (dtype = activation dtype).
    routing: a token-choice router's result for these groups.
    expert_fn: the experts.

  Returns:
    <dtype>[G, S, M] combined expert outputs (0 for tokens with no slot).

  Raises:
    ValueError: ``routing`` has no per-token view (expert choice).
  """
  if routing.expert_index is None:
    raise ValueError("the grouped index dispatch needs a token-choice router "
                     "(per-token expert_index); expert choice uses einsum")
  num_groups = tf.shape(x)[0]
  group_size, model_dim = x.shape[1], x.shape[2]
  num_experts, capacity = routing.num_experts, routing.capacity
  num_selected = routing.expert_index.shape[-1]
  slot_token, choice_slot = _group_slot_tokens(routing)
  padded = tf.concat([x, tf.zeros_like(x[:, :1, :])], axis=1)  # [G, S+1, M]
  dispatched = tf.gather(padded, slot_token, batch_dims=1)  # [G, E*C, M]
  dispatched = tf.transpose(
      tf.reshape(dispatched, [num_groups, num_experts, capacity, model_dim]),
      [1, 0, 2, 3])  # [E, G, C, M]
  outputs = expert_fn(dispatched, output_layout="GECM")  # [G, E, C, M]
  outputs = tf.reshape(outputs,
                       [num_groups, num_experts * capacity, model_dim])
  outputs = tf.concat([outputs, tf.zeros_like(outputs[:, :1, :])], axis=1)
  picked = tf.reshape(tf.gather(outputs, choice_slot, batch_dims=1),
                      [num_groups, group_size, num_selected, model_dim])
  weights = tf.cast(routing.combine_weights, x.dtype)
  return tf.reduce_sum(picked * tf.expand_dims(weights, -1), axis=2)


class RowsFn(Protocol):
  """The experts on expert-sorted rows of dynamic per-expert counts."""

  def __call__(self, rows: tf.Tensor, counts: tf.Tensor, *,
               row_slots: tf.Tensor, buffer_shape: tf.Tensor) -> tf.Tensor:
    """Runs expert e on its ``counts[e]`` rows.

    Args:
      rows: <dtype>[T, M] rows sorted by expert: expert 0's ``counts[0]``
        rows first, then expert 1's, ...; the ``T - sum(counts)`` rows after
        them are not dispatched.
      counts: <int32>[E] rows of each expert.
      row_slots: <int32>[T] each dispatched row's slot in the flattened
        ``[E, G, C]`` buffers of the other paths (0 past ``sum(counts)``):
        randomness drawn per buffer slot (expert dropout) and gathered by it
        equals theirs.
      buffer_shape: <int32>[3], (E, G, C).

    Returns:
      <dtype>[T, M] outputs; zeros for the rows not dispatched, which must
      get no gradient either (the combine reads them for dropped choices,
      with weight 0, instead of a zero row).
    """


def _slot_order_rows(slots: tf.Tensor, *, num_slots: int | tf.Tensor,
                     num_experts: int) -> tuple[tf.Tensor, tf.Tensor]:
  """Each choice's row in the expert-sorted table, without a sort.

  The table lists the dispatched choices in the flattened ``[E, G, C]``
  buffer-slot order (expert by expert, then group, then position), then
  the dropped ones in choice order. A dispatched choice's row is the
  number of occupied slots before its own: a count of the occupied slots
  and a cumulative sum over them (linear in E*G*C), where a stable sort of
  the T choices by expert cost about as much as the router's top-k.

  Args:
    slots: <int32>[T] each choice's buffer slot ``(e * G + g) * C + c``;
      ``num_slots`` for a dropped choice (:func:`_token_slots`).
    num_slots: E*G*C.
    num_experts: E.

  Returns:
    (row <int32>[T]: the table row of each choice, a permutation;
     counts <int32>[E + 1]: rows of each expert, then the dropped ones).
  """
  occupied = tf.math.bincount(slots, minlength=num_slots + 1,
                              maxlength=num_slots + 1, dtype=tf.int32)
  before = tf.cumsum(occupied, exclusive=True)  # [E*G*C + 1]
  dispatched = slots < num_slots
  dropped_row = before[-1] + tf.cumsum(
      tf.cast(tf.logical_not(dispatched), tf.int32), exclusive=True)
  row = tf.where(dispatched, tf.gather(before, slots), dropped_row)
  counts = tf.reduce_sum(
      tf.reshape(occupied[:-1], [num_experts, -1]), axis=1)
  return row, tf.concat([counts, occupied[-1:]], axis=0)


def sorted_dispatch_combine(x: tf.Tensor, routing: RoutingResult,
                            rows_fn: RowsFn) -> tf.Tensor:
  """Expert-sorted rows without padding; same result as the buffers.

  Args:
    x: <dtype>[G, S, M] tokens (dtype = activation dtype).
    routing: a token-choice router's result (per-token view).
    rows_fn: the experts on sorted rows.

  Returns:
    <dtype>[G, S, M] combined expert outputs (0 for tokens with no slot).
  """
  if routing.expert_index is None:
    raise ValueError("sorted dispatch needs a token-choice router (top1, "
                     "top2, topk); use --dispatch=index with expert_choice")
  model_dim = x.shape[2]
  num_k = routing.expert_index.shape[-1]
  num_experts = routing.num_experts
  tokens = tf.reshape(x, [-1, model_dim])  # [N, M]
  num_groups = tf.shape(x)[0]
  num_slots = num_experts * num_groups * routing.capacity
  buffer_slot = tf.reshape(_token_slots(routing, num_groups=num_groups), [-1])
  choice_row, counts = _slot_order_rows(buffer_slot, num_slots=num_slots,
                                        num_experts=num_experts)
  order = tf.math.invert_permutation(choice_row)  # the choice in each row
  # Every row holds one choice and every choice one row: row -> token and
  # choice -> row are a permutation's two directions, so the gathers need
  # no zero rows. A dropped choice's row is past sum(counts): the experts
  # map it to zero (and pass it no gradient), its combine weight is 0.
  row_token = order // num_k
  token_rows = tf.reshape(choice_row, [-1, num_k])
  weights = tf.cast(tf.reshape(routing.combine_weights, [-1, num_k]), x.dtype)
  row_weight = tf.gather(tf.reshape(weights, [-1]), order)
  row_slot = tf.gather(buffer_slot, order)
  row_slots = tf.where(row_slot < num_slots, row_slot, 0)
  dispatched = _permuted_dispatch(tokens, row_token, token_rows)  # [T, M]
  outputs = rows_fn(dispatched, counts[:num_experts], row_slots=row_slots,
                    buffer_shape=tf.stack([num_experts, num_groups,
                                           routing.capacity]))
  combined = _permuted_combine(outputs, weights, token_rows, row_token,
                               tf.stop_gradient(row_weight))
  return tf.reshape(combined, tf.shape(x))


def dispatched_assignments(routing: RoutingResult) -> tf.Tensor:
  """<float32>[] (token, expert) assignments the experts actually compute.

  Every path computes one expert row per dispatched choice: token-choice
  routers' choices with a buffer position (after the second-expert policy's
  skips, capacity drops and No-Token-Left-Behind moves), expert choice's
  filled slots. Padding tokens are never dispatched. The buffer paths
  (``index``, ``einsum``) also multiply their empty slots; those are not
  counted here (:func:`m4moe.cost.model.estimate_device` counts them).
  """
  if routing.expert_index is not None:
    kept = routing.buffer_position >= 0
  else:
    kept = routing.slot_token < routing.group_size
  return tf.reduce_sum(tf.cast(kept, tf.float32))


class BlockFn(Protocol):
  """The experts on expert-homogeneous blocks of rows."""

  def __call__(self, blocks: tf.Tensor, block_expert: tf.Tensor) -> tf.Tensor:
    """<dtype>[X, R, M] rows, <int32>[X] expert of each block -> outputs."""


def block_layout(*, num_choices: int, num_experts: int) -> tuple[int, int]:
  """(block size R, number of blocks X) for T = ``num_choices`` choices.

  R = ceil(T / (2E)) balances the padding rows (at most E*(R-1)) against the
  number of per-block weight gathers; X = ceil((T + E*(R-1)) / R) blocks
  hold any assignment of the T choices.
  """
  block = max(1, -(-num_choices // (2 * num_experts)))
  rows = num_choices + num_experts * (block - 1)
  return block, -(-rows // block)


def block_rows_are_fewer(*, num_choices: int, num_experts: int,
                         buffer_rows: int) -> bool:
  """True if the block layout has fewer rows than the E*G*C buffers."""
  block, num_blocks = block_layout(num_choices=num_choices,
                                   num_experts=num_experts)
  return block * num_blocks < buffer_rows


def _sorted_rows(expert: tf.Tensor, kept: tf.Tensor, *, num_experts: int,
                 block: int, num_rows: int) -> tuple[tf.Tensor, tf.Tensor]:
  """Row of each choice in the expert-sorted, block-padded layout.

  Args:
    expert: <int32>[T] expert of each choice; kept: <bool>[T] dispatched.
    num_experts: E; block: R; num_rows: X*R.

  Returns:
    (row <int32>[T] (``num_rows`` for choices not dispatched),
     block_expert <int32>[X] expert of each block (E-1 past the last one)).
  """
  one_hot = tf.one_hot(tf.where(kept, expert, num_experts), num_experts + 1,
                       dtype=tf.int32)[:, :num_experts]  # [T, E]
  counts = tf.reduce_sum(one_hot, axis=0)
  padded = (counts + block - 1) // block * block
  end = tf.cumsum(padded)
  start = end - padded
  rank = tf.reduce_sum(tf.cumsum(one_hot, axis=0, exclusive=True) * one_hot,
                       axis=1)
  row = tf.where(kept, tf.gather(start, tf.minimum(expert, num_experts - 1)) +
                 rank, num_rows)
  block_start = tf.range(0, num_rows, block)
  block_expert = tf.reduce_sum(tf.cast(
      end[tf.newaxis, :] <= block_start[:, tf.newaxis], tf.int32), axis=1)
  return row, tf.minimum(block_expert, num_experts - 1)


def block_dispatch_combine(x: tf.Tensor, routing: RoutingResult,
                           block_fn: BlockFn) -> tf.Tensor:
  """Expert-sorted blocks: cost O(S*K) rows; same result as the buffers.

  Args:
    x: <dtype>[G, S, M] tokens, G static.
    routing: a token-choice router's result (per-token view).
    block_fn: the experts on blocks.

  Returns:
    <dtype>[G, S, M] combined expert outputs (0 for tokens with no slot).
  """
  num_groups, group_size, model_dim = x.shape
  num_experts = routing.num_experts
  num_k = routing.expert_index.shape[-1]
  num_choices = num_groups * group_size * num_k
  block, num_blocks = block_layout(num_choices=num_choices,
                                   num_experts=num_experts)
  num_rows = block * num_blocks
  row, block_expert = _sorted_rows(
      tf.reshape(routing.expert_index, [-1]),
      tf.reshape(routing.buffer_position >= 0, [-1]),
      num_experts=num_experts, block=block, num_rows=num_rows)
  token = tf.repeat(tf.range(num_groups * group_size), num_k)  # [T]
  # Token of each row (T: empty row, the zero row of the table).
  row_token = tf.math.unsorted_segment_min(token, row, num_rows + 1)
  row_token = tf.minimum(row_token[:-1], num_choices // num_k)
  table = tf.concat([tf.reshape(x, [-1, model_dim]),
                     tf.zeros([1, model_dim], x.dtype)], axis=0)
  blocks = tf.reshape(tf.gather(table, row_token),
                      [num_blocks, block, model_dim])
  outputs = tf.reshape(block_fn(blocks, block_expert), [num_rows, model_dim])
  outputs = tf.concat([outputs, tf.zeros([1, model_dim], x.dtype)], axis=0)
  weight = tf.cast(tf.reshape(routing.combine_weights, [-1, 1]), x.dtype)
  per_choice = tf.gather(outputs, row) * weight  # [T, M]
  return tf.reduce_sum(tf.reshape(per_choice, [num_groups, group_size, num_k,
                                               model_dim]), axis=2)


class Experts(Protocol):
  """The experts as the dispatch paths run them: one entry point per layout.

  :class:`m4moe.moe.layer.FeedForwardExperts` implements it. Each entry
  applies the same weights (and, with ``training``, the same expert-dropout
  masks, drawn over the ``[E, G, C, H]`` buffers from ``seed``).
  """

  def __call__(self, dispatched: tf.Tensor, *, output_layout: str,
               training: bool, seed: tf.Tensor | None) -> tf.Tensor:
    """<dtype>[E, G, C, M] buffers -> outputs in ``output_layout``."""

  def rows(self, rows: tf.Tensor, counts: tf.Tensor, *,
           row_slots: tf.Tensor | None, buffer_shape: tf.Tensor | None,
           training: bool, seed: tf.Tensor | None) -> tf.Tensor:
    """<dtype>[T, M] expert-sorted rows, <int32>[E] counts -> <dtype>[T, M]."""

  def blocks(self, blocks: tf.Tensor, block_expert: tf.Tensor, *,
             training: bool, seed: tf.Tensor | None) -> tf.Tensor:
    """<dtype>[X, R, M] blocks, <int32>[X] experts -> <dtype>[X, R, M]."""


class DispatchPath(Protocol):
  """One dispatch implementation, as registered in :data:`DISPATCH_PATHS`."""

  def __call__(self, x: tf.Tensor, routing: RoutingResult, experts: Experts,
               *, training: bool, seed: tf.Tensor | None) -> tf.Tensor:
    """Dispatches ``x`` to ``experts`` and combines their outputs.

    Args:
      x: <dtype>[G, S, M] tokens (dtype = activation dtype).
      routing: the router's result for these groups.
      experts: the experts (their dropout applies when ``training``).
      training: training mode (expert dropout).
      seed: <int32>[2] for expert dropout, or None.

    Returns:
      <dtype>[G, S, M] combined expert outputs (0 for tokens with no slot).
    """


def _einsum_path(x: tf.Tensor, routing: RoutingResult, experts: Experts, *,
                 training: bool, seed: tf.Tensor | None) -> tf.Tensor:
  return einsum_dispatch_combine(
      x, routing, functools.partial(experts, training=training, seed=seed))


def _index_path(x: tf.Tensor, routing: RoutingResult, experts: Experts, *,
                training: bool, seed: tf.Tensor | None) -> tf.Tensor:
  return index_dispatch_combine(
      x, routing, functools.partial(experts, training=training, seed=seed))


def _grouped_index_path(x: tf.Tensor, routing: RoutingResult,
                        experts: Experts, *, training: bool,
                        seed: tf.Tensor | None) -> tf.Tensor:
  return grouped_index_dispatch_combine(
      x, routing, functools.partial(experts, training=training, seed=seed))


def _sorted_path(x: tf.Tensor, routing: RoutingResult, experts: Experts, *,
                 training: bool, seed: tf.Tensor | None) -> tf.Tensor:
  return sorted_dispatch_combine(
      x, routing,
      functools.partial(experts.rows, training=training, seed=seed))


def _block_path(x: tf.Tensor, routing: RoutingResult, experts: Experts, *,
                training: bool, seed: tf.Tensor | None) -> tf.Tensor:
  return block_dispatch_combine(
      x, routing,
      functools.partial(experts.blocks, training=training, seed=seed))


# Every dispatch implementation, by name. The first three are the values of
# ``--dispatch`` (:data:`m4moe.config.DISPATCH_IMPLEMENTATIONS`); "block" and
# "grouped_index" are chosen by :func:`resolve_dispatch` only.
DISPATCH_PATHS: dict[str, DispatchPath] = {
    "einsum": _einsum_path,
    "index": _index_path,
    "sorted": _sorted_path,
    "block": _block_path,
    "grouped_index": _grouped_index_path,
}


@dataclasses.dataclass(frozen=True)
class BufferLayout:
  """Static sizes of one layer call, for the block-vs-buffers decision.

  Attributes:
    num_groups: G, or None when it is only known at run time.
    group_size: S.
    num_selected: K, choices per token; None for a router without the
      per-token view (expert choice).
    num_experts: E.
    capacity: C.
  """

  num_groups: int | None
  group_size: int
  num_selected: int | None
  num_experts: int
  capacity: int

  def __post_init__(self):
    for name, least in (("group_size", 1), ("num_experts", 1),
                        ("capacity", 0)):
      if getattr(self, name) < least:
        raise ValueError(f"BufferLayout.{name}={getattr(self, name)} must be "
                         f">= {least}; pass the call's static sizes")


def resolve_dispatch(*, requested: str, backend: str, router: str,
                     training: bool, expert_dropout_rate: float,
                     layout: BufferLayout | None = None,
                     activation_dtype: str = "float32") -> str:
  """The dispatch path (a key of :data:`DISPATCH_PATHS`) a layer runs.

  The one place the choice is made, in this order:

  1. On a mesh, ``index`` and ``sorted`` with a token-choice router
     become ``grouped_index``, and
  2. on a DTensor mesh everything else becomes ``einsum``
     (:func:`_mesh_dispatch` says why).
  3. ``sorted`` becomes its static-shape equivalent ``index`` under the XLA
     backend (dynamic per-expert row counts do not compile; only the
     expert-choice router gets here) and with the expert-choice router (no
     per-token view to sort); under the XLA backend that ``index`` computes
     the same values but is not partitioned per group (see
     :func:`_mesh_dispatch`). It does so too with bfloat16 activations:
     oneDNN builds a bfloat16 matmul for every new row count, and the
     per-expert counts change with every batch, so the sorted rows' matmuls
     cost more than the capacity buffers' static ones (the fine-grained
     training step ran 2.2x slower; ``results/benchmarks/
     sparse-step-cost.md``).
  4. ``index`` becomes ``block`` where :func:`_block_is_cheaper`.
  5. Otherwise ``requested``.

  Args:
    requested: ``--dispatch``, one of
      :data:`m4moe.config.DISPATCH_IMPLEMENTATIONS`.
    backend: the sharding backend (:data:`m4moe.parallel.sharding.BACKENDS`).
    router: ``--router`` (top2, top1, noisy_topk, expert_choice).
    training: training mode.
    expert_dropout_rate: ``--expert_dropout_rate``.
    layout: the call's static sizes; None decides without them (never
      ``block``).
    activation_dtype: ``--activation_dtype`` (float32 or bfloat16).

  Returns:
    "einsum", "index", "sorted", "block" or "grouped_index".

  Raises:
    ValueError: ``requested`` is not a ``--dispatch`` value.
  """
  if requested not in DISPATCH_IMPLEMENTATIONS:
    raise ValueError(f"dispatch implementation {requested!r} unknown; use "
                     f"--dispatch={' or '.join(DISPATCH_IMPLEMENTATIONS)}")
  on_mesh = _mesh_dispatch(requested=requested, backend=backend, router=router)
  if on_mesh is not None:
    return on_mesh
  if requested == "sorted" and (backend == "xla" or
                                router == "expert_choice" or
                                activation_dtype == "bfloat16"):
    return "index"
  if requested == "index" and _block_is_cheaper(
      backend=backend, training=training,
      expert_dropout_rate=expert_dropout_rate, layout=layout):
    return "block"
  return requested


def _mesh_dispatch(*, requested: str, backend: str,
                   router: str) -> str | None:
  """The path a mesh forces, or None where the one-device rules apply.

  1. On a mesh (DTensor or XLA backend), ``index`` and ``sorted`` with a
     token-choice router become ``grouped_index``
     (:func:`grouped_index_dispatch_combine`: GShard §3.2's Gather form,
     every gather batched over G with in-group indices, so it stays within
     each device's groups). The one-device ``index`` path cannot be
     partitioned: its tables index the flattened ``[G*S]`` tokens and
     ``[E*G*C]`` buffers (``_buffer_rows``, ``_token_slots``, the router's
     slot view scatters into the flattened ``[G*E*C]`` slots), which no
     partitioner keeps within a shard of G (DTensor, TF 2.21, refuses its
     ``[G, E, C] -> [E, G, C]`` transpose: "TransposeOp SPMD needs
     communication"). The grouped form sorts instead of searching:
     DTensor has no SPMD expansion for ``tf.searchsorted`` (LowerBound).
  2. DTensor backend, otherwise (``einsum``, or the expert-choice router,
     whose slot-only view combines with a scatter): ``einsum``, GShard
     Algorithm 2's one-hot einsums (the TPU default).
  """
  if (backend != "none" and requested in ("index", "sorted") and
      router != "expert_choice"):
    return "grouped_index"
  if backend == "dtensor":
    return "einsum"
  return None


def _block_is_cheaper(*, backend: str, training: bool,
                      expert_dropout_rate: float,
                      layout: BufferLayout | None) -> bool:
  """Whether an ``index`` call runs ``block`` instead.

  Yes when ``layout`` is given and the block layout computes fewer rows
  than the ``E*G*C`` buffers (a large capacity for few tokens: the no-drop
  eval capacity C = S, or the one-token groups of decoding, C = 1; per-row
  groups pass G = rows), on one device (blocks gather weights across
  experts), with the per-token view, a static G and no expert dropout
  (blocks draw none).
  """
  if (layout is None or backend != "none" or layout.num_selected is None or
      layout.num_groups is None or (training and expert_dropout_rate > 0)):
    return False
  return block_rows_are_fewer(
      num_choices=layout.num_groups * layout.group_size * layout.num_selected,
      num_experts=layout.num_experts,
      buffer_rows=layout.num_experts * layout.num_groups * layout.capacity)


def dispatch_combine(x: tf.Tensor, routing: RoutingResult, experts: Experts,
                     *, implementation: str, training: bool = False,
                     seed: tf.Tensor | None = None) -> tf.Tensor:
  """Runs ``DISPATCH_PATHS[implementation]``."""
  if implementation not in DISPATCH_PATHS:
    raise ValueError(f"dispatch implementation {implementation!r} unknown; "
                     f"use --dispatch={' or '.join(DISPATCH_IMPLEMENTATIONS)}")
  return DISPATCH_PATHS[implementation](x, routing, experts,
                                        training=training, seed=seed)
