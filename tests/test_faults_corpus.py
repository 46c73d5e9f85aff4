"""Corpus builder under faults: every bad input is counted with its file and
the good data around it survives."""

import collections
import json
import os
import pathlib
import signal
import struct
import subprocess
import sys
import threading
import time

import polib
import pytest

from m4moe.data import catalogs
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


def _good_catalog(root: pathlib.Path, locale: str = "fr", name: str = "good.po"
                  ) -> tuple[set[tuple[str, str]], str]:
  """Writes a clean catalog; returns the pairs a build must keep from it and
  their language."""
  sentences = fixtures.english_sentences(6, seed=7)
  fixtures.write_catalog(
      fixtures.make_catalog(locale, sentences, special=False),
      root / locale / "LC_MESSAGES" / name)
  lang = languages.normalize_language(locale)
  return {(s, fixtures.translate(s, locale)) for s in sentences}, lang


@pytest.mark.parametrize("bad", ["xq", "gui", "src", "qpv", "fu", "xq_FR",
                                 "gui@latin"])
def test_unknown_codes_are_not_languages(bad):
  with pytest.raises(languages.UnknownLanguageError, match="ISO 639"):
    languages.normalize_language(bad)


@pytest.mark.parametrize("code,expected", [
    ("ast", "ast"), ("ckb", "ckb"), ("szl", "szl"), ("ger", "de"), ("deu_AT", "de"),
    ("fil_PH", "fil"), ("hsb", "hsb"), ("iw_IL", "he"), ("nor", "nb"),
    ("eng_US", None), ("chi_TW", "zh_Hant"), ("rus", "ru"),
    # ISO 639-3 locales of catalogs in the packaged recipe.
    ("gug", "gug"), ("nan", "nan"), ("cmn_TW", "zh_Hant")])
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
    # Neither the directory nor the Language header is a locale.
    fixtures.write_catalog(
        fixtures.make_catalog(bad, ["Close the window now"], special=False),
        src / bad / "LC_MESSAGES" / "app.po")
  report = _build(tmp_path, [src])
  assert report["counts"]["catalog:unknown_language"] == 2
  listed = _problems(report, "catalog:unknown_language")
  assert {pathlib.Path(w).parts[-3] for w in listed} == {"xq", "gui"}
  assert "directory 'gui' is not a locale" in " ".join(listed.values())
  assert sorted(report["languages"]) == [lang]
  assert _all_pairs(tmp_path / "out", lang) == good


@pytest.mark.parametrize("locale,expected", [
    ("fr_link", "'link' is not an ISO 15924 script code"),
    ("fr_Zzzq", "'Zzzq' is not an ISO 15924 script code"),
    ("de_XY", "'XY' is not an ISO 3166 region"),
    ("es_999", "'999' is not an ISO 3166 region"),
    ("ca_ES_valencja", "'valencja' is not a registered BCP 47 variant"),
    ("pt_B", "'B' is neither a script"),
])
def test_every_subtag_of_a_locale_is_validated(locale, expected):
  with pytest.raises(languages.UnknownLanguageError, match=expected):
    languages.normalize_language(locale)


@pytest.mark.parametrize("locale,expected", [
    ("sr_Latn", "sr_Latn"), ("sr_Latn_RS", "sr_Latn"), ("es_419", "es"),
    ("ca_ES_valencia", "ca"), ("be_tarask", "be"), ("sr_CS", "sr"),
    ("uz_Cyrl_UZ", "uz_Cyrl"), ("zh_Hant_HK", "zh_Hant"), ("pt_BR", "pt"),
    ("de_1996", "de"), ("ku_Arab", "ku_Arab")])
def test_registered_subtags_still_pass(locale, expected):
  assert languages.normalize_language(locale) == expected


def test_a_symlink_that_is_not_a_locale_yields_to_the_language_header(
    tmp_path):
  """``fr_link -> fr``: the catalogs are French (their header says so), not
  a language ``fr_Link``; a link with no usable header is unknown."""
  src = tmp_path / "src"
  src.mkdir()
  good, lang = _good_catalog(tmp_path / "elsewhere")
  (src / "fr_link").symlink_to(tmp_path / "elsewhere" / "fr",
                               target_is_directory=True)
  headless = tmp_path / "headless" / "de" / "LC_MESSAGES"
  fixtures.write_catalog(
      fixtures.make_catalog("Deutsch", ["Close the window now"],
                            special=False), headless / "app.po")
  (src / "de_link").symlink_to(headless.parent, target_is_directory=True)
  report = _build(tmp_path, [src])
  assert sorted(report["languages"]) == ["fr"]  # no "fr_Link"
  assert _all_pairs(tmp_path / "out", lang) == good
  from_header = _problems(report, "catalog:locale_from_header")
  assert list(from_header) == [str(src / "fr_link" / "LC_MESSAGES" /
                                   "good.po")]
  assert "directory 'fr_link' is not a locale" in from_header[
      str(src / "fr_link" / "LC_MESSAGES" / "good.po")]
  assert "Language header 'fr' decides" in " ".join(from_header.values())
  unknown = _problems(report, "catalog:unknown_language")
  assert list(unknown) == [str(src / "de_link" / "LC_MESSAGES" / "app.po")]


def _header(charset: str = "UTF-8", plural: str = "nplurals=2; plural=(n != 1);"
            ) -> str:
  return ('msgid ""\nmsgstr ""\n'
          f'"Content-Type: text/plain; charset={charset}\\n"\n'
          f'"Plural-Forms: {plural}\\n"\n\n')


def test_plural_rule_dividing_by_zero_skips_only_plurals(tmp_path):
  src = tmp_path / "src"
  good, lang = _good_catalog(src)
  po = fixtures.make_catalog("fr", ["Close the current window"],
                             special=False, plural_forms="nplurals=2; "
                             "plural=n/0;")
  po.append(polib.POEntry(msgid="Delete %d selected file",
                          msgid_plural="Delete %d selected files",
                          msgstr_plural={0: "Supprimer %d", 1: "Supprimer %d"}))
  path = fixtures.write_catalog(po, src / "fr" / "LC_MESSAGES" / "div.po")
  # An index outside 0..nplurals-1 is as broken as a crash.
  po.metadata["Plural-Forms"] = "nplurals=2; plural=n;"
  path2 = fixtures.write_catalog(po, src / "fr" / "LC_MESSAGES" / "range.mo")
  report = _build(tmp_path, [src])
  assert report["counts"]["catalog:plural_header_broken"] == 2
  assert report["counts"]["entry:plural_skipped_broken_header"] == 2
  listed = _problems(report, "catalog:plural_header_broken")
  assert "ZeroDivisionError" in listed[str(path)]
  assert "plural(2) = 2" in listed[str(path2)]
  pairs = _all_pairs(tmp_path / "out", lang)
  # Singular entries of the broken catalogs and the good catalog survive.
  assert pairs == good | {("Close the current window", fixtures.translate(
      "Close the current window", "fr"))}


def test_plural_header_repeating_its_name_still_parses(tmp_path):
  # Seen in file-roller's ur.mo: the header name repeated in the value.
  po = fixtures.make_catalog(
      "ur", ["Open the file now"],
      plural_forms="Plural-Forms: nplurals=2; plural=n != 1;")
  path = fixtures.write_catalog(po, tmp_path / "ur" / "LC_MESSAGES" / "a.mo")
  counts, problems = collections.Counter(), []
  pairs = list(catalogs.read_catalog(path, counts=counts, problems=problems))
  assert problems == []
  assert {p.source for p in pairs} >= {"Delete %d selected file",
                                       "Delete %d selected files"}


def _mo_bytes(tmp_path: pathlib.Path, sentences: list[str]) -> bytes:
  po = fixtures.make_catalog("de", sentences, special=False)
  return fixtures.write_catalog(po, tmp_path / "whole.mo").read_bytes()


def test_empty_and_truncated_mo_are_counted_and_salvaged(tmp_path):
  src = tmp_path / "src"
  good, lang = _good_catalog(src)
  sentences = fixtures.english_sentences(8, seed=11)
  data = _mo_bytes(tmp_path, sentences)
  n, o_off, t_off = struct.unpack_from("<3I", data, 8)
  assert n == len(sentences) + 1  # + header entry
  strings_end = max(struct.unpack_from("<2I", data, t_off + 8 * i)[1] +
                    struct.unpack_from("<2I", data, t_off + 8 * i)[0]
                    for i in range(n))
  de = src / "de" / "LC_MESSAGES"
  de.mkdir(parents=True)
  (de / "empty.mo").write_bytes(b"")
  (de / "mid_table.mo").write_bytes(data[:o_off + 8 * 3 + 4])
  (de / "mid_strings.mo").write_bytes(data[:strings_end - 3])
  report = _build(tmp_path, [src])
  counts = report["counts"]
  assert counts["catalog:unreadable"] == 1
  assert "empty .mo" in _problems(report, "catalog:unreadable")[
      str(de / "empty.mo")]
  assert counts["catalog:mo_truncated"] == 2
  truncated = _problems(report, "catalog:mo_truncated")
  assert f"{n} of {n} table entries" in truncated[str(de / "mid_table.mo")]
  assert f"1 of {n} table entries" in truncated[str(de / "mid_strings.mo")]
  assert counts["entry:mo_out_of_bounds"] == n + 1
  # The good fr catalog survives; from the string-truncated .mo every entry
  # but the cut one is kept, unmangled.
  assert _all_pairs(tmp_path / "out", lang) == good
  de_pairs = _all_pairs(tmp_path / "out", "de")
  expected = {(s, fixtures.translate(s, "de")) for s in sentences}
  assert len(de_pairs) == len(sentences) - 1 and de_pairs < expected


def test_corrupt_mo_offsets_point_outside_the_file(tmp_path):
  data = bytearray(_mo_bytes(tmp_path, ["Open the new file", "Save it now"]))
  _, _, t_off = struct.unpack_from("<3I", data, 8)
  struct.pack_into("<2I", data, t_off + 8, 5, 10**9)  # first real entry
  path = tmp_path / "de" / "LC_MESSAGES" / "bad.mo"
  path.parent.mkdir(parents=True)
  path.write_bytes(bytes(data))
  counts, problems = collections.Counter(), []
  pairs = list(catalogs.read_catalog(path, counts=counts, problems=problems))
  assert [p.kind for p in problems] == ["catalog:mo_truncated"]
  assert counts["entry:mo_out_of_bounds"] == 1
  assert len(pairs) == 1


def test_any_parser_exception_is_counted_per_file(tmp_path, monkeypatch):
  src = tmp_path / "src"
  good, lang = _good_catalog(src)
  bad = fixtures.write_catalog(
      fixtures.make_catalog("fr", ["Close the window now"], special=False),
      src / "fr" / "LC_MESSAGES" / "zzz.po")
  real = catalogs.load_catalog

  def flaky(path, **kwargs):
    if path.name == "zzz.po":
      raise RuntimeError("parser bug")
    return real(path, **kwargs)
  monkeypatch.setattr(catalogs, "load_catalog", flaky)
  report = _build(tmp_path, [src])
  assert report["counts"]["catalog:parser_error"] == 1
  assert _problems(report, "catalog:parser_error") == {
      str(bad): "RuntimeError: parser bug"}
  assert _all_pairs(tmp_path / "out", lang) == good


def test_unterminated_po_string_drops_only_its_entry(tmp_path):
  src = tmp_path / "src"
  path = src / "fr" / "LC_MESSAGES" / "app.po"
  path.parent.mkdir(parents=True)
  path.write_text(
      _header() +
      '#: a.c:1\nmsgid "Open the file now"\nmsgstr "Ouvrir le fichier\n\n'
      'msgid ""\n"Save the file now"\nmsgstr "Enregistrer le fichier"\n\n'
      'msgctxt "menu\nmsgid "Close all windows"\nmsgstr "Fermer tout"\n\n'
      'msgid "Print the page"\nmsgstr "Imprimer la \\"page\\""\n',
      encoding="utf-8")
  report = _build(tmp_path, [src])
  assert report["counts"]["catalog:po_unterminated_string"] == 1
  assert report["counts"]["entry:po_syntax"] == 2
  assert "line 8, 14" in _problems(
      report, "catalog:po_unterminated_string")[str(path)]
  assert _all_pairs(tmp_path / "out", "fr") == {
      ("Save the file now", "Enregistrer le fichier"),
      ("Print the page", 'Imprimer la "page"')}
  # polib alone would have kept a mangled pair ("... le fichie").
  assert ("Open the file now", "Ouvrir le fichie") in {
      (e.msgid, e.msgstr) for e in polib.pofile(str(path))}


def test_unterminated_string_in_header_rejects_catalog(tmp_path):
  path = tmp_path / "fr.po"
  path.write_text('msgid ""\nmsgstr ""\n"Content-Type: text/plain; '
                  'charset=UTF-8\\n\n\nmsgid "Open it now"\nmsgstr "Ouvrir"\n')
  with pytest.raises(catalogs.CatalogError, match=r"fr.po.*header.*line 3"):
    list(catalogs.read_catalog(path, counts=collections.Counter()))


def test_mojibake_entries_are_dropped_genuine_latin1_kept(tmp_path):
  src = tmp_path / "src"
  path = src / "fr" / "LC_MESSAGES" / "app.po"
  path.parent.mkdir(parents=True)
  path.write_bytes(
      _header("ISO-8859-1").encode("ascii") +
      'msgid "Open the file now"\nmsgstr "Ouvrir le fichier créé"\n\n'
      'msgid "Save the file now"\nmsgstr "Enregistrer à nouveau"\n\n'
      .encode("utf-8") +
      'msgid "Close the window now"\nmsgstr "Fermer la fenêtre"\n\n'
      'msgid "Print the page now"\nmsgstr "Imprimer la page"\n'
      .encode("latin-1"))
  polib.pofile(str(path)).save_as_mofile(str(path.with_name("other.mo")))
  report = _build(tmp_path, [src, path.with_name("other.mo")])
  # The .po and the .mo compiled from it each have 2 UTF-8 entries.
  assert report["counts"]["entry:mojibake"] == 4
  listed = _problems(report, "catalog:mojibake")
  assert "iso-8859-1" in listed[str(path)] and len(listed) == 2
  pairs = _all_pairs(tmp_path / "out", "fr")
  assert pairs == {("Close the window now", "Fermer la fenêtre"),
                   ("Print the page now", "Imprimer la page")}
  assert not any("Ã" in target for _, target in pairs)


def test_symlinks_followed_once_loops_and_dangling_counted(tmp_path):
  src = tmp_path / "src"
  good, lang = _good_catalog(tmp_path / "shared")
  src.mkdir()
  (src / "fr").symlink_to(tmp_path / "shared" / "fr")  # followed
  (src / "zz_fr").symlink_to(tmp_path / "shared" / "fr")  # same dir again
  (src / "fr_copy.po").symlink_to(
      tmp_path / "shared" / "fr" / "LC_MESSAGES" / "good.po")  # same file
  (src / "loop").symlink_to(src)  # points back at its parent
  (src / "a.po").symlink_to(src / "b.po")  # links pointing at each other
  (src / "b.po").symlink_to(src / "a.po")
  (src / "gone.mo").symlink_to(tmp_path / "nowhere.mo")
  report = _build(tmp_path, [src, src / "fr" / "LC_MESSAGES" / "good.po"])
  counts = report["counts"]
  assert counts["catalog:files"] == 1  # each real file read once
  assert counts["source:duplicate_path"] == 3
  assert counts["source:symlink_loop"] == 3  # loop, a.po, b.po
  assert counts["source:dangling_symlink"] == 1
  assert str(src / "gone.mo") in _problems(report,
                                           "source:dangling_symlink")
  assert str(src / "loop") in _problems(report, "source:symlink_loop")
  assert _all_pairs(tmp_path / "out", lang) == good


def test_tsv_undecodable_line_keeps_the_others(tmp_path):
  tsv = tmp_path / "extra.tsv"
  tsv.write_bytes("de\tSave the file now\tDatei jetzt speichern\n".encode() +
                  b"de\tOpen the file now\tDatei \xff\xfe \xf6ffnen\n" +
                  "de\tClose the window now\tFenster schließen\r\n".encode())
  report = _build(tmp_path, [tsv])
  assert report["counts"]["tsv:undecodable_line"] == 1
  assert list(_problems(report, "tsv:undecodable_line")) == [f"{tsv}:2"]
  assert _all_pairs(tmp_path / "out", "de") == {
      ("Save the file now", "Datei jetzt speichern"),
      ("Close the window now", "Fenster schließen")}


def _tree(root: pathlib.Path) -> dict[str, bytes]:
  return {str(p.relative_to(root)): p.read_bytes()
          for p in sorted(root.rglob("*")) if p.is_file()}


def test_output_dir_that_is_not_a_corpus_is_never_emptied(tmp_path,
                                                          monkeypatch):
  src = tmp_path / "src"
  _good_catalog(src)
  notes = tmp_path / "notes"
  notes.mkdir()
  (notes / "thesis.txt").write_text("months of work")
  config = dict(cache_dir=tmp_path / "cache", sources=(src,), workers=1,
                split_keys=None)
  before = _tree(tmp_path)
  for out, message in [
      (notes, "not a corpus this builder wrote"),
      (src, "holds --sources"),
      (tmp_path, "holds --sources"),
      (src / "fr" / "LC_MESSAGES" / "good.po", "not a directory")]:
    with pytest.raises(corpus.OutputDirError, match=message):
      corpus.build_corpus(corpus.BuildConfig(output_dir=out, **config))
  monkeypatch.chdir(notes)
  with pytest.raises(corpus.OutputDirError, match="working directory"):
    corpus.build_corpus(corpus.BuildConfig(output_dir=pathlib.Path("."),
                                           overwrite=True, **config))
  with pytest.raises(corpus.OutputDirError, match="holds --sources"):
    corpus.build_corpus(corpus.BuildConfig(output_dir=src, overwrite=True,
                                           **config))
  monkeypatch.chdir(tmp_path)
  assert _tree(tmp_path) == before  # nothing read, written or deleted
  # --overwrite is the user's explicit consent for a non-corpus directory.
  report = corpus.build_corpus(corpus.BuildConfig(
      output_dir=notes, overwrite=True, **config))
  assert report["summary"]["languages"] == 1
  assert not (notes / "thesis.txt").exists()


def test_previous_corpus_is_rebuilt_unless_it_gained_files(tmp_path):
  src = tmp_path / "src"
  good, lang = _good_catalog(src)
  out = tmp_path / "out"
  _build(tmp_path, [src])
  marker = json.loads((out / corpus.MARKER).read_text())
  assert sorted(marker["files"]) == sorted(
      f for f in _tree(out) if f != corpus.MARKER)
  _build(tmp_path, [src])  # a corpus this builder wrote: rebuilt
  assert _all_pairs(out, lang) == good
  (out / "my_vocab.model").write_text("not ours")
  with pytest.raises(corpus.OutputDirError, match="my_vocab.model"):
    _build(tmp_path, [src])
  assert (out / "my_vocab.model").exists()
  # A corpus from before the marker (only our files) is recognised too.
  (out / "my_vocab.model").unlink()
  (out / corpus.MARKER).unlink()
  _build(tmp_path, [src])
  assert (out / corpus.MARKER).exists()
  # Someone else's temporary-looking directory is not deleted.
  foreign = tmp_path / ".out.tmp-foreign"
  foreign.mkdir()
  (foreign / "keep.txt").write_text("x")
  _build(tmp_path, [src])
  assert (foreign / "keep.txt").exists()


def _children(pid: int) -> set[int]:
  """Live (non-zombie) processes whose parent is ``pid``."""
  out = set()
  for stat_file in pathlib.Path("/proc").glob("[0-9]*/stat"):
    try:
      fields = stat_file.read_text().rsplit(")", 1)[1].split()
    except OSError:
      continue
    if int(fields[1]) == pid and fields[0] != "Z":
      out.add(int(stat_file.parent.name))
  return out


def _alive(pids: set[int]) -> set[int]:
  alive = set()
  for pid in pids:
    try:
      state = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(
          ")", 1)[1].split()[0]
    except OSError:
      continue
    if state != "Z":
      alive.add(pid)
  return alive


def _wait_for(predicate, timeout: float = 60.0):
  """Polls ``predicate`` until it returns something true; returns that."""
  deadline = time.monotonic() + timeout
  while time.monotonic() < deadline:
    value = predicate()
    if value:
      return value
    time.sleep(0.1)
  return predicate()


def _start_blocked_build(tmp_path: pathlib.Path):
  """A builder whose two workers block reading FIFO catalogs (no writer:
  opening one for reading waits forever)."""
  src = tmp_path / "src"
  _good_catalog(src)
  fifos = []
  for i in range(20):
    fifo = tmp_path / "pipes" / f"fr_{i:02d}.mo"
    fifo.parent.mkdir(exist_ok=True)
    os.mkfifo(fifo)
    fifos.append(str(fifo))
  # Output to files, not pipes: surviving workers would hold pipes open.
  with open(tmp_path / "stdout", "w") as out, open(tmp_path / "stderr",
                                                    "w") as err:
    proc = subprocess.Popen(
        [sys.executable, "-m", "m4moe.cli.build_corpus", "--norecipe",
         f"--sources={src},{','.join(fifos)}",
         f"--output_dir={tmp_path / 'out'}", "--split_keys=", "--workers=2"],
        stdout=out, stderr=err)
  workers = _wait_for(lambda: len(_children(proc.pid)) >= 2 and
                      _children(proc.pid)) or set()
  return proc, workers


def _reap(proc: subprocess.Popen, workers: set[int]) -> None:
  """Ends what the test started, whatever happened."""
  for pid in _alive(workers):
    os.kill(pid, signal.SIGKILL)
  if proc.poll() is None:
    proc.kill()
  proc.wait()


@pytest.mark.skipif(not sys.platform.startswith("linux"),
                    reason="PR_SET_PDEATHSIG is Linux-only")
def test_workers_die_with_a_killed_builder(tmp_path):
  proc, workers = _start_blocked_build(tmp_path)
  try:
    assert len(workers) >= 2, (tmp_path / "stderr").read_text()
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    _wait_for(lambda: not _alive(workers), timeout=10)
    assert _alive(workers) == set()
  finally:
    _reap(proc, workers)


def test_sigterm_stops_builder_and_workers_keeps_previous_output(tmp_path):
  good, lang = _good_catalog(tmp_path / "src")
  _build(tmp_path, [tmp_path / "src"])
  before = _tree(tmp_path / "out")
  proc, workers = _start_blocked_build(tmp_path)
  try:
    assert len(workers) >= 2, (tmp_path / "stderr").read_text()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 1
    stderr = (tmp_path / "stderr").read_text()
    assert "stopped by SIGTERM" in stderr and "Traceback" not in stderr
    assert _wait_for(lambda: not _alive(workers), timeout=10)
    assert _tree(tmp_path / "out") == before
    assert _all_pairs(tmp_path / "out", lang) == good
    assert not list(tmp_path.glob(".out.tmp-*"))
  finally:
    _reap(proc, workers)


def test_cli_refuses_foreign_output_dir_with_a_usage_error(tmp_path):
  src = tmp_path / "src"
  _good_catalog(src)
  (tmp_path / "keep.txt").write_text("mine")
  base = [sys.executable, "-m", "m4moe.cli.build_corpus", "--norecipe",
          f"--sources={src}", "--split_keys=", "--workers=1"]
  proc = subprocess.run(base + ["--output_dir=."], cwd=tmp_path,
                        capture_output=True, text=True, timeout=120,
                        check=False)
  assert proc.returncode != 0
  assert "--output_dir=. holds --sources" in proc.stderr
  assert "Traceback" not in proc.stderr
  other = tmp_path / "other"
  other.mkdir()
  (other / "data.csv").write_text("1,2\n")
  proc = subprocess.run(base + [f"--output_dir={other}"], capture_output=True,
                        text=True, timeout=120, check=False)
  assert proc.returncode != 0 and "pass --overwrite" in proc.stderr
  assert (other / "data.csv").read_text() == "1,2\n"
  bad_keys = tmp_path / "keys.txt"
  bad_keys.write_text("dev\t0123456789ab\ntest\tnot-a-key\n")
  proc = subprocess.run(
      base[:-2] + [f"--split_keys={bad_keys}", "--workers=1",
                   f"--output_dir={tmp_path / 'new'}"],
      capture_output=True, text=True, timeout=120, check=False)
  assert proc.returncode != 0 and f"{bad_keys}:2" in proc.stderr
  assert "Traceback" not in proc.stderr and not (tmp_path / "new").exists()
  assert (tmp_path / "keep.txt").read_text() == "mine"
  empty = src / "de" / "LC_MESSAGES" / "empty.mo"
  empty.parent.mkdir(parents=True)
  empty.write_bytes(b"")
  proc = subprocess.run(base + [f"--output_dir={other}", "--overwrite"],
                        capture_output=True, text=True, timeout=120,
                        check=False)
  assert proc.returncode == 0, proc.stderr
  printed = json.loads(proc.stdout[:proc.stdout.rindex("}") + 1])
  assert printed["summary"]["languages"] == 1
  # The bad catalog is named in the printed summary, not only in the report.
  assert printed["counts"]["catalog:unreadable"] == 1
  assert [p["where"] for p in printed["problems"]] == [str(empty)]
  assert printed["problems_not_printed"] == 0


def test_a_catalog_killing_its_worker_costs_only_that_catalog(tmp_path,
                                                              monkeypatch):
  src = tmp_path / "src"
  sentences = fixtures.english_sentences(40, seed=3)
  for i in range(20):  # several chunks, so crashes hit neighbours too
    fixtures.write_catalog(
        fixtures.make_catalog("fr", sentences[2 * i:2 * i + 2],
                              special=False),
        src / "fr" / "LC_MESSAGES" / f"app{i:02d}.po")
  crash = src / "fr" / "LC_MESSAGES" / "app07.po"
  real = catalogs.load_catalog

  def dies_on_app07(path, **kwargs):
    if path.name == "app07.po":
      os._exit(3)  # a segfault or the OOM killer, as the pool sees it
    return real(path, **kwargs)
  # Workers are forked after this, so they inherit the patch.
  monkeypatch.setattr(catalogs, "load_catalog", dies_on_app07)
  report = corpus.build_corpus(corpus.BuildConfig(
      output_dir=tmp_path / "out", cache_dir=tmp_path / "cache",
      sources=(src,), workers=2, split_keys=None))
  assert report["counts"]["catalog:worker_crashed"] == 1
  assert list(_problems(report, "catalog:worker_crashed")) == [str(crash)]
  expected = {(s, fixtures.translate(s, "fr")) for s in sentences
              if s not in sentences[14:16]}
  assert _all_pairs(tmp_path / "out", "fr") == expected


def test_kill_between_the_renames_restores_the_previous_output(tmp_path):
  good, lang = _good_catalog(tmp_path / "src")
  _build(tmp_path, [tmp_path / "src"])
  before = _tree(tmp_path / "out")
  # What a SIGKILL after "out -> .out.old-<pid>" and before "tmp -> out"
  # leaves: the previous corpus under its old- name, the new one half-built.
  (tmp_path / "out").rename(tmp_path / ".out.old-12345")
  (tmp_path / ".out.tmp-abc").mkdir()
  (tmp_path / ".out.tmp-abc" / corpus.MARKER).write_text("{}")
  corpus._remove_stale_temporaries((tmp_path / "out").resolve())  # pylint: disable=protected-access
  assert _tree(tmp_path / "out") == before
  assert not (tmp_path / ".out.tmp-abc").exists()
  assert not (tmp_path / ".out.old-12345").exists()
  assert _all_pairs(tmp_path / "out", lang) == good


@pytest.mark.parametrize("locale,charset,translations", [
    # Genuine legacy text whose bytes happen to be valid UTF-8 too (from
    # vim's catalogs): read as UTF-8 they would be foreign-script letters.
    ("zh_CN", "GB2312", ["Diff 模式", "同 -r"]),
    ("ja", "EUC-JP", ["反転", "[無名]"]),
    ("uk", "CP1251", ["Ні"]),
    ("nn", "ISO-8859-1", ["Fann «~%c» utan", "Lagra på nytt"]),
])
def test_legacy_charsets_that_look_like_utf8_are_kept(tmp_path, locale,
                                                      charset, translations):
  for text in translations[:2]:
    if locale != "nn":  # the nn strings are the control: not valid UTF-8
      text.encode(charset).decode("utf-8")
  po = polib.POFile(encoding=charset)
  po.metadata = {"Content-Type": f"text/plain; charset={charset}"}
  for i, text in enumerate(translations):
    po.append(polib.POEntry(msgid=f"String number {i}", msgstr=text))
  path = tmp_path / locale / "LC_MESSAGES" / "vim.mo"
  path.parent.mkdir(parents=True)
  po.save_as_mofile(str(path))
  counts, problems = collections.Counter(), []
  pairs = list(catalogs.read_catalog(path, counts=counts, problems=problems))
  assert problems == [] and counts["entry:mojibake"] == 0
  assert [p.target for p in pairs] == translations


def _blocked_signals(_):
  return sorted(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, []))


def test_signal_during_worker_fork_is_delivered_after_it():
  # A SIGTERM that lands while ProcessPoolExecutor forks used to run its
  # raising handler inside os.fork's at-fork callbacks, where Python prints
  # "Exception ignored" and drops it: the build ran on. The pool now holds
  # the signals over the fork and they arrive right after it.
  from m4moe.data import worker_pool  # pylint: disable=g-import-not-at-top
  seen = []
  previous = signal.signal(signal.SIGHUP, lambda signum, frame: seen.append(
      signum))
  try:
    with worker_pool._signals_held():  # pylint: disable=protected-access
      # To this thread, the one that holds the signals: a process-directed
      # os.kill may be taken by another thread (the suite has TensorFlow's
      # threads running), whose mask does not hold it.
      signal.pthread_kill(threading.get_ident(), signal.SIGHUP)
      assert not seen, "the held signal ran inside the block"
    assert seen == [signal.SIGHUP]
  finally:
    signal.signal(signal.SIGHUP, previous)
  assert signal.SIGHUP not in signal.pthread_sigmask(signal.SIG_BLOCK, [])
  # Workers forked while the signals were held take them back at start, so
  # terminate() (SIGTERM) still ends them.
  with worker_pool.WorkerPool(workers=2, chunksize=1) as pool:
    masks = list(pool.map(_blocked_signals, [0, 1],
                          on_crash=lambda item, reason: None))
  held = {int(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
  assert masks and all(not held & set(m) for m in masks), masks
