"""The one weight initialiser of the package.

Every weight (embeddings, attention, dense FFN, softmax projection, the
router ``wg`` and the experts' ``wi``/``wo``) is drawn from a normal truncated
at two standard deviations and rescaled so that its *realised* standard
deviation is ``sqrt(scale / fan_in)`` (Switch Transformer §2.4 recommends
``scale`` = 0.1; ``ModelConfig.init_scale``). Without the rescaling a
truncated normal is about 12% narrower than its nominal sigma, which is why
there is only one function here: dense and expert weights must start alike
for dense-vs-MoE comparisons to be fair. ``tests/test_initializers.py``
measures the realised std of every variable class of a built model.
"""

from __future__ import annotations

import math
from typing import Sequence

import tensorflow as tf

# Truncated at two standard deviations, a unit normal keeps this standard
# deviation; dividing sigma by it makes the realised std equal sigma.
TRUNCATED_NORMAL_STD = 0.87962566103423978


def stddev(*, fan_in: int, scale: float) -> float:
  """The documented (realised) standard deviation ``sqrt(scale / fan_in)``."""
  if fan_in <= 0 or scale <= 0:
    raise ValueError(f"fan_in={fan_in} and scale={scale} must be positive")
  return math.sqrt(scale / fan_in)


def truncated_normal(shape: Sequence[int], *, fan_in: int,
                     scale: float) -> tf.Tensor:
  """<float32>[shape] with std ``sqrt(scale / fan_in)``, |x| <= 2 * nominal."""
  nominal = stddev(fan_in=fan_in, scale=scale) / TRUNCATED_NORMAL_STD
  return tf.random.truncated_normal(list(shape), stddev=nominal,
                                    dtype=tf.float32)


def init_variable(shape: Sequence[int], *, fan_in: int, scale: float,
                  name: str) -> tf.Variable:
  """A float32 ``tf.Variable`` initialised by :func:`truncated_normal`."""
  return tf.Variable(truncated_normal(shape, fan_in=fan_in, scale=scale),
                     name=name)
