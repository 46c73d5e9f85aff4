"""What every test of the suite starts from, whatever ran before it.

The fast suite runs in several worker processes (pytest-xdist), and
``-p randomly`` shuffles it, so no test may see what another left behind
in its process:

* the global absl ``FLAGS`` (a tool's ``main`` reads parsed flags): each
  test starts with the values, and the parsed state, the flags had before
  it; flags defined by a module it imported first go back to their
  defaults;
* random state: TensorFlow's global seed, NumPy's and Python's, reset to
  one value before each test;
* the environment and the working directory, restored after each test;
* TensorFlow op determinism, on in every process from the start (before
  any test module is imported), since it cannot be turned off again and
  several tests need it; so a test runs alone as it runs in the suite.

It also makes the test helpers (toy_model, report_fixtures, browser)
importable by the child processes some tests start (a killed or signalled
trainer runs as a script outside tests/): the tests directory goes on
PYTHONPATH.
"""

from __future__ import annotations

import os
import pathlib
import random
from typing import Iterator

from absl import flags
from absl.testing import flagsaver
import numpy as np
import pytest
import tensorflow as tf

_TESTS = str(pathlib.Path(__file__).resolve().parent)
_PATH = os.environ.get("PYTHONPATH", "")
if _TESTS not in _PATH.split(os.pathsep):
  os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (_TESTS, _PATH) if p)

SEED = 0

# Before any test module is collected: module-level model weights (e.g.
# tests/test_dispatch.py's routers) are drawn under determinism, which
# needs a global seed.
tf.config.experimental.enable_op_determinism()
tf.random.set_seed(SEED)


def _restore_flags(saved: dict[str, dict], was_parsed: bool) -> None:
  """Puts the global FLAGS back as :func:`flagsaver.save_flag_values` saw
  them; a flag defined since then keeps existing, at its default."""
  values = flags.FLAGS
  new = [name for name in values if name not in saved]
  for name in new:
    values[name].unparse()
  if new:
    now = flagsaver.save_flag_values(values)
    saved = {**saved, **{name: now[name] for name in new}}
  if not was_parsed and values.is_parsed():
    values.unparse_flags()
  flagsaver.restore_flag_values(saved, values)
  if was_parsed and not values.is_parsed():
    values.mark_as_parsed()


@pytest.fixture(autouse=True)
def _isolated_process_state() -> Iterator[None]:
  """Each test: the same seeds; FLAGS, environment and cwd restored."""
  saved_flags = flagsaver.save_flag_values()
  was_parsed = flags.FLAGS.is_parsed()
  environ = dict(os.environ)
  cwd = os.getcwd()
  tf.random.set_seed(SEED)
  np.random.seed(SEED)
  random.seed(SEED)
  try:
    yield
  finally:
    _restore_flags(saved_flags, was_parsed)
    os.chdir(cwd)
    if dict(os.environ) != environ:
      os.environ.clear()
      os.environ.update(environ)
