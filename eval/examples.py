"""Decoded test sentences of each evaluated run, and the report's examples.

``m4moe-eval --hypotheses_dir=DIR`` writes ``DIR/<lang>.hyp``: one line per
test sentence, in the order of the first ``num_segments`` lines of the
corpus's ``<split>/<lang>.tsv`` (``english<TAB>x``; the split scored is the
eval JSON's ``metadata.split``, ``test`` by default, or ``test_ood``); the
eval JSON records DIR as ``metadata.hypotheses_dir``.
:func:`load_run_outputs` finds a run's directory
(:func:`find_hypotheses_dir`: an explicit one, else
``metadata.hypotheses_dir``, else beside the eval JSON) and pairs each language's
hypotheses with its sources and references, read by
:func:`m4moe.eval.testsets.load_testsets` from the corpus (``corpus_dir``,
else ``metadata.corpus_dir``) in the eval's ``metadata.direction``
(``xx_en`` by default: source = the x column, reference = the English
column).

A language is only used when it can be trusted to be what m4moe-eval
scored: its ``.hyp`` file has exactly ``num_segments`` lines, the test file
has at least that many, and rescoring the hypotheses against those
references gives the eval JSON's BLEU (within 0.01). Every other language,
and every run without hypotheses, carries the reason, which the report
lists.

:func:`build_examples` then takes, per language, the first N test sentences
with every run's hypothesis.
"""

from __future__ import annotations

import dataclasses
import functools
import pathlib
from typing import Any, Mapping, Sequence

from m4moe.eval import results
from m4moe.eval import scoring
from m4moe.eval import testsets

RESCORE_TOLERANCE = 0.01  # BLEU points


@dataclasses.dataclass(frozen=True, kw_only=True)
class LanguageOutputs:
  """One run's decoded test sentences of one language.

  Attributes:
    language: the non-English language.
    source_lang, target_lang: the direction scored.
    sources, references, hypotheses: one per test sentence, same order.
  """

  language: str
  source_lang: str
  target_lang: str
  sources: tuple[str, ...]
  references: tuple[str, ...]
  hypotheses: tuple[str, ...]


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunOutputs:
  """One eval run's decoded test sentences.

  Attributes:
    label: the run's display name (model, or ``model (seed S)``).
    hypotheses_dir: where its ``.hyp`` files were looked for (None: nowhere).
    languages: language -> its outputs, for the usable languages.
    problems: language -> why it is not usable (a scored language only).
    missing: why the run has no outputs at all (None if it has a dir).
  """

  label: str
  hypotheses_dir: pathlib.Path | None
  languages: Mapping[str, LanguageOutputs]
  problems: Mapping[str, str]
  missing: str | None = None


def find_hypotheses_dir(result: results.EvalResult, *,
                        eval_path: pathlib.Path | None = None,
                        explicit: str | pathlib.Path | None = None
                        ) -> tuple[pathlib.Path | None, str | None]:
  """(directory, None) or (None, why there is none).

  In order: ``explicit``; the eval JSON's ``metadata.hypotheses_dir``;
  beside the eval JSON, a directory named like the file (``eval/run.json``
  and ``eval/run/``: what m4moe-run writes and landed results keep, so a
  recorded path from another machine is not needed), then one named like
  the model. The report rescores what it finds against the eval JSON, so
  a wrong directory is refused there, not used.
  """
  if explicit is not None:
    path = pathlib.Path(explicit)
    return (path, None) if path.is_dir() else (
        None, f"--hypotheses_dirs: {path} is not a directory")
  recorded = result.metadata.get("hypotheses_dir")
  if recorded and pathlib.Path(recorded).is_dir():
    return pathlib.Path(recorded), None
  beside: list[pathlib.Path] = []
  if eval_path is not None:
    parent = pathlib.Path(eval_path).parent
    beside = list(dict.fromkeys([parent / pathlib.Path(eval_path).stem,
                                 parent / result.model]))
  for path in beside:
    if path.is_dir():
      return path, None
  why = (f"metadata.hypotheses_dir {recorded} does not exist" if recorded
         else "no metadata.hypotheses_dir (evaluated without "
         "--hypotheses_dir?)")
  if beside:
    why += " and no " + " or ".join(f"{p}/" for p in beside)
  return None, why


@functools.lru_cache(maxsize=256)
def _testset(corpus_dir: str, language: str, direction: str,
             split: str = "test") -> testsets.TestSet:
  return testsets.load_testsets(corpus_dir, split=split, langs=[language],
                                direction=direction)[0]


def read_hypotheses(path: pathlib.Path) -> list[str]:
  """Lines of a ``.hyp`` file (an empty line is an empty hypothesis)."""
  text = path.read_text(encoding="utf-8")
  if not text:
    return []
  lines = text.split("\n")
  return lines[:-1] if text.endswith("\n") else lines


def _language_outputs(lang: str, score: scoring.LanguageScore,
                      hyp_dir: pathlib.Path, corpus_dir: str,
                      direction: str, split: str = "test"
                      ) -> LanguageOutputs | str:
  path = hyp_dir / f"{lang}.hyp"
  if not path.is_file():
    return f"no {path}"
  try:
    hyps = read_hypotheses(path)
  except (OSError, UnicodeDecodeError) as e:
    return f"{path} is unreadable ({e})"
  if len(hyps) != score.num_segments:
    return (f"{path} has {len(hyps)} lines but the eval JSON scored "
            f"{score.num_segments} segments")
  try:
    testset = _testset(corpus_dir, lang, direction, split)
  except (OSError, ValueError) as e:
    return f"test set unreadable ({e})"
  if len(testset.sources) < score.num_segments:
    return (f"{testset.path} has {len(testset.sources)} sentences, fewer "
            f"than the {score.num_segments} scored")
  n = score.num_segments
  refs = testset.references[:n]
  rescored = scoring.score_language(hyps, list(refs),
                                    source_lang=testset.source_lang,
                                    target_lang=testset.target_lang).bleu
  rescored = float("nan") if rescored is None else rescored
  if not abs(rescored - score.bleu) <= RESCORE_TOLERANCE:
    return (f"rescoring {path} against {testset.path} gives BLEU "
            f"{rescored:.2f}, the eval JSON says {score.bleu:.2f}: the "
            "corpus or the hypotheses changed since m4moe-eval")
  return LanguageOutputs(language=lang, source_lang=testset.source_lang,
                         target_lang=testset.target_lang,
                         sources=testset.sources[:n], references=refs,
                         hypotheses=tuple(hyps))


def load_run_outputs(result: results.EvalResult, *, label: str,
                     eval_path: pathlib.Path | None = None,
                     corpus_dir: str | pathlib.Path | None = None,
                     hypotheses_dir: str | pathlib.Path | None = None
                     ) -> RunOutputs:
  """Pairs one run's hypotheses with its test sentences, per language.

  Args:
    result: the run's eval result.
    label: display name of the run.
    eval_path: the eval JSON it was read from (for the directory fallback).
    corpus_dir: the corpus m4moe-eval scored (default:
      ``metadata.corpus_dir``).
    hypotheses_dir: overrides where the ``.hyp`` files are.
  """
  hyp_dir, why = find_hypotheses_dir(result, eval_path=eval_path,
                                     explicit=hypotheses_dir)
  if hyp_dir is None:
    return RunOutputs(label=label, hypotheses_dir=None, languages={},
                      problems={}, missing=why)
  corpus = corpus_dir or result.metadata.get("corpus_dir")
  if not corpus:
    return RunOutputs(label=label, hypotheses_dir=hyp_dir, languages={},
                      problems={}, missing="no --corpus_dir and no "
                      "metadata.corpus_dir: references unknown")
  direction = result.metadata.get("direction") or "xx_en"
  split = result.metadata.get("split") or "test"
  languages, problems = {}, {}
  for lang, score in sorted(result.languages.items()):
    if score.status != scoring.STATUS_OK:
      continue
    out = _language_outputs(lang, score, hyp_dir, str(corpus), direction,
                            split)
    if isinstance(out, str):
      problems[lang] = out
    else:
      languages[lang] = out
  return RunOutputs(label=label, hypotheses_dir=hyp_dir, languages=languages,
                    problems=problems)


@dataclasses.dataclass(frozen=True)
class Example:
  """One test sentence: source, reference and each run's hypothesis.

  ``hypotheses`` maps every run label to its output (None: that run has no
  usable outputs for the language).
  """

  source: str
  reference: str
  hypotheses: Mapping[str, str | None]

  def to_dict(self) -> dict[str, Any]:
    return {"source": self.source, "reference": self.reference,
            "hypotheses": dict(self.hypotheses)}


def build_examples(runs: Sequence[RunOutputs], *, languages: Sequence[str],
                   count: int) -> dict[str, list[Example]]:
  """The first ``count`` test sentences per language, with every hypothesis.

  Sources and references come from the first run with outputs for the
  language; another run's hypothesis is shown only if its test sentences
  start with the same ``count`` sources (else None). Languages no run has
  outputs for are left out.
  """
  out: dict[str, list[Example]] = {}
  if count <= 0:
    return out
  for lang in languages:
    have = [r for r in runs if lang in r.languages]
    if not have:
      continue
    first = have[0].languages[lang]
    n = min(count, len(first.sources))
    examples = []
    for i in range(n):
      hyps: dict[str, str | None] = {}
      for run in runs:
        outputs = run.languages.get(lang)
        same = (outputs is not None and len(outputs.sources) > i
                and outputs.sources[i] == first.sources[i]
                and outputs.references[i] == first.references[i])
        hyps[run.label] = outputs.hypotheses[i] if same else None
      examples.append(Example(source=first.sources[i],
                              reference=first.references[i], hypotheses=hyps))
    out[lang] = examples
  return out
