"""One way from config dataclass to absl flags and back (m4moe.flagutil), and
one error family for bad settings (m4moe.errors)."""

import dataclasses
import json
import subprocess
import sys

import pytest
from absl import flags

from m4moe import config as config_lib
from m4moe import errors
from m4moe import flagutil
from m4moe.training import optimizer as optimizer_lib
from m4moe.training import loop as train_lib
from m4moe.data import vocab
from m4moe.training import inputs

CONFIGS = (config_lib.ModelConfig, config_lib.MoeConfig,
           optimizer_lib.AdafactorConfig, train_lib.TrainConfig,
           inputs.DataConfig, vocab.VocabConfig)

# A value unlike the default for every flag of CONFIGS, valid together.
NON_DEFAULT = {
    "src_vocab_size": 300, "tgt_vocab_size": 200, "d_model": 48,
    "num_heads": 3, "d_kv": 16, "d_ff": 96, "num_encoder_layers": 3,
    "num_decoder_layers": 1, "dropout_rate": 0.25,
    "attention_dropout_rate": 0.05, "activation_dtype": "bfloat16",
    "init_scale": 0.1, "max_length": 77, "num_experts": 6,
    "ffn_output_scale": 0.125,
    "expert_hidden_dim": 40, "moe_layer_interval": 3, "moe_layer_offset": 2,
    "router": "topk", "num_selected_experts": 3,
    "second_expert_policy": "sampling", "group_size": 33,
    "train_capacity_factor": 1.5, "eval_capacity_factor": 2.0,
    "aux_loss_weight": 0.03, "z_loss_weight": 1e-3, "router_jitter": 0.01,
    "expert_dropout_rate": 0.2, "no_token_left_behind": True,
    "expert_init_scale": 0.5,
    "renormalize_combine_weights": False, "batch_prioritized_routing": True,
    "bias_balancing_rate": 0.01, "num_shared_experts": 2,
    "shared_expert_hidden_dim": 24, "expert_output_mask_rate": 0.1,
    "expert_output_scale": 0.5,
    "dispatch": "index",
    # --route_by=language needs --eval_capacity_factor=0 (the default), so it
    # cannot join the non-defaults here; test_task_routing.py round-trips it.
    "route_by": "token", "routing_languages": ("de", "ja"),
    "learning_rate": 0.5, "warmup_steps": 7,
    "schedule": "constant", "decay_exponent": 0.5, "beta1": 0.9,
    "clipping_threshold": 0.0, "epsilon1": 1e-20, "epsilon2": 0.0,
    "multiply_by_parameter_scale": False, "factored": False,
    "model_dir": "/tmp/run", "train_steps": 12, "seed": 5,
    "label_smoothing": 0.0, "grad_accum_steps": 2, "remat": True,
    "checkpoint_every": 3, "keep_checkpoints": 2, "eval_every": 4,
    "log_every": 1, "max_consecutive_nonfinite": 2, "max_train_seconds": 9.5,
    "max_train_cpu_seconds": 7.5,
    "early_stopping_patience": 3, "early_stopping_min_delta": 0.01,
    "checkpoint_input": False, "keep_best": False, "corpus_dir": "corpus", "vocab_dir": "vocab",
    "tfds_name": "", "tfds_data_dir": "tfds", "synthetic": False,
    "languages": ("de", "ja"), "temperature": 1.0, "sequence_length": 32,
    "batch_tokens": 512, "pack": False, "dev_split": "test",
    "dev_batch_size": 8, "process_index": 1, "process_count": 2, "source_vocab_size": 400, "target_vocab_size": 300,
    "max_sentences": 10, "character_coverage": 0.95, "model_type": "bpe",
    "threads": 1,
}


def _leaf_fields(cls, path=()):
  """(path, owner, field) of every non-config field of ``cls``."""
  for field in dataclasses.fields(cls):
    if dataclasses.is_dataclass(field.default_factory):
      yield from _leaf_fields(field.default_factory, (*path, field.name))
    else:
      yield (*path, field.name), cls, field


def _default(field):
  if field.default is not dataclasses.MISSING:
    value = field.default
  elif field.default_factory is not dataclasses.MISSING:
    value = field.default_factory()
  else:
    return None
  return list(value) if isinstance(value, tuple) else value


def _instance(cls):
  """``cls`` with NON_DEFAULT values (nested configs too)."""
  kwargs = {}
  for field in dataclasses.fields(cls):
    if dataclasses.is_dataclass(field.default_factory):
      kwargs[field.name] = _instance(field.default_factory)
    else:
      kwargs[field.name] = NON_DEFAULT[field.name]
  return cls(**kwargs)


@pytest.mark.parametrize("cls", CONFIGS, ids=lambda c: c.__name__)
def test_every_field_has_exactly_one_flag_with_the_dataclass_default(cls):
  flag_values = flags.FlagValues()
  flagutil.define_flags(cls, flag_values)
  defined = set(flag_values)
  specs = {spec.path: spec for spec in flagutil.flag_specs(cls)}
  for path, owner, field in _leaf_fields(cls):
    if flagutil.NOT_A_FLAG in field.metadata:
      assert path not in specs
      continue
    name = field.metadata.get(flagutil.FLAG, field.name)
    assert specs[path].flag == name
    assert name in defined, (owner.__name__, field.name)
    assert flag_values[name].default == _default(field), name
    # Help comes from the docstring, not the bare name.
    assert flag_values[name].help not in ("", name), name
  names = [spec.flag for spec in specs.values()]
  assert len(names) == len(set(names))       # one flag per field ...
  assert defined == set(names)                # ... and no other flags
  # Nothing else but the flags and fields without one.
  assert len(specs) + sum(flagutil.NOT_A_FLAG in f.metadata
                          for _, _, f in _leaf_fields(cls)) == len(
                              list(_leaf_fields(cls)))


@pytest.mark.parametrize("cls", CONFIGS, ids=lambda c: c.__name__)
def test_from_flags_round_trips(cls):
  config = _instance(cls)
  if cls is train_lib.TrainConfig:
    # batch_tokens has no flag: the tool passes it.
    config = dataclasses.replace(config, batch_tokens=512)
  flag_values = flags.FlagValues()
  flagutil.define_flags(cls, flag_values)
  flag_values(["prog", *flagutil.to_flags(config)])
  extra = ({"batch_tokens": 512} if cls is train_lib.TrainConfig else {})
  assert flagutil.from_flags(cls, flag_values, **extra) == config
  # Untouched flags give the dataclass defaults.
  fresh = flags.FlagValues()
  flagutil.define_flags(cls, fresh)
  fresh(["prog"])
  if cls is train_lib.TrainConfig:
    assert flagutil.from_flags(cls, fresh, model_dir="x") == cls(
        model_dir="x")
  elif cls is inputs.DataConfig:
    assert flagutil.from_flags(cls, fresh, synthetic=True) == cls(
        synthetic=True)
  else:
    assert flagutil.from_flags(cls, fresh) == cls()


def test_model_config_to_flags_loads_back_and_present_flags():
  config = _instance(config_lib.ModelConfig)
  assert config.to_flags() == flagutil.to_flags(config)
  flag_values = flags.FlagValues()
  config_lib.define_model_flags(flag_values)
  optimizer_lib.define_flags(flag_values)
  flag_values(["prog", "--num_experts=4", "--lr_schedule=constant",
               "--nofactored"])
  assert config_lib.present_model_flags(flag_values) == ["--num_experts=4"]
  assert optimizer_lib.present_flags(flag_values) == [
      "--lr_schedule=constant", "--nofactored"]
  # Overrides reach nested fields and win over flags.
  model = config_lib.model_config_from_flags(flag_values, d_model=64,
                                             router="top1")
  assert (model.d_model, model.moe.num_experts, model.moe.router) == (
      64, 4, "top1")
  with pytest.raises(TypeError, match="no field no_such_field"):
    config_lib.model_config_from_flags(flag_values, no_such_field=1)


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Seeded:
  """A config sharing --seed.

  Attributes:
    seed: a seed with another default.
  """
  seed: int = 7


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Undocumented:
  """No Attributes section."""
  width: int = 3


def test_shared_flags_must_share_the_default():
  flag_values = flags.FlagValues()
  flagutil.define_flags(train_lib.TrainConfig, flag_values)
  flagutil.define_flags(inputs.DataConfig, flag_values)  # seed 0 == 0
  with pytest.raises(ValueError, match=r"--seed is already defined with "
                     r"default 0, but _Seeded.seed defaults to 7"):
    flagutil.define_flags(_Seeded, flag_values)


def test_undocumented_field_names_the_field():
  with pytest.raises(ValueError, match=r"_Undocumented.width has no line"):
    flagutil.define_flags(_Undocumented, flags.FlagValues())


@pytest.mark.parametrize("make, error, message", [
    (lambda: config_lib.MoeConfig(router="top3"), config_lib.ConfigError,
     "--router='top3' is invalid: choose one of"),
    (lambda: optimizer_lib.AdafactorConfig(beta1=1.5),
     optimizer_lib.OptimizerConfigError, "--beta1=1.5 is invalid"),
    (lambda: train_lib.TrainConfig(model_dir="x", grad_accum_steps=0),
     train_lib.TrainConfigError, "--grad_accum_steps=0 is invalid"),
    (lambda: inputs.DataConfig(synthetic=True, temperature=0.0),
     inputs.DataConfigError, "--temperature=0.0 is invalid: use a positive"),
    (lambda: inputs.DataConfig(synthetic=True, batch_tokens=8),
     inputs.DataConfigError, "--batch_tokens=8 is invalid: use at least "
     "--sequence_length=64"),
    (lambda: vocab.VocabConfig(target_vocab_size=200), errors.ConfigError,
     "--target_vocab_size=200 is invalid: use at least 300"),
])
def test_one_error_family(make, error, message):
  with pytest.raises(error, match=message) as info:
    make()
  assert isinstance(info.value, errors.ConfigError)
  assert isinstance(info.value, ValueError)
  assert config_lib.ConfigError is errors.ConfigError


def _cli_defaults(tool: str, classes: str) -> dict[str, list]:
  """{flag: [the tool's default, the dataclass default]} in a subprocess
  (the tools' flags live in the global absl FLAGS)."""
  script = f"""
import json
from absl import flags
import m4moe.cli.{tool}
from m4moe import config
from m4moe import flagutil
from m4moe.training import optimizer
from m4moe.training import loop as train
from m4moe.data import vocab
from m4moe.training import inputs
out = {{}}
for cls in ({classes},):
  for spec in flagutil.flag_specs(cls):
    out[spec.flag] = [flags.FLAGS[spec.flag].default, spec.default]
print(json.dumps(out))
"""
  proc = subprocess.run([sys.executable, "-c", script], capture_output=True,
                        text=True, timeout=300, check=False)
  assert proc.returncode == 0, proc.stderr[-2000:]
  return json.loads(proc.stdout.strip().splitlines()[-1])


def test_vocab_cli_flags_are_the_dataclass_defaults():
  pairs = _cli_defaults("vocab", "vocab.VocabConfig")
  assert len(pairs) == len(dataclasses.fields(vocab.VocabConfig))
  for name, (flag_default, field_default) in pairs.items():
    assert flag_default == field_default, name


def test_train_cli_flags_are_the_dataclass_defaults():
  pairs = _cli_defaults("train", "config.ModelConfig, optimizer.AdafactorConfig"
                        ", train.TrainConfig, inputs.DataConfig")
  assert len(pairs) > 60
  for name, (flag_default, field_default) in pairs.items():
    assert flag_default == field_default, name
  # The defaults that had drifted between the CLI and the dataclasses.
  assert pairs["eval_every"][0] == 1000
  assert pairs["train_steps"][0] == 10000
