"""MoE layer forward+backward vs a dense FFN with the same useful FLOPs.

Dimensions (letters of the glossary in :mod:`m4moe`):

  N: tokens; G: groups; S: group size; E: experts; C: capacity;
  K: experts per token; M: model width; H: expert hidden width.

The dense baseline is ``wo . ReLU(wi . x)`` with hidden width K*H on all N
tokens: exactly the useful FLOPs of the MoE layer (each token through K
experts of width H), ``12*N*M*K*H`` for forward+backward. A square matmul
(``--matmul_size``) times the machine's attainable GFLOP/s. All cases of one
point are timed interleaved (see :mod:`m4moe.benchmarks.timing`).

With ``parts``, two more cases split the layer's time: ``router`` (the
router alone: logits, choices, capacity placement, balancing loss) and
``moe_<dispatch>_noexperts`` (the whole layer with its experts replaced by
the identity: routing, dispatch and combine, no expert matmuls). Each part
reports its ``share_of_layer`` (its median over the full layer's), so what
the experts cost is one minus the no-experts share.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any, Callable, Iterator

import numpy as np
import tensorflow as tf

from m4moe import config as config_lib
from m4moe.moe import layer as moe_layer
from m4moe.benchmarks import timing


@dataclasses.dataclass(frozen=True, kw_only=True)
class LayerPoint:
  """One MoE configuration (defaults: the Transformer-base width of the
  performance table in docs/performance.md).

  ``input_batches``: the MoE calls cycle through this many random batches.
  With one, every call routes alike, so the ``sorted`` path's per-expert
  row counts repeat and oneDNN reuses each matmul it built; in training
  they change with every batch and it builds new ones (in bfloat16 that
  cost more than the products; results/benchmarks/sparse-step-cost.md).
  """
  num_experts: int = 32
  model_dim: int = 512
  hidden_dim: int = 2048
  num_tokens: int = 4096
  group_size: int = 1024
  capacity_factor: float = 1.25
  top_k: int = 2
  input_batches: int = 1

  def __post_init__(self) -> None:
    if self.input_batches < 1:
      raise ValueError(f"--input_batches={self.input_batches}: use 1 (the "
                       "same batch every call) or more (a new routing per "
                       "call, as in training)")
    if self.num_tokens % self.group_size:
      raise ValueError(f"--num_tokens={self.num_tokens} must be a multiple of "
                       f"--group_size={self.group_size}")
    if not 1 <= self.top_k <= self.num_experts:
      raise ValueError(f"--top_ks={self.top_k} with --experts="
                       f"{self.num_experts}: use a k from 1 to the number "
                       "of experts (1: top1, 2: top2, more: topk)")

  @property
  def capacity(self) -> int:
    """C at training time, as the layer computes it (MoeConfig.capacity)."""
    return model_config(self, dispatch="index").moe.capacity(
        group_size=self.group_size, training=True)

  @property
  def useful_flops(self) -> float:
    """Forward+backward FLOPs of the experts' useful work, 12*N*M*K*H."""
    return 12.0 * self.num_tokens * self.model_dim * self.top_k * self.hidden_dim


def model_config(point: LayerPoint, *, dispatch: str) -> config_lib.ModelConfig:
  """A ModelConfig whose MoE layer is ``point`` (deterministic top-k).

  k = 1 and 2 are Switch's and GShard's routers (every second choice
  dispatched); a larger k is the token-choice ``topk`` router of the
  fine-grained MoEs.
  """
  router = {1: ["--router=top1"],
            2: ["--router=top2", "--second_expert_policy=all"]}.get(
                point.top_k, ["--router=topk",
                              f"--num_selected_experts={point.top_k}"])
  return config_lib.load_model_config("tiny/moe", extra_flags=[
      f"--d_model={point.model_dim}", f"--num_experts={point.num_experts}",
      f"--expert_hidden_dim={point.hidden_dim}",
      f"--group_size={point.group_size}",
      f"--train_capacity_factor={point.capacity_factor}",
      f"--dispatch={dispatch}", "--dropout_rate=0",
      "--attention_dropout_rate=0", *router])


def _inputs(point: LayerPoint, *, batch: int = 0) -> tf.Tensor:
  """<float32>[N/S, S, M] random tokens (B = N/S rows of length S).

  Batch 0 is the one the dense and router cases use; ``batch`` selects
  another draw (:attr:`LayerPoint.input_batches`).
  """
  rng = np.random.default_rng(batch)
  return tf.constant(rng.standard_normal(
      (point.num_tokens // point.group_size, point.group_size,
       point.model_dim)), tf.float32)


class PassThroughExperts:
  """The identity in place of the experts (:class:`m4moe.moe.dispatch.Experts`).

  The layer with these runs its router, dispatch and combine exactly as
  with real experts, so its time is the layer's minus the experts' work
  (their matmuls, and the sorted path's split of the rows per expert);
  each token's output is its input times the combine weights of its
  dispatched choices.
  """
  dropout_rate = 0.0

  def __call__(self, dispatched: tf.Tensor, *, output_layout: str,
               training: bool, seed: tf.Tensor | None) -> tf.Tensor:
    """<dtype>[E, G, C, M] buffers -> the same, in ``output_layout``."""
    del training, seed
    if output_layout == "GECM":
      return tf.transpose(dispatched, [1, 0, 2, 3])
    return dispatched

  def rows(self, rows: tf.Tensor, counts: tf.Tensor, **unused: Any
           ) -> tf.Tensor:
    """<dtype>[T, M] sorted rows -> the same, dropped rows included.

    The rows past ``sum(counts)`` are not zeroed, as real experts'
    outputs are: their choices' combine weight is 0, so they add nothing
    to the outputs and get no gradient, and zeroing them would time a
    select that no real path runs.
    """
    del counts, unused
    return rows

  def blocks(self, blocks: tf.Tensor, block_expert: tf.Tensor, **unused: Any
             ) -> tf.Tensor:
    """<dtype>[X, R, M] blocks -> the same."""
    del block_expert, unused
    return blocks


def build_layer(point: LayerPoint, *, dispatch: str,
                experts: bool = True) -> moe_layer.MoeLayer:
  """The point's MoE layer, seeded; ``experts=False``: PassThroughExperts."""
  tf.random.set_seed(0)  # seeded init: works with op determinism enabled
  layer = moe_layer.MoeLayer(config=model_config(point, dispatch=dispatch),
                             causal=False)
  if not experts:
    layer.experts = PassThroughExperts()
  return layer


def moe_case(point: LayerPoint, *, dispatch: str, jit: bool,
             experts: bool = True) -> Callable[[], Any]:
  """A blocking zero-argument call: MoE forward+backward (x and weights).

  ``experts=False`` times the layer without its expert matmuls
  (:class:`PassThroughExperts`).
  """
  layer = build_layer(point, dispatch=dispatch, experts=experts)
  batches = [_inputs(point, batch=b) for b in range(point.input_batches)]
  mask = tf.ones(batches[0].shape[:2], tf.float32)
  seed = tf.constant([1, 2], tf.int32)
  variables = list(layer.trainable_variables)

  @tf.function(jit_compile=jit)
  def step(x):
    with tf.GradientTape() as tape:
      tape.watch(x)
      out = layer(x, padding_mask=mask, training=True, seed=seed)
      loss = tf.reduce_sum(out.outputs * out.outputs) + out.weighted_loss
    grads = tape.gradient(loss, [x] + variables)
    return tf.add_n([tf.reduce_sum(g) for g in grads])
  calls = itertools.cycle(batches)
  return lambda: step(next(calls)).numpy()


def router_case(point: LayerPoint, *, jit: bool) -> Callable[[], Any]:
  """The router alone, forward+backward through its combine weights and loss.

  The inputs are already the layer's groups (``<float32>[N/S, S, M]``, no
  padding), so this is the router call of :func:`moe_case` on the same
  tokens.
  """
  layer = build_layer(point, dispatch="index")
  x = _inputs(point)
  mask = tf.ones(x.shape[:2], tf.float32)
  seed = tf.constant([1, 2], tf.int32)
  variables = list(layer.router.trainable_variables)

  @tf.function(jit_compile=jit)
  def step(x):
    with tf.GradientTape() as tape:
      tape.watch(x)
      result = layer.router(x, padding_mask=mask, capacity=point.capacity,
                            training=True, seed=seed, group_capacity=None)
      loss = tf.reduce_sum(result.combine_weights) + result.aux_loss
    grads = tape.gradient(loss, [x] + variables)
    return tf.add_n([tf.reduce_sum(g) for g in grads])
  return lambda: step(x).numpy()


def dense_case(point: LayerPoint, *, jit: bool) -> Callable[[], Any]:
  """Dense FFN with hidden K*H on all N tokens, forward+backward."""
  rng = np.random.default_rng(1)
  hidden = point.top_k * point.hidden_dim
  wi = tf.Variable(rng.standard_normal((point.model_dim, hidden)) /
                   np.sqrt(point.model_dim), dtype=tf.float32)
  wo = tf.Variable(rng.standard_normal((hidden, point.model_dim)) /
                   np.sqrt(hidden), dtype=tf.float32)
  x = tf.reshape(_inputs(point), [-1, point.model_dim])

  @tf.function(jit_compile=jit)
  def step(x):
    with tf.GradientTape() as tape:
      tape.watch(x)
      y = tf.matmul(tf.nn.relu(tf.matmul(x, wi)), wo)
      loss = tf.reduce_sum(y * y)
    grads = tape.gradient(loss, [x, wi, wo])
    return tf.add_n([tf.reduce_sum(g) for g in grads])
  return lambda: step(x).numpy()


def matmul_case(size: int) -> Callable[[], Any]:
  """A ``[size, size] x [size, size]`` float32 matmul (2*size**3 FLOPs)."""
  rng = np.random.default_rng(2)
  a = tf.constant(rng.standard_normal((size, size)), tf.float32)
  b = tf.constant(rng.standard_normal((size, size)), tf.float32)
  fn = tf.function(lambda: tf.reduce_sum(tf.matmul(a, b)), jit_compile=True)
  return lambda: fn().numpy()


def buffer_bytes(point: LayerPoint, *, dispatch: str) -> dict[str, int]:
  """Bytes of the dispatch intermediates of one call (float32/int32).

  einsum: the ``[G, S, E, C]`` dispatch mask and combine weights (and the
  ``[G, S, K, E]``/``[G, S, K, C]`` one-hots they come from) -- O(S*E*C) per
  group, quadratic in S at a fixed capacity factor. index: the ``[G, E, C]``
  slot tables and gather rows. Both hold the ``[E, G, C, M]`` expert input
  and output buffers, O(cf * K * S * M) per group. sorted: ``[T, M]`` input
  and output tables of the T = G*S*K choices (no capacity padding) and four
  ``<int32>[T]`` maps.
  """
  g = point.num_tokens // point.group_size
  s, e, c, k, m = (point.group_size, point.num_experts, point.capacity,
                   point.top_k, point.model_dim)
  buffers = 2 * 4 * e * g * c * m
  if dispatch == "sorted":  # [T, M] tables, T = G*S*K; int32 [T] maps
    return {"routing_bytes": 4 * 4 * g * s * k + 4 * (g * s + 1) * m,
            "expert_buffer_bytes": 2 * 4 * g * s * k * m,
            "total_bytes": 4 * 4 * g * s * k + 4 * (g * s + 1) * m +
                           2 * 4 * g * s * k * m}
  if dispatch == "einsum":
    routing_bytes = 4 * (2 * g * s * e * c + g * s * k * (e + c))
  else:
    routing_bytes = 4 * 3 * g * e * c + 4 * (g * s + 1) * m
  return {"routing_bytes": routing_bytes, "expert_buffer_bytes": buffers,
          "total_bytes": routing_bytes + buffers}


def _jit_name(jit: bool) -> str:
  return "jit" if jit else "nojit"


def cases(point: LayerPoint, *, dispatches: tuple[str, ...],
          jits: tuple[bool, ...], matmul_size: int,
          parts: bool = False) -> dict[str, Callable[[], Any]]:
  """The blocking zero-argument calls :func:`run_point` times, by case name.

  ``moe_<dispatch>_<jit|nojit>`` (no ``sorted`` under XLA: its per-expert
  row counts are dynamic), ``dense_<jit|nojit>``, and ``matmul`` (the GFLOP/s
  reference) if ``matmul_size``. With ``parts`` also
  ``moe_<dispatch>_noexperts_<jit|nojit>`` and ``router_<jit|nojit>``.
  """
  out = {}
  for dispatch, jit in itertools.product(dispatches, jits):
    if dispatch == "sorted" and jit:
      continue  # dynamic per-expert row counts: not compilable by XLA
    out[f"moe_{dispatch}_{_jit_name(jit)}"] = moe_case(
        point, dispatch=dispatch, jit=jit)
    if parts:
      out[f"moe_{dispatch}_noexperts_{_jit_name(jit)}"] = moe_case(
          point, dispatch=dispatch, jit=jit, experts=False)
  for jit in jits:
    out[f"dense_{_jit_name(jit)}"] = dense_case(point, jit=jit)
    if parts:
      out[f"router_{_jit_name(jit)}"] = router_case(point, jit=jit)
  if matmul_size:
    out["matmul"] = matmul_case(matmul_size)
  return out


def _case_fields(name: str, *, point: LayerPoint, times: timing.Timings,
                 layers: list[str]) -> dict[str, Any]:
  """The ratios of one case's record (see :func:`run_point`)."""
  jit = name.rsplit("_", 1)[-1]
  gflops = {"useful_gflops_per_sec":
                point.useful_flops / times.median(name) / 1e9}
  if name.startswith("dense_"):
    return gflops
  fields = {"speed_vs_dense": times.ratio(f"dense_{jit}", name)}
  if name.startswith("router_"):
    fields["share_of_layer"] = {layer: times.ratio(name, layer)
                                for layer in layers
                                if layer.endswith(f"_{jit}")}
  elif "_noexperts_" in name:
    layer = name.replace("_noexperts", "")
    fields["share_of_layer"] = {layer: times.ratio(name, layer)}
  else:  # a whole layer
    fields.update(gflops)
    fields.update(buffer_bytes(point, dispatch=name.split("_")[1]))
  return fields


def run_point(point: LayerPoint, *,
              dispatches: tuple[str, ...] = ("sorted", "index", "einsum"),
              jits: tuple[bool, ...] = (True, False), reps: int = 3,
              warmup: int = 1, matmul_size: int = 2048,
              clock: str = "wall", parts: bool = False
              ) -> Iterator[dict[str, Any]]:
  """Times one point's cases interleaved; yields one JSON record per case.

  ``sorted`` is timed without XLA only (dynamic shapes). Each MoE record
  has ``speed_vs_dense`` = median(dense, same jit) / median(MoE) (the
  ratio the layer's speed targets are stated in; results/benchmarks/) and
  ``fraction_of_matmul`` = useful GFLOP/s / the square matmul's GFLOP/s;
  seconds are ``clock`` seconds (:data:`timing.CLOCKS`; with "cpu" the
  GFLOP/s are per CPU-second of the process, not per second). With
  ``parts``, the ``router`` and ``noexperts`` records have
  ``share_of_layer``: {full layer case: median(part) / median(layer)}.
  """
  calls = cases(point, dispatches=dispatches, jits=jits,
                matmul_size=matmul_size, parts=parts)
  times = timing.interleaved(calls, reps=reps, warmup=warmup, clock=clock)
  matmul_gflops = (2.0 * matmul_size ** 3 / times.median("matmul") / 1e9
                   if matmul_size else None)
  base = {"benchmark": "moe_layer", **dataclasses.asdict(point),
          "capacity": point.capacity, "reps": reps, "clock": clock,
          **timing.machine()}
  layers = [name for name in calls
            if name.startswith("moe_") and "_noexperts_" not in name]
  for name in calls:
    if name == "matmul":
      continue
    record = {**base, "case": name, "median_sec": times.median(name),
              "seconds": times.seconds[name],
              **_case_fields(name, point=point, times=times, layers=layers)}
    if matmul_gflops and "useful_gflops_per_sec" in record:
      record["fraction_of_matmul"] = (record["useful_gflops_per_sec"] /
                                      matmul_gflops)
      record["matmul_gflops_per_sec"] = matmul_gflops
    yield record
