r"""m4moe-run: the main job, from nothing to a BLEU report, resumably.

Examples:

  # Default: build the offline corpus, train the tiny MoE, decode, score,
  # report (see m4moe/main_job.py for the recipe).
  m4moe-run --run_dir=runs/demo

  # Every stage on generated catalogs in about two minutes, offline:
  m4moe-run --recipe=smoke --run_dir=/tmp/smoke

  # Show the stages and their commands without running them:
  m4moe-run --run_dir=runs/demo --dry_run

A finished stage is recorded in <run_dir>/stages/<stage>.json and skipped on
the next run; --restart_from=<stage> forgets it and every later stage.

Stopping the job (Ctrl-C, SIGTERM, SIGHUP) stops the running stage with the
same signal (a training stage saves a checkpoint on SIGTERM) and exits with
128 + the signal number without recording the stage; if the job itself is
killed with kill -9, the kernel sends the stage SIGTERM (Linux), so no stage
keeps running on its own.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import time

from absl import app
from absl import flags
from absl import logging

from m4moe import main_job

_RECIPE = flags.DEFINE_enum("recipe", "demo", sorted(main_job.RECIPES),
                            "What to build, train and evaluate: " + "; ".join(
                                f"{k}: {r.description}"
                                for k, r in sorted(main_job.RECIPES.items())))
_RUN_DIR = flags.DEFINE_string("run_dir", "runs/demo",
                               "Where every stage writes its outputs.")
_CACHE_DIR = flags.DEFINE_string(
    "cache_dir", None, "Corpus download cache (default <run_dir>/cache); "
    "share it between runs to download once.")
_RESTART_FROM = flags.DEFINE_string(
    "restart_from", None, "Re-run this stage and all later ones.")
_DRY_RUN = flags.DEFINE_bool("dry_run", False,
                             "Print the stages and commands; run nothing.")


def _marker(run_dir: pathlib.Path, stage: main_job.Stage) -> pathlib.Path:
  return run_dir / "stages" / f"{stage.name}.json"


def _write_marker(path: pathlib.Path, stage: main_job.Stage,
                  seconds: float) -> None:
  path.parent.mkdir(parents=True, exist_ok=True)
  tmp = path.with_suffix(".tmp")
  tmp.write_text(json.dumps({"stage": stage.name, "command": stage.command(),
                             "seconds": round(seconds, 1)}, indent=1))
  tmp.replace(path)  # atomic: a killed run never leaves a half marker


def _first_changed(stages: list[main_job.Stage],
                   run_dir: pathlib.Path) -> str | None:
  """The first finished stage whose command differs from the recipe's now.

  A recipe edited after a run (e.g. more training steps) must re-run that
  stage (a training stage resumes from its last checkpoint) and everything
  after it, which consumed its outputs. The Python executable is ignored.
  """
  for stage in stages:
    marker = _marker(run_dir, stage)
    if not marker.exists():
      continue
    try:
      ran = json.loads(marker.read_text(encoding="utf-8"))["command"][1:]
    except (ValueError, KeyError, TypeError):
      return stage.name  # unreadable marker: not trusted
    if ran != stage.command()[1:]:
      return stage.name
  return None


def _forget_from(stages: list[main_job.Stage], run_dir: pathlib.Path,
                 name: str) -> None:
  names = [s.name for s in stages]
  if name not in names:
    raise app.UsageError(f"--restart_from={name!r} is not a stage of this "
                         f"recipe; choose one of {', '.join(names)}")
  for stage in stages[names.index(name):]:
    _marker(run_dir, stage).unlink(missing_ok=True)


def _training_finished(stage: main_job.Stage) -> bool:
  """Whether a train stage's run ended with reason "done".

  ``m4moe-train`` exits 0 after a SIGTERM too (it saves and stops, as on a
  preempted TPU VM); such a stage is not finished and must run again, which
  resumes from the saved checkpoint.
  """
  model_dir = next(a.partition("=")[2] for a in stage.args
                   if a.startswith("--model_dir="))
  metrics = pathlib.Path(model_dir) / "metrics.jsonl"
  reason = None
  if metrics.is_file():
    for line in metrics.read_text(encoding="utf-8").splitlines():
      record = json.loads(line) if line.strip() else {}
      if record.get("kind") == "end":
        reason = record.get("reason")
  return reason == "done"


def _prepare_fixtures(recipe: main_job.Recipe, run_dir: pathlib.Path) -> None:
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


def _ensure_apt_lists(recipe: main_job.Recipe) -> None:
  """Runs ``apt-get update`` once if the package lists are empty.

  ``apt-get download`` (the Debian half of the corpus recipe) finds nothing
  on a fresh machine whose lists were never fetched. Only done as root;
  otherwise the corpus builder skips the Debian half and says so.
  """
  if not recipe.use_packaged_corpus_recipe or not shutil.which("apt-get"):
    return
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


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  recipe = main_job.RECIPES[_RECIPE.value]
  run_dir = pathlib.Path(_RUN_DIR.value).resolve()
  cache_dir = pathlib.Path(_CACHE_DIR.value or run_dir / "cache").resolve()
  stages = main_job.plan(recipe, run_dir=run_dir, cache_dir=cache_dir)
  if _RESTART_FROM.value:
    _forget_from(stages, run_dir, _RESTART_FROM.value)
  changed = None if _DRY_RUN.value else _first_changed(stages, run_dir)
  if changed:
    print(f"m4moe-run: stage {changed!r} ran with a different command than "
          f"the recipe's now; re-running it and every later stage",
          flush=True)
    _forget_from(stages, run_dir, changed)
  start = time.monotonic()
  for i, stage in enumerate(stages, 1):
    header = f"[stage {i}/{len(stages)}] {stage.name}: {stage.description}"
    if _DRY_RUN.value:
      print(header + "\n  " + " ".join(stage.command()), flush=True)
      continue
    marker = _marker(run_dir, stage)
    if marker.exists():
      print(f"{header} -- done earlier, skipped ({marker})", flush=True)
      continue
    print(f"{header}\n  $ {' '.join(stage.command())}", flush=True)
    if stage.name == "corpus":
      _prepare_fixtures(recipe, run_dir)
      _ensure_apt_lists(recipe)
    stage_start = time.monotonic()
    result = main_job.run_stage_process(stage.command())
    if result.interrupted_by is not None:
      name = signal.Signals(result.interrupted_by).name
      print(f"m4moe-run: stopped by {name} during stage {stage.name!r} (it "
            f"exited with {result.returncode}); re-run the same command to "
            "resume: finished stages are skipped and training resumes from "
            "its last checkpoint", file=sys.stderr, flush=True)
      sys.exit(128 + result.interrupted_by)
    if result.returncode != 0:
      raise SystemExit(
          f"m4moe-run: stage {stage.name!r} failed (exit {result.returncode})"
          f"; fix the error above and re-run the same command: finished "
          f"stages are skipped")
    if stage.tool == "train" and not _training_finished(stage):
      raise SystemExit(
          f"m4moe-run: stage {stage.name!r} stopped before its last step "
          f"(preempted or interrupted); re-run the same command to resume "
          f"it from its last checkpoint")
    _write_marker(marker, stage, time.monotonic() - stage_start)
    logging.info("stage %s took %.0f s (total %.0f s)", stage.name,
                 time.monotonic() - stage_start, time.monotonic() - start)
  if not _DRY_RUN.value:
    report = run_dir / "report"
    print(f"m4moe-run: done in {time.monotonic() - start:.0f} s. Report: "
          f"{report / 'report.html'} (also report.md, delta_bleu.png)",
          flush=True)


def run() -> None:
  app.run(main)


if __name__ == "__main__":
  run()
