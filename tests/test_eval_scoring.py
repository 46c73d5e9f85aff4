"""Per-language sacrebleu scoring, eval JSONs, test splits and evaluate()."""

import json

import pytest
import sacrebleu
from sacrebleu.metrics import BLEU, CHRF

from m4moe.eval import evaluate as evaluate_lib
from m4moe.eval import results
from m4moe.eval import scoring
from m4moe.eval import testsets

HYPS = ["the cat sat on a mat", "open the file now", "save all documents",
        "hello world again"]
REFS = ["the cat sat on the mat", "open the file", "save all the documents",
        "hello world"]


def _cjk_available(tokenize: str) -> bool:
  try:
    scoring.require_tokenizer(tokenize)
    return True
  except scoring.ScoringError:
    return False


@pytest.mark.parametrize("lang,tok", [
    ("en", "13a"), ("de", "13a"), ("zh", "zh"), ("zh_Hant", "zh"),
    ("zh-Hans", "zh"), ("ja", "ja-mecab"), ("ko", "ko-mecab"),
    ("pt_BR", "13a")])
def test_tokenizer_follows_target_language(lang, tok):
  assert scoring.tokenizer_for(lang) == tok


def test_scores_equal_sacrebleu_and_record_signatures():
  got = scoring.score_language(HYPS, REFS, source_lang="de", target_lang="en",
                               train_size=1234)
  assert got.bleu == pytest.approx(
      sacrebleu.corpus_bleu(HYPS, [REFS], tokenize="13a").score)
  assert got.chrf == pytest.approx(
      CHRF(word_order=2).corpus_score(HYPS, [REFS]).score)
  assert 0 < got.bleu < 100 and 0 < got.chrf < 100
  assert "tok:13a" in got.bleu_signature
  assert f"version:{sacrebleu.__version__}" in got.bleu_signature
  assert got.chrf_signature.startswith("chrF2++|") and "nw:2" in (
      got.chrf_signature)
  assert (got.language, got.num_segments, got.train_size) == ("de", 4, 1234)


def test_language_tags_never_reach_the_scorer():
  tagged = [f"<2en> {h}" for h in HYPS]
  tagged[1] = "open <2zh_Hant> the file now<2de>"
  plain = scoring.score_language(HYPS, REFS, source_lang="de",
                                 target_lang="en")
  got = scoring.score_language(tagged, REFS, source_lang="de",
                               target_lang="en")
  assert got.bleu == pytest.approx(plain.bleu)
  assert got.chrf == pytest.approx(plain.chrf)
  assert scoring.strip_language_tags(" <2en>  a  <2x_y-z> b ") == "a b"


def test_chinese_target_uses_zh_tokenizer():
  hyps, refs = ["我爱北京天安门广场"], ["我爱北京天安门"]
  got = scoring.score_language(hyps, refs, source_lang="en", target_lang="zh")
  assert got.language == "zh" and got.tokenizer == "zh"
  assert "tok:zh" in got.bleu_signature
  assert got.bleu == pytest.approx(BLEU(tokenize="zh").corpus_score(
      hyps, [refs]).score)
  # 13a would see one "word" per sentence and score 0.
  assert got.bleu > 0


@pytest.mark.parametrize("lang,tok", [("ja", "ja-mecab"), ("ko", "ko-mecab")])
def test_japanese_korean_need_the_cjk_extra(lang, tok):
  if _cjk_available(tok):
    got = scoring.score_language(["テスト です"], ["テスト です"],
                                 source_lang="en", target_lang=lang)
    assert f"tok:{tok}" in got.bleu_signature
  else:
    with pytest.raises(scoring.ScoringError,
                       match=r"pip install 'sacrebleu\[ja,ko\]'"):
      scoring.score_language(["x"], ["x"], source_lang="en",
                             target_lang=lang)


def test_empty_split_is_explicit_and_mismatch_fails():
  got = scoring.score_language([], [], source_lang="sw", target_lang="en")
  assert got.status == "empty" and got.bleu is None and got.num_segments == 0
  with pytest.raises(ValueError, match="2 hypotheses for 1 references"):
    scoring.score_language(["a", "b"], ["a"], source_lang="de",
                           target_lang="en")


def test_eval_json_round_trip_and_bad_files(tmp_path):
  score = scoring.score_language(HYPS, REFS, source_lang="fr",
                                 target_lang="en", train_size=10)
  empty = scoring.score_language([], [], source_lang="sw", target_lang="en")
  result = results.EvalResult(model="m", metadata={"num_params": 5},
                              languages={"fr": score, "sw": empty})
  path = tmp_path / "m.json"
  results.write_eval_json(result, path)
  back = results.read_eval_json(path)
  assert back == result
  assert json.loads(path.read_text())["schema"] == results.SCHEMA
  assert results.read_eval_json(path, kind="bilingual").kind == "bilingual"
  bad = tmp_path / "bad.json"
  bad.write_text('{"schema": "other"}')
  with pytest.raises(ValueError, match="bad.json.*schema"):
    results.read_eval_json(bad)
  bad.write_text("{not json")
  with pytest.raises(ValueError, match="bad.json"):
    results.read_eval_json(bad)


def _write_corpus(root):
  for split, rows in {
      "train": {"de": ["a\tA", "b\tB", "c\tC"], "fr": ["a\tA"]},
      "test": {"de": ["open the file now please\tdatei öffnen",
                      "save all of the documents\tspeichern"],
               "fr": ["close\tfermer"]}}.items():
    (root / split).mkdir(parents=True)
    for lang, lines in rows.items():
      (root / split / f"{lang}.tsv").write_text("\n".join(lines) + "\n",
                                                encoding="utf-8")


def test_testsets_and_train_sizes(tmp_path):
  _write_corpus(tmp_path)
  sets = testsets.load_testsets(tmp_path, langs=["de", "fr", "sw"])
  de, fr, sw = sets
  assert de.sources == ("datei öffnen", "speichern")
  assert de.references == ("open the file now please",
                           "save all of the documents")
  assert (de.source_lang, de.target_lang) == ("de", "en")
  assert sw.sources == () and fr.sources == ("fermer",)
  rev = testsets.load_testsets(tmp_path, langs=["de"], direction="en_xx")[0]
  assert rev.sources == de.references and rev.target_lang == "de"
  assert testsets.train_sizes(tmp_path) == {"de": 3, "fr": 1}
  (tmp_path / "report.json").write_text(json.dumps(
      {"languages": {"de": {"train": 300, "test": 2}, "fr": {"train": 7}}}))
  assert testsets.train_sizes(tmp_path) == {"de": 300, "fr": 7}
  (tmp_path / "test" / "fr.tsv").write_bytes(b"ok\tok\nbad\t\xff\xfe\n")
  with pytest.raises(ValueError, match=r"fr.tsv:2: invalid UTF-8"):
    testsets.load_testsets(tmp_path, langs=["fr"])


def test_evaluate_scores_every_language(tmp_path):
  _write_corpus(tmp_path)
  sets = testsets.load_testsets(tmp_path, langs=["de", "fr", "sw"])
  lookup = {s: r for t in sets for s, r in zip(t.sources, t.references)}
  calls = []

  def oracle(sources, *, source_lang, target_lang):
    calls.append((source_lang, target_lang, len(sources)))
    return [f"<2{target_lang}> {lookup[s]}" for s in sources]

  result = evaluate_lib.evaluate(oracle, sets, model="oracle",
                                 train_sizes={"de": 3, "fr": 1},
                                 metadata={"beam_size": 4})
  assert calls == [("de", "en", 2), ("fr", "en", 1)]
  assert result.languages["de"].bleu == pytest.approx(100.0)
  assert result.languages["de"].train_size == 3
  assert result.languages["sw"].status == "empty"
  assert result.metadata == {"beam_size": 4}


def test_evaluate_checks_tokenizers_before_decoding():
  if _cjk_available("ja-mecab"):
    pytest.skip("sacrebleu[ja] is installed: nothing to fail")
  sets = [testsets.TestSet(language="ja", source_lang="en", target_lang="ja",
                           sources=("x",), references=("y",))]
  def never(sources, **kwargs):
    raise AssertionError("decoded before checking the tokenizer")
  with pytest.raises(scoring.ScoringError, match="sacrebleu"):
    evaluate_lib.evaluate(never, sets, model="m")
