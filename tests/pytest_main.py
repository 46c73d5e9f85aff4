"""Entry point of the Bazel py_test targets: runs pytest on the given files.

`tests/BUILD` makes one py_test per `tests/test_*.py` with this file as its
main and the test file as its argument, so `bazel test //tests:all` runs the
same pytest tests as `python3 -m pytest tests`.
"""

import sys

import pytest

if __name__ == "__main__":
  sys.exit(pytest.main(["-q", "-p", "no:cacheprovider", *sys.argv[1:]]))
