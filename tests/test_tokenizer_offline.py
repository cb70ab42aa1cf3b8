"""A tokenizer with nothing downloaded: `prepare-data --tokenizer train:bpe` trains a byte-level
BPE on the input and saves it beside the tokens; `export-hf --tokenizer DIR` puts it in the
model folder, where transformers' `AutoTokenizer` and `pipeline` load it (HF_HUB_OFFLINE)."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
from tokenizers import Tokenizer

from octopipe.cli import main
from octopipe.errors import InputError

WORDS = "a pipeline stage device bubble model layer forward backward weight the of and".split()


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def _texts(folder, files: int = 2, lines: int = 400):
    rng = random.Random(0)
    folder.mkdir()
    for i in range(files):
        text = "".join(
            " ".join(rng.choices(WORDS, k=10)).capitalize() + ".\n" for _ in range(lines)
        )
        (folder / f"part-{i}.txt").write_text(text)
    return folder


def _prepare(tmp_path, name: str, *extra: str):
    texts = tmp_path / "texts"
    if not texts.exists():
        _texts(texts)
    out = tmp_path / name
    argv = ["prepare-data", "--tokenizer", "train:bpe", "--input", str(texts), "-o", str(out)]
    return main([*argv, *extra]), out


def test_a_trained_bpe_is_saved_beside_the_tokens_and_reads_them_back(tmp_path, capsys):
    code, out = _prepare(tmp_path, "data", "--vocab-size", "300", "--val-fraction", "0")
    assert code == 0
    assert "tokenizer.json, meta.json" in capsys.readouterr().out
    meta = json.loads((out / "meta.json").read_text())
    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    eos = tok.token_to_id("<|endoftext|>")
    assert (meta["tokenizer"], meta["tokenizer_file"], meta["eos_id"]) == (
        "train:bpe",
        "tokenizer.json",
        eos,
    )
    assert meta["vocab_size"] == tok.get_vocab_size() == 300  # the words leave room for all 300
    ids = np.fromfile(out / "train.bin", dtype=np.uint16)
    ends = np.flatnonzero(ids == eos)
    texts = sorted((tmp_path / "texts").iterdir())
    assert len(ends) == len(texts) and ends[-1] == len(ids) - 1
    assert tok.decode(ids[: ends[0]].tolist()) == texts[0].read_text()
    # merges learned: fewer ids than bytes
    assert len(ids) < 0.5 * sum(len(t.read_bytes()) for t in texts)


def test_training_is_deterministic_and_stops_at_what_the_text_holds(tmp_path):
    _, one = _prepare(tmp_path, "one", "--vocab-size", "5000")
    _, two = _prepare(tmp_path, "two", "--vocab-size", "5000")
    assert (one / "tokenizer.json").read_bytes() == (two / "tokenizer.json").read_bytes()
    assert (one / "train.bin").read_bytes() == (two / "train.bin").read_bytes()
    vocab = json.loads((one / "meta.json").read_text())["vocab_size"]
    assert 257 < vocab < 5000  # 13 words: every merge they allow, far fewer than asked


def test_a_given_tokenizer_file_is_copied_beside_the_tokens(tmp_path):
    _, trained = _prepare(tmp_path, "trained", "--vocab-size", "300")
    out = tmp_path / "again"
    argv = ["--input", str(tmp_path / "texts"), "-o", str(out)]
    assert main(["prepare-data", "--tokenizer", str(trained / "tokenizer.json"), *argv]) == 0
    meta = json.loads((out / "meta.json").read_text())
    assert meta["tokenizer_file"] == "tokenizer.json"
    assert (out / "train.bin").read_bytes() == (trained / "train.bin").read_bytes()
    assert main(["prepare-data", "--tokenizer", "byte", *argv[:2], "-o", str(tmp_path / "b")]) == 0
    assert "tokenizer_file" not in json.loads((tmp_path / "b" / "meta.json").read_text())


@pytest.mark.parametrize(
    "extra, says",
    [
        ([], "--vocab-size: --tokenizer train:bpe needs it"),
        (["--vocab-size", "256"], "--vocab-size: expected 257 to 1,048,576 ids, got 256"),
    ],
)
def test_bad_vocabulary_sizes_are_one_line(tmp_path, capsys, extra, says):
    code, out = _prepare(tmp_path, "data", *extra)
    assert code == 2 and not out.exists()
    (line,) = capsys.readouterr().err.splitlines()
    assert says in line


def test_a_vocabulary_size_for_a_given_tokenizer_is_refused(tmp_path, capsys):
    argv = ["prepare-data", "--tokenizer", "byte", "--vocab-size", "300"]
    assert main([*argv, "--input", str(_texts(tmp_path / "t")), "-o", str(tmp_path / "o")]) == 2
    assert "--vocab-size: only with --tokenizer train:bpe" in capsys.readouterr().err


def _llama(vocab: int):
    from transformers import AutoModelForCausalLM, LlamaConfig

    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=128,
    )
    return AutoModelForCausalLM.from_config(config)


def test_the_exported_folder_loads_with_autotokenizer_and_pipeline(tmp_path):
    """The tokenizer half of `export-hf --tokenizer` (the checkpoint half: test_export_hf.py,
    the whole day: test_readme.py), on a model of random weights."""
    from transformers import AutoTokenizer, pipeline

    from octopipe.export.hf_tokenizer import find_tokenizer, save_tokenizer

    _, data = _prepare(tmp_path, "data", "--vocab-size", "300")
    model = _llama(320)
    folder = tmp_path / "model"
    save_tokenizer(find_tokenizer(data), model, folder)
    model.save_pretrained(folder)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    assert config["tokenizer_class"] == "PreTrainedTokenizerFast"
    eos = Tokenizer.from_file(str(data / "tokenizer.json")).token_to_id("<|endoftext|>")
    assert json.loads((folder / "config.json").read_text())["eos_token_id"] == eos
    tok = AutoTokenizer.from_pretrained(folder)
    text = "The pipeline stage of the model."
    assert tok.decode(tok.encode(text)) == text and tok.eos_token_id == eos
    generate = pipeline("text-generation", model=str(folder), tokenizer=str(folder))
    out = generate("A pipeline", max_new_tokens=5, do_sample=False)[0]["generated_text"]
    assert out.startswith("A pipeline") and len(tok.encode(out)) > len(tok.encode("A pipeline"))


def test_export_refuses_a_byte_folder_and_a_vocabulary_the_model_cannot_hold(tmp_path):
    from octopipe.export.hf_tokenizer import find_tokenizer, save_tokenizer

    texts = _texts(tmp_path / "texts")
    assert (
        main(
            [
                "prepare-data",
                "--tokenizer",
                "byte",
                "--input",
                str(texts),
                "-o",
                str(tmp_path / "b"),
            ]
        )
        == 0
    )
    with pytest.raises(InputError, match="tokenized as 'byte' with no tokenizer file"):
        find_tokenizer(tmp_path / "b")
    _, data = _prepare(tmp_path, "data", "--vocab-size", "300")
    with pytest.raises(InputError, match="has 300 ids, more than the model's vocab_size 280"):
        save_tokenizer(find_tokenizer(data), _llama(280), tmp_path / "m")
    with pytest.raises(InputError, match="no tokenizer file at"):
        find_tokenizer(tmp_path / "texts")
