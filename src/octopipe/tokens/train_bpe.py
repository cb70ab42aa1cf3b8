"""A byte-level BPE tokenizer trained on the input itself: `prepare-data --tokenizer train:bpe`.

For a user with text and no tokenizer (nothing is downloaded): the `tokenizers` package learns
up to `vocab_size` ids from the same pieces `prepare-data` then tokenizes (read as a stream,
`sources.pieces`), GPT-2's byte-level scheme: the 256 bytes are the first ids, so any text
encodes, and `<|endoftext|>` is the one special token, which ends every document. The file is
saved as `tokenizer.json` beside the token files; transformers loads it (`export-hf` copies it
into the model folder).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

from octopipe.errors import InputError
from octopipe.tokens.sources import pieces

TRAIN_BPE = "train:bpe"
END_OF_TEXT = "<|endoftext|>"
MIN_VOCAB = 257  # the 256 bytes and the end-of-text token
MAX_VOCAB = 1 << 20


def check_vocab_size(vocab_size: int) -> None:
    if not MIN_VOCAB <= vocab_size <= MAX_VOCAB:
        raise InputError(
            "--vocab-size", f"expected {MIN_VOCAB:,} to {MAX_VOCAB:,} ids, got {vocab_size:,}"
        )


def train_bpe(
    files: list[Path],
    vocab_size: int,
    on_bytes: Callable[[int], None] | None = None,
):
    """A `tokenizers.Tokenizer` trained on `files` with at most `vocab_size` ids.
    `on_bytes(n)` is called as the input is read, with the bytes used."""
    check_vocab_size(vocab_size)
    try:
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    except ImportError:
        raise InputError(
            "--tokenizer",
            "training a tokenizer needs the tokenizers package: pip install 'octopipe[data]'",
        ) from None
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[END_OF_TEXT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,  # the command draws its own bar
    )
    tokenizer.train_from_iterator(_texts(files, on_bytes), trainer)
    return tokenizer


def _texts(files: list[Path], on_bytes: Callable[[int], None] | None) -> Iterator[str]:
    for path in files:
        for piece in pieces(path):
            if on_bytes is not None:
                on_bytes(piece.input_bytes)
            yield piece.text
