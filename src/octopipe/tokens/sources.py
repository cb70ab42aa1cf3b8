"""The text `prepare-data` tokenizes, read as a stream of pieces so that no input, however
large (one line of many gigabytes included), is ever held whole.

- A text file is one document, read in blocks of bytes, decoded as UTF-8 incrementally and cut
  into pieces of at most `PIECE_CHARS` characters after the last line break (else before the
  last space) of each block, so that no word is cut where the text has any break at all.
- A `.jsonl` file holds one document per line: a JSON object with a `"text"` string (other keys
  are ignored, blank lines skipped). A record is one piece.

A folder stands for the files under it (sorted, recursively) whose names end in
`TEXT_SUFFIXES` or `.jsonl`. Faults are one line naming the file and the place.
"""

from __future__ import annotations

import codecs
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from octopipe.errors import InputError
from octopipe.jsonfile import parse_json

PIECE_CHARS = 8192  # about 2,000 tokens: the unit the held-out share is chosen by
_BLOCK_BYTES = 1 << 16
TEXT_SUFFIXES = (".txt", ".text", ".md")
JSONL_SUFFIX = ".jsonl"


@dataclass(frozen=True)
class Piece:
    text: str
    ends_document: bool  # the last piece of its document (an end-of-text token follows)
    input_bytes: int  # how much of the input it used up, for progress


def input_files(paths: Iterable[str | Path]) -> list[Path]:
    """The files the inputs name, folders expanded; refuses what is missing or holds none."""
    files: list[Path] = []
    for given in paths:
        path = Path(given)
        if path.is_dir():
            found = sorted(
                p
                for p in path.rglob("*")
                if p.is_file() and p.suffix.lower() in (*TEXT_SUFFIXES, JSONL_SUFFIX)
            )
            if not found:
                suffixes = ", ".join((*TEXT_SUFFIXES, JSONL_SUFFIX))
                raise InputError("--input", f"{path} holds no text files ({suffixes})")
            files += found
        elif path.is_file():
            files.append(path)
        else:  # absent, or a FIFO or device that cannot be read twice (sizes, then text)
            from octopipe.outfiles import unreadable_input

            raise InputError("--input", f"{path} {unreadable_input(path) or 'is not a file'}")
    if not files:
        raise InputError("--input", "no input files")
    return files


def pieces(path: Path) -> Iterator[Piece]:
    """The pieces of one input file, in order."""
    if path.suffix.lower() == JSONL_SUFFIX:
        return _jsonl_pieces(path)
    return _text_pieces(path)


def _text_pieces(path: Path) -> Iterator[Piece]:
    decoder = codecs.getincrementaldecoder("utf-8")()
    pending, pending_bytes, offset = "", 0, 0
    with path.open("rb") as file:
        while True:
            block = file.read(_BLOCK_BYTES)
            held = len(decoder.getstate()[0])  # bytes of a character cut by the last block
            try:
                pending += decoder.decode(block, final=not block)
            except UnicodeDecodeError as exc:
                at = offset - held + exc.start
                raise InputError(str(path), f"not UTF-8 text (byte {at:,})") from None
            offset += len(block)
            pending_bytes += len(block)
            while len(pending) > PIECE_CHARS or (not block and pending):
                cut = _cut(pending) if len(pending) > PIECE_CHARS else len(pending)
                last = not block and cut == len(pending)
                yield Piece(pending[:cut], last, pending_bytes)
                pending, pending_bytes = pending[cut:], 0
            if not block:
                return


def _cut(text: str) -> int:
    """Where to end a piece of `text`: after the last line break within PIECE_CHARS, else
    before the last space (so the space opens the next piece, as byte-level BPE and
    SentencePiece tokenizers join a space to the word after it), else at PIECE_CHARS. Cut so,
    pieces tokenize as the whole text does."""
    head = text[:PIECE_CHARS]
    newline = head.rfind("\n")
    if newline > 0:
        return newline + 1
    space = max(head.rfind(c) for c in " \t\r\f\v")
    return space if space > 0 else PIECE_CHARS


def _jsonl_pieces(path: Path) -> Iterator[Piece]:
    with path.open("rb") as file:
        for number, raw in enumerate(file, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise InputError(
                    str(path), f"not UTF-8 text (byte {exc.start:,} of the line)", f"line {number}"
                ) from None
            if not line.strip():
                continue
            record = parse_json(line, f"{path}: line {number}")
            text = record.get("text") if isinstance(record, dict) else None
            if not isinstance(text, str):
                raise InputError(
                    str(path), 'expected a JSON object with a "text" string', f"line {number}"
                )
            yield Piece(text, True, len(raw))
