"""The recipes the peer selection screens: equal care for both systems.

A comparison in which one system had more candidates, or had its own
usual knobs tried while the other's were not, measures the tuning. So
both systems get the same rounds and the same number of candidates, each
over the knobs that system's users tune:

* **Round 1**, the peak rate: 1e-3, 2e-3, 4e-3 and 8e-3 at warmup 0.25 of
  the run (both systems at their shared defaults otherwise).
* **Round 2**, one change at a time from the system's best round-1
  candidate on dev (:data:`ROUND2`): warmup 0.1 and 0.5, batch size 2048
  and 8192 tokens (the same tokens, so half or twice the steps), label
  smoothing 0, gradient clipping 1.0, averaging of the last 5 checkpoints;
  for m4moe also beta1 0 and factored second moments, for OpenNMT-tf
  cosine decay and Adam's beta2 0.98. Nine each.
* **Round 3**, the rate again beside the best of rounds 1-2: x0.7 and
  x1.4 (:data:`ROUND3`). Two each.

Fifteen candidates per system. Every schedule is stated for the budget
(:mod:`m4moe.benchmarks.peer.schedules`): the warmup is a fraction of the
run's planned steps, so it ends inside the run at every batch size, and
the peer's cosine decay reaches 0 exactly at its planned end.

Round 2 and 3 candidates are made from the winner found on dev when their
round starts (:func:`resolve`); each record keeps its candidate's full
spec (:meth:`Candidate.to_dict`), so a record is read without this queue.
Nothing here imports TensorFlow.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping

from m4moe.benchmarks.peer import schedules

SYSTEM_M4MOE = "m4moe"
SYSTEM_PEER = "opennmt-tf"
SYSTEMS = (SYSTEM_M4MOE, SYSTEM_PEER)
PREFIX = {SYSTEM_M4MOE: "m4moe", SYSTEM_PEER: "peer"}
PEER_DECAYS = {"rsqrt": "linear_rsqrt", "cosine": "linear_cosine"}
# Each system's knobs that only it has (value when not screened).
_ONLY = {SYSTEM_M4MOE: {"beta1": 0.9, "factored": False},
         SYSTEM_PEER: {"beta2": 0.999, "decay": "rsqrt"}}
# Checkpoints kept (and saved evenly) for averaging: the last 5 of 20.
AVERAGE_SPAN = 20


@dataclasses.dataclass(frozen=True, kw_only=True)
class Candidate:
  """One recipe to screen, stated for any token budget.

  Attributes:
    name: unique id (file names, tables).
    system: ``m4moe`` or ``opennmt-tf``.
    why: what the candidate changes, for the table.
    round: 1, 2 or 3.
    base: the candidate it changes (None in round 1).
    peak: the peak learning rate.
    warmup: the warmup (m4moe: the hold at the peak; the peer: the linear
      rise) as a fraction of the run's planned steps, in (0, 1).
    batch_tokens: training batch size in tokens.
    label_smoothing: training label smoothing.
    clipping: m4moe: update clipping threshold (0: off); the peer: Adam's
      per-variable gradient norm clip ``clipnorm`` (0: off).
    average: average the last N checkpoints before decoding (0: none).
    beta1, factored: m4moe's first moment and factored second moments.
    beta2, decay: the peer's Adam beta2 and decay after warmup
      (``rsqrt``: InvSqrtDecay; ``cosine``: to 0 at the planned end).
  """

  name: str
  system: str
  why: str
  round: int = 1
  base: str | None = None
  peak: float = 1e-3
  warmup: float = 0.25
  batch_tokens: int = 4096
  label_smoothing: float = 0.1
  clipping: float = 0.0
  average: int = 0
  beta1: float = 0.9
  factored: bool = False
  beta2: float = 0.999
  decay: str = "rsqrt"

  def __post_init__(self) -> None:
    if self.system not in SYSTEMS:
      raise ValueError(f"candidate {self.name}: system {self.system!r} is "
                       f"not one of {', '.join(SYSTEMS)}")
    problems = []
    if not 0 < self.warmup < 1:
      problems.append(f"warmup={self.warmup}: give a fraction of the run "
                      "in (0, 1)")
    if self.peak <= 0 or self.batch_tokens < 64:
      problems.append(f"peak={self.peak}, batch_tokens={self.batch_tokens}:"
                      " use a positive rate and batches of >= 64 tokens")
    if self.average == 1 or not 0 <= self.average <= AVERAGE_SPAN:
      problems.append(f"average={self.average}: use 0 (none) or 2.."
                      f"{AVERAGE_SPAN} checkpoints")
    if self.decay not in PEER_DECAYS:
      problems.append(f"decay={self.decay!r}: use one of "
                      f"{', '.join(PEER_DECAYS)}")
    other = SYSTEM_PEER if self.system == SYSTEM_M4MOE else SYSTEM_M4MOE
    for key, default in _ONLY[other].items():
      if getattr(self, key) != default:
        problems.append(f"{key}={getattr(self, key)!r} is a knob of "
                        f"{other} only: leave it at {default!r}")
    if problems:
      raise ValueError(f"candidate {self.name}: " + "; ".join(problems))

  def schedule(self, *, planned_steps: int) -> schedules.Schedule:
    """The schedule of a run with ``planned_steps`` steps.

    Raises:
      ValueError: the warmup does not fit inside the run.
    """
    shape = ("hold_rsqrt" if self.system == SYSTEM_M4MOE
             else PEER_DECAYS[self.decay])
    return schedules.Schedule(
        shape=shape, peak=self.peak, planned_steps=planned_steps,
        warmup_steps=schedules.warmup_steps(self.warmup, planned_steps))

  def checkpoint_every(self, *, planned_steps: int) -> int:
    """Steps between the checkpoints kept for averaging (0: none kept)."""
    if not self.average:
      return 0
    return max(1, planned_steps // AVERAGE_SPAN)

  def m4moe_flags(self, *, planned_steps: int) -> tuple[str, ...]:
    """m4moe-train's flags for this recipe (every knob explicit)."""
    warmup = self.schedule(planned_steps=planned_steps).warmup_steps
    return (f"--learning_rate={self.peak * math.sqrt(warmup):.6g}",
            f"--warmup_steps={warmup}", "--lr_schedule=rsqrt",
            f"--label_smoothing={self.label_smoothing:g}",
            f"--clipping_threshold={self.clipping:g}",
            f"--beta1={self.beta1:g}",
            "--factored" if self.factored else "--nofactored",
            "--nomultiply_by_parameter_scale", "--dropout_rate=0",
            "--attention_dropout_rate=0")

  def settings(self) -> tuple[str, ...]:
    """The knobs as ``key=value``, for tables and records."""
    keys = ["peak", "warmup", "batch_tokens", "label_smoothing", "clipping",
            "average", *_ONLY[self.system]]
    return tuple(f"{k}={getattr(self, k)}" for k in keys)

  def to_dict(self) -> dict[str, Any]:
    return dataclasses.asdict(self)

  @classmethod
  def from_dict(cls, value: Mapping[str, Any]) -> Candidate:
    """A candidate from :meth:`to_dict` (a record's ``spec``)."""
    fields = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(value) - fields)
    if unknown:
      raise ValueError(f"candidate spec has unknown fields {unknown}")
    return cls(**value)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Change:
  """A one-knob change applied to a round's base (:func:`resolve`).

  Attributes:
    name: the name suffix (``<prefix>_r<round>_<name>``).
    why: what it changes.
    values: knob -> new value.
    rate_factor: multiplies the base's peak rate.
  """

  name: str
  why: str
  values: tuple[tuple[str, Any], ...] = ()
  rate_factor: float = 1.0


def _change(name: str, why: str, **values: Any) -> Change:
  return Change(name=name, why=why, values=tuple(values.items()))


def _round1(system: str) -> tuple[Candidate, ...]:
  prefix = PREFIX[system]
  return tuple(Candidate(name=f"{prefix}_r1_lr{p}", system=system,
                         why=f"peak {p}", peak=float(p))
               for p in ("1e-3", "2e-3", "4e-3", "8e-3"))


ROUND1 = {s: _round1(s) for s in SYSTEMS}
_SHARED2 = (
    _change("warmup0.1", "warmup 0.1 of the run", warmup=0.1),
    _change("warmup0.5", "warmup 0.5 of the run", warmup=0.5),
    _change("batch2048", "2048-token batches (same tokens)",
            batch_tokens=2048),
    _change("batch8192", "8192-token batches (same tokens)",
            batch_tokens=8192),
    _change("ls0", "label smoothing 0", label_smoothing=0.0),
    _change("clip1", "clipping 1.0", clipping=1.0),
    _change("avg5", "average of the last 5 checkpoints", average=5),
)
ROUND2 = {
    SYSTEM_M4MOE: (*_SHARED2,
                   _change("beta1_0", "no momentum (beta1 0)", beta1=0.0),
                   _change("factored", "factored second moments",
                           factored=True)),
    SYSTEM_PEER: (*_SHARED2,
                  _change("cosine", "cosine decay to 0 at the end",
                          decay="cosine"),
                  _change("beta2_0.98", "Adam beta2 0.98", beta2=0.98)),
}
ROUND3 = {s: (Change(name="rate0.7x", why="peak x0.7", rate_factor=0.7),
              Change(name="rate1.4x", why="peak x1.4", rate_factor=1.4))
          for s in SYSTEMS}
ROUNDS = (1, 2, 3)


def resolve(change: Change, *, base: Candidate, round_: int) -> Candidate:
  """``change`` applied to ``base``, as a candidate of round ``round_``."""
  values = dict(change.values)
  values["peak"] = float(f"{base.peak * change.rate_factor:.6g}")
  return dataclasses.replace(
      base, name=f"{PREFIX[base.system]}_r{round_}_{change.name}",
      why=f"{change.why} (from {base.name})", round=round_,
      base=base.name, **values)


def round_candidates(system: str, round_: int,
                     base: Candidate | None = None) -> tuple[Candidate, ...]:
  """Round ``round_``'s candidates of ``system`` (2 and 3 need ``base``).

  Raises:
    ValueError: an unknown round, or no base for round 2 or 3.
  """
  if round_ == 1:
    return ROUND1[system]
  if round_ not in ROUNDS or base is None:
    raise ValueError(f"round {round_} of {system} needs its base: the best "
                     f"candidate of rounds 1..{round_ - 1} on dev")
  changes = ROUND2[system] if round_ == 2 else ROUND3[system]
  return tuple(resolve(c, base=base, round_=round_) for c in changes)


def counts() -> dict[str, dict[int, int]]:
  """Candidates per system and round (equal by construction)."""
  return {s: {1: len(ROUND1[s]), 2: len(ROUND2[s]), 3: len(ROUND3[s])}
          for s in SYSTEMS}


def all_names() -> dict[str, str]:
  """Every candidate name the rounds can make -> its system."""
  out = {c.name: s for s in SYSTEMS for c in ROUND1[s]}
  for s in SYSTEMS:
    for round_, changes in ((2, ROUND2[s]), (3, ROUND3[s])):
      out.update({f"{PREFIX[s]}_r{round_}_{c.name}": s for c in changes})
  return out
