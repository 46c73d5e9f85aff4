"""One candidate run of the peer yardstick: train, check, decode.

Shared by the selection (``select.py --mode=select``, the dev split) and
the final comparison (``final_runs.py``, the test splits), so that a
candidate trains, has its schedule checked and decodes the same way in
both: the same token budget, the schedule built for it
(``Candidate.schedule``), the one decoding config of both systems
(``systems.Decoding``).
"""

from __future__ import annotations

import pathlib
import subprocess
from typing import Any, Sequence

from m4moe.benchmarks.peer import candidates as candidates_lib
from m4moe.benchmarks.peer import schedules
from m4moe.benchmarks.peer import systems
from m4moe.benchmarks.peer import toolkit
from m4moe.eval import testsets as testsets_lib


def code_commit() -> str | None:
  """The harness's git commit (None outside a checkout)."""
  done = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True,
                        text=True, check=False,
                        cwd=pathlib.Path(__file__).resolve().parent)
  return done.stdout.strip() or None


def fresh_dir(path: pathlib.Path) -> pathlib.Path:
  """``path``, after moving an interrupted earlier attempt aside."""
  if path.exists():
    n = 1
    while path.with_name(f"{path.name}.abandoned-{n}").exists():
      n += 1
    path.rename(path.with_name(f"{path.name}.abandoned-{n}"))
  path.mkdir(parents=True)
  return path


def peer_objects(candidate: candidates_lib.Candidate, *, planned_steps: int,
                 decoding: systems.Decoding
                 ) -> tuple[toolkit.PeerRecipe, toolkit.PeerModel]:
  """The peer's recipe and model for ``candidate`` at ``planned_steps``."""
  schedule = candidate.schedule(planned_steps=planned_steps)
  recipe = toolkit.PeerRecipe(
      learning_rate=candidate.peak, warmup_steps=schedule.warmup_steps,
      decay=candidate.decay, planned_steps=planned_steps,
      beta2=candidate.beta2, clipnorm=candidate.clipping,
      checkpoint_every=candidate.checkpoint_every(
          planned_steps=planned_steps),
      keep_checkpoints=max(candidate.average, 1),
      label_smoothing=candidate.label_smoothing,
      batch_tokens=candidate.batch_tokens, max_length=systems.MAX_LENGTH,
      max_decode_length=decoding.max_output_tokens,
      beam_size=decoding.beam_size, length_penalty=decoding.length_penalty,
      decode_batch_size=decoding.batch_size)
  return recipe, toolkit.PeerModel(dropout=0.0)


def _train_m4moe(*, candidate: candidates_lib.Candidate, data: systems.Data,
                 root: pathlib.Path, splits: Sequence[str],
                 budget: systems.Budget, seed: int, core: str,
                 decoding: systems.Decoding
                 ) -> tuple[dict[str, Any], dict[str, systems.Decoded]]:
  planned = budget.steps_for(candidate.batch_tokens)
  train = systems.train_m4moe(
      data=data, root=root, config="tiny/dense",
      flags=candidate.m4moe_flags(planned_steps=planned),
      batch_tokens=candidate.batch_tokens, budget=budget, seed=seed,
      core=core, checkpoint_every=candidate.checkpoint_every(
          planned_steps=planned), keep_checkpoints=candidate.average)
  if candidate.average:
    systems.average_m4moe(root=root, last=candidate.average, core=core)
  decoded = {split: systems.decode_m4moe(
      data=data, root=root, split=split, name=candidate.name, core=core,
      decoding=decoding, averaged=bool(candidate.average))
             for split in splits}
  return train, decoded


def train_and_decode(*, candidate: candidates_lib.Candidate,
                     data: systems.Data, root: pathlib.Path,
                     splits: Sequence[str], budget: systems.Budget,
                     seed: int, core: str,
                     peer_python: pathlib.Path | None,
                     decoding: systems.Decoding = systems.Decoding()
                     ) -> tuple[dict[str, Any], dict[str, systems.Decoded]]:
  """Trains one candidate, decodes each of ``splits`` of ``data``.

  The training summary gains ``schedule_check`` (``schedules.check``):
  whether the run reached its peak rate and trained its planned steps.

  Raises:
    ValueError: the candidate's warmup does not fit inside the budget.
  """
  planned = budget.steps_for(candidate.batch_tokens)
  schedule = candidate.schedule(planned_steps=planned)
  if candidate.system == candidates_lib.SYSTEM_M4MOE:
    train, decoded = _train_m4moe(
        candidate=candidate, data=data, root=root, splits=splits,
        budget=budget, seed=seed, core=core, decoding=decoding)
  else:
    if peer_python is None:
      raise toolkit.PeerError("the peer needs --onmt_venv")
    recipe, model = peer_objects(candidate, planned_steps=planned,
                                 decoding=decoding)
    systems.prepare_peer(data=data, root=root, recipe=recipe, model=model,
                         budget=budget)
    train = systems.train_peer(python=peer_python, root=root,
                               budget=budget, seed=seed, core=core)
    decoded = {}
    for split in splits:
      (testset,) = testsets_lib.load_testsets(data.corpus_dir, split=split,
                                              langs=[data.language])
      decoded[split] = systems.decode_peer(
          python=peer_python, data=data, root=root, testset=testset,
          split=split, name=candidate.name, seed=seed, core=core,
          decoding=decoding, average=candidate.average)
  train["schedule_check"] = schedules.check(
      schedule, steps=int(train["steps"]),
      logged_rate=train.get("logged_learning_rate"))
  return train, decoded
