"""`octopipe prepare-data`: text and JSONL in, train.bin / val.bin / meta.json out, streamed;
and what a token file's meta.json makes `run` check (the vocabulary, the dtype, the length)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from octopipe.cli import main
from octopipe.errors import InputError
from octopipe.runtime.data.batches import TokenFile
from octopipe.tokens import sources
from octopipe.tokens.sources import PIECE_CHARS, pieces

EOS = "<|endoftext|>"
STORY = "The pipeline has four stages, and the bubble between them shrinks.\n"


@pytest.fixture(scope="module")
def tokenizer_file(tmp_path_factory) -> str:
    """A byte-level BPE tokenizer trained here (nothing downloaded), with an end-of-text token."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=[EOS], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator([STORY * 50, "données — ünïcode text ✓ " * 20], trainer)
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    tok.save(str(path))
    return str(path)


def _ids(path) -> np.ndarray:
    return np.fromfile(path, dtype=np.uint16)


def test_text_and_jsonl_become_token_files_that_decode_back(tokenizer_file, tmp_path, capsys):
    corpus = tmp_path / "corpus"
    (corpus / "sub").mkdir(parents=True)
    (corpus / "a.txt").write_text(STORY * 3, encoding="utf-8")
    records = [{"text": f"record {i}: données ✓", "id": i} for i in range(3)]
    (corpus / "sub" / "b.jsonl").write_text("\n".join(map(json.dumps, records)) + "\n\n")
    (corpus / "notes.bin").write_bytes(b"\xff\xfe")  # not a text suffix: not read
    out = tmp_path / "tokens"
    code = main(
        ["prepare-data", "--tokenizer", tokenizer_file, "--input", str(corpus), "-o", str(out)]
        + ["--val-fraction", "0"]
    )
    assert code == 0
    assert "4 documents" in capsys.readouterr().out
    meta = json.loads((out / "meta.json").read_text())
    tok = Tokenizer.from_file(tokenizer_file)
    eos = tok.token_to_id(EOS)
    assert meta["format"] == "octopipe.tokens/1"
    vocab = tok.get_vocab_size(with_added_tokens=True)
    assert (meta["vocab_size"], meta["dtype"], meta["eos_id"]) == (vocab, "uint16", eos)
    train = _ids(out / "train.bin")
    assert meta["files"] == {"train.bin": {"tokens": len(train)}, "val.bin": {"tokens": 0}}
    # Files in sorted order (a.txt, then sub/b.jsonl), an end-of-text token after each document.
    documents = [STORY * 3] + [r["text"] for r in records]
    ends = np.flatnonzero(train == eos)
    assert len(ends) == len(documents) and ends[-1] == len(train) - 1
    starts = [0, *(ends[:-1] + 1)]
    decoded = [tok.decode(train[a:b].tolist()) for a, b in zip(starts, ends)]
    assert decoded == documents


def test_the_held_out_share_is_spread_and_deterministic(tokenizer_file, tmp_path):
    text = tmp_path / "long.txt"
    text.write_text(STORY * 10000, encoding="utf-8")  # ~680 kB: 80 pieces
    runs = []
    for name, fraction in (("one", "0.05"), ("two", "0.05"), ("none", "0")):
        out = tmp_path / name
        argv = ["prepare-data", "--tokenizer", tokenizer_file, "--input", str(text)]
        assert main([*argv, "-o", str(out), "--val-fraction", fraction]) == 0
        runs.append(((out / "train.bin").read_bytes(), (out / "val.bin").read_bytes()))
    assert runs[0] == runs[1]
    train, val = (np.frombuffer(b, np.uint16) for b in runs[0])
    assert abs(len(val) / (len(train) + len(val)) - 0.05) < 0.01
    # Each piece went one way or the other, whole: together they are the unsplit run's ids.
    whole = np.frombuffer(runs[2][0], np.uint16)
    assert len(train) + len(val) == len(whole) and runs[2][1] == b""
    assert sorted(np.concatenate([train, val]).tolist()) == sorted(whole.tolist())


def test_a_line_longer_than_many_pieces_is_read_in_pieces(tmp_path, monkeypatch):
    monkeypatch.setattr(sources, "_BLOCK_BYTES", 1000)  # blocks cut characters in two
    text = "ünïcødé ✓ words " * 3000  # one line of ~50,000 characters, multi-byte ones
    path = tmp_path / "one-line.txt"
    path.write_text(text, encoding="utf-8")
    got = list(pieces(path))
    assert all(len(p.text) <= PIECE_CHARS for p in got) and len(got) > 5
    assert "".join(p.text for p in got) == text
    assert [p.ends_document for p in got] == [False] * (len(got) - 1) + [True]
    assert sum(p.input_bytes for p in got) == path.stat().st_size
    assert all(p.text.startswith(" ") for p in got[1:])  # cut before spaces, not in words


def test_pieces_tokenize_as_the_whole_text_does(tokenizer_file, tmp_path, monkeypatch):
    """Cut after line breaks and before spaces, a byte-level BPE gives the whole text's ids."""
    monkeypatch.setattr(sources, "_BLOCK_BYTES", 5000)
    words = "pipeline stage données ✓ bubble the of".split()
    rng = np.random.default_rng(0)
    line = " ".join(rng.choice(words, 6000))  # one long line: cut at spaces
    text = f"{line}\n" + "\n".join(" ".join(rng.choice(words, 9)) for _ in range(3000)) + "\n"
    (tmp_path / "t.txt").write_text(text, encoding="utf-8")
    argv = ["prepare-data", "--tokenizer", tokenizer_file, "--input", str(tmp_path / "t.txt")]
    assert main([*argv, "-o", str(tmp_path / "out"), "--val-fraction", "0", "--eos", "none"]) == 0
    whole = Tokenizer.from_file(tokenizer_file).encode(text, add_special_tokens=False).ids
    assert _ids(tmp_path / "out" / "train.bin").tolist() == whole


def test_the_byte_tokenizer_needs_nothing_installed(tmp_path):
    (tmp_path / "t.md").write_text("héllo\n", encoding="utf-8")
    out = tmp_path / "bytes"
    argv = ["prepare-data", "--tokenizer", "byte", "--input", str(tmp_path / "t.md")]
    assert main([*argv, "-o", str(out), "--val-fraction", "0"]) == 0
    assert bytes(_ids(out / "train.bin").astype(np.uint8)) == "héllo\n".encode()
    meta = json.loads((out / "meta.json").read_text())
    assert (meta["vocab_size"], meta["tokenizer"], "eos_id" in meta) == (256, "byte", False)


def _token_folder(tmp_path, vocab: int, dtype: str, tokens: int = 1000):
    ids = (np.arange(tokens) % min(vocab, 200)).astype(dtype)
    ids.tofile(tmp_path / "train.bin")
    meta = {"format": "octopipe.tokens/1", "vocab_size": vocab, "dtype": dtype}
    meta.update(tokenizer="t.json", files={"train.bin": {"tokens": tokens}})
    (tmp_path / "meta.json").write_text(json.dumps(meta))
    return tmp_path / "train.bin"


def test_a_token_file_takes_its_dtype_from_meta_json(tmp_path):
    path = _token_folder(tmp_path, 100_000, "uint32")
    data = TokenFile(path, seq_len=8, seed=0)
    assert data.dtype == "uint32"
    batch = data.for_vocabulary(100_000).global_batch(0, 2)
    assert int(batch.targets.max()) < 200


def test_a_prepared_folder_stands_for_its_train_and_val_files(tmp_path, capsys):
    text = tmp_path / "t.txt"
    text.write_text(STORY * 400, encoding="utf-8")
    out = tmp_path / "data"
    argv = ["prepare-data", "--tokenizer", "byte", "--input", str(text), "-o", str(out)]
    assert main([*argv, "--val-fraction", "0.1"]) == 0
    train = TokenFile(out, seq_len=8, seed=0)
    val = TokenFile(out, seq_len=8, seed=0, flag="--val-data")
    assert (train.path, val.path) == (out / "train.bin", out / "val.bin")
    assert train.global_batch(0, 2).inputs[0].shape == (2, 8)
    (out / "val.bin").unlink()
    with pytest.raises(InputError, match=r"--val-data: .*data is a folder without val.bin"):
        TokenFile(out, seq_len=8, seed=0, flag="--val-data")
    with pytest.raises(InputError, match="--data: no such file or folder: "):
        TokenFile(tmp_path / "nowhere", seq_len=8, seed=0)


def test_meta_json_refuses_another_dtype_a_larger_vocabulary_and_a_changed_file(tmp_path):
    path = _token_folder(tmp_path, 1000, "uint16")
    with pytest.raises(InputError, match="--data-dtype: uint32, but .* holds uint16 ids"):
        TokenFile(path, 8, 0, "uint32")
    with pytest.raises(InputError, match="a tokenizer of 1,000 .* the model takes 512"):
        TokenFile(path, 8, 0).for_vocabulary(512)
    TokenFile(path, 8, 0).for_vocabulary(1000)  # as large: fine
    with open(path, "ab") as f:
        f.write(b"\0\0")
    with pytest.raises(InputError, match="holds 2,002 bytes; .* says 1,000 uint16 tokens"):
        TokenFile(path, 8, 0)
