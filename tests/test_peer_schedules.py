"""Schedules stated for the budget, and tokens/s by one definition.

``m4moe.benchmarks.peer.schedules`` checks what a run did of its planned
learning-rate schedule; ``m4moe.benchmarks.peer.throughput`` turns either
system's log into target tokens per second of training-step time. Both
are pure Python: the logs here are written by hand.
"""

import math

import pytest

from m4moe.benchmarks.peer import schedules
from m4moe.benchmarks.peer import throughput


def test_a_run_stopped_inside_its_warmup_is_flagged():
  # The earlier final's peer pick: 2e-3, linear warmup 2000 steps of 2048
  # tokens; stopped by the wall clock at step 1553 of 2000 planned.
  schedule = schedules.Schedule(shape="linear_rsqrt", peak=2e-3,
                                warmup_steps=2000, planned_steps=2000 + 1)
  check = schedules.check(schedule, steps=1553, logged_rate=1.553e-3)
  assert check["peak_reached"] is False and check["flagged"] is True
  assert check["final_learning_rate"] == pytest.approx(1.553e-3)
  assert check["logged_learning_rate"] == 1.553e-3
  done = schedules.check(schedule, steps=2001)
  assert (done["peak_reached"], done["schedule_complete"],
          done["flagged"]) == (True, True, False)
  # Ours holds its peak from step 1, so only the planned end can fail.
  hold = schedules.Schedule(shape="hold_rsqrt", peak=4e-3, warmup_steps=300,
                            planned_steps=1000)
  assert schedules.check(hold, steps=1)["peak_reached"] is True
  assert hold.rate_at(1200) == pytest.approx(4e-3 * math.sqrt(300 / 1200))


def test_schedule_validation_says_how_to_fit_the_budget():
  with pytest.raises(ValueError, match="does not fit inside the 100 planned"
                     ".*raise --budget_tokens"):
    schedules.Schedule(shape="linear_rsqrt", peak=1e-3, warmup_steps=100,
                       planned_steps=100)
  with pytest.raises(ValueError, match="schedule shape 'noam'"):
    schedules.Schedule(shape="noam", peak=1e-3, warmup_steps=1,
                       planned_steps=2)
  assert schedules.warmup_steps(0.25, 1000) == 250
  assert schedules.warmup_steps(0.001, 10) == 1


def test_m4moe_tokens_per_sec_from_a_hand_made_log():
  records = [
      {"kind": "start", "step": 0},
      {"kind": "train", "step": 50, "tokens_seen": 10000,
       "step_time_sec": 2.0, "learning_rate": 4e-3},
      {"kind": "eval", "step": 50},
      {"kind": "train", "step": 100, "tokens_seen": 30000,
       "step_time_sec": 0.4, "learning_rate": 4e-3},
      {"kind": "train", "step": 120, "tokens_seen": 36000,
       "step_time_sec": 0.5, "learning_rate": 3.9e-3}]
  intervals = throughput.m4moe_intervals(records)
  assert [(i.step, i.steps, i.target_tokens, i.step_seconds)
          for i in intervals] == [(50, 50, 10000, 100.0),
                                  (100, 50, 20000, 20.0),
                                  (120, 20, 6000, 10.0)]
  # The first interval (graph tracing) is left out: 26000 / 30.
  assert throughput.target_tokens_per_sec(intervals) == pytest.approx(
      26000 / 30)
  assert throughput.summary(intervals) == {
      "target_tokens_per_sec": round(26000 / 30, 1), "target_tokens": 36000,
      "logged_learning_rate": 3.9e-3, "logged_learning_rate_step": 120}
  # One interval only: it is all there is.
  assert throughput.target_tokens_per_sec(intervals[:1]) == 100.0
  assert "non-padding" in throughput.DEFINITION
