"""Text in, token files out: `octopipe prepare-data`.

The inputs are read piece by piece (`sources`), tokenized a batch of pieces at a time, and
written as they come to `train.bin` and `val.bin` (flat little-endian ids, nanoGPT's layout),
then `meta.json`. Memory stays at one batch whatever the input's size.

The held-out share is chosen piece by piece, deterministically and spread through the corpus:
a piece goes to `val.bin` when that brings the held-out tokens closer to `val_fraction` of all
tokens so far than leaving it out would. An end-of-text token, when the tokenizer has one,
follows every document. Both files are written beside their final names and renamed into place
once complete, meta.json last, so an interrupted run leaves no file that claims to be whole.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from octopipe.outfiles import rename_into_place
from octopipe.tokens.meta import META, FileEntry, TokenMeta, dtype_for, write_meta
from octopipe.tokens.sources import Piece, input_files, pieces
from octopipe.tokens.tokenizer import Tokenizer

TRAIN, VAL = "train.bin", "val.bin"
TOKENIZER_FILE = "tokenizer.json"
_BATCH_CHARS = 1 << 20  # text tokenized per call


@dataclass(frozen=True)
class Prepared:
    folder: Path
    train_tokens: int
    val_tokens: int
    documents: int
    meta: TokenMeta


def total_bytes(files: Iterable[Path]) -> int:
    return sum(f.stat().st_size for f in files)


def prepare(
    inputs: Iterable[str | Path],
    tokenizer: Tokenizer,
    out: str | Path,
    val_fraction: float = 0.01,
    on_bytes: Callable[[int, int], None] | None = None,
) -> Prepared:
    """Tokenize `inputs` (files or folders) into `out`/train.bin, val.bin and meta.json.
    `on_bytes(input_bytes, tokens)` is called after each batch with what it used and made."""
    files = input_files(inputs)
    folder = Path(out)
    made_folder = not folder.exists()
    folder.mkdir(parents=True, exist_ok=True)
    try:
        counts, documents = _write_tokens(files, tokenizer, folder, val_fraction, on_bytes)
        saved = _save_tokenizer(tokenizer, folder)
    except BaseException:
        if made_folder:  # a refused input leaves nothing behind, not even an empty folder
            shutil.rmtree(folder, ignore_errors=True)
        raise
    meta = TokenMeta(
        format="octopipe.tokens/1",
        vocab_size=tokenizer.vocab_size,
        dtype=dtype_for(tokenizer.vocab_size),
        tokenizer=tokenizer.name,
        eos_id=tokenizer.eos_id,
        tokenizer_file=saved,
        files={name: FileEntry(tokens=n) for name, n in counts.items()},
    )
    write_meta(folder, meta)
    return Prepared(folder, counts[TRAIN], counts[VAL], documents, meta)


def _save_tokenizer(tokenizer: Tokenizer, folder: Path) -> str | None:
    """Write a `tokenizers` tokenizer as folder/tokenizer.json; its name, or None for bytes."""
    if tokenizer.impl is None:
        return None
    partial = folder / f".{TOKENIZER_FILE}.partial"
    try:
        tokenizer.impl.save(str(partial))
        os.replace(partial, folder / TOKENIZER_FILE)
    finally:
        partial.unlink(missing_ok=True)
    return TOKENIZER_FILE


def _write_tokens(
    files: list[Path],
    tokenizer: Tokenizer,
    folder: Path,
    val_fraction: float,
    on_bytes: Callable[[int, int], None] | None,
) -> tuple[dict[str, int], int]:
    """Write train.bin and val.bin; the tokens in each, and the documents read."""
    dtype = dtype_for(tokenizer.vocab_size)
    counts = {TRAIN: 0, VAL: 0}
    documents = 0
    with ExitStack() as stack:
        partial = {name: folder / f".{name}.partial" for name in counts}
        stack.callback(lambda: [p.unlink(missing_ok=True) for p in partial.values()])
        sinks = {name: stack.enter_context(partial[name].open("wb")) for name in counts}
        for batch in _batches(p for f in files for p in pieces(f)):
            ids = tokenizer.encode_batch([p.text for p in batch])
            made = 0
            for piece, piece_ids in zip(batch, ids):
                if piece.ends_document:
                    documents += 1
                    if tokenizer.eos_id is not None:
                        piece_ids = np.append(piece_ids, tokenizer.eos_id)
                n = len(piece_ids)
                held_out = _held_out(counts[VAL], sum(counts.values()), n, val_fraction)
                name = VAL if held_out else TRAIN
                piece_ids.astype(dtype).tofile(sinks[name])
                counts[name] += n
                made += n
            if on_bytes is not None:
                on_bytes(sum(p.input_bytes for p in batch), made)
        (folder / META).unlink(missing_ok=True)  # an old one would describe other files
        for name, sink in sinks.items():
            sink.flush()
            os.fsync(sink.fileno())
            sink.close()
            rename_into_place(partial[name], folder / name)
    return counts, documents


def _held_out(held: int, total: int, n: int, fraction: float) -> bool:
    """Whether a piece of `n` tokens brings the held-out share closer to `fraction`."""
    target = fraction * (total + n)
    return abs(held + n - target) < abs(held - target)


def _batches(stream: Iterator[Piece]) -> Iterator[list[Piece]]:
    batch: list[Piece] = []
    chars = 0
    for piece in stream:
        batch.append(piece)
        chars += len(piece.text)
        if chars >= _BATCH_CHARS:
            yield batch
            batch, chars = [], 0
    if batch:
        yield batch
