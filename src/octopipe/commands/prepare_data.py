"""`octopipe prepare-data`: text files or JSONL in, the token files `octopipe run` trains on
out (train.bin, val.bin, meta.json), streamed, with a progress bar.

The work is `octopipe.tokens.prepare`; this module parses, shows progress and reports.
"""

from __future__ import annotations

import argparse
import sys

from octopipe.config.flags import number
from octopipe.errors import InputError

NAME = "prepare-data"
HELP = "Tokenize text files or JSONL into train.bin, val.bin and meta.json for `run --data`."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--tokenizer",
        required=True,
        help="a Hugging Face tokenizers file (tokenizer.json, or a folder holding one), "
        "'byte' (UTF-8 bytes: 256 ids), or 'train:bpe' (a byte-level BPE of --vocab-size ids "
        "trained on the input; saved as tokenizer.json beside the tokens)",
    )
    parser.add_argument(
        "--vocab-size",
        type=int,
        default=None,
        metavar="N",
        help="with --tokenizer train:bpe: the most ids the tokenizer learns (257 or more: the "
        "256 bytes and <|endoftext|>); the model's vocab_size must hold them",
    )
    parser.add_argument(
        "--input",
        required=True,
        nargs="+",
        metavar="PATH",
        help='text files (each one document), .jsonl files (one {"text": ...} document a '
        "line), or folders of them (.txt, .text, .md, .jsonl, recursively)",
    )
    parser.add_argument("-o", "--output", required=True, help="folder to write the files into")
    parser.add_argument(
        "--val-fraction",
        type=number(0, 1, below=True),
        default=0.01,
        help="share of the tokens held out in val.bin (chosen in pieces of about 2,000 tokens, "
        "spread through the input)",
    )
    parser.add_argument(
        "--eos",
        default="auto",
        help="end-of-text token after every document: auto (the tokenizer's, if it has a usual "
        "one), none, or a token of the tokenizer",
    )


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
    )

    from octopipe.outfiles import check_output_folder
    from octopipe.tokens.meta import META
    from octopipe.tokens.prepare import TOKENIZER_FILE, TRAIN, VAL, prepare, total_bytes
    from octopipe.tokens.sources import input_files
    from octopipe.tokens.train_bpe import TRAIN_BPE, check_vocab_size

    check_output_folder("--output", args.output, (TRAIN, VAL, META, TOKENIZER_FILE))
    trained = args.tokenizer == TRAIN_BPE
    if args.tokenizer.startswith("train:") and not trained:  # before --vocab-size is judged
        raise InputError(
            "--tokenizer", f"cannot train {args.tokenizer[6:46]!r}: the one to train is {TRAIN_BPE}"
        )
    if trained and args.vocab_size is None:
        raise InputError("--vocab-size", "--tokenizer train:bpe needs it: the most ids to learn")
    if not trained and args.vocab_size is not None:
        raise InputError(
            "--vocab-size", "only with --tokenizer train:bpe (a tokenizer has its own)"
        )
    if trained:
        check_vocab_size(args.vocab_size)
    files = input_files(args.input)
    size = total_bytes(files)
    with Progress(
        TextColumn("[bold]{task.description}[/]"),
        BarColumn(),
        DownloadColumn(),
        TextColumn("{task.fields[tokens]}"),
        TimeRemainingColumn(),
        console=Console(stderr=True),
        transient=True,
    ) as progress:
        tokenizer = _tokenizer(args, files, size, progress)
        task = progress.add_task("tokenizing", total=size, tokens="0 tokens")
        made = 0

        def advance(nbytes: int, tokens: int) -> None:
            nonlocal made
            made += tokens
            progress.update(task, advance=nbytes, tokens=f"{made:,} tokens")

        done = prepare(files, tokenizer, args.output, args.val_fraction, advance)
    meta = done.meta
    eos = "none" if meta.eos_id is None else f"id {meta.eos_id}"
    saved = f", {meta.tokenizer_file}" if meta.tokenizer_file else ""
    print(
        f"wrote {done.folder}/train.bin ({done.train_tokens:,} tokens), val.bin "
        f"({done.val_tokens:,}){saved}, meta.json: {_count(len(files), 'file')}, "
        f"{_count(done.documents, 'document')}, "
        f"vocabulary {meta.vocab_size:,} ({meta.dtype}), end of text {eos}"
    )
    if args.val_fraction > 0 and done.val_tokens == 0:
        print(
            f"octopipe prepare-data: note: val.bin is empty: {done.train_tokens:,} tokens are too "
            f"few to hold out {args.val_fraction:g} of them in pieces of about 2,000",
            file=sys.stderr,
        )
    return 0


def _tokenizer(args: argparse.Namespace, files, size: int, progress):
    """The tokenizer `--tokenizer` names; `train:bpe` is trained here, with its own bar."""
    from octopipe.tokens.tokenizer import from_tokenizers, load_tokenizer
    from octopipe.tokens.train_bpe import TRAIN_BPE, train_bpe

    if args.tokenizer != TRAIN_BPE:
        return load_tokenizer(args.tokenizer, args.eos)
    task = progress.add_task(
        "training a tokenizer", total=size, tokens=f"up to {args.vocab_size:,} ids"
    )
    impl = train_bpe(files, args.vocab_size, lambda n: progress.update(task, advance=n))
    progress.remove_task(task)
    return from_tokenizers(TRAIN_BPE, impl, args.eos)


def _count(n: int, what: str) -> str:
    return f"{n:,} {what}{'' if n == 1 else 's'}"
