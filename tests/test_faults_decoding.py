"""Exact expert capacity, and decoding that does not depend on the batch."""

import math

import numpy as np
import pytest

from m4moe import config as config_lib


# ---------------------------------------------------------------------------
# MoeConfig.capacity: ceil(cf * k * S / E) in exact rational arithmetic.

@pytest.mark.parametrize("cf, router, s, e, expected", [
    # 1.1 * 2 * 25 / 5 is exactly 11; in floats it is 11.000000000000002.
    (1.1, "top2", 25, 5, 11),
    (1.1, "top2", 26, 5, 12),      # 11.44 -> 12
    (0.7, "top1", 30, 7, 3),       # 0.7 * 30 / 7 = 3 exactly (float: 3.0000000000000004)
    (1.25, "top2", 256, 8, 80),    # tiny/moe training: 80 exactly
    (1.0, "top2", 8192, 128, 128),  # GShard rows: 2S/E
    (0.1, "top1", 3, 8, 1),        # tiny raw value: at least one slot
    (4.0, "top2", 3, 2, 3),        # at most S slots
])
def test_capacity_hand_checked(cf, router, s, e, expected):
  moe = config_lib.MoeConfig(num_experts=e, router=router,
                             train_capacity_factor=cf, eval_capacity_factor=cf)
  assert moe.capacity(group_size=s, training=True) == expected
  assert moe.capacity(group_size=s, training=False) == expected


def test_capacity_example_from_issue_is_not_off_by_one():
  moe = config_lib.MoeConfig(num_experts=5, train_capacity_factor=1.1)
  assert 1.1 * 2 * 25 / 5 > 11  # the float product overshoots...
  assert moe.capacity(group_size=25, training=True) == 11  # ...C does not


def test_capacity_matches_exact_rationals_over_many_settings():
  rng = np.random.default_rng(14)
  exact_integer_cases = float_errors = 0
  for _ in range(3000):
    decimals = int(rng.integers(0, 4))
    numerator = int(rng.integers(1, 4000))
    cf_text = f"{numerator}e-{decimals}"
    cf = float(cf_text)
    k = int(rng.integers(1, 5))
    e = int(rng.integers(k, 300))
    s = int(rng.integers(1, 5000))
    if rng.random() < 0.5:  # make cf * k * S / E an exact integer
      s = e * 10**decimals // math.gcd(numerator * k, 10**decimals) * int(
          rng.integers(1, 4))
    moe = config_lib.MoeConfig(num_experts=e, router="noisy_topk",
                               num_selected_experts=k,
                               train_capacity_factor=cf)
    # Integer arithmetic: cf = numerator / 10**decimals.
    num, den = numerator * k * s, 10**decimals * e
    expected = max(1, min(s, -(-num // den)))
    assert moe.capacity(group_size=s, training=True) == expected, (
        cf_text, k, s, e)
    exact_integer_cases += num % den == 0
    float_ceil = max(1, min(s, math.ceil(cf * k * s / e)))
    float_errors += float_ceil != expected
  # The hard cases were exercised: the float formula is off in some.
  assert exact_integer_cases > 1000
  assert float_errors > 20


def test_capacity_eval_factor_zero_is_no_drop_and_bad_group_is_rejected():
  moe = config_lib.MoeConfig(num_experts=4, eval_capacity_factor=0.0)
  assert moe.capacity(group_size=37, training=False) == 37
  with pytest.raises(ValueError, match="group_size=0"):
    moe.capacity(group_size=0, training=True)
