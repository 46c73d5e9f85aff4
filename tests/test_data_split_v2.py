"""Study v2 splits: append-only test-key extension and the out-of-domain
test split of held-out source packages."""

import json
import pathlib
import subprocess
import sys

import pytest

from m4moe.data import corpus
from m4moe.data import fixtures
from m4moe.data import split
from m4moe.data import vocab

LOCALES = ("de", "ru", "ja")


def _pairs(out: pathlib.Path, name: str) -> set[tuple[str, str, str]]:
  return {(p.stem, en, x) for p in (out / name).glob("*.tsv")
          for en, x in vocab.read_split_pairs(out, name, p.stem)}


def _write_app(root: pathlib.Path, package: str, sentences: list[str],
               locales=LOCALES) -> pathlib.Path:
  """One source package: a catalog per locale under ``root/package``."""
  for locale in locales:
    fixtures.write_catalog(
        fixtures.make_catalog(locale, sentences, special=False),
        root / package / locale / "LC_MESSAGES" / f"{package}.po")
  return root / package


def _build(tmp_path, name, srcs, **kwargs):
  return corpus.build_corpus(corpus.BuildConfig(
      output_dir=tmp_path / name, cache_dir=tmp_path / "cache",
      sources=tuple(srcs), workers=1, **kwargs))


def _run(module, *args):
  return subprocess.run([sys.executable, "-m", module, *args],
                        capture_output=True, text=True, check=False,
                        timeout=300)


# --- extending the test keys -------------------------------------------------


def _toy_groups():
  # Group ids -> language -> training pairs. "aaa..." is in all three
  # languages, "bbb..." in two, "ccc..." only in de.
  return {"a00000000001": {"de": 3, "ru": 2, "ja": 1},
          "a00000000002": {"de": 1, "ru": 1, "ja": 1},
          "b00000000001": {"de": 2, "ru": 2},
          "b00000000002": {"ru": 1, "ja": 4},
          "c00000000001": {"de": 9}}


def test_extension_prefers_most_translated_groups_and_keeps_old_keys():
  keys = split.SplitKeys(frozenset({"d00000000001"}),
                         frozenset({"e00000000001"}))
  total = {"de": 1000, "ru": 1000, "ja": 1000}
  new, ext = split.extend_test_keys(
      keys, train_groups=_toy_groups(), test_pairs={"de": 2, "ru": 2, "ja": 2},
      held_out_pairs={"de": 4, "ru": 4, "ja": 4}, total_pairs=total,
      target=6, max_held_out_fraction=0.5)
  assert new.dev == keys.dev and keys.test <= new.test
  assert new.version == 2
  # Three-way groups first (by id), then two-way; single-language groups
  # are never candidates; stops once every language has 6 test pairs.
  # After the two three-way groups de has 6, ru 5, ja 4: b..1 is taken
  # for ru (and brings de along), b..2 for ja.
  assert ext.added == ("a00000000001", "a00000000002", "b00000000001",
                       "b00000000002")
  assert ext.test_pairs_after == {"de": 8, "ru": 8, "ja": 8}
  assert ext.train_pairs_lost == {"de": 6, "ru": 6, "ja": 6}
  assert ext.capped == ()
  assert not set(ext.added) & (keys.dev | keys.test)
  # Deterministic: the same inputs give the same choice.
  again = split.extend_test_keys(
      keys, train_groups=dict(reversed(list(_toy_groups().items()))),
      test_pairs={"de": 2, "ru": 2, "ja": 2},
      held_out_pairs={"de": 4, "ru": 4, "ja": 4}, total_pairs=total,
      target=6, max_held_out_fraction=0.5)
  assert again == (new, ext)


def test_extension_caps_small_languages_held_out_share():
  keys = split.SplitKeys(frozenset(), frozenset())
  # ja has 40 pairs: at 10% it may hold out 4, so no group taking it past
  # that is chosen, and it is reported as capped.
  new, ext = split.extend_test_keys(
      keys, train_groups=_toy_groups(), test_pairs={},
      held_out_pairs={}, total_pairs={"de": 1000, "ru": 1000, "ja": 40},
      target=5, max_held_out_fraction=0.1)
  assert ext.test_pairs_after["ja"] <= 4
  assert "ja" in ext.capped
  assert ext.test_pairs_after["de"] >= 5 or "de" in ext.capped
  assert new.test == frozenset(ext.added)


def test_extension_rejects_bad_settings():
  keys = split.SplitKeys(frozenset(), frozenset())
  for kwargs, match in (({"target": 0}, "positive"),
                        ({"target": 5, "max_held_out_fraction": 1.5},
                         "between 0 and 1")):
    with pytest.raises(ValueError, match=match):
      split.extend_test_keys(keys, train_groups={}, test_pairs={},
                             held_out_pairs={}, total_pairs={"de": 1},
                             **kwargs)


def test_append_keeps_old_lines_and_records_the_version(tmp_path):
  path = tmp_path / "keys.txt"
  old = split.SplitKeys(frozenset({"0123456789ab"}),
                        frozenset({"ba9876543210"}))
  split.save_split_keys(old, path, comment="v1")
  before = path.read_text()
  new = split.SplitKeys(old.dev, old.test | {"00000000000f"}, 2)
  split.append_split_keys(path, new, comment="test extension")
  text = path.read_text()
  assert text.startswith(before)
  assert text[len(before):] == ("# version: 2\n# test extension\n"
                                "test\t00000000000f\n")
  assert split.load_split_keys(path) == new
  for gid in old.dev | old.test:  # old keys map to the same split
    assert split.load_split_keys(path).split_of(gid) == old.split_of(gid)
  # Not an extension: a dev id dropped, an old test id missing, no version
  # bump.
  for bad in (split.SplitKeys(frozenset(), new.test, 3),
              split.SplitKeys(old.dev, frozenset({"111111111111"}), 3),
              split.SplitKeys(old.dev, new.test | {"222222222222"}, 2)):
    with pytest.raises(ValueError, match="keys.txt"):
      split.append_split_keys(path, bad, comment="x")
  assert split.load_split_keys(path) == new
  path.write_text(text + "test\t00000000000f\n")
  with pytest.raises(ValueError, match=r"keys.txt:\d+: .*listed twice"):
    split.load_split_keys(path)


def test_committed_keys_extend_version_1_append_only():
  path = split.default_split_keys_path()
  lines = path.read_text(encoding="utf-8").splitlines()
  keys = split.load_split_keys(path)
  # Version 1 is the first 1500 keys (500 dev + 1000 test); later versions
  # only append test lines below their version line.
  v1 = [line for line in lines[:1502] if not line.startswith("#")]
  assert len(v1) == 1500
  assert sum(line.startswith("dev\t") for line in v1) == len(keys.dev) == 500
  later = [line for line in lines[1502:] if not line.startswith("#")]
  assert all(line.startswith("test\t") for line in later)
  assert len(keys.test) == 1000 + len(later)
  if later:
    assert keys.version >= 2


def test_split_keys_cli_extends_a_built_corpus(tmp_path):
  shared = fixtures.english_sentences(80, seed=21)
  only_de = fixtures.english_sentences(30, seed=22)
  src = _write_app(tmp_path / "src", "app", shared)
  _write_app(tmp_path / "src", "deonly", only_de, locales=("de",))
  _build(tmp_path, "v1", [src, tmp_path / "src" / "deonly"],
         split_keys=None,
         split_config=split.SplitConfig(dev_groups=4, test_groups=4))
  keys_file = tmp_path / "keys.txt"
  keys_file.write_bytes((tmp_path / "v1" / "split_keys.txt").read_bytes())
  v1_bytes = keys_file.read_bytes()
  old = split.load_split_keys(keys_file)
  report_file = tmp_path / "ext.json"
  args = [f"--corpus_dir={tmp_path / 'v1'}", f"--split_keys={keys_file}",
          "--min_test_pairs=10", "--max_held_out_fraction=0.3",
          f"--report={report_file}"]
  proc = _run("m4moe.cli.split_keys", *args, "--max_held_out_fraction=1")
  assert proc.returncode != 0 and "Traceback" not in proc.stderr
  assert "--max_held_out_fraction=1.0: use a fraction" in proc.stderr
  proc = _run("m4moe.cli.split_keys", *args, "--dry_run")
  assert proc.returncode == 0, proc.stderr
  assert keys_file.read_bytes() == v1_bytes and not report_file.exists()
  proc = _run("m4moe.cli.split_keys", *args)
  assert proc.returncode == 0, proc.stderr
  ext = json.loads(report_file.read_text())
  assert ext["version_after"] == 2
  assert ext["test_pairs_after"] == {"de": 10, "ja": 10, "ru": 10}
  new = split.load_split_keys(keys_file)
  assert new.version == 2 and new.dev == old.dev and old.test < new.test
  # Rebuilt with the extended keys: old dev/test pairs stay where they were,
  # the new test groups come out of train only, and each language loses
  # exactly the reported number of training pairs.
  _build(tmp_path, "v2", [src, tmp_path / "src" / "deonly"],
         split_keys=keys_file)
  report = corpus.read_report(tmp_path / "v2")
  assert report["split_keys"]["version"] == 2
  v1, v2 = ({name: _pairs(tmp_path / d, name) for name in split.SPLITS}
            for d in ("v1", "v2"))
  assert v1["dev"] == v2["dev"] and v1["test"] <= v2["test"]
  assert v2["test"] - v1["test"] <= v1["train"]
  assert not v2["train"] & (v2["test"] | v2["dev"])
  for lang, lost in ext["train_pairs_lost"].items():
    assert (report["languages"][lang]["train"] ==
            corpus.read_report(tmp_path / "v1")["languages"][lang]["train"]
            - lost)
  # A corpus built with other keys is refused, naming the fix.
  proc = _run("m4moe.cli.split_keys", *args)
  assert proc.returncode != 0
  assert "rebuild it with --split_keys" in proc.stderr
  assert "Traceback" not in proc.stderr


# --- the out-of-domain test split -----------------------------------------


def test_held_out_packages_become_test_ood(tmp_path):
  in_domain = fixtures.english_sentences(60, seed=31)
  ood_only = fixtures.english_sentences(20, seed=32, min_words=10,
                                        max_words=12)
  shared = in_domain[:5]  # also in the held-out package: not unseen English
  src = tmp_path / "src"
  _write_app(src, "editor", in_domain)
  _write_app(src, "ledger", ood_only + shared)
  ood_file = tmp_path / "ood.txt"
  ood_file.write_text("# held out\nledger\nnot-a-package  # listed, absent\n")
  report = _build(tmp_path, "out", [src / "editor", src / "ledger"],
                  split_keys=None, ood_packages=ood_file,
                  split_config=split.SplitConfig(dev_groups=5,
                                                 test_groups=5))
  out = tmp_path / "out"
  pairs = {name: _pairs(out, name) for name in split.SPLITS}
  ood_english = {en for _, en, _ in pairs["test_ood"]}
  assert ood_english == set(ood_only)
  for name in split.KEYED_SPLITS:  # held out of train, dev and test
    assert not {en for _, en, _ in pairs[name]} & set(ood_only), name
  in_domain_groups = {split.group_id(en) for name in split.KEYED_SPLITS
                      for _, en, _ in pairs[name]}
  assert not {split.group_id(en) for en in ood_english} & in_domain_groups
  assert report["counts"]["ood:english_in_domain"] == len(shared) * 3
  assert report["ood_packages"]["pairs"] == {"ledger": 25 * 3}
  assert report["ood_packages"]["not_found"] == ["not-a-package"]
  for lang in LOCALES:
    assert report["languages"][lang]["test_ood"] == 20
  assert report["summary"]["pairs_test_ood"] == 60
  assert report["summary"]["languages_with_test_ood"] == 3
  # Without the list nothing is held out and test_ood files are empty.
  report = _build(tmp_path, "plain", [src / "editor", src / "ledger"],
                  split_keys=None,
                  split_config=split.SplitConfig(dev_groups=5,
                                                 test_groups=5))
  assert report["summary"]["pairs_test_ood"] == 0
  assert (tmp_path / "plain" / "test_ood" / "de.tsv").read_text() == ""


def test_ood_package_file_errors(tmp_path):
  src = _write_app(tmp_path / "src", "app",
                   fixtures.english_sentences(10, seed=41))
  with pytest.raises(ValueError, match="--ood_packages: .* is not a file"):
    corpus.BuildConfig(output_dir=tmp_path / "out", cache_dir=tmp_path / "c",
                       sources=(src,), ood_packages=tmp_path / "missing.txt")
  bad = tmp_path / "ood.txt"
  bad.write_text("ledger\ntwo names\n")
  with pytest.raises(corpus.SplitKeysError, match=r"ood.txt:2: .*'two names'"):
    _build(tmp_path, "out", [src], split_keys=None, ood_packages=bad)
  assert not (tmp_path / "out").exists()  # refused before writing anything


def test_committed_ood_packages_are_recipe_pins():
  from m4moe.data import sources  # pylint: disable=g-import-not-at-top
  names = split.load_ood_packages(split.default_ood_packages_path())
  pins = {pin.name for pin in
          sources.read_recipe_dir(sources.packaged_recipe_dir())}
  assert 3 <= len(names) and names <= pins


def test_unselected_language_catalogs_are_skipped_unparsed(tmp_path):
  sentences = fixtures.english_sentences(30, seed=51)
  src = _write_app(tmp_path / "src", "app", sentences,
                   locales=("de", "ru", "ja"))
  # A catalog outside LC_MESSAGES is still parsed (its header decides).
  fixtures.write_catalog(
      fixtures.make_catalog("ru", sentences[:10], special=False),
      src / "po" / "ru.po")
  _build(tmp_path, "all", [src], split_keys=None,
         split_config=split.SplitConfig(dev_groups=3, test_groups=3))
  report = _build(tmp_path, "de", [src], languages=("de",),
                  split_keys=tmp_path / "all" / "split_keys.txt")
  assert report["counts"]["catalog:language_not_selected"] == 2  # ru, ja
  assert report["counts"]["pair:language_not_selected"] == 10  # po/ru.po
  # The selected language's corpus is what a build of everything gives.
  for name in split.SPLITS:
    assert _pairs(tmp_path / "de", name) == {
        p for p in _pairs(tmp_path / "all", name) if p[0] == "de"}, name
  assert _pairs(tmp_path / "de", "train")
