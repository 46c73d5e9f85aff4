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
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
from typing import Any, Mapping

from m4moe.eval import scoring

SCHEMA = "m4moe.eval/1"
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
  path = pathlib.Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  tmp = path.with_name(f".{path.name}.tmp")
  tmp.write_text(json.dumps(result.to_dict(), indent=1, ensure_ascii=False)
                 + "\n", encoding="utf-8")
  os.replace(tmp, path)


def read_eval_json(path: str | os.PathLike[str], *,
                   kind: str | None = None) -> EvalResult:
  """Reads and validates an eval JSON.

  Args:
    path: the file.
    kind: overrides the file's ``kind`` (e.g. files given as --baselines).

  Raises:
    ValueError: naming the file and what is wrong with it.
  """
  path = pathlib.Path(path)
  try:
    data = json.loads(path.read_text(encoding="utf-8"))
  except (OSError, json.JSONDecodeError) as e:
    raise ValueError(f"{path}: not a readable eval JSON ({e})") from e
  if data.get("schema") != SCHEMA:
    raise ValueError(f"{path}: schema {data.get('schema')!r}, expected "
                     f"{SCHEMA!r} (write it with m4moe-eval)")
  try:
    languages = {lang: scoring.LanguageScore.from_dict(
        {"language": lang, **values})
                 for lang, values in data.get("languages", {}).items()}
    return EvalResult(model=data.get("model", path.stem),
                      kind=kind or data.get("kind", "multilingual"),
                      metadata=data.get("metadata", {}), languages=languages)
  except (TypeError, ValueError) as e:
    raise ValueError(f"{path}: {e}") from e
