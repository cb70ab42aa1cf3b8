"""A checkpoint of an `hf:` model as a Hugging Face model folder: `octopipe export-hf`.

The checkpoint (`DIR/step-K`, or the newest complete one in DIR, as `--resume` would choose
it) must be of the model the config builds: the marker's layers and model identity, every
parameter's shape (`checkpoint.check_compatible`). Its index is read by the safe reader and
only tensor entries are loaded (`checkpoint.load_weights`): exporting a checkpoint never runs
code from it. The weights, keyed by the very FQNs transformers gives them (the run trained the
transformers model itself), are assigned to the model built from the config on the meta
device and saved with `save_pretrained` as safetensors beside its config.json, so
`AutoModelForCausalLM.from_pretrained(OUT)` loads the trained model; with a tokenizer
(`hf_tokenizer.py`), `AutoTokenizer` and `pipeline` load the folder too. The folder is written
beside OUT and renamed into place when complete.

Imports torch and transformers: import this module directly, not through `octopipe.export`.
"""

from __future__ import annotations

import os
import shutil
import warnings
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch

from octopipe.errors import InputError

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class Exported:
    folder: Path
    checkpoint: Path
    step: int
    parameters: int  # elements
    tokenizer: Path | None  # the tokenizer.json copied into the folder, if any


def export_hf(
    checkpoint: str | Path,
    model: str,
    out: str | Path,
    dtype: str = "float32",
    tokenizer: str | Path | None = None,
):
    """Write the checkpoint's weights of the `hf:` model `model` into the folder `out`, with
    the tokenizer `tokenizer` names (a prepare-data folder or a tokenizer.json) if given."""
    from octopipe.export.hf_tokenizer import find_tokenizer, save_tokenizer
    from octopipe.runtime.checkpoint.folder import model_identity
    from octopipe.runtime.checkpoint.store import check_compatible, load_weights
    from octopipe.runtime.model.hf import load_config
    from octopipe.runtime.model.load import load_recipe
    from octopipe.runtime.model.recipe import HF_PREFIX

    if not model.startswith(HF_PREFIX):
        raise InputError(
            "--model",
            f"{model} is no transformers model: export-hf writes the hf:PATH models a run "
            "trained (give the config it trained, hf:config.json)",
        )
    if dtype not in DTYPES:
        raise InputError("--dtype", f"expected one of {', '.join(DTYPES)}, got {dtype}")
    out = Path(out)
    _check_output(out)
    found_tokenizer = None if tokenizer is None else find_tokenizer(tokenizer)
    recipe = load_recipe(model)
    found = _checkpoint(Path(checkpoint))
    marker = found.marker
    check_compatible(
        found,
        recipe.layers,
        recipe.meta_model,
        seed=marker.seed,
        optimizer=marker.optimizer or "",
        model_id=model_identity(model),
    )
    with warnings.catch_warnings():  # torch warns on every single-process load, asked or not
        warnings.filterwarnings("ignore", "torch.distributed is disabled", UserWarning)
        weights = load_weights(found.path, recipe.meta_model)
    hf_model = _with_weights(load_config(model[len(HF_PREFIX) :]), weights, DTYPES[dtype])
    partial = out.with_name(f".{out.name}.partial")
    shutil.rmtree(partial, ignore_errors=True)
    try:
        if found_tokenizer is not None:
            save_tokenizer(found_tokenizer, hf_model, partial)
        with _no_progress_bars():  # one line says what was written
            hf_model.save_pretrained(partial, safe_serialization=True)
        if out.exists():
            out.rmdir()  # empty: `_check_output`
        os.rename(partial, out)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    parameters = sum(w.numel() for w in weights.values())
    saved = None if found_tokenizer is None else found_tokenizer.path
    return Exported(out, found.path, found.step, parameters, saved)


@contextmanager
def _no_progress_bars():
    from transformers.utils import logging

    shown = logging.is_progress_bar_enabled()
    logging.disable_progress_bar()
    try:
        yield
    finally:
        if shown:
            logging.enable_progress_bar()


def _with_weights(config, weights: dict[str, torch.Tensor], dtype: torch.dtype):
    """The config's causal LM holding `weights` (built on the meta device: nothing is
    allocated but the weights themselves)."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging

    verbosity = logging.get_verbosity()
    logging.set_verbosity_error()
    try:
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    finally:
        logging.set_verbosity(verbosity)
    cast = {name: tensor.to(dtype) for name, tensor in weights.items()}
    model.load_state_dict(cast, strict=False, assign=True)
    model.tie_weights()  # assigning the tied table unties its holders; the config ties them
    left = [name for name, p in model.named_parameters() if p.is_meta]
    if left:  # the checkpoint's parameters are the model's (check_compatible): cannot happen
        raise InputError("--checkpoint", f"holds no weights for {left[0]}")
    return model


def _checkpoint(path: Path):
    """A `step-K` folder, or the newest complete checkpoint of a folder of them."""
    from octopipe.runtime.checkpoint.folder import (
        MARKER,
        STEP_DIR,
        Resumable,
        check_complete,
        choose,
        read_marker,
    )

    if not path.is_dir():
        raise InputError("--checkpoint", f"no such folder: {path}")
    if (path / MARKER).is_file() or STEP_DIR.fullmatch(path.name):
        marker = read_marker(path)
        check_complete(path, marker)  # its bytes too: a changed shard is refused
        return Resumable(path, marker.step, marker)
    from octopipe.runtime.checkpoint.notices import CheckpointSkipped

    # A damaged newest checkpoint is refused, not exported around: the model a user asks for
    # by the folder is its latest; the intact one is named, to be exported by its own path.
    with warnings.catch_warnings(record=True) as skipped:
        warnings.simplefilter("always", CheckpointSkipped)
        try:
            found = choose(path)
        except InputError as exc:  # choose() speaks for `run --resume`; here the flag differs
            raise InputError("--checkpoint", exc.message, exc.place) from None
    damaged = [w for w in skipped if issubclass(w.category, CheckpointSkipped)]
    if damaged:
        fault = str(damaged[0].message).rsplit("; skipped for ", 1)[0]
        raise InputError(
            "--checkpoint",
            f"the newest checkpoint is damaged ({fault}); to export the newest intact one, "
            f"give --checkpoint {found.path}",
        )
    if found is None:
        raise InputError("--checkpoint", f"{path} holds no checkpoint (no step-K folder)")
    return found


def _check_output(out: Path) -> None:
    from octopipe.outfiles import check_output_folder

    check_output_folder("--output", out)
    if out.exists() and any(out.iterdir()):
        raise InputError("--output", f"{out} is not empty: give a new folder for the model")
