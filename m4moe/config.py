"""Model configuration: frozen, validated dataclasses built from absl flags.

Every field of :class:`MoeConfig` and :class:`ModelConfig` is also an absl
flag of the same name (:mod:`m4moe.flagutil`, as for every config
dataclass), so a zoo entry under ``configs/`` is a plain absl
flagfile (``--d_model=1024`` ...). A bad value fails at construction with a
:class:`ConfigError` that names the flag and says how to fix it.

Two ways to get a config:

* In an absl app: call :func:`define_model_flags` at import time, then
  :func:`model_config_from_flags` on ``absl.flags.FLAGS`` in ``main``.
* Anywhere else (tests, ``m4moe-info``): :func:`load_model_config` parses a
  flagfile (or a named zoo entry such as ``"tiny/moe"``) into a config with a
  private :class:`absl.flags.FlagValues`, touching no global state;
  :func:`load_optimizer_config` reads the optimiser recipe of the same file.
  This module is the only parser of zoo flagfiles.
"""

from __future__ import annotations

import dataclasses
import fractions
import importlib.resources
import math
import os
import pathlib
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from absl import flags

from m4moe import errors
from m4moe import flagutil
from m4moe.errors import ConfigError

if TYPE_CHECKING:
  from m4moe.training import optimizer as optimizer_lib

ROUTERS = ("top2", "top1", "topk", "noisy_topk", "expert_choice")
SECOND_EXPERT_POLICIES = ("random", "all", "sampling")
DISPATCH_IMPLEMENTATIONS = ("einsum", "index", "sorted")
ROUTE_BY = ("token", "language")
# Routers that support --bias_balancing_rate (a selection bias per expert).
BIAS_BALANCED_ROUTERS = ("topk", "top1", "top2")
ACTIVATION_DTYPES = ("float32", "bfloat16")


_require = errors.require


@dataclasses.dataclass(frozen=True, kw_only=True)
class MoeConfig:
  """Mixture-of-Experts settings shared by every MoE layer of a model.

  Attributes:
    num_experts: E, experts per MoE layer. 0 makes every FFN dense.
    expert_hidden_dim: H, hidden width of each expert's FFN.
    moe_layer_interval: every ``interval``-th FFN layer is an MoE layer.
    moe_layer_offset: layer ``i`` (0-based, per stack) is MoE iff
      ``i % interval == offset``; GShard's "every other layer" is (2, 1).
    router: one of ``top2`` (GShard Algorithm 1), ``top1`` (Switch),
      ``topk`` (GShard's rule for any k), ``noisy_topk`` (Shazeer et al.
      2017), ``expert_choice`` (encoder only).
    num_selected_experts: k for ``topk`` and ``noisy_topk`` (top2 uses 2,
      top1 uses 1).
    second_expert_policy: top2 only: ``random`` (dispatch iff 2*g2 > U(0,1),
      the paper's), ``all`` (always) or ``sampling`` (sample e2 from the gates).
    group_size: S, tokens per dispatch group (local group dispatching).
    train_capacity_factor: capacity C = factor * k * S / E while training;
      0 means dropless training (C = S: no token is ever dropped; only with
      ``--dispatch=sorted``, whose expert matmuls run on the dispatched
      rows only, so the no-drop capacity costs no padding).
    eval_capacity_factor: the same at eval/inference; 0 means no-drop
      (C = S, so no token is ever dropped and outputs do not depend on what
      else shares the group).
    aux_loss_weight: multiplier of the load-balancing loss.
    z_loss_weight: multiplier of the router z-loss (0 disables it).
    router_jitter: multiplicative jitter U(1-eps, 1+eps) on router inputs
      while training (Switch; 0 disables it).
    expert_dropout_rate: dropout on the expert hidden activations, separate
      from the model's dropout.
    no_token_left_behind: re-route overflowed tokens to their next-best
      expert with room (Switch Transformer appendix).
    dispatch: ``sorted`` (expert-sorted rows, no padding; not under XLA),
      ``index`` (gathers into capacity buffers, O(S*k*M); XLA) or
      ``einsum`` (Algorithm 2 one-hot einsums, O(S*E*C*M)). ``sorted`` is
      fastest on CPU (the default). Two more paths are chosen for a layer
      call, never requested: ``grouped_index`` (per-group gathers) for
      ``index`` and ``sorted`` on a mesh with a token-choice router, and
      ``block`` for ``index`` with few tokens and a large capacity; a call
      runs ``index`` for ``sorted`` with the expert-choice router or under
      XLA sharding, and ``einsum`` on a DTensor mesh otherwise. See
      docs/design/dispatch.md.
    route_by: ``token`` (each token's router input is its activation) or
      ``language`` (task-level routing, Kudugunta et al. 2021: every token of
      a sentence pair is routed by the pair's language through a learned
      per-language gate, so one language uses a fixed set of experts and
      ``m4moe-export --language`` can extract them; see
      :mod:`m4moe.moe.task_routing`). ``language`` needs a token-choice router
      and ``--eval_capacity_factor=0``.
    routing_languages: the languages of the per-language gate rows, in row
      order (``route_by=language``); m4moe-train sets them to the training
      languages, sorted (leave empty).
    expert_init_scale: init scale of the router's ``wg`` and the experts'
      ``wi``/``wo`` (sigma = sqrt(scale / fan_in)); 0 uses the model's
      ``init_scale``. An ablation knob: 0.7737 x init_scale draws the
      router and expert weights 0.8796x narrower (what a truncated normal
      drawn at the nominal sigma, without the correction in
      :mod:`m4moe.model.initializers`, realises), to measure how much that
      width matters.

  Layer features (``docs/moe_layer_features.md``):
    num_shared_experts: always-on FFN experts beside the routed ones
      (DeepSeekMoE's shared experts, DeepSpeed's Residual-MoE); their output
      is added to the routed experts' combined output for every real token.
    shared_expert_hidden_dim: hidden width of each shared expert; 0 uses
      ``expert_hidden_dim``.
    expert_output_mask_rate: expert output masking (NLLB-200): while
      training, each real token's whole MoE output (routed plus shared) is
      zeroed with this probability and kept tokens are scaled by
      1/(1 - rate); separate from ``expert_dropout_rate``.
    expert_output_scale: a constant multiplying the routed experts'
      combined output (before the shared experts are added; 1: GShard's
      combine). The MoE's side of ``ModelConfig.ffn_output_scale``: with
      renormalised gates the routed output is already a gate-weighted
      mean, so tuning a dense FFN's scale calls for tuning this one too.

  Router techniques (``docs/moe_techniques.md``):
    renormalize_combine_weights: ``topk`` only: a token's combine weights
      are its k chosen gates divided by their sum (GShard; True) or the raw
      softmax gates (Switch, DeepSeek-V2; False). See docs/moe_techniques.md.
    batch_prioritized_routing: token-choice routers: within a group, tokens
      take buffer positions in descending order of their largest router
      probability instead of token order (V-MoE), for every choice rank.
    bias_balancing_rate: auxiliary-loss-free load balancing (Wang et al.
      2024, DeepSeek-V3) for ``topk``, ``top1`` and ``top2``: a per-expert
      bias added to the gates for selection only, moved by this rate times
      the sign of the load error after every training step; 0 disables it.
  """

  num_experts: int = 0
  expert_hidden_dim: int = 256
  moe_layer_interval: int = 2
  moe_layer_offset: int = 1
  router: str = dataclasses.field(
      default="top2", metadata=flagutil.metadata(enum=ROUTERS))
  num_selected_experts: int = 2
  second_expert_policy: str = dataclasses.field(
      default="random", metadata=flagutil.metadata(enum=SECOND_EXPERT_POLICIES))
  group_size: int = 1024
  train_capacity_factor: float = 1.25
  eval_capacity_factor: float = 0.0
  aux_loss_weight: float = 1e-2
  z_loss_weight: float = 0.0
  router_jitter: float = 0.0
  expert_dropout_rate: float = 0.0
  no_token_left_behind: bool = False
  dispatch: str = dataclasses.field(
      default="sorted", metadata=flagutil.metadata(enum=DISPATCH_IMPLEMENTATIONS))
  route_by: str = dataclasses.field(
      default="token", metadata=flagutil.metadata(enum=ROUTE_BY))
  routing_languages: tuple[str, ...] = ()
  expert_init_scale: float = 0.0
  # --- Layer features (shared experts, expert output masking). ---
  num_shared_experts: int = 0
  shared_expert_hidden_dim: int = 0
  expert_output_mask_rate: float = 0.0
  expert_output_scale: float = 1.0
  # --- Router techniques (docs/moe_techniques.md). ---
  renormalize_combine_weights: bool = True
  batch_prioritized_routing: bool = False
  bias_balancing_rate: float = 0.0

  def __post_init__(self) -> None:
    # From config.json the languages come back as a list.
    object.__setattr__(self, "routing_languages",
                       tuple(self.routing_languages))
    _require(self.num_experts >= 0, "num_experts", self.num_experts,
             "use 0 for a dense model or a positive expert count")
    _require(self.expert_hidden_dim > 0, "expert_hidden_dim",
             self.expert_hidden_dim, "use a positive width")
    _require(self.moe_layer_interval >= 1, "moe_layer_interval",
             self.moe_layer_interval, "use 1 (every layer) or more")
    _require(0 <= self.moe_layer_offset < self.moe_layer_interval,
             "moe_layer_offset", self.moe_layer_offset,
             f"use a value in [0, --moe_layer_interval={self.moe_layer_interval})")
    _require(self.router in ROUTERS, "router", self.router,
             f"choose one of {', '.join(ROUTERS)}")
    _require(self.second_expert_policy in SECOND_EXPERT_POLICIES,
             "second_expert_policy", self.second_expert_policy,
             f"choose one of {', '.join(SECOND_EXPERT_POLICIES)}")
    _require(self.dispatch in DISPATCH_IMPLEMENTATIONS, "dispatch",
             self.dispatch, f"choose one of {', '.join(DISPATCH_IMPLEMENTATIONS)}")
    _require(self.group_size >= 1, "group_size", self.group_size,
             "use a positive number of tokens per group")
    _require(self.train_capacity_factor >= 0, "train_capacity_factor",
             self.train_capacity_factor,
             "use a positive factor (1.0-2.0 is usual) or 0 (dropless)")
    _require(self.eval_capacity_factor >= 0, "eval_capacity_factor",
             self.eval_capacity_factor, "use 0 for no-drop or a positive factor")
    for name in ("aux_loss_weight", "z_loss_weight", "router_jitter"):
      value = getattr(self, name)
      _require(value >= 0, name, value, "use a non-negative value")
    _require(self.expert_init_scale >= 0, "expert_init_scale",
             self.expert_init_scale,
             "use 0 (the model's --init_scale) or a positive scale")
    _require(0 <= self.expert_dropout_rate < 1, "expert_dropout_rate",
             self.expert_dropout_rate, "use a rate in [0, 1)")
    _require(self.route_by in ROUTE_BY, "route_by", self.route_by,
             f"choose one of {', '.join(ROUTE_BY)}")
    if self.route_by == "language":
      self._check_language_routing()
    self._check_layer_features()
    if self.num_experts:
      k = self.top_k
      _require(1 <= k <= self.num_experts, "num_selected_experts",
               self.num_selected_experts,
               f"k must be in [1, --num_experts={self.num_experts}]")
      _require(not (self.router == "top2" and self.num_experts < 2),
               "num_experts", self.num_experts,
               "top2 routing needs at least 2 experts; use --router=top1")
    self._check_router_techniques()

  def _check_router_techniques(self) -> None:
    """Validation of the router-technique flags (docs/moe_techniques.md)."""
    _require(self.renormalize_combine_weights or self.router == "topk",
             "renormalize_combine_weights", self.renormalize_combine_weights,
             f"--router={self.router} has a fixed combine rule; "
             "--norenormalize_combine_weights applies to --router=topk only")
    _require(not (self.router == "topk" and self.num_experts and
                  self.num_selected_experts == 1 and
                  self.renormalize_combine_weights),
             "renormalize_combine_weights", self.renormalize_combine_weights,
             "with --num_selected_experts=1 the renormalised weight is always "
             "1, so the router gets no gradient from the model loss; use "
             "--norenormalize_combine_weights (Switch's raw gate)")
    _require(not (self.batch_prioritized_routing and
                  self.router == "expert_choice"),
             "batch_prioritized_routing", self.batch_prioritized_routing,
             "experts pick tokens under --router=expert_choice, there is no "
             "token order to prioritise; use a token-choice --router")
    rate = self.bias_balancing_rate
    _require(rate >= 0 and math.isfinite(rate), "bias_balancing_rate", rate,
             "use 0 (off) or a small positive rate such as 1e-3")
    _require(rate == 0 or self.router in BIAS_BALANCED_ROUTERS,
             "bias_balancing_rate", rate,
             f"--router={self.router} does not support the selection bias; "
             f"use --router={' or '.join(BIAS_BALANCED_ROUTERS)} or "
             "--bias_balancing_rate=0")
    _require(rate == 0 or self.router != "top2" or
             self.second_expert_policy != "sampling",
             "bias_balancing_rate", rate,
             "--second_expert_policy=sampling samples the second expert from "
             "the unbiased gates; use --second_expert_policy=all or random")

  def _check_layer_features(self) -> None:
    """Layer features: shared experts, output masking, dropless training."""
    _require(self.num_shared_experts >= 0, "num_shared_experts",
             self.num_shared_experts,
             "use 0 (no shared expert) or a positive count")
    _require(self.shared_expert_hidden_dim >= 0, "shared_expert_hidden_dim",
             self.shared_expert_hidden_dim,
             "use 0 (the routed experts' --expert_hidden_dim) or a positive "
             "width")
    _require(0 <= self.expert_output_mask_rate < 1, "expert_output_mask_rate",
             self.expert_output_mask_rate, "use a rate in [0, 1)")
    _require(self.expert_output_scale > 0, "expert_output_scale",
             self.expert_output_scale,
             "use a positive factor (1.0: GShard's combine)")
    if self.train_capacity_factor == 0:
      _require(self.dispatch == "sorted", "train_capacity_factor",
               self.train_capacity_factor,
               f"dropless training (0) needs --dispatch=sorted: the "
               f"--dispatch={self.dispatch} buffers would be C = S slots per "
               "expert (E/k times the useful rows); use --dispatch=sorted or "
               "a positive factor")
      _require(self.router != "expert_choice", "train_capacity_factor",
               self.train_capacity_factor,
               "dropless training (0) is for token-choice routers; with "
               "--router=expert_choice, C = S makes every expert take every "
               "token; use a positive factor")

  @property
  def shared_hidden_dim(self) -> int:
    """Hidden width of one shared expert (``expert_hidden_dim`` if 0)."""
    return self.shared_expert_hidden_dim or self.expert_hidden_dim

  @property
  def dropless(self) -> bool:
    """True for dropless training (``--train_capacity_factor=0``)."""
    return self.train_capacity_factor == 0

  def _check_language_routing(self) -> None:
    _require(self.router != "expert_choice", "route_by", self.route_by,
             "language routing sends all of a language's tokens to the same "
             "experts, so experts cannot choose among them; use a "
             "token-choice --router (top2, top1, topk or noisy_topk) or "
             "--route_by=token")
    _require(self.eval_capacity_factor == 0, "eval_capacity_factor",
             self.eval_capacity_factor,
             "--route_by=language sends every token of a sentence to the "
             "same experts, so any eval capacity below the sentence length "
             "drops tokens (and a per-language export, which has no "
             "capacity, could not equal the model); use "
             "--eval_capacity_factor=0 (no-drop)")
    languages = self.routing_languages
    _require(all(isinstance(l, str) and l and "," not in l
                 for l in languages), "routing_languages", languages,
             "give non-empty language codes without commas")
    duplicates = sorted({l for l in languages if languages.count(l) > 1})
    _require(not duplicates, "routing_languages", languages,
             f"list each language once (repeated: {', '.join(duplicates)})")

  @property
  def enabled(self) -> bool:
    return self.num_experts > 0

  @property
  def router_input_dim(self) -> int | None:
    """Width of the router input: the number of routing languages with
    ``route_by=language`` (a one-hot, so ``wg`` is the per-language gate),
    else None (the model width)."""
    if self.route_by == "language":
      return len(self.routing_languages)
    return None

  def language_index(self, language: str) -> int:
    """Row of ``language`` in the per-language gate (``route_by=language``).

    Raises:
      ConfigError: not a language routing model, or an unknown language.
    """
    if self.route_by != "language":
      raise ConfigError(
          f"--route_by={self.route_by}: this model routes tokens, not "
          "languages, so it has no per-language routing")
    if language not in self.routing_languages:
      raise ConfigError(
          f"language {language!r} has no row in the per-language gate "
          f"(routing languages: {', '.join(self.routing_languages) or 'none'}"
          "); use one of them")
    return self.routing_languages.index(language)

  @property
  def top_k(self) -> int:
    """Experts each token is sent to (expert_choice: average per token)."""
    if self.router == "top2":
      return 2
    if self.router == "top1":
      return 1
    return self.num_selected_experts

  def capacity(self, *, group_size: int, training: bool) -> int:
    """C, expert capacity per group: ceil(factor * k * S / E) in [1, S].

    The only place capacity is computed (routers, the MoE layer and the cost
    model all call it). The factor is taken as the decimal it is written as
    (``Fraction(str(1.1)) == 11/10``) and the product is rational, so an
    exact integer such as 1.1 * 2 * 25 / 5 = 11 is not rounded up to 12 by
    float error. A factor of 0 (``eval_capacity_factor`` at eval, or
    dropless ``train_capacity_factor`` in training) gives S (no drops).

    Args:
      group_size: S, tokens per group (>= 1).
      training: use ``train_capacity_factor`` (else the eval factor).

    Raises:
      ValueError: if ``group_size < 1``.
    """
    if group_size < 1:
      raise ValueError(f"capacity(group_size={group_size}) needs a group of "
                       "at least one token")
    factor = self.train_capacity_factor if training else self.eval_capacity_factor
    if factor == 0:
      return group_size
    raw = (fractions.Fraction(str(factor)) * self.top_k * group_size /
           self.num_experts)
    return max(1, min(group_size, math.ceil(raw)))

  def is_moe_layer(self, layer_index: int) -> bool:
    return (self.enabled and
            layer_index % self.moe_layer_interval == self.moe_layer_offset)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelConfig:
  """Transformer encoder-decoder hyper-parameters (paper Appendix A.2 names).

  Attributes:
    src_vocab_size: multilingual source vocabulary (paper: 64k).
    tgt_vocab_size: target vocabulary (paper: 32k English).
    d_model: M, model width.
    num_heads: attention heads.
    d_kv: key/value width per head (paper: 128, independent of d_model).
    d_ff: hidden width of the dense feed-forward layers.
    num_encoder_layers, num_decoder_layers: layers of each stack ("36L" is
      18 + 18).
    dropout_rate: dropout on inputs and residual branches.
    attention_dropout_rate: dropout on attention probabilities.
    activation_dtype: ``float32`` or ``bfloat16`` activations; weights, the
      router and the loss stay float32.
    init_scale: truncated-normal init with sigma = sqrt(init_scale / fan_in)
      (Switch recommends 0.1).
    ffn_output_scale: a constant multiplying the output of every dense
      (not MoE, not shared-expert) feed-forward layer (1: the plain FFN). A control, not a recipe default:
      an MoE whose k of E experts share the dense FFN's hidden units
      weights each expert's output by a gate that sums to 1 over the k, so
      with top-E it is the dense FFN with each block scaled by about 1/E;
      the dense FFN at ``1/E`` separates that scale from the per-token
      choice of the gates.
    max_length: longest sequence the positional encoding is built for.
    moe: the Mixture-of-Experts settings.
  """

  src_vocab_size: int = 8000
  tgt_vocab_size: int = 8000
  d_model: int = 128
  num_heads: int = 4
  d_kv: int = 32
  d_ff: int = 512
  num_encoder_layers: int = 2
  num_decoder_layers: int = 2
  dropout_rate: float = 0.1
  attention_dropout_rate: float = 0.1
  activation_dtype: str = dataclasses.field(
      default="float32", metadata=flagutil.metadata(enum=ACTIVATION_DTYPES))
  init_scale: float = 1.0
  ffn_output_scale: float = 1.0
  max_length: int = 512
  moe: MoeConfig = dataclasses.field(default_factory=MoeConfig)

  def __post_init__(self) -> None:
    for name in ("src_vocab_size", "tgt_vocab_size", "d_model", "num_heads",
                 "d_kv", "d_ff", "max_length"):
      value = getattr(self, name)
      _require(value > 0, name, value, "use a positive integer")
    for name in ("num_encoder_layers", "num_decoder_layers"):
      value = getattr(self, name)
      _require(value >= 1, name, value, "use at least one layer")
    for name in ("dropout_rate", "attention_dropout_rate"):
      value = getattr(self, name)
      _require(0 <= value < 1, name, value, "use a rate in [0, 1)")
    _require(self.activation_dtype in ACTIVATION_DTYPES, "activation_dtype",
             self.activation_dtype, f"choose one of {', '.join(ACTIVATION_DTYPES)}")
    _require(self.init_scale > 0, "init_scale", self.init_scale,
             "use a positive scale (1.0 is standard, Switch uses 0.1)")
    _require(self.ffn_output_scale > 0, "ffn_output_scale",
             self.ffn_output_scale,
             "use a positive factor (1.0: the plain feed-forward layer)")

  @property
  def moe_init_scale(self) -> float:
    """Init scale of the router and expert weights (``moe.expert_init_scale``,
    else ``init_scale``)."""
    return self.moe.expert_init_scale or self.init_scale

  @property
  def num_layers(self) -> int:
    """L as the paper counts it: encoder plus decoder layers."""
    return self.num_encoder_layers + self.num_decoder_layers

  def moe_layer_indices(self, num_layers: int) -> tuple[int, ...]:
    """Indices of the MoE layers in a stack of ``num_layers`` layers."""
    return tuple(i for i in range(num_layers) if self.moe.is_moe_layer(i))

  def to_dict(self) -> dict[str, Any]:
    return dataclasses.asdict(self)

  def to_flags(self) -> list[str]:
    """The config as absl flag strings, loadable with :func:`load_model_config`."""
    return flagutil.to_flags(self)


def define_model_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
  """Defines one absl flag per config field on ``flag_values`` (idempotent;
  :func:`m4moe.flagutil.define_flags` of :class:`ModelConfig`)."""
  flagutil.define_flags(ModelConfig, flag_values)


def model_config_from_flags(
    flag_values: flags.FlagValues = flags.FLAGS,
    **overrides: Any) -> ModelConfig:
  """Builds a validated :class:`ModelConfig` from parsed flags.

  Args:
    flag_values: parsed flags on which :func:`define_model_flags` was called.
    **overrides: field values that win over the flags (e.g. vocabulary sizes
      read from the trained SentencePiece models).
  """
  return flagutil.from_flags(ModelConfig, flag_values, **overrides)


def present_model_flags(flag_values: flags.FlagValues = flags.FLAGS
                        ) -> list[str]:
  """The model flags given explicitly, serialised (``["--num_experts=32"]``).

  Tools that take ``--config=NAME`` apply these on top of the file, so a
  command-line flag always wins over the zoo entry.
  """
  return flagutil.present_flags(ModelConfig, flag_values)


def config_from_dict(values: Mapping[str, Any]) -> ModelConfig:
  """Inverse of :meth:`ModelConfig.to_dict` (e.g. from a checkpoint's JSON)."""
  values = dict(values)
  moe = MoeConfig(**values.pop("moe", {}))
  return ModelConfig(moe=moe, **values)


def resolve_config_path(name_or_path: str | os.PathLike[str]) -> pathlib.Path:
  """Finds a flagfile: an existing path, or a zoo name such as ``tiny/moe``.

  Zoo names are looked up in the installed ``m4moe.configs`` package (the
  repository's ``configs/`` directory).

  Raises:
    ConfigError: if neither exists; lists the zoo entries.
  """
  path = pathlib.Path(name_or_path)
  if path.is_file():
    return path
  zoo = pathlib.Path(str(importlib.resources.files("m4moe.configs")))
  candidate = zoo / (str(name_or_path).removesuffix(".flags") + ".flags")
  if candidate.is_file():
    return candidate
  known = sorted(str(p.relative_to(zoo).with_suffix(""))
                 for p in zoo.rglob("*.flags"))
  raise ConfigError(
      f"config {str(name_or_path)!r} is neither a file nor a zoo entry; "
      f"pass a flagfile path or one of: {', '.join(known)}")


def _parse_zoo_flagfile(name_or_path: str | os.PathLike[str],
                        extra_flags: Sequence[str]
                        ) -> tuple[pathlib.Path, flags.FlagValues]:
  """Parses a zoo entry (or flagfile) with ``extra_flags`` on top.

  A zoo entry holds model flags and, optionally, the optimiser recipe it was
  tuned with, so both sets of flags are defined: either loader accepts the
  whole file. A private FlagValues keeps tests and libraries off the global
  flags.

  Returns:
    (the flagfile's path, the parsed flag values).

  Raises:
    ConfigError: the file is missing or has an unknown flag or a bad value.
  """
  # Imported here, not at the top: the optimiser imports TensorFlow, and this
  # module stays importable without it (m4moe-run, m4moe-report, m4moe-info
  # start without loading TensorFlow).
  from m4moe.training import optimizer  # pylint: disable=g-import-not-at-top
  path = resolve_config_path(name_or_path)
  flag_values = flags.FlagValues()
  define_model_flags(flag_values)
  optimizer.define_flags(flag_values)
  try:
    flag_values(["m4moe", f"--flagfile={path}", *extra_flags])
  except flags.Error as e:
    raise ConfigError(f"{path}: {e}") from e
  return path, flag_values


def load_model_config(name_or_path: str | os.PathLike[str],
                      extra_flags: Sequence[str] = (),
                      **overrides: Any) -> ModelConfig:
  """Parses a flagfile (path or zoo name) into a validated ModelConfig.

  Uses a private FlagValues, so it is safe to call from tests and libraries.
  ``extra_flags`` (e.g. ``["--num_experts=8"]``) are applied after the file.

  Raises:
    ConfigError: the file is missing, has an unknown flag, or a bad value.
  """
  _, flag_values = _parse_zoo_flagfile(name_or_path, extra_flags)
  return model_config_from_flags(flag_values, **overrides)


def peek_model_config(name_or_path: str | os.PathLike[str],
                      extra_flags: Sequence[str] = ()) -> ModelConfig:
  """The model a zoo entry (or flagfile) with ``extra_flags`` builds, read
  without TensorFlow.

  Only the model flags are parsed; every other flag (the entry's optimiser
  recipe, training flags among ``extra_flags``) is skipped unchecked, so
  this is for looking at a model before training it (``m4moe-run``
  validating a recipe), not for checking a command line:
  :func:`load_model_config` is.

  Raises:
    ConfigError: the file is missing or a model flag has a bad value.
  """
  path = resolve_config_path(name_or_path)
  flag_values = flags.FlagValues()
  define_model_flags(flag_values)
  try:
    flag_values(["m4moe", f"--flagfile={path}", *extra_flags],
                known_only=True)
  except flags.Error as e:
    raise ConfigError(f"{path}: {e}") from e
  return model_config_from_flags(flag_values)


def load_optimizer_config(name_or_path: str | os.PathLike[str],
                          extra_flags: Sequence[str] = ()
                          ) -> optimizer_lib.AdafactorConfig:
  """The optimiser recipe of a zoo entry (or flagfile), ``extra_flags`` on top.

  ``configs/tiny/*`` carry the small-model recipe, ``configs/gshard/*`` the
  paper's Adafactor; optimiser flags an entry does not set keep
  :class:`m4moe.training.optimizer.AdafactorConfig`'s defaults (the paper's).

  Raises:
    ConfigError: unknown flag or bad value, naming the file.
  """
  from m4moe.training import optimizer  # pylint: disable=g-import-not-at-top
  path, flag_values = _parse_zoo_flagfile(name_or_path, extra_flags)
  try:
    return optimizer.config_from_flags(flag_values)
  except errors.ConfigError as e:
    raise ConfigError(f"{path}: {e}") from e
