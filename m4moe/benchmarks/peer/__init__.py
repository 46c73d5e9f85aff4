"""The peer-toolkit yardstick: m4moe vs OpenNMT-tf at equal wall-clock.

``toolkit`` prepares the peer's inputs (its virtualenv, vocabularies,
SentencePiece-tokenised text, model file and run configuration) and turns
both systems' outputs into result records; ``driver`` runs inside the
OpenNMT-tf virtualenv (it imports ``opennmt``, never ours); ``run`` is the
absl app that trains and decodes both systems side by side and scores them
with ``m4moe.eval``. See README.md beside this file.
"""
