"""Test splits of a built corpus and per-language training sizes.

A corpus written by ``m4moe.data.corpus`` holds ``<split>/<lang>.tsv`` files
of ``english<TAB>x`` lines and a ``report.json`` whose ``languages`` section
gives each language's ``train``/``dev``/``test`` pair counts. Direction
``xx_en`` (the paper's X->English) translates the x column into English;
``en_xx`` the reverse.
"""

from __future__ import annotations

import dataclasses
import pathlib
from typing import Sequence

from m4moe import jsonfile

DIRECTIONS = ("xx_en", "en_xx")
ENGLISH = "en"


@dataclasses.dataclass(frozen=True, kw_only=True)
class TestSet:
  """One language pair's test sentences.

  Attributes:
    language: the non-English language.
    source_lang, target_lang: translation direction.
    sources: source sentences.
    references: one reference per source.
    path: the file read (None for in-memory sets).
  """

  language: str
  source_lang: str
  target_lang: str
  sources: tuple[str, ...]
  references: tuple[str, ...]
  path: str | None = None

  def __post_init__(self) -> None:
    if len(self.sources) != len(self.references):
      raise ValueError(f"{self.path or self.language}: {len(self.sources)} "
                       f"sources but {len(self.references)} references")


def read_pairs(path: pathlib.Path) -> list[tuple[str, str]]:
  """``(english, x)`` pairs of a TSV file.

  Raises:
    ValueError: a line is not valid UTF-8 or has no tab (names the line).
  """
  pairs = []
  with open(path, "rb") as f:
    for number, raw in enumerate(f, start=1):
      try:
        line = raw.decode("utf-8").rstrip("\n")
      except UnicodeDecodeError as e:
        raise ValueError(f"{path}:{number}: invalid UTF-8 ({e})") from e
      if not line:
        continue
      english, tab, other = line.partition("\t")
      if not tab:
        raise ValueError(f"{path}:{number}: expected 'english<TAB>x'")
      pairs.append((english, other))
  return pairs


def load_testsets(corpus_dir: str | pathlib.Path, *, split: str = "test",
                  langs: Sequence[str] = (),
                  direction: str = "xx_en") -> list[TestSet]:
  """Per-language test sets; a requested language without a file is empty.

  Args:
    corpus_dir: a built corpus directory.
    split: ``test`` or ``dev``.
    langs: languages to load (default: every ``<split>/*.tsv``).
    direction: ``xx_en`` or ``en_xx``.
  """
  if direction not in DIRECTIONS:
    raise ValueError(f"--direction={direction!r}: use one of "
                     f"{', '.join(DIRECTIONS)}")
  root = pathlib.Path(corpus_dir) / split
  if not langs and not root.is_dir():
    raise ValueError(f"{root} does not exist: is --corpus_dir a corpus "
                     "built by m4moe-build-corpus?")
  langs = list(langs) or sorted(p.stem for p in root.glob("*.tsv"))
  out = []
  for lang in langs:
    path = root / f"{lang}.tsv"
    pairs = read_pairs(path) if path.exists() else []
    english = tuple(p[0] for p in pairs)
    other = tuple(p[1] for p in pairs)
    if direction == "xx_en":
      src, tgt, sources, refs = lang, ENGLISH, other, english
    else:
      src, tgt, sources, refs = ENGLISH, lang, english, other
    out.append(TestSet(language=lang, source_lang=src, target_lang=tgt,
                       sources=sources, references=refs, path=str(path)))
  return out


def train_sizes(corpus_dir: str | pathlib.Path) -> dict[str, int]:
  """Training pairs per language: the build report, else counted lines."""
  corpus_dir = pathlib.Path(corpus_dir)
  report = corpus_dir / "report.json"
  if report.is_file():
    data = jsonfile.load(report, what="the corpus build report",
                         fix="rebuild the corpus with m4moe-build-corpus "
                         "(it writes report.json atomically)")
    languages = data.get("languages", {})
    if languages:
      return {lang: int(c.get("train", 0)) for lang, c in languages.items()}
  sizes = {}
  for path in sorted((corpus_dir / "train").glob("*.tsv")):
    with open(path, "rb") as f:
      sizes[path.stem] = sum(1 for line in f if line.strip())
  return sizes
