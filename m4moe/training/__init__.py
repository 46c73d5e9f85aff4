"""Training machinery behind :mod:`m4moe.training.loop` and ``m4moe-train``.

* :mod:`m4moe.training.rundir` -- the run directory's layout and the reading
  of its ``config.json`` (what decode, eval and export load).
* :mod:`m4moe.training.checkpointing` -- writing the effective config JSON,
  checkpoint manager with crash-safe resume, SIGTERM handling.
* :mod:`m4moe.training.step` -- loss, gradients (with accumulation and
  optional rematerialisation), the non-finite guard and the update.
* :mod:`m4moe.training.metrics` -- TensorBoard summaries, the JSONL metrics
  log and console lines.
* :mod:`m4moe.training.distribute` -- single device / Mirrored / TPU strategy.
* :mod:`m4moe.training.synthetic` -- the synthetic parallel data of
  ``--synthetic_data`` (and of the tests).
* :mod:`m4moe.training.toy_model` -- a tiny stand-in model for testing the
  trainer.
"""
