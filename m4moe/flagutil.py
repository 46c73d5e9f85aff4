"""Config dataclasses as absl flags: one flag per field, one way back.

A frozen config dataclass documents each field in its ``Attributes:``
docstring section; :func:`define_flags` turns every field into an absl flag
of the same name (or the name given in ``rename``), typed by the field's
default and helped by its docstring line; :func:`from_flags` builds the
validated dataclass back from parsed flags; :func:`present_flags` lists the
flags given explicitly, serialised, so a tool that loads a zoo flagfile can
apply the command line on top of it.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

from absl import flags


def field_help(cls: type, name: str) -> str:
  """The docstring line of field ``name`` of ``cls`` (``Attributes:`` style)."""
  lines = (cls.__doc__ or "").split("\n")
  for i, line in enumerate(lines):
    head, sep, tail = line.strip().partition(":")
    if sep and name in [h.strip() for h in head.split(",")]:
      text = [tail.strip()]
      indent = len(line) - len(line.lstrip())
      for more in lines[i + 1:]:
        if not more.strip() or len(more) - len(more.lstrip()) <= indent:
          break
        text.append(more.strip())
      return " ".join(t for t in text if t)
  return name


def _fields(cls: type, rename: Mapping[str, str]
            ) -> list[tuple[str, dataclasses.Field]]:
  return [(rename.get(f.name, f.name), f) for f in dataclasses.fields(cls)
          if f.default is not dataclasses.MISSING]


def define_flags(cls: type, flag_values: flags.FlagValues = flags.FLAGS, *,
                 rename: Mapping[str, str] | None = None,
                 enums: Mapping[str, Sequence[str]] | None = None) -> None:
  """One absl flag per defaulted field of ``cls`` (idempotent per name).

  Args:
    cls: a dataclass whose fields have bool/int/float/str defaults.
    flag_values: where to define them.
    rename: {field: flag name} where they differ.
    enums: {field: allowed values} for enum flags.
  """
  rename, enums = dict(rename or {}), dict(enums or {})
  for flag, field in _fields(cls, rename):
    if flag in flag_values:
      continue
    default, help_text = field.default, field_help(cls, field.name)
    if field.name in enums:
      flags.DEFINE_enum(flag, default, list(enums[field.name]), help_text,
                        flag_values=flag_values)
    elif isinstance(default, bool):
      flags.DEFINE_bool(flag, default, help_text, flag_values=flag_values)
    elif isinstance(default, int):
      flags.DEFINE_integer(flag, default, help_text, flag_values=flag_values)
    elif isinstance(default, float):
      flags.DEFINE_float(flag, default, help_text, flag_values=flag_values)
    else:
      flags.DEFINE_string(flag, default, help_text, flag_values=flag_values)


def from_flags(cls: type, flag_values: flags.FlagValues = flags.FLAGS, *,
               rename: Mapping[str, str] | None = None,
               **overrides: Any) -> Any:
  """``cls(**{field: flag value})``; ``overrides`` win over the flags."""
  rename = dict(rename or {})
  kwargs = {field.name: overrides.get(field.name, flag_values[flag].value)
            for flag, field in _fields(cls, rename)}
  return cls(**kwargs)


def present_flags(cls: type, flag_values: flags.FlagValues = flags.FLAGS, *,
                  rename: Mapping[str, str] | None = None) -> list[str]:
  """The flags of ``cls`` given explicitly, serialised (``["--beta1=0.9"]``)."""
  rename = dict(rename or {})
  return [flag_values[flag].serialize() for flag, _ in _fields(cls, rename)
          if flag_values[flag].present]
