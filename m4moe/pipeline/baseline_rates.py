r"""Each bilingual baseline's peak rate, chosen per language on dev CE.

The multilingual models of a study get their peak rate chosen on dev
(``study3_screen``); the bilingual baselines they are measured against get
the same choice. For every language this compares two runs of the same
baseline on the same data: one committed with an earlier study (its
``metrics/bilingual_<lang>.jsonl`` under ``--reference``) and one of
``--run_dir`` at another rate, and picks the rate whose run reached the
lower best dev cross-entropy (ties keep the reference's rate). The runs are
comparable only on the same corpus and vocabularies, so the tool first
checks the run directory's against the reference's ``inputs.sha256`` (as
``m4moe.pipeline.restore`` does) and refuses if any differs::

  python3 -m m4moe.pipeline.baseline_rates --run_dir=runs/study3_baselines \
      --reference=results/study/v2 --reference_flags=--learning_rate=0.031623 \
      --candidate_flags=--learning_rate=0.126491 \
      --output=results/study/v3/baseline_rates

It writes ``baseline_rates.md`` (the table) and ``baseline_rates.json``
(per language both runs' best dev CE and step, the choice, and the flags of
the chosen rate for the recipe's ``[baselines.<lang>]``). Reads dev CE from
the training logs only; no split other than dev is read.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
from typing import Any, Sequence

from absl import app
from absl import flags

from m4moe import cli
from m4moe.eval import training_logs
from m4moe.pipeline import restore
from m4moe.training import metrics_log


@dataclasses.dataclass(frozen=True, kw_only=True)
class Choice:
  """One language's rate choice.

  Attributes:
    language: the source language.
    reference: (best dev CE, its step) of the reference run.
    candidate: (best dev CE, its step) of the run at the other rate.
    chosen: "reference" or "candidate".
  """

  language: str
  reference: tuple[float, int]
  candidate: tuple[float, int]
  chosen: str

  def to_dict(self, flag_sets: dict[str, Sequence[str]]) -> dict[str, Any]:
    return {"language": self.language,
            "reference_best_dev_ce": round(self.reference[0], 4),
            "reference_best_step": self.reference[1],
            "candidate_best_dev_ce": round(self.candidate[0], 4),
            "candidate_best_step": self.candidate[1],
            "candidate_minus_reference": round(
                self.candidate[0] - self.reference[0], 4),
            "chosen": self.chosen, "flags": list(flag_sets[self.chosen])}


def best_dev_ce(path: pathlib.Path) -> tuple[float, int]:
  """(lowest dev CE, its step) of a training log.

  Raises:
    ValueError: the log has no dev evaluation, naming it.
  """
  curve = training_logs.dev_ce_curve(metrics_log.read_metrics(path))
  if not curve:
    raise ValueError(f"{path} has no dev evaluation: has the run trained "
                     "past its first eval_every steps?")
  step, ce = min(curve, key=lambda point: (point[1], point[0]))
  return ce, step


def choose(*, language: str, reference: pathlib.Path,
           candidate: pathlib.Path) -> Choice:
  """The rate of the run with the lower best dev CE (ties: reference)."""
  ref, cand = best_dev_ce(reference), best_dev_ce(candidate)
  return Choice(language=language, reference=ref, candidate=cand,
                chosen="candidate" if cand[0] < ref[0] else "reference")


def markdown(choices: Sequence[Choice], *, reference_flags: Sequence[str],
             candidate_flags: Sequence[str]) -> str:
  lines = [f"Reference: `{' '.join(reference_flags)}`; candidate: "
           f"`{' '.join(candidate_flags)}`. Best dev CE (nats/token) and "
           "its step; the lower wins.", "",
           "| language | reference | candidate | candidate − reference | "
           "chosen |", "| --- | ---: | ---: | ---: | --- |"]
  for c in choices:
    lines.append(
        f"| {c.language} | {c.reference[0]:.3f} @ {c.reference[1]} | "
        f"{c.candidate[0]:.3f} @ {c.candidate[1]} | "
        f"{c.candidate[0] - c.reference[0]:+.3f} | {c.chosen} |")
  return "\n".join(lines)


def _paths(run_dir: pathlib.Path, reference: pathlib.Path,
           languages: Sequence[str]
           ) -> list[tuple[str, pathlib.Path, pathlib.Path]]:
  out = []
  for lang in languages:
    ref = reference / "metrics" / f"bilingual_{lang}.jsonl"
    cand = (run_dir / "models" / f"bilingual_{lang}"
            / metrics_log.METRICS_FILENAME)
    for path in (ref, cand):
      if not path.is_file():
        raise app.UsageError(f"{path} does not exist: has bilingual_{lang} "
                             "finished in both?")
    out.append((lang, ref, cand))
  return out


def _define_flags() -> None:
  flags.DEFINE_string("run_dir", None, "Run directory of the baselines at "
                      "the candidate rate (models/bilingual_<lang>/).")
  flags.DEFINE_string("reference", None, "A committed study's results "
                      "folder (inputs.sha256, metrics/bilingual_<lang>.jsonl).")
  flags.DEFINE_list("languages", None, "Languages (default: every "
                    "bilingual_<lang> of --run_dir).")
  flags.DEFINE_list("reference_flags", [], "The reference rate's "
                    "m4moe-train flags, recorded with the choice.")
  flags.DEFINE_list("candidate_flags", [], "The candidate rate's flags.")
  flags.DEFINE_string("output", None, "Folder for baseline_rates.md/.json.")


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  values = flags.FLAGS
  if not (values.run_dir and values.reference and values.output):
    raise app.UsageError("give --run_dir, --reference and --output")
  run_dir, reference = (pathlib.Path(values.run_dir),
                        pathlib.Path(values.reference))
  if not (run_dir / "corpus").is_dir():
    raise app.UsageError(f"{run_dir / 'corpus'} does not exist: give the "
                         "run directory of the baselines' recipe")
  bad = restore.check_inputs(reference, run_dir)
  if bad:
    raise app.UsageError(
        f"{len(bad)} corpus or vocabulary file(s) of {run_dir} differ from "
        f"{reference / 'inputs.sha256'} (first: {bad[0]}): the runs are not "
        "comparable; build the corpus and vocabularies with the recipe the "
        "reference used")
  languages = values.languages or sorted(
      p.name.removeprefix("bilingual_")
      for p in (run_dir / "models").glob("bilingual_*"))
  choices = [choose(language=lang, reference=ref, candidate=cand)
             for lang, ref, cand in _paths(run_dir, reference, languages)]
  flag_sets = {"reference": values.reference_flags,
               "candidate": values.candidate_flags}
  out = pathlib.Path(values.output)
  out.mkdir(parents=True, exist_ok=True)
  text = markdown(choices, reference_flags=values.reference_flags,
                  candidate_flags=values.candidate_flags)
  (out / "baseline_rates.md").write_text(text + "\n", encoding="utf-8")
  (out / "baseline_rates.json").write_text(json.dumps(
      {"reference": str(reference), "selected_on": "dev",
       "languages": [c.to_dict(flag_sets) for c in choices]}, indent=1)
      + "\n", encoding="utf-8")
  print(text)


if __name__ == "__main__":
  _define_flags()
  cli.run_tool(main, module=__name__)
