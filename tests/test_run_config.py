"""config.json's model section: a run refuses other model flags, and a run
written before a field existed reads that field as its default."""

import json

import pytest

from m4moe import config as config_lib
from m4moe.training import checkpointing
from m4moe.training import rundir


def _config(*flags: str, **overrides) -> config_lib.ModelConfig:
  return config_lib.load_model_config("tiny/moe", flags, **overrides)


def test_same_model_is_accepted_and_another_is_refused(tmp_path):
  checkpointing.write_run_config(tmp_path, model_config=_config(d_ff=64),
                                 sections={"train": {"x": 1}})
  # Same model, other sections: rewritten.
  checkpointing.write_run_config(tmp_path, model_config=_config(d_ff=64),
                                 sections={"train": {"x": 2}})
  stored = json.loads((tmp_path / rundir.CONFIG_FILENAME).read_text())
  assert stored["train"] == {"x": 2}
  assert checkpointing.model_config_diff(tmp_path, _config(d_ff=64)) == []
  assert checkpointing.model_config_diff(tmp_path, _config(d_ff=128)) == [
      "--d_ff: checkpoint 64 vs now 128"]
  with pytest.raises(config_lib.ConfigError,
                     match=r"different model \(--d_ff: checkpoint 64 vs now "
                     r"128\); use a fresh --model_dir"):
    checkpointing.write_run_config(tmp_path, model_config=_config(d_ff=128),
                                   sections={})


def test_a_field_added_since_the_run_compares_as_its_default(tmp_path):
  checkpointing.write_run_config(tmp_path, model_config=_config(), sections={})
  path = tmp_path / rundir.CONFIG_FILENAME
  stored = json.loads(path.read_text())
  del stored["model"]["moe"]["expert_init_scale"]  # as an older version wrote
  path.write_text(json.dumps(stored))
  assert checkpointing.model_config_diff(tmp_path, _config()) == []
  # ... but a value other than the default is a different model.
  changed = _config("--expert_init_scale=0.5")
  assert checkpointing.model_config_diff(tmp_path, changed) == [
      "--expert_init_scale: checkpoint 0.0 vs now 0.5"]


def test_no_config_json_yet_has_no_diff(tmp_path):
  assert checkpointing.model_config_diff(tmp_path / "new", _config()) == []
