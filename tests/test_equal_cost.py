"""Candidates read at equal measured cost (m4moe.pipeline.equal_cost)."""

import json

import pytest

from m4moe.pipeline import equal_cost


def _bench(path, speeds, reference="dense"):
  lines = [{"benchmark": "recipe_step", "model": reference,
            "median_sec": 1.0}]
  lines += [{"benchmark": "recipe_step", "model": model,
             "median_sec": 1.0 / speed, f"speed_vs_{reference}": speed}
            for model, speed in speeds.items()]
  path.write_text("\n".join(json.dumps(l) for l in lines) + "\n")
  return path


def test_step_costs_invert_the_speeds_and_average_files(tmp_path):
  a = _bench(tmp_path / "a.jsonl", {"moe": 0.8, "wide": 0.5})
  b = _bench(tmp_path / "b.jsonl", {"moe": 0.625})
  costs = equal_cost.read_step_costs([a, b])
  # moe: 1 / 0.8 = 1.25 and 1 / 0.625 = 1.6, averaged; wide once.
  assert costs == {"dense": 1.0, "moe": pytest.approx(1.425),
                   "wide": pytest.approx(2.0)}


def test_step_cost_files_must_share_a_reference_and_carry_speeds(tmp_path):
  a = _bench(tmp_path / "a.jsonl", {"moe": 0.8})
  other = _bench(tmp_path / "o.jsonl", {"moe": 0.8}, reference="big")
  with pytest.raises(equal_cost.StepCostError, match="reference is 'big'"):
    equal_cost.read_step_costs([a, other])
  broken = tmp_path / "broken.jsonl"
  broken.write_text(json.dumps({"benchmark": "recipe_step", "model": "d"})
                    + "\n" + json.dumps({"benchmark": "recipe_step",
                                         "model": "moe"}) + "\n")
  with pytest.raises(equal_cost.StepCostError,
                     match=r"broken.jsonl: recipe_step line 2 \(moe\) has "
                     "no speed_vs_d"):
    equal_cost.read_step_costs([broken])
  garbled = tmp_path / "garbled.jsonl"
  garbled.write_text(json.dumps({"benchmark": "recipe_step", "model": "d"})
                     + "\n{cut off\n")
  with pytest.raises(equal_cost.StepCostError,
                     match="garbled.jsonl:2: not a JSON line"):
    equal_cost.read_step_costs([garbled])
  empty = tmp_path / "empty.jsonl"
  empty.write_text("\n")
  with pytest.raises(equal_cost.StepCostError, match="no recipe_step lines"):
    equal_cost.read_step_costs([empty])


def test_each_curve_is_read_at_the_budget_every_candidate_reached():
  # The dense run reached 1000 reference steps; the MoE, at 1.25 reference
  # steps per step, 960 x 1.25 = 1200. The common budget is 1000, where
  # the MoE is at its step 800: between its evaluations at 600 and 900.
  dense = [(500, 3.0), (1000, 2.5)]
  moe = [(300, 3.5), (600, 3.0), (900, 2.7), (960, 2.6)]
  costs = {"dense": 1.0, "moe": 1.25}
  budget = equal_cost.common_budget({"dense": dense, "moe": moe}, costs)
  assert budget == 1000
  assert equal_cost.dev_ce_at(dense, cost=1.0, budget=budget) == 2.5
  assert equal_cost.dev_ce_at(moe, cost=1.25, budget=budget) == (
      pytest.approx(3.0 + (2.7 - 3.0) * (800 - 600) / 300))
  # Never extrapolated: past a curve's end there is no value.
  assert equal_cost.dev_ce_at(dense, cost=1.0, budget=1100) is None
  assert equal_cost.common_budget({"x": dense}, {"moe": 1.0}) is None
