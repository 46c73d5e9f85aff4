"""Training machinery behind :mod:`m4moe.training.loop` and ``m4moe-train``.

* ``loop``: the training loop: Adafactor steps, exact resume, preemption
  safety, metrics.
* ``step``: loss, gradients (with accumulation and optional
  rematerialisation), the non-finite guard and the update.
* ``optimizer``: Adafactor over plain ``tf.Variable``s.
* ``remat``: per-layer rematerialisation as a layer option.
* ``inputs``: training and dev inputs from a corpus, TFDS or synthetic
  data.
* ``synthetic``: the synthetic parallel data of ``--synthetic_data`` (and
  of the tests).
* ``distribute``: single device / Mirrored / TPU strategy.
* ``rundir``: the run directory's layout and the reading of its
  ``config.json`` (what decode, eval and export load).
* ``checkpointing``: writing the effective config JSON, checkpoint manager
  with crash-safe resume, SIGTERM handling.
* ``metrics``: TensorBoard summaries and console lines.
* ``metrics_log``: the JSONL metrics log, its writer and its one reader.
* ``averaging``: the element-wise mean of a run's last checkpoints.
* ``continuation``: a finished run continued in a new directory.
* ``distill``: sparse -> dense distillation (``m4moe-distill``).
"""
