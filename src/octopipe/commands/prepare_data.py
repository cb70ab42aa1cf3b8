"""`octopipe prepare-data`: text files or JSONL in, the token files `octopipe run` trains on
out (train.bin, val.bin, meta.json), streamed, with a progress bar.

The work is `octopipe.tokens.prepare`; this module parses, shows progress and reports.
"""

from __future__ import annotations

import argparse
import sys

from octopipe.commands._flags import number

NAME = "prepare-data"
HELP = "Tokenize text files or JSONL into train.bin, val.bin and meta.json for `run --data`."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--tokenizer",
        required=True,
        help="a Hugging Face tokenizers file (tokenizer.json, or a folder holding one), or "
        "'byte' (UTF-8 bytes: 256 ids)",
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

    from octopipe.commands._output_paths import check_output_folder
    from octopipe.tokens.meta import META
    from octopipe.tokens.prepare import TRAIN, VAL, prepare, total_bytes
    from octopipe.tokens.sources import input_files
    from octopipe.tokens.tokenizer import load_tokenizer

    check_output_folder("--output", args.output, (TRAIN, VAL, META))
    tokenizer = load_tokenizer(args.tokenizer, args.eos)
    files = input_files(args.input)
    with Progress(
        TextColumn("[bold]tokenizing[/]"),
        BarColumn(),
        DownloadColumn(),
        TextColumn("{task.fields[tokens]:,} tokens"),
        TimeRemainingColumn(),
        console=Console(stderr=True),
        transient=True,
    ) as progress:
        task = progress.add_task("", total=total_bytes(files), tokens=0)
        made = 0

        def advance(nbytes: int, tokens: int) -> None:
            nonlocal made
            made += tokens
            progress.update(task, advance=nbytes, tokens=made)

        done = prepare(files, tokenizer, args.output, args.val_fraction, advance)
    meta = done.meta
    eos = "none" if meta.eos_id is None else f"id {meta.eos_id}"
    print(
        f"wrote {done.folder}/train.bin ({done.train_tokens:,} tokens), val.bin "
        f"({done.val_tokens:,}), meta.json: {_count(len(files), 'file')}, "
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


def _count(n: int, what: str) -> str:
    return f"{n:,} {what}{'' if n == 1 else 's'}"
