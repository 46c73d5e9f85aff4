"""The encoder-decoder Transformer and the parts it is built from.

* ``transformer``: the encoder-decoder, incremental decoding state.
* ``layers``: embeddings, attention, layer norm, dense FFN, dropout.
* ``losses``: label-smoothed token cross-entropy.
* ``initializers``: the one truncated-normal weight initialiser.
* ``interfaces``: the typed contract between model, trainer and decoder.
* ``numerics``: ``NEG_INF`` and ``fold_seed``, shared by every module.
"""
