"""One initialiser: every weight class of a built MoE model has the documented
realised standard deviation sqrt(init_scale / fan_in)."""

import math

import numpy as np
import pytest
import tensorflow as tf

from m4moe import config as config_lib
from m4moe.model import initializers
from m4moe.model import transformer as model_lib

D_MODEL, D_KV, HEADS, D_FF, H_EXPERT = 128, 32, 4, 512, 256


def _fan_in(name: str) -> int | None:
  """The documented fan-in of a weight, by its class (None: not a weight)."""
  leaf = name.split(":")[0].rsplit("/", 1)[-1]
  if leaf in ("scale", "bias"):
    return None  # layer norms: ones and zeros
  if "/experts/" in name:
    return {"wi": D_MODEL, "wo": H_EXPERT}[leaf]
  if "attention/" in name:
    return {"wq": D_MODEL, "wk": D_MODEL, "wv": D_MODEL,
            "wo": HEADS * D_KV}[leaf]
  if "/ffn/" in name:
    return {"wi": D_MODEL, "wo": D_FF}[leaf]
  if leaf in ("wg", "embeddings", "kernel"):
    return D_MODEL
  raise AssertionError(f"unclassified variable {name}")


@pytest.mark.parametrize("init_scale,expert_init_scale",
                         [(0.1, 0.0), (1.0, 0.0), (1.0, 0.7737)])
def test_every_weight_class_has_the_documented_std(init_scale,
                                                   expert_init_scale):
  """expert_init_scale (0: init_scale) sets the router's and the experts'
  scale only."""
  tf.random.set_seed(7)
  config = config_lib.load_model_config(
      "tiny/moe", [f"--expert_init_scale={expert_init_scale}"],
      src_vocab_size=3000, tgt_vocab_size=2000, init_scale=init_scale)
  model = model_lib.Transformer(config=config)
  pooled: dict[str, list[np.ndarray]] = {}
  for v in model.trainable_variables:
    fan_in = _fan_in(v.name)
    if fan_in is None:
      continue
    kind = "/".join(v.name.split(":")[0].split("/")[-2:])
    pooled.setdefault(f"{kind}@{fan_in}", []).append(v.numpy().ravel())
  classes = {k.split("@")[0] for k in pooled}
  assert {"router/wg", "experts/wi", "experts/wo", "ffn/wi", "ffn/wo",
          "self_attention/wq", "cross_attention/wo",
          "source_embedding/embeddings", "output_projection/kernel"} <= classes
  for key, arrays in pooled.items():
    values = np.concatenate(arrays)
    fan_in = int(key.split("@")[1])
    moe_weight = key.split("/")[0] in ("router", "experts")
    scale = (expert_init_scale or init_scale) if moe_weight else init_scale
    expected = math.sqrt(scale / fan_in)
    # >= 1024 draws each (the router: 8 x 128 x 4 MoE layers = 4096);
    # the std of a sample std is ~1/sqrt(2n) relative, so 6% is > 3 sigma.
    assert values.size >= 1024, key
    assert abs(values.std() / expected - 1) < 0.06, (key, values.std(),
                                                     expected)
    # Truncated at two nominal sigmas.
    nominal = expected / initializers.TRUNCATED_NORMAL_STD
    assert np.abs(values).max() <= 2 * nominal + 1e-6, key


def test_truncated_normal_realised_std_and_bound():
  tf.random.set_seed(3)
  x = initializers.truncated_normal([400, 500], fan_in=50, scale=0.1).numpy()
  assert x.std() == pytest.approx(math.sqrt(0.1 / 50), rel=0.01)
  assert abs(x.mean()) < 1e-3
  assert np.abs(x).max() <= 2 * math.sqrt(0.1 / 50) / 0.8796256610342398


def test_bad_fan_in_or_scale_is_rejected():
  with pytest.raises(ValueError, match="fan_in=0"):
    initializers.stddev(fan_in=0, scale=1.0)
  with pytest.raises(ValueError, match="scale=-1"):
    initializers.truncated_normal([2], fan_in=3, scale=-1.0)
