"""Corpus builder under faults: every bad input is counted with its file and
the good data around it survives (issue 14)."""

import pathlib

import pytest

from m4moe.data import corpus
from m4moe.data import fixtures
from m4moe.data import iso639
from m4moe.data import languages


def _build(tmp_path: pathlib.Path, srcs, **kwargs) -> dict:
  config = corpus.BuildConfig(output_dir=tmp_path / "out",
                              cache_dir=tmp_path / "cache",
                              sources=tuple(srcs), workers=1,
                              split_keys=None, **kwargs)
  return corpus.build_corpus(config)


def _problems(report: dict, kind: str) -> dict[str, str]:
  """where -> reason of the listed problems of ``kind``."""
  return {p["where"]: p["reason"] for p in report["problems"]
          if p["kind"] == kind}


def _all_pairs(out: pathlib.Path, lang: str) -> set[tuple[str, str]]:
  pairs = set()
  for name in ("train", "dev", "test"):
    path = out / name / f"{lang}.tsv"
    if path.exists():
      pairs.update(tuple(l.split("\t"))
                   for l in path.read_text("utf-8").splitlines())
  return pairs


def _good_catalog(root: pathlib.Path, locale: str = "fr",
                  name: str = "good.po") -> set[tuple[str, str]]:
  """Writes a clean catalog; returns the pairs a build must keep from it."""
  sentences = fixtures.english_sentences(6, seed=7)
  fixtures.write_catalog(
      fixtures.make_catalog(locale, sentences, special=False),
      root / locale / "LC_MESSAGES" / name)
  lang = languages.normalize_language(locale)
  return {(s, fixtures.translate(s, locale)) for s in sentences}, lang


@pytest.mark.parametrize("bad", ["xq", "gui", "src", "qaa", "xx_YY"])
def test_unknown_codes_are_not_languages(bad):
  with pytest.raises(languages.UnknownLanguageError, match="ISO 639"):
    if languages.normalize_language(bad) is None:  # pseudo-locale
      raise languages.UnknownLanguageError("ISO 639")


@pytest.mark.parametrize("code,expected", [
    ("ast", "ast"), ("ckb", "ckb"), ("szl", "szl"), ("ger", "de"), ("deu_AT", "de"),
    ("fil_PH", "fil"), ("hsb", "hsb"), ("iw_IL", "he"), ("nor", "nb"),
    ("eng_US", None), ("chi_TW", "zh_Hant"), ("rus", "ru")])
def test_known_iso639_codes_are_languages(code, expected):
  assert languages.normalize_language(code) == expected


def test_iso639_tables_are_consistent():
  assert len(iso639.ISO_639_1) == 184
  assert all(len(c) == 2 for c in iso639.ISO_639_1)
  assert all(len(c) == 3 for c in iso639.ISO_639_2 | iso639.LOCALISATION_EXTRAS)
  assert not {"mis", "mul", "und", "zxx"} & iso639.CODES
  assert not iso639.LOCALISATION_EXTRAS & iso639.ISO_639_2


def test_unknown_language_directories_are_counted(tmp_path):
  src = tmp_path / "src"
  good, lang = _good_catalog(src)
  for bad in ("xq", "gui"):
    fixtures.write_catalog(
        fixtures.make_catalog("fr", ["Close the window now"], special=False),
        src / bad / "LC_MESSAGES" / "app.po")
  report = _build(tmp_path, [src])
  assert report["counts"]["catalog:unknown_language"] == 2
  listed = _problems(report, "catalog:unknown_language")
  assert {pathlib.Path(w).parts[-3] for w in listed} == {"xq", "gui"}
  assert sorted(report["languages"]) == [lang]
  assert _all_pairs(tmp_path / "out", lang) == good
