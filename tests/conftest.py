"""Makes the test helpers (toy_model, report_fixtures, browser) importable
by the child processes some tests start (a killed or signalled trainer runs
as a script outside tests/): the tests directory goes on PYTHONPATH."""

import os
import pathlib

_TESTS = str(pathlib.Path(__file__).resolve().parent)
_PATH = os.environ.get("PYTHONPATH", "")
if _TESTS not in _PATH.split(os.pathsep):
  os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (_TESTS, _PATH) if p)
