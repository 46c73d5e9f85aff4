"""The model zoo reproduces GShard Table 1; m4moe-info reports it."""

import json
import pathlib
import subprocess
import sys

import pytest

from m4moe import config as config_lib
from m4moe.cost import model as cost

ZOO = pathlib.Path(__file__).resolve().parent.parent / "configs"

# SPEC.md section 6, Table 1: (E, L) -> (total experts, weights as printed).
TABLE1 = {
    (2048, 36): (36_864, 600e9),
    (2048, 12): (12_288, 200e9),
    (512, 36): (9_216, 150e9),
    (512, 12): (3_072, 50e9),
    (128, 36): (2_304, 37e9),
    (128, 12): (768, 12.5e9),
    (2048, 60): (61_440, 1e12),
}


def _gshard(experts: int, layers: int) -> config_lib.ModelConfig:
  return config_lib.load_model_config(f"gshard/moe_{experts}e_{layers}l")


@pytest.mark.parametrize("experts, layers", sorted(TABLE1))
def test_paper_rows_match_table1(experts, layers):
  total_experts, paper_weights = TABLE1[(experts, layers)]
  config = _gshard(experts, layers)
  result = cost.model_cost(config)
  ratio = result.num_params / paper_weights - 1
  print(f"MoE({experts}E, {layers}L): {result.num_params:,} weights vs paper "
        f"{paper_weights:,.0f} ({ratio:+.2%}); {result.num_experts_total:,} "
        "experts")
  assert result.num_experts_total == total_experts
  assert result.num_moe_layers == layers // 2
  assert abs(ratio) < 0.08
  # The paper rounds down: 128E rows come out ~6-7% above, the others ~3-4%.
  if experts == 128:
    assert 0.05 < ratio < 0.08
  else:
    assert 0.02 < ratio < 0.045


@pytest.mark.parametrize("experts, layers", sorted(TABLE1))
def test_paper_rows_use_appendix_a2_dimensions(experts, layers):
  config = _gshard(experts, layers)
  assert (config.d_model, config.d_ff, config.moe.expert_hidden_dim) == (
      1024, 8192, 8192)
  assert (config.num_heads, config.d_kv) == (16, 128)
  assert config.num_encoder_layers == config.num_decoder_layers == layers // 2
  assert (config.src_vocab_size, config.tgt_vocab_size) == (64000, 32000)
  assert config.dropout_rate == config.attention_dropout_rate == 0.1
  assert config.activation_dtype == "float32"
  moe = config.moe
  assert (moe.num_experts, moe.router, moe.second_expert_policy) == (
      experts, "top2", "random")
  # Every other FFN, in both stacks, is MoE.
  assert config.moe_layer_indices(4) == (1, 3)
  # Capacity 2S/E per group.
  s = moe.group_size
  assert moe.capacity(group_size=s, training=True) == 2 * s // experts


@pytest.mark.parametrize("experts, layers", sorted(TABLE1))
def test_paper_flagfiles_name_their_table1_row(experts, layers):
  text = (ZOO / "gshard" / f"moe_{experts}e_{layers}l.flags").read_text()
  assert f"MoE({experts}E, {layers}L)" in text
  assert f"{TABLE1[(experts, layers)][0]:,}" in text


def test_every_zoo_entry_loads():
  entries = sorted(ZOO.rglob("*.flags"))
  assert len(entries) >= 9
  for path in entries:
    config_lib.load_model_config(path)


def test_tiny_moe_fine_is_the_model_the_study_confirmed():
  """The zoo entry is exactly the configuration study v3's result measured:
  the confirmation recipe's MoE (tiny/moe plus its flags) resolves to the
  entry's model and optimiser, layers, dropout and rate included."""
  from m4moe.pipeline import recipes  # pylint: disable=g-import-not-at-top
  recipe = recipes.load_recipe("study3")
  chosen = next(m for m in recipe.models
                if m.name == "moe_E64k8_every_outqtr_lr4x")
  studied = config_lib.load_model_config(chosen.config, chosen.extra_flags)
  entry = config_lib.load_model_config("tiny/moe_fine")
  assert entry == studied
  assert (config_lib.load_optimizer_config("tiny/moe_fine") ==
          config_lib.load_optimizer_config(chosen.config, chosen.extra_flags))
  assert (entry.moe.num_experts, entry.moe.num_selected_experts,
          entry.moe.expert_hidden_dim) == (64, 8, 64)
  assert (entry.num_encoder_layers, entry.dropout_rate) == (2, 0.1)
  # Every FFN is MoE, and a token executes the dense FFN's hidden units.
  assert entry.moe_layer_indices(2) == (0, 1)
  dense = config_lib.load_model_config("tiny/dense")
  assert 8 * 64 == dense.d_ff == entry.d_ff
  assert cost.num_params(entry) > cost.num_params(
      config_lib.load_model_config("tiny/dense", chosen.extra_flags[:4]))


def _info(*args: str) -> subprocess.CompletedProcess:
  return subprocess.run([sys.executable, "-m", "m4moe.cli.info", *args],
                        capture_output=True, text=True, timeout=60,
                        check=False)


def test_info_json_for_a_flagfile():
  path = ZOO / "gshard" / "moe_2048e_36l.flags"
  result = _info(f"--flagfile={path}", "--json", "--sequence_length=128",
                 "--batch_tokens=4194304", "--mesh=expert:2048")
  assert result.returncode == 0, result.stderr
  info = json.loads(result.stdout)
  config = config_lib.load_model_config(path)
  assert info["num_params"] == cost.num_params(config)
  assert info["num_experts_total"] == 36_864
  assert info["num_moe_layers"] == 18
  assert info["active_params_per_token"] == cost.active_params_per_token(config)
  assert info["flops_per_token"] == cost.flops_per_token(
      config, source_length=128, target_length=128).forward
  assert info["paper"]["paper_weights"] == 600e9
  assert info["device"]["expert_params_per_device"] == 18 * 2 * 1024 * 8192


def test_info_table_for_a_zoo_name():
  result = _info("--config=tiny/moe")
  assert result.returncode == 0, result.stderr
  rows = dict(line.split(None, 1) for line in result.stdout.splitlines())
  config = config_lib.load_model_config("tiny/moe")
  assert rows["num_params"].startswith(f"{cost.num_params(config):,}")
  assert rows["num_experts_total"] == "32"
  assert "paper.model" not in rows


def test_info_applies_model_flags_on_top_of_a_zoo_name():
  result = _info("--config=tiny/moe", "--num_experts=32",
                 "--num_encoder_layers=2", "--json")
  assert result.returncode == 0, result.stderr
  info = json.loads(result.stdout)
  config = config_lib.load_model_config(
      "tiny/moe", ["--num_experts=32", "--num_encoder_layers=2"])
  assert info["num_params"] == cost.num_params(config)
  assert info["num_experts_total"] == 32 * (1 + 2)  # enc 1 + dec 2 MoE layers


@pytest.mark.parametrize("content, expected", [
    ("--num_experts=-3\n", "--num_experts=-3"),
    ("--no_such_flag=1\n", "no_such_flag"),
])
def test_info_bad_flagfile_names_the_file(tmp_path, content, expected):
  path = tmp_path / "bad.flags"
  path.write_text(content)
  for arg in (f"--flagfile={path}", f"--config={path}"):
    result = _info(arg)
    assert result.returncode != 0
    assert str(path) in result.stderr, (arg, result.stderr)
    assert expected in result.stderr, (arg, result.stderr)


def test_info_missing_flagfile_names_the_file(tmp_path):
  path = tmp_path / "missing.flags"
  result = _info(f"--flagfile={path}")
  assert result.returncode != 0
  assert str(path) in result.stderr
