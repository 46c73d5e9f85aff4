r"""Landed copies of a recipe's runs: what survives a lost run directory.

A run directory (checkpoints included) is too large to commit and lives
on the machine that trained it; a study whose runs outlast that machine
must keep the rest in the repository. What the analysis tools
(:mod:`m4moe.pipeline.screening`, :mod:`m4moe.pipeline.curves`) read of a
finished run is small: its training log, its dev eval JSON and its
training stage record. ``land`` copies those three into a committed
results folder, one directory per run::

  python3 -m m4moe.pipeline.landing --run_dir=runs/study3 \
      --runs='*_s1' --output=results/study/v3/runs

writes ``<output>/<run>/metrics.jsonl``, ``eval_dev.json``,
``train_stage.json`` and ``inputs.sha256`` (``sha256sum``-style lines of
the run directory's ``corpus/`` and ``vocab/`` files that runs read, so a
later run can be checked to have trained on the same inputs; a
SentencePiece model's line digests what it holds, :func:`input_digest`) for every run whose training finished (its stage
record exists) and whose dev eval has been written, and prints the runs it
skipped and why. Files are replaced atomically; nothing else under
``--output`` is touched.

:class:`RunFiles` finds a run's files again: in the run directory where
the run is there, else in the landed copy (``--landed`` of the analysis
tools), so a table regenerated on a new machine keeps every landed run
beside the ones trained there. The run directory itself is never seeded
with landed records: ``m4moe-run`` trusts its stage records, and a landed
record is not a checkpoint it could resume or decode from.

A recipe that reads the test splits (a confirmation) needs more of a run:
its decoded hypotheses, for the report's paired bootstrap. ``--tested``
lands each run whose training and every test eval (``eval`` and
``eval_ood``) finished, in the layout :mod:`m4moe.pipeline.restore`
reads back (``--results``)::

  python3 -m m4moe.pipeline.landing --tested --run_dir=runs/study3c \
      --output=results/study/v3/confirm

writes ``stages/`` (the corpus record and each run's train and eval
records), ``metrics/<run>.jsonl``, ``<split>/<run>.json`` with the
hypotheses in ``<split>/<run>/``, the run directory's ``report*/``
folders and ``inputs.sha256``. The copies keep the relative paths the
tools wrote (stage records: relative to the run directory; eval JSONs: to
their own directory, so the hypotheses beside them are found in either
place; training logs: to the model directory). It refuses a run
directory whose corpus or vocabularies differ from a manifest already
there (runs on other bytes must not be pooled) and a folder landed in
the other layout, and writes nothing when no run has finished its test
evals. Runs of a second run
directory on the same bytes land beside the first's (the corpus record
landed first stays). On a new machine ``restore --results`` puts the
runs back, so ``m4moe-run`` trains only the rest and the report still
has every run's hypotheses.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import hashlib
import pathlib
import shutil
from typing import Sequence

from absl import app
from absl import flags

from m4moe import cli
from m4moe.data import vocab

# File names inside one landed run's directory.
METRICS = "metrics.jsonl"
EVAL_DEV = "eval_dev.json"
TRAIN_RECORD = "train_stage.json"
INPUTS = "inputs.sha256"
# What a run directory's runs are built from.
INPUT_DIRS = ("corpus", "vocab")
# A confirmation's test evals: their stage names, output JSONs and
# hypothesis folders (``<split>_<run>.json``, ``<split>/<run>.json``,
# ``<split>/<run>/``).
TEST_SPLITS = ("eval", "eval_ood")


def sha256(path: pathlib.Path) -> str:
  with path.open("rb") as f:
    return hashlib.file_digest(f, "sha256").hexdigest()


def input_digest(path: pathlib.Path) -> str:
  """sha256 of one input file; of a SentencePiece ``.model``, of what it
  holds (:func:`m4moe.data.vocab.model_digest`: a model records the
  temporary path it was trained to)."""
  if path.suffix == ".model":
    return vocab.model_digest(path)
  return sha256(path)


def _is_input(relative: pathlib.Path) -> bool:
  """Whether a file under corpus/ or vocab/ is read by the runs (not a
  record of the build: the corpus report with its timings, a lock)."""
  return (relative.suffix != ".lock" and
          relative != pathlib.Path("corpus", "report.json"))


def input_digests(run_dir: pathlib.Path) -> dict[str, str]:
  """Relative path -> digest (:func:`input_digest`) of every file the runs
  read under the run directory's ``corpus/`` and ``vocab/`` (sorted)."""
  names = sorted(str(path.relative_to(run_dir))
                 for sub in INPUT_DIRS if (run_dir / sub).is_dir()
                 for path in (run_dir / sub).rglob("*")
                 if path.is_file() and _is_input(path.relative_to(run_dir)))
  return {name: input_digest(run_dir / name) for name in names}


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunFiles:
  """Where the logs of a recipe's runs are.

  Attributes:
    run_dir: the run directory the recipe runs in (``models/<run>/``,
      ``eval_dev/<run>.json``, ``stages/train_<run>.json``).
    landed: a folder of landed runs (``<landed>/<run>/``, or the layout
      of ``--tested``), read for the runs the run directory has no
      training log of; None: none.
  """

  run_dir: pathlib.Path
  landed: pathlib.Path | None = None

  def _landed_metrics(self, run: str) -> pathlib.Path | None:
    """The run's landed training log, in either layout (``<run>/`` of
    :func:`land`, ``metrics/<run>.jsonl`` of :func:`land_tested`), when
    the run directory has none of its own."""
    if (self.landed is None or
        (self.run_dir / "models" / run / METRICS).is_file()):
      return None
    for path in (self.landed / run / METRICS,
                 self.landed / "metrics" / f"{run}.jsonl"):
      if path.is_file():
        return path
    return None

  def metrics(self, run: str) -> pathlib.Path:
    """The run's training log (``metrics.jsonl``)."""
    return (self._landed_metrics(run) or
            self.run_dir / "models" / run / METRICS)

  def _file(self, run: str, *, landed_name: str,
            relative: str) -> pathlib.Path:
    """A run's file: ``relative`` under the run directory (or under a
    ``--tested`` landing, which keeps the run directory's layout), or
    ``landed_name`` in a :func:`land` landing's ``<run>/``."""
    landed = self._landed_metrics(run)
    if landed is None:
      return self.run_dir / relative
    if landed.name == METRICS:
      return landed.parent / landed_name
    return self.landed / relative

  def eval_dev(self, run: str) -> pathlib.Path:
    """The run's dev eval JSON (may not exist: not yet, or a run landed
    with its test evals only)."""
    return self._file(run, landed_name=EVAL_DEV,
                      relative=f"eval_dev/{run}.json")

  def train_record(self, run: str) -> pathlib.Path:
    """The run's training stage record (exists once training finished)."""
    return self._file(run, landed_name=TRAIN_RECORD,
                      relative=f"stages/train_{run}.json")


def _copy(src: pathlib.Path, dst: pathlib.Path) -> None:
  dst.parent.mkdir(parents=True, exist_ok=True)
  tmp = dst.with_name(dst.name + ".landing")
  shutil.copyfile(src, tmp)
  tmp.replace(dst)


def land(run_dir: pathlib.Path, output: pathlib.Path, *,
         patterns: Sequence[str] = ("*",)) -> tuple[list[str], list[str]]:
  """Copies each finished, dev-scored run of ``run_dir`` whose name matches
  one of ``patterns`` to ``output/<run>/``.

  Returns:
    (landed runs, skipped runs with the reason, e.g. ``'x_s1 (training)'``).
  """
  _check_layout(output, tested=False)
  files = RunFiles(run_dir=run_dir)
  landed, skipped = [], []
  inputs = _manifest(run_dir)
  models = run_dir / "models"
  names = sorted(p.name for p in models.iterdir()) if models.is_dir() else []
  for run in names:
    if not any(fnmatch.fnmatchcase(run, p) for p in patterns):
      continue
    if not files.train_record(run).is_file():
      skipped.append(f"{run} (training not finished)")
      continue
    if not files.eval_dev(run).is_file():
      skipped.append(f"{run} (no dev eval yet)")
      continue
    # The training record last: a landed record means its logs are there.
    _copy(files.metrics(run), output / run / METRICS)
    _copy(files.eval_dev(run), output / run / EVAL_DEV)
    tmp = output / run / (INPUTS + ".landing")
    tmp.write_text(inputs, encoding="utf-8")
    tmp.replace(output / run / INPUTS)
    _copy(files.train_record(run), output / run / TRAIN_RECORD)
    landed.append(run)
  return landed, skipped


def _manifest(run_dir: pathlib.Path) -> str:
  return "".join(f"{digest}  {name}\n"
                 for name, digest in input_digests(run_dir).items())


def _land_inputs(run_dir: pathlib.Path, output: pathlib.Path) -> None:
  """The manifest and the corpus record of ``run_dir`` into ``output``,
  refusing a manifest there that names other bytes.

  A corpus record already landed stays: a second run directory on the same
  bytes (its manifest is equal) adds runs, and the record keeps naming the
  build the first landing came from.
  """
  corpus = run_dir / "stages" / "corpus.json"
  if not corpus.is_file():
    raise ValueError(f"{corpus} does not exist: land runs of a run "
                     "directory whose corpus stage finished")
  manifest, path = _manifest(run_dir), output / INPUTS
  if path.is_file() and path.read_text(encoding="utf-8") != manifest:
    raise ValueError(
        f"{run_dir}'s corpus or vocabularies differ from {path}: its runs "
        "trained on other bytes and are not pooled with the landed ones; "
        "land them into another --output")
  output.mkdir(parents=True, exist_ok=True)
  tmp = path.with_name(path.name + ".landing")
  tmp.write_text(manifest, encoding="utf-8")
  tmp.replace(path)
  if not (output / "stages" / "corpus.json").is_file():
    _copy(corpus, output / "stages" / "corpus.json")


def _land_tested_run(run_dir: pathlib.Path, output: pathlib.Path,
                     run: str) -> None:
  _copy(run_dir / "models" / run / METRICS, output / "metrics" / f"{run}.jsonl")
  for split in TEST_SPLITS:
    _copy(run_dir / split / f"{run}.json", output / split / f"{run}.json")
    hyps = run_dir / split / run
    for hyp in sorted(hyps.glob("*.hyp")) if hyps.is_dir() else ():
      _copy(hyp, output / split / run / hyp.name)
  # The stage records last: a landed record means its outputs are there.
  for stage in ("train", *TEST_SPLITS):
    name = f"{stage}_{run}.json"
    _copy(run_dir / "stages" / name, output / "stages" / name)


def land_tested(run_dir: pathlib.Path, output: pathlib.Path, *,
                patterns: Sequence[str] = ("*",)
                ) -> tuple[list[str], list[str]]:
  """Copies each run of ``run_dir`` matching ``patterns`` whose training
  and test evals all finished to ``output`` in restore's layout, with the
  run directory's ``report*/`` folders.

  Returns:
    (landed runs, skipped runs with the reason).
  """
  _check_layout(output, tested=True)
  ready, skipped = [], []
  stages = run_dir / "stages"
  for record in sorted(stages.glob("train_*.json")):
    run = record.stem.removeprefix("train_")
    if not any(fnmatch.fnmatchcase(run, p) for p in patterns):
      continue
    pending = [split for split in TEST_SPLITS
               if not (stages / f"{split}_{run}.json").is_file()]
    if pending:
      skipped.append(f"{run} (no {' or '.join(pending)} record yet)")
    else:
      ready.append(run)
  if not ready:
    return [], skipped  # nothing to land: --output is left untouched
  _land_inputs(run_dir, output)
  for run in ready:
    _land_tested_run(run_dir, output, run)
  for report in sorted(run_dir.glob("report*")):
    for path in sorted(report.rglob("*")) if report.is_dir() else ():
      if path.is_file() and path.suffix != ".lock":  # not the writer's lock
        _copy(path, output / path.relative_to(run_dir))
  return ready, skipped


def _check_layout(output: pathlib.Path, *, tested: bool) -> None:
  """Refuses to mix the two layouts in one folder (``--tested`` writes
  ``stages/``, ``metrics/``, ...; the other one ``<run>/``)."""
  if tested and any(output.glob(f"*/{TRAIN_RECORD}")):
    raise ValueError(f"{output} holds runs landed without --tested (one "
                     "folder per run): land tested runs into another "
                     "--output, e.g. results/study/v3/confirm")
  if not tested and (output / "stages").is_dir():
    raise ValueError(f"{output} holds runs landed with --tested: land "
                     "dev-scored runs into another --output, e.g. "
                     "results/study/v3/runs")


def _define_flags() -> None:
  """Defined only when the tool runs (other CLIs share these names)."""
  flags.DEFINE_string("run_dir", None, "Where the recipe ran.")
  flags.DEFINE_list("runs", ["*"], "Only the runs whose names match one of "
                    "these patterns (fnmatch, e.g. 'moe_*').")
  flags.DEFINE_string("output", None, "The results folder of landed runs, "
                      "e.g. results/study/v3/runs.")
  flags.DEFINE_bool("tested", False, "Land the runs scored on the test "
                    "splits (train, eval and eval_ood finished) with their "
                    "hypotheses and the reports, in the layout "
                    "`python3 -m m4moe.pipeline.restore --results` reads.")


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  values = flags.FLAGS
  if not values.run_dir or not values.output:
    raise app.UsageError("give --run_dir (where the recipe ran) and --output "
                         "(e.g. results/study/v3/runs)")
  run_dir = pathlib.Path(values.run_dir)
  if not (run_dir / "models").is_dir():
    raise app.UsageError(f"--run_dir={run_dir} holds no models/: name the "
                         "directory a recipe ran in")
  how = land_tested if values.tested else land
  try:
    landed, skipped = how(run_dir, pathlib.Path(values.output),
                          patterns=values.runs)
  except ValueError as e:
    raise app.UsageError(str(e)) from e
  print(f"landing: {len(landed)} run(s) copied to {values.output}"
        + (f": {', '.join(landed)}" if landed else ""))
  if skipped:
    print(f"landing: {len(skipped)} skipped: {'; '.join(skipped)}")


if __name__ == "__main__":
  _define_flags()
  cli.run_tool(main, module=__name__)
