"""The one JSON loader: each kind of damage gets a message naming the file,
the problem (line and column) and the fix; good files parse as json does."""

import json

import pytest

from m4moe import jsonfile

FIX = "rebuild it"


def _load(path, **kwargs):
  return jsonfile.load(path, what="the thing", fix=FIX, **kwargs)


def test_a_good_file_parses_like_json(tmp_path):
  value = {"a": [1, 2.5, None, "é"], "b": {"c": True}}
  (tmp_path / "x.json").write_text(json.dumps(value), encoding="utf-8")
  assert _load(tmp_path / "x.json") == value
  (tmp_path / "l.json").write_text("[1, 2]")
  assert _load(tmp_path / "l.json", expect=None) == [1, 2]


@pytest.mark.parametrize("content,problem", [
    (b"", "is empty"),
    (b'{"a": 1,\n "b": [1, 2', "ends early at line 2 column 12 (20 bytes: "
     "truncated, e.g. by a full disk or a killed writer)"),
    (b'{"a": 1,\n "b": x}', "is not valid JSON: Expecting value at line 2 "
     "column 7"),
    (b'{"a": "\xff\xfe"}', "is not UTF-8 text (byte 7 is 0xff): it is "
     "damaged or another kind of file"),
    (b"[1, 2]", "holds a JSON list, expected a JSON object"),
])
def test_each_damage_is_named_with_the_file_and_the_fix(tmp_path, content,
                                                        problem):
  path = tmp_path / "x.json"
  path.write_bytes(content)
  with pytest.raises(jsonfile.JSONFileError) as e:
    _load(path)
  assert str(e.value) == f"{path}: the thing {problem}; {FIX}"
  assert isinstance(e.value, ValueError)  # tools' `except ValueError` hold


def test_missing_and_directory_paths(tmp_path):
  with pytest.raises(jsonfile.JSONFileError,
                     match="the thing does not exist; rebuild it"):
    _load(tmp_path / "nope.json")
  with pytest.raises(jsonfile.JSONFileError,
                     match="the thing is a directory, not a file"):
    _load(tmp_path)
