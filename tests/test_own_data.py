"""docs/own_data.md: its formats, its bad-line table and its walkthrough.

The fast tests build a corpus (no TensorFlow, about a second) from the
page's own TSV and catalog examples plus one line of every bad kind the
page lists, and check the report says what the page says. The slow test
runs every command of the page, in order, on a tiny folder made of the
page's examples and a few hundred generated pairs, with flags appended
that make the model and the sets tiny (:data:`TINY`).
"""

from __future__ import annotations

import json
import os
import pathlib
import shlex
import subprocess
import sys

import polib
import pytest

import markdown_commands
from m4moe.data import fixtures
from m4moe.data import tsv

ROOT = pathlib.Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "own_data.md"
BLOCKS = markdown_commands.fenced_blocks(PAGE)
COMMANDS = markdown_commands.fenced_commands(PAGE)
# Flags set on the page's commands for the tiny example (replacing the
# page's value of the same flag, else appended).
TINY = {
    "m4moe-split-keys": ["--min_test_pairs=12", "--max_held_out_fraction=0.2"],
    "m4moe-vocab": ["--source_vocab_size=400", "--target_vocab_size=320"],
    "m4moe-train": ["--train_steps=4", "--batch_tokens=512",
                    "--sequence_length=32", "--checkpoint_every=2",
                    "--eval_every=2", "--d_model=32", "--d_kv=8",
                    "--d_ff=64", "--warmup_steps=2",
                    "--expert_hidden_dim=32", "--num_experts=4",
                    "--group_size=64"],
    "m4moe-eval": ["--max_sentences=4", "--beam_size=2"],
}
# Page commands the walkthrough test does not run, with the reason.
NOT_RUN = {
    "m4moe-build-corpus --sources=": "downloads the packaged recipe",
    "python3 -m pip install": "installs into the test's environment",
}
_ENV = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}


def _block(language: str) -> str:
  text, = [t for lang, _, t in BLOCKS if lang == language]
  return text


def _example_folder(root: pathlib.Path, *, generated: int) -> pathlib.Path:
  """``my_pair/`` of the page: its TSV and catalog examples, each followed
  by ``generated`` pseudo-pairs (m4moe.data.fixtures)."""
  folder = root / "my_pair"
  (folder / "po").mkdir(parents=True)
  english = fixtures.english_sentences(2 * generated, seed=7, min_words=4)
  lines = [f"eo\t{e}\t{fixtures.translate(e, 'eo')}\n"
           for e in english[:generated]]
  (folder / "eo.tsv").write_text(_block("tsv") + "".join(lines),
                                 encoding="utf-8")
  po_path = folder / "po" / "eo.po"
  po_path.write_text(_block("po"), encoding="utf-8")
  catalog = polib.pofile(str(po_path))
  for e in english[generated:]:
    catalog.append(polib.POEntry(msgid=e, msgstr=fixtures.translate(e, "eo")))
  catalog.save(str(po_path))
  return folder


def _tiny(program: str, args: list[str]) -> list[str]:
  """``args`` with the :data:`TINY` values of ``program``."""
  tiny = dict(flag.split("=", 1) for flag in TINY.get(program, []))
  out = [a if a.split("=", 1)[0] not in tiny else
         f"{a.split('=', 1)[0]}={tiny.pop(a.split('=', 1)[0])}" for a in args]
  return out + [f"{name}={value}" for name, value in tiny.items()]


def _run_tool(program: str, args: list[str], cwd: pathlib.Path
              ) -> subprocess.CompletedProcess:
  """Runs console script ``program`` as its wrapper does."""
  module = "m4moe.cli." + program[len("m4moe-"):].replace("-", "_")
  script = (f"import sys; sys.argv = {[program, *args]!r}; "
            f"from {module} import run; run()")
  return subprocess.run([sys.executable, "-c", script], cwd=cwd, env=_ENV,
                        capture_output=True, text=True, timeout=1800,
                        check=False)


def test_the_tsv_example_has_three_tab_separated_fields():
  rows = [line for line in _block("tsv").splitlines()
          if line and not line.startswith("#")]
  assert len(rows) == 2
  for row in rows:
    assert len(row.split("\t")) == 3, f"not 3 tab-separated fields: {row!r}"


def _bad_folder(root: pathlib.Path) -> pathlib.Path:
  folder = _example_folder(root, generated=0)
  with open(folder / "eo.tsv", "ab") as f:
    f.write(b"eo\tOpen the recent documents\t\xff\xfe broken\n"   # +1
            b"eo\tOnly two fields here\n"                          # +2
            b"qq\tShow the next page\tMontri la sekvan pagxon\n"   # +3
            b"de\tShow all the windows\tAlle Fenster anzeigen\n"   # +4
            b"eo\tSave\tKonservi\n"                                # +5
            b"\n# a comment line\n")
  (folder / "po" / "unread.tsv").write_text(
      "eo\tThis line is never read\tCxi tiu linio neniam legigxas\n",
      encoding="utf-8")
  (folder / "po" / "broken.po").write_text(
      'msgid ""\nmsgstr ""\n"Language: eo\\n"\n"Content-Type: text/plain; '
      'charset=UTF-8\\n"\n\nmsgid "Delete the selected item"\nmsgstr '
      '"Forigi la elektitan eron\n', encoding="utf-8")
  return folder


def test_the_build_reports_every_bad_line_as_the_page_says(tmp_path):
  _bad_folder(tmp_path)
  proc = _run_tool("m4moe-build-corpus", [
      "--norecipe", "--sources=my_pair/po,my_pair/eo.tsv", "--languages=eo",
      "--split_keys=", "--output_dir=corpus_eo", "--workers=1"], tmp_path)
  assert proc.returncode == 0, proc.stderr[-3000:]
  report = json.loads((tmp_path / "corpus_eo" / "report.json").read_text())
  problems = {(p["kind"], p["where"]) for p in report["problems"]}
  tsv_file = "my_pair/eo.tsv"
  first_bad = len(_block("tsv").splitlines()) + 1
  for kind, offset in (("tsv:undecodable_line", 0), ("tsv:bad_line", 1),
                       ("tsv:unknown_language", 2)):
    assert (kind, f"{tsv_file}:{first_bad + offset}") in problems, (
        kind, problems)
  assert any(kind == "catalog:po_unterminated_string" and "broken.po" in where
             for kind, where in problems), problems
  counts = report["counts"]
  assert counts["pair:language_not_selected"] == 1
  assert counts["too_short"] == 1
  assert counts["entry:fuzzy"] == 1
  pairs = (tmp_path / "corpus_eo" / "train" / "eo.tsv").read_text(
      encoding="utf-8").splitlines()
  # The page's two TSV pairs and three catalog pairs (one singular, two
  # plural forms); not the fuzzy entry nor the TSV inside a directory.
  assert sorted(p.split("\t")[0] for p in pairs) == sorted([
      "Open the selected file", "Save all open documents",
      "Close the current window", "%d file was deleted from the folder",
      "%d files were deleted from the folder"])
  assert report["summary"]["pairs_dev"] == report["summary"]["pairs_test"] \
      == 0  # one language: no dev or test without split keys (the page)


def test_corpus_lines_of_every_bad_kind_the_page_lists_are_found(tmp_path):
  path = tmp_path / "eo.tsv"
  path.write_bytes(b"Open the file\tMalfermi la dosieron\n"
                   b"no tab here\n"
                   b"one\ttwo\tthree\n"
                   b"bad\t\xff\n"
                   b"\n")
  scan = tsv.scan_tsv(path)
  assert scan.bad_lines == (2, 3, 4, 5)
  assert "no tab" in str(scan.examples[0])
  assert "3 tab-separated fields" in str(scan.examples[1])
  assert "invalid UTF-8" in str(scan.examples[2])
  assert "empty line" in str(scan.examples[3])


def _skipped(command: markdown_commands.Command) -> str | None:
  text = " ".join(command.argv)
  return next((why for prefix, why in NOT_RUN.items()
               if text.startswith(prefix)), None)


def test_not_run_names_commands_of_the_page():
  texts = [" ".join(c.argv) for c in COMMANDS]
  for prefix in NOT_RUN:
    assert any(t.startswith(prefix) for t in texts), prefix


@pytest.mark.slow
def test_the_walkthrough_runs(tmp_path):
  pytest.importorskip("tensorflow_text")
  _example_folder(tmp_path, generated=160)
  outputs = []
  for command in COMMANDS:
    if _skipped(command):
      continue
    program, args = command.argv[0], list(command.argv[1:])
    if program.startswith("m4moe-"):
      proc = _run_tool(program, _tiny(program, args), tmp_path)
    else:
      argv = [sys.executable, *args] if program == "python3" else \
          list(command.argv)
      proc = subprocess.run(argv, cwd=tmp_path, env=_ENV, timeout=600,
                            capture_output=True, text=True, check=False)
    assert proc.returncode == 0, (
        f"{command.id} failed: {shlex.join(proc.args)}\n"
        f"{proc.stderr[-1500:]}")
    outputs.append(proc.stdout)
  corpus = tmp_path / "corpus_eo"
  for split in ("train", "dev", "test"):
    assert (corpus / split / "eo.tsv").read_text(encoding="utf-8").strip(), \
        f"{split}/eo.tsv is empty"
  scores = json.loads((tmp_path / "scores" / "eo.json").read_text())
  assert "eo" in json.dumps(scores)
  assert (tmp_path / "report_eo" / "report.md").is_file()
  assert "tf.Tensor" in outputs[-1]  # the SavedModel translated
