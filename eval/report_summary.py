"""The report's ``summary.json``: the averages, exclusions, dev CE,
intervals, source reliance and examples, machine-readable and strict JSON.

Other JSON readers reject NaN and infinity, so every non-finite number is
written as null and listed (:func:`strict_summary`).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping, Sequence

import numpy as np

from m4moe.eval import comparison as comparison_lib
from m4moe.eval import dev_ce as dev_ce_lib
from m4moe.eval import examples as examples_lib
from m4moe.eval import intervals as intervals_lib
from m4moe.eval import seeds as seeds_lib
from m4moe.eval import source_reliance as reliance_lib


def _dev_ce_summary(dev: dev_ce_lib.DevCeComparison | None
                    ) -> dict[str, Any] | None:
  if dev is None or not dev.available:
    return None
  return {
      "baseline": dict(dev.baseline),
      "baseline_models": dict(dev.baseline_models),
      "averaged": list(dev.averaged),
      "excluded": {k: list(v) for k, v in dev.excluded.items()},
      "models_without": dict(dev.models_without),
      "models": {m: {"ce": dict(dev.ce[m]), "delta": dict(dev.delta[m]),
                     "buckets": {b: dataclasses.asdict(a) for b, a in
                                 dev.averages[m].items()}}
                 for m in dev.models},
      "baseline_buckets": {
          b: dataclasses.asdict(a) for b, a in
          dev.averages[comparison_lib.BASELINE_NAME].items()},
  }


def summary(comp, dev: dev_ce_lib.DevCeComparison | None = None, *,
             split: str = "test",
             groups: Sequence[seeds_lib.ModelGroup] = (),
             intervals: intervals_lib.Intervals | None = None,
             reliance: reliance_lib.SourceRelianceComparison | None = None,
             examples: Mapping[str, Sequence[examples_lib.Example]]
             | None = None,
             runs: Sequence[examples_lib.RunOutputs] = ()
             ) -> dict[str, Any]:
  return {
      "split": split,
      "languages": list(comp.languages),
      "averaged": list(comp.averaged),
      "excluded": {k: list(v) for k, v in comp.excluded.items()},
      "bucket_bounds": dataclasses.asdict(comp.bounds),
      "buckets": dict(comp.buckets),
      "averages": {name: {b: dataclasses.asdict(a) for b, a in avg.items()}
                   for name, avg in comp.averages.items()},
      "notes": list(comp.notes),
      "dev_ce": _dev_ce_summary(dev),
      "num_seeds": {g.name: g.num_seeds for g in groups},
      "seeds": {g.name: list(g.seeds) for g in groups},
      "intervals": intervals.to_dict() if intervals is not None else None,
      "source_reliance": (reliance.to_dict() if reliance is not None
                          else None),
      "examples": {lang: [e.to_dict() for e in items]
                   for lang, items in (examples or {}).items()},
      "hypotheses": {run.label: {
          "dir": None if run.hypotheses_dir is None
          else str(run.hypotheses_dir),
          "languages": sorted(run.languages), "missing": run.missing,
          "problems": dict(run.problems)} for run in runs},
  }


def strict_json(value: Any) -> Any:
  """``value`` with every non-finite float (NaN, ±inf) replaced by None."""
  if isinstance(value, float):
    return value if math.isfinite(value) else None
  if isinstance(value, Mapping):
    return {k: strict_json(v) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return [strict_json(v) for v in value]
  if isinstance(value, np.generic):
    return strict_json(value.item())
  return value


def nonfinite_paths(value: Any, prefix: str = "") -> list[str]:
  """Dotted paths of the non-finite floats in ``value`` (what
  :func:`strict_json` turns into null)."""
  if isinstance(value, np.generic):
    value = value.item()
  if isinstance(value, float):
    return [] if math.isfinite(value) else [prefix or "<root>"]
  if isinstance(value, Mapping):
    return [p for k, v in value.items()
            for p in nonfinite_paths(v, f"{prefix}.{k}" if prefix else str(k))]
  if isinstance(value, (list, tuple)):
    return [p for i, v in enumerate(value)
            for p in nonfinite_paths(v, f"{prefix}[{i}]")]
  return []


def strict_summary(summary: Mapping[str, Any]) -> dict[str, Any]:
  """``summary`` as strict JSON: non-finite floats become null, and a note
  in ``notes`` plus ``nonfinite_as_null`` list the fields replaced."""
  replaced = nonfinite_paths(summary)
  out = strict_json(summary)
  out["nonfinite_as_null"] = replaced
  if replaced:
    shown = ", ".join(replaced[:10]) + (" ..." if len(replaced) > 10 else "")
    out["notes"] = [*out.get("notes", []),
                    f"{len(replaced)} non-finite value(s) (NaN or infinity) "
                    f"written as null: {shown}"]
  return out
