"""Parameter, FLOP and per-device memory counts from a ModelConfig alone.

Nothing here builds a variable or a tensor, so the paper's 1T-weight model is
counted in microseconds. The counts follow the parameterisation of
:class:`m4moe.model.transformer.Transformer` exactly; :func:`variable_specs` lists every
variable the model creates (name, shape, kind), and ``tests/test_cost.py``
checks the total against the sizes of a built tiny model's ``tf.Variable``s.

Dimensions (letters of the glossary in :mod:`m4moe`):

  M: d_model; Vs: source vocabulary size; Vt: target vocabulary size;
  A: attention heads; D: d_kv, key/value width per head; F: dense FFN
  hidden; H: expert hidden; E: experts per MoE layer; K: experts per token
  (top2: 2, top1: 1, noisy_topk / expert_choice: the configured
  ``num_selected_experts``, an average for expert_choice); S: group size;
  C: expert capacity per group; Ls: source sequence length;
  Lt: target sequence length.

Parameterisation counted (float32 ``tf.Variable``s; no biases except the
layer norms'):
  source embedding <Vs, M>; target embedding <Vt, M>; output (softmax)
  projection <M, Vt>, untied as in ``Transformer``'s default (with
  ``share_target_embedding=True`` the target embedding doubles as the softmax
  weights and there is no projection); sinusoidal positions (no variables);
  per attention block (encoder self, decoder self, decoder cross): query, key,
  value <M, A, D> and output <A, D, M>; per dense FFN: wi <M, F>, wo <F, M>;
  per MoE layer: router wg <M, E> (noisy_topk adds w_noise <M, E>), experts
  wi <E, M, H> and wo <E, H, M>, and with ``--num_shared_experts`` = Es
  the shared experts as one FFN wi <M, Es*Hs>, wo <Es*Hs, M> (Hs:
  ``MoeConfig.shared_hidden_dim``; replicated like a dense FFN, active for
  every token); a layer norm (scale <M>, bias <M>) before
  every sub-layer, and a final layer norm per stack.

Activations (:func:`estimate_device`) are counted for one of two executions
(:data:`EXECUTIONS`): ``fused``, one tensor per sub-layer, the residency of a
compiled XLA/TPU program; ``unfused``, every tensor TensorFlow's
kernel-by-kernel gradient tape keeps, listed per sub-layer in
:mod:`m4moe.cost.unfused` and equal to what ``m4moe-bench sharding``
measures on eager DTensor.

FLOPs are forward multiply-adds times 2 per "token", where a token means one
source token through the encoder plus one target token through the decoder
(the paper's batches count source tokens; MT pairs have about as many target
tokens). Counted: every matmul with a weight (attention projections, dense
FFN, the K selected experts, the shared experts, the router, the output
projection) and the two
attention matmuls QK^T and AV over the full (masked) key length. Not counted:
embedding gathers, softmax, layer norm, ReLU, dropout, the loss, and the
dispatch/combine data movement (reported separately as ``einsum_dispatch`` for
``--dispatch=einsum``, whose one-hot einsums are real matmuls).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence

from m4moe.cost import unfused as cost_unfused
from m4moe.parallel import mesh as mesh_lib
from m4moe.config import ModelConfig

KINDS = ("embedding", "output", "attention", "ffn", "router", "expert",
         "shared_expert", "layer_norm")
_ACTIVATION_BYTES = {"float32": 4, "bfloat16": 2}
_WEIGHT_BYTES = 4  # Weights, gradients and optimizer slots are float32.
# How the step runs, which decides the activations it keeps: "fused", a
# compiled (XLA/TPU) program, one tensor per sub-layer
# (_activations_per_token); "unfused", TensorFlow kernel by kernel (eager,
# DTensor without XLA), every tensor the gradient tape keeps
# (m4moe.cost.unfused, the table measured by m4moe-bench sharding).
EXECUTIONS = ("fused", "unfused")


@dataclasses.dataclass(frozen=True)
class VariableSpec:
  """One model variable: path-like name, shape and kind (one of KINDS).

  ``model_dim`` is the dimension a ``model`` mesh axis splits (attention
  heads A, dense FFN hidden F, expert hidden H; :mod:`m4moe.parallel.sharding`'s
  variable rules), None for a variable that axis leaves whole.
  """

  name: str
  shape: tuple[int, ...]
  kind: str
  model_dim: int | None = None

  @property
  def size(self) -> int:
    return math.prod(self.shape)

  def local_shape(self, *, expert_axis: int = 1,
                  model_axis: int = 1) -> tuple[int, ...]:
    """The shape each device holds: E split over ``expert`` (expert
    weights), ``model_dim`` over ``model``."""
    shape = list(self.shape)
    if self.kind == "expert":
      shape[0] //= expert_axis
    if self.model_dim is not None:
      shape[self.model_dim] //= model_axis
    return tuple(shape)


def _layer_norm_specs(d_model: int, prefix: str) -> list[VariableSpec]:
  return [VariableSpec(f"{prefix}/scale", (d_model,), "layer_norm"),
          VariableSpec(f"{prefix}/bias", (d_model,), "layer_norm")]


def _attention_specs(config: ModelConfig, prefix: str) -> list[VariableSpec]:
  m, n, k = config.d_model, config.num_heads, config.d_kv
  specs = _layer_norm_specs(m, f"{prefix}/layer_norm")
  for proj in ("query", "key", "value"):
    specs.append(VariableSpec(f"{prefix}/{proj}", (m, n, k), "attention", 1))
  specs.append(VariableSpec(f"{prefix}/output", (n, k, m), "attention", 0))
  return specs


def _ffn_specs(config: ModelConfig, prefix: str,
               is_moe: bool) -> list[VariableSpec]:
  m = config.d_model
  specs = _layer_norm_specs(m, f"{prefix}/layer_norm")
  if not is_moe:
    f = config.d_ff
    specs.append(VariableSpec(f"{prefix}/wi", (m, f), "ffn", 1))
    specs.append(VariableSpec(f"{prefix}/wo", (f, m), "ffn", 0))
    return specs
  e, h = config.moe.num_experts, config.moe.expert_hidden_dim
  specs.append(VariableSpec(f"{prefix}/router/wg", (m, e), "router"))
  if config.moe.router == "noisy_topk":
    specs.append(VariableSpec(f"{prefix}/router/w_noise", (m, e), "router"))
  specs.append(VariableSpec(f"{prefix}/experts/wi", (e, m, h), "expert", 2))
  specs.append(VariableSpec(f"{prefix}/experts/wo", (e, h, m), "expert", 1))
  shared = config.moe.num_shared_experts * config.moe.shared_hidden_dim
  if shared:
    specs.append(VariableSpec(f"{prefix}/shared_experts/ffn/wi", (m, shared),
                              "shared_expert", 1))
    specs.append(VariableSpec(f"{prefix}/shared_experts/ffn/wo", (shared, m),
                              "shared_expert", 0))
  return specs


def _stack_specs(config: ModelConfig, stack: str) -> list[VariableSpec]:
  num_layers = (config.num_encoder_layers if stack == "encoder"
                else config.num_decoder_layers)
  specs = []
  for i in range(num_layers):
    prefix = f"{stack}/layer_{i:03d}"
    specs += _attention_specs(config, f"{prefix}/self_attention")
    if stack == "decoder":
      specs += _attention_specs(config, f"{prefix}/cross_attention")
    specs += _ffn_specs(config, f"{prefix}/ffn", config.moe.is_moe_layer(i))
  return specs + _layer_norm_specs(config.d_model, f"{stack}/final_layer_norm")


def variable_specs(config: ModelConfig, *, share_target_embedding: bool = False
                   ) -> tuple[VariableSpec, ...]:
  """Every variable of the Transformer built with these arguments, in order."""
  m = config.d_model
  specs = [
      VariableSpec("source_embedding", (config.src_vocab_size, m), "embedding"),
      VariableSpec("target_embedding", (config.tgt_vocab_size, m), "embedding"),
      *_stack_specs(config, "encoder"),
      *_stack_specs(config, "decoder"),
  ]
  if not share_target_embedding:
    specs.append(
        VariableSpec("output_projection", (m, config.tgt_vocab_size), "output"))
  return tuple(specs)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ParamBreakdown:
  """Parameter counts by kind; ``total`` is the model's num_params."""

  embedding: int
  output: int
  attention: int
  ffn: int
  router: int
  expert: int
  shared_expert: int
  layer_norm: int

  @property
  def total(self) -> int:
    return sum(dataclasses.asdict(self).values())

  @property
  def non_expert(self) -> int:
    """Everything but the routed experts: replicated on every device under
  GShard (the shared experts included)."""
    return self.total - self.expert


def param_breakdown(config: ModelConfig, *,
                    share_target_embedding: bool = False) -> ParamBreakdown:
  counts = {kind: 0 for kind in KINDS}
  for spec in variable_specs(config,
                             share_target_embedding=share_target_embedding):
    counts[spec.kind] += spec.size
  return ParamBreakdown(**counts)


def num_params(config: ModelConfig, *,
               share_target_embedding: bool = False) -> int:
  """Total trainable parameters of the Transformer built from ``config``."""
  return param_breakdown(
      config, share_target_embedding=share_target_embedding).total


def num_moe_layers(config: ModelConfig) -> int:
  """MoE layers in both stacks (paper: L/2 for "every other layer")."""
  return (len(config.moe_layer_indices(config.num_encoder_layers)) +
          len(config.moe_layer_indices(config.num_decoder_layers)))


def num_experts_total(config: ModelConfig) -> int:
  """E times the number of MoE layers (SPEC Table 1's "total experts")."""
  return config.moe.num_experts * num_moe_layers(config)


def params_per_expert(config: ModelConfig) -> int:
  """wi <M, H> plus wo <H, M> of one expert; 0 for a dense model."""
  if not config.moe.enabled:
    return 0
  return 2 * config.d_model * config.moe.expert_hidden_dim


def _active_expert_params(config: ModelConfig) -> int:
  """K experts in every MoE layer: the expert weights one token uses."""
  k = config.moe.top_k if config.moe.enabled else 0
  return k * params_per_expert(config) * num_moe_layers(config)


def active_params_per_token(config: ModelConfig, *,
                            share_target_embedding: bool = False) -> int:
  """Parameters a (source, target) token pair touches.

  All but the routed experts (the shared experts included), plus K of the E
  experts in every MoE layer; embedding tables are counted whole.
  """
  breakdown = param_breakdown(config,
                              share_target_embedding=share_target_embedding)
  return breakdown.non_expert + _active_expert_params(config)


@dataclasses.dataclass(frozen=True, kw_only=True)
class FlopsPerToken:
  """Forward FLOPs per (source token, target token); see the module doc.

  Attributes:
    source_length, target_length: Ls, Lt used for the attention terms.
    matmul: 2 x active weight-matmul parameters (embeddings excluded).
    attention: QK^T and AV over the full key lengths, all layers.
    einsum_dispatch: one-hot dispatch + combine einsums (2 x 2 E C M per MoE
      layer with the training capacity) for ``--dispatch=einsum``, else 0.
      Not part of ``forward``: it is an implementation overhead.
  """

  source_length: int
  target_length: int
  matmul: int
  attention: int
  einsum_dispatch: int

  @property
  def forward(self) -> int:
    return self.matmul + self.attention

  @property
  def train(self) -> int:
    """Forward plus backward, the usual 3x forward."""
    return 3 * self.forward


def _attention_flops(config: ModelConfig, *, source_length: int,
                     target_length: int) -> int:
  # Per query and layer: QK^T and AV each cost 2 * A * D * keys.
  per_key = 4 * config.num_heads * config.d_kv
  encoder_keys = config.num_encoder_layers * source_length
  decoder_keys = config.num_decoder_layers * (target_length + source_length)
  return per_key * (encoder_keys + decoder_keys)


def flops_per_token(config: ModelConfig, *, source_length: int | None = None,
                    target_length: int | None = None) -> FlopsPerToken:
  """Forward FLOPs per token pair; lengths default to ``config.max_length``."""
  source_length = source_length or config.max_length
  target_length = target_length or config.max_length
  # The softmax matmul <M, Vt> costs the same whether tied or not.
  breakdown = param_breakdown(config)
  matmul_params = (breakdown.attention + breakdown.ffn + breakdown.router +
                   breakdown.output + breakdown.shared_expert +
                   _active_expert_params(config))
  dispatch = 0
  if config.moe.enabled and config.moe.dispatch == "einsum":
    capacity = config.moe.capacity(group_size=config.moe.group_size,
                                   training=True)
    dispatch = (4 * config.moe.num_experts * capacity * config.d_model *
                num_moe_layers(config))
  return FlopsPerToken(
      source_length=source_length, target_length=target_length,
      matmul=2 * matmul_params,
      attention=_attention_flops(config, source_length=source_length,
                                 target_length=target_length),
      einsum_dispatch=dispatch)


def adafactor_slot_size(shape: Sequence[int]) -> int:
  """Adafactor's second-moment slot size with beta1 = 0 (no momentum).

  Rank >= 2: factored over the last two dimensions, i.e. row and column
  statistics <..., r> and <..., c> (leading dimensions such as E kept).
  Rank < 2: a full accumulator of the variable's size.
  """
  if len(shape) < 2:
    return math.prod(shape)
  lead = math.prod(shape[:-2])
  return lead * (shape[-2] + shape[-1])


@dataclasses.dataclass(frozen=True, kw_only=True)
class DeviceEstimate:
  """Per-device memory (bytes) and compute for one training step on a mesh.

  Layout (the one :mod:`m4moe.parallel.sharding` gives the model, plus
  Megatron-style tensor parallelism over ``model``): the batch is split over
  the batch axis (:attr:`m4moe.parallel.mesh.MeshShape.batch_axis`): ``data``, or
  ``expert`` on a mesh without ``data`` (GShard: tokens and experts on the
  same devices); on a ``data`` x ``expert`` mesh the devices of a ``data``
  row hold the same tokens (one tensor dimension maps to one mesh axis), and
  each group of ``model`` devices works on the same tokens; expert weights <E, ...> are split on E over
  ``expert`` and on the expert hidden H over ``model``; attention weights
  are split on the heads A and dense FFN weights on d_ff over ``model``;
  the rest (embeddings, softmax, router, layer norms) is replicated.
  Adafactor's factored slots are split like the dimensions they keep.
  Weights, gradients and Adafactor slots are float32; activations use
  ``activation_dtype``.

  Attributes:
    data_axis, expert_axis, model_axis: mesh axis sizes; num_devices is
      their product.
    execution: ``fused`` or ``unfused`` (:data:`EXECUTIONS`), which
      ``activation_bytes`` counts.
    batch_tokens: source tokens per global batch (as many target tokens).
    tokens_per_device: batch_tokens / size of the batch axis (data_axis,
      or expert_axis when data_axis is 1): the model axis splits widths,
      not tokens.
    replicated_params: non-expert parameters on each device: embeddings,
      softmax, router and layer norms whole, attention and dense FFN weights
      whole or, on a ``model`` axis, 1/model_axis of them.
    expert_params_per_device: E / expert_axis experts of every MoE layer,
      1/model_axis of each expert's hidden H.
    weight_bytes, gradient_bytes, optimizer_bytes: float32 copies of the
      local weights, their gradients and Adafactor's factored slots.
    activation_bytes: activations kept for the backward pass without
      rematerialisation: for ``fused`` one tensor per sub-layer (rough: see
      ``_activations_per_token``), for ``unfused`` every tensor of
      :mod:`m4moe.cost.unfused`'s table.
    train_flops: forward + backward FLOPs on this device per step, experts
      computed at their full capacity (empty buffer slots cost too); the
      attention, dense FFN and expert matmuls divided over ``model``, the
      router, softmax and einsum dispatch repeated on every model device.
  """

  data_axis: int
  expert_axis: int
  model_axis: int = 1
  execution: str = "fused"
  batch_tokens: int
  tokens_per_device: int
  replicated_params: int
  expert_params_per_device: int
  weight_bytes: int
  gradient_bytes: int
  optimizer_bytes: int
  activation_bytes: int
  train_flops: int

  @property
  def num_devices(self) -> int:
    return self.data_axis * self.expert_axis * self.model_axis

  @property
  def params_per_device(self) -> int:
    return self.replicated_params + self.expert_params_per_device

  @property
  def total_bytes(self) -> int:
    return (self.weight_bytes + self.gradient_bytes + self.optimizer_bytes +
            self.activation_bytes)


def _activations_per_token(config: ModelConfig, *, source_length: int,
                           target_length: int, model_axis: int = 1) -> int:
  """Activation values stored per token pair for the backward pass.

  Per attention block: its layer-norm input M, q/k/v/context 4 A D and the
  probabilities A x keys. Per dense FFN: M + F. Per MoE layer: M, the gates
  E, and for each of the capacity_factor x K buffer slots a token fills on
  average (K for dropless training, whose sorted rows have no empty slots)
  the dispatched input M and hidden H, plus the shared experts' hidden
  Es*Hs; with ``--dispatch=einsum``
  also the one-hot dispatch_mask and combine_weights <[G, S, E, C]>, i.e.
  2 E C per token (C for the configured group size S). Plus the logits Vt.
  A ``model`` axis divides the head-wise terms (A), F and H by model_axis.
  """
  m, nk = config.d_model, config.num_heads * config.d_kv
  heads = config.num_heads // model_axis

  def attn(keys: int) -> int:
    return m + 4 * nk // model_axis + heads * keys

  total = config.num_encoder_layers * attn(source_length)
  total += config.num_decoder_layers * (attn(target_length) +
                                        attn(source_length))
  moe_layers = num_moe_layers(config)
  dense_layers = config.num_layers - moe_layers
  total += dense_layers * (m + config.d_ff // model_axis)
  if moe_layers:
    moe = config.moe
    slots = (1 if moe.dropless else moe.train_capacity_factor) * moe.top_k
    shared = moe.num_shared_experts * moe.shared_hidden_dim // model_axis
    total += moe_layers * int(m + moe.num_experts + shared + slots *
                              (m + moe.expert_hidden_dim // model_axis))
    if config.moe.dispatch == "einsum":
      capacity = config.moe.capacity(group_size=config.moe.group_size,
                                     training=True)
      total += moe_layers * 2 * config.moe.num_experts * capacity
  return total + config.tgt_vocab_size


def _check_mesh(config: ModelConfig, *, data_axis: int, expert_axis: int,
                model_axis: int, batch_tokens: int) -> None:
  if data_axis < 1 or expert_axis < 1 or model_axis < 1:
    raise ValueError(f"mesh axes must be >= 1, got data={data_axis}, "
                     f"expert={expert_axis}, model={model_axis}")
  if config.moe.enabled and config.moe.num_experts % expert_axis:
    raise ValueError(
        f"--num_experts={config.moe.num_experts} is not divisible by the "
        f"expert axis {expert_axis}; choose an axis size dividing E")
  widths = mesh_lib.model_widths(config)
  del widths["num_experts"]  # Checked above, also for a dense model.
  mesh_lib.validate_mesh(mesh_lib.MeshShape((
      ("data", data_axis), ("expert", expert_axis), ("model", model_axis))),
                         **widths)
  rows = _batch_axis_size(data_axis=data_axis, expert_axis=expert_axis)
  if batch_tokens < rows:
    raise ValueError(f"batch_tokens={batch_tokens} is smaller than the "
                     f"{rows} devices of the batch axis; give every device "
                     "at least one token")


def _batch_axis_size(*, data_axis: int, expert_axis: int) -> int:
  """How many ways the batch is split: the size of the mesh's batch axis."""
  mesh = mesh_lib.MeshShape((("data", data_axis), ("expert", expert_axis)))
  return mesh.axis_size(mesh.batch_axis)


def estimate_device(config: ModelConfig, *, data_axis: int, expert_axis: int,
                    batch_tokens: int, model_axis: int = 1,
                    sequence_length: int | None = None,
                    share_target_embedding: bool = False,
                    execution: str = "fused") -> DeviceEstimate:
  """Per-device memory and FLOPs for one training step (see DeviceEstimate).

  ``execution`` (:data:`EXECUTIONS`) chooses what the activations count:
  ``fused`` (a compiled program, the default) or ``unfused`` (TensorFlow
  kernel by kernel; :mod:`m4moe.cost.unfused`). Weights, gradients,
  optimizer slots and FLOPs do not depend on it.

  Raises:
    ValueError: an axis < 1, E not divisible by ``expert_axis``, heads,
      d_ff or H not divisible by ``model_axis``, fewer tokens than
      devices on the batch axis, an unknown ``execution``, or ``unfused``
      for a setting its table does not describe
      (:func:`m4moe.cost.unfused.check_supported`).
  """
  if execution not in EXECUTIONS:
    raise ValueError(f"execution={execution!r} is unknown; use one of "
                     f"{', '.join(EXECUTIONS)}")
  _check_mesh(config, data_axis=data_axis, expert_axis=expert_axis,
              model_axis=model_axis, batch_tokens=batch_tokens)
  if execution == "unfused":
    cost_unfused.check_supported(config, model_axis=model_axis)
  length = sequence_length or config.max_length
  tokens = batch_tokens // _batch_axis_size(data_axis=data_axis,
                                           expert_axis=expert_axis)
  specs = variable_specs(config, share_target_embedding=share_target_embedding)
  local = [(s, s.local_shape(expert_axis=expert_axis, model_axis=model_axis))
           for s in specs]
  expert_local = sum(math.prod(shape) for s, shape in local
                     if s.kind == "expert")
  non_expert_local = sum(math.prod(shape) for s, shape in local
                         if s.kind != "expert")
  forward = tokens * _forward_flops_per_token(config, length=length,
                                              model_axis=model_axis)
  if execution == "unfused":
    activations = cost_unfused.activation_bytes(
        config, tokens=tokens, source_length=length, target_length=length)
  else:
    activations = _ACTIVATION_BYTES[config.activation_dtype] * tokens * (
        _activations_per_token(config, source_length=length,
                               target_length=length, model_axis=model_axis))
  return DeviceEstimate(
      data_axis=data_axis, expert_axis=expert_axis, model_axis=model_axis,
      execution=execution,
      batch_tokens=batch_tokens, tokens_per_device=tokens,
      replicated_params=non_expert_local,
      expert_params_per_device=expert_local,
      weight_bytes=_WEIGHT_BYTES * (non_expert_local + expert_local),
      gradient_bytes=_WEIGHT_BYTES * (non_expert_local + expert_local),
      optimizer_bytes=_WEIGHT_BYTES * sum(adafactor_slot_size(shape)
                                          for _, shape in local),
      activation_bytes=activations,
      train_flops=3 * forward)


def _forward_flops_per_token(config: ModelConfig, *, length: int,
                             model_axis: int) -> int:
  """One device's forward FLOPs per token of its batch share.

  Not :func:`flops_per_token` as is: the model axis splits only the
  matmuls it shards, and a device also runs the one-hot dispatch einsums
  and multiplies the empty capacity slots of its expert buffers, which the
  useful-FLOP count leaves out.
  """
  flops = flops_per_token(config, source_length=length, target_length=length)
  expert_flops = 2 * params_per_expert(config) * num_moe_layers(config)
  # Empty buffer slots cost too; dropless (sorted) rows have none.
  capacity_extra = (0 if config.moe.dropless else
                    (config.moe.train_capacity_factor - 1) * config.moe.top_k)
  # The matmuls whose width the model axis splits: attention projections and
  # QK^T/AV (heads), dense FFN (d_ff), the K active experts (H).
  breakdown = param_breakdown(config)
  split = (2 * (breakdown.attention + breakdown.ffn + breakdown.shared_expert +
                _active_expert_params(config)) + flops.attention)
  whole = flops.forward - split  # Router and softmax projection.
  return (whole + split // model_axis + flops.einsum_dispatch +
          int(capacity_extra * expert_flops) // model_axis)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ExpertScalingRow:
  """A model on one device per expert (mesh ``expert:E``), GShard section 5.

  The paper trains MoE(E, L) on E TPU cores, one dispatch group of S tokens
  and one expert of every MoE layer per core, so only the replicated weights,
  the router <M, E> and the per-token gates <E> can grow with E.

  Attributes:
    name: where the config came from, e.g. ``gshard/moe_128e_12l``.
    num_experts: E per MoE layer, also the number of devices.
    num_layers: L, encoder plus decoder layers.
    num_moe_layers: L / 2 for "every other layer".
    num_params: weights of the whole model.
    params_per_expert: 2 M H (wi and wo of one expert).
    experts_per_device: E / devices experts of every MoE layer, summed over
      the MoE layers (the number of <M, H> + <H, M> pairs a device holds).
    device: the per-device estimate (:func:`estimate_device`).
  """

  name: str
  num_experts: int
  num_layers: int
  num_moe_layers: int
  num_params: int
  params_per_expert: int
  experts_per_device: int
  device: DeviceEstimate

  @property
  def replicated_bytes(self) -> int:
    """float32 non-expert weights (embeddings, attention, dense FFN, router)."""
    return _WEIGHT_BYTES * self.device.replicated_params

  @property
  def expert_bytes(self) -> int:
    """float32 weights of this device's experts."""
    return _WEIGHT_BYTES * self.device.expert_params_per_device

  @property
  def state_bytes(self) -> int:
    """Weights, gradients and Adafactor slots: everything but activations."""
    return (self.device.weight_bytes + self.device.gradient_bytes +
            self.device.optimizer_bytes)


def expert_scaling_row(name: str, config: ModelConfig, *,
                       tokens_per_device: int | None = None,
                       sequence_length: int | None = None
                       ) -> ExpertScalingRow:
  """``config`` on E devices (mesh ``expert:E``), one group per device.

  Args:
    name: label for the row.
    config: an MoE config.
    tokens_per_device: S, source tokens per device and step; default the
      config's ``group_size`` (the zoo's gshard rows set it to Table 3's
      batch / cores). Given, it also becomes the group size, so the einsum
      dispatch costs stay those of one group per device.
    sequence_length: Ls = Lt; default ``config.max_length``.

  Raises:
    ValueError: a dense config, or ``tokens_per_device`` < 1.
  """
  if not config.moe.enabled:
    raise ValueError(f"{name}: --num_experts=0 is a dense model; the expert "
                     "scaling table needs an MoE config")
  if tokens_per_device is not None:
    if tokens_per_device < 1:
      raise ValueError(f"tokens_per_device={tokens_per_device} must be >= 1 "
                       "(tokens per device and step)")
    config = dataclasses.replace(config, moe=dataclasses.replace(
        config.moe, group_size=tokens_per_device))
  experts = config.moe.num_experts
  device = estimate_device(config, data_axis=1, expert_axis=experts,
                           batch_tokens=config.moe.group_size * experts,
                           sequence_length=sequence_length)
  return ExpertScalingRow(
      name=name, num_experts=experts, num_layers=config.num_layers,
      num_moe_layers=num_moe_layers(config), num_params=num_params(config),
      params_per_expert=params_per_expert(config),
      experts_per_device=(experts // device.expert_axis *
                          num_moe_layers(config)),
      device=device)


def scaling_ratios(small: ExpertScalingRow,
                   large: ExpertScalingRow) -> dict[str, float]:
  """``large / small`` for the model size and the per-device quantities."""
  return {
      "num_params": large.num_params / small.num_params,
      "tokens_per_device": (large.device.tokens_per_device /
                            small.device.tokens_per_device),
      "state_bytes": large.state_bytes / small.state_bytes,
      "activation_bytes": (large.device.activation_bytes /
                           small.device.activation_bytes),
      "total_bytes": large.device.total_bytes / small.device.total_bytes,
      "train_flops": large.device.train_flops / small.device.train_flops,
  }


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelCost:
  """Everything :func:`model_cost` computes, for ``m4moe-info``."""

  num_params: int
  params: ParamBreakdown
  num_moe_layers: int
  num_experts_total: int
  params_per_expert: int
  expert_params: int
  active_params_per_token: int
  flops: FlopsPerToken

  @property
  def flops_per_token(self) -> int:
    return self.flops.forward


def model_cost(config: ModelConfig, *, source_length: int | None = None,
               target_length: int | None = None,
               share_target_embedding: bool = False) -> ModelCost:
  """All the counts above for one config (lengths for the attention FLOPs)."""
  breakdown = param_breakdown(config,
                              share_target_embedding=share_target_embedding)
  return ModelCost(
      num_params=breakdown.total, params=breakdown,
      num_moe_layers=num_moe_layers(config),
      num_experts_total=num_experts_total(config),
      params_per_expert=params_per_expert(config),
      expert_params=breakdown.expert,
      active_params_per_token=active_params_per_token(
          config, share_target_embedding=share_target_embedding),
      flops=flops_per_token(config, source_length=source_length,
                            target_length=target_length))
