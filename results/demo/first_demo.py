"""Scores a demo run on the first demo's own test sentences.

The demo's target is "every demo language >= 2x the first demo's BLEU on
its in-domain test sentences", the first demo (pt 10.9, kk 10.6,
si 15.3, ia 38.1 on the first 200 test pairs per language under the
version-1 split keys). Version 2 of ``data/splits/split_keys.txt`` appended
test groups (it never moves a version-1 group), so the first 200 test pairs
of a run now are not the first demo's. This script finds, among the test
pairs a run decoded, those that were among the first demo's (the first 200
version-1 test pairs of the corpus test file, in its order) and scores the
run's hypotheses on them with sacrebleu:

  python3 results/demo/first_demo.py --corpus_dir=RUN/corpus \\
      --eval_dir=RUN/eval --model=moe

It prints, per language, how many of the first demo's sentences the run
decoded, the run's BLEU on them and its ratio to the first demo's BLEU.
"""

import json
import pathlib

from absl import app
from absl import flags
import sacrebleu

from m4moe.data import split as split_lib
from m4moe.eval import testsets

_CORPUS_DIR = flags.DEFINE_string("corpus_dir", None, "The run's corpus.")
_EVAL_DIR = flags.DEFINE_string(
    "eval_dir", None, "The run's eval directory (<model>/<lang>.hyp).")
_MODEL = flags.DEFINE_string("model", "moe", "Model name under --eval_dir.")
_KEYS = flags.DEFINE_string(
    "split_keys", str(pathlib.Path(__file__).parents[3] / "data" / "splits"
                      / "split_keys.txt"),
    "Frozen split keys; the test groups above its '# version: 2' line are "
    "version 1's.")
_OUTPUT = flags.DEFINE_string("output", "", "Also write the rows as JSON.")

# The first demo: BLEU on its first 200 test pairs per language.
FIRST_DEMO_BLEU = {"pt": 10.9, "kk": 10.6, "si": 15.3, "ia": 38.1}
FIRST_DEMO_SENTENCES = 200


def version1_test_groups(path: pathlib.Path) -> frozenset[str]:
  """Test group ids listed before the file's first '# version: 2' line."""
  groups = set()
  for line in path.read_text(encoding="utf-8").splitlines():
    if line.startswith("# version:"):
      break
    name, _, gid = line.partition("\t")
    if name == "test":
      groups.add(gid)
  if not groups:
    raise ValueError(f"{path}: no version-1 test groups found")
  return frozenset(groups)


def score(corpus_dir: pathlib.Path, eval_dir: pathlib.Path, model: str,
          keys: pathlib.Path) -> list[dict]:
  v1 = version1_test_groups(keys)
  rows = []
  for lang, first_bleu in FIRST_DEMO_BLEU.items():
    pairs = testsets.read_pairs(corpus_dir / "test" / f"{lang}.tsv")
    first = [i for i, (english, _) in enumerate(pairs)
             if split_lib.group_id(english) in v1][:FIRST_DEMO_SENTENCES]
    hyp_path = eval_dir / model / f"{lang}.hyp"
    hyps = hyp_path.read_text(encoding="utf-8").splitlines()
    shared = [i for i in first if i < len(hyps)]
    bleu = sacrebleu.corpus_bleu([hyps[i] for i in shared],
                                 [[pairs[i][0] for i in shared]])
    rows.append({"language": lang, "first_demo_sentences": len(first),
                 "decoded_of_them": len(shared), "bleu": round(bleu.score, 1),
                 "first_demo_bleu": first_bleu,
                 "ratio": round(bleu.score / first_bleu, 2)})
  return rows


def main(argv):
  del argv
  rows = score(pathlib.Path(_CORPUS_DIR.value), pathlib.Path(_EVAL_DIR.value),
               _MODEL.value, pathlib.Path(_KEYS.value))
  print("| language | first demo's sentences decoded | BLEU on them | "
        "first demo | ratio |")
  print("| --- | ---: | ---: | ---: | ---: |")
  for r in rows:
    print(f"| {r['language']} | {r['decoded_of_them']} of "
          f"{r['first_demo_sentences']} | {r['bleu']:.1f} | "
          f"{r['first_demo_bleu']} | {r['ratio']:.2f}x |")
  if _OUTPUT.value:
    pathlib.Path(_OUTPUT.value).write_text(json.dumps(rows, indent=1) + "\n",
                                           encoding="utf-8")


if __name__ == "__main__":
  flags.mark_flags_as_required(["corpus_dir", "eval_dir"])
  app.run(main)
