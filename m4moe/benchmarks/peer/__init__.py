"""The peer-toolkit yardstick: m4moe vs OpenNMT-tf.

* ``toolkit``: the peer's inputs (its virtualenv, vocabularies,
  SentencePiece-tokenised text, model file and run configuration), and
  both systems' outputs as result records.
* ``driver``: runs inside the OpenNMT-tf virtualenv (it imports
  ``opennmt``, never ours).
* ``systems``: trains and decodes either system pinned to one core, with
  the one decoding config of both (``Decoding``).
* ``schedules``: learning-rate schedules stated for the run's planned
  steps, and the check of what a run did of its schedule.
* ``throughput``: target tokens per second of training-step time, one
  definition for both systems' logs.
* ``run``: the absl app that compares both with fixed recipes on the first
  test sentences, at equal wall-clock.
* ``candidates``: the recipes screened, equal rounds and counts per system.
* ``selection``: the dev carve, the records, the dev-only ranking.
* ``runs``: one candidate run (train, check the schedule, decode).
* ``select``: chooses both systems' recipes on the dev set at one token
  budget and runs the final comparison at the same budget.
* ``final_runs``: the final comparison's runs.
* ``final``: the final comparison's report.

See README.md beside this file and docs/peer.md.
"""
