"""m4moe's command-line tools, one absl app per module (``m4moe-<name>``).

Each module's ``run()`` is its console-script entry point and goes through
:func:`run_tool`, so ``--help`` prints the module's docstring and the flags
the tool defines, as ``python -m m4moe.cli.<name> --help`` does.
"""

from __future__ import annotations

import sys
from typing import Any, Callable

from absl import app
from absl import flags


def run_tool(main: Callable[[list[str]], Any], *, module: str,
             flags_parser: Callable[[list[str]], Any] | None = None) -> None:
  """Runs ``main`` as the absl app of the tool module named ``module``.

  A console script's ``__main__`` is a generated wrapper with no docstring
  and no flags of its own, so absl's ``--help`` would print only a usage
  line. This gives ``__main__`` the tool's docstring and makes every flag
  defined by an ``m4moe`` module (the tool's own, and those it generates
  from config dataclasses) a key flag of the program.
  """
  main_module = sys.modules["__main__"]
  if main_module is not sys.modules[module]:
    main_module.__doc__ = sys.modules[module].__doc__
    program = sys.argv[0]
    for name, defined in flags.FLAGS.flags_by_module_dict().items():
      if name.split(".")[0] == "m4moe":
        for flag in defined:
          flags.FLAGS.register_key_flag_for_module(program, flag)
  if flags_parser is None:
    app.run(main)
  else:
    app.run(main, flags_parser=flags_parser)
