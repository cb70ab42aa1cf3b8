"""`octopipe export-hf`: a checkpoint of an `hf:` model as a Hugging Face model folder
(safetensors and config.json, and the tokenizer with `--tokenizer`) that
`AutoModelForCausalLM.from_pretrained` (and `AutoTokenizer`, `pipeline`) load.

The work is `octopipe.export.hf.export_hf`; this module parses and reports.
"""

from __future__ import annotations

import argparse

NAME = "export-hf"
HELP = "Write a checkpoint of an hf: model as a Hugging Face folder (safetensors + config)."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--checkpoint",
        required=True,
        help="a checkpoint folder (DIR/step-K), or a --checkpoint-dir (its newest complete one)",
    )
    parser.add_argument(
        "--model", required=True, help="hf:PATH, the transformers config the run trained"
    )
    parser.add_argument("-o", "--output", required=True, help="the model folder to write (new)")
    parser.add_argument(
        "--tokenizer",
        metavar="DIR",
        help="the prepare-data folder the run trained on (its tokenizer.json), or a "
        "tokenizer.json: copied into the folder with a tokenizer_config.json, so "
        "AutoTokenizer.from_pretrained(OUT) loads it",
    )
    parser.add_argument(
        "--dtype",
        choices=("float32", "bfloat16", "float16"),
        default="float32",
        help="the saved weights' type",
    )


def run(args: argparse.Namespace) -> int:
    from octopipe.export.hf import export_hf

    done = export_hf(args.checkpoint, args.model, args.output, args.dtype, args.tokenizer)
    folder = repr(str(done.folder))
    loads = f"AutoModelForCausalLM.from_pretrained({folder})"
    if done.tokenizer is not None:
        loads += f" and AutoTokenizer.from_pretrained({folder})"
    print(
        f"wrote {done.folder} ({done.parameters:,} parameters, {args.dtype}"
        f"{', the tokenizer of ' + str(done.tokenizer) if done.tokenizer else ''}) from "
        f"{done.checkpoint} ({done.step} steps); load it with {loads}"
    )
    return 0
