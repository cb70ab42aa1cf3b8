"""The one strict JSON reader and the one standard-JSON writer every file goes through."""

import json
import math

import pytest

from octopipe import jsonfile
from octopipe.errors import InputError


@pytest.mark.parametrize(
    "text, message",
    [
        ('{"f": NaN}', "NaN is not a JSON number"),
        ('{"f": Infinity}', "Infinity is not a JSON number"),
        ('{"f": -Infinity}', "-Infinity is not a JSON number"),
        ('{"f": 1e400}', "the number 1e400 is beyond a float's range"),
        ('{"f": -1E999}', "the number -1E999 is beyond a float's range"),
        ('{"n": ' + "9" * 5000 + "}", "a number is beyond any size OctoPipe reads"),
        ('{"f": ' + "9" * 400 + ".5}", "is beyond a float's range"),
        ('{"f": 1, "f": 2}', "key 'f' is given twice in one object"),
        ('{"f": 1', "malformed JSON"),
        ("[" * 100_000, "nested too deeply"),
    ],
)
def test_what_pythons_json_lets_through_is_refused_in_one_line(tmp_path, text, message):
    path = tmp_path / "x.json"
    path.write_text(text)
    with pytest.raises(InputError) as caught:
        jsonfile.read_json(path)
    assert str(caught.value).startswith(f"{path}: ") and message in str(caught.value)
    assert "\n" not in str(caught.value)


def test_a_binary_file_and_a_huge_file_are_refused(tmp_path, monkeypatch):
    binary = tmp_path / "b.json"
    binary.write_bytes(b"\x89PNG\r\n\x1a\n\x00\xff")
    with pytest.raises(InputError, match="not UTF-8 text"):
        jsonfile.read_json(binary)
    monkeypatch.setattr(jsonfile, "MAX_INPUT_FILE_BYTES", 10)
    big = tmp_path / "big.json"
    big.write_text('{"a": 1234567890}')
    with pytest.raises(InputError, match="is 17 bytes; at most 10 are read"):
        jsonfile.read_json(big)


def test_valid_json_reads_as_pythons_does(tmp_path):
    data = {"a": [1, 2.5, -3e-7, True, None, "x"], "b": {"c": 10**20}}
    path = tmp_path / "x.json"
    path.write_text(json.dumps(data))
    assert jsonfile.read_json(path) == data


def test_writing_a_non_finite_figure_is_an_error_naming_it_and_leaves_no_file(tmp_path):
    path = tmp_path / "out.json"
    with pytest.raises(jsonfile.NonFiniteResult, match=r"losses\[1\] is nan"):
        jsonfile.write_json(path, {"losses": [1.0, math.nan]})
    assert list(tmp_path.iterdir()) == []


def test_a_write_replaces_the_file_whole(tmp_path):
    path = tmp_path / "out.json"
    path.write_text("old")
    jsonfile.write_json(path, {"a": 1})
    assert json.loads(path.read_text()) == {"a": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["out.json"]  # no temporary left
