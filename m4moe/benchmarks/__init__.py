"""Benchmarks behind ``m4moe-bench``, one module per sub-benchmark.

* ``moe_layer``: the MoE layer's forward and backward vs a dense FFN of
  the same useful FLOPs, per dispatch path.
* ``train_step``: tokens/s of the real trainer's step, tiny MoE vs dense
  or a recipe's models.
* ``loss``: seconds of the training loss, one-pass vs log-softmax
  cross-entropy.
* ``dropout``: seconds of the trainer step with 16-bit vs float32-uniform
  dropout masks.
* ``decode``: cached incremental beam search vs re-running the decoder.
* ``input_pipeline``: the input pipeline's throughput against the step's.
* ``sharding``: per-device memory of the sharded training step as E and D
  grow.
* ``peak_rss``: peak resident memory of a command, and its phase.
* ``profile``: per-op profiles of a benchmark case.
* ``timing``: interleaved timing and the JSON lines every benchmark prints.
* ``peer``: m4moe vs OpenNMT-tf at equal wall-clock (its own subpackage).
"""
