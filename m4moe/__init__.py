"""m4moe: GShard-style Mixture-of-Experts Transformers for massively
multilingual machine translation in TensorFlow 2.

Package map (one subpackage per idea; the modules at the root are used
by several subpackages, so they sit below all of them):

* ``config``: frozen, validated ``ModelConfig``/``MoeConfig``; the zoo.
* ``flagutil``: config dataclasses as absl flags.
* ``errors``: ``ConfigError`` and ``require``, the one validation helper;
  the one-line account of a full disk.
* ``jsonfile``: the one reader of the JSON files tools pass each other,
  and the rule for the paths in them (relative, never a machine's).
* ``run_lock``: one writer per directory (the trainer's run, the corpus,
  the main job's run directory), an advisory lock with its owner's record.
* ``moe``: routers, dispatch paths, the MoE layer and its experts, task
  routing, upcycling.
* ``model``: the encoder-decoder Transformer, its layers, losses,
  initialisers, interfaces and shared numerics.
* ``inference``: beam and greedy search; one-language expert extraction.
* ``training``: the resumable training loop, Adafactor, the run directory,
  checkpointing, inputs, averaging, distillation.
* ``parallel``: device meshes and GShard sharding annotations.
* ``cost``: parameter, FLOP, memory and communication counts from a config.
* ``analysis``: which experts each language uses (``m4moe-analyze-routing``).
* ``pipeline``: the main job (``m4moe-run``) as resumable stages.
* ``benchmarks``: what ``m4moe-bench`` measures.
* ``cli``: the console tools, one module each.
* ``data`` (the repository's ``data/``): corpus and input pipeline.
* ``eval`` (the repository's ``eval/``): evaluation and reports.
* ``configs`` (the repository's ``configs/``): the zoo flagfiles.

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
