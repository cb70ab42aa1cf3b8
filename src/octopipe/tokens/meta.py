"""`meta.json` (`octopipe.tokens/1`): what a folder of token files holds, written by
`octopipe prepare-data` and read by `octopipe run` beside its `--data` and `--val-data` files.

    {"format": "octopipe.tokens/1", "vocab_size": 50257, "dtype": "uint16",
     "tokenizer": "gpt2/tokenizer.json", "tokenizer_file": "tokenizer.json", "eos_id": 50256,
     "files": {"train.bin": {"tokens": 1204000}, "val.bin": {"tokens": 12160}}}

A token file's reader uses it to refuse, in one line, ids of a larger vocabulary than the
model's, another dtype than the one asked for, and a file whose length is not what was written.
No torch here: the light commands read it too.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from octopipe.errors import InputError
from octopipe.jsonfile import read_json, write_json
from octopipe.limits import MAX_BYTES, Text

TOKENS_FORMAT = "octopipe.tokens/1"
META = "meta.json"
MAX_VOCABULARY = 2**31  # as a model config's vocabulary (limits: widths, vocabularies)
TOKEN_DTYPES = ("uint16", "uint32")

TokenCount = Annotated[int, Field(strict=True, ge=0, le=MAX_BYTES)]


class FileEntry(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")

    tokens: TokenCount


class TokenMeta(BaseModel):
    """meta.json; readers ignore keys they do not know."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    format: Literal["octopipe.tokens/1"]
    vocab_size: Annotated[int, Field(strict=True, ge=1, le=MAX_VOCABULARY)]
    dtype: Literal["uint16", "uint32"]
    tokenizer: Text
    eos_id: Annotated[int, Field(strict=True, ge=0, le=MAX_VOCABULARY)] | None = None
    # The tokenizer saved beside the token files (a `tokenizers` file), absent for bytes.
    tokenizer_file: Text | None = None
    files: dict[str, FileEntry] = Field(default_factory=dict)


def dtype_for(vocab_size: int) -> str:
    """The narrowest id type that holds every id of a vocabulary."""
    return "uint16" if vocab_size <= 2**16 else "uint32"


def meta_beside(token_file: str | Path) -> tuple[Path, TokenMeta] | None:
    """The meta.json in the token file's folder and what it says, or None if there is none."""
    path = Path(token_file).parent / META
    if not path.is_file():
        return None
    data = read_json(path)
    if not isinstance(data, dict):
        raise InputError(str(path), "expected a JSON object")
    try:
        return path, TokenMeta.model_validate(data)
    except ValidationError as exc:
        from octopipe.profile import first_error

        place, message = first_error(exc)
        raise InputError(str(path), message, place) from None


def write_meta(folder: Path, meta: TokenMeta) -> Path:
    path = folder / META
    write_json(path, meta.model_dump(exclude_none=True))
    return path
