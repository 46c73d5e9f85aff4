"""The per-model evaluation JSON: schema, writing and validated reading.

One file per model::

  {
    "schema": "m4moe.eval/1",
    "model": "moe_tiny",            # display name in reports
    "kind": "multilingual",         # or "bilingual" (a baseline)
    "metadata": {                   # free-form; the report reads, if present:
      "num_params": 1234567,        #   total weights
      "num_experts": 8,             #   E per MoE layer (0 = dense)
      "num_layers": 8,              #   L = encoder + decoder layers
      "config": {...},              #   ModelConfig.to_dict()
      "beam_size": 4, "alpha": 0.6, "checkpoint": "...", "test_split": "..."
    },
    "languages": {                  # key: the non-English language
      "de": {LanguageScore fields: bleu, chrf, signatures, num_segments,
             train_size, status, tokenizer, source_lang, target_lang}
    }
  }

Bilingual baselines are one file per language pair (``kind: bilingual``)
or one file holding several languages; the report merges them.

The paths in ``metadata`` (``PATH_FIELDS``: ``model_dir``, ``checkpoint``,
``corpus_dir``, ``hypotheses_dir``) are written relative to the JSON's own
directory (m4moe-eval), so the file and its hypotheses beside it can be
copied into ``results/`` and read on another machine;
:func:`read_eval_json` joins them to that directory again.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import pathlib
from typing import Any, Mapping

from m4moe import jsonfile
from m4moe.eval import scoring
from m4moe.eval import textio

SCHEMA = "m4moe.eval/1"
# Metadata paths, relative to the eval JSON's directory.
PATH_FIELDS = ("model_dir", "checkpoint", "corpus_dir", "hypotheses_dir")
KINDS = ("multilingual", "bilingual")


@dataclasses.dataclass(frozen=True, kw_only=True)
class EvalResult:
  """Scores of one model on a test split, per language."""

  model: str
  kind: str = "multilingual"
  metadata: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  languages: Mapping[str, scoring.LanguageScore] = dataclasses.field(
      default_factory=dict)

  def __post_init__(self) -> None:
    if not self.model:
      raise ValueError("an eval result needs a non-empty model name")
    if self.kind not in KINDS:
      raise ValueError(f"kind={self.kind!r}: use one of {', '.join(KINDS)}")

  def to_dict(self) -> dict[str, Any]:
    return {"schema": SCHEMA, "model": self.model, "kind": self.kind,
            "metadata": dict(self.metadata),
            "languages": {k: v.to_dict()
                          for k, v in sorted(self.languages.items())}}


def write_eval_json(result: EvalResult, path: str | os.PathLike[str]) -> None:
  """Writes atomically (temporary file + rename)."""
  textio.write_text_atomic(path, json.dumps(
      result.to_dict(), indent=1, ensure_ascii=False, allow_nan=False) + "\n")


def _is_number(value: Any) -> bool:
  return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_count(value: Any) -> bool:
  return isinstance(value, int) and not isinstance(value, bool) and value >= 0


_SCORE_FIELDS = ("bleu", "chrf")
_COUNT_FIELDS = ("num_segments",)
_OPTIONAL_COUNT_FIELDS = ("train_size",)
_TEXT_FIELDS = ("source_lang", "target_lang", "status", "tokenizer")
_OPTIONAL_TEXT_FIELDS = ("bleu_signature", "chrf_signature")
_METADATA_COUNTS = ("num_params", "num_experts", "num_layers",
                    "num_experts_total")


def validate_eval_dict(data: Any) -> list[str]:
  """Problems of a parsed eval JSON against the schema (empty: valid).

  Checks types, that BLEU and chrF are finite and in [0, 100] (or null),
  and that sizes (segments, training pairs, parameter counts) are
  non-negative integers. Each problem names its field, e.g.
  ``languages.de.bleu``.
  """
  if not isinstance(data, dict):
    return [f"top level: expected a JSON object, got {type(data).__name__}"]
  problems = []
  if data.get("schema") != SCHEMA:
    problems.append(f"schema: {data.get('schema')!r}, expected {SCHEMA!r} "
                    "(write it with m4moe-eval)")
  if "model" in data and not (isinstance(data["model"], str) and
                              data["model"]):
    problems.append(f"model: {data['model']!r} is not a non-empty string")
  if "kind" in data and data["kind"] not in KINDS:
    problems.append(f"kind: {data['kind']!r} is not one of {', '.join(KINDS)}")
  metadata = data.get("metadata", {})
  if not isinstance(metadata, dict):
    problems.append("metadata: expected an object, got "
                    f"{type(metadata).__name__}")
    metadata = {}
  for key in _METADATA_COUNTS:
    if metadata.get(key) is not None and not _is_count(metadata[key]):
      problems.append(f"metadata.{key}: {metadata[key]!r} is not a "
                      "non-negative integer")
  languages = data.get("languages", {})
  if not isinstance(languages, dict):
    return problems + ["languages: expected an object of language -> "
                       f"scores, got {type(languages).__name__}"]
  for lang, values in languages.items():
    problems += _language_problems(f"languages.{lang}", values)
  return problems


def _language_problems(where: str, values: Any) -> list[str]:
  """Problems of one language's scores, each named from ``where`` on.

  Every field is checked rather than stopping at the first bad one, so one
  read of a hand-edited baseline file lists all that needs fixing.
  """
  if not isinstance(values, dict):
    return [f"{where}: expected an object, got {type(values).__name__}"]
  problems = []
  for key in _SCORE_FIELDS:
    value = values.get(key)
    if value is None:
      continue
    if not _is_number(value):
      problems.append(f"{where}.{key}: {value!r} is not a number")
    elif not (math.isfinite(value) and 0.0 <= value <= 100.0):
      problems.append(f"{where}.{key}: {value!r} is not a finite score in "
                      "[0, 100]")
  for key in _COUNT_FIELDS:
    if key not in values:
      problems.append(f"{where}.{key}: missing")
    elif not _is_count(values[key]):
      problems.append(f"{where}.{key}: {values[key]!r} is not a "
                      "non-negative integer")
  for key in _OPTIONAL_COUNT_FIELDS:
    if values.get(key) is not None and not _is_count(values[key]):
      problems.append(f"{where}.{key}: {values[key]!r} is not a "
                      "non-negative integer")
  for key in _TEXT_FIELDS:
    if key in values and not isinstance(values[key], str):
      problems.append(f"{where}.{key}: {values[key]!r} is not a string")
  for key in _OPTIONAL_TEXT_FIELDS:
    if values.get(key) is not None and not isinstance(values[key], str):
      problems.append(f"{where}.{key}: {values[key]!r} is not a string")
  return problems


def _joined(metadata: Any, directory: pathlib.Path) -> Any:
  """``metadata`` with each relative path of ``PATH_FIELDS`` joined to
  ``directory`` (the eval JSON's); absolute ones (older files) kept."""
  if not isinstance(metadata, dict):
    return metadata
  out = dict(metadata)
  for name in PATH_FIELDS:
    value = out.get(name)
    if isinstance(value, str) and value and not os.path.isabs(value):
      out[name] = os.path.normpath(directory / value)
  return out


def read_eval_json(path: str | os.PathLike[str], *,
                   kind: str | None = None) -> EvalResult:
  """Reads and validates an eval JSON (:func:`validate_eval_dict`).

  Args:
    path: the file.
    kind: overrides the file's ``kind`` (e.g. files given as --baselines).

  Raises:
    ValueError: naming the file, the field and what is wrong with it.
  """
  path = pathlib.Path(path)
  data = jsonfile.load(path, what="eval JSON", expect=None,
                       fix="re-run m4moe-eval to rewrite it (it writes "
                       "atomically), or leave it out")
  problems = validate_eval_dict(data)
  if problems:
    raise ValueError(f"{path}: invalid eval JSON: {'; '.join(problems)} "
                     "(rewrite it with m4moe-eval or fix these fields)")
  try:
    languages = {lang: scoring.LanguageScore.from_dict(
        {"language": lang, **values})
                 for lang, values in data.get("languages", {}).items()}
    return EvalResult(model=data.get("model", path.stem),
                      kind=kind or data.get("kind", "multilingual"),
                      metadata=_joined(data.get("metadata", {}), path.parent),
                      languages=languages)
  except (TypeError, ValueError) as e:
    raise ValueError(f"{path}: {e}") from e
