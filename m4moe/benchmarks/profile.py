"""Per-op profiles of a benchmark case: tf.profiler trace -> op table.

To know where a case spends its time before optimising it,
:func:`profile_call` traces a blocking zero-argument call (as the
sub-benchmarks time) with ``tf.profiler``; :func:`op_table` reads the trace
back and ranks the TF ops by time.

What TF 2.21 writes on CPU (``<logdir>/plugins/profile/<run>/<host>.xplane.pb``,
an ``XSpace``): a ``/host:CPU`` plane with one XLine per host thread --
``python`` (the caller: eager dispatch, and under XLA the compiled function
itself), ``tf_Compute/<tid>`` (the inter-op threads the executor runs graph
ops on) and ``tf_numa_-1_Eigen/<tid>`` (intra-op Eigen workers: thread-pool
markers only). Each executed op is one XEvent whose event metadata is named
``"<op_name>:<op_type>"`` (e.g. ``"GatherV2_1:GatherV2"``); TF's own
converter sets that metadata's ``display_name`` to the op type. Other events
on the same lines (``ExecutorState::Process``, ``ParallelFor``,
``ThreadpoolListener::*``, ``EagerLocalExecute: ...``) have no display name,
nor do XLA's ``end: <hlo>`` markers. The op events carry no stats (nothing
in ``stat_metadata`` is needed for the table).
"""

from __future__ import annotations

import collections
import pathlib
from typing import Any, Callable, Iterator, Sequence

import tensorflow as tf
from tensorflow.tsl.profiler.protobuf import xplane_pb2

HOST_PLANE = "/host:CPU"
# TF's per-op TraceMe is level 1 for expensive kernels and 2 for cheap ones:
# level 2 records every op.
_HOST_TRACER_LEVEL = 2


def _xplane_files(logdir: pathlib.Path) -> dict[pathlib.Path, int]:
  """Every ``*.xplane.pb`` under ``logdir`` -> its mtime (ns)."""
  return {path: path.stat().st_mtime_ns
          for path in logdir.glob("plugins/profile/*/*.xplane.pb")}


def profile_call(fn: Callable[[], Any], *, logdir: str | pathlib.Path,
                 reps: int) -> pathlib.Path:
  """Traces ``reps`` calls of ``fn`` with tf.profiler into ``logdir``.

  ``fn`` is called once untraced first (tracing, compilation, caches), then
  ``reps`` times between ``tf.profiler.experimental.start(logdir)`` and
  ``stop()`` (host tracer level 2: every op; no Python tracer).

  Args:
    fn: zero-argument callable that blocks until its work is done (e.g. ends
      with ``.numpy()``).
    logdir: profile directory (TensorBoard's ``--logdir``); created if needed.
    reps: traced calls (>= 1).

  Returns:
    The ``<logdir>/plugins/profile/<run>/<host>.xplane.pb`` this trace wrote.
  """
  if reps < 1:
    raise ValueError(f"--reps={reps} must be >= 1 to profile")
  logdir = pathlib.Path(logdir)
  before = _xplane_files(logdir)
  fn()
  options = tf.profiler.experimental.ProfilerOptions(
      host_tracer_level=_HOST_TRACER_LEVEL, python_tracer_level=0)
  tf.profiler.experimental.start(str(logdir), options=options)
  try:
    for _ in range(reps):
      fn()
  finally:
    tf.profiler.experimental.stop()
  # A run directory is named by the second: a trace in the same second as
  # the previous one overwrites its file, hence new *or* modified.
  written = [path for path, mtime in _xplane_files(logdir).items()
             if before.get(path) != mtime]
  if not written:
    raise RuntimeError(f"tf.profiler wrote no *.xplane.pb under {logdir}")
  return max(written, key=lambda path: path.stat().st_mtime_ns)


def load_xspace(path: str | pathlib.Path) -> xplane_pb2.XSpace:
  """Parses an ``*.xplane.pb`` file."""
  xspace = xplane_pb2.XSpace()
  xspace.ParseFromString(pathlib.Path(path).read_bytes())
  return xspace


def host_plane(xspace: xplane_pb2.XSpace) -> xplane_pb2.XPlane:
  """The ``/host:CPU`` plane: host threads, one XLine each."""
  for plane in xspace.planes:
    if plane.name == HOST_PLANE:
      return plane
  raise ValueError(f"no {HOST_PLANE!r} plane in the trace (planes: "
                   f"{[plane.name for plane in xspace.planes]})")


def op_type(metadata: xplane_pb2.XEventMetadata) -> str | None:
  """The op type if ``metadata`` names a TF op event, else None.

  An op event's metadata is named ``"<op_name>:<op_type>"`` and has
  ``display_name == <op_type>`` (set by TF's trace converter, which parses
  TF op names; instrumentation events such as ``ExecutorState::Process``
  get no display name).
  """
  if metadata.display_name and metadata.name.endswith(
      ":" + metadata.display_name):
    return metadata.display_name
  return None


def event_metadata(plane: xplane_pb2.XPlane,
                   event: xplane_pb2.XEvent) -> xplane_pb2.XEventMetadata:
  """``event``'s metadata (name, display name) from ``plane.event_metadata``.

  Looked up with ``get``: indexing a protobuf message map with a missing id
  would silently insert an empty entry.
  """
  metadata = plane.event_metadata.get(event.metadata_id)
  if metadata is None:
    raise ValueError(f"plane {plane.name!r}: event metadata_id "
                     f"{event.metadata_id} is not in its event_metadata")
  return metadata


def _occurrences(event: xplane_pb2.XEvent) -> int:
  """How many calls ``event`` stands for (> 1 only for aggregated events)."""
  return event.num_occurrences if _aggregated(event) else 1


def _aggregated(event: xplane_pb2.XEvent) -> bool:
  """Whether ``event`` has num_occurrences instead of an offset."""
  return event.WhichOneof("data") == "num_occurrences"


def self_times(events: Sequence[xplane_pb2.XEvent]) -> Iterator[
    tuple[xplane_pb2.XEvent, int]]:
  """Each event of one thread with its exclusive (self) time in ps.

  Events on one XLine nest like a call stack; an event's self time is its
  duration minus the durations of the events directly inside it, so nested
  op events (an op whose kernel runs a function inline) are not counted
  twice. Aggregated events (``num_occurrences``, no offset) nest nothing.

  Args:
    events: the op events of one XLine.

  Yields:
    (event, self time in picoseconds).
  """
  timed = sorted((e for e in events if not _aggregated(e)),
                 key=lambda e: (e.offset_ps, -e.duration_ps))
  children = collections.defaultdict(int)  # index in `timed` -> nested ps
  stack: list[int] = []
  for i, event in enumerate(timed):
    while stack and (timed[stack[-1]].offset_ps + timed[stack[-1]].duration_ps
                     <= event.offset_ps):
      stack.pop()
    if stack:
      children[stack[-1]] += event.duration_ps
    stack.append(i)
  for i, event in enumerate(timed):
    yield event, event.duration_ps - children[i]
  for event in events:
    if _aggregated(event):
      yield event, event.duration_ps


def op_totals(plane: xplane_pb2.XPlane) -> dict[tuple[str, str], list[int]]:
  """(op_name, op_type) -> [count, self time in ps], over all of ``plane``.

  Reads every XLine (thread) of the plane, keeps the events whose
  ``event_metadata`` entry (:func:`event_metadata`) is a TF op
  (:func:`op_type`), and sums their self times (:func:`self_times`).
  """
  totals = collections.defaultdict(lambda: [0, 0])
  for line in plane.lines:
    ops = [event for event in line.events
           if op_type(event_metadata(plane, event))]
    for event, self_ps in self_times(ops):
      metadata = event_metadata(plane, event)
      kind = op_type(metadata)
      total = totals[(metadata.name[:-len(kind) - 1], kind)]
      total[0] += _occurrences(event)
      total[1] += self_ps
  return dict(totals)


def type_totals(totals: dict[tuple[str, str], list[int]]) -> dict[
    tuple[str, str], list[int]]:
  """:func:`op_totals` summed by op type, keyed ``("(N ops)", op_type)``.

  N is the number of graph nodes of that type (e.g. one MatMul per expert
  and pass): the per-node table spreads them over many small rows.
  """
  nodes = collections.Counter(kind for _, kind in totals)
  folded = collections.defaultdict(lambda: [0, 0])
  for (_, kind), (count, ps) in totals.items():
    n = nodes[kind]
    total = folded[(f"({n} op{'' if n == 1 else 's'})", kind)]
    total[0] += count
    total[1] += ps
  return dict(folded)


def rank(totals: dict[tuple[str, str], list[int]], *, top: int,
         what: str = "ops") -> list[dict[str, Any]]:
  """Table rows, slowest first: the ``top`` rows and one row for the rest.

  Args:
    totals: (op_name, op_type) -> [count, self time in ps] (:func:`op_totals`
      or :func:`type_totals`).
    top: rows listed (>= 0); the others are summed into a last row named
      ``(other N <what>)`` with an empty op_type, if there are any.
    what: what a row is, for the last row's name ("ops", "op types").

  Returns:
    Dicts ``{op_name, op_type, count, total_ms, percent}``; ``percent`` is of
    the summed op time (all rows add up to 100), not of wall time.
  """
  if top < 0:
    raise ValueError(f"top={top} must be >= 0")
  grand = sum(ps for _, ps in totals.values())

  def row(op_name, kind, count, ps):
    return {"op_name": op_name, "op_type": kind, "count": count,
            "total_ms": ps / 1e9,
            "percent": 100.0 * ps / grand if grand else 0.0}

  ranked = sorted(totals.items(), key=lambda item: (-item[1][1], item[0]))
  rows = [row(name, kind, count, ps)
          for (name, kind), (count, ps) in ranked[:top]]
  rest = ranked[top:]
  if rest:
    rows.append(row(f"(other {len(rest)} {what})", "",
                    sum(count for _, (count, _) in rest),
                    sum(ps for _, (_, ps) in rest)))
  return rows


def op_table(xplane_path: str | pathlib.Path, *, top: int,
             by: str = "op_name") -> list[dict[str, Any]]:
  """The TF ops of a trace ranked by time: ``top`` rows and a remainder row.

  Reads the ``/host:CPU`` plane of the XSpace (see the module docstring for
  why: on CPU every TF op event is on a host thread's XLine there --
  ``tf_Compute/*`` for graph ops, ``python`` for eager and XLA-compiled
  calls), aggregates op events by (op name, op type) over all its lines with
  self times, and ranks them (:func:`rank`). Times are summed over threads:
  the executor runs independent ops in parallel, so the total can exceed
  the wall time of the calls. Under XLA the compiled function is one op;
  its HLO ops are not TF ops and are not listed.

  Args:
    xplane_path: an ``*.xplane.pb`` (:func:`profile_call`'s result).
    top: rows listed; the rest are summed into one last row.
    by: ``"op_name"``: one row per graph node; ``"op_type"``: one row per op
      type, op_name ``"(N ops)"`` (:func:`type_totals`).

  Returns:
    Rows ``{op_name, op_type, count, total_ms, percent}`` (see :func:`rank`);
    ``count`` is executions over all traced calls. Empty if the trace has no
    TF op events.
  """
  if by not in ("op_name", "op_type"):
    raise ValueError(f"by={by!r}: use 'op_name' or 'op_type'")
  totals = op_totals(host_plane(load_xspace(xplane_path)))
  if by == "op_type":
    return rank(type_totals(totals), top=top, what="op types")
  return rank(totals, top=top)


def extra_table(xplane_path: str | pathlib.Path,
                reference_path: str | pathlib.Path, *, top: int,
                calls: int) -> list[dict[str, Any]]:
  """Op types ranked by the time per call they take beyond a reference's.

  Where does a case's extra time go (the MoE step over the dense one)? Both
  traces are summed by op type (:func:`type_totals`) and divided by
  ``calls``, the traced calls of each; the rows are the ``top`` types with
  the largest difference, then one row of the other types, then a
  ``(total)`` row of every op's time, so the rows above it add up to its
  difference.

  Args:
    xplane_path: the case's trace (:func:`profile_call`'s result).
    reference_path: the reference's trace, of as many calls.
    top: rows listed before the remainder and total rows (>= 0).
    calls: traced calls per trace (>= 1).

  Returns:
    Rows ``{op_type, ms_per_call, reference_ms_per_call, extra_ms}``,
    largest ``extra_ms`` first (negative: faster than in the reference).
  """
  if top < 0 or calls < 1:
    raise ValueError(f"top={top} must be >= 0 and calls={calls} >= 1")
  def per_type(path):
    folded = type_totals(op_totals(host_plane(load_xspace(path))))
    return {kind: ps / 1e9 / calls for (_, kind), (_, ps) in folded.items()}
  case, reference = per_type(xplane_path), per_type(reference_path)
  def row(kind, ms, ref_ms):
    return {"op_type": kind, "ms_per_call": ms,
            "reference_ms_per_call": ref_ms, "extra_ms": ms - ref_ms}
  rows = sorted((row(kind, case.get(kind, 0.0), reference.get(kind, 0.0))
                 for kind in set(case) | set(reference)),
                key=lambda r: (-r["extra_ms"], r["op_type"]))
  rest = rows[top:]
  out = rows[:top]
  if rest:
    out.append(row(f"(other {len(rest)} op types)",
                   sum(r["ms_per_call"] for r in rest),
                   sum(r["reference_ms_per_call"] for r in rest)))
  out.append(row("(total)", sum(case.values()), sum(reference.values())))
  return out
