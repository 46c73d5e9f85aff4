"""Seeds a study run directory with the runs already committed under v2/.

The study takes more than one session, and the next session's machine may
be a new one: its run directory, checkpoints included, is then gone, and
only what ``regenerate.sh`` copied into ``v2/`` survives (stage records, eval JSONs,
hypotheses, training logs). This script puts those back into a run
directory so that ``m4moe-run --recipe=study`` skips the runs that landed
and trains only the rest, and the report still has every run's hypotheses
for its bootstrap intervals:

  python3 -m m4moe.pipeline.restore --results=results/study/v2 \\
      --run_dir=RUN_DIR

It must run after the corpus and vocab stages (``m4moe-run --recipe=study
--stop_after=vocab``): it first checks that the corpus files and
vocabularies built here are byte-identical to the ones the committed runs
used (``v2/inputs.sha256``), since a new run must see the same test
sentences and pieces. A run is restored only whole: its train record and
both of its eval records with their outputs; anything partial is left to
train again. Nothing in the run directory is overwritten: a run that has a
stage record there already is left as it is. Paths recorded under the
earlier session's run directory are rewritten to ``--run_dir``.
"""

from __future__ import annotations

import hashlib
import pathlib
import shutil
import sys

from absl import app
from absl import flags

from m4moe import jsonfile

_SPLITS = ("eval", "eval_ood")


def _sha256(path: pathlib.Path) -> str:
  with path.open("rb") as f:
    return hashlib.file_digest(f, "sha256").hexdigest()


def check_inputs(results: pathlib.Path, run_dir: pathlib.Path) -> list[str]:
  """The manifest's files that are missing or differ under ``run_dir``."""
  bad = []
  manifest = results / "inputs.sha256"
  for number, line in enumerate(
      manifest.read_text(encoding="utf-8").splitlines(), 1):
    if not line.strip():
      continue
    digest, sep, name = line.partition("  ")
    if not sep or len(digest) != 64:
      raise ValueError(f"{manifest}:{number}: not a sha256sum line: {line!r}")
    path = run_dir / name
    if not path.is_file() or _sha256(path) != digest:
      bad.append(name)
  return bad


def recorded_run_dir(results: pathlib.Path) -> str:
  """The run directory the committed runs were written in (corpus record)."""
  record = jsonfile.load(results / "stages" / "corpus.json",
                         what="the corpus stage record",
                         fix="check out the committed study results again")
  for arg in record["command"]:
    if arg.startswith("--output_dir="):
      return str(pathlib.PurePath(arg.partition("=")[2]).parent)
  raise ValueError(f"{results / 'stages' / 'corpus.json'} records no "
                   "--output_dir")


def _landed_runs(results: pathlib.Path) -> list[str]:
  """Runs whose train and eval records, eval JSONs, hypotheses and training
  log are all committed."""
  runs = []
  for train in sorted((results / "stages").glob("train_*.json")):
    run = train.stem.removeprefix("train_")
    parts = [results / "metrics" / f"{run}.jsonl"]
    for split in _SPLITS:
      parts += [results / "stages" / f"{split}_{run}.json",
                results / split / f"{run}.json"]
    if not all(p.exists() for p in parts):
      continue
    # Hypotheses are needed wherever the run decoded sentences (a split
    # with none, e.g. test_ood of ckb, leaves no .hyp and no directory).
    if all(results.joinpath(split, run).is_dir() or
           not _decoded_any(results / split / f"{run}.json")
           for split in _SPLITS):
      runs.append(run)
  return runs


def _decoded_any(eval_json: pathlib.Path) -> bool:
  languages = jsonfile.load(
      eval_json, what="eval JSON",
      fix="check out the committed study results again")["languages"]
  return any(v.get("num_segments", 0) > 0 for v in languages.values())


def restore(results: pathlib.Path, run_dir: pathlib.Path) -> list[str]:
  """Copies every whole committed run into ``run_dir``; returns their names."""
  old = recorded_run_dir(results)
  new = str(run_dir)

  def copy_text(src: pathlib.Path, dst: pathlib.Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(dst.name + ".restoring")
    tmp.write_text(src.read_text(encoding="utf-8").replace(old, new),
                   encoding="utf-8")
    tmp.replace(dst)

  restored = []
  for run in _landed_runs(results):
    markers = [f"train_{run}.json", *(f"{s}_{run}.json" for s in _SPLITS)]
    if any((run_dir / "stages" / m).exists() for m in markers):
      continue  # this run directory has its own record of the run
    if (run_dir / "models" / run).exists():
      continue  # a run started here: let m4moe-run resume it
    copy_text(results / "metrics" / f"{run}.jsonl",
              run_dir / "models" / run / "metrics.jsonl")
    for split in _SPLITS:
      hyps = run_dir / split / run
      hyps.mkdir(parents=True, exist_ok=True)
      committed = results / split / run
      for hyp in sorted(committed.iterdir()) if committed.is_dir() else ():
        shutil.copyfile(hyp, hyps / hyp.name)
      copy_text(results / split / f"{run}.json", run_dir / split / f"{run}.json")
    # The stage records last: a record means its outputs are all in place.
    for marker in markers:
      copy_text(results / "stages" / marker, run_dir / "stages" / marker)
    restored.append(run)
  return restored


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  if not flags.FLAGS.run_dir:
    raise app.UsageError("--run_dir is required")
  results = pathlib.Path(flags.FLAGS.results).resolve()
  run_dir = pathlib.Path(flags.FLAGS.run_dir).resolve()
  if not (results / "inputs.sha256").is_file():
    print(f"restore: {results} has no inputs.sha256 (no run has landed): "
          "nothing to restore")
    return
  bad = check_inputs(results, run_dir)
  if bad and not any((run_dir / name).is_file() for name in bad):
    sys.exit(f"restore: {run_dir} has none of the {len(bad)} corpus/"
             f"vocabulary file(s) listed in {results / 'inputs.sha256'} "
             f"(e.g. {bad[0]}): build them first with m4moe-run "
             f"--recipe=study --run_dir={run_dir} --stop_after=vocab")
  if bad:
    sys.exit(f"restore: {len(bad)} corpus/vocabulary file(s) under {run_dir} "
             f"differ from those the committed runs used "
             f"({results / 'inputs.sha256'}), e.g. {', '.join(bad[:3])}: "
             "new runs would not be comparable with the committed ones. Build "
             "the corpus and vocabularies from the same recipe and split keys "
             "(m4moe-run --recipe=study --stop_after=vocab), or start the "
             "study afresh in another results directory.")
  restored = restore(results, run_dir)
  print(f"restore: {len(restored)} committed run(s) restored into {run_dir}"
        + (f": {', '.join(restored)}" if restored else ""))


if __name__ == "__main__":
  # Defined here, not at import: the tests import this file beside the
  # m4moe tools, which define --run_dir too.
  flags.DEFINE_string("results", str(pathlib.Path(__file__).parent / "v2"),
                      "The committed study results (regenerate.sh's copy).")
  flags.DEFINE_string("run_dir", None, "The run directory to seed.")
  app.run(main)
