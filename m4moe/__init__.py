"""m4moe: GShard-style Mixture-of-Experts Transformers for massively
multilingual machine translation in TensorFlow 2.

Package map (one idea per module):

* ``config``: frozen, validated ``ModelConfig``/``MoeConfig``; the zoo.
* ``flagutil``: config dataclasses as absl flags.
* ``errors``: ``ConfigError`` and ``require``, the one validation helper.
* ``rundir``: the run-directory contract (config, vocabulary fingerprint,
  language pairs, checkpoints) read by decode, eval and export.
* ``interfaces``: the typed team contract (model batch, model Protocols).
* ``numerics``: ``NEG_INF`` and ``fold_seed``, shared by every module.
* ``initializers``: the one truncated-normal weight initialiser.
* ``routing``: top-2 (GShard), top-1 (Switch), noisy top-k, expert choice.
* ``dispatch``: the four dispatch paths, their registry and resolver.
* ``moe_layer``: the MoE feed-forward layer and its experts.
* ``layers``: embeddings, attention, layer norm, dense FFN, dropout.
* ``model``: the encoder-decoder Transformer, incremental decoding.
* ``losses``: label-smoothed token cross-entropy.
* ``optimizer``: Adafactor.
* ``routing_analysis``, ``routing_capture``, ``routing_report``: which
  experts each language uses (``m4moe-analyze-routing``).
* ``upcycle``: dense -> MoE upcycling (``m4moe-train --init_from_dense``).
* ``distill``: sparse -> dense distillation (``m4moe-distill``, Switch §4.2).
* ``task_routing``: task-level routing by language (``--route_by=language``).
* ``extraction``: one language's experts only (``m4moe-export --language``).
* ``decoding``: beam and greedy search.
* ``cost``: parameter, FLOP and memory counts from a config.
* ``cost_tables``: the GShard Table 1 per-device analysis over the zoo.
* ``cost_unfused``: the tensors TensorFlow's kernel-by-kernel gradient tape
  keeps, per sub-layer (``cost``'s ``unfused`` execution).
* ``mesh``, ``sharding``: device meshes and GShard sharding annotations.
* ``train``, ``training``: the resumable training loop and its parts.
* ``main_job``: the whole study as resumable stages.
* ``benchmarks``, ``cli``: ``m4moe-bench`` and the console tools.
* ``data`` (:mod:`m4moe.data`), ``eval`` (:mod:`m4moe.eval`): corpus and
  input pipeline; evaluation and reports. ``configs``: the zoo flagfiles.

Shape letters, one meaning each across the package (G, S, E, C, M, H and N
as in the GShard paper). Shapes are written ``<dtype>[B, L, M]``; module
cheat sheets use these letters only:

  B   batch rows (sentences)
  L   sequence length of the tensor at hand
  Ls  source sequence length
  Lt  target sequence length
  Ld  decoding length (max_decode_length, the decoder cache's length)
  Q   attention query length
  U   attention key (memory) length
  M   model width (d_model)
  A   attention heads
  D   key/value width per head (d_kv)
  F   dense feed-forward hidden width (d_ff)
  V   vocabulary size
  Vs  source vocabulary size
  Vt  target vocabulary size
  W   beams (beam width)
  N   tokens of an MoE layer call (N = B*L)
  G   groups (local group dispatching)
  S   group size, tokens per group
  E   experts
  C   expert capacity, buffer slots per expert per group
  H   expert hidden width
  K   expert choices per token (top2: 2, top1: 1, noisy_topk: k)
  T   choices of a call (T = G*S*K)
  X   expert-homogeneous blocks (block dispatch)
  R   rows per block (block dispatch)
  P   rows of a gathered table (E*G*C buffer rows, or T sorted rows)
"""

__version__ = "0.1.0"
