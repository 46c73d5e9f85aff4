r"""m4moe-analyze-routing: which experts does each language use?

Example:
  m4moe-analyze-routing --model_dir=runs/moe --corpus_dir=corpus \
      --vocab_dir=vocab --split=dev --languages=de,fr,ja \
      --output_dir=runs/moe/routing

Runs the trained model teacher-forced in eval mode (no dropout, no-drop eval
capacity) over each language's ``<split>/<lang>.tsv`` pairs and counts, per
MoE layer (encoder and decoder), the real tokens (padding excluded) whose
first / second choice is each expert. Pairs longer than the model's
``--max_length`` are cut to it (counted per language in the JSON). Statistics
(m4moe.analysis.statistics): per-language expert fractions, the mutual
information between language and expert normalised by the language entropy,
each expert's language entropy, and the load per language.

Writes to ``--output_dir`` (its own files only, overwritten on a rerun):
  routing.json       every number (layers -> statistics; languages ordered
                     high -> low resource by training pairs;
                     empty_languages: those requested but left out because
                     the split has no pair of theirs)
  heatmap_<layer>.png  languages x experts per choice, one per MoE layer
  overview.png       small multiples: the first choice of every layer
  routing.html       a self-contained page (images embedded as base64)
"""

from __future__ import annotations

import pathlib
import re
import sys
from typing import TYPE_CHECKING, Any

from absl import app
from absl import flags

from m4moe import cli

if TYPE_CHECKING:  # imported late at run time: --help stays fast
  from m4moe.training import rundir

_MODEL_DIR = flags.DEFINE_string("model_dir", None,
                                 "Run directory written by m4moe-train.")
_CORPUS_DIR = flags.DEFINE_string("corpus_dir", None,
                                  "Corpus built by m4moe-build-corpus.")
_VOCAB_DIR = flags.DEFINE_string(
    "vocab_dir", None, "Directory with source.model/target.model (default: "
    "the run's data.vocab_dir, <model_dir>/vocab or <model_dir>).")
_SPLIT = flags.DEFINE_enum("split", "dev", ["dev", "test", "train"],
                           "Corpus split whose pairs are run.")
_LANGUAGES = flags.DEFINE_list(
    "languages", [], "Languages (default: every <split>/*.tsv file).")
_DIRECTION = flags.DEFINE_enum("direction", "xx_en", ["xx_en", "en_xx"],
                               "Translation direction the model was trained "
                               "for.")
_OUTPUT_DIR = flags.DEFINE_string("output_dir", None,
                                  "Where the JSON, PNGs and HTML go.")
_BATCH_SIZE = flags.DEFINE_integer("batch_size", 64, "Pairs per batch.",
                                   lower_bound=1)


def _truncate(batch, max_length: int):
  """(inputs, targets) cut to ``max_length`` columns; pairs cut."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  inputs, targets = batch["inputs"], batch["targets"]
  cut = tf.reduce_any(inputs[:, max_length:] > 0, axis=1) | tf.reduce_any(
      targets[:, max_length:] > 0, axis=1)
  return ({"inputs": inputs[:, :max_length],
           "targets": targets[:, :max_length]},
          int(tf.reduce_sum(tf.cast(cut, tf.int32))))


def _analyse(files, languages, vocab_dir):
  """(layer -> <int64>[L, K, E] counts, layer -> <int64>[L] tokens,
  lang -> pairs, lang -> pairs cut)."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from m4moe.analysis import capture as routing_capture  # pylint: disable=g-import-not-at-top
  from m4moe.moe import task_routing  # pylint: disable=g-import-not-at-top
  from m4moe.data import pipeline  # pylint: disable=g-import-not-at-top
  from m4moe.eval import translator as translator_lib  # pylint: disable=g-import-not-at-top
  datasets = pipeline.corpus_evaluation_datasets(
      pathlib.Path(_CORPUS_DIR.value), vocab_dir, split=_SPLIT.value,
      langs=languages, direction=_DIRECTION.value,
      batch_size=_BATCH_SIZE.value)
  model = translator_lib.restore_model(files)
  moe = files.config.moe
  max_length = files.config.max_length
  pairs, cut = {}, {}
  with routing_capture.RoutingCapture(model) as capture:
    names = capture.layer_names
    counts = {n: np.zeros((len(languages), moe.top_k, moe.num_experts),
                          np.int64) for n in names}
    tokens = {n: np.zeros(len(languages), np.int64) for n in names}
    for row, lang in enumerate(languages):
      pairs[lang], cut[lang] = 0, 0
      for batch in datasets[lang]:
        trimmed, n_cut = _truncate(batch, max_length)
        if model.routes_by_language:  # --route_by=language: the pair's row
          trimmed.update(task_routing.language_features(
              tf.fill(tf.shape(trimmed["inputs"])[:1],
                      moe.language_index(lang)), **trimmed))
        pairs[lang] += int(batch["inputs"].shape[0])
        cut[lang] += n_cut
        for name, (c, t) in capture.counts(trimmed).items():
          counts[name][row] += c
          tokens[name][row] += t
      print(f"{lang}: {pairs[lang]} pairs ({cut[lang]} cut to "
            f"--max_length={max_length})", file=sys.stderr)
  return counts, tokens, pairs, cut


def with_pairs(corpus: pathlib.Path, languages: list[str], *,
               split: str) -> tuple[list[str], list[str]]:
  """(languages whose split file has a line, the others); exits 1 if none
  has.

  Checked before the model is loaded: an analysis over no pairs would be
  a page of empty heatmaps. An empty language beside others is left out
  with a warning naming it, and listed as ``empty_languages`` in
  ``routing.json``, so the JSON says why it has no row.
  """
  def has_pairs(lang: str) -> bool:
    with open(corpus / split / f"{lang}.tsv", "rb") as f:
      return any(line.strip() for line in f)
  kept = [lang for lang in languages if has_pairs(lang)]
  empty = [lang for lang in languages if lang not in kept]
  if not kept:
    sys.exit(f"m4moe-analyze-routing: error: {corpus}/{split}/ has "
             f"no pairs for {', '.join(empty)}: nothing to analyse, and "
             "nothing was written. Choose another --split (dev, test, train) "
             "or --languages with pairs")
  if empty:
    print(f"m4moe-analyze-routing: warning: {corpus}/{split}/ has no "
          f"pairs for {', '.join(empty)}; left out of the analysis",
          file=sys.stderr, flush=True)
  return kept, empty


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
  for flag in (_MODEL_DIR, _CORPUS_DIR, _OUTPUT_DIR):
    if not flag.value:
      raise app.UsageError(f"--{flag.name} is required")
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from m4moe.analysis import statistics as routing_analysis  # pylint: disable=g-import-not-at-top
  from m4moe.analysis import capture as routing_capture  # pylint: disable=g-import-not-at-top
  from m4moe.eval import comparison  # pylint: disable=g-import-not-at-top
  from m4moe.eval import testsets  # pylint: disable=g-import-not-at-top
  corpus = pathlib.Path(_CORPUS_DIR.value)
  languages, empty = _corpus_languages(corpus)
  files = _routed_run_files()
  try:
    sizes = testsets.train_sizes(corpus)
  except ValueError as e:
    sys.exit(f"m4moe-analyze-routing: error: {e}")
  languages = list(comparison.order_languages(
      {lang: sizes.get(lang) for lang in languages}))
  out = pathlib.Path(_OUTPUT_DIR.value)
  if out.exists() and not out.is_dir():
    raise app.UsageError(f"--output_dir={out} is a file; pass a directory")
  try:
    counts, tokens, pairs, cut = _analyse(files, languages,
                                          files.source_vocab.parent)
  except (routing_capture.CaptureError, ValueError) as e:
    sys.exit(f"m4moe-analyze-routing: error: {e}")
  except tf.errors.OpError as e:  # e.g. a malformed TSV line
    sys.exit(f"m4moe-analyze-routing: error reading {corpus}/{_SPLIT.value}: "
             f"{_op_message(e.message)}")
  layers = {name: routing_analysis.layer_statistics(
      counts[name], tokens[name], languages=languages) for name in counts}
  document = {
      "model_dir": str(files.model_dir), "checkpoint": files.checkpoint,
      "corpus_dir": str(corpus), "split": _SPLIT.value,
      "direction": _DIRECTION.value, "router": files.config.moe.router,
      "languages": languages,
      # Requested but without a pair in the split: no row, said here.
      "empty_languages": empty,
      "train_pairs": {l: sizes.get(l) for l in languages},
      "pairs": pairs, "truncated_pairs": cut,
      "counts": {name: counts[name].tolist() for name in counts},
      "layers": layers,
  }
  _write_outputs(out, document=document, layers=layers, languages=languages)


def _corpus_languages(corpus: pathlib.Path) -> tuple[list[str], list[str]]:
  """``--languages`` (default: all of the split), checked against the
  corpus: (those with pairs, those without: :func:`with_pairs`).

  Checked before the model is loaded, so a wrong corpus or language fails
  in a second, not after the checkpoint is restored.

  Raises:
    app.UsageError: the split directory or a language's file is missing.
  """
  from m4moe.data import vocab  # pylint: disable=g-import-not-at-top
  if not (corpus / _SPLIT.value).is_dir():
    raise app.UsageError(f"--corpus_dir={corpus} has no {_SPLIT.value}/ "
                         "directory (run m4moe-build-corpus)")
  available = vocab.corpus_languages(corpus, _SPLIT.value)
  languages = list(_LANGUAGES.value) or list(available)
  missing = sorted(set(languages) - set(available))
  if missing:
    raise app.UsageError(
        f"--languages: {', '.join(missing)} has no {corpus}/{_SPLIT.value}/"
        f"<lang>.tsv (available: {', '.join(available) or 'none'})")
  if not languages:
    raise app.UsageError(f"{corpus}/{_SPLIT.value}/ has no <lang>.tsv files")
  return with_pairs(corpus, languages, split=_SPLIT.value)


def _routed_run_files() -> rundir.RunFiles:
  """The run's files, if its model routes per token.

  A dense model has no routing and the expert-choice router no per-token
  choice, so both are refused before any pair is run.

  Raises:
    app.UsageError: the run directory is unusable, dense or expert-choice.
  """
  from m4moe.training import rundir  # pylint: disable=g-import-not-at-top
  try:
    files = rundir.find_run_files(_MODEL_DIR.value,
                                  vocab_dir=_VOCAB_DIR.value)
  except rundir.RunDirError as e:
    raise app.UsageError(str(e)) from e
  if not files.config.moe.enabled:
    raise app.UsageError(f"--model_dir={_MODEL_DIR.value} is a dense model "
                         "(--num_experts=0): there is no routing to analyse")
  if files.config.moe.router == "expert_choice":
    raise app.UsageError(
        "--router=expert_choice has no per-token expert choices (experts "
        "pick tokens); routing by language needs top2, top1 or noisy_topk")
  return files


def _write_outputs(out: pathlib.Path, *, document: dict[str, Any],
                   layers: dict[str, dict[str, Any]],
                   languages: list[str]) -> None:
  """Writes the PNGs, the page and the JSON, and prints each layer's NMI.

  Each file goes through a rename, so a killed run leaves the previous
  file or the new one, never half of one.
  """
  from m4moe.analysis import page as routing_report  # pylint: disable=g-import-not-at-top
  from m4moe.training import checkpointing  # pylint: disable=g-import-not-at-top
  out.mkdir(parents=True, exist_ok=True)
  layer_pngs = {}
  for name, layer in layers.items():
    png = routing_report.png_bytes(
        routing_report.layer_heatmap(name, layer, languages))
    layer_pngs[name] = png
    _write_bytes(out / f"heatmap_{name.replace('/', '_')}.png", png)
  overview_png = routing_report.png_bytes(
      routing_report.overview(layers, languages))
  _write_bytes(out / "overview.png", overview_png)
  _write_bytes(out / "routing.html", routing_report.html_page(
      document, overview_png=overview_png,
      layer_pngs=layer_pngs).encode("utf-8"))
  checkpointing.write_json_atomic(out / "routing.json", document)
  for name, layer in layers.items():
    first = layer["first_choice"]["normalized_mutual_information"]
    print(f"{name}: normalised MI (first choice) "
          f"{'n/a' if first is None else f'{first:.3f}'}")
  print(f"Wrote {out / 'routing.json'}, {out / 'routing.html'} and "
        f"{len(layer_pngs) + 1} PNGs")


def _op_message(message: str) -> str:
  """A TF op error without its graph-node and op decorations."""
  message = re.sub(r"\{\{[^}]*\}\}\s*", "", message)
  return re.sub(r"\s*\[Op:[^\]]*\].*$", "", message).strip()


def _write_bytes(path: pathlib.Path, data: bytes) -> None:
  """Writes via a temp file and a rename (a kill leaves no half file)."""
  tmp = path.with_name(f".{path.name}.tmp")
  tmp.write_bytes(data)
  tmp.replace(path)


def run():
  cli.run_tool(main, module=__name__)


if __name__ == "__main__":
  run()
