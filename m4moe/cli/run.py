r"""m4moe-run: the main job, from nothing to a BLEU report, resumably.

Examples:

  # Default: build the offline corpus, train the tiny MoE, decode, score,
  # report (see m4moe/pipeline/plan.py for the recipe).
  m4moe-run --run_dir=runs/demo

  # Every stage on generated catalogs in about two minutes, offline:
  m4moe-run --recipe=smoke --run_dir=runs/smoke

  # Show the stages and their commands without running them:
  m4moe-run --run_dir=runs/demo --dry_run

Before its first stage (and with --dry_run) the whole recipe is checked:
every model's zoo config, every flag it passes to a tool, every language,
the output directories (m4moe.pipeline.recipe_check); the first problem
exits 1 naming the recipe file, the model and the fix, and nothing runs.

A finished stage is recorded in <run_dir>/stages/<stage>.json (its command,
paths relative to the run directory and the interpreter as python3, so the
record means the same when copied into results/) and skipped on the next
run; --restart_from=<stage> forgets it and every later stage;
--stop_after=<stage> runs the stages up to it and stops; --only=<patterns>
runs just the stages whose names match (e.g. the baselines).

Models that a recipe puts in lanes (the demo: the multilingual MoE in one,
the bilingual baselines in the other) train and decode concurrently, each
lane pinned to its share of the cores (one core each on a 2-core machine,
where two one-core processes trained 1.3-1.5x the steps per second of one
two-core process: results/demo/lanes_benchmark.py), with
each stage's output in <run_dir>/logs/<stage>.log; --nolanes runs every
stage alone. If a lane's stage fails, the other lanes' stages are stopped
with SIGTERM (training saves a checkpoint) and the re-run resumes them.

Stopping the job (Ctrl-C, SIGTERM, SIGHUP) stops the running stage(s) with the
same signal (a training stage saves a checkpoint on SIGTERM) and exits with
128 + the signal number without recording the stage; if the job itself is
killed with kill -9, the kernel sends the stage SIGTERM (Linux), so no stage
keeps running on its own.

Before any stage after the corpus, the built corpus is checked against the
recipe's minimums (training pairs and scored sentences per language): below
them (e.g. the Debian half of the corpus recipe was skipped for want of
apt-get) the job stops with one message naming the languages and the ways
out, unless --allow_reduced_corpus is given.

One job per run directory: the job holds an flock on <run_dir>/run.lock
from before its first stage to its end (the kernel releases it however the
job ends, kill -9 included). A second m4moe-run on the same --run_dir exits
with status 1 before touching anything, naming the first job's pid and
command. --dry_run without --restart_from changes nothing and takes no lock.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import time
from typing import IO

from absl import app
from absl import flags
from absl import logging

from m4moe import cli
from m4moe import jsonfile
from m4moe import run_lock
from m4moe.pipeline import corpus_check
from m4moe.pipeline import plan as main_job
from m4moe.pipeline import recipe_check
from m4moe.pipeline import recipes as recipes_lib
from m4moe.pipeline import supervisor
from m4moe.training import metrics_log

_RECIPE = flags.DEFINE_string(
    "recipe", "demo", "What to build, train and evaluate: a packaged recipe "
    "(" + "; ".join(f"{name}: {recipes_lib.load_recipe(name).description}"
                    for name in recipes_lib.packaged_names()) +
    ") or the path of a recipe file of the same form (configs/recipes/*.toml; "
    "see m4moe.pipeline.recipes).")
_RUN_DIR = flags.DEFINE_string("run_dir", "runs/demo",
                               "Where every stage writes its outputs.")
_CACHE_DIR = flags.DEFINE_string(
    "cache_dir", None, "Corpus download cache (default <run_dir>/cache); "
    "share it between runs to download once.")
_RESTART_FROM = flags.DEFINE_string(
    "restart_from", None, "Re-run this stage and all later ones.")
_STOP_AFTER = flags.DEFINE_string(
    "stop_after", None, "Run the stages up to this one (in plan order, e.g. "
    "vocab: build the corpus and vocabularies only) and stop; a later run "
    "without it goes on from there.")
_ONLY = flags.DEFINE_list(
    "only", None, "Run only the stages whose names match one of these shell "
    "patterns (e.g. 'train_bilingual_*,eval*_bilingual_*': the baselines), "
    "in plan order and in their lanes; the others are left for a later "
    "run. Combines with --stop_after.")
_ALLOW_REDUCED_CORPUS = flags.DEFINE_bool(
    "allow_reduced_corpus", False, "Train and report even when the built "
    "corpus is below the recipe's minimums (min_train_pairs, "
    "min_eval_sentences), e.g. after its build skipped the Debian half "
    "where apt is missing; the report's header then says the data was "
    "reduced. Without it the job stops before the first stage after the "
    "corpus, naming the languages below them and the ways out.")
_DRY_RUN = flags.DEFINE_bool("dry_run", False,
                             "Print the stages and commands; run nothing.")
_LANES = flags.DEFINE_bool(
    "lanes", True, "Run the recipe's lanes (e.g. the multilingual model and "
    "the bilingual baselines) concurrently, each pinned to its share of the "
    "cores, with outputs in <run_dir>/logs/; --nolanes runs every stage "
    "alone on all cores, in plan order (the recipe's model order). With "
    "fewer cores than lanes the lanes run one after the other.")


def _marker(run_dir: pathlib.Path, stage: main_job.Stage) -> pathlib.Path:
  return run_dir / "stages" / f"{stage.name}.json"


def _recorded(stage: main_job.Stage, run_dir: pathlib.Path) -> list[str]:
  """The stage's command as its record holds it (relative to run_dir)."""
  return jsonfile.relative_command(stage.command(), start=run_dir)


def _write_marker(path: pathlib.Path, stage: main_job.Stage,
                  seconds: float) -> None:
  path.parent.mkdir(parents=True, exist_ok=True)
  tmp = path.with_suffix(".tmp")
  command = _recorded(stage, path.parent.parent)
  tmp.write_text(json.dumps({"stage": stage.name, "command": command,
                             "seconds": round(seconds, 1)}, indent=1))
  tmp.replace(path)  # atomic: a killed run never leaves a half marker


def _first_changed(stages: list[main_job.Stage],
                   run_dir: pathlib.Path) -> str | None:
  """The first finished stage whose command differs from the recipe's now.

  A recipe edited after a run (e.g. more training steps) must re-run that
  stage (a training stage resumes from its last checkpoint) and everything
  after it, which consumed its outputs. The Python executable is ignored,
  and a record with absolute paths (written before records held relative
  ones) matches the same command.
  """
  for stage in stages:
    marker = _marker(run_dir, stage)
    if not marker.exists():
      continue
    try:
      ran = jsonfile.load(marker, what="stage record",
                          fix="it is re-run")["command"][1:]
    except (jsonfile.JSONFileError, KeyError, TypeError) as e:
      print(f"m4moe-run: {e}", flush=True)
      return stage.name  # unreadable record: not trusted
    if ran not in (stage.command()[1:], _recorded(stage, run_dir)[1:]):
      return stage.name
  return None


def _stage_index(stages: list[main_job.Stage], name: str, flag: str) -> int:
  """Where stage ``name`` is in the plan; a usage error naming ``flag``."""
  names = [s.name for s in stages]
  if name not in names:
    raise app.UsageError(f"--{flag}={name!r} is not a stage of this "
                         f"recipe; choose one of {', '.join(names)}")
  return names.index(name)


def _forget_from(stages: list[main_job.Stage], run_dir: pathlib.Path,
                 name: str) -> None:
  for stage in stages[_stage_index(stages, name, "restart_from"):]:
    _marker(run_dir, stage).unlink(missing_ok=True)


def _through(stages: list[main_job.Stage],
             name: str) -> list[main_job.Stage]:
  """The stages up to and including ``name`` (--stop_after)."""
  return stages[:_stage_index(stages, name, "stop_after") + 1]


def _matching(stages: list[main_job.Stage],
              patterns: list[str]) -> list[main_job.Stage]:
  """The stages whose names match one of ``patterns`` (--only)."""
  chosen = [s for s in stages
            if any(fnmatch.fnmatchcase(s.name, p) for p in patterns)]
  if not chosen:
    raise app.UsageError(f"--only={','.join(patterns)} matches no stage of "
                         "this recipe; --dry_run lists them")
  return chosen


def _check_needed(stages: list[main_job.Stage],
                  run_dir: pathlib.Path) -> None:
  """Refuses --only without a stage that a chosen one waits for.

  An upcycled run's training reads its source run (:attr:`Stage.after`):
  started without it, it would fail only after building its inputs.
  """
  chosen = {s.name for s in stages}
  for stage in stages:
    if not _marker(run_dir, stage).exists():
      missing = [name for name in stage.after if name not in chosen and
                 not (run_dir / "stages" / f"{name}.json").exists()]
      if missing:
        raise app.UsageError(
            f"--only: stage {stage.name!r} needs {', '.join(missing)} (its "
            "init_from source), which has not finished; add it to --only")


def _training_finished(stage: main_job.Stage) -> bool:
  """Whether a train stage's run ended with reason "done".

  ``m4moe-train`` exits 0 after a SIGTERM too (it saves and stops, as on a
  preempted TPU VM); such a stage is not finished and must run again, which
  resumes from the saved checkpoint.
  """
  model_dir = pathlib.Path(stage.flag_values()["model_dir"])
  return metrics_log.end_reason(
      model_dir / metrics_log.METRICS_FILENAME) == "done"


def _prepare_fixtures(recipe: recipes_lib.Recipe, run_dir: pathlib.Path) -> None:
  """Writes the generated catalog tree the ``smoke`` recipe builds from."""
  if recipe.use_packaged_corpus_recipe:
    return
  from m4moe.data import fixtures  # pylint: disable=g-import-not-at-top
  root = run_dir / "fixture_catalogs"
  sentences = fixtures.english_sentences(600, seed=0, max_words=10)
  # A small resource range: 500, 250, 120 and 60 catalog entries.
  for locale, n in (("de", 500), ("fr", 250), ("ru", 120), ("ja", 60)):
    po = fixtures.make_catalog(locale, sentences[:n])
    fixtures.write_catalog(po, root / locale / "LC_MESSAGES" / "demo.po")


def _ensure_apt_lists(recipe: recipes_lib.Recipe) -> None:
  """Runs ``apt-get update`` once if the package lists are empty.

  ``apt-get download`` (the Debian half of the corpus recipe) finds nothing
  on a fresh machine whose lists were never fetched. Only done as root;
  otherwise the corpus builder skips the Debian half and says so.
  """
  if not recipe.use_packaged_corpus_recipe or not shutil.which("apt-get"):
    return
  if "debian" not in (recipe.corpus_recipe_parts or ("debian",)):
    return  # a PyPI-only recipe needs no package lists
  lists = pathlib.Path("/var/lib/apt/lists")
  if lists.is_dir() and any(lists.glob("*_Packages*")):
    return
  if os.geteuid() != 0:
    logging.warning("apt package lists are empty and this is not root: the "
                    "Debian half of the corpus will be skipped (run "
                    "'sudo apt-get update' first to include it)")
    return
  print("m4moe-run: apt-get update (package lists are empty)", flush=True)
  subprocess.run(["apt-get", "update", "-q"], check=False)


def _stage_error(stage: main_job.Stage, returncode: int) -> str | None:
  """Why a stage that exited on its own did not finish (None: it did)."""
  if returncode != 0:
    return (f"m4moe-run: stage {stage.name!r} failed (exit {returncode}); "
            "fix the error above and re-run the same command: finished "
            "stages are skipped")
  if stage.tool == "train" and not _training_finished(stage):
    return (f"m4moe-run: stage {stage.name!r} stopped before its last step "
            "(preempted or interrupted); re-run the same command to resume "
            "it from its last checkpoint")
  return None


def _stopped(stage_names: str, signum: int, returncodes: str) -> None:
  name = signal.Signals(signum).name
  print(f"m4moe-run: stopped by {name} during {stage_names} ({returncodes}); "
        "re-run the same command to resume: finished stages are skipped and "
        "training resumes from its last checkpoint", file=sys.stderr,
        flush=True)
  sys.exit(128 + signum)


class _Job:
  """Runs the plan's blocks, recording finished stages."""

  def __init__(self, *, recipe: recipes_lib.Recipe, run_dir: pathlib.Path,
               stages: list[main_job.Stage]) -> None:
    self.recipe = recipe
    self.run_dir = run_dir
    self.number = {s.name: i for i, s in enumerate(stages, 1)}
    self.total = len(stages)
    self.start = time.monotonic()
    self.corpus_checked = False

  def check_corpus(self, *, allow_reduced: bool) -> None:
    """Stops the job when the corpus is below the recipe's minimums
    unless ``allow_reduced`` (--allow_reduced_corpus), which only warns.
    Once per job; nothing to check before the corpus is built."""
    if self.corpus_checked:
      return
    corpus_dir = self.run_dir / "corpus"
    try:
      report = corpus_check.read_corpus_report(corpus_dir)
    except jsonfile.JSONFileError as e:
      raise SystemExit(f"m4moe-run: {e}") from None
    if report is None:
      return
    self.corpus_checked = True
    found = corpus_check.shortfalls(self.recipe, report)
    if not found:
      return
    if not allow_reduced:
      raise SystemExit(corpus_check.message(
          self.recipe, found=found, report=report, corpus_dir=corpus_dir))
    below = corpus_check.describe(self.recipe, found)
    print("m4moe-run: warning: going on below the recipe's minimums "
          f"(--allow_reduced_corpus): {below}", file=sys.stderr, flush=True)

  def header(self, stage: main_job.Stage) -> str:
    return (f"[stage {self.number[stage.name]}/{self.total}] {stage.name}: "
            f"{stage.description}")

  def pending(self, stage: main_job.Stage) -> bool:
    """False (and says so) if the stage finished in an earlier run."""
    marker = _marker(self.run_dir, stage)
    if marker.exists():
      print(f"{self.header(stage)} -- done earlier, skipped ({marker})",
            flush=True)
      return False
    return True

  def finished(self, stage: main_job.Stage, seconds: float) -> None:
    _write_marker(_marker(self.run_dir, stage), stage, seconds)
    logging.info("stage %s took %.0f s (total %.0f s)", stage.name, seconds,
                 time.monotonic() - self.start)

  def run_alone(self, stage: main_job.Stage) -> None:
    """One stage on every core, its output on this terminal."""
    if not self.pending(stage):
      return
    print(f"{self.header(stage)}\n  $ {' '.join(stage.command())}", flush=True)
    if stage.name == "corpus":
      _prepare_fixtures(self.recipe, self.run_dir)
      _ensure_apt_lists(self.recipe)
    stage_start = time.monotonic()
    result = supervisor.run_stage_process(stage.command())
    if result.interrupted_by is not None:
      _stopped(f"stage {stage.name!r}", result.interrupted_by,
               f"it exited with {result.returncode}")
    error = _stage_error(stage, result.returncode)
    if error:
      raise SystemExit(error)
    self.finished(stage, time.monotonic() - stage_start)

  def run_lanes(self, lanes: list[list[main_job.Stage]],
                shares: list[tuple[int, ...]]) -> None:
    """The lanes concurrently, each on its cores, outputs in log files.

    A failed stage stops the other lanes' running stages with SIGTERM
    (training saves a checkpoint, so the re-run resumes them) and ends the
    job with its error. A lane whose next stage waits for stages of other
    lanes (:attr:`Stage.after`) idles until they have finished.
    """
    queues = [[s for s in lane if self.pending(s)] for lane in lanes]
    waiting = {s.name for queue in queues for s in queue}  # not yet finished
    log_dir = self.run_dir / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    running: dict[subprocess.Popen, _LaneStage] = {}
    failure = None
    interrupted = []
    with supervisor.StageProcesses() as processes:

      def launch_ready() -> None:
        """Starts the next stage of every idle lane whose stage may start."""
        busy = {lane_stage.index for lane_stage in running.values()}
        for index, queue in enumerate(queues):
          if (index in busy or not queue or
              any(name in waiting for name in queue[0].after)):
            continue
          lane_stage = self._launch_in_lane(
              processes, stage=queue.pop(0), index=index,
              num_lanes=len(lanes), cpus=shares[index], log_dir=log_dir)
          running[lane_stage.child] = lane_stage

      launch_ready()
      while running:
        child, returncode = processes.wait_any()
        done = running.pop(child)
        done.out.close()
        if processes.interrupted_by is not None:
          interrupted.append(f"{done.stage.name} exited with {returncode}")
          continue  # stopping: wait for the others, record nothing
        if failure is not None:
          continue
        error = _stage_error(done.stage, returncode)
        if error:
          failure = _stop_lanes_after(error, failed=done, processes=processes,
                                      others_running=bool(running))
          continue
        seconds = time.monotonic() - done.start
        self.finished(done.stage, seconds)
        waiting.discard(done.stage.name)
        print(f"  {done.stage.name} finished in {seconds:.0f} s "
              f"(lane {done.index + 1})", flush=True)
        launch_ready()
    if processes.interrupted_by is not None:
      _stopped("the lanes' stages", processes.interrupted_by,
               "; ".join(interrupted))
    stuck = [s.name for queue in queues for s in queue]
    if failure or stuck:
      raise SystemExit(failure or f"m4moe-run: stages {stuck} wait for "
                       "stages after them in the plan (a planning bug)")

  def _launch_in_lane(self, processes: supervisor.StageProcesses, *,
                      stage: main_job.Stage, index: int, num_lanes: int,
                      cpus: tuple[int, ...],
                      log_dir: pathlib.Path) -> _LaneStage:
    """Starts one stage pinned to its lane's cores, output to its log.

    The log is appended to, with the command first, so a resumed stage's
    output follows the interrupted run's instead of replacing it.
    """
    log = log_dir / f"{stage.name}.log"
    print(f"{self.header(stage)}\n  lane {index + 1} of {num_lanes}, "
          f"core(s) {','.join(map(str, cpus))}, output in {log}\n"
          f"  $ {' '.join(stage.command())}", flush=True)
    out = open(log, "a", encoding="utf-8")  # pylint: disable=consider-using-with
    out.write(f"$ {' '.join(stage.command())}\n")
    out.flush()
    child = processes.start(stage.command(), cpus=cpus,
                            env=supervisor.lane_environment(cpus), stdout=out)
    return _LaneStage(child=child, index=index, stage=stage,
                      start=time.monotonic(), out=out, log=log)


@dataclasses.dataclass(frozen=True)
class _LaneStage:
  """A stage running in a lane: what is needed when its process exits.

  Attributes:
    child: its process.
    index: its lane, 0-based.
    stage: the stage.
    start: ``time.monotonic()`` at its launch.
    out: its open log file (the process's stdout), closed when it exits.
    log: the log file's path, quoted in a failure message.
  """

  child: subprocess.Popen
  index: int
  stage: main_job.Stage
  start: float
  out: IO[str]
  log: pathlib.Path


def _stop_lanes_after(error: str, *, failed: _LaneStage,
                      processes: supervisor.StageProcesses,
                      others_running: bool) -> str:
  """Shows a failed lane stage's last output and stops the other lanes.

  The tail goes to stderr because the stage's output went to its log, not
  the terminal; the others get SIGTERM so training stages save a
  checkpoint that the re-run resumes from.

  Returns:
    The job's failure message, naming the log.
  """
  tail = failed.log.read_text(encoding="utf-8",
                              errors="replace").splitlines()[-20:]
  print("\n".join(f"  {failed.stage.name}| {line}" for line in tail),
        file=sys.stderr, flush=True)
  if others_running:
    print("m4moe-run: stopping the other lanes (a training stage "
          "saves a checkpoint and resumes on the re-run)",
          file=sys.stderr, flush=True)
  processes.terminate_all()
  return f"{error}\n(its output: {failed.log})"


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  try:
    recipe = recipes_lib.load_recipe(_RECIPE.value)
  except recipes_lib.RecipeError as e:
    raise app.UsageError(str(e)) from None
  run_dir = pathlib.Path(_RUN_DIR.value).resolve()
  cache_dir = pathlib.Path(_CACHE_DIR.value or run_dir / "cache").resolve()
  stages = main_job.plan(recipe, run_dir=run_dir, cache_dir=cache_dir)
  try:  # the whole recipe, before any stage (and in a dry run)
    recipe_check.check_recipe(
        recipe, source=recipes_lib.recipe_path(_RECIPE.value),
        stages=stages, run_dir=run_dir, cache_dir=cache_dir,
        record=not _DRY_RUN.value)
  except recipes_lib.RecipeError as e:
    sys.exit(f"m4moe-run: error: {e}")
  if _DRY_RUN.value and not _RESTART_FROM.value:
    _run_plan(recipe=recipe, run_dir=run_dir, stages=stages)
    return
  run_dir.mkdir(parents=True, exist_ok=True)
  try:
    # Held until the last stage ends; stages are children, which do not
    # inherit it (Python opens files close-on-exec).
    with run_lock.RunLock(run_dir, role=run_lock.RUN):
      _run_plan(recipe=recipe, run_dir=run_dir, stages=stages)
  except run_lock.RunLockedError as e:
    sys.exit(f"m4moe-run: refused, nothing was run: {e}")


def _run_plan(*, recipe: recipes_lib.Recipe, run_dir: pathlib.Path,
              stages: list[main_job.Stage]) -> None:
  """Runs (or, with --dry_run, lists) the stages the flags select."""
  if _RESTART_FROM.value:
    _forget_from(stages, run_dir, _RESTART_FROM.value)
  changed = None if _DRY_RUN.value else _first_changed(stages, run_dir)
  if changed:
    print(f"m4moe-run: stage {changed!r} ran with a different command than "
          f"the recipe's now; re-running it and every later stage",
          flush=True)
    _forget_from(stages, run_dir, changed)
  if _STOP_AFTER.value:
    stages = _through(stages, _STOP_AFTER.value)
  if _ONLY.value:
    stages = _matching(stages, _ONLY.value)
    _check_needed(stages, run_dir)
  job = _Job(recipe=recipe, run_dir=run_dir, stages=stages)
  for block in _blocks(stages, lanes=_LANES.value):
    _run_block(job, block)
  if (_STOP_AFTER.value or _ONLY.value) and not _DRY_RUN.value:
    which = (f"after stage {_STOP_AFTER.value!r} (--stop_after)"
             if _STOP_AFTER.value else f"the {len(stages)} stage(s) of --only")
    print(f"m4moe-run: stopped {which} in {time.monotonic() - job.start:.0f}"
          " s; run again without it to go on", flush=True)
  elif not _DRY_RUN.value:
    report = run_dir / "report"
    print(f"m4moe-run: done in {time.monotonic() - job.start:.0f} s. Report: "
          f"{report / 'report.html'} (also report.md, delta_bleu.png)",
          flush=True)


def _blocks(stages: list[main_job.Stage], *,
            lanes: bool) -> list[list[list[main_job.Stage]]]:
  """The blocks to run in turn (see ``main_job.parallel_blocks``).

  Without lanes every stage is a block of its own, in plan order, so a
  recipe's models train in the order the recipe lists them.
  """
  if lanes:
    return main_job.parallel_blocks(stages)
  return [[[stage]] for stage in stages]


def _run_block(job: _Job, block: list[list[main_job.Stage]]) -> None:
  """One block of lanes: concurrently on shares of the cores, or in turn."""
  cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") \
      else list(range(os.cpu_count() or 1))
  shares = None
  if len(block) > 1 and _LANES.value:
    try:
      shares = main_job.lane_cpus(len(block), cpus)
    except ValueError as e:
      print(f"m4moe-run: {e}: running the {len(block)} lanes one after "
            "the other", flush=True)
  if not _DRY_RUN.value and any(stage.name != "corpus" for lane in block
                                for stage in lane):
    job.check_corpus(allow_reduced=_ALLOW_REDUCED_CORPUS.value)
  if _DRY_RUN.value:
    for index, lane in enumerate(block):
      for stage in lane:
        where = (f" (lane {index + 1} of {len(block)}, core(s) "
                 f"{','.join(map(str, shares[index]))})" if shares else "")
        if stage.after:
          where += f" (after {', '.join(stage.after)})"
        print(f"{job.header(stage)}{where}\n  {' '.join(stage.command())}",
              flush=True)
  elif shares:
    job.run_lanes(block, shares)
  else:  # in plan order, not lane by lane: a stage may wait for another
    for stage in sorted((s for lane in block for s in lane),
                        key=lambda s: job.number[s.name]):
      job.run_alone(stage)


def run() -> None:
  cli.run_tool(main, module=__name__)


if __name__ == "__main__":
  run()
