"""The final comparison's report: both dev-chosen recipes on unseen sentences.

Each system ran its recipe (chosen on dev by ``select.py``) with every seed;
per split (the test split past the sentences earlier selections read, and
``test_ood``) this assembles ``peer.json``: per system the per-seed BLEU and
chrF++ with their seed spread (``m4moe.eval.seeds.spread``) and the
seed-mean's 95% interval over test sentences, and m4moe minus the peer with
sacrebleu's paired bootstrap (``m4moe.eval.significance``: each seed's
hypotheses are resampled with the same sentence indices, the seeds'
resamples averaged index by index); tokens/s and decode sentences/s with
their seed spread; per seed and split, how many outputs repeat a word or
phrase three times in a row (a degenerate seed shows there first).

It also sets the test gap beside the dev gap of the two picks (the
selection's paired bootstrap over the same seeds): a test gap outside
what dev predicted, by more than both intervals, is a finding to explain
before the test number is published (:func:`gap_check`,
:func:`warnings`); and it carries every run's schedule check, so a run
that stopped inside its warmup or before its planned end is visible.
Nothing here resamples or tests by itself.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from m4moe.benchmarks.peer import selection
from m4moe.eval import seeds as seeds_lib
from m4moe.eval import significance

SPLITS = ("test", "test_ood")
METRICS = ("bleu", "chrf")


def _metric_block(hyps_by_seed: Sequence[Sequence[str]],
                  references: Sequence[str], *, metric: str,
                  n_samples: int) -> tuple[dict[str, Any],
                                           significance.Resamples]:
  """Per-seed scores, their spread, and the seed-mean's interval."""
  resamples = [significance.resample(h, references, metric=metric,
                                     target_lang="en", n_samples=n_samples)
               for h in hyps_by_seed]
  mean = significance.mean_resamples(resamples)
  spread = seeds_lib.spread([r.score for r in resamples])
  return ({"per_seed": [round(r.score, 2) for r in resamples],
           "seed_spread": spread.to_dict(),
           "interval": significance.interval(mean).to_dict()}, mean)


def repeats_three_times(hypothesis: str, *, max_n: int = 3) -> bool:
  """Whether a word or phrase of up to ``max_n`` words occurs three times
  in a row ("Download Download Download"): the degenerate output a
  diverging or undertrained run produces."""
  words = hypothesis.split()
  for n in range(1, max_n + 1):
    for i in range(len(words) - 3 * n + 1):
      if words[i:i + n] == words[i + n:i + 2 * n] == words[i + 2 * n:
                                                           i + 3 * n]:
        return True
  return False


def _speed(runs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
  out = {"steps": seeds_lib.spread([r["train"]["steps"] for r in runs]
                                   ).to_dict(),
         "target_tokens_per_sec": seeds_lib.spread(
             [r["train"]["target_tokens_per_sec"] for r in runs]).to_dict(),
         "target_tokens": [r["train"].get("target_tokens") for r in runs],
         "dev_ce": seeds_lib.spread([r["train"]["dev_ce"] for r in runs]
                                    ).to_dict()}
  for split in SPLITS:
    out[f"decode_sentences_per_sec_{split}"] = seeds_lib.spread(
        [r["splits"][split]["sentences_per_sec"] for r in runs]).to_dict()
  return out


def schedule_entry(runs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
  """Per seed: steps, final learning rate and the schedule flags."""
  per_seed = [{"seed": r["seed"], **r["schedule_check"]} for r in runs]
  return {"per_seed": per_seed,
          "all_complete": all(c["schedule_complete"] for c in per_seed),
          "all_reached_peak": all(c["peak_reached"] for c in per_seed),
          "flagged_seeds": [c["seed"] for c in per_seed if c["flagged"]]}


def gap_check(dev: Mapping[str, Any], test: Mapping[str, Any]
              ) -> dict[str, Any]:
  """Whether the test gap is where the dev gap said it would be.

  They disagree when their distance exceeds the sum of their 95%
  half-widths (``ci``): the intervals do not overlap.
  """
  distance = abs(test["score"] - dev["score"])
  return {"dev": dev["score"], "dev_ci": dev["ci"], "test": test["score"],
          "test_ci": test["ci"], "distance": distance,
          "disagree": distance > dev["ci"] + test["ci"]}


def warnings(value: Mapping[str, Any]) -> list[str]:
  """What a reader of ``peer.json`` must see before its test numbers."""
  out = []
  for system, entry in value.get("systems", {}).items():
    flagged = entry.get("schedule", {}).get("flagged_seeds", [])
    if flagged:
      out.append(f"{system} seed(s) {flagged}: the schedule was not "
                 "followed (peak not reached or stopped before the planned "
                 "end); see systems.{system}.schedule")
  check = value.get("dev_vs_test", {})
  if check.get("disagree"):
    out.append(f"dev gap {check['dev']:+.2f} ±{check['dev_ci']:.2f} and "
               f"test gap {check['test']:+.2f} ±{check['test_ci']:.2f} BLEU "
               "disagree by more than their intervals: find out why before "
               "publishing the test number")
  return out


def recipe_entry(pick: selection.Ranked) -> dict[str, Any]:
  """A chosen recipe as ``peer.json`` records it."""
  return {"candidate": pick.candidate, "change": pick.why,
          "settings": list(pick.settings), "batch_tokens": pick.batch_tokens,
          "selected_on": selection.SELECTED_ON,
          "dev_bleu_per_seed": list(pick.bleu),
          "dev_bleu_mean": round(pick.bleu_mean, 2),
          "dev_ce_mean": round(pick.dev_ce_mean, 4),
          "selection_seeds": list(pick.seeds), "selection_rank": pick.rank}


def report(*, picks: Mapping[str, selection.Ranked],
           runs: Mapping[str, Sequence[Mapping[str, Any]]],
           hypotheses: Mapping[str, Mapping[str, Sequence[Sequence[str]]]],
           references: Mapping[str, Sequence[str]],
           splits: Mapping[str, Any], setup: Mapping[str, Any],
           dev_gap: Mapping[str, Any] | None = None,
           n_samples: int = significance.DEFAULT_SAMPLES) -> dict[str, Any]:
  """``peer.json``.

  Args:
    picks: system -> its recipe chosen on dev.
    runs: system -> final run records, one per seed (seed order).
    hypotheses: system -> split -> per seed, the decoded sentences.
    references: split -> references.
    splits: split -> what was scored (sizes, first line, sha256).
    setup: language, budget, cores, decoding configs, copied in.
    dev_gap: m4moe's pick minus the peer's in dev BLEU (paired bootstrap
      over the selection seeds both have); set beside the test gap.

  Raises:
    ValueError: the systems ran different seeds, or a split is missing.
  """
  seed_sets = {s: [r["seed"] for r in items] for s, items in runs.items()}
  if len({tuple(v) for v in seed_sets.values()}) != 1:
    raise ValueError(f"the systems ran different seeds: {seed_sets}")
  out: dict[str, Any] = {
      **setup, "selected_on": selection.SELECTED_ON,
      "seeds": next(iter(seed_sets.values())),
      "recipes": {s: recipe_entry(p) for s, p in picks.items()},
      "splits": dict(splits), "systems": {}, "m4moe_minus_peer": {}}
  for system in runs:
    out["systems"][system] = {"speed": _speed(runs[system]),
                              "schedule": schedule_entry(runs[system])}
  for split in SPLITS:
    refs = references[split]
    means: dict[str, dict[str, significance.Resamples]] = {}
    for system in runs:
      for metric in METRICS:
        block, mean = _metric_block(hypotheses[system][split], refs,
                                    metric=metric, n_samples=n_samples)
        out["systems"][system].setdefault(split, {})[metric] = block
        means.setdefault(metric, {})[system] = mean
      out["systems"][system][split]["repeating_outputs_per_seed"] = [
          sum(map(repeats_three_times, hyps))
          for hyps in hypotheses[system][split]]
    out["m4moe_minus_peer"][split] = {
        metric: significance.paired_difference(
            means[metric][selection.SYSTEM_M4MOE],
            means[metric][selection.SYSTEM_PEER]).to_dict()
        for metric in METRICS}
  if dev_gap is not None:
    out["m4moe_minus_peer"]["dev"] = {"bleu": dict(dev_gap)}
    out["dev_vs_test"] = gap_check(dev_gap,
                                   out["m4moe_minus_peer"]["test"]["bleu"])
  return out


def _mean_text(block: Mapping[str, Any]) -> str:
  """A metric block as ``mean (per seed) ±ci``."""
  seeds = ", ".join(f"{v:.1f}" for v in block["per_seed"])
  return (f"{block['seed_spread']['mean']:.1f} ({seeds}) "
          f"±{block['interval']['ci']:.1f}")


def _system_row(system: str, value: Mapping[str, Any]) -> str:
  entry, recipe = value["systems"][system], value["recipes"][system]
  checks = entry["schedule"]["per_seed"]
  steps = ", ".join(f"{c['steps']}/{c['planned_steps']}" for c in checks)
  flagged = entry["schedule"]["flagged_seeds"]
  schedule = f"flagged seeds {flagged}" if flagged else "complete"
  speed = entry["speed"]
  decode = " / ".join(
      f"{speed[f'decode_sentences_per_sec_{s}']['mean']:.1f}" for s in SPLITS)
  scores = " | ".join(_mean_text(entry[s][m]) for s in SPLITS
                      for m in METRICS)
  return (f"| {system}: `{recipe['candidate']}` | {steps} | {schedule} | "
          f"{speed['target_tokens_per_sec']['mean']:,.0f} | "
          f"{speed['dev_ce']['mean']:.3f} | {scores} | {decode} |")


def _gap_text(d: Mapping[str, Any] | None) -> str:
  if d is None:
    return "–"
  star = "*" if d.get("significant") else ""
  return f"{d['score']:+.1f}{star} ±{d['ci']:.1f} (p={d['p_value']:.3f})"


def markdown(value: Mapping[str, Any]) -> str:
  """``peer.md``: the final's table, the dev gap beside the test gaps."""
  gaps = value["m4moe_minus_peer"]
  lines = [
      f"Final comparison at {value['budget']}, seeds "
      f"{', '.join(map(str, value['seeds']))}, both systems decoding with "
      "one config (peer.json: decoding); steps are trained/planned; "
      "scores are seed means (per seed) ±95% over sentences; target "
      "tokens/s: " + value.get("tokens_per_sec_definition", "") + ".", "",
      "| system, recipe chosen on dev | steps | schedule | target tokens/s |"
      " dev CE | test BLEU | test chrF++ | test_ood BLEU | test_ood chrF++ |"
      " decode sent/s test / ood |",
      "| --- | --- | --- |" + " ---: |" * 7 + " ---: |"]
  lines += [_system_row(s, value) for s in value["systems"]]
  lines += ["", "| m4moe − OpenNMT-tf (BLEU, paired bootstrap) | dev "
            "(selection) | test | test_ood |", "| --- | ---: | ---: | ---: |",
            f"| seed mean | {_gap_text(gaps.get('dev', {}).get('bleu'))} | "
            f"{_gap_text(gaps['test']['bleu'])} | "
            f"{_gap_text(gaps['test_ood']['bleu'])} |", ""]
  lines += [f"Warning: {w}" for w in warnings(value)]
  if "dev_vs_test" not in value:
    lines.append("No dev gap was recorded: the test gap stands alone.")
  return "\n".join(lines) + "\n"
