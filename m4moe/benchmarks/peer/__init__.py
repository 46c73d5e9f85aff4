"""The peer-toolkit yardstick: m4moe vs OpenNMT-tf at equal wall-clock.

``toolkit`` prepares the peer's inputs (its virtualenv, vocabularies,
SentencePiece-tokenised text, model file and run configuration) and turns
both systems' outputs into result records; ``driver`` runs inside the
OpenNMT-tf virtualenv (it imports ``opennmt``, never ours); ``systems``
trains and decodes either system pinned to one core; ``run`` is the absl
app that compares both with fixed recipes on the first test sentences;
``select`` chooses both systems' recipes on a dev set (``selection``: the
dev carve, the candidates, the dev-only ranking) and runs the final
comparison on test sentences no selection read (``final``: its report).
See README.md beside this file and docs/peer.md.
"""
