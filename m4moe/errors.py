"""One error family for bad settings, and the one helper that raises it.

Every config dataclass validates itself at construction and reports a bad
value as ``--flag=value is invalid: how to fix it``, naming the absl flag the
user sets (the field name, or its flag name where they differ). The
subclasses (:class:`m4moe.training.optimizer.OptimizerConfigError`,
:class:`m4moe.training.loop.TrainConfigError`,
:class:`m4moe.training.inputs.DataConfigError`) say which config it was; a
tool catches :class:`ConfigError` (a ``ValueError``) for all of them.
"""

from __future__ import annotations

from typing import Any


class ConfigError(ValueError):
  """A configuration value is invalid; the message names the flag and the fix."""


def require(condition: bool, flag: str, value: Any, fix: str, *,
            error: type[ConfigError] = ConfigError) -> None:
  """Raises ``error("--flag=value is invalid: fix")`` unless ``condition``.

  Args:
    condition: True when the value is fine.
    flag: the flag name, without dashes.
    value: the bad value (shown with ``repr``).
    fix: what to do instead, e.g. "use a positive integer".
    error: the :class:`ConfigError` subclass to raise.
  """
  if not condition:
    raise error(f"--{flag}={value!r} is invalid: {fix}")
