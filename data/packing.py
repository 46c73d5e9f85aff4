"""Packing tokenised pairs into fixed-length rows (numpy, first fit).

Short UI strings waste most of a padded row; packing puts several pairs in
one row. Each pair keeps its own segment id (1, 2, ... within the row; 0 is
padding) and positions restart at 0 for each pair, on both sides. A pair goes
into the first open row where both its source and its target still fit, else
a new row (first-fit, in arrival order, so the result is deterministic).

Arrays (R rows, L = ``length``), all ``<int32>[R, L]``: ``inputs``,
``inputs_segment_ids``, ``inputs_positions``, ``targets``,
``targets_segment_ids``, ``targets_positions``.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

FEATURES = ("inputs", "inputs_segment_ids", "inputs_positions", "targets",
            "targets_segment_ids", "targets_positions")
# Per-token routing-language indices (m4moe.moe.task_routing), with languages=.
LANGUAGE_FEATURES = ("inputs_languages", "targets_languages")


def _first_fit(sizes: Sequence[tuple[int, int]], length: int,
               pack: bool) -> list[int]:
  """Row index of every pair under first fit (plain Python: fast here)."""
  free_source, free_target, open_rows, assignment = [], [], [], []
  for size_source, size_target in sizes:
    chosen = -1
    if pack:
      for row in open_rows:
        if free_source[row] >= size_source and free_target[row] >= size_target:
          chosen = row
          break
    if chosen < 0:
      chosen = len(free_source)
      free_source.append(length)
      free_target.append(length)
      open_rows.append(chosen)
    free_source[chosen] -= size_source
    free_target[chosen] -= size_target
    if min(free_source[chosen], free_target[chosen]) < 2:
      open_rows.remove(chosen)
    assignment.append(chosen)
  return assignment


def _fill(out: dict[str, np.ndarray], side: str, rows: list[int],
          seqs: Sequence[Sequence[int]],
          languages: Sequence[int] | None = None) -> None:
  """Writes one side's tokens, segment ids and positions into ``out`` (and
  each token's pair language, if given)."""
  num_rows = out[side].shape[0]
  offsets = [0] * num_rows
  segment = [0] * num_rows
  flat_rows, flat_cols, tokens, segs, positions = [], [], [], [], []
  langs = []
  for pair, (row, ids) in enumerate(zip(rows, seqs)):
    size = len(ids)
    start = offsets[row]
    segment[row] += 1
    flat_rows.extend([row] * size)
    flat_cols.extend(range(start, start + size))
    tokens.extend(ids)
    segs.extend([segment[row]] * size)
    positions.extend(range(size))
    if languages is not None:
      langs.extend([languages[pair]] * size)
    offsets[row] = start + size
  out[side][flat_rows, flat_cols] = tokens
  out[f"{side}_segment_ids"][flat_rows, flat_cols] = segs
  out[f"{side}_positions"][flat_rows, flat_cols] = positions
  if languages is not None:
    out[f"{side}_languages"][flat_rows, flat_cols] = langs


def pack_pairs(sources: Sequence[Sequence[int]],
               targets: Sequence[Sequence[int]], *, length: int,
               pack: bool = True,
               languages: Sequence[int] | None = None
               ) -> dict[str, np.ndarray]:
  """Packs (or, with ``pack=False``, pads) token-id pairs into rows.

  Args:
    sources: token ids of each source, each 1..``length`` long.
    targets: token ids of each target, each 1..``length`` long.
    length: L, the row length.
    pack: False puts every pair in its own row.
    languages: optional routing-language index of each pair; then the
      result also has :data:`LANGUAGE_FEATURES`, each token's pair's
      index (0 at padding).

  Returns:
    The six ``<int32>[R, L]`` arrays of the module docstring (eight with
    ``languages``).

  Raises:
    ValueError: a sequence is longer than ``length`` or empty, or
      ``languages`` does not give one index per pair.
  """
  sizes = [(len(s), len(t)) for s, t in zip(sources, targets)]
  bad = [pair for pair in sizes if not (0 < min(pair) and max(pair) <= length)]
  if bad:
    raise ValueError(f"pair lengths {bad[0]} not in [1, {length}]")
  if languages is not None and len(languages) != len(sizes):
    raise ValueError(f"{len(languages)} languages for {len(sizes)} pairs: "
                     "give one routing-language index per pair")
  rows = _first_fit(sizes, length, pack)
  num_rows = max(rows) + 1 if rows else 0
  keys = FEATURES + (LANGUAGE_FEATURES if languages is not None else ())
  out = {k: np.zeros((num_rows, length), np.int32) for k in keys}
  _fill(out, "inputs", rows, sources, languages)
  _fill(out, "targets", rows, targets, languages)
  return out
