"""The tokenizer of an exported Hugging Face folder: `export-hf --tokenizer DIR`.

`DIR` is a `prepare-data` folder (its meta.json names the `tokenizer.json` saved beside the
tokens, and the end-of-text id every document ended with), or a `tokenizer.json` (or a folder
holding one). The file is read by `tokenizers` as data (nothing in it runs), checked against
the model's vocabulary, and saved by transformers' own fast-tokenizer class into the model
folder (`tokenizer.json` and `tokenizer_config.json`, its class named
`PreTrainedTokenizerFast`, which transformers 4 and 5 both read), so
`AutoTokenizer.from_pretrained(OUT)` and `pipeline("text-generation", model=OUT)` load it with
nothing downloaded. The model's
config takes the tokenizer's end-of-text id as its `eos_token_id`: the id the run learned to
end documents with, where generation stops.

Imports transformers: import this module directly, not through `octopipe.export`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from octopipe.errors import InputError

FLAG = "--tokenizer"


@dataclass(frozen=True)
class FoundTokenizer:
    path: Path  # the tokenizer.json read
    impl: Any  # the `tokenizers.Tokenizer`
    eos_token: str | None  # appended after every document when the tokens were made


def find_tokenizer(spec: str | Path) -> FoundTokenizer:
    """The tokenizer `--tokenizer` names, read and checked (no model needed yet)."""
    from octopipe.tokens.meta import META, meta_beside
    from octopipe.tokens.tokenizer import KNOWN_EOS

    given = Path(spec)
    eos_id: int | None = None
    path = given
    if given.is_dir() and (given / META).is_file():
        _, meta = meta_beside(given / META)
        if meta.tokenizer_file is None:
            raise InputError(
                FLAG,
                f"{given} was tokenized as {meta.tokenizer!r} with no tokenizer file beside it "
                "(prepare-data saves one for a tokenizers file or train:bpe, not for bytes)",
            )
        if Path(meta.tokenizer_file).name != meta.tokenizer_file:
            raise InputError(str(given / META), "expected a file name", "tokenizer_file")
        path, eos_id = given / meta.tokenizer_file, meta.eos_id
    elif given.is_dir():
        path = given / "tokenizer.json"
    if not path.is_file():
        raise InputError(FLAG, f"no tokenizer file at {path}")
    impl = _read(path)
    if eos_id is not None:
        eos_token = impl.id_to_token(eos_id)
        if eos_token is None:
            raise InputError(str(path), f"has no id {eos_id}, the end of text meta.json names")
    else:
        eos_token = next((t for t in KNOWN_EOS if impl.token_to_id(t) is not None), None)
    return FoundTokenizer(path, impl, eos_token)


def save_tokenizer(found: FoundTokenizer, model, folder: Path) -> None:
    """Save the tokenizer into the model folder, and tell the model its end-of-text id."""
    from transformers import PreTrainedTokenizerFast

    config = model.config
    vocab = found.impl.get_vocab_size(with_added_tokens=True)
    if vocab > config.vocab_size:
        raise InputError(
            FLAG,
            f"{found.path} has {vocab:,} ids, more than the model's vocab_size "
            f"{config.vocab_size:,}",
        )
    extra = {}
    if found.eos_token is not None:
        extra["eos_token"] = found.eos_token
        eos_id = found.impl.token_to_id(found.eos_token)
        config.eos_token_id = eos_id
        model.generation_config.eos_token_id = eos_id
    max_positions = getattr(config, "max_position_embeddings", None)
    if max_positions:
        extra["model_max_length"] = max_positions
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=found.impl, clean_up_tokenization_spaces=False, **extra
    )
    wrapped.save_pretrained(folder)
    _portable_class(folder / "tokenizer_config.json")


def _portable_class(path: Path) -> None:
    """Name the class by the alias every transformers release knows (4.x has no
    `TokenizersBackend`, the name 5.x writes; 5.x reads the alias as the same class)."""
    from octopipe.jsonfile import read_json, write_json

    config = read_json(path)
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    write_json(path, config)


def _read(path: Path):
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise InputError(
            FLAG, "reading a tokenizer needs the tokenizers package: pip install 'octopipe[hf]'"
        ) from None
    try:
        return Tokenizer.from_file(str(path))
    except Exception as exc:  # tokenizers raises its own Exception type for any bad file
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise InputError(str(path), f"not a tokenizers file: {reason}") from None
