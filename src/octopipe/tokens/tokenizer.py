"""The tokenizers `prepare-data` takes: a Hugging Face `tokenizers` file (`tokenizer.json`, or
a folder holding one), `byte`, the UTF-8 bytes themselves (256 ids, nothing to install), or
`train:bpe`, a byte-level BPE trained on the input (`train_bpe.py`).

A tokenizer file is data (its vocabulary, merges and rules), never code: reading one runs
nothing from it. The `tokenizers` package is the `[data]` extra (`pip install 'octopipe[data]'`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from octopipe.errors import InputError

BYTE = "byte"
# End-of-text tokens of common tokenizer families (GPT-2, Llama 3, Llama 2 and Mistral, Gemma,
# Qwen), tried in this order when `--eos auto`.
KNOWN_EOS = ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>", "<|im_end|>")


@dataclass(frozen=True)
class Tokenizer:
    name: str  # what meta.json records: the path given, or "byte"
    vocab_size: int
    eos_id: int | None  # appended after every document; None: nothing is
    impl: Any = None  # the `tokenizers.Tokenizer`; None for bytes

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        """The ids of each text (no special tokens added), as int64 arrays."""
        if self.impl is None:
            return [np.frombuffer(t.encode("utf-8"), np.uint8).astype(np.int64) for t in texts]
        encodings = self.impl.encode_batch_fast(list(texts), add_special_tokens=False)
        return [np.asarray(e.ids, dtype=np.int64) for e in encodings]


def load_tokenizer(spec: str, eos: str = "auto") -> Tokenizer:
    """`spec`: "byte", a tokenizer.json, or a folder holding one. `eos`: "auto" (the first of
    KNOWN_EOS the vocabulary has, else none), "none", or a token of the vocabulary."""
    if spec == BYTE:
        if eos not in ("auto", "none"):
            raise InputError("--eos", "the byte tokenizer has no special tokens: use auto or none")
        return Tokenizer(BYTE, 256, None)
    path = Path(spec)
    if path.is_dir():
        path = path / "tokenizer.json"
    if not path.is_file():
        raise InputError("--tokenizer", f"no tokenizer file at {path} (or give 'byte')")
    try:
        from tokenizers import Tokenizer as HFTokenizer
    except ImportError:
        raise InputError(
            "--tokenizer",
            "reading a tokenizer file needs the tokenizers package: pip install 'octopipe[data]'",
        ) from None
    try:
        impl = HFTokenizer.from_file(str(path))
    except Exception as exc:  # tokenizers raises its own Exception type for any bad file
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise InputError(str(path), f"not a tokenizers file: {reason}") from None
    return from_tokenizers(spec, impl, eos)


def from_tokenizers(name: str, impl, eos: str = "auto") -> Tokenizer:
    """A `tokenizers.Tokenizer` (read from a file or just trained) as prepare-data uses it."""
    return Tokenizer(name, impl.get_vocab_size(with_added_tokens=True), _eos_id(impl, eos), impl)


def _eos_id(impl, eos: str) -> int | None:
    if eos == "none":
        return None
    if eos == "auto":
        return next((i for t in KNOWN_EOS if (i := impl.token_to_id(t)) is not None), None)
    found = impl.token_to_id(eos)
    if found is None:
        raise InputError("--eos", f"{eos!r} is not a token of the tokenizer")
    return found
