"""Corpus builder: catalogs, cleaning counts, sources, atomic output, split."""

import json
import pathlib
import subprocess
import zipfile

import polib
import pytest

from m4moe.data import catalogs
from m4moe.data import cleaning
from m4moe.data import corpus
from m4moe.data import fixtures
from m4moe.data import languages
from m4moe.data import sources
from m4moe.data import split


def _build(tmp_path, srcs, **kwargs):
  config = corpus.BuildConfig(output_dir=tmp_path / "out",
                              cache_dir=tmp_path / "cache",
                              sources=tuple(srcs), workers=1, **kwargs)
  return corpus.build_corpus(config)


def _tsv_pairs(out: pathlib.Path, name: str, lang: str) -> list[list[str]]:
  path = out / name / f"{lang}.tsv"
  if not path.exists():
    return []
  return [l.split("\t") for l in path.read_text("utf-8").splitlines()]


@pytest.mark.parametrize("locale,expected", [
    ("pt_BR", "pt"), ("zh_CN", "zh_Hans"), ("zh_TW", "zh_Hant"),
    ("zh", "zh_Hans"), ("zh_HK.UTF-8", "zh_Hant"), ("sr@latin", "sr_Latn"),
    ("sr_Latn", "sr_Latn"), ("sr", "sr"), ("sr_RS@ijekavian", "sr"),
    ("ca@valencia", "ca"), ("no", "nb"), ("nb_NO", "nb"), ("de-DE", "de"),
    ("uz@cyrillic", "uz_Cyrl"), ("ast", "ast"), ("en_GB", None),
    ("en@quot", None), ("qps-ploc", None), ("x-test", None), ("C", None),
    ("de@quot", None)])
def test_normalize_language(locale, expected):
  assert languages.normalize_language(locale) == expected


@pytest.mark.parametrize("bad", ["klingon", "1x", "de_DE_x_y_z", ""])
def test_normalize_language_rejects_garbage(bad):
  with pytest.raises(languages.UnknownLanguageError):
    languages.normalize_language(bad)


@pytest.mark.parametrize("source,target,rule", [
    ("Open <i>the</i> file", "Ouvrir <i>le</i> fichier", "markup"),
    ("Copy &amp; paste it", "Copier et coller", "markup"),
    ("Copy %s to %s now", "Copier %s maintenant", "placeholder_mismatch"),
    ("Move %(n)s items now", "Déplacer %(m)s éléments",
     "placeholder_mismatch"),
    ("Show {count} items here", "Afficher {total} éléments",
     "placeholder_mismatch"),
    ("Run $(ARG) now please", "Lancer maintenant", "placeholder_mismatch"),
    ("Page %1 of %2 shown", "Page %1 sur %3", "placeholder_mismatch"),
    ("Same in both languages", "same in BOTH languages", "identical"),
    ("Two words", "Deux mots ici", "too_short"),
    ("Открыть файл сейчас", "Ouvrir le fichier", "source_not_english"),
    ("Open the file now", " \t ", "empty_after_cleaning"),
    ("Open the file now", "(_O)", "empty_after_cleaning"),
])
def test_clean_pair_drop_rules(source, target, rule):
  result = cleaning.clean_pair("fr", source, target,
                               config=cleaning.CleaningConfig())
  assert result.dropped_by == rule


def test_clean_pair_keeps_reordered_positional_placeholders_and_edits():
  config = cleaning.CleaningConfig()
  result = cleaning.clean_pair("de", "Copy %1$s to  %2$s\n", "%2$s: %1$s "
                               "kopieren", config=config)
  assert result.dropped_by is None
  assert result.source == "Copy %1$s to %2$s"
  assert result.edits == ("edit:whitespace_nfc",)
  # NFC: a decomposed e + combining acute becomes one code point.
  result = cleaning.clean_pair("fr", "Open the file now",
                               "Ouvrir le fichie\u0301", config=config)
  assert result.target == "Ouvrir le fichi\u00e9"
  result = cleaning.clean_pair("ja", "_Open the file", "ファイルを開く(_O)",
                               config=config)
  assert (result.source, result.target) == ("Open the file", "ファイルを開く")
  assert "edit:accelerator" in result.edits


def test_placeholder_extraction():
  assert cleaning.placeholders(
      "Copy %1$s to %(dest)s in {0}, {name:>3}, %d, $(ARG), %1, %.2f%%") == [
          "$(ARG)", "%(dest)s", "%.2f", "%1", "%1$s", "%d", "{0}",
          "{name:>3}"]
  assert cleaning.placeholders("Save 50% off now, 100%% sure") == []


def test_script_rule_for_non_latin_languages():
  config = cleaning.CleaningConfig()
  latin_ru = cleaning.clean_pair("ru", "Open the file now", "Otkryt fajl",
                                 config=config)
  assert latin_ru.dropped_by == "wrong_script"
  ok = cleaning.clean_pair("ru", "Open the %s file", "Открыть файл %s",
                           config=config)
  assert ok.dropped_by is None
  latin_de = cleaning.clean_pair("de", "Open the file now", "Datei öffnen",
                                 config=config)
  assert latin_de.dropped_by is None


def test_plural_rule_picks_forms_by_the_catalogs_rule(tmp_path):
  po = polib.POFile()
  # Russian-style rule: n=1 -> form 0, n=2 -> form 1, n=5 -> form 2.
  po.metadata = {"Plural-Forms": (
      "nplurals=3; plural=(n%10==1 && n%100!=11 ? 0 : n%10>=2 && n%10<=4 && "
      "(n%100<10 || n%100>=20) ? 1 : 2);")}
  po.append(polib.POEntry(msgid="%d file", msgid_plural="%d files",
                          msgstr_plural={0: "%d файл", 1: "%d файла",
                                         2: "%d файлов"}))
  path = fixtures.write_catalog(po, tmp_path / "ru" / "LC_MESSAGES" / "a.mo")
  counts = cleaning.new_counter()
  pairs = list(catalogs.read_catalog(path, counts=counts))
  assert [(p.lang, p.source, p.target) for p in pairs] == [
      ("ru", "%d file", "%d файл"), ("ru", "%d files", "%d файла")]


def test_broken_plural_header_skips_plurals_and_names_file(tmp_path):
  po = fixtures.make_catalog("de", ["Open the new file"],
                             plural_forms="nplurals=2; plural=n !=!;")
  path = fixtures.write_catalog(po, tmp_path / "de" / "LC_MESSAGES" / "b.po")
  counts = cleaning.new_counter()
  problems = []
  pairs = list(catalogs.read_catalog(path, counts=counts, problems=problems))
  assert counts["catalog:plural_header_broken"] == 1
  assert [(p.kind, p.where) for p in problems] == [
      ("catalog:plural_header_broken", str(path))]
  assert counts["entry:plural_skipped_broken_header"] == 1
  assert all("selected file" not in p.source for p in pairs)


def _special_tree(root: pathlib.Path) -> list[str]:
  """de (.po) and fr (.mo) catalogs with every special entry."""
  sentences = fixtures.english_sentences(20, seed=1)
  fixtures.write_catalog(fixtures.make_catalog("de", sentences),
                         root / "de" / "LC_MESSAGES" / "app.po")
  # .mo drops fuzzy entries when compiled: the build still must not keep it.
  fixtures.write_catalog(fixtures.make_catalog("pt_BR", sentences),
                         root / "pt_BR" / "LC_MESSAGES" / "app.mo")
  # A second domain repeating the de catalog: every pair is a duplicate.
  fixtures.write_catalog(fixtures.make_catalog("de", sentences, special=False),
                         root / "de" / "LC_MESSAGES" / "other.po")
  fixtures.write_catalog(fixtures.make_catalog("en_GB", sentences),
                         root / "en_GB" / "LC_MESSAGES" / "app.po")
  return sentences


def test_build_counts_every_rule(tmp_path):
  sentences = _special_tree(tmp_path / "src")
  report = _build(tmp_path, [tmp_path / "src"], split_keys=None)
  counts = report["counts"]
  for rule, n in fixtures.SPECIAL_COUNTS.items():
    # de .po has all specials; compiling pt's .mo dropped the fuzzy,
    # obsolete and untranslated entries (as msgfmt does).
    expected = n if rule.startswith("entry:") else 2 * n
    assert counts[rule] == expected, rule
  assert counts["duplicate"] == len(sentences)
  assert counts["catalog:english_or_pseudo_locale"] == 1
  kept = len(sentences) + fixtures.SPECIAL_KEPT
  assert report["summary"]["pairs"] == 2 * kept
  assert sorted(report["languages"]) == ["de", "pt"]
  out = tmp_path / "out"
  all_de = sum((_tsv_pairs(out, s, "de") for s in split.SPLITS), [])
  assert ["Print the current page",
          fixtures.translate("Print the current page", "de")] in all_de


def test_bad_inputs_are_counted_with_file_and_line(tmp_path):
  src = tmp_path / "src"
  fixtures.write_catalog(fixtures.make_catalog("fr", ["Open the file now"]),
                         src / "fr" / "LC_MESSAGES" / "ok.po")
  bad_po = src / "fr" / "LC_MESSAGES" / "corrupt.po"
  bad_po.write_text('msgid "Open"\nmsgstr "Ouvrir"\nthis is not gettext\n')
  (src / "fr" / "LC_MESSAGES" / "corrupt2.mo").write_bytes(b"\x00garbage")
  (src / "fr" / "LC_MESSAGES" / "latin1.po").write_bytes(
      b'msgid ""\nmsgstr ""\n"Content-Type: text/plain; charset=UTF-8\\n"\n\n'
      b'msgid "Open the file now"\nmsgstr "Ouvrir \xff le fichier"\n')
  # A directory that is not a locale and no valid Language header.
  fixtures.write_catalog(fixtures.make_catalog("toolonglang",
                                               ["Close it now"]),
                         src / "toolonglang" / "LC_MESSAGES" / "x.po")
  tsv = tmp_path / "extra.tsv"
  tsv.write_text("de\tSave the file now\tDatei jetzt speichern\n"
                 "de\tonly two fields\n"
                 "klingon\tSave the file now\tx y z\n", encoding="utf-8")
  report = _build(tmp_path, [src, tsv], split_keys=None)
  counts = report["counts"]
  assert counts["catalog:unreadable"] == 3
  assert counts["catalog:unknown_language"] == 1
  assert counts["tsv:bad_line"] == 1
  assert counts["tsv:unknown_language"] == 1
  where = {p["where"] for p in report["problems"]}
  assert str(bad_po) in where and f"{tsv}:2" in where and f"{tsv}:3" in where
  reasons = " ".join(p["reason"] for p in report["problems"])
  assert "line 3" in reasons  # polib names the line of the syntax error.
  assert report["summary"]["languages"] == 2
  # The written report (copied into results/) names them relative to the
  # corpus directory, in the messages too.
  written = (tmp_path / "out" / "report.json").read_text(encoding="utf-8")
  assert str(tmp_path) not in written
  where = {p["where"] for p in json.loads(written)["problems"]}
  assert "../src/fr/LC_MESSAGES/corrupt.po" in where
  assert "../extra.tsv:2" in where


def test_min_pairs_and_language_subset(tmp_path):
  _special_tree(tmp_path / "src")
  report = _build(tmp_path, [tmp_path / "src"], languages=("pt",),
                  split_keys=None)
  assert sorted(report["languages"]) == ["pt"]
  before = (tmp_path / "out" / "train" / "pt.tsv").read_bytes()
  # Every language below --min_pairs: an empty corpus is an error naming
  # them, and the previous corpus stays.
  with pytest.raises(corpus.EmptyCorpusError,
                     match=r"fewer pairs than --min_pairs \(\w+: \d+, \w+: "):
    _build(tmp_path, [tmp_path / "src"], min_pairs=10_000, split_keys=None)
  assert (tmp_path / "out" / "train" / "pt.tsv").read_bytes() == before
  failed = json.loads((tmp_path / "out.failed-report.json").read_text())
  assert failed["summary"]["pairs"] == 0
  assert failed["counts"]["language_below_min_pairs"] == 2


def test_output_is_atomic_and_idempotent(tmp_path, monkeypatch):
  _special_tree(tmp_path / "src")
  first = _build(tmp_path, [tmp_path / "src"], split_keys=None)
  before = {p: p.read_bytes() for p in (tmp_path / "out").rglob("*.tsv")}

  def boom(*args, **kwargs):
    raise KeyboardInterrupt("killed")
  monkeypatch.setattr(corpus, "_write_splits", boom)
  with pytest.raises(KeyboardInterrupt):
    _build(tmp_path, [tmp_path / "src"], split_keys=None)
  monkeypatch.undo()
  after = {p: p.read_bytes() for p in (tmp_path / "out").rglob("*.tsv")}
  assert after == before  # the interrupted build left the old output intact
  assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out.tmp")]
  # A SIGKILLed build cannot clean up: the next build removes its leftovers
  # (recognised by the marker a build writes into its temporary first).
  (tmp_path / ".out.tmp-killed" / "train").mkdir(parents=True)
  (tmp_path / ".out.tmp-killed" / corpus.MARKER).write_text("{}")
  second = _build(tmp_path, [tmp_path / "src"], split_keys=None)
  assert second["languages"] == first["languages"]
  final = {p: p.read_bytes() for p in (tmp_path / "out").rglob("*.tsv")}
  assert final == before
  assert not (tmp_path / ".out.tmp-killed").exists()


def _fake_deb(root: pathlib.Path, name: str, version: str) -> pathlib.Path:
  tree = root / "debtree"
  fixtures.write_catalog(
      fixtures.make_catalog("ru", fixtures.english_sentences(5, seed=3),
                            special=False),
      tree / "usr/share/locale/ru/LC_MESSAGES" / f"{name}.mo")
  (tree / "DEBIAN").mkdir()
  (tree / "DEBIAN" / "control").write_text(
      f"Package: {name}\nVersion: {version}\nArchitecture: all\n"
      "Maintainer: t <t@example.com>\nDescription: test\n")
  deb = root / f"{name}_{version.replace(':', '%3a')}_all.deb"
  subprocess.run(["dpkg-deb", "--build", "--root-owner-group", str(tree),
                  str(deb)], check=True, capture_output=True)
  return deb


def _fake_wheel(path: pathlib.Path) -> pathlib.Path:
  po = fixtures.make_catalog("ja", fixtures.english_sentences(5, seed=4),
                             special=False)
  path.parent.mkdir(parents=True, exist_ok=True)
  with zipfile.ZipFile(path, "w") as zf:
    zf.writestr("pkg/locale/ja/LC_MESSAGES/pkg.po", str(po))
    zf.writestr("pkg/__init__.py", "")
  return path


def test_recipe_with_cached_deb_and_wheel_and_skips(tmp_path):
  cache = tmp_path / "cache"
  recipe = tmp_path / "recipe"
  recipe.mkdir()
  (recipe / "recipe_debian.txt").write_text(
      "# comment\nfake-l10n=1:1.0-1\nnot-cached-pkg=2.0\n")
  (recipe / "recipe_pypi.txt").write_text("fake_wheel==2.0\n")
  (cache / "downloads" / "debian").mkdir(parents=True)
  _fake_deb(cache / "downloads" / "debian", "fake-l10n", "1:1.0-1")
  # The cache holds 1.0 of the wheel although the pin says 2.0: a fallback.
  _fake_wheel(cache / "downloads" / "pypi" / "fake_wheel-1.0-py3-none-any.whl")
  report = corpus.build_corpus(corpus.BuildConfig(
      output_dir=tmp_path / "out", cache_dir=cache, recipe_dir=recipe,
      use_apt=False, workers=1, split_keys=None))
  status = {s["pin"]["name"]: s for s in report["sources"]}
  assert status["fake-l10n"]["status"] == "cached"
  assert status["fake-l10n"]["version_used"] == "1:1.0-1"
  assert status["not-cached-pkg"]["status"] == "skipped"
  assert "disabled" in status["not-cached-pkg"]["reason"]
  assert status["fake_wheel"]["status"] == "fallback"
  assert status["fake_wheel"]["version_used"] == "1.0"
  assert sorted(report["languages"]) == ["ja", "ru"]
  assert report["summary"]["pairs"] == 10


def test_stale_apt_lists_are_refreshed_once_before_a_fallback(tmp_path,
                                                            monkeypatch):
  # The cache holds 1.0 from a build whose apt lists were stale; the pin is
  # 2.0, which apt finds only after apt-get update.
  cache, recipe = tmp_path / "cache", tmp_path / "recipe"
  recipe.mkdir()
  (recipe / "recipe_debian.txt").write_text("fake-l10n=2.0\n")
  (recipe / "recipe_pypi.txt").write_text("")
  (cache / "downloads" / "debian").mkdir(parents=True)
  _fake_deb(cache / "downloads" / "debian", "fake-l10n", "1.0")
  (tmp_path / "mirror").mkdir()
  newer = _fake_deb(tmp_path / "mirror", "fake-l10n", "2.0")
  updates = []

  def fake_command(pin, spec, dest):
    del pin
    if spec.endswith("=2.0") and updates:
      return ["cp", str(newer), str(dest)]
    return ["sh", "-c", "echo \"E: Version '2.0' was not found\" >&2; exit 100"]
  monkeypatch.setattr(sources, "_download_command", fake_command)
  monkeypatch.setattr(sources, "apt_usable", lambda: (True, ""))
  monkeypatch.setattr(sources, "refresh_apt_lists",
                      lambda: updates.append(1) or True)
  report = corpus.build_corpus(corpus.BuildConfig(
      output_dir=tmp_path / "out", cache_dir=cache, recipe_dir=recipe,
      use_apt=True, workers=1, split_keys=None))
  (source,) = report["sources"]
  assert (source["status"], source["version_used"]) == ("downloaded", "2.0")
  assert report["apt_lists_refreshed"] is True and len(updates) == 1


def test_fetch_falls_back_to_current_version(tmp_path, monkeypatch):
  def fake_command(pin, spec, dest):
    del dest
    if "==" in spec:  # the pinned version no longer exists
      return ["sh", "-c", "echo 'No matching distribution' >&2; exit 1"]
    return ["sh", "-c", f"touch {pin.name}-3.1-py3-none-any.whl"]
  monkeypatch.setattr(sources, "_download_command", fake_command)
  pin = sources.Pin("pypi", "gone", "1.0", "r.txt:1")
  result = sources.fetch(pin, cache_dir=tmp_path, tool_available=True)
  assert (result.status, result.version_used) == ("fallback", "3.1")
  assert "No matching distribution" in result.reason
  again = sources.fetch(pin, cache_dir=tmp_path, tool_available=True)
  assert again.archive == result.archive  # reused from the cache


def test_a_cached_fallback_gives_way_to_the_pinned_version(tmp_path,
                                                          monkeypatch):
  # An earlier build fell back to 3.1 (e.g. apt's lists were stale); once
  # the pinned 1.0 downloads again, the build uses it, not the cache's 3.1.
  pinned_available = []

  def fake_command(pin, spec, dest):
    del dest
    if "==" in spec and not pinned_available:
      return ["sh", "-c", "echo 'No matching distribution' >&2; exit 1"]
    version = "1.0" if "==" in spec else "3.1"
    return ["sh", "-c", f"touch {pin.name}-{version}-py3-none-any.whl"]
  monkeypatch.setattr(sources, "_download_command", fake_command)
  pin = sources.Pin("pypi", "pkg", "1.0", "r.txt:1")
  first = sources.fetch(pin, cache_dir=tmp_path, tool_available=True)
  assert (first.status, first.version_used) == ("fallback", "3.1")
  pinned_available.append(True)
  second = sources.fetch(pin, cache_dir=tmp_path, tool_available=True)
  assert (second.status, second.version_used) == ("downloaded", "1.0")
  third = sources.fetch(pin, cache_dir=tmp_path, tool_available=True)
  assert (third.status, third.archive) == ("cached", second.archive)
  # Without the download tool the pinned archive in the cache still wins.
  offline = sources.fetch(pin, cache_dir=tmp_path, tool_available=False)
  assert (offline.status, offline.version_used) == ("cached", "1.0")


def test_a_debian_pin_that_fails_suggests_apt_get_update(tmp_path,
                                                         monkeypatch):
  def fake_command(pin, spec, dest):
    del pin, dest
    if "=" in spec:
      return ["sh", "-c", "echo \"E: Version '2' was not found\" >&2; exit 100"]
    return ["sh", "-c", "touch pkg_1_all.deb"]
  monkeypatch.setattr(sources, "_download_command", fake_command)
  result = sources.fetch(sources.Pin("debian", "pkg", "2", "r.txt:1"),
                         cache_dir=tmp_path, tool_available=True)
  assert (result.status, result.version_used) == ("fallback", "1")
  assert "apt-get update" in result.reason and "was not found" in result.reason


def test_recipe_errors_name_file_and_line(tmp_path):
  path = tmp_path / "recipe_pypi.txt"
  path.write_text("good==1.0\nbad-line-without-version\n")
  with pytest.raises(sources.RecipeError, match=r"recipe_pypi.txt:2"):
    sources.read_recipe(path, kind="pypi")


def test_packaged_recipe_parses():
  pins = sources.read_recipe_dir(sources.packaged_recipe_dir())
  kinds = [p.kind for p in pins]
  assert kinds.count("debian") == 134 and kinds.count("pypi") == 42


def test_report_is_json_on_disk(tmp_path):
  _special_tree(tmp_path / "src")
  report = _build(tmp_path, [tmp_path / "src"], split_keys=None)
  on_disk = json.loads((tmp_path / "out" / "report.json").read_text())
  assert on_disk["summary"] == report["summary"]
