"""tests/conftest.py puts the global absl FLAGS back after every test.

Tools' ``main`` functions read the global FLAGS, and some tests parse them
in-process; without the restore, a flag parsed by one test would be seen
by whichever test its worker runs next (the suite runs in several
processes and in any order).
"""

from absl import flags
from absl.testing import flagsaver

import conftest

flags.DEFINE_integer("isolation_probe", 1, "A flag only this test parses.")


def test_flags_parsed_by_a_test_are_put_back():
  values = flags.FLAGS
  saved, was_parsed = flagsaver.save_flag_values(), values.is_parsed()
  values(["prog", "--isolation_probe=5"])
  assert values.isolation_probe == 5 and values.is_parsed()
  conftest._restore_flags(saved, was_parsed)  # pylint: disable=protected-access
  assert values.is_parsed() == was_parsed
  assert not values["isolation_probe"].present
  assert values["isolation_probe"].value == 1


def test_a_flag_defined_during_a_test_stays_defined_at_its_default():
  values = flags.FLAGS
  saved, was_parsed = flagsaver.save_flag_values(), values.is_parsed()
  flags.DEFINE_string("isolation_probe_late", "default", "Defined late.")
  values["isolation_probe_late"].parse("changed")
  conftest._restore_flags(saved, was_parsed)  # pylint: disable=protected-access
  assert "isolation_probe_late" in values
  assert values["isolation_probe_late"].value == "default"
