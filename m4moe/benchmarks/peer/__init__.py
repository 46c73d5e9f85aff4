"""The peer-toolkit yardstick: m4moe vs OpenNMT-tf at equal wall-clock.

* ``toolkit``: the peer's inputs (its virtualenv, vocabularies,
  SentencePiece-tokenised text, model file and run configuration), and
  both systems' outputs as result records.
* ``driver``: runs inside the OpenNMT-tf virtualenv (it imports
  ``opennmt``, never ours).
* ``systems``: trains and decodes either system pinned to one core.
* ``run``: the absl app that compares both with fixed recipes on the first
  test sentences.
* ``selection``: the dev carve, the candidates and the dev-only ranking.
* ``select``: chooses both systems' recipes on the dev set and runs the
  final comparison on test sentences no selection read.
* ``final``: the final comparison's report.

See README.md beside this file and docs/peer.md.
"""
