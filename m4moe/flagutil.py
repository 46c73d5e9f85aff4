"""Config dataclasses as absl flags: one flag per field, one way back.

Every config dataclass (:class:`m4moe.config.ModelConfig` with its
:class:`m4moe.config.MoeConfig`, :class:`m4moe.training.optimizer.AdafactorConfig`,
:class:`m4moe.training.loop.TrainConfig`, :class:`m4moe.training.inputs.DataConfig`)
reaches the command line the same way:

* :func:`define_flags` defines one absl flag per field, named like the field
  (or as the field's ``metadata[FLAG]``), typed by its annotation (``bool``,
  ``int``, ``float``, ``str``, ``tuple[str, ...]`` as a comma list; an enum
  where ``metadata[ENUM]`` lists the values), defaulting to the dataclass
  default (no default: ``None``, the config rejects it) and helped by the
  field's line in the class docstring's ``Attributes:`` section. A field
  whose type is itself a config dataclass (``ModelConfig.moe``,
  ``TrainConfig.optimizer``) contributes that class's flags, unprefixed.
* :func:`from_flags` builds the validated dataclass back from parsed flags;
  keyword overrides (any field name, nested ones included) win.
* :func:`present_flags` lists the flags given explicitly, serialised, so a
  tool that loads a zoo flagfile can apply the command line on top of it;
  :func:`to_flags` serialises a config so that parsing the strings and
  :func:`from_flags` give the same config back.

A field with ``metadata[NOT_A_FLAG]`` (the reason) has no flag: the tool
sets it (e.g. ``TrainConfig.batch_tokens`` is copied from the data's
``--batch_tokens``). Two configs may share a flag (``--seed`` of the train
and data configs) only if both fields have the same default;
:func:`define_flags` raises otherwise, so a default cannot drift.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any, Iterator, Mapping, Sequence

from absl import flags

# Field metadata keys.
FLAG = "flag"  # the flag's name where it differs from the field's
ENUM = "enum"  # allowed values: an enum flag
NOT_A_FLAG = "not_a_flag"  # why the field has no flag (the tool sets it)

_KINDS = (bool, int, float, str)

# The flags belong to the module that calls define_flags (a tool's --help
# lists them), not to this helper.
flags.disclaim_key_flags()


def metadata(*, flag: str | None = None, enum: Sequence[str] | None = None,
             not_a_flag: str | None = None) -> dict[str, Any]:
  """Field metadata for ``dataclasses.field(metadata=...)``."""
  out: dict[str, Any] = {}
  if flag is not None:
    out[FLAG] = flag
  if enum is not None:
    out[ENUM] = tuple(enum)
  if not_a_flag is not None:
    out[NOT_A_FLAG] = not_a_flag
  return out


@dataclasses.dataclass(frozen=True, kw_only=True)
class FlagSpec:
  """How one dataclass field maps onto one absl flag.

  Attributes:
    flag: the flag name.
    owner: the dataclass that declares the field.
    path: field names from the outer config down to this field, e.g.
      ``("moe", "router")`` for ``ModelConfig``.
    kind: ``bool``, ``int``, ``float``, ``str``, ``list`` or ``enum``.
    default: the flag default (the dataclass default; a list for tuple
      fields; None for a field without a default).
    enum: the allowed values of an enum flag, else empty.
    help: the field's docstring line.
  """

  flag: str
  owner: type
  path: tuple[str, ...]
  kind: str
  default: Any
  enum: tuple[str, ...] = ()
  help: str = ""


def field_help(cls: type, name: str) -> str:
  """The ``Attributes:`` docstring line(s) of field ``name`` of ``cls``.

  Raises:
    ValueError: the field is not documented (a flag needs a help text).
  """
  lines = (cls.__doc__ or "").split("\n")
  start = next((i for i, line in enumerate(lines)
                if line.strip() == "Attributes:"), len(lines))
  for i in range(start + 1, len(lines)):
    line = lines[i]
    head, sep, tail = line.strip().partition(":")
    if sep and name in [h.strip() for h in head.split(",")]:
      text = [tail.strip()]
      indent = len(line) - len(line.lstrip())
      for more in lines[i + 1:]:
        if not more.strip() or len(more) - len(more.lstrip()) <= indent:
          break
        text.append(more.strip())
      return " ".join(t for t in text if t)
  raise ValueError(f"{cls.__name__}.{name} has no line in the class "
                   "docstring's Attributes: section; document it there (it "
                   "is the flag's help)")


def _kind(cls: type, field: dataclasses.Field, hint: Any) -> str:
  if ENUM in field.metadata:
    return "enum"
  if hint in _KINDS:
    return hint.__name__
  if typing.get_origin(hint) is tuple and typing.get_args(hint) == (str, ...):
    return "list"
  raise TypeError(f"{cls.__name__}.{field.name}: type {hint!r} has no absl "
                  "flag kind; use bool, int, float, str or tuple[str, ...]")


def _default(field: dataclasses.Field) -> Any:
  if field.default is not dataclasses.MISSING:
    value = field.default
  elif field.default_factory is not dataclasses.MISSING:
    value = field.default_factory()
  else:
    return None
  return list(value) if isinstance(value, tuple) else value


def _walk(cls: type, path: tuple[str, ...] = ()
          ) -> Iterator[tuple[tuple[str, ...], type, dataclasses.Field, Any]]:
  """(path, owner, field, type hint) of every field, nested ones expanded."""
  hints = typing.get_type_hints(cls)
  for field in dataclasses.fields(cls):
    hint = hints[field.name]
    if dataclasses.is_dataclass(hint):
      yield from _walk(hint, (*path, field.name))
    else:
      yield (*path, field.name), cls, field, hint


def flag_specs(cls: type) -> list[FlagSpec]:
  """One :class:`FlagSpec` per flag of config dataclass ``cls``, in order."""
  specs = []
  for path, owner, field, hint in _walk(cls):
    if NOT_A_FLAG in field.metadata:
      continue
    specs.append(FlagSpec(
        flag=field.metadata.get(FLAG, field.name), owner=owner, path=path,
        kind=_kind(owner, field, hint), default=_default(field),
        enum=field.metadata.get(ENUM, ()),
        help=field_help(owner, field.name)))
  return specs


def define_flags(cls: type, flag_values: flags.FlagValues = flags.FLAGS
                 ) -> None:
  """Defines one absl flag per field of ``cls`` (see module docstring).

  Idempotent: a flag that already exists is kept if its default is the
  field's.

  Raises:
    ValueError: a flag of that name exists with another default.
  """
  for spec in flag_specs(cls):
    if spec.flag in flag_values:
      existing = flag_values[spec.flag].default
      if existing != spec.default:
        raise ValueError(
            f"--{spec.flag} is already defined with default {existing!r}, "
            f"but {spec.owner.__name__}.{spec.path[-1]} defaults to "
            f"{spec.default!r}: give the fields one default or the flags "
            "different names")
      continue
    kwargs = {"flag_values": flag_values}
    if spec.kind == "enum":
      flags.DEFINE_enum(spec.flag, spec.default, list(spec.enum), spec.help,
                        **kwargs)
    else:
      define = {"bool": flags.DEFINE_bool, "int": flags.DEFINE_integer,
                "float": flags.DEFINE_float, "str": flags.DEFINE_string,
                "list": flags.DEFINE_list}[spec.kind]
      define(spec.flag, spec.default, spec.help, **kwargs)


def _field_names(cls: type) -> set[str]:
  names = set()
  for path, _, _, _ in _walk(cls):
    names.update(path)
  return names


def _build(cls: type, flag_values: flags.FlagValues,
           overrides: Mapping[str, Any]) -> Any:
  hints = typing.get_type_hints(cls)
  kwargs = {}
  for field in dataclasses.fields(cls):
    if field.name in overrides:
      kwargs[field.name] = overrides[field.name]
    elif dataclasses.is_dataclass(hints[field.name]):
      kwargs[field.name] = _build(hints[field.name], flag_values, overrides)
    elif NOT_A_FLAG not in field.metadata:
      value = flag_values[field.metadata.get(FLAG, field.name)].value
      kwargs[field.name] = tuple(value) if isinstance(value, list) else value
  return cls(**kwargs)


def from_flags(cls: type, flag_values: flags.FlagValues = flags.FLAGS,
               **overrides: Any) -> Any:
  """The validated ``cls`` from parsed flags; ``overrides`` win.

  Args:
    cls: a config dataclass whose flags :func:`define_flags` defined.
    flag_values: the parsed flags.
    **overrides: field values (by field name, at any nesting level; a whole
      nested config by its field name) used instead of the flags; fields
      without a flag keep their dataclass default unless given here.

  Raises:
    TypeError: an override names no field of ``cls``.
    m4moe.errors.ConfigError: a value is invalid (from the dataclass).
  """
  unknown = sorted(set(overrides) - _field_names(cls))
  if unknown:
    raise TypeError(f"{cls.__name__} has no field {', '.join(unknown)}")
  return _build(cls, flag_values, overrides)


def present_flags(cls: type, flag_values: flags.FlagValues = flags.FLAGS
                  ) -> list[str]:
  """The flags of ``cls`` given explicitly, serialised (``["--beta1=0.9"]``)."""
  return [flag_values[spec.flag].serialize() for spec in flag_specs(cls)
          if flag_values[spec.flag].present]


def to_flags(config: Any) -> list[str]:
  """``config`` as flag strings: parsed and :func:`from_flags`, it returns.

  Fields without a flag are left out; a field whose value is None (a
  required field not set) too.
  """
  out = []
  for spec in flag_specs(type(config)):
    value = config
    for name in spec.path:
      value = getattr(value, name)
    if value is None:
      continue
    if spec.kind == "bool":
      out.append(f"--{spec.flag}" if value else f"--no{spec.flag}")
    elif spec.kind == "list":
      out.append(f"--{spec.flag}={','.join(value)}")
    else:
      out.append(f"--{spec.flag}={value}")
  return out
