"""What TensorFlow's kernel-by-kernel gradient tape keeps: the unfused table.

:func:`m4moe.cost.model.estimate_device` counts activations for one of two
*executions* (:data:`m4moe.cost.model.EXECUTIONS`):

* ``fused``: one tensor per sub-layer, the residency of a compiled (XLA/TPU)
  program that fuses element-wise chains and frees what it can recompute.
* ``unfused``: every tensor TensorFlow keeps alive when it runs the step
  kernel by kernel (eager execution, and DTensor's per-device programs
  without XLA): the inputs and outputs the tape holds for the gradients of
  the ops :class:`m4moe.model.transformer.Transformer` actually runs, plus what the
  forward code still holds. This module lists those tensors, per sub-layer.

The table was read off the op structure of the model code (``layers.py``,
``moe_layer.py``, ``routing.py``, ``dispatch.py``, ``losses.py``) and
checked, op type by op type, against ``m4moe-bench sharding``'s
``activation_bytes_by_op`` (the live tensors at the step's peak, which is in
the loss, after the whole forward pass). Shapes use the glossary letters of
:mod:`m4moe.cost.model` plus: N tokens of the stream on this device (B rows of L),
Q queries, U keys, G groups on this device. Every tensor is float32 unless
its dtype is given.

========================  ====================================  =============
sub-layer (count)         kept tensors (op type)                 shape
========================  ====================================  =============
embedding (2: source,     ResourceGather, Mul (x sqrt(M)),      4 x [N, M]
target)                   ConcatV2 (sin|cos positions), AddV2
shift_right (target)      Pad                                   <int32>[N]
attention bias (3: enc    ExpandDims                            [B, 1, Q, U]
self, dec self, cross)
layer norm (2 per enc,    Mean (mean, variance)                 2 x [N, 1]
3 per dec layer, +1 per   SquaredDifference, Sub (x - mean),    5 x [N, M]
stack)                    Mul (normed), Mul (scale), AddV2
                          Rsqrt                                 [N, 1]
attention (self per       Einsum q, Mul (q x D^-0.5), Einsum    5 x [N, A, D]
layer, cross per dec      k, v (memory tokens), Einsum context
layer)                    Einsum scores, Softmax                2 x [B, A, Q, U]
                          Einsum output                         [N, M]
residual (one per         AddV2                                 [N, M]
sub-layer)
dense FFN                 Relu                                  [N, F]
                          Einsum output                         [N, M]
MoE: grouping             Reshape [N, M], Reshape [D, N/D, M]   2 x [N, M]
                          GatherV2, Reshape [G, S, M]           2 x [G, S, M]
                          SelectV2 (position)                   <int32>[N]
                          GatherV2 (source)                     <int32>[G, S]
                          Reshape (group mask)                  [G, S]
MoE: router               Einsum logits, Softmax gates,         13 x [G, S, E]
                          SelectV2 (logits without e1), 2 x
                          (OneHot, Mul) (g1, g2), ExpandDims
                          (gates), Mul (balance-loss gates),
                          Exp (z-loss logsumexp), LogSoftmax,
                          Exp, SelectV2 (statistics)
                          Greater (e1 one-hot > 0)              <bool>[G, S, E]
                          2 x Sum (g1, g2), AddV2 + ExpandDims  12 x [G, S]
                          (normaliser), ExpandDims (balance
                          mask), z-loss Max, SelectV2, Sum,
                          Log, AddV2, Square, Mul (mask)
                          IsFinite, Greater                     2 x <bool>[G, S]
                          Sum (chosen gate), RealDiv,           3 x [G, S, K]
                          SelectV2 (combine weights)
                          Pack (kept)                           <bool>[G, S, K]
                          OneHot, Mul (chosen gates)            2 x [G, S, K, E]
MoE: einsum dispatch      OneHot (experts), Mul (weighted)      2 x [G, S, K, E]
                          ExpandDims (combine weights)          [G, S, K, 1]
                          OneHot (positions)                    [G, S, K, C]
                          2 x Einsum (dispatch mask, combine    2 x [G, S, E, C]
                          array)
                          Einsum dispatched, Einsum expert      2 x [E, G, C, M]
                          outputs
                          Relu (expert hidden)                  [E, G, C, H]
MoE: combine              Einsum combined, Reshape              2 x [G, S, M]
                          GatherV2, Reshape [B, L, M]           2 x [N, M]
loss                      Einsum logits, Reshape, Sub (z -      4 x [N, Vt]
                          max), Exp (``m4moe.model.losses``)
                          Max                                   [N, 1]
========================  ====================================  =============

The binary dispatch mask's two one-hots are made from integer indices only,
so the tape does not record them (nothing it watches flows in) and they die
after their einsum; the combine array's one-hots meet the differentiable
gates and are kept. ``Reshape`` outputs are counted as tensors of their
own, as the benchmark counts them (TensorFlow's reshape may share its
input's buffer; the benchmark does not assume it). Not listed: scalars and
per-group vectors (a few hundred bytes, not per token): the residual
``m4moe-bench sharding`` leaves against this table, by op type, is in
``results/benchmarks.md`` ("Run 4").

The table holds for the configuration it was derived from: the ``top2``
router with token routing and without No-Token-Left-Behind, the ``einsum``
dispatch, float32 activations, no dropout (dropout's masks and the
bfloat16 casts would add tensors that were not measured), and meshes
without a ``model`` axis (its relayouts were not measured either).
:func:`check_supported` refuses anything else.
"""

from __future__ import annotations

import dataclasses
import math

from m4moe.config import ModelConfig

_FLOAT32 = 4
_INT32 = 4
_BOOL = 1


@dataclasses.dataclass(frozen=True, kw_only=True)
class KeptTensors:
  """One row of the table: ``count`` tensors of ``elements`` each.

  Attributes:
    sub_layer: where in the model (e.g. ``"encoder/layer_norm"``).
    ops: the op types that make them, as in ``activation_bytes_by_op``.
    shape: the shape in glossary letters, e.g. ``"[G, S, E]"``.
    count: how many such tensors in the whole model (instances x tensors).
    elements: elements of one tensor on one device.
    itemsize: bytes per element.
  """

  sub_layer: str
  ops: tuple[str, ...]
  shape: str
  count: int
  elements: int
  itemsize: int = _FLOAT32

  @property
  def bytes(self) -> int:
    return self.count * self.elements * self.itemsize


def check_supported(config: ModelConfig, *, model_axis: int = 1) -> None:
  """Raises ValueError if the table does not describe ``config``'s step."""
  moe = config.moe
  problems = []
  if config.activation_dtype != "float32":
    problems.append(f"--activation_dtype={config.activation_dtype} (use "
                    "float32)")
  for name in ("dropout_rate", "attention_dropout_rate"):
    if getattr(config, name):
      problems.append(f"--{name}={getattr(config, name)} (use 0)")
  if moe.enabled:
    if moe.router != "top2":
      problems.append(f"--router={moe.router} (use top2)")
    if moe.dispatch != "einsum":
      problems.append(f"--dispatch={moe.dispatch} (use einsum)")
    if moe.route_by != "token":
      problems.append(f"--route_by={moe.route_by} (use token)")
    if moe.no_token_left_behind:
      problems.append("--no_token_left_behind (leave it off)")
    if moe.expert_dropout_rate:
      problems.append(f"--expert_dropout_rate={moe.expert_dropout_rate} "
                      "(use 0)")
    if moe.num_shared_experts:
      problems.append(f"--num_shared_experts={moe.num_shared_experts} "
                      "(use 0)")
    if moe.expert_output_mask_rate:
      problems.append(f"--expert_output_mask_rate="
                      f"{moe.expert_output_mask_rate} (use 0)")
  if model_axis != 1:
    problems.append(f"a model axis of {model_axis} (use 1)")
  if problems:
    raise ValueError(
        "the unfused activation table (m4moe/cost/unfused.py) was derived "
        "and measured for the top2 router, the einsum dispatch, float32, no "
        "dropout and no model axis; this setting has " + ", ".join(problems) +
        ": use execution='fused', or change those settings")


def kept_tensors(config: ModelConfig, *, tokens: int, source_length: int,
                 target_length: int) -> tuple[KeptTensors, ...]:
  """The table above for one device holding ``tokens`` source tokens.

  Args:
    config: a configuration :func:`check_supported` accepts.
    tokens: N, source tokens on the device (as many target tokens), whole
      rows: B = N / L rows of each stream.
    source_length, target_length: Ls, Lt.

  Returns:
    The rows, in model order.
  """
  n = tokens
  enc, dec = config.num_encoder_layers, config.num_decoder_layers
  moe_layers = (len(config.moe_layer_indices(enc))
                + len(config.moe_layer_indices(dec)))
  rows = _input_rows(config, tokens=n, source_length=source_length,
                     target_length=target_length)
  rows += _norm_rows(config, tokens=n)
  rows += _attention_rows(config, tokens=n, source_length=source_length,
                          target_length=target_length)
  dense = enc + dec - moe_layers
  if dense:
    rows += [
        KeptTensors(sub_layer="dense_ffn", shape="[N, F]", count=dense,
                    elements=n * config.d_ff, ops=("Relu",)),
        KeptTensors(sub_layer="dense_ffn", shape="[N, M]", count=dense,
                    elements=n * config.d_model, ops=("Einsum",)),
    ]
  if moe_layers:
    rows += _moe_rows(config, tokens=n, layers=moe_layers)
  rows += [
      KeptTensors(sub_layer="loss", shape="[N, Vt]", count=4,
                  elements=n * config.tgt_vocab_size,
                  ops=("Einsum", "Reshape", "Sub", "Exp")),
      KeptTensors(sub_layer="loss", shape="[N, 1]", count=1, elements=n,
                  ops=("Max",)),
  ]
  return tuple(rows)


def _input_rows(config: ModelConfig, *, tokens: int, source_length: int,
                target_length: int) -> list[KeptTensors]:
  """Embeddings, the shifted targets and the attention biases: kept once
  per step, whatever the depth."""
  n, m = tokens, config.d_model
  return [
      KeptTensors(sub_layer="embedding", shape="[N, M]", count=2 * 4,
                  elements=n * m,
                  ops=("ResourceGather", "Mul", "ConcatV2", "AddV2")),
      KeptTensors(sub_layer="decoder/shift_right", shape="<int32>[N]",
                  count=1, elements=n, itemsize=_INT32, ops=("Pad",)),
      KeptTensors(sub_layer="encoder/attention_bias", shape="[B, 1, Ls, Ls]",
                  count=1, elements=n * source_length, ops=("ExpandDims",)),
      KeptTensors(sub_layer="decoder/attention_bias",
                  shape="[B, 1, Lt, Lt] + [B, 1, Lt, Ls]", count=1,
                  elements=n * (target_length + source_length),
                  ops=("ExpandDims",)),
  ]


def _norm_rows(config: ModelConfig, *, tokens: int) -> list[KeptTensors]:
  """Layer norms: two per encoder layer and three per decoder layer, plus
  each stack's final one."""
  enc, dec = config.num_encoder_layers, config.num_decoder_layers
  norms = 2 * enc + 1 + 3 * dec + 1
  return [
      KeptTensors(sub_layer="layer_norm", shape="[N, 1]", count=3 * norms,
                  elements=tokens, ops=("Mean", "Mean", "Rsqrt")),
      KeptTensors(sub_layer="layer_norm", shape="[N, M]", count=5 * norms,
                  elements=tokens * config.d_model,
                  ops=("SquaredDifference", "Sub", "Mul", "Mul", "AddV2")),
  ]


def _attention_rows(config: ModelConfig, *, tokens: int, source_length: int,
                    target_length: int) -> list[KeptTensors]:
  """Attention and residual rows.

  Self-attention over L keys in every layer, cross-attention over Ls keys
  in every decoder layer; q, k, v, q scaled and the context are [N, A, D].
  """
  n, m, a = tokens, config.d_model, config.num_heads
  ad = config.num_heads * config.d_kv
  enc, dec = config.num_encoder_layers, config.num_decoder_layers
  return [
      KeptTensors(sub_layer="attention", shape="[N, A, D]",
                  count=5 * (enc + 2 * dec), elements=n * ad,
                  ops=("Einsum", "Mul", "Einsum", "Einsum", "Einsum")),
      KeptTensors(sub_layer="encoder/self_attention", shape="[B, A, Ls, Ls]",
                  count=2 * enc, elements=n * a * source_length,
                  ops=("Einsum", "Softmax")),
      KeptTensors(sub_layer="decoder/self_attention", shape="[B, A, Lt, Lt]",
                  count=2 * dec, elements=n * a * target_length,
                  ops=("Einsum", "Softmax")),
      KeptTensors(sub_layer="decoder/cross_attention",
                  shape="[B, A, Lt, Ls]", count=2 * dec,
                  elements=n * a * source_length, ops=("Einsum", "Softmax")),
      KeptTensors(sub_layer="attention", shape="[N, M]", count=enc + 2 * dec,
                  elements=n * m, ops=("Einsum",)),
      KeptTensors(sub_layer="residual", shape="[N, M]",
                  count=2 * enc + 3 * dec, elements=n * m, ops=("AddV2",)),
  ]


def _moe_rows(config: ModelConfig, *, tokens: int,
              layers: int) -> list[KeptTensors]:
  """The MoE rows for ``layers`` layers of N = ``tokens`` tokens each."""
  moe = config.moe
  m, n = config.d_model, tokens
  e, k, h = moe.num_experts, moe.top_k, moe.expert_hidden_dim
  # One shard of N tokens cut into G groups of S (MoeLayer._group).
  s = max(1, min(moe.group_size, n))
  g = math.ceil(n / s)
  c = moe.capacity(group_size=s, training=True)
  gs = g * s

  def row(shape: str, count: int, elements: int, ops: tuple[str, ...],
          itemsize: int = _FLOAT32, where: str = "router") -> KeptTensors:
    return KeptTensors(sub_layer=f"moe/{where}", shape=shape,
                       count=layers * count, elements=elements, ops=ops,
                       itemsize=itemsize)

  return [
      row("[N, M]", 2, n * m, ("Reshape", "Reshape"), where="grouping"),
      row("[G, S, M]", 2, gs * m, ("GatherV2", "Reshape"), where="grouping"),
      row("<int32>[N]", 1, n, ("SelectV2",), _INT32, where="grouping"),
      row("<int32>[G, S]", 1, gs, ("GatherV2",), _INT32, where="grouping"),
      row("[G, S]", 1, gs, ("Reshape",), where="grouping"),
      row("[G, S, E]", 13, gs * e,
          ("Einsum", "Softmax", "SelectV2", "OneHot", "OneHot", "Mul", "Mul",
           "ExpandDims", "Mul", "Exp", "LogSoftmax", "Exp", "SelectV2")),
      row("<bool>[G, S, E]", 1, gs * e, ("Greater",), _BOOL),
      row("[G, S]", 12, gs,
          ("Sum", "Sum", "AddV2", "ExpandDims", "ExpandDims", "Max",
           "SelectV2", "Sum", "Log", "AddV2", "Square", "Mul")),
      row("<bool>[G, S]", 2, gs, ("IsFinite", "Greater"), _BOOL),
      row("[G, S, K]", 3, gs * k, ("Sum", "RealDiv", "SelectV2")),
      row("<bool>[G, S, K]", 1, gs * k, ("Pack",), _BOOL),
      row("[G, S, K, E]", 2, gs * k * e, ("OneHot", "Mul")),
      row("[G, S, K, E]", 2, gs * k * e, ("OneHot", "Mul"),
          where="dispatch"),
      row("[G, S, K, 1]", 1, gs * k, ("ExpandDims",), where="dispatch"),
      row("[G, S, K, C]", 1, gs * k * c, ("OneHot",), where="dispatch"),
      row("[G, S, E, C]", 2, gs * e * c, ("Einsum", "Einsum"),
          where="dispatch"),
      row("[E, G, C, M]", 2, e * g * c * m, ("Einsum", "Einsum"),
          where="experts"),
      row("[E, G, C, H]", 1, e * g * c * h, ("Relu",), where="experts"),
      row("[G, S, M]", 2, gs * m, ("Einsum", "Reshape"), where="combine"),
      row("[N, M]", 2, n * m, ("GatherV2", "Reshape"), where="combine"),
  ]


def activation_bytes(config: ModelConfig, *, tokens: int, source_length: int,
                     target_length: int) -> int:
  """Sum of :func:`kept_tensors`: the unfused activations of one device."""
  return sum(row.bytes for row in kept_tensors(
      config, tokens=tokens, source_length=source_length,
      target_length=target_length))
