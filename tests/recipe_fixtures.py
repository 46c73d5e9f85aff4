"""A minimal valid recipe for tests of the recipe loader and its users."""

# The top-level keys of a recipe on a local corpus, without models.
HEADER = '''
name = "mini"
description = "one model"
use_packaged_corpus_recipe = false
source_vocab_size = 400
target_vocab_size = 320
batch_tokens = 512
sequence_length = 32
eval_max_sentences = 8
beam_size = 2
'''

# One MoE model: the smallest recipe the loader accepts.
MINIMAL = HEADER + '''[[models]]
name = "m"
config = "tiny/moe"
train_steps = 3
'''
