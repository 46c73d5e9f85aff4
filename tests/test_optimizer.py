"""Adafactor: step-by-step oracle test against keras.optimizers.Adafactor."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from m4moe import config as config_lib
from m4moe.training import optimizer as opt_lib

SHAPES = [(), (5,), (4, 6), (3, 4, 5)]  # scalar, vector, matrix, [E, M, H]


class _KerasRsqrt(keras.optimizers.schedules.LearningRateSchedule):
  """Our rsqrt schedule expressed for Keras (called with 0-based iterations)."""

  def __init__(self, config: opt_lib.AdafactorConfig):
    self.config = config

  def __call__(self, iterations):
    return self.config.learning_rate_at(tf.cast(iterations, tf.float32) + 1.0)


def _init_values(seed):
  rng = np.random.default_rng(seed)
  return [rng.normal(size=s).astype(np.float32) for s in SHAPES]


def _grads(rng):
  return [rng.normal(size=s).astype(np.float32) * rng.choice([1e-3, 1, 30])
          for s in SHAPES]


def test_matches_keras_adafactor_step_by_step():
  config = opt_lib.AdafactorConfig(learning_rate=1.0, warmup_steps=4)
  ours = [tf.Variable(v) for v in _init_values(0)]
  theirs = [keras.Variable(v) for v in _init_values(0)]
  optimizer = opt_lib.Adafactor(config)
  optimizer.build(ours)
  oracle = keras.optimizers.Adafactor(
      learning_rate=_KerasRsqrt(config), beta_2_decay=-0.8, epsilon_1=1e-30,
      epsilon_2=1e-3, clip_threshold=1.0)
  rng = np.random.default_rng(1)
  for step in range(12):  # covers warm-up (t <= 4) and the rsqrt decay
    grads = _grads(rng)
    optimizer.apply_gradients([tf.constant(g) for g in grads], ours)
    oracle.apply_gradients(zip([tf.constant(g) for g in grads], theirs))
    for a, b in zip(ours, theirs):
      np.testing.assert_allclose(a.numpy(), np.asarray(b), rtol=2e-5,
                                 atol=1e-6, err_msg=f"step {step + 1}")
  assert int(optimizer.iterations) == 12


def test_matches_keras_inside_tf_function():
  config = opt_lib.AdafactorConfig(warmup_steps=2)
  ours = [tf.Variable(v) for v in _init_values(2)]
  theirs = [keras.Variable(v) for v in _init_values(2)]
  optimizer = opt_lib.Adafactor(config)
  optimizer.build(ours)
  oracle = keras.optimizers.Adafactor(learning_rate=_KerasRsqrt(config))
  apply = tf.function(lambda g: optimizer.apply_gradients(g, ours))
  rng = np.random.default_rng(3)
  for _ in range(5):
    grads = [tf.constant(g) for g in _grads(rng)]
    apply(grads)
    oracle.apply_gradients(zip(grads, theirs))
  for a, b in zip(ours, theirs):
    np.testing.assert_allclose(a.numpy(), np.asarray(b), rtol=2e-5, atol=1e-6)


def test_expert_weights_get_per_expert_factored_slots_only():
  variables = [tf.Variable(tf.zeros(s)) for s in SHAPES]
  optimizer = opt_lib.Adafactor()
  optimizer.build(variables)
  slot_shapes = [
      {k: tuple(getattr(s, k).shape) for k in ("vr", "vc", "v", "m")
       if getattr(s, k) is not None} for s in optimizer.slots]
  assert slot_shapes == [{"v": ()}, {"v": (5,)},
                         {"vr": (4,), "vc": (6,)},
                         {"vr": (3, 4), "vc": (3, 5)}]


def test_first_step_is_sign_times_rate_without_scaling_or_clipping():
  # t=1: beta2 = 0, v = g^2 + eps1, so u = sign(g) and x -= lr * sign(g).
  config = opt_lib.AdafactorConfig(schedule="constant", learning_rate=0.5,
                                   multiply_by_parameter_scale=False,
                                   clipping_threshold=0.0)
  var = tf.Variable([1.0, 2.0, 3.0])
  optimizer = opt_lib.Adafactor(config)
  optimizer.build([var])
  lr = optimizer.apply_gradients([tf.constant([0.1, -4.0, 0.0])], [var])
  np.testing.assert_allclose(var.numpy(), [0.5, 2.5, 3.0], rtol=1e-6)
  assert float(lr) == 0.5


def test_update_clipping_bounds_rms_of_the_update():
  # After one step with a huge fresh gradient on a warm slot, RMS(u) > 1 and
  # the clipped step has RMS exactly lr * d.
  config = opt_lib.AdafactorConfig(schedule="constant", learning_rate=0.1,
                                   multiply_by_parameter_scale=False,
                                   clipping_threshold=1.0)
  var = tf.Variable(tf.zeros([8]))
  optimizer = opt_lib.Adafactor(config)
  optimizer.build([var])
  optimizer.apply_gradients([tf.fill([8], 1e-3)], [var])
  before = var.numpy()
  optimizer.apply_gradients([tf.fill([8], 10.0)], [var])
  step = var.numpy() - before
  np.testing.assert_allclose(np.sqrt(np.mean(step ** 2)), 0.1, rtol=1e-5)


def test_beta1_momentum_slot():
  config = opt_lib.AdafactorConfig(schedule="constant", learning_rate=1.0,
                                   beta1=0.5, multiply_by_parameter_scale=False,
                                   clipping_threshold=0.0)
  var = tf.Variable([0.0, 0.0])
  optimizer = opt_lib.Adafactor(config)
  optimizer.build([var])
  for _ in range(2):  # constant gradient => u = sign(g) = [1, -1] each step
    optimizer.apply_gradients([tf.constant([2.0, -3.0])], [var])
  # m1 = 0.5 u, m2 = 0.75 u; x = -(m1 + m2) = -1.25 u.
  np.testing.assert_allclose(var.numpy(), [-1.25, 1.25], rtol=1e-6)
  np.testing.assert_allclose(optimizer.slots[0].m.numpy(), [0.75, -0.75])


def _numpy_small_model_recipe(values, grads_per_step, *, lr, beta1):
  """NumPy reference of the unfactored update with momentum, constant rate."""
  values = [v.astype(np.float64) for v in values]
  v_slots = [np.zeros_like(v) for v in values]
  m_slots = [np.zeros_like(v) for v in values]
  for t, grads in enumerate(grads_per_step, start=1):
    beta2 = 1.0 - t ** -0.8
    for i, g in enumerate(grads):
      g = g.astype(np.float64)
      v_slots[i] = beta2 * v_slots[i] + (1 - beta2) * (g * g + 1e-30)
      m_slots[i] = beta1 * m_slots[i] + (1 - beta1) * g / np.sqrt(v_slots[i])
      values[i] = values[i] - lr * m_slots[i]
  return values, v_slots, m_slots


def test_small_model_recipe_matches_numpy():
  # The zoo's small-model recipe (unfactored, beta1, no clipping or scale),
  # which the Keras oracle above does not cover.
  config = opt_lib.AdafactorConfig(
      schedule="constant", learning_rate=0.01, beta1=0.9, factored=False,
      clipping_threshold=0.0, multiply_by_parameter_scale=False)
  variables = [tf.Variable(v) for v in _init_values(6)]
  optimizer = opt_lib.Adafactor(config)
  optimizer.build(variables)
  rng = np.random.default_rng(7)
  steps = [_grads(rng) for _ in range(5)]
  for grads in steps:
    optimizer.apply_gradients([tf.constant(g) for g in grads], variables)
  values, v_slots, m_slots = _numpy_small_model_recipe(
      _init_values(6), steps, lr=0.01, beta1=0.9)
  for i, var in enumerate(variables):
    np.testing.assert_allclose(var.numpy(), values[i], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(optimizer.slots[i].v.numpy(), v_slots[i],
                               rtol=1e-5)
    np.testing.assert_allclose(optimizer.slots[i].m.numpy(), m_slots[i],
                               rtol=1e-4, atol=1e-6)


def _steps(config, *, compiled):
  """Variables and optimiser after 4 updates in a tf.function."""
  variables = [tf.Variable(v) for v in _init_values(8)]
  optimizer = opt_lib.Adafactor(config, compile_updates=compiled)
  optimizer.build(variables)
  apply = tf.function(lambda g: optimizer.apply_gradients(g, variables))
  rng = np.random.default_rng(9)
  for _ in range(4):
    apply([tf.constant(g) for g in _grads(rng)])
  return variables, optimizer


@pytest.mark.parametrize("factored,beta1", [
    (True, 0.0), (True, 0.9), (False, 0.0), (False, 0.9)])
def test_compiled_update_equals_op_by_op(factored, beta1):
  config = opt_lib.AdafactorConfig(
      warmup_steps=2, factored=factored, beta1=beta1, clipping_threshold=0.0,
      multiply_by_parameter_scale=False)
  ours, opt_c = _steps(config, compiled=True)
  # The compiled path really ran (one trace per variable shape).
  assert opt_lib._compiled_update(config).experimental_get_tracing_count() > 0
  ref, opt_r = _steps(config, compiled=False)
  for a, b in zip(ours, ref):
    np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-6)
  for s_c, s_r in zip(opt_c.slots, opt_r.slots):
    for name in ("v", "vr", "vc", "m"):
      if getattr(s_r, name) is not None:
        np.testing.assert_allclose(getattr(s_c, name).numpy(),
                                   getattr(s_r, name).numpy(), rtol=1e-5,
                                   atol=1e-7, err_msg=name)


def test_whole_variable_rms_keeps_the_op_by_op_update():
  # Clipping and the parameter scale reduce over whole variables, which
  # XLA:CPU runs slower than the op-by-op update: not compiled.
  config = opt_lib.AdafactorConfig(warmup_steps=2)
  _steps(config, compiled=True)
  assert opt_lib._compiled_update(config).experimental_get_tracing_count() == 0


def test_schedule_values():
  config = opt_lib.AdafactorConfig(learning_rate=2.0, warmup_steps=100)
  rates = [float(config.learning_rate_at(t)) for t in (1, 100, 400)]
  np.testing.assert_allclose(rates, [0.2, 0.2, 0.1], rtol=1e-6)


def test_slots_round_trip_through_checkpoint(tmp_path):
  config = opt_lib.AdafactorConfig(warmup_steps=3)
  rng = np.random.default_rng(5)
  grads = [[tf.constant(g) for g in _grads(rng)] for _ in range(4)]

  def make():
    variables = [tf.Variable(v) for v in _init_values(4)]
    optimizer = opt_lib.Adafactor(config)
    optimizer.build(variables)
    return variables, optimizer

  straight, opt_a = make()
  for g in grads:
    opt_a.apply_gradients(g, straight)
  first, opt_b = make()
  for g in grads[:2]:
    opt_b.apply_gradients(g, first)
  path = tf.train.Checkpoint(v=first, opt=opt_b).write(str(tmp_path / "ck"))
  resumed, opt_c = make()
  tf.train.Checkpoint(v=resumed, opt=opt_c).read(path).assert_consumed()
  for g in grads[2:]:
    opt_c.apply_gradients(g, resumed)
  for a, b in zip(straight, resumed):
    np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_bad_config_names_the_flag():
  with pytest.raises(opt_lib.OptimizerConfigError, match="--warmup_steps"):
    opt_lib.AdafactorConfig(warmup_steps=0)
  with pytest.raises(opt_lib.OptimizerConfigError, match="--lr_schedule"):
    opt_lib.AdafactorConfig(schedule="cosine")


def test_apply_requires_the_built_variables():
  a, b = tf.Variable([1.0]), tf.Variable([2.0])
  optimizer = opt_lib.Adafactor()
  optimizer.build([a])
  with pytest.raises(ValueError, match="build"):
    optimizer.apply_gradients([tf.constant([1.0])], [b])


def test_zoo_entry_carries_its_optimizer_recipe(tmp_path):
  path = tmp_path / "entry.flags"
  path.write_text("--d_model=64\n--beta1=0.9\n--nofactored\n"
                  "--learning_rate=0.01\n")
  recipe = config_lib.load_optimizer_config(str(path))
  assert (recipe.beta1, recipe.factored, recipe.learning_rate) == (0.9, False,
                                                                   0.01)
  # Unset optimiser flags keep the paper's defaults.
  assert recipe.clipping_threshold == 1.0 and recipe.schedule == "rsqrt"
  # The command line wins over the file.
  recipe = config_lib.load_optimizer_config(
      str(path), ["--learning_rate=0.5", "--lr_schedule=constant"])
  assert (recipe.learning_rate, recipe.schedule) == (0.5, "constant")
  # The model loader reads the same file and ignores the recipe.
  assert config_lib.load_model_config(str(path)).d_model == 64


def test_bad_recipe_in_a_zoo_entry_names_the_file_and_flag(tmp_path):
  path = tmp_path / "bad.flags"
  path.write_text("--beta1=1.5\n")
  with pytest.raises(config_lib.ConfigError, match=r"bad.flags.*--beta1=1.5"):
    config_lib.load_optimizer_config(str(path))


def test_zoo_recipes_small_models_vs_gshard_rows():
  """tiny/* carry the small-model recipe; gshard/* the paper's Adafactor."""
  paper = opt_lib.AdafactorConfig()
  for row in ("gshard/moe_128e_12l", "gshard/moe_2048e_36l"):
    assert config_lib.load_optimizer_config(row) == paper
  for entry in ("tiny/dense", "tiny/moe"):
    small = config_lib.load_optimizer_config(entry)
    assert small != paper
    assert small.beta1 > 0 and not small.multiply_by_parameter_scale
